//! How far the bits moved: for an artifact whose digest changed and that is a safetensors
//! file on both sides, reads both files and measures each tensor (values that differ, max
//! |Δ|, max relative |Δ|, max ulp distance, argmax agreement over rows, shape and dtype
//! changes, tensors on one side only); and the compare cells' own reports, diffed like check
//! metrics (docs/diff.md, "Bits moved, tensor by tensor" and "Compare reports").
//!
//! [`read_moved`] is the only part of `diff` that opens artifact files; it runs after
//! [`super::diff`] has found what moved, reading the files of the runs that measured them
//! (a carried receipt's files are in its source run) in parallel. The arithmetic on
//! elements lives in [`crate::gate::tensors`]; the tables' layout is here, so that `render` only
//! calls it. It decides no verdict and fails no diff.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write;
use std::path::{Path, PathBuf};

use rayon::prelude::*;
use safetensors::SafeTensors;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{ArtifactMove, Diff, DiffRun, MetricDrift, Thresholds, metric_moved};
use crate::gate::tensors::{self, Element, ElementFn};
use crate::receipt::tree::Tree;

/// What `diff` reads of an attempt: its number, which names its folder (`attempt-<n>`).
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct DiffAttempt {
    pub n: u32,
}

/// What reading both files of a moved artifact found.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum ArtifactRead {
    /// Both are safetensors files, compared tensor by tensor.
    Read(TensorsRead),
    /// Both are text (UTF-8 without NUL bytes), compared line by line.
    Text(TextRead),
    /// Why the files were not compared tensor by tensor (one is not a safetensors file, or
    /// cannot be read).
    NotRead { not_read: String },
}

impl ArtifactRead {
    /// Over every tensor read: the elements whose bits differ, the largest |new − old| and
    /// the largest ulp distance; `None` when nothing was read.
    pub fn totals(&self) -> Option<(u64, f64, Option<u64>)> {
        let ArtifactRead::Read(r) = self else {
            return None;
        };
        sum_totals(
            r.tensors
                .iter()
                .filter_map(|t| t.numbers.as_ref())
                .map(|n| (n.differ, n.max_abs, n.max_ulp)),
        )
    }
}

/// Totals ([`ArtifactRead::totals`]) of several tensors or files together: the counts
/// added, the largest |Δ| and ulp distance kept; `None` for none.
pub fn sum_totals(
    parts: impl IntoIterator<Item = (u64, f64, Option<u64>)>,
) -> Option<(u64, f64, Option<u64>)> {
    parts.into_iter().reduce(|(d, a, u), (d2, a2, u2)| {
        (
            d + d2,
            a.max(a2),
            match (u, u2) {
                (Some(x), Some(y)) => Some(x.max(y)),
                (x, y) => x.or(y),
            },
        )
    })
}

/// Reads artifact `name` of two attempt folders (`<attempt>/artifacts/<name>`) side by side,
/// as `diff` reads a moved artifact.
pub fn read_files(old_attempt: &Path, new_attempt: &Path, name: &str) -> ArtifactRead {
    let rel = Path::new("artifacts").join(name);
    read_pair(
        Ok((old_attempt.to_path_buf(), rel.clone())),
        Ok((new_attempt.to_path_buf(), rel)),
        true,
    )
}

/// The [`ArtifactRead::totals`] of artifact `name` of two attempt folders: the tensors only,
/// so a text artifact is not read through (the HTML report's per-point figures).
pub fn tensor_totals(
    old_attempt: &Path,
    new_attempt: &Path,
    name: &str,
) -> Option<(u64, f64, Option<u64>)> {
    let rel = Path::new("artifacts").join(name);
    read_pair(
        Ok((old_attempt.to_path_buf(), rel.clone())),
        Ok((new_attempt.to_path_buf(), rel)),
        false,
    )
    .totals()
}

/// Two text files compared line by line, each line with the line of the same number on
/// the other side (no alignment: a line added early shows every later line as moved). The
/// lines themselves are never printed, only their numbers: an artifact may hold anything.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TextRead {
    pub old_lines: u64,
    pub new_lines: u64,
    /// Line numbers present on both sides whose text differs, plus the lines one side only
    /// has.
    pub lines_differ: u64,
    /// The first [`TEXT_LINES_LISTED`] of those line numbers, 1-based.
    pub first_lines: Vec<u64>,
    /// Both files hold the same bytes (their receipts' digests said otherwise).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub identical: bool,
}

