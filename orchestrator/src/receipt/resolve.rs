//! Turning what a user names on the command line into a run's tree folder: a run folder, a
//! run id, a commit folder, `latest` / `previous`, `last-green`, `last-green:CELL`,
//! `@YYYY-MM-DD`, or a commit-ish that git resolves to a
//! sha whose `<sha>[-dirty]/<manifest>` lives under the receipts folder (a commit means its
//! newest complete run). Shared by `diff`, `show`, `ls`, `gc` and `run` itself, which also
//! use [`list_runs`] to see every run under a receipts folder, in both layouts (run folders
//! with ids, and the older one tree per manifest and commit).
//!
//! It reads folder listings and `run.json` files only; it never writes.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use super::error::FindError;
use super::tree::is_run_id;
use super::{RunReceipt, read_json};

/// The receipts folder: `--receipts` when given (relative to the current folder), else
/// `receipts/` at the top of the git work tree of the current folder, else `./receipts`.
pub fn receipts_root(given: Option<&Path>) -> Result<PathBuf, FindError> {
    let cwd = std::env::current_dir().map_err(FindError::CurrentDir)?;
    Ok(match given {
        Some(p) => cwd.join(p),
        None => git(&cwd, &["rev-parse", "--show-toplevel"])
            .map(PathBuf::from)
            .unwrap_or(cwd)
            .join("receipts"),
    })
}

/// One run found under a receipts folder.
#[derive(Debug, Clone)]
pub struct FoundRun {
    /// The folder holding its `run.json`: `<receipts>/<commit>/<manifest>/<run-id>`, or
    /// `<receipts>/<commit>/<manifest>` for a tree of the layout before run ids.
    pub dir: PathBuf,
    /// The commit folder name.
    pub commit: String,
    /// The run id (its folder name); `None` for the old layout.
    pub id: Option<String>,
    pub run: RunReceipt,
}

impl FoundRun {
    /// The run id, or `-` for a tree of the old layout.
    pub fn id_label(&self) -> &str {
        self.id.as_deref().unwrap_or("-")
    }

    /// Whether the run ended (was not killed while running).
    pub fn complete(&self) -> bool {
        self.run.end.is_some()
    }
}

/// What naming or listing a run needs of it: its `run.json` without the node index (the
/// count of carried receipts kept). The history index holds it for every run, so `ls`,
/// `show` and `diff` name runs without parsing every `run.json` ([`resolve_with`]); the
/// trees give it too ([`tree_heads`]).
#[derive(Debug, Clone, PartialEq)]
pub struct RunHead {
    /// The folder holding its `run.json`.
    pub dir: PathBuf,
    /// The commit folder name.
    pub commit: String,
    /// The run id; `None` for the old layout.
    pub id: Option<String>,
    /// The manifest's `name`.
    pub name: String,
    pub start: String,
    pub end: Option<String>,
    pub seconds: Option<f64>,
    pub host: String,
    pub verdict: String,
    pub counts: std::collections::BTreeMap<crate::words::verdict::Verdict, usize>,
    /// How many of its cells were carried from an earlier run.
    pub carried: usize,
    /// The run `--rerun-failed` or `--exclude` carried from.
    pub carried_from: Option<String>,
}

impl RunHead {
    /// The head of a run read from its tree.
    pub fn of(r: &FoundRun) -> RunHead {
        RunHead {
            dir: r.dir.clone(),
            commit: r.commit.clone(),
            id: r.id.clone(),
            name: r.run.name.clone(),
            start: r.run.start.clone(),
            end: r.run.end.clone(),
            seconds: r.run.seconds,
            host: r.run.host.clone(),
            verdict: r.run.verdict.clone(),
            counts: r.run.counts.clone(),
            carried: r.run.carried_count(),
            carried_from: r.run.carried_from.clone(),
        }
    }

    /// The run id, or `-` for a tree of the old layout.
    pub fn id_label(&self) -> &str {
        self.id.as_deref().unwrap_or("-")
    }

    /// Whether the run finished with every cell as expected (`pass` or `skipped`).
    pub fn green(&self) -> bool {
        is_green(self.end.is_some(), &self.verdict, &self.counts)
    }
}

