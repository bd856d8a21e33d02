//! Manifest features for foreign engines' batteries, through the real binary: variables an
//! env-matrix include sets without naming the cell, metrics marked informational, and `cpus`
//! honoured by the local scheduler.

use std::path::Path;

use crate::run_support::{Fixture, orch};

fn run_id(tree: &Path) -> String {
    tree.file_name().unwrap().to_string_lossy().into_owned()
}

#[test]
fn include_vars_set_the_environment_without_renaming_the_cell() {
    let f = Fixture::new(
        "schema = 1\nname = \"quiet\"\n\
         [[arm]]\nid = \"eng\"\nrun = \"echo $LLAMA_FLASH_ATTN/$LLAMA_N_BATCH > \\\"$MEMRA_ORCH_ARTIFACTS/seen\\\"\"\nshell = true\n\
         env_matrix = [\"fa.toml\"]\n",
    );
    let write_matrix = |batch: &str| {
        std::fs::write(
            f.path().join("fa.toml"),
            format!(
                "[axes]\nLLAMA_FLASH_ATTN = [\"0\", \"1\"]\n\
                 [[include]]\nLLAMA_FLASH_ATTN = \"1\"\nvars = {{ LLAMA_N_BATCH = \"{batch}\" }}\n"
            ),
        )
        .unwrap();
    };
    write_matrix("512");
    assert_eq!(f.run(&[]).status.code(), Some(0));
    let ids = |f: &Fixture| -> Vec<String> {
        f.run_json()["nodes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|n| n["id"].as_str().unwrap().to_string())
            .collect()
    };
    assert_eq!(
        ids(&f),
        ["eng[LLAMA_FLASH_ATTN=0]", "eng[LLAMA_FLASH_ATTN=1]"]
    );
    let seen = |f: &Fixture, id: &str| {
        crate::run_support::read_text(&f.attempt_dir(id, 1).join("artifacts/seen")).unwrap()
    };
    assert_eq!(seen(&f, "eng[LLAMA_FLASH_ATTN=0]"), "0/\n");
    assert_eq!(seen(&f, "eng[LLAMA_FLASH_ATTN=1]"), "1/512\n");
    assert_eq!(
        f.receipt("eng[LLAMA_FLASH_ATTN=1]")["env"]["LLAMA_N_BATCH"],
        "512"
    );
    let first = f.tree();
    // A changed value keeps the ids: `diff` shows moved bits of the same cell, never coverage
    // lost and a cell added.
    write_matrix("1024");
    assert_eq!(f.run(&[]).status.code(), Some(0));
    assert_eq!(
        ids(&f),
        ["eng[LLAMA_FLASH_ATTN=0]", "eng[LLAMA_FLASH_ATTN=1]"]
    );
    let out = orch(
        &f,
        &[
            "diff",
            &run_id(&first),
            &run_id(&f.tree()),
            "--format",
            "json",
        ],
    );
    let d: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(d["lost_coverage"], serde_json::json!([]), "{d:#}");
    assert_eq!(d["new_nodes"], serde_json::json!([]), "{d:#}");
    assert_eq!(d["bits_moved"][0]["id"], "eng[LLAMA_FLASH_ATTN=1]", "{d:#}");
    assert_eq!(d["bits_moved"].as_array().unwrap().len(), 1, "{d:#}");
}

#[test]
fn include_vars_that_would_make_two_cells_one_id_are_refused() {
    let f = Fixture::new(
        "schema = 1\nname = \"clash\"\n\
         [[arm]]\nid = \"eng\"\nrun = [\"{gates}/pass.sh\"]\nenv_matrix = [\"m.toml\"]\n",
    );
    std::fs::write(
        f.path().join("m.toml"),
        "[axes]\nA = [\"1\"]\n[[include]]\nB = \"x\"\nvars = { C = \"1\" }\n\
         [[include]]\nA = \"2\"\nvars = { C = \"2\" }\n[[include]]\nA = \"2\"\n",
    )
    .unwrap();
    // `A=2` is appended by the second include and again by the third (an include never
    // merges into an appended combination): two cells that differ only in `vars`.
    let out = f.run(&[]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("two cells share the id `eng[A=2]`"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // An inline matrix's include takes no `vars`.
    let g = Fixture::new(
        "schema = 1\nname = \"inline\"\n\
         [[arm]]\nid = \"eng\"\nrun = [\"{gates}/pass.sh\"]\n\
         matrix = { b = [\"1\"], include = [{ b = \"1\", vars = { X = \"1\" } }] }\n",
    );
    let out = g.run(&[]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr)
            .contains("an inline matrix's include entries take no `vars` table"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn informational_metrics_are_shown_but_never_drift() {
    let f = Fixture::new(
        "schema = 1\nname = \"speed\"\n[defaults]\ninfo = [\"*_tok_s\"]\n\
         [[arm]]\nid = \"bench\"\nshell = true\n\
         run = \"printf '{\\\"check\\\":\\\"decode\\\",\\\"status\\\":\\\"pass\\\",\\\"metrics\\\":{\\\"gen_tok_s\\\":%s,\\\"maxdiff\\\":%s}}\\\\n' $(cat speed) $(cat maxdiff) >> $MEMRA_ORCH_CHECKS\"\n",
    );
    let night = |speed: &str, maxdiff: &str| {
        std::fs::write(f.path().join("speed"), speed).unwrap();
        std::fs::write(f.path().join("maxdiff"), maxdiff).unwrap();
        assert_eq!(f.run(&[]).status.code(), Some(0));
        f.tree()
    };
    let a = night("100", "0.5");
    let b = night("250", "0.5");
    let out = orch(&f, &["diff", &run_id(&a), &run_id(&b), "--format", "json"]);
    let d: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(d["metric_drift"], serde_json::json!([]), "{d:#}");
    assert_eq!(d["info_changed"][0]["metric"], "gen_tok_s", "{d:#}");
    let text = orch(&f, &["diff", &run_id(&a), &run_id(&b), "--color", "never"]);
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.contains(
            "1 informational metric change (marked `info`, never drift): gen_tok_s 100 → 250"
        ),
        "{text}"
    );
    assert!(!text.contains("METRIC DRIFT"), "{text}");
    // A metric not marked informational still drifts.
    let c = night("250", "0.9");
    let out = orch(&f, &["diff", &run_id(&b), &run_id(&c), "--format", "json"]);
    let d: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(d["metric_drift"][0]["metric"], "maxdiff", "{d:#}");
}

#[test]
fn cells_of_several_cpus_never_share_the_slots_they_hold() {
    // Two cells of 2 CPUs on 3 slots must run one after the other; the 1-CPU cell may run
    // beside either. Each writes its start and end time.
    let f = Fixture::new(
        "schema = 1\nname = \"cpus\"\n\
         [[arm]]\nid = \"wide\"\ncpus = 2\nmatrix = { n = [\"1\", \"2\"] }\nshell = true\n\
         run = \"date +%s.%N > \\\"$MEMRA_ORCH_ARTIFACTS/t\\\"; sleep 0.6; date +%s.%N >> \\\"$MEMRA_ORCH_ARTIFACTS/t\\\"\"\n\
         [[arm]]\nid = \"narrow\"\nrun = [\"{gates}/pass.sh\"]\n",
    );
    assert_eq!(f.run(&["--jobs", "3"]).status.code(), Some(0));
    let span = |id: &str| -> (f64, f64) {
        let t = crate::run_support::read_text(&f.attempt_dir(id, 1).join("artifacts/t")).unwrap();
        let v: Vec<f64> = t.lines().map(|l| l.parse().unwrap()).collect();
        (v[0], v[1])
    };
    let (a, b) = (span("wide[n=1]"), span("wide[n=2]"));
    assert!(
        a.1 <= b.0 || b.1 <= a.0,
        "the two 2-CPU cells overlapped: {a:?} {b:?}"
    );
}

#[test]
fn policies_are_checked_when_the_manifest_is_read() {
    let with = |policy: &str| {
        let f = Fixture::new(&format!(
            "schema = 1\nname = \"pol\"\n\
             [[arm]]\nid = \"a\"\nrun = [\"{{gates}}/pass.sh\"]\n\
             [[arm]]\nid = \"b\"\nrun = [\"{{gates}}/pass.sh\"]\n\
             [[compare]]\nid = \"c\"\nreference = \"a\"\ncandidates = [\"b\"]\n\
             artifact = \"x.safetensors\"\npolicy = {policy}\n"
        ));
        let out = f.run(&[]);
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    for (policy, want) in [
        (
            "{ kl_max = 0.1, max_ulp = 2 }",
            "this policy mixes the kl and ulp policies",
        ),
        ("{ min_overlap = 0.5 }", "`min_overlap` needs `topk`"),
        (
            "{ topk = 2.5 }",
            "`topk` must be a whole number of at least 1",
        ),
        (
            "{ topk = 5, min_overlap = 1.5 }",
            "`min_overlap` is a fraction of the top k",
        ),
        (
            "{ min_prefix = 4 }",
            "`min_prefix` belongs to the tokens policy",
        ),
        ("\"token\"", "unknown policy \"token\""),
        ("{ kl_maxx = 1 }", "kl_max"),
    ] {
        let (code, err) = with(policy);
        assert_eq!(code, Some(2), "{policy}: {err}");
        assert!(err.contains(want), "{policy}: {err}");
    }
    for ok in [
        "\"tokens\"",
        "{ tokens = true, min_prefix = 8 }",
        "{ kl_mean = 1e-4 }",
        "{ topk = 5 }",
        "{ max_ulp = 0 }",
        "{ max_abs = 0.1, argmax = true }",
        "{ argmax = true, min_agree = 0.9 }",
    ] {
        let (code, err) = with(ok);
        assert_ne!(code, Some(2), "{ok}: {err}");
    }
}
