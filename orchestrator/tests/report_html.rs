//! `memra-orch report --html` end to end, read back through a real browser: three runs of a
//! fixture battery (a cell that regresses with changed inputs, one whose artifact bits move,
//! one that flips with identical inputs, one that loses coverage, one whose gate writes
//! HTML and quotes into its check message and doors), the report written from them, and
//! the pages rendered by headless Chromium (`--dump-dom`), whose DOM must hold the cells,
//! verdicts and markers, a cell page with its SVG plot, and none of the gate's markup as
//! elements. Screenshots of the matrix and a cell page are left under the target folder
//! (`target/tmp/report_html/`).
//!
//! Chromium comes from `scripts/fetch-chromium`, which installs Debian's package when run
//! as root; a machine where it cannot (not root) skips with a loud message, except in CI
//! (`CI` set), where that is a failure.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use crate::run_support::{Fixture, logged};

const MANIFEST: &str = r#"
schema = 1
name = "nightly"

[vars]
regress = "pass"
err = "0.25"
bits = "one"
flip = "@flip-state"

[[arm]]
id = "steady"
run = ["{gates}/nightly.sh", "pass", "0.5", "same"]
gpus = 0

[[arm]]
id = "regress"
run = ["{gates}/nightly.sh", "${regress}", "${err}", "r"]
gpus = 0

[[arm]]
id = "moved"
run = ["{gates}/nightly.sh", "pass", "0.5", "${bits}"]
gpus = 0

[[arm]]
id = "flip"
run = ["{gates}/nightly.sh", "${flip}", "0.5", "f"]
gpus = 0

[[arm]]
id = "gpu"
run = ["{gates}/pass.sh"]
gpus = 1

[[arm]]
id = "hostile"
run = ["{gates}/hostile-html.sh"]
gpus = 0
"#;

/// The path of a headless Chromium, or `None` (after saying why, loudly) where it cannot be
/// had and the test may skip.
fn chromium() -> Option<PathBuf> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/fetch-chromium");
    let out = Command::new(&script)
        .stderr(Stdio::inherit())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", script.display()));
    match out.status.code() {
        Some(0) => Some(PathBuf::from(
            String::from_utf8_lossy(&out.stdout).trim().to_string(),
        )),
        Some(2) if std::env::var_os("CI").is_none() => {
            eprintln!(
                "\n*** SKIPPED report_html: no Chromium on PATH and not root, so \
                 scripts/fetch-chromium cannot install it; in CI this is a failure ***\n"
            );
            None
        }
        _ => panic!(
            "scripts/fetch-chromium could not provide Chromium ({}); the HTML report's \
             browser test needs it",
            out.status
        ),
    }
}

/// Runs Chromium headless on `page` with `args`, killing it after a minute.
fn browse(chromium: &Path, profile: &Path, page: &Path, args: &[&str]) -> Output {
    let mut child = Command::new(chromium)
        .args(["--headless", "--no-sandbox", "--disable-gpu"])
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(args)
        .arg(format!("file://{}", page.display()))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = child.wait_with_output().unwrap();
    // A page that runs a script which opens a dialog never finishes loading: such a
    // page ends here, killed.
    assert!(
        out.status.success(),
        "chromium on {} (killed after 60 s if it did not end): {}\n{}",
        page.display(),
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// The DOM Chromium rendered of `page`.
fn dom(chromium: &Path, profile: &Path, page: &Path) -> String {
    String::from_utf8(browse(chromium, profile, page, &["--dump-dom"]).stdout).unwrap()
}

fn report(fx: &Fixture, args: &[&str]) -> Output {
    logged(
        Command::new(env!("CARGO_BIN_EXE_memra-orch"))
            .arg("report")
            .args(args)
            .arg("--receipts")
            .arg(fx.path().join("receipts"))
            .current_dir(fx.path())
            .output()
            .unwrap(),
    )
}

/// The matrix cell of `cell` in run `run`, as the rendered DOM spells its opening tag: the
/// row whose head names the cell, at the column whose head names the run.
fn td<'a>(dom: &'a str, cell: &str, run: &str) -> &'a str {
    let matrix = &dom[dom.find("id=\"matrix\"").expect("a matrix")..];
    let heads: Vec<&str> = matrix
        .split("<th data-run=\"")
        .skip(1)
        .map(|s| s.split('"').next().unwrap())
        .collect();
    let column = heads
        .iter()
        .position(|h| *h == run)
        .unwrap_or_else(|| panic!("no column for run {run} in {heads:?}"));
    let row_at = matrix
        .find(&format!("<th data-cell-id=\"{cell}\""))
        .unwrap_or_else(|| panic!("no row for cell {cell} in\n{dom}"));
    let row = &matrix[row_at..];
    let row = &row[..row.find("</tr>").unwrap()];
    let at = row
        .match_indices("<td")
        .nth(column)
        .unwrap_or_else(|| panic!("row {cell} has no column {column}: {row}"))
        .0;
    let end = at + row[at..].find('>').unwrap();
    &row[at..end]
}

