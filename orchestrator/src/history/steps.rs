//! Change points in a metric's series across nights: where a cell's number stepped to a new
//! level and stayed there, told apart from noise, in the manner of asv's regression
//! detector (a penalised piecewise-constant fit; asv's `step_detect` after Friedrich et al.
//! 2008, written here from the method, not the code).
//!
//! The series is fitted by levels: each run of consecutive points gets one level, its median,
//! and the fit minimises the sum of |y − level| over the points plus a penalty γ per level.
//! The exact minimum is found by dynamic programming over the points, each candidate
//! level's median and cost kept in two heaps as it grows, and candidates that can no longer
//! win pruned as PELT does (Killick et al. 2012): about linear in the nights for a series
//! with few steps (a year of nights in a fraction of a millisecond). γ scales with the noise: σ̂ is the robust
//! spread of the differences of consecutive points (1.4826 · their median absolute value,
//! divided by √2 because a difference holds two points' noise), and γ = 3 · σ̂ · ln n. A
//! series that is exact (the exactness metrics: max |Δ| 0, 0 mismatches) has σ̂ = 0, so any
//! lasting change is a step; γ never falls below 8 · n ulps of the series' size, so the
//! rounding of the fit's own sums is never one. The values are scaled into [-1, 1] for the
//! fit, so a series near f64::MAX cannot overflow. Fewer than [`MIN_POINTS`] values say
//! nothing of the noise: no step is looked for.
//!
//! A level between two others must hold at least two points: one night away and back is a
//! spike (a flake, a loaded machine), not a step. The last level may be a single point, so
//! last night's jump is reported the morning after rather than a night later. A missing
//! point (the cell absent, or the metric not reported) is skipped, not a zero.

use serde::Serialize;

/// One step: the series' level changed at `at` (an index into the series given).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Step {
    /// The first point of the new level.
    pub at: usize,
    /// The level before (the median of its points) and after.
    pub before: f64,
    pub after: f64,
    /// (after − before) / |before|; `None` when before is 0.
    pub relative: Option<f64>,
}

/// The steps of a series, oldest first.
pub fn detect(ys: &[Option<f64>]) -> Vec<Step> {
    let points: Vec<(usize, f64)> = ys
        .iter()
        .enumerate()
        .filter_map(|(i, y)| y.filter(|v| v.is_finite()).map(|v| (i, v)))
        .collect();
    let n = points.len();
    // Three values say nothing of the noise: a step needs four runs.
    if n < MIN_POINTS {
        return Vec::new();
    }
    let y: Vec<f64> = points.iter().map(|p| p.1).collect();
    // Fitted on values scaled into [-1, 1], so sums near f64::MAX cannot overflow; the
    // levels reported are the values' own.
    let scale = y.iter().fold(0.0f64, |m, v| m.max(v.abs()));
    let scaled: Vec<f64> = if scale > 1.0 {
        y.iter().map(|v| v / scale).collect()
    } else {
        y.clone()
    };
    let gamma = penalty(&scaled);
    let (_, from) = fit(&scaled, gamma, true);
    // The levels, back from the end.
    let mut bounds = Vec::new();
    let mut i = n;
    while i > 0 {
        let j = from[i];
        bounds.push((j, i));
        i = j;
    }
    bounds.reverse();
    let level = |(j, i): (usize, usize)| {
        let mut s: Vec<f64> = y[j..i].to_vec();
        s.sort_by(f64::total_cmp);
        median(&s)
    };
    bounds
        .windows(2)
        .filter_map(|w| {
            let (before, after) = (level(w[0]), level(w[1]));
            (before != after).then(|| Step {
                at: points[w[1].0].0,
                before,
                after,
                relative: (before != 0.0).then(|| (after - before) / before.abs()),
            })
        })
        .collect()
}

/// One detected step of one cell's metric: the regressions feed's entry.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FeedItem {
    pub cell: String,
    /// `check/metric`, as `history` and `diff` name it.
    pub metric: String,
    /// The run the new level starts at: its id, commit and start.
    pub run: String,
    pub commit: String,
    pub start: String,
    pub before: f64,
    pub after: f64,
    pub relative: Option<f64>,
    /// Whether the new level is the one the metric holds now (the step was not undone by a
    /// later one).
    pub current: bool,
}

/// Every step of every metric of `h`'s cells, newest first (then by cell and metric).
pub fn feed(h: &super::History) -> Vec<FeedItem> {
    let mut out = steps_of(&h.cells);
    sort(&mut out);
    out
}

