//! The history index (one SQLite file under the receipts folder) with real processes at
//! once: runs filing their rows, `gc` deleting runs and dropping theirs, and readers
//! (`history`, `ls`, `report`) checking it against the trees and rebuilding what is stale.
//! Afterwards SQLite's own integrity check passes and the index answers what the trees
//! answer.

use std::process::Command;

use crate::run_support::{Fixture, orch};

fn manifest() -> String {
    let mut m = String::from("schema = 1\nname = \"busy\"\n");
    for i in 0..12 {
        m.push_str(&format!(
            "[[arm]]\nid = \"c{i}\"\nrun = [\"{{gates}}/pass.sh\"]\n"
        ));
    }
    m
}

#[test]
fn runs_gc_and_readers_at_once_leave_a_sound_index_that_agrees_with_the_trees() {
    let f = Fixture::new(&manifest());
    for _ in 0..3 {
        assert_eq!(f.run(&[]).status.code(), Some(0));
    }
    let receipts = f.path().join("receipts");
    let reader = |args: &[&str]| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_memra-orch"));
        cmd.args(args)
            .arg("--receipts")
            .arg(&receipts)
            .current_dir(f.path())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped());
        cmd
    };
    let run = |commit: &str| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_memra-orch"));
        cmd.arg("run")
            .arg(f.path().join("manifest.toml"))
            .args(["--receipts", receipts.to_str().unwrap()])
            .args(["--commit", commit, "--progress", "plain"])
            .current_dir(f.path())
            .env("MEMRA_GPU_LOCK_DIR", f.path().join("gpu-leases"))
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped());
        cmd
    };
    let site = f.path().join("site");
    let mut children = Vec::new();
    for round in 0..3 {
        // Two runs at once (other commits: one commit's runs of a manifest take turns).
        children.push(("run", run(&format!("a{round}")).spawn().unwrap()));
        children.push(("run", run(&format!("b{round}")).spawn().unwrap()));
        children.push(("gc", reader(&["gc", "--keep", "2"]).spawn().unwrap()));
        children.push((
            "history",
            reader(&["history", "--format", "json"]).spawn().unwrap(),
        ));
        children.push(("ls", reader(&["ls"]).spawn().unwrap()));
        if round == 1 {
            children.push((
                "report",
                reader(&["report", "--html", site.to_str().unwrap()])
                    .spawn()
                    .unwrap(),
            ));
        }
    }
    let mut ran = 0;
    for (what, child) in children {
        let out = child.wait_with_output().unwrap();
        let status = out.status;
        let said = String::from_utf8_lossy(&out.stderr);
        // A reader may meet a run folder gc is deleting, and gc may keep a run that ended
        // while it worked (exit 1): none may crash, hang or corrupt anything.
        assert!(
            status.code().is_some(),
            "{what} died of a signal: {status}\n{said}"
        );
        assert_ne!(status.code(), Some(3), "{what}: internal error\n{said}");
        if what == "run" {
            assert_eq!(status.code(), Some(0), "every run passes\n{said}");
            ran += 1;
        }
    }
    assert_eq!(ran, 6);
    let db = rusqlite::Connection::open(receipts.join(".memra-index/index.sqlite")).unwrap();
    let check: String = db
        .query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .unwrap();
    assert_eq!(check, "ok");
    drop(db);
    let through_index = orch(&f, &["history", "--format", "json"]);
    assert_eq!(through_index.status.code(), Some(0));
    for ext in ["sqlite", "sqlite-wal", "sqlite-shm"] {
        let _ = std::fs::remove_file(receipts.join(format!(".memra-index/index.{ext}")));
    }
    let from_trees = orch(&f, &["history", "--format", "json"]);
    assert_eq!(
        String::from_utf8_lossy(&through_index.stdout),
        String::from_utf8_lossy(&from_trees.stdout),
        "the index kept through it all answers what the trees answer"
    );
}

/// `ls` and the run names of `show`, `diff` and `summary` come from the index's run heads:
/// they equal what parsing every `run.json` gives — across manifests, with a rerun that
/// carries cells, a run folder whose `run.json` is damaged and one killed before it wrote
/// one (both unreadable, in both listings), a run whose `run.json` changed after it was
/// indexed, and a run deleted behind the index's back.
#[test]
fn run_heads_from_the_index_are_the_trees_run_heads() {
    use memra_orch::history::heads::heads_and_unreadable;
    use memra_orch::receipt::resolve::{RunHead, list_runs_and_unreadable};

    let f = Fixture::new(&manifest().replace(
        "c3\"\nrun = [\"{gates}/pass.sh\"]",
        "c3\"\nrun = [\"{gates}/fail.sh\"]",
    ));
    assert_eq!(f.run(&[]).status.code(), Some(1));
    assert_eq!(f.run(&["--rerun-failed"]).status.code(), Some(1));
    assert_eq!(f.run(&[]).status.code(), Some(1));
    // A second manifest in the same receipts folder.
    std::fs::write(
        f.path().join("other.toml"),
        "schema = 1\nname = \"other\"\n[[arm]]\nid = \"x\"\nrun = [\"true\"]\n",
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_memra-orch"))
        .args([
            "run",
            "other.toml",
            "--commit",
            "c2",
            "--progress",
            "plain",
            "--receipts",
        ])
        .arg(f.path().join("receipts"))
        .current_dir(f.path())
        .env("MEMRA_GPU_LOCK_DIR", f.path().join("gpu-leases"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let receipts = f.path().join("receipts");
    let trees = || {
        let (runs, unreadable) = list_runs_and_unreadable(&receipts).unwrap();
        (runs.iter().map(RunHead::of).collect::<Vec<_>>(), unreadable)
    };
    let index = || heads_and_unreadable(&receipts).unwrap();
    let (first, _) = index();
    assert_eq!(first.len(), 4);
    assert_eq!(
        first.iter().map(|r| r.carried).sum::<usize>(),
        11,
        "{first:?}"
    );
    assert_eq!(index(), trees());

    let runs = f.runs();
    // Damaged, killed before run.json, changed after indexing, deleted.
    std::fs::write(runs[0].join("run.json"), "{ cut").unwrap();
    let killed = runs[0].parent().unwrap().join("20261201T000000.000Z-dead");
    std::fs::create_dir(&killed).unwrap();
    let mut json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(runs[1].join("run.json")).unwrap()).unwrap();
    json["host"] = serde_json::json!("elsewhere");
    std::fs::write(runs[1].join("run.json"), json.to_string()).unwrap();
    std::fs::remove_dir_all(&runs[2]).unwrap();
    let (heads, unreadable) = index();
    assert_eq!((heads.clone(), unreadable.clone()), trees());
    let mut expected = vec![runs[0].clone(), killed];
    expected.sort();
    assert_eq!(unreadable, expected);
    assert!(heads.iter().any(|r| r.host == "elsewhere"), "{heads:?}");
    assert_eq!(heads.len(), 2);

    // Without the damaged run (whose run.json sends the listing to the trees), the index
    // serves: a manifest folder that is a link is followed by neither listing.
    std::fs::remove_dir_all(&runs[0]).unwrap();
    let linked = receipts.join("linked");
    std::fs::create_dir(&linked).unwrap();
    std::os::unix::fs::symlink(runs[1].parent().unwrap(), linked.join("busy")).unwrap();
    let (heads, unreadable) = index();
    assert_eq!((heads.clone(), unreadable.clone()), trees());
    assert_eq!(heads.len(), 2, "{heads:?}");
    assert!(
        heads.iter().all(|r| !r.dir.starts_with(&linked)),
        "{heads:?}"
    );
}