/// How many differing line numbers a text read lists.
pub const TEXT_LINES_LISTED: usize = 8;

/// Both files as text when both are (UTF-8 without NUL bytes), compared line by line.
fn text_pair(o: &[u8], n: &[u8]) -> Option<TextRead> {
    fn text(b: &[u8]) -> Option<&str> {
        if b.contains(&0) {
            return None;
        }
        std::str::from_utf8(b).ok()
    }
    let (o, n) = (text(o)?, text(n)?);
    let (mut ol, mut nl) = (o.lines(), n.lines());
    let mut r = TextRead {
        old_lines: 0,
        new_lines: 0,
        lines_differ: 0,
        first_lines: Vec::new(),
        identical: o == n,
    };
    let mut at = 0u64;
    loop {
        let (a, b) = (ol.next(), nl.next());
        if a.is_none() && b.is_none() {
            break;
        }
        at += 1;
        r.old_lines += u64::from(a.is_some());
        r.new_lines += u64::from(b.is_some());
        if a != b {
            r.lines_differ += 1;
            if r.first_lines.len() < TEXT_LINES_LISTED {
                r.first_lines.push(at);
            }
        }
    }
    Some(r)
}

/// The one-line account of a text read: `text, 2345 lines: 1 differs (line 1)`; the same
/// line counts both sides, or `120 → 123 lines`.
fn text_line(t: &TextRead) -> String {
    let lines = if t.old_lines == t.new_lines {
        format!("{} line{}", t.old_lines, plural(t.old_lines))
    } else {
        format!("{} → {} lines", t.old_lines, t.new_lines)
    };
    if t.lines_differ == 0 && t.identical {
        return format!("text, {lines}: the files are identical");
    }
    if t.lines_differ == 0 {
        // Same lines, other bytes: line endings, or a final newline.
        return format!("text, {lines}: every line is the same; line endings differ");
    }
    let numbers: Vec<String> = t.first_lines.iter().map(u64::to_string).collect();
    let more = if t.lines_differ as usize > t.first_lines.len() {
        ", …"
    } else {
        ""
    };
    format!(
        "text, {lines}: {} differ{} (line{} {}{more})",
        t.lines_differ,
        if t.lines_differ == 1 { "s" } else { "" },
        plural(t.lines_differ),
        numbers.join(", ")
    )
}

fn plural(n: u64) -> &'static str {
    if n == 1 { "" } else { "s" }
}

/// The tensors of two safetensors files.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TensorsRead {
    /// The tensors that differ in bits, dtype or shape, or that one side only has, by name.
    pub tensors: Vec<TensorDelta>,
    /// How many tensors are the same bit for bit on both sides.
    pub tensors_same: usize,
}

/// One tensor that moved. Dtype and shape are `None` on the side without the tensor.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TensorDelta {
    pub name: String,
    pub old_dtype: Option<String>,
    pub new_dtype: Option<String>,
    pub old_shape: Option<Vec<usize>>,
    pub new_shape: Option<Vec<usize>>,
    /// The element-by-element figures; absent when the tensor is on one side only, its
    /// shape changed, or its dtype is one that is not read.
    #[serde(flatten)]
    pub numbers: Option<Numbers>,
    /// Why there are no figures for a tensor both sides have.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// The figures of one tensor present on both sides with one shape.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Numbers {
    /// Elements compared.
    pub values: u64,
    /// Elements whose bits differ (for a dtype change: whose values as f64 differ in bits).
    pub differ: u64,
    /// Largest |new − old|; infinite (JSON `null`) when a NaN appears on one side only.
    pub max_abs: f64,
    /// Largest |new − old| / max(|old|, tiny), tiny being the smallest positive normal
    /// number of the old dtype (1 for integers).
    pub max_rel: f64,
    /// Largest distance in units in the last place of the tensor's dtype (floats ordered by
    /// sign and magnitude, NaN one step past +∞; integers: the difference); `None` when the
    /// dtype changed.
    pub max_ulp: Option<u64>,
    /// Rows: the product of the leading dimensions (the last one is the row length).
    pub rows: u64,
    /// Rows whose argmax (first largest value, NaN never wins) is the same on both sides.
    pub argmax_agree: u64,
}

/// Reads every artifact of `d.bits_moved` that both sides have and fills its
/// [`ArtifactMove::read`]; the files are read in parallel.
pub fn read_moved(d: &mut Diff, old: &DiffRun, new: &DiffRun) {
    read_list(&mut d.bits_moved, old, new);
    read_list(&mut d.nondeterministic, old, new);
}

