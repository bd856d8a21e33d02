//! `spec-gate`: speculative decoding is exact. `spec.plain` holds the speculative greedy
//! stream to plain greedy generation — the steps `memra-engine generate` itself takes
//! ([`memra_engine::engine::plain_step_logits`]) — token for token and every emitted token's verify
//! column to the logits plain generation chose it from, bit for bit, for every draft length
//! K, single and batched; `spec.column` holds every verify column to the same position decoded alone at
//! B=1; `spec.rewind` holds the steps after a rewind to a cache that never saw the rejected
//! tokens.
//!
//! It owns the flags, the arms and their verdicts. The drafter, acceptance and the loop are
//! [`memra_engine::spec`]'s; programs and ledgers come from [`crate::workload`] and
//! [`crate::ledger`], the protocol from [`crate::output`]. `docs/gates.md` says what each
//! row proves and how to read a failure.

use std::path::PathBuf;

use clap::Parser;
use memra_engine::sampling::argmax;
use memra_protocol::{Check, Status};
use serde_json::json;

use crate::ledger::Ledger;
use crate::output::{GateError, GateExit, Reporter};
use crate::workload::prompts;
use memra_engine::backend::{Backend, EngineError, SeqId, Walk, open_backend};
use memra_engine::doors::Doors;
use memra_engine::engine::{plain_step_logits, spec_refusal};
use memra_engine::spec::{Drafting, Round, SpecSeq, SpecStats, speculate};

/// Flags of `spec-gate`. Exit status: 0 pass, 1 a check failed, 2 bad flags, pins or model.
#[derive(Debug, Parser)]
#[command(
    name = "spec-gate",
    about = "Speculative decoding exactness gate (spec.plain: speculative vs plain greedy \
             streams; spec.column: verify columns vs the same positions decoded alone; \
             spec.rewind: steps after a rewind vs a cache that never saw the rejected \
             tokens). Exit 0 pass, 1 fail, 2 usage or setup error."
)]
pub struct Args {
    /// The GGUF checkpoint.
    pub model: PathBuf,
    /// Draft lengths K, comma-separated.
    #[arg(long, default_value = "1,4,8")]
    pub k: String,
    /// Sequences of the batched runs (the single runs are B=1).
    #[arg(long, default_value_t = 3)]
    pub batch: usize,
    /// Tokens each stream emits.
    #[arg(long, default_value_t = 24)]
    pub steps: usize,
    /// Base prompt length; rows get uneven lengths from plen to plen+4.
    #[arg(long, default_value_t = 8)]
    pub plen: usize,
}

/// Validated settings.
#[derive(Debug, Clone)]
struct Settings {
    ks: Vec<usize>,
    batch: usize,
    steps: usize,
    plen: usize,
}

/// Decode steps after each rewind of `spec.rewind`.
const AFTER_REWIND: usize = 4;

/// Runs the gate on the process arguments and environment; returns the exit status.
pub fn main() -> i32 {
    crate::output::gate_main::<Args>("spec-gate", run_gate)
}

/// Parses a comma-separated list of draft lengths, each ≥ 1.
pub(crate) fn parse_list(flag: &str, text: &str, min: usize) -> Result<Vec<usize>, GateError> {
    text.split(',')
        .map(|k| k.trim().parse::<usize>().ok().filter(|&k| k >= min))
        .collect::<Option<Vec<usize>>>()
        .filter(|v| !v.is_empty())
        .ok_or_else(|| {
            GateError::new(format!(
                "{flag} {text:?}: give a number >= {min} or a comma-separated list, e.g. {}",
                if min == 1 { "1,4,8" } else { "2,5,9" }
            ))
        })
}

fn settings(args: &Args) -> Result<Settings, GateError> {
    let ks = parse_list("--k", &args.k, 1)?;
    if args.batch == 0 {
        return Err(GateError::new("--batch 0: give at least one sequence"));
    }
    if args.steps < 3 {
        return Err(GateError::new(
            "--steps must be >= 3: a stream of two tokens has no room for a draft, so nothing \
             speculative would be tested",
        ));
    }
    if args.plen == 0 {
        return Err(GateError::new("--plen 0: prompts need at least one token"));
    }
    Ok(Settings {
        ks,
        batch: args.batch,
        steps: args.steps,
        plen: args.plen,
    })
}

