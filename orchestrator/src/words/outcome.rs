//! What a run ended with ([`RunOutcome`]): the verdicts and counts, whether it was
//! interrupted, found the disk full or quarantined a GPU, and the exit code that follows.
//! The runner (`run`) fills it; the summary (`report::summary`) and the command layer read it.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use crate::words::exit::ExitCode;
use crate::words::verdict::Verdict;

/// What a run ended with.
#[derive(Debug, Clone)]
pub struct RunOutcome {
    pub verdicts: Vec<Verdict>,
    pub counts: BTreeMap<Verdict, usize>,
    pub interrupted: bool,
    pub elapsed: Duration,
    /// Cells skipped because the machine could not hold them (or a dependency so skipped).
    pub lacked_resources: usize,
    /// The requirement in force (`run::RunOptions::require_gpus`).
    pub require_gpus: Option<u32>,
    /// Where the run found the disk full, if it did.
    pub disk_full: Option<PathBuf>,
    /// The GPUs quarantined after a device fault, by `Gpu::index`.
    pub quarantined: Vec<u32>,
}

impl RunOutcome {
    pub fn all_as_expected(&self) -> bool {
        self.verdicts.iter().all(|v| v.as_expected()) && self.lacked_resources_note().is_none()
    }

    /// Why a run whose cells all ended as expected still fails: cells were skipped for lack
    /// of resources while a requirement was in force. `None` when that is not the case.
    pub fn lacked_resources_note(&self) -> Option<String> {
        let required = self.require_gpus.filter(|&n| n > 0)?;
        let n = self.lacked_resources;
        (n > 0).then(|| {
            format!(
                "{n} cell{} skipped for lack of resources while the run requires {required} \
                 GPU{}: not as expected (pass --require-gpus 0 to accept skips)",
                if n == 1 { " was" } else { "s were" },
                if required == 1 { "" } else { "s" }
            )
        })
    }

    /// The exit code of a run with this outcome.
    pub fn exit_code(&self) -> ExitCode {
        if self.disk_full.is_some() {
            ExitCode::DiskFull
        } else if self.interrupted {
            ExitCode::Interrupted
        } else if self.all_as_expected() && self.quarantined.is_empty() {
            ExitCode::Ok
        } else if self.only_the_hardware() {
            ExitCode::DeviceFault
        } else {
            ExitCode::NotAsExpected
        }
    }

    /// Whether a GPU faulted and nothing but the hardware went wrong: every cell ended as
    /// expected or `device-fault`. A real failure beside a fault is exit 1: a fault never
    /// hides one.
    pub fn only_the_hardware(&self) -> bool {
        !self.quarantined.is_empty()
            && self.lacked_resources_note().is_none()
            && self
                .verdicts
                .iter()
                .all(|v| v.as_expected() || *v == Verdict::DeviceFault)
    }
}
