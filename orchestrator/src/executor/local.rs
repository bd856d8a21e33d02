//! The local executor: runs a cell's attempts as subprocesses of this machine, isolated per
//! DESIGN §4 (cleared environment, own process group, stdin from /dev/null, stdout and
//! stderr to files, a TMPDIR per attempt), and turns them into a node receipt: reps (every
//! rep must be as expected and, unless the node says `deterministic = false`, leave the
//! artifacts rep 1 left, as [`reps`] judges), retries (after crash, timeout or an error that
//! is not a protocol violation), `expect = "fail"`, setup `creates`/`produces`, artifacts.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant, SystemTime};

use regex::Regex;

use super::env::{self, OrchVars};
use super::error::{ExecError, FileErrorKind as Kind};
use super::process::Watchdog;
use super::reps;
use super::{CellJob, CellNote, Executor};
use crate::attempt_file;
use crate::plan::{Cell, Expect, NodeKind, TextVerdict};
use crate::protocol::{self, GateReport, ProcessEnd, Stopped};
use crate::receipt::{
    Artifact, AttemptRecord, FileDigest, NodeReceipt, attempt_dir_name, sha256_file,
};
use crate::verdict::Verdict;

/// Default time between SIGTERM and SIGKILL.
pub const DEFAULT_GRACE: Duration = Duration::from_secs(5);

/// Runs cells as local subprocesses.
#[derive(Debug)]
pub struct LocalExecutor {
    watchdog: Watchdog,
    /// Per-attempt TMPDIRs live below this folder (outside the receipt tree).
    tmp_root: PathBuf,
    /// Emptied TMPDIRs ready for the next attempt. An attempt gets a folder no other
    /// running attempt has, emptied when the attempt ends; reusing the folder instead of
    /// creating and deleting one per attempt spares the filesystem two inode operations per
    /// attempt, which dominate the cost of short gates.
    free_tmp: Mutex<Vec<PathBuf>>,
    next_tmp: AtomicUsize,
}

impl LocalExecutor {
    pub fn new(grace: Duration, tmp_root: PathBuf) -> LocalExecutor {
        LocalExecutor {
            watchdog: Watchdog::new(grace),
            tmp_root,
            free_tmp: Mutex::new(Vec::new()),
            next_tmp: AtomicUsize::new(0),
        }
    }

    /// An empty TMPDIR for one attempt (created when none is free).
    fn take_tmp(&self) -> Result<PathBuf, ExecError> {
        if let Some(dir) = self
            .free_tmp
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .pop()
        {
            return Ok(dir);
        }
        let n = self.next_tmp.fetch_add(1, Ordering::Relaxed);
        let dir = self.tmp_root.join(format!("t{n}"));
        match std::fs::create_dir_all(&dir) {
            Ok(()) => Ok(dir),
            Err(e) => Err(ExecError::file(dir, Kind::CreateTmp(e))),
        }
    }

    /// Empties a TMPDIR after its attempt and makes it available again; one that cannot be
    /// emptied (a gate left a read-only folder) is removed as far as possible and not reused.
    fn give_back_tmp(&self, dir: PathBuf) {
        let emptied = std::fs::read_dir(&dir).is_ok_and(|entries| {
            entries.flatten().all(|e| {
                let p = e.path();
                match e.file_type() {
                    Ok(t) if t.is_dir() => std::fs::remove_dir_all(&p).is_ok(),
                    _ => std::fs::remove_file(&p).is_ok(),
                }
            })
        });
        if emptied {
            self.free_tmp
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(dir);
        } else {
            let _ = std::fs::remove_dir_all(&dir);
        }
    }
}

/// What one attempt left for the cell loop.
struct AttemptResult {
    record: AttemptRecord,
    report: GateReport,
    protocol_error: bool,
    argv: Vec<String>,
    env: BTreeMap<String, OsString>,
    /// Why the attempt's artifacts folder could not be listed, if it could not.
    listing_error: Option<String>,
}

