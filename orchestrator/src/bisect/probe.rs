//! Testing one candidate commit: its own detached worktree, the shared folders linked into
//! it, `memra-orch run <manifest> --filter CELL` there as a child process (the same
//! isolation, GPU leases and receipt tree as any run, filed under the commit in the user's
//! receipts folder), and the cell's receipt read back. Receipts already in the tree for the
//! commit with the same inputs are used instead of running again.
//!
//! What the receipt *means* for the search (good, changed, skipped) is decided in
//! `bisect::run`; this module only measures.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use super::git::{self, CommitInfo};
use crate::receipt::resolve::{self, FoundRun};
use crate::receipt::{Artifact, tree};
use crate::words::verdict::Verdict;

/// What every candidate shares: where the repository, manifest, receipts and binaries are.
#[derive(Debug, Clone)]
pub struct Setting {
    /// The top of the user's repository.
    pub repo: PathBuf,
    /// The manifest's path relative to `repo`.
    pub manifest_rel: String,
    /// The manifest's `name` (its receipts folder).
    pub manifest_name: String,
    pub cell: String,
    /// The receipts folder (absolute).
    pub receipts: PathBuf,
    /// `--var` overrides passed to every run.
    pub vars: Vec<(String, String)>,
    /// Paths (relative to the root) kept from one candidate to the next: each worktree gets
    /// them as links into `share_root/slot-<k>/`.
    pub share: Vec<String>,
    pub share_root: PathBuf,
    /// Where worktrees are made (one folder per candidate, removed after it).
    pub worktrees: PathBuf,
    /// Where the child runs' logs go.
    pub logs: PathBuf,
    /// The `memra-orch` binary the child runs use.
    pub exe: PathBuf,
    /// `--grace` of the child runs.
    pub grace: Option<String>,
    /// The GPU models of this machine, sorted; a receipt measured on others is not reused.
    pub gpu_models: Vec<String>,
}

/// One measurement of the cell at a commit: one run's receipt of it.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Measured {
    /// The run's folder.
    pub run_dir: PathBuf,
    pub run_id: String,
    pub verdict: Verdict,
    pub reason: Option<String>,
    /// The cell's artifacts by name (sha256).
    pub artifacts: BTreeMap<String, String>,
    /// Found in the receipts folder rather than run now.
    pub reused: bool,
    /// The cell's own reps (a manifest `reps = N`) ended differently within this run.
    pub reps_disagree: bool,
}

/// Why a commit could not be measured at all.
#[derive(Debug, Clone, PartialEq)]
pub enum NotMeasured {
    /// The commit cannot be tested (no manifest there, a manifest that does not load, or no
    /// such cell in it): skipped, with the reason.
    Untestable(String),
    /// Ctrl-C (or SIGTERM) stopped it.
    Interrupted,
    /// memra-orch or git failed in a way that says nothing about the commit.
    Broken(String),
}

/// A job slot: which share folder and which GPUs its runs get.
#[derive(Debug, Clone)]
pub struct Slot {
    pub index: usize,
    /// `--gpus` of the child runs.
    pub gpus: String,
}

/// The runs of the manifest at `sha` that measured the cell themselves and can stand for a
/// new measurement, newest first: clean runs that ended, whose manifest file is the one at
/// `sha`, with the same `--var` overrides and GPU models as now.
pub fn reusable(setting: &Setting, sha: &str) -> Vec<Measured> {
    let dir = tree::manifest_dir(&setting.receipts, sha, &setting.manifest_name);
    let Some(manifest_sha) = blob_sha256(&setting.repo, sha, &setting.manifest_rel) else {
        return Vec::new();
    };
    let vars: BTreeMap<String, String> = setting.vars.iter().cloned().collect();
    resolve::runs_in_manifest_dir(&dir)
        .into_iter()
        .filter(|r| {
            r.complete()
                && !r.run.dirty
                && !r.run.interrupted
                && r.run.manifest.sha256 == manifest_sha
                && r.run.vars == vars
                && models(&r.run.gpu_names()) == setting.gpu_models
        })
        .filter_map(|r| measured(&r, &setting.cell, true))
        .collect()
}

/// The GPU models of an inventory, sorted and without repeats.
pub fn models(names: &[String]) -> Vec<String> {
    let mut m = names.to_vec();
    m.sort();
    m.dedup();
    m
}

