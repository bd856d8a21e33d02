//! `memra-orch summary [RUN]`: the morning message of one run (default: the newest finished
//! run of the manifest) against the run before it, the last green run before it, or a run
//! named, in at most 15 lines (`report::morning`). Exit 0 when the night is green, 1 when it
//! is not (the run not all as expected, a regression, a run that never finished), 2 for a
//! bad argument or a receipts folder that names no such run.

use std::path::{Path, PathBuf};

use crate::cmd::cli::SummaryArgs;
use crate::receipt::resolve;
use crate::report::morning::{self, Brief, Since};
use crate::words::exit::ExitCode;

/// The `summary` subcommand.
pub fn command(args: &SummaryArgs) -> ExitCode {
    let brief = (|| -> Result<Brief, String> {
        let receipts =
            resolve::receipts_root(args.receipts.as_deref()).map_err(|e| e.to_string())?;
        let manifest = args.manifest.as_deref().map(manifest_name).transpose()?;
        let subject = match &args.run {
            Some(spec) => resolve::resolve_with(
                spec,
                &receipts,
                manifest.as_deref(),
                &crate::history::heads::heads,
            )
            .map_err(|e| e.to_string())?,
            None => newest_finished(&receipts, manifest.as_deref())?,
        };
        morning::for_run(
            &receipts,
            &subject,
            &Since::parse(&args.since),
            args.report_url.as_deref(),
            args.allow_lost,
        )
    })();
    match brief {
        Ok(b) => {
            let text = morning::render(&b, args.format);
            match args.format {
                morning::SummaryFormat::Json => print!("{text}"),
                _ => print!("{}", crate::words::escape::terminal(&text, false)),
            }
            if b.green() {
                ExitCode::Ok
            } else {
                ExitCode::NotAsExpected
            }
        }
        Err(message) => {
            eprintln!("memra-orch summary: {message}");
            ExitCode::Usage
        }
    }
}

/// `--manifest`: a manifest's name, or the path of a manifest file (whose `name` is read).
fn manifest_name(arg: &str) -> Result<String, String> {
    let path = Path::new(arg);
    if !path.is_file() {
        return Ok(arg.to_string());
    }
    crate::load::load_plan_with_vars(path, &[])
        .map(|p| p.name)
        .map_err(|d| format!("--manifest {arg}: {d}"))
}

/// The newest finished run of `manifest`, or of the only manifest with runs.
fn newest_finished(receipts: &Path, manifest: Option<&str>) -> Result<PathBuf, String> {
    let runs = resolve::list_runs(receipts).map_err(|e| e.to_string())?;
    let mut names: Vec<&str> = Vec::new();
    for r in &runs {
        if !names.contains(&r.run.name.as_str()) {
            names.push(&r.run.name);
        }
    }
    let name = match manifest {
        Some(m) => m,
        None => match names.as_slice() {
            [] => {
                return Err(format!(
                    "no run under {}; run `memra-orch run MANIFEST` first or pass --receipts DIR",
                    receipts.display()
                ));
            }
            [one] => one,
            several => {
                return Err(format!(
                    "{} holds runs of several manifests ({}); name one with --manifest NAME",
                    receipts.display(),
                    several.join(", ")
                ));
            }
        },
    };
    runs.iter()
        .find(|r| r.run.name == name && r.complete() && !resolve::unknown_age(&r.run.start))
        .map(|r| r.dir.clone())
        .ok_or_else(|| {
            format!(
                "no finished run of manifest {name:?} under {}{}",
                receipts.display(),
                if names.is_empty() {
                    String::new()
                } else {
                    format!(" (it holds runs of: {})", names.join(", "))
                }
            )
        })
}
