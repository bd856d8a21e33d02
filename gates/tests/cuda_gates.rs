//! The gate binaries on the CUDA backend: `reference-gate` under the strict policy (the
//! quantized arms follow the CUDA trace, and the canary fails them by hard mismatches), and
//! `decode-batch-gate` catching the `batch-reduction` defect in gate2 and the
//! `sample-counter` defect in gate3.
//!
//! Each test prints why and returns when no usable GPU is present, so CI without a GPU stays
//! green.

#[path = "../../engine/tests/common/mod.rs"]
mod common;

use common::gpu_present;

/// The check rows (`MEMRA_ORCH_CHECKS` lines) and exit status of `reference-gate` run from
/// the repository root on the CUDA backend, with the extra environment `env`.
fn reference_gate_on_cuda(env: &[(&str, &str)]) -> (i32, String, Vec<serde_json::Value>) {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf();
    let dir = tempfile::tempdir().unwrap();
    let checks = dir.path().join("checks.jsonl");
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_reference-gate"));
    for var in memra_engine::doors::DOOR_VARIABLES {
        cmd.env_remove(var);
    }
    let out = cmd
        .current_dir(&root)
        .env("MEMRA_BACKEND", "cuda")
        .env("MEMRA_ORCH_CHECKS", &checks)
        .env_remove("MEMRA_ORCH_ARTIFACTS")
        .arg(dir.path().join("receipt.tsv"))
        .envs(env.iter().copied())
        .output()
        .unwrap();
    let rows = std::fs::read_to_string(&checks)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let text = format!(
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code().unwrap_or(-1), text, rows)
}

#[test]
fn cuda_reference_gate_judges_quantized_arms_by_the_following_oracle() {
    if !gpu_present("cuda_reference_gate_judges_quantized_arms_by_the_following_oracle") {
        return;
    }
    // The gate end to end on the GPU: the quantized arms follow the CUDA trace under the
    // strict policy (no relative-RMS screen), and the canary fails them by hard mismatches.
    let arm = |rows: &[serde_json::Value], name: &str| -> serde_json::Value {
        rows.iter()
            .find(|c| c["check"] == name)
            .unwrap_or_else(|| panic!("no check {name}"))
            .clone()
    };
    let (code, text, rows) = reference_gate_on_cuda(&[]);
    assert_eq!(code, 0, "{text}");
    for name in ["reference.q8_0", "reference.q4_1"] {
        let c = arm(&rows, name);
        assert_eq!(c["status"], "pass", "{c}");
        assert_eq!(c["metrics"]["oracle"], "q8_1-following", "{c}");
        assert_eq!(c["metrics"]["quant_mismatches"], 0, "{c}");
        assert_eq!(c["metrics"]["warnings"], 0, "{c}");
        assert!(c["metrics"]["max_abs"].as_f64().unwrap() <= 1e-2, "{c}");
        eprintln!(
            "{name} on CUDA: max_abs {}, ties followed {}",
            c["metrics"]["max_abs"], c["metrics"]["ties_followed"]
        );
    }
    assert_eq!(arm(&rows, "reference.tiny")["status"], "pass");
    let (code, text, rows) = reference_gate_on_cuda(&[("MEMRA_GATE_CANARY", "1")]);
    assert_eq!(code, 1, "{text}");
    for name in ["reference.q8_0", "reference.q4_1"] {
        let c = arm(&rows, name);
        assert_eq!(c["status"], "fail", "{c}");
        assert_eq!(c["metrics"]["oracle"], "q8_1-following", "{c}");
        assert!(
            c["metrics"]["quant_mismatches"].as_u64().unwrap() > 0,
            "{c}"
        );
    }
}

/// The check rows, output and exit status of `decode-batch-gate` on the CUDA backend over
/// the tiny Q4_1 model, with the extra environment `env`.
fn decode_gate_on_cuda(
    args: &[&str],
    env: &[(&str, &str)],
) -> (i32, String, Vec<serde_json::Value>) {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("tiny-q4_1.gguf");
    memra_engine::synth::write_preset("tiny", "q4_1", 11, &model).unwrap();
    let checks = dir.path().join("checks.jsonl");
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_decode-batch-gate"));
    for var in memra_engine::doors::DOOR_VARIABLES {
        cmd.env_remove(var);
    }
    let out = cmd
        .env("MEMRA_BACKEND", "cuda")
        .env("MEMRA_ORCH_CHECKS", &checks)
        .env_remove("MEMRA_ORCH_ARTIFACTS")
        .arg(&model)
        .args(args)
        .envs(env.iter().copied())
        .output()
        .unwrap();
    let rows = std::fs::read_to_string(&checks)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let text = format!(
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code().unwrap_or(-1), text, rows)
}

fn check_row<'a>(rows: &'a [serde_json::Value], name: &str) -> &'a serde_json::Value {
    rows.iter()
        .find(|c| c["check"] == name)
        .unwrap_or_else(|| panic!("no check {name} in {rows:#?}"))
}

#[test]
fn cuda_decode_batch_gate_catches_the_batch_reduction_and_sample_counter_defects() {
    if !gpu_present("cuda_decode_batch_gate_catches_the_batch_reduction_and_sample_counter_defects")
    {
        return;
    }
    let args = ["--steps", "6", "--batch", "1,4"];
    // Clean, every gate holds on the GPU, the mixed greedy/sampled batch among gate3's parts.
    let (code, text, rows) = decode_gate_on_cuda(&args, &[]);
    assert_eq!(code, 0, "{text}");
    assert_eq!(rows[0]["doors"]["backend"], "cuda", "{text}");
    let gate3 = check_row(&rows, "gate3[B=4]");
    assert_eq!(gate3["status"], "pass", "{gate3}");
    assert!(
        gate3["message"]
            .as_str()
            .unwrap()
            .contains("mixed greedy/sampled rows == each row alone"),
        "{gate3}"
    );

    // The reversed head norm of batched passes: gate2 sees the B=4 rows move, B=1 does not.
    let (code, text, rows) =
        decode_gate_on_cuda(&args, &[("MEMRA_GATE_DEFECT", "batch-reduction")]);
    assert_eq!(code, 1, "{text}");
    assert_eq!(rows[0]["doors"]["defect"], "batch-reduction", "{text}");
    assert_eq!(check_row(&rows, "gate2[B=4]")["status"], "fail", "{text}");
    assert_eq!(check_row(&rows, "gate2[B=1]")["status"], "pass", "{text}");
    assert_eq!(check_row(&rows, "gate1")["status"], "pass", "{text}");

    // The device sampler's counter offset by the batch row: gate3's sampled streams and its
    // mixed batch fail, greedy and gate2 hold.
    let (code, text, rows) = decode_gate_on_cuda(&args, &[("MEMRA_GATE_DEFECT", "sample-counter")]);
    assert_eq!(code, 1, "{text}");
    assert_eq!(rows[0]["doors"]["defect"], "sample-counter", "{text}");
    assert_eq!(check_row(&rows, "gate2[B=4]")["status"], "pass", "{text}");
    let gate3 = check_row(&rows, "gate3[B=4]");
    assert_eq!(gate3["status"], "fail", "{gate3}");
    let msg = gate3["message"].as_str().unwrap();
    assert!(msg.contains("sampled streams B=N == B=1"), "{msg}");
    assert!(
        msg.contains("mixed greedy/sampled rows == each row alone"),
        "{msg}"
    );
    assert!(
        !msg.contains("device greedy") && !msg.contains("mixed batch greedy rows"),
        "greedy needs no counter: {msg}"
    );
}
