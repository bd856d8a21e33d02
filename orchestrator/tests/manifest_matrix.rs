//! Matrix expansion follows GitHub Actions `strategy.matrix` exactly, checked on the examples
//! of GitHub's documentation ("Using a matrix for your jobs"), through the real binary
//! (`memra-orch plan --format json`), for inline matrices and env-matrix files alike.

use std::process::Command;

/// Writes `files` into a fresh folder and returns the plan of `manifest.toml` as JSON.
fn plan(files: &[(&str, &str)]) -> serde_json::Value {
    let dir = tempfile::tempdir().unwrap();
    for (name, text) in files {
        let p = dir.path().join(name);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    }
    let out = Command::new(env!("CARGO_BIN_EXE_memra-orch"))
        .args(["plan", "manifest.toml", "--format", "json"])
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

fn ids(plan: &serde_json::Value) -> Vec<String> {
    plan["cells"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["id"].as_str().unwrap().to_string())
        .collect()
}

fn manifest(node: &str) -> String {
    format!("schema = 1\nname = \"m\"\n[[arm]]\nid = \"job\"\nrun = [\"gate\"]\n{node}\n")
}

#[test]
fn exclude_removes_partial_matches() {
    // GitHub: os × version × environment minus two excludes, the second naming only two keys.
    let env = r#"
[axes]
OS = ["macos-latest", "windows-latest"]
VERSION = ["12", "14", "16"]
ENVIRONMENT = ["staging", "production"]
[[exclude]]
OS = "macos-latest"
VERSION = "12"
ENVIRONMENT = "production"
[[exclude]]
OS = "windows-latest"
VERSION = "16"
"#;
    let p = plan(&[
        ("manifest.toml", &manifest("env_matrix = [\"m.toml\"]")),
        ("m.toml", env),
    ]);
    let ids = ids(&p);
    assert_eq!(ids.len(), 9, "{ids:#?}");
    assert_eq!(
        ids[0],
        "job[OS=macos-latest,VERSION=12,ENVIRONMENT=staging]"
    );
    assert!(
        !ids.iter()
            .any(|i| i.contains("OS=windows-latest,VERSION=16"))
    );
    assert!(!ids.contains(&"job[OS=macos-latest,VERSION=12,ENVIRONMENT=production]".to_string()));
    // Axis values become environment variables of the cell.
    assert_eq!(p["cells"][0]["env"]["ENVIRONMENT"], "staging");
}

#[test]
fn include_merges_where_it_overwrites_no_original_value_else_appends() {
    // GitHub's fruit/animal example, verbatim in meaning.
    let node = r#"matrix = { fruit = ["apple", "pear"], animal = ["cat", "dog"], include = [
  { color = "green" },
  { color = "pink", animal = "cat" },
  { fruit = "apple", shape = "circle" },
  { fruit = "banana" },
  { fruit = "banana", animal = "cat" },
] }"#;
    let p = plan(&[("manifest.toml", &manifest(node))]);
    assert_eq!(
        ids(&p),
        [
            "job[fruit=apple,animal=cat,color=pink,shape=circle]",
            "job[fruit=apple,animal=dog,color=green,shape=circle]",
            "job[fruit=pear,animal=cat,color=pink]",
            "job[fruit=pear,animal=dog,color=green]",
            "job[fruit=banana]",
            "job[fruit=banana,animal=cat]",
        ]
    );
}

#[test]
fn include_expands_one_combination() {
    let node = r#"matrix = { os = ["windows-latest", "ubuntu-latest"], node = [14, 16], include = [{ os = "windows-latest", node = 16, npm = 6 }] }"#;
    let p = plan(&[("manifest.toml", &manifest(node))]);
    assert_eq!(
        ids(&p),
        [
            "job[os=windows-latest,node=14]",
            "job[os=windows-latest,node=16,npm=6]",
            "job[os=ubuntu-latest,node=14]",
            "job[os=ubuntu-latest,node=16]",
        ]
    );
}