/// The cell's receipt in run `r`, when `r` measured it itself and it ended.
fn measured(r: &FoundRun, cell: &str, reused: bool) -> Option<Measured> {
    let entry = r.run.nodes.iter().find(|e| e.id == cell)?;
    // A cell the run did not select has no folder, or (downstream of a setup that ran) was
    // skipped without running: neither measured it. A skipped cell is re-evaluated, as
    // `run --resume` does, since what skipped it may have changed; a carried one was
    // measured by another run, which is found on its own.
    if entry.slug.is_none()
        || entry.carried.is_some()
        || entry.verdict == Verdict::Cancelled
        || (reused && entry.verdict == Verdict::Skipped)
    {
        return None;
    }
    let receipt = entry.slug.as_ref().and_then(|slug| {
        crate::receipt::read_node_receipt(&tree::Tree { dir: r.dir.clone() }.receipt_json(slug))
            .ok()
            .flatten()
    });
    let reps_disagree = receipt.as_ref().is_some_and(|n| {
        // The last attempt of each rep decides it (a retried crash is not a disagreement).
        let mut by_rep: BTreeMap<u32, Verdict> = BTreeMap::new();
        for a in &n.attempts {
            by_rep.insert(a.rep, a.outcome);
        }
        let mut outcomes = by_rep.values();
        outcomes
            .next()
            .is_some_and(|first| outcomes.any(|o| o != first))
    });
    let artifacts = receipt
        .map(|n| {
            n.artifacts
                .into_iter()
                .map(|Artifact { name, sha256, .. }| (name, sha256))
                .collect()
        })
        .unwrap_or_default();
    Some(Measured {
        run_dir: r.dir.clone(),
        run_id: r.id_label().to_string(),
        verdict: entry.verdict,
        reason: entry.reason.clone(),
        artifacts,
        reused,
        reps_disagree,
    })
}

/// The sha256 of a file as committed at `sha`, as `run.json` records a manifest's.
fn blob_sha256(repo: &Path, sha: &str, path: &str) -> Option<String> {
    let out = Command::new("git")
        .arg("-C")
        .arg(repo)
        .args(["cat-file", "blob", &format!("{sha}:{path}")])
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| crate::receipt::sha256_hex(&out.stdout))
}

/// Runs the cell once at `commit` in a fresh worktree on `slot`, and reads its receipt.
/// The worktree is removed afterwards, whatever happened.
pub fn measure(
    setting: &Setting,
    commit: &CommitInfo,
    slot: &Slot,
    attempt: usize,
    interrupt: &Arc<AtomicBool>,
) -> Result<Measured, NotMeasured> {
    if !git::exists_at(&setting.repo, &commit.sha, &setting.manifest_rel) {
        return Err(NotMeasured::Untestable(format!(
            "{} does not exist at this commit",
            setting.manifest_rel
        )));
    }
    let wt = setting
        .worktrees
        .join(format!("{}-{}-{attempt}", commit.short(), slot.index));
    if wt.exists() {
        git::remove_worktree(&setting.repo, &wt);
    }
    git::add_worktree(&setting.repo, &wt, &commit.sha)
        .map_err(|e| NotMeasured::Broken(e.to_string()))?;
    let result = link_shared(setting, &wt, slot)
        .map_err(NotMeasured::Broken)
        .and_then(|()| run_child(setting, commit, slot, &wt, attempt, interrupt));
    git::remove_worktree(&setting.repo, &wt);
    result
}

/// Links each shared path of the worktree to its folder in the slot's share, so a build
/// output (cargo's `target/`) survives from one candidate to the next of the same slot.
fn link_shared(setting: &Setting, wt: &Path, slot: &Slot) -> Result<(), String> {
    for rel in &setting.share {
        let keep = setting
            .share_root
            .join(format!("slot-{}", slot.index))
            .join(rel);
        std::fs::create_dir_all(&keep)
            .map_err(|e| format!("cannot make the shared folder {}: {e}", keep.display()))?;
        let at = wt.join(rel);
        if at.symlink_metadata().is_ok() {
            return Err(format!(
                "--share {rel}: the commit has {rel} in git, so it cannot be a shared folder; \
                 share a path the repository ignores (a build output such as `target`)"
            ));
        }
        if let Some(parent) = at.parent() {
            std::fs::create_dir_all(parent)
                .map_err(|e| format!("cannot make {}: {e}", parent.display()))?;
        }
        std::os::unix::fs::symlink(&keep, &at)
            .map_err(|e| format!("cannot link {} to {}: {e}", at.display(), keep.display()))?;
    }
    Ok(())
}

