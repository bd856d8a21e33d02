//! The receipt tree of DESIGN §6: the record formats (`run.json`, `receipt.json`), where
//! each file lives ([`tree`]), finding trees from what a user names ([`resolve`]), reading
//! them back ([`load`]) and deleting old ones ([`gc`]).
//!
//! It owns file formats, paths, digests and atomic writes. It does not run anything and does
//! not decide verdicts; the listener that writes receipts as a run goes, the human summary
//! and the JUnit file are `report`'s, and only stored here.

pub mod commit;
pub mod error;
pub mod gc;
pub mod load;
pub mod own_outputs;
pub mod pack;
pub mod resolve;
pub mod store;
pub mod tree;

use std::collections::BTreeMap;
use std::io::Read;
use std::path::Path;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::gate::checks::CheckRow;
use crate::plan::{Expect, NodeKind};
use crate::words::verdict::Verdict;
use error::{ReceiptError, ReceiptErrorKind as Kind};

/// Format version of `receipt.json`.
pub const RECEIPT_SCHEMA: u32 = 1;
/// Format version of `run.json`.
pub const RUN_SCHEMA: u32 = 1;

/// A file and its digest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileDigest {
    pub path: String,
    pub bytes: u64,
    pub sha256: String,
}

/// A file a gate wrote into its artifacts folder (name relative to that folder).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Artifact {
    pub name: String,
    pub bytes: u64,
    pub sha256: String,
}

/// A GPU as recorded in a node receipt.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuRef {
    pub index: u32,
    pub uuid: String,
    pub name: String,
}

/// A GPU quarantined for the rest of a run, as `run.json` records it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Quarantined {
    /// Its index (as in CUDA_VISIBLE_DEVICES) and UUID.
    pub gpu: u32,
    pub uuid: String,
    /// The cell during whose attempt it faulted, and the fault.
    pub cell: String,
    pub fault: String,
    /// The cell was queued to run again on a healthy GPU of the same model (its receipt
    /// keeps every attempt, the faulty ones included).
    pub retried: bool,
}

impl Quarantined {
    /// `gpu 0 GPU-…: Xid 79 during decode (queued to run again on a healthy GPU)`, each part
    /// passed through `text` (markdown escaping, or none), the UUID and cell through `code`
    /// (backticks in markdown): the one wording of every report that lists it.
    pub fn line(&self, text: &dyn Fn(&str) -> String, code: &dyn Fn(&str) -> String) -> String {
        format!(
            "gpu {} {}: {} during {}{}",
            self.gpu,
            code(&self.uuid),
            text(&self.fault),
            code(&self.cell),
            if self.retried {
                " (queued to run again on a healthy GPU of the same model)"
            } else {
                ""
            }
        )
    }
}

/// One attempt of a node.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AttemptRecord {
    /// 1-based attempt number; the folder is `attempt-<n>`.
    pub n: u32,
    /// 1-based rep this attempt belongs to.
    pub rep: u32,
    /// RFC 3339 start time (UTC).
    pub start: String,
    pub seconds: f64,
    pub exit: Option<i32>,
    pub signal: Option<i32>,
    /// Outcome of this attempt before `expect` is applied.
    pub outcome: Verdict,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// What this attempt wrote into its artifacts folder, so every rep's digests are kept
    /// (the node's `artifacts` are the last attempt's). Absent when it wrote nothing.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub artifacts: Vec<Artifact>,
    /// Each of the attempt's GPUs read before and after it, with the Xids it raised
    /// ([`crate::machine::health`]). Absent for attempts without GPUs.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gpu_health: Vec<crate::machine::health::AttemptHealth>,
}

