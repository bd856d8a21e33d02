//! A year of a nightly, and every read command of `memra-orch` over it, side by side with the
//! targets (docs/diff.md, "A year of receipts"). `cargo bench -p memra-orch --bench year`.
//!
//! The generator writes receipt trees shaped as `memra-orch run` leaves them: per run a
//! `run.json` with its node index, and per cell `nodes/<slug>/receipt.json` (a command, two
//! binaries, one attempt, two check rows with metrics, a doors row, two artifacts) plus the
//! attempt folder's `stdout.log`, `stderr.log` and `checks.jsonl`. Each night 1 % of the cells
//! fail and 5 % of the artifact digests move; a commit lands every third night; every fourth
//! night with a failure is followed by a rerun of its failed cells (the others carried), as a
//! cron job's `--rerun-failed` leaves them. Shapes (`MEMRA_BENCH_YEAR`, default both):
//! `460x224` (365 nights + 95 reruns of the shipped nightly's 224 cells) and `365x1000`; `40x1000`
//! (the newest 40 nights of the latter) on request.
//!
//! Each command is the release binary run as a user runs it; the table gives its wall time
//! warm (median of 5, the files in the page cache) and cold (the page cache dropped first:
//! needs root, else marked n/a), and its peak resident memory (the child's `ru_maxrss`).
//! `gc --keep 30` runs last, on the generated year itself. Set `MEMRA_BENCH_DIR` to keep the
//! generated trees between runs (a year is generated once per shape there).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime};

use memra_orch::gate::checks::{CheckRow, CheckStatus};
use memra_orch::plan::NodeKind;
use memra_orch::receipt::tree::{Tree, run_id};
use memra_orch::receipt::{
    Artifact, AttemptRecord, Carried, FileDigest, NodeIndexEntry, NodeReceipt, RunReceipt,
    sha256_hex, slug, write_json,
};
use memra_orch::words::verdict::{Verdict, count};
use serde_json::json;

const NAME: &str = "nightly";
const WARM: usize = 5;

struct Shape {
    nights: usize,
    reruns: usize,
    cells: usize,
}

impl Shape {
    fn label(&self) -> String {
        format!("{}x{}", self.nights + self.reruns, self.cells)
    }
}

fn cell_id(i: usize) -> String {
    format!("arm{}[cell={}]", i / 16, i % 16)
}

fn fails(i: usize, night: usize) -> bool {
    (i * 7 + night * 13).is_multiple_of(100)
}

