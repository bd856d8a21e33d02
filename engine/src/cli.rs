//! The `memra-engine` command line.

/// Entry point of the `memra-engine` binary; returns the process exit code.
pub fn main() -> i32 {
    eprintln!("memra-engine: not built yet");
    3
}
