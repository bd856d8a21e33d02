//! `decode-batch-gate`: batched decode is exact. gate1 compares the single-sequence path with
//! the batched path at B=1, gate2 batch rows with the same sequences alone, gate3 device
//! token choice and sampling with the host (a batch mixing greedy and sampled rows among
//! its parts); `--mode pp` compares a pipeline split with the unsplit body, localizing a
//! failure to the split or to the stage-owned placement.
//!
//! It owns the flags, the arms and their verdicts. Programs and ledgers come from
//! [`crate::workload`] and [`crate::ledger`], the protocol from [`crate::output`].
//! `docs/gates.md` says what each check proves and how to read a failure.

use std::path::PathBuf;

use clap::{Parser, ValueEnum};
use serde_json::json;

use crate::ledger::{Ledger, host_argmax};
use memra_protocol::{Check, Status};

use crate::output::{GateError, GateExit, Reporter};
use crate::workload::{
    Prime, Tick, Trace, prompts, run, run_alone, run_fed, run_phases, run_primed, run_rows,
    run_rows_alone,
};
use memra_engine::backend::{Backend, open_backend};
use memra_engine::doors::{Doors, PpSplits};
use memra_engine::model::LlamaModel;
use memra_engine::sampling::SamplingParams;

/// What the gate checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Mode {
    /// gate1 by argmax agreement (the default pins), gate2, gate3.
    Config,
    /// gate1 by bit identity (meaningful under the equalized pins), gate2, gate3.
    Strict,
    /// The pipeline split against the unsplit body: split, localizer, epilogue.
    Pp,
    /// The verify forward of speculative decoding split across pipeline stages against the
    /// unsplit verify, per column, per round, for every `--ts`: split and localizer.
    Ppspec,
}

/// Flags of `decode-batch-gate`. Exit status: 0 pass, 1 a check failed, 2 bad flags,
/// pins or model.
#[derive(Debug, Parser)]
#[command(
    name = "decode-batch-gate",
    about = "Batched decode exactness gate (gate1 single vs batched, gate2 batch vs alone, \
             gate3 sampling; --mode pp: pipeline split vs unsplit). Exit 0 pass, 1 fail, 2 \
             usage or setup error."
)]
pub struct Args {
    /// The GGUF checkpoint.
    pub model: PathBuf,
    /// Decode steps per run.
    #[arg(long, default_value_t = 8)]
    pub steps: usize,
    /// Batch size, or a comma-separated list of batch sizes.
    #[arg(long, default_value = "4")]
    pub batch: String,
    #[arg(long, value_enum, default_value_t = Mode::Config)]
    pub mode: Mode,
    /// Pipeline stages of the split (pp mode; default MEMRA_PP_STAGES when > 1, else 2).
    #[arg(long)]
    pub stages: Option<usize>,
    /// Repetitions of the split arm (pp mode): one green replay of a race is no evidence.
    #[arg(long, default_value_t = 2)]
    pub reps: usize,
    /// Base prompt length; rows get uneven lengths from plen to plen+4.
    #[arg(long, default_value_t = 8)]
    pub plen: usize,
    /// Verify widths T = K+1 (ppspec mode), comma-separated: every round verifies the
    /// pending token and K draft tokens.
    #[arg(long)]
    pub ts: Option<String>,
}

/// Validated settings.
#[derive(Debug, Clone)]
struct Settings {
    steps: usize,
    batches: Vec<usize>,
    mode: Mode,
    stages: Option<usize>,
    reps: usize,
    plen: usize,
    ts: Vec<usize>,
}

/// Prompt draws of gate1 in config mode, and how many diverging early make it fail.
const GATE1_DRAWS: usize = 6;
const GATE1_FAIL_DRAWS: usize = 4;
const GATE1_EARLY_STEP: usize = 3;

/// The sampling of gate3: temperature 0.7, no truncation, seed from the doors.
fn sampled(seed: u64) -> SamplingParams {
    SamplingParams {
        temperature: 0.7,
        top_k: 0,
        top_p: 1.0,
        seed,
    }
}

/// The per-row sampling of gate3's mixed batch: even rows greedy, odd rows sampled at
/// temperature 0.7 with a seed of their own and top-p alternating 1 and 0.9, so any batch of
/// two or more mixes greedy and sampled rows in one step, the first sampled row sits at a
/// nonzero batch index, and rows that took another row's parameters draw other tokens.
fn mixed_params(rows: usize, seed: u64) -> Vec<SamplingParams> {
    (0..rows)
        .map(|b| {
            if b % 2 == 0 {
                SamplingParams::greedy()
            } else {
                SamplingParams {
                    temperature: 0.7,
                    top_k: 0,
                    top_p: if b % 4 == 1 { 1.0 } else { 0.9 },
                    seed: seed.wrapping_add(b as u64),
                }
            }
        })
        .collect()
}

/// Runs the gate on the process arguments and environment; returns the exit status.
pub fn main() -> i32 {
    crate::output::gate_main::<Args>("decode-batch-gate", run_gate)
}

