//! Launcher of the embed family (`embed.cu`): token rows of the embedding matrix, in any
//! weight type, dequantized to f32 rows. It has no twin of its own: each output row is the
//! weight row's values, exactly as [`crate::blocks`] dequantizes them.

use cudarc::driver::{CudaSlice, LaunchConfig};

use super::{DeviceWeights, EW_THREADS, Gpu, int, need, shape};
use crate::blocks::QK;
use crate::error::KernelError;
use crate::sources;

impl Gpu {
    /// `x[b] = row tokens[b] of w` as f32, for `batch` rows of `cols`.
    pub fn embed(
        &self,
        w: DeviceWeights,
        vocab: usize,
        cols: usize,
        tokens: &CudaSlice<u32>,
        x: &mut CudaSlice<f32>,
        batch: usize,
    ) -> Result<(), KernelError> {
        let (k, wlen, units) = match w {
            DeviceWeights::Q4_0(s) => ("embed_q4_0", s.len(), vocab * cols / QK),
            DeviceWeights::Q4_1(s) => ("embed_q4_1", s.len(), vocab * cols / QK),
            DeviceWeights::Q8_0(s) => ("embed_q8_0", s.len(), vocab * cols / QK),
            DeviceWeights::F32(s) => ("embed_f32", s.len(), vocab * cols),
            DeviceWeights::F16(s) => ("embed_f16", s.len(), vocab * cols),
            DeviceWeights::BF16(s) => ("embed_bf16", s.len(), vocab * cols),
        };
        if !cols.is_multiple_of(QK) || batch == 0 {
            return Err(shape(
                k,
                format!("cols = {cols} must be a multiple of 32 and batch = {batch} positive"),
            ));
        }
        need(k, "w", wlen, units)?;
        need(k, "tokens", tokens.len(), batch)?;
        need(k, "x", x.len(), batch * cols)?;
        let c = int(k, "cols", cols)?;
        let cfg = LaunchConfig {
            grid_dim: ((cols as u32).div_ceil(EW_THREADS), batch as u32, 1),
            block_dim: (EW_THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: the kernel reads rows tokens[b] of a [vocab, cols] matrix (the caller's
        // tokens are checked against the vocabulary before upload) and writes batch * cols
        // floats; the lengths were checked above.
        unsafe { self.launch(&sources::EMBED, k, cfg, &[w.arg(), tokens, x, &c]) }
    }
}
