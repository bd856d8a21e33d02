//! The live display of a run, as a listener. On a terminal: an overall bar (done/total,
//! pass/fail counts, ETA from the previous run's durations) and a line per GPU and CPU slot
//! showing the running cell and its elapsed time (indicatif). Elsewhere (cron, CI logs): one
//! plain line per event on stderr, and a `still running` line per running cell at each
//! heartbeat the runner sends, so a log read the next morning shows a stuck cell and where
//! its stderr goes. Either way a cell that waits for a GPU another run leases says so
//! (`waiting for gpu 0: held by memra-orch pid …`). Quiet: nothing (the caller still prints
//! the final counts).
//! Cell ids and reasons are printed with their control characters escaped
//! ([`crate::words::escape::control`]): they come from manifests and gates.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};

use crate::machine::gpus::{Inventory, InventorySource};
use crate::plan::{CellId, CellIndex, Plan};
use crate::run::events::{Event, JobNote, Listener, Placement};
use crate::run::schedule::DEFAULT_ESTIMATE;
use crate::words::escape::control;
use crate::words::verdict::Verdict;

/// How the run is shown while it goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ProgressMode {
    /// Bars on a terminal, plain lines otherwise.
    Auto,
    Bars,
    Plain,
    Quiet,
}

impl ProgressMode {
    /// `Auto` decided for this process: bars when stderr is a terminal, else plain.
    pub fn resolve(self) -> ProgressMode {
        match self {
            ProgressMode::Auto if std::io::IsTerminal::is_terminal(&std::io::stderr()) => {
                ProgressMode::Bars
            }
            ProgressMode::Auto => ProgressMode::Plain,
            m => m,
        }
    }
}

/// CPU slots shown as their own line at most; more would push the GPUs off the screen.
const MAX_CPU_LINES: usize = 8;

/// The progress listener.
pub struct Progress {
    mode: ProgressMode,
    total: usize,
    done: usize,
    passed: usize,
    not_as_expected: usize,
    /// Finished cells that reported `warn` rows.
    warned: usize,
    /// Estimated seconds per cell, and the sum over cells not finished.
    estimates: Vec<f64>,
    remaining_work: f64,
    have_estimates: bool,
    lanes_per_run: usize,
    gpu_labels: Vec<String>,
    placement: HashMap<CellIndex, Placement>,
    started: Instant,
    bars: Option<Bars>,
    /// The line the Slurm executor's job notes go to in bars mode (set once bars exist).
    jobs_line: JobsLine,
}

/// Slurm jobs by their last known state, and the bar that shows the counts.
#[derive(Default)]
struct JobsLine {
    states: BTreeMap<String, String>,
    bar: Option<ProgressBar>,
}

struct Bars {
    multi: MultiProgress,
    overall: ProgressBar,
    gpu_lines: Vec<ProgressBar>,
    cpu_lines: Vec<ProgressBar>,
}

impl Progress {
    pub fn new(mode: ProgressMode, plan: &Plan, inventory: &Inventory) -> Progress {
        Progress {
            mode,
            total: plan.cells.len(),
            done: 0,
            passed: 0,
            not_as_expected: 0,
            warned: 0,
            estimates: Vec::new(),
            remaining_work: 0.0,
            have_estimates: false,
            lanes_per_run: 1,
            // Under Slurm the lanes are job slots, not devices: the cluster picks the GPUs.
            gpu_labels: inventory
                .gpus
                .iter()
                .map(|g| {
                    if inventory.source == InventorySource::Slurm {
                        format!("slot {}", g.index)
                    } else {
                        format!("gpu {}", g.index)
                    }
                })
                .collect(),
            placement: HashMap::new(),
            started: Instant::now(),
            bars: None,
            jobs_line: JobsLine::default(),
        }
    }

    /// A Slurm job changed state: in plain mode a line per change (`slurm    <cell> job
    /// <id> pending (Resources)`), with bars a line counting jobs pending, running and
    /// done; quiet shows nothing.
    fn job_changed(&mut self, id: &CellId, n: &JobNote) {
        match self.mode {
            ProgressMode::Plain => {
                let why = if n.reason.is_empty() || n.reason == "None" {
                    String::new()
                } else {
                    format!(" ({})", n.reason)
                };
                eprintln!(
                    "slurm    {} job {} {}{}",
                    control(&id.0),
                    control(&n.job_id),
                    control(&n.state),
                    control(&why)
                );
            }
            ProgressMode::Bars => {
                let l = &mut self.jobs_line;
                l.states.insert(n.job_id.clone(), n.state.clone());
                let count = |s: &str| l.states.values().filter(|v| v.as_str() == s).count();
                let (queued, pending, running) =
                    (count("submitted"), count("pending"), count("running"));
                let done = l.states.len() - queued - pending - running;
                let msg = format!(
                    "{} submitted, {pending} pending, {running} running, {done} ended",
                    l.states.len()
                );
                if let Some(bar) = &l.bar {
                    bar.set_message(msg);
                }
            }
            ProgressMode::Auto | ProgressMode::Quiet => {}
        }
    }

