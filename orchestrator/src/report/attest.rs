//! Pin attestation: a pin that two cells of one arm set differently, while both cells report
//! the same doors row, did not change which code paths ran. Such a pin is almost always a
//! typo, a door the engine no longer reads, or a door another pin overrides, and a battery
//! that sweeps it is then testing one configuration twice while claiming two.
//!
//! The same holds across a compare's pairing: a candidate that differs from its reference in
//! a pin (`MEMRA_PDL=0` against the default) claims to run another configuration, and the
//! doors rows must show it. There a pin whose doors key (its name without `MEMRA_`,
//! lower-cased: `pdl`) both rows carry is judged by that key alone; a pin without one by the
//! whole row.
//!
//! Any engine's gate can say which variables it read: doors keys `env.NAME` holding the
//! value it read (or `(unset)`), which `memra_gate`'s `gate.env` writes. For such a gate a
//! pin it did not read is flagged as [`UNREAD`]: a variable in which two cells of an arm or
//! the two sides of a compare differ, and every variable whose name starts with one of the
//! manifest's `attest` prefixes (`attest = ["LLAMA_", "VLLM_"]`). A cell that sets an
//! attested variable while its doors row lists no reads at all is flagged too: memra-orch
//! cannot tell, so it says so. Whole doors rows are compared without their `env.` keys, since
//! reading a variable is no evidence that it changed a code path.
//!
//! This module finds those pairs in the receipts of a finished run and adds a `warn` check
//! named [`CHECK`] (or [`UNREAD`]) to the receipts concerned. It does not change verdicts, does not write files (the
//! receipt writer files the receipts it changed) and does not judge cells that did not run.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::json;

use crate::gate::checks::{CheckRow, CheckStatus};
use crate::plan::NodeKind;
use crate::receipt::NodeReceipt;

/// The name of the warning check.
pub const CHECK: &str = "pin had no effect";

/// The name of the check for a pin the gate did not report reading.
pub const UNREAD: &str = "pin not read";

/// The prefix of the doors keys that report a variable the gate read: `env.LLAMA_N_UBATCH`.
pub const READ_PREFIX: &str = "env.";

/// A pin that a gate reporting its reads did not read, or read with another value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unread {
    pub node: String,
    pub cell: String,
    pub pin: String,
    pub value: String,
    /// What the gate reported reading instead (`None`: not listed at all).
    pub reported: Option<String>,
    /// The gate lists no reads at all (the pin is attested by prefix).
    pub no_reads: bool,
}

impl Unread {
    pub fn message(&self) -> String {
        let Unread {
            pin, value, cell, ..
        } = self;
        if self.no_reads {
            return format!(
                "pin {pin}={value} ({cell}) is attested, but the gate's doors row lists no \
                 variable it read; report each read as a doors key `env.NAME` (memra_gate's \
                 gate.env does) so an ignored pin shows"
            );
        }
        match &self.reported {
            Some(got) => format!(
                "pin {pin}={value} ({cell}) but the gate reports reading {pin}={got}; check \
                 what overrides it"
            ),
            None => format!(
                "pin {pin}={value} ({cell}) was set but the gate does not report reading it; \
                 the engine may ignore it (a typo, a variable it no longer reads), so cells \
                 that differ only in it test one configuration twice"
            ),
        }
    }
}

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
    /// The doors key that should have told the two apart, when the pin has one; `None` when
    /// the whole rows were compared.
    pub key: Option<String>,
}

impl Finding {
    /// The sentence used in receipts and in `summary.md`.
    pub fn message(&self) -> String {
        let same = match &self.key {
            None => "identical doors rows".to_string(),
            Some(k) => format!("the same `{k}` in their doors rows"),
        };
        format!(
            "pin {} had no effect: {}={} ({}) and {}={} ({}) report {same}; \
             check that the engine still reads {} and that no other pin overrides it",
            self.pin, self.pin, self.a_value, self.a, self.pin, self.b_value, self.b, self.pin
        )
    }
}

/// Whether an environment variable is a pin (DESIGN §4): `MEMRA_*`, but not the
/// orchestrator's own `MEMRA_ORCH_*`.
fn is_pin(name: &str) -> bool {
    name.starts_with("MEMRA_") && !name.starts_with("MEMRA_ORCH_")
}