/// Whether a matrix cell shows `verdict` (a plain pass is a bare `<td>`, which the style
/// sheet colours as a pass).
fn shows(td: &str, verdict: &str) -> bool {
    td.contains(&format!("class=\"v-{verdict}\"")) || (verdict == "pass" && td == "<td")
}

/// Three runs of the battery: run 2 moves `moved`'s bits and flips `flip` with its
/// command unchanged; run 3 makes `regress` fail with another command and has no GPU for
/// `gpu`.
fn three_runs() -> Fixture {
    let fx = Fixture::new(MANIFEST);
    // A flip is flaky only where the code is named: the fixture folder is a repository
    // whose commit holds the manifest, and the flip's state file is ignored (no code).
    if crate::diff_support::have_git() {
        std::fs::write(
            fx.path().join(".gitignore"),
            "flip-state\nreceipts/\ngpu-leases/\n",
        )
        .unwrap();
        let git = |args: &[&str]| crate::diff_support::git_at(fx.path(), args);
        git(&["init", "-q"]);
        git(&["add", "-A"]);
        git(&["commit", "-q", "-m", "battery"]);
    }
    let state = fx.path().join("flip-state");
    std::fs::write(&state, "pass").unwrap();
    let run = |args: &[&str]| {
        let out = fx.run(args);
        assert_eq!(out.status.code(), Some(1), "hostile fails every run");
    };
    run(&["--gpus", "fake:1"]);
    std::fs::write(&state, "fail").unwrap();
    run(&["--gpus", "fake:1", "--var", "bits=two"]);
    run(&[
        "--gpus",
        "none",
        "--var",
        "bits=two",
        "--var",
        "regress=fail",
        "--var",
        "err=0.75",
    ]);
    fx
}

fn run_ids(fx: &Fixture) -> Vec<String> {
    fx.runs()
        .iter()
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .collect()
}

/// The file name of a cell's page, as the report names it.
fn cell_page(id: &str) -> String {
    format!("{}.html", memra_orch::receipt::slug(id))
}

