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
    /// Job slots of a Slurm run: Slurm chooses the real devices, one slot per GPU the
    /// partition has.
    Slurm,
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

/// The output formats of `gpus`: a table, or the inventory as the receipts record it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum GpusFormat {
    Text,
    Json,
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

impl Inventory {
    /// The GPU slots of a Slurm run: `n` of them, none naming a device (no UUID), since
    /// Slurm picks the GPUs when a job starts. They bound how many jobs wait in its queue
    /// and rule out cells no node could hold.
    pub fn slurm_slots(n: u32) -> Inventory {
        let mut inv = Inventory::fake(n);
        inv.source = InventorySource::Slurm;
        for g in &mut inv.gpus {
            g.uuid = String::new();
            g.name = "a GPU Slurm allocates".to_string();
        }
        inv
    }
}

/// Leaves out of `inv` the GPUs `uuids` name (a UUID or a unique prefix of one, any case).
/// An entry that names no GPU, or several, is an error naming it: a GPU meant to be kept
/// out must not slip back in through a typo.
pub fn exclude(inv: &mut Inventory, uuids: &[String]) -> Result<Vec<String>, String> {
    let mut removed = Vec::new();
    for (k, u) in uuids.iter().enumerate() {
        let want = u.trim().to_ascii_lowercase();
        if uuids[..k]
            .iter()
            .any(|o| o.trim().eq_ignore_ascii_case(u.trim()))
        {
            return Err(format!("--exclude-gpu {u} is given twice; give it once"));
        }
        let hits: Vec<usize> = inv
            .gpus
            .iter()
            .enumerate()
            .filter(|(_, g)| !want.is_empty() && g.uuid.to_ascii_lowercase().starts_with(&want))
            .map(|(i, _)| i)
            .collect();
        match hits.as_slice() {
            [i] => {
                removed.push(inv.gpus.remove(*i).uuid);
            }
            [] => {
                let have: Vec<&str> = inv.gpus.iter().map(|g| g.uuid.as_str()).collect();
                return Err(format!(
                    "--exclude-gpu {u}: no GPU of this run has that UUID (it has: {}); copy it \
                     from `memra-orch gpus`",
                    if have.is_empty() {
                        "none".to_string()
                    } else {
                        have.join(", ")
                    }
                ));
            }
            _ => {
                return Err(format!(
                    "--exclude-gpu {u}: names {} GPUs; give more of the UUID",
                    hits.len()
                ));
            }
        }
    }
    Ok(removed)
}

impl Gpu {
    /// What to export in CUDA_VISIBLE_DEVICES for this GPU: the UUID for NVML GPUs (CUDA
    /// accepts UUIDs, and they do not depend on CUDA's device ordering, which may differ from
    /// NVML's), the index for fake GPUs.
    pub fn visible_id(&self) -> String {
        if self.uuid.starts_with("GPU-fake-") || self.uuid.is_empty() {
            self.index.to_string()
        } else {
            self.uuid.clone()
        }
    }
}

impl std::str::FromStr for GpuSpec {
    type Err = String;
    fn from_str(s: &str) -> Result<GpuSpec, String> {
        let s = s.trim();
        match s {
            "all" => return Ok(GpuSpec::All),
            "none" => return Ok(GpuSpec::None),
            _ => {}
        }
        if let Some(n) = s.strip_prefix("fake:") {
            return n.parse().map(GpuSpec::Fake).map_err(|_| {
                format!(
                    "`{s}`: the number of fake GPUs must be a non-negative integer, e.g. `fake:2`"
                )
            });
        }
        let mut list = Vec::new();
        for part in s.split(',') {
            let part = part.trim();
            let i: u32 = part.parse().map_err(|_| {
                format!("`{part}` is not a GPU index; write `all`, `none`, a list of NVML indices such as `0,2`, or `fake:N`")
            })?;
            if list.contains(&i) {
                return Err(format!("GPU {i} is listed twice in `{s}`"));
            }
            list.push(i);
        }
        Ok(GpuSpec::List(list))
    }
}

/// Everything NVML reports, before CUDA_VISIBLE_DEVICES and `--gpus` narrow it. Gpu indices
/// and NVLink peers are NVML indices.
#[derive(Debug, Clone, PartialEq)]
pub struct NvmlListing {
    pub gpus: Vec<Gpu>,
    pub driver_version: Option<String>,
    pub cuda_driver_version: Option<String>,
}

