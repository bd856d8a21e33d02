//! The attempt supervisor, between the orchestrator and one gate, so that nothing an attempt
//! starts outlives it, not even a `setsid` grandchild and not even when memra-orch itself is
//! killed with SIGKILL. It runs as `memra-supervise __memra-supervise <program> <args…>`, a
//! binary of its own built beside memra-orch: it links only this module, so the exec at
//! every attempt loads a small program instead of the whole orchestrator. Where it is not
//! beside memra-orch (the binary copied alone), memra-orch re-executes itself with the same
//! arguments instead ([`main_if_asked`]).
//!
//! The supervisor makes itself a child subreaper (`PR_SET_CHILD_SUBREAPER`), so every
//! descendant whose parent dies is re-parented to it rather than to init: whatever the gate
//! starts stays below the supervisor, whatever session or process group it moves to. It
//! starts the gate in a process group of its own with `PR_SET_PDEATHSIG(SIGKILL)`, tells
//! memra-orch the group's id, waits for the gate, then kills and reaps every descendant left
//! ([`sweep`]) and reports how the gate ended. Its stdin is a socket whose other end only
//! memra-orch holds: when memra-orch dies, however it dies, the kernel closes that end, the
//! supervisor reads end-of-file and sweeps at once. The supervisor keeps no time limit and
//! sends no SIGTERM: timeouts and cancellation stay the watchdog's ([`super::process`]),
//! which signals the gate's group; output capture is [`super::output`]'s.
//!
//! The protocol on the socket, one line each, supervisor to memra-orch: `pid <pgid>` once the
//! gate started (or `spawn-error <errno> <message>` if it could not be), then `exit <code>` or
//! `signal <n>` once the gate and everything it started are gone.

use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::io::{BufRead, BufReader, Read, Write};
use std::os::fd::FromRawFd;
use std::os::unix::net::UnixStream;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::gate::checks::ProcessEnd;

/// The hidden first argument that turns memra-orch into a supervisor.
pub const SUPERVISE_ARG: &str = "__memra-supervise";

/// Runs the supervisor when the command line asks for it (`None`: it does not, carry on as
/// memra-orch). Called before the command line is parsed, so a gate's arguments never meet
/// the CLI parser.
pub fn main_if_asked() -> Option<i32> {
    let mut args = std::env::args_os();
    if args.nth(1).as_deref() != Some(OsStr::new(SUPERVISE_ARG)) {
        return None;
    }
    Some(supervise(&args.collect::<Vec<_>>()))
}

/// The supervisor binary's name, built beside memra-orch.
pub const SUPERVISOR_BIN: &str = "memra-supervise";

/// The argument that makes `memra-supervise` print [`identity`] and exit.
pub const IDENTIFY_ARG: &str = "__memra-identify";

/// What this build's supervisor is: a digest of this file, the supervisor's whole code and
/// protocol. A `memra-supervise` that prints another one (left from an older build, or
/// from a build of other sources) is not used.
pub fn identity() -> String {
    // FNV-1a over the source: no dependency, and the same in both binaries of one build.
    let digest = include_bytes!("supervise.rs")
        .iter()
        .fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
            (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
        });
    format!(
        "{SUPERVISOR_BIN} {} {digest:016x}",
        env!("CARGO_PKG_VERSION")
    )
}

/// The `main` of `memra-supervise`: the supervisor, when its first argument is
/// [`SUPERVISE_ARG`]; its [`identity`] for [`IDENTIFY_ARG`]; else a usage error (exit 2).
pub fn main_standalone() -> i32 {
    if std::env::args_os().nth(1).as_deref() == Some(OsStr::new(IDENTIFY_ARG)) {
        println!("{}", identity());
        return 0;
    }
    main_if_asked().unwrap_or_else(|| {
        eprintln!(
            "{SUPERVISOR_BIN}: started by memra-orch only, as `{SUPERVISOR_BIN} {SUPERVISE_ARG} PROGRAM [ARG…]` with its socket as stdin"
        );
        2
    })
}

