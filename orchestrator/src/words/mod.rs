//! The words every stage speaks: digests, exit codes, verdicts and a run's outcome, located
//! manifest errors, a full disk, redaction of secrets and escaping of control characters.
//! Nothing here knows about manifests, runs or receipts beyond these words; every other
//! stage may use them.

pub mod diagnostics;
pub mod digest;
pub mod diskfull;
pub mod escape;
pub mod exit;
pub mod outcome;
pub mod redact;
pub mod verdict;
