//! What people read: the live progress display ([`progress`]) and the end-of-run summary,
//! as a terminal table and as `summary.md` ([`summary`]). Both only render; the runner's
//! events and the receipts are their input.

pub mod progress;
pub mod summary;
