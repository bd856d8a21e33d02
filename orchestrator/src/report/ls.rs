//! The table `memra-orch ls` prints: every run under the receipts folder, newest first, one
//! line each with its start, run id, commit, manifest, overall verdict, duration, host and
//! counts per verdict (and how many of its receipts were carried from an earlier run).

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
    let hw = runs
        .iter()
        .map(|r| r.run.host.chars().count())
        .max()
        .unwrap_or(4)
        .max(4);
    let _ = writeln!(
        out,
        "{:<24}  {:<25}  {:<cw$}  {:<mw$}  {:<8}  {:>8}  {:<hw$}  counts",
        "start", "run", "commit", "manifest", "verdict", "seconds", "host"
    );
    for r in runs {
        let carried = carried_count(r);
        let line = format!(
            "{:<24}  {:<25}  {:<cw$}  {:<mw$}  {:<8}  {:>8}  {:<hw$}  {}{}",
            r.run.start,
            r.id_label(),
            short_commit(&r.commit),
            r.run.name,
            r.run.verdict,
            r.run.seconds.map_or("-".to_string(), |s| format!("{s:.1}")),
            r.run.host,
            counts_line(&r.run.counts),
            if carried > 0 {
                format!(" ({carried} carried)")
            } else {
                String::new()
            }
        );
        let line = if crate::receipt::resolve::unknown_age(&r.run.start) {
            format!("{line} (of unknown age: dated in the future or unparsable; listed last)")
        } else {
            line
        };
        let _ = writeln!(out, "{}", line.trim_end());
    }
    out
}

/// How many of a run's cells were carried from an earlier run.
pub fn carried_count(r: &FoundRun) -> usize {
    r.run.nodes.iter().filter(|n| n.carried.is_some()).count()
}
