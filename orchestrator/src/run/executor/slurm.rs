//! The Slurm executor: each placed cell becomes one batch job (`sbatch --parsable`) whose
//! script runs the hidden `memra-orch exec-node` entry point on the compute node, so a
//! cell on the cluster goes through the same runner, isolation and gate protocol as a
//! local one. exec-node writes its receipt to a file of the job's own in the spool folder;
//! the run files it as the cell's `receipt.json` in the shared receipt tree.
//!
//! It owns the translation of a cell into `sbatch` arguments (GPUs, time limit, CPUs,
//! memory, partition, account, extra arguments), the job files in a spool folder next to
//! the receipt tree, polling job state through `scontrol` (accounting may be off, so never
//! `sacct`), turning a job that ended without a receipt into a verdict, resubmitting jobs
//! the cluster lost (node failure, preemption) within the cell's `retries`, and `scancel`
//! on interrupt. It does not decide when a cell is ready (the run loop does) and does not
//! judge gates (exec-node does, through the local executor).

use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::{Duration, Instant};

use super::{CellJob, CellNote, Executor, SlurmError};
use crate::receipt::{NodeReceipt, read_node_receipt};
use crate::run::events::JobNote;
use crate::words::verdict::Verdict;

/// How long a job may keep running after the run was interrupted before the executor stops
/// waiting for its receipt (Slurm's own KillWait is 30 s by default).
const CANCEL_WAIT: Duration = Duration::from_secs(60);
/// How long a receipt may take to become visible on a shared filesystem after the job that
/// wrote it completed (NFS attribute caches hold stale entries for a few seconds).
const RECEIPT_WAIT: Duration = Duration::from_secs(10);
/// Time added to the sum of the attempts' timeouts for the job limit: starting the binary,
/// hashing artifacts and writing the receipt.
const JOB_SLACK: Duration = Duration::from_secs(60);

/// Where and how jobs are submitted.
#[derive(Debug, Clone)]
pub struct SlurmOptions {
    pub partition: Option<String>,
    pub account: Option<String>,
    /// Passed to `sbatch` as they are, after the executor's own arguments (so they win).
    pub extra_args: Vec<String>,
    /// Job files, batch scripts and Slurm's output files; must be on the filesystem the
    /// compute nodes share with this machine.
    pub spool: PathBuf,
    /// The `memra-orch` binary the job runs (shared filesystem).
    pub exe: PathBuf,
    /// Grace between SIGTERM and SIGKILL inside the job.
    pub grace: Duration,
    /// Prefix of every job name (`memra:<manifest>`), so `squeue -n` finds a run's jobs.
    pub job_name: String,
    /// Between two `scontrol` polls of one job.
    pub poll: Duration,
    /// CPU and memory requests per cell id, from the manifest.
    pub resources: HashMap<String, Resources>,
}

/// A cell's `cpus` and `memory` (bytes), when the manifest states them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Resources {
    pub cpus: Option<u32>,
    pub memory: Option<u64>,
}

/// A job's state as `scontrol show job` reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobState {
    pub state: String,
    pub reason: String,
}

/// How a job that ended without a receipt is judged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ending {
    /// The cluster lost the job (node failure, preemption, boot failure): resubmit within
    /// `retries`.
    Lost,
    /// A verdict and why.
    Verdict(Verdict, String),
}

/// Runs cells as Slurm batch jobs.
pub struct SlurmExecutor {
    opts: SlurmOptions,
    cancelled: AtomicBool,
    cancel_calls: AtomicU32,
    /// Jobs submitted and not yet seen to end. Held while submitting, so a cancel either
    /// sees the new id or stops the submission.
    active: Mutex<BTreeMap<String, String>>,
    /// Serialises appends to the job journal.
    journal: Mutex<()>,
    snapshot: Mutex<Snapshot>,
}

/// The journal of a run's jobs in the spool folder, one JSON object per line.
pub const JOBS_FILE: &str = "jobs.jsonl";

impl std::fmt::Debug for SlurmExecutor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SlurmExecutor")
            .field("opts", &self.opts)
            .finish_non_exhaustive()
    }
}

