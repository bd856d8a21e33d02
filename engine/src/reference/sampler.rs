//! The reference sampler: temperature + top-k + top-p sampling restated from its
//! definition, in f64, sharing nothing with the kernel twin (`memra_kernels::twin::sample`) or the CUDA
//! sampler but the Philox stream, so a fault the twin and the kernel share (a nucleus cut one
//! token early, a CDF walked in the wrong order) shows up as a disagreement with it.
//!
//! The definition, step by step ([`distribution`], then [`Distribution::draw`]):
//! 1. Order the tokens by logit, descending, ties to the lower id. NaN logits take no part
//!    (the engine never draws one either).
//! 2. Top-k (`0 < top_k <` the tokens in the order): keep the first `top_k` of the order,
//!    extended by every token whose logit equals the k-th's (ties at the cut included, as the
//!    nucleus's). 0, or `top_k` at least the tokens, keeps every one.
//! 3. `w_i = exp((l_i - max) / T)` in f64; `P_i = w_i / Σw` over what top-k kept.
//! 4. The nucleus: the shortest prefix of that order whose cumulative `P` reaches `top_p`
//!    (`≥`), extended by every token whose logit equals the last one's — ties at the cut are
//!    included, the engine's documented rule ("ties included"). `top_p >= 1` keeps every
//!    token top-k kept.
//! 5. Renormalize over the nucleus and invert its CDF at the engine's uniform `u` for
//!    `(seed, seq, step)` ([`memra_kernels::twin::draw_uniform`], the stream being the
//!    contract): the CDF runs over the kept tokens **in token-id order** (the order the
//!    engine's walk visits the vocabulary), and the token drawn is the first whose
//!    cumulative probability exceeds `u`.
//!
//! A draw is *ambiguous* when f32 arithmetic may legitimately pick another token: `u` lies
//! within [`EPS`] of an inner end of the chosen token's CDF interval; or another nucleus
//! whose edge mass is within [`EPS`] of `top_p` (the cut the engine's f32 sums may take
//! instead) draws another token at `u`; or, at either cut, the first token left out has a
//! weight close enough to the last one kept that f32 may round the two to a tie (and keep
//! both) or swap them ([`may_tie`]). A gate compares only unambiguous draws. At the top-k cut
//! such a near tie matters only where the tokens involved carry mass a draw can see: a tie
//! among weights that add up to less than [`EPS`]`/10` of what top-k kept moves no CDF
//! boundary by more than that.
//!
//! `T = 0` is greedy: the first token of the order (the argmax, ties to the lower id).
//!
//! It owns the definition and the ambiguity rule; the engine's sampler is `crate::sampling`,
//! the gate holding one to the other `crate::gates::sampling`.

use crate::seq::SeqId;

/// Width of the ambiguity window, in probability: of the nucleus for a CDF boundary, of the
/// whole distribution for the nucleus edge. The engine sums in f32 over chunks (of
/// `ceil(n/256)` values, then the 256 chunk sums) after an `exp` within 2 ulp: the rounding of
/// those sums is about `1e-6` relative in practice (a random walk of 2⁻²⁵ steps), bounded by
/// `(n/256 + 256)·2⁻²⁴` (`2.7e-5` at a vocabulary of 49152) only if every rounding went the
/// same way. `1e-5` is ten times the practical error and keeps most draws of a flat
/// 49152-token distribution (boundaries about `2e-5` apart) comparable.
pub const EPS: f64 = 1e-5;

/// Relative weight difference under which the token at the cut and the first one left out
/// may round to one f32 value (a tie the engine keeps whole) or swap places: a few ulp of
/// f32 ([`may_tie`] widens it with the rounding of the exponent's argument).
pub const TIE_REL: f64 = 1e-6;

