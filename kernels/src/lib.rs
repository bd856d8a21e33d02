//! memra-kernels: the CUDA C sources of the engine's kernels (`kernels/cuda/`), their NVRTC
//! compilation with a disk cache, typed launchers, the host twin of every kernel, and the
//! ggml block layouts both share. Everything builds and tests without CUDA; the CUDA
//! libraries are loaded at run time and probed first.

pub mod blocks;
pub mod check;
pub mod compile;
pub mod cuda;
pub mod error;
pub mod sources;
pub mod tuning;
pub mod twin;