/// NVML_NVLINK_MAX_LINKS of nvml.h: the most NVLink links one GPU can have.
const NVLINK_MAX_LINKS: u32 = 18;

/// Why NVML gave no listing. It is no failure of a run: the inventory is then empty and the
/// text is its note, said once and recorded in `run.json` (so the wording is part of that
/// format).
#[derive(Debug, thiserror::Error)]
pub enum NvmlError {
    #[error("no NVML library (libnvidia-ml.so.1) on this machine: 0 GPUs detected")]
    NoLibrary,
    #[error("the NVIDIA driver is not loaded: 0 GPUs detected")]
    DriverNotLoaded,
    #[error("NVML failed to start ({0}): 0 GPUs detected")]
    Init(nvml_wrapper::error::NvmlError),
    #[error("NVML could not count GPUs ({0}): 0 GPUs detected")]
    Count(nvml_wrapper::error::NvmlError),
    #[error("NVML could not open GPU {index} ({error})")]
    Open {
        index: u32,
        error: nvml_wrapper::error::NvmlError,
    },
}

/// Reads the GPUs through NVML; `Err` says why there are none (no library, no driver).
pub fn nvml_listing() -> Result<NvmlListing, NvmlError> {
    use nvml_wrapper::Nvml;
    use nvml_wrapper::enum_wrappers::device::{P2pCapabilitiesIndex, P2pStatus};
    use nvml_wrapper::error::NvmlError as Raw;
    let nvml = Nvml::init().map_err(|e| match e {
        Raw::LibloadingError(_) | Raw::FailedToLoadSymbol(_) | Raw::LibraryNotFound => {
            NvmlError::NoLibrary
        }
        Raw::DriverNotLoaded => NvmlError::DriverNotLoaded,
        other => NvmlError::Init(other),
    })?;
    let count = nvml.device_count().map_err(NvmlError::Count)?;
    let mut gpus = Vec::new();
    let mut devices = Vec::new();
    let mut links: Vec<Vec<String>> = Vec::new();
    for index in 0..count {
        let dev = nvml
            .device_by_index(index)
            .map_err(|error| NvmlError::Open { index, error })?;
        let memory = dev.memory_info().ok();
        let pci_bus_id = dev.pci_info().map(|p| p.bus_id).unwrap_or_default();
        let mut remote = Vec::new();
        for link in 0..NVLINK_MAX_LINKS {
            let l = dev.link_wrapper_for(link);
            // Links that do not exist on this GPU report an error; only active ones count.
            if l.is_active().unwrap_or(false)
                && let Ok(p) = l.remote_pci_info()
            {
                remote.push(p.bus_id);
            }
        }
        links.push(remote);
        gpus.push(Gpu {
            index,
            uuid: dev.uuid().unwrap_or_default(),
            name: dev.name().unwrap_or_else(|_| "unknown GPU".into()),
            memory_total: memory.as_ref().map_or(0, |m| m.total),
            memory_free: memory.as_ref().map_or(0, |m| m.free),
            pci_bus_id,
            nvlink_peers: Vec::new(),
        });
        devices.push(dev);
    }
    // Two GPUs are NVLink peers when a link of one ends at the other (direct bridges), or
    // when NVML reports NVLink peer-to-peer between them: behind NVSwitches (HGX boards) a
    // link's remote end is the switch, not the peer GPU.
    let bus_ids: Vec<String> = gpus.iter().map(|g| g.pci_bus_id.clone()).collect();
    for (i, g) in gpus.iter_mut().enumerate() {
        let mut peers: Vec<u32> = links[i]
            .iter()
            .filter_map(|b| {
                bus_ids
                    .iter()
                    .position(|x| !x.is_empty() && x.eq_ignore_ascii_case(b))
            })
            .map(|j| j as u32)
            .collect();
        for (j, other) in devices.iter().enumerate() {
            if j != i
                && devices[i]
                    .p2p_status(other, P2pCapabilitiesIndex::NvLink)
                    .ok()
                    == Some(P2pStatus::Ok)
            {
                peers.push(j as u32);
            }
        }
        peers.retain(|&p| p != g.index);
        peers.sort_unstable();
        peers.dedup();
        g.nvlink_peers = peers;
    }
    let cuda = nvml.sys_cuda_driver_version().ok().map(|v| {
        format!(
            "{}.{}",
            nvml_wrapper::cuda_driver_version_major(v),
            nvml_wrapper::cuda_driver_version_minor(v)
        )
    });
    Ok(NvmlListing {
        gpus,
        driver_version: nvml.sys_driver_version().ok(),
        cuda_driver_version: cuda,
    })
}

