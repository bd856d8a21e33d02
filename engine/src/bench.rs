//! Throughput benchmark of a backend: decode tokens/s at several batch sizes and prefill
//! tokens/s, printed as a table by `memra-engine bench`.
//!
//! It owns the workload (prompt, steps, repetitions, synthetic token ids) and the timing;
//! it asserts nothing about speed. Which model and backend it runs is the caller's choice.

use std::time::Instant;

use memra_kernels::twin;

use crate::backend::Backend;
use crate::doors::Doors;
use crate::error::EngineError;
use crate::seq::SeqId;
use crate::spec::{Drafting, SpecSeq, SpecStats, speculate};

/// What to measure.
#[derive(Debug, Clone)]
pub struct BenchPlan {
    /// Tokens of the prefill measurement.
    pub prompt_len: usize,
    /// Decode steps per measurement (after a short prompt).
    pub decode_steps: usize,
    /// Batch sizes of the decode measurements; B=1 runs the single-sequence path.
    pub batches: Vec<usize>,
    /// Repetitions; the best (fastest) is reported, as the least disturbed by other load.
    pub reps: usize,
    /// Tokens primed before the decode measurements (`None`: a short prompt), so decode
    /// can be timed at a long context.
    pub decode_context: Option<usize>,
}

impl Default for BenchPlan {
    fn default() -> Self {
        BenchPlan {
            prompt_len: 128,
            decode_steps: 32,
            batches: vec![1, 8],
            reps: 3,
            decode_context: None,
        }
    }
}

/// One measured line of the table.
#[derive(Debug, Clone)]
pub struct BenchRow {
    pub what: String,
    /// Tokens processed per repetition.
    pub tokens: usize,
    /// Best wall time of one repetition.
    pub seconds: f64,
    /// CPU time (user + system, all threads) of that repetition: on a shared machine wall
    /// time also counts other processes' load, CPU time does not.
    pub cpu_seconds: f64,
}

impl BenchRow {
    pub fn tokens_per_s(&self) -> f64 {
        self.tokens as f64 / self.seconds
    }

    /// Tokens per CPU-second: what one fully available core would reach.
    pub fn tokens_per_cpu_s(&self) -> f64 {
        self.tokens as f64 / self.cpu_seconds
    }
}

/// CPU time of this process so far (user + system, every thread), in seconds.
fn cpu_time() -> f64 {
    let mut usage = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: getrusage writes one `rusage` into the pointer, which points at a zeroed,
    // properly aligned `rusage` that lives for the call; RUSAGE_SELF is a valid `who`.
    let rc = unsafe { libc::getrusage(libc::RUSAGE_SELF, usage.as_mut_ptr()) };
    if rc != 0 {
        return f64::NAN;
    }
    // SAFETY: getrusage returned 0, so it filled the struct (zeroed before, so initialised
    // either way).
    let usage = unsafe { usage.assume_init() };
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 * 1e-6;
    tv(usage.ru_utime) + tv(usage.ru_stime)
}

/// Wall and CPU seconds of `f`.
fn timed<T>(f: impl FnOnce() -> T) -> (T, f64, f64) {
    let (c0, t0) = (cpu_time(), Instant::now());
    let out = f();
    (out, t0.elapsed().as_secs_f64(), cpu_time() - c0)
}

/// Length of the prompt each decode measurement starts from.
const DECODE_PROMPT: usize = 8;

fn ids(n: usize, n_vocab: usize, salt: usize) -> Vec<u32> {
    (0..n)
        .map(|i| ((i * 7919 + salt * 104_729 + 17) % n_vocab) as u32)
        .collect()
}

/// Runs `plan` on `backend` (opened under `doors`) and returns one row per measurement.
pub fn run(
    backend: &mut dyn Backend,
    doors: &Doors,
    plan: &BenchPlan,
) -> Result<Vec<BenchRow>, EngineError> {
    let n_vocab = backend.config().n_vocab;
    let mut rows = Vec::new();
    let reps = plan.reps.max(1);

    let prompt = ids(plan.prompt_len, n_vocab, 0);
    let mut best = (f64::INFINITY, f64::NAN);
    for _ in 0..reps {
        backend.open_sequence(SeqId(0), plan.prompt_len)?;
        let (done, wall, cpu) = timed(|| backend.prime(SeqId(0), &prompt));
        done?;
        if wall < best.0 {
            best = (wall, cpu);
        }
        backend.close_sequence(SeqId(0))?;
    }
    rows.push(BenchRow {
        what: format!("prefill (prime, {} tokens)", plan.prompt_len),
        tokens: plan.prompt_len,
        seconds: best.0,
        cpu_seconds: best.1,
    });

    let context = plan.decode_context.unwrap_or(DECODE_PROMPT);
    for &b in &plan.batches {
        let seqs: Vec<SeqId> = (0..b as u32).map(SeqId).collect();
        let mut best = (f64::INFINITY, f64::NAN);
        for _ in 0..reps {
            for &s in &seqs {
                backend.open_sequence(s, context + plan.decode_steps)?;
                backend.prime(s, &ids(context, n_vocab, s.0 as usize + 1))?;
            }
            let feeds: Vec<Vec<u32>> = (0..plan.decode_steps)
                .map(|i| ids(b, n_vocab, 1000 + i))
                .collect();
            let (done, wall, cpu) = timed(|| -> Result<(), EngineError> {
                for feed in &feeds {
                    if b == 1 {
                        crate::engine::plain_step_logits(backend, doors, seqs[0], feed[0])?;
                    } else {
                        backend.decode_step_batch(&seqs, feed)?;
                    }
                }
                Ok(())
            });
            done?;
            if wall < best.0 {
                best = (wall, cpu);
            }
            for &s in &seqs {
                backend.close_sequence(s)?;
            }
        }
        let path = match (b, backend.doors_report().b1fast) {
            (1, false) => "plain generate's step: decode_step_batch at B=1",
            (1, true) => "plain generate's step: decode_step_h under MEMRA_SERVE_B1FAST=1",
            _ => "decode_step_batch",
        };
        rows.push(BenchRow {
            what: match plan.decode_context {
                Some(c) => format!(
                    "decode B={b} ({path}, {} steps at context {c})",
                    plan.decode_steps
                ),
                None => format!("decode B={b} ({path}, {} steps)", plan.decode_steps),
            },
            tokens: b * plan.decode_steps,
            seconds: best.0,
            cpu_seconds: best.1,
        });
    }
    Ok(rows)
}

