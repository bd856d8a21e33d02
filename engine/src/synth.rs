//! Deterministic synthetic llama checkpoints: named shape presets, any weight type, weights
//! drawn to look like a trained model's, and a byte-level BPE tokenizer in the metadata, so
//! tests and GPU machines need no download.
//!
//! This module owns the presets, the weight distribution and the synthetic vocabulary. The
//! file format is `crate::gguf` (the streaming writer), the rounding of weights is
//! `crate::quant` (ggml's reference quantizers).
//!
//! Determinism: every element is a pure function of (seed, tensor name, element index), built
//! from integer hashing and exactly-representable float arithmetic only (no libm), so the same
//! preset, type and seed give the same bytes on every machine and with any number of threads.

use std::fmt;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::time::Instant;

use rayon::prelude::*;
use thiserror::Error;

use crate::gguf::{GgmlType, GgufError, GgufWriter, MetaType, MetaValue, TensorSpec};
use crate::hparams::{ARCH, LlamaHparams, OUTPUT, TOKEN_EMBD};
use crate::quant;
use crate::tokenizer::byte_to_unicode;

/// A named model shape.
#[derive(Debug, Clone)]
pub struct Preset {
    pub name: &'static str,
    pub description: &'static str,
    pub hparams: LlamaHparams,
}

/// Every preset, smallest first.
pub fn presets() -> Vec<Preset> {
    let tiny = LlamaHparams {
        n_layer: 4,
        n_embd: 128,
        n_ff: 384,
        n_head: 4,
        n_head_kv: 2,
        head_dim: 32,
        rope_base: 10_000.0,
        rms_eps: 1e-5,
        n_vocab: 512,
        n_ctx: 512,
        tied_output: true,
    };
    vec![
        Preset {
            name: "tiny",
            description: "4 layers, n_embd 128, GQA 4/2 heads, vocab 512, tied output (fast tests)",
            hparams: tiny.clone(),
        },
        Preset {
            name: "tiny-untied",
            description: "the tiny shape with a separate output.weight",
            hparams: LlamaHparams {
                tied_output: false,
                ..tiny
            },
        },
        Preset {
            name: "smollm2-135m",
            description: "SmolLM2-135M shape: 30 layers, 576, ffn 1536, 9/3 heads, vocab 49152, tied",
            hparams: LlamaHparams {
                n_layer: 30,
                n_embd: 576,
                n_ff: 1536,
                n_head: 9,
                n_head_kv: 3,
                head_dim: 64,
                rope_base: 100_000.0,
                rms_eps: 1e-5,
                n_vocab: 49152,
                n_ctx: 8192,
                tied_output: true,
            },
        },
        Preset {
            name: "llama-7b",
            description: "LLaMA-7B shape: 32 layers, 4096, ffn 11008, 32/32 heads, vocab 32000, untied",
            hparams: LlamaHparams {
                n_layer: 32,
                n_embd: 4096,
                n_ff: 11008,
                n_head: 32,
                n_head_kv: 32,
                head_dim: 128,
                rope_base: 10_000.0,
                rms_eps: 1e-5,
                n_vocab: 32000,
                n_ctx: 4096,
                tied_output: false,
            },
        },
    ]
}

/// The weight types a checkpoint can be synthesized in, by CLI name.
pub const QUANTS: [&str; 6] = ["q4_1", "q8_0", "q4_0", "f16", "bf16", "f32"];

/// Special tokens of the synthetic vocabulary, at ids 0, 1, 2 as in SmolLM2.
pub const SPECIAL_TOKENS: [&str; 3] = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"];

/// Smallest vocabulary a synthetic model can have: the special tokens and the 256 bytes.
pub const MIN_VOCAB: usize = SPECIAL_TOKENS.len() + 256;