/// Whether weights `a >= b` (each `exp(x)` of a scaled logit `x <= 0`, relative to the
/// largest) may round to one f32 value or swap places in the engine: their relative gap is
/// within [`TIE_REL`] plus what the f32 argument's own rounding moves `exp` by, `|x|` times
/// four half-ulps of f32 (the subtraction of the maximum and the division by `T`, each side).
pub fn may_tie(a: f64, b: f64) -> bool {
    let x = a.ln().abs();
    a - b <= (TIE_REL + x * 4.0 * f64::from(f32::EPSILON) / 2.0) * a
}

/// Most alternative nuclei a distribution keeps; a cut with more plausible neighbours (a
/// long flat run of tiny probabilities at the edge) is ambiguous as a whole.
const MAX_ALTERNATIVES: usize = 32;

/// The kept tokens of one logits row under one temperature and top-p, with their
/// renormalized probabilities, and the other nuclei f32 arithmetic may legitimately keep.
#[derive(Debug, Clone, PartialEq)]
pub struct Distribution {
    /// `(token, probability)` of every kept token in token-id order; the probabilities sum
    /// to 1.
    pub kept: Vec<(u32, f64)>,
    /// The other nuclei (same form) whose edge mass lies within [`EPS`] of `top_p`: the
    /// engine's f32 cut may land on any of them, so a draw that any of them changes is
    /// ambiguous.
    pub alternatives: Vec<Vec<(u32, f64)>>,
    /// The first token left out nearly ties the last one kept ([`TIE_REL`]), or more than
    /// `MAX_ALTERNATIVES` nuclei are plausible: every draw is ambiguous.
    pub cut_ambiguous: bool,
}

/// One reference draw.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Draw {
    pub token: u32,
    /// f32 arithmetic may legitimately pick a neighbour (see the module documentation).
    pub ambiguous: bool,
}

