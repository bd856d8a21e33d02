//! memra-engine: a llama-architecture GGUF inference engine (CPU and CUDA backends).

pub mod cli;
pub mod doors;
pub mod model;
pub mod reference;
pub mod gguf;
pub mod hparams;
pub mod quant;
pub mod backend;
pub mod sampling;
pub mod synth;
pub mod tokenizer;
pub mod engine;
pub mod bench;
pub mod gates;