fn receipt(i: usize, night: usize, commit: &str) -> NodeReceipt {
    let id = cell_id(i);
    let mut r = NodeReceipt::new(
        id.clone(),
        format!("arm{}", i / 16),
        NodeKind::Arm,
        slug(&id),
    );
    r.verdict = if fails(i, night) {
        Verdict::Fail
    } else {
        Verdict::Pass
    };
    r.argv = vec!["target/release/gate".into(), (i % 16).to_string()];
    r.cwd = "/work/main".into();
    r.env = (0..8)
        .map(|k| (format!("VAR_{k}"), format!("value-{k}")))
        .collect();
    r.binaries = (0..2)
        .map(|b| FileDigest {
            path: format!("/work/main/target/release/bin{b}"),
            bytes: 1 << 20,
            sha256: sha256_hex(format!("bin{b}{commit}").as_bytes()),
        })
        .collect();
    r.inputs = sha256_hex(format!("{id}{commit}").as_bytes());
    r.attempts.push(AttemptRecord {
        n: 1,
        rep: 1,
        start: "2026-01-01T01:00:00.000Z".into(),
        seconds: 1.5,
        exit: Some(if r.verdict == Verdict::Pass { 0 } else { 1 }),
        signal: None,
        outcome: r.verdict,
        reason: None,
        artifacts: Vec::new(),
        gpu_health: Vec::new(),
    });
    r.checks = (0..2)
        .map(|c| CheckRow {
            check: format!("check{c}"),
            status: if r.verdict == Verdict::Pass || c == 0 {
                CheckStatus::Pass
            } else {
                CheckStatus::Fail
            },
            metrics: BTreeMap::from([
                ("max_abs".to_string(), json!(1e-3 * (c + 1) as f64)),
                (
                    "decode_ms".to_string(),
                    json!(120.0 + ((night / 90) * 5) as f64 + (night % 7) as f64 * 0.1),
                ),
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
            sha256: sha256_hex(
                format!(
                    "{id}{a}{}",
                    if (i + night).is_multiple_of(20) {
                        night
                    } else {
                        0
                    }
                )
                .as_bytes(),
            ),
        })
        .collect();
    r.seconds = 1.5;
    r
}

/// One run: night `night`'s (or its rerun, carrying the cells that passed).
fn write_run(receipts: &Path, shape: &Shape, night: usize, rerun_of: Option<&str>) -> String {
    let offset = if rerun_of.is_some() { 3_600 } else { 0 };
    // The year ends yesterday: a run dated in the future is of unknown age to memra-orch.
    let now = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let first = (now / 86_400 - shape.nights as u64 - 1) * 86_400 + 3_600;
    let t = SystemTime::UNIX_EPOCH + Duration::from_secs(first + night as u64 * 86_400 + offset);
    let id = run_id(t, 0);
    let commit = format!("{:040x}", night / 3 + 1);
    let tree = Tree {
        dir: receipts.join(&commit).join(NAME).join(&id),
    };
    let mut entries = Vec::with_capacity(shape.cells);
    for i in 0..shape.cells {
        let carried = rerun_of.filter(|_| !fails(i, night));
        let mut r = receipt(i, night, &commit);
        if rerun_of.is_some() && carried.is_none() {
            // The rerun's attempt passes.
            r.verdict = Verdict::Pass;
            r.checks
                .iter_mut()
                .for_each(|c| c.status = CheckStatus::Pass);
        }
        // A carried receipt stays in the run that measured it.
        if carried.is_none() {
            let node = tree.node_dir(&r.slug);
            let attempt = node.join("attempt-1");
            std::fs::create_dir_all(&attempt).unwrap();
            write_json(&tree.receipt_json(&r.slug), &r).unwrap();
            std::fs::write(
                attempt.join("stdout.log"),
                format!("cell {i} night {night}\n"),
            )
            .unwrap();
            std::fs::write(attempt.join("stderr.log"), "").unwrap();
            let rows: String = r
                .checks
                .iter()
                .map(|c| serde_json::to_string(c).unwrap() + "\n")
                .collect();
            std::fs::write(attempt.join("checks.jsonl"), rows).unwrap();
        }
        entries.push(NodeIndexEntry {
            id: r.id.clone(),
            kind: r.kind,
            slug: Some(r.slug.clone()),
            verdict: r.verdict,
            seconds: r.seconds,
            reason: None,
            carried: carried.map(|from| Carried::from_run(Some(from))),
            warns: 0,
            warning: None,
        });
    }
    let start = humantime::format_rfc3339_millis(t).to_string();
    let end = humantime::format_rfc3339_millis(t + Duration::from_secs(1_500)).to_string();
    let counts = count(entries.iter().map(|e| e.verdict));
    let green = entries.iter().all(|e| e.verdict == Verdict::Pass);
    let run = RunReceipt {
        schema: 1,
        run_id: Some(id.clone()),
        carried_from: rerun_of.map(str::to_string),
        rerun_failed: rerun_of.is_some(),
        name: NAME.into(),
        manifest: FileDigest {
            path: "manifests/nightly.toml".into(),
            bytes: 0,
            sha256: String::new(),
        },
        env_matrices: vec![],
        commit: commit.clone(),
        commit_sha: Some(commit.clone()),
        commit_subject: Some(format!("Change number {}", night / 3 + 1)),
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
        start,
        end: Some(end),
        seconds: Some(1500.0),
        interrupted: false,
        unmet: None,
        disk_full: None,
        excluded_gpus: Vec::new(),
        quarantined_gpus: Vec::new(),
        counts,
        verdict: if green { "pass" } else { "fail" }.into(),
        nodes: entries,
    };
    write_json(&tree.run_json(), &run).unwrap();
    // Filed as `run` files it: measured as a tree first (what a night cost before packing),
    // then packed unless MEMRA_BENCH_UNPACKED is set.
    let (bytes, files, dirs) = du(&tree.dir);
    AS_TREES[0].fetch_add(bytes, Ordering::Relaxed);
    AS_TREES[1].fetch_add(files, Ordering::Relaxed);
    AS_TREES[2].fetch_add(dirs + 1, Ordering::Relaxed);
    if std::env::var_os("MEMRA_BENCH_UNPACKED").is_none() {
        memra_orch::receipt::pack::pack(&tree.dir).unwrap();
    }
    id
}

/// Bytes, files and folders of the runs generated, measured as trees before packing.
static AS_TREES: [AtomicU64; 3] = [AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0)];

/// Generates the year of `shape` under `receipts` unless a finished one is there.
fn generate(receipts: &Path, shape: &Shape) {
    let done = receipts.join(".bench-year-done");
    if done.exists() {
        return;
    }
    let _ = std::fs::remove_dir_all(receipts);
    let t0 = Instant::now();
    let mut reruns = 0;
    for night in 0..shape.nights {
        let id = write_run(receipts, shape, night, None);
        let failed = (0..shape.cells).any(|i| fails(i, night));
        if failed
            && reruns < shape.reruns
            && (night % 4 == 0 || shape.nights - night <= shape.reruns - reruns)
        {
            write_run(receipts, shape, night, Some(&id));
            reruns += 1;
        }
    }
    std::fs::write(
        &done,
        format!(
            "{} {} {}",
            AS_TREES[0].load(Ordering::Relaxed),
            AS_TREES[1].load(Ordering::Relaxed),
            AS_TREES[2].load(Ordering::Relaxed)
        ),
    )
    .unwrap();
    println!(
        "generated {} runs ({} reruns) of {} cells in {:.0} s",
        shape.nights + reruns,
        reruns,
        shape.cells,
        t0.elapsed().as_secs_f64()
    );
}

/// Wall time and peak resident memory (KiB) of one run of the binary.
fn measure(bin: &Path, args: &[String], cwd: &Path) -> (Duration, i64, bool) {
    let t = Instant::now();
    #[allow(clippy::zombie_processes)] // reaped by wait4 below, which also gives its rusage
    let child = Command::new(bin)
        .args(args)
        .current_dir(cwd)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut status = 0;
    // SAFETY: an all-zero rusage is a valid value for wait4 to fill.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: waits for our own child, writing into the two locals.
    let r = unsafe { libc::wait4(child.id() as i32, &mut status, 0, &mut usage) };
    assert_eq!(r, child.id() as i32);
    let ok = libc::WIFEXITED(status) && libc::WEXITSTATUS(status) <= 1;
    (t.elapsed(), usage.ru_maxrss, ok)
}

fn drop_caches() -> bool {
    let _ = Command::new("sync").status();
    std::fs::write("/proc/sys/vm/drop_caches", "3").is_ok()
}

fn du(path: &Path) -> (u64, u64, u64) {
    let (mut bytes, mut files, mut dirs) = (0, 0, 0);
    let mut stack = vec![path.to_path_buf()];
    while let Some(p) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&p) else {
            continue;
        };
        for e in entries.flatten() {
            let Ok(m) = e.metadata() else { continue };
            use std::os::unix::fs::MetadataExt;
            bytes += m.blocks() * 512;
            if m.is_dir() {
                dirs += 1;
                stack.push(e.path());
            } else {
                files += 1;
            }
        }
    }
    (bytes, files, dirs)
}

