//! `memra-supervise`: the attempt supervisor memra-orch starts between itself and each gate
//! (`run/executor/supervise.rs`). Not a command for people: memra-orch passes it a socket as
//! stdin and reads its reports there.

fn main() {
    std::process::exit(memra_orch::run::executor::supervise::main_standalone());
}
