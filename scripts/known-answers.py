#!/usr/bin/env python3
"""Known answers of the statistics the gates report, computed apart from memra's code.

Each statistic is restated here from its definition (the gate's documentation and the doc
comment of the Rust function) in Python and numpy, in float64, on fixed inputs, and the
inputs and the answers are written to gates/tests/data/known-answers.json, which
gates/tests/gate_statistics.rs holds the Rust functions to. Nothing here calls or ports
memra's code: the chi-square survival function, for one, uses the closed forms of the
incomplete gamma function at integer and half-integer shape, where the Rust code uses a
series and a continued fraction. A wrong formula in a gate's statistic (a KL divergence
taken the other way round, a p-value that is the CDF, pooling that drops a remainder)
therefore fails a test by itself, whatever headroom the gate's bounds leave.

The inputs come from fixed-seed numpy generators and a few hand-made rows; they are written
into the file as well, so the Rust side reads them rather than reproducing the generator
(another numpy may draw other inputs: the answers always go with the inputs beside them).
Every float, input or answer, is written as a string holding Python's repr: it parses back
to the same bits with Rust's `str::parse::<f64>` (serde_json's default float parsing does
not promise correct rounding), and NaN and infinities can be written at all. The f32 inputs
are rounded through np.float32 before anything is computed from them.

Before writing, the script checks itself: its chi-square tail against textbook critical
values and against a power series in 250-digit decimals, its KL divergence against a second
formula, and that the inputs tell a correct formula from the plausible wrong ones (the
reverse KL differs by more than 10 %, top-1 disagrees on some positions, the tied rows
decide the tie rule, no pooling decision sits on a rounding, and so on).

Usage: "$(scripts/python-venv)" scripts/known-answers.py
   (or any Python 3 with numpy); rewrites gates/tests/data/known-answers.json.
"""

import decimal
import functools
import json
import math
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "gates" / "tests" / "data" / "known-answers.json"
FORMAT = 1


def fl(x):
    """A float as the string that parses back to the same bits."""
    return repr(float(x))


def f32(x):
    """`x` rounded to f32 and widened back, exactly."""
    return float(np.float32(x))


def first_index_of_max(values):
    """The first index of the largest non-NaN value; 0 when there is none."""
    numbers = [v for v in values if not math.isnan(v)]
    if not numbers:
        return 0
    top = max(numbers)
    return next(i for i, v in enumerate(values) if v == top)


# ---------------------------------------------------------------------------------------
# exact-gate: KL(P_exact || P_engine), top-1 agreement, RMS, |Δlogit| at the exact top five


def softmax(row):
    m = max(row)
    w = [math.exp(v - m) for v in row]
    s = math.fsum(w)
    return [x / s for x in w]


def log_softmax(row):
    m = max(row)
    lse = m + math.log(math.fsum(math.exp(v - m) for v in row))
    return [v - lse for v in row]


def kl(p_row, q_row):
    """KL(P || Q) in nats of the softmaxes of two logit rows."""
    lp, lq = log_softmax(p_row), log_softmax(q_row)
    return math.fsum(math.exp(a) * (a - b) for a, b in zip(lp, lq))


def kl_by_ratio(p_row, q_row):
    """The same divergence as Σ p·ln(p/q) on the probabilities: the script's cross-check."""
    p, q = softmax(p_row), softmax(q_row)
    return math.fsum(a * math.log(a / b) for a, b in zip(p, q) if a > 0.0)


def nearest_rank(sorted_values, q):
    """The smallest value with at least a share q of the values at or below it."""
    k = math.ceil(q * len(sorted_values))
    return sorted_values[min(max(k, 1), len(sorted_values)) - 1]


