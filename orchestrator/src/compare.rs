//! Compare nodes' work: read the reference's and the candidate's safetensors artifacts and
//! judge them with a [`Policy`]. A pure library function ([`compare_files`]) returning a
//! serializable [`CompareReport`]; it does not know about cells, receipts or the scheduler.
//! An artifact it cannot read is a [`CompareError`], recorded as text among the report's
//! failures. Files are opened through `attempt_file` (no link followed, never blocking,
//! regular files only); running a comparison against a deadline is the compare cell's job
//! (`executor::compare`), which can tell it to stop between tensors and rows.
//!
//! Files are memory-mapped and compared row by row (rows are the leading dimensions of a
//! tensor, the last one being the row length, e.g. `logits` [T, n_vocab]) in parallel.
//! Bitwise comparison first tests whole rows for byte equality and only walks rows that
//! differ, element by element as u32 bit patterns. Mapping, parsing and the arithmetic on
//! elements that `diff` shares are in [`crate::tensors`].

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use rayon::prelude::*;
use safetensors::{Dtype, SafeTensors};
use serde::{Deserialize, Serialize};

use crate::plan::Policy;
use crate::tensors::argmax_f32;

/// Format version of [`CompareReport`].
pub const COMPARE_REPORT_VERSION: u32 = 1;

/// Why an element or row counts as a mismatch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MismatchKind {
    /// The values differ (in bits, or beyond the tolerance).
    Value,
    /// The row's argmax differs; `index` is the reference's argmax.
    Argmax,
}

/// The first place the candidate disagrees with the reference.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Mismatch {
    pub tensor: String,
    /// `s` of a `step.<s>` tensor.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub step: Option<u64>,
    /// Flattened index over the leading dimensions.
    pub row: u64,
    /// Index inside the row.
    pub index: u64,
    #[serde(rename = "ref")]
    pub reference: f32,
    pub got: f32,
    pub kind: MismatchKind,
    /// For argmax mismatches: the candidate's argmax.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub got_argmax: Option<u64>,
}

/// What one tensor pair showed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TensorReport {
    pub name: String,
    pub shape: Vec<usize>,
    /// f32 values compared.
    pub values: u64,
    /// Elements that differ (bitwise) or exceed the tolerance.
    pub mismatches: u64,
    pub rows: u64,
    /// Rows whose argmax agrees (computed for argmax policies only, else 0).
    pub argmax_agree: u64,
    /// Largest |got - ref| (over elements compared in detail: every element for tolerance
    /// policies, the differing rows for bitwise).
    pub max_abs: f64,
    /// Largest |got - ref| / max(1, |ref|), over the same elements.
    pub max_rel: f64,
    pub first_mismatch: Option<Mismatch>,
}

/// The result of one comparison.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CompareReport {
    pub version: u32,
    pub reference: PathBuf,
    pub candidate: PathBuf,
    pub policy: Policy,
    /// Every reason the comparison failed; empty when it passed.
    pub failures: Vec<String>,
    pub tensors_compared: usize,
    pub values_compared: u64,
    pub mismatches: u64,
    pub rows: u64,
    pub argmax_agree: u64,
    pub tensors: Vec<TensorReport>,
    /// The first mismatch over all tensors (in name order).
    pub first_mismatch: Option<Mismatch>,
}

impl CompareReport {
    /// The report of a comparison of these files that has found nothing yet.
    pub fn new(reference: &Path, candidate: &Path, policy: &Policy) -> CompareReport {
        CompareReport {
            version: COMPARE_REPORT_VERSION,
            reference: reference.to_path_buf(),
            candidate: candidate.to_path_buf(),
            policy: policy.clone(),
            failures: Vec::new(),
            tensors_compared: 0,
            values_compared: 0,
            mismatches: 0,
            rows: 0,
            argmax_agree: 0,
            tensors: Vec::new(),
            first_mismatch: None,
        }
    }

    pub fn passed(&self) -> bool {
        self.failures.is_empty()
    }
}

/// An artifact file of a finished cell: the cell, its attempt folder and the file's path
/// below that folder (`artifacts/<name>`). Reading it never leaves the attempt folder
/// ([`crate::attempt_file`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArtifactPath {
    /// The cell id that wrote (or should have written) the file.
    pub cell: String,
    pub attempt: PathBuf,
    pub rel: PathBuf,
}

impl ArtifactPath {
    /// The file's full path, for messages and digests.
    pub fn full(&self) -> PathBuf {
        self.attempt.join(&self.rel)
    }
}

