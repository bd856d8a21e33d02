//! Declared inputs (`inputs = ["tools/**/*.py", "/opt/venv/lib/python3.11/site-packages/llama_cpp/**"]`):
//! the rules a glob must follow, and the walk that finds the files a list of globs matches.
//!
//! A glob is matched against a file's path written with `/` separators; `*` and `?` stay
//! inside one path component and `**` crosses them. A glob relative to the root is matched
//! against paths relative to the root. An *external* glob names files outside the
//! repository — the engine under test installed with pip, a CUDA library, a sibling
//! checkout: it is absolute, or starts with `..` components (relative to the root), and is
//! matched against absolute paths. This module owns the syntax and the walk only.
//! Validation errors are located by the plan builder (`load::build`), and digesting the
//! matched files and caching the walks per run are the executor's (`executor::inputs`).

use std::collections::BTreeMap;
use std::path::{Component, Path, PathBuf};

use globset::{Glob, GlobBuilder, GlobSet, GlobSetBuilder};

/// Why a written glob cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum InputGlobError {
    #[error("is empty")]
    Empty,
    #[error("has `..` after its first components")]
    ParentDir,
    #[error("is not a valid glob: {}", .0.kind())]
    Syntax(globset::Error),
}

impl InputGlobError {
    /// How to write the glob instead.
    pub fn help(&self) -> &'static str {
        match self {
            InputGlobError::Empty | InputGlobError::ParentDir => {
                "write a glob relative to the root (`tools/**/*.py`), or an absolute one for files outside it (`/opt/venv/lib/python3.11/site-packages/llama_cpp/**`); `..` may only lead the glob (`../llama.cpp/src/**`)"
            }
            InputGlobError::Syntax(_) => {
                "write `[[]` for a literal `[`, close every `[…]` and `{…}`, and use `**` only as a whole path component"
            }
        }
    }
}

/// A glob as it is matched: against root-relative paths, or against absolute ones.
#[derive(Debug, Clone)]
pub struct InputGlob {
    pub glob: Glob,
    /// The glob names files outside the root (it is absolute, or led by `..`).
    pub external: bool,
}

/// Parses one written glob under the rules of declared inputs. An external glob led by
/// `..` is made absolute against `root`.
pub fn parse(pattern: &str, root: &Path) -> Result<InputGlob, InputGlobError> {
    if pattern.is_empty() {
        return Err(InputGlobError::Empty);
    }
    let pattern = pattern.strip_prefix("./").unwrap_or(pattern);
    let parts: Vec<&str> = pattern.split('/').collect();
    let leading = parts.iter().take_while(|c| **c == "..").count();
    if parts[leading..].contains(&"..") {
        // Walked paths never hold `..`, so such a glob could only ever match nothing.
        return Err(InputGlobError::ParentDir);
    }
    let (text, external) = if pattern.starts_with('/') {
        (normalize(Path::new(pattern)), true)
    } else if leading > 0 {
        (normalize(&root.join(pattern)), true)
    } else {
        (pattern.to_string(), false)
    };
    let glob = GlobBuilder::new(&text)
        .literal_separator(true)
        .build()
        .map_err(InputGlobError::Syntax)?;
    Ok(InputGlob { glob, external })
}

/// `path` with `.` and `..` components resolved lexically, as a `/`-separated string.
fn normalize(path: &Path) -> String {
    let mut out: Vec<String> = Vec::new();
    for c in path.components() {
        match c {
            Component::ParentDir => {
                out.pop();
            }
            Component::Normal(n) => out.push(n.to_string_lossy().into_owned()),
            Component::RootDir | Component::CurDir | Component::Prefix(_) => {}
        }
    }
    format!("/{}", out.join("/"))
}

/// What a list of globs matched.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Expanded {
    /// By path (relative to the root for root globs, absolute for external ones), with the
    /// absolute path to read.
    pub files: BTreeMap<String, PathBuf>,
    /// The globs, as written, that matched no file.
    pub unmatched: Vec<String>,
    /// The globs, as written, that name files outside the root.
    pub external: Vec<String>,
}

/// The files that any of `globs` matches, and the globs that matched none. Root globs are
/// walked below `root`; external globs below their literal folder. `.git` folders, the
/// folders in `skip` and symlinked folders are not entered (a literal folder an external
/// glob names may itself be reached through a link); a symlink to a file counts as that
/// file. Globs that fail [`parse`] match nothing (the plan builder has already reported
/// them).
pub fn expand(root: &Path, skip: &[PathBuf], globs: &[String]) -> Expanded {
    let mut out = Expanded::default();
    let mut parsed: Vec<(usize, InputGlob)> = Vec::new();
    for (i, g) in globs.iter().enumerate() {
        if let Ok(p) = parse(g, root) {
            if p.external {
                out.external.push(g.clone());
            }
            parsed.push((i, p));
        }
    }
    let mut hits = vec![false; globs.len()];
    for external in [false, true] {
        let mine: Vec<&(usize, InputGlob)> = parsed
            .iter()
            .filter(|(_, p)| p.external == external)
            .collect();
        if mine.is_empty() {
            continue;
        }
        let mut set = GlobSetBuilder::new();
        for (_, p) in &mine {
            set.add(p.glob.clone());
        }
        let Ok(set) = set.build() else {
            continue;
        };
        let mut bases: Vec<String> = mine
            .iter()
            .map(|(_, p)| literal_prefix(p.glob.glob()))
            .collect();
        // Walking only below each glob's literal folder keeps `tools/*.py` from reading a
        // build folder elsewhere in the checkout. A base inside another base is walked once.
        bases.sort();
        bases.dedup();
        let mut walked: Vec<&str> = Vec::new();
        let mut found = BTreeMap::new();
        for base in &bases {
            let covered = |w: &&str| {
                (w.is_empty() && !external)
                    || w == &"/"
                    || base.strip_prefix(*w).is_some_and(|r| r.starts_with('/'))
            };
            if walked.iter().any(covered) {
                continue;
            }
            walked.push(base);
            let w = Walk {
                root: if external { Path::new("/") } else { root },
                skip,
                set: &set,
                absolute: external,
            };
            if w.enterable(base) {
                w.folder(base, &mut found);
            }
        }
        for (key, abs) in found {
            for m in set.matches(&key) {
                hits[mine[m].0] = true;
            }
            out.files.insert(key, abs);
        }
    }
    out.unmatched = parsed
        .iter()
        .filter(|(i, _)| !hits[*i])
        .map(|(i, _)| globs[*i].clone())
        .collect();
    out
}

