//! kernel-check: every CUDA kernel against its host twin; see `memra_kernels::check`.

fn main() {
    std::process::exit(memra_kernels::check::main());
}
