//! Benchmark of `memra-orch diff` on two synthesized 10,000-node receipt trees (goals: under
//! 1 s for the whole diff with `--no-read`, under 5 s with the moved artifacts read),
//! printed as a table: loading both trees (10,000 receipts each, read in parallel),
//! comparing them, reading the 1,000 artifacts whose bits moved (1 MiB safetensors files,
//! both sides, in parallel), and rendering each format.
//!
//! Each receipt is shaped like a real gate's: a 40-variable environment, two binaries, one
//! attempt, three check rows with metrics, a five-key doors row and two artifacts. The new
//! tree differs from the old one in 1 % of verdicts, 5 % of artifact digests (500 nodes with
//! the same verdict, two artifacts each: 1,000 moved artifacts) and 5 % of metrics. Only the
//! moved artifacts are written as files, since `diff` opens no other: each is one F32
//! tensor `logits` [8, 32768], and in the new tree two of every three values are one ulp
//! up, so every row is walked element by element (the worst case; a row that is the same
//! bytes is skipped after one comparison). Run with `cargo bench -p memra-orch --bench
//! diff`; each figure is the median of several runs with the files in the page cache (the
//! first, cold pass is discarded), which is the situation right after a run wrote them.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use memra_orch::diff::{Thresholds, diff, load_for_diff, quantify, render};
use memra_orch::gate::checks::{CheckRow, CheckStatus};
use memra_orch::plan::NodeKind;
use memra_orch::receipt::tree::Tree;
use memra_orch::receipt::{
    Artifact, AttemptRecord, FileDigest, NodeIndexEntry, NodeReceipt, RunReceipt, sha256_hex, slug,
    write_json,
};
use memra_orch::words::verdict::{Verdict, count};
use serde_json::json;

const NODES: usize = 10_000;
const RUNS: usize = 5;
/// The moved artifacts' tensor: `[ROWS, VOCAB]` F32, 1 MiB.
const ROWS: usize = 8;
const VOCAB: usize = 32_768;

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
    // Verdicts change on nodes whose artifacts do not move, so all 1,000 moved artifacts
    // belong to nodes with the same verdict on both sides (bits moved).
    r.verdict = if generation == 1 && i % 100 == 1 {
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
        gpu_health: Vec::new(),
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
                bytes: 1 << 20,
                sha256: sha256_hex(format!("{id}{a}{bits}").as_bytes()),
            }
        })
        .collect();
    r.seconds = 1.5;
    r
}

/// The safetensors file of a moved artifact: deterministic values, and for the new tree two
/// of every three one ulp up.
fn artifact_file(generation: usize) -> Vec<u8> {
    let data: Vec<u8> = (0..ROWS * VOCAB)
        .flat_map(|i| {
            let x = ((i * 7919) % 10_007) as f32 / 1000.0 - 5.0;
            let x = if generation == 1 && i % 3 != 0 {
                f32::from_bits(x.to_bits() + 1)
            } else {
                x
            };
            x.to_le_bytes()
        })
        .collect();
    let view =
        safetensors::tensor::TensorView::new(safetensors::Dtype::F32, vec![ROWS, VOCAB], &data)
            .unwrap();
    safetensors::serialize([("logits", view)], None).unwrap()
}

