//! Printing a [`History`]: per cell, its timeline oldest to newest (run id, commit, verdict,
//! `inputs changed` and `bits moved` markers, metrics, duration) as text for a terminal,
//! markdown for a mail or a pull-request comment, or the whole model as JSON for tools.
//!
//! It formats only; what changed between points is decided in [`super`].

use std::fmt::Write;

use super::{CellHistory, History, Point, RunSummary};
use crate::receipt::commit::short_commit;

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
    headline_of(&h.manifest, &h.runs, h.cells.len())
}

/// The first line: the manifest, how many runs over which span, how many cells.
pub fn headline_of(manifest: &str, runs: &[RunSummary], cells: usize) -> String {
    let span = match (runs.first(), runs.last()) {
        (Some(a), Some(b)) if runs.len() > 1 => format!(", {} → {}", a.start, b.start),
        (Some(a), _) => format!(", {}", a.start),
        _ => String::new(),
    };
    format!(
        "history of {manifest}: {} run{}{span}, {cells} cell{}",
        runs.len(),
        if runs.len() == 1 { "" } else { "s" },
        if cells == 1 { "" } else { "s" },
    )
}

/// The verdict column: the verdict, `absent`, and a carried receipt's source run.
fn verdict(p: &Point) -> String {
    match &p.facts {
        None => "absent".to_string(),
        Some(f) => {
            let shown = if f.verdict == crate::words::verdict::Verdict::Pass && f.warns > 0 {
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
    text_cells(&mut out, &h.cells);
    out
}

/// The terminal rendering of `cells`, after the headline.
pub fn text_cells(out: &mut String, cells: &[CellHistory]) {
    for c in cells {
        cell_text(out, c);
    }
}

fn cell_text(out: &mut String, c: &CellHistory) {
    let _ = writeln!(out, "\n{}  ({})", one_line(&c.id), flips(c));
    // Every column of every point is written once into `texts`, its place kept, so the
    // widths are known before the first line is written.
    let mut texts = String::new();
    let mut places: Vec<[std::ops::Range<usize>; 7]> = Vec::with_capacity(c.points.len());
    let mut width = [0usize; 7];
    for p in &c.points {
        let mut place: [std::ops::Range<usize>; 7] = Default::default();
        for (k, slot) in place.iter_mut().enumerate() {
            let start = texts.len();
            match k {
                0 => texts.push_str(&p.run),
                1 => texts.push_str(&short_commit(&p.commit)),
                2 => texts.push_str(&verdict(p)),
                3 => texts.push_str(marker(p.inputs_changed, "inputs changed")),
                4 => texts.push_str(marker(p.bits_moved, "bits moved")),
                5 => {
                    if let Some(f) = &p.facts {
                        let _ = write!(texts, "{:.1}s", f.seconds);
                    }
                }
                _ => {
                    for (i, (name, v)) in p.facts.iter().flat_map(|f| &f.metrics).enumerate() {
                        let _ = write!(texts, "{}{name}={v}", if i > 0 { " " } else { "" });
                    }
                    if texts[start..].chars().any(char::is_control) {
                        let flat = one_line(&texts[start..]);
                        texts.truncate(start);
                        texts.push_str(&flat);
                    }
                }
            }
            *slot = start..texts.len();
            width[k] = width[k].max(texts[slot.clone()].chars().count());
        }
        places.push(place);
    }
    for place in &places {
        let start = out.len();
        out.push(' ');
        for (k, range) in place.iter().enumerate() {
            let text = &texts[range.clone()];
            out.push(' ');
            out.push_str(text);
            let pad = width[k] - text.chars().count();
            out.extend(std::iter::repeat_n(' ', pad));
        }
        let kept = out[start..].trim_end().len();
        out.truncate(start + kept);
        out.push('\n');
    }
}

/// The markdown rendering: a heading, then one table per cell.
pub fn markdown(h: &History) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "{}", markdown_head(&headline(h)));
    markdown_cells(&mut out, &h.cells);
    out
}

/// The markdown heading of a [`headline_of`].
pub fn markdown_head(headline: &str) -> String {
    format!("## {headline}")
}

/// The markdown rendering of `cells`, after the heading.
pub fn markdown_cells(out: &mut String, cells: &[CellHistory]) {
    for c in cells {
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
}
