//! Tie following: the oracle's q8_1 quantization of one site, checked block by block against
//! the blocks a backend recorded ([`ActivationTrace`]), adopting the backend's side of a
//! rounding only where the oracle's own value sits on a rounding tie.
//!
//! It owns the tie windows, the per-block decision and the report (ties followed, hard
//! mismatches). It does not compute activations (the oracle's walk in `super` does) and it
//! does not judge logits (the gates do).
//!
//! The windows share one budget: every value the oracle adopts must be explained by moving
//! each of the oracle's activations by at most [`TIE_WINDOW`] steps of the block's q grid
//! (`ε = TIE_WINDOW · d`, `d = amax/127`). So a `q` is followed when `|x/d − (k+½)| ≤
//! TIE_WINDOW`; the f16 `d` when `amax/127` is within `ε/127` of the midpoint of the two f16
//! values; the f16 block sum `s = d·Σq` (the rounded values' sum, over the `q` as followed)
//! when `Σq·amax/127` is within `|Σq|·ε/127` of theirs. Each may differ by one step only. Everything else — a `q` off by two, a `q` off by one far from a tie, a
//! `d` or `s` on another f16 value without a tie, a fused factor `r` off by more than a
//! relative 1e-3 — is a hard mismatch, reported with its place, after which the oracle
//! goes on with its own value.

use std::fmt;

use half::f16;

use crate::backend::trace::{ActivationTrace, Composition, Site, SiteKey, SiteRecord};
use crate::seq::SeqId;

/// Width of the tie window in steps of the q8_1 grid (see the module docs).
pub const TIE_WINDOW: f64 = 1e-3;

/// Relative difference above which the fused tier's norm factor `r` is a mismatch: the
/// oracle computes it in f64 and the backend in f32, which differ by a few f32 ulps.
pub const R_WINDOW: f64 = 1e-3;

/// The rounding error of the backend's f32 `amax/127`, relative: one f32 rounding.
const F32_DIV: f64 = 1.0 / (1u64 << 24) as f64;

/// The rounding error of the backend's f32 block sum `Σq·d`, relative: `d = amax/127` and the
/// product each round once (`Σq` converts exactly).
const F32_BLOCK_SUM: f64 = 2.0 / (1u64 << 24) as f64;

/// How many mismatches a report keeps in full (all of them are counted).
pub const KEPT_MISMATCHES: usize = 32;

/// One value where the oracle and the backend disagree beyond a tie.
#[derive(Debug, Clone, PartialEq)]
pub struct QuantMismatch {
    pub layer: usize,
    pub site: Site,
    pub pos: usize,
    pub block: usize,
    /// The element within the block for `q`; `None` for `d`, `s`, `r` and shape errors.
    pub element: Option<usize>,
    /// Which value: `q`, `d`, `s`, `r` or `blocks` (the record has another width).
    pub field: &'static str,
    pub oracle: f64,
    pub engine: f64,
}

impl fmt::Display for QuantMismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "layer {} {} pos {} block {}",
            self.layer, self.site, self.pos, self.block
        )?;
        if let Some(e) = self.element {
            write!(f, " element {e}")?;
        }
        write!(
            f,
            ": {} oracle {} engine {}",
            self.field, self.oracle, self.engine
        )
    }
}

/// What following a trace found.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FollowReport {
    /// Sites (one row of one site) compared against a record.
    pub sites: usize,
    /// Sites the oracle quantized that the trace has no record of (rows whose logits the
    /// backend never produced, e.g. the prompt rows of `prime`); they use the oracle's values.
    pub untraced: usize,
    /// Values where the backend's side of a rounding tie was adopted.
    pub ties_followed: usize,
    /// Of those, how many were `q` steps, f16 `d` and f16 `s` values.
    pub ties_q: usize,
    pub ties_d: usize,
    pub ties_s: usize,
    /// The largest distance from a tie among followed values, in units of its window
    /// (≤ 1 by construction; how close to the window the run came).
    pub worst_tie_fraction: f64,
    /// Every hard mismatch counted.
    pub mismatch_count: usize,
    /// The first [`KEPT_MISMATCHES`] mismatches in full.
    pub mismatches: Vec<QuantMismatch>,
}

impl FollowReport {
    fn mismatch(&mut self, m: QuantMismatch) {
        self.mismatch_count += 1;
        if self.mismatches.len() < KEPT_MISMATCHES {
            self.mismatches.push(m);
        }
    }

    fn tie(&mut self, fraction: f64) {
        self.ties_followed += 1;
        self.worst_tie_fraction = self.worst_tie_fraction.max(fraction);
    }
}

