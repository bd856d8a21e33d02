//! Reading a [`RunRecord`] from a receipt tree: `run.json` and a lean view of each cell's
//! receipt (inputs digest, checks, artifacts, seconds, tags, GPUs; the environment maps that
//! make up most of a receipt are skipped by the parser), carried receipts read from the run
//! that measured them. Also finding the runs of a manifest on disk with nothing more than a
//! folder listing and a `stat` of each `run.json` ([`runs_on_disk`]), which is what the
//! index is checked against.
//!
//! It reads only; caching the records is [`super::index`]'s job.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_json::Value;

use super::{CellFacts, INDEX_SCHEMA, RunRecord, RunSummary, Stamp};
use crate::receipt::error::ReceiptError;
use crate::receipt::load::{LoadedNode, load_as};
use crate::receipt::tree::is_run_id;
use crate::receipt::{NodeIndexEntry, NodeReceipt, RunReceipt};

/// What history reads of a node receipt.
#[derive(Debug, Clone, Deserialize)]
pub struct HistReceipt {
    #[serde(default)]
    pub inputs: String,
    #[serde(default)]
    pub checks: Vec<HistCheck>,
    #[serde(default)]
    pub artifacts: Vec<crate::receipt::Artifact>,
    #[serde(default)]
    pub seconds: f64,
    #[serde(default)]
    pub tags: Vec<String>,
    #[serde(default)]
    pub gpus: Vec<crate::receipt::GpuRef>,
    #[serde(default)]
    pub code: String,
    #[serde(default)]
    pub attempts: Vec<HistAttempt>,
}

/// What history reads of a check row.
#[derive(Debug, Clone, Deserialize)]
pub struct HistCheck {
    pub check: String,
    #[serde(default)]
    pub metrics: BTreeMap<String, Value>,
    #[serde(default = "pass")]
    pub status: crate::gate::checks::CheckStatus,
    #[serde(default)]
    pub message: Option<String>,
}

fn pass() -> crate::gate::checks::CheckStatus {
    crate::gate::checks::CheckStatus::Pass
}

/// What history reads of an attempt: how it ended and what it wrote.
#[derive(Debug, Clone, Deserialize)]
pub struct HistAttempt {
    /// The attempt's number (its folder is `attempt-<n>`).
    #[serde(default)]
    pub n: u32,
    pub outcome: crate::words::verdict::Verdict,
    #[serde(default)]
    pub artifacts: Vec<crate::receipt::Artifact>,
}

impl HistReceipt {
    /// The lean view of a whole receipt held in memory (a run that just finished).
    pub fn of(r: &NodeReceipt) -> HistReceipt {
        HistReceipt {
            inputs: r.inputs.clone(),
            checks: r
                .checks
                .iter()
                .map(|c| HistCheck {
                    check: c.check.clone(),
                    metrics: c.metrics.clone(),
                    status: c.status,
                    message: c.message.clone(),
                })
                .collect(),
            artifacts: r.artifacts.clone(),
            seconds: r.seconds,
            tags: r.tags.clone(),
            gpus: r.gpus.clone(),
            code: r.code.clone(),
            attempts: r
                .attempts
                .iter()
                .map(|a| HistAttempt {
                    n: a.n,
                    outcome: a.outcome,
                    artifacts: a.artifacts.clone(),
                })
                .collect(),
        }
    }
}

/// A run of the manifest found on disk, not yet read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunOnDisk {
    /// The folder holding `run.json`.
    pub dir: PathBuf,
    /// That folder relative to the receipts folder, `/`-separated: the key of its record.
    pub rel: String,
    /// The commit folder name.
    pub commit: String,
    /// The run id; `None` for a tree of the layout before run ids.
    pub id: Option<String>,
    pub stamp: Stamp,
}

/// The stamp of a `run.json`; `None` when it is not a readable regular file.
pub fn stamp(run_json: &Path) -> Option<Stamp> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(run_json).ok()?;
    if !m.is_file() {
        return None;
    }
    Some(Stamp {
        mtime_ns: m.mtime().saturating_mul(1_000_000_000) + m.mtime_nsec(),
        size: m.len(),
        inode: m.ino(),
    })
}

