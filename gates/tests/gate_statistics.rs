//! Known answers of the statistics the gates report: exact-gate's KL divergence, top-1
//! agreement, RMS and |Δlogit| at the top five with the bounds a calibration banks from
//! them; sampling-gate's pooled chi-square statistic, its p-value, the reference
//! distribution and the distribution test built on them; the ledger's counts, largest
//! difference and first mismatch; the reference gate's row policy; the host argmax; the
//! speculative run's ratios; and the q8_0 KV cache's rounding.
//!
//! The inputs and the answers are `tests/data/known-answers.json`, written by
//! `scripts/known-answers.py`, which computes every answer in Python from the statistic's
//! definition, apart from this crate's code, so a wrong formula fails here by itself instead
//! of hiding inside a gate's headroom. Floats are stored as strings holding Python's `repr`
//! and parsed with `str::parse`, which is correctly rounded: every input arrives with its
//! exact bits. Each test states its tolerance: bit for bit where Python performs the same
//! float operations, relative 1e-12 where only the order of a sum differs, relative 1e-9
//! where exponentials, logarithms or a special function are evaluated two ways.

use std::sync::OnceLock;

use memra_engine::reference::sampler;
use memra_engine::sampling::SamplingParams;
use memra_engine::spec::SpecStats;
use memra_gates::chi_square::{chi2_sf, pooled_chi2};
use memra_gates::exact::{Bound, Measured, PositionStat, measure};
use memra_gates::ledger::{Ledger, Policy, host_argmax};
use memra_gates::sampling::distribution_test;
use serde_json::Value;

/// Relative tolerance where the answer is a sum taken in another order.
const SUM_ORDER: f64 = 1e-12;
/// Relative tolerance where exponentials, logarithms or a special function are evaluated
/// two ways (the script's chi-square tail agrees with a 250-digit evaluation to about 1e-13).
const TWO_WAYS: f64 = 1e-9;

fn data() -> &'static Value {
    static DATA: OnceLock<Value> = OnceLock::new();
    DATA.get_or_init(|| {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/known-answers.json");
        let text = std::fs::read_to_string(path)
            .unwrap_or_else(|e| panic!("{path}: {e}; regenerate it with scripts/known-answers.py"));
        let data: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}"));
        assert_eq!(data["format"], 1, "{path}: unknown format");
        data
    })
}

fn list(v: &Value) -> &[Value] {
    v.as_array()
        .unwrap_or_else(|| panic!("not an array: {v}"))
        .as_slice()
}

/// A float written as Python's `repr`.
fn num(v: &Value) -> f64 {
    let s = v
        .as_str()
        .unwrap_or_else(|| panic!("not a float string: {v}"));
    s.parse().unwrap_or_else(|e| panic!("{s:?}: {e}"))
}

fn nums(v: &Value) -> Vec<f64> {
    list(v).iter().map(num).collect()
}

/// An f32 value, written as the `repr` of its exact f64 widening.
fn num32(v: &Value) -> f32 {
    let x = num(v);
    let y = x as f32;
    assert!(f64::from(y) == x || x.is_nan(), "{x:e} is not an f32 value");
    y
}

fn nums32(v: &Value) -> Vec<f32> {
    list(v).iter().map(num32).collect()
}

fn int(v: &Value) -> usize {
    v.as_u64()
        .unwrap_or_else(|| panic!("not an unsigned integer: {v}")) as usize
}

fn ints(v: &Value) -> Vec<usize> {
    list(v).iter().map(int).collect()
}

fn tokens(v: &Value) -> Vec<u32> {
    ints(v).into_iter().map(|t| t as u32).collect()
}

fn name(case: &Value) -> &str {
    case["name"].as_str().unwrap_or("?")
}

/// `got` within `rel` of `want`, relatively; an infinite `want` must be met exactly.
fn assert_close(what: &str, got: f64, want: f64, rel: f64) {
    let ok = if want.is_finite() {
        (got - want).abs() <= rel * want.abs()
    } else {
        got == want
    };
    assert!(
        ok,
        "{what}: got {got:e}, want {want:e} (relative tolerance {rel:e})"
    );
}

