//! Command-line parsing and dispatch. Parsing only validates the shape of the arguments
//! (clap); resolving paths, reading manifests and building plans happen in the library
//! modules each subcommand dispatches to.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::ExitCode;
use crate::exit::EXIT_CODES_HELP;
use crate::gpus::GpuSpec;

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
}

#[derive(Debug, Args)]
pub struct RunArgs {
    /// The manifest to run.
    pub manifest: PathBuf,
    /// GPUs to use: `all` (NVML, bounded by CUDA_VISIBLE_DEVICES), `none`, a list of NVML
    /// indices (`0,2`), or `fake:N` for N fake GPUs.
    #[arg(long, default_value = "all", value_parser = parse_gpu_spec)]
    pub gpus: GpuSpec,
    /// CPU slots for `gpus = 0` nodes (default: the number of CPU cores).
    #[arg(long, short = 'j')]
    pub jobs: Option<usize>,
    /// Stop starting new nodes after the first one that is not as expected.
    #[arg(long)]
    pub fail_fast: bool,
    /// Run only cells whose id matches this glob or that carry this tag (`tag:NAME`);
    /// repeatable; what a selected cell needs runs too.
    #[arg(long = "filter", value_name = "GLOB|tag:NAME")]
    pub filters: Vec<String>,
    /// Complete the existing receipt tree of this commit without re-running finished nodes.
    #[arg(long)]
    pub resume: bool,
    /// Commit id to file the receipts under (default: from git, with `-dirty` when the tree
    /// has uncommitted changes).
    #[arg(long)]
    pub commit: Option<String>,
    /// Receipt folder (default: `receipts/` under the manifest's root).
    #[arg(long)]
    pub receipts: Option<PathBuf>,
    /// Progress display: bars on a terminal, one plain line per event otherwise.
    #[arg(long, value_enum, default_value_t = ProgressMode::Auto)]
    pub progress: ProgressMode,
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

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ExecutorKind {
    Local,
    Slurm,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ProgressMode {
    Auto,
    Bars,
    Plain,
    Quiet,
}

#[derive(Debug, Args)]
pub struct PlanArgs {
    /// The manifest to expand (see docs/manifest.md).
    pub manifest: PathBuf,
    /// `text`: cells in topological order with kind, GPUs, command, pins and needs; `json`:
    /// the whole plan, machine-readable; `dot`: a Graphviz digraph.
    #[arg(long, value_enum, default_value_t = PlanFormat::Text)]
    pub format: PlanFormat,
    /// Only cells matching these filters (as for `run`).
    #[arg(long = "filter", value_name = "GLOB|tag:NAME")]
    pub filters: Vec<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum PlanFormat {
    Text,
    Json,
    Dot,
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
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum GpusFormat {
    Text,
    Json,
}

fn parse_gpu_spec(s: &str) -> Result<GpuSpec, String> {
    s.parse()
}

/// Parses the command line and runs the subcommand; returns the exit code.
pub fn main() -> i32 {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let code = if e.use_stderr() { ExitCode::Usage } else { ExitCode::Ok };
            let _ = e.print();
            return code.code();
        }
    };
    dispatch(cli.command).code()
}

/// Runs one parsed subcommand.
pub fn dispatch(command: Command) -> ExitCode {
    match command {
        Command::Run(args) => crate::run::command(&args),
        Command::Plan(args) => crate::load::plan_command(&args),
        Command::Validate(args) => crate::load::validate_command(&args),
        Command::Gpus(args) => crate::gpus::command(&args),
        Command::ExecNode(args) => crate::executor::exec_node::command(&args),
    }
}