/// Whether a run that `ended` (or not) with `verdict` and `counts` is green: finished with
/// every cell as expected (`pass` or `skipped`). What `last-green` names, one rule for the
/// trees, the run heads and the history index's summaries.
pub fn is_green(
    ended: bool,
    verdict: &str,
    counts: &std::collections::BTreeMap<crate::words::verdict::Verdict, usize>,
) -> bool {
    ended && verdict != "running" && counts.iter().all(|(v, n)| *n == 0 || v.as_expected())
}

/// The order of [`list_runs`], newest first, as a sort key: a run of unknown age last, then
/// by start time and run id, newest first, then by folder.
type NewestFirst = (
    bool,
    std::cmp::Reverse<Option<std::time::SystemTime>>,
    std::cmp::Reverse<Option<String>>,
    PathBuf,
);

fn newest_first(
    start: &str,
    id: &Option<String>,
    dir: &Path,
    now: std::time::SystemTime,
) -> NewestFirst {
    (
        unknown_age_at(start, now),
        std::cmp::Reverse(start_time(start)),
        std::cmp::Reverse(id.clone()),
        dir.to_path_buf(),
    )
}

/// Where [`resolve_with`] gets the runs: every readable run under a receipts folder, newest
/// first (as [`list_runs`] orders them).
pub type Heads<'a> = &'a dyn Fn(&Path) -> Result<Vec<RunHead>, FindError>;

/// [`list_runs`] as heads: every `run.json` parsed.
pub fn tree_heads(receipts: &Path) -> Result<Vec<RunHead>, FindError> {
    Ok(list_runs(receipts)?.iter().map(RunHead::of).collect())
}

/// Orders heads newest first, as [`list_runs`] orders runs.
pub fn sort_heads_newest_first(runs: &mut [RunHead]) {
    let now = std::time::SystemTime::now();
    runs.sort_by_cached_key(|r| newest_first(&r.start, &r.id, &r.dir, now));
}

/// Every readable run under `receipts`, newest first (by start time, then run id). Folders
/// without a readable `run.json` are not runs and are left out.
pub fn list_runs(receipts: &Path) -> Result<Vec<FoundRun>, FindError> {
    Ok(list_runs_and_unreadable(receipts)?.0)
}

/// [`list_runs`], and the run folders (named by a run id) whose `run.json` is missing or
/// cannot be read (a run killed as it began, a damaged tree), found in the same pass.
pub fn list_runs_and_unreadable(
    receipts: &Path,
) -> Result<(Vec<FoundRun>, Vec<PathBuf>), FindError> {
    let mut unreadable = Vec::new();
    let commits = std::fs::read_dir(receipts).map_err(|error| FindError::ListReceipts {
        receipts: receipts.to_path_buf(),
        error,
    })?;
    let mut runs = Vec::new();
    for commit in commits.flatten() {
        // Dot folders are memra-orch's own (`.memra-index`, `.memra-store`, `.memra-bisect`),
        // never a commit's runs.
        if !commit.file_type().is_ok_and(|t| t.is_dir())
            || commit.file_name().to_string_lossy().starts_with('.')
        {
            continue;
        }
        let Ok(manifests) = std::fs::read_dir(commit.path()) else {
            continue;
        };
        let commit_name = commit.file_name().to_string_lossy().into_owned();
        for m in manifests.flatten() {
            if m.file_type().is_ok_and(|t| t.is_dir()) {
                runs.extend(runs_in(&m.path(), &commit_name, &mut unreadable));
            }
        }
    }
    sort_newest_first(&mut runs);
    unreadable.sort();
    Ok((runs, unreadable))
}

/// The runs in one manifest folder (`<receipts>/<commit>/<manifest>`), newest first: the
/// run folders in it and, for the old layout, the folder itself.
pub fn runs_in_manifest_dir(manifest_dir: &Path) -> Vec<FoundRun> {
    let commit = manifest_dir
        .parent()
        .and_then(Path::file_name)
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let mut runs = runs_in(manifest_dir, &commit, &mut Vec::new());
    sort_newest_first(&mut runs);
    runs
}

