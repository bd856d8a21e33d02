//! The receipt tree (DESIGN §6): complete after a run of the smoke manifest, hostile cell
//! ids stay inside it, a fresh run replaces the previous run's nodes, and the run lock keeps
//! two runs out of one tree.

mod run_support;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use memra_orch::events::Listener;
use memra_orch::executor::local::LocalExecutor;
use memra_orch::gpus::Inventory;
use memra_orch::plan::{Cell, CellId, Expect, NodeId, NodeKind, Plan, SourceFile};
use memra_orch::receipt::tree::Tree;
use memra_orch::receipt::writer::ReceiptWriter;
use memra_orch::receipt::{RUN_SCHEMA, RunReceipt, sha256_file};
use memra_orch::run::{RunOptions, execute};
use run_support::{Fixture, files_under, gates, read_json};

fn cell(id: &str, argv: Vec<String>, root: &Path) -> Cell {
    Cell {
        id: CellId(id.to_string()),
        node: NodeId(id.to_string()),
        kind: NodeKind::Arm,
        axes: Vec::new(),
        description: None,
        tags: Vec::new(),
        argv,
        shell: false,
        cwd: root.to_path_buf(),
        env: BTreeMap::new(),
        gpus: 0,
        cpus: None,
        memory: None,
        timeout: Duration::from_secs(30),
        reps: 1,
        retries: 0,
        expect: Expect::Pass,
        verdict: None,
        produces: Vec::new(),
        creates: Vec::new(),
        needs: Vec::new(),
        compare: None,
    }
}

