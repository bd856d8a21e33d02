//! Where things live in a receipt tree, the run lock that keeps two runs of one manifest
//! and commit from running at once, and creating a new run's own folder.
//!
//! ```text
//! <receipts>/<commit>[-dirty]/<manifest-name>/          the manifest folder
//!   .lock                                              the run lock (flock)
//!   <run-id>/                                          one run, never changed after it ends
//!     run.json  summary.md  junit.xml
//!     nodes/<slug>/receipt.json
//!     nodes/<slug>/attempt-<n>/{stdout.log,stderr.log,checks.jsonl,artifacts/}
//! ```
//!
//! A run id is the UTC start time to the millisecond plus a short random suffix
//! (`20261201T224109.123Z-3f9a`), so the folders of one manifest folder sort by start. Trees
//! written before run ids existed have `run.json` and `nodes/` in the manifest folder itself;
//! they stay readable (see `resolve`), and a new run at that commit becomes a sibling of
//! their `nodes/`.

use std::io::{Read, Seek, Write};
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use sha2::{Digest, Sha256};

use super::error::{ReceiptError, ReceiptErrorKind as Kind};
use super::{Carried, attempt_dir_name};

/// The paths of one run's receipt tree (the folder holding its `run.json`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tree {
    pub dir: PathBuf,
}

/// `<receipts>/<commit>/<manifest-name>`: the folder holding every run of one manifest at one
/// commit, and their lock. `commit` already carries `-dirty` when due.
pub fn manifest_dir(receipts: &Path, commit: &str, manifest_name: &str) -> PathBuf {
    receipts.join(commit).join(manifest_name)
}

impl Tree {
    /// Creates the folder of a new run under `manifest_dir` with a fresh id, and returns
    /// the tree and the id. The folder is created with `create_dir`, which fails when it
    /// exists, so a run never writes into a folder it did not make.
    pub fn create(manifest_dir: &Path) -> Result<(Tree, String), ReceiptError> {
        std::fs::create_dir_all(manifest_dir)
            .map_err(|e| ReceiptError::new(manifest_dir, Kind::CreateFolder(e)))?;
        let now = SystemTime::now();
        let mut last = None;
        for salt in 0..16u32 {
            let id = run_id(now, salt);
            let dir = manifest_dir.join(&id);
            match std::fs::create_dir(&dir) {
                Ok(()) => return Ok((Tree { dir }, id)),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => last = Some(e),
                Err(e) => return Err(ReceiptError::new(dir, Kind::CreateFolder(e))),
            }
        }
        let e = last.unwrap_or_else(|| std::io::Error::from(std::io::ErrorKind::AlreadyExists));
        Err(ReceiptError::new(manifest_dir, Kind::CreateFolder(e)))
    }

    /// The receipts folder this run's tree is in (`<receipts>` above), for a tree with a
    /// run id.
    pub fn receipts(&self) -> PathBuf {
        self.dir
            .ancestors()
            .nth(3)
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

    /// The node folder of a receipt this run carries from an earlier run; `None` when the
    /// reference does not name a sibling run (see [`Carried::source_dir`]).
    pub fn carried_node_dir(&self, carried: &Carried, slug: &str) -> Option<PathBuf> {
        let source = carried.source_dir(&self.dir)?;
        Some(Tree { dir: source }.node_dir(slug))
    }
}

/// A run id: `YYYYMMDDTHHMMSS.mmmZ-xxxx`, the time in UTC and four hex digits that differ
/// between processes (pid, the clock's nanoseconds and `salt` hashed).
pub fn run_id(now: SystemTime, salt: u32) -> String {
    let stamp: String = humantime::format_rfc3339_millis(now)
        .to_string()
        .chars()
        .filter(|c| *c != '-' && *c != ':')
        .collect();
    let nanos = now
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let mut h = Sha256::new();
    h.update(std::process::id().to_le_bytes());
    h.update(nanos.to_le_bytes());
    h.update(salt.to_le_bytes());
    let suffix = super::hex(&h.finalize()[..2]);
    format!("{stamp}-{suffix}")
}

/// Whether a folder name is a run id (named with the packed runs' reader, the lowest layer
/// that needs it).
pub use crate::gate::packed::is_run_id;

/// Held while a run of one manifest at one commit runs; released when dropped or when the
/// process dies, however it dies. It is an OS lock (`flock`) on `<manifest folder>/.lock`, so
/// there is no stale lock to take over and no race in taking one over. The file holds the
/// holder's pid so a second run can name it. Only `gc` removes it, while holding it, and
/// [`RunLock::acquire`] checks after locking that the file it locked is still the one at
/// the path, so a removed file never lets two processes hold the lock at once.
#[derive(Debug)]
pub struct RunLock {
    _file: std::fs::File,
    path: PathBuf,
}

impl RunLock {
    /// The lock file of a manifest folder.
    pub fn path(manifest_dir: &Path) -> PathBuf {
        manifest_dir.join(".lock")
    }

