//! `spec-gate`: see `memra_gates::spec` and `docs/gates.md`.

fn main() {
    std::process::exit(memra_gates::spec::main());
}
