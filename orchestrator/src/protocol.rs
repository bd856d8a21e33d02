//! The gate protocol of DESIGN §5, seen from the orchestrator: a gate's `checks.jsonl`
//! read for a receipt (nested keys sorted, so receipts diff cleanly), and how an attempt
//! ended (exit status, timeout, cancellation, check rows, text verdict regexes) turned into
//! one outcome with a reason.
//!
//! It owns the judging rules and the receipt's view of the rows only. The rows, their
//! reader and the exit codes are `memra-protocol`'s, shared with every gate; spawning
//! processes is the executor's job and aggregating attempts into a node verdict (reps,
//! retries, `expect`) is the cell runner's.

use std::collections::BTreeMap;
use std::path::Path;

use memra_protocol::{EXIT_FAIL, EXIT_PASS};
use serde_json::Value;

use crate::plan::TextVerdict;
use crate::verdict::Verdict;

/// The row types and the report are the protocol crate's; the orchestrator has always
/// called the status `CheckStatus`.
pub use memra_protocol::{CheckRow, GateReport, Status as CheckStatus};

/// Reads a checks file as [`memra_protocol::read_checks`] does, with every nested object's
/// keys sorted for the receipt; a missing file is an empty report (the gate wrote no rows).
pub fn read_checks(path: &Path) -> GateReport {
    for_receipt(memra_protocol::read_checks(path))
}

/// Parses JSON-lines check output as [`memra_protocol::parse_checks`] does, with every
/// nested object's keys sorted for the receipt. Blank lines are ignored.
pub fn parse_checks(text: &str) -> GateReport {
    for_receipt(memra_protocol::parse_checks(text))
}

/// Sorts the keys inside every row's metrics, first mismatch and extra keys (the doors are
/// flat, and the maps themselves are sorted already).
fn for_receipt(mut report: GateReport) -> GateReport {
    for row in &mut report.checks {
        let sort_values = |m: &mut BTreeMap<String, Value>| {
            for v in m.values_mut() {
                *v = sorted(std::mem::take(v));
            }
        };
        sort_values(&mut row.metrics);
        sort_values(&mut row.extra);
        row.first_mismatch = row.first_mismatch.take().map(sorted);
    }
    report
}

/// Rebuilds a JSON value with every object's keys sorted, so receipts diff cleanly whatever
/// order a gate wrote them in.
pub fn sorted(value: Value) -> Value {
    match value {
        Value::Object(obj) => {
            let mut entries: Vec<(String, Value)> = obj.into_iter().collect();
            entries.sort_by(|a, b| a.0.cmp(&b.0));
            Value::Object(entries.into_iter().map(|(k, v)| (k, sorted(v))).collect())
        }
        Value::Array(items) => Value::Array(items.into_iter().map(sorted).collect()),
        other => other,
    }
}

/// How the process of an attempt ended, as the executor saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProcessEnd {
    Exited(i32),
    Signaled(i32),
    /// The program could not be started at all (the reason travels separately).
    NotStarted,
}

/// Why the executor stopped an attempt, if it did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stopped {
    No,
    Timeout,
    Cancelled,
}

/// The outcome of one attempt before `expect` is applied, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Judgement {
    pub outcome: Verdict,
    pub reason: Option<String>,
    /// The outcome is a protocol violation: retrying would only repeat it.
    pub protocol_error: bool,
}

