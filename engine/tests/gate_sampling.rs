//! `sampling-gate` end to end, through the real binary on the synthesized tiny checkpoint the
//! smoke battery uses: green on the CPU backend with every check row and the doors row, the
//! planted `top-p-cut` defect failing exactly rows with top-p below 1, and clean usage
//! errors.

use std::path::PathBuf;
use std::process::{Command, Output};
use std::sync::OnceLock;

use serde_json::Value;

/// The smoke battery's tiny Q4_1 checkpoint (`memra-engine synth --preset tiny --quant
/// q4_1`, seed 0), written once per test process.
fn tiny() -> PathBuf {
    static DIR: OnceLock<tempfile::TempDir> = OnceLock::new();
    static ONCE: OnceLock<PathBuf> = OnceLock::new();
    ONCE.get_or_init(|| {
        let dir = DIR.get_or_init(|| tempfile::tempdir().unwrap());
        let path = dir.path().join("tiny-q4_1.gguf");
        memra_engine::synth::write_preset("tiny", "q4_1", 0, &path).unwrap();
        path
    })
    .clone()
}

/// What one gate run reported.
struct Run {
    code: i32,
    stdout: String,
    stderr: String,
    rows: Vec<Value>,
}

impl Run {
    /// The check rows (every row but the doors row).
    fn checks(&self) -> Vec<&Value> {
        self.rows
            .iter()
            .filter(|r| r.get("check").is_some())
            .collect()
    }
}

/// Runs the gate with `args` and exactly the pins in `env` (every other MEMRA_* removed) on
/// the CPU backend.
fn gate(args: &[&str], env: &[(&str, &str)]) -> Run {
    let dir = tempfile::tempdir().unwrap();
    let checks = dir.path().join("checks.jsonl");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_sampling-gate"));
    for var in memra_engine::doors::DOOR_VARIABLES {
        cmd.env_remove(var);
    }
    cmd.env("MEMRA_BACKEND", "cpu")
        .env("MEMRA_ORCH_CHECKS", &checks)
        .args(args)
        .envs(env.iter().copied());
    let Output {
        status,
        stdout,
        stderr,
    } = cmd.output().expect("run sampling-gate");
    let rows = std::fs::read_to_string(&checks)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).expect("every check row is JSON"))
        .collect();
    Run {
        code: status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&stdout).into_owned(),
        stderr: String::from_utf8_lossy(&stderr).into_owned(),
        rows,
    }
}

fn model_arg() -> String {
    tiny().to_str().unwrap().to_string()
}

/// Whether a check's name carries `top_p=1]` (no truncation).
fn untruncated(name: &str) -> bool {
    name.ends_with("top_p=1]")
}

#[test]
fn green_on_the_cpu_backend_with_every_row() {
    let r = gate(&[&model_arg()], &[]);
    assert_eq!(r.code, 0, "{}\n{}", r.stdout, r.stderr);
    assert!(
        r.stdout.contains("ALL GREEN: sampling-gate"),
        "{}",
        r.stdout
    );
    let doors = &r.rows[0]["doors"];
    assert_eq!(doors["backend"], "cpu");
    assert_eq!(doors["defect"], "none");
    assert_eq!(doors["draws"], 4000);
    let checks = r.checks();
    let steps: Vec<&&Value> = checks
        .iter()
        .filter(|c| c["check"].as_str().unwrap().starts_with("steps["))
        .collect();
    let dist: Vec<&&Value> = checks
        .iter()
        .filter(|c| c["check"].as_str().unwrap().starts_with("distribution["))
        .collect();
    // Three temperatures by four top-p; three rows by four distribution sets.
    assert_eq!(steps.len(), 12, "{}", r.stdout);
    assert_eq!(dist.len(), 12, "{}", r.stdout);
    for c in &steps {
        let m = &c["metrics"];
        assert_eq!(c["status"], "pass", "{c:#}");
        assert_eq!(m["mismatches"], 0, "{c:#}");
        // 16 steps on each of two paths, every draw compared or counted ambiguous.
        let seen = m["compared"].as_u64().unwrap() + m["ambiguous"].as_u64().unwrap();
        assert_eq!(seen, 32, "{c:#}");
        assert!(m["compared"].as_u64().unwrap() >= 16, "{c:#}");
    }
    for c in &dist {
        assert_eq!(c["status"], "pass", "{c:#}");
        assert_eq!(c["metrics"]["outside"], 0, "{c:#}");
        assert_eq!(c["metrics"]["draws"], 4000, "{c:#}");
    }
    // The rows are picked for spread: without truncation they keep every token, and some
    // nucleus test has several bins.
    assert!(
        dist.iter()
            .any(|c| c["metrics"]["kept"] == 512 && c["metrics"]["bins"].as_u64().unwrap() > 20)
    );
    assert!(dist.iter().any(|c| {
        !untruncated(c["check"].as_str().unwrap()) && c["metrics"]["bins"].as_u64().unwrap() > 5
    }));
}