/// Reads both sides of every artifact of `list` that both sides have.
fn read_list(list: &mut [super::BitsMoved], old: &DiffRun, new: &DiffRun) {
    let jobs: Vec<(usize, usize, &str, &str)> = list
        .iter()
        .enumerate()
        .flat_map(|(b, moved)| {
            moved
                .artifacts
                .iter()
                .enumerate()
                .filter_map(move |(a, m)| {
                    (m.old_sha256.is_some() && m.new_sha256.is_some()).then_some((
                        b,
                        a,
                        moved.id.as_str(),
                        m.name.as_str(),
                    ))
                })
        })
        .collect();
    let reads: Vec<(usize, usize, ArtifactRead)> = jobs
        .par_iter()
        .map(|&(b, a, id, name)| {
            let read = read_pair(
                artifact_path(old, id, name),
                artifact_path(new, id, name),
                true,
            );
            (b, a, read)
        })
        .collect();
    for (b, a, read) in reads {
        list[b].artifacts[a].read = Some(read);
    }
}

/// The attempt folder holding node `id`'s artifacts in `run` (the last attempt's, in the
/// tree of the run that measured it) and the artifact's path below it.
fn artifact_path(run: &DiffRun, id: &str, name: &str) -> Result<(PathBuf, PathBuf), String> {
    let node = run
        .nodes
        .get(id)
        .ok_or_else(|| format!("{} has no node {id:?}", run.dir.display()))?;
    let slug = node
        .entry
        .slug
        .as_deref()
        .ok_or_else(|| format!("node {id:?} has no folder in {}", run.dir.display()))?;
    let dir = match &node.entry.carried {
        None => run.dir.clone(),
        Some(c) => c
            .source_dir(&run.dir)
            .ok_or_else(|| format!("node {id:?} is carried from {:?}, not a run", c.from))?,
    };
    let n = node
        .receipt
        .as_ref()
        .and_then(|r| r.attempts.last())
        .map(|a| a.n)
        .ok_or_else(|| format!("the receipt of node {id:?} names no attempt"))?;
    let attempt = Tree { dir }.attempt_dir(slug, n);
    Ok((attempt, Path::new("artifacts").join(name)))
}

type Located = Result<(PathBuf, PathBuf), String>;

/// Opens and maps one side's file; the error is a sentence naming the file.
fn open_map(at: Located) -> Result<memmap2::Mmap, String> {
    let (attempt, rel) = at?;
    let file = crate::gate::attempt_file::open(&attempt, &rel).map_err(|e| e.to_string())?;
    tensors::map(&file).map_err(|e| format!("cannot map {}: {e}", attempt.join(&rel).display()))
}

fn not_read(why: String) -> ArtifactRead {
    ArtifactRead::NotRead { not_read: why }
}

/// Both sides' files: tensor by tensor when both are safetensors, else line by line when
/// both are text and `text` is asked for.
fn read_pair(old: Located, new: Located, text: bool) -> ArtifactRead {
    let (o, n) = match (open_map(old), open_map(new)) {
        (Ok(o), Ok(n)) => (o, n),
        (o, n) => {
            let mut why = Vec::new();
            if let Err(e) = o {
                why.push(format!("old: {e}"));
            }
            if let Err(e) = n {
                why.push(format!("new: {e}"));
            }
            return not_read(format!("cannot read ({})", why.join("; ")));
        }
    };
    match (tensors::parse(&o), tensors::parse(&n)) {
        (Ok(o), Ok(n)) => ArtifactRead::Read(tensor_deltas(&o, &n)),
        (Err(_), Err(_)) if !text => not_read("neither side is a safetensors file".to_string()),
        (Err(_), Err(_)) => match text_pair(&o, &n) {
            Some(t) => ArtifactRead::Text(t),
            None => not_read("neither side is a safetensors file or text".to_string()),
        },
        (Err(e), Ok(_)) => not_read(format!("the old side is not a safetensors file ({e})")),
        (Ok(_), Err(e)) => not_read(format!("the new side is not a safetensors file ({e})")),
    }
}

