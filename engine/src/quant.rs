//! Host conversion of weight tensors between f32 and the stored ggml types: ggml's reference
//! quantizers (`quantize_row_q4_0_ref`, `quantize_row_q4_1_ref`, `quantize_row_q8_0_ref`),
//! the matching dequantizers, and ggml's f32 ↔ f16/bf16 rounding.
//!
//! This module owns *weight* formats only. The q8_1 quantization of activations is a kernel
//! with a host twin in `memra_kernels::twin`; it is not repeated here.

use half::{bf16, f16};
use memra_kernels::blocks::{BlockQ4_0, BlockQ4_1, BlockQ8_0, QK};
use thiserror::Error;

use crate::ggml_type::GgmlType;

#[cfg(target_endian = "big")]
compile_error!(
    "memra reads GGUF's little-endian tensor data in place; big-endian hosts are not supported"
);

/// A conversion called with buffers that do not fit the type.
#[derive(Debug, Error, PartialEq)]
pub enum QuantError {
    #[error("{ty}: {n} elements is not a whole number of {block}-element blocks")]
    PartialBlock {
        ty: GgmlType,
        n: usize,
        block: usize,
    },
    #[error("{ty}: {bytes} bytes hold {expect_elems} elements but the output has room for {out}")]
    LengthMismatch {
        ty: GgmlType,
        bytes: usize,
        expect_elems: usize,
        out: usize,
    },
    #[error("{ty}: {bytes} bytes is not a whole number of {block_bytes}-byte blocks")]
    RaggedBytes {
        ty: GgmlType,
        bytes: usize,
        block_bytes: usize,
    },
}

/// ggml's `GGML_FP32_TO_BF16`: round to nearest even, NaN kept quiet (not rounded to inf).
pub fn f32_to_bf16(x: f32) -> bf16 {
    let u = x.to_bits();
    if (u & 0x7fff_ffff) > 0x7f80_0000 {
        return bf16::from_bits(((u >> 16) | 64) as u16);
    }
    bf16::from_bits((u.wrapping_add(0x7fff + ((u >> 16) & 1)) >> 16) as u16)
}

/// ggml's `GGML_BF16_TO_FP32`: exact.
pub fn bf16_to_f32(x: bf16) -> f32 {
    f32::from_bits(u32::from(x.to_bits()) << 16)
}

/// ggml's `GGML_FP32_TO_FP16` (IEEE round to nearest even, as F16C does).
pub fn f32_to_f16(x: f32) -> f16 {
    f16::from_f32(x)
}

/// ggml's `GGML_FP16_TO_FP32`: exact.
pub fn f16_to_f32(x: f16) -> f32 {
    x.to_f32()
}

/// `quantize_row_q4_0_ref`: per block, the element of largest magnitude maps to -8.
pub fn quantize_block_q4_0(x: &[f32; QK]) -> BlockQ4_0 {
    let mut amax = 0.0f32;
    let mut max = 0.0f32;
    for &v in x {
        if amax < v.abs() {
            amax = v.abs();
            max = v;
        }
    }
    let d = max / -8.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let mut qs = [0u8; QK / 2];
    for (j, q) in qs.iter_mut().enumerate() {
        let x0 = x[j] * id;
        let x1 = x[QK / 2 + j] * id;
        // C's `(int8_t)(x + 8.5f)` truncates toward zero; `as i8` does too (and saturates
        // instead of being undefined outside the range, which cannot happen here).
        let xi0 = ((x0 + 8.5) as i8).min(15) as u8;
        let xi1 = ((x1 + 8.5) as i8).min(15) as u8;
        *q = xi0 | (xi1 << 4);
    }
    BlockQ4_0 {
        d: f32_to_f16(d),
        qs,
    }
}

/// `quantize_row_q4_1_ref`: per block, min maps to 0 and max to 15.
pub fn quantize_block_q4_1(x: &[f32; QK]) -> BlockQ4_1 {
    let mut min = f32::MAX;
    let mut max = -f32::MAX;
    for &v in x {
        if v < min {
            min = v;
        }
        if v > max {
            max = v;
        }
    }
    let d = (max - min) / 15.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let mut qs = [0u8; QK / 2];
    for (j, q) in qs.iter_mut().enumerate() {
        let x0 = (x[j] - min) * id;
        let x1 = (x[QK / 2 + j] - min) * id;
        let xi0 = ((x0 + 0.5) as i8).min(15) as u8;
        let xi1 = ((x1 + 0.5) as i8).min(15) as u8;
        *q = xi0 | (xi1 << 4);
    }
    BlockQ4_1 {
        d: f32_to_f16(d),
        m: f32_to_f16(min),
        qs,
    }
}