/// Every run of `manifest` under `receipts` (all commit folders), in no particular order:
/// run folders holding a `run.json`, and manifest folders of the old layout that hold one
/// themselves. Folders only; no `run.json` is parsed.
pub fn runs_on_disk(receipts: &Path, manifest: &str) -> Vec<RunOnDisk> {
    let Ok(commits) = std::fs::read_dir(receipts) else {
        return Vec::new();
    };
    commits
        .flatten()
        .filter(|c| c.file_type().is_ok_and(|t| t.is_dir()))
        .flat_map(|c| {
            let commit = c.file_name().to_string_lossy().into_owned();
            let dir = c.path().join(manifest);
            // A manifest folder that is a link (to somewhere outside the receipts folder) is
            // not followed, as `ls` never followed one.
            if !std::fs::symlink_metadata(&dir).is_ok_and(|m| m.is_dir()) {
                return Vec::new();
            }
            runs_on_disk_in(&dir, &commit, manifest)
        })
        .collect()
}

/// The runs in one manifest folder (see [`runs_on_disk`]).
pub fn runs_on_disk_in(manifest_dir: &Path, commit: &str, manifest: &str) -> Vec<RunOnDisk> {
    let mut out = Vec::new();
    let base = format!("{commit}/{manifest}");
    if let Some(stamp) = stamp(&manifest_dir.join("run.json")) {
        out.push(RunOnDisk {
            dir: manifest_dir.to_path_buf(),
            rel: base.clone(),
            commit: commit.to_string(),
            id: None,
            stamp,
        });
    }
    if let Ok(entries) = std::fs::read_dir(manifest_dir) {
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if !is_run_id(&name) || !e.file_type().is_ok_and(|t| t.is_dir()) {
                continue;
            }
            if let Some(stamp) = stamp(&e.path().join("run.json")) {
                out.push(RunOnDisk {
                    dir: e.path(),
                    rel: format!("{base}/{name}"),
                    commit: commit.to_string(),
                    id: Some(name),
                    stamp,
                });
            }
        }
    }
    out
}

/// Reads the record of a run from its tree.
pub fn read(run: &RunOnDisk) -> Result<RunRecord, ReceiptError> {
    let loaded = load_as::<HistReceipt>(&run.dir)?;
    let cells = loaded
        .nodes
        .values()
        .map(|n| (n.entry.id.clone(), facts(n)))
        .collect();
    Ok(RunRecord {
        schema: INDEX_SCHEMA,
        stamp: run.stamp,
        run: summary(&loaded.run, &run.commit, &run.rel),
        cells,
    })
}

/// The record of a run that just finished, from what its writer holds in memory: its
/// `run.json` and every cell's receipt (carried ones included), so recording it reads no
/// receipt back from disk. `None` when its `run.json` cannot be found.
pub fn of_finished(
    receipts: &Path,
    dir: &Path,
    run: &RunReceipt,
    receipts_by_id: &BTreeMap<String, HistReceipt>,
) -> Option<RunRecord> {
    let stamp = stamp(&dir.join("run.json"))?;
    let rel = dir.strip_prefix(receipts).ok()?;
    let rel: Vec<String> = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    let commit = rel.first()?.clone();
    let cells = run
        .nodes
        .iter()
        .map(|e| {
            let node = LoadedNode {
                entry: e.clone(),
                receipt: e
                    .slug
                    .as_ref()
                    .and_then(|_| receipts_by_id.get(&e.id))
                    .cloned(),
            };
            (e.id.clone(), facts(&node))
        })
        .collect();
    Some(RunRecord {
        schema: INDEX_SCHEMA,
        stamp,
        run: summary(run, &commit, &rel.join("/")),
        cells,
    })
}

fn summary(run: &RunReceipt, commit: &str, rel: &str) -> RunSummary {
    let gpus = run.gpu_names();
    RunSummary {
        id: run.run_id.clone().unwrap_or_else(|| "-".to_string()),
        commit: commit.to_string(),
        commit_sha: run.commit_sha.clone(),
        subject: run.commit_subject.clone(),
        start: run.start.clone(),
        end: run.end.clone(),
        verdict: run.verdict.clone(),
        counts: run.counts.clone(),
        host: run.host.clone(),
        dir: rel.to_string(),
        gpus,
        driver: run
            .inventory
            .get("driver_version")
            .and_then(Value::as_str)
            .map(str::to_string),
        name: run.name.clone(),
        seconds: run.seconds,
        carried: run.carried_count(),
        carried_from: run.carried_from.clone(),
    }
}

