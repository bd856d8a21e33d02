//! `memra-orch diff OLD NEW`: what changed between two receipt trees (DESIGN §6,
//! docs/diff.md). Regressions, lost coverage (passed, now skipped or absent), fixes, still
//! failing, bits moved (same verdict, different artifact digests), metric drift, duration
//! drift, doors changes, new and removed nodes, and environment changes (host, driver, GPUs,
//! binaries); flaky and nondeterministic cells (changes on identical inputs) are set apart
//! by [`flaky`].
//!
//! This module owns the comparison rules; the `diff` subcommand is in `cmd::diff`. Finding
//! trees is `receipt::resolve`'s job, reading them `receipt::load`'s, and printing them
//! [`render`]'s; how far the bits of a moved safetensors artifact moved (read from the
//! files) and how compare cells' reports changed is [`quantify`]'s. It never writes
//! anything.

pub mod flaky;
pub mod quantify;
pub mod render;

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::receipt::load::{self, LoadedNode, LoadedRun};
use crate::words::verdict::Verdict;

/// What `diff` reads of a node receipt; everything else (environment, argv, attempts) is
/// skipped while parsing.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct DiffReceipt {
    #[serde(default)]
    pub checks: Vec<DiffCheck>,
    #[serde(default)]
    pub doors: Option<BTreeMap<String, Value>>,
    #[serde(default)]
    pub artifacts: Vec<crate::receipt::Artifact>,
    #[serde(default)]
    pub binaries: Vec<crate::receipt::FileDigest>,
    #[serde(default)]
    pub produces: Vec<crate::receipt::FileDigest>,
    #[serde(default)]
    pub attempts: Vec<quantify::DiffAttempt>,
    #[serde(default)]
    pub compare: Option<Value>,
    /// Metric-name globs that are informational (`info`).
    #[serde(default)]
    pub info: Vec<String>,
}

/// What `diff` reads of a check row: its name, status, metrics and message.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct DiffCheck {
    pub check: String,
    pub status: crate::gate::checks::CheckStatus,
    #[serde(default)]
    pub metrics: BTreeMap<String, Value>,
    #[serde(default)]
    pub message: Option<String>,
}

/// A tree as `diff` reads it.
pub type DiffRun = LoadedRun<DiffReceipt>;

/// Loads a tree for diffing.
pub fn load_for_diff(
    dir: &std::path::Path,
) -> Result<DiffRun, crate::receipt::error::ReceiptError> {
    load::load_as(dir)
}

/// How [`compare_runs`] classifies and reads.
#[derive(Debug, Clone, Copy)]
pub struct CompareOptions {
    pub thresholds: Thresholds,
    /// Lost coverage is listed but is no regression.
    pub allow_lost: bool,
    /// Flaky and nondeterministic cells count as regressions.
    pub flaky_fails: bool,
    /// How many runs, up to NEW, a flaky cell's flips are counted in.
    pub flaky_window: usize,
    /// Open the artifacts whose bits moved.
    pub read: bool,
}

/// Loads two run folders and compares them as `diff` does: classified (flaky and
/// nondeterministic cells set apart) and, when asked, the moved artifacts read. Returns the
/// diff and the newer run as loaded.
pub fn compare_runs(
    old_dir: &std::path::Path,
    new_dir: &std::path::Path,
    o: &CompareOptions,
) -> Result<(Diff, DiffRun), crate::receipt::error::ReceiptError> {
    let (old, new) = rayon::join(|| load_for_diff(old_dir), || load_for_diff(new_dir));
    let (old, new) = (old?, new?);
    let mut d = diff(&old, &new, &o.thresholds);
    d.allow_lost = o.allow_lost;
    d.flaky_fails = o.flaky_fails;
    flaky::classify(&mut d, &old, &new, o.flaky_window);
    if o.read {
        quantify::read_moved(&mut d, &old, &new);
    }
    Ok((d, new))
}

/// When a change of a number is worth reporting.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Thresholds {
    /// Check metrics: relative change above which a metric drifted (0.05 = 5 %).
    pub metric_rel: f64,
    /// Check metrics: absolute changes at or below this are noise, whatever the relative
    /// change (this is what lets a metric that was exactly 0 drift at all).
    pub metric_abs: f64,
    /// Durations (node seconds and metrics named like durations): changes under this many
    /// seconds are noise.
    pub duration_abs: f64,
    /// Durations: relative changes under this are noise.
    pub duration_rel: f64,
}