impl Executor for LocalExecutor {
    fn execute(&self, job: &CellJob, on_note: &mut dyn FnMut(CellNote)) -> NodeReceipt {
        let started = Instant::now();
        let mut receipt = job.receipt();
        if let Err(e) = reset_dir(&job.node_dir) {
            receipt.verdict = Verdict::Error;
            receipt.reason = Some(e.to_string());
            return receipt;
        }
        if job.kind == NodeKind::Setup
            && !job.creates.is_empty()
            && job.creates.iter().all(|p| p.exists())
        {
            receipt.verdict = Verdict::Pass;
            receipt.reason = Some("not run: every `creates` path already exists".to_string());
            finish_setup(job, &mut receipt);
            return receipt;
        }
        let text = match text_verdict(job) {
            Ok(t) => t,
            Err(e) => {
                receipt.verdict = Verdict::Error;
                receipt.reason = Some(e.to_string());
                return receipt;
            }
        };
        let wanted = if job.expect == Expect::Fail {
            Verdict::Fail
        } else {
            Verdict::Pass
        };
        let check_reps = job.deterministic && job.reps > 1;
        let mut n = 0;
        let mut last: Option<AttemptResult> = None;
        // Rep 1's artifacts (its last attempt's), which every later rep must match.
        let mut first: Option<(PathBuf, Vec<Artifact>)> = None;
        let mut nondeterministic: Option<String> = None;
        'reps: for rep in 1..=job.reps.max(1) {
            let mut retried = 0;
            loop {
                n += 1;
                let mut result = self.attempt(job, n, rep, text.as_ref());
                let dir = artifacts_dir(job, n);
                match list_artifacts(&dir) {
                    Ok(a) => result.record.artifacts = a,
                    Err(e) => result.listing_error = Some(e.to_string()),
                }
                on_note(CellNote::Attempt(result.record.clone()));
                receipt.attempts.push(result.record.clone());
                let outcome = result.record.outcome;
                let retry = matches!(outcome, Verdict::Crash | Verdict::Timeout | Verdict::Error)
                    && !result.protocol_error
                    && retried < job.retries
                    && !self.watchdog.is_cancelled();
                let listed = result.listing_error.is_none();
                let artifacts = result.record.artifacts.clone();
                last = Some(result);
                if retry {
                    retried += 1;
                    continue;
                }
                if outcome != wanted {
                    break 'reps;
                }
                if check_reps {
                    // A rep whose artifacts could not be listed cannot be compared; the
                    // listing error ends the cell below.
                    if !listed {
                        break 'reps;
                    }
                    match &first {
                        None => first = Some((dir, artifacts)),
                        Some((first_dir, first_artifacts)) => {
                            let one = reps::RepArtifacts {
                                rep: 1,
                                dir: first_dir,
                                artifacts: first_artifacts,
                            };
                            let this = reps::RepArtifacts {
                                rep,
                                dir: &dir,
                                artifacts: &artifacts,
                            };
                            if let Some(d) = reps::difference(one, this) {
                                nondeterministic = Some(d);
                                break 'reps;
                            }
                        }
                    }
                }
                break;
            }
        }
        let last = last.expect("reps >= 1 runs at least one attempt");
        let raw = last.record.outcome;
        let raw_reason = last.record.reason.clone();
        let rep_note = if job.reps > 1 {
            format!(" (rep {} of {})", last.record.rep, job.reps)
        } else {
            String::new()
        };
        let (verdict, reason) = match (job.expect, raw) {
            // Reps that disagree fail the cell whatever it expects: a negative cell whose
            // gate fails differently each time proves nothing either.
            _ if nondeterministic.is_some() => (Verdict::Fail, nondeterministic),
            (Expect::Fail, Verdict::Fail) => (
                Verdict::Pass,
                Some(format!(
                    "failed as expected: {}",
                    raw_reason.as_deref().unwrap_or("exit code 1")
                )),
            ),
            (Expect::Fail, Verdict::Pass) => (
                Verdict::Fail,
                Some(format!(
                    "expect = \"fail\" but the gate passed{rep_note}; the defect it must catch went unnoticed"
                )),
            ),
            (_, Verdict::Pass) => (Verdict::Pass, None),
            (_, v) => (v, raw_reason.map(|r| format!("{r}{rep_note}"))),
        };
        receipt.verdict = verdict;
        receipt.reason = reason;
        receipt.argv = last.argv;
        receipt.env = env::for_receipt(&last.env);
        receipt.checks = last.report.checks;
        receipt.doors = last.report.doors;
        match last.listing_error {
            None => receipt.artifacts = last.record.artifacts,
            Some(e) => {
                receipt.verdict = receipt.verdict.max(Verdict::Error);
                receipt.reason = Some(e);
            }
        }
        if job.kind == NodeKind::Setup && receipt.verdict == Verdict::Pass {
            finish_setup(job, &mut receipt);
        }
        receipt.seconds = started.elapsed().as_secs_f64();
        receipt
    }

    fn cancel_all(&self) {
        self.watchdog.cancel_all();
    }
}

