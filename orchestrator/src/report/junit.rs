//! `junit.xml` for CI dashboards (quick-junit): one test suite per manifest, one test case
//! per cell. Attempts that were retried appear as reruns — flaky ones when the node passed
//! in the end.

use quick_junit::{
    FlakyOrRerun, NonSuccessKind, Report, TestCase, TestCaseStatus, TestRerun, TestSuite,
};
use std::time::Duration;

use crate::receipt::{AttemptRecord, NodeReceipt, RunReceipt};
use crate::words::escape;
use crate::words::verdict::Verdict;

/// The JUnit report could not be rendered (quick-junit refused the XML it was given).
#[derive(Debug, thiserror::Error)]
#[error("junit.xml: cannot render: {0}; this is a bug in memra-orch, please report it")]
pub struct RenderError(#[from] quick_junit::SerializeError);

/// Renders the JUnit report of a run.
pub fn render(
    run: &RunReceipt,
    receipts: &[Option<Box<NodeReceipt>>],
) -> Result<String, RenderError> {
    let mut suite = TestSuite::new(run.name.as_str());
    for r in receipts.iter().flatten() {
        suite.add_test_case(case(r));
    }
    let mut report = Report::new(format!("memra-orch {} at {}", run.name, run.commit));
    if let Some(s) = run.seconds {
        report.set_time(Duration::from_secs_f64(s));
    }
    report.add_test_suite(suite);
    Ok(report.to_string()?)
}

/// Attempts that were followed by another attempt of the same rep (they were retried).
fn retried(r: &NodeReceipt) -> Vec<&AttemptRecord> {
    r.attempts
        .windows(2)
        .filter(|w| w[0].rep == w[1].rep)
        .map(|w| &w[0])
        .collect()
}

fn rerun(a: &AttemptRecord) -> TestRerun {
    let kind = if a.outcome == Verdict::Fail {
        NonSuccessKind::Failure
    } else {
        NonSuccessKind::Error
    };
    let mut t = TestRerun::new(kind);
    t.set_time(Duration::from_secs_f64(a.seconds));
    t.set_type(a.outcome.as_str());
    t.set_message(format!(
        "attempt {}: {}",
        a.n,
        escape::control(a.reason.as_deref().unwrap_or(a.outcome.as_str()))
    ));
    t
}

fn case(r: &NodeReceipt) -> TestCase {
    let reruns: Vec<TestRerun> = retried(r).into_iter().map(rerun).collect();
    let message = escape::control(r.reason.as_deref().unwrap_or(r.verdict.as_str())).into_owned();
    let status = match r.verdict {
        Verdict::Pass => TestCaseStatus::Success { flaky_runs: reruns },
        Verdict::Skipped => {
            let mut s = TestCaseStatus::skipped();
            s.set_message(message);
            s
        }
        v => {
            let kind = if v == Verdict::Fail {
                NonSuccessKind::Failure
            } else {
                NonSuccessKind::Error
            };
            let mut s = TestCaseStatus::non_success(kind);
            s.set_message(message);
            s.set_type(v.as_str());
            s.add_reruns(reruns);
            s.set_rerun_kind(FlakyOrRerun::Rerun);
            s
        }
    };
    let mut c = TestCase::new(escape::control(&r.id).as_ref(), status);
    c.set_classname(r.node.as_str());
    c.set_time(Duration::from_secs_f64(r.seconds));
    let warnings = r.warnings();
    if !warnings.is_empty() {
        // Dashboards show properties and system-out beside a passing case, so a warn row is
        // seen there too.
        c.add_property(("warn", warnings.len().to_string().as_str()));
        let text: Vec<String> = warnings
            .iter()
            .map(|w| {
                let m = w.message.as_deref().unwrap_or("");
                escape::control(&format!("warn {}: {m}", w.check)).into_owned()
            })
            .collect();
        c.set_system_out(text.join("\n"));
    }
    c
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attempt(n: u32, rep: u32, outcome: Verdict) -> AttemptRecord {
        AttemptRecord {
            n,
            rep,
            start: String::new(),
            seconds: 0.1,
            exit: None,
            signal: None,
            outcome,
            reason: None,
            artifacts: Vec::new(),
            gpu_health: Vec::new(),
        }
    }

    #[test]
    fn retried_attempts_are_the_ones_followed_within_their_rep() {
        let mut r: NodeReceipt = serde_json::from_value(serde_json::json!({
            "schema": 1, "id": "a[x=1]", "node": "a", "kind": "arm", "slug": "s", "cell": {}, "argv": [],
            "cwd": "/", "env": {}, "binaries": [], "inputs": "", "gpus": [], "attempts": [],
            "verdict": "pass", "expect": "pass", "reason": null, "checks": [], "doors": null,
            "artifacts": [], "compare": null, "seconds": 1.0
        }))
        .unwrap();
        r.attempts = vec![
            attempt(1, 1, Verdict::Crash),
            attempt(2, 1, Verdict::Pass),
            attempt(3, 2, Verdict::Pass),
        ];
        let ids: Vec<u32> = retried(&r).iter().map(|a| a.n).collect();
        assert_eq!(ids, [1]);
        let xml = case(&r);
        let mut suite = TestSuite::new("s");
        suite.add_test_case(xml);
        let mut report = Report::new("r");
        report.add_test_suite(suite);
        let text = report.to_string().unwrap();
        assert!(text.contains("flakyError"), "{text}");
        assert!(text.contains("classname=\"a\""), "{text}");
    }
}