/// Bit for bit (so 0.0 is not -0.0), any NaN matching any NaN.
fn assert_same(what: &str, got: f64, want: f64) {
    assert!(
        got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan()),
        "{what}: got {got:?}, want {want:?}"
    );
}

/// exact-gate's statistics of the known rows, with the answers.
fn measured() -> (Measured, Vec<PositionStat>, &'static Value) {
    let case = &data()["exact_measure"];
    let exact: Vec<f64> = list(&case["exact"]).iter().flat_map(nums).collect();
    let got: Vec<f32> = list(&case["got"]).iter().flat_map(nums32).collect();
    let (m, per) = measure(&exact, &got, int(&case["v"]));
    (m, per, case)
}

/// Each position's KL divergence is KL(P_exact ‖ P_engine) in nats; on these rows the
/// reverse direction differs by more than 10 % at most positions, so a swapped direction
/// (or log base 2) fails.
#[test]
fn kl_is_exact_to_engine_direction_on_known_inputs() {
    let (_, per, case) = measured();
    let want = nums(&case["per_position"]["kl"]);
    let reverse = nums(&case["per_position"]["kl_reverse"]);
    assert_eq!(per.len(), want.len());
    let apart = want
        .iter()
        .zip(&reverse)
        .filter(|&(&f, &r)| (r - f).abs() > 0.1 * f)
        .count();
    assert!(
        apart >= 100,
        "the data must tell the directions apart: {apart}"
    );
    for (pos, (s, &w)) in per.iter().zip(&want).enumerate() {
        assert_close(&format!("kl at position {pos}"), s.kl, w, TWO_WAYS);
    }
}

/// kl_mean is the mean over positions, kl_p99 the nearest rank (the second largest of 120
/// here, apart from the largest and the third), kl_max the largest.
#[test]
fn kl_mean_p99_and_max_summarize_the_positions_by_nearest_rank() {
    let (m, _, case) = measured();
    let want = &case["measured"];
    assert_eq!(m.positions, int(&want["positions"]));
    assert_close("kl_mean", m.kl_mean, num(&want["kl_mean"]), TWO_WAYS);
    assert_close("kl_p99", m.kl_p99, num(&want["kl_p99"]), TWO_WAYS);
    assert_close("kl_max", m.kl_max, num(&want["kl_max"]), TWO_WAYS);
    let reverse = num(&case["kl_mean_reverse"]);
    assert!((reverse - m.kl_mean).abs() > 0.1 * m.kl_mean);
}

/// Top-1 is the share of positions whose first argmax agrees with the exact row's: the
/// rows hold disagreements, a tie both sides break to its first index, and a tie the exact
/// row breaks to its first index while the engine's maximum is the other one. Exact.
#[test]
fn top1_is_the_share_of_positions_whose_first_argmax_agrees() {
    let (m, per, case) = measured();
    let want = &case["per_position"];
    let exact = ints(&want["top1_exact"]);
    let engine = ints(&want["top1_engine"]);
    for (pos, s) in per.iter().enumerate() {
        assert_eq!(
            (s.top1_exact, s.top1_engine),
            (exact[pos], engine[pos]),
            "argmaxes at position {pos}"
        );
    }
    assert_same("top1", m.top1, num(&case["measured"]["top1"]));
}

/// The RMS of `engine − exact` runs over every logit of every position (relative 1e-12),
/// and each position's max |Δlogit| is exact.
#[test]
fn rms_runs_over_every_logit_and_max_abs_over_each_position() {
    let (m, per, case) = measured();
    assert_close("rms", m.rms, num(&case["measured"]["rms"]), SUM_ORDER);
    let want = nums(&case["per_position"]["max_abs"]);
    for (pos, (s, &w)) in per.iter().zip(&want).enumerate() {
        assert_same(&format!("max_abs at position {pos}"), s.max_abs, w);
    }
}

