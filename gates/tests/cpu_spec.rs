//! Speculative decoding on the CPU backend: the verify forward's columns are the batched
//! path's decode steps bit for bit, a rewind leaves the cache as if the rejected tokens were
//! never seen, the speculative greedy stream equals plain greedy decoding for every K, single
//! and batched, a split verify equals the unsplit one, and each planted spec defect breaks
//! the property it is planted against and nothing it is not.

use memra_engine::backend::{Backend, EngineError, SeqId, Walk, cpu::CpuBackend};
use memra_engine::doors::{Doors, GateDefect, PpSplits};
use memra_engine::model::LlamaModel;
use memra_engine::sampling::argmax;
use memra_engine::spec::Drafting;
use memra_gates::spec::speculative;

fn synth(preset: &str, quant: &str) -> LlamaModel {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(format!("{preset}-{quant}.gguf"));
    memra_engine::synth::write_preset(preset, quant, 0, &path).unwrap();
    LlamaModel::open(&path).unwrap()
}

fn cpu(model: &LlamaModel, defect: Option<GateDefect>) -> CpuBackend {
    CpuBackend::new(
        model.clone(),
        Doors {
            gate_defect: defect,
            ..Doors::default()
        },
    )
    .unwrap()
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// A prompt that repeats itself, so the drafter finds continuations.
fn repetitive(n_vocab: usize, len: usize, salt: u32) -> Vec<u32> {
    (0..len)
        .map(|i| ((i % 5) as u32 * 37 + salt * 11 + 3) % n_vocab as u32)
        .collect()
}

/// Plain greedy decoding on the batched path: each sequence primed with its prompt, then
/// `n_new - 1` batched steps; returns every stream (the first token from the prompt's last
/// logits).
fn plain(be: &mut dyn Backend, prompts: &[Vec<u32>], n_new: usize) -> Vec<Vec<u32>> {
    let seqs: Vec<SeqId> = (0..prompts.len() as u32).map(|i| SeqId(100 + i)).collect();
    let mut streams = Vec::new();
    for (&s, p) in seqs.iter().zip(prompts) {
        be.open_sequence(s, p.len() + n_new).unwrap();
        streams.push(vec![argmax(&be.prime(s, p).unwrap())]);
    }
    let n_vocab = be.config().n_vocab;
    for _ in 1..n_new {
        let feed: Vec<u32> = streams.iter().map(|s| *s.last().unwrap()).collect();
        let logits = be.decode_step_batch(&seqs, &feed).unwrap();
        for (s, row) in streams.iter_mut().zip(logits.chunks_exact(n_vocab)) {
            s.push(argmax(row));
        }
    }
    for s in seqs {
        be.close_sequence(s).unwrap();
    }
    streams
}

/// Speculative greedy decoding of the same prompts with drafts of up to `k` tokens
/// (spec-gate's own run: room past the stream for a rewind that keeps too much to show as
/// tokens).
fn spec(
    be: &mut dyn Backend,
    prompts: &[Vec<u32>],
    n_new: usize,
    k: usize,
) -> (Vec<Vec<u32>>, memra_engine::spec::SpecStats) {
    let (streams, stats, _) = speculative(be, prompts, n_new, k, Drafting::Lookup, false).unwrap();
    (streams, stats)
}

#[test]
fn verify_columns_are_the_batched_decode_steps_bit_for_bit() {
    for quant in ["q4_1", "q8_0", "f32"] {
        let model = synth("tiny-untied", quant);
        let n_vocab = model.config.n_vocab;
        let mut be = cpu(&model, None);
        let prompt = repetitive(n_vocab, 9, 1);
        let feed = [7u32, 100, 31, 5, 250];
        // One step at a time through the batched path at B=1.
        be.open_sequence(SeqId(0), 32).unwrap();
        be.prime(SeqId(0), &prompt).unwrap();
        let mut steps = Vec::new();
        for &t in &feed {
            steps.extend(be.decode_step_batch(&[SeqId(0)], &[t]).unwrap());
        }
        // The same tokens as one verify forward, next to another sequence's draft.
        be.open_sequence(SeqId(1), 32).unwrap();
        be.prime(SeqId(1), &prompt).unwrap();
        be.open_sequence(SeqId(2), 32).unwrap();
        be.prime(SeqId(2), &repetitive(n_vocab, 4, 2)).unwrap();
        let verify = be
            .verify_batch(&[SeqId(2), SeqId(1)], &[vec![9, 8], feed.to_vec()])
            .unwrap();
        assert_eq!(verify.len(), 7 * n_vocab);
        assert_eq!(bits(&verify[2 * n_vocab..]), bits(&steps), "{quant}");
        assert_eq!(be.seq_len(SeqId(1)).unwrap(), prompt.len() + feed.len());
    }
}

#[test]
fn a_rewind_leaves_the_cache_as_if_the_rejected_tokens_were_never_seen() {
    let model = synth("tiny-untied", "q4_1");
    let n_vocab = model.config.n_vocab;
    let prompt = repetitive(n_vocab, 11, 3);
    let next = [44u32, 45, 46, 47];
    let run = |defect| {
        let mut be = cpu(&model, defect);
        be.open_sequence(SeqId(0), 40).unwrap();
        be.prime(SeqId(0), &prompt).unwrap();
        // Verify the pending token and four draft tokens, keep the pending one and one.
        be.verify_batch(&[SeqId(0)], &[vec![3, 4, 5, 6, 7]])
            .unwrap();
        be.rewind(SeqId(0), prompt.len() + 2).unwrap();
        let mut seen = Vec::new();
        for &t in &next {
            seen.extend(be.decode_step_batch(&[SeqId(0)], &[t]).unwrap());
        }
        // A cache that never saw the rejected tokens.
        be.open_sequence(SeqId(1), 40).unwrap();
        be.prime(SeqId(1), &prompt).unwrap();
        be.decode_step_batch(&[SeqId(1)], &[3]).unwrap();
        be.decode_step_batch(&[SeqId(1)], &[4]).unwrap();
        let mut fresh = Vec::new();
        for &t in &next {
            fresh.extend(be.decode_step_batch(&[SeqId(1)], &[t]).unwrap());
        }
        bits(&seen) == bits(&fresh)
    };
    assert!(run(None));
    assert!(
        !run(Some(GateDefect::RewindSlot)),
        "rewind-slot must move bits"
    );
    assert!(run(Some(GateDefect::VerifyColumn)));
    assert!(run(Some(GateDefect::StageColumn)));
}

#[test]
fn speculative_greedy_equals_plain_greedy_for_every_k_single_and_batched() {
    let model = synth("tiny-untied", "q4_1");
    let n_vocab = model.config.n_vocab;
    let prompts: Vec<Vec<u32>> = (0..3)
        .map(|b| repetitive(n_vocab, 8 + 3 * b, b as u32))
        .collect();
    let n_new = 24;
    let mut be = cpu(&model, None);
    let reference = plain(&mut be, &prompts, n_new);
    let alone = plain(&mut be, &prompts[..1], n_new);
    assert_eq!(alone[0], reference[0]);
    let mut accepted_somewhere = false;
    for k in [1, 4, 8] {
        let (single, stats) = spec(&mut be, &prompts[..1], n_new, k);
        assert_eq!(single[0], reference[0], "K={k} single");
        assert_eq!(stats.emitted, n_new);
        let (batched, stats) = spec(&mut be, &prompts, n_new, k);
        assert_eq!(batched, reference, "K={k} batched");
        assert_eq!(stats.emitted, 3 * n_new);
        assert!(stats.rounds < n_new, "K={k}: {stats:?}");
        accepted_somewhere |= stats.accepted > 0;
    }
    assert!(
        accepted_somewhere,
        "the workload must accept drafts to test anything"
    );
    // The planted defects of the verify and the rewind move the stream.
    for defect in [GateDefect::VerifyColumn, GateDefect::RewindSlot] {
        let mut bad = cpu(&model, Some(defect));
        let (streams, _) = spec(&mut bad, &prompts, n_new, 4);
        assert_ne!(streams, reference, "{defect:?}");
    }
}

/// Staggered drafting caps sequence `i`'s draft at `k - i % k`: where prompts repeat so well
/// that every lookup fills its room (so plain lookup drafting verifies only uniform batches),
/// a batch still verifies drafts of different lengths, and the stream is still plain greedy.
#[test]
fn staggered_drafts_mix_lengths_in_one_verify_and_stay_plain_greedy() {
    let model = synth("tiny-untied", "q4_1");
    let n_vocab = model.config.n_vocab;
    // The same prompt three times: every row drafts the same and fills the same room.
    let prompts: Vec<Vec<u32>> = (0..3).map(|_| repetitive(n_vocab, 20, 0)).collect();
    let n_new = 24;
    let mut be = cpu(&model, None);
    let reference = plain(&mut be, &prompts, n_new);
    let mixed = |rounds: &[memra_engine::spec::Round]| {
        rounds
            .iter()
            .filter(|r| r.inputs.iter().any(|i| i.len() != r.inputs[0].len()))
            .count()
    };
    let (lookup, _, rounds) =
        speculative(&mut be, &prompts, n_new, 4, Drafting::Lookup, false).unwrap();
    assert_eq!(lookup, reference);
    assert_eq!(mixed(&rounds), 0, "identical rows draft alike under lookup");
    let (staggered, stats, rounds) =
        speculative(&mut be, &prompts, n_new, 4, Drafting::Staggered, false).unwrap();
    assert_eq!(staggered, reference);
    assert!(stats.accepted > 0, "{stats:?}");
    assert!(mixed(&rounds) > 0, "staggered caps must mix lengths");
    for r in rounds.iter().filter(|r| r.inputs.len() == 3) {
        for (i, input) in r.inputs.iter().enumerate() {
            assert!(input.len() <= 1 + 4 - i % 4, "row {i}: {}", input.len());
        }
    }
    // The verify column defect moves a mixed batch's stream.
    let mut bad = cpu(&model, Some(GateDefect::VerifyColumn));
    let (streams, _, _) =
        speculative(&mut bad, &prompts, n_new, 4, Drafting::Staggered, false).unwrap();
    assert_ne!(streams, reference);
}

#[test]
fn a_split_verify_is_the_unsplit_verify_and_stage_column_breaks_only_verify() {
    let model = synth("tiny-untied", "q4_1");
    let n_vocab = model.config.n_vocab;
    let prompt = repetitive(n_vocab, 10, 5);
    let split = |defect| Doors {
        pp_stages: 3,
        pp_devices: vec![0; 3],
        pp_splits: PpSplits::Even,
        pp_allow_unsplit_batch: true,
        gate_defect: defect,
        ..Doors::default()
    };
    let run = |doors: Doors| {
        let mut be = CpuBackend::new(model.clone(), doors).unwrap();
        let mut out = Vec::new();
        for (s, unsplit) in [(SeqId(0), false), (SeqId(1), true)] {
            be.open_sequence(s, 40).unwrap();
            be.prime(s, &prompt).unwrap();
            let drafts = [vec![1, 2, 3, 4, 5]];
            let l = if unsplit {
                be.verify_batch_walk(Walk::Unsplit, &[s], &drafts).unwrap()
            } else {
                be.verify_batch(&[s], &drafts).unwrap()
            };
            let step = be.decode_step_batch(&[s], &[9]).unwrap();
            out.push((bits(&l), bits(&step)));
        }
        out
    };
    let whole = run(Doors::default());
    let clean = run(split(None));
    assert_eq!(clean[0], whole[0]);
    assert_eq!(clean[1], whole[0]);
    let bad = run(split(Some(GateDefect::StageColumn)));
    // The split verify's last column moves; the unsplit walk and the decode step after
    // the (clean) unsplit verify do not.
    assert_ne!(bad[0].0, whole[0].0);
    assert_eq!(bad[0].0[..4 * n_vocab], whole[0].0[..4 * n_vocab]);
    assert_eq!(bad[1], whole[0]);
}

#[test]
fn bad_verify_and_rewind_calls_are_refused_before_any_cache_moves() {
    let model = synth("tiny-untied", "q4_1");
    let mut be = cpu(&model, None);
    be.open_sequence(SeqId(0), 12).unwrap();
    be.prime(SeqId(0), &[1, 2, 3]).unwrap();
    assert!(matches!(
        be.verify_batch(&[SeqId(0)], &[vec![]]),
        Err(EngineError::Empty { .. })
    ));
    assert!(matches!(
        be.verify_batch(&[SeqId(0), SeqId(0)], &[vec![1], vec![2]]),
        Err(EngineError::DuplicateInBatch { .. })
    ));
    assert!(matches!(
        be.verify_batch(&[SeqId(0)], &[vec![1; 10]]),
        Err(EngineError::CacheFull { .. })
    ));
    assert!(matches!(
        be.verify_batch(&[SeqId(0)], &[vec![1, 99_999]]),
        Err(EngineError::BadToken { .. })
    ));
    assert_eq!(be.seq_len(SeqId(0)).unwrap(), 3);
    let e = be.rewind(SeqId(0), 4).unwrap_err();
    assert!(matches!(e, EngineError::RewindPast { .. }));
    assert!(e.to_string().contains("only drops positions"), "{e}");
    assert!(matches!(
        be.rewind(SeqId(9), 0),
        Err(EngineError::UnknownSequence(_))
    ));
    be.rewind(SeqId(0), 1).unwrap();
    assert_eq!(be.seq_len(SeqId(0)).unwrap(), 1);
}