/// The steps of `cells`' metrics, in no order ([`sort`] orders a feed).
pub fn steps_of(cells: &[super::CellHistory]) -> Vec<FeedItem> {
    let mut out = Vec::new();
    for cell in cells {
        let mut names: std::collections::BTreeSet<&str> = std::collections::BTreeSet::new();
        for p in &cell.points {
            if let Some(f) = &p.facts {
                names.extend(f.metrics.keys().map(String::as_str));
            }
        }
        for name in names {
            let ys: Vec<Option<f64>> = cell
                .points
                .iter()
                .map(|p| p.facts.as_ref().and_then(|f| f.metrics.get(name).copied()))
                .collect();
            let steps = detect(&ys);
            let last = steps.len();
            for (k, st) in steps.into_iter().enumerate() {
                let p = &cell.points[st.at];
                out.push(FeedItem {
                    cell: cell.id.clone(),
                    metric: name.to_string(),
                    run: p.run.clone(),
                    commit: p.commit.clone(),
                    start: p.start.clone(),
                    before: st.before,
                    after: st.after,
                    relative: st.relative,
                    current: k + 1 == last,
                });
            }
        }
    }
    out
}

/// Orders a feed newest first, then by cell and metric.
pub fn sort(items: &mut [FeedItem]) {
    items.sort_by(|a, b| {
        b.start
            .cmp(&a.start)
            .then_with(|| a.cell.cmp(&b.cell))
            .then_with(|| a.metric.cmp(&b.metric))
    });
}

/// What the feed's first line counts: the manifest, its cells and its runs.
pub struct Scope<'a> {
    pub manifest: &'a str,
    pub cells: usize,
    pub runs: usize,
}

/// The feed as text (a line a step) or markdown (a table).
pub fn render(scope: &Scope, items: &[FeedItem], markdown: bool) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{} step{} in the metrics of {} ({} cell{} over {} run{}; docs/diff.md, \"Steps\")",
        items.len(),
        if items.len() == 1 { "" } else { "s" },
        scope.manifest,
        scope.cells,
        if scope.cells == 1 { "" } else { "s" },
        scope.runs,
        if scope.runs == 1 { "" } else { "s" },
    );
    if markdown && !items.is_empty() {
        out.push_str("\n| since | run | commit | cell | metric | before | after | change |\n|---|---|---|---|---|---|---|---|\n");
    }
    for i in items {
        let change = match i.relative {
            Some(r) => format!("{:+.1}%", r * 100.0),
            None => "from 0".to_string(),
        };
        let undone = if i.current { "" } else { " (undone later)" };
        // Names came from manifests and gates: one line each, control characters escaped,
        // so no gate can forge an entry.
        let flat = |s: &str| crate::words::escape::control(s).into_owned();
        let day = flat(i.start.get(..10).unwrap_or(&i.start));
        let commit = flat(&crate::receipt::commit::short_commit(&i.commit));
        let (run, before, after) = (flat(&i.run), number(i.before), number(i.after));
        if markdown {
            let code = |s: &str| {
                let s = flat(s).replace('|', "\\|");
                if s.contains('`') {
                    format!("`` {s} ``")
                } else {
                    format!("`{s}`")
                }
            };
            let _ = writeln!(
                out,
                "| {day} | {run} | {commit} | {} | {} | {before} | {after} | {change}{undone} |",
                code(&i.cell),
                code(&i.metric)
            );
        } else {
            let _ = writeln!(
                out,
                "{day} {run} {commit}  {}  {}: {before} -> {after} ({change}){undone}",
                flat(&i.cell),
                flat(&i.metric)
            );
        }
    }
    out
}

/// A level as the feed shows it: as written when short, else in 6 significant digits.
fn number(v: f64) -> String {
    let plain = v.to_string();
    if plain.len() <= 12 {
        plain
    } else {
        format!("{v:.6e}")
    }
}

/// The least penalised cost of `y` and, for each prefix end, where its last level starts.
/// With `prune`, starts that can no longer win are dropped as PELT does (Killick et al.
/// 2012): a start j goes once best[j] + cost(j..=i) ≥ best[i + 1], since the L1 cost of one
/// level is never less than the costs of its parts, and best[i + 1] followed by a level
/// from i + 1 is then never worse (applied a point late, see below). Without it every start
/// is tried (the tests' reference).
fn fit(y: &[f64], gamma: f64, prune: bool) -> (f64, Vec<usize>) {
    let n = y.len();
    // best[i + 1]: the least cost of y[..=i]; from[i + 1]: where its last level starts.
    let mut best = vec![f64::INFINITY; n + 1];
    let mut from = vec![0usize; n + 1];
    best[0] = 0.0;
    // Every level that may still end the best fit, each grown to the current point, with
    // its cost one point earlier.
    let mut open: Vec<(usize, Level, f64)> = Vec::new();
    for i in 0..n {
        open.push((i, Level::default(), f64::NAN));
        for (_, level, before) in &mut open {
            *before = level.cost();
            level.push(y[i]);
        }
        for (j, level, _) in &open {
            // A level between two others holds two points at least; the first and the last
            // may hold one.
            let inner = *j > 0 && i + 1 < n;
            if inner && i - j + 1 < 2 {
                continue;
            }
            let total = best[*j] + level.cost() + gamma;
            if total < best[i + 1] {
                best[i + 1] = total;
                from[i + 1] = *j;
            }
        }
        // The test that could prune a start after point i − 1 is applied now, one point
        // late: the start that beats it there, i, cannot end an inner level at i alone (it
        // would hold one point), so the test holds only from i + 1 on.
        if prune && i > 0 {
            let bound = best[i];
            open.retain(|(j, _, before)| *j == i || best[*j] + *before < bound);
        }
    }
    (best[n], from)
}

