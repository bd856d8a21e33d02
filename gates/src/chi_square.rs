//! The chi-square goodness-of-fit test the sampling gate judges its draws by: the statistic
//! over bins with small expected counts pooled, and its survival function (the p-value).
//!
//! It owns the statistics only; what is drawn and what the bound is belongs to
//! `crate::sampling`.

/// Bins with an expected count below this are pooled (the chi-square approximation's rule).
pub const MIN_EXPECTED: f64 = 5.0;

/// The chi-square statistic of `counts` against `expected`, with bins whose expected count
/// is below [`MIN_EXPECTED`] pooled: taken in descending order of expected count (stable, so
/// equal ones keep their order), each bin of at least [`MIN_EXPECTED`] stands alone and the
/// small ones are gathered into consecutive groups of at least [`MIN_EXPECTED`] each, the
/// remainder merged into the last group (or bin). Groups rather than one tail bin keep the
/// test's power on a flat distribution, where every token is small: a sampler that never
/// draws half of such a row still leaves half the groups empty. Returns the statistic and
/// the number of bins.
pub fn pooled_chi2(counts: &[usize], expected: &[f64]) -> (f64, usize) {
    let mut order: Vec<usize> = (0..counts.len().min(expected.len())).collect();
    order.sort_by(|&a, &b| expected[b].total_cmp(&expected[a]));
    let mut bins: Vec<(f64, f64)> = Vec::new();
    let mut open = (0.0f64, 0.0f64);
    for i in order {
        open.0 += counts[i] as f64;
        open.1 += expected[i];
        if open.1 >= MIN_EXPECTED {
            bins.push(open);
            open = (0.0, 0.0);
        }
    }
    if open.0 > 0.0 || open.1 > 0.0 {
        match bins.last_mut() {
            Some(last) => {
                last.0 += open.0;
                last.1 += open.1;
            }
            None => bins.push(open),
        }
    }
    let chi2 = bins
        .iter()
        .filter(|b| b.1 > 0.0)
        .map(|&(o, e)| (o - e) * (o - e) / e)
        .sum();
    (chi2, bins.len())
}

/// The chi-square survival function `P(X ≥ x)` with `df` degrees of freedom: the regularized
/// upper incomplete gamma function `Q(df/2, x/2)`, by its series below `a + 1` and its
/// continued fraction above (Numerical Recipes' `gammq`). `df = 0` gives 1.
pub fn chi2_sf(x: f64, df: usize) -> f64 {
    if df == 0 || x <= 0.0 {
        return 1.0;
    }
    let (a, x) = (df as f64 / 2.0, x / 2.0);
    let front = (-x + a * x.ln() - ln_gamma(a)).exp();
    if x < a + 1.0 {
        let (mut ap, mut del, mut sum) = (a, 1.0 / a, 1.0 / a);
        for _ in 0..10_000 {
            ap += 1.0;
            del *= x / ap;
            sum += del;
            if del.abs() < sum.abs() * 1e-15 {
                break;
            }
        }
        (1.0 - sum * front).max(0.0)
    } else {
        const TINY: f64 = 1e-300;
        let mut b = x + 1.0 - a;
        let mut c = 1.0 / TINY;
        let mut d = 1.0 / b;
        let mut h = d;
        for i in 1..10_000 {
            let an = -(i as f64) * (i as f64 - a);
            b += 2.0;
            d = an * d + b;
            if d.abs() < TINY {
                d = TINY;
            }
            c = b + an / c;
            if c.abs() < TINY {
                c = TINY;
            }
            d = 1.0 / d;
            let del = d * c;
            h *= del;
            if (del - 1.0).abs() < 1e-15 {
                break;
            }
        }
        (front * h).clamp(0.0, 1.0)
    }
}

