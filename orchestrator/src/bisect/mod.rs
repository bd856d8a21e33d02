//! `memra-orch bisect`: the first commit of a first-parent range at which a cell stopped
//! being as expected or (`--bits`) its artifacts stopped equalling the good commit's,
//! found by testing commits in worktrees of their own ([`probe`]) under a binary or k-ary
//! search ([`search`]), and proven by the receipts of the culprit and its parent
//! ([`report`]). docs/bisect.md is the user's guide.
//!
//! The search stops rather than answer wrongly: a cell whose verdict (or, with `--bits`,
//! whose artifacts) differ across the reps of one commit is flaky there, and no culprit is
//! named. What the search knows lives in the receipts folder itself, so `--resume` (or the
//! same command again) continues from the runs already made.

pub mod git;
pub mod probe;
pub mod report;
pub mod search;
pub mod state;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Instant;

use git::CommitInfo;
use probe::{Measured, NotMeasured, Setting, Slot};
use report::{Outcome, Report, Tested};
use search::{Conclusion, Search, Status};

use crate::words::verdict::Verdict;

/// What a bisection was asked.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Request {
    pub good: String,
    pub bad: String,
    pub cell: String,
    /// `--bits`: search for moved artifacts instead of a changed verdict.
    pub bits: bool,
    /// `--artifact`: with `--bits`, the globs of the artifact names compared (empty: all).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub artifacts: Vec<String>,
    /// Candidates tested at once.
    pub jobs: usize,
    /// Runs per candidate.
    pub reps: usize,
}

impl Request {
    /// Keeps only the artifacts `--artifact` selects (all of them when it was not given).
    /// The globs were checked when the request was made; one that does not compile selects
    /// nothing.
    fn select_artifacts(&self, m: &mut Measured) {
        if self.artifacts.is_empty() {
            return;
        }
        let globs: Vec<globset::GlobMatcher> = self
            .artifacts
            .iter()
            .filter_map(|g| globset::Glob::new(g).ok().map(|g| g.compile_matcher()))
            .collect();
        m.artifacts
            .retain(|name, _| globs.iter().any(|g| g.is_match(name)));
    }
}

/// How a bisection ended, beyond its report.
#[derive(Debug)]
pub enum Stop {
    /// Ctrl-C or SIGTERM: the worktrees are gone, the receipts made so far stay.
    Interrupted(Box<Report>),
    /// memra-orch or git broke (not the commit under test).
    Broken(String),
}

/// The search: tests commits of `line` (index 0 `good`, last `bad`) until the knowledge is
/// final, calling `progress` after each tested commit.
pub fn bisect(
    setting: &Setting,
    request: &Request,
    line: &[CommitInfo],
    slots: &[Slot],
    interrupt: &Arc<AtomicBool>,
    progress: &mut dyn FnMut(&Tested),
) -> Result<Report, Stop> {
    let started = Instant::now();
    let mut search = Search::new(line.len() - 1);
    let mut tested: Vec<Tested> = Vec::new();
    let mut measurements: BTreeMap<usize, Vec<Measured>> = BTreeMap::new();
    let mut reference: Option<BTreeMap<String, String>> = None;
    let finish =
        |tested: Vec<Tested>, outcome: Outcome, measurements: &BTreeMap<usize, Vec<Measured>>| {
            Report::new(
                setting,
                request,
                line,
                tested,
                outcome,
                measurements,
                started.elapsed(),
            )
        };

    // With --bits the good commit's artifacts are what "moved" is measured against, so it
    // is tested first.
    let mut round: Vec<usize> = if request.bits { vec![0] } else { Vec::new() };
    loop {
        if round.is_empty() {
            round = search.next(request.jobs);
        }
        if round.is_empty() {
            break;
        }
        let results = test_round(setting, request, line, slots, &round, interrupt);
        let mut interrupted = false;
        for (index, result) in round.drain(..).zip(results) {
            let t = match result {
                Err(NotMeasured::Interrupted) => {
                    interrupted = true;
                    continue;
                }
                Err(NotMeasured::Broken(why)) => return Err(Stop::Broken(why)),
                Err(NotMeasured::Untestable(why)) => Tested::untestable(index, &line[index], why),
                Ok(ms) => {
                    if index == 0
                        && request.bits
                        && let Some(m) = ms.iter().find(|m| !skips(m.verdict))
                    {
                        reference = Some(m.artifacts.clone());
                    }
                    let t = judge(request, index, &line[index], &ms, reference.as_ref());
                    measurements.insert(index, ms);
                    t
                }
            };
            progress(&t);
            if let Some(status) = t.status {
                search.record(index, status);
            }
            let flaky = t.flaky.clone();
            tested.push(t);
            if let Some(message) = flaky {
                return Ok(finish(
                    tested,
                    Outcome::Flaky { index, message },
                    &measurements,
                ));
            }
        }
        if interrupted {
            return Err(Stop::Interrupted(Box::new(finish(
                tested,
                Outcome::Interrupted,
                &measurements,
            ))));
        }
        if request.bits && index_untestable(&tested, 0) {
            return Ok(finish(tested, Outcome::GoodUntestable, &measurements));
        }
    }
    let outcome = match search.conclusion() {
        Some(Conclusion::Found { index }) => Outcome::Found { index },
        Some(Conclusion::Range { first, last }) => Outcome::Range { first, last },
        Some(Conclusion::NoChange) => Outcome::NoChange,
        Some(Conclusion::GoodIsBad) => Outcome::GoodIsBad,
        None => unreachable!("the search stops only when its knowledge is final"),
    };
    let outcome =
        if matches!(outcome, Outcome::Range { .. }) && search.status(0) == Some(Status::Skip) {
            Outcome::GoodUntestable
        } else {
            outcome
        };
    Ok(finish(tested, outcome, &measurements))
}

