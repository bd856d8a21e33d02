//! Compare nodes' work: read the reference's and the candidate's safetensors artifacts and
//! judge them with a [`Policy`]. A pure library function ([`compare_files`]) returning a
//! serializable [`CompareReport`]; it does not know about cells, receipts or the scheduler.
//! An artifact it cannot read is a [`CompareError`], recorded as text among the report's
//! failures. Files are opened through `attempt_file` (no link followed, never blocking,
//! regular files only); running a comparison against a deadline is the compare cell's job
//! (`executor::compare`), which can tell it to stop between tensors and rows.
//!
//! Files are memory-mapped and compared row by row (rows are the leading dimensions of a
//! tensor, the last one being the row length, e.g. `logits` [T, n_vocab]) in parallel, in
//! the tensor's own dtype (every dtype [`crate::gate::tensors::with_element`] reads). Every row is
//! first tested for byte equality; only rows that differ are walked element by element.
//! Integer and bool tensors compare exactly under every policy. Mapping, parsing and the
//! arithmetic on elements that `diff` shares are in [`crate::gate::tensors`].

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use rayon::prelude::*;
use safetensors::SafeTensors;
use serde::{Deserialize, Serialize};

use crate::gate::tensors::{Element, ElementFn, with_element};
use crate::plan::Policy;

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
    /// A token stream parts here: `row` is the sequence, `index` the step.
    Tokens,
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
    /// The two values as their dtype holds them (integers exactly up to 2^53).
    #[serde(rename = "ref")]
    pub reference: f64,
    pub got: f64,
    pub kind: MismatchKind,
    /// For argmax mismatches: the candidate's argmax.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub got_argmax: Option<u64>,
}

/// What one tensor pair showed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TensorReport {
    pub name: String,
    /// The safetensors dtype (`F32`, `BF16`, `I32`); empty in reports written before every
    /// dtype was compared (those held F32 only).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub dtype: String,
    pub shape: Vec<usize>,
    /// Elements compared.
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
    /// Largest distance in units in the last place of the tensor's dtype, over the same
    /// elements (absent in older reports).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_ulp: Option<u64>,
    /// The `kl` policy's numbers: mean and largest per-row KL divergence (nats).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kl_mean: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kl_max: Option<f64>,
    /// The `topk` policy's numbers: the smallest and the mean per-row overlap (0..=1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topk_min_overlap: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topk_mean_overlap: Option<f64>,
    /// The `tokens` policy's numbers: sequences that part, and where each parts (the
    /// first [`DIVERGENCES_KEPT`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub diverged: Option<u64>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub divergences: Vec<Divergence>,
    pub first_mismatch: Option<Mismatch>,
}

/// How many parting sequences a tensor's report lists.
pub const DIVERGENCES_KEPT: usize = 100;

/// Where one token stream parts from its reference.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Divergence {
    /// The sequence (flattened index over the leading dimensions).
    pub row: u64,
    /// The first step at which the two streams differ.
    pub step: u64,
    #[serde(rename = "ref")]
    pub reference: f64,
    pub got: f64,
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
    /// Over all tensors, as [`TensorReport`]'s fields of the same names (the KL mean is
    /// over all rows); absent where the policy does not produce them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kl_mean: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kl_max: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topk_min_overlap: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_ulp: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub diverged: Option<u64>,
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
            kl_mean: None,
            kl_max: None,
            topk_min_overlap: None,
            max_ulp: None,
            diverged: None,
        }
    }

    pub fn passed(&self) -> bool {
        self.failures.is_empty()
    }
}