/// Whether a variable is the orchestrator's own, set per attempt (never a pin).
fn is_own(name: &str) -> bool {
    name.starts_with("MEMRA_ORCH_") || matches!(name, "CUDA_VISIBLE_DEVICES" | "TMPDIR")
}

/// The variables a gate reports reading, with the values it read.
fn reads(doors: &BTreeMap<String, serde_json::Value>) -> BTreeMap<&str, String> {
    doors
        .iter()
        .filter_map(|(k, v)| {
            let name = k.strip_prefix(READ_PREFIX)?;
            // A number or boolean reads as the text a variable would hold: `1`, `true`.
            let text = match v {
                serde_json::Value::String(s) => s.clone(),
                serde_json::Value::Number(n) => n
                    .as_i64()
                    .map(|i| i.to_string())
                    .unwrap_or_else(|| n.to_string()),
                other => other.to_string(),
            };
            Some((name, text))
        })
        .collect()
}

/// A doors row without the keys that report reads, for judging whether code paths differ.
fn paths(doors: &BTreeMap<String, serde_json::Value>) -> Vec<(&String, &serde_json::Value)> {
    doors
        .iter()
        .filter(|(k, _)| !k.starts_with(READ_PREFIX))
        .collect()
}

/// The doors-row key a pin reports under by convention: `MEMRA_PDL` → `pdl`.
fn doors_key(pin: &str) -> String {
    pin.trim_start_matches("MEMRA_").to_ascii_lowercase()
}

/// Finds every pin in which a compare's candidate differs from its reference while the doors
/// rows do not show it. `pairs` holds each pairing as (reference, candidate) positions in
/// `receipts`. A pin set on one side only is compared with the value `(unset)`.
pub fn find_in_pairs(receipts: &[Option<&NodeReceipt>], pairs: &[(usize, usize)]) -> Vec<Finding> {
    let mut findings = Vec::new();
    let mut seen = BTreeSet::new();
    for &(ri, ci) in pairs {
        let (Some(Some(r)), Some(Some(c))) = (receipts.get(ri), receipts.get(ci)) else {
            continue;
        };
        if !eligible(r) || !eligible(c) || !seen.insert((ri, ci)) {
            continue;
        }
        let (Some(rd), Some(cd)) = (&r.doors, &c.doors) else {
            continue;
        };
        let pins: BTreeSet<&str> = r
            .env
            .keys()
            .chain(c.env.keys())
            .map(String::as_str)
            .filter(|k| is_pin(k) && r.env.get(*k) != c.env.get(*k))
            .collect();
        for pin in pins {
            let key = doors_key(pin);
            let (judged_by, same) = match (rd.get(&key), cd.get(&key)) {
                (Some(a), Some(b)) => (Some(key), a == b),
                _ => (None, paths(rd) == paths(cd)),
            };
            if same {
                let value = |x: &NodeReceipt| {
                    x.env
                        .get(pin)
                        .cloned()
                        .unwrap_or_else(|| "(unset)".to_string())
                };
                findings.push(Finding {
                    node: c.node.clone(),
                    pin: pin.to_string(),
                    a: r.id.clone(),
                    a_value: value(r),
                    b: c.id.clone(),
                    b_value: value(c),
                    key: judged_by,
                });
            }
        }
    }
    findings
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
                        let same = match (&a.doors, &b.doors) {
                            (Some(x), Some(y)) => paths(x) == paths(y),
                            _ => false,
                        };
                        if a.cell[pin] != b.cell[pin] && same {
                            findings.push(Finding {
                                node: node.to_string(),
                                pin: pin.to_string(),
                                a: a.id.clone(),
                                a_value: a.cell[pin].clone(),
                                b: b.id.clone(),
                                b_value: b.cell[pin].clone(),
                                key: None,
                            });
                        }
                    }
                }
            }
        }
    }
    findings
}

