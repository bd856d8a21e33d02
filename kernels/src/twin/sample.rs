//! Twins of `sample.cu`: argmax, the Philox4x32-10 counter-based generator, and temperature +
//! top-p sampling keyed by (seed, sequence, step), so a token drawn on the GPU can be redrawn
//! on the host.
//!
//! Sampling composition (one block of [`SAMPLE_THREADS`] threads per sequence; thread `t` owns
//! the contiguous chunk `[t*C, min((t+1)*C, n))` with `C = ceil(n / 256)`):
//! 1. `m = max logits` (exact); `p_i = exp((l_i - m) / temp)` (unnormalised).
//! 2. `mass(τ)`: each thread sums `p_i` with `p_i >= τ` over its chunk left to right from
//!    `0.0`; thread 0 sums the 256 chunk sums in thread order from `0.0`. `total = mass(0)`.
//! 3. top-p: the kept set is `{ i : p_i >= τ* }` with `τ*` the largest float (searched by
//!    bisection over the bit patterns of non-negative floats, 31 steps) whose `mass(τ*)` is at
//!    least `top_p * total` — the same set a descending sort and cumulative cut keeps, ties
//!    included. `top_p >= 1` keeps everything (`τ* = 0`).
//! 4. `u` = [`uniform_from_philox`] of Philox4x32-10 with counter `[step, seq, 0, 0]` and key
//!    `[seed_lo, seed_hi]`; `target = u * mass(τ*)`.
//! 5. Thread 0 walks the chunks in order with `run = 0.0`: a chunk whose kept sum `S_c` gives
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
}

/// Draws a token from `logits` at temperature `temp` with nucleus `top_p`, keyed by
/// `(seed, seq, step)`; see the module documentation for the exact composition. An empty row
/// gives 0.
pub fn sample(logits: &[f32], temp: f32, top_p: f32, seed: u64, seq: u32, step: u32) -> u32 {
    sample_with(logits, temp, top_p, seed, seq, step, Nucleus::Exact)
}

/// [`sample`] with a choice of [`Nucleus`] (the planted `top-p-cut` defect's hook).
pub fn sample_with(
    logits: &[f32],
    temp: f32,
    top_p: f32,
    seed: u64,
    seq: u32,
    step: u32,
    nucleus: Nucleus,
) -> u32 {
    let n = logits.len();
    if n == 0 || temp <= 0.0 || temp.is_nan() {
        return argmax(logits);
    }
    let m = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let p: Vec<f32> = logits
        .iter()
        .map(|&l| exp_mirrored((l - m) / temp))
        .collect();
    let chunk = n.div_ceil(SAMPLE_THREADS);
    let mut sums = [0.0f32; SAMPLE_THREADS];
    let total = mass(&p, 0.0, chunk, &mut sums);
    let mut tau_bits = 0u32;
    if top_p < 1.0 {
        let want = top_p * total;
        // Invariant: mass(lo) >= want, mass(hi) < want (hi = +inf bits + 1 is never kept).
        let (mut lo, mut hi) = (0u32, 0x7f80_0001u32);
        while hi - lo > 1 {
            let mid = lo + (hi - lo) / 2;
            if mass(&p, f32::from_bits(mid), chunk, &mut sums) >= want {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        tau_bits = lo;
        if nucleus == Nucleus::OneEarly && mass(&p, f32::from_bits(hi), chunk, &mut sums) > 0.0 {
            tau_bits = hi;
        }
    }
    let tau = f32::from_bits(tau_bits);
    let kept = mass(&p, tau, chunk, &mut sums);
    let target = draw_uniform(seed, seq, step) * kept;
    let last_kept = |range: std::ops::Range<usize>| range.rev().find(|&i| p[i] >= tau);
    let mut run = 0.0f32;
    for (c, &s) in sums.iter().enumerate() {
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
        assert_eq!(sample(&logits, 0.0, 0.9, 1, 0, 0), argmax(&logits));
        let a = sample(&logits, 0.8, 0.9, 42, 3, 7);
        assert_eq!(a, sample(&logits, 0.8, 0.9, 42, 3, 7));
        // Different steps draw different tokens at least sometimes.
        let draws: std::collections::BTreeSet<u32> = (0..50)
            .map(|s| sample(&logits, 1.0, 1.0, 42, 0, s))
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
                .map(|s| sample_with(&logits, 1.0, top_p, 3, 0, s, nucleus))
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
            assert_eq!(sample(&logits, 1.0, 0.9, 7, 0, step), 0);
        }
        let logits = [0.0f32, (2.0f32).ln(), 0.0];
        let mut counts = [0usize; 3];
        for step in 0..4000 {
            counts[sample(&logits, 1.0, 1.0, 11, 1, step) as usize] += 1;
        }
        // Expected shares 1/4, 1/2, 1/4.
        assert!((counts[1] as f64 / 4000.0 - 0.5).abs() < 0.04, "{counts:?}");
        assert!(
            (counts[0] as f64 / 4000.0 - 0.25).abs() < 0.04,
            "{counts:?}"
        );
    }
}
