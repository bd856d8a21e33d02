//! Fail closed: what a run requires of the machine (`[require] gpus = N` in the manifest,
//! `run --require-gpus N` on the command line, the command line winning), and the check
//! that refuses a run which cannot meet it before anything starts. A nightly on a machine
//! whose NVML did not load must not end green with every GPU cell skipped.
//!
//! This module decides and words the refusal; it does not detect GPUs ([`crate::machine::gpus`]
//! does) and does not run or skip cells (the runner does, and turns skips for lack of
//! resources into a failure while a requirement is in force).

use std::path::PathBuf;

use crate::machine::gpus::{Inventory, InventorySource};
use crate::plan::Plan;

/// Where a requirement was stated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RequireSource {
    /// `[require] gpus` of this manifest (the path as given on the command line).
    Manifest(PathBuf),
    /// `--require-gpus`.
    CommandLine,
}

/// The number of GPUs a run requires, and who asked for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuRequirement {
    pub gpus: u32,
    pub source: RequireSource,
}

impl GpuRequirement {
    /// The requirement in force: `--require-gpus` when given (so `--require-gpus 0` lifts a
    /// manifest's requirement), else the manifest's `[require] gpus`, else none.
    pub fn effective(plan: &Plan, command_line: Option<u32>) -> Option<GpuRequirement> {
        match command_line {
            Some(gpus) => Some(GpuRequirement {
                gpus,
                source: RequireSource::CommandLine,
            }),
            None => plan.require.gpus.map(|gpus| GpuRequirement {
                gpus,
                source: RequireSource::Manifest(plan.manifest.path.clone()),
            }),
        }
    }

    /// Whether the inventory meets the requirement; the error is the message to print.
    pub fn check(&self, inventory: &Inventory) -> Result<(), Unmet> {
        let found = inventory.gpus.len();
        if found >= self.gpus as usize {
            return Ok(());
        }
        Err(Unmet {
            required: self.clone(),
            found,
            why: detected_how(inventory),
        })
    }
}

/// A requirement the machine does not meet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unmet {
    pub required: GpuRequirement,
    /// GPUs detected.
    pub found: usize,
    /// How they were detected, or why NVML gave none.
    pub why: String,
}

impl std::fmt::Display for Unmet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} detected ({}); {}; run on a machine with {}, or pass --require-gpus 0 to run what this machine can",
            gpus(self.found),
            self.why,
            asked(&self.required),
            gpus(self.required.gpus as usize),
        )
    }
}

impl std::error::Error for Unmet {}

fn gpus(n: usize) -> String {
    format!("{n} GPU{}", if n == 1 { "" } else { "s" })
}

fn asked(r: &GpuRequirement) -> String {
    match &r.source {
        RequireSource::Manifest(path) => format!(
            "the manifest requires {} ({} [require] gpus)",
            r.gpus,
            path.display()
        ),
        RequireSource::CommandLine => {
            format!(
                "the command line requires {} (--require-gpus {})",
                r.gpus, r.gpus
            )
        }
    }
}

/// Where the inventory's count came from, in the words of the option or of NVML's failure.
fn detected_how(inv: &Inventory) -> String {
    // Notes about a missing NVML end by repeating the count, which the message says first.
    let note = inv
        .note
        .as_deref()
        .map(|n| n.strip_suffix(": 0 GPUs detected").unwrap_or(n));
    match (inv.source, note) {
        (InventorySource::None, Some(note)) => note.to_string(),
        (InventorySource::None, None) => "--gpus none".to_string(),
        (InventorySource::Fake, _) => format!("--gpus fake:{}", inv.gpus.len()),
        (InventorySource::Slurm, _) => "GPUs of the Slurm partition".to_string(),
        (InventorySource::Nvml, Some(note)) => format!("NVML; {note}"),
        (InventorySource::Nvml, None) => "NVML".to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn manifest(gpus: u32) -> GpuRequirement {
        GpuRequirement {
            gpus,
            source: RequireSource::Manifest("manifests/h100-nightly.toml".into()),
        }
    }

    #[test]
    fn a_missing_nvml_is_named_with_the_requirement_and_the_way_out() {
        let mut inv = Inventory::fake(0);
        inv.source = InventorySource::None;
        inv.note =
            Some("no NVML library (libnvidia-ml.so.1) on this machine: 0 GPUs detected".into());
        let e = manifest(2).check(&inv).unwrap_err();
        assert_eq!(
            e.to_string(),
            "0 GPUs detected (no NVML library (libnvidia-ml.so.1) on this machine); the manifest \
             requires 2 (manifests/h100-nightly.toml [require] gpus); run on a machine with 2 \
             GPUs, or pass --require-gpus 0 to run what this machine can"
        );
    }

    #[test]
    fn overrides_count_as_what_was_detected() {
        assert!(manifest(2).check(&Inventory::fake(2)).is_ok());
        assert!(manifest(0).check(&Inventory::fake(0)).is_ok());
        let e = GpuRequirement {
            gpus: 3,
            source: RequireSource::CommandLine,
        }
        .check(&Inventory::fake(1))
        .unwrap_err();
        assert!(
            e.to_string().starts_with(
                "1 GPU detected (--gpus fake:1); the command line requires 3 (--require-gpus 3)"
            ),
            "{e}"
        );
    }
}
