//! What a run reports while it happens: the verdict vocabulary and the events the runner
//! emits (`RunStarted`, `NodeStarted`, `AttemptFinished`, `NodeFinished`, `RunFinished`).
//!
//! The runner never prints and never writes files about itself; the terminal display, the
//! receipt writer and the JUnit writer are [`Listener`]s fed with these events. This module
//! owns the types only; it does not decide verdicts (see `protocol`) or order work.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::plan::{CellId, CellIndex, NodeKind};
use crate::receipt::NodeReceipt;

/// How a node (or one attempt) ended. Ordered from best to worst, so that "the worse of two"
/// is `max`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    Pass,
    Skipped,
    Fail,
    Crash,
    Timeout,
    Error,
    Blocked,
    Cancelled,
}

impl Verdict {
    pub const ALL: [Verdict; 8] = [
        Verdict::Pass,
        Verdict::Fail,
        Verdict::Crash,
        Verdict::Timeout,
        Verdict::Error,
        Verdict::Skipped,
        Verdict::Blocked,
        Verdict::Cancelled,
    ];

    /// Whether a node that ended with this verdict lets the run end with exit code 0.
    /// `skipped` does (it is listed, not failed); everything else but `pass` does not.
    pub fn as_expected(self) -> bool {
        matches!(self, Verdict::Pass | Verdict::Skipped)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Pass => "pass",
            Verdict::Fail => "fail",
            Verdict::Crash => "crash",
            Verdict::Timeout => "timeout",
            Verdict::Error => "error",
            Verdict::Skipped => "skipped",
            Verdict::Blocked => "blocked",
            Verdict::Cancelled => "cancelled",
        }
    }

    /// Whether a receipt with this verdict is final, so that `run --resume` keeps it instead
    /// of running the node again. Blocked and skipped nodes are re-evaluated because what
    /// caused them (a dependency, the GPUs present) may have changed; cancelled ones never
    /// finished.
    pub fn is_final(self) -> bool {
        matches!(
            self,
            Verdict::Pass | Verdict::Fail | Verdict::Crash | Verdict::Timeout | Verdict::Error
        )
    }
}

impl std::fmt::Display for Verdict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Where a node runs: which GPUs (as exported in CUDA_VISIBLE_DEVICES) or a CPU slot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Placement {
    /// Positions in the inventory's GPU list, in export order.
    Gpus(Vec<usize>),
    /// A CPU slot number (0-based); the orchestrator runs compare nodes in one too.
    CpuSlot(usize),
}

/// One event of a run, in the order the runner observed it.
#[derive(Debug, Clone)]
pub enum Event {
    RunStarted {
        total: usize,
        /// Estimated seconds of work per cell from the previous run of this manifest
        /// (`None` when there was no previous run or it did not hold the cell).
        estimates: Vec<Option<f64>>,
        gpus: usize,
        cpu_slots: usize,
    },
    NodeStarted {
        cell: CellIndex,
        id: CellId,
        placement: Placement,
    },
    AttemptFinished {
        cell: CellIndex,
        id: CellId,
        attempt: u32,
        rep: u32,
        outcome: Verdict,
        seconds: f64,
    },
    NodeFinished {
        cell: CellIndex,
        id: CellId,
        kind: NodeKind,
        verdict: Verdict,
        /// Why, for anything but a plain pass.
        reason: Option<String>,
        /// Wall time of all attempts.
        seconds: f64,
        /// The node's receipt; `None` for nodes that were never placed (skipped by filter).
        receipt: Option<Box<NodeReceipt>>,
        /// The receipt came from an earlier run of this tree (`--resume`), nothing ran.
        reused: bool,
    },
    RunFinished {
        counts: BTreeMap<Verdict, usize>,
        elapsed: Duration,
        interrupted: bool,
    },
}

/// Something that observes a run: the terminal display, the receipt writer, the JUnit
/// writer. Listeners are called on the runner's thread, in event order.
pub trait Listener {
    fn on_event(&mut self, event: &Event);

    /// Called once after `RunFinished`; an error here (a receipt that could not be written)
    /// makes the run end with the internal-error exit code.
    fn finish(&mut self) -> Result<(), String> {
        Ok(())
    }
}

/// Counts per verdict, with every verdict present (zero when none), so files diff cleanly.
pub fn count(verdicts: impl IntoIterator<Item = Verdict>) -> BTreeMap<Verdict, usize> {
    let mut counts: BTreeMap<Verdict, usize> = Verdict::ALL.iter().map(|v| (*v, 0)).collect();
    for v in verdicts {
        *counts.entry(v).or_default() += 1;
    }
    counts
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn worse_of_two_is_max() {
        assert_eq!(Verdict::Pass.max(Verdict::Fail), Verdict::Fail);
        assert_eq!(Verdict::Fail.max(Verdict::Error), Verdict::Error);
        assert_eq!(Verdict::Crash.max(Verdict::Fail), Verdict::Crash);
    }

    #[test]
    fn only_pass_and_skipped_are_as_expected() {
        let ok: Vec<_> = Verdict::ALL.iter().filter(|v| v.as_expected()).collect();
        assert_eq!(ok, [&Verdict::Pass, &Verdict::Skipped]);
    }

    #[test]
    fn serde_names_are_lowercase() {
        assert_eq!(
            serde_json::to_string(&Verdict::Cancelled).unwrap(),
            "\"cancelled\""
        );
        let v: Verdict = serde_json::from_str("\"timeout\"").unwrap();
        assert_eq!(v, Verdict::Timeout);
    }
}