/// `quantize_row_q8_0_ref`: symmetric, largest magnitude maps to ±127, `roundf` rounding.
pub fn quantize_block_q8_0(x: &[f32; QK]) -> BlockQ8_0 {
    let amax = x.iter().fold(0.0f32, |a, v| a.max(v.abs()));
    let d = amax / 127.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let mut qs = [0i8; QK];
    for (q, &v) in qs.iter_mut().zip(x) {
        // Rust's `round` is C's `roundf` (half away from zero).
        *q = (v * id).round() as i8;
    }
    BlockQ8_0 {
        d: f32_to_f16(d),
        qs,
    }
}

/// `dequantize_row_q4_0` for one block.
pub fn dequantize_block_q4_0(b: &BlockQ4_0, y: &mut [f32]) {
    let d = f16_to_f32(b.d);
    for j in 0..QK / 2 {
        y[j] = ((b.qs[j] & 0x0f) as i32 - 8) as f32 * d;
        y[j + QK / 2] = ((b.qs[j] >> 4) as i32 - 8) as f32 * d;
    }
}

/// `dequantize_row_q4_1` for one block.
pub fn dequantize_block_q4_1(b: &BlockQ4_1, y: &mut [f32]) {
    let d = f16_to_f32(b.d);
    let m = f16_to_f32(b.m);
    for j in 0..QK / 2 {
        y[j] = (b.qs[j] & 0x0f) as f32 * d + m;
        y[j + QK / 2] = (b.qs[j] >> 4) as f32 * d + m;
    }
}

/// `dequantize_row_q8_0` for one block.
pub fn dequantize_block_q8_0(b: &BlockQ8_0, y: &mut [f32]) {
    let d = f16_to_f32(b.d);
    for (o, &q) in y.iter_mut().zip(&b.qs) {
        *o = q as f32 * d;
    }
}

/// A plain-data element of a stored tensor: every bit pattern is a valid value and the type
/// has no padding, so a byte slice of the right length and alignment can be viewed as `[Self]`.
///
/// # Safety
/// Implementors must be `#[repr(C)]` (or primitive) with no padding and no invalid bit
/// patterns.
pub unsafe trait PlainData: Copy + 'static {}
// SAFETY: primitive floats and f16/bf16 accept every bit pattern and have no padding.
unsafe impl PlainData for f32 {}
// SAFETY: as above.
unsafe impl PlainData for f16 {}
// SAFETY: as above.
unsafe impl PlainData for bf16 {}
// SAFETY: repr(C) of an f16 and a [u8; 16] (18 bytes, align 2, no padding; asserted in blocks).
unsafe impl PlainData for BlockQ4_0 {}
// SAFETY: repr(C) of two f16 and a [u8; 16] (20 bytes, no padding).
unsafe impl PlainData for BlockQ4_1 {}
// SAFETY: repr(C) of an f16 and an [i8; 32] (34 bytes, no padding).
unsafe impl PlainData for BlockQ8_0 {}

/// Views `bytes` as a slice of `T` without copying, or `None` when the length is not a whole
/// number of `T`s or the address is not aligned for `T`.
pub fn cast_slice<T: PlainData>(bytes: &[u8]) -> Option<&[T]> {
    let size = size_of::<T>();
    if !bytes.len().is_multiple_of(size)
        || !(bytes.as_ptr() as usize).is_multiple_of(align_of::<T>())
    {
        return None;
    }
    // SAFETY: length and alignment are checked above, T accepts every bit pattern
    // (PlainData), and the returned slice borrows `bytes` so it cannot outlive the data.
    Some(unsafe { std::slice::from_raw_parts(bytes.as_ptr().cast::<T>(), bytes.len() / size) })
}

/// Views a slice of `T` as its bytes.
pub fn as_bytes<T: PlainData>(items: &[T]) -> &[u8] {
    // SAFETY: T has no padding (PlainData), so every byte of the slice is initialized; u8 has
    // alignment 1 and the length is the exact byte size of the slice.
    unsafe { std::slice::from_raw_parts(items.as_ptr().cast::<u8>(), std::mem::size_of_val(items)) }
}

fn read_f16(b: &[u8]) -> f16 {
    f16::from_bits(u16::from_le_bytes([b[0], b[1]]))
}