fn bench(shape: &Shape, base: &Path, bin: &Path) {
    let dir = base.join(shape.label());
    std::fs::create_dir_all(&dir).unwrap();
    let receipts = dir.join("receipts");
    // Generated by a child process: a command's peak memory (the child's `ru_maxrss`)
    // counts the memory of the process it was spawned from until its exec, so the process
    // that spawns the measured commands must stay small.
    if !receipts.join(".bench-year-done").exists() {
        let status = Command::new(std::env::current_exe().unwrap())
            .env(GENERATE, receipts.as_os_str())
            .env("MEMRA_BENCH_YEAR", shape.label())
            .status()
            .unwrap();
        assert!(status.success(), "generating the year failed");
    }
    let (bytes, files, dirs) = du(&receipts);
    // What the runs took as trees, as the generator measured them before packing.
    let trees: Vec<u64> = std::fs::read_to_string(receipts.join(".bench-year-done"))
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|w| w.parse().ok())
        .collect();
    let site = dir.join("site");
    let site_30 = dir.join("site-30");
    let r = receipts.to_string_lossy().to_string();
    // One cell by its whole id, `[` escaped as a glob would need it (`[…]` is a class).
    let one_cell = cell_id(42.min(shape.cells - 1)).replacen('[', "[[]", 1);
    let commands: Vec<(&str, Vec<String>, &str)> = vec![
        (
            "history CELL",
            vec!["history".into(), one_cell],
            "< 0.1 s warm, < 0.5 s cold, < 64 MiB",
        ),
        (
            "history --last 30",
            vec!["history".into(), "--last".into(), "30".into()],
            "< 0.1 s warm, < 0.5 s cold, < 64 MiB",
        ),
        (
            "ls",
            vec!["ls".into()],
            "< 0.1 s warm, < 0.5 s cold, < 64 MiB",
        ),
        (
            "show latest",
            vec!["show".into(), "latest".into()],
            "< 0.1 s warm, < 0.5 s cold, < 64 MiB",
        ),
        (
            "diff latest previous",
            vec!["diff".into(), "latest".into(), "previous".into()],
            "resolution < 0.1 s warm",
        ),
        (
            "report --html --last 30",
            vec![
                "report".into(),
                "--html".into(),
                site_30.to_string_lossy().into(),
                "--last".into(),
                "30".into(),
            ],
            "< 1 s, < 128 MiB",
        ),
        (
            "report --html --last 100000 (every run)",
            vec![
                "report".into(),
                "--html".into(),
                site.to_string_lossy().into(),
                "--last".into(),
                "100000".into(),
            ],
            "< 10 s, index page < 1 MB",
        ),
    ];
    println!(
        "\n### {} runs × {} cells: receipts {:.2} GB, {} files + {} folders\n",
        shape.nights + shape.reruns,
        shape.cells,
        bytes as f64 / 1e9,
        files,
        dirs
    );
    if let [tb, tf, td] = trees[..] {
        let runs = (shape.nights + shape.reruns) as f64;
        println!(
            "as trees (before packing): {:.2} GB, {tf} files + {td} folders; per night {:.2} MB \
             and {:.0} entries as trees, {:.2} MB and {:.0} entries as filed ({:.2}×)\n",
            tb as f64 / 1e9,
            tb as f64 / runs / 1e6,
            (tf + td) as f64 / runs,
            bytes as f64 / runs / 1e6,
            (files + dirs) as f64 / runs,
            bytes as f64 / tb.max(1) as f64
        );
    }
    println!("| command | warm s (median of {WARM}) | cold s | peak MiB | target |");
    println!("|---|---:|---:|---:|---|");
    for (label, args, target) in &commands {
        let mut args = args.clone();
        args.extend(["--receipts".to_string(), r.clone()]);
        // The first run builds whatever cache the command keeps (the index): not timed.
        let (_, _, ok) = measure(bin, &args, &dir);
        let cold = if drop_caches() {
            let (t, _, _) = measure(bin, &args, &dir);
            format!("{:.2}", t.as_secs_f64())
        } else {
            "n/a".to_string()
        };
        let mut warm: Vec<(Duration, i64)> = (0..WARM)
            .map(|_| {
                let (t, rss, _) = measure(bin, &args, &dir);
                (t, rss)
            })
            .collect();
        warm.sort();
        let peak = warm.iter().map(|w| w.1).max().unwrap_or(0);
        println!(
            "| `{label}`{} | {:.3} | {cold} | {:.0} | {target} |",
            if ok { "" } else { " (failed)" },
            warm[WARM / 2].0.as_secs_f64(),
            peak as f64 / 1024.0,
        );
    }
    let page = std::fs::metadata(site.join("index.html")).map_or(0, |m| m.len());
    println!("\nreport index.html: {:.2} MB", page as f64 / 1e6);
    let index =
        std::fs::metadata(receipts.join(".memra-index/index.sqlite")).map_or(0, |m| m.len());
    println!("history index: {:.1} MB", index as f64 / 1e6);
    if std::env::var_os("MEMRA_BENCH_NO_GC").is_none() {
        let args = vec![
            "gc".into(),
            "--keep".into(),
            "30".into(),
            "--receipts".into(),
            r.clone(),
        ];
        let (t, rss, ok) = measure(bin, &args, &dir);
        println!(
            "`gc --keep 30`{}: {:.2} s, {:.0} MiB (target < 5 s); the year is generated again next time",
            if ok { "" } else { " (failed)" },
            t.as_secs_f64(),
            rss as f64 / 1024.0
        );
        let _ = std::fs::remove_file(receipts.join(".bench-year-done"));
    }
}

