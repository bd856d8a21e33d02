//! `exact-gate`: see `memra_gates::exact` and `docs/gates.md`.

fn main() {
    std::process::exit(memra_gates::exact::main());
}