/// Dequantizes `bytes` of type `ty` into `out`, which must hold exactly the elements stored.
///
/// The bytes are decoded field by field, so any alignment of `bytes` works (an mmap'd tensor
/// or a fuzzed buffer alike).
pub fn dequantize(ty: GgmlType, bytes: &[u8], out: &mut [f32]) -> Result<(), QuantError> {
    let bb = ty.block_bytes();
    if !bytes.len().is_multiple_of(bb) {
        return Err(QuantError::RaggedBytes {
            ty,
            bytes: bytes.len(),
            block_bytes: bb,
        });
    }
    let n = bytes.len() / bb * ty.block_len();
    if n != out.len() {
        return Err(QuantError::LengthMismatch {
            ty,
            bytes: bytes.len(),
            expect_elems: n,
            out: out.len(),
        });
    }
    match ty {
        GgmlType::F32 => {
            for (o, c) in out.iter_mut().zip(bytes.chunks_exact(4)) {
                *o = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            }
        }
        GgmlType::F16 => {
            for (o, c) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                *o = f16_to_f32(read_f16(c));
            }
        }
        GgmlType::BF16 => {
            for (o, c) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                *o = bf16_to_f32(bf16::from_bits(u16::from_le_bytes([c[0], c[1]])));
            }
        }
        GgmlType::Q4_0 => {
            for (y, c) in out.chunks_exact_mut(QK).zip(bytes.chunks_exact(bb)) {
                let mut qs = [0u8; QK / 2];
                qs.copy_from_slice(&c[2..]);
                dequantize_block_q4_0(&BlockQ4_0 { d: read_f16(c), qs }, y);
            }
        }
        GgmlType::Q4_1 => {
            for (y, c) in out.chunks_exact_mut(QK).zip(bytes.chunks_exact(bb)) {
                let mut qs = [0u8; QK / 2];
                qs.copy_from_slice(&c[4..]);
                let b = BlockQ4_1 {
                    d: read_f16(c),
                    m: read_f16(&c[2..]),
                    qs,
                };
                dequantize_block_q4_1(&b, y);
            }
        }
        GgmlType::Q8_0 => {
            for (y, c) in out.chunks_exact_mut(QK).zip(bytes.chunks_exact(bb)) {
                let mut qs = [0i8; QK];
                for (q, &byte) in qs.iter_mut().zip(&c[2..]) {
                    *q = byte as i8;
                }
                dequantize_block_q8_0(&BlockQ8_0 { d: read_f16(c), qs }, y);
            }
        }
    }
    Ok(())
}

/// Dequantizes `bytes` of type `ty` into a new vector.
pub fn dequantize_to_vec(ty: GgmlType, bytes: &[u8]) -> Result<Vec<f32>, QuantError> {
    let bb = ty.block_bytes();
    let mut out = vec![0.0f32; bytes.len() / bb * ty.block_len()];
    dequantize(ty, bytes, &mut out)?;
    Ok(out)
}

