//! `memra-orch bisect` over a scratch repository of 32 commits: a manifest whose `build`
//! setup copies the fixture gate into place, commit 19 changes the gate's arithmetic (its
//! artifact moves bits), commit 23 does not build, commit 25 makes the gate fail. `--bits`
//! finds 19, plain bisect finds 25, each in at most 6 tested commits, the user's checkout
//! untouched; the commit that does not build is skipped and reported; a flaky cell stops the
//! search; Ctrl-C removes the worktrees and `--resume` continues from the receipts made.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::diff_support::{Repo, have_git};

const CELL: &str = "gate[shape=a]";

const MANIFEST: &str = r#"schema = 1
name = "bisect-fixture"

[[setup]]
id = "build"
run = ["sh", "build.sh"]
produces = ["bin/gate"]

[[arm]]
id = "gate"
needs = ["build"]
run = ["sh", "bin/gate", "${matrix.shape}"]
matrix = { shape = ["a"] }

[[arm]]
id = "other"
run = ["sh", "-c", "exit 0"]
"#;

const BUILD: &str = "mkdir -p bin\n\
if [ -e src/broken ]; then echo 'src/broken: this commit does not build' >&2; exit 1; fi\n\
cp src/gate.sh bin/gate\n";

/// The gate: writes a safetensors file of one F32 tensor `logits` [1, 2] whose second
/// value is `$SECOND` (four little-endian bytes as octal escapes), then passes or fails.
fn gate(second: &str, fail: bool, pre: &str) -> String {
    let header = r#"{"logits":{"dtype":"F32","shape":[1,2],"data_offsets":[0,8]}}"#;
    format!(
        "{pre}f=\"$MEMRA_ORCH_ARTIFACTS/logits.safetensors\"\n\
         printf '\\{len:03o}\\000\\000\\000\\000\\000\\000\\000' > \"$f\"\n\
         printf '%s' '{header}' >> \"$f\"\n\
         printf '\\000\\000\\200\\077{second}' >> \"$f\"\n\
         echo '{{\"doors\":{{\"backend\":\"cpu\"}}}}' >> \"$MEMRA_ORCH_CHECKS\"\n\
         {tail}\n",
        len = header.len(),
        tail = if fail {
            "echo '{\"check\":\"logits\",\"status\":\"fail\",\"message\":\"logits out of bounds\"}' >> \"$MEMRA_ORCH_CHECKS\"; exit 1"
        } else {
            "echo '{\"check\":\"logits\",\"status\":\"pass\"}' >> \"$MEMRA_ORCH_CHECKS\"; exit 0"
        }
    )
}

/// 1.0f and 2.0f, little-endian, as printf octal escapes.
const ONE: &str = "\\000\\000\\200\\077";
const TWO: &str = "\\000\\000\\000\\100";

/// The 32 commits; returns their shas, index k-1 for commit k.
fn scratch_repo() -> (Repo, Vec<String>) {
    let repo = Repo::new();
    let mut shas = Vec::new();
    for k in 1..=32 {
        let mut files: Vec<(&str, String)> = vec![("history.txt", format!("commit {k}\n"))];
        if k == 1 {
            files.push(("manifest.toml", MANIFEST.to_string()));
            files.push(("build.sh", BUILD.to_string()));
            files.push((".gitignore", "receipts/\nbin/\n".to_string()));
        }
        match k {
            1 => files.push(("src/gate.sh", gate(ONE, false, ""))),
            19 => files.push(("src/gate.sh", gate(TWO, false, ""))),
            25 => files.push(("src/gate.sh", gate(TWO, true, ""))),
            23 => files.push(("src/broken", "x\n".to_string())),
            _ => {}
        }
        if k == 24 {
            repo.git(&["rm", "-q", "src/broken"]);
        }
        let files: Vec<(&str, &str)> = files.iter().map(|(p, t)| (*p, t.as_str())).collect();
        shas.push(repo.commit(&files, &format!("commit {k}")));
    }
    (repo, shas)
}

fn bisect(repo: &Repo, args: &[&str]) -> (i32, Value, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_memra-orch"))
        .current_dir(repo.path())
        .arg("bisect")
        .args(["--gpus", "none", "--format", "json", "--grace", "1s"])
        .args(if args.contains(&"--resume") {
            &[][..]
        } else {
            &["--manifest", "manifest.toml"][..]
        })
        .args(args)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let report = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    (out.status.code().unwrap_or(-1), report, stderr)
}

