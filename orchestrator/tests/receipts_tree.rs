//! The receipt tree (DESIGN §6): hostile cell ids stay inside it, a fresh run replaces the
//! previous run's nodes, and the run lock keeps two runs out of one tree. The tree of a full
//! smoke run is checked in `smoke_manifest.rs`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use crate::run_support::{Fixture, epoch, files_under, gates, read_json};
use memra_orch::machine::gpus::Inventory;
use memra_orch::plan::{Cell, CellId, Expect, NodeId, NodeKind, Plan, SourceFile};
use memra_orch::receipt::tree::Tree;
use memra_orch::receipt::{RUN_SCHEMA, RunReceipt};
use memra_orch::report::writer::ReceiptWriter;
use memra_orch::run::events::Listener;
use memra_orch::run::executor::local::LocalExecutor;
use memra_orch::run::{RunOptions, execute};

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
        max_output: 1 << 30,
        reps: 1,
        deterministic: true,
        retries: 0,
        expect: Expect::Pass,
        expect_fail: Vec::new(),
        info: Vec::new(),
        hermetic: false,
        verdict: None,
        produces: Vec::new(),
        creates: Vec::new(),
        inputs: Vec::new(),
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
        require: Default::default(),
        fingerprints: Vec::new(),
        attest: Vec::new(),
        lease_timeout: None,
        cells: ids
            .iter()
            .map(|id| cell(id, vec![gate.clone()], &work))
            .collect(),
        redact: Default::default(),
        notify: None,
        retention: None,
    };
    let (tree, _id) = Tree::create(&memra_orch::receipt::tree::manifest_dir(
        &work.join("receipts"),
        "c0",
        "hostile",
    ))
    .unwrap();
    let opts = RunOptions {
        tree: tree.clone(),
        jobs: 2,
        fail_fast: false,
        selected: None,
        resume: false,
        carry: None,
        disk_full: Default::default(),
        previous: Default::default(),
        interrupt: Arc::new(AtomicBool::new(false)),
        require_gpus: None,
        heartbeat: memra_orch::run::DEFAULT_HEARTBEAT,
        gpu_locks: None,
        code: "unknown:c0".into(),
        fingerprints: Vec::new(),
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
        assert!(crate::run_support::is_file_in_tree(&tree.receipt_json(s)));
        assert_eq!(Path::new(s).components().count(), 1);
    }
}

#[test]
fn a_new_run_holds_only_its_own_nodes_and_leaves_the_old_run_alone() {
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
    let first = f.tree();
    assert_eq!(f.run(&[]).status.code(), Some(0));
    assert_ne!(f.tree(), first);
    assert!(!crate::run_support::is_dir_in_tree(
        &f.tree().join("nodes").join(&old_slug)
    ));
    assert!(crate::run_support::is_dir_in_tree(
        &f.tree()
            .join("nodes")
            .join(f.receipt("new-node")["slug"].as_str().unwrap())
    ));
    assert_eq!(f.verdict("new-node"), "pass");
    assert!(crate::run_support::is_file_in_tree(
        &first.join("nodes").join(&old_slug).join("receipt.json")
    ));
}

#[test]
fn a_second_run_of_one_tree_is_refused_naming_the_holder() {
    let f = Fixture::new(
        "schema = 1\nname = \"locked\"\n[[arm]]\nid = \"a\"\nrun = [\"{gates}/pass.sh\"]\ngpus = 0\n",
    );
    // The lock as a run holds it: an flock on the manifest folder's `.lock`, naming its pid.
    std::fs::create_dir_all(f.manifest_dir()).unwrap();
    let lock = std::fs::File::create(f.manifest_dir().join(".lock")).unwrap();
    lock.lock().unwrap();
    std::fs::write(
        f.manifest_dir().join(".lock"),
        format!("{}\n", std::process::id()),
    )
    .unwrap();
    let out = f.run(&[]);
    // 75 (EX_TEMPFAIL), not the usage code: the same command succeeds once the holder ends.
    assert_eq!(out.status.code(), Some(75));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!("pid {}", std::process::id())),
        "{stderr}"
    );
    assert!(f.runs().is_empty());
    drop(lock);
    assert_eq!(f.run(&[]).status.code(), Some(0));
}

/// After a crash (a lock file naming a dead pid, a run folder left `running`), four runs
/// started at once, thirty times: the lock lets one run at a time, so no two runs ever
/// overlap, each writes only its own folder, and every other one exits 75.
#[test]
fn runs_started_together_after_a_crash_never_share_a_tree() {
    let f = Fixture::new(
        "schema = 1\nname = \"race\"\n[[arm]]\nid = \"a\"\nrun = [\"{gates}/pass.sh\"]\ngpus = 0\n",
    );
    let m = f.manifest_dir();
    std::fs::create_dir_all(m.join("20260101T000000.000Z-dead/nodes")).unwrap();
    std::fs::write(
        m.join("20260101T000000.000Z-dead/run.json"),
        "{\"verdict\": \"running\"}",
    )
    .unwrap();
    for trial in 0..30 {
        std::fs::write(m.join(".lock"), "2147483646\n").unwrap();
        let mut children: Vec<_> = (0..4).map(|_| f.spawn(&[])).collect();
        let codes: Vec<Option<i32>> = children.iter_mut().map(|c| c.wait().code()).collect();
        assert!(
            codes.iter().all(|c| matches!(c, Some(0) | Some(75))),
            "trial {trial}: {codes:?}"
        );
        assert!(codes.contains(&Some(0)), "trial {trial}: {codes:?}");
    }
    let mut spans: Vec<(f64, f64)> = f
        .runs()
        .iter()
        .filter(|t| t.join("summary.md").exists())
        .map(|t| {
            let run = read_json(&t.join("run.json"));
            assert_eq!(run["verdict"], "pass", "{}", t.display());
            (
                epoch(run["start"].as_str().unwrap()),
                epoch(run["end"].as_str().unwrap()),
            )
        })
        .collect();
    assert!(spans.len() >= 30, "{} runs", spans.len());
    spans.sort_by(|a, b| a.0.total_cmp(&b.0));
    for w in spans.windows(2) {
        assert!(w[0].1 <= w[1].0, "two runs overlapped: {w:?}");
    }
}
