//! `[notify]`: when a run ends, its morning summary ([`crate::report::morning`]) goes to a
//! command of the manifest's choosing (a chat webhook script, `mail`, a pager) — the text (or
//! markdown) on stdin, the JSON in `MEMRA_SUMMARY_JSON` — when the night matches `on`.
//!
//! The command is the user's own, not a gate: it runs in memra-orch's whole environment
//! (a webhook's token is there), from the manifest's root, in a process group of its own
//! that is stopped at `timeout`. What it prints goes to `notify.log` in the run's folder,
//! redacted like everything else the run writes (the manifest's secrets and the values of
//! secret-named variables), capped at its tail. A summary that cannot be built is no reason
//! to stay silent: the command then gets a FAIL message saying why.
//!
//! Notifying never changes the run's exit code (the gates decide it); a command that fails,
//! hangs or cannot start is said on stderr and in `notify.log`.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::plan::{Notify, NotifyOn};
use crate::report::morning::{self, Since};

/// The environment variable holding the summary's JSON.
pub const JSON_ENV: &str = "MEMRA_SUMMARY_JSON";
/// The environment variable naming the file that holds the summary's JSON whole.
pub const JSON_FILE_ENV: &str = "MEMRA_SUMMARY_JSON_FILE";
/// `pass` or `fail`.
pub const VERDICT_ENV: &str = "MEMRA_SUMMARY_VERDICT";
/// The run's folder.
pub const RUN_DIR_ENV: &str = "MEMRA_RUN_DIR";

/// The largest JSON put into [`JSON_ENV`] whole (Linux refuses one variable over 128 KiB):
/// past it the variable holds the JSON with every list cut to [`LIST_CUT`] entries and
/// `"lists_cut": true`; the file always holds it whole.
const JSON_ENV_MAX: usize = 96 * 1024;
const LIST_CUT: usize = 20;
/// How much of the command's output `notify.log` keeps (the tail).
const LOG_MAX: usize = 64 * 1024;
/// How long the output is waited for once the command ended.
const OUTPUT_WAIT: Duration = Duration::from_secs(2);
/// Between SIGTERM and SIGKILL when the command overstays.
const GRACE: Duration = Duration::from_secs(5);

/// The file the summary's JSON is written to, in the run's folder.
pub const JSON_FILE: &str = "summary.json";
/// The command's output, in the run's folder.
pub const LOG_FILE: &str = "notify.log";

