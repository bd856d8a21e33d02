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
//! in `docs/numerics.md`; the model upload and its placement are in `weights`.
//!
//! Everything a step changes (token ids, positions, hence lengths) lives in device buffers,
//! so the launches of one decode step are captured once per (rows, tier, attention chunk
//! bucket, walk) and replayed. Sampled steps ("lean ticks") pick tokens on the device and copy
//! back only the tokens, parking their logits in a device buffer for
//! [`Backend::parked_logits`]; each row is picked under its own sampling parameters (one
//! `sample_rows_f32` launch per pass, or the argmax kernel when every row is greedy).
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
//! `segments::hand_over`). The unsplit walk ([`Backend::decode_step_batch_walk`] over [`super::Walk::Unsplit`])
//! runs every stage-owned layer on the primary's buffers, reading the other devices'
//! weights and caches through peer access; it is refused where peer access is off.
//!
//! This file owns the backend itself: the sequences, the pass (what it depends on, which
//! walk and graph it takes), parking and picking tokens, and the engine API. The rest sits
//! in one file per idea, in the order a pass uses them: `device` (opening the devices, the
//! step buffers), `segments` (the walks, the hand-over between devices), `graph` (capture
//! and the key a graph replays under), `step` (the launches of one segment, in the named
//! blocks of the CPU backend's forward pass), `tap` (the trace's quantization sites) and
//! `weights` (the model on the devices).

pub mod bench;
mod device;
mod graph;
mod segments;
mod step;
mod tap;
mod weights;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::ops::Range;
use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream};
use memra_kernels::cuda::{Fence, Gpu, RopeStoreArgs, Tuning};
use memra_kernels::twin::{MatvecFamily, SPLIT_K_CHUNK};

pub(crate) use device::device_err;
pub use device::{open_device, open_devices, upload_for};
/// The kernel checks' row format and comparisons (`kernel-check`'s), which `cuda-check`
/// reports the backend in as well.
pub use memra_kernels::check::report as kernel_check;
pub use weights::{DevModel, DevWeight, PeerAccess, Placement};

use super::stages::StagePlan;
use super::trace::ActivationTrace;
use super::{Backend, ClearedWalk, Pass, RowSpec, SeqsKey, Sequences, Tier, Walk, norm_eps};
use crate::doors::{Doors, DoorsReport, GateDefect};
use crate::error::EngineError;
use crate::model::{LlamaConfig, LlamaModel};
use crate::sampling::SamplingParams;
use crate::seq::SeqId;
use device::{Buffers, Scratch, alloc, kernel_err};
use graph::{Graph, GraphKey, capture};
use segments::{Handoff, Segment, hand_over, segments};
use step::encode;
use tap::Tap;

/// Rows of one pass: decode batches and prompt chunks larger than this run as several
/// passes (rows are independent, so the split changes no bit).
pub const MAX_ROWS: usize = 64;

/// A sequence's KV caches, one `[capacity, kv_dim]` buffer per layer on that layer's device
/// (its length is the engine API's, in [`Sequences`]).
struct DevCaches {
    /// Positions each buffer holds: every row a pass writes is checked against it.
    capacity: usize,
    /// Distinguishes a reopened id from the sequence it replaced in the pointer tables.
    generation: u64,
    k: Vec<CudaSlice<f32>>,
    v: Vec<CudaSlice<f32>>,
}

/// The CUDA backend. See the module docs.
pub struct CudaBackend {
    dm: Arc<DevModel>,
    doors: Doors,
    family: MatvecFamily,
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
    seqs: Sequences,
    caches: BTreeMap<SeqId, DevCaches>,
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
            seqs: Sequences::default(),
            caches: BTreeMap::new(),
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

    fn stream(&self, slot: usize) -> Arc<CudaStream> {
        self.dm.gpus[slot].stream().clone()
    }

    /// The slot of the head: the last stage's device.
    fn head_slot(&self) -> usize {
        self.dm.placement.head_slot
    }

