//! The programs the gates run: synthetic prompts (distinct per row, uneven lengths, offset by
//! `MEMRA_GATE_SEED`) and decode runs of a batch of sequences through one kind of tick,
//! recording every step's logits and the tokens chosen.
//!
//! It owns how a run drives the [`Backend`] API; what two runs must share (bits, tokens) is
//! each gate's business, and comparing them is the ledger's.

use memra_engine::backend::{Backend, EngineError, SeqId, Walk};
use memra_engine::sampling::{SamplingParams, sample_token};

use crate::ledger::host_argmax;

/// `count` prompts over a vocabulary of `n_vocab`: row `b` has `plen + (3·b mod 5)` tokens,
/// every token a pure function of (seed, offset + b, position), so rows differ from each
/// other and from run to run only through the seed.
pub fn prompts(n_vocab: usize, count: usize, plen: usize, seed: u64, offset: u64) -> Vec<Vec<u32>> {
    (0..count)
        .map(|b| {
            let len = plen + (3 * b) % 5;
            (0..len)
                .map(|i| {
                    let h = mix(seed ^ mix(offset + b as u64) ^ mix(0x5eed_0000 + i as u64));
                    (h % n_vocab as u64) as u32
                })
                .collect()
        })
        .collect()
}

/// SplitMix64's finalizer: a well-spread hash of one integer.
fn mix(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// How every decode step of a run is computed and its next tokens chosen.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Tick {
    /// `decode_step_h` for each row (the single-sequence path), host argmax.
    Single,
    /// `decode_step_batch` (the full tick), next tokens drawn on the host from the returned
    /// logits with these parameters.
    Full(SamplingParams),
    /// `decode_step_batch_walk(Walk::Unsplit, …)` (the unsplit body), host argmax.
    Unsplit,
    /// `decode_step_batch_sampled` (the lean tick): tokens from the backend, logits from
    /// `parked_logits`.
    Lean(SamplingParams),
}

/// What a run produced: per decode step, the `B` tokens fed in, the `[B, n_vocab]` logits
/// and the `B` tokens chosen from them.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Trace {
    pub inputs: Vec<Vec<u32>>,
    pub logits: Vec<Vec<f32>>,
    pub tokens: Vec<Vec<u32>>,
}

impl Trace {
    /// Puts runs of single rows side by side as one `[B, …]` trace (row b = run b).
    pub fn side_by_side(runs: Vec<Trace>) -> Trace {
        let steps = runs.first().map_or(0, |r| r.logits.len());
        let mut out = Trace::default();
        for s in 0..steps {
            out.inputs
                .push(runs.iter().flat_map(|r| r.inputs[s].clone()).collect());
            out.logits
                .push(runs.iter().flat_map(|r| r.logits[s].clone()).collect());
            out.tokens
                .push(runs.iter().flat_map(|r| r.tokens[s].clone()).collect());
        }
        out
    }
}

/// Runs `prompts` as one batch (row b is `SeqId(b)`) for `steps` decode steps through
/// `tick`. Each sequence is primed alone; its first decode token is the host's choice from
/// the prime logits (argmax, or a draw under the tick's parameters), so every tick kind
/// starts from the same tokens. Sequences are closed afterwards, also on error.
pub fn run(
    be: &mut dyn Backend,
    prompts: &[Vec<u32>],
    first_id: u32,
    steps: usize,
    tick: Tick,
) -> Result<Trace, EngineError> {
    run_primed(be, prompts, first_id, steps, tick, Prime::Prefill)
}

/// How a run fills the caches with its prompts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Prime {
    /// `prime` (the lean prefill) per sequence.
    Prefill,
    /// Every prompt token through the tick's own batched step at B=1, so the caches are
    /// written by the same walk as the decode steps (the pipeline localizer needs this:
    /// a prefill through a broken split would poison the unsplit walk's caches).
    Steps,
}

/// [`run`] with a choice of how the prompts are primed.
pub fn run_primed(
    be: &mut dyn Backend,
    prompts: &[Vec<u32>],
    first_id: u32,
    steps: usize,
    tick: Tick,
    prime: Prime,
) -> Result<Trace, EngineError> {
    drive(be, prompts, first_id, steps, tick, prime, None)
}

/// [`run_primed`] fed `inputs` (step by step, one token per row: another run's
/// [`Trace::inputs`]) instead of its own choices, so a candidate that went wrong at one step
/// still computes the reference's text at every later one and its counts compare like with
/// like. The trace still records the candidate's own choices in `tokens`.
pub fn run_fed(
    be: &mut dyn Backend,
    prompts: &[Vec<u32>],
    first_id: u32,
    inputs: &[Vec<u32>],
    tick: Tick,
    prime: Prime,
) -> Result<Trace, EngineError> {
    if inputs.iter().any(|row| row.len() != prompts.len()) {
        return Err(EngineError::BatchShape {
            seqs: prompts.len(),
            tokens: inputs
                .iter()
                .map(Vec::len)
                .find(|&n| n != prompts.len())
                .unwrap_or(0),
        });
    }
    drive(
        be,
        prompts,
        first_id,
        inputs.len(),
        tick,
        prime,
        Some(inputs),
    )
}

