//! Machine-wide GPU leases through the real binary: two runs of two manifests that share
//! one lock folder never hold the same fake GPU at once, the one that waits says for whom
//! (and is cancelled by SIGTERM as usual), a SIGKILLed holder frees its GPUs at once, and
//! `memra-orch gpus` shows who holds what.

use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use crate::run_support::{Fixture, epoch, eventually};

/// A manifest with one GPU cell that sleeps `seconds` and then passes.
fn manifest(name: &str, cell: &str, gpus: u32, seconds: u32) -> String {
    format!(
        r#"
schema = 1
name = "{name}"

[[arm]]
id = "{cell}"
run = "sleep {seconds} && {{gates}}/pass.sh"
shell = true
gpus = {gpus}
"#
    )
}

/// `memra-orch run` of a fixture on `gpus`, with its leases in `leases` (shared between the
/// runs of a test), output captured.
fn command(f: &Fixture, gpus: &str, leases: &Path) -> Command {
    let mut cmd = f.command(&["--gpus", gpus]);
    cmd.env("MEMRA_GPU_LOCK_DIR", leases)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    cmd
}

/// A background run, killed when the test ends before it does.
struct Background(Option<Child>);

impl Background {
    fn start(mut cmd: Command) -> Background {
        Background(Some(cmd.spawn().unwrap()))
    }

    fn child(&mut self) -> &mut Child {
        self.0.as_mut().expect("the run is still in the guard")
    }

