//! `example-gate`: the smallest gate written against `memra-protocol` alone. It checks
//! that 1 + 2 + 3 = 6, reports one doors row and one check row through `MEMRA_ORCH_CHECKS`
//! (nothing when run by hand), and exits through the protocol's outcome. The smoke battery
//! (`manifests/smoke.toml`) runs it to prove that a third party's Rust gate passes through
//! `memra-orch run` without the engine.

use std::process::ExitCode;

use memra_protocol::{Check, ChecksWriter, DoorsRow, Status};

fn main() -> ExitCode {
    let mut checks = ChecksWriter::from_env();
    let doors = DoorsRow::new()
        .with("backend", "none")
        .with("terms", 3)
        .with("checked", true);
    let sum: u32 = [1, 2, 3].iter().sum();
    let status = if sum == 6 { Status::Pass } else { Status::Fail };
    let check = Check::new("sum", status, format!("1 + 2 + 3 = {sum}")).metric("compared", 3);
    println!(
        "{} {} {}",
        status.as_str().to_uppercase(),
        check.name,
        check.message
    );
    if let Err(e) = checks.doors(&doors).and_then(|()| checks.check(&check)) {
        // An unwritable checks file is no verdict: exit with neither 0 nor 1.
        eprintln!("example-gate: {e}");
        return ExitCode::from(2);
    }
    checks.outcome().into()
}
