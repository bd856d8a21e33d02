//! What `memra-orch show` prints of a stored run: the run view (header and a row per node,
//! problems first) and the node view (command, pins, attempts, checks, doors, artifacts,
//! a compare's report as a table, where its logs are). Control characters a gate wrote
//! (ESC, NUL, …) are printed escaped, never raw, so a receipt cannot drive the terminal.
//! It formats a loaded tree only; finding and reading it is `receipt`'s job.

use std::fmt::Write;

use crate::gate::judge::CompareReport;
use crate::plan::Policy;
use crate::receipt::NodeReceipt;
use crate::receipt::commit::short_commit;
use crate::receipt::load::{LoadedNode, LoadedRun};
use crate::receipt::tree::Tree;
use crate::report::summary::counts_line;
use crate::words::verdict::Verdict;

/// The run view: header, then every node, problems first.
pub fn run_text(run: &LoadedRun) -> String {
    let r = &run.run;
    let mut out = String::new();
    let _ = writeln!(out, "{} at {}", r.name, short_commit(&r.commit));
    let _ = writeln!(out, "  folder:   {}", run.dir.display());
    if let Some(id) = &r.run_id {
        let _ = writeln!(out, "  run:      {id}");
    }
    let carried = run
        .nodes
        .values()
        .filter(|n| n.entry.carried.is_some())
        .count();
    if carried > 0 {
        let _ = writeln!(
            out,
            "  carried:  {carried} of {} receipts from earlier runs ({})",
            run.nodes.len(),
            r.carried_from.as_deref().unwrap_or("-")
        );
    }
    let _ = writeln!(
        out,
        "  verdict:  {}{} — {}",
        r.verdict,
        if r.interrupted { " (interrupted)" } else { "" },
        counts_line(&r.counts)
    );
    for q in &r.quarantined_gpus {
        let plain = |t: &str| t.to_string();
        let _ = writeln!(
            out,
            "  quarantined after a device fault: {}",
            q.line(&plain, &plain)
        );
    }
    if !r.excluded_gpus.is_empty() {
        let _ = writeln!(out, "  excluded: {}", r.excluded_gpus.join(", "));
    }
    let _ = writeln!(
        out,
        "  started:  {}, {} on {}",
        r.start,
        r.seconds
            .map_or("still running or killed".to_string(), |s| format!(
                "{s:.1}s"
            )),
        r.host
    );
    let _ = writeln!(
        out,
        "  manifest: {} (sha256 {})",
        r.manifest.path, r.manifest.sha256
    );
    let mut nodes: Vec<&LoadedNode> = run.nodes.values().collect();
    nodes.sort_by_key(|n| (n.entry.verdict.as_expected(), n.entry.id.clone()));
    let w = nodes
        .iter()
        .map(|n| n.entry.id.chars().count())
        .max()
        .unwrap_or(4)
        .clamp(4, 60);
    let _ = writeln!(
        out,
        "\n{:<9} {:>8}  {:<w$}  reason",
        "verdict", "seconds", "node"
    );
    for n in nodes {
        let mut warn = if n
            .receipt
            .as_ref()
            .is_some_and(crate::report::attest::has_warning)
        {
            " [warning: pin had no effect]".to_string()
        } else {
            String::new()
        };
        if let Some(c) = &n.entry.carried {
            warn.push_str(&format!(" [carried from {}]", c.label()));
        }
        let line = format!(
            "{:<9} {:>8.2}  {:<w$}  {}{}",
            n.entry.verdict.as_str(),
            n.entry.seconds,
            n.entry.id,
            n.entry.reason.as_deref().unwrap_or("").replace('\n', " "),
            warn
        );
        let _ = writeln!(out, "{}", line.trim_end());
    }
    escape_controls(&out)
}

