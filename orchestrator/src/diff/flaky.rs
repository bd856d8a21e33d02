//! Flaky and nondeterministic cells in a diff, decided on evidence. A cell's `inputs` digest
//! covers what determines it — binaries, argv, pins, declared inputs, fingerprints and the
//! code (the commit's tree and uncommitted changes, unless the cell is hermetic) — so two
//! receipts with equal digests, on the same GPU models and driver, tested the same thing.
//!
//! - A verdict change between OLD and NEW with equal digests (two runs at one commit, say)
//!   is **flaky**: not a regression or a fix; its section says how often the cell flipped in
//!   the last runs of the manifest. Same for artifacts that differ with equal digests and the
//!   same verdict: **nondeterministic**. Neither makes the diff exit 1 unless
//!   `--flaky-fails`.
//! - A change across different digests is a regression, fix or bits moved, whatever the
//!   cell's history. When the cell has shown flakiness at one digest within the flaky
//!   window (two runs with equal digests and different verdicts or artifacts, or attempts of
//!   one run that disagreed), the entry is marked *known flaky* (or *known
//!   nondeterministic*) and still counts.
//! - A receipt that does not name its code (a run outside git, a receipt from before code
//!   identities) is never evidence: its changes stay regressions.
//!
//! This module owns that classification and the two sections' rendering; [`super::diff`]
//! finds the changes, and [`classify`] moves the ones that qualify out of regressions,
//! fixes and bits moved and marks the rest. It reads the two receipts of each candidate cell
//! and the history index; it never writes inside a tree.

use std::fmt::Write;
use std::path::Path;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{BitsMoved, Diff, DiffRun, VerdictChange};
use crate::history::RunRecord;
use crate::receipt::GpuRef;
use crate::receipt::commit::short_commit;
use crate::receipt::load::LoadedNode;
use crate::receipt::tree::Tree;

/// A cell whose verdict changed while its inputs did not.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Flaky {
    #[serde(flatten)]
    pub change: VerdictChange,
    /// What the change would have been listed as: `regression` or `fix`.
    pub was: &'static str,
    /// How many runs of the manifest up to NEW the counts cover (`--flaky-window`, or fewer
    /// when there are fewer); `None` when NEW is not in the receipts folder's history.
    pub window: Option<usize>,
    /// Good ↔ bad changes between consecutive runs of that window in which the cell existed.
    pub flips: Option<usize>,
    /// Runs of the window in which the cell was not as expected.
    pub bad: Option<usize>,
}

/// What classification reads of a receipt.
#[derive(Debug, Deserialize)]
struct Identity {
    #[serde(default)]
    inputs: String,
    #[serde(default)]
    code: String,
    #[serde(default)]
    gpus: Vec<GpuRef>,
    #[serde(default)]
    attempts: Vec<crate::history::build::HistAttempt>,
}

impl Identity {
    /// Whether the receipt shows the cell deterministic on its GPU: two or more attempts
    /// wrote artifacts, all the same bits (attempts on a GPU that faulted, kept from the
    /// try before a retry, ran elsewhere and do not count).
    fn reps_agree(&self) -> bool {
        let sets = crate::history::build::artifact_sets(&self.attempts);
        sets.len() >= 2 && sets.windows(2).all(|w| w[0] == w[1])
    }

    fn uuids(&self) -> Vec<String> {
        self.gpus.iter().map(|g| g.uuid.clone()).collect()
    }
}

/// The GPUs of each side when cell `id`'s bits moved between two GPUs of the same model on
/// identical inputs while each side's reps agreed: the result depends on the card.
fn gpu_dependent(old: &DiffRun, new: &DiffRun, id: &str) -> Option<(Vec<String>, Vec<String>)> {
    let (o, n) = (old.nodes.get(id)?, new.nodes.get(id)?);
    let (a, b) = (identity(old, o)?, identity(new, n)?);
    let (ua, ub) = (a.uuids(), b.uuids());
    (!ua.is_empty() && ua != ub && a.reps_agree() && b.reps_agree()).then_some((ua, ub))
}