fn tensor_deltas(o: &SafeTensors<'_>, n: &SafeTensors<'_>) -> TensorsRead {
    let (on, nn): (BTreeSet<&str>, BTreeSet<&str>) = (
        o.names().into_iter().collect(),
        n.names().into_iter().collect(),
    );
    let mut read = TensorsRead {
        tensors: Vec::new(),
        tensors_same: 0,
    };
    for name in on.union(&nn) {
        let (a, b) = (o.tensor(name).ok(), n.tensor(name).ok());
        let dtype = |t: &Option<safetensors::tensor::TensorView<'_>>| {
            t.as_ref().map(|t| format!("{:?}", t.dtype()))
        };
        let shape = |t: &Option<safetensors::tensor::TensorView<'_>>| {
            t.as_ref().map(|t| t.shape().to_vec())
        };
        let mut delta = TensorDelta {
            name: name.to_string(),
            old_dtype: dtype(&a),
            new_dtype: dtype(&b),
            old_shape: shape(&a),
            new_shape: shape(&b),
            numbers: None,
            note: None,
        };
        if let (Some(a), Some(b)) = (&a, &b) {
            if a.shape() != b.shape() {
                delta.note = Some("the shape changed".to_string());
            } else if a.dtype() == b.dtype() {
                if a.data() == b.data() {
                    read.tensors_same += 1;
                    continue;
                }
                let row = row_len(a.shape());
                delta.numbers = tensors::with_element(
                    a.dtype(),
                    Same {
                        old: a.data(),
                        new: b.data(),
                        row,
                        tiny: None,
                    },
                );
            } else {
                delta.numbers = cast(a, b);
            }
            if delta.numbers.is_none() && delta.note.is_none() {
                delta.note = Some(format!(
                    "dtype {} is not read",
                    unread_dtype(a.dtype(), b.dtype())
                ));
            }
        }
        read.tensors.push(delta);
    }
    read
}

/// The dtype of the two that `tensors` does not read.
fn unread_dtype(a: safetensors::Dtype, b: safetensors::Dtype) -> String {
    let readable = |d| tensors::values_f64(d, &[]).is_some();
    format!("{:?}", if readable(a) { b } else { a })
}

fn row_len(shape: &[usize]) -> usize {
    shape.last().copied().filter(|&n| n > 0).unwrap_or(1)
}

/// A tensor whose dtype changed and whose shape did not: both sides as f64, relative
/// errors against the old dtype's tiny, no ulp distance (the units differ).
fn cast(
    a: &safetensors::tensor::TensorView<'_>,
    b: &safetensors::tensor::TensorView<'_>,
) -> Option<Numbers> {
    struct Tiny;
    impl ElementFn for Tiny {
        type Out = f64;
        fn call<E: Element>(self) -> f64 {
            E::TINY
        }
    }
    let tiny = tensors::with_element(a.dtype(), Tiny)?;
    let bytes = |v: Vec<f64>| -> Vec<u8> { v.into_iter().flat_map(f64::to_le_bytes).collect() };
    let old = bytes(tensors::values_f64(a.dtype(), a.data())?);
    let new = bytes(tensors::values_f64(b.dtype(), b.data())?);
    let numbers = Same {
        old: &old,
        new: &new,
        row: row_len(a.shape()),
        tiny: Some(tiny),
    }
    .call::<f64>();
    Some(Numbers {
        max_ulp: None,
        ..numbers
    })
}

/// The figures of one tensor pair of one dtype, `row` elements a row; `tiny` overrides the
/// dtype's own floor of relative errors.
struct Same<'a> {
    old: &'a [u8],
    new: &'a [u8],
    row: usize,
    tiny: Option<f64>,
}

/// What a row (or a run of rows) showed; merged over rows.
#[derive(Debug, Clone, Copy, Default)]
struct Acc {
    differ: u64,
    max_abs: f64,
    max_rel: f64,
    max_ulp: u128,
    rows: u64,
    agree: u64,
}

impl Acc {
    fn merge(self, o: Acc) -> Acc {
        Acc {
            differ: self.differ + o.differ,
            max_abs: self.max_abs.max(o.max_abs),
            max_rel: self.max_rel.max(o.max_rel),
            max_ulp: self.max_ulp.max(o.max_ulp),
            rows: self.rows + o.rows,
            agree: self.agree + o.agree,
        }
    }
}

impl ElementFn for Same<'_> {
    type Out = Numbers;
    fn call<E: Element>(self) -> Numbers {
        let tiny = self.tiny.unwrap_or(E::TINY);
        let row_bytes = self.row * E::BYTES;
        let acc = self
            .old
            .par_chunks(row_bytes)
            .zip(self.new.par_chunks(row_bytes))
            .map(|(a, b)| row::<E>(a, b, tiny))
            .reduce(Acc::default, Acc::merge);
        Numbers {
            values: (self.old.len() / E::BYTES) as u64,
            differ: acc.differ,
            max_abs: acc.max_abs,
            max_rel: acc.max_rel,
            max_ulp: Some(u64::try_from(acc.max_ulp).unwrap_or(u64::MAX)),
            rows: acc.rows,
            argmax_agree: acc.agree,
        }
    }
}

