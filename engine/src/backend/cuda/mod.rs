//! The CUDA backend: the engine API computed by the kernels of `memra_kernels` on one or
//! more devices, with the weights resident in their GGUF storage types.
//!
//! It owns the device state of a run: the sequences' KV caches, the step buffers, the
//! per-row tables that say where each row's caches live, and the CUDA graphs of the decode
//! step. It computes the compositions the CPU backend computes (DESIGN §7): prefill and the
//! batched path run the separate composition (norm → q8_1 → matvec with every scale inside);
//! the single-sequence path runs the fused tier when `MEMRA_MMVQ=1` and
//! `MEMRA_NO_FUSE_NORMQ=0` (norm+quantize fused, r applied by RoPE, the V store, SwiGLU and
//! the head's scale). Which kernel computes what, and why that is the twins' arithmetic, is
//! in `docs/numerics.md`; the model upload and its placement are in [`weights`].
//!
//! Everything a step changes (token ids, positions, hence lengths) lives in device buffers,
//! so the launches of one decode step are captured once per (rows, tier, attention chunk
//! bucket, walk) and replayed. Sampled steps ("lean ticks") pick tokens on the device and copy
//! back only the tokens, parking their logits in a device buffer for
//! [`Backend::parked_logits`].
//!
//! While an activation trace is recorded ([`Backend::start_trace`]) every pass runs eagerly
//! (a graph cannot stop to copy) and copies each quantization site back right after the
//! launch that produced it, on that launch's stream: the q8_1 blocks of each row and, in the
//! fused tier, its norm factor. It records the sites the CPU backend records, in the same
//! compositions, including the attention output in front of a float `wo`, quantized only for
//! the trace. Without a trace each site costs one branch.
//!
//! Pipeline stages (`MEMRA_PP_STAGES`) live on the devices `MEMRA_PP_DEVICES` names; stage
//! 0's device is the primary and holds the embedding, the last stage's device holds the
//! output norm and the head, runs the device sampling and hands the host the tokens. Each
//! layer's weights, KV caches and cache tables live on its stage's device, and each device
//! has its own step buffers. Consecutive stages on one device form a segment, captured as
//! one graph on that device's stream. The split walk hands the residual stream from one
//! stage to the next with an explicit copy into a stage-owned buffer: a device-to-device
//! copy inside a segment, a peer copy between segments, ordered by events (see
//! [`CudaBackend::hand_over`]). The unsplit walk ([`Backend::decode_step_batch_unsplit`])
//! runs every stage-owned layer on the primary's buffers, reading the other devices'
//! weights and caches through peer access; it is refused where peer access is off.

pub mod bench;
mod weights;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::ops::Range;
use std::sync::Arc;

use cudarc::driver::{CudaGraph, CudaSlice, CudaStream, DriverError, sys};
use memra_kernels::blocks::{BlockQ8_1, QK};
use memra_kernels::cuda::{AttnRows, Fence, Gpu, RopeStoreArgs, attention_can_quantize, copy_peer};
use memra_kernels::error::KernelError;
use memra_kernels::twin::{MatvecFamily, SPLIT_K_CHUNK};

pub use weights::{DevModel, DevWeight, PeerAccess, Placement};

use super::stages::StagePlan;
use super::trace::{ActivationTrace, Composition, Site, SiteKey, SiteRecord};
use super::{
    Backend, EngineError, RowSpec, SeqId, batch_rows, canary_token, check_token, reserve_positions,
};
use crate::doors::{Doors, DoorsReport, GateDefect};
use crate::model::{LlamaConfig, LlamaModel};
use crate::sampling::SamplingParams;

/// Rows of one pass: decode batches and prompt chunks larger than this run as several
/// passes (rows are independent, so the split changes no bit).
pub const MAX_ROWS: usize = 64;

/// A device failure as an engine error; out of memory says so and what to do.
pub(crate) fn device_err(what: &str, e: DriverError) -> EngineError {
    if e.0 == sys::cudaError_enum::CUDA_ERROR_OUT_OF_MEMORY {
        EngineError::Unavailable(format!(
            "out of device memory while {what}; use a smaller model, batch or sequence \
             capacity, or MEMRA_BACKEND=cpu"
        ))
    } else {
        EngineError::Unavailable(format!("CUDA error while {what}: {e}"))
    }
}

fn kernel_err(e: KernelError) -> EngineError {
    match e {
        KernelError::Driver { what, source } => device_err(&what, source),
        other => EngineError::Model(format!("kernel launch refused: {other}")),
    }
}

/// The device ordinals of the doors' stages, each once, in stage order.
fn distinct_devices(doors: &Doors) -> Vec<usize> {
    let mut out: Vec<usize> = Vec::new();
    for &d in &doors.pp_devices {
        if !out.contains(&d) {
            out.push(d);
        }
    }
    if out.is_empty() {
        out.push(0);
    }
    out
}

/// Opens device `ordinal` with its kernels loaded; a failure names the ordinal, the
/// devices this machine has when that is known, and the fix.
fn open_ordinal(ordinal: usize, doors: &Doors) -> Result<Gpu, String> {
    let gpu = Gpu::new(ordinal).map_err(|e| {
        let list = doors
            .pp_devices
            .iter()
            .map(|d| d.to_string())
            .collect::<Vec<_>>()
            .join(",");
        // Only ask for the count when the libraries loaded: cudarc panics without them.
        let count = memra_kernels::cuda::probe()
            .ok()
            .and_then(|_| cudarc::driver::CudaContext::device_count().ok());
        match count {
            Some(c) if ordinal >= c.max(0) as usize => format!(
                "CUDA device {ordinal} (MEMRA_PP_DEVICES={list}): {e}; this machine has {c} \
                 CUDA device(s), ordinals 0..{}: name only those in MEMRA_PP_DEVICES, or use \
                 MEMRA_BACKEND=cpu",
                c.max(1) - 1
            ),
            _ => format!("CUDA device {ordinal}: {e}"),
        }
    })?;
    gpu.load_decode()
        .map_err(|e| format!("compiling the kernels for {}: {e}", gpu.name()))?;
    Ok(gpu)
}

/// Opens the primary device the doors name (stage 0's), or says why there is none usable:
/// missing libraries, no device, an ordinal the machine does not have.
pub fn open_device(doors: &Doors) -> Result<Gpu, String> {
    open_ordinal(distinct_devices(doors)[0], doors)
}

/// Opens every device the doors' stages name, once each, in stage order: slot 0 is stage
/// 0's device (the primary), and the slots match [`Placement::of`] for the doors' plan.
pub fn open_devices(doors: &Doors) -> Result<Vec<Gpu>, String> {
    distinct_devices(doors)
        .into_iter()
        .map(|o| open_ordinal(o, doors))
        .collect()
}

/// Opens the devices the doors' stage plan names and uploads `model` where the plan puts
/// it.
pub fn upload_for(doors: &Doors, model: &LlamaModel) -> Result<DevModel, EngineError> {
    let plan = StagePlan::from_doors(doors, model.config.n_layer).map_err(EngineError::Model)?;
    let gpus = open_devices(doors).map_err(EngineError::Unavailable)?;
    DevModel::upload_placed(gpus, model, &plan)
}

/// Which composition a pass runs (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Tier {
    Separate,
    Fused,
}

/// How a pass walks the pipeline stages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Walk {
    /// Stage by stage, each stage after the first on its own buffers, filled by a boundary
    /// copy from the previous stage's.
    Split,
    /// Every stage-owned layer in order on the primary's buffers, no boundary.
    Unsplit,
}

/// Consecutive stages on one device: the unit of a captured graph and of a stream.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Segment {
    stages: Range<usize>,
    slot: usize,
}

/// Groups consecutive stages with the same slot (`stage_slot[s]`) into segments.
fn segments(stage_slot: &[usize]) -> Vec<Segment> {
    let mut out: Vec<Segment> = Vec::new();
    for (s, &slot) in stage_slot.iter().enumerate() {
        match out.last_mut() {
            Some(seg) if seg.slot == slot => seg.stages.end = s + 1,
            _ => out.push(Segment {
                stages: s..s + 1,
                slot,
            }),
        }
    }
    out
}

/// A sequence: its length and its KV caches, one `[capacity, kv_dim]` buffer per layer on
/// that layer's device.
struct DevSeq {
    len: usize,
    capacity: usize,
    /// Distinguishes a reopened id from the sequence it replaced in the pointer tables.
    generation: u64,
    k: Vec<CudaSlice<f32>>,
    v: Vec<CudaSlice<f32>>,
}

