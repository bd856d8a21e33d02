//! The gate's side of the checks file: [`ChecksWriter`] appends rows to the file named by
//! `MEMRA_ORCH_CHECKS` and does nothing when the variable is unset; [`artifacts_dir`] finds
//! the folder named by `MEMRA_ORCH_ARTIFACTS`.
//!
//! It owns where rows go and how a line is written, not what a row holds (`row`) nor how a
//! gate prints its report (each gate's own business).

use std::fs::OpenOptions;
use std::io::Write;
use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::row::{Check, DoorsRow, Status};
use crate::{Outcome, vars};

/// A path from the environment; unset and empty are the same (not asked for).
fn env_path(name: &str) -> Option<PathBuf> {
    std::env::var_os(name)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
}

/// The folder for the gate's files (`MEMRA_ORCH_ARTIFACTS`), or `None` when the gate runs
/// outside the orchestrator and should write none.
pub fn artifacts_dir() -> Option<PathBuf> {
    env_path(vars::ARTIFACTS)
}

/// Appends rows to the checks file, one compact JSON object a line, and counts the failed
/// checks so the exit status can agree with the rows.
///
/// Every row opens the file for appending and writes its line in one call: a rep or retry
/// gets a fresh file, but several processes of one gate may share it.
#[derive(Debug, Clone, Default)]
pub struct ChecksWriter {
    path: Option<PathBuf>,
    failures: usize,
}

impl ChecksWriter {
    /// Writes to `MEMRA_ORCH_CHECKS`, or nowhere when it is unset or empty.
    pub fn from_env() -> ChecksWriter {
        ChecksWriter::new(env_path(vars::CHECKS))
    }

    /// Writes to `path`, or nowhere for `None`.
    pub fn new(path: Option<PathBuf>) -> ChecksWriter {
        ChecksWriter { path, failures: 0 }
    }

    /// The checks file, if rows are wanted.
    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    /// Appends one check row; a `fail` counts towards [`ChecksWriter::outcome`] even when
    /// there is no file.
    pub fn check(&mut self, check: &Check) -> Result<(), AppendError> {
        if check.status == Status::Fail {
            self.failures += 1;
        }
        self.append(&check.to_json())
    }

    /// Appends the doors row.
    pub fn doors(&mut self, doors: &DoorsRow) -> Result<(), AppendError> {
        self.append(&doors.to_json())
    }

    /// Failed checks written so far.
    pub fn failures(&self) -> usize {
        self.failures
    }

    /// The exit status that agrees with the rows written: fail exactly when one failed.
    pub fn outcome(&self) -> Outcome {
        Outcome::from_failures(self.failures)
    }

    fn append(&self, row: &Value) -> Result<(), AppendError> {
        let Some(path) = &self.path else {
            return Ok(());
        };
        let fail = |source| AppendError {
            path: path.clone(),
            source,
        };
        let mut f = OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .map_err(fail)?;
        writeln!(f, "{row}").map_err(fail)
    }
}

/// A row could not be appended to the checks file.
#[derive(Debug)]
pub struct AppendError {
    /// The checks file.
    pub path: PathBuf,
    pub source: std::io::Error,
}

impl std::fmt::Display for AppendError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}: cannot append a check row: {}; MEMRA_ORCH_CHECKS must name a writable file",
            self.path.display(),
            self.source
        )
    }
}

impl std::error::Error for AppendError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.source)
    }
}
