"""The numeric checks: each passes on what it should, fails on what it should, and locates
the first mismatch (row = flattened leading position, index = position in the last axis)."""

import math

import numpy as np
import pytest

import memra_gate as mg
from memra_gate import compare


def test_bitwise_equal_arrays_pass():
    ref = np.arange(12, dtype=np.float32).reshape(2, 2, 3)
    v = compare.bitwise(ref, ref.copy())
    assert (v.status, v.metrics, v.first_mismatch) == (
        mg.PASS,
        {"compared": 12, "mismatches": 0},
        None,
    )


def test_bitwise_locates_the_first_differing_bits():
    ref = np.zeros((2, 3, 4), dtype=np.float32)
    got = ref.copy()
    got[1, 2, 3] = 1.0
    got[1, 0, 1] = -0.0  # 0.0 and -0.0 differ in their bits
    v = compare.bitwise(ref, got)
    assert v.status == mg.FAIL
    assert v.metrics == {"compared": 24, "mismatches": 2}
    assert v.first_mismatch == mg.FirstMismatch(row=3, index=1, ref=0.0, got=-0.0)
    assert "2 of 24 values of F32 [2, 3, 4] differ" in v.message


def test_bitwise_nans_with_equal_bits_are_equal_and_others_not():
    nan = np.array([np.nan, 1.0])
    assert compare.bitwise(nan, nan.copy()).status == mg.PASS
    other = np.array([np.nan, 1.0])
    other.view(np.uint64)[0] |= np.uint64(1)  # another NaN payload
    v = compare.bitwise(nan, other)
    assert v.status == mg.FAIL and v.first_mismatch.row == 0 and v.first_mismatch.index == 0
    assert math.isnan(v.first_mismatch.ref) and math.isnan(v.first_mismatch.got)


def test_bitwise_of_bf16_integers_and_bools():
    ref = mg.BF16(np.array([1.0, 2.0, 3.0], dtype=np.float32))
    got = mg.BF16.from_bits(ref.bits.copy())
    assert compare.bitwise(ref, got).status == mg.PASS
    got.bits[2] += 1
    v = compare.bitwise(ref, got)
    assert v.first_mismatch == mg.FirstMismatch(row=0, index=2, ref=3.0, got=3.015625)
    assert (
        compare.bitwise(np.array([1, 2], np.int64), np.array([1, 3], np.int64)).first_mismatch.got
        == 3.0
    )
    assert compare.bitwise(np.array([True]), np.array([False])).status == mg.FAIL
    scalar = compare.bitwise(np.float64(1.0), np.float64(2.0))
    assert scalar.first_mismatch == mg.FirstMismatch(row=0, index=0, ref=1.0, got=2.0)


def test_bitwise_fails_on_other_dtypes_or_shapes():
    v = compare.bitwise(np.zeros(3, np.float32), mg.BF16(np.zeros(3, np.float32)))
    assert (v.status, v.message, v.metrics) == (mg.FAIL, "dtypes differ: ref F32, got BF16", {})
    v = compare.bitwise(np.zeros((2, 3)), np.zeros((3, 2)))
    assert (v.status, v.message, v.metrics) == (
        mg.FAIL,
        "shapes differ: ref [2, 3], got [3, 2]",
        {},
    )
    for check in (compare.close, compare.argmax, compare.kl, compare.topk):
        v = check(np.zeros((2, 3)), np.zeros((2, 4)))
        assert (v.status, v.message, v.metrics) == (
            mg.FAIL,
            "shapes differ: ref [2, 3], got [2, 4]",
            {},
        )
    with pytest.raises(TypeError, match="cannot take an array of dtype complex128"):
        compare.bitwise(np.zeros(2, complex), np.zeros(2, complex))


def test_close_within_bounds_passes():
    ref = np.array([1.0, 100.0, -3.0])
    got = ref + np.array([1e-4, 5e-3, 0.0])
    v = compare.close(ref, got, max_abs=1e-2)
    assert v.status == mg.PASS
    assert v.metrics["compared"] == 3 and v.metrics["mismatches"] == 0
    assert v.metrics["max_abs"] == pytest.approx(5e-3)
    # Relative to max(1, |ref|): 5e-3 at 100 is 5e-5, 1e-4 at 1 is 1e-4.
    assert v.metrics["max_rel"] == pytest.approx(1e-4)
    assert compare.close(ref, got, max_rel=2e-4).status == mg.PASS
    assert compare.close(ref, got, max_abs=1e-3).status == mg.FAIL
    assert compare.close(ref, got, max_abs=1e-2, max_rel=1e-5).status == mg.FAIL


