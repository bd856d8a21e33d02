//! What the receipts folder remembers of one manifest across runs: every run of it, oldest
//! to newest by start (all commits), and for each cell one [`Point`] per run — verdict,
//! whether it was as expected, reason, `inputs` digest and whether it changed, the
//! artifacts' digests and whether their bits moved, numeric check metrics, duration and
//! where a carried receipt was measured. `memra-orch history`, the run aliases
//! (`last-green`, `@DATE`), the flaky classification of `diff` and the HTML report all read
//! it through [`load`].
//!
//! The API, for readers that build on it (it only grows; nothing is renamed):
//!
//! - [`load`]`(receipts, manifest, &Options)` → [`History`]: the runs ([`RunSummary`],
//!   oldest first) and the selected cells ([`CellHistory`], by id), each with one point per
//!   run in the same order as `runs` (an explicit absent point where the run has no such
//!   cell).
//! - [`manifests`]`(receipts)`: the manifest names that have runs, to pick or list one.
//! - [`RunRecord`] / [`CellFacts`]: what is known of one run and of one cell in one run;
//!   [`build`] reads them from a receipt tree, [`index`] caches them in the SQLite database
//!   `<receipts>/.memra-index/index.sqlite` so a year of nightlies is not re-parsed.
//! - [`render`]: text, markdown and JSON of a [`History`].
//!
//! This module owns the history model and the selection of cells; it reads receipts only
//! through `receipt` and never writes inside a run's tree (the index lives beside the
//! commit folders). Deciding verdicts and comparing two runs are not its job.

pub mod build;
pub mod heads;
pub mod index;
pub mod render;
pub mod steps;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::receipt::error::ReceiptError;
use crate::words::verdict::Verdict;

/// Format version of an index line ([`RunRecord`], sealed since 3). A line of another version is not
/// trusted: its run is read from the tree again.
pub const INDEX_SCHEMA: u32 = 3;

/// What identifies the `run.json` a record was read from: when any of it differs, the run
/// changed (a run that was still going has finished, a tree was replaced) and the record is
/// read again.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stamp {
    /// Modification time, nanoseconds since the epoch.
    pub mtime_ns: i64,
    pub size: u64,
    pub inode: u64,
}

/// One run, as history shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunSummary {
    /// The run id (its folder name), or `-` for a tree of the layout before run ids.
    pub id: String,
    /// The commit folder name (`<sha>`, `<sha>-dirty`, a `--commit` id, `no-git`).
    pub commit: String,
    /// The commit sha git gave, when there was one.
    pub commit_sha: Option<String>,
    /// The commit's subject line, when the run recorded one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subject: Option<String>,
    /// RFC 3339 start time (UTC).
    pub start: String,
    /// `None` while running, or when the run was killed before it could finish.
    pub end: Option<String>,
    /// The run's overall verdict: `pass`, `fail`, or `running`.
    pub verdict: String,
    pub counts: BTreeMap<Verdict, usize>,
    pub host: String,
    /// The run's folder relative to the receipts folder (`<commit>/<manifest>/<run id>`).
    pub dir: String,
    /// The model names of the run's GPU inventory, in inventory order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gpus: Vec<String>,
    /// The NVIDIA driver version of the inventory, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub driver: Option<String>,
    /// The manifest's `name` as the run recorded it.
    #[serde(default)]
    pub name: String,
    /// Wall seconds of the run, when it finished.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seconds: Option<f64>,
    /// How many of its cells were carried from an earlier run.
    #[serde(default, skip_serializing_if = "crate::receipt::is_zero")]
    pub carried: usize,
    /// The run `--rerun-failed` or `--exclude` carried from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub carried_from: Option<String>,
}

impl RunSummary {
    /// Whether the run finished with every cell as expected (`pass` or `skipped`): a green
    /// night, what `last-green` names.
    pub fn green(&self) -> bool {
        crate::receipt::resolve::is_green(self.end.is_some(), &self.verdict, &self.counts)
    }

    /// How many cells were not as expected.
    pub fn bad_cells(&self) -> usize {
        self.counts
            .iter()
            .filter(|(v, _)| !v.as_expected())
            .map(|(_, n)| n)
            .sum()
    }
}