#[test]
fn hostile_cell_ids_cannot_write_outside_the_tree() {
    let root = tempfile::tempdir().unwrap();
    let work = root.path().join("a/b/c");
    std::fs::create_dir_all(&work).unwrap();
    let gate = gates().join("pass.sh").to_string_lossy().into_owned();
    let ids = [
        "../../x",
        "../../../../../../tmp/escape",
        "/abs/y",
        "..",
        ".",
    ];
    let plan = Plan {
        name: "hostile".into(),
        description: None,
        manifest: SourceFile {
            path: PathBuf::from("hand-built"),
            sha256: String::new(),
        },
        env_matrices: Vec::new(),
        root: work.clone(),
        inherit: vec!["PATH".into()],
        cells: ids
            .iter()
            .map(|id| cell(id, vec![gate.clone()], &work))
            .collect(),
    };
    let tree = Tree::new(&work.join("receipts"), "c0", "hostile");
    let opts = RunOptions {
        tree: tree.clone(),
        jobs: 2,
        fail_fast: false,
        selected: None,
        resume: false,
        previous: Default::default(),
        interrupt: Arc::new(AtomicBool::new(false)),
    };
    let header: RunReceipt = serde_json::from_value(serde_json::json!({
        "schema": RUN_SCHEMA, "name": "hostile", "manifest": {"path": "m", "bytes": 0, "sha256": ""},
        "env_matrices": [], "commit": "c0", "commit_sha": null, "dirty": false, "host": "h",
        "orchestrator_version": "0", "inventory": null, "cpu_slots": 2, "filters": [], "resumed": false,
        "start": "2026-01-01T00:00:00Z", "end": null, "seconds": null, "interrupted": false,
        "counts": {}, "verdict": "running", "nodes": []
    }))
    .unwrap();
    let mut writer = ReceiptWriter::new(tree.clone(), header, plan.cells.len());
    let executor = Arc::new(LocalExecutor::new(
        Duration::from_secs(1),
        root.path().join("tmp"),
    ));
    let outcome = {
        let mut listeners: [&mut dyn Listener; 1] = [&mut writer];
        execute(&plan, &Inventory::fake(0), executor, &opts, &mut listeners)
    };
    writer.finish().unwrap();
    assert!(outcome.all_as_expected(), "{:?}", outcome.verdicts);
    for file in files_under(root.path()) {
        assert!(
            file.starts_with(&tree.dir),
            "{} was written outside the tree",
            file.display()
        );
    }
    assert!(!Path::new("/tmp/escape").exists());
    let run = read_json(&tree.run_json());
    let slugs: Vec<&str> = run["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["slug"].as_str().unwrap())
        .collect();
    assert_eq!(slugs.len(), ids.len());
    for s in slugs {
        assert!(tree.receipt_json(s).exists());
        assert_eq!(Path::new(s).components().count(), 1);
    }
}

#[test]
fn smoke_tree_is_complete() {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR")).join("../manifests/smoke.toml");
    // The smoke manifest's paths resolve against the git top-level (DESIGN §3); in a copy
    // that is not a git checkout (a source tarball) its root would be manifests/ instead.
    let in_git = std::process::Command::new("git")
        .arg("-C")
        .arg(env!("CARGO_MANIFEST_DIR"))
        .args(["rev-parse", "--show-toplevel"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !in_git {
        eprintln!(
            "skipped: {} is not inside a git checkout",
            env!("CARGO_MANIFEST_DIR")
        );
        return;
    }
    let receipts = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_memra-orch"))
        .arg("run")
        .arg(&manifest)
        .arg("--receipts")
        .arg(receipts.path())
        .args(["--commit", "smoke-test", "--progress", "plain"])
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let tree = receipts.path().join("smoke-test/smoke");
    let run = read_json(&tree.join("run.json"));
    assert_eq!(run["schema"], 1);
    assert_eq!(run["commit"], "smoke-test");
    assert_eq!(run["verdict"], "pass");
    assert!(run["end"].is_string() && run["inventory"].is_object());
    let (_, manifest_sha) = sha256_file(&manifest).unwrap();
    assert_eq!(run["manifest"]["sha256"], manifest_sha.as_str());
    assert!(tree.join("summary.md").exists());
    let junit = std::fs::read_to_string(tree.join("junit.xml")).unwrap();
    assert!(junit.contains("<testsuite name=\"smoke\""), "{junit}");
    let nodes = run["nodes"].as_array().unwrap();
    assert_eq!(nodes.len(), 13);
    for n in nodes {
        let r = read_json(
            &tree
                .join("nodes")
                .join(n["slug"].as_str().unwrap())
                .join("receipt.json"),
        );
        assert_eq!(r["schema"], 1);
        assert_eq!(r["id"], n["id"]);
        assert_eq!(r["verdict"], n["verdict"]);
        for a in r["attempts"].as_array().unwrap() {
            if r["kind"] == "compare" {
                continue;
            }
            let dir = tree
                .join("nodes")
                .join(n["slug"].as_str().unwrap())
                .join(format!("attempt-{}", a["n"]));
            for f in ["stdout.log", "stderr.log", "checks.jsonl"] {
                assert!(dir.join(f).is_file(), "{} lacks {f}", dir.display());
            }
            assert!(dir.join("artifacts").is_dir());
        }
    }
    let by_id = |id: &str| {
        let n = nodes.iter().find(|n| n["id"] == id).unwrap();
        read_json(
            &tree
                .join("nodes")
                .join(n["slug"].as_str().unwrap())
                .join("receipt.json"),
        )
    };
    let protocol = by_id("protocol[seed=1]");
    assert_eq!(protocol["env"]["MEMRA_GATE_SEED"], "1");
    assert_eq!(protocol["cell"]["seed"], "1");
    let gate = gates().join("pass.sh");
    let (_, gate_sha) = sha256_file(&gate).unwrap();
    assert_eq!(protocol["binaries"][0]["sha256"], gate_sha.as_str());
    let prepare = by_id("prepare");
    let product = &prepare["produces"][0];
    assert!(
        product["path"]
            .as_str()
            .unwrap()
            .ends_with("target/smoke/host.txt")
    );
    assert!(
        protocol["binaries"]
            .as_array()
            .unwrap()
            .iter()
            .any(|b| b["sha256"] == product["sha256"]),
        "the setup's product is hashed into its dependents"
    );
    let compare = by_id("logits-match[candidate=logits-cand,variant=a]");
    assert_eq!(compare["verdict"], "pass");
    assert!(
        compare["compare"]["values_compared"].as_u64().unwrap() > 0,
        "{compare:#}"
    );
    let compared: Vec<&str> = compare["binaries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["path"].as_str().unwrap())
        .collect();
    assert_eq!(
        compared.len(),
        2,
        "both compared files are hashed into the inputs: {compared:?}"
    );
    assert!(
        compared
            .iter()
            .all(|p| p.ends_with("artifacts/logits.safetensors"))
    );
    let shell = by_id("shell");
    assert_eq!(shell["artifacts"][0]["name"], "hello.txt");
    assert_eq!(by_id("gpu-probe")["verdict"], "skipped");
}

#[test]
fn a_fresh_run_replaces_the_previous_nodes() {
    let manifest = |second: &str| {
        format!(
            "schema = 1\nname = \"fresh\"\n[defaults]\ngpus = 0\n[[arm]]\nid = \"keep\"\nrun = [\"{{gates}}/pass.sh\"]\n[[arm]]\nid = \"{second}\"\nrun = [\"{{gates}}/pass.sh\"]\n"
        )
    };
    let f = Fixture::new(&manifest("old-node"));
    assert_eq!(f.run(&[]).status.code(), Some(0));
    let old_slug = f.receipt("old-node")["slug"].as_str().unwrap().to_string();
    std::fs::write(
        f.path().join("manifest.toml"),
        manifest("new-node").replace("{gates}", &gates().to_string_lossy()),
    )
    .unwrap();
    assert_eq!(f.run(&[]).status.code(), Some(0));
    assert!(!f.tree().join("nodes").join(old_slug).exists());
    assert_eq!(f.verdict("new-node"), "pass");
}

#[test]
fn a_second_run_of_one_tree_is_refused_naming_the_holder() {
    let f = Fixture::new(
        "schema = 1\nname = \"locked\"\n[[arm]]\nid = \"a\"\nrun = [\"{gates}/pass.sh\"]\ngpus = 0\n",
    );
    std::fs::create_dir_all(f.tree()).unwrap();
    // This test process is alive, so the lock is not stale.
    std::fs::write(f.tree().join(".lock"), format!("{}\n", std::process::id())).unwrap();
    let out = f.run(&[]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!("pid {}", std::process::id())),
        "{stderr}"
    );
    assert!(!f.tree().join("run.json").exists());
}
