//! Benchmark of `memra-orch diff` on two synthesized 10,000-node receipt trees (goal: under
//! 1 s for the whole diff), printed as a table: loading both trees (10,000 receipts each,
//! read in parallel), comparing them, and rendering each format.
//!
//! Each receipt is shaped like a real gate's: a 40-variable environment, two binaries, one
//! attempt, three check rows with metrics, a five-key doors row and two artifacts. The new
//! tree differs from the old one in 1 % of verdicts, 5 % of artifact digests and 5 % of
//! metrics. Run with `cargo bench -p memra-orch --bench diff`; each figure is the median of
//! several runs with the files in the page cache (the first, cold pass is discarded), which
//! is the situation right after a run wrote them.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use memra_orch::diff::{Thresholds, diff, load_for_diff, render};
use memra_orch::plan::NodeKind;
use memra_orch::protocol::{CheckRow, CheckStatus};
use memra_orch::receipt::tree::Tree;
use memra_orch::receipt::{
    Artifact, AttemptRecord, FileDigest, NodeIndexEntry, NodeReceipt, RunReceipt, sha256_hex, slug,
    write_json,
};
use memra_orch::verdict::{Verdict, count};
use serde_json::json;

const NODES: usize = 10_000;
const RUNS: usize = 5;

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn receipt(i: usize, generation: usize) -> NodeReceipt {
    let id = format!("arm{}[cell={},MEMRA_X=\"{}\"]", i / 100, i % 100, i % 7);
    let mut r = NodeReceipt::new(
        id.clone(),
        format!("arm{}", i / 100),
        NodeKind::Arm,
        slug(&id),
    );
    let changed = |every: usize| generation == 1 && i.is_multiple_of(every);
    r.verdict = if changed(100) {
        Verdict::Fail
    } else {
        Verdict::Pass
    };
    r.argv = vec![
        "target/release/gate".into(),
        "--batch".into(),
        (i % 10).to_string(),
    ];
    r.cwd = "/work/main".into();
    r.env = (0..40)
        .map(|k| (format!("VAR_{k}"), format!("value-{k}-{}", i % 3)))
        .collect();
    r.binaries = (0..2)
        .map(|b| FileDigest {
            path: format!("/work/main/target/release/bin{b}"),
            bytes: 1 << 20,
            sha256: sha256_hex(format!("bin{b}").as_bytes()),
        })
        .collect();
    r.inputs = sha256_hex(id.as_bytes());
    r.attempts.push(AttemptRecord {
        n: 1,
        rep: 1,
        start: "2026-11-29T00:00:00.000Z".into(),
        seconds: 1.5,
        exit: Some(0),
        signal: None,
        outcome: r.verdict,
        reason: None,
        artifacts: Vec::new(),
    });
    r.checks = (0..3)
        .map(|c| {
            let drift = if changed(20) { 1.5 } else { 1.0 };
            CheckRow {
                check: format!("check{c}"),
                status: CheckStatus::Pass,
                metrics: BTreeMap::from([
                    ("max_abs".to_string(), json!(1e-3 * drift * (c + 1) as f64)),
                    ("rows".to_string(), json!(4096)),
                    ("decode_ms".to_string(), json!(120.0)),
                ]),
                message: None,
                first_mismatch: None,
                extra: BTreeMap::new(),
            }
        })
        .collect();
    r.doors = Some(
        (0..5)
            .map(|d| (format!("door{d}"), json!(format!("path{}", (i + d) % 3))))
            .collect(),
    );
    r.artifacts = (0..2)
        .map(|a| {
            let bits = if changed(20) { "moved" } else { "same" };
            Artifact {
                name: format!("out{a}.safetensors"),
                bytes: 1 << 16,
                sha256: sha256_hex(format!("{id}{a}{bits}").as_bytes()),
            }
        })
        .collect();
    r.seconds = 1.5;
    r
}

