//! The commit a run is filed under: `git rev-parse HEAD` of the manifest's root, `-dirty`
//! when the work tree has uncommitted changes, a `--commit` override, and `no-git` outside
//! any git repository, and the paths that made a tree dirty. Also the *code identity* that
//! joins every cell's inputs digest: the tree of HEAD, plus a digest of the uncommitted
//! changes when there are any, so two runs count as "the same inputs" only when they tested
//! the same code.
//!
//! memra-orch's own output (the receipts folder, a report folder, a metrics file: the
//! `own` paths) is left out of both the dirty check and the code identity, so a second run
//! in a repository that does not ignore its receipts is not filed `-dirty` by the first.
//! It names receipt folders; it does not read or write them.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use sha2::{Digest, Sha256};

/// The identity of the code a run tested.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommitId {
    /// The receipt folder name: `<sha>`, `<sha>-dirty`, the override, or `no-git`.
    pub id: String,
    /// The full commit sha when git knows one.
    pub sha: Option<String>,
    pub dirty: bool,
    /// What code the run tested, for the inputs digest: `git:<tree sha>` for a clean work
    /// tree, `git:<tree sha>+<sha256 of the uncommitted changes>` for a dirty one, `None`
    /// when git knows no HEAD here (the code cannot be named).
    pub code: Option<String>,
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

/// Resolves the commit of `root`, leaving the `own` paths (memra-orch's own output) out of
/// the dirty check and the code identity. An override must be a plain folder name; it names
/// the folder only, and the code identity is still read from git where there is one.
pub fn resolve(
    root: &Path,
    override_id: Option<&str>,
    own: &[PathBuf],
) -> Result<CommitId, CommitError> {
    let head = git(root, &["rev-parse", "--verify", "HEAD"]);
    let specs = pathspecs(root, own);
    // Untracked files that git does not ignore count: a new source file changes the build.
    let dirty = head.is_some() && !dirty_paths_in(root, &specs).is_empty();
    let code = head
        .as_ref()
        .and_then(|_| code_identity(root, dirty, &specs));
    if let Some(id) = override_id {
        validate_override(id)?;
        // An override that is the root's own HEAD (what `bisect` passes for the worktree
        // it made) still records the sha: the folder name is then a commit, not a label.
        return Ok(CommitId {
            id: id.to_string(),
            sha: head.filter(|h| h == id),
            dirty: id.ends_with("-dirty"),
            code,
        });
    }
    let Some(sha) = head else {
        return Ok(CommitId {
            id: NO_GIT.to_string(),
            sha: None,
            dirty: false,
            code: None,
        });
    };
    let id = if dirty {
        format!("{sha}-dirty")
    } else {
        sha.clone()
    };
    Ok(CommitId {
        id,
        sha: Some(sha),
        dirty,
        code,
    })
}

/// The pathspecs that select the whole work tree of `root` but the `own` paths inside it.
fn pathspecs(root: &Path, own: &[PathBuf]) -> Vec<String> {
    let mut specs = vec![":/".to_string()];
    let root = std::fs::canonicalize(root).unwrap_or_else(|_| root.to_path_buf());
    for p in own {
        if let Some(rel) = rel_inside(&root, p) {
            specs.push(format!(":(top,exclude,literal){rel}"));
        }
    }
    specs
}

/// `path` relative to `root` (both spelled canonically), when it lies strictly inside it.
/// A path that does not exist yet is placed by its nearest existing ancestor.
fn rel_inside(root: &Path, path: &Path) -> Option<String> {
    let mut existing = path.to_path_buf();
    let mut rest: Vec<std::ffi::OsString> = Vec::new();
    let canonical = loop {
        if let Ok(c) = std::fs::canonicalize(&existing) {
            break c;
        }
        rest.push(existing.file_name()?.to_os_string());
        existing = existing.parent()?.to_path_buf();
    };
    let mut full = canonical;
    for r in rest.iter().rev() {
        full.push(r);
    }
    let rel = full.strip_prefix(root).ok()?;
    let rel = rel.to_str()?;
    (!rel.is_empty()).then(|| rel.to_string())
}

