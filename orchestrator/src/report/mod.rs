//! Everything that listens to a run and what people read of runs: the listeners of the
//! runner's events, the live progress display ([`progress`]), the receipt writer
//! ([`writer`]) and, when asked for, the Prometheus metrics file ([`metrics`]) and the JSON
//! event stream on stdout ([`json_events`]); what the writer renders when a run ends, the
//! summary (a terminal table and `summary.md`, [`summary`]) and `junit.xml` ([`junit`]); the
//! views of stored runs that `show` ([`show`]) and `ls` ([`ls`]) print; and the static HTML
//! site of a manifest's history ([`html`]).
//!
//! Text that came from a manifest or a gate passes through [`crate::words::escape::control`] on its way to
//! a terminal, `summary.md` or `junit.xml`, and through [`crate::words::escape::html`] into a page.
//!
//! Only the writer writes into receipt trees, and only through `receipt`'s formats and
//! paths; the metrics file is written at the path the user gave and the HTML site into a
//! folder of its own; the rest renders. The runner's events and the receipts are the input.

pub mod attest;
pub mod html;
pub mod json_events;
pub mod junit;
pub mod ls;
pub mod metrics;
pub mod morning;
pub mod notify;
pub mod progress;
pub mod show;
pub mod summary;
pub mod writer;
