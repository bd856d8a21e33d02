//! The morning message: one run of a manifest against a baseline, in at most
//! [`MAX_LINES`] lines that fit a chat message (`memra-orch summary`, and what `[notify]`
//! sends). It is built from a [`Diff`] and the new run's receipts and never decides anything
//! `diff` does not: regressions (lost coverage included unless allowed), device faults,
//! flaky cells and moved bits are the diff's lists; the headline is red whenever the run
//! itself is not all as expected, a regression is listed, or a newer run never finished.
//!
//! Order of the lines: the headline (verdict and what made it), the counts and the baseline,
//! the regressions each with its first failing check, then one line each for what is still
//! failing, device faults, bits moved, flaky cells, fixes, unfinished runs and where to
//! read more. When the regressions do not fit, the last of their lines says "and N more".
//! Every line comes from manifests and gates, so it is flattened to one line and its control
//! characters escaped; markdown also escapes its own syntax.

use std::collections::BTreeMap;
use std::fmt::Write;

use std::path::Path;

use serde::Serialize;

use crate::diff::{BitsMoved, CompareOptions, Diff, DiffRun, Thresholds, VerdictChange};
use crate::receipt::commit::short_commit;
use crate::receipt::resolve::{self, FoundRun};
use crate::report::summary::{counts_line, one_line};
use crate::words::verdict::Verdict;

/// The most lines a summary has, whatever the night.
pub const MAX_LINES: usize = 15;

/// The longest a line's free text (a reason, a check message) is shown.
const TEXT_WIDTH: usize = 120;

/// How many ids a one-line list (bits moved, flaky, fixes) names before "and N more".
const IDS_SHOWN: usize = 3;

/// What the summary compared the run with.
#[derive(Debug, Clone, Serialize)]
pub struct Baseline {
    /// `previous`, `last-green` or `named` (a run the caller named).
    pub since: String,
    /// The run id (`-` for a tree of the layout before run ids).
    pub run: String,
    pub commit: String,
    pub start: String,
    pub dir: String,
}

/// One cell of a verdict list, with the first check it failed.
#[derive(Debug, Clone, Serialize)]
pub struct Item {
    pub id: String,
    pub old: Option<Verdict>,
    pub new: Option<Verdict>,
    pub reason: Option<String>,
    /// The first check row at `fail` in the new receipt, as `check: message`.
    pub first_failing_check: Option<String>,
    /// Where the cell has flipped on identical inputs before (it is still a regression).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub known_flaky: Option<String>,
}

/// A cell whose artifacts moved, with the figures of its most moved tensor.
#[derive(Debug, Clone, Serialize)]
pub struct Moved {
    pub id: String,
    /// `changed` (across different inputs), `nondeterministic` (on identical inputs) or
    /// `gpu-dependent` (on identical inputs, between two GPUs of one model).
    pub kind: &'static str,
    pub artifacts: Vec<String>,
    /// Elements whose bits differ, over all tensors read.
    pub values_differ: u64,
    /// Largest |new − old| over all tensors read (`None`: nothing was read).
    pub max_abs: Option<f64>,
    pub max_ulp: Option<u64>,
}

/// Everything the summary says, as `--format json` prints it.
#[derive(Debug, Clone, Serialize)]
pub struct Brief {
    pub manifest: String,
    pub run: String,
    pub dir: String,
    pub commit: String,
    /// The commit's subject line, when the run recorded one.
    pub subject: Option<String>,
    pub host: String,
    pub start: String,
    pub seconds: Option<f64>,
    /// `pass` (green, nothing regressed) or `fail`.
    pub verdict: &'static str,
    /// The run alone ended with every cell as expected.
    pub run_green: bool,
    /// Why the run failed as a whole (interrupted, an unmet requirement, a full disk).
    pub run_problem: Option<String>,
    pub counts: BTreeMap<Verdict, usize>,
    /// `None`: nothing to compare with (the first run, or no green run before it).
    pub baseline: Option<Baseline>,
    /// Why there is no baseline.
    pub baseline_note: Option<String>,
    pub regressions: Vec<Item>,
    pub still_failing: Vec<Item>,
    pub device_faults: Vec<Item>,
    pub bits_moved: Vec<Moved>,
    /// Cells whose verdict flipped on identical inputs (`diff`'s flaky).
    pub flaky: Vec<String>,
    /// Cells of the run with check rows at `warn`, each with its first warning.
    pub warned: Vec<String>,
    pub fixes: Vec<String>,
    /// Newer runs of the manifest that never finished.
    pub unfinished: Vec<String>,
    /// Where to read more: the report's run page, or the command that shows the run.
    pub more: String,
    /// The summary's lines as `text` prints them.
    pub lines: Vec<String>,
}

