//! What keeps a verdict from reading greener than the truth, beyond the commit digest (see
//! `any_engine_verdicts`): a canary passes only on the checks it names (`expect_fail`), a
//! compare reads what its sides wrote whatever their checks said, `warn` rows show wherever
//! verdicts do, external inputs and fingerprints join the digest (and fail closed), and the
//! diff lists a failing arm before the compares it blocked.

use std::path::Path;
use std::process::Command;

use crate::run_support::{Fixture, gates, validate};

/// A shell gate writing the given check rows (`name:status` each) and exiting `code`.
fn rows_gate(rows: &[&str], code: i32) -> String {
    let mut s = String::new();
    for r in rows {
        let (name, status) = r.split_once(':').unwrap();
        s.push_str(&format!(
            "echo '{{\"check\":\"{name}\",\"status\":\"{status}\",\"message\":\"{name} says {status}\"}}' >> \"$MEMRA_ORCH_CHECKS\"; "
        ));
    }
    s.push_str(&format!("exit {code}"));
    s
}

#[test]
fn a_canary_passes_only_on_the_checks_it_names() {
    let manifest = format!(
        r#"
schema = 1
name = "canaries"

[defaults]
gpus = 0
shell = true

[[arm]]
id = "right"
run = '''{right}'''
expect_fail = ["gate2*"]

[[arm]]
id = "wrong"
run = '''{wrong}'''
expect_fail = ["gate2*"]

[[arm]]
id = "also-wrong"
run = '''{both}'''
expect_fail = ["gate2*"]
expect = "fail"

[[arm]]
id = "any"
run = '''{wrong}'''
expect = "fail"

[[arm]]
id = "silent"
run = "exit 1"
expect_fail = ["gate2*"]

[[arm]]
id = "tied"
run = '''{tied}'''
expect_fail = ["tied[[]T=1,top_k=8]"]

[[arm]]
id = "reps"
reps = 2
run = '''if [ "$MEMRA_ORCH_REP" = 1 ]; then {wrong}; else {right}; fi'''
expect_fail = ["gate2*"]
"#,
        right = rows_gate(&["gate1:pass", "gate2.batch:fail"], 1),
        wrong = rows_gate(&["gate2.batch:pass", "gate3:fail"], 1),
        both = rows_gate(&["gate2.batch:fail", "gate3:fail"], 1),
        tied = rows_gate(&["tied[T=1,top_k=8]:fail", "tied[T=1,top_k=40]:pass"], 1),
    );
    let f = Fixture::new(&manifest);
    let out = f.run(&[]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(f.verdict("right"), "pass");
    assert_eq!(f.verdict("any"), "pass", "no globs: any failure will do");
    assert_eq!(f.verdict("tied"), "pass", "`[[]` is a literal bracket");
    for (id, why) in [
        (
            "wrong",
            "failed for the wrong reason: check gate3 failed: gate3 says fail; expect_fail = [\"gate2*\"]",
        ),
        (
            "also-wrong",
            "failed for the wrong reason: check gate3 failed: gate3 says fail; expect_fail = [\"gate2*\"]",
        ),
        ("silent", "failed for the wrong reason: no check row failed"),
        (
            "reps",
            "check gate3 failed: gate3 says fail; expect_fail = [\"gate2*\"] (rep 1 of 2)",
        ),
    ] {
        let r = f.receipt(id);
        assert_eq!(r["verdict"], "fail", "{id}: {r:#}");
        let reason = r["reason"].as_str().unwrap();
        assert!(reason.contains(why), "{id}: {reason}");
    }
    assert_eq!(
        f.receipt("right")["expect_fail"],
        serde_json::json!(["gate2*"])
    );
    // `plan` shows what each canary must fail.
    let plan = Command::new(env!("CARGO_BIN_EXE_memra-orch"))
        .arg("plan")
        .arg(f.path().join("manifest.toml"))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&plan.stdout);
    assert!(text.contains("right  gpus=0 expect=fail[gate2*]"), "{text}");
}

#[test]
fn expect_fail_and_hermetic_are_checked_before_anything_runs() {
    let (code, e) = validate(
        "schema = 1\nname = \"x\"\n[[arm]]\nid = \"a\"\nrun = [\"true\"]\nexpect_fail = []\n[[arm]]\nid = \"b\"\nrun = [\"true\"]\nexpect = \"pass\"\nexpect_fail = [\"g*\"]\n[[arm]]\nid = \"c\"\nrun = [\"true\"]\nexpect_fail = [\"tied[T=1\"]\n[[arm]]\nid = \"d\"\nrun = [\"true\"]\nhermetic = true\n",
    );
    assert_eq!(code, 2, "{e}");
    assert!(e.contains("`expect_fail` of `a` names no check"), "{e}");
    assert!(
        e.contains("`b` has `expect_fail` but `expect = \"pass\"`"),
        "{e}"
    );
    assert!(
        e.contains("`expect_fail` entry \"tied[T=1\" is not a valid glob"),
        "{e}"
    );
    assert!(
        e.contains("`hermetic = true` on `d`, which declares no `inputs`"),
        "{e}"
    );
    assert!(e.contains("4 problems found"), "{e}");
}

