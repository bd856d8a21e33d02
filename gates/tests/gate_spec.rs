//! `spec-gate` and `decode-batch-gate --mode ppspec` end to end on the CPU backend: green on
//! the synthesized shape and on the real SmolLM2-135M-Instruct, each planted spec defect
//! failing the row it is planted against (and ppspec localizing stage-column to the split),
//! a split model under spec-gate, and bad flags refused with the fix named.

#[path = "../../engine/tests/common/mod.rs"]
mod common;

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use serde_json::Value;

fn untied() -> PathBuf {
    static DIR: OnceLock<tempfile::TempDir> = OnceLock::new();
    static ONCE: OnceLock<PathBuf> = OnceLock::new();
    ONCE.get_or_init(|| {
        let dir = DIR.get_or_init(|| tempfile::tempdir().unwrap());
        let path = dir.path().join("tiny-untied-q4_1.gguf");
        memra_engine::synth::write_preset("tiny-untied", "q4_1", 0, &path).unwrap();
        path
    })
    .clone()
}

/// Runs a gate binary on `model` with `args` and `env` (common::run_gate); returns the exit
/// code, stdout and stderr together, and the check rows.
fn gate(bin: &str, model: &Path, args: &[&str], env: &[(&str, &str)]) -> (i32, String, Vec<Value>) {
    let model = model.to_string_lossy();
    let all: Vec<&str> = std::iter::once(model.as_ref())
        .chain(args.iter().copied())
        .collect();
    let r = common::run_gate(bin, false, &all, env);
    (r.code, format!("{}{}", r.stdout, r.stderr), r.rows)
}

fn spec(args: &[&str], env: &[(&str, &str)]) -> (i32, String, Vec<Value>) {
    gate(env!("CARGO_BIN_EXE_spec-gate"), &untied(), args, env)
}

fn ppspec(args: &[&str], env: &[(&str, &str)]) -> (i32, String, Vec<Value>) {
    let mut all = vec!["--mode", "ppspec", "--batch", "1,3"];
    all.extend_from_slice(args);
    gate(
        env!("CARGO_BIN_EXE_decode-batch-gate"),
        &untied(),
        &all,
        env,
    )
}

fn row<'a>(rows: &'a [Value], name: &str) -> &'a Value {
    rows.iter()
        .find(|r| r["check"] == name)
        .unwrap_or_else(|| panic!("no check {name} in {rows:?}"))
}

fn status<'a>(rows: &'a [Value], name: &str) -> &'a str {
    row(rows, name)["status"].as_str().unwrap()
}

#[test]
fn spec_gate_is_green_and_each_defect_fails_its_row() {
    let (code, out, rows) = spec(&[], &[]);
    assert_eq!(code, 0, "{out}");
    for name in ["spec.plain", "spec.column", "spec.rewind"] {
        assert_eq!(status(&rows, name), "pass", "{name}: {out}");
    }
    assert!(
        row(&rows, "spec.plain")["metrics"]["accepted"]
            .as_u64()
            .unwrap()
            > 0
    );
    assert!(out.contains("spec_k=1,4,8"), "{out}");

    let (code, out, rows) = spec(&["--k", "4"], &[("MEMRA_GATE_DEFECT", "rewind-slot")]);
    assert_eq!(code, 1, "{out}");
    assert_eq!(status(&rows, "spec.rewind"), "fail");
    let (code, out, rows) = spec(&["--k", "4"], &[("MEMRA_GATE_DEFECT", "verify-column")]);
    assert_eq!(code, 1, "{out}");
    assert_eq!(status(&rows, "spec.column"), "fail");
    assert_eq!(status(&rows, "spec.rewind"), "pass");
    // Plain generation's steps on the single-sequence path (the fused tier here): the
    // verify columns the streams were chosen from part from plain generate's logits, and
    // only spec.plain holds those.
    let (code, out, rows) = spec(&["--k", "4"], &[("MEMRA_GATE_DEFECT", "plain-single")]);
    assert_eq!(code, 1, "{out}");
    assert_eq!(status(&rows, "spec.plain"), "fail", "{out}");
    assert_eq!(status(&rows, "spec.column"), "pass", "{out}");
    assert_eq!(status(&rows, "spec.rewind"), "pass", "{out}");
    // The defects of other gates do not reach spec-gate, which holds the engine to itself.
    for defect in [
        "batch-reduction",
        "q8-block-sum",
        "stage-column",
        "sample-counter",
    ] {
        let (code, out, _) = spec(&["--k", "4"], &[("MEMRA_GATE_DEFECT", defect)]);
        assert_eq!(code, 0, "{defect}: {out}");
    }
}

#[test]
fn spec_gate_on_a_split_model_and_under_the_equalized_pins() {
    let (code, out, _) = spec(&["--k", "1,4"], &[("MEMRA_PP_STAGES", "2")]);
    assert_eq!(code, 0, "{out}");
    let (code, out, rows) = spec(
        &["--k", "4"],
        &[("MEMRA_MMVQ", "0"), ("MEMRA_NO_FUSE_NORMQ", "1")],
    );
    assert_eq!(code, 0, "{out}");
    // Both B=1 paths run the verify's composition: the single path is held bit for bit.
    let msg = row(&rows, "spec.column")["message"].as_str().unwrap();
    assert!(
        msg.contains("single-sequence path (both run the separate"),
        "{msg}"
    );
}