impl Default for Thresholds {
    fn default() -> Thresholds {
        Thresholds {
            metric_rel: 0.05,
            metric_abs: 1e-12,
            duration_abs: 1.0,
            duration_rel: 0.2,
        }
    }
}

/// The identity of one side of a diff.
#[derive(Debug, Clone, Serialize)]
pub struct Side {
    pub dir: String,
    pub name: String,
    pub commit: String,
    pub start: String,
    pub verdict: String,
    pub counts: BTreeMap<Verdict, usize>,
}

/// A node whose verdict is listed (regression, fix, still failing, other change).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct VerdictChange {
    pub id: String,
    pub old: Verdict,
    pub new: Verdict,
    /// The new side's reason; for fixes the old one's, as `was: …`.
    pub reason: Option<String>,
    /// A regression or fix across different inputs whose cell has flipped on identical
    /// inputs within the flaky window: where. It is still a regression (or fix).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub known_flaky: Option<String>,
}

/// A node that passed in OLD and did not run in NEW: skipped there, or absent from it (its
/// node left the manifest, or the run did not reach it). A nightly that silently stops
/// covering a cell must not look green, so this counts as a regression unless allowed.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LostCoverage {
    pub id: String,
    pub old: Verdict,
    /// `skipped`, or `None` when NEW has no such node.
    pub new: Option<Verdict>,
    /// Why NEW skipped it.
    pub reason: Option<String>,
}

/// One artifact whose bytes moved; `None` on the side that did not have it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ArtifactMove {
    pub name: String,
    pub old_sha256: Option<String>,
    pub new_sha256: Option<String>,
    pub old_bytes: Option<u64>,
    pub new_bytes: Option<u64>,
    /// What reading both files found (tensor by tensor); `None` when they were not read.
    #[serde(flatten)]
    pub read: Option<quantify::ArtifactRead>,
}

/// A node with the same verdict on both sides whose artifacts differ.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BitsMoved {
    pub id: String,
    pub verdict: Verdict,
    pub artifacts: Vec<ArtifactMove>,
    /// Bits that moved across different inputs in a cell whose artifacts have differed on
    /// identical inputs within the flaky window: where.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub known_nondeterministic: Option<String>,
}

/// A cell whose bits depend on the GPU it ran on ([`Diff::gpu_dependent`]).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GpuDependent {
    #[serde(flatten)]
    pub moved: BitsMoved,
    /// The UUIDs of the GPUs each side ran on.
    pub old_gpus: Vec<String>,
    pub new_gpus: Vec<String>,
}

/// A check row that is at `warn` in NEW and was not in OLD (another status, or no row).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct WarnChange {
    pub id: String,
    pub check: String,
    /// OLD's status of the row; `None` when OLD had no such row.
    pub old: Option<crate::gate::checks::CheckStatus>,
    pub message: Option<String>,
}

/// One check-row value that changed beyond the thresholds. `metric` is the metric's name,
/// `status` for a check whose status changed, or `(row)` for a check only one side has.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MetricDrift {
    pub id: String,
    pub check: String,
    pub metric: String,
    pub old: Value,
    pub new: Value,
    /// (new − old) / |old| for numbers with a non-zero old value.
    pub relative: Option<f64>,
}

/// A node whose wall time changed beyond the duration noise floor.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DurationDrift {
    pub id: String,
    pub old_seconds: f64,
    pub new_seconds: f64,
}

/// A doors key whose value differs (the code paths the gate reported).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DoorsChange {
    pub id: String,
    pub door: String,
    pub old: Value,
    pub new: Value,
}

/// A node only one side has.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct NodeBrief {
    pub id: String,
    pub verdict: Verdict,
}

/// A run-level fact that differs: host, driver, CUDA, GPUs, manifest, a binary.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct EnvChange {
    pub what: String,
    pub old: Option<String>,
    pub new: Option<String>,
}

