//! Printing a [`History`]: per cell, its timeline oldest to newest (run id, commit, verdict,
//! `inputs changed` and `bits moved` markers, metrics, duration) as text for a terminal,
//! markdown for a mail or a pull-request comment, or the whole model as JSON for tools.
//!
//! It formats only; what changed between points is decided in [`super`].

use std::fmt::Write;

use super::{CellHistory, History, Point};
use crate::commit::short_commit;

/// The output formats of `history`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum HistoryFormat {
    Text,
    Markdown,
    Json,
}

/// Renders a history in the chosen format.
pub fn render(h: &History, format: HistoryFormat) -> String {
    match format {
        HistoryFormat::Text => text(h),
        HistoryFormat::Markdown => markdown(h),
        HistoryFormat::Json => {
            let mut s = serde_json::to_string_pretty(h).unwrap_or_default();
            s.push('\n');
            s
        }
    }
}

fn headline(h: &History) -> String {
    let span = match (h.runs.first(), h.runs.last()) {
        (Some(a), Some(b)) if h.runs.len() > 1 => format!(", {} → {}", a.start, b.start),
        (Some(a), _) => format!(", {}", a.start),
        _ => String::new(),
    };
    format!(
        "history of {}: {} run{}{span}, {} cell{}",
        h.manifest,
        h.runs.len(),
        if h.runs.len() == 1 { "" } else { "s" },
        h.cells.len(),
        if h.cells.len() == 1 { "" } else { "s" },
    )
}

/// The verdict column: the verdict, `absent`, and a carried receipt's source run.
fn verdict(p: &Point) -> String {
    match &p.facts {
        None => "absent".to_string(),
        Some(f) => {
            let shown = if f.verdict == crate::verdict::Verdict::Pass && f.warns > 0 {
                format!("pass+warn {}", f.warns)
            } else {
                f.verdict.to_string()
            };
            match &f.carried_from {
                Some(run) => format!("{shown} (carried from {run})"),
                None => shown,
            }
        }
    }
}

fn metrics(p: &Point) -> String {
    p.facts
        .as_ref()
        .map(|f| {
            f.metrics
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>()
                .join(" ")
        })
        .unwrap_or_default()
}

fn seconds(p: &Point) -> String {
    p.facts
        .as_ref()
        .map(|f| format!("{:.1}s", f.seconds))
        .unwrap_or_default()
}

/// `1 flip`, `3 flips`: good ↔ bad changes of the timeline.
fn flips(c: &CellHistory) -> String {
    let n = c.flips();
    format!("{n} flip{}", if n == 1 { "" } else { "s" })
}

fn marker(on: bool, word: &str) -> &str {
    if on { word } else { "" }
}

fn one_line(s: &str) -> String {
    s.chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect()
}

/// The terminal rendering.
pub fn text(h: &History) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "{}", headline(h));
    for c in &h.cells {
        cell_text(&mut out, c);
    }
    out
}

fn cell_text(out: &mut String, c: &CellHistory) {
    let _ = writeln!(out, "\n{}  ({})", one_line(&c.id), flips(c));
    let rows: Vec<[String; 7]> = c
        .points
        .iter()
        .map(|p| {
            [
                p.run.clone(),
                short_commit(&p.commit),
                verdict(p),
                marker(p.inputs_changed, "inputs changed").to_string(),
                marker(p.bits_moved, "bits moved").to_string(),
                seconds(p),
                one_line(&metrics(p)),
            ]
        })
        .collect();
    let mut width = [0usize; 7];
    for r in &rows {
        for (w, col) in width.iter_mut().zip(r) {
            *w = (*w).max(col.chars().count());
        }
    }
    for r in &rows {
        let mut line = String::from(" ");
        for (i, col) in r.iter().enumerate() {
            let _ = write!(line, " {col:<w$}", w = width[i]);
        }
        let _ = writeln!(out, "{}", line.trim_end());
    }
}

/// The markdown rendering: a heading, then one table per cell.
pub fn markdown(h: &History) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "## {}", headline(h));
    for c in &h.cells {
        let _ = writeln!(
            out,
            "\n### `{}` ({})\n\n| run | commit | verdict | inputs | bits | seconds | metrics |\n|---|---|---|---|---|---|---|",
            one_line(&c.id).replace('`', "'"),
            flips(c)
        );
        for p in &c.points {
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} | {} | {} | {} |",
                p.run,
                short_commit(&p.commit),
                verdict(p).replace('|', "\\|"),
                marker(p.inputs_changed, "changed"),
                marker(p.bits_moved, "moved"),
                seconds(p),
                one_line(&metrics(p)).replace('|', "\\|"),
            );
        }
    }
    out
}