impl SlurmExecutor {
    pub fn new(opts: SlurmOptions) -> SlurmExecutor {
        SlurmExecutor {
            opts,
            cancelled: AtomicBool::new(false),
            cancel_calls: AtomicU32::new(0),
            active: Mutex::new(BTreeMap::new()),
            journal: Mutex::new(()),
            snapshot: Mutex::new(Snapshot::default()),
        }
    }

    /// Appends a line to `jobs.jsonl` in the spool folder: which Slurm job ran which cell,
    /// in which try, and how it ended. The receipt tree keeps the shape of a local run, so
    /// the job ids live next to it, one file per run; a failure to write is reported and
    /// changes no verdict.
    fn record(&self, job: &CellJob, try_n: u32, id: &str, state: &str) {
        let line = serde_json::json!({
            "cell": job.id,
            "slug": job.slug,
            "try": try_n,
            "job": id,
            "state": state,
        });
        let path = self.opts.spool.join(JOBS_FILE);
        let _guard = self.journal.lock().unwrap_or_else(|p| p.into_inner());
        let written = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .and_then(|mut f| writeln!(f, "{line}"));
        if let Err(e) = written {
            eprintln!(
                "memra-orch: {}: cannot record slurm job {id} of {}: {e}",
                path.display(),
                job.id
            );
        }
    }

    /// Writes the job file and batch script (exec-node writing its receipt to `receipt`) and
    /// submits it; returns the job id.
    fn submit(&self, job: &CellJob, try_n: u32, receipt: &Path) -> Result<String, SlurmError> {
        let stem = format!("{}.{try_n}", job.slug);
        let job_file = self.opts.spool.join(format!("{stem}.json"));
        let script = self.opts.spool.join(format!("{stem}.sh"));
        let io = |p: &Path, error: std::io::Error| SlurmError::WriteJobFile {
            path: p.to_path_buf(),
            error,
        };
        std::fs::create_dir_all(&self.opts.spool).map_err(|e| io(&self.opts.spool, e))?;
        // The job finds its GPUs in what Slurm exports; the submit host's slot numbers mean
        // nothing on the compute node.
        let mut remote = job.clone();
        remote.gpus.clear();
        remote.visible_devices.clear();
        // Artifacts on the shared file system stay as written (docs/receipts.md).
        remote.store = None;
        let bytes =
            serde_json::to_vec_pretty(&remote).map_err(|error| SlurmError::SerialiseJob {
                node: job.id.clone(),
                error,
            })?;
        std::fs::write(&job_file, bytes).map_err(|e| io(&job_file, e))?;
        std::fs::write(
            &script,
            batch_script(&self.opts.exe, self.opts.grace, &job_file, receipt),
        )
        .map_err(|e| io(&script, e))?;
        let gpus = job.gpus.len() as u32;
        let res = self
            .opts
            .resources
            .get(&job.id)
            .copied()
            .unwrap_or_default();
        let args = sbatch_args(&self.opts, job, gpus, res, &stem, &script);
        let mut active = self.active.lock().unwrap_or_else(|p| p.into_inner());
        if self.cancelled.load(Ordering::SeqCst) {
            return Err(SlurmError::Cancelled);
        }
        let out = Command::new("sbatch")
            .args(&args)
            .output()
            .map_err(SlurmError::RunSbatch)?;
        if !out.status.success() {
            return Err(SlurmError::Sbatch {
                stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
                status: out.status,
                args,
            });
        }
        let stdout = String::from_utf8_lossy(&out.stdout);
        let id = parse_parsable(&stdout).ok_or_else(|| SlurmError::NotAJobId {
            stdout: stdout.clone().into_owned(),
        })?;
        active.insert(id.clone(), job.id.clone());
        Ok(id)
    }