/// Narrows an NVML listing to what CUDA_VISIBLE_DEVICES (`cvd`, `None` when unset) lets the
/// caller see, in its order, following CUDA's rules: entries are NVML indices or `GPU-…`
/// UUIDs (a unique prefix suffices); the first entry that names no GPU (or repeats one, or is
/// a MIG device) ends the list; an empty value hides every GPU. Returns the GPUs and a note
/// when something was dropped.
pub fn bound_by_visible_devices(all: &[Gpu], cvd: Option<&str>) -> (Vec<Gpu>, Option<String>) {
    let Some(cvd) = cvd else {
        return (all.to_vec(), None);
    };
    if cvd.trim().is_empty() {
        return (
            Vec::new(),
            Some("CUDA_VISIBLE_DEVICES is empty: no GPU is visible".into()),
        );
    }
    let mut out: Vec<Gpu> = Vec::new();
    for entry in cvd.split(',') {
        let e = entry.trim();
        let found: Result<&Gpu, Unmatched> = if let Ok(i) = e.parse::<u32>() {
            all.iter()
                .find(|g| g.index == i)
                .ok_or(Unmatched::NoIndex(i))
        } else if e.starts_with("GPU-") {
            let hits: Vec<&Gpu> = all
                .iter()
                .filter(|g| {
                    g.uuid
                        .to_ascii_lowercase()
                        .starts_with(&e.to_ascii_lowercase())
                })
                .collect();
            match hits.len() {
                1 => Ok(hits[0]),
                0 => Err(Unmatched::NoUuid),
                n => Err(Unmatched::Ambiguous(n)),
            }
        } else if e.starts_with("MIG-") {
            Err(Unmatched::Mig)
        } else {
            Err(Unmatched::NotAnId)
        };
        match found {
            Ok(g) if out.iter().any(|o| o.index == g.index) => {
                let note = format!(
                    "CUDA_VISIBLE_DEVICES={cvd}: `{e}` repeats GPU {}; CUDA ignores it and every entry after it",
                    g.index
                );
                return (out, Some(note));
            }
            Ok(g) => out.push(g.clone()),
            Err(why) => {
                let note = format!(
                    "CUDA_VISIBLE_DEVICES={cvd}: `{e}`: {why}; CUDA ignores it and every entry after it"
                );
                return (out, Some(note));
            }
        }
    }
    (out, None)
}

/// Why an entry of CUDA_VISIBLE_DEVICES names no GPU of the listing (a part of the
/// inventory's note).
#[derive(Debug, thiserror::Error)]
enum Unmatched {
    #[error("there is no GPU {0}")]
    NoIndex(u32),
    #[error("no GPU has this UUID")]
    NoUuid,
    #[error("the prefix matches {0} GPUs")]
    Ambiguous(usize),
    #[error("MIG devices are not scheduled by memra-orch")]
    Mig,
    #[error("not an index or a GPU- UUID")]
    NotAnId,
}

/// The inventory for a spec, given an NVML listing (or why there is none, which becomes the
/// note) and the caller's CUDA_VISIBLE_DEVICES. Pure, for tests; [`detect`] feeds it the
/// machine. `--gpus none` and `fake:N` do not read the listing.
pub fn inventory_from(
    spec: &GpuSpec,
    listing: Result<NvmlListing, NvmlError>,
    cvd: Option<&str>,
) -> Inventory {
    let empty = |source, note| Inventory {
        source,
        gpus: Vec::new(),
        driver_version: None,
        cuda_driver_version: None,
        note,
    };
    match spec {
        GpuSpec::None => return empty(InventorySource::None, None),
        GpuSpec::Fake(n) => return Inventory::fake(*n),
        GpuSpec::All | GpuSpec::List(_) => {}
    }
    let listing = match listing {
        Ok(l) => l,
        Err(why) => return empty(InventorySource::None, Some(why.to_string())),
    };
    let (mut gpus, note) = bound_by_visible_devices(&listing.gpus, cvd);
    let mut notes: Vec<String> = note.into_iter().collect();
    if let GpuSpec::List(wanted) = spec {
        let missing: Vec<String> = wanted
            .iter()
            .filter(|w| !gpus.iter().any(|g| g.index == **w))
            .map(u32::to_string)
            .collect();
        if !missing.is_empty() {
            let why = if cvd.is_some() {
                "not present or hidden by CUDA_VISIBLE_DEVICES"
            } else {
                "not present"
            };
            notes.push(format!(
                "--gpus: GPU {} {why}; using the others",
                missing.join(", ")
            ));
        }
        gpus = wanted
            .iter()
            .filter_map(|w| gpus.iter().find(|g| g.index == *w).cloned())
            .collect();
    }
    let present: Vec<u32> = gpus.iter().map(|g| g.index).collect();
    for g in &mut gpus {
        g.nvlink_peers.retain(|p| present.contains(p));
    }
    Inventory {
        source: InventorySource::Nvml,
        gpus,
        driver_version: listing.driver_version,
        cuda_driver_version: listing.cuda_driver_version,
        note: (!notes.is_empty()).then(|| notes.join("; ")),
    }
}

