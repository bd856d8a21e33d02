//! `decode-batch-gate`: see `memra_engine::gates::decode_batch` and `docs/gates.md`.

fn main() {
    std::process::exit(memra_engine::gates::decode_batch::main());
}
