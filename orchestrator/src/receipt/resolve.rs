//! Turning what a user names on the command line into a receipt tree folder: a run folder,
//! a commit folder, `latest` / `previous`, or a commit-ish that git resolves to a sha whose
//! `<sha>[-dirty]/<manifest>` lives under the receipts folder. Shared by `diff`, `show`,
//! `ls` and `gc`, which also use [`list_runs`] to see every run under a receipts folder.
//!
//! It reads folder listings and `run.json` files only; it never writes.

use std::path::{Path, PathBuf};

use super::error::FindError;
use super::{RunReceipt, read_json};

/// The receipts folder: `--receipts` when given (relative to the current folder), else
/// `receipts/` at the top of the git work tree of the current folder, else `./receipts`.
pub fn receipts_root(given: Option<&Path>) -> Result<PathBuf, FindError> {
    let cwd = std::env::current_dir().map_err(FindError::CurrentDir)?;
    Ok(match given {
        Some(p) => cwd.join(p),
        None => git(&cwd, &["rev-parse", "--show-toplevel"])
            .map(PathBuf::from)
            .unwrap_or(cwd)
            .join("receipts"),
    })
}

/// One run found under a receipts folder.
#[derive(Debug, Clone)]
pub struct FoundRun {
    /// `<receipts>/<commit>/<manifest>`.
    pub dir: PathBuf,
    /// The commit folder name.
    pub commit: String,
    pub run: RunReceipt,
}

/// Every readable run under `receipts`, newest first (by start time). Folders without a
/// readable `run.json` are not runs and are left out.
pub fn list_runs(receipts: &Path) -> Result<Vec<FoundRun>, FindError> {
    let commits = std::fs::read_dir(receipts).map_err(|error| FindError::ListReceipts {
        receipts: receipts.to_path_buf(),
        error,
    })?;
    let mut runs = Vec::new();
    for commit in commits.flatten() {
        let Ok(kind) = commit.file_type() else {
            continue;
        };
        if !kind.is_dir() {
            continue;
        }
        let Ok(manifests) = std::fs::read_dir(commit.path()) else {
            continue;
        };
        for m in manifests.flatten() {
            if !m.file_type().is_ok_and(|t| t.is_dir()) {
                continue;
            }
            if let Ok(Some(run)) = read_json::<RunReceipt>(&m.path().join("run.json")) {
                runs.push(FoundRun {
                    dir: m.path(),
                    commit: commit.file_name().to_string_lossy().into_owned(),
                    run,
                });
            }
        }
    }
    runs.sort_by(|a, b| b.run.start.cmp(&a.run.start).then(a.dir.cmp(&b.dir)));
    Ok(runs)
}

/// Resolves `spec` to a tree folder:
/// 1. an existing folder holding `run.json` (a run), or holding run folders (a commit);
/// 2. `latest` / `previous`: the newest run under `receipts` and the one before it of the
///    same manifest (`--manifest` narrows both to one manifest);
/// 3. a commit folder name under `receipts` (`<sha>-dirty`, a `--commit` id, `no-git`);
/// 4. a commit-ish git resolves in the current folder (`HEAD~1`, a short sha, a tag), with an
///    optional `-dirty` suffix: `<sha>` is used when it exists, else `<sha>-dirty`.
pub fn resolve(spec: &str, receipts: &Path, manifest: Option<&str>) -> Result<PathBuf, FindError> {
    let as_path = Path::new(spec);
    if as_path.is_dir() {
        if as_path.join("run.json").is_file() {
            return Ok(as_path.to_path_buf());
        }
        return pick_manifest(as_path, manifest, spec);
    }
    if spec == "latest" || spec == "previous" {
        let runs: Vec<FoundRun> = list_runs(receipts)?
            .into_iter()
            .filter(|r| manifest.is_none_or(|m| r.run.name == m))
            .collect();
        let latest = runs.first().ok_or_else(|| FindError::NoRun {
            spec: spec.to_string(),
            manifest: manifest.map(str::to_string),
            receipts: receipts.to_path_buf(),
        })?;
        if spec == "latest" {
            return Ok(latest.dir.clone());
        }
        return runs
            .iter()
            .skip(1)
            .find(|r| r.run.name == latest.run.name)
            .map(|r| r.dir.clone())
            .ok_or_else(|| FindError::OnlyOneRun {
                manifest: latest.run.name.clone(),
                receipts: receipts.to_path_buf(),
            });
    }
    if super::load::is_plain_name(spec) && receipts.join(spec).is_dir() {
        return pick_manifest(&receipts.join(spec), manifest, spec);
    }
    let (base, dirty) = match spec.strip_suffix("-dirty") {
        Some(b) => (b, true),
        None => (spec, false),
    };
    let cwd = std::env::current_dir().unwrap_or_else(|_| PathBuf::from("."));
    let sha = git(
        &cwd,
        &[
            "rev-parse",
            "--verify",
            "--quiet",
            &format!("{base}^{{commit}}"),
        ],
    )
    .ok_or_else(|| FindError::Unknown {
        spec: spec.to_string(),
        receipts: receipts.to_path_buf(),
    })?;
    let clean = receipts.join(&sha);
    let dirty_dir = receipts.join(format!("{sha}-dirty"));
    let dir = if !dirty && clean.is_dir() {
        clean
    } else if dirty_dir.is_dir() {
        dirty_dir
    } else {
        return Err(FindError::NoReceiptsForCommit {
            spec: spec.to_string(),
            sha,
            receipts: receipts.to_path_buf(),
            dirty,
        });
    };
    pick_manifest(&dir, manifest, spec)
}

