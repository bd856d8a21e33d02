//! Stopping local process groups: the watchdog that stops a gate's group (timeout,
//! cancellation) with SIGTERM, a grace period, then SIGKILL, and the signals that cancel a
//! run ([`cancel_signals`]).
//!
//! The attempt's thread blocks waiting for its supervisor, so a finished process is
//! noticed at once; only the stopping is done by the watchdog's single thread, which sleeps
//! until the next deadline. Spawning is [`super::supervise`]'s and [`super::local`]'s; what
//! a gate leaves outside its group is the supervisor's to kill. It knows nothing of gates,
//! verdicts or receipts.

use std::collections::HashMap;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::gate::checks::Stopped;

/// Stops process groups when their time is up or the run is cancelled.
#[derive(Debug)]
pub struct Watchdog {
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    state: Mutex<State>,
    wake: Condvar,
}

#[derive(Debug, Default)]
struct State {
    next_token: u64,
    entries: HashMap<u64, Entry>,
    cancelled: bool,
    shutdown: bool,
    grace: Duration,
}

#[derive(Debug)]
struct Entry {
    pgid: i32,
    /// The attempt's supervisor, killed [`SUPERVISOR_WAIT`] after the group's SIGKILL if
    /// the watch is still on then: a supervisor that does not report by that time was
    /// stopped or hung by what it supervises, and memra-orch must not wait for it forever.
    supervisor: Option<i32>,
    deadline: Option<Instant>,
    term_sent: Option<Instant>,
    kill_sent: Option<Instant>,
    supervisor_killed: bool,
    stopped: Stopped,
}

/// How long after the group's SIGKILL a supervisor still watched is killed too.
pub const SUPERVISOR_WAIT: Duration = Duration::from_secs(2);

/// A watched process group; hand it back with [`Watchdog::unwatch`].
#[derive(Debug)]
pub struct Watch(u64);

impl Watchdog {
    /// Starts the watchdog thread. `grace` is the time between SIGTERM and SIGKILL.
    pub fn new(grace: Duration) -> Watchdog {
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                grace,
                ..State::default()
            }),
            wake: Condvar::new(),
        });
        let thread_shared = Arc::clone(&shared);
        std::thread::Builder::new()
            .name("memra-orch-watchdog".into())
            .spawn(move || watch_loop(&thread_shared))
            .expect("the OS refused to start the watchdog thread");
        Watchdog { shared }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A poisoned lock means a panic elsewhere; the data (pids and deadlines) is still
        // valid, and stopping processes matters more than propagating the panic.
        self.shared.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Watches the process group `pgid` with a time limit. If the run is already
    /// cancelled, the group is stopped at once.
    pub fn watch(&self, pgid: i32, timeout: Duration) -> Watch {
        self.watch_supervised(pgid, None, timeout)
    }

    /// [`Watchdog::watch`] for a group started by the supervisor `supervisor`, which is
    /// killed as well if it has not reported [`SUPERVISOR_WAIT`] after the group's SIGKILL.
    pub fn watch_supervised(&self, pgid: i32, supervisor: Option<i32>, timeout: Duration) -> Watch {
        let mut st = self.lock();
        let token = st.next_token;
        st.next_token += 1;
        st.entries.insert(
            token,
            Entry {
                pgid,
                supervisor,
                deadline: Instant::now().checked_add(timeout),
                term_sent: None,
                kill_sent: None,
                supervisor_killed: false,
                stopped: Stopped::No,
            },
        );
        drop(st);
        self.shared.wake.notify_one();
        Watch(token)
    }

    /// Stops watching a group whose leader has exited; says whether the watchdog had stopped
    /// it. What the gate left behind is not the watchdog's: the attempt's supervisor has
    /// killed all of it by then ([`super::supervise`]), and signalling the group again could
    /// reach a new group that reused its id.
    pub fn unwatch(&self, watch: Watch) -> Stopped {
        self.lock()
            .entries
            .remove(&watch.0)
            .map_or(Stopped::No, |e| e.stopped)
    }

    /// Cancels the run: every watched group is stopped, and so is any group watched later.
    /// A second call (a second Ctrl-C) drops the grace period: groups still alive get
    /// SIGKILL at once.
    pub fn cancel_all(&self) {
        let mut st = self.lock();
        if st.cancelled {
            st.grace = Duration::ZERO;
        }
        st.cancelled = true;
        drop(st);
        self.shared.wake.notify_one();
    }

    pub fn is_cancelled(&self) -> bool {
        self.lock().cancelled
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.lock().shutdown = true;
        self.shared.wake.notify_one();
    }
}