#[test]
fn the_early_cut_fails_rows_with_top_p_below_one_only() {
    let r = gate(&[&model_arg()], &[("MEMRA_GATE_DEFECT", "top-p-cut")]);
    assert_eq!(r.code, 1, "{}\n{}", r.stdout, r.stderr);
    assert_eq!(r.rows[0]["doors"]["defect"], "top-p-cut");
    let checks = r.checks();
    let failed: Vec<&str> = checks
        .iter()
        .filter(|c| c["status"] == "fail")
        .map(|c| c["check"].as_str().unwrap())
        .collect();
    // Without truncation the defect has nothing to cut, so those rows stay green.
    assert!(failed.iter().all(|n| !untruncated(n)), "{failed:?}");
    // Both kinds of check see it: a decode step drawing another token, and the counts.
    assert!(
        failed.iter().any(|n| n.starts_with("steps[")),
        "{}",
        r.stdout
    );
    assert!(
        failed.iter().any(|n| n.starts_with("distribution[")),
        "{}",
        r.stdout
    );
    let step = checks
        .iter()
        .find(|c| c["status"] == "fail" && c["check"].as_str().unwrap().starts_with("steps["))
        .unwrap();
    assert!(
        step["metrics"]["mismatches"].as_u64().unwrap() > 0,
        "{step:#}"
    );
    assert!(step["first_mismatch"]["step"].is_u64(), "{step:#}");
    assert!(r.stdout.contains("FAIL: sampling-gate"), "{}", r.stdout);
}

#[test]
fn bad_arguments_exit_two_and_name_the_fix() {
    for (args, want) in [
        (vec!["--steps", "0"], "--steps 0"),
        (vec!["--draws", "10"], "at least 100 draws"),
        (vec!["--rows", "0"], "--rows 0"),
        (vec!["--plen", "0"], "--plen 0"),
        (vec!["--steps", "600"], "context is 512"),
    ] {
        let mut all = vec![model_arg()];
        all.extend(args.iter().map(|a| a.to_string()));
        let all: Vec<&str> = all.iter().map(String::as_str).collect();
        let r = gate(&all, &[]);
        assert_eq!(r.code, 2, "{args:?}: {}\n{}", r.stdout, r.stderr);
        assert!(r.stderr.contains(want), "{args:?}: {}", r.stderr);
    }
    let r = gate(&["/nonexistent/model.gguf"], &[]);
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(r.stderr.contains("/nonexistent/model.gguf"), "{}", r.stderr);
    let r = gate(&[&model_arg()], &[("MEMRA_GATE_DEFECT", "no-such")]);
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(
        r.stderr.contains("top-p-cut"),
        "the error lists the defects: {}",
        r.stderr
    );
    // clap's own usage errors exit 2 as well.
    assert_eq!(gate(&[], &[]).code, 2);
}