/// The distribution the engine's contract defines for `logits` at `temperature`, `top_k`
/// and `top_p` (the module documentation's steps 1-4). `temperature <= 0` is greedy: the
/// argmax alone with probability 1. An empty row, or one of NaN only, keeps token 0.
pub fn distribution(logits: &[f32], temperature: f32, top_k: u32, top_p: f32) -> Distribution {
    let mut order: Vec<u32> = (0..logits.len() as u32)
        .filter(|&i| !logits[i as usize].is_nan())
        .collect();
    // Descending logit, ties to the lower id (a stable sort keeps ids ascending).
    order.sort_by(|&a, &b| logits[b as usize].total_cmp(&logits[a as usize]));
    let Some(&first) = order.first() else {
        return Distribution {
            kept: vec![(0, 1.0)],
            alternatives: Vec::new(),
            cut_ambiguous: false,
        };
    };
    // NaN is greedy too, as in the engine's twin.
    if temperature.is_nan() || temperature <= 0.0 {
        return Distribution {
            kept: vec![(first, 1.0)],
            alternatives: Vec::new(),
            cut_ambiguous: false,
        };
    }
    let t = temperature as f64;
    let max = logits[first as usize] as f64;
    let weight = |i: u32| ((logits[i as usize] as f64 - max) / t).exp();
    // Top-k: the first k of the order and every token tied with the k-th.
    let mut k_ambiguous = false;
    if top_k > 0 && (top_k as usize) < order.len() {
        let k = top_k as usize;
        let at_cut = logits[order[k - 1] as usize];
        let mut len = k;
        while len < order.len() && logits[order[len] as usize] == at_cut {
            len += 1;
        }
        if len < order.len() {
            // The near ties around the cut, and whether the mass they hold is visible.
            let (wk, wout) = (weight(order[len - 1]), weight(order[len]));
            if may_tie(wk, wout) {
                let kept_mass: f64 = order[..len].iter().map(|&i| weight(i)).sum();
                let inside = order[..len].iter().rev().map(|&i| weight(i));
                let outside = order[len..].iter().map(|&i| weight(i));
                let near: f64 = inside
                    .take_while(|&w| may_tie(w, wout))
                    .chain(outside.take_while(|&w| may_tie(wk, w)))
                    .sum();
                k_ambiguous = near >= EPS / 10.0 * kept_mass;
            }
        }
        order.truncate(len);
    }
    let w: Vec<f64> = order.iter().map(|&i| weight(i)).collect();
    let total: f64 = w.iter().sum();
    let n = order.len();
    // The nucleus of the cut at sorted index j: j and every later token tied with it
    // (equal logits give equal weights), renormalized, in id order.
    let nucleus = |j: usize| -> Vec<(u32, f64)> {
        let mut len = j + 1;
        while len < n && logits[order[len] as usize] == logits[order[j] as usize] {
            len += 1;
        }
        let mass: f64 = w[..len].iter().sum();
        let mut kept: Vec<(u32, f64)> = order[..len]
            .iter()
            .zip(&w)
            .map(|(&i, &wi)| (i, wi / mass))
            .collect();
        kept.sort_by_key(|&(i, _)| i);
        kept
    };
    if top_p >= 1.0 {
        return Distribution {
            kept: nucleus(n - 1),
            alternatives: Vec::new(),
            cut_ambiguous: k_ambiguous,
        };
    }
    let p = top_p as f64;
    // The first sorted index whose cumulative share reaches `share` (the last if none).
    let mut cum = Vec::with_capacity(n);
    let mut run = 0.0f64;
    for &wj in &w {
        run += wj;
        cum.push(run / total);
    }
    let reach = |share: f64| cum.iter().position(|&c| c >= share).unwrap_or(n - 1);
    let (k, lo, hi) = (reach(p), reach(p - EPS), reach(p + EPS));
    let kept = nucleus(k);
    let mut alternatives: Vec<Vec<(u32, f64)>> = Vec::new();
    let mut cut_ambiguous = k_ambiguous || hi - lo > MAX_ALTERNATIVES;
    if !cut_ambiguous {
        for j in lo..=hi {
            let alt = nucleus(j);
            if alt.len() != kept.len() && alternatives.last().is_none_or(|a| a.len() != alt.len()) {
                alternatives.push(alt);
            }
        }
    }
    // The weight just past the kept set: nearly equal to the last kept one, f32 may keep
    // both or swap them.
    let len = kept.len();
    if len < n && may_tie(w[len - 1], w[len]) {
        cut_ambiguous = true;
    }
    Distribution {
        kept,
        alternatives,
        cut_ambiguous,
    }
}

/// The first kept token whose cumulative probability (in id order) exceeds `u`, the last if
/// rounding leaves none, with the ends of its interval.
fn invert(kept: &[(u32, f64)], u: f64) -> (usize, f64, f64) {
    let mut lo = 0.0f64;
    for (j, &(_, p)) in kept.iter().enumerate() {
        let hi = lo + p;
        if hi > u || j + 1 == kept.len() {
            return (j, lo, hi);
        }
        lo = hi;
    }
    unreachable!("a distribution keeps at least one token")
}

impl Distribution {
    /// The token the inverse CDF (in token-id order) gives at `u` in `[0, 1)`: the first
    /// whose cumulative probability exceeds `u` (the last kept token if rounding leaves
    /// none). Ambiguous when `u` is within [`EPS`] of an inner end of its interval, when an
    /// alternative nucleus gives another token at `u`, or when the cut is ambiguous.
    pub fn draw(&self, u: f64) -> Draw {
        let (j, lo, hi) = invert(&self.kept, u);
        let token = self.kept[j].0;
        // The outer ends 0 and 1 are no boundary between two tokens.
        let hi_edge = j + 1 < self.kept.len() && (hi - u).abs() < EPS;
        let lo_edge = j > 0 && (u - lo).abs() < EPS;
        let moved = self
            .alternatives
            .iter()
            .any(|a| a[invert(a, u).0].0 != token);
        Draw {
            token,
            ambiguous: self.cut_ambiguous || hi_edge || lo_edge || moved,
        }
    }