def test_close_locates_the_first_value_beyond():
    ref = np.zeros((3, 4))
    got = ref.copy()
    got[1, 3] = 0.5
    got[2, 0] = 2.0
    v = compare.close(ref, got, max_abs=0.25)
    assert v.status == mg.FAIL
    assert v.metrics == {"max_abs": 2.0, "max_rel": 2.0, "compared": 12, "mismatches": 2}
    assert v.first_mismatch == mg.FirstMismatch(row=1, index=3, ref=0.0, got=0.5)


def test_close_without_bounds_is_equality_and_handles_nan_and_inf():
    ref = np.array([1.0, np.nan, np.inf, -np.inf])
    assert compare.close(ref, ref.copy()).status == mg.PASS
    got = np.array([1.0, 1.0, np.inf, -np.inf])
    v = compare.close(ref, got, max_abs=1e9)
    assert v.status == mg.FAIL
    assert v.metrics["max_abs"] == math.inf  # written as null
    assert v.first_mismatch.index == 1 and math.isnan(v.first_mismatch.ref)
    v = compare.close(np.array([np.inf]), np.array([1e300]), max_rel=1.0)
    assert v.status == mg.FAIL
    v = compare.close(np.array([1.0, 2.0]), np.array([1.0, 2.0 + 1e-15]))
    assert v.status == mg.FAIL and v.first_mismatch.index == 1
    assert compare.close(np.zeros(2), np.zeros(3)).status == mg.FAIL


def test_close_takes_bf16_and_lists():
    assert compare.close(mg.BF16([1.0, 2.0]), [1.0, 2.0]).status == mg.PASS
    assert compare.close(mg.BF16([1.0, 2.001]), [1.0, 2.001], max_abs=1e-2).status == mg.PASS


def test_argmax_agreement():
    ref = np.array([[0.1, 0.9, 0.0], [0.5, 0.2, 0.3], [0.0, 0.0, 1.0], [1.0, 0.0, 0.0]])
    got = ref.copy()
    v = compare.argmax(ref, got)
    assert (v.status, v.metrics) == (mg.PASS, {"rows": 4, "agree": 1.0})
    got[2] = [0.0, 2.0, 1.0]
    v = compare.argmax(ref, got)
    assert v.status == mg.FAIL
    assert v.metrics == {"rows": 4, "agree": 0.75}
    assert v.first_mismatch == mg.FirstMismatch(row=2, index=2, ref=1.0, got=1.0)
    assert "ref argmax 2, got argmax 1" in v.message
    assert compare.argmax(ref, got, min_agree=0.75).status == mg.PASS


def test_argmax_rows_span_the_leading_axes():
    ref = np.zeros((2, 3, 5))
    ref[..., 0] = 1.0
    got = ref.copy()
    got[1, 1, 4] = 5.0
    v = compare.argmax(ref, got)
    assert v.metrics["rows"] == 6 and v.first_mismatch.row == 4 and v.first_mismatch.index == 0


def test_kl_of_equal_logits_is_zero_and_of_shifted_logits_too():
    ref = np.random.default_rng(1).standard_normal((8, 50)) * 5
    v = compare.kl(ref, ref + 3.0, max_mean=1e-12, max=1e-12)
    assert v.status == mg.PASS
    assert v.metrics["rows"] == 8
    assert v.metrics["kl_max"] < 1e-12


def test_kl_matches_the_definition_and_fails_over_bounds():
    ref = np.array([[0.0, 1.0, 2.0], [1.0, 1.0, 1.0]])
    got = np.array([[0.0, 1.0, 2.0], [2.0, 1.0, 0.0]])
    p = np.exp(ref[1]) / np.exp(ref[1]).sum()
    q = np.exp(got[1]) / np.exp(got[1]).sum()
    want = float((p * np.log(p / q)).sum())
    v = compare.kl(ref, got, max=0.01)
    assert v.metrics["kl_max"] == pytest.approx(want, rel=1e-12)
    assert v.metrics["kl_mean"] == pytest.approx(want / 2, rel=1e-12)
    assert v.status == mg.FAIL
    assert v.first_mismatch.row == 1
    # The value adding most to the row's KL: p log(p/q) is largest where q is smallest.
    assert (
        v.first_mismatch.index == 2 and v.first_mismatch.ref == 1.0 and v.first_mismatch.got == 0.0
    )
    assert compare.kl(ref, got, max_mean=want).status == mg.PASS
    assert compare.kl(ref, got, max_mean=want / 4).status == mg.FAIL


