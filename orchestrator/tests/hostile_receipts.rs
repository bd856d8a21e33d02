//! What a gate (or another user) can plant under the receipts folder or a report's folder,
//! with real links and FIFOs: the report never writes or deletes through a link at `cells`
//! or `runs`, and a FIFO or a link in place of the history index hangs nothing and is never
//! written through.

use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use crate::run_support::{Fixture, logged};

fn orch(f: &Fixture, args: &[&str]) -> Output {
    logged(
        Command::new(env!("CARGO_BIN_EXE_memra-orch"))
            .args(args)
            .arg("--receipts")
            .arg(f.path().join("receipts"))
            .current_dir(f.path())
            .output()
            .unwrap(),
    )
}

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
    let index = f.path().join("receipts/.memra-index/h.jsonl");
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
    let index = f.path().join("receipts/.memra-index/h.jsonl");
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
