//! Every run keeps its own tree: three runs at one commit leave three trees that `ls` lists
//! and `diff` compares, and nothing of the first changes on disk; `--filter`,
//! `--rerun-failed` and `--exclude` make new runs whose other cells carry the earlier
//! receipts forward, marked with the run that measured them, so run.json, the receipts,
//! summary.md and junit.xml always agree; a carried comparison whose inputs moved is not
//! carried; `gc --keep` keeps what a kept run carries from; trees of the layout before run
//! ids stay readable.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::run_support::{Fixture, files_under, node_dir_in, orch, read_json};

/// sha256-free digest of every file of a tree: its bytes, by path.
fn snapshot(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    files_under(dir)
        .into_iter()
        .map(|p| {
            let bytes = crate::run_support::read_bytes(&p).unwrap();
            (p, bytes)
        })
        .collect()
}

/// Asserts that run.json's index, the receipts it points at (carried ones in the run that
/// measured them), summary.md and junit.xml of `tree` tell the same story.
fn agrees(tree: &Path) {
    let run = read_json(&tree.join("run.json"));
    let summary = std::fs::read_to_string(tree.join("summary.md")).unwrap();
    let junit = std::fs::read_to_string(tree.join("junit.xml")).unwrap();
    let nodes = run["nodes"].as_array().unwrap();
    let mut counts: BTreeMap<String, u64> = BTreeMap::new();
    for n in nodes {
        let id = n["id"].as_str().unwrap();
        *counts
            .entry(n["verdict"].as_str().unwrap().to_string())
            .or_default() += 1;
        assert!(summary.contains(&format!("| {id} |")), "{id} in\n{summary}");
        assert!(
            junit.contains(&format!("name=\"{id}\"")),
            "{id} in\n{junit}"
        );
        if n["slug"].is_string() {
            let r = read_json(&node_dir_in(tree, id).join("receipt.json"));
            assert_eq!(r["id"], id);
            assert_eq!(r["verdict"], n["verdict"], "{id}: index and receipt differ");
        }
        if let Some(from) = n["carried"]["run"].as_str() {
            assert!(
                summary.contains(&format!("carried from {from}")),
                "{id} is marked carried in summary.md:\n{summary}"
            );
        }
    }
    for (verdict, n) in &counts {
        assert_eq!(run["counts"][verdict], *n, "counts of {verdict}: {run:#}");
    }
}

