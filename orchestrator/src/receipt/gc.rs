//! Deleting old receipt trees (`memra-orch gc --keep N`): which trees go, every one but the
//! N newest runs (by start time) of each manifest ([`plan`]), and deleting one, then its
//! commit folder when that is left empty ([`delete`]). A tree is deleted under its run
//! lock, so a run writing it is never pulled out from under (that tree is kept and named).
//! Only folders holding a `run.json` are ever deleted: anything else under the receipts
//! folder is not ours.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::error::{ReceiptError, ReceiptErrorKind as Kind};
use super::resolve::FoundRun;
use super::tree::{RunLock, Tree};

/// What `gc` decided: trees to delete, newest first within each manifest.
pub fn plan(runs: &[FoundRun], keep: usize, manifest: Option<&str>) -> Vec<PathBuf> {
    let mut per_manifest: BTreeMap<&str, usize> = BTreeMap::new();
    let mut doomed = Vec::new();
    // `runs` is newest first, so the first `keep` of each manifest survive.
    for r in runs {
        if manifest.is_some_and(|m| r.run.name != m) {
            continue;
        }
        let seen = per_manifest.entry(r.run.name.as_str()).or_default();
        *seen += 1;
        if *seen > keep {
            doomed.push(r.dir.clone());
        }
    }
    doomed
}

/// Deletes one tree under its lock; the commit folder goes too when it is left empty.
pub fn delete(dir: &Path) -> Result<(), ReceiptError> {
    let tree = Tree {
        dir: dir.to_path_buf(),
    };
    let lock = RunLock::acquire(&tree)?;
    let parent = dir
        .parent()
        .ok_or_else(|| ReceiptError::new(dir, Kind::NoParent))?;
    let name = dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    // Renamed aside first so that a reader never sees half a tree as a run.
    let trash = parent.join(format!(".gc-{name}-{}", std::process::id()));
    std::fs::rename(dir, &trash).map_err(|e| ReceiptError::new(dir, Kind::MoveAside(e)))?;
    drop(lock);
    std::fs::remove_dir_all(&trash).map_err(|e| ReceiptError::new(&trash, Kind::Delete(e)))?;
    // Fails (and is meant to) when other manifests' trees are still there.
    let _ = std::fs::remove_dir(parent);
    Ok(())
}