/// The whole gate: flags, doors and model are read here; errors before the first check are
/// setup errors (exit 2).
pub fn run_gate(args: &Args) -> Result<GateExit, GateError> {
    let s = settings(args)?;
    let doors = Doors::from_env().map_err(|e| GateError::new(format!("bad pins: {e}")))?;
    let model = crate::output::open_model(&args.model)?;
    let k_max = s.ks.iter().copied().max().unwrap_or(1);
    let need = s.plen + 4 + 2 * s.steps + k_max + AFTER_REWIND + 1;
    if need > model.config.n_ctx {
        return Err(GateError::new(format!(
            "--plen {}, --steps {} and --k up to {k_max} need {need} positions but the \
             model's context is {}; lower them",
            s.plen, s.steps, model.config.n_ctx
        )));
    }
    // The plain reference is what `memra-engine generate` runs under these doors, on the
    // same backend, planted defects included, so only a speculative difference can show.
    // Where the doors send plain steps to a composition no verify runs, `generate` refuses
    // --spec, and there is no law to hold.
    let mut be = open_backend(model, &doors).map_err(|e| GateError::new(e.to_string()))?;
    if let Some(why) = spec_refusal(&be.doors_report()) {
        return Err(GateError::new(format!(
            "{why}; memra-engine generate refuses --spec under these doors, so spec-gate has \
             no plain stream to hold it to"
        )));
    }
    let mut rep = Reporter::from_env("spec-gate");
    let extra = vec![
        ("spec_k", json!(join(&s.ks))),
        ("spec_drafter", json!("prompt-lookup")),
        ("batch", json!(s.batch.to_string())),
        ("steps", json!(s.steps)),
        ("plen", json!(s.plen)),
    ];
    rep.header(&be.doors_report(), &doors, &extra)?;
    let separate_single = be.doors_report().norm == "separate";
    let n_vocab = be.config().n_vocab;
    let sets = [
        (
            "repetitive",
            repetitive_prompts(n_vocab, s.batch, s.plen, doors.gate_seed),
        ),
        (
            "random",
            prompts(n_vocab, s.batch, s.plen, doors.gate_seed, 0),
        ),
    ];
    let be = &mut *be;
    let checks = vec![
        plain_arm(be, &doors, &s, &sets).unwrap_or_else(|e| fail("spec.plain", e)),
        column_arm(be, &s, &sets, separate_single).unwrap_or_else(|e| fail("spec.column", e)),
        rewind_arm(be, &s, &sets).unwrap_or_else(|e| fail("spec.rewind", e)),
    ];
    for c in &checks {
        rep.check(c)?;
    }
    Ok(rep.finish())
}

/// An engine error in the middle of an arm is a failed check, not a crash: the arm names it.
fn fail(name: &str, e: EngineError) -> Check {
    Check::new(name, Status::Fail, format!("the engine refused: {e}"))
}

/// Prompts that repeat a short motif (each row its own), so the drafter finds
/// continuations and drafts are accepted as well as rejected.
fn repetitive_prompts(n_vocab: usize, count: usize, plen: usize, seed: u64) -> Vec<Vec<u32>> {
    prompts(n_vocab, count, 3, seed, 7)
        .into_iter()
        .enumerate()
        .map(|(b, motif)| {
            let len = plen + (3 * b) % 5;
            motif.iter().copied().cycle().take(len.max(4)).collect()
        })
        .collect()
}

/// Sequence ids of a run: `base + b`.
fn ids(base: u32, n: usize) -> Vec<SeqId> {
    (0..n as u32).map(|b| SeqId(base + b)).collect()
}

/// Plain greedy generation of each prompt alone, as `memra-engine generate` runs it: the
/// prompt primed, then `steps - 1` of its steps ([`plain_step_logits`]; batch invariance is
/// decode-batch-gate's to hold, so no batch-size defect reaches this side).
pub struct PlainRun {
    /// Each prompt's stream of `steps` tokens.
    pub streams: Vec<Vec<u32>>,
    /// Each prompt's `[steps - 1, n_vocab]` logits: row `i` chose the stream's token `i + 1`.
    pub logits: Vec<Vec<f32>>,
}

