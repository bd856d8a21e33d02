//! Loading a manifest from disk into a validated [`crate::plan::Plan`], and the `plan` and
//! `validate` subcommands.

use crate::ExitCode;
use crate::cli::{PlanArgs, ValidateArgs};

pub fn plan_command(_args: &PlanArgs) -> ExitCode {
    eprintln!("memra-orch plan: not built yet");
    ExitCode::Internal
}

pub fn validate_command(_args: &ValidateArgs) -> ExitCode {
    eprintln!("memra-orch validate: not built yet");
    ExitCode::Internal
}
