//! `memra-orch summary` and `[notify]` end to end: nights of a fixture battery (32 cells that
//! regress together, one whose artifact bits move), the morning message read as text,
//! markdown and JSON, and a notify command that records what it received. A red night with
//! 32 regressions must still fit 15 lines and say "and N more"; a green night with moved
//! bits must say so in its headline; a run that never finished makes the morning red.

use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::run_support::{Fixture, logged};

/// 32 cells driven by `${mode}` (pass or fail), one whose artifact is `${bits}`, and a
/// `[notify]` block appended by the tests that want one.
fn battery(notify: &str) -> Fixture {
    Fixture::new(&format!(
        r#"
schema = 1
name = "night"

[vars]
mode = "pass"
bits = "one"

{notify}

[[arm]]
id = "wide"
matrix = {{ i = ["00", "01", "02", "03", "04", "05", "06", "07", "08", "09", "10", "11", "12", "13", "14", "15", "16", "17", "18", "19", "20", "21", "22", "23", "24", "25", "26", "27", "28", "29", "30", "31"] }}
run = ["{{gates}}/nightly.sh", "${{mode}}", "0.75", "w"]
gpus = 0

[[arm]]
id = "moved"
run = ["{{gates}}/nightly.sh", "pass", "0.25", "${{bits}}"]
gpus = 0
"#
    ))
}

fn summary(f: &Fixture, args: &[&str]) -> Output {
    let all: Vec<&str> = std::iter::once("summary")
        .chain(args.iter().copied())
        .collect();
    crate::run_support::orch(f, &all)
}