/// An artifact file of a finished cell: the cell, its attempt folder and the file's path
/// below that folder (`artifacts/<name>`). Reading it never leaves the attempt folder
/// ([`crate::gate::attempt_file`]).
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
/// and only if it is a regular file ([`crate::gate::attempt_file::open_path`]).
pub fn compare_files(reference: &Path, candidate: &Path, policy: &Policy) -> CompareReport {
    let open = |path: &Path, side| {
        crate::gate::attempt_file::open_path(path)
            .map_err(|error| CompareError::Open { side, error })
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
        error: crate::gate::attempt_file::OpenError,
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
    crate::gate::tensors::map(file).map_err(|error| CompareError::Map {
        side,
        path: path.to_path_buf(),
        error,
    })
}

fn parse<'a>(bytes: &'a [u8], path: &Path, side: Side) -> Result<SafeTensors<'a>, CompareError> {
    crate::gate::tensors::parse(bytes).map_err(|error| CompareError::Parse {
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
    let (mut kl_sum, mut kl_rows) = (0.0f64, 0u64);
    // Rows of float tensors: the only ones that have an argmax.
    let mut argmax_rows = 0u64;
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
        let pair = Pair {
            name,
            shape: rt.shape(),
            r: rt.data(),
            g: ct.data(),
            policy,
            stop,
        };
        let Some(typed) = with_element(rt.dtype(), pair) else {
            report.failures.push(format!(
                "tensor `{name}`: dtype {:?} is not compared (memra-orch compares F64, F32, \
                 F16, BF16, signed and unsigned integers and BOOL); write the artifact in one \
                 of those",
                rt.dtype()
            ));
            continue;
        };
        if stop.load(Ordering::Relaxed) {
            return;
        }
        report.failures.extend(judge_tensor(&typed, policy));
        if typed.float {
            argmax_rows += typed.report.rows;
        }
        let t = typed.report;
        report.tensors_compared += 1;
        report.values_compared += t.values;
        report.mismatches += t.mismatches;
        report.rows += t.rows;
        report.argmax_agree += t.argmax_agree;
        report.max_ulp = report.max_ulp.max(t.max_ulp);
        if let (Some(mean), Some(max)) = (t.kl_mean, t.kl_max) {
            kl_sum += mean * t.rows as f64;
            kl_rows += t.rows;
            report.kl_max = Some(report.kl_max.map_or(max, |m: f64| m.max(max)));
        }
        if let Some(o) = t.topk_min_overlap {
            report.topk_min_overlap = Some(report.topk_min_overlap.map_or(o, |m: f64| m.min(o)));
        }
        if let Some(d) = t.diverged {
            report.diverged = Some(report.diverged.unwrap_or(0) + d);
        }
        if report.first_mismatch.is_none() {
            report.first_mismatch = t.first_mismatch.clone();
        }
        report.tensors.push(t);
    }
    if kl_rows > 0 {
        report.kl_mean = Some(kl_sum / kl_rows as f64);
    }
    match policy {
        Policy::ArgmaxAgree { min_agree } if argmax_rows > 0 => {
            let frac = report.argmax_agree as f64 / argmax_rows as f64;
            if frac < *min_agree {
                report.failures.push(format!(
                    "argmax agrees on {} of {argmax_rows} rows ({frac:.4}), below min_agree \
                     {min_agree}",
                    report.argmax_agree
                ));
            }
        }
        Policy::Kl {
            max_mean: Some(bound),
            ..
        } => {
            if let Some(mean) = report.kl_mean
                && exceeds(mean, *bound)
            {
                report.failures.push(format!(
                    "kl: the mean KL divergence over {kl_rows} rows is {mean:.3e}, above kl_mean \
                     {bound:e}"
                ));
            }
        }
        _ => {}
    }
    let judges_floats = matches!(
        policy,
        Policy::Kl { .. }
            | Policy::TopK { .. }
            | Policy::ArgmaxAgree { .. }
            | Policy::Tolerance { argmax: true, .. }
    );
    if judges_floats && report.tensors_compared > 0 && argmax_rows == 0 {
        report.failures.push(format!(
            "{}: no floating-point tensor to judge (integer tensors compare exactly, which they \
             did); use policy \"bitwise\" or \"tokens\" for integer artifacts",
            policy.name()
        ));
    }
    if report.tensors_compared == 0 && report.failures.is_empty() {
        report
            .failures
            .push("the artifacts hold no tensors to compare".into());
    }
}

