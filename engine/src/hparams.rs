//! The llama hyper-parameters of a GGUF file and the tensor names and shapes they imply.
//!
//! This module owns the mapping from GGUF metadata keys (`llama.*`) to `LlamaHparams` and the
//! consistency checks between the metadata and the tensor table. It does not compute
//! anything with the weights (that is the model layer).

use crate::gguf::{GgufError, GgufErrorKind, GgufFile, TensorInfo};

/// The architecture memra runs.
pub const ARCH: &str = "llama";

/// llama.cpp's default RoPE base when `llama.rope.freq_base` is absent.
pub const DEFAULT_ROPE_BASE: f32 = 10_000.0;

/// Shape of a llama model.
#[derive(Debug, Clone, PartialEq)]
pub struct LlamaHparams {
    pub n_layer: usize,
    pub n_embd: usize,
    pub n_ff: usize,
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim: usize,
    pub rope_base: f32,
    pub rms_eps: f32,
    pub n_vocab: usize,
    pub n_ctx: usize,
    /// True when the file has no `output.weight` and the token embedding is the output head.
    pub tied_output: bool,
}

/// The weights of one transformer layer, by role.
pub const LAYER_TENSORS: [&str; 9] = [
    "attn_norm",
    "attn_q",
    "attn_k",
    "attn_v",
    "attn_output",
    "ffn_norm",
    "ffn_gate",
    "ffn_up",
    "ffn_down",
];

/// The GGUF name of layer `layer`'s tensor `role` (e.g. `blk.3.attn_q.weight`).
pub fn layer_tensor(layer: usize, role: &str) -> String {
    format!("blk.{layer}.{role}.weight")
}

/// Name of the token embedding.
pub const TOKEN_EMBD: &str = "token_embd.weight";
/// Name of the final norm.
pub const OUTPUT_NORM: &str = "output_norm.weight";
/// Name of the (untied) output head.
pub const OUTPUT: &str = "output.weight";

fn missing(file: &GgufFile, key: &str, expected: &'static str) -> GgufError {
    GgufError::new(
        file.path(),
        GgufErrorKind::MissingKey {
            key: key.to_string(),
            expected,
            hint: "; every llama GGUF has it, so the file was written by an incomplete converter: \
                   re-convert the model with llama.cpp's convert_hf_to_gguf.py"
                .into(),
        },
    )
}

fn bad(file: &GgufFile, key: &str, value: impl ToString, problem: impl Into<String>) -> GgufError {
    GgufError::new(
        file.path(),
        GgufErrorKind::BadValue {
            key: key.to_string(),
            value: value.to_string(),
            problem: problem.into(),
        },
    )
}