fn text(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

#[test]
fn a_red_night_with_32_regressions_fits_15_lines_and_names_the_first_failing_check() {
    let f = battery("");
    assert_eq!(f.run(&[]).status.code(), Some(0));
    assert_eq!(
        f.run(&["--var", "mode=fail", "--var", "bits=two"])
            .status
            .code(),
        Some(1)
    );
    let out = summary(&f, &[]);
    assert_eq!(out.status.code(), Some(1), "a red night exits 1");
    let t = text(&out);
    let lines: Vec<&str> = t.lines().collect();
    assert!(lines.len() <= 15, "{} lines:\n{t}", lines.len());
    assert!(
        lines[0].starts_with("FAIL night run ") && lines[0].contains("32 regressions"),
        "{t}"
    );
    assert!(lines[0].contains("bits moved in 1 cell"), "{t}");
    assert!(lines[1].starts_with("33 cells: pass 1, fail 32"), "{t}");
    assert!(lines[1].contains("against previous"), "{t}");
    assert_eq!(
        lines[2],
        "REGRESSED wide[i=00] pass -> fail: quality: err 0.75 is above the bound 0.5"
    );
    let more = lines
        .iter()
        .find(|l| l.starts_with("and ") && l.contains("more regressions"))
        .unwrap_or_else(|| panic!("no `and N more`:\n{t}"));
    let listed = lines.iter().filter(|l| l.starts_with("REGRESSED")).count();
    let n: usize = more.split(' ').nth(1).unwrap().parse().unwrap();
    assert_eq!(listed + n, 32, "{t}");
    assert!(lines.contains(&"bits moved: moved (out.bin)"), "{t}");
    assert!(
        lines.last().unwrap().starts_with("more: memra-orch show "),
        "{t}"
    );

    // Markdown: the same lines as list items, ids in code spans, at most 15 lines.
    let md = text(&summary(&f, &["--format", "markdown"]));
    assert!(md.lines().count() <= 15, "{md}");
    assert!(md.starts_with("**FAIL** `night` run `"), "{md}");
    assert!(
        md.contains(
            "- **REGRESSED** `wide[i=00]` pass -> fail: quality: err 0.75 is above the bound 0.5"
        ),
        "{md}"
    );

    // JSON holds every list whole.
    let j: Value = serde_json::from_str(&text(&summary(&f, &["--format", "json"]))).unwrap();
    assert_eq!(j["verdict"], "fail");
    assert_eq!(j["regressions"].as_array().unwrap().len(), 32);
    assert_eq!(
        j["regressions"][31]["first_failing_check"],
        "quality: err 0.75 is above the bound 0.5"
    );
    assert_eq!(j["bits_moved"][0]["id"], "moved");
    assert_eq!(j["baseline"]["since"], "previous");

    // With a report address, the last line links the run's page there.
    let t = text(&summary(&f, &["--report-url", "https://ci.example/memra/"]));
    let last = t.lines().last().unwrap();
    assert!(
        last.starts_with("more: https://ci.example/memra/runs/") && last.ends_with(".html"),
        "{t}"
    );
}

#[test]
fn since_last_green_keeps_regressions_that_the_previous_night_already_had() {
    let f = battery("");
    f.run(&[]);
    f.run(&["--var", "mode=fail"]);
    f.run(&["--var", "mode=fail"]);
    // Against the run before: nothing new regressed, but the night is still red.
    let out = summary(&f, &[]);
    assert_eq!(out.status.code(), Some(1));
    let t = text(&out);
    assert!(t.lines().count() <= 15, "{t}");
    assert!(
        t.starts_with("FAIL ") && t.contains("32 still failing") && !t.contains("REGRESSED"),
        "{t}"
    );
    assert!(
        t.contains("FAILING wide[i=00] fail -> fail: quality: err 0.75 is above the bound 0.5 (and 31 more still failing)"),
        "{t}"
    );
    // Against the last green night: every one of them is a regression.
    let t = text(&summary(&f, &["--since", "last-green"]));
    assert!(
        t.contains("32 regressions") && t.contains("against last-green"),
        "{t}"
    );
    // A run named: the first one.
    let first = f.runs()[0].clone();
    let j: Value = serde_json::from_str(&text(&summary(
        &f,
        &["--since", first.to_str().unwrap(), "--format", "json"],
    )))
    .unwrap();
    assert_eq!(j["regressions"].as_array().unwrap().len(), 32);
    assert_eq!(j["baseline"]["since"], "named");
    // The run summarised cannot be its own baseline.
    let newest = f.runs().last().unwrap().clone();
    let out = summary(&f, &["--since", newest.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("names the run summarised"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn a_green_night_says_all_as_expected_and_whether_bits_moved() {
    let f = battery("");
    f.run(&[]);
    let out = summary(&f, &[]);
    assert_eq!(out.status.code(), Some(0));
    let t = text(&out);
    assert!(t.starts_with("PASS night run "), "{t}");
    assert!(
        t.contains("the first finished run: nothing to compare with"),
        "{t}"
    );
    f.run(&[]);
    let t = text(&summary(&f, &[]));
    assert!(t.contains(": all as expected, no bits moved"), "{t}");
    f.run(&["--var", "bits=two"]);
    let out = summary(&f, &[]);
    // Green, and the moved bits are in the headline, never hidden.
    assert_eq!(out.status.code(), Some(0));
    let t = text(&out);
    assert!(
        t.lines()
            .next()
            .unwrap()
            .ends_with(": all as expected, bits moved in 1 cell"),
        "{t}"
    );
}

#[test]
fn a_run_that_never_finished_makes_the_morning_red() {
    let f = Fixture::new(
        r#"
schema = 1
name = "killed"

[[arm]]
id = "ok"
run = ["{gates}/pass.sh"]
gpus = 0

[[arm]]
id = "long"
run = ["{gates}/wait-for.sh", "${root}/never"]
gpus = 0
"#,
    );
    // One finished night, then one killed mid-way (the box rebooted, the OOM killer).
    std::fs::write(f.path().join("never"), "").unwrap();
    assert_eq!(f.run(&[]).status.code(), Some(0));
    std::fs::remove_file(f.path().join("never")).unwrap();
    let mut run = f.spawn(&[]);
    let deadline = Instant::now() + Duration::from_secs(30);
    while f.runs().len() < 2 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_millis(300));
    run.stop();
    std::fs::write(f.path().join("never"), "").unwrap();
    let out = summary(&f, &[]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let t = text(&out);
    assert!(t.starts_with("FAIL killed run "), "{t}");
    assert!(t.contains("1 unfinished run"), "{t}");
    assert!(t.contains("never finished: "), "{t}");
}

/// A notify command that keeps what it got: stdin, the verdict and JSON variables, and a
/// secret from the environment it echoes (which `notify.log` must not keep).
fn recorder(dir: &Path) -> String {
    let script = dir.join("record.sh");
    std::fs::write(
        &script,
        "#!/bin/sh\nd=$(dirname \"$0\")\ncat > \"$d/got.txt\"\nprintf '%s' \"$MEMRA_SUMMARY_VERDICT\" > \"$d/verdict.txt\"\nprintf '%s' \"$MEMRA_SUMMARY_JSON\" > \"$d/json.txt\"\necho \"posted with token $CHAT_TOKEN\"\nexit ${NOTIFY_EXIT:-0}\n",
    )
    .unwrap();
    let mut p = std::fs::metadata(&script).unwrap().permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut p, 0o755);
    std::fs::set_permissions(&script, p).unwrap();
    script.to_string_lossy().into_owned()
}

#[test]
fn notify_sends_the_summary_on_a_red_night_and_keeps_quiet_on_a_green_one() {
    let dir = tempfile::tempdir().unwrap();
    let script = recorder(dir.path());
    let f = battery(&format!(
        "[notify]\ncommand = [\"{script}\"]\non = [\"fail\"]\n"
    ));
    let got = dir.path().join("got.txt");
    let green = f
        .command(&[])
        .env("CHAT_TOKEN", "s3cr3t-t0ken")
        .output()
        .unwrap();
    assert_eq!(green.status.code(), Some(0));
    assert!(
        !got.exists(),
        "a green night with on = [\"fail\"] sends nothing"
    );
    assert!(
        String::from_utf8_lossy(&green.stderr).contains("notify: not sent"),
        "{}",
        String::from_utf8_lossy(&green.stderr)
    );

    let red = f
        .command(&["--var", "mode=fail"])
        .env("CHAT_TOKEN", "s3cr3t-t0ken")
        .output()
        .unwrap();
    assert_eq!(red.status.code(), Some(1));
    let err = String::from_utf8_lossy(&red.stderr);
    assert!(err.contains("notify: sent the summary to"), "{err}");
    // It got exactly what `summary` prints for that night.
    let sent = std::fs::read_to_string(&got).unwrap();
    assert_eq!(sent, text(&summary(&f, &[])));
    assert!(sent.lines().count() <= 15);
    assert_eq!(
        std::fs::read_to_string(dir.path().join("verdict.txt")).unwrap(),
        "fail"
    );
    let j: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("json.txt")).unwrap())
            .unwrap();
    assert_eq!(j["regressions"].as_array().unwrap().len(), 32);
    // The whole JSON is in the run's folder; the command's output in notify.log, redacted.
    let tree = f.tree();
    let whole: Value =
        serde_json::from_str(&std::fs::read_to_string(tree.join("summary.json")).unwrap()).unwrap();
    assert_eq!(whole["verdict"], "fail");
    let log = std::fs::read_to_string(tree.join("notify.log")).unwrap();
    assert!(log.contains("posted with token"), "{log}");
    assert!(!log.contains("s3cr3t-t0ken"), "{log}");

    // --no-notify: nothing is sent.
    std::fs::remove_file(&got).unwrap();
    assert_eq!(
        f.run(&["--var", "mode=fail", "--no-notify"]).status.code(),
        Some(1)
    );
    assert!(!got.exists());
}

#[test]
fn a_failing_or_hanging_notify_command_is_said_and_never_changes_the_exit_code() {
    let dir = tempfile::tempdir().unwrap();
    let script = recorder(dir.path());
    let f = battery(&format!(
        "[notify]\ncommand = [\"{script}\"]\non = [\"always\"]\ntimeout = \"1s\"\n"
    ));
    let out = f.command(&[]).env("NOTIFY_EXIT", "3").output().unwrap();
    assert_eq!(out.status.code(), Some(0), "the gates decide the exit code");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("exited 3: the summary may not have reached anyone"),
        "{err}"
    );

    let hang =
        battery("[notify]\ncommand = [\"sleep\", \"30\"]\non = [\"always\"]\ntimeout = \"1s\"\n");
    let t = Instant::now();
    let out = hang.run(&[]);
    assert_eq!(out.status.code(), Some(0));
    assert!(t.elapsed() < Duration::from_secs(20), "{:?}", t.elapsed());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("did not finish within 1s and was stopped"),
        "{err}"
    );

    // A command that leaves a daemon holding its output (setsid) does not hold the run.
    let daemon = battery(
        "[notify]\ncommand = [\"sh\", \"-c\", \"setsid sleep 30 & echo posted\"]\non = [\"always\"]\n",
    );
    let t = Instant::now();
    let out = daemon.run(&[]);
    assert_eq!(out.status.code(), Some(0));
    assert!(t.elapsed() < Duration::from_secs(20), "{:?}", t.elapsed());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("notify: sent the summary to sh"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let missing =
        battery("[notify]\ncommand = [\"scripts/no-such-notifier\"]\non = [\"always\"]\n");
    let out = missing.run(&[]);
    assert_eq!(out.status.code(), Some(0));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("could not start"), "{err}");
}