/// The program to run as a supervisor: `memra-supervise` beside the memra-orch binary when
/// it is there and of this build (it answers [`IDENTIFY_ARG`] with this build's
/// [`identity`]: a stale, foreign or unrunnable file is passed over), else memra-orch
/// itself. The memra-orch binary is this executable when it is memra-orch, else (a test or
/// bench binary of the workspace using the library) the `memra-orch` that cargo builds next
/// to it.
pub fn default_program() -> PathBuf {
    let orch = orchestrator_binary();
    match orch.parent().map(|d| d.join(SUPERVISOR_BIN)) {
        Some(s) if s.is_file() && same_build(&s) => s,
        _ => orch,
    }
}

/// Whether `program` prints this build's [`identity`] for [`IDENTIFY_ARG`].
fn same_build(program: &Path) -> bool {
    Command::new(program)
        .arg(IDENTIFY_ARG)
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .is_ok_and(|o| {
            o.status.success() && String::from_utf8_lossy(&o.stdout).trim_end() == identity()
        })
}

fn orchestrator_binary() -> PathBuf {
    let exe = std::env::current_exe().unwrap_or_else(|_| PathBuf::from("memra-orch"));
    if exe.file_stem() == Some(OsStr::new("memra-orch")) {
        return exe;
    }
    // Cargo puts test and bench binaries in `target/<profile>/deps/`, binaries one up.
    let sibling = exe
        .parent()
        .and_then(Path::parent)
        .map(|d| d.join("memra-orch"));
    match sibling {
        Some(s) if s.is_file() => s,
        _ => exe,
    }
}

/// Serialises sweeps: the main thread (the gate ended) and the lifeline thread (memra-orch
/// died, or the supervisor was told to stop) may both want one.
static SWEEP: Mutex<()> = Mutex::new(());

fn supervise(argv: &[OsString]) -> i32 {
    // SAFETY: PR_SET_CHILD_SUBREAPER takes an integer flag and touches no memory.
    unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) };
    // SAFETY: memra-orch passes one end of a socket pair as stdin (fd 0) and nothing else
    // owns fd 0 in this process; the gate gets /dev/null as its stdin instead.
    let link = unsafe { UnixStream::from_raw_fd(0) };
    let send = |line: &str| {
        let _ = (&link).write_all(format!("{line}\n").as_bytes());
    };
    let Some((program, args)) = argv.split_first() else {
        send(&format!("spawn-error {} no program to run", libc::EINVAL));
        return 0;
    };
    // A SIGTERM, SIGINT or SIGHUP sent to the supervisor itself (not through the gate's
    // group, which is how memra-orch stops a gate) means the same as memra-orch's death.
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [libc::SIGTERM, libc::SIGINT, libc::SIGHUP] {
        let _ = signal_hook::flag::register(sig, Arc::clone(&stop));
    }
    let me = std::process::id() as libc::pid_t;
    let mut cmd = Command::new(program);
    cmd.args(args).stdin(Stdio::null()).process_group(0);
    // SAFETY: the closure runs in the forked child before exec and calls only prctl and
    // getppid, which are async-signal-safe.
    unsafe {
        cmd.pre_exec(move || {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0);
            // The supervisor may have died between the fork and the prctl; the death
            // signal would then never come.
            if libc::getppid() != me {
                return Err(std::io::Error::from_raw_os_error(libc::ESRCH));
            }
            Ok(())
        });
    }
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            send(&format!(
                "spawn-error {} {e}",
                e.raw_os_error().unwrap_or(0)
            ));
            return 0;
        }
    };
    send(&format!("pid {}", child.id()));
    {
        let link = link.try_clone();
        let stop = Arc::clone(&stop);
        std::thread::spawn(move || {
            if let Ok(link) = link {
                wait_for_hangup(&link, &stop);
            }
            // The guard is held until the process exits, so the main thread, which may
            // have lost the gate's status to this sweep, never reports after it.
            let _guard = SWEEP.lock().unwrap_or_else(|p| p.into_inner());
            sweep(me);
            std::process::exit(0);
        });
    }
    let status = child.wait();
    sweep_all(me);
    // Without a status (the lifeline thread reaped the gate) there is nothing true to
    // report; memra-orch reads the missing report as a lost supervisor.
    if let Ok(s) = status {
        match (s.code(), s.signal()) {
            (Some(c), _) => send(&format!("exit {c}")),
            (None, Some(n)) => send(&format!("signal {n}")),
            (None, None) => {}
        }
    }
    0
}