/// The failures one tensor shows under `policy`, each naming the tensor, its dtype and the
/// policy that produced the number.
fn judge_tensor(typed: &Typed, policy: &Policy) -> Vec<String> {
    let t = &typed.report;
    let mut failures = Vec::new();
    let name = &t.name;
    let dtype = &t.dtype;
    if t.mismatches > 0 {
        let m = t.first_mismatch.as_ref().expect("a mismatch was recorded");
        let what = if !typed.float {
            "differ (integer tensors compare exactly)".to_string()
        } else {
            match policy {
                Policy::Tolerance { .. } => "exceed the tolerance".to_string(),
                Policy::Ulp { max_ulp } => format!("are more than {max_ulp} ulp apart"),
                _ => "differ in bits".to_string(),
            }
        };
        let m = t
            .first_mismatch
            .as_ref()
            .filter(|m| m.kind != MismatchKind::Argmax)
            .unwrap_or(m);
        failures.push(format!(
            "tensor `{name}` ({dtype}): {} of {} values {what} (first at row {}, index {}: ref \
             {}, got {})",
            t.mismatches,
            t.values,
            m.row,
            m.index,
            shown(m.reference, typed.float),
            shown(m.got, typed.float)
        ));
    }
    match policy {
        Policy::Kl { .. } | Policy::TopK { .. }
            if typed.float && t.rows > 0 && short_rows(t, policy) =>
        {
            failures.push(format!(
                "tensor `{name}` ({dtype}): {}: rows of {} value{} cannot be judged by it \
                 (a softmax of one value is always 1; a top k of no more than k values always \
                 overlaps); compare this tensor bitwise or in a file of its own",
                policy.name(),
                t.shape.last().copied().unwrap_or(1),
                if t.shape.last().copied().unwrap_or(1) == 1 {
                    ""
                } else {
                    "s"
                },
            ));
        }
        Policy::Tolerance { argmax: true, .. } if t.argmax_agree < t.rows && typed.float => {
            failures.push(format!(
                "tensor `{name}` ({dtype}): argmax differs on {} of {} rows",
                t.rows - t.argmax_agree,
                t.rows
            ));
        }
        Policy::Kl {
            max: Some(bound), ..
        } => {
            if let (Some(max), Some(row)) = (t.kl_max, typed.kl_worst_row)
                && exceeds(max, *bound)
            {
                failures.push(format!(
                    "tensor `{name}` ({dtype}): kl: the KL divergence of row {row} is \
                     {max:.3e}, above kl_max {bound:e}"
                ));
            }
        }
        Policy::TopK { k, min_overlap } => {
            if let (Some(min), Some(row)) = (t.topk_min_overlap, typed.topk_worst_row)
                && min < *min_overlap
            {
                failures.push(format!(
                    "tensor `{name}` ({dtype}): topk: row {row} shares {:.0} of its top {k} \
                     ({min:.3}), below min_overlap {min_overlap}",
                    min * (*k).min(t.shape.last().copied().unwrap_or(1) as u64) as f64
                ));
            }
        }
        Policy::Tokens { min_prefix } if typed.parted_early > 0 => {
            let early = |d: &&Divergence| min_prefix.is_none_or(|n| d.step < n);
            let Some(d) = t.divergences.iter().find(early) else {
                failures.push(format!(
                    "tensor `{name}` ({dtype}): tokens: {} of {} sequences part too early",
                    typed.parted_early, t.rows
                ));
                return failures;
            };
            let bound = match min_prefix {
                Some(n) => format!(" before step {n}"),
                None => String::new(),
            };
            failures.push(format!(
                "tensor `{name}` ({dtype}): tokens: {} of {} sequences part{bound} (first: \
                 sequence {} at step {}: ref {}, got {})",
                typed.parted_early, t.rows, d.row, d.step, d.reference, d.got
            ));
        }
        _ => {}
    }
    failures
}

/// Whether a tensor's rows are too short for the `kl` or `topk` policy to tell anything.
fn short_rows(t: &TensorReport, policy: &Policy) -> bool {
    let len = t.shape.last().copied().unwrap_or(1) as u64;
    match policy {
        Policy::Kl { .. } => len <= 1,
        Policy::TopK { k, .. } => len <= *k,
        _ => false,
    }
}

/// Whether `x` is past `bound`; NaN always is (never a pass).
fn exceeds(x: f64, bound: f64) -> bool {
    x.is_nan() || x > bound
}

/// A value for a message: integers as they are, floats in exponent form.
fn shown(v: f64, float: bool) -> String {
    if float {
        format!("{v:e}")
    } else {
        format!("{v}")
    }
}

/// One tensor pair to compare in its own dtype ([`with_element`] picks the type).
struct Pair<'a> {
    name: &'a str,
    shape: &'a [usize],
    r: &'a [u8],
    g: &'a [u8],
    policy: &'a Policy,
    stop: &'a AtomicBool,
}

/// A tensor's report and what judging it needs beyond it.
struct Typed {
    report: TensorReport,
    float: bool,
    kl_worst_row: Option<u64>,
    topk_worst_row: Option<u64>,
    /// Sequences that part before the `tokens` policy's `min_prefix` (all that part without).
    parted_early: u64,
}

impl ElementFn for Pair<'_> {
    type Out = Typed;
    fn call<E: Element>(self) -> Typed {
        compare_typed::<E>(self)
    }
}

/// Per-row findings, merged over rows.
#[derive(Debug, Clone, Copy, Default)]
struct RowStats {
    mismatches: u64,
    /// First mismatching index in the row, with its values.
    first: Option<(u64, f64, f64)>,
    max_abs: f64,
    max_rel: f64,
    max_ulp: u64,
    argmax: Option<(u64, u64)>,
    kl: Option<f64>,
    overlap: Option<f64>,
    /// Where an integer stream parts under the `tokens` policy: step, ref, got.
    parts: Option<(u64, f64, f64)>,
}

