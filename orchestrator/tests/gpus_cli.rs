//! `memra-orch gpus` and `--gpus` parsing through the real binary. On a machine without the
//! NVML library the inventory is empty, said once, and the exit code is still 0. (The
//! CUDA_VISIBLE_DEVICES bounding rules are unit-tested in `gpus.rs` on a synthetic listing.)

use std::process::Command;

fn gpus(args: &[&str], cvd: Option<&str>) -> (i32, String, String) {
    // An empty lock folder of its own: every GPU's lease reads free.
    let leases = tempfile::tempdir().unwrap();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_memra-orch"));
    cmd.arg("gpus")
        .args(args)
        .env("MEMRA_GPU_LOCK_DIR", leases.path());
    match cvd {
        Some(v) => cmd.env("CUDA_VISIBLE_DEVICES", v),
        None => cmd.env_remove("CUDA_VISIBLE_DEVICES"),
    };
    let out = cmd.output().unwrap();
    let s = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    (
        out.status.code().unwrap_or(-1),
        s(&out.stdout),
        s(&out.stderr),
    )
}

#[test]
fn this_machine() {
    let (code, out, err) = gpus(&["--format", "json"], None);
    assert_eq!(code, 0, "{err}");
    let inv: serde_json::Value = serde_json::from_str(&out).unwrap();
    let notes = err.lines().filter(|l| l.starts_with("note: ")).count();
    if inv["source"] == "none" {
        // No NVML here: zero GPUs and exactly one note saying why.
        assert_eq!(inv["gpus"], serde_json::json!([]));
        assert_eq!(notes, 1, "{err}");
        assert!(err.contains("0 GPUs"), "{err}");
        let (code, text, _) = gpus(&[], None);
        assert_eq!(code, 0);
        assert_eq!(text, "no GPUs (source: none)\n");
    } else {
        eprintln!("NVML present: checking the real inventory");
        assert_eq!(inv["source"], "nvml");
        for g in inv["gpus"].as_array().unwrap() {
            assert!(g["uuid"].as_str().unwrap().starts_with("GPU-"), "{g}");
            assert!(g["memory_total"].as_u64().unwrap() > 0);
        }
        assert!(inv["driver_version"].is_string());
    }
}

#[test]
fn fake_and_none() {
    let (code, out, err) = gpus(&["--gpus", "fake:2", "--format", "json"], Some("7"));
    assert_eq!(code, 0);
    assert!(
        err.is_empty(),
        "fake GPUs ignore NVML and CUDA_VISIBLE_DEVICES: {err}"
    );
    let inv: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(inv["source"], "fake");
    assert_eq!(inv["gpus"][1]["uuid"], "GPU-fake-1");
    let (code, out, err) = gpus(&["--gpus", "none"], None);
    assert_eq!(
        (code, out.as_str(), err.as_str()),
        (0, "no GPUs (source: none)\n", "")
    );
    let (_, out, _) = gpus(&["--gpus", "fake:2"], None);
    assert!(out.starts_with("index  uuid"), "{out}");
    assert!(out.contains("2 GPUs (source: fake)"), "{out}");
    assert!(
        out.ends_with("\n  gpu 0: free\n  gpu 1: free\n"),
        "each GPU's lease follows the table: {out}"
    );
}

#[test]
fn bad_gpu_specs_are_usage_errors() {
    for bad in ["fake:x", "0,0", "two", ""] {
        let (code, _, err) = gpus(&["--gpus", bad], None);
        assert_eq!(code, 2, "--gpus {bad:?}: {err}");
        assert!(err.contains("--gpus"), "{err}");
    }
}