/// |Δlogit| is taken at the exact row's five largest logits, a tie at the fifth going to
/// the lower index (the higher one carries a Δ of 50 that would become the maximum); the
/// median of an even count averages the middle two. Exact.
#[test]
fn top5_is_taken_at_the_exact_rows_five_largest_logits() {
    let (m, _, case) = measured();
    let want = &case["measured"];
    assert_same("top5_median", m.top5_median, num(&want["top5_median"]));
    assert_same("top5_max", m.top5_max, num(&want["top5_max"]));
}

/// A calibration banks kl_mean × 1.5, kl_p99 × 2 and rms × 1.25 with their floors, and
/// top-1 less 2 % of the positions rounded up (at least one position). Exact.
#[test]
fn calibrated_bounds_bank_the_documented_headroom() {
    for case in list(&data()["exact_bounds"]) {
        let m = &case["measured"];
        let measured = Measured {
            positions: int(&m["positions"]),
            kl_mean: num(&m["kl_mean"]),
            kl_p99: num(&m["kl_p99"]),
            kl_max: num(&m["kl_max"]),
            top1: num(&m["top1"]),
            rms: num(&m["rms"]),
            top5_median: num(&m["top5_median"]),
            top5_max: num(&m["top5_max"]),
        };
        let b = Bound::from_measured("arm", "sha", "doors", "prefill", measured, "test");
        let want = &case["bound"];
        let what = |field: &str| format!("{}: {field}", name(case));
        assert_same(
            &what("kl_mean_max"),
            b.kl_mean_max,
            num(&want["kl_mean_max"]),
        );
        assert_same(&what("kl_p99_max"), b.kl_p99_max, num(&want["kl_p99_max"]));
        assert_same(&what("rms_max"), b.rms_max, num(&want["rms_max"]));
        assert_same(&what("top1_min"), b.top1_min, num(&want["top1_min"]));
    }
}

/// The p-value is the upper tail P(X ≥ x) of chi-square with df degrees of freedom, df 1 to
/// 400, p from 0.95 down to 1e-30, relative 1e-9.
#[test]
fn chi2_sf_is_the_upper_tail_on_known_answers() {
    let cases = list(&data()["chi2_sf"]);
    assert!(cases.len() > 80);
    for case in cases {
        let (x, df) = (num(&case["x"]), int(&case["df"]));
        assert_close(
            &format!("chi2_sf({x}, {df})"),
            chi2_sf(x, df),
            num(&case["p"]),
            TWO_WAYS,
        );
    }
}

/// Bins in descending order of expected count (equal ones in index order), each of at
/// least five alone, smaller ones grouped until they reach five (five exactly closes a
/// group), the remainder joining the last group. The bin count is exact, the statistic
/// relative 1e-12.
#[test]
fn pooled_chi2_pools_small_bins_as_documented() {
    for case in list(&data()["pooled_chi2"]) {
        let counts = ints(&case["counts"]);
        let expected = nums(&case["expected"]);
        let (chi2, bins) = pooled_chi2(&counts, &expected);
        assert_eq!(bins, int(&case["bins"]), "{}: bins", name(case));
        assert_close(
            &format!("{}: chi2", name(case)),
            chi2,
            num(&case["chi2"]),
            SUM_ORDER,
        );
    }
}

fn params(case: &Value) -> SamplingParams {
    SamplingParams {
        temperature: num32(&case["temperature"]),
        top_k: int(&case["top_k"]) as u32,
        top_p: num32(&case["top_p"]),
        seed: 0,
    }
}

/// The reference distribution keeps the non-NaN tokens top-k (with ties at the cut) and
/// the nucleus keep, in token order, with the softmax at the temperature renormalized over
/// them. Tokens exact, probabilities relative 1e-12.
#[test]
fn reference_distribution_is_the_truncated_softmax() {
    for case in list(&data()["distribution_test"]) {
        let p = params(case);
        let d = sampler::distribution(&nums32(&case["logits"]), p.temperature, p.top_k, p.top_p);
        let kept: Vec<u32> = d.kept.iter().map(|&(t, _)| t).collect();
        assert_eq!(kept, tokens(&case["kept"]), "{}: kept tokens", name(case));
        for (&(t, q), want) in d.kept.iter().zip(nums(&case["probabilities"])) {
            assert_close(&format!("{}: P({t})", name(case)), q, want, SUM_ORDER);
        }
    }
}

