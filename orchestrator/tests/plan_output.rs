//! `memra-orch plan` on the good fixture manifest: text in topological order, JSON that
//! holds every cell's substituted command, pins and needs, Graphviz DOT, and `--filter`.

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

/// Runs `memra-orch ARGS` on a copy of the good fixtures; (exit code, stdout with the
/// folder's path replaced by `[ROOT]`, stderr).
fn orch(args: &[&str]) -> (i32, String, String) {
    let dir = tempfile::tempdir().unwrap();
    copy_dir(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/manifests/good"),
        dir.path(),
    );
    let out = Command::new(env!("CARGO_BIN_EXE_memra-orch"))
        .args(args)
        .current_dir(dir.path())
        .output()
        .unwrap();
    let root = std::fs::canonicalize(dir.path())
        .unwrap()
        .to_string_lossy()
        .into_owned();
    let clean = |b: &[u8]| String::from_utf8_lossy(b).replace(&root, "[ROOT]");
    (
        out.status.code().unwrap_or(-1),
        clean(&out.stdout),
        clean(&out.stderr),
    )
}

#[test]
fn text_lists_cells_in_topological_order() {
    let (code, out, err) = orch(&["plan", "nightly.toml"]);
    assert_eq!(code, 0, "{err}");
    insta::assert_snapshot!(out);
}

#[test]
fn json_holds_substituted_cells() {
    let (code, out, err) = orch(&["plan", "nightly.toml", "--format", "json"]);
    assert_eq!(code, 0, "{err}");
    let p: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(p["version"], 1);
    assert_eq!(p["name"], "nightly");
    assert_eq!(p["root"], "[ROOT]");
    assert_eq!(p["inherit"], serde_json::json!(["PATH", "HOME"]));
    let cells = p["cells"].as_array().unwrap();
    assert_eq!(cells.len(), 15);
    let by_id = |id: &str| {
        cells
            .iter()
            .find(|c| c["id"] == id)
            .unwrap_or_else(|| panic!("no cell {id}"))
    };

    let build = by_id("build");
    assert_eq!(build["kind"], "setup");
    assert_eq!(build["gpus"], 0);
    assert_eq!(build["timeout_s"], 1800.0);
    assert_eq!(
        build["produces"],
        serde_json::json!(["[ROOT]/target/release/decode-batch-gate"])
    );

    let d8 = by_id("decode-batch[batch=8]");
    assert_eq!(
        d8["argv"],
        serde_json::json!([
            "[ROOT]/target/release/decode-batch-gate",
            "models/smollm2.gguf",
            "--batch",
            "8",
            "--out",
            "${artifacts}/logits.safetensors"
        ])
    );
    assert_eq!(
        d8["env"],
        serde_json::json!({"MEMRA_GATE_SEED": "0", "MEMRA_MMVQ": "0", "MEMRA_NO_FUSE_NORMQ": "1"})
    );
    assert_eq!(
        (
            d8["gpus"].as_u64(),
            d8["reps"].as_u64(),
            d8["retries"].as_u64()
        ),
        (Some(1), Some(2), Some(1))
    );
    assert_eq!(d8["needs"], serde_json::json!(["build"]));

    let pp = by_id("logits-pp[MEMRA_PP_DEVICES=\"1,0\",MEMRA_FA3=0,MEMRA_SERVE_B1FAST=1]");
    assert_eq!(pp["memory"], 16u64 << 30);
    assert_eq!(pp["argv"][0], "[ROOT]/target/release/logits-gate");
    assert_eq!(pp["argv"][3], pp["id"]);
    assert_eq!(pp["env"]["MEMRA_PP_STAGES"], "2");

    let canary = by_id("canary");
    assert_eq!(canary["shell"], true);
    assert_eq!(canary["expect"], "fail");
    assert_eq!(canary["env"]["MEMRA_GATE_CANARY"], "1");
    assert_eq!(canary["verdict"]["pass"], "^ALL GREEN");

    let compares: Vec<_> = cells.iter().filter(|c| c["kind"] == "compare").collect();
    assert_eq!(compares.len(), 5);
    let cmp = by_id("pp-vs-unsplit[candidate=logits-pp,MEMRA_PP_DEVICES=\"0,1\",MEMRA_FA3=1]");
    assert_eq!(cmp["compare"]["reference"], "logits-unsplit");
    assert_eq!(
        cmp["compare"]["candidate"],
        "logits-pp[MEMRA_PP_DEVICES=\"0,1\",MEMRA_FA3=1]"
    );
    assert_eq!(
        cmp["compare"]["policy"],
        serde_json::json!({"kind": "tolerance", "max_abs": 0.01, "max_rel": 0.01, "argmax": true})
    );
    assert_eq!(cmp["gpus"], 0);

    // `order` is topological: every cell comes after what it needs.
    let order: Vec<&str> = p["order"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    for c in cells {
        let at = order.iter().position(|o| *o == c["id"]).unwrap();
        for n in c["needs"].as_array().unwrap() {
            assert!(
                order.iter().position(|o| *o == n).unwrap() < at,
                "{} before {}",
                n,
                c["id"]
            );
        }
    }
}

#[test]
fn dot_is_a_graphviz_digraph() {
    let (code, out, _) = orch(&[
        "plan",
        "nightly.toml",
        "--format",
        "dot",
        "--filter",
        "pp-vs-unsplit*",
    ]);
    assert_eq!(code, 0);
    insta::assert_snapshot!(out);
}

#[test]
fn filters_select_cells_and_what_they_need() {
    let (code, out, _) = orch(&[
        "plan",
        "nightly.toml",
        "--format",
        "json",
        "--filter",
        "tag:canary",
    ]);
    assert_eq!(code, 0);
    let p: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(p["order"], serde_json::json!(["build", "canary"]));
    let (_, out, _) = orch(&[
        "plan",
        "nightly.toml",
        "--format",
        "json",
        "--filter",
        "decode-batch[batch=4]",
    ]);
    let p: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        p["order"],
        serde_json::json!(["build", "decode-batch[batch=4]"])
    );
    let (code, _, err) = orch(&["plan", "nightly.toml", "--filter", "decode-bach*"]);
    assert_eq!(code, 2);
    assert!(err.contains("matches no cell"), "{err}");
}