/// Compares `candidate` against `reference` under `policy`. Never panics on bad input: an
/// unreadable file, a missing tensor, a shape or dtype mismatch is a failure with its reason.
/// Each file is opened without following a link in its last component, without blocking,
/// and only if it is a regular file ([`crate::attempt_file::open_path`]).
pub fn compare_files(reference: &Path, candidate: &Path, policy: &Policy) -> CompareReport {
    let open = |path: &Path, side| {
        crate::attempt_file::open_path(path).map_err(|error| CompareError::Open { side, error })
    };
    compare_opened(
        (reference, open(reference, Side::Reference)),
        (candidate, open(candidate, Side::Candidate)),
        policy,
        &AtomicBool::new(false),
    )
}

/// Compares two files already opened (or the reasons they could not be). `stop` is looked
/// at between tensors and rows: once it is set the comparison ends early with a report that
/// means nothing, which the caller (a cell past its deadline, a cancelled run) drops.
pub fn compare_opened(
    (reference, r_file): (&Path, Result<File, CompareError>),
    (candidate, c_file): (&Path, Result<File, CompareError>),
    policy: &Policy,
    stop: &AtomicBool,
) -> CompareReport {
    let mut report = CompareReport::new(reference, candidate, policy);
    let (r_map, c_map) = match (
        r_file.and_then(|f| map(&f, reference, Side::Reference)),
        c_file.and_then(|f| map(&f, candidate, Side::Candidate)),
    ) {
        (Ok(r), Ok(c)) => (r, c),
        (r, c) => {
            report.failures.extend(r.err().map(|e| e.to_string()));
            report.failures.extend(c.err().map(|e| e.to_string()));
            return report;
        }
    };
    let (r, c) = match (
        parse(&r_map, reference, Side::Reference),
        parse(&c_map, candidate, Side::Candidate),
    ) {
        (Ok(r), Ok(c)) => (r, c),
        (r, c) => {
            report.failures.extend(r.err().map(|e| e.to_string()));
            report.failures.extend(c.err().map(|e| e.to_string()));
            return report;
        }
    };
    compare_tensors(&r, &c, policy, &mut report, stop);
    report
}

/// Which file of the pair an error is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    Reference,
    Candidate,
}

impl std::fmt::Display for Side {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Side::Reference => "reference",
            Side::Candidate => "candidate",
        })
    }
}

/// An artifact file that could not be read as safetensors. Its text is one of the
/// [`CompareReport::failures`], so it is part of the report format.
#[derive(Debug, thiserror::Error)]
pub enum CompareError {
    #[error("cannot open the {side} artifact: {error}")]
    Open {
        side: Side,
        error: crate::attempt_file::OpenError,
    },
    #[error("cannot map the {side} artifact {}: {error}", path.display())]
    Map {
        side: Side,
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("the {side} artifact {} is not a valid safetensors file: {error}", path.display())]
    Parse {
        side: Side,
        path: PathBuf,
        error: safetensors::SafeTensorError,
    },
}

fn map(file: &File, path: &Path, side: Side) -> Result<memmap2::Mmap, CompareError> {
    crate::tensors::map(file).map_err(|error| CompareError::Map {
        side,
        path: path.to_path_buf(),
        error,
    })
}

fn parse<'a>(bytes: &'a [u8], path: &Path, side: Side) -> Result<SafeTensors<'a>, CompareError> {
    crate::tensors::parse(bytes).map_err(|error| CompareError::Parse {
        side,
        path: path.to_path_buf(),
        error,
    })
}

