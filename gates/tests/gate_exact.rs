//! `exact-gate` end to end through the real binary on the CPU backend: green against the
//! banked bounds on the synthesized arms and on SmolLM2-135M (fetched), the planted
//! weight-block defect failing every arm, calibration banking only what it measured, an
//! uncalibrated door setting failing closed, and the receipt's format.

#[path = "../../engine/tests/common/mod.rs"]
mod common;

use std::path::Path;

/// Runs the gate from the repository root (where the default bounds path resolves).
fn gate(args: &[&str], env: &[(&str, &str)]) -> common::GateRun {
    common::run_gate(env!("CARGO_BIN_EXE_exact-gate"), true, args, env)
}

const SYNTH_CHECKS: [&str; 8] = [
    "exact.q4_1.prefill",
    "exact.q4_1.decode",
    "exact.q4_0.prefill",
    "exact.q4_0.decode",
    "exact.q8_0.prefill",
    "exact.q8_0.decode",
    "exact.f16.prefill",
    "exact.f16.decode",
];

#[test]
fn synthesized_arms_are_within_the_banked_bounds() {
    let r = gate(&[], &[]);
    assert_eq!(r.code, 0, "{}\n{}", r.stdout, r.stderr);
    for name in SYNTH_CHECKS {
        let c = r.check(name);
        assert_eq!(c["status"], "pass", "{c}");
        let m = &c["metrics"];
        assert!(m["kl_mean"].as_f64().unwrap() <= m["kl_mean_max"].as_f64().unwrap());
        assert!(
            m["positions"].as_u64().unwrap() > 128,
            "the long program runs: {c}"
        );
    }
    // The quantized arms are measurably away from the exact model (activations through
    // q8_1), the float arm only by f32 rounding: the statistic sees the difference.
    let kl = |n: &str| r.check(n)["metrics"]["kl_mean"].as_f64().unwrap();
    assert!(
        kl("exact.q4_1.prefill") > 1e-5,
        "{}",
        kl("exact.q4_1.prefill")
    );
    assert!(
        kl("exact.f16.prefill") < 1e-9,
        "{}",
        kl("exact.f16.prefill")
    );
    assert!(
        r.receipt.starts_with("# exact-gate\tbinary_sha256="),
        "{}",
        r.receipt
    );
    assert!(
        r.receipt
            .contains("\narm\tpath\tprogram\tpos\tkl\ttop1_exact\ttop1_engine\tmax_abs\n")
    );
    assert!(r.receipt.contains("# arm\tarm=q4_1\tmodel_sha256="));
    assert!(
        r.receipt.contains(",140\n"),
        "the long program's length is recorded"
    );
    assert!(
        r.receipt
            .contains("# summary\tarm=q4_1\tpath=decode\tpositions=")
    );
    assert!(r.receipt.ends_with("# verdict\tfailures=0\n"));
}

#[test]
fn a_perturbed_weight_block_fails_every_arm() {
    let r = gate(&[], &[("MEMRA_GATE_DEFECT", "weight-block")]);
    assert_eq!(r.code, 1, "{}\n{}", r.stdout, r.stderr);
    for name in SYNTH_CHECKS {
        let c = r.check(name);
        assert_eq!(c["status"], "fail", "{c}");
        let m = &c["metrics"];
        // Not by a hair: the mean KL is several times its bound.
        assert!(
            m["kl_mean"].as_f64().unwrap() > 3.0 * m["kl_mean_max"].as_f64().unwrap(),
            "{c}"
        );
        assert!(
            c["message"]
                .as_str()
                .unwrap()
                .contains("further from the exact model than banked"),
            "{c}"
        );
    }
    let doors = r.rows.iter().find(|r| r.get("doors").is_some()).unwrap();
    assert_eq!(doors["doors"]["defect"], "weight-block");
}

/// A pipeline split is held to the unsplit model's bounds (the split is not part of the
/// door key), so it meets the exact model as an independent reference; a split that drops a
/// layer fails it.
#[test]
fn a_split_run_meets_the_unsplit_bounds_and_a_broken_split_fails_them() {
    let r = gate(&[], &[("MEMRA_PP_STAGES", "2")]);
    assert_eq!(r.code, 0, "{}\n{}", r.stdout, r.stderr);
    let doors = r.rows.iter().find(|r| r.get("doors").is_some()).unwrap();
    assert_eq!(doors["doors"]["pp_stages"], 2);
    for name in SYNTH_CHECKS {
        assert_eq!(r.check(name)["status"], "pass");
    }
    let r = gate(
        &[],
        &[
            ("MEMRA_PP_STAGES", "2"),
            ("MEMRA_GATE_DEFECT", "stage-range"),
        ],
    );
    assert_eq!(r.code, 1, "{}\n{}", r.stdout, r.stderr);
    for name in SYNTH_CHECKS {
        assert_eq!(r.check(name)["status"], "fail", "{name}");
    }
}

#[test]
fn an_uncalibrated_model_fails_closed_and_says_how_to_calibrate() {
    let r = gate(&["--no-synth", "--model"], &[]);
    assert_eq!(r.code, 2, "--model needs a value: {}", r.stderr);
    // A checkpoint no bound is banked for (another seed than the gate's own arms).
    let m = common::synth_model("tiny", "q4_1", 3);
    let r = gate(&["--no-synth", "--model", m.to_str().unwrap()], &[]);
    assert_eq!(r.code, 1, "{}\n{}", r.stdout, r.stderr);
    for c in r.checks() {
        assert_eq!(c["status"], "fail", "{c}");
        let msg = c["message"].as_str().unwrap();
        assert!(
            msg.contains("no bound banked in engine/goldens/exact-bounds.toml"),
            "{msg}"
        );
        assert!(msg.contains("exact-gate --calibrate"), "{msg}");
    }
    let r = gate(&["--no-synth"], &[]);
    assert_eq!(r.code, 2);
    assert!(
        r.stderr.contains("--no-synth needs at least one --model"),
        "{}",
        r.stderr
    );
}

