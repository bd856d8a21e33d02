//! Declared inputs (`inputs = [globs]`): the matched files join a cell's inputs digest, so
//! `run --resume` reruns a cell whose files changed and keeps the others; the receipt lists
//! the files; `plan` shows the globs; a glob that cannot be used is a located manifest error.

use std::process::Command;

use crate::run_support::{Fixture, validate};
use memra_orch::receipt::sha256_hex;

/// Every arm appends a line to `runs-<id>` in the root each time it really runs, so the
/// count of lines says how often it ran.
const MANIFEST: &str = r#"
schema = 1
name = "declared"

[defaults]
gpus = 0
shell = true

[[arm]]
id = "with-inputs"
inputs = ["lib/*.py"]
run = "echo ran >> runs-with-inputs && {gates}/pass.sh"

[[arm]]
id = "without"
run = "echo ran >> runs-without && {gates}/pass.sh"
"#;

fn runs(f: &Fixture, id: &str) -> usize {
    std::fs::read_to_string(f.path().join(format!("runs-{id}"))).map_or(0, |s| s.lines().count())
}

fn write(f: &Fixture, rel: &str, text: &str) {
    let p = f.path().join(rel);
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(p, text).unwrap();
}

#[test]
fn resume_reruns_a_cell_whose_declared_inputs_changed_and_keeps_the_rest() {
    let f = Fixture::new(MANIFEST);
    write(&f, "lib/x.py", "print(1)\n");
    write(&f, "lib/y.txt", "not matched\n");
    assert_eq!(f.run(&[]).status.code(), Some(0));
    assert_eq!((runs(&f, "with-inputs"), runs(&f, "without")), (1, 1));

    // Nothing changed: nothing reruns.
    assert_eq!(f.run(&["--resume"]).status.code(), Some(0));
    assert_eq!((runs(&f, "with-inputs"), runs(&f, "without")), (1, 1));

    // A file the glob does not match changes nothing either.
    write(&f, "lib/y.txt", "still not matched\n");
    assert_eq!(f.run(&["--resume"]).status.code(), Some(0));
    assert_eq!((runs(&f, "with-inputs"), runs(&f, "without")), (1, 1));

    // The module changed: only the cell that declares it reruns.
    write(&f, "lib/x.py", "print(2)\n");
    assert_eq!(f.run(&["--resume"]).status.code(), Some(0));
    assert_eq!((runs(&f, "with-inputs"), runs(&f, "without")), (2, 1));

    // A new matching file is a change too.
    write(&f, "lib/z.py", "print(3)\n");
    assert_eq!(f.run(&["--resume"]).status.code(), Some(0));
    assert_eq!((runs(&f, "with-inputs"), runs(&f, "without")), (3, 1));

    // And then it is stable again.
    assert_eq!(f.run(&["--resume"]).status.code(), Some(0));
    assert_eq!((runs(&f, "with-inputs"), runs(&f, "without")), (3, 1));
}

