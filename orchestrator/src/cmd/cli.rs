//! The command line's shape: clap types only. Parsing validates the arguments and nothing
//! more; the `cmd` module turns them into the library's options and runs the subcommand. The
//! value enums a library module owns (`ProgressMode`, `ColorMode`, the output formats) are
//! re-used here as they are, so this module names no other part of the library.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::diff::render::{ColorMode, DiffFormat};
use crate::history::render::HistoryFormat;
use crate::load::render::PlanFormat;
use crate::machine::gpus::{GpuSpec, GpusFormat};
use crate::report::json_events::EventFormat;
use crate::report::morning::SummaryFormat;
use crate::report::progress::ProgressMode;
use crate::words::exit::EXIT_CODES_HELP;

#[derive(Debug, Parser)]
#[command(name = "memra-orch", version, about = "Declarative gate orchestrator for numeric exactness batteries", after_help = EXIT_CODES_HELP)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run a manifest: expand it, schedule its cells across GPUs and CPU slots, write a receipt tree.
    #[command(after_help = EXIT_CODES_HELP)]
    Run(RunArgs),
    /// Print the expanded plan of a manifest (cells, pins, dependencies) without running anything.
    #[command(after_help = EXIT_CODES_HELP)]
    Plan(PlanArgs),
    /// Check manifests; every problem is reported at once with file:line:column.
    #[command(after_help = EXIT_CODES_HELP)]
    Validate(ValidateArgs),
    /// List the GPUs a run would use (NVML, bounded by CUDA_VISIBLE_DEVICES).
    #[command(after_help = EXIT_CODES_HELP)]
    Gpus(GpusArgs),
    /// Compare two receipt trees: regressions, fixes, bits moved, metric drift, new and
    /// removed nodes, environment changes (docs/diff.md). Exit 1 when anything regressed.
    #[command(after_help = DIFF_HELP)]
    Diff(DiffArgs),
    /// Show one run (every node, problems first) or one node of it (attempts, checks,
    /// doors, artifacts, logs).
    #[command(after_help = EXIT_CODES_HELP)]
    Show(ShowArgs),
    /// List the runs under the receipts folder, newest first, with verdict counts.
    #[command(after_help = EXIT_CODES_HELP)]
    Ls(LsArgs),
    /// The timeline of each cell across the runs of a manifest, oldest to newest: verdict,
    /// inputs changed, bits moved, metrics, duration (docs/diff.md).
    #[command(after_help = EXIT_CODES_HELP)]
    History(HistoryArgs),
    /// Delete old runs from the receipts folder: all but the newest N of each manifest,
    /// those older than an age, the oldest until the rest fit a size; never a manifest's
    /// newest or last green run, nor what a kept run carries from (docs/notify.md).
    #[command(after_help = EXIT_CODES_HELP)]
    Gc(GcArgs),
    /// Write a static HTML report of a manifest's history (docs/report.md): a matrix of
    /// cells × runs, a page per cell (history, metric plots, last failure, doors, log
    /// links) and a page per run.
    #[command(after_help = EXIT_CODES_HELP)]
    Report(ReportArgs),
    /// The morning message: one run (default: the newest finished one) against the run
    /// before it, the last green run or a run named, in at most 15 lines that fit a chat
    /// message (docs/notify.md). Exit 1 when the night is not green.
    #[command(after_help = EXIT_CODES_HELP)]
    Summary(SummaryArgs),
    /// Find the first commit between a good and a bad one at which a cell stopped being as
    /// expected, or (--bits) its artifacts moved: each candidate run in a worktree of its
    /// own, its receipts filed under its commit (docs/bisect.md).
    #[command(after_help = BISECT_HELP)]
    Bisect(BisectArgs),
    /// Run one cell from a job file and write its receipt: the entry point a cluster
    /// executor's batch script calls on the compute node.
    #[command(hide = true)]
    ExecNode(ExecNodeArgs),
}

