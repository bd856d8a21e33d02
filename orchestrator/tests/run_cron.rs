//! The edges of `memra-orch run` that a nightly cron job relies on: exit 75 and the holder's
//! pid when another run holds the lock, `--wait-lock` waiting for it, the plain-mode
//! heartbeat naming a long cell's stderr.log, `--progress quiet` printing only the final
//! counts, and a dirty tree naming the paths that made it dirty.

use std::process::{Command, Stdio};
use std::time::Duration;

use crate::diff_support::{HEADER, Repo, arm, have_git};
use crate::run_support::{COMMIT, Fixture, eventually};

/// One cell that waits for `${root}/go`, so a test decides when the first run ends.
const WAITS: &str = r#"
schema = 1
name = "nightly"

[defaults]
gpus = 0

[[arm]]
id = "slow"
run = ["{gates}/wait-for.sh", "${root}/go"]
"#;

/// Waits until the first run holds the lock and its cell runs.
fn wait_until_running(f: &Fixture) {
    let running = || {
        f.runs().iter().any(|tree| {
            std::fs::read_dir(tree.join("nodes")).is_ok_and(|d| {
                d.flatten()
                    .any(|e| e.path().join("attempt-1").join("stderr.log").exists())
            })
        })
    };
    assert!(
        eventually(Duration::from_secs(90), running),
        "the first run never started its cell under the lock"
    );
}

#[test]
fn a_held_lock_exits_75_and_names_the_holder() {
    let f = Fixture::new(WAITS);
    let mut first = f.spawn(&[]);
    wait_until_running(&f);

    let second = f.run(&[]);
    let stderr = String::from_utf8_lossy(&second.stderr);
    assert_eq!(second.status.code(), Some(75), "{stderr}");
    assert!(
        stderr.contains(&format!("pid {}", first.pid())),
        "the message names the holder: {stderr}"
    );
    // Waiting does not change the answer once the wait is over.
    let waited = f.run(&["--wait-lock", "1s"]);
    let stderr = String::from_utf8_lossy(&waited.stderr);
    assert_eq!(waited.status.code(), Some(75), "{stderr}");
    assert!(stderr.contains("still locked after waiting 1s"), "{stderr}");

    std::fs::write(f.path().join("go"), "").unwrap();
    assert_eq!(first.wait().code(), Some(0));
}

#[test]
fn wait_lock_waits_for_the_holder_then_runs() {
    let f = Fixture::new(WAITS);
    let mut first = f.spawn(&[]);
    wait_until_running(&f);

    let log = f.path().join("second.stderr");
    let mut second = f
        .command(&["--wait-lock", "60s"])
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let waiting = format!(
        "waiting for the lock of {}: held by memra-orch pid {}",
        f.manifest_dir().display(),
        first.pid()
    );
    let said = eventually(Duration::from_secs(60), || {
        std::fs::read_to_string(&log).is_ok_and(|t| t.contains(&waiting))
    });
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(said, "the waiting run says whom it waits for: {text}");
    assert!(
        matches!(second.try_wait(), Ok(None)),
        "it still waits while the first run holds the lock: {text}"
    );

    std::fs::write(f.path().join("go"), "").unwrap();
    assert_eq!(first.wait().code(), Some(0));
    let status = second.wait().unwrap();
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    assert_eq!(status.code(), Some(0), "{text}");
    assert_eq!(
        text.matches("waiting for the lock").count(),
        1,
        "said once: {text}"
    );
    assert_eq!(f.verdict("slow"), "pass");
}

#[test]
fn plain_progress_has_a_heartbeat_for_a_long_cell() {
    let f = Fixture::new(
        r#"
schema = 1
name = "heartbeat"

[defaults]
gpus = 0

[[arm]]
id = "long"
run = ["sleep", "5"]
"#,
    );
    let out = f
        .command(&[])
        .env("MEMRA_ORCH_HEARTBEAT", "1s")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    let log = f.attempt_dir("long", 1).join("stderr.log");
    for s in ["1s", "2s"] {
        let line = format!("still running {s}: long (log: {})", log.display());
        assert!(stderr.contains(&line), "no {line:?} in: {stderr}");
    }
}