/// What a run knows of one cell: the index row, and the receipt when the run has one.
fn facts(n: &LoadedNode<HistReceipt>) -> CellFacts {
    let e: &NodeIndexEntry = &n.entry;
    let r = n.receipt.as_ref();
    CellFacts {
        verdict: e.verdict,
        good: e.verdict.as_expected(),
        reason: e.reason.clone(),
        inputs: r.map(|r| r.inputs.clone()).unwrap_or_default(),
        artifacts: r
            .map(|r| {
                r.artifacts
                    .iter()
                    .map(|a| (a.name.clone(), a.sha256.clone()))
                    .collect()
            })
            .unwrap_or_default(),
        metrics: r.map(|r| metrics(&r.checks)).unwrap_or_default(),
        seconds: r.map_or(e.seconds, |r| r.seconds),
        logs: logs(e, r),
        failed_check: r.and_then(|r| {
            r.checks
                .iter()
                .find(|c| c.status == crate::gate::checks::CheckStatus::Fail)
                .map(|c| (c.check.clone(), c.message.clone()))
        }),
        carried_from: e
            .carried
            .as_ref()
            .map(|c| c.run.clone().unwrap_or_else(|| "-".to_string())),
        tags: r.map(|r| r.tags.clone()).unwrap_or_default(),
        gpus: r
            .map(|r| r.gpus.iter().map(|g| g.name.clone()).collect())
            .unwrap_or_default(),
        code_known: r.is_some_and(|r| code_known(&r.code)),
        flipped_within: r.is_some_and(|r| {
            let ended: Vec<crate::words::verdict::Verdict> = r
                .attempts
                .iter()
                .map(|a| a.outcome)
                // Neither a cancelled attempt nor one on a GPU that faulted (it ran
                // elsewhere, before a retry) says anything of the cell's own stability.
                .filter(|o| {
                    !matches!(
                        o,
                        crate::words::verdict::Verdict::Cancelled
                            | crate::words::verdict::Verdict::DeviceFault
                    )
                })
                .collect();
            ended.windows(2).any(|w| w[0] != w[1])
        }),
        moved_within: r
            .is_some_and(|r| artifact_sets(&r.attempts).windows(2).any(|w| w[0] != w[1])),
        warns: match (e.warns, r) {
            (0, Some(r)) => u32::try_from(
                r.checks
                    .iter()
                    .filter(|c| c.status == crate::gate::checks::CheckStatus::Warn)
                    .count(),
            )
            .unwrap_or(u32::MAX),
            (n, _) => n,
        },
        warning: e.warning.clone().or_else(|| {
            let rows: Vec<crate::gate::checks::CheckRow> = r?
                .checks
                .iter()
                .filter(|c| c.status == crate::gate::checks::CheckStatus::Warn)
                .map(|c| crate::gate::checks::CheckRow {
                    check: c.check.clone(),
                    status: c.status,
                    metrics: BTreeMap::new(),
                    message: c.message.clone(),
                    first_mismatch: None,
                    extra: BTreeMap::new(),
                })
                .collect();
            crate::receipt::warning_line(&rows.iter().collect::<Vec<_>>())
        }),
    }
}

/// The last attempt's folder relative to the folder of the run whose index row `e` is:
/// `nodes/<slug>/attempt-<n>`, or `../<run id>/nodes/<slug>/attempt-<n>` for a receipt
/// carried from a sibling run (`..`-only paths for the layout before run ids); `None`
/// without a receipt, an attempt, or a carried reference that names no sibling run.
fn logs(e: &NodeIndexEntry, r: Option<&HistReceipt>) -> Option<String> {
    // A slug is a plain file name; anything else (an edited run.json a rerun carried from)
    // names no folder of the run.
    let slug = e
        .slug
        .as_deref()
        .filter(|s| crate::receipt::load::is_plain_name(s))?;
    let last = r?.attempts.last()?.n;
    let node = format!("nodes/{slug}/{}", crate::receipt::attempt_dir_name(last));
    match &e.carried {
        None => Some(node),
        Some(c) => {
            // `source_dir` checks the reference names a sibling (never a path out of the
            // manifest's folder); from a run folder `r` its answer is `<sibling>` or ``.
            let source = c.source_dir(Path::new("r"))?;
            let source = source.to_string_lossy();
            Some(if source.is_empty() {
                format!("../{node}")
            } else {
                format!("../{source}/{node}")
            })
        }
    }
}

