//! Twins of `sample.cu`: argmax, the Philox4x32-10 counter-based generator, and temperature +
//! top-k + top-p sampling keyed by (seed, sequence, step), so a token drawn on the GPU can be
//! redrawn on the host.
//!
//! Sampling composition (one block of [`SAMPLE_THREADS`] threads per sequence; thread `t` owns
//! the contiguous chunk `[t*C, min((t+1)*C, n))` with `C = ceil(n / 256)`):
//! 1. `m = max logits` (exact); `p_i = exp((l_i - m) / temp)` (unnormalised).
//! 2. `mass(τ)`: each thread sums `p_i` with `p_i >= τ` over its chunk left to right from
//!    `0.0`; thread 0 sums the 256 chunk sums in thread order from `0.0`. `total = mass(0)`.
//! 3. top-k (`0 < top_k < n`; 0 or `>= n` keeps everything): `τ_k` is the largest float
//!    (bisection over the bit patterns of non-negative floats, 31 steps) with
//!    `count(τ_k) = #{ i : p_i >= τ_k } >= top_k` — the `top_k` largest probabilities, every
//!    token tied with the k-th included. Counts are integers, so the cut does not depend on
//!    any summation order. Without top-k, `τ_k = 0`.
//! 4. top-p, over what top-k kept: the kept set is `{ i : p_i >= τ* }` with `τ*` the largest
//!    float `>= τ_k` (the same bisection, from `τ_k` up) whose `mass(τ*)` is at least
//!    `top_p * mass(τ_k)` — the set a descending sort and cumulative cut of the renormalized
//!    top-k probabilities keeps, ties included. `top_p >= 1` keeps what top-k kept
//!    (`τ* = τ_k`). Top-k first, then top-p: the order of the usual sampler chains.
//! 5. `u` = [`uniform_from_philox`] of Philox4x32-10 with counter `[step, seq, 0, 0]` and key
//!    `[seed_lo, seed_hi]`; `target = u * mass(τ*)`.
//! 6. Thread 0 walks the chunks in order with `run = 0.0`: a chunk whose kept sum `S_c` gives
//!    `run + S_c > target` holds the token, else `run = run + S_c`. Inside that chunk it adds
//!    kept `p_i` to `run` one by one and returns the first `i` with `run > target`; if
//!    rounding leaves none, the chunk's last kept index. If no chunk qualifies, the last kept
//!    index overall.
//!
//! `temp <= 0` means greedy: [`argmax`]. `exp` is [`exp_mirrored`], the same operations as
//! the device's, so the drawn tokens agree bit for bit.

use super::exp_mirrored;

/// Threads per sampling block.
pub const SAMPLE_THREADS: usize = 256;

const PHILOX_M0: u32 = 0xD251_1F53;
const PHILOX_M1: u32 = 0xCD9E_8D57;
const PHILOX_W0: u32 = 0x9E37_79B9;
const PHILOX_W1: u32 = 0xBB67_AE85;

/// Philox4x32 with 10 rounds (Salmon et al., Random123): the key is bumped by the Weyl
/// constants between rounds.
pub fn philox4x32_10(counter: [u32; 4], key: [u32; 2]) -> [u32; 4] {
    let mut c = counter;
    let mut k = key;
    for round in 0..10 {
        if round > 0 {
            k[0] = k[0].wrapping_add(PHILOX_W0);
            k[1] = k[1].wrapping_add(PHILOX_W1);
        }
        let p0 = PHILOX_M0 as u64 * c[0] as u64;
        let p1 = PHILOX_M1 as u64 * c[2] as u64;
        let (hi0, lo0) = ((p0 >> 32) as u32, p0 as u32);
        let (hi1, lo1) = ((p1 >> 32) as u32, p1 as u32);
        c = [hi1 ^ c[1] ^ k[0], lo1, hi0 ^ c[3] ^ k[1], lo0];
    }
    c
}

/// A uniform float in `[0, 1)` from the top 24 bits of a Philox word: `(w >> 8) * 2^-24`,
/// exact in f32.
pub fn uniform_from_philox(w: u32) -> f32 {
    (w >> 8) as f32 * (1.0 / 16_777_216.0)
}