fn identity<R>(run: &DiffRun, node: &LoadedNode<R>) -> Option<Identity> {
    let slug = node.entry.slug.as_ref()?;
    let tree = Tree {
        dir: run.dir.clone(),
    };
    let dir = match &node.entry.carried {
        Some(c) => tree.carried_node_dir(c, slug)?,
        None => tree.node_dir(slug),
    };
    let id: Identity = crate::receipt::read_json(&dir.join("receipt.json"))
        .ok()
        .flatten()?;
    (!id.inputs.is_empty()).then_some(id)
}

/// The run-level facts the inputs digest does not cover: GPU models and driver.
fn machine(run: &DiffRun) -> (Vec<String>, Option<String>) {
    let inv = &run.run.inventory;
    let gpus = run.run.gpu_names();
    let driver = inv
        .get("driver_version")
        .and_then(Value::as_str)
        .map(str::to_string);
    (gpus, driver)
}

/// Whether cell `id` ran on identical inputs on both sides, with both receipts naming the
/// code they tested.
fn same_inputs(old: &DiffRun, new: &DiffRun, id: &str) -> bool {
    let (Some(o), Some(n)) = (old.nodes.get(id), new.nodes.get(id)) else {
        return false;
    };
    match (identity(old, o), identity(new, n)) {
        (Some(a), Some(b)) => {
            let models = |g: &[GpuRef]| g.iter().map(|x| x.name.clone()).collect::<Vec<_>>();
            crate::history::build::code_known(&a.code)
                && crate::history::build::code_known(&b.code)
                && a.inputs == b.inputs
                && models(&a.gpus) == models(&b.gpus)
        }
        _ => false,
    }
}

/// Moves the flaky verdict changes out of regressions and fixes, and the nondeterministic
/// cells out of bits moved; counts each flaky cell's flips over the last `window` runs of
/// NEW's manifest up to NEW; marks the regressions, fixes and bits moved that stay, when the
/// window holds evidence that their cell is flaky.
pub fn classify(d: &mut Diff, old: &DiffRun, new: &DiffRun, window: usize) {
    let same_machine = machine(old) == machine(new);
    let mut flaky = Vec::new();
    for (was, list) in [("regression", &mut d.regressions), ("fix", &mut d.fixes)] {
        let (moved, kept): (Vec<VerdictChange>, Vec<VerdictChange>) = std::mem::take(list)
            .into_iter()
            // Another GPU model or driver is a changed input the digest does not see.
            .partition(|c| same_machine && same_inputs(old, new, &c.id));
        *list = kept;
        flaky.extend(moved.into_iter().map(|change| Flaky {
            change,
            was,
            window: None,
            flips: None,
            bad: None,
        }));
    }
    let (nondet, kept): (Vec<BitsMoved>, Vec<BitsMoved>) = std::mem::take(&mut d.bits_moved)
        .into_iter()
        .partition(|b| same_machine && same_inputs(old, new, &b.id));
    d.bits_moved = kept;
    for b in nondet {
        match gpu_dependent(old, new, &b.id) {
            Some((old_gpus, new_gpus)) => d.gpu_dependent.push(super::GpuDependent {
                moved: b,
                old_gpus,
                new_gpus,
            }),
            None => d.nondeterministic.push(b),
        }
    }
    let marks = !(d.regressions.is_empty() && d.fixes.is_empty() && d.bits_moved.is_empty());
    if flaky.is_empty() && !marks {
        return;
    }
    let Some(shown) = window_records(new, window) else {
        flaky.sort_by(|a, b| a.change.id.cmp(&b.change.id));
        d.flaky.extend(flaky);
        return;
    };
    for f in &mut flaky {
        count_flips(f, &shown);
    }
    for c in d.regressions.iter_mut().chain(d.fixes.iter_mut()) {
        c.known_flaky = flaky_evidence(&shown, &c.id);
    }
    for b in &mut d.bits_moved {
        b.known_nondeterministic = moved_evidence(&shown, &b.id);
    }
    flaky.sort_by(|a, b| a.change.id.cmp(&b.change.id));
    d.flaky.extend(flaky);
}

