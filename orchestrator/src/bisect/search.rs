//! The search itself, with no git and no processes: a first-parent line of commits from the
//! good one (index 0) to the bad one (index `n`), what is known of each, which commits to
//! test next, and what the knowledge proves. `bisect::run` feeds it outcomes; it never runs
//! anything.
//!
//! The endpoints are taken at the user's word until the search lands next to one of them:
//! the first commit after `good` is proven only by testing `good` too, and a culprit equal
//! to `bad` only by testing `bad`. So a search over 31 commits after `good` tests 5 inner
//! commits and at most one endpoint (the `--bits` reference, `good`, is always tested
//! first: its artifacts are what "moved" means).

/// What one tested commit showed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// As the good commit: the cell as expected, or (`--bits`) its artifacts equal to the
    /// good commit's.
    Good,
    /// Changed: not as expected, or its artifacts moved.
    Bad,
    /// Could not be tested (a setup failed, the cell is not in the manifest there, or its
    /// resources are missing); left out like `git bisect skip`.
    Skip,
}

/// What the search knows: one entry per commit of the line, `None` until tested.
#[derive(Debug, Clone)]
pub struct Search {
    known: Vec<Option<Status>>,
}

/// What the knowledge proves once nothing is left to test.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Conclusion {
    /// The first changed commit (its parent, `index - 1`, was tested good or is `good`).
    Found { index: usize },
    /// The first changed commit is one of `first..=last`: the commits between were skipped.
    Range { first: usize, last: usize },
    /// `bad` was tested and is as the good commit: the range holds no change.
    NoChange,
    /// `good` was tested and is changed already.
    GoodIsBad,
}

impl Search {
    /// A line of `n + 1` commits, index 0 the good one and index `n` the bad one.
    pub fn new(n: usize) -> Search {
        Search {
            known: vec![None; n + 1],
        }
    }

    /// The index of the bad commit.
    pub fn last(&self) -> usize {
        self.known.len() - 1
    }

    pub fn record(&mut self, index: usize, status: Status) {
        self.known[index] = Some(status);
    }

    pub fn status(&self, index: usize) -> Option<Status> {
        self.known[index]
    }

    /// The bracket: the first commit known or taken to be changed (`bad` unless a tested
    /// one before it is), and the last good one before it (`good` unless a tested one
    /// after it is). A good commit after a changed one (a cell that changed and changed
    /// back) does not move the bracket: the first change is the one searched for.
    fn bracket(&self) -> (usize, usize) {
        let hi = (1..self.last())
            .find(|&i| self.known[i] == Some(Status::Bad))
            .unwrap_or(self.last());
        let lo = (0..hi)
            .rev()
            .find(|&i| self.known[i] == Some(Status::Good) || i == 0)
            .unwrap_or(0);
        (lo, hi)
    }

    /// Up to `jobs` commits to test next, all untested: `jobs` points that cut the open
    /// commits between the bracket into `jobs + 1` even parts (with one job, the middle
    /// one, as `git bisect` takes it), or, when none is left inside, the endpoint that
    /// still has to be proven. Empty when the knowledge is final.
    pub fn next(&self, jobs: usize) -> Vec<usize> {
        if self.known[0] == Some(Status::Bad) {
            return Vec::new();
        }
        let (lo, hi) = self.bracket();
        let open: Vec<usize> = (lo + 1..hi).filter(|&i| self.known[i].is_none()).collect();
        if !open.is_empty() {
            let parts = jobs.max(1).min(open.len());
            let mut picks: Vec<usize> = (1..=parts)
                .map(|j| open[(j * open.len()) / (parts + 1)])
                .collect();
            picks.dedup();
            return picks;
        }
        // Nothing untested is left inside: prove the endpoints the answer leans on.
        let mut picks = Vec::new();
        if hi == self.last() && self.known[hi].is_none() {
            picks.push(hi);
        }
        if lo == 0 && self.known[0].is_none() && self.skipped_between(lo, hi) == hi - lo - 1 {
            picks.push(0);
        }
        picks
    }

    fn skipped_between(&self, lo: usize, hi: usize) -> usize {
        (lo + 1..hi)
            .filter(|&i| self.known[i] == Some(Status::Skip))
            .count()
    }