fn row<E: Element>(a: &[u8], b: &[u8], tiny: f64) -> Acc {
    let mut acc = Acc {
        rows: 1,
        ..Acc::default()
    };
    // Rows that are the same bytes agree in everything; only the others are walked.
    if a == b {
        acc.agree = 1;
        return acc;
    }
    for (x, y) in a.chunks_exact(E::BYTES).zip(b.chunks_exact(E::BYTES)) {
        if x == y {
            continue;
        }
        let (x, y) = (E::read(x), E::read(y));
        acc.differ += 1;
        let (xv, yv) = (x.value(), y.value());
        let d = tensors::abs_error(xv, yv);
        acc.max_abs = acc.max_abs.max(d);
        acc.max_rel = acc.max_rel.max(d / xv.abs().max(tiny));
        acc.max_ulp = acc
            .max_ulp
            .max((x.position() - y.position()).unsigned_abs());
    }
    acc.agree = u64::from(E::row_argmax(a) == E::row_argmax(b));
    acc
}

/// Diffs two compare cells' reports (receipt `compare`) like check metrics: the totals as
/// check `compare` (tensors, values, mismatches, rows, argmax agreement and its fraction,
/// the largest max_abs and max_rel over tensors, the number of failures) and each tensor's
/// row as check `compare <tensor>`, under the metric thresholds.
pub(super) fn compare_reports(
    drift_out: &mut Vec<MetricDrift>,
    id: &str,
    old: Option<&Value>,
    new: Option<&Value>,
    t: &Thresholds,
) {
    if old.is_none() && new.is_none() {
        return;
    }
    let (o, n) = (old.map(report_rows), new.map(report_rows));
    let empty = BTreeMap::new();
    let (om, nm) = (o.as_ref().unwrap_or(&empty), n.as_ref().unwrap_or(&empty));
    let checks: BTreeSet<&String> = om.keys().chain(nm.keys()).collect();
    for check in checks {
        let drift = |metric: &str, old: Value, new: Value, relative| MetricDrift {
            id: id.to_string(),
            check: check.clone(),
            metric: metric.to_string(),
            old,
            new,
            relative,
        };
        let (a, b) = match (om.get(check), nm.get(check)) {
            (Some(a), Some(b)) => (a, b),
            (a, b) => {
                let present = |m: Option<&BTreeMap<String, Value>>| {
                    m.map_or(Value::Null, |_| Value::from("present"))
                };
                drift_out.push(drift("(row)", present(a), present(b), None));
                continue;
            }
        };
        let metrics: BTreeSet<&String> = a.keys().chain(b.keys()).collect();
        for m in metrics {
            let (x, y) = (a.get(m), b.get(m));
            if let Some(relative) = metric_moved(m, x, y, t) {
                drift_out.push(drift(
                    m,
                    x.cloned().unwrap_or(Value::Null),
                    y.cloned().unwrap_or(Value::Null),
                    relative,
                ));
            }
        }
    }
}

/// A compare report as check-like rows: `compare` (the totals) and `compare <tensor>`.
fn report_rows(r: &Value) -> BTreeMap<String, BTreeMap<String, Value>> {
    let pick = |v: &Value, keys: &[&str]| -> BTreeMap<String, Value> {
        keys.iter()
            .filter_map(|k| Some((k.to_string(), v.get(*k)?.clone())))
            .collect()
    };
    let tensors = r
        .get("tensors")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default();
    let mut total = pick(
        r,
        &[
            "tensors_compared",
            "values_compared",
            "mismatches",
            "rows",
            "argmax_agree",
            "kl_mean",
            "kl_max",
            "topk_min_overlap",
            "max_ulp",
            "diverged",
        ],
    );
    let largest = |key: &str| {
        tensors
            .iter()
            .filter_map(|t| t.get(key)?.as_f64())
            .reduce(f64::max)
    };
    for key in ["max_abs", "max_rel"] {
        if let Some(x) = largest(key) {
            total.insert(key.to_string(), Value::from(x));
        }
    }
    let (agree, rows) = (
        r.get("argmax_agree").and_then(Value::as_f64),
        r.get("rows").and_then(Value::as_f64),
    );
    if let (Some(agree), Some(rows)) = (agree, rows)
        && rows > 0.0
    {
        total.insert("agreement".to_string(), Value::from(agree / rows));
    }
    if let Some(f) = r.get("failures").and_then(Value::as_array) {
        total.insert("failures".to_string(), Value::from(f.len()));
    }
    let mut rows = BTreeMap::from([("compare".to_string(), total)]);
    for t in tensors {
        let name = t.get("name").and_then(Value::as_str).unwrap_or("?");
        rows.insert(
            format!("compare {name}"),
            pick(
                t,
                &[
                    "values",
                    "mismatches",
                    "rows",
                    "argmax_agree",
                    "max_abs",
                    "max_rel",
                ],
            ),
        );
    }
    rows
}

