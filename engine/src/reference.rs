//! The host f32 oracle: the llama forward pass written to be obviously correct, against
//! which every backend and door is measured.
//!
//! Weights are dequantized to f32, activations stay f32, every dot product and every
//! reduction accumulates in f64, and the whole prompt runs at once with a causal mask (no KV
//! cache, no quantized activations, no fused tiers). It owns no fast path and shares no code
//! with the backends beyond the model types, so a bug in a backend cannot hide here.
//!
//! Three modes: [`Activations::F32`] (the model as trained), [`Activations::Q8_1`] (the
//! activations rounded through q8_1 where the engine quantizes them) and
//! [`forward_following`], the q8_1 mode that adopts a backend's side of a rounding only at
//! ties, read from the backend's activation trace (`reference/following.rs` owns the tie
//! windows; everything else it reports as a hard mismatch).
//!
//! What agreement to expect differs by weight type: float weights agree closely and in
//! every argmax in every door combination; quantized weights agree that closely only against
//! [`forward_following`], since without a trace one q8_1 rounding flip (an activation a few
//! ulps from a tie landing on the other side in f32 than in f64) moves a row a lot. The
//! measured bounds are in `docs/numerics.md` ("The oracle and q8_1 rounding ties").
//!
//! [`sampler`] is the sampling counterpart: temperature + top-p restated from its definition
//! in f64, sharing only the Philox stream with the engine's sampler.

use rayon::prelude::*;

mod exact;
mod following;
pub mod sampler;

pub use exact::forward_exact;

pub use following::{FollowReport, KEPT_MISMATCHES, QuantMismatch, R_WINDOW, TIE_WINDOW};

use crate::backend::trace::{ActivationTrace, Composition, Site};
use crate::model::{LlamaConfig, LlamaModel, Weight};
use crate::seq::SeqId;
use following::Follower;

/// Logits after every position of `tokens`: `[tokens.len(), n_vocab]`, row-major (row `i`
/// is the distribution of the token following position `i`).
///
/// Errors name the offending token when one is outside the vocabulary.
pub fn forward(model: &LlamaModel, tokens: &[u32]) -> Result<Vec<f32>, String> {
    forward_with(model, tokens, Activations::F32)
}

/// What the oracle feeds a matvec of quantized weights.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activations {
    /// The f32 activations themselves: the model as trained, the quantization of the
    /// activations counted as error.
    F32,
    /// The activations rounded through q8_1 first (per block of 32: `d = amax/127` stored
    /// as f16, `x ≈ d·round(x/d)`), exactly where the engine quantizes them: the model as the
    /// engine's quantized path defines it, so only composition differences remain.
    Q8_1,
}

/// [`forward`] with a choice of what quantized weights see.
pub fn forward_with(
    model: &LlamaModel,
    tokens: &[u32],
    acts: Activations,
) -> Result<Vec<f32>, String> {
    let mut quant = match acts {
        Activations::F32 => Quant::None,
        Activations::Q8_1 => Quant::Own,
    };
    walk(model, tokens, &mut quant)
}

/// What [`forward_following`] returns: the oracle's logits and what following the trace
/// found.
#[derive(Debug, Clone)]
pub struct Following {
    /// `[tokens.len(), n_vocab]`, as [`forward`].
    pub logits: Vec<f32>,
    pub report: FollowReport,
}

/// The q8_1 oracle following a backend's rounding only at ties: `tokens` are positions
/// `0..n` of sequence `seq` in `trace` (recorded with
/// [`crate::backend::Backend::start_trace`]).
///
/// Everything is computed by the oracle itself as in [`Activations::Q8_1`]; at each
/// quantization site its own `(d, s, q)` are compared with the backend's blocks. Identical
/// values continue; a value whose difference a rounding tie explains (a `q` one step away
/// with `x/d` within [`TIE_WINDOW`] of `k + ½`; see `reference/following.rs` for `d` and
/// `s`) takes the backend's side and counts as a tie followed; anything else is a hard
/// mismatch in the report, and the oracle continues with its own value. Where the backend
/// ran the fused tier (the trace says so per site and row) the oracle quantizes `x·g` and
/// applies its own norm factor after the matvec, as the engine does.
pub fn forward_following(
    model: &LlamaModel,
    tokens: &[u32],
    trace: &ActivationTrace,
    seq: SeqId,
) -> Result<Following, String> {
    let mut quant = Quant::Follow(Follower {
        trace,
        seq,
        report: FollowReport::default(),
    });
    let logits = walk(model, tokens, &mut quant)?;
    let Quant::Follow(f) = quant else {
        unreachable!("the mode is not changed by the walk")
    };
    Ok(Following {
        logits,
        report: f.report,
    })
}

