//! Launchers of the quantize family (`quantize.cu`): q8_1 quantization of f32 rows, the
//! twin of [`crate::twin::quantize_q8_1`].

use cudarc::driver::{CudaSlice, LaunchConfig};

use super::{Gpu, int, need};
use crate::blocks::{BlockQ8_1, QK};
use crate::error::KernelError;
use crate::sources;

impl Gpu {
    /// q8_1 quantization of `y.len()` blocks of `x` (`x` holds at least `32 * y.len()`).
    pub fn quantize_q8_1(
        &self,
        x: &CudaSlice<f32>,
        y: &mut CudaSlice<BlockQ8_1>,
    ) -> Result<(), KernelError> {
        const K: &str = "quantize_q8_1_f32";
        need(K, "x", x.len(), y.len() * QK)?;
        let n = int(K, "blocks", y.len())?;
        let cfg = LaunchConfig {
            grid_dim: ((n as u32).div_ceil(8).max(1), 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: the kernel reads 32 * n floats of x and writes n blocks of y; both lengths
        // were checked above, and the argument types match the kernel's signature.
        unsafe { self.launch(&sources::QUANTIZE, K, cfg, &[x, y, &n]) }
    }

    /// q8_1 quantization of the first `n_blocks` blocks of `x` into `y` (the engine's
    /// buffers are sized for the largest batch and width, so the count is explicit).
    pub fn quantize_q8_1_n(
        &self,
        x: &CudaSlice<f32>,
        y: &mut CudaSlice<BlockQ8_1>,
        n_blocks: usize,
    ) -> Result<(), KernelError> {
        const K: &str = "quantize_q8_1_f32";
        need(K, "x", x.len(), n_blocks * QK)?;
        need(K, "y", y.len(), n_blocks)?;
        let n = int(K, "blocks", n_blocks)?;
        let cfg = LaunchConfig {
            grid_dim: ((n as u32).div_ceil(8).max(1), 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: the kernel reads 32 * n floats of x and writes n blocks of y, both checked.
        unsafe { self.launch(&sources::QUANTIZE, K, cfg, &[x, y, &n]) }
    }
}
