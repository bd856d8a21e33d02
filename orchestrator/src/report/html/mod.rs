//! `memra-orch report --html DIR`: a static site of a manifest's history (no server, no
//! network, no external script, style sheet or font; it works from `file://`). The matrix
//! of cells × runs is `index.html`; each cell and each run has a page of its own
//! ([`pages`]); metric plots are inline SVG ([`plot`]). The pages are rendered from the
//! plain values of [`view`], which [`build`] makes from the history model.
//!
//! The site's folder holds a marker file, [`MARKER`], listing every file the report wrote.
//! A folder that is neither new, empty nor marked is refused, so the report never writes
//! into (or deletes from) a folder it did not make; a marked one has its pages replaced,
//! and of the files it held only those its marker lists are ever deleted.
//!
//! Which runs and cells there are, and what changed between them, is `history`'s to say.

pub mod build;
pub mod markup;
pub mod pages;
pub mod plot;
pub mod view;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::receipt::load::is_plain_name;
use crate::receipt::write_atomic;
use view::ReportView;

/// The marker file of a report's folder.
pub const MARKER: &str = "memra-report.json";
/// Format version of [`MARKER`].
pub const MARKER_SCHEMA: u32 = 1;

/// The regressions feed: every step of the cells' metrics across the report's runs
/// (`history --steps`), as text and as JSON.
pub const FEED_TEXT: &str = "regressions.txt";
pub const FEED_JSON: &str = "regressions.json";

fn feed_text(view: &ReportView) -> String {
    let scope = crate::history::steps::Scope {
        manifest: &view.manifest,
        cells: view.cells.len(),
        runs: view.runs.len(),
    };
    crate::history::steps::render(&scope, &view.feed, false)
}

/// [`MARKER`]'s content.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Marker {
    schema: u32,
    /// Always `memra-orch report`, so a file of another tool of the same name is not taken
    /// for a marker.
    written_by: String,
    /// Every file of the report, relative to its folder.
    files: BTreeSet<String>,
}

const WRITTEN_BY: &str = "memra-orch report";

/// Why the site could not be written.
#[derive(Debug, thiserror::Error)]
pub enum SiteError {
    #[error("{}: not a folder; pass a new or empty folder, or the folder of an earlier report", .0.display())]
    NotAFolder(PathBuf),
    #[error(
        "{}: the folder holds files that memra-orch report did not write (e.g. {entry}) and no \
         {MARKER} marker; pass a new or empty folder, or the folder of an earlier report",
        dir.display()
    )]
    Foreign { dir: PathBuf, entry: String },
    #[error("{}: {MARKER} is not a report marker ({why}); pass a new or empty folder", dir.display())]
    BadMarker { dir: PathBuf, why: String },
    #[error(
        "{}: is a link or not a plain folder; the report writes its pages only into folders of \
         its own (it never follows a link out of the site's folder): remove it, or pass a new \
         or empty folder",
        .0.display()
    )]
    Link(PathBuf),
    #[error("{}: {error}", path.display())]
    Io {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error(
        "{}: the disk is full ({error}); free space there and run memra-orch report again (the \
         pages written so far are listed in {MARKER}, so the next report replaces them)",
        path.display()
    )]
    DiskFull { path: PathBuf, error: String },
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> SiteError + '_ {
    move |error| {
        if crate::words::diskfull::is_disk_full(&error) {
            SiteError::DiskFull {
                path: path.to_path_buf(),
                error: error.to_string(),
            }
        } else {
            SiteError::Io {
                path: path.to_path_buf(),
                error,
            }
        }
    }
}

/// A file the site writes (through the receipts' atomic writer) that could not be written.
fn written(path: PathBuf, e: crate::receipt::error::ReceiptError) -> SiteError {
    if let Some(io) = e
        .io_error()
        .filter(|io| crate::words::diskfull::is_disk_full(io))
    {
        SiteError::DiskFull {
            path,
            error: io.to_string(),
        }
    } else if let Some(io) = e.io_error() {
        // The system's own words: the receipts' hint ("check the receipt folder") would
        // name the wrong folder here.
        SiteError::Io {
            path,
            error: std::io::Error::new(io.kind(), io.to_string()),
        }
    } else {
        SiteError::Io {
            path,
            error: std::io::Error::other(e.to_string()),
        }
    }
}

