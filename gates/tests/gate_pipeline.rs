//! The pipeline split: `decode-batch-gate --mode pp` end to end (green splits, the planted
//! stage defects localized to the right culprit, reps), and the engine's refusal to walk the
//! unsplit body over a split placement (exact message, untouched caches).

use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

use memra_engine::backend::{Backend, EngineError, SeqId, Walk, cpu::CpuBackend};
use memra_engine::doors::{Doors, PpSplits};
use memra_engine::model::LlamaModel;
use serde_json::Value;

fn tiny() -> PathBuf {
    static DIR: OnceLock<tempfile::TempDir> = OnceLock::new();
    static ONCE: OnceLock<PathBuf> = OnceLock::new();
    ONCE.get_or_init(|| {
        let dir = DIR.get_or_init(|| tempfile::tempdir().unwrap());
        let path = dir.path().join("tiny-q8_0.gguf");
        memra_engine::synth::write_preset("tiny", "q8_0", 12, &path).unwrap();
        path
    })
    .clone()
}

/// Runs `--mode pp` with `args` and `env`; returns the exit code, stdout and check rows.
fn pp(args: &[&str], env: &[(&str, &str)]) -> (i32, String, Vec<Value>) {
    let dir = tempfile::tempdir().unwrap();
    let checks = dir.path().join("checks.jsonl");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_decode-batch-gate"));
    for var in memra_engine::doors::DOOR_VARIABLES {
        cmd.env_remove(var);
    }
    let model = tiny();
    let out = cmd
        .env("MEMRA_BACKEND", "cpu")
        .env("MEMRA_ORCH_CHECKS", &checks)
        .env_remove("MEMRA_ORCH_ARTIFACTS")
        .arg(&model)
        .args(["--mode", "pp", "--steps", "4"])
        .args(args)
        .envs(env.iter().copied())
        .output()
        .unwrap();
    let rows = std::fs::read_to_string(&checks)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        rows,
    )
}

fn status<'a>(rows: &'a [Value], name: &str) -> &'a str {
    rows.iter()
        .find(|r| r["check"] == name)
        .and_then(|r| r["status"].as_str())
        .unwrap_or_else(|| panic!("no check {name}"))
}

fn message(rows: &[Value], name: &str) -> String {
    rows.iter()
        .find(|r| r["check"] == name)
        .and_then(|r| r["message"].as_str())
        .unwrap_or_default()
        .to_string()
}

#[test]
fn splits_are_green_in_every_placement() {
    for (args, env) in [
        (vec!["--stages", "2"], vec![]),
        (vec!["--stages", "4", "--batch", "1,3"], vec![]),
        (
            vec![],
            vec![
                ("MEMRA_PP_STAGES", "3"),
                ("MEMRA_PP_SPLITS", "1,3"),
                ("MEMRA_PP_DEVICES", "0,0,0"),
            ],
        ),
        (
            vec!["--reps", "3"],
            vec![("MEMRA_MMVQ", "0"), ("MEMRA_FA3", "0")],
        ),
    ] {
        let (code, out, rows) = pp(&args, &env);
        assert_eq!(code, 0, "{args:?} {env:?}: {out}");
        for arm in ["pp.split", "pp.localizer", "pp.epilogue"] {
            assert_eq!(status(&rows, arm), "pass", "{arm} {args:?} {env:?}");
        }
        assert!(rows[0]["doors"]["pp_stages"].as_u64().unwrap() >= 2);
    }
    let (_, _, rows) = pp(&[], &[("MEMRA_PP_STAGES", "3"), ("MEMRA_PP_SPLITS", "1,3")]);
    assert_eq!(rows[0]["doors"]["pp_splits"], "0,1,3");
    assert_eq!(rows[0]["doors"]["reference_pp_stages"], 1);
}

#[test]
fn the_b1_fast_path_per_stage_is_green_under_the_default_pins() {
    // MEMRA_SERVE_B1FAST=1 sends every B=1 step of the split, and of the reference, to the
    // fused single-sequence path; the localizer and its reference both walk the batched body.
    let b1fast = [("MEMRA_SERVE_B1FAST", "1")];
    let (code, out, rows) = pp(&["--batch", "1,4"], &b1fast);
    assert_eq!(code, 0, "{out}");
    for arm in ["pp.split", "pp.localizer", "pp.epilogue"] {
        assert_eq!(status(&rows, arm), "pass", "{arm}: {out}");
    }
    assert_eq!(rows[0]["doors"]["b1fast"], true);
    // Through the fast path the stage defects are still caught and localized.
    let (_, _, range) = pp(
        &["--batch", "1"],
        &[b1fast[0], ("MEMRA_GATE_DEFECT", "stage-range")],
    );
    assert_eq!(status(&range, "pp.split"), "fail");
    assert_eq!(status(&range, "pp.localizer"), "fail");
    let (_, _, copy) = pp(
        &["--batch", "1"],
        &[b1fast[0], ("MEMRA_GATE_DEFECT", "boundary-copy")],
    );
    assert_eq!(status(&copy, "pp.split"), "fail");
    assert_eq!(status(&copy, "pp.localizer"), "pass");
}

#[test]
fn a_batch_list_runs_every_size_through_the_split() {
    let (code, out, rows) = pp(&["--batch", "1,4,8", "--reps", "1"], &[]);
    assert_eq!(code, 0, "{out}");
    assert_eq!(rows[0]["doors"]["batch"], "1,4,8");
    let metric = |arm: &str| {
        rows.iter().find(|c| c["check"] == arm).unwrap()["metrics"]["rows"]
            .as_u64()
            .unwrap()
    };
    // One row per sequence and step: 4 steps of 1 + 4 + 8 sequences, in every arm.
    assert_eq!(metric("pp.split"), 4 * 13);
    assert_eq!(metric("pp.localizer"), 4 * 13);
}