#[test]
fn the_receipt_lists_the_matched_files_and_only_when_inputs_are_declared() {
    let f = Fixture::new(MANIFEST);
    write(&f, "lib/b.py", "bee\n");
    write(&f, "lib/a.py", "a\n");
    write(
        &f,
        "lib/deep/c.py",
        "not matched: `*` stays in one folder\n",
    );
    assert_eq!(f.run(&[]).status.code(), Some(0));
    let r = f.receipt("with-inputs");
    assert_eq!(
        r["input_files"],
        serde_json::json!([
            {"path": "lib/a.py", "bytes": 2, "sha256": sha256_hex(b"a\n")},
            {"path": "lib/b.py", "bytes": 4, "sha256": sha256_hex(b"bee\n")},
        ])
    );
    let without = f.receipt("without");
    assert!(without.get("input_files").is_none(), "{without:#}");

    // `show` lists them too.
    let out = Command::new(env!("CARGO_BIN_EXE_memra-orch"))
        .args(["show", "latest", "with-inputs", "--receipts"])
        .arg(f.path().join("receipts"))
        .current_dir(f.path())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains(&format!(
            "input:     lib/a.py (2 bytes, sha256 {})",
            sha256_hex(b"a\n")
        )),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn files_a_setup_writes_are_seen_by_the_cells_after_it() {
    // `early` expands the glob before `gen` writes `lib/gen.py`; `late`, which runs after
    // `gen`, must not be handed that earlier list.
    let f = Fixture::new(
        r#"
schema = 1
name = "generated"

[defaults]
gpus = 0
inputs = ["lib/**/*.py"]

[[arm]]
id = "early"
run = ["{gates}/pass.sh"]

[[setup]]
id = "gen"
needs = ["early"]
shell = true
run = "mkdir -p lib/out && echo generated > lib/out/gen.py && {gates}/pass.sh"

[[arm]]
id = "late"
needs = ["gen"]
run = ["{gates}/pass.sh"]
"#,
    );
    write(&f, "lib/x.py", "x\n");
    assert_eq!(f.run(&["--jobs", "1"]).status.code(), Some(0));
    let paths = |id: &str| -> Vec<String> {
        f.receipt(id)["input_files"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d["path"].as_str().unwrap().to_string())
            .collect()
    };
    assert_eq!(paths("early"), ["lib/x.py"]);
    assert_eq!(paths("late"), ["lib/out/gen.py", "lib/x.py"]);
}

#[test]
fn plan_shows_the_globs() {
    let f = Fixture::new(MANIFEST);
    let plan = |format: &str| {
        let out = Command::new(env!("CARGO_BIN_EXE_memra-orch"))
            .args(["plan", "manifest.toml", "--format", format])
            .current_dir(f.path())
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        String::from_utf8(out.stdout).unwrap()
    };
    let text = plan("text");
    assert!(text.contains("       inputs: lib/*.py\n"), "{text}");
    assert_eq!(text.matches("inputs:").count(), 1, "{text}");
    let json: serde_json::Value = serde_json::from_str(&plan("json")).unwrap();
    let cells = json["cells"].as_array().unwrap();
    assert_eq!(cells[0]["inputs"], serde_json::json!(["lib/*.py"]));
    assert!(cells[1].get("inputs").is_none(), "{:#}", cells[1]);
}

fn manifest_with(inputs: &str, defaults: &str) -> String {
    format!(
        "schema = 1\nname = \"bad-inputs\"\n\n[defaults]\n{defaults}\n[[arm]]\nid = \"a\"\nrun = [\"true\"]\ninputs = {inputs}\n"
    )
}

#[test]
fn a_glob_that_does_not_parse_is_a_located_error() {
    let (code, e) = validate(&manifest_with(r#"["lib/*.py", "lib/[*.py"]"#, ""));
    assert_eq!(code, 2, "{e}");
    assert!(e.contains("m.toml:9:23"), "{e}");
    assert!(e.contains("1 problem found"), "{e}");
    insta::assert_snapshot!(e);
}

#[test]
fn external_globs_are_accepted_and_dot_dot_only_leads() {
    // Absolute globs and globs led by `..` name files outside the repository (the engine
    // under test, installed with pip); `..` anywhere else is an error.
    let (code, e) = validate(&manifest_with(
        r#"["/opt/venv/lib/python3.11/site-packages/llama_cpp/**", "../llama.cpp/src/*.c"]"#,
        "",
    ));
    assert_eq!(code, 0, "{e}");
    let (code, e) = validate(&manifest_with(r#"["lib/../../y", "../a/../x"]"#, ""));
    assert_eq!(code, 2, "{e}");
    assert!(e.contains("m.toml:9:11"), "{e}");
    assert!(
        e.contains("`inputs` entry \"lib/../../y\" has `..` after its first components"),
        "{e}"
    );
    assert!(
        e.contains("`inputs` entry \"../a/../x\" has `..` after its first components"),
        "{e}"
    );
    assert!(e.contains("2 problems found"), "{e}");
}

#[test]
fn a_bad_default_glob_is_reported_once_and_compares_accept_inputs() {
    let text = format!(
        "{}\n[[arm]]\nid = \"b\"\nrun = [\"true\"]\n",
        manifest_with(r#"["ok/*.py"]"#, "inputs = [\"a/../../x\"]\n")
    );
    let (code, e) = validate(&text);
    assert_eq!(code, 2, "{e}");
    assert!(e.contains("m.toml:5:11"), "{e}");
    assert!(e.contains("1 problem found"), "{e}");

    let (code, e) = validate(
        "schema = 1\nname = \"cmp\"\n[[setup]]\nid = \"s\"\nrun = [\"true\"]\ninputs = [\"a/*\"]\n[[arm]]\nid = \"r\"\nrun = [\"true\"]\n[[arm]]\nid = \"c\"\nrun = [\"true\"]\n[[compare]]\nid = \"x\"\nreference = \"r\"\ncandidates = [\"c\"]\nartifact = \"logits.safetensors\"\ninputs = [\"tools/**/*.py\"]\n",
    );
    assert_eq!(code, 0, "{e}");
}

#[test]
fn inputs_must_be_an_array_of_strings() {
    let (code, e) = validate(&manifest_with(r#""lib/*.py""#, ""));
    assert_eq!(code, 2, "{e}");
    assert!(e.contains("`inputs` must be an array of strings"), "{e}");
}
