//! `show`, `ls` and `gc` against receipt trees of a scratch repository run at three commits:
//! `ls` lists each run with its counts, `show` prints a run and a node (text and JSON) and
//! rejects unknown nodes with a suggestion, and `gc --keep 1` deletes the two older trees
//! (and their commit folders) but never a tree a live run holds.

use crate::diff_support::{HEADER, Repo, arm, have_git, stdout};

#[test]
fn ls_show_and_gc() {
    if !have_git() {
        eprintln!("skipped: git is not available for the scratch repository");
        return;
    }
    let repo = Repo::new();
    let mut shas = Vec::new();
    for (i, status) in ["pass", "fail", "pass"].iter().enumerate() {
        let m = [
            HEADER.to_string(),
            arm("alpha", status, "0.5", &format!("v{i}"), "fast"),
            arm("beta", "pass", "0.5", "b", "fast"),
        ]
        .concat();
        shas.push(repo.commit(&[("manifest.toml", &m)], &format!("c{i}")));
        repo.run("manifest.toml");
    }

    let ls = stdout(&repo.orch(&["ls"]));
    let lines: Vec<&str> = ls.lines().collect();
    assert_eq!(lines.len(), 4, "{ls}");
    assert!(
        lines[1].contains(&shas[2][..12]) && lines[1].contains("pass 2"),
        "newest first: {ls}"
    );
    assert!(
        lines[2].contains(&shas[1][..12]) && lines[2].contains("fail 1"),
        "{ls}"
    );
    let json: serde_json::Value =
        serde_json::from_slice(&repo.orch(&["ls", "--format", "json"]).stdout).unwrap();
    assert_eq!(json.as_array().unwrap().len(), 3);

    let run = repo.orch(&["show", "HEAD~1"]);
    assert_eq!(run.status.code(), Some(1), "show exits as the run ended");
    let text = stdout(&run);
    let rows: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("fail ") || l.starts_with("pass "))
        .collect();
    assert_eq!(rows.len(), 2, "{text}");
    assert!(
        rows[0].starts_with("fail ") && rows[0].contains("alpha"),
        "problems first: {text}"
    );
    let node = repo.orch(&["show", "HEAD~1", "alph*"]);
    assert_eq!(node.status.code(), Some(1));
    let text = stdout(&node);
    for needle in [
        "alpha (arm)",
        "verdict:   fail (expect pass)",
        "./gate.sh",
        "accuracy",
        "max_abs=0.5",
        "path = \"fast\"",
        "out.bin",
    ] {
        assert!(text.contains(needle), "{needle:?} in\n{text}");
    }
    let json = repo.orch(&["show", "HEAD", "beta", "--format", "json"]);
    assert_eq!(json.status.code(), Some(0));
    let r: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!(r["id"], "beta");
    let bad = repo.orch(&["show", "HEAD", "alpah"]);
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("did you mean \"alpha\""));

    // A live run holds the oldest tree: gc keeps it and says so.
    let oldest = repo.tree(&shas[0], "battery");
    let lock = std::fs::File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .open(oldest.parent().unwrap().join(".lock"))
        .unwrap();
    lock.lock().unwrap();
    let dry = repo.orch(&["gc", "--keep", "1", "--dry-run"]);
    assert_eq!(dry.status.code(), Some(0));
    assert!(stdout(&dry).contains("2 of 3 runs would be deleted"));
    assert!(oldest.exists() && repo.tree(&shas[1], "battery").exists());
    let gc = repo.orch(&["gc", "--keep", "1"]);
    assert_eq!(gc.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&gc.stderr).contains("by a run in progress"));
    assert!(oldest.join("run.json").exists(), "the locked tree is kept");
    assert!(
        !repo.path().join("receipts").join(&shas[1]).exists(),
        "tree and commit folder gone"
    );
    drop(lock);
    let gc = repo.orch(&["gc", "--keep", "1"]);
    assert_eq!(gc.status.code(), Some(0));
    assert!(!repo.path().join("receipts").join(&shas[0]).exists());
    assert!(repo.tree(&shas[2], "battery").join("run.json").exists());
    let zero = repo.orch(&["gc", "--keep", "0"]);
    assert_eq!(zero.status.code(), Some(2));
}

/// After red nights, `gc --keep 1` keeps the newest run and the last green one (the
/// baseline a morning diff reads), says why, and deletes the red run between them; once a
/// newer run is green the old baseline goes.
#[test]
fn gc_never_deletes_the_last_green_run() {
    if !have_git() {
        eprintln!("skipped: git is not available for the scratch repository");
        return;
    }
    let repo = Repo::new();
    let mut shas = Vec::new();
    for (i, status) in ["pass", "fail", "fail"].iter().enumerate() {
        let m = [
            HEADER.to_string(),
            arm("alpha", status, "0.5", &format!("v{i}"), "fast"),
        ]
        .concat();
        shas.push(repo.commit(&[("manifest.toml", &m)], &format!("c{i}")));
        repo.run("manifest.toml");
    }
    let gc = repo.orch(&["gc", "--keep", "1"]);
    assert_eq!(gc.status.code(), Some(0));
    let out = stdout(&gc);
    assert!(out.contains("the last green run of its manifest"), "{out}");
    assert!(
        repo.tree(&shas[0], "battery").join("run.json").exists(),
        "the baseline stays"
    );
    assert!(
        !repo.path().join("receipts").join(&shas[1]).exists(),
        "{out}"
    );
    assert!(repo.tree(&shas[2], "battery").join("run.json").exists());

    // A green night: the old baseline is an ordinary old run again.
    let m = [
        HEADER.to_string(),
        arm("alpha", "pass", "0.5", "v3", "fast"),
    ]
    .concat();
    shas.push(repo.commit(&[("manifest.toml", &m)], "c3"));
    repo.run("manifest.toml");
    let gc = repo.orch(&["gc", "--keep", "1"]);
    assert_eq!(gc.status.code(), Some(0));
    assert!(
        !repo.path().join("receipts").join(&shas[0]).exists(),
        "{}",
        stdout(&gc)
    );
    assert!(repo.tree(&shas[3], "battery").join("run.json").exists());
}