/// The runs in one manifest folder; run folders without a readable `run.json` go to
/// `unreadable`.
fn runs_in(manifest_dir: &Path, commit: &str, unreadable: &mut Vec<PathBuf>) -> Vec<FoundRun> {
    let mut runs = Vec::new();
    let found = |dir: PathBuf, id: Option<String>| {
        let run = read_json::<RunReceipt>(&dir.join("run.json"))
            .ok()
            .flatten()?;
        Some(FoundRun {
            dir,
            commit: commit.to_string(),
            id,
            run,
        })
    };
    runs.extend(found(manifest_dir.to_path_buf(), None));
    if let Ok(entries) = std::fs::read_dir(manifest_dir) {
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if is_run_id(&name) && e.file_type().is_ok_and(|t| t.is_dir()) {
                match found(e.path(), Some(name)) {
                    Some(r) => runs.push(r),
                    None => unreadable.push(e.path()),
                }
            }
        }
    }
    runs
}

/// Newest first by start time; a run of unknown age ([`unknown_age`]: dated in the future,
/// or with a start time that does not parse) comes after every other, so it never stays
/// `latest` once the clock is right again.
fn sort_newest_first(runs: &mut [FoundRun]) {
    let now = std::time::SystemTime::now();
    runs.sort_by_cached_key(|r| newest_first(&r.run.start, &r.id, &r.dir, now));
}

/// How far ahead of this machine's clock a start time may be and still count as now
/// (clocks of the hosts that share a receipts folder differ a little).
pub const FUTURE_SLACK: std::time::Duration = std::time::Duration::from_secs(600);

/// A run's start time as a point in time: RFC 3339 with `Z` or a `±HH:MM` offset (memra-orch
/// writes `Z`; a hand-edited or foreign `run.json` may not). `None` when it does not parse.
pub fn start_time(start: &str) -> Option<std::time::SystemTime> {
    let s = start.trim();
    // `…T04:00:00.000+05:00`: the offset's sign sits 6 characters from the end (humantime
    // would read the time and drop the offset).
    let cut = s.len().checked_sub(6)?;
    let (base, offset) = (s.get(..cut)?, s.get(cut..)?);
    let sign = match offset.as_bytes()[0] {
        b'+' if base.contains('T') => 1i64,
        b'-' if base.contains('T') => -1,
        _ => return humantime::parse_rfc3339_weak(s).ok(),
    };
    let (h, m) = offset[1..].split_once(':')?;
    let secs = (h.parse::<i64>().ok()? * 60 + m.parse::<i64>().ok()?) * 60;
    let local = humantime::parse_rfc3339_weak(base).ok()?;
    let shift = std::time::Duration::from_secs(secs.unsigned_abs());
    // Local time minus the offset is UTC.
    if sign * secs >= 0 {
        local.checked_sub(shift)
    } else {
        local.checked_add(shift)
    }
}

/// Whether a run's age is unknown: its start time does not parse, or lies ahead of this
/// machine's clock by more than [`FUTURE_SLACK`] (its clock was ahead when it ran: a reset
/// RTC, a wrong NTP). Such a run is never `latest` or `previous`, and `gc` neither counts
/// nor deletes it.
pub fn unknown_age(start: &str) -> bool {
    unknown_age_at(start, std::time::SystemTime::now())
}

fn unknown_age_at(start: &str, now: std::time::SystemTime) -> bool {
    start_time(start).is_none_or(|t| t > now + FUTURE_SLACK)
}

/// The most recent run of this manifest under the receipts folder (by start time), any
/// commit. Called before a run writes its own `run.json`, so an earlier run of the same
/// commit counts as the previous run.
pub fn previous_run(receipts: &Path, manifest_name: &str) -> Option<RunReceipt> {
    // Only this manifest's folders are read: a run starts by reading its own history, not
    // every run.json of every manifest under the receipts folder.
    let mut runs: Vec<FoundRun> = std::fs::read_dir(receipts)
        .ok()?
        .flatten()
        .filter(|c| c.file_type().is_ok_and(|t| t.is_dir()))
        .flat_map(|c| {
            let commit = c.file_name().to_string_lossy().into_owned();
            runs_in(&c.path().join(manifest_name), &commit, &mut Vec::new())
        })
        .collect();
    sort_newest_first(&mut runs);
    runs.into_iter().next().map(|r| r.run)
}