/// A figure for the tables: `0`, `inf`, or four significant digits in exponent form.
fn number(x: f64) -> String {
    if x == 0.0 {
        "0".to_string()
    } else if x.is_infinite() {
        "inf".to_string()
    } else {
        format!("{x:.3e}")
    }
}

fn both<T: PartialEq>(a: &Option<T>, b: &Option<T>, show: impl Fn(&T) -> String) -> String {
    match (a, b) {
        (Some(a), Some(b)) if a == b => show(a),
        (Some(a), Some(b)) => format!("{} → {}", show(a), show(b)),
        (Some(a), None) | (None, Some(a)) => show(a),
        (None, None) => String::new(),
    }
}

/// The cells of a tensor's row: tensor, dtype, shape, differ, max |Δ|, max rel, max ulp,
/// argmax agree; a tensor without figures says why in the differ column.
fn cells(t: &TensorDelta) -> [String; 8] {
    let shape = |s: &Vec<usize>| format!("{s:?}");
    let mut c = [
        t.name.clone(),
        both(&t.old_dtype, &t.new_dtype, String::clone),
        both(&t.old_shape, &t.new_shape, shape),
        String::new(),
        String::new(),
        String::new(),
        String::new(),
        String::new(),
    ];
    match (&t.numbers, t.old_dtype.is_some(), t.new_dtype.is_some()) {
        (Some(n), _, _) => {
            c[3] = format!("{} of {}", n.differ, n.values);
            c[4] = number(n.max_abs);
            c[5] = number(n.max_rel);
            c[6] = n.max_ulp.map_or("-".to_string(), |u| u.to_string());
            c[7] = format!("{}/{}", n.argmax_agree, n.rows);
        }
        (None, true, false) => c[3] = "only in old".to_string(),
        (None, false, true) => c[3] = "only in new".to_string(),
        (None, _, _) => c[3] = t.note.clone().unwrap_or_default(),
    }
    c
}

fn same_line(n: usize) -> String {
    format!(
        "{n} other tensor{} the same",
        if n == 1 { " is" } else { "s are" }
    )
}

/// The text lines under an artifact in BITS MOVED: a table of the tensors that moved, or
/// why the files were not read; nothing for an artifact that was not read (`--no-read`, or
/// one side only).
pub(super) fn text(a: &ArtifactMove, indent: &str) -> String {
    let mut out = String::new();
    let r = match &a.read {
        None => return out,
        Some(ArtifactRead::NotRead { not_read }) => {
            let _ = writeln!(out, "{indent}not read: {not_read}");
            return out;
        }
        Some(ArtifactRead::Text(t)) => {
            let _ = writeln!(out, "{indent}{}", text_line(t));
            return out;
        }
        Some(ArtifactRead::Read(r)) => r,
    };
    if r.tensors.is_empty() {
        let _ = writeln!(
            out,
            "{indent}every tensor is the same ({}); the header differs",
            r.tensors_same
        );
        return out;
    }
    let head = [
        "tensor",
        "dtype",
        "shape",
        "differ",
        "max |Δ|",
        "max rel",
        "max ulp",
        "argmax agree",
    ];
    let rows: Vec<[String; 8]> = r.tensors.iter().map(cells).collect();
    let mut w = head.map(|h| h.chars().count());
    for row in &rows {
        // A note in the differ column runs on past the number columns.
        let numbered = !row[4].is_empty();
        for (i, cell) in row.iter().enumerate() {
            if i != 3 || numbered {
                w[i] = w[i].max(cell.chars().count());
            }
        }
    }
    let line = |cells: [&str; 8]| {
        let mut l = String::from(indent);
        for (i, cell) in cells.iter().enumerate() {
            let pad = w[i].saturating_sub(cell.chars().count());
            // Names, dtypes and shapes read left to right; numbers line up on the right.
            if i < 3 || cells[4].is_empty() {
                let _ = write!(l, "{cell}{}  ", " ".repeat(pad));
            } else {
                let _ = write!(l, "{}{cell}  ", " ".repeat(pad));
            }
        }
        l.trim_end().to_string()
    };
    let _ = writeln!(out, "{}", line(head));
    for row in &rows {
        let _ = writeln!(out, "{}", line(row.each_ref().map(String::as_str)));
    }
    if r.tensors_same > 0 {
        let _ = writeln!(out, "{indent}{}", same_line(r.tensors_same));
    }
    out
}

