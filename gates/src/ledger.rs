//! What a gate arm compared and where it first went wrong: the ledger of bitwise logit and
//! token comparisons, and the tolerance policy of the reference gate.
//!
//! It owns the comparison rules and their bookkeeping, not the programs that produce the
//! numbers (the gates' workloads) nor how results are reported (`protocol`).

use memra_protocol::{Check, FirstMismatch, Status};

/// The record of one arm's comparisons: f32 values compared, rows compared and mismatched,
/// the largest difference and the first mismatch.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Ledger {
    pub compared: u64,
    pub rows: u64,
    pub rows_mismatched: u64,
    pub maxdiff: f64,
    pub first: Option<FirstMismatch>,
}

impl Ledger {
    /// Compares `[B, n_vocab]` logits bit for bit; row `b` of `got` against row `b` of
    /// `reference`, at decode `step`. A shape difference counts every row as mismatched.
    pub fn logits(&mut self, step: Option<usize>, reference: &[f32], got: &[f32], n_vocab: usize) {
        if reference.len() != got.len() {
            let rows = (reference.len().max(got.len()) / n_vocab.max(1)) as u64;
            self.rows += rows;
            self.rows_mismatched += rows;
            self.maxdiff = f64::INFINITY;
            self.first.get_or_insert(FirstMismatch {
                step,
                row: 0,
                index: 0,
                reference: reference.len() as f64,
                got: got.len() as f64,
            });
            return;
        }
        for (row, (r, g)) in reference
            .chunks_exact(n_vocab)
            .zip(got.chunks_exact(n_vocab))
            .enumerate()
        {
            self.row(step, row, r, g);
        }
    }

    /// Compares one row bit for bit.
    pub fn row(&mut self, step: Option<usize>, row: usize, reference: &[f32], got: &[f32]) {
        self.rows += 1;
        self.compared += reference.len() as u64;
        let mut bad = false;
        for (index, (&r, &g)) in reference.iter().zip(got).enumerate() {
            if r.to_bits() != g.to_bits() {
                let d = (r as f64 - g as f64).abs();
                self.maxdiff = self.maxdiff.max(if d.is_nan() { f64::INFINITY } else { d });
                if !bad {
                    bad = true;
                    self.first.get_or_insert(FirstMismatch {
                        step,
                        row,
                        index,
                        reference: r as f64,
                        got: g as f64,
                    });
                }
            }
        }
        if bad {
            self.rows_mismatched += 1;
        }
    }

    /// Compares chosen tokens, one per row, at decode `step`; a mismatch records the two
    /// token ids as `ref` and `got` (index 0).
    pub fn tokens(&mut self, step: Option<usize>, reference: &[u32], got: &[u32]) {
        for (row, (&r, &g)) in reference.iter().zip(got).enumerate() {
            self.token(step, row, r, g);
        }
        if reference.len() != got.len() {
            self.rows_mismatched += 1;
        }
    }

    /// One row's chosen token, for checks that hold on some rows of a batch only.
    pub fn token(&mut self, step: Option<usize>, row: usize, reference: u32, got: u32) {
        self.rows += 1;
        self.compared += 1;
        if reference != got {
            self.rows_mismatched += 1;
            self.first.get_or_insert(FirstMismatch {
                step,
                row,
                index: 0,
                reference: reference as f64,
                got: got as f64,
            });
        }
    }

    /// Adds another ledger's counts (its first mismatch only if this one has none).
    pub fn absorb(&mut self, other: &Ledger) {
        self.compared += other.compared;
        self.rows += other.rows;
        self.rows_mismatched += other.rows_mismatched;
        self.maxdiff = self.maxdiff.max(other.maxdiff);
        if self.first.is_none() {
            self.first = other.first;
        }
    }

    pub fn clean(&self) -> bool {
        self.rows_mismatched == 0 && self.first.is_none()
    }

    /// The check row of this ledger: pass iff nothing mismatched.
    pub fn check(&self, name: impl Into<String>, what: &str) -> Check {
        let status = if self.clean() {
            Status::Pass
        } else {
            Status::Fail
        };
        let message = if self.clean() {
            format!("{what}: {} rows bit-identical", self.rows)
        } else {
            format!(
                "{what}: {} of {} rows differ",
                self.rows_mismatched, self.rows
            )
        };
        let mut c = Check::new(name, status, message)
            .metric("compared", self.compared)
            .metric("rows", self.rows)
            .metric("rows_mismatched", self.rows_mismatched)
            .metric("maxdiff", finite(self.maxdiff));
        c.first_mismatch = self.first;
        c
    }
}

fn finite(v: f64) -> serde_json::Value {
    if v.is_finite() {
        serde_json::json!(v)
    } else {
        serde_json::json!(v.to_string())
    }
}

/// The first index of the largest value (NaN never wins): the host argmax every gate
/// compares a device's choice with, written here independently of the kernel twins.
pub fn host_argmax(row: &[f32]) -> u32 {
    let mut best = 0usize;
    let mut best_v = f32::NEG_INFINITY;
    let mut seen = false;
    for (i, &v) in row.iter().enumerate() {
        if v.is_nan() {
            continue;
        }
        if !seen || v > best_v {
            best = i;
            best_v = v;
            seen = true;
        }
    }
    best as u32
}