/// Seconds per cell id from a run, for cells that actually ran in it.
pub fn durations(run: &RunReceipt) -> HashMap<String, f64> {
    run.nodes
        .iter()
        .filter(|n| {
            n.verdict != crate::words::verdict::Verdict::Skipped
                && n.seconds > 0.0
                && n.carried.is_none()
        })
        .map(|n| (n.id.clone(), n.seconds))
        .collect()
}

/// Resolves `spec` to a run's tree folder (the folder holding its `run.json`):
/// 1. an existing folder: a run folder (holding `run.json`), a manifest folder or a commit
///    folder (their newest complete run);
/// 2. `latest` / `previous`: the newest run under `receipts` and the one before it of the
///    same manifest (`--manifest` narrows both to one manifest); `last-green`,
///    `last-green:CELL` and `@YYYY-MM-DD` (see [`alias`]);
/// 3. a run id, or a prefix of one that names a single run;
/// 4. a commit folder name under `receipts` (`<sha>-dirty`, a `--commit` id, `no-git`):
///    its newest complete run;
/// 5. a commit-ish git resolves in the current folder (`HEAD~1`, a short sha, a tag), with an
///    optional `-dirty` suffix: `<sha>` is used when it exists, else `<sha>-dirty`.
pub fn resolve(spec: &str, receipts: &Path, manifest: Option<&str>) -> Result<PathBuf, FindError> {
    resolve_with(spec, receipts, manifest, &tree_heads)
}

/// [`resolve`] with the runs from `heads` (the history index's, for the commands).
pub fn resolve_with(
    spec: &str,
    receipts: &Path,
    manifest: Option<&str>,
    heads: Heads,
) -> Result<PathBuf, FindError> {
    let as_path = Path::new(spec);
    if as_path.is_dir() {
        if as_path.join("run.json").is_file()
            && as_path
                .file_name()
                .is_some_and(|n| is_run_id(&n.to_string_lossy()))
        {
            return Ok(as_path.to_path_buf());
        }
        if let Some(run) = newest_complete(as_path) {
            return Ok(run);
        }
        return pick_manifest(as_path, manifest, spec);
    }
    if spec == "latest" || spec == "previous" {
        // A run of unknown age is never the latest or the one before it.
        let runs: Vec<RunHead> = heads(receipts)?
            .into_iter()
            .filter(|r| manifest.is_none_or(|m| r.name == m) && !unknown_age(&r.start))
            .collect();
        let latest = runs.first().ok_or_else(|| FindError::NoRun {
            spec: spec.to_string(),
            manifest: manifest.map(str::to_string),
            receipts: receipts.to_path_buf(),
        })?;
        if spec == "latest" {
            return Ok(latest.dir.clone());
        }
        return runs
            .iter()
            .skip(1)
            .find(|r| r.name == latest.name)
            .map(|r| r.dir.clone())
            .ok_or_else(|| FindError::OnlyOneRun {
                manifest: latest.name.clone(),
                receipts: receipts.to_path_buf(),
            });
    }
    if spec == "last-green" || spec.starts_with("last-green:") || spec.starts_with('@') {
        return alias(spec, receipts, manifest, heads);
    }
    if looks_like_run_id(spec) {
        let hits: Vec<RunHead> = heads(receipts)?
            .into_iter()
            .filter(|r| r.id.as_deref().is_some_and(|id| id.starts_with(spec)))
            .filter(|r| manifest.is_none_or(|m| r.name == m))
            .collect();
        match hits.as_slice() {
            [one] => return Ok(one.dir.clone()),
            [] => {}
            many => {
                return Err(FindError::ManyRuns {
                    spec: spec.to_string(),
                    matches: many.iter().map(|r| r.id_label().to_string()).collect(),
                });
            }
        }
    }
    if super::load::is_plain_name(spec) && receipts.join(spec).is_dir() {
        return pick_manifest(&receipts.join(spec), manifest, spec);
    }
    let (base, dirty) = match spec.strip_suffix("-dirty") {
        Some(b) => (b, true),
        None => (spec, false),
    };
    let cwd = std::env::current_dir().unwrap_or_else(|_| PathBuf::from("."));
    let sha = git(
        &cwd,
        &[
            "rev-parse",
            "--verify",
            "--quiet",
            &format!("{base}^{{commit}}"),
        ],
    )
    .ok_or_else(|| FindError::Unknown {
        spec: spec.to_string(),
        receipts: receipts.to_path_buf(),
    })?;
    let clean = receipts.join(&sha);
    let dirty_dir = receipts.join(format!("{sha}-dirty"));
    let dir = if !dirty && clean.is_dir() {
        clean
    } else if dirty_dir.is_dir() {
        dirty_dir
    } else {
        return Err(FindError::NoReceiptsForCommit {
            spec: spec.to_string(),
            sha,
            receipts: receipts.to_path_buf(),
            dirty,
        });
    };
    pick_manifest(&dir, manifest, spec)
}