/// What can go wrong while synthesizing.
#[derive(Debug, Error)]
pub enum SynthError {
    #[error("unknown preset `{name}`; valid presets: {valid}")]
    UnknownPreset { name: String, valid: String },
    #[error("unknown weight type `{name}`; valid types: {valid}")]
    UnknownQuant { name: String, valid: String },
    #[error("shape spec `{spec}`: bad override `{item}`: {problem}")]
    BadOverride {
        spec: String,
        item: String,
        problem: String,
    },
    #[error("cannot synthesize this shape: {0}")]
    BadShape(String),
    #[error("{}: cannot {action}: {source}", path.display())]
    Io {
        path: PathBuf,
        action: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Gguf(#[from] GgufError),
}

/// What was written.
#[derive(Debug, Clone)]
pub struct SynthSummary {
    pub path: PathBuf,
    pub preset: String,
    pub quant: GgmlType,
    pub seed: u64,
    pub hparams: LlamaHparams,
    pub file_bytes: u64,
    pub n_tensors: usize,
    pub n_params: u64,
    pub seconds: f64,
}

impl fmt::Display for SynthSummary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "wrote {} ({} {}, seed {}): {} tensors, {:.1} M parameters, {} bytes in {:.2} s",
            self.path.display(),
            self.preset,
            self.quant,
            self.seed,
            self.n_tensors,
            self.n_params as f64 / 1e6,
            self.file_bytes,
            self.seconds
        )
    }
}

/// The preset named `name`, or an error listing the valid ones.
pub fn preset(name: &str) -> Result<Preset, SynthError> {
    let all = presets();
    all.iter()
        .find(|p| p.name == name)
        .cloned()
        .ok_or_else(|| SynthError::UnknownPreset {
            name: name.to_string(),
            valid: all.iter().map(|p| p.name).collect::<Vec<_>>().join(", "),
        })
}

/// Fields a shape spec may override, in the order error messages list them.
pub const OVERRIDES: [&str; 11] = [
    "n_layer",
    "n_embd",
    "n_ff",
    "n_head",
    "n_head_kv",
    "head_dim",
    "n_vocab",
    "n_ctx",
    "rope_base",
    "rms_eps",
    "tied",
];

/// Parses a shape spec: a preset name, optionally followed by `:` and comma-separated
/// overrides, e.g. `tiny:n_layer=8,n_vocab=1024` (pipeline tests that need more layers) or
/// `smollm2-135m:tied=false`. The shape is checked when it is written.
pub fn shape_spec(spec: &str) -> Result<LlamaHparams, SynthError> {
    let (name, overrides) = spec.split_once(':').unwrap_or((spec, ""));
    let mut hp = preset(name)?.hparams;
    for item in overrides.split(',').filter(|s| !s.is_empty()) {
        let bad = |problem: String| SynthError::BadOverride {
            spec: spec.to_string(),
            item: item.to_string(),
            problem,
        };
        let (key, value) = item
            .split_once('=')
            .ok_or_else(|| bad("expected key=value".into()))?;
        let int = || {
            value
                .parse::<usize>()
                .map_err(|_| bad(format!("{value:?} is not a non-negative integer")))
        };
        let float = || {
            value
                .parse::<f32>()
                .ok()
                .filter(|v| v.is_finite())
                .ok_or_else(|| bad(format!("{value:?} is not a finite number")))
        };
        match key {
            "n_layer" => hp.n_layer = int()?,
            "n_embd" => hp.n_embd = int()?,
            "n_ff" => hp.n_ff = int()?,
            "n_head" => hp.n_head = int()?,
            "n_head_kv" => hp.n_head_kv = int()?,
            "head_dim" => hp.head_dim = int()?,
            "n_vocab" => hp.n_vocab = int()?,
            "n_ctx" => hp.n_ctx = int()?,
            "rope_base" => hp.rope_base = float()?,
            "rms_eps" => hp.rms_eps = float()?,
            "tied" => {
                hp.tied_output = value
                    .parse()
                    .map_err(|_| bad(format!("{value:?} is not true or false")))?
            }
            _ => {
                return Err(bad(format!(
                    "unknown key; valid keys: {}",
                    OVERRIDES.join(", ")
                )));
            }
        }
    }
    Ok(hp)
}

