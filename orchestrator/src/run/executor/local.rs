//! The local executor: runs a cell's attempts as subprocesses of this machine, isolated per
//! DESIGN §4 (cleared environment, own process group, stdin from /dev/null, stdout and
//! stderr to capped logs ([`output`]), a fresh private TMPDIR per attempt
//! ([`super::scratch`]), every process of the attempt gone when it ends ([`supervise`])),
//! and turns them into a node receipt: reps (every rep must be as expected and, unless the
//! node says `deterministic = false`, leave the artifacts rep 1 left, as [`reps`] judges),
//! retries (after crash, timeout or an error that is not a protocol violation),
//! `expect = "fail"`, setup `creates`/`produces`, artifacts.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::io::PipeReader;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::{Duration, Instant, SystemTime};

use regex::Regex;

use super::env::{self, OrchVars};
use super::error::{ExecError, FileErrorKind as Kind};
use super::output;
use super::process::{Watchdog, signal_group};
use super::reps;
use super::scratch::{AttemptDoor, TmpDirs, reset_dir};
use super::supervise::{self, SUPERVISE_ARG, SuperviseError, Supervised};
use super::{CellJob, CellNote, Executor};
use crate::gate::attempt_file;
use crate::gate::checks::{self, GateReport, ProcessEnd, Stopped};
use crate::plan::{Cell, Expect, NodeKind, TextVerdict};
use crate::receipt::{
    Artifact, AttemptRecord, FileDigest, NodeReceipt, attempt_dir_name, sha256_file,
};
use crate::words::verdict::Verdict;

/// Default time between SIGTERM and SIGKILL.
pub const DEFAULT_GRACE: Duration = Duration::from_secs(5);

/// Runs cells as local subprocesses.
#[derive(Debug)]
pub struct LocalExecutor {
    watchdog: Watchdog,
    /// The attempts' TMPDIRs.
    tmp: TmpDirs,
    /// Each attempt's supervisor: `memra-supervise`, or memra-orch re-executed
    /// ([`supervise::default_program`]).
    supervisor: PathBuf,
    /// Reads the attempt's GPUs before and after it ([`crate::machine::health`]); `None`: no
    /// readings (a run without GPUs).
    health: Option<Arc<crate::machine::health::Monitor>>,
}

impl LocalExecutor {
    /// An executor whose attempts get TMPDIRs below a fresh private folder in `tmp_parent`
    /// (the caller's temporary folder, usually `std::env::temp_dir()`).
    pub fn new(grace: Duration, tmp_parent: PathBuf) -> LocalExecutor {
        LocalExecutor {
            watchdog: Watchdog::new(grace),
            tmp: TmpDirs::new(tmp_parent),
            supervisor: supervise::default_program(),
            health: None,
        }
    }

    /// The same executor reading every GPU attempt's health through `monitor`.
    pub fn with_health(mut self, monitor: Arc<crate::machine::health::Monitor>) -> LocalExecutor {
        self.health = Some(monitor);
        self
    }

