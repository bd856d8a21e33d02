//! The command layer: one module per subcommand. Each takes its clap arguments
//! ([`crate::cmd::cli`]), builds the library's options from them once, calls the library and
//! returns the exit code. Only this layer and `cli` know the command line exists; the
//! modules below it take plain options values.

pub mod bisect;
pub mod cli;
pub mod diff;
pub mod exec_node;
pub mod gc;
pub mod gpus;
pub mod history;
pub mod ls;
pub mod plan;
pub mod report;
pub mod run;
pub mod show;
pub mod summary;
pub mod validate;

use clap::Parser;

use crate::cmd::cli::{Cli, Command};
use crate::words::exit::ExitCode;

/// Parses the command line and runs the subcommand; returns the exit code.
pub fn main() -> i32 {
    if let Some(code) = crate::run::executor::supervise::main_if_asked() {
        return code;
    }
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let code = if e.use_stderr() {
                ExitCode::Usage
            } else {
                ExitCode::Ok
            };
            let _ = e.print();
            return code.code();
        }
    };
    dispatch(cli.command).code()
}

/// Runs one parsed subcommand.
pub fn dispatch(command: Command) -> ExitCode {
    // A command that only prints ends quietly when its reader goes (`memra-orch show |
    // head`), as any Unix tool does, instead of panicking on the closed pipe. Commands that
    // write receipts, a site or deletions keep SIGPIPE ignored and see the error instead, as
    // does `history`, which ends on the closed pipe itself so that its index closes cleanly.
    if matches!(
        command,
        Command::Plan(_)
            | Command::Validate(_)
            | Command::Gpus(_)
            | Command::Diff(_)
            | Command::Show(_)
            | Command::Ls(_)
            | Command::Summary(_)
    ) {
        // SAFETY: signal() with SIG_DFL changes only this process's disposition of SIGPIPE;
        // no handler runs.
        unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    }
    match command {
        Command::Run(args) => run::command(&args),
        Command::Plan(args) => plan::command(&args),
        Command::Validate(args) => validate::command(&args),
        Command::Gpus(args) => gpus::command(&args),
        Command::Diff(args) => diff::command(&args),
        Command::Show(args) => show::command(&args),
        Command::Ls(args) => ls::command(&args),
        Command::History(args) => history::command(&args),
        Command::Gc(args) => gc::command(&args),
        Command::Report(args) => report::command(&args),
        Command::Summary(args) => summary::command(&args),
        Command::Bisect(args) => bisect::command(&args),
        Command::ExecNode(args) => exec_node::command(&args),
    }
}
