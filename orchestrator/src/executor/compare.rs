//! Compare cells, which the orchestrator runs itself (DESIGN §5): the reference's artifact
//! against the candidate's under the policy, through `compare::compare_files`, recorded as
//! one attempt with the comparison report in the receipt. No process, no GPU.

use std::path::Path;
use std::time::{Instant, SystemTime};

use super::CellJob;
use crate::events::Verdict;
use crate::plan::Policy;
use crate::receipt::{AttemptRecord, NodeReceipt};

/// Runs a compare cell in-process: the reference's artifact against the candidate's.
pub fn run(job: &CellJob, reference: &Path, candidate: &Path, policy: &Policy) -> NodeReceipt {
    let start_wall = SystemTime::now();
    let started = Instant::now();
    let report = crate::compare::compare_files(reference, candidate, policy);
    let (verdict, reason) = if report.passed() {
        (Verdict::Pass, None)
    } else {
        (Verdict::Fail, Some(report.failures.join("; ")))
    };
    let seconds = started.elapsed().as_secs_f64();
    let mut r = job.receipt();
    r.verdict = verdict;
    r.reason = reason.clone();
    r.argv = Vec::new();
    r.attempts.push(AttemptRecord {
        n: 1,
        rep: 1,
        start: humantime::format_rfc3339_millis(start_wall).to_string(),
        seconds,
        exit: None,
        signal: None,
        outcome: verdict,
        reason,
    });
    r.compare = serde_json::to_value(&report)
        .ok()
        .map(crate::protocol::sorted);
    r.seconds = seconds;
    r
}
