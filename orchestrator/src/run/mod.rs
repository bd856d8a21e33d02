//! Running a plan: the loop that takes cells whose dependencies ended as expected, asks the
//! scheduler for resources, hands them to an executor on a worker thread each, and turns
//! what comes back into events for the listeners. The `run` subcommand that wires the
//! manifest, GPUs, commit, receipt tree, signals and display around it is
//! `cmd::run`.
//!
//! The loop decides `blocked` (naming the dependency), `skipped` (filter, impossible
//! resources, a skipped dependency), `cancelled` (interrupt, `--fail-fast`), and which
//! receipts of an earlier run are carried forward ([`CarrySource`]): on `--resume` the
//! finished cells whose inputs did not change, under `--filter`/`--rerun-failed` the cells
//! not selected. It never prints and never writes receipts itself.

pub mod events;
pub mod executor;
pub mod schedule;

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::gate::attempt_file;
use crate::gate::judge::ArtifactPath;
use crate::machine::gpus::Inventory;
use crate::machine::lease::GpuLocks;
use crate::plan::{Cell, CellIndex, NodeKind, Plan};
use crate::receipt::tree::Tree;
use crate::receipt::{
    AttemptRecord, Carried, FileDigest, GpuRef, NodeIndexEntry, NodeReceipt, attempt_dir_name,
    read_node_receipt, slug,
};
use crate::run::events::{Event, JobNote, Listener, Placement};
use crate::run::executor::inputs::{DigestCache, inputs_digest};
use crate::run::executor::{CellJob, CellNote, Executor, compare};
use crate::run::schedule::{Pool, ReadyQueue};
use crate::words::diskfull::DiskFull;
use crate::words::outcome::RunOutcome;
use crate::words::verdict::{self, Verdict};

/// How to run a plan (already resolved: paths absolute, the tree chosen).
#[derive(Debug, Clone)]
pub struct RunOptions {
    pub tree: Tree,
    /// CPU slots for `gpus = 0` cells.
    pub jobs: usize,
    pub fail_fast: bool,
    /// Cells chosen by `--filter` / `--rerun-failed` (`None`: all).
    pub selected: Option<Vec<bool>>,
    /// `--resume`: a selected cell whose final receipt in [`RunOptions::carry`] has the
    /// same inputs is carried instead of run.
    pub resume: bool,
    /// The earlier run of this manifest and commit whose receipts this run may carry.
    pub carry: Option<Arc<CarrySource>>,
    /// Seconds per cell id from the previous run of this manifest.
    pub previous: HashMap<String, f64>,
    /// Set (by a signal handler) to interrupt the run; the runner resets it when it acts,
    /// and a second interrupt stops running cells without waiting for the grace.
    pub interrupt: Arc<AtomicBool>,
    /// The GPUs the run requires (`[require] gpus`, `--require-gpus`), already checked
    /// against the inventory. While it is above 0, a cell skipped for lack of resources
    /// makes the run not as expected instead of being listed only.
    pub require_gpus: Option<u32>,
    /// How often a running cell is reported as still running ([`Event::StillRunning`]).
    pub heartbeat: Duration,
    /// The machine-wide GPU leases, opened for the inventory (`None`: the run takes none).
    pub gpu_locks: Option<Arc<GpuLocks>>,
    /// Set by the loop or the receipt writer when the tree's file system fills; the loop
    /// then starts nothing more.
    pub disk_full: DiskFull,
    /// The code the run tests, for every cell's inputs digest but hermetic ones
    /// ([`crate::receipt::commit::CommitId::code`], or `unknown:<commit id>` where git cannot name
    /// it).
    pub code: String,
    /// The run's `[fingerprints]`, taken before it started.
    pub fingerprints: Vec<crate::plan::fingerprint::Fingerprint>,
}

/// The code identity of a hermetic cell: its declared inputs stand for the code.
pub const HERMETIC: &str = "hermetic";

/// The heartbeat interval when nothing else is asked for: often enough that a cron log
/// shows a slow cell is alive, rarely enough that it does not drown the other lines.
pub const DEFAULT_HEARTBEAT: Duration = Duration::from_secs(60);

/// The earlier run a new run carries receipts from: its tree and its node index by cell id.
#[derive(Debug, Clone)]
pub struct CarrySource {
    pub tree: Tree,
    /// Where the source run is, from the new run's folder (for receipts it measured itself).
    pub stamp: Carried,
    pub entries: HashMap<String, NodeIndexEntry>,
}

impl CarrySource {
    /// The source run's index entry of `id`, where its receipt file is, and the mark a run
    /// carrying it records: a receipt the source itself carried points at the run that
    /// measured it, so carrying never builds chains.
    fn lookup(&self, id: &str) -> Option<(&NodeIndexEntry, Option<PathBuf>, Carried)> {
        let entry = self.entries.get(id)?;
        let stamp = entry.carried.clone().unwrap_or_else(|| self.stamp.clone());
        let path = entry.slug.as_deref().and_then(|slug| {
            let dir = match &entry.carried {
                Some(c) => self.tree.carried_node_dir(c, slug)?,
                None => self.tree.node_dir(slug),
            };
            Some(dir.join("receipt.json"))
        });
        Some((entry, path, stamp))
    }
}

/// How the loop treats a cell, decided once when the run starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Runs (selected, no earlier receipt to keep).
    Run,
    /// Selected under `--resume`: carried when the source's final receipt has the same
    /// inputs, else runs.
    Reuse,
    /// Not selected, but downstream of a cell that runs: its inputs are computed once its
    /// dependencies are done, and the source's receipt is carried when they are unchanged;
    /// otherwise the cell is skipped as stale (never run: it was not selected).
    Check,
    /// Not selected and nothing it depends on runs: the source's receipt is carried as is.
    Carry,
}

/// What a worker thread reports to the loop.
enum Msg {
    /// The cell really runs (it was not kept from an earlier run).
    Started(CellIndex, Placement),
    Attempt(CellIndex, AttemptRecord),
    Job(CellIndex, JobNote),
    Done {
        cell: CellIndex,
        placement: Placement,
        receipt: Box<NodeReceipt>,
        carried: Option<Carried>,
    },
}

