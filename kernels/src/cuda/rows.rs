//! Launchers of the engine's batched-row kernels: token embedding, the residual add fused
//! with the norm and the q8_1 quantization, RoPE fused with the KV-cache store, SwiGLU fused
//! with the quantization, and the attention families over per-row cache pointers (with a
//! decode form of each that does the RoPE and KV store itself). The single-row matvecs that
//! compute the norm step themselves as a prologue are launched here too.
//!
//! These kernels exist so that one decode step is few launches and so that everything that
//! changes from step to step (tokens, positions, lengths) is read from device memory: a CUDA
//! graph captured once then replays every step. Their arithmetic is the single-purpose
//! kernels' (and so the twins'), composed; `docs/numerics.md` says how. Like every launcher
//! here they check lengths against the geometry and return [`KernelError::Shape`] rather
//! than launch out of bounds. Device pointers inside the pointer tables cannot be checked
//! here; the caller owns them (see [`AttnRows`]).

use cudarc::driver::{CudaSlice, DevicePtr, DevicePtrMut, LaunchConfig};

use super::{DeviceWeights, EW_THREADS, Gpu, MMVQ_ROWS, int, need, shape};
use crate::blocks::{BlockQ8_1, QK};
use crate::error::KernelError;
use crate::sources;
use crate::twin::NORM_THREADS;

/// The per-row inputs of the attention prologue and of attention: positions and the K and V
/// cache of each row, as device pointers.
///
/// The caller guarantees that `k_cache[b]` and `v_cache[b]` point at live f32 caches of at
/// least `(pos[b] + 1) * kv_dim` floats (in the graph case, for every replay); the launchers
/// can check only the table lengths.
pub struct AttnRows<'a> {
    pub pos: &'a CudaSlice<i32>,
    pub k_cache: &'a CudaSlice<u64>,
    pub v_cache: &'a CudaSlice<u64>,
    pub batch: usize,
}

/// The model geometry of the attention prologue.
#[derive(Debug, Clone, Copy)]
pub struct RopeStoreArgs {
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim: usize,
}

impl RopeStoreArgs {
    fn q_dim(&self) -> usize {
        self.n_head * self.head_dim
    }
    fn kv_dim(&self) -> usize {
        self.n_head_kv * self.head_dim
    }

    /// Whether the attention kernels can do the RoPE and KV store themselves
    /// ([`Gpu::attention_rope_naive_rows`], [`Gpu::attention_rope_split_k_rows`]): an even
    /// head of at most 256 values and whole groups of query heads per KV head.
    pub fn rope_fusable(&self) -> bool {
        self.head_dim > 0
            && self.head_dim.is_multiple_of(2)
            && self.head_dim <= FUSED_ATTN_MAX_HEAD_DIM
            && self.n_head_kv > 0
            && self.n_head.is_multiple_of(self.n_head_kv)
    }
}

fn check_rows(k: &'static str, rows: &AttnRows) -> Result<(), KernelError> {
    need(k, "pos", rows.pos.len(), rows.batch)?;
    need(k, "k_cache", rows.k_cache.len(), rows.batch)?;
    need(k, "v_cache", rows.v_cache.len(), rows.batch)?;
    if rows.batch == 0 {
        return Err(shape(k, "batch = 0".into()));
    }
    Ok(())
}

/// Whether the attention kernels can quantize their output in place of a separate
/// `quantize_q8_1` launch: every head's values must fill whole warps of the 128-thread block.
pub fn attention_can_quantize(head_dim: usize) -> bool {
    head_dim.is_multiple_of(QK) && head_dim > 0 && head_dim <= 128
}

fn check_outq(
    k: &'static str,
    outq: &Option<&mut CudaSlice<BlockQ8_1>>,
    batch: usize,
    g: RopeStoreArgs,
) -> Result<(), KernelError> {
    if let Some(q) = outq {
        if !attention_can_quantize(g.head_dim) {
            return Err(shape(
                k,
                format!(
                    "head_dim = {} cannot be quantized in the attention kernel (needs a \
                     multiple of 32 up to 128); quantize the output separately",
                    g.head_dim
                ),
            ));
        }
        need(k, "outq", q.len(), batch * g.q_dim() / QK)?;
    }
    Ok(())
}

/// The threads of an attention block (`attention.cu` assumes 128).
const ATTN_THREADS: u32 = 128;

