//! The gate protocol of DESIGN §5, seen from the orchestrator: a gate's `checks.jsonl`
//! read for a receipt (line by line, keeping at most what a receipt stores, nested keys
//! sorted so receipts diff cleanly), stdout scanned line by line for text verdicts, and
//! how an attempt ended (exit status, timeout, cancellation, check rows, text verdict
//! regexes) turned into one outcome with a reason.
//!
//! It owns the judging rules and the receipt's view of the rows only. The rows, their
//! reader and the exit codes are `memra-protocol`'s, shared with every gate; spawning
//! processes is the executor's job and aggregating attempts into a node verdict (reps,
//! retries, `expect`) is the cell runner's.

use std::collections::BTreeMap;
use std::io::{BufRead, Read};
use std::path::Path;

use memra_protocol::{EXIT_FAIL, EXIT_PASS};
use serde_json::Value;

use crate::plan::TextVerdict;
use crate::words::verdict::Verdict;

/// The row types and the report are the protocol crate's; the orchestrator has always
/// called the status `CheckStatus`.
pub use memra_protocol::{CheckRow, GateReport, Status as CheckStatus};

/// The check rows a receipt keeps of one attempt; later rows are counted, not kept.
pub const MAX_ROWS: usize = 10_000;
/// The bytes of checks lines whose rows a receipt keeps: rows past it are counted, not kept,
/// so a few huge rows cannot fill memory either.
pub const MAX_KEPT_BYTES: usize = 4 << 20;
/// The longest message a kept row keeps (in bytes; the rest is clipped, saying so).
pub const MAX_MESSAGE: usize = 4096;
/// The longest line read of `checks.jsonl` or of stdout. A longer checks line is a protocol
/// problem; a longer stdout line is matched as pieces of this length.
pub const MAX_LINE: usize = 1 << 20;
/// The problems a report keeps; later ones are counted in one last problem.
pub const MAX_PROBLEMS: usize = 100;
/// The keys the merged doors row keeps; a gate that names more breaks the protocol.
pub const MAX_DOOR_KEYS: usize = 1000;
/// The check name of the row that says rows were dropped.
pub const DROPPED_CHECK: &str = "memra-orch.dropped-rows";
/// The metric of the dropped-rows row counting failing rows dropped whose check name no kept
/// row has: a canary (`expect_fail`) cannot tell what failed then, and says so.
pub const LOST_FAIL_NAMES: &str = "fail_unnamed";
/// Failing rows of distinct check names kept past the caps, so `expect_fail` sees the name
/// of every check that failed.
pub const MAX_EXTRA_FAIL_NAMES: usize = 1000;

/// Reads an attempt's checks file line by line, keeping what the receipt stores (the first
/// [`MAX_ROWS`] rows within [`MAX_KEPT_BYTES`], messages clipped to [`MAX_MESSAGE`], plus
/// the first failing row wherever it is, so judging sees it) and counting the rest in one
/// last `warn` row named [`DROPPED_CHECK`]. Nested keys are sorted for the receipt. A
/// missing file is an empty report (the gate wrote no rows); a checks file that is a link
/// or not a regular file is a protocol problem naming it, never followed or read.
pub fn read_checks(path: &Path) -> GateReport {
    let file = match crate::gate::attempt_file::open_path(path) {
        Ok(f) => f,
        Err(crate::gate::attempt_file::OpenError::NotFound { .. }) => return GateReport::default(),
        Err(e) => {
            return GateReport {
                problems: vec![e.to_string()],
                ..GateReport::default()
            };
        }
    };
    let mut reader = std::io::BufReader::with_capacity(1 << 16, file);
    let mut acc = Rows::default();
    let mut line = Vec::new();
    let mut n = 0;
    loop {
        n += 1;
        match read_line(&mut reader, &mut line, MAX_LINE) {
            Ok(Line::End) => break,
            Ok(Line::Whole) => acc.add(n, &String::from_utf8_lossy(&line)),
            Ok(Line::Clipped) => acc.problem(format!(
                "checks.jsonl line {n}: longer than {} MiB; a check row is one short JSON \
                 object a line",
                MAX_LINE >> 20
            )),
            Err(e) => {
                acc.problem(format!("{}: cannot read: {e}", path.display()));
                break;
            }
        }
    }
    for_receipt(acc.finish())
}

/// Parses JSON-lines check output as [`read_checks`] reads a file, with every nested
/// object's keys sorted for the receipt. Blank lines are ignored.
pub fn parse_checks(text: &str) -> GateReport {
    let mut acc = Rows::default();
    for (i, line) in text.lines().enumerate() {
        acc.add(i + 1, line);
    }
    for_receipt(acc.finish())
}

