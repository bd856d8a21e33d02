//! `compare::compare_files` on crafted safetensors artifacts: identical files pass, one
//! flipped bit fails naming the element, tolerances pass inside and fail outside, argmax
//! flips are caught, and missing tensors or shape/dtype mismatches fail with the reason.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use memra_orch::gate::judge::{MismatchKind, compare_files};
use memra_orch::plan::Policy;
use safetensors::tensor::TensorView;
use safetensors::{Dtype, serialize};

/// Writes F32 tensors `(name, shape, values)` as a safetensors file.
fn write(dir: &Path, file: &str, tensors: &[(&str, Vec<usize>, Vec<f32>)]) -> PathBuf {
    let bytes: Vec<Vec<u8>> = tensors
        .iter()
        .map(|(_, _, v)| v.iter().flat_map(|x| x.to_le_bytes()).collect())
        .collect();
    let views: HashMap<String, TensorView<'_>> = tensors
        .iter()
        .zip(&bytes)
        .map(|((name, shape, _), b)| {
            (
                name.to_string(),
                TensorView::new(Dtype::F32, shape.clone(), b).unwrap(),
            )
        })
        .collect();
    let path = dir.join(file);
    std::fs::write(&path, serialize(&views, None).unwrap()).unwrap();
    path
}

/// Logits of `rows` rows of `vocab` values, deterministic and with a clear argmax per row.
fn logits(rows: usize, vocab: usize) -> Vec<f32> {
    (0..rows * vocab)
        .map(|i| {
            ((i * 7919) % 1000) as f32 / 100.0 - 5.0
                + if i % vocab == (i / vocab) % vocab {
                    20.0
                } else {
                    0.0
                }
        })
        .collect()
}

const TOL: Policy = Policy::Tolerance {
    max_abs: Some(0.01),
    max_rel: Some(0.01),
    argmax: true,
};

#[test]
fn identical_artifacts_pass() {
    let dir = tempfile::tempdir().unwrap();
    let t = [
        ("logits", vec![4, 64], logits(4, 64)),
        ("step.0", vec![2, 64], logits(2, 64)),
    ];
    let a = write(dir.path(), "a.safetensors", &t);
    let b = write(dir.path(), "b.safetensors", &t);
    for policy in [Policy::Bitwise, TOL, Policy::ArgmaxAgree { min_agree: 1.0 }] {
        let r = compare_files(&a, &b, &policy);
        assert!(r.passed(), "{policy:?}: {:?}", r.failures);
        assert_eq!(r.tensors_compared, 2);
        assert_eq!(r.values_compared, 6 * 64);
        assert_eq!(r.mismatches, 0);
        assert_eq!(r.first_mismatch, None);
    }
}

#[test]
fn one_flipped_bit_fails_bitwise_naming_the_element() {
    let dir = tempfile::tempdir().unwrap();
    let good = logits(3, 100);
    let mut bad = good.clone();
    bad[2 * 100 + 17] = f32::from_bits(bad[2 * 100 + 17].to_bits() ^ 1);
    let a = write(
        dir.path(),
        "a.safetensors",
        &[("step.5", vec![3, 100], good.clone())],
    );
    let b = write(
        dir.path(),
        "b.safetensors",
        &[("step.5", vec![3, 100], bad.clone())],
    );
    let r = compare_files(&a, &b, &Policy::Bitwise);
    assert!(!r.passed());
    assert_eq!(r.mismatches, 1);
    let m = r.first_mismatch.clone().unwrap();
    assert_eq!(
        (m.tensor.as_str(), m.step, m.row, m.index),
        ("step.5", Some(5), 2, 17)
    );
    assert_eq!((m.reference as f32, m.got as f32), (good[217], bad[217]));
    assert!(
        r.failures[0].contains("row 2, index 17"),
        "{:?}",
        r.failures
    );
    // The same one-ulp difference is well inside a tolerance.
    assert!(compare_files(&a, &b, &TOL).passed());
    // The report serializes for receipts, with the protocol's `ref` name.
    let json = serde_json::to_value(&r).unwrap();
    // Written as the f32 prints (`-0.77`), reading back as that f32.
    let shown = json["first_mismatch"]["ref"].as_f64().unwrap();
    assert_eq!(shown as f32, good[217]);
    assert_eq!(shown.to_string(), good[217].to_string());
}

