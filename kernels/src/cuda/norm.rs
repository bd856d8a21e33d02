//! Launchers of the norm family (`norm.cu`): RMS norm, the fused tier's norm with q8_1
//! quantization, and the engine's norm step (`x += delta`, norm, q8_1) in its one-block,
//! wide and split forms, with the widths that choose between them.
//!
//! The single-row matvec that computes the norm step as its prologue is a matvec kernel and
//! lives in [`super::matvec`]; the composition is [`crate::twin::rmsnorm`]'s.

use cudarc::driver::{CudaSlice, LaunchConfig};

use super::{Gpu, int, need, shape};
use crate::blocks::{BlockQ8_1, QK};
use crate::error::KernelError;
use crate::sources;
use crate::twin::NORM_THREADS;

impl Gpu {
    /// RMS norm of `rows` rows of `cols`: `out = (x * r) * g`.
    pub fn rmsnorm(
        &self,
        x: &CudaSlice<f32>,
        g: &CudaSlice<f32>,
        out: &mut CudaSlice<f32>,
        rows: usize,
        cols: usize,
        eps: f32,
    ) -> Result<(), KernelError> {
        const K: &str = "rmsnorm_f32";
        need(K, "x", x.len(), rows * cols)?;
        need(K, "g", g.len(), cols)?;
        need(K, "out", out.len(), rows * cols)?;
        let c = int(K, "cols", cols)?;
        let cfg = LaunchConfig {
            grid_dim: (rows as u32, 1, 1),
            block_dim: (NORM_THREADS as u32, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: one block per row reads rows*cols of x, cols of g and writes rows*cols of
        // out; all three lengths were checked above.
        unsafe { self.launch(&sources::NORM, K, cfg, &[x, g, out, &c, &eps]) }
    }

    /// Fused tier: q8_1 of `x * g` into `yq` (`rows * cols / 32` blocks) and `r` per row into
    /// `r_out`, unapplied.
    #[allow(clippy::too_many_arguments)]
    pub fn rmsnorm_quantize_fused(
        &self,
        x: &CudaSlice<f32>,
        g: &CudaSlice<f32>,
        yq: &mut CudaSlice<BlockQ8_1>,
        r_out: &mut CudaSlice<f32>,
        rows: usize,
        cols: usize,
        eps: f32,
    ) -> Result<(), KernelError> {
        const K: &str = "rmsnorm_quantize_fused_f32";
        if !cols.is_multiple_of(QK) {
            return Err(shape(K, format!("cols = {cols} is not a multiple of 32")));
        }
        need(K, "x", x.len(), rows * cols)?;
        need(K, "g", g.len(), cols)?;
        need(K, "yq", yq.len(), rows * cols / QK)?;
        need(K, "r_out", r_out.len(), rows)?;
        let c = int(K, "cols", cols)?;
        let cfg = LaunchConfig {
            grid_dim: (rows as u32, 1, 1),
            block_dim: (NORM_THREADS as u32, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: one block per row; reads rows*cols of x and cols of g, writes rows*cols/32
        // blocks and rows factors; lengths checked above.
        unsafe { self.launch(&sources::NORM, K, cfg, &[x, g, yq, r_out, &c, &eps]) }
    }

    /// The norm step of `rows` rows of `cols`: `x += delta` (when given), then q8_1 of
    /// `(x * r) * g` into `yq` (separate composition, `r_out` `None`) or of `x * g` with `r`
    /// into `r_out` (fused composition). `xf` receives the quantized f32 values.
    #[allow(clippy::too_many_arguments)]
    pub fn add_rmsnorm_q8_1(
        &self,
        x: &mut CudaSlice<f32>,
        delta: Option<&CudaSlice<f32>>,
        g: &CudaSlice<f32>,
        xf: Option<&mut CudaSlice<f32>>,
        yq: &mut CudaSlice<BlockQ8_1>,
        r_out: Option<&mut CudaSlice<f32>>,
        rows: usize,
        cols: usize,
        eps: f32,
    ) -> Result<(), KernelError> {
        const K: &str = "add_rmsnorm_q8_1_f32";
        if !cols.is_multiple_of(QK) || cols == 0 || rows == 0 {
            return Err(shape(
                K,
                format!("cols = {cols} must be a positive multiple of 32, rows = {rows} positive"),
            ));
        }
        need(K, "x", x.len(), rows * cols)?;
        if let Some(d) = delta {
            need(K, "delta", d.len(), rows * cols)?;
        }
        need(K, "g", g.len(), cols)?;
        if let Some(f) = &xf {
            need(K, "xf", f.len(), rows * cols)?;
        }
        need(K, "yq", yq.len(), rows * cols / QK)?;
        if let Some(r) = &r_out {
            need(K, "r_out", r.len(), rows)?;
        }
        let c = int(K, "cols", cols)?;
        // Rows up to 1024 (SmolLM2's 576) and up to 4096 (llama-7B's 4096) each keep their
        // elements in registers, in kernels of their own size; wider rows take the narrow
        // kernel's memory path. The bits are the same in all three.
        let k = if cols > Self::NORM_PROLOGUE_MAX_COLS && cols <= Self::NORM_WIDE_MAX_COLS {
            "add_rmsnorm_q8_1_wide_f32"
        } else {
            K
        };
        let f = self.func(&sources::NORM, k)?;
        let cfg = LaunchConfig {
            grid_dim: (rows as u32, 1, 1),
            block_dim: (NORM_THREADS as u32, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: one block per row; every buffer was checked for rows * cols values (yq for
        // rows * cols / 32 blocks, r_out one per row); null optional pointers are tested by
        // the kernel before use.
        unsafe { self.launch_func(&f, k, cfg, &[x, &delta, g, &xf, yq, &r_out, &c, &eps]) }
    }

    /// The norm step of [`Gpu::add_rmsnorm_q8_1`] for rows of more than
    /// [`Gpu::NORM_PROLOGUE_MAX_COLS`] and at most [`Gpu::NORM_WIDE_MAX_COLS`], each row split
    /// over blocks that each quantize `share` of its `ceil(cols / 256)` groups of eight q8_1
    /// blocks (the same bits for every share): shorter than the one block per row of
    /// [`Gpu::add_rmsnorm_q8_1`], which quantizes all of a row in 16 rounds per warp.
    /// [`Gpu::norm_split_share`] is the share the engine takes for a pass of `rows` rows.
    /// Out of place: `x + delta` goes to `x_out`, which must not be `x`.
    ///
    /// With `x_early` the kernel reads `x` before its programmatic-launch wait, off the
    /// dependent chain: the caller vouches that the launch just before this one in the stream
    /// (if it is a kernel launched with PDL) does not write `x`, so that `x` is final when
    /// this kernel's blocks start. The bits are the same either way.
    #[allow(clippy::too_many_arguments)]
    pub fn add_rmsnorm_q8_1_split(
        &self,
        x: &CudaSlice<f32>,
        delta: Option<&CudaSlice<f32>>,
        g: &CudaSlice<f32>,
        x_out: &mut CudaSlice<f32>,
        xf: Option<&mut CudaSlice<f32>>,
        yq: &mut CudaSlice<BlockQ8_1>,
        r_out: Option<&mut CudaSlice<f32>>,
        rows: usize,
        cols: usize,
        eps: f32,
        x_early: bool,
        share: usize,
    ) -> Result<(), KernelError> {
        const K: &str = "add_rmsnorm_q8_1_split_f32";
        let groups = cols.div_ceil(NORM_THREADS);
        if share == 0 || share > groups {
            return Err(shape(
                K,
                format!(
                    "share = {share} must be between 1 and the row's {groups} groups of 256 \
                     columns (cols = {cols})"
                ),
            ));
        }
        if !cols.is_multiple_of(QK)
            || cols <= Self::NORM_PROLOGUE_MAX_COLS
            || cols > Self::NORM_WIDE_MAX_COLS
            || rows == 0
        {
            return Err(shape(
                K,
                format!(
                    "cols = {cols} must be a multiple of 32 above {} and at most {}, rows = \
                     {rows} positive; other widths take add_rmsnorm_q8_1",
                    Self::NORM_PROLOGUE_MAX_COLS,
                    Self::NORM_WIDE_MAX_COLS
                ),
            ));
        }
        need(K, "x", x.len(), rows * cols)?;
        if let Some(d) = delta {
            need(K, "delta", d.len(), rows * cols)?;
        }
        need(K, "g", g.len(), cols)?;
        need(K, "x_out", x_out.len(), rows * cols)?;
        if let Some(f) = &xf {
            need(K, "xf", f.len(), rows * cols)?;
        }
        need(K, "yq", yq.len(), rows * cols / QK)?;
        if let Some(r) = &r_out {
            need(K, "r_out", r.len(), rows)?;
        }
        let c = int(K, "cols", cols)?;
        let f = self.func(&sources::NORM, K)?;
        let grid = (rows as u32, groups.div_ceil(share) as u32, 1);
        let cfg = LaunchConfig {
            grid_dim: grid,
            block_dim: (NORM_THREADS as u32, 1, 1),
            // A single-row pass's blocks on multiprocessors of their own (claims_sm).
            shared_mem_bytes: if rows == 1 {
                self.claim_sm_bytes(K, &f, grid.0 * grid.1)
            } else {
                0
            },
        };
        let (early, sh) = (i32::from(x_early), share as i32);
        // SAFETY: grid (rows, ceil(cols / 256 / share)); every buffer was checked for rows * cols
        // values (yq for rows * cols / 32 blocks, r_out one per row); x_out is a distinct
        // buffer (the borrow checker keeps it from aliasing x); null optional pointers are
        // tested by the kernel before use.
        unsafe {
            self.launch_func(
                &f,
                K,
                cfg,
                &[x, &delta, g, x_out, &xf, yq, &r_out, &c, &eps, &early, &sh],
            )
        }
    }

    /// Test-only, for the planted defect `MEMRA_GATE_DEFECT=batch-reduction`: the
    /// composition of [`Gpu::rmsnorm_quantize_fused`] for `rows` rows of `cols` (q8_1 of
    /// `x * g` into `yq`, the f32 values into `xf` when given, `r` into `r_out` for a
    /// post-scale of the matvec's output), with `r` from a sum of squares taken by one thread
    /// from the last element to the first. No residual add: `x` is only read.
    #[allow(clippy::too_many_arguments)]
    pub fn rmsnorm_quantize_reversed(
        &self,
        x: &CudaSlice<f32>,
        g: &CudaSlice<f32>,
        xf: Option<&mut CudaSlice<f32>>,
        yq: &mut CudaSlice<BlockQ8_1>,
        r_out: &mut CudaSlice<f32>,
        rows: usize,
        cols: usize,
        eps: f32,
    ) -> Result<(), KernelError> {
        const K: &str = "rmsnorm_quantize_reversed_f32";
        if !cols.is_multiple_of(QK) || cols == 0 || rows == 0 {
            return Err(shape(
                K,
                format!("cols = {cols} must be a positive multiple of 32, rows = {rows} positive"),
            ));
        }
        need(K, "x", x.len(), rows * cols)?;
        need(K, "g", g.len(), cols)?;
        if let Some(f) = &xf {
            need(K, "xf", f.len(), rows * cols)?;
        }
        need(K, "yq", yq.len(), rows * cols / QK)?;
        need(K, "r_out", r_out.len(), rows)?;
        let c = int(K, "cols", cols)?;
        let cfg = LaunchConfig {
            grid_dim: (rows as u32, 1, 1),
            block_dim: (NORM_THREADS as u32, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: one block per row; x and xf hold rows * cols values, yq rows * cols / 32
        // blocks, r_out one per row, g cols, all checked above; a null xf is tested by the
        // kernel before use.
        unsafe { self.launch(&sources::NORM, K, cfg, &[x, g, &xf, yq, r_out, &c, &eps]) }
    }

    /// The widest row the norm step keeps in registers in its narrow kernel, and the widest a
    /// single-row matvec computes as its norm prologue (`NORM_REG_COLS` in common.cuh).
    pub const NORM_PROLOGUE_MAX_COLS: usize = 1024;

    /// The widest row of the norm step's wide kernel (`NORM_WIDE_REG` = 16 per thread).
    pub const NORM_WIDE_MAX_COLS: usize = 4096;

    /// The share of [`Gpu::add_rmsnorm_q8_1_split`] for a pass of `rows` rows of `cols`
    /// columns: one group of eight q8_1 blocks per block up to 16 rows, four above. Every
    /// block reads its whole row, so a large batch takes fewer blocks per row, each
    /// quantizing more (the sweep of shares is in the README, "The sweeps behind the batched
    /// forms' rules").
    pub fn norm_split_share(rows: usize, cols: usize) -> usize {
        let groups = cols.div_ceil(NORM_THREADS).max(1);
        let share = if rows <= 16 { 1 } else { 4 };
        share.min(groups)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The split norm step quantizes one group of eight blocks per thread block up to 16
    /// rows and four above, never more groups than the row has.
    #[test]
    fn batched_norm_steps_take_larger_shares() {
        assert_eq!(Gpu::norm_split_share(1, 4096), 1);
        assert_eq!(Gpu::norm_split_share(16, 4096), 1);
        assert_eq!(Gpu::norm_split_share(17, 4096), 4);
        assert_eq!(Gpu::norm_split_share(64, 4096), 4);
        assert_eq!(Gpu::norm_split_share(64, 32 * 37), 4);
        assert_eq!(Gpu::norm_split_share(64, 512), 2);
        assert_eq!(Gpu::norm_split_share(64, 32), 1);
    }
}