/// `nodes/<slug>/receipt.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodeReceipt {
    pub schema: u32,
    pub id: String,
    pub node: String,
    pub kind: NodeKind,
    pub slug: String,
    /// Axis values of the cell.
    pub cell: BTreeMap<String, String>,
    #[serde(default)]
    pub tags: Vec<String>,
    /// The command of the last attempt, after substitution (empty for compare nodes).
    pub argv: Vec<String>,
    #[serde(default)]
    pub shell: bool,
    pub cwd: String,
    /// The full effective environment of the last attempt; values of names that look
    /// secret are `<redacted>`.
    pub env: BTreeMap<String, String>,
    /// The program that ran (`argv[0]` resolved through PATH) and the `produces` of the setup
    /// nodes this one needs.
    pub binaries: Vec<FileDigest>,
    /// For setup nodes: the files they produced.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub produces: Vec<FileDigest>,
    /// The files the node's declared `inputs` globs matched (paths relative to the root,
    /// sorted); absent when the node declares none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub input_files: Vec<FileDigest>,
    /// sha256 over what determines the node's behaviour (command, pins, cwd, binaries,
    /// needed setups' products, declared inputs, fingerprints, and the code: the commit's
    /// tree unless the cell is hermetic); `run --resume` re-runs a node whose inputs
    /// changed, and `diff` calls a change flaky only between equal digests.
    pub inputs: String,
    /// The code identity that went into `inputs`: `git:<tree>[+<uncommitted changes>]`,
    /// `hermetic`, or `unknown:<commit id>` (no git: runs are never evidence of flakiness).
    /// Absent in receipts written before it existed.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub code: String,
    /// The run's fingerprints that went into `inputs`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub fingerprints: Vec<crate::plan::fingerprint::Fingerprint>,
    pub gpus: Vec<GpuRef>,
    pub attempts: Vec<AttemptRecord>,
    pub verdict: Verdict,
    pub expect: Expect,
    /// The checks a negative cell's failure must be confined to (`expect_fail`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub expect_fail: Vec<String>,
    /// Metric-name globs `diff` shows but never counts as drift (`info`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub info: Vec<String>,
    pub reason: Option<String>,
    pub checks: Vec<CheckRow>,
    pub doors: Option<BTreeMap<String, Value>>,
    pub artifacts: Vec<Artifact>,
    /// The compare report of a compare node.
    pub compare: Option<Value>,
    /// Wall seconds of all attempts.
    pub seconds: f64,
    /// The cluster jobs that ran this cell (`<job id> <end state>`, one per submission, in
    /// order), for executors that place work on a cluster; absent for local runs.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub slurm_jobs: Vec<String>,
    /// Seconds the cell waited for a GPU that another run on the machine leased, before
    /// it started; absent when it did not wait.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_wait_seconds: Option<f64>,
}

impl NodeReceipt {
    /// A receipt with the identity of a cell and nothing else yet (verdict `error` until
    /// someone decides otherwise, so a receipt never claims a pass by default).
    pub fn new(id: String, node: String, kind: NodeKind, slug: String) -> NodeReceipt {
        NodeReceipt {
            schema: RECEIPT_SCHEMA,
            id,
            node,
            kind,
            slug,
            cell: BTreeMap::new(),
            tags: Vec::new(),
            argv: Vec::new(),
            shell: false,
            cwd: String::new(),
            env: BTreeMap::new(),
            binaries: Vec::new(),
            produces: Vec::new(),
            input_files: Vec::new(),
            inputs: String::new(),
            code: String::new(),
            fingerprints: Vec::new(),
            gpus: Vec::new(),
            attempts: Vec::new(),
            verdict: Verdict::Error,
            expect: Expect::Pass,
            expect_fail: Vec::new(),
            info: Vec::new(),
            reason: None,
            checks: Vec::new(),
            doors: None,
            artifacts: Vec::new(),
            compare: None,
            seconds: 0.0,
            slurm_jobs: Vec::new(),
            lease_wait_seconds: None,
        }
    }

    /// The check rows at `warn`: what passed but wants a reader's eye.
    pub fn warnings(&self) -> Vec<&CheckRow> {
        self.checks
            .iter()
            .filter(|c| c.status == crate::gate::checks::CheckStatus::Warn)
            .collect()
    }

    /// One line on this receipt's warn rows (`None` when it has none).
    pub fn warning_line(&self) -> Option<String> {
        warning_line(&self.warnings())
    }

    /// The folder of the last attempt, relative to the node folder.
    pub fn last_attempt_dir(&self) -> Option<String> {
        self.attempts.last().map(|a| attempt_dir_name(a.n))
    }
}

/// `warn: <check>: <message>`, with how many more rows warn, for the rows given; `None` for
/// none. Shown wherever verdicts are, so a `warn` row is never seen only by `show`.
pub fn warning_line(rows: &[&CheckRow]) -> Option<String> {
    let first = rows.first()?;
    let message = first
        .message
        .as_deref()
        .map(|m| format!(": {m}"))
        .unwrap_or_default();
    let more = match rows.len() {
        1 => String::new(),
        n => format!(" (and {} more warn rows)", n - 1),
    };
    Some(format!("warn: {}{message}{more}", first.check))
}

/// `attempt-<n>`.
pub fn attempt_dir_name(n: u32) -> String {
    format!("attempt-{n}")
}