/// How the oracle meets a quantization site.
enum Quant<'a> {
    /// No quantization ([`Activations::F32`]).
    None,
    /// Its own q8_1 blocks ([`Activations::Q8_1`]).
    Own,
    /// Its own blocks, following a trace at ties.
    Follow(Follower<'a>),
}

/// One site's activations for every row: the f32 values float weights read, the q8_1
/// parts quantized weights read (when quantizing), and each row's norm factor to apply
/// after the matvec (the fused tier's composition; `None` where the norm was applied first).
struct SiteActs {
    f: Vec<f32>,
    q: Option<Vec<(Vec<f64>, Vec<f64>)>>,
    r: Vec<Option<f64>>,
}

/// The oracle's forward pass under `quant`.
fn walk(model: &LlamaModel, tokens: &[u32], quant: &mut Quant) -> Result<Vec<f32>, String> {
    let c = &model.config;
    if let Some((i, &t)) = tokens
        .iter()
        .enumerate()
        .find(|&(_, &t)| t as usize >= c.n_vocab)
    {
        return Err(format!(
            "token {t} at position {i} is outside the vocabulary (n_vocab = {})",
            c.n_vocab
        ));
    }
    let n = tokens.len();
    let d = c.n_embd;

    // The residual stream, one row per position.
    let mut x = vec![0.0f32; n * d];
    for (row, &t) in x.chunks_exact_mut(d).zip(tokens) {
        model.token_embd.row_f32(t as usize, row);
    }

    for (li, layer) in model.layers.iter().enumerate() {
        let wants_q = [&layer.wq, &layer.wk, &layer.wv]
            .iter()
            .any(|w| w.data.is_quantized());
        let xn = normed_site(
            quant,
            &x,
            &layer.attn_norm,
            c.rms_eps,
            li,
            Site::AttnIn,
            wants_q,
        );
        let mut q = matmul(&layer.wq, &xn);
        let mut k = matmul(&layer.wk, &xn);
        let v = matmul(&layer.wv, &xn);
        for pos in 0..n {
            rope(&mut q[pos * c.q_dim()..(pos + 1) * c.q_dim()], pos, c);
            rope(&mut k[pos * c.kv_dim()..(pos + 1) * c.kv_dim()], pos, c);
        }
        let att = attention(&q, &k, &v, n, c);
        let att = plain_site(
            quant,
            att,
            n,
            li,
            Site::AttnOut,
            layer.wo.data.is_quantized(),
        );
        let o = matmul(&layer.wo, &att);
        add_into(&mut x, &o);

        let wants_q = layer.w_gate.data.is_quantized() || layer.w_up.data.is_quantized();
        let xn = normed_site(
            quant,
            &x,
            &layer.ffn_norm,
            c.rms_eps,
            li,
            Site::FfnIn,
            wants_q,
        );
        let gate = matmul(&layer.w_gate, &xn);
        let up = matmul(&layer.w_up, &xn);
        let h: Vec<f32> = gate
            .iter()
            .zip(&up)
            .map(|(&g, &u)| {
                let g = g as f64;
                (g / (1.0 + (-g).exp()) * u as f64) as f32
            })
            .collect();
        let h = plain_site(
            quant,
            h,
            n,
            li,
            Site::FfnDownIn,
            layer.w_down.data.is_quantized(),
        );
        let down = matmul(&layer.w_down, &h);
        add_into(&mut x, &down);
    }

    let head = model.head();
    let xn = normed_site(
        quant,
        &x,
        &model.output_norm,
        c.rms_eps,
        c.n_layer,
        Site::HeadIn,
        head.data.is_quantized(),
    );
    Ok(matmul(head, &xn))
}

