//! Shared helpers for the `run` integration tests: a manifest in a fresh folder (outside any
//! git repository, so its root is that folder), the real `memra-orch` binary run against it,
//! and readers for the receipt tree it leaves. A module of the one integration-test binary
//! (`lib.rs`).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output};
use std::time::{Duration, Instant};

use serde_json::Value;

pub const COMMIT: &str = "test-commit";

/// Absolute path of the fake gates.
pub fn gates() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/gates")
}

pub struct Fixture {
    pub dir: tempfile::TempDir,
    pub name: String,
    /// `--grace` of the runs: short by default, so a test that stops a gate which ignores
    /// SIGTERM does not wait long.
    pub grace: &'static str,
}

impl Fixture {
    /// Writes `manifest.toml`; `{gates}` in the text becomes the gates folder.
    pub fn new(manifest: &str) -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        let text = manifest.replace("{gates}", &gates().to_string_lossy());
        let name = text
            .lines()
            .find_map(|l| {
                l.trim()
                    .strip_prefix("name = \"")
                    .map(|r| r.trim_end_matches('"').to_string())
            })
            .expect("the fixture manifest has a name");
        std::fs::write(dir.path().join("manifest.toml"), text).unwrap();
        Fixture {
            dir,
            name,
            grace: "1s",
        }
    }

    /// The same fixture with another `--grace`: a long one makes sure a gate that dies of
    /// SIGTERM is not also sent SIGKILL because a loaded machine was slow to reap it.
    pub fn with_grace(self, grace: &'static str) -> Fixture {
        Fixture { grace, ..self }
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// `memra-orch run manifest.toml` with receipts in the fixture folder, a fixed commit,
    /// plain progress and the fixture's grace, plus `args`. Its GPU leases live in the
    /// fixture folder too, so tests running at once never wait for each other's GPUs.
    pub fn command(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_memra-orch"));
        cmd.arg("run")
            .arg(self.path().join("manifest.toml"))
            .arg("--receipts")
            .arg(self.path().join("receipts"))
            .args([
                "--commit",
                COMMIT,
                "--progress",
                "plain",
                "--grace",
                self.grace,
            ])
            .args(args)
            .current_dir(self.path())
            .env("MEMRA_GPU_LOCK_DIR", self.path().join("gpu-leases"));
        cmd
    }

    /// The same run in the background.
    pub fn spawn(&self, args: &[&str]) -> Running {
        Running(self.command(args).spawn().unwrap())
    }

    /// [`Fixture::spawn`] with SIGHUP's default action restored in the run: a test suite
    /// started under `nohup` passes SIGHUP ignored to its children, and a run that inherits
    /// it ignored keeps going on a hangup by design (`cancel_signals`).
    pub fn spawn_hangup_default(&self, args: &[&str]) -> Running {
        use std::os::unix::process::CommandExt;
        let mut cmd = self.command(args);
        // SAFETY: signal() is async-signal-safe and runs in the child between fork and exec.
        unsafe {
            cmd.pre_exec(|| {
                libc::signal(libc::SIGHUP, libc::SIG_DFL);
                Ok(())
            });
        }
        Running(cmd.spawn().unwrap())
    }

    pub fn run(&self, args: &[&str]) -> Output {
        logged(self.command(args).output().unwrap())
    }

    /// `receipts/<commit>/<manifest>`: the folder holding every run of the fixture.
    pub fn manifest_dir(&self) -> PathBuf {
        self.path().join("receipts").join(COMMIT).join(&self.name)
    }

    /// The run folders of the fixture, oldest first (run ids sort by start time).
    pub fn runs(&self) -> Vec<PathBuf> {
        runs_in(&self.manifest_dir())
    }

    /// The newest run's tree, if a run has written its run.json yet (for polling while a
    /// run starts).
    pub fn current_tree(&self) -> Option<PathBuf> {
        self.runs().pop()
    }

    /// The newest run's tree.
    pub fn tree(&self) -> PathBuf {
        newest_run(&self.manifest_dir())
    }

    pub fn run_json(&self) -> Value {
        read_json(&self.tree().join("run.json"))
    }

    /// The folder of a cell's receipt in the newest run: its own, or, for a receipt the run
    /// carried, the one of the run that measured it.
    pub fn node_dir(&self, id: &str) -> PathBuf {
        node_dir_in(&self.tree(), id)
    }

    /// The receipt of a cell, found through run.json's node index.
    pub fn receipt(&self, id: &str) -> Value {
        read_json(&self.node_dir(id).join("receipt.json"))
    }

    pub fn verdict(&self, id: &str) -> String {
        self.receipt(id)["verdict"].as_str().unwrap().to_string()
    }

    /// The folder of an attempt of a cell.
    pub fn attempt_dir(&self, id: &str, n: u32) -> PathBuf {
        self.node_dir(id).join(format!("attempt-{n}"))
    }
}

/// The run folders (holding a run.json) in a manifest folder `<receipts>/<commit>/<name>`,
/// oldest first.
pub fn runs_in(manifest_dir: &Path) -> Vec<PathBuf> {
    let mut runs: Vec<PathBuf> = std::fs::read_dir(manifest_dir)
        .map(|d| {
            d.flatten()
                .map(|e| e.path())
                .filter(|p| p.join("run.json").is_file())
                .collect()
        })
        .unwrap_or_default();
    runs.sort();
    runs
}

/// The newest run folder in a manifest folder; panics when there is none.
pub fn newest_run(manifest_dir: &Path) -> PathBuf {
    runs_in(manifest_dir)
        .pop()
        .unwrap_or_else(|| panic!("no run under {}", manifest_dir.display()))
}