    /// Whether some plausible nucleus (the kept one or an alternative) holds `token`.
    pub fn may_keep(&self, token: u32) -> bool {
        std::iter::once(&self.kept)
            .chain(&self.alternatives)
            .any(|k| k.binary_search_by_key(&token, |&(i, _)| i).is_ok())
    }

    /// The probability of `token` (0 outside the nucleus).
    pub fn prob(&self, token: u32) -> f64 {
        self.kept
            .binary_search_by_key(&token, |&(i, _)| i)
            .map_or(0.0, |j| self.kept[j].1)
    }
}

/// The reference's token for `seq` at `step` under the engine's stream: [`distribution`]
/// drawn at [`memra_kernels::twin::draw_uniform`]`(seed, seq, step)`.
pub fn sample(
    logits: &[f32],
    temperature: f32,
    top_k: u32,
    top_p: f32,
    seed: u64,
    seq: SeqId,
    step: usize,
) -> Draw {
    let u = memra_kernels::twin::draw_uniform(seed, seq.0, step as u32) as f64;
    distribution(logits, temperature, top_k, top_p).draw(u)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64) -> bool {
        // The logits are f32 roundings of logarithms, so the probabilities are exact to about
        // one f32 ulp.
        (a - b).abs() < 1e-7
    }

    /// Logits ln(4), ln(2), ln(1), ln(1) at T = 1: probabilities 1/2, 1/4, 1/8, 1/8.
    fn halves() -> Vec<f32> {
        [4.0f64, 2.0, 1.0, 1.0]
            .iter()
            .map(|x| x.ln() as f32)
            .collect()
    }

    #[test]
    fn full_distribution_is_the_softmax_in_id_order() {
        let d = distribution(&[0.0, 2.0f32.ln(), 0.0], 1.0, 0, 1.0);
        let ids: Vec<u32> = d.kept.iter().map(|k| k.0).collect();
        assert_eq!(ids, [0, 1, 2]);
        assert!(close(d.kept[0].1, 0.25) && close(d.kept[1].1, 0.5) && close(d.kept[2].1, 0.25));
        assert!(!d.cut_ambiguous);
        // The CDF in id order: [0, .25) -> 0, [.25, .75) -> 1, [.75, 1) -> 2.
        assert_eq!(d.draw(0.1).token, 0);
        assert_eq!(d.draw(0.3).token, 1);
        assert_eq!(d.draw(0.74).token, 1);
        assert_eq!(d.draw(0.76).token, 2);
        assert_eq!(d.draw(0.999_999).token, 2);
    }

    #[test]
    fn temperature_divides_the_logits() {
        // ln 4 at T = 2 is ln 2: probabilities 2/3 and 1/3.
        let d = distribution(&[4.0f32.ln(), 0.0], 2.0, 0, 1.0);
        assert!((d.prob(0) - 2.0 / 3.0).abs() < 1e-7, "{d:?}");
        assert!((d.prob(1) - 1.0 / 3.0).abs() < 1e-7, "{d:?}");
    }

    #[test]
    fn nucleus_is_the_shortest_prefix_reaching_top_p() {
        let l = halves();
        // 0.5 is reached by the first token alone (>=).
        let d = distribution(&l, 1.0, 0, 0.4);
        assert_eq!(d.kept, vec![(0, 1.0)]);
        // 0.6 needs the second: 1/2 + 1/4 renormalized to 2/3 and 1/3.
        let d = distribution(&l, 1.0, 0, 0.6);
        assert_eq!(d.kept.len(), 2);
        assert!(close(d.prob(0), 2.0 / 3.0) && close(d.prob(1), 1.0 / 3.0));
        assert_eq!(d.prob(2), 0.0);
        // 0.8 reaches into the tied pair at 1/8: both are kept.
        let d = distribution(&l, 1.0, 0, 0.8);
        assert_eq!(d.kept.len(), 4, "{d:?}");
        assert!(close(d.prob(2), 0.125) && close(d.prob(3), 0.125));
        // top_p = 1 keeps every token; the smallest top_p keeps the top token alone.
        assert_eq!(distribution(&l, 1.0, 0, 1.0).kept.len(), 4);
        assert_eq!(
            distribution(&l, 1.0, 0, f32::MIN_POSITIVE).kept,
            vec![(0, 1.0)]
        );
        // Just below 1 the last pair is still needed, and both of it are kept.
        assert_eq!(distribution(&l, 1.0, 0, 0.99).kept.len(), 4);
    }

    #[test]
    fn ties_in_the_order_go_to_the_lower_id() {
        // Three equal logits; top_p 0.2 reaches the cut at the first of them, and the tie
        // rule keeps all three.
        let d = distribution(&[1.0, 1.0, 1.0, -30.0], 1.0, 0, 0.2);
        let ids: Vec<u32> = d.kept.iter().map(|k| k.0).collect();
        assert_eq!(ids, [0, 1, 2]);
        // Greedy picks the lowest tied id.
        assert_eq!(
            distribution(&[0.5, 3.0, 3.0], 0.0, 0, 1.0).kept,
            vec![(1, 1.0)]
        );
    }

    #[test]
    fn nan_logits_never_take_part() {
        let d = distribution(&[f32::NAN, 0.0, 0.0], 1.0, 0, 1.0);
        assert_eq!(d.prob(0), 0.0);
        assert!(close(d.prob(1), 0.5));
        assert_eq!(distribution(&[f32::NAN], 1.0, 0, 1.0).kept, vec![(0, 1.0)]);
        assert_eq!(distribution(&[], 1.0, 0, 1.0).kept, vec![(0, 1.0)]);
    }

    #[test]
    fn ambiguity_near_a_cdf_boundary() {
        let d = distribution(&[0.0, 0.0], 1.0, 0, 1.0);
        assert!(!d.draw(0.3).ambiguous);
        assert!(d.draw(0.5 - EPS / 2.0).ambiguous);
        assert!(d.draw(0.5 + EPS / 2.0).ambiguous);
        assert_eq!(d.draw(0.5 - EPS / 2.0).token, 0);
        assert_eq!(d.draw(0.5 + EPS / 2.0).token, 1);
        // The outer ends 0 and 1 are not boundaries between tokens.
        assert!(!d.draw(0.0).ambiguous);
        assert!(!d.draw(1.0 - 1e-9).ambiguous);
    }

    #[test]
    fn ambiguity_at_the_nucleus_edge() {
        let l = halves();
        // top_p exactly at a cumulative mass (0.75 after two tokens): f32 may also keep the
        // tied pair after them. A draw both nuclei agree on stays comparable; one they
        // split is ambiguous.
        let d = distribution(&l, 1.0, 0, 0.75);
        assert_eq!(d.kept.len(), 2);
        assert_eq!(d.alternatives.len(), 1);
        assert_eq!(d.alternatives[0].len(), 4);
        assert!(!d.draw(0.1).ambiguous);
        // At 0.6 the two-token nucleus draws token 0 (2/3), the four-token one token 1.
        assert_eq!(d.draw(0.6).token, 0);
        assert!(d.draw(0.6).ambiguous);
        assert!(d.may_keep(3) && !distribution(&l, 1.0, 0, 0.6).may_keep(3));
        // Just past the mass before the cut (0.5 + EPS/2): f32 may keep token 0 alone.
        let d = distribution(&l, 1.0, 0, 0.5 + (EPS / 2.0) as f32);
        assert_eq!(d.alternatives, vec![vec![(0, 1.0)]]);
        assert!(d.draw(0.9).ambiguous && !d.draw(0.1).ambiguous);
        // Well inside: nothing else is plausible.
        let d = distribution(&l, 1.0, 0, 0.6);
        assert!(d.alternatives.is_empty() && !d.cut_ambiguous);
        // A near tie across the cut (the next weight within TIE_REL) is ambiguous.
        let d = distribution(&[1.0, 0.0, -1e-7, -5.0], 1.0, 0, 0.7);
        assert_eq!(d.kept.len(), 2, "{d:?}");
        assert!(d.cut_ambiguous && d.draw(0.1).ambiguous);
        // One ten times wider is not.
        assert!(!distribution(&[1.0, 0.0, -1e-5, -5.0], 1.0, 0, 0.7).cut_ambiguous);
    }

    /// On spread-out random rows the twin draws the reference's token wherever the draw is
    /// unambiguous, and the twin with the cut one token early does not.
    #[test]
    fn the_twin_agrees_where_unambiguous_and_its_early_cut_does_not() {
        use memra_kernels::twin::{Nucleus, sample_with};
        let mut st = 7u32;
        let row: Vec<f32> = (0..300)
            .map(|_| {
                st = st.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                (st >> 8) as f32 / 16_777_216.0 * 8.0
            })
            .collect();
        let (mut compared, mut exact_off, mut early_off) = (0, 0, 0);
        for (t, p) in [(0.7f32, 0.9f32), (1.0, 0.5), (1.3, 0.2), (1.0, 1.0)] {
            for step in 0..200u32 {
                let r = sample(&row, t, 0, p, 5, SeqId(1), step as usize);
                if r.ambiguous {
                    continue;
                }
                compared += 1;
                exact_off +=
                    usize::from(sample_with(&row, t, 0, p, 5, 1, step, Nucleus::Exact) != r.token);
                early_off += usize::from(
                    sample_with(&row, t, 0, p, 5, 1, step, Nucleus::OneEarly) != r.token,
                );
            }
        }
        assert!(compared > 700, "{compared}");
        assert_eq!(exact_off, 0);
        assert!(early_off > 50, "{early_off}");
    }

    /// The same at a real vocabulary (49152) with a flat distribution, where the chunked
    /// f32 sums are longest and the CDF boundaries closest: still no unambiguous mismatch,
    /// and most draws compared.
    #[test]
    fn the_twin_agrees_on_a_wide_flat_row() {
        use memra_kernels::twin::{Nucleus, sample_with};
        let mut st = 11u32;
        let row: Vec<f32> = (0..49152)
            .map(|_| {
                st = st.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                (st >> 8) as f32 / 16_777_216.0 * 3.0
            })
            .collect();
        let (mut compared, mut off) = (0, 0);
        for (t, k, p) in [
            (1.3f32, 0u32, 1.0f32),
            (1.0, 0, 0.9),
            (0.7, 0, 0.5),
            (1.0, 0, 0.2),
            (1.0, 40, 1.0),
            (1.3, 1000, 0.9),
        ] {
            let d = distribution(&row, t, k, p);
            for step in 0..40u32 {
                let u = memra_kernels::twin::draw_uniform(5, 2, step) as f64;
                let r = d.draw(u);
                if r.ambiguous {
                    continue;
                }
                compared += 1;
                off +=
                    usize::from(sample_with(&row, t, k, p, 5, 2, step, Nucleus::Exact) != r.token);
            }
        }
        assert_eq!(off, 0, "of {compared}");
        assert!(compared > 80, "{compared}");
    }

    #[test]
    fn top_k_keeps_the_first_k_of_the_order_and_their_ties() {
        // Logits in the order 3 > 2 > 1 = 1 > 0 (ids 3, 0, then 1 and 4, then 2).
        let l = [2.0f32, 1.0, 0.0, 3.0, 1.0];
        let ids = |d: Distribution| d.kept.iter().map(|k| k.0).collect::<Vec<_>>();
        assert_eq!(ids(distribution(&l, 1.0, 2, 1.0)), [0, 3]);
        assert_eq!(ids(distribution(&l, 1.0, 3, 1.0)), [0, 1, 3, 4]);
        assert_eq!(ids(distribution(&l, 1.0, 1, 1.0)), [3]);
        assert_eq!(distribution(&l, 1.0, 0, 1.0).kept.len(), 5);
        assert_eq!(distribution(&l, 1.0, 5, 1.0).kept.len(), 5);
        assert_eq!(distribution(&l, 1.0, 99, 1.0).kept.len(), 5);
        // Renormalized over what top-k kept: e^3 / (e^3 + e^2).
        let d = distribution(&l, 1.0, 2, 1.0);
        assert!(close(d.prob(3), 1.0 / (1.0 + (-1.0f64).exp())), "{d:?}");
        assert_eq!(d.prob(1), 0.0);
        // Top-p cuts inside what top-k kept: token 3 holds 0.73 of it.
        assert_eq!(ids(distribution(&l, 1.0, 2, 0.7)), [3]);
        assert_eq!(ids(distribution(&l, 1.0, 2, 0.8)), [0, 3]);
        // Greedy ignores top-k.
        assert_eq!(distribution(&l, 0.0, 2, 1.0).kept, vec![(3, 1.0)]);
    }

    #[test]
    fn a_near_tie_at_the_top_k_cut_is_ambiguous_where_it_carries_mass() {
        // The second and third weights within f32 rounding: the engine may keep either.
        let d = distribution(&[1.0, 0.0, -1e-7, -5.0], 1.0, 2, 1.0);
        assert_eq!(d.kept.len(), 2, "{d:?}");
        assert!(d.cut_ambiguous && d.draw(0.1).ambiguous);
        assert!(!distribution(&[1.0, 0.0, -1e-4, -5.0], 1.0, 2, 1.0).cut_ambiguous);
        // One ulp apart at -40 (weights e^-40 of the top): a swap there moves no boundary a
        // draw can see.
        let tail = [0.0f32, -40.0, f32::from_bits((-40.0f32).to_bits() + 1)];
        assert!(may_tie((tail[1] as f64).exp(), (tail[2] as f64).exp()));
        assert!(!distribution(&tail, 1.0, 2, 1.0).cut_ambiguous);
    }

    /// Under top-k, alone and with top-p, the twin draws the reference's token wherever the
    /// draw is unambiguous, and the twin with the top-k cut one token late does not.
    #[test]
    fn the_twin_agrees_under_top_k_and_its_late_cut_does_not() {
        use memra_kernels::twin::{Nucleus, sample_with};
        let mut st = 13u32;
        let row: Vec<f32> = (0..300)
            .map(|_| {
                st = st.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                (st >> 8) as f32 / 16_777_216.0 * 8.0
            })
            .collect();
        let (mut compared, mut exact_off, mut late_off) = (0, 0, 0);
        for (t, k, p) in [
            (1.0f32, 1u32, 1.0f32),
            (0.7, 8, 1.0),
            (1.3, 40, 1.0),
            (1.0, 5, 0.9),
            (1.3, 40, 0.5),
            (1.0, 100, 0.2),
        ] {
            for step in 0..200u32 {
                let r = sample(&row, t, k, p, 5, SeqId(1), step as usize);
                if r.ambiguous {
                    continue;
                }
                compared += 1;
                let twin = |nucleus| sample_with(&row, t, k, p, 5, 1, step, nucleus);
                exact_off += usize::from(twin(Nucleus::Exact) != r.token);
                late_off += usize::from(twin(Nucleus::KOneMore) != r.token);
            }
        }
        assert!(compared > 1000, "{compared}");
        assert_eq!(exact_off, 0);
        assert!(late_off > 50, "{late_off}");
    }

    #[test]
    fn sample_uses_the_engine_stream() {
        let l = halves();
        let (seed, seq, step) = (42u64, SeqId(3), 9usize);
        let u = memra_kernels::twin::draw_uniform(seed, seq.0, step as u32) as f64;
        let want = distribution(&l, 1.0, 0, 0.9).draw(u);
        assert_eq!(sample(&l, 1.0, 0, 0.9, seed, seq, step), want);
    }
}
