//! Env-matrix files for the plan builder: reading each file once (however many nodes name
//! it), parsing and expanding it, and recording its digest for the receipts. Problems inside
//! a file point into that file; a file that cannot be read points at the manifest entry
//! naming it.

use std::path::{Path, PathBuf};

use super::{Builder, sha256_hex};
use crate::load::manifest::{self, RawMatrix, Sp};
use crate::load::matrix::{self, Combo};
use crate::load::subst::Scope;
use crate::plan::SourceFile;
use crate::words::diagnostics::SourceText;

/// A loaded env-matrix file.
pub(super) struct EnvMatrix {
    /// As written in the manifest (after substitution).
    pub(super) written: String,
    pub(super) pins: Vec<(String, String)>,
    pub(super) combos: Vec<Combo>,
    pub(super) axis_names: Vec<String>,
    /// Variables the includes set without naming the cell (`vars`).
    pub(super) quiet_names: Vec<String>,
}

impl Builder<'_, '_> {
    pub(super) fn env_matrix(
        &mut self,
        written: &Sp<String>,
        vars: &[(String, String)],
    ) -> Option<std::rc::Rc<EnvMatrix>> {
        let root_str = self.root_str.clone();
        let scope = Scope {
            root: &root_str,
            node: None,
            matrix: None,
            vars,
            shell: false,
        };
        let path_s = self.subst(written, &scope)?;
        let abs = self.resolve_path(&path_s);
        if let Some(cached) = self.env_files.get(&abs) {
            return cached.clone();
        }
        let loaded = self.load_env_matrix(written, &path_s, &abs);
        self.env_files.insert(abs, loaded.clone());
        loaded
    }

    pub(super) fn load_env_matrix(
        &mut self,
        written: &Sp<String>,
        path_s: &str,
        abs: &Path,
    ) -> Option<std::rc::Rc<EnvMatrix>> {
        let bytes = match crate::load::read_bounded(abs) {
            Ok(b) => b,
            Err(e) => {
                let msg = format!(
                    "cannot read env-matrix file `{path_s}` ({}): {e}",
                    abs.display()
                );
                let help = "paths are relative to the root (the git top-level holding the manifest); fix the path or create the file";
                self.err(written.span(), msg, help.into());
                return None;
            }
        };
        let text = match String::from_utf8(bytes.clone()) {
            Ok(t) => t,
            Err(_) => {
                self.err(
                    written.span(),
                    format!("env-matrix file `{path_s}` is not UTF-8 text"),
                    "save it as UTF-8 TOML".into(),
                );
                return None;
            }
        };
        let src = SourceText::new(PathBuf::from(path_s), text);
        let before = self.diags.len();
        let raw: RawMatrix = manifest::parse_env_matrix(&src, self.diags)?;
        let combos = matrix::expand(&raw, &src, self.max_cells, self.diags);
        for entry in raw.include.iter().flatten() {
            let name = entry.0.get_ref();
            let name = name.strip_prefix(matrix::QUIET_PREFIX).unwrap_or(name);
            if !manifest::is_env_name(name) {
                let msg = format!("`{name}` is not a valid environment variable name");
                self.diags.push(src.diag(
                    entry.0.span(),
                    msg,
                    Some("env-matrix keys become environment variables".into()),
                ));
            } else if let Some((message, help)) = manifest::reserved_pin(name) {
                self.diags
                    .push(src.diag(entry.0.span(), message, Some(help)));
            }
        }
        if self.diags.len() > before {
            return None;
        }
        self.sources.push(SourceFile {
            path: PathBuf::from(path_s),
            sha256: sha256_hex(&bytes),
        });
        let mut axis_names: Vec<String> =
            raw.axes.iter().map(|(k, _)| k.get_ref().clone()).collect();
        for (k, _) in raw.include.iter().flatten() {
            if !axis_names.contains(k.get_ref()) && !k.get_ref().starts_with(matrix::QUIET_PREFIX) {
                axis_names.push(k.get_ref().clone());
            }
        }
        let mut quiet_names: Vec<String> = Vec::new();
        for (k, _) in raw.include.iter().flatten() {
            let Some(name) = k.get_ref().strip_prefix(matrix::QUIET_PREFIX) else {
                continue;
            };
            let named = axis_names.iter().any(|a| a == name)
                || raw.pins.iter().any(|(p, _)| p.get_ref() == name);
            if named {
                // A quiet value would override what the id says the cell runs with.
                self.diags.push(src.diag(
                    k.span(),
                    format!(
                        "`{name}` is set in a `vars` table and also names cells (an axis, a pin \
                         or an include key) in this file"
                    ),
                    Some(
                        "a variable either names the cell or not: drop it from `vars`, or from \
                         the axes, pins and include keys"
                            .into(),
                    ),
                ));
            } else if !quiet_names.iter().any(|q| q == name) {
                quiet_names.push(name.to_string());
            }
        }
        if self.diags.len() > before {
            return None;
        }
        Some(std::rc::Rc::new(EnvMatrix {
            quiet_names,
            written: path_s.to_string(),
            pins: raw
                .pins
                .iter()
                .map(|(k, v)| (k.get_ref().clone(), v.get_ref().clone()))
                .collect(),
            combos,
            axis_names,
        }))
    }
}
