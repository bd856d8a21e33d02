//! Synthetic checkpoints: they load through the GGUF reader as the preset's llama shape, with
//! the promised tensor types and weight statistics, and the bytes are a pure function of
//! (preset, type, seed).

mod common;

use memra_engine::gguf::{GgmlType, GgufFile};
use memra_engine::hparams::LlamaHparams;
use memra_engine::synth::{self, QUANTS};
use sha2::{Digest, Sha256};

fn sha256_file(path: &std::path::Path) -> String {
    let bytes = std::fs::read(path).unwrap();
    Sha256::digest(&bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

#[test]
fn tiny_loads_in_every_type_with_the_preset_shape() {
    let preset = synth::preset("tiny").unwrap();
    for quant in QUANTS {
        let path = common::synth_model("tiny", quant, 0);
        let f = GgufFile::open(&path).unwrap();
        let hp = LlamaHparams::from_gguf(&f).unwrap();
        assert_eq!(hp, preset.hparams, "{quant}");
        let ty = synth::parse_quant(quant).unwrap();
        let embd_ty = if ty.is_quantized() {
            GgmlType::Q8_0
        } else {
            ty
        };
        assert_eq!(f.require_tensor("token_embd.weight").unwrap().ty, embd_ty);
        assert_eq!(f.require_tensor("blk.3.ffn_down.weight").unwrap().ty, ty);
        assert_eq!(
            f.require_tensor("blk.0.attn_norm.weight").unwrap().ty,
            GgmlType::F32
        );
        assert!(
            f.tensor("output.weight").is_none(),
            "tiny ties the output head"
        );
        for t in f.tensors() {
            let x = f.dequantize(&t.name).unwrap();
            assert!(x.iter().all(|v| v.is_finite()), "{quant} {}", t.name);
        }
    }
}

#[test]
fn untied_preset_has_an_output_head() {
    let path = common::synth_model("tiny-untied", "q8_0", 0);
    let f = GgufFile::open(&path).unwrap();
    let hp = LlamaHparams::from_gguf(&f).unwrap();
    assert!(!hp.tied_output);
    let out = f.require_tensor("output.weight").unwrap();
    assert_eq!(
        (out.ty, out.shape.clone()),
        (GgmlType::Q8_0, vec![128, 512])
    );
}

fn mean_std(x: &[f32]) -> (f64, f64) {
    let n = x.len() as f64;
    let mean = x.iter().map(|&v| v as f64).sum::<f64>() / n;
    let var = x.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / n;
    (mean, var.sqrt())
}

#[test]
fn weights_have_trained_like_statistics() {
    let path = common::synth_model("tiny", "f32", 0);
    let f = GgufFile::open(&path).unwrap();
    // Norm gains sit near 1.
    let (m, s) = mean_std(&f.dequantize("blk.1.attn_norm.weight").unwrap());
    assert!(
        (m - 1.0).abs() < 0.03 && (s - 0.1).abs() < 0.03,
        "norm {m} {s}"
    );
    // Projections: std 1/sqrt(fan_in) times a per-row scale averaging 1.
    let (m, s) = mean_std(&f.dequantize("blk.1.attn_q.weight").unwrap());
    let want = 1.0 / 128f64.sqrt();
    assert!(
        m.abs() < 0.005 && (s / want - 1.0).abs() < 0.08,
        "attn_q {m} {s} vs {want}"
    );
    // Residual projections are damped by sqrt(2 * n_layer).
    let (_, s_down) = mean_std(&f.dequantize("blk.1.ffn_down.weight").unwrap());
    let want = 1.0 / 384f64.sqrt() / 8f64.sqrt();
    assert!(
        (s_down / want - 1.0).abs() < 0.08,
        "ffn_down {s_down} vs {want}"
    );
    // Rows differ in magnitude (per-row scale in [0.75, 1.25)).
    let e = f.dequantize("token_embd.weight").unwrap();
    let row_std: Vec<f64> = e.chunks(128).map(|r| mean_std(r).1).collect();
    let (lo, hi) = row_std
        .iter()
        .fold((f64::MAX, 0.0f64), |(lo, hi), &v| (lo.min(v), hi.max(v)));
    assert!(hi / lo > 1.3, "row scales {lo}..{hi}");
}

#[test]
fn same_inputs_give_the_same_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let a = dir.path().join("a.gguf");
    let b = dir.path().join("b.gguf");
    let c = dir.path().join("c.gguf");
    synth::write_preset("tiny", "q4_1", 7, &a).unwrap();
    synth::write_preset("tiny", "q4_1", 7, &b).unwrap();
    synth::write_preset("tiny", "q4_1", 8, &c).unwrap();
    assert_eq!(sha256_file(&a), sha256_file(&b));
    assert_ne!(sha256_file(&a), sha256_file(&c));
    // Single-threaded generation gives the same bytes as the default pool.
    let d = dir.path().join("d.gguf");
    rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .unwrap()
        .install(|| synth::write_preset("tiny", "q4_1", 7, &d).unwrap());
    assert_eq!(sha256_file(&a), sha256_file(&d));
}

/// The banked digest of `tiny q4_1 seed 0`: it changes only when the synthesis changes on
/// purpose (then update it) or the arithmetic differs across machines (a bug).
#[test]
fn tiny_q4_1_seed_0_digest_is_stable() {
    let path = common::synth_model("tiny", "q4_1", 0);
    assert_eq!(sha256_file(&path), TINY_Q4_1_SEED0_SHA256);
}

const TINY_Q4_1_SEED0_SHA256: &str =
    "c1c9b0476ab2b399a9a842a196dba5f562fa14844b1b0312f15180a6c0c8f040";

#[test]
fn write_is_atomic_and_reports_what_it_wrote() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("m.gguf");
    let s = synth::write_preset("tiny", "bf16", 3, &p).unwrap();
    assert_eq!(s.file_bytes, std::fs::metadata(&p).unwrap().len());
    assert_eq!(s.n_tensors, GgufFile::open(&p).unwrap().tensors().len());
    let names: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(
        names,
        vec![std::ffi::OsString::from("m.gguf")],
        "no temporary file is left"
    );
    // A folder that does not exist is an error naming the path, not a panic.
    let e =
        synth::write_preset("tiny", "f32", 0, &dir.path().join("no/such/dir/m.gguf")).unwrap_err();
    assert!(e.to_string().contains("no/such/dir"), "{e}");
}

