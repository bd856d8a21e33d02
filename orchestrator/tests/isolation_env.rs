//! Isolation of an attempt (DESIGN §4): only inherited names and manifest pins reach the
//! gate; the caller's secrets and MEMRA_* pins do not, in the gate or in the receipts; stdin
//! is empty; the gate leads its own process group; TMPDIR is private and removed afterwards.

use crate::run_support::{Fixture, files_under};

const MANIFEST: &str = r#"
schema = 1
name = "iso"

[env]
MEMRA_FA3 = "0"
API_TOKEN = "pinned-secret-value"

[isolation]
inherit = ["PATH", "HOME", "MEMRA_MMVQ"]

[[arm]]
id = "dump"
run = ["{gates}/env-dump.sh"]
gpus = 0
"#;

#[test]
fn caller_secrets_and_pins_never_reach_the_gate_or_the_receipts() {
    let f = Fixture::new(MANIFEST);
    let out = f
        .command(&[])
        .env("FAKE_SECRET_TOKEN", "hunter2-caller-secret")
        .env("MEMRA_MMVQ", "7")
        .env("MEMRA_BACKEND", "cuda")
        .env("SOME_CALLER_VAR", "leaked-value")
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let artifacts = f.attempt_dir("dump", 1).join("artifacts");
    let env = crate::run_support::read_text(&artifacts.join("env.txt")).unwrap();
    // Manifest pins arrive, the caller's do not — not even MEMRA_MMVQ although it is listed
    // on the inherit list.
    assert!(env.lines().any(|l| l == "MEMRA_FA3=0"), "{env}");
    assert!(
        env.lines().any(|l| l == "API_TOKEN=pinned-secret-value"),
        "{env}"
    );
    assert!(env.lines().any(|l| l == "MEMRA_ORCH_NODE=dump"), "{env}");
    assert!(env.lines().any(|l| l == "CUDA_VISIBLE_DEVICES="), "{env}");
    for absent in [
        "FAKE_SECRET_TOKEN",
        "hunter2",
        "MEMRA_MMVQ",
        "MEMRA_BACKEND",
        "SOME_CALLER_VAR",
    ] {
        assert!(
            !env.contains(absent),
            "{absent} leaked into the gate:\n{env}"
        );
    }
    // Nothing of the caller's secret anywhere in the tree; the pinned secret is redacted in
    // the receipt (it is only in the artifact the gate itself wrote).
    for file in files_under(&f.tree()) {
        let text =
            String::from_utf8_lossy(&crate::run_support::read_bytes(&file).unwrap()).into_owned();
        assert!(
            !text.contains("hunter2"),
            "{} holds the caller's secret",
            file.display()
        );
        assert!(
            !text.contains("MEMRA_MMVQ"),
            "{} holds the caller's pin",
            file.display()
        );
        if file.ends_with("receipt.json") || file.ends_with("run.json") {
            assert!(
                !text.contains("pinned-secret-value"),
                "{} holds a secret value",
                file.display()
            );
        }
    }
    let receipt = f.receipt("dump");
    assert_eq!(receipt["env"]["API_TOKEN"], "<redacted>");
    assert_eq!(receipt["env"]["MEMRA_FA3"], "0");
    assert!(receipt["env"].get("SOME_CALLER_VAR").is_none());

    let stdin = crate::run_support::read_text(&artifacts.join("stdin.txt")).unwrap();
    assert_eq!(stdin.trim(), "stdin empty");
    let pid = crate::run_support::read_text(&artifacts.join("pid.txt")).unwrap();
    let pgid = crate::run_support::read_text(&artifacts.join("pgid.txt")).unwrap();
    assert_eq!(
        pid.trim(),
        pgid.trim(),
        "the gate must lead its own process group"
    );
    let tmpdir = crate::run_support::read_text(&artifacts.join("tmpdir.txt")).unwrap();
    let tmpdir = tmpdir.trim();
    assert!(crate::run_support::is_file_in_tree(
        &artifacts.join("tmpdir-writable.txt")
    ));
    assert!(
        !tmpdir.is_empty() && !std::path::Path::new(tmpdir).exists(),
        "TMPDIR {tmpdir} was not removed"
    );
    assert!(
        !tmpdir.starts_with(&*f.tree().to_string_lossy()),
        "TMPDIR must live outside the tree"
    );
}
