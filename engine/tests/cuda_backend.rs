//! The CUDA backend: backend selection and its errors everywhere, and on a GPU the backend
//! against the CPU backend (the same compositions up to `exp`), batch rows against the same
//! sequence alone, the equalized paths, and lean ticks against host token choice.
//!
//! GPU tests print why and return when no usable GPU is present (no driver, no CUDA
//! libraries, no device), so CI without a GPU stays green; `cuda-check` is the full
//! acceptance run on a GPU machine.

use memra_engine::backend::cpu::CpuBackend;
use memra_engine::backend::cuda::{self, CudaBackend};
use memra_engine::backend::{Backend, EngineError, SeqId, open_backend};
use memra_engine::doors::{BackendChoice, Doors};
use memra_engine::model::LlamaModel;
use memra_engine::sampling::{SamplingParams, sample_token};
use memra_kernels::twin::argmax;

fn synth(preset: &str, quant: &str) -> LlamaModel {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(format!("{preset}-{quant}.gguf"));
    memra_engine::synth::write_preset(preset, quant, 0, &path).unwrap();
    LlamaModel::open(&path).unwrap()
}

fn tokens(n_vocab: usize, seed: u32, n: usize) -> Vec<u32> {
    let mut s = seed.wrapping_mul(2_654_435_761) ^ 0x5bd1_e995;
    (0..n)
        .map(|_| {
            s = s.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            (s >> 8) % n_vocab as u32
        })
        .collect()
}