impl Brief {
    /// Whether the night is news against its baseline: anything but identical verdicts,
    /// bits and flakiness (what `[notify] on = ["change"]` fires on).
    pub fn changed(&self) -> bool {
        !self.regressions.is_empty()
            || !self.device_faults.is_empty()
            || !self.bits_moved.is_empty()
            || !self.flaky.is_empty()
            || !self.fixes.is_empty()
            || !self.unfinished.is_empty()
            || self.baseline.is_none()
    }

    pub fn green(&self) -> bool {
        self.verdict == "pass"
    }
}

/// The run the summary is of, read from its tree.
pub struct Subject<'a> {
    pub manifest: &'a str,
    pub run_id: &'a str,
    pub new: &'a DiffRun,
    /// Newer runs of the manifest that never finished.
    pub unfinished: Vec<String>,
    /// The report site's address (`--report-url`, `[notify] report_url`).
    pub report_url: Option<&'a str>,
}

/// Builds the summary of `s` against `d` (its diff with the baseline), or against nothing
/// when `d` is `None` (`note` says why).
pub fn build(s: &Subject<'_>, d: Option<(&Diff, Baseline)>, note: Option<String>) -> Brief {
    let run = &s.new.run;
    let first_failing = |id: &str| -> Option<String> {
        let r = s.new.nodes.get(id)?.receipt.as_ref()?;
        let c = r
            .checks
            .iter()
            .find(|c| c.status == crate::gate::checks::CheckStatus::Fail)?;
        Some(match &c.message {
            Some(m) => format!("{}: {m}", c.check),
            None => c.check.clone(),
        })
    };
    let item = |c: &VerdictChange| Item {
        id: c.id.clone(),
        old: Some(c.old),
        new: Some(c.new),
        reason: c.reason.clone(),
        first_failing_check: first_failing(&c.id),
        known_flaky: c.known_flaky.clone(),
    };
    let problem = run_problem(run);
    let run_green = run.end.is_some()
        && run.verdict != "running"
        && problem.is_none()
        && run.counts.iter().all(|(v, n)| *n == 0 || v.as_expected());
    let mut b = Brief {
        manifest: s.manifest.to_string(),
        run: s.run_id.to_string(),
        dir: s.new.dir.to_string_lossy().into_owned(),
        commit: run.commit.clone(),
        subject: run.commit_subject.clone(),
        host: run.host.clone(),
        start: run.start.clone(),
        seconds: run.seconds,
        verdict: "fail",
        run_green,
        run_problem: problem,
        counts: run.counts.clone(),
        baseline: None,
        baseline_note: note,
        regressions: Vec::new(),
        still_failing: Vec::new(),
        device_faults: Vec::new(),
        bits_moved: Vec::new(),
        flaky: Vec::new(),
        fixes: Vec::new(),
        warned: run
            .nodes
            .iter()
            .filter(|e| e.warns > 0)
            .map(|e| match &e.warning {
                Some(w) => format!("{} ({w})", e.id),
                None => e.id.clone(),
            })
            .collect(),
        unfinished: s.unfinished.clone(),
        more: match s.report_url {
            Some(url) => format!(
                "{}/{}/{}",
                url.trim_end_matches('/'),
                crate::report::html::pages::RUNS,
                crate::report::html::pages::run_page_name(s.run_id, &run.commit)
            ),
            None => format!("memra-orch show {}", s.new.dir.display()),
        },
        lines: Vec::new(),
    };
    match d {
        Some((d, base)) => {
            b.regressions = d.regressions.iter().map(item).collect();
            if !d.allow_lost {
                b.regressions.extend(d.lost_coverage.iter().map(|l| Item {
                    id: l.id.clone(),
                    old: Some(l.old),
                    new: l.new,
                    reason: Some(match &l.reason {
                        Some(why) => format!("lost coverage: {why}"),
                        None => "lost coverage: the cell is gone from this run".to_string(),
                    }),
                    first_failing_check: None,
                    known_flaky: None,
                }));
            }
            b.still_failing = d.still_failing.iter().map(item).collect();
            b.device_faults = d.device_faults.iter().map(item).collect();
            // Bits that moved on identical inputs moved all the same: never hidden as flaky.
            b.bits_moved = d
                .bits_moved
                .iter()
                .map(|m| moved(m, "changed"))
                .chain(
                    d.nondeterministic
                        .iter()
                        .map(|m| moved(m, "nondeterministic")),
                )
                .chain(
                    d.gpu_dependent
                        .iter()
                        .map(|g| moved(&g.moved, "gpu-dependent")),
                )
                .collect();
            b.flaky = d.flaky.iter().map(|f| f.change.id.clone()).collect();
            b.fixes = d.fixes.iter().map(|f| f.id.clone()).collect();
            b.baseline = Some(base);
        }
        None => {
            // Nothing to compare with: what is not as expected is listed from the run, the
            // cells that ran before those they blocked.
            let mut entries: Vec<&crate::receipt::NodeIndexEntry> = run.nodes.iter().collect();
            entries.sort_by_key(|e| matches!(e.verdict, Verdict::Blocked | Verdict::Cancelled));
            b.still_failing = entries
                .iter()
                .filter(|e| !e.verdict.as_expected() && e.verdict != Verdict::DeviceFault)
                .map(|e| Item {
                    id: e.id.clone(),
                    old: None,
                    new: Some(e.verdict),
                    reason: e.reason.clone(),
                    first_failing_check: first_failing(&e.id),
                    known_flaky: None,
                })
                .collect();
            b.device_faults = run
                .nodes
                .iter()
                .filter(|e| e.verdict == Verdict::DeviceFault)
                .map(|e| Item {
                    id: e.id.clone(),
                    old: None,
                    new: Some(e.verdict),
                    reason: e.reason.clone(),
                    first_failing_check: None,
                    known_flaky: None,
                })
                .collect();
        }
    }
    let red = !b.run_green || !b.regressions.is_empty() || !b.unfinished.is_empty();
    b.verdict = if red { "fail" } else { "pass" };
    b.lines = lines(&b, Style::Text);
    b
}

