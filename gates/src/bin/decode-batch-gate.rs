//! `decode-batch-gate`: see `memra_gates::decode_batch` and `docs/gates.md`.

fn main() {
    std::process::exit(memra_gates::decode_batch::main());
}