/// The node view.
// Over 150 lines: a renderer: the node view's sections (attempts, checks, doors, artifacts,
// compare report) one after another.
pub fn node_text(run: &LoadedRun, r: &NodeReceipt) -> String {
    let carried = run.nodes.get(&r.id).and_then(|n| n.entry.carried.clone());
    // A carried receipt's logs are in the tree of the run that measured it.
    let tree = Tree {
        dir: carried
            .as_ref()
            .and_then(|c| c.source_dir(&run.dir))
            .unwrap_or_else(|| run.dir.clone()),
    };
    let mut out = String::new();
    let _ = writeln!(out, "{} ({})", r.id, r.kind.as_str());
    if let Some(c) = &carried {
        let _ = writeln!(out, "  carried:   from run {}", c.label());
    }
    let _ = writeln!(
        out,
        "  verdict:   {} (expect {})",
        r.verdict,
        r.expect.as_str()
    );
    if let Some(reason) = &r.reason {
        let _ = writeln!(
            out,
            "  reason:    {}",
            reason.replace('\n', "\n             ")
        );
    }
    // A packed run keeps the folder in its archive (`receipt::pack`).
    let packed = crate::gate::packed::locate(&tree.node_dir(&r.slug)).map(|(p, _)| p);
    match &packed {
        Some(pack) => {
            let _ = writeln!(out, "  folder:    nodes/{} in {}", r.slug, pack.display());
        }
        None => {
            let _ = writeln!(out, "  folder:    {}", tree.node_dir(&r.slug).display());
        }
    }
    if !r.argv.is_empty() {
        let _ = writeln!(out, "  command:   {}", r.argv.join(" "));
        let _ = writeln!(out, "  cwd:       {}", r.cwd);
    }
    if !r.cell.is_empty() {
        let axes: Vec<String> = r.cell.iter().map(|(k, v)| format!("{k}={v}")).collect();
        let _ = writeln!(out, "  cell:      {}", axes.join(" "));
    }
    for g in &r.gpus {
        let _ = writeln!(out, "  gpu:       {} {} {}", g.index, g.name, g.uuid);
    }
    for b in r.binaries.iter().chain(&r.produces) {
        let _ = writeln!(
            out,
            "  binary:    {} ({} bytes, sha256 {})",
            b.path, b.bytes, b.sha256
        );
    }
    for f in &r.input_files {
        let _ = writeln!(
            out,
            "  input:     {} ({} bytes, sha256 {})",
            f.path, f.bytes, f.sha256
        );
    }
    for f in &r.fingerprints {
        let _ = writeln!(
            out,
            "  fingerprint: {} = {} ({} bytes, sha256 {})",
            f.name, f.first_line, f.bytes, f.sha256
        );
    }
    if !r.code.is_empty() {
        let _ = writeln!(out, "  code:      {}", r.code);
    }
    if !r.expect_fail.is_empty() {
        let _ = writeln!(out, "  expect_fail: {}", r.expect_fail.join(", "));
    }
    for w in r.warnings() {
        let _ = writeln!(
            out,
            "  warn:      {}: {}",
            w.check,
            w.message.as_deref().unwrap_or("")
        );
    }
    let _ = writeln!(out, "  seconds:   {:.3}", r.seconds);
    if !r.attempts.is_empty() {
        let _ = writeln!(out, "\nattempts:");
        for a in &r.attempts {
            let line = format!(
                "  #{} rep {}  {}  {:>8.3}s  exit {}  signal {}  {}  {}",
                a.n,
                a.rep,
                a.start,
                a.seconds,
                a.exit.map_or("-".to_string(), |e| e.to_string()),
                a.signal.map_or("-".to_string(), |s| s.to_string()),
                a.outcome,
                a.reason.as_deref().unwrap_or("").replace('\n', " ")
            );
            let _ = writeln!(out, "{}", line.trim_end());
            for h in &a.gpu_health {
                let _ = writeln!(out, "      {}", crate::machine::health::changes(h));
            }
        }
        if let Some(last) = r.last_attempt_dir() {
            match &packed {
                Some(_) => {
                    let _ = writeln!(
                        out,
                        "  logs of the last attempt: nodes/{}/{last} in the archive; print one \
                         with `show RUN NODE --log stdout` (or stderr, checks)",
                        r.slug
                    );
                }
                None => {
                    let _ = writeln!(
                        out,
                        "  logs of the last attempt: {}",
                        tree.node_dir(&r.slug).join(last).display()
                    );
                }
            }
        }
    }
    if !r.checks.is_empty() {
        let _ = writeln!(out, "\nchecks:");
        for c in &r.checks {
            let status = serde_json::to_value(c.status).unwrap_or_default();
            let mut line = format!("  {:<5} {}", status.as_str().unwrap_or("?"), c.check);
            if !c.metrics.is_empty() {
                let m: Vec<String> = c.metrics.iter().map(|(k, v)| format!("{k}={v}")).collect();
                let _ = write!(line, "  {}", m.join(" "));
            }
            if let Some(msg) = &c.message {
                let _ = write!(line, "  — {}", msg.replace('\n', " "));
            }
            let _ = writeln!(out, "{line}");
        }
    }
    if let Some(doors) = &r.doors {
        let _ = writeln!(out, "\ndoors:");
        for (k, v) in doors {
            let _ = writeln!(out, "  {k} = {v}");
        }
    }
    if !r.artifacts.is_empty() {
        let _ = writeln!(out, "\nartifacts:");
        for a in &r.artifacts {
            let _ = writeln!(out, "  {}  {} bytes  sha256 {}", a.name, a.bytes, a.sha256);
        }
    }
    if let Some(c) = &r.compare {
        match serde_json::from_value::<CompareReport>(c.clone()) {
            Ok(report) => {
                // The attempt's own outcome (before `expect`): `error` for an artifact
                // that is missing or refused, which the report alone cannot tell from
                // `fail`.
                let outcome = r.attempts.last().map(|a| a.outcome);
                compare_table(&mut out, &report, outcome)
            }
            // A report of another format version: shown as it is stored.
            Err(_) => {
                let _ = writeln!(out, "\ncompare: {c}");
            }
        }
    }
    escape_controls(&out)
}

