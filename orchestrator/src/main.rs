fn main() {
    std::process::exit(memra_orch::cmd::main());
}