fn run_child(
    setting: &Setting,
    commit: &CommitInfo,
    slot: &Slot,
    wt: &Path,
    attempt: usize,
    interrupt: &Arc<AtomicBool>,
) -> Result<Measured, NotMeasured> {
    std::fs::create_dir_all(&setting.logs)
        .map_err(|e| NotMeasured::Broken(format!("cannot make {}: {e}", setting.logs.display())))?;
    let log_path = setting
        .logs
        .join(format!("{}-{attempt}.log", commit.short()));
    let log = std::fs::File::create(&log_path)
        .map_err(|e| NotMeasured::Broken(format!("cannot write {}: {e}", log_path.display())))?;
    let mut cmd = Command::new(&setting.exe);
    cmd.arg("run")
        .arg(wt.join(&setting.manifest_rel))
        .args(["--filter", &setting.cell])
        .arg("--receipts")
        .arg(&setting.receipts)
        .args(["--commit", &commit.sha])
        .args(["--gpus", &slot.gpus])
        .args(["--events", "json", "--progress", "quiet"])
        // A bisection's probe runs are no nights: nobody is told of them.
        .arg("--no-notify")
        // Nor do they delete anything: the runs bisect reuses stay.
        .arg("--no-retention");
    for (k, v) in &setting.vars {
        cmd.arg("--var").arg(format!("{k}={v}"));
    }
    if let Some(g) = &setting.grace {
        cmd.args(["--grace", g]);
    }
    cmd.current_dir(wt)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(log)
        // Its own process group: a Ctrl-C at the terminal reaches bisect, which stops the
        // run with SIGTERM so that it cancels its cells and finalizes its receipts.
        .process_group(0);
    let me = std::process::id() as libc::pid_t;
    // SAFETY: the closure runs in the forked child before exec and calls only prctl and
    // getppid, which are async-signal-safe.
    unsafe {
        use std::os::unix::process::CommandExt;
        cmd.pre_exec(move || {
            // If bisect dies, the run is told to stop as by Ctrl-C.
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM, 0, 0, 0);
            if libc::getppid() != me {
                return Err(std::io::Error::from_raw_os_error(libc::ESRCH));
            }
            Ok(())
        });
    }
    use std::os::unix::process::CommandExt as _;
    let mut child = cmd
        .spawn()
        .map_err(|e| NotMeasured::Broken(format!("cannot start {}: {e}", setting.exe.display())))?;
    let stdout = child.stdout.take().expect("stdout is piped");
    let reader = std::thread::spawn(move || {
        let mut tree = None;
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if let Ok(v) = serde_json::from_str::<serde_json::Value>(&line)
                && v.get("type").and_then(|t| t.as_str()) == Some("run-started")
            {
                tree = v.get("tree").and_then(|t| t.as_str()).map(PathBuf::from);
            }
        }
        tree
    });
    let mut stopped_at: Option<Instant> = None;
    let status = loop {
        match child.try_wait() {
            Ok(Some(s)) => break s,
            Ok(None) => {}
            Err(e) => return Err(NotMeasured::Broken(format!("waiting for the run: {e}"))),
        }
        if interrupt.load(Ordering::SeqCst) && stopped_at.is_none() {
            // SAFETY: kill with a pid this process spawned and has not reaped.
            unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
            stopped_at = Some(Instant::now());
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let tree = reader.join().ok().flatten();
    if stopped_at.is_some() {
        return Err(NotMeasured::Interrupted);
    }
    let Some(tree) = tree else {
        // The run refused before it started: at this commit the manifest does not load or
        // has no such cell (exit 2), or the machine lacks what it requires (exit 4).
        let why = first_error_line(&log_path).unwrap_or_else(|| format!("exit {status}"));
        return match status.code() {
            Some(2) | Some(4) => Err(NotMeasured::Untestable(why)),
            _ => Err(NotMeasured::Broken(format!(
                "memra-orch run ended without starting ({status}): {why}; its log is {}",
                log_path.display()
            ))),
        };
    };
    let found = resolve::runs_in_manifest_dir(tree.parent().unwrap_or(&tree))
        .into_iter()
        .find(|r| r.dir == tree)
        .ok_or_else(|| {
            NotMeasured::Broken(format!("the run left no run.json in {}", tree.display()))
        })?;
    if found.run.interrupted {
        return Err(NotMeasured::Interrupted);
    }
    measured(&found, &setting.cell, false).ok_or_else(|| {
        NotMeasured::Broken(format!(
            "run {} holds no receipt of {} of its own; its log is {}",
            found.dir.display(),
            setting.cell,
            log_path.display()
        ))
    })
}

/// The first line of a child's log that says what went wrong, without its prefix.
fn first_error_line(log: &Path) -> Option<String> {
    let text = std::fs::read_to_string(log).ok()?;
    text.lines()
        .find(|l| !l.trim().is_empty())
        .map(|l| l.trim_start_matches("memra-orch run: ").trim().to_string())
}
