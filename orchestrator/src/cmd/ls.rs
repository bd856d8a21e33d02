//! `memra-orch ls`: every run under the receipts folder, newest first, as a table or JSON.

use serde_json::json;

use crate::cmd::cli::{LsArgs, ShowFormat};
use crate::history::heads::heads_and_unreadable;
use crate::receipt::error::FindError;
use crate::receipt::resolve::{RunHead, receipts_root};
use crate::report::ls::table;
use crate::words::exit::ExitCode;

/// The `ls` subcommand.
pub fn command(args: &LsArgs) -> ExitCode {
    let run = || -> Result<String, FindError> {
        let receipts = receipts_root(args.receipts.as_deref())?;
        let (all, unreadable) = heads_and_unreadable(&receipts)?;
        let runs: Vec<RunHead> = all
            .into_iter()
            .filter(|r| args.manifest.as_deref().is_none_or(|m| r.name == m))
            .collect();
        // A run folder whose run.json cannot be read is no run to list, but it is said.
        let of_manifest = |dir: &std::path::Path| {
            args.manifest.as_deref().is_none_or(|m| {
                dir.parent()
                    .and_then(std::path::Path::file_name)
                    .is_some_and(|n| n.to_string_lossy() == m)
            })
        };
        for dir in unreadable.iter().filter(|d| of_manifest(d)) {
            eprintln!(
                "memra-orch ls: {} has no readable run.json (killed as it began, or damaged); \
                 it is not listed, and `memra-orch summary` counts it as a run that never \
                 finished",
                crate::words::escape::control(&dir.display().to_string())
            );
        }
        Ok(match args.format {
            ShowFormat::Text => table(&runs),
            ShowFormat::Json => {
                let rows: Vec<_> = runs
                    .iter()
                    .map(|r| {
                        json!({
                            "dir": r.dir, "id": r.id, "commit": r.commit, "manifest": r.name,
                            "start": r.start, "end": r.end, "seconds": r.seconds,
                            "host": r.host, "verdict": r.verdict, "counts": r.counts,
                            "carried": r.carried,
                            "carried_from": r.carried_from,
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