/// Every pin a gate that reports its reads did not read: the variables in which cells of
/// one arm (`find`'s pin axes) or the sides of a pair differ, and those named by an
/// `attest` prefix. One finding per cell and variable.
pub fn find_unread(
    receipts: &[Option<&NodeReceipt>],
    pairs: &[(usize, usize)],
    prefixes: &[String],
) -> Vec<Unread> {
    let mut wanted: BTreeMap<usize, BTreeSet<&str>> = BTreeMap::new();
    for (i, r) in receipts.iter().enumerate() {
        let Some(r) = r else { continue };
        let set = wanted.entry(i).or_default();
        set.extend(
            r.env
                .keys()
                .map(String::as_str)
                .filter(|k| !is_own(k) && prefixes.iter().any(|p| k.starts_with(p.as_str()))),
        );
        set.extend(pin_axes(r));
    }
    for &(ri, ci) in pairs {
        let (Some(Some(r)), Some(Some(c))) = (receipts.get(ri), receipts.get(ci)) else {
            continue;
        };
        let differ: Vec<&str> = r
            .env
            .keys()
            .chain(c.env.keys())
            .map(String::as_str)
            .filter(|k| !is_own(k) && r.env.get(*k) != c.env.get(*k))
            .collect();
        for i in [ri, ci] {
            wanted.entry(i).or_default().extend(differ.iter().copied());
        }
    }
    let mut out = Vec::new();
    let empty = BTreeMap::new();
    for (i, names) in wanted {
        let Some(Some(r)) = receipts.get(i) else {
            continue;
        };
        // A cell that ran but wrote no doors row reads as one that reports no reads: only
        // its attested pins are flagged (memra-orch cannot tell whether it read them).
        let ran = r.kind == NodeKind::Arm && r.verdict.is_final() && !r.attempts.is_empty();
        if !ran {
            continue;
        }
        let read = reads(r.doors.as_ref().unwrap_or(&empty));
        for pin in names {
            let Some(value) = r.env.get(pin) else {
                // Unset on this side: the other side's value is what is attested.
                continue;
            };
            let by_prefix = prefixes.iter().any(|p| pin.starts_with(p.as_str()));
            let finding = |reported, no_reads| Unread {
                node: r.node.clone(),
                cell: r.id.clone(),
                pin: pin.to_string(),
                value: value.clone(),
                reported,
                no_reads,
            };
            if read.is_empty() {
                if by_prefix {
                    out.push(finding(None, true));
                }
                continue;
            }
            match read.get(pin) {
                None => out.push(finding(None, false)),
                Some(got) if got != value => out.push(finding(Some(got.clone()), false)),
                Some(_) => {}
            }
        }
    }
    out
}