/// A compare's report: the two files, a row per tensor, the first mismatch, the policy and
/// the result.
fn compare_table(out: &mut String, c: &CompareReport, outcome: Option<Verdict>) {
    let _ = writeln!(out, "\ncompare:");
    let _ = writeln!(out, "  reference: {}", c.reference.display());
    let _ = writeln!(out, "  candidate: {}", c.candidate.display());
    let argmax = c.policy.wants_argmax();
    if !c.tensors.is_empty() {
        let head = [
            "tensor",
            "shape",
            "values",
            "differ",
            "max |Δ|",
            "max rel",
            "argmax agree",
        ];
        let rows: Vec<[String; 7]> = c
            .tensors
            .iter()
            .map(|t| {
                [
                    t.name.clone(),
                    if t.dtype.is_empty() {
                        format!("{:?}", t.shape)
                    } else {
                        format!("{} {:?}", t.dtype, t.shape)
                    },
                    t.values.to_string(),
                    t.mismatches.to_string(),
                    number(t.max_abs),
                    number(t.max_rel),
                    if argmax {
                        format!("{}/{}", t.argmax_agree, t.rows)
                    } else {
                        "-".to_string()
                    },
                ]
            })
            .collect();
        let mut w = head.map(|h| h.chars().count());
        for r in &rows {
            for (i, cell) in r.iter().enumerate() {
                w[i] = w[i].max(cell.chars().count());
            }
        }
        // The argmax column only for policies that compute it.
        let shown = if argmax { 7 } else { 6 };
        let line = |cells: [&str; 7]| {
            let mut l = String::new();
            for (i, cell) in cells.iter().take(shown).enumerate() {
                let pad = w[i] - cell.chars().count();
                // Names and shapes read left to right; numbers line up on the right.
                if i < 2 {
                    let _ = write!(l, "  {cell}{}", " ".repeat(pad));
                } else {
                    let _ = write!(l, "  {}{cell}", " ".repeat(pad));
                }
            }
            l.trim_end().to_string()
        };
        let _ = writeln!(out, "{}", line(head));
        for r in &rows {
            let _ = writeln!(out, "{}", line(r.each_ref().map(String::as_str)));
        }
        if c.tensors.len() > 1 {
            let _ = writeln!(
                out,
                "  all {} tensors: {} values, {} differ{}",
                c.tensors_compared,
                c.values_compared,
                c.mismatches,
                if argmax {
                    format!(", argmax agrees on {} of {} rows", c.argmax_agree, c.rows)
                } else {
                    String::new()
                }
            );
        }
    }
    policy_numbers(out, c);
    if let Some(m) = &c.first_mismatch {
        let step = m.step.map_or(String::new(), |s| format!(", step {s}"));
        let kind = match m.got_argmax {
            Some(g) => format!(" (argmax: ref {}, got {g})", m.index),
            None => String::new(),
        };
        let _ = writeln!(
            out,
            "  first mismatch: tensor {}{step}, row {}, index {}: ref {:e}, got {:e}{kind}",
            m.tensor, m.row, m.index, m.reference, m.got
        );
    }
    let _ = writeln!(out, "  policy:    {}", policy_text(&c.policy));
    let result = outcome.unwrap_or(if c.passed() {
        Verdict::Pass
    } else {
        Verdict::Fail
    });
    let _ = writeln!(out, "  result:    {result}");
    if !c.failures.is_empty() {
        for f in &c.failures {
            let _ = writeln!(out, "    - {}", f.replace('\n', " "));
        }
    }
}

