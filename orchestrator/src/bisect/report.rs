//! What a bisection found, as a value (`--format json` prints it as is) and as text or
//! markdown: the culprit (sha, subject, author) with the cell's verdict and reason there and
//! at its parent, for `--bits` the quantified difference between the two (the same diff
//! `memra-orch diff` prints), or the range skipped commits leave, and every commit tested
//! with its outcome. It decides nothing; `bisect` hands it the outcome.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::time::Duration;

use serde::Serialize;

use super::Request;
use super::git::CommitInfo;
use super::probe::{Measured, Setting};
use super::search::Status;
use crate::diff::{self, Diff, Thresholds};

/// Format version of the JSON report.
pub const BISECT_SCHEMA: u32 = 1;

/// How the search ended.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum Outcome {
    /// The first changed commit, at this index of the line.
    Found { index: usize },
    /// The first changed commit is one of these (the rest were skipped).
    Range { first: usize, last: usize },
    /// The bad commit is as the good one: nothing in the range changed the cell.
    NoChange,
    /// The good commit is changed already (its cell is not as expected).
    GoodIsBad,
    /// The good commit could not be tested (with `--bits` it is the reference).
    GoodUntestable,
    /// The cell's runs at one commit disagree.
    Flaky { index: usize, message: String },
    /// Stopped by a signal; `--resume` continues.
    Interrupted,
}

/// One tested commit.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Tested {
    /// Position in the line: 0 is the good commit.
    pub index: usize,
    pub commit: CommitInfo,
    /// `None` when its runs disagree.
    #[serde(serialize_with = "status_name")]
    pub status: Option<Status>,
    /// The cell's verdict in each run, and why.
    pub runs: Vec<RunBrief>,
    /// Why the commit could not be tested at all (no run was made).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub untestable: Option<String>,
    #[serde(skip)]
    pub flaky: Option<String>,
}

/// One run of the cell at a commit.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RunBrief {
    pub run: String,
    pub dir: String,
    pub verdict: crate::words::verdict::Verdict,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    pub reused: bool,
}

fn status_name<S: serde::Serializer>(s: &Option<Status>, ser: S) -> Result<S::Ok, S::Error> {
    ser.serialize_str(status_str(*s))
}

fn status_str(s: Option<Status>) -> &'static str {
    match s {
        Some(Status::Good) => "good",
        Some(Status::Bad) => "changed",
        Some(Status::Skip) => "skipped",
        None => "flaky",
    }
}

impl Tested {
    pub fn measured(index: usize, commit: &CommitInfo, status: Status, ms: &[Measured]) -> Tested {
        Tested {
            index,
            commit: commit.clone(),
            status: Some(status),
            runs: ms
                .iter()
                .map(|m| RunBrief {
                    run: m.run_id.clone(),
                    dir: m.run_dir.to_string_lossy().into_owned(),
                    verdict: m.verdict,
                    reason: m.reason.clone(),
                    reused: m.reused,
                })
                .collect(),
            untestable: None,
            flaky: None,
        }
    }

    pub fn untestable(index: usize, commit: &CommitInfo, why: String) -> Tested {
        Tested {
            index,
            commit: commit.clone(),
            status: Some(Status::Skip),
            runs: Vec::new(),
            untestable: Some(why),
            flaky: None,
        }
    }

    /// One line: index, short sha, status, verdict and why, whether reused, subject.
    pub fn line(&self) -> String {
        let verdicts: Vec<String> = self
            .runs
            .iter()
            .map(|r| {
                let mut v = r.verdict.as_str().to_string();
                if r.reused {
                    v.push_str(" (reused)");
                }
                v
            })
            .collect();
        let why = self
            .untestable
            .clone()
            .or_else(|| self.runs.iter().find_map(|r| r.reason.clone()))
            .map(|w| format!(" — {w}"))
            .unwrap_or_default();
        format!(
            "#{:<3} {}  {:<8} {}{}  {}",
            self.index,
            self.commit.short(),
            status_str(self.status),
            if verdicts.is_empty() {
                "not run".to_string()
            } else {
                verdicts.join(", ")
            },
            why,
            clip(&self.commit.subject, 72)
        )
    }
}

/// `s` cut to `n` characters, with `…` when cut (a progress line stays one line).
fn clip(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        s.to_string()
    } else {
        s.chars().take(n - 1).chain(['…']).collect()
    }
}