/// Sends the summary of the run in `run_dir` if the night matches `n.on`. Returns the line
/// to print: what was sent, or why not; `Err` when the command failed.
pub fn after_run(
    n: &Notify,
    root: &Path,
    receipts: &Path,
    run_dir: &Path,
    redact: &crate::words::redact::Redactor,
) -> Result<String, String> {
    let since = if n.since_last_green {
        Since::LastGreen
    } else {
        Since::Previous
    };
    let (text, json, green, changed) =
        match morning::for_run(receipts, run_dir, &since, n.report_url.as_deref(), false) {
            Ok(b) => {
                let style = if n.markdown {
                    morning::Style::Markdown
                } else {
                    morning::Style::Text
                };
                let text = morning::lines(&b, style).join("\n") + "\n";
                let json = serde_json::to_value(&b).unwrap_or_default();
                (text, json, b.green(), b.changed())
            }
            Err(e) => {
                // Fails closed: a night whose summary cannot be read is told as a failure.
                let why = format!("memra-orch could not build the summary: {e}");
                let text = format!("FAIL run {}: {why}\n", run_dir.display());
                let json = serde_json::json!({
                    "verdict": "fail",
                    "dir": run_dir.to_string_lossy(),
                    "error": why,
                });
                (text, json, false, true)
            }
        };
    let fire = n.on.iter().any(|o| match o {
        NotifyOn::Always => true,
        NotifyOn::Fail => !green,
        NotifyOn::Change => changed,
    });
    let when: Vec<&str> =
        n.on.iter()
            .map(|o| match o {
                NotifyOn::Fail => "fail",
                NotifyOn::Change => "change",
                NotifyOn::Always => "always",
            })
            .collect();
    if !fire {
        return Ok(format!(
            "notify: not sent: the night is {} and {} (on = [{}])",
            if green { "green" } else { "red" },
            if changed {
                "differs from its baseline"
            } else {
                "nothing changed since its baseline"
            },
            when.join(", ")
        ));
    }
    let file = run_dir.join(JSON_FILE);
    let whole = serde_json::to_string_pretty(&json).unwrap_or_default();
    let file_note = match write_new(&file, whole.as_bytes()) {
        Ok(()) => None,
        Err(e) => Some(format!("{}: {e}", file.display())),
    };
    let compact = serde_json::to_string(&json).unwrap_or_default();
    let env_json = if compact.len() <= JSON_ENV_MAX {
        compact
    } else {
        serde_json::to_string(&cut_lists(json)).unwrap_or_default()
    };
    let sent = send(n, root, run_dir, &text, &env_json, &file, green);
    let log = run_dir.join(LOG_FILE);
    let mut log_text = match &sent {
        Ok(s) => s.output.clone(),
        Err(s) => s.output.clone(),
    };
    if let Some(note) = &file_note {
        log_text.push_str(&format!("\nmemra-orch: could not write {note}\n"));
    }
    let log_text = redacted(&log_text, redact);
    let log_note = match write_new(&log, log_text.as_bytes()) {
        Ok(()) => format!("; its output is in {}", log.display()),
        Err(e) => format!("; its output could not be kept ({}: {e})", log.display()),
    };
    let program = n.command.first().map_or("", String::as_str);
    match sent {
        Ok(s) => Ok(format!(
            "notify: sent the summary to {program} ({}{}){log_note}",
            s.how,
            if green { "" } else { ", a red night" }
        )),
        Err(s) => Err(format!(
            "notify: {program} {}: the summary may not have reached anyone{log_note}",
            s.how
        )),
    }
}

/// How the command ended, and what it printed.
struct Sent {
    how: String,
    output: String,
}

