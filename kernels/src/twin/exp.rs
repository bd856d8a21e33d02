//! The one `exp` of the model's arithmetic, written identically here and in `common.cuh`
//! (`exp_mirrored`): attention's softmax and its split-K combine, SwiGLU's SiLU and the
//! sampler all call it on both sides, so the CPU backend and the CUDA backend compute the
//! same bits where `expf` and a host libm's `exp` would differ by an ulp.
//!
//! The composition (kernels compile with `--fmad=false`, and Rust never contracts):
//! 1. NaN returns itself; `x < -103.98` gives 0, `x > 88.72` gives infinity (the true value
//!    overflows from 88.7228 on).
//! 2. `k = round(x · log2(e))` (half away from zero on both sides: `roundf`, `f32::round`).
//! 3. `r = (x − k·ln2_hi) − k·ln2_lo`, Cody–Waite: `ln2_hi` has nine trailing zero bits, so
//!    `k·ln2_hi` is exact for every `|k| ≤ 150`; `|r| ≤ 0.35`.
//! 4. `p = exp(r)` by the degree-7 Taylor polynomial in Horner form, one multiply and one add
//!    per step, coefficients `1/7!, 1/6!, 1/5!, 1/4!, 1/3!, 1/2, 1, 1` as f32 (truncation below
//!    1e-8 relative on `|r| ≤ 0.35`).
//! 5. `p · 2^k` by a multiply with the power of two built from its exponent bits, in two steps
//!    below `2^-126` (so a subnormal result rounds the same way on both sides) and at `k = 128`
//!    (`2^128` is not a float; `x` in `(88.03, 88.72]` gets there).
//!
//! Accuracy: `cargo bench -p memra-kernels --bench exp` measures it against the correctly
//! rounded value (f64 `exp` rounded once to f32) over every f32 in the domain; the figures are
//! in docs/numerics.md.

use super::round::round_half_away;

/// `exp(x)` by the composition of the module documentation; `common.cuh`'s `exp_mirrored`
/// performs exactly these operations.
pub fn exp_mirrored(x: f32) -> f32 {
    // The constants as bit patterns, the same ones `common.cuh` spells out.
    const LO: u32 = 0xc2cf_f5c3; // -103.98
    const HI: u32 = 0x42b1_70a4; // 88.72
    const LOG2E: u32 = 0x3fb8_aa3b;
    const LN2_HI: u32 = 0x3f31_7200; // 9 trailing zero bits: k * LN2_HI is exact
    const LN2_LO: u32 = 0x35bf_be8e;
    const C: [u32; 5] = [
        0x3950_0d01,
        0x3ab6_0b61,
        0x3c08_8889,
        0x3d2a_aaab,
        0x3e2a_aaab,
    ];
    let f = f32::from_bits;
    if x.is_nan() {
        return x;
    }
    if x < f(LO) {
        return 0.0;
    }
    if x > f(HI) {
        return f32::INFINITY;
    }
    let k = round_half_away(x * f(LOG2E));
    let r = (x - k * f(LN2_HI)) - k * f(LN2_LO);
    // 1/7!, 1/6!, 1/5!, 1/4!, 1/3!, then 1/2, 1, 1.
    let mut p = f(C[0]);
    for c in &C[1..] {
        p = p * r + f(*c);
    }
    p = p * r + 0.5;
    p = p * r + 1.0;
    p = p * r + 1.0;
    let ki = k as i32;
    if ki > 127 {
        // 2^128 is not a float: x in (88.03, 88.72] rounds to k = 128.
        (p * f(((ki + 127 - 64) as u32) << 23)) * f((127 + 64) << 23)
    } else if ki >= -126 {
        p * f(((ki + 127) as u32) << 23)
    } else {
        (p * f(((ki + 127 + 64) as u32) << 23)) * f((127 - 64) << 23)
    }
}

#[cfg(test)]
mod tests {
    /// The distance in ulps between two finite floats of one sign.
    fn ulps(a: f32, b: f32) -> u32 {
        a.to_bits().abs_diff(b.to_bits())
    }

    #[test]
    fn exp_mirrored_is_within_one_ulp_of_the_correctly_rounded_exp() {
        let mut worst = 0u32;
        let mut x = -103.0f32;
        while x <= 88.72 {
            let got = super::exp_mirrored(x);
            let want = (x as f64).exp() as f32;
            if want.is_normal() {
                worst = worst.max(ulps(got, want));
            }
            x += 0.000_731;
        }
        assert!(worst <= 1, "{worst} ulp");
        // The top of the range, where k = 128 and 2^k needs two steps.
        for x in [88.03f32, 88.3, 88.5, 88.72] {
            let got = super::exp_mirrored(x);
            assert!(got.is_finite(), "exp({x}) = {got}");
            assert!(ulps(got, (x as f64).exp() as f32) <= 1, "exp({x}) = {got}");
        }
    }

    #[test]
    fn exp_mirrored_edges() {
        assert_eq!(super::exp_mirrored(0.0), 1.0);
        assert_eq!(super::exp_mirrored(-0.0), 1.0);
        assert_eq!(super::exp_mirrored(f32::NEG_INFINITY), 0.0);
        assert_eq!(super::exp_mirrored(-200.0), 0.0);
        assert!(
            super::exp_mirrored(-100.0) > 0.0,
            "subnormal results are kept"
        );
        assert!(super::exp_mirrored(f32::NAN).is_nan());
        assert_eq!(super::exp_mirrored(100.0), f32::INFINITY);
        assert_eq!(super::exp_mirrored(f32::INFINITY), f32::INFINITY);
    }
}