/// The fewest runs with a value that a step is looked for in.
pub const MIN_POINTS: usize = 4;

/// γ for a series: 3 · σ̂ · ln n, at least the floor: 8 · n ulps of the series' size, what
/// the rounding of the fit's sums can reach, so rounding alone is never a step.
fn penalty(y: &[f64]) -> f64 {
    let n = y.len() as f64;
    let mut d: Vec<f64> = y.windows(2).map(|w| (w[1] - w[0]).abs()).collect();
    d.sort_by(f64::total_cmp);
    let sigma = 1.4826 * median(&d) / std::f64::consts::SQRT_2;
    let size = y.iter().fold(0.0f64, |m, v| m.max(v.abs()));
    (3.0 * sigma * n.ln()).max(8.0 * n * f64::EPSILON * size.max(f64::MIN_POSITIVE))
}

/// A float ordered by `total_cmp`, for the heaps.
#[derive(Debug, Clone, Copy, PartialEq)]
struct F(f64);
impl Eq for F {}
impl PartialOrd for F {
    fn partial_cmp(&self, o: &F) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for F {
    fn cmp(&self, o: &F) -> std::cmp::Ordering {
        self.0.total_cmp(&o.0)
    }
}

/// The points of one level: the lower half in a max-heap, the upper half in a min-heap, and
/// their sums, so the median and the L1 cost around it cost O(log n) a point.
#[derive(Default)]
struct Level {
    lo: std::collections::BinaryHeap<F>,
    hi: std::collections::BinaryHeap<std::cmp::Reverse<F>>,
    sum_lo: f64,
    sum_hi: f64,
}

impl Level {
    fn push(&mut self, v: f64) {
        if self.lo.peek().is_none_or(|top| v <= top.0) {
            self.lo.push(F(v));
            self.sum_lo += v;
        } else {
            self.hi.push(std::cmp::Reverse(F(v)));
            self.sum_hi += v;
        }
        // Keep |lo| = |hi| or |hi| + 1.
        if self.lo.len() > self.hi.len() + 1 {
            let F(x) = self.lo.pop().expect("lo is not empty");
            self.sum_lo -= x;
            self.hi.push(std::cmp::Reverse(F(x)));
            self.sum_hi += x;
        } else if self.hi.len() > self.lo.len() {
            let std::cmp::Reverse(F(x)) = self.hi.pop().expect("hi is not empty");
            self.sum_hi -= x;
            self.lo.push(F(x));
            self.sum_lo += x;
        }
    }

    fn median(&self) -> f64 {
        match (self.lo.peek(), self.hi.peek()) {
            (Some(a), Some(b)) if self.lo.len() == self.hi.len() => a.0 / 2.0 + b.0.0 / 2.0,
            (Some(a), _) => a.0,
            _ => 0.0,
        }
    }

