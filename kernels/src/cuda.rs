//! The CUDA side: a device context and stream, lazy per-family module loading through
//! [`crate::compile`], and one typed launcher per kernel. Launchers check every length against
//! the geometry they are given and return [`KernelError::Shape`] instead of launching out of
//! bounds; driver failures come back as [`KernelError::Driver`], never as a panic.
//!
//! [`probe`] must succeed before anything here touches CUDA: cudarc loads the libraries
//! dynamically and panics on a missing one. [`Gpu::open`] calls it.
//!
//! Layouts are the twins' (see [`crate::twin`]): batched activations and outputs are row after
//! row, the KV cache is position-major `[t][kv_head][d]`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::blocks::{BlockQ4_0, BlockQ4_1, BlockQ8_0, BlockQ8_1, QK};
use crate::compile::{self, CompiledPtx, PtxCache};
use crate::error::KernelError;
use crate::sources::{self, KernelSource};
use crate::twin::{AttnShape, MatvecFamily, SAMPLE_THREADS, SPLIT_K_CHUNK};
mod launch;
mod peer;
mod rows;

use launch::Launch;

pub use peer::{Fence, copy_peer};
pub use rows::{AttnRows, RopeStoreArgs, attention_can_quantize};
pub use crate::tuning::{FormSwitch, Tuning};

use cudarc::driver::{
    CudaContext, CudaFunction, CudaModule, CudaSlice, CudaStream, DeviceRepr, LaunchConfig,
    ValidAsZeroBits,
};

// SAFETY: the block types are `#[repr(C)]` plain data of f16/u8/i8 fields with the exact size
// `common.cuh` declares (asserted in blocks.rs and by static_assert in the header), and any
// bit pattern, all-zero included, is a valid value of each.
unsafe impl DeviceRepr for BlockQ4_0 {}
unsafe impl DeviceRepr for BlockQ4_1 {}
unsafe impl DeviceRepr for BlockQ8_0 {}
unsafe impl DeviceRepr for BlockQ8_1 {}
unsafe impl ValidAsZeroBits for BlockQ4_0 {}
unsafe impl ValidAsZeroBits for BlockQ4_1 {}
unsafe impl ValidAsZeroBits for BlockQ8_0 {}
unsafe impl ValidAsZeroBits for BlockQ8_1 {}

/// Checks that libcuda and libnvrtc can be loaded; returns the NVRTC version.
pub fn probe() -> Result<(i32, i32), KernelError> {
    // SAFETY: `is_culib_present` only tries to open the library by its candidate names.
    if !unsafe { cudarc::driver::sys::is_culib_present() } {
        return Err(KernelError::Unavailable {
            library: "libcuda",
            detail: "no libcuda.so found on the library path (no NVIDIA driver?)".into(),
        });
    }
    compile::nvrtc_version()
}

/// Rows (warps) per thread block of the mmvq matvec.
const MMVQ_ROWS: u32 = 8;
/// Rows (warps) per thread block of the single-row mmvq matvec (`matvec_mmvq_b1_*`) for
/// rows of `nb` blocks: 16 for rows of at least 4,096 columns, 8 for narrower ones. Fewer,
/// larger blocks stage the activation row half as often; that staging is a dependent read,
/// queued behind the weight loads its multiprocessor has in flight. Measured on the H200
/// (B=1, graphs, alternating in one run): llama-7B Q4_1 613 tokens/s at 16 rows against
/// 593–599 at 8, 543 at 4 and 552–554 at 32; SmolLM2 (576 and 1,536 columns) 2,352–2,398
/// at 16 against 2,427–2,429 at 8. On a second machine, with this rule against 8 rows
/// throughout: llama-7B 604–610 against 598–600.
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
/// argmax_f32 (sample.cu): threads per block and elements per block.
const ARGMAX_THREADS: u32 = 256;
const ARGMAX_CHUNK: usize = ARGMAX_THREADS as usize * 8;

/// Words of scratch [`Gpu::argmax`] needs for `batch` rows of `n` logits: per row a counter
/// and each chunk's best value and index.
pub fn argmax_scratch_len(batch: usize, n: usize) -> usize {
    batch * (1 + 2 * n.div_ceil(ARGMAX_CHUNK))
}

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
/// where the warps' room to drift apart is worth more. Measured on the H200 with the distance
/// as a kernel argument for every batch (llama-7B Q4_1, graphs, tokens/s, two rounds in one
/// run; SmolLM2 moved within 1.5 % either way). As an argument it cost the 16-row tiles'
/// loop about 1.5 % at B=64, so the distance is now a compile-time constant of two kernels:
///
/// | ahead | B=2 | B=4 | B=8 | B=16 | B=32 | B=64 |
/// |---|---|---|---|---|---|---|
/// | 1 | 871–875 | 1,702–1,714 | 3,293–3,301 | 4,672–4,674 | 5,595 | 6,295–6,318 |
/// | 2 | 903–904 | 1,769–1,770 | 3,435–3,451 | 4,684–4,704 | 5,623–5,635 | 6,288–6,317 |
/// | 3 | 881 | 1,726–1,727 | 3,325–3,337 | 4,574–4,591 | 5,462–5,476 | 6,111–6,139 |
fn mmar_ahead(batch: usize, tile: Option<usize>) -> usize {
    if batch <= 8 && tile == Some(8) { 2 } else { 1 }
}

