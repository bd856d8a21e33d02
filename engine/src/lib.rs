//! memra-engine: a llama-architecture GGUF inference engine (CPU and CUDA backends).

pub mod backend;
pub mod bench;
pub mod cli;
pub mod doors;
pub mod engine;
pub mod error;
pub mod ggml_type;
pub mod gguf;
pub mod hparams;
pub mod model;
pub mod quant;
pub mod reference;
pub mod sampling;
pub mod seq;
pub mod spec;
pub mod synth;
pub mod tokenizer;
