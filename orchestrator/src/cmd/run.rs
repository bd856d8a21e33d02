//! `memra-orch run`: the wiring around the run loop. It loads the plan, chooses the
//! executor and its GPU slots, resolves the commit, takes the run lock of the manifest at
//! that commit (waiting for it with `--wait-lock`), picks the earlier run to carry receipts
//! from (`--resume`, `--filter`, `--rerun-failed`), makes the new run's own folder, installs
//! the signal handlers, builds the [`RunOptions`] and the listeners (receipt writer,
//! progress display, and the metrics file and JSON event stream when asked for), runs
//! [`crate::run::execute`], prints the summary table (on stderr when stdout carries the
//! event stream) and writes the metrics file's and the stream's last word once the exit code
//! is known.
//! Its errors are messages with an exit code: the typed errors of the layers below
//! (including [`SlurmOptionsError`], the one this file builds) end here as text.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use crate::cmd::cli::{ExecutorKind, RunArgs};
use crate::machine::gpus::Inventory;
use crate::machine::gpus::InventorySource;
use crate::machine::health::Monitor;
use crate::machine::lease::{self, GpuLocks, LockDir};
use crate::plan::Plan;
use crate::plan::fingerprint::Fingerprint;
use crate::plan::require::GpuRequirement;
use crate::receipt::NodeIndexEntry;
use crate::receipt::commit::CommitId;
use crate::receipt::error::ReceiptErrorKind;
use crate::receipt::resolve::{self, FoundRun};
use crate::receipt::tree::{self, RunLock, Tree};
use crate::receipt::{Carried, RunReceipt};
use crate::report::json_events::{EventFormat, JsonEvents};
use crate::report::metrics::MetricsFile;
use crate::report::progress::{Progress, ProgressMode};
use crate::report::writer::ReceiptWriter;
use crate::run::events::Listener;
use crate::run::executor::local::{DEFAULT_GRACE, LocalExecutor};
use crate::run::executor::slurm::{Resources, SlurmExecutor, SlurmOptions};
use crate::run::executor::{Executor, SlurmError};
use crate::run::{CarrySource, RunOptions, execute};
use crate::words::diskfull::DiskFull;
use crate::words::exit::ExitCode;

/// The `run` subcommand.
pub fn command(args: &RunArgs) -> ExitCode {
    match command_inner(args) {
        Ok(code) => code,
        Err((code, message)) => {
            eprintln!("memra-orch run: {message}");
            code
        }
    }
}

fn command_inner(args: &RunArgs) -> Result<ExitCode, Refusal> {
    let (session, monitor) = RunSession::prepare(args)?;
    let lock = acquire_lock(&session.manifest_dir, args.wait_lock)?;
    let Some(carry) = session.carry_source()? else {
        return Ok(ExitCode::Ok);
    };
    let started = session.start(carry, monitor)?;
    let filed = started.run_and_file(&session);
    // The run is filed: its manifest folder is free for others (and for retention).
    drop(lock);
    session.after_filed(&filed.tree);
    Ok(filed.code)
    // `filed` (the display, the listeners and the options) drops here, as it always did.
}

/// Why a run did not start, or what it could not do: the exit code and the message.
type Refusal = (ExitCode, String);

fn usage(message: String) -> Refusal {
    (ExitCode::Usage, message)
}

fn internal(message: String) -> Refusal {
    (ExitCode::Internal, message)
}