#[test]
fn compares_read_what_was_written_whatever_the_checks_said() {
    let f = Fixture::new(
        r#"
schema = 1
name = "written"

[defaults]
gpus = 0
shell = true

[[arm]]
id = "reference"
run = "{gates}/logits.sh same"

[[arm]]
id = "failed-but-wrote"
run = "{gates}/logits.sh same; echo '{\"check\":\"unrelated\",\"status\":\"fail\"}' >> \"$MEMRA_ORCH_CHECKS\"; exit 1"

[[arm]]
id = "failed-wrote-nothing"
run = "{gates}/fail.sh"

[[arm]]
id = "crashed"
run = "{gates}/logits.sh same; exit 3"

[[compare]]
id = "cmp"
reference = "reference"
candidates = ["failed-but-wrote", "failed-wrote-nothing", "crashed"]
artifact = "logits.safetensors"
policy = "bitwise"
"#,
    );
    assert_eq!(f.run(&[]).status.code(), Some(1));
    assert_eq!(f.verdict("failed-but-wrote"), "fail");
    // The unrelated failed check does not keep the compare from reading the bits.
    let ran = f.receipt("cmp[candidate=failed-but-wrote]");
    assert_eq!(ran["verdict"], "pass", "{ran:#}");
    let nothing = f.receipt("cmp[candidate=failed-wrote-nothing]");
    assert_eq!(nothing["verdict"], "blocked");
    assert_eq!(
        nothing["reason"],
        "needs failed-wrote-nothing, which ended fail and wrote no logits.safetensors"
    );
    let crashed = f.receipt("cmp[candidate=crashed]");
    assert_eq!(crashed["verdict"], "blocked");
    assert_eq!(crashed["reason"], "needs crashed, which ended crash");
}

#[test]
fn warn_rows_show_wherever_verdicts_do() {
    let f = Fixture::new(&format!(
        r#"
schema = 1
name = "warned"

[defaults]
gpus = 0
shell = true

[[arm]]
id = "rows"
run = '''if [ -f warn-now ]; then {warn}; else {pass}; fi'''
"#,
        warn = rows_gate(&["accuracy:pass", "drift:warn"], 0),
        pass = rows_gate(&["accuracy:pass", "drift:pass"], 0),
    ));
    assert_eq!(f.run(&[]).status.code(), Some(0));
    std::fs::write(f.path().join("warn-now"), "").unwrap();
    let out = f.run(&[]);
    assert_eq!(out.status.code(), Some(0), "warn does not fail a run");
    let progress = String::from_utf8_lossy(&out.stderr);
    assert!(
        progress.contains("pass+warn") && progress.contains("[warn: drift: drift says warn]"),
        "{progress}"
    );
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(table.contains("warn: 1 cell reported warn rows"), "{table}");
    let summary = std::fs::read_to_string(f.tree().join("summary.md")).unwrap();
    assert!(
        summary.contains("**Warnings:** 1 cell reported 1 warn row"),
        "{summary}"
    );
    assert!(
        summary.contains("| rows | arm | pass+warn |")
            && summary.contains("warn: drift: drift says warn"),
        "{summary}"
    );
    let junit = std::fs::read_to_string(f.tree().join("junit.xml")).unwrap();
    assert!(
        junit.contains(r#"<property name="warn" value="1"/>"#),
        "{junit}"
    );
    assert!(junit.contains("warn drift: drift says warn"), "{junit}");
    let run = f.run_json();
    assert_eq!(run["nodes"][0]["warns"], 1);
    let orch = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_memra-orch"))
            .args(args)
            .arg("--receipts")
            .arg(f.path().join("receipts"))
            .current_dir(f.path())
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        )
    };
    let (code, diff) = orch(&["diff", "previous", "latest", "--color", "never"]);
    assert_eq!(code, Some(0), "{diff}");
    assert!(diff.contains("WARN (1)"), "{diff}");
    assert!(
        diff.contains("rows  drift: pass → warn  drift says warn"),
        "{diff}"
    );
    let (_, history) = orch(&["history", "rows"]);
    assert!(history.contains("pass+warn 1"), "{history}");
    let site = f.path().join("site");
    let (code, _) = orch(&["report", "--html", site.to_str().unwrap()]);
    assert_eq!(code, Some(0));
    let index = std::fs::read_to_string(site.join("index.html")).unwrap();
    assert!(
        index.contains("data-markers=\"warn\""),
        "the warn marker is on the matrix"
    );
}