fn write_tree(dir: &Path, generation: usize) {
    let tree = Tree {
        dir: dir.to_path_buf(),
    };
    let file = artifact_file(generation);
    let mut entries = Vec::with_capacity(NODES);
    for i in 0..NODES {
        let r = receipt(i, generation);
        std::fs::create_dir_all(tree.node_dir(&r.slug)).unwrap();
        write_json(&tree.receipt_json(&r.slug), &r).unwrap();
        if i.is_multiple_of(20) {
            let artifacts = tree.attempt_dir(&r.slug, 1).join("artifacts");
            std::fs::create_dir_all(&artifacts).unwrap();
            for a in &r.artifacts {
                std::fs::write(artifacts.join(&a.name), &file).unwrap();
            }
        }
        entries.push(NodeIndexEntry {
            id: r.id.clone(),
            kind: r.kind,
            slug: Some(r.slug.clone()),
            verdict: r.verdict,
            seconds: r.seconds,
            reason: None,
            carried: None,
            warns: 0,
            warning: None,
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
        commit_subject: None,
        dirty: false,
        code: None,
        fingerprints: Vec::new(),
        host: "h".into(),
        orchestrator_version: "0".into(),
        inventory: json!({"gpus": [], "driver_version": "550.1"}),
        cpu_slots: 1,
        filters: vec![],
        resumed: false,
        vars: Default::default(),
        start: format!("2026-11-29T00:00:0{generation}.000Z"),
        end: None,
        seconds: Some(1.0),
        interrupted: false,
        unmet: None,
        disk_full: None,
        excluded_gpus: Vec::new(),
        quarantined_gpus: Vec::new(),
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
    let (mut loads, mut diffs, mut reads, mut texts, mut mds, mut jsons) =
        (vec![], vec![], vec![], vec![], vec![], vec![]);
    let (mut totals, mut no_read_totals) = (vec![], vec![]);
    let mut found = None;
    for pass in 0..=RUNS {
        let start = Instant::now();
        let (old, new) = rayon::join(|| load_for_diff(&old_dir), || load_for_diff(&new_dir));
        let (old, new) = (old.unwrap(), new.unwrap());
        let loaded = start.elapsed();
        let t = Instant::now();
        let mut d = diff(&old, &new, &thresholds);
        let compared = t.elapsed();
        let t = Instant::now();
        let _ = render::text(&d, false);
        let no_read_total = start.elapsed();
        let no_read_text = t.elapsed();
        let t = Instant::now();
        quantify::read_moved(&mut d, &old, &new);
        let read = t.elapsed();
        let t = Instant::now();
        let text = render::text(&d, false);
        let text_time = t.elapsed();
        let total = no_read_total - no_read_text + read + text_time;
        let t = Instant::now();
        let md = render::markdown(&d);
        let md_time = t.elapsed();
        let t = Instant::now();
        let js = render::json(&d);
        let json_time = t.elapsed();
        if pass == 0 {
            let artifacts: Vec<_> = d.bits_moved.iter().flat_map(|b| &b.artifacts).collect();
            let read = artifacts
                .iter()
                .filter(|a| matches!(a.read, Some(quantify::ArtifactRead::Read(_))))
                .count();
            found = Some((
                d.regressions.len(),
                d.bits_moved.len(),
                artifacts.len(),
                read,
                d.metric_drift.len(),
                text.len() + md.len() + js.len(),
            ));
            continue;
        }
        loads.push(loaded);
        diffs.push(compared);
        reads.push(read);
        no_read_totals.push(no_read_total);
        texts.push(text_time);
        mds.push(md_time);
        jsons.push(json_time);
        totals.push(total);
    }
    let (regressions, moved, artifacts, read, drift, bytes) = found.unwrap();
    println!(
        "found {regressions} regressions, {moved} nodes with bits moved ({artifacts} artifacts, {read} read as safetensors), {drift} metric drifts ({bytes} bytes rendered)\n"
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
    println!(
        "| read the moved artifacts ({} files of 1 MiB) | {:.1} |",
        2 * artifacts,
        ms(reads)
    );
    println!("| render text | {:.1} |", ms(texts));
    println!("| render markdown | {:.1} |", ms(mds));
    println!("| render json | {:.1} |", ms(jsons));
    println!(
        "| whole diff with --no-read (load + compare + text) | {:.1} |",
        ms(no_read_totals)
    );
    println!(
        "| **whole diff (load + compare + read + text)** | **{:.1}** |",
        ms(totals)
    );
    println!("\nthreads: {} (rayon)", rayon::current_num_threads());
}
