//! Compare cells, which the orchestrator runs itself (DESIGN §5): the reference's artifact
//! against the candidate's under the policy, through `gate::judge::compare_opened`, recorded as
//! one attempt with the comparison report in the receipt. No process, no GPU.
//!
//! It owns what a compare cell ends as: `error` when an artifact is missing (naming what the
//! cell did write, with the closest name) or refused (a link, not a regular file), `timeout`
//! past the node's `timeout`, `cancelled` when the run is interrupted, else the policy's
//! pass or fail with `expect` applied. The comparison runs on a thread of its own that the
//! cell stops waiting for at the deadline or on cancel (and tells to stop between rows), so
//! nothing an artifact does can hold the run. Reading the files is `compare`'s and
//! `attempt_file`'s.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant, SystemTime};

use super::CellJob;
use crate::gate::attempt_file::{self, OpenError};
use crate::gate::judge::{ArtifactPath, CompareError, CompareReport, Side, compare_opened};
use crate::plan::{Expect, Policy};
use crate::receipt::{AttemptRecord, NodeReceipt};
use crate::words::verdict::Verdict;

/// How often the waiting cell looks at the cancel flag.
const POLL: Duration = Duration::from_millis(25);

/// How a bounded piece of work ended.
#[derive(Debug, PartialEq)]
pub enum Bounded<T> {
    Done(T),
    TimedOut,
    Cancelled,
    /// The work panicked.
    Died,
}

/// Runs `work` on a thread of its own and waits for it until `timeout` passes or `cancel`
/// is set; then it stops waiting (setting the flag `work` is given, so work that looks at it
/// ends soon) and the thread is left to finish on its own.
pub fn bounded<T: Send + 'static>(
    timeout: Duration,
    cancel: &AtomicBool,
    work: impl FnOnce(&AtomicBool) -> T + Send + 'static,
) -> Bounded<T> {
    let stop = Arc::new(AtomicBool::new(false));
    let (tx, rx) = mpsc::channel();
    let worker_stop = Arc::clone(&stop);
    std::thread::Builder::new()
        .name("memra-orch-compare".into())
        .spawn(move || {
            let _ = tx.send(work(&worker_stop));
        })
        .expect("the OS refused to start a compare thread");
    let deadline = Instant::now().checked_add(timeout);
    let ended = loop {
        if cancel.load(Ordering::SeqCst) {
            break Bounded::Cancelled;
        }
        let wait = match deadline {
            Some(d) => match d.checked_duration_since(Instant::now()) {
                Some(left) if !left.is_zero() => left.min(POLL),
                _ => break Bounded::TimedOut,
            },
            None => POLL,
        };
        match rx.recv_timeout(wait) {
            Ok(v) => return Bounded::Done(v),
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            // The worker died without an answer (a panic in it): the cell must still end.
            Err(mpsc::RecvTimeoutError::Disconnected) => break Bounded::Died,
        }
    };
    stop.store(true, Ordering::SeqCst);
    ended
}

