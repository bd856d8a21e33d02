//! Ten nights of a battery over six commits, as cron leaves them: a cell that regresses on
//! night 4 (its declared input changed), one that flips with nothing it reads changing
//! (flaky: nights 5 and 6 share a commit), one whose artifact bits move on night 7 (a new
//! commit) and again on night 8 (the same commit: nondeterministic), and one that leaves the
//! manifest on night 9 (lost). The commit is an input of every cell. `history` (text and
//! JSON) must show each timeline, whatever state the index is in; `diff` must call a flip
//! flaky only between runs of one commit, keep every change across commits a regression or
//! bits moved (marked "known flaky" where the cell has shown it), and fail only on those;
//! `last-green:CELL` and `@DAY` must name the right nights.

use serde_json::Value;

use crate::diff_support::{Repo, have_git, stdout};

/// The gate of every cell: `state/<cell>` holds `<status> <artifact bytes> <metric>`.
const GATE: &str = r#"#!/bin/sh
read status bits metric < "state/$1"
printf '%s' "$bits" > "$MEMRA_ORCH_ARTIFACTS/out.bin"
echo "{\"check\":\"accuracy\",\"status\":\"$status\",\"metrics\":{\"max_abs\":$metric}}" >> "$MEMRA_ORCH_CHECKS"
[ "$status" = pass ]
"#;

fn manifest(with_lost: bool) -> String {
    let mut m = String::from(
        "schema = 1\nname = \"battery\"\n\n[defaults]\ngpus = 0\ntimeout = \"1m\"\n\n",
    );
    for cell in ["steady", "regress", "flaky", "nondet", "lost"] {
        if cell == "lost" && !with_lost {
            continue;
        }
        m.push_str(&format!(
            "[[arm]]\nid = \"{cell}\"\nrun = [\"./night.sh\", \"{cell}\"]\n"
        ));
        if cell == "regress" {
            // Only this cell declares its state file, so only its inputs digest moves.
            m.push_str("inputs = [\"state/regress\"]\n");
        }
        m.push('\n');
    }
    m
}

struct Nights {
    repo: Repo,
    /// Run ids, night 1 first.
    runs: Vec<String>,
}

fn ten_nights() -> Option<Nights> {
    if !have_git() {
        eprintln!("skipped: git is not available, and the nights run at commits");
        return None;
    }
    let repo = Repo::new();
    std::fs::create_dir_all(repo.path().join("state")).unwrap();
    let gate = repo.path().join("night.sh");
    std::fs::write(&gate, GATE).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&gate, std::fs::Permissions::from_mode(0o755)).unwrap();
    let set = |cell: &str, text: &str| {
        std::fs::write(repo.path().join("state").join(cell), format!("{text}\n")).unwrap();
    };
    // Which commit each night runs at (six commits), and the cells' states per night.
    let commit_of = [1, 1, 2, 2, 3, 3, 4, 4, 5, 6];
    let mut sha = String::new();
    let mut runs = Vec::new();
    for night in 1..=10usize {
        let c = commit_of[night - 1];
        if night == 1 || commit_of[night - 2] != c {
            let m = manifest(c < 5);
            sha = repo.commit(
                &[
                    (".gitignore", "receipts/\nstate/\n"),
                    ("manifest.toml", &m),
                    ("notes.txt", &format!("commit {c}\n")),
                ],
                &format!("commit {c}"),
            );
        }
        set("steady", "pass same 0.5");
        set(
            "regress",
            if night < 4 {
                "pass r 0.5"
            } else {
                "fail r 0.5"
            },
        );
        set(
            "flaky",
            if night == 5 || night == 10 {
                "fail f 0.5"
            } else {
                "pass f 0.5"
            },
        );
        set(
            "nondet",
            match night {
                1..=6 => "pass bits-a 0.5",
                7 => "pass bits-b 0.5",
                _ => "pass bits-c 0.5",
            },
        );
        set("lost", "pass l 0.5");
        let out = repo.run("manifest.toml");
        let expect = if night < 4 { 0 } else { 1 };
        assert_eq!(out.status.code(), Some(expect), "night {night}");
        let tree = repo.tree(&sha, "battery");
        runs.push(tree.file_name().unwrap().to_string_lossy().into_owned());
    }
    Some(Nights { repo, runs })
}

