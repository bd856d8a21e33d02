//! `--fail-fast` and `--filter`.

use crate::run_support::Fixture;

#[test]
fn fail_fast_cancels_what_has_not_started() {
    let f = Fixture::new(
        r#"
schema = 1
name = "failfast"

[defaults]
gpus = 0

[[arm]]
id = "a-fails"
run = ["{gates}/fail.sh"]

[[arm]]
id = "b"
run = ["{gates}/pass.sh"]

[[arm]]
id = "c"
run = ["{gates}/pass.sh"]
"#,
    );
    assert_eq!(
        f.run(&["--jobs", "1", "--fail-fast"]).status.code(),
        Some(1)
    );
    assert_eq!(f.verdict("a-fails"), "fail");
    for id in ["b", "c"] {
        let r = f.receipt(id);
        assert_eq!(r["verdict"], "cancelled");
        assert_eq!(r["reason"], "not started: --fail-fast: a-fails ended fail");
    }
    // Without --fail-fast everything runs.
    assert_eq!(f.run(&["--jobs", "1"]).status.code(), Some(1));
    assert_eq!(f.verdict("b"), "pass");
    assert_eq!(f.verdict("c"), "pass");
}

#[test]
fn filter_runs_the_selection_and_what_it_needs() {
    let f = Fixture::new(
        r#"
schema = 1
name = "filter"

[defaults]
gpus = 0

[[setup]]
id = "prep"
run = ["{gates}/pass.sh"]

[[arm]]
id = "decode"
tags = ["fast"]
needs = ["prep"]
run = ["{gates}/pass.sh"]
matrix = { b = ["1", "2"] }

[[arm]]
id = "other"
run = ["{gates}/fail.sh"]
"#,
    );
    let out = f.run(&["--filter", "decode[b=2]"]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "the failing `other` is not selected"
    );
    assert_eq!(f.verdict("prep"), "pass");
    assert_eq!(f.verdict("decode[b=2]"), "pass");
    let run = f.run_json();
    for id in ["decode[b=1]", "other"] {
        let n = run["nodes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|n| n["id"] == id)
            .unwrap();
        assert_eq!(n["verdict"], "skipped");
        assert_eq!(n["reason"], "not selected by --filter");
        assert!(n["slug"].is_null(), "unselected cells write no receipt");
    }
    assert_eq!(run["filters"][0], "decode[b=2]");

    assert_eq!(f.run(&["--filter", "tag:fast"]).status.code(), Some(0));
    assert_eq!(f.verdict("decode[b=1]"), "pass");

    let bad = f.run(&["--filter", "no-such-node"]);
    assert_eq!(bad.status.code(), Some(2));
}

/// A second filtered run carries the first's receipts: a cell the first run skipped because
/// its dependency was not selected is finished once, not once as the carried dependency's
/// dependent and again as a carried receipt (plain progress would count past the total, and
/// run.json would name the cell twice).
#[test]
fn a_carried_skip_finishes_each_cell_once() {
    let f = Fixture::new(
        r#"
schema = 1
name = "carryskip"

[defaults]
gpus = 0

[[setup]]
id = "prep"
run = ["{gates}/pass.sh"]

[[arm]]
id = "needs-prep"
needs = ["prep"]
run = ["{gates}/pass.sh"]

[[arm]]
id = "alone"
run = ["{gates}/pass.sh"]
"#,
    );
    for _ in 0..2 {
        let out = f.run(&["--filter", "alone"]);
        assert_eq!(out.status.code(), Some(0));
        let err = String::from_utf8_lossy(&out.stderr);
        let lines: Vec<&str> = err.lines().filter(|l| l.starts_with('[')).collect();
        assert_eq!(lines.len(), 3, "{err}");
        assert!(
            lines
                .iter()
                .all(|l| l.contains("/3]") && !l.starts_with("[4")),
            "{err}"
        );
        assert_eq!(
            lines.iter().filter(|l| l.contains("needs-prep")).count(),
            1,
            "{err}"
        );
        let nodes = f.run_json()["nodes"].as_array().unwrap().clone();
        assert_eq!(nodes.len(), 3, "{nodes:#?}");
        assert_eq!(f.verdict("needs-prep"), "skipped");
    }
}
