//! ggml's quantized block layouts, byte for byte. Shared by the GGUF loader, the host twins
//! and the CUDA kernels (`common.cuh` declares the same structs).

use half::f16;

/// Elements per block for every block type here.
pub const QK: usize = 32;

/// Q4_0: `d` scale, 32 unsigned nibbles with an implicit offset of 8. 18 bytes.
/// Element j (j < 16) is the low nibble of `qs[j]`, element j + 16 its high nibble.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BlockQ4_0 {
    pub d: f16,
    pub qs: [u8; QK / 2],
}

/// Q4_1: `d` scale and `m` minimum, 32 unsigned nibbles: x = d * q + m. 20 bytes.
/// Element j (j < 16) is the low nibble of `qs[j]`, element j + 16 its high nibble.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BlockQ4_1 {
    pub d: f16,
    pub m: f16,
    pub qs: [u8; QK / 2],
}

/// Q8_0: `d` scale, 32 signed bytes: x = d * q. 34 bytes.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BlockQ8_0 {
    pub d: f16,
    pub qs: [i8; QK],
}

/// Q8_1 (activations only): `d` scale, `s = d·Σq` the sum of the block's *rounded* values
/// (as ggml's CPU `quantize_row_q8_1_ref` stores it, not the float sum of the activations
/// ggml's CUDA kernels store), 32 signed bytes. 36 bytes. The composition is
/// `twin::quantize_q8_1`'s.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BlockQ8_1 {
    pub d: f16,
    pub s: f16,
    pub qs: [i8; QK],
}

const _: () = assert!(std::mem::size_of::<BlockQ4_0>() == 18);
const _: () = assert!(std::mem::size_of::<BlockQ4_1>() == 20);
const _: () = assert!(std::mem::size_of::<BlockQ8_0>() == 34);
const _: () = assert!(std::mem::size_of::<BlockQ8_1>() == 36);