/// The buffers of one pass on one device, sized for [`MAX_ROWS`] rows and for the longest
/// open sequence. Graphs capture their addresses, so replacing them drops every graph.
struct Scratch {
    max_len: usize,
    max_chunks: usize,
    x: CudaSlice<f32>,
    /// The residual stream's second buffer: a matvec that computes the norm step as its
    /// prologue, or the norm step split over blocks, writes the updated stream here, since
    /// its other thread blocks still read the first. The walk flips between the two at each
    /// such norm, twice per layer, so every layer ends in the buffer it started in.
    x_alt: CudaSlice<f32>,
    delta: CudaSlice<f32>,
    xf: CudaSlice<f32>,
    hf: CudaSlice<f32>,
    att: CudaSlice<f32>,
    xq: CudaSlice<BlockQ8_1>,
    r: CudaSlice<f32>,
    qkv: CudaSlice<f32>,
    gu: CudaSlice<f32>,
    part_o: CudaSlice<f32>,
    part_ml: CudaSlice<f32>,
    naive: CudaSlice<f32>,
    logits: CudaSlice<f32>,
    p_scratch: CudaSlice<f32>,
    tokens: CudaSlice<u32>,
    pos: CudaSlice<i32>,
    seq_ids: CudaSlice<u32>,
    steps: CudaSlice<u32>,
    picked: CudaSlice<u32>,
    /// The greedy pick's per-row counters and chunk partials (zero between launches).
    argmax_scratch: CudaSlice<u32>,
    /// The residual stream owned by every stage after the first that runs on this device,
    /// by stage index: `(x, delta)`, each `[MAX_ROWS, n_embd]`. At a boundary the stream is
    /// `x` plus the last block's pending `delta` (the next norm adds it), so the hand-over
    /// copies both.
    stage_bufs: Vec<Option<(CudaSlice<f32>, CudaSlice<f32>)>>,
}

/// Every device's step buffers and the per-layer cache tables.
struct Buffers {
    /// One per slot of the model's placement.
    slots: Vec<Scratch>,
    /// Per layer, on that layer's device: the address of each row's K and V cache.
    kptr: Vec<CudaSlice<u64>>,
    vptr: Vec<CudaSlice<u64>>,
}

fn alloc<T: cudarc::driver::DeviceRepr + cudarc::driver::ValidAsZeroBits>(
    stream: &Arc<CudaStream>,
    what: &str,
    n: usize,
) -> Result<CudaSlice<T>, EngineError> {
    stream.alloc_zeros::<T>(n.max(1)).map_err(|e| {
        device_err(
            &format!("allocating {what} ({} bytes)", n * std::mem::size_of::<T>()),
            e,
        )
    })
}

impl Scratch {
    /// The buffers of one device; `owns_stage[s]` says whether stage `s` runs here.
    fn new(
        stream: &Arc<CudaStream>,
        c: &LlamaConfig,
        max_len: usize,
        owns_stage: &[bool],
    ) -> Result<Self, EngineError> {
        let r = MAX_ROWS;
        let (d, qd, kvd, ff) = (c.n_embd, c.q_dim(), c.kv_dim(), c.n_ff);
        let widest = d.max(qd).max(ff);
        let max_chunks = max_len.div_ceil(SPLIT_K_CHUNK);
        Ok(Scratch {
            max_len,
            max_chunks,
            x: alloc(stream, "the residual stream", r * d)?,
            x_alt: alloc(stream, "the residual stream's second buffer", r * d)?,
            delta: alloc(stream, "the matvec output", r * d)?,
            xf: alloc(stream, "the f32 activations", r * d)?,
            hf: alloc(stream, "the SwiGLU output", r * ff)?,
            att: alloc(stream, "the attention output", r * qd)?,
            xq: alloc(stream, "the q8_1 activations", r * widest / QK)?,
            r: alloc(stream, "the norm factors", r)?,
            qkv: alloc(stream, "the q/k/v projections", r * (qd + 2 * kvd))?,
            gu: alloc(stream, "the gate/up projections", r * 2 * ff)?,
            part_o: alloc(
                stream,
                "the split-K partial outputs",
                r * c.n_head * max_chunks * c.head_dim,
            )?,
            part_ml: alloc(
                stream,
                "the split-K partial maxima",
                r * c.n_head * max_chunks * 2,
            )?,
            naive: alloc(stream, "the attention scores", r * c.n_head * max_len)?,
            logits: alloc(stream, "the logits", r * c.n_vocab)?,
            p_scratch: alloc(stream, "the sampling scratch", r * c.n_vocab)?,
            tokens: alloc(stream, "the token ids", r)?,
            pos: alloc(stream, "the positions", r)?,
            seq_ids: alloc(stream, "the sequence ids", r)?,
            steps: alloc(stream, "the sampling steps", r)?,
            picked: alloc(stream, "the picked tokens", r)?,
            argmax_scratch: alloc(
                stream,
                "the greedy pick's scratch",
                memra_kernels::cuda::argmax_scratch_len(r, c.n_vocab),
            )?,
            stage_bufs: owns_stage
                .iter()
                .enumerate()
                .map(|(s, &here)| {
                    if s == 0 || !here {
                        return Ok(None);
                    }
                    Ok(Some((
                        alloc(stream, "a stage's residual stream", r * d)?,
                        alloc(stream, "a stage's pending residual update", r * d)?,
                    )))
                })
                .collect::<Result<_, EngineError>>()?,
        })
    }

    /// The residual stream a segment leaves behind after stage `last`: the scratch's own
    /// for stage 0, the stage's buffers after that.
    fn stream_after(&self, last: usize) -> Option<(&CudaSlice<f32>, &CudaSlice<f32>)> {
        if last == 0 {
            return Some((&self.x, &self.delta));
        }
        self.stage_bufs
            .get(last)
            .and_then(Option::as_ref)
            .map(|(x, d)| (x, d))
    }
}

/// A captured decode step.
struct Graph(CudaGraph);

// SAFETY: a CudaGraph holds raw driver handles that must not be used from two threads at
// once. The backend owns its graphs outright and touches them only through `&mut self`, so
// moving the backend to another thread moves them with it and never shares them.
unsafe impl Send for Graph {}

/// What a captured graph depends on besides buffer addresses: the rows, the composition and
/// the split-K grid (a power of two of chunks, so a growing sequence recaptures rarely), and
/// the walk (a split graph holds the boundary copies an unsplit one lacks). Each key holds
/// one graph per segment of the walk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct GraphKey {
    rows: usize,
    tier: Tier,
    chunks: usize,
    walk: Walk,
    /// Whether the attention launches do the RoPE and KV store ([`PassCtx::fuse_rope`]): a
    /// graph captured with the separate `rope_store_rows` launch never replays for a pass
    /// that may skip it, nor the other way round.
    fuse_rope: bool,
}

/// The events of one boundary between segments on different devices.
struct Handoff {
    /// On the receiving device: recorded before the copy, so the copy waits until the
    /// receiver's earlier work (the previous pass over its stage buffers) is done.
    ready: Fence,
    /// On the sending device: recorded after the copy; the receiver waits for it.
    copied: Fence,
}

/// The CUDA backend. See the module docs.
pub struct CudaBackend {
    dm: Arc<DevModel>,
    doors: Doors,
    family: MatvecFamily,
    /// Whether the single-sequence path runs the fused tier (refused under MEMRA_MMVQ=0).
    fused_single: bool,
    /// The load-time stage plan.
    plan: StagePlan,
    /// The layers each stage walks (the plan's ranges).
    stages: Vec<Range<usize>>,
    /// The device slot of every stage (an index into `dm.gpus`).
    stage_slot: Vec<usize>,
    /// The stages grouped by device, in walk order.
    segments: Vec<Segment>,
    /// `handoffs[k - 1]` orders the copy from segment `k - 1` into segment `k`.
    handoffs: Vec<Handoff>,
    /// One fence per slot, for the unsplit walk's joins with the other devices.
    joins: Vec<Fence>,
    /// The slot whose scratch holds the logits of the last pass.
    logits_slot: usize,
    /// The device buffer holding the logits of the last sampled batched step, reused while
    /// large enough, and how many rows of it are parked (`None`: nothing parked). It lives
    /// on the head's device.
    parked: Option<CudaSlice<f32>>,
    parked_rows: Option<usize>,
    seqs: BTreeMap<SeqId, DevSeq>,
    generation: u64,
    scratch: Option<Buffers>,
    graphs: HashMap<GraphKey, Vec<Graph>>,
    /// The (sequence, generation) of every row the pointer tables hold now.
    tables_for: Vec<(SeqId, u64)>,
    use_graphs: bool,
    /// The activation trace being recorded, when enabled ([`Backend::start_trace`]); with
    /// `None` no site is copied anywhere and the decode steps replay their graphs.
    trace: Option<ActivationTrace>,
}

impl CudaBackend {
    /// Opens the devices the doors name and uploads `model` where their stage plan puts it.
    pub fn new(model: &LlamaModel, doors: Doors) -> Result<CudaBackend, EngineError> {
        let gpus = open_devices(&doors).map_err(EngineError::Unavailable)?;
        Self::on_devices(gpus, model, doors)
    }

    /// Uploads `model` to one opened device; the doors' stages must all name it.
    pub fn on_device(
        gpu: Gpu,
        model: &LlamaModel,
        doors: Doors,
    ) -> Result<CudaBackend, EngineError> {
        let dm = DevModel::upload(gpu, model)?;
        Self::with_model(Arc::new(dm), doors)
    }

