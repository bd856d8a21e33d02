"""The numeric checks a gate runs on a reference and a candidate: bitwise equality,
closeness, argmax agreement, KL divergence, top-k overlap and token streams. Each returns
a `Verdict` (status, message, metrics, first mismatch) and writes nothing; `Gate.check_*`
turns one into a row.

Arrays are read as `memra_gate.arrays` takes them (numpy, torch, `BF16`). A row is a
position along every axis but the last, flattened (``[B, T, V]`` has ``B*T`` rows), and the
index a position in the last axis. numpy is imported when a check first runs.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

from .arrays import as_raw, as_values, bf16_to_float32
from .wire import FAIL, PASS, FirstMismatch


class Verdict(NamedTuple):
    status: str
    message: str
    metrics: dict
    first_mismatch: FirstMismatch | None = None


def _np():
    import numpy

    return numpy


def _g(x: float) -> str:
    """A number for a message: short, and the same for NaN and infinities as in rows."""
    x = float(x)
    if math.isnan(x):
        return "NaN"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    return f"{x:.4g}"


def _shape(a) -> list:
    return [int(n) for n in a.shape]


def _shapes_differ(ref, got) -> Verdict | None:
    # No metrics: any number would read as a measurement of values never compared.
    if ref.shape == got.shape:
        return None
    return Verdict(FAIL, f"shapes differ: ref {_shape(ref)}, got {_shape(got)}", {})


def _position(shape, flat: int):
    """(row, index) of element `flat` of an array of `shape`, in C order."""
    last = shape[-1] if len(shape) else 1
    return flat // last, flat % last


def _rows(a):
    """`a` as a 2-D array of rows along its last axis."""
    if a.ndim == 0:
        return a.reshape(1, 1)
    return a.reshape(-1, a.shape[-1])


def _floats(ref, got):
    np = _np()
    return (
        np.asarray(as_values(ref), dtype=np.float64),
        np.asarray(as_values(got), dtype=np.float64),
    )



def _float_rows(ref, got):
    """Both sides as float64 rows along the last axis, or the failing Verdict when their
    shapes differ (the prologue of every row-wise check)."""
    r, g = _floats(ref, got)
    differ = _shapes_differ(r, g)
    if differ:
        return differ
    return _rows(r), _rows(g)

def bitwise(ref: Any, got: Any) -> Verdict:
    """Pass when `ref` and `got` have the same dtype, shape and raw bits everywhere (NaNs
    with equal bits are equal, 0.0 and -0.0 differ). Metrics: compared, mismatches."""
    np = _np()
    ref_dtype, r = as_raw(ref)
    got_dtype, g = as_raw(got)
    r, g = np.asarray(r), np.asarray(g)
    if ref_dtype != got_dtype:
        return Verdict(FAIL, f"dtypes differ: ref {ref_dtype}, got {got_dtype}", {})
    differ = _shapes_differ(r, g)
    if differ:
        return differ
    word = np.dtype(f"u{r.dtype.itemsize}")
    rb = np.ascontiguousarray(r).view(word).reshape(r.shape)
    gb = np.ascontiguousarray(g).view(word).reshape(g.shape)
    bad = (rb != gb).reshape(-1)
    mismatches = int(bad.sum())
    metrics = {"compared": int(r.size), "mismatches": mismatches}
    if not mismatches:
        return Verdict(
            PASS, f"{r.size} values of {ref_dtype} {_shape(r)} equal bit for bit", metrics
        )
    flat = int(np.argmax(bad))

    def value(a, dtype):
        x = a.reshape(-1)[flat]
        return float(bf16_to_float32(x)) if dtype == "BF16" else float(x)

    row, index = _position(r.shape, flat)
    m = FirstMismatch(row=row, index=index, ref=value(r, ref_dtype), got=value(g, got_dtype))
    return Verdict(
        FAIL,
        f"{mismatches} of {r.size} values of {ref_dtype} {_shape(r)} differ in their bits; "
        f"first at {m}",
        metrics,
        m,
    )


def close(
    ref: Any, got: Any, max_abs: float | None = None, max_rel: float | None = None
) -> Verdict:
    """Pass when every value of `got` is within `max_abs` of `ref` and within `max_rel`
    relative to it (``|got - ref| / max(1, |ref|)``), in float64; with neither bound, when
    every value is equal. Equal infinities and NaN against NaN count as equal; NaN against a
    number is infinitely far. Metrics: max_abs, max_rel, compared, mismatches."""
    np = _np()
    r, g = _floats(ref, got)
    differ = _shapes_differ(r, g)
    if differ:
        return differ
    same = (r == g) | (np.isnan(r) & np.isnan(g))
    with np.errstate(invalid="ignore", over="ignore"):
        diff = np.where(same, 0.0, np.abs(g - r))
        diff = np.where(np.isnan(diff), np.inf, diff)
        rel = np.where(same, 0.0, diff / np.maximum(1.0, np.abs(r)))
        rel = np.where(np.isnan(rel), np.inf, rel)
    bad = np.zeros(r.shape, dtype=bool)
    if max_abs is not None:
        bad |= diff > max_abs
    if max_rel is not None:
        bad |= rel > max_rel
    if max_abs is None and max_rel is None:
        bad = ~same
    bad = bad.reshape(-1)
    mismatches = int(bad.sum())
    worst_abs = float(diff.max()) if r.size else 0.0
    worst_rel = float(rel.max()) if r.size else 0.0
    metrics = {
        "max_abs": worst_abs,
        "max_rel": worst_rel,
        "compared": int(r.size),
        "mismatches": mismatches,
    }
    bounds = (
        ", ".join(
            f"{k} {_g(v)}" for k, v in (("max_abs", max_abs), ("max_rel", max_rel)) if v is not None
        )
        or "equality"
    )
    summary = f"max |got - ref| {_g(worst_abs)} (relative {_g(worst_rel)}) over {r.size} values"
    if not mismatches:
        return Verdict(PASS, f"{summary}, within {bounds}", metrics)
    flat = int(np.argmax(bad))
    row, index = _position(r.shape, flat)
    m = FirstMismatch(
        row=row, index=index, ref=float(r.reshape(-1)[flat]), got=float(g.reshape(-1)[flat])
    )
    return Verdict(FAIL, f"{summary}; {mismatches} beyond {bounds}, first at {m}", metrics, m)


def argmax(ref: Any, got: Any, min_agree: float = 1.0) -> Verdict:
    """Pass when the share of rows whose argmax (along the last axis, first of equal
    maxima) is the same in `got` as in `ref` is at least `min_agree`. Metrics: rows,
    agree. The first mismatch names the first disagreeing row at the reference's argmax."""
    np = _np()
    pair = _float_rows(ref, got)
    if isinstance(pair, Verdict):
        return pair
    r, g = pair
    if r.shape[1] == 0:
        raise ValueError("argmax needs a last axis of at least one value")
    # NaN never wins (numpy's argmax would pick the first NaN); a row of NaN only has no
    # argmax (-1), which agrees only with another row of NaN only.
    def best(x):
        masked = np.where(np.isnan(x), -np.inf, x)
        idx = masked.argmax(axis=1)
        return np.where(np.isnan(x).all(axis=1), -1, idx)

    ar, ag = best(r), best(g)
    same = ar == ag
    rows = int(r.shape[0])
    agree = float(same.mean()) if rows else 1.0
    metrics = {"rows": rows, "agree": agree}
    summary = f"argmax agrees on {int(same.sum())} of {rows} rows (min {_g(min_agree)})"
    if agree >= min_agree:
        return Verdict(PASS, summary, metrics)
    row = int(np.argmin(same))
    index = int(ar[row])
    m = FirstMismatch(row=row, index=index, ref=float(r[row, index]), got=float(g[row, index]))
    return Verdict(
        FAIL,
        f"{summary}; first differing row {row}: ref argmax {index}, got argmax {int(ag[row])}",
        metrics,
        m,
    )