#[test]
fn the_report_renders_in_chromium_with_cells_verdicts_markers_and_plots() {
    let Some(chromium) = chromium() else { return };
    let fx = three_runs();
    let ids = run_ids(&fx);
    assert_eq!(ids.len(), 3);
    let site = fx.path().join("site");
    let out = report(&fx, &["--html", site.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0));
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("(3 runs, 6 cells)"),
        "{out:?}"
    );
    let profile = tempfile::tempdir().unwrap();
    let index = dom(&chromium, profile.path(), &site.join("index.html"));

    for run in &ids {
        assert!(shows(td(&index, "steady", run), "pass"));
        assert!(shows(td(&index, "hostile", run), "fail"));
    }
    assert!(shows(td(&index, "regress", &ids[1]), "pass"));
    let regressed = td(&index, "regress", &ids[2]);
    assert!(shows(regressed, "fail"), "{regressed}");
    // Its inputs changed: a regression, not a flake.
    assert!(!regressed.contains("data-markers"), "{regressed}");
    assert!(td(&index, "moved", &ids[1]).contains("data-markers=\"bits-moved\""));
    assert!(!td(&index, "moved", &ids[2]).contains("data-markers"));
    let flipped = td(&index, "flip", &ids[1]);
    assert!(
        shows(flipped, "fail") && flipped.contains("data-markers=\"flaky\""),
        "{flipped}"
    );
    let lost = td(&index, "gpu", &ids[2]);
    assert!(
        shows(lost, "skipped") && lost.contains("data-markers=\"lost\""),
        "{lost}"
    );
    assert!(index.contains("class=\"legend\""));
    // Links go to pages named by slug.
    assert!(index.contains(&format!("href=\"cells/{}\"", cell_page("regress"))));

    let cell = dom(
        &chromium,
        profile.path(),
        &site.join("cells").join(cell_page("regress")),
    );
    assert!(
        cell.contains("<figure data-metric=\"quality/err\""),
        "{cell}"
    );
    assert!(cell.contains("<svg"), "{cell}");
    assert!(cell.contains("<circle"), "a point per run: {cell}");
    assert!(
        cell.contains("id=\"last-failure\" data-verdict=\"fail\""),
        "{cell}"
    );
    assert!(cell.contains("err 0.75 is above the bound 0.5"), "{cell}");
    assert!(
        cell.contains("<td data-door=\"backend\">cpu</td>"),
        "{cell}"
    );
    // The log links lead into the receipts tree, to each packed run's archive, which
    // exists.
    let here = site.join("cells");
    let logs: Vec<&str> = cell
        .split("href=\"")
        .skip(1)
        .filter_map(|s| s.split('"').next())
        .filter(|h| h.ends_with("nodes.zip"))
        .collect();
    assert_eq!(logs.len(), 3, "one per run: {cell}");
    for l in logs {
        assert!(here.join(l).is_file(), "{l} from {}", here.display());
    }

    let run_page = std::fs::read_dir(site.join("runs"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| {
            std::fs::read_to_string(p)
                .unwrap()
                .contains(&format!("data-run=\"{}\">Run", ids[0]))
        })
        .expect("a page for the first run");
    let run = dom(&chromium, profile.path(), &run_page);
    assert!(
        run.contains("id=\"run-verdict\" data-verdict=\"fail\""),
        "{run}"
    );
    assert!(
        run.contains("<ul id=\"gpus\">"),
        "run 1 had a fake GPU: {run}"
    );
    assert!(run.contains("<table id=\"environment\">"), "{run}");

    // Screenshots of the matrix and of a cell page, for a person to look at.
    let shots = Path::new(env!("CARGO_TARGET_TMPDIR")).join("report_html");
    std::fs::create_dir_all(&shots).unwrap();
    for (page, name) in [
        (site.join("index.html"), "index.png"),
        (
            site.join("cells").join(cell_page("regress")),
            "cell-regress.png",
        ),
    ] {
        let shot = shots.join(name);
        let _ = std::fs::remove_file(&shot);
        browse(
            &chromium,
            profile.path(),
            &page,
            &[
                &format!("--screenshot={}", shot.display()),
                "--window-size=1400,900",
            ],
        );
        assert!(
            std::fs::metadata(&shot).is_ok_and(|m| m.len() > 1000),
            "no screenshot at {}",
            shot.display()
        );
        eprintln!(
            "report_html: screenshot of {} at {}",
            page.display(),
            shot.display()
        );
    }

    // A second report replaces the first one's pages; a foreign folder is refused.
    let again = report(&fx, &["--html", site.to_str().unwrap(), "--last", "1"]);
    assert_eq!(again.status.code(), Some(0));
    assert!(
        !std::fs::read_to_string(site.join("index.html"))
            .unwrap()
            .contains(&ids[0])
    );
    let foreign = fx.path().join("foreign");
    std::fs::create_dir(&foreign).unwrap();
    std::fs::write(foreign.join("notes.txt"), "mine").unwrap();
    let refused = report(&fx, &["--html", foreign.to_str().unwrap()]);
    assert_eq!(refused.status.code(), Some(2));
    let err = String::from_utf8_lossy(&refused.stderr);
    assert!(
        err.contains("notes.txt") && err.contains("memra-report.json"),
        "{err}"
    );
    assert_eq!(std::fs::read_dir(&foreign).unwrap().count(), 1);
}