#[test]
fn external_inputs_and_fingerprints_join_the_digest_and_fail_closed() {
    let outside = tempfile::tempdir().unwrap();
    let site = outside.path().join("site-packages/llama_cpp");
    std::fs::create_dir_all(&site).unwrap();
    std::fs::write(site.join("libllama.so"), "v1").unwrap();
    let version = outside.path().join("version");
    std::fs::write(&version, "0.3.36\n").unwrap();
    let manifest = format!(
        r#"
schema = 1
name = "external"

[defaults]
gpus = 0
shell = true

[fingerprints]
engine = ["sh", "-c", "cat {version}"]

[[arm]]
id = "gate"
inputs = ["{site}/*.so"]
hermetic = true
run = "echo ran >> runs && {{gates}}/pass.sh"
"#,
        version = version.display(),
        site = site.display(),
    );
    let f = Fixture::new(&manifest);
    let runs = || std::fs::read_to_string(f.path().join("runs")).map_or(0, |s| s.lines().count());
    assert_eq!(f.run(&[]).status.code(), Some(0));
    let r = f.receipt("gate");
    assert_eq!(r["code"], "hermetic");
    assert_eq!(
        r["input_files"][0]["path"],
        site.join("libllama.so").to_string_lossy().as_ref()
    );
    assert_eq!(r["fingerprints"][0]["name"], "engine");
    assert_eq!(r["fingerprints"][0]["first_line"], "0.3.36");
    assert_eq!(f.run_json()["fingerprints"][0]["first_line"], "0.3.36");
    // Nothing changed: --resume keeps the receipt.
    assert_eq!(f.run(&["--resume"]).status.code(), Some(0));
    assert_eq!(runs(), 1);
    // The engine's library changed: the cell runs again.
    std::fs::write(site.join("libllama.so"), "v2").unwrap();
    assert_eq!(f.run(&["--resume"]).status.code(), Some(0));
    assert_eq!(runs(), 2);
    // So does a new version the fingerprint prints.
    std::fs::write(&version, "0.3.37\n").unwrap();
    assert_eq!(f.run(&["--resume"]).status.code(), Some(0));
    assert_eq!(runs(), 3);
    // A fingerprint that cannot be taken refuses the run before anything runs.
    std::fs::remove_file(&version).unwrap();
    let before = f.runs().len();
    let out = f.run(&[]);
    assert_eq!(out.status.code(), Some(4));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("fingerprint `engine`"), "{err}");
    assert!(err.contains("exited 1"), "{err}");
    assert_eq!(f.runs().len(), before, "a refused run leaves no tree");
    assert_eq!(runs(), 3);
    // An external glob that matches nothing ends the cell: the digest would miss the engine.
    std::fs::write(&version, "0.3.37\n").unwrap();
    std::fs::remove_file(site.join("libllama.so")).unwrap();
    assert_eq!(f.run(&[]).status.code(), Some(1));
    let r = f.receipt("gate");
    assert_eq!(r["verdict"], "error");
    assert!(
        r["reason"].as_str().unwrap().contains(
            "matches no file, so the inputs digest would not cover what the cell depends on"
        ),
        "{r:#}"
    );
    assert_eq!(runs(), 3);
}

#[test]
fn the_diff_lists_a_failing_arm_before_the_compares_it_blocked() {
    let f = Fixture::new(
        r#"
schema = 1
name = "causes"

[defaults]
gpus = 0
shell = true

[[arm]]
id = "z-candidate"
run = "if [ -f broken ]; then exit 3; fi; {gates}/logits.sh same"

[[arm]]
id = "z-reference"
run = "{gates}/logits.sh same"

[[compare]]
id = "a-compare"
reference = "z-reference"
candidates = ["z-candidate"]
artifact = "logits.safetensors"
policy = "bitwise"
"#,
    );
    assert_eq!(f.run(&[]).status.code(), Some(0));
    std::fs::write(f.path().join("broken"), "").unwrap();
    assert_eq!(f.run(&[]).status.code(), Some(1));
    let out = Command::new(env!("CARGO_BIN_EXE_memra-orch"))
        .args([
            "diff",
            "previous",
            "latest",
            "--color",
            "never",
            "--receipts",
        ])
        .arg(f.path().join("receipts"))
        .current_dir(f.path())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let arm = text.find("  z-candidate").unwrap();
    let cmp = text.find("  a-compare[candidate=z-candidate]").unwrap();
    assert!(arm < cmp, "{text}");
}