/// The last `window` runs of NEW's manifest up to NEW, oldest first; `None` when NEW is not
/// in its receipts folder's history.
fn window_records(new: &DiffRun, window: usize) -> Option<Vec<RunRecord>> {
    let receipts = Tree {
        dir: new.dir.clone(),
    }
    .receipts();
    let index =
        crate::history::index::open(&receipts, &new.run.name, crate::history::index::Mode::Use)
            .ok()?;
    let rel = rel_dir(&receipts, &new.dir)?;
    let end = index.runs().iter().position(|r| r.dir == rel)?;
    let start = (end + 1).saturating_sub(window);
    index.records(start..end + 1, None).ok()
}

/// Fills in the flips and bad runs of a flaky cell.
fn count_flips(f: &mut Flaky, shown: &[RunRecord]) {
    let good: Vec<bool> = shown
        .iter()
        .filter_map(|r| r.cells.get(&f.change.id).map(|c| c.good))
        .collect();
    f.window = Some(shown.len());
    f.flips = Some(good.windows(2).filter(|w| w[0] != w[1]).count());
    f.bad = Some(good.iter().filter(|g| !**g).count());
}

/// Where the window shows cell `id` flipping on identical inputs: the newest run whose
/// attempts disagreed, or the newest pair of runs with equal digests (naming the code) and
/// different verdicts.
fn flaky_evidence(shown: &[RunRecord], id: &str) -> Option<String> {
    evidence(shown, id, |f| f.flipped_within, |a, b| a.good != b.good).map(|(at, within)| {
        if within {
            format!("known flaky: its attempts disagreed at {at}")
        } else {
            format!("known flaky: flipped on identical inputs at {at}")
        }
    })
}

/// As [`flaky_evidence`], for artifacts that differed on identical inputs.
fn moved_evidence(shown: &[RunRecord], id: &str) -> Option<String> {
    evidence(
        shown,
        id,
        |f| f.moved_within,
        |a, b| a.verdict == b.verdict && a.artifacts != b.artifacts,
    )
    .map(|(at, within)| {
        if within {
            format!("known nondeterministic: its reps or retries wrote other bits at {at}")
        } else {
            format!("known nondeterministic: its bits moved on identical inputs at {at}")
        }
    })
}

/// The newest evidence in the window: a run where `within` holds, or an earlier run with
/// the same digest (both naming their code) for which `differs` holds. Returns where (`<commit>
/// (run <id>)`) and whether it was within one run.
fn evidence(
    shown: &[RunRecord],
    id: &str,
    within: impl Fn(&crate::history::CellFacts) -> bool,
    differs: impl Fn(&crate::history::CellFacts, &crate::history::CellFacts) -> bool,
) -> Option<(String, bool)> {
    let at = |r: &RunRecord| format!("{} (run {})", short_commit(&r.run.commit), r.run.id);
    for (i, r) in shown.iter().enumerate().rev() {
        let Some(f) = r
            .cells
            .get(id)
            .filter(|f| f.code_known && !f.inputs.is_empty())
        else {
            continue;
        };
        if within(f) {
            return Some((at(r), true));
        }
        let twin = shown[..i].iter().rev().find(|e| {
            e.cells.get(id).is_some_and(|g| {
                g.code_known
                    && g.inputs == f.inputs
                    && g.gpus == f.gpus
                    && e.run.gpus == r.run.gpus
                    && e.run.driver == r.run.driver
                    && differs(g, f)
            })
        });
        if twin.is_some() {
            return Some((at(r), false));
        }
    }
    None
}

fn rel_dir(receipts: &Path, dir: &Path) -> Option<String> {
    let rel = dir.strip_prefix(receipts).ok()?;
    Some(
        rel.components()
            .map(|c| c.as_os_str().to_string_lossy().into_owned())
            .collect::<Vec<_>>()
            .join("/"),
    )
}

/// How often a flaky cell flipped, for the text and markdown rows.
pub fn flips_note(f: &Flaky) -> String {
    match (f.window, f.flips, f.bad) {
        (Some(n), Some(flips), Some(bad)) => format!(
            "flipped {flips} time{} in the last {n} run{} (not as expected in {bad})",
            if flips == 1 { "" } else { "s" },
            if n == 1 { "" } else { "s" }
        ),
        _ => "flips unknown (NEW is not in its receipts folder's history)".to_string(),
    }
}