    /// Makes sure the step buffers cover the longest open sequence.
    fn ensure_scratch(&mut self) -> Result<(), EngineError> {
        let need = self.caches.values().map(|c| c.capacity).max().unwrap_or(1);
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
    /// scratch logits buffer of `self.logits_slot`. A decode step (`kind` other than
    /// [`Pass::Prompt`]) replays (or captures) the pass as CUDA graphs, one per segment,
    /// unless a trace is being recorded: then every launch is eager, since a graph cannot
    /// stop to copy a site back. `head` are the rows whose logits the caller keeps, the rows
    /// whose head input a trace records (as the CPU backend records the head input of the
    /// rows it computes logits for).
    // Over 150 lines: one pass's setup in order (inputs to every running device, the block
    // tables, the rope geometry and whether the attention may store, the planted defects, the
    // pass context) and then its launch, captured as a graph or not; they share the buffers.
    fn pass(
        &mut self,
        rows: &[RowSpec],
        tier: Tier,
        walk: Walk,
        kind: Pass,
        head: Range<usize>,
    ) -> Result<(), EngineError> {
        debug_assert!(!rows.is_empty() && rows.len() <= MAX_ROWS);
        self.ensure_scratch()?;
        let n = rows.len();
        let ids: Vec<(SeqId, u64)> = rows
            .iter()
            .map(|r| (r.seq, self.caches[&r.seq].generation))
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
                    .map(|r| gpu.address(&self.caches[&r.seq].k[l]))
                    .collect();
                let vp: Vec<u64> = rows
                    .iter()
                    .map(|r| gpu.address(&self.caches[&r.seq].v[l]))
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
        // The q8_0 KV cache rounds the stored rows in a launch of its own, between the store
        // and the attention that reads them, so its passes keep the separate store.
        let fuse_rope = distinct_sequences(rows) && geometry.rope_fusable() && !self.doors.kv_q8;
        // A prompt chunk's rows (never a verify pass's few rows, which a tile of 16 would
        // run one after another in fewer blocks).
        let one_sequence = kind == Pass::Prompt && n > 1;
        // The test-only `batch-reduction` defect, as the CPU backend plants it: a batched
        // step of two or more rows (a batch above MAX_ROWS counts per pass) takes the head's
        // rmsnorm with its sum of squares in reverse order.
        let reversed_head_norm = kind == Pass::Batched
            && n >= 2
            && self.doors.gate_defect == Some(GateDefect::BatchReduction);
        // The test-only `stage-column` defect: a verify pass's boundary copies drop the last
        // row, so the next stage reads that row's stale buffer.
        let boundary_rows =
            if kind == Pass::Verify && self.doors.gate_defect == Some(GateDefect::StageColumn) {
                n - 1
            } else {
                n
            };
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
            reversed_head_norm,
            boundary_rows,
            kv_q8: self
                .doors
                .kv_q8
                .then(|| GateDefect::kv_qmax(self.doors.gate_defect)),
            eps: norm_eps(&self.doors, tier == Tier::Fused, c.rms_eps),
            kptr: &bufs.kptr,
            vptr: &bufs.vptr,
            fuse_rope,
            one_sequence,
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
            reversed_head_norm,
            boundary_rows,
        };
        let replay = kind != Pass::Prompt && self.use_graphs && self.trace.is_none();
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
    /// those: row `j` of `rows` under `params[j]`. `first_row` is the batch row index of
    /// `rows[0]` (a batch above [`MAX_ROWS`] picks per pass), which only the test-only
    /// `sample-counter` defect reads.
    fn pick_tokens(
        &mut self,
        rows: &[RowSpec],
        params: &[SamplingParams],
        first_row: usize,
    ) -> Result<Vec<u32>, EngineError> {
        if params.len() != rows.len() {
            return Err(EngineError::BadSampling(format!(
                "{} sampling parameter sets for {} rows: give one per row",
                params.len(),
                rows.len()
            )));
        }
        for p in params {
            p.validate()?;
        }
        let n = rows.len();
        let v = self.dm.config.n_vocab;
        let wrong_counter = self.doors.gate_defect == Some(GateDefect::SampleCounter);
        let nucleus = crate::sampling::nucleus(&self.doors);
        let slot = self.logits_slot;
        let stream = self.stream(slot);
        let gpu = &self.dm.gpus[slot];
        let s = &mut self.scratch.as_mut().expect("a pass ran").slots[slot];
        if params.iter().all(|p| p.temperature == 0.0) {
            gpu.argmax(&s.logits, &mut s.picked, &mut s.argmax_scratch, n, v)
                .map_err(kernel_err)?;
        } else {
            let up = |e| device_err("copying the sampling keys to the device", e);
            let seqs: Vec<u32> = rows.iter().map(|r| r.seq.0).collect();
            let steps: Vec<u32> = rows
                .iter()
                .enumerate()
                .map(|(j, r)| {
                    // The step is the position the sampled token will take; the planted
                    // defect keys the stream by the batch row as well.
                    let step = r.pos + 1;
                    let counter = if wrong_counter {
                        step + first_row + j
                    } else {
                        step
                    };
                    counter as u32
                })
                .collect();
            let temps: Vec<f32> = params.iter().map(|p| p.temperature).collect();
            let top_ks: Vec<u32> = params.iter().map(|p| p.top_k).collect();
            let top_ps: Vec<f32> = params.iter().map(|p| p.top_p).collect();
            let seeds: Vec<u64> = params.iter().map(|p| p.seed).collect();
            stream
                .memcpy_htod(&seqs, &mut s.seq_ids.slice_mut(..n))
                .map_err(up)?;
            stream
                .memcpy_htod(&steps, &mut s.steps.slice_mut(..n))
                .map_err(up)?;
            stream
                .memcpy_htod(&temps, &mut s.temps.slice_mut(..n))
                .map_err(up)?;
            stream
                .memcpy_htod(&top_ks, &mut s.top_ks.slice_mut(..n))
                .map_err(up)?;
            stream
                .memcpy_htod(&top_ps, &mut s.top_ps.slice_mut(..n))
                .map_err(up)?;
            stream
                .memcpy_htod(&seeds, &mut s.seeds.slice_mut(..n))
                .map_err(up)?;
            // Greedy rows of a mixed batch take the sampler's own argmax, the same total
            // order as the argmax kernel's, hence the same token.
            gpu.sample_rows(
                &s.logits,
                &mut s.p_scratch,
                &mut s.picked,
                n,
                v,
                &s.temps,
                &s.top_ks,
                &s.top_ps,
                &s.seeds,
                &s.seq_ids,
                &s.steps,
                nucleus,
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

    /// The composition of `pass` under this backend's doors ([`Tier::of`]).
    fn tier(&self, pass: Pass) -> Tier {
        Tier::of(pass, &self.doors)
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
    /// The test-only `batch-reduction` defect: the head's norm step of this batched pass is
    /// followed by `rmsnorm_quantize_reversed`, which rewrites its outputs in the fused
    /// composition from a sum of squares in reverse order, and the logits are post-scaled.
    reversed_head_norm: bool,
    /// The rows every boundary copy of this pass moves: all `n`, but one fewer under the
    /// test-only `stage-column` defect of a verify pass.
    boundary_rows: usize,
    /// Under `MEMRA_KV_Q8=1`, the levels each side of zero the rows just stored are rounded
    /// with after the store (127: q8_0; [`GateDefect::kv_qmax`]).
    kv_q8: Option<i32>,
    /// The rms epsilon of this pass's norm steps (`backend::norm_eps`: the model's, but for
    /// the fused tier under the test-only `fused-norm` defect). A process's doors never
    /// change, so graphs captured with it replay only passes that want it.
    eps: f32,
    /// Per layer, on that layer's device: the rows' cache addresses.
    kptr: &'a [CudaSlice<u64>],
    vptr: &'a [CudaSlice<u64>],
    /// Whether the attention kernels do the RoPE and the KV store of the current token
    /// (`attention_rope_*_rows`) instead of a `rope_store_rows` launch before them. Only
    /// when every row of the pass is a different sequence: the fused kernels use the
    /// current token's k and v from their own registers, so a row reading a slot another
    /// row of the same launch writes (a prompt pass) would read it unwritten.
    fuse_rope: bool,
    /// Whether the pass is a prompt chunk of two rows or more, every row reading one
    /// sequence's caches: its split-K attention copies each chunk of K and V rows into
    /// shared memory once per tile of rows (`attention_split_k_tile_rows`, the same bits).
    /// Prompt passes are never captured as graphs.
    one_sequence: bool,
}

impl PassCtx<'_> {
    /// Whether a layer runs before stage `stage`, i.e. whether the residual stream there
    /// has a pending `delta` to add.
    fn walked_before(&self, stage: usize) -> bool {
        self.stages[..stage].iter().any(|r| !r.is_empty())
    }
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
            norm: Tier::single_name(d),
            attention: if d.fa3 { "split-k" } else { "naive" },
            b1fast: d.serve_b1fast,
            kv: if d.kv_q8 { "q8_0" } else { "f32" },
            pp_stages: self.stages.len(),
            pp_devices: self.plan.devices_text(),
            pp_splits: self.plan.splits_text(),
            gate_seed: d.gate_seed,
            canary: d.gate_canary,
            tuning: Tuning {
                // The tiled prompt attention in force for this model, as `mma` is for the
                // device: asked for, on the split-K attention, and granted its shared memory
                // for these heads on every device, so a receipt never claims a tile that
                // fell back to the one-row kernel.
                prompt_tile: d.fa3
                    && self.dm.gpus.iter().all(|g| {
                        g.takes_prompt_tile(2, self.dm.config.head_dim)
                            .unwrap_or(false)
                    }),
                ..self.dm.gpus[0].tuning()
            },
        }
    }

    fn open_sequence(&mut self, seq: SeqId, capacity: usize) -> Result<(), EngineError> {
        let c = &self.dm.config;
        self.seqs.check_open(seq, capacity, c.n_ctx)?;
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
        self.caches.insert(
            seq,
            DevCaches {
                capacity,
                generation: self.generation,
                k,
                v,
            },
        );
        self.seqs.insert(seq, capacity);
        Ok(())
    }

    fn close_sequence(&mut self, seq: SeqId) -> Result<(), EngineError> {
        self.seqs.remove(seq)?;
        self.caches.remove(&seq);
        Ok(())
    }

    fn stage_plan(&self) -> &StagePlan {
        &self.plan
    }

    fn doors(&self) -> &Doors {
        &self.doors
    }

    fn sequences(&self) -> &Sequences {
        &self.seqs
    }

    /// [`super::clear_walk`], then the unsplit walk refused where the primary cannot reach
    /// every other device's memory ([`CudaBackend::check_unsplit_reach`]), before any row is
    /// built.
    fn check_walk(&self, walk: Walk) -> Result<ClearedWalk, EngineError> {
        let cleared = super::clear_walk(&self.plan, &self.doors, walk)?;
        if walk == Walk::Unsplit {
            self.check_unsplit_reach()?;
        }
        Ok(cleared)
    }

    fn sequences_mut(&mut self, _: &SeqsKey) -> &mut Sequences {
        &mut self.seqs
    }

    /// The rows in passes of [`MAX_ROWS`], each pass's kept logits copied back after it.
    fn run_rows(
        &mut self,
        walk: ClearedWalk,
        rows: &[RowSpec],
        pass: Pass,
        logits: Range<usize>,
    ) -> Result<Vec<f32>, EngineError> {
        let walk = walk.walk();
        // The device writes each row's K and V at its position of the caches this backend
        // holds: a row kept from an earlier call, or rows of a sequences table changed by
        // other means, must not write past them.
        for r in rows {
            let caches = self
                .caches
                .get(&r.seq)
                .ok_or(EngineError::UnknownSequence(r.seq))?;
            if r.pos >= caches.capacity {
                return Err(EngineError::CacheFull {
                    seq: r.seq,
                    len: r.pos,
                    capacity: caches.capacity,
                    adding: 1,
                });
            }
        }
        let tier = self.tier(pass);
        let v = self.dm.config.n_vocab;
        let mut out = Vec::with_capacity(logits.len() * v);
        for (i, chunk) in rows.chunks(MAX_ROWS).enumerate() {
            // The kept rows of this pass, counted from its first row.
            let (first, end) = (i * MAX_ROWS, i * MAX_ROWS + chunk.len());
            let keep = logits.start.clamp(first, end) - first..logits.end.clamp(first, end) - first;
            self.pass(chunk, tier, walk, pass, keep.clone())?;
            if !keep.is_empty() {
                let l = self.download_logits(keep.end)?;
                out.extend_from_slice(&l[keep.start * v..]);
            }
        }
        Ok(out)
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
        let n_vocab = self.dm.config.n_vocab;
        let row = self.seqs.single_row(&self.doors, n_vocab, seq, token)?;
        let tier = self.tier(Pass::Single);
        self.pass(&[row], tier, Walk::Split, Pass::Single, 0..1)?;
        let t = self.pick_tokens(&[row], std::slice::from_ref(params), 0)?;
        self.seqs.commit(seq, 1);
        Ok(t[0])
    }

    fn decode_step_batch_sampled_rows(
        &mut self,
        seqs: &[SeqId],
        tokens: &[u32],
        params: &[SamplingParams],
    ) -> Result<Vec<u32>, EngineError> {
        super::check_row_params(seqs, params)?;
        let n_vocab = self.dm.config.n_vocab;
        if seqs.len() == 1 && tokens.len() == 1 && self.doors.serve_b1fast {
            // The single-sequence route, parking its one row like the batched route.
            let row = self
                .seqs
                .single_row(&self.doors, n_vocab, seqs[0], tokens[0])?;
            let tier = self.tier(Pass::Single);
            self.begin_parking(1)?;
            self.pass(&[row], tier, Walk::Split, Pass::Single, 0..1)?;
            self.park_chunk(0, 1)?;
            let t = self.pick_tokens(&[row], params, 0)?;
            self.seqs.commit(seqs[0], 1);
            self.parked_rows = Some(1);
            return Ok(t);
        }
        let rows = self.seqs.batch_rows(&self.doors, n_vocab, seqs, tokens)?;
        self.begin_parking(rows.len())?;
        let mut out = Vec::with_capacity(rows.len());
        for (i, (chunk, chunk_params)) in rows
            .chunks(MAX_ROWS)
            .zip(params.chunks(MAX_ROWS))
            .enumerate()
        {
            self.pass(
                chunk,
                Tier::Separate,
                Walk::Split,
                Pass::Batched,
                0..chunk.len(),
            )?;
            self.park_chunk(i * MAX_ROWS, chunk.len())?;
            out.extend(self.pick_tokens(chunk, chunk_params, i * MAX_ROWS)?);
        }
        for &seq in seqs {
            self.seqs.commit(seq, 1);
        }
        self.parked_rows = Some(rows.len());
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