/// One row of the node index in `run.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodeIndexEntry {
    pub id: String,
    pub kind: NodeKind,
    /// Folder under `nodes/`; `None` for nodes the run did not write (not selected by
    /// `--filter`).
    pub slug: Option<String>,
    pub verdict: Verdict,
    pub seconds: f64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The receipt was not measured by this run but carried forward from an earlier run of
    /// the same manifest and commit (`--filter`, `--rerun-failed`, `--resume`); it stays in
    /// that run's tree and is read from there.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub carried: Option<Carried>,
    /// How many check rows of the cell are at `warn`; absent when none.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub warns: u32,
    /// The first of them, as [`warning_line`] says it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub warning: Option<String>,
}

/// For `skip_serializing_if`: a count that is zero is left out.
pub(crate) fn is_zero<T: Default + PartialEq>(n: &T) -> bool {
    *n == T::default()
}

/// Where a carried receipt lives: the run that measured it. Runs of one manifest and commit
/// are sibling folders, so the path is always `../<run id>`, or `..` for a tree of the
/// layout before run ids (whose folder holds the newer runs).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Carried {
    /// The id of the run that measured it; `None` for a tree of the old layout.
    pub run: Option<String>,
    /// That run's folder relative to this run's folder.
    pub from: String,
}

impl Carried {
    /// A receipt carried from the run `run` (its id, `None` for the old layout).
    pub fn from_run(run: Option<&str>) -> Carried {
        Carried {
            run: run.map(str::to_string),
            from: match run {
                Some(id) => format!("../{id}"),
                None => "..".to_string(),
            },
        }
    }

    /// The source run's folder, from the folder of the run that carries the receipt; `None`
    /// when `from` is anything but `..` or `../<plain name>` (an edited file must not lead
    /// outside the manifest's folder).
    pub fn source_dir(&self, run_dir: &Path) -> Option<std::path::PathBuf> {
        let parent = run_dir.parent()?;
        match self.from.strip_prefix("../") {
            None if self.from == ".." => Some(parent.to_path_buf()),
            Some(id) if load::is_plain_name(id) => Some(parent.join(id)),
            _ => None,
        }
    }

    /// How the source run is named to a user.
    pub fn label(&self) -> String {
        self.run
            .clone()
            .unwrap_or_else(|| "the tree of the layout before run ids".to_string())
    }
}

/// `run.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunReceipt {
    pub schema: u32,
    /// The run's id, also its folder name (`<commit>/<manifest>/<id>/`); absent in trees of
    /// the layout before run ids, whose `run.json` sits in `<commit>/<manifest>/` itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_id: Option<String>,
    /// The earlier run whose receipts this one carried forward, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub carried_from: Option<String>,
    pub name: String,
    pub manifest: FileDigest,
    pub env_matrices: Vec<FileDigest>,
    pub commit: String,
    pub commit_sha: Option<String>,
    /// The commit's subject line; absent outside git, for a `--commit` label, and in runs
    /// written before it existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub commit_subject: Option<String>,
    pub dirty: bool,
    /// The code identity every non-hermetic cell's inputs digest holds
    /// ([`crate::receipt::commit::CommitId::code`]); absent where git could not name the code.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<String>,
    /// The `[fingerprints]` taken before the run started.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub fingerprints: Vec<crate::plan::fingerprint::Fingerprint>,
    pub host: String,
    pub orchestrator_version: String,
    /// The GPU inventory of the run (NVML or fake), driver and CUDA versions included.
    pub inventory: Value,
    pub cpu_slots: usize,
    pub filters: Vec<String>,
    pub resumed: bool,
    /// The `--var` overrides the run was given (none: the manifest's own `[vars]`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub vars: BTreeMap<String, String>,
    /// The run was `run --rerun-failed`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub rerun_failed: bool,
    pub start: String,
    /// `None` while the run is in progress (or when it was killed before it could finish).
    pub end: Option<String>,
    pub seconds: Option<f64>,
    pub interrupted: bool,
    pub counts: BTreeMap<Verdict, usize>,
    /// Why the run failed although every node ended as expected: cells skipped for lack of
    /// resources while a GPU requirement was in force. Absent otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unmet: Option<String>,
    /// Where the run found the receipt tree's disk full; the run stopped there. Absent
    /// otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk_full: Option<String>,
    /// GPUs left out of the run by `--exclude-gpu`, by UUID. Absent when none were.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub excluded_gpus: Vec<String>,
    /// GPUs that faulted during a cell's attempt and took no new cells for the rest of the
    /// run ([`crate::machine::health`]). Absent when none did.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub quarantined_gpus: Vec<Quarantined>,
    /// `pass` when every node ended as expected (skipped included) and no requirement went
    /// unmet, else `fail`; `running` while in progress.
    pub verdict: String,
    pub nodes: Vec<NodeIndexEntry>,
}