/// Per-cell state of the loop.
#[derive(Debug, Clone, PartialEq)]
enum State {
    /// Waiting for dependencies (the queue counts them down).
    Waiting,
    Ready,
    Running,
    Done(Verdict),
}

/// What dependents need to know of a finished cell.
#[derive(Debug, Clone, Default)]
struct Finished {
    reason: Option<String>,
    produces: Vec<FileDigest>,
    /// Absolute path of the artifacts folder of the last attempt.
    artifacts: Option<PathBuf>,
    /// The names of the files the last attempt wrote there.
    wrote: Vec<String>,
}

/// A job for a worker thread.
type Task = Box<dyn FnOnce() + Send>;

/// A fixed set of worker threads, one per slot that can run at once (CPU slots plus GPUs),
/// so a cell costs a channel send instead of a thread start.
struct Workers {
    tx: Option<mpsc::Sender<Task>>,
    handles: Vec<std::thread::JoinHandle<()>>,
}

impl Workers {
    fn new(n: usize) -> Workers {
        let (tx, rx) = mpsc::channel::<Task>();
        let rx = Arc::new(Mutex::new(rx));
        let handles = (0..n.max(1))
            .map(|i| {
                let rx = Arc::clone(&rx);
                std::thread::Builder::new()
                    .name(format!("memra-orch-worker-{i}"))
                    .spawn(move || {
                        loop {
                            let task = rx.lock().unwrap_or_else(|p| p.into_inner()).recv();
                            match task {
                                Ok(task) => task(),
                                Err(_) => return,
                            }
                        }
                    })
                    .expect("the OS refused to start a worker thread")
            })
            .collect();
        Workers {
            tx: Some(tx),
            handles,
        }
    }

    fn submit(&self, task: Task) {
        if let Some(tx) = &self.tx {
            // The workers live as long as this handle; a send cannot fail while it exists.
            let _ = tx.send(task);
        }
    }
}

impl Drop for Workers {
    fn drop(&mut self) {
        self.tx = None;
        for h in self.handles.drain(..) {
            let _ = h.join();
        }
    }
}

/// A cell that really runs, as the heartbeat sees it.
#[derive(Debug, Clone)]
struct Beat {
    started: Instant,
    /// Heartbeats already sent for the cell.
    sent: u32,
    /// The attempt now running (one past the last finished).
    attempt: u32,
    node_dir: PathBuf,
}

/// The run loop over one plan.
struct Runner<'a, 'b> {
    plan: &'a Plan,
    inventory: &'a Inventory,
    opts: &'a RunOptions,
    executor: Arc<dyn Executor>,
    listeners: &'a mut [&'b mut dyn Listener],
    state: Vec<State>,
    finished: Vec<Finished>,
    /// Cells skipped because the machine could not hold them, or because a dependency was.
    lacked: Vec<bool>,
    priority: Vec<f64>,
    queue: ReadyQueue,
    pool: Pool,
    digests: Arc<DigestCache>,
    running: usize,
    /// Why no new cell starts any more (interrupt, `--fail-fast`).
    stop: Option<String>,
    interrupted: bool,
    pending: Vec<Event>,
    workers: Option<Workers>,
    beats: BTreeMap<CellIndex, Beat>,
    /// Heartbeats already sent for each cell waiting for a lease, since it was last said.
    wait_beats: HashMap<CellIndex, u32>,
    /// Per cell: the attempts of its try that ended `device-fault`, for the retry to keep.
    prior_attempts: Vec<Vec<AttemptRecord>>,
    modes: Vec<Mode>,
    /// Seconds each cell waited for a GPU another process leased, before it started.
    lease_waited: Vec<Option<f64>>,
    /// Set on interrupt: compare cells, which the orchestrator runs itself, stop waiting.
    compare_cancel: Arc<AtomicBool>,
}

/// Runs a plan to the end (or until interrupted) and returns the outcome. Listeners see
/// every event in order, on this thread.
pub fn execute(
    plan: &Plan,
    inventory: &Inventory,
    executor: Arc<dyn Executor>,
    opts: &RunOptions,
    listeners: &mut [&mut dyn Listener],
) -> RunOutcome {
    let start = Instant::now();
    let estimates = schedule::estimates(plan, &opts.previous);
    let pool = Pool::new(inventory, opts.jobs).with_locks(opts.gpu_locks.clone());
    let n = plan.cells.len();
    let mut runner = Runner {
        plan,
        inventory,
        opts,
        executor,
        state: plan.cells.iter().map(|_| State::Waiting).collect(),
        finished: vec![Finished::default(); n],
        lacked: vec![false; n],
        priority: schedule::priorities(plan, &estimates),
        queue: ReadyQueue::for_plan(plan),
        pool,
        digests: Arc::new(DigestCache::new(
            plan.root.clone(),
            vec![opts.tree.receipts()],
        )),
        running: 0,
        stop: None,
        interrupted: false,
        pending: Vec::new(),
        workers: None,
        beats: BTreeMap::new(),
        wait_beats: HashMap::new(),
        prior_attempts: vec![Vec::new(); n],
        modes: modes(plan, opts),
        lease_waited: vec![None; n],
        compare_cancel: Arc::new(AtomicBool::new(false)),
        listeners,
    };
    runner.emit(&Event::RunStarted {
        total: n,
        estimates,
        gpus: runner.pool.gpu_count(),
        cpu_slots: runner.pool.cpu_slots(),
    });
    runner.run();
    // Joining the workers first: every cell has reported, so they are idle.
    drop(runner.workers.take());
    let verdicts: Vec<Verdict> = runner
        .state
        .iter()
        .map(|s| match s {
            State::Done(v) => *v,
            _ => Verdict::Cancelled,
        })
        .collect();
    let counts = verdict::count(verdicts.iter().copied());
    let elapsed = start.elapsed();
    let interrupted = runner.interrupted;
    let outcome = RunOutcome {
        verdicts,
        counts,
        interrupted,
        elapsed,
        lacked_resources: runner.lacked.iter().filter(|&&l| l).count(),
        require_gpus: opts.require_gpus,
        disk_full: opts.disk_full.get().map(Path::to_path_buf),
        quarantined: runner.pool.quarantined(),
    };
    runner.emit(&Event::RunFinished {
        counts: outcome.counts.clone(),
        elapsed,
        interrupted,
        unmet: outcome.lacked_resources_note(),
    });
    runner.flush();
    outcome
}

