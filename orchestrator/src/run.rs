//! The `run` subcommand: plan → scheduler → executor → events → receipts.

use crate::ExitCode;
use crate::cli::RunArgs;

pub fn command(_args: &RunArgs) -> ExitCode {
    eprintln!("memra-orch run: not built yet");
    ExitCode::Internal
}
