//! Reading a whole receipt tree into memory for `diff` and `show`: `run.json` and every node
//! receipt its index names, read in parallel (a 10,000-node tree is 10,000 small files) —
//! a receipt the run carried forward from an earlier run is read from that run's tree —
//! and finding one node of it by what a user typed ([`find`]).
//!
//! It reads only; where a tree is (commit-ish, folder, `latest`) is `resolve`'s job.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use rayon::prelude::*;
use serde::de::DeserializeOwned;

use super::error::{FindError, ReceiptError, ReceiptErrorKind as Kind};
use super::tree::Tree;
use super::{NodeIndexEntry, NodeReceipt, RunReceipt, read_json};

/// One node of a loaded run: its index row and, when the run wrote one, its receipt (the
/// whole [`NodeReceipt`], or a leaner view that skips what the reader does not need).
#[derive(Debug, Clone)]
pub struct LoadedNode<R = NodeReceipt> {
    pub entry: NodeIndexEntry,
    pub receipt: Option<R>,
}

/// A receipt tree in memory.
#[derive(Debug, Clone)]
pub struct LoadedRun<R = NodeReceipt> {
    pub dir: PathBuf,
    pub run: RunReceipt,
    /// Nodes by cell id.
    pub nodes: BTreeMap<String, LoadedNode<R>>,
}

/// The index rows of the receipts a run wrote into its `nodes/` as its cells finished,
/// read from the receipts themselves: the index of a run killed before it could rewrite its
/// `run.json`. A folder without a readable receipt (a cell killed mid-way) is left out.
pub fn written_entries(dir: &Path) -> Vec<NodeIndexEntry> {
    let tree = Tree {
        dir: dir.to_path_buf(),
    };
    let Ok(folders) = std::fs::read_dir(tree.nodes()) else {
        return Vec::new();
    };
    let slugs: Vec<String> = folders
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    slugs
        .par_iter()
        .filter_map(|slug| {
            let r: NodeReceipt = read_json(&tree.receipt_json(slug)).ok().flatten()?;
            // A receipt is filed under its own slug; anything else was not written here.
            (r.slug == *slug).then(|| NodeIndexEntry {
                warns: u32::try_from(r.warnings().len()).unwrap_or(u32::MAX),
                warning: r.warning_line(),
                id: r.id,
                kind: r.kind,
                slug: Some(r.slug),
                verdict: r.verdict,
                seconds: r.seconds,
                reason: r.reason,
                carried: None,
            })
        })
        .collect()
}

/// Loads the tree at `dir` (the folder holding `run.json`) with whole receipts.
pub fn load(dir: &Path) -> Result<LoadedRun, ReceiptError> {
    load_as(dir)
}

/// Loads the tree at `dir`, reading each receipt as `R`. Fields `R` does not name are
/// skipped by the parser without being stored, which is what makes a 10,000-node diff
/// fast: the environment maps alone are most of a receipt.
pub fn load_as<R: DeserializeOwned + Send>(dir: &Path) -> Result<LoadedRun<R>, ReceiptError> {
    let tree = Tree {
        dir: dir.to_path_buf(),
    };
    let run: RunReceipt =
        read_json(&tree.run_json())?.ok_or_else(|| ReceiptError::new(dir, Kind::NoRunJson))?;
    let loaded: Vec<Result<(String, LoadedNode<R>), ReceiptError>> = run
        .nodes
        .par_iter()
        .map(|entry| {
            let receipt = match &entry.slug {
                // The slug comes from a file; a hand-edited one must not lead outside the tree.
                Some(slug) if !is_plain_name(slug) => {
                    return Err(ReceiptError::new(
                        tree.run_json(),
                        Kind::BadSlug {
                            id: entry.id.clone(),
                            slug: slug.clone(),
                        },
                    ));
                }
                Some(slug) => match &entry.carried {
                    None => read_json(&tree.receipt_json(slug))?,
                    Some(carried) => {
                        let dir = tree.carried_node_dir(carried, slug).ok_or_else(|| {
                            ReceiptError::new(
                                tree.run_json(),
                                Kind::BadCarry {
                                    id: entry.id.clone(),
                                    from: carried.from.clone(),
                                },
                            )
                        })?;
                        let receipt = read_json(&dir.join("receipt.json"))?;
                        if receipt.is_none() {
                            return Err(ReceiptError::new(
                                dir.join("receipt.json"),
                                Kind::CarriedMissing {
                                    id: entry.id.clone(),
                                    run: carried.label(),
                                },
                            ));
                        }
                        receipt
                    }
                },
                None => None,
            };
            Ok((
                entry.id.clone(),
                LoadedNode {
                    entry: entry.clone(),
                    receipt,
                },
            ))
        })
        .collect();
    let mut nodes = BTreeMap::new();
    for item in loaded {
        let (id, node) = item?;
        nodes.insert(id, node);
    }
    Ok(LoadedRun {
        dir: dir.to_path_buf(),
        run,
        nodes,
    })
}

/// Finds a node by exact id, by slug, or by a glob over ids (which must match exactly one).
pub fn find<'a>(run: &'a LoadedRun, query: &str) -> Result<&'a LoadedNode, FindError> {
    if let Some(n) = run.nodes.get(query) {
        return Ok(n);
    }
    if let Some(n) = run
        .nodes
        .values()
        .find(|n| n.entry.slug.as_deref() == Some(query))
    {
        return Ok(n);
    }
    let glob = globset::Glob::new(query).map(|g| g.compile_matcher());
    let hits: Vec<&LoadedNode> = match &glob {
        Ok(m) => run
            .nodes
            .values()
            .filter(|n| m.is_match(&n.entry.id))
            .collect(),
        Err(_) => Vec::new(),
    };
    match hits.as_slice() {
        [one] => Ok(one),
        [] => {
            let near = crate::words::diagnostics::did_you_mean(
                query,
                run.nodes.keys().map(String::as_str),
            );
            Err(FindError::NoNode {
                dir: run.dir.clone(),
                query: query.to_string(),
                near: near.map(|n| n.to_string()),
            })
        }
        many => Err(FindError::ManyNodes {
            query: query.to_string(),
            matches: many.iter().map(|n| n.entry.id.clone()).collect(),
        }),
    }
}

/// A single path component that is not `.` or `..`.
pub fn is_plain_name(s: &str) -> bool {
    !s.is_empty() && s != "." && s != ".." && !s.contains('/') && !s.contains('\\')
}