/// The leading components of a glob that hold no glob syntax: the folder its matches must
/// lie in (`""` for the root, `"/"` for the file system's root).
fn literal_prefix(glob: &str) -> String {
    let absolute = glob.starts_with('/');
    let mut parts: Vec<&str> = glob.split('/').collect();
    // The last component names files, not a folder to walk.
    parts.pop();
    let prefix = parts
        .into_iter()
        .skip(usize::from(absolute))
        .take_while(|c| !c.contains(['*', '?', '[', ']', '{', '}', '\\']))
        .collect::<Vec<_>>()
        .join("/");
    if absolute {
        format!("/{prefix}")
    } else {
        prefix
    }
}

struct Walk<'a> {
    /// What relative names are below: the plan root, or `/` for absolute walks.
    root: &'a Path,
    skip: &'a [PathBuf],
    set: &'a GlobSet,
    /// Names are absolute paths (external globs): the folders the glob names literally may
    /// be links.
    absolute: bool,
}

impl Walk<'_> {
    /// Whether `rel` is a folder to walk: for root globs every component a real folder (no
    /// symlink on the way), for external ones any folder.
    fn enterable(&self, rel: &str) -> bool {
        if self.absolute {
            return Path::new(rel).is_dir();
        }
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
        } else if self.absolute {
            PathBuf::from(rel)
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
            } else if rel == "/" {
                format!("/{name}")
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
        let root = Path::new("/repo/r");
        let ok = |g: &str| parse(g, root).map(|p| (p.glob.glob().to_string(), p.external));
        assert_eq!(
            ok("tools/**/*.py").unwrap(),
            ("tools/**/*.py".into(), false)
        );
        assert_eq!(ok("/etc/*").unwrap(), ("/etc/*".into(), true));
        assert_eq!(ok("../x/**").unwrap(), ("/repo/x/**".into(), true));
        assert_eq!(ok("../../x").unwrap(), ("/x".into(), true));
        assert!(matches!(
            parse("a/../../x", root),
            Err(InputGlobError::ParentDir)
        ));
        assert!(matches!(
            parse("../a/../x", root),
            Err(InputGlobError::ParentDir)
        ));
        assert!(matches!(parse("", root), Err(InputGlobError::Empty)));
        assert!(matches!(
            parse("lib/[*.py", root),
            Err(InputGlobError::Syntax(_))
        ));
    }

    #[test]
    fn prefixes() {
        assert_eq!(literal_prefix("tools/**/*.py"), "tools");
        assert_eq!(literal_prefix("a/b/c.py"), "a/b");
        assert_eq!(literal_prefix("*.py"), "");
        assert_eq!(literal_prefix("a/{b,c}/d"), "a");
        assert_eq!(literal_prefix("/opt/x/**/*.so"), "/opt/x");
        assert_eq!(literal_prefix("/*.so"), "/");
    }

    #[test]
    fn external_globs_walk_their_own_folder_and_report_what_matched_nothing() {
        let repo = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        let root = repo.path();
        let site = outside.path().join("site-packages");
        for f in [
            "llama_cpp/__init__.py",
            "llama_cpp/lib/libllama.so",
            "other/x.py",
        ] {
            let p = site.join(f);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, f).unwrap();
        }
        std::fs::create_dir_all(root.join("lib")).unwrap();
        std::fs::write(root.join("lib/gate.py"), "g").unwrap();
        // The site folder reached through a link, as a venv's `lib64` is.
        let link = outside.path().join("venv-lib");
        std::os::unix::fs::symlink(&site, &link).unwrap();
        let glob = format!("{}/llama_cpp/**", link.display());
        let missing = format!("{}/vllm/**", site.display());
        let globs = vec![
            "lib/*.py".to_string(),
            glob.clone(),
            missing.clone(),
            "nothing/*".into(),
        ];
        let e = expand(root, &[], &globs);
        let names: Vec<&String> = e.files.keys().collect();
        assert_eq!(
            names,
            [
                &format!("{}/llama_cpp/__init__.py", link.display()),
                &format!("{}/llama_cpp/lib/libllama.so", link.display()),
                &"lib/gate.py".to_string(),
            ]
        );
        assert_eq!(e.unmatched, [missing.clone(), "nothing/*".to_string()]);
        assert_eq!(e.external, [glob, missing]);
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
            expand(root, &skip, &globs).files.into_keys().collect()
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