/// The weight type named `name` (one of `QUANTS`), or an error listing the valid ones.
pub fn parse_quant(name: &str) -> Result<GgmlType, SynthError> {
    QUANTS
        .iter()
        .find(|q| q.eq_ignore_ascii_case(name))
        .and_then(|q| GgmlType::from_name(q))
        .ok_or_else(|| SynthError::UnknownQuant {
            name: name.to_string(),
            valid: QUANTS.join(", "),
        })
}

/// Writes the preset (or shape spec, see `shape_spec`) `preset_name` with weight type `quant`
/// and `seed` to `out` (atomically: a temporary file next to it is renamed into place).
pub fn write_preset(
    preset_name: &str,
    quant: &str,
    seed: u64,
    out: &Path,
) -> Result<SynthSummary, SynthError> {
    let hp = shape_spec(preset_name)?;
    let ty = parse_quant(quant)?;
    write_model(preset_name, &hp, ty, seed, out)
}

/// Writes a synthetic checkpoint of any llama shape to `out` (atomically).
pub fn write_model(
    name: &str,
    hp: &LlamaHparams,
    ty: GgmlType,
    seed: u64,
    out: &Path,
) -> Result<SynthSummary, SynthError> {
    let start = Instant::now();
    let io = |action, source| SynthError::Io {
        path: out.to_path_buf(),
        action,
        source,
    };
    let file_name = out.file_name().ok_or_else(|| {
        io(
            "name the file",
            std::io::Error::other("the path has no file name"),
        )
    })?;
    let tmp = out.with_file_name(format!(
        ".{}.tmp{}",
        file_name.to_string_lossy(),
        std::process::id()
    ));
    let file = File::create(&tmp).map_err(|e| io("create the temporary file", e))?;
    let result = write_to(
        name,
        hp,
        ty,
        seed,
        out,
        BufWriter::with_capacity(8 << 20, file),
    );
    let file_bytes = match result {
        Ok(n) => n,
        Err(e) => {
            let _ = std::fs::remove_file(&tmp);
            return Err(e);
        }
    };
    std::fs::rename(&tmp, out).map_err(|e| io("move the temporary file into place", e))?;
    Ok(SynthSummary {
        path: out.to_path_buf(),
        preset: name.to_string(),
        quant: ty,
        seed,
        hparams: hp.clone(),
        file_bytes,
        n_tensors: hp.tensor_shapes().len(),
        n_params: hp.n_params(),
        seconds: start.elapsed().as_secs_f64(),
    })
}

/// Writes the checkpoint as a GGUF stream into `w`, naming `path` in errors; returns the
/// number of bytes written.
pub fn write_to<W: Write>(
    name: &str,
    hp: &LlamaHparams,
    ty: GgmlType,
    seed: u64,
    path: &Path,
    w: W,
) -> Result<u64, SynthError> {
    check_shape(hp, ty)?;
    let mut gw = GgufWriter::new(path);
    add_metadata(&mut gw, name, hp, ty, seed)?;
    let shapes = hp.tensor_shapes();
    for (tname, shape) in &shapes {
        gw.add_tensor(TensorSpec {
            name: tname.clone(),
            ty: tensor_type(tname, shape, ty),
            shape: shape.clone(),
        })?;
    }
    let total = gw.file_len();
    let mut stream = gw.begin(w)?;
    // The next tensor is generated (on the rayon pool) while this thread writes the previous
    // one, so a multi-gigabyte checkpoint costs about max(compute, disk) rather than the sum.
    std::thread::scope(|scope| -> Result<(), SynthError> {
        let (tx, rx) = std::sync::mpsc::sync_channel::<Vec<u8>>(1);
        let shapes = &shapes;
        scope.spawn(move || {
            for (tname, shape) in shapes {
                let data = tensor_bytes(hp, tname, shape, tensor_type(tname, shape, ty), seed);
                // The receiver is gone only when writing failed; that error is reported there.
                if tx.send(data).is_err() {
                    break;
                }
            }
        });
        for (tname, _) in shapes {
            // The generator sends one buffer per tensor unless it panicked, in which case the
            // scope re-raises the panic when it joins.
            let Ok(data) = rx.recv() else { break };
            stream.write_tensor(tname, &data)?;
        }
        Ok(())
    })?;
    stream.finish()?;
    Ok(total)
}

