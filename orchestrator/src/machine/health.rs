//! GPU health around every attempt: what NVML says of a GPU before and after an attempt runs
//! on it (ECC counts, retired pages and remapped rows, throttle reasons, temperature, power,
//! performance state, PCIe replays, whether it still answers) and the Xid events it raised
//! meanwhile, and whether that amounts to a device fault — the hardware's failure, not the
//! code's. An attempt that did not pass on a GPU that faulted is `device-fault`
//! ([`crate::words::verdict::Verdict::DeviceFault`]).
//!
//! Fake GPUs read healthy unless `MEMRA_ORCH_FAKE_GPU_FAULTS` plants a fault ([`Planted`]),
//! so every path is tested without a GPU. This module reads and judges; it does not decide
//! verdicts (the executor does) or keep a GPU out of later cells (the runner does).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// A GPU as health readings name it: its index (as in CUDA_VISIBLE_DEVICES) and UUID
/// (`GPU-fake-N` for a fake one).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuRef {
    pub index: u32,
    pub uuid: String,
}

/// The variable that plants faults on fake GPUs (see [`Planted::parse`]).
pub const FAKE_FAULTS_ENV: &str = "MEMRA_ORCH_FAKE_GPU_FAULTS";

/// One look at a GPU. A reading NVML does not support on this GPU is absent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct Reading {
    /// The GPU answered NVML (false: it fell off the bus, or the driver lost it).
    pub answers: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ecc_volatile_corrected: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ecc_volatile_uncorrected: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ecc_aggregate_corrected: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ecc_aggregate_uncorrected: Option<u64>,
    /// Pages retired for multiple single-bit errors / for a double-bit error.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retired_pages_single_bit: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retired_pages_double_bit: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pending_retirement: Option<bool>,
    /// Row remapping (Ampere and later).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remapped_rows_correctable: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remapped_rows_uncorrectable: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remap_pending: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remap_failed: Option<bool>,
    /// Why the clocks are held down now (NVML's names, e.g. `HW_SLOWDOWN`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub throttle: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature_c: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub power_mw: Option<u32>,
    /// `P0` (fastest) to `P15`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pstate: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pcie_replays: Option<u64>,
}

impl Reading {
    /// A GPU that answers and reports nothing wrong (what a fake GPU reads).
    pub fn healthy() -> Reading {
        Reading {
            answers: true,
            ecc_volatile_corrected: Some(0),
            ecc_volatile_uncorrected: Some(0),
            ecc_aggregate_corrected: Some(0),
            ecc_aggregate_uncorrected: Some(0),
            retired_pages_single_bit: Some(0),
            retired_pages_double_bit: Some(0),
            pending_retirement: Some(false),
            pstate: Some("P0".to_string()),
            ..Reading::default()
        }
    }

    /// What marks a GPU as unfit for exactness gates whatever any attempt did: a page
    /// pending retirement, a row remap pending or failed, an uncorrected ECC error since the
    /// driver loaded, or no answer. `None` when there is nothing.
    pub fn standing_fault(&self) -> Option<String> {
        let mut why = Vec::new();
        if !self.answers {
            why.push("it does not answer (fell off the bus?)".to_string());
        }
        if self.pending_retirement == Some(true) {
            why.push("a page is pending retirement (reset the GPU)".to_string());
        }
        if self.remap_pending == Some(true) {
            why.push("a row remap is pending (reset the GPU)".to_string());
        }
        if self.remap_failed == Some(true) {
            why.push("a row remap failed".to_string());
        }
        if let Some(n) = self.ecc_volatile_uncorrected.filter(|n| *n > 0) {
            why.push(format!(
                "{n} uncorrected ECC errors since the driver loaded"
            ));
        }
        (!why.is_empty()).then(|| why.join("; "))
    }
}

