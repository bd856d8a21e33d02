//! `memra-orch plan`: loads the manifest with its `--var` overrides, selects the cells of
//! `--filter` and prints the plan in the chosen format.

use crate::cmd::cli::PlanArgs;
use crate::load::{load_plan_with_vars, render};
use crate::words::exit::ExitCode;

/// The `plan` subcommand.
pub fn command(args: &PlanArgs) -> ExitCode {
    let plan = match load_plan_with_vars(&args.manifest, &args.vars) {
        Ok(p) => p,
        Err(d) => {
            eprintln!("{d}");
            return ExitCode::Usage;
        }
    };
    let filters = crate::plan::with_excludes(&args.filters, &args.excludes);
    let selected = match crate::plan::select(&plan, &filters) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::Usage;
        }
    };
    print!("{}", render::render(&plan, &selected, args.format));
    ExitCode::Ok
}
