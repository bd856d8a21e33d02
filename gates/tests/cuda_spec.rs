//! Speculative decoding on the CUDA backend: the verify forward bit-identical to the CPU
//! backend's in every door combination (one pass and more than one pass of rows), its
//! columns to the batched path's B=1 steps, the speculative greedy stream to plain greedy
//! decoding for K = 1, 4, 8 single and batched, rewinds leaving no trace, a verify split
//! across two stages on one device equal to the unsplit verify, and each planted spec defect
//! reaching the CUDA backend; the q8_0 KV cache (`MEMRA_KV_Q8=1`, and its coarse planted
//! defect) bit-identical to the CPU backend's on prompts, decode steps and verifies.
//!
//! GPU tests print why and return when no usable GPU is present, so CI without a GPU stays
//! green; the `spec` and `ppspec` cells of manifests/h200-single.toml run the gates there.

#[path = "../../engine/tests/common/mod.rs"]
mod common;

use common::gpu_present;
use memra_engine::backend::cpu::CpuBackend;
use memra_engine::backend::cuda::CudaBackend;
use memra_engine::backend::{Backend, SeqId};
use memra_engine::doors::{BackendChoice, Doors, GateDefect};
use memra_engine::model::LlamaModel;
use memra_engine::spec::{Drafting, SpecStats};
use memra_gates::spec::{plain, speculative};

