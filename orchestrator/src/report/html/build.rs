//! The report's [`ReportView`] from a [`History`]: the timeline of every cell comes from the
//! history model as it is (the index's rows: verdicts, metrics, artifact digests, the last
//! attempt's folder, the first failing check); what the index does not keep and a page
//! shows is read here from the runs' own files — each shown run's `run.json` (duration,
//! environment, GPUs), each cell's newest receipt for its doors row, and the safetensors
//! artifacts of a point whose bits moved (how far). No other receipt is read, so the cost
//! follows the runs and cells shown, not the trees' size.
//!
//! It reads; it decides nothing about verdicts or changes (history's markers are used as
//! they are) and writes nothing.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_json::Value;

use super::view::{CellView, Failure, Point, ReportView, RunView, Sample};
use crate::history::History;
use crate::receipt::error::ReceiptError;
use crate::receipt::{RunReceipt, read_json};

/// What the report reads of a node receipt beyond the index: its doors row.
#[derive(Debug, Deserialize)]
struct Doors {
    #[serde(default)]
    doors: Option<BTreeMap<String, Value>>,
}

/// A folder under a run's folder, `rel` as the index keeps it (`nodes/…`, or `../<run>/…`
/// for a carried receipt), with the `..` resolved against the run's parent; `None` for
/// anything else (no part may lead elsewhere, whatever a row says).
fn under(run_dir: &Path, rel: &str) -> Option<PathBuf> {
    let (base, rest) = match rel.strip_prefix("../") {
        Some(rest) => (run_dir.parent()?, rest),
        None => (run_dir, rel),
    };
    rest.split('/')
        .all(crate::receipt::load::is_plain_name)
        .then(|| base.join(rest))
}

