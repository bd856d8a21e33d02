//! The same-name check: two different manifest files with the same `name` would file their
//! runs in the same `receipts/<commit>/<name>/` folder, and the second would pass for a
//! rerun of the first. [`check`] refuses a run whose newest predecessor of that name at this
//! commit came from a different manifest file.
//!
//! It reads the runs of the manifest folder as `receipt::resolve` finds them (both the
//! layout with one run per manifest folder, `<name>/run.json`, and the layout with a folder
//! per run, `<name>/<run-id>/run.json`); it does not create, lock or lay out trees.

use std::path::{Path, PathBuf};

use crate::receipt::resolve::{FoundRun, runs_in_manifest_dir};

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
    let runs = runs_in_manifest_dir(&receipts.join(commit).join(name));
    check_against(runs.first(), name, manifest)
}

/// [`check`] against the newest run of the manifest folder, already listed (`run` lists the
/// folder once for this and for the run it may carry receipts from).
pub fn check_against(
    newest: Option<&FoundRun>,
    name: &str,
    manifest: &Path,
) -> Result<(), NameClash> {
    let Some(run) = newest else {
        return Ok(());
    };
    let recorded = PathBuf::from(&run.run.manifest.path);
    let sha256 = &run.run.manifest.sha256;
    let this = canonical(manifest);
    let Ok(other) = std::fs::canonicalize(&recorded) else {
        return Ok(());
    };
    if other == this {
        return Ok(());
    }
    if let Ok(bytes) = std::fs::read(&other)
        && !sha256.is_empty()
        && crate::load::build::sha256_hex(&bytes) == *sha256
        && std::fs::read(&this).is_ok_and(|b| b == bytes)
    {
        return Ok(());
    }
    Err(NameClash {
        name: name.to_string(),
        other: other.display().to_string(),
        this: this.display().to_string(),
        run_json: run.dir.join("run.json").display().to_string(),
    })
}

fn canonical(p: &Path) -> PathBuf {
    std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run_json(dir: &Path, manifest: &Path, start: &str) {
        run_json_with(dir, manifest, "0", start);
    }

    fn run_json_with(dir: &Path, manifest: &Path, sha256: &str, start: &str) {
        std::fs::create_dir_all(dir).unwrap();
        let v = serde_json::json!({
            "schema": 1, "name": "nightly",
            "manifest": {"path": manifest.to_string_lossy(), "bytes": 0, "sha256": sha256},
            "env_matrices": [], "commit": "abc", "commit_sha": null, "dirty": false,
            "host": "h", "orchestrator_version": "0", "inventory": null, "cpu_slots": 1,
            "filters": [], "resumed": false, "start": start, "end": start, "seconds": 1.0,
            "interrupted": false, "counts": {}, "verdict": "pass", "nodes": []
        });
        std::fs::write(dir.join("run.json"), v.to_string()).unwrap();
    }

    const RUN_1: &str = "20261201T000000.000Z-aaaa";
    const RUN_2: &str = "20261201T010000.000Z-bbbb";

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
        run_json(&tree.join(RUN_1), &f.a, "2026-12-01T00:00:00Z");
        run_json(&tree.join(RUN_2), &f.b, "2026-12-01T01:00:00Z");
        assert_eq!(check(&f.receipts, "abc", "nightly", &f.b), Ok(()));
        let e = check(&f.receipts, "abc", "nightly", &f.a).unwrap_err();
        assert_eq!(e.other, canonical(&f.b).display().to_string());
        assert!(
            e.run_json.ends_with(&format!("{RUN_2}/run.json")),
            "{}",
            e.run_json
        );
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
        run_json_with(&dir, &copy, &sha, "2026-12-01T02:00:00Z");
        assert_eq!(check(&f.receipts, "abc", "nightly", &f.a), Ok(()));
        assert!(check(&f.receipts, "abc", "nightly", &f.b).is_err());
    }
}