/// A normed site: per row, `rmsnorm(x)·g` (separate composition), or, where the followed
/// backend ran the fused tier, `x·g` with the norm factor kept for after the matvec.
fn normed_site(
    quant: &mut Quant,
    x: &[f32],
    g: &[f32],
    eps: f32,
    layer: usize,
    site: Site,
    quantized: bool,
) -> SiteActs {
    let d = g.len();
    let mut f = vec![0.0f32; x.len()];
    let mut r = Vec::with_capacity(x.len() / d);
    for (pos, (row, o)) in x.chunks_exact(d).zip(f.chunks_exact_mut(d)).enumerate() {
        let ss: f64 = row.iter().map(|&v| v as f64 * v as f64).sum();
        let factor = 1.0 / (ss / d as f64 + eps as f64).sqrt();
        let fused = match quant {
            Quant::Follow(fl) => fl.composition(pos, layer, site) == Composition::Fused,
            _ => false,
        };
        if fused {
            if let Quant::Follow(fl) = quant {
                fl.check_r(pos, layer, site, factor);
            }
            // The product of two f32 values rounded once, as the fused kernel computes it.
            for ((o, &v), &g) in o.iter_mut().zip(row).zip(g) {
                *o = (v as f64 * g as f64) as f32;
            }
            r.push(Some(factor));
        } else {
            for ((o, &v), &g) in o.iter_mut().zip(row).zip(g) {
                *o = (v as f64 * factor * g as f64) as f32;
            }
            r.push(None);
        }
    }
    quantize_site(quant, f, r, layer, site, quantized)
}

/// A site without a norm: the attention output into `wo`, SwiGLU into `w_down`; `n` rows.
fn plain_site(
    quant: &mut Quant,
    x: Vec<f32>,
    n: usize,
    layer: usize,
    site: Site,
    quantized: bool,
) -> SiteActs {
    quantize_site(quant, x, vec![None; n], layer, site, quantized)
}

/// Adds the q8_1 parts of every row of a site when quantized weights read it and the mode
/// quantizes.
fn quantize_site(
    quant: &mut Quant,
    f: Vec<f32>,
    r: Vec<Option<f64>>,
    layer: usize,
    site: Site,
    quantized: bool,
) -> SiteActs {
    let width = f.len() / r.len().max(1);
    let q = match quant {
        _ if !quantized => None,
        Quant::None => None,
        Quant::Own => Some(
            f.chunks_exact(width)
                .map(|row| activation_parts(row, true))
                .collect(),
        ),
        Quant::Follow(fl) => Some(
            f.chunks_exact(width)
                .enumerate()
                .map(|(pos, row)| fl.quantize_row(row, pos, layer, site))
                .collect(),
        ),
    };
    SiteActs { f, q, r }
}

/// `y[t] = W · x[t]` for every row `t` of a site (`[n, cols]` → `[n, rows]`), f64
/// accumulation, each row's norm factor applied to the f64 sum where the site keeps one.
///
/// Each weight block is split into its scaled part `a_j` and its constant offset `c`
/// (q4_0: `d·n_j` and `-8·d`; q4_1: `d·n_j` and `m`; q8_0 and floats: `w_j` and 0), so a
/// block's product is `Σ a_j·x_j + c·Σ x_j`. When the site is quantized, a quantized
/// weight's activations are its q8_1 blocks: `x_j` becomes `d·q_j` and `Σ x_j` the block's
/// stored sum `s = d·Σq`, both as f16 — the meaning ggml's CPU build gives a q4/q8 × q8_1
/// product.
fn matmul(w: &Weight, x: &SiteActs) -> Vec<f32> {
    let (a, c) = weight_parts(w);
    let quantized = w.data.is_quantized();
    let nb = w.cols / 32;
    let n = x.f.len() / w.cols;
    let mut y = vec![0.0f32; n * w.rows];
    y.par_chunks_exact_mut(w.rows)
        .zip(x.f.par_chunks_exact(w.cols))
        .enumerate()
        .for_each(|(t, (yt, xt))| {
            let own;
            let (xv, sums) = match &x.q {
                Some(q) if quantized => (&q[t].0, &q[t].1),
                _ => {
                    own = activation_parts(xt, false);
                    (&own.0, &own.1)
                }
            };
            let factor = x.r[t].unwrap_or(1.0);
            for (r, out) in yt.iter_mut().enumerate() {
                let ar = &a[r * w.cols..(r + 1) * w.cols];
                let mut acc: f64 = ar.iter().zip(xv).map(|(&p, &q)| p * q).sum();
                if let Some(c) = &c {
                    acc += c[r * nb..(r + 1) * nb]
                        .iter()
                        .zip(sums)
                        .map(|(&p, &q)| p * q)
                        .sum::<f64>();
                }
                *out = (acc * factor) as f32;
            }
        });
    y
}

