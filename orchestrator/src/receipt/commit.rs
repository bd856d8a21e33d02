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
use std::os::unix::ffi::OsStrExt;
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
    /// The commit's subject line, when `sha` names a commit (shown beside the commit in
    /// the report and the summary).
    pub subject: Option<String>,
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
    let code = head.as_ref().and_then(|_| code_identity(root, &specs));
    if let Some(id) = override_id {
        validate_override(id)?;
        // An override that is the root's own HEAD (what `bisect` passes for the worktree
        // it made) still records the sha: the folder name is then a commit, not a label.
        let sha = head.filter(|h| h == id);
        let subject = sha.as_ref().and_then(|s| subject_of(root, s));
        return Ok(CommitId {
            id: id.to_string(),
            sha,
            dirty: id.ends_with("-dirty"),
            code,
            subject,
        });
    }
    let Some(sha) = head else {
        return Ok(CommitId {
            id: NO_GIT.to_string(),
            sha: None,
            dirty: false,
            code: None,
            subject: None,
        });
    };
    let id = if dirty {
        format!("{sha}-dirty")
    } else {
        sha.clone()
    };
    let subject = subject_of(root, &sha);
    Ok(CommitId {
        id,
        sha: Some(sha),
        dirty,
        code,
        subject,
    })
}

/// The subject line of commit `sha`, cut to 200 characters.
fn subject_of(root: &Path, sha: &str) -> Option<String> {
    let s = git(root, &["log", "-1", "--format=%s", sha, "--"])?;
    let s = s.trim();
    (!s.is_empty()).then(|| s.chars().take(200).collect())
}

