//! cuda-check: the CUDA backend's acceptance checks; see `memra_engine::backend::cuda::check`.

fn main() {
    std::process::exit(memra_engine::backend::cuda::check::main());
}
