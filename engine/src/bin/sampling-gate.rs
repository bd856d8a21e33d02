//! `sampling-gate`: see `memra_engine::gates::sampling` and `docs/gates.md`.

fn main() {
    std::process::exit(memra_engine::gates::sampling::main());
}