fn settings(args: &Args) -> Result<Settings, GateError> {
    let batches = args
        .batch
        .split(',')
        .map(|b| b.trim().parse::<usize>().ok().filter(|&b| b >= 1))
        .collect::<Option<Vec<usize>>>()
        .ok_or_else(|| {
            GateError::new(format!(
                "--batch {:?}: give a batch size >= 1 or a comma-separated list, e.g. 1,4,8",
                args.batch
            ))
        })?;
    if args.steps == 0 {
        return Err(GateError::new("--steps 0: give at least one decode step"));
    }
    if args.reps == 0 {
        return Err(GateError::new("--reps 0: give at least one repetition"));
    }
    if args.plen == 0 {
        return Err(GateError::new("--plen 0: prompts need at least one token"));
    }
    let split_mode = matches!(args.mode, Mode::Pp | Mode::Ppspec);
    if args.stages.is_some() && !split_mode {
        return Err(GateError::new(
            "--stages only applies to --mode pp and ppspec; for the other modes split the \
             model with MEMRA_PP_STAGES",
        ));
    }
    if args.ts.is_some() && args.mode != Mode::Ppspec {
        return Err(GateError::new(
            "--ts only applies to --mode ppspec (the verify widths T = K+1)",
        ));
    }
    let ts = crate::spec::parse_list("--ts", args.ts.as_deref().unwrap_or("2,5,9"), 2)?;
    if args.stages.is_some_and(|s| s < 2) {
        return Err(GateError::new(
            "--stages must be >= 2: a pipeline split needs at least two stages",
        ));
    }
    Ok(Settings {
        steps: args.steps,
        batches,
        mode: args.mode,
        stages: args.stages,
        reps: args.reps,
        plen: args.plen,
        ts,
    })
}

/// The whole gate: flags, doors and model are read here; errors before the first check are
/// setup errors (exit 2).
pub fn run_gate(args: &Args) -> Result<GateExit, GateError> {
    let s = settings(args)?;
    let doors = Doors::from_env().map_err(|e| GateError::new(format!("bad pins: {e}")))?;
    let model = crate::output::open_model(&args.model)?;
    let widest = if s.mode == Mode::Ppspec {
        s.ts.iter().copied().max().unwrap_or(1)
    } else {
        1
    };
    let need = s.plen
        + 4
        + match s.mode {
            Mode::Ppspec => 2 * s.steps,
            Mode::Config | Mode::Strict => gate1_steps(s.steps),
            Mode::Pp => s.steps,
        }
        + widest;
    if need > model.config.n_ctx {
        return Err(GateError::new(format!(
            "--plen {} and --steps {} need {need} positions but the model's context is {}; \
             lower them",
            s.plen, s.steps, model.config.n_ctx
        )));
    }
    let mut rep = Reporter::from_env("decode-batch-gate");
    match s.mode {
        Mode::Config | Mode::Strict => {
            let mut be = open_backend(model, &doors).map_err(|e| GateError::new(e.to_string()))?;
            rep.header(&be.doors_report(), &doors, &gate_extra(&s))?;
            batch_gates(&mut *be, &doors, &s, &mut rep)?;
        }
        Mode::Pp => pp_gate(model, &doors, &s, &mut rep)?,
        Mode::Ppspec => ppspec_gate(model, &doors, &s, &mut rep)?,
    }
    Ok(rep.finish())
}

fn gate_extra(s: &Settings) -> Vec<(&'static str, serde_json::Value)> {
    vec![
        (
            "mode",
            json!(match s.mode {
                Mode::Config => "config",
                Mode::Strict => "strict",
                Mode::Pp => "pp",
                Mode::Ppspec => "ppspec",
            }),
        ),
        (
            "batch",
            json!(
                s.batches
                    .iter()
                    .map(|b| b.to_string())
                    .collect::<Vec<_>>()
                    .join(",")
            ),
        ),
        ("steps", json!(s.steps)),
        // The base prompt length: a receipt shows how far past the attention chunks of 64
        // positions its prompts reached.
        ("plen", json!(s.plen)),
    ]
}

/// An engine error in the middle of an arm is a failed check, not a crash: the arm names it.
fn engine_fail(name: &str, what: &str, e: impl std::fmt::Display) -> Check {
    Check::new(
        name,
        Status::Fail,
        format!("{what}: the engine refused: {e}"),
    )
}

fn batch_gates(
    be: &mut dyn Backend,
    doors: &Doors,
    s: &Settings,
    rep: &mut Reporter,
) -> Result<(), GateError> {
    let n_vocab = be.config().n_vocab;
    let c = match gate1(be, doors, s) {
        Ok(c) => c,
        Err(e) => engine_fail("gate1", "single-sequence vs batched B=1", e),
    };
    rep.check(&c)?;
    for (i, &b) in s.batches.iter().enumerate() {
        let ps = prompts(n_vocab, b, s.plen, doors.gate_seed, 0);
        let name = format!("gate2[B={b}]");
        // Strict gate2 holds the batch to each sequence decoded alone through the
        // single-sequence path (`decode_step_h`), which under the equalized pins runs the
        // same composition; config gate2 to each alone through the batched path at B=1.
        let (alone, against) = if s.mode == Mode::Strict {
            (Tick::Single, "alone through the single-sequence path")
        } else {
            (
                Tick::Full(SamplingParams::greedy()),
                "alone through the batched path at B=1",
            )
        };
        match gate2(be, &ps, s.steps, alone) {
            Ok((ledger, trace)) => {
                rep.check(&ledger.check(
                    &name,
                    &format!("B={b} rows vs the same sequences {against}"),
                ))?;
                dump(rep, i, b, &trace, n_vocab)?;
            }
            Err(e) => rep.check(&engine_fail(&name, "batched decode", e))?,
        }
        if b >= 2 {
            let name = format!("gate2[B={b},1,{b}]");
            let c = if s.steps < 3 {
                Check::new(
                    &name,
                    Status::Warn,
                    format!(
                        "--steps {} leaves no room for three phases of batch width (B={b}, \
                         1, B={b}); nothing held: give --steps 3 or more",
                        s.steps
                    ),
                )
            } else {
                match gate2_widths(be, &ps, s.steps, alone) {
                    Ok((ledger, phases)) => ledger.check(
                        &name,
                        &format!(
                            "a stream whose batch width changes ({phases}) vs each sequence \
                             {against}"
                        ),
                    ),
                    Err(e) => engine_fail(&name, "batched decode", e),
                }
            };
            rep.check(&c)?;
        }
        let name = format!("gate3[B={b}]");
        let c = match gate3(be, &ps, s.steps, doors.gate_seed) {
            Ok(c) => c.named(&name),
            Err(e) => engine_fail(&name, "sampling", e),
        };
        rep.check(&c)?;
    }
    Ok(())
}

