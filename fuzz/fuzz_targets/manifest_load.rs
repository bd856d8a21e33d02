//! Fuzzes the manifest loader from text to plan (`memra_orch::load::plan_from_bytes`: TOML
//! walk, `[defaults]`, matrix expansion, `${…}` substitution and shell quoting, `needs`
//! linking, compare pairing, the cell caps) and what is printed of the outcome (every
//! diagnostic with its source excerpt; the plan in text, JSON and DOT, redacted). The root
//! is an empty temporary folder, so relative env-matrix paths find nothing. Any panic is a
//! bug; diagnostics are the expected outcome for almost every input.
#![no_main]

use std::path::PathBuf;
use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use memra_orch::load::plan_from_bytes;
use memra_orch::load::render::{PlanFormat, render};

fn root() -> &'static PathBuf {
    static ROOT: OnceLock<PathBuf> = OnceLock::new();
    ROOT.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("memra-fuzz-root-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a temporary root");
        dir
    })
}

fuzz_target!(|data: &[u8]| {
    // A manifest that raises `max_cells` asks for a large plan; building one is then slow
    // by request, not a defect, and would only read as a timeout here.
    if data.windows(9).any(|w| w == b"max_cells") {
        return;
    }
    let root = root();
    match plan_from_bytes(&root.join("fuzz.toml"), data.to_vec(), root, &[]) {
        Ok(plan) => {
            let selected = vec![true; plan.cells.len()];
            for format in [PlanFormat::Text, PlanFormat::Json, PlanFormat::Dot] {
                let _ = render(&plan, &selected, format);
            }
        }
        Err(diagnostics) => {
            let _ = diagnostics.to_string();
        }
    }
});