/// A report being read, with what was dropped from it.
#[derive(Default)]
struct Rows {
    report: GateReport,
    kept_bytes: usize,
    /// Rows not kept, per status (`pass`, `fail`, `warn`, `skip`).
    dropped: BTreeMap<String, u64>,
    more_problems: u64,
    /// No more rows are kept (but the first failing one).
    full: bool,
    /// A failing row is among the kept ones.
    kept_fail: bool,
    /// The check names of the kept failing rows.
    failed_names: std::collections::HashSet<String>,
    /// Failing rows kept past the caps for their new check name.
    extra_fails: usize,
    /// Failing rows dropped whose check name no kept row has.
    lost_fail_names: u64,
    /// The doors rows named more than [`MAX_DOOR_KEYS`] keys (said once).
    too_many_doors: bool,
}

impl Rows {
    fn add(&mut self, n: usize, line: &str) {
        let rows = self.report.checks.len();
        self.report.add_line(n, line);
        if self.report.problems.len() > MAX_PROBLEMS {
            self.report.problems.truncate(MAX_PROBLEMS);
            self.more_problems += 1;
        }
        if let Some(doors) = &mut self.report.doors
            && doors.len() > MAX_DOOR_KEYS
        {
            while doors.len() > MAX_DOOR_KEYS {
                doors.pop_last();
            }
            if !self.too_many_doors {
                self.too_many_doors = true;
                self.problem(format!(
                    "checks.jsonl line {n}: the doors rows name more than {MAX_DOOR_KEYS} keys; \
                     a doors row names the code paths a gate ran, a handful of keys"
                ));
            }
        }
        if self.report.checks.len() == rows {
            return;
        }
        // Once full, later rows are dropped even if they are small: the receipt keeps a
        // prefix of the file, plus the first failing row wherever it comes, since the
        // verdict's reason and the consistency rule read it.
        self.full = self.full || rows >= MAX_ROWS || self.kept_bytes + line.len() > MAX_KEPT_BYTES;
        let row = self.report.checks.last_mut().expect("a row was added");
        let failed = row.status == CheckStatus::Fail;
        let first_fail = failed && !self.kept_fail;
        let new_name = failed && !self.failed_names.contains(&row.check);
        self.kept_fail |= failed;
        // A failing row of a check not yet seen failing is kept past the caps too (up to
        // a bound), so the receipt names every check that failed.
        let keep_name = new_name && self.full && self.extra_fails < MAX_EXTRA_FAIL_NAMES;
        if keep_name {
            self.extra_fails += 1;
        }
        if self.full && !first_fail && !keep_name {
            let row = self.report.checks.pop().expect("a row was added");
            if new_name {
                self.lost_fail_names += 1;
            }
            let status = serde_json::to_value(row.status).unwrap_or_default();
            *self
                .dropped
                .entry(status.as_str().unwrap_or("?").to_string())
                .or_default() += 1;
            return;
        }
        if failed {
            self.failed_names.insert(row.check.clone());
        }
        if let Some(m) = &mut row.message
            && m.len() > MAX_MESSAGE
        {
            let total = m.len();
            let mut end = MAX_MESSAGE;
            while !m.is_char_boundary(end) {
                end -= 1;
            }
            m.truncate(end);
            m.push_str(&format!("… [clipped: {total} bytes]"));
        }
        self.kept_bytes += line.len();
    }

    fn problem(&mut self, p: String) {
        if self.report.problems.len() < MAX_PROBLEMS {
            self.report.problems.push(p);
        } else {
            self.more_problems += 1;
        }
    }

    fn finish(mut self) -> GateReport {
        if self.more_problems > 0 {
            self.report
                .problems
                .push(format!("… and {} more problems", self.more_problems));
        }
        let dropped: u64 = self.dropped.values().sum();
        if dropped > 0 {
            let per: Vec<String> = self
                .dropped
                .iter()
                .map(|(k, v)| format!("{v} {k}"))
                .collect();
            let mut metrics: BTreeMap<String, Value> = self
                .dropped
                .iter()
                .map(|(k, v)| (k.clone(), Value::from(*v)))
                .collect();
            metrics.insert("dropped".into(), Value::from(dropped));
            metrics.insert("kept".into(), Value::from(self.report.checks.len() as u64));
            if self.lost_fail_names > 0 {
                metrics.insert(LOST_FAIL_NAMES.into(), Value::from(self.lost_fail_names));
            }
            self.report.checks.push(CheckRow {
                check: DROPPED_CHECK.to_string(),
                status: CheckStatus::Warn,
                metrics,
                message: Some(format!(
                    "{dropped} check rows were not kept in the receipt ({}); the receipt keeps \
                     the first {MAX_ROWS} rows (within {} MiB) and the first failing one, and \
                     checks.jsonl in the attempt folder has them all",
                    per.join(", "),
                    MAX_KEPT_BYTES >> 20
                )),
                first_mismatch: None,
                extra: BTreeMap::new(),
            });
        }
        self.report
    }
}

