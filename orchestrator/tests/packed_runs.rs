//! Packed runs, as a user of a foreign engine meets them: a Python gate's nights are filed as
//! one `nodes.zip` each, and `diff` (tensor by tensor), `show --log`, `--rerun-failed`,
//! `history` and `gc` read them as they read trees; the archive is a plain zip any tool
//! reads; `gc` keeps the store's objects a kept archive links to; `gc --pack` packs a run
//! filed with `--no-pack`.

use std::path::Path;
use std::process::Command;

use serde_json::Value;

use crate::run_support::{Fixture, logged, orch};

/// One Python arm writing BF16 logits perturbed as `perturb` says, and one that fails when
/// `fail` is set.
fn manifest(py: &Path, perturb: &str, fail: bool) -> String {
    let gate = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/python/logits_gate.py");
    format!(
        "schema = 1\nname = \"packed\"\n[defaults]\ngpus = 0\ntimeout = \"2m\"\n\n\
         [[arm]]\nid = \"llama\"\nrun = [\"{}\", \"{}\"]\nenv = {{ GATE_PERTURB = \"{perturb}\" }}\n\n\
         [[arm]]\nid = \"other\"\nrun = [\"{{gates}}/{}\"]\n",
        py.display(),
        gate.display(),
        if fail { "fail.sh" } else { "pass.sh" }
    )
}

fn rewrite(f: &Fixture, text: &str) {
    let text = text.replace("{gates}", &crate::run_support::gates().to_string_lossy());
    std::fs::write(f.path().join("manifest.toml"), text).unwrap();
}

/// Every value of `key` anywhere in `v`.
fn values_of<'a>(v: &'a Value, key: &str, out: &mut Vec<&'a Value>) {
    match v {
        Value::Object(m) => {
            for (k, x) in m {
                if k == key {
                    out.push(x);
                }
                values_of(x, key, out);
            }
        }
        Value::Array(a) => a.iter().for_each(|x| values_of(x, key, out)),
        _ => {}
    }
}

#[test]
fn a_python_gates_packed_nights_read_as_their_trees_did() {
    let py = crate::python_gates::python().to_path_buf();
    let f = Fixture::new(&manifest(&py, "none", false));
    assert_eq!(logged(f.run(&[])).status.code(), Some(0));
    let first = f.tree();
    assert!(first.join("nodes.zip").is_file(), "{}", first.display());
    assert!(!first.join("nodes").exists());
    // Five entries per run, whatever the cells wrote.
    let entries: Vec<String> = std::fs::read_dir(&first)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(entries.len(), 4, "{entries:?}");

    // A plain zip: Python's zipfile lists it, reads a log, and sees the stored artifact as
    // a link into the store.
    let slug = f.run_json()["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["id"] == "llama")
        .unwrap()["slug"]
        .as_str()
        .unwrap()
        .to_string();
    let script = format!(
        "import zipfile,stat\nz=zipfile.ZipFile({:?})\n\
         print(z.read('nodes/{slug}/attempt-1/checks.jsonl').decode().splitlines()[0])\n\
         i=z.getinfo('nodes/{slug}/attempt-1/artifacts/logits.safetensors')\n\
         print('link' if stat.S_ISLNK(i.external_attr>>16) else 'file', z.read(i).decode())\n",
        first.join("nodes.zip").display().to_string()
    );
    let out = Command::new(&py).args(["-c", &script]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("\"check\""), "{text}");
    // From `nodes/<slug>/attempt-1/artifacts/`: up 4 to the run folder, 3 to the receipts.
    assert!(
        text.contains("link ../../../../../../../.memra-store/"),
        "{text}"
    );

    // Night 2: one BF16 element one ulp up, and a cell that fails.
    rewrite(&f, &manifest(&py, "ulp", true));
    assert_eq!(f.run(&[]).status.code(), Some(1));
    let second = f.tree();
    assert_ne!(first, second);

    // `diff` reads both nights' artifacts out of their archives, tensor by tensor.
    let d = orch(&f, &["diff", "previous", "latest", "--format", "json"]);
    let v: Value = serde_json::from_slice(&d.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&d.stdout)));
    let mut ulps = Vec::new();
    values_of(&v, "max_ulp", &mut ulps);
    assert!(ulps.contains(&&Value::from(1)), "{v:#}");
    let mut differ = Vec::new();
    values_of(&v, "differ", &mut differ);
    assert!(differ.contains(&&Value::from(1)), "{v:#}");
    let text =
        String::from_utf8_lossy(&orch(&f, &["diff", "previous", "latest"]).stdout).into_owned();
    assert!(text.contains("other"), "{text}");

    // The report reads how far they moved out of the archives too, and plots it.
    let site = f.path().join("site");
    let r = orch(&f, &["report", "--html", site.to_str().unwrap()]);
    assert_eq!(r.status.code(), Some(0), "{r:?}");
    let plotted = std::fs::read_dir(site.join("cells"))
        .unwrap()
        .flatten()
        .map(|e| std::fs::read_to_string(e.path()).unwrap())
        .filter(|page| page.contains("data-moved=\"values that differ\""))
        .count();
    assert_eq!(plotted, 1, "the llama cell's page plots its moved values");

    // `show` names the folder inside the archive and prints its logs.
    let show = orch(&f, &["show", "latest", "other"]);
    let text = String::from_utf8_lossy(&show.stdout);
    assert!(text.contains("in the archive"), "{text}");
    let log = orch(&f, &["show", "latest", "llama", "--log", "checks"]);
    assert_eq!(log.status.code(), Some(0));
    assert!(
        String::from_utf8_lossy(&log.stdout).contains("\"finite\""),
        "{log:?}"
    );
    let none = orch(
        &f,
        &[
            "show",
            "latest",
            "llama",
            "--log",
            "stdout",
            "--attempt",
            "9",
        ],
    );
    assert_eq!(none.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&none.stderr).contains("no attempt 9; it has 1"),
        "{none:?}"
    );

    // A rerun of the failed cell carries the other from the packed night, and its receipt
    // reads through the archive of the run that measured it.
    rewrite(&f, &manifest(&py, "ulp", false));
    assert_eq!(logged(f.run(&["--rerun-failed"])).status.code(), Some(0));
    let rerun = f.tree();
    let shown = orch(&f, &["show", "latest", "llama"]);
    let text = String::from_utf8_lossy(&shown.stdout);
    assert!(text.contains("carried:   from run"), "{text}");
    let log = orch(&f, &["show", "latest", "llama", "--log", "checks"]);
    assert_eq!(log.status.code(), Some(0), "{log:?}");

    // History, from a rebuilt index: the index is a cache, the archives the truth.
    std::fs::remove_dir_all(f.path().join("receipts/.memra-index")).unwrap();
    let h = orch(&f, &["history", "llama"]);
    let text = String::from_utf8_lossy(&h.stdout);
    assert_eq!(
        text.lines().filter(|l| l.contains(" pass")).count(),
        3,
        "{text}"
    );

    // gc --keep 1 keeps the rerun (newest and green) and the night it carries from; the
    // first night goes, and with it the one object only its archive linked to (its
    // unperturbed logits). Every object a kept archive links to stays.
    let gc = orch(&f, &["gc", "--keep", "1"]);
    assert_eq!(gc.status.code(), Some(0), "{gc:?}");
    assert!(rerun.is_dir() && second.is_dir() && !first.exists());
    assert!(
        String::from_utf8_lossy(&gc.stdout).contains("removed 1 stored artifact "),
        "{gc:?}"
    );
    let store = f.path().join("receipts/.memra-store");
    for run in [&second, &rerun] {
        for sha in memra_orch::gate::packed::links(&run.join("nodes.zip")).unwrap() {
            assert!(store.join(&sha[..2]).join(&sha).is_file(), "{sha}");
        }
    }
    let log = orch(&f, &["show", "latest", "llama", "--log", "checks"]);
    assert_eq!(log.status.code(), Some(0), "{log:?}");
}