#[derive(Debug, Args)]
pub struct ExecNodeArgs {
    /// A JSON job file (`executor::CellJob`), written outside the node's receipt folder.
    pub job: PathBuf,
    /// Time between SIGTERM and SIGKILL when the cell times out or the job is cancelled.
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
    pub grace: Option<std::time::Duration>,
    /// Take the cell's GPUs from this process's CUDA_VISIBLE_DEVICES (set by the cluster
    /// scheduler) instead of the job file.
    #[arg(long)]
    pub gpus_from_env: bool,
    /// Where to write the receipt (default: `receipt.json` in the job's node folder). The
    /// Slurm executor gives every job a file of its own, so a job the cluster lost, still
    /// dying, cannot overwrite the receipt the run files for its cell.
    #[arg(long, value_name = "PATH")]
    pub receipt: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct RunArgs {
    /// The manifest to run.
    pub manifest: PathBuf,
    /// GPUs to use: `all` (NVML, bounded by CUDA_VISIBLE_DEVICES), `none`, a list of NVML
    /// indices (`0,2`), or `fake:N` for N fake GPUs.
    #[arg(long, default_value = "all", value_parser = parse_gpu_spec)]
    pub gpus: GpuSpec,
    /// Leave this GPU out of the run (its UUID, or a unique prefix of it, as `memra-orch
    /// gpus` prints it), e.g. one `gpus --health` marks unfit. Repeatable.
    #[arg(long, value_name = "UUID")]
    pub exclude_gpu: Vec<String>,
    /// Refuse to run (exit 4) unless at least N GPUs are detected, and fail the run when a
    /// node is skipped for lack of GPUs; overrides the manifest's `[require] gpus` (`0`
    /// lifts it and runs what this machine can).
    #[arg(long, value_name = "N")]
    pub require_gpus: Option<u32>,
    /// CPU slots for `gpus = 0` nodes (default: the number of CPU cores).
    #[arg(long, short = 'j')]
    pub jobs: Option<usize>,
    /// Stop starting new nodes after the first one that is not as expected.
    #[arg(long)]
    pub fail_fast: bool,
    /// Run only cells whose id matches this glob or that carry this tag (`tag:NAME`); a
    /// leading `!` excludes instead (`'!tag:canary'`); repeatable; what a selected cell needs
    /// runs too. The new run carries the other cells' receipts forward from the newest run
    /// of this manifest at this commit.
    #[arg(long = "filter", value_name = "GLOB|tag:NAME")]
    pub filters: Vec<String>,
    /// Leave out cells matching this glob or tag (the same as `--filter '!X'`); repeatable.
    #[arg(long = "exclude", value_name = "GLOB|tag:NAME")]
    pub excludes: Vec<String>,
    /// Run again the cells whose verdict in the newest run of this manifest at this commit
    /// was not as expected (plus what they need); carry every other receipt forward.
    #[arg(long)]
    pub rerun_failed: bool,
    /// Replace a `[vars]` entry of the manifest with VALUE, taken verbatim (e.g. `--var
    /// bin=.device/bin` to run prebuilt binaries); repeatable; a NAME the manifest does not
    /// define is an error. The substituted commands are in the receipts.
    #[arg(long = "var", value_name = "NAME=VALUE", value_parser = parse_var)]
    pub vars: Vec<(String, String)>,
    /// Complete the newest run of this manifest at this commit: a new run that carries its
    /// final receipts whose inputs did not change, and runs the rest.
    #[arg(long)]
    pub resume: bool,
    /// Do not run the manifest's `[notify]` command when the run ends (a run by hand, a
    /// rehearsal); the run's summary is still in `memra-orch summary`.
    #[arg(long)]
    pub no_notify: bool,
    /// Do not apply the manifest's `[retention]` when the run ends (delete nothing).
    #[arg(long)]
    pub no_retention: bool,
    /// Leave the finished run's cell folders as a tree (`nodes/`) instead of packing them
    /// into `nodes.zip` (receipts.md, "Packed runs").
    #[arg(long)]
    pub no_pack: bool,
    /// Commit id to file the receipts under (default: from git, with `-dirty` when the tree
    /// has uncommitted changes).
    #[arg(long)]
    pub commit: Option<String>,
    /// Receipt folder (default: `receipts/` under the manifest's root).
    #[arg(long)]
    pub receipts: Option<PathBuf>,
    /// Wait up to DURATION for another run of this receipt tree to release its lock, then
    /// run (default: do not wait). Still held after DURATION: exit 75.
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
    pub wait_lock: Option<std::time::Duration>,
    /// Progress display: bars on a terminal, one plain line per event otherwise
    /// (with a `still running` line per running node every minute); quiet prints only the
    /// final counts (on stdout, or on stderr with `--events json`).
    #[arg(long, value_enum, default_value_t = ProgressMode::Auto)]
    pub progress: ProgressMode,
    /// Write the run as a Prometheus textfile (for node_exporter's textfile collector, which
    /// reads `*.prom`): replaced atomically when the run starts (`memra_run_running 1`) and
    /// when it ends (counts per verdict, duration, exit code, per-cell verdict and seconds,
    /// labelled by manifest and commit; docs/receipts.md). The folder must exist.
    #[arg(long, value_name = "PATH")]
    pub metrics_file: Option<PathBuf>,
    /// `json`: one JSON object per line on stdout for each event (run-started, cell-started,
    /// attempt-finished, cell-finished, run-finished), each with `type` and `schema`, flushed
    /// per line; stdout then carries only these lines, and the progress and the final summary
    /// go to stderr (docs/receipts.md).
    #[arg(long, value_enum, value_name = "FORMAT")]
    pub events: Option<EventFormat>,
    /// Time between SIGTERM and SIGKILL when a node times out or the run is interrupted
    /// (default: 5s; a second Ctrl-C skips what is left of it).
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
    pub grace: Option<std::time::Duration>,
    /// Where nodes run: `local` subprocesses, or `slurm` batch jobs (one per node, through
    /// `sbatch`; the receipt folder and memra-orch must be on a filesystem the compute nodes
    /// share; see docs/slurm.md).
    #[arg(long, value_enum, default_value_t = ExecutorKind::Local)]
    pub executor: ExecutorKind,
    /// Slurm partition for the jobs (default: the cluster's default partition).
    #[arg(long)]
    pub partition: Option<String>,
    /// Slurm account to charge the jobs to.
    #[arg(long)]
    pub account: Option<String>,
    /// An extra `sbatch` argument (`--slurm-arg=--qos=nightly`); repeatable; comes after
    /// memra-orch's own, so it can override them.
    #[arg(long = "slurm-arg", value_name = "ARG", allow_hyphen_values = true)]
    pub slurm_args: Vec<String>,
}

/// Where `run` runs its nodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ExecutorKind {
    Local,
    Slurm,
}