/// How reading one line ended.
#[derive(Debug, PartialEq, Eq)]
enum Line {
    /// A line (without its newline) is in the buffer.
    Whole,
    /// The line was longer than the limit: its first `max` bytes are in the buffer and the
    /// rest was skipped.
    Clipped,
    /// End of file, nothing read.
    End,
}

/// Reads one line into `buf` holding at most `max` bytes of it, whatever the line's length.
fn read_line(r: &mut impl BufRead, buf: &mut Vec<u8>, max: usize) -> std::io::Result<Line> {
    buf.clear();
    let mut clipped = false;
    let mut any = false;
    loop {
        let chunk = r.fill_buf()?;
        if chunk.is_empty() {
            return Ok(match (any, clipped) {
                (false, _) => Line::End,
                (true, true) => Line::Clipped,
                (true, false) => Line::Whole,
            });
        }
        any = true;
        let (part, used, done) = match chunk.iter().position(|&b| b == b'\n') {
            Some(i) => (&chunk[..i], i + 1, true),
            None => (chunk, chunk.len(), false),
        };
        let room = max.saturating_sub(buf.len());
        if part.len() > room {
            clipped = true;
        }
        buf.extend_from_slice(&part[..part.len().min(room)]);
        r.consume(used);
        if done {
            return Ok(if clipped { Line::Clipped } else { Line::Whole });
        }
    }
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

/// Judges one attempt (DESIGN §4–5). `text` is what [`judge_text`] found in stdout, for a
/// node with a text verdict.
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
    text: Option<(Verdict, Option<String>)>,
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
    if let Some((t, why)) = text
        && t > outcome
    {
        outcome = t;
        reason = why;
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
/// Stdout is read line by line (a line longer than [`MAX_LINE`] is matched as pieces of
/// that length), so its size does not matter; unreadable stdout reads as empty.
pub fn judge_text(tv: &TextVerdict, stdout: impl Read) -> (Verdict, Option<String>) {
    let mut reader = std::io::BufReader::with_capacity(1 << 16, stdout);
    let mut buf = Vec::new();
    let mut passed = false;
    // An unreadable rest of stdout ends the scan like its end would.
    while let Ok(true) = read_piece(&mut reader, &mut buf, MAX_LINE) {
        let line = String::from_utf8_lossy(&buf);
        if let Some(fail) = &tv.fail
            && fail.is_match(&line)
        {
            return (
                Verdict::Fail,
                Some(format!(
                    "stdout line matched verdict.fail /{fail}/: {}",
                    clip(&line)
                )),
            );
        }
        if !passed && let Some(pass) = &tv.pass {
            passed = pass.is_match(&line);
        }
    }
    match &tv.pass {
        Some(pass) if !passed => (
            Verdict::Fail,
            Some(format!("no stdout line matched verdict.pass /{pass}/")),
        ),
        _ => (Verdict::Pass, None),
    }
}

/// Judges an attempt's stdout file by [`judge_text`]; a stdout.log that is a link or not a
/// regular file is an error naming it, never followed or read.
pub fn judge_text_file(tv: &TextVerdict, path: &Path) -> (Verdict, Option<String>) {
    match crate::gate::attempt_file::open_path(path) {
        Ok(f) => judge_text(tv, f),
        Err(crate::gate::attempt_file::OpenError::NotFound { .. }) => {
            judge_text(tv, std::io::empty())
        }
        Err(e) => (Verdict::Error, Some(format!("protocol error: {e}"))),
    }
}

/// Reads the next piece of a line: up to `max` bytes, ending at a newline (not kept) or
/// after `max` bytes (the line goes on in the next piece). `false` at the end of input.
fn read_piece(r: &mut impl BufRead, buf: &mut Vec<u8>, max: usize) -> std::io::Result<bool> {
    buf.clear();
    loop {
        let chunk = r.fill_buf()?;
        if chunk.is_empty() {
            return Ok(!buf.is_empty());
        }
        let room = max - buf.len();
        let window = &chunk[..chunk.len().min(room)];
        if let Some(i) = window.iter().position(|&b| b == b'\n') {
            buf.extend_from_slice(&window[..i]);
            r.consume(i + 1);
            return Ok(true);
        }
        let n = window.len();
        buf.extend_from_slice(window);
        r.consume(n);
        if buf.len() >= max {
            return Ok(true);
        }
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
                Some(judge_text(&tv, out.as_bytes())),
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
        assert_eq!(judge_text(&fail_only, "fine\n".as_bytes()).0, Verdict::Pass);
    }

    #[test]
    fn rows_past_the_cap_are_counted_and_the_first_failure_kept() {
        let mut text = String::new();
        for i in 0..MAX_ROWS + 5 {
            text.push_str(&format!("{{\"check\":\"c{i}\",\"status\":\"pass\"}}\n"));
        }
        text.push_str(FAIL_ROW);
        text.push('\n');
        text.push_str(FAIL_ROW);
        let r = parse_checks(&text);
        assert!(r.problems.is_empty(), "{:?}", r.problems);
        // The kept prefix, the first failing row, and the row saying what was dropped.
        assert_eq!(r.checks.len(), MAX_ROWS + 2);
        assert_eq!(r.checks[MAX_ROWS].check, "gate3");
        assert_eq!(r.first_failed().unwrap().check, "gate3");
        let note = r.checks.last().unwrap();
        assert_eq!(note.check, DROPPED_CHECK);
        assert_eq!(note.status, CheckStatus::Warn);
        assert_eq!(note.metrics["dropped"], serde_json::json!(6));
        assert_eq!(note.metrics["pass"], serde_json::json!(5));
        assert_eq!(note.metrics["fail"], serde_json::json!(1));
        assert!(
            note.message
                .as_deref()
                .unwrap()
                .contains("6 check rows were not kept")
        );
        // Judging still sees the failure: exit 1 with a fail row is a consistent fail.
        assert_eq!(
            judge(ProcessEnd::Exited(1), Stopped::No, &r, None).outcome,
            Verdict::Fail
        );
    }

    #[test]
    fn long_messages_are_clipped_and_long_lines_are_problems() {
        let long = "x".repeat(MAX_MESSAGE * 2);
        let r = parse_checks(&format!(
            "{{\"check\":\"a\",\"status\":\"pass\",\"message\":\"{long}\"}}"
        ));
        let m = r.checks[0].message.as_deref().unwrap();
        assert!(m.len() < MAX_MESSAGE + 64, "{}", m.len());
        assert!(
            m.ends_with(&format!("[clipped: {} bytes]", MAX_MESSAGE * 2)),
            "{m}"
        );
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("checks.jsonl");
        let huge = "y".repeat(MAX_LINE + 10);
        std::fs::write(&path, format!("{PASS_ROW}\n{huge}\n{FAIL_ROW}\n")).unwrap();
        let r = read_checks(&path);
        assert_eq!(r.checks.len(), 2);
        assert_eq!(r.problems.len(), 1, "{:?}", r.problems);
        assert!(r.problems[0].starts_with("checks.jsonl line 2: longer than 1 MiB"));
    }

    #[test]
    fn doors_rows_keep_a_bounded_number_of_keys() {
        let mut text = String::new();
        for i in 0..MAX_DOOR_KEYS + 10 {
            text.push_str(&format!("{{\"doors\":{{\"k{i:05}\":1}}}}\n"));
        }
        let r = parse_checks(&text);
        assert_eq!(r.doors.unwrap().len(), MAX_DOOR_KEYS);
        assert_eq!(r.problems.len(), 1, "{:?}", r.problems);
        assert!(r.problems[0].contains("more than 1000 keys"));
    }

    #[test]
    fn a_linked_checks_file_is_a_problem_and_never_read() {
        let dir = tempfile::tempdir().unwrap();
        let outside = dir.path().join("outside.jsonl");
        std::fs::write(&outside, format!("{PASS_ROW}\n")).unwrap();
        let attempt = dir.path().join("attempt-1");
        std::fs::create_dir(&attempt).unwrap();
        std::os::unix::fs::symlink(&outside, attempt.join("checks.jsonl")).unwrap();
        let r = read_checks(&attempt.join("checks.jsonl"));
        assert!(r.checks.is_empty());
        assert_eq!(r.problems.len(), 1);
        assert!(
            r.problems[0].contains("is a symbolic link"),
            "{}",
            r.problems[0]
        );
        let j = judge(ProcessEnd::Exited(0), Stopped::No, &r, None);
        assert_eq!((j.outcome, j.protocol_error), (Verdict::Error, true));
    }

    #[test]
    fn stdout_lines_longer_than_the_limit_are_matched_in_pieces() {
        let tv = TextVerdict {
            pass: Some(Regex::new("^ALL GREEN").unwrap()),
            fail: None,
        };
        let out = format!("{}ALL GREEN\n", "z".repeat(MAX_LINE));
        assert_eq!(judge_text(&tv, out.as_bytes()).0, Verdict::Pass);
        let mut buf = Vec::new();
        let mut r = std::io::BufReader::new("ab\ncd".as_bytes());
        assert_eq!(read_line(&mut r, &mut buf, 1).unwrap(), Line::Clipped);
        assert_eq!(buf, b"a");
        assert_eq!(read_line(&mut r, &mut buf, 8).unwrap(), Line::Whole);
        assert_eq!(buf, b"cd");
        assert_eq!(read_line(&mut r, &mut buf, 8).unwrap(), Line::End);
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
