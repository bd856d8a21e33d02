//! Pin attestation: a pin that two cells of one arm set differently, while both cells report
//! the same doors row, did not change which code paths ran. Such a pin is almost always a
//! typo, a door the engine no longer reads, or a door another pin overrides, and a battery
//! that sweeps it is then testing one configuration twice while claiming two.
//!
//! This module finds those pairs in the receipts of a finished run and adds a `warn` check
//! named [`CHECK`] to both receipts. It does not change verdicts, does not write files (the
//! receipt writer files the receipts it changed) and does not judge cells that did not run.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::json;

use crate::plan::NodeKind;
use crate::protocol::{CheckRow, CheckStatus};
use crate::receipt::NodeReceipt;

/// The name of the warning check.
pub const CHECK: &str = "pin had no effect";

/// One finding: cells `a` and `b` of one arm differ only in pin `pin`, yet ran identical
/// doors.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    pub node: String,
    pub pin: String,
    pub a: String,
    pub a_value: String,
    pub b: String,
    pub b_value: String,
}

impl Finding {
    /// The sentence used in receipts and in `summary.md`.
    pub fn message(&self) -> String {
        format!(
            "pin {} had no effect: {}={} ({}) and {}={} ({}) report identical doors rows; \
             check that the engine still reads {} and that no other pin overrides it",
            self.pin, self.pin, self.a_value, self.a, self.pin, self.b_value, self.b, self.pin
        )
    }
}

/// Whether a receipt can take part: an arm cell that ran (any final verdict) and wrote a
/// doors row. Skipped, blocked and cancelled cells ran nothing, so their doors say nothing.
fn eligible(r: &NodeReceipt) -> bool {
    r.kind == NodeKind::Arm && r.doors.is_some() && r.verdict.is_final() && !r.attempts.is_empty()
}

/// The axis keys of a cell that are pins: environment variables the cell ran with, set to
/// the axis value. Inline axes (`matrix = {…}`) are not environment variables and are left
/// out, since a different inline value may legitimately leave the doors alone (a batch size).
fn pin_axes(r: &NodeReceipt) -> BTreeSet<&str> {
    r.cell
        .iter()
        .filter(|(k, v)| r.env.get(*k) == Some(*v))
        .map(|(k, _)| k.as_str())
        .collect()
}

/// Finds every pair of cells of one arm that differ in exactly one axis, that axis a pin,
/// and report identical doors rows. Pairs differing in several axes are not judged: two pins
/// could cancel each other out, and the finding would blame the wrong one.
pub fn find(receipts: &[&NodeReceipt]) -> Vec<Finding> {
    let mut by_node: BTreeMap<&str, Vec<&NodeReceipt>> = BTreeMap::new();
    for r in receipts.iter().copied().filter(|r| eligible(r)) {
        by_node.entry(r.node.as_str()).or_default().push(r);
    }
    let mut findings = Vec::new();
    for (node, cells) in by_node {
        let pins: BTreeSet<&str> = cells.iter().flat_map(|r| pin_axes(r)).collect();
        for pin in pins {
            // Cells that agree on every other axis land in one bucket; within a bucket they
            // differ in `pin` only.
            let mut buckets: BTreeMap<Vec<(&str, &str)>, Vec<&NodeReceipt>> = BTreeMap::new();
            for r in &cells {
                if !pin_axes(r).contains(pin) {
                    continue;
                }
                let rest: Vec<(&str, &str)> = r
                    .cell
                    .iter()
                    .filter(|(k, _)| k.as_str() != pin)
                    .map(|(k, v)| (k.as_str(), v.as_str()))
                    .collect();
                buckets.entry(rest).or_default().push(r);
            }
            for group in buckets.values() {
                for (i, a) in group.iter().enumerate() {
                    for b in &group[i + 1..] {
                        if a.cell[pin] != b.cell[pin] && a.doors == b.doors {
                            findings.push(Finding {
                                node: node.to_string(),
                                pin: pin.to_string(),
                                a: a.id.clone(),
                                a_value: a.cell[pin].clone(),
                                b: b.id.clone(),
                                b_value: b.cell[pin].clone(),
                            });
                        }
                    }
                }
            }
        }
    }
    findings
}

fn row(f: &Finding, other: &str, other_value: &str) -> CheckRow {
    let mut extra = BTreeMap::new();
    extra.insert("pin".to_string(), json!(f.pin));
    extra.insert("same_doors_as".to_string(), json!(other));
    extra.insert("other_value".to_string(), json!(other_value));
    CheckRow {
        check: CHECK.to_string(),
        status: CheckStatus::Warn,
        metrics: BTreeMap::new(),
        message: Some(f.message()),
        first_mismatch: None,
        extra,
    }
}

