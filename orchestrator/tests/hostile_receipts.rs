//! What a gate (or another user) can plant under the receipts folder or a report's folder,
//! with real links and FIFOs: the report never writes or deletes through a link at `cells`
//! or `runs`, and a FIFO or a link in place of the history index hangs nothing and is never
//! written through.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::run_support::{Fixture, orch};

fn mkfifo(path: &Path) {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a valid NUL-terminated path and a mode.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o666) }, 0);
}

fn battery() -> Fixture {
    let f = Fixture::new(
        "schema = 1\nname = \"h\"\n[[arm]]\nid = \"a\"\nrun = [\"{gates}/pass.sh\"]\n",
    );
    assert_eq!(f.run(&[]).status.code(), Some(0));
    f
}

#[test]
fn a_link_at_cells_or_runs_is_refused_and_nothing_outside_is_touched() {
    let f = battery();
    let site = f.path().join("site");
    assert_eq!(
        orch(&f, &["report", "--html", site.to_str().unwrap()])
            .status
            .code(),
        Some(0)
    );
    let marker = std::fs::read_to_string(site.join("memra-report.json")).unwrap();
    let listed = marker
        .split('"')
        .find(|s| s.starts_with("cells/"))
        .expect("the marker lists a cell page")
        .to_string();
    // Another user swaps `cells` for a link to a folder of the victim's holding a file of
    // the listed page's name.
    let outside = f.path().join("outside");
    std::fs::create_dir(&outside).unwrap();
    let victim = outside.join(listed.trim_start_matches("cells/"));
    std::fs::write(&victim, "keep me").unwrap();
    std::fs::remove_dir_all(site.join("cells")).unwrap();
    std::os::unix::fs::symlink(&outside, site.join("cells")).unwrap();
    let out = orch(&f, &["report", "--html", site.to_str().unwrap()]);
    assert_ne!(out.status.code(), Some(0));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("is a link or not a plain folder"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "keep me");
    assert_eq!(std::fs::read_dir(&outside).unwrap().count(), 1);
}

#[test]
fn a_fifo_for_the_marker_or_the_index_hangs_nothing() {
    let f = battery();
    let index = f.path().join("receipts/.memra-index/index.sqlite");
    let _ = std::fs::remove_file(&index);
    std::fs::create_dir_all(index.parent().unwrap()).unwrap();
    mkfifo(&index);
    let site = f.path().join("site");
    std::fs::create_dir(&site).unwrap();
    mkfifo(&site.join("memra-report.json"));
    let t = Instant::now();
    let history = orch(&f, &["history"]);
    assert_eq!(history.status.code(), Some(0));
    let report = orch(&f, &["report", "--html", site.to_str().unwrap()]);
    assert_ne!(report.status.code(), Some(0), "a FIFO is no report marker");
    // A run appends to the index: it must not block on the FIFO either.
    assert_eq!(f.run(&[]).status.code(), Some(0));
    assert!(t.elapsed() < Duration::from_secs(30), "{:?}", t.elapsed());
}

#[test]
fn the_index_is_never_written_through_a_link() {
    let f = battery();
    let index = f.path().join("receipts/.memra-index/index.sqlite");
    let _ = std::fs::remove_file(&index);
    let elsewhere = f.path().join("elsewhere.txt");
    std::fs::write(&elsewhere, "untouched\n").unwrap();
    std::os::unix::fs::symlink(&elsewhere, &index).unwrap();
    assert_eq!(f.run(&[]).status.code(), Some(0));
    assert_eq!(orch(&f, &["history"]).status.code(), Some(0));
    assert_eq!(std::fs::read_to_string(&elsewhere).unwrap(), "untouched\n");
}

