//! The three kinds of page of the report, rendered from a [`ReportView`]: the matrix
//! (`index.html`), a page per cell (`cells/<slug>.html`) and a page per run
//! (`runs/<slug>.html`). Page names come from [`crate::receipt::slug`], never from raw ids.
//! Everything that came from a manifest or a gate is escaped with
//! [`crate::words::escape::html`], in text and in attributes alike.
//!
//! Links to logs point into the receipts tree, relative to the page: the report copies no
//! log, so it stays small and the logs stay where `show` finds them.

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::path::Path;

use super::markup::{href, page, relative, verdict_class};
use super::plot::metric_svg;
use super::view::{CellView, Markers, Point, ReportView, RunView, Sample};
use crate::receipt::commit::short_commit;
use crate::receipt::slug;
use crate::report::summary::counts_line;
use crate::words::escape::html;
use crate::words::verdict::Verdict;

/// The folder of the cell pages, under the report's folder.
pub const CELLS: &str = "cells";
/// The folder of the run pages, under the report's folder.
pub const RUNS: &str = "runs";

/// The file name of a cell's page.
pub fn cell_page(id: &str) -> String {
    format!("{}.html", slug(id))
}

/// The file name of a run's page. Runs of the layout before run ids have no id, and their
/// commit tells them apart.
pub fn run_page(run: &RunView) -> String {
    run_page_name(&run.id, &run.commit)
}

/// [`run_page`] from a run's id (`-` for the old layout) and commit folder: the name the
/// morning summary links to.
pub fn run_page_name(id: &str, commit: &str) -> String {
    if id == "-" {
        format!("{}.html", slug(&format!("{commit}-tree")))
    } else {
        format!("{}.html", slug(id))
    }
}

/// How a run is named in a column header and a table: its position (1 = oldest) and
/// short commit.
fn run_label(i: usize, run: &RunView) -> String {
    format!("#{} {}", i + 1, short_commit(&run.commit))
}

/// How many runs one page of the matrix shows: `index.html` the newest, each older page
/// (`matrix-2.html`, `matrix-3.html`, …) the ones before, so no page grows with the year.
pub const MATRIX_WINDOW: usize = 30;

/// How many pages the matrix of `runs` runs takes (one at least, for a report of none).
pub fn matrix_pages(runs: usize) -> usize {
    runs.div_ceil(MATRIX_WINDOW).max(1)
}

/// The file name of the matrix's page `page` (1 is the newest, `index.html`).
pub fn matrix_page_name(page: usize) -> String {
    if page <= 1 {
        "index.html".to_string()
    } else {
        format!("matrix-{page}.html")
    }
}

/// The runs (indices into [`ReportView::runs`], oldest first) page `page` of the matrix shows.
fn matrix_range(runs: usize, page: usize) -> std::ops::Range<usize> {
    let end = runs.saturating_sub(MATRIX_WINDOW * (page - 1));
    end.saturating_sub(MATRIX_WINDOW)..end
}

/// `index.html` (page 1) or `matrix-<page>.html`: the matrix of cells × runs over the page's
/// window of runs ([`MATRIX_WINDOW`], page 1 the newest), oldest run first, with links to
/// the other pages.
pub fn matrix(view: &ReportView, page: usize) -> String {
    let pages = matrix_pages(view.runs.len());
    let range = matrix_range(view.runs.len(), page);
    let mut b = String::new();
    let _ = writeln!(b, "<h1>{}</h1>", html(&view.manifest));
    let _ = writeln!(
        b,
        "<p>{} runs, {} cells, from <code>{}</code>. Columns are runs, oldest first; a \
         cell's colour is its verdict in that run.</p>",
        view.runs.len(),
        view.cells.len(),
        html(&view.receipts.to_string_lossy())
    );
    // The pages of the matrix, newest first; this one is not a link.
    let _ = write!(
        b,
        "<p id=\"pages\" data-page=\"{page}\" data-pages=\"{pages}\">runs {}–{} of {}",
        range.start + 1,
        range.end,
        view.runs.len()
    );
    if pages > 1 {
        let _ = write!(b, "; pages, newest first:");
        for p in 1..=pages {
            let r = matrix_range(view.runs.len(), p);
            let label = format!("#{}–#{}", r.start + 1, r.end);
            if p == page {
                let _ = write!(b, " <b>{label}</b>");
            } else {
                let _ = write!(b, " <a href=\"{}\">{label}</a>", matrix_page_name(p));
            }
        }
    }
    let _ = writeln!(b, "</p>");
    if page > 1 {
        return matrix_table(b, view, range);
    }
    let current = view.feed.iter().filter(|f| f.current).count();
    let _ = writeln!(
        b,
        "<p id=\"feed\" data-steps=\"{}\">{} step{} in the cells' metrics across these runs ({} \
         still standing), newest first: <a href=\"{}\">text</a>, <a href=\"{}\">JSON</a>{}</p>",
        view.feed.len(),
        view.feed.len(),
        if view.feed.len() == 1 { "" } else { "s" },
        current,
        super::FEED_TEXT,
        super::FEED_JSON,
        match view.feed.first() {
            Some(f) => format!(
                "; the newest: <code>{}</code> <code>{}</code> {} → {} at {}",
                html(&f.cell),
                html(&f.metric),
                f.before,
                f.after,
                html(&f.run)
            ),
            None => String::new(),
        }
    );
    matrix_table(b, view, range)
}