/// The artifacts (name, sha256) each attempt wrote, for the attempts that wrote any and did
/// not run on a GPU that faulted (kept from a try before a retry, they ran elsewhere).
pub fn artifact_sets(attempts: &[HistAttempt]) -> Vec<Vec<(&str, &str)>> {
    attempts
        .iter()
        .filter(|a| {
            !a.artifacts.is_empty() && a.outcome != crate::words::verdict::Verdict::DeviceFault
        })
        .map(|a| {
            a.artifacts
                .iter()
                .map(|x| (x.name.as_str(), x.sha256.as_str()))
                .collect()
        })
        .collect()
}

/// Whether a receipt's code identity names the code (so equal inputs digests mean the same
/// code): a git tree, or a hermetic cell's declared inputs. Receipts from before code
/// identities existed, and runs outside git, never count as evidence of flakiness.
pub fn code_known(code: &str) -> bool {
    code.starts_with("git:") || code == crate::run::HERMETIC
}

/// Numeric metrics keyed `check/metric`, the second row of a repeated check as `check #2`.
pub fn metrics(checks: &[HistCheck]) -> BTreeMap<String, f64> {
    let mut seen: BTreeMap<&str, usize> = BTreeMap::new();
    let mut out = BTreeMap::new();
    for c in checks {
        let k = seen.entry(c.check.as_str()).or_default();
        *k += 1;
        let label = if *k == 1 {
            c.check.clone()
        } else {
            format!("{} #{k}", c.check)
        };
        for (name, v) in &c.metrics {
            if let Some(x) = v.as_f64().filter(|x| x.is_finite()) {
                out.insert(format!("{label}/{name}"), x);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repeated_checks_get_the_occurrence_diff_gives_them() {
        let row = |m: f64| HistCheck {
            check: "acc".to_string(),
            metrics: BTreeMap::from([
                ("max_abs".to_string(), serde_json::json!(m)),
                ("dtype".to_string(), serde_json::json!("f16")),
            ]),
            status: crate::gate::checks::CheckStatus::Pass,
            message: None,
        };
        let m = metrics(&[row(1.0), row(2.0)]);
        assert_eq!(
            m,
            BTreeMap::from([
                ("acc/max_abs".to_string(), 1.0),
                ("acc #2/max_abs".to_string(), 2.0)
            ])
        );
    }

    #[test]
    fn the_logs_folder_is_the_last_attempt_of_a_plain_slug_in_the_measuring_run() {
        let entry = |slug: &str, carried: Option<crate::receipt::Carried>| {
            serde_json::from_value::<NodeIndexEntry>(serde_json::json!({
                "id": "a", "kind": "arm", "slug": slug, "verdict": "pass", "seconds": 1.0,
                "carried": carried,
            }))
            .unwrap()
        };
        let receipt = serde_json::from_value::<HistReceipt>(serde_json::json!({
            "attempts": [{"n": 1, "outcome": "fail"}, {"n": 2, "outcome": "pass"}]
        }))
        .unwrap();
        let r = Some(&receipt);
        assert_eq!(
            logs(&entry("a-1", None), r).as_deref(),
            Some("nodes/a-1/attempt-2")
        );
        let from = crate::receipt::Carried::from_run(Some("20261201T000000.000Z-abcd"));
        assert_eq!(
            logs(&entry("a-1", Some(from)), r).as_deref(),
            Some("../20261201T000000.000Z-abcd/nodes/a-1/attempt-2")
        );
        let old = crate::receipt::Carried::from_run(None);
        assert_eq!(
            logs(&entry("a-1", Some(old)), r).as_deref(),
            Some("../nodes/a-1/attempt-2")
        );
        // An edited run.json: a slug or a carried reference that leads elsewhere names none.
        assert_eq!(logs(&entry("../../x", None), r), None);
        let out = crate::receipt::Carried {
            run: Some("x".to_string()),
            from: "../../x".to_string(),
        };
        assert_eq!(logs(&entry("a-1", Some(out)), r), None);
        assert_eq!(logs(&entry("a-1", None), None), None);
    }
}
