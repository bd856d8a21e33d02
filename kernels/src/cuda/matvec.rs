//! Launchers of the matvec family (`matvec_mmvq.cu`, `matvec_dp4a.cu`, `matvec_float.cu`):
//! the quantized matvec in every form (single-row, two rows per warp, small-batch warp
//! forms, the batched warp form, the streaming and resident tensor-core forms), the
//! single-row matvec with the norm step as its prologue, and the float-weight matvec.
//!
//! This module owns which form a matvec takes (from its geometry and the switches
//! [`MmaResident`] and [`SmallBatch`]) and the tile constants and shared-memory sizes the
//! kernels assume; a unit test holds those to the `.cu` text. The arithmetic is the same in
//! every form; [`crate::twin::matvec`] is its definition. It does not own the device or
//! the launch itself ([`super::launch`]).

use cudarc::driver::{CudaSlice, LaunchConfig};

use super::launch::KernelArg;
use super::{DeviceWeights, FormSwitch, Gpu, int, need, shape};
use crate::blocks::{BlockQ4_0, BlockQ4_1, BlockQ8_0, BlockQ8_1, QK};
use crate::error::KernelError;
use crate::sources;
use crate::twin::MatvecFamily;

/// Rows (warps) per thread block of the mmvq matvec.
const MMVQ_ROWS: u32 = 8;

/// Rows (warps) per thread block of the single-row mmvq matvec (`matvec_mmvq_b1_*`) for
/// rows of `nb` blocks: 16 for rows of at least 4,096 columns, 8 for narrower ones. Fewer,
/// larger blocks stage the activation row half as often; that staging is a dependent read,
/// queued behind the weight loads its multiprocessor has in flight. Narrower rows measured
/// slower at 16 (the figures are in the README, "Latency-bound launches on multiprocessors
/// of their own").
fn b1_rows_per_block(nb: usize) -> u32 {
    if nb >= 128 { 16 } else { MMVQ_ROWS }
}

/// Rows per warp of the single-row mmvq form for many short rows (`matvec_mmvq_b1x2_*`),
/// taken for rows of at most 32 blocks when there are at least `MMVQ_MULTI_MIN_ROWS`.
const MMVQ_ROWS_PER_WARP: u32 = 2;

const MMVQ_MULTI_MIN_ROWS: usize = 16384;

/// The tensor-core batched mmvq tile (matvec_mmvq.cu): weight rows and batch rows per block,
/// and its threads (one warp per quarter of the 32 lane classes).
const MMA_ROWS: usize = 16;

const MMA_BATCH: usize = 16;

/// Threads per block of the tensor-core form: 8 warps, each taking 4 of the 32 lane classes.
const MMA_THREADS: u32 = 256;

/// Dynamic shared memory of the tensor-core batched mmvq kernel for weight blocks of
/// `block_bytes`: two buffers, each 16 weight rows of 32 blocks and 16 activation rows of 32
/// q8_1 blocks, rows padded to 4 mod 32 words, then the widened scales of 16 + 16 rows of 32
/// blocks, rows padded to 66 floats (`MmaTile` and `MmaSmem` in matvec_mmvq.cu).
fn mma_smem_bytes(block_bytes: usize) -> usize {
    let padded = |raw: usize| raw + (36 - raw % 32) % 32;
    let w_words = MMA_ROWS * padded((32 * block_bytes).div_ceil(4));
    let x_words = MMA_BATCH * (32 * 9 + 4);
    let scale_words = (MMA_ROWS + MMA_BATCH) * (32 * 2 + 2);
    // Three step buffers for the Q4 types, two for Q8_0 (MmaSmem::nbuf in matvec_mmvq.cu).
    let nbuf = if block_bytes <= 20 { 3 } else { 2 };
    (nbuf * (w_words + x_words) + scale_words) * 4
}

/// The resident tensor-core form (matvec_mmvq.cu): threads per block (16 warps, two row
/// halves of 8 taking the 32 lane classes 4 each) and weight rows per tile.
const MMAR_THREADS: u32 = 512;

const MMAR_ROWS: usize = 32;