    /// Polls a job until it ends; returns its last state (`None` when Slurm forgot it).
    fn wait(&self, job: &CellJob, id: &str, on_note: &mut dyn FnMut(CellNote)) -> Option<JobState> {
        let mut last = String::new();
        let mut cancelled_at: Option<Instant> = None;
        let mut failing_since: Option<Instant> = None;
        loop {
            let state = match self.state_of(id) {
                Query::Known(s) => s,
                Query::Forgotten => return None,
                Query::Failed(e) => {
                    // slurmctld restarting or overloaded: keep asking for a while rather
                    // than judge a job that may still be running.
                    let t = *failing_since.get_or_insert_with(Instant::now);
                    if t.elapsed() > QUERY_PATIENCE {
                        eprintln!("memra-orch: giving up on slurm job {id} of {}: {e}", job.id);
                        return None;
                    }
                    std::thread::sleep(self.opts.poll);
                    continue;
                }
            };
            failing_since = None;
            let shown = match state.state.as_str() {
                "PENDING" | "CONFIGURING" => "pending",
                "RUNNING" | "COMPLETING" => "running",
                other => other,
            };
            if shown != last {
                last = shown.to_string();
                let reason = if shown == "pending" {
                    state.reason.as_str()
                } else {
                    ""
                };
                on_note(job_note(id, shown, reason));
            }
            if is_final(&state.state) {
                return Some(state);
            }
            if self.cancelled.load(Ordering::SeqCst) {
                let t = *cancelled_at.get_or_insert_with(Instant::now);
                if t.elapsed() > CANCEL_WAIT {
                    return Some(state);
                }
            }
            std::thread::sleep(self.opts.poll);
        }
    }

    /// A job's state from one `squeue` call for every active job, refreshed at most once
    /// per poll interval whatever the number of jobs, so a large run costs slurmctld one
    /// request per interval; a job the snapshot lacks (just submitted, or squeue failed)
    /// is asked about with `scontrol`.
    fn state_of(&self, id: &str) -> Query {
        let mut snap = self.snapshot.lock().unwrap_or_else(|p| p.into_inner());
        if snap.at.is_none_or(|t| t.elapsed() >= self.opts.poll) {
            let ids: Vec<String> = self
                .active
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .keys()
                .cloned()
                .collect();
            snap.states = squeue(&ids).unwrap_or_default();
            snap.at = Some(Instant::now());
        }
        if let Some(s) = snap.states.get(id) {
            return Query::Known(s.clone());
        }
        drop(snap);
        query(id)
    }
}

/// The last `squeue` snapshot of the active jobs.
#[derive(Debug, Default)]
struct Snapshot {
    at: Option<Instant>,
    states: HashMap<String, JobState>,
}

/// What asking Slurm about a job gave.
#[derive(Debug)]
enum Query {
    Known(JobState),
    /// Slurm no longer knows the job (it ended longer than MinJobAge ago).
    Forgotten,
    /// The command failed; the job may be fine.
    Failed(SlurmError),
}

fn job_note(job_id: &str, state: &str, reason: &str) -> CellNote {
    CellNote::Job(JobNote {
        job_id: job_id.to_string(),
        state: state.to_string(),
        reason: reason.to_string(),
    })
}

/// How long Slurm may fail to answer about a job before the executor stops waiting.
const QUERY_PATIENCE: Duration = Duration::from_secs(300);

impl Executor for SlurmExecutor {
    fn execute(&self, job: &CellJob, on_note: &mut dyn FnMut(CellNote)) -> NodeReceipt {
        let mut jobs = Vec::new();
        let mut r = self.execute_jobs(job, on_note, &mut jobs);
        r.slurm_jobs = jobs;
        r
    }

