//! Twin of `quantize.cu`: f32 activations to q8_1 blocks, one warp per block of 32 values.

use half::f16;

use super::{ShapeError, check_len, round::round_to_i8};
use crate::blocks::{BlockQ8_1, QK};

/// Quantizes `x` (a multiple of 32 values) into `out` (`x.len() / 32` blocks).
///
/// Composition per block (lane `j` holds `x[j]`): `amax = max |x_j|` (exact in any order),
/// `d = amax / 127`, `q_j = amax == 0 ? 0 : round(x_j / d)` with round-half-away-from-zero
/// (`roundf`), and the block sum `s = d·Σq` as ggml's `quantize_row_q8_1_ref` stores it: the
/// 32 quants summed exactly in i32, converted to f32 (exact, `|Σq| ≤ 32·127`), times the f32
/// `d` (before its f16 rounding) in one f32 multiply. `d` and `s` are then stored as f16 with
/// round-to-nearest-even (`cvt.rn.f16.f32`). `s` is the sum of the rounded values, not of
/// the activations, so a Q4_1 block's offset `m` meets the same values its scaled part does
/// (docs/numerics.md, "The q8_1 block sum").
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
    let d = amax / 127.0;
    let mut qs = [0i8; QK];
    if amax != 0.0 {
        for (q, &v) in qs.iter_mut().zip(x) {
            *q = round_to_i8(v / d);
        }
    }
    let qsum: i32 = qs.iter().map(|&q| i32::from(q)).sum();
    BlockQ8_1 {
        d: f16::from_f32(d),
        s: f16::from_f32(qsum as f32 * d),
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
            // s is the rounded values' sum, within half a step per value of the float sum.
            let qsum: i32 = qb.qs.iter().map(|&q| i32::from(q)).sum();
            assert_eq!(qb.s, f16::from_f32(qsum as f32 * d_exact));
            let sum: f32 = xb.iter().sum();
            assert!((qb.s.to_f32() - sum).abs() <= 16.0 * d_exact + 1e-3 * (1.0 + sum.abs()));
        }
    }

    fn one_block(x: &[f32; 32]) -> BlockQ8_1 {
        let mut q = [BlockQ8_1 {
            d: f16::ZERO,
            s: f16::ZERO,
            qs: [0; 32],
        }];
        quantize_q8_1(x, &mut q).unwrap();
        q[0]
    }

    /// The block sum is f16(d·Σq) with the f32 d: on this block it differs both from the
    /// float sum's f16 and from the product with the f16-rounded d.
    #[test]
    fn block_sum_is_d_times_the_quant_sum() {
        // amax 1 gives d = f32(1/127); 0.244/d = 30.99 rounds to 31, so Σq = 127 + 31·31.
        let mut x = [0.244f32; 32];
        x[0] = 1.0;
        let b = one_block(&x);
        assert_eq!(b.qs[0], 127);
        assert!(b.qs[1..].iter().all(|&q| q == 31));
        let d = 1.0f32 / 127.0;
        assert_eq!(b.s, f16::from_f32(1088.0 * d));
        assert_eq!(b.s.to_f32(), 8.570_312_5);
        let float_sum: f32 = x.iter().sum();
        assert_eq!(
            f16::from_f32(float_sum).to_f32(),
            8.5625,
            "the old rule's value"
        );
        assert_eq!(
            f16::from_f32(1088.0 * f16::from_f32(d).to_f32()).to_f32(),
            8.5625,
            "the f16-rounded d's value"
        );
    }

    /// Values that round to zero drop out of the sum: a block whose quants cancel has s = 0
    /// however far its float sum is from zero, and a negative sum keeps its sign.
    #[test]
    fn block_sum_counts_rounded_values_only() {
        let mut x = [0.003f32; 32];
        x[0] = 1.0;
        x[1] = -1.0;
        let b = one_block(&x);
        assert_eq!(b.qs[2..], [0; 30]);
        assert_eq!(b.s, f16::ZERO);
        assert!(x.iter().sum::<f32>() > 0.08);

        let mut neg = x.map(|v| -v);
        neg[2] = -0.5; // q = round(-63.5) = -64
        let b = one_block(&neg);
        assert_eq!(b.qs[2], -64);
        assert_eq!(b.s, f16::from_f32(-64.0 * (1.0f32 / 127.0)));
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