impl RunReceipt {
    /// How many of the run's cells were carried from an earlier run.
    pub fn carried_count(&self) -> usize {
        self.nodes.iter().filter(|n| n.carried.is_some()).count()
    }

    /// The models of the run's GPUs, in inventory order (`?` for an entry without a name).
    pub fn gpu_names(&self) -> Vec<String> {
        self.inventory
            .get("gpus")
            .and_then(Value::as_array)
            .map(|gs| {
                gs.iter()
                    .map(|g| {
                        g.get("name")
                            .and_then(Value::as_str)
                            .unwrap_or("?")
                            .to_string()
                    })
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The header of a run that starts now: what it runs, on which commit, host and GPUs,
    /// with nothing finished yet (`verdict` is `running`).
    pub fn begin(
        plan: &crate::plan::Plan,
        commit: &crate::receipt::commit::CommitId,
        inventory: &crate::machine::gpus::Inventory,
        cpu_slots: usize,
        filters: &[String],
        resumed: bool,
    ) -> RunReceipt {
        RunReceipt {
            schema: RUN_SCHEMA,
            run_id: None,
            carried_from: None,
            name: plan.name.clone(),
            manifest: source_digest(&plan.manifest),
            env_matrices: plan.env_matrices.iter().map(source_digest).collect(),
            commit: commit.id.clone(),
            commit_sha: commit.sha.clone(),
            commit_subject: commit.subject.clone(),
            dirty: commit.dirty,
            code: commit.code.clone(),
            fingerprints: Vec::new(),
            host: hostname(),
            orchestrator_version: env!("CARGO_PKG_VERSION").to_string(),
            inventory: serde_json::to_value(inventory).unwrap_or_default(),
            cpu_slots,
            filters: filters.to_vec(),
            resumed,
            vars: BTreeMap::new(),
            rerun_failed: false,
            start: humantime::format_rfc3339_millis(std::time::SystemTime::now()).to_string(),
            end: None,
            seconds: None,
            interrupted: false,
            unmet: None,
            disk_full: None,
            excluded_gpus: Vec::new(),
            quarantined_gpus: Vec::new(),
            counts: BTreeMap::new(),
            verdict: "running".to_string(),
            nodes: Vec::new(),
        }
    }
}

fn source_digest(s: &crate::plan::SourceFile) -> FileDigest {
    let bytes = std::fs::metadata(&s.path).map(|m| m.len()).unwrap_or(0);
    FileDigest {
        path: s.path.to_string_lossy().into_owned(),
        bytes,
        sha256: s.sha256.clone(),
    }
}

fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: the buffer is valid for its length; gethostname writes at most that many bytes.
    let r = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if r != 0 {
        return "unknown".to_string();
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

/// Lower-case hex and sha256 helpers live one layer down, shared with `commit` and
/// `fingerprint`; receipts name them here as they always have.
pub use crate::words::digest::{hex, sha256_hex};

/// sha256 and size of a file, streamed.
///
/// Only a regular file is read (a link to one counts): the file is opened without blocking
/// and checked with `fstat`, so a FIFO or a device swapped in where a file was can neither
/// hang the run nor feed it endless bytes.
pub fn sha256_file(path: &Path) -> std::io::Result<(u64, String)> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)?;
    if !file.metadata()?.is_file() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("{} is not a regular file", path.display()),
        ));
    }
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 16];
    let mut total = 0u64;
    loop {
        let n = file.read(&mut buf)?;
        if n == 0 {
            break;
        }
        total += n as u64;
        hasher.update(&buf[..n]);
    }
    Ok((total, hex(&hasher.finalize())))
}

/// The folder name of a cell under `nodes/`: the id made filesystem-safe (`[A-Za-z0-9._-]`,
/// anything else `_`, leading dots `_`, at most 64 characters) plus `-` and 8 hex
/// characters of sha256(id). The hash keeps distinct ids distinct after sanitising, and
/// since the name always ends in it, it is never `.` or `..` and never holds a separator:
/// it can never leave the tree.
pub fn slug(id: &str) -> String {
    const MAX: usize = 64;
    let mut safe: String = id
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                c
            } else {
                '_'
            }
        })
        .take(MAX)
        .collect();
    let dots = safe.chars().take_while(|c| *c == '.').count();
    safe.replace_range(..dots, &"_".repeat(dots));
    if safe.is_empty() {
        safe.push('_');
    }
    format!("{safe}-{}", &sha256_hex(id.as_bytes())[..8])
}