/// `last-green`, `last-green:CELL` and `@YYYY-MM-DD`, among the runs of `manifest` (or of
/// the newest run's manifest, as for `previous`), newest first:
/// - `last-green`: the newest complete run whose every cell was as expected;
/// - `last-green:CELL`: the newest run in which cell CELL (an exact cell id) was as expected;
/// - `@YYYY-MM-DD`: the last run that started on that UTC day.
fn alias(
    spec: &str,
    receipts: &Path,
    manifest: Option<&str>,
    heads: Heads,
) -> Result<PathBuf, FindError> {
    // `last-green:CELL` reads every run's node index: the trees'.
    if spec.starts_with("last-green:") {
        return last_green_cell(spec, receipts, manifest);
    }
    let all = heads(receipts)?;
    let name = match manifest {
        Some(m) => m.to_string(),
        None => all
            .first()
            .map(|r| r.name.clone())
            .ok_or_else(|| FindError::NoRun {
                spec: spec.to_string(),
                manifest: None,
                receipts: receipts.to_path_buf(),
            })?,
    };
    let runs: Vec<&RunHead> = all.iter().filter(|r| r.name == name).collect();
    let Some(newest) = runs.first() else {
        return Err(FindError::NoRun {
            spec: spec.to_string(),
            manifest: Some(name),
            receipts: receipts.to_path_buf(),
        });
    };
    if let Some(day) = spec.strip_prefix('@') {
        let b = day.as_bytes();
        let well_formed = b.len() == 10
            && b[4] == b'-'
            && b[7] == b'-'
            && b.iter()
                .enumerate()
                .all(|(i, c)| i == 4 || i == 7 || c.is_ascii_digit());
        if !well_formed {
            return Err(FindError::BadDay {
                spec: spec.to_string(),
            });
        }
        let prefix = format!("{day}T");
        return runs
            .iter()
            .find(|r| r.start.starts_with(&prefix))
            .map(|r| r.dir.clone())
            .ok_or_else(|| FindError::NoRunOnDay {
                spec: spec.to_string(),
                manifest: name.clone(),
                runs: runs.len(),
                first: runs.last().map(|r| day_of(&r.start)).unwrap_or_default(),
                last: day_of(&newest.start),
            });
    }
    runs.iter()
        .find(|r| r.green())
        .map(|r| r.dir.clone())
        .ok_or_else(|| FindError::NoGreen {
            manifest: name.clone(),
            runs: runs.len(),
            newest_bad: newest
                .counts
                .iter()
                .filter(|(v, _)| !v.as_expected())
                .map(|(_, n)| n)
                .sum(),
        })
}