/// Index of the largest value, ties to the lowest index. NaN never wins against a number; an
/// all-NaN (or empty) row gives 0.
///
/// Two passes: the maximum (`f32::max` ignores NaN), then the first index holding it. Equal
/// values compare equal (`-0.0 == 0.0` included), so the first match is the lowest tied
/// index, as in the device's (value, index) reduction.
pub fn argmax(row: &[f32]) -> u32 {
    let m = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    row.iter().position(|&v| v == m).unwrap_or(0) as u32
}

/// Sum of the kept probabilities (`p >= tau`) in the chunked composition, with chunk sums.
///
/// Each chunk is still summed left to right, but eight chunks advance side by side so their
/// independent dependency chains overlap; an excluded value adds `+0.0`, which leaves a
/// non-negative sum's bits unchanged, so this equals the branchy per-chunk loop bit for bit
/// (tested against it).
fn mass(p: &[f32], tau: f32, chunk: usize, sums: &mut [f32; SAMPLE_THREADS]) -> f32 {
    const G: usize = 8;
    sums.fill(0.0);
    let full = p.len() / chunk;
    let mut c = 0;
    while c + G <= full {
        let rows: [&[f32]; G] = std::array::from_fn(|j| &p[(c + j) * chunk..(c + j + 1) * chunk]);
        let mut acc = [0.0f32; G];
        for i in 0..chunk {
            for (a, row) in acc.iter_mut().zip(&rows) {
                let v = row[i];
                *a += if v >= tau { v } else { 0.0 };
            }
        }
        sums[c..c + G].copy_from_slice(&acc);
        c += G;
    }
    for (s, cs) in sums[c..].iter_mut().zip(p[c * chunk..].chunks(chunk)) {
        for &v in cs {
            *s += if v >= tau { v } else { 0.0 };
        }
    }
    let mut total = 0.0f32;
    for &s in sums.iter() {
        total += s;
    }
    total
}

/// Tokens whose probability is at least `tau` (NaN never is): the top-k cut's count. The
/// device sums per-thread counts; integers add exactly in any order.
fn count(p: &[f32], tau: f32) -> usize {
    p.iter().filter(|&&v| v >= tau).count()
}

/// The largest non-negative float bit pattern `t >= lo` (within `lo..0x7f80_0001`) for which
/// `keeps(t)` holds, given that `keeps(lo)` holds and `keeps` only turns false as `t` grows:
/// 31 steps of bisection over the bit patterns (`+inf` + 1 is never kept). Returns the pair
/// `(t, t + 1)`, the last kept pattern and the first not kept.
fn bisect(lo: u32, mut keeps: impl FnMut(f32) -> bool) -> (u32, u32) {
    let (mut lo, mut hi) = (lo, 0x7f80_0001u32);
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if keeps(f32::from_bits(mid)) {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    (lo, hi)
}

/// The uniform in `[0, 1)` the sampler draws for `(seed, seq, step)`: [`uniform_from_philox`]
/// of the first word of Philox4x32-10 with counter `[step, seq, 0, 0]` and key
/// `[seed_lo, seed_hi]`. This stream is the sampler's contract; an independent sampler that
/// inverts its own CDF at this `u` must pick the engine's token.
pub fn draw_uniform(seed: u64, seq: u32, step: u32) -> f32 {
    let r = philox4x32_10([step, seq, 0, 0], [seed as u32, (seed >> 32) as u32]);
    uniform_from_philox(r[0])
}

/// Which nucleus the sampler keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Nucleus {
    /// The contract: `{ i : p_i >= τ* }` (module documentation, step 3).
    Exact,
    /// A planted test defect: the cut one token early, `{ i : p_i > τ* }`, which drops the
    /// token (or the tied tokens) at the cut. The bisection's upper end `τ*` + 1 ulp is that
    /// threshold, so the defect is one choice of end, the same on the device. It applies
    /// only where it leaves something to draw from (the nucleus holds more than the cut
    /// group) and only when `top_p < 1`.
    OneEarly,
    /// A planted test defect: the top-k cut keeps the `top_k + 1` largest probabilities (an
    /// off-by-one in the count), wherever `0 < top_k < n`; the top-p cut is the contract's.
    KOneMore,
    /// A planted test defect: the top-k cut keeps exactly `top_k` tokens, the tokens tied
    /// with the k-th past the first `top_k` of the order (ids ascending among equals)
    /// dropped, as a sort-and-truncate sampler does. Where no token ties with the k-th it
    /// keeps what the contract keeps, so only a row with a tie at the cut can see it.
    KDropTies,
}

