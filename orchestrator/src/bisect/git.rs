//! What bisection asks of git: the first-parent line of commits from `good` to `bad`, a
//! commit's subject and author, the manifest's path inside the repository, and detached
//! worktrees (added for a candidate, removed after it). Every call names the repository
//! with `-C`; none touches the user's checkout: `git worktree add` writes only below
//! `.git/worktrees/` and the new folder.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// One commit of the line.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct CommitInfo {
    pub sha: String,
    pub subject: String,
    pub author: String,
}

impl CommitInfo {
    pub fn short(&self) -> &str {
        &self.sha[..self.sha.len().min(10)]
    }
}

/// A git command that failed, with what it printed.
#[derive(Debug, thiserror::Error)]
#[error("git {args}: {message}")]
pub struct GitError {
    pub args: String,
    pub message: String,
}

/// Runs git in `repo`, returning its stdout without the final newline.
pub fn git(repo: &Path, args: &[&str]) -> Result<String, GitError> {
    let out = Command::new("git")
        .arg("-C")
        .arg(repo)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| GitError {
            args: args.join(" "),
            message: format!("cannot run git: {e}"),
        })?;
    if !out.status.success() {
        return Err(GitError {
            args: args.join(" "),
            message: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout)
        .trim_end_matches('\n')
        .to_string())
}

/// The top of the work tree that holds `path` (a file or a folder).
pub fn toplevel(path: &Path) -> Result<PathBuf, GitError> {
    let dir = if path.is_dir() {
        path
    } else {
        path.parent().unwrap_or(Path::new("."))
    };
    let dir = if dir.as_os_str().is_empty() {
        Path::new(".")
    } else {
        dir
    };
    git(dir, &["rev-parse", "--show-toplevel"]).map(PathBuf::from)
}

/// The full sha of a commit-ish, refusing anything that is not a commit.
pub fn resolve_commit(repo: &Path, rev: &str) -> Result<String, GitError> {
    git(
        repo,
        &[
            "rev-parse",
            "--verify",
            "--quiet",
            &format!("{rev}^{{commit}}"),
        ],
    )
    .map_err(|_| GitError {
        args: format!("rev-parse {rev}"),
        message: format!(
            "`{rev}` is not a commit of {}; name a sha, a tag, a branch or `HEAD~N`",
            repo.display()
        ),
    })
}

/// The line from `good` (first) to `bad` (last) along first parents: `bad`, its first
/// parent, and so on back to `good`. `None` when `good` is not a first-parent ancestor of
/// `bad`.
pub fn first_parent_line(
    repo: &Path,
    good: &str,
    bad: &str,
) -> Result<Option<Vec<CommitInfo>>, GitError> {
    let range = format!("{good}..{bad}");
    let text = git(
        repo,
        &[
            "log",
            "--first-parent",
            "--reverse",
            "--format=%H%x1f%s%x1f%an <%ae>",
            &range,
        ],
    )?;
    let mut line = vec![info(repo, good)?];
    line.extend(text.lines().filter(|l| !l.is_empty()).map(parse_info));
    // `good..bad` also lists commits of `bad` that reach `good` through a merge's second
    // parent only; the line must start from `good` itself.
    let starts_at_good = match line.get(1) {
        None => good == bad,
        Some(first) => {
            git(repo, &["rev-parse", &format!("{}^", first.sha)]).is_ok_and(|parent| parent == good)
        }
    };
    Ok(starts_at_good.then_some(line))
}

fn info(repo: &Path, sha: &str) -> Result<CommitInfo, GitError> {
    git(repo, &["show", "-s", "--format=%H%x1f%s%x1f%an <%ae>", sha]).map(|l| parse_info(&l))
}

fn parse_info(line: &str) -> CommitInfo {
    let mut parts = line.splitn(3, '\x1f');
    // Subjects and authors are anyone's text (a hostile commit): every display of them,
    // text or markdown, gets their control and bidirectional characters escaped.
    let shown = |s: Option<&str>| crate::words::escape::control(s.unwrap_or_default()).into_owned();
    CommitInfo {
        sha: parts.next().unwrap_or_default().to_string(),
        subject: shown(parts.next()),
        author: shown(parts.next()),
    }
}

/// Whether `path` (relative to the repository's top) exists at `sha`.
pub fn exists_at(repo: &Path, sha: &str, path: &str) -> bool {
    git(repo, &["cat-file", "-e", &format!("{sha}:{path}")]).is_ok()
}

/// Adds a detached worktree of `sha` at `dir` (which must not exist). git's records of
/// worktrees whose folders are gone (a bisect killed with SIGKILL left them) are pruned
/// first, so they never accumulate.
pub fn add_worktree(repo: &Path, dir: &Path, sha: &str) -> Result<(), GitError> {
    let _ = git(repo, &["worktree", "prune"]);
    let d = dir.to_string_lossy();
    git(repo, &["worktree", "add", "--detach", "--quiet", &d, sha]).map(|_| ())
}

/// The prefix of the temporary folder a bisect makes its worktrees in.
pub const WORKTREES_PREFIX: &str = "memra-bisect-";

/// The file in that folder naming the bisect's pid.
pub const OWNER_FILE: &str = "owner.pid";

/// Removes the worktrees (folders and git's records) that a bisect killed with SIGKILL left
/// in `repo`: those in a `memra-bisect-*` folder of the temporary folder whose owner is no
/// longer alive. A live bisect's worktrees are left alone.
pub fn prune_stale(repo: &Path) {
    let Ok(list) = git(repo, &["worktree", "list", "--porcelain"]) else {
        return;
    };
    let temp = std::fs::canonicalize(std::env::temp_dir()).unwrap_or_else(|_| std::env::temp_dir());
    for line in list.lines() {
        let Some(path) = line.strip_prefix("worktree ") else {
            continue;
        };
        let path = Path::new(path);
        let Some(folder) = path.parent() else {
            continue;
        };
        let ours = folder.parent() == Some(temp.as_path())
            && folder
                .file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with(WORKTREES_PREFIX));
        if !ours {
            continue;
        }
        let owner_alive = std::fs::read_to_string(folder.join(OWNER_FILE))
            .ok()
            .and_then(|t| t.trim().parse::<libc::pid_t>().ok())
            // SAFETY: signal 0 only asks whether the process exists.
            .is_some_and(|pid| unsafe { libc::kill(pid, 0) } == 0);
        if !owner_alive {
            remove_worktree(repo, path);
            let _ = std::fs::remove_dir_all(folder);
        }
    }
    let _ = git(repo, &["worktree", "prune"]);
}

/// Removes a worktree added by [`add_worktree`], files and all, and git's record of it.
pub fn remove_worktree(repo: &Path, dir: &Path) {
    let d = dir.to_string_lossy();
    if git(repo, &["worktree", "remove", "--force", "--force", &d]).is_err() {
        // A folder git no longer knows (or a half-made one): delete it, then let git
        // forget its record.
        let _ = std::fs::remove_dir_all(dir);
    }
    let _ = git(repo, &["worktree", "prune"]);
}
