//! The regressions feed: `history --steps` and the report's `regressions.txt` /
//! `regressions.json`, over nights of a fixture whose metric steps once and whose other
//! metric only wobbles. The step is found at the night it happened, the wobble never is.

use serde_json::Value;

use crate::run_support::{Fixture, orch};

#[test]
fn a_metric_that_steps_is_in_the_feed_at_the_night_it_stepped_and_a_wobble_is_not() {
    let f = Fixture::new(
        r#"
schema = 1
name = "steps"

[vars]
err = "0.25"
wobble = "1.0"
logits = "same"

[[arm]]
id = "quality"
run = ["{gates}/nightly.sh", "pass", "${err}", "q"]
gpus = 0

[[arm]]
id = "timing"
run = ["{gates}/nightly.sh", "pass", "${wobble}", "t"]
gpus = 0

[[arm]]
id = "logits"
run = ["{gates}/logits.sh", "${logits}"]
gpus = 0
"#,
    );
    let wobble = ["1.0", "1.01", "0.99", "1.0", "1.02", "0.98", "1.0", "1.01"];
    for (night, w) in wobble.iter().enumerate() {
        let err = if night < 6 { "0.25" } else { "0.75" };
        // The logits move once, at night 6 (index 5).
        let logits = if night < 5 { "same" } else { "other" };
        let out = f.run(&[
            "--var",
            &format!("err={err}"),
            "--var",
            &format!("wobble={w}"),
            "--var",
            &format!("logits={logits}"),
        ]);
        assert_eq!(out.status.code(), Some(0));
    }
    let runs = f.runs();
    let seventh = runs[6].file_name().unwrap().to_string_lossy().into_owned();

    let out = orch(&f, &["history", "--steps"]);
    assert_eq!(out.status.code(), Some(0));
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        text.starts_with("1 step in the metrics of steps (3 cells over 8 runs"),
        "{text}"
    );
    assert!(
        text.contains(&format!(
            "{seventh} test-commit  quality  quality/err: 0.25 -> 0.75 (+200.0%)"
        )),
        "{text}"
    );
    assert!(!text.contains("timing"), "{text}");

    let out = orch(&f, &["history", "--steps", "--format", "json"]);
    let j: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(j.as_array().unwrap().len(), 1, "{j}");
    assert_eq!(j[0]["run"], seventh.as_str());
    assert_eq!(j[0]["current"], true);
    // A filter narrows the feed like the timelines.
    let out = orch(&f, &["history", "--steps", "timing"]);
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("0 steps"));

    // The report carries the feed and marks the step on the cell's plot.
    let site = f.path().join("site");
    let out = orch(&f, &["report", "--html", site.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0));
    let feed: Value =
        serde_json::from_str(&std::fs::read_to_string(site.join("regressions.json")).unwrap())
            .unwrap();
    assert_eq!(feed[0]["cell"], "quality");
    let txt = std::fs::read_to_string(site.join("regressions.txt")).unwrap();
    assert_eq!(
        txt.lines().count(),
        2,
        "a line a step after the count: {txt:?}"
    );
    assert!(txt.ends_with('\n'));
    assert!(
        txt.starts_with("1 step in the metrics of steps (3 cells over 8 runs; docs/diff.md"),
        "{txt}"
    );
    let index = std::fs::read_to_string(site.join("index.html")).unwrap();
    assert!(index.contains("data-steps=\"1\""), "{index}");
    let cells: Vec<String> = std::fs::read_dir(site.join("cells"))
        .unwrap()
        .map(|e| std::fs::read_to_string(e.unwrap().path()).unwrap())
        .collect();
    // Both gates name their check `quality`: one page's plot marks the step at run 7, the
    // other's (the wobble) marks none.
    let marked = |steps: &str| {
        cells
            .iter()
            .filter(|p| {
                p.contains(&format!(
                    "data-metric=\"quality/err\" data-steps=\"{steps}\""
                ))
            })
            .count()
    };
    assert_eq!(marked("7"), 1, "the step is marked on one plot");
    assert_eq!(marked(""), 1, "the wobble is marked nowhere");
    // The logits cell's page plots how far its bits moved: one value at night 6, by 1.0.
    let moved = cells
        .iter()
        .find(|p| p.contains("data-moved=\"values that differ\""))
        .unwrap_or_else(|| panic!("no page plots the moved bits: {cells:#?}"));
    assert!(
        moved.contains("data-moved=\"max |Δ|\""),
        "the size of the move is plotted"
    );
    assert_eq!(
        cells.iter().filter(|p| p.contains("data-moved=")).count(),
        1,
        "only the cell whose bits moved"
    );
    // A second report into the same folder replaces the feed files (they are the report's).
    let out = orch(&f, &["report", "--html", site.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0));
}
