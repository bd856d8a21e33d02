//! Declared inputs (`inputs = ["tools/**/*.py"]`): the rules a glob must follow, and the
//! walk that finds the files a list of globs matches below the plan root.
//!
//! A glob is matched against a file's path relative to the root, written with `/`
//! separators; `*` and `?` stay inside one path component and `**` crosses them. This module
//! owns the syntax and the walk only. Validation errors are located by the plan builder
//! (`load::build`), and digesting the matched files and caching the walks per run are the
//! executor's (`executor::inputs`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use globset::{Glob, GlobBuilder, GlobSet, GlobSetBuilder};

/// Why a written glob cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum InputGlobError {
    #[error("is empty")]
    Empty,
    #[error("is absolute")]
    Absolute,
    #[error("leaves the root through `..`")]
    ParentDir,
    #[error("is not a valid glob: {}", .0.kind())]
    Syntax(globset::Error),
}

impl InputGlobError {
    /// How to write the glob instead.
    pub fn help(&self) -> &'static str {
        match self {
            InputGlobError::Empty | InputGlobError::Absolute | InputGlobError::ParentDir => {
                "declared inputs are files below the root: write a glob relative to it, e.g. `inputs = [\"tools/**/*.py\"]`"
            }
            InputGlobError::Syntax(_) => {
                "write `[[]` for a literal `[`, close every `[…]` and `{…}`, and use `**` only as a whole path component"
            }
        }
    }
}

/// Parses one written glob under the rules of declared inputs.
pub fn parse(pattern: &str) -> Result<Glob, InputGlobError> {
    if pattern.is_empty() {
        return Err(InputGlobError::Empty);
    }
    if pattern.starts_with('/') {
        return Err(InputGlobError::Absolute);
    }
    if pattern.split('/').any(|c| c == "..") {
        // Walked paths never hold `..`, so such a glob could only ever match nothing.
        return Err(InputGlobError::ParentDir);
    }
    GlobBuilder::new(pattern.strip_prefix("./").unwrap_or(pattern))
        .literal_separator(true)
        .build()
        .map_err(InputGlobError::Syntax)
}

/// The files below `root` that any of `globs` matches, by relative path (sorted), with their
/// absolute paths. `.git` folders, the folders in `skip` and symlinked folders are not
/// entered; a symlink to a file counts as that file. Globs that fail [`parse`] match nothing
/// (the plan builder has already reported them).
pub fn expand(root: &Path, skip: &[PathBuf], globs: &[String]) -> BTreeMap<String, PathBuf> {
    let mut set = GlobSetBuilder::new();
    let mut bases: Vec<String> = Vec::new();
    for g in globs {
        if let Ok(glob) = parse(g) {
            bases.push(literal_prefix(glob.glob()));
            set.add(glob);
        }
    }
    let mut found = BTreeMap::new();
    let Ok(set) = set.build() else {
        return found;
    };
    // Walking only below each glob's literal folder keeps `tools/*.py` from reading a
    // build folder elsewhere in the checkout. A base inside another base is walked once.
    bases.sort();
    bases.dedup();
    let mut walked: Vec<&str> = Vec::new();
    for base in &bases {
        if walked
            .iter()
            .any(|w| w.is_empty() || base.strip_prefix(w).is_some_and(|r| r.starts_with('/')))
        {
            continue;
        }
        walked.push(base);
        let w = Walk {
            root,
            skip,
            set: &set,
        };
        if w.enterable(base) {
            w.folder(base, &mut found);
        }
    }
    found
}

/// The leading components of a glob that hold no glob syntax: the folder its matches must
/// lie in (`""` for the root).
fn literal_prefix(glob: &str) -> String {
    let mut parts: Vec<&str> = glob.split('/').collect();
    // The last component names files, not a folder to walk.
    parts.pop();
    parts
        .into_iter()
        .take_while(|c| !c.contains(['*', '?', '[', ']', '{', '}', '\\']))
        .collect::<Vec<_>>()
        .join("/")
}