#[test]
fn validate_reports_counts() {
    let (code, out, _) = orch(&["validate", "nightly.toml"]);
    assert_eq!(code, 0);
    assert_eq!(out, "ok: nightly.toml (6 nodes, 15 cells)\n");
}

/// Writes one manifest into a fresh folder and returns its JSON plan, or the stderr of
/// a failed `plan`.
fn plan_of(manifest: &str) -> Result<serde_json::Value, String> {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("m.toml"), manifest).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_memra-orch"))
        .args(["plan", "m.toml", "--format", "json"])
        .current_dir(dir.path())
        .output()
        .unwrap();
    if out.status.success() {
        Ok(serde_json::from_slice(&out.stdout).unwrap())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

#[test]
fn compare_cells_pair_on_shared_axes() {
    let p = plan_of(
        r#"schema = 1
name = "pairs"
[[arm]]
id = "ref"
run = ["gate"]
matrix = { batch = ["4", "8"] }
[[arm]]
id = "cand"
run = ["gate"]
matrix = { batch = ["4", "8"], fa3 = ["0", "1"] }
[[arm]]
id = "report"
needs = ["cmp"]
run = ["report"]
[[compare]]
id = "cmp"
reference = "ref"
candidates = ["cand"]
artifact = "logits.safetensors"
policy = { argmax = true, min_agree = 0.95 }
"#,
    )
    .unwrap();
    let cells = p["cells"].as_array().unwrap();
    let compares: Vec<(String, String, String)> = cells
        .iter()
        .filter(|c| c["kind"] == "compare")
        .map(|c| {
            let s = |v: &serde_json::Value| v.as_str().unwrap().to_string();
            (
                s(&c["id"]),
                s(&c["compare"]["reference"]),
                s(&c["compare"]["candidate"]),
            )
        })
        .collect();
    let want = [
        (
            "cmp[candidate=cand,batch=4,fa3=0]",
            "ref[batch=4]",
            "cand[batch=4,fa3=0]",
        ),
        (
            "cmp[candidate=cand,batch=4,fa3=1]",
            "ref[batch=4]",
            "cand[batch=4,fa3=1]",
        ),
        (
            "cmp[candidate=cand,batch=8,fa3=0]",
            "ref[batch=8]",
            "cand[batch=8,fa3=0]",
        ),
        (
            "cmp[candidate=cand,batch=8,fa3=1]",
            "ref[batch=8]",
            "cand[batch=8,fa3=1]",
        ),
    ];
    let want: Vec<(String, String, String)> = want
        .iter()
        .map(|(a, b, c)| (a.to_string(), b.to_string(), c.to_string()))
        .collect();
    assert_eq!(compares, want);
    // `needs = ["cmp"]` means every compare cell; the report comes after all of them.
    let report = cells.iter().find(|c| c["id"] == "report").unwrap();
    assert_eq!(report["needs"].as_array().unwrap().len(), 4);
    assert_eq!(p["order"].as_array().unwrap().last().unwrap(), "report");
}

#[test]
fn defaults_apply_and_nodes_override_them() {
    let p = plan_of(
        r#"schema = 1
name = "defaults"
[defaults]
gpus = 2
timeout = "5m"
retries = 3
env = { A = "default", B = "default" }
tags = ["nightly"]
[[arm]]
id = "plain"
run = ["gate"]
[[arm]]
id = "own"
run = ["gate"]
gpus = 0
env = { B = "node" }
tags = ["quick"]
"#,
    )
    .unwrap();
    let plain = &p["cells"][0];
    assert_eq!(
        (
            plain["gpus"].as_u64(),
            plain["timeout_s"].as_f64(),
            plain["retries"].as_u64()
        ),
        (Some(2), Some(300.0), Some(3))
    );
    assert_eq!(plain["tags"], serde_json::json!(["nightly"]));
    let own = &p["cells"][1];
    assert_eq!(own["gpus"], 0);
    assert_eq!(own["env"], serde_json::json!({"A": "default", "B": "node"}));
    assert_eq!(own["tags"], serde_json::json!(["quick"]));
}

#[test]
fn root_is_the_git_top_level() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join(".git")).unwrap();
    std::fs::create_dir_all(dir.path().join("manifests")).unwrap();
    std::fs::create_dir_all(dir.path().join("env-matrices")).unwrap();
    std::fs::write(
        dir.path().join("env-matrices/eq.toml"),
        "[pins]\nX = \"1\"\n",
    )
    .unwrap();
    std::fs::write(
        dir.path().join("manifests/m.toml"),
        "schema = 1\nname = \"r\"\n[[arm]]\nid = \"a\"\nrun = [\"bin/gate\", \"${root}\"]\nenv_matrix = [\"env-matrices/eq.toml\"]\ncwd = \"work\"\n",
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_memra-orch"))
        .args(["plan", "m.toml", "--format", "json"])
        .current_dir(dir.path().join("manifests"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let p: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let root = std::fs::canonicalize(dir.path())
        .unwrap()
        .to_string_lossy()
        .into_owned();
    assert_eq!(p["root"], root.as_str());
    assert_eq!(
        p["cells"][0]["argv"],
        serde_json::json!([format!("{root}/bin/gate"), root.clone()])
    );
    assert_eq!(p["cells"][0]["cwd"], format!("{root}/work"));
    assert_eq!(p["cells"][0]["env"]["X"], "1");
}

#[test]
fn a_node_cannot_be_its_own_candidate() {
    let err = plan_of(
        "schema = 1\nname = \"self\"\n[[arm]]\nid = \"a\"\nrun = [\"gate\"]\n\
         [[compare]]\nid = \"c\"\nreference = \"a\"\ncandidates = [\"a\"]\nartifact = \"l.safetensors\"\n",
    )
    .unwrap_err();
    assert!(
        err.contains("names `a` as both reference and candidate"),
        "{err}"
    );
    assert!(err.contains("m.toml:9:15"), "{err}");
}