    fn cancel_all(&self) {
        self.cancelled.store(true, Ordering::SeqCst);
        let second = self.cancel_calls.fetch_add(1, Ordering::SeqCst) > 0;
        let ids: Vec<String> = self
            .active
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .keys()
            .cloned()
            .collect();
        if ids.is_empty() {
            return;
        }
        // The first cancel removes pending jobs and signals only the batch step of running
        // ones, which is exec-node itself: it stops its gate within the grace and writes a
        // `cancelled` receipt. A plain scancel would SIGTERM the gate directly too, and the
        // gate would end `crash` before exec-node knew the run was interrupted. A second
        // cancel has Slurm end what is left at once.
        let calls: Vec<Vec<&str>> = if second {
            vec![vec![]]
        } else {
            vec![
                vec!["--state=PENDING"],
                vec!["--state=RUNNING", "--batch", "--signal=TERM"],
            ]
        };
        for flags in calls {
            match Command::new("scancel").args(&flags).args(&ids).output() {
                Ok(out) if out.status.success() => {}
                Ok(out) => {
                    // A job that ended (or was just cancelled by the call before) between
                    // listing and cancelling is no failure.
                    let text = String::from_utf8_lossy(&out.stderr);
                    let real: Vec<&str> = text
                        .lines()
                        .filter(|l| {
                            !l.contains("Invalid job id")
                                && !l.contains("already completing or completed")
                        })
                        .collect();
                    if !real.is_empty() {
                        eprintln!(
                            "memra-orch: scancel {} {} failed: {}; cancel them by hand",
                            flags.join(" "),
                            ids.join(" "),
                            real.join("; ")
                        );
                    }
                }
                Err(e) => eprintln!(
                    "memra-orch: cannot run scancel ({e}); cancel jobs {} by hand",
                    ids.join(" ")
                ),
            }
        }
    }
}

impl SlurmExecutor {
    /// Submits the cell until it ends (resubmitting jobs the cluster lost, within
    /// `retries`), collecting every job id and end state into `jobs`.
    fn execute_jobs(
        &self,
        job: &CellJob,
        on_note: &mut dyn FnMut(CellNote),
        jobs: &mut Vec<String>,
    ) -> NodeReceipt {
        let mut lost: Vec<String> = Vec::new();
        let mut try_n = 0;
        loop {
            try_n += 1;
            // Each job's exec-node writes a receipt of its own: a lost job, still dying on its
            // node, may write after the run has judged it and moved on, and must not
            // overwrite what the run files for the cell.
            let receipt_path = job_receipt(&self.opts.spool, job, try_n);
            let fail = |verdict: Verdict, reason: String| {
                let mut r = job.receipt();
                r.gpus.clear();
                r.verdict = verdict;
                r.reason = Some(reason);
                r
            };
            if self.cancelled.load(Ordering::SeqCst) {
                return fail(Verdict::Cancelled, SlurmError::Cancelled.to_string());
            }
            // A receipt left by an earlier run's job of this try must not be taken for this
            // job's.
            if let Err(e) = std::fs::remove_file(&receipt_path)
                && e.kind() != std::io::ErrorKind::NotFound
            {
                let e = SlurmError::RemoveOldReceipt {
                    path: receipt_path,
                    error: e,
                };
                return fail(Verdict::Error, e.to_string());
            }
            let id = match self.submit(job, try_n, &receipt_path) {
                Ok(id) => id,
                Err(e @ SlurmError::Cancelled) => return fail(Verdict::Cancelled, e.to_string()),
                Err(e) => return fail(Verdict::Error, e.to_string()),
            };
            on_note(job_note(&id, "submitted", ""));
            let end = self.wait(job, &id, on_note);
            self.active
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&id);
            let state = end.as_ref().map_or("gone", |s| s.state.as_str());
            self.record(job, try_n, &id, state);
            jobs.push(format!("{id} {state}"));
            // A lost job's exec-node may still have written a receipt as Slurm signalled it
            // (preemption sends SIGTERM first); what it recorded while dying is no verdict.
            let lost_now = end.as_ref().is_some_and(|s| is_lost(&s.state));
            if !lost_now && let Some(mut r) = read_receipt(&receipt_path, state == "COMPLETED") {
                for a in &r.attempts {
                    on_note(CellNote::Attempt(a.clone()));
                }
                if !lost.is_empty() {
                    let note = format!("after Slurm lost {}", lost.join(", "));
                    r.reason = Some(match r.reason.take() {
                        Some(why) => format!("{why} ({note})"),
                        None => note,
                    });
                }
                // `seconds` stays exec-node's: the attempts' wall time, not time in the queue,
                // so durations and ETAs compare with local runs.
                return r;
            }
            let output = self.opts.spool.join(format!("{}.{try_n}.out", job.slug));
            let ending = judge(
                &id,
                end.as_ref(),
                self.cancelled.load(Ordering::SeqCst),
                &output,
            );
            match ending {
                Ending::Lost if (lost.len() as u32) < job.retries => {
                    lost.push(format!("job {id} ({state})"));
                }
                Ending::Lost => {
                    lost.push(format!("job {id} ({state})"));
                    return fail(
                        Verdict::Error,
                        format!(
                            "the cluster lost the job before the node finished: {}; \
                             raise `retries` or check the partition's nodes (sinfo -R)",
                            lost.join(", ")
                        ),
                    );
                }
                Ending::Verdict(v, why) => return fail(v, why),
            }
        }
    }
}