#[test]
fn a_bad_notify_table_is_refused_with_the_fix() {
    for (table, says) in [
        ("[notify]\non = [\"fail\"]\n", "`[notify]` has no `command`"),
        (
            "[notify]\ncommand = [\"x\"]\non = [\"red\"]\n",
            "`[notify] on` holds \"red\", which is not a condition",
        ),
        ("[notify]\ncommand = []\n", "`[notify] command` is empty"),
        (
            "[notify]\ncommand = [\"x\"]\nsince = \"yesterday\"\n",
            "`[notify] since` \"yesterday\" is not a baseline",
        ),
        (
            "[notify]\ncommand = [\"x\"]\nformat = \"html\"\n",
            "`[notify] format` \"html\" is not a format",
        ),
        (
            "[notify]\ncommand = [\"x\"]\nwhen = \"always\"\n",
            "unknown key `when` in [notify]",
        ),
    ] {
        let f = battery(table);
        let out = Command::new(env!("CARGO_BIN_EXE_memra-orch"))
            .arg("validate")
            .arg(f.path().join("manifest.toml"))
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{table}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(says), "{table}: {err}");
    }
}

#[test]
fn summary_says_what_to_do_when_there_is_nothing_to_summarise() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("receipts")).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_memra-orch"))
        .args(["summary", "--receipts"])
        .arg(dir.path().join("receipts"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("no run under") && err.contains("memra-orch run"),
        "{err}"
    );
}

