//! `run --metrics-file PATH`: a Prometheus textfile that a real parser reads, whose counts
//! and cells are run.json's, that replaces an earlier file whole (no temporary file left
//! beside it); a PATH that cannot be one is a usage error before anything runs.
//! The interrupted run's final file is checked in `run_events`.

use std::collections::HashMap;
use std::os::unix::fs::{MetadataExt, PermissionsExt};

use prometheus_parse::{Scrape, Value as Sample};

use crate::run_support::{COMMIT, Fixture};

const MANIFEST: &str = r#"
schema = 1
name = "metrics"

[defaults]
gpus = 0

[[arm]]
id = "ok"
run = ["{gates}/pass.sh"]

[[arm]]
id = "flaky"
run = ["{gates}/flaky.sh"]
retries = 1

[[arm]]
id = "broken"
run = ["{gates}/fail.sh"]

[[arm]]
id = "after-broken"
needs = ["broken"]
run = ["{gates}/pass.sh"]
"#;

fn gauge(v: &Sample) -> f64 {
    match v {
        Sample::Gauge(g) => *g,
        other => panic!("not a gauge: {other:?}"),
    }
}

#[test]
fn the_metrics_file_parses_and_carries_run_json_counts() {
    let f = Fixture::new(MANIFEST);
    let dir = f.path().join("textfile");
    std::fs::create_dir(&dir).unwrap();
    let path = dir.join("memra.prom");
    // An earlier run's file (its first line is the one memra-orch writes first).
    std::fs::write(
        &path,
        "# HELP memra_run_info The run this file describes.\nold_metric 1\n",
    )
    .unwrap();
    let old_inode = std::fs::metadata(&path).unwrap().ino();
    let out = f.run(&["--metrics-file", path.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));

    // Replaced whole, and nothing else left in the folder.
    let names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, ["memra.prom"]);
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(!text.contains("old_metric"), "{text}");
    // A new file renamed over the old one, not the old one rewritten in place (which a
    // collector reading at that moment would see half-written).
    assert_ne!(std::fs::metadata(&path).unwrap().ino(), old_inode);
    let mode = std::fs::metadata(&path).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o644);

    let scrape = Scrape::parse(text.lines().map(|l| Ok(l.to_string()))).unwrap();
    for s in &scrape.samples {
        assert_eq!(s.labels.get("manifest"), Some("metrics"), "{s:?}");
        assert_eq!(s.labels.get("commit"), Some(COMMIT), "{s:?}");
        assert!(
            scrape.docs.contains_key(&s.metric),
            "no HELP for {}",
            s.metric
        );
    }
    let one = |name: &str| {
        let found: Vec<_> = scrape.samples.iter().filter(|s| s.metric == name).collect();
        assert_eq!(found.len(), 1, "{name}: {found:?}");
        gauge(&found[0].value)
    };
    let run = f.run_json();
    assert_eq!(one("memra_run_running"), 0.0);
    assert_eq!(one("memra_run_exit_code"), 1.0);
    assert_eq!(one("memra_run_success"), 0.0);
    assert_eq!(one("memra_run_interrupted"), 0.0);
    assert_eq!(
        one("memra_run_duration_seconds"),
        run["seconds"].as_f64().unwrap()
    );
    let end = crate::run_support::epoch(run["end"].as_str().unwrap());
    assert!((one("memra_run_end_timestamp_seconds") - end).abs() < 1e-3);
    let start = crate::run_support::epoch(run["start"].as_str().unwrap());
    assert!((one("memra_run_start_timestamp_seconds") - start).abs() < 1e-3);
    let info: Vec<_> = scrape
        .samples
        .iter()
        .filter(|s| s.metric == "memra_run_info")
        .collect();
    assert_eq!(
        info[0].labels.get("run"),
        f.tree().file_name().unwrap().to_str()
    );

    // One series per verdict, equal to run.json's counts.
    let counts: HashMap<String, f64> = scrape
        .samples
        .iter()
        .filter(|s| s.metric == "memra_run_cells")
        .map(|s| {
            (
                s.labels.get("verdict").unwrap().to_string(),
                gauge(&s.value),
            )
        })
        .collect();
    let stored = run["counts"].as_object().unwrap();
    assert_eq!(counts.len(), stored.len());
    for (verdict, n) in stored {
        assert_eq!(counts[verdict], n.as_f64().unwrap(), "{verdict}");
    }
    assert_eq!(counts["pass"], 2.0);
    assert_eq!(counts["fail"], 1.0);
    assert_eq!(counts["blocked"], 1.0);

    // One verdict series and one duration series per cell, as run.json's index has them.
    let verdicts: HashMap<String, String> = scrape
        .samples
        .iter()
        .filter(|s| s.metric == "memra_cell_verdict")
        .map(|s| {
            assert_eq!(gauge(&s.value), 1.0);
            (
                s.labels.get("cell").unwrap().to_string(),
                s.labels.get("verdict").unwrap().to_string(),
            )
        })
        .collect();
    let seconds: HashMap<String, f64> = scrape
        .samples
        .iter()
        .filter(|s| s.metric == "memra_cell_duration_seconds")
        .map(|s| (s.labels.get("cell").unwrap().to_string(), gauge(&s.value)))
        .collect();
    let nodes = run["nodes"].as_array().unwrap();
    assert_eq!(verdicts.len(), nodes.len());
    assert_eq!(seconds.len(), nodes.len());
    for n in nodes {
        let id = n["id"].as_str().unwrap();
        assert_eq!(verdicts[id], n["verdict"].as_str().unwrap(), "{id}");
        assert_eq!(seconds[id], n["seconds"].as_f64().unwrap(), "{id}");
    }
}

#[test]
fn a_path_that_cannot_be_the_metrics_file_is_a_usage_error_before_anything_runs() {
    let f = Fixture::new(MANIFEST);
    let missing = f.path().join("no-such-folder").join("memra.prom");
    let out = f.run(&["--metrics-file", missing.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--metrics-file"), "{stderr}");
    assert!(stderr.contains("does not exist"), "{stderr}");

    let out = f.run(&["--metrics-file", f.path().to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("is a directory"), "{stderr}");
    // Nothing ran: no receipt tree was made.
    assert!(!f.path().join("receipts").exists());
}
