//! The gate side of the gate protocol (DESIGN §5): the header every gate prints, the
//! `{"doors":…}` row and the check rows appended to `MEMRA_ORCH_CHECKS`, logit dumps into
//! `MEMRA_ORCH_ARTIFACTS`, and the exit codes.
//!
//! It owns the wire format only. What a check compares belongs to each gate; the orchestrator
//! side (reading the rows, judging an attempt) lives in `memra-orch`.

use std::collections::BTreeMap;
use std::fs::OpenOptions;
use std::io::Write;
use std::path::{Path, PathBuf};

use serde_json::{Value, json};

use crate::doors::{Doors, DoorsReport};

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

/// Exit status of a gate: 0 every check passed, 1 a check failed, 2 the gate could not run
/// (bad flags, unreadable model, unwritable output).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GateExit {
    Pass = 0,
    Fail = 1,
    Usage = 2,
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

/// A check's status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    Pass,
    Fail,
    Warn,
    Skip,
}

impl Status {
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Pass => "pass",
            Status::Fail => "fail",
            Status::Warn => "warn",
            Status::Skip => "skip",
        }
    }
}

/// The first value that differed: at decode `step` (absent for prompt programs), batch or
/// program `row`, vocabulary `index`, reference and candidate values.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Mismatch {
    pub step: Option<usize>,
    pub row: usize,
    pub index: usize,
    pub reference: f64,
    pub got: f64,
}

impl Mismatch {
    pub fn to_json(&self) -> Value {
        let mut m = serde_json::Map::new();
        if let Some(step) = self.step {
            m.insert("step".into(), json!(step));
        }
        m.insert("row".into(), json!(self.row));
        m.insert("index".into(), json!(self.index));
        m.insert("ref".into(), finite_or_text(self.reference));
        m.insert("got".into(), finite_or_text(self.got));
        Value::Object(m)
    }
}

impl std::fmt::Display for Mismatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if let Some(step) = self.step {
            write!(f, "step {step}, ")?;
        }
        write!(
            f,
            "row {}, index {}: ref {} got {}",
            self.row, self.index, self.reference, self.got
        )
    }
}

/// JSON has no NaN or infinity; those are written as text so the row stays valid.
fn finite_or_text(v: f64) -> Value {
    if v.is_finite() {
        json!(v)
    } else {
        json!(v.to_string())
    }
}

/// One check row.
#[derive(Debug, Clone, PartialEq)]
pub struct Check {
    pub name: String,
    pub status: Status,
    pub metrics: BTreeMap<String, Value>,
    pub message: String,
    pub first_mismatch: Option<Mismatch>,
}

impl Check {
    pub fn new(name: impl Into<String>, status: Status, message: impl Into<String>) -> Check {
        Check {
            name: name.into(),
            status,
            metrics: BTreeMap::new(),
            message: message.into(),
            first_mismatch: None,
        }
    }

    pub fn metric(mut self, key: &str, value: impl Into<Value>) -> Check {
        self.metrics.insert(key.to_string(), value.into());
        self
    }

    pub fn to_json(&self) -> Value {
        let mut row = json!({
            "check": self.name,
            "status": self.status.as_str(),
            "metrics": self.metrics,
            "message": self.message,
        });
        if let Some(m) = &self.first_mismatch {
            row["first_mismatch"] = m.to_json();
        }
        row
    }
}

/// Prints a gate's report and speaks the protocol when the orchestrator asks for it.
///
/// The `MEMRA_ORCH_*` variables are read once, at construction. Unset, the gate prints its
/// report and writes nothing.
pub struct Reporter {
    gate: &'static str,
    checks_path: Option<PathBuf>,
    artifacts: Option<PathBuf>,
    failures: usize,
}

