//! The commit a run is filed under: `git rev-parse HEAD` of the manifest's root, `-dirty`
//! when the work tree has uncommitted changes, a `--commit` override, and `no-git` outside
//! any git repository, and the paths that made a tree dirty. It names receipt folders; it
//! does not read or write them.

use std::path::Path;
use std::process::{Command, Stdio};

/// The identity of the code a run tested.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommitId {
    /// The receipt folder name: `<sha>`, `<sha>-dirty`, the override, or `no-git`.
    pub id: String,
    /// The full commit sha when git knows one.
    pub sha: Option<String>,
    pub dirty: bool,
}

/// Folder name used for runs outside any git repository. It is stable, so `--resume` works
/// there too; pass `--commit` to keep several such runs apart.
pub const NO_GIT: &str = "no-git";

/// A commit id a run cannot be filed under.
#[derive(Debug, thiserror::Error)]
pub enum CommitError {
    #[error(
        "--commit {id:?}: not usable as a receipt folder name; use letters, digits, '.', '_' and '-' only (for example a commit sha or `nightly-2026-11-29`)"
    )]
    BadOverride { id: String },
}

/// Resolves the commit of `root`. An override must be a plain folder name.
pub fn resolve(root: &Path, override_id: Option<&str>) -> Result<CommitId, CommitError> {
    if let Some(id) = override_id {
        validate_override(id)?;
        // An override that is the root's own HEAD (what `bisect` passes for the worktree
        // it made) still records the sha: the folder name is then a commit, not a label.
        let head = git(root, &["rev-parse", "--verify", "HEAD"]);
        return Ok(CommitId {
            id: id.to_string(),
            sha: head.filter(|h| h == id),
            dirty: id.ends_with("-dirty"),
        });
    }
    let Some(sha) = git(root, &["rev-parse", "--verify", "HEAD"]) else {
        return Ok(CommitId {
            id: NO_GIT.to_string(),
            sha: None,
            dirty: false,
        });
    };
    // Untracked files that git does not ignore count: a new source file changes the build.
    let dirty = git(root, &["status", "--porcelain"]).is_some_and(|s| !s.is_empty());
    let id = if dirty {
        format!("{sha}-dirty")
    } else {
        sha.clone()
    };
    Ok(CommitId {
        id,
        sha: Some(sha),
        dirty,
    })
}

fn validate_override(id: &str) -> Result<(), CommitError> {
    let ok = !id.is_empty()
        && id != "."
        && id != ".."
        && id.len() <= 128
        && id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
    if ok {
        Ok(())
    } else {
        Err(CommitError::BadOverride { id: id.to_string() })
    }
}

/// The paths that make the work tree of `root` dirty, as `git status --porcelain` lists
/// them (a rename as `old -> new`), so a run filed under `<sha>-dirty` can say why.
pub fn dirty_paths(root: &Path) -> Vec<String> {
    // Untrimmed: the first line's status column may start with a space.
    let Some(text) = git_raw(root, &["status", "--porcelain"]) else {
        return Vec::new();
    };
    text.lines()
        .filter_map(|l| l.get(3..))
        .filter(|p| !p.is_empty())
        .map(str::to_string)
        .collect()
}

/// Runs git in `dir` and returns its trimmed stdout when it succeeded.
pub(crate) fn git(dir: &Path, args: &[&str]) -> Option<String> {
    git_raw(dir, args).map(|s| s.trim().to_string())
}

fn git_raw(dir: &Path, args: &[&str]) -> Option<String> {
    let out = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(args)
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

/// First 12 characters of a 40-hex commit folder name, keeping `-dirty`.
pub fn short_commit(c: &str) -> String {
    let (base, dirty) = match c.strip_suffix("-dirty") {
        Some(b) => (b, "-dirty"),
        None => (c, ""),
    };
    if base.len() == 40 && base.chars().all(|ch| ch.is_ascii_hexdigit()) {
        format!("{}{dirty}", &base[..12])
    } else {
        c.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sh(dir: &Path, args: &[&str]) {
        let ok = Command::new("git")
            .arg("-C")
            .arg(dir)
            .args([
                "-c",
                "user.name=t",
                "-c",
                "user.email=t@t",
                "-c",
                "commit.gpgsign=false",
            ])
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .unwrap()
            .success();
        assert!(ok, "git {args:?}");
    }

    #[test]
    fn outside_git_is_no_git() {
        let dir = tempfile::tempdir().unwrap();
        let c = resolve(dir.path(), None).unwrap();
        assert_eq!(
            c,
            CommitId {
                id: NO_GIT.into(),
                sha: None,
                dirty: false
            }
        );
    }

    #[test]
    fn clean_and_dirty_trees() {
        let dir = tempfile::tempdir().unwrap();
        sh(dir.path(), &["init", "-q"]);
        std::fs::write(dir.path().join("a"), "1").unwrap();
        sh(dir.path(), &["add", "a"]);
        sh(dir.path(), &["commit", "-q", "-m", "one"]);
        let clean = resolve(dir.path(), None).unwrap();
        let sha = clean.sha.clone().unwrap();
        assert_eq!(sha.len(), 40);
        assert_eq!(clean.id, sha);
        assert!(!clean.dirty);
        std::fs::write(dir.path().join("a"), "2").unwrap();
        let dirty = resolve(dir.path(), None).unwrap();
        assert_eq!(dirty.id, format!("{sha}-dirty"));
        assert!(dirty.dirty);
    }

    #[test]
    fn overrides_must_be_folder_names() {
        assert_eq!(
            resolve(Path::new("/"), Some("nightly-1")).unwrap().id,
            "nightly-1"
        );
        for bad in ["..", "a/b", "", "x y"] {
            let e = resolve(Path::new("/"), Some(bad)).unwrap_err();
            assert!(e.to_string().contains("--commit"), "{e}");
        }
    }
}