/// The view of `history`, with what the index does not keep read from the runs' files.
/// `history` is consumed: each point's facts move into the view.
// Over 150 lines: each history point's facts read from its run's files in one pass, the folders
// resolved once at the top.
pub fn view(mut history: History) -> Result<ReportView, ReceiptError> {
    // Resolved once, so every folder below it is absolute and free of links above the
    // receipts folder: the pages link to logs relative to the (resolved) site folder
    // without resolving each path again.
    if let Ok(resolved) = std::fs::canonicalize(&history.receipts) {
        history.receipts = resolved;
    }
    let mut runs = Vec::with_capacity(history.runs.len());
    let mut dirs = Vec::with_capacity(history.runs.len());
    let mut gone: Vec<usize> = Vec::new();
    for (i, summary) in history.runs.iter().enumerate() {
        let dir = history.receipts.join(&summary.dir);
        let run: RunReceipt = match read_json(&dir.join("run.json")) {
            Ok(Some(r)) => r,
            // Deleted (by gc) since the history was read: not a run to report any more.
            Ok(None) => {
                eprintln!(
                    "memra-orch report: run {} was deleted while the report was written; it is left out",
                    summary.dir
                );
                gone.push(i);
                continue;
            }
            Err(e) => return Err(e),
        };
        runs.push(run_view(summary, &run, dir.clone()));
        dirs.push(dir);
    }
    for &i in gone.iter().rev() {
        history.runs.remove(i);
        for c in &mut history.cells {
            c.points.remove(i);
        }
    }
    // The steps of the runs shown (a run gc deleted meanwhile is not one).
    let feed = crate::history::steps::feed(&history);
    // Whether each run folder a point's logs are in is packed (one look per run).
    let mut packed_runs: std::collections::HashMap<PathBuf, bool> =
        std::collections::HashMap::new();
    // How far the bits moved is read after every cell's points are known, run by run (see
    // `Moved`), not cell by cell: each read may open a packed run's archive.
    let mut moved_jobs: Vec<Moved> = Vec::new();
    let mut cells: Vec<CellView> = history
        .cells
        .into_iter()
        .enumerate()
        .map(|(c, cell)| {
            let mut view = CellView {
                id: cell.id,
                points: Vec::with_capacity(cell.points.len()),
                last_failure: None,
                doors: None,
            };
            // The previous present point's attempt folder and artifact digests, to read how
            // far the bits moved.
            let mut prev: Option<(Option<PathBuf>, BTreeMap<String, String>)> = None;
            // The newest present point's receipt, for the doors row.
            let mut newest_receipt: Option<PathBuf> = None;
            for (i, (point, dir)) in cell.points.into_iter().zip(&dirs).enumerate() {
                let Some(facts) = point.facts.filter(|_| !point.absent) else {
                    view.points.push(Point::Absent);
                    continue;
                };
                let logs = facts.logs.as_deref().and_then(|rel| under(dir, rel));
                let packed = logs.as_ref().and_then(|l| {
                    // `<run>/nodes/<slug>/attempt-<n>`: the run's archive holds it as
                    // `nodes/<slug>/attempt-<n>`.
                    let run = l.ancestors().nth(3)?;
                    let pack = run.join(crate::gate::packed::PACK);
                    let is_packed = *packed_runs.entry(run.to_path_buf()).or_insert_with(|| {
                        std::fs::symlink_metadata(&pack).is_ok_and(|m| m.is_file())
                    });
                    let member = l.strip_prefix(run).ok()?.to_str()?.to_string();
                    is_packed.then_some((pack, member))
                });
                if !facts.good {
                    view.last_failure = Some(Failure {
                        run: i,
                        verdict: facts.verdict,
                        reason: facts.reason.clone(),
                        check: facts.failed_check.clone(),
                    });
                }
                newest_receipt = logs
                    .as_ref()
                    .and_then(|l| l.parent())
                    .map(|n| n.join("receipt.json"));
                if let (Some((Some(before), old)), Some(now)) = (&prev, &logs)
                    && point.bits_moved
                {
                    moved_jobs.push(Moved {
                        cell: c,
                        point: view.points.len(),
                        before: before.clone(),
                        now: now.clone(),
                        names: facts
                            .artifacts
                            .iter()
                            .filter(|(name, sha)| old.get(*name).is_some_and(|o| o != *sha))
                            .map(|(name, _)| name.clone())
                            .collect(),
                    });
                }
                view.points.push(Point::Present(Box::new(Sample {
                    verdict: facts.verdict,
                    good: facts.good,
                    reason: facts.reason,
                    inputs_changed: point.inputs_changed,
                    bits_moved: point.bits_moved,
                    metrics: facts.metrics,
                    seconds: facts.seconds,
                    carried: facts.carried_from.is_some(),
                    logs: logs.clone(),
                    packed,
                    warns: facts.warns,
                    warning: facts.warning,
                    code_known: facts.code_known,
                    moved: None,
                })));
                prev = Some((logs, facts.artifacts));
            }
            // The doors row of the cell's newest receipt (a display detail: a receipt
            // that cannot be read shows none).
            view.doors = newest_receipt
                .and_then(|p| read_json::<Doors>(&p).ok().flatten())
                .and_then(|d| d.doors);
            view
        })
        .collect();
    // Grouped by the pair of attempt folders' runs, so the archives of two runs are read
    // together instead of by turns with every other run's.
    moved_jobs.sort_by(|a, b| {
        (a.now.ancestors().nth(3), a.before.ancestors().nth(3))
            .cmp(&(b.now.ancestors().nth(3), b.before.ancestors().nth(3)))
    });
    for job in moved_jobs {
        let moved =
            crate::diff::quantify::sum_totals(job.names.iter().filter_map(|name| {
                crate::diff::quantify::tensor_totals(&job.before, &job.now, name)
            }));
        if let Some(Point::Present(sample)) = cells[job.cell].points.get_mut(job.point) {
            sample.moved = moved;
        }
    }
    Ok(ReportView {
        manifest: history.manifest,
        receipts: history.receipts,
        runs,
        cells,
        feed,
    })
}

/// A point whose bits moved: its cell and place, the previous present point's attempt
/// folder and its own, and the artifacts whose digests differ.
struct Moved {
    cell: usize,
    point: usize,
    before: PathBuf,
    now: PathBuf,
    names: Vec<String>,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_log_folder_stays_below_the_run_or_its_siblings() {
        let run = Path::new("/r/c/m/run1");
        assert_eq!(
            under(run, "nodes/a-1/attempt-2"),
            Some(PathBuf::from("/r/c/m/run1/nodes/a-1/attempt-2"))
        );
        assert_eq!(
            under(run, "../run0/nodes/a-1/attempt-1"),
            Some(PathBuf::from("/r/c/m/run0/nodes/a-1/attempt-1"))
        );
        assert_eq!(
            under(run, "../nodes/a-1/attempt-1"),
            Some(PathBuf::from("/r/c/m/nodes/a-1/attempt-1"))
        );
        for hostile in [
            "../../etc",
            "nodes/../../x",
            "../run0/../../x",
            "/etc/passwd",
            "nodes//x",
            "",
        ] {
            assert_eq!(under(run, hostile), None, "{hostile}");
        }
    }
}
