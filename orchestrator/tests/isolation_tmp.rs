//! Attempt TMPDIRs are private: fresh (never reused, empty), mode 0700, with names nobody
//! can predict, below a run folder made the same way; a link planted where an earlier run's
//! folders were is never used; and removing a TMPDIR does not follow links the gate left
//! in it.

use std::path::{Path, PathBuf};

use crate::run_support::Fixture;

const MANIFEST: &str = r#"
schema = 1
name = "tmpdirs"

[[arm]]
id = "tmp"
run = ["{gates}/tmpdir.sh", "${root}/victim"]
gpus = 0
reps = 2
# Every rep records its own TMPDIR, so the reps' artifacts differ by design.
deterministic = false
"#;

/// What one rep of `tmpdir.sh` found.
#[derive(Debug)]
struct Seen {
    tmpdir: PathBuf,
    mode: String,
    parent_mode: String,
    entries: String,
    link: bool,
}

fn seen(f: &Fixture, attempt: u32) -> Seen {
    let dir = f.attempt_dir("tmp", attempt).join("artifacts");
    let read = |name: &str| {
        crate::run_support::read_text(&dir.join(name))
            .unwrap_or_else(|e| panic!("{name}: {e}"))
            .trim()
            .to_string()
    };
    Seen {
        tmpdir: PathBuf::from(read("tmpdir.txt")),
        mode: read("mode.txt"),
        parent_mode: read("parent-mode.txt"),
        entries: read("entries.txt"),
        link: dir.join("link.txt").exists(),
    }
}

/// Runs the fixture with `tmp` as memra-orch's TMPDIR; returns what both reps found.
fn run_in(f: &Fixture, tmp: &Path) -> [Seen; 2] {
    let out = f.command(&[]).env("TMPDIR", tmp).output().unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    [seen(f, 1), seen(f, 2)]
}

fn victim_is_intact(victim: &Path) {
    assert_eq!(
        std::fs::read_to_string(victim.join("keep")).ok().as_deref(),
        Some("precious"),
        "{} was emptied through a link",
        victim.display()
    );
}

#[test]
fn attempt_tmpdirs_are_fresh_private_and_never_followed_through_a_link() {
    let f = Fixture::new(MANIFEST);
    let tmp = f.path().join("tmp");
    std::fs::create_dir(&tmp).unwrap();
    // The folder each gate links into its TMPDIR: removing the TMPDIR must not empty it.
    let victim = f.path().join("victim");
    std::fs::create_dir(&victim).unwrap();
    std::fs::write(victim.join("keep"), "precious").unwrap();

    let first = run_in(&f, &tmp);
    for s in &first {
        assert!(!s.link, "{s:?}");
        assert_eq!(s.mode, "700", "{s:?}");
        assert_eq!(s.parent_mode, "700", "{s:?}");
        assert_eq!(s.entries, "0", "the TMPDIR was not empty: {s:?}");
        assert!(s.tmpdir.starts_with(&tmp), "{s:?}");
        assert!(!s.tmpdir.exists(), "{s:?} was not removed");
    }
    assert_ne!(first[0].tmpdir, first[1].tmpdir, "a TMPDIR was reused");
    let parent = first[0].tmpdir.parent().unwrap().to_path_buf();
    assert_eq!(parent, first[1].tmpdir.parent().unwrap());
    assert!(!parent.exists(), "the run's folder was not removed");
    victim_is_intact(&victim);

    // An attacker who saw the first run plants links where its folders were, each to a
    // folder of their own, and a link in place of the run folder to another.
    let planted = f.path().join("planted");
    std::fs::create_dir(&planted).unwrap();
    std::fs::write(planted.join("keep"), "precious").unwrap();
    let planted_root = f.path().join("planted-root");
    std::fs::create_dir(&planted_root).unwrap();
    for s in &first {
        std::os::unix::fs::symlink(&planted, planted_root.join(s.tmpdir.file_name().unwrap()))
            .unwrap();
    }
    std::os::unix::fs::symlink(&planted_root, &parent).unwrap();

    let second = run_in(&f, &tmp);
    for s in &second {
        assert!(!s.link, "the gate got a TMPDIR through a link: {s:?}");
        assert_eq!((s.mode.as_str(), s.entries.as_str()), ("700", "0"), "{s:?}");
        assert!(
            !s.tmpdir.starts_with(&parent) && !first.iter().any(|p| p.tmpdir == s.tmpdir),
            "{s:?} is a path of the first run"
        );
    }
    victim_is_intact(&victim);
    victim_is_intact(&planted);
    assert_eq!(
        std::fs::read_dir(&planted).unwrap().count(),
        1,
        "a gate wrote into the planted folder"
    );
    assert!(
        std::fs::symlink_metadata(&parent)
            .unwrap()
            .file_type()
            .is_symlink(),
        "the planted link was replaced"
    );
    // Only the planted link is left in the caller's TMPDIR: the second run removed its own.
    let left: Vec<_> = std::fs::read_dir(&tmp).unwrap().flatten().collect();
    assert_eq!(left.len(), 1, "{left:?}");
}
