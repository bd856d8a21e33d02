fn main() {
    std::process::exit(memra_engine::cli::main());
}
