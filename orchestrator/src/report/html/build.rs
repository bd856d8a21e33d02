//! The report's [`ReportView`] from a [`History`]: the timeline of every cell comes from the
//! history model as it is; what history does not keep and a page shows is read here from
//! the runs' own files — each shown run's `run.json` (duration, environment, GPUs) and a
//! lean view of its receipts (the last attempt's folder for the log links, the check rows
//! for the first failing check, the doors row).
//!
//! It reads; it decides nothing about verdicts or changes (history's markers are used as
//! they are) and writes nothing.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::Deserialize;
use serde_json::Value;

use super::view::{CellView, Failure, Point, ReportView, RunView, Sample};
use crate::history::History;
use crate::protocol::{CheckRow, CheckStatus};
use crate::receipt::error::ReceiptError;
use crate::receipt::load::{LoadedRun, load_as};
use crate::receipt::tree::Tree;
use crate::receipt::{RunReceipt, attempt_dir_name};

/// What the report reads of a node receipt beyond history.
#[derive(Debug, Clone, Deserialize)]
struct Detail {
    #[serde(default)]
    attempts: Vec<AttemptN>,
    #[serde(default)]
    checks: Vec<CheckRow>,
    #[serde(default)]
    doors: Option<BTreeMap<String, Value>>,
}

#[derive(Debug, Clone, Deserialize)]
struct AttemptN {
    n: u32,
}

/// The view of `history`, with the details of its runs read from their trees.
pub fn view(history: &History) -> Result<ReportView, ReceiptError> {
    let mut trees: Vec<LoadedRun<Detail>> = Vec::with_capacity(history.runs.len());
    let mut runs = Vec::with_capacity(history.runs.len());
    let mut gone: Vec<usize> = Vec::new();
    for (i, summary) in history.runs.iter().enumerate() {
        let dir = history.receipts.join(&summary.dir);
        let tree: LoadedRun<Detail> = match load_as(&dir) {
            Ok(t) => t,
            // Deleted (by gc) since the history was read: not a run to report any more.
            Err(_) if !dir.join("run.json").exists() => {
                eprintln!(
                    "memra-orch report: run {} was deleted while the report was written; it is left out",
                    summary.dir
                );
                gone.push(i);
                continue;
            }
            Err(e) => return Err(e),
        };
        runs.push(run_view(summary, &tree.run, dir));
        trees.push(tree);
    }
    let kept;
    let history = if gone.is_empty() {
        history
    } else {
        let mut h = history.clone();
        for i in gone.iter().rev() {
            h.runs.remove(*i);
            for c in &mut h.cells {
                c.points.remove(*i);
            }
        }
        kept = h;
        &kept
    };
    let cells = history
        .cells
        .iter()
        .map(|cell| {
            let mut view = CellView {
                id: cell.id.clone(),
                points: Vec::with_capacity(cell.points.len()),
                last_failure: None,
                doors: None,
            };
            // The previous present point's attempt folder and artifact digests, to read how
            // far the bits moved.
            let mut prev: Option<(Option<PathBuf>, &std::collections::BTreeMap<String, String>)> =
                None;
            for (i, (point, tree)) in cell.points.iter().zip(&trees).enumerate() {
                let Some(facts) = point.facts.as_ref().filter(|_| !point.absent) else {
                    view.points.push(Point::Absent);
                    continue;
                };
                let node = tree.nodes.get(&cell.id);
                let detail = node.and_then(|n| n.receipt.as_ref());
                // A carried receipt's logs are in the tree of the run that measured it.
                let logs = node.and_then(|n| {
                    let slug = n.entry.slug.as_deref()?;
                    let last = detail?.attempts.last()?.n;
                    let t = Tree {
                        dir: tree.dir.clone(),
                    };
                    let node_dir = match &n.entry.carried {
                        Some(c) => t.carried_node_dir(c, slug)?,
                        None => t.node_dir(slug),
                    };
                    Some(node_dir.join(attempt_dir_name(last)))
                });
                if !facts.good {
                    view.last_failure = Some(Failure {
                        run: i,
                        verdict: facts.verdict,
                        reason: facts.reason.clone(),
                        check: detail.and_then(|d| {
                            d.checks
                                .iter()
                                .find(|c| c.status == CheckStatus::Fail)
                                .map(|c| (c.check.clone(), c.message.clone()))
                        }),
                    });
                }
                if let Some(doors) = detail.and_then(|d| d.doors.clone()) {
                    view.doors = Some(doors);
                }
                let moved = match (&prev, &logs) {
                    (Some((Some(before), old)), Some(now)) if point.bits_moved => {
                        crate::diff::quantify::sum_totals(
                            facts
                                .artifacts
                                .iter()
                                .filter(|(name, sha)| old.get(*name).is_some_and(|o| o != *sha))
                                .filter_map(|(name, _)| {
                                    crate::diff::quantify::read_files(before, now, name).totals()
                                }),
                        )
                    }
                    _ => None,
                };
                prev = Some((logs.clone(), &facts.artifacts));
                view.points.push(Point::Present(Box::new(Sample {
                    verdict: facts.verdict,
                    good: facts.good,
                    reason: facts.reason.clone(),
                    inputs_changed: point.inputs_changed,
                    bits_moved: point.bits_moved,
                    metrics: facts.metrics.clone(),
                    seconds: facts.seconds,
                    carried: facts.carried_from.is_some(),
                    logs,
                    warns: facts.warns,
                    warning: facts.warning.clone(),
                    code_known: facts.code_known,
                    moved,
                })));
            }
            view
        })
        .collect();
    Ok(ReportView {
        manifest: history.manifest.clone(),
        receipts: history.receipts.clone(),
        runs,
        cells,
        feed: crate::history::steps::feed(history),
    })
}

