//! `memra-orch ls`: every run under the receipts folder, newest first, one line each with
//! its commit, manifest, start, overall verdict and counts per verdict.

use std::fmt::Write;

use serde_json::json;

use crate::ExitCode;
use crate::cli::{LsArgs, ShowFormat};
use crate::diff::render::short_commit;
use crate::diff::resolve::{FoundRun, list_runs, receipts_root};
use crate::report::summary::counts_line;

/// Renders the run list as a table.
pub fn table(runs: &[FoundRun]) -> String {
    let mut out = String::new();
    if runs.is_empty() {
        out.push_str("no runs\n");
        return out;
    }
    let cw = runs
        .iter()
        .map(|r| short_commit(&r.commit).len())
        .max()
        .unwrap_or(6)
        .max(6);
    let mw = runs
        .iter()
        .map(|r| r.run.name.chars().count())
        .max()
        .unwrap_or(8)
        .max(8);
    let _ = writeln!(
        out,
        "{:<24}  {:<cw$}  {:<mw$}  {:<8}  {:>8}  counts",
        "start", "commit", "manifest", "verdict", "seconds"
    );
    for r in runs {
        let line = format!(
            "{:<24}  {:<cw$}  {:<mw$}  {:<8}  {:>8}  {}",
            r.run.start,
            short_commit(&r.commit),
            r.run.name,
            r.run.verdict,
            r.run.seconds.map_or("-".to_string(), |s| format!("{s:.1}")),
            counts_line(&r.run.counts)
        );
        let _ = writeln!(out, "{}", line.trim_end());
    }
    out
}

/// The `ls` subcommand.
pub fn command(args: &LsArgs) -> ExitCode {
    let run = || -> Result<String, String> {
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
                            "dir": r.dir, "commit": r.commit, "manifest": r.run.name,
                            "start": r.run.start, "end": r.run.end, "seconds": r.run.seconds,
                            "verdict": r.run.verdict, "counts": r.run.counts,
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