#[derive(Debug, Args)]
pub struct PlanArgs {
    /// The manifest to expand (see docs/manifest.md).
    pub manifest: PathBuf,
    /// `text`: cells in topological order with kind, GPUs, command, pins and needs; `json`:
    /// the whole plan, machine-readable; `dot`: a Graphviz digraph.
    #[arg(long, value_enum, default_value_t = PlanFormat::Text)]
    pub format: PlanFormat,
    /// Only cells matching these filters (as for `run`; `!X` excludes).
    #[arg(long = "filter", value_name = "GLOB|tag:NAME")]
    pub filters: Vec<String>,
    /// Leave out cells matching this glob or tag (as for `run`).
    #[arg(long = "exclude", value_name = "GLOB|tag:NAME")]
    pub excludes: Vec<String>,
    /// Replace a `[vars]` entry of the manifest (as for `run`).
    #[arg(long = "var", value_name = "NAME=VALUE", value_parser = parse_var)]
    pub vars: Vec<(String, String)>,
}

#[derive(Debug, Args)]
pub struct ValidateArgs {
    /// Manifests to check; each is loaded in full (with its env-matrix files).
    #[arg(required = true)]
    pub manifests: Vec<PathBuf>,
}

#[derive(Debug, Args)]
pub struct GpusArgs {
    /// `all` (NVML, bounded by CUDA_VISIBLE_DEVICES), `none`, NVML indices (`0,2`, still
    /// within CUDA_VISIBLE_DEVICES), or `fake:N` for N fake GPUs.
    #[arg(long, default_value = "all", value_parser = parse_gpu_spec)]
    pub gpus: GpuSpec,
    /// `text` (a table) or `json` (the inventory the receipts record).
    #[arg(long, value_enum, default_value_t = GpusFormat::Text)]
    pub format: GpusFormat,
    /// Also read each GPU's health through NVML (ECC counts, retired pages and remapped
    /// rows, throttle reasons, temperature, power, performance state, PCIe replays) and mark
    /// a GPU unfit for exactness gates (docs/receipts.md).
    #[arg(long)]
    pub health: bool,
}