/// What one run knows of one cell.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CellFacts {
    pub verdict: Verdict,
    /// As expected (`pass`, or `skipped`, which does not fail a run): *good* as
    /// docs/diff.md defines it.
    pub good: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The receipt's `inputs` digest; empty when the run wrote no receipt for the cell.
    #[serde(default)]
    pub inputs: String,
    /// sha256 of each artifact, by name.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub artifacts: BTreeMap<String, String>,
    /// Numeric check metrics keyed `check/metric`; a check the gate repeats is `check
    /// #2/metric` for its second row, as `diff` labels it.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub metrics: BTreeMap<String, f64>,
    /// Wall seconds of the cell's attempts.
    pub seconds: f64,
    /// The last attempt's folder (its logs) relative to the run's folder:
    /// `nodes/<slug>/attempt-<n>`, or `../<run id>/nodes/…` for a carried receipt; absent
    /// without a receipt or an attempt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logs: Option<String>,
    /// The first check row at `fail`: its name and message.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failed_check: Option<(String, Option<String>)>,
    /// The run that measured a carried receipt (`-` for a tree of the old layout); absent
    /// when this run measured it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub carried_from: Option<String>,
    /// The cell's tags (for `tag:NAME` filters).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tags: Vec<String>,
    /// The model names of the GPUs the cell leased, in CUDA_VISIBLE_DEVICES order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gpus: Vec<String>,
    /// The receipt names the code it tested (a git tree, or hermetic), so its `inputs`
    /// digest is evidence: two points with equal digests tested the same thing.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub code_known: bool,
    /// Within this run, the cell's attempts disagreed (a retry after a crash passed, a rep
    /// failed): flakiness seen at one digest.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub flipped_within: bool,
    /// Within this run, the cell's attempts wrote different artifacts.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub moved_within: bool,
    /// How many check rows were at `warn`.
    #[serde(default, skip_serializing_if = "crate::receipt::is_zero")]
    pub warns: u32,
    /// The first warn row, as one line.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub warning: Option<String>,
}

/// One run and all its cells: a line of the index.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunRecord {
    pub schema: u32,
    /// The `run.json` this was read from.
    pub stamp: Stamp,
    pub run: RunSummary,
    /// By cell id.
    pub cells: BTreeMap<String, CellFacts>,
}

/// One cell in one run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Point {
    /// The run id (`-` for the old layout).
    pub run: String,
    pub commit: String,
    pub start: String,
    /// The run has no such cell (the node left the manifest, or the run did not reach it).
    pub absent: bool,
    /// The `inputs` digest differs from the previous point where the cell existed.
    pub inputs_changed: bool,
    /// The artifact digests differ from the previous point where the cell existed (an
    /// artifact only one side has counts).
    pub bits_moved: bool,
    /// What the run knows of the cell; `None` when absent.
    #[serde(flatten)]
    pub facts: Option<CellFacts>,
}

/// The timeline of one cell.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CellHistory {
    pub id: String,
    /// One per run of [`History::runs`], in the same order.
    pub points: Vec<Point>,
}

impl CellHistory {
    /// How many times the cell went from good to bad or back between consecutive points
    /// where it existed.
    pub fn flips(&self) -> usize {
        let good: Vec<bool> = self
            .points
            .iter()
            .filter_map(|p| p.facts.as_ref().map(|f| f.good))
            .collect();
        good.windows(2).filter(|w| w[0] != w[1]).count()
    }
}

/// The history of a manifest under a receipts folder.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct History {
    pub receipts: PathBuf,
    pub manifest: String,
    /// Oldest to newest by start, then run id.
    pub runs: Vec<RunSummary>,
    /// The selected cells, by id.
    pub cells: Vec<CellHistory>,
}

/// What [`load`] reads.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// Cell filters as `run --filter` takes them: a glob over cell ids and node ids, or
    /// `tag:NAME`; a leading `!` excludes. None selects every cell.
    pub filters: Vec<String>,
    /// Only the newest N runs (the points of the oldest of them still say whether inputs
    /// or bits changed against the run before).
    pub last: Option<usize>,
    /// How the index is used.
    pub index: index::Mode,
}