#[test]
fn calibration_banks_the_arms_it_ran_and_keeps_the_others() {
    let dir = tempfile::tempdir().unwrap();
    let bounds = dir.path().join("bounds.toml");
    std::fs::copy(
        common::repo_root().join("engine/goldens/exact-bounds.toml"),
        &bounds,
    )
    .unwrap();
    let before = std::fs::read_to_string(&bounds).unwrap();
    let m = common::synth_model("tiny", "q8_0", 5);
    let b = bounds.to_str().unwrap();
    let args = ["--no-synth", "--model", m.to_str().unwrap(), "--bounds", b];
    // Uncalibrated, then calibrated under the naive attention door, then green.
    assert_eq!(gate(&args, &[("MEMRA_FA3", "0")]).code, 1);
    let mut cal = args.to_vec();
    cal.push("--calibrate");
    let r = gate(&cal, &[("MEMRA_FA3", "0")]);
    assert_eq!(r.code, 0, "{}\n{}", r.stdout, r.stderr);
    let after = std::fs::read_to_string(&bounds).unwrap();
    let entries = |t: &str| t.matches("[[bound]]").count();
    assert_eq!(
        entries(&after),
        entries(&before) + 2,
        "two paths banked, none lost"
    );
    assert!(after.contains("attention=naive"));
    let r = gate(&args, &[("MEMRA_FA3", "0")]);
    assert_eq!(r.code, 0, "{}\n{}", r.stdout, r.stderr);
    // Under the default doors this model still has no bound.
    assert_eq!(gate(&args, &[]).code, 1);
    // A broken file is a setup error that names it.
    std::fs::write(&bounds, "format = 1\n[[bound]]\narm = 3\n").unwrap();
    let r = gate(&args, &[]);
    assert_eq!(r.code, 2);
    assert!(
        r.stderr.contains("not an exact-model bounds file"),
        "{}",
        r.stderr
    );
}

/// The real model on the CPU backend against its banked bounds, and the canary.
#[test]
fn smollm2_is_within_its_banked_bounds_and_the_canary_fails_it() {
    let Some(model) = common::real_model() else {
        return;
    };
    let m = model.to_str().unwrap();
    let r = gate(&["--no-synth", "--model", m], &[]);
    assert_eq!(r.code, 0, "{}\n{}", r.stdout, r.stderr);
    let name = |path: &str| format!("exact.{}.{path}", stem(&model));
    for path in ["prefill", "decode"] {
        let c = r.check(&name(path));
        assert_eq!(c["status"], "pass", "{c}");
    }
    // The four prompts of docs/numerics.md: 54 positions, and the engine agrees with the
    // exact model's argmax on at least 53 of them.
    let short = r
        .receipt
        .lines()
        .find(|l| l.starts_with("# short") && l.contains("path=prefill"))
        .unwrap();
    assert!(short.contains("\tpositions=54\t"), "{short}");
    let agree: usize = field(short, "top1_agree").parse().unwrap();
    assert!(agree >= 53, "{short}");
    let median: f64 = field(short, "top5_median").parse().unwrap();
    assert!(median <= 0.15, "{short}");

    let r = gate(
        &["--no-synth", "--model", m],
        &[("MEMRA_GATE_DEFECT", "weight-block")],
    );
    assert_eq!(r.code, 1, "{}\n{}", r.stdout, r.stderr);
    for path in ["prefill", "decode"] {
        let c = r.check(&name(path));
        assert_eq!(c["status"], "fail", "{c}");
        let m = &c["metrics"];
        assert!(
            m["kl_mean"].as_f64().unwrap() > 3.0 * m["kl_mean_max"].as_f64().unwrap(),
            "{c}"
        );
    }
}

fn stem(p: &Path) -> String {
    p.file_stem().unwrap().to_string_lossy().into_owned()
}

fn field<'a>(line: &'a str, key: &str) -> &'a str {
    line.split('\t')
        .find_map(|f| f.strip_prefix(&format!("{key}=")))
        .unwrap_or_else(|| panic!("no {key} in {line}"))
}

/// exact-gate's synthesized arms under `MEMRA_KV_Q8=1` with `env` (common::run_gate).
fn exact_gate(env: &[(&str, &str)]) -> (i32, String) {
    let env: Vec<(&str, &str)> = std::iter::once(("MEMRA_KV_Q8", "1"))
        .chain(env.iter().copied())
        .collect();
    let r = common::run_gate(env!("CARGO_BIN_EXE_exact-gate"), true, &[], &env);
    (r.code, format!("{}{}", r.stdout, r.stderr))
}

#[test]
fn exact_gate_holds_the_q8_cache_to_the_f32_cache_and_fails_a_coarser_one() {
    let (code, out) = exact_gate(&[]);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("PASS  exact.q4_1.decode:vs-f32-cache"),
        "{out}"
    );
    assert!(out.contains("kv=q8_0"), "{out}");
    let (code, out) = exact_gate(&[("MEMRA_GATE_DEFECT", "kv-q8-coarse")]);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("FAIL  exact.q4_1.decode:vs-f32-cache"),
        "{out}"
    );
    let (code, out) = exact_gate(&[("MEMRA_KV_Q8", "yes")]);
    assert_eq!(code, 2, "{out}");
    assert!(
        out.contains("MEMRA_KV_Q8") && out.contains("accepted values are 0, 1"),
        "{out}"
    );
}