#[test]
fn reps_multiply_the_split_arm() {
    let (_, _, one) = pp(&["--reps", "1"], &[]);
    let (_, _, three) = pp(&["--reps", "3"], &[]);
    let rows = |r: &[Value]| {
        r.iter().find(|c| c["check"] == "pp.split").unwrap()["metrics"]["rows"]
            .as_u64()
            .unwrap()
    };
    assert_eq!(rows(&three), 3 * rows(&one));
    let (_, _, broken) = pp(&["--reps", "3"], &[("MEMRA_GATE_DEFECT", "boundary-copy")]);
    let split = broken.iter().find(|c| c["check"] == "pp.split").unwrap();
    assert_eq!(
        split["metrics"]["reps_failed"], 3,
        "a deterministic fault fails every rep"
    );
}

#[test]
fn a_skipped_boundary_copy_is_blamed_on_the_split() {
    let (code, out, rows) = pp(&[], &[("MEMRA_GATE_DEFECT", "boundary-copy")]);
    assert_eq!(code, 1, "{out}");
    assert_eq!(status(&rows, "pp.split"), "fail");
    assert_eq!(status(&rows, "pp.localizer"), "pass");
    assert!(
        message(&rows, "pp.split").contains("the stage split"),
        "{}",
        message(&rows, "pp.split")
    );
}

#[test]
fn an_off_by_one_stage_range_is_blamed_on_the_placement() {
    let (code, out, rows) = pp(&["--stages", "2"], &[("MEMRA_GATE_DEFECT", "stage-range")]);
    assert_eq!(code, 1, "{out}");
    assert_eq!(status(&rows, "pp.split"), "fail");
    assert_eq!(status(&rows, "pp.localizer"), "fail");
    assert!(message(&rows, "pp.split").contains("stage-owned placement"));
    assert_eq!(
        rows[0]["doors"]["pp_splits"], "0,3",
        "the defect shows in the doors row"
    );
}

fn model() -> LlamaModel {
    LlamaModel::open(tiny()).unwrap()
}

fn split_doors(allow: bool) -> Doors {
    Doors {
        pp_stages: 2,
        pp_devices: vec![0, 0],
        pp_splits: PpSplits::Cuts(vec![1]),
        pp_allow_unsplit_batch: allow,
        ..Doors::default()
    }
}

/// Primes two sequences and returns the backend ready for a batched step.
fn primed(doors: Doors) -> CpuBackend {
    let mut be = CpuBackend::new(model(), doors).unwrap();
    for (i, prompt) in [[5u32, 9, 13], [7, 7, 2]].iter().enumerate() {
        be.open_sequence(SeqId(i as u32), 8).unwrap();
        be.prime(SeqId(i as u32), prompt).unwrap();
    }
    be
}

#[test]
fn the_unsplit_walk_over_a_split_placement_is_refused_exactly_and_touches_nothing() {
    let seqs = [SeqId(0), SeqId(1)];
    let mut be = primed(split_doors(false));
    let err = be
        .decode_step_batch_walk(Walk::Unsplit, &seqs, &[3, 4])
        .unwrap_err();
    assert_eq!(
        err,
        EngineError::Unavailable(
            "refused: the unsplit batched body cannot walk a split placement (2 stages: [0] \
             layers 0..1 on device 0 [1] layers 1..4 on device 0); it would skip the stage \
             boundary copies. Run decode_step_batch (the split walk), or set \
             MEMRA_PP_ALLOW_UNSPLIT_BATCH=1 to walk the body over the stage-owned weights \
             anyway (the pipeline gate's localizer does); no cache was touched"
                .into()
        )
    );
    assert_eq!(be.seq_len(SeqId(0)).unwrap(), 3);
    // The caches are as if the refused call never happened.
    let after = be.decode_step_batch(&seqs, &[3, 4]).unwrap();
    let mut fresh = primed(split_doors(false));
    assert_eq!(after, fresh.decode_step_batch(&seqs, &[3, 4]).unwrap());
}

#[test]
fn with_permission_the_unsplit_walk_equals_the_split_walk() {
    let seqs = [SeqId(0), SeqId(1)];
    let mut walked = primed(split_doors(true));
    let mut split = primed(split_doors(true));
    for step in 0..3u32 {
        let a = walked
            .decode_step_batch_walk(Walk::Unsplit, &seqs, &[step, step + 1])
            .unwrap();
        let b = split.decode_step_batch(&seqs, &[step, step + 1]).unwrap();
        assert_eq!(
            a.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            b.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
        );
    }
    // On an unsplit model no permission is needed.
    let mut unsplit = primed(Doors::default());
    assert!(
        unsplit
            .decode_step_batch_walk(Walk::Unsplit, &seqs, &[1, 2])
            .is_ok()
    );
}

#[test]
fn the_permission_pin_is_read_from_the_environment() {
    let d = Doors::from_lookup(|n| (n == "MEMRA_PP_ALLOW_UNSPLIT_BATCH").then(|| "1".into()));
    assert!(d.unwrap().pp_allow_unsplit_batch);
    let bad = Doors::from_lookup(|n| (n == "MEMRA_PP_ALLOW_UNSPLIT_BATCH").then(|| "yes".into()));
    assert!(
        bad.unwrap_err()
            .to_string()
            .contains("MEMRA_PP_ALLOW_UNSPLIT_BATCH=\"yes\": accepted values are 0, 1")
    );
}
