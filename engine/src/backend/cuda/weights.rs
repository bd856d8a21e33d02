//! The model resident on the devices: every matrix in its GGUF storage type, uploaded once,
//! each where the pipeline stage plan puts it.
//!
//! This module owns the upload, the placement (which device holds each layer, the embedding
//! and the head; [`Placement`]) and the layout choices made for the decode step: q, k and v
//! become one `[q_dim + 2 kv_dim, n_embd]` matrix and gate and up one `[2 n_ff, n_embd]`
//! matrix (rows appended, so each output row keeps its own arithmetic and only the number of
//! launches changes). It computes nothing; the backend in `super` runs the kernels and owns
//! the KV caches and the step buffers.

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream, DeviceRepr};
use memra_kernels::blocks::{BlockQ4_0, BlockQ4_1, BlockQ8_0};
use memra_kernels::cuda::{DeviceWeights, Gpu};

use super::device_err;
use crate::backend::stages::StagePlan;
use crate::error::EngineError;
use crate::model::{LlamaConfig, LlamaModel, Weight, WeightData};

/// Typed device storage of one matrix.
pub enum DevData {
    Q4_0(CudaSlice<BlockQ4_0>),
    Q4_1(CudaSlice<BlockQ4_1>),
    Q8_0(CudaSlice<BlockQ8_0>),
    F32(CudaSlice<f32>),
    F16(CudaSlice<u16>),
    BF16(CudaSlice<u16>),
}

/// A `[rows, cols]` matrix on the device.
pub struct DevWeight {
    pub rows: usize,
    pub cols: usize,
    pub bytes: usize,
    pub data: DevData,
}

impl DevWeight {
    /// The launchers' view of the storage.
    pub fn view(&self) -> DeviceWeights<'_> {
        match &self.data {
            DevData::Q4_0(s) => DeviceWeights::Q4_0(s),
            DevData::Q4_1(s) => DeviceWeights::Q4_1(s),
            DevData::Q8_0(s) => DeviceWeights::Q8_0(s),
            DevData::F32(s) => DeviceWeights::F32(s),
            DevData::F16(s) => DeviceWeights::F16(s),
            DevData::BF16(s) => DeviceWeights::BF16(s),
        }
    }

    /// Whether the matvec takes q8_1 activations.
    pub fn quantized(&self) -> bool {
        matches!(
            self.data,
            DevData::Q4_0(_) | DevData::Q4_1(_) | DevData::Q8_0(_)
        )
    }
}

fn put<T: DeviceRepr>(
    stream: &Arc<CudaStream>,
    what: &str,
    host: &[T],
) -> Result<CudaSlice<T>, EngineError> {
    stream.clone_htod(host).map_err(|e| {
        device_err(
            &format!("uploading {what} ({} bytes)", std::mem::size_of_val(host)),
            e,
        )
    })
}

/// Uploads `w` as it is stored.
pub fn upload(stream: &Arc<CudaStream>, w: &Weight) -> Result<DevWeight, EngineError> {
    let n = &w.name;
    let data = match &w.data {
        WeightData::Q4_0(v) => DevData::Q4_0(put(stream, n, v)?),
        WeightData::Q4_1(v) => DevData::Q4_1(put(stream, n, v)?),
        WeightData::Q8_0(v) => DevData::Q8_0(put(stream, n, v)?),
        WeightData::F32(v) => DevData::F32(put(stream, n, v)?),
        WeightData::F16(v) => {
            let bits: Vec<u16> = v.iter().map(|x| x.to_bits()).collect();
            DevData::F16(put(stream, n, &bits)?)
        }
        WeightData::BF16(v) => {
            let bits: Vec<u16> = v.iter().map(|x| x.to_bits()).collect();
            DevData::BF16(put(stream, n, &bits)?)
        }
    };
    Ok(DevWeight {
        rows: w.rows,
        cols: w.cols,
        bytes: w.bytes(),
        data,
    })
}