/// Judges one attempt (DESIGN §4–5).
///
/// Stopping wins (timeout, cancelled); then a signal or an exit code outside {0, 1} is a
/// crash; then exit 0/1 is pass/fail, made worse by a text verdict when the node has one.
/// A gate that writes check rows is held to the consistency rule: exit 0 with a fail row,
/// or exit 1 without one, is a protocol error, and so is a malformed checks line. The
/// verdict is the worse of the two, and `error` is worse than both pass and fail.
pub fn judge(
    end: ProcessEnd,
    stopped: Stopped,
    report: &GateReport,
    text: Option<(&TextVerdict, &str)>,
) -> Judgement {
    let plain = |outcome, reason: Option<String>| Judgement {
        outcome,
        reason,
        protocol_error: false,
    };
    match stopped {
        Stopped::Cancelled => {
            return plain(
                Verdict::Cancelled,
                Some("cancelled: the run was interrupted".into()),
            );
        }
        Stopped::Timeout => return plain(Verdict::Timeout, None),
        Stopped::No => {}
    }
    let code = match end {
        ProcessEnd::NotStarted => return plain(Verdict::Error, None),
        ProcessEnd::Signaled(sig) => {
            return plain(
                Verdict::Crash,
                Some(format!("killed by signal {sig} ({})", signal_name(sig))),
            );
        }
        ProcessEnd::Exited(c) if c != EXIT_PASS && c != EXIT_FAIL => {
            return plain(
                Verdict::Crash,
                Some(format!("exit code {c} (gates exit 0 for pass, 1 for fail)")),
            );
        }
        ProcessEnd::Exited(c) => c,
    };
    let mut outcome = if code == EXIT_PASS {
        Verdict::Pass
    } else {
        Verdict::Fail
    };
    let mut reason = if code == EXIT_FAIL {
        report
            .first_failed()
            .map(|c| match &c.message {
                Some(m) => format!("check {} failed: {m}", c.check),
                None => format!("check {} failed", c.check),
            })
            .or_else(|| Some("exit code 1".to_string()))
    } else {
        None
    };
    if let Some((tv, stdout)) = text {
        let (t, why) = judge_text(tv, stdout);
        if t > outcome {
            outcome = t;
            reason = why;
        }
    }
    if !report.problems.is_empty() {
        return Judgement {
            outcome: Verdict::Error,
            reason: Some(format!("protocol error: {}", report.problems.join("; "))),
            protocol_error: true,
        };
    }
    if report.speaks_protocol() {
        let failed = report.first_failed();
        let violation = match (code, failed) {
            (EXIT_PASS, Some(row)) => Some(format!(
                "protocol error: exit 0 (pass) but check {} reported fail",
                row.check
            )),
            (EXIT_FAIL, None) => {
                Some("protocol error: exit 1 (fail) but no check row reported fail".to_string())
            }
            _ => None,
        };
        if let Some(v) = violation {
            return Judgement {
                outcome: Verdict::Error,
                reason: Some(v),
                protocol_error: true,
            };
        }
    }
    Judgement {
        outcome,
        reason,
        protocol_error: false,
    }
}

/// Judges stdout against text verdict regexes: a line matching `fail` makes it fail; with a
/// `pass` regex, some line must match it; with only a `fail` regex, no match is a pass.
pub fn judge_text(tv: &TextVerdict, stdout: &str) -> (Verdict, Option<String>) {
    if let Some(fail) = &tv.fail
        && let Some(line) = stdout.lines().find(|l| fail.is_match(l))
    {
        return (
            Verdict::Fail,
            Some(format!(
                "stdout line matched verdict.fail /{fail}/: {}",
                clip(line)
            )),
        );
    }
    match &tv.pass {
        Some(pass) if !stdout.lines().any(|l| pass.is_match(l)) => (
            Verdict::Fail,
            Some(format!("no stdout line matched verdict.pass /{pass}/")),
        ),
        _ => (Verdict::Pass, None),
    }
}

fn clip(s: &str) -> String {
    const MAX: usize = 200;
    if s.len() <= MAX {
        return s.to_string();
    }
    let mut end = MAX;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}