/// The distribution test counts the given draws against the reference's probabilities
/// times the number of draws (draws outside the nucleus counted apart), pools, and takes
/// the p-value at bins − 1 degrees of freedom. Counts exact, chi2 and p relative 1e-9.
#[test]
fn distribution_test_reports_known_bins_chi2_and_p_value() {
    for case in list(&data()["distribution_test"]) {
        let row = nums32(&case["logits"]);
        let draws = tokens(&case["tokens"]);
        let t = distribution_test(&row, &params(case), draws.len(), |step| Ok(draws[step]))
            .expect("the draws are given");
        let what = |field: &str| format!("{}: {field}", name(case));
        assert_eq!(t.draws, draws.len(), "{}", what("draws"));
        assert_eq!(t.kept, list(&case["kept"]).len(), "{}", what("kept"));
        assert_eq!(t.bins, int(&case["bins"]), "{}", what("bins"));
        assert_eq!(t.outside, int(&case["outside"]), "{}", what("outside"));
        let first = case["first_outside"].as_u64().map(|x| x as u32);
        assert_eq!(t.first_outside, first, "{}", what("first_outside"));
        assert_close(&what("chi2"), t.chi2, num(&case["chi2"]), TWO_WAYS);
        assert_close(&what("p_value"), t.p_value, num(&case["p_value"]), TWO_WAYS);
    }
}

/// The ledger counts values, rows and mismatched rows (a length difference in tokens is one
/// mismatch more), keeps the largest |ref − got| over values whose bits differ (-0.0 against
/// 0.0 differs by 0, NaN against a number by infinity, equal NaNs not at all) and the first
/// mismatch ever seen; its check row reports the same. Exact.
#[test]
fn ledger_counts_maxdiff_and_first_mismatch_are_known() {
    for case in list(&data()["ledger"]) {
        let mut l = Ledger::default();
        for op in list(&case["ops"]) {
            let step = op["step"].as_u64().map(|s| s as usize);
            match op["kind"].as_str() {
                Some("logits") => l.logits(
                    step,
                    &nums32(&op["reference"]),
                    &nums32(&op["got"]),
                    int(&op["n_vocab"]),
                ),
                Some("tokens") => l.tokens(step, &tokens(&op["reference"]), &tokens(&op["got"])),
                other => panic!("{}: unknown op {other:?}", name(case)),
            }
        }
        let want = &case["expected"];
        let what = |field: &str| format!("{}: {field}", name(case));
        assert_eq!(
            l.compared,
            want["compared"].as_u64().unwrap(),
            "{}",
            what("compared")
        );
        assert_eq!(l.rows, want["rows"].as_u64().unwrap(), "{}", what("rows"));
        assert_eq!(
            l.rows_mismatched,
            want["rows_mismatched"].as_u64().unwrap(),
            "{}",
            what("rows_mismatched")
        );
        let maxdiff = num(&want["maxdiff"]);
        assert_same(&what("maxdiff"), l.maxdiff, maxdiff);

        let c = l.check("ledger", "known answers");
        assert_eq!(
            c.status.as_str(),
            want["status"].as_str().unwrap(),
            "{}",
            what("status")
        );
        for key in ["compared", "rows", "rows_mismatched"] {
            assert_eq!(c.metrics[key], want[key], "{}", what(key));
        }
        if maxdiff.is_finite() {
            assert_same(
                &what("metric maxdiff"),
                c.metrics["maxdiff"].as_f64().unwrap(),
                maxdiff,
            );
        } else {
            assert_eq!(c.metrics["maxdiff"], "inf", "{}", what("metric maxdiff"));
        }
        match (&c.first_mismatch, &want["first"]) {
            (None, Value::Null) => {}
            (Some(m), w) if w.is_object() => {
                let step = w["step"].as_u64().map(|s| s as usize);
                assert_eq!(
                    (m.step, m.row, m.index),
                    (step, int(&w["row"]), int(&w["index"])),
                    "{}",
                    what("first mismatch")
                );
                assert_same(&what("first reference"), m.reference, num(&w["reference"]));
                assert_same(&what("first got"), m.got, num(&w["got"]));
            }
            (got, w) => panic!("{}: got {got:?}, want {w}", what("first mismatch")),
        }
    }
}