/// The rows of `parts` one after the other, as one weight. The parts must share their
/// storage type and width: a matvec row then reads exactly the blocks it read alone.
pub fn concat_rows(name: &str, parts: &[&Weight]) -> Result<Weight, EngineError> {
    let first = parts[0];
    for p in parts {
        if p.cols != first.cols || p.data.type_name() != first.data.type_name() {
            return Err(EngineError::Model(format!(
                "the CUDA backend runs {name} as one matvec and needs its parts in one type \
                 and width, but {} is [{}, {}] {} and {} is [{}, {}] {}; requantize the \
                 checkpoint to one type or use MEMRA_BACKEND=cpu",
                first.name,
                first.rows,
                first.cols,
                first.data.type_name(),
                p.name,
                p.rows,
                p.cols,
                p.data.type_name()
            )));
        }
    }
    macro_rules! cat {
        ($variant:ident) => {
            WeightData::$variant(
                parts
                    .iter()
                    .flat_map(|p| match &p.data {
                        WeightData::$variant(v) => v.iter().copied(),
                        _ => unreachable!("types were checked above"),
                    })
                    .collect(),
            )
        };
    }
    let data = match &first.data {
        WeightData::Q4_0(_) => cat!(Q4_0),
        WeightData::Q4_1(_) => cat!(Q4_1),
        WeightData::Q8_0(_) => cat!(Q8_0),
        WeightData::F32(_) => cat!(F32),
        WeightData::F16(_) => cat!(F16),
        WeightData::BF16(_) => cat!(BF16),
    };
    let rows = parts.iter().map(|p| p.rows).sum();
    Weight::new(name, rows, first.cols, data).map_err(|e| EngineError::Model(e.to_string()))
}

/// One layer on the device.
pub struct DevLayer {
    pub attn_norm: CudaSlice<f32>,
    /// `[q | k | v]` rows.
    pub wqkv: DevWeight,
    pub wo: DevWeight,
    pub ffn_norm: CudaSlice<f32>,
    /// `[gate | up]` rows.
    pub w_gu: DevWeight,
    pub w_down: DevWeight,
}

/// Where a stage plan puts the model, as slots: slot `i` is the `i`-th distinct device in
/// stage order, so slot 0 is stage 0's device (the primary, which holds the embedding).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    /// The CUDA ordinal of every slot.
    pub ordinals: Vec<usize>,
    /// The slot of every stage.
    pub stage_slot: Vec<usize>,
    /// The slot of every layer: its stage's; a layer no stage owns (the test-only
    /// `stage-range` defect) lives with the stage before it, so its weights and caches exist
    /// even though the walk skips it.
    pub layer_slot: Vec<usize>,
    /// The slot of the output norm and the head: the last stage's.
    pub head_slot: usize,
}

impl Placement {
    /// The placement of `plan`.
    pub fn of(plan: &StagePlan) -> Placement {
        let mut ordinals: Vec<usize> = Vec::new();
        let stage_slot: Vec<usize> = plan
            .stages
            .iter()
            .map(|s| match ordinals.iter().position(|&o| o == s.device) {
                Some(i) => i,
                None => {
                    ordinals.push(s.device);
                    ordinals.len() - 1
                }
            })
            .collect();
        let layer_slot = (0..plan.n_layer)
            .map(|l| {
                plan.stages
                    .iter()
                    .rposition(|s| s.layers.start <= l)
                    .map_or(0, |si| stage_slot[si])
            })
            .collect();
        Placement {
            head_slot: stage_slot.last().copied().unwrap_or(0),
            ordinals,
            stage_slot,
            layer_slot,
        }
    }

    /// The CUDA ordinal of layer `l`.
    pub fn layer_device(&self, l: usize) -> usize {
        self.ordinals[self.layer_slot[l]]
    }

    /// The CUDA ordinal of the head.
    pub fn head_device(&self) -> usize {
        self.ordinals[self.head_slot]
    }