/// Prints how long the large presets take to synthesize (run with `--ignored --nocapture`;
/// set MEMRA_SYNTH_7B=1 to include the ~4 GB llama-7b shape). A measurement, not a check.
#[test]
#[ignore]
fn large_preset_timing() {
    let dir = tempfile::tempdir().unwrap();
    let mut cases = vec![("smollm2-135m", "q4_1"), ("smollm2-135m", "f16")];
    if std::env::var("MEMRA_SYNTH_7B").is_ok_and(|v| v == "1") {
        cases.push(("llama-7b", "q4_1"));
    }
    println!("threads: {}", rayon::current_num_threads());
    println!("| preset | type | bytes | seconds | MB/s |");
    println!("|---|---|---:|---:|---:|");
    for (preset, quant) in cases {
        let p = dir.path().join(format!("{preset}-{quant}.gguf"));
        let s = synth::write_preset(preset, quant, 0, &p).unwrap();
        println!(
            "| {preset} | {quant} | {} | {:.2} | {:.0} |",
            s.file_bytes,
            s.seconds,
            s.file_bytes as f64 / 1e6 / s.seconds
        );
        std::fs::remove_file(&p).unwrap();
    }
}

/// Tensors above 2^20 elements are generated in several chunks in parallel; the bytes must not
/// depend on how many threads share them.
#[test]
fn multi_chunk_tensors_do_not_depend_on_the_thread_count() {
    let mut hp = synth::preset("tiny").unwrap().hparams;
    hp.n_layer = 1;
    hp.n_embd = 64;
    hp.n_vocab = 40_000; // a 2.56M-element embedding: three chunks
    let dir = tempfile::tempdir().unwrap();
    let write = |threads: usize, name: &str| {
        let p = dir.path().join(name);
        rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap()
            .install(|| synth::write_model("wide", &hp, GgmlType::Q4_1, 3, &p).unwrap());
        sha256_file(&p)
    };
    assert_eq!(write(1, "one.gguf"), write(3, "three.gguf"));
}

#[test]
fn shape_specs_write_models_of_that_shape() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("deep.gguf");
    // n_head * head_dim (64) differs from n_embd (128), so the file carries key_length.
    let spec = "tiny:n_layer=6,n_head=8,n_head_kv=2,head_dim=8,n_vocab=300";
    synth::write_preset(spec, "q4_0", 1, &p).unwrap();
    let hp = LlamaHparams::from_gguf(&GgufFile::open(&p).unwrap()).unwrap();
    assert_eq!(hp, synth::shape_spec(spec).unwrap());
    assert_eq!((hp.n_layer, hp.q_dim(), hp.kv_dim()), (6, 64, 16));
    // Shapes the formats cannot hold are refused before anything is written.
    for (spec, why) in [
        (
            "tiny:n_embd=100",
            "n_embd = 100 is not a positive multiple of q4_0's block of 32",
        ),
        ("tiny:n_vocab=100", "n_vocab = 100 is below 259"),
        ("tiny:n_head_kv=3", "heads must be a multiple of KV heads"),
        ("tiny:rms_eps=0", "eps in (0, 1)"),
    ] {
        let e = synth::write_preset(spec, "q4_0", 1, &p)
            .unwrap_err()
            .to_string();
        assert!(e.contains(why), "{spec}: {e}");
    }
}