/// Writes a trace as `step.<s>` tensors: `logits.safetensors` for the first batch size,
/// `logits.b<B>.safetensors` for the others.
fn dump(rep: &Reporter, i: usize, b: usize, t: &Trace, n_vocab: usize) -> Result<(), GateError> {
    if !rep.wants_artifacts() {
        return Ok(());
    }
    let file = if i == 0 {
        "logits.safetensors".to_string()
    } else {
        format!("logits.b{b}.safetensors")
    };
    let tensors: Vec<(String, [usize; 2], &[f32])> = t
        .logits
        .iter()
        .enumerate()
        .map(|(s, l)| (format!("step.{s}"), [b, n_vocab], l.as_slice()))
        .collect();
    rep.artifact(&file, &tensors)
}

/// gate1: the single-sequence path against the batched path at B=1 on six prompt draws.
fn gate1(
    be: &mut dyn Backend,
    doors: &Doors,
    s: &Settings,
) -> Result<Check, memra_engine::backend::EngineError> {
    let n_vocab = be.config().n_vocab;
    let draws = prompts(n_vocab, GATE1_DRAWS, s.plen, doors.gate_seed, 1000);
    let steps = gate1_steps(s.steps);
    let mut ledger = Ledger::default();
    let mut firsts = Vec::new();
    for (d, prompt) in draws.iter().enumerate() {
        let p = std::slice::from_ref(prompt);
        let single = run(be, p, 100, steps, Tick::Single)?;
        let batched = run(be, p, 100, steps, Tick::Full(SamplingParams::greedy()))?;
        if s.mode == Mode::Strict {
            for (step, (a, b)) in batched.logits.iter().zip(&single.logits).enumerate() {
                let mut l = Ledger::default();
                l.logits(Some(step), a, b, n_vocab);
                if let Some(m) = &mut l.first {
                    m.row = d;
                }
                ledger.absorb(&l);
            }
        }
        let first = single
            .tokens
            .iter()
            .zip(&batched.tokens)
            .position(|(a, b)| a != b);
        firsts.push(first);
    }
    let div = firsts
        .iter()
        .map(|f| f.map_or("-".to_string(), |s| s.to_string()))
        .collect::<Vec<_>>()
        .join(",");
    let (early, fail) = config_verdict(&firsts);
    let mut c = if s.mode == Mode::Strict {
        ledger
            .check("gate1", "single-sequence vs batched B=1 (strict)")
            .metric("divergence_steps", div)
    } else {
        Check::new(
            "gate1",
            if fail { Status::Fail } else { Status::Pass },
            format!(
                "argmax agreement single-sequence vs batched B=1 (config): {early} of {GATE1_DRAWS} \
                 draws diverge before step {GATE1_EARLY_STEP} (fails at {GATE1_FAIL_DRAWS}); \
                 first divergence step per draw: {div}"
            ),
        )
        .metric("draws", GATE1_DRAWS)
        .metric("early_divergences", early)
        .metric("divergence_steps", div)
    };
    // Under the B=1 shortcut the batched side at B=1 takes the single path too: gate1 then
    // compares that path with itself and can see nothing, which a pass would hide.
    if be.doors_report().b1fast && c.status != Status::Fail {
        c.status = Status::Warn;
        c.message = format!(
            "MEMRA_SERVE_B1FAST=1 sends the batched side at B=1 to the single-sequence path, so \
             gate1 compares that path with itself and holds nothing (gate2 at B >= 2 holds the \
             shortcut): {}",
            c.message
        );
    }
    Ok(c.metric("steps", steps))
}

/// Steps of every gate1 draw: `--steps`, and at least [`GATE1_EARLY_STEP`] so the early
/// divergences the config rule counts can happen at all (a one-step draw sees only the
/// first token, which a single wrong token often leaves unchanged).
fn gate1_steps(steps: usize) -> usize {
    steps.max(GATE1_EARLY_STEP)
}

/// gate1's config rule over the first divergence step of each draw: how many diverge before
/// step 3, and whether that is enough to fail (4 of 6). A plumbing bug diverges early on every
/// draw; the drift between the two compositions diverges late or never.
fn config_verdict(firsts: &[Option<usize>]) -> (usize, bool) {
    let early = firsts
        .iter()
        .filter(|f| f.is_some_and(|s| s < GATE1_EARLY_STEP))
        .count();
    (early, early >= GATE1_FAIL_DRAWS)
}