    /// Uploads `model` to the devices [`open_devices`] opened for the same doors.
    pub fn on_devices(
        gpus: Vec<Gpu>,
        model: &LlamaModel,
        doors: Doors,
    ) -> Result<CudaBackend, EngineError> {
        let plan =
            StagePlan::from_doors(&doors, model.config.n_layer).map_err(EngineError::Model)?;
        let dm = DevModel::upload_placed(gpus, model, &plan)?;
        Self::with_model(Arc::new(dm), doors)
    }

    /// A backend under `doors` over a model already on the devices (several door settings
    /// can share one upload). The doors' plan must put every layer, the embedding and the
    /// head on the device that holds it.
    pub fn with_model(dm: Arc<DevModel>, doors: Doors) -> Result<CudaBackend, EngineError> {
        let plan = StagePlan::from_doors(&doors, dm.config.n_layer).map_err(EngineError::Model)?;
        let want = Placement::of(&plan);
        if let Some(why) = dm.placement.mismatch(&want) {
            return Err(EngineError::Model(format!(
                "the model was uploaded for another stage placement than the doors ask for \
                 ({plan}): {why}; upload it with DevModel::upload_placed under the same doors"
            )));
        }
        let stage_slot: Vec<usize> = plan
            .stages
            .iter()
            .map(|s| {
                dm.placement
                    .ordinals
                    .iter()
                    .position(|&o| o == s.device)
                    .ok_or_else(|| {
                        EngineError::Model(format!(
                            "stage device {} is not among the model's devices {:?}; upload \
                             the model with DevModel::upload_placed under the same doors",
                            s.device, dm.placement.ordinals
                        ))
                    })
            })
            .collect::<Result<_, _>>()?;
        let segments = segments(&stage_slot);
        let handoffs = segments
            .windows(2)
            .map(|w| {
                Ok(Handoff {
                    ready: dm.gpus[w[1].slot].fence().map_err(kernel_err)?,
                    copied: dm.gpus[w[0].slot].fence().map_err(kernel_err)?,
                })
            })
            .collect::<Result<_, EngineError>>()?;
        let joins = if dm.gpus.len() > 1 {
            dm.gpus
                .iter()
                .map(|g| g.fence().map_err(kernel_err))
                .collect::<Result<_, _>>()?
        } else {
            Vec::new()
        };
        let stages = plan.stages.iter().map(|s| s.layers.clone()).collect();
        Ok(CudaBackend {
            family: if doors.mmvq {
                MatvecFamily::Mmvq
            } else {
                MatvecFamily::Dp4a
            },
            fused_single: doors.mmvq && !doors.no_fuse_normq,
            plan,
            stages,
            stage_slot,
            segments,
            handoffs,
            joins,
            logits_slot: 0,
            parked: None,
            parked_rows: None,
            doors,
            dm,
            seqs: BTreeMap::new(),
            generation: 0,
            scratch: None,
            graphs: HashMap::new(),
            tables_for: Vec::new(),
            use_graphs: true,
            trace: None,
        })
    }

    /// The model on the devices.
    pub fn device_model(&self) -> &Arc<DevModel> {
        &self.dm
    }

    /// Switches CUDA graphs off (every launch eager) or on; the numbers are the same either
    /// way, only the launch overhead differs.
    pub fn set_graphs(&mut self, on: bool) {
        self.use_graphs = on;
        self.graphs.clear();
    }

    /// The primary device's name.
    pub fn device_name(&self) -> &str {
        self.dm.primary().name()
    }

    /// Every device's name and ordinal, the primary first.
    pub fn device_names(&self) -> String {
        self.dm.device_names()
    }

    fn reserve(&self, seq: SeqId, adding: usize) -> Result<usize, EngineError> {
        let st = self
            .seqs
            .get(&seq)
            .ok_or(EngineError::UnknownSequence(seq))?;
        reserve_positions(seq, st.len, st.capacity, adding)
    }

    fn stream(&self, slot: usize) -> Arc<CudaStream> {
        self.dm.gpus[slot].stream().clone()
    }

    /// The slot of the head: the last stage's device.
    fn head_slot(&self) -> usize {
        self.dm.placement.head_slot
    }

    /// Makes sure the step buffers cover the longest open sequence.
    fn ensure_scratch(&mut self) -> Result<(), EngineError> {
        let need = self.seqs.values().map(|s| s.capacity).max().unwrap_or(1);
        if self
            .scratch
            .as_ref()
            .is_some_and(|b| b.slots.iter().all(|s| s.max_len >= need))
        {
            return Ok(());
        }
        // Graphs hold the old addresses; drop them with the buffers.
        self.graphs.clear();
        self.tables_for.clear();
        self.scratch = None;
        let c = &self.dm.config;
        let slots = (0..self.dm.gpus.len())
            .map(|slot| {
                let owns: Vec<bool> = self.stage_slot.iter().map(|&s| s == slot).collect();
                Scratch::new(&self.stream(slot), c, need, &owns)
            })
            .collect::<Result<_, _>>()?;
        let table = |what: &str| -> Result<Vec<CudaSlice<u64>>, EngineError> {
            (0..c.n_layer)
                .map(|l| {
                    alloc(
                        &self.stream(self.dm.placement.layer_slot[l]),
                        what,
                        MAX_ROWS,
                    )
                })
                .collect()
        };
        self.scratch = Some(Buffers {
            slots,
            kptr: table("the K cache table")?,
            vptr: table("the V cache table")?,
        });
        Ok(())
    }

    /// Runs one pass of at most [`MAX_ROWS`] rows, leaving `[rows, n_vocab]` logits in the
    /// scratch logits buffer of `self.logits_slot`. `graph` replays (or captures) the pass as
    /// CUDA graphs, one per segment, unless a trace is being recorded: then every launch is
    /// eager, since a graph cannot stop to copy a site back. `head` are the rows whose
    /// logits the caller keeps, the rows whose head input a trace records (as the CPU
    /// backend records the head input of the rows it computes logits for).
    fn pass(
        &mut self,
        rows: &[RowSpec],
        tier: Tier,
        walk: Walk,
        graph: bool,
        head: Range<usize>,
    ) -> Result<(), EngineError> {
        debug_assert!(!rows.is_empty() && rows.len() <= MAX_ROWS);
        self.ensure_scratch()?;
        let n = rows.len();
        let ids: Vec<(SeqId, u64)> = rows
            .iter()
            .map(|r| (r.seq, self.seqs[&r.seq].generation))
            .collect();
        let dm = self.dm.clone();
        let bufs = self.scratch.as_mut().expect("ensured above");
        let tokens: Vec<u32> = rows.iter().map(|r| r.token).collect();
        let pos: Vec<i32> = rows.iter().map(|r| r.pos as i32).collect();
        let up = |e| device_err("copying the step inputs to the device", e);
        // The unsplit walk runs on the primary alone; the split walk on every device.
        let running = match walk {
            Walk::Split => dm.gpus.len(),
            Walk::Unsplit => 1,
        };
        for (slot, s) in bufs.slots.iter_mut().enumerate().take(running) {
            let stream = dm.gpus[slot].stream();
            stream
                .memcpy_htod(&tokens, &mut s.tokens.slice_mut(..n))
                .map_err(up)?;
            stream
                .memcpy_htod(&pos, &mut s.pos.slice_mut(..n))
                .map_err(up)?;
        }
        if self.tables_for != ids {
            // Each table is written on its own device's stream, where the split walk reads
            // it; the unsplit walk's reads from the primary are ordered by its join below.
            for l in 0..dm.config.n_layer {
                let gpu = &dm.gpus[dm.placement.layer_slot[l]];
                let kp: Vec<u64> = rows
                    .iter()
                    .map(|r| gpu.address(&self.seqs[&r.seq].k[l]))
                    .collect();
                let vp: Vec<u64> = rows
                    .iter()
                    .map(|r| gpu.address(&self.seqs[&r.seq].v[l]))
                    .collect();
                gpu.stream()
                    .memcpy_htod(&kp, &mut bufs.kptr[l].slice_mut(..n))
                    .map_err(up)?;
                gpu.stream()
                    .memcpy_htod(&vp, &mut bufs.vptr[l].slice_mut(..n))
                    .map_err(up)?;
            }
            self.tables_for = ids;
        }
        let longest = rows.iter().map(|r| r.pos + 1).max().unwrap_or(1);
        let chunks = longest
            .div_ceil(SPLIT_K_CHUNK)
            .next_power_of_two()
            .min(bufs.slots[0].max_chunks);
        let all_stages = [Segment {
            stages: 0..self.stages.len(),
            slot: 0,
        }];
        let segs: &[Segment] = match walk {
            Walk::Split => &self.segments,
            Walk::Unsplit => &all_stages,
        };
        // A decode step (every row its own sequence) lets the attention kernels rotate and
        // store the current token themselves; a prompt pass, whose rows read the cache slots
        // of the rows before them in the same pass, keeps the separate rope_store_rows launch.
        let c = &dm.config;
        let geometry = RopeStoreArgs {
            n_head: c.n_head,
            n_head_kv: c.n_head_kv,
            head_dim: c.head_dim,
        };
        let fuse_rope = distinct_sequences(rows) && geometry.rope_fusable();
        let ctx = PassCtx {
            dm: &dm,
            family: self.family,
            split_k: self.doors.fa3,
            n,
            tier,
            chunks,
            stages: &self.stages,
            n_segments: segs.len(),
            walk,
            skip_boundary_copy: self.doors.gate_defect == Some(GateDefect::BoundaryCopy),
            kptr: &bufs.kptr,
            vptr: &bufs.vptr,
            fuse_rope,
        };
        let cross_device_unsplit = walk == Walk::Unsplit && dm.gpus.len() > 1;
        if cross_device_unsplit {
            // The primary reads and writes the other devices' caches and reads their
            // tables: it starts after everything queued on them so far.
            for (fence, gpu) in self.joins.iter().zip(&dm.gpus).skip(1) {
                fence.record(gpu).map_err(kernel_err)?;
                fence.wait(&dm.gpus[0]).map_err(kernel_err)?;
            }
        }
        let key = GraphKey {
            rows: n,
            tier,
            chunks,
            walk,
            fuse_rope,
        };
        let replay = graph && self.use_graphs && self.trace.is_none();
        let mut tap = Tap {
            trace: self.trace.as_mut(),
            rows,
            head,
        };
        if replay && !self.graphs.contains_key(&key) {
            let captured = segs
                .iter()
                .enumerate()
                .map(|(k, seg)| capture(&ctx, k, seg, &mut bufs.slots[seg.slot]))
                .collect::<Result<Vec<_>, _>>()?;
            self.graphs.insert(key, captured);
        }
        for (k, seg) in segs.iter().enumerate() {
            if k > 0 {
                hand_over(
                    &ctx,
                    &self.handoffs[k - 1],
                    &segs[k - 1],
                    seg,
                    &mut bufs.slots,
                )?;
            }
            if replay {
                self.graphs[&key][k]
                    .0
                    .launch()
                    .map_err(|e| device_err("launching the decode graph", e))?;
            } else {
                encode(&ctx, k, seg, &mut bufs.slots[seg.slot], &mut tap).map_err(kernel_err)?;
            }
        }
        if cross_device_unsplit {
            // Later work on the other devices (their table uploads, a split pass over their
            // caches) starts after the primary's reads and writes of their memory.
            self.joins[0].record(&dm.gpus[0]).map_err(kernel_err)?;
            for gpu in &dm.gpus[1..] {
                self.joins[0].wait(gpu).map_err(kernel_err)?;
            }
        }
        self.logits_slot = segs.last().map_or(0, |s| s.slot);
        Ok(())
    }

