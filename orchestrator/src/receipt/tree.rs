//! Where things live in a receipt tree, the run lock that keeps two runs of one manifest
//! out of one tree, and reading what earlier runs left behind (the previous run's node
//! durations, receipts to keep on `--resume`).
//!
//! ```text
//! <receipts>/<commit>[-dirty]/<manifest-name>/
//!   run.json  summary.md  junit.xml  .lock
//!   nodes/<slug>/receipt.json
//!   nodes/<slug>/attempt-<n>/{stdout.log,stderr.log,checks.jsonl,artifacts/}
//! ```

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use super::error::{ReceiptError, ReceiptErrorKind as Kind};
use super::{RunReceipt, attempt_dir_name, read_json};

/// The paths of one manifest's receipt tree for one commit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tree {
    pub dir: PathBuf,
}

impl Tree {
    /// `<receipts>/<commit>/<manifest-name>`; `commit` already carries `-dirty` when due.
    pub fn new(receipts: &Path, commit: &str, manifest_name: &str) -> Tree {
        Tree {
            dir: receipts.join(commit).join(manifest_name),
        }
    }

    /// The receipts folder this tree is in (`<receipts>` above).
    pub fn receipts(&self) -> PathBuf {
        self.dir
            .ancestors()
            .nth(2)
            .map_or_else(|| self.dir.clone(), Path::to_path_buf)
    }

    pub fn run_json(&self) -> PathBuf {
        self.dir.join("run.json")
    }
    pub fn summary_md(&self) -> PathBuf {
        self.dir.join("summary.md")
    }
    pub fn junit_xml(&self) -> PathBuf {
        self.dir.join("junit.xml")
    }
    pub fn lock_file(&self) -> PathBuf {
        self.dir.join(".lock")
    }
    pub fn nodes(&self) -> PathBuf {
        self.dir.join("nodes")
    }
    pub fn node_dir(&self, slug: &str) -> PathBuf {
        self.nodes().join(slug)
    }
    pub fn receipt_json(&self, slug: &str) -> PathBuf {
        self.node_dir(slug).join("receipt.json")
    }
    pub fn attempt_dir(&self, slug: &str, n: u32) -> PathBuf {
        self.node_dir(slug).join(attempt_dir_name(n))
    }

    /// Removes the node folders of an earlier run of this tree (a fresh run, not
    /// `--resume`), so no stale attempt of a node that no longer exists survives. The old
    /// folder is renamed away first so the tree is never half-deleted under a new run.
    pub fn clear_nodes(&self) -> Result<(), ReceiptError> {
        let nodes = self.nodes();
        if !nodes.exists() {
            return Ok(());
        }
        let trash = self.dir.join(format!(".nodes.old.{}", std::process::id()));
        std::fs::rename(&nodes, &trash)
            .map_err(|e| ReceiptError::new(&nodes, Kind::MoveNodesAside(e)))?;
        std::fs::remove_dir_all(&trash)
            .map_err(|e| ReceiptError::new(&trash, Kind::RemoveOldNodes(e)))
    }
}

/// Held while a run writes a tree; removed on drop. The file holds the holder's pid so a
/// second run can name it, and a lock left by a process that no longer exists is taken over.
#[derive(Debug)]
pub struct RunLock {
    path: PathBuf,
}

impl RunLock {
    pub fn acquire(tree: &Tree) -> Result<RunLock, ReceiptError> {
        std::fs::create_dir_all(&tree.dir)
            .map_err(|e| ReceiptError::new(&tree.dir, Kind::CreateFolder(e)))?;
        let path = tree.lock_file();
        for _ in 0..2 {
            match std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&path)
            {
                Ok(mut f) => {
                    let _ = writeln!(f, "{}", std::process::id());
                    return Ok(RunLock { path });
                }
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                    let text = std::fs::read_to_string(&path).unwrap_or_default();
                    match text.trim().parse::<i32>() {
                        Ok(pid) if process_alive(pid) => {
                            return Err(ReceiptError::new(path, Kind::Locked(pid)));
                        }
                        // The holder is gone (killed with SIGKILL, machine rebooted): the
                        // lock is stale and the tree is consistent by construction.
                        _ => {
                            let _ = std::fs::remove_file(&path);
                        }
                    }
                }
                Err(e) => return Err(ReceiptError::new(path, Kind::CreateLock(e))),
            }
        }
        Err(ReceiptError::new(path, Kind::StaleLock))
    }
}