/// gate2: every row of a B-row batch against the same sequence alone, each step of it
/// computed by `alone` (the batched program at B=1, or the single-sequence path), bit for
/// bit at every step.
fn gate2(
    be: &mut dyn Backend,
    ps: &[Vec<u32>],
    steps: usize,
    alone: Tick,
) -> Result<(Ledger, Trace), memra_engine::backend::EngineError> {
    let greedy = Tick::Full(SamplingParams::greedy());
    let batched = run(be, ps, 0, steps, greedy)?;
    let alone = run_alone(be, ps, 0, steps, alone)?;
    let n_vocab = be.config().n_vocab;
    let mut ledger = Ledger::default();
    for (step, (a, b)) in alone.logits.iter().zip(&batched.logits).enumerate() {
        ledger.logits(Some(step), a, b, n_vocab);
    }
    Ok((ledger, batched))
}

/// gate2 across a change of batch width in the middle of the streams: row 0 decoded at
/// B=N, then alone in the batch (B=1) while the other rows wait, then at B=N again; every
/// row's steps against the same sequence alone for as many steps, each computed by `alone`.
/// Needs `steps >= 3` (a phase of at least one step each). Returns the ledger and the phases
/// in words.
fn gate2_widths(
    be: &mut dyn Backend,
    ps: &[Vec<u32>],
    steps: usize,
    alone: Tick,
) -> Result<(Ledger, String), memra_engine::backend::EngineError> {
    let b = ps.len();
    let third = steps / 3;
    let all: Vec<usize> = (0..b).collect();
    let phases = [
        (all.clone(), third),
        (vec![0], third),
        (all, steps - 2 * third),
    ];
    let rows = run_phases(be, ps, 0, &phases)?;
    let n_vocab = be.config().n_vocab;
    let mut ledger = Ledger::default();
    for (r, got) in rows.iter().enumerate() {
        let want = run(
            be,
            std::slice::from_ref(&ps[r]),
            r as u32,
            got.logits.len(),
            alone,
        )?;
        for (step, (w, g)) in want.logits.iter().zip(&got.logits).enumerate() {
            let mut l = Ledger::default();
            l.logits(Some(step), w, g, n_vocab);
            if let Some(m) = &mut l.first {
                m.row = r;
            }
            ledger.absorb(&l);
        }
    }
    let steps_word = |n: usize| format!("{n} step{}", if n == 1 { "" } else { "s" });
    let words = format!(
        "{} at B={b}, {} with row 0 alone at B=1, {} at B={b}",
        steps_word(phases[0].1),
        steps_word(phases[1].1),
        steps_word(phases[2].1)
    );
    Ok((ledger, words))
}

