//! Compare cells, which the orchestrator runs itself (DESIGN §5): the reference's artifact
//! against the candidate's under the policy, through `compare::compare_files`, recorded as
//! one attempt with the comparison report in the receipt. No process, no GPU.

use std::path::Path;
use std::time::{Instant, SystemTime};

use super::CellJob;
use crate::plan::{Expect, Policy};
use crate::receipt::{AttemptRecord, NodeReceipt};
use crate::verdict::Verdict;

/// Runs a compare cell in-process: the reference's artifact against the candidate's.
pub fn run(job: &CellJob, reference: &Path, candidate: &Path, policy: &Policy) -> NodeReceipt {
    let start_wall = SystemTime::now();
    let started = Instant::now();
    let report = crate::compare::compare_files(reference, candidate, policy);
    let (outcome, raw_reason) = if report.passed() {
        (Verdict::Pass, None)
    } else {
        (Verdict::Fail, Some(report.failures.join("; ")))
    };
    // A negative compare (`expect = "fail"`, e.g. "this door must move some bit") is as
    // expected iff the comparison failed, exactly as for a gate.
    let (verdict, reason) = match (job.expect, outcome) {
        (Expect::Fail, Verdict::Fail) => (
            Verdict::Pass,
            Some(format!(
                "failed as expected: {}",
                raw_reason.as_deref().unwrap_or("the artifacts differ")
            )),
        ),
        (Expect::Fail, _) => (
            Verdict::Fail,
            Some(
                "expect = \"fail\" but the artifacts agree under the policy; the difference \
                 this compare exists to show went missing"
                    .to_string(),
            ),
        ),
        (Expect::Pass, v) => (v, raw_reason.clone()),
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
        outcome,
        reason: raw_reason,
        artifacts: Vec::new(),
    });
    r.compare = serde_json::to_value(&report)
        .ok()
        .map(crate::protocol::sorted);
    r.seconds = seconds;
    r
}
