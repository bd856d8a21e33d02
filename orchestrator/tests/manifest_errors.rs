//! Every class of manifest problem gives one clear, located error, all problems of a file are
//! reported at once, and the exit code is 2 (nothing runs). Runs the real binary against the
//! fixtures in `fixtures/manifests/bad`, copied to a folder outside any git checkout so the
//! root (and so env-matrix paths) is that folder.

use std::path::Path;
use std::process::Command;

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

fn fixtures() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    copy_dir(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/manifests/bad"),
        dir.path(),
    );
    dir
}

/// Runs `memra-orch validate FILES…` in `dir`; returns (exit code, stdout, stderr) with the
/// folder's path replaced by `[DIR]`.
fn validate(dir: &Path, files: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_memra-orch"))
        .arg("validate")
        .args(files)
        .current_dir(dir)
        .output()
        .unwrap();
    let clean =
        |b: &[u8]| String::from_utf8_lossy(b).replace(&dir.to_string_lossy().into_owned(), "[DIR]");
    (
        out.status.code().unwrap_or(-1),
        clean(&out.stdout),
        clean(&out.stderr),
    )
}

/// Checks one bad fixture: exit 2, exactly `problems` errors, and the rendered text.
fn bad(file: &str, problems: usize) -> String {
    let dir = fixtures();
    let (code, stdout, stderr) = validate(dir.path(), &[file]);
    assert_eq!(code, 2, "{stderr}");
    assert!(stdout.is_empty(), "{stdout}");
    let located = stderr
        .lines()
        .filter(|l| l.trim_start().starts_with("--> "))
        .count();
    assert_eq!(located, problems, "{stderr}");
    let summary = if problems == 1 {
        "1 problem found".to_string()
    } else {
        format!("{problems} problems found")
    };
    assert!(stderr.contains(&summary), "{stderr}");
    stderr
}

#[test]
fn typo_key() {
    let e = bad("typo-key.toml", 1);
    assert!(e.contains("typo-key.toml:7:1"));
    insta::assert_snapshot!(e);
}

#[test]
fn typo_key_in_require() {
    let e = bad("require-typo.toml", 1);
    assert!(e.contains("require-typo.toml:5:1"), "{e}");
    assert!(e.contains("unknown key `gpu` in [require]"), "{e}");
    assert!(e.contains("did you mean `gpus`?"), "{e}");
    insta::assert_snapshot!(e);
}

#[test]
fn wrong_type() {
    insta::assert_snapshot!(bad("wrong-type.toml", 1));
}

#[test]
fn toml_syntax() {
    let e = bad("toml-syntax.toml", 1);
    assert!(e.contains("toml-syntax.toml:6:26"), "{e}");
    insta::assert_snapshot!(e);
}

#[test]
fn duplicate_id() {
    insta::assert_snapshot!(bad("duplicate-id.toml", 1));
}

#[test]
fn unknown_need() {
    let e = bad("unknown-need.toml", 1);
    assert!(e.contains("did you mean `build`?"));
    insta::assert_snapshot!(e);
}

#[test]
fn cycle_is_named_in_order() {
    let e = bad("cycle.toml", 1);
    assert!(e.contains("dependency cycle: a → c → b → a"), "{e}");
    insta::assert_snapshot!(e);
}

#[test]
fn undefined_variable() {
    insta::assert_snapshot!(bad("undefined-variable.toml", 2));
}

#[test]
fn missing_env_matrix_file() {
    let e = bad("missing-env-matrix.toml", 1);
    assert!(e.contains("[DIR]/env-matrices/equalised.toml"), "{e}");
    insta::assert_snapshot!(e);
}

#[test]
fn problems_inside_an_env_matrix_file_point_into_it() {
    let e = bad("bad-env-matrix-file.toml", 2);
    assert!(e.contains("env-matrices/broken.toml:6:1"), "{e}");
    assert!(e.contains("env-matrices/broken.toml:7:3"), "{e}");
    insta::assert_snapshot!(e);
}

#[test]
fn bad_schema() {
    insta::assert_snapshot!(bad("bad-schema.toml", 1));
}

#[test]
fn bad_name() {
    insta::assert_snapshot!(bad("bad-name.toml", 1));
}

#[test]
fn compare_pairing_ambiguity() {
    let e = bad("compare-ambiguous.toml", 2);
    assert!(e.contains("`cand[batch=4]` matches 2 cells"), "{e}");
    assert!(e.contains("`cand[batch=16]` matches no cell"), "{e}");
    insta::assert_snapshot!(e);
}

#[test]
fn every_problem_of_a_file_is_reported_at_once() {
    let e = bad("many-errors.toml", 13);
    insta::assert_snapshot!(e);
}

#[test]
fn validate_checks_every_file_given() {
    let dir = fixtures();
    std::fs::write(
        dir.path().join("ok.toml"),
        "schema = 1\nname = \"ok\"\n[[arm]]\nid = \"a\"\nrun = [\"gate\"]\n",
    )
    .unwrap();
    let (code, stdout, stderr) = validate(
        dir.path(),
        &["ok.toml", "cycle.toml", "bad-name.toml", "absent.toml"],
    );
    assert_eq!(code, 2);
    assert_eq!(stdout, "ok: ok.toml (1 nodes, 1 cells)\n");
    assert!(stderr.contains("cycle.toml:6:10"));
    assert!(stderr.contains("bad-name.toml:2:8"));
    assert!(stderr.contains("cannot read manifest"), "{stderr}");
    let (code, _, _) = validate(dir.path(), &["ok.toml"]);
    assert_eq!(code, 0);
}

#[test]
fn no_prefix_of_a_manifest_makes_the_loader_panic() {
    // Every truncation of a valid manifest is either valid or a set of located diagnostics;
    // none may panic (bad input is never a crash).
    let dir = tempfile::tempdir().unwrap();
    copy_dir(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/manifests/good"),
        dir.path(),
    );
    let text = std::fs::read_to_string(dir.path().join("nightly.toml")).unwrap();
    let path = dir.path().join("cut.toml");
    let mut failures = 0;
    for (end, _) in text.char_indices().step_by(3) {
        std::fs::write(&path, &text[..end]).unwrap();
        if let Err(d) = memra_orch::load::load_plan(&path) {
            failures += 1;
            assert!(!d.is_empty());
            for diag in &d.0 {
                assert!(!diag.message.is_empty());
                assert!(
                    diag.help.is_some(),
                    "every diagnostic says how to fix it: {diag}"
                );
            }
        }
    }
    assert!(failures > 0);
}

#[test]
fn nul_bytes_in_vars_argv_and_env_are_located() {
    let e = bad("nul-byte.toml", 3);
    assert!(e.contains("nul-byte.toml:5:9"), "{e}");
    assert!(e.contains("nul-byte.toml:9:16"), "{e}");
    assert!(e.contains("nul-byte.toml:10:27"), "{e}");
    assert!(e.contains("holds a NUL byte"), "{e}");
    insta::assert_snapshot!(e);
}

#[test]
fn pins_of_the_orchestrators_own_variables_are_refused() {
    let e = bad("reserved-pin.toml", 4);
    assert!(e.contains("reserved-pin.toml:5:1"), "{e}");
    assert!(e.contains("`TMPDIR` is set by memra-orch"), "{e}");
    assert!(e.contains("`MEMRA_ORCH_NODE` is set by memra-orch"), "{e}");
    assert!(e.contains("env-matrices/reserved.toml:2:1"), "{e}");
    insta::assert_snapshot!(e);
}