/// The widest head the fused attention kernels take: one thread per RoPE pair of a
/// 128-thread block (`ATTN_MAX_HEAD_DIM` in `attention.cu`).
const FUSED_ATTN_MAX_HEAD_DIM: usize = 256;

/// The integer arguments of a fused RoPE + attention launch, checked.
struct FusedArgs {
    stride: i32,
    n_head: i32,
    n_head_kv: i32,
    head_dim: i32,
    n_pos: i32,
}

fn check_fused(
    k: &'static str,
    qkv: &CudaSlice<f32>,
    table: &CudaSlice<f32>,
    post_scale: Option<&CudaSlice<f32>>,
    rows: &AttnRows,
    g: RopeStoreArgs,
) -> Result<FusedArgs, KernelError> {
    check_rows(k, rows)?;
    if !g.rope_fusable() {
        return Err(shape(
            k,
            format!(
                "{g:?}: head_dim must be even, positive and at most {FUSED_ATTN_MAX_HEAD_DIM}, \
                 and n_head a multiple of n_head_kv; run rope_store_rows and the unfused \
                 attention for other shapes"
            ),
        ));
    }
    let stride = g.q_dim() + 2 * g.kv_dim();
    need(k, "qkv", qkv.len(), rows.batch * stride)?;
    if let Some(s) = post_scale {
        need(k, "post_scale", s.len(), rows.batch)?;
    }
    Ok(FusedArgs {
        stride: int(k, "row stride", stride)?,
        n_head: int(k, "n_head", g.n_head)?,
        n_head_kv: int(k, "n_head_kv", g.n_head_kv)?,
        head_dim: int(k, "head_dim", g.head_dim)?,
        n_pos: int(k, "table positions", table.len() / g.head_dim)?,
    })
}

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
        let f = self.func(&sources::EMBED, k)?;
        let cfg = LaunchConfig {
            grid_dim: ((cols as u32).div_ceil(EW_THREADS), batch as u32, 1),
            block_dim: (EW_THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut b = self.launcher(&f);
        match w {
            DeviceWeights::Q4_0(s) => b.arg(s),
            DeviceWeights::Q4_1(s) => b.arg(s),
            DeviceWeights::Q8_0(s) => b.arg(s),
            DeviceWeights::F32(s) => b.arg(s),
            DeviceWeights::F16(s) => b.arg(s),
            DeviceWeights::BF16(s) => b.arg(s),
        };
        b.arg(tokens).arg(x).arg(&c);
        // SAFETY: the kernel reads rows tokens[b] of a [vocab, cols] matrix (the caller's
        // tokens are checked against the vocabulary before upload) and writes batch * cols
        // floats; the lengths were checked above.
        unsafe { b.launch(cfg) }.map_err(KernelError::driver(format!("launching {k}")))?;
        Ok(())
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
        let mut b = self.launcher(&f);
        b.arg(x);
        b.arg(&delta);
        b.arg(g);
        b.arg(&xf);
        b.arg(yq);
        b.arg(&r_out);
        b.arg(&c).arg(&eps);
        // SAFETY: one block per row; every buffer was checked for rows * cols values (yq for
        // rows * cols / 32 blocks, r_out one per row); null optional pointers are tested by
        // the kernel before use.
        unsafe { b.launch(cfg) }.map_err(KernelError::driver(format!("launching {k}")))?;
        Ok(())
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
        let mut b = self.launcher(&f);
        b.arg(x);
        b.arg(&delta);
        b.arg(g).arg(x_out);
        b.arg(&xf);
        b.arg(yq);
        b.arg(&r_out);
        let sh = share as i32;
        b.arg(&c).arg(&eps).arg(&i32::from(x_early)).arg(&sh);
        // SAFETY: grid (rows, ceil(cols / 256 / share)); every buffer was checked for rows * cols
        // values (yq for rows * cols / 32 blocks, r_out one per row); x_out is a distinct
        // buffer (the borrow checker keeps it from aliasing x); null optional pointers are
        // tested by the kernel before use.
        unsafe { b.launch(cfg) }.map_err(KernelError::driver(format!("launching {K}")))?;
        Ok(())
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
        let f = self.func(&sources::ROPE, K)?;
        let cfg = LaunchConfig {
            grid_dim: (threads.div_ceil(EW_THREADS), rows.batch as u32, 1),
            block_dim: (EW_THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        // q is written in place while k and v are read from the same buffer (disjoint
        // columns of each row), so the three are passed as addresses into it.
        let (base, _sync) = qkv.device_ptr_mut(&self.stream);
        let (q, k, v) = (base, base + 4 * qd as u64, base + 4 * (qd + kvd) as u64);
        let mut b = self.launcher(&f);
        b.arg(&q).arg(&st).arg(&k).arg(&st).arg(&v).arg(&st);
        b.arg(rows.k_cache).arg(rows.v_cache).arg(table);
        b.arg(&post_scale);
        b.arg(rows.pos).arg(&h).arg(&hkv).arg(&d).arg(&n_pos);
        // SAFETY: qkv holds batch rows of `stride` floats (checked), and the three addresses
        // are column offsets inside each row; positions outside the table are skipped by the
        // kernel; the cache pointers are the caller's contract (see AttnRows).
        unsafe { b.launch(cfg) }.map_err(KernelError::driver(format!("launching {K}")))?;
        Ok(())
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
        let f = self.func(&sources::ELEMENTWISE, K)?;
        let blocks = (n_ff / QK) as u32;
        let cfg = LaunchConfig {
            grid_dim: (blocks.div_ceil(8), batch as u32, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let gate = gu.slice(..);
        let up = gu.slice(n_ff..);
        let mut b = self.launcher(&f);
        b.arg(&gate).arg(&up).arg(&st);
        b.arg(&post_scale);
        b.arg(&hf);
        b.arg(hq).arg(&n);
        // SAFETY: gate and up address batch rows of stride 2 * n_ff inside gu (checked); hq
        // and hf hold batch * n_ff values; null optional pointers are tested by the kernel.
        unsafe { b.launch(cfg) }.map_err(KernelError::driver(format!("launching {K}")))?;
        Ok(())
    }

    /// The widest row the norm step keeps in registers in its narrow kernel, and the widest a
    /// single-row matvec computes as its norm prologue (`NORM_REG_COLS` in common.cuh).
    pub const NORM_PROLOGUE_MAX_COLS: usize = 1024;
    /// The widest row of the norm step's wide kernel (`NORM_WIDE_REG` = 16 per thread).
    pub const NORM_WIDE_MAX_COLS: usize = 4096;

    /// The share of [`Gpu::add_rmsnorm_q8_1_split`] for a pass of `rows` rows of `cols`
    /// columns: one group of eight q8_1 blocks per block up to 16 rows, four above. Every
    /// block reads its whole row, so a large batch takes fewer blocks per row, each
    /// quantizing more. Measured on the H200 (llama-7B Q4_1, graphs, tokens/s, two rounds
    /// in one run):
    ///
    /// | share | B=1 | B=4 | B=16 | B=64 |
    /// |---|---|---|---|---|
    /// | one block per row, in place ([`Gpu::add_rmsnorm_q8_1`]) | — | 1,586–1,591 | 4,452–4,454 | 6,431–6,438 |
    /// | 1 | 630–631 | 1,732–1,733 | 4,835–4,841 | 6,360–6,370 |
    /// | 2 | 626–629 | 1,712–1,722 | 4,810–4,848 | 6,491–6,494 |
    /// | 4 | 627 | 1,693–1,694 | 4,807–4,821 | 6,600–6,601 |
    /// | 8 | 615–616 | 1,664–1,665 | 4,740–4,743 | 6,570–6,581 |
    /// | 16 (one block per row) | 588–589 | 1,620–1,621 | 4,563–4,574 | 6,492–6,498 |
    pub fn norm_split_share(rows: usize, cols: usize) -> usize {
        let groups = cols.div_ceil(NORM_THREADS).max(1);
        let share = if rows <= 16 { 1 } else { 4 };
        share.min(groups)
    }
    /// Checks a single-row prologue matvec's weights and widths; returns the kernel name,
    /// `cols / 32` and the weights' length in blocks.
    fn prologue_kernel(
        names: [&'static str; 3],
        w: DeviceWeights,
        rows: usize,
        cols: usize,
        max_cols: usize,
    ) -> Result<(&'static str, usize), KernelError> {
        let (k, wlen) = match w {
            DeviceWeights::Q4_0(s) => (names[0], s.len()),
            DeviceWeights::Q4_1(s) => (names[1], s.len()),
            DeviceWeights::Q8_0(s) => (names[2], s.len()),
            _ => {
                return Err(shape(
                    names[0],
                    "float weights have no q8_1 prologue: run the standalone norm, then \
                     matvec_float"
                        .into(),
                ));
            }
        };
        if !cols.is_multiple_of(QK) || cols == 0 || cols > max_cols || rows == 0 {
            return Err(shape(
                k,
                format!(
                    "cols = {cols} must be a positive multiple of 32 up to {max_cols} and rows = \
                     {rows} positive; wider rows take the standalone kernel and Gpu::matvec"
                ),
            ));
        }
        need(k, "w", wlen, rows * (cols / QK))?;
        Ok((k, cols / QK))
    }

    /// The thread blocks of a single-row mmvq matvec over `rows` rows, each staging one
    /// q8_1 row of `nb` blocks.
    fn b1_config(rows: usize, nb: usize) -> LaunchConfig {
        LaunchConfig {
            grid_dim: ((rows as u32).div_ceil(MMVQ_ROWS), 1, 1),
            block_dim: (32 * MMVQ_ROWS, 1, 1),
            shared_mem_bytes: (nb * std::mem::size_of::<BlockQ8_1>()) as u32,
        }
    }

    /// A single-row mmvq matvec `y = W · q8_1(norm(x + delta))` whose every thread block
    /// computes the norm step of [`Gpu::add_rmsnorm_q8_1`] itself (same bits) instead of
    /// reading a quantized row: `x + delta` (delta optional) goes to `x_out` (a buffer other
    /// than `x`, which the other blocks still read), and in the fused tier (`r_out` given)
    /// q8_1 of `x * g` is multiplied and `r` stored to `r_out[0]`; otherwise q8_1 of
    /// `(x * r) * g`. `cols` is at most [`Gpu::NORM_PROLOGUE_MAX_COLS`].
    #[allow(clippy::too_many_arguments)]
    pub fn matvec_norm_b1(
        &self,
        w: DeviceWeights,
        rows: usize,
        cols: usize,
        x: &CudaSlice<f32>,
        delta: Option<&CudaSlice<f32>>,
        g: &CudaSlice<f32>,
        eps: f32,
        x_out: &mut CudaSlice<f32>,
        r_out: Option<&mut CudaSlice<f32>>,
        y: &mut CudaSlice<f32>,
    ) -> Result<(), KernelError> {
        let (k, nb) = Self::prologue_kernel(
            [
                "matvec_mmvq_b1_norm_q4_0",
                "matvec_mmvq_b1_norm_q4_1",
                "matvec_mmvq_b1_norm_q8_0",
            ],
            w,
            rows,
            cols,
            Self::NORM_PROLOGUE_MAX_COLS,
        )?;
        need(k, "x", x.len(), cols)?;
        if let Some(d) = delta {
            need(k, "delta", d.len(), cols)?;
        }
        need(k, "g", g.len(), cols)?;
        need(k, "x_out", x_out.len(), cols)?;
        if let Some(r) = &r_out {
            need(k, "r_out", r.len(), 1)?;
        }
        need(k, "y", y.len(), rows)?;
        let (r, n) = (int(k, "rows", rows)?, int(k, "cols / 32", nb)?);
        let canary = self.canary_row;
        let f = self.func(&sources::MATVEC_MMVQ, k)?;
        let mut b = self.launcher(&f);
        match w {
            DeviceWeights::Q4_0(s) => b.arg(s),
            DeviceWeights::Q4_1(s) => b.arg(s),
            DeviceWeights::Q8_0(s) => b.arg(s),
            _ => unreachable!("float weights are refused by prologue_kernel"),
        };
        b.arg(y).arg(&r).arg(&n).arg(&canary).arg(x);
        b.arg(&delta);
        b.arg(g).arg(x_out);
        b.arg(&r_out);
        b.arg(&eps);
        // SAFETY: the kernel reads rows * nb weight blocks and cols values of x, delta and g,
        // writes rows values of y, cols of x_out and one r (block 0); all checked above, null
        // optional pointers are tested by the kernel. The dynamic shared memory holds the
        // staged row (nb blocks, below the 48 KiB default for cols <= 1024).
        unsafe { b.launch(Self::b1_config(rows, nb)) }
            .map_err(KernelError::driver(format!("launching {k}")))?;
        Ok(())
    }

    /// Split-K attention of `rows.batch` rows; row b's query is at `q + b * q_stride` (the
    /// q columns of the qkv buffer) and `out` is `[B][n_head * head_dim]`. `part_o` holds
    /// `B * n_head * max_chunks * head_dim` and `part_ml` `B * n_head * max_chunks * 2`
    /// floats; every row's length must fit `max_chunks * 64` (the kernel covers no more).
    #[allow(clippy::too_many_arguments)]
    pub fn attention_split_k_rows(
        &self,
        q: &CudaSlice<f32>,
        q_stride: usize,
        rows: &AttnRows,
        out: &mut CudaSlice<f32>,
        outq: Option<&mut CudaSlice<BlockQ8_1>>,
        part_o: &mut CudaSlice<f32>,
        part_ml: &mut CudaSlice<f32>,
        g: RopeStoreArgs,
        max_chunks: usize,
        scale: f32,
    ) -> Result<(), KernelError> {
        const K: &str = "attention_split_k_rows_f32";
        const C: &str = "attention_combine_rows_f32";
        check_rows(K, rows)?;
        if g.n_head_kv == 0 || !g.n_head.is_multiple_of(g.n_head_kv) || max_chunks == 0 {
            return Err(shape(
                K,
                format!("{g:?}, max_chunks = {max_chunks}: n_head must be a multiple of n_head_kv"),
            ));
        }
        let bt = rows.batch;
        need(K, "q", q.len(), (bt - 1) * q_stride + g.q_dim())?;
        need(K, "out", out.len(), bt * g.q_dim())?;
        check_outq(K, &outq, bt, g)?;
        need(
            K,
            "part_o",
            part_o.len(),
            bt * g.n_head * max_chunks * g.head_dim,
        )?;
        need(K, "part_ml", part_ml.len(), bt * g.n_head * max_chunks * 2)?;
        let (qs, h, hkv, d, mc) = (
            int(K, "q_stride", q_stride)?,
            int(K, "n_head", g.n_head)?,
            int(K, "n_head_kv", g.n_head_kv)?,
            int(K, "head_dim", g.head_dim)?,
            int(K, "max_chunks", max_chunks)?,
        );
        let f = self.func(&sources::ATTENTION, K)?;
        let cfg = LaunchConfig {
            grid_dim: (g.n_head as u32, max_chunks as u32, bt as u32),
            block_dim: (128, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut b = self.launcher(&f);
        b.arg(q)
            .arg(&qs)
            .arg(rows.k_cache)
            .arg(rows.v_cache)
            .arg(rows.pos)
            .arg(&*part_o)
            .arg(&*part_ml)
            .arg(&h)
            .arg(&hkv)
            .arg(&d)
            .arg(&scale);
        // SAFETY: q, the partial buffers and the tables were checked for the grid; chunks
        // beyond a row's length exit; the cache pointers are the caller's contract.
        unsafe { b.launch(cfg) }.map_err(KernelError::driver(format!("launching {K}")))?;
        let fc = self.func(&sources::ATTENTION, C)?;
        let cfg = LaunchConfig {
            grid_dim: (g.n_head as u32, bt as u32, 1),
            block_dim: (128, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut b = self.launcher(&fc);
        b.arg(&*part_o).arg(&*part_ml).arg(out);
        b.arg(&outq);
        b.arg(rows.pos).arg(&h).arg(&mc).arg(&d);
        // SAFETY: as above; out holds B * n_head * head_dim floats.
        unsafe { b.launch(cfg) }.map_err(KernelError::driver(format!("launching {C}")))?;
        Ok(())
    }

    /// One-block-per-head attention of `rows.batch` rows (see
    /// [`Gpu::attention_split_k_rows`]); `scratch` holds `B * n_head * scratch_stride` floats
    /// and every row's length must fit `scratch_stride`.
    #[allow(clippy::too_many_arguments)]
    pub fn attention_naive_rows(
        &self,
        q: &CudaSlice<f32>,
        q_stride: usize,
        rows: &AttnRows,
        out: &mut CudaSlice<f32>,
        outq: Option<&mut CudaSlice<BlockQ8_1>>,
        scratch: &mut CudaSlice<f32>,
        g: RopeStoreArgs,
        scratch_stride: usize,
        scale: f32,
    ) -> Result<(), KernelError> {
        const K: &str = "attention_naive_rows_f32";
        check_rows(K, rows)?;
        if g.n_head_kv == 0 || !g.n_head.is_multiple_of(g.n_head_kv) || scratch_stride == 0 {
            return Err(shape(
                K,
                format!(
                    "{g:?}, scratch_stride = {scratch_stride}: n_head must be a multiple of n_head_kv"
                ),
            ));
        }
        let bt = rows.batch;
        need(K, "q", q.len(), (bt - 1) * q_stride + g.q_dim())?;
        need(K, "out", out.len(), bt * g.q_dim())?;
        check_outq(K, &outq, bt, g)?;
        need(K, "scratch", scratch.len(), bt * g.n_head * scratch_stride)?;
        let (qs, h, hkv, d, ss) = (
            int(K, "q_stride", q_stride)?,
            int(K, "n_head", g.n_head)?,
            int(K, "n_head_kv", g.n_head_kv)?,
            int(K, "head_dim", g.head_dim)?,
            int(K, "scratch_stride", scratch_stride)?,
        );
        let f = self.func(&sources::ATTENTION, K)?;
        let cfg = LaunchConfig {
            grid_dim: (g.n_head as u32, bt as u32, 1),
            block_dim: (128, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut b = self.launcher(&f);
        b.arg(q)
            .arg(&qs)
            .arg(rows.k_cache)
            .arg(rows.v_cache)
            .arg(rows.pos)
            .arg(out);
        b.arg(&outq);
        b.arg(scratch)
            .arg(&h)
            .arg(&hkv)
            .arg(&d)
            .arg(&ss)
            .arg(&scale);
        // SAFETY: q, out, scratch and the tables were checked for the grid; the cache
        // pointers are the caller's contract.
        unsafe { b.launch(cfg) }.map_err(KernelError::driver(format!("launching {K}")))?;
        Ok(())
    }

    /// One-block-per-head attention of `rows.batch` decode rows that also does
    /// [`Gpu::rope_store_rows`]'s work: each row's q, k and v are read from `qkv` (`[B][q | k |
    /// v]`, as the qkv matvec leaves them), rotated (and scaled by `post_scale[b]` when
    /// given) in the attention kernel, and the current token's k and v are stored into the
    /// row's caches at `pos[b]`. The numbers are those of `rope_store_rows` followed by
    /// [`Gpu::attention_naive_rows`], bit for bit; `qkv` is left as it is (q is not rotated in
    /// place). Valid only when every row is a different sequence (a decode step): no row may
    /// read a cache slot another row of the launch writes, which the launcher cannot check.
    #[allow(clippy::too_many_arguments)]
    pub fn attention_rope_naive_rows(
        &self,
        qkv: &CudaSlice<f32>,
        table: &CudaSlice<f32>,
        post_scale: Option<&CudaSlice<f32>>,
        rows: &AttnRows,
        out: &mut CudaSlice<f32>,
        outq: Option<&mut CudaSlice<BlockQ8_1>>,
        scratch: &mut CudaSlice<f32>,
        g: RopeStoreArgs,
        scratch_stride: usize,
        scale: f32,
    ) -> Result<(), KernelError> {
        const K: &str = "attention_rope_naive_rows_f32";
        let fa = check_fused(K, qkv, table, post_scale, rows, g)?;
        if scratch_stride == 0 {
            return Err(shape(K, "scratch_stride = 0".into()));
        }
        let bt = rows.batch;
        need(K, "out", out.len(), bt * g.q_dim())?;
        check_outq(K, &outq, bt, g)?;
        need(K, "scratch", scratch.len(), bt * g.n_head * scratch_stride)?;
        let ss = int(K, "scratch_stride", scratch_stride)?;
        let f = self.func(&sources::ATTENTION, K)?;
        let cfg = LaunchConfig {
            grid_dim: (g.n_head as u32, bt as u32, 1),
            block_dim: (ATTN_THREADS, 1, 1),
            // A single-row pass's blocks on multiprocessors of their own (claims_sm).
            shared_mem_bytes: if bt == 1 {
                self.claim_sm_bytes(K, &f, g.n_head as u32)
            } else {
                0
            },
        };
        let mut b = self.launcher(&f);
        b.arg(qkv)
            .arg(&fa.stride)
            .arg(rows.k_cache)
            .arg(rows.v_cache)
            .arg(table);
        b.arg(&post_scale);
        b.arg(rows.pos).arg(out);
        b.arg(&outq);
        b.arg(scratch)
            .arg(&fa.n_head)
            .arg(&fa.n_head_kv)
            .arg(&fa.head_dim)
            .arg(&fa.n_pos)
            .arg(&ss)
            .arg(&scale);
        // SAFETY: qkv, out, scratch, post_scale and the tables were checked for the grid;
        // positions outside the RoPE table write nothing; the cache pointers (and that no
        // two rows share a cache) are the caller's contract.
        unsafe { b.launch(cfg) }.map_err(KernelError::driver(format!("launching {K}")))?;
        Ok(())
    }

    /// Split-K attention of `rows.batch` decode rows that also does
    /// [`Gpu::rope_store_rows`]'s work, as [`Gpu::attention_rope_naive_rows`] does for the
    /// one-block-per-head family: bit for bit `rope_store_rows` followed by
    /// [`Gpu::attention_split_k_rows`] (whose partial buffers and combine it shares). The
    /// chunk holding `pos[b]` stores the current token's k and v.
    #[allow(clippy::too_many_arguments)]
    pub fn attention_rope_split_k_rows(
        &self,
        qkv: &CudaSlice<f32>,
        table: &CudaSlice<f32>,
        post_scale: Option<&CudaSlice<f32>>,
        rows: &AttnRows,
        out: &mut CudaSlice<f32>,
        outq: Option<&mut CudaSlice<BlockQ8_1>>,
        part_o: &mut CudaSlice<f32>,
        part_ml: &mut CudaSlice<f32>,
        g: RopeStoreArgs,
        max_chunks: usize,
        scale: f32,
    ) -> Result<(), KernelError> {
        const K: &str = "attention_rope_split_k_rows_f32";
        const C: &str = "attention_combine_rows_f32";
        let fa = check_fused(K, qkv, table, post_scale, rows, g)?;
        if max_chunks == 0 {
            return Err(shape(K, "max_chunks = 0".into()));
        }
        let bt = rows.batch;
        need(K, "out", out.len(), bt * g.q_dim())?;
        check_outq(K, &outq, bt, g)?;
        need(
            K,
            "part_o",
            part_o.len(),
            bt * g.n_head * max_chunks * g.head_dim,
        )?;
        need(K, "part_ml", part_ml.len(), bt * g.n_head * max_chunks * 2)?;
        let mc = int(K, "max_chunks", max_chunks)?;
        let f = self.func(&sources::ATTENTION, K)?;
        let cfg = LaunchConfig {
            grid_dim: (g.n_head as u32, max_chunks as u32, bt as u32),
            block_dim: (ATTN_THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut b = self.launcher(&f);
        b.arg(qkv)
            .arg(&fa.stride)
            .arg(rows.k_cache)
            .arg(rows.v_cache)
            .arg(table);
        b.arg(&post_scale);
        b.arg(rows.pos)
            .arg(&*part_o)
            .arg(&*part_ml)
            .arg(&fa.n_head)
            .arg(&fa.n_head_kv)
            .arg(&fa.head_dim)
            .arg(&fa.n_pos)
            .arg(&scale);
        // SAFETY: as in attention_rope_naive_rows; chunks beyond a row's length exit.
        unsafe { b.launch(cfg) }.map_err(KernelError::driver(format!("launching {K}")))?;
        let fc = self.func(&sources::ATTENTION, C)?;
        let cfg = LaunchConfig {
            grid_dim: (g.n_head as u32, bt as u32, 1),
            block_dim: (ATTN_THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut b = self.launcher(&fc);
        b.arg(&*part_o).arg(&*part_ml).arg(out);
        b.arg(&outq);
        b.arg(rows.pos).arg(&fa.n_head).arg(&mc).arg(&fa.head_dim);
        // SAFETY: as above; out holds B * n_head * head_dim floats.
        unsafe { b.launch(cfg) }.map_err(KernelError::driver(format!("launching {C}")))?;
        Ok(())
    }

    /// The device address of a slice, for the pointer tables of [`AttnRows`].
    pub fn address<T>(&self, s: &CudaSlice<T>) -> u64 {
        let (p, _sync) = s.device_ptr(&self.stream);
        p
    }
}

impl Gpu {
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
        let f = self.func(&sources::QUANTIZE, K)?;
        let cfg = LaunchConfig {
            grid_dim: ((n as u32).div_ceil(8).max(1), 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut b = self.launcher(&f);
        b.arg(x).arg(y).arg(&n);
        // SAFETY: the kernel reads 32 * n floats of x and writes n blocks of y, both checked.
        unsafe { b.launch(cfg) }.map_err(KernelError::driver(format!("launching {K}")))?;
        Ok(())
    }
}