#[test]
fn own_output_never_dirties_the_commit() {
    if !crate::diff_support::have_git() {
        eprintln!("skipped: needs git");
        return;
    }
    // A repository that ignores nothing memra-orch writes.
    let repo = crate::diff_support::Repo::new();
    std::fs::remove_file(repo.path().join(".gitignore")).unwrap();
    let sha = repo.commit(
        &[(
            "m.toml",
            &format!(
                "schema = 1\nname = \"own\"\n[defaults]\ngpus = 0\n[[arm]]\nid = \"a\"\nrun = [\"{}/pass.sh\"]\n",
                gates().display()
            ),
        )],
        "one",
    );
    let run = |extra: &[&str]| {
        let mut args = vec!["run", "m.toml", "--gpus", "none", "--progress", "quiet"];
        args.extend_from_slice(extra);
        let out = repo.orch(&args);
        assert_eq!(out.status.code(), Some(0));
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let first = run(&["--metrics-file", "nightly.prom"]);
    assert!(!first.contains("uncommitted"), "{first}");
    assert_eq!(
        repo.orch(&["report", "--html", "site"]).status.code(),
        Some(0)
    );
    let second = run(&[]);
    assert!(!second.contains("uncommitted"), "{second}");
    let commits: Vec<String> = std::fs::read_dir(repo.path().join("receipts"))
        .unwrap()
        .flatten()
        .filter(|e| {
            e.file_type().unwrap().is_dir() && !e.file_name().to_string_lossy().starts_with('.')
        })
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(
        commits,
        std::slice::from_ref(&sha),
        "both runs are filed under the clean commit"
    );
    // A real change is still one.
    std::fs::write(repo.path().join("new.py"), "x").unwrap();
    let third = run(&[]);
    assert!(
        third.contains("uncommitted changes") && third.contains("new.py"),
        "{third}"
    );
    assert!(
        !third.contains("site/") && !third.contains("nightly.prom"),
        "{third}"
    );
    assert!(Path::new(&repo.path().join("receipts").join(format!("{sha}-dirty"))).is_dir());
}

#[test]
fn the_morning_diff_names_a_newer_run_that_never_finished_and_fails() {
    let f = Fixture::new(&format!(
        "schema = 1\nname = \"morning\"\n[defaults]\ngpus = 0\n[[arm]]\nid = \"a\"\nrun = [\"{}/pass.sh\"]\n",
        gates().display()
    ));
    let diff = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_memra-orch"))
            .arg("diff")
            .args(args)
            .arg("--receipts")
            .arg(f.path().join("receipts"))
            .current_dir(f.path())
            .output()
            .unwrap()
    };
    assert_eq!(f.run(&[]).status.code(), Some(0));
    // One run: nothing to compare; the exit is the run's own.
    let out = diff(&[]);
    assert_eq!(out.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&out.stdout).contains("only one finished run of `morning`"));
    assert_eq!(f.run(&[]).status.code(), Some(0));
    assert_eq!(diff(&[]).status.code(), Some(0));
    // A third run killed while it ran: run.json without an end.
    let last = f.tree();
    // A minute from now: the newest run, and within the clock slack (not of unknown age).
    let at = std::time::SystemTime::now() + std::time::Duration::from_secs(60);
    let start = humantime::format_rfc3339_millis(at).to_string();
    let id: String = start.chars().filter(|c| *c != '-' && *c != ':').collect();
    let id = format!("{id}-dead");
    let killed = last.with_file_name(&id);
    std::fs::create_dir(&killed).unwrap();
    let mut run: serde_json::Value =
        serde_json::from_slice(&std::fs::read(last.join("run.json")).unwrap()).unwrap();
    run["end"] = serde_json::Value::Null;
    run["verdict"] = "running".into();
    run["start"] = start.clone().into();
    run["run_id"] = id.clone().into();
    run["nodes"] = serde_json::json!([]);
    std::fs::write(killed.join("run.json"), run.to_string()).unwrap();
    let out = diff(&["--color", "never"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains(&format!("run {id} of `morning`")) && err.contains("has not finished"),
        "{err}"
    );
    // The finished runs are still compared: no lost coverage from the empty one.
    assert!(String::from_utf8_lossy(&out.stdout).contains("no differences"));
}
