//! `sampling-gate` end to end, through the real binary on the synthesized tiny checkpoint the
//! smoke battery uses: green on the CPU backend with every check row and the doors row, the
//! planted `top-p-cut` defect failing exactly rows with top-p below 1, `top-k-cut` exactly rows
//! with top-k, `top-k-ties` exactly the tied top-k rows, `--part` selecting one family of
//! rows, and clean usage errors.

#[path = "../../engine/tests/common/mod.rs"]
mod common;

use serde_json::Value;

/// Runs the gate with `args` and exactly the pins in `env` on the CPU backend.
fn gate(args: &[&str], env: &[(&str, &str)]) -> common::GateRun {
    common::run_gate(env!("CARGO_BIN_EXE_sampling-gate"), false, args, env)
}

fn model_arg() -> String {
    // The smoke battery's tiny Q4_1 checkpoint (seed 0).
    common::synth_model("tiny", "q4_1", 0)
        .to_str()
        .unwrap()
        .to_string()
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
    // Three temperatures by four top-p and six top-k sets; three rows by six distribution
    // sets, two of them with top-k.
    assert_eq!(steps.len(), 18, "{}", r.stdout);
    assert_eq!(dist.len(), 18, "{}", r.stdout);
    let with_k = |cs: &[&&Value]| {
        cs.iter()
            .filter(|c| c["check"].as_str().unwrap().contains(",top_k="))
            .count()
    };
    assert_eq!((with_k(&steps), with_k(&dist)), (6, 6), "{}", r.stdout);
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
    let row = |name: &str| {
        *checks
            .iter()
            .find(|c| c["check"] == name)
            .unwrap_or_else(|| panic!("no `{name}` row: {}", r.stdout))
    };
    let stream = row("stream");
    assert_eq!(stream["status"], "pass", "{stream:#}");
    assert_eq!(stream["metrics"]["keys"], 7, "{stream:#}");
    // Every sequence's length after its prompt and after each step, on both paths (the
    // single path's twin too): 18 × (1 + 16) batched, 18 × (1 + 2 × 16) single.
    let positions = row("positions");
    assert_eq!(positions["status"], "pass", "{positions:#}");
    assert_eq!(
        positions["metrics"]["checked"],
        18 * 17 + 18 * 33,
        "{positions:#}"
    );
    // Top-k 8 keeps eight tokens of a spread row (the tiny model's logits have no ties).
    for c in dist.iter().filter(|c| {
        c["check"]
            .as_str()
            .unwrap()
            .ends_with("T=1,top_k=8,top_p=1]")
    }) {
        assert_eq!(c["metrics"]["kept"], 8, "{c:#}");
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
    // The tied rows: top-k 8 keeps the pair tied across its cut, top-k 40 the whole tail
    // tied with its 40th token, and top-p 0.9's cut lands inside that tail, so it keeps it
    // all as well.
    for (name, kept) in [
        ("tied[T=1,top_k=8,top_p=1]", 9),
        ("tied[T=1,top_k=40,top_p=1]", 512),
        ("tied[T=1,top_p=0.9]", 512),
    ] {
        let c = row(name);
        assert_eq!(c["status"], "pass", "{c:#}");
        assert_eq!(c["metrics"]["kept"], kept, "{c:#}");
        assert_eq!(c["metrics"]["outside"], 0, "{c:#}");
    }
    assert_eq!(doors["part"], "all");
}

#[test]
fn a_top_k_cut_that_drops_the_ties_fails_the_tied_top_k_rows_only() {
    let r = gate(&[&model_arg()], &[("MEMRA_GATE_DEFECT", "top-k-ties")]);
    assert_eq!(r.code, 1, "{}\n{}", r.stdout, r.stderr);
    assert_eq!(r.rows[0]["doors"]["defect"], "top-k-ties");
    let failed: Vec<String> = r
        .checks()
        .iter()
        .filter(|c| c["status"] == "fail")
        .map(|c| c["check"].as_str().unwrap().to_string())
        .collect();
    // The engine's own logits have no exact ties, so every other row keeps what the
    // contract keeps.
    assert_eq!(
        failed,
        ["tied[T=1,top_k=8,top_p=1]", "tied[T=1,top_k=40,top_p=1]"],
        "{}",
        r.stdout
    );
}

#[test]
fn part_runs_one_family_of_rows() {
    for (part, prefix, count) in [("tied", "tied[", 3), ("distribution", "distribution[", 18)] {
        let r = gate(&[&model_arg(), "--part", part], &[]);
        assert_eq!(r.code, 0, "{}\n{}", r.stdout, r.stderr);
        assert_eq!(r.rows[0]["doors"]["part"], part);
        let checks = r.checks();
        assert_eq!(checks.len(), count, "{}", r.stdout);
        assert!(
            checks
                .iter()
                .all(|c| c["check"].as_str().unwrap().starts_with(prefix)),
            "{}",
            r.stdout
        );
    }
    let r = gate(&[&model_arg(), "--part", "steps"], &[]);
    assert_eq!(r.code, 0, "{}\n{}", r.stdout, r.stderr);
    assert_eq!(r.checks().len(), 18 + 2, "{}", r.stdout);
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
    // Without truncation the defect has nothing to cut, so those rows stay green, and so do
    // the stream and the positions.
    assert!(
        failed.iter().all(|n| n.starts_with("steps[")
            || n.starts_with("distribution[")
            || n.starts_with("tied[")),
        "{failed:?}"
    );
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
fn the_late_top_k_cut_fails_rows_with_top_k_only() {
    let r = gate(&[&model_arg()], &[("MEMRA_GATE_DEFECT", "top-k-cut")]);
    assert_eq!(r.code, 1, "{}\n{}", r.stdout, r.stderr);
    assert_eq!(r.rows[0]["doors"]["defect"], "top-k-cut");
    let checks = r.checks();
    let failed: Vec<&str> = checks
        .iter()
        .filter(|c| c["status"] == "fail")
        .map(|c| c["check"].as_str().unwrap())
        .collect();
    // Only a set with top-k has a cut to move; the stream and the positions stay green.
    assert!(failed.iter().all(|n| n.contains(",top_k=")), "{failed:?}");
    // Top-k 1 is the argmax: one token more is a second token drawn.
    assert!(
        failed.contains(&"steps[T=1,top_k=1,top_p=1]"),
        "{}",
        r.stdout
    );
    // The counts see a token outside the reference's eight.
    let dist = checks
        .iter()
        .find(|c| {
            c["status"] == "fail" && c["check"].as_str().unwrap().starts_with("distribution[")
        })
        .unwrap_or_else(|| panic!("no distribution row failed: {}", r.stdout));
    assert!(dist["metrics"]["outside"].as_u64().unwrap() > 0, "{dist:#}");
}

#[test]
fn bad_arguments_exit_two_and_name_the_fix() {
    for (args, want) in [
        (vec!["--steps", "0"], "--steps 0"),
        (vec!["--draws", "10"], "at least 100 draws"),
        (vec!["--rows", "0"], "--rows 0"),
        (vec!["--plen", "0"], "--plen 0"),
        (
            vec!["--part", "ties"],
            "possible values: all, steps, distribution, tied",
        ),
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