/// The text sections `FLAKY (n)` and `NONDETERMINISTIC (n)`; `title` paints a heading.
pub fn text(out: &mut String, d: &Diff, width: usize, title: &dyn Fn(&str, usize) -> String) {
    if !d.flaky.is_empty() {
        let _ = writeln!(out, "\n{}", title("FLAKY", d.flaky.len()));
        for f in &d.flaky {
            let c = &f.change;
            let _ = writeln!(
                out,
                "  {:<width$}  {} → {}  inputs unchanged; {}",
                c.id,
                c.old,
                c.new,
                flips_note(f)
            );
        }
    }
    if !d.gpu_dependent.is_empty() {
        let _ = writeln!(
            out,
            "\n{}",
            title("GPU-DEPENDENT RESULTS", d.gpu_dependent.len())
        );
        for g in &d.gpu_dependent {
            let _ = writeln!(
                out,
                "  {:<width$}  {}  inputs unchanged, reps agree on each GPU, artifacts differ between {} and {}",
                g.moved.id,
                g.moved.verdict,
                g.old_gpus.join("+"),
                g.new_gpus.join("+")
            );
            for a in &g.moved.artifacts {
                let _ = writeln!(
                    out,
                    "      {}: {} → {}",
                    a.name,
                    short(&a.old_sha256),
                    short(&a.new_sha256)
                );
            }
        }
    }
    if !d.nondeterministic.is_empty() {
        let _ = writeln!(
            out,
            "\n{}",
            title("NONDETERMINISTIC", d.nondeterministic.len())
        );
        for b in &d.nondeterministic {
            let _ = writeln!(
                out,
                "  {:<width$}  {}  inputs unchanged, artifacts differ",
                b.id, b.verdict
            );
            for a in &b.artifacts {
                let _ = writeln!(
                    out,
                    "      {}: {} → {}",
                    a.name,
                    short(&a.old_sha256),
                    short(&a.new_sha256)
                );
                out.push_str(&super::quantify::text(a, "        "));
            }
        }
    }
}

fn short(s: &Option<String>) -> String {
    s.as_ref()
        .map_or("(none)".to_string(), |s| s.chars().take(12).collect())
}

/// The markdown sections `### Flaky (n)` and `### Nondeterministic (n)`.
pub fn markdown(out: &mut String, d: &Diff, md: &dyn Fn(&str) -> String) {
    if !d.flaky.is_empty() {
        let _ = writeln!(out, "### Flaky ({})\n", d.flaky.len());
        let _ = writeln!(out, "| node | old | new | flips |\n|---|---|---|---|");
        for f in &d.flaky {
            let _ = writeln!(
                out,
                "| `{}` | {} | {} | {} |",
                md(&f.change.id),
                f.change.old,
                f.change.new,
                flips_note(f)
            );
        }
        out.push('\n');
    }
    if !d.gpu_dependent.is_empty() {
        let _ = writeln!(
            out,
            "### GPU-dependent results ({})\n\nInputs unchanged and each side's reps agree, but the bits differ between two GPUs of the same model: a marginal card shows this way before it fails.\n",
            d.gpu_dependent.len()
        );
        for g in &d.gpu_dependent {
            let _ = writeln!(
                out,
                "- `{}` ({}): `{}` → `{}`",
                md(&g.moved.id),
                g.moved.verdict,
                md(&g.old_gpus.join("+")),
                md(&g.new_gpus.join("+"))
            );
        }
        out.push('\n');
    }
    if !d.nondeterministic.is_empty() {
        let _ = writeln!(out, "### Nondeterministic ({})\n", d.nondeterministic.len());
        let _ = writeln!(
            out,
            "| node | verdict | artifact | old sha256 | new sha256 |\n|---|---|---|---|---|"
        );
        for b in &d.nondeterministic {
            for a in &b.artifacts {
                let _ = writeln!(
                    out,
                    "| `{}` | {} | `{}` | `{}` | `{}` |",
                    md(&b.id),
                    b.verdict,
                    md(&a.name),
                    short(&a.old_sha256),
                    short(&a.new_sha256)
                );
            }
        }
        out.push('\n');
        out.push_str(&super::quantify::markdown(&d.nondeterministic, md));
    }
}