/// [`PlainRun`] of `prompts` under `doors` (which choose plain generation's path).
pub fn plain(
    be: &mut dyn Backend,
    doors: &Doors,
    prompts: &[Vec<u32>],
    steps: usize,
) -> Result<PlainRun, EngineError> {
    let seq = SeqId(500);
    let mut run = PlainRun {
        streams: Vec::new(),
        logits: Vec::new(),
    };
    for p in prompts {
        be.open_sequence(seq, p.len() + steps)?;
        let result = (|| {
            let mut stream = vec![argmax(&be.prime(seq, p)?)];
            let mut logits = Vec::new();
            for _ in 1..steps {
                let t = *stream.last().expect("seeded");
                let row = plain_step_logits(be, doors, seq, t)?;
                stream.push(argmax(&row));
                logits.extend(row);
            }
            Ok((stream, logits))
        })();
        close(be, &[seq]);
        let (stream, logits) = result?;
        run.streams.push(stream);
        run.logits.push(logits);
    }
    Ok(run)
}

/// The verify column each emitted token after a stream's first was chosen from, per row of
/// a speculative run (sequence ids `600 + row`): `[tokens - 1, n_vocab]` per row, in stream
/// order, cut at `steps - 1` like the streams.
fn emitted_columns(rounds: &[Round], rows: usize, steps: usize, n_vocab: usize) -> Vec<Vec<f32>> {
    let mut out = vec![Vec::new(); rows];
    for round in rounds {
        let mut col = 0;
        for (j, seq) in round.seqs.iter().enumerate() {
            let row = &mut out[(seq.0 - 600) as usize];
            let room = (steps - 1).saturating_sub(row.len() / n_vocab);
            let take = (round.accepted[j] + 1).min(room);
            row.extend_from_slice(&round.logits[col * n_vocab..(col + take) * n_vocab]);
            col += round.inputs[j].len();
        }
    }
    out
}

/// Closes whichever of `seqs` are open.
fn close(be: &mut dyn Backend, seqs: &[SeqId]) {
    for &s in seqs {
        let _ = be.close_sequence(s);
    }
}

/// A speculative run as a gate sees it: the streams, the counters, every round.
pub type SpecRun = (Vec<Vec<u32>>, SpecStats, Vec<Round>);

/// Speculative greedy decoding of `prompts` with drafts of up to `k`, every round recorded.
/// With `unsplit` every pass walks the unsplit body: the verifies, and the prompt too, primed
/// as one verify of its tokens (the prompt's composition; verify rows are no canary site).
pub fn speculative(
    be: &mut dyn Backend,
    prompts: &[Vec<u32>],
    steps: usize,
    k: usize,
    drafting: Drafting,
    unsplit: bool,
) -> Result<SpecRun, EngineError> {
    let seqs = ids(600, prompts.len());
    let result = (|| {
        let mut spec = Vec::new();
        for (&seq, p) in seqs.iter().zip(prompts) {
            // Room beyond the stream's own (prompt, steps and one draft) for a rewind that
            // keeps too much to show as a token difference rather than a full cache.
            be.open_sequence(seq, p.len() + 2 * steps + k + 1)?;
            let last = if unsplit {
                let l = be.verify_batch_walk(Walk::Unsplit, &[seq], std::slice::from_ref(p))?;
                l[l.len() - be.config().n_vocab..].to_vec()
            } else {
                be.prime(seq, p)?
            };
            let first = argmax(&last);
            spec.push(SpecSeq {
                seq,
                prompt: p.clone(),
                first,
            });
        }
        let mut rounds = Vec::new();
        let (streams, stats) = speculate(
            be,
            &spec,
            k,
            steps,
            drafting,
            unsplit,
            &mut |_, _| false,
            &mut |r| rounds.push(r.clone()),
        )?;
        Ok((streams, stats, rounds))
    })();
    close(be, &seqs);
    result
}

