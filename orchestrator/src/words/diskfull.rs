//! A full disk as its own outcome. When the file system of the receipt tree fills
//! (ENOSPC, EDQUOT) gates fail with empty logs and receipts cannot be written; without care
//! that reads as a night of gate failures with a `run.json` stuck at `running`. This module
//! holds the pieces that let a run say what happened instead: telling a disk-full error from
//! other I/O errors, the free space of a folder, the flag the writer and the run loop share
//! ([`DiskFull`]), and a small reserve file a run keeps in its tree and gives back when the
//! disk fills, so `run.json`, `summary.md` and `junit.xml` can still be finalized.
//!
//! It decides nothing about verdicts; the run loop and the receipt writer do.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

/// Bytes a run keeps in reserve in its tree: enough for `run.json`, `summary.md` and
/// `junit.xml` of a large run.
pub const RESERVE_BYTES: usize = 4 << 20;

/// Below this many free bytes after a cell that did not end as expected, the cell is taken
/// to have failed for want of space.
pub const FULL_BELOW: u64 = 256 << 10;

/// Whether an I/O error means the file system is full or the quota is used up.
pub fn is_disk_full(e: &std::io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::ENOSPC) | Some(libc::EDQUOT))
        || e.kind() == std::io::ErrorKind::StorageFull
        || e.kind() == std::io::ErrorKind::QuotaExceeded
}

/// Bytes an unprivileged process may still write on the file system holding `path`.
pub fn free_bytes(path: &Path) -> Option<u64> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).ok()?;
    // SAFETY: statvfs writes into the zeroed struct we own; the path is a valid C string.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    let r = unsafe { libc::statvfs(c.as_ptr(), &mut st) };
    #[allow(clippy::useless_conversion)] // The field types differ between targets.
    (r == 0).then(|| u64::from(st.f_bavail).saturating_mul(u64::from(st.f_frsize)))
}

/// Set once when the run finds the disk full: where. Shared by the run loop (which stops
/// scheduling) and the receipt writer (which gives the reserve back and finalizes).
#[derive(Debug, Clone, Default)]
pub struct DiskFull(Arc<OnceLock<PathBuf>>);

impl DiskFull {
    pub fn new() -> DiskFull {
        DiskFull::default()
    }

    /// Records that the disk is full at `path` (the first place found wins).
    pub fn set(&self, path: &Path) {
        let _ = self.0.set(path.to_path_buf());
    }

    pub fn get(&self) -> Option<&Path> {
        self.0.get().map(PathBuf::as_path)
    }
}

/// A file of [`RESERVE_BYTES`] in the tree, removed by [`Reserve::release`] (or on drop) so
/// that the last writes of a run find room. Written with real bytes, not a sparse file, so
/// the space is really taken.
#[derive(Debug)]
pub struct Reserve {
    path: Option<PathBuf>,
}

impl Reserve {
    /// Takes the reserve at `<dir>/.reserve`. When even that does not fit, there is no
    /// reserve and the run goes on (it will find the disk full soon enough).
    pub fn take(dir: &Path) -> Reserve {
        let path = dir.join(".reserve");
        let written = std::fs::File::create(&path).and_then(|mut f| {
            let chunk = vec![0u8; 1 << 16];
            for _ in 0..RESERVE_BYTES / chunk.len() {
                f.write_all(&chunk)?;
            }
            f.sync_all()
        });
        match written {
            Ok(()) => Reserve { path: Some(path) },
            Err(_) => {
                let _ = std::fs::remove_file(&path);
                Reserve { path: None }
            }
        }
    }

    pub fn release(&mut self) {
        if let Some(p) = self.path.take() {
            let _ = std::fs::remove_file(p);
        }
    }
}

impl Drop for Reserve {
    fn drop(&mut self) {
        self.release();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn disk_full_errors_are_told_apart() {
        assert!(is_disk_full(&std::io::Error::from_raw_os_error(
            libc::ENOSPC
        )));
        assert!(is_disk_full(&std::io::Error::from_raw_os_error(
            libc::EDQUOT
        )));
        assert!(!is_disk_full(&std::io::Error::from_raw_os_error(
            libc::EACCES
        )));
    }

    #[test]
    fn the_reserve_takes_space_and_gives_it_back() {
        let dir = tempfile::tempdir().unwrap();
        let mut r = Reserve::take(dir.path());
        let file = dir.path().join(".reserve");
        assert_eq!(
            std::fs::metadata(&file).unwrap().len(),
            RESERVE_BYTES as u64
        );
        r.release();
        assert!(!file.exists());
        assert!(free_bytes(dir.path()).unwrap() > 0);
        let flag = DiskFull::new();
        assert_eq!(flag.get(), None);
        flag.set(Path::new("/a"));
        flag.set(Path::new("/b"));
        assert_eq!(flag.get(), Some(Path::new("/a")));
    }
}
