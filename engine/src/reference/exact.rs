//! The exact model: the quantized-weight llama forward pass computed in float64 throughout,
//! with no activation quantization and no f32 rounding anywhere between the weights and the
//! logits.
//!
//! It is the oracle that cannot share the engine's rounding. Every weight block is
//! dequantized exactly (q4_0 `d·(q−8)`, q4_1 `d·q + m`, q8_0 `d·q`, f16 / bf16 / f32 widened:
//! each is exact in f64), the residual stream, the norms, RoPE, the softmax and the head stay
//! f64, and the logits come back as f64. What the engine's activations lose to q8_1 and to
//! f32 is therefore all counted as the engine's error; `gates::exact` holds the engine to
//! this model statistically (KL divergence, top-1 agreement, RMS of the logit difference),
//! the way llama.cpp's `perplexity --kl-divergence` holds a quantization to its base model.
//!
//! It owns its forward pass, its matmul and its norm; RoPE, attention and the residual add
//! are the f32 oracle's own steps (`reference.rs`), run in f64. It reads weights one row at
//! a time, so a 7B shape needs no f64 copy of the model.

use rayon::prelude::*;

use super::{add_into, attention, rope};
use crate::model::{LlamaModel, Weight, WeightData};

/// Logits after every position of `tokens` in float64: `[tokens.len(), n_vocab]`,
/// row-major (row `i` is the distribution of the token following position `i`).
///
/// Errors name the offending token when one is outside the vocabulary.
pub fn forward_exact(model: &LlamaModel, tokens: &[u32]) -> Result<Vec<f64>, String> {
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
    let mut x = Vec::with_capacity(n * d);
    for &t in tokens {
        x.extend(row_f64(&model.token_embd, t as usize));
    }
    for layer in &model.layers {
        let xn = rmsnorm(&x, &layer.attn_norm, c.rms_eps);
        let mut q = matmul(&layer.wq, &xn);
        let mut k = matmul(&layer.wk, &xn);
        let v = matmul(&layer.wv, &xn);
        for pos in 0..n {
            rope(&mut q[pos * c.q_dim()..(pos + 1) * c.q_dim()], pos, c);
            rope(&mut k[pos * c.kv_dim()..(pos + 1) * c.kv_dim()], pos, c);
        }
        let att = attention(&q, &k, &v, n, c);
        add_into(&mut x, &matmul(&layer.wo, &att));
        let xn = rmsnorm(&x, &layer.ffn_norm, c.rms_eps);
        let gate = matmul(&layer.w_gate, &xn);
        let up = matmul(&layer.w_up, &xn);
        let h: Vec<f64> = gate
            .iter()
            .zip(&up)
            .map(|(&g, &u)| g / (1.0 + (-g).exp()) * u)
            .collect();
        add_into(&mut x, &matmul(&layer.w_down, &h));
    }
    let xn = rmsnorm(&x, &model.output_norm, c.rms_eps);
    Ok(matmul(model.head(), &xn))
}

/// Row `r` of `w` in float64, every value exact.
fn row_f64(w: &Weight, r: usize) -> Vec<f64> {
    let nibbles = |qs: &[u8; 16]| {
        let mut n = [0u8; 32];
        for j in 0..16 {
            n[j] = qs[j] & 0x0f;
            n[j + 16] = qs[j] >> 4;
        }
        n
    };
    let nb = w.cols / 32;
    let mut out = Vec::with_capacity(w.cols);
    match &w.data {
        WeightData::Q4_0(blocks) => {
            for b in &blocks[r * nb..(r + 1) * nb] {
                let d = b.d.to_f64();
                out.extend(nibbles(&b.qs).iter().map(|&n| d * (n as f64 - 8.0)));
            }
        }
        WeightData::Q4_1(blocks) => {
            for b in &blocks[r * nb..(r + 1) * nb] {
                let (d, m) = (b.d.to_f64(), b.m.to_f64());
                out.extend(nibbles(&b.qs).iter().map(|&n| d * n as f64 + m));
            }
        }
        WeightData::Q8_0(blocks) => {
            for b in &blocks[r * nb..(r + 1) * nb] {
                let d = b.d.to_f64();
                out.extend(b.qs.iter().map(|&q| d * q as f64));
            }
        }
        WeightData::F32(v) => out.extend(v[r * w.cols..(r + 1) * w.cols].iter().map(|&x| x as f64)),
        WeightData::F16(v) => {
            out.extend(v[r * w.cols..(r + 1) * w.cols].iter().map(|x| x.to_f64()))
        }
        WeightData::BF16(v) => {
            out.extend(v[r * w.cols..(r + 1) * w.cols].iter().map(|x| x.to_f64()))
        }
    }
    out
}

/// `y[t] = W · x[t]` for every row `t` (`[n, cols]` → `[n, rows]`). Each weight row is
/// dequantized once and met by every position.
fn matmul(w: &Weight, x: &[f64]) -> Vec<f64> {
    let n = x.len() / w.cols;
    // Output rows in parallel, transposed back afterwards: [rows, n].
    let by_row: Vec<Vec<f64>> = (0..w.rows)
        .into_par_iter()
        .map(|r| {
            let wr = row_f64(w, r);
            x.chunks_exact(w.cols)
                .map(|xt| wr.iter().zip(xt).map(|(a, b)| a * b).sum())
                .collect()
        })
        .collect();
    let mut y = vec![0.0f64; n * w.rows];
    for (r, col) in by_row.iter().enumerate() {
        for (t, &v) in col.iter().enumerate() {
            y[t * w.rows + r] = v;
        }
    }
    y
}

/// `rmsnorm(x)·g` per row of `g.len()` values.
fn rmsnorm(x: &[f64], g: &[f32], eps: f32) -> Vec<f64> {
    let d = g.len();
    let mut out = Vec::with_capacity(x.len());
    for row in x.chunks_exact(d) {
        let ss: f64 = row.iter().map(|v| v * v).sum();
        let factor = 1.0 / (ss / d as f64 + eps as f64).sqrt();
        out.extend(row.iter().zip(g).map(|(&v, &g)| v * factor * g as f64));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use memra_kernels::blocks::BlockQ4_1;

    #[test]
    fn q4_1_rows_dequantize_exactly_as_d_times_q_plus_m() {
        let mut qs = [0u8; 16];
        qs[0] = 0x3f; // nibble 0 = 15, nibble 16 = 3
        let b = BlockQ4_1 {
            d: half::f16::from_f32(0.1),
            m: half::f16::from_f32(-0.7),
            qs,
        };
        let w = Weight::new("w", 1, 32, WeightData::Q4_1(vec![b])).unwrap();
        let row = row_f64(&w, 0);
        let (d, m) = (b.d.to_f64(), b.m.to_f64());
        assert_eq!(row[0], d * 15.0 + m);
        assert_eq!(row[16], d * 3.0 + m);
        assert_eq!(row[1], m);
    }

    #[test]
    fn matmul_keeps_f64_and_lays_out_positions_by_rows() {
        let w = Weight::new(
            "w",
            2,
            32,
            WeightData::F32((0..64).map(|i| i as f32).collect()),
        )
        .unwrap();
        let mut x = vec![0.0f64; 64];
        x[0] = 1.0 + 1e-12; // a value f32 cannot hold
        x[32 + 1] = 1.0;
        let y = matmul(&w, &x);
        assert_eq!(y, vec![0.0, 32.0 * (1.0 + 1e-12), 1.0, 33.0]);
    }
}