impl Runner<'_, '_> {
    /// Queues an event; [`Runner::flush`] hands queued events to the listeners. Deferring
    /// lets the loop start the next cell before a listener writes a receipt, so receipt
    /// I/O overlaps with running gates instead of delaying them.
    fn emit(&mut self, event: &Event) {
        // The one door to every listener (display, receipts, summary, JUnit): secrets are
        // redacted here, after the executor handed the child its real values.
        self.pending.push(event.redacted(&self.plan.redact));
    }

    fn flush(&mut self) {
        for event in std::mem::take(&mut self.pending) {
            for l in self.listeners.iter_mut() {
                l.on_event(&event);
            }
        }
    }

    fn run(&mut self) {
        let (tx, rx) = mpsc::channel::<Msg>();
        self.workers = Some(Workers::new(self.pool.cpu_slots() + self.pool.gpu_count()));
        // Cells that can never run are decided before anything starts.
        let stale = self.carry_unselected();
        for i in 0..self.plan.cells.len() {
            let cell = &self.plan.cells[i];
            if matches!(self.state[i], State::Done(_)) {
                continue;
            }
            if self.modes[i] == Mode::Carry {
                let why = match (&self.opts.carry, stale.get(&i)) {
                    (None, _) => "not selected by --filter".to_string(),
                    (Some(source), Some(what)) => format!(
                        "not selected, and its receipt in run {} tested {what}; select it to measure it here",
                        source.stamp.label()
                    ),
                    (Some(source), None) => format!(
                        "not selected, and run {} has no receipt of it to carry",
                        source.stamp.label()
                    ),
                };
                self.finish_unplaced(CellIndex(i), Verdict::Skipped, why, false);
                continue;
            }
            if self.modes[i] != Mode::Check
                && let Some(why) = self.pool.impossible(cell.gpus)
            {
                self.lacked[i] = true;
                self.finish_unplaced(CellIndex(i), Verdict::Skipped, why, true);
            }
        }
        for i in 0..self.plan.cells.len() {
            if self.state[i] == State::Waiting && self.queue.waits_on_nothing(CellIndex(i)) {
                self.make_ready(CellIndex(i));
            }
        }
        loop {
            // The flag is taken (reset) each time, so a second Ctrl-C is seen as such and
            // escalates: the executor kills what still runs without waiting for the grace.
            if self.stop.is_none()
                && let Some(at) = self.opts.disk_full.get()
            {
                self.stop = Some(format!("the disk is full at {}", at.display()));
            }
            if self.opts.interrupt.swap(false, Ordering::SeqCst) {
                self.interrupted = true;
                self.stop = Some("the run was interrupted".to_string());
                self.executor.cancel_all();
                self.compare_cancel.store(true, Ordering::SeqCst);
            }
            if self.stop.is_none() {
                self.dispatch(&tx);
            }
            self.flush();
            // Ready cells with nothing running wait for GPUs other runs lease: the loop
            // goes on polling for them until the run is stopped.
            if self.running == 0 && (self.stop.is_some() || self.queue.is_empty()) {
                break;
            }
            match rx.recv_timeout(Duration::from_millis(50)) {
                Ok(msg) => self.handle(msg),
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => break,
            }
            while let Ok(msg) = rx.try_recv() {
                self.handle(msg);
            }
            self.heartbeats();
        }
        // Whatever did not run: cancelled when the run stopped early, otherwise blocked on a
        // dependency cycle (which a validated plan never has).
        for i in 0..self.plan.cells.len() {
            if matches!(self.state[i], State::Done(_)) {
                continue;
            }
            if let Some((_, since, _, _)) = self.queue.lease_waits().find(|w| w.0 == CellIndex(i)) {
                self.lease_waited[i] = Some(since.elapsed().as_secs_f64());
            }
            let (verdict, reason) = match &self.stop {
                Some(why) => (Verdict::Cancelled, format!("not started: {why}")),
                None => (
                    Verdict::Blocked,
                    "never became ready: its dependencies form a cycle".to_string(),
                ),
            };
            self.finish_unplaced(CellIndex(i), verdict, reason, true);
        }
    }

    /// Carries the source's receipts of the cells in [`Mode::Carry`] (read in parallel: a
    /// rerun of one cell of a large tree carries all the others). Cells the source does not
    /// have, or whose receipt cannot be read, stay for the caller to skip.
    ///
    /// A receipt is carried only when it tested the code and fingerprints this run tests
    /// (under one `-dirty` folder or one `--commit` label the code can differ): the others
    /// are returned, by cell, with what they tested instead, and the caller skips them.
    fn carry_unselected(&mut self) -> HashMap<usize, String> {
        use rayon::prelude::*;
        let Some(source) = self.opts.carry.clone() else {
            return HashMap::new();
        };
        let cells: Vec<usize> = (0..self.plan.cells.len())
            .filter(|&i| self.modes[i] == Mode::Carry)
            .collect();
        let found: Vec<(usize, NodeIndexEntry, Option<NodeReceipt>, Carried)> = cells
            .par_iter()
            .filter_map(|&i| {
                let (entry, path, stamp) = source.lookup(&self.plan.cells[i].id.0)?;
                let receipt = match path {
                    Some(p) => Some(read_node_receipt(&p).ok().flatten()?),
                    None => None,
                };
                Some((i, entry.clone(), receipt, stamp))
            })
            .collect();
        let mut stale = HashMap::new();
        for (i, entry, receipt, stamp) in found {
            if let Some(r) = &receipt
                && let Some(what) = self.other_code(i, r)
            {
                stale.insert(i, what);
                continue;
            }
            self.finish_carried(CellIndex(i), entry, receipt.map(Box::new), stamp);
        }
        stale
    }