    /// Why a model placed as `self` cannot serve a backend whose plan places it as `want`,
    /// or `None` when every layer, the embedding and the head are where `want` needs them.
    pub fn mismatch(&self, want: &Placement) -> Option<String> {
        if self.ordinals.first() != want.ordinals.first() {
            return Some(format!(
                "the embedding is on device {:?} but stage 0 runs on device {:?}",
                self.ordinals.first(),
                want.ordinals.first()
            ));
        }
        if self.layer_slot.len() != want.layer_slot.len() {
            return Some(format!(
                "the model has {} layers on the devices, the plan {}",
                self.layer_slot.len(),
                want.layer_slot.len()
            ));
        }
        for l in 0..self.layer_slot.len() {
            let (have, need) = (self.layer_device(l), want.layer_device(l));
            if have != need {
                return Some(format!(
                    "layer {l} is on device {have} but the plan runs it on device {need}"
                ));
            }
        }
        if self.head_device() != want.head_device() {
            return Some(format!(
                "the head is on device {} but the plan runs it on device {}",
                self.head_device(),
                want.head_device()
            ));
        }
        None
    }
}

/// Whether peer access is on between the slots of a model, per ordered pair.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerAccess {
    on: Vec<Vec<bool>>,
}

impl PeerAccess {
    /// Enables peer access both ways between every pair of `gpus` where the hardware
    /// allows it and records which pairs have it.
    pub fn enable(gpus: &[Gpu]) -> Result<PeerAccess, EngineError> {
        let mut on = vec![vec![false; gpus.len()]; gpus.len()];
        for (i, a) in gpus.iter().enumerate() {
            for (j, b) in gpus.iter().enumerate() {
                if i != j {
                    on[i][j] = a
                        .enable_peer_access(b)
                        .map_err(|e| EngineError::Unavailable(e.to_string()))?;
                }
            }
        }
        Ok(PeerAccess { on })
    }

    /// Whether kernels on slot `from` can read and write slot `to`'s memory (a slot can
    /// always access itself).
    pub fn on(&self, from: usize, to: usize) -> bool {
        from == to
            || self
                .on
                .get(from)
                .and_then(|r| r.get(to))
                .copied()
                .unwrap_or(false)
    }
}

/// The whole model on its devices, shared by every backend built over it (the bench builds
/// one backend per door setting without uploading the weights again).
pub struct DevModel {
    /// One device per slot of [`DevModel::placement`]; slot 0 is the primary.
    pub gpus: Vec<Gpu>,
    pub placement: Placement,
    pub peer: PeerAccess,
    pub config: LlamaConfig,
    /// On the primary.
    pub token_embd: DevWeight,
    /// The head on the head's slot; `None` when it is tied to the token embedding and that
    /// slot is the primary (a tied head on another device is uploaded there again).
    pub output: Option<DevWeight>,
    /// On the head's slot.
    pub output_norm: CudaSlice<f32>,
    /// Each on the slot `placement.layer_slot` names.
    pub layers: Vec<DevLayer>,
    /// The RoPE table, one copy per slot.
    pub rope_tables: Vec<CudaSlice<f32>>,
    /// Whether any matrix is block-quantized (the doors report names the matvec family).
    pub quantized: bool,
}

impl DevModel {
    /// Uploads `model` to one device (every stage there).
    pub fn upload(gpu: Gpu, model: &LlamaModel) -> Result<DevModel, EngineError> {
        let placement = Placement {
            ordinals: vec![gpu.ordinal()],
            stage_slot: vec![0],
            layer_slot: vec![0; model.layers.len()],
            head_slot: 0,
        };
        Self::upload_to(vec![gpu], placement, model)
    }