/// Dynamic shared memory of the resident tensor-core form (`MmarSmem` in matvec_mmvq.cu) for
/// weight blocks of `block_bytes`, rows of `nb` blocks and batch tiles of `bt` (16 or 8)
/// rows: the ring's barriers (16 words), the weight steps of 32 rows (four for the Q4 types,
/// two for Q8_0), two sets of the 16 warps' class sums (`bt / 2` pairs each), then per
/// 32-block step of the row the batch tile's activation quants (`bt` rows of
/// `MMAR_XR_WORDS`) and widened scales (`bt / 2` row pairs of `MMAR_XS_FLOATS`).
fn mmar_smem_bytes(block_bytes: usize, nb: usize, bt: usize) -> usize {
    let padded = |raw: usize| raw + (36 - raw % 32) % 32;
    let nbuf = if block_bytes <= 20 { 4 } else { 2 };
    let w_words = MMAR_ROWS * padded((32 * block_bytes).div_ceil(4));
    let head = 16 + nbuf * w_words + 2 * (MMAR_THREADS as usize / 32) * (bt / 2) * 32;
    let per_step = bt * (32 * 8 + 8) + bt / 2 * (32 * 4 + 4);
    (head + nb.div_ceil(32) * per_step) * 4
}

/// The resident form's batch tile for `batch` rows of `nb` weight blocks of `block_bytes` on
/// a device allowing `smem_optin` bytes of shared memory per block: 16 rows where their
/// activations fit, else 8 (rows of 11008 columns), else none (the streaming form runs); 8
/// rows first for a batch of at most 8, whose 16-row tile would compute as many dead rows
/// as live ones or more.
fn mmar_batch_tile_for(
    block_bytes: usize,
    nb: usize,
    batch: usize,
    smem_optin: usize,
) -> Option<usize> {
    let order = if batch <= 8 { [8, 16] } else { [16, 8] };
    order
        .into_iter()
        .find(|&bt| mmar_smem_bytes(block_bytes, nb, bt) <= smem_optin)
}

/// Whether the resident form, in `Auto`, takes a matvec of `rows` rows and `batch` batch
/// rows at batch tile `tile` on a device of `sm_count` multiprocessors: when its tiles (32
/// rows by `tile`, one block per multiprocessor) number at least half the multiprocessors.
/// Below that the streaming form's tiles of 16 x 16, two blocks per multiprocessor, keep
/// more of the device busy (SmolLM2's 576-row matvecs at B = 16: 18 resident tiles, 36
/// streaming ones).
fn mmar_auto_takes(rows: usize, batch: usize, tile: usize, sm_count: usize) -> bool {
    2 * rows.div_ceil(MMAR_ROWS) * batch.div_ceil(tile) >= sm_count
}

/// Steps of 32 weight blocks the resident form's ring copies ahead of the one computed, for a
/// batch of `batch` rows in tiles of `tile`: two for batches of at most 8 rows in 8-row tiles
/// (`matvec_mmvq_mmar2_*`), whose steps are short, one otherwise (`matvec_mmvq_mmar_*`),
/// where the warps' room to drift apart is worth more. The distance is a compile-time
/// constant of two kernels because as a kernel argument it slowed the 16-row tiles' loop
/// (the sweep is in the README, "The sweeps behind the batched forms' rules").
fn mmar_ahead(batch: usize, tile: Option<usize>) -> usize {
    if batch <= 8 && tile == Some(8) { 2 } else { 1 }
}

/// The small-batch warp forms (`matvec_mmvq_b2_*`, `matvec_mmvq_b4_*`): the warp form with
/// two or four accumulators per lane instead of eight, and the single-row form's blocks of
/// 16 rows for rows of 4,096 columns and more. `MEMRA_SMALL_BATCH=0` never takes them,
/// `=1` takes them for every batch of 2 to 4 rows, otherwise (the default) two rows take
/// the two-row form and three or four rows the four-row form on rows of fewer than 128
/// blocks, where the tensor-core forms have too little work per block. A performance
/// switch only: every form computes the same bits (the measurements behind the rule are in
/// the README, "The sweeps behind the batched forms' rules").
pub type SmallBatch = FormSwitch;

