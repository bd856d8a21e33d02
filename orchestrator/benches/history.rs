//! Benchmark of `memra-orch history` over a year of nightlies: 365 synthesized runs of one
//! manifest (one commit each) × 1,000 cells, printed as a table: history read cold from the
//! trees (no index: 365,000 receipts), the same read building the index, and warm reads
//! through the index (every run.json stat'ed and checked against it).
//!
//! Each receipt is shaped like a real gate's, without the large environment map (which the
//! parser skips anyway): a command, two binaries, one attempt, two check rows with metrics,
//! a doors row and two artifacts. Each night 1 % of the cells change verdict and 5 % of the
//! artifact digests move. Run with `cargo bench -p memra-orch --bench history`; the files
//! are in the page cache (they were just written), which is the situation of a cron job
//! reading the night's runs.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant, SystemTime};

use memra_orch::history::{self, Options, index, render};
use memra_orch::plan::NodeKind;
use memra_orch::protocol::{CheckRow, CheckStatus};
use memra_orch::receipt::tree::{Tree, run_id};
use memra_orch::receipt::{
    Artifact, AttemptRecord, FileDigest, NodeIndexEntry, NodeReceipt, RunReceipt, sha256_hex, slug,
    write_json,
};
use memra_orch::verdict::{Verdict, count};
use serde_json::json;

const RUNS: usize = 365;
const CELLS: usize = 1_000;
const WARM: usize = 3;

fn receipt(i: usize, night: usize) -> NodeReceipt {
    let id = format!("arm{}[cell={}]", i / 100, i % 100);
    let mut r = NodeReceipt::new(
        id.clone(),
        format!("arm{}", i / 100),
        NodeKind::Arm,
        slug(&id),
    );
    let every = |n: usize| (i + night).is_multiple_of(n);
    r.verdict = if every(100) {
        Verdict::Fail
    } else {
        Verdict::Pass
    };
    r.argv = vec!["target/release/gate".into(), (i % 10).to_string()];
    r.cwd = "/work/main".into();
    r.env = (0..8)
        .map(|k| (format!("VAR_{k}"), format!("value-{k}")))
        .collect();
    r.binaries = (0..2)
        .map(|b| FileDigest {
            path: format!("/work/main/target/release/bin{b}"),
            bytes: 1 << 20,
            sha256: sha256_hex(format!("bin{b}").as_bytes()),
        })
        .collect();
    r.inputs = sha256_hex(format!("{id}{}", night / 30).as_bytes());
    r.attempts.push(AttemptRecord {
        n: 1,
        rep: 1,
        start: "2026-01-01T01:00:00.000Z".into(),
        seconds: 1.5,
        exit: Some(0),
        signal: None,
        outcome: r.verdict,
        reason: None,
        artifacts: Vec::new(),
        gpu_health: Vec::new(),
    });
    r.checks = (0..2)
        .map(|c| CheckRow {
            check: format!("check{c}"),
            status: CheckStatus::Pass,
            metrics: BTreeMap::from([
                ("max_abs".to_string(), json!(1e-3 * (c + 1) as f64)),
                ("decode_ms".to_string(), json!(120.0 + (night % 7) as f64)),
            ]),
            message: None,
            first_mismatch: None,
            extra: BTreeMap::new(),
        })
        .collect();
    r.doors = Some(BTreeMap::from([("backend".to_string(), json!("cuda"))]));
    r.artifacts = (0..2)
        .map(|a| Artifact {
            name: format!("out{a}.safetensors"),
            bytes: 1 << 16,
            sha256: sha256_hex(format!("{id}{a}{}", if every(20) { night } else { 0 }).as_bytes()),
        })
        .collect();
    r.seconds = 1.5;
    r
}

