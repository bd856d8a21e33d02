//! Twins of `attention.cu`: decode attention of one new query token over a KV cache, in the
//! two families of the `MEMRA_FA3` door — one block per head (`naive`) and split-K
//! flash-decoding (`split_k`: per-chunk partials with max and sum, then a combine).
//!
//! The cache is position-major f32: token `t`, KV head `k`, element `d` at
//! `(t * n_kv_heads + k) * head_dim + d`. Query head `h` reads KV head
//! `h / (n_heads / n_kv_heads)` (grouped-query attention).
//!
//! Composition shared by both families (a block of [`ATTN_THREADS`] = 128 threads, 4 warps):
//! the score of token `t` is `dot * scale`, where `dot` is the butterfly sum of 32 lanes and
//! lane `l` accumulates `q[d] * k[t][d]` for `d = l, l+32, …` from `0.0`. Softmax weights are
//! `e_t = exp(s_t - m)` ([`exp_mirrored`], as on the device) with `m` the maximum score of the
//! block's token range; the weight sum
//! is a [`block_sum`](super::block_sum) where thread `i` accumulates `e_t` for the range's
//! tokens `i, i+128, …`; the output numerator for element `d` accumulates `e_t * v[t][d]` over
//! the range's tokens in order from `0.0`.

use super::{
    ShapeError, check_len, exp_mirrored,
    reduce::{block_sum, warp_sum},
};

/// Threads per attention block.
pub const ATTN_THREADS: usize = 128;

/// Tokens per split-K chunk.
pub const SPLIT_K_CHUNK: usize = 64;

/// Geometry of one layer's decode attention.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttnShape {
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    /// Tokens in the cache, the new one included.
    pub n_tokens: usize,
}

impl AttnShape {
    fn check(&self, op: &'static str, q: &[f32], k: &[f32], v: &[f32]) -> Result<(), ShapeError> {
        let bad_geometry = self.n_kv_heads == 0
            || !self.n_heads.is_multiple_of(self.n_kv_heads)
            || self.head_dim == 0
            || self.n_tokens == 0;
        if bad_geometry {
            return Err(ShapeError {
                op,
                arg: "shape.n_kv_heads",
                got: self.n_kv_heads,
                expected: self.n_kv_heads.max(1),
                expected_why: "n_heads must be a multiple of n_kv_heads, head_dim and n_tokens non-zero",
            });
        }
        check_len(
            op,
            "q",
            q.len(),
            self.n_heads * self.head_dim,
            "q holds n_heads * head_dim",
        )?;
        let kv = self.n_tokens * self.n_kv_heads * self.head_dim;
        if k.len() < kv {
            return Err(ShapeError {
                op,
                arg: "k_cache",
                got: k.len(),
                expected: kv,
                expected_why: "the cache holds n_tokens * n_kv_heads * head_dim values at least",
            });
        }
        if v.len() < kv {
            return Err(ShapeError {
                op,
                arg: "v_cache",
                got: v.len(),
                expected: kv,
                expected_why: "the cache holds n_tokens * n_kv_heads * head_dim values at least",
            });
        }
        Ok(())
    }
}

/// Scores `s_t` for tokens in `range` of head `h` into `scores` (one per token of the range).
fn scores(
    h: usize,
    q: &[f32],
    k: &[f32],
    shape: &AttnShape,
    scale: f32,
    range: std::ops::Range<usize>,
    scores: &mut Vec<f32>,
) {
    let hd = shape.head_dim;
    let kvh = h / (shape.n_heads / shape.n_kv_heads);
    let qh = &q[h * hd..(h + 1) * hd];
    scores.clear();
    for t in range {
        let kt = &k[(t * shape.n_kv_heads + kvh) * hd..][..hd];
        let mut lanes = [0.0f32; 32];
        for (qc, kc) in qh.chunks(32).zip(kt.chunks(32)) {
            for ((l, &a), &b) in lanes.iter_mut().zip(qc).zip(kc) {
                *l += a * b;
            }
        }
        scores.push(warp_sum(&mut lanes) * scale);
    }
}