def median(sorted_values):
    n = len(sorted_values)
    if n % 2:
        return sorted_values[n // 2]
    return (sorted_values[n // 2 - 1] + sorted_values[n // 2]) / 2


def exact_measure():
    rng = np.random.default_rng(20_240_611)
    n, v = 120, 16
    exact = rng.normal(0.0, 2.0, (n, v))
    # Each position's engine row is the exact row sharpened or flattened, plus noise: the
    # two directions of the KL divergence then differ by tens of percent, and the noise
    # moves the argmax on some positions.
    scale = rng.choice([0.45, 0.6, 1.8, 2.4], size=n)
    got = exact * scale[:, None] + rng.normal(0.0, 0.7, (n, v))

    # Position 7: the exact row and the engine row both tie for the maximum at 3 and 9
    # (the first index wins on both sides: top-1 agrees).
    exact[7] = np.clip(exact[7], -5.0, 5.0)
    exact[7, 3] = exact[7, 9] = 6.0
    got[7] = exact[7] + rng.normal(0.0, 0.3, v)
    got[7, 3] = got[7, 9] = 6.5
    # Position 42: the exact row ties at 2 and 7, the engine's maximum is 7 alone: top-1
    # disagrees, and would agree under a last-index tie rule.
    exact[42] = np.clip(exact[42], -5.0, 5.0)
    exact[42, 2] = exact[42, 7] = 6.0
    got[42] = exact[42] + rng.normal(0.0, 0.3, v)
    got[42, 2], got[42, 7] = 6.0, 7.0
    # Position 99: the exact row's fifth and sixth largest tie (4 and 12); the engine is far
    # off at 12 only, so |Δlogit| at the top five must take 4, the lower index.
    exact[99] = np.clip(exact[99], -4.0, 3.5)
    exact[99, :4] = [9.0, 8.0, 7.0, 6.0]
    exact[99, 4] = exact[99, 12] = 5.0
    got[99] = exact[99] + rng.normal(0.0, 0.2, v)
    got[99, 12] = exact[99, 12] + 50.0

    got = got.astype(np.float32).astype(np.float64)
    rows_e = [list(map(float, r)) for r in exact]
    rows_g = [list(map(float, r)) for r in got]

    kls, kls_rev, top1_e, top1_g, max_abs, top5 = [], [], [], [], [], []
    squares = []
    for r, g in zip(rows_e, rows_g):
        forward = kl(r, g)
        assert abs(forward - kl_by_ratio(r, g)) <= 1e-12 * max(forward, 1e-3), (forward,)
        kls.append(max(forward, 0.0))
        kls_rev.append(kl(g, r))
        top1_e.append(first_index_of_max(r))
        top1_g.append(first_index_of_max(g))
        diffs = [abs(b - a) for a, b in zip(r, g)]
        max_abs.append(max(diffs))
        squares.extend((b - a) ** 2 for a, b in zip(r, g))
        order = sorted(range(v), key=lambda i: -r[i])
        top5.extend(diffs[i] for i in order[:5])

    kls_sorted = sorted(kls)
    top5_sorted = sorted(top5)
    agree = sum(a == b for a, b in zip(top1_e, top1_g))
    measured = {
        "positions": n,
        "kl_mean": math.fsum(kls) / n,
        "kl_p99": nearest_rank(kls_sorted, 0.99),
        "kl_max": kls_sorted[-1],
        "top1": agree / n,
        "rms": math.sqrt(math.fsum(squares) / (n * v)),
        "top5_median": median(top5_sorted),
        "top5_max": top5_sorted[-1],
    }

    # The inputs must tell the right formulas from the wrong ones.
    kl_mean_rev = math.fsum(kls_rev) / n
    assert abs(kl_mean_rev - measured["kl_mean"]) > 0.1 * measured["kl_mean"]
    differs = sum(abs(b - a) > 0.1 * a for a, b in zip(kls, kls_rev))
    assert differs >= 0.8 * n, differs
    assert 0.1 * n <= n - agree <= 0.6 * n, agree
    assert top1_e[7] == top1_g[7] == 3 and (top1_e[42], top1_g[42]) == (2, 7)
    assert abs(rows_g[99][12] - rows_e[99][12]) > 2 * measured["top5_max"]
    # p99 by nearest rank is the second largest here, apart from the largest and the third.
    assert math.ceil(0.99 * n) == n - 1
    assert kls_sorted[-1] > 1.01 * kls_sorted[-2] > 1.01 * kls_sorted[-3]
    assert top5_sorted[len(top5) // 2 - 1] != top5_sorted[len(top5) // 2]

    return {
        "v": v,
        "exact": [[fl(x) for x in r] for r in rows_e],
        "got": [[fl(x) for x in r] for r in rows_g],
        "measured": {k: (val if isinstance(val, int) else fl(val)) for k, val in measured.items()},
        "kl_mean_reverse": fl(kl_mean_rev),
        "per_position": {
            "kl": [fl(x) for x in kls],
            "kl_reverse": [fl(x) for x in kls_rev],
            "top1_exact": top1_e,
            "top1_engine": top1_g,
            "max_abs": [fl(x) for x in max_abs],
        },
    }, measured


def exact_bounds(measured):
    """The bounds a calibration banks: documented headroom, floors and the top-1 slack."""

    def bound(m):
        positions = m["positions"]
        slack = max(math.ceil(0.02 * positions), 1) / max(positions, 1)
        return {
            "kl_mean_max": max(m["kl_mean"] * 1.5, 1e-9),
            "kl_p99_max": max(m["kl_p99"] * 2.0, 1e-9),
            "rms_max": max(m["rms"] * 1.25, 1e-5),
            "top1_min": max(m["top1"] - slack, 0.0),
        }

    float_arm = {
        "positions": 54,
        "kl_mean": 3.0e-12,
        "kl_p99": 2.0e-10,
        "kl_max": 4.0e-10,
        "top1": 1.0,
        "rms": 4.0e-6,
        "top5_median": 1.0e-6,
        "top5_max": 9.0e-6,
    }
    one = dict(float_arm, positions=1, top1=0.0)
    cases = []
    for name, m in [("measured", measured), ("float-arm floors", float_arm), ("one position", one)]:
        cases.append(
            {
                "name": name,
                "measured": {k: (val if isinstance(val, int) else fl(val)) for k, val in m.items()},
                "bound": {k: fl(val) for k, val in bound(m).items()},
            }
        )
    # The slack rounds up: 2.4 positions of 120 allow 3.
    assert bound(measured)["top1_min"] == measured["top1"] - 3 / 120
    return cases


# ---------------------------------------------------------------------------------------
# sampling-gate: the chi-square statistic with small bins pooled, and its p-value

MIN_EXPECTED = 5.0


@functools.cache
def log_factorial(n):
    return math.log(math.factorial(n))


def log_gamma_half(j):
    """ln Γ(j + 1/2) = ln((2j)! / (4^j j!) · √π), from exact integers."""
    return (
        log_factorial(2 * j) - log_factorial(j) - j * math.log(4.0) + 0.5 * math.log(math.pi)
    )


def chi2_sf(x, df):
    """P(X ≥ x), X chi-square with df ≥ 1 degrees of freedom: Q(df/2, x/2) by its closed
    forms, Q(k, y) = e^-y Σ_{j<k} y^j / j! and Q(k + 1/2, y) = erfc(√y) + e^-y Σ_{j<k}
    y^(j+1/2) / Γ(j + 3/2), every term positive, so the far tail keeps its relative
    precision."""
    assert df >= 1 and x > 0.0
    y = x / 2.0
    k = df // 2
    if df % 2 == 0:
        return math.fsum(math.exp(j * math.log(y) - y - log_factorial(j)) for j in range(k))
    tail = math.fsum(
        math.exp((j + 0.5) * math.log(y) - y - log_gamma_half(j + 1)) for j in range(k)
    )
    return math.erfc(math.sqrt(y)) + tail


def check_chi2_sf():
    table = [
        (3.841458820694124, 1, 0.05),
        (6.6348966010212145, 1, 0.01),
        (18.307038053275146, 10, 0.05),
        (23.209251158954356, 10, 0.01),
        (2.0 * math.log(20.0), 2, 0.05),
    ]
    for x, df, p in table:
        got = chi2_sf(x, df)
        assert abs(got / p - 1.0) < 1e-10, (x, df, got)
    # df 2 is exp(-x/2) itself, deep in the tail too.
    for x in [0.1, 7.0, 90.0, 600.0]:
        assert abs(chi2_sf(x, 2) / math.exp(-x / 2.0) - 1.0) < 1e-14
    # df 3 in closed form: Q(3/2, y) = erfc(√y) + 2√(y/π) e^-y.
    for x in [0.3, 4.0, 40.0]:
        y = x / 2.0
        want = math.erfc(math.sqrt(y)) + 2.0 * math.sqrt(y / math.pi) * math.exp(-y)
        assert abs(chi2_sf(x, 3) / want - 1.0) < 1e-13


def decimal_pi():
    """π to the current precision (the recipe of the decimal module's documentation)."""
    decimal.getcontext().prec += 2
    three = decimal.Decimal(3)
    lasts, t, s, n, na, d, da = 0, three, 3, 1, 0, 0, 24
    while s != lasts:
        lasts = s
        n, na = n + na, na + 8
        d, da = d + da, da + 32
        t = (t * n) / d
        s += t
    decimal.getcontext().prec -= 2
    return +s


def chi2_sf_decimal(x, df):
    """The same tail another way, in 250-digit decimals (so 1 - P keeps its digits down to
    p = 1e-200): 1 - P(df/2, x/2), with P by its power series y^a e^-y Σ_n y^n / Γ(a + n + 1)
    and Γ(a + 1) from exact integers."""
    with decimal.localcontext() as ctx:
        ctx.prec = 250
        D = decimal.Decimal
        y, a = D(x) / 2, D(df) / 2
        term = total = D(1)
        n = 0
        while term > total * D("1e-245"):
            n += 1
            term *= y / (a + n)
            total += term
        k = df // 2
        if df % 2 == 0:
            gamma = D(math.factorial(k))
        else:
            # Γ(k + 3/2) = (2k + 2)! / (4^(k+1) (k + 1)!) · √π
            gamma = (
                D(math.factorial(2 * k + 2))
                / (D(4) ** (k + 1) * D(math.factorial(k + 1)))
                * decimal_pi().sqrt()
            )
        p = (a * y.ln() - y).exp() * total / gamma
        return float(1 - p)


def inverse_sf(p, df):
    """The x with chi2_sf(x, df) = p, by bisection on ln p."""
    lo, hi = 1e-9, 10.0 * df + 200.0
    for _ in range(300):
        mid = 0.5 * (lo + hi)
        if chi2_sf(mid, df) > p:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


def chi2_sf_cases():
    check_chi2_sf()
    cases = []
    for x, df in [(3.841458820694124, 1), (18.307038053275146, 10), (23.209251158954356, 10)]:
        cases.append({"x": fl(x), "df": df, "p": fl(chi2_sf(x, df))})
    targets = [0.95, 0.5, 0.05, 1e-3, 1e-6, 1e-9, 1e-12, 1e-30]
    for df in [1, 2, 3, 4, 7, 10, 31, 100, 101, 255, 400]:
        for target in targets:
            # Round x to ten digits: the inputs stay readable, the answer is taken there.
            x = float(f"{inverse_sf(target, df):.10g}")
            p = chi2_sf(x, df)
            assert abs(math.log(p / target)) < 1e-3, (df, target, p)
            assert abs(chi2_sf_decimal(x, df) / p - 1.0) < 1e-12, (df, target, p)
            cases.append({"x": fl(x), "df": df, "p": fl(p)})
    return cases


def pooled_chi2(counts, expected):
    """Bins in descending order of expected count (equal ones in index order); a bin of at
    least MIN_EXPECTED stands alone, smaller ones gather into consecutive groups reaching
    it, and what is left at the end joins the last group (or is the only one)."""
    order = sorted(range(len(expected)), key=lambda i: -expected[i])
    groups, current = [], []
    for i in order:
        current.append(i)
        if sum(expected[j] for j in current) >= MIN_EXPECTED:
            groups.append(current)
            current = []
    if sum(counts[j] for j in current) > 0 or sum(expected[j] for j in current) > 0:
        if groups:
            groups[-1] = groups[-1] + current
        else:
            groups.append(current)
    terms = []
    for g in groups:
        o = float(sum(counts[j] for j in g))
        e = math.fsum(expected[j] for j in g)
        if e > 0:
            terms.append((o - e) ** 2 / e)
    chi2 = math.fsum(terms)
    return chi2, len(groups)


def pooling_case(name, counts, expected):
    chi2, bins = pooled_chi2(counts, expected)
    return {
        "name": name,
        "counts": counts,
        "expected": [fl(e) for e in expected],
        "chi2": fl(chi2),
        "bins": bins,
    }


def pooled_chi2_cases():
    rng = np.random.default_rng(5)
    cases = [
        # Two bins alone, three small ones: 3 + 2 reach 5 and the 1 left joins them.
        pooling_case(
            "remainder joins the last group", [52, 39, 4, 0, 3], [50.0, 44.0, 1.0, 2.0, 3.0]
        ),
        # 5.0 exactly stands alone, as do 2.5 + 2.5; the 1.5 left joins them.
        pooling_case(
            "an expected count of exactly five stands alone",
            [9, 1, 6, 2, 21],
            [5.0, 2.5, 2.5, 1.5, 20.0],
        ),
        # Equal expected counts group in index order.
        pooling_case("equal expected counts keep their order", [0, 9, 2, 5, 1, 7, 3], [3.0] * 7),
        # A bin expecting nothing but drawn joins the last group.
        pooling_case("an unexpected draw joins the last group", [8, 5, 3], [10.0, 6.0, 0.0]),
        pooling_case("only small bins make one group", [0, 2], [1.5, 1.5]),
    ]
    # Reversing the order of equal expected counts must change the third case's answer.
    third = cases[2]
    rev = pooled_chi2(third["counts"][::-1], [3.0] * 7)[0]
    assert abs(rev - float(third["chi2"])) > 0.1, rev

    # A flat row of 600 tokens expecting 0.08 each (nine groups of 63, the 33 tokens left
    # joining the last), drawn only from the first half.
    n = 600
    expected = [48.0 / n] * n
    half = np.bincount(rng.integers(0, n // 2, 48), minlength=n).tolist()
    cases.append(pooling_case("a flat row drawn from half its tokens", half, expected))
    # A realistic row: 4000 draws against softmax probabilities, drawn from a slightly
    # different distribution.
    logits = rng.normal(0.0, 1.5, 300)
    p = np.exp(logits - logits.max())
    p /= p.sum()
    q = np.exp(1.1 * (logits - logits.max()))
    q /= q.sum()
    counts = rng.multinomial(4000, q).tolist()
    cases.append(pooling_case("a softmax row of 4000 draws", counts, [float(x) * 4000 for x in p]))
    for c in cases:
        assert_pooling_is_clear(c)
    return cases


def assert_pooling_is_clear(case):
    """No running sum of expected counts lands so near MIN_EXPECTED that a different order
    of rounding could pool otherwise (the cases that sit on it exactly are sums of exact
    binary fractions)."""
    expected = [float(e) for e in case["expected"]]
    run = 0.0
    for i in sorted(range(len(expected)), key=lambda i: -expected[i]):
        run += expected[i]
        if run == MIN_EXPECTED:
            run = 0.0
            continue
        assert abs(run - MIN_EXPECTED) > 1e-9, (case["name"], run)
        if run > MIN_EXPECTED:
            run = 0.0


# ---------------------------------------------------------------------------------------
# sampling-gate: the reference distribution and the distribution test

EPS = 1e-5


def reference_distribution(logits, temperature, top_k, top_p):
    """(token, probability) in token order: NaN logits excluded; top-k keeps the first k by
    logit (ties to the lower id) and every token tied with the k-th; weights
    exp((l - max) / T); the nucleus is the shortest prefix whose share reaches top_p, with
    every token tied with its last; probabilities renormalized over what is kept."""
    ids = [i for i, x in enumerate(logits) if not math.isnan(x)]
    ids.sort(key=lambda i: (-logits[i], i))
    if 0 < top_k < len(ids):
        cut = logits[ids[top_k - 1]]
        ids = [i for j, i in enumerate(ids) if j < top_k or logits[i] == cut]
    t = f32(temperature)
    top = logits[ids[0]]
    w = {i: math.exp((logits[i] - top) / t) for i in ids}
    p = f32(top_p)
    kept = ids
    if p < 1.0:
        total = math.fsum(w.values())
        shares = np.cumsum([w[i] for i in ids]) / total
        # No share near the cut: the engine's f32 sums could not land on another nucleus.
        assert np.all(np.abs(shares - p) > 10 * EPS), (temperature, top_k, top_p)
        j = int(np.argmax(shares >= p))
        last = logits[ids[j]]
        kept = [i for jj, i in enumerate(ids) if jj <= j or logits[i] == last]
    mass = math.fsum(w[i] for i in kept)
    return sorted((i, w[i] / mass) for i in kept)


def distribution_case(name, rng, logits, params, draws, source):
    """`draws` tokens drawn from `source` (probabilities over every id), tested against the
    reference distribution of `logits` under `params`."""
    temperature, top_k, top_p = params
    kept = reference_distribution(logits, temperature, top_k, top_p)
    tokens = rng.choice(len(logits), size=draws, p=source).tolist()
    index = {t: j for j, (t, _) in enumerate(kept)}
    counts = [0] * len(kept)
    outside = [t for t in tokens if t not in index]
    for t in tokens:
        if t in index:
            counts[index[t]] += 1
    expected = [q * draws for _, q in kept]
    chi2, bins = pooled_chi2(counts, expected)
    assert bins >= 3, name
    p_value = chi2_sf(chi2, bins - 1)
    assert abs(chi2_sf_decimal(chi2, bins - 1) / p_value - 1.0) < 1e-12, name
    case = {"expected": [fl(e) for e in expected], "name": name}
    assert_pooling_is_clear(case)
    # Distinct expected counts are far enough apart that rounding cannot reorder them.
    distinct = sorted(set(expected))
    assert all(b - a > 1e-9 * b for a, b in zip(distinct, distinct[1:])), name
    return {
        "name": name,
        "logits": [fl(x) for x in logits],
        "temperature": fl(f32(temperature)),
        "top_k": top_k,
        "top_p": fl(f32(top_p)),
        "tokens": tokens,
        "kept": [t for t, _ in kept],
        "probabilities": [fl(q) for _, q in kept],
        "bins": bins,
        "chi2": fl(chi2),
        "p_value": fl(p_value),
        "outside": len(outside),
        "first_outside": outside[0] if outside else None,
    }


def probabilities(logits, temperature, keep=None):
    x = np.array([-np.inf if math.isnan(v) else v for v in logits]) / f32(temperature)
    if keep is not None:
        x = np.where(np.isin(np.arange(len(x)), keep), x, -np.inf)
    w = np.exp(x - x.max())
    return w / w.sum()


def distribution_cases():
    rng = np.random.default_rng(17)
    row = [f32(x) for x in rng.normal(0.0, 1.5, 40)]
    row[17] = math.nan
    cases = [
        distribution_case(
            "temperature 1, no truncation, fair draws",
            rng, row, (1.0, 0, 1.0), 3000, probabilities(row, 1.0),
        ),
        distribution_case(
            "temperature 0.7 against draws at temperature 1",
            rng, row, (0.7, 0, 1.0), 3000, probabilities(row, 1.0),
        ),
    ]
    # Top-k 6 with the sixth and seventh tied: seven kept; the draws come from the whole
    # row, so some land outside.
    tied = [f32(x) for x in rng.normal(0.0, 1.0, 30)]
    order = sorted(range(30), key=lambda i: -tied[i])
    tied[order[6]] = tied[order[5]]
    cases.append(
        distribution_case(
            "top-k 6 with a tie at the cut, draws from the whole row",
            rng, tied, (1.3, 6, 1.0), 2000, probabilities(tied, 1.3),
        )
    )
    nucleus = [f32(x) for x in rng.normal(0.0, 1.2, 48)]
    kept = [t for t, _ in reference_distribution(nucleus, 1.0, 0, 0.75)]
    source = 0.995 * probabilities(nucleus, 1.0, kept) + 0.005 / 48
    cases.append(
        distribution_case(
            "top-p 0.75 with a few draws outside the nucleus",
            rng, nucleus, (1.0, 0, 0.75), 2500, source,
        )
    )
    kept = [t for t, _ in reference_distribution(nucleus, 0.7, 12, 0.9)]
    cases.append(
        distribution_case(
            "top-p 0.9 inside top-k 12 at temperature 0.7",
            rng, nucleus, (0.7, 12, 0.9), 2500, probabilities(nucleus, 0.7, kept),
        )
    )
    assert len(cases[2]["kept"]) == 7 and cases[2]["outside"] > 0
    assert cases[3]["outside"] > 0
    assert float(cases[1]["p_value"]) < 1e-12 < float(cases[0]["p_value"])
    return cases


# ---------------------------------------------------------------------------------------
# The ledger, the reference gate's row policy and the host argmax


def bits_of(x):
    return int(np.float32(x).view(np.uint32))


def ledger_expected(ops):
    """Bookkeeping restated: a logits row mismatches when any value differs in its bits;
    maxdiff is the largest |ref - got| in f64 over differing values (a NaN difference is
    infinite); the first mismatch is the first differing value (or token) ever seen."""
    compared = rows = mismatched = 0
    maxdiff = 0.0
    first = None
    for op in ops:
        step = op["step"]
        ref, got = op["reference"], op["got"]
        if op["kind"] == "logits":
            n_vocab = op["n_vocab"]
            if len(ref) != len(got):
                r = max(len(ref), len(got)) // n_vocab
                rows += r
                mismatched += r
                maxdiff = math.inf
                first = first or (step, 0, 0, float(len(ref)), float(len(got)))
                continue
            for row in range(len(ref) // n_vocab):
                rs = ref[row * n_vocab : (row + 1) * n_vocab]
                gs = got[row * n_vocab : (row + 1) * n_vocab]
                rows += 1
                compared += n_vocab
                bad = [i for i in range(n_vocab) if bits_of(rs[i]) != bits_of(gs[i])]
                for i in bad:
                    d = abs(rs[i] - gs[i])
                    maxdiff = max(maxdiff, math.inf if math.isnan(d) else d)
                if bad:
                    mismatched += 1
                    first = first or (step, row, bad[0], rs[bad[0]], gs[bad[0]])
        else:
            for row, (r, g) in enumerate(zip(ref, got)):
                rows += 1
                compared += 1
                if r != g:
                    mismatched += 1
                    first = first or (step, row, 0, float(r), float(g))
            if len(ref) != len(got):
                mismatched += 1
    return {
        "compared": compared,
        "rows": rows,
        "rows_mismatched": mismatched,
        "maxdiff": fl(maxdiff),
        "first": None
        if first is None
        else {
            "step": first[0],
            "row": first[1],
            "index": first[2],
            "reference": fl(first[3]),
            "got": fl(first[4]),
        },
        "status": "pass" if mismatched == 0 and first is None else "fail",
    }


def logits_op(step, n_vocab, reference, got):
    return {"kind": "logits", "step": step, "n_vocab": n_vocab, "reference": reference, "got": got}


def tokens_op(step, reference, got):
    return {"kind": "tokens", "step": step, "reference": reference, "got": got}


def ledger_case(name, ops):
    """The ops with their f32 values rounded, as written, and the answers computed from them."""

    def rounded(op, as_value):
        if op["kind"] != "logits":
            return op
        reference = [as_value(x) for x in op["reference"]]
        return dict(op, reference=reference, got=[as_value(x) for x in op["got"]])

    return {
        "name": name,
        "ops": [rounded(op, lambda x: fl(f32(x))) for op in ops],
        "expected": ledger_expected([rounded(op, f32) for op in ops]),
    }


def ledger_cases():
    one_ulp = float(np.nextafter(np.float32(2.5), np.float32(3.0)))
    nan = math.nan
    a = [1.0, -2.0, nan, 0.25, 3.0, -0.0]
    step0_ref = a + [0.0, 1.5, 2.5, -7.0, 4.0, 8.0]
    step0_got = a + [-0.0, 1.5, one_ulp, -7.0, 4.0, 8.0]
    step1_ref = [5.0, 6.0, 7.0, 8.0, 9.0, 10.0] * 2
    step1_got = [5.0, 6.0, 7.0, 8.0, 9.0, 10.0] + [5.0, 6.0, 7.0, 1008.0, 9.0, 10.0]
    cases = [
        ledger_case(
            "negative zero, one ulp and a large step over two steps, then tokens",
            [
                logits_op(0, 6, step0_ref, step0_got),
                logits_op(1, 6, step1_ref, step1_got),
                tokens_op(2, [4, 5, 6], [4, 9, 6]),
                tokens_op(3, [1, 2], [1]),
            ],
        ),
        ledger_case(
            "identical rows, NaN with the same bits included",
            [
                logits_op(None, 3, a, a),
                tokens_op(None, [7, 8], [7, 8]),
            ],
        ),
        ledger_case(
            "a NaN against a number is an infinite difference",
            [
                logits_op(4, 2, [1.0, 2.0, 3.0, 4.0], [1.0, 2.0, nan, 4.5]),
            ],
        ),
        ledger_case(
            "a shape difference fails every row",
            [
                logits_op(5, 4, [1.0] * 8, [1.0] * 12),
            ],
        ),
        ledger_case(
            "tokens only, the first mismatch is the earliest",
            [
                tokens_op(0, [3, 3, 3], [3, 3, 3]),
                tokens_op(1, [3, 4, 5], [3, 4, 6]),
                tokens_op(2, [9, 9], [8, 8]),
            ],
        ),
    ]
    first = cases[0]["expected"]
    assert first["first"]["row"] == 1 and first["first"]["index"] == 0  # the -0.0
    assert float(first["maxdiff"]) == 1000.0
    return cases


def policy_row(max_abs, max_rel, ref, got):
    """max_abs = max |got - ref|; max_rel = max |got - ref| / max(1, |ref|); rel_rms =
    ‖got - ref‖₂ / ‖ref‖₂ (a zero reference norm taken as the smallest normal); a NaN
    difference is infinite; first_bad = first index outside either bound; ok = same length,
    nothing outside, same host argmax."""
    ds = [abs(r - g) for r, g in zip(ref, got)]
    ds = [math.inf if math.isnan(d) else d for d in ds]
    rels = [d / max(abs(r), 1.0) for d, r in zip(ds, ref)]
    bad = [i for i, (d, q) in enumerate(zip(ds, rels)) if d > max_abs or q > max_rel]
    err2 = math.fsum(d * d for d in ds)
    ref2 = math.fsum(r * r for r in ref[: len(ds)])
    ra, ga = first_index_of_max(ref), first_index_of_max(got)
    return {
        "max_abs": fl(max(ds, default=0.0)),
        "max_rel": fl(max(rels, default=0.0)),
        "rel_rms": fl(math.sqrt(err2 / max(ref2, np.finfo(np.float64).tiny))),
        "argmax_ref": ra,
        "argmax_got": ga,
        "first_bad": bad[0] if bad else None,
        "ok": len(ref) == len(got) and not bad and ra == ga,
    }


def policy_cases():
    rng = np.random.default_rng(23)
    base = [f32(x) for x in rng.normal(0.0, 4.0, 24)]
    small = [f32(x + y) for x, y in zip(base, rng.normal(0.0, 0.002, 24))]
    rows = [
        ("within both bounds", 0.01, 0.01, base, small),
        # 0.4 on a logit of 50 is within 1 % but outside 0.01 absolutely.
        ("a large logit moved outside max_abs", 0.01, 0.01, [50.0, 1.0, -3.0], [50.4, 1.0, -3.0]),
        # Below 1 the relative error is taken against 1: 0.02 on 0.25 is 0.02, not 0.08.
        ("a small logit is relative to one", 0.05, 0.03, [0.25, -0.5, 2.0], [0.27, -0.5, 2.0]),
        # Within max_abs 0.05 but outside max_rel 0.001 of 20: both bounds hold.
        ("inside max_abs, outside max_rel", 0.05, 0.001, [20.0, 3.0, -1.0], [20.03, 3.0, -1.0]),
        ("the argmax moved within the bounds", 0.01, 0.01, [1.0, 1.001, 0.5], [1.001, 1.0, 0.5]),
        ("a NaN is infinitely far", 0.01, 0.01, [1.0, 2.0, 3.0], [1.0, math.nan, 3.0]),
        ("a zero reference row", 0.01, 0.01, [0.0, 0.0, 0.0], [0.0, 0.01, -0.005]),
        ("a shorter engine row", 0.01, 0.01, [1.0, 2.0, 3.0], [1.0, 2.0]),
    ]
    cases = []
    for name, max_abs, max_rel, ref, got in rows:
        ref32, got32 = [f32(x) for x in ref], [f32(x) for x in got]
        cases.append(
            {
                "name": name,
                "max_abs": fl(max_abs),
                "max_rel": fl(max_rel),
                "reference": [fl(x) for x in ref32],
                "got": [fl(x) for x in got32],
                "expected": policy_row(max_abs, max_rel, ref32, got32),
            }
        )
    small_case = cases[2]["expected"]
    assert small_case["first_bad"] is None and small_case["ok"]
    assert cases[3]["expected"]["first_bad"] == 0
    return cases


def host_argmax_cases():
    nan, inf = math.nan, math.inf
    rng = np.random.default_rng(29)
    rows = [
        [1.0, 3.0, 3.0, 2.0],
        [nan, -1.0, -2.0],
        [-inf, -inf],
        [nan, nan, nan],
        [nan, nan, 5.0, 5.0],
        [-0.0, 0.0],
        [0.0, -0.0, -1.0],
        [inf, nan, inf],
        [-1.0, -inf, -0.5],
        [],
        [f32(x) for x in rng.normal(0.0, 3.0, 64)],
    ]
    cases = []
    for row in rows:
        row = [f32(x) for x in row]
        cases.append({"row": [fl(x) for x in row], "argmax": first_index_of_max(row)})
    return cases


def spec_stats_cases():
    rows = [
        {"rounds": 5, "verifies": 7, "columns": 31, "drafted": 24, "accepted": 12, "emitted": 19},
        {"rounds": 3, "verifies": 3, "columns": 3, "drafted": 0, "accepted": 0, "emitted": 3},
        {"rounds": 0, "verifies": 0, "columns": 0, "drafted": 0, "accepted": 0, "emitted": 0},
        {"rounds": 9, "verifies": 18, "columns": 70, "drafted": 52, "accepted": 37, "emitted": 55},
    ]
    cases = []
    for s in rows:
        cases.append(
            {
                "stats": s,
                "tokens_per_verify": fl(s["emitted"] / max(s["verifies"], 1)),
                "acceptance": fl(s["accepted"] / max(s["drafted"], 1)),
            }
        )
    return cases


def kv_q8_0_row(row):
    """The q8_0 KV cache's rounding of one row, block by block of 32, in f32 as the contract
    writes it: d = amax / 127, id = 1 / d (0 for an all-zero block), q = x * id rounded half
    away from zero, the stored value f16(d) * q (each operation rounded to f32 once)."""
    out = []
    for b in range(0, len(row), 32):
        block = [np.float32(x) for x in row[b : b + 32]]
        amax = np.float32(0.0)
        for x in block:
            amax = max(amax, np.float32(abs(x)))
        d = np.float32(amax / np.float32(127.0))
        inv = np.float32(np.float32(1.0) / d) if d != 0 else np.float32(0.0)
        dh = np.float32(np.float16(d))
        for x in block:
            v = float(np.float32(x * inv))
            q = np.float32(math.copysign(math.floor(abs(v) + 0.5), v))
            out.append(float(np.float32(dh * q)))
    return out


def kv_q8_0_cases():
    """Rows whose rounding a wrong formula changes: a spread block, a block whose values sit
    near the half-way points of its grid, an all-zero block, one with a lone large value (so
    most values round to 0 or ±1), and values of both signs."""
    rng = np.random.default_rng(20261205)
    spread = [f32(x) for x in rng.normal(0.0, 1.7, 32)]
    amax = 2.54
    step = amax / 127.0
    halves = [f32((k + 0.5) * step * (1 if k % 2 else -1)) for k in range(31)] + [amax]
    zeros = [0.0] * 32
    lone = [f32(x) for x in rng.normal(0.0, 0.02, 31)] + [f32(-90.0)]
    rows = [spread + halves, zeros + lone]
    cases = []
    for row in rows:
        row = [f32(x) for x in row]
        cases.append({"row": [fl(x) for x in row], "rounded": [fl(x) for x in kv_q8_0_row(row)]})
    return cases


# ---------------------------------------------------------------------------------------
# Writing: keys sorted, short objects of scalars on one line, lists of scalars filled into
# lines, everything else one item per line.


def is_scalar(x):
    return x is None or isinstance(x, (str, int, bool))


def encode(obj, indent=0):
    pad, inner = "  " * indent, "  " * (indent + 1)
    if isinstance(obj, float):
        raise TypeError(f"a raw float {obj!r}: write it with fl()")
    if is_scalar(obj):
        return json.dumps(obj)
    if isinstance(obj, dict):
        if not obj:
            return "{}"
        if all(is_scalar(x) for x in obj.values()):
            fields = (f"{json.dumps(k)}: {json.dumps(obj[k])}" for k in sorted(obj))
            line = "{" + ", ".join(fields) + "}"
            if len(pad) + len(line) < 96:
                return line
        items = [f"{inner}{json.dumps(k)}: {encode(obj[k], indent + 1)}" for k in sorted(obj)]
        return "{\n" + ",\n".join(items) + "\n" + pad + "}"
    if not obj:
        return "[]"
    if all(is_scalar(x) for x in obj):
        parts = [json.dumps(x) for x in obj]
        if len(pad) + sum(len(p) + 2 for p in parts) < 96:
            return "[" + ", ".join(parts) + "]"
        lines, line = [], ""
        for p in parts:
            if line and len(inner) + len(line) + len(p) + 2 > 96:
                lines.append(line)
                line = ""
            line += (" " if line else "") + p + ","
        lines.append(line)
        lines[-1] = lines[-1].rstrip(",")
        return "[\n" + "\n".join(inner + ln for ln in lines) + "\n" + pad + "]"
    return "[\n" + ",\n".join(inner + encode(x, indent + 1) for x in obj) + "\n" + pad + "]"


def main():
    measure, measured = exact_measure()
    data = {
        "format": FORMAT,
        "generated_by": "scripts/known-answers.py",
        "exact_measure": measure,
        "exact_bounds": exact_bounds(measured),
        "chi2_sf": chi2_sf_cases(),
        "pooled_chi2": pooled_chi2_cases(),
        "distribution_test": distribution_cases(),
        "ledger": ledger_cases(),
        "policy_row": policy_cases(),
        "host_argmax": host_argmax_cases(),
        "spec_stats": spec_stats_cases(),
        "kv_q8_0": kv_q8_0_cases(),
    }
    text = encode(data) + "\n"
    assert json.loads(text) == json.loads(json.dumps(data))
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(text)
    print(f"wrote {OUT.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