#[test]
fn gc_pack_packs_a_run_filed_as_a_tree_and_leaves_a_run_in_progress() {
    let f = Fixture::new(
        "schema = 1\nname = \"later\"\n[defaults]\ngpus = 0\n\
         [[arm]]\nid = \"a\"\nrun = [\"{gates}/pass.sh\"]\n\
         [[arm]]\nid = \"b\"\nrun = [\"{gates}/logits.sh\"]\n",
    );
    assert_eq!(f.run(&["--no-pack"]).status.code(), Some(0));
    let tree = f.tree();
    assert!(tree.join("nodes").is_dir() && !tree.join("nodes.zip").exists());
    let before = orch(&f, &["show", "latest", "b", "--format", "json"]);
    // A dry run says so and changes nothing.
    let dry = orch(&f, &["gc", "--pack", "--dry-run"]);
    assert!(
        String::from_utf8_lossy(&dry.stdout).contains("would pack"),
        "{dry:?}"
    );
    assert!(tree.join("nodes").is_dir());
    // While the manifest folder is locked (a run in progress) the run is left alone.
    let lock = memra_orch::receipt::tree::RunLock::acquire(&f.manifest_dir()).unwrap();
    let held = orch(&f, &["gc", "--pack"]);
    assert_eq!(held.status.code(), Some(1), "{held:?}");
    assert!(tree.join("nodes").is_dir());
    drop(lock);
    let gc = orch(&f, &["gc", "--pack"]);
    assert_eq!(gc.status.code(), Some(0), "{gc:?}");
    assert!(
        String::from_utf8_lossy(&gc.stdout).contains("packed 1 run"),
        "{gc:?}"
    );
    assert!(!tree.join("nodes").exists() && tree.join("nodes.zip").is_file());
    // The receipt reads the same from the archive.
    let after = orch(&f, &["show", "latest", "b", "--format", "json"]);
    assert_eq!(before.stdout, after.stdout);
    // A tree holding a link is never packed, and says why.
    assert_eq!(f.run(&["--no-pack"]).status.code(), Some(0));
    let second = f.tree();
    std::os::unix::fs::symlink("/etc/passwd", second.join("nodes/planted")).unwrap();
    let refused = orch(&f, &["gc", "--pack"]);
    assert_eq!(refused.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("is a symbolic link"),
        "{refused:?}"
    );
    assert!(second.join("nodes").is_dir() && !second.join("nodes.zip").exists());
}