/// The health of one GPU over one attempt, as the receipt records it (`gpu_health`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AttemptHealth {
    /// The GPU's index (as in CUDA_VISIBLE_DEVICES / `memra-orch gpus`) and UUID.
    pub gpu: u32,
    pub uuid: String,
    pub before: Reading,
    pub after: Reading,
    /// Xid errors the GPU raised during the attempt.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub xids: Vec<u64>,
    /// What of it is a device fault ([`fault`]); absent when none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fault: Option<String>,
}

/// Xids an application causes on a healthy GPU (its own illegal access, an exception in its
/// kernel, its own hang): evidence about the code under test, not the hardware. NVIDIA's
/// Xid catalogue: 13 graphics engine exception, 31 GPU memory page fault, 43 GPU stopped
/// processing, 45 preemptive cleanup, 68 NVDEC exception, 69 graphics engine class error.
pub const APPLICATION_XIDS: &[u64] = &[13, 31, 43, 45, 68, 69];

/// What of a GPU's readings around an attempt is a device fault: it stopped answering, new
/// uncorrected ECC errors, a page pending retirement or a row remap pending or failed, more
/// rows remapped for uncorrectable errors, or an Xid other than an application's own.
pub fn fault(before: &Reading, after: &Reading, xids: &[u64]) -> Option<String> {
    let mut why = Vec::new();
    if before.answers && !after.answers {
        why.push("the GPU stopped answering (fell off the bus, or the driver lost it)".to_string());
    }
    let grew = |a: Option<u64>, b: Option<u64>| match (a, b) {
        (Some(a), Some(b)) if b > a => Some(b - a),
        _ => None,
    };
    if let Some(n) = grew(
        before.ecc_volatile_uncorrected,
        after.ecc_volatile_uncorrected,
    )
    .or_else(|| {
        grew(
            before.ecc_aggregate_uncorrected,
            after.ecc_aggregate_uncorrected,
        )
    }) {
        why.push(format!("{n} new uncorrected ECC error{}", plural(n)));
    }
    if after.pending_retirement == Some(true) {
        why.push("a page is pending retirement".to_string());
    }
    if after.remap_pending == Some(true) || after.remap_failed == Some(true) {
        why.push("a row remap is pending or failed".to_string());
    }
    if let Some(n) = grew(
        before.remapped_rows_uncorrectable.map(u64::from),
        after.remapped_rows_uncorrectable.map(u64::from),
    ) {
        why.push(format!(
            "{n} more row{} remapped for uncorrectable errors",
            plural(n)
        ));
    }
    let hardware: Vec<String> = xids
        .iter()
        .filter(|x| !APPLICATION_XIDS.contains(x))
        .map(u64::to_string)
        .collect();
    if !hardware.is_empty() {
        why.push(format!("Xid {}", hardware.join(", ")));
    }
    (!why.is_empty()).then(|| why.join("; "))
}

/// One line of what changed on a GPU over an attempt, for `show`: the fault first, then
/// every reading that differs (`temperature_c 41 → 63`), or that nothing did. Raw text: the
/// caller escapes it for the terminal.
pub fn changes(h: &AttemptHealth) -> String {
    let mut parts = Vec::new();
    if let Some(f) = &h.fault {
        parts.push(format!("DEVICE FAULT: {f}"));
    }
    if !h.xids.is_empty() {
        let x: Vec<String> = h.xids.iter().map(u64::to_string).collect();
        parts.push(format!("xids {}", x.join(",")));
    }
    let (Ok(serde_json::Value::Object(b)), Ok(serde_json::Value::Object(a))) = (
        serde_json::to_value(&h.before),
        serde_json::to_value(&h.after),
    ) else {
        return format!("gpu {}: unreadable", h.gpu);
    };
    let keys: std::collections::BTreeSet<&String> = b.keys().chain(a.keys()).collect();
    for k in keys {
        let (x, y) = (b.get(k), a.get(k));
        if x != y {
            let show = |v: Option<&serde_json::Value>| v.map_or("-".to_string(), |v| v.to_string());
            parts.push(format!("{k} {} → {}", show(x), show(y)));
        }
    }
    if parts.is_empty() {
        parts.push("no change".to_string());
    }
    format!("gpu {} {}: {}", h.gpu, h.uuid, parts.join("; "))
}

