//! What the HTML report shows, as plain values: the runs (columns, oldest to newest), the
//! cells (rows) with one point per run, and the markers derived from neighbouring points
//! (bits moved, flaky, lost coverage). The pages are rendered from these values only, so a
//! page never reads a receipt itself.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde_json::Value;

use crate::words::verdict::Verdict;

/// The whole report of one manifest.
#[derive(Debug, Clone)]
pub struct ReportView {
    pub manifest: String,
    /// The receipts folder the runs were read from.
    pub receipts: PathBuf,
    /// Oldest first.
    pub runs: Vec<RunView>,
    /// Sorted by id.
    pub cells: Vec<CellView>,
    /// The steps of the cells' metrics across these runs, newest first (the regressions
    /// feed, `history --steps`).
    pub feed: Vec<crate::history::steps::FeedItem>,
}

/// One run: a column of the matrix and a page of its own.
#[derive(Debug, Clone)]
pub struct RunView {
    /// The run id, or `-` for a tree of the layout before run ids.
    pub id: String,
    /// The commit's subject line, when the run recorded one.
    pub subject: Option<String>,
    /// The folder holding its `run.json`.
    pub dir: PathBuf,
    pub commit: String,
    pub start: String,
    /// `pass`, `fail` or `running`, as `run.json` says.
    pub verdict: String,
    pub seconds: Option<f64>,
    pub counts: BTreeMap<Verdict, usize>,
    pub host: String,
    /// Name and value pairs shown under "environment" on the run's page (orchestrator
    /// version, dirty, CPU slots, filters, driver…), in the order given.
    pub environment: Vec<(String, String)>,
    /// One line per GPU of the run's inventory.
    pub gpus: Vec<String>,
}

/// One cell: a row of the matrix and a page of its own.
#[derive(Debug, Clone)]
pub struct CellView {
    pub id: String,
    /// One per run of [`ReportView::runs`], in the same order.
    pub points: Vec<Point>,
    /// The newest point whose verdict was not good, with its first failing check.
    pub last_failure: Option<Failure>,
    /// The doors row of the newest receipt (none when that receipt has none).
    pub doors: Option<BTreeMap<String, Value>>,
}

/// A cell in one run.
#[derive(Debug, Clone)]
pub enum Point {
    /// The run has no such cell (not in the manifest then, or not selected).
    Absent,
    Present(Box<Sample>),
}

/// What one run measured (or carried) of a cell.
#[derive(Debug, Clone)]
pub struct Sample {
    pub verdict: Verdict,
    /// As expected (docs/diff.md's *good*).
    pub good: bool,
    pub reason: Option<String>,
    /// The `inputs` digest differs from the previous point where the cell existed.
    pub inputs_changed: bool,
    /// The artifact digests differ from the previous point where the cell existed.
    pub bits_moved: bool,
    /// Numeric metrics keyed `check/metric`.
    pub metrics: BTreeMap<String, f64>,
    pub seconds: f64,
    /// The receipt was carried from an earlier run rather than measured by this one.
    pub carried: bool,
    /// The folder of its last attempt (logs), when the receipt has attempts.
    pub logs: Option<PathBuf>,
    /// When the run is packed: its archive and the folder's name in it (`nodes/…`).
    pub packed: Option<(PathBuf, String)>,
    /// Check rows at `warn`, and the first of them as one line.
    pub warns: u32,
    pub warning: Option<String>,
    /// The receipt names the code it tested, so equal inputs mean the same code.
    pub code_known: bool,
    /// When the bits moved against the previous point shown: how far, read from both
    /// sides' safetensors artifacts (values that differ, max |Δ|, max ulps); `None` when
    /// they did not move, or could not be read (the previous point is outside the report,
    /// or the files are not safetensors).
    pub moved: Option<(u64, f64, Option<u64>)>,
}

/// The newest failure of a cell.
#[derive(Debug, Clone)]
pub struct Failure {
    /// Index into [`ReportView::runs`].
    pub run: usize,
    pub verdict: Verdict,
    pub reason: Option<String>,
    /// The first check row that did not pass: its name and message.
    pub check: Option<(String, Option<String>)>,
}

/// The markers of a point, derived from the point before it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Markers {
    pub bits_moved: bool,
    /// The verdict changed from the previous point while the inputs did not (a skip, which
    /// says what the machine had rather than how the cell behaved, is not a change).
    pub flaky: bool,
    /// The previous point passed and this one is skipped or absent.
    pub lost: bool,
    /// The cell reported `warn` rows.
    pub warn: bool,
}

impl CellView {
    /// The markers of every point, in the order of [`CellView::points`].
    pub fn markers(&self) -> Vec<Markers> {
        let mut previous: Option<&Sample> = None;
        let mut out = Vec::with_capacity(self.points.len());
        for point in &self.points {
            let m = match point {
                Point::Absent => Markers {
                    lost: previous.is_some_and(|p| p.verdict == Verdict::Pass),
                    ..Markers::default()
                },
                Point::Present(s) => Markers {
                    bits_moved: s.bits_moved,
                    flaky: previous.is_some_and(|p| {
                        p.verdict != s.verdict
                            && !s.inputs_changed
                            && p.code_known
                            && s.code_known
                            && p.verdict != Verdict::Skipped
                            && s.verdict != Verdict::Skipped
                    }),
                    warn: s.warns > 0,
                    lost: s.verdict == Verdict::Skipped
                        && previous.is_some_and(|p| p.verdict == Verdict::Pass),
                },
            };
            out.push(m);
            // After an absent run there is nothing to compare with: coming back is not
            // flaky, and a second absent run is not a second loss.
            previous = match point {
                Point::Present(s) => Some(s),
                Point::Absent => None,
            };
        }
        out
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A point with a verdict and the two change flags, the rest empty.
    pub fn sample(verdict: Verdict, inputs_changed: bool, bits_moved: bool) -> Point {
        Point::Present(Box::new(Sample {
            verdict,
            good: verdict.as_expected(),
            reason: None,
            inputs_changed,
            bits_moved,
            metrics: BTreeMap::new(),
            seconds: 1.0,
            carried: false,
            logs: None,
            packed: None,
            warns: 0,
            warning: None,
            code_known: true,
            moved: None,
        }))
    }

    #[test]
    fn markers_follow_the_previous_point() {
        let cell = CellView {
            id: "c".into(),
            points: vec![
                sample(Verdict::Pass, false, false),
                // Same inputs, another verdict: flaky.
                sample(Verdict::Fail, false, false),
                // Inputs changed: a change, not a flake; bits moved.
                sample(Verdict::Pass, true, true),
                // Gone: lost coverage.
                Point::Absent,
                Point::Absent,
                sample(Verdict::Pass, true, false),
                sample(Verdict::Skipped, false, false),
            ],
            last_failure: None,
            doors: None,
        };
        let m = cell.markers();
        let flags: Vec<(bool, bool, bool)> =
            m.iter().map(|m| (m.bits_moved, m.flaky, m.lost)).collect();
        assert_eq!(
            flags,
            [
                (false, false, false),
                (false, true, false),
                (true, false, false),
                (false, false, true),
                (false, false, false),
                (false, false, false),
                // Pass → skipped is lost coverage; a skip (no GPU) is not a flake.
                (false, false, true),
            ]
        );
    }
}
