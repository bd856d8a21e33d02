//! Fail closed: a run that cannot meet its GPU requirement (`[require] gpus`, or
//! `--require-gpus`, which overrides it) refuses with exit 4 before anything runs, naming
//! what it found and what was required; a run that meets it but skips a cell for lack of
//! GPUs is not as expected (exit 1); without a requirement skips stay harmless (exit 0).

use std::process::Output;

use crate::run_support::Fixture;

const REQUIRED: &str = r#"
schema = 1
name = "required"

[require]
gpus = 2

[[arm]]
id = "one"
run = ["{gates}/pass.sh"]
gpus = 1

[[arm]]
id = "four"
run = ["{gates}/pass.sh"]
gpus = 4
"#;

const UNSTATED: &str = r#"
schema = 1
name = "unstated"

[[arm]]
id = "one"
run = ["{gates}/pass.sh"]
gpus = 1
"#;

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Asserts that a run refused: exit 4, and no receipt folder or run.json written.
fn refused(f: &Fixture, out: &Output) -> String {
    assert_eq!(out.status.code(), Some(4), "{}", stderr(out));
    assert!(
        !f.path().join("receipts").exists(),
        "a refused run wrote receipts"
    );
    assert!(f.runs().is_empty());
    stderr(out)
}

#[test]
fn a_manifest_requirement_refuses_a_machine_without_the_gpus() {
    let f = Fixture::new(REQUIRED);
    let err = refused(&f, &f.run(&["--gpus", "none"]));
    assert!(
        err.contains("memra-orch run: 0 GPUs detected (--gpus none); the manifest requires 2 (")
            && err.contains("manifest.toml [require] gpus)")
            && err.contains("run on a machine with 2 GPUs, or pass --require-gpus 0"),
        "{err}"
    );
    let err = refused(&f, &f.run(&["--gpus", "fake:1"]));
    assert!(err.contains("1 GPU detected (--gpus fake:1)"), "{err}");
}

#[test]
fn the_command_line_requirement_refuses_and_overrides_the_manifest() {
    let f = Fixture::new(UNSTATED);
    let err = refused(&f, &f.run(&["--gpus", "none", "--require-gpus", "1"]));
    assert!(
        err.contains(
            "0 GPUs detected (--gpus none); the command line requires 1 (--require-gpus 1)"
        ),
        "{err}"
    );
    // Without a requirement a machine without GPUs skips the cell and the run is green.
    let out = f.run(&["--gpus", "none"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(f.verdict("one"), "skipped");

    // `--require-gpus` wins over `[require]`, both ways.
    let g = Fixture::new(REQUIRED);
    refused(&g, &g.run(&["--gpus", "fake:4", "--require-gpus", "5"]));
    let out = g.run(&["--gpus", "fake:1", "--require-gpus", "0"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(g.verdict("one"), "pass");
    assert_eq!(g.verdict("four"), "skipped");
}

#[test]
fn a_required_run_that_skips_a_cell_for_lack_of_gpus_is_not_as_expected() {
    let f = Fixture::new(REQUIRED);
    // Two GPUs meet the requirement, so the run starts; the 4-GPU cell cannot be held.
    let out = f.run(&["--gpus", "fake:2"]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert_eq!(f.verdict("one"), "pass");
    assert_eq!(f.verdict("four"), "skipped");
    assert_eq!(f.receipt("four")["reason"], "needs 4 GPUs, 2 detected");
    let err = stderr(&out);
    assert!(
        err.contains("1 cell was skipped for lack of resources while the run requires 2 GPUs"),
        "{err}"
    );
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("NOT all as expected"),
        "the summary agrees with the exit code"
    );
    // So do run.json and summary.md, which say why.
    let run = f.run_json();
    assert_eq!(run["verdict"], "fail", "{run:#}");
    assert!(
        run["unmet"]
            .as_str()
            .is_some_and(|u| u.contains("skipped for lack of resources")),
        "{run:#}"
    );
    let summary = std::fs::read_to_string(f.tree().join("summary.md")).unwrap();
    assert!(summary.contains("Verdict: **fail**"), "{summary}");
    assert!(summary.contains("**Requirement not met:**"), "{summary}");
    // With enough GPUs nothing is skipped and the run is green.
    let out = f.run(&["--gpus", "fake:4"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(f.verdict("four"), "pass");
    let run = f.run_json();
    assert_eq!(run["verdict"], "pass", "{run:#}");
    assert!(run.get("unmet").is_none(), "{run:#}");
}