#[test]
fn tolerance_inside_passes_and_outside_fails() {
    let dir = tempfile::tempdir().unwrap();
    let base = logits(2, 50);
    let a = write(
        dir.path(),
        "a.safetensors",
        &[("logits", vec![2, 50], base.clone())],
    );
    let shifted = |d: f32| -> Vec<f32> { base.iter().map(|x| x + d).collect() };
    let inside = write(
        dir.path(),
        "in.safetensors",
        &[("logits", vec![2, 50], shifted(0.005))],
    );
    let outside = write(
        dir.path(),
        "out.safetensors",
        &[("logits", vec![2, 50], shifted(0.05))],
    );
    let r = compare_files(&a, &inside, &TOL);
    assert!(r.passed(), "{:?}", r.failures);
    assert!(
        r.tensors[0].max_abs > 0.004 && r.tensors[0].max_abs < 0.006,
        "{}",
        r.tensors[0].max_abs
    );
    let r = compare_files(&a, &outside, &TOL);
    assert!(!r.passed());
    assert_eq!(r.mismatches, 100);
    assert!(
        r.failures[0].contains("exceed the tolerance"),
        "{:?}",
        r.failures
    );
    // The relative bound alone: denominator max(1, |ref|), so 0.05 on values near 20 is 0.25 %.
    let rel_only = Policy::Tolerance {
        max_abs: None,
        max_rel: Some(0.003),
        argmax: false,
    };
    let big: Vec<f32> = vec![20.0; 10];
    let big_shift: Vec<f32> = vec![20.05; 10];
    let p = write(dir.path(), "p.safetensors", &[("logits", vec![1, 10], big)]);
    let q = write(
        dir.path(),
        "q.safetensors",
        &[("logits", vec![1, 10], big_shift)],
    );
    assert!(compare_files(&p, &q, &rel_only).passed());
}

#[test]
fn argmax_flip_fails_argmax_policies() {
    let dir = tempfile::tempdir().unwrap();
    let mut r0 = vec![0.0f32; 20];
    r0[3] = 1.0;
    r0[4] = 0.999;
    let mut c0 = r0.clone();
    c0[4] = 1.001;
    let rows = 10;
    let reference: Vec<f32> = (0..rows).flat_map(|_| r0.clone()).collect();
    let mut candidate = reference.clone();
    candidate[7 * 20..8 * 20].copy_from_slice(&c0);
    let a = write(
        dir.path(),
        "a.safetensors",
        &[("logits", vec![rows, 20], reference)],
    );
    let b = write(
        dir.path(),
        "b.safetensors",
        &[("logits", vec![rows, 20], candidate)],
    );
    // Values are within 0.01, but the argmax of row 7 moved from 3 to 4.
    let r = compare_files(&a, &b, &TOL);
    assert!(!r.passed());
    assert_eq!(r.argmax_agree, 9);
    let m = r.first_mismatch.unwrap();
    assert_eq!(
        (m.kind, m.row, m.index, m.got_argmax),
        (MismatchKind::Argmax, 7, 3, Some(4))
    );
    // 9 of 10 rows agree: enough for 0.9, not for 0.95.
    assert!(compare_files(&a, &b, &Policy::ArgmaxAgree { min_agree: 0.9 }).passed());
    let r = compare_files(&a, &b, &Policy::ArgmaxAgree { min_agree: 0.95 });
    assert!(!r.passed());
    assert!(r.failures[0].contains("9 of 10 rows"), "{:?}", r.failures);
}

#[test]
fn shape_mismatch_fails_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let a = write(
        dir.path(),
        "a.safetensors",
        &[("logits", vec![2, 8], logits(2, 8))],
    );
    let b = write(
        dir.path(),
        "b.safetensors",
        &[("logits", vec![4, 4], logits(2, 8))],
    );
    let r = compare_files(&a, &b, &Policy::Bitwise);
    assert!(!r.passed());
    assert_eq!(
        r.failures,
        ["tensor `logits`: shape differs (reference [2, 8], candidate [4, 4])"]
    );
    assert_eq!(r.tensors_compared, 0);
}

