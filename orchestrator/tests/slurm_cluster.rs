//! `memra-orch run --executor slurm` against a real single-node Slurm cluster with 4 GPU
//! slots (`../shared/tools/slurm-single-node start 4`, which these tests call once). Slurm
//! binds fake `/dev/nvidia*` devices and exports CUDA_VISIBLE_DEVICES as on a GPU node.
//!
//! The script needs root; elsewhere (or without the script) every test here skips, saying
//! why. The tests share one cluster of 4 GPUs, so they run one at a time.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use crate::run_support::{COMMIT, Fixture, Running, epoch, files_under};
use serde_json::Value;

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/tools/slurm-single-node")
}

/// Held while a test uses the cluster. The lock is a file lock, so test runs of other
/// checkouts or target folders on this machine (which share the one cluster) wait too.
struct ClusterGuard {
    _file: std::fs::File,
}

/// Starts the cluster once per test binary and serialises the tests; `None` (after printing
/// why) when this machine cannot run one.
fn cluster() -> Option<ClusterGuard> {
    static STARTED: OnceLock<Result<(), String>> = OnceLock::new();
    let started = STARTED.get_or_init(|| {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return Err("not root; the single-node Slurm script needs root".into());
        }
        if !script().is_file() {
            return Err(format!("{} does not exist", script().display()));
        }
        let _start = lock();
        let mut start = Command::new(script());
        start.args(["start", "4"]);
        // The script leaves daemons running (munged, slurmctld, slurmd). They must not
        // inherit this process's descriptors beyond stdio: one may be a lock the caller
        // holds around the whole test run (a build lock taken with flock(1)), which a
        // daemon would then hold for as long as it lives.
        // Marked close-on-exec rather than closed, so the pipe the standard library uses to
        // report a failed exec keeps working.
        // SAFETY: close_range is async-signal-safe and changes only the child's descriptor
        // flags, after fork and before exec.
        unsafe {
            std::os::unix::process::CommandExt::pre_exec(&mut start, || {
                libc::close_range(3, u32::MAX, libc::CLOSE_RANGE_CLOEXEC as libc::c_int);
                Ok(())
            });
        }
        let out = start.output().expect("the Slurm script can be started");
        assert!(
            out.status.success(),
            "{} start 4 failed:\n{}\n{}",
            script().display(),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(())
    });
    match started {
        Ok(()) => {
            let guard = lock();
            settle();
            Some(guard)
        }
        Err(why) => {
            eprintln!("skipping the Slurm test: {why}");
            None
        }
    }
}

fn lock() -> ClusterGuard {
    use std::os::fd::AsRawFd;
    let path = std::env::temp_dir().join("memra-orch-slurm-tests.lock");
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    // SAFETY: the descriptor is open for the duration of the call; flock blocks until the
    // lock is ours and it is released when the file is closed.
    let r = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) };
    assert_eq!(r, 0, "flock {}", path.display());
    ClusterGuard { _file: file }
}

/// A manifest name no other run on the cluster uses, so `squeue -n` finds this run's jobs.
/// Every name starts `slurm-`, which `settle` relies on.
fn unique(name: &str) -> String {
    format!("{name}-{}", std::process::id())
}