#[test]
fn include_adds_a_combination_that_matches_none() {
    let node = r#"matrix = { os = ["windows-latest", "ubuntu-latest"], node = [14, 16], include = [{ os = "windows-latest", node = 17 }] }"#;
    let ids = ids(&plan(&[("manifest.toml", &manifest(node))]));
    assert_eq!(ids.len(), 5);
    assert_eq!(ids[4], "job[os=windows-latest,node=17]");
}

#[test]
fn include_only_matrix_runs_each_include() {
    let env = r#"
[[include]]
SITE = "production"
DATACENTER = "site-a"
[[include]]
SITE = "staging"
DATACENTER = "site-b"
"#;
    let p = plan(&[
        ("manifest.toml", &manifest("env_matrix = [\"sites.toml\"]")),
        ("sites.toml", env),
    ]);
    assert_eq!(
        ids(&p),
        [
            "job[SITE=production,DATACENTER=site-a]",
            "job[SITE=staging,DATACENTER=site-b]"
        ]
    );
}

#[test]
fn pins_only_file_is_one_cell_and_matrices_multiply_in_declared_order() {
    let eq = "[pins]\nMEMRA_MMVQ = \"0\"\nMEMRA_NO_FUSE_NORMQ = \"1\"\n";
    let fa = "[axes]\nMEMRA_FA3 = [\"1\", \"0\"]\n";
    let node = "matrix = { batch = [\"4\", \"8\"] }\nenv_matrix = [\"env/eq.toml\", \"env/fa.toml\"]\nenv = { MEMRA_MMVQ = \"1\" }";
    let p = plan(&[
        ("manifest.toml", &manifest(node)),
        ("env/eq.toml", eq),
        ("env/fa.toml", fa),
    ]);
    assert_eq!(
        ids(&p),
        [
            "job[batch=4,MEMRA_FA3=1]",
            "job[batch=4,MEMRA_FA3=0]",
            "job[batch=8,MEMRA_FA3=1]",
            "job[batch=8,MEMRA_FA3=0]"
        ]
    );
    let env = &p["cells"][1]["env"];
    assert_eq!(env["MEMRA_NO_FUSE_NORMQ"], "1");
    assert_eq!(env["MEMRA_FA3"], "0");
    // The node's own env wins over env-matrix pins.
    assert_eq!(env["MEMRA_MMVQ"], "1");
    // Inline axes are not environment variables.
    assert!(env.get("batch").is_none());
    assert_eq!(p["env_matrices"].as_array().unwrap().len(), 2);
    assert_eq!(p["env_matrices"][0]["path"], "env/eq.toml");
    assert_eq!(p["env_matrices"][0]["sha256"].as_str().unwrap().len(), 64);
}

#[test]
fn expansion_is_deterministic() {
    let node = r#"matrix = { a = ["1", "2", "3"], b = ["x", "y"], exclude = [{ a = "2" }], include = [{ b = "y", c = "z" }] }"#;
    let files = [("manifest.toml", manifest(node))];
    let files: Vec<(&str, &str)> = files.iter().map(|(a, b)| (*a, b.as_str())).collect();
    let first = ids(&plan(&files));
    for _ in 0..3 {
        assert_eq!(ids(&plan(&files)), first);
    }
    assert_eq!(
        first,
        [
            "job[a=1,b=x]",
            "job[a=1,b=y,c=z]",
            "job[a=3,b=x]",
            "job[a=3,b=y,c=z]"
        ]
    );
}

#[test]
fn a_combination_twice_is_a_located_error() {
    let dir = tempfile::tempdir().unwrap();
    let node = "matrix = { a = [\"1\"], include = [{ a = \"2\" }, { a = \"2\" }] }";
    std::fs::write(dir.path().join("manifest.toml"), manifest(node)).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_memra-orch"))
        .args(["validate", "manifest.toml"])
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("two cells share the id `job[a=2]`"), "{err}");
    assert!(err.contains("--> manifest.toml:4:6"), "{err}");
}