    /// Takes the lock for a run; see [`RunLock::acquire_as`].
    pub fn acquire(manifest_dir: &Path) -> Result<RunLock, ReceiptError> {
        RunLock::acquire_as(manifest_dir, false)
    }

    /// Takes the lock of `manifest_dir` (created when missing) without waiting, for a run or
    /// (`gc`) for gc, which its lock file then says (`gc <pid>` instead of `<pid>`), so that a
    /// run finding it held by gc knows the wait is a moment's. `gc` may remove the folder
    /// between its creation here and the lock file's: it is created again.
    pub fn acquire_as(manifest_dir: &Path, gc: bool) -> Result<RunLock, ReceiptError> {
        use std::os::unix::fs::MetadataExt;
        let path = RunLock::path(manifest_dir);
        let (mut vanished, mut unnamed) = (0, 0);
        loop {
            match std::fs::create_dir_all(manifest_dir) {
                Ok(()) => {}
                // A gc removed the (empty) commit folder between its creation and ours, or
                // the folder between another process's creation and our look at it.
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::NotFound | std::io::ErrorKind::AlreadyExists
                    ) && vanished < 100 =>
                {
                    vanished += 1;
                    continue;
                }
                Err(e) => return Err(ReceiptError::new(manifest_dir, Kind::CreateFolder(e))),
            }
            let opened = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .open(&path);
            let mut file = match opened {
                Ok(f) => f,
                // A gc emptied and removed the folder in between: make it again.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound && vanished < 100 => {
                    vanished += 1;
                    continue;
                }
                Err(e) => return Err(ReceiptError::new(&path, Kind::CreateLock(e))),
            };
            match file.try_lock() {
                Ok(()) => {}
                Err(std::fs::TryLockError::WouldBlock) => {
                    let mut text = String::new();
                    let _ = file.read_to_string(&mut text);
                    // A holder writes its name right after taking the lock: a file that
                    // names nobody is most often that instant, so it gets another look.
                    if text.trim().is_empty() && unnamed < 3 {
                        unnamed += 1;
                        std::thread::sleep(std::time::Duration::from_millis(5));
                        continue;
                    }
                    return Err(ReceiptError::new(path, Kind::Locked(holder_of(&text))));
                }
                Err(std::fs::TryLockError::Error(e)) => {
                    return Err(ReceiptError::new(path, Kind::CreateLock(e)));
                }
            }
            // `gc` removes the lock file of a manifest folder it empties, under the lock.
            // A lock taken on a file that is no longer at the path guards nothing: take the
            // one that is there now.
            let same = match (file.metadata(), std::fs::metadata(&path)) {
                (Ok(held), Ok(now)) => held.ino() == now.ino() && held.dev() == now.dev(),
                _ => false,
            };
            if !same {
                continue;
            }
            // Best effort: the text only names the holder in another process's message.
            let _ = file.set_len(0);
            let _ = file.rewind();
            let _ = if gc {
                writeln!(file, "gc {}", std::process::id())
            } else {
                writeln!(file, "{}", std::process::id())
            };
            return Ok(RunLock { _file: file, path });
        }
    }

    /// Removes the lock file while holding the lock (`gc`, emptying a manifest folder). A
    /// process that opened the old file and takes the lock after this one is released
    /// sees that the path no longer leads to it and takes the lock on the new file.
    pub fn remove_file(&self) -> std::io::Result<()> {
        std::fs::remove_file(&self.path)
    }
}

impl Drop for RunLock {
    /// Clears the holder text before the lock goes (with the file), so the next holder's
    /// first instant never shows this one's name.
    fn drop(&mut self) {
        let _ = self._file.set_len(0);
    }
}