    /// The same executor with another supervisor binary (memra-supervise or memra-orch, by
    /// path).
    pub fn with_supervisor(mut self, program: PathBuf) -> LocalExecutor {
        self.supervisor = program;
        self
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
    // Over 150 lines: the attempt loop of one cell (retries, reps against rep 1, device-fault
    // retries, the canary's expected failures) whose state is the loop's locals.
    fn execute(&self, job: &CellJob, on_note: &mut dyn FnMut(CellNote)) -> NodeReceipt {
        let started = Instant::now();
        let mut receipt = job.receipt();
        // A cell run again after a device fault keeps the faulty attempts (their folders
        // and records) and numbers its own after them.
        if job.prior_attempts.is_empty() {
            if let Err(e) = reset_dir(&job.node_dir) {
                receipt.verdict = Verdict::Error;
                receipt.reason = Some(e.to_string());
                return receipt;
            }
        } else {
            receipt.attempts = job.prior_attempts.clone();
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
        let mut n = job.prior_attempts.len() as u32;
        let mut last: Option<AttemptResult> = None;
        // Rep 1's artifacts (its last attempt's), which every later rep must match.
        let mut first: Option<(PathBuf, Vec<Artifact>)> = None;
        let mut nondeterministic: Option<String> = None;
        // A negative cell whose gate failed, but not (only) where `expect_fail` says.
        let mut wrong_reason: Option<String> = None;
        'reps: for rep in 1..=job.reps.max(1) {
            let mut retried = 0;
            loop {
                n += 1;
                let gpus: Vec<crate::machine::health::GpuRef> = job
                    .gpus
                    .iter()
                    .map(|g| crate::machine::health::GpuRef {
                        index: g.index,
                        uuid: g.uuid.clone(),
                    })
                    .collect();
                let watch = self
                    .health
                    .as_deref()
                    .filter(|_| !gpus.is_empty())
                    .map(|m| m.watch(&gpus, &job.id, n));
                let mut result = self.attempt(job, n, rep, text.as_ref());
                if let Some(w) = watch {
                    result.record.gpu_health = w.finish();
                    blame_the_device(&mut result.record);
                }
                let dir = artifacts_dir(job, n);
                match list_artifacts(&dir) {
                    Ok(a) => {
                        if let Some(store) = &job.store {
                            for art in &a {
                                crate::receipt::store::intern(
                                    store,
                                    &dir.join(&art.name),
                                    art.bytes,
                                    &art.sha256,
                                );
                            }
                        }
                        result.record.artifacts = a
                    }
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
                if outcome == Verdict::Fail
                    && job.expect == Expect::Fail
                    && let Some(why) = crate::gate::canary::wrong_reason(
                        &job.expect_fail,
                        &last.as_ref().expect("just set").report.checks,
                    )
                {
                    wrong_reason = Some(format!("{why}{}", rep_label(job, rep)));
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
            _ if wrong_reason.is_some() => (Verdict::Fail, wrong_reason),
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

/// An attempt that did not pass on a GPU that faulted meanwhile ([`crate::machine::health::fault`])
/// ends `device-fault`, its reason naming the GPU, the fault and how the attempt ended.
fn blame_the_device(record: &mut AttemptRecord) {
    if record.outcome == Verdict::Pass {
        return;
    }
    let faults: Vec<String> = record
        .gpu_health
        .iter()
        .filter_map(|h| {
            h.fault
                .as_ref()
                .map(|f| format!("gpu {} ({}): {f}", h.gpu, h.uuid))
        })
        .collect();
    if faults.is_empty() {
        return;
    }
    let ended = match &record.reason {
        Some(r) => format!("{} ({r})", record.outcome),
        None => record.outcome.to_string(),
    };
    record.reason = Some(format!(
        "device fault during the attempt, {}; the attempt ended {ended}",
        faults.join("; ")
    ));
    record.outcome = Verdict::DeviceFault;
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
        let checks_file = dir.join("checks.jsonl");
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
            gpu_health: Vec::new(),
        };
        let not_started = |mut record: AttemptRecord, reason: String| {
            record.reason = Some(reason);
            AttemptResult {
                record,
                report: GateReport::default(),
                protocol_error: false,
                argv: job.argv.clone(),
                env: BTreeMap::new(),
                listing_error: None,
            }
        };
        let tmp = match self.tmp.take() {
            Ok(t) => t,
            Err(e) => return not_started(record, e.to_string()),
        };
        let door = match AttemptDoor::open(&job.node_dir, n) {
            Ok(d) => d,
            Err(e) => {
                self.tmp.give_back(&tmp);
                return not_started(record, e.to_string());
            }
        };
        let visible = job.visible_devices.join(",");
        // The attempt's argv and environment for the given attempt folder: the gate gets
        // the door's path, the receipt records the folder's own.
        let command_for = |folder: &Path| {
            let artifacts = folder.join("artifacts");
            let checks = folder.join("checks.jsonl");
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
            (argv, env)
        };
        let (gate_argv, gate_env) = command_for(door.path());
        let (argv, env) = command_for(&dir);
        let result = |record: AttemptRecord, report, protocol_error| AttemptResult {
            record,
            report,
            protocol_error,
            argv: argv.clone(),
            env: env.clone(),
            listing_error: None,
        };
        if self.watchdog.is_cancelled() {
            drop(door);
            self.tmp.give_back(&tmp);
            record.outcome = Verdict::Cancelled;
            record.reason =
                Some("cancelled: the run was interrupted before this attempt started".into());
            return result(record, GateReport::default(), false);
        }
        let run = self.spawn_and_wait(job, &gate_argv, &gate_env, &dir, &artifacts, &checks_file);
        drop(door);
        self.tmp.give_back(&tmp);
        record.seconds = started.elapsed().as_secs_f64();
        let run = match run {
            Ok(r) => r,
            Err(e) => {
                record.reason = Some(e.to_string());
                return result(record, GateReport::default(), false);
            }
        };
        match run.end {
            ProcessEnd::Exited(c) => record.exit = Some(c),
            ProcessEnd::Signaled(s) => record.signal = Some(s),
            ProcessEnd::NotStarted => {}
        }
        let report = checks::read_checks(&checks_file);
        if let Some(log) = run.cut {
            // The gate was stopped for its output, so its exit says nothing; and a retry
            // would print as much again.
            record.outcome = Verdict::Error;
            record.reason = Some(format!(
                "{log} passed max_output = \"{cap}\": the log was cut there and the gate \
                 stopped; raise the node's `max_output` (e.g. max_output = \"{more}\") if it \
                 must print more",
                cap = output::format_size(job.max_output),
                more = output::format_size(job.max_output.saturating_mul(4)),
            ));
            return result(record, report, true);
        }
        // Stdout is scanned only when it can matter (an attempt that was not stopped).
        let text = text
            .filter(|_| run.stopped == Stopped::No)
            .map(|tv| checks::judge_text_file(tv, &dir.join("stdout.log")));
        let mut judgement = checks::judge(run.end, run.stopped, &report, text);
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

    /// Starts the attempt's supervisor (which starts the gate), captures stdout and stderr
    /// into their logs under the cap, and waits until the gate and everything it started
    /// are gone.
    #[allow(clippy::too_many_arguments)]
    fn spawn_and_wait(
        &self,
        job: &CellJob,
        argv: &[String],
        env: &BTreeMap<String, OsString>,
        dir: &Path,
        artifacts: &Path,
        checks: &Path,
    ) -> Result<Run, ExecError> {
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
        let (out_r, out_w) =
            std::io::pipe().map_err(|e| ExecError::file(&stdout_path, Kind::CreateStdout(e)))?;
        let (err_r, err_w) =
            std::io::pipe().map_err(|e| ExecError::file(&stderr_path, Kind::CreateStderr(e)))?;
        let mut cmd = Command::new(&self.supervisor);
        cmd.arg(SUPERVISE_ARG);
        if job.shell {
            cmd.arg("/bin/sh").arg("-c").arg(argv.join(" "));
        } else {
            let Some((program, args)) = argv.split_first() else {
                return Err(ExecError::EmptyRun {
                    node: job.id.clone(),
                });
            };
            // A resolved program saves the PATH search at every spawn.
            match &job.program {
                Some(p) => cmd.arg(p),
                None => cmd.arg(program),
            };
            cmd.args(args);
        }
        cmd.env_clear()
            .envs(env)
            .current_dir(&job.cwd)
            .stdout(out_w)
            .stderr(err_w);
        let spawn_error = |error| ExecError::Spawn {
            program: argv.first().map_or("/bin/sh", String::as_str).to_string(),
            cwd: job.cwd.clone(),
            error,
        };
        let mut supervised = Supervised::spawn(cmd).map_err(|error| {
            if error.kind() == std::io::ErrorKind::NotFound && !self.supervisor.is_file() {
                ExecError::Supervisor(format!(
                    "the attempt supervisor {} does not exist (memra-supervise beside memra-orch, or memra-orch itself)",
                    self.supervisor.display()
                ))
            } else {
                spawn_error(error)
            }
        })?;
        // The gate's process group, once the supervisor reported it (0 until then).
        let gate = Arc::new(AtomicI32::new(0));
        let capture = |from: PipeReader, to: std::fs::File, log: &'static str| {
            let gate = Arc::clone(&gate);
            let cap = job.max_output;
            std::thread::spawn(move || output::capture(from, to, cap, log, || stop_gate(&gate)))
        };
        let out_copy = capture(out_r, stdout, "stdout.log");
        let err_copy = capture(err_r, stderr, "stderr.log");
        // The gate's timeout bounds its start too (plus a moment for a loaded machine).
        let limit = job.timeout.saturating_add(Duration::from_secs(5));
        let ended = supervised
            .started(limit, || self.watchdog.is_cancelled())
            .and_then(|pgid| {
                gate.store(pgid, Ordering::SeqCst);
                let supervisor = i32::try_from(supervised.id()).ok();
                let watch = self
                    .watchdog
                    .watch_supervised(pgid, supervisor, job.timeout);
                let end = supervised.wait();
                let stopped = self.watchdog.unwatch(watch);
                end.map(|end| (end, stopped))
            });
        let (end, stopped) = match ended {
            Ok(x) => x,
            Err(SuperviseError::Spawn(error)) => return Err(spawn_error(error)),
            // A supervisor that died unreported may have left processes holding the logs'
            // pipes, so the copies are not waited for. What it supervised re-parented to
            // memra-orch (a subreaper): killed now, so nothing of this attempt runs beside
            // the next cell on its GPU.
            Err(SuperviseError::Lost(why)) => {
                supervise::sweep_strays();
                return Err(ExecError::Supervisor(why));
            }
        };
        let mut cut = None;
        for (copy, log, path) in [
            (out_copy, "stdout.log", &stdout_path),
            (err_copy, "stderr.log", &stderr_path),
        ] {
            let got = copy.join().unwrap_or_default();
            if let Some(e) = got.error {
                return Err(ExecError::file(path, Kind::WriteLog(e)));
            }
            if got.truncated && cut.is_none() {
                cut = Some(log);
            }
        }
        Ok(Run { end, stopped, cut })
    }
}

/// How a started attempt ended.
struct Run {
    end: ProcessEnd,
    stopped: Stopped,
    /// The log that passed `max_output`, if one did.
    cut: Option<&'static str>,
}

/// ` (rep r of n)` for a cell of several reps, else nothing.
fn rep_label(job: &CellJob, rep: u32) -> String {
    if job.reps > 1 {
        format!(" (rep {rep} of {})", job.reps)
    } else {
        String::new()
    }
}

/// Kills the gate's group for output past the cap; the supervisor then sweeps the rest.
/// The group is known a moment after the gate starts, and output can come before that.
fn stop_gate(gate: &AtomicI32) {
    let until = Instant::now() + Duration::from_secs(10);
    while Instant::now() < until {
        let pgid = gate.load(Ordering::SeqCst);
        if pgid > 0 {
            signal_group(pgid, libc::SIGKILL);
            return;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// The artifacts folder of attempt `n`.
fn artifacts_dir(job: &CellJob, n: u32) -> PathBuf {
    job.node_dir.join(attempt_dir_name(n)).join("artifacts")
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
/// never followed ([`crate::gate::attempt_file`]).
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
