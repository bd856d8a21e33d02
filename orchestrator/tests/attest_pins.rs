//! Pin attestation end to end: an arm swept over two pins, one of which the gate reads
//! (MEMRA_Y lands in its doors row) and one it ignores (MEMRA_X). After the run, every cell
//! pair that differs only in MEMRA_X carries a `pin had no effect` warning in both receipts,
//! the summary names it, verdicts are untouched, and MEMRA_Y is never flagged.

use crate::diff_support::{HEADER, Repo, have_git};
use serde_json::Value;

fn read_json(path: &std::path::Path) -> Value {
    serde_json::from_slice(&crate::run_support::read_bytes(path).unwrap()).unwrap()
}

/// The receipt of the node `n` of run.json's node list (where the run carried it from,
/// for a carried one).
fn node_receipt(tree: &std::path::Path, n: &Value) -> Value {
    read_json(
        &crate::run_support::node_dir_in(tree, n["id"].as_str().unwrap()).join("receipt.json"),
    )
}

#[test]
fn a_pin_the_gate_ignores_is_named_in_both_receipts_and_the_summary() {
    if !have_git() {
        eprintln!("skipped: git is not available for the scratch repository");
        return;
    }
    let repo = Repo::new();
    let manifest = format!(
        "{HEADER}[[arm]]\nid = \"sweep\"\nrun = [\"./gate.sh\", \"pass\", \"0\", \"a\", \"fast\"]\n\
         env_matrix = [\"pins.toml\"]\n"
    );
    let pins = "[axes]\nMEMRA_X = [\"0\", \"1\"]\nMEMRA_Y = [\"a\", \"b\"]\n";
    let sha = repo.commit(
        &[("manifest.toml", &manifest), ("pins.toml", pins)],
        "sweep",
    );
    let out = repo.orch(&[
        "run",
        "manifest.toml",
        "--gpus",
        "none",
        "--progress",
        "plain",
    ]);
    assert_eq!(out.status.code(), Some(0), "warnings do not fail a run");
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(
        table.contains("warning: 4 cells report \"pin had no effect\""),
        "{table}"
    );
    let tree = repo.tree(&sha, "battery");
    let run: Value = read_json(&tree.join("run.json"));
    let nodes = run["nodes"].as_array().unwrap();
    assert_eq!(nodes.len(), 4);
    for n in nodes {
        assert_eq!(n["verdict"], "pass");
        let r = node_receipt(&tree, n);
        let warnings: Vec<&Value> = r["checks"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|c| c["check"] == "pin had no effect")
            .collect();
        assert_eq!(warnings.len(), 1, "{}: {warnings:?}", n["id"]);
        let w = warnings[0];
        assert_eq!(w["status"], "warn");
        assert_eq!(w["pin"], "MEMRA_X");
        // The partner differs in MEMRA_X only.
        let partner = w["same_doors_as"].as_str().unwrap();
        let y = r["cell"]["MEMRA_Y"].as_str().unwrap();
        assert!(
            partner.contains(&format!("MEMRA_Y={y}"))
                || partner.contains(&format!("MEMRA_Y=\"{y}\"")),
            "{partner}"
        );
        assert!(w["message"].as_str().unwrap().contains("MEMRA_X=0"));
    }
    let summary = std::fs::read_to_string(tree.join("summary.md")).unwrap();
    assert!(
        summary.contains("## Warnings: pin had no effect (2)"),
        "{summary}"
    );
    assert!(summary.contains("pin MEMRA_X had no effect"), "{summary}");
    assert!(!summary.contains("pin MEMRA_Y"), "{summary}");

    // `show` marks the cells, and a resumed run attests again without doubling the rows.
    let show = repo.orch(&["show", "latest"]);
    assert!(String::from_utf8_lossy(&show.stdout).contains("[warning: pin had no effect]"));
    let again = repo.orch(&[
        "run",
        "manifest.toml",
        "--gpus",
        "none",
        "--progress",
        "quiet",
        "--resume",
    ]);
    assert_eq!(again.status.code(), Some(0));
    let summary = std::fs::read_to_string(tree.join("summary.md")).unwrap();
    assert!(summary.contains("(2)"), "{summary}");
    let any = &nodes[0];
    let r: Value = node_receipt(&tree, any);
    let count = r["checks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["check"] == "pin had no effect")
        .count();
    assert_eq!(count, 1);
}

/// Across a compare's pairing: the candidate pins `MEMRA_PATH=slow`, whose doors key `path`
/// both rows carry and which the gate ignores (its path comes from argv), so the pair is
/// flagged by that key; `MEMRA_Y`, which moves the row's `tile`, is not. The compare itself
/// fails (the fixture's artifact is no safetensors file): attestation reads the arms'
/// receipts, whatever the compare's verdict.
#[test]
fn a_compare_candidate_pin_the_doors_row_does_not_show_is_flagged() {
    if !have_git() {
        eprintln!("skipped: git is not available for the scratch repository");
        return;
    }
    let repo = Repo::new();
    let gate = "run = [\"./gate.sh\", \"pass\", \"0\", \"a\", \"fast\"]\n";
    let manifest = format!(
        "{HEADER}[[arm]]\nid = \"ref\"\n{gate}\n\
         [[arm]]\nid = \"cand\"\n{gate}env = {{ MEMRA_PATH = \"slow\", MEMRA_Y = \"b\" }}\n\n\
         [[compare]]\nid = \"pair\"\nreference = \"ref\"\ncandidates = [\"cand\"]\n\
         artifact = \"out.bin\"\npolicy = \"bitwise\"\n"
    );
    let sha = repo.commit(&[("manifest.toml", &manifest)], "pair");
    repo.orch(&[
        "run",
        "manifest.toml",
        "--gpus",
        "none",
        "--progress",
        "plain",
    ]);
    let tree = repo.tree(&sha, "battery");
    let summary = std::fs::read_to_string(tree.join("summary.md")).unwrap();
    assert!(
        summary.contains("## Warnings: pin had no effect (1)"),
        "{summary}"
    );
    assert!(
        summary.contains("pin MEMRA_PATH had no effect: MEMRA_PATH=(unset) (ref) and MEMRA_PATH=slow (cand) report the same `path` in their doors rows"),
        "{summary}"
    );
    assert!(!summary.contains("pin MEMRA_Y"), "{summary}");
    let run: Value = read_json(&tree.join("run.json"));
    for n in run["nodes"].as_array().unwrap() {
        let r: Value = node_receipt(&tree, n);
        let flagged = r["checks"]
            .as_array()
            .unwrap()
            .iter()
            .any(|c| c["check"] == "pin had no effect" && c["pin"] == "MEMRA_PATH");
        let arm = n["id"] != "pair[candidate=cand]";
        assert_eq!(flagged, arm, "{}", n["id"]);
        if arm {
            assert_eq!(n["verdict"], "pass", "{n}");
        }
    }
}
