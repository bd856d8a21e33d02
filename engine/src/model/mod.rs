//! The llama model: its shape ([`LlamaConfig`]) and its weights, held per layer
//! ([`LayerWeights`]) so a pipeline split can hand each stage the layers it owns.
//!
//! This module says *what* the model is; it computes nothing. The host f32 oracle
//! (`crate::reference`) and the backends (`crate::backend`) run it. Reading a GGUF file into
//! these types lives in [`load`]; the GGUF format itself belongs to `crate::gguf`.

pub mod load;
mod weight;

pub use load::LoadError;
pub use weight::{Weight, WeightData, WeightError};

/// The shape of a llama-architecture model, everything the forward pass needs.
#[derive(Debug, Clone, PartialEq)]
pub struct LlamaConfig {
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
}

impl LlamaConfig {
    /// Width of the query projection (all heads).
    pub fn q_dim(&self) -> usize {
        self.n_head * self.head_dim
    }

    /// Width of the key and value projections (KV heads only).
    pub fn kv_dim(&self) -> usize {
        self.n_head_kv * self.head_dim
    }

    /// Checks the relations the forward pass relies on, naming the field that breaks one.
    pub fn validate(&self) -> Result<(), String> {
        let checks: [(bool, String); 6] = [
            (
                self.n_layer > 0 && self.n_embd > 0 && self.n_ff > 0 && self.n_vocab > 0,
                format!(
                    "n_layer={}, n_embd={}, n_ff={}, n_vocab={} must all be > 0",
                    self.n_layer, self.n_embd, self.n_ff, self.n_vocab
                ),
            ),
            (
                self.n_head > 0 && self.n_head_kv > 0 && self.n_head.is_multiple_of(self.n_head_kv),
                format!(
                    "n_head={} must be a positive multiple of n_head_kv={} (grouped-query \
                     attention)",
                    self.n_head, self.n_head_kv
                ),
            ),
            (
                self.head_dim > 0 && self.head_dim.is_multiple_of(2),
                format!(
                    "head_dim={} must be even (RoPE rotates pairs)",
                    self.head_dim
                ),
            ),
            (
                self.n_embd.is_multiple_of(32)
                    && self.n_ff.is_multiple_of(32)
                    && self.q_dim().is_multiple_of(32),
                format!(
                    "n_embd={}, n_ff={} and n_head*head_dim={} must be multiples of 32 (the \
                     q8_1 activation block)",
                    self.n_embd,
                    self.n_ff,
                    self.q_dim()
                ),
            ),
            (
                self.rope_base > 0.0 && self.rms_eps > 0.0,
                format!(
                    "rope_base={} and rms_eps={} must be > 0",
                    self.rope_base, self.rms_eps
                ),
            ),
            (self.n_ctx > 0, format!("n_ctx={} must be > 0", self.n_ctx)),
        ];
        match checks.into_iter().find(|(ok, _)| !ok) {
            Some((_, msg)) => Err(format!("bad llama shape: {msg}")),
            None => Ok(()),
        }
    }
}

/// The weights of one transformer layer. Matrices are `[rows = out, cols = in]`, row-major,
/// as GGUF stores them (ggml's ne0 is the input width).
#[derive(Debug, Clone)]
pub struct LayerWeights {
    pub attn_norm: Vec<f32>,
    pub wq: Weight,
    pub wk: Weight,
    pub wv: Weight,
    pub wo: Weight,
    pub ffn_norm: Vec<f32>,
    pub w_gate: Weight,
    pub w_up: Weight,
    pub w_down: Weight,
}

/// A whole llama model in host memory.
#[derive(Debug, Clone)]
pub struct LlamaModel {
    pub config: LlamaConfig,
    /// `[n_vocab, n_embd]`.
    pub token_embd: Weight,
    pub layers: Vec<LayerWeights>,
    pub output_norm: Vec<f32>,
    /// `[n_vocab, n_embd]`; `None` when the head is tied to `token_embd`.
    pub output: Option<Weight>,
}

impl LlamaModel {
    /// The output head: the `output` tensor, or the token embedding when tied.
    pub fn head(&self) -> &Weight {
        self.output.as_ref().unwrap_or(&self.token_embd)
    }

    /// Checks every tensor's shape against the config, naming the first tensor that does
    /// not fit.
    pub fn validate(&self) -> Result<(), String> {
        let c = &self.config;
        c.validate()?;
        let expect = |w: &Weight, rows: usize, cols: usize| -> Result<(), String> {
            if w.rows == rows && w.cols == cols {
                Ok(())
            } else {
                Err(format!(
                    "tensor {} is [{}, {}] but the config needs [{rows}, {cols}]",
                    w.name, w.rows, w.cols
                ))
            }
        };
        let vec_len = |name: &str, v: &[f32], n: usize| -> Result<(), String> {
            if v.len() == n {
                Ok(())
            } else {
                Err(format!(
                    "tensor {name} has {} values, expected {n}",
                    v.len()
                ))
            }
        };
        expect(&self.token_embd, c.n_vocab, c.n_embd)?;
        if let Some(out) = &self.output {
            expect(out, c.n_vocab, c.n_embd)?;
        }
        vec_len("output_norm.weight", &self.output_norm, c.n_embd)?;
        if self.layers.len() != c.n_layer {
            return Err(format!(
                "model has {} layers but n_layer = {}",
                self.layers.len(),
                c.n_layer
            ));
        }
        for (i, l) in self.layers.iter().enumerate() {
            vec_len(&format!("blk.{i}.attn_norm.weight"), &l.attn_norm, c.n_embd)?;
            vec_len(&format!("blk.{i}.ffn_norm.weight"), &l.ffn_norm, c.n_embd)?;
            expect(&l.wq, c.q_dim(), c.n_embd)?;
            expect(&l.wk, c.kv_dim(), c.n_embd)?;
            expect(&l.wv, c.kv_dim(), c.n_embd)?;
            expect(&l.wo, c.n_embd, c.q_dim())?;
            expect(&l.w_gate, c.n_ff, c.n_embd)?;
            expect(&l.w_up, c.n_ff, c.n_embd)?;
            expect(&l.w_down, c.n_embd, c.n_ff)?;
        }
        Ok(())
    }

    /// Whether any matrix is stored in a block-quantized type (q8_1 activation path).
    pub fn has_quantized(&self) -> bool {
        let mut all = vec![&self.token_embd, self.head()];
        for l in &self.layers {
            all.extend([&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down]);
        }
        all.iter().any(|w| w.data.is_quantized())
    }
}
