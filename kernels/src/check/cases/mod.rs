//! The kernel-check cases, one module per kernel family: each case uploads deterministic
//! inputs, runs one kernel at one geometry on the GPU, runs its twin on the host, and
//! compares — bitwise where the composition is mirrored, within a stated tolerance where
//! `exp` is involved. Geometries are the real model shapes (576, 1536, 49152 rows; 4096,
//! 11008) plus ragged ones (rows not a multiple of a block's rows, cols = 32 * odd).
//!
//! This module owns the inputs ([`Rng`]) and the transfers every case shares; the list of
//! case groups and their order is [`crate::check`]'s.

mod attention;
mod elementwise;
mod matvec;
mod norm;
mod rope;
mod sample;

pub use attention::{attention, attention_prompt_rows, attention_rope_rows};
pub use elementwise::elementwise;
pub(super) use matvec::{MATVEC_FORMS, MatvecForm};
pub use matvec::{head_post_scale, matvec, matvec_float, row_prologues};
pub use norm::{norm_and_quantize, norm_step};
pub use rope::{kv_round_q8_0, rope};
pub use sample::sampling;

use cudarc::driver::{CudaSlice, DeviceRepr, ValidAsZeroBits};
use half::f16;

use crate::blocks::{BlockQ8_1, QK};
use crate::cuda::Gpu;
use crate::error::KernelError;
use crate::twin;

type R<T> = Result<T, KernelError>;

/// Deterministic inputs (64-bit LCG, high bits).
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0xD1B5_4A32_D192_ED03)
    }
    pub fn u32(&mut self) -> u32 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (self.0 >> 32) as u32
    }
    /// Uniform in [-1, 1).
    pub fn f(&mut self) -> f32 {
        (self.u32() >> 8) as f32 / 8_388_608.0 - 1.0
    }
    /// Roughly normal (sum of four uniforms), unit-ish variance.
    pub fn n(&mut self) -> f32 {
        (self.f() + self.f() + self.f() + self.f()) * 0.866
    }
    pub fn vec(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| self.n() * scale).collect()
    }
}

fn up<T: DeviceRepr>(gpu: &Gpu, data: &[T]) -> R<CudaSlice<T>> {
    gpu.stream()
        .clone_htod(data)
        .map_err(KernelError::driver("copying inputs to the device"))
}

fn down<T: DeviceRepr>(gpu: &Gpu, s: &CudaSlice<T>) -> R<Vec<T>> {
    gpu.stream()
        .clone_dtoh(s)
        .map_err(KernelError::driver("copying results to the host"))
}

fn zeros<T: DeviceRepr + ValidAsZeroBits>(gpu: &Gpu, n: usize) -> R<CudaSlice<T>> {
    gpu.stream()
        .alloc_zeros(n.max(1))
        .map_err(KernelError::driver("allocating device memory"))
}

/// q8_1 blocks as words (d, s, then the 32 quants) for a bitwise comparison.
fn q8_words(b: &[BlockQ8_1]) -> Vec<u32> {
    let mut w = Vec::with_capacity(b.len() * 34);
    for blk in b {
        w.push(blk.d.to_bits() as u32);
        w.push(blk.s.to_bits() as u32);
        w.extend(blk.qs.iter().map(|&q| q as i32 as u32));
    }
    w
}

fn quantize_host(x: &[f32]) -> Vec<BlockQ8_1> {
    let mut q = vec![
        BlockQ8_1 {
            d: f16::ZERO,
            s: f16::ZERO,
            qs: [0; QK]
        };
        x.len() / QK
    ];
    twin::quantize_q8_1(x, &mut q).expect("x is whole blocks");
    q
}
