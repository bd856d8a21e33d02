//! `run --events json`: stdout carries one JSON event per line and nothing else (the summary
//! goes to stderr, with any progress mode), in the order a run has them, with counts that
//! are run.json's and no secret; the lines are flushed as they happen, so a reader follows
//! the run live, and an interrupted run still ends its stream with `run-finished`.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

use serde_json::Value;

use crate::run_support::{COMMIT, Fixture, logged, read_json};

const MANIFEST: &str = r#"
schema = 1
name = "events"

[defaults]
gpus = 0

[env]
API_TOKEN = "pinned-secret-value"

[[arm]]
id = "ok"
run = ["{gates}/pass.sh"]

[[arm]]
id = "on-gpu"
run = ["{gates}/pass.sh"]
gpus = 1

[[arm]]
id = "flaky"
run = ["{gates}/flaky.sh"]
retries = 1

[[arm]]
id = "leaky"
shell = true
run = ['''printf '{"check":"c","status":"fail","message":"token is %s"}\n' "$API_TOKEN" >> "$MEMRA_ORCH_CHECKS"; exit 1''']

[[arm]]
id = "after-leaky"
needs = ["leaky"]
run = ["{gates}/pass.sh"]
"#;

/// Every stdout line as JSON; panics naming the line that is not.
fn lines(stdout: &[u8]) -> Vec<Value> {
    String::from_utf8_lossy(stdout)
        .lines()
        .map(|l| {
            serde_json::from_str(l).unwrap_or_else(|e| panic!("stdout line is not JSON ({e}): {l}"))
        })
        .collect()
}

fn of_type<'a>(events: &'a [Value], t: &str) -> Vec<&'a Value> {
    events.iter().filter(|e| e["type"] == t).collect()
}