fn plural(n: u64) -> &'static str {
    if n == 1 { "" } else { "s" }
}

/// A fault planted on a fake GPU by [`FAKE_FAULTS_ENV`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Planted {
    /// The fake GPU's index.
    pub gpu: u32,
    /// Only attempts of cells whose id matches this glob (all when absent).
    pub cell: Option<String>,
    /// Only this attempt number of each matching cell (all when absent).
    pub attempt: Option<u32>,
    pub fault: PlantedFault,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PlantedFault {
    Xid(u64),
    EccUncorrected,
    Lost,
    PendingRetirement,
}

impl Planted {
    /// Parses `gpu=0,fault=xid:79[,cell=GLOB][,attempt=N]`, several separated by `;`.
    /// Faults: `xid:N`, `ecc-uncorrected`, `lost`, `pending-retirement`.
    pub fn parse(text: &str) -> Result<Vec<Planted>, String> {
        let mut out = Vec::new();
        for entry in text.split(';').map(str::trim).filter(|e| !e.is_empty()) {
            let mut fields: BTreeMap<&str, &str> = BTreeMap::new();
            for kv in entry.split(',') {
                let (k, v) = kv.split_once('=').ok_or_else(|| {
                    format!(
                        "{FAKE_FAULTS_ENV}: `{kv}` is not KEY=VALUE (in `{entry}`); write e.g. \
                         `gpu=0,fault=xid:79`"
                    )
                })?;
                if fields.insert(k.trim(), v.trim()).is_some() {
                    return Err(format!(
                        "{FAKE_FAULTS_ENV}: `{entry}` gives `{}` twice; give each key once",
                        k.trim()
                    ));
                }
            }
            let bad = |what: &str| {
                format!(
                    "{FAKE_FAULTS_ENV}: `{entry}`: {what}; write e.g. `gpu=0,fault=xid:79,cell=decode*,attempt=1` \
                     (faults: xid:N, ecc-uncorrected, lost, pending-retirement)"
                )
            };
            let gpu = fields
                .get("gpu")
                .and_then(|g| g.parse().ok())
                .ok_or_else(|| bad("no `gpu=N`"))?;
            let fault = match fields.get("fault").copied() {
                Some("ecc-uncorrected") => PlantedFault::EccUncorrected,
                Some("lost") => PlantedFault::Lost,
                Some("pending-retirement") => PlantedFault::PendingRetirement,
                Some(f) => match f.strip_prefix("xid:").and_then(|x| x.parse().ok()) {
                    Some(0) => return Err(bad("Xid 0 is no Xid")),
                    Some(x) => PlantedFault::Xid(x),
                    None => return Err(bad(&format!("unknown fault `{f}`"))),
                },
                None => return Err(bad("no `fault=…`")),
            };
            let attempt = match fields.get("attempt") {
                Some(a) => match a.parse::<u32>() {
                    Ok(n) if n >= 1 => Some(n),
                    _ => return Err(bad("`attempt` is an attempt number, 1 or more")),
                },
                None => None,
            };
            if let Some(c) = fields.get("cell")
                && (c.is_empty() || globset::Glob::new(c).is_err())
            {
                return Err(bad(&format!("`cell={c}` is not a glob of cell ids")));
            }
            if let Some(k) = fields
                .keys()
                .find(|k| !["gpu", "fault", "cell", "attempt"].contains(k))
            {
                return Err(bad(&format!("unknown key `{k}`")));
            }
            out.push(Planted {
                gpu,
                cell: fields.get("cell").map(|c| c.to_string()),
                attempt,
                fault,
            });
        }
        Ok(out)
    }