/// What `diff`, `show`, `ls` and `gc` accept as a run, for `--help`.
const DIFF_HELP: &str = "\
Without OLD and NEW (the morning command): the latest run of the manifest (--manifest, else
the newest run's) against the run before it, and, when that one was not green, also against
the last green run, so a green night after a red one still shows what changed since the
last good state. The exit code is 1 when either comparison regressed; with a single run
there is nothing to compare, and the exit code is that run's.

OLD and NEW name runs: a run folder (holding run.json), a run id as `memra-orch ls` prints it
(or a unique start of one), `latest` or `previous` (the newest run and the one before it of
the same manifest), `last-green` (the newest run whose every cell was as expected),
`last-green:CELL` (the newest run in which that cell was), `@YYYY-MM-DD` (the last run of
that UTC day), a commit folder, or a commit-ish git resolves in the current folder
(`HEAD~1`, a short sha, a tag; `<sha>-dirty` for a dirty run), looked up as
<receipts>/<sha>[-dirty]/<manifest>; a commit means its newest complete run.

A cell's inputs digest covers its command, pins, binaries, declared inputs, fingerprints
and the code (the commit's tree and uncommitted changes, unless the cell is hermetic). A
cell whose verdict changed while its digest, GPU models and driver did not (two runs at one
commit) is listed as FLAKY (with how often it flipped in the last --flaky-window runs), one
whose artifacts changed with identical inputs and verdict as NONDETERMINISTIC; neither fails
the diff unless --flaky-fails. A change across different digests is a regression, fix or
bits moved even for a cell with a flaky history (marked \"known flaky\"), and a run
outside git is never evidence of flakiness.

Exit codes:
  0    nothing regressed
  1    at least one node regressed (was pass or skipped, is now anything else), or lost
       coverage (was pass, is now skipped or absent) without --allow-lost, or (with
       --flaky-fails) a cell was flaky or nondeterministic
  2    usage error: a run could not be found or read";

#[derive(Debug, Args)]
pub struct DiffArgs {
    /// The older run (folder, run id, commit-ish, `latest`, `previous`, `last-green`,
    /// `last-green:CELL`, `@YYYY-MM-DD`). Without OLD and NEW: the latest run against the
    /// one before it, and against the last green run when that is older.
    #[arg(requires = "new")]
    pub old: Option<String>,
    /// The newer run (named as OLD).
    pub new: Option<String>,
    /// The manifest name, when a commit folder holds runs of several manifests.
    #[arg(long, value_name = "NAME")]
    pub manifest: Option<String>,
    /// Receipts folder (default: `receipts/` at the top of the current git work tree).
    #[arg(long, value_name = "DIR")]
    pub receipts: Option<PathBuf>,
    /// `text` (coloured on a terminal), `markdown` (for a PR comment or mail) or `json`.
    #[arg(long, value_enum, default_value_t = DiffFormat::Text)]
    pub format: DiffFormat,
    /// Colour in text output: `auto` means on a terminal and NO_COLOR unset.
    #[arg(long, value_enum, default_value_t = ColorMode::Auto)]
    pub color: ColorMode,
    /// A check metric drifted when its relative change exceeds this (`0.05` or `5%`).
    #[arg(long, value_name = "FRACTION", default_value = "5%", value_parser = parse_fraction)]
    pub metric_rel: f64,
    /// Absolute metric changes at or below this are noise (lets a metric that was 0 drift).
    #[arg(long, value_name = "NUMBER", default_value = "1e-12", value_parser = parse_floor)]
    pub metric_abs: f64,
    /// Duration changes (node seconds, metrics named `*_seconds`, `*_ms`…) under this are noise.
    #[arg(long, value_name = "DURATION", default_value = "1s", value_parser = humantime::parse_duration)]
    pub duration_abs: std::time::Duration,
    /// Duration changes under this fraction are noise (`0.2` or `20%`).
    #[arg(long, value_name = "FRACTION", default_value = "20%", value_parser = parse_fraction)]
    pub duration_rel: f64,
    /// List lost coverage (a node that passed and is now skipped or absent) without letting
    /// it make the exit code 1.
    #[arg(long)]
    pub allow_lost: bool,
    /// Do not open the artifacts whose bits moved: list their sha256 digests only, without
    /// the per-tensor figures (values that differ, max |Δ|, ulp, argmax agreement).
    #[arg(long)]
    pub no_read: bool,
    /// How many runs of the manifest, up to NEW, to count a flaky cell's flips in.
    #[arg(long, value_name = "N", default_value_t = 10, value_parser = clap::value_parser!(u64).range(2..))]
    pub flaky_window: u64,
    /// Let flaky and nondeterministic cells make the exit code 1.
    #[arg(long)]
    pub flaky_fails: bool,
}

const BISECT_HELP: &str = "\
Each candidate commit is checked out in a detached worktree of its own (the checkout you
are in is never touched), the setups the cell needs and the cell are run there by `memra-orch
run --filter CELL` (the same isolation, GPU leases and receipts as any run), and the receipts
are filed under that commit in the receipts folder. Receipts already there for a commit
(a clean run of the same manifest file, --var values and GPU models) are reused. A commit
whose setup fails (does not build) is skipped and reported. The search walks first parents
(a change inside a merged branch is reported as its merge commit).

Exit codes:
  0    the culprit was found
  1    the range holds no change: the bad commit is as the good one
  2    usage error, or the good commit is not good (or cannot be tested)
  3    internal error of memra-orch or git
  5    no single commit can be named: the cell is flaky (its runs at one commit disagree),
       or skipped commits leave a range (listed)
  130  interrupted: the worktrees are removed; `bisect --resume` continues";

#[derive(Debug, Args)]
pub struct BisectArgs {
    /// The cell, by its full id as `memra-orch plan` prints it (`decode[batch=4]`).
    #[arg(value_name = "CELL")]
    pub cell: Option<String>,
    /// The last commit known good (a sha, tag, branch or `HEAD~N`).
    #[arg(long, value_name = "COMMIT")]
    pub good: Option<String>,
    /// A later commit where the cell is not as expected (or its bits moved).
    #[arg(long, value_name = "COMMIT")]
    pub bad: Option<String>,
    /// The manifest (in the repository bisected; each commit's own version of it is run).
    /// Default: the manifest whose runs under the receipts folder hold CELL.
    #[arg(long, value_name = "PATH")]
    pub manifest: Option<PathBuf>,
    /// Search for the first commit whose artifacts of the cell differ from the good
    /// commit's, instead of the first where its verdict is not as expected.
    #[arg(long)]
    pub bits: bool,
    /// With --bits, compare only the artifacts whose file name matches this glob
    /// (repeatable; e.g. `f16.safetensors` to leave out a receipt that names its binary's
    /// hash, which moves with every build). Default: every artifact.
    #[arg(long, value_name = "GLOB", requires = "bits")]
    pub artifact: Vec<String>,
    /// Candidates tested at once (a k-ary search), each with its own GPUs and worktree.
    #[arg(long, short = 'j', default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=64))]
    pub jobs: u64,
    /// Runs of the cell per candidate; runs that disagree stop the search (flaky).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=100))]
    pub reps: u64,
    /// Continue the last unfinished bisection under the receipts folder, with its
    /// arguments; the receipts already made are reused.
    #[arg(long)]
    pub resume: bool,
    /// A path of the repository (relative to its top, e.g. `target`) kept from one
    /// candidate to the next instead of starting empty in each worktree, so a build is
    /// incremental; one copy per job slot under <receipts>/.memra-bisect/share. Repeatable.
    #[arg(long, value_name = "PATH")]
    pub share: Vec<String>,
    /// Replace a `[vars]` entry of the manifest in every run (as for `run`).
    #[arg(long = "var", value_name = "NAME=VALUE", value_parser = parse_var)]
    pub vars: Vec<(String, String)>,
    /// GPUs to use (as for `run`); divided among the job slots.
    #[arg(long, default_value = "all")]
    pub gpus: String,
    /// Time between SIGTERM and SIGKILL for the runs' nodes (as for `run`).
    #[arg(long, value_name = "DURATION")]
    pub grace: Option<String>,
    /// Receipts folder (default: `receipts/` at the top of the current git work tree).
    #[arg(long, value_name = "DIR")]
    pub receipts: Option<PathBuf>,
    /// `text`, `markdown` or `json`.
    #[arg(long, value_enum, default_value_t = BisectFormat::Text)]
    pub format: BisectFormat,
}

/// The report formats of `bisect`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum BisectFormat {
    Text,
    Markdown,
    Json,
}