/// The run behind [`run_primed`] and [`run_fed`]: `feed` replaces the tokens each step is
/// fed when given.
fn drive(
    be: &mut dyn Backend,
    prompts: &[Vec<u32>],
    first_id: u32,
    steps: usize,
    tick: Tick,
    prime: Prime,
    feed: Option<&[Vec<u32>]>,
) -> Result<Trace, EngineError> {
    let seqs: Vec<SeqId> = (0..prompts.len() as u32)
        .map(|b| SeqId(first_id + b))
        .collect();
    let mut opened = Vec::new();
    let result = (|| {
        let mut next = Vec::with_capacity(prompts.len());
        for (&seq, prompt) in seqs.iter().zip(prompts) {
            be.open_sequence(seq, prompt.len() + steps + 1)?;
            opened.push(seq);
            let logits = match prime {
                Prime::Prefill => be.prime(seq, prompt)?,
                Prime::Steps => {
                    let mut last = Vec::new();
                    for &t in prompt {
                        last = step(be, &[seq], &[t], tick)?.0;
                    }
                    last
                }
            };
            next.push(choose(&logits, tick, seq, prompt.len())?);
        }
        let mut trace = Trace::default();
        for s in 0..steps {
            if let Some(feed) = feed {
                next.clone_from(&feed[s]);
            }
            let (logits, chosen) = step(be, &seqs, &next, tick)?;
            trace
                .inputs
                .push(std::mem::replace(&mut next, chosen.clone()));
            trace.logits.push(logits);
            trace.tokens.push(chosen);
        }
        Ok(trace)
    })();
    for seq in opened {
        let _ = be.close_sequence(seq);
    }
    result
}

