//! The acceptance nights of a team whose gate is a Python program over an engine that is not
//! memra's: a scratch git repository, a gate (`tests/fixtures/python/gate.py`) that imports
//! an engine module and reads a data file, run by `python3` — so argv[0] is the interpreter,
//! whose bytes never change. Over six commits the commit must be an input: the gate's code
//! changing is a REGRESSION (never FLAKY), the engine's numbers changing are BITS MOVED with
//! the per-tensor table, a flip at one commit is FLAKY, a flip across commits of a cell
//! with that history is a regression marked known flaky, and `memra-orch diff` with no
//! names shows a green night's moved bits.

use std::path::Path;
use std::process::Output;

use serde_json::Value;

use crate::diff_support::{Repo, have_git, stdout};

fn have_python() -> bool {
    std::process::Command::new("python3")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

struct Nights {
    repo: Repo,
    /// Holds the flip file, outside the repository.
    _outside: tempfile::TempDir,
    flip: std::path::PathBuf,
}

impl Nights {
    fn new() -> Option<Nights> {
        if !have_git() || !have_python() {
            eprintln!("skipped: the nights need git and python3");
            return None;
        }
        let repo = Repo::new();
        let outside = tempfile::tempdir().unwrap();
        let flip = outside.path().join("flip");
        std::fs::write(&flip, "pass").unwrap();
        let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/python");
        let manifest = format!(
            "schema = 1\nname = \"py\"\n\n[defaults]\ngpus = 0\ntimeout = \"1m\"\n\n\
             [env]\nPYTHONDONTWRITEBYTECODE = \"1\"\nFLIP_FILE = \"{}\"\n\n\
             [[arm]]\nid = \"llama\"\nrun = [\"python3\", \"gate.py\"]\n",
            flip.display()
        );
        let read = |f: &str| std::fs::read_to_string(fixtures.join(f)).unwrap();
        repo.commit(
            &[
                (".gitignore", "receipts/\n__pycache__/\n"),
                ("manifest.toml", &manifest),
                ("gate.py", &read("gate.py")),
                ("engine.py", &read("engine.py")),
                ("data/limit.txt", "4.0\n"),
            ],
            "commit 1",
        );
        Some(Nights {
            repo,
            _outside: outside,
            flip,
        })
    }

    fn run(&self, expect: i32) {
        let out = self.repo.run("manifest.toml");
        assert_eq!(out.status.code(), Some(expect), "{}", stdout(&out));
    }

    fn diff(&self, args: &[&str]) -> Output {
        let mut all = vec!["diff"];
        all.extend_from_slice(args);
        all.extend_from_slice(&["--color", "never"]);
        self.repo.orch(&all)
    }

    fn diff_json(&self, args: &[&str]) -> (Value, Option<i32>) {
        let mut all = args.to_vec();
        all.extend_from_slice(&["--format", "json"]);
        let out = self.diff(&all);
        let v: Value =
            serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", stdout(&out)));
        (v, out.status.code())
    }
}

fn ids(list: &Value) -> Vec<String> {
    list.as_array()
        .unwrap()
        .iter()
        .map(|c| c["id"].as_str().unwrap().to_string())
        .collect()
}

#[test]
fn a_python_gate_over_six_commits() {
    let Some(n) = Nights::new() else { return };
    n.run(0);

    // (a) The gate's own code changes and it now fails: the interpreter is the same file,
    // the declared inputs are none, but the commit is an input: a REGRESSION, exit 1.
    let gate = std::fs::read_to_string(n.repo.path().join("gate.py")).unwrap();
    n.repo.commit(
        &[(
            "gate.py",
            &gate.replace("ok = max(logits) <= limit", "ok = max(logits) <= limit / 4"),
        )],
        "commit 2: a stricter gate",
    );
    n.run(1);
    let out = n.diff(&["HEAD~1", "HEAD"]);
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(text.contains("REGRESSIONS (1)"), "{text}");
    assert!(!text.contains("FLAKY"), "{text}");
    assert!(!text.contains("known flaky"), "{text}");
    // The morning command says the same: the latest run against the one before it.
    assert_eq!(n.diff(&[]).status.code(), Some(1));
    // A module-level data file the gate reads fixes it again: a FIX, not a flake.
    n.repo
        .commit(&[("data/limit.txt", "16.0\n")], "commit 3: a wider limit");
    n.run(0);
    let (d, code) = n.diff_json(&["HEAD~1", "HEAD"]);
    assert_eq!(code, Some(0));
    assert_eq!(ids(&d["fixes"]), ["llama"]);
    assert!(d["flaky"].as_array().unwrap().is_empty(), "{d:#}");

    // (b) and (e): the engine module moves the numbers on a green night after a green
    // night. `memra-orch diff` with no names shows the bits and how far they moved.
    n.repo.commit(
        &[(
            "engine.py",
            "def logits():\n    return [0.5, 1.0, 2.5, 0.25]\n",
        )],
        "commit 4: the engine moves one logit",
    );
    n.run(0);
    let out = n.diff(&[]);
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(text.contains("BITS MOVED (1)"), "{text}");
    assert!(!text.contains("NONDETERMINISTIC"), "{text}");
    assert!(text.contains("logits  F32    [1, 4]  1 of 4"), "{text}");
    assert!(text.contains("5.000e-1"), "max |Δ| of 2.0 → 2.5: {text}");
    // The README's old morning command compares the green run with itself and says so.
    let same = stdout(&n.diff(&["last-green", "latest"]));
    assert!(same.contains("name the same run"), "{same}");

    // (c) Two runs at one commit, the second failing for a reason no input shows: FLAKY,
    // exit 0 unless --flaky-fails.
    std::fs::write(&n.flip, "fail").unwrap();
    n.run(1);
    let out = n.diff(&["previous", "latest"]);
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(text.contains("FLAKY (1)"), "{text}");
    assert!(
        text.contains("llama  pass → fail  inputs unchanged"),
        "{text}"
    );
    assert_eq!(
        n.diff(&["previous", "latest", "--flaky-fails"])
            .status
            .code(),
        Some(1)
    );

    // (d) The next commits change nothing the gate reads, and it flips back and forth: each
    // flip across commits is a fix or a regression, marked known flaky, and the regression
    // fails the diff.
    n.repo
        .commit(&[("README.md", "notes\n")], "commit 5: an unrelated change");
    std::fs::write(&n.flip, "pass").unwrap();
    n.run(0);
    let (d, code) = n.diff_json(&["previous", "latest"]);
    assert_eq!(code, Some(0));
    assert_eq!(ids(&d["fixes"]), ["llama"]);
    let known = d["fixes"][0]["known_flaky"].as_str().unwrap_or_default();
    assert!(
        known.starts_with("known flaky: flipped on identical inputs at "),
        "{d:#}"
    );
    n.repo
        .commit(&[("README.md", "more notes\n")], "commit 6: another one");
    std::fs::write(&n.flip, "fail").unwrap();
    n.run(1);
    let out = n.diff(&["HEAD~1", "HEAD"]);
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(text.contains("REGRESSIONS (1)"), "{text}");
    assert!(
        text.contains("[known flaky: flipped on identical inputs at "),
        "{text}"
    );
    assert!(text.contains("still counted]"), "{text}");
    assert!(!text.contains("FLAKY ("), "{text}");
    let (d, code) = n.diff_json(&["HEAD~1", "HEAD"]);
    assert_eq!(code, Some(1));
    assert_eq!(ids(&d["regressions"]), ["llama"]);
    // The evidence names the commit where the cell flipped on identical inputs (commit 4).
    let commit4 = n.repo.git(&["rev-parse", "HEAD~2"]);
    let known = d["regressions"][0]["known_flaky"].as_str().unwrap();
    assert!(known.contains(&commit4[..12]), "{known} names {commit4}");
}

#[test]
fn a_run_outside_git_is_never_evidence_of_flakiness() {
    if !have_python() {
        eprintln!("skipped: needs python3");
        return;
    }
    // The same gate in a plain folder: the code cannot be named, so a flip between two
    // runs is a regression, not a flake.
    let dir = tempfile::tempdir().unwrap();
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/python");
    for f in ["gate.py", "engine.py"] {
        std::fs::copy(fixtures.join(f), dir.path().join(f)).unwrap();
    }
    std::fs::create_dir(dir.path().join("data")).unwrap();
    std::fs::write(dir.path().join("data/limit.txt"), "4.0").unwrap();
    let flip = dir.path().join("flip");
    std::fs::write(&flip, "pass").unwrap();
    std::fs::write(
        dir.path().join("m.toml"),
        format!(
            "schema = 1\nname = \"py\"\n[defaults]\ngpus = 0\n[env]\nPYTHONDONTWRITEBYTECODE = \"1\"\nFLIP_FILE = \"{}\"\n[[arm]]\nid = \"llama\"\nrun = [\"python3\", \"gate.py\"]\n",
            flip.display()
        ),
    )
    .unwrap();
    let orch = |args: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_memra-orch"))
            .current_dir(dir.path())
            .args(args)
            .args(["--receipts", "receipts"])
            .output()
            .unwrap()
    };
    let run = ["run", "m.toml", "--gpus", "none", "--progress", "quiet"];
    assert_eq!(orch(&run).status.code(), Some(0));
    std::fs::write(&flip, "fail").unwrap();
    assert_eq!(orch(&run).status.code(), Some(1));
    let out = orch(&["diff", "previous", "latest", "--color", "never"]);
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(
        text.contains("REGRESSIONS (1)") && !text.contains("FLAKY"),
        "{text}"
    );
}