fn compare_row<E: Element>(r: &[u8], g: &[u8], policy: &Policy) -> RowStats {
    let mut s = RowStats::default();
    let same = r == g;
    if E::FLOAT {
        if policy.wants_argmax() {
            // The argmax of a row of NaN only is 0, and its value NaN: such a row has no
            // argmax, which agrees with nothing but another row of NaN only.
            let best = |row: &[u8]| {
                let i = E::row_argmax(row);
                let v = E::read(&row[i as usize * E::BYTES..]).value();
                if v.is_nan() { u64::MAX } else { i }
            };
            s.argmax = Some((best(r), best(g)));
        }
        match policy {
            Policy::Kl { .. } => s.kl = Some(if same { 0.0 } else { kl_row::<E>(r, g) }),
            Policy::TopK { k, .. } => {
                s.overlap = Some(if same {
                    1.0
                } else {
                    topk_overlap::<E>(r, g, *k)
                })
            }
            _ => {}
        }
    }
    if same {
        return s;
    }
    let exact = !E::FLOAT || matches!(policy, Policy::Bitwise | Policy::Tokens { .. });
    let tokens = !E::FLOAT && matches!(policy, Policy::Tokens { .. });
    for (i, (rc, gc)) in r
        .chunks_exact(E::BYTES)
        .zip(g.chunks_exact(E::BYTES))
        .enumerate()
    {
        if rc == gc {
            continue;
        }
        let (rv, gv) = (E::read(rc), E::read(gc));
        let (a, b) = (rv.value(), gv.value());
        let d = crate::gate::tensors::abs_error(a, b);
        let rel = d / a.abs().max(1.0);
        // NaN against a number is infinitely far in every policy, ulp included.
        let ulp = if a.is_nan() != b.is_nan() {
            u64::MAX
        } else {
            u64::try_from((rv.position() - gv.position()).unsigned_abs()).unwrap_or(u64::MAX)
        };
        s.max_abs = s.max_abs.max(d);
        s.max_rel = s.max_rel.max(rel);
        s.max_ulp = s.max_ulp.max(ulp);
        let bad = (exact && !tokens)
            || match policy {
                Policy::Tolerance {
                    max_abs, max_rel, ..
                } => max_abs.is_some_and(|m| d > m) || max_rel.is_some_and(|m| rel > m),
                Policy::Ulp { max_ulp } => ulp > *max_ulp,
                _ => false,
            };
        if bad {
            s.mismatches += 1;
            if s.first.is_none() {
                s.first = Some((i as u64, rv.shown(), gv.shown()));
            }
        }
        if tokens && s.parts.is_none() {
            s.parts = Some((i as u64, rv.shown(), gv.shown()));
            // A part at or after `min_prefix` is allowed: no mismatch to show for it.
            if let Policy::Tokens { min_prefix } = policy
                && min_prefix.is_none_or(|n| (i as u64) < n)
            {
                s.first = s.parts;
            }
        }
    }
    s
}

/// log Σ exp(v) over a row, or `None` when a value is NaN or +∞ (not a distribution's
/// logits) or every value is -∞.
fn log_sum_exp<E: Element>(b: &[u8]) -> Option<f64> {
    let mut max = f64::NEG_INFINITY;
    for c in b.chunks_exact(E::BYTES) {
        let v = E::read(c).value();
        if v.is_nan() || v == f64::INFINITY {
            return None;
        }
        max = max.max(v);
    }
    if max == f64::NEG_INFINITY {
        return None;
    }
    let sum: f64 = b
        .chunks_exact(E::BYTES)
        .map(|c| (E::read(c).value() - max).exp())
        .sum();
    Some(max + sum.ln())
}

/// KL(softmax(r) || softmax(g)) in f64, in nats; infinite when either row is not a
/// distribution's logits or `g` gives no mass where `r` gives some.
fn kl_row<E: Element>(r: &[u8], g: &[u8]) -> f64 {
    let (Some(lr), Some(lg)) = (log_sum_exp::<E>(r), log_sum_exp::<E>(g)) else {
        return f64::INFINITY;
    };
    let mut kl = 0.0f64;
    for (rc, gc) in r.chunks_exact(E::BYTES).zip(g.chunks_exact(E::BYTES)) {
        let lp = E::read(rc).value() - lr;
        if lp == f64::NEG_INFINITY {
            continue;
        }
        let lq = E::read(gc).value() - lg;
        if lq == f64::NEG_INFINITY {
            return f64::INFINITY;
        }
        kl += lp.exp() * (lp - lq);
    }
    kl.max(0.0)
}

/// The indices of the `k` largest values of a row (NaN never counts; ties go to the lower
/// index), unordered.
fn top_k<E: Element>(b: &[u8], k: usize) -> Vec<usize> {
    let mut v: Vec<(f64, usize)> = b
        .chunks_exact(E::BYTES)
        .map(|c| E::read(c).value())
        .enumerate()
        .filter(|(_, x)| !x.is_nan())
        .map(|(i, x)| (x, i))
        .collect();
    let order = |a: &(f64, usize), b: &(f64, usize)| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1));
    if v.len() > k && k > 0 {
        v.select_nth_unstable_by(k - 1, order);
    }
    v.truncate(k);
    v.into_iter().map(|(_, i)| i).collect()
}

