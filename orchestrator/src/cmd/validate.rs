//! `memra-orch validate`: loads every manifest named and prints each one's problems, or a
//! line saying how many nodes and cells it has.

use crate::cmd::cli::ValidateArgs;
use crate::load::load_plan;
use crate::words::exit::ExitCode;

/// The `validate` subcommand: every manifest is checked, every problem printed.
pub fn command(args: &ValidateArgs) -> ExitCode {
    let mut bad = 0;
    for path in &args.manifests {
        match load_plan(path) {
            Ok(plan) => {
                let nodes: std::collections::BTreeSet<&str> =
                    plan.cells.iter().map(|c| c.node.0.as_str()).collect();
                println!(
                    "ok: {} ({} nodes, {} cells)",
                    path.display(),
                    nodes.len(),
                    plan.cells.len()
                );
            }
            Err(d) => {
                bad += 1;
                eprintln!("{d}");
            }
        }
    }
    if bad > 0 {
        ExitCode::Usage
    } else {
        ExitCode::Ok
    }
}
