//! Launchers of the rope family (`rope.cu`): RoPE in place with an optional post-scale,
//! and RoPE fused with the KV-cache store over per-row cache pointers (the prompt pass;
//! a decode pass does both inside the attention kernels, [`super::attention`]).

use cudarc::driver::{CudaSlice, DevicePtrMut, LaunchConfig};

use super::attention::check_rows;
use super::{AttnRows, EW_THREADS, Gpu, RopeStoreArgs, int, need, shape};
use crate::error::KernelError;
use crate::sources;

impl Gpu {
    /// RoPE in place on `batch` rows of `n_heads * head_dim`, row `b` at position `pos[b]`,
    /// with an optional per-row post-scale (the fused tier's r). `table` comes from
    /// [`crate::twin::rope_table`]; a row whose position lies outside the table is left
    /// unrotated (the kernel checks, since positions live on the device).
    #[allow(clippy::too_many_arguments)]
    pub fn rope(
        &self,
        x: &mut CudaSlice<f32>,
        table: &CudaSlice<f32>,
        post_scale: Option<&CudaSlice<f32>>,
        pos: &CudaSlice<i32>,
        batch: usize,
        n_heads: usize,
        head_dim: usize,
    ) -> Result<(), KernelError> {
        const K: &str = "rope_f32";
        if head_dim == 0 || !head_dim.is_multiple_of(2) {
            return Err(shape(
                K,
                format!("head_dim = {head_dim} must be even and positive"),
            ));
        }
        need(K, "x", x.len(), batch * n_heads * head_dim)?;
        need(K, "pos", pos.len(), batch)?;
        if let Some(s) = post_scale {
            need(K, "post_scale", s.len(), batch)?;
        }
        let n_pos = int(K, "table positions", table.len() / head_dim)?;
        let (h, d) = (int(K, "n_heads", n_heads)?, int(K, "head_dim", head_dim)?);
        let pairs = (n_heads * head_dim / 2) as u32;
        let cfg = LaunchConfig {
            grid_dim: (pairs.div_ceil(EW_THREADS), batch as u32, 1),
            block_dim: (EW_THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: x, pos and post_scale lengths were checked for `batch` rows; the kernel
        // reads the table only for positions below n_pos = table.len() / head_dim. A null
        // post_scale is a null device pointer, which the kernel tests before reading.
        unsafe {
            self.launch(
                &sources::ROPE,
                K,
                cfg,
                &[x, table, &post_scale, pos, &h, &d, &n_pos],
            )
        }
    }

    /// RoPE and KV store of `rows.batch` rows of `qkv` (`[B][q | k | v]`, row stride
    /// `q_dim + 2 kv_dim`): q rotated in place, k rotated into `k_cache[b]` and v copied
    /// into `v_cache[b]` at `pos[b]`, all scaled by `post_scale[b]` when given. `table` comes
    /// from [`crate::twin::rope_table`].
    pub fn rope_store_rows(
        &self,
        qkv: &mut CudaSlice<f32>,
        table: &CudaSlice<f32>,
        post_scale: Option<&CudaSlice<f32>>,
        rows: &AttnRows,
        g: RopeStoreArgs,
    ) -> Result<(), KernelError> {
        const K: &str = "rope_store_rows_f32";
        check_rows(K, rows)?;
        if g.head_dim == 0 || !g.head_dim.is_multiple_of(2) || g.n_head_kv == 0 {
            return Err(shape(
                K,
                format!("{g:?}: head_dim must be even and positive"),
            ));
        }
        let (qd, kvd) = (g.q_dim(), g.kv_dim());
        let stride = qd + 2 * kvd;
        need(K, "qkv", qkv.len(), rows.batch * stride)?;
        if let Some(s) = post_scale {
            need(K, "post_scale", s.len(), rows.batch)?;
        }
        let n_pos = int(K, "table positions", table.len() / g.head_dim)?;
        let (st, h, hkv, d) = (
            int(K, "row stride", stride)?,
            int(K, "n_head", g.n_head)?,
            int(K, "n_head_kv", g.n_head_kv)?,
            int(K, "head_dim", g.head_dim)?,
        );
        let threads = (qd / 2 + kvd / 2 + kvd) as u32;
        let cfg = LaunchConfig {
            grid_dim: (threads.div_ceil(EW_THREADS), rows.batch as u32, 1),
            block_dim: (EW_THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        // q is written in place while k and v are read from the same buffer (disjoint
        // columns of each row), so the three are passed as addresses into it.
        let (base, _sync) = qkv.device_ptr_mut(&self.stream);
        let (q, k, v) = (base, base + 4 * qd as u64, base + 4 * (qd + kvd) as u64);
        // SAFETY: qkv holds batch rows of `stride` floats (checked), and the three addresses
        // are column offsets inside each row; positions outside the table are skipped by the
        // kernel; the cache pointers are the caller's contract (see AttnRows).
        unsafe {
            self.launch(
                &sources::ROPE,
                K,
                cfg,
                &[
                    &q,
                    &st,
                    &k,
                    &st,
                    &v,
                    &st,
                    rows.k_cache,
                    rows.v_cache,
                    table,
                    &post_scale,
                    rows.pos,
                    &h,
                    &hkv,
                    &d,
                    &n_pos,
                ],
            )
        }
    }

    /// The q8_0 KV cache's store step: the K and V rows at `pos[b]` of every row's caches
    /// (`rows.k_cache[b]`, `rows.v_cache[b]`, `kv_dim` floats per position, a multiple of
    /// 32) rounded in place to their blocks' dequantized values with `qmax` levels each side
    /// of zero: 127 for q8_0 ([`crate::twin::kv_round_q8_0`]), another for the engine's
    /// test-only coarse defect ([`crate::twin::kv_round_blocks`]). Runs after
    /// [`Gpu::rope_store_rows`] wrote them; positions outside `0..n_pos` are left alone.
    pub fn kv_round_q8_0_rows(
        &self,
        rows: &AttnRows,
        kv_dim: usize,
        n_pos: usize,
        qmax: i32,
    ) -> Result<(), KernelError> {
        const K: &str = "kv_round_q8_0_rows_f32";
        check_rows(K, rows)?;
        if kv_dim == 0 || !kv_dim.is_multiple_of(32) {
            return Err(shape(
                K,
                format!("kv_dim = {kv_dim} must be a positive multiple of 32 (whole q8_0 blocks)"),
            ));
        }
        if !(1..=127).contains(&qmax) {
            return Err(shape(K, format!("qmax = {qmax} must lie in 1..=127")));
        }
        let (kvd, np) = (int(K, "kv_dim", kv_dim)?, int(K, "n_pos", n_pos)?);
        let cfg = LaunchConfig {
            grid_dim: ((kv_dim / 32) as u32, rows.batch as u32, 2),
            block_dim: (32, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: the kernel reads pos[b] for b < batch (checked by check_rows) and touches
        // kv_dim floats at position pos[b] < n_pos of each row's caches, which the caller's
        // AttnRows contract says hold n_pos positions of kv_dim floats.
        unsafe {
            self.launch(
                &sources::ROPE,
                K,
                cfg,
                &[rows.k_cache, rows.v_cache, rows.pos, &kvd, &np, &qmax],
            )
        }
    }
}