impl LocalExecutor {
    fn attempt(
        &self,
        job: &CellJob,
        n: u32,
        rep: u32,
        text: Option<&TextVerdict>,
    ) -> AttemptResult {
        let start_wall = SystemTime::now();
        let started = Instant::now();
        let dir = job.node_dir.join(attempt_dir_name(n));
        let artifacts = dir.join("artifacts");
        let checks = dir.join("checks.jsonl");
        let tmp = match self.take_tmp() {
            Ok(t) => t,
            Err(e) => {
                return AttemptResult {
                    record: AttemptRecord {
                        n,
                        rep,
                        start: humantime::format_rfc3339_millis(start_wall).to_string(),
                        seconds: 0.0,
                        exit: None,
                        signal: None,
                        outcome: Verdict::Error,
                        reason: Some(e.to_string()),
                        artifacts: Vec::new(),
                    },
                    report: GateReport::default(),
                    protocol_error: false,
                    argv: job.argv.clone(),
                    env: BTreeMap::new(),
                    listing_error: None,
                };
            }
        };
        let visible = job.visible_devices.join(",");
        let vars = OrchVars {
            checks: &checks,
            artifacts: &artifacts,
            node: &job.id,
            attempt: n,
            rep,
            visible_devices: &visible,
            tmp: &tmp,
        };
        let pins: BTreeMap<String, String> = job
            .pins
            .iter()
            .map(|(k, v)| (k.clone(), Cell::attempt_string(v, &artifacts, &tmp)))
            .collect();
        let env = env::build(&job.inherit, |name| std::env::var_os(name), &pins, &vars);
        let argv: Vec<String> = job
            .argv
            .iter()
            .map(|a| Cell::attempt_string(a, &artifacts, &tmp))
            .collect();
        let mut record = AttemptRecord {
            n,
            rep,
            start: humantime::format_rfc3339_millis(start_wall).to_string(),
            seconds: 0.0,
            exit: None,
            signal: None,
            outcome: Verdict::Error,
            reason: None,
            artifacts: Vec::new(),
        };
        let result = |record: AttemptRecord, report, protocol_error| AttemptResult {
            record,
            report,
            protocol_error,
            argv: argv.clone(),
            env: env.clone(),
            listing_error: None,
        };
        if self.watchdog.is_cancelled() {
            record.outcome = Verdict::Cancelled;
            record.reason =
                Some("cancelled: the run was interrupted before this attempt started".into());
            return result(record, GateReport::default(), false);
        }
        let (end, stopped) = match self.spawn_and_wait(job, &argv, &env, &dir, &artifacts, &checks)
        {
            Ok(x) => x,
            Err(e) => {
                self.give_back_tmp(tmp.clone());
                record.reason = Some(e.to_string());
                record.seconds = started.elapsed().as_secs_f64();
                return result(record, GateReport::default(), false);
            }
        };
        self.give_back_tmp(tmp.clone());
        record.seconds = started.elapsed().as_secs_f64();
        match end {
            ProcessEnd::Exited(c) => record.exit = Some(c),
            ProcessEnd::Signaled(s) => record.signal = Some(s),
            ProcessEnd::NotStarted => {}
        }
        let report = protocol::read_checks(&checks);
        // Stdout is scanned only when it can matter (an attempt that was not stopped).
        let text = text
            .filter(|_| stopped == Stopped::No)
            .map(|tv| protocol::judge_text_file(tv, &dir.join("stdout.log")));
        let mut judgement = protocol::judge(end, stopped, &report, text);
        if judgement.outcome == Verdict::Timeout {
            judgement.reason = Some(format!(
                "timed out after {}",
                humantime::format_duration(job.timeout)
            ));
        }
        record.outcome = judgement.outcome;
        record.reason = judgement.reason;
        result(record, report, judgement.protocol_error)
    }

