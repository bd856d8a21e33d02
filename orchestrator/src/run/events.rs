//! What a run reports while it happens: the events the runner emits (`RunStarted`,
//! `WaitingForGpu`, `NodeStarted`, `AttemptFinished`, `JobChanged`, `StillRunning`,
//! `NodeFinished`, `RunFinished`).
//!
//! The runner never prints and never writes files about itself; the terminal display and the
//! receipt writer (which renders `junit.xml` at the end) are [`Listener`]s fed with these
//! events. This module owns the types, and the redaction of an event for listeners
//! ([`Event::redacted`], with the rules of [`crate::words::redact`]); it does not decide verdicts
//! (see `protocol`; the vocabulary is `verdict`) or order work.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use crate::machine::lease::Blocker;
use crate::plan::{CellId, CellIndex, NodeKind};
use crate::receipt::{Carried, NodeReceipt};
use crate::words::redact::Redactor;
use crate::words::verdict::Verdict;

/// Where a node runs: which GPUs (as exported in CUDA_VISIBLE_DEVICES) or a CPU slot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Placement {
    /// Positions in the inventory's GPU list, in export order.
    Gpus(Vec<usize>),
    /// A CPU slot number (0-based); the orchestrator runs compare nodes in one too.
    CpuSlot(usize),
}

/// A change in the life of a cluster job that runs a cell (Slurm), for the display.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobNote {
    pub job_id: String,
    /// `submitted`, `pending`, `running`, or the final Slurm state (`COMPLETED`, …).
    pub state: String,
    /// Slurm's reason for a pending job (`Resources`, `Priority`), empty otherwise.
    pub reason: String,
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
    /// A ready cell waits for a GPU that another process on the machine leases. Sent when
    /// the wait begins and again when what holds the GPU changes; the cell keeps its place
    /// in the queue and starts when the lease is free.
    WaitingForGpu {
        cell: CellIndex,
        id: CellId,
        /// The `Gpu::index` of the GPU it waits for.
        gpu: u32,
        blocker: Blocker,
        /// `None` when the wait begins or what holds the GPU changes; how long the cell has
        /// waited when it is said again as a heartbeat.
        waited: Option<Duration>,
    },
    NodeStarted {
        cell: CellIndex,
        id: CellId,
        placement: Placement,
    },
    /// A GPU faulted during an attempt of a cell ([`crate::machine::health`]): it takes no new cells
    /// for the rest of the run. `retry`: the cell runs again on a healthy GPU of the same
    /// model.
    GpuQuarantined {
        cell: CellIndex,
        id: CellId,
        gpu: u32,
        uuid: String,
        fault: String,
        /// How the cell's try on it ended.
        ended: Verdict,
        retry: bool,
    },
    AttemptFinished {
        cell: CellIndex,
        id: CellId,
        attempt: u32,
        rep: u32,
        outcome: Verdict,
        seconds: f64,
    },
    /// A cluster job of a running cell changed state (submitted, pending, running, ended).
    JobChanged {
        cell: CellIndex,
        id: CellId,
        note: JobNote,
    },
    /// A heartbeat: the cell has been running for another interval
    /// (`RunOptions::heartbeat`) and has not finished. The runner sends these so a display
    /// that only reacts to events can still tell a slow cell from a stuck log.
    StillRunning {
        cell: CellIndex,
        id: CellId,
        /// Since the cell started (all of its attempts so far).
        running_for: Duration,
        /// The `stderr.log` of the attempt now running.
        stderr_log: PathBuf,
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
        /// The receipt was carried forward from an earlier run of this manifest and commit
        /// (`--resume`, `--filter`, `--rerun-failed`): nothing ran, and the receipt stays in
        /// that run's tree.
        carried: Option<Carried>,
    },
    RunFinished {
        counts: BTreeMap<Verdict, usize>,
        elapsed: Duration,
        interrupted: bool,
        /// Why a run whose cells all ended as expected still fails: cells skipped for lack
        /// of resources while a requirement was in force (`RunOutcome::lacked_resources_note`).
        unmet: Option<String>,
    },
}

impl Event {
    /// The event as listeners may see it: a finished node's reason and receipt redacted
    /// ([`redact_receipt`]). The runner sends every event through this, after the executor
    /// handed the child its real values.
    pub fn redacted(&self, r: &Redactor) -> Event {
        let mut e = self.clone();
        if let Event::NodeFinished {
            reason, receipt, ..
        } = &mut e
        {
            if let Some(why) = reason {
                *why = r.text(why).into_owned();
            }
            if let Some(rec) = receipt {
                redact_receipt(r, rec);
            }
        }
        e
    }
}

/// Redacts a receipt in place: its command, folder, environment, the reasons of the node
/// and of its attempts, and the names and messages of its checks.
pub fn redact_receipt(r: &Redactor, rec: &mut NodeReceipt) {
    for a in &mut rec.argv {
        *a = r.text(a).into_owned();
    }
    rec.cwd = r.text(&rec.cwd).into_owned();
    rec.env = r.env(&rec.env);
    if let Some(reason) = &mut rec.reason {
        *reason = r.text(reason).into_owned();
    }
    for a in &mut rec.attempts {
        if let Some(reason) = &mut a.reason {
            *reason = r.text(reason).into_owned();
        }
    }
    for c in &mut rec.checks {
        // A gate may build a check's name from what it read (`auth <token>`).
        c.check = r.text(&c.check).into_owned();
        if let Some(m) = &mut c.message {
            *m = r.text(m).into_owned();
        }
    }
    // A gate reports the variables it read (`env.NAME`), secrets among them: redacted by
    // the variable's name as `env` is, so attestation compares like with like.
    if let Some(doors) = &mut rec.doors {
        for (k, v) in doors.iter_mut() {
            if let (Some(name), serde_json::Value::String(s)) = (k.strip_prefix("env."), &*v) {
                *v = serde_json::Value::String(r.value(name, s));
            } else if let serde_json::Value::String(s) = &*v {
                *v = serde_json::Value::String(r.text(s).into_owned());
            }
        }
    }
}

/// Something that observes a run: the terminal display, the receipt writer, the JUnit
/// writer. Listeners are called on the runner's thread, in event order.
pub trait Listener {
    fn on_event(&mut self, event: &Event);

    /// Called once after `RunFinished`; an error here (a receipt that could not be written)
    /// makes the run end with the internal-error exit code.
    fn finish(&mut self) -> Result<(), FinishError> {
        Ok(())
    }
}

/// Why a listener could not complete its work: the listener's own typed error, boxed so
/// that every listener returns one type ([`Listener`] stays object-safe) and this module,
/// below the listeners in `report`, names none of them. A caller that needs the kind
/// downcasts the source (`report::writer::IncompleteTree` for the receipt writer).
#[derive(Debug, thiserror::Error)]
#[error(transparent)]
pub struct FinishError(pub Box<dyn std::error::Error + Send + Sync>);

impl FinishError {
    pub fn new(e: impl std::error::Error + Send + Sync + 'static) -> FinishError {
        FinishError(Box::new(e))
    }
}