#[test]
fn a_metrics_file_path_naming_a_file_of_the_users_is_refused_and_the_file_kept() {
    let f = Fixture::new(
        "schema = 1\nname = \"m\"\n[[arm]]\nid = \"a\"\nrun = [\"{gates}/pass.sh\"]\n",
    );
    let mine = f.path().join("notes.toml");
    std::fs::write(&mine, "precious = true\n").unwrap();
    let out = f.run(&["--metrics-file", mine.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("is not a metrics file memra-orch wrote"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(std::fs::read_to_string(&mine).unwrap(), "precious = true\n");
    // Its own file from an earlier run is replaced as before.
    let prom = f.path().join("m.prom");
    assert_eq!(
        f.run(&["--metrics-file", prom.to_str().unwrap()])
            .status
            .code(),
        Some(0)
    );
    assert_eq!(
        f.run(&["--metrics-file", prom.to_str().unwrap()])
            .status
            .code(),
        Some(0)
    );
}

#[test]
fn a_commit_name_among_memra_orchs_own_folders_is_refused() {
    let f = Fixture::new(
        "schema = 1\nname = \"c\"\n[[arm]]\nid = \"a\"\nrun = [\"{gates}/pass.sh\"]\n",
    );
    for name in [".memra-index", ".memra-store", ".hidden"] {
        let out = Command::new(env!("CARGO_BIN_EXE_memra-orch"))
            .args(["run", "manifest.toml", "--commit", name, "--receipts"])
            .arg(f.path().join("receipts"))
            .current_dir(f.path())
            .output()
            .unwrap();
        assert_ne!(out.status.code(), Some(0), "{name} was accepted");
        assert!(!f.path().join("receipts").join(name).join("c").exists());
    }
}

#[test]
fn bidi_and_control_characters_in_cell_names_never_reach_the_terminal_raw() {
    let f = Fixture::new(
        "schema = 1\nname = \"bidi\"\n[[arm]]\nid = \"a\"\nrun = [\"{gates}/pass.sh\"]\n\
         matrix = { v = [\"x\\u202eevil\\u0007\"] }\n",
    );
    assert_eq!(f.run(&[]).status.code(), Some(0));
    assert_eq!(f.run(&[]).status.code(), Some(0));
    for args in [
        vec!["history"],
        vec!["show", "latest"],
        vec!["diff", "previous", "latest", "--color", "never"],
        vec!["diff", "previous", "latest", "--format", "markdown"],
    ] {
        let out = orch(&f, &args);
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            !text.contains('\u{202e}') && !text.contains('\u{7}'),
            "{args:?} printed a raw control: {text:?}"
        );
    }
}

#[test]
fn worktrees_a_killed_bisect_left_are_pruned_and_a_live_ones_kept() {
    assert!(crate::diff_support::have_git(), "git is needed");
    let repo = tempfile::tempdir().unwrap();
    let git = |args: &[&str]| crate::diff_support::git_at(repo.path(), args);
    git(&["init", "-q"]);
    std::fs::write(repo.path().join("a"), "a").unwrap();
    git(&["add", "a"]);
    git(&[
        "-c",
        "user.name=t",
        "-c",
        "user.email=t@t",
        "commit",
        "-qm",
        "a",
    ]);
    let stale = tempfile::Builder::new()
        .prefix("memra-bisect-")
        .tempdir()
        .unwrap();
    let live = tempfile::Builder::new()
        .prefix("memra-bisect-")
        .tempdir()
        .unwrap();
    // A pid no process has (beyond the kernel's limit) and our own, alive.
    std::fs::write(stale.path().join("owner.pid"), "2147483646").unwrap();
    std::fs::write(
        live.path().join("owner.pid"),
        std::process::id().to_string(),
    )
    .unwrap();
    for d in [&stale, &live] {
        let wt = d.path().join("wt");
        git(&[
            "worktree",
            "add",
            "--detach",
            "-q",
            wt.to_str().unwrap(),
            "HEAD",
        ]);
    }
    memra_orch::bisect::git::prune_stale(repo.path());
    let list = git(&["worktree", "list", "--porcelain"]);
    assert!(!stale.path().exists(), "the stale folder stayed");
    assert!(!list.contains(stale.path().to_str().unwrap()), "{list}");
    assert!(live.path().join("wt").exists());
    assert!(
        list.contains(live.path().join("wt").to_str().unwrap()),
        "{list}"
    );
}

#[test]
fn gc_under_a_held_lock_says_what_holds_it_and_counts_what_it_deleted() {
    let f = battery();
    assert_eq!(f.run(&[]).status.code(), Some(0));
    let manifest_dir = f.manifest_dir();
    let _held = memra_orch::receipt::tree::RunLock::acquire(&manifest_dir).unwrap();
    let out = orch(&f, &["gc", "--keep", "1"]);
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(stderr.contains("locked"), "{stderr}");
    assert!(stderr.contains("a run in progress"), "{stderr}");
    assert!(!stderr.contains("--wait-lock"), "{stderr}");
    assert!(stdout.contains("0 of 2 runs deleted"), "{stdout}");
    assert_eq!(f.runs().len(), 2);
}

#[test]
fn a_run_dated_in_the_future_is_never_latest_and_gc_neither_counts_nor_deletes_it() {
    // A night whose clock was ahead (a reset RTC) files a run dated 2099.
    let f = battery();
    let first = f.runs().pop().unwrap();
    let future = f.manifest_dir().join("20990101T000000.000Z-ffff");
    let text = std::fs::read_to_string(first.join("run.json")).unwrap();
    let mut run: serde_json::Value = serde_json::from_str(&text).unwrap();
    run["start"] = "2099-01-01T00:00:00.000Z".into();
    run["run_id"] = "20990101T000000.000Z-ffff".into();
    std::fs::write(first.join("run.json"), run.to_string()).unwrap();
    std::fs::rename(&first, &future).unwrap();
    assert_eq!(f.run(&[]).status.code(), Some(0));
    assert_eq!(f.run(&[]).status.code(), Some(0));
    let tonight = f.runs().into_iter().filter(|r| *r != future).max().unwrap();

    let ls = orch(&f, &["ls", "--format", "json"]);
    let rows: serde_json::Value = serde_json::from_slice(&ls.stdout).unwrap();
    assert_eq!(
        rows[0]["dir"].as_str().unwrap(),
        tonight.to_str().unwrap(),
        "the newest run of a right clock is the latest"
    );
    assert_eq!(rows[2]["id"], "20990101T000000.000Z-ffff", "listed last");
    let text = String::from_utf8_lossy(&orch(&f, &["ls"]).stdout).into_owned();
    assert!(
        text.lines()
            .last()
            .unwrap()
            .ends_with("(of unknown age: dated in the future or unparsable; listed last)"),
        "{text}"
    );
    let show = orch(&f, &["show", "latest", "--format", "json"]);
    let shown: serde_json::Value = serde_json::from_slice(&show.stdout).unwrap();
    assert_eq!(
        shown["run_id"].as_str().unwrap(),
        tonight.file_name().unwrap().to_str().unwrap()
    );

    let gc = orch(&f, &["gc", "--keep", "1"]);
    let out = String::from_utf8_lossy(&gc.stdout);
    assert_eq!(gc.status.code(), Some(0), "{out}");
    assert!(
        out.contains("20990101T000000.000Z-ffff: dated 2099-01-01T00:00:00.000Z, ahead of"),
        "{out}"
    );
    assert!(out.contains("1 of 3 runs deleted"), "{out}");
    assert!(tonight.join("run.json").is_file(), "tonight's run is kept");
    assert!(
        future.join("run.json").is_file(),
        "the future run is not deleted"
    );
    assert_eq!(f.runs().len(), 2);
}

#[test]
fn runs_of_unknown_age_are_never_latest_or_previous_and_gc_keeps_the_real_ones() {
    // The oldest run's start garbled, the next one dated 2099; one real run after them.
    let f = battery();
    assert_eq!(f.run(&[]).status.code(), Some(0));
    let edit = |dir: &std::path::Path, start: &str| {
        let text = std::fs::read_to_string(dir.join("run.json")).unwrap();
        let mut run: serde_json::Value = serde_json::from_str(&text).unwrap();
        run["start"] = start.into();
        std::fs::write(dir.join("run.json"), run.to_string()).unwrap();
    };
    let runs = f.runs();
    edit(&runs[0], "zzz");
    edit(&runs[1], "2099-01-01T00:00:00.000Z");
    // With no real run, neither latest nor previous exists.
    let show = orch(&f, &["show", "latest"]);
    assert_ne!(show.status.code(), Some(0));
    assert_eq!(f.run(&[]).status.code(), Some(0));
    let real = f.runs().into_iter().find(|r| !runs.contains(r)).unwrap();
    let shown: serde_json::Value =
        serde_json::from_slice(&orch(&f, &["show", "latest", "--format", "json"]).stdout).unwrap();
    assert_eq!(
        shown["run_id"].as_str().unwrap(),
        real.file_name().unwrap().to_str().unwrap()
    );
    let previous = orch(&f, &["show", "previous"]);
    assert_ne!(
        previous.status.code(),
        Some(0),
        "a run of unknown age is no previous run"
    );
    let gc = orch(&f, &["gc", "--keep", "1"]);
    let out = String::from_utf8_lossy(&gc.stdout);
    assert!(
        out.contains("its start time \"zzz\" does not parse"),
        "{out}"
    );
    assert!(out.contains("0 of 3 runs deleted"), "{out}");
    assert_eq!(f.runs().len(), 3);
}

#[test]
fn a_reader_whose_pipe_closes_ends_quietly() {
    use std::io::{BufRead, BufReader};
    // Enough cells that each command prints more than a pipe holds (64 KiB).
    let values: Vec<String> = (0..600).map(|i| format!("\"{i:04}\"")).collect();
    let f = Fixture::new(&format!(
        "schema = 1\nname = \"wide\"\n[[arm]]\nid = \"a-rather-long-arm-name-for-wide-lines\"\n\
         run = [\"true\"]\nmatrix = {{ i = [{}] }}\n",
        values.join(", ")
    ));
    for _ in 0..2 {
        assert_eq!(f.run(&["--jobs", "2"]).status.code(), Some(0));
    }
    for args in [&["history"][..], &["ls"], &["show", "latest"]] {
        let mut child = Command::new(env!("CARGO_BIN_EXE_memra-orch"))
            .args(args)
            .arg("--receipts")
            .arg(f.path().join("receipts"))
            .current_dir(f.path())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut first = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut first)
            .unwrap();
        // The reader goes after one line, as `| head -1` does.
        let out = child.wait_with_output().unwrap();
        let said = String::from_utf8_lossy(&out.stderr);
        assert!(!said.contains("panicked"), "{args:?}: {said}");
    }
}
