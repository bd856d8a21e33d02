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

/// The marker file a `report --html` folder holds (`report::html::MARKER`).
const REPORT_MARKER: &str = "memra-report.json";
/// What the first bytes of a metrics file memra-orch wrote hold.
const METRICS_MARK: &[u8] = b"memra_run_";

/// The paths recorded under `receipts` (none when the file is absent or unreadable), as
/// written; see [`honoured`] for which of them count.
pub fn read(receipts: &Path) -> Vec<PathBuf> {
    let Ok(text) = std::fs::read_to_string(receipts.join(FILE)) else {
        return Vec::new();
    };
    text.lines()
        .filter(|l| l.starts_with('/'))
        .map(PathBuf::from)
        .collect()
}

/// Whether a recorded path still holds memra-orch's output: a folder with a report's
/// marker, or a regular file whose first bytes are a metrics file's. Anything else (a
/// source folder recorded by a `report --html src` typed by mistake, a line another user
/// appended) is not left out of the dirty check: a change there must count.
pub fn honoured(path: &Path) -> bool {
    let Ok(meta) = std::fs::symlink_metadata(path) else {
        // Not there yet (or any more): nothing of it to leave out either way.
        return false;
    };
    if meta.is_dir() {
        // The marker must be one the report wrote, not an empty file anyone can make.
        let marker = path.join(REPORT_MARKER);
        return std::fs::symlink_metadata(&marker).is_ok_and(|m| m.is_file() && m.len() < 1 << 20)
            && std::fs::read_to_string(&marker).is_ok_and(|t| {
                serde_json::from_str::<serde_json::Value>(&t)
                    .is_ok_and(|v| v["written_by"] == "memra-orch report")
            });
    }
    if !meta.is_file() {
        return false;
    }
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let mut head = [0u8; 4096];
    let n = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOFOLLOW)
        .open(path)
        .and_then(|mut f| f.read(&mut head))
        .unwrap_or(0);
    head[..n]
        .windows(METRICS_MARK.len())
        .any(|w| w == METRICS_MARK)
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
/// recorded outputs that still hold memra-orch's output ([`honoured`]) and the ones `extra`
/// names (this run's metrics file, checked the same way once it exists).
pub fn all(receipts: &Path, extra: &[&Path]) -> Vec<PathBuf> {
    let mut out = vec![receipts.to_path_buf()];
    out.extend(read(receipts).into_iter().filter(|p| honoured(p)));
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
        // Recorded, but neither holds memra-orch's output yet: only the receipts folder
        // and this run's own metrics file are left out.
        let all_now = all(&receipts, &[&dir.path().join("x.prom")]);
        assert_eq!(all_now, [receipts.clone(), dir.path().join("x.prom")]);
        std::fs::create_dir(dir.path().join("site")).unwrap();
        assert!(
            !honoured(&dir.path().join("site")),
            "a folder without the marker"
        );
        std::fs::write(dir.path().join("site").join(REPORT_MARKER), "{}").unwrap();
        assert!(
            !honoured(&dir.path().join("site")),
            "a marker the report did not write"
        );
        std::fs::write(
            dir.path().join("site").join(REPORT_MARKER),
            r#"{"schema": 1, "written_by": "memra-orch report", "files": []}"#,
        )
        .unwrap();
        assert!(honoured(&dir.path().join("site")));
        std::fs::write(dir.path().join("m.prom"), "int main() {}").unwrap();
        assert!(
            !honoured(&dir.path().join("m.prom")),
            "a file memra-orch did not write"
        );
        std::fs::write(dir.path().join("m.prom"), "# HELP memra_run_info …\n").unwrap();
        assert!(honoured(&dir.path().join("m.prom")));
        assert_eq!(all(&receipts, &[]).len(), 3);
    }

    #[test]
    fn the_report_marker_is_the_reports() {
        assert_eq!(REPORT_MARKER, crate::report::html::MARKER);
    }
}
