//! What a cell depends on, as digests: the program `argv[0]` names (resolved through the
//! PATH the child will see), file digests cached by (path, size, mtime) so a gate binary
//! shared by a thousand cells is hashed once, and the `inputs` digest that `run --resume`
//! compares. It reads files; it runs nothing.

use std::collections::HashMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::SystemTime;

use super::CellJob;
use crate::plan::Policy;
use crate::receipt::{FileDigest, sha256_file, sha256_hex};

/// A cache of file digests by (path, size, mtime), so a gate binary shared by a thousand
/// cells is hashed once.
#[derive(Debug, Default)]
pub struct DigestCache {
    map: Mutex<HashMap<(PathBuf, u64, SystemTime), String>>,
    /// PATH lookups by (PATH, program name).
    found: Mutex<HashMap<(OsString, String), Option<PathBuf>>>,
}

impl DigestCache {
    /// Finds the program a job runs: a path with a separator relative to the cwd, else the
    /// first match on the PATH the child will see (its pin, else the inherited one).
    pub fn resolve(&self, job: &CellJob) -> Option<PathBuf> {
        let program = job.argv.first()?;
        if program.contains('/') {
            return Some(job.cwd.join(program));
        }
        let path: OsString = match job.pins.get("PATH") {
            Some(p) => p.into(),
            None if job.inherit.iter().any(|n| n == "PATH") => std::env::var_os("PATH")?,
            None => return None,
        };
        let key = (path, program.clone());
        let mut found = self.found.lock().unwrap_or_else(|p| p.into_inner());
        found
            .entry(key)
            .or_insert_with_key(|(path, program)| {
                std::env::split_paths(path)
                    .map(|d| d.join(program))
                    .find(|p| p.is_file())
            })
            .clone()
    }

    pub fn digest(&self, path: &Path) -> Option<FileDigest> {
        let meta = std::fs::metadata(path).ok()?;
        let key = (path.to_path_buf(), meta.len(), meta.modified().ok()?);
        if let Some(sha) = self.map.lock().unwrap_or_else(|p| p.into_inner()).get(&key) {
            return Some(FileDigest {
                path: path.to_string_lossy().into_owned(),
                bytes: key.1,
                sha256: sha.clone(),
            });
        }
        let (bytes, sha256) = sha256_file(path).ok()?;
        self.map
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(key, sha256.clone());
        Some(FileDigest {
            path: path.to_string_lossy().into_owned(),
            bytes,
            sha256,
        })
    }
}

/// sha256 over what determines a cell's behaviour: command, pins, cwd, expectations, the
/// binaries (the program and the needed setups' products) and, for compares, the policy.
pub fn inputs_digest(
    job: &CellJob,
    policy: Option<&Policy>,
    compare: Option<&(PathBuf, PathBuf)>,
) -> String {
    let value = serde_json::json!({
        "argv": job.argv,
        "shell": job.shell,
        "cwd": job.cwd,
        "pins": job.pins,
        "inherit": job.inherit,
        "expect": job.expect,
        "reps": job.reps,
        "verdict": [job.verdict_pass, job.verdict_fail],
        "binaries": job.binaries.iter().map(|b| (&b.path, &b.sha256)).collect::<Vec<_>>(),
        "policy": policy,
        "compare": compare.map(|(r, c)| (r.file_name(), c.file_name())),
    });
    sha256_hex(value.to_string().as_bytes())
}
