//! `memra-orch diff [OLD NEW]`: finds the two receipt trees, reads them side by side,
//! compares them under the thresholds given, sets the flaky and nondeterministic cells apart,
//! reads the artifacts whose bits moved (unless `--no-read`) and prints the result. Without
//! names it is the morning command: the latest run against the one before it, and also
//! against the last green run when that is older. Exit 1 when anything regressed (lost
//! coverage included, unless `--allow-lost`; flaky cells too with `--flaky-fails`).

use std::path::Path;

use crate::ExitCode;
use crate::cli::DiffArgs;
use crate::diff::render::DiffFormat;
use crate::diff::{Diff, Thresholds, diff, load_for_diff, render};
use crate::receipt::error::FindError;
use crate::receipt::resolve;

/// The `diff` subcommand.
pub fn command(args: &DiffArgs) -> ExitCode {
    match command_inner(args) {
        Ok(code) => code,
        Err(message) => {
            eprintln!("memra-orch diff: {message}");
            ExitCode::Usage
        }
    }
}

fn command_inner(args: &DiffArgs) -> Result<ExitCode, FindError> {
    let receipts = resolve::receipts_root(args.receipts.as_deref())?;
    let manifest = args.manifest.as_deref();
    let (Some(old), Some(new)) = (&args.old, &args.new) else {
        return morning(args, &receipts);
    };
    let old_dir = resolve::resolve(old, &receipts, manifest)?;
    let new_dir = resolve::resolve(new, &receipts, manifest)?;
    if same_run(&old_dir, &new_dir) {
        // Comparing a run with itself would print "no differences" and hide what changed
        // since the run before (a green night named by both `last-green` and `latest`).
        let note = format!(
            "{old} and {new} name the same run ({}): there is nothing between them to compare; \
             `memra-orch diff` with no names compares the latest run with the one before it \
             (and with the last green one when that is older)",
            new_dir.display()
        );
        match args.format {
            DiffFormat::Json => println!(
                "{}",
                serde_json::json!({ "same_run": new_dir.to_string_lossy(), "note": note })
            ),
            _ => println!("{note}"),
        }
        return Ok(ExitCode::Ok);
    }
    let d = compare(args, &old_dir, &new_dir)?;
    print!("{}", render::render(&d, args.format, args.color));
    Ok(exit_code(&d))
}

/// `diff` without names.
fn morning(args: &DiffArgs, receipts: &Path) -> Result<ExitCode, FindError> {
    let m = resolve::morning(receipts, args.manifest.as_deref())?;
    if !m.others.is_empty() && args.manifest.is_none() && args.format != DiffFormat::Json {
        eprintln!(
            "memra-orch diff: comparing runs of `{}`; the receipts also hold runs of {} (name one with --manifest)",
            m.manifest,
            m.others
                .iter()
                .map(|n| format!("`{n}`"))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    // A newer run that never finished is not compared (its cells would read as lost), but
    // it is no good news either: named, and the exit code is 1.
    for u in &m.unfinished {
        eprintln!(
            "memra-orch diff: run {} of `{}` (started {}) has not finished: it is still going,              or it was killed; comparing the newest finished run, {}",
            u.id_label(),
            m.manifest,
            u.run.start,
            m.latest.id_label()
        );
    }
    let unfinished = !m.unfinished.is_empty();
    let Some(previous) = &m.previous else {
        let green = resolve::green(&m.latest);
        let note = format!(
            "only one run of `{}` ({}, {}): there is nothing to compare it with yet",
            m.manifest,
            m.latest.id_label(),
            if green {
                "green"
            } else {
                "NOT all as expected"
            }
        );
        match args.format {
            DiffFormat::Json => println!(
                "{}",
                serde_json::json!({ "only_run": m.latest.dir.to_string_lossy(), "green": green, "note": note })
            ),
            _ => println!("{note}"),
        }
        // Nothing to compare is no proof of health: the exit is the run's own.
        return Ok(if green && !unfinished {
            ExitCode::Ok
        } else {
            ExitCode::NotAsExpected
        });
    };
    let main = compare(args, &previous.dir, &m.latest.dir)?;
    let since_green = match &m.last_green {
        Some(g) => Some(compare(args, &g.dir, &m.latest.dir)?),
        None => None,
    };
    let regressed =
        unfinished || main.regressed() || since_green.as_ref().is_some_and(Diff::regressed);
    match args.format {
        DiffFormat::Json => {
            let value = serde_json::json!({
                "previous": main,
                "since_last_green": since_green,
            });
            println!(
                "{}",
                serde_json::to_string_pretty(&value).unwrap_or_else(|e| e.to_string())
            );
        }
        DiffFormat::Text | DiffFormat::Markdown => {
            print!("{}", render::render(&main, args.format, args.color));
            if let Some(g) = &since_green {
                let title = "since the last green run";
                match args.format {
                    DiffFormat::Markdown => println!("\n---\n\n# {title}\n"),
                    _ => println!("\n== {title} ==\n"),
                }
                print!("{}", render::render(g, args.format, args.color));
            }
        }
    }
    Ok(if regressed {
        ExitCode::NotAsExpected
    } else {
        ExitCode::Ok
    })
}

/// The diff of two run folders, classified and quantified as the flags ask.
fn compare(args: &DiffArgs, old_dir: &Path, new_dir: &Path) -> Result<Diff, FindError> {
    let thresholds = Thresholds {
        metric_rel: args.metric_rel,
        metric_abs: args.metric_abs,
        duration_abs: args.duration_abs.as_secs_f64(),
        duration_rel: args.duration_rel,
    };
    let (old, new) = rayon::join(|| load_for_diff(old_dir), || load_for_diff(new_dir));
    let (old, new) = (old?, new?);
    let mut d = diff(&old, &new, &thresholds);
    d.allow_lost = args.allow_lost;
    d.flaky_fails = args.flaky_fails;
    let window = usize::try_from(args.flaky_window).unwrap_or(usize::MAX);
    crate::diff::flaky::classify(&mut d, &old, &new, window);
    if !args.no_read {
        crate::diff::quantify::read_moved(&mut d, &old, &new);
    }
    Ok(d)
}

fn exit_code(d: &Diff) -> ExitCode {
    if d.regressed() {
        ExitCode::NotAsExpected
    } else {
        ExitCode::Ok
    }
}

fn same_run(a: &Path, b: &Path) -> bool {
    match (std::fs::canonicalize(a), std::fs::canonicalize(b)) {
        (Ok(x), Ok(y)) => x == y,
        _ => a == b,
    }
}