def test_kl_is_stable_for_huge_logits_and_masked_values():
    ref = np.array([[1000.0, 999.0, -np.inf]])
    got = np.array([[1000.0, 999.0, 0.0]])
    v = compare.kl(ref, got)
    assert v.status == mg.PASS and math.isfinite(v.metrics["kl_max"])
    # Mass where the candidate has none: infinite, a failure even without bounds.
    v = compare.kl(np.zeros((1, 3)), np.array([[0.0, 0.0, -np.inf]]))
    assert v.status == mg.FAIL and v.metrics["kl_max"] == math.inf
    assert v.first_mismatch.index == 2
    v = compare.kl(np.array([[1.0, 2.0]]), np.array([[1.0, np.nan]]))
    assert v.status == mg.FAIL and math.isnan(v.metrics["kl_mean"])


def test_topk_overlap():
    ref = np.array([[5.0, 4.0, 3.0, 2.0, 1.0], [1.0, 2.0, 3.0, 4.0, 5.0]])
    got = ref.copy()
    v = compare.topk(ref, got, k=3)
    assert v.status == mg.PASS
    assert v.metrics == {"topk_min_overlap": 1.0, "topk_mean_overlap": 1.0, "rows": 2, "k": 3}
    got[1] = [5.0, 2.0, 3.0, 4.0, 1.0]  # ref's top 3 of row 1 is {4, 3, 2}; got's {0, 3, 2}
    v = compare.topk(ref, got, k=3)
    assert v.status == mg.FAIL
    assert v.metrics["topk_min_overlap"] == pytest.approx(2 / 3)
    assert v.metrics["topk_mean_overlap"] == pytest.approx(5 / 6)
    assert v.first_mismatch == mg.FirstMismatch(row=1, index=4, ref=5.0, got=1.0)
    assert compare.topk(ref, got, k=3, min_overlap=0.6).status == mg.PASS
    with pytest.raises(ValueError, match="1 <= k <= 5"):
        compare.topk(ref, got, k=6)


def test_topk_breaks_ties_by_index():
    ref = np.array([[1.0, 1.0, 1.0, 0.0]])
    assert compare.topk(ref, ref[:, [0, 1, 2, 3]], k=2).status == mg.PASS
    v = compare.topk(ref, np.array([[1.0, 0.5, 1.0, 0.0]]), k=2)
    assert v.metrics["topk_min_overlap"] == 0.5 and v.first_mismatch.index == 1


def test_tokens_equal_and_diverging():
    ref = np.array([[1, 2, 3, 4], [5, 6, 7, 8], [9, 9, 9, 9]])
    v = compare.tokens(ref, ref.copy())
    assert v.status == mg.PASS
    assert v.metrics == {"sequences": 3, "diverged": 0, "first_divergent_step": -1}
    got = ref.copy()
    got[0, 3] = 0
    got[2, 1] = 0
    v = compare.tokens(ref, got)
    assert v.status == mg.FAIL
    assert v.metrics == {"sequences": 3, "diverged": 2, "first_divergent_step": 1}
    assert v.first_mismatch == mg.FirstMismatch(row=2, index=1, ref=9.0, got=0.0)
    assert v.first_mismatch.step is None


def test_tokens_of_one_stream_and_of_different_lengths():
    assert compare.tokens([1, 2, 3], np.array([1, 2, 3])).status == mg.PASS
    v = compare.tokens([1, 2, 3], [1, 2])
    assert v.status == mg.FAIL and v.metrics["first_divergent_step"] == 2
    assert v.first_mismatch.ref == 3.0 and math.isnan(v.first_mismatch.got)
    v = compare.tokens([[1, 2], [3]], [[1, 2], [3, 4]])
    assert v.metrics == {"sequences": 2, "diverged": 1, "first_divergent_step": 1}
    v = compare.tokens([[1], [2]], [[1]])
    m = v.first_mismatch
    assert (m.row, m.index, m.ref) == (1, 0, 2.0) and math.isnan(m.got)
    with pytest.raises(ValueError, match=r"\[S, T\] or \[T\]"):
        compare.tokens(np.zeros((1, 1, 1)), np.zeros((1, 1, 1)))


def test_a_verdict_is_a_row(tmp_path):
    path = tmp_path / "checks.jsonl"
    gate = mg.Gate(checks=path, artifacts=None, echo=False)
    gate.check_close("nan", np.array([1.0, 2.0]), np.array([1.0, np.nan]), max_abs=1.0)
    assert path.read_text() == (
        '{"check":"nan","status":"fail","metrics":{"max_abs":null,"max_rel":null,"compared":2,'
        '"mismatches":1},"message":"max |got - ref| inf (relative inf) over 2 values; 1 beyond '
        'max_abs 1, first at row 0, index 1: ref 2.0 got NaN","first_mismatch":{"row":0,"index":1,'
        '"ref":2.0,"got":"NaN"}}\n'
    )