/// The pathspecs that select the whole work tree of `root` but the `own` paths inside it.
/// An own path that holds tracked files is not left out: a tracked file memra-orch wrote
/// over (a `--metrics-file notes.txt`, `--receipts src`) is a change to the code.
fn pathspecs(root: &Path, own: &[PathBuf]) -> Vec<String> {
    let mut specs = vec![":/".to_string()];
    let root = std::fs::canonicalize(root).unwrap_or_else(|_| root.to_path_buf());
    for p in own {
        if let Some(rel) = rel_inside(&root, p) {
            let literal = format!(":(top,literal){rel}");
            let tracked =
                git_bytes(&root, &["ls-files", "-z", "--", &literal]).is_none_or(|b| !b.is_empty());
            if !tracked {
                specs.push(format!(":(top,exclude,literal){rel}"));
            }
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

/// How deep nested repositories (submodules, clones inside the tree) are followed.
const MAX_NESTING: usize = 8;

/// The code identity of a work tree whose HEAD exists (see [`CommitId::code`]): the tree of
/// HEAD, and, when anything differs from it, a digest of what does — what `git diff HEAD`
/// shows; every untracked, not ignored file (its path and bytes; a link's target, never
/// followed; a repository cloned inside the tree by its own identity); the bytes of files
/// git is told not to look at (`assume-unchanged`, `skip-worktree`); and every submodule
/// by its own identity. Two runs share an identity only when they tested the same bytes.
fn code_identity(root: &Path, specs: &[String]) -> Option<String> {
    code_identity_at(root, specs, 0)
}

fn code_identity_at(root: &Path, specs: &[String], depth: usize) -> Option<String> {
    let tree = git(root, &["rev-parse", "--verify", "HEAD^{tree}"])?;
    let mut h = Sha256::new();
    let mut extra = false;
    let run = |args: &[&str]| {
        let mut all: Vec<&str> = args.to_vec();
        all.push("--");
        all.extend(specs.iter().map(String::as_str));
        git_bytes(root, &all)
    };
    let diff = run(&[
        "diff",
        "HEAD",
        "--binary",
        "--no-ext-diff",
        "--no-textconv",
        "--no-color",
        "--ignore-submodules=all",
    ])?;
    if !diff.is_empty() {
        extra = true;
        h.update(b"diff\0");
        h.update(&diff);
    }
    let mut fold = |what: &[u8], name: &[u8], digest: String| {
        extra = true;
        h.update(what);
        h.update(name);
        h.update(b"\0");
        h.update(digest.as_bytes());
    };
    let untracked = run(&["ls-files", "-z", "--others", "--exclude-standard"])?;
    for name in untracked.split(|b| *b == 0).filter(|n| !n.is_empty()) {
        let path = root.join(std::ffi::OsStr::from_bytes(name));
        fold(b"\0untracked\0", name, untracked_digest(&path, depth));
    }
    // `ls-files -v` tags a file git is told to assume unchanged with a lower-case letter,
    // and one marked skip-worktree with `S`: their bytes are read, since git will not.
    let tagged = run(&["ls-files", "-z", "-v"])?;
    for entry in tagged.split(|b| *b == 0).filter(|n| n.len() > 2) {
        let (tag, name) = (entry[0], &entry[2..]);
        if tag.is_ascii_lowercase() || tag == b'S' {
            let path = root.join(std::ffi::OsStr::from_bytes(name));
            fold(b"\0unwatched\0", name, untracked_digest(&path, depth));
        }
    }
    // Submodules (gitlinks, mode 160000) by their own identity, whatever .gitmodules says
    // git should ignore of them.
    let staged = run(&["ls-files", "-z", "-s"])?;
    for entry in staged
        .split(|b| *b == 0)
        .filter(|n| n.starts_with(b"160000 "))
    {
        let Some(tab) = entry.iter().position(|b| *b == b'\t') else {
            continue;
        };
        let name = &entry[tab + 1..];
        let path = root.join(std::ffi::OsStr::from_bytes(name));
        fold(b"\0submodule\0", name, nested_identity(&path, depth));
    }
    Some(if extra {
        format!("git:{tree}+{}", crate::words::digest::hex(&h.finalize()))
    } else {
        format!("git:{tree}")
    })
}

/// The identity of a repository inside the tree (a submodule, a clone): its own code
/// identity, or a word saying why there is none.
fn nested_identity(path: &Path, depth: usize) -> String {
    if depth >= MAX_NESTING {
        return "nested-too-deep".to_string();
    }
    if !path.join(".git").exists() {
        return "not-checked-out".to_string();
    }
    code_identity_at(path, &[":/".to_string()], depth + 1).unwrap_or_else(|| "no-head".to_string())
}

/// sha256 of an untracked file's bytes, `link:<target>` for a link, a folder's files (or,
/// for a repository cloned inside the tree, its identity), or a word for anything else (a
/// FIFO is never opened).
fn untracked_digest(path: &Path, depth: usize) -> String {
    let Ok(meta) = std::fs::symlink_metadata(path) else {
        return "vanished".to_string();
    };
    if meta.file_type().is_symlink() {
        return std::fs::read_link(path).map_or_else(
            |_| "link:?".to_string(),
            |t| format!("link:{}", t.to_string_lossy()),
        );
    }
    if meta.is_dir() {
        // git lists a repository inside the tree as one folder, not its files.
        if path.join(".git").exists() {
            return format!("repo:{}", nested_identity(path, depth));
        }
        let mut h = Sha256::new();
        let mut entries: Vec<PathBuf> = std::fs::read_dir(path)
            .map(|d| d.flatten().map(|e| e.path()).collect())
            .unwrap_or_default();
        entries.sort();
        for e in entries {
            // By name, not path: the identity must not depend on where the checkout lives.
            h.update(e.file_name().unwrap_or_default().as_bytes());
            h.update(b"\0");
            h.update(untracked_digest(&e, depth).as_bytes());
        }
        return format!("dir:{}", crate::words::digest::hex(&h.finalize()));
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
        Ok(crate::words::digest::hex(&h.finalize()))
    };
    digest().unwrap_or_else(|e| format!("unreadable:{e}"))
}

fn validate_override(id: &str) -> Result<(), CommitError> {
    // A leading dot would file the run among memra-orch's own folders (`.memra-index`,
    // `.memra-store`, `.memra-bisect`), which no listing reads as a commit.
    let ok = !id.is_empty()
        && !id.starts_with('.')
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
    // Whatever the user's configuration hides (`status.showUntrackedFiles = no`, a
    // submodule's `ignore = all`), every change counts.
    let mut args = vec![
        "status",
        "--porcelain",
        "--untracked-files=all",
        "--ignore-submodules=none",
        "--",
    ];
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
    let mut cmd = Command::new("git");
    // The caller's GIT_DIR, GIT_WORK_TREE, GIT_INDEX_FILE… would point git at another
    // repository than the one holding the manifest.
    for (name, _) in std::env::vars_os() {
        if name.to_string_lossy().starts_with("GIT_") {
            cmd.env_remove(name);
        }
    }
    let out = cmd
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
                subject: None,
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
    fn what_git_is_told_to_hide_still_counts() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        sh(root, &["init", "-q"]);
        std::fs::write(root.join("a.py"), "1").unwrap();
        sh(root, &["add", "a.py"]);
        sh(root, &["commit", "-q", "-m", "one"]);
        let code = || resolve(root, None, &[]).unwrap().code.unwrap();
        let clean = code();
        // Untracked files hidden from `git status`.
        sh(root, &["config", "status.showUntrackedFiles", "no"]);
        std::fs::write(root.join("helper.py"), "v1").unwrap();
        let v1 = code();
        assert_ne!(v1, clean);
        assert!(resolve(root, None, &[]).unwrap().dirty);
        std::fs::write(root.join("helper.py"), "v2").unwrap();
        assert_ne!(code(), v1);
        std::fs::remove_file(root.join("helper.py")).unwrap();
        // A tracked file git is told to assume unchanged.
        sh(root, &["update-index", "--assume-unchanged", "a.py"]);
        std::fs::write(root.join("a.py"), "2").unwrap();
        let assumed = code();
        std::fs::write(root.join("a.py"), "3").unwrap();
        assert_ne!(code(), assumed);
        sh(root, &["update-index", "--no-assume-unchanged", "a.py"]);
        sh(root, &["checkout", "-q", "a.py"]);
        assert_eq!(code(), clean);
        // A repository cloned inside the tree, by its own contents.
        let inner = root.join("vendor/lib");
        std::fs::create_dir_all(&inner).unwrap();
        sh(&inner, &["init", "-q"]);
        std::fs::write(inner.join("k.py"), "1").unwrap();
        sh(&inner, &["add", "k.py"]);
        sh(&inner, &["commit", "-q", "-m", "inner"]);
        let cloned = code();
        std::fs::write(inner.join("k.py"), "2").unwrap();
        assert_ne!(code(), cloned);
        std::fs::remove_dir_all(root.join("vendor")).unwrap();
        assert_eq!(code(), clean);
        // A submodule, by its own contents, even when .gitmodules says to ignore it.
        let upstream = tempfile::tempdir().unwrap();
        sh(upstream.path(), &["init", "-q"]);
        std::fs::write(upstream.path().join("k.py"), "1").unwrap();
        sh(upstream.path(), &["add", "k.py"]);
        sh(upstream.path(), &["commit", "-q", "-m", "up"]);
        sh(
            root,
            &[
                "-c",
                "protocol.file.allow=always",
                "submodule",
                "add",
                "-q",
                &upstream.path().to_string_lossy(),
                "sub",
            ],
        );
        sh(
            root,
            &["config", "-f", ".gitmodules", "submodule.sub.ignore", "all"],
        );
        sh(root, &["commit", "-q", "-am", "sub"]);
        let with_sub = code();
        std::fs::write(root.join("sub/k.py"), "2").unwrap();
        assert_ne!(code(), with_sub, "an edit inside the submodule");
        assert!(resolve(root, None, &[]).unwrap().dirty);
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
        // A tracked file is never left out, even when named as output.
        let own = [root.join("a")];
        std::fs::write(root.join("a"), "overwritten").unwrap();
        assert!(dirty_paths(root, &own).iter().any(|p| p == "a"));
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
