//! cuda-check: the CUDA backend's acceptance checks; see `memra_gates::cuda_check`.

fn main() {
    std::process::exit(memra_gates::cuda_check::main());
}
