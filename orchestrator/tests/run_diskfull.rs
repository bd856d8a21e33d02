//! A full disk is its own outcome: a run whose receipts live on a 20 MB tmpfs that a gate
//! fills stops starting cells, says `error: disk full at …` for the cell that hit it,
//! finalizes run.json, leaves no temporary files, exits 74, and keeps an earlier run's tree
//! intact. Mounting a tmpfs needs root (CI runs as root); elsewhere the test says it
//! skipped.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::run_support::{Fixture, files_under, logged, read_json};

/// A tmpfs of `size` mounted at a fresh folder, unmounted on drop.
struct Tmpfs {
    dir: tempfile::TempDir,
}

impl Tmpfs {
    fn mount(size: &str) -> Option<Tmpfs> {
        let dir = tempfile::tempdir().ok()?;
        let ok = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir.path())
            .status()
            .is_ok_and(|s| s.success());
        ok.then_some(Tmpfs { dir })
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(self.dir.path()).status();
    }
}

const FILLS: &str = r#"
schema = 1
name = "full"

[defaults]
gpus = 0

[[arm]]
id = "small"
run = ["{gates}/pass.sh"]

[[arm]]
id = "fill"
needs = ["small"]
run = ["sh", "-c", "dd if=/dev/zero of=$MEMRA_ORCH_ARTIFACTS/big bs=1M count=64 2>/dev/null; exit 1"]

[[arm]]
id = "tail"
needs = ["fill"]
run = ["{gates}/pass.sh"]

[[arm]]
id = "later"
needs = ["small"]
run = ["{gates}/pass.sh"]
"#;

#[test]
fn a_run_that_fills_the_disk_ends_disk_full_with_a_final_run_json() {
    let Some(fs) = Tmpfs::mount("20m") else {
        eprintln!("skipped: cannot mount a tmpfs here (needs root)");
        return;
    };
    let f = Fixture::new(FILLS);
    let receipts = fs.path().join("receipts");
    let run = |extra: &[&str]| {
        logged(
            Command::new(env!("CARGO_BIN_EXE_memra-orch"))
                .arg("run")
                .arg(f.path().join("manifest.toml"))
                .arg("--receipts")
                .arg(&receipts)
                .args([
                    "--commit",
                    crate::run_support::COMMIT,
                    "--progress",
                    "plain",
                ])
                .args(["-j", "1"])
                .args(extra)
                .current_dir(f.path())
                .output()
                .unwrap(),
        )
    };
    // An earlier run, of the cells that fit.
    assert_eq!(run(&["--filter", "later"]).status.code(), Some(0));
    let manifest_dir = receipts.join(crate::run_support::COMMIT).join("full");
    let earlier = crate::run_support::newest_run(&manifest_dir);
    let before: Vec<(PathBuf, Vec<u8>)> = files_under(&earlier)
        .into_iter()
        .map(|p| {
            let b = crate::run_support::read_bytes(&p).unwrap();
            (p, b)
        })
        .collect();

    let out = run(&[]);
    assert_eq!(out.status.code(), Some(74), "the disk-full exit code");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("the disk is full at"), "{stderr}");
    let tree = crate::run_support::newest_run(&manifest_dir);
    assert_ne!(tree, earlier);
    let run_json = read_json(&tree.join("run.json"));
    assert!(
        run_json["end"].is_string(),
        "run.json is final: {run_json:#}"
    );
    assert_eq!(run_json["verdict"], "fail");
    assert!(run_json["disk_full"].is_string(), "{run_json:#}");
    let entry = |id: &str| {
        run_json["nodes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|n| n["id"] == id)
            .unwrap_or_else(|| panic!("{id} in {run_json:#}"))
            .clone()
    };
    let fill = entry("fill");
    assert_eq!(fill["verdict"], "error", "{fill:#}");
    assert!(
        fill["reason"].as_str().unwrap().contains("disk full at"),
        "{fill:#}"
    );
    // Nothing started after the disk filled: `later` (ready, independent) never ran; its
    // receipt could not be written either, so the index says so.
    assert!(!stderr.contains("start    later"), "{stderr}");
    let later = entry("later");
    assert_ne!(later["verdict"], "pass", "{later:#}");
    assert!(
        later["reason"].as_str().unwrap().contains("disk"),
        "{later:#}"
    );
    assert_ne!(entry("tail")["verdict"], "pass");
    assert!(tree.join("summary.md").is_file());
    for p in files_under(fs.path()) {
        let name = p.file_name().unwrap().to_string_lossy();
        assert!(
            !name.contains(".tmp.") && name != ".reserve",
            "left behind: {}",
            p.display()
        );
    }
    for (p, b) in &before {
        assert_eq!(
            &crate::run_support::read_bytes(p).unwrap(),
            b,
            "{} changed",
            p.display()
        );
    }
}

#[test]
fn a_report_that_fills_the_disk_says_the_disk_is_full() {
    let Some(fs) = Tmpfs::mount("16k") else {
        eprintln!("skipped: cannot mount a tmpfs here (needs root)");
        return;
    };
    let f = Fixture::new(
        "schema = 1\nname = \"h\"\n[[arm]]\nid = \"a\"\ngpus = 0\nrun = [\"{gates}/pass.sh\"]\n",
    );
    assert_eq!(f.run(&[]).status.code(), Some(0));
    let site = fs.path().join("site");
    let out = crate::run_support::orch(&f, &["report", "--html", site.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(74),
        "the disk-full exit code: {stderr}"
    );
    assert!(
        stderr.contains("the disk is full (No space left on device")
            && stderr.contains("free space there and run memra-orch report again"),
        "{stderr}"
    );
    assert!(!stderr.contains("receipt folder"), "{stderr}");
    // Room again: the next report takes the half-written folder as its own.
    let grown = Command::new("mount")
        .args(["-o", "remount,size=4m"])
        .arg(fs.path())
        .status()
        .unwrap();
    assert!(grown.success());
    let out = crate::run_support::orch(&f, &["report", "--html", site.to_str().unwrap()]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn a_report_whose_marker_could_not_be_written_is_taken_up_again_with_room() {
    let Some(fs) = Tmpfs::mount("64k") else {
        eprintln!("skipped: cannot mount a tmpfs here (needs root)");
        return;
    };
    let f = Fixture::new(
        "schema = 1\nname = \"h\"\n[[arm]]\nid = \"a\"\ngpus = 0\nrun = [\"{gates}/pass.sh\"]\n",
    );
    assert_eq!(f.run(&[]).status.code(), Some(0));
    // The disk is full before the report starts: its folders are made, its marker is not.
    let filler = fs.path().join("filler");
    let _ = Command::new("dd")
        .args(["if=/dev/zero", "bs=4k", "count=1024"])
        .arg(format!("of={}", filler.display()))
        .stderr(std::process::Stdio::null())
        .status();
    let site = fs.path().join("site");
    let out = crate::run_support::orch(&f, &["report", "--html", site.to_str().unwrap()]);
    assert_eq!(
        out.status.code(),
        Some(74),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!site.join("memra-report.json").exists());
    std::fs::remove_file(&filler).unwrap();
    let out = crate::run_support::orch(&f, &["report", "--html", site.to_str().unwrap()]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