/// The small-batch warp forms (`matvec_mmvq_b2_*`, `matvec_mmvq_b4_*`): the warp form with
/// two or four accumulators per lane instead of eight, and the single-row form's blocks of
/// 16 rows for rows of 4,096 columns and more. `MEMRA_SMALL_BATCH=0` never takes them,
/// `=1` takes them for every batch of 2 to 4 rows, otherwise (the default) two rows take
/// the two-row form and three or four rows the four-row form on rows of fewer than 128
/// blocks, where the tensor-core forms have too little work per block. A performance
/// switch only: every form computes the same bits. Measured on the H200 (graphs, tokens/s,
/// two rounds in one run; the tensor-core form with its ring two steps ahead):
///
/// | shape | form | B=2 | B=3 | B=4 |
/// |---|---|---|---|---|
/// | llama-7B Q4_1 (128 and 344 blocks) | tensor-core | 899–902 | 1,331–1,334 | 1,756–1,764 |
/// | | two-row / four-row | 985–993 | 1,229–1,238 | 1,432–1,441 |
/// | SmolLM2 Q4_1 (18 and 48 blocks) | tensor-core (ring one ahead) | 3,242 | 4,878 | 6,556 |
/// | | two-row / four-row | 4,112 | 5,526 | 7,030 |
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
/// the matvec has tiles for at least half the device ([`mmar_auto_takes`]). A performance
/// switch only: every form computes the same bits.
pub type MmaResident = FormSwitch;

/// Dynamic shared memory a launch may use without opting in.
const DEFAULT_DYNAMIC_SMEM: usize = 48 * 1024;

/// Threads per block of the elementwise kernels.
const EW_THREADS: u32 = 256;