/// The parts of gate3, each with its own ledger.
struct Gate3 {
    parts: Vec<(&'static str, Ledger)>,
}

impl Gate3 {
    fn named(self, name: &str) -> Check {
        let mut all = Ledger::default();
        let mut bad = Vec::new();
        for (what, l) in &self.parts {
            if !l.clean() {
                bad.push(format!("{what} ({} of {} rows)", l.rows_mismatched, l.rows));
                if all.first.is_none() {
                    all.first = l.first;
                }
            }
            all.absorb(l);
        }
        let mut c = all.check(name, "sampling");
        c.message = if bad.is_empty() {
            format!(
                "{} agree",
                self.parts
                    .iter()
                    .map(|(w, _)| *w)
                    .collect::<Vec<_>>()
                    .join("; ")
            )
        } else {
            format!("differ: {}", bad.join("; "))
        };
        c
    }
}

/// gate3: device greedy == host argmax of the same row; a lean tick gives the full tick's
/// tokens and parks its logits bit for bit; sampled streams at B=N equal those at B=1; and a
/// batch mixing greedy and sampled rows ([`gate3_mixed`]) gives each row what it gets alone.
fn gate3(
    be: &mut dyn Backend,
    ps: &[Vec<u32>],
    steps: usize,
    seed: u64,
) -> Result<Gate3, memra_engine::backend::EngineError> {
    let n_vocab = be.config().n_vocab;
    let p = sampled(seed);
    let full = run(be, ps, 0, steps, Tick::Full(p))?;
    let lean = run(be, ps, 0, steps, Tick::Lean(p))?;
    let alone = run_alone(be, ps, 0, steps, Tick::Lean(p))?;
    let greedy = run(be, ps, 0, steps, Tick::Lean(SamplingParams::greedy()))?;

    let mut argmax = Ledger::default();
    for (step, (logits, toks)) in greedy.logits.iter().zip(&greedy.tokens).enumerate() {
        let host: Vec<u32> = logits.chunks_exact(n_vocab).map(host_argmax).collect();
        argmax.tokens(Some(step), &host, toks);
    }
    let mut lean_tokens = Ledger::default();
    let mut parked = Ledger::default();
    let mut streams = Ledger::default();
    for step in 0..steps {
        lean_tokens.tokens(Some(step), &full.tokens[step], &lean.tokens[step]);
        parked.logits(Some(step), &full.logits[step], &lean.logits[step], n_vocab);
        streams.tokens(Some(step), &alone.tokens[step], &lean.tokens[step]);
    }
    let mut parts = vec![
        ("device greedy == host argmax", argmax),
        ("lean tick tokens == full tick tokens", lean_tokens),
        ("parked logits == full tick logits", parked),
        ("sampled streams B=N == B=1", streams),
    ];
    parts.extend(gate3_mixed(be, ps, steps, seed)?);
    Ok(Gate3 { parts })
}

/// gate3's mixed batch: the rows under [`mixed_params`] decode together through lean ticks
/// with per-row parameters, and again each alone at B=1 under its own parameters. Each row
/// must give the tokens and parked logits it gives alone (a wrong counter or a row that
/// took another row's parameters fails this), and the greedy rows' tokens must be the host
/// argmax of their parked logits.
fn gate3_mixed(
    be: &mut dyn Backend,
    ps: &[Vec<u32>],
    steps: usize,
    seed: u64,
) -> Result<[(&'static str, Ledger); 2], memra_engine::backend::EngineError> {
    let n_vocab = be.config().n_vocab;
    let params = mixed_params(ps.len(), seed);
    let together = run_rows(be, ps, 0, steps, &params)?;
    let alone = run_rows_alone(be, ps, 0, steps, &params)?;
    let mut rows = Ledger::default();
    let mut greedy = Ledger::default();
    for step in 0..steps {
        rows.tokens(Some(step), &alone.tokens[step], &together.tokens[step]);
        rows.logits(
            Some(step),
            &alone.logits[step],
            &together.logits[step],
            n_vocab,
        );
        let logits = together.logits[step].chunks_exact(n_vocab);
        for (b, (row, p)) in logits.zip(&params).enumerate() {
            if p.temperature == 0.0 {
                greedy.token(Some(step), b, host_argmax(row), together.tokens[step][b]);
            }
        }
    }
    Ok([
        ("mixed greedy/sampled rows == each row alone", rows),
        ("mixed batch greedy rows == host argmax", greedy),
    ])
}

/// The doors of the split candidate and of the unsplit reference in pp mode.
fn pp_doors(doors: &Doors, s: &Settings) -> Result<(Doors, Doors), GateError> {
    let n = match (s.stages, doors.pp_stages) {
        (Some(n), 1) => n,
        (Some(n), m) if n == m => n,
        (Some(n), m) => {
            return Err(GateError::new(format!(
                "--stages {n} disagrees with MEMRA_PP_STAGES={m}; give one of them"
            )));
        }
        (None, 1) => 2,
        (None, m) => m,
    };
    let devices = if doors.pp_devices.len() == n {
        doors.pp_devices.clone()
    } else {
        vec![doors.pp_devices.first().copied().unwrap_or(0); n]
    };
    let splits = match &doors.pp_splits {
        PpSplits::Cuts(c) if c.len() + 1 == n => doors.pp_splits.clone(),
        _ => PpSplits::Even,
    };
    let split = Doors {
        pp_stages: n,
        pp_devices: devices.clone(),
        pp_splits: splits,
        // The localizer walks the unsplit body over this placement: the gate grants itself
        // the permission on its own candidate only.
        pp_allow_unsplit_batch: true,
        ..doors.clone()
    };
    // The reference is clean: every planted fault lives in the candidate.
    let reference = Doors {
        pp_stages: 1,
        pp_devices: vec![devices[0]],
        pp_splits: PpSplits::Even,
        pp_allow_unsplit_batch: false,
        gate_canary: false,
        gate_defect: None,
        ..doors.clone()
    };
    Ok((split, reference))
}

fn pp_gate(
    model: LlamaModel,
    doors: &Doors,
    s: &Settings,
    rep: &mut Reporter,
) -> Result<(), GateError> {
    let (split_doors, ref_doors) = pp_doors(doors, s)?;
    let n_vocab = model.config.n_vocab;
    let open = |m, d: &Doors| open_backend(m, d).map_err(|e| GateError::new(e.to_string()));
    let mut reference = open(model.clone(), &ref_doors)?;
    let mut split = open(model, &split_doors)?;
    let mut extra = gate_extra(s);
    extra.push(("reps", json!(s.reps)));
    extra.push((
        "reference_pp_stages",
        json!(reference.doors_report().pp_stages),
    ));
    rep.header(&split.doors_report(), &split_doors, &extra)?;

    let greedy = Tick::Full(SamplingParams::greedy());
    let p = sampled(doors.gate_seed);
    let mut split_l = Ledger::default();
    let mut local_l = Ledger::default();
    let mut epi_l = Ledger::default();
    let mut errors: [Vec<String>; 3] = Default::default();
    // Reps whose split walk differed: a race fails some reps and not others.
    let mut reps_failed = 0usize;
    for (i, &b) in s.batches.iter().enumerate() {
        let ps = prompts(n_vocab, b, s.plen, doors.gate_seed, 0);
        let refs = (|| {
            Ok::<_, memra_engine::backend::EngineError>((
                run(&mut *reference, &ps, 0, s.steps, greedy)?,
                run(&mut *reference, &ps, 0, s.steps, Tick::Full(p))?,
            ))
        })();
        let (ref_greedy, ref_sampled) = refs.map_err(|e| {
            GateError::new(format!("the unsplit reference could not run at B={b}: {e}"))
        })?;
        // Every split arm is fed the reference's tokens (upstream's replay): after a first
        // mismatch its counts still compare the same text, so "N of M rows differ" measures
        // the split and not a stream that wandered off.
        for r in 0..s.reps {
            match run_fed(
                &mut *split,
                &ps,
                0,
                &ref_greedy.inputs,
                greedy,
                Prime::Prefill,
            ) {
                Ok(t) => {
                    let mut one = Ledger::default();
                    compare(&mut one, &ref_greedy, &t, n_vocab, false);
                    reps_failed += usize::from(!one.clean());
                    split_l.absorb(&one);
                    if r == 0 {
                        dump(rep, i, b, &t, n_vocab)?;
                    }
                }
                Err(e) => errors[0].push(format!("B={b} rep {r}: {e}")),
            }
        }
        // The localizer primes its caches through its own walk, and so does its reference,
        // so a broken split walk cannot reach it through the prompt. The reference walks the
        // unsplit body too (on an unsplit model it equals the batched step bit for bit): the
        // priming steps are all B=1, and through `decode_step_batch` they would take the
        // single-sequence route MEMRA_SERVE_B1FAST gives it, which the candidate's unsplit
        // walk never takes.
        let local = run_primed(
            &mut *reference,
            &ps,
            0,
            s.steps,
            Tick::Unsplit,
            Prime::Steps,
        )
        .and_then(|r| {
            let t = run_fed(&mut *split, &ps, 0, &r.inputs, Tick::Unsplit, Prime::Steps)?;
            Ok((r, t))
        });
        match local {
            Ok((r, t)) => compare(&mut local_l, &r, &t, n_vocab, false),
            Err(e) => errors[1].push(format!("B={b}: {e}")),
        }
        let lean = (|| {
            let fed = |be: &mut dyn Backend, reference: &Trace, tick| {
                run_fed(be, &ps, 0, &reference.inputs, tick, Prime::Prefill)
            };
            Ok::<_, memra_engine::backend::EngineError>((
                fed(
                    &mut *split,
                    &ref_greedy,
                    Tick::Lean(SamplingParams::greedy()),
                )?,
                fed(&mut *split, &ref_sampled, Tick::Lean(p))?,
            ))
        })();
        match lean {
            Ok((g, smp)) => {
                compare(&mut epi_l, &ref_greedy, &g, n_vocab, true);
                compare(&mut epi_l, &ref_sampled, &smp, n_vocab, true);
            }
            Err(e) => errors[2].push(format!("B={b}: {e}")),
        }
    }
    let split_ok = split_l.clean() && errors[0].is_empty();
    let local_ok = local_l.clean() && errors[1].is_empty();
    let diagnosis = localized(split_ok, local_ok, errors[1].is_empty(), "the stage split");
    let arms = [
        (
            "pp.split",
            split_l,
            format!(
                "split walk vs unsplit reference, fed the reference's tokens: {reps_failed} of \
                 {} runs ({} reps per batch size) differ{diagnosis}",
                s.reps * s.batches.len(),
                s.reps
            ),
        ),
        (
            "pp.localizer",
            local_l,
            "unsplit body walked over the split placement vs unsplit reference, fed the \
             reference's tokens"
                .to_string(),
        ),
        (
            "pp.epilogue",
            epi_l,
            "last-stage sampling (greedy and T=0.7 tokens) and lean park vs reference, fed the \
             reference's tokens"
                .to_string(),
        ),
    ];
    for ((name, ledger, what), errs) in arms.into_iter().zip(errors) {
        let mut c = ledger.check(name, &what);
        if name == "pp.split" {
            c = c.metric("reps_failed", reps_failed);
        }
        if !errs.is_empty() {
            c.status = Status::Fail;
            c.message = format!("{what}: the engine refused: {}", errs.join("; "));
        }
        rep.check(&c)?;
    }
    Ok(())
}

/// `--mode ppspec`: speculative decoding with drafts filled to K = T-1 on the split
/// candidate against the unsplit reference, every verify column of every round bit for bit
/// and every round's inputs (the drafter is re-seeded from the accepted tokens, so the
/// inputs are the state it carries from round to round), acceptances and cache lengths after
/// the rewind equal. The split arm
/// runs `--reps` times; the localizer runs the candidate's verify through its unsplit body.
///
/// Unlike `--mode pp`, the reference keeps the candidate's planted defects and canary: on
/// one stage the stage defects are no-ops, so the comparison sees the split alone and a
/// defect of the verify or the rewind (spec-gate's) cannot fail it.
fn ppspec_gate(
    model: LlamaModel,
    doors: &Doors,
    s: &Settings,
    rep: &mut Reporter,
) -> Result<(), GateError> {
    use crate::spec::speculative;
    use memra_engine::spec::{Drafting, Round};
    let (split_doors, _) = pp_doors(doors, s)?;
    let ref_doors = Doors {
        pp_stages: 1,
        pp_devices: vec![split_doors.pp_devices[0]],
        pp_splits: PpSplits::Even,
        pp_allow_unsplit_batch: false,
        ..doors.clone()
    };
    let n_vocab = model.config.n_vocab;
    let open = |m, d: &Doors| open_backend(m, d).map_err(|e| GateError::new(e.to_string()));
    let mut reference = open(model.clone(), &ref_doors)?;
    let mut split = open(model, &split_doors)?;
    let mut extra = gate_extra(s);
    extra.push(("reps", json!(s.reps)));
    extra.push(("spec_ts", json!(crate::spec::join(&s.ts))));
    extra.push(("spec_drafter", json!("prompt-lookup, filled to K")));
    extra.push((
        "reference_pp_stages",
        json!(reference.doors_report().pp_stages),
    ));
    rep.header(&split.doors_report(), &split_doors, &extra)?;

    let compare_rounds = |l: &mut Ledger, want: &[Round], got: &[Round]| {
        if want.len() != got.len() {
            l.tokens(None, &[want.len() as u32], &[got.len() as u32]);
        }
        for (r, (w, g)) in want.iter().zip(got).enumerate() {
            l.logits(Some(r), &w.logits, &g.logits, n_vocab);
            let flat = |x: &Round| -> Vec<u32> {
                x.inputs
                    .iter()
                    .flatten()
                    .copied()
                    .chain(x.accepted.iter().map(|&m| m as u32))
                    .chain(x.kept.iter().map(|&n| n as u32))
                    .collect()
            };
            l.tokens(Some(r), &flat(w), &flat(g));
        }
    };
    let mut split_l = Ledger::default();
    let mut local_l = Ledger::default();
    let mut errors: [Vec<String>; 2] = Default::default();
    let mut reps_failed = 0usize;
    let mut rounds = 0usize;
    for &b in &s.batches {
        let ps = prompts(n_vocab, b, s.plen, doors.gate_seed, 0);
        for &t in &s.ts {
            let k = t - 1;
            let (_, _, want) =
                speculative(&mut *reference, &ps, s.steps, k, Drafting::Fixed, false).map_err(
                    |e| {
                        GateError::new(format!(
                            "the unsplit reference could not run at B={b}, T={t}: {e}"
                        ))
                    },
                )?;
            rounds += want.len();
            for r in 0..s.reps {
                match speculative(&mut *split, &ps, s.steps, k, Drafting::Fixed, false) {
                    Ok((_, _, got)) => {
                        let mut one = Ledger::default();
                        compare_rounds(&mut one, &want, &got);
                        reps_failed += usize::from(!one.clean());
                        split_l.absorb(&one);
                    }
                    Err(e) => errors[0].push(format!("B={b} T={t} rep {r}: {e}")),
                }
            }
            // The localizer primes through its own walk too, and so does its reference, so a
            // broken split walk cannot reach it through the prompt.
            let local = speculative(&mut *split, &ps, s.steps, k, Drafting::Fixed, true).and_then(
                |(_, _, got)| {
                    let (_, _, want) =
                        speculative(&mut *reference, &ps, s.steps, k, Drafting::Fixed, true)?;
                    Ok((want, got))
                },
            );
            match local {
                Ok((want, got)) => compare_rounds(&mut local_l, &want, &got),
                Err(e) => errors[1].push(format!("B={b} T={t}: {e}")),
            }
        }
    }
    let split_ok = split_l.clean() && errors[0].is_empty();
    let local_ok = local_l.clean() && errors[1].is_empty();
    let diagnosis = localized(
        split_ok,
        local_ok,
        errors[1].is_empty(),
        "the stage split of the verify",
    );
    let ts = crate::spec::join(&s.ts);
    let runs = s.reps * s.batches.len() * s.ts.len();
    let arms = [
        (
            "ppspec.split",
            split_l,
            format!(
                "split verify vs unsplit reference, per column per round (T={ts}, {rounds} \
                 reference rounds): {reps_failed} of {runs} runs ({} reps) differ{diagnosis}",
                s.reps
            ),
        ),
        (
            "ppspec.localizer",
            local_l,
            format!("unsplit verify walked over the split placement vs unsplit reference (T={ts})"),
        ),
    ];
    for ((name, ledger, what), errs) in arms.into_iter().zip(errors) {
        let mut c = ledger.check(name, &what);
        if name == "ppspec.split" {
            c = c
                .metric("reps_failed", reps_failed)
                .metric("rounds", rounds);
        }
        if !errs.is_empty() {
            c.status = Status::Fail;
            c.message = format!("{what}: the engine refused: {}", errs.join("; "));
        }
        rep.check(&c)?;
    }
    Ok(())
}

/// What a split arm's message adds about the culprit, from the split arm and the localizer
/// (`local_ran`: the localizer ran without an engine error): nothing when the split passes;
/// `split` (the per-stage walk or its boundary copies) when only it fails; the stage-owned
/// placement when both fail.
fn localized(split_ok: bool, local_ok: bool, local_ran: bool, split: &str) -> String {
    match (split_ok, local_ok) {
        (true, _) => String::new(),
        (false, false) if !local_ran => {
            "; the localizer could not run, so the failure is not localized".into()
        }
        (false, true) => format!(
            "; the localizer passes, so {split} (the per-stage walk or its boundary copies) is \
             at fault"
        ),
        (false, false) => "; the localizer fails too, so the stage-owned placement (which \
                           layers, weights and caches each stage holds) is at fault"
            .into(),
    }
}

/// Adds one candidate trace to an arm's ledger: logits bit for bit, and with `tokens` the
/// chosen tokens too.
fn compare(l: &mut Ledger, reference: &Trace, got: &Trace, n_vocab: usize, tokens: bool) {
    for (step, (r, g)) in reference.logits.iter().zip(&got.logits).enumerate() {
        l.logits(Some(step), r, g, n_vocab);
        if tokens {
            l.tokens(Some(step), &reference.tokens[step], &got.tokens[step]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use memra_engine::backend::{EngineError, SeqId};

    fn args(extra: &[&str]) -> Result<Settings, GateError> {
        let mut argv = vec!["decode-batch-gate", "m.gguf"];
        argv.extend_from_slice(extra);
        settings(&Args::try_parse_from(argv).unwrap())
    }

    #[test]
    fn flags_are_validated_with_the_fix_named() {
        assert_eq!(args(&["--batch", "1,4,8"]).unwrap().batches, vec![1, 4, 8]);
        let e = args(&["--batch", "4,x"]).unwrap_err().to_string();
        assert!(e.contains("--batch \"4,x\""), "{e}");
        assert!(args(&["--batch", "0"]).is_err());
        assert!(args(&["--steps", "0"]).is_err());
        let e = args(&["--stages", "2"]).unwrap_err().to_string();
        assert!(e.contains("--mode pp"), "{e}");
        assert!(args(&["--mode", "pp", "--stages", "1"]).is_err());
        assert!(args(&["--mode", "pp", "--stages", "3"]).is_ok());
    }

    #[test]
    fn config_gate1_fails_on_four_early_divergences_only() {
        let late = [None, Some(3), Some(7), None, Some(5), None];
        assert_eq!(config_verdict(&late), (0, false));
        let three = [Some(0), Some(1), Some(2), Some(3), None, None];
        assert_eq!(config_verdict(&three), (3, false));
        let four = [Some(0), Some(1), Some(2), Some(2), None, Some(9)];
        assert_eq!(config_verdict(&four), (4, true));
    }

    fn tiny_cpu(defect: Option<memra_engine::doors::GateDefect>) -> Box<dyn Backend> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.gguf");
        memra_engine::synth::write_preset("tiny", "q4_1", 5, &path).unwrap();
        let doors = Doors {
            backend: memra_engine::doors::BackendChoice::Cpu,
            gate_defect: defect,
            ..Doors::default()
        };
        open_backend(LlamaModel::open(&path).unwrap(), &doors).unwrap()
    }

    /// A wrong-row parameters bug over a real backend: each row of a sampled batch gets the
    /// parameters of the next row.
    struct NextRowsParams(Box<dyn Backend>);

    impl Backend for NextRowsParams {
        fn config(&self) -> &memra_engine::model::LlamaConfig {
            self.0.config()
        }
        fn doors_report(&self) -> memra_engine::doors::DoorsReport {
            self.0.doors_report()
        }
        fn open_sequence(&mut self, seq: SeqId, capacity: usize) -> Result<(), EngineError> {
            self.0.open_sequence(seq, capacity)
        }
        fn close_sequence(&mut self, seq: SeqId) -> Result<(), EngineError> {
            self.0.close_sequence(seq)
        }
        fn sequences(&self) -> &memra_engine::backend::Sequences {
            self.0.sequences()
        }
        fn sequences_mut(
            &mut self,
            key: &memra_engine::backend::SeqsKey,
        ) -> &mut memra_engine::backend::Sequences {
            self.0.sequences_mut(key)
        }
        fn stage_plan(&self) -> &memra_engine::backend::stages::StagePlan {
            self.0.stage_plan()
        }
        fn doors(&self) -> &Doors {
            self.0.doors()
        }
        fn run_rows(
            &mut self,
            walk: memra_engine::backend::ClearedWalk,
            rows: &[memra_engine::backend::RowSpec],
            pass: memra_engine::backend::Pass,
            logits: std::ops::Range<usize>,
        ) -> Result<Vec<f32>, EngineError> {
            self.0.run_rows(walk, rows, pass, logits)
        }
        fn parked_logits(&self) -> Result<Vec<f32>, EngineError> {
            self.0.parked_logits()
        }
        fn decode_step_batch_sampled_rows(
            &mut self,
            seqs: &[SeqId],
            tokens: &[u32],
            params: &[SamplingParams],
        ) -> Result<Vec<u32>, EngineError> {
            let mut wrong = params.to_vec();
            wrong.rotate_left(1);
            self.0.decode_step_batch_sampled_rows(seqs, tokens, &wrong)
        }
    }

    fn mixed_verdicts(be: &mut dyn Backend) -> [bool; 2] {
        let ps = prompts(be.config().n_vocab, 4, 5, 3, 0);
        gate3_mixed(be, &ps, 6, 3).unwrap().map(|(_, l)| l.clean())
    }

    #[test]
    fn mixed_batches_alternate_greedy_and_sampled_rows() {
        let p = mixed_params(4, 10);
        let temps: Vec<f32> = p.iter().map(|p| p.temperature).collect();
        assert_eq!(temps, [0.0, 0.7, 0.0, 0.7]);
        assert_ne!(p[1], p[3], "sampled rows differ in seed and top-p");
    }

    #[test]
    fn the_mixed_batch_passes_clean_and_catches_wrong_row_params_and_counters() {
        assert_eq!(mixed_verdicts(&mut *tiny_cpu(None)), [true, true]);
        let [rows, _] = mixed_verdicts(&mut NextRowsParams(tiny_cpu(None)));
        assert!(!rows, "rows that take the next row's parameters must fail");
        let counter = Some(memra_engine::doors::GateDefect::SampleCounter);
        assert_eq!(
            mixed_verdicts(&mut *tiny_cpu(counter)),
            [false, true],
            "a wrong counter moves the sampled rows only; greedy needs no counter"
        );
    }

    #[test]
    fn pp_reference_is_clean_and_unsplit() {
        let doors = Doors {
            gate_canary: true,
            gate_defect: Some(memra_engine::doors::GateDefect::BoundaryCopy),
            ..Doors::default()
        };
        let s = args(&["--mode", "pp", "--stages", "3"]).unwrap();
        let (split, reference) = pp_doors(&doors, &s).unwrap();
        assert_eq!((split.pp_stages, split.pp_devices.len()), (3, 3));
        assert!(split.gate_canary && split.pp_allow_unsplit_batch);
        assert_eq!(reference.pp_stages, 1);
        assert!(!reference.gate_canary && reference.gate_defect.is_none());
        let staged = Doors {
            pp_stages: 2,
            pp_devices: vec![1, 0],
            ..Doors::default()
        };
        assert!(
            pp_doors(&staged, &s).is_err(),
            "--stages 3 vs MEMRA_PP_STAGES=2"
        );
    }
}