/// Why a run failed as a whole, beyond its cells' verdicts.
fn run_problem(run: &crate::receipt::RunReceipt) -> Option<String> {
    if run.end.is_none() {
        Some("the run never finished".to_string())
    } else if run.interrupted {
        Some("the run was interrupted".to_string())
    } else if let Some(at) = &run.disk_full {
        Some(format!("the disk was full at {at}"))
    } else {
        run.unmet
            .as_ref()
            .map(|u| format!("unmet requirement: {u}"))
    }
}

fn moved(m: &BitsMoved, kind: &'static str) -> Moved {
    let mut out = Moved {
        id: m.id.clone(),
        kind,
        artifacts: m.artifacts.iter().map(|a| a.name.clone()).collect(),
        values_differ: 0,
        max_abs: None,
        max_ulp: None,
    };
    if let Some((d, a, u)) = crate::diff::quantify::sum_totals(
        m.artifacts.iter().filter_map(|a| a.read.as_ref()?.totals()),
    ) {
        out.values_differ = d;
        out.max_abs = Some(a);
        out.max_ulp = u;
    }
    out
}

/// What the summary compares the run with (`--since`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Since {
    /// The newest finished run of the manifest before it.
    Previous,
    /// The newest green run of the manifest before it.
    LastGreen,
    /// A run named as `diff` names runs.
    Named(String),
}

