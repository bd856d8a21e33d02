//! Every run under a receipts folder as a [`RunHead`], from the history index: what `ls`
//! lists and what `show`, `diff` and `summary` name runs from (`latest`, `previous`, a run
//! id's prefix, `last-green`, `@DAY`), without parsing every `run.json` (a year of a
//! thousand-cell nightly holds 55 MB of them). The index is checked against the trees as
//! for every read ([`index::open`]), so the answer is the trees'; where it cannot serve (a
//! run whose receipts cannot be read, a receipts folder that cannot be listed) the trees
//! are read instead, as before the index.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use super::{index, manifests};
use crate::receipt::error::FindError;
use crate::receipt::resolve::{RunHead, list_runs_and_unreadable, sort_heads_newest_first};
use crate::receipt::tree::is_run_id;

/// Every readable run under `receipts`, newest first, and the run folders (named by a run
/// id) without a readable `run.json`, sorted.
pub fn heads_and_unreadable(receipts: &Path) -> Result<(Vec<RunHead>, Vec<PathBuf>), FindError> {
    if let Some(found) = from_index(receipts) {
        return Ok(found);
    }
    let (runs, unreadable) = list_runs_and_unreadable(receipts)?;
    Ok((runs.iter().map(RunHead::of).collect(), unreadable))
}

/// Every readable run under `receipts`, newest first: [`crate::receipt::resolve::Heads`]
/// for [`crate::receipt::resolve::resolve_with`].
pub fn heads(receipts: &Path) -> Result<Vec<RunHead>, FindError> {
    Ok(heads_and_unreadable(receipts)?.0)
}

/// The heads from the index of every manifest; `None` where the trees must be read (an
/// index that cannot serve, or a run folder whose `run.json` is there but not in the index:
/// one the history cannot read, which the trees list as a run all the same).
fn from_index(receipts: &Path) -> Option<(Vec<RunHead>, Vec<PathBuf>)> {
    let names = manifests(receipts).ok()?;
    let mut runs = Vec::new();
    for m in &names {
        let index = index::open_rows(receipts, m)?;
        runs.extend(index.runs().iter().map(|s| RunHead {
            dir: receipts.join(&s.dir),
            commit: s.commit.clone(),
            // `<commit>/<manifest>/<run id>`: the id is the folder's name, as the trees
            // say; a tree of the layout before run ids is its manifest folder.
            id: match s.dir.split('/').collect::<Vec<_>>().as_slice() {
                [_, _, id] => Some((*id).to_string()),
                _ => None,
            },
            name: s.name.clone(),
            start: s.start.clone(),
            end: s.end.clone(),
            seconds: s.seconds,
            host: s.host.clone(),
            verdict: s.verdict.clone(),
            counts: s.counts.clone(),
            carried: s.carried,
            carried_from: s.carried_from.clone(),
        }));
    }
    let listed: HashSet<&Path> = runs.iter().map(|r| r.dir.as_path()).collect();
    let unreadable = unreadable(receipts, &listed);
    if unreadable
        .iter()
        .any(|d| std::fs::symlink_metadata(d.join("run.json")).is_ok())
    {
        return None;
    }
    sort_heads_newest_first(&mut runs);
    Some((runs, unreadable))
}

/// The folders named by a run id under any `<commit>/<manifest>/` that are not among
/// `listed`: no `run.json`, or one that cannot be read as a run.
fn unreadable(receipts: &Path, listed: &HashSet<&Path>) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let dirs = |p: &Path| {
        std::fs::read_dir(p)
            .into_iter()
            .flatten()
            .flatten()
            .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
            .collect::<Vec<_>>()
    };
    for commit in dirs(receipts) {
        // Dot folders are memra-orch's own (`.memra-index`, `.memra-store`).
        if commit.file_name().to_string_lossy().starts_with('.') {
            continue;
        }
        for manifest in dirs(&commit.path()) {
            for run in dirs(&manifest.path()) {
                let path = run.path();
                if is_run_id(&run.file_name().to_string_lossy()) && !listed.contains(path.as_path())
                {
                    out.push(path);
                }
            }
        }
    }
    out.sort();
    out
}

/// [`heads`] read once per receipts folder however often it is asked: for a command that
/// names two runs (`diff OLD NEW`).
pub fn remembered() -> impl Fn(&Path) -> Result<Vec<RunHead>, FindError> {
    let held: std::cell::RefCell<Option<(PathBuf, Vec<RunHead>)>> = std::cell::RefCell::new(None);
    move |receipts: &Path| {
        if let Some((at, runs)) = &*held.borrow()
            && at == receipts
        {
            return Ok(runs.clone());
        }
        let runs = heads(receipts)?;
        *held.borrow_mut() = Some((receipts.to_path_buf(), runs.clone()));
        Ok(runs)
    }
}
