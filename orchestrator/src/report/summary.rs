//! The end-of-run summary: counts per verdict and a row per node that did not pass (every
//! node for small runs), as a terminal table and as the tree's `summary.md`. Ids and reasons
//! are escaped for both (control characters; `|` in markdown).

use std::fmt::Write;

use crate::receipt::tree::Tree;
use crate::receipt::{NodeIndexEntry, NodeReceipt, RunReceipt};
use crate::words::escape;
use crate::words::outcome::RunOutcome;
use crate::words::verdict::Verdict;

/// Runs with at most this many nodes list every node in the terminal table.
const LIST_ALL_UP_TO: usize = 30;

/// The terminal table printed after a run.
pub fn table(receipts: &[Option<Box<NodeReceipt>>], outcome: &RunOutcome, tree: &Tree) -> String {
    let mut rows: Vec<(&'static str, f64, String, String)> = Vec::new();
    let listed = outcome.verdicts.len() <= LIST_ALL_UP_TO;
    let mut warned = 0;
    for r in receipts.iter().flatten() {
        let warning = r.warning_line();
        warned += usize::from(warning.is_some());
        if listed || r.verdict != Verdict::Pass || warning.is_some() {
            let reason = match (&r.reason, &warning) {
                (Some(why), Some(w)) => format!("{why}; {w}"),
                (None, Some(w)) => w.clone(),
                (why, None) => why.clone().unwrap_or_default(),
            };
            rows.push((
                shown_verdict(r.verdict, warning.is_some()),
                r.seconds,
                escape::control(&r.id).into_owned(),
                reason,
            ));
        }
    }
    let mut out = String::new();
    if !rows.is_empty() {
        let id_w = rows
            .iter()
            .map(|r| r.2.chars().count())
            .max()
            .unwrap_or(4)
            .clamp(4, 60);
        let _ = writeln!(
            out,
            "{:<9} {:>8}  {:<id_w$}  reason",
            "verdict", "seconds", "node"
        );
        for (v, s, id, reason) in &rows {
            let row = format!(
                "{:<9} {:>8.2}  {:<id_w$}  {}",
                v,
                s,
                id,
                one_line(reason, 100)
            );
            let _ = writeln!(out, "{}", row.trim_end());
        }
        out.push('\n');
    }
    let count = |check: &str| {
        receipts
            .iter()
            .flatten()
            .filter(|r| r.checks.iter().any(|c| c.check == check))
            .count()
    };
    let attested = count(crate::report::attest::CHECK);
    if attested > 0 {
        let _ = writeln!(
            out,
            "warning: {attested} cells report \"{}\" (their doors rows match a cell with another value of the pin); see summary.md",
            crate::report::attest::CHECK
        );
    }
    let unread = count(crate::report::attest::UNREAD);
    if unread > 0 {
        let _ = writeln!(
            out,
            "warning: {unread} cells report \"{}\" (a pin their gate did not report reading); see summary.md",
            crate::report::attest::UNREAD
        );
    }
    if warned > 0 {
        let _ = writeln!(
            out,
            "warn: {warned} cell{} reported warn rows (listed above; `memra-orch show RUN CELL` has them all)",
            if warned == 1 { "" } else { "s" }
        );
    }
    out.push_str(&footer(outcome, tree));
    out
}

/// The verdict as tables show it: `pass+warn` for a pass with warn rows.
fn shown_verdict(v: Verdict, warned: bool) -> &'static str {
    match (v, warned) {
        (Verdict::Pass, true) => "pass+warn",
        _ => v.as_str(),
    }
}