    #[allow(clippy::too_many_arguments)]
    fn spawn_and_wait(
        &self,
        job: &CellJob,
        argv: &[String],
        env: &BTreeMap<String, OsString>,
        dir: &Path,
        artifacts: &Path,
        checks: &Path,
    ) -> Result<(ProcessEnd, Stopped), ExecError> {
        std::fs::create_dir_all(artifacts)
            .map_err(|e| ExecError::file(artifacts, Kind::CreateAttemptDir(e)))?;
        std::fs::File::create(checks)
            .map_err(|e| ExecError::file(checks, Kind::CreateChecks(e)))?;
        let stdout_path = dir.join("stdout.log");
        let stderr_path = dir.join("stderr.log");
        let stdout = std::fs::File::create(&stdout_path)
            .map_err(|e| ExecError::file(&stdout_path, Kind::CreateStdout(e)))?;
        let stderr = std::fs::File::create(&stderr_path)
            .map_err(|e| ExecError::file(&stderr_path, Kind::CreateStderr(e)))?;
        let mut cmd = if job.shell {
            let mut c = Command::new("/bin/sh");
            c.arg("-c").arg(argv.join(" "));
            c
        } else {
            let Some((program, args)) = argv.split_first() else {
                return Err(ExecError::EmptyRun {
                    node: job.id.clone(),
                });
            };
            // A resolved program saves the PATH search at every spawn.
            let mut c = match &job.program {
                Some(p) => Command::new(p),
                None => Command::new(program),
            };
            c.args(args);
            c
        };
        cmd.env_clear()
            .envs(env)
            .current_dir(&job.cwd)
            .stdin(Stdio::null())
            .stdout(stdout)
            .stderr(stderr)
            .process_group(0);
        let mut child = cmd.spawn().map_err(|error| ExecError::Spawn {
            program: argv.first().map_or("/bin/sh", String::as_str).to_string(),
            cwd: job.cwd.clone(),
            error,
        })?;
        let pgid = child.id() as i32;
        let watch = self.watchdog.watch(pgid, job.timeout);
        let status = child.wait();
        let stopped = self.watchdog.unwatch(watch);
        let status = status.map_err(|error| ExecError::Wait { pgid, error })?;
        let end = match (status.code(), status.signal()) {
            (Some(c), _) => ProcessEnd::Exited(c),
            (None, Some(s)) => ProcessEnd::Signaled(s),
            (None, None) => ProcessEnd::NotStarted,
        };
        Ok((end, stopped))
    }
}

/// The artifacts folder of attempt `n`.
fn artifacts_dir(job: &CellJob, n: u32) -> PathBuf {
    job.node_dir.join(attempt_dir_name(n)).join("artifacts")
}

/// Empties the node folder: a node that runs again (`--resume` after a cancel) must not
/// keep attempts of the earlier try.
fn reset_dir(dir: &Path) -> Result<(), ExecError> {
    if dir.exists() {
        std::fs::remove_dir_all(dir).map_err(|e| ExecError::file(dir, Kind::ClearNodeDir(e)))?;
    }
    std::fs::create_dir_all(dir).map_err(|e| ExecError::file(dir, Kind::CreateNodeDir(e)))
}

fn text_verdict(job: &CellJob) -> Result<Option<TextVerdict>, ExecError> {
    if job.verdict_pass.is_none() && job.verdict_fail.is_none() {
        return Ok(None);
    }
    let compile = |s: &Option<String>, which: &'static str| {
        s.as_deref()
            .map(|p| {
                Regex::new(p).map_err(|error| ExecError::BadRegex {
                    node: job.id.clone(),
                    which,
                    pattern: p.to_string(),
                    error,
                })
            })
            .transpose()
    };
    Ok(Some(TextVerdict {
        pass: compile(&job.verdict_pass, "pass")?,
        fail: compile(&job.verdict_fail, "fail")?,
    }))
}

/// Checks a setup's `produces` exist and records their digests; a missing one makes the
/// setup an error, since its dependents would run against something that is not there.
fn finish_setup(job: &CellJob, receipt: &mut NodeReceipt) {
    for p in &job.produces {
        match sha256_file(p) {
            Ok((bytes, sha256)) => receipt.produces.push(FileDigest {
                path: p.to_string_lossy().into_owned(),
                bytes,
                sha256,
            }),
            Err(e) => {
                receipt.verdict = Verdict::Error;
                receipt.reason = Some(format!(
                    "setup did not produce {} ({e}); fix its command or its `produces` list",
                    p.display()
                ));
                return;
            }
        }
    }
}

/// Every file under an artifacts folder, sorted by name (relative path). A link or anything
/// but a folder or a regular file below the attempt folder is a protocol error naming it,
/// never followed ([`crate::attempt_file`]).
pub fn list_artifacts(dir: &Path) -> Result<Vec<Artifact>, ExecError> {
    let (attempt, folder) = match (dir.parent(), dir.file_name()) {
        (Some(p), Some(n)) => (p, Path::new(n)),
        _ => (dir, Path::new(".")),
    };
    let names = attempt_file::files_below(attempt, folder).map_err(ExecError::AttemptFile)?;
    names
        .into_iter()
        .map(|name| {
            let (bytes, sha256) = attempt_file::sha256(attempt, &folder.join(&name))
                .map_err(ExecError::AttemptFile)?;
            Ok(Artifact {
                name: name.to_string_lossy().into_owned(),
                bytes,
                sha256,
            })
        })
        .collect()
}