/// The accumulators per lane of the small-batch form a batch of `batch` rows of `nb` weight
/// blocks takes under `mode` (2 or 4), or none.
fn small_batch_width(mode: SmallBatch, batch: usize, nb: usize) -> Option<u32> {
    match (mode, batch) {
        (SmallBatch::Never, _) => None,
        (_, 2) => Some(2),
        (SmallBatch::Always, 3..=4) => Some(4),
        (SmallBatch::Auto, 3..=4) if nb < 128 => Some(4),
        _ => None,
    }
}

/// The small-batch form's kernels of `width` accumulators, by weight type.
fn small_batch_names(width: u32) -> [&'static str; 3] {
    if width == 2 {
        [
            "matvec_mmvq_b2_q4_0",
            "matvec_mmvq_b2_q4_1",
            "matvec_mmvq_b2_q8_0",
        ]
    } else {
        [
            "matvec_mmvq_b4_q4_0",
            "matvec_mmvq_b4_q4_1",
            "matvec_mmvq_b4_q8_0",
        ]
    }
}

/// When batched tensor-core matvecs take the resident form (`matvec_mmvq_mmar_*`) rather
/// than the streaming one (`matvec_mmvq_mma_*`): `MEMRA_MMA_RESIDENT=0` never, `=1` always
/// where the activations fit in shared memory, otherwise (the default) where they fit and
/// the matvec has tiles for at least half the device (`mmar_auto_takes`). A performance
/// switch only: every form computes the same bits.
pub type MmaResident = FormSwitch;

impl Gpu {
    /// Switches the tensor-core form of batched mmvq matvecs on (where the device has the
    /// int8 MMA) or off; kernel-check runs both forms. Returns whether it is on.
    pub fn set_int8_mma(&self, on: bool) -> bool {
        let on = on && self.has_int8_mma;
        self.int8_mma
            .store(on, std::sync::atomic::Ordering::Relaxed);
        on
    }

