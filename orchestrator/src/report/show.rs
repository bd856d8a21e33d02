//! What `memra-orch show` prints of a stored run: the run view (header and a row per node,
//! problems first) and the node view (command, pins, attempts, checks, doors, artifacts,
//! where its logs are). It formats a loaded tree only; finding and reading it is
//! `receipt`'s job.

use std::fmt::Write;

use crate::commit::short_commit;
use crate::receipt::NodeReceipt;
use crate::receipt::load::{LoadedNode, LoadedRun};
use crate::receipt::tree::Tree;
use crate::report::summary::counts_line;

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
        let mut warn = if n.receipt.as_ref().is_some_and(crate::attest::has_warning) {
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
    out
}

/// The node view.
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
    let _ = writeln!(out, "  folder:    {}", tree.node_dir(&r.slug).display());
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
        }
        if let Some(last) = r.last_attempt_dir() {
            let _ = writeln!(
                out,
                "  logs of the last attempt: {}",
                tree.node_dir(&r.slug).join(last).display()
            );
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
        let _ = writeln!(out, "\ncompare: {c}");
    }
    out
}