/// One `memra-orch run`, from its arguments to a filed run, as steps in order:
/// [`RunSession::prepare`] (everything that can refuse the run before it touches the receipt
/// tree), the run lock ([`acquire_lock`]), [`RunSession::carry_source`] (the earlier run to
/// carry receipts from, or nothing to rerun), [`RunSession::start`] (the run's own folder,
/// options, executor and listeners), [`Started::run_and_file`] (the loop, the summary, the
/// exit code and the packed tree), then, with the lock released,
/// [`RunSession::after_filed`] (notify and retention).
struct RunSession<'a> {
    args: &'a RunArgs,
    /// With the event stream on, stdout carries its lines and nothing else.
    json_events: bool,
    plan: Plan,
    filters: Vec<String>,
    selected: Option<Vec<bool>>,
    inventory: Inventory,
    /// The GPUs `--exclude-gpu` took out, for the run's header.
    excluded: Vec<String>,
    require: Option<GpuRequirement>,
    receipts: PathBuf,
    commit: CommitId,
    heartbeat: Duration,
    fingerprints: Vec<Fingerprint>,
    manifest_dir: PathBuf,
}

/// What [`RunSession::carry_source`] found: the earlier run's durations, the run to carry
/// from, and the cells selected once `--rerun-failed` has read it.
struct Carry {
    previous: std::collections::HashMap<String, f64>,
    source: Option<FoundRun>,
    carry: Option<Arc<CarrySource>>,
    selected: Option<Vec<bool>>,
}

/// A run whose folder exists, with everything the loop and the listeners need.
struct Started {
    tree: Tree,
    opts: RunOptions,
    executor: Arc<dyn Executor>,
    mode: ProgressMode,
    display: Progress,
    writer: ReceiptWriter,
    metrics: Option<MetricsFile>,
    stream: Option<JsonEvents<std::io::Stdout>>,
    disk_full: DiskFull,
}

/// What a filed run left: its tree and its exit code.
struct Filed {
    tree: Tree,
    code: ExitCode,
    /// The run's options (its GPU lease files), the display and the listeners live until the
    /// command returns, after notify and retention, as the run's own state always has.
    _held: Held,
}

struct Held {
    _opts: RunOptions,
    _display: Progress,
    _writer: ReceiptWriter,
    _metrics: Option<MetricsFile>,
    _stream: Option<JsonEvents<std::io::Stdout>>,
}

impl<'a> RunSession<'a> {
    /// Loads the plan and checks everything that can refuse the run before anything is
    /// written: the flags, the machine against `[require]`, the commit, the GPU health
    /// monitor (returned beside the session, for the executor) and the fingerprints.
    fn prepare(args: &'a RunArgs) -> Result<(RunSession<'a>, Monitor), Refusal> {
        if let Some(path) = &args.metrics_file {
            crate::report::metrics::check_path(path).map_err(|e| usage(e.to_string()))?;
        }
        let json_events = args.events == Some(EventFormat::Json);
        let plan = crate::load::load_plan_with_vars(&args.manifest, &args.vars)
            .map_err(|d| usage(d.to_string()))?;
        let filters = crate::plan::with_excludes(&args.filters, &args.excludes);
        let selected = if filters.is_empty() {
            None
        } else {
            Some(crate::plan::select(&plan, &filters).map_err(|e| usage(e.to_string()))?)
        };
        if args.executor == ExecutorKind::Local {
            let given: Vec<&str> = [
                ("--partition", args.partition.is_some()),
                ("--account", args.account.is_some()),
                ("--slurm-arg", !args.slurm_args.is_empty()),
            ]
            .into_iter()
            .filter_map(|(flag, set)| set.then_some(flag))
            .collect();
            if !given.is_empty() {
                return Err(usage(format!(
                    "{} only apply to Slurm jobs; add --executor slurm or leave them out",
                    given.join(", ")
                )));
            }
        }
        let mut inventory = match args.executor {
            ExecutorKind::Local => crate::machine::gpus::detect(&args.gpus),
            ExecutorKind::Slurm => slurm_slots(args).map_err(|e| usage(e.to_string()))?,
        };
        let excluded =
            crate::machine::gpus::exclude(&mut inventory, &args.exclude_gpu).map_err(usage)?;
        let fake: Vec<u32> = match inventory.source {
            InventorySource::Fake => inventory.gpus.iter().map(|g| g.index).collect(),
            _ => Vec::new(),
        };
        if let Some(note) = &inventory.note {
            eprintln!("memra-orch: {note}");
        }
        let require = GpuRequirement::effective(&plan, args.require_gpus);
        if let Some(r) = &require {
            r.check(&inventory)
                .map_err(|e| (ExitCode::RequirementUnmet, e.to_string()))?;
        }
        let receipts = match &args.receipts {
            Some(r) if r.is_absolute() => r.clone(),
            Some(r) => std::env::current_dir()
                .map_err(|e| internal(e.to_string()))?
                .join(r),
            None => plan.root.join("receipts"),
        };
        // memra-orch's own output is no change to the code under test.
        let own = crate::receipt::own_outputs::all(
            &receipts,
            &args
                .metrics_file
                .iter()
                .map(PathBuf::as_path)
                .collect::<Vec<_>>(),
        );
        let commit = crate::receipt::commit::resolve(&plan.root, args.commit.as_deref(), &own)
            .map_err(|e| usage(e.to_string()))?;
        if commit.dirty && args.commit.is_none() {
            eprintln!("memra-orch: {}", dirty_note(&plan.root, &commit.id, &own));
        }
        let heartbeat = heartbeat_interval().map_err(usage)?;
        let monitor = Monitor::new().map_err(usage)?;
        monitor.check_planted(&fake).map_err(usage)?;
        // Taken before anything runs: a run that cannot tell which engine it tests refuses.
        let fingerprints = crate::plan::fingerprint::take_all(&plan)
            .map_err(|e| (ExitCode::RequirementUnmet, e.to_string()))?;
        let manifest_dir = tree::manifest_dir(&receipts, &commit.id, &plan.name);
        let session = RunSession {
            args,
            json_events,
            plan,
            filters,
            selected,
            inventory,
            excluded,
            require,
            receipts,
            commit,
            heartbeat,
            fingerprints,
            manifest_dir,
        };
        Ok((session, monitor))
    }