    /// Copies the first `rows` rows of logits back.
    fn download_logits(&self, rows: usize) -> Result<Vec<f32>, EngineError> {
        let bufs = self.scratch.as_ref().expect("a pass ran");
        let s = &bufs.slots[self.logits_slot];
        let v = self.dm.config.n_vocab;
        let stream = self.stream(self.logits_slot);
        let mut out = vec![0.0f32; rows * v];
        stream
            .memcpy_dtoh(&s.logits.slice(..rows * v), &mut out)
            .map_err(|e| device_err("copying the logits back", e))?;
        // The logits' device is the end of the pass's event chain, so this covers every
        // earlier segment too.
        stream
            .synchronize()
            .map_err(|e| device_err("finishing the step", e))?;
        Ok(out)
    }

    /// Makes the parked-logits buffer (on the head's device) hold at least `rows` rows and
    /// marks nothing parked until the step that fills it completes.
    fn begin_parking(&mut self, rows: usize) -> Result<(), EngineError> {
        self.parked_rows = None;
        let need = rows * self.dm.config.n_vocab;
        if self.parked.as_ref().is_none_or(|b| b.len() < need) {
            self.parked = None;
            self.parked = Some(alloc(
                &self.stream(self.head_slot()),
                "the parked logits",
                need,
            )?);
        }
        Ok(())
    }

    /// Copies the `rows` logits rows of the last pass into the parked buffer at row
    /// `offset`, on the device and in stream order (before the sampler runs).
    fn park_chunk(&mut self, offset: usize, rows: usize) -> Result<(), EngineError> {
        if self.logits_slot != self.head_slot() {
            return Err(EngineError::Model(format!(
                "the logits to park are on device slot {} but the parked buffer on the head's \
                 slot {}; only split passes park their logits",
                self.logits_slot,
                self.head_slot()
            )));
        }
        let v = self.dm.config.n_vocab;
        let stream = self.stream(self.logits_slot);
        let bufs = self.scratch.as_ref().expect("a pass ran");
        let s = &bufs.slots[self.logits_slot];
        let dst = self.parked.as_mut().expect("begin_parking allocated it");
        stream
            .memcpy_dtod(
                &s.logits.slice(..rows * v),
                &mut dst.slice_mut(offset * v..(offset + rows) * v),
            )
            .map_err(|e| device_err("parking the logits of a sampled step", e))
    }

    /// Picks one token per row of the last pass on the logits' device and copies back only
    /// those.
    fn pick_tokens(
        &mut self,
        rows: &[RowSpec],
        params: &SamplingParams,
    ) -> Result<Vec<u32>, EngineError> {
        params.validate()?;
        let n = rows.len();
        let v = self.dm.config.n_vocab;
        let slot = self.logits_slot;
        let stream = self.stream(slot);
        let gpu = &self.dm.gpus[slot];
        let s = &mut self.scratch.as_mut().expect("a pass ran").slots[slot];
        if params.temperature == 0.0 {
            gpu.argmax(&s.logits, &mut s.picked, &mut s.argmax_scratch, n, v)
                .map_err(kernel_err)?;
        } else {
            let up = |e| device_err("copying the sampling keys to the device", e);
            let seqs: Vec<u32> = rows.iter().map(|r| r.seq.0).collect();
            // The step is the position the sampled token will take.
            let steps: Vec<u32> = rows.iter().map(|r| r.pos as u32 + 1).collect();
            stream
                .memcpy_htod(&seqs, &mut s.seq_ids.slice_mut(..n))
                .map_err(up)?;
            stream
                .memcpy_htod(&steps, &mut s.steps.slice_mut(..n))
                .map_err(up)?;
            gpu.sample(
                &s.logits,
                &mut s.p_scratch,
                &mut s.picked,
                n,
                v,
                params.temperature,
                params.top_p,
                params.seed,
                &s.seq_ids,
                &s.steps,
            )
            .map_err(kernel_err)?;
        }
        let mut out = vec![0u32; n];
        stream
            .memcpy_dtoh(&s.picked.slice(..n), &mut out)
            .map_err(|e| device_err("copying the picked tokens back", e))?;
        stream
            .synchronize()
            .map_err(|e| device_err("finishing the step", e))?;
        Ok(out)
    }

    fn commit(&mut self, seq: SeqId, added: usize) {
        if let Some(st) = self.seqs.get_mut(&seq) {
            st.len += added;
        }
    }

    /// The rows of a prompt appended to `seq`.
    fn prompt_rows(&self, seq: SeqId, tokens: &[u32]) -> Result<Vec<RowSpec>, EngineError> {
        if tokens.is_empty() {
            return Err(EngineError::Empty { what: "prompt" });
        }
        for &t in tokens {
            check_token(t, self.dm.config.n_vocab)?;
        }
        let start = self.reserve(seq, tokens.len())?;
        let n_vocab = self.dm.config.n_vocab;
        Ok(tokens
            .iter()
            .enumerate()
            .map(|(i, &token)| RowSpec {
                seq,
                pos: start + i,
                token: canary_token(&self.doors, token, n_vocab, start + i == 1),
            })
            .collect())
    }

    /// Prompt rows in passes of [`MAX_ROWS`]; returns the logits of every row, or of the
    /// last only.
    fn run_prompt(
        &mut self,
        seq: SeqId,
        tokens: &[u32],
        all_logits: bool,
    ) -> Result<Vec<f32>, EngineError> {
        let rows = self.prompt_rows(seq, tokens)?;
        let mut out = Vec::new();
        let chunks: Vec<&[RowSpec]> = rows.chunks(MAX_ROWS).collect();
        let last = chunks.len() - 1;
        for (i, chunk) in chunks.iter().enumerate() {
            // Prefill keeps every row's logits, priming only the prompt's last.
            let head = if all_logits {
                0..chunk.len()
            } else if i == last {
                chunk.len() - 1..chunk.len()
            } else {
                0..0
            };
            self.pass(chunk, Tier::Separate, Walk::Split, false, head)?;
            if all_logits {
                out.extend(self.download_logits(chunk.len())?);
            } else if i == last {
                let v = self.dm.config.n_vocab;
                let l = self.download_logits(chunk.len())?;
                out.extend_from_slice(&l[(chunk.len() - 1) * v..]);
            }
        }
        self.commit(seq, rows.len());
        Ok(out)
    }

    /// The single-sequence row of `seq` fed `token`.
    fn single_row(&self, seq: SeqId, token: u32) -> Result<(RowSpec, Tier), EngineError> {
        check_token(token, self.dm.config.n_vocab)?;
        let pos = self.reserve(seq, 1)?;
        let token = canary_token(&self.doors, token, self.dm.config.n_vocab, pos == 1);
        let tier = if self.fused_single {
            Tier::Fused
        } else {
            Tier::Separate
        };
        Ok((RowSpec { seq, pos, token }, tier))
    }