/// Blocks until memra-orch's end of the socket closes or the supervisor is told to stop.
fn wait_for_hangup(link: &UnixStream, stop: &AtomicBool) {
    let _ = link.set_read_timeout(Some(Duration::from_millis(100)));
    let mut buf = [0u8; 64];
    loop {
        if stop.load(Ordering::SeqCst) {
            return;
        }
        match (&*link).read(&mut buf) {
            Ok(0) => return,
            Ok(_) => {}
            Err(e) if only_a_pause(&e) => {}
            Err(_) => return,
        }
    }
}

/// Whether a read on a socket with a read timeout only paused (nothing yet, or a signal).
fn only_a_pause(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::WouldBlock
            | std::io::ErrorKind::TimedOut
            | std::io::ErrorKind::Interrupted
    )
}

/// Makes this process (memra-orch running a manifest or a job) a child subreaper, so that
/// the processes of a supervisor that died (killed by someone else while memra-orch lives)
/// re-parent to it; [`reap_orphans`] kills them once the run is over. Call it only from
/// the memra-orch binary: a library user's process would collect strays it did not start.
pub fn adopt_orphans() {
    // SAFETY: PR_SET_CHILD_SUBREAPER takes an integer flag and touches no memory.
    unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) };
}

/// The supervisors memra-orch has started and not yet waited for.
static LIVE: Mutex<Vec<libc::pid_t>> = Mutex::new(Vec::new());

fn live() -> std::sync::MutexGuard<'static, Vec<libc::pid_t>> {
    LIVE.lock().unwrap_or_else(|p| p.into_inner())
}