#[test]
fn stdout_is_the_event_stream_in_order_with_run_json_counts() {
    let f = Fixture::new(MANIFEST);
    let out = f.run(&["--events", "json", "--gpus", "fake:1"]);
    assert_eq!(out.status.code(), Some(1));
    let events = lines(&out.stdout);
    for e in &events {
        assert_eq!(e["schema"], 1, "{e}");
    }
    let types: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(types.first(), Some(&"run-started"), "{types:?}");
    assert_eq!(types.last(), Some(&"run-finished"), "{types:?}");
    assert_eq!(of_type(&events, "run-started").len(), 1);
    assert_eq!(of_type(&events, "run-finished").len(), 1);
    // Each cell that ran: started, then its attempts, then finished, in that order.
    for (i, e) in events.iter().enumerate() {
        let cell = &e["cell"];
        let before = |t: &str| {
            events[..i]
                .iter()
                .any(|p| p["type"] == t && p["cell"] == *cell)
        };
        let after = |t: &str| {
            events[i + 1..]
                .iter()
                .any(|p| p["type"] == t && p["cell"] == *cell)
        };
        match e["type"].as_str().unwrap() {
            "cell-started" => assert!(after("cell-finished") && !before("cell-started"), "{e}"),
            "attempt-finished" => {
                assert!(before("cell-started") && after("cell-finished"), "{e}")
            }
            "cell-finished" => assert!(!after("cell-finished"), "{e}"),
            _ => {}
        }
    }

    let run = f.run_json();
    let tree = f.tree();
    let started = of_type(&events, "run-started")[0];
    assert_eq!(started["run"], tree.file_name().unwrap().to_str().unwrap());
    assert_eq!(started["manifest"], "events");
    assert_eq!(started["commit"], COMMIT);
    assert_eq!(started["cells"], 5);
    let finished = of_type(&events, "run-finished")[0];
    let cells = of_type(&events, "cell-finished");
    assert_eq!(finished["counts"], run["counts"]);
    assert_eq!(finished["verdict"], run["verdict"]);
    assert_eq!(finished["exit"], 1);
    assert_eq!(finished["interrupted"], false);
    assert_eq!(finished["cells"], cells.len());
    assert_eq!(cells.len(), run["nodes"].as_array().unwrap().len());
    let summed: u64 = finished["counts"]
        .as_object()
        .unwrap()
        .values()
        .map(|n| n.as_u64().unwrap())
        .sum();
    assert_eq!(summed as usize, cells.len());

    let cell = |id: &str| {
        *cells
            .iter()
            .find(|c| c["cell"] == id)
            .unwrap_or_else(|| panic!("no cell-finished for {id}"))
    };
    // Every receipt path is the receipt of that cell.
    for c in &cells {
        if let Some(path) = c["receipt"].as_str() {
            let r = read_json(std::path::Path::new(path));
            assert_eq!(r["id"], c["cell"]);
            assert_eq!(r["verdict"], c["verdict"]);
        }
    }
    assert_eq!(cell("ok")["verdict"], "pass");
    assert_eq!(cell("ok")["as_expected"], true);
    assert_eq!(cell("after-leaky")["verdict"], "blocked");
    let on_gpu = of_type(&events, "cell-started")
        .into_iter()
        .find(|c| c["cell"] == "on-gpu")
        .unwrap();
    assert_eq!(on_gpu["gpus"], serde_json::json!([0]));
    assert_eq!(on_gpu["cpu_slot"], Value::Null);
    assert_eq!(cell("on-gpu")["gpus"], serde_json::json!([0]));
    let flaky: Vec<(u64, &str)> = of_type(&events, "attempt-finished")
        .into_iter()
        .filter(|a| a["cell"] == "flaky")
        .map(|a| {
            (
                a["attempt"].as_u64().unwrap(),
                a["outcome"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(flaky, [(1, "crash"), (2, "pass")]);
    assert_eq!(cell("flaky")["verdict"], "pass");

    // The gate printed the secret into its check message: the stream has it redacted.
    let leaky = cell("leaky");
    assert_eq!(leaky["verdict"], "fail");
    assert!(
        leaky["reason"].as_str().unwrap().contains("<redacted>"),
        "{leaky}"
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(!stdout.contains("pinned-secret-value"), "{stdout}");
    // The summary table went to stderr.
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains(&tree.display().to_string()), "{stderr}");
}

#[test]
fn quiet_progress_prints_its_final_lines_on_stderr_with_the_stream() {
    let f = Fixture::new(
        r#"
schema = 1
name = "quiet-events"

[[arm]]
id = "ok"
run = ["{gates}/pass.sh"]
gpus = 0
"#,
    );
    let out = logged(
        Command::new(env!("CARGO_BIN_EXE_memra-orch"))
            .arg("run")
            .arg(f.path().join("manifest.toml"))
            .arg("--receipts")
            .arg(f.path().join("receipts"))
            .args([
                "--commit",
                COMMIT,
                "--progress",
                "quiet",
                "--events",
                "json",
            ])
            .env("MEMRA_GPU_LOCK_DIR", f.path().join("gpu-leases"))
            .output()
            .unwrap(),
    );
    assert_eq!(out.status.code(), Some(0));
    let events = lines(&out.stdout);
    let types: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(
        types,
        [
            "run-started",
            "cell-started",
            "attempt-finished",
            "cell-finished",
            "run-finished"
        ]
    );
    assert_eq!(events[4]["exit"], 0);
    assert_eq!(events[4]["counts"]["pass"], 1);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("pass 1"), "{stderr}");
    assert!(stderr.contains("receipts:"), "{stderr}");
}

#[test]
fn an_interrupted_run_ends_its_stream_and_its_metrics_file() {
    let f = Fixture::new(
        r#"
schema = 1
name = "interrupted-events"

[defaults]
gpus = 0

[[arm]]
id = "slow"
run = ["{gates}/wait-for.sh", "${root}/never"]

[[arm]]
id = "after"
needs = ["slow"]
run = ["{gates}/pass.sh"]
"#,
    )
    .with_grace("10s");
    let metrics = f.path().join("memra.prom");
    let mut child = f
        .command(&[
            "--events",
            "json",
            "--metrics-file",
            metrics.to_str().unwrap(),
        ])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut reader = BufReader::new(child.stdout.take().unwrap());
    let mut seen = Vec::new();
    // The lines arrive while the run goes: `slow` is reported started long before it ends.
    loop {
        let mut line = String::new();
        assert!(
            reader.read_line(&mut line).unwrap() > 0,
            "the stream ended before slow started: {seen:?}"
        );
        let e: Value = serde_json::from_str(&line).unwrap();
        let slow_started = e["type"] == "cell-started" && e["cell"] == "slow";
        seen.push(e);
        if slow_started {
            break;
        }
    }
    // Meanwhile the metrics file says the run is going.
    let running = std::fs::read_to_string(&metrics).unwrap();
    assert!(
        running.contains(
            "memra_run_running{manifest=\"interrupted-events\",commit=\"test-commit\"} 1"
        ),
        "{running}"
    );
    // SAFETY: signalling the child we spawned, by its pid.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    for line in reader.lines() {
        seen.push(serde_json::from_str(&line.unwrap()).unwrap());
    }
    assert_eq!(child.wait().unwrap().code(), Some(130));
    let last = seen.last().unwrap();
    assert_eq!(last["type"], "run-finished", "{seen:?}");
    assert_eq!(last["interrupted"], true);
    assert_eq!(last["exit"], 130);
    assert_eq!(last["counts"]["cancelled"], 2);
    let done = std::fs::read_to_string(&metrics).unwrap();
    for line in [
        "memra_run_running{manifest=\"interrupted-events\",commit=\"test-commit\"} 0",
        "memra_run_interrupted{manifest=\"interrupted-events\",commit=\"test-commit\"} 1",
        "memra_run_exit_code{manifest=\"interrupted-events\",commit=\"test-commit\"} 130",
        "memra_run_cells{manifest=\"interrupted-events\",commit=\"test-commit\",verdict=\"cancelled\"} 2",
    ] {
        assert!(done.lines().any(|l| l == line), "no `{line}` in\n{done}");
    }
}