impl Since {
    pub fn parse(s: &str) -> Since {
        match s {
            "previous" => Since::Previous,
            "last-green" => Since::LastGreen,
            other => Since::Named(other.to_string()),
        }
    }
}

/// The summary of the run in `subject` against the baseline `since` picks among the runs of
/// its manifest under `receipts`.
// Over 150 lines: the summary's inputs in order: the subject run, the baseline `since` picks,
// the history between them, then the brief.
pub fn for_run(
    receipts: &Path,
    subject: &Path,
    since: &Since,
    report_url: Option<&str>,
    allow_lost: bool,
) -> Result<Brief, String> {
    let same = |a: &Path, b: &Path| match (std::fs::canonicalize(a), std::fs::canonicalize(b)) {
        (Ok(x), Ok(y)) => x == y,
        _ => a == b,
    };
    let run = crate::receipt::read_json::<crate::receipt::RunReceipt>(&subject.join("run.json"))
        .map_err(|e| e.to_string())?
        .ok_or_else(|| format!("{} holds no run.json", subject.display()))?;
    // The runs of the manifest, newest first; the subject among them.
    let (all, unreadable) =
        resolve::list_runs_and_unreadable(receipts).map_err(|e| e.to_string())?;
    let runs: Vec<FoundRun> = all
        .into_iter()
        .filter(|r| r.run.name == run.name && !resolve::unknown_age(&r.run.start))
        .collect();
    let at = runs.iter().position(|r| same(&r.dir, subject));
    let older: Vec<&FoundRun> = match at {
        Some(i) => runs[i + 1..].iter().collect(),
        None => Vec::new(),
    };
    let (base, note): (Option<(&FoundRun, &str)>, Option<String>) = match since {
        Since::Previous => match older.iter().find(|r| r.complete()) {
            Some(r) => (Some((r, "previous")), None),
            None => (
                None,
                Some("the first finished run: nothing to compare with".into()),
            ),
        },
        Since::LastGreen => match older.iter().find(|r| resolve::green(r)) {
            Some(r) => (Some((r, "last-green")), None),
            None => (
                None,
                Some("no green run before it: nothing to compare with".into()),
            ),
        },
        Since::Named(spec) => {
            let dir = resolve::resolve_with(
                spec,
                receipts,
                Some(&run.name),
                &crate::history::heads::heads,
            )
            .map_err(|e| e.to_string())?;
            if same(&dir, subject) {
                return Err(format!(
                    "--since {spec} names the run summarised ({}); name an earlier run, or \
                     `previous` or `last-green`",
                    subject.display()
                ));
            }
            match runs.iter().find(|r| same(&r.dir, &dir)) {
                Some(r) => (Some((r, "named")), None),
                None => {
                    return Err(format!(
                        "--since {spec} ({}) is not a run of manifest {:?} under {}",
                        dir.display(),
                        run.name,
                        receipts.display()
                    ));
                }
            }
        }
    };
    // A killed run is no baseline and has nothing to compare: what it wrote is listed.
    let (base, note) = if run.end.is_none() {
        (
            None,
            Some("the run never finished: what it wrote is listed, nothing compared".to_string()),
        )
    } else {
        (base, note)
    };
    // Runs that never finished, or whose run.json cannot be read, since the baseline (and,
    // for a run that is not the newest, before it): killed nights, damaged trees, or one
    // still going.
    let newest = runs
        .iter()
        .find(|r| r.complete())
        .is_some_and(|r| same(&r.dir, subject));
    let floor = base.and_then(|(b, _)| resolve::start_time(&b.run.start));
    let ceiling = resolve::start_time(&run.start).filter(|_| !newest);
    let window = |start: Option<std::time::SystemTime>| {
        floor.is_none_or(|f| start.is_some_and(|s| s > f))
            && ceiling.is_none_or(|c| start.is_none_or(|s| s < c))
    };
    let mut unfinished: Vec<String> = runs
        .iter()
        .filter(|r| !r.complete() && !same(&r.dir, subject))
        .filter(|r| window(resolve::start_time(&r.run.start)))
        .map(|r| r.id_label().to_string())
        .collect();
    unfinished.extend(
        unreadable
            .iter()
            // The manifest folder is named after the manifest.
            .filter(|dir| {
                dir.parent()
                    .and_then(Path::file_name)
                    .is_some_and(|m| m.to_string_lossy() == run.name)
            })
            .map(|dir| dir.file_name().unwrap_or_default().to_string_lossy())
            .filter(|id| window(resolve::run_id_start(id)))
            .map(|id| format!("{id} (its run.json cannot be read)")),
    );
    let options = CompareOptions {
        thresholds: Thresholds::default(),
        allow_lost,
        flaky_fails: false,
        flaky_window: 10,
        read: true,
    };
    let run_id = subject
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .filter(|n| at.is_some_and(|i| runs[i].id.as_deref() == Some(n.as_str())))
        .unwrap_or_else(|| "-".to_string());
    let manifest = run.name.clone();
    let (compared, new) = match base {
        Some((b, kind)) => {
            let (d, new) =
                crate::diff::compare_runs(&b.dir, subject, &options).map_err(|e| e.to_string())?;
            let baseline = Baseline {
                since: kind.to_string(),
                run: b.id_label().to_string(),
                commit: b.run.commit.clone(),
                start: b.run.start.clone(),
                dir: b.dir.to_string_lossy().into_owned(),
            };
            (Some((d, baseline)), new)
        }
        None => {
            let mut new = crate::diff::load_for_diff(subject).map_err(|e| e.to_string())?;
            if new.run.end.is_none() {
                // Its run.json's index was never written: the receipts its cells wrote.
                new.run.nodes = crate::receipt::load::written_entries(subject);
                new.run.counts.clear();
                for e in &new.run.nodes {
                    *new.run.counts.entry(e.verdict).or_default() += 1;
                }
            }
            (None, new)
        }
    };
    let s = Subject {
        manifest: &manifest,
        run_id: &run_id,
        new: &new,
        unfinished,
        report_url,
    };
    Ok(build(
        &s,
        compared.as_ref().map(|(d, b)| (d, b.clone())),
        note,
    ))
}