/// |top-k(r) ∩ top-k(g)| / k, with k no larger than the row; 0 when the candidate has a NaN
/// where the reference has a number (NaN is never ranked, so it would slip past).
fn topk_overlap<E: Element>(r: &[u8], g: &[u8], k: u64) -> f64 {
    let nan_at = |b: &[u8], i: usize| E::read(&b[i * E::BYTES..]).value().is_nan();
    if (0..r.len() / E::BYTES).any(|i| nan_at(g, i) && !nan_at(r, i)) {
        return 0.0;
    }
    let k = usize::try_from(k)
        .unwrap_or(usize::MAX)
        .min(r.len() / E::BYTES);
    if k == 0 {
        return 1.0;
    }
    let mut a = top_k::<E>(r, k);
    a.sort_unstable();
    let shared = top_k::<E>(g, k)
        .iter()
        .filter(|i| a.binary_search(i).is_ok())
        .count();
    shared as f64 / k as f64
}

/// Compares one tensor pair of element type `E` given as little-endian bytes of equal
/// length.
fn compare_typed<E: Element>(p: Pair<'_>) -> Typed {
    let Pair {
        name,
        shape,
        r,
        g,
        policy,
        stop,
    } = p;
    let values = (r.len() / E::BYTES) as u64;
    let row_len = shape.last().copied().filter(|&n| n > 0).unwrap_or(1);
    // A tensor with no elements has no rows, whatever its last dimension says ([0, 2^62]
    // is a valid header whose row length in bytes would overflow).
    let row_bytes = match row_len.checked_mul(E::BYTES) {
        Some(b) if !r.is_empty() => b,
        _ => r.len().max(E::BYTES),
    };
    let rows = if r.is_empty() { 0 } else { r.len() / row_bytes };
    let stats: Vec<RowStats> = r
        .par_chunks(row_bytes)
        .zip(g.par_chunks(row_bytes))
        .map(|(a, b)| {
            if stop.load(Ordering::Relaxed) {
                RowStats::default()
            } else {
                compare_row::<E>(a, b, policy)
            }
        })
        .collect();
    let step = name.strip_prefix("step.").and_then(|s| s.parse().ok());
    let tokens = !E::FLOAT && matches!(policy, Policy::Tokens { .. });
    let mut t = TensorReport {
        name: name.to_string(),
        dtype: E::NAME.to_string(),
        shape: shape.to_vec(),
        values,
        mismatches: 0,
        rows: rows as u64,
        argmax_agree: 0,
        max_abs: 0.0,
        max_rel: 0.0,
        max_ulp: Some(0),
        kl_mean: None,
        kl_max: None,
        topk_min_overlap: None,
        topk_mean_overlap: None,
        diverged: tokens.then_some(0),
        divergences: Vec::new(),
        first_mismatch: None,
    };
    let (mut kl_worst_row, mut topk_worst_row, mut parted_early) = (None, None, 0);
    let mut first_argmax_flip = None;
    let (mut kl_sum, mut overlap_sum) = (0.0f64, 0.0f64);
    let min_prefix = match policy {
        Policy::Tokens { min_prefix } => *min_prefix,
        _ => None,
    };
    for (row, s) in stats.iter().enumerate() {
        t.mismatches += s.mismatches;
        t.max_abs = t.max_abs.max(s.max_abs);
        t.max_rel = t.max_rel.max(s.max_rel);
        t.max_ulp = t.max_ulp.max(Some(s.max_ulp));
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
                kind: if tokens {
                    MismatchKind::Tokens
                } else {
                    MismatchKind::Value
                },
                got_argmax: None,
            });
        }
        if let Some((ra, ga)) = s.argmax {
            if ra == ga {
                t.argmax_agree += 1;
            } else if first_argmax_flip.is_none() {
                let base = row * row_bytes;
                let at = |b: &[u8]| E::read(&b[base + ra as usize * E::BYTES..]).shown();
                first_argmax_flip = Some(Mismatch {
                    tensor: name.to_string(),
                    step,
                    row: row as u64,
                    index: ra,
                    reference: at(r),
                    got: at(g),
                    kind: MismatchKind::Argmax,
                    got_argmax: Some(ga),
                });
            }
        }
        if let Some(kl) = s.kl {
            kl_sum += kl;
            if t.kl_max.is_none_or(|m| exceeds(kl, m)) {
                t.kl_max = Some(kl);
                kl_worst_row = Some(row as u64);
            }
        }
        if let Some(o) = s.overlap {
            overlap_sum += o;
            if t.topk_min_overlap.is_none_or(|m| o < m) {
                t.topk_min_overlap = Some(o);
                topk_worst_row = Some(row as u64);
            }
        }
        if let Some((step_at, rv, gv)) = s.parts {
            *t.diverged.get_or_insert(0) += 1;
            if min_prefix.is_none_or(|n| step_at < n) {
                parted_early += 1;
            }
            if t.divergences.len() < DIVERGENCES_KEPT {
                t.divergences.push(Divergence {
                    row: row as u64,
                    step: step_at,
                    reference: rv,
                    got: gv,
                });
            }
        }
    }
    if rows > 0 {
        if t.kl_max.is_some() {
            t.kl_mean = Some(kl_sum / rows as f64);
        }
        if t.topk_min_overlap.is_some() {
            t.topk_mean_overlap = Some(overlap_sum / rows as f64);
        }
    }
    if t.first_mismatch.is_none() {
        t.first_mismatch = first_argmax_flip;
    }
    Typed {
        report: t,
        float: E::FLOAT,
        kl_worst_row,
        topk_worst_row,
        parted_early,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes(v: &[f32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    fn typed<E: Element>(name: &str, shape: &[usize], r: &[u8], g: &[u8], p: &Policy) -> Typed {
        compare_typed::<E>(Pair {
            name,
            shape,
            r,
            g,
            policy: p,
            stop: &AtomicBool::new(false),
        })
    }

    fn f32s(name: &str, shape: &[usize], r: &[f32], g: &[f32], p: &Policy) -> TensorReport {
        typed::<f32>(name, shape, &bytes(r), &bytes(g), p).report
    }

    #[test]
    fn rows_and_indices_of_the_first_mismatch() {
        let r = [0.0, 1.0, 2.0, 3.0, 4.0, 5.0];
        let g = [0.0, 1.0, 2.0, 3.0, 4.5, 5.0];
        let t = f32s("step.7", &[2, 3], &r, &g, &Policy::Bitwise);
        assert_eq!(t.rows, 2);
        assert_eq!(t.mismatches, 1);
        assert_eq!(t.dtype, "F32");
        let m = t.first_mismatch.unwrap();
        assert_eq!(
            (m.step, m.row, m.index, m.reference, m.got),
            (Some(7), 1, 1, 4.0, 4.5)
        );
    }

    #[test]
    fn reported_values_read_as_the_dtype_prints_them() {
        let t = f32s("x", &[1], &[1.1], &[1.2], &Policy::Bitwise);
        let m = t.first_mismatch.unwrap();
        assert_eq!((m.reference, m.got), (1.1, 1.2));
    }

    #[test]
    fn argmax_flip_is_reported_at_the_reference_argmax() {
        let t = f32s(
            "logits",
            &[1, 3],
            &[0.0, 2.0, 1.0],
            &[0.0, 1.0, 2.0],
            &Policy::ArgmaxAgree { min_agree: 1.0 },
        );
        assert_eq!(t.argmax_agree, 0);
        let m = t.first_mismatch.unwrap();
        assert_eq!(
            (m.kind, m.index, m.got_argmax),
            (MismatchKind::Argmax, 1, Some(2))
        );
    }

    fn bf16s(v: &[f32]) -> Vec<u8> {
        v.iter()
            .flat_map(|x| half::bf16::from_f32(*x).to_le_bytes())
            .collect()
    }

    #[test]
    fn bf16_compares_bitwise_and_counts_ulps_in_its_own_dtype() {
        let r = bf16s(&[1.0, 2.0, 3.0]);
        let mut g = r.clone();
        g[2] += 2; // two bf16 ulps above 2.0
        let bitwise = typed::<half::bf16>("l", &[3], &r, &g, &Policy::Bitwise);
        assert!(bitwise.float);
        assert_eq!(bitwise.report.dtype, "BF16");
        assert_eq!(bitwise.report.mismatches, 1);
        assert_eq!(bitwise.report.max_ulp, Some(2));
        let loose = typed::<half::bf16>("l", &[3], &r, &g, &Policy::Ulp { max_ulp: 2 });
        assert_eq!(loose.report.mismatches, 0);
        let tight = typed::<half::bf16>("l", &[3], &r, &g, &Policy::Ulp { max_ulp: 1 });
        assert_eq!(tight.report.mismatches, 1);
        assert!(judge_tensor(&tight, &Policy::Ulp { max_ulp: 1 })[0].contains("more than 1 ulp"));
        let tol = Policy::Tolerance {
            max_abs: Some(0.05),
            max_rel: None,
            argmax: true,
        };
        let t = typed::<half::bf16>("l", &[3], &r, &g, &tol);
        assert_eq!((t.report.mismatches, t.report.argmax_agree), (0, 1));
    }

    #[test]
    fn integers_compare_exactly_under_every_policy() {
        let r: Vec<u8> = [5i32, 6, 7].iter().flat_map(|x| x.to_le_bytes()).collect();
        let g: Vec<u8> = [5i32, 6, 8].iter().flat_map(|x| x.to_le_bytes()).collect();
        for p in [
            Policy::Bitwise,
            Policy::Tolerance {
                max_abs: Some(10.0),
                max_rel: None,
                argmax: false,
            },
            Policy::Ulp { max_ulp: 5 },
            Policy::Kl {
                max_mean: Some(1.0),
                max: None,
            },
        ] {
            let t = typed::<i32>("tokens", &[3], &r, &g, &p);
            assert_eq!(t.report.mismatches, 1, "{p:?}");
            assert!(judge_tensor(&t, &p)[0].contains("integer tensors compare exactly"));
        }
        let same = typed::<i32>("tokens", &[3], &r, &r, &Policy::Ulp { max_ulp: 0 });
        assert!(judge_tensor(&same, &Policy::Ulp { max_ulp: 0 }).is_empty());
    }

    #[test]
    fn kl_is_zero_for_equal_rows_and_grows_with_the_difference() {
        let p = Policy::Kl {
            max_mean: None,
            max: Some(1e-3),
        };
        let r = [0.0, 1.0, 2.0, 3.0, 0.0, 0.0, 0.0, 0.0];
        let t = f32s("logits", &[2, 4], &r, &r, &p);
        assert_eq!((t.kl_mean, t.kl_max), (Some(0.0), Some(0.0)));
        // A shift of every logit by the same amount is the same distribution.
        let shifted = [1.0, 2.0, 3.0, 4.0, 0.0, 0.0, 0.0, 0.0];
        let t = f32s("logits", &[2, 4], &r, &shifted, &p);
        assert!(t.kl_max.unwrap() < 1e-12, "{:?}", t.kl_max);
        let moved = [0.0, 1.0, 3.0, 2.0, 0.0, 0.0, 0.0, 0.0];
        let ty = typed::<f32>("logits", &[2, 4], &bytes(&r), &bytes(&moved), &p);
        // By hand: p = softmax(0,1,2,3), q = softmax(0,1,3,2); KL = (p3 - p2) * 1.
        let z: f64 = [0.0f64, 1.0, 2.0, 3.0].iter().map(|x| x.exp()).sum();
        let want = (3f64.exp() - 2f64.exp()) / z;
        let got = ty.report.kl_max.unwrap();
        assert!((got - want).abs() < 1e-12, "{got} vs {want}");
        assert_eq!(ty.kl_worst_row, Some(0));
        assert!((ty.report.kl_mean.unwrap() - want / 2.0).abs() < 1e-12);
        assert!(judge_tensor(&ty, &p)[0].contains("kl: the KL divergence of row 0"));
        // NaN in the candidate is no distribution: infinite, never a pass.
        let nan = [0.0, 1.0, f32::NAN, 3.0, 0.0, 0.0, 0.0, 0.0];
        let t = f32s("logits", &[2, 4], &r, &nan, &p);
        assert_eq!(t.kl_max, Some(f64::INFINITY));
        // Mass where the candidate has none.
        let masked = [0.0, 1.0, 2.0, f32::NEG_INFINITY, 0.0, 0.0, 0.0, 0.0];
        assert_eq!(
            f32s("l", &[2, 4], &r, &masked, &p).kl_max,
            Some(f64::INFINITY)
        );
        assert!(
            f32s("l", &[2, 4], &masked, &r, &p)
                .kl_max
                .unwrap()
                .is_finite()
        );
    }

    #[test]
    fn topk_overlap_counts_shared_best_entries() {
        let p = Policy::TopK {
            k: 2,
            min_overlap: 1.0,
        };
        let r = [0.0, 5.0, 4.0, 1.0];
        let swapped = [0.0, 4.0, 5.0, 1.0];
        let t = f32s("l", &[1, 4], &r, &swapped, &p);
        assert_eq!(t.topk_min_overlap, Some(1.0));
        let other = [3.0, 5.0, 0.0, 1.0];
        let ty = typed::<f32>("l", &[1, 4], &bytes(&r), &bytes(&other), &p);
        assert_eq!(ty.report.topk_min_overlap, Some(0.5));
        assert!(judge_tensor(&ty, &p)[0].contains("shares 1 of its top 2"));
        // Ties go to the lower index; k larger than the row is the whole row.
        assert_eq!(top_k::<f32>(&bytes(&[1.0, 1.0, 1.0]), 2).len(), 2);
        let mut ties = top_k::<f32>(&bytes(&[1.0, 1.0, 1.0]), 2);
        ties.sort_unstable();
        assert_eq!(ties, [0, 1]);
        assert_eq!(
            topk_overlap::<f32>(&bytes(&[1.0, 2.0]), &bytes(&[2.0, 1.0]), 9),
            1.0
        );
    }

    #[test]
    fn tokens_name_the_first_step_where_each_sequence_parts() {
        let ints = |v: &[i32]| -> Vec<u8> { v.iter().flat_map(|x| x.to_le_bytes()).collect() };
        let r = ints(&[1, 2, 3, 4, 10, 11, 12, 13, 20, 21, 22, 23]);
        let g = ints(&[1, 2, 3, 4, 10, 11, 99, 98, 20, 21, 22, 77]);
        let p = Policy::Tokens { min_prefix: None };
        let ty = typed::<i32>("tokens", &[3, 4], &r, &g, &p);
        let t = &ty.report;
        assert_eq!(t.diverged, Some(2));
        assert_eq!(
            t.divergences
                .iter()
                .map(|d| (d.row, d.step, d.reference, d.got))
                .collect::<Vec<_>>(),
            [(1, 2, 12.0, 99.0), (2, 3, 23.0, 77.0)]
        );
        let m = t.first_mismatch.as_ref().unwrap();
        assert_eq!((m.kind, m.row, m.index), (MismatchKind::Tokens, 1, 2));
        let why = judge_tensor(&ty, &p);
        assert!(
            why.iter()
                .any(|w| w.contains("2 of 3 sequences part (first: sequence 1 at step 2")),
            "{why:?}"
        );
        // Agreeing on the first 3 steps is all that `min_prefix = 3` asks.
        let p3 = Policy::Tokens {
            min_prefix: Some(3),
        };
        let ty3 = typed::<i32>("tokens", &[3, 4], &r, &g, &p3);
        assert_eq!(ty3.parted_early, 1);
        let p2 = Policy::Tokens {
            min_prefix: Some(2),
        };
        let ty2 = typed::<i32>("tokens", &[3, 4], &r, &g, &p2);
        assert_eq!(ty2.parted_early, 0);
        assert!(
            judge_tensor(&ty2, &p2)
                .iter()
                .all(|w| !w.contains("tokens:"))
        );
    }

    #[test]
    fn nan_against_a_number_is_never_close() {
        let ulp = Policy::Ulp { max_ulp: 1 };
        let t = f32s(
            "l",
            &[2],
            &[f32::INFINITY, f32::MAX],
            &[f32::NAN, f32::NAN],
            &ulp,
        );
        assert_eq!(t.mismatches, 2);
        assert_eq!(t.max_ulp, Some(u64::MAX));
        // A row of NaN only has no argmax: it agrees with no row of numbers.
        let am = Policy::ArgmaxAgree { min_agree: 1.0 };
        let t = f32s("l", &[1, 3], &[5.0, 1.0, 0.0], &[f32::NAN; 3], &am);
        assert_eq!(t.argmax_agree, 0);
        let t = f32s("l", &[1, 3], &[f32::NAN; 3], &[f32::NAN; 3], &am);
        assert_eq!(t.argmax_agree, 1);
        // A NaN the candidate ranks nowhere fails the top k.
        let tk = Policy::TopK {
            k: 2,
            min_overlap: 1.0,
        };
        let t = f32s(
            "l",
            &[1, 4],
            &[5.0, 4.0, 3.0, 2.0],
            &[5.0, 4.0, f32::NAN, f32::NAN],
            &tk,
        );
        assert_eq!(t.topk_min_overlap, Some(0.0));
    }

    #[test]
    fn rows_too_short_for_kl_or_topk_fail_instead_of_passing_blind() {
        let kl = Policy::Kl {
            max_mean: None,
            max: Some(1e-6),
        };
        let ty = typed::<f32>("loss", &[1, 1], &bytes(&[1.0]), &bytes(&[1e9]), &kl);
        assert!(judge_tensor(&ty, &kl)[0].contains("cannot be judged"));
        let tk = Policy::TopK {
            k: 5,
            min_overlap: 1.0,
        };
        let r = [1.0, 2.0, 3.0, 4.0];
        let ty = typed::<f32>("l", &[1, 4], &bytes(&r), &bytes(&[9.0, 9.0, 9.0, 9.0]), &tk);
        assert!(judge_tensor(&ty, &tk)[0].contains("cannot be judged"));
    }

    #[test]
    fn an_empty_tensor_with_a_huge_row_length_is_no_crash() {
        let t = f32s("l", &[0, 1 << 62], &[], &[], &Policy::Bitwise);
        assert_eq!((t.rows, t.values, t.mismatches), (0, 0, 0));
    }
}