/// Why history could not be read.
#[derive(Debug, thiserror::Error)]
pub enum HistoryError {
    #[error(
        "{}: no run of manifest {manifest:?} (runs are there of: {}); check --manifest",
        receipts.display(),
        if held.is_empty() { "none".to_string() } else { held.join(", ") }
    )]
    NoRuns {
        receipts: PathBuf,
        manifest: String,
        held: Vec<String>,
    },
    #[error(
        "{}: no runs; run `memra-orch run` first or pass --receipts DIR",
        receipts.display()
    )]
    Empty { receipts: PathBuf },
    #[error(
        "{}: holds runs of several manifests ({}); pick one with --manifest NAME",
        receipts.display(),
        held.join(", ")
    )]
    SeveralManifests {
        receipts: PathBuf,
        held: Vec<String>,
    },
    #[error(
        "filter `{filter}` is not a valid glob ({error}); write `[[]` for a literal `[`, or give a whole cell id"
    )]
    BadFilter {
        filter: String,
        error: globset::Error,
    },
    #[error(
        "filter `{filter}` matches no cell of {manifest:?} in the runs shown{}; `memra-orch show latest` lists the cell ids",
        near.as_ref().map(|n| format!(" (did you mean {n:?}?)")).unwrap_or_default()
    )]
    NoMatch {
        filter: String,
        manifest: String,
        near: Option<String>,
    },
    #[error(
        "{}: cannot list the receipts folder: {error}; run `memra-orch run` first or pass --receipts DIR",
        receipts.display()
    )]
    List {
        receipts: PathBuf,
        error: std::io::Error,
    },
    #[error(transparent)]
    Receipt(#[from] ReceiptError),
}

/// The names of the manifests that have at least one run under `receipts`, sorted.
pub fn manifests(receipts: &Path) -> Result<Vec<String>, HistoryError> {
    let commits = std::fs::read_dir(receipts).map_err(|error| HistoryError::List {
        receipts: receipts.to_path_buf(),
        error,
    })?;
    let mut names = BTreeSet::new();
    for c in commits.flatten() {
        if !c.file_type().is_ok_and(|t| t.is_dir()) {
            continue;
        }
        let Ok(ms) = std::fs::read_dir(c.path()) else {
            continue;
        };
        for m in ms.flatten() {
            let name = m.file_name().to_string_lossy().into_owned();
            if !names.contains(&name)
                && m.file_type().is_ok_and(|t| t.is_dir())
                && !build::runs_on_disk_in(&m.path(), "", "").is_empty()
            {
                names.insert(name);
            }
        }
    }
    Ok(names.into_iter().collect())
}

/// The manifest to read: `given`, or the only one there is; a usage error listing them
/// otherwise.
pub fn pick_manifest(receipts: &Path, given: Option<&str>) -> Result<String, HistoryError> {
    let held = manifests(receipts)?;
    match given {
        Some(m) if held.iter().any(|h| h == m) => Ok(m.to_string()),
        Some(m) => Err(HistoryError::NoRuns {
            receipts: receipts.to_path_buf(),
            manifest: m.to_string(),
            held,
        }),
        None => match held.as_slice() {
            [one] => Ok(one.clone()),
            [] => Err(HistoryError::Empty {
                receipts: receipts.to_path_buf(),
            }),
            _ => Err(HistoryError::SeveralManifests {
                receipts: receipts.to_path_buf(),
                held,
            }),
        },
    }
}

/// The history of `manifest` under `receipts`: every run (or the newest `last`), and a
/// timeline for each cell the filters select. Runs are read through the index, which is
/// checked against the trees on disk and brought up to date first; only the rows of the
/// cells shown are read (and, for a window, each one's newest row before it).
pub fn load(receipts: &Path, manifest: &str, opts: &Options) -> Result<History, HistoryError> {
    let window = open(receipts, manifest, opts)?;
    window.part(window.cells())
}

