//! Everything that listens to a run and what people read of runs: the listeners of the
//! runner's events, the live progress display ([`progress`]), the receipt writer
//! ([`writer`]) and, when asked for, the Prometheus metrics file ([`metrics`]) and the JSON
//! event stream on stdout ([`json_events`]); what the writer renders when a run ends, the
//! summary (a terminal table and `summary.md`, [`summary`]) and `junit.xml` ([`junit`]); and
//! the views of stored runs that `show` ([`show`]) and `ls` ([`ls`]) print.
//!
//! Text that came from a manifest or a gate passes through [`escape::control`] on its way to
//! a terminal, `summary.md` or `junit.xml`.
//!
//! Only the writer writes receipt files, and only through `receipt`'s formats and paths;
//! the metrics file is the one other file, outside the tree, at the path the user gave; the
//! rest renders. The runner's events and the receipts are the input.

pub mod escape;
pub mod json_events;
pub mod junit;
pub mod ls;
pub mod metrics;
pub mod progress;
pub mod show;
pub mod summary;
pub mod writer;