/// The code identity of a work tree whose HEAD exists (see [`CommitId::code`]). The
/// uncommitted changes are what `git diff HEAD` shows plus every untracked, not ignored
/// file (its path and bytes; a link's target, never followed), so two dirty runs share an
/// identity only when they tested the same bytes.
fn code_identity(root: &Path, dirty: bool, specs: &[String]) -> Option<String> {
    let tree = git(root, &["rev-parse", "--verify", "HEAD^{tree}"])?;
    if !dirty {
        return Some(format!("git:{tree}"));
    }
    let mut h = Sha256::new();
    let mut args = vec![
        "diff",
        "HEAD",
        "--binary",
        "--no-ext-diff",
        "--no-textconv",
        "--no-color",
        "--",
    ];
    args.extend(specs.iter().map(String::as_str));
    h.update(git_bytes(root, &args)?);
    let mut args = vec!["ls-files", "-z", "--others", "--exclude-standard", "--"];
    args.extend(specs.iter().map(String::as_str));
    let listed = git_bytes(root, &args)?;
    for name in listed.split(|b| *b == 0).filter(|n| !n.is_empty()) {
        h.update(b"\0untracked\0");
        h.update(name);
        h.update(b"\0");
        let path = root.join(String::from_utf8_lossy(name).as_ref());
        h.update(untracked_digest(&path).as_bytes());
    }
    Some(format!("git:{tree}+{}", crate::digest::hex(&h.finalize())))
}

/// sha256 of an untracked file's bytes, `link:<target>` for a link, or a word for anything
/// else (a FIFO is never opened).
fn untracked_digest(path: &Path) -> String {
    let Ok(meta) = std::fs::symlink_metadata(path) else {
        return "vanished".to_string();
    };
    if meta.file_type().is_symlink() {
        return std::fs::read_link(path).map_or_else(
            |_| "link:?".to_string(),
            |t| format!("link:{}", t.to_string_lossy()),
        );
    }
    if !meta.is_file() {
        return "not-a-file".to_string();
    }
    let digest = || -> std::io::Result<String> {
        use std::os::unix::fs::OpenOptionsExt;
        // Not blocking, and checked once open: a FIFO swapped in after the look above
        // must not hang the run.
        let mut f = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK | libc::O_NOFOLLOW)
            .open(path)?;
        if !f.metadata()?.is_file() {
            return Ok("not-a-file".to_string());
        }
        let mut h = Sha256::new();
        let mut buf = vec![0u8; 1 << 16];
        loop {
            let n = f.read(&mut buf)?;
            if n == 0 {
                break;
            }
            h.update(&buf[..n]);
        }
        Ok(crate::digest::hex(&h.finalize()))
    };
    digest().unwrap_or_else(|e| format!("unreadable:{e}"))
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
/// them (a rename as `old -> new`), so a run filed under `<sha>-dirty` can say why. The
/// `own` paths are left out.
pub fn dirty_paths(root: &Path, own: &[PathBuf]) -> Vec<String> {
    dirty_paths_in(root, &pathspecs(root, own))
}