#[test]
fn quiet_progress_prints_only_the_final_counts() {
    let f = Fixture::new(
        r#"
schema = 1
name = "quiet"

[defaults]
gpus = 0

[[arm]]
id = "a"
run = ["{gates}/pass.sh"]

[[arm]]
id = "b"
run = ["{gates}/pass.sh"]
"#,
    );
    let out = Command::new(env!("CARGO_BIN_EXE_memra-orch"))
        .arg("run")
        .arg(f.path().join("manifest.toml"))
        .arg("--receipts")
        .arg(f.path().join("receipts"))
        .args(["--commit", COMMIT, "--progress", "quiet"])
        .env("MEMRA_GPU_LOCK_DIR", f.path().join("gpu-leases"))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}");
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 2, "{stdout}");
    assert_eq!(lines[0], "pass 2");
    assert!(
        lines[1].starts_with("all as expected in ")
            && lines[1].ends_with(&format!("; receipts: {}", f.tree().display())),
        "{stdout}"
    );
}

#[test]
fn a_dirty_tree_names_the_paths_that_made_it_dirty() {
    if !have_git() {
        eprintln!("skipped: git is not available");
        return;
    }
    let repo = Repo::new();
    let manifest = [HEADER.to_string(), arm("a", "pass", "0.5", "x", "fast")].concat();
    repo.commit(
        &[("manifest.toml", &manifest), ("notes.txt", "one\n")],
        "one",
    );
    // Twelve paths: a changed tracked file and eleven new ones, two past the ten shown.
    std::fs::write(repo.path().join("notes.txt"), "two\n").unwrap();
    for i in 0..11 {
        std::fs::write(repo.path().join(format!("scratch-{i:02}.txt")), "").unwrap();
    }
    let sha = repo.git(&["rev-parse", "HEAD"]);
    let out = repo.run("manifest.toml");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    let head = format!("uncommitted changes, so the run is filed under {sha}-dirty:\n");
    assert!(stderr.contains(&head), "{stderr}");
    assert!(stderr.contains("\n  notes.txt\n"), "{stderr}");
    assert!(stderr.contains("\n  scratch-08.txt\n"), "{stderr}");
    assert!(
        !stderr.contains("scratch-09.txt"),
        "only ten are shown: {stderr}"
    );
    assert!(stderr.contains("\n  and 2 more\n"), "{stderr}");
    assert_eq!(stderr.matches("uncommitted changes").count(), 1, "{stderr}");
}

#[test]
fn a_run_started_while_gc_moves_a_run_aside_waits_for_it_instead_of_exiting_75() {
    // gc holds a manifest folder's lock only while it moves a run aside; a nightly started
    // by cron in that moment, without --wait-lock, waits for it and runs.
    let f = Fixture::new(
        "schema = 1\nname = \"nightly\"\n[[arm]]\nid = \"a\"\ngpus = 0\nrun = [\"{gates}/pass.sh\"]\n",
    );
    assert_eq!(f.run(&[]).status.code(), Some(0));
    let gc = memra_orch::receipt::tree::RunLock::acquire_as(&f.manifest_dir(), true).unwrap();
    let text = std::fs::read_to_string(f.manifest_dir().join(".lock")).unwrap();
    assert_eq!(text.trim(), format!("gc {}", std::process::id()));
    let mut run = f.command(&[]).stdout(Stdio::null()).spawn().unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    assert!(
        matches!(run.try_wait(), Ok(None)),
        "the run waits while gc holds the lock"
    );
    drop(gc);
    let out = run.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert_eq!(f.runs().len(), 2);
}