    /// What the knowledge proves; `None` while [`Search::next`] still has commits to test.
    pub fn conclusion(&self) -> Option<Conclusion> {
        if self.known[0] == Some(Status::Bad) {
            return Some(Conclusion::GoodIsBad);
        }
        if !self.next(1).is_empty() {
            return None;
        }
        let (lo, hi) = self.bracket();
        if hi == self.last() && self.known[hi] == Some(Status::Good) {
            return Some(Conclusion::NoChange);
        }
        Some(if hi - lo == 1 {
            Conclusion::Found { index: hi }
        } else {
            Conclusion::Range {
                first: lo + 1,
                last: hi,
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::{Conclusion, Search, Status};

    /// Runs a search over commits `0..=n` where commit `i` has status `truth(i)`, `jobs`
    /// at a time, with `good` tested first when `reference` (as `--bits` does). Returns
    /// the conclusion and how many commits were tested.
    fn drive(
        n: usize,
        jobs: usize,
        reference: bool,
        truth: impl Fn(usize) -> Status,
    ) -> (Conclusion, usize) {
        let mut s = Search::new(n);
        let mut tested = 0;
        if reference {
            s.record(0, truth(0));
            tested += 1;
        }
        loop {
            let picks = s.next(jobs);
            if picks.is_empty() {
                return (s.conclusion().unwrap(), tested);
            }
            assert!(picks.len() <= jobs.max(1));
            for i in picks {
                assert!(s.status(i).is_none(), "commit {i} tested twice");
                s.record(i, truth(i));
                tested += 1;
            }
        }
    }

    fn first_bad_at(c: usize) -> impl Fn(usize) -> Status {
        move |i| if i >= c { Status::Bad } else { Status::Good }
    }

    #[test]
    fn every_culprit_of_31_commits_is_found_in_at_most_6_tests() {
        for c in 1..=31 {
            let (found, tested) = drive(31, 1, false, first_bad_at(c));
            assert_eq!(found, Conclusion::Found { index: c }, "culprit {c}");
            assert!(tested <= 6, "culprit {c}: {tested} tests");
            let (found, tested) = drive(31, 1, true, first_bad_at(c));
            assert_eq!(found, Conclusion::Found { index: c }, "culprit {c} (bits)");
            assert!(tested <= 6, "culprit {c} (bits): {tested} tests");
        }
    }

    #[test]
    fn a_k_ary_search_needs_fewer_rounds() {
        for c in 1..=31 {
            let mut s = Search::new(31);
            let mut rounds = 0;
            while !s.next(3).is_empty() {
                for i in s.next(3) {
                    s.record(i, first_bad_at(c)(i));
                }
                rounds += 1;
            }
            assert_eq!(s.conclusion(), Some(Conclusion::Found { index: c }));
            assert!(rounds <= 4, "culprit {c}: {rounds} rounds");
        }
    }

    #[test]
    fn no_change_is_proven_by_testing_bad() {
        let (c, tested) = drive(31, 1, false, |_| Status::Good);
        assert_eq!(c, Conclusion::NoChange);
        assert!(tested <= 6);
    }

    #[test]
    fn a_bad_good_commit_is_reported() {
        let (c, _) = drive(31, 1, false, |_| Status::Bad);
        assert_eq!(c, Conclusion::GoodIsBad);
        let (c, tested) = drive(31, 1, true, |_| Status::Bad);
        assert_eq!((c, tested), (Conclusion::GoodIsBad, 1));
    }

    #[test]
    fn skips_move_to_a_neighbour_or_leave_a_range() {
        // Commit 16 (the first midpoint) does not build: the search goes around it.
        let truth = |i: usize| match i {
            16 => Status::Skip,
            i if i >= 25 => Status::Bad,
            _ => Status::Good,
        };
        assert_eq!(
            drive(31, 1, false, truth).0,
            Conclusion::Found { index: 25 }
        );
        // The culprit and the commit before it are both skipped: the answer is a range.
        let truth = |i: usize| match i {
            24 | 25 => Status::Skip,
            i if i >= 25 => Status::Bad,
            _ => Status::Good,
        };
        assert_eq!(
            drive(31, 1, false, truth).0,
            Conclusion::Range {
                first: 24,
                last: 26
            }
        );
    }

    #[test]
    fn a_change_that_reverts_later_still_finds_the_first() {
        // Bad from 10 to 20, good again after: whichever bad commit the search meets, the
        // answer is a good commit followed by a bad one.
        let truth = |i: usize| {
            if (10..=20).contains(&i) || i == 31 {
                Status::Bad
            } else {
                Status::Good
            }
        };
        let (c, _) = drive(31, 1, false, truth);
        let Conclusion::Found { index } = c else {
            panic!("{c:?}")
        };
        assert!(truth(index) == Status::Bad && truth(index - 1) == Status::Good);
    }
}
