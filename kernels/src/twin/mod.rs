//! Host twins: pure Rust functions that compute exactly the float composition of each CUDA
//! kernel in `kernels/cuda/` (same operation order, same reduction trees, no fused
//! multiply-add), so a GPU result can be compared with its twin bit for bit wherever the
//! composition is mirrored. That includes `exp` (attention's softmax and split-K combine,
//! SwiGLU's SiLU, the sampler): both sides call one routine written twice, [`exp_mirrored`]
//! here and in `common.cuh`, instead of `expf` and a libm's `exp`, which differ by an ulp.
//!
//! This module owns the numeric definition of every kernel; `docs/numerics.md` is its prose
//! form. It does not own scheduling: row-range entry points let the caller parallelise.
//! The CPU backend of the engine is built from these functions.

mod attention;
mod elementwise;
mod exp;
mod matvec;
mod norm;
mod quantize;
mod reduce;
mod rope;
mod round;
mod sample;

pub use attention::{
    AttnShape, SPLIT_K_CHUNK, attention_naive, attention_naive_head, attention_split_k,
    attention_split_k_head,
};
pub use elementwise::{add, kv_store, scale, silu, swiglu};
pub use exp::exp_mirrored;
pub use matvec::{
    DP4A_THREADS, MatvecFamily, WeightRows, matvec, matvec_batch, matvec_batch_rows, matvec_f32,
    matvec_f32_rows, matvec_rows,
};
pub use norm::{NORM_THREADS, rms_factor, rmsnorm, rmsnorm_quantize_fused};
pub use quantize::quantize_q8_1;
pub use reduce::{block_sum, warp_sum};
pub use rope::{kv_round_blocks, kv_round_q8_0, rope, rope_table};
pub use sample::{
    Nucleus, Prepared, SAMPLE_THREADS, argmax, draw_uniform, philox4x32_10, sample, sample_with,
    uniform_from_philox,
};

/// A twin refused its arguments.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TwinError {
    /// Slice lengths that do not fit together.
    #[error(transparent)]
    Shape(#[from] ShapeError),
    /// A weight or activation kind the twin does not take.
    #[error("{op}: {got} is not supported here; {fix}")]
    Kind {
        /// The twin that refused the call.
        op: &'static str,
        /// What it was given.
        got: &'static str,
        /// What to call instead.
        fix: &'static str,
    },
}

/// A twin was called with slices whose lengths do not fit together. The message names the
/// argument, the length it has and the length the other arguments imply.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{op}: `{arg}` has length {got}, but {expected_why} (expected {expected})")]
pub struct ShapeError {
    /// The twin that refused the call, e.g. `matvec`.
    pub op: &'static str,
    /// The argument whose length is wrong.
    pub arg: &'static str,
    /// Its length.
    pub got: usize,
    /// The length the other arguments imply.
    pub expected: usize,
    /// Which other arguments imply it, in words.
    pub expected_why: &'static str,
}

/// Returns a [`ShapeError`] unless `got == expected`.
pub(crate) fn check_len(
    op: &'static str,
    arg: &'static str,
    got: usize,
    expected: usize,
    expected_why: &'static str,
) -> Result<(), ShapeError> {
    if got == expected {
        Ok(())
    } else {
        Err(ShapeError {
            op,
            arg,
            got,
            expected,
            expected_why,
        })
    }
}