    /// One batched decode step over `walk`: validates every row before any cache moves.
    fn batch_step(
        &mut self,
        seqs: &[SeqId],
        tokens: &[u32],
        walk: Walk,
    ) -> Result<Vec<f32>, EngineError> {
        let rows = self.batch_rows(seqs, tokens)?;
        let mut out = Vec::with_capacity(rows.len() * self.dm.config.n_vocab);
        for chunk in rows.chunks(MAX_ROWS) {
            self.pass(chunk, Tier::Separate, walk, true, 0..chunk.len())?;
            out.extend(self.download_logits(chunk.len())?);
        }
        for &seq in seqs {
            self.commit(seq, 1);
        }
        Ok(out)
    }

    /// Refuses the unsplit walk, before anything runs, when the primary cannot access
    /// every other device's memory: the walk runs each layer on the primary and reads the
    /// weights, KV caches and cache tables where they live.
    fn check_unsplit_reach(&self) -> Result<(), EngineError> {
        let gpus = &self.dm.gpus;
        for (slot, other) in gpus.iter().enumerate().skip(1) {
            if !self.dm.peer.on(0, slot) {
                return Err(EngineError::Unavailable(format!(
                    "refused: the unsplit batched body runs every layer on CUDA device {} \
                     (stage 0's) and reads the weights and KV caches of device {} in place, \
                     but peer access from device {} to device {} is off \
                     (cuDeviceCanAccessPeer reports no peer path between them); run \
                     decode_step_batch (the split walk, which copies between devices), or \
                     place the stages on devices with peer access; no cache was touched",
                    gpus[0].ordinal(),
                    other.ordinal(),
                    gpus[0].ordinal(),
                    other.ordinal()
                )));
            }
        }
        Ok(())
    }

    /// The load-time stage plan this backend was built with.
    pub fn plan(&self) -> &StagePlan {
        &self.plan
    }

    /// The batched rows of one step, validated like the CPU backend's.
    fn batch_rows(&self, seqs: &[SeqId], tokens: &[u32]) -> Result<Vec<RowSpec>, EngineError> {
        batch_rows(seqs, tokens, &self.doors, self.dm.config.n_vocab, |seq| {
            self.reserve(seq, 1)
        })
    }
}

/// Whether no two rows of a pass belong to the same sequence.
fn distinct_sequences(rows: &[RowSpec]) -> bool {
    let seqs: BTreeSet<SeqId> = rows.iter().map(|r| r.seq).collect();
    seqs.len() == rows.len()
}

/// What one pass's launches depend on.
struct PassCtx<'a> {
    dm: &'a DevModel,
    family: MatvecFamily,
    split_k: bool,
    n: usize,
    tier: Tier,
    chunks: usize,
    /// The layers of every stage, in order.
    stages: &'a [Range<usize>],
    /// The segments of this walk (one for the unsplit walk); the last runs the head.
    n_segments: usize,
    walk: Walk,
    /// The test-only `boundary-copy` defect: a split walk's stage runs on whatever its
    /// buffers held instead of the previous stage's output.
    skip_boundary_copy: bool,
    /// Per layer, on that layer's device: the rows' cache addresses.
    kptr: &'a [CudaSlice<u64>],
    vptr: &'a [CudaSlice<u64>],
    /// Whether the attention kernels do the RoPE and the KV store of the current token
    /// (`attention_rope_*_rows`) instead of a `rope_store_rows` launch before them. Only
    /// when every row of the pass is a different sequence: the fused kernels use the
    /// current token's k and v from their own registers, so a row reading a slot another
    /// row of the same launch writes (a prompt pass) would read it unwritten.
    fuse_rope: bool,
}

impl PassCtx<'_> {
    /// Whether a layer runs before stage `stage`, i.e. whether the residual stream there
    /// has a pending `delta` to add.
    fn walked_before(&self, stage: usize) -> bool {
        self.stages[..stage].iter().any(|r| !r.is_empty())
    }
}

/// Where a pass's quantization sites go: nowhere (`trace: None`, the default, costing one
/// branch per site) or into the backend's activation trace, one record per row.
struct Tap<'a> {
    trace: Option<&'a mut ActivationTrace>,
    /// The pass's rows, in the order of the step buffers.
    rows: &'a [RowSpec],
    /// The rows whose head input is recorded (see [`CudaBackend::pass`]).
    head: Range<usize>,
}

impl Tap<'_> {
    /// A tap that records nothing.
    fn off() -> Tap<'static> {
        Tap {
            trace: None,
            rows: &[],
            head: 0..0,
        }
    }

    /// Whether sites are being recorded.
    fn on(&self) -> bool {
        self.trace.is_some()
    }

    /// Copies one site back and records each row's blocks: the first `rows * width / 32`
    /// blocks of `xq` and, in the fused composition, the first `rows` norm factors of `r`.
    /// The copies are queued on `gpu`'s stream, the stream whose launches produced the site,
    /// and waited for before the next launch is queued, so they see exactly this site.
    fn record(
        &mut self,
        gpu: &Gpu,
        layer: usize,
        site: Site,
        xq: &CudaSlice<BlockQ8_1>,
        width: usize,
        r: Option<&CudaSlice<f32>>,
    ) -> Result<(), KernelError> {
        let Some(trace) = self.trace.as_deref_mut() else {
            return Ok(());
        };
        let keep = if site == Site::HeadIn {
            self.head.clone()
        } else {
            0..self.rows.len()
        };
        if keep.is_empty() {
            return Ok(());
        }
        let n = self.rows.len();
        let per_row = width / QK;
        let driver = |source| KernelError::Driver {
            what: format!("copying the {site} activations of layer {layer} back for the trace"),
            source,
        };
        let stream = gpu.stream();
        let empty = BlockQ8_1 {
            d: half::f16::ZERO,
            s: half::f16::ZERO,
            qs: [0; QK],
        };
        let mut blocks = vec![empty; n * per_row];
        stream
            .memcpy_dtoh(&xq.slice(..n * per_row), &mut blocks)
            .map_err(driver)?;
        let factors = match r {
            Some(r) => {
                let mut f = vec![0.0f32; n];
                stream.memcpy_dtoh(&r.slice(..n), &mut f).map_err(driver)?;
                Some(f)
            }
            None => None,
        };
        stream.synchronize().map_err(driver)?;
        for i in keep {
            let row = &self.rows[i];
            let r = factors.as_ref().map(|f| f[i]);
            trace.record(
                SiteKey {
                    seq: row.seq,
                    pos: row.pos,
                    layer,
                    site,
                },
                SiteRecord {
                    composition: if r.is_some() {
                        Composition::Fused
                    } else {
                        Composition::Separate
                    },
                    blocks: blocks[i * per_row..(i + 1) * per_row].to_vec(),
                    r,
                },
            );
        }
        Ok(())
    }
}

/// Captures the launches of segment `k` of one pass as a graph on its device's stream.
fn capture(ctx: &PassCtx, k: usize, seg: &Segment, s: &mut Scratch) -> Result<Graph, EngineError> {
    let stream = ctx.dm.gpus[seg.slot].stream();
    stream
        .begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED)
        .map_err(|e| device_err("starting the graph capture", e))?;
    // A captured graph records nothing: tracing passes never capture.
    let encoded = encode(ctx, k, seg, s, &mut Tap::off());
    // End the capture whatever happened, so the stream is usable again.
    let ended = stream.end_capture(sys::CUgraphInstantiate_flags(0));
    encoded.map_err(kernel_err)?;
    match ended {
        Ok(Some(g)) => Ok(Graph(g)),
        Ok(None) => Err(EngineError::Unavailable(
            "the decode graph capture recorded nothing".into(),
        )),
        Err(e) => Err(device_err("instantiating the decode graph", e)),
    }
}

/// Hands the residual stream of segment `from` (its last stage's output) to the first stage
/// of segment `to` on another device, eagerly between the two segments' launches:
///
/// 1. the receiver records `ready`, and the sender waits for it: the receiver's earlier
///    work, which may still read the stage buffers about to be overwritten, comes first;
/// 2. the sender copies `x` (and the pending `delta` once a layer ran) into the receiving
///    stage's buffers with a peer copy queued after the sending segment on its own stream;
/// 3. the sender records `copied`, and the receiver waits for it before its segment.
///
/// Under the boundary-copy defect the copies are left out but the events stay, so the
/// receiving stage runs on whatever its buffers held while the pass still ends, as ever,
/// on the head's stream after every earlier segment.
fn hand_over(
    ctx: &PassCtx,
    handoff: &Handoff,
    from: &Segment,
    to: &Segment,
    slots: &mut [Scratch],
) -> Result<(), EngineError> {
    let (src_gpu, dst_gpu) = (&ctx.dm.gpus[from.slot], &ctx.dm.gpus[to.slot]);
    let (last, first) = (from.stages.end - 1, to.stages.start);
    let (src, dst) = pair_mut(slots, from.slot, to.slot).ok_or_else(|| {
        EngineError::Model(format!(
            "stage {last} and stage {first} are on the same device slot {}, yet in different \
             segments",
            from.slot
        ))
    })?;
    let missing = |stage: usize| {
        EngineError::Model(format!(
            "stage {stage} has no residual buffers on its device ({} stages)",
            ctx.stages.len()
        ))
    };
    let (sx, sd) = src.stream_after(last).ok_or_else(|| missing(last))?;
    let (dx, dd) = dst
        .stage_bufs
        .get_mut(first)
        .and_then(Option::as_mut)
        .ok_or_else(|| missing(first))?;
    let m = ctx.n * ctx.dm.config.n_embd;
    handoff.ready.record(dst_gpu).map_err(kernel_err)?;
    handoff.ready.wait(src_gpu).map_err(kernel_err)?;
    if !ctx.skip_boundary_copy {
        copy_peer(src_gpu, &sx.slice(..m), dst_gpu, &mut dx.slice_mut(..m)).map_err(kernel_err)?;
        if ctx.walked_before(first) {
            copy_peer(src_gpu, &sd.slice(..m), dst_gpu, &mut dd.slice_mut(..m))
                .map_err(kernel_err)?;
        }
    }
    handoff.copied.record(src_gpu).map_err(kernel_err)?;
    handoff.copied.wait(dst_gpu).map_err(kernel_err)
}