/// The holder a run lock file names: `<pid>` (a run) or `gc <pid>`.
fn holder_of(text: &str) -> super::error::LockHolder {
    let text = text.trim();
    let (gc, pid) = match text.strip_prefix("gc ") {
        Some(rest) => (true, rest),
        None => (false, text),
    };
    super::error::LockHolder {
        pid: pid.trim().parse::<i32>().ok(),
        gc,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_lock_is_taken_while_gc_removes_the_folder_again_and_again() {
        // gc empties and removes a manifest folder (and its commit folder) while runs start
        // there: a run must get the lock or find it held, never fail for the folder vanishing
        // between its creation and the lock file's.
        let tmp = tempfile::tempdir().unwrap();
        let m = tmp.path().join("commit/smoke");
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let gc = {
            let (m, stop) = (m.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut removed = 0;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    if let Ok(l) = RunLock::acquire_as(&m, true) {
                        let _ = l.remove_file();
                        drop(l);
                        if std::fs::remove_dir(&m).is_ok() {
                            removed += 1;
                            let _ = std::fs::remove_dir(m.parent().unwrap());
                        }
                    }
                }
                removed
            })
        };
        let mut taken = 0;
        for _ in 0..3000 {
            match RunLock::acquire(&m) {
                Ok(_) => taken += 1,
                Err(e) if matches!(e.kind, Kind::Locked(h) if h.momentary()) => {}
                Err(e) => panic!("{e}"),
            }
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let removed = gc.join().unwrap();
        assert!(taken > 0 && removed > 0, "taken {taken}, removed {removed}");
    }

    #[test]
    fn the_lock_file_says_whether_gc_or_a_run_holds_it() {
        assert_eq!(
            holder_of("gc 42\n"),
            super::super::error::LockHolder {
                pid: Some(42),
                gc: true
            }
        );
        assert_eq!(
            holder_of("42\n"),
            super::super::error::LockHolder {
                pid: Some(42),
                gc: false
            }
        );
        assert_eq!(holder_of("\u{1b}[2J").pid, None);
    }

    #[test]
    fn paths_stay_under_the_tree() {
        let t = Tree {
            dir: manifest_dir(Path::new("/r"), "abc-dirty", "smoke").join("ID"),
        };
        assert_eq!(
            t.receipt_json("x-1"),
            PathBuf::from("/r/abc-dirty/smoke/ID/nodes/x-1/receipt.json")
        );
        assert_eq!(
            t.attempt_dir("x-1", 2),
            PathBuf::from("/r/abc-dirty/smoke/ID/nodes/x-1/attempt-2")
        );
        assert_eq!(t.receipts(), PathBuf::from("/r"));
        let old = Carried::from_run(None);
        assert_eq!(
            t.carried_node_dir(&old, "x-1").unwrap(),
            PathBuf::from("/r/abc-dirty/smoke/nodes/x-1")
        );
        let sibling = Carried::from_run(Some("OTHER"));
        assert_eq!(
            t.carried_node_dir(&sibling, "x-1").unwrap(),
            PathBuf::from("/r/abc-dirty/smoke/OTHER/nodes/x-1")
        );
        for bad in ["../../etc", "/etc", "../a/b", "x", "../.."] {
            let c = Carried {
                run: None,
                from: bad.to_string(),
            };
            assert_eq!(t.carried_node_dir(&c, "x-1"), None, "{bad}");
        }
    }

    #[test]
    fn run_ids_sort_by_time_and_are_recognised() {
        let t = SystemTime::UNIX_EPOCH + std::time::Duration::from_millis(1_790_000_000_123);
        let id = run_id(t, 0);
        assert!(id.starts_with("20260921T"), "{id}");
        assert!(is_run_id(&id), "{id}");
        assert_ne!(run_id(t, 0), run_id(t, 1));
        let later = run_id(t + std::time::Duration::from_millis(1), 0);
        assert!(later > id);
        for not in ["nodes", ".lock", "summary.md", "20260921T000000Z-ab12", ""] {
            assert!(!is_run_id(not), "{not}");
        }
    }

    #[test]
    fn new_runs_get_their_own_folders() {
        let dir = tempfile::tempdir().unwrap();
        let m = manifest_dir(dir.path(), "c", "m");
        let (a, ida) = Tree::create(&m).unwrap();
        let (b, idb) = Tree::create(&m).unwrap();
        assert_ne!(a.dir, b.dir);
        assert_ne!(ida, idb);
        assert!(a.dir.is_dir() && b.dir.is_dir());
        assert_eq!(a.dir, m.join(&ida));
    }

    #[test]
    fn lock_names_the_holder_and_dies_with_it() {
        let dir = tempfile::tempdir().unwrap();
        let m = manifest_dir(dir.path(), "c", "m");
        let held = RunLock::acquire(&m).unwrap();
        let err = RunLock::acquire(&m).unwrap_err();
        assert!(
            err.to_string()
                .contains(&format!("pid {}", std::process::id())),
            "{err}"
        );
        drop(held);
        // The file stays; the lock is free again.
        assert!(RunLock::path(&m).exists());
        // A pid left by a process that no longer holds the lock means nothing.
        std::fs::write(RunLock::path(&m), "2147483646\n").unwrap();
        let _again = RunLock::acquire(&m).unwrap();
    }
}
