//! The ways working with receipt trees fails: a file or folder that cannot be read, written,
//! locked or deleted ([`ReceiptError`], the path and what went wrong there), and a run or
//! node a user named that cannot be found ([`FindError`]). Every message ends in what to do.
//!
//! It owns the wording only; the operations that fail are in the sibling modules.

use std::path::PathBuf;

/// A receipt file or folder operation that failed, and where.
#[derive(Debug, thiserror::Error)]
#[error("{}: {kind}", path.display())]
pub struct ReceiptError {
    pub path: PathBuf,
    pub kind: ReceiptErrorKind,
}

impl ReceiptError {
    pub fn new(path: impl Into<PathBuf>, kind: ReceiptErrorKind) -> ReceiptError {
        ReceiptError {
            path: path.into(),
            kind,
        }
    }

    /// Whether the operation failed because the file system is full (or the quota used up).
    pub fn is_disk_full(&self) -> bool {
        self.io_error()
            .is_some_and(crate::words::diskfull::is_disk_full)
    }

    /// The system's error behind a failed write, when that is what failed.
    pub fn io_error(&self) -> Option<&std::io::Error> {
        use ReceiptErrorKind as K;
        match &self.kind {
            K::Write(e) | K::Rename(e) | K::Create(e) | K::CreateFolder(e) | K::CreateLock(e) => {
                Some(e)
            }
            _ => None,
        }
    }
}

/// Who holds a manifest folder's run lock, as its lock file says.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LockHolder {
    pub pid: Option<i32>,
    /// `gc` holds it (for a moment: while it moves a run aside).
    pub gc: bool,
}

impl LockHolder {
    /// Whether the hold is a moment's: gc moving a run aside, or a holder that has not yet
    /// written its name (it does so right after taking the lock).
    pub fn momentary(&self) -> bool {
        self.gc || self.pid.is_none()
    }
}

fn locked_message(h: &LockHolder) -> String {
    let pid = h.pid.map(|p| format!(" (pid {p})")).unwrap_or_default();
    if h.gc {
        format!(
            "memra-orch gc{pid} is deleting a run in this manifest folder; run again in a moment \
             (or pass --wait-lock DURATION)"
        )
    } else {
        format!(
            "another memra-orch run{pid} is running this manifest at this commit; wait for it to \
             finish (or pass --wait-lock DURATION), or pass --commit or --receipts to run elsewhere"
        )
    }
}

/// What went wrong at a [`ReceiptError`]'s path.
#[derive(Debug, thiserror::Error)]
pub enum ReceiptErrorKind {
    #[error("has no parent folder; name a path inside a folder")]
    NoParent,
    #[error("cannot write: {0}; check the receipt folder is writable")]
    Write(std::io::Error),
    #[error("cannot rename into place: {0}; check the receipt folder is writable")]
    Rename(std::io::Error),
    #[error("cannot serialise: {0}; this is a bug in memra-orch, please report it")]
    Serialise(serde_json::Error),
    #[error(
        "not a receipt this version understands: {0}; read it with the memra-orch version that wrote it"
    )]
    Format(serde_json::Error),
    #[error("cannot read: {0}; check that the file is readable")]
    Read(std::io::Error),
    #[error("cannot create: {0}; check the receipt folder is writable")]
    Create(std::io::Error),
    #[error("cannot create the receipt folder: {0}; check its permissions or pass --receipts DIR")]
    CreateFolder(std::io::Error),
    #[error("{}", locked_message(.0))]
    Locked(LockHolder),
    #[error("cannot create the run lock: {0}; check the receipt folder is writable")]
    CreateLock(std::io::Error),
    #[error("cannot move aside for deletion: {0}; check the receipts folder is writable")]
    MoveAside(std::io::Error),
    #[error("kept: {} carries receipts from it (it ended while gc ran)", .0.display())]
    CarriedBy(std::path::PathBuf),
    #[error("cannot delete: {0}; remove it by hand")]
    Delete(std::io::Error),
    #[error(
        "no run.json; this folder is not a receipt tree (pass a run folder, a commit or `latest`)"
    )]
    NoRunJson,
    #[error(
        "node {id:?} has slug {slug:?}, which is not a plain folder name; the run.json was edited or corrupted, so run the battery again"
    )]
    BadSlug { id: String, slug: String },
    #[error(
        "node {id:?} is carried from {from:?}, which is not a sibling run folder; the run.json was edited or corrupted, so run the battery again"
    )]
    BadCarry { id: String, from: String },
    #[error(
        "node {id:?} is carried from {run}, whose receipt is gone; that run was deleted by hand, so run the battery again"
    )]
    CarriedMissing { id: String, run: String },
}