    fn applies(&self, gpu: u32, cell: &str, attempt: u32) -> bool {
        self.gpu == gpu
            && self.attempt.is_none_or(|a| a == attempt)
            && self.cell.as_deref().is_none_or(|g| {
                globset::Glob::new(g).is_ok_and(|p| p.compile_matcher().is_match(cell))
            })
    }
}

/// Where readings come from for a run: NVML for real GPUs, the planted faults for fake
/// ones. Made once per run (NVML is initialised once).
pub struct Monitor {
    planted: Vec<Planted>,
    nvml: Option<nvml_wrapper::Nvml>,
}

impl std::fmt::Debug for Monitor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Monitor")
            .field("planted", &self.planted)
            .field("nvml", &self.nvml.is_some())
            .finish()
    }
}

impl Monitor {
    /// The monitor of this process, with the faults planted by [`FAKE_FAULTS_ENV`] (read
    /// once, here) and no NVML yet ([`Monitor::with_nvml`]).
    pub fn new() -> Result<Monitor, String> {
        let planted = match std::env::var(FAKE_FAULTS_ENV) {
            Ok(t) => Planted::parse(&t)?,
            Err(_) => Vec::new(),
        };
        Ok(Monitor {
            planted,
            nvml: None,
        })
    }

    /// The same monitor reading real GPUs through NVML (when it loads).
    pub fn with_nvml(mut self) -> Monitor {
        self.nvml = nvml_wrapper::Nvml::init().ok();
        self
    }

    /// Checks that every planted fault names one of `fake` (the indices of the run's fake
    /// GPUs): a fault planted on a GPU the run does not have would silently plant nothing.
    pub fn check_planted(&self, fake: &[u32]) -> Result<(), String> {
        match self.planted.iter().find(|p| !fake.contains(&p.gpu)) {
            None => Ok(()),
            Some(p) if fake.is_empty() => Err(format!(
                "{FAKE_FAULTS_ENV} plants a fault on gpu {}, but only fake GPUs take planted \
                 faults and this run has none; run with --gpus fake:N or unset it",
                p.gpu
            )),
            Some(p) => Err(format!(
                "{FAKE_FAULTS_ENV} plants a fault on gpu {}, which this run does not have (its \
                 fake GPUs: {}); name one of them",
                p.gpu,
                fake.iter()
                    .map(u32::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            )),
        }
    }

    /// A monitor with these planted faults and no NVML (tests).
    pub fn fake(planted: Vec<Planted>) -> Monitor {
        Monitor {
            planted,
            nvml: None,
        }
    }

    /// Reads a GPU now. A real GPU NVML cannot open reads as not answering.
    pub fn read(&self, gpu: &GpuRef) -> Reading {
        if is_fake(gpu) {
            return Reading::healthy();
        }
        let Some(nvml) = &self.nvml else {
            return Reading::default();
        };
        match nvml.device_by_uuid(gpu.uuid.as_str()) {
            Ok(dev) => read_device(nvml, &dev),
            Err(_) => Reading::default(),
        }
    }

    /// Reads a GPU outside any attempt (`gpus --health`): for a fake GPU, the planted
    /// faults that name no cell and no attempt stand (a GPU marked unfit at rest).
    pub fn read_at_rest(&self, gpu: &GpuRef) -> Reading {
        let mut r = self.read(gpu);
        if is_fake(gpu) {
            for p in self
                .planted
                .iter()
                .filter(|p| p.gpu == gpu.index && p.cell.is_none() && p.attempt.is_none())
            {
                apply(p.fault, &mut r, &mut Vec::new());
            }
        }
        r
    }

    /// Starts watching `gpus` for an attempt of `cell`: reads them and starts collecting
    /// their Xid events. Call [`Watch::finish`] when the attempt ends, on the same thread.
    pub fn watch<'m>(&'m self, gpus: &[GpuRef], cell: &str, attempt: u32) -> Watch<'m> {
        let events = self
            .nvml
            .as_ref()
            .filter(|_| gpus.iter().any(|g| !is_fake(g)))
            .and_then(|nvml| {
                use nvml_wrapper::bitmasks::event::EventTypes;
                let mut set = nvml.create_event_set().ok()?;
                for g in gpus.iter().filter(|g| !is_fake(g)) {
                    if let Ok(dev) = nvml.device_by_uuid(g.uuid.as_str()) {
                        // A GPU that cannot report Xids is read before and after all the
                        // same; the set stays usable for the others.
                        match dev.register_events(EventTypes::CRITICAL_XID_ERROR, set) {
                            Ok(s) => set = s,
                            Err(_) => set = nvml.create_event_set().ok()?,
                        }
                    }
                }
                Some(set)
            });
        Watch {
            monitor: self,
            gpus: gpus.to_vec(),
            cell: cell.to_string(),
            attempt,
            before: gpus.iter().map(|g| self.read(g)).collect(),
            events,
        }
    }
}

