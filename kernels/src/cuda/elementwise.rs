//! Launchers of the elementwise family (`elementwise.cu`): SwiGLU (also fused with the
//! q8_1 quantization for the down projection), the residual add, the per-row scale and
//! the KV-cache store. The compositions are [`crate::twin::swiglu`] and its neighbours.

use cudarc::driver::{CudaSlice, LaunchConfig};

use super::{Gpu, int, need, shape};
use crate::blocks::{BlockQ8_1, QK};
use crate::error::KernelError;
use crate::sources;

impl Gpu {
    /// SwiGLU over `n` elements in rows of `cols`, optional per-row post-scale.
    #[allow(clippy::too_many_arguments)]
    pub fn swiglu(
        &self,
        gate: &CudaSlice<f32>,
        up: &CudaSlice<f32>,
        out: &mut CudaSlice<f32>,
        post_scale: Option<&CudaSlice<f32>>,
        n: usize,
        cols: usize,
    ) -> Result<(), KernelError> {
        const K: &str = "swiglu_f32";
        need(K, "gate", gate.len(), n)?;
        need(K, "up", up.len(), n)?;
        need(K, "out", out.len(), n)?;
        if cols == 0 {
            return Err(shape(K, "cols = 0".into()));
        }
        if let Some(s) = post_scale {
            need(K, "post_scale", s.len(), n.div_ceil(cols))?;
        }
        let (ni, ci) = (int(K, "n", n)?, int(K, "cols", cols)?);
        // SAFETY: all buffers hold n elements (post_scale one per row), checked above.
        unsafe {
            self.launch(
                &sources::ELEMENTWISE,
                K,
                Self::ew_cfg(n),
                &[gate, up, out, &post_scale, &ni, &ci],
            )
        }
    }

    /// Residual add in place: `x += y` over `n` elements.
    pub fn add(
        &self,
        x: &mut CudaSlice<f32>,
        y: &CudaSlice<f32>,
        n: usize,
    ) -> Result<(), KernelError> {
        const K: &str = "add_f32";
        need(K, "x", x.len(), n)?;
        need(K, "y", y.len(), n)?;
        let ni = int(K, "n", n)?;
        // SAFETY: both buffers hold n elements, checked above.
        unsafe { self.launch(&sources::ELEMENTWISE, K, Self::ew_cfg(n), &[x, y, &ni]) }
    }

    /// `y *= s[row]` over `n` elements in rows of `cols` (s: one device factor per row).
    pub fn scale(
        &self,
        y: &mut CudaSlice<f32>,
        s: &CudaSlice<f32>,
        n: usize,
        cols: usize,
    ) -> Result<(), KernelError> {
        const K: &str = "scale_f32";
        need(K, "y", y.len(), n)?;
        if cols == 0 {
            return Err(shape(K, "cols = 0".into()));
        }
        need(K, "s", s.len(), n.div_ceil(cols))?;
        let (ni, ci) = (int(K, "n", n)?, int(K, "cols", cols)?);
        // SAFETY: y holds n elements and s one per row, checked above.
        unsafe { self.launch(&sources::ELEMENTWISE, K, Self::ew_cfg(n), &[y, s, &ni, &ci]) }
    }

    /// Stores `row_len` values of `src` at position `pos` of a position-major cache.
    pub fn kv_store(
        &self,
        cache: &mut CudaSlice<f32>,
        src: &CudaSlice<f32>,
        post_scale: Option<&CudaSlice<f32>>,
        pos: usize,
        row_len: usize,
    ) -> Result<(), KernelError> {
        const K: &str = "kv_store_f32";
        need(K, "cache", cache.len(), (pos + 1) * row_len)?;
        need(K, "src", src.len(), row_len)?;
        let (p, r) = (int(K, "pos", pos)?, int(K, "row_len", row_len)?);
        // SAFETY: the cache covers position pos and src one row, checked above; a null
        // post_scale is tested by the kernel before reading.
        unsafe {
            self.launch(
                &sources::ELEMENTWISE,
                K,
                Self::ew_cfg(row_len),
                &[cache, src, &post_scale, &p, &r],
            )
        }
    }

    /// SwiGLU of `batch` rows of `gu` (`[B][gate | up]`, `n_ff` each) with the optional
    /// per-row post-scale, quantized to q8_1 into `hq` (and f32 into `hf` when given).
    #[allow(clippy::too_many_arguments)]
    pub fn swiglu_q8_1(
        &self,
        gu: &CudaSlice<f32>,
        post_scale: Option<&CudaSlice<f32>>,
        hf: Option<&mut CudaSlice<f32>>,
        hq: &mut CudaSlice<BlockQ8_1>,
        batch: usize,
        n_ff: usize,
    ) -> Result<(), KernelError> {
        const K: &str = "swiglu_q8_1_f32";
        if !n_ff.is_multiple_of(QK) || n_ff == 0 || batch == 0 {
            return Err(shape(
                K,
                format!(
                    "n_ff = {n_ff} must be a positive multiple of 32, batch = {batch} positive"
                ),
            ));
        }
        need(K, "gu", gu.len(), batch * 2 * n_ff)?;
        if let Some(s) = post_scale {
            need(K, "post_scale", s.len(), batch)?;
        }
        if let Some(h) = &hf {
            need(K, "hf", h.len(), batch * n_ff)?;
        }
        need(K, "hq", hq.len(), batch * n_ff / QK)?;
        let (st, n) = (int(K, "stride", 2 * n_ff)?, int(K, "n_ff", n_ff)?);
        let blocks = (n_ff / QK) as u32;
        let cfg = LaunchConfig {
            grid_dim: (blocks.div_ceil(8), batch as u32, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let gate = gu.slice(..);
        let up = gu.slice(n_ff..);
        // SAFETY: gate and up address batch rows of stride 2 * n_ff inside gu (checked); hq
        // and hf hold batch * n_ff values; null optional pointers are tested by the kernel.
        unsafe {
            self.launch(
                &sources::ELEMENTWISE,
                K,
                cfg,
                &[&gate, &up, &st, &post_scale, &hf, hq, &n],
            )
        }
    }
}