    /// With the run lock held: refuses a manifest whose `name` another manifest already
    /// files runs under, reads the previous run's durations, and picks the run whose
    /// receipts this one may carry (the newest of this manifest at this commit, complete or
    /// not: a killed run is what `--resume` completes). `None`: `--rerun-failed` found
    /// nothing to rerun, which it has said.
    fn carry_source(&self) -> Result<Option<Carry>, Refusal> {
        let (args, plan) = (self.args, &self.plan);
        // Two manifest files with one `name` would file their runs in one folder and read
        // each other's receipts as their own earlier runs.
        let earlier = resolve::runs_in_manifest_dir(&self.manifest_dir);
        crate::load::name_clash::check_against(earlier.first(), &plan.name, &plan.manifest.path)
            .map_err(|e| usage(e.to_string()))?;
        let previous = resolve::previous_run(&self.receipts, &plan.name)
            .map(|r| resolve::durations(&r))
            .unwrap_or_default();
        let mut selected = self.selected.clone();
        let source = (args.resume || selected.is_some() || args.rerun_failed)
            .then(|| earlier.into_iter().next())
            .flatten();
        if args.rerun_failed {
            let Some(src) = &source else {
                return Err(usage(format!(
                    "--rerun-failed: no earlier run of {} at commit {} under {}; run the \
                     manifest first (or name the cells with --filter)",
                    plan.name,
                    self.commit.id,
                    self.receipts.display()
                )));
            };
            match rerun_selection(plan, src, selected.as_deref()) {
                Some(s) => selected = Some(s),
                None => {
                    let note = format!(
                        "memra-orch run: nothing to rerun: every cell of run {} ({}) was as \
                         expected{}",
                        src.id_label(),
                        src.dir.display(),
                        if self.filters.is_empty() {
                            ""
                        } else {
                            " among the filtered cells"
                        }
                    );
                    if self.json_events {
                        eprintln!("{note}");
                    } else {
                        println!("{note}");
                    }
                    return Ok(None);
                }
            }
        }
        let carry = source.as_ref().map(carry_from);
        Ok(Some(Carry {
            previous,
            source,
            carry,
            selected,
        }))
    }