/// The legend and the table of a matrix page over the runs `range`, closing the page.
fn matrix_table(mut b: String, view: &ReportView, range: std::ops::Range<usize>) -> String {
    legend(&mut b);
    // The matrix scrolls sideways inside its box, the cell names staying in view.
    let _ = writeln!(
        b,
        "<div class=\"scroll\"><table id=\"matrix\">\n<tr><th>cell</th>"
    );
    for (i, run) in view
        .runs
        .iter()
        .enumerate()
        .skip(range.start)
        .take(range.len())
    {
        // Day and time (UTC) of the start, the commit's subject when the run recorded it;
        // the whole of each in the tooltip.
        let when = match (run.start.get(5..10), run.start.get(11..16)) {
            (Some(day), Some(time)) => format!("{day} {time}"),
            _ => run.start.clone(),
        };
        let subject = run.subject.as_deref().unwrap_or("");
        let _ = writeln!(
            b,
            "<th data-run=\"{}\" title=\"{}\"><a href=\"{RUNS}/{}\">{}</a><br><small>{}</small>\
             <small class=\"subj\">{}</small></th>",
            html(&run.id),
            html(&format!(
                "{} {} {} {subject}",
                run.id, run.commit, run.start
            )),
            run_page(run),
            html(&run_label(i, run)),
            html(&when),
            html(subject)
        );
    }
    let _ = writeln!(b, "</tr>");
    for cell in &view.cells {
        let link = format!("{CELLS}/{}", cell_page(&cell.id));
        let _ = write!(
            b,
            "<tr><th data-cell-id=\"{}\"><a href=\"{link}\">{}</a></th>",
            html(&cell.id),
            html(&cell.id)
        );
        let markers = cell.markers();
        for (point, &m) in cell.points[range.clone()]
            .iter()
            .zip(&markers[range.clone()])
        {
            let (class, verdict, title) = match point {
                Point::Absent => ("v-absent".to_string(), "absent", "absent".to_string()),
                Point::Present(s) => (
                    verdict_class(s.verdict),
                    s.verdict.as_str(),
                    match (&s.reason, &s.warning) {
                        (Some(r), Some(w)) => format!("{r}; {w}"),
                        (None, Some(w)) => w.clone(),
                        (Some(r), None) => r.clone(),
                        (None, None) => s.verdict.as_str().to_string(),
                    },
                ),
            };
            // The matrix is the page's weight (a thousand cells × 30 runs): a plain pass is
            // a bare `<td>pass</td>`; a cell worth a look (not a pass, or marked) also has
            // its markers, its reason as the tooltip and a link to the cell's page. The
            // run of a column is its head's `data-run`, the cell of a row its `data-cell-id`.
            let markers = marker_names(m);
            if markers.is_empty() && class == "v-pass" && title == verdict {
                // Unclassed: the style sheet colours a bare matrix cell as a pass.
                let _ = write!(b, "<td>{verdict}</td>");
            } else {
                let _ = write!(
                    b,
                    "<td class=\"{class}\" data-verdict=\"{verdict}\"{}{}><a href=\"{link}\">{}{}</a></td>",
                    if markers.is_empty() {
                        String::new()
                    } else {
                        format!(" data-markers=\"{markers}\"")
                    },
                    if title == verdict {
                        String::new()
                    } else {
                        format!(" title=\"{}\"", html(&title))
                    },
                    if verdict == "absent" { "·" } else { verdict },
                    marker_glyphs(m)
                );
            }
        }
        let _ = writeln!(b, "</tr>");
    }
    let _ = writeln!(b, "</table></div>");
    page(&format!("{} — memra-orch report", view.manifest), &b)
}

