//! memra-orch: the declarative gate orchestrator.

/// Entry point of the `memra-orch` binary; returns the process exit code.
pub fn main() -> i32 {
    eprintln!("memra-orch: not built yet");
    3
}