/// Weights already on the device, row-major. F16 and BF16 weights travel as their raw 16-bit
/// patterns (`f16::to_bits` / `bf16::to_bits`), which is what the kernels read.
#[derive(Debug, Clone, Copy)]
pub enum DeviceWeights<'a> {
    Q4_0(&'a CudaSlice<BlockQ4_0>),
    Q4_1(&'a CudaSlice<BlockQ4_1>),
    Q8_0(&'a CudaSlice<BlockQ8_0>),
    F32(&'a CudaSlice<f32>),
    F16(&'a CudaSlice<u16>),
    BF16(&'a CudaSlice<u16>),
}

/// A kernel's per-thread and per-block resources ([`Gpu::kernel_resources`]).
#[derive(Debug, Clone, Copy)]
pub struct KernelResources {
    pub registers: i32,
    pub local_bytes: i32,
    pub static_smem: i32,
    pub blocks_per_sm: u32,
}

/// One device with its stream and loaded kernel modules.
pub struct Gpu {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    arch: &'static str,
    /// Whether batched mmvq matvecs take the int8 tensor-core form: the device has the MMA
    /// (sm_80 and newer) and `MEMRA_MMA=0` did not switch it off when the device was opened.
    /// A performance switch only, like `pdl`: both forms compute the same bits.
    int8_mma: std::sync::atomic::AtomicBool,
    /// Whether the device has the int8 MMA at all.
    has_int8_mma: bool,
    name: String,
    nvrtc: (i32, i32),
    cache: Option<PtxCache>,
    modules: Mutex<HashMap<&'static str, Arc<CudaModule>>>,
    functions: Mutex<HashMap<&'static str, CudaFunction>>,
    compiled: Mutex<Vec<CompiledPtx>>,
    canary_row: i32,
    /// Whether launches carry the programmatic-dependent-launch attribute ([`launch`]):
    /// on unless `MEMRA_PDL=0` when the device is opened. A performance switch only: every
    /// kernel waits for its predecessor's results either way, so the bits do not change.
    pdl: bool,
    /// The most dynamic shared memory one block may opt into on this device.
    smem_optin: usize,
    /// The kernels whose dynamic shared memory limit is already raised, with that limit
    /// (`smem_optin` less the kernel's static shared memory).
    opted_in: Mutex<HashMap<&'static str, usize>>,
    /// When batched tensor-core matvecs take the resident form ([`MmaResident`], from
    /// `MEMRA_MMA_RESIDENT` when the device is opened), stored as its index.
    mma_resident: std::sync::atomic::AtomicU8,
    /// When batches of two to four rows take the small-batch warp forms ([`SmallBatch`],
    /// from `MEMRA_SMALL_BATCH` when the device is opened), stored as its index.
    small_batch: std::sync::atomic::AtomicU8,
    /// Multiprocessors of the device (the resident form's grid fills them once).
    sm_count: u32,
    /// Resident blocks per multiprocessor of a kernel at a dynamic shared memory size, as the
    /// driver reported it (asked once per pair).
    occupancy: Mutex<HashMap<(&'static str, usize), u32>>,
    /// Whether the single-row norm step and decode attention hold their multiprocessors
    /// alone ([`claims_sm`]): on unless `MEMRA_CLAIM_SM=0` when the device is opened. A
    /// performance switch only, like `pdl`: it moves blocks, not bits.
    claim_sm: bool,
    /// `MEMRA_PROLOGUES` as the device was opened with it; the engine's step encoder reads
    /// it ([`Gpu::tuning`]), no kernel here does.
    prologues: bool,
}

/// Whether a latency-bound launch of `blocks` thread blocks (the single-row norm step, the
/// single-row decode attention) takes whole multiprocessors, at most a quarter of the
/// device's `sm_count`. A load waits behind the loads its multiprocessor already has in
/// flight, and the next matvec's blocks, resident beside the launch before their wait
/// (programmatic dependent launch), put some 80–160 KB of weight loads on each
/// multiprocessor, ahead of the launch's reads of its predecessor's output. Measured on the
/// H200 (llama-7B shape, B=1): the norm step's 16 blocks and the attention's 32 on
/// multiprocessors of their own took the step from 573 to 603 tokens/s; SwiGLU's 43 blocks
/// on their own cost 2 %, so larger launches keep sharing.
pub fn claims_sm(blocks: u32, sm_count: u32) -> bool {
    blocks > 0 && blocks <= sm_count / 4
}

fn shape(kernel: &'static str, message: String) -> KernelError {
    KernelError::Shape { kernel, message }
}

fn need(kernel: &'static str, what: &str, have: usize, want: usize) -> Result<(), KernelError> {
    if have < want {
        return Err(shape(
            kernel,
            format!("`{what}` holds {have} elements, the geometry needs {want}"),
        ));
    }
    Ok(())
}

fn int(kernel: &'static str, what: &str, v: usize) -> Result<i32, KernelError> {
    i32::try_from(v).map_err(|_| {
        shape(
            kernel,
            format!("`{what}` = {v} does not fit the kernel's int"),
        )
    })
}

impl Gpu {
    /// Opens device `ordinal` (after [`probe`]) with the performance switches `tuning`;
    /// kernels compile on first use for its compute capability, cached in
    /// [`compile::cache_dir`].
    pub fn open(ordinal: usize, tuning: &Tuning) -> Result<Self, KernelError> {
        let nvrtc = probe()?;
        let ctx = CudaContext::new(ordinal).map_err(KernelError::driver(format!(
            "opening CUDA device {ordinal}"
        )))?;
        let (major, minor) = ctx
            .compute_capability()
            .map_err(KernelError::driver("reading the compute capability"))?;
        let smem_optin = ctx
            .attribute(
                cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
            )
            .map_or(DEFAULT_DYNAMIC_SMEM, |v| v.max(0) as usize);
        let sm_count = ctx
            .attribute(
                cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
            )
            .map_or(1, |v| v.max(1) as u32);
        let name = ctx
            .name()
            .map_err(KernelError::driver("reading the device name"))?;
        // NVRTC takes the architecture as a 'static str; one small string per opened device.
        let arch: &'static str = Box::leak(format!("compute_{major}{minor}").into_boxed_str());
        // Graph capture needs a stream other than the default one, and cudarc's per-slice
        // event tracking would make captured launches depend on uncaptured events
        // (CUDA_ERROR_STREAM_CAPTURE_ISOLATION): switch it off before any allocation and keep
        // all work on this one stream, which orders it.
        // SAFETY: called right after creating the context, before anything is allocated or
        // launched on it; every later operation goes through `stream`.
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx
            .new_stream()
            .map_err(KernelError::driver("creating the CUDA stream"))?;
        Ok(Gpu {
            ctx,
            stream,
            arch,
            int8_mma: std::sync::atomic::AtomicBool::new(
                major >= 8 && tuning.mma,
            ),
            has_int8_mma: major >= 8,
            name,
            nvrtc,
            cache: compile::cache_dir().map(PtxCache::new),
            modules: Mutex::new(HashMap::new()),
            functions: Mutex::new(HashMap::new()),
            compiled: Mutex::new(Vec::new()),
            canary_row: -1,
            pdl: tuning.pdl,
            smem_optin,
            opted_in: Mutex::new(HashMap::new()),
            mma_resident: std::sync::atomic::AtomicU8::new(tuning.mma_resident as u8),
            small_batch: std::sync::atomic::AtomicU8::new(tuning.small_batch as u8),
            sm_count,
            occupancy: Mutex::new(HashMap::new()),
            claim_sm: tuning.claim_sm,
            prologues: tuning.prologues,
        })
    }

    /// The performance switches in force now: the value the device was opened with, less
    /// what the device cannot do (no int8 MMA before sm_80) and with any later `set_*`
    /// applied. Gates report it in their doors row.
    pub fn tuning(&self) -> Tuning {
        Tuning {
            mma: self.int8_mma(),
            pdl: self.pdl,
            mma_resident: self.mma_resident(),
            small_batch: self.small_batch(),
            claim_sm: self.claim_sm,
            prologues: self.prologues,
        }
    }

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

    /// Resident blocks per multiprocessor of kernel `name` (function `f`) with `smem` bytes
    /// of dynamic shared memory, asked of the driver once per pair.
    fn blocks_per_sm(
        &self,
        name: &'static str,
        f: &CudaFunction,
        threads: u32,
        smem: usize,
    ) -> u32 {
        if let Some(n) = self
            .occupancy
            .lock()
            .ok()
            .and_then(|o| o.get(&(name, smem)).copied())
        {
            return n;
        }
        let n = f
            .occupancy_max_active_blocks_per_multiprocessor(threads, smem, None)
            .map_or(1, |n| n.max(1));
        if let Ok(mut o) = self.occupancy.lock() {
            o.insert((name, smem), n);
        }
        n
    }

    /// Test-only plumbing defect for gate canaries: every quantized matvec drops the last
    /// block of `row`. `None` switches it off.
    pub fn set_matvec_canary(&mut self, row: Option<usize>) {
        self.canary_row = row.map_or(-1, |r| r.min(i32::MAX as usize) as i32);
    }

    /// The dynamic shared memory that makes each block of a short latency-bound launch
    /// (`blocks` of them) hold a multiprocessor alone, or 0: see [`claims_sm`]. The kernel
    /// never touches that memory; it only keeps the streaming matvec blocks launched beside
    /// it (programmatic dependent launch) off its multiprocessors.
    pub(crate) fn claim_sm_bytes(&self, name: &'static str, f: &CudaFunction, blocks: u32) -> u32 {
        if !self.claim_sm || !claims_sm(blocks, self.sm_count) {
            return 0;
        }
        self.dynamic_smem_limit(name, f)
            .filter(|&limit| limit > DEFAULT_DYNAMIC_SMEM)
            .map_or(0, |limit| limit as u32)
    }

    /// Whether kernel `name` (function `f`) may take `bytes` of dynamic shared memory,
    /// opting in above the default 48 KiB up to what the device allows per block (less the
    /// kernel's static shared memory, which the driver counts against the same limit). The
    /// opt-in is set once per kernel, to that limit, so a graph captured with a larger launch
    /// stays valid whatever is launched later. A refusal is not an error: the caller then
    /// launches the variant without shared memory.
    fn allow_dynamic_smem(&self, name: &'static str, f: &CudaFunction, bytes: usize) -> bool {
        bytes <= DEFAULT_DYNAMIC_SMEM
            || self
                .dynamic_smem_limit(name, f)
                .is_some_and(|limit| bytes <= limit)
    }

    /// The most dynamic shared memory kernel `name` (function `f`) may take: the device's
    /// opt-in limit less the kernel's static shared memory, which the driver counts against
    /// the same limit. The kernel is opted in to it on the first call, and the answer kept;
    /// `None` when the driver refuses.
    fn dynamic_smem_limit(&self, name: &'static str, f: &CudaFunction) -> Option<usize> {
        use cudarc::driver::sys::CUfunction_attribute;
        let mut opted = self.opted_in.lock().ok()?;
        if let Some(&limit) = opted.get(name) {
            return Some(limit);
        }
        let static_smem = f
            .get_attribute(CUfunction_attribute::CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES)
            .map_or(0, |v| v.max(0) as usize);
        let limit = self.smem_optin.saturating_sub(static_smem);
        f.set_attribute(
            CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
            limit as i32,
        )
        .ok()?;
        opted.insert(name, limit);
        Some(limit)
    }

    /// A launch of `f` on this device's stream.
    fn launcher<'a>(&'a self, f: &'a CudaFunction) -> Launch<'a> {
        Launch::new(&self.stream, f, self.pdl)
    }

    pub fn ctx(&self) -> &Arc<CudaContext> {
        &self.ctx
    }
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }
    /// The NVRTC architecture, e.g. `compute_90`.
    pub fn arch(&self) -> &'static str {
        self.arch
    }
    pub fn name(&self) -> &str {
        &self.name
    }
    pub fn nvrtc_version(&self) -> (i32, i32) {
        self.nvrtc
    }
    pub fn cache(&self) -> Option<&PtxCache> {
        self.cache.as_ref()
    }
    /// The families compiled or read from the cache so far.
    pub fn compiled(&self) -> Vec<CompiledPtx> {
        self.compiled.lock().map(|c| c.clone()).unwrap_or_default()
    }

    /// Compiles (or reads from the cache) and loads every family now.
    pub fn load_all(&self) -> Result<(), KernelError> {
        self.load_where(|_| true)
    }

    /// [`Gpu::load_all`] without the benchmark-only families ([`sources::BENCH_ONLY`]),
    /// which load on first use: what opening a device for decoding needs.
    pub fn load_decode(&self) -> Result<(), KernelError> {
        self.load_where(|src| !sources::BENCH_ONLY.contains(src))
    }

    fn load_where(&self, pick: impl Fn(&KernelSource) -> bool) -> Result<(), KernelError> {
        for src in sources::ALL.iter().filter(|s| pick(s)) {
            self.module(src)?;
        }
        Ok(())
    }

    fn module(&self, src: &KernelSource) -> Result<Arc<CudaModule>, KernelError> {
        if let Some(m) = self
            .modules
            .lock()
            .ok()
            .and_then(|m| m.get(src.file).cloned())
        {
            return Ok(m);
        }
        let compiled = compile::compile(src, self.arch, self.cache.as_ref())?;
        let module = self
            .ctx
            .load_module(cudarc::nvrtc::Ptx::from_src(compiled.ptx.clone()))
            .map_err(KernelError::driver(format!("loading module {}", src.file)))?;
        if let Ok(mut c) = self.compiled.lock() {
            c.push(compiled);
        }
        if let Ok(mut m) = self.modules.lock() {
            m.insert(src.file, module.clone());
        }
        Ok(module)
    }

    fn func(&self, src: &KernelSource, name: &'static str) -> Result<CudaFunction, KernelError> {
        if let Some(f) = self
            .functions
            .lock()
            .ok()
            .and_then(|f| f.get(name).cloned())
        {
            return Ok(f);
        }
        let f = self
            .module(src)?
            .load_function(name)
            .map_err(KernelError::driver(format!(
                "looking up kernel {name} in {}",
                src.file
            )))?;
        if let Ok(mut fs) = self.functions.lock() {
            fs.insert(name, f.clone());
        }
        Ok(f)
    }

    /// What kernel `name` of `src` takes per thread and per block, as the driver reports it
    /// after loading: registers per thread, local (spilled) bytes per thread, static shared
    /// bytes, and how many blocks of `threads` with `dyn_smem` dynamic shared bytes fit on one
    /// multiprocessor (raising the kernel's dynamic shared memory limit where needed, as its
    /// launcher does).
    pub fn kernel_resources(
        &self,
        src: &KernelSource,
        name: &'static str,
        threads: u32,
        dyn_smem: usize,
    ) -> Result<KernelResources, KernelError> {
        use cudarc::driver::sys::CUfunction_attribute as A;
        let f = self.func(src, name)?;
        let attr = |a: A| {
            f.get_attribute(a)
                .map_err(KernelError::driver(format!("reading {name}'s attributes")))
        };
        self.allow_dynamic_smem(name, &f, dyn_smem);
        Ok(KernelResources {
            registers: attr(A::CU_FUNC_ATTRIBUTE_NUM_REGS)?,
            local_bytes: attr(A::CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES)?,
            static_smem: attr(A::CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES)?,
            blocks_per_sm: f
                .occupancy_max_active_blocks_per_multiprocessor(threads, dyn_smem, None)
                .map_err(KernelError::driver(format!("reading {name}'s occupancy")))?,
        })
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

    /// Waits for all work on the stream.
    pub fn synchronize(&self) -> Result<(), KernelError> {
        self.stream
            .synchronize()
            .map_err(KernelError::driver("synchronizing the stream"))
    }

    /// The read ceiling (`probe_read_u4`, a benchmark reference): reads every 16-byte word
    /// of `buf` over `blocks` blocks of 256 threads, each thread four words in flight.
    pub fn probe_read(
        &self,
        buf: &CudaSlice<u8>,
        blocks: u32,
        out: &mut CudaSlice<u32>,
    ) -> Result<(), KernelError> {
        const K: &str = "probe_read_u4";
        need(K, "out", out.len(), blocks as usize)?;
        let n = int(K, "16-byte words", buf.len() / 16)?;
        let f = self.func(&sources::PROBE, K)?;
        let cfg = LaunchConfig {
            grid_dim: (blocks.max(1), 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut b = self.launcher(&f);
        b.arg(buf).arg(&n).arg(out);
        // SAFETY: the kernel reads the first n 16-byte words of buf (n = len / 16; device
        // allocations are 256-byte aligned) and writes at most out[blockIdx.x], blocks of
        // which were checked above.
        unsafe { b.launch(cfg) }.map_err(KernelError::driver(format!("launching {K}")))?;
        Ok(())
    }

    /// Multiprocessors of the device.
    pub fn sm_count(&self) -> u32 {
        self.sm_count
    }

    /// q8_1 quantization of `y.len()` blocks of `x` (`x` holds at least `32 * y.len()`).
    pub fn quantize_q8_1(
        &self,
        x: &CudaSlice<f32>,
        y: &mut CudaSlice<BlockQ8_1>,
    ) -> Result<(), KernelError> {
        const K: &str = "quantize_q8_1_f32";
        need(K, "x", x.len(), y.len() * QK)?;
        let n = int(K, "blocks", y.len())?;
        let f = self.func(&sources::QUANTIZE, K)?;
        let cfg = LaunchConfig {
            grid_dim: ((n as u32).div_ceil(8).max(1), 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut b = self.launcher(&f);
        b.arg(x).arg(y).arg(&n);
        // SAFETY: the kernel reads 32 * n floats of x and writes n blocks of y; both lengths
        // were checked above, and the argument types match the kernel's signature.
        unsafe { b.launch(cfg) }.map_err(KernelError::driver(format!("launching {K}")))?;
        Ok(())
    }

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
        let f = self.func(&sources::NORM, K)?;
        let cfg = LaunchConfig {
            grid_dim: (rows as u32, 1, 1),
            block_dim: (crate::twin::NORM_THREADS as u32, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut b = self.launcher(&f);
        b.arg(x).arg(g).arg(out).arg(&c).arg(&eps);
        // SAFETY: one block per row reads rows*cols of x, cols of g and writes rows*cols of
        // out; all three lengths were checked above.
        unsafe { b.launch(cfg) }.map_err(KernelError::driver(format!("launching {K}")))?;
        Ok(())
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
        let f = self.func(&sources::NORM, K)?;
        let cfg = LaunchConfig {
            grid_dim: (rows as u32, 1, 1),
            block_dim: (crate::twin::NORM_THREADS as u32, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut b = self.launcher(&f);
        b.arg(x).arg(g).arg(yq).arg(r_out).arg(&c).arg(&eps);
        // SAFETY: one block per row; reads rows*cols of x and cols of g, writes rows*cols/32
        // blocks and rows factors; lengths checked above.
        unsafe { b.launch(cfg) }.map_err(KernelError::driver(format!("launching {K}")))?;
        Ok(())
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
        let mut b = self.launcher(&f);
        match w {
            DeviceWeights::Q4_0(s) => b.arg(s),
            DeviceWeights::Q4_1(s) => b.arg(s),
            DeviceWeights::Q8_0(s) => b.arg(s),
            _ => unreachable!("float weights returned above"),
        };
        b.arg(x).arg(y).arg(&r).arg(&n).arg(&bt).arg(&canary);
        let bt8 = i32::from(resident_tile == Some(8));
        if mma && resident {
            b.arg(&bt8);
        }
        if family == MatvecFamily::Mmvq && !mma {
            b.arg(&i32::from(x_smem));
            if batch == 1 {
                b.arg(&post);
            }
        }
        // SAFETY: the kernel reads rows*nb weight blocks, batch*nb activation blocks and writes
        // batch*rows floats, all checked above; the grid covers rows and ceil(batch/8) groups
        // and the kernel bounds-checks both.
        unsafe { b.launch(cfg) }.map_err(KernelError::driver(format!("launching {k}")))?;
        Ok(())
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
        let f = self.func(&sources::MATVEC_FLOAT, k)?;
        let cfg = LaunchConfig {
            grid_dim: ((rows as u32).div_ceil(4), batch as u32, 1),
            block_dim: (128, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut b = self.launcher(&f);
        match w {
            DeviceWeights::F32(s) => b.arg(s),
            DeviceWeights::F16(s) => b.arg(s),
            DeviceWeights::BF16(s) => b.arg(s),
            _ => unreachable!("quantized weights returned above"),
        };
        b.arg(x).arg(y).arg(&r).arg(&c);
        // SAFETY: reads rows*cols weights and batch*cols activations, writes batch*rows
        // outputs, all checked above; the kernel bounds-checks rows.
        unsafe { b.launch(cfg) }.map_err(KernelError::driver(format!("launching {k}")))?;
        Ok(())
    }

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
        let f = self.func(&sources::ROPE, K)?;
        let cfg = LaunchConfig {
            grid_dim: (pairs.div_ceil(EW_THREADS), batch as u32, 1),
            block_dim: (EW_THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut b = self.launcher(&f);
        b.arg(x).arg(table);
        b.arg(&post_scale);
        b.arg(pos).arg(&h).arg(&d).arg(&n_pos);
        // SAFETY: x, pos and post_scale lengths were checked for `batch` rows; the kernel
        // reads the table only for positions below n_pos = table.len() / head_dim. A null
        // post_scale is a null device pointer, which the kernel tests before reading.
        unsafe { b.launch(cfg) }.map_err(KernelError::driver(format!("launching {K}")))?;
        Ok(())
    }

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
        let f = self.func(&sources::ATTENTION, K)?;
        let cfg = LaunchConfig {
            grid_dim: (s.n_heads as u32, 1, 1),
            block_dim: (128, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut b = self.launcher(&f);
        b.arg(q)
            .arg(k)
            .arg(v)
            .arg(out)
            .arg(scratch)
            .arg(&h)
            .arg(&kvh)
            .arg(&d)
            .arg(&n)
            .arg(&n)
            .arg(&scale);
        // SAFETY: lengths of q, the caches, out and scratch (n_heads rows of stride n_tokens)
        // were checked against the shape above.
        unsafe { b.launch(cfg) }.map_err(KernelError::driver(format!("launching {K}")))?;
        Ok(())
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
        let f = self.func(&sources::ATTENTION, K)?;
        let cfg = LaunchConfig {
            grid_dim: (s.n_heads as u32, chunks as u32, 1),
            block_dim: (128, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut b = self.launcher(&f);
        b.arg(q)
            .arg(k)
            .arg(v)
            .arg(&*part_o)
            .arg(&*part_ml)
            .arg(&h)
            .arg(&kvh)
            .arg(&d)
            .arg(&n)
            .arg(&scale);
        // SAFETY: q, caches and both partial buffers were checked against the shape and the
        // chunk count that sizes the grid.
        unsafe { b.launch(cfg) }.map_err(KernelError::driver(format!("launching {K}")))?;
        let fc = self.func(&sources::ATTENTION, C)?;
        let cfg = LaunchConfig {
            grid_dim: (s.n_heads as u32, 1, 1),
            block_dim: (128, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut b = self.launcher(&fc);
        b.arg(&*part_o).arg(&*part_ml).arg(out).arg(&nc).arg(&d);
        // SAFETY: the partial buffers were sized above; out holds n_heads * head_dim.
        unsafe { b.launch(cfg) }.map_err(KernelError::driver(format!("launching {C}")))?;
        Ok(())
    }

    fn ew_cfg(n: usize) -> LaunchConfig {
        LaunchConfig {
            grid_dim: ((n as u32).div_ceil(EW_THREADS).max(1), 1, 1),
            block_dim: (EW_THREADS, 1, 1),
            shared_mem_bytes: 0,
        }
    }

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
        let f = self.func(&sources::ELEMENTWISE, K)?;
        let mut b = self.launcher(&f);
        b.arg(gate).arg(up).arg(out);
        b.arg(&post_scale);
        b.arg(&ni).arg(&ci);
        // SAFETY: all buffers hold n elements (post_scale one per row), checked above.
        unsafe { b.launch(Self::ew_cfg(n)) }
            .map_err(KernelError::driver(format!("launching {K}")))?;
        Ok(())
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
        let f = self.func(&sources::ELEMENTWISE, K)?;
        let mut b = self.launcher(&f);
        b.arg(x).arg(y).arg(&ni);
        // SAFETY: both buffers hold n elements, checked above.
        unsafe { b.launch(Self::ew_cfg(n)) }
            .map_err(KernelError::driver(format!("launching {K}")))?;
        Ok(())
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
        let f = self.func(&sources::ELEMENTWISE, K)?;
        let mut b = self.launcher(&f);
        b.arg(y).arg(s).arg(&ni).arg(&ci);
        // SAFETY: y holds n elements and s one per row, checked above.
        unsafe { b.launch(Self::ew_cfg(n)) }
            .map_err(KernelError::driver(format!("launching {K}")))?;
        Ok(())
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
        let f = self.func(&sources::ELEMENTWISE, K)?;
        let mut b = self.launcher(&f);
        b.arg(cache).arg(src);
        b.arg(&post_scale);
        b.arg(&p).arg(&r);
        // SAFETY: the cache covers position pos and src one row, checked above; a null
        // post_scale is tested by the kernel before reading.
        unsafe { b.launch(Self::ew_cfg(row_len)) }
            .map_err(KernelError::driver(format!("launching {K}")))?;
        Ok(())
    }

    /// Greedy pick of `batch` rows of `n` logits into `out`: the largest value, ties to the
    /// lower index, NaN never winning. `scratch` holds [`argmax_scratch_len`] words, zeroed
    /// when allocated; every launch leaves it zeroed again (its counters).
    pub fn argmax(
        &self,
        logits: &CudaSlice<f32>,
        out: &mut CudaSlice<u32>,
        scratch: &mut CudaSlice<u32>,
        batch: usize,
        n: usize,
    ) -> Result<(), KernelError> {
        const K: &str = "argmax_f32";
        if n == 0 || batch == 0 {
            return Err(shape(
                K,
                format!("batch = {batch} and n = {n} must be positive"),
            ));
        }
        need(K, "logits", logits.len(), batch * n)?;
        need(K, "out", out.len(), batch)?;
        need(K, "scratch", scratch.len(), argmax_scratch_len(batch, n))?;
        let ni = int(K, "n", n)?;
        let f = self.func(&sources::SAMPLE, K)?;
        let cfg = LaunchConfig {
            grid_dim: (n.div_ceil(ARGMAX_CHUNK) as u32, batch as u32, 1),
            block_dim: (ARGMAX_THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut b = self.launcher(&f);
        b.arg(logits).arg(out).arg(scratch).arg(&ni);
        // SAFETY: batch rows of n logits, batch outputs and the scratch's per-row counter and
        // chunk partials, all checked above.
        unsafe { b.launch(cfg) }.map_err(KernelError::driver(format!("launching {K}")))?;
        Ok(())
    }

    /// Temperature + top-p sampling of `batch` rows of `n` logits, row `b` keyed by
    /// `(seed, seq[b], step[b])`; `p_scratch` holds `batch * n` floats.
    #[allow(clippy::too_many_arguments)]
    pub fn sample(
        &self,
        logits: &CudaSlice<f32>,
        p_scratch: &mut CudaSlice<f32>,
        out: &mut CudaSlice<u32>,
        batch: usize,
        n: usize,
        temp: f32,
        top_p: f32,
        seed: u64,
        seq: &CudaSlice<u32>,
        step: &CudaSlice<u32>,
    ) -> Result<(), KernelError> {
        const K: &str = "sample_f32";
        need(K, "logits", logits.len(), batch * n)?;
        need(K, "p_scratch", p_scratch.len(), batch * n)?;
        need(K, "out", out.len(), batch)?;
        need(K, "seq", seq.len(), batch)?;
        need(K, "step", step.len(), batch)?;
        let ni = int(K, "n", n)?;
        let (lo, hi) = (seed as u32, (seed >> 32) as u32);
        let f = self.func(&sources::SAMPLE, K)?;
        let cfg = LaunchConfig {
            grid_dim: (batch as u32, 1, 1),
            block_dim: (SAMPLE_THREADS as u32, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut b = self.launcher(&f);
        b.arg(logits)
            .arg(p_scratch)
            .arg(out)
            .arg(&ni)
            .arg(&temp)
            .arg(&top_p)
            .arg(&lo)
            .arg(&hi)
            .arg(seq)
            .arg(step);
        // SAFETY: every buffer was checked for batch rows of n (or one value per row).
        unsafe { b.launch(cfg) }.map_err(KernelError::driver(format!("launching {K}")))?;
        Ok(())
    }

    /// `out[i] = exp_mirrored(x[i])` for `n` values (the sampler's exp; for kernel-check).
    pub fn exp_mirrored(
        &self,
        x: &CudaSlice<f32>,
        out: &mut CudaSlice<f32>,
        n: usize,
    ) -> Result<(), KernelError> {
        const K: &str = "exp_mirrored_f32";
        need(K, "x", x.len(), n)?;
        need(K, "out", out.len(), n)?;
        let ni = int(K, "n", n)?;
        let f = self.func(&sources::SAMPLE, K)?;
        let mut b = self.launcher(&f);
        b.arg(x).arg(out).arg(&ni);
        // SAFETY: x and out hold n floats, checked above.
        unsafe { b.launch(Self::ew_cfg(n)) }
            .map_err(KernelError::driver(format!("launching {K}")))?;
        Ok(())
    }

    /// Philox4x32-10 of `n` counters (4 words each) under `key`, for checking the device
    /// generator against the twin.
    pub fn philox(
        &self,
        ctr: &CudaSlice<u32>,
        out: &mut CudaSlice<u32>,
        key: [u32; 2],
        n: usize,
    ) -> Result<(), KernelError> {
        const K: &str = "philox_u32";
        need(K, "ctr", ctr.len(), 4 * n)?;
        need(K, "out", out.len(), 4 * n)?;
        let ni = int(K, "n", n)?;
        let f = self.func(&sources::SAMPLE, K)?;
        let mut b = self.launcher(&f);
        b.arg(ctr).arg(out).arg(&key[0]).arg(&key[1]).arg(&ni);
        // SAFETY: ctr and out hold 4 * n words, checked above.
        unsafe { b.launch(Self::ew_cfg(n)) }
            .map_err(KernelError::driver(format!("launching {K}")))?;
        Ok(())
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

    /// Short latency-bound launches take whole multiprocessors, up to a quarter of the
    /// device: on the H200's 132, llama-7B's single-row norm step (16 blocks) and decode
    /// attention (32 heads) do, SwiGLU's 43 blocks and a 40-head attention do not.
    #[test]
    fn only_short_launches_claim_multiprocessors() {
        assert!(claims_sm(16, 132));
        assert!(claims_sm(32, 132));
        assert!(claims_sm(33, 132));
        assert!(!claims_sm(34, 132));
        assert!(!claims_sm(40, 132));
        assert!(!claims_sm(43, 132));
        assert!(!claims_sm(0, 132));
        assert!(!claims_sm(1, 3));
        assert!(claims_sm(2, 8));
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
        let sample = sources::SAMPLE.text;
        assert!(sample.contains(&format!("#define ARGMAX_THREADS {ARGMAX_THREADS}\n")));
        assert!(sample.contains("#define ARGMAX_CHUNK (ARGMAX_THREADS * 8)\n"));
        assert_eq!(argmax_scratch_len(2, 49152), 2 * (1 + 2 * 24));
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