    /// Σ |v − median| over the level's points.
    fn cost(&self) -> f64 {
        let m = self.median();
        (self.lo.len() as f64 * m - self.sum_lo) + (self.sum_hi - self.hi.len() as f64 * m)
    }
}

fn median(sorted: &[f64]) -> f64 {
    match sorted.len() {
        0 => 0.0,
        k if k % 2 == 1 => sorted[k / 2],
        // Halved first, so two values near f64::MAX do not overflow.
        k => sorted[k / 2 - 1] / 2.0 + sorted[k / 2] / 2.0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &[f64]) -> Vec<Option<f64>> {
        v.iter().map(|x| Some(*x)).collect()
    }

    #[test]
    fn an_exact_metric_that_moves_once_is_one_step_where_it_moved() {
        let mut y = vec![0.0; 20];
        y.extend([3e-7; 10]);
        let steps = detect(&s(&y));
        assert_eq!(steps.len(), 1, "{steps:?}");
        assert_eq!(steps[0].at, 20);
        assert_eq!((steps[0].before, steps[0].after), (0.0, 3e-7));
        assert_eq!(steps[0].relative, None);
    }

    #[test]
    fn last_nights_jump_is_reported_the_morning_after() {
        let mut y = vec![0.25; 30];
        y.push(0.75);
        let steps = detect(&s(&y));
        assert_eq!(steps.len(), 1, "{steps:?}");
        assert_eq!(steps[0].at, 30);
        assert_eq!(steps[0].relative, Some(2.0));
    }

    #[test]
    fn noise_is_no_step_and_a_step_well_above_it_is() {
        // A deterministic wobble of ±1 % around 100 (a timing), then a 20 % step.
        let wobble = |i: usize| 100.0 * (1.0 + 0.01 * ((i * 7919 % 13) as f64 / 6.0 - 1.0));
        let quiet: Vec<f64> = (0..40).map(wobble).collect();
        assert!(detect(&s(&quiet)).is_empty(), "{:?}", detect(&s(&quiet)));
        let mut y = quiet.clone();
        y.extend((40..60).map(|i| wobble(i) * 1.2));
        let steps = detect(&s(&y));
        assert_eq!(steps.len(), 1, "{steps:?}");
        assert_eq!(steps[0].at, 40);
        assert!((steps[0].relative.unwrap() - 0.2).abs() < 0.02, "{steps:?}");
    }

    #[test]
    fn a_one_night_spike_in_the_middle_is_no_step_and_gaps_are_skipped() {
        let mut y = s(&[1.0; 10]);
        y[5] = Some(9.0);
        assert!(detect(&y).is_empty(), "{:?}", detect(&y));
        // Absent nights and NaN neither break a level nor make one.
        let mut y = s(&[1.0; 6]);
        y.extend([None, Some(f64::NAN), None]);
        y.extend(s(&[2.0; 6]));
        let steps = detect(&y);
        assert_eq!(steps.len(), 1, "{steps:?}");
        assert_eq!(
            steps[0].at, 9,
            "the first point of the new level, as indexed"
        );
    }

    /// The pruned fit finds the least cost the full search finds, on series with steps,
    /// spikes, noise and ties.
    #[test]
    fn pruning_never_loses_the_best_fit() {
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let mut rnd = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 11) as f64 / (1u64 << 53) as f64
        };
        for case in 0..300 {
            let n = 3 + case % 60;
            let mut level = 0.0;
            let y: Vec<f64> = (0..n)
                .map(|_| {
                    if rnd() < 0.08 {
                        level += (rnd() - 0.5) * 10.0;
                    }
                    let spike = if rnd() < 0.05 { 5.0 } else { 0.0 };
                    let noise = if case % 3 == 0 {
                        0.0
                    } else {
                        (rnd() - 0.5) * 0.5
                    };
                    // Some series on a coarse grid, so ties happen.
                    let v = level + spike + noise;
                    if case % 5 == 0 { v.round() } else { v }
                })
                .collect();
            let gamma = penalty(&y);
            let (pruned, _) = fit(&y, gamma, true);
            let (full, _) = fit(&y, gamma, false);
            assert!(
                (pruned - full).abs() <= 1e-9 * (1.0 + full.abs()),
                "case {case}: {pruned} vs {full} on {y:?}"
            );
        }
    }

    #[test]
    fn four_runs_are_enough_and_three_say_nothing() {
        assert!(detect(&s(&[0.0, 0.0, 1.0])).is_empty());
        let steps = detect(&s(&[0.0, 0.0, 0.0, 1.0]));
        assert_eq!(steps.len(), 1, "{steps:?}");
        assert_eq!(steps[0].at, 3);
    }

    #[test]
    fn tiny_and_huge_values_step_like_any_other() {
        let mut y = vec![0.0; 10];
        y.extend([1e-13; 10]);
        assert_eq!(detect(&s(&y)).len(), 1, "a tiny lasting change");
        let mut y = vec![0.0; 10];
        y.extend([-1e308; 10]);
        let steps = detect(&s(&y));
        assert_eq!(steps.len(), 1, "{steps:?}");
        assert_eq!(steps[0].after, -1e308);
        let mut y = vec![f64::MAX; 10];
        y.extend([0.0; 10]);
        assert_eq!(detect(&s(&y)).len(), 1, "from f64::MAX");
    }

    #[test]
    fn a_step_and_its_return_are_two_steps() {
        let mut y = vec![5.0; 10];
        y.extend([6.0; 5]);
        y.extend([5.0; 10]);
        let steps = detect(&s(&y));
        assert_eq!(
            steps.iter().map(|s| s.at).collect::<Vec<_>>(),
            vec![10, 15],
            "{steps:?}"
        );
    }
}
