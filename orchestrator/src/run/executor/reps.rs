//! The determinism check of reps (DESIGN §4, amendment of 2026-12-01): every rep of a cell
//! must leave the same artifacts as rep 1, the same file names with the same bytes.
//!
//! It owns comparing two attempts' artifact lists and wording the first difference so a
//! reader sees which file, which rep and where. It does not run attempts or decide when to
//! compare (the local executor's rep loop does), and it leaves reading safetensors values to
//! `gate::judge::compare_files`.

use std::collections::BTreeMap;
use std::path::Path;

use crate::gate::judge::compare_files;
use crate::plan::Policy;
use crate::receipt::Artifact;

/// One rep's artifacts: the rep number, its attempt's artifacts folder and what was in it.
#[derive(Debug, Clone, Copy)]
pub struct RepArtifacts<'a> {
    pub rep: u32,
    pub dir: &'a Path,
    pub artifacts: &'a [Artifact],
}

/// How many hex digits of a sha256 a difference message shows.
const SHORT_SHA: usize = 12;

/// The reason a cell fails when `later` did not leave what `first` left, or `None` when
/// both left the same files with the same digests. The first differing file (in name
/// order) is described; any further ones are counted.
pub fn difference(first: RepArtifacts<'_>, later: RepArtifacts<'_>) -> Option<String> {
    let a: BTreeMap<&str, &Artifact> = first
        .artifacts
        .iter()
        .map(|x| (x.name.as_str(), x))
        .collect();
    let b: BTreeMap<&str, &Artifact> = later
        .artifacts
        .iter()
        .map(|x| (x.name.as_str(), x))
        .collect();
    let mut names: Vec<&str> = a.keys().chain(b.keys()).copied().collect();
    names.sort_unstable();
    names.dedup();
    let mut differing = names
        .into_iter()
        .filter(|name| match (a.get(name), b.get(name)) {
            (Some(x), Some(y)) => x.sha256 != y.sha256 || x.bytes != y.bytes,
            _ => true,
        });
    let name = differing.next()?;
    let more = differing.count();
    let detail = match (a.get(name), b.get(name)) {
        (Some(x), Some(y)) => file_difference(name, first, later, x, y),
        (Some(_), None) => format!(
            "rep {} did not write {name}, which rep {} wrote",
            later.rep, first.rep
        ),
        _ => format!(
            "rep {} wrote {name}, which rep {} did not",
            later.rep, first.rep
        ),
    };
    let tail = match more {
        0 => String::new(),
        1 => "; 1 more file differs".to_string(),
        n => format!("; {n} more files differ"),
    };
    Some(format!("nondeterministic across reps: {detail}{tail}"))
}

/// Describes one file both reps wrote with different bytes: for safetensors, how many
/// values differ and the first that does; otherwise (or when the values cannot be compared,
/// or agree while the bytes do not) both digests.
fn file_difference(
    name: &str,
    first: RepArtifacts<'_>,
    later: RepArtifacts<'_>,
    x: &Artifact,
    y: &Artifact,
) -> String {
    let head = format!("{name} of rep {} differs from rep {}", later.rep, first.rep);
    let digests = format!("sha256 {} vs {}", short(&x.sha256), short(&y.sha256));
    if !name.ends_with(".safetensors") {
        return format!("{head} ({digests})");
    }
    let report = compare_files(
        &first.dir.join(name),
        &later.dir.join(name),
        &Policy::Bitwise,
    );
    match &report.first_mismatch {
        Some(m) if report.mismatches > 0 => {
            let tensor = if report.tensors.len() > 1 {
                format!("in tensor {} ", m.tensor)
            } else {
                String::new()
            };
            format!(
                "{head} in {} of {} values (first {tensor}at row {}, index {}: {} vs {})",
                grouped(report.mismatches),
                grouped(report.values_compared),
                m.row,
                m.index,
                m.reference,
                m.got
            )
        }
        _ if !report.failures.is_empty() => {
            format!("{head} ({digests}: {})", report.failures.join("; "))
        }
        _ => format!("{head} ({digests}; every value is equal, the bytes are not)"),
    }
}

fn short(sha: &str) -> String {
    match sha.get(..SHORT_SHA) {
        Some(s) if sha.len() > SHORT_SHA => format!("{s}…"),
        _ => sha.to_string(),
    }
}

/// `1572864` as `1,572,864`.
fn grouped(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn art(name: &str, sha: &str) -> Artifact {
        Artifact {
            name: name.into(),
            bytes: 4,
            sha256: sha.into(),
        }
    }

    fn rep<'a>(rep: u32, artifacts: &'a [Artifact]) -> RepArtifacts<'a> {
        RepArtifacts {
            rep,
            dir: Path::new("/nonexistent"),
            artifacts,
        }
    }

    #[test]
    fn groups_thousands() {
        assert_eq!(grouped(0), "0");
        assert_eq!(grouped(999), "999");
        assert_eq!(grouped(1000), "1,000");
        assert_eq!(grouped(1_572_864), "1,572,864");
    }

    #[test]
    fn equal_lists_do_not_differ() {
        let a = [art("x.bin", "aa"), art("y.bin", "bb")];
        assert_eq!(difference(rep(1, &a), rep(2, &a.clone())), None);
        assert_eq!(difference(rep(1, &[]), rep(2, &[])), None);
    }

    #[test]
    fn names_the_file_rep_and_digests() {
        let a = [art("x.bin", &"a".repeat(64))];
        let b = [art("x.bin", &"b".repeat(64))];
        assert_eq!(
            difference(rep(1, &a), rep(3, &b)).unwrap(),
            format!(
                "nondeterministic across reps: x.bin of rep 3 differs from rep 1 (sha256 {}… vs {}…)",
                "a".repeat(12),
                "b".repeat(12)
            )
        );
    }

    #[test]
    fn names_missing_and_extra_files() {
        let a = [art("x.bin", "aa")];
        assert_eq!(
            difference(rep(1, &a), rep(2, &[])).unwrap(),
            "nondeterministic across reps: rep 2 did not write x.bin, which rep 1 wrote"
        );
        assert_eq!(
            difference(rep(1, &[]), rep(2, &a)).unwrap(),
            "nondeterministic across reps: rep 2 wrote x.bin, which rep 1 did not"
        );
        let b = [art("w.bin", "cc"), art("x.bin", "dd")];
        assert_eq!(
            difference(rep(1, &a), rep(2, &b)).unwrap(),
            "nondeterministic across reps: rep 2 wrote w.bin, which rep 1 did not; \
             1 more file differs"
        );
    }
}
