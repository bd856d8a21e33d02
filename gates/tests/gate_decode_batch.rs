//! `decode-batch-gate` end to end, through the real binary on synthesized tiny checkpoints:
//! every mode green under the pins it is meant for, the canary and each planted defect
//! caught by the gate meant for it (and not blamed on the others), the protocol rows and
//! artifacts, and clean usage errors.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

use serde_json::Value;

/// A tiny Q4_1 checkpoint written once per test process.
fn tiny() -> PathBuf {
    static DIR: OnceLock<tempfile::TempDir> = OnceLock::new();
    static ONCE: OnceLock<PathBuf> = OnceLock::new();
    ONCE.get_or_init(|| {
        let dir = DIR.get_or_init(|| tempfile::tempdir().unwrap());
        let path = dir.path().join("tiny-q4_1.gguf");
        memra_engine::synth::write_preset("tiny", "q4_1", 11, &path).unwrap();
        path
    })
    .clone()
}

/// What one gate run reported.
struct Run {
    code: i32,
    stdout: String,
    stderr: String,
    rows: Vec<Value>,
    artifacts: tempfile::TempDir,
}

impl Run {
    /// The check row named `name`.
    fn check(&self, name: &str) -> &Value {
        self.rows
            .iter()
            .find(|r| r["check"] == name)
            .unwrap_or_else(|| panic!("no check {name} in {:#?}\n{}", self.rows, self.stdout))
    }

    fn status(&self, name: &str) -> String {
        self.check(name)["status"].as_str().unwrap().to_string()
    }
}

/// Runs the gate with `args` and exactly the pins in `env` (every other MEMRA_* removed),
/// on the CPU backend unless `env` says otherwise.
fn gate(args: &[&str], env: &[(&str, &str)]) -> Run {
    let dir = tempfile::tempdir().unwrap();
    let checks = dir.path().join("checks.jsonl");
    let artifacts = tempfile::tempdir().unwrap();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_decode-batch-gate"));
    for var in memra_engine::doors::DOOR_VARIABLES {
        cmd.env_remove(var);
    }
    cmd.env("MEMRA_BACKEND", "cpu")
        .env("MEMRA_ORCH_CHECKS", &checks)
        .env("MEMRA_ORCH_ARTIFACTS", artifacts.path())
        .args(args)
        .envs(env.iter().copied());
    let Output {
        status,
        stdout,
        stderr,
    } = cmd.output().expect("run decode-batch-gate");
    let rows = std::fs::read_to_string(&checks)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).expect("every check row is JSON"))
        .collect();
    Run {
        code: status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&stdout).into_owned(),
        stderr: String::from_utf8_lossy(&stderr).into_owned(),
        rows,
        artifacts,
    }
}

fn model_arg() -> String {
    tiny().display().to_string()
}

const EQUALIZED: [(&str, &str); 2] = [("MEMRA_MMVQ", "0"), ("MEMRA_NO_FUSE_NORMQ", "1")];

#[test]
fn config_mode_is_green_and_speaks_the_protocol() {
    let m = model_arg();
    let r = gate(&[&m, "--batch", "1,3", "--steps", "5"], &[]);
    assert_eq!(r.code, 0, "{}\n{}", r.stdout, r.stderr);
    assert!(r.stdout.contains("ALL GREEN"), "{}", r.stdout);
    let doors = &r.rows[0]["doors"];
    assert_eq!(doors["backend"], "cpu");
    assert_eq!(doors["mode"], "config");
    assert_eq!(doors["defect"], "none");
    for name in [
        "gate1",
        "gate2[B=1]",
        "gate3[B=1]",
        "gate2[B=3]",
        "gate3[B=3]",
    ] {
        assert_eq!(r.status(name), "pass", "{name}: {}", r.stdout);
    }
    assert_eq!(r.check("gate2[B=3]")["metrics"]["rows"], 15);
    // gate3 holds the mixed greedy/sampled batch among its parts.
    let msg = r.check("gate3[B=3]")["message"]
        .as_str()
        .unwrap()
        .to_string();
    for part in [
        "mixed greedy/sampled rows == each row alone",
        "mixed batch greedy rows == host argmax",
    ] {
        assert!(msg.contains(part), "{msg}");
    }
    // The first batch size dumps to logits.safetensors, the others to logits.b<B>.
    for (file, b) in [("logits.safetensors", 1), ("logits.b3.safetensors", 3)] {
        let bytes = std::fs::read(r.artifacts.path().join(file)).unwrap();
        let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
        assert_eq!(st.len(), 5, "{file}: one tensor per step");
        let t = st.tensor("step.4").unwrap();
        assert_eq!(t.shape(), &[b, 512]);
        assert_eq!(t.dtype(), safetensors::Dtype::F32);
    }
}