/// Runs a compare cell in-process: the reference's artifact against the candidate's,
/// within the node's timeout and until `cancel` is set.
pub fn run(
    job: &CellJob,
    reference: &ArtifactPath,
    candidate: &ArtifactPath,
    policy: &Policy,
    cancel: &AtomicBool,
) -> NodeReceipt {
    let start_wall = SystemTime::now();
    let started = Instant::now();
    // Opening runs on the bounded thread too: it cannot block on a FIFO or a lease, but a
    // file on a hung network filesystem could still hold it.
    let (r, c, p) = (reference.clone(), candidate.clone(), policy.clone());
    let ended = bounded(job.timeout, cancel, move |stop| {
        hold_for_tests();
        judge_pair(&r, &c, &p, stop)
    });
    let (outcome, raw_reason, report) = match ended {
        Bounded::Done(Judged::Unusable(why, report)) => {
            (Verdict::Error, Some(why.join("; ")), Some(report))
        }
        Bounded::Done(Judged::Compared(report)) if report.passed() => {
            (Verdict::Pass, None, Some(report))
        }
        Bounded::Done(Judged::Compared(report)) => {
            let why = report.failures.join("; ");
            (Verdict::Fail, Some(why), Some(report))
        }
        Bounded::TimedOut => (
            Verdict::Timeout,
            Some(format!(
                "timed out after {} comparing {} with {}",
                humantime::format_duration(job.timeout),
                reference.full().display(),
                candidate.full().display()
            )),
            None,
        ),
        Bounded::Cancelled => (
            Verdict::Cancelled,
            Some("cancelled: the run was interrupted".to_string()),
            None,
        ),
        Bounded::Died => (
            Verdict::Error,
            Some(
                "internal error in memra-orch while comparing the artifacts; please report it"
                    .to_string(),
            ),
            None,
        ),
    };
    // A negative compare (`expect = "fail"`, e.g. "this door must move some bit") is as
    // expected iff the comparison failed, exactly as for a gate; an error, a timeout or a
    // cancel proves nothing either way.
    let (verdict, reason) = match (job.expect, outcome) {
        (Expect::Fail, Verdict::Fail) => (
            Verdict::Pass,
            Some(format!(
                "failed as expected: {}",
                raw_reason.as_deref().unwrap_or("the artifacts differ")
            )),
        ),
        (Expect::Fail, Verdict::Pass) => (
            Verdict::Fail,
            Some(
                "expect = \"fail\" but the artifacts agree under the policy; the difference \
                 this compare exists to show went missing"
                    .to_string(),
            ),
        ),
        (_, v) => (v, raw_reason.clone()),
    };
    let seconds = started.elapsed().as_secs_f64();
    let mut r = job.receipt();
    r.verdict = verdict;
    r.reason = reason;
    r.argv = Vec::new();
    r.attempts.push(AttemptRecord {
        n: 1,
        rep: 1,
        start: humantime::format_rfc3339_millis(start_wall).to_string(),
        seconds,
        exit: None,
        signal: None,
        outcome,
        reason: raw_reason,
        artifacts: Vec::new(),
        gpu_health: Vec::new(),
    });
    r.compare = report
        .and_then(|report| serde_json::to_value(&report).ok())
        .map(crate::gate::checks::sorted);
    r.seconds = seconds;
    r
}

/// What the bounded thread found.
#[derive(Debug)]
enum Judged {
    /// An artifact is missing or refused: the reasons, and a report carrying them.
    Unusable(Vec<String>, CompareReport),
    Compared(CompareReport),
}

/// Opens both artifacts and compares them, or says why either cannot be compared.
fn judge_pair(
    reference: &ArtifactPath,
    candidate: &ArtifactPath,
    policy: &Policy,
    stop: &AtomicBool,
) -> Judged {
    let r_file = attempt_file::open(&reference.attempt, &reference.rel);
    let c_file = attempt_file::open(&candidate.attempt, &candidate.rel);
    // A missing or refused artifact is a mistake of the manifest or the gate, not a
    // numeric failure: the cell ends `error`, saying which.
    let why: Vec<String> = [
        (Side::Reference, reference, &r_file),
        (Side::Candidate, candidate, &c_file),
    ]
    .into_iter()
    .filter_map(|(side, a, f)| f.as_ref().err().map(|e| unusable(side, a, e)))
    .collect();
    if !why.is_empty() {
        let mut report = CompareReport::new(&reference.full(), &candidate.full(), policy);
        report.failures = why.clone();
        return Judged::Unusable(why, report);
    }
    Judged::Compared(compare_opened(
        (
            &reference.full(),
            r_file.map_err(to_compare(Side::Reference)),
        ),
        (
            &candidate.full(),
            c_file.map_err(to_compare(Side::Candidate)),
        ),
        policy,
        stop,
    ))
}

fn to_compare(side: Side) -> impl FnOnce(OpenError) -> CompareError {
    move |error| CompareError::Open { side, error }
}