/// max_abs is the largest |got − ref|, max_rel the largest |got − ref| / max(1, |ref|),
/// rel_rms ‖got − ref‖₂ / ‖ref‖₂; an element fails outside either bound, and the row also
/// needs equal lengths and the same argmax. rel_rms relative 1e-12, the rest exact.
#[test]
fn policy_row_reports_known_max_abs_max_rel_rel_rms_and_argmaxes() {
    for case in list(&data()["policy_row"]) {
        let policy = Policy {
            max_abs: num(&case["max_abs"]),
            max_rel: num(&case["max_rel"]),
        };
        let v = policy.row(&nums32(&case["reference"]), &nums32(&case["got"]));
        let want = &case["expected"];
        let what = |field: &str| format!("{}: {field}", name(case));
        assert_same(&what("max_abs"), v.max_abs, num(&want["max_abs"]));
        assert_same(&what("max_rel"), v.max_rel, num(&want["max_rel"]));
        assert_close(
            &what("rel_rms"),
            v.rel_rms,
            num(&want["rel_rms"]),
            SUM_ORDER,
        );
        assert_eq!(
            (v.argmax_ref, v.argmax_got),
            (
                int(&want["argmax_ref"]) as u32,
                int(&want["argmax_got"]) as u32
            ),
            "{}",
            what("argmaxes")
        );
        let first_bad = want["first_bad"].as_u64().map(|i| i as usize);
        assert_eq!(v.first_bad, first_bad, "{}", what("first_bad"));
        assert_eq!(Some(v.ok), want["ok"].as_bool(), "{}", what("ok"));
    }
}

/// The host argmax is the first index of the largest value, NaN never winning, -0.0 and
/// 0.0 equal, 0 for a row of NaN or an empty row. Exact.
#[test]
fn host_argmax_takes_the_first_maximum_and_skips_nan() {
    for case in list(&data()["host_argmax"]) {
        let row = nums32(&case["row"]);
        assert_eq!(host_argmax(&row) as usize, int(&case["argmax"]), "{row:?}");
    }
}

/// Tokens per verify divide the emitted tokens by the sequence-verifies (not the rounds),
/// acceptance the accepted drafts by the drafted ones, each denominator at least one. Exact.
#[test]
fn spec_ratios_divide_by_verifies_and_drafted_tokens() {
    for case in list(&data()["spec_stats"]) {
        let s = &case["stats"];
        let stats = SpecStats {
            rounds: int(&s["rounds"]),
            verifies: int(&s["verifies"]),
            columns: int(&s["columns"]),
            drafted: int(&s["drafted"]),
            accepted: int(&s["accepted"]),
            emitted: int(&s["emitted"]),
        };
        assert_same(
            &format!("tokens_per_verify of {s}"),
            stats.tokens_per_verify(),
            num(&case["tokens_per_verify"]),
        );
        assert_same(
            &format!("acceptance of {s}"),
            stats.acceptance(),
            num(&case["acceptance"]),
        );
    }
}

/// The q8_0 KV cache's rounding (`twin::kv_round_q8_0`, which both backends run) gives every
/// value of known rows exactly: a spread block, one whose values sit near the half-way
/// points of its grid, an all-zero block and one with a lone large value. exact-gate's bound
/// on the cache's distance from the f32 cache leaves room a wrong rounding could hide in;
/// this row leaves none. Bit for bit.
#[test]
fn the_q8_0_cache_rounds_known_rows_exactly() {
    for case in list(&data()["kv_q8_0"]) {
        let mut row = nums32(&case["row"]);
        let want = nums32(&case["rounded"]);
        memra_kernels::twin::kv_round_q8_0(&mut row).unwrap();
        for (i, (g, w)) in row.iter().zip(&want).enumerate() {
            assert_eq!(g.to_bits(), w.to_bits(), "value {i}: got {g}, want {w}");
        }
    }
}