/// The cell ids of a run that the run itself measured (not carried, not skipped).
fn measured(tree: &Path) -> Vec<String> {
    let run = read_json(&tree.join("run.json"));
    run["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|n| n["carried"].is_null() && n["verdict"] != "skipped")
        .map(|n| n["id"].as_str().unwrap().to_string())
        .collect()
}

/// The run id a cell of `tree` was carried from, if it was.
fn carried_from(tree: &Path, id: &str) -> Option<String> {
    let run = read_json(&tree.join("run.json"));
    run["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["id"] == id)
        .and_then(|n| n["carried"]["run"].as_str().map(str::to_string))
}

fn run_id(tree: &Path) -> String {
    tree.file_name().unwrap().to_string_lossy().into_owned()
}

#[test]
fn three_runs_at_one_commit_keep_three_trees() {
    let f = Fixture::new(
        "schema = 1\nname = \"thrice\"\n[defaults]\ngpus = 0\n\
         [[arm]]\nid = \"a\"\nrun = [\"{gates}/logits.sh\"]\n\
         [[arm]]\nid = \"b\"\nrun = [\"{gates}/pass.sh\"]\n",
    );
    assert_eq!(f.run(&[]).status.code(), Some(0));
    let first = f.tree();
    let before = snapshot(&first);
    assert_eq!(f.run(&[]).status.code(), Some(0));
    assert_eq!(f.run(&[]).status.code(), Some(0));
    let runs = f.runs();
    assert_eq!(runs.len(), 3, "{runs:?}");
    assert_eq!(runs[0], first);
    assert_eq!(snapshot(&first), before, "run 1's tree changed on disk");
    for tree in &runs {
        let run = read_json(&tree.join("run.json"));
        assert_eq!(run["run_id"], run_id(tree));
        assert_eq!(run["verdict"], "pass");
        agrees(tree);
    }

    let ls = orch(&f, &["ls"]);
    let text = String::from_utf8_lossy(&ls.stdout);
    for tree in &runs {
        assert!(text.contains(&run_id(tree)), "{} in\n{text}", run_id(tree));
    }
    assert_eq!(text.lines().count(), 4, "a header and three runs:\n{text}");

    // Runs are named by id (or a unique start of one) and by `latest`/`previous`.
    let diff = orch(&f, &["diff", &run_id(&runs[0]), &run_id(&runs[2])]);
    assert_eq!(diff.status.code(), Some(0));
    let prefix = &run_id(&runs[1])[..22];
    let show = orch(&f, &["show", prefix]);
    assert_eq!(show.status.code(), Some(0));
    assert!(
        String::from_utf8_lossy(&show.stdout).contains(&run_id(&runs[1])),
        "show names the run it shows"
    );
    let diff = orch(&f, &["diff", "previous", "latest"]);
    assert_eq!(diff.status.code(), Some(0));
    // A commit names its newest complete run.
    let show = orch(&f, &["show", crate::run_support::COMMIT]);
    assert!(String::from_utf8_lossy(&show.stdout).contains(&run_id(&runs[2])));
}

const PARTIAL: &str = r#"
schema = 1
name = "partial"

[defaults]
gpus = 0

[[arm]]
id = "ref"
run = ["{gates}/logits.sh", "same"]

[[arm]]
id = "gen"
run = ["sh", "-c", "{gates}/logits.sh $(cat mode)"]

[[arm]]
id = "flaky-fix"
run = ["sh", "-c", "test -e fixed"]

[[arm]]
id = "canary"
run = ["{gates}/fail.sh"]
expect = "fail"
tags = ["canary"]

[[compare]]
id = "gen-vs-ref"
reference = "ref"
candidates = ["gen"]
artifact = "logits.safetensors"
policy = "bitwise"
"#;

#[test]
fn filter_and_rerun_failed_make_complete_runs_that_carry_the_rest() {
    let f = Fixture::new(PARTIAL);
    std::fs::write(f.path().join("mode"), "same").unwrap();
    // Run 1: everything; flaky-fix fails (its file is missing).
    assert_eq!(f.run(&[]).status.code(), Some(1));
    let run1 = f.tree();
    let run1_files = snapshot(&run1);
    assert_eq!(f.verdict("flaky-fix"), "fail");
    assert!(carried_from(&run1, "ref").is_none());

    // Run 2: only `ref`. Everything else is carried from run 1, and the compare, which
    // depends on `ref`, is checked: same bits, so it is carried too.
    assert_eq!(f.run(&["--filter", "ref"]).status.code(), Some(1));
    let run2 = f.tree();
    assert_ne!(run2, run1);
    assert_eq!(measured(&run2), ["ref"]);
    for id in ["gen", "flaky-fix", "canary", "gen-vs-ref[candidate=gen]"] {
        assert_eq!(
            carried_from(&run2, id).as_deref(),
            Some(run_id(&run1).as_str()),
            "{id}"
        );
    }
    agrees(&run2);
    let r2 = read_json(&run2.join("run.json"));
    assert_eq!(r2["counts"]["pass"], 4);
    assert_eq!(r2["counts"]["fail"], 1);
    assert_eq!(r2["carried_from"], run_id(&run1));

    // Run 3: fix the failing cell and rerun what failed. Only flaky-fix runs; `ref` comes
    // from run 2 (which measured it), the rest still from run 1: never a chain.
    std::fs::write(f.path().join("fixed"), "").unwrap();
    let out = f.run(&["--rerun-failed"]);
    assert_eq!(out.status.code(), Some(0));
    let run3 = f.tree();
    assert_eq!(measured(&run3), ["flaky-fix"]);
    assert_eq!(
        carried_from(&run3, "ref").as_deref(),
        Some(run_id(&run2).as_str())
    );
    assert_eq!(
        carried_from(&run3, "gen").as_deref(),
        Some(run_id(&run1).as_str())
    );
    agrees(&run3);
    let r3 = read_json(&run3.join("run.json"));
    assert_eq!(r3["verdict"], "pass");
    assert_eq!(r3["rerun_failed"], true);
    assert_eq!(r3["counts"]["pass"], 5);
    // Nothing is left to rerun: said, exit 0, no new run.
    let out = f.run(&["--rerun-failed"]);
    assert_eq!(out.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&out.stdout).contains("nothing to rerun"));
    assert_eq!(f.runs().len(), 3);

    // Run 4: `gen` now writes other bits. Filtering it reruns it; the compare downstream
    // of it is not selected, and its inputs moved, so the carried verdict would be stale:
    // it is skipped and says why, never carried.
    std::fs::write(f.path().join("mode"), "other").unwrap();
    assert_eq!(f.run(&["--filter", "gen"]).status.code(), Some(0));
    let run4 = f.tree();
    assert_eq!(measured(&run4), ["gen"]);
    let cmp = f.receipt("gen-vs-ref[candidate=gen]");
    assert_eq!(cmp["verdict"], "skipped");
    assert!(cmp["reason"].as_str().unwrap().contains("stale"), "{cmp:#}");
    agrees(&run4);

    // Run 5: a negative filter runs everything but the canary (and carries it).
    std::fs::write(f.path().join("mode"), "same").unwrap();
    assert_eq!(f.run(&["--exclude", "tag:canary"]).status.code(), Some(0));
    let run5 = f.tree();
    assert_eq!(
        carried_from(&run5, "canary").as_deref(),
        Some(run_id(&run1).as_str())
    );
    assert!(measured(&run5).contains(&"gen-vs-ref[candidate=gen]".to_string()));
    assert_eq!(f.verdict("gen-vs-ref[candidate=gen]"), "pass");
    assert_eq!(f.run(&["--filter", "!tag:canary"]).status.code(), Some(0));
    assert_eq!(
        carried_from(&f.tree(), "canary").as_deref(),
        Some(run_id(&run1).as_str())
    );

    assert_eq!(snapshot(&run1), run1_files, "run 1's tree changed on disk");

    // gc keeps the newest run and every run it carries receipts from, and says so.
    let gc = orch(&f, &["gc", "--keep", "1"]);
    assert_eq!(gc.status.code(), Some(0));
    let said = String::from_utf8_lossy(&gc.stdout);
    assert!(
        said.contains(&format!("kept {}", run1.display())) && said.contains("carries receipts"),
        "{said}"
    );
    let left = f.runs();
    assert!(left.contains(&run1), "{left:?}");
    assert!(!left.contains(&run2), "{left:?}");
    agrees(&f.tree());
}

#[test]
fn rerun_failed_without_an_earlier_run_says_what_to_do() {
    let f = Fixture::new(PARTIAL);
    let out = f.run(&["--rerun-failed"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--rerun-failed: no earlier run of partial"),
        "{err}"
    );
    assert!(f.runs().is_empty());
}

#[test]
fn a_tree_of_the_layout_before_run_ids_stays_readable_and_carries() {
    let f = Fixture::new(
        "schema = 1\nname = \"legacy\"\n[defaults]\ngpus = 0\n\
         [[arm]]\nid = \"a\"\nrun = [\"{gates}/pass.sh\"]\n\
         [[arm]]\nid = \"b\"\nrun = [\"{gates}/logits.sh\"]\n",
    );
    // Trees of the old layout were never packed.
    assert_eq!(f.run(&["--no-pack"]).status.code(), Some(0));
    // Turn the run into a tree of the old layout: its files in the manifest folder itself,
    // run.json without an id.
    let tree = f.tree();
    let m = f.manifest_dir();
    for part in ["run.json", "summary.md", "junit.xml", "nodes"] {
        std::fs::rename(tree.join(part), m.join(part)).unwrap();
    }
    std::fs::remove_dir(&tree).unwrap();
    let mut run: Value = read_json(&m.join("run.json"));
    run.as_object_mut().unwrap().remove("run_id");
    std::fs::write(m.join("run.json"), run.to_string()).unwrap();

    let ls = orch(&f, &["ls"]);
    assert!(String::from_utf8_lossy(&ls.stdout).contains("legacy"));
    assert_eq!(orch(&f, &["show", "latest"]).status.code(), Some(0));

    // A filtered run carries from the old tree; diff reads both.
    assert_eq!(f.run(&["--filter", "a"]).status.code(), Some(0));
    let new = f.tree();
    let r = read_json(&new.join("run.json"));
    let b = r["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["id"] == "b")
        .unwrap();
    assert_eq!(b["carried"]["from"], "..");
    agrees(&new);
    let diff = orch(&f, &["diff", m.to_str().unwrap(), new.to_str().unwrap()]);
    assert_eq!(diff.status.code(), Some(0));
    assert_eq!(orch(&f, &["show", "latest", "b"]).status.code(), Some(0));
}

#[test]
fn two_manifest_files_with_one_name_are_refused_instead_of_sharing_runs() {
    let f = Fixture::new(
        "schema = 1\nname = \"twin\"\n[[arm]]\nid = \"a\"\nrun = [\"{gates}/pass.sh\"]\ngpus = 0\n",
    );
    assert_eq!(f.run(&[]).status.code(), Some(0));
    let other = f.path().join("other.toml");
    std::fs::write(
        &other,
        "schema = 1\nname = \"twin\"\n[[arm]]\nid = \"b\"\nrun = [\"true\"]\ngpus = 0\n",
    )
    .unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_memra-orch"))
        .arg("run")
        .arg(&other)
        .arg("--receipts")
        .arg(f.path().join("receipts"))
        .args(["--commit", crate::run_support::COMMIT])
        .current_dir(f.path())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("manifest name `twin` is already used by") && err.contains("rename one"),
        "{err}"
    );
    assert_eq!(f.runs().len(), 1);
}

/// `--resume --filter X` used to leave run.json contradicting the receipts and turn passing
/// compares into `skipped`: now it is a run like any other, whose compare is carried (its
/// inputs did not move) and whose index agrees with every receipt.
#[test]
fn resume_with_a_filter_keeps_every_compare_and_agrees_with_its_receipts() {
    let f = Fixture::new(PARTIAL);
    std::fs::write(f.path().join("mode"), "same").unwrap();
    std::fs::write(f.path().join("fixed"), "").unwrap();
    assert_eq!(f.run(&[]).status.code(), Some(0));
    let first = f.tree();
    assert_eq!(
        f.run(&["--resume", "--filter", "ref"]).status.code(),
        Some(0)
    );
    let second = f.tree();
    assert_ne!(second, first);
    // Everything was carried: `ref` (selected) because its inputs did not change.
    assert!(measured(&second).is_empty(), "{:?}", measured(&second));
    assert_eq!(f.verdict("gen-vs-ref[candidate=gen]"), "pass");
    assert_eq!(
        carried_from(&second, "gen-vs-ref[candidate=gen]").as_deref(),
        Some(run_id(&first).as_str())
    );
    let run = read_json(&second.join("run.json"));
    assert_eq!(run["verdict"], "pass");
    assert_eq!(run["counts"]["pass"], 5);
    agrees(&second);
}