fn legend(b: &mut String) {
    let _ = write!(b, "<p class=\"legend\">");
    for v in Verdict::ALL {
        let _ = write!(b, "<span class=\"{}\">{v}</span>", verdict_class(v));
    }
    let _ = writeln!(
        b,
        "<span class=\"v-absent\">· absent</span></p>\n<p class=\"legend\">\
         <span><b>◆</b> bits moved (artifact digests changed)</span>\
         <span><b>~</b> flaky (verdict changed, inputs and code identical)</span>\
         <span><b>↓</b> lost coverage (pass → skipped or absent)</span>\
         <span><b>!</b> warn rows</span></p>"
    );
}

/// The markers of a point as the space-separated words of `data-markers`.
fn marker_names(m: Markers) -> String {
    let mut names = Vec::new();
    if m.bits_moved {
        names.push("bits-moved");
    }
    if m.flaky {
        names.push("flaky");
    }
    if m.lost {
        names.push("lost");
    }
    if m.warn {
        names.push("warn");
    }
    names.join(" ")
}

fn marker_glyphs(m: Markers) -> String {
    let mut out = String::new();
    for (on, glyph) in [
        (m.bits_moved, "◆"),
        (m.flaky, "~"),
        (m.lost, "↓"),
        (m.warn, "!"),
    ] {
        if on {
            out.push_str(glyph);
        }
    }
    out
}