fn tested_shas(report: &Value) -> Vec<String> {
    report["tested"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["commit"]["sha"].as_str().unwrap().to_string())
        .collect()
}

/// What must not change in the user's checkout: HEAD, the status (ignored files too: no
/// build output may appear in it; the receipts folder, where bisect files its runs, aside)
/// and the worktree list.
fn checkout_state(repo: &Repo) -> (String, String, String) {
    let status = repo.git(&["status", "--porcelain", "--ignored"]);
    (
        repo.git(&["rev-parse", "HEAD"]),
        status
            .lines()
            .filter(|l| *l != "!! receipts/")
            .collect::<Vec<_>>()
            .join("\n"),
        repo.git(&["worktree", "list", "--porcelain"]),
    )
}

#[test]
fn bits_finds_the_commit_that_moved_them_and_plain_finds_the_one_that_fails() {
    if !have_git() {
        eprintln!("skipped: git is not installed");
        return;
    }
    let (repo, shas) = scratch_repo();
    let before = checkout_state(&repo);

    let (code, report, stderr) = bisect(
        &repo,
        &["--good", &shas[0], "--bad", &shas[31], "--bits", CELL],
    );
    assert_eq!(code, 0, "{stderr}\n{report:#}");
    assert_eq!(report["outcome"]["kind"], "found");
    assert_eq!(
        report["culprit"]["commit"]["sha"],
        shas[18].as_str(),
        "{report:#}"
    );
    assert_eq!(report["culprit"]["commit"]["subject"], "commit 19");
    assert_eq!(report["culprit"]["commit"]["author"], "t <t@t>");
    assert_eq!(report["parent"]["commit"]["sha"], shas[17].as_str());
    assert_eq!(report["parent"]["verdict"], "pass");
    let tested = tested_shas(&report);
    assert!(tested.len() <= 6, "{} tested: {tested:?}", tested.len());
    // The quantified difference, as `diff` reports it: one value of two moved, 1.0 → 2.0.
    let moved = &report["diff"]["bits_moved"][0];
    assert_eq!(moved["id"], CELL, "{report:#}");
    let tensor = &moved["artifacts"][0]["tensors"][0];
    assert_eq!(tensor["name"], "logits");
    assert_eq!(
        (tensor["differ"].as_u64(), tensor["values"].as_u64()),
        (Some(1), Some(2))
    );
    assert_eq!(tensor["max_abs"], 1.0);
    assert_eq!(checkout_state(&repo), before);

    let (code, report, stderr) = bisect(&repo, &["--good", &shas[0], "--bad", &shas[31], CELL]);
    assert_eq!(code, 0, "{stderr}\n{report:#}");
    assert_eq!(
        report["culprit"]["commit"]["sha"],
        shas[24].as_str(),
        "{report:#}"
    );
    assert_eq!(report["culprit"]["verdict"], "fail");
    assert_eq!(report["parent"]["verdict"], "pass");
    let tested = tested_shas(&report);
    assert!(tested.len() <= 6, "{} tested: {tested:?}", tested.len());
    // Commit 23 does not build: tested, skipped, and said why.
    let broken = report["tested"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["commit"]["sha"] == shas[22].as_str())
        .unwrap_or_else(|| panic!("commit 23 was not tested: {report:#}"));
    assert_eq!(broken["status"], "skipped");
    assert_eq!(broken["runs"][0]["verdict"], "blocked", "{broken:#}");
    assert!(stderr.contains("skipped"), "{stderr}");
    // The receipts are filed under each tested commit, in the user's receipts folder.
    for sha in &tested {
        assert!(
            repo.path()
                .join("receipts")
                .join(sha)
                .join("bisect-fixture")
                .is_dir(),
            "no receipts for {sha}"
        );
    }
    assert_eq!(checkout_state(&repo), before);

    // Asked again, the same search reuses every receipt it made and runs nothing.
    let (code, again, stderr) = bisect(&repo, &["--good", &shas[0], "--bad", &shas[31], CELL]);
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(again["culprit"], report["culprit"]);
    assert_eq!(again["ran"], 0, "{again:#}");
    assert_eq!(tested_shas(&again), tested);

    // Another cell of the same runs was not selected there, so it has no measurement to
    // reuse: its bisect runs its own.
    let (code, other, stderr) = bisect(&repo, &["--good", &shas[0], "--bad", &shas[3], "other"]);
    assert_eq!(code, 1, "{stderr}\n{other:#}");
    assert_eq!(other["outcome"]["kind"], "no-change");
    assert!(other["ran"].as_u64() > Some(0), "{other:#}");
    // And the gate's bisect, asked once more, still reuses its own runs, not the ones the
    // other cell's bisect made at the same commits (where it was skipped, not selected).
    let (code, again, _) = bisect(&repo, &["--good", &shas[0], "--bad", &shas[31], CELL]);
    assert_eq!((code, again["ran"].as_u64()), (0, Some(0)), "{again:#}");

    // The text report: the answer first, the culprit and its parent, every tested commit.
    let out = Command::new(env!("CARGO_BIN_EXE_memra-orch"))
        .current_dir(repo.path())
        .args([
            "bisect",
            "--gpus",
            "none",
            "--manifest",
            "manifest.toml",
            "--bits",
        ])
        .args(["--good", &shas[0], "--bad", &shas[31], CELL])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    eprintln!("{text}");
    let first = text.lines().next().unwrap_or_default();
    assert!(
        first.starts_with(&shas[18][..10]) && first.contains("moved its bits: commit 19 (t <t@t>)"),
        "{text}"
    );
    assert!(text.contains("logits"), "{text}");
    assert!(text.contains("from receipts"), "{text}");
}