#[test]
fn what_a_gate_wrote_renders_as_text_never_as_markup() {
    let Some(chromium) = chromium() else { return };
    let fx = Fixture::new(MANIFEST);
    std::fs::write(fx.path().join("flip-state"), "pass").unwrap();
    assert_eq!(fx.run(&["--gpus", "none"]).status.code(), Some(1));
    let site = fx.path().join("site");
    assert_eq!(
        report(&fx, &["--html", site.to_str().unwrap()])
            .status
            .code(),
        Some(0)
    );
    let profile = tempfile::tempdir().unwrap();
    for page in [
        site.join("index.html"),
        site.join("cells").join(cell_page("hostile")),
    ] {
        let dom = dom(&chromium, profile.path(), &page);
        // The report's own pages have no script and no image: any is the gate's.
        assert!(!dom.contains("<script"), "{}:\n{dom}", page.display());
        assert!(!dom.contains("<img"), "{}:\n{dom}", page.display());
        assert!(!dom.contains("<b>bold"), "{}:\n{dom}", page.display());
        assert!(!dom.contains("pwned</title>"), "{dom}");
    }
    let cell = dom(
        &chromium,
        profile.path(),
        &site.join("cells").join(cell_page("hostile")),
    );
    // The message and the doors are there, as text.
    assert!(
        cell.contains("&lt;script&gt;document.title='pwned'&lt;/script&gt;\"'&gt;&lt;img"),
        "{cell}"
    );
    assert!(
        cell.contains("<td data-door=\"backend\">\"&gt;&lt;script&gt;alert(2)&lt;/script&gt;</td>"),
        "{cell}"
    );
    assert!(
        cell.contains("&lt;b&gt;bold&lt;/b&gt; &amp; 'single'"),
        "{cell}"
    );
}

/// A rerun carries the passing cells: their points' log links lead to the attempt of the
/// run that measured them, which exists; the failing cell's page names its first failing
/// check. What the page shows of a run comes from the history index and `run.json`: with
/// every receipt of the first run made unreadable after it was indexed, the pages are the
/// same bytes (the report reads a cell's receipt only for its newest doors row). The runs
/// are filed as trees (`--no-pack`) so that single receipts can be spoiled.
#[test]
fn carried_points_link_the_measuring_run_and_pages_come_from_the_index() {
    let fx = Fixture::new(MANIFEST);
    let state = fx.path().join("flip-state");
    std::fs::write(&state, "pass").unwrap();
    let out = fx.run(&[
        "--no-pack",
        "--gpus",
        "none",
        "--var",
        "regress=fail",
        "--var",
        "err=0.75",
    ]);
    assert_eq!(out.status.code(), Some(1));
    let out = fx.run(&[
        "--no-pack",
        "--gpus",
        "none",
        "--rerun-failed",
        "--var",
        "regress=fail",
        "--var",
        "err=0.75",
    ]);
    assert_eq!(out.status.code(), Some(1));
    let ids = run_ids(&fx);
    assert_eq!(ids.len(), 2);
    let site = fx.path().join("site");
    let out = report(&fx, &["--html", site.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let page = |id: &str| std::fs::read_to_string(site.join("cells").join(cell_page(id))).unwrap();
    let steady = page("steady");
    let logs: Vec<&str> = steady
        .split("href=\"")
        .skip(1)
        .filter_map(|s| s.split('"').next())
        .filter(|h| h.ends_with("stdout.log"))
        .collect();
    assert_eq!(logs.len(), 2, "{steady}");
    // Both points are the first run's measurement: the same attempt folder, which exists.
    assert_eq!(logs[0], logs[1], "{steady}");
    assert!(logs[0].contains(&ids[0]), "{}", logs[0]);
    assert!(site.join("cells").join(logs[0]).is_file(), "{}", logs[0]);
    let regress = page("regress");
    assert!(
        regress.contains("err 0.75 is above the bound 0.5"),
        "{regress}"
    );

    let before = walk(&site);
    // The first run's receipts of the cells the rerun measured again made unreadable (its
    // run.json kept, so the index stays valid): their first points come from the index.
    let first = fx.runs()[0].clone();
    let mut spoiled = 0;
    for node in std::fs::read_dir(first.join("nodes")).unwrap().flatten() {
        let name = node.file_name().to_string_lossy().into_owned();
        let receipt = node.path().join("receipt.json");
        if (name.starts_with("regress") || name.starts_with("hostile")) && receipt.exists() {
            std::fs::write(&receipt, "not json").unwrap();
            spoiled += 1;
        }
    }
    assert_eq!(spoiled, 2);
    let out = report(&fx, &["--html", site.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("left as the last report wrote them"),
        "{out:?}"
    );
    let after = walk(&site);
    let differ: Vec<&PathBuf> = before
        .iter()
        .zip(&after)
        .filter(|(b, a)| b != a)
        .map(|(b, _)| &b.0)
        .collect();
    assert_eq!(before.len(), after.len());
    assert!(differ.is_empty(), "pages changed: {differ:?}");
}

/// Every file under `dir` with its bytes, sorted by path.
fn walk(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push((p.clone(), std::fs::read(&p).unwrap()));
        }
    }
    out.sort();
    out
}