fn unread_row(u: &Unread) -> CheckRow {
    let mut extra = BTreeMap::new();
    extra.insert("pin".to_string(), json!(u.pin));
    extra.insert("value".to_string(), json!(u.value));
    if let Some(r) = &u.reported {
        extra.insert("reported".to_string(), json!(r));
    }
    CheckRow {
        check: UNREAD.to_string(),
        status: CheckStatus::Warn,
        metrics: BTreeMap::new(),
        message: Some(u.message()),
        first_mismatch: None,
        extra,
    }
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
/// exactly those files). `pairs` are the compares' (reference, candidate) positions.
pub fn attest(
    receipts: &mut [Option<Box<NodeReceipt>>],
    pairs: &[(usize, usize)],
    prefixes: &[String],
) -> (Vec<Finding>, Vec<Unread>, Vec<usize>) {
    let mut changed = BTreeSet::new();
    for (i, r) in receipts.iter_mut().enumerate() {
        if let Some(r) = r {
            let before = r.checks.len();
            r.checks.retain(|c| c.check != CHECK && c.check != UNREAD);
            if r.checks.len() != before {
                changed.insert(i);
            }
        }
    }
    let findings = {
        let refs: Vec<&NodeReceipt> = receipts.iter().flatten().map(|b| b.as_ref()).collect();
        let mut all = find(&refs);
        let by_position: Vec<Option<&NodeReceipt>> =
            receipts.iter().map(|r| r.as_deref()).collect();
        all.extend(find_in_pairs(&by_position, pairs));
        all
    };
    let unread = {
        let by_position: Vec<Option<&NodeReceipt>> =
            receipts.iter().map(|r| r.as_deref()).collect();
        find_unread(&by_position, pairs, prefixes)
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
    for u in &unread {
        if let Some(&i) = position.get(&u.cell)
            && let Some(r) = receipts[i].as_mut()
        {
            r.checks.push(unread_row(u));
            changed.insert(i);
        }
    }
    (findings, unread, changed.into_iter().collect())
}

/// The `summary.md` section naming every finding (empty when there are none).
pub fn markdown(findings: &[Finding], unread: &[Unread]) -> String {
    let mut out = String::new();
    if !findings.is_empty() {
        out.push_str(&format!("\n## Warnings: {CHECK} ({})\n\n", findings.len()));
        for f in findings {
            out.push_str(&format!("- `{}`: {}\n", f.node, f.message()));
        }
    }
    if !unread.is_empty() {
        out.push_str(&format!("\n## Warnings: {UNREAD} ({})\n\n", unread.len()));
        for u in unread {
            out.push_str(&format!("- `{}`: {}\n", u.node, u.message()));
        }
    }
    out
}

/// Whether a receipt carries an attestation warning (for displays that list warnings).
pub fn has_warning(r: &NodeReceipt) -> bool {
    r.checks
        .iter()
        .any(|c| c.check == CHECK || c.check == UNREAD)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::words::verdict::Verdict;
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
            artifacts: Vec::new(),
            gpu_health: Vec::new(),
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
        let (findings, _, changed) = attest(&mut rs, &[], &[]);
        assert_eq!(findings.len(), 1);
        assert_eq!(findings[0].pin, "MEMRA_FA3");
        assert_eq!(changed, [0, 1]);
        for r in rs.iter().flatten() {
            let w: Vec<_> = r.checks.iter().filter(|c| c.check == CHECK).collect();
            assert_eq!(w.len(), 1);
            assert_eq!(w[0].status, CheckStatus::Warn);
        }
        // Attesting again (a resumed run) replaces the rows instead of adding more.
        let (again, _, _) = attest(&mut rs, &[], &[]);
        assert_eq!(again.len(), 1);
        assert_eq!(rs[0].as_ref().unwrap().checks.len(), 1);
        assert!(markdown(&findings, &[]).contains("MEMRA_FA3"));
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
        let (findings, _, changed) = attest(&mut rs, &[], &[]);
        assert!(findings.is_empty(), "{findings:?}");
        assert!(changed.is_empty());
    }

    #[test]
    fn a_compare_candidate_whose_pin_the_doors_row_does_not_show_is_flagged() {
        let reference = cell("dump", &[], &[], json!({"matvec": "mmvq", "pdl": true}));
        let mut told = cell(
            "dump-plain",
            &[],
            &[],
            json!({"matvec": "mmvq", "pdl": false}),
        );
        told.env.insert("MEMRA_PDL".into(), "0".into());
        // MEMRA_CLAIM_SM has a doors key, and it did not change: flagged by that key, even
        // though the rows differ elsewhere.
        let mut untold = cell(
            "dump-claim",
            &[],
            &[],
            json!({"matvec": "mmvq", "pdl": false, "claim_sm": true}),
        );
        untold.env.insert("MEMRA_PDL".into(), "0".into());
        untold.env.insert("MEMRA_CLAIM_SM".into(), "0".into());
        let reference2 = cell(
            "dump2",
            &[],
            &[],
            json!({"matvec": "mmvq", "pdl": true, "claim_sm": true}),
        );
        // A pin with no doors key, rows identical: flagged by the whole row.
        let mut keyless = cell("dump-x", &[], &[], json!({"matvec": "mmvq", "pdl": true}));
        keyless.env.insert("MEMRA_NEW_THING".into(), "1".into());
        // A non-pin variable differing is not judged.
        let mut other = cell("dump-y", &[], &[], json!({"matvec": "mmvq", "pdl": true}));
        other.env.insert("OUT_NAME".into(), "y".into());
        let mut rs = vec![
            Some(reference),
            Some(told),
            Some(reference2),
            Some(untold),
            Some(keyless),
            Some(other),
        ];
        let (findings, _, changed) = attest(&mut rs, &[(0, 1), (2, 3), (0, 4), (0, 5)], &[]);
        let got: Vec<(&str, &str, Option<&str>)> = findings
            .iter()
            .map(|f| (f.b.as_str(), f.pin.as_str(), f.key.as_deref()))
            .collect();
        assert_eq!(
            got,
            [
                ("dump-claim[]", "MEMRA_CLAIM_SM", Some("claim_sm")),
                ("dump-x[]", "MEMRA_NEW_THING", None),
            ]
        );
        assert_eq!(changed, [0, 2, 3, 4]);
        assert!(findings[0].message().contains("the same `claim_sm`"));
        assert!(
            findings[0]
                .message()
                .contains("MEMRA_CLAIM_SM=(unset) (dump2[])")
        );
    }
}