/// The markdown table of the tensors that moved, after the bits-moved table; empty when no
/// artifact was read.
pub(super) fn markdown(list: &[super::BitsMoved], md: impl Fn(&str) -> String) -> String {
    let mut out = String::new();
    let mut rows = Vec::new();
    for b in list {
        for a in &b.artifacts {
            let lead = format!("| `{}` | `{}` |", md(&b.id), md(&a.name));
            let r = match &a.read {
                None => continue,
                Some(ArtifactRead::NotRead { not_read }) => {
                    rows.push(format!(
                        "{lead} | | | | | | | | not read: {} |",
                        md(not_read)
                    ));
                    continue;
                }
                Some(ArtifactRead::Text(t)) => {
                    rows.push(format!("{lead} | | | | | | | | {} |", md(&text_line(t))));
                    continue;
                }
                Some(ArtifactRead::Read(r)) => r,
            };
            for t in &r.tensors {
                let c = cells(t).map(|c| md(&c));
                let note = if c[4].is_empty() { &c[3] } else { "" };
                let differ = if c[4].is_empty() { "" } else { &c[3] };
                rows.push(format!(
                    "{lead} `{}` | {} | {} | {differ} | {} | {} | {} | {} | {note} |",
                    c[0], c[1], c[2], c[4], c[5], c[6], c[7]
                ));
            }
            if r.tensors.is_empty() {
                rows.push(format!(
                    "{lead} | | | | | | | | every tensor is the same; the header differs |"
                ));
            } else if r.tensors_same > 0 {
                rows.push(format!(
                    "{lead} | | | | | | | | {} |",
                    same_line(r.tensors_same)
                ));
            }
        }
    }
    if rows.is_empty() {
        return out;
    }
    let _ = writeln!(
        out,
        "#### Tensors that moved\n\n| node | artifact | tensor | dtype | shape | differ | max \\|Δ\\| | max rel | max ulp | argmax agree | note |\n|---|---|---|---|---|---:|---:|---:|---:|---:|---|"
    );
    for r in rows {
        let _ = writeln!(out, "{r}");
    }
    out.push('\n');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_artifacts_are_compared_line_by_line_without_their_content() {
        // A receipt whose only change is its header line (a rebuilt gate binary's digest).
        let old = "# gate\tbinary_sha256=aa\nrow\t1\nrow\t2\n";
        let new = "# gate\tbinary_sha256=bb\nrow\t1\nrow\t2\n";
        let t = text_pair(old.as_bytes(), new.as_bytes()).unwrap();
        assert_eq!((t.old_lines, t.new_lines, t.lines_differ), (3, 3, 1));
        assert_eq!(t.first_lines, [1]);
        let line = text_line(&t);
        assert_eq!(line, "text, 3 lines: 1 differs (line 1)");
        assert!(!line.contains("binary_sha256"), "no content is shown");
        // A line one side only has counts; past the listed numbers, an ellipsis.
        let many: String = (0..20).map(|i| format!("{i}\n")).collect();
        let t = text_pair(b"x\n", many.as_bytes()).unwrap();
        assert_eq!((t.old_lines, t.new_lines, t.lines_differ), (1, 20, 20));
        assert_eq!(t.first_lines.len(), TEXT_LINES_LISTED);
        assert_eq!(
            text_line(&t),
            "text, 1 → 20 lines: 20 differ (lines 1, 2, 3, 4, 5, 6, 7, 8, …)"
        );
        // Only the line endings moved.
        let t = text_pair(b"a\nb\n", b"a\r\nb\r\n").unwrap();
        assert_eq!(
            text_line(&t),
            "text, 2 lines: every line is the same; line endings differ"
        );
        // The same bytes on both sides say so rather than blame the line endings.
        let t = text_pair(b"a\n", b"a\n").unwrap();
        assert_eq!(text_line(&t), "text, 1 line: the files are identical");
        // Bytes that are not text (a NUL, invalid UTF-8) are not read as text.
        assert_eq!(text_pair(b"a\0b", b"a\0c"), None);
        assert_eq!(text_pair(b"a", &[0xff, 0xfe]), None);
    }

    #[test]
    fn a_binary_artifact_is_neither_tensors_nor_text() {
        let dir = tempfile::tempdir().unwrap();
        for (side, bytes) in [("old", &b"\x00\x01"[..]), ("new", &b"\x00\x02"[..])] {
            std::fs::create_dir_all(dir.path().join(side).join("artifacts")).unwrap();
            std::fs::write(dir.path().join(side).join("artifacts/out.bin"), bytes).unwrap();
        }
        let r = read_files(&dir.path().join("old"), &dir.path().join("new"), "out.bin");
        assert_eq!(
            r,
            not_read("neither side is a safetensors file or text".to_string())
        );
        assert_eq!(r.totals(), None);
        // The HTML report's figures read tensors only: text is not read through.
        for (side, bytes) in [("old", "a\n"), ("new", "b\n")] {
            std::fs::write(dir.path().join(side).join("artifacts/t.txt"), bytes).unwrap();
        }
        let (old, new) = (dir.path().join("old"), dir.path().join("new"));
        assert!(matches!(
            read_files(&old, &new, "t.txt"),
            ArtifactRead::Text(_)
        ));
        assert_eq!(
            read_pair(
                Ok((old.clone(), "artifacts/t.txt".into())),
                Ok((new.clone(), "artifacts/t.txt".into())),
                false
            ),
            not_read("neither side is a safetensors file".to_string())
        );
        assert_eq!(tensor_totals(&old, &new, "t.txt"), None);
    }

    fn bytes(v: &[f32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    #[test]
    fn figures_of_an_f32_pair() {
        let old = bytes(&[1.0, 2.0, 3.0, 0.0, 5.0, 1.0]);
        let new = bytes(&[1.0, 2.5, 3.0, 1e-30, 1.0, 5.0]);
        let n = Same {
            old: &old,
            new: &new,
            row: 3,
            tiny: None,
        }
        .call::<f32>();
        assert_eq!((n.values, n.differ, n.rows), (6, 4, 2));
        assert_eq!(n.max_abs, 4.0);
        // 1e-30 against an old 0 is taken relative to f32's smallest normal number.
        assert_eq!(
            n.max_rel,
            f64::from(1e-30f32) / f64::from(f32::MIN_POSITIVE)
        );
        assert_eq!(n.max_ulp, Some(u64::from(1e-30f32.to_bits())));
        // Row 0 keeps its argmax (index 2); row 1 moves it from 1 to 2.
        assert_eq!(n.argmax_agree, 1);
    }

    #[test]
    fn compare_reports_drift_like_metrics() {
        let report = |max_abs: f64, mismatches: u64| {
            serde_json::json!({
                "version": 1, "failures": [], "tensors_compared": 1, "values_compared": 8,
                "mismatches": mismatches, "rows": 2, "argmax_agree": 2,
                "tensors": [{"name": "logits", "shape": [2, 4], "values": 8,
                             "mismatches": mismatches, "rows": 2, "argmax_agree": 2,
                             "max_abs": max_abs, "max_rel": max_abs}]
            })
        };
        let mut d = Vec::new();
        let t = Thresholds::default();
        let (a, b) = (report(1e-3, 1), report(1e-3, 1));
        compare_reports(&mut d, "c", Some(&a), Some(&b), &t);
        assert!(d.is_empty(), "{:?}", d);
        let b = report(2e-3, 3);
        compare_reports(&mut d, "c", Some(&a), Some(&b), &t);
        let got: Vec<(&str, &str)> = d
            .iter()
            .map(|m| (m.check.as_str(), m.metric.as_str()))
            .collect();
        assert_eq!(
            got,
            [
                ("compare", "max_abs"),
                ("compare", "max_rel"),
                ("compare", "mismatches"),
                ("compare logits", "max_abs"),
                ("compare logits", "max_rel"),
                ("compare logits", "mismatches"),
            ]
        );
        d.clear();
        compare_reports(&mut d, "c", Some(&a), None, &t);
        assert_eq!(d.len(), 2, "both rows are gone");
        assert_eq!(d[0].metric, "(row)");
    }
}