/// Everything `diff` reports, in the order it prints it.
#[derive(Debug, Clone, Serialize)]
pub struct Diff {
    pub old: Side,
    pub new: Side,
    pub thresholds: Thresholds,
    /// `--allow-lost`: lost coverage is listed but does not count as a regression.
    pub allow_lost: bool,
    pub regressions: Vec<VerdictChange>,
    /// Cells NEW ended `device-fault` (the hardware failed during them, and no healthy
    /// GPU of the same model was left to run them again): never a regression, and never
    /// hiding one (a cell that failed again on a healthy GPU ended `fail`, a regression).
    pub device_faults: Vec<VerdictChange>,
    /// The GPUs NEW quarantined after a device fault (run.json `quarantined_gpus`).
    pub quarantined_gpus: Vec<crate::receipt::Quarantined>,
    pub lost_coverage: Vec<LostCoverage>,
    pub fixes: Vec<VerdictChange>,
    pub still_failing: Vec<VerdictChange>,
    /// Verdict changes between two as-expected verdicts that lose no coverage (`skipped` →
    /// `pass`).
    pub other_verdict_changes: Vec<VerdictChange>,
    pub bits_moved: Vec<BitsMoved>,
    pub metric_drift: Vec<MetricDrift>,
    /// Changes of metrics a cell marks informational (`info`): shown, never drift.
    pub info_changed: Vec<MetricDrift>,
    /// Check rows that became `warn`.
    pub warns: Vec<WarnChange>,
    pub duration_drift: Vec<DurationDrift>,
    pub doors_changed: Vec<DoorsChange>,
    pub new_nodes: Vec<NodeBrief>,
    /// Nodes only OLD has that did not pass there (a passing one is lost coverage).
    pub removed_nodes: Vec<NodeBrief>,
    pub environment: Vec<EnvChange>,
    /// Verdict changes on identical inputs, moved out of regressions and fixes by
    /// [`flaky::classify`].
    pub flaky: Vec<flaky::Flaky>,
    /// Bits moved on identical inputs and the same verdict, moved out of `bits_moved` by
    /// [`flaky::classify`].
    pub nondeterministic: Vec<BitsMoved>,
    /// Bits moved on identical inputs between two GPUs of the same model, each side's reps
    /// agreeing: the result depends on the card (a marginal GPU), moved out of
    /// nondeterministic by [`flaky::classify`].
    pub gpu_dependent: Vec<GpuDependent>,
    /// `--flaky-fails`: flaky and nondeterministic cells make the exit code 1.
    pub flaky_fails: bool,
}

impl Diff {
    /// Whether anything regressed, lost coverage included unless it is allowed (the exit
    /// code is 1 then).
    pub fn regressed(&self) -> bool {
        !self.regressions.is_empty()
            || (!self.allow_lost && !self.lost_coverage.is_empty())
            || (self.flaky_fails
                && !(self.flaky.is_empty()
                    && self.nondeterministic.is_empty()
                    && self.gpu_dependent.is_empty()))
    }

    /// Whether nothing differs between the two runs under the thresholds. Nodes failing on
    /// both sides are listed but are no difference: a run diffed with itself is clean.
    pub fn is_clean(&self) -> bool {
        self.regressions.is_empty()
            && self.device_faults.is_empty()
            && self.quarantined_gpus.is_empty()
            && self.lost_coverage.is_empty()
            && self.fixes.is_empty()
            && self.other_verdict_changes.is_empty()
            && self.bits_moved.is_empty()
            && self.metric_drift.is_empty()
            && self.warns.is_empty()
            && self.duration_drift.is_empty()
            && self.doors_changed.is_empty()
            && self.new_nodes.is_empty()
            && self.removed_nodes.is_empty()
            && self.environment.is_empty()
            && self.flaky.is_empty()
            && self.nondeterministic.is_empty()
            && self.gpu_dependent.is_empty()
    }
}

fn side(r: &DiffRun) -> Side {
    Side {
        dir: r.dir.to_string_lossy().into_owned(),
        name: r.run.name.clone(),
        commit: r.run.commit.clone(),
        start: r.run.start.clone(),
        verdict: r.run.verdict.clone(),
        counts: r.run.counts.clone(),
    }
}