/// `last-green:CELL`: the newest run of the manifest (named, or the newest run's) in which
/// cell CELL (an exact cell id) was as expected, read from the runs' node indexes.
fn last_green_cell(
    spec: &str,
    receipts: &Path,
    manifest: Option<&str>,
) -> Result<PathBuf, FindError> {
    let all = list_runs(receipts)?;
    let name = match manifest {
        Some(m) => m.to_string(),
        None => all
            .first()
            .map(|r| r.run.name.clone())
            .ok_or_else(|| FindError::NoRun {
                spec: spec.to_string(),
                manifest: None,
                receipts: receipts.to_path_buf(),
            })?,
    };
    let runs: Vec<&FoundRun> = all.iter().filter(|r| r.run.name == name).collect();
    if runs.is_empty() {
        return Err(FindError::NoRun {
            spec: spec.to_string(),
            manifest: Some(name),
            receipts: receipts.to_path_buf(),
        });
    }
    let cell = spec.strip_prefix("last-green:").unwrap_or_default();
    let verdicts: Vec<Option<crate::words::verdict::Verdict>> = runs
        .iter()
        .map(|r| r.run.nodes.iter().find(|n| n.id == cell).map(|n| n.verdict))
        .collect();
    if let Some(i) = verdicts
        .iter()
        .position(|v| v.is_some_and(|v| v.as_expected()))
    {
        return Ok(runs[i].dir.clone());
    }
    if verdicts.iter().all(Option::is_none) {
        let ids: std::collections::BTreeSet<&str> = runs
            .iter()
            .flat_map(|r| r.run.nodes.iter().map(|n| n.id.as_str()))
            .collect();
        return Err(FindError::NoSuchCell {
            cell: cell.to_string(),
            manifest: name.clone(),
            runs: runs.len(),
            near: crate::words::diagnostics::did_you_mean(cell, ids).map(str::to_string),
        });
    }
    Err(FindError::NoGreenCell {
        cell: cell.to_string(),
        manifest: name.clone(),
        runs: runs.len(),
        newest: verdicts.iter().flatten().next().copied(),
    })
}

/// What `diff` without names compares for one manifest: its newest finished run, the
/// finished run before it, and the newest green run older than that one when the one
/// before is not green. Runs that never finished (still going, or killed) are compared with
/// nothing: they are listed in `unfinished`.
#[derive(Debug, Clone)]
pub struct Morning {
    pub manifest: String,
    pub latest: FoundRun,
    pub previous: Option<FoundRun>,
    /// Older than `previous`; `None` when `previous` is green itself or no run is.
    pub last_green: Option<FoundRun>,
    /// Runs of the manifest that have not finished, newest first.
    pub unfinished: Vec<FoundRun>,
}

/// The [`Morning`] of `manifest`, or of every manifest with runs (newest run first) when
/// none is named.
pub fn morning(receipts: &Path, manifest: Option<&str>) -> Result<Vec<Morning>, FindError> {
    let all = list_runs(receipts)?;
    let mut names: Vec<String> = Vec::new();
    for r in &all {
        if manifest.is_none_or(|m| m == r.run.name) && !names.contains(&r.run.name) {
            names.push(r.run.name.clone());
        }
    }
    if names.is_empty() {
        return Err(FindError::NoRun {
            spec: "(the latest run)".to_string(),
            manifest: manifest.map(str::to_string),
            receipts: receipts.to_path_buf(),
        });
    }
    let mut out = Vec::new();
    for name in names {
        // A run of unknown age is never the morning's latest, previous or last green run.
        let (finished, unfinished): (Vec<FoundRun>, Vec<FoundRun>) = all
            .iter()
            .filter(|r| r.run.name == name && !unknown_age(&r.run.start))
            .cloned()
            .partition(FoundRun::complete);
        let mut runs = finished.into_iter();
        let Some(latest) = runs.next() else {
            // Only unfinished runs: nothing to read, and no good news.
            return Err(FindError::NoRun {
                spec: "(the latest finished run)".to_string(),
                manifest: Some(name),
                receipts: receipts.to_path_buf(),
            });
        };
        let previous = runs.next();
        let last_green = match &previous {
            Some(p) if !green(p) => runs.find(green),
            _ => None,
        };
        out.push(Morning {
            manifest: name,
            latest,
            previous,
            last_green,
            unfinished,
        });
    }
    Ok(out)
}

/// Whether a run finished with every cell as expected (`pass` or `skipped`).
pub fn green(r: &FoundRun) -> bool {
    is_green(r.complete(), &r.run.verdict, &r.run.counts)
}

/// The UTC day of an RFC 3339 time.
fn day_of(start: &str) -> String {
    start.chars().take(10).collect()
}

/// The start a run id names (`YYYYMMDDTHHMMSS.mmmZ-xxxx`), as a point in time.
pub fn run_id_start(id: &str) -> Option<std::time::SystemTime> {
    if !is_run_id(id) {
        return None;
    }
    start_time(&format!(
        "{}-{}-{}T{}:{}:{}Z",
        &id[0..4],
        &id[4..6],
        &id[6..8],
        &id[9..11],
        &id[11..13],
        &id[13..19]
    ))
}

