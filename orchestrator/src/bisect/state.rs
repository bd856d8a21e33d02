//! What `bisect --resume` needs: the last bisection's request and setting, kept in
//! `<receipts>/.memra-bisect/last.json` from its start until it ends with an answer. The
//! search's knowledge itself is not kept here: it is the receipts the bisection filed, which
//! a resumed (or repeated) bisection reuses.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::Request;

/// Format version of `last.json`.
pub const STATE_SCHEMA: u32 = 1;

/// The folder of bisect's own files under a receipts folder.
pub fn state_dir(receipts: &Path) -> PathBuf {
    receipts.join(".memra-bisect")
}

/// A bisection in progress, as `--resume` takes it up.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Saved {
    pub schema: u32,
    pub request: Request,
    /// The manifest as given (absolute).
    pub manifest: PathBuf,
    pub vars: Vec<(String, String)>,
    pub share: Vec<String>,
    pub gpus: String,
    pub grace: Option<String>,
}

fn path(receipts: &Path) -> PathBuf {
    state_dir(receipts).join("last.json")
}

pub fn save(receipts: &Path, saved: &Saved) -> Result<(), String> {
    std::fs::create_dir_all(state_dir(receipts))
        .map_err(|e| format!("cannot make {}: {e}", state_dir(receipts).display()))?;
    crate::receipt::write_json(&path(receipts), saved).map_err(|e| e.to_string())
}

/// The bisection `--resume` continues; an error says why there is none.
pub fn load(receipts: &Path) -> Result<Saved, String> {
    let p = path(receipts);
    let saved: Option<Saved> = crate::receipt::read_json(&p).map_err(|e| e.to_string())?;
    let saved = saved.ok_or_else(|| {
        format!(
            "--resume: no unfinished bisection under {} (it is kept in {} until a bisection \
             ends with an answer); start one with --good and --bad",
            receipts.display(),
            p.display()
        )
    })?;
    if saved.schema != STATE_SCHEMA {
        return Err(format!(
            "{}: written by another memra-orch (schema {}); start the bisection again",
            p.display(),
            saved.schema
        ));
    }
    Ok(saved)
}

/// Forgets the bisection once it has an answer.
pub fn clear(receipts: &Path) {
    let _ = std::fs::remove_file(path(receipts));
}
