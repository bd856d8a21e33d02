//! A timeout stops the whole process group of an attempt: the gate and the grandchild it
//! started; and nothing a gate leaves behind outlives its attempt.

mod run_support;

use std::time::{Duration, Instant};

use run_support::{Fixture, alive};

#[test]
fn timeout_kills_the_gate_and_its_grandchildren() {
    let f = Fixture::new(
        r#"
schema = 1
name = "timeouts"

[[arm]]
id = "hang"
run = ["{gates}/hang.sh"]
gpus = 0
timeout = "1s"
"#,
    );
    let t = Instant::now();
    let out = f.run(&[]);
    assert!(
        t.elapsed() < Duration::from_secs(20),
        "took {:?}",
        t.elapsed()
    );
    assert_eq!(out.status.code(), Some(1));
    let r = f.receipt("hang");
    assert_eq!(r["verdict"], "timeout");
    assert_eq!(r["reason"], "timed out after 1s");
    // SIGTERM (15) ended the gate; the grace period never ran out.
    assert_eq!(r["attempts"][0]["signal"], 15);
    let pid: i32 =
        std::fs::read_to_string(f.attempt_dir("hang", 1).join("artifacts/grandchild.pid"))
            .unwrap()
            .trim()
            .parse()
            .unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while alive(pid) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(!alive(pid), "grandchild {pid} survived the timeout");
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
    let pid: i32 = std::fs::read_to_string(f.attempt_dir("orphan", 1).join("artifacts/orphan.pid"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while alive(pid) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(!alive(pid), "the gate's background process {pid} survived");
}