#[test]
fn a_range_without_change_and_a_good_commit_that_is_bad_are_told_apart() {
    if !have_git() {
        eprintln!("skipped: git is not installed");
        return;
    }
    let (repo, shas) = scratch_repo();
    // Commits 2..18 change nothing the cell sees.
    let (code, report, stderr) = bisect(
        &repo,
        &["--good", &shas[1], "--bad", &shas[17], "--bits", CELL],
    );
    assert_eq!(code, 1, "{stderr}\n{report:#}");
    assert_eq!(report["outcome"]["kind"], "no-change");
    // Commit 26 already fails: it is no good commit.
    let (code, report, stderr) = bisect(&repo, &["--good", &shas[25], "--bad", &shas[31], CELL]);
    assert_eq!(code, 2, "{stderr}\n{report:#}");
    assert_eq!(report["outcome"]["kind"], "good-is-bad");
    // Reversed, the range is refused before anything runs.
    let (code, _, stderr) = bisect(&repo, &["--good", &shas[31], "--bad", &shas[0], CELL]);
    assert_eq!(code, 2);
    assert!(stderr.contains("not an ancestor"), "{stderr}");
    // An unknown cell names the cells of its node.
    let (code, _, stderr) = bisect(
        &repo,
        &["--good", &shas[0], "--bad", &shas[31], "gate[shape=b]"],
    );
    assert_eq!(code, 2);
    assert!(stderr.contains("gate[shape=a]"), "{stderr}");
}

#[test]
fn a_flaky_cell_stops_the_search() {
    if !have_git() {
        eprintln!("skipped: git is not installed");
        return;
    }
    let repo = Repo::new();
    // The gate fails every other time it runs, counting in a file outside the repository.
    let counter = repo.path().with_extension("count");
    let pre = format!(
        "n=$(cat '{c}' 2>/dev/null || echo 0); echo $((n + 1)) > '{c}'\n\
         if [ $((n % 2)) = 1 ]; then echo '{{\"check\":\"logits\",\"status\":\"fail\"}}' >> \"$MEMRA_ORCH_CHECKS\"; exit 1; fi\n",
        c = counter.display()
    );
    let mut shas = Vec::new();
    for k in 1..=8 {
        let mut files: Vec<(&str, String)> = vec![("history.txt", format!("commit {k}\n"))];
        if k == 1 {
            files.push(("manifest.toml", MANIFEST.to_string()));
            files.push(("build.sh", BUILD.to_string()));
            files.push((".gitignore", "receipts/\nbin/\n".to_string()));
            files.push(("src/gate.sh", gate(ONE, false, &pre)));
        }
        let files: Vec<(&str, &str)> = files.iter().map(|(p, t)| (*p, t.as_str())).collect();
        shas.push(repo.commit(&files, &format!("commit {k}")));
    }
    let (code, report, stderr) = bisect(
        &repo,
        &["--good", &shas[0], "--bad", &shas[7], "--reps", "2", CELL],
    );
    let _ = std::fs::remove_file(&counter);
    assert_eq!(code, 5, "{stderr}\n{report:#}");
    assert_eq!(report["outcome"]["kind"], "flaky");
    let message = report["outcome"]["message"].as_str().unwrap();
    assert!(message.contains("is flaky at"), "{message}");
    assert!(message.contains("no culprit is named"), "{message}");
    assert!(report.get("culprit").is_none());
}

