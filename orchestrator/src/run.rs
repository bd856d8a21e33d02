//! Running a plan: the loop that takes cells whose dependencies ended as expected, asks the
//! scheduler for resources, hands them to an executor on a worker thread each, and turns
//! what comes back into events for the listeners. The `run` subcommand that wires the
//! manifest, GPUs, commit, receipt tree, signals and display around it is
//! `cmd::run`.
//!
//! The loop decides `blocked` (naming the dependency), `skipped` (filter, impossible
//! resources, a skipped dependency), `cancelled` (interrupt, `--fail-fast`) and reuses
//! finished receipts on `--resume`. It never prints and never writes receipts itself.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::ExitCode;
use crate::events::{Event, JobNote, Listener, Placement};
use crate::executor::inputs::{DigestCache, inputs_digest};
use crate::executor::{CellJob, CellNote, Executor, compare};
use crate::gpus::Inventory;
use crate::plan::{Cell, CellIndex, NodeKind, Plan};
use crate::receipt::tree::Tree;
use crate::receipt::{
    AttemptRecord, FileDigest, GpuRef, NodeReceipt, attempt_dir_name, read_node_receipt, slug,
};
use crate::schedule::{self, Pool, ReadyQueue};
use crate::verdict::{self, Verdict};

/// How to run a plan (already resolved: paths absolute, the tree chosen).
#[derive(Debug, Clone)]
pub struct RunOptions {
    pub tree: Tree,
    /// CPU slots for `gpus = 0` cells.
    pub jobs: usize,
    pub fail_fast: bool,
    /// Cells chosen by `--filter` (`None`: all).
    pub selected: Option<Vec<bool>>,
    /// Keep final receipts already in the tree whose inputs did not change.
    pub resume: bool,
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
}

/// The heartbeat interval when nothing else is asked for: often enough that a cron log
/// shows a slow cell is alive, rarely enough that it does not drown the other lines.
pub const DEFAULT_HEARTBEAT: Duration = Duration::from_secs(60);

/// What a run ended with.
#[derive(Debug, Clone)]
pub struct RunOutcome {
    pub verdicts: Vec<Verdict>,
    pub counts: BTreeMap<Verdict, usize>,
    pub interrupted: bool,
    pub elapsed: Duration,
    /// Cells skipped because the machine could not hold them (or a dependency so skipped).
    pub lacked_resources: usize,
    /// The requirement in force ([`RunOptions::require_gpus`]).
    pub require_gpus: Option<u32>,
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
        if self.interrupted {
            ExitCode::Interrupted
        } else if self.all_as_expected() {
            ExitCode::Ok
        } else {
            ExitCode::NotAsExpected
        }
    }
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
        reused: bool,
    },
}

