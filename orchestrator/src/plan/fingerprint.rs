//! `[fingerprints]`: commands whose output names something the cells depend on that no file
//! of the repository holds — the engine under test installed with pip
//! (`python3 -c "import llama_cpp; print(llama_cpp.__version__)"`), `pip freeze`, the
//! driver's version. Each runs once per run, before any cell, in the environment the cells
//! get from `[isolation] inherit` and `[env]`, with the root as its folder; the sha256 of
//! its stdout joins every cell's inputs digest, and the receipts list each fingerprint.
//!
//! A fingerprint that cannot be taken (not found, a non-zero exit, past its time) refuses the
//! run: without it memra-orch could not tell one engine from another, and a run that cannot
//! tell what it tested must not be compared as if it could.

use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::plan::{FingerprintCommand, Plan};

/// How long one fingerprint command may take.
pub const TIMEOUT: Duration = Duration::from_secs(120);
/// The longest first line a receipt keeps of a fingerprint's output.
const FIRST_LINE: usize = 160;

/// One fingerprint as taken: what ran and the digest of what it printed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Fingerprint {
    pub name: String,
    /// The command, redacted as every argv a receipt holds.
    pub argv: Vec<String>,
    /// sha256 of its stdout.
    pub sha256: String,
    pub bytes: u64,
    /// The first line of its stdout (clipped, redacted), so a reader sees e.g. the version.
    #[serde(default)]
    pub first_line: String,
}

/// A fingerprint that could not be taken.
#[derive(Debug, thiserror::Error)]
#[error(
    "fingerprint `{name}` ({command}) {why}; the run needs it to tell which engine it tests: \
     make the command work here (install what it reads), or fix it in [fingerprints]"
)]
pub struct FingerprintError {
    pub name: String,
    pub command: String,
    pub why: String,
}

/// Takes every fingerprint of the plan, in manifest order; the first that fails refuses the
/// run.
pub fn take_all(plan: &Plan) -> Result<Vec<Fingerprint>, FingerprintError> {
    plan.fingerprints
        .iter()
        .map(|f| take(f, &plan.inherit, &plan.root, TIMEOUT, &plan.redact))
        .collect()
}

/// Runs one fingerprint command.
// Over 150 lines: one command's whole life (its environment from the inherit list, spawn in
// its own group, wait under the timeout, drain pipes a setsid child may hold open, redact and
// judge the output), every failure with its own message.
pub fn take(
    f: &FingerprintCommand,
    inherit: &[String],
    root: &Path,
    timeout: Duration,
    redact: &crate::words::redact::Redactor,
) -> Result<Fingerprint, FingerprintError> {
    // The command sees inherited variables the manifest never names: their secret-named
    // values (an HF_TOKEN a `printenv` or `pip config list` would print) are redacted too.
    let inherited: Vec<(String, String)> = inherit
        .iter()
        .filter(|n| crate::words::redact::secret_name(n))
        .filter_map(|n| Some((n.clone(), std::env::var(n).ok()?)))
        .collect();
    let more = crate::words::redact::Redactor::new(
        inherited.iter().map(|(n, _)| n.clone()).collect(),
        inherited.iter().map(|(n, v)| (n.as_str(), v.as_str())),
    );
    let clean = |t: &str| secret_assignments(&more.text(&redact.text(t)));
    let shown: Vec<String> = f.argv.iter().map(|a| clean(a)).collect();
    let fail = |why: String| FingerprintError {
        name: f.name.clone(),
        command: shown.join(" "),
        why: clean(&why),
    };
    let (program, args) = f
        .argv
        .split_first()
        .ok_or_else(|| fail("has no command".into()))?;
    let mut cmd = Command::new(program);
    cmd.args(args)
        .env_clear()
        .current_dir(root)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for name in inherit {
        if name.starts_with("MEMRA_") {
            continue;
        }
        if let Some(v) = std::env::var_os(name) {
            cmd.env(name, v);
        }
    }
    cmd.envs(&f.env);
    std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
    let mut child = cmd
        .spawn()
        .map_err(|e| fail(format!("could not start: {e}")))?;
    let mut stdout = child.stdout.take().expect("piped");
    let mut stderr = child.stderr.take().expect("piped");
    let (out_tx, out) = std::sync::mpsc::channel();
    let (err_tx, err) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut h = Sha256::new();
        let mut head = Vec::new();
        let mut bytes = 0u64;
        let mut buf = vec![0u8; 1 << 16];
        while let Ok(n) = stdout.read(&mut buf) {
            if n == 0 {
                break;
            }
            h.update(&buf[..n]);
            bytes += n as u64;
            if head.len() < 4096 {
                head.extend_from_slice(&buf[..n.min(4096 - head.len())]);
            }
        }
        let _ = out_tx.send((crate::words::digest::hex(&h.finalize()), bytes, head));
    });
    std::thread::spawn(move || {
        let mut tail = Vec::new();
        let mut buf = vec![0u8; 1 << 14];
        while let Ok(n) = stderr.read(&mut buf) {
            if n == 0 {
                break;
            }
            tail.extend_from_slice(&buf[..n]);
            if tail.len() > 8192 {
                tail.drain(..tail.len() - 8192);
            }
        }
        let _ = err_tx.send(tail);
    });
    let deadline = Instant::now() + timeout;
    let status = loop {
        match child.try_wait() {
            Ok(Some(s)) => break Ok(s),
            Ok(None) if Instant::now() >= deadline => {
                // SAFETY: kill(2) on the child's own process group (made above) only sends a
                // signal; a group that is gone already makes it fail harmlessly.
                unsafe {
                    libc::kill(-(child.id() as i32), libc::SIGKILL);
                }
                let _ = child.wait();
                break Err(format!(
                    "did not finish within {}",
                    humantime::format_duration(timeout)
                ));
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(10)),
            Err(e) => break Err(format!("could not be waited for: {e}")),
        }
    };
    let status = status.map_err(&fail)?;
    // The group may hold the pipes open after the command itself ended.
    // SAFETY: as above.
    unsafe {
        libc::kill(-(child.id() as i32), libc::SIGKILL);
    }
    // A process that left the group (setsid) may still hold stdout open: its output would
    // never end, so the digest cannot be told and the fingerprint fails.
    let grace = Duration::from_secs(5);
    let (sha256, bytes, head) = out.recv_timeout(grace).map_err(|_| {
        fail("left a process that holds its output open after it ended".to_string())
    })?;
    let tail = err.recv_timeout(grace).unwrap_or_default();
    if !status.success() {
        let last = String::from_utf8_lossy(&tail)
            .lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .unwrap_or("")
            .trim()
            .to_string();
        let how = match status.code() {
            Some(c) => format!("exited {c}"),
            None => "was killed by a signal".to_string(),
        };
        return Err(fail(if last.is_empty() {
            how
        } else {
            format!("{how}: {last}")
        }));
    }
    let first = String::from_utf8_lossy(&head)
        .lines()
        .next()
        .unwrap_or("")
        .trim()
        .chars()
        .take(FIRST_LINE)
        .collect::<String>();
    Ok(Fingerprint {
        name: f.name.clone(),
        argv: shown,
        sha256,
        bytes,
        first_line: clean(&first),
    })
}

