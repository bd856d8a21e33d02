//! What a negative cell must catch: `expect_fail = ["gate2*"]` names the checks whose
//! failure the planted defect exists to show. A canary passes only when at least one check
//! failed and every failed check matches one of its globs; a failure anywhere else is the
//! defect caught by the wrong check (or a different breakage), and the cell is `fail`.
//!
//! Globs are matched against the whole check name; `*` and `?` match any characters (`/`
//! included), and `[[]` is a literal `[`. This module only judges; the executor applies it
//! to each attempt's check rows.

use globset::{GlobBuilder, GlobMatcher};

use crate::gate::checks::{CheckRow, CheckStatus};

/// Whether `glob` can be used as an `expect_fail` entry.
pub fn check_glob(glob: &str) -> Result<(), globset::Error> {
    matcher(glob).map(|_| ())
}

fn matcher(glob: &str) -> Result<GlobMatcher, globset::Error> {
    GlobBuilder::new(glob)
        .literal_separator(false)
        .build()
        .map(|g| g.compile_matcher())
}

/// Whether `name` matches one of `globs` (globs that do not compile match nothing; the
/// manifest check refused them).
pub fn matches_any(globs: &[&str], name: &str) -> bool {
    globs
        .iter()
        .filter_map(|g| matcher(g).ok())
        .any(|m| m.is_match(name))
}

/// Why a failed attempt of a cell with `expect_fail = globs` failed for the wrong reason,
/// or `None` when it failed the way the cell expects.
pub fn wrong_reason(globs: &[String], checks: &[CheckRow]) -> Option<String> {
    if globs.is_empty() {
        return None;
    }
    let matchers: Vec<GlobMatcher> = globs.iter().filter_map(|g| matcher(g).ok()).collect();
    let failed: Vec<&CheckRow> = checks
        .iter()
        .filter(|c| c.status == CheckStatus::Fail)
        .collect();
    let expected = list(globs);
    let lost = checks
        .iter()
        .filter(|c| c.check == crate::gate::checks::DROPPED_CHECK)
        .filter_map(|c| {
            c.metrics
                .get(crate::gate::checks::LOST_FAIL_NAMES)?
                .as_u64()
        })
        .sum::<u64>();
    if lost > 0 {
        // Which checks those were is not known, so the cell cannot be shown to have
        // failed only where it should.
        return Some(format!(
            "failed for a reason that cannot be told: {lost} failing rows of checks not named in the receipt were dropped (the gate wrote more than {} distinct failing checks past the row cap); expect_fail = [{expected}]",
            crate::gate::checks::MAX_EXTRA_FAIL_NAMES
        ));
    }
    if failed.is_empty() {
        return Some(format!(
            "failed for the wrong reason: no check row failed, and expect_fail = [{expected}] names the checks that must"
        ));
    }
    let stray: Vec<&CheckRow> = failed
        .iter()
        .copied()
        .filter(|c| !matchers.iter().any(|m| m.is_match(&c.check)))
        .collect();
    let first = stray.first()?;
    let more = match stray.len() {
        1 => String::new(),
        n => format!(" (and {} more unexpected checks)", n - 1),
    };
    let why = first
        .message
        .as_deref()
        .filter(|m| !m.trim().is_empty())
        .map_or(String::new(), |m| format!(": {m}"));
    Some(format!(
        "failed for the wrong reason: check {} failed{why}{more}; expect_fail = [{expected}]",
        first.check
    ))
}

fn list(globs: &[String]) -> String {
    globs
        .iter()
        .map(|g| format!("{g:?}"))
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(check: &str, status: CheckStatus) -> CheckRow {
        CheckRow {
            check: check.to_string(),
            status,
            metrics: Default::default(),
            message: Some(format!("{check} said so")),
            first_mismatch: None,
            extra: Default::default(),
        }
    }

    #[test]
    fn only_the_named_checks_may_fail() {
        let globs = vec!["gate2*".to_string(), "tied[[]T=1,top_k=8]".to_string()];
        let ok = [
            row("gate1", CheckStatus::Pass),
            row("gate2.batch", CheckStatus::Fail),
            row("tied[T=1,top_k=8]", CheckStatus::Fail),
            row("gate3", CheckStatus::Warn),
        ];
        assert_eq!(wrong_reason(&globs, &ok), None);
        let wrong = [
            row("gate2.batch", CheckStatus::Fail),
            row("gate3", CheckStatus::Fail),
            row("tied[T=1,top_k=40]", CheckStatus::Fail),
        ];
        let why = wrong_reason(&globs, &wrong).unwrap();
        assert!(
            why.starts_with("failed for the wrong reason: check gate3 failed: gate3 said so (and 1 more unexpected checks)"),
            "{why}"
        );
        assert!(
            why.contains(r#"expect_fail = ["gate2*", "tied[[]T=1,top_k=8]"]"#),
            "{why}"
        );
        let none = [row("gate2", CheckStatus::Pass)];
        assert!(
            wrong_reason(&globs, &none)
                .unwrap()
                .contains("no check row failed")
        );
        assert_eq!(
            wrong_reason(&[], &wrong),
            None,
            "no globs: any failure will do"
        );
    }

    #[test]
    fn globs_are_checked() {
        assert!(check_glob("gate2*").is_ok());
        assert!(check_glob("tied[T=1").is_err());
    }
}