/// spec.plain: the speculative stream against plain greedy generation, for every K, at B=1
/// and at B=`batch`, on both prompt sets: token for token, and each emitted token's verify
/// column against the logits plain generation chose it from, bit for bit.
fn plain_arm(
    be: &mut dyn Backend,
    doors: &Doors,
    s: &Settings,
    sets: &[(&str, Vec<Vec<u32>>)],
) -> Result<Check, EngineError> {
    let n_vocab = be.config().n_vocab;
    let mut ledger = Ledger::default();
    let mut columns = Ledger::default();
    let mut step = 0usize;
    // Verifies whose sequences' drafts differ in length: the column offsets of such a
    // batch are what the bitwise column comparison holds beyond a uniform batch.
    let mut mixed = 0usize;
    let mut stats = SpecStats::default();
    let mut first_diff: Option<String> = None;
    let mut runs = 0usize;
    for (set, ps) in sets {
        let batches: &[usize] = if s.batch > 1 { &[1, s.batch] } else { &[1] };
        for &b in batches {
            let want = plain(be, doors, &ps[..b], s.steps)?;
            // A batch drafts staggered (row r at most K - r % K tokens), so its verifies hold
            // drafts of different lengths however well the prompts repeat; alone, the
            // drafting is generate --spec's own.
            let drafting = if b > 1 {
                Drafting::Staggered
            } else {
                Drafting::Lookup
            };
            for &k in &s.ks {
                let (got, st, rounds) = speculative(be, &ps[..b], s.steps, k, drafting, false)?;
                runs += 1;
                add(&mut stats, &st);
                mixed += rounds
                    .iter()
                    .filter(|r| r.inputs.iter().any(|i| i.len() != r.inputs[0].len()))
                    .count();
                let chosen_from = emitted_columns(&rounds, b, s.steps, n_vocab);
                for (w, g) in want.logits.iter().zip(&chosen_from) {
                    columns.logits(Some(step), w, g, n_vocab);
                    step += 1;
                }
                for (row, (w, g)) in want.streams.iter().zip(&got).enumerate() {
                    ledger.tokens(Some(row), w, g);
                    if w != g && first_diff.is_none() {
                        let at = w.iter().zip(g).position(|(a, b)| a != b).unwrap_or(w.len());
                        first_diff = Some(format!(
                            "; first difference: {set} prompts, B={b}, K={k}, row {row}, \
                             token {at}"
                        ));
                    }
                }
            }
        }
    }
    let what = format!(
        "speculative greedy streams ({} tokens, K={}, B=1 and B={}, repetitive and random \
         prompts, the batch's drafts staggered to K - row % K tokens so one verify holds \
         drafts of different lengths: {runs} runs) vs plain greedy generation of each sequence alone (the steps \
         memra-engine generate takes), token for token, and each emitted token's verify \
         column vs the logits plain generation chose it from, bit for bit; \
         {} of {} drafted tokens accepted, {:.2} tokens per verify{}",
        s.steps,
        join(&s.ks),
        s.batch,
        stats.accepted,
        stats.drafted,
        stats.tokens_per_verify(),
        first_diff.unwrap_or_default()
    );
    ledger.absorb(&columns);
    let mut c = ledger.check("spec.plain", &what);
    c = c
        .metric("drafted", stats.drafted)
        .metric("accepted", stats.accepted)
        .metric("rounds", stats.rounds)
        .metric("mixed_length_verifies", mixed)
        .metric(
            "tokens_per_verify",
            (stats.tokens_per_verify() * 1000.0).round() / 1000.0,
        );
    if stats.accepted == 0 {
        c.status = Status::Fail;
        c.message = format!(
            "{what}: no draft token was accepted, so nothing speculative was tested; the \
             repetitive prompts must make the drafter right sometimes"
        );
    } else if s.batch > 1 && mixed == 0 {
        c.status = Status::Fail;
        c.message = format!(
            "{what}: no verify of B={} held drafts of different lengths, so the column \
             offsets of a mixed batch were not tested",
            s.batch
        );
    }
    Ok(c)
}

