//! The hidden `exec-node` entry point a cluster executor calls: one serialised cell job in,
//! the same receipt the local run writes out.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::run_support::{gates, read_json};
use memra_orch::plan::{Expect, NodeKind};
use memra_orch::run::executor::CellJob;

fn job(node_dir: &std::path::Path, gate: &str) -> CellJob {
    CellJob {
        prior_attempts: Vec::new(),
        id: "remote[b=1]".into(),
        node: "remote".into(),
        kind: NodeKind::Arm,
        axes: vec![("b".into(), "1".into())],
        tags: vec![],
        slug: "remote_b_1_-00000000".into(),
        argv: vec![gates().join(gate).to_string_lossy().into_owned()],
        shell: false,
        cwd: node_dir.parent().unwrap().to_path_buf(),
        pins: BTreeMap::from([("MEMRA_FA3".to_string(), "0".to_string())]),
        inherit: vec!["PATH".into()],
        timeout: Duration::from_secs(30),
        max_output: 1 << 30,
        reps: 1,
        deterministic: true,
        retries: 0,
        expect: Expect::Pass,
        expect_fail: Vec::new(),
        info: Vec::new(),
        store: None,
        verdict_pass: None,
        verdict_fail: None,
        produces: vec![],
        creates: vec![],
        gpus: vec![],
        visible_devices: vec![],
        node_dir: node_dir.to_path_buf(),
        binaries: vec![],
        input_files: vec![],
        inputs: "digest".into(),
        code: "git:t".into(),
        fingerprints: Vec::new(),
        program: None,
    }
}

/// `memra-orch exec-node` with `args`, then the job file.
fn exec_node(args: &[&std::ffi::OsStr], job_file: &std::path::Path) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_memra-orch"))
        .arg("exec-node")
        .args(args)
        .arg(job_file)
        .output()
        .unwrap()
}

/// Runs exec-node on `job_file`, asserts it exited 0, and returns the receipt it wrote in
/// `node_dir`.
fn exec_node_ok(job_file: &std::path::Path, node_dir: &std::path::Path) -> serde_json::Value {
    let out = exec_node(&[], job_file);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    read_json(&node_dir.join("receipt.json"))
}

/// Writes the job running `gate` in `node_dir` to `job_file`.
fn write_job(job_file: &std::path::Path, node_dir: &std::path::Path, gate: &str) {
    std::fs::write(job_file, serde_json::to_vec(&job(node_dir, gate)).unwrap()).unwrap();
}

#[test]
fn exec_node_runs_a_job_file_and_writes_its_receipt() {
    let dir = tempfile::tempdir().unwrap();
    let node_dir = dir.path().join("nodes/remote");
    let job_file = dir.path().join("job.json");
    write_job(&job_file, &node_dir, "fail.sh");
    let r = exec_node_ok(&job_file, &node_dir);
    assert_eq!(r["id"], "remote[b=1]");
    assert_eq!(r["verdict"], "fail");
    assert_eq!(r["env"]["MEMRA_FA3"], "0");
    assert_eq!(r["inputs"], "digest");
    assert!(node_dir.join("attempt-1/stderr.log").is_file());

    std::fs::write(&job_file, "{not json").unwrap();
    let bad = exec_node(&[], &job_file);
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("not a readable job file"));
}

#[test]
fn exec_node_writes_its_receipt_where_receipt_says_and_nowhere_else() {
    let dir = tempfile::tempdir().unwrap();
    let node_dir = dir.path().join("nodes/remote");
    let job_file = dir.path().join("job.json");
    let own = dir.path().join("spool/job.1.receipt.json");
    std::fs::create_dir_all(own.parent().unwrap()).unwrap();
    write_job(&job_file, &node_dir, "pass.sh");
    let out = exec_node(&["--receipt".as_ref(), own.as_os_str()], &job_file);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r = read_json(&own);
    assert_eq!(r["id"], "remote[b=1]");
    assert_eq!(r["verdict"], "pass");
    // The node folder holds the attempt's logs, but the cell's receipt is the run's to file.
    assert!(node_dir.join("attempt-1/stdout.log").is_file());
    assert!(!node_dir.join("receipt.json").exists());
}

#[test]
fn exec_node_compares_reps_and_a_job_without_the_key_is_deterministic() {
    let dir = tempfile::tempdir().unwrap();
    let node_dir = dir.path().join("nodes/remote");
    let job_file = dir.path().join("job.json");
    let mut j = job(&node_dir, "rep-artifacts.sh");
    j.argv.extend(["text".to_string(), "by-rep".to_string()]);
    j.reps = 2;
    // A job file written before `deterministic` existed has no such key.
    let mut value = serde_json::to_value(&j).unwrap();
    value.as_object_mut().unwrap().remove("deterministic");
    std::fs::write(&job_file, serde_json::to_vec(&value).unwrap()).unwrap();
    let r = exec_node_ok(&job_file, &node_dir);
    assert_eq!(r["verdict"], "fail");
    let reason = r["reason"].as_str().unwrap();
    assert!(
        reason.starts_with("nondeterministic across reps: notes.txt of rep 2 differs from rep 1"),
        "{reason}"
    );
    assert_eq!(r["attempts"][1]["artifacts"][0]["name"], "notes.txt");
}