    /// Remaining estimated work spread over every lane; `None` without a previous run,
    /// since a guess from nothing would only mislead.
    fn eta(&self) -> Option<Duration> {
        if !self.have_estimates {
            return None;
        }
        Some(Duration::from_secs_f64(
            (self.remaining_work / self.lanes_per_run.max(1) as f64).max(0.0),
        ))
    }

    fn overall_message(&self) -> String {
        let eta = self.eta().map(|d| {
            format!(
                "  eta {}",
                humantime::format_duration(Duration::from_secs(d.as_secs()))
            )
        });
        let warned = if self.warned > 0 {
            format!("  warn {}", self.warned)
        } else {
            String::new()
        };
        format!(
            "pass {}  not as expected {}{warned}{}",
            self.passed,
            self.not_as_expected,
            eta.unwrap_or_default()
        )
    }

    fn lane(&self, p: &Placement) -> Vec<ProgressBar> {
        let Some(b) = &self.bars else {
            return Vec::new();
        };
        match p {
            Placement::Gpus(list) => list
                .iter()
                .filter_map(|&i| b.gpu_lines.get(i).cloned())
                .collect(),
            Placement::CpuSlot(s) => b.cpu_lines.get(*s).cloned().into_iter().collect(),
        }
    }

    fn where_(&self, p: &Placement) -> String {
        match p {
            Placement::Gpus(list) => {
                let ids: Vec<String> = list
                    .iter()
                    .map(|&i| self.gpu_labels.get(i).cloned().unwrap_or_default())
                    .collect();
                format!("on {}", ids.join(", "))
            }
            Placement::CpuSlot(s) => format!("on cpu slot {s}"),
        }
    }
}

fn lane_bar(multi: &MultiProgress, label: String) -> ProgressBar {
    let bar = multi.add(ProgressBar::new_spinner());
    bar.set_style(
        ProgressStyle::with_template("{prefix:>8} {spinner} {wide_msg} {elapsed:>5}")
            .expect("the lane template is valid"),
    );
    bar.set_prefix(label);
    bar.set_message("idle");
    bar.enable_steady_tick(Duration::from_millis(250));
    bar
}