/// Turns scores into `exp(s - m)` in place and returns `(m, sum)`.
fn softmax_parts(s: &mut [f32]) -> (f32, f32) {
    let m = s.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut partials = [0.0f32; ATTN_THREADS];
    for (i, e) in s.iter_mut().enumerate() {
        *e = exp_mirrored(*e - m);
        partials[i % ATTN_THREADS] += *e;
    }
    (m, block_sum(&partials))
}

/// Numerator `sum_t e_t * v[t][d]` for the tokens starting at `t0`, element by element.
fn weighted_values(h: usize, e: &[f32], t0: usize, v: &[f32], shape: &AttnShape, out: &mut [f32]) {
    let hd = shape.head_dim;
    let kvh = h / (shape.n_heads / shape.n_kv_heads);
    out.fill(0.0);
    for (i, &w) in e.iter().enumerate() {
        let vt = &v[((t0 + i) * shape.n_kv_heads + kvh) * hd..][..hd];
        for (o, &x) in out.iter_mut().zip(vt) {
            *o += w * x;
        }
    }
}

/// One-block-per-head attention for head `h` into `out` (`head_dim` values):
/// `out[d] = numerator[d] / sum`.
pub fn attention_naive_head(
    h: usize,
    q: &[f32],
    k_cache: &[f32],
    v_cache: &[f32],
    shape: &AttnShape,
    scale: f32,
    out: &mut [f32],
) -> Result<(), ShapeError> {
    shape.check("attention_naive_head", q, k_cache, v_cache)?;
    check_len(
        "attention_naive_head",
        "out",
        out.len(),
        shape.head_dim,
        "out holds head_dim",
    )?;
    let mut s = Vec::with_capacity(shape.n_tokens);
    scores(h, q, k_cache, shape, scale, 0..shape.n_tokens, &mut s);
    let (_, sum) = softmax_parts(&mut s);
    weighted_values(h, &s, 0, v_cache, shape, out);
    for o in out.iter_mut() {
        *o /= sum;
    }
    Ok(())
}

/// [`attention_naive_head`] for every head; `out` holds `n_heads * head_dim` values.
pub fn attention_naive(
    q: &[f32],
    k_cache: &[f32],
    v_cache: &[f32],
    shape: &AttnShape,
    scale: f32,
    out: &mut [f32],
) -> Result<(), ShapeError> {
    check_len(
        "attention_naive",
        "out",
        out.len(),
        shape.n_heads * shape.head_dim,
        "out holds n_heads * head_dim",
    )?;
    for (h, o) in out.chunks_exact_mut(shape.head_dim).enumerate() {
        attention_naive_head(h, q, k_cache, v_cache, shape, scale, o)?;
    }
    Ok(())
}

/// Split-K attention for head `h`: chunk `c` of [`SPLIT_K_CHUNK`] tokens yields its own
/// maximum `m_c`, weight sum `l_c` and numerator `o_c[d]` (the shared composition over the
/// chunk); the combine takes `M = max m_c`, then over chunks in order `f = exp(m_c - M)`,
/// `L = L + f * l_c`, `O[d] = O[d] + f * o_c[d]` from `0.0`, and `out[d] = O[d] / L`.
pub fn attention_split_k_head(
    h: usize,
    q: &[f32],
    k_cache: &[f32],
    v_cache: &[f32],
    shape: &AttnShape,
    scale: f32,
    out: &mut [f32],
) -> Result<(), ShapeError> {
    shape.check("attention_split_k_head", q, k_cache, v_cache)?;
    check_len(
        "attention_split_k_head",
        "out",
        out.len(),
        shape.head_dim,
        "out holds head_dim",
    )?;
    let n_chunks = shape.n_tokens.div_ceil(SPLIT_K_CHUNK);
    let hd = shape.head_dim;
    let mut ms = Vec::with_capacity(n_chunks);
    let mut ls = Vec::with_capacity(n_chunks);
    let mut os = vec![0.0f32; n_chunks * hd];
    let mut s = Vec::with_capacity(SPLIT_K_CHUNK);
    for c in 0..n_chunks {
        let range = c * SPLIT_K_CHUNK..((c + 1) * SPLIT_K_CHUNK).min(shape.n_tokens);
        let t0 = range.start;
        scores(h, q, k_cache, shape, scale, range, &mut s);
        let (m, l) = softmax_parts(&mut s);
        ms.push(m);
        ls.push(l);
        weighted_values(h, &s, t0, v_cache, shape, &mut os[c * hd..(c + 1) * hd]);
    }
    let big_m = ms.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut big_l = 0.0f32;
    out.fill(0.0);
    for c in 0..n_chunks {
        let f = exp_mirrored(ms[c] - big_m);
        big_l += f * ls[c];
        for (o, &oc) in out.iter_mut().zip(&os[c * hd..(c + 1) * hd]) {
            *o += f * oc;
        }
    }
    for o in out.iter_mut() {
        *o /= big_l;
    }
    Ok(())
}

