//! The real `kernel-check` binary speaks the gate protocol: on a machine without a GPU it
//! prints the reason, appends a `skip` row and a `doors` row, and exits 0; on a GPU machine
//! every row it appends must agree with its exit code. Bad arguments exit 2 with the usage.

use std::process::Command;

fn rows(path: &std::path::Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("bad JSON row {l}: {e}")))
        .collect()
}

#[test]
fn protocol_rows_agree_with_the_exit_code() {
    let dir = tempfile::tempdir().unwrap();
    let checks = dir.path().join("checks.jsonl");
    let out = Command::new(env!("CARGO_BIN_EXE_kernel-check"))
        .env("MEMRA_ORCH_CHECKS", &checks)
        .env("MEMRA_KERNEL_CACHE", dir.path().join("ptx"))
        .env_remove("MEMRA_GATE_CANARY")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let rows = rows(&checks);
    let doors: Vec<_> = rows.iter().filter(|r| r.get("doors").is_some()).collect();
    assert_eq!(doors.len(), 1, "exactly one doors row: {rows:?}");
    let statuses: Vec<&str> = rows.iter().filter_map(|r| r["status"].as_str()).collect();
    assert!(!statuses.is_empty(), "no check rows; stdout:\n{stdout}");
    if statuses == ["skip"] {
        assert_eq!(
            out.status.code(),
            Some(0),
            "a skip exits 0; stdout:\n{stdout}"
        );
        assert!(stdout.contains("SKIP"), "the reason is printed:\n{stdout}");
        assert_eq!(doors[0]["doors"]["backend"], "none");
    } else {
        let failed = statuses.contains(&"fail");
        assert_eq!(
            out.status.code(),
            Some(if failed { 1 } else { 0 }),
            "stdout:\n{stdout}"
        );
        assert_eq!(doors[0]["doors"]["backend"], "cuda");
    }
}

#[test]
fn without_the_protocol_variable_it_only_prints() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_kernel-check"))
        .current_dir(dir.path())
        .env_remove("MEMRA_ORCH_CHECKS")
        .env("MEMRA_KERNEL_CACHE", dir.path().join("ptx"))
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("kernel-check:"));
    let left: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert!(left.iter().all(|n| n == "ptx"), "wrote files: {left:?}");
}

#[test]
fn unknown_arguments_exit_2_with_usage() {
    let out = Command::new(env!("CARGO_BIN_EXE_kernel-check"))
        .arg("--frobnicate")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("usage: kernel-check [bench | compile [--arch ARCH]]"),
        "{stderr}"
    );
}

#[test]
fn compile_with_a_bad_arch_exits_2_naming_it() {
    let out = Command::new(env!("CARGO_BIN_EXE_kernel-check"))
        .args(["compile", "--arch", "sm_90"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("--arch sm_90") && stderr.contains("compute_90"),
        "{stderr}"
    );
}
