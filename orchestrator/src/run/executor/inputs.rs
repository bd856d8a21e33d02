//! What a cell depends on, as digests: the program `argv[0]` names (resolved through the
//! PATH the child will see), file digests cached by (path, size, mtime) so a gate binary
//! shared by a thousand cells is hashed once, the files a cell's declared `inputs` globs
//! match (one walk per glob list, shared by every cell that declares it), and the `inputs`
//! digest that `run --resume` compares. It reads files; it runs nothing.

use std::collections::HashMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use super::CellJob;
use crate::plan::Policy;
use crate::receipt::{FileDigest, sha256_file, sha256_hex};

/// What one glob list matched.
type Matched = Arc<crate::plan::declared_inputs::Expanded>;

/// The files a cell's declared inputs matched, digested, and the globs that matched none.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Declared {
    /// Sorted by path (relative to the root, or absolute for external globs).
    pub files: Vec<FileDigest>,
    pub unmatched: Vec<String>,
    /// The globs that name files outside the root.
    pub external: Vec<String>,
}

/// A cache of file digests by (path, size, mtime), so a gate binary shared by a thousand
/// cells is hashed once, and of declared-input walks by glob list, so a thousand cells
/// sharing `inputs = ["tools/**/*.py"]` walk the tree once.
#[derive(Debug)]
pub struct DigestCache {
    map: Mutex<HashMap<(PathBuf, u64, SystemTime), String>>,
    /// PATH lookups by (PATH, program name).
    found: Mutex<HashMap<(OsString, String), Option<PathBuf>>>,
    /// The folder declared-input globs are relative to, and folders below it never walked.
    root: PathBuf,
    skip: Vec<PathBuf>,
    /// Walks by glob list, with the generation they were made in.
    walks: Mutex<HashMap<Vec<String>, (u64, Matched)>>,
    /// Bumped by [`DigestCache::files_changed`]; a walk from an older generation is redone.
    generation: AtomicU64,
}

impl DigestCache {
    /// A cache for a run whose declared inputs are below `root`; `skip` are folders (the
    /// receipts folder) whose files are never inputs.
    pub fn new(root: PathBuf, skip: Vec<PathBuf>) -> DigestCache {
        // The root is canonical; skip paths are compared with walked paths, so they must
        // be spelled the same way.
        let skip = skip
            .into_iter()
            .map(|p| std::fs::canonicalize(&p).unwrap_or(p))
            .collect();
        DigestCache {
            map: Mutex::default(),
            found: Mutex::default(),
            root,
            skip,
            walks: Mutex::default(),
            generation: AtomicU64::new(0),
        }
    }

    /// Says that files below the root may have appeared or vanished (a setup ran), so the
    /// next cell that declares inputs walks again instead of using a list from before.
    pub fn files_changed(&self) {
        self.generation.fetch_add(1, Ordering::SeqCst);
    }

    /// The files `globs` match, sorted by path, each with its digest (path relative to the
    /// root, absolute for an external glob), and the globs that matched nothing. A file
    /// that vanishes before it is hashed is left out.
    pub fn declared_inputs(&self, globs: &[String]) -> Declared {
        if globs.is_empty() {
            return Declared::default();
        }
        let generation = self.generation.load(Ordering::SeqCst);
        let matched = {
            // The lock is held over the walk so that cells asking for the same list at
            // once wait for one walk instead of each making their own.
            let mut walks = self.walks.lock().unwrap_or_else(|p| p.into_inner());
            match walks.get(globs) {
                Some((g, m)) if *g == generation => Arc::clone(m),
                _ => {
                    let m: Matched = Arc::new(crate::plan::declared_inputs::expand(
                        &self.root, &self.skip, globs,
                    ));
                    walks.insert(globs.to_vec(), (generation, Arc::clone(&m)));
                    m
                }
            }
        };
        let files = matched
            .files
            .iter()
            .filter_map(|(rel, abs)| {
                self.digest(abs).map(|d| FileDigest {
                    path: rel.clone(),
                    ..d
                })
            })
            .collect();
        Declared {
            files,
            unmatched: matched.unmatched.clone(),
            external: matched.external.clone(),
        }
    }

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
/// binaries (the program and the needed setups' products), the declared input files, the
/// fingerprints, the code (the commit's tree, or `hermetic`) and, for compares, the policy.
pub fn inputs_digest(
    job: &CellJob,
    policy: Option<&Policy>,
    compare: Option<&(PathBuf, PathBuf)>,
) -> String {
    let mut value = serde_json::json!({
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
    // Only a cell that declares inputs gets the key, so the digest of every other cell is
    // what it was before declared inputs existed and `--resume` keeps their receipts.
    // Likewise only a cell that opts out of the determinism check gets `deterministic`.
    if !job.deterministic {
        value["deterministic"] = false.into();
    }
    value["code"] = job.code.clone().into();
    if !job.fingerprints.is_empty() {
        value["fingerprints"] = job
            .fingerprints
            .iter()
            .map(|f| serde_json::json!([f.name, f.sha256]))
            .collect();
    }
    if !job.expect_fail.is_empty() {
        value["expect_fail"] = serde_json::json!(job.expect_fail);
    }
    if !job.input_files.is_empty() {
        value["input_files"] = job
            .input_files
            .iter()
            .map(|f| serde_json::json!([f.path, f.sha256]))
            .collect();
    }
    sha256_hex(value.to_string().as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_glob_list_is_walked_once_until_files_change() {
        let dir = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(dir.path()).unwrap();
        std::fs::create_dir(root.join("lib")).unwrap();
        std::fs::write(root.join("lib/a.py"), "a").unwrap();
        let cache = DigestCache::new(root.clone(), vec![root.join("receipts")]);
        let globs = vec!["lib/*.py".to_string()];
        let paths = |c: &DigestCache| -> Vec<String> {
            c.declared_inputs(&globs)
                .files
                .into_iter()
                .map(|d| d.path)
                .collect()
        };
        assert_eq!(paths(&cache), ["lib/a.py"]);
        let first = cache.declared_inputs(&globs).files;
        assert_eq!(first[0].sha256, sha256_hex(b"a"));
        // A new file is not seen by cells of the same generation: the walk is shared.
        std::fs::write(root.join("lib/b.py"), "b").unwrap();
        assert_eq!(paths(&cache), ["lib/a.py"]);
        cache.files_changed();
        assert_eq!(paths(&cache), ["lib/a.py", "lib/b.py"]);
        assert_eq!(cache.declared_inputs(&[]), Declared::default());
    }
}