/// The cell at one commit, as the report shows the culprit and its parent.
#[derive(Debug, Clone, Serialize)]
pub struct AtCommit {
    pub commit: CommitInfo,
    pub verdict: Option<crate::words::verdict::Verdict>,
    pub reason: Option<String>,
    /// The run folder whose receipt this is.
    pub run: Option<String>,
}

/// The whole answer.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub schema: u32,
    pub manifest: String,
    pub cell: String,
    /// `verdict` (the first commit where the cell is not as expected) or `bits` (where its
    /// artifacts differ from the good commit's).
    pub mode: &'static str,
    pub good: CommitInfo,
    pub bad: CommitInfo,
    /// Commits after `good` up to `bad`, along first parents.
    pub commits: usize,
    pub outcome: Outcome,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub culprit: Option<AtCommit>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub parent: Option<AtCommit>,
    /// The commits the first change may be in, when skips leave a range.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub range: Vec<CommitInfo>,
    /// The culprit against its parent, as `memra-orch diff` reports it (with `--bits`, or
    /// whenever the artifacts moved).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub diff: Option<Diff>,
    /// In the order tested.
    pub tested: Vec<Tested>,
    /// How many commits were run now (the rest reused receipts).
    pub ran: usize,
    pub seconds: f64,
}

impl Report {
    pub fn new(
        setting: &Setting,
        request: &Request,
        line: &[CommitInfo],
        tested: Vec<Tested>,
        outcome: Outcome,
        measurements: &BTreeMap<usize, Vec<Measured>>,
        elapsed: Duration,
    ) -> Report {
        let at = |index: usize| -> AtCommit {
            let m = measurements.get(&index).and_then(|ms| ms.first());
            AtCommit {
                commit: line[index].clone(),
                verdict: m.map(|m| m.verdict),
                reason: m.and_then(|m| m.reason.clone()),
                run: m.map(|m| m.run_dir.to_string_lossy().into_owned()),
            }
        };
        let (culprit, parent, diff) = match &outcome {
            Outcome::Found { index } => {
                let d = culprit_diff(measurements, *index, &request.cell);
                (Some(at(*index)), Some(at(index - 1)), d)
            }
            _ => (None, None, None),
        };
        let range = match &outcome {
            Outcome::Range { first, last } => line[*first..=*last].to_vec(),
            _ => Vec::new(),
        };
        let ran = tested
            .iter()
            .filter(|t| t.runs.iter().any(|r| !r.reused))
            .count();
        Report {
            schema: BISECT_SCHEMA,
            manifest: setting.manifest_name.clone(),
            cell: request.cell.clone(),
            mode: if request.bits { "bits" } else { "verdict" },
            good: line[0].clone(),
            bad: line[line.len() - 1].clone(),
            commits: line.len() - 1,
            outcome,
            culprit,
            parent,
            range,
            diff,
            tested,
            ran,
            seconds: elapsed.as_secs_f64(),
        }
    }

    /// The one-line answer.
    pub fn headline(&self) -> String {
        let what = if self.mode == "bits" {
            "moved its bits"
        } else {
            "stopped being as expected"
        };
        match &self.outcome {
            Outcome::Found { .. } => {
                let c = self
                    .culprit
                    .as_ref()
                    .expect("a found outcome has a culprit");
                format!(
                    "{} is the first commit where {} {what}: {} ({})",
                    c.commit.short(),
                    self.cell,
                    c.commit.subject,
                    c.commit.author
                )
            }
            Outcome::Range { .. } => format!(
                "the first commit where {} {what} is one of {} commits; the commits between \
                 could not be tested",
                self.cell,
                self.range.len()
            ),
            Outcome::NoChange => format!(
                "no commit of the {} after {} changes {}: at {} it is as at the good commit",
                self.commits,
                self.good.short(),
                self.cell,
                self.bad.short()
            ),
            Outcome::GoodIsBad => format!(
                "the good commit {} is not good: {} is not as expected there; pass an older \
                 --good",
                self.good.short(),
                self.cell
            ),
            Outcome::GoodUntestable => format!(
                "the good commit {} cannot be tested ({}); pass a --good where it builds and the \
                 manifest has the cell",
                self.good.short(),
                self.tested
                    .iter()
                    .find(|t| t.index == 0)
                    .and_then(|t| t
                        .untestable
                        .clone()
                        .or_else(|| { t.runs.first().and_then(|r| r.reason.clone()) }))
                    .unwrap_or_else(|| "its runs were skipped".to_string())
            ),
            Outcome::Flaky { message, .. } => format!("stopped: {message}"),
            Outcome::Interrupted => "interrupted; `memra-orch bisect --resume` continues from \
                                     the receipts made so far"
                .to_string(),
        }
    }

