//! memra-kernels: the CUDA C sources of the engine's kernels.