/// The scaled parts of every weight value and, for block types with an offset, each block's
/// offset (see [`matmul`]).
fn weight_parts(w: &Weight) -> (Vec<f64>, Option<Vec<f64>>) {
    use crate::model::WeightData;
    let mut a = Vec::with_capacity(w.rows * w.cols);
    let nibbles = |qs: &[u8; 16]| {
        let mut n = [0u8; 32];
        for j in 0..16 {
            n[j] = qs[j] & 0x0f;
            n[j + 16] = qs[j] >> 4;
        }
        n
    };
    match &w.data {
        WeightData::Q4_0(blocks) => {
            let mut c = Vec::with_capacity(blocks.len());
            for b in blocks {
                let d = b.d.to_f64();
                a.extend(nibbles(&b.qs).iter().map(|&n| d * n as f64));
                c.push(-8.0 * d);
            }
            (a, Some(c))
        }
        WeightData::Q4_1(blocks) => {
            let mut c = Vec::with_capacity(blocks.len());
            for b in blocks {
                let d = b.d.to_f64();
                a.extend(nibbles(&b.qs).iter().map(|&n| d * n as f64));
                c.push(b.m.to_f64());
            }
            (a, Some(c))
        }
        WeightData::Q8_0(blocks) => {
            for b in blocks {
                let d = b.d.to_f64();
                a.extend(b.qs.iter().map(|&q| d * q as f64));
            }
            (a, None)
        }
        _ => (w.to_f32().iter().map(|&v| v as f64).collect(), None),
    }
}

/// One activation row as the values a weight's scaled parts meet and the per-block sums its
/// offsets meet: the f32 values and their exact sums, or under `quantize` the row's q8_1
/// blocks (`d = amax/127`, `q_j = round(x_j/d)` half away from zero, `d` and `s = d·Σq_j`
/// stored as f16, `s` from the unrounded `d`).
fn activation_parts(x: &[f32], quantize: bool) -> (Vec<f64>, Vec<f64>) {
    let mut values = Vec::with_capacity(x.len());
    let mut sums = Vec::with_capacity(x.len() / 32);
    for block in x.chunks(32) {
        if quantize {
            let amax = block.iter().fold(0.0f32, |m, v| m.max(v.abs()));
            let d = amax / 127.0;
            let d16 = half::f16::from_f32(d).to_f64();
            let mut qsum = 0.0f64;
            for &v in block {
                let q = if amax == 0.0 {
                    0.0
                } else {
                    (v / d).round() as f64
                };
                qsum += q;
                values.push(d16 * q);
            }
            sums.push(half::f16::from_f64(qsum * (amax as f64 / 127.0)).to_f64());
        } else {
            values.extend(block.iter().map(|&v| v as f64));
            sums.push(block.iter().map(|&v| v as f64).sum());
        }
    }
    (values, sums)
}

/// The value type the oracles' shared steps (RoPE, attention, the residual add) store:
/// `f32` for the f32 oracle, `f64` for the exact model (`reference/exact.rs`). Each step
/// computes in f64 and stores through `from_f64`, so the f32 oracle rounds once per stored
/// value and the exact model not at all.
trait Real: Copy + Send + Sync + Default + std::ops::AddAssign {
    fn to_f64(self) -> f64;
    fn from_f64(v: f64) -> Self;
}

impl Real for f32 {
    fn to_f64(self) -> f64 {
        self as f64
    }
    fn from_f64(v: f64) -> f32 {
        v as f32
    }
}

impl Real for f64 {
    fn to_f64(self) -> f64 {
        self
    }
    fn from_f64(v: f64) -> f64 {
        v
    }
}

/// llama.cpp's "normal" RoPE for llama-arch GGUF: within each head, the adjacent pair
/// `(x[2i], x[2i+1])` is rotated by `pos · base^(-2i/head_dim)`.
fn rope<T: Real>(x: &mut [T], pos: usize, c: &LlamaConfig) {
    let hd = c.head_dim;
    for head in x.chunks_exact_mut(hd) {
        for i in 0..hd / 2 {
            let theta = pos as f64 * (c.rope_base as f64).powf(-2.0 * i as f64 / hd as f64);
            let (s, co) = theta.sin_cos();
            let (a, b) = (head[2 * i].to_f64(), head[2 * i + 1].to_f64());
            head[2 * i] = T::from_f64(a * co - b * s);
            head[2 * i + 1] = T::from_f64(a * s + b * co);
        }
    }
}