/// Draws a token from `logits` at temperature `temp` with top-k `top_k` (0 = none) and nucleus
/// `top_p`, keyed by `(seed, seq, step)`; see the module documentation for the exact
/// composition. An empty row gives 0.
pub fn sample(
    logits: &[f32],
    temp: f32,
    top_k: u32,
    top_p: f32,
    seed: u64,
    seq: u32,
    step: u32,
) -> u32 {
    sample_with(logits, temp, top_k, top_p, seed, seq, step, Nucleus::Exact)
}

/// [`sample`] with a choice of [`Nucleus`] (the planted `top-p-cut` and `top-k-cut` defects'
/// hook): [`Prepared::from_row`] of the row, then [`Prepared::pick`] at the `(seed, seq, step)`
/// uniform.
#[allow(clippy::too_many_arguments)]
pub fn sample_with(
    logits: &[f32],
    temp: f32,
    top_k: u32,
    top_p: f32,
    seed: u64,
    seq: u32,
    step: u32,
    nucleus: Nucleus,
) -> u32 {
    Prepared::from_row(logits, temp, top_k, top_p, nucleus).pick(draw_uniform(seed, seq, step))
}

/// Steps 1–4 of the composition done once for a row: the unnormalised probabilities, the
/// cut and the kept chunk sums, from which [`Prepared::pick`] draws steps 5–6 for any
/// uniform. [`sample_with`] is exactly `new` then `pick`, so many draws from one row (a
/// distribution test) cost one preparation, not one each, and give the same tokens.
#[derive(Debug, Clone)]
pub struct Prepared {
    /// `None`: greedy (`temp <= 0`, NaN or an empty row), the argmax.
    p: Option<Vec<f32>>,
    argmax: u32,
    tau: f32,
    chunk: usize,
    sums: [f32; SAMPLE_THREADS],
    kept: f32,
}

impl Prepared {
    /// The row `logits` at temperature `temp`, top-k `top_k` (0 = none), nucleus `top_p`,
    /// keeping `nucleus`.
    pub fn from_row(logits: &[f32], temp: f32, top_k: u32, top_p: f32, nucleus: Nucleus) -> Self {
        let n = logits.len();
        let mut out = Prepared {
            p: None,
            argmax: 0,
            tau: 0.0,
            chunk: 1,
            sums: [0.0; SAMPLE_THREADS],
            kept: 0.0,
        };
        if n == 0 || temp <= 0.0 || temp.is_nan() {
            out.argmax = argmax(logits);
            return out;
        }
        let m = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let mut p: Vec<f32> = logits
            .iter()
            .map(|&l| exp_mirrored((l - m) / temp))
            .collect();
        let chunk = n.div_ceil(SAMPLE_THREADS);
        let mut sums = [0.0f32; SAMPLE_THREADS];
        let mut tau_bits = 0u32;
        if top_k > 0 && (top_k as usize) < n {
            let k = top_k as usize + usize::from(nucleus == Nucleus::KOneMore);
            tau_bits = bisect(0, |t| count(&p, t) >= k).0;
            if nucleus == Nucleus::KDropTies {
                // Room for the first ties at the cut: k less the tokens strictly above it.
                let tau = f32::from_bits(tau_bits);
                let mut room = k - count(&p, f32::from_bits(tau_bits + 1));
                for v in p.iter_mut().filter(|v| **v == tau) {
                    if room > 0 {
                        room -= 1;
                    } else {
                        *v = -1.0; // below every cut (τ >= +0): never kept
                    }
                }
            }
        }
        if top_p < 1.0 {
            let want = top_p * mass(&p, f32::from_bits(tau_bits), chunk, &mut sums);
            // mass(τ_k) >= want, as top_p <= 1: the bisection's lower end holds.
            let (lo, hi) = bisect(tau_bits, |t| mass(&p, t, chunk, &mut sums) >= want);
            tau_bits = lo;
            if nucleus == Nucleus::OneEarly && mass(&p, f32::from_bits(hi), chunk, &mut sums) > 0.0
            {
                tau_bits = hi;
            }
        }
        out.tau = f32::from_bits(tau_bits);
        out.kept = mass(&p, out.tau, chunk, &mut sums);
        out.p = Some(p);
        out.chunk = chunk;
        out.sums = sums;
        out
    }

