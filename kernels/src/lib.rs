//! memra-kernels: the CUDA C sources of the engine's kernels, their host twins, and the
//! ggml block layouts both share.

pub mod blocks;
pub mod twin;