/// How the lines are dressed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Style {
    Text,
    Markdown,
}

/// The summary's lines, at most [`MAX_LINES`].
// Over 150 lines: a renderer: the summary's sections one after another in the order the morning
// reader sees them, each a few lines.
pub fn lines(b: &Brief, style: Style) -> Vec<String> {
    let md = style == Style::Markdown;
    let id = |s: &str| -> String {
        let flat = one_line(s, TEXT_WIDTH);
        if !md {
            flat
        } else if flat.contains('`') {
            // A code span holding backticks is fenced by two, spaced.
            format!("`` {flat} ``")
        } else {
            format!("`{flat}`")
        }
    };
    let text = |s: &str| -> String {
        let flat = one_line(s, TEXT_WIDTH);
        if md { md_escape(&flat) } else { flat }
    };
    let ids = |list: &[String]| -> String {
        let mut s: Vec<String> = list.iter().take(IDS_SHOWN).map(|i| id(i)).collect();
        if list.len() > IDS_SHOWN {
            s.push(format!("and {} more", list.len() - IDS_SHOWN));
        }
        s.join(", ")
    };
    let bold = |s: &str| {
        if md {
            format!("**{s}**")
        } else {
            s.to_string()
        }
    };

    let mut head = String::new();
    let verdict = if b.green() { "PASS" } else { "FAIL" };
    let _ = write!(
        head,
        "{} {} run {} at {} ({})",
        bold(verdict),
        id(&b.manifest),
        id(&b.run),
        id(&short_commit(&b.commit)),
        text(&b.host)
    );
    let mut what: Vec<String> = Vec::new();
    if let Some(p) = &b.run_problem {
        what.push(text(p));
    }
    if !b.regressions.is_empty() {
        what.push(plural(b.regressions.len(), "regression"));
    }
    if !b.still_failing.is_empty() {
        what.push(format!("{} still failing", b.still_failing.len()));
    }
    if !b.device_faults.is_empty() {
        what.push(plural(b.device_faults.len(), "device fault"));
    }
    if !b.unfinished.is_empty() {
        what.push(plural(b.unfinished.len(), "unfinished run"));
    }
    // A green night never hides moved bits: they are in the headline. Cells whose verdict
    // changed are listed as such, not among moved bits, so "no bits moved" is said only when
    // no verdict changed either.
    if b.bits_moved.is_empty() {
        if b.baseline.is_some() {
            what.push(if b.regressions.is_empty() && b.fixes.is_empty() {
                "no bits moved".to_string()
            } else {
                "no bits moved in the cells that kept their verdict".to_string()
            });
        }
    } else {
        let odd = b.bits_moved.iter().filter(|m| m.kind != "changed").count();
        what.push(format!(
            "bits moved in {}{}",
            plural(b.bits_moved.len(), "cell"),
            if odd > 0 {
                format!(" ({odd} on identical inputs)")
            } else {
                String::new()
            }
        ));
    }
    if !b.flaky.is_empty() {
        what.push(format!("{} flaky", b.flaky.len()));
    }
    if !b.warned.is_empty() {
        what.push(format!("{} with warn rows", plural(b.warned.len(), "cell")));
    }
    if b.green() && b.run_problem.is_none() && b.regressions.is_empty() {
        what.insert(0, "all as expected".to_string());
    }
    let _ = write!(head, ": {}", what.join(", "));

    let total: usize = b.counts.values().sum();
    let mut second = String::new();
    if let Some(s) = &b.subject {
        let _ = write!(second, "{} · ", text(&one_line(s, 60)));
    }
    let _ = write!(second, "{total} cells: {}", counts_line(&b.counts));
    if let Some(s) = b.seconds {
        let _ = write!(second, "; {}", duration(s));
    }
    match (&b.baseline, &b.baseline_note) {
        (Some(base), _) => {
            let _ = write!(
                second,
                "; against {} {} at {}",
                base.since,
                id(&base.run),
                id(&short_commit(&base.commit))
            );
        }
        (None, Some(note)) => {
            let _ = write!(second, "; {}", text(note));
        }
        (None, None) => {}
    }

    let item_line = |label: &str, i: &Item| -> String {
        let mut l = format!("{} {}", bold(label), id(&i.id));
        match (i.old, i.new) {
            (Some(o), Some(n)) => {
                let _ = write!(l, " {o} -> {n}");
            }
            (Some(o), None) => {
                let _ = write!(l, " {o} -> absent");
            }
            (None, Some(n)) => {
                let _ = write!(l, " {n}");
            }
            (None, None) => {}
        }
        match (&i.first_failing_check, &i.reason) {
            (Some(c), _) => {
                let _ = write!(l, ": {}", text(c));
            }
            (None, Some(r)) => {
                let _ = write!(l, ": {}", text(r));
            }
            (None, None) => {}
        }
        if i.known_flaky.is_some() {
            l.push_str(" (flipped before on identical inputs)");
        }
        l
    };

    let mut tail: Vec<String> = Vec::new();
    if !b.still_failing.is_empty() {
        // The first one in full when nothing regressed (a red night must say why).
        if b.regressions.is_empty() {
            let first = item_line("FAILING", &b.still_failing[0]);
            if b.still_failing.len() == 1 {
                tail.push(first);
            } else {
                tail.push(format!(
                    "{first} (and {} more still failing)",
                    b.still_failing.len() - 1
                ));
            }
        } else {
            let list: Vec<String> = b.still_failing.iter().map(|i| i.id.clone()).collect();
            tail.push(format!("still failing: {}", ids(&list)));
        }
    }
    if !b.device_faults.is_empty() {
        let list: Vec<String> = b.device_faults.iter().map(|i| i.id.clone()).collect();
        tail.push(format!("{}: {}", bold("device faults"), ids(&list)));
    }
    if !b.bits_moved.is_empty() {
        let list: Vec<String> = b
            .bits_moved
            .iter()
            .map(|m| {
                let mut s = m.id.clone();
                if m.kind != "changed" {
                    let _ = write!(s, " [{}]", m.kind);
                }
                if let Some(a) = m.max_abs {
                    let _ = write!(
                        s,
                        " ({}, max |d| {a:.2e}{})",
                        plural(
                            usize::try_from(m.values_differ).unwrap_or(usize::MAX),
                            "value"
                        ),
                        m.max_ulp.map(|u| format!(", {u} ulp")).unwrap_or_default()
                    );
                } else {
                    // Not read (not safetensors): which files moved.
                    let _ = write!(s, " ({})", m.artifacts.join(", "));
                }
                s
            })
            .collect();
        tail.push(format!("{}: {}", bold("bits moved"), ids(&list)));
    }
    if !b.flaky.is_empty() {
        tail.push(format!(
            "flaky (same inputs, other verdict): {}",
            ids(&b.flaky)
        ));
    }
    if !b.fixes.is_empty() {
        tail.push(format!("fixed: {}", ids(&b.fixes)));
    }
    if !b.warned.is_empty() {
        tail.push(format!("warn: {}", ids(&b.warned)));
    }
    if !b.unfinished.is_empty() {
        tail.push(format!(
            "{}: {}",
            bold("never finished"),
            ids(&b.unfinished)
        ));
    }
    // Whole, so the command or address can be pasted.
    let more = one_line(&b.more, usize::MAX);
    tail.push(format!(
        "more: {}",
        if md { md_escape(&more) } else { more }
    ));

    let mut out = vec![head, second];
    let room = MAX_LINES - out.len() - tail.len();
    if b.regressions.len() <= room {
        out.extend(b.regressions.iter().map(|i| item_line("REGRESSED", i)));
    } else {
        let shown = room - 1;
        out.extend(
            b.regressions
                .iter()
                .take(shown)
                .map(|i| item_line("REGRESSED", i)),
        );
        out.push(format!(
            "and {} more regressions (`memra-orch diff` lists them all)",
            b.regressions.len() - shown
        ));
    }
    out.extend(tail);
    if md {
        // Markdown joins lines of one paragraph: each is a list item.
        out = out
            .into_iter()
            .enumerate()
            .map(|(i, l)| if i == 0 { l } else { format!("- {l}") })
            .collect();
    }
    debug_assert!(out.len() <= MAX_LINES);
    out
}