/// [`attention_split_k_head`] for every head; `out` holds `n_heads * head_dim` values.
pub fn attention_split_k(
    q: &[f32],
    k_cache: &[f32],
    v_cache: &[f32],
    shape: &AttnShape,
    scale: f32,
    out: &mut [f32],
) -> Result<(), ShapeError> {
    check_len(
        "attention_split_k",
        "out",
        out.len(),
        shape.n_heads * shape.head_dim,
        "out holds n_heads * head_dim",
    )?;
    for (h, o) in out.chunks_exact_mut(shape.head_dim).enumerate() {
        attention_split_k_head(h, q, k_cache, v_cache, shape, scale, o)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reference(q: &[f32], k: &[f32], v: &[f32], s: &AttnShape, scale: f64) -> Vec<f64> {
        let hd = s.head_dim;
        let mut out = vec![0.0f64; s.n_heads * hd];
        for h in 0..s.n_heads {
            let kvh = h / (s.n_heads / s.n_kv_heads);
            let sc: Vec<f64> = (0..s.n_tokens)
                .map(|t| {
                    (0..hd)
                        .map(|d| q[h * hd + d] as f64 * k[(t * s.n_kv_heads + kvh) * hd + d] as f64)
                        .sum::<f64>()
                        * scale
                })
                .collect();
            let m = sc.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let e: Vec<f64> = sc.iter().map(|x| (x - m).exp()).collect();
            let z: f64 = e.iter().sum();
            for d in 0..hd {
                out[h * hd + d] = (0..s.n_tokens)
                    .map(|t| e[t] * v[(t * s.n_kv_heads + kvh) * hd + d] as f64)
                    .sum::<f64>()
                    / z;
            }
        }
        out
    }

    /// Both families agree with an f64 softmax-attention within float rounding, and with each
    /// other only within tolerance (different compositions once there are several chunks).
    #[test]
    fn families_match_f64_reference() {
        let shape = AttnShape {
            n_heads: 9,
            n_kv_heads: 3,
            head_dim: 64,
            n_tokens: 200,
        };
        let n = shape.n_tokens * shape.n_kv_heads * shape.head_dim;
        let f = |i: usize, a: f32| ((i as f32 * a).sin() * 1.7).fract();
        let q: Vec<f32> = (0..shape.n_heads * 64).map(|i| f(i, 0.91) * 3.0).collect();
        let k: Vec<f32> = (0..n).map(|i| f(i, 0.37)).collect();
        let v: Vec<f32> = (0..n).map(|i| f(i, 0.53)).collect();
        let scale = 1.0 / 8.0;
        let want = reference(&q, &k, &v, &shape, scale as f64);
        let mut a = vec![0.0; 9 * 64];
        let mut b = vec![0.0; 9 * 64];
        attention_naive(&q, &k, &v, &shape, scale, &mut a).unwrap();
        attention_split_k(&q, &k, &v, &shape, scale, &mut b).unwrap();
        for i in 0..a.len() {
            assert!((a[i] as f64 - want[i]).abs() < 1e-5, "naive {i}");
            assert!((b[i] as f64 - want[i]).abs() < 1e-5, "split-k {i}");
        }
        assert!(a.iter().zip(&b).any(|(x, y)| x.to_bits() != y.to_bits()));
    }

    #[test]
    fn short_cache_is_an_error() {
        let shape = AttnShape {
            n_heads: 2,
            n_kv_heads: 1,
            head_dim: 4,
            n_tokens: 3,
        };
        let err = attention_naive(&[0.0; 8], &[0.0; 8], &[0.0; 12], &shape, 1.0, &mut [0.0; 8])
            .unwrap_err();
        assert_eq!(err.arg, "k_cache");
    }
}
