//! Command-line parsing (validation only) and dispatch to the library.

/// Parses the command line and runs the subcommand; returns the exit code.
pub fn main() -> i32 {
    eprintln!("memra-orch: not built yet");
    crate::ExitCode::Internal.code()
}