#[test]
fn missing_and_extra_tensors_fail() {
    let dir = tempfile::tempdir().unwrap();
    let a = write(
        dir.path(),
        "a.safetensors",
        &[
            ("step.0", vec![1, 8], logits(1, 8)),
            ("step.1", vec![1, 8], logits(1, 8)),
        ],
    );
    let b = write(
        dir.path(),
        "b.safetensors",
        &[
            ("step.0", vec![1, 8], logits(1, 8)),
            ("step.2", vec![1, 8], logits(1, 8)),
        ],
    );
    let r = compare_files(&a, &b, &Policy::Bitwise);
    assert!(!r.passed());
    assert!(
        r.failures
            .contains(&"tensor `step.1` is missing from the candidate".to_string()),
        "{:?}",
        r.failures
    );
    assert!(
        r.failures
            .contains(&"tensor `step.2` is in the candidate but not in the reference".to_string())
    );
    assert_eq!(r.tensors_compared, 1);
}

#[test]
fn unreadable_files_fail_without_panicking() {
    let dir = tempfile::tempdir().unwrap();
    let a = write(
        dir.path(),
        "a.safetensors",
        &[("logits", vec![1, 4], logits(1, 4))],
    );
    let junk = dir.path().join("junk.safetensors");
    std::fs::write(&junk, b"not a safetensors file").unwrap();
    let r = compare_files(&a, &junk, &Policy::Bitwise);
    assert!(!r.passed());
    assert!(
        r.failures[0].contains("is not a valid safetensors file"),
        "{:?}",
        r.failures
    );
    let r = compare_files(&dir.path().join("absent"), &a, &Policy::Bitwise);
    assert!(
        r.failures[0].contains("cannot open the reference artifact"),
        "{:?}",
        r.failures
    );
}

#[test]
fn dtype_mismatch_fails_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let a = write(
        dir.path(),
        "a.safetensors",
        &[("logits", vec![1, 4], logits(1, 4))],
    );
    // The same tensor stored as F16 (8 bytes for 4 values).
    let half = [0u8; 8];
    let view = TensorView::new(Dtype::F16, vec![1, 4], &half).unwrap();
    let b = dir.path().join("b.safetensors");
    std::fs::write(&b, serialize([("logits", view)], None).unwrap()).unwrap();
    let r = compare_files(&a, &b, &Policy::Bitwise);
    assert!(!r.passed());
    assert_eq!(
        r.failures,
        ["tensor `logits`: dtype differs (reference F32, candidate F16)"]
    );
    // Two F16 files are compared in their own dtype.
    let r = compare_files(&b, &b, &Policy::Bitwise);
    assert!(r.passed(), "{:?}", r.failures);
    assert_eq!(r.tensors[0].dtype, "F16");
}

/// Runs `compare_files` on a thread and fails the test if it does not answer within
/// `limit` (a comparison that blocks would otherwise hang the test binary).
fn within(
    limit: std::time::Duration,
    a: PathBuf,
    b: PathBuf,
) -> memra_orch::gate::judge::CompareReport {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(compare_files(&a, &b, &Policy::Bitwise));
    });
    rx.recv_timeout(limit)
        .expect("compare_files blocked instead of refusing the file")
}

#[test]
fn a_fifo_artifact_is_refused_without_blocking() {
    let dir = tempfile::tempdir().unwrap();
    let a = write(
        dir.path(),
        "a.safetensors",
        &[("logits", vec![1, 4], logits(1, 4))],
    );
    let fifo = dir.path().join("b.safetensors");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let r = within(std::time::Duration::from_secs(20), a, fifo);
    assert!(!r.passed());
    assert_eq!(r.failures.len(), 1, "{:?}", r.failures);
    assert!(
        r.failures[0].starts_with("cannot open the candidate artifact: ")
            && r.failures[0].contains("b.safetensors is a FIFO, not a regular file"),
        "{:?}",
        r.failures
    );
}

#[test]
fn a_linked_artifact_is_refused_and_not_followed() {
    let dir = tempfile::tempdir().unwrap();
    let t = [("logits", vec![2, 8], logits(2, 8))];
    let a = write(dir.path(), "a.safetensors", &t);
    let outside = write(dir.path(), "outside.safetensors", &t);
    let link = dir.path().join("b.safetensors");
    std::os::unix::fs::symlink(&outside, &link).unwrap();
    let r = within(std::time::Duration::from_secs(20), a, link);
    assert_eq!(r.tensors_compared, 0, "the target was not read");
    assert!(
        r.failures[0].contains("b.safetensors is a symbolic link"),
        "{:?}",
        r.failures
    );
}
