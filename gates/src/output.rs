//! The engine's side of the gate protocol (DESIGN §5): the report every gate prints (its
//! header with the doors in force, one line per check, the verdict line), the doors row
//! built from the engine's [`DoorsReport`], logit dumps into `MEMRA_ORCH_ARTIFACTS`, and the
//! exit codes, with "could not run" added to the protocol's pass and fail.
//!
//! The rows and the checks-file writer are `memra-protocol`'s; what a check compares belongs
//! to each gate, and the orchestrator's side (judging an attempt) lives in `memra-orch`.

use std::path::{Path, PathBuf};

use memra_protocol::{Check, ChecksWriter, EXIT_FAIL, EXIT_PASS};
use serde_json::Value;

use memra_engine::doors::{Doors, DoorsReport};

/// Prints one line of the report. A closed stdout (a pager or `head` that quit) must not
/// turn a verdict into a crash, so write errors are ignored: the exit status and the check
/// rows still carry the result.
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout(), $($arg)*);
    }};
}
pub(crate) use say;

/// Exit status of a gate: 0 every check passed, 1 a check failed (the protocol's codes), 2
/// the gate could not run (bad flags, unreadable model, unwritable output), which the
/// orchestrator judges a crash.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(i32)]
pub enum GateExit {
    Pass = EXIT_PASS,
    Fail = EXIT_FAIL,
    Usage = 2,
}

/// A gate binary's `main`: parses `A` from the process arguments (clap prints its own
/// usage errors and help, with its exit code), runs `run`, and turns a setup error into
/// `gate: message` on stderr and exit 2.
pub fn gate_main<A: clap::Parser>(
    gate: &str,
    run: impl FnOnce(&A) -> Result<GateExit, GateError>,
) -> i32 {
    let args = match A::try_parse() {
        Ok(a) => a,
        Err(e) => {
            let _ = e.print();
            return e.exit_code();
        }
    };
    match run(&args) {
        Ok(exit) => exit as i32,
        Err(e) => {
            eprintln!("{gate}: {e}");
            GateExit::Usage as i32
        }
    }
}

/// The gate's model, or the setup error that names the file and the fix.
pub fn open_model(path: &std::path::Path) -> Result<memra_engine::model::LlamaModel, GateError> {
    memra_engine::model::LlamaModel::open(path).map_err(|e| {
        GateError::new(format!(
            "cannot load the model {}: {e}; pass a llama GGUF checkpoint (memra-engine synth \
             writes one)",
            path.display()
        ))
    })
}

/// Why a gate could not run at all (exit 2). The message names the file or value, the
/// problem and the fix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct GateError(pub String);

impl GateError {
    pub fn new(msg: impl Into<String>) -> GateError {
        GateError(msg.into())
    }
}

/// Prints a gate's report and speaks the protocol when the orchestrator asks for it.
///
/// The `MEMRA_ORCH_*` variables are read once, at construction. Unset, the gate prints its
/// report and writes nothing.
pub struct Reporter {
    gate: &'static str,
    checks: ChecksWriter,
    artifacts: Option<PathBuf>,
}

impl Reporter {
    /// Reads `MEMRA_ORCH_CHECKS` and `MEMRA_ORCH_ARTIFACTS` from the environment.
    pub fn from_env(gate: &'static str) -> Reporter {
        Reporter {
            gate,
            checks: ChecksWriter::from_env(),
            artifacts: memra_protocol::artifacts_dir(),
        }
    }

    pub fn new(gate: &'static str, checks: Option<PathBuf>, artifacts: Option<PathBuf>) -> Self {
        Reporter {
            gate,
            checks: ChecksWriter::new(checks),
            artifacts,
        }
    }

    /// Prints the header (the doors in force, the gate's own settings) and writes the
    /// `{"doors":…}` row: the backend's report plus `extra` (gate settings such as the
    /// planted defect), so a pin that did nothing is visible.
    pub fn header(
        &mut self,
        report: &DoorsReport,
        doors: &Doors,
        extra: &[(&str, Value)],
    ) -> Result<(), GateError> {
        let mut row = report.doors_row();
        row.insert("pp_allow_unsplit_batch", doors.pp_allow_unsplit_batch);
        row.insert(
            "defect",
            doors.gate_defect.map(|d| d.as_str()).unwrap_or("none"),
        );
        for (k, v) in extra {
            row.insert(k, v.clone());
        }
        say!("== {} ==", self.gate);
        let line = row
            .values
            .iter()
            .map(|(k, v)| match v {
                Value::String(s) => format!("{k}={s}"),
                other => format!("{k}={other}"),
            })
            .collect::<Vec<_>>()
            .join(" ");
        say!("doors: {line}");
        if let Some(d) = doors.gate_defect {
            say!(
                "WARNING: MEMRA_GATE_DEFECT={} plants a test-only defect; this run proves \
                 nothing about the engine",
                d.as_str()
            );
        }
        if doors.gate_canary {
            say!("WARNING: MEMRA_GATE_CANARY=1 feeds wrong tokens; this gate must FAIL");
        }
        self.checks.doors(&row).map_err(append_error)
    }

