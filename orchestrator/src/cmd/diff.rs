//! `memra-orch diff [OLD NEW]`: finds the two receipt trees, reads them side by side,
//! compares them under the thresholds given, sets the flaky and nondeterministic cells apart,
//! reads the artifacts whose bits moved (unless `--no-read`) and prints the result. Without
//! names it is the morning command: the latest run against the one before it, and also
//! against the last green run when that is older. Exit 1 when anything regressed (lost
//! coverage included, unless `--allow-lost`; flaky cells too with `--flaky-fails`).

use std::path::Path;

use crate::cmd::cli::DiffArgs;
use crate::diff::render::DiffFormat;
use crate::diff::{CompareOptions, Diff, Thresholds, compare_runs, render};
use crate::receipt::error::FindError;
use crate::receipt::resolve;
use crate::words::exit::ExitCode;

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
    // The runs are named from the history index, listed once for both names.
    let heads = crate::history::heads::remembered();
    let old_dir = resolve::resolve_with(old, &receipts, manifest, &heads)?;
    let new_dir = resolve::resolve_with(new, &receipts, manifest, &heads)?;
    if same_run(&old_dir, &new_dir) {
        // Comparing a run with itself would print "no differences" and hide what changed
        // since the run before (a green night named by both `last-green` and `latest`).
        let note = format!(
            "{old} and {new} name the same run ({}): there is nothing between them to compare; \
             `memra-orch diff` with no names compares the latest run with the one before it \
             (and with the last green one when that is older)",
            new_dir.display()
        );
        // Nothing between them is no proof of health: the run's own state decides.
        let green =
            crate::receipt::read_json::<crate::receipt::RunReceipt>(&new_dir.join("run.json"))
                .ok()
                .flatten()
                .is_some_and(|r| {
                    r.end.is_some() && r.counts.iter().all(|(v, n)| *n == 0 || v.as_expected())
                });
        match args.format {
            DiffFormat::Json => println!(
                "{}",
                serde_json::json!({ "same_run": new_dir.to_string_lossy(), "green": green, "note": note })
            ),
            _ => println!(
                "{note}{}",
                if green {
                    ""
                } else {
                    "; that run is NOT all as expected"
                }
            ),
        }
        return Ok(if green {
            ExitCode::Ok
        } else {
            ExitCode::NotAsExpected
        });
    }
    let d = compare(args, &old_dir, &new_dir)?;
    print!(
        "{}",
        shown(render::render(&d, args.format, args.color), args)
    );
    Ok(exit_code(&d))
}

/// `diff` without names: for the manifest named, or for every manifest with runs.
fn morning(args: &DiffArgs, receipts: &Path) -> Result<ExitCode, FindError> {
    let mornings = resolve::morning(receipts, args.manifest.as_deref())?;
    let several = mornings.len() > 1;
    let mut bad = false;
    let mut json = serde_json::Map::new();
    for m in &mornings {
        if several && args.format != DiffFormat::Json {
            match args.format {
                DiffFormat::Markdown => println!("# {}\n", m.manifest),
                _ => println!("=== {} ===\n", m.manifest),
            }
        }
        let (value, regressed) = one_morning(args, m)?;
        bad |= regressed;
        json.insert(m.manifest.clone(), value);
        if several && args.format != DiffFormat::Json {
            println!();
        }
    }
    if args.format == DiffFormat::Json {
        let value = if several || args.manifest.is_none() {
            serde_json::Value::Object(json)
        } else {
            json.into_iter().next().map(|(_, v)| v).unwrap_or_default()
        };
        println!(
            "{}",
            serde_json::to_string_pretty(&value).unwrap_or_else(|e| e.to_string())
        );
    }
    Ok(if bad {
        ExitCode::NotAsExpected
    } else {
        ExitCode::Ok
    })
}

/// The morning of one manifest: printed (text, markdown) or returned (json), and whether it
/// is bad news (a regression, an unfinished run, or a single run that is not green).
fn one_morning(
    args: &DiffArgs,
    m: &resolve::Morning,
) -> Result<(serde_json::Value, bool), FindError> {
    // A run that never finished is not compared (its cells would read as lost), but it is
    // no good news either: named, and the exit code is 1.
    for u in &m.unfinished {
        eprintln!(
            "memra-orch diff: run {} of `{}` (started {}) has not finished: it is still going, or it was killed; it is compared with nothing",
            u.id_label(),
            m.manifest,
            u.run.start
        );
    }
    let unfinished: Vec<String> = m
        .unfinished
        .iter()
        .map(|u| u.id_label().to_string())
        .collect();
    let Some(previous) = &m.previous else {
        let green = resolve::green(&m.latest);
        let note = format!(
            "only one finished run of `{}` ({}, {}): there is nothing to compare it with yet",
            m.manifest,
            m.latest.id_label(),
            if green {
                "green"
            } else {
                "NOT all as expected"
            }
        );
        if args.format != DiffFormat::Json {
            println!("{note}");
        }
        // Nothing to compare is no proof of health: the run's own state decides.
        let value = serde_json::json!({
            "only_run": m.latest.dir.to_string_lossy(),
            "green": green,
            "unfinished": unfinished,
            "note": note,
        });
        return Ok((value, !green || !m.unfinished.is_empty()));
    };
    let main = compare(args, &previous.dir, &m.latest.dir)?;
    let since_green = match &m.last_green {
        Some(g) => Some(compare(args, &g.dir, &m.latest.dir)?),
        None => None,
    };
    if args.format != DiffFormat::Json {
        print!(
            "{}",
            shown(render::render(&main, args.format, args.color), args)
        );
        if let Some(g) = &since_green {
            let title = "since the last green run";
            match args.format {
                DiffFormat::Markdown => println!("\n---\n\n## {title}\n"),
                _ => println!("\n== {title} ==\n"),
            }
            print!(
                "{}",
                shown(render::render(g, args.format, args.color), args)
            );
        }
        if !m.unfinished.is_empty() {
            println!(
                "\nNOT all finished: {} run(s) of `{}` never finished ({}); see stderr",
                m.unfinished.len(),
                m.manifest,
                unfinished.join(", ")
            );
        }
    }
    let regressed = !m.unfinished.is_empty()
        || main.regressed()
        || since_green.as_ref().is_some_and(Diff::regressed);
    let value = serde_json::json!({
        "previous": main,
        "since_last_green": since_green,
        "unfinished": unfinished,
    });
    Ok((value, regressed))
}

/// The diff of two run folders, classified and quantified as the flags ask.
fn compare(args: &DiffArgs, old_dir: &Path, new_dir: &Path) -> Result<Diff, FindError> {
    let options = CompareOptions {
        thresholds: Thresholds {
            metric_rel: args.metric_rel,
            metric_abs: args.metric_abs,
            duration_abs: args.duration_abs.as_secs_f64(),
            duration_rel: args.duration_rel,
        },
        allow_lost: args.allow_lost,
        flaky_fails: args.flaky_fails,
        flaky_window: usize::try_from(args.flaky_window).unwrap_or(usize::MAX),
        read: !args.no_read,
    };
    Ok(compare_runs(old_dir, new_dir, &options)?.0)
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

/// A rendered diff as printed: cell names, messages and subjects came from manifests and
/// gates, so control and bidirectional characters are escaped (the colours' ESC kept); JSON
/// escapes its own.
fn shown(text: String, args: &DiffArgs) -> String {
    match args.format {
        DiffFormat::Json => text,
        _ => crate::words::escape::terminal(&text, crate::diff::render::use_color(args.color))
            .into_owned(),
    }
}
