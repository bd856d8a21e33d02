//! The devices of a run and their step buffers: opening the devices the doors name, the
//! per-device [`Scratch`] of one pass, the per-layer cache tables ([`Buffers`]) and the
//! device errors.
//!
//! This module owns allocation and sizing only; what the launches of a pass do with the
//! buffers is [`super::step`], and the model's weights on the devices are [`super::weights`].

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream, DriverError, sys};
use memra_kernels::blocks::{BlockQ8_1, QK};
use memra_kernels::cuda::Gpu;
use memra_kernels::error::KernelError;
use memra_kernels::twin::SPLIT_K_CHUNK;

use super::MAX_ROWS;
use super::weights::DevModel;
use crate::backend::stages::StagePlan;
use crate::doors::{Doors, GateDefect};
use crate::error::EngineError;
use crate::model::{LlamaConfig, LlamaModel};

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

pub(super) fn kernel_err(e: KernelError) -> EngineError {
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
    let mut gpu = Gpu::open(ordinal, &doors.tuning).map_err(|e| {
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
    match doors.gate_defect {
        Some(GateDefect::ExpUlp) => gpu.plant_defect(memra_kernels::cuda::EXP_DEFECT),
        Some(GateDefect::Q8BlockSum) => gpu.plant_defect(memra_kernels::cuda::Q8_BLOCK_SUM_DEFECT),
        Some(GateDefect::PromptTile) => gpu.plant_defect(memra_kernels::cuda::PROMPT_TILE_DEFECT),
        _ => {}
    }
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
///
/// [`Placement::of`]: super::Placement::of
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

/// The buffers of one pass on one device, sized for [`MAX_ROWS`] rows and for the longest
/// open sequence. Graphs capture their addresses, so replacing them drops every graph.
pub(super) struct Scratch {
    pub(super) max_len: usize,
    pub(super) max_chunks: usize,
    pub(super) x: CudaSlice<f32>,
    /// The residual stream's second buffer: a matvec that computes the norm step as its
    /// prologue, or the norm step split over blocks, writes the updated stream here, since
    /// its other thread blocks still read the first. The walk flips between the two at each
    /// such norm, twice per layer, so every layer ends in the buffer it started in.
    pub(super) x_alt: CudaSlice<f32>,
    pub(super) delta: CudaSlice<f32>,
    pub(super) xf: CudaSlice<f32>,
    pub(super) hf: CudaSlice<f32>,
    pub(super) att: CudaSlice<f32>,
    pub(super) xq: CudaSlice<BlockQ8_1>,
    pub(super) r: CudaSlice<f32>,
    pub(super) qkv: CudaSlice<f32>,
    pub(super) gu: CudaSlice<f32>,
    pub(super) part_o: CudaSlice<f32>,
    pub(super) part_ml: CudaSlice<f32>,
    pub(super) naive: CudaSlice<f32>,
    pub(super) logits: CudaSlice<f32>,
    pub(super) p_scratch: CudaSlice<f32>,
    pub(super) tokens: CudaSlice<u32>,
    pub(super) pos: CudaSlice<i32>,
    pub(super) seq_ids: CudaSlice<u32>,
    pub(super) steps: CudaSlice<u32>,
    /// Each row's sampling parameters (temperature, top-k, top-p, seed) for the sampler.
    pub(super) temps: CudaSlice<f32>,
    pub(super) top_ks: CudaSlice<u32>,
    pub(super) top_ps: CudaSlice<f32>,
    pub(super) seeds: CudaSlice<u64>,
    pub(super) picked: CudaSlice<u32>,
    /// The greedy pick's per-row counters and chunk partials (zero between launches).
    pub(super) argmax_scratch: CudaSlice<u32>,
    /// The residual stream owned by every stage after the first that runs on this device,
    /// by stage index: `(x, delta)`, each `[MAX_ROWS, n_embd]`. At a boundary the stream is
    /// `x` plus the last block's pending `delta` (the next norm adds it), so the hand-over
    /// copies both.
    pub(super) stage_bufs: Vec<Option<(CudaSlice<f32>, CudaSlice<f32>)>>,
}

/// Every device's step buffers and the per-layer cache tables.
pub(super) struct Buffers {
    /// One per slot of the model's placement.
    pub(super) slots: Vec<Scratch>,
    /// Per layer, on that layer's device: the address of each row's K and V cache.
    pub(super) kptr: Vec<CudaSlice<u64>>,
    pub(super) vptr: Vec<CudaSlice<u64>>,
}

pub(super) fn alloc<T: cudarc::driver::DeviceRepr + cudarc::driver::ValidAsZeroBits>(
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
    pub(super) fn new(
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
            temps: alloc(stream, "the sampling temperatures", r)?,
            top_ks: alloc(stream, "the sampling top-k counts", r)?,
            top_ps: alloc(stream, "the sampling top-p masses", r)?,
            seeds: alloc(stream, "the sampling seeds", r)?,
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
    pub(super) fn stream_after(&self, last: usize) -> Option<(&CudaSlice<f32>, &CudaSlice<f32>)> {
        if last == 0 {
            return Some((&self.x, &self.delta));
        }
        self.stage_bufs
            .get(last)
            .and_then(Option::as_ref)
            .map(|(x, d)| (x, d))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