/// Attests the receipts of a run: removes attestation rows an earlier run left in reused
/// receipts, adds one warning row per finding to both receipts concerned, and returns the
/// findings with the positions of the receipts whose checks changed (so the caller rewrites
/// exactly those files).
pub fn attest(receipts: &mut [Option<Box<NodeReceipt>>]) -> (Vec<Finding>, Vec<usize>) {
    let mut changed = BTreeSet::new();
    for (i, r) in receipts.iter_mut().enumerate() {
        if let Some(r) = r {
            let before = r.checks.len();
            r.checks.retain(|c| c.check != CHECK);
            if r.checks.len() != before {
                changed.insert(i);
            }
        }
    }
    let findings = {
        let refs: Vec<&NodeReceipt> = receipts.iter().flatten().map(|b| b.as_ref()).collect();
        find(&refs)
    };
    let position: BTreeMap<String, usize> = receipts
        .iter()
        .enumerate()
        .filter_map(|(i, r)| r.as_ref().map(|r| (r.id.clone(), i)))
        .collect();
    for f in &findings {
        for (me, other, other_value) in [(&f.a, &f.b, &f.b_value), (&f.b, &f.a, &f.a_value)] {
            if let Some(&i) = position.get(me)
                && let Some(r) = receipts[i].as_mut()
            {
                r.checks.push(row(f, other, other_value));
                changed.insert(i);
            }
        }
    }
    (findings, changed.into_iter().collect())
}

/// The `summary.md` section naming every finding (empty when there are none).
pub fn markdown(findings: &[Finding]) -> String {
    if findings.is_empty() {
        return String::new();
    }
    let mut out = format!("\n## Warnings: {CHECK} ({})\n\n", findings.len());
    for f in findings {
        out.push_str(&format!("- `{}`: {}\n", f.node, f.message()));
    }
    out
}

/// Whether a receipt carries an attestation warning (for displays that list warnings).
pub fn has_warning(r: &NodeReceipt) -> bool {
    r.checks.iter().any(|c| c.check == CHECK)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verdict::Verdict;
    use serde_json::Value;

    fn cell(node: &str, axes: &[(&str, &str)], env: &[&str], doors: Value) -> Box<NodeReceipt> {
        let id = format!(
            "{node}[{}]",
            axes.iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>()
                .join(",")
        );
        let mut r = NodeReceipt::new(id.clone(), node.into(), NodeKind::Arm, id);
        r.verdict = Verdict::Pass;
        r.attempts.push(crate::receipt::AttemptRecord {
            n: 1,
            rep: 1,
            start: String::new(),
            seconds: 0.1,
            exit: Some(0),
            signal: None,
            outcome: Verdict::Pass,
            reason: None,
        });
        for (k, v) in axes {
            r.cell.insert(k.to_string(), v.to_string());
            if env.contains(k) {
                r.env.insert(k.to_string(), v.to_string());
            }
        }
        r.doors = serde_json::from_value(doors).unwrap();
        Box::new(r)
    }

    #[test]
    fn a_pin_that_changes_nothing_is_named_in_both_cells() {
        let mut rs = vec![
            Some(cell(
                "g",
                &[("MEMRA_FA3", "0")],
                &["MEMRA_FA3"],
                json!({"attn": "fa2"}),
            )),
            Some(cell(
                "g",
                &[("MEMRA_FA3", "1")],
                &["MEMRA_FA3"],
                json!({"attn": "fa2"}),
            )),
        ];
        let (findings, changed) = attest(&mut rs);
        assert_eq!(findings.len(), 1);
        assert_eq!(findings[0].pin, "MEMRA_FA3");
        assert_eq!(changed, [0, 1]);
        for r in rs.iter().flatten() {
            let w: Vec<_> = r.checks.iter().filter(|c| c.check == CHECK).collect();
            assert_eq!(w.len(), 1);
            assert_eq!(w[0].status, CheckStatus::Warn);
        }
        // Attesting again (a resumed run) replaces the rows instead of adding more.
        let (again, _) = attest(&mut rs);
        assert_eq!(again.len(), 1);
        assert_eq!(rs[0].as_ref().unwrap().checks.len(), 1);
        assert!(markdown(&findings).contains("MEMRA_FA3"));
    }

    #[test]
    fn effective_pins_inline_axes_and_multi_axis_pairs_are_not_flagged() {
        let doors = json!({"attn": "fa2"});
        let mut rs = vec![
            // The pin changes the doors: fine.
            Some(cell(
                "a",
                &[("MEMRA_FA3", "0")],
                &["MEMRA_FA3"],
                json!({"attn": "fa2"}),
            )),
            Some(cell(
                "a",
                &[("MEMRA_FA3", "1")],
                &["MEMRA_FA3"],
                json!({"attn": "fa3"}),
            )),
            // An inline axis (not in the environment) with equal doors: not a pin.
            Some(cell("b", &[("batch", "4")], &[], doors.clone())),
            Some(cell("b", &[("batch", "8")], &[], doors.clone())),
            // Two pins differ at once: not attributable to either.
            Some(cell(
                "c",
                &[("X", "0"), ("Y", "0")],
                &["X", "Y"],
                doors.clone(),
            )),
            Some(cell(
                "c",
                &[("X", "1"), ("Y", "1")],
                &["X", "Y"],
                doors.clone(),
            )),
        ];
        let mut skipped = cell("d", &[("X", "0")], &["X"], doors.clone());
        skipped.verdict = Verdict::Skipped;
        rs.push(Some(skipped));
        rs.push(Some(cell("d", &[("X", "1")], &["X"], doors)));
        let (findings, changed) = attest(&mut rs);
        assert!(findings.is_empty(), "{findings:?}");
        assert!(changed.is_empty());
    }
}