/// Under the B=1 serving shortcut with the fused tier, plain generate runs a composition
/// no verify runs: generate refuses --spec there, and spec-gate, with no plain stream to
/// hold --spec to, cannot run (exit 2), naming both fixes. With the shortcut on under the
/// equalized pins both routes are one composition and the gate holds.
#[test]
fn spec_gate_refuses_the_shortcut_that_parts_plain_from_speculative_output() {
    let (code, out, _) = spec(&["--k", "4"], &[("MEMRA_SERVE_B1FAST", "1")]);
    assert_eq!(code, 2, "{out}");
    assert!(
        out.contains("MEMRA_SERVE_B1FAST") && out.contains("MEMRA_NO_FUSE_NORMQ=1"),
        "{out}"
    );
    let (code, out, rows) = spec(
        &["--k", "4"],
        &[
            ("MEMRA_SERVE_B1FAST", "1"),
            ("MEMRA_MMVQ", "0"),
            ("MEMRA_NO_FUSE_NORMQ", "1"),
        ],
    );
    assert_eq!(code, 0, "{out}");
    assert_eq!(status(&rows, "spec.plain"), "pass", "{out}");
}

/// Prompts of 120 tokens: every verify runs past position 120 and the streams cross the
/// split-K attention window at 128, in spec-gate and in ppspec's split verify.
#[test]
fn spec_and_ppspec_hold_across_the_attention_window_at_128() {
    let (code, out, rows) = spec(&["--k", "1,4", "--plen", "120"], &[]);
    assert_eq!(code, 0, "{out}");
    assert!(
        row(&rows, "spec.plain")["metrics"]["accepted"]
            .as_u64()
            .unwrap()
            > 0,
        "{out}"
    );
    let (code, out, _) = ppspec(&["--reps", "1", "--plen", "120"], &[]);
    assert_eq!(code, 0, "{out}");
}

#[test]
fn spec_and_ppspec_hold_under_the_q8_kv_cache() {
    let (code, out, _) = spec(&["--k", "4"], &[("MEMRA_KV_Q8", "1")]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("kv=q8_0"), "{out}");
    let (code, out, _) = ppspec(&["--reps", "1"], &[("MEMRA_KV_Q8", "1")]);
    assert_eq!(code, 0, "{out}");
}

#[test]
fn ppspec_is_green_and_localizes_stage_column_to_the_split() {
    let (code, out, rows) = ppspec(&["--stages", "3"], &[]);
    assert_eq!(code, 0, "{out}");
    assert_eq!(status(&rows, "ppspec.split"), "pass");
    assert_eq!(status(&rows, "ppspec.localizer"), "pass");
    assert!(out.contains("spec_ts=2,5,9"), "{out}");
    let (code, out, rows) = ppspec(
        &["--reps", "1", "--ts", "3"],
        &[("MEMRA_GATE_DEFECT", "stage-column")],
    );
    assert_eq!(code, 1, "{out}");
    assert_eq!(status(&rows, "ppspec.split"), "fail");
    assert_eq!(status(&rows, "ppspec.localizer"), "pass");
    let msg = row(&rows, "ppspec.split")["message"].as_str().unwrap();
    assert!(msg.contains("the stage split of the verify"), "{msg}");
    for defect in ["rewind-slot", "verify-column"] {
        let (code, out, _) = ppspec(&["--reps", "1"], &[("MEMRA_GATE_DEFECT", defect)]);
        assert_eq!(code, 0, "{defect}: {out}");
    }
}

#[test]
fn bad_flags_are_refused_with_the_fix_named() {
    let (code, out, _) = spec(&["--k", "0"], &[]);
    assert_eq!(code, 2, "{out}");
    assert!(out.contains("1,4,8"), "{out}");
    let (code, out, _) = spec(&["--steps", "600"], &[]);
    assert_eq!(code, 2, "{out}");
    assert!(out.contains("lower them"), "{out}");
    let (code, out, _) = ppspec(&["--ts", "1"], &[]);
    assert_eq!(code, 2, "{out}");
    assert!(out.contains("2,5,9"), "{out}");
    let (code, out, _) = gate(
        env!("CARGO_BIN_EXE_decode-batch-gate"),
        &untied(),
        &["--ts", "2"],
        &[],
    );
    assert_eq!(code, 2, "{out}");
    assert!(out.contains("--ts only applies to --mode ppspec"), "{out}");
}

#[test]
fn spec_gate_holds_on_the_real_model() {
    let Some(model) = common::real_model() else {
        return;
    };
    let (code, out, rows) = gate(
        env!("CARGO_BIN_EXE_spec-gate"),
        &model,
        &["--k", "4", "--batch", "2", "--steps", "12"],
        &[],
    );
    assert_eq!(code, 0, "{out}");
    for name in ["spec.plain", "spec.column", "spec.rewind"] {
        assert_eq!(status(&rows, name), "pass", "{name}: {out}");
    }
}