fn dirty_paths_in(root: &Path, specs: &[String]) -> Vec<String> {
    let mut args = vec!["status", "--porcelain", "--"];
    args.extend(specs.iter().map(String::as_str));
    // Untrimmed: the first line's status column may start with a space.
    let Some(text) = git_raw(root, &args) else {
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
    git_bytes(dir, args).map(|b| String::from_utf8_lossy(&b).into_owned())
}

fn git_bytes(dir: &Path, args: &[&str]) -> Option<Vec<u8>> {
    let out = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(args)
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .ok()?;
    out.status.success().then_some(out.stdout)
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
        let c = resolve(dir.path(), None, &[]).unwrap();
        assert_eq!(
            c,
            CommitId {
                id: NO_GIT.into(),
                sha: None,
                dirty: false,
                code: None,
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
        let clean = resolve(dir.path(), None, &[]).unwrap();
        let sha = clean.sha.clone().unwrap();
        assert_eq!(sha.len(), 40);
        assert_eq!(clean.id, sha);
        assert!(!clean.dirty);
        let tree = clean.code.clone().unwrap();
        assert!(tree.starts_with("git:") && !tree.contains('+'), "{tree}");
        std::fs::write(dir.path().join("a"), "2").unwrap();
        let dirty = resolve(dir.path(), None, &[]).unwrap();
        assert_eq!(dirty.id, format!("{sha}-dirty"));
        assert!(dirty.dirty);
        let two = dirty.code.clone().unwrap();
        assert!(two.starts_with(&format!("{tree}+")), "{two}");
        // Other uncommitted bytes are other code; the same bytes again are the same code.
        std::fs::write(dir.path().join("a"), "3").unwrap();
        let three = resolve(dir.path(), None, &[]).unwrap().code.unwrap();
        assert_ne!(three, two);
        std::fs::write(dir.path().join("a"), "2").unwrap();
        assert_eq!(resolve(dir.path(), None, &[]).unwrap().code.unwrap(), two);
        // An untracked file is code too, by its bytes.
        std::fs::write(dir.path().join("new.py"), "x = 1").unwrap();
        let untracked = resolve(dir.path(), None, &[]).unwrap().code.unwrap();
        assert_ne!(untracked, two);
        std::fs::write(dir.path().join("new.py"), "x = 2").unwrap();
        assert_ne!(
            resolve(dir.path(), None, &[]).unwrap().code.unwrap(),
            untracked
        );
        // An override names the folder; the code is still the work tree's.
        let o = resolve(dir.path(), Some("nightly-1"), &[]).unwrap();
        assert_eq!(o.id, "nightly-1");
        assert!(o.code.unwrap().starts_with(&format!("{tree}+")));
    }

    #[test]
    fn own_output_neither_dirties_nor_changes_the_code() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        sh(root, &["init", "-q"]);
        std::fs::write(root.join("a"), "1").unwrap();
        sh(root, &["add", "a"]);
        sh(root, &["commit", "-q", "-m", "one"]);
        let own = [
            root.join("receipts"),
            root.join("site"),
            root.join("nightly.prom"),
            // Outside the root: nothing to leave out.
            std::env::temp_dir().join("elsewhere"),
        ];
        let clean = resolve(root, None, &own).unwrap();
        for f in ["receipts/c/m/run.json", "site/index.html", "nightly.prom"] {
            let p = root.join(f);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, "out").unwrap();
        }
        let after = resolve(root, None, &own).unwrap();
        assert!(!after.dirty, "{:?}", dirty_paths(root, &own));
        assert_eq!(after, clean);
        assert!(dirty_paths(root, &own).is_empty());
        // Without the list they are ordinary untracked files.
        assert_eq!(dirty_paths(root, &[]).len(), 3);
        assert!(resolve(root, None, &[]).unwrap().dirty);
        // A real change next to them still counts.
        std::fs::write(root.join("b.py"), "new").unwrap();
        let dirty = resolve(root, None, &own).unwrap();
        assert!(dirty.dirty);
        assert_eq!(dirty_paths(root, &own), ["b.py"]);
    }

    #[test]
    fn overrides_must_be_folder_names() {
        assert_eq!(
            resolve(Path::new("/"), Some("nightly-1"), &[]).unwrap().id,
            "nightly-1"
        );
        for bad in ["..", "a/b", "", "x y"] {
            let e = resolve(Path::new("/"), Some(bad), &[]).unwrap_err();
            assert!(e.to_string().contains("--commit"), "{e}");
        }
    }
}