/// What a written site holds.
#[derive(Debug, Clone)]
pub struct Written {
    /// The site's folder, absolute.
    pub dir: PathBuf,
    /// The files written, relative to it.
    pub files: BTreeSet<String>,
    /// Files of an earlier report that this one no longer has, deleted.
    pub removed: usize,
    /// Files of [`Written::files`] the earlier report had written with the same bytes,
    /// left as they were.
    pub unchanged: usize,
}

/// Writes the site of `view` into `dir`: creates it when missing, refuses a folder that holds
/// files without [`MARKER`], and replaces an earlier report's pages.
pub fn write_site(dir: &Path, view: &ReportView) -> Result<Written, SiteError> {
    let previous = previous_files(dir)?;
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    for sub in [pages::CELLS, pages::RUNS] {
        let path = dir.join(sub);
        // A link planted at `cells` or `runs` would lead every page write, and the deletion
        // of stale pages, outside the site's folder.
        match std::fs::symlink_metadata(&path) {
            Ok(m) if m.file_type().is_dir() => {}
            Ok(_) => return Err(SiteError::Link(path)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                std::fs::create_dir(&path).map_err(io(&path))?;
            }
            Err(e) => return Err(io(&path)(e)),
        }
    }
    let dir = std::fs::canonicalize(dir).map_err(io(dir))?;

    // Every page by name first, each rendered only as it is written, so the site is never
    // held in memory whole (a thousand cell pages).
    let mut jobs: Vec<(String, Page)> = (1..=pages::matrix_pages(view.runs.len()))
        .map(|p| (pages::matrix_page_name(p), Page::Matrix(p)))
        .collect();
    for (i, cell) in view.cells.iter().enumerate() {
        jobs.push((
            format!("{}/{}", pages::CELLS, pages::cell_page(&cell.id)),
            Page::Cell(i),
        ));
    }
    for (i, run) in view.runs.iter().enumerate() {
        jobs.push((
            format!("{}/{}", pages::RUNS, pages::run_page(run)),
            Page::Run(i),
        ));
    }
    // The regressions feed, for people and for tools.
    jobs.push((FEED_TEXT.to_string(), Page::FeedText));
    jobs.push((FEED_JSON.to_string(), Page::FeedJson));
    let files: BTreeSet<String> = jobs.iter().map(|(name, _)| name.clone()).collect();

    // The marker names the old files and the new ones while the pages are written, so a
    // report killed half-way leaves a folder the next report still recognises as its own.
    let both: BTreeSet<String> = previous.union(&files).cloned().collect();
    write_marker(&dir, &both)?;
    let mut unchanged = 0;
    for (name, job) in &jobs {
        let text = match *job {
            Page::Matrix(p) => pages::matrix(view, p),
            Page::Cell(i) => pages::cell(view, &view.cells[i], &dir),
            Page::Run(i) => pages::run(view, i, &dir),
            Page::FeedText => feed_text(view),
            Page::FeedJson => serde_json::to_string_pretty(&view.feed).unwrap_or_default() + "\n",
        };
        let path = dir.join(name);
        // A page the earlier report wrote with the same bytes (a finished run's page, an
        // older page of the matrix) is left as it is: a night rewrites only what moved.
        if previous.contains(name) && same_bytes(&path, text.as_bytes()) {
            unchanged += 1;
            continue;
        }
        write_atomic(&path, text.as_bytes()).map_err(|e| written(path, e))?;
    }
    let mut removed = 0;
    for stale in previous.difference(&files) {
        let path = dir.join(stale);
        match std::fs::remove_file(&path) {
            Ok(()) => removed += 1,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(io(&path)(e)),
        }
    }
    write_marker(&dir, &files)?;
    Ok(Written {
        dir,
        files,
        removed,
        unchanged,
    })
}

