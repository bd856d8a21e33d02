//! The table `memra-orch ls` prints: every run under the receipts folder, newest first, one
//! line each with its start, run id, commit, manifest, overall verdict, duration, host and
//! counts per verdict (and how many of its receipts were carried from an earlier run).

use std::fmt::Write;

use crate::receipt::commit::short_commit;
use crate::receipt::resolve::RunHead;
use crate::report::summary::counts_line;

/// Renders the run list as a table.
pub fn table(runs: &[RunHead]) -> String {
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
        .map(|r| r.name.chars().count())
        .max()
        .unwrap_or(8)
        .max(8);
    let hw = runs
        .iter()
        .map(|r| r.host.chars().count())
        .max()
        .unwrap_or(4)
        .max(4);
    let _ = writeln!(
        out,
        "{:<24}  {:<25}  {:<cw$}  {:<mw$}  {:<8}  {:>8}  {:<hw$}  counts",
        "start", "run", "commit", "manifest", "verdict", "seconds", "host"
    );
    for r in runs {
        let carried = r.carried;
        let line = format!(
            "{:<24}  {:<25}  {:<cw$}  {:<mw$}  {:<8}  {:>8}  {:<hw$}  {}{}",
            r.start,
            r.id_label(),
            short_commit(&r.commit),
            r.name,
            r.verdict,
            r.seconds.map_or("-".to_string(), |s| format!("{s:.1}")),
            r.host,
            counts_line(&r.counts),
            if carried > 0 {
                format!(" ({carried} carried)")
            } else {
                String::new()
            }
        );
        let line = if crate::receipt::resolve::unknown_age(&r.start) {
            format!("{line} (of unknown age: dated in the future or unparsable; listed last)")
        } else {
            line
        };
        let _ = writeln!(out, "{}", line.trim_end());
    }
    out
}