fn write_tree(dir: &Path, generation: usize) {
    let tree = Tree {
        dir: dir.to_path_buf(),
    };
    let mut entries = Vec::with_capacity(NODES);
    for i in 0..NODES {
        let r = receipt(i, generation);
        std::fs::create_dir_all(tree.node_dir(&r.slug)).unwrap();
        write_json(&tree.receipt_json(&r.slug), &r).unwrap();
        entries.push(NodeIndexEntry {
            id: r.id.clone(),
            kind: r.kind,
            slug: Some(r.slug.clone()),
            verdict: r.verdict,
            seconds: r.seconds,
            reason: None,
            carried: None,
        });
    }
    let run = RunReceipt {
        schema: 1,
        run_id: None,
        carried_from: None,
        rerun_failed: false,
        name: "bench".into(),
        manifest: FileDigest {
            path: "m.toml".into(),
            bytes: 0,
            sha256: String::new(),
        },
        env_matrices: vec![],
        commit: format!("commit{generation}"),
        commit_sha: None,
        dirty: false,
        host: "h".into(),
        orchestrator_version: "0".into(),
        inventory: json!({"gpus": [], "driver_version": "550.1"}),
        cpu_slots: 1,
        filters: vec![],
        resumed: false,
        start: format!("2026-11-29T00:00:0{generation}.000Z"),
        end: None,
        seconds: Some(1.0),
        interrupted: false,
        unmet: None,
        disk_full: None,
        counts: count(entries.iter().map(|e| e.verdict)),
        verdict: "pass".into(),
        nodes: entries,
    };
    write_json(&tree.run_json(), &run).unwrap();
}

fn main() {
    let tmp = tempfile::tempdir().unwrap();
    let (old_dir, new_dir) = (tmp.path().join("old"), tmp.path().join("new"));
    let t0 = Instant::now();
    write_tree(&old_dir, 0);
    write_tree(&new_dir, 1);
    println!(
        "synthesized two trees of {NODES} nodes in {:.2} s",
        t0.elapsed().as_secs_f64()
    );
    let thresholds = Thresholds::default();
    let (mut loads, mut diffs, mut texts, mut mds, mut jsons, mut totals) =
        (vec![], vec![], vec![], vec![], vec![], vec![]);
    let mut found = None;
    for pass in 0..=RUNS {
        let start = Instant::now();
        let (old, new) = rayon::join(|| load_for_diff(&old_dir), || load_for_diff(&new_dir));
        let (old, new) = (old.unwrap(), new.unwrap());
        let loaded = start.elapsed();
        let t = Instant::now();
        let d = diff(&old, &new, &thresholds);
        let compared = t.elapsed();
        let t = Instant::now();
        let text = render::text(&d, false);
        let text_time = t.elapsed();
        let total = start.elapsed();
        let t = Instant::now();
        let md = render::markdown(&d);
        let md_time = t.elapsed();
        let t = Instant::now();
        let js = render::json(&d);
        let json_time = t.elapsed();
        if pass == 0 {
            found = Some((
                d.regressions.len(),
                d.bits_moved.len(),
                d.metric_drift.len(),
                text.len() + md.len() + js.len(),
            ));
            continue;
        }
        loads.push(loaded);
        diffs.push(compared);
        texts.push(text_time);
        mds.push(md_time);
        jsons.push(json_time);
        totals.push(total);
    }
    let (regressions, moved, drift, bytes) = found.unwrap();
    println!(
        "found {regressions} regressions, {moved} nodes with bits moved, {drift} metric drifts ({bytes} bytes rendered)\n"
    );
    let ms = |v: Vec<Duration>| median(v).as_secs_f64() * 1e3;
    println!("| stage (median of {RUNS}, warm cache) | ms |");
    println!("|---|---:|");
    println!(
        "| load both trees ({} receipts) | {:.1} |",
        2 * NODES,
        ms(loads)
    );
    println!("| compare | {:.1} |", ms(diffs));
    println!("| render text | {:.1} |", ms(texts));
    println!("| render markdown | {:.1} |", ms(mds));
    println!("| render json | {:.1} |", ms(jsons));
    println!(
        "| **whole diff (load + compare + text)** | **{:.1}** |",
        ms(totals)
    );
    println!("\nthreads: {} (rayon)", rayon::current_num_threads());
}
