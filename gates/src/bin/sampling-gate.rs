//! `sampling-gate`: see `memra_gates::sampling` and `docs/gates.md`.

fn main() {
    std::process::exit(memra_gates::sampling::main());
}