#[derive(Debug, Args)]
pub struct ShowArgs {
    /// The run (folder, commit-ish, `latest` or `previous`).
    pub run: String,
    /// A node: its cell id, its slug, or a glob matching exactly one cell id.
    pub node: Option<String>,
    /// The manifest name, when a commit folder holds runs of several manifests.
    #[arg(long, value_name = "NAME")]
    pub manifest: Option<String>,
    /// Receipts folder (default: `receipts/` at the top of the current git work tree).
    #[arg(long, value_name = "DIR")]
    pub receipts: Option<PathBuf>,
    /// `text`, or `json` (run.json or the node's receipt.json as stored).
    #[arg(long, value_enum, default_value_t = ShowFormat::Text)]
    pub format: ShowFormat,
    /// Print one file of the node's last attempt as stored, from its folder or from a
    /// packed run's archive: `stdout`, `stderr` or `checks` (checks.jsonl).
    #[arg(long, value_enum, value_name = "FILE", requires = "node")]
    pub log: Option<ShowLog>,
    /// With `--log`: the attempt to read (its number, as `show RUN NODE` lists them)
    /// instead of the last.
    #[arg(long, value_name = "N", requires = "log")]
    pub attempt: Option<u32>,
}

/// The files of an attempt `show --log` prints.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ShowLog {
    Stdout,
    Stderr,
    Checks,
}

