//! Ctrl-C (SIGINT to memra-orch) mid-run: running groups are stopped, their receipts say
//! `cancelled`, the tree is consistent, and `run --resume` completes it in a run of its
//! own that carries the nodes that had finished, leaving the interrupted run as it was.

use std::path::PathBuf;
use std::time::Duration;

use crate::run_support::{Fixture, eventually, files_under, read_json};

#[test]
fn interrupt_then_resume_completes_the_tree() {
    let f = Fixture::new(
        r#"
schema = 1
name = "interrupt"

[defaults]
gpus = 0

[[arm]]
id = "quick"
run = ["{gates}/pass.sh"]

[[arm]]
id = "slow"
needs = ["quick"]
run = ["{gates}/wait-for.sh", "${root}/go"]

[[arm]]
id = "after"
needs = ["slow"]
run = ["{gates}/pass.sh"]
"#,
    );
    // A grace far beyond the test: `slow` must die of the cancel's SIGTERM, never of a
    // SIGKILL sent because a loaded machine was slow to reap it.
    let f = f.with_grace("10m");
    let mut child = f.spawn(&["--jobs", "2"]);
    // Wait until `slow` is running (its first attempt folder exists). Its gate waits for
    // `go`, which only the resume below writes, so it is still running when the signal
    // comes.
    let slow_running = || {
        f.runs().iter().any(|tree| {
            std::fs::read_dir(tree.join("nodes"))
                .map(|d| {
                    d.flatten().any(|e| {
                        e.file_name().to_string_lossy().starts_with("slow-")
                            && e.path().join("attempt-1").exists()
                    })
                })
                .unwrap_or(false)
        })
    };
    assert!(
        eventually(Duration::from_secs(90), slow_running),
        "slow never started; the runs: {:?}",
        f.runs()
    );
    // SAFETY: signalling the child we spawned, by its pid.
    unsafe { libc_kill(child.pid(), 2) };
    let status = child.wait();
    assert_eq!(status.code(), Some(130));

    let run = f.run_json();
    assert_eq!(run["interrupted"], true);
    assert!(run["end"].is_string());
    assert_eq!(f.verdict("quick"), "pass");
    let slow = f.receipt("slow");
    assert_eq!(slow["verdict"], "cancelled");
    // The running gate was stopped through its process group (SIGTERM = 15).
    assert_eq!(slow["attempts"][0]["signal"], 15, "{slow:#}");
    assert_eq!(f.verdict("after"), "cancelled");
    assert!(
        f.receipt("after")["reason"]
            .as_str()
            .unwrap()
            .contains("not started")
    );
    let interrupted = f.tree();
    let quick_path = f.node_dir("quick").join("receipt.json");
    let quick_before = std::fs::read(&quick_path).unwrap();
    let quick_start = read_json(&quick_path)["attempts"][0]["start"].clone();
    let interrupted_files: Vec<(PathBuf, Vec<u8>)> = files_under(&interrupted)
        .into_iter()
        .map(|p| {
            let bytes = crate::run_support::read_bytes(&p).unwrap();
            (p, bytes)
        })
        .collect();

    std::fs::write(f.path().join("go"), "").unwrap();
    let out = f.run(&["--resume", "--jobs", "2"]);
    assert_eq!(out.status.code(), Some(0));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr
            .lines()
            .any(|l| l.contains("quick") && l.contains("[carried from 20")),
        "{stderr}"
    );
    assert!(
        !stderr.contains("start    quick"),
        "quick ran again:\n{stderr}"
    );
    assert_eq!(
        std::fs::read(&quick_path).unwrap(),
        quick_before,
        "quick's receipt was rewritten"
    );
    // The resumed run is a run of its own; it carries quick's receipt from the interrupted
    // one, which it never changed.
    assert_ne!(f.tree(), interrupted);
    assert_eq!(
        f.node_dir("quick").canonicalize().unwrap(),
        quick_path.parent().unwrap().canonicalize().unwrap()
    );
    assert_eq!(f.receipt("quick")["attempts"][0]["start"], quick_start);
    for (path, bytes) in &interrupted_files {
        assert_eq!(
            &crate::run_support::read_bytes(path).unwrap(),
            bytes,
            "{} changed",
            path.display()
        );
    }
    assert_eq!(files_under(&interrupted).len(), interrupted_files.len());
    assert_eq!(f.verdict("slow"), "pass");
    assert_eq!(f.verdict("after"), "pass");
    // The cancelled attempt of `slow` was replaced, not kept next to the new one.
    assert_eq!(f.receipt("slow")["attempts"].as_array().unwrap().len(), 1);
    let run = f.run_json();
    assert_eq!(run["resumed"], true);
    assert_eq!(run["verdict"], "pass");
    assert_eq!(run["counts"]["pass"], 3);
}

unsafe extern "C" {
    #[link_name = "kill"]
    fn libc_kill(pid: i32, sig: i32) -> i32;
}

#[test]
fn resume_after_a_sigkill_carries_what_had_finished() {
    // Each arm appends to `runs-<id>` when it really runs.
    let f = Fixture::new(
        r#"
schema = 1
name = "killed"

[defaults]
gpus = 0
shell = true

[[arm]]
id = "quick"
run = "echo ran >> runs-quick && {gates}/pass.sh"

[[arm]]
id = "slow"
needs = ["quick"]
run = "echo ran >> runs-slow && {gates}/wait-for.sh ${root}/go"
"#,
    );
    let runs = |id: &str| {
        std::fs::read_to_string(f.path().join(format!("runs-{id}")))
            .map_or(0, |s| s.lines().count())
    };
    let mut child = f.spawn(&["--jobs", "2"]);
    assert!(
        eventually(Duration::from_secs(90), || runs("slow") == 1),
        "slow never started"
    );
    // What no handler sees: the run dies without rewriting its run.json.
    // SAFETY: signalling the child we spawned, by its pid.
    unsafe { libc_kill(child.pid(), 9) };
    child.wait();
    assert!(f.run_json()["end"].is_null(), "a killed run never finished");
    std::fs::write(f.path().join("go"), "").unwrap();
    let out = f.run(&["--resume"]);
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(
        runs("quick"),
        1,
        "the finished cell is carried, not run again"
    );
    assert_eq!(runs("slow"), 2, "the killed cell runs again");
    let run = f.run_json();
    let quick = run["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["id"] == "quick")
        .unwrap();
    assert!(quick["carried"].is_object(), "{run:#}");
}
