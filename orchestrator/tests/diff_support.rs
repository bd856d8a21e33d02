//! Shared helpers for the diff, attestation and housekeeping tests: a scratch git repository
//! holding a manifest and the fixture gate, committed and run with the real `memra-orch`
//! binary, so receipts land in `receipts/<sha>/<manifest>` exactly as in real use. A module
//! of the one integration-test binary (`lib.rs`).

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

pub struct Repo {
    pub dir: tempfile::TempDir,
}

/// Whether git can be run here; the tests skip, saying why, when it cannot.
pub fn have_git() -> bool {
    Command::new("git")
        .arg("--version")
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

impl Repo {
    /// A fresh repository with the fixture gate and a `.gitignore` for `receipts/` (so a
    /// run's own receipts do not make the next commit's run dirty).
    #[allow(clippy::new_without_default)]
    pub fn new() -> Repo {
        let dir = tempfile::tempdir().unwrap();
        let gate = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/diff/gate.sh");
        std::fs::copy(&gate, dir.path().join("gate.sh")).unwrap();
        std::fs::write(dir.path().join(".gitignore"), "receipts/\n").unwrap();
        let repo = Repo { dir };
        repo.git(&["init", "-q"]);
        repo
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    pub fn git(&self, args: &[&str]) -> String {
        git_at(self.path(), args)
    }

    /// Writes `files` (path, text), commits everything, and returns the new sha.
    pub fn commit(&self, files: &[(&str, &str)], message: &str) -> String {
        for (path, text) in files {
            let p = self.path().join(path);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, text).unwrap();
        }
        self.git(&["add", "-A"]);
        self.git(&["commit", "-q", "-m", message]);
        self.git(&["rev-parse", "HEAD"])
    }

    /// `memra-orch <args>` in the repository.
    pub fn orch(&self, args: &[&str]) -> Output {
        let out = Command::new(env!("CARGO_BIN_EXE_memra-orch"))
            .current_dir(self.path())
            .env_remove("NO_COLOR")
            .args(args)
            .output()
            .unwrap();
        eprintln!(
            "--- memra-orch {args:?} exit {:?}\n{}\n--- stderr\n{}",
            out.status.code(),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        out
    }

    /// Runs `manifest` (a path in the repository) without GPUs.
    pub fn run(&self, manifest: &str) -> Output {
        self.orch(&[
            "run",
            manifest,
            "--gpus",
            "none",
            "--progress",
            "quiet",
            "-j",
            "2",
        ])
    }

    /// The newest run of manifest `name` at commit `sha`.
    pub fn tree(&self, sha: &str, name: &str) -> PathBuf {
        crate::run_support::newest_run(&self.path().join("receipts").join(sha).join(name))
    }
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// One `[[arm]]` running the fixture gate.
pub fn arm(id: &str, status: &str, metric: &str, artifact: &str, path: &str) -> String {
    format!(
        "[[arm]]\nid = \"{id}\"\nrun = [\"./gate.sh\", \"{status}\", \"{metric}\", \"{artifact}\", \"{path}\"]\n\n"
    )
}

pub const HEADER: &str =
    "schema = 1\nname = \"battery\"\n\n[defaults]\ngpus = 0\ntimeout = \"1m\"\n\n";

/// `git <args>` in `dir` with a fixed identity; panics with git's stderr when it fails.
pub fn git_at(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("git")
        .current_dir(dir)
        .args([
            "-c",
            "user.name=t",
            "-c",
            "user.email=t@t",
            "-c",
            "commit.gpgsign=false",
        ])
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}