fn is_fake(gpu: &GpuRef) -> bool {
    gpu.uuid.starts_with("GPU-fake-")
}

/// A watch over the GPUs of one attempt.
pub struct Watch<'m> {
    monitor: &'m Monitor,
    gpus: Vec<GpuRef>,
    cell: String,
    attempt: u32,
    before: Vec<Reading>,
    events: Option<nvml_wrapper::EventSet<'m>>,
}

impl Watch<'_> {
    /// Reads the GPUs again and collects the Xids raised since [`Monitor::watch`].
    pub fn finish(self) -> Vec<AttemptHealth> {
        let mut xids: BTreeMap<String, Vec<u64>> = BTreeMap::new();
        if let Some(set) = &self.events {
            use nvml_wrapper::enums::event::XidError;
            // Queued events come at once; the first empty wait ends the drain (bounded, in
            // case a storm of events keeps coming).
            for _ in 0..1000 {
                let Ok(e) = set.wait(0) else { break };
                if let (Ok(uuid), Some(XidError::Value(x))) = (e.device.uuid(), e.event_data) {
                    xids.entry(uuid).or_default().push(x);
                }
            }
        }
        self.gpus
            .iter()
            .zip(self.before)
            .map(|(g, before)| {
                let mut after = self.monitor.read(g);
                let mut seen = xids.remove(&g.uuid).unwrap_or_default();
                for p in self
                    .monitor
                    .planted
                    .iter()
                    .filter(|p| is_fake(g) && p.applies(g.index, &self.cell, self.attempt))
                {
                    apply(p.fault, &mut after, &mut seen);
                }
                let fault = fault(&before, &after, &seen);
                AttemptHealth {
                    gpu: g.index,
                    uuid: g.uuid.clone(),
                    before,
                    after,
                    xids: seen,
                    fault,
                }
            })
            .collect()
    }
}

/// What a planted fault does to a reading and the Xids seen.
fn apply(fault: PlantedFault, r: &mut Reading, xids: &mut Vec<u64>) {
    match fault {
        PlantedFault::Xid(x) => xids.push(x),
        PlantedFault::EccUncorrected => {
            r.ecc_volatile_uncorrected = Some(r.ecc_volatile_uncorrected.unwrap_or(0) + 1);
            r.ecc_aggregate_uncorrected = Some(r.ecc_aggregate_uncorrected.unwrap_or(0) + 1);
        }
        PlantedFault::Lost => *r = Reading::default(),
        PlantedFault::PendingRetirement => r.pending_retirement = Some(true),
    }
}