fn watch_loop(shared: &Shared) {
    let mut st = shared.state.lock().unwrap_or_else(|p| p.into_inner());
    loop {
        if st.shutdown {
            return;
        }
        let now = Instant::now();
        let grace = st.grace;
        let cancelled = st.cancelled;
        let mut next: Option<Instant> = None;
        for e in st.entries.values_mut() {
            if e.term_sent.is_none() {
                let due = e.deadline.is_some_and(|d| now >= d);
                if cancelled || due {
                    e.stopped = if cancelled {
                        Stopped::Cancelled
                    } else {
                        Stopped::Timeout
                    };
                    signal_group(e.pgid, libc::SIGTERM);
                    e.term_sent = Some(now);
                } else if let Some(d) = e.deadline {
                    next = Some(next.map_or(d, |n| n.min(d)));
                }
            }
            if let Some(t) = e.term_sent
                && e.kill_sent.is_none()
            {
                let kill_at = t + grace;
                if now >= kill_at {
                    signal_group(e.pgid, libc::SIGKILL);
                    e.kill_sent = Some(now);
                } else {
                    next = Some(next.map_or(kill_at, |n| n.min(kill_at)));
                }
            }
            if let (Some(k), Some(pid), false) = (e.kill_sent, e.supervisor, e.supervisor_killed) {
                let at = k + SUPERVISOR_WAIT;
                if now >= at {
                    // SAFETY: kill takes plain integers; the supervisor is our own child and
                    // is not reaped while it is watched (its owner unwatches it first).
                    unsafe { libc::kill(pid, libc::SIGKILL) };
                    e.supervisor_killed = true;
                } else {
                    next = Some(next.map_or(at, |n| n.min(at)));
                }
            }
        }
        st = match next {
            Some(at) => {
                let wait = at.saturating_duration_since(Instant::now());
                shared
                    .wake
                    .wait_timeout(st, wait)
                    .unwrap_or_else(|p| p.into_inner())
                    .0
            }
            None => shared.wake.wait(st).unwrap_or_else(|p| p.into_inner()),
        };
    }
}

/// The signals that cancel a run: SIGINT (Ctrl-C), SIGTERM, and SIGHUP (what closing the
/// terminal sends), unless SIGHUP is ignored already, as `nohup` leaves it: a run started
/// under nohup is meant to outlive its terminal.
pub fn cancel_signals() -> Vec<i32> {
    let mut signals = vec![libc::SIGINT, libc::SIGTERM];
    // SAFETY: sigaction with a null new action only reads the current one into `old`, a
    // zeroed sigaction that lives across the call.
    let hangup_ignored = unsafe {
        let mut old: libc::sigaction = std::mem::zeroed();
        libc::sigaction(libc::SIGHUP, std::ptr::null(), &mut old) == 0
            && old.sa_sigaction == libc::SIG_IGN
    };
    if !hangup_ignored {
        signals.push(libc::SIGHUP);
    }
    signals
}