#[test]
fn retention_keeps_the_newest_and_the_last_green_run_and_gc_takes_age_and_size_limits() {
    let f = battery("[retention]\nkeep = 2\n");
    assert_eq!(f.run(&[]).status.code(), Some(0));
    for _ in 0..3 {
        f.run(&["--var", "mode=fail"]);
    }
    // Nights: green, red, red, red. Kept: the newest two and the green baseline.
    let runs = f.runs();
    assert_eq!(runs.len(), 3, "{runs:?}");
    let out = summary(&f, &["--since", "last-green"]);
    let t = text(&out);
    assert!(
        t.contains("32 regressions") && t.contains("against last-green"),
        "{t}"
    );
    // --no-retention deletes nothing.
    f.run(&["--var", "mode=fail", "--no-retention"]);
    assert_eq!(f.runs().len(), 4);

    let gc = |args: &[&str]| {
        let all: Vec<&str> = std::iter::once("gc").chain(args.iter().copied()).collect();
        crate::run_support::orch(&f, &all)
    };
    let none = gc(&[]);
    assert_eq!(none.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&none.stderr).contains("say what to keep"));
    // A size nothing but protected runs could meet: the rest would go, and gc says the
    // limit is not met (exit 1).
    let tiny = gc(&["--max-size", "1", "--dry-run"]);
    assert_eq!(tiny.status.code(), Some(1));
    let said = text(&tiny);
    assert_eq!(said.matches("would delete").count(), 2, "{said}");
    assert!(
        said.contains("(the oldest that could go to fit the size limit)"),
        "{said}"
    );
    assert!(
        String::from_utf8_lossy(&tiny.stderr).contains("over --max-size 1: every run left"),
        "{}",
        String::from_utf8_lossy(&tiny.stderr)
    );
    // Every run is older than a second by now; the newest and the baseline stay.
    std::thread::sleep(std::time::Duration::from_millis(1100));
    let old = gc(&["--older-than", "1s"]);
    assert_eq!(old.status.code(), Some(0));
    assert!(text(&old).contains("(older than 1s)"), "{}", text(&old));
    assert_eq!(f.runs().len(), 2);
    let bad = gc(&["--max-size", "lots"]);
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("not a size; write e.g. 50G"));
}