/// `&v[a]` and `&mut v[b]` for `a != b`.
fn pair_mut<T>(v: &mut [T], a: usize, b: usize) -> Option<(&T, &mut T)> {
    if a == b || a >= v.len() || b >= v.len() {
        return None;
    }
    if a < b {
        let (lo, hi) = v.split_at_mut(b);
        Some((&lo[a], &mut hi[0]))
    } else {
        let (lo, hi) = v.split_at_mut(a);
        Some((&hi[0], &mut lo[b]))
    }
}

/// `y = W · x` for `n` rows: q8_1 activations for quantized weights, f32 for float ones.
#[allow(clippy::too_many_arguments)]
fn matvec(
    gpu: &Gpu,
    family: MatvecFamily,
    w: &DevWeight,
    xq: &CudaSlice<BlockQ8_1>,
    xf: &CudaSlice<f32>,
    n: usize,
    y: &mut CudaSlice<f32>,
) -> Result<(), KernelError> {
    if w.quantized() {
        gpu.matvec(family, w.view(), w.rows, w.cols, xq, n, y)
    } else {
        gpu.matvec_float(w.view(), w.rows, w.cols, xf, n, y)
    }
}

/// Whether single-row matvecs compute their norm step as a prologue, and rows too wide for
/// that take the norm step split over blocks (see [`encode`]): `MEMRA_PROLOGUES`,
/// read once per process, `0` switches both off, `1` or unset leaves them on.
/// A performance switch for comparisons like `MEMRA_PDL`, not a door: both compute the same
/// bits. Another value is reported on stderr and leaves the default.
///
/// Measured in one run on the H200 (SmolLM2-shape Q4_1, B = 1, graphs, fused tier): off
/// 1,810–1,823 tokens/s, on 1,911. In isolation (ncu) a prologue matvec takes 5.5 µs against
/// 3.7 + 3.4 for the two launches it replaces. The same prologue for SwiGLU (every block
/// computing the 1,536-wide SwiGLU row before the down projection) measured slower, 1,703
/// alone and 1,823–1,836 with the norms: the launch it saves mostly overlapped already under
/// programmatic dependent launch, and each block ran its six blocks of 32 values in turn
/// where the standalone kernel runs them side by side. On the head, the 6,144 blocks would
/// each recompute the norm (1,768 with all three). Neither is kept. The split norm took
/// llama-7B Q4_1 B=1 from 459 to 531 tokens/s in one run.
fn norm_prologues_enabled() -> bool {
    static SETTING: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *SETTING.get_or_init(|| match std::env::var("MEMRA_PROLOGUES") {
        Ok(v) => parse_prologues(&v).unwrap_or_else(|| {
            eprintln!("MEMRA_PROLOGUES={v}: expected 0 (off) or 1 (on); keeping the default, on");
            true
        }),
        Err(_) => true,
    })
}

/// The `MEMRA_PROLOGUES` value: `Some(on)`, or `None` when it is neither 0 nor 1.
fn parse_prologues(v: &str) -> Option<bool> {
    match v.trim() {
        "0" => Some(false),
        "1" => Some(true),
        _ => None,
    }
}

/// The norm step of [`Gpu::add_rmsnorm_q8_1`] on the stream in `x`: with `split`, the
/// split-over-blocks kernel writes the updated stream to `x_alt` and the two swap (wide
/// rows, see [`encode`]); otherwise in place. `x_early`: the launch before this one
/// does not write `x` (see [`Gpu::add_rmsnorm_q8_1_split`]).
#[allow(clippy::too_many_arguments)]
fn norm_step<'a>(
    gpu: &Gpu,
    split: bool,
    x: &mut &'a mut CudaSlice<f32>,
    x_alt: &mut &'a mut CudaSlice<f32>,
    delta: Option<&CudaSlice<f32>>,
    g: &CudaSlice<f32>,
    xf: Option<&mut CudaSlice<f32>>,
    xq: &mut CudaSlice<BlockQ8_1>,
    r_out: Option<&mut CudaSlice<f32>>,
    n: usize,
    d: usize,
    eps: f32,
    x_early: bool,
) -> Result<(), KernelError> {
    if split {
        let share = Gpu::norm_split_share(n, d);
        gpu.add_rmsnorm_q8_1_split(x, delta, g, x_alt, xf, xq, r_out, n, d, eps, x_early, share)?;
        std::mem::swap(x, x_alt);
    } else {
        gpu.add_rmsnorm_q8_1(x, delta, g, xf, xq, r_out, n, d, eps)?;
    }
    Ok(())
}