/// Set (to the receipts folder) in the child process that generates a year.
const GENERATE: &str = "MEMRA_BENCH_GENERATE";

fn main() {
    let bin = PathBuf::from(env!("CARGO_BIN_EXE_memra-orch"));
    let generating = std::env::var_os(GENERATE).map(PathBuf::from);
    let keep = std::env::var_os("MEMRA_BENCH_DIR").map(PathBuf::from);
    let tmp = tempfile::tempdir().unwrap();
    let base = keep.unwrap_or_else(|| tmp.path().to_path_buf());
    let wanted = std::env::var("MEMRA_BENCH_YEAR").unwrap_or_else(|_| "460x224,365x1000".into());
    if generating.is_none() {
        println!("memra-orch {} over a generated year", bin.display());
    }
    for w in wanted.split(',') {
        let shape = match w.trim() {
            "460x224" => Shape {
                nights: 365,
                reruns: 95,
                cells: 224,
            },
            "365x1000" => Shape {
                nights: 365,
                reruns: 0,
                cells: 1000,
            },
            // The newest 40 nights of the 1,000-cell nightly: every command that reads a
            // window of 30 runs reads what it reads in the whole year, in minutes rather
            // than the better part of an hour of generating.
            "40x1000" => Shape {
                nights: 40,
                reruns: 0,
                cells: 1000,
            },
            other => panic!(
                "MEMRA_BENCH_YEAR: unknown shape {other:?}; use 460x224, 365x1000 or 40x1000"
            ),
        };
        match &generating {
            Some(receipts) => {
                generate(receipts, &shape);
                return;
            }
            None => bench(&shape, &base, &bin),
        }
    }
}