fn write_run(receipts: &Path, night: usize) {
    let t = SystemTime::UNIX_EPOCH + Duration::from_secs(1_767_229_200 + night as u64 * 86_400);
    let id = run_id(t, 0);
    let commit = format!("{:040x}", night + 1);
    let tree = Tree {
        dir: receipts.join(&commit).join("nightly").join(&id),
    };
    let mut entries = Vec::with_capacity(CELLS);
    for i in 0..CELLS {
        let r = receipt(i, night);
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
            warns: 0,
            warning: None,
        });
    }
    let start = humantime::format_rfc3339_millis(t).to_string();
    let run = RunReceipt {
        schema: 1,
        run_id: Some(id),
        carried_from: None,
        rerun_failed: false,
        name: "nightly".into(),
        manifest: FileDigest {
            path: "m.toml".into(),
            bytes: 0,
            sha256: String::new(),
        },
        env_matrices: vec![],
        commit: commit.clone(),
        commit_sha: Some(commit),
        commit_subject: None,
        dirty: false,
        code: None,
        fingerprints: Vec::new(),
        host: "h".into(),
        orchestrator_version: "0".into(),
        inventory: json!({"gpus": [{"name": "H200", "uuid": "GPU-1"}], "driver_version": "550.1"}),
        cpu_slots: 1,
        filters: vec![],
        resumed: false,
        vars: Default::default(),
        start: start.clone(),
        end: Some(start),
        seconds: Some(1500.0),
        interrupted: false,
        unmet: None,
        disk_full: None,
        excluded_gpus: Vec::new(),
        quarantined_gpus: Vec::new(),
        counts: count(entries.iter().map(|e| e.verdict)),
        verdict: "fail".into(),
        nodes: entries,
    };
    write_json(&tree.run_json(), &run).unwrap();
}

fn main() {
    let tmp = tempfile::tempdir().unwrap();
    let receipts = tmp.path().join("receipts");
    let t0 = Instant::now();
    for night in 0..RUNS {
        write_run(&receipts, night);
    }
    println!(
        "synthesized {RUNS} runs of {CELLS} cells in {:.1} s",
        t0.elapsed().as_secs_f64()
    );
    let read = |mode: index::Mode| {
        let opts = Options {
            index: mode,
            ..Options::default()
        };
        let t = Instant::now();
        let h = history::load(&receipts, "nightly", &opts).unwrap();
        (t.elapsed(), h)
    };
    let (cold, h) = read(index::Mode::Ignore);
    let file = index::path(&receipts);
    assert!(!file.exists());
    let (build, built) = read(index::Mode::Use);
    assert_eq!(built, h, "the index gives what the trees give");
    let bytes = std::fs::metadata(&file).unwrap().len();
    let mut warm: Vec<Duration> = (0..WARM).map(|_| read(index::Mode::Use).0).collect();
    warm.sort();
    let t = Instant::now();
    let one = history::load(
        &receipts,
        "nightly",
        &Options {
            filters: vec!["arm3[[]cell=42]".to_string()],
            ..Options::default()
        },
    )
    .unwrap();
    let filtered = t.elapsed();
    assert_eq!(one.cells.len(), 1);
    let t = Instant::now();
    let text = render::text(&h);
    let rendered = t.elapsed();
    let s = |d: Duration| d.as_secs_f64();
    println!(
        "{} cells × {} points, index {:.1} MB, text {:.1} MB\n",
        h.cells.len(),
        h.runs.len(),
        bytes as f64 / 1e6,
        text.len() as f64 / 1e6
    );
    println!("| stage | s |");
    println!("|---|---:|");
    println!(
        "| cold: every tree ({} receipts), no index | {:.2} |",
        RUNS * CELLS,
        s(cold)
    );
    println!(
        "| index build: every tree, then writing the index | {:.2} |",
        s(build)
    );
    println!(
        "| warm: through the index (median of {WARM}) | {:.2} |",
        s(warm[WARM / 2])
    );
    println!("| warm, one cell selected | {:.2} |", s(filtered));
    println!("| render text of every cell | {:.2} |", s(rendered));
    println!("\nthreads: {} (rayon)", rayon::current_num_threads());
}