    /// Prints one check and appends its row. The engine's gates list metrics in key order,
    /// printed and written alike, whatever order a check was built in.
    pub fn check(&mut self, check: &Check) -> Result<(), GateError> {
        let mut check = check.clone();
        check.metrics.sort_keys();
        let metrics = check
            .metrics
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(" ");
        say!(
            "{:<5} {:<22} {metrics}",
            check.status.as_str().to_uppercase(),
            check.name
        );
        if !check.message.is_empty() {
            say!("      {}", check.message);
        }
        if let Some(m) = &check.first_mismatch {
            say!("      first mismatch: {m}");
        }
        self.checks.check(&check).map_err(append_error)
    }

    /// Number of failed checks so far.
    pub fn failures(&self) -> usize {
        self.checks.failures()
    }

    /// Prints the verdict line and returns the exit status.
    pub fn finish(&self) -> GateExit {
        if self.failures() == 0 {
            say!("ALL GREEN: {}", self.gate);
            GateExit::Pass
        } else {
            say!("FAIL: {} ({} failed checks)", self.gate, self.failures());
            GateExit::Fail
        }
    }

    /// Whether logit dumps are wanted (`MEMRA_ORCH_ARTIFACTS` set).
    pub fn wants_artifacts(&self) -> bool {
        self.artifacts.is_some()
    }

    /// Writes `tensors` (name, `[rows, cols]`, row-major f32 data) as the safetensors file
    /// `file` in the artifacts folder; does nothing when no folder was given.
    pub fn artifact(
        &self,
        file: &str,
        tensors: &[(String, [usize; 2], &[f32])],
    ) -> Result<(), GateError> {
        let Some(dir) = &self.artifacts else {
            return Ok(());
        };
        write_safetensors(&dir.join(file), tensors)
    }
}

/// An unwritable checks file stops the gate (exit 2): the orchestrator would see no rows.
fn append_error(e: memra_protocol::AppendError) -> GateError {
    GateError::new(e.to_string())
}

/// Writes F32 tensors as one safetensors file.
pub fn write_safetensors(
    path: &Path,
    tensors: &[(String, [usize; 2], &[f32])],
) -> Result<(), GateError> {
    use safetensors::tensor::{Dtype, TensorView};
    let bytes: Vec<Vec<u8>> = tensors
        .iter()
        .map(|(_, _, data)| data.iter().flat_map(|v| v.to_le_bytes()).collect())
        .collect();
    let views = tensors
        .iter()
        .zip(&bytes)
        .map(|((name, shape, _), b)| {
            TensorView::new(Dtype::F32, shape.to_vec(), b)
                .map(|v| (name.clone(), v))
                .map_err(|e| GateError::new(format!("tensor {name} of {}: {e}", path.display())))
        })
        .collect::<Result<Vec<_>, _>>()?;
    safetensors::serialize_to_file(views, None, path).map_err(|e| {
        GateError::new(format!(
            "{}: cannot write the safetensors file: {e}; MEMRA_ORCH_ARTIFACTS must name a \
             writable folder",
            path.display()
        ))
    })
}

#[cfg(test)]
mod tests {
    use memra_protocol::Status;
    use serde_json::json;

    use super::*;

    #[test]
    fn reporter_appends_rows_and_dumps_artifacts() {
        let dir = tempfile::tempdir().unwrap();
        let checks = dir.path().join("checks.jsonl");
        let mut r = Reporter::new("t", Some(checks.clone()), Some(dir.path().to_path_buf()));
        let be = memra_engine::doors::Doors::default();
        let report = DoorsReport {
            backend: "cpu",
            matvec: "mmvq",
            norm: "fused",
            attention: "split-k",
            b1fast: false,
            kv: "f32",
            pp_stages: 1,
            pp_devices: "cpu".into(),
            pp_splits: "0".into(),
            gate_seed: 0,
            canary: false,
            tuning: Default::default(),
        };
        r.header(&report, &be, &[("mode", json!("config"))])
            .unwrap();
        r.check(&Check::new("a", Status::Pass, "")).unwrap();
        r.check(&Check::new("b", Status::Fail, "bad")).unwrap();
        assert_eq!(r.finish(), GateExit::Fail);
        let text = std::fs::read_to_string(&checks).unwrap();
        let rows: Vec<Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(rows.len(), 3);
        assert_eq!(rows[0]["doors"]["mode"], "config");
        assert_eq!(rows[0]["doors"]["defect"], "none");
        assert_eq!(rows[2]["status"], "fail");
        let data = [1.0f32, 2.0, 3.0, 4.0];
        r.artifact("x.safetensors", &[("step.0".into(), [2, 2], &data)])
            .unwrap();
        let bytes = std::fs::read(dir.path().join("x.safetensors")).unwrap();
        let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
        assert_eq!(st.tensor("step.0").unwrap().shape(), &[2, 2]);
    }
}