/// Per-cell state of the loop.
#[derive(Debug, Clone, PartialEq)]
enum State {
    Waiting(usize),
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
    dependents: Vec<Vec<CellIndex>>,
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
    let pool = Pool::new(inventory, opts.jobs);
    let n = plan.cells.len();
    let mut runner = Runner {
        plan,
        inventory,
        opts,
        executor,
        state: plan
            .cells
            .iter()
            .map(|c| State::Waiting(c.needs.len()))
            .collect(),
        finished: vec![Finished::default(); n],
        lacked: vec![false; n],
        dependents: plan.dependents(),
        priority: schedule::priorities(plan, &estimates),
        queue: ReadyQueue::default(),
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
        self.pending.push(event.clone());
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
        for i in 0..self.plan.cells.len() {
            let cell = &self.plan.cells[i];
            if let Some(sel) = &self.opts.selected
                && !sel[i]
            {
                self.finish_unplaced(
                    CellIndex(i),
                    Verdict::Skipped,
                    "not selected by --filter".into(),
                    false,
                );
                continue;
            }
            if let Some(why) = self.pool.impossible(cell.gpus) {
                self.lacked[i] = true;
                self.finish_unplaced(CellIndex(i), Verdict::Skipped, why, true);
            }
        }
        for i in 0..self.plan.cells.len() {
            if self.state[i] == State::Waiting(0) {
                self.make_ready(CellIndex(i));
            }
        }
        loop {
            // The flag is taken (reset) each time, so a second Ctrl-C is seen as such and
            // escalates: the executor kills what still runs without waiting for the grace.
            if self.opts.interrupt.swap(false, Ordering::SeqCst) {
                self.interrupted = true;
                self.stop = Some("the run was interrupted".to_string());
                self.executor.cancel_all();
            }
            if self.stop.is_none() {
                self.dispatch(&tx);
            }
            self.flush();
            if self.running == 0 {
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

    fn make_ready(&mut self, i: CellIndex) {
        self.state[i.0] = State::Ready;
        self.queue
            .push(i, self.priority[i.0], self.plan.cell(i).gpus);
    }

    fn dispatch(&mut self, tx: &mpsc::Sender<Msg>) {
        if self.queue.is_empty() {
            return;
        }
        let plan = self.plan;
        let started = self.queue.take_placeable(&mut self.pool);
        for (cell, placement) in started {
            self.state[cell.0] = State::Running;
            self.running += 1;
            let job = self.job(cell, &placement);
            let compare = self.compare_paths(cell);
            let previous = if self.opts.resume {
                Some(self.opts.tree.receipt_json(&job.slug))
            } else {
                None
            };
            let executor = Arc::clone(&self.executor);
            let digests = Arc::clone(&self.digests);
            let tx = tx.clone();
            let kind = plan.cell(cell).kind;
            let policy = plan.cell(cell).compare.as_ref().map(|c| c.policy.clone());
            let globs = plan.cell(cell).inputs.clone();
            let workers = self.workers.as_ref().expect("workers start with the run");
            workers.submit(Box::new(move || {
                let identity = job.receipt();
                // A bug in a worker must not leave the loop waiting for a cell forever: the
                // panic becomes this cell's `error` and the run goes on.
                let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    run_cell(
                        &placement, job, kind, compare, policy, &globs, previous, &*executor,
                        &digests, &tx, cell,
                    )
                }));
                let (receipt, reused) = ran.unwrap_or_else(|panic| {
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
                    (r, false)
                });
                let _ = tx.send(Msg::Done {
                    cell,
                    placement,
                    receipt: Box::new(receipt),
                    reused,
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
                receipt,
                reused,
            } => {
                self.pool.release(&placement);
                self.running -= 1;
                self.beats.remove(&cell);
                if !reused && self.plan.cell(cell).kind == NodeKind::Setup {
                    // A setup may have written files that cells still to come declare.
                    self.digests.files_changed();
                }
                let verdict = receipt.verdict;
                if self.opts.fail_fast && !verdict.as_expected() && self.stop.is_none() {
                    self.stop = Some(format!("--fail-fast: {} ended {verdict}", receipt.id));
                }
                let f = &mut self.finished[cell.0];
                f.reason = receipt.reason.clone();
                f.produces = receipt.produces.clone();
                f.artifacts = receipt.last_attempt_dir().map(|d| {
                    self.opts
                        .tree
                        .node_dir(&receipt.slug)
                        .join(d)
                        .join("artifacts")
                });
                let c = self.plan.cell(cell);
                let event = Event::NodeFinished {
                    cell,
                    id: c.id.clone(),
                    kind: c.kind,
                    verdict,
                    reason: receipt.reason.clone(),
                    seconds: receipt.seconds,
                    receipt: Some(receipt),
                    reused,
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
        for e in &due {
            self.emit(e);
        }
    }

    /// Finishes a cell that never got resources (skipped, blocked, cancelled).
    fn finish_unplaced(&mut self, cell: CellIndex, verdict: Verdict, reason: String, write: bool) {
        if matches!(self.state[cell.0], State::Done(_)) {
            return;
        }
        let c = self.plan.cell(cell);
        let receipt = write.then(|| Box::new(static_receipt(c, verdict, &reason)));
        self.finished[cell.0].reason = Some(reason.clone());
        let event = Event::NodeFinished {
            cell,
            id: c.id.clone(),
            kind: c.kind,
            verdict,
            reason: Some(reason),
            seconds: 0.0,
            receipt,
            reused: false,
        };
        self.done(cell, verdict, event);
    }

    /// Records a verdict, tells the listeners, and settles the dependents: a dependency
    /// that was skipped skips them, one not as expected blocks them, otherwise they come a
    /// step closer to ready.
    fn done(&mut self, cell: CellIndex, verdict: Verdict, event: Event) {
        self.state[cell.0] = State::Done(verdict);
        self.emit(&event);
        let dependents = self.dependents[cell.0].clone();
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
            } else if !verdict.as_expected() {
                let mut why = format!("needs {dep_id}, which ended {verdict}");
                if verdict == Verdict::Blocked
                    && let Some(r) = &self.finished[cell.0].reason
                {
                    why = format!("{why}: {r}");
                }
                self.finish_unplaced(d, Verdict::Blocked, why, true);
            } else if let State::Waiting(k) = self.state[d.0] {
                self.state[d.0] = State::Waiting(k - 1);
                if k == 1 {
                    self.make_ready(d);
                }
            }
        }
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
            program: None,
        }
    }

    /// For a compare cell: the reference's and the candidate's artifact file.
    fn compare_paths(&self, i: CellIndex) -> Option<(PathBuf, PathBuf)> {
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
        Some((
            side(spec.reference).join(&spec.artifact),
            side(spec.candidate).join(&spec.artifact),
        ))
    }
}

/// The worker side of a placed cell: digests (declared inputs included), reuse on
/// `--resume`, then the compare or the executor.
#[allow(clippy::too_many_arguments)]
fn run_cell(
    placement: &Placement,
    mut job: CellJob,
    kind: NodeKind,
    compare: Option<(PathBuf, PathBuf)>,
    policy: Option<crate::plan::Policy>,
    globs: &[String],
    previous: Option<PathBuf>,
    executor: &dyn Executor,
    digests: &DigestCache,
    tx: &mpsc::Sender<Msg>,
    cell: CellIndex,
) -> (NodeReceipt, bool) {
    if kind != NodeKind::Compare && !job.shell {
        job.program = digests.resolve(&job);
        if let Some(d) = job.program.as_deref().and_then(|p| digests.digest(p)) {
            job.binaries.insert(0, d);
        }
    }
    // A compare's inputs are the two files it compares: hashing them makes `--resume`
    // redo the comparison when either side produced different bits.
    if let Some((reference, candidate)) = &compare {
        job.binaries.extend(
            [reference, candidate]
                .into_iter()
                .filter_map(|p| digests.digest(p)),
        );
    }
    job.input_files = digests.declared_inputs(globs);
    job.inputs = inputs_digest(&job, policy.as_ref(), compare.as_ref());
    if let Some(path) = previous
        && let Ok(Some(old)) = read_node_receipt(&path)
        && old.verdict.is_final()
        && old.inputs == job.inputs
    {
        return (old, true);
    }
    let _ = tx.send(Msg::Started(cell, placement.clone()));
    if let (Some((reference, candidate)), Some(policy)) = (compare, policy) {
        return (compare::run(&job, &reference, &candidate, &policy), false);
    }
    let mut on_note = |note: CellNote| {
        let _ = tx.send(match note {
            CellNote::Attempt(rec) => Msg::Attempt(cell, rec),
            CellNote::Job(note) => Msg::Job(cell, note),
        });
    };
    (executor.execute(&job, &mut on_note), false)
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
        .map(|(k, v)| (k.clone(), redact_pin(k, v)))
        .collect();
    r.expect = c.expect;
    r
}

fn redact_pin(name: &str, value: &str) -> String {
    if crate::executor::env::looks_secret(name) {
        crate::executor::env::REDACTED.to_string()
    } else {
        value.to_string()
    }
}