/// Converts `src` to type `ty` with ggml's reference rounding and appends the bytes to `out`.
pub fn quantize(ty: GgmlType, src: &[f32], out: &mut Vec<u8>) -> Result<(), QuantError> {
    let bl = ty.block_len();
    if !src.len().is_multiple_of(bl) {
        return Err(QuantError::PartialBlock {
            ty,
            n: src.len(),
            block: bl,
        });
    }
    out.reserve(src.len() / bl * ty.block_bytes());
    match ty {
        GgmlType::F32 => src
            .iter()
            .for_each(|v| out.extend_from_slice(&v.to_le_bytes())),
        GgmlType::F16 => src
            .iter()
            .for_each(|v| out.extend_from_slice(&f32_to_f16(*v).to_bits().to_le_bytes())),
        GgmlType::BF16 => src
            .iter()
            .for_each(|v| out.extend_from_slice(&f32_to_bf16(*v).to_bits().to_le_bytes())),
        GgmlType::Q4_0 => {
            for x in src.as_chunks::<QK>().0 {
                out.extend_from_slice(as_bytes(&[quantize_block_q4_0(x)]));
            }
        }
        GgmlType::Q4_1 => {
            for x in src.as_chunks::<QK>().0 {
                out.extend_from_slice(as_bytes(&[quantize_block_q4_1(x)]));
            }
        }
        GgmlType::Q8_0 => {
            for x in src.as_chunks::<QK>().0 {
                out.extend_from_slice(as_bytes(&[quantize_block_q8_0(x)]));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ramp(seed: u32) -> [f32; QK] {
        std::array::from_fn(|i| ((i as f32 * 0.37 + seed as f32).sin()) * 0.05)
    }

    #[test]
    fn q4_0_matches_hand_computed_block() {
        // Largest magnitude is -1.0, so d = -1/-8 = 0.125 and x/d + 8.5 truncates to the
        // nibble; -1.0 → 0, 0.0 → 8, 0.5 → 12, 0.875 → 15.
        let mut x = [0.0f32; QK];
        x[0] = -1.0;
        x[1] = 0.5;
        x[16] = 0.875;
        let b = quantize_block_q4_0(&x);
        assert_eq!(b.d.to_f32(), 0.125);
        assert_eq!(b.qs[0], 15 << 4, "element 0 → 0, element 16 → 15");
        assert_eq!(b.qs[1], 12 | (8 << 4));
        let mut y = [0.0f32; QK];
        dequantize_block_q4_0(&b, &mut y);
        assert_eq!((y[0], y[1], y[16], y[2]), (-1.0, 0.5, 0.875, 0.0));
    }

    #[test]
    fn q4_1_maps_min_and_max_exactly_when_representable() {
        let x: [f32; QK] = std::array::from_fn(|i| (i % 16) as f32 * 0.5 - 2.0);
        let b = quantize_block_q4_1(&x);
        assert_eq!((b.d.to_f32(), b.m.to_f32()), (0.5, -2.0));
        let mut y = [0.0f32; QK];
        dequantize_block_q4_1(&b, &mut y);
        assert_eq!(y, x);
    }

    #[test]
    fn q8_0_rounds_half_away_from_zero() {
        let mut x = [0.0f32; QK];
        x[0] = 127.0;
        x[1] = 2.5;
        x[2] = -2.5;
        x[3] = 1.49;
        let b = quantize_block_q8_0(&x);
        assert_eq!(b.d.to_f32(), 1.0);
        assert_eq!(&b.qs[..4], &[127, 3, -3, 1]);
    }

    #[test]
    fn round_trip_error_is_within_half_a_step() {
        for (ty, rel) in [
            (GgmlType::Q4_0, 1.0 / 8.0),
            (GgmlType::Q4_1, 1.0 / 15.0),
            (GgmlType::Q8_0, 1.0 / 127.0),
        ] {
            let x: Vec<f32> = (0..8).flat_map(ramp).collect();
            let mut bytes = Vec::new();
            quantize(ty, &x, &mut bytes).unwrap();
            assert_eq!(bytes.len(), 8 * ty.block_bytes());
            let y = dequantize_to_vec(ty, &bytes).unwrap();
            for (a, b) in x.iter().zip(&y) {
                // Half a quantization step of a 0.1-wide range, plus f16 scale rounding.
                assert!((a - b).abs() <= 0.1 * rel * 0.5 + 1e-4, "{ty}: {a} vs {b}");
            }
        }
    }

    #[test]
    fn bf16_rounding_matches_ggml() {
        // 1 + 2^-8 is exactly halfway between two bf16 values: ties go to the even one (1.0);
        // 1 + 3·2^-8 ties up to 1 + 2^-6.
        assert_eq!(bf16_to_f32(f32_to_bf16(1.0 + 1.0 / 256.0)), 1.0);
        assert_eq!(
            bf16_to_f32(f32_to_bf16(1.0 + 3.0 / 256.0)),
            1.0 + 1.0 / 64.0
        );
        assert!(bf16_to_f32(f32_to_bf16(f32::NAN)).is_nan());
        assert_eq!(f32_to_bf16(f32::INFINITY).to_bits(), 0x7f80);
    }

    #[test]
    fn float_types_round_trip() {
        let x = [0.5f32, -1.25, 3.0e-3, 65504.0];
        for ty in [GgmlType::F32, GgmlType::F16] {
            let mut bytes = Vec::new();
            quantize(ty, &x, &mut bytes).unwrap();
            assert_eq!(dequantize_to_vec(ty, &bytes).unwrap()[..2], x[..2]);
        }
        let mut bytes = Vec::new();
        quantize(GgmlType::BF16, &x[..2], &mut bytes).unwrap();
        assert_eq!(dequantize_to_vec(GgmlType::BF16, &bytes).unwrap(), &x[..2]);
    }

    #[test]
    fn bad_lengths_are_errors() {
        let mut out = Vec::new();
        assert!(matches!(
            quantize(GgmlType::Q4_1, &[0.0; 33], &mut out),
            Err(QuantError::PartialBlock { .. })
        ));
        assert!(matches!(
            dequantize(GgmlType::Q8_0, &[0u8; 35], &mut [0.0; 32]),
            Err(QuantError::RaggedBytes { .. })
        ));
        assert!(matches!(
            dequantize(GgmlType::Q8_0, &[0u8; 34], &mut [0.0; 31]),
            Err(QuantError::LengthMismatch { .. })
        ));
    }

    #[test]
    fn cast_slice_checks_alignment_and_length() {
        let v: Vec<f32> = vec![1.0, 2.0];
        let bytes = as_bytes(&v);
        assert_eq!(cast_slice::<f32>(bytes), Some(&v[..]));
        assert_eq!(cast_slice::<f32>(&bytes[1..5]), None);
        assert_eq!(cast_slice::<f32>(&bytes[..7]), None);
    }
}