/// Every launch of segment `k` of one pass, in stream order on the segment's device: the
/// embedding when the segment holds stage 0, its stages' layers (with the same-device
/// boundary copies of a split walk between them) and the head when it is the last segment.
/// The unsplit walk is one segment on the primary over every stage. With `tap` on, each
/// quantization site is copied back after the launch that produced it (eager passes only).
fn encode(
    ctx: &PassCtx,
    k: usize,
    seg: &Segment,
    s: &mut Scratch,
    tap: &mut Tap,
) -> Result<(), KernelError> {
    let dm = ctx.dm;
    let gpu = &dm.gpus[seg.slot];
    let rope_table = &dm.rope_tables[seg.slot];
    let c = &dm.config;
    let (n, fused) = (ctx.n, ctx.tier == Tier::Fused);
    let (d, qd, kvd, ff) = (c.n_embd, c.q_dim(), c.kv_dim(), c.n_ff);
    let geo = RopeStoreArgs {
        n_head: c.n_head,
        n_head_kv: c.n_head_kv,
        head_dim: c.head_dim,
    };
    let scale = 1.0 / (c.head_dim as f32).sqrt();
    let Scratch {
        x,
        x_alt,
        delta,
        xf,
        hf,
        att,
        xq,
        r,
        qkv,
        gu,
        part_o,
        part_ml,
        naive,
        logits,
        pos,
        tokens,
        max_len,
        stage_bufs,
        ..
    } = s;
    let mut stage_bufs: Vec<Option<&mut (CudaSlice<f32>, CudaSlice<f32>)>> =
        stage_bufs.iter_mut().map(Option::as_mut).collect();
    let mut buffers_of = |si: usize| {
        stage_bufs
            .get_mut(si)
            .and_then(Option::take)
            .map(|b| (&mut b.0, &mut b.1))
            .ok_or_else(|| KernelError::Shape {
                kernel: "stage boundary copy",
                message: format!(
                    "stage {si} has no buffers on CUDA device {} ({} stages)",
                    gpu.ordinal(),
                    ctx.stages.len()
                ),
            })
    };
    // The residual stream the walk is on now: the scratch's for the first stage, a stage's
    // own buffers after each boundary of a split walk (filled by the peer copy of
    // `hand_over` when the segment starts after stage 0).
    let (mut x, mut delta) = if seg.stages.start == 0 || ctx.walk == Walk::Unsplit {
        (x, delta)
    } else {
        buffers_of(seg.stages.start)?
    };
    // Whether a layer ran yet, i.e. whether `delta` holds a pending update to add.
    let mut walked = ctx.walk == Walk::Split && ctx.walked_before(seg.stages.start);
    // Single-row passes of the mmvq family compute the norm steps inside the matvecs that
    // consume them (a launch structure, not a numeric door: the blocks are the standalone
    // kernel's bits under both tiers, see docs/numerics.md), for quantized weights and rows
    // within the prologue's width, unless `MEMRA_PROLOGUES=0`. Traced passes keep the
    // standalone kernels, whose outputs are the sites the trace copies back.
    let prologues =
        n == 1 && ctx.family == MatvecFamily::Mmvq && !tap.on() && norm_prologues_enabled();
    // The buffer the next prologue norm writes the updated stream to; it swaps with `x`.
    let mut x_alt = x_alt;
    let norm_prologue =
        |w: &DevWeight| prologues && w.quantized() && d <= Gpu::NORM_PROLOGUE_MAX_COLS;
    // Rows too wide for the prologue (llama-7B's 4096), single or batched, take the norm step
    // split over blocks, out of place: it writes the updated stream to `x_alt` and the walk
    // swaps, as it does after a prologue (both norms of every layer, so again an even number
    // of flips).
    let split_norm = !tap.on()
        && norm_prologues_enabled()
        && d > Gpu::NORM_PROLOGUE_MAX_COLS
        && d <= Gpu::NORM_WIDE_MAX_COLS;

    if seg.stages.start == 0 {
        gpu.embed(dm.token_embd.view(), c.n_vocab, d, tokens, x, n)?;
    }
    for si in seg.stages.clone() {
        if si > seg.stages.start && ctx.walk == Walk::Split {
            let (sx, sd) = buffers_of(si)?;
            if !ctx.skip_boundary_copy {
                let m = n * d;
                let stream = gpu.stream();
                stream
                    .memcpy_dtod(&x.slice(..m), &mut sx.slice_mut(..m))
                    .map_err(|source| KernelError::Driver {
                        what: format!("copying the residual stream into stage {si}"),
                        source,
                    })?;
                if walked {
                    stream
                        .memcpy_dtod(&delta.slice(..m), &mut sd.slice_mut(..m))
                        .map_err(|source| KernelError::Driver {
                            what: format!("copying the pending residual update into stage {si}"),
                            source,
                        })?;
                }
            }
            (x, delta) = (sx, sd);
        }
        for l in ctx.stages[si].clone() {
            let layer = &dm.layers[l];
            // Both norms of a layer take the prologue or neither, so the residual stream
            // flips buffers an even number of times and the layer ends where it started
            // (the boundary copies and `hand_over` read it there).
            let fuse_norms = norm_prologue(&layer.wqkv) && norm_prologue(&layer.w_gu);
            // Attention block; the previous layer's feed-forward output is added first.
            if fuse_norms {
                gpu.matvec_norm_b1(
                    layer.wqkv.view(),
                    layer.wqkv.rows,
                    d,
                    x,
                    walked.then_some(&*delta),
                    &layer.attn_norm,
                    c.rms_eps,
                    x_alt,
                    fused.then_some(&mut *r),
                    qkv,
                )?;
                std::mem::swap(&mut x, &mut x_alt);
            } else {
                norm_step(
                    gpu,
                    split_norm,
                    &mut x,
                    &mut x_alt,
                    walked.then_some(&*delta),
                    &layer.attn_norm,
                    (!layer.wqkv.quantized()).then_some(&mut *xf),
                    xq,
                    fused.then_some(&mut *r),
                    n,
                    d,
                    c.rms_eps,
                    // After a layer, x is the previous layer's feed-forward norm step's
                    // output, three launches back; before the first, the embedding or a
                    // boundary copy has just written it.
                    walked,
                )?;
                tap.record(gpu, l, Site::AttnIn, xq, d, fused.then_some(&*r))?;
                matvec(gpu, ctx.family, &layer.wqkv, xq, xf, n, qkv)?;
            }
            let rows = AttnRows {
                pos,
                k_cache: &ctx.kptr[l],
                v_cache: &ctx.vptr[l],
                batch: n,
            };
            let post_scale = fused.then_some(&*r);
            if !ctx.fuse_rope {
                gpu.rope_store_rows(qkv, rope_table, post_scale, &rows, geo)?;
            }
            // The attention kernels quantize their output for a quantized wo when the head
            // width allows, saving a launch per layer; the blocks are the same either way.
            let quantize_in_attention = layer.wo.quantized() && attention_can_quantize(c.head_dim);
            let outq = quantize_in_attention.then_some(&mut *xq);
            // With a single chunk the split-K composition is the one-block-per-head one bit for
            // bit (the combine multiplies by expf(0) = 1 and adds to 0), so short contexts run the
            // single kernel and skip the combine launch. The fused forms compute exactly what
            // rope_store_rows followed by the unfused kernel computes.
            if ctx.split_k && ctx.chunks > 1 && ctx.fuse_rope {
                gpu.attention_rope_split_k_rows(
                    qkv, rope_table, post_scale, &rows, att, outq, part_o, part_ml, geo,
                    ctx.chunks, scale,
                )?;
            } else if ctx.split_k && ctx.chunks > 1 {
                gpu.attention_split_k_rows(
                    qkv,
                    qd + 2 * kvd,
                    &rows,
                    att,
                    outq,
                    part_o,
                    part_ml,
                    geo,
                    ctx.chunks,
                    scale,
                )?;
            } else if ctx.fuse_rope {
                gpu.attention_rope_naive_rows(
                    qkv, rope_table, post_scale, &rows, att, outq, naive, geo, *max_len, scale,
                )?;
            } else {
                gpu.attention_naive_rows(
                    qkv,
                    qd + 2 * kvd,
                    &rows,
                    att,
                    outq,
                    naive,
                    geo,
                    *max_len,
                    scale,
                )?;
            }
            // A float wo reads `att` itself; the trace still holds the quantized attention
            // output there, as the CPU backend records it for every weight type.
            if (layer.wo.quantized() || tap.on()) && !quantize_in_attention {
                gpu.quantize_q8_1_n(att, xq, n * qd / QK)?;
            }
            tap.record(gpu, l, Site::AttnOut, xq, qd, None)?;
            matvec(gpu, ctx.family, &layer.wo, xq, att, n, delta)?;

            // Feed-forward block.
            if fuse_norms {
                gpu.matvec_norm_b1(
                    layer.w_gu.view(),
                    layer.w_gu.rows,
                    d,
                    x,
                    Some(&*delta),
                    &layer.ffn_norm,
                    c.rms_eps,
                    x_alt,
                    fused.then_some(&mut *r),
                    gu,
                )?;
                std::mem::swap(&mut x, &mut x_alt);
            } else {
                norm_step(
                    gpu,
                    split_norm,
                    &mut x,
                    &mut x_alt,
                    Some(&*delta),
                    &layer.ffn_norm,
                    (!layer.w_gu.quantized()).then_some(&mut *xf),
                    xq,
                    fused.then_some(&mut *r),
                    n,
                    d,
                    c.rms_eps,
                    // x is this layer's attention norm step's output, three launches back.
                    true,
                )?;
                tap.record(gpu, l, Site::FfnIn, xq, d, fused.then_some(&*r))?;
                matvec(gpu, ctx.family, &layer.w_gu, xq, xf, n, gu)?;
            }
            gpu.swiglu_q8_1(
                gu,
                fused.then_some(&*r),
                (!layer.w_down.quantized()).then_some(&mut *hf),
                xq,
                n,
                ff,
            )?;
            tap.record(gpu, l, Site::FfnDownIn, xq, ff, None)?;
            matvec(gpu, ctx.family, &layer.w_down, xq, hf, n, delta)?;
            walked = true;
        }
    }
    if k + 1 < ctx.n_segments {
        // A later segment, on another device, continues from this residual stream.
        return Ok(());
    }
    let head = dm.head();
    // Nothing reads the stream after the head's norm, so a flip here needs no partner.
    norm_step(
        gpu,
        split_norm,
        &mut x,
        &mut x_alt,
        walked.then_some(&*delta),
        &dm.output_norm,
        (!head.quantized()).then_some(&mut *xf),
        xq,
        fused.then_some(&mut *r),
        n,
        d,
        c.rms_eps,
        walked,
    )?;
    tap.record(gpu, c.n_layer, Site::HeadIn, xq, d, fused.then_some(&*r))?;
    // The fused tier (single rows, mmvq) applies the head's post-scale as the matvec writes
    // each logit: the same multiply as the scale launch it saves.
    if fused && n == 1 && ctx.family == MatvecFamily::Mmvq && head.quantized() {
        gpu.matvec_scaled_b1(head.view(), head.rows, head.cols, xq, r, logits)?;
    } else {
        matvec(gpu, ctx.family, head, xq, xf, n, logits)?;
        if fused {
            gpu.scale(logits, r, n * c.n_vocab, c.n_vocab)?;
        }
    }
    Ok(())
}

impl Backend for CudaBackend {
    fn config(&self) -> &LlamaConfig {
        &self.dm.config
    }

    fn doors_report(&self) -> DoorsReport {
        let d = &self.doors;
        DoorsReport {
            backend: "cuda",
            matvec: if self.dm.quantized {
                self.family.name()
            } else {
                "float"
            },
            norm: if self.fused_single {
                "fused"
            } else {
                "separate"
            },
            attention: if d.fa3 { "split-k" } else { "naive" },
            b1fast: d.serve_b1fast,
            pp_stages: self.stages.len(),
            pp_devices: self.plan.devices_text(),
            pp_splits: self.plan.splits_text(),
            gate_seed: d.gate_seed,
            canary: d.gate_canary,
        }
    }

