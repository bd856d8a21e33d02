//! Round trips of every row kind through the writer and the reader, the exact bytes of the
//! wire format, and the reader's located errors.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};

use serde_json::{Value, json};

use crate::*;

/// A fresh checks-file path under the system's temporary folder, unique to this process and
/// call, so tests running in parallel never share a file.
fn scratch(name: &str) -> PathBuf {
    static N: AtomicUsize = AtomicUsize::new(0);
    let dir = std::env::temp_dir().join(format!(
        "memra-protocol-test-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

fn mismatch(step: Option<usize>, reference: f64, got: f64) -> FirstMismatch {
    FirstMismatch {
        step,
        row: 1,
        index: 811,
        reference,
        got,
    }
}

/// Writes `checks` and `doors` through a writer on a real file and reads the file back.
fn round_trip(checks: &[Check], doors: &[DoorsRow]) -> (String, GateReport) {
    let path = scratch("checks.jsonl");
    let mut w = ChecksWriter::new(Some(path.clone()));
    for d in doors {
        w.doors(d).unwrap();
    }
    for c in checks {
        w.check(c).unwrap();
    }
    let text = std::fs::read_to_string(&path).unwrap();
    let report = read_checks(&path);
    std::fs::remove_dir_all(path.parent().unwrap()).unwrap();
    (text, report)
}

#[test]
fn check_rows_of_every_status_round_trip() {
    let checks: Vec<Check> = [Status::Pass, Status::Fail, Status::Warn, Status::Skip]
        .into_iter()
        .enumerate()
        .map(|(i, status)| {
            let mut c = Check::new(format!("c{i}"), status, format!("message {i}"))
                .metric("compared", 49152)
                .metric("maxdiff", 0.5)
                .metric("policy", "bitwise");
            c.first_mismatch = Some(mismatch(Some(i), 1.25, 1.2500001));
            c
        })
        .collect();
    let (text, report) = round_trip(&checks, &[]);
    assert_eq!(text.lines().count(), 4);
    assert!(report.problems.is_empty(), "{:?}", report.problems);
    assert_eq!(report.checks.len(), 4);
    for (c, row) in checks.iter().zip(&report.checks) {
        assert_eq!(row.check, c.name);
        assert_eq!(row.status, c.status);
        let want: BTreeMap<String, Value> = c.metrics.clone().into_iter().collect();
        assert_eq!(row.metrics, want);
        assert_eq!(row.message.as_deref(), Some(c.message.as_str()));
        assert_eq!(row.mismatch(), c.first_mismatch);
        assert!(row.extra.is_empty(), "{:?}", row.extra);
    }
    assert_eq!(report.first_failed().unwrap().check, "c1");
    assert!(report.speaks_protocol());
    assert!(report.doors.is_none());
}

#[test]
fn a_bare_check_and_non_finite_mismatches_round_trip() {
    let bare = Check::new("bare", Status::Pass, "");
    let mut nan = Check::new("nan", Status::Fail, "");
    nan.first_mismatch = Some(mismatch(None, f64::INFINITY, f64::NAN));
    let (text, report) = round_trip(&[bare, nan], &[]);
    assert_eq!(
        text,
        "{\"check\":\"bare\",\"status\":\"pass\",\"metrics\":{},\"message\":\"\"}\n\
         {\"check\":\"nan\",\"status\":\"fail\",\"metrics\":{},\"message\":\"\",\
         \"first_mismatch\":{\"row\":1,\"index\":811,\"ref\":\"inf\",\"got\":\"NaN\"}}\n"
    );
    assert!(report.checks[0].metrics.is_empty());
    assert_eq!(report.checks[0].message.as_deref(), Some(""));
    assert_eq!(report.checks[0].first_mismatch, None);
    let m = report.checks[1].mismatch().unwrap();
    assert_eq!((m.step, m.row, m.index), (None, 1, 811));
    assert_eq!(m.reference, f64::INFINITY);
    assert!(m.got.is_nan());
}

#[test]
fn doors_rows_with_strings_numbers_and_booleans_round_trip_and_merge() {
    let first = DoorsRow::new()
        .with("backend", "cpu")
        .with("pp_stages", 2)
        .with("ratio", 0.5)
        .with("fa3", true);
    assert_eq!(first.problem(), None);
    let second = DoorsRow::new().with("backend", "cuda");
    let (text, report) = round_trip(&[], &[first, second]);
    assert_eq!(
        text,
        "{\"doors\":{\"backend\":\"cpu\",\"pp_stages\":2,\"ratio\":0.5,\"fa3\":true}}\n\
         {\"doors\":{\"backend\":\"cuda\"}}\n"
    );
    assert!(report.problems.is_empty(), "{:?}", report.problems);
    assert!(report.checks.is_empty());
    assert!(report.speaks_protocol());
    let doors = report.doors.unwrap();
    assert_eq!(doors["backend"], "cuda", "a later row wins");
    assert_eq!(doors["pp_stages"], 2);
    assert_eq!(doors["ratio"], 0.5);
    assert_eq!(doors["fa3"], true);
}

#[test]
fn the_wire_format_keeps_the_gates_key_order() {
    // Metrics keep the order they were added in; the fixed keys come first, in order.
    let mut c = Check::new("gate2", Status::Pass, "…")
        .metric("maxdiff", 0.0)
        .metric("compared", 49152);
    c.first_mismatch = Some(mismatch(Some(3), 1.25, 1.2500001));
    assert_eq!(
        c.to_json().to_string(),
        r#"{"check":"gate2","status":"pass","metrics":{"maxdiff":0.0,"compared":49152},"message":"…","first_mismatch":{"step":3,"row":1,"index":811,"ref":1.25,"got":1.2500001}}"#
    );
}

#[test]
fn without_a_file_the_writer_writes_nothing_but_still_counts() {
    let mut w = ChecksWriter::new(None);
    assert_eq!(w.path(), None);
    w.doors(&DoorsRow::new().with("backend", "cpu")).unwrap();
    w.check(&Check::new("a", Status::Pass, "")).unwrap();
    assert_eq!(w.outcome(), Outcome::Pass);
    w.check(&Check::new("b", Status::Fail, "")).unwrap();
    w.check(&Check::new("c", Status::Warn, "")).unwrap();
    assert_eq!(w.failures(), 1);
    assert_eq!(w.outcome(), Outcome::Fail);
    assert_eq!(w.outcome().code(), EXIT_FAIL);
    assert_eq!(Outcome::Pass.code(), EXIT_PASS);
}

#[test]
fn an_unwritable_checks_file_is_an_error_naming_it() {
    let dir = scratch("x");
    let path = dir.parent().unwrap().join("missing/checks.jsonl");
    let mut w = ChecksWriter::new(Some(path.clone()));
    let e = w.check(&Check::new("a", Status::Pass, "")).unwrap_err();
    assert_eq!(e.path, path);
    let text = e.to_string();
    assert!(text.starts_with(&format!("{}: cannot append a check row: ", path.display())));
    assert!(text.ends_with("; MEMRA_ORCH_CHECKS must name a writable file"));
}

#[test]
fn a_missing_file_is_an_empty_report_and_an_unreadable_one_a_problem() {
    let path = scratch("never-written.jsonl");
    let r = read_checks(&path);
    assert_eq!(r, GateReport::default());
    assert!(!r.speaks_protocol());
    let dir = path.parent().unwrap();
    let r = read_checks(dir);
    assert_eq!(r.problems.len(), 1);
    assert!(
        r.problems[0].starts_with(&format!("{}: cannot read: ", dir.display())),
        "{:?}",
        r.problems
    );
}

#[test]
fn malformed_lines_name_their_line() {
    let r = parse_checks(
        "{\"check\":\"a\",\"status\":\"pass\"}\n\
         not json\n\
         {\"check\":\"b\",\"status\":\"maybe\"}\n\
         {\"doors\":{\"x\":[1]}}\n\
         [1,2]\n\
         \n\
         {\"doors\":3}\n\
         {\"doors\":{\"y\":null}}\n\
         {\"status\":\"pass\"}",
    );
    assert_eq!(r.checks.len(), 1);
    assert_eq!(
        r.problems,
        [
            "checks.jsonl line 2: not JSON (expected ident at line 1 column 2)",
            "checks.jsonl line 3: not a check row (unknown variant `maybe`, expected one of \
             `pass`, `fail`, `warn`, `skip`); expected {\"check\":NAME,\"status\":\
             \"pass|fail|warn|skip\",…} or {\"doors\":{…}}",
            "checks.jsonl line 4: doors.x is [1]; door values must be strings, numbers or \
             booleans (a flat object)",
            "checks.jsonl line 5: not a JSON object",
            "checks.jsonl line 7: \"doors\" must be an object of strings, numbers and booleans",
            "checks.jsonl line 8: doors.y is null; door values must be strings, numbers or \
             booleans (a flat object)",
            "checks.jsonl line 9: not a check row (missing field `check`); expected \
             {\"check\":NAME,\"status\":\"pass|fail|warn|skip\",…} or {\"doors\":{…}}",
        ]
    );
    assert!(r.doors.is_none());
    assert!(r.speaks_protocol());
}

#[test]
fn rows_of_other_writers_keep_their_unknown_keys_and_shapes() {
    let r = parse_checks(
        r#"{"check":"x","status":"warn","elapsed_s":1.5,"first_mismatch":{"tensor":"logits","row":0}}"#,
    );
    assert!(r.problems.is_empty(), "{:?}", r.problems);
    let row = &r.checks[0];
    assert_eq!(row.message, None);
    assert_eq!(row.extra["elapsed_s"], 1.5);
    assert_eq!(
        row.first_mismatch,
        Some(json!({"tensor": "logits", "row": 0}))
    );
    assert_eq!(row.mismatch(), None);
    assert_eq!(r.first_failed(), None);
}

#[test]
fn a_nested_door_is_reported_before_it_is_written() {
    let d = DoorsRow::new()
        .with("backend", "cpu")
        .with("pp", json!({"stages": 2}));
    assert_eq!(
        d.problem().as_deref(),
        Some(
            "doors.pp is {\"stages\":2}; door values must be strings, numbers or booleans \
             (a flat object)"
        )
    );
}
