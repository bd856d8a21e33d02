//! Printing a [`Diff`]: text for a terminal (coloured when stdout is a terminal, `NO_COLOR`
//! honoured), markdown for a pull-request comment or a mail, and JSON for tools. Sections
//! with nothing in them are left out; a diff with nothing at all says so in one line.
//!
//! It formats only; what counts as a change is decided in `diff`.

use std::fmt::Write;

use serde_json::Value;

use super::{ArtifactMove, Diff, LostCoverage, VerdictChange};
use crate::receipt::commit::short_commit;

/// The output formats of `diff`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum DiffFormat {
    Text,
    Markdown,
    Json,
}

/// When text output is coloured.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ColorMode {
    Auto,
    Always,
    Never,
}

/// Renders a diff in the chosen format; `color` applies to text only.
pub fn render(d: &Diff, format: DiffFormat, color: ColorMode) -> String {
    match format {
        DiffFormat::Text => text(d, use_color(color)),
        DiffFormat::Markdown => markdown(d),
        DiffFormat::Json => json(d),
    }
}

/// Whether `--color` asks for colour here: `always`, or `auto` with stdout on a terminal and
/// `NO_COLOR` unset or empty (<https://no-color.org>).
pub fn use_color(mode: ColorMode) -> bool {
    match mode {
        ColorMode::Always => true,
        ColorMode::Never => false,
        ColorMode::Auto => {
            std::io::IsTerminal::is_terminal(&std::io::stdout())
                && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
        }
    }
}

#[derive(Clone, Copy)]
enum Tone {
    Bad,
    Good,
    Note,
    Plain,
}

struct Paint(bool);

impl Paint {
    fn paint(&self, tone: Tone, s: &str) -> String {
        let code = match tone {
            Tone::Bad => "1;31",
            Tone::Good => "32",
            Tone::Note => "33",
            Tone::Plain => "1",
        };
        if self.0 {
            format!("\x1b[{code}m{s}\x1b[0m")
        } else {
            s.to_string()
        }
    }
}

fn short_sha(s: &Option<String>) -> String {
    match s {
        Some(s) => s.chars().take(12).collect(),
        None => "(none)".to_string(),
    }
}

fn bytes(b: Option<u64>) -> String {
    b.map_or("-".to_string(), |b| b.to_string())
}

