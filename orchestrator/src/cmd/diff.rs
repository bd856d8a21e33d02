//! `memra-orch diff OLD NEW`: finds the two receipt trees, reads them side by side, compares
//! them under the thresholds given, sets the flaky and nondeterministic cells apart and
//! prints the result. Exit 1 when anything regressed (lost coverage included, unless
//! `--allow-lost`; flaky cells too with `--flaky-fails`).

use crate::ExitCode;
use crate::cli::DiffArgs;
use crate::diff::{Thresholds, diff, load_for_diff, render};
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
    let thresholds = Thresholds {
        metric_rel: args.metric_rel,
        metric_abs: args.metric_abs,
        duration_abs: args.duration_abs.as_secs_f64(),
        duration_rel: args.duration_rel,
    };
    let receipts = resolve::receipts_root(args.receipts.as_deref())?;
    let manifest = args.manifest.as_deref();
    let old_dir = resolve::resolve(&args.old, &receipts, manifest)?;
    let new_dir = resolve::resolve(&args.new, &receipts, manifest)?;
    let (old, new) = rayon::join(|| load_for_diff(&old_dir), || load_for_diff(&new_dir));
    let (old, new) = (old?, new?);
    let mut d = diff(&old, &new, &thresholds);
    d.allow_lost = args.allow_lost;
    d.flaky_fails = args.flaky_fails;
    let window = usize::try_from(args.flaky_window).unwrap_or(usize::MAX);
    crate::diff::flaky::classify(&mut d, &old, &new, window);
    print!("{}", render::render(&d, args.format, args.color));
    Ok(if d.regressed() {
        ExitCode::NotAsExpected
    } else {
        ExitCode::Ok
    })
}
