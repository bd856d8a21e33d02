//! The CUDA device: a context and stream, lazy per-family module loading through
//! [`crate::compile`], the resource queries launchers size their grids by, and the checks
//! every launcher shares (`need`, `int`, `shape`). Launchers check every length against the
//! geometry they are given and return [`KernelError::Shape`] instead of launching out of
//! bounds; driver failures come back as [`KernelError::Driver`], never as a panic.
//!
//! The launchers themselves live with their family, one module per `.cu` file family
//! (`cuda/matvec.rs`, `norm.rs`, `quantize.rs`, `rope.rs`, `attention.rs`, `elementwise.rs`,
//! `sample.rs`, `embed.rs`, `probe.rs`), each an `impl Gpu` block; `cuda/launch.rs` owns the
//! call they all end in. This module owns no kernel of any family.
//!
//! Beside each family's single-purpose kernels are the engine's batched-row forms (the norm
//! step, RoPE with the KV store, SwiGLU with q8_1, attention over per-row cache pointers,
//! the norm-prologue matvec). They exist so that one decode step is few launches and so
//! that everything that changes from step to step (tokens, positions, lengths) is read from
//! device memory: a CUDA graph captured once then replays every step. Their arithmetic is
//! the single-purpose kernels' (and so the twins'), composed; `docs/numerics.md` says how.
//!
//! [`probe`](fn@probe) must succeed before anything here touches CUDA: cudarc loads the libraries
//! dynamically and panics on a missing one. [`Gpu::open`] calls it.
//!
//! Layouts are the twins' (see [`crate::twin`]): batched activations and outputs are row after
//! row, the KV cache is position-major `[t][kv_head][d]`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::blocks::{BlockQ4_0, BlockQ4_1, BlockQ8_0, BlockQ8_1};
use crate::compile::{self, CompiledPtx, PtxCache};
use crate::error::KernelError;
use crate::sources::{self, KernelSource};

mod attention;
mod elementwise;
mod embed;
mod launch;
mod matvec;
mod norm;
mod peer;
mod probe;
mod quantize;
mod rope;
mod sample;

pub use crate::tuning::{FormSwitch, Tuning};
pub use attention::{AttnRows, PROMPT_TILE, RopeStoreArgs, attention_can_quantize};
pub use matvec::{MmaResident, SmallBatch};
pub use peer::{Fence, copy_peer};
pub use sample::argmax_scratch_len;

use cudarc::driver::{
    CudaContext, CudaFunction, CudaModule, CudaSlice, CudaStream, DevicePtr, DeviceRepr,
    LaunchConfig, ValidAsZeroBits,
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

/// Shared memory, static and dynamic together, a block may use without opting in.
const DEFAULT_DYNAMIC_SMEM: usize = 48 * 1024;

/// The static shared memory kernel `f` declares (0 when the driver does not say).
fn read_static_smem(f: &CudaFunction) -> usize {
    use cudarc::driver::sys::CUfunction_attribute;
    f.get_attribute(CUfunction_attribute::CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES)
        .map_or(0, |v| v.max(0) as usize)
}

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
    /// Test-only: the defines of the planted defects the families compile with
    /// ([`Gpu::plant_defect`]); empty but in tests.
    defects: Vec<&'static str>,
    /// Whether launches carry the programmatic-dependent-launch attribute ([`launch`]):
    /// on unless `MEMRA_PDL=0` when the device is opened. A performance switch only: every
    /// kernel waits for its predecessor's results either way, so the bits do not change.
    pdl: bool,
    /// The most dynamic shared memory one block may opt into on this device.
    smem_optin: usize,
    /// The kernels whose dynamic shared memory limit is already raised, with that limit
    /// (`smem_optin` less the kernel's static shared memory).
    opted_in: Mutex<HashMap<&'static str, usize>>,
    /// Each kernel's static shared memory, asked of the driver once.
    static_smem: Mutex<HashMap<&'static str, usize>>,
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
    /// `MEMRA_PROMPT_TILE` as the device was opened with it: whether
    /// [`Gpu::attention_split_k_tile_rows`] takes the tiled kernel.
    prompt_tile: bool,
}

/// Whether a latency-bound launch of `blocks` thread blocks (the single-row norm step, the
/// single-row decode attention) takes whole multiprocessors, at most a quarter of the
/// device's `sm_count`. A load waits behind the loads its multiprocessor already has in
/// flight, and the next matvec's blocks, resident beside the launch before their wait
/// (programmatic dependent launch), put some 80–160 KB of weight loads on each
/// multiprocessor, ahead of the launch's reads of its predecessor's output. Larger launches
/// keep sharing, because on multiprocessors of their own they measured slower (README,
/// "Latency-bound launches on multiprocessors of their own").
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

/// The define of the planted exp defect (`exp_model` in `common.cuh`).
pub const EXP_DEFECT: &str = "MEMRA_DEFECT_EXP_ULP";

/// The define of the planted q8_1 block-sum defect (`quantize_lane` in `common.cuh`).
pub const Q8_BLOCK_SUM_DEFECT: &str = "MEMRA_DEFECT_Q8_BLOCK_SUM";