/// Kills (with everything below them) and reaps the children of memra-orch that are not a
/// live supervisor: the processes of a supervisor that died, re-parented here since
/// memra-orch is a subreaper ([`adopt_orphans`]). Called as soon as a supervisor is found
/// lost, so a `setsid` worker of its gate does not outlive the attempt until the run ends.
pub fn sweep_strays() {
    let _guard = SWEEP.lock().unwrap_or_else(|p| p.into_inner());
    let me = std::process::id() as libc::pid_t;
    let keep = live().clone();
    for _ in 0..100 {
        let strays: Vec<libc::pid_t> = children_of(me)
            .into_iter()
            .filter(|c| !keep.contains(c))
            .collect();
        if strays.is_empty() {
            return;
        }
        for pid in strays {
            for d in descendants(pid) {
                // SAFETY: kill takes plain integers; `d` is below a stray of ours.
                unsafe { libc::kill(d, libc::SIGKILL) };
            }
            // SAFETY: as above; `pid` is a child of ours that no Child handle owns.
            unsafe { libc::kill(pid, libc::SIGKILL) };
            // SAFETY: reaps only this child of ours (its own status, not another's).
            unsafe { libc::waitpid(pid, std::ptr::null_mut(), libc::WNOHANG) };
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// The direct children of `parent`, from /proc.
fn children_of(parent: libc::pid_t) -> Vec<libc::pid_t> {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let pid = e.file_name().to_str()?.parse::<libc::pid_t>().ok()?;
            let stat = std::fs::read_to_string(e.path().join("stat")).ok()?;
            // A zombie child has no subtree but still needs reaping: it counts.
            (parent_of(&stat)? == parent).then_some(pid)
        })
        .collect()
}

/// Kills and reaps every process still below this one. Call it only once every attempt
/// has ended and every child memra-orch started itself was waited for: whatever is left
/// then is a stray of a dead supervisor.
pub fn reap_orphans() {
    sweep_all(std::process::id() as libc::pid_t);
}

fn sweep_all(me: libc::pid_t) {
    let _guard = SWEEP.lock().unwrap_or_else(|p| p.into_inner());
    sweep(me);
}

/// Kills every descendant of `root` (the calling process, a subreaper) with SIGKILL and
/// reaps them, until it has no child left. Since orphans re-parent to a subreaper, having
/// no child means having no descendant, so a process forked while the sweep runs is found
/// by a later pass.
///
/// What has ended is reaped first: when that leaves no child at all (the common case, a
/// gate that started nothing that outlived it), there is no descendant and /proc is not
/// read, which on a busy host is one file per process of every user.
pub fn sweep(root: libc::pid_t) {
    loop {
        loop {
            // SAFETY: waitpid with a null status pointer only reaps a child of ours.
            let r = unsafe { libc::waitpid(-1, std::ptr::null_mut(), libc::WNOHANG) };
            if r > 0 {
                continue;
            }
            if r == 0 {
                break;
            }
            if std::io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) {
                continue;
            }
            // ECHILD: no child, so nothing below.
            return;
        }
        for pid in descendants(root) {
            // SAFETY: kill takes plain integers; `pid` is a descendant of ours (> 1).
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// The processes below `root`, from /proc's parent links.
fn descendants(root: libc::pid_t) -> Vec<libc::pid_t> {
    let mut children: HashMap<libc::pid_t, Vec<libc::pid_t>> = HashMap::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<libc::pid_t>().ok())
        else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        if let Some(ppid) = parent_of(&stat) {
            children.entry(ppid).or_default().push(pid);
        }
    }
    let mut out = Vec::new();
    let mut stack = vec![root];
    while let Some(p) = stack.pop() {
        for &c in children.get(&p).into_iter().flatten() {
            if c > 1 && c != root {
                out.push(c);
                stack.push(c);
            }
        }
    }
    out
}

/// The parent pid field of a /proc/<pid>/stat line. The command name (second field) may
/// hold spaces and parentheses, so the fields are counted from its last `)`.
fn parent_of(stat: &str) -> Option<libc::pid_t> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace();
    fields.next()?;
    fields.next()?.parse().ok()
}

/// A supervisor as memra-orch sees it.
#[derive(Debug)]
pub struct Supervised {
    child: Child,
    link: BufReader<UnixStream>,
}

/// How a supervised gate failed to start or be followed.
#[derive(Debug)]
pub enum SuperviseError {
    /// The supervisor could not start the gate (the OS's error, as a direct spawn gives it).
    Spawn(std::io::Error),
    /// The supervisor ended without reporting (it was killed, or it is not memra-orch).
    Lost(String),
}

impl Supervised {
    /// Starts `supervisor` for a gate; `cmd` is a command whose program is the supervisor
    /// binary, with the gate's argv, environment, cwd, stdout and stderr already set; its
    /// stdin becomes the lifeline socket.
    pub fn spawn(mut cmd: Command) -> std::io::Result<Supervised> {
        let (ours, theirs) = UnixStream::pair()?;
        cmd.stdin(Stdio::from(std::os::fd::OwnedFd::from(theirs)))
            .process_group(0);
        // Spawned and registered under the sweep lock, so a stray sweep on another thread
        // never takes a supervisor that is starting for one of ours.
        let child = {
            let _guard = SWEEP.lock().unwrap_or_else(|p| p.into_inner());
            let _spawning = crate::machine::lease::SPAWN_GUARD
                .read()
                .unwrap_or_else(|p| p.into_inner());
            let child = cmd.spawn()?;
            live().push(child.id() as libc::pid_t);
            child
        };
        // Drop the command now: it holds the pipe ends given to the child, and the readers
        // see end-of-file only once every copy is closed.
        drop(cmd);
        Ok(Supervised {
            child,
            link: BufReader::new(ours),
        })
    }

    /// The supervisor's pid.
    pub fn id(&self) -> u32 {
        self.child.id()
    }