/// A page of the site, rendered when it is written.
#[derive(Debug, Clone, Copy)]
enum Page {
    /// The matrix's page `n` (1 is `index.html`).
    Matrix(usize),
    /// The page of [`ReportView::cells`]`[i]`.
    Cell(usize),
    /// The page of [`ReportView::runs`]`[i]`.
    Run(usize),
    FeedText,
    FeedJson,
}

/// Whether `path` is a plain file (not a link, not a FIFO) holding exactly `bytes`.
fn same_bytes(path: &Path, bytes: &[u8]) -> bool {
    use std::io::Read as _;
    let Ok(file) = crate::gate::attempt_file::open_path(path) else {
        return false;
    };
    if !file
        .metadata()
        .is_ok_and(|m| m.is_file() && m.len() == bytes.len() as u64)
    {
        return false;
    }
    let mut held = Vec::with_capacity(bytes.len());
    file.take(bytes.len() as u64 + 1)
        .read_to_end(&mut held)
        .is_ok()
        && held == bytes
}

fn write_marker(dir: &Path, files: &BTreeSet<String>) -> Result<(), SiteError> {
    let marker = Marker {
        schema: MARKER_SCHEMA,
        written_by: WRITTEN_BY.to_string(),
        files: files.clone(),
    };
    let path = dir.join(MARKER);
    crate::receipt::write_json(&path, &marker).map_err(|e| written(path, e))
}

/// The files an earlier report wrote into `dir` (empty for a missing or empty folder); an
/// error for a folder that holds anything else.
fn previous_files(dir: &Path) -> Result<BTreeSet<String>, SiteError> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(BTreeSet::new()),
        Err(_) if dir.exists() && !dir.is_dir() => {
            return Err(SiteError::NotAFolder(dir.to_path_buf()));
        }
        Err(e) => return Err(io(dir)(e)),
    };
    let mut names: Vec<String> = entries
        .map(|e| e.map(|e| e.file_name().to_string_lossy().into_owned()))
        .collect::<Result<_, _>>()
        .map_err(io(dir))?;
    names.sort();
    // A report that found the disk full before its marker was written left only its two
    // (empty) page folders: that folder is still as good as empty.
    let empty_page_folder = |n: &String| {
        (n == pages::CELLS || n == pages::RUNS)
            && std::fs::symlink_metadata(dir.join(n)).is_ok_and(|m| m.is_dir())
            && std::fs::read_dir(dir.join(n)).is_ok_and(|mut d| d.next().is_none())
    };
    if names.iter().all(empty_page_folder) {
        return Ok(BTreeSet::new());
    }
    if !names.iter().any(|n| n == MARKER) {
        return Err(SiteError::Foreign {
            dir: dir.to_path_buf(),
            entry: names[0].clone(),
        });
    }
    let bad = |why: String| SiteError::BadMarker {
        dir: dir.to_path_buf(),
        why,
    };
    // Opened without following a link and without blocking (a FIFO in its place would
    // hang the report), and only a plain file is read.
    let marker_path = dir.join(MARKER);
    let text = crate::gate::attempt_file::open_path(&marker_path)
        .map_err(|e| bad(e.to_string()))
        .and_then(|f| {
            use std::io::Read as _;
            let mut text = Vec::new();
            f.take(16 << 20)
                .read_to_end(&mut text)
                .map(|_| text)
                .map_err(io(&marker_path))
        })?;
    let marker: Marker = serde_json::from_slice(&text).map_err(|e| bad(e.to_string()))?;
    if marker.written_by != WRITTEN_BY {
        return Err(bad(format!("written by {:?}", marker.written_by)));
    }
    // The marker is a file in a folder a user controls: only names the report itself can
    // write are trusted, so an edited marker cannot make it delete anything else.
    if let Some(odd) = marker.files.iter().find(|f| !is_report_file(f)) {
        return Err(bad(format!("it lists {odd:?}, which is not a report page")));
    }
    Ok(marker.files)
}