    /// Waits for the run to end and returns its output.
    fn finish(mut self) -> Output {
        let out = self.0.take().unwrap().wait_with_output().unwrap();
        eprintln!(
            "--- memra-orch stdout\n{}\n--- stderr\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        out
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        if let Some(c) = &mut self.0
            && matches!(c.try_wait(), Ok(None))
        {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// The wall-clock interval of a cell's first attempt, from its receipt.
fn interval(f: &Fixture, id: &str) -> (f64, f64) {
    let a = &f.receipt(id)["attempts"][0];
    let start = epoch(a["start"].as_str().unwrap());
    (start, start + a["seconds"].as_f64().unwrap())
}

/// Whether two intervals share more than the rounding of the receipts' timestamps (ms).
fn overlap(a: (f64, f64), b: (f64, f64)) -> bool {
    const SLACK: f64 = 0.05;
    a.0 + SLACK < b.1 && b.0 + SLACK < a.1
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn two_runs_on_one_gpu_take_turns_and_the_waiting_one_says_for_whom() {
    let leases = tempfile::tempdir().unwrap();
    let a = Fixture::new(&manifest("lease-a", "cell-a", 1, 2));
    let b = Fixture::new(&manifest("lease-b", "cell-b", 1, 2));
    let mut ra = Background::start(command(&a, "fake:1", leases.path()));
    let mut rb = Background::start(command(&b, "fake:1", leases.path()));
    let (pa, pb) = (ra.child().id(), rb.child().id());
    let (oa, ob) = (ra.finish(), rb.finish());
    assert_eq!(oa.status.code(), Some(0), "{}", stderr(&oa));
    assert_eq!(ob.status.code(), Some(0), "{}", stderr(&ob));
    let (ia, ib) = (interval(&a, "cell-a"), interval(&b, "cell-b"));
    assert!(
        !overlap(ia, ib),
        "both runs had GPU 0 at once: {ia:?} {ib:?}"
    );
    // The second to start waited for the first, naming it.
    let (waiter, out, holder_pid, holder, cell, id) = if ia.0 < ib.0 {
        (&b, &ob, pa, "lease-a", "cell-a", "cell-b")
    } else {
        (&a, &oa, pb, "lease-b", "cell-b", "cell-a")
    };
    let line = format!(
        "waiting for gpu 0: held by memra-orch pid {holder_pid}, manifest {holder} (cell {cell}); wanted by {id}"
    );
    let err = stderr(out);
    assert_eq!(
        err.lines().filter(|l| *l == line).count(),
        1,
        "the wait is said once:\n{err}"
    );
    let waited = waiter.receipt(id)["lease_wait_seconds"].as_f64();
    assert!(
        waited.is_some_and(|w| w > 0.5),
        "the receipt records the wait: {waited:?}"
    );
    let other = if id == "cell-b" {
        (&a, "cell-a")
    } else {
        (&b, "cell-b")
    };
    assert!(
        other.0.receipt(other.1).get("lease_wait_seconds").is_none(),
        "a cell that did not wait records no wait"
    );
}

#[test]
fn a_sigkilled_holder_frees_its_gpu_at_once() {
    let leases = tempfile::tempdir().unwrap();
    let holder = Fixture::new(
        r#"
schema = 1
name = "lease-killed"

[[arm]]
id = "hold"
run = "echo $$ > ${root}/arm.pid; exec sleep 60"
shell = true
gpus = 1
"#,
    );
    let mut run = Background::start(command(&holder, "fake:2", leases.path()));
    let pid = run.child().id();
    let lock = leases.path().join("GPU-fake-0.lock");
    let arm_pid = holder.path().join("arm.pid");
    assert!(
        eventually(Duration::from_secs(30), || {
            arm_pid.exists()
                && std::fs::read_to_string(&lock)
                    .is_ok_and(|t| t.contains(&format!("\"pid\":{pid},")))
        }),
        "the run never took GPU 0"
    );

    // `gpus` shows who holds GPU 0 and that GPU 1 is free.
    let out = Command::new(env!("CARGO_BIN_EXE_memra-orch"))
        .args(["gpus", "--gpus", "fake:2"])
        .env("MEMRA_GPU_LOCK_DIR", leases.path())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains(&format!(
            "  gpu 0: leased by memra-orch pid {pid}, manifest lease-killed (cell hold) since "
        )) && text.contains("  gpu 1: free\n"),
        "{text}"
    );

    // A run waiting for the GPU is cancelled by SIGTERM as any run is.
    let waiter = Fixture::new(&manifest("lease-waiter", "waits", 1, 0));
    let log = waiter.path().join("stderr.txt");
    let mut cmd = command(&waiter, "fake:1", leases.path());
    cmd.stderr(std::fs::File::create(&log).unwrap());
    let mut w = Background::start(cmd);
    let said = format!("waiting for gpu 0: held by memra-orch pid {pid},");
    let read = || std::fs::read_to_string(&log).unwrap_or_default();
    assert!(
        eventually(Duration::from_secs(30), || read().contains(&said)),
        "{}",
        read()
    );
    // SAFETY: kill(2) on the pid of a child this test started and has not reaped.
    unsafe { libc::kill(w.child().id() as i32, libc::SIGTERM) };
    let out = w.finish();
    assert_eq!(out.status.code(), Some(130), "{}", read());
    assert_eq!(waiter.verdict("waits"), "cancelled");

    run.child().kill().unwrap();
    run.child().wait().unwrap();
    let killed = Instant::now();
    let next = Fixture::new(&manifest("lease-next", "next", 1, 0));
    let out = command(&next, "fake:1", leases.path()).output().unwrap();
    // The killed run's arm lives on (arms dying with their run is not this test's
    // business); it must not hold the lease, which its run took with a close-on-exec fd.
    if let Ok(p) = std::fs::read_to_string(&arm_pid)
        && let Ok(p) = p.trim().parse::<i32>()
    {
        // SAFETY: kill(2) with a pid this test's arm wrote; no memory is involved.
        unsafe { libc::kill(p, libc::SIGKILL) };
    }
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(
        !stderr(&out).contains("waiting for gpu"),
        "{}",
        stderr(&out)
    );
    assert!(
        killed.elapsed() < Duration::from_secs(20),
        "the next run took {:?}",
        killed.elapsed()
    );
    assert!(next.receipt("next").get("lease_wait_seconds").is_none());
}

#[test]
fn a_two_gpu_cell_and_a_one_gpu_cell_of_two_runs_never_share_a_gpu() {
    let leases = tempfile::tempdir().unwrap();
    let pair = Fixture::new(&manifest("lease-pair", "pair", 2, 2));
    let single = Fixture::new(&manifest("lease-single", "single", 1, 2));
    let rp = Background::start(command(&pair, "fake:2", leases.path()));
    let rs = Background::start(command(&single, "fake:2", leases.path()));
    let (op, os) = (rp.finish(), rs.finish());
    assert_eq!(op.status.code(), Some(0), "{}", stderr(&op));
    assert_eq!(os.status.code(), Some(0), "{}", stderr(&os));
    let (ip, is) = (interval(&pair, "pair"), interval(&single, "single"));
    assert!(
        !overlap(ip, is),
        "the pair and the single cell shared a GPU: {ip:?} {is:?}"
    );
    let waits = stderr(&op).contains("waiting for gpu") as u32
        + stderr(&os).contains("waiting for gpu") as u32;
    assert_eq!(waits, 1, "exactly one of the runs waited");
}

/// Makes `cmd` run as root without the capabilities that let root past file permissions,
/// so that it meets another user's files as any user does (CI runs as root).
fn without_root_file_powers(cmd: &mut Command) {
    use std::os::unix::process::CommandExt;
    // SAFETY: prctl only, between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            // CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH, CAP_FOWNER (linux/capability.h).
            for cap in [1, 2, 3] {
                if libc::prctl(libc::PR_CAPBSET_DROP, cap, 0, 0, 0) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
}

#[test]
fn another_users_private_lock_file_leaves_the_gpu_leased_by_name_and_runs_still_take_turns() {
    // SAFETY: geteuid cannot fail.
    assert_eq!(
        unsafe { libc::geteuid() },
        0,
        "this test makes a file of another uid: run the suite as root, as CI does"
    );
    let leases = tempfile::tempdir().unwrap();
    let lock = leases.path().join("GPU-fake-0.lock");
    std::fs::write(&lock, "").unwrap();
    std::os::unix::fs::chown(&lock, Some(65534), Some(65534)).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&lock, std::fs::Permissions::from_mode(0o600)).unwrap();
    let a = Fixture::new(&manifest("lease-a", "cell-a", 1, 2));
    let b = Fixture::new(&manifest("lease-b", "cell-b", 1, 2));
    let (mut ca, mut cb) = (
        command(&a, "fake:1", leases.path()),
        command(&b, "fake:1", leases.path()),
    );
    without_root_file_powers(&mut ca);
    without_root_file_powers(&mut cb);
    let (ra, rb) = (Background::start(ca), Background::start(cb));
    let (oa, ob) = (ra.finish(), rb.finish());
    for o in [&oa, &ob] {
        assert_eq!(o.status.code(), Some(0), "{}", stderr(o));
        let err = stderr(o);
        assert!(
            err.contains("GPU-fake-0.lock cannot be used (Permission denied")
                && err.contains("held by its name in the kernel only"),
            "{err}"
        );
    }
    let (ia, ib) = (interval(&a, "cell-a"), interval(&b, "cell-b"));
    assert!(
        !overlap(ia, ib),
        "both runs had GPU 0 at once: {ia:?} {ib:?}"
    );
    let meta = std::fs::metadata(&lock).unwrap();
    assert_eq!(
        (meta.permissions().mode() & 0o777, meta.len()),
        (0o600, 0),
        "the other user's file is left as it was"
    );
}

#[test]
fn a_cell_waits_no_longer_than_lease_timeout_and_says_it_still_waits_meanwhile() {
    let leases = tempfile::tempdir().unwrap();
    let holder = Fixture::new(&manifest("holder", "hog", 1, 8));
    let waiter = Fixture::new(&format!(
        "lease_timeout = \"2s\"\n{}\n[[arm]]\nid = \"cpu\"\ngpus = 0\nrun = [\"{{gates}}/pass.sh\"]\n",
        manifest("waiter", "wants-gpu", 1, 0)
    ));
    let mut rh = Background::start(command(&holder, "fake:1", leases.path()));
    let pid = rh.child().id();
    let d = LockDirProbe(leases.path());
    assert!(
        eventually(Duration::from_secs(30), || d.held()),
        "the holder never took GPU 0"
    );
    let mut cmd = command(&waiter, "fake:1", leases.path());
    cmd.env("MEMRA_ORCH_HEARTBEAT", "500ms");
    let t = Instant::now();
    let out = cmd.output().unwrap();
    let err = stderr(&out);
    assert!(
        t.elapsed() < Duration::from_secs(7),
        "{:?}\n{err}",
        t.elapsed()
    );
    assert_eq!(out.status.code(), Some(1), "{err}");
    let receipt = waiter.receipt("wants-gpu");
    assert_eq!(receipt["verdict"], "error", "{receipt}");
    let reason = receipt["reason"].as_str().unwrap();
    assert!(
        reason.contains(&format!(
            "for gpu 0, held by memra-orch pid {pid}, manifest holder"
        )) && reason.contains("longer than lease_timeout = \"2s\""),
        "{reason}"
    );
    assert!(receipt["lease_wait_seconds"].as_f64().unwrap() >= 2.0);
    assert_eq!(waiter.receipt("cpu")["verdict"], "pass");
    // Said when it began, and again while it went on.
    assert_eq!(
        err.matches("waiting for gpu 0: held by").count(),
        1,
        "{err}"
    );
    assert!(
        err.contains(&format!(
            "still waiting for gpu 0 after 1s: held by memra-orch pid {pid}, manifest holder (cell hog); wanted by wants-gpu"
        )),
        "{err}"
    );
    assert_eq!(rh.finish().status.code(), Some(0));
}

/// Whether a lease folder's fake GPU 0 is held, by trying its lock file.
struct LockDirProbe<'a>(&'a Path);

impl LockDirProbe<'_> {
    fn held(&self) -> bool {
        std::fs::File::open(self.0.join("GPU-fake-0.lock"))
            .is_ok_and(|f| matches!(f.try_lock_shared(), Err(std::fs::TryLockError::WouldBlock)))
    }
}