/// Writes a file atomically: a temporary file in the same folder, then a rename, so a
/// reader (or a run killed half-way) sees the old content or the new, never a torn file.
/// No fsync: a receipt tree is a record of a run on a live machine, and a power loss mid-run
/// is recovered by `run --resume`, which re-runs any node whose receipt is missing.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), ReceiptError> {
    let dir = path
        .parent()
        .ok_or_else(|| ReceiptError::new(path, Kind::NoParent))?;
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = dir.join(format!(".{name}.tmp.{}", std::process::id()));
    // A write that fails (a full disk) leaves no half-written temporary file behind.
    std::fs::write(&tmp, bytes).map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        ReceiptError::new(&tmp, Kind::Write(e))
    })?;
    std::fs::rename(&tmp, path).map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        ReceiptError::new(path, Kind::Rename(e))
    })
}

/// Serialises a record as pretty JSON with a trailing newline and writes it atomically.
pub fn write_json<T: Serialize>(path: &Path, value: &T) -> Result<(), ReceiptError> {
    let mut text = serde_json::to_vec_pretty(value)
        .map_err(|e| ReceiptError::new(path, Kind::Serialise(e)))?;
    text.push(b'\n');
    write_atomic(path, &text)
}

/// Reads a node receipt; `None` when absent, an error naming the file when unreadable.
pub fn read_node_receipt(path: &Path) -> Result<Option<NodeReceipt>, ReceiptError> {
    read_json(path)
}

/// Reads a JSON record; `None` when absent.
pub fn read_json<T: for<'de> Deserialize<'de>>(path: &Path) -> Result<Option<T>, ReceiptError> {
    use std::io::Read as _;
    use std::os::unix::fs::OpenOptionsExt;
    // Opened without blocking and read only when it is a plain file: a FIFO planted at a
    // receipt's name must not hang every command that lists runs.
    let mut file = match std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
    {
        Ok(f) => f,
        // A packed run keeps its cells' files in its archive.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return match crate::gate::packed::read(path, crate::gate::packed::MAX_MEMBER) {
                Ok(Some(crate::gate::packed::Member::Bytes(bytes))) => {
                    serde_json::from_slice(&bytes)
                        .map(Some)
                        .map_err(|e| ReceiptError::new(path, Kind::Format(e)))
                }
                Ok(Some(_)) => Err(ReceiptError::new(
                    path,
                    Kind::Read(std::io::Error::other("not a plain file")),
                )),
                Ok(None) => Ok(None),
                Err(e) => Err(ReceiptError::new(path, Kind::Read(e))),
            };
        }
        Err(e) => return Err(ReceiptError::new(path, Kind::Read(e))),
    };
    match file.metadata() {
        Ok(m) if m.is_file() => {}
        Ok(_) => {
            return Err(ReceiptError::new(
                path,
                Kind::Read(std::io::Error::other("not a plain file")),
            ));
        }
        Err(e) => return Err(ReceiptError::new(path, Kind::Read(e))),
    }
    let mut bytes = Vec::new();
    file.read_to_end(&mut bytes)
        .map_err(|e| ReceiptError::new(path, Kind::Read(e)))?;
    serde_json::from_slice(&bytes)
        .map(Some)
        .map_err(|e| ReceiptError::new(path, Kind::Format(e)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slugs_are_safe_and_distinct() {
        for id in [
            "../../x",
            "..",
            ".",
            "/etc/passwd",
            "a/b",
            "",
            "dec[batch=4,MEMRA_PP_DEVICES=0,1]",
        ] {
            let s = slug(id);
            assert!(!s.contains('/') && !s.starts_with('.'), "{id:?} -> {s}");
            assert!(
                s.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "._-".contains(c)),
                "{s}"
            );
            assert_eq!(Path::new(&s).components().count(), 1);
        }
        assert_eq!(
            slug("../../x"),
            format!("___.._x-{}", &sha256_hex(b"../../x")[..8])
        );
        assert_ne!(slug("a/b"), slug("a_b"));
        assert!(slug(&"x".repeat(500)).len() <= 64 + 9);
    }

    #[test]
    fn atomic_write_replaces_and_leaves_no_temp() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("r.json");
        write_json(&p, &serde_json::json!({"a": 1})).unwrap();
        write_json(&p, &serde_json::json!({"a": 2})).unwrap();
        let v: Option<Value> = read_json(&p).unwrap();
        assert_eq!(v.unwrap()["a"], 2);
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
        let missing: Option<Value> = read_json(&dir.path().join("none.json")).unwrap();
        assert!(missing.is_none());
    }
}