/// Why one side's artifact cannot be compared, for the cell's reason: for a missing file,
/// what the cell wrote instead and the closest name.
fn unusable(side: Side, a: &ArtifactPath, e: &OpenError) -> String {
    let OpenError::NotFound { .. } = e else {
        return format!(
            "protocol error: the {side} artifact of `{}` is refused: {e}",
            a.cell
        );
    };
    // What the cell wrote is listed from the artifacts folder down (`artifacts/`).
    let folder = a
        .rel
        .components()
        .next()
        .map_or(Path::new(""), |c| Path::new(c.as_os_str()));
    let wanted = a.rel.strip_prefix(folder).unwrap_or(&a.rel);
    let wanted = wanted.to_string_lossy();
    let written: Vec<String> = attempt_file::files_below(&a.attempt, folder)
        .unwrap_or_default()
        .iter()
        .map(|p: &PathBuf| p.to_string_lossy().into_owned())
        .collect();
    let head = format!(
        "the {side} cell `{}` wrote no artifact `{wanted}` ({})",
        a.cell,
        a.full().display()
    );
    let Some(closest) = closest(&wanted, &written) else {
        return format!(
            "{head}; it wrote no artifacts at all: check that its gate writes into \
             $MEMRA_ORCH_ARTIFACTS and the compare's `artifact` name"
        );
    };
    const SHOWN: usize = 10;
    let mut list = written
        .iter()
        .take(SHOWN)
        .map(|n| format!("`{n}`"))
        .collect::<Vec<_>>()
        .join(", ");
    if written.len() > SHOWN {
        list.push_str(&format!(" and {} more", written.len() - SHOWN));
    }
    format!("{head}; it wrote {list}; did you mean `{closest}`? Fix the compare's `artifact`")
}

/// The written name closest to `wanted` by edit distance (the first of equals, in name
/// order).
fn closest<'a>(wanted: &str, written: &'a [String]) -> Option<&'a str> {
    written
        .iter()
        .min_by_key(|n| strsim::levenshtein(wanted, n))
        .map(String::as_str)
}

/// In debug builds only, `MEMRA_ORCH_TEST_HOLD_COMPARE` set makes every comparison hang
/// before it starts, as one stuck on an unreadable file would, so the tests can show that
/// the deadline and an interrupt still end the cell. Release builds have no such switch.
fn hold_for_tests() {
    #[cfg(debug_assertions)]
    if std::env::var_os("MEMRA_ORCH_TEST_HOLD_COMPARE").is_some() {
        loop {
            std::thread::park();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounded_work_ends_at_the_deadline_and_on_cancel() {
        let never = AtomicBool::new(false);
        let t = Instant::now();
        let r = bounded(Duration::from_millis(200), &never, |_| {
            loop {
                std::thread::park();
            }
        });
        assert_eq!(r, Bounded::<()>::TimedOut);
        assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
        let cancel = Arc::new(AtomicBool::new(false));
        let setter = Arc::clone(&cancel);
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(100));
            setter.store(true, Ordering::SeqCst);
        });
        let r = bounded(Duration::from_secs(3600), &cancel, |_| {
            loop {
                std::thread::park();
            }
        });
        assert_eq!(r, Bounded::<()>::Cancelled);
        assert_eq!(
            bounded(Duration::from_secs(5), &never, |_| 7),
            Bounded::Done(7)
        );
    }

    #[test]
    fn stopped_work_is_told_to_stop() {
        let never = AtomicBool::new(false);
        let (tx, rx) = mpsc::channel();
        let r = bounded(Duration::from_millis(50), &never, move |stop| {
            while !stop.load(Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(5));
            }
            let _ = tx.send(());
        });
        assert_eq!(r, Bounded::TimedOut);
        rx.recv_timeout(Duration::from_secs(5))
            .expect("the worker saw the stop flag");
    }

    #[test]
    fn closest_name_by_edit_distance() {
        let written = vec![
            "logits.safetensors".to_string(),
            "steps.safetensors".to_string(),
        ];
        assert_eq!(
            closest("logit.safetensors", &written),
            Some("logits.safetensors")
        );
        assert_eq!(closest("x", &[]), None);
    }
}