/// A run, commit or node that a user named and that could not be found.
#[derive(Debug, thiserror::Error)]
pub enum FindError {
    #[error("cannot read the current folder: {0}; pass --receipts DIR")]
    CurrentDir(std::io::Error),
    #[error(
        "{}: cannot list the receipts folder: {error}; run `memra-orch run` first or pass --receipts DIR",
        receipts.display()
    )]
    ListReceipts {
        receipts: PathBuf,
        error: std::io::Error,
    },
    #[error(
        "{spec}: no run{} under {}; run `memra-orch run` first or pass --receipts DIR",
        manifest.as_ref().map(|m| format!(" of manifest {m:?}")).unwrap_or_default(),
        receipts.display()
    )]
    NoRun {
        spec: String,
        manifest: Option<String>,
        receipts: PathBuf,
    },
    #[error(
        "previous: only one run of manifest {manifest:?} under {}; name two runs or commits instead",
        receipts.display()
    )]
    OnlyOneRun { manifest: String, receipts: PathBuf },
    #[error(
        "{spec:?}: not a run folder, not `latest`/`previous`, not a commit folder under {} and not a commit git knows here; pass a folder, a commit (`HEAD~1`, a short sha) or `latest`",
        receipts.display()
    )]
    Unknown { spec: String, receipts: PathBuf },
    #[error(
        "{spec:?} is commit {sha}, but {} has no receipts for it (looked for {}`<sha>-dirty`); run the battery at that commit or pass --receipts DIR",
        receipts.display(),
        if *dirty { "" } else { "`<sha>` and " }
    )]
    NoReceiptsForCommit {
        spec: String,
        sha: String,
        receipts: PathBuf,
        dirty: bool,
    },
    #[error("{}: cannot list: {error}; check the folder's permissions", dir.display())]
    ListCommit { dir: PathBuf, error: std::io::Error },
    #[error(
        "{spec}: {} holds no run of manifest {manifest:?} (it holds: {}); check --manifest",
        dir.display(),
        if held.is_empty() { "none".to_string() } else { held.join(", ") }
    )]
    NoSuchManifest {
        spec: String,
        dir: PathBuf,
        manifest: String,
        held: Vec<String>,
    },
    #[error(
        "{spec}: {} holds no receipt tree (no <manifest>/run.json); pass a run folder or a commit that has receipts",
        dir.display()
    )]
    NoTree { spec: String, dir: PathBuf },
    #[error(
        "{spec}: {} holds runs of several manifests ({}); pick one with --manifest NAME",
        dir.display(),
        held.join(", ")
    )]
    SeveralManifests {
        spec: String,
        dir: PathBuf,
        held: Vec<String>,
    },
    #[error(
        "{}: no node {query:?}{}; `memra-orch show` without a node lists them",
        dir.display(),
        near.as_ref().map(|n| format!(" (did you mean {n:?}?)")).unwrap_or_default()
    )]
    NoNode {
        dir: PathBuf,
        query: String,
        near: Option<String>,
    },
    #[error(
        "{query:?} matches {} nodes ({}{}); name one",
        matches.len(),
        matches.iter().take(5).cloned().collect::<Vec<_>>().join(", "),
        if matches.len() > 5 { ", …" } else { "" }
    )]
    ManyNodes { query: String, matches: Vec<String> },
    /// `show --log`: the file asked for could not be read (why, with the node).
    #[error("{0}")]
    NoLog(String),
    #[error(
        "{spec:?} is the start of {} run ids ({}{}); give more of the id",
        matches.len(),
        matches.iter().take(5).cloned().collect::<Vec<_>>().join(", "),
        if matches.len() > 5 { ", …" } else { "" }
    )]
    ManyRuns { spec: String, matches: Vec<String> },
    #[error(
        "last-green: no green run of {manifest} among {runs} run{}; the newest had {newest_bad} cell{} not as expected (`memra-orch ls` lists the runs; `last-green:CELL` names the last run where one cell was)",
        if *runs == 1 { "" } else { "s" },
        if *newest_bad == 1 { "" } else { "s" }
    )]
    NoGreen {
        manifest: String,
        runs: usize,
        newest_bad: usize,
    },
    #[error(
        "last-green:{cell}: the cell was not as expected in any of {runs} run{} of {manifest}{}; `memra-orch history {cell:?}` shows its timeline",
        if *runs == 1 { "" } else { "s" },
        newest.map(|v| format!(" (the newest says {v})")).unwrap_or_default()
    )]
    NoGreenCell {
        cell: String,
        manifest: String,
        runs: usize,
        newest: Option<crate::words::verdict::Verdict>,
    },
    #[error(
        "last-green:{cell}: no cell {cell:?} in {runs} run{} of {manifest}{}; give a whole cell id as `memra-orch show latest` lists it",
        if *runs == 1 { "" } else { "s" },
        near.as_ref().map(|n| format!(" (did you mean {n:?}?)")).unwrap_or_default()
    )]
    NoSuchCell {
        cell: String,
        manifest: String,
        runs: usize,
        near: Option<String>,
    },
    #[error(
        "{spec}: no run of {manifest} started on that UTC day among {runs} run{} (from {first} to {last}); `memra-orch ls` lists them",
        if *runs == 1 { "" } else { "s" }
    )]
    NoRunOnDay {
        spec: String,
        manifest: String,
        runs: usize,
        first: String,
        last: String,
    },
    #[error("{spec:?}: not a day; write @YYYY-MM-DD (a UTC day, e.g. @2026-11-30)")]
    BadDay { spec: String },
    #[error(transparent)]
    Receipt(#[from] ReceiptError),
}