/// Whether `spec` could be (the start of) a run id: eight digits, then `T`, then the rest of
/// one. Plain commit shas are hex and have no `T`, so the two never mix up.
fn looks_like_run_id(spec: &str) -> bool {
    let b = spec.as_bytes();
    b.len() >= 9 && b[..8].iter().all(u8::is_ascii_digit) && b[8] == b'T'
}

/// The newest complete run in a manifest folder, else its newest run; `None` when the
/// folder holds no run.
fn newest_complete(manifest_dir: &Path) -> Option<PathBuf> {
    let runs = runs_in_manifest_dir(manifest_dir);
    runs.iter()
        .find(|r| r.complete())
        .or_else(|| runs.first())
        .map(|r| r.dir.clone())
}

/// The newest complete run of `manifest` inside a commit folder, or of the only manifest
/// there is.
fn pick_manifest(
    commit_dir: &Path,
    manifest: Option<&str>,
    spec: &str,
) -> Result<PathBuf, FindError> {
    let mut names: Vec<String> = std::fs::read_dir(commit_dir)
        .map_err(|error| FindError::ListCommit {
            dir: commit_dir.to_path_buf(),
            error,
        })?
        .flatten()
        .filter(|e| !runs_in(&e.path(), "", &mut Vec::new()).is_empty())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    let chosen = match manifest {
        Some(m) if names.iter().any(|n| n == m) => m.to_string(),
        Some(m) => {
            return Err(FindError::NoSuchManifest {
                spec: spec.to_string(),
                dir: commit_dir.to_path_buf(),
                manifest: m.to_string(),
                held: names,
            });
        }
        None => match names.as_slice() {
            [one] => one.clone(),
            [] => {
                return Err(FindError::NoTree {
                    spec: spec.to_string(),
                    dir: commit_dir.to_path_buf(),
                });
            }
            _ => {
                return Err(FindError::SeveralManifests {
                    spec: spec.to_string(),
                    dir: commit_dir.to_path_buf(),
                    held: names,
                });
            }
        },
    };
    newest_complete(&commit_dir.join(&chosen)).ok_or_else(|| FindError::NoTree {
        spec: spec.to_string(),
        dir: commit_dir.to_path_buf(),
    })
}

