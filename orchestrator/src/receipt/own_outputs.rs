//! What memra-orch writes outside its run trees — a `report --html` folder, a `run
//! --metrics-file` — remembered in `<receipts>/.memra-outputs`, one absolute path a line, so
//! that a later run leaves them (and the receipts folder itself) out of its dirty check and
//! its code identity (`commit`). Without it, a second night in a repository that does not
//! git-ignore its report folder would be filed `-dirty` by the first night's report.
//!
//! The file is a convenience, not a record of truth: losing a line to two writers racing
//! only means that output counts as a change until it is written again.

use std::path::{Path, PathBuf};

use super::error::ReceiptError;

/// The file's name inside the receipts folder.
pub const FILE: &str = ".memra-outputs";

/// The paths recorded under `receipts` (none when the file is absent or unreadable).
pub fn read(receipts: &Path) -> Vec<PathBuf> {
    let Ok(text) = std::fs::read_to_string(receipts.join(FILE)) else {
        return Vec::new();
    };
    text.lines()
        .filter(|l| l.starts_with('/'))
        .map(PathBuf::from)
        .collect()
}

/// Records `path` (made absolute against the current folder) under `receipts`, once.
pub fn record(receipts: &Path, path: &Path) -> Result<(), ReceiptError> {
    let path = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
    let mut known = read(receipts);
    if known.contains(&path) {
        return Ok(());
    }
    let Some(line) = path.to_str().filter(|s| !s.contains('\n')) else {
        // A path a line cannot hold stays unrecorded: it then counts as a change.
        return Ok(());
    };
    known.push(PathBuf::from(line));
    std::fs::create_dir_all(receipts).map_err(|e| {
        ReceiptError::new(receipts, super::error::ReceiptErrorKind::CreateFolder(e))
    })?;
    let mut text = String::new();
    for p in &known {
        text.push_str(&p.to_string_lossy());
        text.push('\n');
    }
    super::write_atomic(&receipts.join(FILE), text.as_bytes())
}

/// Everything a run at `receipts` leaves out of the dirty check: the receipts folder, the
/// recorded outputs and the ones `extra` names (this run's metrics file).
pub fn all(receipts: &Path, extra: &[&Path]) -> Vec<PathBuf> {
    let mut out = vec![receipts.to_path_buf()];
    out.extend(read(receipts));
    out.extend(
        extra
            .iter()
            .map(|p| std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf())),
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_each_path_once() {
        let dir = tempfile::tempdir().unwrap();
        let receipts = dir.path().join("receipts");
        assert!(read(&receipts).is_empty());
        record(&receipts, &dir.path().join("site")).unwrap();
        record(&receipts, &dir.path().join("site")).unwrap();
        record(&receipts, &dir.path().join("m.prom")).unwrap();
        assert_eq!(
            read(&receipts),
            [dir.path().join("site"), dir.path().join("m.prom")]
        );
        let all = all(&receipts, &[&dir.path().join("x.prom")]);
        assert_eq!(all.len(), 4);
        assert_eq!(all[0], receipts);
    }
}