/// A receipt exec-node wrote, if any; waits a little for a shared filesystem to show it
/// when the job completed.
fn read_receipt(path: &Path, completed: bool) -> Option<NodeReceipt> {
    let deadline = Instant::now()
        + if completed {
            RECEIPT_WAIT
        } else {
            Duration::ZERO
        };
    loop {
        if let Ok(Some(r)) = read_node_receipt(path) {
            return Some(r);
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Where try `try_n` of a cell's job writes its receipt: in the spool folder, next to the
/// job file.
fn job_receipt(spool: &Path, job: &CellJob, try_n: u32) -> PathBuf {
    spool.join(format!("{}.{try_n}.receipt.json", job.slug))
}

/// The batch script: nothing but the exec-node call, so the cell's environment is built
/// by the same code as locally.
pub fn batch_script(exe: &Path, grace: Duration, job_file: &Path, receipt: &Path) -> String {
    format!(
        "#!/bin/sh\n# Written by memra-orch: runs one cell through exec-node.\nexec {} exec-node --grace {} --gpus-from-env --receipt {} {}\n",
        shell_quote(&exe.to_string_lossy()),
        humantime::format_duration(grace),
        shell_quote(&receipt.to_string_lossy()),
        shell_quote(&job_file.to_string_lossy()),
    )
}

fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// The `sbatch` arguments for a cell: GPUs, a time limit covering every attempt, CPUs and
/// memory when stated, partition and account, then the user's extra arguments.
pub fn sbatch_args(
    opts: &SlurmOptions,
    job: &CellJob,
    gpus: u32,
    res: Resources,
    stem: &str,
    script: &Path,
) -> Vec<String> {
    let mut a = vec![
        "--parsable".to_string(),
        format!("--job-name={}:{}", opts.job_name, job.id),
        format!(
            "--output={}",
            opts.spool.join(format!("{stem}.out")).display()
        ),
        format!("--chdir={}", job.cwd.display()),
        // A requeued job would run the cell again behind the run's back; resubmitting is
        // the executor's decision, within `retries`.
        "--no-requeue".to_string(),
        format!("--time={}", time_limit_minutes(job, opts.grace)),
    ];
    if gpus > 0 {
        a.push(format!("--gres=gpu:{gpus}"));
    }
    if let Some(c) = res.cpus {
        a.push(format!("--cpus-per-task={c}"));
    }
    if let Some(m) = res.memory {
        a.push(format!("--mem={}M", m.div_ceil(1 << 20).max(1)));
    }
    if let Some(p) = &opts.partition {
        a.push(format!("--partition={p}"));
    }
    if let Some(acc) = &opts.account {
        a.push(format!("--account={acc}"));
    }
    a.extend(opts.extra_args.iter().cloned());
    a.push(script.to_string_lossy().into_owned());
    a
}

/// Minutes (Slurm's unit, rounded up) covering every attempt the cell may make at its full
/// timeout plus the grace, and some slack for the runner itself.
pub fn time_limit_minutes(job: &CellJob, grace: Duration) -> u64 {
    let attempts = u64::from(job.reps.max(1)) * (u64::from(job.retries) + 1);
    let per = job.timeout + grace;
    let total = per.as_secs_f64() * attempts as f64 + JOB_SLACK.as_secs_f64();
    ((total / 60.0).ceil() as u64).max(1)
}

/// The job id of `sbatch --parsable` output (`123` or `123;cluster`).
pub fn parse_parsable(out: &str) -> Option<String> {
    let id = out.trim().split(';').next()?.trim();
    (!id.is_empty() && id.chars().all(|c| c.is_ascii_digit() || c == '_')).then(|| id.to_string())
}

/// `JobState` and `Reason` from one line of `scontrol show job -o`.
pub fn parse_scontrol(line: &str) -> Option<JobState> {
    let mut state = None;
    let mut reason = String::new();
    for field in line.split_whitespace() {
        if let Some(v) = field.strip_prefix("JobState=") {
            state = Some(v.to_string());
        } else if let Some(v) = field.strip_prefix("Reason=") {
            reason = v.to_string();
        }
    }
    Some(JobState {
        state: state?,
        reason,
    })
}

/// One job's state through `scontrol show job` (which also knows jobs that ended within
/// MinJobAge, without accounting).
fn query(id: &str) -> Query {
    let out = match Command::new("scontrol")
        .args(["show", "job", "-o", id])
        .output()
    {
        Ok(out) => out,
        Err(e) => return Query::Failed(SlurmError::RunScontrol(e)),
    };
    let stderr = String::from_utf8_lossy(&out.stderr);
    if stderr.contains("Invalid job id") {
        return Query::Forgotten;
    }
    if !out.status.success() {
        return Query::Failed(SlurmError::Scontrol {
            id: id.to_string(),
            stderr: stderr.trim().to_string(),
        });
    }
    match parse_scontrol(&String::from_utf8_lossy(&out.stdout)) {
        Some(s) => Query::Known(s),
        None => Query::Failed(SlurmError::NoJobState { id: id.to_string() }),
    }
}

/// States of the given jobs through one `squeue` call (`--states=all` keeps jobs that just
/// ended in the listing); `None` when squeue fails (one unknown id fails the whole call).
fn squeue(ids: &[String]) -> Option<HashMap<String, JobState>> {
    if ids.is_empty() {
        return Some(HashMap::new());
    }
    let out = Command::new("squeue")
        .args(["-h", "--states=all", "-o", "%i %T %r", "-j", &ids.join(",")])
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| parse_squeue(&String::from_utf8_lossy(&out.stdout)))
}

/// Lines of `squeue -h -o "%i %T %r"`: job id, state, reason.
pub fn parse_squeue(text: &str) -> HashMap<String, JobState> {
    text.lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let id = f.next()?.to_string();
            let state = f.next()?.to_string();
            let reason = f.collect::<Vec<_>>().join(" ");
            Some((id, JobState { state, reason }))
        })
        .collect()
}