/// Whether a usable GPU is here; prints the reason when not.
fn gpu_present(test: &str) -> bool {
    match cuda::open_device(&Doors::default()) {
        Ok(_) => true,
        Err(why) => {
            eprintln!("{test}: skipped, no usable GPU: {why}");
            false
        }
    }
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

#[test]
fn backend_cuda_without_a_gpu_names_what_is_missing() {
    if cuda::open_device(&Doors::default()).is_ok() {
        eprintln!("backend_cuda_without_a_gpu_names_what_is_missing: skipped, a GPU is present");
        return;
    }
    let doors = Doors {
        backend: BackendChoice::Cuda,
        ..Doors::default()
    };
    let err = open_backend(synth("tiny", "q4_1"), &doors)
        .err()
        .expect("no GPU here, so MEMRA_BACKEND=cuda must fail");
    let EngineError::Unavailable(msg) = err else {
        panic!("expected Unavailable, got {err:?}");
    };
    assert!(msg.starts_with("MEMRA_BACKEND=cuda: "), "{msg}");
    assert!(
        msg.contains("libcuda") || msg.contains("libnvrtc") || msg.contains("device"),
        "the message names what is missing: {msg}"
    );
    assert!(msg.contains("MEMRA_BACKEND=cpu"), "and what to do: {msg}");
}

#[test]
fn backend_auto_runs_on_the_gpu_or_falls_back_to_the_cpu() {
    let doors = Doors::default();
    let be = open_backend(synth("tiny", "q4_1"), &doors).unwrap();
    let want = if cuda::open_device(&doors).is_ok() {
        "cuda"
    } else {
        "cpu"
    };
    assert_eq!(be.doors_report().backend, want);
}

#[test]
fn pipeline_over_two_devices_is_refused_with_the_fix() {
    let doors = Doors {
        backend: BackendChoice::Cuda,
        pp_stages: 2,
        pp_devices: vec![0, 1],
        ..Doors::default()
    };
    let why = cuda::open_device(&doors).err().unwrap();
    assert!(why.contains("MEMRA_PP_DEVICES=0,1"), "{why}");
    assert!(why.contains("same device"), "{why}");
}

/// Door combinations of the numeric doors.
fn combos() -> Vec<Doors> {
    let mut out = Vec::new();
    for mmvq in [true, false] {
        for no_fuse_normq in [false, true] {
            for fa3 in [true, false] {
                out.push(Doors {
                    backend: BackendChoice::Cuda,
                    mmvq,
                    no_fuse_normq,
                    fa3,
                    ..Doors::default()
                });
            }
        }
    }
    out
}

#[test]
fn cuda_prefill_matches_the_cpu_backend_in_every_door_combination() {
    if !gpu_present("cuda_prefill_matches_the_cpu_backend_in_every_door_combination") {
        return;
    }
    for quant in ["f32", "q8_0", "q4_1"] {
        let model = synth("tiny", quant);
        let v = model.config.n_vocab;
        let program = tokens(v, 3, 24);
        for doors in combos() {
            let mut cpu = CpuBackend::new(model.clone(), doors.clone()).unwrap();
            let mut gpu = CudaBackend::new(&model, doors.clone()).unwrap();
            let run = |be: &mut dyn Backend| {
                be.open_sequence(SeqId(0), 32).unwrap();
                be.prefill(SeqId(0), &program).unwrap()
            };
            let (a, b) = (run(&mut cpu), run(&mut gpu));
            let max = a
                .iter()
                .zip(&b)
                .map(|(x, y)| (x - y).abs())
                .fold(0.0f32, f32::max);
            // Only exp differs (attention, SwiGLU): ~1e-6 on these logits. Quantized weights
            // can see one q8_1 rounding flip from such a difference (see cpu_oracle.rs).
            let tol = if quant == "f32" { 1e-3 } else { 1.0 };
            assert!(max <= tol, "{quant} {doors:?}: max_abs {max} > {tol}");
            let am: Vec<u32> = a.chunks_exact(v).map(argmax).collect();
            let bm: Vec<u32> = b.chunks_exact(v).map(argmax).collect();
            if quant == "f32" {
                assert_eq!(am, bm, "{quant} {doors:?}: argmax rows differ");
            }
        }
    }
}

#[test]
fn cuda_batch_rows_are_bit_identical_to_b1_and_equalized_paths_agree() {
    if !gpu_present("cuda_batch_rows_are_bit_identical_to_b1_and_equalized_paths_agree") {
        return;
    }
    let model = synth("tiny", "q4_1");
    let v = model.config.n_vocab;
    for doors in combos() {
        let mut be = CudaBackend::new(&model, doors.clone()).unwrap();
        let seqs: Vec<SeqId> = (0..9).map(SeqId).collect();
        let prompts: Vec<Vec<u32>> = (0..9).map(|i| tokens(v, i, 2 + i as usize)).collect();
        let feeds: Vec<Vec<u32>> = (0..3).map(|s| tokens(v, 50 + s, 9)).collect();
        for (s, p) in seqs.iter().zip(&prompts) {
            be.open_sequence(*s, 32).unwrap();
            be.prefill(*s, p).unwrap();
        }
        let together: Vec<Vec<f32>> = feeds
            .iter()
            .map(|f| be.decode_step_batch(&seqs, f).unwrap())
            .collect();
        for (i, (s, p)) in seqs.iter().zip(&prompts).enumerate() {
            be.close_sequence(*s).unwrap();
            be.open_sequence(*s, 32).unwrap();
            be.prefill(*s, p).unwrap();
            for (st, f) in feeds.iter().enumerate() {
                let alone = be.decode_step_batch(&[*s], &[f[i]]).unwrap();
                assert_eq!(
                    bits(&alone),
                    bits(&together[st][i * v..(i + 1) * v]),
                    "{doors:?}: row {i} step {st} differs from the sequence alone"
                );
            }
        }
        // Single-sequence path against the batched path at B=1.
        let (a, b) = (SeqId(50), SeqId(51));
        for s in [a, b] {
            be.open_sequence(s, 32).unwrap();
            be.prefill(s, &prompts[0]).unwrap();
        }
        let feed = tokens(v, 77, 6);
        let single: Vec<f32> = feed
            .iter()
            .flat_map(|&t| be.decode_step_h(a, t).unwrap())
            .collect();
        let batched: Vec<f32> = feed
            .iter()
            .flat_map(|&t| be.decode_step_batch(&[b], &[t]).unwrap())
            .collect();
        let fused = doors.mmvq && !doors.no_fuse_normq;
        assert_eq!(
            bits(&single) == bits(&batched),
            !fused,
            "{doors:?}: the paths are bit-identical exactly when the fused tier is off"
        );
    }
}

#[test]
fn cuda_lean_ticks_pick_the_hosts_tokens() {
    if !gpu_present("cuda_lean_ticks_pick_the_hosts_tokens") {
        return;
    }
    let model = synth("tiny", "q4_1");
    let v = model.config.n_vocab;
    let mut be = CudaBackend::new(&model, Doors::default()).unwrap();
    let prompt = tokens(v, 9, 5);
    for params in [
        SamplingParams::greedy(),
        SamplingParams {
            temperature: 0.9,
            top_p: 0.8,
            seed: 3,
        },
    ] {
        let (a, b) = (SeqId(1), SeqId(2));
        for s in [a, b] {
            be.open_sequence(s, 32).unwrap();
            be.prefill(s, &prompt).unwrap();
        }
        for &t in &tokens(v, 10, 6) {
            let logits = be.decode_step_h(a, t).unwrap();
            let host = sample_token(&logits, &params, b, be.seq_len(a).unwrap()).unwrap();
            let device = be.decode_step_h_sampled(b, t, &params).unwrap();
            assert_eq!(device, host, "{params:?}");
        }
        be.close_sequence(a).unwrap();
        be.close_sequence(b).unwrap();
    }
}
