//! Rounding half away from zero (C's `roundf`, Rust's `f32::round`, CUDA's `roundf`) in
//! plain float and integer operations, so the loops that call it (q8_1 quantization, the
//! range reduction of [`exp_mirrored`](super::exp_mirrored)) stay inline and vectorize on a
//! host where `f32::round` is a libm call. The results are those of `f32::round`, bit for
//! bit, signed zeros included.

/// `x` rounded to the nearest integer, halves away from zero: `f32::round(x)` for every `x`.
///
/// Below `2^23` in magnitude, `t = trunc(x)` is exact as an `i32` and so is the fraction
/// `x - t` (the two share sign and exponent range), so comparing the fraction with ±0.5
/// decides the step with no rounding of its own. From `2^23` on every float is an integer;
/// infinities and NaN are returned as they are.
#[inline(always)]
pub(crate) fn round_half_away(x: f32) -> f32 {
    if x.is_nan() || x.abs() >= 8_388_608.0 {
        return x;
    }
    let t = x as i32;
    let frac = x - t as f32;
    let r = t + i32::from(frac >= 0.5) - i32::from(frac <= -0.5);
    (r as f32).copysign(x)
}

/// `f32::round(x) as i8` (saturating, NaN to 0) without a libm call: `x` clamped to the i8
/// range first (rounding and clamping to integer bounds commute; NaN stays NaN and casts to
/// 0), then [`round_half_away`].
#[inline(always)]
pub(crate) fn round_to_i8(x: f32) -> i8 {
    round_half_away(x.clamp(-128.0, 127.0)) as i8
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every tie and its neighbours a few ulps either side, over the integers a quant or an
    /// exp exponent reaches and beyond, then values of every exponent from bit patterns.
    fn probes() -> Vec<f32> {
        let mut v = vec![
            0.0,
            -0.0,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            f32::MIN_POSITIVE,
            -f32::MIN_POSITIVE,
            f32::MAX,
            f32::MIN,
            8_388_607.5,
            -8_388_607.5,
            8_388_608.0,
            16_777_217.0,
            0.499_999_97,
            -0.499_999_97,
        ];
        for n in -300i32..=300 {
            for base in [n as f32, n as f32 + 0.5] {
                let bits = base.to_bits();
                for k in 0..4u32 {
                    v.push(f32::from_bits(bits.wrapping_add(k)));
                    v.push(f32::from_bits(bits.wrapping_sub(k)));
                }
            }
        }
        let mut s = 0x9e37_79b9u32;
        for _ in 0..1_000_000 {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            v.push(f32::from_bits(s));
        }
        v
    }

    #[test]
    fn round_half_away_is_f32_round_bit_for_bit() {
        for x in probes() {
            let (got, want) = (round_half_away(x), x.round());
            assert!(
                got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan()),
                "{x:e} ({:#010x}): {got:e} vs {want:e}",
                x.to_bits()
            );
        }
    }

    #[test]
    fn round_to_i8_is_the_saturating_cast_of_f32_round() {
        for x in probes() {
            assert_eq!(round_to_i8(x), x.round() as i8, "{x:e}");
        }
    }
}