/// Compares two parsed files (tensor sets) into `report`.
fn compare_tensors(
    r: &SafeTensors<'_>,
    c: &SafeTensors<'_>,
    policy: &Policy,
    report: &mut CompareReport,
    stop: &AtomicBool,
) {
    let mut r_names: Vec<&str> = r.names().into_iter().collect();
    r_names.sort_unstable();
    let mut c_names: Vec<&str> = c.names().into_iter().collect();
    c_names.sort_unstable();
    for name in &r_names {
        if c_names.binary_search(name).is_err() {
            report
                .failures
                .push(format!("tensor `{name}` is missing from the candidate"));
        }
    }
    for name in &c_names {
        if r_names.binary_search(name).is_err() {
            report.failures.push(format!(
                "tensor `{name}` is in the candidate but not in the reference"
            ));
        }
    }
    for name in r_names {
        if stop.load(Ordering::Relaxed) {
            return;
        }
        let (Ok(rt), Ok(ct)) = (r.tensor(name), c.tensor(name)) else {
            continue;
        };
        if rt.dtype() != ct.dtype() {
            report.failures.push(format!(
                "tensor `{name}`: dtype differs (reference {:?}, candidate {:?})",
                rt.dtype(),
                ct.dtype()
            ));
            continue;
        }
        if rt.shape() != ct.shape() {
            report.failures.push(format!(
                "tensor `{name}`: shape differs (reference {:?}, candidate {:?})",
                rt.shape(),
                ct.shape()
            ));
            continue;
        }
        if rt.dtype() != Dtype::F32 {
            report.failures.push(format!(
                "tensor `{name}`: dtype {:?} is not compared (artifacts hold F32 tensors)",
                rt.dtype()
            ));
            continue;
        }
        let t = compare_f32(name, rt.shape(), rt.data(), ct.data(), policy, stop);
        report.tensors_compared += 1;
        report.values_compared += t.values;
        report.mismatches += t.mismatches;
        report.rows += t.rows;
        report.argmax_agree += t.argmax_agree;
        if t.mismatches > 0 {
            let m = t.first_mismatch.as_ref().expect("a mismatch was recorded");
            report.failures.push(format!(
                "tensor `{name}`: {} of {} values {} (first at row {}, index {}: ref {:e}, got {:e})",
                t.mismatches,
                t.values,
                if matches!(policy, Policy::Bitwise) { "differ in bits" } else { "exceed the tolerance" },
                m.row,
                m.index,
                m.reference,
                m.got
            ));
        }
        if let Policy::Tolerance { argmax: true, .. } = policy
            && t.argmax_agree < t.rows
        {
            report.failures.push(format!(
                "tensor `{name}`: argmax differs on {} of {} rows",
                t.rows - t.argmax_agree,
                t.rows
            ));
        }
        if report.first_mismatch.is_none() {
            report.first_mismatch = t.first_mismatch.clone();
        }
        report.tensors.push(t);
    }
    if let Policy::ArgmaxAgree { min_agree } = policy
        && report.rows > 0
    {
        let frac = report.argmax_agree as f64 / report.rows as f64;
        if frac < *min_agree {
            report.failures.push(format!(
                "argmax agrees on {} of {} rows ({frac:.4}), below min_agree {min_agree}",
                report.argmax_agree, report.rows
            ));
        }
    }
    if report.tensors_compared == 0 && report.failures.is_empty() {
        report
            .failures
            .push("the artifacts hold no tensors to compare".into());
    }
}

/// Per-row findings, merged over rows.
#[derive(Debug, Clone, Copy, Default)]
struct RowStats {
    mismatches: u64,
    /// First mismatching index in the row, with its values.
    first: Option<(u64, f32, f32)>,
    max_abs: f64,
    max_rel: f64,
    argmax: Option<(u64, u64)>,
}

fn f32_at(b: &[u8], i: usize) -> f32 {
    f32::from_le_bytes([b[4 * i], b[4 * i + 1], b[4 * i + 2], b[4 * i + 3]])
}

/// |got - ref| and the relative error with denominator max(1, |ref|); NaN on exactly one
/// side counts as an infinite error, NaN on both sides (or equal infinities) as none.
fn errors(r: f32, g: f32) -> (f64, f64) {
    let d = crate::tensors::abs_error(f64::from(r), f64::from(g));
    (d, d / f64::from(r).abs().max(1.0))
}

fn compare_row(r: &[u8], g: &[u8], policy: &Policy) -> RowStats {
    let mut s = RowStats::default();
    let want_argmax = matches!(
        policy,
        Policy::ArgmaxAgree { .. } | Policy::Tolerance { argmax: true, .. }
    );
    if want_argmax {
        s.argmax = Some((argmax_f32(r), argmax_f32(g)));
    }
    if r == g {
        return s;
    }
    let (max_abs, max_rel) = match policy {
        Policy::Tolerance {
            max_abs, max_rel, ..
        } => (*max_abs, *max_rel),
        _ => (None, None),
    };
    for (i, (rc, gc)) in r.chunks_exact(4).zip(g.chunks_exact(4)).enumerate() {
        let rb = u32::from_le_bytes([rc[0], rc[1], rc[2], rc[3]]);
        let gb = u32::from_le_bytes([gc[0], gc[1], gc[2], gc[3]]);
        if rb == gb {
            continue;
        }
        let (rv, gv) = (f32::from_bits(rb), f32::from_bits(gb));
        let (d, rel) = errors(rv, gv);
        s.max_abs = s.max_abs.max(d);
        s.max_rel = s.max_rel.max(rel);
        let bad = match policy {
            Policy::Bitwise => true,
            Policy::Tolerance { .. } => {
                max_abs.is_some_and(|m| d > m) || max_rel.is_some_and(|m| rel > m)
            }
            Policy::ArgmaxAgree { .. } => false,
        };
        if bad {
            s.mismatches += 1;
            if s.first.is_none() {
                s.first = Some((i as u64, rv, gv));
            }
        }
    }
    s
}