/// A cell's page; `site` is the report's folder (absolute), for links into the receipts.
pub fn cell(view: &ReportView, cell: &CellView, site: &Path) -> String {
    let here = site.join(CELLS);
    let mut b = String::new();
    let _ = writeln!(
        b,
        "<nav><a href=\"../index.html\">← {}</a></nav>\n<h1 data-cell-id=\"{}\">{}</h1>",
        html(&view.manifest),
        html(&cell.id),
        html(&cell.id)
    );
    match &cell.last_failure {
        Some(f) => {
            let run = &view.runs[f.run];
            let _ = writeln!(
                b,
                "<h2>Last failure</h2>\n<p id=\"last-failure\" data-verdict=\"{}\">{} in run \
                 <a href=\"../{RUNS}/{}\">{}</a>{}</p>",
                f.verdict,
                f.verdict,
                run_page(run),
                html(&run_label(f.run, run)),
                f.reason
                    .as_deref()
                    .map(|r| format!(": {}", html(r)))
                    .unwrap_or_default()
            );
            if let Some((check, message)) = &f.check {
                let _ = writeln!(
                    b,
                    "<p>First failing check: <code class=\"check\">{}</code>{}</p>",
                    html(check),
                    message
                        .as_deref()
                        .map(|m| format!(" — <span class=\"message\">{}</span>", html(m)))
                        .unwrap_or_default()
                );
            }
        }
        None => {
            let _ = writeln!(b, "<p>No failure in these runs.</p>");
        }
    }
    if let Some(doors) = &cell.doors {
        let _ = writeln!(b, "<h2>Doors</h2>\n<table id=\"doors\">");
        for (k, v) in doors {
            let value = match v {
                serde_json::Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            let _ = writeln!(
                b,
                "<tr><th>{}</th><td data-door=\"{}\">{}</td></tr>",
                html(k),
                html(k),
                html(&value)
            );
        }
        let _ = writeln!(b, "</table>");
    }
    // The trends first: a year of nights is a long table.
    plots(&mut b, cell);
    history_table(&mut b, view, cell, &here);
    page(&format!("{} — {}", cell.id, view.manifest), &b)
}

fn history_table(b: &mut String, view: &ReportView, cell: &CellView, here: &Path) {
    let _ = writeln!(
        b,
        "<h2>History</h2>\n<table id=\"history\">\n<tr><th>run</th><th>start</th>\
         <th>verdict</th><th>inputs</th><th>bits</th><th>markers</th><th>seconds</th>\
         <th>reason</th><th>logs</th></tr>"
    );
    // The way from this page to the receipts folder, once: a log folder below it is that
    // and its own relative path.
    let to_receipts = href(&relative(here, &view.receipts));
    for (i, ((point, m), run)) in cell
        .points
        .iter()
        .zip(cell.markers())
        .zip(&view.runs)
        .enumerate()
    {
        let _ = write!(
            b,
            "<tr data-run=\"{}\"><td><a href=\"../{RUNS}/{}\">{}</a></td><td>{}</td>",
            html(&run.id),
            run_page(run),
            html(&run_label(i, run)),
            html(&run.start)
        );
        match point {
            Point::Absent => {
                let _ = write!(
                    b,
                    "<td class=\"v-absent\" data-verdict=\"absent\">absent</td>\
                     <td></td><td></td><td>{}</td><td></td><td></td><td></td>",
                    marker_names(m)
                );
            }
            Point::Present(s) => {
                let in_pack = s.packed.as_ref().map(|(pack, member)| {
                    let link = match pack.strip_prefix(&view.receipts) {
                        Ok(rel) => format!("{to_receipts}/{}", href(rel)),
                        Err(_) => href(&relative(here, pack)),
                    };
                    format!(
                        "<a href=\"{link}\" title=\"{}\">logs in nodes.zip</a>",
                        html(member)
                    )
                });
                let logs = in_pack
                    .or_else(|| {
                        s.logs.as_deref().map(|dir| {
                            // Absolute below the resolved receipts folder (see build::view).
                            let link = match dir.strip_prefix(&view.receipts) {
                                Ok(rel) => format!("{to_receipts}/{}", href(rel)),
                                Err(_) => href(&relative(here, dir)),
                            };
                            format!(
                                "<a href=\"{link}/stdout.log\">stdout.log</a> \
                             <a href=\"{link}/stderr.log\">stderr.log</a>"
                            )
                        })
                    })
                    .unwrap_or_default();
                let _ = write!(
                    b,
                    "<td class=\"{}\" data-verdict=\"{}\">{}{}</td><td>{}</td><td>{}</td>\
                     <td>{}</td><td>{:.2}</td><td>{}</td><td>{logs}</td>",
                    verdict_class(s.verdict),
                    s.verdict,
                    s.verdict,
                    if s.carried { " (carried)" } else { "" },
                    if s.inputs_changed { "changed" } else { "" },
                    if s.bits_moved { "moved" } else { "" },
                    marker_names(m),
                    s.seconds,
                    html(s.reason.as_deref().unwrap_or(""))
                );
            }
        }
        let _ = writeln!(b, "</tr>");
    }
    let _ = writeln!(b, "</table>");
}

/// When the cell's bits moved in the runs shown: how far, night by night (values that
/// differ, max |Δ|, max ulps against the previous run), 0 where they stayed, a gap where the
/// cell is absent or the move could not be read.
fn moved_plots(b: &mut String, cell: &CellView) {
    let samples: Vec<Option<&Sample>> = cell
        .points
        .iter()
        .map(|p| match p {
            Point::Present(s) => Some(s.as_ref()),
            Point::Absent => None,
        })
        .collect();
    if !samples.iter().flatten().any(|s| s.bits_moved) {
        return;
    }
    let series = |f: &dyn Fn((u64, f64, Option<u64>)) -> Option<f64>| -> Vec<Option<f64>> {
        samples
            .iter()
            .map(|s| {
                let s = (*s)?;
                if !s.bits_moved {
                    return Some(0.0);
                }
                s.moved.and_then(f)
            })
            .collect()
    };
    let _ = writeln!(b, "<h2>Bits moved</h2>");
    let mut drawn = 0;
    let figures: [(&str, Vec<Option<f64>>); 3] = [
        ("values that differ", series(&|m| Some(m.0 as f64))),
        ("max |Δ|", series(&|m| Some(m.1))),
        ("max ulps", series(&|m| m.2.map(|u| u as f64))),
    ];
    for (name, values) in figures {
        if !values.iter().flatten().any(|v| *v != 0.0) {
            continue;
        }
        if let Some(svg) = metric_svg(&values, &[]) {
            let _ = writeln!(
                b,
                "<figure data-moved=\"{}\"><figcaption>bits moved: {}</figcaption>\n{svg}</figure>",
                html(name),
                html(name)
            );
            drawn += 1;
        }
    }
    if drawn == 0 {
        let runs: Vec<String> = samples
            .iter()
            .enumerate()
            .filter(|(_, s)| s.is_some_and(|s| s.bits_moved))
            .map(|(i, _)| format!("#{}", i + 1))
            .collect();
        let _ = writeln!(
            b,
            "<p id=\"moved-unmeasured\">The artifacts' digests changed at runs {}, but how far \
             could not be read (the artifacts are not safetensors, or no longer kept).</p>",
            html(&runs.join(", "))
        );
    }
}

/// A figure per metric any run recorded, with the metric's values across every run.
fn plots(b: &mut String, cell: &CellView) {
    moved_plots(b, cell);
    let names: BTreeSet<&String> = cell
        .points
        .iter()
        .filter_map(|p| match p {
            Point::Present(s) => Some(s.metrics.keys()),
            Point::Absent => None,
        })
        .flatten()
        .collect();
    if names.is_empty() {
        return;
    }
    let _ = writeln!(b, "<h2>Metrics</h2>");
    for name in names {
        let values: Vec<Option<f64>> = cell
            .points
            .iter()
            .map(|p| match p {
                Point::Present(s) => s.metrics.get(name).copied(),
                Point::Absent => None,
            })
            .collect();
        let steps = crate::history::steps::detect(&values);
        let at: Vec<usize> = steps.iter().map(|s| s.at).collect();
        if let Some(svg) = metric_svg(&values, &at) {
            let said: Vec<String> = steps
                .iter()
                .map(|s| format!("run #{}: {} → {}", s.at + 1, s.before, s.after))
                .collect();
            let _ = writeln!(
                b,
                "<figure data-metric=\"{}\" data-steps=\"{}\"><figcaption><code>{}</code>{}\
                 </figcaption>\n{svg}</figure>",
                html(name),
                at.iter()
                    .map(|a| (a + 1).to_string())
                    .collect::<Vec<_>>()
                    .join(" "),
                html(name),
                if said.is_empty() {
                    String::new()
                } else {
                    format!(" — steps at {}", html(&said.join("; ")))
                }
            );
        }
    }
}

/// A run's page: its summary, environment and GPUs, and the verdict of each cell in it.
pub fn run(view: &ReportView, i: usize, site: &Path) -> String {
    let run = &view.runs[i];
    let mut b = String::new();
    let _ = writeln!(
        b,
        "<nav><a href=\"../index.html\">← {}</a></nav>\n<h1 data-run=\"{}\">Run {}</h1>",
        html(&view.manifest),
        html(&run.id),
        html(&run_label(i, run))
    );
    let tree = std::fs::canonicalize(&run.dir).unwrap_or_else(|_| run.dir.clone());
    let rows = [
        ("run id", html(&run.id).into_owned()),
        ("commit", html(&run.commit).into_owned()),
        (
            "verdict",
            format!(
                "<span id=\"run-verdict\" data-verdict=\"{0}\">{0}</span>",
                html(&run.verdict)
            ),
        ),
        ("counts", html(&counts_line(&run.counts)).into_owned()),
        ("start", html(&run.start).into_owned()),
        (
            "duration",
            run.seconds
                .map_or("still running or killed".to_string(), |s| {
                    format!("{s:.1}s")
                }),
        ),
        ("host", html(&run.host).into_owned()),
        (
            "tree",
            format!(
                "<a href=\"{}\">summary.md</a>",
                href(&relative(&site.join(RUNS), &tree.join("summary.md")))
            ),
        ),
    ];
    let _ = writeln!(b, "<h2>Summary</h2>\n<table id=\"summary\">");
    for (k, v) in rows {
        let _ = writeln!(b, "<tr><th>{k}</th><td>{v}</td></tr>");
    }
    let _ = writeln!(
        b,
        "</table>\n<h2>Environment</h2>\n<table id=\"environment\">"
    );
    for (k, v) in &run.environment {
        let _ = writeln!(b, "<tr><th>{}</th><td>{}</td></tr>", html(k), html(v));
    }
    let _ = writeln!(b, "</table>\n<h2>GPUs</h2>");
    if run.gpus.is_empty() {
        let _ = writeln!(b, "<p>none</p>");
    } else {
        let _ = writeln!(b, "<ul id=\"gpus\">");
        for g in &run.gpus {
            let _ = writeln!(b, "<li>{}</li>", html(g));
        }
        let _ = writeln!(b, "</ul>");
    }
    let _ = writeln!(
        b,
        "<h2>Cells</h2>\n<table id=\"cells\"><tr><th>cell</th><th>verdict</th><th>reason</th></tr>"
    );
    for cell in &view.cells {
        if let Some(Point::Present(s)) = cell.points.get(i) {
            let _ = writeln!(
                b,
                "<tr><td><a href=\"../{CELLS}/{}\">{}</a></td><td class=\"{}\" \
                 data-cell=\"{}\" data-verdict=\"{}\">{}</td><td>{}</td></tr>",
                cell_page(&cell.id),
                html(&cell.id),
                verdict_class(s.verdict),
                html(&cell.id),
                s.verdict,
                s.verdict,
                html(s.reason.as_deref().unwrap_or(""))
            );
        }
    }
    let _ = writeln!(b, "</table>");
    page(&format!("Run {} — {}", run.id, view.manifest), &b)
}