fn add(total: &mut SpecStats, st: &SpecStats) {
    total.rounds += st.rounds;
    total.verifies += st.verifies;
    total.columns += st.columns;
    total.drafted += st.drafted;
    total.accepted += st.accepted;
    total.emitted += st.emitted;
}

/// `v` comma-separated, as the doors rows and messages write lists.
pub(crate) fn join(v: &[usize]) -> String {
    v.iter()
        .map(|k| k.to_string())
        .collect::<Vec<_>>()
        .join(",")
}

/// spec.column: every column of every verify (full drafts, so rejected columns too) against
/// the same tokens decoded one at a time at B=1 from a fresh cache: the batched path bit for
/// bit, and the single-sequence path bit for bit when it runs the same (separate)
/// composition, by argmax otherwise.
fn column_arm(
    be: &mut dyn Backend,
    s: &Settings,
    sets: &[(&str, Vec<Vec<u32>>)],
    separate_single: bool,
) -> Result<Check, EngineError> {
    let n_vocab = be.config().n_vocab;
    let mut ledger = Ledger::default();
    let mut single = Ledger::default();
    let (mut agree, mut columns) = (0usize, 0usize);
    let k = s.ks.iter().copied().max().unwrap_or(1);
    let mut step = 0usize;
    for (_, ps) in sets {
        let b = s.batch.min(ps.len());
        let (_, _, rounds) = speculative(be, &ps[..b], s.steps, k, Drafting::Fixed, false)?;
        // What each sequence's cache held before each round: its prompt and its stream
        // up to the pending token.
        let mut held: Vec<Vec<u32>> = ps[..b].to_vec();
        for round in &rounds {
            let mut col = 0;
            for (j, seq) in round.seqs.iter().enumerate() {
                let row = (seq.0 - 600) as usize;
                let input = &round.inputs[j];
                let got = &round.logits[col * n_vocab..(col + input.len()) * n_vocab];
                col += input.len();
                let want = replay(be, &held[row], input, false)?;
                ledger.logits(Some(step), &want, got, n_vocab);
                let alone = replay(be, &held[row], input, true)?;
                for (a, g) in alone.chunks_exact(n_vocab).zip(got.chunks_exact(n_vocab)) {
                    columns += 1;
                    agree += usize::from(argmax(a) == argmax(g));
                }
                if separate_single {
                    single.logits(Some(step), &alone, got, n_vocab);
                }
                held[row].extend_from_slice(&input[..=round.accepted[j]]);
                step += 1;
            }
        }
    }
    let mut what = format!(
        "every verify column (K={k}, drafts filled to K so rejected columns count, B={}) vs \
         the same tokens decoded alone at B=1 from a fresh cache, bit for bit against the \
         batched path",
        s.batch
    );
    if separate_single {
        what += " and the single-sequence path (both run the separate composition here)";
        ledger.absorb(&single);
    } else {
        what += &format!(
            "; the single-sequence path runs the fused tier under these pins, another \
             composition (as gate1 says), so it is held by argmax only: {agree} of {columns} \
             columns agree"
        );
    }
    let mut c = ledger.check("spec.column", &what);
    c = c
        .metric("single_argmax_agree", agree)
        .metric("columns", columns);
    Ok(c)
}

/// The logits of feeding `input` one token at a time at B=1 into a fresh sequence primed
/// with `held`: through the single-sequence path with `single`, else the batched path.
fn replay(
    be: &mut dyn Backend,
    held: &[u32],
    input: &[u32],
    single: bool,
) -> Result<Vec<f32>, EngineError> {
    let seq = SeqId(900);
    be.open_sequence(seq, held.len() + input.len())?;
    let result = (|| {
        be.prime(seq, held)?;
        let mut out = Vec::new();
        for &t in input {
            out.extend(if single {
                be.decode_step_h(seq, t)?
            } else {
                be.decode_step_batch(&[seq], &[t])?
            });
        }
        Ok(out)
    })();
    close(be, &[seq]);
    result
}

