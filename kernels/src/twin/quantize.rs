//! Twin of `quantize.cu`: f32 activations to q8_1 blocks, one warp per block of 32 values.

use half::f16;

use super::{ShapeError, check_len, reduce::warp_sum};
use crate::blocks::{BlockQ8_1, QK};

/// Quantizes `x` (a multiple of 32 values) into `out` (`x.len() / 32` blocks).
///
/// Composition per block (lane `j` holds `x[j]`): `amax = max |x_j|` (exact in any order),
/// `sum = warp_sum(x_j)` (the butterfly of [`warp_sum`]), `d = amax / 127`,
/// `q_j = amax == 0 ? 0 : round(x_j / d)` with round-half-away-from-zero (`roundf`), then
/// `d` and `sum` are stored as f16 with round-to-nearest-even (`__float2half_rn`).
pub fn quantize_q8_1(x: &[f32], out: &mut [BlockQ8_1]) -> Result<(), ShapeError> {
    check_len(
        "quantize_q8_1",
        "x",
        x.len(),
        out.len() * QK,
        "out holds out.len() * 32 values",
    )?;
    for (xb, ob) in x.chunks_exact(QK).zip(out.iter_mut()) {
        *ob = quantize_block(xb.try_into().expect("chunks_exact yields 32 values"));
    }
    Ok(())
}

/// One q8_1 block; see [`quantize_q8_1`] for the composition.
#[inline(always)]
pub(crate) fn quantize_block(x: &[f32; QK]) -> BlockQ8_1 {
    let mut amax = 0.0f32;
    for &v in x {
        amax = amax.max(v.abs());
    }
    let mut lanes = *x;
    let sum = warp_sum(&mut lanes);
    let d = amax / 127.0;
    let mut qs = [0i8; QK];
    if amax != 0.0 {
        for (q, &v) in qs.iter_mut().zip(x) {
            *q = (v / d).round() as i8;
        }
    }
    BlockQ8_1 {
        d: f16::from_f32(d),
        s: f16::from_f32(sum),
        qs,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lcg_values(n: usize, seed: u32, scale: f32) -> Vec<f32> {
        let mut s = seed;
        (0..n)
            .map(|_| {
                s = s.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                ((s >> 8) as f32 / 16_777_216.0 * 2.0 - 1.0) * scale
            })
            .collect()
    }

    /// Dequantized values must lie within half a quantization step (plus the f16 rounding of
    /// d) of the input, and the extreme value must hit ±127.
    #[test]
    fn round_trip_within_half_step() {
        let x = lcg_values(32 * 64, 7, 3.5);
        let mut q = vec![
            BlockQ8_1 {
                d: f16::ZERO,
                s: f16::ZERO,
                qs: [0; 32]
            };
            64
        ];
        quantize_q8_1(&x, &mut q).unwrap();
        for (xb, qb) in x.chunks_exact(32).zip(&q) {
            let amax = xb.iter().fold(0.0f32, |a, v| a.max(v.abs()));
            let d_exact = amax / 127.0;
            let d = qb.d.to_f32();
            assert!((d - d_exact).abs() <= d_exact * 1e-3, "d {d} vs {d_exact}");
            assert!(qb.qs.iter().any(|&v| v == 127 || v == -127));
            for (&v, &qv) in xb.iter().zip(&qb.qs) {
                let err = (v - d_exact * qv as f32).abs();
                assert!(err <= 0.5 * d_exact * 1.0001, "value {v} q {qv} err {err}");
            }
            let sum: f32 = xb.iter().sum();
            assert!((qb.s.to_f32() - sum).abs() <= 1e-2 * (1.0 + sum.abs()));
        }
    }

    #[test]
    fn zero_block_quantizes_to_zero() {
        let mut q = [BlockQ8_1 {
            d: f16::ONE,
            s: f16::ONE,
            qs: [1; 32],
        }];
        quantize_q8_1(&[0.0; 32], &mut q).unwrap();
        assert_eq!(q[0].d, f16::ZERO);
        assert_eq!(q[0].s, f16::ZERO);
        assert_eq!(q[0].qs, [0; 32]);
    }

    #[test]
    fn rounds_half_away_from_zero() {
        // amax 127 gives d = 1 exactly, so x = ±2.5 sits on a rounding tie.
        let mut x = [0.0f32; 32];
        x[0] = 127.0;
        x[1] = 2.5;
        x[2] = -2.5;
        let mut q = [BlockQ8_1 {
            d: f16::ZERO,
            s: f16::ZERO,
            qs: [0; 32],
        }];
        quantize_q8_1(&x, &mut q).unwrap();
        assert_eq!(&q[0].qs[..3], &[127, 3, -3]);
    }

    #[test]
    fn length_mismatch_is_an_error() {
        let mut q = [BlockQ8_1 {
            d: f16::ZERO,
            s: f16::ZERO,
            qs: [0; 32],
        }; 2];
        let err = quantize_q8_1(&[0.0; 40], &mut q).unwrap_err();
        assert_eq!(err.arg, "x");
        assert_eq!(err.expected, 64);
    }
}