    /// Installs the signal handlers and makes the run's own folder (last, once nothing
    /// else can refuse the run, so a refused run leaves no empty folder behind), then
    /// builds the run's options, the GPU leases, the executor and the listeners.
    fn start(&self, carry: Carry, monitor: Monitor) -> Result<Started, Refusal> {
        let (args, plan, inventory) = (self.args, &self.plan, &self.inventory);
        let interrupt = Arc::new(AtomicBool::new(false));
        for sig in crate::run::executor::process::cancel_signals() {
            signal_hook::flag::register(sig, Arc::clone(&interrupt))
                .map_err(|e| internal(format!("cannot install the signal handler: {e}")))?;
        }
        let jobs = args
            .jobs
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
            .max(1);
        let grace = args.grace.unwrap_or(DEFAULT_GRACE);
        let (tree, run_id) = Tree::create(&self.manifest_dir).map_err(|e| {
            let code = if e.is_disk_full() {
                ExitCode::DiskFull
            } else {
                ExitCode::Internal
            };
            (code, e.to_string())
        })?;
        let disk_full = DiskFull::new();
        let gpu_locks = self.gpu_locks(&tree)?;
        let opts = RunOptions {
            code: self
                .commit
                .code
                .clone()
                .unwrap_or_else(|| format!("unknown:{}", self.commit.id)),
            fingerprints: self.fingerprints.clone(),
            tree: tree.clone(),
            jobs,
            fail_fast: args.fail_fast,
            selected: carry.selected,
            resume: args.resume,
            carry: carry.carry,
            previous: carry.previous,
            interrupt,
            require_gpus: self.require.as_ref().map(|r| r.gpus),
            heartbeat: self.heartbeat,
            gpu_locks,
            disk_full: disk_full.clone(),
        };
        let mut header = RunReceipt::begin(
            plan,
            &self.commit,
            inventory,
            jobs,
            &self.filters,
            args.resume,
        );
        header.fingerprints = self.fingerprints.clone();
        header.run_id = Some(run_id);
        header.rerun_failed = args.rerun_failed;
        header.excluded_gpus = self.excluded.clone();
        header.vars = args.vars.iter().cloned().collect();
        header.carried_from = carry.source.as_ref().map(|r| r.id_label().to_string());
        let mode = args.progress.resolve();
        let display = Progress::new(mode, plan, inventory);
        let executor = self.executor(grace, monitor)?;
        let pairs = plan
            .cells
            .iter()
            .filter_map(|c| c.compare.as_ref())
            .map(|c| (c.reference.0, c.candidate.0))
            .collect();
        if let Some(p) = &args.metrics_file {
            // Remembered so that the next run's dirty check leaves it out; a failure only
            // means it counts as a change.
            let _ = crate::receipt::own_outputs::record(&self.receipts, p);
        }
        let metrics = args
            .metrics_file
            .as_ref()
            .map(|p| MetricsFile::new(p.clone(), header.clone()));
        let stream = self.json_events.then(|| {
            let gpu_index = inventory.gpus.iter().map(|g| g.index).collect();
            JsonEvents::new(std::io::stdout(), tree.clone(), header.clone(), gpu_index)
        });
        let writer = ReceiptWriter::new(tree.clone(), header, plan.cells.len())
            .with_pairs(pairs)
            .with_attest(plan.attest.clone())
            .with_disk_full(disk_full.clone());
        Ok(Started {
            tree,
            opts,
            executor,
            mode,
            display,
            writer,
            metrics,
            stream,
            disk_full,
        })
    }