/// The prompts of the speculative measurements: one that repeats a motif of five tokens
/// (the drafter's good case) and one of distinct-looking ids (its bad case), 32 tokens each.
fn spec_prompts(n_vocab: usize) -> [(&'static str, Vec<u32>); 2] {
    let motif = ids(5, n_vocab, 3);
    [
        (
            "repetitive",
            motif.iter().copied().cycle().take(32).collect(),
        ),
        ("non-repetitive", ids(32, n_vocab, 11)),
    ]
}

/// Speculative decoding with drafts of up to `k` against plain greedy decoding, both at B=1
/// on the batched path's composition (the one the verify runs), on [`spec_prompts`]: the
/// `decode_steps` tokens after the prompt's own, prime excluded from the timing. Each
/// speculative row names its tokens per verify and the accepted share of its drafts.
pub fn run_spec(
    backend: &mut dyn Backend,
    plan: &BenchPlan,
    k: usize,
) -> Result<Vec<BenchRow>, EngineError> {
    let n_vocab = backend.config().n_vocab;
    let steps = plan.decode_steps;
    let seq = SeqId(0);
    let mut rows = Vec::new();
    for (kind, prompt) in spec_prompts(n_vocab) {
        let cap = prompt.len() + steps + 1;
        let mut best = (f64::INFINITY, f64::NAN);
        for _ in 0..plan.reps.max(1) {
            backend.open_sequence(seq, cap)?;
            let mut t = twin::argmax(&backend.prime(seq, &prompt)?);
            let (done, wall, cpu) = timed(|| -> Result<(), EngineError> {
                for _ in 0..steps {
                    t = twin::argmax(&backend.decode_step_batch(&[seq], &[t])?);
                }
                Ok(())
            });
            backend.close_sequence(seq)?;
            done?;
            if wall < best.0 {
                best = (wall, cpu);
            }
        }
        rows.push(BenchRow {
            what: format!("plain greedy B=1 (decode_step_batch, {kind} prompt)"),
            tokens: steps,
            seconds: best.0,
            cpu_seconds: best.1,
        });
        let mut best = (f64::INFINITY, f64::NAN, SpecStats::default());
        for _ in 0..plan.reps.max(1) {
            backend.open_sequence(seq, cap)?;
            let first = twin::argmax(&backend.prime(seq, &prompt)?);
            let seqs = [SpecSeq {
                seq,
                prompt: prompt.clone(),
                first,
            }];
            let (done, wall, cpu) = timed(|| {
                speculate(
                    &mut *backend,
                    &seqs,
                    k,
                    steps + 1,
                    Drafting::Lookup,
                    false,
                    &mut |_, _| false,
                    &mut |_| {},
                )
            });
            backend.close_sequence(seq)?;
            let (_, stats) = done?;
            if wall < best.0 {
                best = (wall, cpu, stats);
            }
        }
        let st = best.2;
        rows.push(BenchRow {
            what: format!(
                "spec K={k} B=1 ({kind} prompt: {:.2} tokens/verify, {:.0}% of drafts accepted)",
                st.tokens_per_verify(),
                100.0 * st.acceptance()
            ),
            tokens: steps,
            seconds: best.0,
            cpu_seconds: best.1,
        });
    }
    Ok(rows)
}

/// The table `memra-engine bench` prints.
pub fn render(title: &str, rows: &[BenchRow]) -> String {
    let width = rows.iter().map(|r| r.what.len()).max().unwrap_or(0).max(11);
    let mut out = format!("{title}\n");
    out += &format!(
        "| {:<width$} | {:>7} | {:>9} | {:>9} | {:>9} | {:>12} |\n",
        "measurement", "tokens", "best s", "tokens/s", "cpu s", "tokens/cpu-s"
    );
    let dashes = |n: usize| "-".repeat(n);
    out += &format!(
        "|{}|{}|{}|{}|{}|{}|\n",
        dashes(width + 2),
        dashes(9),
        dashes(11),
        dashes(11),
        dashes(11),
        dashes(14)
    );
    for r in rows {
        out += &format!(
            "| {:<width$} | {:>7} | {:>9.4} | {:>9.1} | {:>9.4} | {:>12.1} |\n",
            r.what,
            r.tokens,
            r.seconds,
            r.tokens_per_s(),
            r.cpu_seconds,
            r.tokens_per_cpu_s()
        );
    }
    out
}