impl Reporter {
    /// Reads `MEMRA_ORCH_CHECKS` and `MEMRA_ORCH_ARTIFACTS` from the environment.
    pub fn from_env(gate: &'static str) -> Reporter {
        let var = |name: &str| {
            std::env::var_os(name)
                .filter(|v| !v.is_empty())
                .map(PathBuf::from)
        };
        Reporter::new(gate, var("MEMRA_ORCH_CHECKS"), var("MEMRA_ORCH_ARTIFACTS"))
    }

    pub fn new(gate: &'static str, checks: Option<PathBuf>, artifacts: Option<PathBuf>) -> Self {
        Reporter {
            gate,
            checks_path: checks,
            artifacts,
            failures: 0,
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
        let mut obj = report.to_json();
        obj["pp_allow_unsplit_batch"] = json!(doors.pp_allow_unsplit_batch);
        obj["defect"] = json!(doors.gate_defect.map(|d| d.as_str()).unwrap_or("none"));
        for (k, v) in extra {
            obj[*k] = v.clone();
        }
        say!("== {} ==", self.gate);
        if let Value::Object(map) = &obj {
            let line = map
                .iter()
                .map(|(k, v)| match v {
                    Value::String(s) => format!("{k}={s}"),
                    other => format!("{k}={other}"),
                })
                .collect::<Vec<_>>()
                .join(" ");
            say!("doors: {line}");
        }
        if let Some(d) = doors.gate_defect {
            say!(
                "WARNING: MEMRA_GATE_DEFECT={} plants a test-only defect; this run proves \
                 nothing about the engine",
                d.as_str()
            );
        }
        if doors.gate_canary {
            say!("WARNING: MEMRA_GATE_CANARY=1 feeds one wrong token; this gate must FAIL");
        }
        self.append(&json!({ "doors": obj }))
    }

    /// Prints one check and appends its row.
    pub fn check(&mut self, check: &Check) -> Result<(), GateError> {
        if check.status == Status::Fail {
            self.failures += 1;
        }
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
        self.append(&check.to_json())
    }

    /// Number of failed checks so far.
    pub fn failures(&self) -> usize {
        self.failures
    }

    /// Prints the verdict line and returns the exit status.
    pub fn finish(&self) -> GateExit {
        if self.failures == 0 {
            say!("ALL GREEN: {}", self.gate);
            GateExit::Pass
        } else {
            say!("FAIL: {} ({} failed checks)", self.gate, self.failures);
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

    fn append(&self, row: &Value) -> Result<(), GateError> {
        let Some(path) = &self.checks_path else {
            return Ok(());
        };
        let fail = |e: std::io::Error| {
            GateError::new(format!(
                "{}: cannot append a check row: {e}; MEMRA_ORCH_CHECKS must name a writable file",
                path.display()
            ))
        };
        let mut f = OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .map_err(fail)?;
        writeln!(f, "{row}").map_err(fail)
    }
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
    use super::*;

    #[test]
    fn check_rows_carry_the_protocol_fields() {
        let mut c = Check::new("gate2[B=4]", Status::Fail, "rows differ").metric("compared", 8);
        c.first_mismatch = Some(Mismatch {
            step: Some(3),
            row: 1,
            index: 811,
            reference: 1.25,
            got: f64::NAN,
        });
        let row = c.to_json();
        assert_eq!(row["check"], "gate2[B=4]");
        assert_eq!(row["status"], "fail");
        assert_eq!(row["metrics"]["compared"], 8);
        assert_eq!(row["first_mismatch"]["step"], 3);
        assert_eq!(row["first_mismatch"]["ref"], 1.25);
        assert_eq!(row["first_mismatch"]["got"], "NaN");
    }

    #[test]
    fn reporter_appends_rows_and_dumps_artifacts() {
        let dir = tempfile::tempdir().unwrap();
        let checks = dir.path().join("checks.jsonl");
        let mut r = Reporter::new("t", Some(checks.clone()), Some(dir.path().to_path_buf()));
        let be = crate::doors::Doors::default();
        let report = DoorsReport {
            backend: "cpu",
            matvec: "mmvq",
            norm: "fused",
            attention: "split-k",
            b1fast: false,
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