    /// The token drawn at uniform `u` in `[0, 1)` (steps 5–6; the argmax when greedy).
    pub fn pick(&self, u: f32) -> u32 {
        let Some(p) = &self.p else {
            return self.argmax;
        };
        let (n, chunk, tau) = (p.len(), self.chunk, self.tau);
        let target = u * self.kept;
        let last_kept = |range: std::ops::Range<usize>| range.rev().find(|&i| p[i] >= tau);
        let mut run = 0.0f32;
        for (c, &s) in self.sums.iter().enumerate() {
            let range = (c * chunk).min(n)..((c + 1) * chunk).min(n);
            if run + s > target {
                for i in range.clone() {
                    if p[i] >= tau {
                        run += p[i];
                        if run > target {
                            return i as u32;
                        }
                    }
                }
                return last_kept(range).unwrap_or(0) as u32;
            }
            run += s;
        }
        last_kept(0..n).unwrap_or(0) as u32
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The straightforward per-chunk loop the GPU runs.
    fn mass_reference(p: &[f32], tau: f32, chunk: usize, sums: &mut [f32; SAMPLE_THREADS]) -> f32 {
        sums.fill(0.0);
        for (s, c) in sums.iter_mut().zip(p.chunks(chunk)) {
            for &v in c {
                if v >= tau {
                    *s += v;
                }
            }
        }
        sums.iter().fold(0.0f32, |t, &s| t + s)
    }

    #[test]
    fn interleaved_mass_equals_the_plain_loop() {
        let mut st = 12345u32;
        for n in [1usize, 7, 255, 256, 257, 1000, 2048 + 3, 49152] {
            let p: Vec<f32> = (0..n)
                .map(|i| {
                    st = st.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                    let v = ((st >> 8) as f32 / 16_777_216.0).powi(8);
                    if i % 97 == 5 { f32::NAN } else { v }
                })
                .collect();
            let chunk = n.div_ceil(SAMPLE_THREADS);
            for tau in [0.0f32, 1e-6, 0.01, 0.3, 2.0] {
                let (mut a, mut b) = ([0.0f32; SAMPLE_THREADS], [0.0f32; SAMPLE_THREADS]);
                let ta = mass(&p, tau, chunk, &mut a);
                let tb = mass_reference(&p, tau, chunk, &mut b);
                assert_eq!(ta.to_bits(), tb.to_bits(), "n {n} tau {tau}");
                assert_eq!(a.map(f32::to_bits), b.map(f32::to_bits), "n {n} tau {tau}");
            }
        }
    }

    /// Random123's `kat_vectors` lines for philox4x32 10 (counter, key, expected).
    #[test]
    fn philox_known_answers() {
        let kat = [
            (
                [0u32; 4],
                [0u32; 2],
                [0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8],
            ),
            (
                [u32::MAX; 4],
                [u32::MAX; 2],
                [0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd],
            ),
            (
                [0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344],
                [0xa4093822, 0x299f31d0],
                [0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1],
            ),
        ];
        for (c, k, want) in kat {
            assert_eq!(philox4x32_10(c, k), want);
        }
    }

    /// The scan the device reduction is defined by: a later value wins only when larger, or
    /// when the current best is NaN.
    fn argmax_reference(row: &[f32]) -> u32 {
        let mut best = 0usize;
        for (i, &v) in row.iter().enumerate() {
            let b = row[best];
            if v > b || (b.is_nan() && !v.is_nan()) {
                best = i;
            }
        }
        best as u32
    }

    #[test]
    fn argmax_equals_the_scan_on_awkward_rows() {
        let specials = [
            f32::NAN,
            f32::NEG_INFINITY,
            f32::INFINITY,
            -0.0,
            0.0,
            1.0,
            -1.0,
        ];
        let mut st = 99u32;
        for _ in 0..2000 {
            let n = 1 + (st % 9) as usize;
            let row: Vec<f32> = (0..n)
                .map(|_| {
                    st = st.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                    specials[(st >> 16) as usize % specials.len()]
                })
                .collect();
            assert_eq!(argmax(&row), argmax_reference(&row), "{row:?}");
        }
    }

    #[test]
    fn argmax_ties_go_to_lowest_index() {
        assert_eq!(argmax(&[1.0, 3.0, 3.0, 2.0]), 1);
        assert_eq!(argmax(&[f32::NAN, -1.0, 5.0, 5.0]), 2);
        assert_eq!(argmax(&[-0.0, 0.0]), 0);
        assert_eq!(argmax(&[]), 0);
    }

    #[test]
    fn greedy_and_deterministic() {
        let logits: Vec<f32> = (0..1000)
            .map(|i| ((i * 7919) % 1000) as f32 / 100.0)
            .collect();
        assert_eq!(sample(&logits, 0.0, 0, 0.9, 1, 0, 0), argmax(&logits));
        let a = sample(&logits, 0.8, 0, 0.9, 42, 3, 7);
        assert_eq!(a, sample(&logits, 0.8, 0, 0.9, 42, 3, 7));
        // Different steps draw different tokens at least sometimes.
        let draws: std::collections::BTreeSet<u32> = (0..50)
            .map(|s| sample(&logits, 1.0, 0, 1.0, 42, 0, s))
            .collect();
        assert!(draws.len() > 10);
    }

    /// The planted early cut drops the token at the cut and nothing else, and leaves a
    /// one-token nucleus alone.
    #[test]
    fn one_early_drops_the_cut_token() {
        let logits = [4.0f32.ln(), 2.0f32.ln(), 0.0, 0.0];
        let draws = |top_p: f32, nucleus: Nucleus| -> std::collections::BTreeSet<u32> {
            (0..400)
                .map(|s| sample_with(&logits, 1.0, 0, top_p, 3, 0, s, nucleus))
                .collect()
        };
        assert_eq!(draws(0.6, Nucleus::Exact), [0, 1].into());
        assert_eq!(draws(0.6, Nucleus::OneEarly), [0].into());
        assert_eq!(draws(0.4, Nucleus::OneEarly), [0].into());
        assert_eq!(draws(1.0, Nucleus::OneEarly).len(), 4);
    }

    /// Top-p keeps the smallest high-probability set: with one dominant token and p below its
    /// share, only that token can be drawn; the frequencies at top_p = 1 follow the softmax.
    #[test]
    fn top_p_and_frequencies() {
        let logits = [5.0f32, 1.0, 0.0, 0.5];
        for step in 0..200 {
            assert_eq!(sample(&logits, 1.0, 0, 0.9, 7, 0, step), 0);
        }
        let logits = [0.0f32, (2.0f32).ln(), 0.0];
        let mut counts = [0usize; 3];
        for step in 0..4000 {
            counts[sample(&logits, 1.0, 0, 1.0, 11, 1, step) as usize] += 1;
        }
        // Expected shares 1/4, 1/2, 1/4.
        assert!((counts[1] as f64 / 4000.0 - 0.5).abs() < 0.04, "{counts:?}");
        assert!(
            (counts[0] as f64 / 4000.0 - 0.25).abs() < 0.04,
            "{counts:?}"
        );
    }

    /// The distinct tokens of 400 draws.
    fn drawn(logits: &[f32], temp: f32, top_k: u32, top_p: f32, nucleus: Nucleus) -> Vec<u32> {
        let set: std::collections::BTreeSet<u32> = (0..400)
            .map(|s| sample_with(logits, temp, top_k, top_p, 5, 1, s, nucleus))
            .collect();
        set.into_iter().collect()
    }

    /// Top-k keeps the k most probable tokens, ties at the k-th included; 0 and k >= n keep
    /// everything; top-k = 1 is the argmax; top-p then cuts inside what top-k kept.
    #[test]
    fn top_k_keeps_the_k_largest_and_its_ties() {
        // Probabilities in the order 3 > 0 > 4 = 1 > 2.
        let logits = [2.0f32, 1.0, 0.0, 3.0, 1.0];
        let e = Nucleus::Exact;
        assert_eq!(drawn(&logits, 1.0, 2, 1.0, e), [0, 3]);
        assert_eq!(drawn(&logits, 1.0, 3, 1.0, e), [0, 1, 3, 4]);
        assert_eq!(drawn(&logits, 1.0, 1, 1.0, e), [3]);
        assert_eq!(drawn(&logits, 1.0, 0, 1.0, e).len(), 5);
        assert_eq!(drawn(&logits, 1.0, 5, 1.0, e).len(), 5);
        assert_eq!(drawn(&logits, 1.0, 9, 1.0, e).len(), 5);
        // Renormalized over tokens 3 and 0 (e^3 and e^2), token 3 holds 0.73 of the mass:
        // top-p 0.7 keeps it alone, 0.8 both.
        assert_eq!(drawn(&logits, 1.0, 2, 0.7, e), [3]);
        assert_eq!(drawn(&logits, 1.0, 2, 0.8, e), [0, 3]);
        // Without top-k the shares are 0.59, 0.22, 0.08 twice, 0.03: top-p 0.8 keeps two
        // tokens, 0.95 reaches into the tied pair and keeps both of it.
        assert_eq!(drawn(&logits, 1.0, 0, 0.8, e), [0, 3]);
        assert_eq!(drawn(&logits, 1.0, 0, 0.95, e), [0, 1, 3, 4]);
        // Top-k 1 draws the argmax at any temperature, every step.
        for step in 0..50 {
            assert_eq!(sample(&logits, 1.7, 1, 1.0, 9, 2, step), argmax(&logits));
        }
        // Top-k 0 is the untruncated sampler, bit for bit.
        for step in 0..50 {
            assert_eq!(
                sample(&logits, 0.8, 0, 0.9, 3, 1, step),
                sample(&logits, 0.8, 5, 0.9, 3, 1, step)
            );
        }
    }

    /// The planted off-by-one keeps the (k+1)-th token too, and nothing changes without
    /// top-k.
    #[test]
    fn k_one_more_keeps_the_next_token() {
        let logits = [2.0f32, 1.0, 0.0, 3.0, 0.5];
        let k = Nucleus::KOneMore;
        assert_eq!(drawn(&logits, 1.0, 1, 1.0, k), [0, 3]);
        assert_eq!(drawn(&logits, 1.0, 2, 1.0, k), [0, 1, 3]);
        assert_eq!(drawn(&logits, 1.0, 4, 1.0, k).len(), 5);
        assert_eq!(drawn(&logits, 1.0, 5, 1.0, k).len(), 5);
        for step in 0..50 {
            assert_eq!(
                sample_with(&logits, 0.8, 0, 0.6, 3, 1, step, k),
                sample(&logits, 0.8, 0, 0.6, 3, 1, step)
            );
        }
    }

    /// The planted tie-dropping cut keeps exactly k, the first of a tie at the cut by id,
    /// and is the contract wherever nothing ties with the k-th.
    #[test]
    fn k_drop_ties_keeps_exactly_k() {
        let tied = [1.0f32, 2.0, 1.0, 3.0, 1.0, 0.0];
        let d = Nucleus::KDropTies;
        // The order is 3, 1, then 0 = 2 = 4, then 5. At k = 3 the contract keeps the three
        // tied with the 3rd; the defect only the lowest id of them, at k = 4 two.
        assert_eq!(drawn(&tied, 1.0, 3, 1.0, Nucleus::Exact), [0, 1, 2, 3, 4]);
        assert_eq!(drawn(&tied, 1.0, 3, 1.0, d), [0, 1, 3]);
        assert_eq!(drawn(&tied, 1.0, 4, 1.0, d), [0, 1, 2, 3]);
        // No tie at the cut: the contract's.
        assert_eq!(drawn(&tied, 1.0, 2, 1.0, d), [1, 3]);
        let distinct = [2.0f32, 1.0, 0.0, 3.0, 0.5];
        for step in 0..50 {
            assert_eq!(
                sample_with(&distinct, 0.8, 3, 0.9, 3, 1, step, d),
                sample(&distinct, 0.8, 3, 0.9, 3, 1, step)
            );
        }
    }
}