/// The runs [`load`] would show and the cells it would select, opened on the index, to be
/// read a part of the cells at a time ([`Window::part`]): what prints a thousand cells'
/// timelines without holding them all.
pub struct Window {
    index: index::Index,
    receipts: PathBuf,
    manifest: String,
    /// The first run shown.
    first: usize,
    /// The selected cells, in order.
    chosen: Vec<String>,
    /// Whether every cell of the runs shown is selected.
    every: bool,
}

/// Opens the window `opts` selects: the newest `last` runs (all without it) and the cells
/// the filters select among theirs.
pub fn open(receipts: &Path, manifest: &str, opts: &Options) -> Result<Window, HistoryError> {
    let index = index::open(receipts, manifest, opts.index)?;
    let n = index.runs().len();
    if n == 0 {
        return Err(HistoryError::NoRuns {
            receipts: receipts.to_path_buf(),
            manifest: manifest.to_string(),
            held: manifests(receipts)?,
        });
    }
    let first = opts.last.map_or(0, |k| n.saturating_sub(k.max(1)));
    let outline = index.outline(first..n)?;
    let chosen = select(&outline, manifest, &opts.filters)?;
    Ok(Window {
        every: chosen.len() == outline.len(),
        index,
        receipts: receipts.to_path_buf(),
        manifest: manifest.to_string(),
        first,
        chosen: chosen.into_iter().collect(),
    })
}

impl Window {
    /// The runs shown, oldest first.
    pub fn runs(&self) -> &[RunSummary] {
        &self.index.runs()[self.first..]
    }

    /// The selected cells, in order.
    pub fn cells(&self) -> &[String] {
        &self.chosen
    }

    pub fn manifest(&self) -> &str {
        &self.manifest
    }

    pub fn receipts(&self) -> &Path {
        &self.receipts
    }

    /// The history of the runs shown for `cells` (a run of [`Window::cells`], in order):
    /// their rows, and each one's newest row before the window, read from the index.
    pub fn part(&self, cells: &[String]) -> Result<History, HistoryError> {
        let n = self.index.runs().len();
        let part: BTreeSet<String> = cells.iter().cloned().collect();
        let whole = self.every && part.len() == self.chosen.len();
        let records = self
            .index
            .records(self.first..n, (!whole).then_some(&part))?;
        let before = self.index.previous(self.first, &part)?;
        Ok(build_history(
            &self.receipts,
            &self.manifest,
            records,
            &part,
            &before,
        ))
    }
}

/// Builds the history from records (oldest first): selects the cells, walks each one's
/// points computing what changed against the previous point, then keeps the newest `last`.
pub fn assemble(
    receipts: &Path,
    manifest: &str,
    records: &[RunRecord],
    opts: &Options,
) -> Result<History, HistoryError> {
    let first = opts
        .last
        .map_or(0, |n| records.len().saturating_sub(n.max(1)));
    let mut outline = BTreeMap::new();
    for r in &records[first..] {
        for (id, f) in &r.cells {
            outline.insert(id.clone(), f.tags.clone());
        }
    }
    let chosen = select(&outline, manifest, &opts.filters)?;
    let before: BTreeMap<String, CellFacts> = chosen
        .iter()
        .filter_map(|id| {
            records[..first]
                .iter()
                .rev()
                .find_map(|r| r.cells.get(id))
                .map(|f| (id.clone(), f.clone()))
        })
        .collect();
    Ok(build_history(
        receipts,
        manifest,
        records[first..].to_vec(),
        &chosen,
        &before,
    ))
}