/// Sends a signal to every process of a group. A group that no longer exists is fine.
pub fn signal_group(pgid: i32, signal: i32) {
    if pgid <= 1 {
        return;
    }
    // SAFETY: kill with a negative pid signals the process group `pgid`, which we created
    // for one attempt (process_group(0) makes the child its leader); pgid > 1 rules out
    // signalling our own group or every process.
    unsafe {
        libc::kill(-pgid, signal);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{BufRead, BufReader};
    use std::os::unix::process::{CommandExt, ExitStatusExt};
    use std::process::{Child, Command, Stdio};

    /// Seconds the test processes sleep: longer than any wait of a test, so a process that
    /// ended was stopped, not done.
    const SLEEP: &str = "120";

    /// How long stopping a group may take on a loaded machine: far more than delivering a
    /// signal needs, and less than `SLEEP`, so a group that ended by itself fails the test.
    const PROMPT: Duration = Duration::from_secs(60);

    fn spawn_sleep() -> Child {
        Command::new("sleep")
            .arg(SLEEP)
            .process_group(0)
            .spawn()
            .unwrap()
    }

    /// A shell that ignores SIGTERM, as do the sleeps it starts (an ignored signal stays
    /// ignored across exec). Returns once the shell says its trap is in place, so no
    /// SIGTERM can arrive before it.
    fn spawn_term_ignoring() -> Child {
        let mut child = Command::new("sh")
            .args([
                "-c",
                &format!("trap '' TERM; echo ready; sleep {SLEEP} & wait; sleep {SLEEP}"),
            ])
            .stdout(Stdio::piped())
            .process_group(0)
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert_eq!(line.trim(), "ready", "the shell did not start");
        child
    }

    #[test]
    fn timeout_stops_the_group() {
        // A grace far longer than the test, so only the SIGTERM of the timeout can end it.
        let dog = Watchdog::new(Duration::from_secs(600));
        let mut child = spawn_sleep();
        let w = dog.watch(child.id() as i32, Duration::from_millis(100));
        let t = Instant::now();
        let status = child.wait().unwrap();
        assert!(t.elapsed() < PROMPT, "took {:?}", t.elapsed());
        assert_eq!(status.signal(), Some(libc::SIGTERM), "{status:?}");
        assert_eq!(dog.unwatch(w), Stopped::Timeout);
    }

    #[test]
    fn cancel_stops_running_and_later_groups() {
        let dog = Watchdog::new(Duration::from_secs(5));
        let mut a = spawn_sleep();
        let wa = dog.watch(a.id() as i32, Duration::from_secs(600));
        dog.cancel_all();
        a.wait().unwrap();
        assert_eq!(dog.unwatch(wa), Stopped::Cancelled);
        let mut b = spawn_sleep();
        let wb = dog.watch(b.id() as i32, Duration::from_secs(600));
        b.wait().unwrap();
        assert_eq!(dog.unwatch(wb), Stopped::Cancelled);
    }

    /// Whether the watchdog has sent SIGTERM to every group it watches.
    fn term_sent(dog: &Watchdog) -> bool {
        dog.lock().entries.values().all(|e| e.term_sent.is_some())
    }

    #[test]
    fn a_second_cancel_kills_without_waiting_for_the_grace() {
        let dog = Watchdog::new(Duration::from_secs(600));
        let mut child = spawn_term_ignoring();
        let w = dog.watch(child.id() as i32, Duration::from_secs(600));
        dog.cancel_all();
        let deadline = Instant::now() + PROMPT;
        while !term_sent(&dog) {
            assert!(
                Instant::now() < deadline,
                "the first cancel sent no SIGTERM"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        // Time for the SIGTERM to take effect, were it not ignored.
        std::thread::sleep(Duration::from_millis(200));
        assert!(
            child.try_wait().unwrap().is_none(),
            "SIGTERM is ignored, the grace is long"
        );
        let t = Instant::now();
        dog.cancel_all();
        let status = child.wait().unwrap();
        assert!(t.elapsed() < PROMPT, "took {:?}", t.elapsed());
        assert_eq!(status.signal(), Some(libc::SIGKILL), "{status:?}");
        assert_eq!(dog.unwatch(w), Stopped::Cancelled);
    }

    #[test]
    fn sigkill_after_grace_when_sigterm_is_ignored() {
        let dog = Watchdog::new(Duration::from_millis(200));
        let mut child = spawn_term_ignoring();
        let w = dog.watch(child.id() as i32, Duration::from_millis(100));
        let t = Instant::now();
        let status = child.wait().unwrap();
        assert!(t.elapsed() < PROMPT, "took {:?}", t.elapsed());
        assert_eq!(status.signal(), Some(libc::SIGKILL), "{status:?}");
        assert_eq!(dog.unwatch(w), Stopped::Timeout);
    }
}
