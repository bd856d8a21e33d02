//! Reading a llama model out of a GGUF file into [`LlamaModel`].
//!
//! This module owns the mapping from GGUF tensors to the model's per-layer structs (names
//! from `crate::hparams`, shapes checked by `LlamaHparams::from_gguf`). It copies each tensor
//! once into typed host storage; it does not parse the container (`crate::gguf`) nor
//! interpret metadata keys (`crate::hparams`).

use std::path::Path;

use crate::gguf::{GgufError, GgufFile, WeightView};
use crate::hparams::{self, LlamaHparams};

use super::{LayerWeights, LlamaConfig, LlamaModel, Weight, WeightData};

/// Why a model could not be loaded: the file, and what is wrong with it.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error(transparent)]
    Gguf(#[from] GgufError),
    #[error("{path}: {problem}")]
    Model { path: String, problem: String },
}

impl From<&LlamaHparams> for LlamaConfig {
    fn from(h: &LlamaHparams) -> LlamaConfig {
        LlamaConfig {
            n_layer: h.n_layer,
            n_embd: h.n_embd,
            n_ff: h.n_ff,
            n_head: h.n_head,
            n_head_kv: h.n_head_kv,
            head_dim: h.head_dim,
            rope_base: h.rope_base,
            rms_eps: h.rms_eps,
            n_vocab: h.n_vocab,
            n_ctx: h.n_ctx,
        }
    }
}

impl LlamaModel {
    /// Opens and loads a llama GGUF file.
    pub fn open(path: impl AsRef<Path>) -> Result<LlamaModel, LoadError> {
        let file = GgufFile::open(path)?;
        LlamaModel::from_gguf(&file)
    }

    /// Loads every llama tensor of an opened GGUF file.
    pub fn from_gguf(file: &GgufFile) -> Result<LlamaModel, LoadError> {
        let h = LlamaHparams::from_gguf(file)?;
        let config = LlamaConfig::from(&h);
        let model_err = |problem: String| LoadError::Model {
            path: file.path().display().to_string(),
            problem,
        };
        let matrix = |name: &str| -> Result<Weight, LoadError> {
            let info = file.require_tensor(name)?;
            let (rows, cols) = (info.rows() as usize, info.cols() as usize);
            let data = match file.weight_view(name) {
                Ok(WeightView::F32(v)) => WeightData::F32(v.to_vec()),
                Ok(WeightView::F16(v)) => WeightData::F16(v.to_vec()),
                Ok(WeightView::BF16(v)) => WeightData::BF16(v.to_vec()),
                Ok(WeightView::Q4_0(v)) => WeightData::Q4_0(v.to_vec()),
                Ok(WeightView::Q4_1(v)) => WeightData::Q4_1(v.to_vec()),
                Ok(WeightView::Q8_0(v)) => WeightData::Q8_0(v.to_vec()),
                // Misaligned data cannot be viewed in place; f32 keeps every value exactly.
                Err(_) => WeightData::F32(file.dequantize(name)?),
            };
            Weight::new(name, rows, cols, data).map_err(|e| model_err(e.to_string()))
        };
        let vector = |name: &str| -> Result<Vec<f32>, LoadError> { Ok(file.dequantize(name)?) };

        let mut layers = Vec::with_capacity(h.n_layer);
        for l in 0..h.n_layer {
            let t = |role: &str| hparams::layer_tensor(l, role);
            layers.push(LayerWeights {
                attn_norm: vector(&t("attn_norm"))?,
                wq: matrix(&t("attn_q"))?,
                wk: matrix(&t("attn_k"))?,
                wv: matrix(&t("attn_v"))?,
                wo: matrix(&t("attn_output"))?,
                ffn_norm: vector(&t("ffn_norm"))?,
                w_gate: matrix(&t("ffn_gate"))?,
                w_up: matrix(&t("ffn_up"))?,
                w_down: matrix(&t("ffn_down"))?,
            });
        }
        let model = LlamaModel {
            config,
            token_embd: matrix(hparams::TOKEN_EMBD)?,
            layers,
            output_norm: vector(hparams::OUTPUT_NORM)?,
            output: if h.tied_output {
                None
            } else {
                Some(matrix(hparams::OUTPUT)?)
            },
        };
        model.validate().map_err(model_err)?;
        Ok(model)
    }
}