/// Runs git in `dir`; its trimmed stdout when it succeeded and printed something.
fn git(dir: &Path, args: &[&str]) -> Option<String> {
    crate::receipt::commit::git(dir, args).filter(|s| !s.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn start_times_with_offsets_and_unknown_ages() {
        let z = start_time("2026-12-04T23:00:00.000Z").unwrap();
        assert_eq!(start_time("2026-12-05T04:00:00.000+05:00"), Some(z));
        assert_eq!(start_time("2026-12-04T20:00:00-03:00"), Some(z));
        assert_eq!(start_time("zzz"), None);
        assert_eq!(start_time(""), None);
        assert!(unknown_age("zzz"));
        assert!(unknown_age("2099-01-01T00:00:00Z"));
        assert!(!unknown_age("2026-12-05T04:00:00.000+05:00"));
    }

    fn run_json(dir: &Path, name: &str, start: &str, complete: bool) {
        std::fs::create_dir_all(dir).unwrap();
        let run = serde_json::json!({
            "schema": 1, "name": name, "manifest": {"path": "m", "bytes": 0, "sha256": ""},
            "env_matrices": [], "commit": "c", "commit_sha": null, "dirty": false, "host": "h",
            "orchestrator_version": "0", "inventory": null, "cpu_slots": 1, "filters": [],
            "resumed": false, "start": start, "end": if complete { Some(start) } else { None },
            "seconds": 1.0, "interrupted": false, "counts": {}, "verdict": "pass",
            "nodes": [{"id": "a", "kind": "arm", "slug": "a-1", "verdict": "pass", "seconds": 2.0}]
        });
        std::fs::write(dir.join("run.json"), run.to_string()).unwrap();
    }

    const ID1: &str = "20261102T000000.000Z-aaaa";
    const ID2: &str = "20261102T010000.000Z-bbbb";
    const ID3: &str = "20261103T000000.000Z-cccc";

    #[test]
    fn commit_folders_run_ids_latest_previous_and_manifest_choice() {
        let tmp = tempfile::tempdir().unwrap();
        let r = tmp.path();
        // c1: a tree of the layout before run ids.
        run_json(&r.join("c1/smoke"), "smoke", "2026-11-01T00:00:00Z", true);
        // c2: two runs of smoke (the newer one killed while running) and one of nightly.
        run_json(
            &r.join("c2/smoke").join(ID1),
            "smoke",
            "2026-11-02T00:00:00Z",
            true,
        );
        run_json(
            &r.join("c2/smoke").join(ID2),
            "smoke",
            "2026-11-02T01:00:00Z",
            false,
        );
        run_json(
            &r.join("c2/nightly").join(ID3),
            "nightly",
            "2026-11-03T00:00:00Z",
            true,
        );
        // Not runs: no run.json, or not a run id.
        std::fs::create_dir_all(r.join("c3/empty")).unwrap();
        run_json(
            &r.join("c2/smoke/nodes"),
            "smoke",
            "2026-11-09T00:00:00Z",
            true,
        );
        assert_eq!(resolve("c1", r, None).unwrap(), r.join("c1/smoke"));
        let err = resolve("c2", r, None).unwrap_err().to_string();
        assert!(
            err.contains("nightly, smoke") && err.contains("--manifest"),
            "{err}"
        );
        // A commit is its newest complete run.
        assert_eq!(
            resolve("c2", r, Some("smoke")).unwrap(),
            r.join("c2/smoke").join(ID1)
        );
        assert!(
            resolve("c3", r, None)
                .unwrap_err()
                .to_string()
                .contains("no receipt tree")
        );
        assert_eq!(
            resolve("latest", r, None).unwrap(),
            r.join("c2/nightly").join(ID3)
        );
        let err = resolve("previous", r, None).unwrap_err().to_string();
        assert!(
            err.contains("only one run of manifest \"nightly\""),
            "{err}"
        );
        assert_eq!(
            resolve("latest", r, Some("smoke")).unwrap(),
            r.join("c2/smoke").join(ID2)
        );
        assert_eq!(
            resolve("previous", r, Some("smoke")).unwrap(),
            r.join("c2/smoke").join(ID1)
        );
        // Run ids, whole or a unique start.
        assert_eq!(resolve(ID2, r, None).unwrap(), r.join("c2/smoke").join(ID2));
        assert_eq!(
            resolve("20261103T", r, None).unwrap(),
            r.join("c2/nightly").join(ID3)
        );
        let err = resolve("20261102T", r, None).unwrap_err().to_string();
        assert!(err.contains(ID1) && err.contains(ID2), "{err}");
        let runs = list_runs(r).unwrap();
        assert_eq!(runs.len(), 4);
        assert_eq!(runs[0].id.as_deref(), Some(ID3));
        assert_eq!(runs[3].id, None);
        assert_eq!(runs[3].commit, "c1");
        // Folders: a run folder is itself, a manifest folder its newest complete run.
        let folder = r.join("c2/smoke").join(ID2);
        assert_eq!(resolve(folder.to_str().unwrap(), r, None).unwrap(), folder);
        let m = r.join("c2/smoke");
        assert_eq!(resolve(m.to_str().unwrap(), r, None).unwrap(), m.join(ID1));
        let c = r.join("c2");
        assert_eq!(
            resolve(c.to_str().unwrap(), r, Some("smoke")).unwrap(),
            m.join(ID1)
        );
        let old = r.join("c1/smoke");
        assert_eq!(resolve(old.to_str().unwrap(), r, None).unwrap(), old);
    }

    #[test]
    fn previous_run_is_the_latest_of_this_manifest() {
        let dir = tempfile::tempdir().unwrap();
        let r = dir.path();
        run_json(&r.join("old/smoke"), "smoke", "2026-11-01T00:00:00Z", true);
        run_json(
            &r.join("new/smoke").join(ID1),
            "smoke",
            "2026-11-02T00:00:00Z",
            true,
        );
        run_json(
            &r.join("new/other").join(ID3),
            "other",
            "2026-11-03T00:00:00Z",
            true,
        );
        let prev = previous_run(r, "smoke").unwrap();
        assert_eq!(prev.start, "2026-11-02T00:00:00Z");
        assert_eq!(durations(&prev)["a"], 2.0);
        assert!(previous_run(r, "missing").is_none());
    }
}