fn send(
    n: &Notify,
    root: &Path,
    run_dir: &Path,
    text: &str,
    json: &str,
    file: &Path,
    green: bool,
) -> Result<Sent, Sent> {
    let fail = |how: String, output: String| Sent { how, output };
    let Some((program, args)) = n.command.split_first() else {
        return Err(fail("has no command".into(), String::new()));
    };
    // A relative path with a folder in it is the repository's (`scripts/notify`); a bare
    // name is looked up in PATH.
    let program: PathBuf = if program.contains('/') && Path::new(program).is_relative() {
        root.join(program)
    } else {
        PathBuf::from(program)
    };
    let (out_r, out_w) = match std::io::pipe() {
        Ok(p) => p,
        Err(e) => return Err(fail(format!("could not start: {e}"), String::new())),
    };
    let err_w = match out_w.try_clone() {
        Ok(w) => w,
        Err(e) => return Err(fail(format!("could not start: {e}"), String::new())),
    };
    let mut cmd = Command::new(&program);
    cmd.args(args)
        .current_dir(root)
        .env(JSON_ENV, json)
        .env(JSON_FILE_ENV, file)
        .env(VERDICT_ENV, if green { "pass" } else { "fail" })
        .env(RUN_DIR_ENV, run_dir)
        .stdin(Stdio::piped())
        .stdout(out_w)
        .stderr(err_w);
    std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            return Err(fail(
                format!(
                    "could not start: {e}; check `[notify] command` (a relative program is \
                     found from {})",
                    root.display()
                ),
                String::new(),
            ));
        }
    };
    drop(cmd);
    // The pipe's write ends now live in the child only, so the reader sees its end.
    let (done_tx, done) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut out_r = out_r;
        let mut tail: Vec<u8> = Vec::new();
        let mut buf = vec![0u8; 1 << 14];
        while let Ok(k) = out_r.read(&mut buf) {
            if k == 0 {
                break;
            }
            tail.extend_from_slice(&buf[..k]);
            if tail.len() > 2 * LOG_MAX {
                tail.drain(..tail.len() - LOG_MAX);
            }
        }
        if tail.len() > LOG_MAX {
            tail.drain(..tail.len() - LOG_MAX);
        }
        let _ = done_tx.send(String::from_utf8_lossy(&tail).into_owned());
    });
    if let Some(mut stdin) = child.stdin.take() {
        // A command that does not read its stdin ends the pipe; that is its business.
        let _ = stdin.write_all(text.as_bytes());
    }
    let group = child.id() as i32;
    let deadline = Instant::now() + n.timeout;
    let mut termed: Option<Instant> = None;
    let status = loop {
        match child.try_wait() {
            Ok(Some(s)) => break Ok(s),
            Ok(None) => {
                let now = Instant::now();
                match termed {
                    None if now >= deadline => {
                        // SAFETY: kill(2) on the command's own process group (made above)
                        // only sends a signal.
                        unsafe { libc::kill(-group, libc::SIGTERM) };
                        termed = Some(now);
                    }
                    Some(t) if now >= t + GRACE => {
                        // SAFETY: as above.
                        unsafe { libc::kill(-group, libc::SIGKILL) };
                    }
                    _ => {}
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => break Err(format!("could not be waited for: {e}")),
        }
    };
    // Whatever the command left running in its group holds the pipe open: stop it.
    // SAFETY: as above; a group that is gone makes it fail harmlessly.
    unsafe { libc::kill(-group, libc::SIGKILL) };
    // A process that left the group (setsid) may hold the output open for as long as it
    // lives: the run does not wait for it.
    let output = done.recv_timeout(OUTPUT_WAIT).unwrap_or_else(|_| {
        format!(
            "memra-orch: the command left a process holding its output open; what it \
             printed after {} is not here\n",
            humantime::format_duration(OUTPUT_WAIT)
        )
    });
    let status = match status {
        Ok(s) => s,
        Err(e) => return Err(fail(e, output)),
    };
    if termed.is_some() {
        return Err(fail(
            format!(
                "did not finish within {} and was stopped; raise `[notify] timeout`",
                humantime::format_duration(n.timeout)
            ),
            output,
        ));
    }
    match status.code() {
        Some(0) => Ok(Sent {
            how: "exit 0".into(),
            output,
        }),
        Some(c) => Err(fail(format!("exited {c}"), output)),
        None => Err(fail(
            format!(
                "was killed by signal {}",
                std::os::unix::process::ExitStatusExt::signal(&status).unwrap_or(0)
            ),
            output,
        )),
    }
}

/// The summary's JSON with every list cut to [`LIST_CUT`] entries.
fn cut_lists(mut v: serde_json::Value) -> serde_json::Value {
    if let Some(m) = v.as_object_mut() {
        for (_, x) in m.iter_mut() {
            if let Some(a) = x.as_array_mut() {
                a.truncate(LIST_CUT);
            }
        }
        m.insert("lists_cut".into(), serde_json::Value::Bool(true));
    }
    v
}

/// `text` with the manifest's secrets and the values of secret-named variables of this
/// process's environment replaced.
fn redacted(text: &str, redact: &crate::words::redact::Redactor) -> String {
    let env: Vec<(String, String)> = std::env::vars()
        .filter(|(n, _)| crate::words::redact::secret_name(n))
        .collect();
    let more = crate::words::redact::Redactor::new(
        env.iter().map(|(n, _)| n.clone()).collect(),
        env.iter().map(|(n, v)| (n.as_str(), v.as_str())),
    );
    more.text(&redact.text(text)).into_owned()
}

/// Writes a new file in the run's folder; never follows or replaces what is there (a link
/// planted at the name, a file an earlier notify wrote).
fn write_new(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .custom_flags(libc::O_NOFOLLOW)
        .mode(0o644)
        .open(path)?;
    f.write_all(bytes)?;
    f.sync_all()
}