    /// The code identity cell `i`'s inputs digest holds in this run.
    fn cell_code(&self, i: usize) -> &str {
        if self.plan.cells[i].hermetic {
            HERMETIC
        } else {
            &self.opts.code
        }
    }

    /// What an earlier receipt of cell `i` tested when that is not what this run tests:
    /// other code, or other fingerprints.
    fn other_code(&self, i: usize, r: &NodeReceipt) -> Option<String> {
        let code = self.cell_code(i);
        if r.code != code {
            return Some(if r.code.is_empty() {
                "code it does not name (it predates code identities)".to_string()
            } else {
                format!("other code ({})", r.code)
            });
        }
        let prints = |f: &[crate::plan::fingerprint::Fingerprint]| -> Vec<(String, String)> {
            f.iter()
                .map(|f| (f.name.clone(), f.sha256.clone()))
                .collect()
        };
        (prints(&r.fingerprints) != prints(&self.opts.fingerprints))
            .then(|| "other fingerprints".to_string())
    }

    /// A cell that did not end as expected while the tree's file system has (almost) no room
    /// left failed for want of space, not because of what it tests: its verdict becomes
    /// `error` naming the place, and the run stops starting cells.
    fn blame_a_full_disk(&self, receipt: &mut NodeReceipt) {
        let dir = &self.opts.tree.dir;
        let Some(free) = crate::words::diskfull::free_bytes(dir) else {
            return;
        };
        if free >= crate::words::diskfull::FULL_BELOW {
            return;
        }
        let was = receipt
            .reason
            .as_deref()
            .map(|r| format!("; the cell reported: {r}"))
            .unwrap_or_default();
        receipt.reason = Some(format!(
            "disk full at {} ({free} bytes free after the cell ended {}){was}; free space and run it again",
            dir.display(),
            receipt.verdict
        ));
        receipt.verdict = Verdict::Error;
        self.opts.disk_full.set(dir);
    }

    /// Finishes a cell with a receipt carried from the source run.
    fn finish_carried(
        &mut self,
        cell: CellIndex,
        entry: NodeIndexEntry,
        receipt: Option<Box<NodeReceipt>>,
        carried: Carried,
    ) {
        // A carried dependency that was skipped has finished its dependents already (as
        // skipped): a cell ends once, whichever way it ended first.
        if matches!(self.state[cell.0], State::Done(_)) {
            return;
        }
        let f = &mut self.finished[cell.0];
        f.reason = entry.reason.clone();
        if let Some(r) = &receipt {
            f.produces = r.produces.clone();
            f.wrote = r.artifacts.iter().map(|a| a.name.clone()).collect();
            f.artifacts = r.last_attempt_dir().and_then(|d| {
                self.opts
                    .tree
                    .carried_node_dir(&carried, &r.slug)
                    .map(|n| n.join(d).join("artifacts"))
            });
        }
        let c = self.plan.cell(cell);
        let event = Event::NodeFinished {
            cell,
            id: c.id.clone(),
            kind: c.kind,
            verdict: entry.verdict,
            reason: entry.reason,
            seconds: entry.seconds,
            receipt,
            carried: Some(carried),
        };
        self.done(cell, entry.verdict, event);
    }

    fn make_ready(&mut self, i: CellIndex) {
        self.state[i.0] = State::Ready;
        // A cell only checked against the source never runs, so it needs no GPU.
        let gpus = match self.modes[i.0] {
            Mode::Check => 0,
            _ => self.plan.cell(i).gpus,
        };
        if gpus as usize > self.pool.healthy(None) {
            let why = self.too_few_healthy();
            self.finish_unplaced(i, Verdict::DeviceFault, why, true);
            return;
        }
        self.queue.push(i, self.priority[i.0], gpus);
    }

