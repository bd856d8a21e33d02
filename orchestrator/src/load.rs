//! Loading a manifest from disk into a validated [`crate::plan::Plan`] ([`load_plan`]). The
//! stages live in their own modules (parse: [`crate::manifest`]; expand and link: [`build`];
//! print: [`render`]); this module reads the file, finds the root and reports. The `plan`
//! and `validate` subcommands that print the outcome are in the `cmd` module.

pub mod build;
pub mod render;

use std::path::{Path, PathBuf};

use crate::diagnostics::{Diagnostic, Diagnostics, SourceText};
use crate::plan::Plan;

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
    let bytes = std::fs::read(path).map_err(|e| {
        Diagnostics(vec![Diagnostic::whole_file(
            path,
            format!("cannot read manifest: {e}"),
            Some("check the path".into()),
        )])
    })?;
    let text = String::from_utf8(bytes.clone()).map_err(|_| {
        Diagnostics(vec![Diagnostic::whole_file(
            path,
            "manifest is not UTF-8 text",
            Some("save it as UTF-8 TOML".into()),
        )])
    })?;
    let root = find_root(path);
    let src = SourceText::new(path.to_path_buf(), text);
    let mut diags = Vec::new();
    let plan = crate::manifest::parse(&src, &mut diags)
        .and_then(|raw| build::build(&raw, &src, &bytes, &root, overrides, &mut diags));
    match plan {
        Some(plan) if diags.is_empty() => Ok(plan),
        _ => {
            let mut d = Diagnostics(diags);
            d.sort();
            Err(d)
        }
    }
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