    /// Uploads `model` where `plan` puts it: `gpus` are the devices of
    /// [`Placement::of`]`(plan)`, slot by slot (what [`super::open_devices`] returns).
    pub fn upload_placed(
        gpus: Vec<Gpu>,
        model: &LlamaModel,
        plan: &StagePlan,
    ) -> Result<DevModel, EngineError> {
        let placement = Placement::of(plan);
        let have: Vec<usize> = gpus.iter().map(Gpu::ordinal).collect();
        if have != placement.ordinals {
            return Err(EngineError::Model(format!(
                "the stage plan ({plan}) needs the devices {:?} in stage order, but {:?} were                  opened; open them with open_devices under the same doors",
                placement.ordinals, have
            )));
        }
        if plan.n_layer != model.layers.len() {
            return Err(EngineError::Model(format!(
                "the stage plan covers {} layers but the model has {}; build the plan for                  this model",
                plan.n_layer,
                model.layers.len()
            )));
        }
        Self::upload_to(gpus, placement, model)
    }

    /// Uploads layer by layer, so the host keeps at most one concatenated matrix beside the
    /// model.
    fn upload_to(
        gpus: Vec<Gpu>,
        placement: Placement,
        model: &LlamaModel,
    ) -> Result<DevModel, EngineError> {
        model.validate().map_err(EngineError::Model)?;
        let c = model.config.clone();
        if !c.head_dim.is_multiple_of(2) {
            return Err(EngineError::Model(format!(
                "head_dim={} must be even for RoPE",
                c.head_dim
            )));
        }
        let streams: Vec<Arc<CudaStream>> = gpus.iter().map(|g| g.stream().clone()).collect();
        let peer = PeerAccess::enable(&gpus)?;
        let mut layers = Vec::with_capacity(model.layers.len());
        for (i, l) in model.layers.iter().enumerate() {
            let stream = &streams[placement.layer_slot[i]];
            let qkv = concat_rows(&format!("blk.{i}.attn_qkv"), &[&l.wq, &l.wk, &l.wv])?;
            let gu = concat_rows(&format!("blk.{i}.ffn_gate_up"), &[&l.w_gate, &l.w_up])?;
            layers.push(DevLayer {
                attn_norm: put(stream, &format!("blk.{i}.attn_norm"), &l.attn_norm)?,
                wqkv: upload(stream, &qkv)?,
                wo: upload(stream, &l.wo)?,
                ffn_norm: put(stream, &format!("blk.{i}.ffn_norm"), &l.ffn_norm)?,
                w_gu: upload(stream, &gu)?,
                w_down: upload(stream, &l.w_down)?,
            });
        }
        let table = memra_kernels::twin::rope_table(c.head_dim, c.rope_base, c.n_ctx);
        let head_stream = &streams[placement.head_slot];
        // A tied head runs from the embedding's bytes; on another device than the primary
        // it needs its own copy there.
        let output = match (&model.output, placement.head_slot) {
            (Some(w), _) => Some(upload(head_stream, w)?),
            (None, 0) => None,
            (None, _) => Some(upload(head_stream, &model.token_embd)?),
        };
        let dm = DevModel {
            token_embd: upload(&streams[0], &model.token_embd)?,
            output,
            output_norm: put(head_stream, "output_norm", &model.output_norm)?,
            rope_tables: streams
                .iter()
                .map(|s| put(s, "the RoPE table", &table))
                .collect::<Result<_, _>>()?,
            layers,
            quantized: model.has_quantized(),
            config: c,
            placement,
            peer,
            gpus,
        };
        for g in &dm.gpus {
            g.synchronize().map_err(|e| {
                EngineError::Unavailable(format!(
                    "uploading the weights to CUDA device {}: {e}",
                    g.ordinal()
                ))
            })?;
        }
        Ok(dm)
    }

    /// The primary device (stage 0's; it holds the embedding).
    pub fn primary(&self) -> &Gpu {
        &self.gpus[0]
    }

    /// The output head (on the head's slot).
    pub fn head(&self) -> &DevWeight {
        self.output.as_ref().unwrap_or(&self.token_embd)
    }

