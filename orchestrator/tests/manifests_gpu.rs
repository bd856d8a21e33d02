//! The shipped GPU manifests on a machine without GPUs: `h100-nightly.toml` and
//! `h200-single.toml` validate and plan (pp arms on 2 GPUs in both device orders in the
//! nightly, on GPU 0 alone in the one-GPU battery), the nightly's 2-GPU arms are skipped with
//! the reason on one GPU once its `[require]` is lifted, and `scripts/device-battery` runs the
//! one-GPU battery with prebuilt binaries (`--require-gpus 0`), every GPU arm skipped and the
//! results copied to `$OUT`.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use crate::run_support::{newest_run, read_json};
use serde_json::Value;

/// The repository root, or `None` outside a git checkout (the manifests' paths resolve
/// against the git top-level, DESIGN §3); the tests then skip, saying why.
fn repo_root() -> Option<PathBuf> {
    let out = Command::new("git")
        .arg("-C")
        .arg(env!("CARGO_MANIFEST_DIR"))
        .args(["rev-parse", "--show-toplevel"])
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()))
}

macro_rules! root_or_skip {
    () => {
        match repo_root() {
            Some(r) => r,
            None => {
                eprintln!(
                    "skipped: {} is not inside a git checkout",
                    env!("CARGO_MANIFEST_DIR")
                );
                return;
            }
        }
    };
}

fn orch(args: &[&str]) -> Output {
    // Leases of its own, so a run here never waits for another test's fake GPUs.
    let leases = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_memra-orch"))
        .args(args)
        .env("MEMRA_GPU_LOCK_DIR", leases.path())
        .output()
        .unwrap();
    eprintln!(
        "--- memra-orch {args:?}\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// The folder of the binaries under test, with the engine's and the kernels' binaries built
/// into it by the same profile (a no-op when `cargo test --workspace` already built them).
fn test_bin_dir() -> PathBuf {
    let bin = Path::new(env!("CARGO_BIN_EXE_memra-orch"))
        .parent()
        .unwrap();
    let profile = match bin.file_name().and_then(|n| n.to_str()) {
        Some("debug") | None => "dev",
        Some(other) => other,
    };
    let status = Command::new(env!("CARGO"))
        .args(["build", "--locked", "--bins", "-p", "memra-engine", "-p"])
        .args(["memra-kernels", "--profile", profile, "--target-dir"])
        .arg(bin.parent().unwrap())
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .status()
        .unwrap();
    assert!(status.success(), "building the engine binaries failed");
    bin.to_path_buf()
}

fn plan_json(manifest: &Path) -> Value {
    let out = orch(&["plan", manifest.to_str().unwrap(), "--format", "json"]);
    assert!(out.status.success());
    serde_json::from_slice(&out.stdout).unwrap()
}

fn cells_of<'a>(plan: &'a Value, node: &str) -> Vec<&'a Value> {
    plan["cells"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["node"] == node)
        .collect()
}

#[test]
fn every_shipped_manifest_validates() {
    let root = root_or_skip!();
    let manifests: Vec<String> = std::fs::read_dir(root.join("manifests"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "toml"))
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    assert!(manifests.len() >= 3, "{manifests:?}");
    let mut args = vec!["validate"];
    args.extend(manifests.iter().map(String::as_str));
    let out = orch(&args);
    assert_eq!(out.status.code(), Some(0));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        stdout.lines().filter(|l| l.starts_with("ok: ")).count(),
        manifests.len()
    );
}

