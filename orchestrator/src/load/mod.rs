//! Loading a manifest from disk into a validated [`crate::plan::Plan`] ([`load_plan`]). The
//! stages live in their own modules (parse: [`crate::load::manifest`]; expand and link: [`build`];
//! print: [`render`]); this module reads the file, finds the root and reports. The `plan`
//! and `validate` subcommands that print the outcome are in the `cmd` module.

pub mod build;
pub mod graph;
pub mod manifest;
pub mod matrix;
pub mod name_clash;
pub mod render;
pub mod subst;

use std::path::{Path, PathBuf};

use crate::plan::Plan;
use crate::words::diagnostics::{Diagnostic, Diagnostics, SourceText};

/// Reads, validates and expands a manifest. Every problem in it (and in the env-matrix files
/// it names) is returned at once; a plan is returned only when there is none.
pub fn load_plan(path: &Path) -> Result<Plan, Diagnostics> {
    load_plan_with_vars(path, &[])
}

/// [`load_plan`] with `[vars]` entries replaced by `overrides` (`NAME`, `VALUE`; the last
/// of a name wins), as `run --var` and `plan --var` give them. Naming a var the manifest does
/// not define is an error.
pub fn load_plan_with_vars(
    path: &Path,
    overrides: &[(String, String)],
) -> Result<Plan, Diagnostics> {
    let bytes = read_bounded(path).map_err(|e| {
        Diagnostics(vec![Diagnostic::whole_file(
            path,
            format!("cannot read manifest: {e}"),
            Some("check the path".into()),
        )])
    })?;
    plan_from_bytes(path, bytes, &find_root(path), overrides)
}

/// The text → plan half of [`load_plan_with_vars`]: `bytes` are the manifest as read from
/// `path` (which only names it in messages and in the plan), `root` is the folder relative
/// paths resolve against. Env-matrix files are still read, from below `root` or where an
/// absolute path points (the fuzz target gives an empty temporary root).
pub fn plan_from_bytes(
    path: &Path,
    bytes: Vec<u8>,
    root: &Path,
    overrides: &[(String, String)],
) -> Result<Plan, Diagnostics> {
    let text = String::from_utf8(bytes.clone()).map_err(|_| {
        Diagnostics(vec![Diagnostic::whole_file(
            path,
            "manifest is not UTF-8 text",
            Some("save it as UTF-8 TOML".into()),
        )])
    })?;
    let src = SourceText::new(path.to_path_buf(), text);
    let mut diags = Vec::new();
    let plan = crate::load::manifest::parse(&src, &mut diags)
        .and_then(|raw| build::build(&raw, &src, &bytes, root, overrides, &mut diags));
    match plan {
        Some(plan) if diags.is_empty() => Ok(plan),
        _ => {
            let mut d = Diagnostics(diags);
            d.sort();
            Err(d)
        }
    }
}

/// Largest manifest or env-matrix file read; anything larger is a mistake (or `/dev/zero`).
pub const MAX_FILE_BYTES: u64 = 16 << 20;

/// Reads a regular file of at most [`MAX_FILE_BYTES`]: a FIFO, a device or a huge file named
/// by mistake must end in an error, not in a hang or an exhausted memory.
pub fn read_bounded(path: &Path) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    // Checked before opening: opening a FIFO for reading blocks until a writer comes.
    if !std::fs::metadata(path)?.is_file() {
        return Err(std::io::Error::other("not a regular file"));
    }
    let file = std::fs::File::open(path)?;
    let mut bytes = Vec::new();
    file.take(MAX_FILE_BYTES + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > MAX_FILE_BYTES {
        return Err(std::io::Error::other(format!(
            "larger than {} MiB",
            MAX_FILE_BYTES >> 20
        )));
    }
    Ok(bytes)
}

/// The git top-level holding the manifest (the nearest folder above it with a `.git` entry),
/// else the manifest's own folder; absolute.
pub fn find_root(manifest: &Path) -> PathBuf {
    let abs = std::fs::canonicalize(manifest).unwrap_or_else(|_| {
        std::env::current_dir()
            .map(|d| d.join(manifest))
            .unwrap_or_else(|_| manifest.to_path_buf())
    });
    let folder = abs
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("/"));
    folder
        .ancestors()
        .find(|d| d.join(".git").exists())
        .map(Path::to_path_buf)
        .unwrap_or(folder)
}
