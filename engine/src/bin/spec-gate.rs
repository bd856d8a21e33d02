//! `spec-gate`: see `memra_engine::gates::spec` and `docs/gates.md`.

fn main() {
    std::process::exit(memra_engine::gates::spec::main());
}