    fn dispatch(&mut self, tx: &mpsc::Sender<Msg>) {
        if self.queue.is_empty() {
            return;
        }
        let plan = self.plan;
        let taken = self.queue.take_placeable(&mut self.pool, plan);
        if let Some(limit) = plan.lease_timeout {
            for (cell, gpu, blocker, waited) in self.queue.expire_waits(limit) {
                self.wait_beats.remove(&cell);
                self.lease_waited[cell.0] = Some(waited.as_secs_f64());
                let reason = format!(
                    "waited {} for gpu {gpu}, {blocker}, longer than lease_timeout = \"{}\"; \
                     free the GPU (memra-orch gpus shows who holds it) or raise lease_timeout",
                    humantime::format_duration(Duration::from_secs(waited.as_secs())),
                    humantime::format_duration(limit)
                );
                self.finish_unplaced(cell, Verdict::Error, reason, true);
            }
        }
        for w in taken.waiting {
            // Said anew (the wait began, or its holder changed): heartbeats count afresh.
            self.wait_beats.remove(&w.cell);
            self.emit(&Event::WaitingForGpu {
                cell: w.cell,
                id: plan.cell(w.cell).id.clone(),
                gpu: w.gpu,
                blocker: w.blocker,
                waited: None,
            });
        }
        for (cell, seconds) in taken.waited {
            self.lease_waited[cell.0] = Some(seconds);
        }
        for (cell, placement) in taken.started {
            self.state[cell.0] = State::Running;
            self.running += 1;
            let mut job = self.job(cell, &placement);
            job.prior_attempts = std::mem::take(&mut self.prior_attempts[cell.0]);
            let compare = self.compare_paths(cell);
            let mode = self.modes[cell.0];
            let previous = match (mode, &self.opts.carry) {
                (Mode::Reuse | Mode::Check, Some(source)) => source
                    .lookup(&job.id)
                    .and_then(|(_, path, stamp)| Some((path?, stamp))),
                _ => None,
            };
            let only_check = mode == Mode::Check;
            let executor = Arc::clone(&self.executor);
            let digests = Arc::clone(&self.digests);
            let tx = tx.clone();
            let kind = plan.cell(cell).kind;
            let policy = plan.cell(cell).compare.as_ref().map(|c| c.policy.clone());
            let globs = plan.cell(cell).inputs.clone();
            let cancel = Arc::clone(&self.compare_cancel);
            let workers = self.workers.as_ref().expect("workers start with the run");
            workers.submit(Box::new(move || {
                let identity = job.receipt();
                // A bug in a worker must not leave the loop waiting for a cell forever: the
                // panic becomes this cell's `error` and the run goes on.
                let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    run_cell(
                        &placement,
                        job,
                        kind,
                        compare,
                        policy,
                        &globs,
                        Previous {
                            receipt: previous,
                            only_check,
                        },
                        &*executor,
                        &digests,
                        &tx,
                        cell,
                        &cancel,
                    )
                }));
                let (receipt, carried) = ran.unwrap_or_else(|panic| {
                    let what = panic
                        .downcast_ref::<String>()
                        .cloned()
                        .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                        .unwrap_or_default();
                    let mut r = identity;
                    r.verdict = Verdict::Error;
                    r.reason = Some(format!(
                        "internal error in memra-orch while running this cell ({what}); please report it"
                    ));
                    (r, None)
                });
                let _ = tx.send(Msg::Done {
                    cell,
                    placement,
                    receipt: Box::new(receipt),
                    carried,
                });
            }));
        }
    }

    fn handle(&mut self, msg: Msg) {
        match msg {
            Msg::Started(cell, placement) => {
                let id = self.plan.cell(cell).id.clone();
                self.beats.insert(
                    cell,
                    Beat {
                        started: Instant::now(),
                        sent: 0,
                        attempt: 1,
                        node_dir: self.opts.tree.node_dir(&slug(&id.0)),
                    },
                );
                self.emit(&Event::NodeStarted {
                    cell,
                    id,
                    placement,
                });
            }
            Msg::Attempt(cell, rec) => {
                let id = self.plan.cell(cell).id.clone();
                if let Some(b) = self.beats.get_mut(&cell) {
                    b.attempt = rec.n + 1;
                }
                self.emit(&Event::AttemptFinished {
                    cell,
                    id,
                    attempt: rec.n,
                    rep: rec.rep,
                    outcome: rec.outcome,
                    seconds: rec.seconds,
                });
            }
            Msg::Job(cell, note) => {
                let id = self.plan.cell(cell).id.clone();
                self.emit(&Event::JobChanged { cell, id, note });
            }
            Msg::Done {
                cell,
                placement,
                mut receipt,
                carried,
            } => {
                if carried.is_none() {
                    receipt.lease_wait_seconds = self.lease_waited[cell.0];
                }
                self.pool.release(&placement);
                self.running -= 1;
                self.beats.remove(&cell);
                if carried.is_none() && self.quarantine_and_retry(cell, &receipt) {
                    return;
                }
                if carried.is_none() && self.plan.cell(cell).kind == NodeKind::Setup {
                    // A setup may have written files that cells still to come declare.
                    self.digests.files_changed();
                }
                if carried.is_none() && !receipt.verdict.as_expected() {
                    self.blame_a_full_disk(&mut receipt);
                }
                let verdict = receipt.verdict;
                if self.opts.fail_fast && !verdict.as_expected() && self.stop.is_none() {
                    self.stop = Some(format!("--fail-fast: {} ended {verdict}", receipt.id));
                }
                let f = &mut self.finished[cell.0];
                f.reason = receipt.reason.clone();
                f.produces = receipt.produces.clone();
                f.wrote = receipt.artifacts.iter().map(|a| a.name.clone()).collect();
                let node_dir = match &carried {
                    Some(c) => self.opts.tree.carried_node_dir(c, &receipt.slug),
                    None => Some(self.opts.tree.node_dir(&receipt.slug)),
                };
                f.artifacts = receipt
                    .last_attempt_dir()
                    .zip(node_dir)
                    .map(|(d, n)| n.join(d).join("artifacts"));
                let c = self.plan.cell(cell);
                let event = Event::NodeFinished {
                    cell,
                    id: c.id.clone(),
                    kind: c.kind,
                    verdict,
                    reason: receipt.reason.clone(),
                    seconds: receipt.seconds,
                    receipt: Some(receipt),
                    carried,
                };
                self.done(cell, verdict, event);
            }
        }
    }

    /// Sends [`Event::StillRunning`] for every running cell that has passed another
    /// heartbeat interval since it started. The loop wakes at least every 50 ms, so the
    /// beats are that close to the interval without a timer thread.
    fn heartbeats(&mut self) {
        let every = self.opts.heartbeat;
        if every.is_zero() {
            return;
        }
        let mut due = Vec::new();
        for (cell, b) in self.beats.iter_mut() {
            let next = every.saturating_mul(b.sent + 1);
            if b.started.elapsed() >= next {
                b.sent += 1;
                due.push(Event::StillRunning {
                    cell: *cell,
                    id: self.plan.cell(*cell).id.clone(),
                    running_for: next,
                    stderr_log: b
                        .node_dir
                        .join(attempt_dir_name(b.attempt))
                        .join("stderr.log"),
                });
            }
        }
        // Cells waiting for a GPU another process leases are said again every interval,
        // so a cron log shows the run is alive and what it waits for.
        for (cell, since, gpu, blocker) in self.queue.lease_waits() {
            // Counted from the start of the wait, also after the wait was said anew (its
            // holder changed): the line says how long the cell has really waited.
            let sent = self.wait_beats.entry(cell).or_insert_with(|| {
                u32::try_from(since.elapsed().as_nanos() / every.as_nanos().max(1))
                    .unwrap_or(u32::MAX)
            });
            let next = every.saturating_mul(*sent + 1);
            if since.elapsed() >= next {
                *sent += 1;
                due.push(Event::WaitingForGpu {
                    cell,
                    id: self.plan.cell(cell).id.clone(),
                    gpu,
                    blocker: blocker.clone(),
                    waited: Some(next),
                });
            }
        }
        for e in &due {
            self.emit(e);
        }
    }

    /// Every GPU that faulted during the cell's last attempt takes no new cells for the rest of
    /// the run (whether the attempt passed or not), and what can no longer be placed ends
    /// `device-fault`. A cell that ended `device-fault` runs again on healthy GPUs of the same
    /// model while the run has enough of them (each fault quarantines a GPU, so this ends); it
    /// keeps its faulty attempts. Returns whether it was queued again.
    fn quarantine_and_retry(&mut self, cell: CellIndex, receipt: &NodeReceipt) -> bool {
        let faulty: Vec<(u32, String, String)> = receipt
            .attempts
            .iter()
            .flat_map(|a| {
                a.gpu_health
                    .iter()
                    .filter_map(|h| Some((h.gpu, h.uuid.clone(), h.fault.clone()?)))
            })
            .filter(|(g, _, _)| !self.pool.quarantined().contains(g))
            .collect();
        if faulty.is_empty() {
            return false;
        }
        let model = faulty
            .first()
            .and_then(|(g, _, _)| self.pool.model_of(*g).map(str::to_string));
        for (gpu, _, _) in &faulty {
            self.pool.quarantine(*gpu);
        }
        let c = self.plan.cell(cell);
        let retry = receipt.verdict == Verdict::DeviceFault
            && self.stop.is_none()
            && self.pool.healthy(model.as_deref()) >= c.gpus as usize;
        for (gpu, uuid, fault) in &faulty {
            self.emit(&Event::GpuQuarantined {
                cell,
                id: c.id.clone(),
                gpu: *gpu,
                uuid: uuid.clone(),
                fault: fault.clone(),
                ended: receipt.verdict,
                retry,
            });
        }
        // What can never be placed now ends here rather than waiting for ever.
        let lost = self.queue.take_unplaceable(&self.pool);
        for l in lost {
            let why = self.too_few_healthy();
            self.finish_unplaced(l, Verdict::DeviceFault, why, true);
        }
        if !retry {
            return false;
        }
        self.prior_attempts[cell.0] = receipt.attempts.clone();
        self.state[cell.0] = State::Ready;
        self.queue.push_on(
            cell,
            self.priority[cell.0],
            self.plan.cell(cell).gpus,
            model,
        );
        true
    }

    /// Why a cell is not run after GPUs were quarantined: too few healthy ones are left.
    fn too_few_healthy(&self) -> String {
        let gone: Vec<String> = self
            .pool
            .quarantined()
            .iter()
            .map(|g| format!("gpu {g}"))
            .collect();
        format!(
            "not run: too few healthy GPUs are left for it ({} quarantined after a device fault)",
            gone.join(", ")
        )
    }

    /// Finishes a cell that never got resources (skipped, blocked, cancelled).
    fn finish_unplaced(&mut self, cell: CellIndex, verdict: Verdict, reason: String, write: bool) {
        if matches!(self.state[cell.0], State::Done(_)) {
            return;
        }
        let c = self.plan.cell(cell);
        let waited = self.lease_waited[cell.0];
        // A cell whose run again after a device fault never started keeps the attempts of
        // its faulty try: they ran, and their readings are the evidence.
        let prior = std::mem::take(&mut self.prior_attempts[cell.0]);
        let reason = if prior.is_empty() {
            reason
        } else {
            format!(
                "its earlier try ended device-fault (attempts kept); running it again: {reason}"
            )
        };
        let receipt = write.then(|| {
            let mut r = static_receipt(c, verdict, &reason);
            r.lease_wait_seconds = waited;
            r.attempts = prior;
            Box::new(r)
        });
        self.finished[cell.0].reason = Some(reason.clone());
        let event = Event::NodeFinished {
            cell,
            id: c.id.clone(),
            kind: c.kind,
            verdict,
            reason: Some(reason),
            seconds: 0.0,
            receipt,
            carried: None,
        };
        self.done(cell, verdict, event);
    }

    /// Records a verdict, tells the listeners, and settles the dependents: a dependency
    /// that was skipped skips them, one not as expected blocks them, otherwise they come a
    /// step closer to ready.
    fn done(&mut self, cell: CellIndex, verdict: Verdict, event: Event) {
        self.state[cell.0] = State::Done(verdict);
        self.emit(&event);
        let dependents = self.queue.dependents(cell).to_vec();
        let dep_id = &self.plan.cell(cell).id.0;
        for d in dependents {
            if matches!(self.state[d.0], State::Done(_)) {
                continue;
            }
            if verdict == Verdict::Skipped {
                self.lacked[d.0] |= self.lacked[cell.0];
                let why = self.finished[cell.0].reason.clone().unwrap_or_default();
                self.finish_unplaced(
                    d,
                    Verdict::Skipped,
                    format!("needs {dep_id}, which was skipped ({why})"),
                    true,
                );
            } else if verdict == Verdict::Cancelled {
                // Not the dependent's fault and not a defect: it runs on `--resume`.
                self.finish_unplaced(
                    d,
                    Verdict::Cancelled,
                    format!("not started: needs {dep_id}, which was cancelled"),
                    true,
                );
            } else if verdict == Verdict::DeviceFault {
                // The hardware kept the dependency from an answer: not the dependent's
                // fault, and not the code's either.
                self.finish_unplaced(
                    d,
                    Verdict::DeviceFault,
                    format!("not run: needs {dep_id}, which ended device-fault"),
                    true,
                );
            } else if !verdict.as_expected() && !self.reads_what_was_written(d, cell, verdict) {
                let mut why = format!("needs {dep_id}, which ended {verdict}");
                if verdict == Verdict::Fail
                    && let Some(spec) = &self.plan.cell(d).compare
                {
                    why = format!("{why} and wrote no {}", spec.artifact);
                }
                if verdict == Verdict::Blocked
                    && let Some(r) = &self.finished[cell.0].reason
                {
                    why = format!("{why}: {r}");
                }
                self.finish_unplaced(d, Verdict::Blocked, why, true);
            } else if self.state[d.0] == State::Waiting && self.queue.count_down(d) {
                // A cell to carry never runs: the run finishes it when it starts.
                if self.modes[d.0] != Mode::Carry {
                    self.make_ready(d);
                }
            }
        }
    }

    /// Whether compare cell `d` runs although its side `dep` ended `verdict`, not as
    /// expected: a compare reads what was written, so a side whose gate ran to its end
    /// (`fail`: a failed check, a canary that passed, reps that differ) and wrote the
    /// artifact is compared whatever its checks said. A side that crashed, timed out,
    /// errored or never ran still blocks it, and so does any `needs` that is not a side.
    fn reads_what_was_written(&self, d: CellIndex, dep: CellIndex, verdict: Verdict) -> bool {
        let Some(spec) = &self.plan.cell(d).compare else {
            return false;
        };
        verdict == Verdict::Fail
            && (spec.reference == dep || spec.candidate == dep)
            && self.finished[dep.0].wrote.contains(&spec.artifact)
    }

    /// The job for a placed cell: plain data an executor anywhere can run.
    fn job(&self, i: CellIndex, placement: &Placement) -> CellJob {
        let c = self.plan.cell(i);
        let slug = slug(&c.id.0);
        let positions: &[usize] = match placement {
            Placement::Gpus(p) => p,
            Placement::CpuSlot(_) => &[],
        };
        let gpus: Vec<GpuRef> = positions
            .iter()
            .map(|&p| {
                let g = &self.inventory.gpus[p];
                GpuRef {
                    index: g.index,
                    uuid: g.uuid.clone(),
                    name: g.name.clone(),
                }
            })
            .collect();
        let visible_devices = positions
            .iter()
            .map(|&p| self.inventory.gpus[p].visible_id())
            .collect();
        let mut binaries = Vec::new();
        for need in &c.needs {
            binaries.extend(self.finished[need.0].produces.iter().cloned());
        }
        CellJob {
            prior_attempts: Vec::new(),
            id: c.id.0.clone(),
            node: c.node.0.clone(),
            kind: c.kind,
            axes: c.axes.clone(),
            tags: c.tags.clone(),
            node_dir: self.opts.tree.node_dir(&slug),
            slug,
            argv: c.argv.clone(),
            shell: c.shell,
            cwd: c.cwd.clone(),
            pins: c.env.clone(),
            inherit: self.plan.inherit.clone(),
            timeout: c.timeout,
            max_output: c.max_output,
            reps: c.reps,
            deterministic: c.deterministic,
            retries: c.retries,
            expect: c.expect,
            expect_fail: c.expect_fail.clone(),
            info: c.info.clone(),
            store: Some(crate::receipt::store::store_dir(&self.opts.tree.receipts())),
            verdict_pass: c
                .verdict
                .as_ref()
                .and_then(|v| v.pass.as_ref().map(|r| r.as_str().to_string())),
            verdict_fail: c
                .verdict
                .as_ref()
                .and_then(|v| v.fail.as_ref().map(|r| r.as_str().to_string())),
            produces: c.produces.clone(),
            creates: c.creates.clone(),
            gpus,
            visible_devices,
            binaries,
            input_files: Vec::new(),
            inputs: String::new(),
            code: self.cell_code(i.0).to_string(),
            fingerprints: self.opts.fingerprints.clone(),
            program: None,
        }
    }

    /// For a compare cell: the reference's and the candidate's artifact file.
    fn compare_paths(&self, i: CellIndex) -> Option<(ArtifactPath, ArtifactPath)> {
        let spec = self.plan.cell(i).compare.as_ref()?;
        let side = |c: CellIndex| {
            self.finished[c.0].artifacts.clone().unwrap_or_else(|| {
                // A reference reused from an earlier run without attempts has no folder;
                // the comparison then fails naming the missing file.
                self.opts
                    .tree
                    .node_dir(&slug(&self.plan.cell(c).id.0))
                    .join("artifacts")
            })
        };
        // The file is read below its attempt folder (the artifacts folder's parent), so a
        // link anywhere from `artifacts/` down is refused.
        let path = |c: CellIndex| {
            let dir = side(c);
            ArtifactPath {
                cell: self.plan.cell(c).id.0.clone(),
                attempt: dir.parent().map(PathBuf::from).unwrap_or_default(),
                rel: PathBuf::from("artifacts").join(&spec.artifact),
            }
        };
        Some((path(spec.reference), path(spec.candidate)))
    }
}

