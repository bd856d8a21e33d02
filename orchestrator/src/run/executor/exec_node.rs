//! The hidden `memra-orch exec-node <job.json>` entry point: the compute-node half of a
//! cluster executor. It runs one serialised [`CellJob`] through the local executor on this
//! machine and writes the same `receipt.json` a local run writes. With `--gpus-from-env`
//! (what the Slurm executor's batch script passes) the cell's GPUs are the ones the cluster
//! scheduler exported in CUDA_VISIBLE_DEVICES, not the ones in the job file.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use super::local::{DEFAULT_GRACE, LocalExecutor};
use super::{CellJob, Executor};
use crate::machine::gpus::GpuSpec;
use crate::receipt::GpuRef;
use crate::words::exit::ExitCode;

/// What one `exec-node` call runs.
#[derive(Debug, Clone)]
pub struct ExecNodeOptions {
    /// The JSON job file.
    pub job: PathBuf,
    /// Time between SIGTERM and SIGKILL when the cell times out or the job is cancelled.
    pub grace: Duration,
    /// Take the cell's GPUs from this process's CUDA_VISIBLE_DEVICES, not the job file.
    pub gpus_from_env: bool,
    /// Where to write the receipt (`None`: `receipt.json` in the job's node folder).
    pub receipt: Option<PathBuf>,
}

impl Default for ExecNodeOptions {
    fn default() -> ExecNodeOptions {
        ExecNodeOptions {
            job: PathBuf::new(),
            grace: DEFAULT_GRACE,
            gpus_from_env: false,
            receipt: None,
        }
    }
}

/// Runs one cell from a job file through the local executor, on whatever machine this is,
/// and writes `<node_dir>/receipt.json` (or the `receipt` path). SIGTERM, SIGINT or SIGHUP (a
/// cancelled cluster job) stops the cell's process groups and the receipt says
/// `cancelled`. Exit code 0 when the receipt was written (its verdict is in the file), 2
/// for an unreadable job file, 3 when the receipt could not be written.
pub fn exec_node(args: &ExecNodeOptions) -> ExitCode {
    let mut job: CellJob = match std::fs::read(&args.job)
        .map_err(|e| e.to_string())
        .and_then(|b| serde_json::from_slice(&b).map_err(|e| e.to_string()))
    {
        Ok(job) => job,
        Err(e) => {
            eprintln!(
                "memra-orch exec-node: {}: not a readable job file: {e}",
                args.job.display()
            );
            return ExitCode::Usage;
        }
    };
    if args.gpus_from_env {
        let cvd = std::env::var("CUDA_VISIBLE_DEVICES").ok();
        (job.visible_devices, job.gpus) = gpus_from_env(cvd.as_deref());
    }
    let interrupt = Arc::new(AtomicBool::new(false));
    for sig in super::process::cancel_signals() {
        if let Err(e) = signal_hook::flag::register(sig, Arc::clone(&interrupt)) {
            eprintln!("memra-orch exec-node: cannot install the signal handler: {e}");
            return ExitCode::Internal;
        }
    }
    let executor = Arc::new(LocalExecutor::new(args.grace, std::env::temp_dir()));
    let done = Arc::new(AtomicBool::new(false));
    // The executor blocks in the cell; a small thread turns a signal into a cancellation.
    let canceller = {
        let (executor, interrupt, done) = (
            Arc::clone(&executor),
            Arc::clone(&interrupt),
            Arc::clone(&done),
        );
        std::thread::spawn(move || {
            while !done.load(Ordering::SeqCst) {
                if interrupt.load(Ordering::SeqCst) {
                    executor.cancel_all();
                    return;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        })
    };
    let receipt = executor.execute(&job, &mut |_| {});
    done.store(true, Ordering::SeqCst);
    let _ = canceller.join();
    let path = args
        .receipt
        .clone()
        .unwrap_or_else(|| job.node_dir.join("receipt.json"));
    match crate::receipt::write_json(&path, &receipt) {
        Ok(()) => ExitCode::Ok,
        Err(e) => {
            eprintln!("memra-orch exec-node: {e}");
            ExitCode::Internal
        }
    }
}

/// The GPUs a cluster scheduler gave this job: CUDA_VISIBLE_DEVICES exactly as it was set
/// (the gate sees the same value) and, per device, the NVML record (UUID, name) when NVML
/// is present; without NVML a device is recorded by its id alone.
pub fn gpus_from_env(cvd: Option<&str>) -> (Vec<String>, Vec<GpuRef>) {
    let ids: Vec<String> = cvd
        .unwrap_or("")
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_string)
        .collect();
    if ids.is_empty() {
        return (ids, Vec::new());
    }
    let nvml = crate::machine::gpus::inventory_from(
        &GpuSpec::All,
        crate::machine::gpus::nvml_listing(),
        cvd,
    );
    let refs = if nvml.gpus.len() == ids.len() {
        nvml.gpus
            .iter()
            .map(|g| GpuRef {
                index: g.index,
                uuid: g.uuid.clone(),
                name: g.name.clone(),
            })
            .collect()
    } else {
        ids.iter()
            .enumerate()
            .map(|(i, id)| GpuRef {
                index: id.parse().unwrap_or(i as u32),
                uuid: if id.starts_with("GPU-") {
                    id.clone()
                } else {
                    String::new()
                },
                name: "unknown (no NVML in the job)".to_string(),
            })
            .collect()
    };
    (ids, refs)
}

#[cfg(test)]
mod tests {
    use super::gpus_from_env;

    #[test]
    fn gpus_come_from_cuda_visible_devices_as_the_scheduler_set_it() {
        assert_eq!(gpus_from_env(None), (vec![], vec![]));
        assert_eq!(gpus_from_env(Some("")), (vec![], vec![]));
        // Ids no NVML device has (or no NVML at all): recorded by id, in export order.
        let (ids, refs) = gpus_from_env(Some("97,95"));
        assert_eq!(ids, ["97", "95"]);
        assert_eq!(refs.iter().map(|g| g.index).collect::<Vec<_>>(), [97, 95]);
        assert!(refs.iter().all(|g| g.uuid.is_empty()));
        let (ids, refs) = gpus_from_env(Some("GPU-0000dead-beef"));
        assert_eq!(ids, ["GPU-0000dead-beef"]);
        assert_eq!(refs[0].uuid, "GPU-0000dead-beef");
    }
}