/// The reference gate's policy: every element within `max_abs` absolutely **and** within
/// `max_rel` relative to `max(1, |ref|)`, and the same argmax. Both bounds, as the seed's
/// policy and memra-orch's own compare have them: with "either", a large logit could move
/// by `max_rel·|ref|` (0.4 on a logit of 40) and pass.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Policy {
    pub max_abs: f64,
    pub max_rel: f64,
}

impl Policy {
    pub const REFERENCE: Policy = Policy {
        max_abs: 0.01,
        max_rel: 0.01,
    };

    /// Compares one row.
    pub fn row(&self, reference: &[f32], got: &[f32]) -> RowVerdict {
        let mut v = RowVerdict {
            max_abs: 0.0,
            max_rel: 0.0,
            rel_rms: 0.0,
            argmax_ref: host_argmax(reference),
            argmax_got: host_argmax(got),
            first_bad: None,
            ok: reference.len() == got.len(),
        };
        let (mut err2, mut ref2) = (0.0f64, 0.0f64);
        for (i, (&r, &g)) in reference.iter().zip(got).enumerate() {
            let d = (r as f64 - g as f64).abs();
            let d = if d.is_nan() { f64::INFINITY } else { d };
            err2 += d * d;
            ref2 += r as f64 * r as f64;
            let rel = d / (r as f64).abs().max(1.0);
            v.max_abs = v.max_abs.max(d);
            v.max_rel = v.max_rel.max(rel);
            if (d > self.max_abs || rel > self.max_rel) && v.first_bad.is_none() {
                v.first_bad = Some(i);
            }
        }
        v.rel_rms = (err2 / ref2.max(f64::MIN_POSITIVE)).sqrt();
        if v.first_bad.is_some() || v.argmax_ref != v.argmax_got {
            v.ok = false;
        }
        v
    }
}

/// One row under [`Policy`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RowVerdict {
    pub max_abs: f64,
    pub max_rel: f64,
    /// `‖got − ref‖₂ / ‖ref‖₂` over the row: how much of the row moved, where max_abs says
    /// how far the worst value moved.
    pub rel_rms: f64,
    pub argmax_ref: u32,
    pub argmax_got: u32,
    /// First element outside either bound.
    pub first_bad: Option<usize>,
    pub ok: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_single_flipped_bit_is_a_mismatch_with_its_location() {
        let a = vec![1.0f32, 2.0, 3.0, 4.0];
        let mut b = a.clone();
        b[3] = f32::from_bits(b[3].to_bits() ^ 1);
        let mut l = Ledger::default();
        l.logits(Some(5), &a, &b, 2);
        assert_eq!((l.rows, l.rows_mismatched, l.compared), (2, 1, 4));
        let m = l.first.unwrap();
        assert_eq!((m.step, m.row, m.index), (Some(5), 1, 1));
        assert_eq!(l.check("x", "y").status, Status::Fail);
        let mut clean = Ledger::default();
        clean.logits(None, &a, &a, 2);
        assert_eq!(clean.check("x", "y").status, Status::Pass);
    }

    #[test]
    fn negative_zero_is_not_zero_bitwise() {
        let mut l = Ledger::default();
        l.row(None, 0, &[0.0], &[-0.0]);
        assert!(!l.clean());
    }

    #[test]
    fn tokens_are_compared_per_row() {
        let mut l = Ledger::default();
        l.tokens(Some(1), &[4, 5, 6], &[4, 9, 6]);
        assert_eq!(l.rows_mismatched, 1);
        assert_eq!(l.first.unwrap().row, 1);
    }

    #[test]
    fn host_argmax_takes_the_first_maximum_and_skips_nan() {
        assert_eq!(host_argmax(&[1.0, 3.0, 3.0, 2.0]), 1);
        assert_eq!(host_argmax(&[f32::NAN, -1.0, -2.0]), 1);
        assert_eq!(host_argmax(&[f32::NEG_INFINITY, f32::NEG_INFINITY]), 0);
    }

    #[test]
    fn policy_needs_both_bounds() {
        let p = Policy::REFERENCE;
        // Within 0.01 relative of a large logit but 0.4 away: outside max_abs, so it fails.
        let far = p.row(&[50.0, 1.0], &[50.4, 1.0]);
        assert!(!far.ok && far.first_bad == Some(0), "{far:?}");
        assert!(p.row(&[50.0, 1.0], &[50.005, 1.0]).ok);
        assert!(!p.row(&[0.5, 1.0], &[0.52, 1.0]).ok);
        assert!(p.row(&[0.5, 1.0], &[0.505, 1.0]).ok);
        let swapped = p.row(&[1.0, 1.001], &[1.001, 1.0]);
        assert!(
            swapped.first_bad.is_none() && !swapped.ok,
            "argmax must agree"
        );
    }
}
