//! Sampling streams: a sequence draws the same tokens whether it decodes alone (B=1) or as a
//! row of a batch, because its logits are bit-identical and its Philox stream is keyed by
//! (seed, sequence id, step) only; greedy is the argmax; the key really changes the draws; a
//! batch mixing greedy and sampled rows (per-row parameters) gives every row its own stream.

use memra_engine::backend::{Backend, SeqId, cpu::CpuBackend};
use memra_engine::doors::Doors;
use memra_engine::model::LlamaModel;
use memra_engine::sampling::{SamplingParams, sample_token};
use memra_kernels::twin::argmax;

fn tiny() -> LlamaModel {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tiny.gguf");
    memra_engine::synth::write_preset("tiny", "q4_1", 31, &path).unwrap();
    LlamaModel::open(&path).unwrap()
}

const STEPS: usize = 12;

fn prompt(b: u32) -> Vec<u32> {
    (0..4 + b).map(|i| (i * 37 + b * 11 + 5) % 500).collect()
}

/// Autoregressive sampled decoding of `ids` together; returns each sequence's tokens.
fn batched(be: &mut CpuBackend, ids: &[SeqId], params: &SamplingParams) -> Vec<Vec<u32>> {
    let mut last = Vec::new();
    for &s in ids {
        be.open_sequence(s, 64).unwrap();
        let logits = be.prime(s, &prompt(s.0)).unwrap();
        let step = be.seq_len(s).unwrap();
        last.push(sample_token(&logits, params, s, step).unwrap());
    }
    let mut out: Vec<Vec<u32>> = last.iter().map(|&t| vec![t]).collect();
    for _ in 0..STEPS {
        last = be.decode_step_batch_sampled(ids, &last, params).unwrap();
        for (o, &t) in out.iter_mut().zip(&last) {
            o.push(t);
        }
    }
    for &s in ids {
        be.close_sequence(s).unwrap();
    }
    out
}

/// The same sequence decoded alone through the batched path at B=1.
fn alone(be: &mut CpuBackend, s: SeqId, params: &SamplingParams) -> Vec<u32> {
    batched(be, &[s], params).remove(0)
}

#[test]
fn a_sequence_samples_the_same_tokens_at_b1_and_in_a_batch() {
    let params = SamplingParams {
        temperature: 0.9,
        top_k: 0,
        top_p: 0.95,
        seed: 1234,
    };
    for doors in [Doors::default(), Doors::equalized()] {
        let mut be = CpuBackend::new(tiny(), doors).unwrap();
        let ids: Vec<SeqId> = (0..5).map(SeqId).collect();
        let together = batched(&mut be, &ids, &params);
        for (b, &s) in ids.iter().enumerate() {
            assert_eq!(together[b], alone(&mut be, s, &params), "{s}");
        }
        // Sampling at temperature 0.9 over a random model must actually vary.
        let distinct: std::collections::BTreeSet<u32> =
            together.iter().flatten().copied().collect();
        assert!(distinct.len() > 10, "too few distinct tokens: {distinct:?}");
    }
}

#[test]
fn the_key_changes_the_stream() {
    let mut be = CpuBackend::new(tiny(), Doors::default()).unwrap();
    let p = |seed| SamplingParams {
        temperature: 1.0,
        top_k: 0,
        top_p: 1.0,
        seed,
    };
    let a = alone(&mut be, SeqId(0), &p(1));
    assert_eq!(a, alone(&mut be, SeqId(0), &p(1)), "same key, same stream");
    assert_ne!(a, alone(&mut be, SeqId(0), &p(2)), "another seed");

    // Sequence ids key the stream, not the prompt: two ids over the same logits row.
    let row: Vec<f32> = (0..512).map(|i| ((i * 7919) % 113) as f32 / 40.0).collect();
    let draws = |seq: u32| -> Vec<u32> {
        (0..32)
            .map(|step| sample_token(&row, &p(5), SeqId(seq), step).unwrap())
            .collect()
    };
    assert_eq!(draws(3), draws(3));
    assert_ne!(draws(3), draws(4));
}

#[test]
fn greedy_is_the_argmax_and_a_tiny_nucleus_is_too() {
    // 0..=96 each about three times, then one unique maximum.
    let mut row: Vec<f32> = (0..300).map(|i| ((i * 31) % 97) as f32 * 0.1).collect();
    row[150] = 9.7;
    let top = argmax(&row);
    assert_eq!(top, 150);
    assert_eq!(
        sample_token(&row, &SamplingParams::greedy(), SeqId(0), 0).unwrap(),
        top
    );
    let nucleus = SamplingParams {
        temperature: 0.7,
        top_k: 0,
        top_p: 1e-6,
        seed: 9,
    };
    for step in 0..20 {
        assert_eq!(sample_token(&row, &nucleus, SeqId(1), step).unwrap(), top);
    }
    // Ties go to the lowest index.
    let mut flat = vec![0.0f32; 10];
    flat[3] = 2.0;
    flat[7] = 2.0;
    assert_eq!(
        sample_token(&flat, &SamplingParams::greedy(), SeqId(0), 0).unwrap(),
        3
    );
}