impl ShowLog {
    /// The file's name in the attempt folder.
    pub fn file_name(self) -> &'static str {
        match self {
            ShowLog::Stdout => "stdout.log",
            ShowLog::Stderr => "stderr.log",
            ShowLog::Checks => "checks.jsonl",
        }
    }
}

/// `show` and `ls` print text or the stored JSON; only the command layer chooses between
/// them, so the choice lives here.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ShowFormat {
    Text,
    Json,
}

#[derive(Debug, Args)]
pub struct LsArgs {
    /// Only runs of this manifest.
    #[arg(long, value_name = "NAME")]
    pub manifest: Option<String>,
    /// Receipts folder (default: `receipts/` at the top of the current git work tree).
    #[arg(long, value_name = "DIR")]
    pub receipts: Option<PathBuf>,
    /// `text` (a table) or `json`.
    #[arg(long, value_enum, default_value_t = ShowFormat::Text)]
    pub format: ShowFormat,
}

#[derive(Debug, Args)]
pub struct SummaryArgs {
    /// The run (folder, run id, commit-ish, `latest`, `last-green`, `@YYYY-MM-DD`, as
    /// `diff` names runs). Default: the newest finished run of the manifest.
    pub run: Option<String>,
    /// What to compare it with: `previous` (the newest finished run before it),
    /// `last-green` (the newest green run before it) or a run named as RUN.
    #[arg(
        long,
        value_name = "previous|last-green|RUN",
        default_value = "previous"
    )]
    pub since: String,
    /// The manifest, by name or by its file (whose `name` is read), when the receipts
    /// folder holds runs of several manifests.
    #[arg(long, value_name = "NAME|FILE")]
    pub manifest: Option<String>,
    /// Receipts folder (default: `receipts/` at the top of the current git work tree).
    #[arg(long, value_name = "DIR")]
    pub receipts: Option<PathBuf>,
    /// `text`, `markdown` (for a chat that renders it) or `json` (every list whole).
    #[arg(long, value_enum, default_value_t = SummaryFormat::Text)]
    pub format: SummaryFormat,
    /// Where `memra-orch report --html` is published: the summary links to the run's
    /// page there (`URL/runs/<page>.html`) instead of naming the run's folder.
    #[arg(long, value_name = "URL")]
    pub report_url: Option<String>,
    /// Lost coverage (a cell that passed and is now skipped or gone) is listed but is no
    /// regression.
    #[arg(long)]
    pub allow_lost: bool,
}

