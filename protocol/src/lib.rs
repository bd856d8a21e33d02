//! The memra gate protocol (DESIGN §5) in one small crate: what a gate writes and what
//! `memra-orch` reads back. Every memra gate and the orchestrator use it, and a gate of your
//! own can depend on it alone.
//!
//! A gate is any program the orchestrator runs. It reports in three ways:
//!
//! - its **exit status**: [`EXIT_PASS`] (0) or [`EXIT_FAIL`] (1), see [`Outcome`]; anything
//!   else, or a signal, is judged a crash;
//! - **rows** appended to the file named by `MEMRA_ORCH_CHECKS`, one JSON object a line:
//!   a [`Check`] row per check, and one [`DoorsRow`] naming the code paths the gate actually
//!   ran (a flat object of strings, numbers and booleans), written by a [`ChecksWriter`];
//! - **artifacts**: files in the folder named by `MEMRA_ORCH_ARTIFACTS` ([`artifacts_dir`]),
//!   for instance logit dumps that a compare node pairs up.
//!
//! Run by hand, with the variables unset, the writer does nothing and the gate only prints
//! its report. The orchestrator holds a gate that writes rows to one consistency rule: exit
//! 1 exactly when some row says `fail` (otherwise the attempt is a protocol error).
//! [`ChecksWriter::outcome`] gives the exit status that keeps the two in agreement.
//!
//! The reading side, [`read_checks`] and [`parse_checks`], turns a checks file into a
//! [`GateReport`]: the [`CheckRow`]s, the merged doors, and one located message per line
//! that breaks the protocol.
//!
//! # A gate in Rust
//!
//! Depend on this crate alone (a path or git dependency on the memra repository; cargo
//! finds the package by its name, `memra-protocol`):
//!
//! ```toml
//! [dependencies]
//! memra-protocol = { path = "../memra/protocol" }
//! ```
//!
//! Then report each check, one doors row, and exit through the outcome:
//!
//! ```
//! use memra_protocol::{Check, ChecksWriter, DoorsRow, Status};
//!
//! fn main() -> std::process::ExitCode {
//!     let mut checks = ChecksWriter::from_env();
//!     let doors = DoorsRow::new()
//!         .with("backend", "cpu")
//!         .with("threads", 4)
//!         .with("fast_path", false);
//!     let sum: u32 = [1, 2, 3].iter().sum();
//!     let status = if sum == 6 { Status::Pass } else { Status::Fail };
//!     let check = Check::new("sum", status, "1 + 2 + 3 = 6").metric("compared", 3);
//!     if let Err(e) = checks.doors(&doors).and_then(|()| checks.check(&check)) {
//!         // An unwritable checks file is no verdict: exit with neither 0 nor 1.
//!         eprintln!("my-gate: {e}");
//!         return std::process::ExitCode::from(2);
//!     }
//!     checks.outcome().into()
//! }
//! ```
//!
//! `protocol/example-gate` in the memra repository is this program as a workspace member,
//! run by `manifests/smoke.toml`; `docs/gate-protocol.md` describes the protocol in words.
//!
//! # The wire format
//!
//! Rows are compact JSON, one a line, keys in a fixed order (which needs serde_json's
//! `preserve_order`, enabled by this crate's dependency):
//!
//! ```text
//! {"doors":{"backend":"cpu","threads":4,"fast_path":false}}
//! {"check":"sum","status":"pass","metrics":{"compared":3},"message":"1 + 2 + 3 = 6"}
//! {"check":"gate2","status":"fail","metrics":{},"message":"rows differ","first_mismatch":{"step":3,"row":1,"index":811,"ref":1.25,"got":1.2500001}}
//! ```
//!
//! The rows carry no version field: the orchestrator reads files written by older gates,
//! so the format only ever grows keys a reader may ignore.

mod read;
mod row;
mod write;

pub use read::{CheckRow, GateReport, parse_checks, read_checks};
pub use row::{Check, DoorsRow, FirstMismatch, Status};
pub use write::{AppendError, ChecksWriter, artifacts_dir};

/// The variables the orchestrator sets for every attempt of a gate.
pub mod vars {
    /// Path of the JSON-lines file the gate appends its rows to (exists, empty).
    pub const CHECKS: &str = "MEMRA_ORCH_CHECKS";
    /// An empty folder for the files the gate produces.
    pub const ARTIFACTS: &str = "MEMRA_ORCH_ARTIFACTS";
    /// The cell id, e.g. `decode-batch[batch=4]`.
    pub const NODE: &str = "MEMRA_ORCH_NODE";
    /// The attempt number, from 1, counting every rep and retry.
    pub const ATTEMPT: &str = "MEMRA_ORCH_ATTEMPT";
    /// The rep number, from 1.
    pub const REP: &str = "MEMRA_ORCH_REP";
}

/// The exit status of a gate whose checks all passed.
pub const EXIT_PASS: i32 = 0;
/// The exit status of a gate with a failed check.
pub const EXIT_FAIL: i32 = 1;

/// A gate's verdict as its exit status. Any other status is a crash to the orchestrator,
/// which is what a gate that could not run at all should exit with (2 by convention).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Outcome {
    Pass,
    Fail,
}

impl Outcome {
    /// `Fail` when any check failed.
    pub fn from_failures(failures: usize) -> Outcome {
        if failures == 0 {
            Outcome::Pass
        } else {
            Outcome::Fail
        }
    }

    /// The exit status: [`EXIT_PASS`] or [`EXIT_FAIL`].
    pub const fn code(self) -> i32 {
        match self {
            Outcome::Pass => EXIT_PASS,
            Outcome::Fail => EXIT_FAIL,
        }
    }
}

impl From<Outcome> for std::process::ExitCode {
    fn from(outcome: Outcome) -> std::process::ExitCode {
        // Both codes fit in a byte; `ExitCode::FAILURE` is not promised to be 1.
        std::process::ExitCode::from(outcome.code() as u8)
    }
}

#[cfg(test)]
mod tests;