fn check_shape(hp: &LlamaHparams, ty: GgmlType) -> Result<(), SynthError> {
    let bl = if ty.is_quantized() { ty.block_len() } else { 1 };
    // The token embedding is Q8_0 whenever the matrices are quantized, so its row (n_embd)
    // must be whole blocks too.
    for (what, v) in [
        ("n_embd", hp.n_embd),
        ("n_ff", hp.n_ff),
        ("n_head*head_dim", hp.q_dim()),
    ] {
        if v == 0 || !v.is_multiple_of(bl) {
            return Err(SynthError::BadShape(format!(
                "{what} = {v} is not a positive multiple of {ty}'s block of {bl}"
            )));
        }
    }
    if hp.n_vocab < MIN_VOCAB {
        return Err(SynthError::BadShape(format!(
            "n_vocab = {} is below {MIN_VOCAB} (3 special tokens and 256 bytes)",
            hp.n_vocab
        )));
    }
    if hp.n_head_kv == 0
        || !hp.n_head.is_multiple_of(hp.n_head_kv)
        || !hp.head_dim.is_multiple_of(2)
        || hp.n_layer == 0
    {
        return Err(SynthError::BadShape(format!(
            "{} heads / {} KV heads / head_dim {} / {} layers: heads must be a multiple of KV heads, head_dim even, layers ≥ 1",
            hp.n_head, hp.n_head_kv, hp.head_dim, hp.n_layer
        )));
    }
    if hp.n_ctx == 0
        || !(hp.rms_eps > 0.0 && hp.rms_eps < 1.0)
        || hp.rope_base.is_nan()
        || hp.rope_base <= 1.0
    {
        return Err(SynthError::BadShape(format!(
            "n_ctx {} / rms_eps {} / rope_base {}: the context must be ≥ 1, eps in (0, 1), the RoPE base above 1",
            hp.n_ctx, hp.rms_eps, hp.rope_base
        )));
    }
    Ok(())
}

/// ggml's `general.file_type` (`enum llama_ftype`) for a checkpoint whose matrices are `ty`.
fn file_type(ty: GgmlType) -> u32 {
    match ty {
        GgmlType::F32 => 0,
        GgmlType::F16 => 1,
        GgmlType::Q4_0 => 2,
        GgmlType::Q4_1 => 3,
        GgmlType::Q8_0 => 7,
        GgmlType::BF16 => 32,
    }
}

/// The stored type of a tensor: norms stay F32; with quantized matrices the token embedding
/// and the output head are Q8_0, as in the real SmolLM2 Q4_1 file.
fn tensor_type(name: &str, shape: &[u64], ty: GgmlType) -> GgmlType {
    if shape.len() == 1 {
        GgmlType::F32
    } else if ty.is_quantized() && (name == TOKEN_EMBD || name == OUTPUT) {
        GgmlType::Q8_0
    } else {
        ty
    }
}

