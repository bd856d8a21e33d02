//! The hidden `memra-orch exec-node <job.json>`: the compute-node half of a cluster
//! executor, which runs one cell and writes its receipt ([`crate::run::executor::exec_node`]).

use crate::cmd::cli::ExecNodeArgs;
use crate::run::executor::exec_node::{ExecNodeOptions, exec_node};
use crate::words::exit::ExitCode;

/// The `exec-node` subcommand.
pub fn command(args: &ExecNodeArgs) -> ExitCode {
    let defaults = ExecNodeOptions::default();
    crate::run::executor::supervise::adopt_orphans();
    let code = exec_node(&ExecNodeOptions {
        job: args.job.clone(),
        grace: args.grace.unwrap_or(defaults.grace),
        gpus_from_env: args.gpus_from_env,
        receipt: args.receipt.clone(),
    });
    crate::run::executor::supervise::reap_orphans();
    code
}
