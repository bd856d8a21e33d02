//! Exactness properties of the CPU backend's two decode paths (DESIGN §7): batched rows are
//! bit-identical to the same sequence alone at B=1 in every door combination; under the
//! equalized pins the single-sequence and batched paths are bit-identical, under the defaults
//! they are not; pipeline stages change nothing; the canary breaks batch exactness.

mod common;

use memra_engine::backend::{Backend, SeqId, cpu::CpuBackend};
use memra_engine::doors::{Doors, PpSplits};
use memra_engine::model::LlamaModel;

fn synth(preset: &str, quant: &str, seed: u64) -> LlamaModel {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(format!("{preset}-{quant}.gguf"));
    memra_engine::synth::write_preset(preset, quant, seed, &path).unwrap();
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

const B: usize = 4;
const STEPS: usize = 6;

/// Prompts of different lengths (so rows sit at different positions) and the tokens each
/// sequence is fed while decoding.
fn workload(n_vocab: usize) -> (Vec<Vec<u32>>, Vec<Vec<u32>>) {
    let prompts = (0..B)
        .map(|b| tokens(n_vocab, b as u32, 3 + 2 * b))
        .collect();
    let feeds = (0..B)
        .map(|b| tokens(n_vocab, 100 + b as u32, STEPS))
        .collect();
    (prompts, feeds)
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// Decodes all sequences together; returns `[step][b]` logits rows.
fn run_batched(
    be: &mut CpuBackend,
    prompts: &[Vec<u32>],
    feeds: &[Vec<u32>],
) -> Vec<Vec<Vec<f32>>> {
    let n_vocab = be.config().n_vocab;
    let seqs: Vec<SeqId> = (0..B as u32).map(SeqId).collect();
    for (&s, p) in seqs.iter().zip(prompts) {
        be.open_sequence(s, 64).unwrap();
        be.prefill(s, p).unwrap();
    }
    let mut out = Vec::new();
    for step in 0..STEPS {
        let toks: Vec<u32> = feeds.iter().map(|f| f[step]).collect();
        let logits = be.decode_step_batch(&seqs, &toks).unwrap();
        out.push(logits.chunks_exact(n_vocab).map(|r| r.to_vec()).collect());
    }
    for s in seqs {
        be.close_sequence(s).unwrap();
    }
    out
}

/// Decodes each sequence alone, through `decode_step_batch` at B=1 or `decode_step_h`;
/// returns `[step][b]` logits rows.
fn run_alone(
    be: &mut CpuBackend,
    prompts: &[Vec<u32>],
    feeds: &[Vec<u32>],
    single_path: bool,
) -> Vec<Vec<Vec<f32>>> {
    let mut out = vec![Vec::new(); STEPS];
    for (b, (p, f)) in prompts.iter().zip(feeds).enumerate() {
        let s = SeqId(b as u32);
        be.open_sequence(s, 64).unwrap();
        be.prefill(s, p).unwrap();
        for (step, &t) in f.iter().enumerate() {
            let row = if single_path {
                be.decode_step_h(s, t).unwrap()
            } else {
                be.decode_step_batch(&[s], &[t]).unwrap()
            };
            out[step].push(row);
        }
        be.close_sequence(s).unwrap();
    }
    out
}

fn same_bits(a: &[Vec<Vec<f32>>], b: &[Vec<Vec<f32>>]) -> bool {
    let shape = |x: &[Vec<Vec<f32>>]| -> Vec<Vec<usize>> {
        x.iter().map(|s| s.iter().map(Vec::len).collect()).collect()
    };
    assert_eq!(shape(a), shape(b), "logits of different shapes");
    a.iter()
        .flatten()
        .zip(b.iter().flatten())
        .all(|(x, y)| bits(x) == bits(y))
}

fn check_batch_exactness(model: &LlamaModel, combos: Vec<Doors>) {
    let (prompts, feeds) = workload(model.config.n_vocab);
    for doors in combos {
        let mut be = CpuBackend::new(model.clone(), doors.clone()).unwrap();
        let batched = run_batched(&mut be, &prompts, &feeds);
        let b1 = run_alone(&mut be, &prompts, &feeds, false);
        let single = run_alone(&mut be, &prompts, &feeds, true);
        let b1_takes_fused_path = doors.serve_b1fast && doors.mmvq && !doors.no_fuse_normq;
        if b1_takes_fused_path {
            // MEMRA_SERVE_B1FAST routes B=1 to the fused single-sequence tier: B=1 is then
            // the single path, and a batch row is not; the batch gate exists to see this.
            assert!(
                same_bits(&b1, &single),
                "B=1 must be the single path under {doors:?}"
            );
            assert!(
                !same_bits(&b1, &batched),
                "fused B=1 equal to batch rows under {doors:?}"
            );
        } else {
            for step in 0..STEPS {
                for b in 0..B {
                    assert_eq!(
                        bits(&batched[step][b]),
                        bits(&b1[step][b]),
                        "step {step} row {b}: batch row differs from B=1 under {doors:?}"
                    );
                }
            }
        }
    }
}

#[test]
fn batch_rows_are_bit_identical_to_b1_in_every_door_combination() {
    for quant in ["q4_1", "q8_0", "f16"] {
        let model = synth("tiny", quant, 21);
        check_batch_exactness(&model, Doors::default().numeric_combinations());
    }
}

#[test]
fn real_model_batch_rows_are_bit_identical_to_b1() {
    let Some(path) = common::real_model() else {
        return;
    };
    let model = LlamaModel::open(&path).unwrap();
    check_batch_exactness(&model, vec![Doors::default(), Doors::equalized()]);
}

#[test]
fn equalized_paths_are_bit_identical_and_default_paths_are_not() {
    let model = synth("tiny", "q4_1", 22);
    let (prompts, feeds) = workload(model.config.n_vocab);

    let mut be = CpuBackend::new(model.clone(), Doors::equalized()).unwrap();
    let single = run_alone(&mut be, &prompts, &feeds, true);
    let batched = run_batched(&mut be, &prompts, &feeds);
    assert!(
        same_bits(&single, &batched),
        "equalized: single path != batched path"
    );

    let mut be = CpuBackend::new(model, Doors::default()).unwrap();
    let single = run_alone(&mut be, &prompts, &feeds, true);
    let batched = run_batched(&mut be, &prompts, &feeds);
    let differing: usize = single
        .iter()
        .flatten()
        .zip(batched.iter().flatten())
        .map(|(a, b)| {
            a.iter()
                .zip(b)
                .filter(|(x, y)| x.to_bits() != y.to_bits())
                .count()
        })
        .sum();
    assert!(
        differing > 0,
        "defaults: the fused tier ran the batched composition"
    );
}

/// The pass's thread count moves no bit: batched rows, B=1 rows and the single-sequence path
/// alike. On 1 thread every region runs on the caller; from 2 on, a matvec's rows, a step's
/// heads and a row's hidden units are taken by several threads in whatever order they come,
/// and the tasks are cut otherwise (tiny shape: gate and up 2 tasks each on 1 thread, 4 on 2,
/// 6 on 3; the head 2, 4, 6; q and o 2 tasks of 64 rows throughout).
#[test]
fn the_thread_count_changes_no_bit() {
    let model = synth("tiny", "q4_1", 25);
    let (prompts, feeds) = workload(model.config.n_vocab);
    for doors in [Doors::default(), Doors::equalized()] {
        let run = |threads: usize| {
            let mut be = CpuBackend::with_threads(model.clone(), doors.clone(), threads).unwrap();
            [
                run_batched(&mut be, &prompts, &feeds),
                run_alone(&mut be, &prompts, &feeds, false),
                run_alone(&mut be, &prompts, &feeds, true),
            ]
        };
        let one = run(1);
        for threads in [2, 3] {
            let many = run(threads);
            for (path, (a, b)) in ["batched", "B=1", "single"]
                .iter()
                .zip(one.iter().zip(&many))
            {
                assert!(
                    same_bits(a, b),
                    "{path} logits on {threads} threads differ from 1 thread under {doors:?}"
                );
            }
        }
    }
}

#[test]
fn pipeline_stages_change_no_bit() {
    let model = synth("tiny", "q4_1", 23);
    let (prompts, feeds) = workload(model.config.n_vocab);
    let mut be = CpuBackend::new(model.clone(), Doors::default()).unwrap();
    let unsplit = run_batched(&mut be, &prompts, &feeds);
    for (stages, splits) in [
        (2, PpSplits::Even),
        (3, PpSplits::Cuts(vec![1, 3])),
        (4, PpSplits::Even),
    ] {
        let doors = Doors {
            pp_stages: stages,
            pp_devices: vec![0; stages],
            pp_splits: splits,
            ..Doors::default()
        };
        let mut be = CpuBackend::new(model.clone(), doors.clone()).unwrap();
        assert_eq!(be.stages().len(), stages);
        let split = run_batched(&mut be, &prompts, &feeds);
        assert!(
            same_bits(&unsplit, &split),
            "pipeline split changed bits under {doors:?}"
        );
    }
}

#[test]
fn the_canary_breaks_batch_exactness() {
    let model = synth("tiny", "q4_1", 24);
    let (prompts, feeds) = workload(model.config.n_vocab);
    let doors = Doors {
        gate_canary: true,
        ..Doors::equalized()
    };
    let mut be = CpuBackend::new(model, doors).unwrap();
    let batched = run_batched(&mut be, &prompts, &feeds);
    let b1 = run_alone(&mut be, &prompts, &feeds, false);
    assert!(
        !same_bits(&batched, &b1),
        "the canary must make a batch row differ from B=1"
    );
}