/// Causal grouped-query attention over all positions at once, with an exact softmax in
/// f64. Query head `h` reads KV head `h / (n_head / n_head_kv)`.
fn attention<T: Real>(q: &[T], k: &[T], v: &[T], n: usize, c: &LlamaConfig) -> Vec<T> {
    let hd = c.head_dim;
    let group = c.n_head / c.n_head_kv;
    let scale = 1.0 / (hd as f64).sqrt();
    let mut out = vec![T::default(); n * c.q_dim()];
    out.par_chunks_exact_mut(c.q_dim())
        .enumerate()
        .for_each(|(t, out_t)| {
            for h in 0..c.n_head {
                let kvh = h / group;
                let qh = &q[t * c.q_dim() + h * hd..][..hd];
                let scores: Vec<f64> = (0..=t)
                    .map(|j| {
                        let kj = &k[j * c.kv_dim() + kvh * hd..][..hd];
                        qh.iter()
                            .zip(kj)
                            .map(|(&a, &b)| a.to_f64() * b.to_f64())
                            .sum::<f64>()
                            * scale
                    })
                    .collect();
                let max = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let weights: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
                let total: f64 = weights.iter().sum();
                for e in 0..hd {
                    let acc: f64 = (0..=t)
                        .map(|j| weights[j] * v[j * c.kv_dim() + kvh * hd + e].to_f64())
                        .sum();
                    out_t[h * hd + e] = T::from_f64(acc / total);
                }
            }
        });
    out
}

/// `x += y` element by element, in `T`'s own arithmetic.
fn add_into<T: Real>(x: &mut [T], y: &[T]) {
    for (a, &b) in x.iter_mut().zip(y) {
        *a += b;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(head_dim: usize) -> LlamaConfig {
        LlamaConfig {
            n_layer: 0,
            n_embd: 32,
            n_ff: 32,
            n_head: 2,
            n_head_kv: 1,
            head_dim,
            rope_base: 10000.0,
            rms_eps: 1e-5,
            n_vocab: 4,
            n_ctx: 8,
        }
    }

    #[test]
    fn rope_rotates_adjacent_pairs_by_pos_times_frequency() {
        let c = cfg(4);
        let mut x = vec![1.0, 0.0, 1.0, 0.0];
        rope(&mut x, 3, &c);
        // Pair 0 turns by 3 rad, pair 1 by 3·10000^(-1/2) = 0.03 rad.
        assert!((x[0] - 3f32.cos()).abs() < 1e-6 && (x[1] - 3f32.sin()).abs() < 1e-6);
        assert!((x[2] - 0.03f32.cos()).abs() < 1e-6 && (x[3] - 0.03f32.sin()).abs() < 1e-6);
    }

    #[test]
    fn first_position_attends_only_to_itself_and_heads_share_their_kv_group() {
        let c = cfg(2);
        // Two positions, two query heads sharing one KV head of width 2.
        let q = vec![1.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.0, 1.0];
        let k = vec![1.0, 0.0, 0.0, 1.0];
        let v = vec![2.0, 3.0, 5.0, 7.0];
        let out = attention(&q, &k, &v, 2, &c);
        assert_eq!(&out[..4], &[2.0, 3.0, 2.0, 3.0]);
        // Position 1, head 0: scores (1, 0)/sqrt(2) → weights e^(1/√2), 1.
        let w = (1.0f64 / 2f64.sqrt()).exp();
        let expect = (w * 2.0 + 5.0) / (w + 1.0);
        assert!((out[4] as f64 - expect).abs() < 1e-6);
    }

    #[test]
    fn rmsnorm_scales_rows_to_unit_rms() {
        let x = vec![3.0, 4.0];
        let out = normed_site(
            &mut Quant::None,
            &x,
            &[1.0, 2.0],
            0.0,
            0,
            Site::AttnIn,
            false,
        )
        .f;
        let r = 1.0 / 12.5f64.sqrt();
        assert!((out[0] as f64 - 3.0 * r).abs() < 1e-6);
        assert!((out[1] as f64 - 8.0 * r).abs() < 1e-6);
    }
}
