//! `exact-gate`: see `memra_engine::gates::exact` and `docs/gates.md`.

fn main() {
    std::process::exit(memra_engine::gates::exact::main());
}
