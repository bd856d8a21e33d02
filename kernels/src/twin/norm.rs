//! Twins of `norm.cu`: RMS normalisation, and the fused RMS-norm + q8_1 quantization of the
//! single-sequence fused tier.

use super::{ShapeError, check_len, quantize::quantize_block, reduce::block_sum};
use crate::blocks::{BlockQ8_1, QK};

/// Threads per block of the norm kernels; the sum of squares is reduced in this shape.
pub const NORM_THREADS: usize = 256;

/// The RMS factor `r = 1 / sqrt(sum(x²) / n + eps)`.
///
/// Composition: thread `t` of [`NORM_THREADS`] accumulates `x[i] * x[i]` for
/// `i = t, t + 256, …` left to right starting from `0.0`; the block reduces the partials with
/// [`block_sum`](super::block_sum); then `mean = sum / n`, `r = 1.0 / sqrt(mean + eps)` with a
/// correctly rounded division and square root (NVRTC's defaults `-prec-div=true`,
/// `-prec-sqrt=true`; not `rsqrtf`).
pub fn rms_factor(x: &[f32], eps: f32) -> f32 {
    let mut partials = [0.0f32; NORM_THREADS];
    for chunk in x.chunks(NORM_THREADS) {
        for (p, &v) in partials.iter_mut().zip(chunk) {
            *p += v * v;
        }
    }
    let sum = block_sum(&partials);
    let mean = sum / x.len() as f32;
    1.0 / (mean + eps).sqrt()
}

/// `out[i] = (x[i] * r) * g[i]` with `r` from [`rms_factor`].
pub fn rmsnorm(x: &[f32], g: &[f32], eps: f32, out: &mut [f32]) -> Result<(), ShapeError> {
    check_len(
        "rmsnorm",
        "g",
        g.len(),
        x.len(),
        "g has one weight per element of x",
    )?;
    check_len(
        "rmsnorm",
        "out",
        out.len(),
        x.len(),
        "out has one value per element of x",
    )?;
    let r = rms_factor(x, eps);
    for ((o, &v), &w) in out.iter_mut().zip(x).zip(g) {
        *o = (v * r) * w;
    }
    Ok(())
}

/// The fused tier: quantizes `y[i] = x[i] * g[i]` to q8_1 (composition of
/// [`quantize_q8_1`](super::quantize_q8_1)) and returns `r` from [`rms_factor`] without
/// applying it; the consumer of the matvec output multiplies by `r` as a post-op.
pub fn rmsnorm_quantize_fused(
    x: &[f32],
    g: &[f32],
    eps: f32,
    out_q: &mut [BlockQ8_1],
) -> Result<f32, ShapeError> {
    let op = "rmsnorm_quantize_fused";
    check_len(
        op,
        "g",
        g.len(),
        x.len(),
        "g has one weight per element of x",
    )?;
    check_len(
        op,
        "x",
        x.len(),
        out_q.len() * QK,
        "out_q holds out_q.len() * 32 values",
    )?;
    let r = rms_factor(x, eps);
    for ((xb, gb), ob) in x
        .chunks_exact(QK)
        .zip(g.chunks_exact(QK))
        .zip(out_q.iter_mut())
    {
        let mut y = [0.0f32; QK];
        for ((yv, &xv), &gv) in y.iter_mut().zip(xb).zip(gb) {
            *yv = xv * gv;
        }
        *ob = quantize_block(&y);
    }
    Ok(r)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rmsnorm_matches_f64_reference() {
        let x: Vec<f32> = (0..576)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) / 7.0)
            .collect();
        let g: Vec<f32> = (0..576).map(|i| 0.5 + (i % 13) as f32 / 10.0).collect();
        let mut out = vec![0.0; 576];
        rmsnorm(&x, &g, 1e-5, &mut out).unwrap();
        let ms: f64 = x.iter().map(|&v| (v as f64) * (v as f64)).sum::<f64>() / 576.0;
        let r = 1.0 / (ms + 1e-5).sqrt();
        for i in 0..576 {
            let want = x[i] as f64 * r * g[i] as f64;
            assert!((out[i] as f64 - want).abs() <= 1e-5 * (1.0 + want.abs()));
        }
    }

    #[test]
    fn fused_quantizes_x_times_g_and_returns_r() {
        let x: Vec<f32> = (0..64).map(|i| (i as f32 - 31.5) / 3.0).collect();
        let g: Vec<f32> = (0..64).map(|i| 1.0 + i as f32 / 64.0).collect();
        let mut q = vec![
            BlockQ8_1 {
                d: half::f16::ZERO,
                s: half::f16::ZERO,
                qs: [0; 32]
            };
            2
        ];
        let r = rmsnorm_quantize_fused(&x, &g, 1e-6, &mut q).unwrap();
        assert_eq!(r.to_bits(), rms_factor(&x, 1e-6).to_bits());
        let y: Vec<f32> = x.iter().zip(&g).map(|(a, b)| a * b).collect();
        let mut q2 = q.clone();
        super::super::quantize_q8_1(&y, &mut q2).unwrap();
        assert_eq!(q, q2);
    }
}
