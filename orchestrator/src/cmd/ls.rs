//! `memra-orch ls`: every run under the receipts folder, newest first, as a table or JSON.

use serde_json::json;

use crate::ExitCode;
use crate::cli::{LsArgs, ShowFormat};
use crate::receipt::error::FindError;
use crate::receipt::resolve::{FoundRun, list_runs, receipts_root};
use crate::report::ls::table;

/// The `ls` subcommand.
pub fn command(args: &LsArgs) -> ExitCode {
    let run = || -> Result<String, FindError> {
        let receipts = receipts_root(args.receipts.as_deref())?;
        let runs: Vec<FoundRun> = list_runs(&receipts)?
            .into_iter()
            .filter(|r| args.manifest.as_deref().is_none_or(|m| r.run.name == m))
            .collect();
        Ok(match args.format {
            ShowFormat::Text => table(&runs),
            ShowFormat::Json => {
                let rows: Vec<_> = runs
                    .iter()
                    .map(|r| {
                        json!({
                            "dir": r.dir, "id": r.id, "commit": r.commit, "manifest": r.run.name,
                            "start": r.run.start, "end": r.run.end, "seconds": r.run.seconds,
                            "host": r.run.host, "verdict": r.run.verdict, "counts": r.run.counts,
                            "carried": crate::report::ls::carried_count(r),
                            "carried_from": r.run.carried_from,
                        })
                    })
                    .collect();
                format!(
                    "{}\n",
                    serde_json::to_string_pretty(&rows).unwrap_or_default()
                )
            }
        })
    };
    match run() {
        Ok(text) => {
            print!("{text}");
            ExitCode::Ok
        }
        Err(e) => {
            eprintln!("memra-orch ls: {e}");
            ExitCode::Usage
        }
    }
}
