//! Launchers of the attention family (`attention.cu`): one-block-per-head and split-K
//! attention over one contiguous cache, their batched-row forms over per-row cache pointers
//! ([`AttnRows`]), and the decode forms that also do the RoPE and KV store. Device pointers
//! inside the pointer tables cannot be checked here; the caller owns them (see
//! [`AttnRows`]). The composition is [`crate::twin::attention_naive`]'s and
//! [`crate::twin::attention_split_k`]'s.

use cudarc::driver::{CudaSlice, LaunchConfig};

use super::{Gpu, int, need, shape};
use crate::blocks::{BlockQ8_1, QK};
use crate::error::KernelError;
use crate::sources;
use crate::twin::{AttnShape, SPLIT_K_CHUNK};

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
    pub(super) fn q_dim(&self) -> usize {
        self.n_head * self.head_dim
    }
    pub(super) fn kv_dim(&self) -> usize {
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

pub(super) fn check_rows(k: &'static str, rows: &AttnRows) -> Result<(), KernelError> {
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

/// Rows per block of [`Gpu::attention_split_k_tile_rows`]: each chunk of K and V rows is read
/// from L2 once per this many rows.
pub const PROMPT_TILE: usize = 16;

const PROMPT_TILE_KERNEL: &str = "attention_split_k_tile_rows_f32";

/// Warps per block of the tiled prompt attention (`TILE_WARPS` in `attention.cu`): each
/// computes its rows of the tile alone.
const TILE_WARPS: u32 = 8;

/// The tiled prompt attention's dynamic shared memory: one chunk of K and V rows.
fn prompt_tile_bytes(head_dim: usize) -> usize {
    2 * SPLIT_K_CHUNK * head_dim * std::mem::size_of::<f32>()
}

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
    fn check_attn(
        k: &'static str,
        q: usize,
        kc: usize,
        vc: usize,
        out: usize,
        s: &AttnShape,
    ) -> Result<(), KernelError> {
        if s.n_kv_heads == 0
            || !s.n_heads.is_multiple_of(s.n_kv_heads)
            || s.n_tokens == 0
            || s.head_dim == 0
        {
            return Err(shape(
                k,
                format!(
                    "{s:?}: n_heads must be a multiple of n_kv_heads, n_tokens and head_dim positive"
                ),
            ));
        }
        need(k, "q", q, s.n_heads * s.head_dim)?;
        need(k, "k_cache", kc, s.n_tokens * s.n_kv_heads * s.head_dim)?;
        need(k, "v_cache", vc, s.n_tokens * s.n_kv_heads * s.head_dim)?;
        need(k, "out", out, s.n_heads * s.head_dim)
    }

    /// One-block-per-head attention; `scratch` holds at least `n_heads * n_tokens` floats.
    #[allow(clippy::too_many_arguments)]
    pub fn attention_naive(
        &self,
        q: &CudaSlice<f32>,
        k: &CudaSlice<f32>,
        v: &CudaSlice<f32>,
        out: &mut CudaSlice<f32>,
        scratch: &mut CudaSlice<f32>,
        s: &AttnShape,
        scale: f32,
    ) -> Result<(), KernelError> {
        const K: &str = "attention_naive_f32";
        Self::check_attn(K, q.len(), k.len(), v.len(), out.len(), s)?;
        need(K, "scratch", scratch.len(), s.n_heads * s.n_tokens)?;
        let (h, kvh, d, n) = (
            int(K, "n_heads", s.n_heads)?,
            int(K, "n_kv_heads", s.n_kv_heads)?,
            int(K, "head_dim", s.head_dim)?,
            int(K, "n_tokens", s.n_tokens)?,
        );
        let cfg = LaunchConfig {
            grid_dim: (s.n_heads as u32, 1, 1),
            block_dim: (128, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: lengths of q, the caches, out and scratch (n_heads rows of stride n_tokens)
        // were checked against the shape above.
        unsafe {
            self.launch(
                &sources::ATTENTION,
                K,
                cfg,
                &[q, k, v, out, scratch, &h, &kvh, &d, &n, &n, &scale],
            )
        }
    }

    /// Split-K flash-decoding: partial kernel over 64-token chunks, then the combine.
    /// `part_o` holds `n_heads * n_chunks * head_dim`, `part_ml` `n_heads * n_chunks * 2`
    /// floats, `n_chunks = ceil(n_tokens / 64)`.
    #[allow(clippy::too_many_arguments)]
    pub fn attention_split_k(
        &self,
        q: &CudaSlice<f32>,
        k: &CudaSlice<f32>,
        v: &CudaSlice<f32>,
        out: &mut CudaSlice<f32>,
        part_o: &mut CudaSlice<f32>,
        part_ml: &mut CudaSlice<f32>,
        s: &AttnShape,
        scale: f32,
    ) -> Result<(), KernelError> {
        const K: &str = "attention_split_k_f32";
        const C: &str = "attention_combine_f32";
        Self::check_attn(K, q.len(), k.len(), v.len(), out.len(), s)?;
        let chunks = s.n_tokens.div_ceil(SPLIT_K_CHUNK);
        need(K, "part_o", part_o.len(), s.n_heads * chunks * s.head_dim)?;
        need(K, "part_ml", part_ml.len(), s.n_heads * chunks * 2)?;
        let (h, kvh, d, n, nc) = (
            int(K, "n_heads", s.n_heads)?,
            int(K, "n_kv_heads", s.n_kv_heads)?,
            int(K, "head_dim", s.head_dim)?,
            int(K, "n_tokens", s.n_tokens)?,
            int(K, "n_chunks", chunks)?,
        );
        let cfg = LaunchConfig {
            grid_dim: (s.n_heads as u32, chunks as u32, 1),
            block_dim: (128, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: q, caches and both partial buffers were checked against the shape and the
        // chunk count that sizes the grid.
        unsafe {
            self.launch(
                &sources::ATTENTION,
                K,
                cfg,
                &[q, k, v, &*part_o, &*part_ml, &h, &kvh, &d, &n, &scale],
            )
        }?;
        let cfg = LaunchConfig {
            grid_dim: (s.n_heads as u32, 1, 1),
            block_dim: (128, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: the partial buffers were sized above; out holds n_heads * head_dim.
        unsafe {
            self.launch(
                &sources::ATTENTION,
                C,
                cfg,
                &[&*part_o, &*part_ml, out, &nc, &d],
            )
        }
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
        check_split_k_rows(
            K, q, q_stride, rows, out, &outq, part_o, part_ml, g, max_chunks,
        )?;
        let bt = rows.batch;
        let (qs, h, hkv, d) = (
            int(K, "q_stride", q_stride)?,
            int(K, "n_head", g.n_head)?,
            int(K, "n_head_kv", g.n_head_kv)?,
            int(K, "head_dim", g.head_dim)?,
        );
        int(K, "max_chunks", max_chunks)?;
        let cfg = LaunchConfig {
            grid_dim: (g.n_head as u32, max_chunks as u32, bt as u32),
            block_dim: (128, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: q, the partial buffers and the tables were checked for the grid; chunks
        // beyond a row's length exit; the cache pointers are the caller's contract.
        unsafe {
            self.launch(
                &sources::ATTENTION,
                K,
                cfg,
                &[
                    q,
                    &qs,
                    rows.k_cache,
                    rows.v_cache,
                    rows.pos,
                    &*part_o,
                    &*part_ml,
                    &h,
                    &hkv,
                    &d,
                    &scale,
                ],
            )
        }?;
        self.attention_combine_rows(rows, out, outq, part_o, part_ml, g, max_chunks)
    }

    /// [`Gpu::attention_split_k_rows`] for rows that read one cache, a prompt pass's (the
    /// engine takes it for nothing else): the same arguments, outputs and bits. Each block copies one chunk of
    /// K and V rows into shared memory for a tile of [`PROMPT_TILE`] rows
    /// (`attention_split_k_tile_rows_f32`), where the one-row kernel reads those rows from
    /// L2 once per row. A row with another cache is still right, read from its own cache.
    /// The copy reads 16-byte words: the caches start 16-byte aligned (as every device
    /// allocation does) and `head_dim` is a multiple of 4.
    /// Without the tiled kernel (`MEMRA_PROMPT_TILE=0`, a single row, a head width that is
    /// not a multiple of 4, or shared memory the device refuses), the one-row kernel runs.
    #[allow(clippy::too_many_arguments)]
    pub fn attention_split_k_tile_rows(
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
        const K: &str = PROMPT_TILE_KERNEL;
        if !self.takes_prompt_tile(rows.batch, g.head_dim)? {
            return self.attention_split_k_rows(
                q, q_stride, rows, out, outq, part_o, part_ml, g, max_chunks, scale,
            );
        }
        check_split_k_rows(
            K, q, q_stride, rows, out, &outq, part_o, part_ml, g, max_chunks,
        )?;
        let bt = rows.batch;
        let (qs, h, hkv, d, nr, tile) = (
            int(K, "q_stride", q_stride)?,
            int(K, "n_head", g.n_head)?,
            int(K, "n_head_kv", g.n_head_kv)?,
            int(K, "head_dim", g.head_dim)?,
            int(K, "batch", bt)?,
            int(K, "tile", PROMPT_TILE)?,
        );
        let f = self.func(&sources::ATTENTION, K)?;
        let cfg = LaunchConfig {
            grid_dim: (
                g.n_head as u32,
                max_chunks as u32,
                bt.div_ceil(PROMPT_TILE) as u32,
            ),
            block_dim: (32 * TILE_WARPS, 1, 1),
            shared_mem_bytes: prompt_tile_bytes(g.head_dim) as u32,
        };
        // SAFETY: as attention_split_k_rows; the grid's last tile stops at the batch, and the
        // shared memory holds one chunk of K and V rows (2 * 64 * head_dim floats).
        unsafe {
            self.launch_func(
                &f,
                K,
                cfg,
                &[
                    q,
                    &qs,
                    rows.k_cache,
                    rows.v_cache,
                    rows.pos,
                    &*part_o,
                    &*part_ml,
                    &h,
                    &hkv,
                    &d,
                    &nr,
                    &tile,
                    &scale,
                ],
            )
        }?;
        self.attention_combine_rows(rows, out, outq, part_o, part_ml, g, max_chunks)
    }

    /// Whether [`Gpu::attention_split_k_tile_rows`] takes the tiled kernel for `batch` rows
    /// of heads `head_dim` wide: `MEMRA_PROMPT_TILE` on, two rows or more, a head width that
    /// is a multiple of 4, and the shared memory for one chunk of K and V rows granted.
    pub fn takes_prompt_tile(&self, batch: usize, head_dim: usize) -> Result<bool, KernelError> {
        if !self.prompt_tile || batch < 2 || !head_dim.is_multiple_of(4) {
            return Ok(false);
        }
        let f = self.func(&sources::ATTENTION, PROMPT_TILE_KERNEL)?;
        Ok(self.allow_dynamic_smem(PROMPT_TILE_KERNEL, &f, prompt_tile_bytes(head_dim)))
    }

    /// The split-K rows forms' combine: row b's chunks of every head into `out` (and its q8_1
    /// blocks into `outq`). The caller checked the buffers.
    #[allow(clippy::too_many_arguments)]
    fn attention_combine_rows(
        &self,
        rows: &AttnRows,
        out: &mut CudaSlice<f32>,
        outq: Option<&mut CudaSlice<BlockQ8_1>>,
        part_o: &CudaSlice<f32>,
        part_ml: &CudaSlice<f32>,
        g: RopeStoreArgs,
        max_chunks: usize,
    ) -> Result<(), KernelError> {
        const C: &str = "attention_combine_rows_f32";
        let bt = rows.batch;
        let (h, d, mc) = (
            int(C, "n_head", g.n_head)?,
            int(C, "head_dim", g.head_dim)?,
            int(C, "max_chunks", max_chunks)?,
        );
        let cfg = LaunchConfig {
            grid_dim: (g.n_head as u32, bt as u32, 1),
            block_dim: (128, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: as above; out holds B * n_head * head_dim floats.
        unsafe {
            self.launch(
                &sources::ATTENTION,
                C,
                cfg,
                &[part_o, part_ml, out, &outq, rows.pos, &h, &mc, &d],
            )
        }
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
        let cfg = LaunchConfig {
            grid_dim: (g.n_head as u32, bt as u32, 1),
            block_dim: (128, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: q, out, scratch and the tables were checked for the grid; the cache
        // pointers are the caller's contract.
        unsafe {
            self.launch(
                &sources::ATTENTION,
                K,
                cfg,
                &[
                    q,
                    &qs,
                    rows.k_cache,
                    rows.v_cache,
                    rows.pos,
                    out,
                    &outq,
                    scratch,
                    &h,
                    &hkv,
                    &d,
                    &ss,
                    &scale,
                ],
            )
        }
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
        // SAFETY: qkv, out, scratch, post_scale and the tables were checked for the grid;
        // positions outside the RoPE table write nothing; the cache pointers (and that no
        // two rows share a cache) are the caller's contract.
        unsafe {
            self.launch_func(
                &f,
                K,
                cfg,
                &[
                    qkv,
                    &fa.stride,
                    rows.k_cache,
                    rows.v_cache,
                    table,
                    &post_scale,
                    rows.pos,
                    out,
                    &outq,
                    scratch,
                    &fa.n_head,
                    &fa.n_head_kv,
                    &fa.head_dim,
                    &fa.n_pos,
                    &ss,
                    &scale,
                ],
            )
        }
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
        int(K, "max_chunks", max_chunks)?;
        let cfg = LaunchConfig {
            grid_dim: (g.n_head as u32, max_chunks as u32, bt as u32),
            block_dim: (ATTN_THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: as in attention_rope_naive_rows; chunks beyond a row's length exit.
        unsafe {
            self.launch(
                &sources::ATTENTION,
                K,
                cfg,
                &[
                    qkv,
                    &fa.stride,
                    rows.k_cache,
                    rows.v_cache,
                    table,
                    &post_scale,
                    rows.pos,
                    &*part_o,
                    &*part_ml,
                    &fa.n_head,
                    &fa.n_head_kv,
                    &fa.head_dim,
                    &fa.n_pos,
                    &scale,
                ],
            )
        }?;
        self.attention_combine_rows(rows, out, outq, part_o, part_ml, g, max_chunks)
    }
}

/// The shape checks the two split-K rows kernels (one-row and tiled) share: the rows, the
/// head grouping, and every buffer's size for `rows.batch` rows of `max_chunks` chunks.
#[allow(clippy::too_many_arguments)]
fn check_split_k_rows(
    k: &'static str,
    q: &CudaSlice<f32>,
    q_stride: usize,
    rows: &AttnRows,
    out: &CudaSlice<f32>,
    outq: &Option<&mut CudaSlice<BlockQ8_1>>,
    part_o: &CudaSlice<f32>,
    part_ml: &CudaSlice<f32>,
    g: RopeStoreArgs,
    max_chunks: usize,
) -> Result<(), KernelError> {
    check_rows(k, rows)?;
    if g.n_head_kv == 0 || !g.n_head.is_multiple_of(g.n_head_kv) || max_chunks == 0 {
        return Err(shape(
            k,
            format!("{g:?}, max_chunks = {max_chunks}: n_head must be a multiple of n_head_kv"),
        ));
    }
    let bt = rows.batch;
    need(k, "q", q.len(), (bt - 1) * q_stride + g.q_dim())?;
    need(k, "out", out.len(), bt * g.q_dim())?;
    check_outq(k, outq, bt, g)?;
    need(
        k,
        "part_o",
        part_o.len(),
        bt * g.n_head * max_chunks * g.head_dim,
    )?;
    need(k, "part_ml", part_ml.len(), bt * g.n_head * max_chunks * 2)
}