/// The conventional name of a signal number.
pub fn signal_name(sig: i32) -> &'static str {
    match sig {
        libc::SIGHUP => "SIGHUP",
        libc::SIGINT => "SIGINT",
        libc::SIGQUIT => "SIGQUIT",
        libc::SIGILL => "SIGILL",
        libc::SIGTRAP => "SIGTRAP",
        libc::SIGABRT => "SIGABRT",
        libc::SIGBUS => "SIGBUS",
        libc::SIGFPE => "SIGFPE",
        libc::SIGKILL => "SIGKILL",
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGPIPE => "SIGPIPE",
        libc::SIGALRM => "SIGALRM",
        libc::SIGTERM => "SIGTERM",
        _ => "signal",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use regex::Regex;

    const PASS_ROW: &str = r#"{"check":"gate2","status":"pass","metrics":{"maxdiff":0.0}}"#;
    const FAIL_ROW: &str = r#"{"check":"gate3","status":"fail","message":"row 1 differs"}"#;

    fn judge_exit(code: i32, checks: &str) -> Judgement {
        judge(
            ProcessEnd::Exited(code),
            Stopped::No,
            &parse_checks(checks),
            None,
        )
    }

    #[test]
    fn parses_checks_and_merges_doors() {
        let text = format!(
            "{PASS_ROW}\n\n{{\"doors\":{{\"backend\":\"cpu\",\"pp_stages\":1}}}}\n{{\"doors\":{{\"backend\":\"cuda\"}}}}\n"
        );
        let r = parse_checks(&text);
        assert!(r.problems.is_empty(), "{:?}", r.problems);
        assert_eq!(r.checks.len(), 1);
        assert_eq!(r.checks[0].metrics["maxdiff"], serde_json::json!(0.0));
        let doors = r.doors.unwrap();
        assert_eq!(doors["backend"], "cuda");
        assert_eq!(doors["pp_stages"], 1);
    }

    #[test]
    fn malformed_lines_name_their_line() {
        let r = parse_checks(
            "{\"check\":\"a\",\"status\":\"pass\"}\nnot json\n{\"check\":\"b\",\"status\":\"maybe\"}\n{\"doors\":{\"x\":[1]}}",
        );
        assert_eq!(r.problems.len(), 3, "{:?}", r.problems);
        assert!(r.problems[0].starts_with("checks.jsonl line 2: not JSON"));
        assert!(r.problems[1].starts_with("checks.jsonl line 3: not a check row"));
        assert!(r.problems[2].contains("doors.x"));
        let j = judge(ProcessEnd::Exited(0), Stopped::No, &r, None);
        assert_eq!(j.outcome, Verdict::Error);
        assert!(j.protocol_error);
    }

    #[test]
    fn exit_codes_map_to_outcomes() {
        assert_eq!(judge_exit(0, "").outcome, Verdict::Pass);
        assert_eq!(judge_exit(1, "").outcome, Verdict::Fail);
        assert_eq!(judge_exit(2, "").outcome, Verdict::Crash);
        let sig = judge(
            ProcessEnd::Signaled(11),
            Stopped::No,
            &GateReport::default(),
            None,
        );
        assert_eq!(sig.outcome, Verdict::Crash);
        assert!(sig.reason.unwrap().contains("SIGSEGV"));
    }

    #[test]
    fn consistent_protocol_gates_pass_and_fail() {
        assert_eq!(judge_exit(0, PASS_ROW).outcome, Verdict::Pass);
        let f = judge_exit(1, &format!("{PASS_ROW}\n{FAIL_ROW}"));
        assert_eq!(f.outcome, Verdict::Fail);
        assert_eq!(
            f.reason.as_deref(),
            Some("check gate3 failed: row 1 differs")
        );
    }

    #[test]
    fn inconsistent_gates_are_protocol_errors() {
        let a = judge_exit(0, FAIL_ROW);
        assert_eq!(a.outcome, Verdict::Error);
        assert!(a.protocol_error);
        assert!(
            a.reason
                .unwrap()
                .contains("exit 0 (pass) but check gate3 reported fail")
        );
        let b = judge_exit(1, PASS_ROW);
        assert_eq!(b.outcome, Verdict::Error);
        assert!(b.reason.unwrap().contains("no check row reported fail"));
    }

    #[test]
    fn stopping_wins_over_exit_status() {
        let r = GateReport::default();
        assert_eq!(
            judge(ProcessEnd::Signaled(15), Stopped::Timeout, &r, None).outcome,
            Verdict::Timeout
        );
        assert_eq!(
            judge(ProcessEnd::Exited(0), Stopped::Cancelled, &r, None).outcome,
            Verdict::Cancelled
        );
    }

    #[test]
    fn text_verdicts() {
        let tv = TextVerdict {
            pass: Some(Regex::new("^ALL GREEN").unwrap()),
            fail: Some(Regex::new("FAIL").unwrap()),
        };
        let j = |out: &str, code| {
            judge(
                ProcessEnd::Exited(code),
                Stopped::No,
                &GateReport::default(),
                Some((&tv, out)),
            )
        };
        assert_eq!(j("warming up\nALL GREEN\n", 0).outcome, Verdict::Pass);
        let f = j("case 3 FAIL\nALL GREEN\n", 0);
        assert_eq!(f.outcome, Verdict::Fail);
        assert!(f.reason.unwrap().contains("case 3 FAIL"));
        assert_eq!(j("nothing to see\n", 0).outcome, Verdict::Fail);
        assert_eq!(j("ALL GREEN\n", 1).outcome, Verdict::Fail);
        assert_eq!(j("ALL GREEN\n", 3).outcome, Verdict::Crash);
        let fail_only = TextVerdict {
            pass: None,
            fail: Some(Regex::new("FAIL").unwrap()),
        };
        assert_eq!(judge_text(&fail_only, "fine\n").0, Verdict::Pass);
    }

    #[test]
    fn sorted_orders_nested_keys() {
        let v: Value = serde_json::from_str(r#"{"b":1,"a":{"d":1,"c":[{"z":0,"y":0}]}}"#).unwrap();
        assert_eq!(
            serde_json::to_string(&sorted(v)).unwrap(),
            r#"{"a":{"c":[{"y":0,"z":0}],"d":1},"b":1}"#
        );
    }
}
