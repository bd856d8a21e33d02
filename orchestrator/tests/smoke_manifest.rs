//! The shipped smoke battery, `manifests/smoke.toml`, run end to end the way CI runs it: the
//! orchestrator half with the fixture gates and the engine half on the CPU backend, with the
//! engine binaries of this test build (`--var bin=…`, `--var build=…`), and the receipts it
//! leaves checked node by node.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::run_support::{gates, read_json};
use memra_orch::receipt::sha256_file;
use serde_json::Value;

/// The repository root, or `None` (the test then skips, saying why) outside a git checkout:
/// the manifest's paths resolve against the git top-level (DESIGN §3), and in a source
/// tarball its root would be `manifests/` instead.
fn repo_root() -> Option<PathBuf> {
    let out = Command::new("git")
        .arg("-C")
        .arg(env!("CARGO_MANIFEST_DIR"))
        .args(["rev-parse", "--show-toplevel"])
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()))
}

/// `--var` overrides that point the manifest's engine half at this test build: the folder of
/// the `memra-orch` binary under test, and a cargo command that builds the engine binaries
/// and the example gate into it with the same profile (a no-op when `cargo test --workspace`
/// already built them).
fn build_vars() -> Vec<String> {
    let bin = Path::new(env!("CARGO_BIN_EXE_memra-orch"))
        .parent()
        .unwrap();
    let target = bin.parent().unwrap();
    let profile = match bin.file_name().and_then(|n| n.to_str()) {
        Some("debug") | None => "dev",
        Some(other) => other,
    };
    vec![
        format!("bin={}", bin.display()),
        format!(
            "build='{}' build --locked --bins -p memra-engine -p memra-gates -p memra-example-gate --profile {profile} \
             --target-dir '{}'",
            env!("CARGO"),
            target.display()
        ),
    ]
}

struct Tree {
    dir: PathBuf,
    nodes: Vec<Value>,
}

impl Tree {
    fn receipt(&self, id: &str) -> Value {
        let n = self
            .nodes
            .iter()
            .find(|n| n["id"] == id)
            .unwrap_or_else(|| panic!("run.json has no node {id}"));
        read_json(
            &self
                .dir
                .join("nodes")
                .join(n["slug"].as_str().unwrap())
                .join("receipt.json"),
        )
    }
}

fn check<'a>(receipt: &'a Value, name: &str) -> &'a Value {
    receipt["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["check"] == name)
        .unwrap_or_else(|| panic!("no check {name} in {receipt:#}"))
}

/// Runs the smoke manifest on no GPU with the test build's binaries, filed under `commit`
/// in `receipts`; asserts that every cell ended as expected and returns the run's tree.
fn run_smoke(manifest: &Path, receipts: &Path, commit: &str, extra: &[&str]) -> PathBuf {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_memra-orch"));
    cmd.arg("run")
        .arg(manifest)
        .arg("--receipts")
        .arg(receipts)
        .args(["--commit", commit, "--progress", "plain", "--gpus", "none"])
        .args(extra);
    for v in build_vars() {
        cmd.arg("--var").arg(v);
    }
    let out = cmd.output().unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    crate::run_support::newest_run(&receipts.join(commit).join("smoke"))
}

