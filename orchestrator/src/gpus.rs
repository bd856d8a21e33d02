//! GPU inventory: what GPUs exist for this run (NVML, bounded by the caller's
//! CUDA_VISIBLE_DEVICES, or overridden by `--gpus`). It detects and describes; it does not
//! lease (the scheduler does).

use serde::{Deserialize, Serialize};

/// One GPU as the scheduler and the receipts see it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Gpu {
    /// The ordinal exported in CUDA_VISIBLE_DEVICES (the NVML index for real GPUs).
    pub index: u32,
    pub uuid: String,
    pub name: String,
    pub memory_total: u64,
    pub memory_free: u64,
    pub pci_bus_id: String,
    /// Indices (in this inventory) of GPUs reachable from this one over an active NVLink.
    pub nvlink_peers: Vec<u32>,
}

/// Where the inventory came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum InventorySource {
    Nvml,
    Fake,
    None,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Inventory {
    pub source: InventorySource,
    pub gpus: Vec<Gpu>,
    pub driver_version: Option<String>,
    pub cuda_driver_version: Option<String>,
    /// Said once to the user when something is off (no NVML library, CUDA_VISIBLE_DEVICES
    /// names an unknown device…).
    pub note: Option<String>,
}

/// The `--gpus` override.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GpuSpec {
    /// Every GPU NVML sees, bounded by CUDA_VISIBLE_DEVICES (the default).
    All,
    None,
    /// These NVML indices only.
    List(Vec<u32>),
    /// N fake GPUs (for tests and CPU machines): uuid `GPU-fake-<i>`, no NVLink.
    Fake(u32),
}

impl Inventory {
    /// An inventory of `n` fake GPUs.
    pub fn fake(n: u32) -> Inventory {
        Inventory {
            source: InventorySource::Fake,
            gpus: (0..n)
                .map(|i| Gpu {
                    index: i,
                    uuid: format!("GPU-fake-{i}"),
                    name: "fake GPU".to_string(),
                    memory_total: 0,
                    memory_free: 0,
                    pci_bus_id: String::new(),
                    nvlink_peers: Vec::new(),
                })
                .collect(),
            driver_version: None,
            cuda_driver_version: None,
            note: None,
        }
    }
}

impl std::str::FromStr for GpuSpec {
    type Err = String;
    fn from_str(s: &str) -> Result<GpuSpec, String> {
        let _ = s;
        Err("--gpus: not built yet".to_string())
    }
}

/// The `gpus` subcommand.
pub fn command(_args: &crate::cli::GpusArgs) -> crate::ExitCode {
    eprintln!("memra-orch gpus: not built yet");
    crate::ExitCode::Internal
}