/// Compares two loaded runs; lost coverage counts as a regression (set
/// [`Diff::allow_lost`] to list it only).
pub fn diff(old: &DiffRun, new: &DiffRun, t: &Thresholds) -> Diff {
    let mut d = Diff {
        old: side(old),
        new: side(new),
        thresholds: *t,
        allow_lost: false,
        regressions: Vec::new(),
        device_faults: Vec::new(),
        quarantined_gpus: new.run.quarantined_gpus.clone(),
        lost_coverage: Vec::new(),
        fixes: Vec::new(),
        still_failing: Vec::new(),
        other_verdict_changes: Vec::new(),
        bits_moved: Vec::new(),
        metric_drift: Vec::new(),
        info_changed: Vec::new(),
        warns: Vec::new(),
        duration_drift: Vec::new(),
        doors_changed: Vec::new(),
        new_nodes: Vec::new(),
        removed_nodes: Vec::new(),
        environment: environment(old, new),
        flaky: Vec::new(),
        nondeterministic: Vec::new(),
        gpu_dependent: Vec::new(),
        flaky_fails: false,
    };
    for (id, o) in &old.nodes {
        let Some(n) = new.nodes.get(id) else {
            if o.entry.verdict == Verdict::Pass {
                d.lost_coverage.push(LostCoverage {
                    id: id.clone(),
                    old: o.entry.verdict,
                    new: None,
                    reason: None,
                });
            } else {
                d.removed_nodes.push(NodeBrief {
                    id: id.clone(),
                    verdict: o.entry.verdict,
                });
            }
            continue;
        };
        node(&mut d, id, o, n, t);
    }
    for (id, n) in &new.nodes {
        if !old.nodes.contains_key(id) {
            d.new_nodes.push(NodeBrief {
                id: id.clone(),
                verdict: n.entry.verdict,
            });
        }
    }
    causes_first(&mut d, old, new);
    d
}

/// Orders the verdict lists so that a cause comes before what it caused: plan order (a
/// run's nodes are setups, then arms, then compares, each as the manifest lists them), and
/// within a list the cells that were blocked or cancelled after the ones that ran.
pub fn causes_first(d: &mut Diff, old: &DiffRun, new: &DiffRun) {
    let mut at: std::collections::HashMap<&str, usize> = std::collections::HashMap::new();
    for (i, e) in new.run.nodes.iter().enumerate() {
        at.entry(e.id.as_str()).or_insert(i);
    }
    let base = new.run.nodes.len();
    for (i, e) in old.run.nodes.iter().enumerate() {
        at.entry(e.id.as_str()).or_insert(base + i);
    }
    let pos = |id: &str| at.get(id).copied().unwrap_or(usize::MAX);
    let consequence = |v: Verdict| matches!(v, Verdict::Blocked | Verdict::Cancelled);
    for list in [
        &mut d.regressions,
        &mut d.still_failing,
        &mut d.fixes,
        &mut d.other_verdict_changes,
    ] {
        list.sort_by_key(|c| (consequence(c.new), pos(&c.id)));
    }
    // A lost cell was in OLD: its place there.
    let old_at: std::collections::HashMap<&str, usize> = old
        .run
        .nodes
        .iter()
        .enumerate()
        .map(|(i, e)| (e.id.as_str(), i))
        .collect();
    d.lost_coverage
        .sort_by_key(|c| old_at.get(c.id.as_str()).copied().unwrap_or(usize::MAX));
    d.bits_moved.sort_by_key(|b| pos(&b.id));
    d.warns.sort_by_key(|w| pos(&w.id));
}

/// The difference of one cell between two runs, as `diff` reports it, its artifacts read
/// tensor by tensor; the artifacts that moved are listed (and read) even when the verdict
/// changed too. What `bisect` shows for a culprit against its parent.
pub fn diff_cell(old: &DiffRun, new: &DiffRun, id: &str, t: &Thresholds) -> Diff {
    let only = |r: &DiffRun| {
        let mut r = r.clone();
        r.nodes.retain(|k, _| k == id);
        r
    };
    let (o, n) = (only(old), only(new));
    let mut d = diff(&o, &n, t);
    if let (Some(a), Some(b)) = (o.nodes.get(id), n.nodes.get(id))
        && a.entry.verdict != b.entry.verdict
    {
        let none = Vec::new();
        let artifacts = artifact_moves(
            a.receipt.as_ref().map_or(&none, |r| &r.artifacts),
            b.receipt.as_ref().map_or(&none, |r| &r.artifacts),
        );
        if !artifacts.is_empty() {
            d.bits_moved.push(BitsMoved {
                id: id.to_string(),
                verdict: b.entry.verdict,
                artifacts,
                known_nondeterministic: None,
            });
        }
    }
    quantify::read_moved(&mut d, &o, &n);
    d
}