fn index_untestable(tested: &[Tested], index: usize) -> bool {
    tested
        .iter()
        .any(|t| t.index == index && t.status == Some(Status::Skip))
}

/// Verdicts that say the commit could not be tested, not how the cell fared: a setup it
/// needs failed (a commit that does not build), or its resources are missing.
fn skips(v: Verdict) -> bool {
    matches!(v, Verdict::Blocked | Verdict::Skipped)
}

/// Tests the commits of one round, each on its own slot, at once; each result holds
/// `reps` measurements (reused ones first).
fn test_round(
    setting: &Setting,
    request: &Request,
    line: &[CommitInfo],
    slots: &[Slot],
    round: &[usize],
    interrupt: &Arc<AtomicBool>,
) -> Vec<Result<Vec<Measured>, NotMeasured>> {
    std::thread::scope(|s| {
        let handles: Vec<_> = round
            .iter()
            .zip(slots.iter().cycle())
            .map(|(&index, slot)| {
                s.spawn(move || {
                    let commit = &line[index];
                    let mut ms: Vec<Measured> = probe::reusable(setting, &commit.sha)
                        .into_iter()
                        .take(request.reps)
                        .collect();
                    // Reused receipts come newest first; the report lists them in run order.
                    ms.reverse();
                    ms.iter_mut().for_each(|m| request.select_artifacts(m));
                    while ms.len() < request.reps {
                        let mut m = probe::measure(setting, commit, slot, ms.len() + 1, interrupt)?;
                        request.select_artifacts(&mut m);
                        // A commit that does not build is skipped after one try: building
                        // it again would fail again.
                        let settled = skips(m.verdict);
                        ms.push(m);
                        if settled {
                            break;
                        }
                    }
                    Ok(ms)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(NotMeasured::Broken("a test thread panicked".into())))
            })
            .collect()
    })
}

/// What the measurements of one commit say: good, changed or skipped, or flaky when its
/// reps disagree.
fn judge(
    request: &Request,
    index: usize,
    commit: &CommitInfo,
    ms: &[Measured],
    reference: Option<&BTreeMap<String, String>>,
) -> Tested {
    let status_of = |m: &Measured| -> Status {
        if skips(m.verdict) {
            Status::Skip
        } else if request.bits {
            match reference {
                Some(r) if *r == m.artifacts => Status::Good,
                _ => Status::Bad,
            }
        } else if m.verdict == Verdict::Pass {
            Status::Good
        } else {
            Status::Bad
        }
    };
    let statuses: Vec<Status> = ms.iter().map(status_of).collect();
    let first = &ms[0];
    let mut t = Tested::measured(index, commit, statuses[0], ms);
    if statuses.iter().any(|s| *s != statuses[0]) {
        let verdicts: Vec<&str> = ms.iter().map(|m| m.verdict.as_str()).collect();
        t.flaky = Some(format!(
            "{} is flaky at {}: its {} runs disagree ({}); a flaky cell cannot be bisected, \
             so no culprit is named. Make the cell deterministic, or bisect a cell that is \
             (its runs: {})",
            request.cell,
            commit.short(),
            ms.len(),
            verdicts.join(", "),
            ms.iter()
                .map(|m| m.run_dir.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ));
    } else if let Some(m) = ms.iter().find(|m| m.reps_disagree) {
        t.flaky = Some(format!(
            "{} is flaky at {}: its reps within run {} ended differently; a flaky cell cannot \
             be bisected, so no culprit is named. Make the cell deterministic, or bisect a cell \
             that is",
            request.cell,
            commit.short(),
            m.run_dir.display()
        ));
    } else if request.bits && ms.iter().any(|m| m.artifacts != first.artifacts) {
        t.flaky = Some(format!(
            "{}'s artifacts differ between its {} runs at {}: the cell is not deterministic, \
             so --bits cannot tell a commit's change from run-to-run noise and no culprit is \
             named. Bisect without --bits, or make the cell deterministic (its runs: {})",
            request.cell,
            ms.len(),
            commit.short(),
            ms.iter()
                .map(|m| m.run_dir.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    t
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::path::PathBuf;

    use super::{Request, Status, judge};
    use crate::bisect::git::CommitInfo;
    use crate::bisect::probe::Measured;
    use crate::words::verdict::Verdict;

    fn request(bits: bool) -> Request {
        Request {
            good: "a".into(),
            bad: "b".into(),
            cell: "c".into(),
            bits,
            artifacts: Vec::new(),
            jobs: 1,
            reps: 2,
        }
    }

    #[test]
    fn artifact_globs_keep_only_the_files_they_name() {
        let mut r = request(true);
        let mut got = m(Verdict::Pass, "x");
        got.artifacts.insert("receipt.tsv".into(), "y".into());
        got.artifacts.insert("f16.safetensors".into(), "z".into());
        let mut all = got.clone();
        r.select_artifacts(&mut all);
        assert_eq!(all.artifacts.len(), 3);
        r.artifacts = vec!["f16.safetensors".into(), "logits.*".into()];
        r.select_artifacts(&mut got);
        assert_eq!(
            got.artifacts.keys().collect::<Vec<_>>(),
            ["f16.safetensors", "logits.safetensors"]
        );
    }

    fn commit() -> CommitInfo {
        CommitInfo {
            sha: "0123456789abcdef".into(),
            subject: "s".into(),
            author: "a".into(),
        }
    }

    fn m(verdict: Verdict, digest: &str) -> Measured {
        Measured {
            run_dir: PathBuf::from(format!("/r/{digest}")),
            run_id: "r".into(),
            verdict,
            reason: None,
            artifacts: BTreeMap::from([("logits.safetensors".to_string(), digest.to_string())]),
            reused: false,
            reps_disagree: false,
        }
    }

    #[test]
    fn runs_that_agree_give_one_status() {
        let reference = BTreeMap::from([("logits.safetensors".to_string(), "x".to_string())]);
        let t = judge(
            &request(false),
            3,
            &commit(),
            &[m(Verdict::Fail, "x"), m(Verdict::Fail, "y")],
            None,
        );
        assert_eq!((t.status, t.flaky.is_none()), (Some(Status::Bad), true));
        let t = judge(
            &request(true),
            3,
            &commit(),
            &[m(Verdict::Fail, "x"), m(Verdict::Fail, "x")],
            Some(&reference),
        );
        assert_eq!((t.status, t.flaky.is_none()), (Some(Status::Good), true));
        let t = judge(
            &request(true),
            3,
            &commit(),
            &[m(Verdict::Blocked, "")],
            Some(&reference),
        );
        assert_eq!(t.status, Some(Status::Skip));
    }

    #[test]
    fn disagreeing_runs_reps_or_bits_are_flaky() {
        let t = judge(
            &request(false),
            3,
            &commit(),
            &[m(Verdict::Pass, "x"), m(Verdict::Fail, "x")],
            None,
        );
        assert!(
            t.flaky
                .unwrap()
                .contains("its 2 runs disagree (pass, fail)")
        );
        let mut one = m(Verdict::Fail, "x");
        one.reps_disagree = true;
        let t = judge(&request(false), 3, &commit(), &[one], None);
        assert!(t.flaky.unwrap().contains("its reps within run"));
        // Without --bits, artifacts that differ between runs of one verdict do not matter.
        let t = judge(
            &request(false),
            3,
            &commit(),
            &[m(Verdict::Pass, "x"), m(Verdict::Pass, "y")],
            None,
        );
        assert!(t.flaky.is_none());
        let reference = BTreeMap::from([("logits.safetensors".to_string(), "x".to_string())]);
        let t = judge(
            &request(true),
            3,
            &commit(),
            &[m(Verdict::Pass, "y"), m(Verdict::Pass, "z")],
            Some(&reference),
        );
        assert!(t.flaky.unwrap().contains("not deterministic"));
    }
}