/// A scratch repository holding one manifest whose gate script lives outside it.
fn outside_gate_repo() -> Option<(Repo, tempfile::TempDir)> {
    if !have_git() || !have_python() {
        eprintln!("skipped: needs git and python3");
        return None;
    }
    let repo = Repo::new();
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("gate.py"), "import sys\nsys.exit(0)\n").unwrap();
    let manifest = format!(
        "schema = 1\nname = \"ext\"\n[defaults]\ngpus = 0\n[env]\nPYTHONDONTWRITEBYTECODE = \"1\"\n\
         [[arm]]\nid = \"a\"\nrun = [\"python3\", \"{}\"]\n\
         [[arm]]\nid = \"b\"\nrun = [\"python3\", \"{}\"]\n",
        outside.path().join("gate.py").display(),
        outside.path().join("gate.py").display(),
    );
    repo.commit(&[("m.toml", &manifest)], "one");
    Some((repo, outside))
}

#[test]
fn a_script_the_command_names_outside_the_repository_is_an_input() {
    let Some((repo, outside)) = outside_gate_repo() else {
        return;
    };
    let run = |code: i32| assert_eq!(repo.run("m.toml").status.code(), Some(code));
    run(0);
    // The gate script changes outside the repository: not a flake, a regression.
    std::fs::write(outside.path().join("gate.py"), "import sys\nsys.exit(1)\n").unwrap();
    run(1);
    let out = repo.orch(&["diff", "previous", "latest", "--color", "never"]);
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(
        text.contains("REGRESSIONS (2)") && !text.contains("FLAKY"),
        "{text}"
    );
    // The caller's GIT_DIR does not lead memra-orch to another repository.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_memra-orch"))
        .current_dir(repo.path())
        .env("GIT_DIR", outside.path())
        .args(["run", "m.toml", "--gpus", "none", "--progress", "quiet"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let sha = repo.git(&["rev-parse", "HEAD"]);
    assert_eq!(
        crate::run_support::runs_in(&repo.path().join("receipts").join(&sha).join("ext")).len(),
        3,
        "filed under the repository's own commit"
    );
}

#[test]
fn unselected_cells_are_carried_only_from_the_code_this_run_tests() {
    let Some((repo, outside)) = outside_gate_repo() else {
        return;
    };
    let _keep = outside;
    // A dirty tree: one `-dirty` folder for every state of the uncommitted file.
    std::fs::write(repo.path().join("notes.txt"), "v1").unwrap();
    assert_eq!(repo.run("m.toml").status.code(), Some(0));
    std::fs::write(repo.path().join("notes.txt"), "v2").unwrap();
    let out = repo.orch(&[
        "run",
        "m.toml",
        "--gpus",
        "none",
        "--progress",
        "quiet",
        "--filter",
        "a",
    ]);
    assert_eq!(out.status.code(), Some(0));
    let sha = repo.git(&["rev-parse", "HEAD"]);
    let tree = crate::run_support::newest_run(
        &repo
            .path()
            .join("receipts")
            .join(format!("{sha}-dirty"))
            .join("ext"),
    );
    let run: Value =
        serde_json::from_slice(&std::fs::read(tree.join("run.json")).unwrap()).unwrap();
    let b = run["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["id"] == "b")
        .unwrap();
    assert_eq!(b["verdict"], "skipped", "{run:#}");
    assert!(
        b["reason"]
            .as_str()
            .unwrap()
            .contains("tested other code (git:"),
        "{b:#}"
    );
}

#[test]
fn the_morning_diff_reads_every_manifest() {
    let Some((repo, outside)) = outside_gate_repo() else {
        return;
    };
    let gate = outside.path().join("gate.py");
    std::fs::write(
        repo.path().join("other.toml"),
        format!(
            "schema = 1\nname = \"other\"\n[defaults]\ngpus = 0\n[[arm]]\nid = \"c\"\nrun = [\"python3\", \"{}\"]\n",
            gate.display()
        ),
    )
    .unwrap();
    repo.commit(&[], "two");
    assert_eq!(repo.run("m.toml").status.code(), Some(0));
    assert_eq!(repo.run("other.toml").status.code(), Some(0));
    std::fs::write(&gate, "import sys\nsys.exit(1)\n").unwrap();
    assert_eq!(repo.run("m.toml").status.code(), Some(1));
    std::fs::write(&gate, "import sys\nsys.exit(0)\n").unwrap();
    assert_eq!(repo.run("other.toml").status.code(), Some(0));
    // The newest run is `other`'s, green; `ext` regressed the night before it.
    let out = repo.orch(&["diff", "--color", "never"]);
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(
        text.contains("=== ext ===") && text.contains("=== other ==="),
        "{text}"
    );
    assert!(text.contains("REGRESSIONS (2)"), "{text}");
    let (_, code) = {
        let out = repo.orch(&["diff", "--manifest", "other", "--format", "json"]);
        (out.stdout, out.status.code())
    };
    assert_eq!(code, Some(0));
}
