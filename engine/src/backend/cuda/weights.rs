//! The model resident on the device: every matrix in its GGUF storage type, uploaded once.
//!
//! This module owns the upload and the layout choices made for the decode step: q, k and v
//! become one `[q_dim + 2 kv_dim, n_embd]` matrix and gate and up one `[2 n_ff, n_embd]`
//! matrix (rows appended, so each output row keeps its own arithmetic and only the number of
//! launches changes). It computes nothing; the backend in `super` runs the kernels.

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream, DeviceRepr};
use memra_kernels::blocks::{BlockQ4_0, BlockQ4_1, BlockQ8_0};
use memra_kernels::cuda::{DeviceWeights, Gpu};

use super::device_err;
use crate::backend::EngineError;
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

/// The whole model on one device, shared by every backend built over it (the bench builds
/// one backend per door setting without uploading the weights again).
pub struct DevModel {
    pub gpu: Gpu,
    pub config: LlamaConfig,
    pub token_embd: DevWeight,
    /// `None` when the head is tied to the token embedding.
    pub output: Option<DevWeight>,
    pub output_norm: CudaSlice<f32>,
    pub layers: Vec<DevLayer>,
    pub rope_table: CudaSlice<f32>,
    /// Whether any matrix is block-quantized (the doors report names the matvec family).
    pub quantized: bool,
}

impl DevModel {
    /// Uploads `model` to `gpu`, layer by layer, so the host keeps at most one concatenated
    /// matrix beside the model.
    pub fn upload(gpu: Gpu, model: &LlamaModel) -> Result<DevModel, EngineError> {
        model.validate().map_err(EngineError::Model)?;
        let c = model.config.clone();
        if !c.head_dim.is_multiple_of(2) {
            return Err(EngineError::Model(format!(
                "head_dim={} must be even for RoPE",
                c.head_dim
            )));
        }
        let stream = gpu.stream().clone();
        let mut layers = Vec::with_capacity(model.layers.len());
        for (i, l) in model.layers.iter().enumerate() {
            let qkv = concat_rows(&format!("blk.{i}.attn_qkv"), &[&l.wq, &l.wk, &l.wv])?;
            let gu = concat_rows(&format!("blk.{i}.ffn_gate_up"), &[&l.w_gate, &l.w_up])?;
            layers.push(DevLayer {
                attn_norm: put(&stream, &format!("blk.{i}.attn_norm"), &l.attn_norm)?,
                wqkv: upload(&stream, &qkv)?,
                wo: upload(&stream, &l.wo)?,
                ffn_norm: put(&stream, &format!("blk.{i}.ffn_norm"), &l.ffn_norm)?,
                w_gu: upload(&stream, &gu)?,
                w_down: upload(&stream, &l.w_down)?,
            });
        }
        let table = memra_kernels::twin::rope_table(c.head_dim, c.rope_base, c.n_ctx);
        let dm = DevModel {
            token_embd: upload(&stream, &model.token_embd)?,
            output: model
                .output
                .as_ref()
                .map(|w| upload(&stream, w))
                .transpose()?,
            output_norm: put(&stream, "output_norm", &model.output_norm)?,
            rope_table: put(&stream, "the RoPE table", &table)?,
            layers,
            quantized: model.has_quantized(),
            config: c,
            gpu,
        };
        dm.gpu
            .synchronize()
            .map_err(|e| EngineError::Unavailable(format!("uploading the weights: {e}")))?;
        Ok(dm)
    }

    /// The output head.
    pub fn head(&self) -> &DevWeight {
        self.output.as_ref().unwrap_or(&self.token_embd)
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