/// The last two lines of the table, the counts and how the run ended: all that
/// `--progress quiet` prints.
pub fn footer(outcome: &RunOutcome, tree: &Tree) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "{}", counts_line(&outcome.counts));
    let _ = writeln!(
        out,
        "{} in {:.1}s; receipts: {}",
        if outcome.interrupted {
            "interrupted".to_string()
        } else if outcome.only_the_hardware() {
            format!(
                "the HARDWARE failed (quarantined: {}; exit 69), every cell otherwise as expected",
                outcome
                    .quarantined
                    .iter()
                    .map(|g| format!("gpu {g}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        } else if outcome.all_as_expected() {
            "all as expected".to_string()
        } else {
            "NOT all as expected".to_string()
        },
        outcome.elapsed.as_secs_f64(),
        tree.dir.display()
    );
    out
}

/// `pass 12, fail 1, skipped 2` (verdicts with zero nodes left out).
pub fn counts_line(counts: &std::collections::BTreeMap<Verdict, usize>) -> String {
    let parts: Vec<String> = counts
        .iter()
        .filter(|(_, n)| **n > 0)
        .map(|(v, n)| format!("{v} {n}"))
        .collect();
    if parts.is_empty() {
        "no nodes".to_string()
    } else {
        parts.join(", ")
    }
}

/// `summary.md` of a finished run.
pub fn markdown(run: &RunReceipt) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "# {} at {}\n", run.name, run.commit);
    let _ = writeln!(
        out,
        "Verdict: **{}**{} — {}; started {}, {:.1}s on {}.\n",
        run.verdict,
        if run.interrupted {
            " (interrupted)"
        } else {
            ""
        },
        counts_line(&run.counts),
        run.start,
        run.seconds.unwrap_or(0.0),
        md_escape(&run.host),
    );
    if let Some(id) = &run.run_id {
        let _ = writeln!(out, "Run `{id}`.\n");
    }
    let carried = run.carried_count();
    if carried > 0 {
        let _ = writeln!(
            out,
            "{carried} of {} receipts were carried forward from earlier runs (marked below); they were not measured by this run.\n",
            run.nodes.len()
        );
    }
    if let Some(unmet) = &run.unmet {
        let _ = writeln!(out, "**Requirement not met:** {}\n", md_escape(unmet));
    }
    if !run.quarantined_gpus.is_empty() {
        let _ = writeln!(
            out,
            "**Device faults:** the hardware failed, not the code; these GPUs took no new cells for the rest of the run:\n"
        );
        for q in &run.quarantined_gpus {
            let md = |t: &str| md_escape(t);
            let code = |t: &str| format!("`{}`", md_escape(t));
            let _ = writeln!(out, "- {}", q.line(&md, &code));
        }
        out.push('\n');
    }
    let warned = run.nodes.iter().filter(|n| n.warns > 0).count();
    if warned > 0 {
        let rows: u32 = run.nodes.iter().map(|n| n.warns).sum();
        let _ = writeln!(
            out,
            "**Warnings:** {warned} cell{} reported {rows} warn row{} (verdict `pass+warn` below).\n",
            if warned == 1 { "" } else { "s" },
            if rows == 1 { "" } else { "s" },
        );
    }
    let _ = writeln!(out, "| node | kind | verdict | seconds | reason |");
    let _ = writeln!(out, "|---|---|---|---:|---|");
    let mut nodes: Vec<&NodeIndexEntry> = run.nodes.iter().collect();
    // Problems first, then warnings, then in plan order.
    nodes.sort_by_key(|n| {
        let fine = n.verdict == Verdict::Pass || n.verdict == Verdict::Skipped;
        (fine, n.warns == 0)
    });
    for n in nodes {
        let reason = match (n.reason.as_deref(), n.warning.as_deref()) {
            (Some(r), Some(w)) => format!("{r}; {w}"),
            (None, Some(w)) => w.to_string(),
            (r, None) => r.unwrap_or("").to_string(),
        };
        let reason = reason.as_str();
        let reason = match &n.carried {
            Some(c) if reason.is_empty() => format!("carried from {}", c.label()),
            Some(c) => format!("carried from {}; {reason}", c.label()),
            None => reason.to_string(),
        };
        let _ = writeln!(
            out,
            "| {} | {} | {} | {:.2} | {} |",
            md_escape(&n.id),
            serde_json::to_value(n.kind)
                .ok()
                .and_then(|v| v.as_str().map(str::to_string))
                .unwrap_or_default(),
            shown_verdict(n.verdict, n.warns > 0),
            n.seconds,
            md_escape(&one_line(&reason, 200)),
        );
    }
    out
}