/// Strict mode holds the batch to the single-sequence path: gate1 (single vs batched at
/// B=1) and gate2 (each batch row vs its sequence alone through `decode_step_h`), bit for
/// bit. Under the equalized pins both paths are one composition; under the defaults the
/// single path runs the fused tier and both fail by design.
#[test]
fn strict_gates_pass_under_equalized_pins_and_fail_under_defaults() {
    let m = model_arg();
    let eq = gate(&[&m, "--mode", "strict", "--steps", "4"], &EQUALIZED);
    assert_eq!(eq.code, 0, "{}", eq.stdout);
    assert_eq!(eq.status("gate1"), "pass");
    assert_eq!(eq.status("gate2[B=4]"), "pass");
    assert_eq!(eq.status("gate2[B=4,1,4]"), "pass");
    let msg = eq.check("gate2[B=4]")["message"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(msg.contains("single-sequence path"), "{msg}");
    assert_eq!(eq.rows[0]["doors"]["matvec"], "dp4a");

    let def = gate(&[&m, "--mode", "strict", "--steps", "4"], &[]);
    assert_eq!(def.code, 1, "{}", def.stdout);
    let g1 = def.check("gate1");
    assert_eq!(g1["status"], "fail");
    assert_eq!(
        g1["first_mismatch"]["step"], 0,
        "the fused tier differs from the first step"
    );
    assert_eq!(def.status("gate2[B=4]"), "fail");
    assert_eq!(def.check("gate2[B=4]")["first_mismatch"]["step"], 0);
    // gate3 holds the batch to itself, which the fused tier does not enter.
    assert_eq!(def.status("gate3[B=4]"), "pass");
    // In config mode gate2 holds the batch to the batched path at B=1, under any pins.
    let config = gate(&[&m, "--steps", "4"], &[]);
    assert_eq!(config.code, 0, "{}", config.stdout);
    assert_eq!(config.status("gate2[B=4]"), "pass");
}

#[test]
fn the_canary_fails_every_mode() {
    let m = model_arg();
    let canary = [("MEMRA_GATE_CANARY", "1")];
    for mode in ["config", "strict", "pp"] {
        let r = gate(&[&m, "--mode", mode, "--steps", "4"], &canary);
        assert_eq!(r.code, 1, "{mode}: {}", r.stdout);
        assert!(r.rows.iter().any(|c| c["status"] == "fail"), "{mode}");
        assert!(r.stdout.contains("FAIL"), "{mode}");
    }
    let r = gate(&[&m, "--steps", "4"], &canary);
    // The wrong token is fed to the last row of a batch: gate2 points at it.
    assert_eq!(
        r.status("gate2[B=4,1,4]"),
        "fail",
        "the batch's last row takes it"
    );
    let first = &r.check("gate2[B=4]")["first_mismatch"];
    assert_eq!(
        (first["step"].as_u64(), first["row"].as_u64()),
        (Some(0), Some(3))
    );
}

#[test]
fn the_canary_fails_gate1_on_every_draw_from_the_first_steps() {
    let m = model_arg();
    let canary = [("MEMRA_GATE_CANARY", "1")];
    // The single path takes one wrong token, at its first step after the prompt, and the
    // batched path at B=1 none: that one token turns every draw early (measured: divergence
    // steps 0,0,0,0,0,0 here, 0,0,0,1,0,0 on SmolLM2), so the 4-of-6 rule fires.
    let r = gate(&[&m, "--steps", "4", "--batch", "1"], &canary);
    assert_eq!(r.code, 1, "{}", r.stdout);
    let g1 = r.check("gate1");
    assert_eq!(g1["status"], "fail", "{g1:#}");
    assert_eq!(g1["metrics"]["draws"], 6, "{g1:#}");
    assert_eq!(g1["metrics"]["early_divergences"], 6, "{g1:#}");
    // gate1 runs at least 3 steps whatever --steps says: one step sees only the first
    // token, which one wrong token often leaves unchanged (on SmolLM2, 3 of 31 seeds passed
    // the canary at --steps 1 before).
    let one = gate(&[&m, "--steps", "1", "--batch", "1"], &canary);
    assert_eq!(one.status("gate1"), "fail", "{}", one.stdout);
    assert_eq!(one.check("gate1")["metrics"]["steps"], 3);
    let strict = gate(&[&m, "--steps", "4", "--mode", "strict"], &canary);
    assert_eq!(strict.status("gate1"), "fail");
    assert_eq!(strict.check("gate1")["first_mismatch"]["step"], 0);
    // Under MEMRA_SERVE_B1FAST=1 both sides of gate1 take the single path; gate2 still
    // catches the canary, on the rows whose alone runs took the single path.
    let fast = gate(
        &[&m, "--steps", "4"],
        &[canary[0], ("MEMRA_SERVE_B1FAST", "1")],
    );
    assert_eq!(fast.code, 1, "{}", fast.stdout);
    assert_eq!(fast.status("gate2[B=4]"), "fail");
    assert_eq!(fast.check("gate2[B=4]")["first_mismatch"]["row"], 0);
    // gate1 itself compares the single path with itself there: a warning, never a pass.
    assert_eq!(fast.status("gate1"), "warn", "{}", fast.stdout);
    let alone = gate(
        &[&m, "--steps", "4", "--batch", "1"],
        &[canary[0], ("MEMRA_SERVE_B1FAST", "1")],
    );
    assert_eq!(alone.status("gate1"), "warn", "{}", alone.stdout);
    assert!(alone.stdout.contains("holds nothing"), "{}", alone.stdout);
}

/// The width-changing row needs three phases of at least one step each: with fewer steps it
/// says it held nothing instead of running more steps than asked.
#[test]
fn the_width_changing_row_needs_three_steps() {
    let m = model_arg();
    let r = gate(&[&m, "--steps", "2", "--batch", "2"], &[]);
    assert_eq!(r.code, 0, "{}", r.stdout);
    assert_eq!(r.status("gate2[B=2,1,2]"), "warn");
    let r = gate(&[&m, "--steps", "3", "--batch", "2"], &[]);
    assert_eq!(r.status("gate2[B=2,1,2]"), "pass", "{}", r.stdout);
    let msg = r.check("gate2[B=2,1,2]")["message"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        msg.contains("1 step at B=2, 1 step with row 0 alone"),
        "{msg}"
    );
}

#[test]
fn prompts_past_two_attention_chunks_stay_green() {
    let m = model_arg();
    // 130 positions and more: attention over three chunks of 64 in every mode.
    for (args, env) in [
        (vec!["--batch", "1,3"], vec![]),
        (vec!["--mode", "strict", "--batch", "2"], EQUALIZED.to_vec()),
        (
            vec!["--mode", "pp", "--batch", "1,3", "--reps", "1"],
            vec![],
        ),
    ] {
        let mut argv = vec![m.as_str(), "--steps", "3", "--plen", "130"];
        argv.extend(&args);
        let r = gate(&argv, &env);
        assert_eq!(r.code, 0, "{args:?}: {}", r.stdout);
        assert_eq!(
            r.rows[0]["doors"]["plen"], 130,
            "{args:?}: the doors row names it"
        );
        assert!(r.rows.iter().skip(1).all(|c| c["status"] == "pass"));
    }
}

#[test]
fn a_batch_size_dependent_reduction_is_caught_by_gate2_and_the_mixed_batch() {
    let m = model_arg();
    let r = gate(
        &[&m, "--steps", "4"],
        &[("MEMRA_GATE_DEFECT", "batch-reduction")],
    );
    assert_eq!(r.code, 1, "{}", r.stdout);
    assert!(
        r.stdout
            .contains("WARNING: MEMRA_GATE_DEFECT=batch-reduction")
    );
    assert_eq!(r.rows[0]["doors"]["defect"], "batch-reduction");
    assert_eq!(r.status("gate2[B=4]"), "fail");
    assert_eq!(r.status("gate1"), "pass");
    // gate3's mixed batch compares its parked logits with each row alone, so it sees the
    // rows move too; its other parts compare batches of one size with each other.
    let msg = r.check("gate3[B=4]")["message"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        msg.contains("mixed greedy/sampled rows == each row alone"),
        "{msg}"
    );
    assert!(!msg.contains("parked logits == full tick"), "{msg}");
    // At B=1 the defect is dormant: gate2 at B=1 has nothing to see.
    let b1 = gate(
        &[&m, "--steps", "4", "--batch", "1"],
        &[("MEMRA_GATE_DEFECT", "batch-reduction")],
    );
    assert_eq!(b1.status("gate2[B=1]"), "pass");
}

#[test]
fn a_wrong_sampling_counter_is_caught_by_gate3_only() {
    let m = model_arg();
    let r = gate(
        &[&m, "--steps", "4"],
        &[("MEMRA_GATE_DEFECT", "sample-counter")],
    );
    assert_eq!(r.code, 1, "{}", r.stdout);
    assert_eq!(r.status("gate3[B=4]"), "fail");
    assert_eq!(r.status("gate2[B=4]"), "pass");
    let msg = r.check("gate3[B=4]")["message"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(msg.contains("sampled streams B=N == B=1"), "{msg}");
    assert!(
        msg.contains("mixed greedy/sampled rows == each row alone"),
        "the mixed batch's sampled rows move too: {msg}"
    );
    assert!(
        !msg.contains("device greedy") && !msg.contains("mixed batch greedy rows"),
        "greedy needs no counter: {msg}"
    );
}

#[test]
fn b1fast_and_split_placements_stay_green() {
    let m = model_arg();
    let r = gate(
        &[&m, "--mode", "strict", "--batch", "1,2", "--steps", "4"],
        &[
            ("MEMRA_SERVE_B1FAST", "1"),
            ("MEMRA_PP_STAGES", "2"),
            ("MEMRA_MMVQ", "0"),
            ("MEMRA_NO_FUSE_NORMQ", "1"),
        ],
    );
    assert_eq!(r.code, 0, "{}", r.stdout);
    assert_eq!(r.rows[0]["doors"]["pp_stages"], 2);
    assert_eq!(r.rows[0]["doors"]["b1fast"], true);
}

#[test]
fn gate_seed_changes_the_prompts_and_stays_green() {
    let m = model_arg();
    let a = gate(
        &[&m, "--steps", "3", "--batch", "2"],
        &[("MEMRA_GATE_SEED", "5")],
    );
    let b = gate(&[&m, "--steps", "3", "--batch", "2"], &[]);
    assert_eq!((a.code, b.code), (0, 0));
    let read = |r: &Run| std::fs::read(r.artifacts.path().join("logits.safetensors")).unwrap();
    assert_ne!(read(&a), read(&b), "MEMRA_GATE_SEED must move the prompts");
    assert_eq!(a.rows[0]["doors"]["gate_seed"], 5);
}

fn usage(args: &[&str], env: &[(&str, &str)], want: &str) {
    let r = gate(args, env);
    assert_eq!(r.code, 2, "{args:?}: {}\n{}", r.stdout, r.stderr);
    assert!(r.stderr.contains(want), "{args:?}: {}", r.stderr);
    assert!(r.rows.is_empty(), "a setup error writes no check rows");
}

#[test]
fn bad_model_flags_and_pins_exit_2_with_the_fix_named() {
    let m = model_arg();
    usage(&["/nonexistent/model.gguf"], &[], "/nonexistent/model.gguf");
    usage(&[&m, "--batch", "0"], &[], "--batch \"0\"");
    usage(&[&m, "--mode", "fast"], &[], "invalid value 'fast'");
    usage(&[&m, "--stages", "2"], &[], "--mode pp");
    usage(&[&m, "--steps", "600"], &[], "context is 512");
    usage(
        &[&m],
        &[("MEMRA_GATE_DEFECT", "typo")],
        "MEMRA_GATE_DEFECT=\"typo\"",
    );
    usage(
        &[&m, "--mode", "pp", "--stages", "3"],
        &[("MEMRA_PP_STAGES", "2")],
        "--stages 3 disagrees with MEMRA_PP_STAGES=2",
    );
    let not_gguf = Path::new(env!("CARGO_MANIFEST_DIR")).join("Cargo.toml");
    usage(&[not_gguf.to_str().unwrap()], &[], "cannot load the model");
}

#[test]
fn outside_the_orchestrator_nothing_is_written() {
    let m = model_arg();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_decode-batch-gate"));
    for var in memra_engine::doors::DOOR_VARIABLES {
        cmd.env_remove(var);
    }
    let cwd = tempfile::tempdir().unwrap();
    let out = cmd
        .env_remove("MEMRA_ORCH_CHECKS")
        .env_remove("MEMRA_ORCH_ARTIFACTS")
        .env("MEMRA_BACKEND", "cpu")
        .current_dir(cwd.path())
        .args([&m, "--steps", "2", "--batch", "2"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&out.stdout).contains("doors: backend=cpu"));
    assert_eq!(std::fs::read_dir(cwd.path()).unwrap().count(), 0);
}