/// [`run`] with every prompt alone at B=1 (same sequence ids), side by side.
pub fn run_alone(
    be: &mut dyn Backend,
    prompts: &[Vec<u32>],
    first_id: u32,
    steps: usize,
    tick: Tick,
) -> Result<Trace, EngineError> {
    let runs = prompts
        .iter()
        .enumerate()
        .map(|(b, p)| {
            run(
                be,
                std::slice::from_ref(p),
                first_id + b as u32,
                steps,
                tick,
            )
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Trace::side_by_side(runs))
}

/// [`run`] through lean ticks with sampling parameters per row: row `b` (`SeqId(first_id +
/// b)`) chooses its first token from its prime logits and every later one through
/// [`Backend::decode_step_batch_sampled_rows`] under `params[b]`; the trace's logits are the
/// parked ones. Sequences are closed afterwards, also on error.
pub fn run_rows(
    be: &mut dyn Backend,
    prompts: &[Vec<u32>],
    first_id: u32,
    steps: usize,
    params: &[SamplingParams],
) -> Result<Trace, EngineError> {
    one_set_per_row(prompts, params)?;
    let seqs: Vec<SeqId> = (0..prompts.len() as u32)
        .map(|b| SeqId(first_id + b))
        .collect();
    let mut opened = Vec::new();
    let result = (|| {
        let mut next = Vec::with_capacity(prompts.len());
        for ((&seq, prompt), p) in seqs.iter().zip(prompts).zip(params) {
            be.open_sequence(seq, prompt.len() + steps + 1)?;
            opened.push(seq);
            let logits = be.prime(seq, prompt)?;
            next.push(choose(&logits, Tick::Lean(*p), seq, prompt.len())?);
        }
        let mut trace = Trace::default();
        for _ in 0..steps {
            let chosen = be.decode_step_batch_sampled_rows(&seqs, &next, params)?;
            trace
                .inputs
                .push(std::mem::replace(&mut next, chosen.clone()));
            trace.logits.push(be.parked_logits()?);
            trace.tokens.push(chosen);
        }
        Ok(trace)
    })();
    for seq in opened {
        let _ = be.close_sequence(seq);
    }
    result
}

/// [`run_rows`] with every prompt alone at B=1 under its own parameters (same sequence
/// ids), side by side.
pub fn run_rows_alone(
    be: &mut dyn Backend,
    prompts: &[Vec<u32>],
    first_id: u32,
    steps: usize,
    params: &[SamplingParams],
) -> Result<Trace, EngineError> {
    one_set_per_row(prompts, params)?;
    let runs = prompts
        .iter()
        .zip(params)
        .enumerate()
        .map(|(b, (prompt, p))| {
            run_rows(
                be,
                std::slice::from_ref(prompt),
                first_id + b as u32,
                steps,
                std::slice::from_ref(p),
            )
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Trace::side_by_side(runs))
}

/// A run whose batch width changes in the middle of the streams: every prompt primed alone
/// (row b is `SeqId(first_id + b)`), then each phase `(rows, steps)` decodes the listed
/// rows together for `steps` batched greedy steps while the others wait. Returns one trace
/// per row (`[1, n_vocab]` logits per step the row took), comparable with the row run alone
/// for as many steps. Sequences are closed afterwards, also on error.
pub fn run_phases(
    be: &mut dyn Backend,
    prompts: &[Vec<u32>],
    first_id: u32,
    phases: &[(Vec<usize>, usize)],
) -> Result<Vec<Trace>, EngineError> {
    let seqs: Vec<SeqId> = (0..prompts.len() as u32)
        .map(|b| SeqId(first_id + b))
        .collect();
    let n_vocab = be.config().n_vocab;
    let mut opened = Vec::new();
    let result = (|| {
        let mut next = Vec::with_capacity(prompts.len());
        for (&seq, prompt) in seqs.iter().zip(prompts) {
            let steps: usize = phases
                .iter()
                .filter(|(rows, _)| rows.contains(&opened.len()))
                .map(|(_, n)| n)
                .sum();
            be.open_sequence(seq, prompt.len() + steps + 1)?;
            opened.push(seq);
            next.push(host_argmax(&be.prime(seq, prompt)?));
        }
        let mut traces = vec![Trace::default(); prompts.len()];
        for (rows, steps) in phases {
            let ids: Vec<SeqId> = rows.iter().map(|&b| seqs[b]).collect();
            for _ in 0..*steps {
                let tokens: Vec<u32> = rows.iter().map(|&b| next[b]).collect();
                let logits = be.decode_step_batch(&ids, &tokens)?;
                for (&b, row) in rows.iter().zip(logits.chunks_exact(n_vocab)) {
                    let chosen = host_argmax(row);
                    traces[b].inputs.push(vec![next[b]]);
                    traces[b].logits.push(row.to_vec());
                    traces[b].tokens.push(vec![chosen]);
                    next[b] = chosen;
                }
            }
        }
        Ok(traces)
    })();
    for seq in opened {
        let _ = be.close_sequence(seq);
    }
    result
}

fn one_set_per_row(prompts: &[Vec<u32>], params: &[SamplingParams]) -> Result<(), EngineError> {
    if params.len() == prompts.len() {
        return Ok(());
    }
    Err(EngineError::BadSampling(format!(
        "{} sampling parameter sets for {} prompts: give one set per row",
        params.len(),
        prompts.len()
    )))
}

fn choose(logits: &[f32], tick: Tick, seq: SeqId, pos: usize) -> Result<u32, EngineError> {
    match tick {
        Tick::Full(p) | Tick::Lean(p) if p.temperature > 0.0 => sample_token(logits, &p, seq, pos),
        _ => Ok(host_argmax(logits)),
    }
}

fn step(
    be: &mut dyn Backend,
    seqs: &[SeqId],
    tokens: &[u32],
    tick: Tick,
) -> Result<(Vec<f32>, Vec<u32>), EngineError> {
    let n_vocab = be.config().n_vocab;
    let logits = match tick {
        Tick::Lean(p) => {
            let chosen = be.decode_step_batch_sampled(seqs, tokens, &p)?;
            return Ok((be.parked_logits()?, chosen));
        }
        Tick::Single => {
            let mut all = Vec::with_capacity(seqs.len() * n_vocab);
            for (&seq, &t) in seqs.iter().zip(tokens) {
                all.extend(be.decode_step_h(seq, t)?);
            }
            all
        }
        Tick::Full(_) => be.decode_step_batch(seqs, tokens)?,
        Tick::Unsplit => be.decode_step_batch_walk(Walk::Unsplit, seqs, tokens)?,
    };
    let chosen = seqs
        .iter()
        .zip(logits.chunks_exact(n_vocab))
        .map(|(&seq, row)| choose(row, tick, seq, be.seq_len(seq)?))
        .collect::<Result<Vec<u32>, EngineError>>()?;
    Ok((logits, chosen))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tiny_backend() -> Box<dyn Backend> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.gguf");
        memra_engine::synth::write_preset("tiny", "q8_0", 3, &path).unwrap();
        let model = memra_engine::model::LlamaModel::open(&path).unwrap();
        let doors = memra_engine::doors::Doors {
            backend: memra_engine::doors::BackendChoice::Cpu,
            ..memra_engine::doors::Doors::default()
        };
        memra_engine::backend::open_backend(model, &doors).unwrap()
    }

    #[test]
    fn runs_close_their_sequences_also_on_error() {
        let mut be = tiny_backend();
        let good = prompts(512, 2, 3, 0, 0);
        let t = run(&mut *be, &good, 0, 2, Tick::Full(SamplingParams::greedy())).unwrap();
        assert_eq!(
            (t.logits.len(), t.logits[1].len(), t.tokens[1].len()),
            (2, 2 * 512, 2)
        );
        // A token outside the vocabulary fails the second prime after the first opened.
        let bad = vec![vec![1, 2], vec![9999]];
        assert!(run(&mut *be, &bad, 0, 2, Tick::Single).is_err());
        assert!(be.seq_len(SeqId(0)).is_err(), "sequence 0 was closed");
        assert!(
            run(&mut *be, &good, 0, 1, Tick::Single).is_ok(),
            "ids reusable"
        );
    }

    #[test]
    fn side_by_side_puts_run_b_in_row_b() {
        let mut be = tiny_backend();
        let ps = prompts(512, 3, 4, 9, 0);
        let alone = run_alone(&mut *be, &ps, 0, 2, Tick::Full(SamplingParams::greedy())).unwrap();
        let second = run(
            &mut *be,
            &ps[1..2],
            1,
            2,
            Tick::Full(SamplingParams::greedy()),
        )
        .unwrap();
        assert_eq!(alone.logits[1][512..1024], second.logits[1][..]);
        assert_eq!(alone.tokens[1][1], second.tokens[1][0]);
    }

    #[test]
    fn a_fed_run_takes_the_given_tokens_and_records_its_own_choices() {
        let mut be = tiny_backend();
        let ps = prompts(512, 2, 4, 5, 0);
        let greedy = Tick::Full(SamplingParams::greedy());
        let own = run(&mut *be, &ps, 0, 3, greedy).unwrap();
        assert_eq!(
            own.inputs[1], own.tokens[0],
            "a step is fed the last step's choice"
        );
        // Fed its own inputs, a run is itself.
        let again = run_fed(&mut *be, &ps, 0, &own.inputs, greedy, Prime::Prefill).unwrap();
        assert_eq!(again, own);
        // Fed other tokens, it follows them and still records what it would have chosen.
        let mut other = own.inputs.clone();
        other[1] = vec![(own.inputs[1][0] + 1) % 512, own.inputs[1][1]];
        let fed = run_fed(&mut *be, &ps, 0, &other, greedy, Prime::Prefill).unwrap();
        assert_eq!(fed.inputs, other);
        assert_eq!(fed.logits[0], own.logits[0]);
        assert_ne!(
            fed.logits[1][..512],
            own.logits[1][..512],
            "row 0 took another token"
        );
        assert_eq!(fed.logits[1][512..], own.logits[1][512..], "row 1 did not");
        assert_eq!(
            fed.inputs[2], other[2],
            "the feed, not its own choice, goes on"
        );
        // A feed with the wrong number of rows is refused.
        assert!(run_fed(&mut *be, &ps, 0, &[vec![1]], greedy, Prime::Prefill).is_err());
    }

    #[test]
    fn a_phased_run_steps_only_the_rows_of_each_phase() {
        let mut be = tiny_backend();
        let ps = prompts(512, 3, 4, 6, 0);
        let phases = [(vec![0, 1, 2], 2), (vec![0], 1), (vec![0, 2], 1)];
        let rows = run_phases(&mut *be, &ps, 0, &phases).unwrap();
        let steps: Vec<usize> = rows.iter().map(|t| t.logits.len()).collect();
        assert_eq!(steps, [4, 2, 3]);
        let alone = run(
            &mut *be,
            &ps[2..3],
            2,
            3,
            Tick::Full(SamplingParams::greedy()),
        )
        .unwrap();
        assert_eq!(rows[2].logits, alone.logits);
        assert_eq!(rows[2].tokens, alone.tokens);
    }

    #[test]
    fn prompts_are_distinct_uneven_and_seeded() {
        let a = prompts(512, 5, 6, 0, 0);
        let lens: Vec<usize> = a.iter().map(Vec::len).collect();
        assert_eq!(lens, vec![6, 9, 7, 10, 8]);
        for i in 0..a.len() {
            for j in i + 1..a.len() {
                assert_ne!(a[i][..6], a[j][..6]);
            }
        }
        assert!(a.iter().flatten().all(|&t| t < 512));
        assert_ne!(a, prompts(512, 5, 6, 1, 0));
        assert_eq!(a, prompts(512, 5, 6, 0, 0));
    }
}