/// Whether a Slurm job state is one a job does not leave.
pub fn is_final(state: &str) -> bool {
    !matches!(
        state,
        "PENDING"
            | "CONFIGURING"
            | "RUNNING"
            | "COMPLETING"
            | "SUSPENDED"
            | "REQUEUED"
            | "REQUEUE_HOLD"
            | "REQUEUE_FED"
            | "RESIZING"
            | "SIGNALING"
            | "STAGE_OUT"
            | "STOPPED"
    )
}

/// Whether a final state means the cluster lost the job (not the cell's doing).
pub fn is_lost(state: &str) -> bool {
    matches!(state, "NODE_FAIL" | "PREEMPTED" | "BOOT_FAIL")
}

/// Judges a job that ended without writing a receipt (or was lost, whatever it wrote).
pub fn judge(id: &str, end: Option<&JobState>, we_cancelled: bool, output: &Path) -> Ending {
    let tail = || {
        let text = std::fs::read_to_string(output).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        let from = lines.len().saturating_sub(5);
        if lines.is_empty() {
            format!("{} is empty or missing", output.display())
        } else {
            format!("{}: {}", output.display(), lines[from..].join(" | "))
        }
    };
    let Some(end) = end else {
        return Ending::Verdict(
            Verdict::Error,
            format!(
                "slurm job {id} ended without a receipt and Slurm no longer knows it; see {}",
                tail()
            ),
        );
    };
    match end.state.as_str() {
        s if is_lost(s) => Ending::Lost,
        _ if we_cancelled => Ending::Verdict(
            Verdict::Cancelled,
            format!(
                "cancelled: the run was interrupted (slurm job {id} {})",
                end.state
            ),
        ),
        "CANCELLED" => Ending::Verdict(
            Verdict::Error,
            format!("slurm job {id} was cancelled outside this run (scancel); run it again"),
        ),
        "TIMEOUT" | "DEADLINE" => Ending::Verdict(
            Verdict::Timeout,
            format!(
                "slurm job {id} hit its time limit ({}) before the node finished",
                end.state
            ),
        ),
        "OUT_OF_MEMORY" => Ending::Verdict(
            Verdict::Crash,
            format!(
                "slurm job {id} ran out of memory; raise the node's `memory`; {}",
                tail()
            ),
        ),
        s => Ending::Verdict(
            Verdict::Error,
            format!(
                "slurm job {id} ended {s} without writing a receipt (is memra-orch on a \
                 filesystem the compute node shares?); {}",
                tail()
            ),
        ),
    }
}

