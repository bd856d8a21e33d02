//! `reference-gate`: see `memra_gates::reference` and `docs/gates.md`.

fn main() {
    std::process::exit(memra_gates::reference::main());
}