impl LlamaHparams {
    /// Reads the hyper-parameters of a llama GGUF file and checks them against its tensor
    /// table (every llama tensor present with the shape the metadata implies).
    // Over 150 lines: one metadata key after another, then the tensor table against the shapes
    // they imply; each error names its key.
    pub fn from_gguf(file: &GgufFile) -> Result<LlamaHparams, GgufError> {
        let arch_key = "general.architecture";
        let arch = file
            .get(arch_key)
            .ok_or_else(|| missing(file, arch_key, "string"))?;
        let arch = file
            .get_str(arch_key)
            .map(|_| arch.as_str().unwrap_or(""))?;
        if arch != ARCH {
            return Err(bad(
                file,
                arch_key,
                format!("{arch:?}"),
                "memra runs llama-architecture models only",
            ));
        }
        let req = |k: &str| -> Result<usize, GgufError> {
            let key = format!("{ARCH}.{k}");
            match file.get_u32_opt(&key)? {
                Some(v) => Ok(v as usize),
                None => Err(missing(file, &key, "unsigned integer")),
            }
        };
        let n_layer = req("block_count")?;
        // Every layer has its own tensors, so the tensor table bounds the layer count; checking
        // it first keeps a corrupt count from making the shape list below enormous.
        let needed = n_layer
            .checked_mul(LAYER_TENSORS.len())
            .and_then(|n| n.checked_add(2));
        if needed.is_none_or(|n| n > file.tensors().len()) {
            return Err(bad(
                file,
                "llama.block_count",
                n_layer,
                format!(
                    "the file has {} tensors, fewer than that many layers need ({} per layer, plus the token embedding and the output norm)",
                    file.tensors().len(),
                    LAYER_TENSORS.len()
                ),
            ));
        }
        let n_embd = req("embedding_length")?;
        let n_ff = req("feed_forward_length")?;
        let n_head = req("attention.head_count")?;
        let n_head_kv = match file.get_u32_opt("llama.attention.head_count_kv")? {
            Some(v) => v as usize,
            None => n_head,
        };
        let n_ctx = req("context_length")?;
        let eps_key = "llama.attention.layer_norm_rms_epsilon";
        let rms_eps = file
            .get_f32_opt(eps_key)?
            .ok_or_else(|| missing(file, eps_key, "float"))?;
        let rope_base = file
            .get_f32_opt("llama.rope.freq_base")?
            .unwrap_or(DEFAULT_ROPE_BASE);

        for (k, v) in [
            ("llama.block_count", n_layer),
            ("llama.embedding_length", n_embd),
            ("llama.feed_forward_length", n_ff),
            ("llama.attention.head_count", n_head),
            ("llama.attention.head_count_kv", n_head_kv),
            ("llama.context_length", n_ctx),
        ] {
            if v == 0 {
                return Err(bad(file, k, 0, "it must be at least 1"));
            }
        }
        if !n_head.is_multiple_of(n_head_kv) {
            return Err(bad(
                file,
                "llama.attention.head_count_kv",
                n_head_kv,
                format!(
                    "the head count {n_head} must be a multiple of it (grouped-query attention)"
                ),
            ));
        }
        let head_dim = match file.get_u32_opt("llama.attention.key_length")? {
            Some(v) => v as usize,
            None if n_embd.is_multiple_of(n_head) => n_embd / n_head,
            None => {
                return Err(bad(
                    file,
                    "llama.embedding_length",
                    n_embd,
                    format!(
                        "it is not a multiple of the head count {n_head} and llama.attention.key_length is absent"
                    ),
                ));
            }
        };
        if head_dim == 0 || !head_dim.is_multiple_of(2) {
            return Err(bad(
                file,
                "llama.attention.key_length",
                head_dim,
                "RoPE needs an even, non-zero head size",
            ));
        }
        if let Some(v) = file.get_u32_opt("llama.attention.value_length")?
            && v as usize != head_dim
        {
            return Err(bad(
                file,
                "llama.attention.value_length",
                v,
                format!("memra needs it equal to the key length {head_dim}"),
            ));
        }
        if let Some(r) = file.get_u32_opt("llama.rope.dimension_count")?
            && r as usize != head_dim
        {
            return Err(bad(
                file,
                "llama.rope.dimension_count",
                r,
                format!("memra rotates the whole head ({head_dim}); partial RoPE is not supported"),
            ));
        }
        if !(rms_eps > 0.0 && rms_eps < 1.0) {
            return Err(bad(file, eps_key, rms_eps, "it must be in (0, 1)"));
        }
        if !(rope_base > 1.0 && rope_base.is_finite()) {
            return Err(bad(
                file,
                "llama.rope.freq_base",
                rope_base,
                "it must be a finite number above 1",
            ));
        }

        let embd = file.require_tensor(TOKEN_EMBD)?;
        let n_vocab = match file.get_u32_opt("llama.vocab_size")? {
            Some(v) => v as usize,
            None => embd.shape.get(1).copied().unwrap_or(0) as usize,
        };
        let hp = LlamaHparams {
            n_layer,
            n_embd,
            n_ff,
            n_head,
            n_head_kv,
            head_dim,
            rope_base,
            rms_eps,
            n_vocab,
            n_ctx,
            tied_output: file.tensor(OUTPUT).is_none(),
        };
        for (name, shape) in hp.tensor_shapes() {
            let t = file.require_tensor(&name)?;
            check_shape(file, t, &shape)?;
        }
        Ok(hp)
    }

    /// Query width (`n_head * head_dim`).
    pub fn q_dim(&self) -> usize {
        self.n_head * self.head_dim
    }

    /// Key/value width (`n_head_kv * head_dim`).
    pub fn kv_dim(&self) -> usize {
        self.n_head_kv * self.head_dim
    }

    /// Every tensor of the model with its ggml shape (`[cols, rows]` for matrices), in the
    /// order llama.cpp's converter writes them.
    pub fn tensor_shapes(&self) -> Vec<(String, Vec<u64>)> {
        let (e, f, q, kv) = (
            self.n_embd as u64,
            self.n_ff as u64,
            self.q_dim() as u64,
            self.kv_dim() as u64,
        );
        let mut out = vec![(TOKEN_EMBD.to_string(), vec![e, self.n_vocab as u64])];
        for l in 0..self.n_layer {
            for role in LAYER_TENSORS {
                let shape = match role {
                    "attn_norm" | "ffn_norm" => vec![e],
                    "attn_q" => vec![e, q],
                    "attn_k" | "attn_v" => vec![e, kv],
                    "attn_output" => vec![q, e],
                    "ffn_gate" | "ffn_up" => vec![e, f],
                    _ => vec![f, e],
                };
                out.push((layer_tensor(l, role), shape));
            }
        }
        out.push((OUTPUT_NORM.to_string(), vec![e]));
        if !self.tied_output {
            out.push((OUTPUT.to_string(), vec![e, self.n_vocab as u64]));
        }
        out
    }

    /// Number of parameters of the model.
    pub fn n_params(&self) -> u64 {
        self.tensor_shapes()
            .iter()
            .map(|(_, s)| s.iter().product::<u64>())
            .sum()
    }
}

fn check_shape(file: &GgufFile, t: &TensorInfo, expected: &[u64]) -> Result<(), GgufError> {
    if t.shape != expected {
        return Err(GgufError::new(
            file.path(),
            GgufErrorKind::BadShape {
                tensor: t.name.clone(),
                shape: t.shape.clone(),
                problem: format!("the llama metadata implies {expected:?}"),
            },
        ));
    }
    Ok(())
}
