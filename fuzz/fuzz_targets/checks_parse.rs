//! Fuzzes the checks-file parser (`memra_orch::gate::checks::parse_checks`: JSON lines of check
//! rows and the doors row, as a gate appends them, with nested keys sorted for the receipt)
//! and the reasons a report yields. A gate's output is untrusted: any panic is a bug;
//! protocol problems in the report are the expected outcome for malformed input.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let report = memra_orch::gate::checks::parse_checks(&text);
    let _ = report.first_failed();
    let _ = format!("{report:?}");
});