fn value(v: &Value) -> String {
    match v {
        Value::Null => "(none)".to_string(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

fn relative(r: Option<f64>) -> String {
    r.map_or(String::new(), |r| format!(" ({:+.1}%)", r * 100.0))
}

fn one_line(s: &str) -> String {
    let flat: String = s
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    if flat.chars().count() > 120 {
        format!("{}…", flat.chars().take(120).collect::<String>())
    } else {
        flat
    }
}

fn counts(d: &Diff) -> String {
    let parts = [
        (d.regressions.len(), "regression", "regressions"),
        (
            d.device_faults.len().max(d.quarantined_gpus.len()),
            "device fault",
            "device faults",
        ),
        (d.lost_coverage.len(), "lost coverage", "lost coverage"),
        (d.fixes.len(), "fix", "fixes"),
        (
            d.bits_moved.len(),
            "node with bits moved",
            "nodes with bits moved",
        ),
        (d.metric_drift.len(), "metric drift", "metric drifts"),
        (d.warns.len(), "row newly at warn", "rows newly at warn"),
        (d.duration_drift.len(), "duration drift", "duration drifts"),
        (d.doors_changed.len(), "doors change", "doors changes"),
        (
            d.other_verdict_changes.len(),
            "other verdict change",
            "other verdict changes",
        ),
        (d.flaky.len(), "flaky node", "flaky nodes"),
        (
            d.nondeterministic.len(),
            "nondeterministic node",
            "nondeterministic nodes",
        ),
        (
            d.gpu_dependent.len(),
            "GPU-dependent result",
            "GPU-dependent results",
        ),
        (d.new_nodes.len(), "new node", "new nodes"),
        (d.removed_nodes.len(), "removed node", "removed nodes"),
        (
            d.environment.len(),
            "environment change",
            "environment changes",
        ),
    ];
    let said: Vec<String> = parts
        .iter()
        .filter(|(n, _, _)| *n > 0)
        .map(|(n, one, many)| format!("{n} {}", if *n == 1 { one } else { many }))
        .collect();
    let mut line = if said.is_empty() {
        "no differences".to_string()
    } else {
        said.join(", ")
    };
    if !d.still_failing.is_empty() {
        let _ = write!(line, " ({} still failing)", d.still_failing.len());
    }
    if d.allow_lost && !d.lost_coverage.is_empty() {
        line.push_str(" (lost coverage allowed by --allow-lost)");
    }
    line
}

fn header(d: &Diff) -> String {
    format!(
        "{} {} ({}, started {}) → {} ({}, started {})",
        d.new.name,
        short_commit(&d.old.commit),
        d.old.verdict,
        d.old.start,
        short_commit(&d.new.commit),
        d.new.verdict,
        d.new.start,
    )
}

/// The terminal rendering.
// Over 150 lines: a renderer: the diff's sections one after another in the order the terminal
// shows them.
pub fn text(d: &Diff, color: bool) -> String {
    let p = Paint(color);
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{}",
        p.paint(Tone::Plain, &format!("diff of {}", header(d)))
    );
    let width = d
        .regressions
        .iter()
        .chain(&d.fixes)
        .chain(&d.still_failing)
        .chain(&d.other_verdict_changes)
        .map(|c| c.id.chars().count())
        .chain(d.lost_coverage.iter().map(|c| c.id.chars().count()))
        .chain(d.bits_moved.iter().map(|b| b.id.chars().count()))
        .chain(d.flaky.iter().map(|f| f.change.id.chars().count()))
        .chain(d.new_nodes.iter().map(|b| b.id.chars().count()))
        .chain(d.removed_nodes.iter().map(|b| b.id.chars().count()))
        .max()
        .unwrap_or(4)
        .clamp(4, 60);
    let section = |out: &mut String, tone: Tone, title: &str, n: usize| {
        let _ = writeln!(out, "\n{}", p.paint(tone, &format!("{title} ({n})")));
    };
    let verdicts = |out: &mut String, tone: Tone, title: &str, rows: &[VerdictChange]| {
        if rows.is_empty() {
            return;
        }
        section(out, tone, title, rows.len());
        for c in rows {
            let line = format!(
                "  {:<width$}  {} → {}  {}",
                c.id,
                c.old,
                c.new,
                one_line(c.reason.as_deref().unwrap_or(""))
            );
            let _ = writeln!(out, "{}", line.trim_end());
            if let Some(k) = &c.known_flaky {
                let _ = writeln!(out, "  {:<width$}  [{k}; still counted]", "");
            }
        }
    };
    verdicts(&mut out, Tone::Bad, "REGRESSIONS", &d.regressions);
    if !d.device_faults.is_empty() || !d.quarantined_gpus.is_empty() {
        let n = d.device_faults.len().max(d.quarantined_gpus.len());
        section(
            &mut out,
            Tone::Note,
            "DEVICE FAULTS (the hardware's, not regressions)",
            n,
        );
        for q in &d.quarantined_gpus {
            let plain = |t: &str| one_line(t);
            let _ = writeln!(out, "  quarantined {}", q.line(&plain, &plain));
        }
        for c in &d.device_faults {
            let line = format!(
                "  {:<width$}  {} → {}  {}",
                c.id,
                c.old,
                c.new,
                one_line(c.reason.as_deref().unwrap_or(""))
            );
            let _ = writeln!(out, "{}", line.trim_end());
        }
    }
    if !d.lost_coverage.is_empty() {
        let tone = if d.allow_lost { Tone::Note } else { Tone::Bad };
        section(&mut out, tone, "LOST COVERAGE", d.lost_coverage.len());
        for c in &d.lost_coverage {
            let line = format!(
                "  {:<width$}  {} → {}  {}",
                c.id,
                c.old,
                lost_new(c),
                one_line(c.reason.as_deref().unwrap_or(""))
            );
            let _ = writeln!(out, "{}", line.trim_end());
        }
    }
    verdicts(&mut out, Tone::Good, "FIXES", &d.fixes);
    verdicts(&mut out, Tone::Note, "STILL FAILING", &d.still_failing);
    super::flaky::text(&mut out, d, width, &|title, n| {
        p.paint(Tone::Note, &format!("{title} ({n})"))
    });
    if !d.bits_moved.is_empty() {
        section(&mut out, Tone::Note, "BITS MOVED", d.bits_moved.len());
        for b in &d.bits_moved {
            let known = b
                .known_nondeterministic
                .as_ref()
                .map(|k| format!("  [{k}]"))
                .unwrap_or_default();
            let _ = writeln!(out, "  {:<width$}  {}{known}", b.id, b.verdict);
            for a in &b.artifacts {
                let _ = writeln!(out, "      {}", artifact_line(a));
                out.push_str(&super::quantify::text(a, "        "));
            }
        }
    }
    if !d.metric_drift.is_empty() {
        section(&mut out, Tone::Note, "METRIC DRIFT", d.metric_drift.len());
        for m in &d.metric_drift {
            let _ = writeln!(
                out,
                "  {}  {} / {}: {} → {}{}",
                m.id,
                m.check,
                m.metric,
                value(&m.old),
                value(&m.new),
                relative(m.relative)
            );
        }
    }
    if !d.info_changed.is_empty() {
        let _ = writeln!(
            out,
            "\n{} informational metric change{} (marked `info`, never drift): {}",
            d.info_changed.len(),
            if d.info_changed.len() == 1 { "" } else { "s" },
            d.info_changed
                .iter()
                .take(8)
                .map(|m| format!("{} {} → {}", m.metric, value(&m.old), value(&m.new)))
                .collect::<Vec<_>>()
                .join(", ")
                + if d.info_changed.len() > 8 {
                    ", …"
                } else {
                    ""
                }
        );
    }
    if !d.warns.is_empty() {
        section(&mut out, Tone::Note, "WARN", d.warns.len());
        for w in &d.warns {
            let line = format!(
                "  {:<width$}  {}: {} → warn  {}",
                w.id,
                w.check,
                warn_old(w),
                one_line(w.message.as_deref().unwrap_or(""))
            );
            let _ = writeln!(out, "{}", line.trim_end());
        }
    }
    if !d.duration_drift.is_empty() {
        section(&mut out, Tone::Note, "DURATIONS", d.duration_drift.len());
        for t in &d.duration_drift {
            let _ = writeln!(
                out,
                "  {:<width$}  {:.2}s → {:.2}s",
                t.id, t.old_seconds, t.new_seconds
            );
        }
    }
    if !d.doors_changed.is_empty() {
        section(&mut out, Tone::Note, "DOORS CHANGED", d.doors_changed.len());
        for c in &d.doors_changed {
            let _ = writeln!(
                out,
                "  {}  {}: {} → {}",
                c.id,
                c.door,
                value(&c.old),
                value(&c.new)
            );
        }
    }
    verdicts(
        &mut out,
        Tone::Plain,
        "OTHER VERDICT CHANGES",
        &d.other_verdict_changes,
    );
    for (title, rows) in [
        ("NEW NODES", &d.new_nodes),
        ("REMOVED NODES", &d.removed_nodes),
    ] {
        if !rows.is_empty() {
            section(&mut out, Tone::Plain, title, rows.len());
            for n in rows {
                let _ = writeln!(out, "  {:<width$}  {}", n.id, n.verdict);
            }
        }
    }
    if !d.environment.is_empty() {
        section(&mut out, Tone::Note, "ENVIRONMENT", d.environment.len());
        for e in &d.environment {
            let _ = writeln!(
                out,
                "  {}: {} → {}",
                e.what,
                e.old.as_deref().unwrap_or("(none)"),
                e.new.as_deref().unwrap_or("(none)")
            );
        }
    }
    let summary = counts(d);
    let tone = if d.regressed() {
        Tone::Bad
    } else if d.is_clean() {
        Tone::Good
    } else {
        Tone::Plain
    };
    let _ = writeln!(out, "\n{}", p.paint(tone, &summary));
    out
}

/// What a row that became warn was in OLD: its status, or `(no row)`.
fn warn_old(w: &super::WarnChange) -> String {
    w.old
        .and_then(|s| serde_json::to_value(s).ok())
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_else(|| "(no row)".to_string())
}

/// What a lost cell is in NEW: its verdict, or `absent`.
fn lost_new(c: &LostCoverage) -> &'static str {
    c.new.map_or("absent", |v| v.as_str())
}

fn artifact_line(a: &ArtifactMove) -> String {
    format!(
        "{}: {} → {} ({} → {} bytes)",
        a.name,
        short_sha(&a.old_sha256),
        short_sha(&a.new_sha256),
        bytes(a.old_bytes),
        bytes(a.new_bytes)
    )
}

fn md(s: &str) -> String {
    one_line(s).replace('|', "\\|")
}

/// The markdown rendering (GitHub-flavoured tables).
// Over 150 lines: a renderer: the diff's sections as markdown tables, one after another in the
// order the page shows them.
pub fn markdown(d: &Diff) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "## memra-orch diff: {}\n", md(&header(d)));
    let _ = writeln!(
        out,
        "**{}**{}\n",
        counts(d),
        if d.regressed() { " — regressed" } else { "" }
    );
    let verdicts = |out: &mut String, title: &str, rows: &[VerdictChange]| {
        if rows.is_empty() {
            return;
        }
        let _ = writeln!(out, "### {title} ({})\n", rows.len());
        let _ = writeln!(out, "| node | old | new | reason |\n|---|---|---|---|");
        for c in rows {
            let known = c
                .known_flaky
                .as_ref()
                .map(|k| format!(" ({k}; still counted)"))
                .unwrap_or_default();
            let _ = writeln!(
                out,
                "| `{}` | {} | {} | {}{} |",
                md(&c.id),
                c.old,
                c.new,
                md(c.reason.as_deref().unwrap_or("")),
                md(&known)
            );
        }
        out.push('\n');
    };
    verdicts(&mut out, "Regressions", &d.regressions);
    if !d.quarantined_gpus.is_empty() {
        let _ = writeln!(
            out,
            "### Device faults: quarantined GPUs ({})\n\nThe hardware failed, not the code; not counted as regressions.\n",
            d.quarantined_gpus.len()
        );
        for q in &d.quarantined_gpus {
            let code = |t: &str| format!("`{}`", md(t));
            let _ = writeln!(out, "- {}", q.line(&md, &code));
        }
        out.push('\n');
    }
    verdicts(&mut out, "Device faults", &d.device_faults);
    if !d.lost_coverage.is_empty() {
        let _ = writeln!(out, "### Lost coverage ({})\n", d.lost_coverage.len());
        let _ = writeln!(out, "| node | old | new | reason |\n|---|---|---|---|");
        for c in &d.lost_coverage {
            let _ = writeln!(
                out,
                "| `{}` | {} | {} | {} |",
                md(&c.id),
                c.old,
                lost_new(c),
                md(c.reason.as_deref().unwrap_or(""))
            );
        }
        out.push('\n');
    }
    verdicts(&mut out, "Fixes", &d.fixes);
    verdicts(&mut out, "Still failing", &d.still_failing);
    super::flaky::markdown(&mut out, d, &md);
    if !d.bits_moved.is_empty() {
        let _ = writeln!(out, "### Bits moved ({})\n", d.bits_moved.len());
        let _ = writeln!(
            out,
            "| node | verdict | artifact | old sha256 | new sha256 | bytes |\n|---|---|---|---|---|---|"
        );
        for b in &d.bits_moved {
            let verdict = match &b.known_nondeterministic {
                Some(k) => format!("{} ({})", b.verdict, md(k)),
                None => b.verdict.to_string(),
            };
            for a in &b.artifacts {
                let _ = writeln!(
                    out,
                    "| `{}` | {} | `{}` | `{}` | `{}` | {} → {} |",
                    md(&b.id),
                    verdict,
                    md(&a.name),
                    short_sha(&a.old_sha256),
                    short_sha(&a.new_sha256),
                    bytes(a.old_bytes),
                    bytes(a.new_bytes)
                );
            }
        }
        out.push('\n');
        out.push_str(&super::quantify::markdown(&d.bits_moved, md));
    }
    if !d.metric_drift.is_empty() {
        let _ = writeln!(out, "### Metric drift ({})\n", d.metric_drift.len());
        let _ = writeln!(
            out,
            "| node | check | metric | old | new | change |\n|---|---|---|---:|---:|---:|"
        );
        for m in &d.metric_drift {
            let _ = writeln!(
                out,
                "| `{}` | {} | {} | {} | {} | {} |",
                md(&m.id),
                md(&m.check),
                md(&m.metric),
                md(&value(&m.old)),
                md(&value(&m.new)),
                relative(m.relative)
                    .trim()
                    .trim_matches(|c| c == '(' || c == ')')
            );
        }
        out.push('\n');
    }
    if !d.warns.is_empty() {
        let _ = writeln!(out, "### Warn ({})\n", d.warns.len());
        let _ = writeln!(out, "| node | check | was | message |\n|---|---|---|---|");
        for w in &d.warns {
            let _ = writeln!(
                out,
                "| `{}` | {} | {} | {} |",
                md(&w.id),
                md(&w.check),
                warn_old(w),
                md(w.message.as_deref().unwrap_or(""))
            );
        }
        out.push('\n');
    }
    if !d.duration_drift.is_empty() {
        let _ = writeln!(out, "### Durations ({})\n", d.duration_drift.len());
        let _ = writeln!(out, "| node | old s | new s |\n|---|---:|---:|");
        for t in &d.duration_drift {
            let _ = writeln!(
                out,
                "| `{}` | {:.2} | {:.2} |",
                md(&t.id),
                t.old_seconds,
                t.new_seconds
            );
        }
        out.push('\n');
    }
    if !d.doors_changed.is_empty() {
        let _ = writeln!(out, "### Doors changed ({})\n", d.doors_changed.len());
        let _ = writeln!(out, "| node | door | old | new |\n|---|---|---|---|");
        for c in &d.doors_changed {
            let _ = writeln!(
                out,
                "| `{}` | {} | {} | {} |",
                md(&c.id),
                md(&c.door),
                md(&value(&c.old)),
                md(&value(&c.new))
            );
        }
        out.push('\n');
    }
    verdicts(&mut out, "Other verdict changes", &d.other_verdict_changes);
    for (title, rows) in [
        ("New nodes", &d.new_nodes),
        ("Removed nodes", &d.removed_nodes),
    ] {
        if !rows.is_empty() {
            let _ = writeln!(out, "### {title} ({})\n", rows.len());
            let _ = writeln!(out, "| node | verdict |\n|---|---|");
            for n in rows {
                let _ = writeln!(out, "| `{}` | {} |", md(&n.id), n.verdict);
            }
            out.push('\n');
        }
    }
    if !d.environment.is_empty() {
        let _ = writeln!(out, "### Environment ({})\n", d.environment.len());
        let _ = writeln!(out, "| what | old | new |\n|---|---|---|");
        for e in &d.environment {
            let _ = writeln!(
                out,
                "| {} | {} | {} |",
                md(&e.what),
                md(e.old.as_deref().unwrap_or("(none)")),
                md(e.new.as_deref().unwrap_or("(none)"))
            );
        }
        out.push('\n');
    }
    out
}

/// The JSON rendering: the whole [`Diff`], pretty-printed, with a trailing newline.
pub fn json(d: &Diff) -> String {
    let mut s = serde_json::to_string_pretty(d).unwrap_or_else(|e| {
        // Every field is plain data; this cannot fail short of a serde bug, and then the
        // reader still gets valid JSON naming the problem.
        serde_json::json!({ "error": format!("cannot serialise the diff: {e}") }).to_string()
    });
    s.push('\n');
    s
}