    /// One line, waiting at most `limit` (looking at `cancelled` every 200 ms); on the limit
    /// or a cancel the supervisor is killed, so what follows reads end-of-file.
    fn line_within(&mut self, limit: Duration, cancelled: impl Fn() -> bool) -> Option<String> {
        let started = std::time::Instant::now();
        let _ = self
            .link
            .get_ref()
            .set_read_timeout(Some(Duration::from_millis(200)));
        let mut line = String::new();
        let got = loop {
            match self.link.read_line(&mut line) {
                Ok(n) if n > 0 && line.ends_with('\n') => break Some(line.trim_end().to_string()),
                Ok(0) => break (!line.is_empty()).then(|| line.trim_end().to_string()),
                Ok(_) => {}
                Err(e) if only_a_pause(&e) => {}
                Err(_) => break None,
            }
            if started.elapsed() >= limit || cancelled() {
                // SAFETY: kill takes plain integers; the supervisor is our child, not reaped.
                unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGKILL) };
                break None;
            }
        };
        let _ = self.link.get_ref().set_read_timeout(None);
        got
    }

    fn line(&mut self) -> Option<String> {
        let mut line = String::new();
        match self.link.read_line(&mut line) {
            Ok(n) if n > 0 => Some(line.trim_end().to_string()),
            _ => None,
        }
    }

    /// Waits for the gate to start; returns its process group. A supervisor that says
    /// nothing within `limit`, or before `cancelled()` turns true, is killed and reported
    /// lost: a gate can stop its supervisor before the supervisor names the gate's group,
    /// when no watchdog watches it yet.
    pub fn started(
        &mut self,
        limit: Duration,
        cancelled: impl Fn() -> bool,
    ) -> Result<i32, SuperviseError> {
        let line = self.line_within(limit, cancelled).unwrap_or_default();
        if let Some(pid) = line.strip_prefix("pid ").and_then(|p| p.parse().ok()) {
            return Ok(pid);
        }
        if let Some(rest) = line.strip_prefix("spawn-error ") {
            let (errno, message) = rest.split_once(' ').unwrap_or((rest, ""));
            let error = match errno.parse::<i32>() {
                Ok(n) if n != 0 => std::io::Error::from_raw_os_error(n),
                _ => std::io::Error::other(message.to_string()),
            };
            let _ = self.reap();
            return Err(SuperviseError::Spawn(error));
        }
        Err(self.lost(&line))
    }

    /// Waits until the gate and everything it started are gone; how the gate ended.
    pub fn wait(mut self) -> Result<ProcessEnd, SuperviseError> {
        let line = self.line().unwrap_or_default();
        let end = if let Some(c) = line.strip_prefix("exit ").and_then(|c| c.parse().ok()) {
            Some(ProcessEnd::Exited(c))
        } else {
            line.strip_prefix("signal ")
                .and_then(|s| s.parse().ok())
                .map(ProcessEnd::Signaled)
        };
        match end {
            Some(end) => {
                let _ = self.reap();
                Ok(end)
            }
            None => Err(self.lost(&line)),
        }
    }

    /// Waits for the supervisor and forgets it as a live one.
    fn reap(&mut self) -> std::io::Result<std::process::ExitStatus> {
        let status = self.child.wait();
        let pid = self.child.id() as libc::pid_t;
        live().retain(|p| *p != pid);
        status
    }

    fn lost(&mut self, line: &str) -> SuperviseError {
        let status = self.reap();
        let how = match status {
            Ok(s) => s.to_string(),
            Err(e) => format!("cannot be waited for: {e}"),
        };
        SuperviseError::Lost(if line.is_empty() {
            format!(
                "the attempt's supervisor (pid {}) ended without a report ({how})",
                self.child.id()
            )
        } else {
            format!(
                "the attempt's supervisor (pid {}) said {line:?} ({how})",
                self.child.id()
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::parent_of;

    #[test]
    fn the_parent_is_read_after_the_last_parenthesis() {
        assert_eq!(parent_of("12 (sh) S 7 12 12 0"), Some(7));
        assert_eq!(parent_of("12 (a) b) (c) R 99 1 1"), Some(99));
        assert_eq!(parent_of("garbage"), None);
    }
}
