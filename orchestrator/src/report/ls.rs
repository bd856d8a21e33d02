//! The table `memra-orch ls` prints: every run under the receipts folder, newest first, one
//! line each with its commit, manifest, start, overall verdict and counts per verdict.

use std::fmt::Write;

use crate::commit::short_commit;
use crate::receipt::resolve::FoundRun;
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
