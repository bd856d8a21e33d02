//! `memra-orch diff` measuring how far the bits moved: a fixture gate copies safetensors
//! files whose values the test chooses into its artifacts folder, the battery runs twice
//! with different values, and the diff must give, per tensor, the number of values that
//! differ, max |Δ|, max relative |Δ|, max ulp distance and argmax agreement exactly as the
//! test computes them (text and JSON), name a tensor on one side only, a shape change and a
//! dtype change, say that a text artifact is not a safetensors file, read a carried
//! receipt's files from the run that measured it, and read nothing under `--no-read`.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use safetensors::tensor::TensorView;
use safetensors::{Dtype, serialize};
use serde_json::Value;

use crate::run_support::{Fixture, logged};

const MANIFEST: &str = r#"schema = 1
name = "quantify"

[defaults]
gpus = 0
timeout = "1m"

[[arm]]
id = "gate"
run = ["{gates}/copy-artifacts.sh", "data/logits.safetensors", "data/notes.txt"]
inputs = ["data/*"]

[[arm]]
id = "other"
run = ["{gates}/copy-artifacts.sh"]
"#;

/// A tensor to write: name, dtype, shape and its little-endian bytes.
type Tensor = (&'static str, Dtype, Vec<usize>, Vec<u8>);

fn f32s(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn f16s(v: &[f32]) -> Vec<u8> {
    v.iter()
        .flat_map(|x| half::f16::from_f32(*x).to_le_bytes())
        .collect()
}

fn bf16s(v: &[half::bf16]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn i32s(v: &[i32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn write(path: &Path, tensors: &[Tensor]) {
    let views: HashMap<String, TensorView<'_>> = tensors
        .iter()
        .map(|(name, dtype, shape, b)| {
            (
                name.to_string(),
                TensorView::new(*dtype, shape.clone(), b).unwrap(),
            )
        })
        .collect();
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, serialize(&views, None).unwrap()).unwrap();
}

const OLD_LOGITS: [f32; 12] = [
    0.5, 2.0, -1.0, 0.25, // row 0: unchanged
    1.0, 1.0, 3.0, 0.0, // row 1: two values move, the argmax moves from 2 to 1
    -2.0, 4.0, 4.0, 1.5, // row 2: one value moves 3 ulps down, the argmax stays
];

fn new_logits() -> [f32; 12] {
    let mut v = OLD_LOGITS;
    v[5] = 3.5;
    v[7] = 1e-3;
    v[10] = f32::from_bits(4.0f32.to_bits() - 3);
    v
}

fn one_plus_ulp() -> half::bf16 {
    half::bf16::from_bits(half::bf16::from_f32(1.0).to_bits() + 1)
}

fn old_files(dir: &Path) {
    write(
        &dir.join("data/logits.safetensors"),
        &[
            ("logits", Dtype::F32, vec![3, 4], f32s(&OLD_LOGITS)),
            ("same", Dtype::F32, vec![2], f32s(&[7.0, 8.0])),
            ("gone", Dtype::F32, vec![2], f32s(&[1.0, 2.0])),
            ("wide", Dtype::F32, vec![2], f32s(&[1.0, 2.0])),
            ("cast", Dtype::F32, vec![2, 2], f32s(&[1.0, 2.0, 3.0, 4.0])),
            ("ids", Dtype::I32, vec![4], i32s(&[1, -5, 7, 100])),
            (
                "bf",
                Dtype::BF16,
                vec![2],
                bf16s(&[half::bf16::from_f32(1.0), half::bf16::from_f32(-0.0)]),
            ),
        ],
    );
    std::fs::write(dir.join("data/notes.txt"), "first\n").unwrap();
}

fn new_files(dir: &Path) {
    write(
        &dir.join("data/logits.safetensors"),
        &[
            ("logits", Dtype::F32, vec![3, 4], f32s(&new_logits())),
            ("same", Dtype::F32, vec![2], f32s(&[7.0, 8.0])),
            ("fresh", Dtype::F32, vec![1], f32s(&[9.0])),
            ("wide", Dtype::F32, vec![3], f32s(&[1.0, 2.0, 3.0])),
            ("cast", Dtype::F16, vec![2, 2], f16s(&[1.0, 2.0, 3.0, 4.5])),
            ("ids", Dtype::I32, vec![4], i32s(&[1, 5, 7, 90])),
            (
                "bf",
                Dtype::BF16,
                vec![2],
                bf16s(&[one_plus_ulp(), half::bf16::from_f32(0.0)]),
            ),
        ],
    );
    std::fs::write(dir.join("data/notes.txt"), "second\n").unwrap();
}

/// The figures the diff must report for `logits`, computed here from the definitions in
/// docs/diff.md: values that differ in bits, max |Δ|, max |Δ| / max(|old|, f32's smallest
/// normal), max distance of sign-magnitude ordered bit patterns, rows whose first maximum
/// is at the same index.
struct Expected {
    differ: u64,
    max_abs: f64,
    max_rel: f64,
    max_ulp: u64,
    agree: u64,
}

fn expected(old: &[f32], new: &[f32], row: usize) -> Expected {
    let ordered = |x: f32| -> i64 {
        let b = x.to_bits();
        let m = i64::from(b & 0x7fff_ffff);
        if b >> 31 == 1 { -m } else { m }
    };
    let mut e = Expected {
        differ: 0,
        max_abs: 0.0,
        max_rel: 0.0,
        max_ulp: 0,
        agree: 0,
    };
    for (o, n) in old.iter().zip(new) {
        if o.to_bits() != n.to_bits() {
            e.differ += 1;
            let d = (f64::from(*n) - f64::from(*o)).abs();
            e.max_abs = e.max_abs.max(d);
            e.max_rel = e
                .max_rel
                .max(d / f64::from(o.abs()).max(f64::from(f32::MIN_POSITIVE)));
            e.max_ulp = e.max_ulp.max((ordered(*o) - ordered(*n)).unsigned_abs());
        }
    }
    let argmax = |r: &[f32]| {
        let mut best = 0;
        for (i, x) in r.iter().enumerate() {
            if *x > r[best] {
                best = i;
            }
        }
        best
    };
    for (o, n) in old.chunks(row).zip(new.chunks(row)) {
        e.agree += u64::from(argmax(o) == argmax(n));
    }
    e
}

struct Runs {
    fixture: Fixture,
    old: PathBuf,
    new: PathBuf,
}

/// Runs the battery with the old files, then with the new ones.
fn two_runs() -> Runs {
    let fixture = Fixture::new(MANIFEST);
    old_files(fixture.path());
    assert_eq!(fixture.run(&[]).status.code(), Some(0));
    new_files(fixture.path());
    assert_eq!(fixture.run(&[]).status.code(), Some(0));
    let runs = fixture.runs();
    assert_eq!(runs.len(), 2);
    Runs {
        old: runs[0].clone(),
        new: runs[1].clone(),
        fixture,
    }
}

fn diff(f: &Fixture, old: &Path, new: &Path, extra: &[&str]) -> (Option<i32>, String) {
    let out = logged(
        std::process::Command::new(env!("CARGO_BIN_EXE_memra-orch"))
            .current_dir(f.path())
            .arg("diff")
            .arg(old)
            .arg(new)
            .arg("--receipts")
            .arg(f.path().join("receipts"))
            .args(["--color", "never"])
            .args(extra)
            .output()
            .unwrap(),
    );
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

fn artifact<'a>(v: &'a Value, name: &str) -> &'a Value {
    let moved = &v["bits_moved"];
    assert_eq!(moved.as_array().unwrap().len(), 1, "{moved:#}");
    assert_eq!(moved[0]["id"], "gate");
    moved[0]["artifacts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["name"] == name)
        .unwrap_or_else(|| panic!("no artifact {name} in {moved:#}"))
}

fn tensor<'a>(a: &'a Value, name: &str) -> &'a Value {
    a["tensors"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == name)
        .unwrap_or_else(|| panic!("no tensor {name} in {a:#}"))
}

fn number(x: f64) -> String {
    if x == 0.0 {
        "0".to_string()
    } else {
        format!("{x:.3e}")
    }
}

#[test]
fn tensors_that_moved_are_measured_in_text_and_json() {
    let r = two_runs();
    let (code, json) = diff(&r.fixture, &r.old, &r.new, &["--format", "json"]);
    assert_eq!(code, Some(0), "moved bits do not fail a diff");
    let v: Value = serde_json::from_str(&json).unwrap();
    let st = artifact(&v, "logits.safetensors");
    assert_eq!(st.get("not_read"), None, "{st:#}");
    assert_eq!(st["tensors_same"], 1, "`same` is bit for bit the same");
    let names: Vec<&str> = st["tensors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        ["bf", "cast", "fresh", "gone", "ids", "logits", "wide"]
    );

    let e = expected(&OLD_LOGITS, &new_logits(), 4);
    assert_eq!(
        (e.differ, e.max_ulp, e.agree),
        (3, 1e-3f32.to_bits().into(), 2)
    );
    let l = tensor(st, "logits");
    assert_eq!(l["old_dtype"], "F32");
    assert_eq!(l["new_shape"], serde_json::json!([3, 4]));
    assert_eq!(l["values"], 12);
    assert_eq!(l["differ"], e.differ);
    assert_eq!(l["max_abs"].as_f64(), Some(e.max_abs));
    assert_eq!(l["max_rel"].as_f64(), Some(e.max_rel));
    assert_eq!(l["max_ulp"], e.max_ulp);
    assert_eq!(l["rows"], 3);
    assert_eq!(l["argmax_agree"], e.agree);

    // Integers: the ulp distance is the difference; relative to |old| (≥ 1).
    let ids = tensor(st, "ids");
    assert_eq!(
        (
            &ids["differ"],
            &ids["max_abs"],
            &ids["max_rel"],
            &ids["max_ulp"]
        ),
        (
            &Value::from(2),
            &Value::from(10.0),
            &Value::from(2.0),
            &Value::from(10)
        )
    );
    // bf16: one step above 1, and -0 → +0 (different bits, no distance).
    let bf = tensor(st, "bf");
    assert_eq!(bf["differ"], 2);
    assert_eq!(bf["max_ulp"], 1);
    assert_eq!(bf["max_abs"].as_f64(), Some(1.0 / 128.0));
    // A dtype change is compared by value, with no ulp distance.
    let cast = tensor(st, "cast");
    assert_eq!(
        (&cast["old_dtype"], &cast["new_dtype"]),
        (&Value::from("F32"), &Value::from("F16"))
    );
    assert_eq!(cast["differ"], 1);
    assert_eq!(cast["max_abs"].as_f64(), Some(0.5));
    assert_eq!(cast["max_rel"].as_f64(), Some(0.125));
    assert_eq!(cast["max_ulp"], Value::Null);
    assert_eq!(cast["argmax_agree"], 2);
    // One side only, and a shape change: no figures.
    let gone = tensor(st, "gone");
    assert_eq!(
        (&gone["new_dtype"], gone.get("values")),
        (&Value::Null, None)
    );
    assert_eq!(tensor(st, "fresh")["old_shape"], Value::Null);
    let wide = tensor(st, "wide");
    assert_eq!(wide["note"], "the shape changed");
    assert_eq!(wide["new_shape"], serde_json::json!([3]));
    assert_eq!(wide.get("differ"), None);

    // A text artifact is compared line by line, by line number only.
    let notes = artifact(&v, "notes.txt");
    assert_eq!(notes["old_lines"], 1);
    assert_eq!(notes["new_lines"], 1);
    assert_eq!(notes["lines_differ"], 1);
    assert_eq!(notes["first_lines"], serde_json::json!([1]));
    assert!(notes["old_sha256"].is_string(), "the digests stay");

    let (code, text) = diff(&r.fixture, &r.old, &r.new, &[]);
    assert_eq!(code, Some(0));
    let rows: Vec<Vec<&str>> = text
        .lines()
        .map(|l| {
            l.split("  ")
                .map(str::trim)
                .filter(|c| !c.is_empty())
                .collect()
        })
        .collect();
    let row = |name: &str| {
        rows.iter()
            .find(|r| r.first() == Some(&name))
            .unwrap_or_else(|| panic!("no row {name} in\n{text}"))
            .clone()
    };
    assert_eq!(
        row("logits"),
        [
            "logits",
            "F32",
            "[3, 4]",
            &format!("{} of 12", e.differ),
            &number(e.max_abs),
            &number(e.max_rel),
            &e.max_ulp.to_string(),
            &format!("{}/3", e.agree),
        ]
    );
    assert_eq!(
        row("cast"),
        [
            "cast",
            "F32 → F16",
            "[2, 2]",
            "1 of 4",
            "5.000e-1",
            "1.250e-1",
            "-",
            "2/2"
        ]
    );
    assert_eq!(row("gone"), ["gone", "F32", "[2]", "only in old"]);
    assert_eq!(row("fresh"), ["fresh", "F32", "[1]", "only in new"]);
    assert_eq!(
        row("wide"),
        ["wide", "F32", "[2] → [3]", "the shape changed"]
    );
    for needle in [
        "tensor  dtype",
        "1 other tensor is the same",
        "text, 1 line: 1 differs (line 1)",
    ] {
        assert!(text.contains(needle), "{needle:?} missing from\n{text}");
    }

    let (_, md) = diff(&r.fixture, &r.old, &r.new, &["--format", "markdown"]);
    assert!(md.contains("#### Tensors that moved"), "{md}");
    assert!(
        md.contains(&format!(
            "| `gate` | `logits.safetensors` | `logits` | F32 | [3, 4] | {} of 12 |",
            e.differ
        )),
        "{md}"
    );
}

#[test]
fn no_read_keeps_the_digests_only() {
    let r = two_runs();
    let (code, json) = diff(
        &r.fixture,
        &r.old,
        &r.new,
        &["--format", "json", "--no-read"],
    );
    assert_eq!(code, Some(0));
    let v: Value = serde_json::from_str(&json).unwrap();
    for name in ["logits.safetensors", "notes.txt"] {
        let a = artifact(&v, name);
        let keys: Vec<&str> = a.as_object().unwrap().keys().map(String::as_str).collect();
        assert_eq!(
            keys,
            ["name", "old_sha256", "new_sha256", "old_bytes", "new_bytes"],
            "{a:#}"
        );
    }
    let (_, text) = diff(&r.fixture, &r.old, &r.new, &["--no-read"]);
    assert!(text.contains("logits.safetensors: "), "{text}");
    assert!(!text.contains("tensor  dtype"), "{text}");
    assert!(!text.contains("not read"), "{text}");
}

#[test]
fn a_carried_receipt_is_read_from_the_run_that_measured_it() {
    let r = two_runs();
    // A third run of `other` alone carries `gate` from the second run; the files of the
    // second run's attempt are what the diff must read.
    assert_eq!(r.fixture.run(&["--filter", "other"]).status.code(), Some(0));
    let third = r.fixture.runs().pop().unwrap();
    let carried = crate::run_support::read_json(&third.join("run.json"));
    let gate = carried["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["id"] == "gate")
        .unwrap();
    assert!(gate["carried"].is_object(), "{carried:#}");
    assert!(
        !third
            .join("nodes")
            .join(gate["slug"].as_str().unwrap())
            .exists()
    );
    let (_, json) = diff(&r.fixture, &r.old, &third, &["--format", "json"]);
    let v: Value = serde_json::from_str(&json).unwrap();
    let st = artifact(&v, "logits.safetensors");
    assert_eq!(st.get("not_read"), None, "{st:#}");
    assert_eq!(tensor(st, "logits")["differ"], 3);
}

const COMPARED: &str = r#"schema = 1
name = "compared"

[defaults]
gpus = 0
timeout = "1m"

[[arm]]
id = "ref"
run = ["{gates}/copy-artifacts.sh", "ref/logits.safetensors"]

[[arm]]
id = "cand"
run = ["{gates}/copy-artifacts.sh", "cand/logits.safetensors"]
inputs = ["cand/*"]

[[compare]]
id = "pair"
reference = "ref"
candidates = ["cand"]
artifact = "logits.safetensors"
policy = { max_abs = 10.0 }
"#;

#[test]
fn compare_reports_are_diffed_like_metrics() {
    let f = Fixture::new(COMPARED);
    let logits = |v: &[f32]| vec![("logits", Dtype::F32, vec![1, 4], f32s(v))];
    write(
        &f.path().join("ref/logits.safetensors"),
        &logits(&[1.0, 2.0, 3.0, 4.0]),
    );
    write(
        &f.path().join("cand/logits.safetensors"),
        &logits(&[1.0, 2.0, 3.0, 4.5]),
    );
    assert_eq!(f.run(&[]).status.code(), Some(0));
    write(
        &f.path().join("cand/logits.safetensors"),
        &logits(&[1.0, 2.0, 3.0, 6.5]),
    );
    assert_eq!(f.run(&[]).status.code(), Some(0));
    let runs = f.runs();
    let (_, json) = diff(&f, &runs[0], &runs[1], &["--format", "json"]);
    let v: Value = serde_json::from_str(&json).unwrap();
    let drift: Vec<(&str, &str, f64, f64)> = v["metric_drift"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            (
                m["check"].as_str().unwrap(),
                m["metric"].as_str().unwrap(),
                m["old"].as_f64().unwrap(),
                m["new"].as_f64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        drift,
        [
            ("compare", "max_abs", 0.5, 2.5),
            ("compare", "max_rel", 0.125, 0.625),
            ("compare", "max_ulp", 1048576.0, 5242880.0),
            ("compare logits", "max_abs", 0.5, 2.5),
            ("compare logits", "max_rel", 0.125, 0.625),
        ]
    );
    assert!(
        v["metric_drift"][0]["id"]
            .as_str()
            .unwrap()
            .starts_with("pair[")
    );
    // The candidate's own artifact moved too: one value of four, by 2.
    let moved = &v["bits_moved"][0];
    assert_eq!(moved["id"], "cand");
    let t = &moved["artifacts"][0]["tensors"][0];
    assert_eq!(
        (&t["differ"], &t["max_abs"]),
        (&Value::from(1), &Value::from(2.0))
    );
    let (_, text) = diff(&f, &runs[0], &runs[1], &[]);
    assert!(
        text.contains("compare / max_abs: 0.5 → 2.5 (+400.0%)"),
        "{text}"
    );
}
