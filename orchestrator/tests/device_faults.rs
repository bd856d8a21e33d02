//! A bad GPU is not a regression, through the real binary with faults planted on fake GPUs
//! (`MEMRA_ORCH_FAKE_GPU_FAULTS`): a failing attempt during which its GPU raised Xid 79 ends
//! `device-fault`, runs again on the healthy twin and passes there, the faulty GPU takes no
//! further cells, and run.json, summary.md, the event stream, the exit code (69) and `diff`
//! say so; a cell that fails on the healthy GPU too is a regression; a failing attempt with
//! healthy readings stays `fail`; with no healthy twin left the cell stays `device-fault` and
//! what still needs a GPU is not run; `gpus --health` marks a GPU unfit.

use std::process::Output;

use crate::run_support::{Fixture, logged, orch, read_json};

/// Passes on GPU 1 only (the cell's `CUDA_VISIBLE_DEVICES`), then a cell that needs it.
const ON_ONE: &str = r#"
schema = 1
name = "hw"

[[arm]]
id = "decode"
gpus = 1
run = "test \"$CUDA_VISIBLE_DEVICES\" = 1"
shell = true

[[arm]]
id = "after"
gpus = 1
needs = ["decode"]
run = ["{gates}/pass.sh"]
"#;

/// [`ON_ONE`] with `decode` running `script` on any GPU.
fn on_any(script: &str) -> String {
    ON_ONE.replace("test \\\"$CUDA_VISIBLE_DEVICES\\\" = 1", script)
}

/// Replaces the fixture's manifest (`{gates}` as [`Fixture::new`] fills it).
fn rewrite(f: &Fixture, manifest: &str) {
    let text = manifest.replace("{gates}", &crate::run_support::gates().to_string_lossy());
    std::fs::write(f.path().join("manifest.toml"), text).unwrap();
}

fn run(f: &Fixture, gpus: &str, faults: &str, extra: &[&str]) -> Output {
    let mut args = vec!["--gpus", gpus];
    args.extend_from_slice(extra);
    let mut cmd = f.command(&args);
    cmd.env("MEMRA_ORCH_FAKE_GPU_FAULTS", faults)
        .env("MEMRA_GPU_LOCK_DIR", f.path().join("leases"));
    logged(cmd.output().unwrap())
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn xid_79_during_a_failing_attempt_is_a_device_fault_retried_on_the_twin() {
    let f = Fixture::new(ON_ONE);
    let prom = f.path().join("m.prom");
    let out = run(
        &f,
        "fake:2",
        "gpu=0,fault=xid:79",
        &["--events", "json", "--metrics-file", prom.to_str().unwrap()],
    );
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(69), "{err}");
    assert!(
        err.contains(
            "quarantined gpu 0 (GPU-fake-0) for the rest of the run: Xid 79 during decode; it runs again on a healthy GPU of the same model"
        ),
        "{err}"
    );
    let r = f.receipt("decode");
    assert_eq!(r["verdict"], "pass", "{r:#}");
    let attempts = r["attempts"].as_array().unwrap();
    assert_eq!(attempts.len(), 2, "{r:#}");
    assert_eq!(attempts[0]["outcome"], "device-fault");
    let reason = attempts[0]["reason"].as_str().unwrap();
    assert!(
        reason.contains("gpu 0 (GPU-fake-0): Xid 79") && reason.contains("the attempt ended fail"),
        "{reason}"
    );
    let health = &attempts[0]["gpu_health"][0];
    assert_eq!(health["xids"], serde_json::json!([79]));
    assert_eq!(health["fault"], "Xid 79");
    assert_eq!(health["before"]["answers"], true);
    assert_eq!(attempts[1]["outcome"], "pass");
    assert_eq!(attempts[1]["n"], 2);
    assert_eq!(attempts[1]["gpu_health"][0]["gpu"], 1);
    assert!(
        crate::run_support::is_dir_in_tree(&f.node_dir("decode").join("attempt-1"))
            && crate::run_support::is_dir_in_tree(&f.node_dir("decode").join("attempt-2")),
        "the faulty attempt's folder is kept"
    );
    // The faulty GPU took no further cell.
    assert_eq!(f.receipt("after")["gpus"][0]["index"], 1);
    let run_json = read_json(&f.tree().join("run.json"));
    assert_eq!(run_json["verdict"], "device-fault");
    assert_eq!(
        run_json["quarantined_gpus"],
        serde_json::json!([{"gpu": 0, "uuid": "GPU-fake-0", "cell": "decode", "fault": "Xid 79", "retried": true}])
    );
    let summary = std::fs::read_to_string(f.tree().join("summary.md")).unwrap();
    assert!(summary.contains("**Device faults:**"), "{summary}");
    assert!(
        summary.contains(
            "- gpu 0 `GPU-fake-0`: Xid 79 during `decode` (queued to run again on a healthy GPU of the same model)"
        ),
        "{summary}"
    );
    let events = String::from_utf8_lossy(&out.stdout);
    assert!(
        events
            .lines()
            .any(|l| l.contains("\"type\":\"gpu-quarantined\"")
                && l.contains("\"gpu\":0")
                && l.contains("\"retry\":true")),
        "{events}"
    );
    let metrics = std::fs::read_to_string(&prom).unwrap();
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("memra_run_quarantined_gpus{") && l.ends_with(" 1")),
        "{metrics}"
    );
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("memra_run_exit_code{") && l.ends_with(" 69")),
        "{metrics}"
    );
    // `show` prints what changed on the GPU.
    let show = orch(&f, &["show", "latest", "decode"]);
    let text = String::from_utf8_lossy(&show.stdout);
    assert!(
        text.contains("gpu 0 GPU-fake-0: DEVICE FAULT: Xid 79; xids 79"),
        "{text}"
    );
}