#[test]
fn bad_parameters_are_refused_with_the_range() {
    let row = [0.0f32; 4];
    for (t, p) in [(-1.0, 1.0), (f32::NAN, 1.0), (1.0, 0.0), (1.0, 1.5)] {
        let params = SamplingParams {
            temperature: t,
            top_k: 0,
            top_p: p,
            seed: 0,
        };
        let err = sample_token(&row, &params, SeqId(0), 0)
            .unwrap_err()
            .to_string();
        assert!(err.contains("must"), "{err}");
    }
}

/// Greedy on even rows, sampled on odd rows with a seed and top-p of their own.
fn mixed(rows: u32) -> Vec<SamplingParams> {
    (0..rows)
        .map(|b| {
            if b % 2 == 0 {
                SamplingParams::greedy()
            } else {
                SamplingParams {
                    temperature: 0.8,
                    top_k: 0,
                    top_p: if b % 4 == 1 { 1.0 } else { 0.9 },
                    seed: 77 + u64::from(b),
                }
            }
        })
        .collect()
}

/// Decoding of `ids` together with per-row parameters: each sequence's tokens and, per
/// step, the parked logits.
fn batched_rows(
    be: &mut CpuBackend,
    ids: &[SeqId],
    params: &[SamplingParams],
) -> (Vec<Vec<u32>>, Vec<Vec<f32>>) {
    let mut last = Vec::new();
    for (&s, p) in ids.iter().zip(params) {
        be.open_sequence(s, 64).unwrap();
        let logits = be.prime(s, &prompt(s.0)).unwrap();
        last.push(sample_token(&logits, p, s, be.seq_len(s).unwrap()).unwrap());
    }
    let mut out: Vec<Vec<u32>> = last.iter().map(|&t| vec![t]).collect();
    let mut parked = Vec::new();
    for _ in 0..STEPS {
        last = be
            .decode_step_batch_sampled_rows(ids, &last, params)
            .unwrap();
        parked.push(be.parked_logits().unwrap());
        for (o, &t) in out.iter_mut().zip(&last) {
            o.push(t);
        }
    }
    for &s in ids {
        be.close_sequence(s).unwrap();
    }
    (out, parked)
}

#[test]
fn a_batch_mixing_greedy_and_sampled_rows_gives_each_row_its_own_stream() {
    let params = mixed(4);
    let ids: Vec<SeqId> = (0..4).map(SeqId).collect();
    for doors in [Doors::default(), Doors::equalized()] {
        let mut be = CpuBackend::new(tiny(), doors).unwrap();
        let (together, parked) = batched_rows(&mut be, &ids, &params);
        for (b, &s) in ids.iter().enumerate() {
            let (alone, _) = batched_rows(&mut be, &[s], &params[b..=b]);
            assert_eq!(together[b], alone[0], "{s} under {:?}", params[b]);
        }
        // Greedy rows are the argmax of their parked logits; token t + 1 of a row was
        // chosen from step t's logits.
        let n_vocab = 512;
        for (step, logits) in parked.iter().enumerate() {
            for b in [0, 2] {
                let row = &logits[b * n_vocab..(b + 1) * n_vocab];
                assert_eq!(together[b][step + 1], argmax(row), "row {b} step {step}");
            }
        }
        // The sampled rows really sample: they leave the argmax somewhere.
        let off_argmax = parked.iter().enumerate().any(|(step, logits)| {
            [1, 3]
                .iter()
                .any(|&b| together[b][step + 1] != argmax(&logits[b * n_vocab..(b + 1) * n_vocab]))
        });
        assert!(off_argmax, "the sampled rows never left the argmax");
    }
}

#[test]
fn per_row_parameters_must_be_one_valid_set_per_row_and_move_no_cache() {
    let mut be = CpuBackend::new(tiny(), Doors::default()).unwrap();
    let ids = [SeqId(0), SeqId(1)];
    for &s in &ids {
        be.open_sequence(s, 16).unwrap();
        be.prime(s, &prompt(s.0)).unwrap();
    }
    let before: Vec<usize> = ids.iter().map(|&s| be.seq_len(s).unwrap()).collect();
    let err = be
        .decode_step_batch_sampled_rows(&ids, &[1, 2], &mixed(3))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("3 sampling parameter sets for a batch of 2"),
        "{err}"
    );
    let mut bad = mixed(2);
    bad[1].top_p = 0.0;
    let err = be
        .decode_step_batch_sampled_rows(&ids, &[1, 2], &bad)
        .unwrap_err()
        .to_string();
    assert!(err.contains("top-p 0 must lie in (0, 1]"), "{err}");
    let after: Vec<usize> = ids.iter().map(|&s| be.seq_len(s).unwrap()).collect();
    assert_eq!(before, after, "a refused step moves no cache");
}