/// The trace being followed, the sequence whose positions are the oracle's rows, and the
/// report so far.
pub(super) struct Follower<'a> {
    pub trace: &'a ActivationTrace,
    pub seq: SeqId,
    pub report: FollowReport,
}

impl Follower<'_> {
    fn record(&self, pos: usize, layer: usize, site: Site) -> Option<&SiteRecord> {
        self.trace.get(&SiteKey {
            seq: self.seq,
            pos,
            layer,
            site,
        })
    }

    /// The composition the backend ran at a site (separate when unrecorded).
    pub fn composition(&self, pos: usize, layer: usize, site: Site) -> Composition {
        self.record(pos, layer, site)
            .map_or(Composition::Separate, |r| r.composition)
    }

    /// Compares the oracle's fused norm factor with the backend's.
    pub fn check_r(&mut self, pos: usize, layer: usize, site: Site, r: f64) {
        let Some(got) = self.record(pos, layer, site).and_then(|rec| rec.r) else {
            return;
        };
        if ((got as f64) - r).abs() > R_WINDOW * r.abs() {
            self.report.mismatch(QuantMismatch {
                layer,
                site,
                pos,
                block: 0,
                element: None,
                field: "r",
                oracle: r,
                engine: got as f64,
            });
        }
    }

    /// One row of one site quantized to q8_1, following the backend's record at ties:
    /// the values the weights' scaled parts meet (`d·q`) and the block sums their offsets
    /// meet (`s = d·Σq` over the block's `q` as followed), both as the f16 values the blocks
    /// hold.
    pub fn quantize_row(
        &mut self,
        x: &[f32],
        pos: usize,
        layer: usize,
        site: Site,
    ) -> (Vec<f64>, Vec<f64>) {
        let trace = self.trace;
        let rec = trace.get(&SiteKey {
            seq: self.seq,
            pos,
            layer,
            site,
        });
        let nb = x.len() / 32;
        let rec = match rec {
            None => {
                self.report.untraced += 1;
                None
            }
            Some(r) if r.blocks.len() != nb => {
                self.report.mismatch(QuantMismatch {
                    layer,
                    site,
                    pos,
                    block: 0,
                    element: None,
                    field: "blocks",
                    oracle: nb as f64,
                    engine: r.blocks.len() as f64,
                });
                None
            }
            Some(r) => {
                self.report.sites += 1;
                Some(r)
            }
        };
        let mut values = Vec::with_capacity(x.len());
        let mut sums = Vec::with_capacity(nb);
        for (b, block) in x.chunks_exact(32).enumerate() {
            let place = |element, field, oracle, engine| QuantMismatch {
                layer,
                site,
                pos,
                block: b,
                element,
                field,
                oracle,
                engine,
            };
            let amax = block.iter().fold(0.0f32, |m, v| m.max(v.abs()));
            // The q grid is the f32 `amax/127`, as the kernels compute it; only its stored
            // copy is rounded to f16.
            let d32 = amax / 127.0;
            let eps = TIE_WINDOW * d32 as f64;
            let mut d16 = f16::from_f64(amax as f64 / 127.0);
            let engine = rec.map(|r| &r.blocks[b]);
            if let Some(e) = engine {
                let d_window = eps / 127.0 + F32_DIV * d32 as f64;
                match f16_follow(amax as f64 / 127.0, d16, e.d, d_window) {
                    F16Step::Same => {}
                    F16Step::Tie(frac) => {
                        d16 = e.d;
                        self.report.ties_d += 1;
                        self.report.tie(frac);
                    }
                    F16Step::Apart => {
                        self.report
                            .mismatch(place(None, "d", d16.to_f64(), e.d.to_f64()))
                    }
                }
            }
            let d = d16.to_f64();
            let mut qsum = 0.0f64;
            for (j, &v) in block.iter().enumerate() {
                let (mut q, t) = if amax == 0.0 {
                    (0.0, 0.0)
                } else {
                    let t = v as f64 / d32 as f64;
                    (t.round(), t)
                };
                if let Some(e) = engine {
                    let got = e.qs[j] as f64;
                    if got != q {
                        let lo = q.min(got);
                        let off = (t - (lo + 0.5)).abs();
                        if (got - q).abs() == 1.0 && off <= TIE_WINDOW {
                            q = got;
                            self.report.ties_q += 1;
                            self.report.tie(off / TIE_WINDOW);
                        } else {
                            self.report.mismatch(place(Some(j), "q", q, got));
                        }
                    }
                }
                qsum += q;
                values.push(d * q);
            }
            // The block sum is d·Σq with the unrounded d, as the kernels store it; Σq is over
            // the q values as followed, so a followed q step moves it with the backend's.
            let exact_s = qsum * (amax as f64 / 127.0);
            let mut s16 = f16::from_f64(exact_s);
            if let Some(e) = engine {
                let s_window = qsum.abs() * eps / 127.0 + F32_BLOCK_SUM * exact_s.abs();
                match f16_follow(exact_s, s16, e.s, s_window) {
                    F16Step::Same => {}
                    F16Step::Tie(frac) => {
                        s16 = e.s;
                        self.report.ties_s += 1;
                        self.report.tie(frac);
                    }
                    F16Step::Apart => {
                        self.report
                            .mismatch(place(None, "s", s16.to_f64(), e.s.to_f64()))
                    }
                }
            }
            sums.push(s16.to_f64());
        }
        (values, sums)
    }
}