    pub fn text(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(out, "{}", self.headline());
        let _ = writeln!(out);
        if let (Some(c), Some(p)) = (&self.culprit, &self.parent) {
            for (label, a) in [("culprit", c), ("parent ", p)] {
                let _ = writeln!(
                    out,
                    "{label}  {}  {}{}",
                    a.commit.short(),
                    a.verdict
                        .map_or("untested (the good commit)", |v| v.as_str()),
                    a.reason
                        .as_ref()
                        .map(|r| format!(" — {r}"))
                        .unwrap_or_default()
                );
            }
            let _ = writeln!(
                out,
                "commit   {}",
                self.culprit.as_ref().map_or("", |c| &c.commit.sha)
            );
            let _ = writeln!(out);
        }
        for c in &self.range {
            let _ = writeln!(out, "  {}  {}", c.short(), c.subject);
        }
        if !self.range.is_empty() {
            let _ = writeln!(out);
        }
        if let Some(d) = &self.diff {
            let _ = writeln!(out, "The culprit against its parent:");
            out.push_str(&diff::render::text(d, false));
            let _ = writeln!(out);
        }
        let _ = writeln!(
            out,
            "Tested {} of {} commits ({} run now, {} from receipts) in {:.1} s:",
            self.tested.len(),
            self.commits + 1,
            self.ran,
            self.tested.len() - self.ran,
            self.seconds
        );
        for t in &self.tested {
            let _ = writeln!(out, "  {}", t.line());
        }
        out
    }

    pub fn markdown(&self) -> String {
        let md = |s: &str| s.replace('|', "\\|");
        let mut out = String::new();
        let _ = writeln!(out, "### bisect `{}` ({})\n", md(&self.cell), self.mode);
        let _ = writeln!(out, "{}\n", md(&self.headline()));
        if let (Some(c), Some(p)) = (&self.culprit, &self.parent) {
            let _ = writeln!(out, "| | commit | verdict | reason |\n|---|---|---|---|");
            for (label, a) in [("culprit", c), ("parent", p)] {
                let _ = writeln!(
                    out,
                    "| {label} | `{}` {} | {} | {} |",
                    a.commit.short(),
                    md(&a.commit.subject),
                    a.verdict.map_or("untested", |v| v.as_str()),
                    md(a.reason.as_deref().unwrap_or(""))
                );
            }
            out.push('\n');
        }
        for c in &self.range {
            let _ = writeln!(out, "- `{}` {}", c.short(), md(&c.subject));
        }
        if let Some(d) = &self.diff {
            out.push_str(&diff::render::markdown(d));
        }
        let _ = writeln!(
            out,
            "\n| # | commit | status | verdicts | subject |\n|---:|---|---|---|---|"
        );
        for t in &self.tested {
            let verdicts: Vec<String> = t
                .runs
                .iter()
                .map(|r| {
                    format!(
                        "{}{}",
                        r.verdict.as_str(),
                        if r.reused { " (reused)" } else { "" }
                    )
                })
                .collect();
            let _ = writeln!(
                out,
                "| {} | `{}` | {} | {} | {} |",
                t.index,
                t.commit.short(),
                status_str(t.status),
                md(&t.untestable.clone().unwrap_or_else(|| verdicts.join(", "))),
                md(&t.commit.subject)
            );
        }
        out
    }

    pub fn json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_default() + "\n"
    }
}

/// The culprit's run against its parent's, for the cell only; `None` when the parent was
/// not run (the good commit, taken at the user's word).
fn culprit_diff(
    measurements: &BTreeMap<usize, Vec<Measured>>,
    index: usize,
    cell: &str,
) -> Option<Diff> {
    let new = measurements.get(&index)?.first()?;
    let old = measurements.get(&(index - 1))?.first()?;
    let (o, n) = (
        diff::load_for_diff(&old.run_dir).ok()?,
        diff::load_for_diff(&new.run_dir).ok()?,
    );
    Some(diff::diff_cell(&o, &n, cell, &Thresholds::default()))
}