fn add_metadata(
    gw: &mut GgufWriter,
    name: &str,
    hp: &LlamaHparams,
    ty: GgmlType,
    seed: u64,
) -> Result<(), GgufError> {
    let u = |v: usize| MetaValue::U32(v as u32);
    gw.add("general.architecture", ARCH)?;
    gw.add("general.type", "model")?;
    gw.add(
        "general.name",
        format!("memra synthetic {name} {ty} seed {seed}"),
    )?;
    gw.add("general.file_type", file_type(ty))?;
    gw.add("general.quantization_version", 2u32)?;
    gw.add("llama.block_count", u(hp.n_layer))?;
    gw.add("llama.context_length", u(hp.n_ctx))?;
    gw.add("llama.embedding_length", u(hp.n_embd))?;
    gw.add("llama.feed_forward_length", u(hp.n_ff))?;
    gw.add("llama.attention.head_count", u(hp.n_head))?;
    gw.add("llama.attention.head_count_kv", u(hp.n_head_kv))?;
    if hp.head_dim * hp.n_head != hp.n_embd {
        gw.add("llama.attention.key_length", u(hp.head_dim))?;
        gw.add("llama.attention.value_length", u(hp.head_dim))?;
    }
    gw.add("llama.rope.freq_base", hp.rope_base)?;
    gw.add("llama.attention.layer_norm_rms_epsilon", hp.rms_eps)?;
    gw.add("llama.vocab_size", u(hp.n_vocab))?;
    gw.add("llama.rope.dimension_count", u(hp.head_dim))?;
    let vocab = synth_vocab(hp.n_vocab);
    gw.add("tokenizer.ggml.add_space_prefix", false)?;
    gw.add("tokenizer.ggml.add_bos_token", false)?;
    gw.add("tokenizer.ggml.model", "gpt2")?;
    gw.add("tokenizer.ggml.pre", "smollm")?;
    gw.add(
        "tokenizer.ggml.tokens",
        MetaValue::string_array(vocab.tokens),
    )?;
    gw.add(
        "tokenizer.ggml.token_type",
        MetaValue::i32_array(vocab.token_types),
    )?;
    gw.add(
        "tokenizer.ggml.merges",
        MetaValue::Array(
            MetaType::String,
            vocab.merges.into_iter().map(MetaValue::String).collect(),
        ),
    )?;
    gw.add("tokenizer.ggml.bos_token_id", 1u32)?;
    gw.add("tokenizer.ggml.eos_token_id", 2u32)?;
    gw.add("tokenizer.ggml.unknown_token_id", 0u32)?;
    gw.add("tokenizer.ggml.padding_token_id", 2u32)?;
    Ok(())
}

/// A synthetic byte-level BPE vocabulary.
#[derive(Debug, Clone, PartialEq)]
pub struct SynthVocab {
    pub tokens: Vec<String>,
    pub token_types: Vec<i32>,
    pub merges: Vec<String>,
}

/// Builds a deterministic byte-level BPE vocabulary of exactly `n_vocab` tokens (at least
/// `MIN_VOCAB`): the special tokens, the 256 byte tokens in byte order, then merged tokens.
///
/// Merges are enumerated breadth-first: starting from `Ġ` (a space) and the lowercase letters
/// in English frequency order, each existing word piece is extended by one letter. Every merge
/// joins two tokens that already exist and yields a new one, so the result is a valid BPE
/// whatever its size, and common English words encode to few tokens.
pub fn synth_vocab(n_vocab: usize) -> SynthVocab {
    const LETTERS: &str = "etaoinshrdlcumwfgypbvkjxqz";
    let b2u = byte_to_unicode();
    let mut tokens: Vec<String> = SPECIAL_TOKENS.iter().map(|s| s.to_string()).collect();
    let mut token_types = vec![3; SPECIAL_TOKENS.len()];
    for c in b2u {
        tokens.push(c.to_string());
        token_types.push(1);
    }
    let letters: Vec<String> = LETTERS.chars().map(String::from).collect();
    let mut queue: std::collections::VecDeque<String> = std::iter::once("Ġ".to_string())
        .chain(letters.iter().cloned())
        .collect();
    let mut merges = Vec::new();
    'outer: while let Some(prefix) = queue.pop_front() {
        for l in &letters {
            if tokens.len() >= n_vocab {
                break 'outer;
            }
            let t = format!("{prefix}{l}");
            merges.push(format!("{prefix} {l}"));
            tokens.push(t.clone());
            token_types.push(1);
            queue.push_back(t);
        }
    }
    tokens.truncate(n_vocab.max(MIN_VOCAB));
    token_types.truncate(tokens.len());
    SynthVocab {
        tokens,
        token_types,
        merges,
    }
}