/// The run folder of `manifest` inside a commit folder, or the only one there is.
fn pick_manifest(
    commit_dir: &Path,
    manifest: Option<&str>,
    spec: &str,
) -> Result<PathBuf, FindError> {
    let mut names: Vec<String> = std::fs::read_dir(commit_dir)
        .map_err(|error| FindError::ListCommit {
            dir: commit_dir.to_path_buf(),
            error,
        })?
        .flatten()
        .filter(|e| e.path().join("run.json").is_file())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    match manifest {
        Some(m) if names.iter().any(|n| n == m) => Ok(commit_dir.join(m)),
        Some(m) => Err(FindError::NoSuchManifest {
            spec: spec.to_string(),
            dir: commit_dir.to_path_buf(),
            manifest: m.to_string(),
            held: names,
        }),
        None => match names.as_slice() {
            [one] => Ok(commit_dir.join(one)),
            [] => Err(FindError::NoTree {
                spec: spec.to_string(),
                dir: commit_dir.to_path_buf(),
            }),
            _ => Err(FindError::SeveralManifests {
                spec: spec.to_string(),
                dir: commit_dir.to_path_buf(),
                held: names,
            }),
        },
    }
}

/// Runs git in `dir`; its trimmed stdout when it succeeded and printed something.
fn git(dir: &Path, args: &[&str]) -> Option<String> {
    crate::commit::git(dir, args).filter(|s| !s.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run_json(dir: &Path, name: &str, start: &str) {
        std::fs::create_dir_all(dir).unwrap();
        let run = serde_json::json!({
            "schema": 1, "name": name, "manifest": {"path": "m", "bytes": 0, "sha256": ""},
            "env_matrices": [], "commit": "c", "commit_sha": null, "dirty": false, "host": "h",
            "orchestrator_version": "0", "inventory": null, "cpu_slots": 1, "filters": [],
            "resumed": false, "start": start, "end": start, "seconds": 1.0,
            "interrupted": false, "counts": {}, "verdict": "pass", "nodes": []
        });
        std::fs::write(dir.join("run.json"), run.to_string()).unwrap();
    }

    #[test]
    fn commit_folders_latest_previous_and_manifest_choice() {
        let tmp = tempfile::tempdir().unwrap();
        let r = tmp.path();
        run_json(&r.join("c1/smoke"), "smoke", "2026-11-01T00:00:00Z");
        run_json(&r.join("c2/smoke"), "smoke", "2026-11-02T00:00:00Z");
        run_json(&r.join("c2/nightly"), "nightly", "2026-11-03T00:00:00Z");
        // Not a run: no run.json.
        std::fs::create_dir_all(r.join("c3/empty")).unwrap();
        assert_eq!(resolve("c1", r, None).unwrap(), r.join("c1/smoke"));
        let err = resolve("c2", r, None).unwrap_err().to_string();
        assert!(
            err.contains("nightly, smoke") && err.contains("--manifest"),
            "{err}"
        );
        assert_eq!(resolve("c2", r, Some("smoke")).unwrap(), r.join("c2/smoke"));
        assert!(
            resolve("c3", r, None)
                .unwrap_err()
                .to_string()
                .contains("no receipt tree")
        );
        assert_eq!(resolve("latest", r, None).unwrap(), r.join("c2/nightly"));
        let err = resolve("previous", r, None).unwrap_err().to_string();
        assert!(
            err.contains("only one run of manifest \"nightly\""),
            "{err}"
        );
        assert_eq!(
            resolve("latest", r, Some("smoke")).unwrap(),
            r.join("c2/smoke")
        );
        assert_eq!(
            resolve("previous", r, Some("smoke")).unwrap(),
            r.join("c1/smoke")
        );
        let runs = list_runs(r).unwrap();
        assert_eq!(runs.len(), 3);
        assert_eq!(runs[0].commit, "c2");
        let folder = r.join("c1/smoke");
        assert_eq!(resolve(folder.to_str().unwrap(), r, None).unwrap(), folder);
    }
}