/// The cells the filters select among `outline`'s (cell id → tags).
fn select(
    outline: &BTreeMap<String, Vec<String>>,
    manifest: &str,
    filters: &[String],
) -> Result<BTreeSet<String>, HistoryError> {
    let selector = Selector::new(filters)?;
    let mut chosen: BTreeSet<String> = if selector.includes.is_empty() {
        outline.keys().cloned().collect()
    } else {
        BTreeSet::new()
    };
    let tags = |id: &str| -> Vec<&str> {
        outline
            .get(id)
            .map(|t| t.iter().map(String::as_str).collect())
            .unwrap_or_default()
    };
    for (filter, m) in &selector.includes {
        let hits: Vec<&String> = outline.keys().filter(|id| m.hits(id, &tags(id))).collect();
        if hits.is_empty() {
            return Err(HistoryError::NoMatch {
                filter: filter.clone(),
                manifest: manifest.to_string(),
                near: crate::words::diagnostics::did_you_mean(
                    filter,
                    outline.keys().map(String::as_str),
                )
                .map(str::to_string),
            });
        }
        chosen.extend(hits.into_iter().cloned());
    }
    for (_, m) in &selector.excludes {
        chosen.retain(|id| !m.hits(id, &tags(id)));
    }
    Ok(chosen)
}

/// The history of the runs `shown` (oldest first), for the cells `chosen`; `before` holds
/// each cell's facts in the newest run before the first shown, what its first point is
/// compared with. The facts move from the records into the points (a window of a thousand
/// cells is not held twice).
fn build_history(
    receipts: &Path,
    manifest: &str,
    mut shown: Vec<RunRecord>,
    chosen: &BTreeSet<String>,
    before: &BTreeMap<String, CellFacts>,
) -> History {
    let runs = shown.iter().map(|r| r.run.clone()).collect();
    let cells = chosen
        .iter()
        .map(|id| CellHistory {
            id: id.clone(),
            points: timeline(id, &mut shown, before.get(id)),
        })
        .collect();
    History {
        receipts: receipts.to_path_buf(),
        manifest: manifest.to_string(),
        runs,
        cells,
    }
}

/// One point per record for cell `id` (its facts taken out of the records), each compared
/// with the previous point where the cell existed (`seed` for the first).
fn timeline(id: &str, records: &mut [RunRecord], seed: Option<&CellFacts>) -> Vec<Point> {
    let mut points: Vec<Point> = Vec::with_capacity(records.len());
    let mut last: Option<usize> = None;
    for r in records.iter_mut() {
        let facts = r.cells.remove(id);
        let previous = last
            .and_then(|i| points[i].facts.as_ref())
            .or(if last.is_none() { seed } else { None });
        let (inputs_changed, bits_moved) = match (previous, &facts) {
            (Some(a), Some(b)) => (a.inputs != b.inputs, a.artifacts != b.artifacts),
            _ => (false, false),
        };
        if facts.is_some() {
            last = Some(points.len());
        }
        points.push(Point {
            run: r.run.id.clone(),
            commit: r.run.commit.clone(),
            start: r.run.start.clone(),
            absent: facts.is_none(),
            inputs_changed,
            bits_moved,
            facts,
        });
    }
    points
}

/// One filter compiled: a glob (matched as `run --filter` matches it) or a tag.
enum Matcher {
    Glob {
        exact: String,
        glob: Option<globset::GlobMatcher>,
    },
    Tag(String),
}

impl Matcher {
    fn hits(&self, id: &str, tags: &[&str]) -> bool {
        match self {
            Matcher::Tag(t) => tags.contains(&t.as_str()),
            Matcher::Glob { exact, glob } => {
                let node = id.split('[').next().unwrap_or(id);
                id == exact
                    || glob
                        .as_ref()
                        .is_some_and(|g| g.is_match(id) || g.is_match(node))
            }
        }
    }
}

struct Selector {
    includes: Vec<(String, Matcher)>,
    excludes: Vec<(String, Matcher)>,
}