/// spec.rewind: after a verify of the pending token and K draft tokens, a rewind that keeps
/// the pending token and `m` drafts (m = 0, K/2 and K-1: every rewind drops at least the
/// last column) and then [`AFTER_REWIND`] decode steps,
/// against a cache of the same backend that was only ever fed the kept tokens.
fn rewind_arm(
    be: &mut dyn Backend,
    s: &Settings,
    sets: &[(&str, Vec<Vec<u32>>)],
) -> Result<Check, EngineError> {
    let n_vocab = be.config().n_vocab;
    let mut ledger = Ledger::default();
    let mut cases = 0usize;
    let mut step = 0usize;
    for (_, ps) in sets {
        for p in ps {
            for &k in &s.ks {
                let mut keeps = vec![0, k / 2, k - 1];
                keeps.dedup();
                for m in keeps {
                    let draft: Vec<u32> = (0..=k)
                        .map(|i| ((p[i % p.len()] as usize + 13 * i + 1) % n_vocab) as u32)
                        .collect();
                    let next: Vec<u32> = (0..AFTER_REWIND)
                        .map(|i| ((p[0] as usize + 101 * (i + 1)) % n_vocab) as u32)
                        .collect();
                    let got = after_rewind(be, p, &draft, m, &next)?;
                    let mut kept = p.clone();
                    kept.extend_from_slice(&draft[..=m]);
                    // The same backend on both sides: the steps after the rewind take the
                    // candidate's own B=1 route, so the fresh cache must too.
                    let want = replay(be, &kept, &next, false)?;
                    ledger.logits(Some(step), &want, &got, n_vocab);
                    cases += 1;
                    step += 1;
                }
            }
        }
    }
    let what = format!(
        "{cases} rewinds (K={}, keeping the pending token and 0, K/2 or K-1 drafts) then \
         {AFTER_REWIND} batched steps at B=1, vs a cache only ever fed the kept tokens, bit \
         for bit",
        join(&s.ks)
    );
    Ok(ledger.check("spec.rewind", &what).metric("rewinds", cases))
}

/// Primes `prompt`, verifies `draft` (pending token first), rewinds to the prompt plus the
/// pending token and `m` drafts, then decodes `next` at B=1; returns those steps' logits.
fn after_rewind(
    be: &mut dyn Backend,
    prompt: &[u32],
    draft: &[u32],
    m: usize,
    next: &[u32],
) -> Result<Vec<f32>, EngineError> {
    let seq = SeqId(800);
    be.open_sequence(seq, prompt.len() + draft.len() + next.len())?;
    let result = (|| {
        be.prime(seq, prompt)?;
        be.verify_batch(&[seq], &[draft.to_vec()])?;
        be.rewind(seq, prompt.len() + 1 + m)?;
        let mut out = Vec::new();
        for &t in next {
            out.extend(be.decode_step_batch(&[seq], &[t])?);
        }
        Ok(out)
    })();
    close(be, &[seq]);
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_are_validated_with_the_fix_named() {
        let args = |extra: &[&str]| {
            let mut v = vec!["spec-gate", "m.gguf"];
            v.extend_from_slice(extra);
            settings(&Args::parse_from(v))
        };
        assert_eq!(args(&[]).unwrap().ks, [1, 4, 8]);
        assert!(args(&["--k", "0"]).unwrap_err().0.contains("1,4,8"));
        assert!(args(&["--k", "2,x"]).is_err());
        for steps in ["1", "2"] {
            let e = args(&["--steps", steps]).unwrap_err().0;
            assert!(e.contains("no room for a draft"), "{e}");
        }
        assert!(args(&["--steps", "3"]).is_ok());
        assert!(args(&["--batch", "0"]).is_err());
        assert_eq!(parse_list("--ts", "2,5,9", 2).unwrap(), [2, 5, 9]);
        assert!(parse_list("--ts", "1", 2).unwrap_err().0.contains("2,5,9"));
    }

    #[test]
    fn repetitive_prompts_repeat_and_differ_by_row() {
        let ps = repetitive_prompts(512, 3, 8, 0);
        assert_eq!(ps.len(), 3);
        assert_eq!(ps[0].len(), 8);
        assert_eq!(ps[0][..3], ps[0][3..6]);
        assert_ne!(ps[0], ps[1]);
    }
}