    /// Whether batched mmvq matvecs take the tensor-core form now.
    pub fn int8_mma(&self) -> bool {
        self.int8_mma.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Sets when the resident tensor-core form runs (activations kept in shared memory,
    /// weights streamed over a grid that fills the device once); kernel-check runs every
    /// form by setting `Always` and `Never`.
    pub fn set_mma_resident(&self, mode: MmaResident) {
        self.mma_resident
            .store(mode as u8, std::sync::atomic::Ordering::Relaxed);
    }

    /// When the resident tensor-core form runs now.
    pub fn mma_resident(&self) -> MmaResident {
        FormSwitch::from_index(self.mma_resident.load(std::sync::atomic::Ordering::Relaxed))
    }

    /// Sets when batches of two to four rows take the small-batch warp forms; kernel-check
    /// runs them by setting `Always`, and the other forms with `Never`.
    pub fn set_small_batch(&self, mode: SmallBatch) {
        self.small_batch
            .store(mode as u8, std::sync::atomic::Ordering::Relaxed);
    }

    /// When the small-batch warp forms run now.
    pub fn small_batch(&self) -> SmallBatch {
        FormSwitch::from_index(self.small_batch.load(std::sync::atomic::Ordering::Relaxed))
    }

    /// Whether a batched tensor-core matvec over rows of `cols` columns of weight blocks of
    /// `block_bytes` bytes can take the resident form: its activations fit in the shared
    /// memory one block may have.
    pub fn mma_resident_fits(&self, block_bytes: usize, cols: usize) -> bool {
        mmar_batch_tile_for(block_bytes, cols.div_ceil(QK), 16, self.smem_optin).is_some()
    }

    /// The resident form's batch tile for a matvec of `rows` rows of `cols` columns and
    /// `batch` batch rows, or none where the streaming form runs ([`MmaResident`]).
    fn mmar_batch_tile(
        &self,
        block_bytes: usize,
        rows: usize,
        cols: usize,
        batch: usize,
    ) -> Option<usize> {
        let mode = self.mma_resident();
        if mode == MmaResident::Never {
            return None;
        }
        let tile = mmar_batch_tile_for(block_bytes, cols.div_ceil(QK), batch, self.smem_optin)?;
        (mode == MmaResident::Always || mmar_auto_takes(rows, batch, tile, self.sm_count as usize))
            .then_some(tile)
    }

    /// Test-only plumbing defect for gate canaries: every quantized matvec drops the last
    /// block of `row`. `None` switches it off.
    pub fn set_matvec_canary(&mut self, row: Option<usize>) {
        self.canary_row = row.map_or(-1, |r| r.min(i32::MAX as usize) as i32);
    }

    /// The dynamic shared memory of the tensor-core matvec for weight blocks of
    /// `block_bytes` bytes.
    pub fn mma_smem(&self, block_bytes: usize) -> usize {
        mma_smem_bytes(block_bytes)
    }

    /// The dynamic shared memory of the resident tensor-core matvec for weight blocks of
    /// `block_bytes` bytes and rows of `cols` columns, at the batch tile it takes there (0
    /// where it does not run).
    pub fn mmar_smem(&self, block_bytes: usize, cols: usize) -> usize {
        mmar_batch_tile_for(block_bytes, cols.div_ceil(QK), 16, self.smem_optin)
            .map_or(0, |bt| mmar_smem_bytes(block_bytes, cols.div_ceil(QK), bt))
    }

    /// The kernels of `family` for (Q4_0, Q4_1, Q8_0) weights: a single row takes the one-row
    /// kernels (smaller code, the same arithmetic), several the batched ones, `mma` their
    /// tensor-core form.
    fn matvec_names(&self, family: MatvecFamily, batch: usize, mma: bool) -> [&'static str; 3] {
        match family {
            MatvecFamily::Mmvq if batch == 1 => [
                "matvec_mmvq_b1_q4_0",
                "matvec_mmvq_b1_q4_1",
                "matvec_mmvq_b1_q8_0",
            ],
            MatvecFamily::Mmvq if mma => [
                "matvec_mmvq_mma_q4_0",
                "matvec_mmvq_mma_q4_1",
                "matvec_mmvq_mma_q8_0",
            ],
            MatvecFamily::Mmvq => ["matvec_mmvq_q4_0", "matvec_mmvq_q4_1", "matvec_mmvq_q8_0"],
            MatvecFamily::Dp4a => ["matvec_dp4a_q4_0", "matvec_dp4a_q4_1", "matvec_dp4a_q8_0"],
        }
    }

    /// Quantized matvec of `family`: `y[b] = W · x[b]` for `batch` q8_1 rows (`y`: `batch *
    /// rows`, row after row). Every batch row has the B = 1 arithmetic.
    #[allow(clippy::too_many_arguments)]
    pub fn matvec(
        &self,
        family: MatvecFamily,
        w: DeviceWeights,
        rows: usize,
        cols: usize,
        x: &CudaSlice<BlockQ8_1>,
        batch: usize,
        y: &mut CudaSlice<f32>,
    ) -> Result<(), KernelError> {
        self.matvec_with(family, w, rows, cols, x, batch, None, y)
    }

    /// The single-row mmvq matvec `y = (W · x) * post[0]`: the fused tier's head with its
    /// post-scale (one multiply, [`Gpu::scale`]'s) applied as each result is written, the
    /// same bits as [`Gpu::matvec`] then [`Gpu::scale`] in one launch.
    pub fn matvec_scaled_b1(
        &self,
        w: DeviceWeights,
        rows: usize,
        cols: usize,
        x: &CudaSlice<BlockQ8_1>,
        post: &CudaSlice<f32>,
        y: &mut CudaSlice<f32>,
    ) -> Result<(), KernelError> {
        self.matvec_with(MatvecFamily::Mmvq, w, rows, cols, x, 1, Some(post), y)
    }

    #[allow(clippy::too_many_arguments)]
    // Over 150 lines: the choice among the matvec forms (tensor-core, small-batch warp,
    // one-row) and the launch of the chosen one; the shared checks stay in front of all three.
    fn matvec_with(
        &self,
        family: MatvecFamily,
        w: DeviceWeights,
        rows: usize,
        cols: usize,
        x: &CudaSlice<BlockQ8_1>,
        batch: usize,
        post: Option<&CudaSlice<f32>>,
        y: &mut CudaSlice<f32>,
    ) -> Result<(), KernelError> {
        // Several rows on a device with int8 MMA take the tensor-core form: the same
        // composition, bit for bit (matvec_mmvq.cu says how), at a fraction of the
        // instructions per weight block. It needs its shared memory; without it the warp
        // form runs.
        let (ty, block_bytes) = match w {
            DeviceWeights::Q4_0(_) => (0, std::mem::size_of::<BlockQ4_0>()),
            DeviceWeights::Q4_1(_) => (1, std::mem::size_of::<BlockQ4_1>()),
            DeviceWeights::Q8_0(_) => (2, std::mem::size_of::<BlockQ8_0>()),
            _ => (0, 0),
        };
        // Two to four rows may take the warp form with as many accumulators (SmallBatch).
        let small = match family {
            MatvecFamily::Mmvq if block_bytes > 0 => {
                small_batch_width(self.small_batch(), batch, cols.div_ceil(QK))
            }
            _ => None,
        };
        let mut mma = small.is_none()
            && family == MatvecFamily::Mmvq
            && batch > 1
            && block_bytes > 0
            && self.int8_mma();
        // Rows short enough for the batch tile's activations to stay in shared memory take
        // the resident form where it has tiles for the device (MmaResident), the others the
        // streaming one.
        let resident_tile = if mma {
            self.mmar_batch_tile(block_bytes, rows, cols, batch)
        } else {
            None
        };
        let resident = resident_tile.is_some();
        let mma_bytes = match resident_tile {
            Some(bt) => mmar_smem_bytes(block_bytes, cols.div_ceil(QK), bt),
            None => mma_smem_bytes(block_bytes),
        };
        // The tensor-core kernel's handle, looked up once: reused for the launch below.
        let mut mma_f = None;
        let mut mma_name = "";
        if mma {
            let k = if resident && mmar_ahead(batch, resident_tile) == 2 {
                [
                    "matvec_mmvq_mmar2_q4_0",
                    "matvec_mmvq_mmar2_q4_1",
                    "matvec_mmvq_mmar2_q8_0",
                ][ty]
            } else if resident {
                [
                    "matvec_mmvq_mmar_q4_0",
                    "matvec_mmvq_mmar_q4_1",
                    "matvec_mmvq_mmar_q8_0",
                ][ty]
            } else {
                self.matvec_names(family, batch, true)[ty]
            };
            let f = self.func(&sources::MATVEC_MMVQ, k)?;
            mma = self.allow_dynamic_smem(k, &f, mma_bytes);
            mma_f = mma.then_some(f);
            mma_name = k;
        }
        // Many short single rows (the output head) take two rows per warp.
        let multi = family == MatvecFamily::Mmvq
            && batch == 1
            && cols.div_ceil(QK) <= 32
            && rows >= MMVQ_MULTI_MIN_ROWS;
        let (src, names) = (
            match family {
                MatvecFamily::Mmvq => &sources::MATVEC_MMVQ,
                MatvecFamily::Dp4a => &sources::MATVEC_DP4A,
            },
            if multi {
                [
                    "matvec_mmvq_b1x2_q4_0",
                    "matvec_mmvq_b1x2_q4_1",
                    "matvec_mmvq_b1x2_q8_0",
                ]
            } else if let Some(width) = small {
                small_batch_names(width)
            } else {
                self.matvec_names(family, batch, mma)
            },
        );
        let (k, wlen) = match w {
            DeviceWeights::Q4_0(s) => (names[0], s.len()),
            DeviceWeights::Q4_1(s) => (names[1], s.len()),
            DeviceWeights::Q8_0(s) => (names[2], s.len()),
            _ => {
                return Err(shape(
                    names[0],
                    "float weights take f32 activations: call matvec_float".into(),
                ));
            }
        };
        // The tensor-core forms' names are not among the family's list.
        let k = if mma { mma_name } else { k };
        if !cols.is_multiple_of(QK) || cols == 0 || batch == 0 {
            return Err(shape(
                k,
                format!(
                    "cols = {cols} must be a positive multiple of 32 and batch = {batch} positive"
                ),
            ));
        }
        let nb = cols / QK;
        need(k, "w", wlen, rows * nb)?;
        need(k, "x", x.len(), batch * nb)?;
        need(k, "y", y.len(), batch * rows)?;
        if let Some(p) = post {
            need(k, "post", p.len(), batch)?;
        }
        let (r, n, bt) = (
            int(k, "rows", rows)?,
            int(k, "cols / 32", nb)?,
            int(k, "batch", batch)?,
        );
        let canary = self.canary_row;
        let f = match mma_f {
            Some(f) => f,
            None => self.func(src, k)?,
        };
        let groups = batch.div_ceil(8) as u32;
        // mmvq stages the group's activation rows in shared memory when they fit the
        // opt-in limit (see matvec_mmvq.cu); otherwise it reads them from global memory.
        let x_bytes = batch.min(8) * nb * std::mem::size_of::<BlockQ8_1>();
        let x_smem =
            family == MatvecFamily::Mmvq && !mma && self.allow_dynamic_smem(k, &f, x_bytes);
        let cfg = match family {
            _ if mma && resident => {
                // One batch tile per `per` blocks, every block resident at once: the grid fills
                // the device, each block walking its batch tile's row tiles.
                let nbt = batch.div_ceil(resident_tile.unwrap_or(MMA_BATCH));
                let slots =
                    (self.sm_count * self.blocks_per_sm(k, &f, MMAR_THREADS, mma_bytes)) as usize;
                let per = (slots / nbt).clamp(1, rows.div_ceil(MMAR_ROWS));
                LaunchConfig {
                    grid_dim: ((nbt * per) as u32, 1, 1),
                    block_dim: (MMAR_THREADS, 1, 1),
                    shared_mem_bytes: mma_bytes as u32,
                }
            }
            _ if mma => LaunchConfig {
                grid_dim: (
                    batch.div_ceil(MMA_BATCH) as u32,
                    rows.div_ceil(MMA_ROWS) as u32,
                    1,
                ),
                block_dim: (MMA_THREADS, 1, 1),
                shared_mem_bytes: mma_bytes as u32,
            },
            MatvecFamily::Mmvq if multi => LaunchConfig {
                grid_dim: ((rows as u32).div_ceil(MMVQ_ROWS * MMVQ_ROWS_PER_WARP), 1, 1),
                block_dim: (32 * MMVQ_ROWS, 1, 1),
                shared_mem_bytes: if x_smem { x_bytes as u32 } else { 0 },
            },
            MatvecFamily::Mmvq => {
                let rpb = if batch == 1 || small.is_some() {
                    b1_rows_per_block(nb)
                } else {
                    MMVQ_ROWS
                };
                LaunchConfig {
                    grid_dim: ((rows as u32).div_ceil(rpb), groups, 1),
                    block_dim: (32 * rpb, 1, 1),
                    shared_mem_bytes: if x_smem { x_bytes as u32 } else { 0 },
                }
            }
            MatvecFamily::Dp4a => LaunchConfig {
                grid_dim: (rows as u32, groups, 1),
                block_dim: (128, 1, 1),
                shared_mem_bytes: 0,
            },
        };
        let (bt8, x_smem_arg) = (i32::from(resident_tile == Some(8)), i32::from(x_smem));
        let mut args: Vec<&dyn KernelArg> = vec![w.arg(), x, y, &r, &n, &bt, &canary];
        if mma && resident {
            args.push(&bt8);
        }
        if family == MatvecFamily::Mmvq && !mma {
            args.push(&x_smem_arg);
            if batch == 1 {
                args.push(&post);
            }
        }
        // SAFETY: the kernel reads rows*nb weight blocks, batch*nb activation blocks and writes
        // batch*rows floats, all checked above; the grid covers rows and ceil(batch/8) groups
        // and the kernel bounds-checks both.
        unsafe { self.launch_func(&f, k, cfg, &args) }
    }

    /// Float-weight matvec: `y[b] = W · x[b]` for `batch` f32 rows of `cols`.
    #[allow(clippy::too_many_arguments)]
    pub fn matvec_float(
        &self,
        w: DeviceWeights,
        rows: usize,
        cols: usize,
        x: &CudaSlice<f32>,
        batch: usize,
        y: &mut CudaSlice<f32>,
    ) -> Result<(), KernelError> {
        let (k, wlen) = match w {
            DeviceWeights::F32(s) => ("matvec_float_f32", s.len()),
            DeviceWeights::F16(s) => ("matvec_float_f16", s.len()),
            DeviceWeights::BF16(s) => ("matvec_float_bf16", s.len()),
            _ => {
                return Err(shape(
                    "matvec_float_f32",
                    "quantized weights take q8_1 activations: call matvec".into(),
                ));
            }
        };
        need(k, "w", wlen, rows * cols)?;
        need(k, "x", x.len(), batch * cols)?;
        need(k, "y", y.len(), batch * rows)?;
        let (r, c) = (int(k, "rows", rows)?, int(k, "cols", cols)?);
        let cfg = LaunchConfig {
            grid_dim: ((rows as u32).div_ceil(4), batch as u32, 1),
            block_dim: (128, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: reads rows*cols weights and batch*cols activations, writes batch*rows
        // outputs, all checked above; the kernel bounds-checks rows.
        unsafe { self.launch(&sources::MATVEC_FLOAT, k, cfg, &[w.arg(), x, y, &r, &c]) }
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
        // SAFETY: the kernel reads rows * nb weight blocks and cols values of x, delta and g,
        // writes rows values of y, cols of x_out and one r (block 0); all checked above, null
        // optional pointers are tested by the kernel. The dynamic shared memory holds the
        // staged row (nb blocks, below the 48 KiB default for cols <= 1024).
        unsafe {
            self.launch(
                &sources::MATVEC_MMVQ,
                k,
                Self::b1_config(rows, nb),
                &[
                    w.arg(),
                    y,
                    &r,
                    &n,
                    &canary,
                    x,
                    &delta,
                    g,
                    x_out,
                    &r_out,
                    &eps,
                ],
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Single rows of 4,096 columns and more take blocks of 16 rows, narrower ones 8.
    #[test]
    fn wide_single_rows_take_sixteen_row_blocks() {
        assert_eq!(b1_rows_per_block(128), 16);
        assert_eq!(b1_rows_per_block(344), 16);
        assert_eq!(b1_rows_per_block(127), 8);
        assert_eq!(b1_rows_per_block(48), 8);
        assert_eq!(b1_rows_per_block(18), 8);
    }

    /// Batches of at most 8 rows in 8-row tiles take the two-step ring, the rest one.
    #[test]
    fn short_tiles_copy_two_steps_ahead() {
        assert_eq!(mmar_ahead(2, Some(8)), 2);
        assert_eq!(mmar_ahead(8, Some(8)), 2);
        assert_eq!(mmar_ahead(9, Some(8)), 1);
        assert_eq!(mmar_ahead(64, Some(16)), 1);
        assert_eq!(mmar_ahead(8, Some(16)), 1);
    }

    /// The launchers' tile constants and buffer sizes agree with the kernels'.
    #[test]
    fn tile_constants_match_the_kernel_sources() {
        let text = sources::MATVEC_MMVQ.text;
        assert!(text.contains(&format!("#define MMA_ROWS {MMA_ROWS}\n")));
        assert!(text.contains(&format!("#define MMA_BATCH {MMA_BATCH}\n")));
        assert!(text.contains(&format!("#define MMA_THREADS {MMA_THREADS}\n")));
        assert!(text.contains(&format!(
            "#define MMVQ_ROWS_PER_WARP {MMVQ_ROWS_PER_WARP}\n"
        )));
        assert!(text.contains("#define MMA_XS_WORDS (32 * 9 + 4)\n"));
        assert!(text.contains("#define MMA_SC_STRIDE (32 * 2 + 2)\n"));
        // Q4_1 and Q4_0 rows pad to 164 words, Q8_0 rows to 292, activation rows are 292,
        // and 32 rows of scales take 66 floats each; three step buffers for Q4, two for Q8_0.
        let scales = 32 * 66 * 4;
        assert_eq!(mma_smem_bytes(20), 3 * (16 * 164 + 16 * 292) * 4 + scales);
        assert_eq!(mma_smem_bytes(18), 3 * (16 * 164 + 16 * 292) * 4 + scales);
        assert_eq!(mma_smem_bytes(34), 2 * (16 * 292 + 16 * 292) * 4 + scales);
        // The resident form: four weight steps of 32 rows for Q4 (two for Q8_0), two sets of
        // 16 warps x bt/2 pairs x 32 lanes of class sums, then per step bt activation rows of
        // 264 words and bt/2 row pairs of 132 scale floats.
        assert!(text.contains(&format!("#define MMAR_THREADS {MMAR_THREADS}\n")));
        assert!(text.contains(&format!("#define MMAR_ROWS {MMAR_ROWS}\n")));
        assert!(text.contains("#define MMAR_XR_WORDS (32 * 8 + 8)\n"));
        assert!(text.contains("#define MMAR_XS_FLOATS (32 * 4 + 4)\n"));
        assert!(text.contains("#define MMAR_BAR_WORDS 16\n"));
        let head = |nbuf: usize, w_row: usize, bt: usize| {
            (16 + nbuf * 32 * w_row + 2 * 16 * (bt / 2) * 32) * 4
        };
        let step = |bt: usize| (bt * 264 + bt / 2 * 132) * 4;
        assert_eq!(
            mmar_smem_bytes(20, 128, 16),
            head(4, 164, 16) + 4 * step(16)
        );
        assert_eq!(
            mmar_smem_bytes(34, 128, 16),
            head(2, 292, 16) + 4 * step(16)
        );
        assert_eq!(mmar_smem_bytes(20, 18, 16), head(4, 164, 16) + step(16));
        assert_eq!(mmar_smem_bytes(20, 344, 8), head(4, 164, 8) + 11 * step(8));
        // On the H200's 227 KiB per block: 4096 columns take 16-row batch tiles, 11008
        // columns 8-row ones, and rows past what 8 rows fit in take the streaming form; on a
        // device allowing 99 KiB (sm_86) 4096 columns do not fit at all.
        let h200 = 227 * 1024;
        for bytes in [18, 20, 34] {
            assert_eq!(mmar_batch_tile_for(bytes, 128, 64, h200), Some(16));
            assert_eq!(mmar_batch_tile_for(bytes, 128, 9, h200), Some(16));
            assert_eq!(mmar_batch_tile_for(bytes, 128, 8, h200), Some(8));
            assert_eq!(mmar_batch_tile_for(bytes, 18, 64, h200), Some(16));
            assert_eq!(mmar_batch_tile_for(bytes, 344, 64, h200), Some(8));
            assert_eq!(mmar_batch_tile_for(bytes, 344, 2, h200), Some(8));
            assert_eq!(mmar_batch_tile_for(bytes, 1024, 64, h200), None);
            assert_eq!(mmar_batch_tile_for(bytes, 128, 64, 99 * 1024), None);
        }
        // Auto on the H200's 132 multiprocessors: llama-7B's matvecs take the resident form
        // from B = 2 up, SmolLM2's 576-row ones only from B = 64 (72 tiles), its 1536-row ones
        // from B = 32.
        assert!(mmar_auto_takes(4096, 2, 8, 132));
        assert!(mmar_auto_takes(4096, 64, 16, 132));
        assert!(!mmar_auto_takes(576, 16, 16, 132));
        assert!(mmar_auto_takes(576, 64, 16, 132));
        assert!(!mmar_auto_takes(1536, 16, 16, 132));
        assert!(mmar_auto_takes(1536, 32, 16, 132));
        assert!(mmar_auto_takes(49152, 2, 8, 132));
        for switch in [FormSwitch::Never, FormSwitch::Auto, FormSwitch::Always] {
            assert_eq!(FormSwitch::from_index(switch as u8), switch);
        }
    }
}