    fn open_sequence(&mut self, seq: SeqId, capacity: usize) -> Result<(), EngineError> {
        if self.seqs.contains_key(&seq) {
            return Err(EngineError::SequenceExists(seq));
        }
        let c = &self.dm.config;
        if capacity == 0 || capacity > c.n_ctx {
            return Err(EngineError::BadCapacity {
                capacity,
                n_ctx: c.n_ctx,
            });
        }
        let n = capacity * c.kv_dim();
        let what = format!("the KV cache of {seq} ({capacity} positions)");
        let mut k = Vec::with_capacity(c.n_layer);
        let mut v = Vec::with_capacity(c.n_layer);
        for l in 0..c.n_layer {
            // Each layer's caches live on the device that runs the layer.
            let stream = self.stream(self.dm.placement.layer_slot[l]);
            k.push(alloc(&stream, &what, n)?);
            v.push(alloc(&stream, &what, n)?);
        }
        self.generation += 1;
        self.seqs.insert(
            seq,
            DevSeq {
                len: 0,
                capacity,
                generation: self.generation,
                k,
                v,
            },
        );
        Ok(())
    }

    fn close_sequence(&mut self, seq: SeqId) -> Result<(), EngineError> {
        self.seqs
            .remove(&seq)
            .ok_or(EngineError::UnknownSequence(seq))?;
        Ok(())
    }

    fn seq_len(&self, seq: SeqId) -> Result<usize, EngineError> {
        self.seqs
            .get(&seq)
            .map(|s| s.len)
            .ok_or(EngineError::UnknownSequence(seq))
    }

    fn prefill(&mut self, seq: SeqId, tokens: &[u32]) -> Result<Vec<f32>, EngineError> {
        self.run_prompt(seq, tokens, true)
    }

    fn prime(&mut self, seq: SeqId, tokens: &[u32]) -> Result<Vec<f32>, EngineError> {
        self.run_prompt(seq, tokens, false)
    }

    fn decode_step_h(&mut self, seq: SeqId, token: u32) -> Result<Vec<f32>, EngineError> {
        let (row, tier) = self.single_row(seq, token)?;
        self.pass(&[row], tier, Walk::Split, true, 0..1)?;
        let logits = self.download_logits(1)?;
        self.commit(seq, 1);
        Ok(logits)
    }

    fn decode_step_batch(
        &mut self,
        seqs: &[SeqId],
        tokens: &[u32],
    ) -> Result<Vec<f32>, EngineError> {
        if seqs.len() == 1 && tokens.len() == 1 && self.doors.serve_b1fast {
            return self.decode_step_h(seqs[0], tokens[0]);
        }
        self.batch_step(seqs, tokens, Walk::Split)
    }

    fn decode_step_batch_unsplit(
        &mut self,
        seqs: &[SeqId],
        tokens: &[u32],
    ) -> Result<Vec<f32>, EngineError> {
        if self.plan.is_split() && !self.doors.pp_allow_unsplit_batch {
            return Err(EngineError::Unavailable(self.plan.unsplit_refusal()));
        }
        self.check_unsplit_reach()?;
        self.batch_step(seqs, tokens, Walk::Unsplit)
    }

    fn start_trace(&mut self) -> bool {
        self.trace.get_or_insert_with(ActivationTrace::new);
        true
    }

    fn take_trace(&mut self) -> Option<ActivationTrace> {
        self.trace.as_mut().map(std::mem::take)
    }

    fn parked_logits(&self) -> Result<Vec<f32>, EngineError> {
        let (Some(buf), Some(rows)) = (self.parked.as_ref(), self.parked_rows) else {
            return Err(EngineError::Unavailable(
                "no logits are parked: run decode_step_batch_sampled first".into(),
            ));
        };
        let stream = self.stream(self.head_slot());
        let mut out = vec![0.0f32; rows * self.dm.config.n_vocab];
        stream
            .memcpy_dtoh(&buf.slice(..out.len()), &mut out)
            .map_err(|e| device_err("copying the parked logits back", e))?;
        stream
            .synchronize()
            .map_err(|e| device_err("finishing the parked logits copy", e))?;
        Ok(out)
    }

    fn decode_step_h_sampled(
        &mut self,
        seq: SeqId,
        token: u32,
        params: &SamplingParams,
    ) -> Result<u32, EngineError> {
        params.validate()?;
        let (row, tier) = self.single_row(seq, token)?;
        self.pass(&[row], tier, Walk::Split, true, 0..1)?;
        let t = self.pick_tokens(&[row], params)?;
        self.commit(seq, 1);
        Ok(t[0])
    }

    fn decode_step_batch_sampled(
        &mut self,
        seqs: &[SeqId],
        tokens: &[u32],
        params: &SamplingParams,
    ) -> Result<Vec<u32>, EngineError> {
        params.validate()?;
        if seqs.len() == 1 && tokens.len() == 1 && self.doors.serve_b1fast {
            // The single-sequence route, parking its one row like the batched route.
            let (row, tier) = self.single_row(seqs[0], tokens[0])?;
            self.begin_parking(1)?;
            self.pass(&[row], tier, Walk::Split, true, 0..1)?;
            self.park_chunk(0, 1)?;
            let t = self.pick_tokens(&[row], params)?;
            self.commit(seqs[0], 1);
            self.parked_rows = Some(1);
            return Ok(t);
        }
        let rows = self.batch_rows(seqs, tokens)?;
        self.begin_parking(rows.len())?;
        let mut out = Vec::with_capacity(rows.len());
        for (i, chunk) in rows.chunks(MAX_ROWS).enumerate() {
            self.pass(chunk, Tier::Separate, Walk::Split, true, 0..chunk.len())?;
            self.park_chunk(i * MAX_ROWS, chunk.len())?;
            out.extend(self.pick_tokens(chunk, params)?);
        }
        for &seq in seqs {
            self.commit(seq, 1);
        }
        self.parked_rows = Some(rows.len());
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seg(stages: Range<usize>, slot: usize) -> Segment {
        Segment { stages, slot }
    }

    #[test]
    fn consecutive_stages_on_one_device_form_one_segment() {
        // One device: today's single graph.
        assert_eq!(segments(&[0, 0, 0]), vec![seg(0..3, 0)]);
        assert_eq!(segments(&[0]), vec![seg(0..1, 0)]);
        assert_eq!(segments(&[0, 1]), vec![seg(0..1, 0), seg(1..2, 1)]);
        assert_eq!(segments(&[0, 0, 1, 1]), vec![seg(0..2, 0), seg(2..4, 1)]);
        // A device that comes back later is a new segment on the same slot.
        assert_eq!(
            segments(&[0, 1, 0]),
            vec![seg(0..1, 0), seg(1..2, 1), seg(2..3, 0)]
        );
    }

    #[test]
    fn segments_follow_the_placement_of_a_plan() {
        let doors = Doors {
            pp_stages: 4,
            pp_devices: vec![1, 1, 0, 0],
            ..Doors::default()
        };
        let plan = StagePlan::from_doors(&doors, 8).unwrap();
        let p = Placement::of(&plan);
        assert_eq!(p.ordinals, vec![1, 0]);
        assert_eq!(segments(&p.stage_slot), vec![seg(0..2, 0), seg(2..4, 1)]);
    }

    #[test]
    fn the_distinct_devices_keep_stage_order() {
        let doors = |devices: Vec<usize>| Doors {
            pp_stages: devices.len(),
            pp_devices: devices,
            ..Doors::default()
        };
        assert_eq!(distinct_devices(&doors(vec![1, 0])), vec![1, 0]);
        assert_eq!(distinct_devices(&doors(vec![0, 0, 0])), vec![0]);
        assert_eq!(distinct_devices(&doors(vec![2, 0, 2, 1])), vec![2, 0, 1]);
        assert_eq!(distinct_devices(&doors(Vec::new())), vec![0]);
    }

    /// A prompt pass (rows of one sequence) must keep the separate RoPE/KV-store launch: its
    /// rows read cache slots that earlier rows of the same launch write.
    #[test]
    fn only_passes_of_distinct_sequences_fuse_rope_into_attention() {
        let row = |seq: u32, pos: usize| RowSpec {
            seq: SeqId(seq),
            pos,
            token: 1,
        };
        assert!(distinct_sequences(&[row(0, 5)]));
        assert!(distinct_sequences(&[row(0, 5), row(3, 9), row(1, 0)]));
        assert!(!distinct_sequences(&[row(2, 0), row(2, 1), row(2, 2)]));
        assert!(!distinct_sequences(&[row(0, 4), row(1, 7), row(0, 5)]));
    }

    #[test]
    fn prologue_setting_takes_0_and_1_only() {
        assert_eq!(parse_prologues("0"), Some(false));
        assert_eq!(parse_prologues(" 1 "), Some(true));
        assert_eq!(parse_prologues("norm"), None);
        assert_eq!(parse_prologues(""), None);
    }

    #[test]
    fn pair_mut_refuses_one_slot_twice() {
        let mut v = vec![1, 2, 3];
        assert!(pair_mut(&mut v, 1, 1).is_none());
        assert!(pair_mut(&mut v, 0, 3).is_none());
        let (a, b) = pair_mut(&mut v, 2, 0).unwrap();
        *b += *a;
        let (a, b) = pair_mut(&mut v, 0, 1).unwrap();
        *b += *a;
        assert_eq!(v, vec![4, 6, 3]);
    }
}