/// Leaves the cluster as a test expects it, whatever an earlier test (of this or another
/// checkout's run, killed or failed) left: the node up and no jobs of these tests. The lock
/// is held, so any such job is a leftover; left running it would hold GPUs and keep this
/// test's jobs pending.
fn settle() {
    let leftovers: Vec<String> = jobs_where(|name| name.starts_with("memra:slurm-"))
        .into_iter()
        .map(|(id, _)| id)
        .collect();
    if !leftovers.is_empty() {
        eprintln!("cancelling jobs earlier tests left: {leftovers:?}");
        let _ = Command::new("scancel").args(&leftovers).status();
    }
    let state = node_state();
    if !state.starts_with("idle") && !state.starts_with("mix") {
        let _ = Command::new("scontrol")
            .args([
                "update",
                &format!("nodename={}", hostname()),
                "state=resume",
            ])
            .output();
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    while (!jobs_where(|name| name.starts_with("memra:slurm-")).is_empty()
        || !node_state().starts_with("idle"))
        && Instant::now() < deadline
    {
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(
        node_state().starts_with("idle"),
        "the test cluster's node is not idle after 60 s:\n{}",
        cluster_state()
    );
}

/// The node's state as `sinfo` names it (`idle`, `mixed`, `allocated`, `down*`…).
fn node_state() -> String {
    let out = Command::new("sinfo")
        .args(["-h", "-o", "%T"])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// `(id, state)` of every job Slurm lists whose name passes `keep`.
fn jobs_where(keep: impl Fn(&str) -> bool) -> Vec<(String, String)> {
    let out = Command::new("squeue")
        .args(["-h", "-o", "%i %j %T"])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let (id, name, state) = (f.next()?, f.next()?, f.next()?);
            keep(name).then(|| (id.to_string(), state.to_string()))
        })
        .collect()
}

/// What the cluster looks like, for failure messages: the queue and the node.
fn cluster_state() -> String {
    let text = |cmd: &str, args: &[&str]| {
        Command::new(cmd).args(args).output().map_or_else(
            |e| format!("{cmd}: {e}"),
            |o| String::from_utf8_lossy(&o.stdout).into_owned(),
        )
    };
    format!(
        "squeue:\n{}sinfo:\n{}",
        text("squeue", &["-o", "%i %j %T %R"]),
        text("sinfo", &["-o", "%N %T %G %E"])
    )
}

/// A `memra-orch` run in the background. If the test ends early (an assertion failed), the
/// run is killed and its jobs cancelled, so they do not hold the cluster's GPUs while the
/// next test waits for them.
struct Background {
    run: Running,
    name: String,
}

impl Background {
    fn spawn(f: &Fixture, args: &[&str]) -> Background {
        Background {
            run: f.spawn(args),
            name: f.name.clone(),
        }
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        self.run.stop();
        let left: Vec<String> = live_jobs(&self.name)
            .into_iter()
            .map(|(id, _)| id)
            .collect();
        if !left.is_empty() {
            let _ = Command::new("scancel").args(&left).status();
        }
    }
}

fn slurm(f: &Fixture) -> std::process::Output {
    f.run(&["--executor", "slurm"])
}

/// `(id, state)` of the jobs of a run that Slurm still lists (pending, running, completing).
fn live_jobs(manifest: &str) -> Vec<(String, String)> {
    let prefix = format!("memra:{manifest}:");
    jobs_where(|name| name.starts_with(&prefix))
}

/// How many of a run's jobs Slurm lists in `state`.
fn count_in(manifest: &str, state: &str) -> usize {
    live_jobs(manifest)
        .iter()
        .filter(|(_, s)| s == state)
        .count()
}

/// The Slurm spool of a fixture's run: job files, exec-node's receipts, the job journal.
fn spool(f: &Fixture) -> PathBuf {
    f.path().join("receipts/.slurm").join(COMMIT).join(&f.name)
}

fn devices(f: &Fixture, id: &str) -> String {
    crate::run_support::read_text(&f.attempt_dir(id, 1).join("artifacts/devices.txt"))
        .unwrap()
        .trim()
        .to_string()
}

fn span(r: &Value) -> (f64, f64) {
    let a = &r["attempts"][0];
    let start = epoch(a["start"].as_str().unwrap());
    (start, start + a["seconds"].as_f64().unwrap())
}

#[test]
fn gpu_arms_share_the_cluster_on_distinct_devices_in_dag_order() {
    let Some(_cluster) = cluster() else { return };
    let name = unique("slurm-gpus");
    let f = Fixture::new(&format!(
        r#"
schema = 1
name = "{name}"

[[arm]]
id = "one"
matrix = {{ i = ["1", "2", "3", "4"] }}
run = ["{{gates}}/devices.sh", "3"]
gpus = 1

[[arm]]
id = "two"
needs = ["one"]
run = ["{{gates}}/devices.sh"]
gpus = 2
"#
    ));
    let out = slurm(&f);
    assert_eq!(out.status.code(), Some(0));
    let ones: Vec<String> = (1..=4).map(|i| format!("one[i={i}]")).collect();
    let mut seen = BTreeSet::new();
    for id in &ones {
        let r = f.receipt(id);
        assert_eq!(r["verdict"], "pass", "{r:#}");
        let d = devices(&f, id);
        assert_eq!(r["env"]["CUDA_VISIBLE_DEVICES"], d.as_str());
        assert_eq!(r["gpus"].as_array().unwrap().len(), 1, "{r:#}");
        assert!(
            d.parse::<u32>().is_ok_and(|n| n < 4),
            "{id} saw {d:?}, not one of Slurm's 4 GPUs"
        );
        seen.insert(d);
    }
    assert_eq!(seen.len(), 4, "the four arms shared a device: {seen:?}");
    // All four held their GPU at the same time: each started before any ended.
    let spans: Vec<(f64, f64)> = ones.iter().map(|id| span(&f.receipt(id))).collect();
    let last_start = spans.iter().map(|s| s.0).fold(f64::MIN, f64::max);
    let first_end = spans.iter().map(|s| s.1).fold(f64::MAX, f64::min);
    assert!(
        last_start < first_end,
        "the arms did not run concurrently: {spans:?}"
    );
    let two = f.receipt("two");
    let d = devices(&f, "two");
    assert_eq!(d.split(',').count(), 2, "two saw {d:?}");
    assert_eq!(two["gpus"].as_array().unwrap().len(), 2);
    let last_end = spans.iter().map(|s| s.1).fold(f64::MIN, f64::max);
    assert!(
        span(&two).0 >= last_end,
        "two started before all of `one` ended"
    );
    assert!(live_jobs(&name).is_empty());
}

/// Relative paths of every file of a receipt tree, with the node folders' hash suffixes
/// kept (slugs are derived from cell ids alone, so they match across runs).
fn shape(tree: &Path) -> BTreeSet<String> {
    files_under(tree)
        .into_iter()
        .map(|p| p.strip_prefix(tree).unwrap().to_string_lossy().into_owned())
        .filter(|p| p != ".lock")
        .collect()
}

/// Every key path of a JSON value (`attempts.0.start`), values left out.
fn keys(v: &Value, prefix: &str, out: &mut BTreeSet<String>) {
    match v {
        Value::Object(m) => {
            for (k, x) in m {
                let p = format!("{prefix}.{k}");
                out.insert(p.clone());
                keys(x, &p, out);
            }
        }
        Value::Array(a) => {
            for (i, x) in a.iter().enumerate() {
                keys(x, &format!("{prefix}.{i}"), out);
            }
        }
        _ => {}
    }
}

#[test]
fn local_and_slurm_runs_agree_on_verdicts_and_tree_shape() {
    let Some(_cluster) = cluster() else { return };
    let manifest = r#"
schema = 1
name = "{name}"

[[setup]]
id = "broken-build"
run = ["{gates}/fail.sh"]

[[arm]]
id = "needs-build"
needs = ["broken-build"]
run = ["{gates}/pass.sh"]
gpus = 1

[[arm]]
id = "green"
matrix = { b = ["1", "2"] }
run = ["{gates}/pass.sh"]
gpus = 1

[[arm]]
id = "red"
run = ["{gates}/fail.sh"]
gpus = 1

[[arm]]
id = "canary"
run = ["{gates}/fail.sh"]
expect = "fail"

[[arm]]
id = "after-red"
needs = ["red"]
run = ["{gates}/pass.sh"]

[[arm]]
id = "hang"
run = ["{gates}/wait-for.sh", "/nonexistent/never"]
gpus = 1
timeout = "2s"

[[arm]]
id = "reference"
run = ["{gates}/logits.sh", "same"]
gpus = 1

[[arm]]
id = "twin"
run = ["{gates}/logits.sh", "same"]
gpus = 1

[[arm]]
id = "drifted"
run = ["{gates}/logits.sh", "other"]
gpus = 1

# Compares run on the submit host and read both sides from the shared tree.
[[compare]]
id = "bits"
reference = "reference"
candidates = ["twin", "drifted"]
artifact = "logits.safetensors"
"#;
    let name = unique("slurm-same");
    let text = manifest.replace("{name}", &name);
    let local = Fixture::new(&text);
    let on_slurm = Fixture::new(&text);
    let lo = local.run(&["--gpus", "fake:4"]);
    let t = Instant::now();
    let so = slurm(&on_slurm);
    assert_eq!(lo.status.code(), Some(1));
    assert_eq!(so.status.code(), lo.status.code());
    // The timeout is enforced inside the job, by the same runner as locally.
    assert!(t.elapsed() < Duration::from_secs(60), "{:?}", t.elapsed());
    let hang = on_slurm.receipt("hang");
    assert_eq!(hang["verdict"], "timeout");
    assert_eq!(hang["reason"], "timed out after 2s");
    assert_eq!(
        on_slurm.receipt("needs-build")["reason"],
        "needs broken-build, which ended fail"
    );
    assert_eq!(on_slurm.verdict("after-red"), "blocked");
    assert_eq!(on_slurm.verdict("bits[candidate=twin]"), "pass");
    assert_eq!(on_slurm.verdict("bits[candidate=drifted]"), "fail");

    let verdicts = |f: &Fixture| -> BTreeMap<String, String> {
        f.run_json()["nodes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|n| {
                (
                    n["id"].as_str().unwrap().to_string(),
                    n["verdict"].as_str().unwrap().to_string(),
                )
            })
            .collect()
    };
    assert_eq!(verdicts(&on_slurm), verdicts(&local));
    assert_eq!(verdicts(&local)["canary"], "pass");
    assert_eq!(shape(&on_slurm.tree()), shape(&local.tree()));
    for node in local.run_json()["nodes"].as_array().unwrap() {
        let id = node["id"].as_str().unwrap();
        let (mut a, mut b) = (BTreeSet::new(), BTreeSet::new());
        keys(&local.receipt(id), "", &mut a);
        let slurm_receipt = on_slurm.receipt(id);
        keys(&slurm_receipt, "", &mut b);
        // A Slurm receipt names the jobs that ran its cell (compare cells run on the submit
        // host and name none); that key is the one a local receipt lacks.
        if slurm_receipt["kind"] != "compare" && slurm_receipt["verdict"] != "blocked" {
            let jobs = slurm_receipt["slurm_jobs"].as_array();
            assert!(
                jobs.is_some_and(|j| !j.is_empty()
                    && j.iter().all(|x| x
                        .as_str()
                        .unwrap()
                        .split(' ')
                        .next()
                        .unwrap()
                        .parse::<u64>()
                        .is_ok())),
                "{id}: no job ids in {slurm_receipt}"
            );
        }
        assert!(a.iter().all(|k| !k.starts_with(".slurm_jobs")));
        b.retain(|k| !k.starts_with(".slurm_jobs"));
        // A local attempt on a GPU reads its health (a Slurm node's GPUs are not this
        // host's, so a Slurm attempt has none): the one key a Slurm receipt lacks.
        assert!(b.iter().all(|k| !k.contains(".gpu_health")));
        a.retain(|k| !k.contains(".gpu_health"));
        // The environment differs by what the caller's machine put on the inherit list
        // only in values; checks, attempts and artifacts must have the same structure.
        assert!(
            a == b,
            "{id}: the receipts differ in shape; only local: {:?}; only Slurm: {:?}\n\
             local receipt: {}\nSlurm receipt: {slurm_receipt}",
            a.difference(&b).collect::<Vec<_>>(),
            b.difference(&a).collect::<Vec<_>>(),
            local.receipt(id),
        );
    }
    let (mut a, mut b) = (BTreeSet::new(), BTreeSet::new());
    keys(&local.run_json(), "", &mut a);
    keys(&on_slurm.run_json(), "", &mut b);
    let strip = |s: &BTreeSet<String>| -> BTreeSet<String> {
        s.iter()
            .filter(|k| !k.starts_with(".inventory."))
            .cloned()
            .collect()
    };
    assert_eq!(strip(&a), strip(&b), "run.json differs in shape");
    // `memra-orch diff` of the two trees finds nothing but timing: the same verdicts, the
    // same artifact bits, the same doors and nodes. Slurm adds scheduling time to every
    // node, so durations are left out.
    let diff = Command::new(env!("CARGO_BIN_EXE_memra-orch"))
        .arg("diff")
        .arg(local.tree())
        .arg(on_slurm.tree())
        .args(["--format", "json", "--duration-abs", "1h"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&diff.stdout);
    assert_eq!(
        diff.status.code(),
        Some(0),
        "{text}\n{}",
        String::from_utf8_lossy(&diff.stderr)
    );
    let d: Value = serde_json::from_str(&text).unwrap();
    for list in [
        "regressions",
        "fixes",
        "other_verdict_changes",
        "bits_moved",
        "metric_drift",
        "doors_changed",
        "new_nodes",
        "removed_nodes",
    ] {
        assert_eq!(d[list], serde_json::json!([]), "{list}: {text}");
    }
    // Both runs fail the same nodes.
    assert_eq!(d["still_failing"].as_array().unwrap().len(), 6, "{text}");
    // The job files live next to the tree, not in it.
    assert!(spool(&on_slurm).is_dir());
}

#[test]
fn ctrl_c_cancels_every_submitted_job() {
    let Some(_cluster) = cluster() else { return };
    let name = unique("slurm-cancel");
    let f = Fixture::new(&format!(
        r#"
schema = 1
name = "{name}"

[[arm]]
id = "long"
matrix = {{ i = ["1", "2", "3", "4", "5"] }}
run = ["{{gates}}/hang.sh"]
gpus = 1
timeout = "5m"

[[arm]]
id = "cpu"
run = ["{{gates}}/hang.sh"]
timeout = "5m"

[[arm]]
id = "later"
needs = ["long"]
run = ["{{gates}}/pass.sh"]
"#
    ));
    // Five GPU slots for Slurm's four GPUs: one job waits in Slurm's queue, so the
    // interrupt meets both a pending and running jobs.
    let mut run = Background::spawn(&f, &["--executor", "slurm", "--gpus", "fake:5"]);
    let deadline = Instant::now() + Duration::from_secs(90);
    // Wait until the four GPU jobs run and hold their gates (each wrote its grandchild's
    // pid), the fifth waits for a GPU, and the CPU job has been submitted. Slurm may start
    // the CPU job at once or keep it behind the waiting GPU job (reason `Priority`) until
    // its backfill pass: either way the interrupt meets running and pending jobs.
    let pids = |f: &Fixture| -> Vec<PathBuf> {
        f.current_tree()
            .map(|t| files_under(&t.join("nodes")))
            .unwrap_or_default()
            .into_iter()
            .filter(|p| p.ends_with("artifacts/grandchild.pid"))
            .collect()
    };
    let ready = |f: &Fixture| {
        let running = count_in(&name, "RUNNING");
        f.current_tree().is_some_and(|t| t.join("nodes").is_dir())
            && running >= 4
            && pids(f).len() == running
            && running + count_in(&name, "PENDING") == 6
    };
    while !ready(&f) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(
        ready(&f),
        "after 90 s, {} gates run, not the four GPU jobs (and maybe the CPU job) with the \
         rest pending:\n{}",
        pids(&f).len(),
        cluster_state()
    );
    // SAFETY: kill has no memory-safety preconditions.
    unsafe { libc::kill(run.run.pid(), libc::SIGINT) };
    let t = Instant::now();
    let status = run.run.wait();
    assert_eq!(status.code(), Some(130));
    assert!(t.elapsed() < Duration::from_secs(45), "{:?}", t.elapsed());
    let deadline = Instant::now() + Duration::from_secs(30);
    while !live_jobs(&name).is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(
        live_jobs(&name).is_empty(),
        "jobs left 30 s after the interrupt:\n{}",
        cluster_state()
    );
    let mut never_ran = 0;
    for i in 1..=5 {
        let r = f.receipt(&format!("long[i={i}]"));
        assert_eq!(r["verdict"], "cancelled", "{r:#}");
        match r["attempts"].as_array().unwrap().first() {
            // The gate was stopped by exec-node, not killed by Slurm behind its back.
            Some(a) => assert_eq!(a["signal"], 15, "{r:#}"),
            None => {
                never_ran += 1;
                let why = r["reason"].as_str().unwrap();
                assert!(why.contains("CANCELLED"), "{why}");
            }
        }
    }
    assert_eq!(never_ran, 1, "exactly one job was still pending");
    assert_eq!(f.verdict("cpu"), "cancelled");
    assert_eq!(f.verdict("later"), "cancelled");
}

/// Resumes the node when the test ends, so a failed assertion does not leave it down.
struct NodeBack(String);

impl Drop for NodeBack {
    fn drop(&mut self) {
        let _ = Command::new("scontrol")
            .args(["update", &format!("nodename={}", self.0), "state=resume"])
            .output();
    }
}

fn hostname() -> String {
    let out = Command::new("hostname").output().unwrap();
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

#[test]
fn a_job_lost_to_a_node_failure_is_resubmitted_within_retries() {
    let Some(_cluster) = cluster() else { return };
    let name = unique("slurm-lost");
    let f = Fixture::new(&format!(
        r#"
schema = 1
name = "{name}"

[[arm]]
id = "retried"
run = ["{{gates}}/wait-for.sh", "${{root}}/go", "5"]
gpus = 1
retries = 1

[[arm]]
id = "not-retried"
run = ["{{gates}}/wait-for.sh", "${{root}}/go", "5"]
gpus = 1
"#
    ));
    // Both gates hold their GPU until `go` exists, which the test writes only after Slurm
    // has ended both jobs: however slow the machine, no job ends before the node fails.
    // Signalled, a gate lingers 5 s; exec-node stops it after the 1 s grace, so a lost job
    // writes its receipt a second after the run has judged it lost.
    let mut run = Background::spawn(&f, &["--executor", "slurm"]);
    let host = hostname();
    let _node = NodeBack(host.clone());
    let deadline = Instant::now() + Duration::from_secs(90);
    while count_in(&name, "RUNNING") < 2 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(
        count_in(&name, "RUNNING"),
        2,
        "both jobs run:\n{}",
        cluster_state()
    );
    // The node goes down under the running jobs: Slurm ends them NODE_FAIL.
    let down = Command::new("scontrol")
        .args([
            "update",
            &format!("nodename={host}"),
            "state=down",
            "reason=memra-orch-test",
        ])
        .status()
        .unwrap();
    assert!(down.success());
    let journal = spool(&f).join("jobs.jsonl");
    let lost = || {
        std::fs::read_to_string(&journal)
            .unwrap_or_default()
            .matches("NODE_FAIL")
            .count()
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    while lost() < 2 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(
        lost(),
        2,
        "the run saw both jobs fail:\n{}",
        cluster_state()
    );
    // Bring the node back (ReturnToService may already have; then this reports an error)
    // and let the resubmitted job pass.
    let _ = Command::new("scontrol")
        .args(["update", &format!("nodename={host}"), "state=resume"])
        .output();
    std::fs::write(f.path().join("go"), "").unwrap();
    let status = run.run.wait();
    assert_eq!(status.code(), Some(1));
    let r = f.receipt("retried");
    assert_eq!(r["verdict"], "pass", "{r:#}");
    assert!(r["reason"].as_str().unwrap().contains("NODE_FAIL"), "{r:#}");
    // The receipt names both submissions: the lost job, then the one that ran the cell.
    let jobs: Vec<&str> = r["slurm_jobs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|j| j.as_str().unwrap())
        .collect();
    assert_eq!(jobs.len(), 2, "{r:#}");
    assert!(jobs[0].ends_with(" NODE_FAIL"), "{jobs:?}");
    assert!(jobs[1].ends_with(" COMPLETED"), "{jobs:?}");
    let r = f.receipt("not-retried");
    assert_eq!(r["verdict"], "error", "{r:#}");
    let why = r["reason"].as_str().unwrap();
    assert!(
        why.contains("the cluster lost the job") && why.contains("NODE_FAIL"),
        "{why}"
    );
    // The journal next to the tree names every job and how it ended.
    let journal = std::fs::read_to_string(&journal).unwrap();
    let mut ends: Vec<(String, u64, String)> = journal
        .lines()
        .map(|l| {
            let v: Value = serde_json::from_str(l).unwrap();
            assert!(v["job"].as_str().unwrap().parse::<u64>().is_ok(), "{l}");
            (
                v["cell"].as_str().unwrap().to_string(),
                v["try"].as_u64().unwrap(),
                v["state"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    ends.sort();
    assert_eq!(
        ends,
        [
            ("not-retried".to_string(), 1, "NODE_FAIL".to_string()),
            ("retried".to_string(), 1, "NODE_FAIL".to_string()),
            ("retried".to_string(), 2, "COMPLETED".to_string()),
        ]
    );
    // Slurm ended the lost jobs by signalling them, and their exec-node, stopping, may write
    // a receipt after the run judged the job. It lands in the job's own file next to the job
    // file, never over the cell's receipt: wait for those late writes (at most 30 s), then
    // read the cells' receipts again.
    let late: Vec<PathBuf> = ["retried", "not-retried"]
        .iter()
        .map(|id| {
            let slug = f.receipt(id)["slug"].as_str().unwrap().to_string();
            spool(&f).join(format!("{slug}.1.receipt.json"))
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(30);
    while !late.iter().all(|p| p.exists()) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(f.verdict("retried"), "pass");
    assert_eq!(f.verdict("not-retried"), "error");
}

#[test]
fn jobs_ask_slurm_for_the_cells_cpus_memory_and_time() {
    let Some(_cluster) = cluster() else { return };
    let name = unique("slurm-resources");
    let f = Fixture::new(&format!(
        r#"
schema = 1
name = "{name}"

[[arm]]
id = "sized"
run = ["{{gates}}/pass.sh"]
gpus = 1
cpus = 2
memory = "100M"
timeout = "3m"
"#
    ));
    let out = slurm(&f);
    assert_eq!(out.status.code(), Some(0));
    // The plain log names the job; Slurm keeps an ended job for MinJobAge (300 s).
    let log = String::from_utf8_lossy(&out.stderr);
    let id = log
        .lines()
        .find_map(|l| {
            l.strip_prefix("slurm    sized job ")?
                .strip_suffix(" submitted")
        })
        .unwrap_or_else(|| panic!("no submission line in {log}"))
        .to_string();
    let show = Command::new("scontrol")
        .args(["show", "job", "-o", &id])
        .output()
        .unwrap();
    let show = String::from_utf8_lossy(&show.stdout);
    let field = |name: &str| {
        show.split_whitespace()
            .find_map(|f| f.strip_prefix(&format!("{name}=")))
            .unwrap_or_else(|| panic!("no {name} in {show}"))
            .to_string()
    };
    assert_eq!(field("JobName"), format!("memra:{name}:sized"));
    assert_eq!(field("NumCPUs"), "2");
    assert_eq!(field("MinMemoryNode"), "100M");
    // One attempt of 3 min, the 1 s grace the fixture passes and a minute of slack: 4 min
    // 1 s, 5 minutes rounded up.
    assert_eq!(field("TimeLimit"), "00:05:00");
    assert!(show.contains("gpu:1"), "{show}");
    assert_eq!(field("JobState"), "COMPLETED");
}

#[test]
fn slurm_options_without_the_slurm_executor_are_refused() {
    let f = Fixture::new(
        r#"
schema = 1
name = "local-only"

[[arm]]
id = "a"
run = ["{gates}/pass.sh"]
"#,
    );
    let out = f.run(&["--partition", "gpu"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--partition") && err.contains("--executor slurm"),
        "{err}"
    );
}

#[test]
fn resume_keeps_finished_receipts_and_the_job_journal() {
    let Some(_cluster) = cluster() else { return };
    let name = unique("slurm-resume");
    let f = Fixture::new(&format!(
        r#"
schema = 1
name = "{name}"

[[arm]]
id = "green"
run = ["{{gates}}/pass.sh"]
gpus = 1

[[arm]]
id = "red"
run = ["{{gates}}/fail.sh"]
"#
    ));
    let journal = spool(&f).join("jobs.jsonl");
    assert_eq!(slurm(&f).status.code(), Some(1));
    let first = std::fs::read_to_string(&journal).unwrap();
    assert_eq!(first.lines().count(), 2, "{first}");
    let again = f.run(&["--executor", "slurm", "--resume"]);
    assert_eq!(again.status.code(), Some(1));
    let log = String::from_utf8_lossy(&again.stderr);
    assert!(!log.contains(" submitted"), "{log}");
    assert_eq!(log.matches("[carried from 20").count(), 2, "{log}");
    assert_eq!(std::fs::read_to_string(&journal).unwrap(), first);
}
