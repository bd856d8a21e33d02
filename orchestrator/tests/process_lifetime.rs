//! Arms die with their run: a SIGKILL of memra-orch takes every process of the run down,
//! `setsid` children included; a `setsid` child does not outlive its attempt; SIGHUP (a
//! closed terminal) ends the run `cancelled`; and a process that escaped a killed run cannot
//! put files into the attempts of the resumed run.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::run_support::{Fixture, alive, eventually, proc_stat};

/// The `--grace` of these runs, and how long the processes of a killed run may live on.
const GRACE: Duration = Duration::from_secs(5);

/// How long a gate may take to start on a loaded machine.
const START: Duration = Duration::from_secs(90);

fn read_pid(path: &Path) -> i32 {
    std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .trim()
        .parse()
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn signal(pid: i32, sig: i32) {
    // SAFETY: kill takes plain integers; the pids are of processes this test started.
    assert_eq!(unsafe { kill(pid, sig) }, 0, "kill({pid}, {sig})");
}

unsafe extern "C" {
    fn kill(pid: i32, sig: i32) -> i32;
}

const SIGHUP: i32 = 1;
const SIGKILL: i32 = 9;
const SIGSTOP: i32 = 19;

fn escape_fixture(mode: &str) -> Fixture {
    Fixture::new(&format!(
        r#"
schema = 1
name = "escape"

[[arm]]
id = "escape"
run = ["{{gates}}/escape.sh", "${{root}}", "{mode}"]
gpus = 0
"#
    ))
    .with_grace("5s")
}

#[test]
fn sigkill_of_memra_orch_takes_every_process_of_the_run_down() {
    let f = escape_fixture("hang");
    let mut run = spawn_killable(&f);
    let setsid_pid = f.path().join("setsid.pid");
    assert!(
        eventually(START, || setsid_pid.exists()),
        "the gate never started its setsid child"
    );
    let pids = [
        ("gate", read_pid(&f.path().join("gate.pid"))),
        ("supervisor", read_pid(&f.path().join("parent.pid"))),
        ("setsid child", read_pid(&setsid_pid)),
    ];
    for (what, pid) in pids {
        assert!(alive(pid), "the {what} {pid} is not running");
    }
    signal(run.pid(), SIGKILL);
    run.wait();
    for (what, pid) in pids {
        assert!(
            eventually(GRACE, || !alive(pid)),
            "the {what} {pid} outlived the SIGKILLed run by more than the grace: {}",
            proc_stat(pid)
        );
    }
}

#[test]
fn the_processes_of_a_killed_supervisor_die_with_the_run() {
    let f = escape_fixture("hang");
    let mut run = f.spawn(&[]);
    let setsid_pid = f.path().join("setsid.pid");
    assert!(
        eventually(START, || setsid_pid.exists()),
        "the gate never started its setsid child"
    );
    let child = read_pid(&setsid_pid);
    signal(read_pid(&f.path().join("parent.pid")), SIGKILL);
    assert_eq!(run.wait().code(), Some(1));
    let receipt = f.receipt("escape");
    assert_eq!(receipt["verdict"], "error", "{receipt:#}");
    assert!(
        receipt["reason"]
            .as_str()
            .unwrap()
            .contains("supervisor (pid"),
        "{receipt:#}"
    );
    assert!(
        eventually(GRACE, || !alive(child)),
        "the setsid child {child} of a killed supervisor outlived the run: {}",
        proc_stat(child)
    );
}

#[test]
fn a_setsid_child_does_not_outlive_its_attempt() {
    let f = escape_fixture("exit");
    assert_eq!(f.run(&[]).status.code(), Some(0));
    let pid = read_pid(&f.path().join("setsid.pid"));
    assert!(
        eventually(GRACE, || !alive(pid)),
        "the gate's setsid child {pid} survived its attempt: {}",
        proc_stat(pid)
    );
}

#[test]
fn sighup_ends_the_run_cancelled() {
    let f = Fixture::new(
        r#"
schema = 1
name = "hangup"

[[arm]]
id = "slow"
run = ["{gates}/wait-for.sh", "${root}/go"]
gpus = 0
"#,
    )
    // The gate must die of the cancel's SIGTERM, not of a SIGKILL after a short grace.
    .with_grace("10m");
    let mut run = f.spawn_hangup_default(&[]);
    assert!(
        eventually(START, || f.current_tree().is_some_and(|t| t
            .join("nodes")
            .read_dir()
            .is_ok_and(|d| d
                .flatten()
                .any(|e| e.path().join("attempt-1").exists())))),
        "slow never started"
    );
    signal(run.pid(), SIGHUP);
    assert_eq!(run.wait().code(), Some(130));
    let summary = f.run_json();
    assert_eq!(summary["interrupted"], true, "{summary:#}");
    let slow = f.receipt("slow");
    assert_eq!(slow["verdict"], "cancelled", "{slow:#}");
    assert_eq!(slow["attempts"][0]["signal"], 15, "{slow:#}");
}

#[test]
fn under_nohup_sighup_does_not_end_the_run() {
    let f = Fixture::new(
        r#"
schema = 1
name = "nohup"

[[arm]]
id = "slow"
run = ["{gates}/wait-for.sh", "${root}/go"]
gpus = 0
"#,
    );
    // `nohup` ignores SIGHUP and execs; an ignored signal stays ignored across exec.
    let mut cmd = f.command(&[]);
    let program = cmd.get_program().to_owned();
    let args: Vec<_> = cmd.get_args().map(|a| a.to_owned()).collect();
    cmd = Command::new("nohup");
    cmd.arg(program)
        .args(args)
        .current_dir(f.path())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let mut run = cmd.spawn().unwrap();
    let pid = run.id() as i32;
    let started = || {
        f.current_tree().is_some_and(|t| {
            t.join("nodes")
                .read_dir()
                .is_ok_and(|d| d.flatten().any(|e| e.path().join("attempt-1").exists()))
        })
    };
    assert!(eventually(START, started), "slow never started");
    signal(pid, SIGHUP);
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        run.try_wait().unwrap().is_none(),
        "a run under nohup ended on SIGHUP"
    );
    std::fs::write(f.path().join("go"), "").unwrap();
    assert_eq!(run.wait().unwrap().code(), Some(0));
    assert_eq!(f.verdict("slow"), "pass");
}

