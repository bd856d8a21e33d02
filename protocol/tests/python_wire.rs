//! The Python gate library (`protocol/python`, imported as `memra_gate`) against this crate:
//! the rows Python writes are the bytes [`ChecksWriter`] writes for the same rows and read
//! back field by field, and the rows written here are read back by Python's reader.
//!
//! Both tests run `python3` on `protocol/python/tests/wire_fixture.py` with `PYTHONPATH`
//! on the library's sources; its rows and its reader need the standard library alone. A
//! machine without `python3` fails these tests, naming it, rather than skipping them.

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::fs::OpenOptions;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use memra_protocol::{
    Check, CheckRow, ChecksWriter, DoorsRow, EXIT_FAIL, FirstMismatch, Status, read_checks,
};
use serde_json::{Map, Value, json};

/// Escapes and non-ASCII text in one string (the fixture's `LABEL`).
const LABEL: &str = "ünï \"q\" \\ \t 模型 ✓";
/// A variable the fixture reads through `gate.env`, set for it to `on`.
const PIN: &str = "MEMRA_WIRE_TEST_PIN";
/// A variable the fixture reads through `gate.env`, unset for it.
const UNSET: &str = "MEMRA_WIRE_TEST_UNSET";

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// A fresh folder for one test, unique to this process and test.
fn scratch(test: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("memra-python-wire-{}-{test}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Runs the fixture with `args` and the extra variables `envs`, in an environment without
/// the orchestrator's variables (this test may itself run under memra-orch).
fn fixture(args: &[&OsStr], envs: &[(&str, &OsStr)]) -> Output {
    let root = workspace();
    let mut cmd = Command::new("python3");
    cmd.arg(root.join("protocol/python/tests/wire_fixture.py"))
        .args(args)
        .env("PYTHONPATH", root.join("protocol/python/src"))
        // No __pycache__ in the work tree: it would change a gate's code identity.
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .env("PYTHONIOENCODING", "utf-8")
        .env_remove("MEMRA_ORCH_CHECKS")
        .env_remove("MEMRA_ORCH_ARTIFACTS")
        .env_remove(PIN)
        .env_remove(UNSET);
    for (k, v) in envs {
        cmd.env(k, v);
    }
    match cmd.output() {
        Ok(out) => out,
        Err(e) => panic!(
            "cannot run python3 ({e}): the Python wire tests need python3 (3.9 or newer) on \
             PATH; install it (apt-get install python3)"
        ),
    }
}

fn describe(out: &Output) -> String {
    format!(
        "python3 exited with {}\n--- stdout\n{}\n--- stderr\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn mismatch(
    step: Option<usize>,
    row: usize,
    index: usize,
    reference: f64,
    got: f64,
) -> FirstMismatch {
    FirstMismatch {
        step,
        row,
        index,
        reference,
        got,
    }
}

/// The check rows, in the order the fixture writes them.
///
/// The floats cover each form of serde_json's float text: plain (`0.5`, `0.0`,
/// `1.2500001`), plain below 1e-4 (`0.00001`, which Python's own `json` writes `1e-05`),
/// negative exponent (`1e-7`, Python's `1e-07`) and positive exponent (`2.5e+20`). The
/// Python writer formats floats as serde_json does, so the files are compared byte for
/// byte; should serde_json ever change its float text, the byte comparison fails here
/// first, and the parsed comparison below still holds.
fn checks() -> Vec<Check> {
    let sum = Check::new("sum", Status::Pass, "1 + 2 + 3 = 6")
        .metric("compared", 3)
        .metric("maxdiff", 0.0)
        .metric("ratio", 0.5)
        .metric("scale", 1.25)
        .metric("small", 1e-7)
        .metric("tiny", 0.00001)
        .metric("big", 2.5e20)
        .metric("policy", "bitwise")
        .metric("exact", true);
    let mut gate2 = Check::new("gate2", Status::Fail, "rows differ").metric("mismatches", 2);
    gate2.first_mismatch = Some(mismatch(Some(3), 1, 811, 1.25, 1.2500001));
    let mut drift = Check::new(
        "drift",
        Status::Warn,
        "2 of 102 rows differ, within tolerance",
    )
    .metric("agree", 0.98)
    .metric("rows", 102);
    drift.first_mismatch = Some(mismatch(Some(0), 4, 2, f64::NEG_INFINITY, 0.5));
    let skip = Check::new("cuda-only", Status::Skip, "no GPU");
    // A NaN metric is written as null; NaN and infinities in a mismatch as text.
    let mut nan = Check::new("nan", Status::Fail, LABEL).metric("max_abs", f64::NAN);
    nan.first_mismatch = Some(mismatch(None, 0, 7, f64::NAN, f64::INFINITY));
    vec![sum, gate2, drift, skip, nan]
}

/// The doors row the fixture writes last, `env.*` recorded by its `gate.env`.
fn doors() -> DoorsRow {
    DoorsRow::new()
        .with("backend", "cpu")
        .with("threads", 4)
        .with("ratio", 0.5)
        .with("fast_path", false)
        .with("label", LABEL)
        .with(&format!("env.{PIN}"), "on")
        .with(&format!("env.{UNSET}"), "(unset)")
}

fn same_float(a: f64, b: f64) -> bool {
    a == b || (a.is_nan() && b.is_nan())
}

fn assert_same_mismatch(row: &CheckRow, want: Option<FirstMismatch>) {
    let got = row.mismatch();
    match (got, want) {
        (None, None) => assert_eq!(row.first_mismatch, None, "{}", row.check),
        (Some(g), Some(w)) => {
            assert_eq!(
                (g.step, g.row, g.index),
                (w.step, w.row, w.index),
                "{}",
                row.check
            );
            assert!(
                same_float(g.reference, w.reference) && same_float(g.got, w.got),
                "{}: {g:?} != {w:?}",
                row.check
            );
        }
        (g, w) => panic!("{}: first mismatch {g:?}, want {w:?}", row.check),
    }
}

#[test]
fn rows_python_writes_are_the_bytes_rust_writes() {
    let dir = scratch("python-writes");
    let from_python = dir.join("python.jsonl");
    let from_rust = dir.join("rust.jsonl");

    let out = fixture(
        &[OsStr::new("write")],
        &[
            ("MEMRA_ORCH_CHECKS", from_python.as_os_str()),
            (PIN, OsStr::new("on")),
        ],
    );
    // Two checks failed, so the gate exits 1: its exit status agrees with its rows.
    assert_eq!(out.status.code(), Some(EXIT_FAIL), "{}", describe(&out));

    let mut writer = ChecksWriter::new(Some(from_rust.clone()));
    for check in &checks() {
        writer.check(check).unwrap();
    }
    writer.doors(&doors()).unwrap();
    assert_eq!(writer.outcome().code(), EXIT_FAIL);

    let python_bytes = std::fs::read(&from_python).unwrap();
    let rust_bytes = std::fs::read(&from_rust).unwrap();
    assert_eq!(
        String::from_utf8_lossy(&python_bytes),
        String::from_utf8_lossy(&rust_bytes),
        "Python's rows (left) differ from Rust's (right)"
    );
    assert_eq!(python_bytes, rust_bytes);

    let report = read_checks(&from_python);
    assert!(report.problems.is_empty(), "{:?}", report.problems);
    let want = checks();
    assert_eq!(report.checks.len(), want.len());
    for (row, check) in report.checks.iter().zip(&want) {
        assert_eq!(row.check, check.name);
        assert_eq!(row.status, check.status, "{}", check.name);
        assert_eq!(row.message.as_deref(), Some(check.message.as_str()));
        let metrics: BTreeMap<String, Value> = check.metrics.clone().into_iter().collect();
        assert_eq!(row.metrics, metrics, "{}", check.name);
        assert!(row.extra.is_empty(), "{}: {:?}", check.name, row.extra);
        assert_same_mismatch(row, check.first_mismatch);
    }

    // The parsed values, spelled out.
    let sum = &report.checks[0].metrics;
    assert_eq!(sum["compared"].as_u64(), Some(3));
    assert_eq!(sum["maxdiff"].as_f64(), Some(0.0));
    assert!(sum["maxdiff"].is_f64(), "0.0 stays a float");
    assert_eq!(sum["small"].as_f64(), Some(1e-7));
    assert_eq!(sum["tiny"].as_f64(), Some(0.00001));
    assert_eq!(sum["big"].as_f64(), Some(2.5e20));
    assert_eq!(sum["policy"], "bitwise");
    assert_eq!(sum["exact"], true);
    assert_eq!(report.checks[4].metrics["max_abs"], Value::Null);
    assert_eq!(report.checks[4].message.as_deref(), Some(LABEL));
    let nan = report.checks[4].mismatch().unwrap();
    assert!(nan.step.is_none() && nan.reference.is_nan());
    assert_eq!(nan.got, f64::INFINITY);
    let drift = report.checks[2].mismatch().unwrap();
    assert_eq!(drift.reference, f64::NEG_INFINITY);
    assert_eq!(
        report.first_failed().map(|c| c.check.as_str()),
        Some("gate2")
    );

    let read_doors = report.doors.expect("the fixture writes a doors row");
    let want_doors: BTreeMap<String, Value> = doors().values.into_iter().collect();
    assert_eq!(read_doors, want_doors);
    assert_eq!(read_doors["threads"], 4);
    assert_eq!(read_doors["label"], LABEL);
    assert_eq!(read_doors[&format!("env.{UNSET}")], "(unset)");

    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn rows_rust_writes_are_read_by_python() {
    let dir = scratch("rust-writes");
    let path = dir.join("checks.jsonl");
    let first = doors();
    let second = DoorsRow::new().with("backend", "cuda");
    let mut writer = ChecksWriter::new(Some(path.clone()));
    writer.doors(&first).unwrap();
    for check in &checks() {
        writer.check(check).unwrap();
    }
    writer.doors(&second).unwrap();
    // What other writers leave: a blank line, a key this crate does not write, a line
    // that is not JSON (lines 8, 9 and 10).
    let mut file = OpenOptions::new().append(true).open(&path).unwrap();
    file.write_all(b"\n{\"check\":\"extra\",\"status\":\"pass\",\"elapsed_s\":1.5}\nnot json\n")
        .unwrap();
    drop(file);

    let out = fixture(&[OsStr::new("read"), path.as_os_str()], &[]);
    assert!(out.status.success(), "{}", describe(&out));
    let summary: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("the summary is not JSON ({e})\n{}", describe(&out)));

    let mut want_checks: Vec<Value> = checks().iter().map(Check::to_json).collect();
    want_checks.push(json!({"check": "extra", "status": "pass", "elapsed_s": 1.5}));
    let got_checks = summary["checks"].as_array().expect("checks is an array");
    assert_eq!(got_checks.len(), want_checks.len());
    for (got, want) in got_checks.iter().zip(&want_checks) {
        assert_eq!(got, want);
    }

    // Each first mismatch as Python parses it and writes it back.
    let mut want_mismatches: Vec<Value> = checks()
        .iter()
        .map(|c| c.first_mismatch.map_or(Value::Null, |m| m.to_json()))
        .collect();
    want_mismatches.push(Value::Null);
    assert_eq!(summary["mismatches"], Value::Array(want_mismatches));

    // Doors rows merge, the later row winning.
    let mut want_doors: Map<String, Value> = first.values.clone();
    want_doors.insert("backend".to_string(), json!("cuda"));
    assert_eq!(summary["doors"], Value::Object(want_doors));

    let problems = summary["problems"]
        .as_array()
        .expect("problems is an array");
    assert_eq!(problems.len(), 1, "{problems:?}");
    let problem = problems[0].as_str().unwrap_or_default();
    assert!(
        problem.starts_with("checks.jsonl line 10: not JSON ("),
        "{problem}"
    );
    assert_eq!(summary["first_failed"], "gate2");
    assert_eq!(summary["speaks_protocol"], true);

    std::fs::remove_dir_all(&dir).unwrap();
}