/// Detects the GPUs of this machine for a spec (NVML, bounded by CUDA_VISIBLE_DEVICES).
/// Never fails: no NVML library means 0 GPUs with a note.
pub fn detect(spec: &GpuSpec) -> Inventory {
    let listing = match spec {
        GpuSpec::All | GpuSpec::List(_) => nvml_listing(),
        // Not read for these specs, so NVML is not started at all.
        GpuSpec::None | GpuSpec::Fake(_) => Ok(NvmlListing {
            gpus: Vec::new(),
            driver_version: None,
            cuda_driver_version: None,
        }),
    };
    let cvd = std::env::var("CUDA_VISIBLE_DEVICES").ok();
    inventory_from(spec, listing, cvd.as_deref())
}

fn gib(bytes: u64) -> String {
    format!("{:.1}", bytes as f64 / (1u64 << 30) as f64)
}

/// The inventory as a text table.
pub fn render_text(inv: &Inventory) -> String {
    use std::fmt::Write as _;
    let source = match inv.source {
        InventorySource::Nvml => "nvml",
        InventorySource::Fake => "fake",
        InventorySource::None => "none",
        InventorySource::Slurm => "slurm",
    };
    let mut s = String::new();
    if inv.gpus.is_empty() {
        let _ = writeln!(s, "no GPUs (source: {source})");
    } else {
        let rows: Vec<[String; 6]> = inv
            .gpus
            .iter()
            .map(|g| {
                let peers: Vec<String> = g.nvlink_peers.iter().map(u32::to_string).collect();
                [
                    g.index.to_string(),
                    g.uuid.clone(),
                    g.name.clone(),
                    format!("{}/{}", gib(g.memory_free), gib(g.memory_total)),
                    if g.pci_bus_id.is_empty() {
                        "-".into()
                    } else {
                        g.pci_bus_id.clone()
                    },
                    if peers.is_empty() {
                        "-".into()
                    } else {
                        peers.join(",")
                    },
                ]
            })
            .collect();
        let head = [
            "index",
            "uuid",
            "name",
            "free/total GiB",
            "pci bus id",
            "nvlink peers",
        ];
        let widths: Vec<usize> = (0..6)
            .map(|c| {
                rows.iter()
                    .map(|r| r[c].len())
                    .chain([head[c].len()])
                    .max()
                    .unwrap_or(0)
            })
            .collect();
        let line = |cells: &[&str]| -> String {
            let padded: Vec<String> = cells
                .iter()
                .zip(&widths)
                .map(|(c, w)| format!("{c:<w$}"))
                .collect();
            padded.join("  ").trim_end().to_string()
        };
        let _ = writeln!(s, "{}", line(&head));
        for r in &rows {
            let cells: Vec<&str> = r.iter().map(String::as_str).collect();
            let _ = writeln!(s, "{}", line(&cells));
        }
        let _ = writeln!(
            s,
            "{} GPU{} (source: {source}); driver {}, CUDA driver {}",
            inv.gpus.len(),
            if inv.gpus.len() == 1 { "" } else { "s" },
            inv.driver_version.as_deref().unwrap_or("-"),
            inv.cuda_driver_version.as_deref().unwrap_or("-")
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpu(index: u32, uuid: &str, peers: &[u32]) -> Gpu {
        Gpu {
            index,
            uuid: uuid.into(),
            name: "NVIDIA H200".into(),
            memory_total: 141 << 30,
            memory_free: 140 << 30,
            pci_bus_id: format!("00000000:{:02X}:00.0", 0x18 + index),
            nvlink_peers: peers.to_vec(),
        }
    }

    fn listing() -> NvmlListing {
        NvmlListing {
            gpus: vec![
                gpu(0, "GPU-aaaa1111-0000", &[1, 2, 3]),
                gpu(1, "GPU-aaaa2222-0000", &[0, 2, 3]),
                gpu(2, "GPU-bbbb3333-0000", &[0, 1, 3]),
                gpu(3, "GPU-cccc4444-0000", &[0, 1, 2]),
            ],
            driver_version: Some("580.159.04".into()),
            cuda_driver_version: Some("13.0".into()),
        }
    }

    fn indices(inv: &Inventory) -> Vec<u32> {
        inv.gpus.iter().map(|g| g.index).collect()
    }

    #[test]
    fn visible_devices_by_index_uuid_and_prefix_in_order() {
        let inv = inventory_from(
            &GpuSpec::All,
            Ok(listing()),
            Some("2,GPU-cccc,GPU-aaaa1111-0000"),
        );
        assert_eq!(indices(&inv), [2, 3, 0]);
        assert_eq!(inv.note, None);
        // NVLink peers shrink to the GPUs in the inventory.
        assert_eq!(inv.gpus[0].nvlink_peers, [0, 3]);
        assert_eq!(inv.gpus[0].visible_id(), "GPU-bbbb3333-0000");
    }

    #[test]
    fn first_invalid_entry_ends_the_list() {
        let inv = inventory_from(&GpuSpec::All, Ok(listing()), Some("1,7,0"));
        assert_eq!(indices(&inv), [1]);
        assert!(
            inv.note
                .as_deref()
                .unwrap()
                .contains("`7`: there is no GPU 7")
        );
        let inv = inventory_from(&GpuSpec::All, Ok(listing()), Some("GPU-aaaa,2"));
        assert_eq!(indices(&inv), Vec::<u32>::new());
        assert!(inv.note.as_deref().unwrap().contains("matches 2 GPUs"));
        let inv = inventory_from(&GpuSpec::All, Ok(listing()), Some("-1"));
        assert!(inv.gpus.is_empty());
        let inv = inventory_from(&GpuSpec::All, Ok(listing()), Some("0,0"));
        assert_eq!(indices(&inv), [0]);
        let inv = inventory_from(&GpuSpec::All, Ok(listing()), Some(""));
        assert!(inv.gpus.is_empty());
        assert!(
            inventory_from(&GpuSpec::All, Ok(listing()), None)
                .gpus
                .len()
                == 4
        );
    }

    #[test]
    fn gpu_list_is_bounded_by_visible_devices() {
        let inv = inventory_from(&GpuSpec::List(vec![3, 1]), Ok(listing()), Some("1,2"));
        assert_eq!(indices(&inv), [1]);
        assert!(
            inv.note
                .as_deref()
                .unwrap()
                .contains("GPU 3 not present or hidden")
        );
        let inv = inventory_from(&GpuSpec::List(vec![3, 1]), Ok(listing()), None);
        assert_eq!(indices(&inv), [3, 1]);
    }

    #[test]
    fn no_library_is_zero_gpus_with_a_note() {
        let inv = inventory_from(&GpuSpec::All, Err(NvmlError::NoLibrary), Some("0"));
        assert!(inv.gpus.is_empty());
        assert_eq!(inv.source, InventorySource::None);
        assert_eq!(
            inv.note.as_deref(),
            Some("no NVML library (libnvidia-ml.so.1) on this machine: 0 GPUs detected")
        );
        let fake = inventory_from(&GpuSpec::Fake(2), Err(NvmlError::NoLibrary), None);
        assert_eq!(fake.gpus[1].visible_id(), "1");
    }

    #[test]
    fn spec_parsing() {
        assert_eq!("all".parse::<GpuSpec>(), Ok(GpuSpec::All));
        assert_eq!("none".parse::<GpuSpec>(), Ok(GpuSpec::None));
        assert_eq!("fake:3".parse::<GpuSpec>(), Ok(GpuSpec::Fake(3)));
        assert_eq!("0, 2".parse::<GpuSpec>(), Ok(GpuSpec::List(vec![0, 2])));
        assert!("fake:x".parse::<GpuSpec>().is_err());
        assert!("0,0".parse::<GpuSpec>().unwrap_err().contains("twice"));
        assert!(
            "gpu0"
                .parse::<GpuSpec>()
                .unwrap_err()
                .contains("not a GPU index")
        );
    }
}