/// `s` on one line (line breaks become spaces, other control characters escapes), cut to
/// `max` characters.
pub fn one_line(s: &str, max: usize) -> String {
    let spaced: String = s
        .chars()
        .map(|c| if c == '\n' || c == '\r' { ' ' } else { c })
        .collect();
    let flat = escape::control(&spaced).into_owned();
    if flat.chars().count() <= max {
        flat
    } else {
        let cut: String = flat.chars().take(max).collect();
        format!("{cut}…")
    }
}

/// Text for a markdown table cell: control characters escaped, `|` too.
fn md_escape(s: &str) -> String {
    escape::control(s).replace('|', "\\|")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::NodeKind;
    use crate::receipt::NodeReceipt;
    use crate::words::verdict::count;

    #[test]
    fn markdown_lists_problems_first_and_escapes_pipes() {
        let entry = |id: &str, verdict, reason: Option<&str>| NodeIndexEntry {
            id: id.into(),
            kind: NodeKind::Arm,
            slug: None,
            verdict,
            seconds: 1.0,
            reason: reason.map(str::to_string),
            carried: None,
            warns: 0,
            warning: None,
        };
        let run = RunReceipt {
            schema: 1,
            run_id: None,
            carried_from: None,
            rerun_failed: false,
            name: "smoke".into(),
            manifest: crate::receipt::FileDigest {
                path: "m".into(),
                bytes: 0,
                sha256: String::new(),
            },
            env_matrices: vec![],
            commit: "abc".into(),
            commit_sha: None,
            commit_subject: None,
            dirty: false,
            code: None,
            fingerprints: Vec::new(),
            host: "h".into(),
            orchestrator_version: "0".into(),
            inventory: serde_json::Value::Null,
            cpu_slots: 1,
            filters: vec![],
            resumed: false,
            vars: Default::default(),
            start: "t".into(),
            end: Some("t".into()),
            seconds: Some(2.0),
            interrupted: false,
            unmet: None,
            disk_full: None,
            excluded_gpus: Vec::new(),
            quarantined_gpus: Vec::new(),
            counts: count([Verdict::Pass, Verdict::Fail]),
            verdict: "fail".into(),
            nodes: vec![
                entry("a", Verdict::Pass, None),
                entry("b|c", Verdict::Fail, Some("check x failed\nmore")),
            ],
        };
        let md = markdown(&run);
        let b = md.find("b\\|c").unwrap();
        let a = md.find("| a |").unwrap();
        assert!(b < a, "{md}");
        assert!(md.contains("check x failed more"));
        assert!(md.contains("pass 1, fail 1"));
    }

    fn receipt(
        id: &str,
        verdict: Verdict,
        seconds: f64,
        reason: Option<&str>,
    ) -> Option<Box<NodeReceipt>> {
        let mut r = NodeReceipt::new(id.into(), id.into(), NodeKind::Arm, format!("{id}-0"));
        r.verdict = verdict;
        r.seconds = seconds;
        r.reason = reason.map(str::to_string);
        Some(Box::new(r))
    }

    #[test]
    fn terminal_table_snapshot() {
        let receipts = vec![
            receipt("build", Verdict::Pass, 12.5, None),
            receipt(
                "decode-batch[batch=4]",
                Verdict::Fail,
                3.25,
                Some("check gate2 failed: row 1 differs"),
            ),
            receipt(
                "canary",
                Verdict::Pass,
                0.5,
                Some("failed as expected: exit code 1"),
            ),
            receipt(
                "pp[gpus=8]",
                Verdict::Skipped,
                0.0,
                Some("needs 8 GPUs, 4 detected"),
            ),
            receipt(
                "after",
                Verdict::Blocked,
                0.0,
                Some("needs decode-batch[batch=4], which ended fail"),
            ),
        ];
        let verdicts: Vec<Verdict> = receipts.iter().flatten().map(|r| r.verdict).collect();
        let outcome = RunOutcome {
            counts: count(verdicts.iter().copied()),
            verdicts,
            interrupted: false,
            elapsed: std::time::Duration::from_millis(16_250),
            lacked_resources: 1,
            require_gpus: None,
            disk_full: None,
            quarantined: Vec::new(),
        };
        let tree = Tree {
            dir: std::path::PathBuf::from("/r/abc123-dirty/nightly/20261201T000000.000Z-abcd"),
        };
        insta::assert_snapshot!(table(&receipts, &outcome, &tree));
    }
}