/// The `gpus --health` table: one block per GPU, its readings, and `UNFIT` with why when
/// [`Reading::standing_fault`] finds anything.
pub fn render(rows: &[(GpuRef, String, Reading)]) -> String {
    use std::fmt::Write;
    let mut out = String::from("health:\n");
    let opt = |v: Option<u64>| v.map_or("-".to_string(), |v| v.to_string());
    let flag = |v: Option<bool>| {
        v.map_or("-".to_string(), |v| {
            if v { "yes" } else { "no" }.to_string()
        })
    };
    for (g, name, r) in rows {
        let status = match r.standing_fault() {
            Some(why) => format!("UNFIT: {why}; leave it out with --exclude-gpu {}", g.uuid),
            None if !r.answers => "no readings (NVML cannot open it)".to_string(),
            None => "ok".to_string(),
        };
        let _ = writeln!(out, "  gpu {} {} {name}: {status}", g.index, g.uuid);
        let _ = writeln!(
            out,
            "    ecc uncorrected {} volatile / {} aggregate, corrected {} / {}; retired pages {} single-bit, {} double-bit, pending {}",
            opt(r.ecc_volatile_uncorrected),
            opt(r.ecc_aggregate_uncorrected),
            opt(r.ecc_volatile_corrected),
            opt(r.ecc_aggregate_corrected),
            opt(r.retired_pages_single_bit),
            opt(r.retired_pages_double_bit),
            flag(r.pending_retirement),
        );
        let _ = writeln!(
            out,
            "    remapped rows {} correctable, {} uncorrectable, pending {}, failed {}; pcie replays {}",
            opt(r.remapped_rows_correctable.map(u64::from)),
            opt(r.remapped_rows_uncorrectable.map(u64::from)),
            flag(r.remap_pending),
            flag(r.remap_failed),
            opt(r.pcie_replays),
        );
        let _ = writeln!(
            out,
            "    {} °C, {} mW, {}, throttle: {}",
            opt(r.temperature_c.map(u64::from)),
            opt(r.power_mw.map(u64::from)),
            r.pstate.as_deref().unwrap_or("-"),
            if r.throttle.is_empty() {
                "none".to_string()
            } else {
                r.throttle.join(", ")
            }
        );
    }
    out
}

/// Everything NVML tells of one device; what it does not support stays absent.
fn read_device(nvml: &nvml_wrapper::Nvml, dev: &nvml_wrapper::Device<'_>) -> Reading {
    use nvml_wrapper::enum_wrappers::device::{
        EccCounter, MemoryError, RetirementCause, TemperatureSensor,
    };
    let ecc = |e, c| dev.total_ecc_errors(e, c).ok();
    // A lost GPU fails even the simplest query.
    let answers = !matches!(
        dev.name(),
        Err(nvml_wrapper::error::NvmlError::GpuLost) | Err(nvml_wrapper::error::NvmlError::Unknown)
    );
    let (remapped_rows_correctable, remapped_rows_uncorrectable, remap_pending, remap_failed) =
        remapped_rows(nvml, dev);
    Reading {
        answers,
        ecc_volatile_corrected: ecc(MemoryError::Corrected, EccCounter::Volatile),
        ecc_volatile_uncorrected: ecc(MemoryError::Uncorrected, EccCounter::Volatile),
        ecc_aggregate_corrected: ecc(MemoryError::Corrected, EccCounter::Aggregate),
        ecc_aggregate_uncorrected: ecc(MemoryError::Uncorrected, EccCounter::Aggregate),
        retired_pages_single_bit: dev
            .retired_pages(RetirementCause::MultipleSingleBitEccErrors)
            .ok()
            .map(|p| p.len() as u64),
        retired_pages_double_bit: dev
            .retired_pages(RetirementCause::DoubleBitEccError)
            .ok()
            .map(|p| p.len() as u64),
        pending_retirement: dev.are_pages_pending_retired().ok(),
        remapped_rows_correctable,
        remapped_rows_uncorrectable,
        remap_pending,
        remap_failed,
        throttle: dev
            .current_throttle_reasons()
            .map(|r| r.iter_names().map(|(n, _)| n.to_string()).collect())
            .unwrap_or_default(),
        temperature_c: dev.temperature(TemperatureSensor::Gpu).ok(),
        power_mw: dev.power_usage().ok(),
        pstate: dev
            .performance_state()
            .ok()
            .map(|p| format!("P{}", p.as_c())),
        pcie_replays: dev.pcie_replay_counter().ok().map(u64::from),
    }
}