    /// The machine-wide leases of the inventory's GPUs for a local run; a run without GPUs,
    /// or one whose jobs Slurm places, takes none.
    fn gpu_locks(&self, tree: &Tree) -> Result<Option<Arc<GpuLocks>>, Refusal> {
        let inventory = &self.inventory;
        match self.args.executor {
            ExecutorKind::Local if !inventory.gpus.is_empty() => {
                let locks = GpuLocks::open(
                    &LockDir::from_env(),
                    &inventory.gpus,
                    lease::Run {
                        manifest: self.plan.name.clone(),
                        tree: tree.dir.clone(),
                    },
                )
                .map_err(|e| usage(e.to_string()))?;
                for (i, line) in locks.by_name_only() {
                    eprintln!("memra-orch: gpu {}: {line}", inventory.gpus[i].index);
                }
                Ok(Some(Arc::new(locks)))
            }
            // A run without GPUs has nothing to lease.
            ExecutorKind::Local => Ok(None),
            // Slurm jobs take no local leases: their GPU slots name no device of this host.
            // Slurm picks the GPUs on whichever node a job lands on and keeps jobs apart by
            // its own gres accounting, which every other user of the cluster goes through too.
            ExecutorKind::Slurm => Ok(None),
        }
    }

    /// The executor `--executor` names: local (every attempt on a GPU read before and
    /// after by the health monitor, `crate::machine::health`) or Slurm.
    fn executor(&self, grace: Duration, monitor: Monitor) -> Result<Arc<dyn Executor>, Refusal> {
        Ok(match self.args.executor {
            ExecutorKind::Local => {
                let local = LocalExecutor::new(grace, std::env::temp_dir());
                Arc::new(match self.inventory.source {
                    _ if self.inventory.gpus.is_empty() => local,
                    InventorySource::Nvml => local.with_health(Arc::new(monitor.with_nvml())),
                    _ => local.with_health(Arc::new(monitor)),
                })
            }
            ExecutorKind::Slurm => Arc::new(SlurmExecutor::new(
                slurm_options(
                    self.args,
                    &self.plan,
                    &self.receipts,
                    &self.commit.id,
                    grace,
                )
                .map_err(|e| internal(e.to_string()))?,
            )),
        })
    }

    /// With the lock released: the notify command (after the run is filed, so its summary
    /// reads it like any other; never the exit code) and the manifest's retention.
    fn after_filed(&self, tree: &Tree) {
        let (args, plan) = (self.args, &self.plan);
        if plan.notify.is_some() && args.no_notify {
            eprintln!("memra-orch run: notify: skipped (--no-notify)");
        }
        if let Some(n) = plan.notify.as_ref().filter(|_| !args.no_notify) {
            let said = crate::report::notify::after_run(
                n,
                &plan.root,
                &self.receipts,
                &tree.dir,
                &plan.redact,
            );
            match said {
                Ok(line) | Err(line) => eprintln!("memra-orch run: {line}"),
            }
        }
        if let Some(r) = plan.retention.as_ref().filter(|_| !args.no_retention) {
            for line in crate::cmd::gc::apply_retention(&self.receipts, &plan.name, r, &tree.dir) {
                eprintln!("memra-orch run: {line}");
            }
        }
    }
}

/// The carry source of an earlier run: its index by cell id, completed from the receipts
/// its cells wrote when the run was killed before it rewrote run.json.
fn carry_from(r: &FoundRun) -> Arc<CarrySource> {
    let mut entries: std::collections::HashMap<String, NodeIndexEntry> = r
        .run
        .nodes
        .iter()
        .map(|e| (e.id.clone(), e.clone()))
        .collect();
    if !r.complete() {
        // A run killed outright (SIGKILL, a lost machine) never rewrote its run.json: the
        // receipts its cells wrote as they finished are its index.
        for e in crate::receipt::load::written_entries(&r.dir) {
            entries.entry(e.id.clone()).or_insert(e);
        }
    }
    Arc::new(CarrySource {
        tree: Tree { dir: r.dir.clone() },
        stamp: Carried::from_run(r.id.as_deref()),
        entries,
    })
}