impl Drop for RunLock {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

fn process_alive(pid: i32) -> bool {
    if pid <= 0 {
        return false;
    }
    // SAFETY: kill with signal 0 only checks that the process exists and may be signalled;
    // it sends nothing.
    let r = unsafe { libc::kill(pid, 0) };
    r == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

/// The most recent run of this manifest under the receipts folder (by `start` time), any
/// commit. Called before a run writes its own `run.json`, so an earlier run of the same
/// commit counts as the previous run.
pub fn previous_run(receipts: &Path, manifest_name: &str) -> Option<RunReceipt> {
    let mut best: Option<RunReceipt> = None;
    for entry in std::fs::read_dir(receipts).ok()?.flatten() {
        let path = entry.path().join(manifest_name).join("run.json");
        let Ok(Some(run)) = read_json::<RunReceipt>(&path) else {
            continue;
        };
        if best.as_ref().is_none_or(|b| run.start > b.start) {
            best = Some(run);
        }
    }
    best
}

/// Seconds per cell id from a run, for cells that actually ran.
pub fn durations(run: &RunReceipt) -> HashMap<String, f64> {
    run.nodes
        .iter()
        .filter(|n| n.verdict != crate::verdict::Verdict::Skipped && n.seconds > 0.0)
        .map(|n| (n.id.clone(), n.seconds))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_stay_under_the_tree() {
        let t = Tree::new(Path::new("/r"), "abc-dirty", "smoke");
        assert_eq!(
            t.receipt_json("x-1"),
            PathBuf::from("/r/abc-dirty/smoke/nodes/x-1/receipt.json")
        );
        assert_eq!(
            t.attempt_dir("x-1", 2),
            PathBuf::from("/r/abc-dirty/smoke/nodes/x-1/attempt-2")
        );
    }

    #[test]
    fn lock_names_the_holder_and_takes_over_stale_locks() {
        let dir = tempfile::tempdir().unwrap();
        let t = Tree::new(dir.path(), "c", "m");
        let held = RunLock::acquire(&t).unwrap();
        let err = RunLock::acquire(&t).unwrap_err();
        assert!(
            err.to_string()
                .contains(&format!("pid {}", std::process::id())),
            "{err}"
        );
        drop(held);
        assert!(!t.lock_file().exists());
        // A pid that cannot exist: the lock is stale and is taken over.
        std::fs::write(t.lock_file(), "2147483646\n").unwrap();
        let _again = RunLock::acquire(&t).unwrap();
    }

    #[test]
    fn previous_run_is_the_latest_of_this_manifest() {
        let dir = tempfile::tempdir().unwrap();
        let write = |commit: &str, name: &str, start: &str, seconds: f64| {
            let t = Tree::new(dir.path(), commit, name);
            std::fs::create_dir_all(&t.dir).unwrap();
            let run = serde_json::json!({
                "schema": 1, "name": name, "manifest": {"path": "m", "bytes": 0, "sha256": ""},
                "env_matrices": [], "commit": commit, "commit_sha": null, "dirty": false, "host": "h",
                "orchestrator_version": "0", "inventory": null, "cpu_slots": 1, "filters": [],
                "resumed": false, "start": start, "end": start, "seconds": 1.0, "interrupted": false,
                "counts": {}, "verdict": "pass",
                "nodes": [{"id": "a", "kind": "arm", "slug": "a-1", "verdict": "pass", "seconds": seconds}]
            });
            std::fs::write(t.run_json(), run.to_string()).unwrap();
        };
        write("old", "smoke", "2026-11-01T00:00:00Z", 1.0);
        write("new", "smoke", "2026-11-02T00:00:00Z", 2.0);
        write("newest", "other", "2026-11-03T00:00:00Z", 3.0);
        let prev = previous_run(dir.path(), "smoke").unwrap();
        assert_eq!(prev.commit, "new");
        assert_eq!(durations(&prev)["a"], 2.0);
        assert!(previous_run(dir.path(), "missing").is_none());
    }
}