/// FNV-1a of the tensor name: a stable per-tensor key (std's hashers are not stable).
fn fnv1a(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// SplitMix64's finalizer: a bijective mix of 64 bits.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A standard-normal-like draw for element `i` of the stream `key`: the sum of four 16-bit
/// uniforms (Irwin–Hall), centred and scaled to unit variance. Integer sums below 2^18 are
/// exact in f32, so the value is the same on every machine.
fn normal(key: u64, i: u64) -> f32 {
    let h = mix(key ^ i.wrapping_mul(0x9e37_79b9_7f4a_7c15));
    let s = (h & 0xffff) + ((h >> 16) & 0xffff) + ((h >> 32) & 0xffff) + (h >> 48);
    ((s as f32 + 2.0) * (1.0 / 65536.0) - 2.0) * 1.732_050_8
}

/// How a tensor's values are drawn: `mean + std * z`, with a per-row scale in [0.75, 1.25)
/// so rows differ in magnitude as trained weights do (which is what stresses the per-block
/// scales of the quantized types).
fn distribution(hp: &LlamaHparams, name: &str) -> (f32, f32) {
    let role = name
        .strip_prefix("blk.")
        .and_then(|r| r.split('.').nth(1))
        .unwrap_or(name);
    let inv_sqrt = |n: usize| 1.0 / (n as f32).sqrt();
    // Residual branches are scaled down by sqrt(2 * n_layer) (GPT-2 style) so the residual
    // stream grows slowly through the layers, as in trained models.
    let residual = inv_sqrt(2 * hp.n_layer);
    match role {
        "attn_norm" | "ffn_norm" | "output_norm.weight" => (1.0, 0.1),
        // Logits are embedding rows dotted with a unit-rms hidden state: a std of
        // 2/sqrt(n_embd) gives logits of std ≈ 2, peaked like a trained model's.
        "token_embd.weight" | "output.weight" => (0.0, 2.0 * inv_sqrt(hp.n_embd)),
        "attn_q" | "attn_k" | "attn_v" | "ffn_gate" | "ffn_up" => (0.0, inv_sqrt(hp.n_embd)),
        "attn_output" => (0.0, inv_sqrt(hp.q_dim()) * residual),
        "ffn_down" => (0.0, inv_sqrt(hp.n_ff) * residual),
        _ => (0.0, 0.02),
    }
}

/// Generates and converts one tensor; rows are produced in parallel in fixed chunks, and each
/// element depends only on its index, so the bytes do not depend on the thread count.
fn tensor_bytes(hp: &LlamaHparams, name: &str, shape: &[u64], ty: GgmlType, seed: u64) -> Vec<u8> {
    let key = mix(seed ^ mix(fnv1a(name)));
    let row_key = mix(key ^ 0x5bd1_e995);
    let (mean, std) = distribution(hp, name);
    let cols = shape[0] as usize;
    let rows: usize = shape[1..].iter().product::<u64>() as usize;
    let rows_per_chunk = (1 << 20) / cols.max(1) + 1;
    let chunks: Vec<Vec<u8>> = (0..rows.div_ceil(rows_per_chunk))
        .into_par_iter()
        .map(|c| {
            let r0 = c * rows_per_chunk;
            let r1 = (r0 + rows_per_chunk).min(rows);
            let mut x = Vec::with_capacity((r1 - r0) * cols);
            for r in r0..r1 {
                let row_scale = 0.75
                    + 0.5 * ((mix(row_key ^ r as u64) >> 40) as f32 * (1.0 / (1u64 << 24) as f32));
                let s = std * if shape.len() > 1 { row_scale } else { 1.0 };
                let base = (r * cols) as u64;
                x.extend((0..cols as u64).map(|j| mean + s * normal(key, base + j)));
            }
            let mut out = Vec::new();
            // The shape was checked against the type's block size by `check_shape`, so a
            // conversion error here would be a bug in this module.
            quant::quantize(ty, &x, &mut out).expect("rows are whole blocks");
            out
        })
        .collect();
    chunks.concat()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vocab_has_the_requested_size_and_valid_merges() {
        for n in [MIN_VOCAB, 512, 49152] {
            let v = synth_vocab(n);
            assert_eq!(v.tokens.len(), n);
            assert_eq!(v.token_types.len(), n);
            assert_eq!(v.merges.len(), n - MIN_VOCAB);
            let set: std::collections::HashSet<&str> =
                v.tokens.iter().map(|s| s.as_str()).collect();
            assert_eq!(set.len(), n, "tokens are unique");
            for m in &v.merges {
                let (a, b) = m.split_once(' ').unwrap();
                assert!(
                    set.contains(a) && set.contains(b) && set.contains(format!("{a}{b}").as_str()),
                    "{m}"
                );
            }
        }
    }

    #[test]
    fn normal_draws_have_unit_variance_and_zero_mean() {
        let n = 200_000u64;
        let (mut s1, mut s2) = (0.0f64, 0.0f64);
        for i in 0..n {
            let z = normal(42, i) as f64;
            s1 += z;
            s2 += z * z;
        }
        let mean = s1 / n as f64;
        let var = s2 / n as f64 - mean * mean;
        assert!(mean.abs() < 0.01, "mean {mean}");
        assert!((var - 1.0).abs() < 0.02, "variance {var}");
    }

    #[test]
    fn shape_specs_override_preset_fields() {
        let hp = shape_spec("tiny:n_layer=8,n_vocab=1024,tied=false,rope_base=5e5").unwrap();
        let tiny = preset("tiny").unwrap().hparams;
        assert_eq!(
            hp,
            LlamaHparams {
                n_layer: 8,
                n_vocab: 1024,
                tied_output: false,
                rope_base: 5e5,
                ..tiny.clone()
            }
        );
        assert_eq!(shape_spec("tiny:").unwrap(), tiny);
        let e = shape_spec("tiny:n_layers=8").unwrap_err().to_string();
        assert_eq!(
            e,
            "shape spec `tiny:n_layers=8`: bad override `n_layers=8`: unknown key; valid keys: \
             n_layer, n_embd, n_ff, n_head, n_head_kv, head_dim, n_vocab, n_ctx, rope_base, rms_eps, tied"
        );
        assert!(shape_spec("tiny:n_layer=-1").is_err());
        assert!(shape_spec("tiny:n_layer").is_err());
        assert!(shape_spec("tiny:rms_eps=nan").is_err());
        assert!(shape_spec("huge:n_layer=1").is_err());
    }

    #[test]
    fn unknown_names_list_the_valid_ones() {
        let e = write_preset("huge", "q4_1", 0, Path::new("/nonexistent/x.gguf")).unwrap_err();
        assert_eq!(
            e.to_string(),
            "unknown preset `huge`; valid presets: tiny, tiny-untied, smollm2-135m, llama-7b"
        );
        let e = write_preset("tiny", "q5_k", 0, Path::new("/nonexistent/x.gguf")).unwrap_err();
        assert_eq!(
            e.to_string(),
            "unknown weight type `q5_k`; valid types: q4_1, q8_0, q4_0, f16, bf16, f32"
        );
    }
}