    /// The primary device's name, followed by the other devices' when there are several.
    pub fn device_names(&self) -> String {
        self.gpus
            .iter()
            .map(|g| format!("{} (device {})", g.name(), g.ordinal()))
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// Bytes of weights one decode step reads: every layer matrix and the head (the
    /// embedding contributes one row per token, which is negligible).
    pub fn step_weight_bytes(&self) -> usize {
        self.layers
            .iter()
            .map(|l| l.wqkv.bytes + l.wo.bytes + l.w_gu.bytes + l.w_down.bytes)
            .sum::<usize>()
            + self.head().bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::doors::{Doors, GateDefect, PpSplits};

    fn plan(devices: &[usize], n_layer: usize, defect: Option<GateDefect>) -> StagePlan {
        let doors = Doors {
            pp_stages: devices.len(),
            pp_devices: devices.to_vec(),
            pp_splits: PpSplits::Even,
            gate_defect: defect,
            ..Doors::default()
        };
        StagePlan::from_doors(&doors, n_layer).unwrap()
    }

    #[test]
    fn slots_are_the_distinct_devices_in_stage_order() {
        let p = Placement::of(&plan(&[1, 0], 4, None));
        assert_eq!(p.ordinals, vec![1, 0]);
        assert_eq!(p.stage_slot, vec![0, 1]);
        assert_eq!(p.layer_slot, vec![0, 0, 1, 1]);
        assert_eq!(p.head_slot, 1);
        assert_eq!(p.head_device(), 0);

        let p = Placement::of(&plan(&[2, 2, 0, 2], 8, None));
        assert_eq!(p.ordinals, vec![2, 0]);
        assert_eq!(p.stage_slot, vec![0, 0, 1, 0]);
        assert_eq!(p.layer_slot, vec![0, 0, 0, 0, 1, 1, 0, 0]);
        assert_eq!(p.head_slot, 0);

        let p = Placement::of(&plan(&[3], 2, None));
        assert_eq!(p.ordinals, vec![3]);
        assert_eq!((p.layer_slot.clone(), p.head_slot), (vec![0, 0], 0));
    }

    #[test]
    fn a_layer_no_stage_owns_lives_with_the_stage_before_it() {
        let defective = plan(&[0, 1], 4, Some(GateDefect::StageRange));
        assert_eq!(
            defective.stages[1].layers,
            3..4,
            "layer 2 belongs to no stage"
        );
        let p = Placement::of(&defective);
        assert_eq!(p.layer_slot, vec![0, 0, 0, 1]);
        // Three stages of one layer each: the later two become empty (1..2 -> 2..2 and
        // 2..3 -> 3..3), so layer 1 stays with stage 0 and layer 2 with the empty stage 1;
        // the head follows the last stage.
        let p = Placement::of(&plan(&[0, 1, 2], 3, Some(GateDefect::StageRange)));
        assert_eq!(p.layer_slot, vec![0, 0, 1]);
        assert_eq!(p.head_slot, 2);
    }

    #[test]
    fn a_mismatch_names_the_first_misplaced_part() {
        let two = Placement::of(&plan(&[0, 1], 4, None));
        let one = Placement::of(&plan(&[0, 0], 4, None));
        assert_eq!(one.mismatch(&Placement::of(&plan(&[0], 4, None))), None);
        assert_eq!(
            one.mismatch(&two).unwrap(),
            "layer 2 is on device 0 but the plan runs it on device 1"
        );
        let swapped = Placement::of(&plan(&[1, 0], 4, None));
        assert!(two.mismatch(&swapped).unwrap().contains("embedding"));
        let head_moved = Placement::of(&plan(&[0, 1], 4, Some(GateDefect::StageRange)));
        assert_eq!(
            two.mismatch(&head_moved),
            Some("layer 2 is on device 1 but the plan runs it on device 0".into())
        );
    }
}