fn node(
    d: &mut Diff,
    id: &str,
    o: &LoadedNode<DiffReceipt>,
    n: &LoadedNode<DiffReceipt>,
    t: &Thresholds,
) {
    let (ov, nv) = (o.entry.verdict, n.entry.verdict);
    let change = |reason: Option<String>| VerdictChange {
        id: id.to_string(),
        old: ov,
        new: nv,
        reason,
        known_flaky: None,
    };
    // A device fault is the hardware's: tonight's is listed on its own, and last night's
    // says nothing of the code, so a failure after it is a regression.
    let was_good = ov.as_expected() || ov == Verdict::DeviceFault;
    match (was_good, nv.as_expected()) {
        _ if nv == Verdict::DeviceFault => d.device_faults.push(change(n.entry.reason.clone())),
        (true, true) if ov == Verdict::DeviceFault => {
            d.other_verdict_changes.push(change(n.entry.reason.clone()))
        }
        (true, false) => d.regressions.push(change(n.entry.reason.clone())),
        (false, true) => d
            .fixes
            .push(change(o.entry.reason.as_ref().map(|r| format!("was: {r}")))),
        (false, false) => d.still_failing.push(change(n.entry.reason.clone())),
        (true, true) if ov == Verdict::Pass && nv == Verdict::Skipped => {
            d.lost_coverage.push(LostCoverage {
                id: id.to_string(),
                old: ov,
                new: Some(nv),
                reason: n.entry.reason.clone(),
            })
        }
        (true, true) if ov != nv => d.other_verdict_changes.push(change(n.entry.reason.clone())),
        (true, true) => {}
    }
    if duration_moved(o.entry.seconds, n.entry.seconds, t) {
        d.duration_drift.push(DurationDrift {
            id: id.to_string(),
            old_seconds: o.entry.seconds,
            new_seconds: n.entry.seconds,
        });
    }
    let (Some(or), Some(nr)) = (&o.receipt, &n.receipt) else {
        return;
    };
    if ov == nv {
        let artifacts = artifact_moves(&or.artifacts, &nr.artifacts);
        if !artifacts.is_empty() {
            d.bits_moved.push(BitsMoved {
                id: id.to_string(),
                verdict: nv,
                artifacts,
                known_nondeterministic: None,
            });
        }
    }
    // The new run's list only: dropping `info` from a manifest makes those metrics drift
    // again at once, against every older run.
    let info: Vec<&str> = nr.info.iter().map(String::as_str).collect();
    checks(d, id, &or.checks, &nr.checks, &info, t);
    quantify::compare_reports(
        &mut d.metric_drift,
        id,
        or.compare.as_ref(),
        nr.compare.as_ref(),
        t,
    );
    let empty = BTreeMap::new();
    let od = or.doors.as_ref().unwrap_or(&empty);
    let nd = nr.doors.as_ref().unwrap_or(&empty);
    let doors: BTreeSet<&String> = od.keys().chain(nd.keys()).collect();
    for door in doors {
        let (a, b) = (od.get(door), nd.get(door));
        if a != b {
            d.doors_changed.push(DoorsChange {
                id: id.to_string(),
                door: door.clone(),
                old: a.cloned().unwrap_or(Value::Null),
                new: b.cloned().unwrap_or(Value::Null),
            });
        }
    }
}