#[test]
fn ctrl_c_removes_the_worktrees_and_resume_continues() {
    if !have_git() {
        eprintln!("skipped: git is not installed");
        return;
    }
    let (repo, shas) = scratch_repo();
    let before = checkout_state(&repo);
    let mut child = Command::new(env!("CARGO_BIN_EXE_memra-orch"))
        .current_dir(repo.path())
        .args([
            "bisect", "--gpus", "none", "--format", "json", "--grace", "1s",
        ])
        .args(["--manifest", "manifest.toml"])
        .args(["--good", &shas[0], "--bad", &shas[31], CELL])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Interrupt once the first commit has been tested.
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut seen = String::new();
    for line in lines.by_ref() {
        let line = line.unwrap();
        seen.push_str(&line);
        seen.push('\n');
        if line.trim_start().starts_with('#') || Instant::now() > deadline {
            break;
        }
    }
    // SAFETY: kill with the pid of a child this test spawned and has not reaped.
    unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGINT) };
    let rest: Vec<String> = lines.map_while(Result::ok).collect();
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(130), "{seen}{}", rest.join("\n"));
    assert_eq!(checkout_state(&repo), before, "a worktree was left behind");
    assert!(
        repo.path()
            .join("receipts/.memra-bisect/last.json")
            .exists(),
        "the interrupted search is not kept for --resume"
    );

    let (code, report, stderr) = bisect(&repo, &["--resume"]);
    assert_eq!(code, 0, "{stderr}\n{report:#}");
    assert_eq!(report["culprit"]["commit"]["sha"], shas[24].as_str());
    assert!(
        report["tested"]
            .as_array()
            .unwrap()
            .iter()
            .any(|t| t["runs"][0]["reused"] == true),
        "the resumed search reused nothing: {report:#}"
    );
    assert!(
        !repo
            .path()
            .join("receipts/.memra-bisect/last.json")
            .exists()
    );
    // Nothing is left to resume.
    let (code, _, stderr) = bisect(&repo, &["--resume"]);
    assert_eq!(code, 2);
    assert!(stderr.contains("no unfinished bisection"), "{stderr}");
}

/// A gate whose second artifact names its commit (as a receipt that names its binary's hash
/// does): `--bits` alone stops at the first commit, `--artifact` looks past it.
#[test]
fn artifact_globs_leave_out_what_moves_on_every_commit() {
    if !have_git() {
        eprintln!("skipped: git is not installed");
        return;
    }
    let stamp = "cat history.txt > \"$MEMRA_ORCH_ARTIFACTS/stamp.txt\"\n";
    let repo = Repo::new();
    let mut shas = Vec::new();
    for k in 1..=12 {
        let mut files: Vec<(&str, String)> = vec![("history.txt", format!("commit {k}\n"))];
        if k == 1 {
            files.push(("manifest.toml", MANIFEST.to_string()));
            files.push(("build.sh", BUILD.to_string()));
            files.push((".gitignore", "receipts/\nbin/\n".to_string()));
            files.push(("src/gate.sh", gate(ONE, false, stamp)));
        }
        if k == 7 {
            files.push(("src/gate.sh", gate(TWO, false, stamp)));
        }
        let files: Vec<(&str, &str)> = files.iter().map(|(p, t)| (*p, t.as_str())).collect();
        shas.push(repo.commit(&files, &format!("commit {k}")));
    }
    let range = [
        "--good",
        shas[0].as_str(),
        "--bad",
        shas[11].as_str(),
        "--bits",
    ];
    let (code, report, stderr) = bisect(&repo, &[&range[..], &[CELL]].concat());
    assert_eq!(code, 0, "{stderr}\n{report:#}");
    assert_eq!(
        report["culprit"]["commit"]["sha"],
        shas[1].as_str(),
        "{report:#}"
    );
    let args = [&range[..], &["--artifact", "*.safetensors", CELL]].concat();
    let (code, report, stderr) = bisect(&repo, &args);
    assert_eq!(code, 0, "{stderr}\n{report:#}");
    assert_eq!(
        report["culprit"]["commit"]["sha"],
        shas[6].as_str(),
        "{report:#}"
    );
    let (code, _, stderr) = bisect(&repo, &[&range[..], &["--artifact", "[", CELL]].concat());
    assert_eq!(code, 2);
    assert!(stderr.contains("is not a glob"), "{stderr}");
}