struct Walk<'a> {
    root: &'a Path,
    skip: &'a [PathBuf],
    set: &'a GlobSet,
}

impl Walk<'_> {
    /// Whether every component of `rel` is a real folder (no symlink on the way).
    fn enterable(&self, rel: &str) -> bool {
        let mut at = self.root.to_path_buf();
        for c in rel.split('/').filter(|c| !c.is_empty()) {
            at.push(c);
            let real_dir = std::fs::symlink_metadata(&at).is_ok_and(|m| m.is_dir());
            if !real_dir || c == ".git" || self.skip.contains(&at) {
                return false;
            }
        }
        true
    }

    fn folder(&self, rel: &str, found: &mut BTreeMap<String, PathBuf>) {
        let dir = if rel.is_empty() {
            self.root.to_path_buf()
        } else {
            self.root.join(rel)
        };
        let Ok(entries) = std::fs::read_dir(&dir) else {
            return;
        };
        for entry in entries.flatten() {
            let Ok(name) = entry.file_name().into_string() else {
                // A name that is not UTF-8 cannot be written in a manifest glob.
                continue;
            };
            let child = if rel.is_empty() {
                name.clone()
            } else {
                format!("{rel}/{name}")
            };
            let path = entry.path();
            let Ok(kind) = entry.file_type() else {
                continue;
            };
            if kind.is_dir() {
                if name != ".git" && !self.skip.contains(&path) {
                    self.folder(&child, found);
                }
            } else if (kind.is_file() || (kind.is_symlink() && path.is_file()))
                && self.set.is_match(&child)
            {
                found.insert(child, path);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules() {
        assert!(parse("tools/**/*.py").is_ok());
        assert!(matches!(parse("/etc/*"), Err(InputGlobError::Absolute)));
        assert!(matches!(parse("../x"), Err(InputGlobError::ParentDir)));
        assert!(matches!(parse("a/../../x"), Err(InputGlobError::ParentDir)));
        assert!(matches!(parse(""), Err(InputGlobError::Empty)));
        assert!(matches!(parse("lib/[*.py"), Err(InputGlobError::Syntax(_))));
    }

    #[test]
    fn prefixes() {
        assert_eq!(literal_prefix("tools/**/*.py"), "tools");
        assert_eq!(literal_prefix("a/b/c.py"), "a/b");
        assert_eq!(literal_prefix("*.py"), "");
        assert_eq!(literal_prefix("a/{b,c}/d"), "a");
    }

    #[test]
    fn walks_below_the_root_skipping_git_receipts_and_folder_links() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        for f in [
            "lib/x.py",
            "lib/deep/y.py",
            "lib/z.txt",
            ".git/hooks/h.py",
            "receipts/r.py",
            "outside/o.py",
        ] {
            let p = root.join(f);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, f).unwrap();
        }
        std::os::unix::fs::symlink(root.join("outside"), root.join("lib/linked")).unwrap();
        std::os::unix::fs::symlink(root.join("outside/o.py"), root.join("lib/o.py")).unwrap();
        let skip = [root.join("receipts")];
        let names = |globs: &[&str]| -> Vec<String> {
            let globs: Vec<String> = globs.iter().map(|s| s.to_string()).collect();
            expand(root, &skip, &globs).into_keys().collect()
        };
        assert_eq!(names(&["lib/*.py"]), ["lib/o.py", "lib/x.py"]);
        assert_eq!(
            names(&["**/*.py"]),
            ["lib/deep/y.py", "lib/o.py", "lib/x.py", "outside/o.py"]
        );
        assert_eq!(
            names(&["./lib/**/*.py", "lib/deep/*.py"]),
            ["lib/deep/y.py", "lib/o.py", "lib/x.py"]
        );
        assert!(names(&["nothing/*.py"]).is_empty());
    }
}
