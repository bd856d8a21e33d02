//! Where an attempt may write, and nothing else may reach: its TMPDIR (made fresh and
//! private for each attempt, below a run folder made the same way, removed after it), the
//! door through which the gate reaches its attempt folder (a link with a random name that
//! dies with the attempt), and the node folder, emptied for a cell that runs again without
//! a leftover process being able to stop that.
//!
//! It makes and removes folders and links; it does not run anything.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use super::error::{ExecError, FileErrorKind as Kind};
use crate::receipt::attempt_dir_name;

/// The TMPDIRs of one executor's attempts.
#[derive(Debug)]
pub struct TmpDirs {
    /// The caller's temporary folder: the run's own folder is created below it.
    parent: PathBuf,
    /// The run's folder of attempt TMPDIRs, made (0700, unpredictable name) at the first
    /// attempt and removed when this is dropped; or why it could not be made.
    root: OnceLock<Result<PathBuf, (std::io::ErrorKind, String)>>,
}

impl TmpDirs {
    /// TMPDIRs below a fresh private folder in `parent` (usually `std::env::temp_dir()`).
    pub fn new(parent: PathBuf) -> TmpDirs {
        TmpDirs {
            parent,
            root: OnceLock::new(),
        }
    }

    /// A fresh TMPDIR for one attempt: created with mkdtemp semantics (mode 0700, a random
    /// name, never an existing path, so never a link someone planted), inside the run's
    /// folder, which is made the same way. Never reused: a folder an attempt had is removed
    /// with it, so nothing one attempt leaves can reach the next.
    pub fn take(&self) -> Result<PathBuf, ExecError> {
        let root = self.root.get_or_init(|| {
            std::fs::create_dir_all(&self.parent)
                .and_then(|()| private_dir().prefix("memra-orch-").tempdir_in(&self.parent))
                .map(tempfile::TempDir::keep)
                .map_err(|e| (e.kind(), e.to_string()))
        });
        let root = match root {
            Ok(r) => r,
            Err((kind, msg)) => {
                let e = std::io::Error::new(*kind, msg.clone());
                return Err(ExecError::file(&self.parent, Kind::CreateTmp(e)));
            }
        };
        private_dir()
            .prefix("t")
            .tempdir_in(root)
            .map(tempfile::TempDir::keep)
            .map_err(|e| ExecError::file(root, Kind::CreateTmp(e)))
    }

    /// Removes an attempt's TMPDIR. `remove_dir_all` removes links the gate left inside
    /// without following them, so a link to a folder elsewhere leaves that folder as it is.
    /// A folder the gate made unremovable (read-only) stays until the run's folder goes.
    pub fn give_back(&self, dir: &Path) {
        let _ = std::fs::remove_dir_all(dir);
    }
}

/// A builder of folders only their owner may enter: mode 0700 is given to mkdir itself, so
/// there is no moment at which the folder is open to others (tempfile's default follows
/// the umask).
fn private_dir() -> tempfile::Builder<'static, 'static> {
    let mut b = tempfile::Builder::new();
    b.permissions(std::fs::Permissions::from_mode(0o700));
    b
}

impl Drop for TmpDirs {
    fn drop(&mut self) {
        if let Some(Ok(root)) = self.root.get() {
            let _ = std::fs::remove_dir_all(root);
        }
    }
}

/// The path through which a gate reaches its attempt folder: a link in the node folder,
/// with a fresh random name, to `attempt-<n>`, removed when the attempt ends. A process an
/// earlier run left behind (one that escaped its supervisor) holds the path of its own
/// run's link, which `--resume` removed with the node folder, so it cannot write into the
/// new attempt folder of the same name.
pub struct AttemptDoor(tempfile::NamedTempFile<()>);

impl AttemptDoor {
    pub fn open(node_dir: &Path, n: u32) -> Result<AttemptDoor, ExecError> {
        let target = attempt_dir_name(n);
        tempfile::Builder::new()
            .prefix(&format!(".{target}-"))
            .make_in(node_dir, |p| std::os::unix::fs::symlink(&target, p))
            .map(AttemptDoor)
            .map_err(|e| ExecError::file(node_dir, Kind::CreateAttemptDir(e)))
    }

    pub fn path(&self) -> &Path {
        self.0.path()
    }
}

/// Empties the node folder: a node that runs again (`--resume` after a cancel) must not
/// keep attempts of the earlier try. The old folder is first moved aside in one rename,
/// so a process left from the earlier try that still writes into it by path cannot make
/// the removal fail, and loses its way at once; what cannot be removed of it is left in a
/// hidden `.old-*` folder beside it.
pub fn reset_dir(dir: &Path) -> Result<(), ExecError> {
    let clear = |e| ExecError::file(dir, Kind::ClearNodeDir(e));
    if std::fs::symlink_metadata(dir).is_ok() {
        let parent = dir.parent().unwrap_or(Path::new("."));
        let aside = tempfile::Builder::new()
            .prefix(".old-")
            .tempdir_in(parent)
            .map_err(clear)?;
        std::fs::rename(dir, aside.path().join("node")).map_err(clear)?;
        let _ = std::fs::remove_dir_all(aside.keep());
    }
    std::fs::create_dir_all(dir).map_err(|e| ExecError::file(dir, Kind::CreateNodeDir(e)))
}
