//! The verdict vocabulary: how a node or one attempt ended, ordered from best to worst,
//! and counts per verdict. Deciding a verdict is `gate::checks`'s and the executors' job; this
//! module only names them.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// How a node (or one attempt) ended. Ordered from best to worst, so that "the worse of two"
/// is `max`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    Pass,
    Skipped,
    /// The GPU faulted (an Xid of the hardware, a new uncorrected ECC error, a page pending
    /// retirement, the GPU lost) during an attempt that did not pass: the hardware's
    /// failure, not the code's. Ordered before every failure, so that the worse of a
    /// device fault and a real failure is the failure: a fault never hides one.
    #[serde(rename = "device-fault")]
    DeviceFault,
    Fail,
    Crash,
    Timeout,
    Error,
    Blocked,
    Cancelled,
}

impl Verdict {
    pub const ALL: [Verdict; 9] = [
        Verdict::Pass,
        Verdict::Fail,
        Verdict::Crash,
        Verdict::Timeout,
        Verdict::Error,
        Verdict::DeviceFault,
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
            Verdict::DeviceFault => "device-fault",
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