impl Listener for Progress {
    // Over 150 lines: one short arm per `Event` variant, all updating the one display state;
    // split per event it would read the same with the state passed around.
    fn on_event(&mut self, event: &Event) {
        match event {
            Event::RunStarted {
                total,
                estimates,
                gpus,
                cpu_slots,
            } => {
                self.started = Instant::now();
                let known: Vec<f64> = estimates.iter().flatten().copied().collect();
                let fallback = if known.is_empty() {
                    DEFAULT_ESTIMATE
                } else {
                    known.iter().sum::<f64>() / known.len() as f64
                };
                self.estimates = estimates.iter().map(|e| e.unwrap_or(fallback)).collect();
                self.have_estimates = !known.is_empty();
                self.remaining_work = if known.is_empty() {
                    0.0
                } else {
                    self.estimates.iter().sum()
                };
                self.lanes_per_run = gpus + cpu_slots;
                match self.mode {
                    ProgressMode::Bars => {
                        let multi = MultiProgress::with_draw_target(ProgressDrawTarget::stderr());
                        let overall = multi.add(ProgressBar::new(*total as u64));
                        overall.set_style(
                            ProgressStyle::with_template(
                                "{prefix:>8} [{bar:30}] {pos}/{len} {msg}",
                            )
                            .expect("the overall template is valid")
                            .progress_chars("=> "),
                        );
                        overall.set_prefix("memra");
                        overall.set_message(self.overall_message());
                        let gpu_lines = self
                            .gpu_labels
                            .iter()
                            .map(|l| lane_bar(&multi, l.clone()))
                            .collect();
                        let cpu_lines = (0..(*cpu_slots).min(MAX_CPU_LINES))
                            .map(|s| lane_bar(&multi, format!("cpu {s}")))
                            .collect();
                        let bar = lane_bar(&multi, "slurm".to_string());
                        bar.set_message("no jobs yet");
                        self.jobs_line.bar = Some(bar);
                        self.bars = Some(Bars {
                            multi,
                            overall,
                            gpu_lines,
                            cpu_lines,
                        });
                    }
                    ProgressMode::Plain => eprintln!(
                        "memra-orch: {total} cells, {gpus} GPU{}, {cpu_slots} CPU slot{}",
                        if *gpus == 1 { "" } else { "s" },
                        if *cpu_slots == 1 { "" } else { "s" }
                    ),
                    ProgressMode::Auto | ProgressMode::Quiet => {}
                }
            }
            Event::WaitingForGpu {
                id,
                gpu,
                blocker,
                waited,
                ..
            } => {
                let id = control(&id.0);
                let line = match waited {
                    None => format!("waiting for gpu {gpu}: {blocker}; wanted by {id}"),
                    Some(w) => format!(
                        "still waiting for gpu {gpu} after {}: {blocker}; wanted by {id}",
                        humantime::format_duration(Duration::from_secs(w.as_secs()))
                    ),
                };
                match (&self.bars, self.mode) {
                    (Some(b), _) => b.overall.println(line),
                    (None, ProgressMode::Plain) => eprintln!("{line}"),
                    _ => {}
                }
            }
            Event::NodeStarted {
                cell,
                id,
                placement,
            } => {
                self.placement.insert(*cell, placement.clone());
                for bar in self.lane(placement) {
                    bar.set_message(control(&id.0).into_owned());
                    bar.reset_elapsed();
                }
                if self.mode == ProgressMode::Plain {
                    eprintln!("start    {} {}", control(&id.0), self.where_(placement));
                }
            }
            Event::AttemptFinished {
                id,
                attempt,
                rep,
                outcome,
                seconds,
                ..
            } => {
                if self.mode == ProgressMode::Plain
                    && *outcome != Verdict::Pass
                    && *outcome != Verdict::Fail
                {
                    eprintln!(
                        "attempt  {} #{attempt} (rep {rep}) ended {outcome} after {seconds:.1}s",
                        control(&id.0)
                    );
                }
            }
            Event::JobChanged { id, note, .. } => self.job_changed(id, note),
            Event::GpuQuarantined {
                id,
                gpu,
                uuid,
                fault,
                ended,
                retry,
                ..
            } => {
                let line = format!(
                    "quarantined gpu {gpu} ({}) for the rest of the run: {} during {}; {}",
                    control(uuid),
                    control(fault),
                    control(&id.0),
                    if *retry {
                        "it runs again on a healthy GPU of the same model"
                    } else if ended.as_expected() {
                        "the cell ended as expected; the GPU takes no new cells"
                    } else if *ended == Verdict::DeviceFault {
                        "no healthy GPU of the same model is left to run it again"
                    } else {
                        "the cell's failure stands"
                    }
                );
                match (&self.bars, self.mode) {
                    (Some(b), _) => b.overall.println(line),
                    (None, ProgressMode::Quiet) => {}
                    (None, _) => eprintln!("{line}"),
                }
            }
            Event::StillRunning {
                id,
                running_for,
                stderr_log,
                ..
            } => {
                // Bars already show each lane's elapsed time; only plain logs need the line.
                if self.mode == ProgressMode::Plain {
                    eprintln!(
                        "still running {}: {} (log: {})",
                        humantime::format_duration(Duration::from_secs(running_for.as_secs())),
                        control(&id.0),
                        stderr_log.display()
                    );
                }
            }
            Event::NodeFinished {
                cell,
                id,
                verdict,
                reason,
                seconds,
                carried,
                receipt,
                ..
            } => {
                self.done += 1;
                if *verdict == Verdict::Pass {
                    self.passed += 1;
                } else if !verdict.as_expected() {
                    self.not_as_expected += 1;
                }
                let warning = receipt.as_ref().and_then(|r| r.warning_line());
                if warning.is_some() {
                    self.warned += 1;
                }
                if let Some(e) = self.estimates.get(cell.0) {
                    self.remaining_work = (self.remaining_work - e).max(0.0);
                }
                if let Some(p) = self.placement.remove(cell) {
                    for bar in self.lane(&p) {
                        bar.set_message("idle");
                    }
                }
                let msg = self.overall_message();
                if let Some(b) = &self.bars {
                    b.overall.set_position(self.done as u64);
                    b.overall.set_message(msg);
                    if !verdict.as_expected() {
                        let why = reason
                            .as_deref()
                            .map(|r| format!(": {}", control(r)))
                            .unwrap_or_default();
                        b.overall.println(format!(
                            "{:>8} {}{why}",
                            verdict.as_str().to_uppercase(),
                            control(&id.0)
                        ));
                    } else if let Some(w) = &warning {
                        b.overall.println(format!(
                            "{:>8} {}: {}",
                            "WARN",
                            control(&id.0),
                            control(w)
                        ));
                    }
                }
                if self.mode == ProgressMode::Plain {
                    let w = self.total.to_string().len();
                    let why = reason
                        .as_deref()
                        .map(|r| format!("  ({})", control(r)))
                        .unwrap_or_default();
                    let carried = carried
                        .as_ref()
                        .map(|c| format!("  [carried from {}]", c.label()))
                        .unwrap_or_default();
                    let warned = warning
                        .as_deref()
                        .map(|w| format!("  [{}]", control(w)))
                        .unwrap_or_default();
                    let shown = match (verdict, &warning) {
                        (Verdict::Pass, Some(_)) => "pass+warn",
                        _ => verdict.as_str(),
                    };
                    eprintln!(
                        "[{:>w$}/{}] {:<9} {:>7.2}s  {}{why}{warned}{carried}",
                        self.done,
                        self.total,
                        shown,
                        seconds,
                        control(&id.0)
                    );
                }
            }
            Event::RunFinished { .. } => {
                if let Some(bar) = self.jobs_line.bar.take() {
                    bar.finish_and_clear();
                }
                if let Some(b) = self.bars.take() {
                    for bar in b.gpu_lines.iter().chain(&b.cpu_lines) {
                        bar.finish_and_clear();
                    }
                    b.overall.finish_and_clear();
                    let _ = b.multi.clear();
                }
            }
        }
    }
}