def _log_softmax(x):
    np = _np()
    top = x.max(axis=1, keepdims=True)
    top = np.where(np.isfinite(top), top, 0.0)
    z = x - top
    with np.errstate(divide="ignore"):
        return z - np.log(np.exp(z).sum(axis=1, keepdims=True))


def kl(
    ref: Any,
    got: Any,
    max_mean: float | None = None,
    max: float | None = None,  # noqa: A002 - the metric it bounds is kl_max
) -> Verdict:
    """KL(softmax(ref) || softmax(got)) of each row of logits, in float64 (log-sum-exp
    stable; a value the reference gives no mass adds nothing). Pass when every row's KL is
    finite, the mean is at most `max_mean` and the largest at most `max` (each bound only
    when given). Metrics: kl_mean, kl_max, rows. The first mismatch is the first row over
    `max` (or not finite, else the worst row) at the value that adds most to its KL."""
    np = _np()
    pair = _float_rows(ref, got)
    if isinstance(pair, Verdict):
        return pair
    r, g = pair
    if r.shape[1] == 0:
        raise ValueError("kl needs a last axis of at least one logit")
    lr, lg = _log_softmax(r), _log_softmax(g)
    p = np.exp(lr)
    with np.errstate(invalid="ignore"):
        terms = np.where(p == 0, 0.0, p * (lr - lg))
    per_row = np.maximum(terms.sum(axis=1), 0.0)
    rows = int(r.shape[0])
    kl_mean = float(per_row.mean()) if rows else 0.0
    kl_max = float(per_row.max()) if rows else 0.0
    metrics = {"kl_mean": kl_mean, "kl_max": kl_max, "rows": rows}
    bounds = ", ".join(
        f"{k} {_g(v)}" for k, v in (("max_mean", max_mean), ("max", max)) if v is not None
    )
    summary = f"KL(ref || got) mean {_g(kl_mean)}, max {_g(kl_max)} over {rows} rows"
    finite = np.isfinite(per_row)
    over = ~finite
    if max is not None:
        over |= per_row > max
    mean_over = max_mean is not None and not kl_mean <= max_mean
    if not over.any() and not mean_over:
        return Verdict(PASS, summary + (f", within {bounds}" if bounds else ""), metrics)
    row = int(np.argmax(over)) if over.any() else int(np.argmax(per_row))
    contributions = terms[row]
    nan = np.isnan(contributions)
    index = int(np.argmax(nan)) if nan.any() else int(np.argmax(contributions))
    m = FirstMismatch(row=row, index=index, ref=float(r[row, index]), got=float(g[row, index]))
    why = f"beyond {bounds}" if bounds else "not finite"
    return Verdict(FAIL, f"{summary}; {why}, row {row} KL {_g(per_row[row])}", metrics, m)