/// The earlier receipt a placed cell may carry instead of running.
struct Previous {
    /// The source run's receipt file of the cell and the mark to carry it with.
    receipt: Option<(PathBuf, Carried)>,
    /// [`Mode::Check`]: the cell is never run; without a receipt to carry it is skipped.
    only_check: bool,
}

/// The worker side of a placed cell: digests (declared inputs included), carrying the
/// earlier receipt when its inputs are the same, then the compare or the executor.
#[allow(clippy::too_many_arguments)]
fn run_cell(
    placement: &Placement,
    mut job: CellJob,
    kind: NodeKind,
    compare: Option<(ArtifactPath, ArtifactPath)>,
    policy: Option<crate::plan::Policy>,
    globs: &[String],
    previous: Previous,
    executor: &dyn Executor,
    digests: &DigestCache,
    tx: &mpsc::Sender<Msg>,
    cell: CellIndex,
    cancel: &AtomicBool,
) -> (NodeReceipt, Option<Carried>) {
    if kind != NodeKind::Compare && !job.shell {
        job.program = digests.resolve(&job);
        if let Some(d) = job.program.as_deref().and_then(|p| digests.digest(p)) {
            job.binaries.insert(0, d);
        }
        // A file the command names (`python3 /opt/gates/gate.py`, a model in an ignored
        // folder) is an input even where neither the commit nor `inputs` covers it.
        for a in job.argv.iter().skip(1) {
            if a.contains(crate::plan::ARTIFACTS_TOKEN) || a.contains(crate::plan::TMP_TOKEN) {
                continue;
            }
            let path = job.cwd.join(a);
            if path.is_file()
                && let Some(d) = digests.digest(&path)
            {
                job.binaries.push(FileDigest {
                    path: a.clone(),
                    ..d
                });
            }
        }
    }
    // A compare's inputs are the two files it compares: hashing them makes a carried
    // comparison be redone when either side produced different bits. They are named by
    // side and file name, not by path: the same bits in another run's tree are the same
    // input.
    // They are hashed as the compare reads them (no link followed, nothing but a regular
    // file opened), so a FIFO or a link cannot hang or mislead the digest either.
    if let Some((reference, candidate)) = &compare {
        for (side, a) in [("reference", reference), ("candidate", candidate)] {
            if let Ok((bytes, sha256)) = attempt_file::sha256(&a.attempt, &a.rel) {
                let name = a.rel.file_name().unwrap_or_default().to_string_lossy();
                job.binaries.push(FileDigest {
                    path: format!("{side}/{name}"),
                    bytes,
                    sha256,
                });
            }
        }
    }
    let declared = digests.declared_inputs(globs);
    job.input_files = declared.files;
    let full = compare.as_ref().map(|(r, c)| (r.full(), c.full()));
    job.inputs = inputs_digest(&job, policy.as_ref(), full.as_ref());
    // A digest that misses what the cell depends on cannot tell a change from a flake: a
    // hermetic cell's glob, or a glob naming the engine outside the repository, that
    // matches nothing ends the cell before it runs.
    let missing: Vec<&String> = declared
        .unmatched
        .iter()
        .filter(|g| job.code == HERMETIC || declared.external.contains(g))
        .collect();
    if let Some(first) = missing.first() {
        let mut r = job.receipt();
        r.verdict = Verdict::Error;
        r.reason = Some(format!(
            "declared input `{first}` matches no file{}, so the inputs digest would not cover \
             what the cell depends on; fix the glob (the engine may live elsewhere on this \
             machine) or remove it",
            if missing.len() > 1 {
                format!(" (and {} more globs match none)", missing.len() - 1)
            } else {
                String::new()
            }
        ));
        return (r, None);
    }
    let mut not_carried = "no earlier run at this commit has it".to_string();
    if let Some((path, carried)) = previous.receipt {
        let run = carried.label();
        not_carried = match read_node_receipt(&path) {
            Ok(Some(old)) if old.verdict.is_final() && old.inputs == job.inputs => {
                return (old, Some(carried));
            }
            Ok(Some(old)) if !old.verdict.is_final() => {
                format!("its receipt in run {run} is not final ({})", old.verdict)
            }
            Ok(Some(_)) => format!(
                "its receipt in run {run} is stale (the inputs changed since), so it is not carried"
            ),
            Ok(None) => format!("run {run} has no receipt of it"),
            Err(e) => format!("its receipt in run {run} cannot be read ({e})"),
        };
    }
    if previous.only_check {
        let why = format!("not selected, and {not_carried}");
        let mut r = job.receipt();
        r.verdict = Verdict::Skipped;
        r.reason = Some(why);
        r.inputs = job.inputs.clone();
        return (r, None);
    }
    let _ = tx.send(Msg::Started(cell, placement.clone()));
    if let (Some((reference, candidate)), Some(policy)) = (compare, policy) {
        return (
            compare::run(&job, &reference, &candidate, &policy, cancel),
            None,
        );
    }
    let mut on_note = |note: CellNote| {
        let _ = tx.send(match note {
            CellNote::Attempt(rec) => Msg::Attempt(cell, rec),
            CellNote::Job(note) => Msg::Job(cell, note),
        });
    };
    (executor.execute(&job, &mut on_note), None)
}