/// GPUs Slurm can give jobs in a partition (the default one when `None`): the sum of the
/// `gpu` GRES of its nodes, from `sinfo`.
pub fn cluster_gpus(partition: Option<&str>) -> Result<u32, SlurmError> {
    let mut cmd = Command::new("sinfo");
    cmd.args(["-h", "-N", "-o", "%N %G"]);
    if let Some(p) = partition {
        cmd.arg(format!("--partition={p}"));
    }
    let out = cmd.output().map_err(SlurmError::RunSinfo)?;
    if !out.status.success() {
        return Err(SlurmError::Sinfo {
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let mut seen = std::collections::BTreeSet::new();
    let mut total = 0;
    for line in text.lines() {
        let mut parts = line.split_whitespace();
        let (Some(node), Some(gres)) = (parts.next(), parts.next()) else {
            continue;
        };
        // A node in several partitions is listed once per partition.
        if seen.insert(node.to_string()) {
            total += gres_gpus(gres);
        }
    }
    Ok(total)
}

/// GPUs in a GRES string: `gpu:4`, `gpu:a100:2(S:0-1)`, `gpu:2,shard:8`, `(null)`.
pub fn gres_gpus(gres: &str) -> u32 {
    gres.split(',')
        .filter_map(|g| {
            let g = g.split('(').next()?;
            let mut parts = g.split(':');
            (parts.next()? == "gpu").then_some(())?;
            parts.next_back()?.parse::<u32>().ok()
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::{Expect, NodeKind};

    fn job() -> CellJob {
        CellJob {
            prior_attempts: Vec::new(),
            id: "arm[b=1]".into(),
            node: "arm".into(),
            kind: NodeKind::Arm,
            axes: vec![],
            tags: vec![],
            slug: "arm_b_1".into(),
            argv: vec!["true".into()],
            shell: false,
            cwd: PathBuf::from("/work"),
            pins: BTreeMap::new(),
            inherit: vec![],
            timeout: Duration::from_secs(90),
            max_output: 1 << 30,
            reps: 2,
            deterministic: true,
            retries: 1,
            expect: Expect::Pass,
            expect_fail: Vec::new(),
            info: Vec::new(),
            store: None,
            code: "git:t".into(),
            fingerprints: Vec::new(),
            verdict_pass: None,
            verdict_fail: None,
            produces: vec![],
            creates: vec![],
            gpus: vec![],
            visible_devices: vec![],
            node_dir: PathBuf::from("/r/nodes/arm_b_1"),
            binaries: vec![],
            input_files: vec![],
            inputs: String::new(),
            program: None,
        }
    }

    fn opts() -> SlurmOptions {
        SlurmOptions {
            partition: Some("gpu".into()),
            account: Some("numerics".into()),
            extra_args: vec!["--qos=nightly".into()],
            spool: PathBuf::from("/r/.slurm"),
            exe: PathBuf::from("/bin/memra-orch"),
            grace: Duration::from_secs(5),
            job_name: "memra:nightly".into(),
            poll: Duration::from_millis(100),
            resources: HashMap::new(),
        }
    }

    #[test]
    fn sbatch_asks_for_what_the_cell_states() {
        let res = Resources {
            cpus: Some(8),
            memory: Some(16 << 30),
        };
        let a = sbatch_args(&opts(), &job(), 2, res, "arm_b_1.1", Path::new("/r/x.sh"));
        // 4 attempts of 95 s plus a minute of slack: 440 s, 8 minutes rounded up.
        for want in [
            "--parsable",
            "--job-name=memra:nightly:arm[b=1]",
            "--output=/r/.slurm/arm_b_1.1.out",
            "--chdir=/work",
            "--no-requeue",
            "--time=8",
            "--gres=gpu:2",
            "--cpus-per-task=8",
            "--mem=16384M",
            "--partition=gpu",
            "--account=numerics",
        ] {
            assert!(a.iter().any(|x| x == want), "{want} missing from {a:?}");
        }
        // The user's arguments come after the executor's, so they override; the script last.
        assert_eq!(a[a.len() - 2], "--qos=nightly");
        assert_eq!(a[a.len() - 1], "/r/x.sh");
        let cpu = sbatch_args(
            &SlurmOptions {
                partition: None,
                account: None,
                extra_args: vec![],
                ..opts()
            },
            &job(),
            0,
            Resources::default(),
            "s",
            Path::new("/s.sh"),
        );
        assert!(!cpu.iter().any(|x| x.starts_with("--gres")
            || x.starts_with("--mem")
            || x.starts_with("--cpus")
            || x.starts_with("--partition")
            || x.starts_with("--account")));
    }

    #[test]
    fn parsing_slurm_output() {
        assert_eq!(parse_parsable("1234\n"), Some("1234".into()));
        assert_eq!(parse_parsable("77;cluster2"), Some("77".into()));
        assert_eq!(parse_parsable("sbatch: error"), None);
        let s =
            parse_scontrol("JobId=3 JobName=x JobState=PENDING Reason=Resources Dependency=(null)")
                .unwrap();
        assert_eq!(s.state, "PENDING");
        assert_eq!(s.reason, "Resources");
        assert!(parse_scontrol("slurm_load_jobs error: Invalid job id").is_none());
        let q = parse_squeue("12 RUNNING None\n13 PENDING Resources\n");
        assert_eq!(q["12"].state, "RUNNING");
        assert_eq!(q["13"].reason, "Resources");
        assert_eq!(q.len(), 2);
        assert_eq!(gres_gpus("gpu:4"), 4);
        assert_eq!(gres_gpus("gpu:a100:2(S:0-1)"), 2);
        assert_eq!(gres_gpus("gpu:2,shard:8"), 2);
        assert_eq!(gres_gpus("(null)"), 0);
        assert!(is_final("COMPLETED") && is_final("NODE_FAIL") && !is_final("PENDING"));
    }

    #[test]
    fn a_job_lost_to_the_cluster_is_retried_and_others_are_judged() {
        let st = |s: &str| JobState {
            state: s.into(),
            reason: String::new(),
        };
        let out = Path::new("/nonexistent/x.out");
        for lost in ["NODE_FAIL", "PREEMPTED", "BOOT_FAIL"] {
            assert_eq!(judge("9", Some(&st(lost)), false, out), Ending::Lost);
        }
        let v = |s: &str, c: bool| match judge("9", Some(&st(s)), c, out) {
            Ending::Verdict(v, _) => v,
            Ending::Lost => panic!("{s} is not a loss"),
        };
        assert_eq!(v("TIMEOUT", false), Verdict::Timeout);
        assert_eq!(v("CANCELLED", true), Verdict::Cancelled);
        assert_eq!(v("CANCELLED", false), Verdict::Error);
        assert_eq!(v("FAILED", false), Verdict::Error);
        assert_eq!(v("OUT_OF_MEMORY", false), Verdict::Crash);
        let Ending::Verdict(_, why) = judge("9", Some(&st("FAILED")), false, out) else {
            panic!("FAILED is a verdict");
        };
        assert!(why.contains("x.out is empty or missing"), "{why}");
    }

    #[test]
    fn the_batch_script_quotes_paths() {
        let s = batch_script(
            Path::new("/opt/it's/memra-orch"),
            Duration::from_secs(2),
            Path::new("/r/j.json"),
            Path::new("/r/j.receipt.json"),
        );
        assert!(s.starts_with("#!/bin/sh\n"));
        assert!(s.contains(
            "exec '/opt/it'\\''s/memra-orch' exec-node --grace 2s --gpus-from-env \
             --receipt '/r/j.receipt.json' '/r/j.json'"
        ));
    }
}