/// Writes an executable script into the fixture's folder.
fn script(f: &Fixture, name: &str, body: &str) {
    let path = f.path().join(name);
    std::fs::write(&path, body).unwrap();
    let mut p = std::fs::metadata(&path).unwrap().permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut p, 0o755);
    std::fs::set_permissions(&path, p).unwrap();
}

#[test]
fn bits_that_move_on_identical_inputs_are_in_the_headline_never_hidden_as_flaky() {
    let f = Fixture::new(
        r#"
schema = 1
name = "drift"

[[arm]]
id = "nd"
run = ["${root}/gate.sh"]
gpus = 0
"#,
    );
    // The gate's artifact follows a file no input names: its bits move on identical inputs.
    script(
        &f,
        "gate.sh",
        "#!/bin/sh\ncat \"$(dirname \"$0\")/drift\" > \"$MEMRA_ORCH_ARTIFACTS/out.bin\"\necho '{\"check\":\"q\",\"status\":\"pass\"}' >> \"$MEMRA_ORCH_CHECKS\"\n",
    );
    // In a git work tree (the code named, so identical inputs are evidence), `drift`
    // ignored: it is no input of the cell.
    let git = |args: &[&str]| crate::diff_support::git_at(f.path(), args);
    std::fs::write(
        f.path().join(".gitignore"),
        "drift\nreceipts/\ngpu-leases/\n",
    )
    .unwrap();
    git(&["init", "-q"]);
    git(&["add", "-A"]);
    git(&["commit", "-q", "-m", "gate"]);
    let night = || {
        logged(
            Command::new(env!("CARGO_BIN_EXE_memra-orch"))
                .arg("run")
                .arg(f.path().join("manifest.toml"))
                .current_dir(f.path())
                .env("MEMRA_GPU_LOCK_DIR", f.path().join("gpu-leases"))
                .output()
                .unwrap(),
        )
    };
    std::fs::write(f.path().join("drift"), "0").unwrap();
    assert_eq!(night().status.code(), Some(0));
    std::fs::write(f.path().join("drift"), "1").unwrap();
    assert_eq!(night().status.code(), Some(0));
    let t = text(&summary(&f, &[]));
    let head = t.lines().next().unwrap();
    assert!(
        head.ends_with("all as expected, bits moved in 1 cell (1 on identical inputs)"),
        "{t}"
    );
    assert!(
        t.contains("bits moved: nd [nondeterministic] (out.bin)"),
        "{t}"
    );
    assert!(!t.contains("flaky"), "{t}");
}

#[test]
fn a_secret_in_a_check_name_never_reaches_the_summary_or_the_receipt() {
    let dir = tempfile::tempdir().unwrap();
    let rec = recorder(dir.path());
    let f = Fixture::new(&format!(
        r#"
schema = 1
name = "leaky"

[env]
HF_TOKEN = "hf_abcdefSECRETVALUE"

[notify]
command = ["{rec}"]
on = ["always"]

[[arm]]
id = "leaky"
run = ["${{root}}/gate.sh"]
gpus = 0
"#
    ));
    script(
        &f,
        "gate.sh",
        "#!/bin/sh\necho \"{\\\"check\\\":\\\"auth $HF_TOKEN\\\",\\\"status\\\":\\\"fail\\\",\\\"message\\\":\\\"token $HF_TOKEN refused\\\"}\" >> \"$MEMRA_ORCH_CHECKS\"\nexit 1\n",
    );
    assert_eq!(f.run(&[]).status.code(), Some(1));
    let got = std::fs::read_to_string(dir.path().join("got.txt")).unwrap();
    assert!(
        got.contains("FAILING leaky fail: auth <redacted>: token <redacted> refused"),
        "{got}"
    );
    for text in [
        got,
        std::fs::read_to_string(dir.path().join("json.txt")).unwrap(),
        std::fs::read_to_string(f.tree().join("summary.json")).unwrap(),
        crate::run_support::read_text(&f.node_dir("leaky").join("receipt.json")).unwrap(),
    ] {
        assert!(!text.contains("SECRETVALUE"), "{text}");
    }
}