fn artifact_moves(
    old: &[crate::receipt::Artifact],
    new: &[crate::receipt::Artifact],
) -> Vec<ArtifactMove> {
    let o: BTreeMap<&str, &crate::receipt::Artifact> =
        old.iter().map(|a| (a.name.as_str(), a)).collect();
    let n: BTreeMap<&str, &crate::receipt::Artifact> =
        new.iter().map(|a| (a.name.as_str(), a)).collect();
    let names: BTreeSet<&str> = o.keys().chain(n.keys()).copied().collect();
    names
        .into_iter()
        .filter_map(|name| {
            let (a, b) = (o.get(name), n.get(name));
            if a.map(|x| &x.sha256) == b.map(|x| &x.sha256) {
                return None;
            }
            Some(ArtifactMove {
                name: name.to_string(),
                old_sha256: a.map(|x| x.sha256.clone()),
                new_sha256: b.map(|x| x.sha256.clone()),
                old_bytes: a.map(|x| x.bytes),
                new_bytes: b.map(|x| x.bytes),
                read: None,
            })
        })
        .collect()
}

/// Check rows keyed by (check name, occurrence), so a gate that repeats a check name (once
/// per rep, say) is compared row by row.
fn keyed(rows: &[DiffCheck]) -> BTreeMap<(String, usize), &DiffCheck> {
    let mut seen: BTreeMap<&str, usize> = BTreeMap::new();
    rows.iter()
        .map(|r| {
            let k = seen.entry(r.check.as_str()).or_default();
            *k += 1;
            ((r.check.clone(), *k), r)
        })
        .collect()
}

fn checks(
    d: &mut Diff,
    id: &str,
    old: &[DiffCheck],
    new: &[DiffCheck],
    info: &[&str],
    t: &Thresholds,
) {
    let (o, n) = (keyed(old), keyed(new));
    let keys: BTreeSet<&(String, usize)> = o.keys().chain(n.keys()).collect();
    let label = |(name, k): &(String, usize)| {
        if *k == 1 {
            name.clone()
        } else {
            format!("{name} #{k}")
        }
    };
    let status = |r: &DiffCheck| serde_json::to_value(r.status).unwrap_or_default();
    for key in keys {
        let drift = |metric: &str, old: Value, new: Value, relative: Option<f64>| MetricDrift {
            id: id.to_string(),
            check: label(key),
            metric: metric.to_string(),
            old,
            new,
            relative,
        };
        let (a, b) = match (o.get(key), n.get(key)) {
            (Some(a), Some(b)) => (a, b),
            (a, b) => {
                if let (None, Some(b)) = (a, b)
                    && b.status == crate::gate::checks::CheckStatus::Warn
                {
                    d.warns.push(WarnChange {
                        id: id.to_string(),
                        check: label(key),
                        old: None,
                        message: b.message.clone(),
                    });
                }
                d.metric_drift.push(drift(
                    "(row)",
                    a.map(|r| status(r)).unwrap_or(Value::Null),
                    b.map(|r| status(r)).unwrap_or(Value::Null),
                    None,
                ));
                continue;
            }
        };
        if a.status != b.status {
            d.metric_drift
                .push(drift("status", status(a), status(b), None));
        }
        if b.status == crate::gate::checks::CheckStatus::Warn
            && a.status != crate::gate::checks::CheckStatus::Warn
        {
            d.warns.push(WarnChange {
                id: id.to_string(),
                check: label(key),
                old: Some(a.status),
                message: b.message.clone(),
            });
        }
        let names: BTreeSet<&String> = a.metrics.keys().chain(b.metrics.keys()).collect();
        for m in names {
            let (x, y) = (a.metrics.get(m), b.metrics.get(m));
            if let Some(relative) = metric_moved(m, x, y, t) {
                let list = if crate::gate::canary::matches_any(info, m) {
                    &mut d.info_changed
                } else {
                    &mut d.metric_drift
                };
                list.push(drift(
                    m,
                    x.cloned().unwrap_or(Value::Null),
                    y.cloned().unwrap_or(Value::Null),
                    relative,
                ));
            }
        }
    }
}

/// Seconds per unit when a metric's name says it is a duration (`seconds`, `*_s`, `*_ms`,
/// `*_us`, `*_ns`); such metrics are judged by the duration noise floor, not the metric
/// thresholds, because timings wobble from run to run.
fn duration_unit(name: &str) -> Option<f64> {
    let n = name.to_ascii_lowercase();
    if n == "seconds" || n.ends_with("_seconds") || n.ends_with("_s") || n.ends_with("_secs") {
        Some(1.0)
    } else if n.ends_with("_ms") {
        Some(1e-3)
    } else if n.ends_with("_us") {
        Some(1e-6)
    } else if n.ends_with("_ns") {
        Some(1e-9)
    } else {
        None
    }
}

