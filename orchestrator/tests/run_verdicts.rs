//! How attempts become verdicts: reps, retries, `expect = "fail"`, the protocol's
//! consistency rule, text verdict regexes, crashes, and `blocked` dependents.

use crate::run_support::Fixture;

#[test]
fn reps_retries_and_expect() {
    let f = Fixture::new(
        r#"
schema = 1
name = "verdicts"

[defaults]
gpus = 0

[[arm]]
id = "reps"
run = ["{gates}/pass.sh"]
reps = 3

[[arm]]
id = "flaky"
run = ["{gates}/flaky.sh"]
retries = 2

[[arm]]
id = "crash-no-retry"
run = ["{gates}/flaky.sh"]

[[arm]]
id = "fail-never-retried"
run = ["{gates}/fail.sh"]
retries = 3
reps = 2

[[arm]]
id = "canary"
run = ["{gates}/fail.sh"]
expect = "fail"
reps = 2

[[arm]]
id = "canary-missed"
run = ["{gates}/pass.sh"]
expect = "fail"
"#,
    );
    let out = f.run(&[]);
    assert_eq!(out.status.code(), Some(1));

    let reps = f.receipt("reps");
    assert_eq!(reps["verdict"], "pass");
    let rep_numbers: Vec<i64> = reps["attempts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["rep"].as_i64().unwrap())
        .collect();
    assert_eq!(rep_numbers, [1, 2, 3]);
    assert_eq!(reps["checks"][0]["check"], "always");
    assert_eq!(reps["doors"]["backend"], "cpu");

    let flaky = f.receipt("flaky");
    assert_eq!(flaky["verdict"], "pass");
    let outcomes: Vec<&str> = flaky["attempts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["outcome"].as_str().unwrap())
        .collect();
    assert_eq!(outcomes, ["crash", "pass"]);

    let crash = f.receipt("crash-no-retry");
    assert_eq!(crash["verdict"], "crash");
    assert_eq!(crash["attempts"][0]["exit"], 3);

    let fail = f.receipt("fail-never-retried");
    assert_eq!(fail["verdict"], "fail");
    assert_eq!(
        fail["attempts"].as_array().unwrap().len(),
        1,
        "no retry after fail, no second rep"
    );
    assert_eq!(
        fail["reason"],
        "check always failed: row 1 differs (rep 1 of 2)"
    );
    assert_eq!(fail["checks"][0]["first_mismatch"]["index"], 7);

    let canary = f.receipt("canary");
    assert_eq!(canary["verdict"], "pass");
    assert_eq!(canary["expect"], "fail");
    assert_eq!(canary["attempts"].as_array().unwrap().len(), 2);
    let missed = f.receipt("canary-missed");
    assert_eq!(missed["verdict"], "fail");
    assert!(
        missed["reason"]
            .as_str()
            .unwrap()
            .contains("expect = \"fail\" but the gate passed")
    );

    let junit = std::fs::read_to_string(f.tree().join("junit.xml")).unwrap();
    assert!(junit.contains("flakyError"), "{junit}");
    assert!(junit.contains("name=\"canary-missed\""), "{junit}");
}

#[test]
fn protocol_violations_are_errors() {
    let f = Fixture::new(
        r#"
schema = 1
name = "protocol"

[defaults]
gpus = 0
retries = 2

[[arm]]
id = "exit0-with-fail-row"
run = ["{gates}/lie-pass.sh"]

[[arm]]
id = "exit1-without-fail-row"
run = ["{gates}/lie-fail.sh"]

[[arm]]
id = "honest"
run = ["{gates}/pass.sh"]
"#,
    );
    assert_eq!(f.run(&[]).status.code(), Some(1));
    let a = f.receipt("exit0-with-fail-row");
    assert_eq!(a["verdict"], "error");
    assert!(
        a["reason"]
            .as_str()
            .unwrap()
            .contains("exit 0 (pass) but check hidden reported fail"),
        "{a:#}"
    );
    assert_eq!(
        a["attempts"].as_array().unwrap().len(),
        1,
        "a protocol error is not retried"
    );
    let b = f.receipt("exit1-without-fail-row");
    assert_eq!(b["verdict"], "error");
    assert!(
        b["reason"]
            .as_str()
            .unwrap()
            .contains("exit 1 (fail) but no check row reported fail"),
        "{b:#}"
    );
    assert_eq!(f.verdict("honest"), "pass");
}

#[test]
fn text_verdicts_judge_printing_gates() {
    let f = Fixture::new(
        r#"
schema = 1
name = "text"

[defaults]
gpus = 0
verdict = { pass = "^ALL GREEN", fail = "FAIL" }

[[arm]]
id = "green"
run = ["{gates}/say.sh", "warming up", "ALL GREEN"]

[[arm]]
id = "red"
run = ["{gates}/say.sh", "case 3: FAIL", "ALL GREEN"]

[[arm]]
id = "silent"
run = ["{gates}/say.sh", "nothing to report"]
"#,
    );
    assert_eq!(f.run(&[]).status.code(), Some(1));
    assert_eq!(f.verdict("green"), "pass");
    let red = f.receipt("red");
    assert_eq!(red["verdict"], "fail");
    assert!(
        red["reason"].as_str().unwrap().contains("case 3: FAIL"),
        "{red:#}"
    );
    let silent = f.receipt("silent");
    assert_eq!(silent["verdict"], "fail");
    assert!(
        silent["reason"]
            .as_str()
            .unwrap()
            .contains("no stdout line matched verdict.pass"),
        "{silent:#}"
    );
}

#[test]
fn dependents_of_a_failure_are_blocked_naming_it() {
    let f = Fixture::new(
        r#"
schema = 1
name = "blocked"

[defaults]
gpus = 0

[[setup]]
id = "build"
run = ["{gates}/fail.sh"]

[[arm]]
id = "gate"
needs = ["build"]
run = ["{gates}/pass.sh"]

[[arm]]
id = "downstream"
needs = ["gate"]
run = ["{gates}/pass.sh"]

[[arm]]
id = "missing-program"
run = ["./no-such-gate"]
"#,
    );
    assert_eq!(f.run(&[]).status.code(), Some(1));
    assert_eq!(f.verdict("build"), "fail");
    let gate = f.receipt("gate");
    assert_eq!(gate["verdict"], "blocked");
    assert_eq!(gate["reason"], "needs build, which ended fail");
    let down = f.receipt("downstream");
    assert_eq!(down["verdict"], "blocked");
    assert_eq!(
        down["reason"],
        "needs gate, which ended blocked: needs build, which ended fail"
    );
    let missing = f.receipt("missing-program");
    assert_eq!(missing["verdict"], "error");
    assert!(
        missing["reason"].as_str().unwrap().contains("cannot start"),
        "{missing:#}"
    );
}

#[test]
fn setups_check_products_and_skip_when_created() {
    let f = Fixture::new(
        r#"
schema = 1
name = "setups"

[defaults]
gpus = 0

[[setup]]
id = "already-built"
run = ["{gates}/fail.sh"]
creates = ["${root}/built.txt"]
produces = ["${root}/built.txt"]

[[setup]]
id = "forgets-product"
run = ["{gates}/pass.sh"]
produces = ["${root}/never-written.txt"]

[[arm]]
id = "uses-build"
needs = ["already-built"]
run = ["{gates}/pass.sh"]
"#,
    );
    std::fs::write(f.path().join("built.txt"), "binary").unwrap();
    assert_eq!(f.run(&[]).status.code(), Some(1));
    let built = f.receipt("already-built");
    assert_eq!(built["verdict"], "pass");
    assert!(
        built["attempts"].as_array().unwrap().is_empty(),
        "a setup whose creates exist does not run"
    );
    assert_eq!(built["produces"][0]["bytes"], 6);
    let uses = f.receipt("uses-build");
    assert_eq!(uses["verdict"], "pass");
    assert!(
        uses["binaries"]
            .as_array()
            .unwrap()
            .iter()
            .any(|b| b["sha256"] == built["produces"][0]["sha256"])
    );
    let forgot = f.receipt("forgets-product");
    assert_eq!(forgot["verdict"], "error");
    assert!(
        forgot["reason"]
            .as_str()
            .unwrap()
            .contains("did not produce"),
        "{forgot:#}"
    );
}

#[test]
fn negative_compares_pass_only_when_the_artifacts_differ() {
    let f = Fixture::new(
        r#"
schema = 1
name = "negative-compares"

[defaults]
gpus = 0

[[arm]]
id = "ref"
run = ["{gates}/logits.sh", "same"]

[[arm]]
id = "same"
run = ["{gates}/logits.sh", "same"]

[[arm]]
id = "moved"
run = ["{gates}/logits.sh", "moved"]

[[compare]]
id = "door-moved-bits"
reference = "ref"
candidates = ["moved"]
artifact = "logits.safetensors"
expect = "fail"

[[compare]]
id = "door-did-nothing"
reference = "ref"
candidates = ["same"]
artifact = "logits.safetensors"
expect = "fail"
"#,
    );
    let out = f.run(&[]);
    assert_eq!(
        out.status.code(),
        Some(1),
        "the negative compare that agreed fails the run"
    );

    let moved = f.receipt("door-moved-bits[candidate=moved]");
    assert_eq!(moved["verdict"], "pass");
    assert_eq!(moved["expect"], "fail");
    let reason = moved["reason"].as_str().unwrap();
    assert!(reason.starts_with("failed as expected: "), "{reason}");
    assert_eq!(
        moved["attempts"][0]["outcome"], "fail",
        "the attempt keeps the raw outcome"
    );

    let nothing = f.receipt("door-did-nothing[candidate=same]");
    assert_eq!(nothing["verdict"], "fail");
    let reason = nothing["reason"].as_str().unwrap();
    assert!(reason.contains("expect = \"fail\""), "{reason}");
}