impl Started {
    /// Runs the loop with the listeners, then files the run: the summary (on stderr when
    /// stdout carries the event stream), the exit code, the history index, the metrics
    /// file's and the stream's last word, and the packed tree.
    fn run_and_file(self, session: &RunSession) -> Filed {
        let Started {
            tree,
            opts,
            executor,
            mode,
            mut display,
            mut writer,
            mut metrics,
            mut stream,
            disk_full,
        } = self;
        crate::run::executor::supervise::adopt_orphans();
        // The executor goes with the loop: when it returns, the executor's watchdog stops and
        // the attempts' TMPDIR root is removed, before the orphans are reaped.
        let mut outcome = {
            let mut listeners: Vec<&mut dyn Listener> = vec![&mut writer, &mut display];
            if let Some(m) = &mut metrics {
                listeners.push(m);
            }
            if let Some(s) = &mut stream {
                listeners.push(s);
            }
            execute(
                &session.plan,
                &session.inventory,
                executor,
                &opts,
                &mut listeners,
            )
        };
        crate::run::executor::supervise::reap_orphans();
        let written = writer.finish();
        // The writer may have found the disk full after the loop ended (the last files).
        if outcome.disk_full.is_none() {
            outcome.disk_full = disk_full.get().map(Path::to_path_buf);
        }
        let summary = if mode == ProgressMode::Quiet {
            crate::report::summary::footer(&outcome, &tree)
        } else {
            crate::report::summary::table(writer.receipts(), &outcome, &tree)
        };
        if session.json_events {
            eprint!("{summary}");
        } else {
            print!("{summary}");
        }
        let mut code = outcome.exit_code();
        if let Some(at) = &outcome.disk_full {
            // Not a bug of memra-orch and not a gate failure: its own exit code, and what
            // was lost is in run.json and on stderr.
            eprintln!(
                "memra-orch run: the disk is full at {}: the run stopped starting cells and \
                 finalized {}; free space and run again (`memra-orch gc --keep N` deletes old \
                 runs)",
                at.display(),
                tree.run_json().display()
            );
            if let Err(e) = &written {
                eprintln!("memra-orch run: {e}");
            }
        } else if let Err(e) = &written {
            eprintln!("memra-orch run: {e}");
            code = ExitCode::Internal;
        } else {
            record_history(&tree, &writer);
            if let Some(note) = outcome.lacked_resources_note() {
                eprintln!("memra-orch run: {note}");
            }
        }
        // A metrics file asked for and not written is memra-orch's own I/O failure; a run
        // that already failed keeps its more telling code.
        if let Some(m) = &metrics
            && let Err(e) = m.finish_run(writer.run(), code)
        {
            eprintln!("memra-orch run: {e}");
            if code == ExitCode::Ok {
                code = ExitCode::Internal;
            }
        }
        if let Some(s) = &mut stream {
            s.finish_run(writer.run(), code);
        }
        // Packed while the run lock is held: nothing else writes the tree. A run that was
        // interrupted or could not file its receipts stays a tree, as does one packing
        // refuses.
        let args = session.args;
        if !args.no_pack && written.is_ok() && outcome.disk_full.is_none() && !outcome.interrupted {
            match crate::receipt::pack::pack(&tree.dir) {
                Ok(Some(p)) if p.left.is_some() => {
                    eprintln!(
                        "memra-orch run: packed into {}, but {}",
                        tree.dir.join(crate::gate::packed::PACK).display(),
                        p.left.unwrap_or_default()
                    );
                }
                Ok(_) => {}
                Err(e) => eprintln!("memra-orch run: not packed: {e}"),
            }
        }
        Filed {
            tree,
            code,
            _held: Held {
                _opts: opts,
                _display: display,
                _writer: writer,
                _metrics: metrics,
                _stream: stream,
            },
        }
    }
}