/// Row remapping counts (nvmlDeviceGetRemappedRows, which the wrapper does not cover):
/// correctable, uncorrectable, pending, failed.
fn remapped_rows(
    nvml: &nvml_wrapper::Nvml,
    dev: &nvml_wrapper::Device<'_>,
) -> (Option<u32>, Option<u32>, Option<bool>, Option<bool>) {
    let Ok(sym) = nvml.lib().nvmlDeviceGetRemappedRows.as_ref() else {
        return (None, None, None, None);
    };
    let (mut corr, mut unc, mut pending, mut failed) = (0u32, 0u32, 0u32, 0u32);
    // SAFETY: a live device handle and four out-pointers to integers, as nvml.h declares.
    let r = unsafe { (*sym)(dev.handle(), &mut corr, &mut unc, &mut pending, &mut failed) };
    if r != 0 {
        return (None, None, None, None);
    }
    (Some(corr), Some(unc), Some(pending != 0), Some(failed != 0))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpu(i: u32) -> GpuRef {
        GpuRef {
            index: i,
            uuid: format!("GPU-fake-{i}"),
        }
    }

    #[test]
    fn application_xids_and_corrected_errors_are_no_device_fault() {
        let h = Reading::healthy();
        assert_eq!(fault(&h, &h, &[13, 31, 43]), None);
        let mut corrected = h.clone();
        corrected.ecc_volatile_corrected = Some(5);
        assert_eq!(fault(&h, &corrected, &[]), None);
        assert_eq!(fault(&h, &h, &[79, 13]).as_deref(), Some("Xid 79"));
        let mut ecc = h.clone();
        ecc.ecc_volatile_uncorrected = Some(2);
        assert_eq!(
            fault(&h, &ecc, &[]).as_deref(),
            Some("2 new uncorrected ECC errors")
        );
        assert!(
            fault(&h, &Reading::default(), &[])
                .unwrap()
                .contains("stopped answering")
        );
        // Unsupported readings (absent) are never taken for a change.
        assert_eq!(fault(&Reading::default(), &Reading::default(), &[]), None);
    }

    #[test]
    fn planted_faults_hit_only_their_gpu_cell_and_attempt() {
        let planted =
            Planted::parse("gpu=0,fault=xid:79,cell=decode*,attempt=1; gpu=1,fault=lost").unwrap();
        let m = Monitor::fake(planted);
        let gpus = [gpu(0)];
        let faulted = m.watch(&gpus, "decode[q=4]", 1).finish();
        assert_eq!(faulted[0].xids, [79]);
        assert_eq!(faulted[0].fault.as_deref(), Some("Xid 79"));
        assert_eq!(m.watch(&gpus, "decode[q=4]", 2).finish()[0].fault, None);
        assert_eq!(m.watch(&gpus, "prefill", 1).finish()[0].fault, None);
        let lost = m.watch(&[gpu(1)], "x", 7).finish();
        assert!(
            lost[0]
                .fault
                .as_deref()
                .unwrap()
                .contains("stopped answering")
        );
        for bad in [
            "gpu=0",
            "fault=lost",
            "gpu=x,fault=lost",
            "gpu=0,fault=melted",
            "gpu=0,fault=lost,when=now",
            "gpu",
        ] {
            let e = Planted::parse(bad).unwrap_err();
            assert!(
                e.contains(FAKE_FAULTS_ENV) && e.contains("write e.g."),
                "{bad}: {e}"
            );
        }
    }
}