#[derive(Debug, Args)]
pub struct ReportArgs {
    /// The folder to write the site into: created when missing; a folder that holds files
    /// but no report marker (`memra-report.json`) is refused; an earlier report's pages
    /// are replaced.
    #[arg(long, value_name = "DIR", required = true)]
    pub html: PathBuf,
    /// Only the newest N runs (at least 1).
    #[arg(long, value_name = "N", default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..))]
    pub last: u64,
    /// The manifest to report on (needed when the receipts folder holds runs of several).
    #[arg(long, value_name = "NAME")]
    pub manifest: Option<String>,
    /// Receipts folder (default: `receipts/` at the top of the current git work tree).
    #[arg(long, value_name = "DIR")]
    pub receipts: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct HistoryArgs {
    /// Cells to show: globs over cell ids and node ids or `tag:NAME`, as `run --filter`
    /// takes them (`!X` excludes); none shows every cell.
    #[arg(value_name = "CELL-FILTER")]
    pub filters: Vec<String>,
    /// Only the newest N runs.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub last: Option<u64>,
    /// The manifest, when the receipts folder holds runs of several.
    #[arg(long, value_name = "NAME")]
    pub manifest: Option<String>,
    /// Receipts folder (default: `receipts/` at the top of the current git work tree).
    #[arg(long, value_name = "DIR")]
    pub receipts: Option<PathBuf>,
    /// `text`, `markdown` or `json` (the whole history model).
    #[arg(long, value_enum, default_value_t = HistoryFormat::Text)]
    pub format: HistoryFormat,
    /// The regressions feed instead of the timelines: every step the selected cells'
    /// metrics took to a new level across the runs, newest first (a penalised step fit,
    /// docs/diff.md).
    #[arg(long)]
    pub steps: bool,
}

#[derive(Debug, Args)]
pub struct GcArgs {
    /// How many of the newest runs of each manifest to keep (at least 1).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    pub keep: Option<u64>,
    /// Delete runs that started longer ago than this (`90d`, `12weeks`).
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
    pub older_than: Option<std::time::Duration>,
    /// Delete the oldest runs until the runs in scope take at most this much disk (`50G`,
    /// `800MiB`; a file several runs link counts once).
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    pub max_size: Option<u64>,
    /// Only runs of this manifest (others are left alone).
    #[arg(long, value_name = "NAME")]
    pub manifest: Option<String>,
    /// Receipts folder (default: `receipts/` at the top of the current git work tree).
    #[arg(long, value_name = "DIR")]
    pub receipts: Option<PathBuf>,
    /// Print what would be deleted, delete nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Also pack every kept finished run that is still a tree of cell folders (runs filed
    /// with `run --no-pack`, interrupted ones, those of older versions) into its
    /// `nodes.zip`; alone, it packs and deletes nothing.
    #[arg(long)]
    pub pack: bool,
}

/// A size: `50G`, `800MiB`, `1.5T`, or bytes.
fn parse_size(s: &str) -> Result<u64, String> {
    crate::load::manifest::parse_memory(s)
        .filter(|b| *b > 0)
        .ok_or_else(|| format!("{s:?}: not a size; write e.g. 50G, 800MiB or 1.5T"))
}

fn parse_gpu_spec(s: &str) -> Result<GpuSpec, String> {
    s.parse()
}

/// `NAME=VALUE` of `--var`; the value may itself contain `=`.
fn parse_var(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((name, value)) if !name.is_empty() => Ok((name.to_string(), value.to_string())),
        _ => Err(format!(
            "`{s}` is not NAME=VALUE; write e.g. --var bin=.device/bin"
        )),
    }
}

/// Parses a fraction: `0.05` or `5%`.
fn parse_fraction(s: &str) -> Result<f64, String> {
    let (num, scale) = match s.trim().strip_suffix('%') {
        Some(p) => (p, 0.01),
        None => (s.trim(), 1.0),
    };
    num.trim()
        .parse::<f64>()
        .ok()
        .map(|v| v * scale)
        .filter(|v| v.is_finite() && *v >= 0.0)
        .ok_or_else(|| format!("{s:?}: not a fraction; write 0.05 or 5%"))
}

/// Parses a non-negative number (an absolute floor).
fn parse_floor(s: &str) -> Result<f64, String> {
    s.trim()
        .parse::<f64>()
        .ok()
        .filter(|v| v.is_finite() && *v >= 0.0)
        .ok_or_else(|| format!("{s:?}: not a non-negative number; write for example 1e-9"))
}

#[cfg(test)]
mod tests {
    use super::{parse_floor, parse_fraction};

    #[test]
    fn fractions() {
        assert_eq!(parse_fraction("5%").unwrap(), 0.05);
        assert_eq!(parse_fraction("0.2").unwrap(), 0.2);
        assert!(parse_fraction("-1").is_err());
        assert!(parse_fraction("x%").unwrap_err().contains("5%"));
        assert!(parse_floor("nan").is_err());
    }
}