/// `ln Γ(a)` for `a > 0` (Lanczos, g = 7, nine terms: about 15 significant digits).
fn ln_gamma(a: f64) -> f64 {
    const G: [f64; 9] = [
        0.999_999_999_999_809_9,
        676.520_368_121_885_1,
        -1_259.139_216_722_402_8,
        771.323_428_777_653_1,
        -176.615_029_162_140_6,
        12.507_343_278_686_905,
        -0.138_571_095_265_720_12,
        9.984_369_578_019_572e-6,
        1.505_632_735_149_311_6e-7,
    ];
    if a < 0.5 {
        // The reflection formula.
        let pi = std::f64::consts::PI;
        return (pi / (pi * a).sin()).ln() - ln_gamma(1.0 - a);
    }
    let a = a - 1.0;
    let mut s = G[0];
    for (k, &g) in G.iter().enumerate().skip(1) {
        s += g / (a + k as f64);
    }
    let t = a + 7.5;
    0.5 * (2.0 * std::f64::consts::PI).ln() + (a + 0.5) * t.ln() - t + s.ln()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chi2_sf_matches_tables() {
        // df = 2 is exp(-x/2) exactly.
        assert!((chi2_sf(2.0, 2) - (-1.0f64).exp()).abs() < 1e-12);
        // The 5% critical values of df 1, 10 and 100.
        assert!((chi2_sf(3.841_458_8, 1) - 0.05).abs() < 1e-6);
        assert!((chi2_sf(18.307_038, 10) - 0.05).abs() < 1e-6);
        assert!((chi2_sf(124.342_11, 100) - 0.05).abs() < 1e-6);
        // Even df have a closed form, Q(k, y) = e^-y Σ_{j<k} y^j / j!: held in the far tail
        // too, where the gate's bound lives (relative error, down to about 1e-20).
        for x in [0.5f64, 4.0, 11.0, 30.0, 45.0, 80.0, 120.0] {
            let y = x / 2.0;
            let (mut term, mut sum) = (1.0f64, 0.0f64);
            for j in 0..5 {
                if j > 0 {
                    term *= y / j as f64;
                }
                sum += term;
            }
            let want = (-y).exp() * sum;
            assert!(
                (chi2_sf(x, 10) / want - 1.0).abs() < 1e-9,
                "x {x}: {}",
                chi2_sf(x, 10)
            );
        }
        assert_eq!(chi2_sf(5.0, 0), 1.0);
        assert_eq!(chi2_sf(0.0, 3), 1.0);
        assert!((ln_gamma(5.0) - 24.0f64.ln()).abs() < 1e-12);
        assert!((ln_gamma(0.5) - std::f64::consts::PI.sqrt().ln()).abs() < 1e-12);
    }

    #[test]
    fn pooling_keeps_expected_counts_at_least_five() {
        // Two big bins and three small ones (3 + 2 = 5 expected, then 1 left over, merged
        // into that group): three bins.
        let (chi2, bins) = pooled_chi2(&[50, 44, 1, 2, 3], &[50.0, 44.0, 1.0, 2.0, 3.0]);
        assert_eq!((chi2, bins), (0.0, 3));
        // A remainder of 2 expected merges into the last bin (40): observed 40 + 5 against
        // 42 gives 9/42.
        let (chi2, bins) = pooled_chi2(&[58, 40, 5], &[58.0, 40.0, 2.0]);
        assert_eq!(bins, 2);
        assert!((chi2 - 9.0 / 42.0).abs() < 1e-12, "{chi2}");
        // Nothing but small bins: one group.
        assert_eq!(pooled_chi2(&[1, 2], &[1.5, 1.5]).1, 1);
    }

    /// On a flat row of 49152 tokens and 4000 draws every token expects 0.08: one tail bin
    /// would hold everything and see nothing, while groups of 62 tokens see a sampler
    /// that never draws the second half.
    #[test]
    fn pooling_keeps_its_power_on_a_flat_row() {
        let n = 49152;
        let expected = vec![4000.0 / n as f64; n];
        let mut half = vec![0usize; n];
        let mut fair = vec![0usize; n];
        let mut st = 7u64;
        for i in 0..4000 {
            st = st
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            fair[(st >> 33) as usize % n] += 1;
            half[i * 7 % (n / 2)] += 1;
        }
        let (chi2, bins) = pooled_chi2(&half, &expected);
        assert_eq!(bins, n / 62);
        assert!(chi2_sf(chi2, bins - 1) < 1e-100, "{chi2}");
        let (chi2, bins) = pooled_chi2(&fair, &expected);
        assert!(chi2_sf(chi2, bins - 1) > 1e-4, "{chi2} over {bins}");
    }
}