/// How the oracle's f16 rounding of `exact` (giving `own`) relates to the backend's `got`.
enum F16Step {
    Same,
    /// `got` is the f16 rounding of a value within `window` of `exact`: the backend's f32
    /// arithmetic explains it. Carries how much of the window the gap used.
    Tie(f64),
    Apart,
}

/// Decides whether `got` is explained: the rounding cell of `got` (half its f16 spacing on
/// either side) reaches within `window` of the oracle's exact value. One f16 step is the
/// usual case; a sum that cancels to a small value may honestly land several steps away,
/// because the backend's f32 rounding error is relative to `Σ|x|`, not to the sum.
fn f16_follow(exact: f64, own: f16, got: f16, window: f64) -> F16Step {
    if own == got {
        return F16Step::Same;
    }
    let g = got.to_f64();
    let a = g.abs();
    let spacing = if a < 2f64.powi(-14) {
        2f64.powi(-24)
    } else {
        2f64.powi(a.log2().floor() as i32 - 10)
    };
    let gap = ((exact - g).abs() - spacing / 2.0).max(0.0);
    if got.is_finite() && gap <= window {
        F16Step::Tie(if window > 0.0 { gap / window } else { 0.0 })
    } else {
        F16Step::Apart
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::trace::Composition;
    use memra_kernels::blocks::BlockQ8_1;

    fn trace_of(block: BlockQ8_1) -> ActivationTrace {
        let mut t = ActivationTrace::new();
        t.record(
            SiteKey {
                seq: SeqId(0),
                pos: 0,
                layer: 0,
                site: Site::AttnOut,
            },
            SiteRecord {
                composition: Composition::Separate,
                blocks: vec![block],
                r: None,
            },
        );
        t
    }

    /// A block whose element 1 sits exactly on the tie 2.5 of its q grid.
    fn tie_block() -> Vec<f32> {
        let mut x = vec![0.0f32; 32];
        x[0] = 127.0;
        x[1] = 2.5;
        x
    }

    fn own_block(x: &[f32]) -> BlockQ8_1 {
        let mut q = [0i8; 32];
        for (q, &v) in q.iter_mut().zip(x) {
            *q = v.round() as i8;
        }
        BlockQ8_1 {
            d: f16::from_f32(1.0),
            s: f16::from_f64(q.iter().map(|&v| v as f64).sum()),
            qs: q,
        }
    }

    fn follow(x: &[f32], engine: BlockQ8_1) -> (Vec<f64>, FollowReport) {
        let trace = trace_of(engine);
        let mut f = Follower {
            trace: &trace,
            seq: SeqId(0),
            report: FollowReport::default(),
        };
        let (v, _) = f.quantize_row(x, 0, 0, Site::AttnOut);
        (v, f.report)
    }

    #[test]
    fn the_other_side_of_a_tie_is_followed() {
        let x = tie_block();
        let mut e = own_block(&x);
        assert_eq!(e.qs[1], 3, "half away from zero");
        e.qs[1] = 2;
        e.s = f16::from_f32(129.0);
        let (v, rep) = follow(&x, e);
        assert_eq!((rep.ties_q, rep.mismatch_count), (1, 0));
        assert_eq!(v[1], 2.0);
    }

    /// The block sum is d·Σq over the q as followed: the backend's s after its side of a q
    /// tie is explained, the s of the oracle's side is not.
    #[test]
    fn the_block_sum_follows_the_followed_quants() {
        let x = tie_block();
        let mut e = own_block(&x);
        e.qs[1] = 2;
        let (sums, rep) = {
            let trace = trace_of(e);
            let mut f = Follower {
                trace: &trace,
                seq: SeqId(0),
                report: FollowReport::default(),
            };
            let (_, sums) = f.quantize_row(&x, 0, 0, Site::AttnOut);
            (sums, f.report)
        };
        assert_eq!(e.s.to_f32(), 130.0, "the sum of the oracle's own quants");
        assert_eq!((rep.ties_q, rep.mismatch_count), (1, 1));
        assert_eq!(rep.mismatches[0].field, "s");
        assert_eq!(
            (rep.mismatches[0].oracle, rep.mismatches[0].engine),
            (129.0, 130.0)
        );
        assert_eq!(
            sums,
            [129.0],
            "the oracle keeps d·Σq of the followed quants"
        );

        // Not the float sum either: 127 + 2.5 + 31 · 0.25 would be 137.25.
        let mut x = tie_block();
        x[2..].fill(0.25);
        let e = own_block(&x);
        assert_eq!(e.s.to_f32(), 130.0);
        assert_eq!(follow(&x, e).1.mismatch_count, 0);
    }

    #[test]
    fn a_step_away_from_a_tie_or_two_steps_is_a_mismatch() {
        let mut x = tie_block();
        x[1] = 2.45;
        let mut e = own_block(&x);
        e.qs[1] = 3;
        let (v, rep) = follow(&x, e);
        assert_eq!((rep.ties_followed, rep.mismatch_count), (0, 1));
        assert_eq!(v[1], 2.0, "the oracle keeps its own value");
        let m = &rep.mismatches[0];
        assert_eq!(
            (m.element, m.field, m.oracle, m.engine),
            (Some(1), "q", 2.0, 3.0)
        );

        let x = tie_block();
        let mut e = own_block(&x);
        e.qs[1] = 5;
        assert_eq!(follow(&x, e).1.mismatch_count, 1);
    }

    #[test]
    fn f16_scales_follow_only_at_ties() {
        let x = tie_block();
        let mut e = own_block(&x);
        e.d = f16::from_bits(e.d.to_bits() + 1);
        let rep = follow(&x, e).1;
        assert_eq!(rep.mismatch_count, 1, "d = 1 exactly is no tie: {rep:?}");
        assert_eq!(rep.mismatches[0].field, "d");

        // 1 + 2^-11 is the midpoint of f16 1 and its successor: a tie either way.
        let one = f16::from_f32(1.0);
        let next = f16::from_bits(one.to_bits() + 1);
        assert!(matches!(
            f16_follow(1.0 + 2f64.powi(-11), one, next, 1e-9),
            F16Step::Tie(_)
        ));
        // Two steps away with a window of a tenth of a step is not.
        let next2 = f16::from_bits(one.to_bits() + 2);
        assert!(matches!(f16_follow(1.0, one, next2, 1e-4), F16Step::Apart));
    }

    /// The f16 `d` window scales with the block's grid: at `d32` near 0.05 (not 1, where a
    /// window that divided by `d32` instead would be the same) a `d` on the far side of the
    /// midpoint is a tie 2e-7 past it and a mismatch 8e-7 past it, the window being about
    /// `d32 · 7.9e-6` = 4e-7.
    #[test]
    fn the_d_window_scales_with_the_grid() {
        let own = f16::from_f64(0.05);
        let next = f16::from_bits(own.to_bits() + 1);
        let mid = (own.to_f64() + next.to_f64()) / 2.0;
        let follow_d = |past: f64| {
            let amax = (127.0 * (mid - past)) as f32;
            let exact = amax as f64 / 127.0;
            let mut x = vec![0.0f32; 32];
            x[0] = amax;
            let mut q = [0i8; 32];
            q[0] = 127;
            let e = BlockQ8_1 {
                d: next,
                s: f16::from_f64(127.0 * exact),
                qs: q,
            };
            (mid - exact, follow(&x, e).1)
        };
        let (gap, rep) = follow_d(2e-7);
        assert!((1e-7..3e-7).contains(&gap), "{gap}");
        assert_eq!((rep.ties_d, rep.mismatch_count), (1, 0), "{rep:?}");
        let (gap, rep) = follow_d(8e-7);
        assert!((6e-7..1e-6).contains(&gap), "{gap}");
        assert_eq!((rep.ties_d, rep.mismatch_count), (0, 1), "{rep:?}");
        assert_eq!(rep.mismatches[0].field, "d");
    }

    #[test]
    fn an_identical_block_is_silent_and_an_absent_one_untraced() {
        let x = tie_block();
        let rep = follow(&x, own_block(&x)).1;
        assert_eq!(
            (rep.sites, rep.ties_followed, rep.mismatch_count),
            (1, 0, 0)
        );
        let trace = ActivationTrace::new();
        let mut f = Follower {
            trace: &trace,
            seq: SeqId(0),
            report: FollowReport::default(),
        };
        f.quantize_row(&x, 0, 0, Site::AttnOut);
        assert_eq!((f.report.sites, f.report.untraced), (0, 1));
    }
}