#[test]
fn a_resumed_run_does_not_list_what_a_leftover_of_the_killed_run_wrote() {
    let f = Fixture::new(
        r#"
schema = 1
name = "leftover"

[[arm]]
id = "arm"
run = ["{gates}/leftover.sh", "${root}"]
gpus = 0
"#,
    );
    let mut run = spawn_killable(&f);
    let writer_pid = f.path().join("writer.pid");
    assert!(
        eventually(START, || writer_pid.exists()),
        "the gate never started its writer"
    );
    let writer = read_pid(&writer_pid);
    let supervisor = read_pid(&f.path().join("parent.pid"));
    // What no supervisor survives (the OOM killer, a kill of every process of the user):
    // the supervisor and memra-orch both die before either can act. memra-orch is
    // stopped first, so it cannot reap the strays the supervisor's death hands it; the
    // supervisor is not stopped, since a stopped process in a group orphaned by
    // memra-orch's death would be sent SIGHUP and SIGCONT, and sweep.
    signal(run.pid(), SIGSTOP);
    assert!(
        eventually(START, || stopped(run.pid())),
        "memra-orch did not stop: {}",
        proc_stat(run.pid())
    );
    signal(supervisor, SIGKILL);
    signal(run.pid(), SIGKILL);
    run.wait();
    let _stop_writer = KillOnDrop(writer);
    assert!(alive(writer), "the writer did not outlive the killed run");
    let stale = |dir: &Path| dir.join("artifacts/stale.txt");
    let node_dir = f.tree().join("nodes");
    assert!(
        eventually(START, || std::fs::read_dir(&node_dir).is_ok_and(|d| d
            .flatten()
            .any(|e| stale(&e.path().join("attempt-1")).exists()))),
        "the writer never wrote into its attempt folder"
    );

    std::fs::write(f.path().join("go"), "").unwrap();
    let out = f.run(&["--resume"]);
    assert_eq!(out.status.code(), Some(0));
    assert!(
        alive(writer),
        "the writer died before the resumed run ended"
    );
    let receipt = f.receipt("arm");
    assert_eq!(receipt["verdict"], "pass", "{receipt:#}");
    let names: Vec<&str> = receipt["artifacts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["fresh.txt"], "{receipt:#}");
    assert!(
        !crate::run_support::is_file_in_tree(&stale(&f.attempt_dir("arm", 1))),
        "the leftover writer reached the resumed run's attempt folder"
    );
}

/// A run this test will SIGKILL, which leaves its temporary folders behind: they go in
/// the fixture's folder, removed with it, not in the machine's.
fn spawn_killable(f: &Fixture) -> Run {
    let tmp = f.path().join("tmp");
    std::fs::create_dir_all(&tmp).unwrap();
    Run(f.command(&[]).env("TMPDIR", tmp).spawn().unwrap())
}

/// A background run, killed if the test ends before it does.
struct Run(std::process::Child);

impl Run {
    fn pid(&self) -> i32 {
        self.0.id() as i32
    }

    fn wait(&mut self) -> std::process::ExitStatus {
        self.0.wait().unwrap()
    }
}

impl Drop for Run {
    fn drop(&mut self) {
        if matches!(self.0.try_wait(), Ok(None)) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// Whether every thread of a process is stopped (state `T`).
fn stopped(pid: i32) -> bool {
    std::fs::read_dir(format!("/proc/{pid}/task")).is_ok_and(|tasks| {
        tasks.flatten().all(|t| {
            std::fs::read_to_string(t.path().join("stat")).is_ok_and(|stat| {
                stat.rsplit(')')
                    .next()
                    .unwrap_or("")
                    .trim_start()
                    .starts_with('T')
            })
        })
    })
}

/// Kills a process that escaped a run when the test ends, whatever its outcome.
struct KillOnDrop(i32);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        // SAFETY: kill takes plain integers; the pid is the writer this test started.
        unsafe { kill(self.0, SIGKILL) };
    }
}
