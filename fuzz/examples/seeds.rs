//! Writes the seed corpus of the `gguf_open` target: a one-layer synthetic llama model in each
//! weight type (small enough for the fuzzer to mutate quickly) and a few header-only files.
//!
//! Usage: cargo run --manifest-path fuzz/Cargo.toml --example seeds -- fuzz/seeds/gguf_open

use std::path::PathBuf;

use memra_engine::gguf::{GgmlType, GgufWriter, MetaValue, TensorSpec};
use memra_engine::hparams::LlamaHparams;
use memra_engine::synth;

fn main() {
    let dir = PathBuf::from(std::env::args().nth(1).unwrap_or_else(|| "fuzz/seeds/gguf_open".into()));
    std::fs::create_dir_all(&dir).unwrap();
    let hp = LlamaHparams {
        n_layer: 1,
        n_embd: 32,
        n_ff: 64,
        n_head: 2,
        n_head_kv: 1,
        head_dim: 16,
        rope_base: 10_000.0,
        rms_eps: 1e-5,
        n_vocab: synth::MIN_VOCAB,
        n_ctx: 64,
        tied_output: true,
    };
    for q in synth::QUANTS {
        let ty = synth::parse_quant(q).unwrap();
        let path = dir.join(format!("micro-{q}.gguf"));
        let mut bytes = Vec::new();
        synth::write_to("micro", &hp, ty, 1, &path, &mut bytes).unwrap();
        std::fs::write(&path, bytes).unwrap();
    }
    let mut w = GgufWriter::new("header-only");
    w.add("general.architecture", "llama").unwrap();
    w.add("k.arr", MetaValue::i32_array([1, 2, 3])).unwrap();
    w.add_tensor(TensorSpec { name: "w".into(), ty: GgmlType::Q4_1, shape: vec![32, 2] }).unwrap();
    let mut s = w.begin(Vec::new()).unwrap();
    s.write_tensor("w", &[0x11; 40]).unwrap();
    std::fs::write(dir.join("one-tensor.gguf"), s.finish().unwrap()).unwrap();
    println!("seeds written to {}", dir.display());
}
