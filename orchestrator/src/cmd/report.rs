//! `memra-orch report --html DIR`: reads the history of one manifest (the newest `--last`
//! runs), makes the report's view of it and writes the static site. Exit 0 when the site
//! was written, whatever the runs' verdicts: the report shows failures, it does not judge.

use crate::cmd::cli::ReportArgs;
use crate::history::{self, HistoryError};
use crate::receipt::resolve::receipts_root;
use crate::report::html::{SiteError, build, write_site};
use crate::words::exit::ExitCode;

/// The `report` subcommand.
pub fn command(args: &ReportArgs) -> ExitCode {
    let run = || -> Result<String, (ExitCode, String)> {
        let usage = |e: &dyn std::fmt::Display| (ExitCode::Usage, e.to_string());
        let receipts = receipts_root(args.receipts.as_deref()).map_err(|e| usage(&e))?;
        let manifest =
            history::pick_manifest(&receipts, args.manifest.as_deref()).map_err(|e| usage(&e))?;
        let opts = history::Options {
            last: Some(usize::try_from(args.last).unwrap_or(usize::MAX)),
            ..history::Options::default()
        };
        let history = history::load(&receipts, &manifest, &opts).map_err(|e| match e {
            HistoryError::Receipt(e) => (ExitCode::Internal, e.to_string()),
            e => usage(&e),
        })?;
        let view = build::view(history).map_err(|e| (ExitCode::Internal, e.to_string()))?;
        let written = write_site(&args.html, &view).map_err(|e| match e {
            SiteError::Io { .. } => (ExitCode::Internal, e.to_string()),
            SiteError::DiskFull { .. } => (ExitCode::DiskFull, e.to_string()),
            e => usage(&e),
        })?;
        // Remembered so that the next run's dirty check leaves the site out; a failure
        // only means it counts as a change.
        let _ = crate::receipt::own_outputs::record(&receipts, &args.html);
        Ok(format!(
            "wrote {} pages of {} ({} runs, {} cells) to {}{}{}\n",
            written.files.len().saturating_sub(written.unchanged),
            view.manifest,
            view.runs.len(),
            view.cells.len(),
            written.dir.join("index.html").display(),
            if written.unchanged > 0 {
                format!(
                    "; {} pages left as the last report wrote them",
                    written.unchanged
                )
            } else {
                String::new()
            },
            if written.removed > 0 {
                format!("; removed {} pages of the earlier report", written.removed)
            } else {
                String::new()
            }
        ))
    };
    match run() {
        Ok(text) => {
            print!("{text}");
            ExitCode::Ok
        }
        Err((code, message)) => {
            eprintln!("memra-orch report: {message}");
            code
        }
    }
}