fn plural(n: usize, what: &str) -> String {
    if n == 1 {
        format!("1 {what}")
    } else {
        format!("{n} {what}s")
    }
}

fn duration(s: f64) -> String {
    let s = s.max(0.0).round() as u64;
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m{:02}s", s / 60, s % 60),
        _ => format!("{}h{:02}m", s / 3600, (s % 3600) / 60),
    }
}

/// Markdown's own characters as literals.
fn md_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if matches!(
            c,
            '\\' | '`' | '*' | '_' | '[' | ']' | '<' | '>' | '|' | '#' | '~'
        ) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// The summary as `format` prints it (a trailing newline included).
pub fn render(b: &Brief, format: SummaryFormat) -> String {
    match format {
        SummaryFormat::Text => b.lines.join("\n") + "\n",
        SummaryFormat::Markdown => lines(b, Style::Markdown).join("\n") + "\n",
        SummaryFormat::Json => {
            serde_json::to_string_pretty(b).unwrap_or_else(|e| e.to_string()) + "\n"
        }
    }
}

/// `--format` of `summary`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SummaryFormat {
    Text,
    Markdown,
    Json,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn item(id: &str) -> Item {
        Item {
            id: id.to_string(),
            old: Some(Verdict::Pass),
            new: Some(Verdict::Fail),
            reason: Some("exit code 1".into()),
            first_failing_check: Some("gate2: row 1 differs\nsecond line \u{1b}[31m".into()),
            known_flaky: None,
        }
    }

    fn brief(regressions: usize) -> Brief {
        let ids = |p: &str, n: usize| (0..n).map(|i| format!("{p}{i}")).collect::<Vec<_>>();
        Brief {
            manifest: "m".into(),
            run: "r".into(),
            dir: "/d".into(),
            commit: "c".into(),
            subject: None,
            host: "h".into(),
            start: "s".into(),
            seconds: Some(4000.0),
            verdict: "fail",
            run_green: false,
            run_problem: Some("the run was interrupted".into()),
            counts: BTreeMap::from([(Verdict::Pass, 3), (Verdict::Fail, regressions)]),
            baseline: None,
            baseline_note: None,
            regressions: (0..regressions)
                .map(|i| item(&format!("cell{i}")))
                .collect(),
            still_failing: vec![item("old")],
            device_faults: vec![item("hw")],
            bits_moved: vec![Moved {
                id: "b".into(),
                kind: "changed",
                artifacts: vec!["x".into()],
                values_differ: 0,
                max_abs: None,
                max_ulp: None,
            }],
            flaky: ids("f", 5),
            warned: ids("w", 2),
            fixes: ids("x", 1),
            unfinished: ids("u", 2),
            more: "memra-orch show /d".into(),
            lines: Vec::new(),
        }
    }

    #[test]
    fn every_list_at_once_still_fits_and_the_regressions_say_how_many_are_left_out() {
        for n in [0, 1, 5, 6, 7, 30, 1000] {
            for style in [Style::Text, Style::Markdown] {
                let l = lines(&brief(n), style);
                assert!(l.len() <= MAX_LINES, "{n}: {l:#?}");
                let listed = l.iter().filter(|x| x.contains("REGRESSED")).count();
                let more: usize = l
                    .iter()
                    .find_map(|x| {
                        x.trim_start_matches("- ")
                            .strip_prefix("and ")?
                            .split(' ')
                            .next()?
                            .parse()
                            .ok()
                    })
                    .unwrap_or(0);
                assert_eq!(listed + more, n, "{l:#?}");
                // Every tail line is there whatever the number of regressions.
                for want in [
                    "still failing",
                    "device faults",
                    "bits moved",
                    "flaky",
                    "fixed",
                    "warn:",
                    "never finished",
                    "more:",
                ] {
                    assert!(l.iter().any(|x| x.contains(want)), "{want}: {l:#?}");
                }
                // One line each: no line break or raw control character survives.
                assert!(
                    l.iter().all(|x| !x.contains('\n') && !x.contains('\u{1b}')),
                    "{l:#?}"
                );
            }
        }
    }

    #[test]
    fn markdown_escapes_what_a_gate_wrote() {
        let mut b = brief(1);
        b.regressions[0].first_failing_check = Some("*bold* [link](x) `code` <b>".into());
        b.regressions[0].id = "a`b".into();
        let l = lines(&b, Style::Markdown);
        let r = l.iter().find(|x| x.contains("REGRESSED")).unwrap();
        assert!(r.contains(r"\*bold\* \[link\](x) \`code\` \<b\>"), "{r}");
        assert!(r.contains("`` a`b ``"), "{r}");
    }

    #[test]
    fn the_headline_is_red_for_an_interrupted_run_and_names_why() {
        let l = lines(&brief(0), Style::Text);
        assert!(
            l[0].starts_with("FAIL m run r at c (h): the run was interrupted"),
            "{}",
            l[0]
        );
        assert!(l[1].contains("1h06m"), "{}", l[1]);
    }
}