/// `None` when the metric did not move; `Some(relative change)` when it did.
fn metric_moved(
    name: &str,
    old: Option<&Value>,
    new: Option<&Value>,
    t: &Thresholds,
) -> Option<Option<f64>> {
    match (old.and_then(Value::as_f64), new.and_then(Value::as_f64)) {
        (Some(a), Some(b)) => {
            let relative = (a != 0.0).then(|| (b - a) / a.abs());
            let moved = match duration_unit(name) {
                Some(unit) => duration_moved(a * unit, b * unit, t),
                None => {
                    let delta = (b - a).abs();
                    // NaN compares unequal to everything: a metric that became NaN moved.
                    if a.is_nan() || b.is_nan() {
                        a.is_nan() != b.is_nan()
                    } else {
                        delta > t.metric_abs && relative.is_none_or(|r| r.abs() > t.metric_rel)
                    }
                }
            };
            moved.then_some(relative)
        }
        _ => (old != new).then_some(None),
    }
}

fn duration_moved(a: f64, b: f64, t: &Thresholds) -> bool {
    let delta = (b - a).abs();
    delta >= t.duration_abs && (a == 0.0 || delta / a.abs() >= t.duration_rel)
}

/// Run-level facts: host, orchestrator version, driver and CUDA versions, the GPU list,
/// manifest and env-matrix digests, and every binary (by path) whose digest changed.
fn environment(old: &DiffRun, new: &DiffRun) -> Vec<EnvChange> {
    let mut out = Vec::new();
    let mut fact = |what: &str, a: Option<String>, b: Option<String>| {
        if a != b {
            out.push(EnvChange {
                what: what.to_string(),
                old: a,
                new: b,
            });
        }
    };
    let (o, n) = (&old.run, &new.run);
    fact("host", Some(o.host.clone()), Some(n.host.clone()));
    fact(
        "memra-orch version",
        Some(o.orchestrator_version.clone()),
        Some(n.orchestrator_version.clone()),
    );
    let inv = |r: &crate::receipt::RunReceipt, key: &str| {
        r.inventory
            .get(key)
            .and_then(Value::as_str)
            .map(str::to_string)
    };
    fact("driver", inv(o, "driver_version"), inv(n, "driver_version"));
    fact(
        "CUDA driver",
        inv(o, "cuda_driver_version"),
        inv(n, "cuda_driver_version"),
    );
    let gpus = |r: &crate::receipt::RunReceipt| {
        let list: Vec<String> = r
            .inventory
            .get("gpus")
            .and_then(Value::as_array)
            .map(|gs| {
                gs.iter()
                    .map(|g| {
                        format!(
                            "{} {}",
                            g.get("name").and_then(Value::as_str).unwrap_or("?"),
                            g.get("uuid").and_then(Value::as_str).unwrap_or("?")
                        )
                    })
                    .collect()
            })
            .unwrap_or_default();
        Some(if list.is_empty() {
            "none".to_string()
        } else {
            list.join(", ")
        })
    };
    fact("GPUs", gpus(o), gpus(n));
    fact(
        "manifest sha256",
        Some(o.manifest.sha256.clone()),
        Some(n.manifest.sha256.clone()),
    );
    let matrices = |r: &crate::receipt::RunReceipt| -> BTreeMap<String, String> {
        r.env_matrices
            .iter()
            .map(|m| (m.path.clone(), m.sha256.clone()))
            .collect()
    };
    let (om, nm) = (matrices(o), matrices(n));
    for path in om.keys().chain(nm.keys()).collect::<BTreeSet<_>>() {
        fact(
            &format!("env-matrix {path}"),
            om.get(path).cloned(),
            nm.get(path).cloned(),
        );
    }
    let (ob, nb) = (binaries(old), binaries(new));
    for (path, a) in &ob {
        if let Some(b) = nb.get(path) {
            fact(&format!("binary {path}"), Some(a.clone()), Some(b.clone()));
        }
    }
    out
}