/// `text` with the value of every `NAME=value` whose name looks secret redacted (a
/// `printenv` line, a `pip config` entry).
fn secret_assignments(text: &str) -> String {
    static ASSIGN: std::sync::OnceLock<regex::Regex> = std::sync::OnceLock::new();
    ASSIGN
        .get_or_init(|| {
            regex::Regex::new(r"([A-Za-z_][A-Za-z0-9_.-]*)\s*[=:]\s*(\S+)").expect("a valid regex")
        })
        .replace_all(text, |c: &regex::Captures<'_>| {
            if crate::words::redact::secret_name(&c[1]) {
                format!("{}={}", &c[1], crate::words::redact::REDACTED)
            } else {
                c[0].to_string()
            }
        })
        .into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn cmd(name: &str, argv: &[&str]) -> FingerprintCommand {
        FingerprintCommand {
            name: name.into(),
            argv: argv.iter().map(|s| s.to_string()).collect(),
            env: BTreeMap::from([("ENGINE".to_string(), "llama".to_string())]),
        }
    }

    fn take_one(
        f: &FingerprintCommand,
        timeout: Duration,
    ) -> Result<Fingerprint, FingerprintError> {
        let redact = crate::words::redact::Redactor::new(Vec::new(), std::iter::empty());
        take(f, &["PATH".to_string()], Path::new("/"), timeout, &redact)
    }

    #[test]
    fn output_is_digested_in_the_cells_environment() {
        let f = take_one(
            &cmd(
                "engine",
                &["sh", "-c", "echo \"$ENGINE 0.3.36\"; echo more; pwd"],
            ),
            TIMEOUT,
        )
        .unwrap();
        assert_eq!(f.first_line, "llama 0.3.36");
        assert_eq!(f.bytes, "llama 0.3.36\nmore\n/\n".len() as u64);
        assert_eq!(
            f.sha256,
            crate::words::digest::sha256_hex(b"llama 0.3.36\nmore\n/\n")
        );
    }

    #[test]
    fn a_url_token_never_reaches_the_receipt() {
        let f = take_one(
            &cmd(
                "pip",
                &[
                    "sh",
                    "-c",
                    "echo 'llama @ git+https://ghp_abc123@github.com/x/y'",
                ],
            ),
            TIMEOUT,
        )
        .unwrap();
        assert_eq!(
            f.first_line,
            "llama @ git+https://<redacted>@github.com/x/y"
        );
    }

    #[test]
    fn secret_assignments_are_redacted() {
        assert_eq!(
            secret_assignments("HF_TOKEN=hf_abc MY_VAR=1 api-key: s3cr3t"),
            "HF_TOKEN=<redacted> MY_VAR=1 api-key=<redacted>"
        );
    }

    #[test]
    fn a_process_left_holding_the_output_fails_the_fingerprint() {
        let started = Instant::now();
        let e = take_one(
            &cmd(
                "daemon",
                &["sh", "-c", "setsid sleep 30 & sleep 0.5; echo v1"],
            ),
            TIMEOUT,
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("holds its output open"), "{e}");
        assert!(started.elapsed() < Duration::from_secs(20));
    }

    #[test]
    fn a_fingerprint_that_cannot_be_taken_says_why() {
        let e = take_one(
            &cmd(
                "llama_cpp",
                &["sh", "-c", "echo 'No module named llama_cpp' >&2; exit 1"],
            ),
            TIMEOUT,
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.starts_with("fingerprint `llama_cpp` (sh -c echo 'No module named llama_cpp' >&2; exit 1) exited 1: No module named llama_cpp;"),
            "{e}"
        );
        let e = take_one(&cmd("x", &["/no/such/program"]), TIMEOUT)
            .unwrap_err()
            .to_string();
        assert!(e.contains("could not start"), "{e}");
        let started = Instant::now();
        let e = take_one(&cmd("slow", &["sleep", "30"]), Duration::from_millis(200))
            .unwrap_err()
            .to_string();
        assert!(e.contains("did not finish within 200ms"), "{e}");
        assert!(started.elapsed() < Duration::from_secs(10));
    }
}
