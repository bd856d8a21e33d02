//! A secret never names a cell: an env-matrix axis named like a secret, a name listed in
//! `[isolation] secret`, or a URL with a password as a matrix value gives a cell id that
//! holds none of it, so it reaches no progress line, event, metrics label, run.json, receipt,
//! folder name, summary, junit, history index, `history`, `show`, `diff` or report page.

use std::path::Path;
use std::process::Command;

use crate::run_support::{Fixture, logged};

const SECRETS: [&str; 4] = ["tok-aaaa1111", "tok-bbbb2222", "hunter2pw", "sekrit-value"];

/// Every file name and every file's bytes under `dir`, a packed run's archive members
/// (decompressed) included, checked for the secrets.
fn assert_clean(dir: &Path) {
    let files = crate::run_support::files_under(dir);
    assert!(
        files.iter().any(|f| f.ends_with("receipt.json")) || !dir.ends_with("receipts"),
        "no receipt was checked: {files:?}"
    );
    for entry in walk(dir).into_iter().chain(files) {
        let name = entry.to_string_lossy();
        for s in SECRETS {
            assert!(!name.contains(s), "a path holds {s}: {name}");
        }
        if !entry.is_dir() && crate::run_support::is_file_in_tree(&entry) {
            let bytes = crate::run_support::read_bytes(&entry).unwrap();
            let text = String::from_utf8_lossy(&bytes);
            for s in SECRETS {
                assert!(!text.contains(s), "{} holds {s}", entry.display());
            }
        }
    }
}

fn walk(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if e.file_type().unwrap().is_dir() {
            out.extend(walk(&p));
        }
        out.push(p);
    }
    out
}

#[test]
fn secret_axis_values_and_url_passwords_never_reach_an_id() {
    let f = Fixture::new(
        "schema = 1\nname = \"sec\"\n[isolation]\nsecret = [\"PLAIN_LOOKING\"]\n\
         [[arm]]\nid = \"eng\"\nrun = [\"{gates}/pass.sh\"]\nenv_matrix = [\"auth.toml\"]\n\
         matrix = { url = [\"https://user:hunter2pw@example.com/m\"] }\n",
    );
    std::fs::write(
        f.path().join("auth.toml"),
        "[axes]\nAPI_TOKEN = [\"tok-aaaa1111\", \"tok-bbbb2222\"]\nPLAIN_LOOKING = [\"sekrit-value\"]\n",
    )
    .unwrap();
    let metrics = f.path().join("m.prom");
    let out = logged(f.run(&[
        "--events",
        "json",
        "--metrics-file",
        metrics.to_str().unwrap(),
    ]));
    assert_eq!(out.status.code(), Some(0));
    let ids: Vec<String> = f.run_json()["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["id"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(
        ids,
        [
            "eng[url=https://user:<redacted>@example.com/m,API_TOKEN=<secret-1>,PLAIN_LOOKING=<secret-1>]",
            "eng[url=https://user:<redacted>@example.com/m,API_TOKEN=<secret-2>,PLAIN_LOOKING=<secret-1>]",
        ]
    );
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    for s in SECRETS {
        assert!(!text.contains(s), "the run printed {s}:\n{text}");
    }
    // Every read command and the report, over what the run left.
    let reads = |args: &[&str]| {
        let o = Command::new(env!("CARGO_BIN_EXE_memra-orch"))
            .args(args)
            .arg("--receipts")
            .arg(f.path().join("receipts"))
            .current_dir(f.path())
            .output()
            .unwrap();
        format!(
            "{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        )
    };
    let first = ids[0].clone();
    for args in [
        vec!["show", "latest"],
        vec!["show", "latest", first.as_str()],
        vec!["history"],
        vec!["ls"],
    ] {
        let t = reads(&args);
        for s in SECRETS {
            assert!(!t.contains(s), "{args:?} printed {s}:\n{t}");
        }
    }
    let html = f.path().join("html");
    reads(&["report", "--html", html.to_str().unwrap()]);
    assert_clean(&f.path().join("receipts"));
    assert_clean(&html);
    let m = std::fs::read_to_string(&metrics).unwrap();
    for s in SECRETS {
        assert!(!m.contains(s), "metrics hold {s}");
    }
}

#[test]
fn the_gate_still_receives_the_real_values() {
    let f = Fixture::new(
        "schema = 1\nname = \"real\"\n\
         [[arm]]\nid = \"eng\"\nshell = true\nenv_matrix = [\"auth.toml\"]\n\
         run = \"test \\\"$API_TOKEN\\\" = tok-aaaa1111\"\n",
    );
    std::fs::write(
        f.path().join("auth.toml"),
        "[axes]\nAPI_TOKEN = [\"tok-aaaa1111\"]\n",
    )
    .unwrap();
    assert_eq!(f.run(&[]).status.code(), Some(0));
    assert_eq!(f.verdict("eng[API_TOKEN=<secret-1>]"), "pass");
}