impl Selector {
    fn new(filters: &[String]) -> Result<Selector, HistoryError> {
        let mut s = Selector {
            includes: Vec::new(),
            excludes: Vec::new(),
        };
        for f in filters {
            let (list, text) = match f.strip_prefix('!') {
                Some(rest) => (&mut s.excludes, rest),
                None => (&mut s.includes, f.as_str()),
            };
            let m = match text.strip_prefix("tag:") {
                Some(tag) => Matcher::Tag(tag.to_string()),
                None => Matcher::Glob {
                    exact: text.to_string(),
                    // A whole cell id may not be a valid glob (a quoted value can hold `]`);
                    // it still selects its cell by exact match, as for `run --filter`.
                    glob: match crate::plan::filter_glob(text) {
                        Ok(g) => Some(g),
                        Err(_) if text.contains('[') && text.ends_with(']') => None,
                        Err(error) => {
                            return Err(HistoryError::BadFilter {
                                filter: text.to_string(),
                                error,
                            });
                        }
                    },
                },
            };
            list.push((text.to_string(), m));
        }
        Ok(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts(verdict: Verdict, inputs: &str, bits: &str) -> CellFacts {
        CellFacts {
            verdict,
            good: verdict.as_expected(),
            reason: None,
            inputs: inputs.to_string(),
            artifacts: BTreeMap::from([("out.bin".to_string(), bits.to_string())]),
            metrics: BTreeMap::new(),
            seconds: 1.0,
            logs: None,
            failed_check: None,
            carried_from: None,
            tags: vec!["t".to_string()],
            gpus: Vec::new(),
            code_known: true,
            flipped_within: false,
            moved_within: false,
            warns: 0,
            warning: None,
        }
    }

    fn record(n: usize, cells: &[(&str, CellFacts)]) -> RunRecord {
        RunRecord {
            schema: INDEX_SCHEMA,
            stamp: Stamp {
                mtime_ns: 0,
                size: 0,
                inode: 0,
            },
            run: RunSummary {
                id: format!("run{n}"),
                commit: "c".to_string(),
                commit_sha: None,
                subject: None,
                start: format!("2026-12-0{n}T00:00:00Z"),
                end: Some("e".to_string()),
                verdict: "pass".to_string(),
                counts: BTreeMap::new(),
                host: "h".to_string(),
                dir: format!("c/m/run{n}"),
                gpus: Vec::new(),
                driver: None,
                name: "m".to_string(),
                seconds: None,
                carried: 0,
                carried_from: None,
            },
            cells: cells
                .iter()
                .map(|(id, f)| (id.to_string(), f.clone()))
                .collect(),
        }
    }

    #[test]
    fn points_say_what_changed_since_the_cell_last_existed() {
        use Verdict::{Fail, Pass};
        let records = [
            record(1, &[("a[x=1]", facts(Pass, "i1", "b1"))]),
            record(2, &[("b", facts(Pass, "j", "k"))]),
            record(3, &[("a[x=1]", facts(Fail, "i2", "b1"))]),
            record(4, &[("a[x=1]", facts(Fail, "i2", "b2"))]),
        ];
        let h = assemble(Path::new("/r"), "m", &records, &Options::default()).unwrap();
        assert_eq!(h.runs.len(), 4);
        let a = &h.cells[0];
        assert_eq!(a.id, "a[x=1]");
        let marks: Vec<(bool, bool, bool)> = a
            .points
            .iter()
            .map(|p| (p.absent, p.inputs_changed, p.bits_moved))
            .collect();
        assert_eq!(
            marks,
            [
                (false, false, false),
                (true, false, false),
                (false, true, false),
                (false, false, true)
            ]
        );
        assert_eq!(a.flips(), 1);
        // The window keeps what changed against a run before it.
        let opts = Options {
            last: Some(2),
            filters: vec!["a".to_string()],
            ..Options::default()
        };
        let h = assemble(Path::new("/r"), "m", &records, &opts).unwrap();
        assert_eq!(h.runs.len(), 2);
        assert_eq!(h.cells.len(), 1, "a node id selects its cells");
        assert!(h.cells[0].points[0].inputs_changed);
        // Exclusions, tags, and a filter that matches nothing.
        let only = |f: &[&str]| {
            let opts = Options {
                filters: f.iter().map(|s| s.to_string()).collect(),
                ..Options::default()
            };
            assemble(Path::new("/r"), "m", &records, &opts)
                .map(|h| h.cells.into_iter().map(|c| c.id).collect::<Vec<String>>())
        };
        assert_eq!(only(&["!a"]).unwrap(), ["b"]);
        assert_eq!(only(&["tag:t", "!b"]).unwrap(), ["a[x=1]"]);
        let err = only(&["bb"]).unwrap_err().to_string();
        assert!(err.contains("did you mean \"b\""), "{err}");
    }
}