#[test]
fn a_newer_run_that_cannot_be_read_or_never_finished_makes_the_morning_red() {
    let f = battery("");
    f.run(&[]);
    f.run(&[]);
    f.run(&["--var", "mode=fail"]);
    let runs = f.runs();
    // The red night's run.json is damaged: the green night before it is no longer the news.
    std::fs::write(runs[2].join("run.json"), "{\"schema\": 1, \"na").unwrap();
    let out = summary(&f, &[]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let t = text(&out);
    assert!(t.contains("(its run.json cannot be read)"), "{t}");
    // `ls` cannot list it, and says so.
    let ls = crate::run_support::orch(&f, &["ls"]);
    assert_eq!(ls.status.code(), Some(0));
    assert!(
        String::from_utf8_lossy(&ls.stderr).contains("has no readable run.json"),
        "{}",
        String::from_utf8_lossy(&ls.stderr)
    );
    // An older run's summary is not blamed for what happened after it.
    let out = summary(&f, &[runs[0].to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
}

#[test]
fn the_summary_of_a_killed_run_lists_what_it_wrote() {
    let f = Fixture::new(
        r#"
schema = 1
name = "killed"

[[arm]]
id = "bad"
run = ["{gates}/fail.sh"]
gpus = 0

[[arm]]
id = "long"
needs = ["bad"]
run = ["{gates}/pass.sh"]
gpus = 0

[[arm]]
id = "hang"
run = ["{gates}/wait-for.sh", "${root}/never"]
gpus = 0
"#,
    );
    let mut run = f.spawn(&[]);
    let deadline = Instant::now() + Duration::from_secs(30);
    while !f.current_tree().is_some_and(|t| {
        t.join("nodes").is_dir()
            && crate::run_support::files_under(&t.join("nodes"))
                .iter()
                .any(|p| p.ends_with("receipt.json"))
    }) && Instant::now() < deadline
    {
        std::thread::sleep(Duration::from_millis(50));
    }
    run.stop();
    std::fs::write(f.path().join("never"), "").unwrap();
    let tree = f.runs().pop().unwrap();
    let out = summary(&f, &[tree.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    let t = text(&out);
    assert!(
        t.starts_with("FAIL killed run ") && t.contains("the run never finished"),
        "{t}"
    );
    assert!(
        t.contains("FAILING bad fail: check always failed: row 1 differs"),
        "{t}"
    );
    assert!(!t.contains("lost coverage"), "{t}");
}

#[test]
fn retention_never_deletes_the_run_applying_it_and_gc_names_an_unknown_manifest() {
    let f = battery("[retention]\nkeep = 1\n");
    assert_eq!(f.run(&[]).status.code(), Some(0));
    // The first run's clock was a little ahead: it still counts as now, so it sorts as the
    // newest when tonight's run ends.
    let first = f.runs()[0].clone();
    let ahead = humantime::format_rfc3339_millis(
        std::time::SystemTime::now() + std::time::Duration::from_secs(9 * 60),
    )
    .to_string();
    let path = first.join("run.json");
    let mut run: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    run["start"] = Value::String(ahead);
    std::fs::write(&path, run.to_string()).unwrap();
    let out = f.run(&["--var", "mode=fail"]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("the run applying it is never deleted by it"),
        "{err}"
    );
    assert_eq!(f.runs().len(), 2, "tonight's run stays");

    let gc = crate::run_support::orch(&f, &["gc", "--keep", "1", "--manifest", "nope"]);
    assert_eq!(gc.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&gc.stderr).contains("no run of manifest \"nope\""),
        "{}",
        String::from_utf8_lossy(&gc.stderr)
    );
}

#[test]
fn a_fifo_where_a_run_json_should_be_hangs_nothing() {
    let f = battery("");
    f.run(&[]);
    let odd = f.manifest_dir().join("20261205T000000.000Z-f1f0");
    std::fs::create_dir(&odd).unwrap();
    let fifo = std::ffi::CString::new(odd.join("run.json").to_str().unwrap()).unwrap();
    // SAFETY: mkfifo reads the NUL-terminated path and creates a FIFO there.
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o644) }, 0);
    let t = Instant::now();
    for args in [
        &["ls"][..],
        &["summary"],
        &["gc", "--keep", "5", "--dry-run"],
    ] {
        let out = crate::run_support::orch(&f, args);
        assert!(out.status.code().is_some(), "{args:?}");
    }
    assert_eq!(f.run(&[]).status.code(), Some(0));
    assert!(t.elapsed() < Duration::from_secs(30), "{:?}", t.elapsed());
}