/// Each cell's [`Mode`]: selected cells run (or may be carried on `--resume`); unselected
/// ones are carried from the source, checked first when something they depend on runs.
fn modes(plan: &Plan, opts: &RunOptions) -> Vec<Mode> {
    let n = plan.cells.len();
    let selected = |i: usize| opts.selected.as_ref().is_none_or(|s| s[i]);
    // Whether a cell depends, directly or not, on a selected cell. Needs never form a cycle
    // in a validated plan; the `visiting` guard only keeps a broken one from recursing.
    let mut downstream: Vec<Option<bool>> = vec![None; n];
    fn visit(
        i: usize,
        plan: &Plan,
        selected: &dyn Fn(usize) -> bool,
        memo: &mut [Option<bool>],
        visiting: &mut [bool],
    ) -> bool {
        if let Some(v) = memo[i] {
            return v;
        }
        if visiting[i] {
            return false;
        }
        visiting[i] = true;
        let mut any = false;
        for need in &plan.cells[i].needs {
            if selected(need.0) || visit(need.0, plan, selected, memo, visiting) {
                any = true;
            }
        }
        visiting[i] = false;
        memo[i] = Some(any);
        any
    }
    let mut visiting = vec![false; n];
    (0..n)
        .map(|i| {
            if selected(i) {
                if opts.resume && opts.carry.is_some() {
                    Mode::Reuse
                } else {
                    Mode::Run
                }
            } else if opts.carry.is_some()
                && visit(i, plan, &selected, &mut downstream, &mut visiting)
            {
                Mode::Check
            } else {
                Mode::Carry
            }
        })
        .collect()
}

/// The receipt of a cell that never ran: what it would have run, and why it did not.
fn static_receipt(c: &Cell, verdict: Verdict, reason: &str) -> NodeReceipt {
    let mut r = NodeReceipt::new(c.id.0.clone(), c.node.0.clone(), c.kind, slug(&c.id.0));
    r.verdict = verdict;
    r.reason = Some(reason.to_string());
    r.cell = c.axes.iter().cloned().collect();
    r.tags = c.tags.clone();
    r.argv = c.argv.clone();
    r.shell = c.shell;
    r.cwd = c.cwd.to_string_lossy().into_owned();
    r.env = c
        .env
        .iter()
        .map(|(k, v)| (k.clone(), crate::words::redact::by_name(k, v)))
        .collect();
    r.expect = c.expect;
    r
}