fn short(sha: &str) -> String {
    sha.chars().take(12).collect()
}

fn json(out: &std::process::Output) -> Value {
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout)))
}

fn cell<'a>(h: &'a Value, id: &str) -> &'a Value {
    h["cells"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["id"] == id)
        .unwrap_or_else(|| panic!("no cell {id} in {h:#}"))
}

fn column(points: &Value, key: &str) -> Vec<Value> {
    points
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p[key].clone())
        .collect()
}

#[test]
fn ten_nights_of_history_aliases_and_flaky_cells() {
    let Some(n) = ten_nights() else { return };
    let repo = &n.repo;
    let index = repo.path().join("receipts/.memra-index/index.sqlite");
    let db = rusqlite::Connection::open(&index).unwrap();
    let filed: i64 = db
        .query_row(
            "SELECT count(*) FROM runs WHERE manifest = 'battery'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(filed, 10, "every run filed its rows");
    drop(db);

    // history, JSON: one point per night for every cell, oldest first.
    let out = repo.orch(&["history", "--format", "json"]);
    assert_eq!(out.status.code(), Some(0));
    let h = json(&out);
    let ids: Vec<&str> = h["runs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, n.runs);
    let regress = &cell(&h, "regress")["points"];
    let v = |s: &str| Value::from(s);
    assert_eq!(
        column(regress, "verdict"),
        [
            "pass", "pass", "pass", "fail", "fail", "fail", "fail", "fail", "fail", "fail"
        ]
        .map(v)
    );
    let changed: Vec<bool> = column(regress, "inputs_changed")
        .iter()
        .map(|b| b.as_bool().unwrap())
        .collect();
    // The commit is an input: its inputs change with every new commit (nights 3, 5, 7, 9,
    // 10) and with its declared input on night 4.
    assert_eq!(
        changed,
        [
            false, false, true, true, true, false, true, false, true, true
        ],
    );
    assert_eq!(regress[3]["metrics"]["accuracy/max_abs"], 0.5);
    let flaky = &cell(&h, "flaky")["points"];
    assert_eq!(
        column(flaky, "inputs_changed"),
        [
            false, false, true, false, true, false, true, false, true, true
        ]
        .map(Value::from),
        "the flaky cell's inputs change with the commit only"
    );
    assert_eq!(flaky[4]["verdict"], "fail");
    assert_eq!(flaky[4]["good"], false);
    assert_eq!(flaky[4]["code_known"], true);
    let nondet = &cell(&h, "nondet")["points"];
    let moved: Vec<usize> = (0..10)
        .filter(|&i| nondet[i]["bits_moved"] == true)
        .collect();
    assert_eq!(moved, [6, 7], "bits move on nights 7 and 8");
    let lost = &cell(&h, "lost")["points"];
    let absent: Vec<usize> = (0..10).filter(|&i| lost[i]["absent"] == true).collect();
    assert_eq!(absent, [8, 9], "the lost cell is an explicit absent point");
    assert!(lost[9].get("verdict").is_none(), "{:#}", lost[9]);

    // The index is only a cache: gone, or torn, the answer is the same.
    std::fs::remove_file(&index).unwrap();
    let again = json(&repo.orch(&["history", "--format", "json"]));
    assert_eq!(again, h, "rebuilt from the trees");
    // A database cut short, or overwritten, is rebuilt (and says so on stderr).
    let _ = std::fs::remove_file(index.with_extension("sqlite-wal"));
    let bytes = std::fs::read(&index).unwrap();
    std::fs::write(&index, &bytes[..bytes.len() / 2]).unwrap();
    let out = repo.orch(&["history", "--format", "json"]);
    assert_eq!(json(&out), h, "a cut database is rebuilt from the trees");
    std::fs::write(&index, b"not a database at all").unwrap();
    let out = repo.orch(&["history", "--format", "json"]);
    assert_eq!(json(&out), h, "so is one overwritten");
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        said.contains("rebuilding it from the run folders"),
        "{said}"
    );

    // history, text: a filter, the markers, --last.
    let out = repo.orch(&["history", "regress"]);
    assert_eq!(out.status.code(), Some(0));
    let text = stdout(&out);
    assert!(text.starts_with("history of battery: 10 runs"), "{text}");
    assert!(text.contains("regress  (1 flip)"), "{text}");
    assert!(
        !text.contains("flaky"),
        "the filter selects one cell:\n{text}"
    );
    let night4 = text.lines().find(|l| l.contains(&n.runs[3])).unwrap();
    assert!(
        night4.contains("fail") && night4.contains("inputs changed"),
        "{night4}"
    );
    assert!(night4.contains("accuracy/max_abs=0.5"), "{night4}");
    let text = stdout(&repo.orch(&["history", "non*", "--last", "4"]));
    assert_eq!(
        text.lines().filter(|l| l.contains("Z-")).count(),
        4,
        "{text}"
    );
    assert!(
        text.lines()
            .any(|l| l.contains(&n.runs[6]) && l.contains("bits moved")),
        "{text}"
    );
    let md = stdout(&repo.orch(&["history", "lost", "--format", "markdown"]));
    assert!(
        md.contains("### `lost`") && md.contains("| absent |"),
        "{md}"
    );
    let out = repo.orch(&["history", "flakey"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("did you mean \"flaky\""), "{err}");

    // Aliases.
    let dir_of = |spec: &str| {
        let out = repo.orch(&["show", spec, "--format", "json"]);
        json(&out)["run_id"].as_str().unwrap().to_string()
    };
    assert_eq!(
        dir_of("last-green"),
        n.runs[2],
        "night 3 was the last green one"
    );
    assert_eq!(dir_of("last-green:regress"), n.runs[2]);
    assert_eq!(dir_of("last-green:flaky"), n.runs[8]);
    assert_eq!(dir_of("last-green:lost"), n.runs[7]);
    let today = &n.runs[9][..8];
    let day = format!("@{}-{}-{}", &today[..4], &today[4..6], &today[6..8]);
    assert_eq!(dir_of(&day), n.runs[9], "the last run of the day");
    let out = repo.orch(&["show", "@1999-01-01"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("no run of battery started on that UTC day among 10 runs"),
        "{err}"
    );
    let out = repo.orch(&["show", "last-green:regres"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("did you mean \"regress\""), "{err}");
    let out = repo.orch(&["show", "@yesterday"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("@YYYY-MM-DD"));

    // diff last-green latest (night 3 → night 10, three commits apart): every change is
    // across digests, so the flaky cell's flip is a regression too — marked known flaky,
    // since it flipped at one commit (nights 5 and 6) — and the nondeterministic cell's
    // bits moved, marked likewise (nights 7 and 8). Nothing is set apart as a flake.
    let out = repo.orch(&["diff", "last-green", "latest", "--color", "never"]);
    assert_eq!(out.status.code(), Some(1));
    let text = stdout(&out);
    let commit3 = short(&repo.git(&["rev-list", "--max-count=1", "--skip=3", "HEAD"]));
    let commit4 = short(&repo.git(&["rev-list", "--max-count=1", "--skip=2", "HEAD"]));
    for needle in [
        "REGRESSIONS (2)",
        "LOST COVERAGE (1)",
        "BITS MOVED (1)",
        &format!(
            "[known flaky: flipped on identical inputs at {commit3} (run {})",
            n.runs[5]
        ),
        &format!(
            "nondet   pass  [known nondeterministic: its bits moved on identical inputs at {commit4} (run {})]",
            n.runs[7]
        ),
    ] {
        assert!(text.contains(needle), "{needle:?} missing from\n{text}");
    }
    assert!(!text.contains("FLAKY ("), "{text}");
    assert!(!text.contains("NONDETERMINISTIC ("), "{text}");
    let out = repo.orch(&["diff", "last-green", "latest", "--format", "json"]);
    let d = json(&out);
    let ids = |key: &str| -> Vec<String> {
        d[key]
            .as_array()
            .unwrap_or_else(|| panic!("no {key} in {d:#}"))
            .iter()
            .map(|x| x["id"].as_str().unwrap().to_string())
            .collect()
    };
    // Plan order: `regress` is listed before `flaky` in the manifest.
    assert_eq!(ids("regressions"), ["regress", "flaky"]);
    assert!(d["regressions"][0].get("known_flaky").is_none(), "{d:#}");
    assert!(d["regressions"][1]["known_flaky"].is_string(), "{d:#}");
    assert!(ids("flaky").is_empty());
    assert_eq!(ids("bits_moved"), ["nondet"]);
    assert!(ids("nondeterministic").is_empty());

    // At one commit, the same flip is flaky (nights 5 → 6: a would-be fix) and the same
    // move nondeterministic (nights 7 → 8); neither fails the diff unless --flaky-fails, and
    // a shorter window counts fewer flips.
    let pair = |a: usize, b: usize, extra: &[&str]| {
        let mut args = vec!["diff", &n.runs[a], &n.runs[b], "--color", "never"];
        args.extend(extra);
        repo.orch(&args)
    };
    let out = pair(4, 5, &[]);
    assert_eq!(out.status.code(), Some(0), "a flaky cell is no regression");
    let text = stdout(&out);
    assert!(
        text.contains("FLAKY (1)")
            && text.contains("flaky    fail → pass  inputs unchanged; flipped 2 times in the last 6 runs (not as expected in 1)"),
        "{text}"
    );
    assert_eq!(pair(4, 5, &["--flaky-fails"]).status.code(), Some(1));
    let text = stdout(&pair(4, 5, &["--flaky-window", "2"]));
    assert!(
        text.contains("flipped 1 time in the last 2 runs (not as expected in 1)"),
        "{text}"
    );
    let md = stdout(&pair(4, 5, &["--format", "markdown"]));
    assert!(md.contains("### Flaky (1)"), "{md}");
    let out = pair(6, 7, &[]);
    assert_eq!(out.status.code(), Some(0));
    let text = stdout(&out);
    assert!(
        text.contains("NONDETERMINISTIC (1)") && !text.contains("BITS MOVED"),
        "{text}"
    );
    assert_eq!(pair(6, 7, &["--flaky-fails"]).status.code(), Some(1));
    // Across commits the same flip is a regression (nights 9 → 10), marked, failing the
    // diff; so is night 4's, whose declared input changed, without a mark.
    let out = pair(8, 9, &[]);
    assert_eq!(
        out.status.code(),
        Some(1),
        "a flip across commits is a regression"
    );
    let text = stdout(&out);
    assert!(
        text.contains("REGRESSIONS (1)")
            && text.contains("known flaky")
            && !text.contains("FLAKY ("),
        "{text}"
    );
    let text = stdout(&pair(2, 3, &[]));
    assert!(
        text.contains("REGRESSIONS (1)")
            && !text.contains("FLAKY")
            && !text.contains("known flaky"),
        "{text}"
    );

    // gc drops deleted runs from the index; the last green run, older than the newest 4
    // here, stays as the baseline.
    let out = repo.orch(&["gc", "--keep", "4"]);
    assert_eq!(out.status.code(), Some(0));
    assert!(
        stdout(&out).contains("the last green run of its manifest"),
        "{}",
        stdout(&out)
    );
    let db = rusqlite::Connection::open(&index).unwrap();
    let filed: i64 = db
        .query_row("SELECT count(*) FROM runs", [], |r| r.get(0))
        .unwrap();
    assert_eq!(filed, 5, "gc dropped the deleted runs' rows");
    drop(db);
    let h = json(&repo.orch(&["history", "--format", "json"]));
    assert_eq!(h["runs"].as_array().unwrap().len(), 5);
}