/// Files the finished run in its manifest's history index, from what the writer holds in
/// memory (no receipt is read back). The index is a cache: a failure here only costs the
/// next `history` a read of this tree, so it is not an error of the run.
fn record_history(tree: &Tree, writer: &ReceiptWriter) {
    use crate::history::{build, index};
    let receipts = tree.receipts();
    let run = writer.run();
    let by_id: std::collections::BTreeMap<String, build::HistReceipt> = writer
        .receipts()
        .iter()
        .flatten()
        .map(|r| (r.id.clone(), build::HistReceipt::of(r)))
        .collect();
    if let Some(record) = build::of_finished(&receipts, &tree.dir, run, &by_id) {
        let _ = index::append(&receipts, &run.name, &record);
    }
}

/// The cells `--rerun-failed` selects: those whose verdict in `source` was not as expected
/// (within `filtered` when `--filter`/`--exclude` narrow it), plus what they need. `None`
/// when there is nothing to rerun.
fn rerun_selection(plan: &Plan, source: &FoundRun, filtered: Option<&[bool]>) -> Option<Vec<bool>> {
    let failed: std::collections::HashSet<&str> = source
        .run
        .nodes
        .iter()
        .filter(|e| !e.verdict.as_expected())
        .map(|e| e.id.as_str())
        .collect();
    let chosen: Vec<bool> = plan
        .cells
        .iter()
        .enumerate()
        .map(|(i, c)| failed.contains(c.id.0.as_str()) && filtered.is_none_or(|f| f[i]))
        .collect();
    if !chosen.iter().any(|&c| c) {
        return None;
    }
    Some(crate::plan::with_needs(plan, chosen))
}

/// Dirty paths named in the note; the rest are counted.
const DIRTY_PATHS_SHOWN: usize = 10;

/// Why the run is filed under `<sha>-dirty`: the paths `git status --porcelain` lists, so a
/// nightly that forgot a scratch file says which one instead of only changing folder name.
fn dirty_note(root: &Path, id: &str, own: &[PathBuf]) -> String {
    let paths = crate::receipt::commit::dirty_paths(root, own);
    let mut note =
        format!("the work tree has uncommitted changes, so the run is filed under {id}:");
    for p in paths.iter().take(DIRTY_PATHS_SHOWN) {
        note.push_str("\n  ");
        note.push_str(p);
    }
    if paths.len() > DIRTY_PATHS_SHOWN {
        note.push_str(&format!("\n  and {} more", paths.len() - DIRTY_PATHS_SHOWN));
    }
    note
}

/// The environment variable that sets the heartbeat interval of plain progress (a
/// humantime duration; `0s` turns it off). A knob for tests and operators, read once here.
pub const HEARTBEAT_ENV: &str = "MEMRA_ORCH_HEARTBEAT";

fn heartbeat_interval() -> Result<Duration, String> {
    match std::env::var(HEARTBEAT_ENV) {
        Ok(v) => humantime::parse_duration(v.trim())
            .map_err(|e| format!("{HEARTBEAT_ENV}={v:?}: {e}; give a duration such as 30s or 5m")),
        Err(_) => Ok(crate::run::DEFAULT_HEARTBEAT),
    }
}

/// How often a run waiting with `--wait-lock` looks at the lock again.
const LOCK_POLL: Duration = Duration::from_millis(200);

/// How long a run waits, with or without `--wait-lock`, for a lock that `gc` holds (or whose
/// holder has not yet written its name): gc holds it only while it moves a run aside (a
/// rename), so a nightly started by cron while a gc runs is not refused for it.
const GC_LOCK_WAIT: Duration = Duration::from_secs(60);