/// The folder of a cell's receipt for the run at `tree`, following a carried entry to the
/// run that measured it.
pub fn node_dir_in(tree: &Path, id: &str) -> PathBuf {
    let run = read_json(&tree.join("run.json"));
    let node = run["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["id"] == id)
        .unwrap_or_else(|| panic!("{id} is not in run.json: {run:#}"));
    let slug = node["slug"]
        .as_str()
        .unwrap_or_else(|| panic!("{id} has no receipt"));
    let base = match node["carried"]["from"].as_str() {
        Some(from) => tree.join(from),
        None => tree.to_path_buf(),
    };
    base.join("nodes").join(slug)
}

/// Prints a finished memra-orch's stdout and stderr (shown when a test fails) and hands the
/// output back.
pub fn logged(out: Output) -> Output {
    eprintln!(
        "--- memra-orch stdout\n{}\n--- stderr\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// A file of a receipt tree, from its folder or, once the run is packed, from its
/// `nodes.zip` (as every memra-orch reader finds it).
pub fn read_bytes(path: &Path) -> std::io::Result<Vec<u8>> {
    match std::fs::read(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let mut file = memra_orch::gate::attempt_file::open_path(path)
                .map_err(|o| std::io::Error::new(std::io::ErrorKind::NotFound, o.to_string()))?;
            let mut bytes = Vec::new();
            std::io::Read::read_to_end(&mut file, &mut bytes)?;
            Ok(bytes)
        }
        other => other,
    }
}

/// Whether `path` is a file of a receipt tree, in its folder or in its packed run's archive.
pub fn is_file_in_tree(path: &Path) -> bool {
    path.is_file() || memra_orch::gate::attempt_file::open_path(path).is_ok()
}

/// Whether `path` is a folder of a receipt tree, in its folder or in its packed run's
/// archive.
pub fn is_dir_in_tree(path: &Path) -> bool {
    path.is_dir() || memra_orch::gate::packed::has_folder(path)
}

/// [`read_bytes`] as text.
pub fn read_text(path: &Path) -> std::io::Result<String> {
    read_bytes(path).map(|b| String::from_utf8_lossy(&b).into_owned())
}

pub fn read_json(path: &Path) -> Value {
    let text = read_text(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Every file under a folder, and every file a packed run's `nodes.zip` there holds (by
/// its path in the tree it was, `<run>/nodes/…`; read them with [`read_bytes`]).
pub fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            // Links are not followed (nor listed): a running attempt's folder is also
            // reachable through its `.attempt-N-*` link.
            let Ok(kind) = e.file_type() else { continue };
            if kind.is_dir() {
                stack.push(e.path())
            } else if !kind.is_symlink() {
                if e.file_name() == "nodes.zip" {
                    let nodes = d.join("nodes");
                    let members = memra_orch::gate::packed::files_below(&nodes)
                        .unwrap_or_else(|e| panic!("{}: {e}", e))
                        .unwrap_or_default();
                    out.extend(members.into_iter().map(|m| nodes.join(m)));
                }
                out.push(e.path())
            }
        }
    }
    out
}

/// Seconds since the epoch of an RFC 3339 timestamp written by the receipts.
pub fn epoch(rfc3339: &str) -> f64 {
    let t = humantime::parse_rfc3339(rfc3339).unwrap();
    t.duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

/// A `memra-orch run` in the background, killed if the test ends before it does.
pub struct Running(Child);

impl Running {
    pub fn pid(&self) -> i32 {
        self.0.id() as i32
    }

    pub fn wait(&mut self) -> ExitStatus {
        self.0.wait().unwrap()
    }

    /// Kills the run unless it has ended.
    pub fn stop(&mut self) {
        if matches!(self.0.try_wait(), Ok(None)) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Waits until `done` holds, checking every 50 ms, for at most `limit`; says whether it
/// held. The limit is for a machine that is slow, not for one that works: it is generous,
/// and a condition that holds ends the wait at once.
pub fn eventually(limit: Duration, mut done: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    loop {
        if done() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// What `/proc` says of a process, for failure messages.
pub fn proc_stat(pid: i32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .unwrap_or_else(|e| format!("no /proc/{pid}/stat: {e}"))
}

/// Whether a process is alive (a zombie counts as gone).
pub fn alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => !stat
            .rsplit(')')
            .next()
            .unwrap_or("")
            .trim_start()
            .starts_with('Z'),
        Err(_) => false,
    }
}

/// `memra-orch validate m.toml` on `text` in a fresh folder: (exit code, stderr with the
/// folder's path written `[DIR]`).
pub fn validate(text: &str) -> (i32, String) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("m.toml"), text).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_memra-orch"))
        .args(["validate", "m.toml"])
        .current_dir(dir.path())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr)
        .replace(&dir.path().to_string_lossy().into_owned(), "[DIR]");
    (out.status.code().unwrap_or(-1), stderr)
}

/// `memra-orch ARGS --receipts <fixture>/receipts` in the fixture folder, logged: for the
/// read commands (`diff`, `history`, `show`, `gc`, `report`) over a fixture's runs.
pub fn orch(f: &Fixture, args: &[&str]) -> Output {
    logged(
        Command::new(env!("CARGO_BIN_EXE_memra-orch"))
            .args(args)
            .arg("--receipts")
            .arg(f.path().join("receipts"))
            .current_dir(f.path())
            .output()
            .unwrap(),
    )
}
