//! A gate that turns on its supervisor, with real processes: one that stops it
//! (`kill -STOP $PPID`) cannot hang the run past its timeout, and one that kills it leaves
//! no worker running beside the next cell. The supervisor is a binary of its own, and
//! memra-orch copied alone supervises with itself.

use std::time::{Duration, Instant};

use crate::run_support::{Fixture, logged, read_text};

#[test]
fn a_gate_that_stops_its_supervisor_cannot_hang_the_run() {
    let f = Fixture::new(
        "schema = 1\nname = \"stop\"\n\
         [[arm]]\nid = \"rogue\"\ntimeout = \"2s\"\nshell = true\nrun = \"kill -STOP $PPID; sleep 60\"\n",
    );
    let t = Instant::now();
    let out = logged(f.run(&[]));
    let took = t.elapsed();
    assert!(took < Duration::from_secs(30), "the run took {took:?}");
    assert_eq!(out.status.code(), Some(1));
    let v = f.verdict("rogue");
    assert_eq!(v, "error", "{:#}", f.receipt("rogue"));
    let reason = f.receipt("rogue")["reason"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(reason.contains("supervisor"), "{reason}");
}

#[test]
fn a_gate_that_kills_its_supervisor_leaves_no_worker_beside_the_next_cell() {
    // `rogue` starts a worker in a session of its own that keeps replacing a file (whole, by
    // rename, so a kill never leaves it empty), waits for its first beat, then kills its
    // supervisor. `next` (after it, one CPU slot) checks that the file stops changing.
    let f = Fixture::new(
        "schema = 1\nname = \"kill\"\n\
         [[arm]]\nid = \"rogue\"\nshell = true\n\
         run = \"setsid sh -c 'while true; do date +%s%N > \\\"$PWD/beat.new\\\" && mv \\\"$PWD/beat.new\\\" \\\"$PWD/beat\\\"; sleep 0.05; done' </dev/null >/dev/null 2>&1 & until test -s beat; do sleep 0.05; done; kill -KILL $PPID; sleep 60\"\n\
         [[arm]]\nid = \"next\"\nneeds = []\nshell = true\n\
         run = \"sleep 0.5 && test -s beat && a=$(cat beat) && sleep 1 && b=$(cat beat) && test \\\"$a\\\" = \\\"$b\\\"\"\n",
    );
    let out = logged(f.run(&["--jobs", "1"]));
    assert_eq!(f.verdict("rogue"), "error", "{:#}", f.receipt("rogue"));
    assert_eq!(f.verdict("next"), "pass", "the worker outlived its attempt");
    assert_eq!(out.status.code(), Some(1));
}

#[test]
fn the_supervisor_is_its_own_small_binary_and_memra_orch_alone_supervises_itself() {
    let manifest = "schema = 1\nname = \"sup\"\n\
         [[arm]]\nid = \"parent\"\ngpus = 0\nshell = true\nrun = \"cat /proc/$PPID/comm\"\n";
    // Built beside memra-orch, memra-supervise is the gate's parent.
    let f = Fixture::new(manifest);
    assert_eq!(logged(f.run(&[])).status.code(), Some(0));
    let said = read_text(&f.attempt_dir("parent", 1).join("stdout.log")).unwrap();
    assert_eq!(said.trim(), "memra-supervise");

    // memra-orch copied alone: it re-executes itself as the supervisor, and the run is the
    // same. So it does beside a `memra-supervise` of another build (a stale one, or a file
    // that is not a supervisor at all), and beside one that cannot run; beside this build's
    // own, that one supervises.
    let alone = tempfile::tempdir().unwrap();
    let place = |from: &str, to: &std::path::Path| {
        let _ = std::fs::remove_file(to);
        if std::fs::hard_link(from, to).is_err() {
            std::fs::copy(from, to).unwrap();
        }
    };
    let orch = alone.path().join("memra-orch");
    place(env!("CARGO_BIN_EXE_memra-orch"), &orch);
    let sibling = alone.path().join("memra-supervise");
    let parent_in_a_run = |prepare: &dyn Fn()| -> String {
        prepare();
        let g = Fixture::new(manifest);
        let out = logged(
            std::process::Command::new(&orch)
                .arg("run")
                .arg(g.path().join("manifest.toml"))
                .arg("--receipts")
                .arg(g.path().join("receipts"))
                .args(["--commit", "test-commit", "--progress", "plain"])
                .current_dir(g.path())
                .env("MEMRA_GPU_LOCK_DIR", g.path().join("gpu-leases"))
                .output()
                .unwrap(),
        );
        assert_eq!(out.status.code(), Some(0));
        read_text(&g.attempt_dir("parent", 1).join("stdout.log"))
            .unwrap()
            .trim()
            .to_string()
    };
    assert_eq!(parent_in_a_run(&|| ()), "memra-orch");
    let write = |text: &str, mode: u32| {
        use std::os::unix::fs::PermissionsExt as _;
        let _ = std::fs::remove_file(&sibling);
        std::fs::write(&sibling, text).unwrap();
        std::fs::set_permissions(&sibling, std::fs::Permissions::from_mode(mode)).unwrap();
    };
    let stale = "#!/bin/sh\necho memra-supervise 0.0.0 0000000000000000\n";
    assert_eq!(parent_in_a_run(&|| write(stale, 0o755)), "memra-orch");
    let liar = "#!/bin/sh\nexec sleep 0\n";
    assert_eq!(parent_in_a_run(&|| write(liar, 0o755)), "memra-orch");
    assert_eq!(parent_in_a_run(&|| write(stale, 0o644)), "memra-orch");
    assert_eq!(
        parent_in_a_run(&|| place(env!("CARGO_BIN_EXE_memra-supervise"), &sibling)),
        "memra-supervise"
    );
    let g = Fixture::new(manifest);

    // Started by hand, it says what it is for and runs nothing.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_memra-supervise"))
        .args(["touch", "ran"])
        .current_dir(g.path())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("started by memra-orch only"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!g.path().join("ran").exists());
}