#[test]
fn the_nightly_plans_pp_on_two_gpus_in_both_orders_with_canaries_and_compares() {
    let root = root_or_skip!();
    let plan = plan_json(&root.join("manifests/h100-nightly.toml"));
    let pp = cells_of(&plan, "pp");
    let orders: Vec<&str> = pp
        .iter()
        .map(|c| c["env"]["MEMRA_PP_DEVICES"].as_str().unwrap())
        .collect();
    assert_eq!(orders, ["0,1", "1,0"]);
    for c in &pp {
        assert_eq!(c["gpus"], 2);
        assert_eq!(c["env"]["MEMRA_PP_STAGES"], "2");
        assert_eq!(c["env"]["MEMRA_BACKEND"], "cuda");
    }
    // Every env-matrix file is recorded with its digest, so a receipt pins what it ran under.
    let matrices: Vec<&str> = plan["env_matrices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["path"].as_str().unwrap())
        .collect();
    for f in ["mmvq", "fa3", "b1fast", "equalized", "pp-orders"] {
        assert!(
            matrices
                .iter()
                .any(|m| m.ends_with(&format!("env-matrices/{f}.toml"))),
            "{matrices:?}"
        );
    }
    assert_eq!(cells_of(&plan, "decode-config").len(), 4);
    // The B=1 shortcut sweeps only under the equalized pins; under the default pins it is
    // asserted to break batch invariance (a negative cell).
    let b1fast = cells_of(&plan, "decode-b1fast");
    assert_eq!(b1fast.len(), 2);
    for c in &b1fast {
        assert_eq!(c["env"]["MEMRA_MMVQ"], "0");
        assert_eq!(c["env"]["MEMRA_NO_FUSE_NORMQ"], "1");
    }
    let canaries: Vec<&str> = plan["cells"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["expect"] == "fail")
        .map(|c| c["node"].as_str().unwrap())
        .collect();
    for n in [
        "kernel-check-canary",
        "decode-strict-default",
        "decode-canary",
        "decode-b1fast-fused",
        "doors-switch",
    ] {
        assert!(canaries.contains(&n), "{canaries:?}");
    }
    let policy = |node: &str| cells_of(&plan, node)[0]["compare"]["policy"].clone();
    assert_eq!(policy("pp-vs-unsplit")["kind"], "bitwise");
    assert_eq!(cells_of(&plan, "pp-vs-unsplit").len(), 2);
    assert_eq!(policy("fa3-vs-naive")["kind"], "argmax_agree");
    assert_eq!(policy("mmvq-vs-dp4a")["kind"], "argmax_agree");
    // The performance switches are held to the default dump's bits.
    assert_eq!(policy("switches-change-no-bit")["kind"], "bitwise");
    let plain = &cells_of(&plan, "dump-plain")[0];
    for var in [
        "MEMRA_MMA",
        "MEMRA_PDL",
        "MEMRA_PROLOGUES",
        "MEMRA_CLAIM_SM",
        "MEMRA_SMALL_BATCH",
        "MEMRA_PROMPT_TILE",
    ] {
        assert_eq!(plain["env"][var], "0", "{plain:#}");
    }
    // And so is the tensor-core matvec's streaming form.
    let streaming = &cells_of(&plan, "dump-streaming")[0];
    assert_eq!(streaming["env"]["MEMRA_MMA_RESIDENT"], "0", "{streaming:#}");
    assert_eq!(cells_of(&plan, "switches-change-no-bit").len(), 2);
    // The real model is fetched once (`creates`) and joins reference-gate.
    let fetch = &cells_of(&plan, "fetch-model")[0];
    assert!(!fetch["creates"].as_array().unwrap().is_empty());
    let reference = &cells_of(&plan, "reference")[0];
    assert!(
        reference["argv"]
            .as_array()
            .unwrap()
            .iter()
            .any(|a| a == "--model")
    );
    assert!(
        reference["needs"]
            .as_array()
            .unwrap()
            .iter()
            .any(|n| n == "fetch-model")
    );
}

#[test]
fn the_one_gpu_battery_needs_one_gpu_places_both_stages_on_it_and_plants_the_cuda_defects() {
    let root = root_or_skip!();
    let plan = plan_json(&root.join("manifests/h200-single.toml"));
    let cells = plan["cells"].as_array().unwrap();
    assert!(cells.iter().all(|c| c["gpus"].as_u64().unwrap() <= 1));
    let pp = cells_of(&plan, "pp");
    assert_eq!(pp.len(), 1);
    assert_eq!(pp[0]["env"]["MEMRA_PP_DEVICES"], "0,0");
    assert_eq!(pp[0]["env"]["MEMRA_PP_STAGES"], "2");
    assert!(
        cells.iter().all(|c| c["node"] != "fetch-model"),
        "the one-GPU battery needs no network"
    );
    // The planted defects reach the CUDA backend through the gate's environment, each a
    // negative cell.
    for defect in ["batch-reduction", "sample-counter"] {
        let cell = &cells_of(&plan, &format!("decode-defect-{defect}"))[0];
        assert_eq!(cell["env"]["MEMRA_GATE_DEFECT"], defect, "{cell:#}");
        assert_eq!(cell["env"]["MEMRA_BACKEND"], "cuda", "{cell:#}");
        assert_eq!(cell["expect"], "fail", "{cell:#}");
    }
    // The device sampler against the reference sampler on the synthesized model, green and
    // under the nucleus cut one token early, the top-k cut one token late and the top-k cut
    // that drops the ties at the k-th (negative cells).
    let sampling = &cells_of(&plan, "sampling")[0];
    let cut = &cells_of(&plan, "sampling-defect")[0];
    let late = &cells_of(&plan, "sampling-defect-top-k")[0];
    let ties = &cells_of(&plan, "sampling-defect-top-k-ties")[0];
    for c in [sampling, cut, late, ties] {
        assert!(
            c["argv"][0].as_str().unwrap().ends_with("sampling-gate"),
            "{c:#}"
        );
        assert!(
            c["argv"][1]
                .as_str()
                .unwrap()
                .ends_with("smollm2-135m-q4_1.gguf"),
            "{c:#}"
        );
        assert_eq!(c["env"]["MEMRA_BACKEND"], "cuda", "{c:#}");
    }
    assert_eq!(sampling["expect"], "pass", "{sampling:#}");
    assert_eq!(cut["env"]["MEMRA_GATE_DEFECT"], "top-p-cut", "{cut:#}");
    assert_eq!(cut["expect"], "fail", "{cut:#}");
    assert_eq!(late["env"]["MEMRA_GATE_DEFECT"], "top-k-cut", "{late:#}");
    assert_eq!(late["expect"], "fail", "{late:#}");
    assert_eq!(ties["env"]["MEMRA_GATE_DEFECT"], "top-k-ties", "{ties:#}");
    assert_eq!(ties["expect"], "fail", "{ties:#}");
}

#[test]
fn on_one_gpu_the_nightly_skips_its_two_gpu_arms_saying_why() {
    let root = root_or_skip!();
    let bin = test_bin_dir();
    let tmp = tempfile::tempdir().unwrap();
    let out = orch(&[
        "run",
        root.join("manifests/h100-nightly.toml").to_str().unwrap(),
        "--gpus",
        "fake:1",
        // The nightly requires 2 GPUs; lifting that runs what one GPU can.
        "--require-gpus",
        "0",
        "--filter",
        "pp[[]*",
        "--var",
        &format!("bin={}", bin.display()),
        "--var",
        "build=true",
        "--var",
        &format!("models={}", tmp.path().join("models").display()),
        "--receipts",
        tmp.path().join("receipts").to_str().unwrap(),
        "--commit",
        "nightly-test",
        "--progress",
        "plain",
    ]);
    assert_eq!(out.status.code(), Some(0));
    let tree = newest_run(&tmp.path().join("receipts/nightly-test/h100-nightly"));
    let run = read_json(&tree.join("run.json"));
    let nodes = run["nodes"].as_array().unwrap();
    let verdict = |id: &str| {
        nodes
            .iter()
            .find(|n| n["id"] == id)
            .unwrap_or_else(|| panic!("no node {id}"))["verdict"]
            .clone()
    };
    // What the pp arms need ran (the synthesized model exists), the arms themselves did not.
    assert_eq!(verdict("synth"), "pass");
    assert!(tmp.path().join("models/smollm2-135m-q4_1.gguf").is_file());
    for id in [
        r#"pp[MEMRA_PP_DEVICES="0,1"]"#,
        r#"pp[MEMRA_PP_DEVICES="1,0"]"#,
    ] {
        assert_eq!(verdict(id), "skipped");
        let slug = nodes.iter().find(|n| n["id"] == id).unwrap()["slug"]
            .as_str()
            .unwrap()
            .to_string();
        let r = read_json(&tree.join("nodes").join(slug).join("receipt.json"));
        assert_eq!(r["reason"], "needs 2 GPUs, 1 detected", "{r:#}");
    }
}

#[test]
fn the_device_battery_runs_the_one_gpu_battery_with_prebuilt_binaries() {
    let root = root_or_skip!();
    let bin = test_bin_dir();
    let tmp = tempfile::tempdir().unwrap();
    let results = tmp.path().join("out");
    // Extra arguments go to `memra-orch run`: keep the synthesized model out of the checkout.
    let models = format!("models={}", tmp.path().join("models").display());
    let out = Command::new(root.join("scripts/device-battery"))
        // The cross-backend cells' CPU halves would run without a GPU (minutes of SmolLM2
        // dumps on the CPU) only to feed compares that cannot run: left out here.
        .args(["--gpus", "none", "--require-gpus", "0", "--var", &models])
        .args(["--exclude", "tag:cpu-vs-cuda"])
        .env("MEMRA_DEVICE_BIN", &bin)
        .env("MEMRA_DEVICE_RECEIPTS", tmp.path().join("receipts"))
        .env("MEMRA_DEVICE_COMMIT", "device-test")
        .env("OUT", &results)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    eprintln!("{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(out.status.code(), Some(0));
    assert!(stdout.contains("== memra-orch gpus"));
    for f in [
        "gpus.txt",
        "gpus.json",
        "summary.md",
        "run.json",
        "junit.xml",
    ] {
        assert!(results.join(f).is_file(), "$OUT lacks {f}");
    }
    assert!(newest_run(&results.join("receipts/device-test/h200-single")).is_dir());
    let run = read_json(&results.join("run.json"));
    assert_eq!(run["verdict"], "pass");
    assert_eq!(run["commit"], "device-test");
    // The build was replaced by the prebuilt binaries; the models were synthesized; every
    // GPU cell was skipped for want of a GPU, not failed.
    let tree = newest_run(&tmp.path().join("receipts/device-test/h200-single"));
    for n in run["nodes"].as_array().unwrap() {
        let Some(slug) = n["slug"].as_str() else {
            // Left out by --exclude: no receipt, and skipped.
            assert_eq!(n["verdict"], "skipped", "{n:#}");
            continue;
        };
        let r = read_json(&tree.join("nodes").join(slug).join("receipt.json"));
        if r["kind"] == "setup" {
            assert_eq!(r["verdict"], "pass", "{r:#}");
        } else {
            assert_eq!(r["verdict"], "skipped", "{r:#}");
        }
        if r["id"] == "build" {
            assert_eq!(r["produces"].as_array().unwrap().len(), 9);
        }
    }
    assert!(tmp.path().join("models/smollm2-135m-q4_1.gguf").is_file());
}

#[test]
fn the_device_battery_runs_the_nightly_on_a_stand_in_for_the_real_checkpoint() {
    let root = root_or_skip!();
    let bin = test_bin_dir();
    let tmp = tempfile::tempdir().unwrap();
    let results = tmp.path().join("out");
    let models = format!("models={}", tmp.path().join("models").display());
    let out = Command::new(root.join("scripts/device-battery"))
        // The cross-backend cells' CPU halves would run without a GPU (minutes of SmolLM2
        // dumps on the CPU) only to feed compares that cannot run: left out here.
        .args(["--gpus", "none", "--require-gpus", "0", "--var", &models])
        .args(["--exclude", "tag:cpu-vs-cuda"])
        .env("MEMRA_DEVICE_BIN", &bin)
        .env("MEMRA_DEVICE_MANIFEST", "manifests/h100-nightly.toml")
        .env("MEMRA_DEVICE_STANDIN", "1")
        .env("MEMRA_DEVICE_RECEIPTS", tmp.path().join("receipts"))
        .env("MEMRA_DEVICE_COMMIT", "device-test")
        .env("OUT", &results)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    eprintln!("{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(out.status.code(), Some(0));
    let standin = tmp
        .path()
        .join("receipts/standin/smollm2-135m-q4_1-seed1.gguf");
    assert!(stdout.contains("run on a synthesized stand-in"), "{stdout}");
    assert!(standin.is_file());
    // Filed under the manifest's own name, and the fetch was not attempted: the stand-in
    // is what `creates` found.
    let tree = newest_run(&tmp.path().join("receipts/device-test/h100-nightly"));
    let run = read_json(&tree.join("run.json"));
    assert_eq!(run["verdict"], "pass");
    assert!(newest_run(&results.join("receipts/device-test/h100-nightly")).is_dir());
    let fetch = run["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["id"] == "fetch-model")
        .expect("the nightly has a fetch-model setup");
    let r = read_json(
        &tree
            .join("nodes")
            .join(fetch["slug"].as_str().unwrap())
            .join("receipt.json"),
    );
    assert_eq!(r["verdict"], "pass", "{r:#}");
    assert!(
        r["attempts"].as_array().unwrap().is_empty(),
        "fetch-model ran although its output existed: {r:#}"
    );
}

#[test]
fn the_device_battery_names_a_missing_manifest() {
    let root = root_or_skip!();
    let bin = test_bin_dir();
    let out = Command::new(root.join("scripts/device-battery"))
        .env("MEMRA_DEVICE_BIN", &bin)
        .env("MEMRA_DEVICE_MANIFEST", "manifests/nope.toml")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("manifests/nope.toml") && stderr.contains("h100-nightly"),
        "{stderr}"
    );
}

#[test]
fn the_device_battery_names_missing_binaries() {
    let root = root_or_skip!();
    let tmp = tempfile::tempdir().unwrap();
    let out = Command::new(root.join("scripts/device-battery"))
        .env("MEMRA_DEVICE_BIN", tmp.path())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("missing in")
            && stderr.contains("memra-orch")
            && stderr.contains("cuda-check"),
        "{stderr}"
    );
}