#[test]
fn a_cell_that_fails_on_the_healthy_twin_too_is_a_regression() {
    // A night on good hardware with code that passes: green.
    let f = Fixture::new(&on_any("true"));
    assert_eq!(run(&f, "fake:2", "", &[]).status.code(), Some(0));
    // Then code that fails everywhere, on a night GPU 0 faults.
    rewrite(&f, &on_any("exit 1"));
    let out = run(&f, "fake:2", "gpu=0,fault=xid:79", &[]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let r = f.receipt("decode");
    assert_eq!(r["verdict"], "fail", "{r:#}");
    assert_eq!(r["attempts"][0]["outcome"], "device-fault");
    assert_eq!(r["attempts"][1]["outcome"], "fail");
    let diff = orch(&f, &["diff", "--manifest", "hw"]);
    let text = String::from_utf8_lossy(&diff.stdout);
    assert_eq!(diff.status.code(), Some(1), "{text}");
    assert!(text.contains("REGRESSIONS (2)"), "{text}");
    assert!(text.contains("decode  pass → fail"), "{text}");
    assert!(text.contains("DEVICE FAULTS"), "{text}");
}

#[test]
fn a_failing_attempt_with_healthy_readings_stays_a_failure() {
    let f = Fixture::new(ON_ONE);
    // The fault is planted on GPU 1; the cell runs and fails on GPU 0, which is healthy.
    let out = run(&f, "fake:2", "gpu=1,fault=xid:79,cell=nothing-here", &[]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let r = f.receipt("decode");
    assert_eq!(r["verdict"], "fail", "{r:#}");
    assert_eq!(r["attempts"].as_array().unwrap().len(), 1);
    assert!(r["attempts"][0]["gpu_health"][0].get("fault").is_none());
    // An application's own Xid (13: its kernel's exception) is no device fault either.
    let out = run(&f, "fake:2", "gpu=0,fault=xid:13", &[]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert_eq!(f.receipt("decode")["verdict"], "fail");
    let run_json = read_json(&f.tree().join("run.json"));
    assert!(run_json.get("quarantined_gpus").is_none(), "{run_json:#}");
}

#[test]
fn with_no_healthy_twin_the_cell_stays_a_device_fault_and_the_diff_is_no_regression() {
    let f = Fixture::new(&on_any("true"));
    assert_eq!(run(&f, "fake:2", "", &[]).status.code(), Some(0));
    // A cell of its own waits for the only GPU meanwhile.
    let with_other =
        format!("{ON_ONE}\n[[arm]]\nid = \"other\"\ngpus = 1\nrun = [\"{{gates}}/pass.sh\"]\n");
    rewrite(&f, &with_other);
    let out = run(&f, "fake:1", "gpu=0,fault=ecc-uncorrected", &[]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(69), "{err}");
    assert!(
        err.contains("no healthy GPU of the same model is left"),
        "{err}"
    );
    let r = f.receipt("decode");
    assert_eq!(r["verdict"], "device-fault", "{r:#}");
    assert!(
        r["reason"]
            .as_str()
            .unwrap()
            .contains("1 new uncorrected ECC error"),
        "{r:#}"
    );
    let after = f.receipt("after");
    assert_eq!(after["verdict"], "device-fault", "{after:#}");
    assert_eq!(
        after["reason"], "not run: needs decode, which ended device-fault",
        "{after:#}"
    );
    let other = f.receipt("other");
    assert_eq!(other["verdict"], "device-fault", "{other:#}");
    assert_eq!(
        other["reason"],
        "not run: too few healthy GPUs are left for it (gpu 0 quarantined after a device fault)"
    );
    let diff = orch(&f, &["diff", "--manifest", "hw"]);
    let text = String::from_utf8_lossy(&diff.stdout);
    assert_eq!(diff.status.code(), Some(0), "{text}");
    assert!(!text.contains("REGRESSIONS"), "{text}");
    assert!(
        text.contains("DEVICE FAULTS (the hardware's, not regressions)"),
        "{text}"
    );
    assert!(
        text.contains("decode") && text.contains("pass → device-fault"),
        "{text}"
    );
}

#[test]
fn gpus_health_marks_a_gpu_unfit_and_runs_can_leave_it_out() {
    let f = Fixture::new(ON_ONE);
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_memra-orch"));
    cmd.args(["gpus", "--gpus", "fake:2", "--health"]).env(
        "MEMRA_ORCH_FAKE_GPU_FAULTS",
        "gpu=0,fault=pending-retirement",
    );
    let out = logged(cmd.output().unwrap());
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0));
    assert!(
        text.contains("gpu 0 GPU-fake-0 fake GPU: UNFIT: a page is pending retirement (reset the GPU); leave it out with --exclude-gpu GPU-fake-0"),
        "{text}"
    );
    assert!(text.contains("gpu 1 GPU-fake-1 fake GPU: ok"), "{text}");
    // Left out, the run places everything on GPU 1.
    let out = run(&f, "fake:2", "", &["--exclude-gpu", "GPU-fake-0"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(f.receipt("decode")["gpus"][0]["index"], 1);
    let out = run(&f, "fake:2", "", &["--exclude-gpu", "GPU-nope"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("--exclude-gpu GPU-nope: no GPU of this run has that UUID"));
    let out = run(&f, "fake:2", "gpu=0,fault=melted", &[]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("unknown fault `melted`"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn bits_that_move_between_twin_gpus_on_identical_inputs_are_a_gpu_dependent_result() {
    // A deterministic cell (two reps that agree) whose bits depend on the card it ran on:
    // one night on GPU 0, the next on GPU 1 of the same model.
    let f = Fixture::new(
        r#"
schema = 1
name = "twins"

[[arm]]
id = "matmul"
gpus = 1
reps = 2
hermetic = true
inputs = ["manifest.toml"]
run = "echo $CUDA_VISIBLE_DEVICES > $MEMRA_ORCH_ARTIFACTS/out.bin; ! [ -e FLAG ] || [ $CUDA_VISIBLE_DEVICES != 0 ]"
shell = true
"#,
    );
    assert_eq!(
        run(&f, "fake:2", "", &["--exclude-gpu", "GPU-fake-1"])
            .status
            .code(),
        Some(0)
    );
    assert_eq!(
        run(&f, "fake:2", "", &["--exclude-gpu", "GPU-fake-0"])
            .status
            .code(),
        Some(0)
    );
    let diff = orch(&f, &["diff", "--manifest", "twins"]);
    let text = String::from_utf8_lossy(&diff.stdout);
    assert!(text.contains("GPU-DEPENDENT RESULTS (1)"), "{text}");
    assert!(
        text.contains("reps agree on each GPU, artifacts differ between GPU-fake-0 and GPU-fake-1"),
        "{text}"
    );
    assert!(!text.contains("NONDETERMINISTIC"), "{text}");
    // A night whose first try on GPU 0 faulted and whose retry ran on GPU 1: the faulty
    // attempt's bits ran elsewhere and do not make the cell look nondeterministic.
    // Two nights on the same two GPUs: first on GPU 0, then a try on GPU 0 that faults
    // and a retry on GPU 1.
    assert_eq!(run(&f, "fake:2", "", &[]).status.code(), Some(0));
    assert_eq!(f.receipt("matmul")["gpus"][0]["index"], 0);
    std::fs::write(f.path().join("FLAG"), "").unwrap();
    let out = run(&f, "fake:2", "gpu=0,fault=xid:79", &[]);
    assert_eq!(out.status.code(), Some(69), "{}", stderr(&out));
    let d = orch(&f, &["diff", "--manifest", "twins"]);
    let text = String::from_utf8_lossy(&d.stdout);
    assert!(text.contains("GPU-DEPENDENT RESULTS (1)"), "{text}");
    let json = orch(&f, &["diff", "--manifest", "twins", "--format", "json"]);
    let d: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    let found = &d["previous"]["gpu_dependent"][0];
    assert_eq!(found["id"], "matmul", "{d:#}");
    assert_eq!(found["old_gpus"], serde_json::json!(["GPU-fake-0"]));
    assert_eq!(found["new_gpus"], serde_json::json!(["GPU-fake-1"]));
}

#[test]
fn a_retry_that_can_no_longer_run_keeps_its_faulty_attempts() {
    // Both GPUs fault under two failing cells: the first one's retry, queued after the first
    // fault, can no longer be placed after the second.
    let f = Fixture::new(
        r#"
schema = 1
name = "hw"

[[arm]]
id = "a"
gpus = 1
run = "sleep 0.3; exit 1"
shell = true

[[arm]]
id = "b"
gpus = 1
run = "sleep 0.6; exit 1"
shell = true
"#,
    );
    let out = run(
        &f,
        "fake:2",
        "gpu=0,fault=xid:79;gpu=1,fault=ecc-uncorrected",
        &[],
    );
    assert_eq!(out.status.code(), Some(69), "{}", stderr(&out));
    for id in ["a", "b"] {
        let r = f.receipt(id);
        assert_eq!(r["verdict"], "device-fault", "{r:#}");
        let attempts = r["attempts"].as_array().unwrap();
        assert!(
            attempts
                .iter()
                .any(|a| a["outcome"] == "device-fault" && a["gpu_health"][0]["fault"].is_string()),
            "{id}: the faulty attempt is kept: {r:#}"
        );
    }
}

#[test]
fn a_real_failure_is_run_again_until_a_healthy_gpu_shows_it() {
    // GPUs 0 and 1 fault; GPU 2 is healthy and shows the code's own failure.
    let f = Fixture::new(&on_any("exit 1"));
    let out = run(&f, "fake:3", "gpu=0,fault=xid:79;gpu=1,fault=xid:79", &[]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let r = f.receipt("decode");
    assert_eq!(r["verdict"], "fail", "{r:#}");
    let outcomes: Vec<&str> = r["attempts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["outcome"].as_str().unwrap())
        .collect();
    assert_eq!(outcomes, ["device-fault", "device-fault", "fail"], "{r:#}");
    assert_eq!(r["gpus"][0]["index"], 2);
}

#[test]
fn a_gpu_that_faults_under_a_passing_cell_takes_no_more_cells() {
    let f = Fixture::new(&on_any("true"));
    let out = run(&f, "fake:2", "gpu=0,fault=lost,cell=decode", &["-j", "1"]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(69), "{err}");
    assert!(
        err.contains("the cell ended as expected; the GPU takes no new cells"),
        "{err}"
    );
    assert_eq!(f.receipt("decode")["verdict"], "pass");
    assert_eq!(f.receipt("after")["gpus"][0]["index"], 1);
    let run_json = read_json(&f.tree().join("run.json"));
    assert_eq!(run_json["quarantined_gpus"][0]["retried"], false);
    assert!(
        String::from_utf8_lossy(&out.stdout)
            .contains("the HARDWARE failed (quarantined: gpu 0; exit 69)"),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
}

#[test]
fn planted_faults_and_exclusions_that_name_nothing_are_refused() {
    let f = Fixture::new(ON_ONE);
    let out = run(&f, "fake:2", "gpu=9,fault=xid:79", &[]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("plants a fault on gpu 9, which this run does not have"));
    let out = run(
        &f,
        "fake:2",
        "",
        &["--exclude-gpu", "GPU-fake-0", "--exclude-gpu", "GPU-fake-0"],
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("is given twice"), "{}", stderr(&out));
    assert!(f.runs().is_empty(), "a refused run leaves no tree");
    let out = run(&f, "fake:2", "", &["--exclude-gpu", "GPU-fake-0"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(
        read_json(&f.tree().join("run.json"))["excluded_gpus"],
        serde_json::json!(["GPU-fake-0"])
    );
}