fn run_view(summary: &crate::history::RunSummary, run: &RunReceipt, dir: PathBuf) -> RunView {
    let yes_no = |b: bool| if b { "yes" } else { "no" }.to_string();
    let inv = &run.inventory;
    let text = |v: &Value| match v {
        Value::String(s) => s.clone(),
        Value::Null => "-".to_string(),
        other => other.to_string(),
    };
    let mut environment = vec![
        ("orchestrator".to_string(), run.orchestrator_version.clone()),
        (
            "commit sha".to_string(),
            run.commit_sha.clone().unwrap_or_else(|| "-".to_string()),
        ),
        (
            "commit subject".to_string(),
            run.commit_subject
                .clone()
                .unwrap_or_else(|| "-".to_string()),
        ),
        ("dirty".to_string(), yes_no(run.dirty)),
        (
            "manifest".to_string(),
            format!("{} (sha256 {})", run.manifest.path, run.manifest.sha256),
        ),
        ("CPU slots".to_string(), run.cpu_slots.to_string()),
        ("GPU source".to_string(), text(&inv["source"])),
        ("driver".to_string(), text(&inv["driver_version"])),
        ("CUDA driver".to_string(), text(&inv["cuda_driver_version"])),
    ];
    for m in &run.env_matrices {
        environment.push((
            "env matrix".to_string(),
            format!("{} (sha256 {})", m.path, m.sha256),
        ));
    }
    if !run.filters.is_empty() {
        environment.push(("filters".to_string(), run.filters.join(" ")));
    }
    for (name, on) in [
        ("resumed", run.resumed),
        ("rerun failed", run.rerun_failed),
        ("interrupted", run.interrupted),
    ] {
        if on {
            environment.push((name.to_string(), "yes".to_string()));
        }
    }
    if let Some(from) = &run.carried_from {
        environment.push(("carried from".to_string(), from.clone()));
    }
    if let Some(unmet) = &run.unmet {
        environment.push(("unmet".to_string(), unmet.clone()));
    }
    if let Some(full) = &run.disk_full {
        environment.push(("disk full".to_string(), full.clone()));
    }
    let gpus = inv["gpus"]
        .as_array()
        .map(|gpus| {
            gpus.iter()
                .map(|g| {
                    format!(
                        "{} {} {}",
                        text(&g["index"]),
                        text(&g["name"]),
                        text(&g["uuid"])
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    RunView {
        id: summary.id.clone(),
        subject: summary.subject.clone(),
        dir,
        commit: summary.commit.clone(),
        start: summary.start.clone(),
        verdict: summary.verdict.clone(),
        seconds: run.seconds,
        counts: summary.counts.clone(),
        host: summary.host.clone(),
        environment,
        gpus,
    }
}
