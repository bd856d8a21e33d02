//! The same-name check: two different manifest files with the same `name` would file their
//! runs in the same `receipts/<commit>/<name>/` folder, and the second would pass for a
//! rerun of the first. [`check`] refuses a run whose newest predecessor of that name at this
//! commit came from a different manifest file.
//!
//! It only reads `run.json` files (both the layout with one run per manifest folder,
//! `<name>/run.json`, and the layout with a folder per run, `<name>/<run-id>/run.json`); it
//! does not create, lock or lay out trees (the `receipt` module does).

use std::path::{Path, PathBuf};

/// Two manifest files share a name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "manifest name `{name}` is already used by {other} (run {run_json}); this run's manifest is {this}\n  = help: rename one of them (`name = \"…\"`): runs of both would be filed under the same receipts folder and be taken for runs of one manifest"
)]
pub struct NameClash {
    pub name: String,
    /// The manifest file the existing run came from, as resolved.
    pub other: String,
    /// The manifest file of the run being started, canonical.
    pub this: String,
    /// The `run.json` that recorded `other`.
    pub run_json: String,
}

/// Refuses when the newest run of `name` under `<receipts>/<commit>/` came from another
/// manifest file than `manifest` (compared as canonical paths).
///
/// A recorded path that no longer resolves to a file, or that resolves to a file with the
/// same content as `manifest`, is no clash: the check must never refuse a rerun of the same
/// manifest, while the one case it exists for (two live files, one name) is still caught.
/// Relative recorded paths are taken relative to the current directory, as they were
/// written.
pub fn check(receipts: &Path, commit: &str, name: &str, manifest: &Path) -> Result<(), NameClash> {
    let Some((run_json, recorded, sha256)) = newest_run(&receipts.join(commit).join(name)) else {
        return Ok(());
    };
    let this = canonical(manifest);
    let Ok(other) = std::fs::canonicalize(&recorded) else {
        return Ok(());
    };
    if other == this {
        return Ok(());
    }
    if let Ok(bytes) = std::fs::read(&other)
        && !sha256.is_empty()
        && crate::load::build::sha256_hex(&bytes) == sha256
        && std::fs::read(&this).is_ok_and(|b| b == bytes)
    {
        return Ok(());
    }
    Err(NameClash {
        name: name.to_string(),
        other: other.display().to_string(),
        this: this.display().to_string(),
        run_json: run_json.display().to_string(),
    })
}

fn canonical(p: &Path) -> PathBuf {
    std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf())
}

/// The newest `run.json` directly in `dir` or one level below, by its `start` time (RFC
/// 3339, so text order is time order), with the manifest path and digest it records.
fn newest_run(dir: &Path) -> Option<(PathBuf, PathBuf, String)> {
    let mut candidates = vec![dir.join("run.json")];
    if let Ok(entries) = std::fs::read_dir(dir) {
        candidates.extend(
            entries
                .flatten()
                .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                .map(|e| e.path().join("run.json")),
        );
    }
    candidates
        .into_iter()
        .filter_map(|p| {
            let text = std::fs::read_to_string(&p).ok()?;
            let v: serde_json::Value = serde_json::from_str(&text).ok()?;
            let path = v["manifest"]["path"].as_str()?.to_string();
            let sha = v["manifest"]["sha256"].as_str().unwrap_or("").to_string();
            let start = v["start"].as_str().unwrap_or("").to_string();
            Some((start, p, PathBuf::from(path), sha))
        })
        .max_by(|a, b| a.0.cmp(&b.0))
        .map(|(_, p, path, sha)| (p, path, sha))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run_json(dir: &Path, manifest: &Path, start: &str) {
        std::fs::create_dir_all(dir).unwrap();
        let v = serde_json::json!({
            "schema": 1,
            "name": "nightly",
            "manifest": {"path": manifest.to_string_lossy(), "bytes": 0, "sha256": "0"},
            "start": start,
        });
        std::fs::write(dir.join("run.json"), v.to_string()).unwrap();
    }

    struct Files {
        _dir: tempfile::TempDir,
        receipts: PathBuf,
        a: PathBuf,
        b: PathBuf,
    }

    fn files() -> Files {
        let dir = tempfile::tempdir().unwrap();
        let a = dir.path().join("a.toml");
        let b = dir.path().join("sub/b.toml");
        std::fs::create_dir_all(b.parent().unwrap()).unwrap();
        std::fs::write(&a, "name = \"nightly\" # a\n").unwrap();
        std::fs::write(&b, "name = \"nightly\" # b\n").unwrap();
        Files {
            receipts: dir.path().join("receipts"),
            a,
            b,
            _dir: dir,
        }
    }

    #[test]
    fn no_earlier_run_is_no_clash() {
        let f = files();
        assert_eq!(check(&f.receipts, "abc", "nightly", &f.a), Ok(()));
    }

    #[test]
    fn old_layout_same_file_passes_other_file_is_refused() {
        let f = files();
        run_json(
            &f.receipts.join("abc/nightly"),
            &f.a,
            "2026-12-01T00:00:00Z",
        );
        assert_eq!(check(&f.receipts, "abc", "nightly", &f.a), Ok(()));
        // The same file spelled through `sub/..` is still the same file.
        let spelled = f.b.parent().unwrap().join("../a.toml");
        assert_eq!(check(&f.receipts, "abc", "nightly", &spelled), Ok(()));
        let e = check(&f.receipts, "abc", "nightly", &f.b).unwrap_err();
        let text = e.to_string();
        assert!(text.contains("a.toml") && text.contains("b.toml"), "{text}");
        assert!(text.contains("rename one of them"), "{text}");
        // Another commit or another name is another folder.
        assert_eq!(check(&f.receipts, "def", "nightly", &f.b), Ok(()));
        assert_eq!(check(&f.receipts, "abc", "other", &f.b), Ok(()));
    }

    #[test]
    fn new_layout_compares_with_the_newest_run() {
        let f = files();
        let tree = f.receipts.join("abc/nightly");
        run_json(&tree.join("run-1"), &f.a, "2026-12-01T00:00:00Z");
        run_json(&tree.join("run-2"), &f.b, "2026-12-01T01:00:00Z");
        assert_eq!(check(&f.receipts, "abc", "nightly", &f.b), Ok(()));
        let e = check(&f.receipts, "abc", "nightly", &f.a).unwrap_err();
        assert_eq!(e.other, canonical(&f.b).display().to_string());
        assert!(e.run_json.ends_with("run-2/run.json"), "{}", e.run_json);
    }

    #[test]
    fn a_recorded_file_that_is_gone_or_identical_is_no_clash() {
        let f = files();
        let gone = f.a.with_file_name("gone.toml");
        run_json(
            &f.receipts.join("abc/nightly"),
            &gone,
            "2026-12-01T00:00:00Z",
        );
        assert_eq!(check(&f.receipts, "abc", "nightly", &f.b), Ok(()));

        let copy = f.a.with_file_name("copy.toml");
        std::fs::copy(&f.a, &copy).unwrap();
        let sha = crate::load::build::sha256_hex(&std::fs::read(&f.a).unwrap());
        let dir = f.receipts.join("abc/nightly");
        let v = serde_json::json!({
            "manifest": {"path": copy.to_string_lossy(), "sha256": sha},
            "start": "2026-12-01T02:00:00Z",
        });
        std::fs::write(dir.join("run.json"), v.to_string()).unwrap();
        assert_eq!(check(&f.receipts, "abc", "nightly", &f.a), Ok(()));
        assert!(check(&f.receipts, "abc", "nightly", &f.b).is_err());
    }
}
