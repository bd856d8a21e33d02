//! Benchmarks of the plan stage and of compare nodes, printed as tables:
//! - `load_plan` on a generated 10,000-cell manifest (goal: at most 0.5 s);
//! - `compare_files` throughput on two 1 GiB F32 artifacts, per policy.
//!
//! Run with `cargo bench -p memra-orch --bench plan`. Each figure is the median of several
//! runs; compare runs read files that are already in the page cache (the first, cold run is
//! discarded), which is the situation of a compare node right after its gates wrote them.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::path::Path;
use std::time::{Duration, Instant};

use memra_orch::gate::judge::compare_files;
use memra_orch::load::load_plan;
use memra_orch::plan::Policy;
use safetensors::Dtype;
use safetensors::tensor::TensorView;

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

/// A manifest with one setup and 10 arms of 1,000 cells each (three inline axes of 10 values
/// times a pins-only env-matrix file), every arm needing the setup, and a compare node pairing
/// one arm's 1,000 cells against a one-cell reference: 10,001 + 1,000 cells.
fn write_manifest(dir: &Path) -> std::path::PathBuf {
    std::fs::write(
        dir.join("eq.toml"),
        "[pins]\nMEMRA_MMVQ = \"0\"\nMEMRA_NO_FUSE_NORMQ = \"1\"\n",
    )
    .unwrap();
    let values: Vec<String> = (0..10).map(|i| format!("\"{i}\"")).collect();
    let axis = format!("[{}]", values.join(", "));
    let mut m = String::from(
        "schema = 1\nname = \"bench\"\n[defaults]\ntimeout = \"10m\"\ngpus = 1\n[env]\nMEMRA_GATE_SEED = \"0\"\n\
         [vars]\nmodel = \"models/m.gguf\"\n[[setup]]\nid = \"build\"\nrun = [\"make\"]\ngpus = 0\n\
         [[arm]]\nid = \"ref\"\nneeds = [\"build\"]\nrun = [\"bin/gate\", \"${model}\"]\n",
    );
    for a in 0..10 {
        let _ = write!(
            m,
            "[[arm]]\nid = \"arm-{a}\"\nneeds = [\"build\"]\n\
             run = [\"bin/gate\", \"${{model}}\", \"--x\", \"${{matrix.x}}\", \"--y\", \"${{matrix.y}}\", \"--z\", \"${{matrix.z}}\", \"--out\", \"${{artifacts}}/l.safetensors\"]\n\
             matrix = {{ x = {axis}, y = {axis}, z = {axis} }}\nenv_matrix = [\"eq.toml\"]\nenv = {{ CELL = \"${{node}}\" }}\n"
        );
    }
    m.push_str(
        "[[compare]]\nid = \"cmp\"\nreference = \"ref\"\ncandidates = [\"arm-0\"]\nartifact = \"l.safetensors\"\npolicy = \"bitwise\"\n",
    );
    let path = dir.join("bench.toml");
    std::fs::write(&path, m).unwrap();
    path
}

fn bench_plan(dir: &Path) {
    let manifest = write_manifest(dir);
    let cells = load_plan(&manifest)
        .expect("the bench manifest is valid")
        .cells
        .len();
    let times: Vec<Duration> = (0..5)
        .map(|_| {
            let t = Instant::now();
            let plan = load_plan(&manifest).unwrap();
            let d = t.elapsed();
            assert_eq!(plan.cells.len(), cells);
            d
        })
        .collect();
    let t = median(times);
    println!("| stage | cells | median time | goal |");
    println!("|---|---|---|---|");
    println!(
        "| load_plan (parse, expand, substitute, link) | {cells} | {:.3} s | ≤ 0.5 s |",
        t.as_secs_f64()
    );
    println!();
}

fn write_artifact(path: &Path, rows: usize, vocab: usize, data: &[u8]) {
    let view = TensorView::new(Dtype::F32, vec![rows, vocab], data).unwrap();
    let map: HashMap<String, TensorView<'_>> = [("logits".to_string(), view)].into_iter().collect();
    safetensors::serialize_to_file(map, None, path).unwrap();
}

fn bench_compare(dir: &Path) {
    let vocab = 49_152;
    let rows = (1usize << 30) / (vocab * 4);
    let n = rows * vocab;
    let mut data: Vec<u8> = Vec::with_capacity(n * 4);
    let mut x: u32 = 0x9e37_79b9;
    for _ in 0..n {
        // xorshift: cheap, deterministic logits-like values in [-8, 8).
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        data.extend_from_slice(&((x >> 8) as f32 / (1u32 << 24) as f32 * 16.0 - 8.0).to_le_bytes());
    }
    let a = dir.join("ref.safetensors");
    let same = dir.join("same.safetensors");
    let near = dir.join("near.safetensors");
    write_artifact(&a, rows, vocab, &data);
    write_artifact(&same, rows, vocab, &data);
    // Every 1000th value moved by one ulp: bitwise must walk those rows, tolerances pass.
    for i in (0..n).step_by(1000) {
        let v = f32::from_le_bytes(data[4 * i..4 * i + 4].try_into().unwrap());
        data[4 * i..4 * i + 4].copy_from_slice(&f32::from_bits(v.to_bits() ^ 1).to_le_bytes());
    }
    write_artifact(&near, rows, vocab, &data);
    drop(data);
    let gb = (n * 4) as f64 / 1e9;
    println!(
        "| compare ({rows} × {vocab} f32, {gb:.2} GB per file) | result | median time | GB/s (one file's bytes) |"
    );
    println!("|---|---|---|---|");
    let cases: [(&str, &Path, Policy); 5] = [
        ("bitwise, identical", &same, Policy::Bitwise),
        ("bitwise, 1 in 1000 values differ", &near, Policy::Bitwise),
        (
            "tolerance + argmax, 1 in 1000 differ",
            &near,
            Policy::Tolerance {
                max_abs: Some(1e-3),
                max_rel: Some(1e-3),
                argmax: true,
            },
        ),
        (
            "tolerance, identical",
            &same,
            Policy::Tolerance {
                max_abs: Some(1e-3),
                max_rel: None,
                argmax: false,
            },
        ),
        (
            "argmax agreement",
            &near,
            Policy::ArgmaxAgree { min_agree: 0.95 },
        ),
    ];
    for (label, cand, policy) in cases {
        let _cold = compare_files(&a, cand, &policy);
        let mut passed = false;
        let times: Vec<Duration> = (0..3)
            .map(|_| {
                let t = Instant::now();
                let r = compare_files(&a, cand, &policy);
                passed = r.passed();
                t.elapsed()
            })
            .collect();
        let t = median(times).as_secs_f64();
        let verdict = if passed { "pass" } else { "fail" };
        println!("| {label} | {verdict} | {t:.3} s | {:.2} |", gb / t);
    }
    println!();
    println!("threads: {}", rayon::current_num_threads());
}

fn main() {
    let dir = tempfile::tempdir().unwrap();
    bench_plan(dir.path());
    bench_compare(dir.path());
}