fn synth(preset: &str, quant: &str) -> LlamaModel {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(format!("{preset}-{quant}.gguf"));
    memra_engine::synth::write_preset(preset, quant, 0, &path).unwrap();
    LlamaModel::open(&path).unwrap()
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

fn cuda_doors() -> Doors {
    Doors {
        backend: BackendChoice::Cuda,
        ..Doors::default()
    }
}

/// Door combinations of the numeric doors.
fn combos() -> Vec<Doors> {
    let mut out = Vec::new();
    for mmvq in [true, false] {
        for no_fuse_normq in [false, true] {
            for fa3 in [true, false] {
                out.push(Doors {
                    mmvq,
                    no_fuse_normq,
                    fa3,
                    ..cuda_doors()
                });
            }
        }
    }
    out
}

fn motif(n_vocab: usize, len: usize, salt: u32) -> Vec<u32> {
    (0..len)
        .map(|i| ((i % 5) as u32 * 37 + salt * 11 + 3) % n_vocab as u32)
        .collect()
}

/// A verify of `seqs` sequences at once (prompts of uneven length, drafts of uneven length),
/// returned as bits; 8 sequences of 9 columns is more than one pass of rows.
fn verify_program(be: &mut dyn Backend, seqs: usize) -> Vec<u32> {
    let v = be.config().n_vocab;
    let ids: Vec<SeqId> = (0..seqs as u32).map(SeqId).collect();
    let mut drafts = Vec::new();
    for (i, &s) in ids.iter().enumerate() {
        be.open_sequence(s, 80).unwrap();
        be.prime(s, &motif(v, 7 + 3 * i, i as u32)).unwrap();
        drafts.push(motif(v, 9 - i % 3, 40 + i as u32));
    }
    let out = be.verify_batch(&ids, &drafts).unwrap();
    for s in ids {
        be.close_sequence(s).unwrap();
    }
    bits(&out)
}

#[test]
fn cuda_verify_is_bit_identical_to_the_cpu_backend_in_every_door_combination() {
    if !gpu_present("cuda_verify_is_bit_identical_to_the_cpu_backend_in_every_door_combination") {
        return;
    }
    for quant in ["q4_1", "q8_0", "f32"] {
        let model = synth("tiny-untied", quant);
        for doors in combos() {
            let mut cpu = CpuBackend::new(model.clone(), doors.clone()).unwrap();
            let mut gpu = CudaBackend::new(&model, doors.clone()).unwrap();
            for seqs in [1, 8] {
                let (a, b) = (
                    verify_program(&mut cpu, seqs),
                    verify_program(&mut gpu, seqs),
                );
                let differ = a.iter().zip(&b).filter(|(x, y)| x != y).count();
                assert_eq!(
                    differ, 0,
                    "{quant} {doors:?} seqs={seqs}: {differ} logits differ"
                );
            }
        }
    }
}

#[test]
fn cuda_verify_columns_are_the_batched_steps_and_rewinds_leave_no_trace() {
    if !gpu_present("cuda_verify_columns_are_the_batched_steps_and_rewinds_leave_no_trace") {
        return;
    }
    for preset in ["tiny-untied", "smollm2-135m"] {
        let model = synth(preset, "q4_1");
        let v = model.config.n_vocab;
        let run = |defect: Option<GateDefect>| {
            let mut be = CudaBackend::new(
                &model,
                Doors {
                    gate_defect: defect,
                    ..cuda_doors()
                },
            )
            .unwrap();
            let prompt = motif(v, 11, 2);
            let feed = motif(v, 6, 9);
            be.open_sequence(SeqId(0), 40).unwrap();
            be.prime(SeqId(0), &prompt).unwrap();
            let mut steps = Vec::new();
            for &t in &feed {
                steps.extend(be.decode_step_batch(&[SeqId(0)], &[t]).unwrap());
            }
            be.open_sequence(SeqId(1), 40).unwrap();
            be.prime(SeqId(1), &prompt).unwrap();
            let verify = be
                .verify_batch(&[SeqId(1)], std::slice::from_ref(&feed))
                .unwrap();
            let columns = bits(&verify) == bits(&steps);
            // Keep the first two, rewind past the rest, decode on: as if never verified.
            be.rewind(SeqId(1), prompt.len() + 2).unwrap();
            be.open_sequence(SeqId(2), 40).unwrap();
            be.prime(SeqId(2), &prompt).unwrap();
            for &t in &feed[..2] {
                be.decode_step_batch(&[SeqId(2)], &[t]).unwrap();
            }
            let mut after = (Vec::new(), Vec::new());
            for t in [5u32, 6, 7] {
                after
                    .0
                    .extend(be.decode_step_batch(&[SeqId(1)], &[t]).unwrap());
                after
                    .1
                    .extend(be.decode_step_batch(&[SeqId(2)], &[t]).unwrap());
            }
            (columns, bits(&after.0) == bits(&after.1))
        };
        assert_eq!(run(None), (true, true), "{preset}");
        assert_eq!(
            run(Some(GateDefect::VerifyColumn)),
            (false, true),
            "{preset}"
        );
        assert_eq!(run(Some(GateDefect::RewindSlot)), (true, false), "{preset}");
    }
}

/// Greedy streams of `prompts`: plain (each alone on the batched path at B=1) or
/// speculative with drafts of up to `k`, as spec-gate runs them.
fn streams(
    be: &mut dyn Backend,
    prompts: &[Vec<u32>],
    n_new: usize,
    k: Option<usize>,
) -> (Vec<Vec<u32>>, SpecStats) {
    match k {
        None => (
            plain(be, &Doors::default(), prompts, n_new)
                .unwrap()
                .streams,
            SpecStats::default(),
        ),
        Some(k) => {
            let (streams, stats, _) =
                speculative(be, prompts, n_new, k, Drafting::Lookup, false).unwrap();
            (streams, stats)
        }
    }
}

#[test]
fn cuda_speculative_greedy_equals_plain_greedy_for_every_k() {
    if !gpu_present("cuda_speculative_greedy_equals_plain_greedy_for_every_k") {
        return;
    }
    let model = synth("tiny-untied", "q4_1");
    let v = model.config.n_vocab;
    let prompts: Vec<Vec<u32>> = (0..4).map(|b| motif(v, 8 + 3 * b, b as u32)).collect();
    let mut be = CudaBackend::new(&model, cuda_doors()).unwrap();
    let (want, _) = streams(&mut be, &prompts, 24, None);
    let mut accepted = 0;
    for k in [1, 4, 8] {
        let (single, _) = streams(&mut be, &prompts[..1], 24, Some(k));
        assert_eq!(single[0], want[0], "K={k} single");
        let (batched, st) = streams(&mut be, &prompts, 24, Some(k));
        assert_eq!(batched, want, "K={k} batched");
        accepted += st.accepted;
    }
    assert!(
        accepted > 0,
        "no draft was accepted: nothing speculative was tested"
    );
}

#[test]
fn cuda_split_verify_equals_the_unsplit_verify_and_stage_column_breaks_it() {
    if !gpu_present("cuda_split_verify_equals_the_unsplit_verify_and_stage_column_breaks_it") {
        return;
    }
    let model = synth("tiny-untied", "q4_1");
    let whole = verify_program(&mut CudaBackend::new(&model, cuda_doors()).unwrap(), 8);
    let split = |defect| Doors {
        pp_stages: 2,
        pp_devices: vec![0, 0],
        pp_allow_unsplit_batch: true,
        gate_defect: defect,
        ..cuda_doors()
    };
    let clean = verify_program(&mut CudaBackend::new(&model, split(None)).unwrap(), 8);
    assert_eq!(clean, whole);
    let bad = verify_program(
        &mut CudaBackend::new(&model, split(Some(GateDefect::StageColumn))).unwrap(),
        8,
    );
    assert_ne!(
        bad, whole,
        "stage-column must move the split verify on the GPU"
    );
}

/// Prefill, single and batched decode steps and a verify, as bits.
fn kv_program(be: &mut dyn Backend) -> Vec<u32> {
    let v = be.config().n_vocab;
    let mut out = Vec::new();
    be.open_sequence(SeqId(0), 90).unwrap();
    be.open_sequence(SeqId(1), 90).unwrap();
    out.extend(bits(&be.prefill(SeqId(0), &motif(v, 70, 1)).unwrap()));
    be.prime(SeqId(1), &motif(v, 9, 2)).unwrap();
    for t in 0..4u32 {
        out.extend(bits(&be.decode_step_h(SeqId(0), t + 3).unwrap()));
        out.extend(bits(
            &be.decode_step_batch(&[SeqId(0), SeqId(1)], &[t, t + 1])
                .unwrap(),
        ));
    }
    be.close_sequence(SeqId(0)).unwrap();
    be.close_sequence(SeqId(1)).unwrap();
    out.extend(verify_program(be, 3));
    out
}

#[test]
fn cuda_q8_kv_cache_is_bit_identical_to_the_cpu_backend() {
    if !gpu_present("cuda_q8_kv_cache_is_bit_identical_to_the_cpu_backend") {
        return;
    }
    for quant in ["q4_1", "f16"] {
        let model = synth("tiny-untied", quant);
        let f32_cache = kv_program(&mut CudaBackend::new(&model, cuda_doors()).unwrap());
        for base in combos() {
            for defect in [None, Some(GateDefect::KvQ8Coarse)] {
                let doors = Doors {
                    kv_q8: true,
                    gate_defect: defect,
                    ..base.clone()
                };
                let a = kv_program(&mut CpuBackend::new(model.clone(), doors.clone()).unwrap());
                let b = kv_program(&mut CudaBackend::new(&model, doors.clone()).unwrap());
                let differ = a.iter().zip(&b).filter(|(x, y)| x != y).count();
                assert_eq!(a.len(), b.len());
                assert_eq!(
                    differ,
                    0,
                    "{quant} {doors:?}: {differ} of {} differ",
                    a.len()
                );
            }
        }
        let q8 = Doors {
            kv_q8: true,
            ..cuda_doors()
        };
        let q8_cache = kv_program(&mut CudaBackend::new(&model, q8).unwrap());
        assert_ne!(
            q8_cache, f32_cache,
            "{quant}: MEMRA_KV_Q8=1 must move bits on the GPU"
        );
    }
}
