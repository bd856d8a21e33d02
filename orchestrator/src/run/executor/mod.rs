//! The seam between deciding what runs and running it: an [`Executor`] takes one cell,
//! already placed on GPUs or a CPU slot, runs all its attempts (reps and retries), and
//! returns its receipt.
//!
//! [`local::LocalExecutor`] runs subprocesses on this machine. A cluster executor (Slurm)
//! fits the same seam: it serialises the [`CellJob`] (it is plain data), submits a job whose
//! script calls the hidden `memra-orch exec-node <job.json>` entry point — which runs the
//! job through the local executor on the compute node and writes the same receipt on the
//! shared filesystem — and reads that receipt back ([`slurm::SlurmExecutor`]). Nothing
//! above this module assumes a local process.

pub mod compare;
pub mod env;
pub mod error;
pub mod exec_node;
pub mod inputs;
pub mod local;
pub mod output;
pub mod process;
pub mod reps;
pub mod scratch;
pub mod slurm;
pub mod supervise;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::plan::{Expect, NodeKind};
use crate::receipt::{AttemptRecord, FileDigest, GpuRef, NodeReceipt};
use crate::run::events::JobNote;

pub use error::{ExecError, SlurmError};

/// Everything needed to run one cell anywhere: plain, serialisable data.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CellJob {
    pub id: String,
    pub node: String,
    pub kind: NodeKind,
    pub axes: Vec<(String, String)>,
    pub tags: Vec<String>,
    pub slug: String,
    /// Substituted but for the per-attempt `${artifacts}` and `${tmp}`.
    pub argv: Vec<String>,
    pub shell: bool,
    pub cwd: PathBuf,
    /// Manifest env, matrix pins and node env, merged.
    pub pins: BTreeMap<String, String>,
    /// Names taken from the environment of the process that runs the attempt.
    pub inherit: Vec<String>,
    pub timeout: Duration,
    /// The most bytes kept of stdout and of stderr each; absent in a job file means 1 GiB.
    #[serde(default = "default_max_output")]
    pub max_output: u64,
    pub reps: u32,
    /// Every rep's artifacts must equal rep 1's; absent in a job file means true.
    #[serde(default = "yes")]
    pub deterministic: bool,
    pub retries: u32,
    pub expect: Expect,
    /// `expect_fail`: the check globs a negative cell's failure must be confined to.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub expect_fail: Vec<String>,
    /// The receipts folder's artifact store, where the local executor stores each artifact
    /// once ([`crate::receipt::store`]); `None` keeps every file as the gate wrote it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub store: Option<PathBuf>,
    /// `info`: metric-name globs that are informational.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub info: Vec<String>,
    /// Text verdict regexes (sources; validated when the plan was built).
    pub verdict_pass: Option<String>,
    pub verdict_fail: Option<String>,
    pub produces: Vec<PathBuf>,
    pub creates: Vec<PathBuf>,
    /// The leased GPUs, in export order, and their CUDA_VISIBLE_DEVICES ids.
    pub gpus: Vec<GpuRef>,
    pub visible_devices: Vec<String>,
    /// `nodes/<slug>` in the receipt tree; attempts go below it.
    pub node_dir: PathBuf,
    /// The attempts of an earlier try of this cell that ended `device-fault` on another
    /// GPU: kept (records and folders), and this try's attempts numbered after them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub prior_attempts: Vec<AttemptRecord>,
    pub binaries: Vec<FileDigest>,
    /// The files the cell's declared `inputs` globs matched, paths relative to the root.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub input_files: Vec<FileDigest>,
    pub inputs: String,
    /// The code the cell tests, as its inputs digest counts it: `git:<tree>[+<changes>]`,
    /// `hermetic` (the declared inputs are all it depends on), or `unknown:<commit id>`
    /// where git cannot name the code.
    #[serde(default)]
    pub code: String,
    /// The run's `[fingerprints]`, which join the inputs digest.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub fingerprints: Vec<crate::plan::fingerprint::Fingerprint>,
    /// The executable `argv[0]` names, when the planner resolved it (absolute); an
    /// executor on another machine resolves `argv[0]` itself when this is absent.
    #[serde(default)]
    pub program: Option<PathBuf>,
}

/// The serde default of [`CellJob::deterministic`].
fn yes() -> bool {
    true
}

/// The serde default of [`CellJob::max_output`].
fn default_max_output() -> u64 {
    crate::plan::DEFAULT_MAX_OUTPUT
}

/// What an executor reports of a cell while it runs, before it returns the receipt.
#[derive(Debug, Clone)]
pub enum CellNote {
    /// An attempt ended.
    Attempt(AttemptRecord),
    /// A cluster job of the cell changed state.
    Job(JobNote),
}

/// Runs cells. Implementations must be usable from several threads at once: the runner
/// calls [`Executor::execute`] on one thread per running cell.
pub trait Executor: Send + Sync {
    /// Runs every attempt of the cell and returns its receipt (not yet written: the
    /// receipt writer does that). `on_note` is called after each attempt and, for a
    /// cluster executor, whenever one of the cell's jobs changes state.
    fn execute(&self, job: &CellJob, on_note: &mut dyn FnMut(CellNote)) -> NodeReceipt;

    /// Stops every running attempt (SIGTERM, grace, SIGKILL for local processes) and makes
    /// later `execute` calls return `cancelled` at once. A second call stops what is still
    /// running without waiting for the grace period.
    fn cancel_all(&self);
}

impl CellJob {
    /// A receipt carrying this job's identity, command and digests; the executor fills in
    /// attempts, verdict and results.
    pub fn receipt(&self) -> NodeReceipt {
        let mut r = NodeReceipt::new(
            self.id.clone(),
            self.node.clone(),
            self.kind,
            self.slug.clone(),
        );
        r.cell = self.axes.iter().cloned().collect();
        r.tags = self.tags.clone();
        r.argv = self.argv.clone();
        r.shell = self.shell;
        r.cwd = self.cwd.to_string_lossy().into_owned();
        r.binaries = self.binaries.clone();
        r.input_files = self.input_files.clone();
        r.inputs = self.inputs.clone();
        r.code = self.code.clone();
        r.fingerprints = self.fingerprints.clone();
        r.gpus = self.gpus.clone();
        r.expect = self.expect;
        r.expect_fail = self.expect_fail.clone();
        r.info = self.info.clone();
        r
    }
}
