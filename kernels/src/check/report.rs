//! kernel-check's results: one [`CheckRow`] per kernel and geometry, the comparisons that
//! produce them (bitwise or within a tolerance, with the maximum error and the first
//! mismatch), and the line each prints.
//!
//! The row's wire form (DESIGN §5) is `memra-protocol`'s [`Check`]; this module owns only
//! kernel-check's metrics (`maxdiff`, `compared`, `mismatches`) and its printed report.

use memra_protocol::{Check, FirstMismatch, Status};

/// One check row.
#[derive(Debug, Clone, PartialEq)]
pub struct CheckRow {
    /// `kernel-check/<kernel>/<geometry>`.
    pub name: String,
    pub status: Status,
    /// Largest absolute difference seen.
    pub maxdiff: f64,
    /// Elements compared.
    pub compared: usize,
    /// Elements outside the policy.
    pub mismatches: usize,
    /// The policy in words (`bitwise`, `max_abs 2e-5`, …) or the reason for a skip/fail.
    pub message: String,
    pub first_mismatch: Option<FirstMismatch>,
}

impl CheckRow {
    pub fn skip(name: impl Into<String>, message: impl Into<String>) -> Self {
        CheckRow {
            name: name.into(),
            status: Status::Skip,
            maxdiff: 0.0,
            compared: 0,
            mismatches: 0,
            message: message.into(),
            first_mismatch: None,
        }
    }

    pub fn error(name: impl Into<String>, message: impl Into<String>) -> Self {
        CheckRow {
            status: Status::Fail,
            ..Self::skip(name, message)
        }
    }

    /// The gate-protocol row: the metrics `maxdiff`, `compared` and `mismatches`, in that
    /// order, the message, and the first mismatch.
    pub fn to_check(&self) -> Check {
        Check {
            first_mismatch: self.first_mismatch,
            ..Check::new(self.name.clone(), self.status, self.message.clone())
                .metric("maxdiff", self.maxdiff)
                .metric("compared", self.compared)
                .metric("mismatches", self.mismatches)
        }
    }

    /// One human line.
    pub fn line(&self) -> String {
        let mut s = format!(
            "{:4} {:<58} maxdiff={:<10.3e} compared={:<9} {}",
            self.status.as_str().to_uppercase(),
            self.name,
            self.maxdiff,
            self.compared,
            self.message
        );
        if let Some(m) = &self.first_mismatch {
            s.push_str(&format!(
                " first mismatch row {} index {}: ref {} got {}",
                m.row, m.index, m.reference, m.got
            ));
        }
        s
    }
}

/// Compares `got` with `reference` in rows of `row_len`: bitwise when `tol` is `None` (NaN
/// equals NaN), else `|got - ref| <= tol * max(1, |ref|)`.
pub fn compare_f32(
    name: String,
    reference: &[f32],
    got: &[f32],
    row_len: usize,
    tol: Option<f64>,
) -> CheckRow {
    if reference.len() != got.len() {
        return CheckRow::error(
            name,
            format!(
                "length differs: reference {} vs device {}",
                reference.len(),
                got.len()
            ),
        );
    }
    let mut row = CheckRow {
        name,
        status: Status::Pass,
        maxdiff: 0.0,
        compared: reference.len(),
        mismatches: 0,
        message: match tol {
            None => "bitwise".into(),
            Some(t) => format!("|d| <= {t:e} * max(1,|ref|)"),
        },
        first_mismatch: None,
    };
    for (i, (&r, &g)) in reference.iter().zip(got).enumerate() {
        let diff = (r as f64 - g as f64).abs();
        let bad = match tol {
            None => r.to_bits() != g.to_bits() && !(r.is_nan() && g.is_nan()),
            // NaN differences fail: `diff <= tol` is false for them.
            Some(t) => diff.is_nan() || diff > t * (r.abs() as f64).max(1.0),
        };
        if diff.is_finite() {
            row.maxdiff = row.maxdiff.max(diff);
        }
        if bad {
            row.mismatches += 1;
            if row.first_mismatch.is_none() {
                let rl = row_len.max(1);
                row.first_mismatch = Some(FirstMismatch {
                    step: None,
                    row: i / rl,
                    index: i % rl,
                    reference: r as f64,
                    got: g as f64,
                });
            }
        }
    }
    if row.mismatches > 0 {
        row.status = Status::Fail;
    }
    row
}

/// Bitwise comparison of integers (token ids, raw words, quantized bytes).
pub fn compare_u32(name: String, reference: &[u32], got: &[u32], row_len: usize) -> CheckRow {
    let r: Vec<f32> = reference.iter().map(|&v| f32::from_bits(v)).collect();
    let g: Vec<f32> = got.iter().map(|&v| f32::from_bits(v)).collect();
    let mut row = compare_f32(name, &r, &g, row_len, None);
    // Report integer values, not their float reinterpretation.
    row.maxdiff = reference
        .iter()
        .zip(got)
        .map(|(&a, &b)| (a as f64 - b as f64).abs())
        .fold(0.0, f64::max);
    if let Some(m) = &mut row.first_mismatch {
        let i = m.row * row_len.max(1) + m.index;
        m.reference = reference[i] as f64;
        m.got = got[i] as f64;
    }
    row
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bitwise_catches_one_ulp_and_reports_first_mismatch() {
        let a = [1.0f32, 2.0, 3.0, 4.0];
        let mut b = a;
        b[3] = f32::from_bits(4.0f32.to_bits() + 1);
        let row = compare_f32("x".into(), &a, &b, 2, None);
        assert_eq!(row.status, Status::Fail);
        assert_eq!(row.mismatches, 1);
        let m = row.first_mismatch.unwrap();
        assert_eq!((m.row, m.index), (1, 1));
        assert!(row.maxdiff > 0.0);
        let j = row.to_check().to_json();
        assert_eq!(j["status"], "fail");
        assert_eq!(j["first_mismatch"]["row"], 1);
        assert_eq!(
            compare_f32("y".into(), &a, &a, 2, None).status,
            Status::Pass
        );
    }

    #[test]
    fn tolerance_accepts_small_and_rejects_large_and_nan() {
        let a = [1.0f32, 100.0];
        let row = compare_f32("t".into(), &a, &[1.0 + 1e-7, 100.0 + 1e-4], 2, Some(2e-6));
        assert_eq!(row.status, Status::Pass);
        let row = compare_f32("t".into(), &a, &[1.1, 100.0], 2, Some(2e-6));
        assert_eq!(row.status, Status::Fail);
        let row = compare_f32("t".into(), &a, &[f32::NAN, 100.0], 2, Some(2e-6));
        assert_eq!(row.status, Status::Fail);
    }

    #[test]
    fn integers_compare_exactly() {
        let row = compare_u32("tok".into(), &[5, 7], &[5, 8], 1);
        assert_eq!(row.status, Status::Fail);
        assert_eq!(row.first_mismatch.unwrap().got, 8.0);
        assert_eq!(row.maxdiff, 1.0);
    }
}