def _top(x, k: int):
    np = _np()
    # A stable sort of the negated values: of equal values the lower index ranks first, so
    # the same logits always give the same top k.
    return np.argsort(-x, axis=1, kind="stable")[:, :k]


def topk(ref: Any, got: Any, k: int = 5, min_overlap: float = 1.0) -> Verdict:
    """Pass when, in every row, at least `min_overlap` of the `k` largest values of `ref`
    are among the `k` largest of `got` (overlap ``|topk(ref) ∩ topk(got)| / k``). Metrics:
    topk_min_overlap, topk_mean_overlap, rows, k. The first mismatch names the first row
    below `min_overlap` at its best-ranked reference index missing from got's top k."""
    np = _np()
    pair = _float_rows(ref, got)
    if isinstance(pair, Verdict):
        return pair
    r, g = pair
    if not 1 <= k <= r.shape[1]:
        raise ValueError(f"topk needs 1 <= k <= {r.shape[1]} (the last axis), not k={k}")
    tr, tg = _top(r, k), _top(g, k)
    found = (tr[:, :, None] == tg[:, None, :]).any(axis=2)
    overlap = found.sum(axis=1) / k
    rows = int(r.shape[0])
    lowest = float(overlap.min()) if rows else 1.0
    mean = float(overlap.mean()) if rows else 1.0
    metrics = {"topk_min_overlap": lowest, "topk_mean_overlap": mean, "rows": rows, "k": k}
    summary = (
        f"top-{k} overlap min {_g(lowest)}, mean {_g(mean)} over {rows} rows "
        f"(min {_g(min_overlap)})"
    )
    if lowest >= min_overlap:
        return Verdict(PASS, summary, metrics)
    row = int(np.argmax(overlap < min_overlap))
    index = int(tr[row][np.argmin(found[row])])
    m = FirstMismatch(row=row, index=index, ref=float(r[row, index]), got=float(g[row, index]))
    return Verdict(
        FAIL,
        f"{summary}; row {row} overlaps {_g(overlap[row])}, "
        f"ref's index {index} is not in got's top {k}",
        metrics,
        m,
    )


def _sequences(x: Any) -> list:
    """Token streams: a [S, T] or [T] array, or a list of sequences of any lengths."""
    np = _np()
    if isinstance(x, (list, tuple)) and x and not all(isinstance(t, (int, float)) for t in x):
        seqs = [np.asarray(as_values(s)) for s in x]
        if all(s.ndim == 1 for s in seqs):
            return seqs
    a = np.asarray(as_values(x))
    if a.ndim == 1:
        return [a]
    if a.ndim == 2:
        return list(a)
    raise ValueError(f"token streams are [S, T] or [T], not {_shape(a)}")


def tokens(ref: Any, got: Any) -> Verdict:
    """Pass when the token streams are equal: the same sequences, each the same tokens.
    A sequence that ends early (or is missing) diverges where it ends, the missing token
    given as NaN. Metrics: sequences, diverged, first_divergent_step (-1 when none). The
    first mismatch is the earliest divergence: row = sequence, index = step."""
    np = _np()
    rs, gs = _sequences(ref), _sequences(got)
    count = max(len(rs), len(gs))
    none = np.zeros(0)
    first = None  # (step, sequence, ref token, got token)
    diverged = 0
    for s in range(count):
        r = rs[s] if s < len(rs) else none
        g = gs[s] if s < len(gs) else none
        n = min(len(r), len(g))
        differ = np.flatnonzero(r[:n] != g[:n])
        if differ.size:
            step = int(differ[0])
        elif len(r) != len(g):
            step = n
        else:
            continue
        diverged += 1
        if first is None or step < first[0]:
            first = (step, s, _token(r, step), _token(g, step))
    metrics = {
        "sequences": count,
        "diverged": diverged,
        "first_divergent_step": first[0] if first else -1,
    }
    if first is None:
        total = sum(len(r) for r in rs)
        return Verdict(PASS, f"{count} sequences ({total} tokens) agree", metrics)
    step, seq, r_token, g_token = first
    m = FirstMismatch(row=seq, index=step, ref=r_token, got=g_token)
    return Verdict(
        FAIL,
        f"{diverged} of {count} sequences diverge; first at sequence {seq}, step {step}: "
        f"ref {_g(r_token)}, got {_g(g_token)}",
        metrics,
        m,
    )


def _token(seq, t: int) -> float:
    return float(seq[t]) if t < len(seq) else math.nan
