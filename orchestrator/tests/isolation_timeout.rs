//! A timeout stops the whole process group of an attempt: the gate and the grandchild it
//! started; and nothing a gate leaves behind outlives its attempt.

use std::time::{Duration, Instant};

use crate::run_support::{Fixture, alive, eventually, proc_stat};

/// How long a process may take to die once killed, on a loaded machine.
const DEATH: Duration = Duration::from_secs(60);

/// Runs `hang.sh` (a grandchild, then 300 s of sleep) under a timeout of `limit` seconds and
/// checks the timeout ended it with SIGTERM. Returns the fixture and the grandchild's pid,
/// or `None` when the gate had not yet started its grandchild when the timeout struck.
fn hang_with_timeout(limit: u64) -> (Fixture, Option<i32>) {
    let f = Fixture::new(&format!(
        r#"
schema = 1
name = "timeouts"

[[arm]]
id = "hang"
run = ["{{gates}}/hang.sh"]
gpus = 0
timeout = "{limit}s"
"#
    ))
    // A grace far beyond the test: the gate must die of the timeout's SIGTERM, never of a
    // SIGKILL sent because a loaded machine was slow to reap it.
    .with_grace("10m");
    let t = Instant::now();
    let out = f.run(&[]);
    // Below the gate's 300 s of sleep: the timeout ended the run, not the gate.
    assert!(
        t.elapsed() < Duration::from_secs(250),
        "took {:?}",
        t.elapsed()
    );
    assert_eq!(out.status.code(), Some(1));
    let r = f.receipt("hang");
    assert_eq!(r["verdict"], "timeout", "{r:#}");
    let limit_text = humantime::format_duration(Duration::from_secs(limit));
    assert_eq!(r["reason"], format!("timed out after {limit_text}"));
    // SIGTERM (15) ended the gate; the grace period never ran out.
    assert_eq!(r["attempts"][0]["signal"], 15, "{r:#}");
    let pid_file = f.attempt_dir("hang", 1).join("artifacts/grandchild.pid");
    // Absent, or empty when the timeout struck between opening the file and writing it.
    let pid = crate::run_support::read_text(&pid_file)
        .ok()
        .and_then(|p| p.trim().parse().ok());
    (f, pid)
}

#[test]
fn timeout_kills_the_gate_and_its_grandchildren() {
    // The 1 s timeout is the behaviour under test, and its verdict is checked whatever the
    // machine. A machine too loaded to let the gate start its grandchild within that second
    // leaves no grandchild to check; only then is the gate run again under longer timeouts,
    // until one finds the grandchild running when it strikes.
    for limit in [1, 10, 60] {
        let (_f, pid) = hang_with_timeout(limit);
        let Some(pid) = pid else {
            eprintln!("hang.sh had not started its grandchild within {limit}s; trying longer");
            continue;
        };
        assert!(
            eventually(DEATH, || !alive(pid)),
            "grandchild {pid} survived the {limit}s timeout: {}",
            proc_stat(pid)
        );
        return;
    }
    panic!("hang.sh never started its grandchild, even within 60 s");
}

#[test]
fn a_background_process_does_not_outlive_its_attempt() {
    let f = Fixture::new(
        r#"
schema = 1
name = "orphans"

[[arm]]
id = "orphan"
run = ["{gates}/orphan.sh"]
gpus = 0
"#,
    );
    assert_eq!(f.run(&[]).status.code(), Some(0));
    let pid: i32 =
        crate::run_support::read_text(&f.attempt_dir("orphan", 1).join("artifacts/orphan.pid"))
            .unwrap()
            .trim()
            .parse()
            .unwrap();
    assert!(
        eventually(DEATH, || !alive(pid)),
        "the gate's background process {pid} survived: {}",
        proc_stat(pid)
    );
}
