//! `reference-gate`: see `memra_engine::gates::reference` and `docs/gates.md`.

fn main() {
    std::process::exit(memra_engine::gates::reference::main());
}