/// Takes the run lock of a manifest folder. Held by another run: with `wait`, polls until it
/// is free or `wait` has passed (saying once whom it waits for); then, or at once without
/// `wait`, fails with [`ExitCode::Locked`] so cron can tell "try later" from a broken
/// manifest. Held by gc, or by a holder not yet named: waits for it (up to [`GC_LOCK_WAIT`],
/// or `wait` when longer).
fn acquire_lock(manifest_dir: &Path, wait: Option<Duration>) -> Result<RunLock, Refusal> {
    let start = std::time::Instant::now();
    let mut said = false;
    loop {
        match RunLock::acquire(manifest_dir) {
            Ok(lock) => return Ok(lock),
            Err(e) => {
                let ReceiptErrorKind::Locked(holder) = e.kind else {
                    return Err((ExitCode::Usage, e.to_string()));
                };
                let limit = match wait {
                    Some(w) if holder.momentary() => w.max(GC_LOCK_WAIT),
                    Some(w) => w,
                    None if holder.momentary() => GC_LOCK_WAIT,
                    None => Duration::ZERO,
                };
                if start.elapsed() >= limit {
                    let message = if limit.is_zero() {
                        e.to_string()
                    } else {
                        format!(
                            "still locked after waiting {}: {e}",
                            humantime::format_duration(limit)
                        )
                    };
                    return Err((ExitCode::Locked, message));
                }
                // gc's moment is not worth a line; a run's wait is.
                if !said && !holder.momentary() {
                    eprintln!(
                        "memra-orch: waiting for the lock of {}: held by memra-orch{}",
                        manifest_dir.display(),
                        holder.pid.map(|p| format!(" pid {p}")).unwrap_or_default()
                    );
                    said = true;
                }
                std::thread::sleep(if holder.momentary() {
                    Duration::from_millis(20)
                } else {
                    LOCK_POLL
                });
            }
        }
    }
}

/// For `--executor slurm`: the GPU slots the run may keep busy at once, one per GPU the
/// partition has (`--gpus fake:N` sets N by hand). Slurm chooses the real devices; the
/// slots only bound how many jobs wait in its queue and rule out cells no node could hold.
fn slurm_slots(args: &RunArgs) -> Result<Inventory, SlurmError> {
    let n = match args.gpus {
        crate::machine::gpus::GpuSpec::Fake(n) => n,
        crate::machine::gpus::GpuSpec::None => 0,
        _ => crate::run::executor::slurm::cluster_gpus(args.partition.as_deref())?,
    };
    Ok(Inventory::slurm_slots(n))
}

/// Why the Slurm executor's settings could not be built (before any job is submitted).
#[derive(Debug, thiserror::Error)]
pub enum SlurmOptionsError {
    #[error(
        "cannot find the memra-orch binary for the Slurm jobs: {0}; run memra-orch by its full path"
    )]
    CurrentExe(std::io::Error),
    #[error(
        "{}: cannot clear old job files: {error}; remove the folder by hand",
        spool.display()
    )]
    ClearSpool {
        spool: PathBuf,
        error: std::io::Error,
    },
}

/// The Slurm executor's settings: job files in `<receipts>/.slurm/<commit>/<manifest>/`,
/// next to (not inside) the receipt tree, so the tree has the shape of a local run's;
/// cleared at the start of a run unless it resumes.
fn slurm_options(
    args: &RunArgs,
    plan: &Plan,
    receipts: &Path,
    commit: &str,
    grace: Duration,
) -> Result<SlurmOptions, SlurmOptionsError> {
    let exe = std::env::current_exe().map_err(SlurmOptionsError::CurrentExe)?;
    let spool = receipts.join(".slurm").join(commit).join(&plan.name);
    // `--resume` completes the earlier run, so its journal of jobs grows instead.
    if spool.exists()
        && !args.resume
        && let Err(error) = std::fs::remove_dir_all(&spool)
    {
        return Err(SlurmOptionsError::ClearSpool { spool, error });
    }
    Ok(SlurmOptions {
        partition: args.partition.clone(),
        account: args.account.clone(),
        extra_args: args.slurm_args.clone(),
        spool,
        exe,
        grace,
        job_name: format!("memra:{}", plan.name),
        poll: Duration::from_millis(250),
        resources: plan
            .cells
            .iter()
            .map(|c| {
                (
                    c.id.0.clone(),
                    Resources {
                        cpus: c.cpus,
                        memory: c.memory,
                    },
                )
            })
            .collect(),
    })
}