/// Whether `name` is a path the report writes: `index.html`, or `cells/<name>.html` /
/// `runs/<name>.html` with a plain file name.
fn is_report_file(name: &str) -> bool {
    if name == "index.html" || name == FEED_TEXT || name == FEED_JSON {
        return true;
    }
    // `matrix-<n>.html`, the older pages of the matrix.
    if let Some(n) = name
        .strip_prefix("matrix-")
        .and_then(|r| r.strip_suffix(".html"))
    {
        return !n.is_empty() && n.bytes().all(|c| c.is_ascii_digit());
    }
    match name.split_once('/') {
        Some((folder, file)) => {
            (folder == pages::CELLS || folder == pages::RUNS)
                && is_plain_name(file)
                && file.ends_with(".html")
        }
        None => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::words::verdict::Verdict;
    use view::{CellView, RunView};

    fn tiny() -> ReportView {
        let run = RunView {
            id: "20261202T000000Z-0001".into(),
            subject: Some("a <subject>".into()),
            dir: PathBuf::from("/nonexistent/run"),
            commit: "abc".into(),
            start: "2026-12-02T00:00:00Z".into(),
            verdict: "pass".into(),
            seconds: Some(1.0),
            counts: crate::words::verdict::count([Verdict::Pass]),
            host: "h".into(),
            environment: vec![],
            gpus: vec![],
        };
        ReportView {
            manifest: "m".into(),
            receipts: PathBuf::from("/nonexistent"),
            runs: vec![run],
            cells: vec![CellView {
                id: "a/<b>".into(),
                points: vec![view::tests::sample(Verdict::Pass, false, false)],
                last_failure: None,
                doors: None,
            }],
            feed: Vec::new(),
        }
    }

    #[test]
    fn a_foreign_folder_is_refused_and_left_alone() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("notes.txt"), "mine").unwrap();
        let err = write_site(dir.path(), &tiny()).unwrap_err();
        assert!(matches!(err, SiteError::Foreign { .. }), "{err}");
        assert!(err.to_string().contains("notes.txt"), "{err}");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[test]
    fn a_report_replaces_its_own_pages_and_nothing_else() {
        let dir = tempfile::tempdir().unwrap();
        let site = dir.path().join("site");
        let first = write_site(&site, &tiny()).unwrap();
        assert!(first.files.contains("index.html"));
        let cell_page = format!("cells/{}", pages::cell_page("a/<b>"));
        assert!(first.files.contains(&cell_page), "{:?}", first.files);
        // A file the user put there stays; a cell that left the history loses its page.
        std::fs::write(site.join("cells/keep.txt"), "mine").unwrap();
        let mut second = tiny();
        second.cells[0].id = "other".into();
        let written = write_site(&site, &second).unwrap();
        assert_eq!(written.removed, 1);
        assert!(!site.join(&cell_page).exists());
        assert!(site.join("cells/keep.txt").exists());
        assert!(
            site.join(format!("cells/{}", pages::cell_page("other")))
                .exists()
        );
    }

    #[test]
    fn an_edited_marker_cannot_lead_outside_the_pages() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("precious"), "x").unwrap();
        let marker = serde_json::json!({
            "schema": 1, "written_by": WRITTEN_BY, "files": ["../precious", "index.html"]
        });
        std::fs::write(dir.path().join(MARKER), marker.to_string()).unwrap();
        let err = write_site(dir.path(), &tiny()).unwrap_err();
        assert!(matches!(err, SiteError::BadMarker { .. }), "{err}");
        assert!(dir.path().join("precious").exists());
    }

    /// `tiny` with `n` runs, the cell passing in each.
    fn runs(n: usize) -> ReportView {
        let mut v = tiny();
        let one = v.runs[0].clone();
        v.runs = (0..n)
            .map(|i| RunView {
                id: format!("20261202T{:06}Z-0001", i),
                ..one.clone()
            })
            .collect();
        v.cells[0].points = (0..n)
            .map(|_| view::tests::sample(Verdict::Pass, false, false))
            .collect();
        v
    }

    /// The run ids whose column heads a matrix page shows.
    fn columns(page: &str) -> Vec<String> {
        page.split("data-run=\"")
            .skip(1)
            .map(|s| s[..s.find('"').unwrap()].to_string())
            .collect()
    }

    #[test]
    fn the_matrix_shows_the_newest_window_and_pages_to_older_runs() {
        let dir = tempfile::tempdir().unwrap();
        let site = dir.path().join("site");
        let n = 2 * pages::MATRIX_WINDOW + 5;
        let view = runs(n);
        let written = write_site(&site, &view).unwrap();
        let id = |i: usize| view.runs[i].id.clone();
        let page = |name: &str| std::fs::read_to_string(site.join(name)).unwrap();
        // Page 1 (index.html) holds the newest window, page 2 the one before, page 3 the
        // oldest five; together every run once, oldest first within a page.
        let first = columns(&page("index.html"));
        assert_eq!(first.len(), pages::MATRIX_WINDOW);
        assert_eq!(first.first(), Some(&id(n - pages::MATRIX_WINDOW)));
        assert_eq!(first.last(), Some(&id(n - 1)));
        let second = columns(&page("matrix-2.html"));
        assert_eq!(second.len(), pages::MATRIX_WINDOW);
        assert_eq!(second.last(), Some(&id(n - pages::MATRIX_WINDOW - 1)));
        let third = columns(&page("matrix-3.html"));
        assert_eq!(third, (0..5).map(id).collect::<Vec<_>>());
        assert!(!site.join("matrix-4.html").exists());
        // Each page links the others and marks itself.
        let index = page("index.html");
        assert!(index.contains("data-pages=\"3\""), "{index}");
        assert!(index.contains("href=\"matrix-2.html\""));
        assert!(index.contains("href=\"matrix-3.html\""));
        assert!(page("matrix-3.html").contains("href=\"index.html\""));
        assert!(written.files.contains("matrix-3.html"));
        // The same view again rewrites nothing; one more run shifts the windows, and a
        // smaller history deletes the pages it no longer has.
        let again = write_site(&site, &view).unwrap();
        assert_eq!(again.unchanged, again.files.len());
        let fewer = write_site(&site, &runs(pages::MATRIX_WINDOW)).unwrap();
        assert!(!site.join("matrix-2.html").exists());
        assert!(!site.join("matrix-3.html").exists());
        assert!(fewer.removed >= 2, "{fewer:?}");
        assert_eq!(columns(&page("index.html")).len(), pages::MATRIX_WINDOW);
    }

    #[test]
    fn only_numbered_matrix_pages_are_report_files() {
        assert!(is_report_file("matrix-2.html"));
        assert!(is_report_file("matrix-10.html"));
        for odd in [
            "matrix-.html",
            "matrix-a.html",
            "matrix-2.htm",
            "matrix-../x.html",
        ] {
            assert!(!is_report_file(odd), "{odd}");
        }
    }

    #[test]
    fn a_page_with_other_bytes_or_a_link_in_its_place_is_written_again() {
        let dir = tempfile::tempdir().unwrap();
        let site = dir.path().join("site");
        write_site(&site, &tiny()).unwrap();
        std::fs::write(site.join("index.html"), "edited").unwrap();
        let outside = dir.path().join("outside.html");
        std::fs::write(&outside, "keep").unwrap();
        let cell = site.join(format!("cells/{}", pages::cell_page("a/<b>")));
        let held = std::fs::read(&cell).unwrap();
        std::fs::remove_file(&cell).unwrap();
        std::os::unix::fs::symlink(&outside, &cell).unwrap();
        let again = write_site(&site, &tiny()).unwrap();
        assert_eq!(again.unchanged, again.files.len() - 2);
        assert_ne!(
            std::fs::read_to_string(site.join("index.html")).unwrap(),
            "edited"
        );
        assert!(
            !std::fs::symlink_metadata(&cell)
                .unwrap()
                .file_type()
                .is_symlink()
        );
        assert_eq!(std::fs::read(&cell).unwrap(), held);
        assert_eq!(std::fs::read_to_string(&outside).unwrap(), "keep");
    }
}