/// Compares one F32 tensor pair given as little-endian bytes of equal length.
fn compare_f32(
    name: &str,
    shape: &[usize],
    r: &[u8],
    g: &[u8],
    policy: &Policy,
    stop: &AtomicBool,
) -> TensorReport {
    let values = (r.len() / 4) as u64;
    let row_len = shape.last().copied().filter(|&n| n > 0).unwrap_or(1);
    let row_bytes = row_len * 4;
    let rows = if r.is_empty() { 0 } else { r.len() / row_bytes };
    let stats: Vec<RowStats> = r
        .par_chunks(row_bytes)
        .zip(g.par_chunks(row_bytes))
        .map(|(a, b)| {
            if stop.load(Ordering::Relaxed) {
                RowStats::default()
            } else {
                compare_row(a, b, policy)
            }
        })
        .collect();
    let step = name.strip_prefix("step.").and_then(|s| s.parse().ok());
    let mut t = TensorReport {
        name: name.to_string(),
        shape: shape.to_vec(),
        values,
        mismatches: 0,
        rows: rows as u64,
        argmax_agree: 0,
        max_abs: 0.0,
        max_rel: 0.0,
        first_mismatch: None,
    };
    let mut first_argmax_flip = None;
    for (row, s) in stats.iter().enumerate() {
        t.mismatches += s.mismatches;
        t.max_abs = t.max_abs.max(s.max_abs);
        t.max_rel = t.max_rel.max(s.max_rel);
        if t.first_mismatch.is_none()
            && let Some((index, rv, gv)) = s.first
        {
            t.first_mismatch = Some(Mismatch {
                tensor: name.to_string(),
                step,
                row: row as u64,
                index,
                reference: rv,
                got: gv,
                kind: MismatchKind::Value,
                got_argmax: None,
            });
        }
        if let Some((ra, ga)) = s.argmax {
            if ra == ga {
                t.argmax_agree += 1;
            } else if first_argmax_flip.is_none() {
                let base = row * row_bytes;
                first_argmax_flip = Some(Mismatch {
                    tensor: name.to_string(),
                    step,
                    row: row as u64,
                    index: ra,
                    reference: f32_at(&r[base..], ra as usize),
                    got: f32_at(&g[base..], ra as usize),
                    kind: MismatchKind::Argmax,
                    got_argmax: Some(ga),
                });
            }
        }
    }
    if t.first_mismatch.is_none() {
        t.first_mismatch = first_argmax_flip;
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes(v: &[f32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    #[test]
    fn relative_error_uses_max_one_denominator() {
        assert_eq!(errors(0.5, 0.75), (0.25, 0.25));
        assert_eq!(errors(4.0, 5.0), (1.0, 0.25));
        assert_eq!(errors(f32::NAN, f32::NAN), (0.0, 0.0));
        assert_eq!(errors(1.0, f32::NAN).0, f64::INFINITY);
        assert_eq!(errors(f32::INFINITY, f32::INFINITY), (0.0, 0.0));
    }

    #[test]
    fn rows_and_indices_of_the_first_mismatch() {
        let r = bytes(&[0.0, 1.0, 2.0, 3.0, 4.0, 5.0]);
        let g = bytes(&[0.0, 1.0, 2.0, 3.0, 4.5, 5.0]);
        let t = compare_f32(
            "step.7",
            &[2, 3],
            &r,
            &g,
            &Policy::Bitwise,
            &AtomicBool::new(false),
        );
        assert_eq!(t.rows, 2);
        assert_eq!(t.mismatches, 1);
        let m = t.first_mismatch.unwrap();
        assert_eq!(
            (m.step, m.row, m.index, m.reference, m.got),
            (Some(7), 1, 1, 4.0, 4.5)
        );
    }

    #[test]
    fn argmax_flip_is_reported_at_the_reference_argmax() {
        let r = bytes(&[0.0, 2.0, 1.0]);
        let g = bytes(&[0.0, 1.0, 2.0]);
        let t = compare_f32(
            "logits",
            &[1, 3],
            &r,
            &g,
            &Policy::ArgmaxAgree { min_agree: 1.0 },
            &AtomicBool::new(false),
        );
        assert_eq!(t.argmax_agree, 0);
        let m = t.first_mismatch.unwrap();
        assert_eq!(
            (m.kind, m.index, m.got_argmax),
            (MismatchKind::Argmax, 1, Some(2))
        );
    }
}
