//! The reader's side of the checks file: [`parse_checks`] turns JSON lines into a
//! [`GateReport`] of [`CheckRow`]s and merged doors, with one located message for every line
//! that breaks the protocol.
//!
//! It reads leniently, as any gate (older ones included) wrote its rows: unknown keys are
//! kept and `first_mismatch` stays plain JSON. Judging an attempt from the report and
//! shaping rows for receipts is the orchestrator's business.

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::row::{FirstMismatch, Status, flat_problem};

/// One check row as a gate wrote it (unknown keys are kept in `extra`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CheckRow {
    pub check: String,
    pub status: Status,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub metrics: BTreeMap<String, Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_mismatch: Option<Value>,
    #[serde(flatten)]
    pub extra: BTreeMap<String, Value>,
}

impl CheckRow {
    /// The first mismatch in the shape [`FirstMismatch`] writes, if the row has one in it.
    pub fn mismatch(&self) -> Option<FirstMismatch> {
        self.first_mismatch
            .as_ref()
            .and_then(FirstMismatch::from_json)
    }
}

/// Everything a gate reported through its checks file.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GateReport {
    pub checks: Vec<CheckRow>,
    /// The code paths the gate ran (merged over all doors rows; a later row wins).
    pub doors: Option<BTreeMap<String, Value>>,
    /// Lines that break the protocol (not JSON, neither a check nor a doors row…), each
    /// naming its line number.
    pub problems: Vec<String>,
}

impl GateReport {
    /// Whether the gate wrote anything at all: only gates that speak the protocol are held
    /// to its consistency rule; a plain program that writes no rows is judged by its exit
    /// status alone.
    pub fn speaks_protocol(&self) -> bool {
        !self.checks.is_empty() || self.doors.is_some() || !self.problems.is_empty()
    }

    pub fn first_failed(&self) -> Option<&CheckRow> {
        self.checks.iter().find(|c| c.status == Status::Fail)
    }
}

/// Reads a checks file; a missing file is an empty report (the gate wrote no rows).
pub fn read_checks(path: &Path) -> GateReport {
    match std::fs::read(path) {
        Ok(bytes) => parse_checks(&String::from_utf8_lossy(&bytes)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => GateReport::default(),
        Err(e) => GateReport {
            problems: vec![format!("{}: cannot read: {e}", path.display())],
            ..GateReport::default()
        },
    }
}

/// Parses JSON-lines check output. Blank lines are ignored.
pub fn parse_checks(text: &str) -> GateReport {
    let mut report = GateReport::default();
    for (i, line) in text.lines().enumerate() {
        report.add_line(i + 1, line);
    }
    report
}

impl GateReport {
    /// Adds line `n` (counted from 1) of a checks file: a check row, a doors row merged into
    /// [`GateReport::doors`], or a problem naming the line. Blank lines are ignored. A reader
    /// that streams a large file line by line calls this for each line.
    pub fn add_line(&mut self, n: usize, line: &str) {
        let line = line.trim();
        if line.is_empty() {
            return;
        }
        let value: Value = match serde_json::from_str(line) {
            Ok(v) => v,
            Err(e) => {
                self.problems
                    .push(format!("checks.jsonl line {n}: not JSON ({e})"));
                return;
            }
        };
        let Value::Object(obj) = &value else {
            self.problems
                .push(format!("checks.jsonl line {n}: not a JSON object"));
            return;
        };
        if let Some(doors) = obj.get("doors") {
            match doors_map(doors) {
                Ok(map) => self.doors.get_or_insert_with(BTreeMap::new).extend(map),
                Err(e) => self.problems.push(format!("checks.jsonl line {n}: {e}")),
            }
            return;
        }
        match serde_json::from_value::<CheckRow>(value) {
            Ok(row) => self.checks.push(row),
            Err(e) => self.problems.push(format!(
                "checks.jsonl line {n}: not a check row ({e}); expected \
                 {{\"check\":NAME,\"status\":\"pass|fail|warn|skip\",…}} or {{\"doors\":{{…}}}}"
            )),
        }
    }
}

fn doors_map(doors: &Value) -> Result<BTreeMap<String, Value>, String> {
    let Value::Object(obj) = doors else {
        return Err("\"doors\" must be an object of strings, numbers and booleans".to_string());
    };
    if let Some(problem) = flat_problem(obj) {
        return Err(problem);
    }
    Ok(obj.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
}