#[test]
fn the_smoke_battery_runs_every_node_as_expected() {
    let Some(root) = repo_root() else {
        eprintln!(
            "skipped: {} is not inside a git checkout",
            env!("CARGO_MANIFEST_DIR")
        );
        return;
    };
    let manifest = root.join("manifests/smoke.toml");
    let receipts = tempfile::tempdir().unwrap();
    let dir = run_smoke(&manifest, receipts.path(), "smoke-test", &[]);
    let run = read_json(&dir.join("run.json"));
    assert_eq!(run["schema"], 1);
    assert_eq!(run["commit"], "smoke-test");
    assert_eq!(run["verdict"], "pass");
    assert!(run["end"].is_string() && run["inventory"].is_object());
    let (_, manifest_sha) = sha256_file(&manifest).unwrap();
    assert_eq!(run["manifest"]["sha256"], manifest_sha.as_str());
    assert!(dir.join("summary.md").exists());
    let junit = std::fs::read_to_string(dir.join("junit.xml")).unwrap();
    assert!(junit.contains("<testsuite name=\"smoke\""), "{junit}");

    // Every planned cell has a receipt, and every receipt a planned cell.
    let plan = Command::new(env!("CARGO_BIN_EXE_memra-orch"))
        .arg("plan")
        .arg(&manifest)
        .args(["--format", "json"])
        .args(build_vars().iter().flat_map(|v| ["--var", v.as_str()]))
        .output()
        .unwrap();
    assert!(plan.status.success());
    let plan: Value = serde_json::from_slice(&plan.stdout).unwrap();
    let mut planned: Vec<&str> = plan["order"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c.as_str().unwrap())
        .collect();
    let tree = Tree {
        dir: dir.clone(),
        nodes: run["nodes"].as_array().unwrap().clone(),
    };
    let mut ran: Vec<&str> = tree
        .nodes
        .iter()
        .map(|n| n["id"].as_str().unwrap())
        .collect();
    planned.sort_unstable();
    ran.sort_unstable();
    assert_eq!(planned, ran);
    assert!(ran.len() >= 35, "{ran:?}");

    for n in &tree.nodes {
        let id = n["id"].as_str().unwrap();
        let r = tree.receipt(id);
        assert_eq!(r["schema"], 1);
        assert_eq!(r["verdict"], n["verdict"]);
        let expected = if id == "gpu-probe" { "skipped" } else { "pass" };
        assert_eq!(r["verdict"], expected, "{id}: {r:#}");
        if r["kind"] == "compare" {
            continue;
        }
        for a in r["attempts"].as_array().unwrap() {
            let attempt = dir
                .join("nodes")
                .join(n["slug"].as_str().unwrap())
                .join(format!("attempt-{}", a["n"]));
            for f in ["stdout.log", "stderr.log", "checks.jsonl"] {
                assert!(
                    crate::run_support::is_file_in_tree(&attempt.join(f)),
                    "{} lacks {f}",
                    attempt.display()
                );
            }
            assert!(crate::run_support::is_dir_in_tree(
                &attempt.join("artifacts")
            ));
        }
    }

    // The orchestrator half: matrices, setup products, compares, a shell node, a GPU skip.
    let protocol = tree.receipt("protocol[seed=1]");
    assert_eq!(protocol["env"]["MEMRA_GATE_SEED"], "1");
    assert_eq!(protocol["cell"]["seed"], "1");
    let (_, gate_sha) = sha256_file(&gates().join("pass.sh")).unwrap();
    assert_eq!(protocol["binaries"][0]["sha256"], gate_sha.as_str());
    let product = &tree.receipt("prepare")["produces"][0];
    assert!(
        product["path"]
            .as_str()
            .unwrap()
            .ends_with("target/smoke/host.txt")
    );
    assert!(
        protocol["binaries"]
            .as_array()
            .unwrap()
            .iter()
            .any(|b| b["sha256"] == product["sha256"]),
        "the setup's product is hashed into its dependents"
    );
    let flaky = tree.receipt("flaky-infra");
    assert_eq!(flaky["attempts"].as_array().unwrap().len(), 2, "{flaky:#}");
    let compare = tree.receipt("logits-match[candidate=logits-cand,variant=a]");
    assert!(compare["compare"]["values_compared"].as_u64().unwrap() > 0);
    assert_eq!(tree.receipt("shell")["artifacts"][0]["name"], "hello.txt");
    assert!(
        tree.receipt("gpu-probe")["reason"]
            .as_str()
            .unwrap()
            .contains("GPU")
    );

    // The engine half. The build's products and the synthesized model are hashed into the
    // gates' receipts, so a receipt names the exact binary and model it judged.
    let build = tree.receipt("build");
    assert_eq!(build["produces"].as_array().unwrap().len(), 7);
    let model = &tree.receipt("synth-tiny")["produces"][0];
    let strict = tree.receipt("decode-strict");
    for hashed in [&build["produces"][1]["sha256"], &model["sha256"]] {
        assert!(
            strict["binaries"]
                .as_array()
                .unwrap()
                .iter()
                .any(|b| b["sha256"] == *hashed),
            "{strict:#}"
        );
    }
    // The equalized pins reach the engine: its doors row reports the paths it ran.
    assert_eq!(strict["env"]["MEMRA_MMVQ"], "0");
    assert_eq!(strict["env"]["MEMRA_NO_FUSE_NORMQ"], "1");
    assert_eq!(strict["doors"]["matvec"], "dp4a");
    assert_eq!(strict["doors"]["mode"], "strict");
    assert_eq!(check(&strict, "gate1")["status"], "pass");
    for (cell, family) in [("1", "mmvq"), ("0", "dp4a")] {
        let r = tree.receipt(&format!("decode-config[MEMRA_MMVQ={cell}]"));
        assert_eq!(r["doors"]["matvec"], family, "{r:#}");
        assert_eq!(r["doors"]["backend"], "cpu");
        assert_eq!(check(&r, "gate2[B=4]")["status"], "pass");
    }
    // Negative cells pass only because their gate reported the failure it exists to catch.
    let strict_default = tree.receipt("decode-strict-default");
    assert_eq!(strict_default["attempts"][0]["outcome"], "fail");
    assert_eq!(check(&strict_default, "gate1")["status"], "fail");
    let canary = tree.receipt("decode-canary");
    assert_eq!(canary["expect"], "fail");
    assert_eq!(canary["attempts"][0]["outcome"], "fail");
    assert_eq!(canary["doors"]["canary"], true);
    // The canary reaches gate1 too: its one wrong token turns most draws early (5 of 6 on
    // this model: one draw's greedy stream does not move within 4 steps), past the 4-of-6
    // rule.
    assert_eq!(check(&canary, "gate1")["status"], "fail");
    let early = check(&canary, "gate1")["metrics"]["early_divergences"]
        .as_u64()
        .unwrap();
    assert!(early >= 4, "{early}");
    // The exact-model gate holds every synthesized arm to its banked bounds, and its
    // canary (one perturbed weight block) fails it.
    let exact = tree.receipt("exact");
    assert_eq!(check(&exact, "exact.q4_1.decode")["status"], "pass");
    let exact_pp = tree.receipt("exact-pp");
    assert_eq!(exact_pp["doors"]["pp_stages"], 2);
    assert_eq!(check(&exact_pp, "exact.q4_1.decode")["status"], "pass");
    // The fused norm tier against the separate one, under a bound.
    let fused = tree.receipt("fused-vs-unfused[candidate=dump-decode]");
    assert!(
        fused["compare"]["values_compared"].as_u64().unwrap() > 0,
        "{fused:#}"
    );
    assert_eq!(tree.receipt("dump-decode")["doors"]["norm"], "fused");
    assert_eq!(
        tree.receipt("dump-decode-unfused")["doors"]["norm"],
        "separate"
    );
    let fused_bug = tree.receipt("fused-vs-unfused-defect[candidate=dump-decode-defect]");
    assert_eq!(fused_bug["expect"], "fail");
    assert_eq!(fused_bug["attempts"][0]["outcome"], "fail", "{fused_bug:#}");
    assert_eq!(
        tree.receipt("dump-decode-defect")["doors"]["defect"],
        "fused-norm"
    );
    let exact_canary = tree.receipt("exact-canary");
    assert_eq!(exact_canary["attempts"][0]["outcome"], "fail");
    assert_eq!(exact_canary["doors"]["defect"], "weight-block");
    assert_eq!(check(&exact_canary, "exact.q4_1.decode")["status"], "fail");
    // Each planted defect fails the gate meant for it, and its doors row names it.
    let reduction = tree.receipt("decode-defect-batch-reduction");
    assert_eq!(reduction["attempts"][0]["outcome"], "fail");
    assert_eq!(reduction["doors"]["defect"], "batch-reduction");
    assert_eq!(check(&reduction, "gate2[B=4]")["status"], "fail");
    assert_eq!(check(&reduction, "gate2[B=1]")["status"], "pass");
    // ... and stays the subtle defect it is described as: the B=4 step logits within a
    // tight bound of the clean run's.
    let subtle = tree.receipt("batch-reduction-is-subtle[candidate=decode-defect-batch-reduction]");
    assert_eq!(subtle["compare"]["tensors_compared"], 4, "{subtle:#}");
    assert_eq!(subtle["compare"]["mismatches"], 0, "{subtle:#}");
    // The fused-norm defect leaves the separate tier alone: every position prefilled under
    // it is bit-identical to the clean dump.
    let spared = tree.receipt("fused-norm-spares-prefill[candidate=dump-defect-fused-norm]");
    assert!(
        spared["compare"]["values_compared"].as_u64().unwrap() > 0,
        "{spared:#}"
    );
    assert_eq!(
        tree.receipt("dump-defect-fused-norm")["doors"]["defect"],
        "fused-norm"
    );
    // A block sum off by one f16 step fails reference-gate through the following oracle.
    let block_sum = tree.receipt("reference-defect-q8-block-sum");
    assert_eq!(block_sum["attempts"][0]["outcome"], "fail", "{block_sum:#}");
    assert_eq!(block_sum["doors"]["defect"], "q8-block-sum");
    assert_eq!(check(&block_sum, "reference.q8_0")["status"], "fail");
    assert_eq!(check(&block_sum, "reference.f16")["status"], "pass");
    // Speculative decoding: every row green under the default pins with the B=1 shortcut off
    // and on and under the equalized pins, drafts accepted, the spec settings in the doors
    // row; each spec defect fails the row it is planted against and spares the others.
    for id in [
        "spec[plen=8]",
        "spec[plen=120]",
        "spec-equalized[MEMRA_SERVE_B1FAST=0]",
        "spec-equalized[MEMRA_SERVE_B1FAST=1]",
    ] {
        let r = tree.receipt(id);
        for row in ["spec.plain", "spec.column", "spec.rewind"] {
            assert_eq!(check(&r, row)["status"], "pass", "{id} {row}: {r:#}");
        }
        assert!(
            check(&r, "spec.plain")["metrics"]["accepted"]
                .as_u64()
                .unwrap()
                > 0
        );
        assert_eq!(r["doors"]["spec_k"], "1,4,8", "{r:#}");
    }
    let rewind = tree.receipt("spec-defect[defect=rewind-slot]");
    assert_eq!(rewind["attempts"][0]["outcome"], "fail", "{rewind:#}");
    assert_eq!(check(&rewind, "spec.rewind")["status"], "fail");
    let column = tree.receipt("spec-defect[defect=verify-column]");
    assert_eq!(
        check(&column, "spec.column")["status"],
        "fail",
        "{column:#}"
    );
    assert_eq!(check(&column, "spec.rewind")["status"], "pass");
    // Plain generation on the fused single tier fails spec.plain and nothing else.
    let plain = tree.receipt("spec-defect-plain-single");
    assert_eq!(plain["attempts"][0]["outcome"], "fail", "{plain:#}");
    assert_eq!(check(&plain, "spec.plain")["status"], "fail");
    assert_eq!(check(&plain, "spec.column")["status"], "pass");
    assert_eq!(check(&plain, "spec.rewind")["status"], "pass");
    // The long programs cross the attention windows and hold.
    let long = tree.receipt("decode-ppspec-long");
    assert_eq!(long["doors"]["plen"], 120, "{long:#}");
    assert_eq!(check(&long, "ppspec.split")["status"], "pass", "{long:#}");
    let long = tree.receipt("reference-long");
    assert_eq!(long["attempts"][0]["outcome"], "pass", "{long:#}");
    let ppspec = tree.receipt("decode-ppspec");
    assert_eq!(
        check(&ppspec, "ppspec.split")["status"],
        "pass",
        "{ppspec:#}"
    );
    assert_eq!(ppspec["doors"]["spec_ts"], "2,5,9");
    let stage = tree.receipt("decode-ppspec-defect");
    assert_eq!(check(&stage, "ppspec.split")["status"], "fail", "{stage:#}");
    assert_eq!(check(&stage, "ppspec.localizer")["status"], "pass");
    for id in [
        "decode-ppspec-spares[defect=rewind-slot]",
        "decode-ppspec-spares[defect=verify-column]",
        "decode-pp-spares-stage-column",
    ] {
        let r = tree.receipt(id);
        assert_eq!(r["attempts"][0]["outcome"], "pass", "{id}: {r:#}");
    }
    // The q8_0 KV cache: named in the doors row, exact under the batch and split gates, its
    // distance from the f32 cache within the banked bound, and a coarser cache caught there
    // while the batch gates stay green under it.
    let kv = tree.receipt("decode-kvq8");
    assert_eq!(kv["doors"]["kv"], "q8_0", "{kv:#}");
    assert_eq!(check(&kv, "gate2[B=4]")["status"], "pass");
    let exact_kv = tree.receipt("exact-kvq8");
    assert_eq!(
        check(&exact_kv, "exact.q4_1.decode:vs-f32-cache")["status"],
        "pass",
        "{exact_kv:#}"
    );
    let coarse = tree.receipt("exact-kvq8-defect");
    assert_eq!(coarse["attempts"][0]["outcome"], "fail", "{coarse:#}");
    assert_eq!(
        check(&coarse, "exact.q4_1.decode:vs-f32-cache")["status"],
        "fail"
    );
    assert_eq!(
        tree.receipt("decode-kvq8-spares-coarse")["attempts"][0]["outcome"],
        "pass"
    );
    let counter = tree.receipt("decode-defect-sample-counter");
    assert_eq!(counter["attempts"][0]["outcome"], "fail");
    assert_eq!(counter["doors"]["defect"], "sample-counter");
    assert_eq!(check(&counter, "gate3[B=4]")["status"], "fail");
    assert_eq!(check(&counter, "gate2[B=4]")["status"], "pass");
    // The sampler against the independent reference sampler, and the nucleus cut one token
    // early, which only it catches: every untruncated row stays green under the defect.
    let sampling = tree.receipt("sampling");
    assert_eq!(sampling["attempts"][0]["outcome"], "pass", "{sampling:#}");
    assert_eq!(check(&sampling, "steps[T=1,top_p=0.5]")["status"], "pass");
    assert_eq!(
        check(&sampling, "steps[T=1,top_p=0.5]")["metrics"]["mismatches"],
        0
    );
    // The random stream against known answers, and the positions the gate counted itself.
    assert_eq!(check(&sampling, "stream")["status"], "pass");
    assert_eq!(check(&sampling, "positions")["status"], "pass");
    let cut = tree.receipt("sampling-defect");
    assert_eq!(cut["expect"], "fail");
    assert_eq!(cut["attempts"][0]["outcome"], "fail", "{cut:#}");
    assert_eq!(cut["doors"]["defect"], "top-p-cut");
    assert_eq!(check(&cut, "steps[T=1,top_p=1]")["status"], "pass");
    assert!(
        cut["checks"]
            .as_array()
            .unwrap()
            .iter()
            .any(|c| c["status"] == "fail"
                && c["check"].as_str().unwrap().starts_with("distribution[")),
        "{cut:#}"
    );
    // The top-k cut one token late fails a top-k row, and only top-k rows.
    let late = tree.receipt("sampling-defect-top-k");
    assert_eq!(late["attempts"][0]["outcome"], "fail", "{late:#}");
    assert_eq!(late["doors"]["defect"], "top-k-cut");
    assert_eq!(check(&late, "steps[T=1,top_k=1,top_p=1]")["status"], "fail");
    assert_eq!(check(&late, "steps[T=1,top_p=0.5]")["status"], "pass");
    assert!(
        late["checks"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|c| c["status"] == "fail")
            .all(|c| c["check"].as_str().unwrap().contains(",top_k=")),
        "{late:#}"
    );
    assert_eq!(
        check(&sampling, "steps[T=1,top_k=1,top_p=1]")["status"],
        "pass"
    );
    // Exact ties at the cuts: the contract keeps every token tied with the k-th, a cut that
    // keeps exactly k fails the tied top-k rows and nothing else, and the late cut (k + 1)
    // keeps the tie there.
    assert_eq!(
        check(&sampling, "tied[T=1,top_k=8,top_p=1]")["status"],
        "pass"
    );
    let ties = tree.receipt("sampling-defect-top-k-ties");
    assert_eq!(ties["attempts"][0]["outcome"], "fail", "{ties:#}");
    assert_eq!(ties["doors"]["defect"], "top-k-ties");
    let failed: Vec<&str> = ties["checks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["status"] == "fail")
        .map(|c| c["check"].as_str().unwrap())
        .collect();
    assert_eq!(
        failed,
        ["tied[T=1,top_k=8,top_p=1]", "tied[T=1,top_k=40,top_p=1]"],
        "{ties:#}"
    );
    let spares = tree.receipt("sampling-top-k-cut-spares-ties");
    assert_eq!(spares["attempts"][0]["outcome"], "pass", "{spares:#}");
    assert_eq!(spares["doors"]["part"], "tied", "{spares:#}");
    assert_eq!(spares["checks"].as_array().unwrap().len(), 3, "{spares:#}");
    let pp = tree.receipt("decode-pp");
    assert_eq!(pp["doors"]["mode"], "pp");
    // The B=1 fast path per stage holds (the localizer's reference walks the batched body
    // as its candidate does), and each planted split defect fails the arms it should.
    let fast = tree.receipt("decode-pp-b1fast");
    assert_eq!(fast["doors"]["b1fast"], true, "{fast:#}");
    assert_eq!(fast["doors"]["batch"], "1,4");
    assert_eq!(check(&fast, "pp.localizer")["status"], "pass");
    for (defect, localizer) in [("stage-range", "fail"), ("boundary-copy", "pass")] {
        let r = tree.receipt(&format!("decode-pp-defect[defect={defect}]"));
        assert_eq!(r["attempts"][0]["outcome"], "fail", "{r:#}");
        assert_eq!(r["doors"]["defect"], defect);
        assert_eq!(check(&r, "pp.split")["status"], "fail");
        assert_eq!(check(&r, "pp.localizer")["status"], localizer, "{defect}");
    }
    // Prompts past 64 and past 128 positions, attested by the doors row.
    for plen in [70, 130] {
        let r = tree.receipt(&format!("decode-long[plen={plen}]"));
        assert_eq!(r["doors"]["plen"], plen, "{r:#}");
        assert_eq!(check(&r, "gate2[B=2]")["status"], "pass");
    }
    let reference = tree.receipt("reference");
    assert_eq!(check(&reference, "loader-goldens")["status"], "pass");
    assert!(
        reference["artifacts"]
            .as_array()
            .unwrap()
            .iter()
            .any(|a| a["name"] == "receipt.tsv")
    );

    // One compare per policy, each over real values.
    let bitwise = &tree.receipt("pp-vs-unsplit[candidate=decode-pp]")["compare"];
    assert_eq!(bitwise["policy"]["kind"], "bitwise");
    assert!(
        bitwise["tensors_compared"].as_u64().unwrap() >= 4,
        "{bitwise:#}"
    );
    assert_eq!(bitwise["mismatches"], 0);
    let tolerance = &tree.receipt("fa3-vs-naive[candidate=dump-naive]")["compare"];
    assert_eq!(tolerance["policy"]["kind"], "tolerance");
    assert_eq!(tolerance["argmax_agree"], tolerance["rows"]);
    let families = &tree.receipt("mmvq-vs-dp4a[candidate=dump-dp4a]")["compare"];
    assert_eq!(families["policy"]["kind"], "argmax_agree");
    assert!(families["values_compared"].as_u64().unwrap() > 0);
    // The two families are different compositions: their logits differ in the last bits,
    // which is why this pair is compared by argmax and never bitwise.
    assert!(
        families["tensors"][0]["max_abs"].as_f64().unwrap() > 0.0,
        "{families:#}"
    );
    // The dumps name the paths they ran, so the compares' pairs are attested: the dp4a
    // candidate's pin shows in its doors row, and no cell carries a warning.
    let dump = tree.receipt("dump");
    let dp4a = tree.receipt("dump-dp4a");
    assert_eq!(dump["doors"]["matvec"], "mmvq", "{dump:#}");
    assert_eq!(dp4a["doors"]["matvec"], "dp4a", "{dp4a:#}");
    assert_eq!(dump["doors"]["pdl"], true, "{dump:#}");
    for r in [&dump, &dp4a] {
        assert!(
            r["checks"]
                .as_array()
                .unwrap()
                .iter()
                .all(|c| c["check"] != "pin had no effect"),
            "{r:#}"
        );
    }
}

/// A gate built on `memra-protocol` alone, no engine, passes through `memra-orch run`: its
/// receipt holds the check row and the doors row it wrote.
#[test]
fn a_gate_on_the_protocol_crate_alone_passes_with_its_rows_in_the_receipt() {
    let Some(root) = repo_root() else {
        eprintln!(
            "skipped: {} is not inside a git checkout",
            env!("CARGO_MANIFEST_DIR")
        );
        return;
    };
    let receipts = tempfile::tempdir().unwrap();
    let dir = run_smoke(
        &root.join("manifests/smoke.toml"),
        receipts.path(),
        "smoke-example",
        &["--filter", "example-gate"],
    );
    let run = read_json(&dir.join("run.json"));
    let tree = Tree {
        dir,
        nodes: run["nodes"].as_array().unwrap().clone(),
    };
    let r = tree.receipt("example-gate");
    assert_eq!(r["verdict"], "pass", "{r:#}");
    assert_eq!(r["attempts"][0]["outcome"], "pass", "{r:#}");
    let sum = check(&r, "sum");
    assert_eq!(sum["status"], "pass");
    assert_eq!(sum["metrics"]["compared"], 3);
    assert_eq!(sum["message"], "1 + 2 + 3 = 6");
    assert_eq!(
        r["doors"],
        serde_json::json!({"backend": "none", "checked": true, "terms": 3}),
        "{r:#}"
    );
}

#[test]
fn a_var_the_manifest_does_not_define_is_an_error_naming_it() {
    let Some(root) = repo_root() else {
        eprintln!(
            "skipped: {} is not inside a git checkout",
            env!("CARGO_MANIFEST_DIR")
        );
        return;
    };
    let out = Command::new(env!("CARGO_BIN_EXE_memra-orch"))
        .arg("plan")
        .arg(root.join("manifests/smoke.toml"))
        .args(["--var", "bim=/opt/bin"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("no `bim` in [vars]") && stderr.contains("did you mean `bin`?"),
        "{stderr}"
    );
    let out = Command::new(env!("CARGO_BIN_EXE_memra-orch"))
        .arg("plan")
        .arg(root.join("manifests/smoke.toml"))
        .args(["--var", "model=/m/x.gguf", "--format", "json"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let plan: Value = serde_json::from_slice(&out.stdout).unwrap();
    let dump = plan["cells"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["id"] == "dump")
        .unwrap();
    assert_eq!(dump["argv"][2], "/m/x.gguf", "{dump:#}");
}
