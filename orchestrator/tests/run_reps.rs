//! Reps as a determinism check: every rep must leave the artifacts rep 1 left (the first
//! differing rep fails the cell, naming the file, the rep and where it differs), unless the
//! node says `deterministic = false`; every attempt's artifact digests are in the receipt.

use serde_json::Value;

use crate::run_support::Fixture;

/// `attempts[i].artifacts` of a receipt as (name, sha256) pairs per attempt.
fn attempt_artifacts(receipt: &Value) -> Vec<Vec<(String, String)>> {
    receipt["attempts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| {
            a["artifacts"]
                .as_array()
                .map(|list| {
                    list.iter()
                        .map(|x| {
                            assert!(x["bytes"].as_u64().unwrap() > 0, "{x}");
                            (
                                x["name"].as_str().unwrap().to_string(),
                                x["sha256"].as_str().unwrap().to_string(),
                            )
                        })
                        .collect()
                })
                .unwrap_or_default()
        })
        .collect()
}

#[test]
fn reps_must_leave_identical_artifacts() {
    let f = Fixture::new(
        r#"
schema = 1
name = "reps"

[defaults]
gpus = 0

[[arm]]
id = "drifting-logits"
run = ["{gates}/rep-artifacts.sh", "logits", "by-rep"]
reps = 3

[[arm]]
id = "drifting-allowed"
run = ["{gates}/rep-artifacts.sh", "logits", "by-rep"]
reps = 3
deterministic = false

[[arm]]
id = "steady"
run = ["{gates}/rep-artifacts.sh", "logits"]
reps = 3

[[arm]]
id = "no-artifacts"
run = ["{gates}/pass.sh"]
reps = 2
"#,
    );
    let out = f.run(&[]);
    assert_eq!(out.status.code(), Some(1));

    let drifting = f.receipt("drifting-logits");
    assert_eq!(drifting["verdict"], "fail");
    assert_eq!(
        drifting["reason"],
        "nondeterministic across reps: logits.safetensors of rep 2 differs from rep 1 in 1 of 2 \
         values (first at row 0, index 1: 1 vs 2)"
    );
    // Rep 2 decides; rep 3 never runs.
    let reps: Vec<u64> = drifting["attempts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["rep"].as_u64().unwrap())
        .collect();
    assert_eq!(reps, [1, 2]);
    let per_attempt = attempt_artifacts(&drifting);
    assert_ne!(per_attempt[0][0].1, per_attempt[1][0].1);

    let allowed = f.receipt("drifting-allowed");
    assert_eq!(allowed["verdict"], "pass", "{allowed}");
    assert_eq!(allowed["attempts"].as_array().unwrap().len(), 3);

    let steady = f.receipt("steady");
    assert_eq!(steady["verdict"], "pass", "{steady}");
    let per_attempt = attempt_artifacts(&steady);
    assert_eq!(per_attempt.len(), 3);
    for a in &per_attempt {
        assert_eq!(a.len(), 1);
        assert_eq!(a[0].0, "logits.safetensors");
        assert_eq!(a[0].1, per_attempt[0][0].1);
    }
    // The node's own `artifacts` stay the last attempt's.
    assert_eq!(
        steady["artifacts"][0]["sha256"],
        per_attempt[2][0].1.as_str()
    );

    // A cell without artifacts has no `artifacts` key on its attempts.
    let plain = f.receipt("no-artifacts");
    assert_eq!(plain["verdict"], "pass");
    for a in plain["attempts"].as_array().unwrap() {
        assert!(a.get("artifacts").is_none(), "{a}");
    }
}

#[test]
fn other_files_are_named_with_both_digests() {
    let f = Fixture::new(
        r#"
schema = 1
name = "reps-files"

[defaults]
gpus = 0

[[arm]]
id = "notes"
run = ["{gates}/rep-artifacts.sh", "text", "by-rep"]
reps = 2

[[arm]]
id = "extra"
run = ["{gates}/rep-artifacts.sh", "extra", "by-rep"]
reps = 2
"#,
    );
    let out = f.run(&[]);
    assert_eq!(out.status.code(), Some(1));

    let notes = f.receipt("notes");
    assert_eq!(notes["verdict"], "fail");
    let digests = attempt_artifacts(&notes);
    assert_eq!(
        notes["reason"].as_str().unwrap(),
        format!(
            "nondeterministic across reps: notes.txt of rep 2 differs from rep 1 (sha256 {}… vs {}…)",
            &digests[0][0].1[..12],
            &digests[1][0].1[..12]
        )
    );

    let extra = f.receipt("extra");
    assert_eq!(extra["verdict"], "fail");
    assert_eq!(
        extra["reason"],
        "nondeterministic across reps: rep 2 wrote extra.bin, which rep 1 did not"
    );
}

#[test]
fn deterministic_may_be_defaulted() {
    let f = Fixture::new(
        r#"
schema = 1
name = "reps-defaults"

[defaults]
gpus = 0
deterministic = false

[[arm]]
id = "allowed"
run = ["{gates}/rep-artifacts.sh", "text", "by-rep"]
reps = 2

[[arm]]
id = "checked"
run = ["{gates}/rep-artifacts.sh", "text", "by-rep"]
reps = 2
deterministic = true
"#,
    );
    let out = f.run(&[]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(f.verdict("allowed"), "pass");
    assert_eq!(f.verdict("checked"), "fail");
}

#[test]
fn deterministic_must_be_a_boolean() {
    let f = Fixture::new(
        r#"schema = 1
name = "reps-bad"

[[arm]]
id = "a"
run = ["{gates}/pass.sh"]
reps = 2
deterministic = "yes"
"#,
    );
    let out = f.run(&[]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("manifest.toml:8:"), "{stderr}");
    assert!(stderr.contains("`deterministic`"), "{stderr}");
    assert!(stderr.contains("deterministic = false"), "{stderr}");
    assert!(!f.path().join("receipts").exists());
}