/// The define of the planted prompt-tile defect (`attention_split_k_tile_rows_f32` in
/// `attention.cu`).
pub const PROMPT_TILE_DEFECT: &str = "MEMRA_DEFECT_PROMPT_TILE";

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
            int8_mma: std::sync::atomic::AtomicBool::new(major >= 8 && tuning.mma),
            has_int8_mma: major >= 8,
            name,
            nvrtc,
            cache: compile::cache_dir().map(PtxCache::new),
            modules: Mutex::new(HashMap::new()),
            functions: Mutex::new(HashMap::new()),
            compiled: Mutex::new(Vec::new()),
            canary_row: -1,
            defects: Vec::new(),
            pdl: tuning.pdl,
            smem_optin,
            opted_in: Mutex::new(HashMap::new()),
            static_smem: Mutex::new(HashMap::new()),
            mma_resident: std::sync::atomic::AtomicU8::new(tuning.mma_resident as u8),
            small_batch: std::sync::atomic::AtomicU8::new(tuning.small_batch as u8),
            sm_count,
            occupancy: Mutex::new(HashMap::new()),
            claim_sm: tuning.claim_sm,
            prologues: tuning.prologues,
            prompt_tile: tuning.prompt_tile,
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
            prompt_tile: self.prompt_tile,
        }
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
    ///
    /// The default limit, like the opt-in one, covers static and dynamic shared memory
    /// together, so a kernel with static shared memory fits under it only with that counted.
    fn allow_dynamic_smem(&self, name: &'static str, f: &CudaFunction, bytes: usize) -> bool {
        bytes + self.static_smem(name, f) <= DEFAULT_DYNAMIC_SMEM
            || self
                .dynamic_smem_limit(name, f)
                .is_some_and(|limit| bytes <= limit)
    }

    /// Kernel `name`'s (function `f`'s) static shared memory, read once and kept: the
    /// launches that ask [`Gpu::allow_dynamic_smem`] are many and on the hot path.
    fn static_smem(&self, name: &'static str, f: &CudaFunction) -> usize {
        let kept = self
            .static_smem
            .lock()
            .ok()
            .and_then(|m| m.get(name).copied());
        if let Some(v) = kept {
            return v;
        }
        let v = read_static_smem(f);
        if let Ok(mut m) = self.static_smem.lock() {
            m.insert(name, v);
        }
        v
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
        let limit = self.smem_optin.saturating_sub(read_static_smem(f));
        f.set_attribute(
            CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
            limit as i32,
        )
        .ok()?;
        opted.insert(name, limit);
        Some(limit)
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

    /// Test-only, for the planted defects: every family compiles with `define` defined
    /// (besides any planted before): [`EXP_DEFECT`] (`MEMRA_GATE_DEFECT=exp-ulp`: `exp_model`,
    /// in attention and SiLU, returns one ulp above `exp_mirrored`) or
    /// [`Q8_BLOCK_SUM_DEFECT`] (`q8-block-sum`: every q8_1 block sum one f16 step high) or
    /// [`PROMPT_TILE_DEFECT`] (`prompt-tile`: the tiled prompt attention's copy of each
    /// chunk holds its last position's K row where the V row belongs).
    /// Families loaded already are dropped, so they load again planted.
    pub fn plant_defect(&mut self, define: &'static str) {
        if !self.defects.contains(&define) {
            self.defects.push(define);
        }
        if let Ok(m) = self.modules.get_mut() {
            m.clear();
        }
        if let Ok(f) = self.functions.get_mut() {
            f.clear();
        }
        // What was set or measured on the dropped functions goes with them.
        if let Ok(o) = self.opted_in.get_mut() {
            o.clear();
        }
        if let Ok(o) = self.static_smem.get_mut() {
            o.clear();
        }
        if let Ok(o) = self.occupancy.get_mut() {
            o.clear();
        }
    }

    /// The defines of the defects the families compile with.
    pub fn defects(&self) -> &[&'static str] {
        &self.defects
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
        let compiled = compile::compile_with(src, self.arch, self.cache.as_ref(), &self.defects)?;
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

    /// Waits for all work on the stream.
    pub fn synchronize(&self) -> Result<(), KernelError> {
        self.stream
            .synchronize()
            .map_err(KernelError::driver("synchronizing the stream"))
    }

    /// Multiprocessors of the device.
    pub fn sm_count(&self) -> u32 {
        self.sm_count
    }

    /// One thread per element over `n` elements, in blocks of [`EW_THREADS`]: the grid of
    /// the elementwise kernels and of the sampler's per-element ones.
    fn ew_cfg(n: usize) -> LaunchConfig {
        LaunchConfig {
            grid_dim: ((n as u32).div_ceil(EW_THREADS).max(1), 1, 1),
            block_dim: (EW_THREADS, 1, 1),
            shared_mem_bytes: 0,
        }
    }

    /// The device address of a slice, for the pointer tables of [`AttnRows`].
    pub fn address<T>(&self, s: &CudaSlice<T>) -> u64 {
        let (p, _sync) = s.device_ptr(&self.stream);
        p
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