/// sha256 per binary path over every node receipt; a path seen with several digests within
/// one run (rebuilt half-way) shows them all.
fn binaries(run: &DiffRun) -> BTreeMap<String, String> {
    let mut seen: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for n in run.nodes.values() {
        if let Some(r) = &n.receipt {
            for b in r.binaries.iter().chain(&r.produces) {
                seen.entry(b.path.clone())
                    .or_default()
                    .insert(b.sha256.clone());
            }
        }
    }
    seen.into_iter()
        .map(|(p, s)| (p, s.into_iter().collect::<Vec<_>>().join(" ")))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metric_thresholds() {
        let t = Thresholds::default();
        let v = |x: f64| Some(serde_json::json!(x));
        let moved = |name: &str, a: f64, b: f64| {
            metric_moved(name, v(a).as_ref(), v(b).as_ref(), &t).is_some()
        };
        assert!(!moved("max_abs", 1.0, 1.04));
        assert!(moved("max_abs", 1.0, 1.06));
        assert!(
            moved("max_abs", 0.0, 1e-7),
            "a metric leaving exactly 0 moved"
        );
        assert!(!moved("max_abs", 0.0, 0.0));
        assert!(!moved("decode_seconds", 10.0, 10.9), "under 1 s is noise");
        assert!(!moved("decode_seconds", 10.0, 11.5), "under 20 % is noise");
        assert!(moved("decode_seconds", 10.0, 12.5));
        assert!(
            !moved("step_ms", 100.0, 900.0),
            "800 ms is under the 1 s floor"
        );
        assert!(moved("step_ms", 1000.0, 3000.0));
        let s = |x: &str| Some(serde_json::json!(x));
        assert!(metric_moved("dtype", s("f16").as_ref(), s("bf16").as_ref(), &t).is_some());
        assert!(metric_moved("dtype", s("f16").as_ref(), None, &t).is_some());
    }

    fn run(driver: &str, gpu: &str, binary_sha: &str) -> DiffRun {
        let run: crate::receipt::RunReceipt = serde_json::from_value(serde_json::json!({
            "schema": 1, "name": "m", "manifest": {"path": "m.toml", "bytes": 0, "sha256": "s"},
            "env_matrices": [], "commit": "c", "commit_sha": null, "dirty": false, "host": "h",
            "orchestrator_version": "0", "cpu_slots": 1, "filters": [], "resumed": false,
            "inventory": {"driver_version": driver, "gpus": [{"name": gpu, "uuid": "GPU-1"}]},
            "start": "t", "end": "t", "seconds": 1.0, "interrupted": false, "counts": {},
            "verdict": "pass",
            "nodes": [{"id": "a", "kind": "arm", "slug": "a-1", "verdict": "pass", "seconds": 1.0}]
        }))
        .unwrap();
        let receipt = DiffReceipt {
            checks: vec![],
            doors: None,
            artifacts: vec![],
            binaries: vec![crate::receipt::FileDigest {
                path: "/bin/gate".into(),
                bytes: 1,
                sha256: binary_sha.into(),
            }],
            produces: vec![],
            attempts: vec![],
            compare: None,
            info: vec![],
        };
        let entry = run.nodes[0].clone();
        DiffRun {
            dir: "/r".into(),
            nodes: BTreeMap::from([(
                "a".to_string(),
                LoadedNode {
                    entry,
                    receipt: Some(receipt),
                },
            )]),
            run,
        }
    }

    #[test]
    fn environment_names_driver_gpus_and_binaries() {
        let t = Thresholds::default();
        let same = diff(&run("550.1", "H200", "aa"), &run("550.1", "H200", "aa"), &t);
        assert!(same.is_clean(), "{same:?}");
        let d = diff(&run("550.1", "H200", "aa"), &run("560.2", "H100", "bb"), &t);
        let what: Vec<&str> = d.environment.iter().map(|e| e.what.as_str()).collect();
        assert_eq!(what, ["driver", "GPUs", "binary /bin/gate"]);
        assert_eq!(d.environment[0].new.as_deref(), Some("560.2"));
        assert!(!d.regressed());
    }
}