/// The numbers only some policies produce, one line per tensor, labelled by the policy.
fn policy_numbers(out: &mut String, c: &CompareReport) {
    for t in &c.tensors {
        let name = &t.name;
        if let (Some(mean), Some(max)) = (t.kl_mean, t.kl_max) {
            let _ = writeln!(
                out,
                "  kl:     {name}: mean {} nats, max {} over {} rows",
                number(mean),
                number(max),
                t.rows
            );
        }
        if let (Some(min), Some(mean)) = (t.topk_min_overlap, t.topk_mean_overlap) {
            let _ = writeln!(
                out,
                "  topk:   {name}: overlap min {min:.3}, mean {mean:.3} over {} rows",
                t.rows
            );
        }
        if let (Policy::Ulp { .. }, Some(u)) = (&c.policy, t.max_ulp) {
            let _ = writeln!(out, "  ulp:    {name}: max {u} ulp ({})", t.dtype);
        }
        if let Some(d) = t.diverged {
            let mut line = format!("  tokens: {name}: {d} of {} sequences part", t.rows);
            for (i, v) in t.divergences.iter().take(5).enumerate() {
                let sep = if i == 0 { ": " } else { ", " };
                let _ = write!(
                    line,
                    "{sep}sequence {} at step {} (ref {}, got {})",
                    v.row, v.step, v.reference, v.got
                );
            }
            if t.divergences.len() > 5 {
                line.push_str(", …");
            }
            let _ = writeln!(out, "{line}");
        }
    }
}

/// A float for the table: 0 as `0`, else three significant digits in exponent form.
fn number(x: f64) -> String {
    if x == 0.0 {
        "0".to_string()
    } else {
        format!("{x:.2e}")
    }
}

/// A policy in the spelling of manifests.
fn policy_text(p: &Policy) -> String {
    match p {
        Policy::Bitwise => "bitwise".to_string(),
        Policy::Tokens { min_prefix: None } => "tokens".to_string(),
        Policy::ArgmaxAgree { min_agree } => format!("{{ min_agree = {min_agree} }}"),
        other => other.manifest_text(),
    }
}

/// `text` with every control character but the newline written as an escape (`\x1b`,
/// `\x00`, `\u{9b}`), so what a gate wrote into its rows cannot reach the terminal raw.
pub fn escape_controls(text: &str) -> String {
    crate::words::escape::terminal(text, false).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_characters_are_escaped_and_newlines_kept() {
        assert_eq!(
            escape_controls("a\u{1b}[31mred\0\nnext\u{9b}\t"),
            "a\\x1b[31mred\\x00\nnext\\u{9b}\\t"
        );
        assert_eq!(escape_controls("plain — text"), "plain — text");
        assert_eq!(escape_controls("x\u{202e}y"), "x\\u{202e}y");
    }
}
