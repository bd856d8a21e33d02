//! `reference-gate`: the engine (the backend `MEMRA_BACKEND` selects) against the host f32
//! oracle under one tolerance policy, on synthesized checkpoints read back through the full
//! loader and on a real model when given; plus the loader goldens.
//!
//! It owns the arms, the receipt TSV and the verdict. The oracle is `memra_engine::reference` —
//! for quantized arms on a backend that records its activation trace, the oracle following
//! that trace at q8_1 rounding ties, one run per program — the policy and ledgers
//! `crate::ledger`, the goldens file `crate::goldens`.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use clap::Parser;
use serde_json::json;
use sha2::{Digest, Sha256};

use crate::goldens::{self, Goldens};
use crate::ledger::{Policy, RowVerdict};
use memra_protocol::{Check, FirstMismatch, Status};

use crate::output::{GateError, GateExit, Reporter, say};
use crate::workload::prompts;
use memra_engine::backend::{Backend, EngineError, SeqId, open_backend};
use memra_engine::doors::Doors;
use memra_engine::model::LlamaModel;
use memra_engine::reference::{self as oracle, Activations, FollowReport};

/// Flags of `reference-gate`. Exit status: 0 pass, 1 a row or golden failed, 2 bad flags,
/// pins, model or unwritable receipt.
#[derive(Debug, Parser)]
#[command(
    name = "reference-gate",
    about = "The engine vs the host f32 oracle (max_abs <= 0.01 and max_rel <= 0.01 of \
             max(1,|ref|), equal argmax) on synthesized Q8_0/Q4_1/float checkpoints and an \
             optional real model, plus loader goldens. Exit 0 pass, 1 fail, 2 usage or setup \
             error."
)]
pub struct Args {
    /// Where to write the receipt TSV.
    pub receipt: PathBuf,
    /// A real GGUF checkpoint to check as well.
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// The banked loader goldens (relative to the working directory).
    #[arg(long, default_value = "engine/goldens/loader.tsv")]
    pub goldens: PathBuf,
    /// Mint the goldens file from this run instead of checking it.
    #[arg(long)]
    pub write_goldens: bool,
    /// Tokens of each arm's program (at least 15, at most the arm's context): the first N - 8
    /// prefilled (one-shot, and in chunks of 7), the last 8 decoded. Past 128 the chunked
    /// prefill's continuing chunks cross the split-K attention windows at 64 and 128.
    #[arg(long, default_value_t = PROGRAM_LEN, value_name = "N")]
    pub program_len: usize,
    /// Run the engine with the q8_0 KV cache. Without it the cache is pinned f32 whatever
    /// `MEMRA_KV_Q8` says: this gate holds the engine to an f32 oracle, and a lossy cache
    /// leaking in from the environment would fail every arm for a reason that is not a bug.
    #[arg(long)]
    pub kv_q8: bool,
}

/// Tokens of each arm's program by default, decode rows after the prefill of every
/// program, and the chunk size of the chunked prefill. A program of N tokens prefills its
/// first N - 8 and decodes the rest.
const PROGRAM_LEN: usize = 20;
const DECODE_ROWS: usize = 8;
const CHUNK: usize = 7;
/// The shortest program the chunked rows hold anything with: three chunks, so a later chunk
/// reads what a continuing chunk wrote (with two, nothing reads the second chunk's cache and
/// a cache written wrong by chunks passes).
const MIN_PROGRAM: usize = 2 * CHUNK + 1;

/// Seed of the synthesized checkpoints. Fixed (not `MEMRA_GATE_SEED`): the goldens are
/// digests of exactly these files.
const SYNTH_SEED: u64 = 7;

/// The synthesized arms: (arm, preset, weight type). A quantized arm comes first because
/// the header's doors row is the first arm's backend report, and the quantized matvec family
/// is the door worth recording (each check row names its own arm's family too).
/// Every weight type the engine loads has an arm: the three quantized ones against the
/// tie-following oracle, the three float ones (F16 and BF16 through their own matvec
/// kernels) against the plain oracle.
/// Three more arms carry the constants real checkpoints have and the tiny preset does not,
/// so a backend bug that only shows off the preset's values (a RoPE table built with the
/// default base, an epsilon read wrong, a head width or GQA ratio assumed) meets the
/// oracle, which computes RoPE, the norms and attention itself: RoPE bases 100000 (SmolLM2)
/// and 500000 (llama-3), rms epsilon 1e-6, head_dim 128, GQA ratios 4 and 1, and a
/// vocabulary that is not a power of two. `mha`'s context is exactly its program's length,
/// so its programs reach the last position the context holds.
const SYNTH_ARMS: [(&str, &str, &str); 9] = [
    ("q8_0", "tiny", "q8_0"),
    ("q4_1", "tiny", "q4_1"),
    ("q4_0", "tiny", "q4_0"),
    ("f16", "tiny", "f16"),
    ("bf16", "tiny", "bf16"),
    ("tiny", "tiny-untied", "f32"),
    (
        "rope1e5",
        "tiny:rope_base=1e5,rms_eps=1e-6,n_vocab=997",
        "q4_1",
    ),
    (
        "rope5e5-hd128-gqa4",
        "tiny:rope_base=5e5,head_dim=128,n_head=4,n_head_kv=1",
        "q8_0",
    ),
    ("mha", "tiny:n_head_kv=4,n_vocab=771,n_ctx=20", "f16"),
];

/// Runs the gate on the process arguments and environment; returns the exit status.
pub fn main() -> i32 {
    crate::output::gate_main::<Args>("reference-gate", run_gate)
}

/// How an arm's rows against the oracle are judged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Class {
    /// Float weights, or quantized weights against the oracle following the backend's
    /// activation trace at rounding ties (`oracle::forward_following`): a row outside the
    /// policy fails.
    Oracle,
    /// Quantized weights on a backend that cannot record an activation trace, against the
    /// oracle's own q8_1 mode: a row outside the policy is a warning, because one q8_1
    /// rounding flip (an activation a few ulps from a rounding tie landing on the other side
    /// in f32 than in the oracle's f64) moves logits by far more than 0.01, while rows
    /// without a flip agree closely (the figures are in docs/numerics.md, "The oracle and
    /// q8_1 rounding ties"). A row still fails when it is not finite or when
    /// its relative RMS error exceeds [`Q8_REL_RMS_FAIL`]: flips move a small part of a row,
    /// a wrong kernel or token moves most of it.
    Q8Flips,
    /// The engine against itself through the same composition: a row passes only when
    /// every value has the same bits (the policy's figures are still reported).
    Bitwise,
}

/// Whether two rows hold the same bits.
fn bit_identical(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
}

/// Relative RMS error (`‖got − ref‖₂ / ‖ref‖₂`) above which a quantized row fails even
/// though q8_1 flips excuse its max_abs. Measured on the CPU backend: flips reach 0.083 on
/// the synthesized Q8_0/Q4_1 arms (seeds 0-3) and 0.26 on SmolLM2-135M Q4_1 (seeds 0-2 and
/// the equalized pins); one wrong prompt token (the canary) gives 0.82-0.92 on the
/// synthesized arms and 0.65 on the row it enters in SmolLM2.
pub const Q8_REL_RMS_FAIL: f64 = 0.5;

/// One compared row of the receipt.
struct Row {
    arm: String,
    kind: &'static str,
    row: usize,
    v: RowVerdict,
    verdict: Status,
}

/// The receipt TSV being built.
struct Receipt {
    text: String,
    failures: usize,
}

impl Receipt {
    fn row(&mut self, r: &Row) {
        let _ = writeln!(
            self.text,
            "{}\t{}\t{}\t{:.3e}\t{:.3e}\t{:.3e}\t{}\t{}\t{}",
            r.arm,
            r.kind,
            r.row,
            r.v.max_abs,
            r.v.max_rel,
            r.v.rel_rms,
            r.v.argmax_ref,
            r.v.argmax_got,
            match r.verdict {
                Status::Fail => "FAIL",
                other => other.as_str(),
            }
        );
        if r.verdict == Status::Fail {
            self.failures += 1;
        }
    }
}

/// The whole gate; errors before the verdict are setup errors (exit 2).
pub fn run_gate(args: &Args) -> Result<GateExit, GateError> {
    if args.program_len < MIN_PROGRAM {
        return Err(GateError::new(format!(
            "--program-len {}: give at least {MIN_PROGRAM} (three prefill chunks of {CHUNK}, \
             so a later chunk reads what a continuing one wrote; the last {DECODE_ROWS} tokens \
             are decoded), e.g. --program-len 140",
            args.program_len
        )));
    }
    let env_doors = Doors::from_env().map_err(|e| GateError::new(format!("bad pins: {e}")))?;
    let env_kv_q8 = env_doors.kv_q8;
    let (doors, instrument) = pin_instrument(env_doors, args.kv_q8);
    let real = args
        .model
        .as_ref()
        .map(|p| {
            LlamaModel::open(p).map_err(|e| {
                GateError::new(format!(
                    "cannot load --model {}: {e}; pass a llama GGUF checkpoint",
                    p.display()
                ))
            })
        })
        .transpose()?;
    let dir = tempfile::tempdir().map_err(|e| {
        GateError::new(format!("cannot create a temporary folder: {e}; set TMPDIR"))
    })?;
    let mut arms: Vec<(String, LlamaModel)> = Vec::new();
    let mut current = Goldens::new();
    for (arm, preset, quant) in SYNTH_ARMS {
        let path = dir.path().join(format!("{arm}.gguf"));
        memra_engine::synth::write_preset(preset, quant, SYNTH_SEED, &path)
            .map_err(|e| GateError::new(format!("cannot synthesize the {arm} arm: {e}")))?;
        let model = LlamaModel::open(&path).map_err(|e| {
            GateError::new(format!(
                "the synthesized {arm} checkpoint does not load back: {e}"
            ))
        })?;
        current.extend(goldens::digest_model(arm, &model));
        arms.push((arm.to_string(), model));
    }
    if let Some(m) = real {
        if m.config.n_ctx < MIN_PROGRAM {
            return Err(GateError::new(format!(
                "--model's context is {} positions; the programs need at least {MIN_PROGRAM} \
                 (three prefill chunks of {CHUNK}): pass a model with a longer context",
                m.config.n_ctx
            )));
        }
        arms.push(("model".to_string(), m));
    }

    let mut rep = Reporter::from_env("reference-gate");
    let mut receipt = Receipt {
        text: String::new(),
        failures: 0,
    };
    let policy = Policy::REFERENCE;
    let arm_names = arms
        .iter()
        .map(|(a, _)| a.as_str())
        .collect::<Vec<_>>()
        .join(",");
    for (i, (arm, model)) in arms.into_iter().enumerate() {
        let quantized = model.has_quantized();
        let mode = if quantized {
            Activations::Q8_1
        } else {
            Activations::F32
        };
        let len = args.program_len.min(model.config.n_ctx);
        let tokens = prompts(model.config.n_vocab, 1, len, doors.gate_seed, 2000).remove(0);
        // The oracle keeps its own copy: a backend that traces its q8_1 activations gets
        // the tie-following oracle per program, run after the backend took the weights.
        let oracle_model = model.clone();
        let mut be = open_backend(model, &doors).map_err(|e| GateError::new(e.to_string()))?;
        let follow = quantized && be.start_trace();
        let want = if follow {
            Vec::new()
        } else {
            oracle::forward_with(&oracle_model, &tokens, mode)
                .map_err(|e| GateError::new(format!("the oracle refused the {arm} arm: {e}")))?
        };
        if i == 0 {
            rep.header(
                &be.doors_report(),
                &doors,
                &[
                    (
                        "policy",
                        json!("max_abs<=0.01&max_rel<=0.01 of max(1,|ref|), equal argmax"),
                    ),
                    ("instrument", json!(instrument)),
                ],
            )?;
            receipt.text =
                receipt_header(&be.doors_report().to_json(), &arm_names, args.program_len);
            if env_kv_q8 && !args.kv_q8 {
                say!("reference-gate: {instrument}");
            }
        }
        let check = match check_arm(
            &mut *be,
            &ArmInput {
                name: arm.clone(),
                tokens,
                want,
                quantized,
                follow: follow.then_some(&oracle_model),
            },
            policy,
            &mut receipt,
            &rep,
        ) {
            Ok(c) => c,
            Err(e) => {
                receipt.failures += 1;
                let _ = writeln!(receipt.text, "# error\tarm={arm}\t{e}");
                Check::new(
                    format!("reference.{arm}"),
                    Status::Fail,
                    format!("the engine refused: {e}"),
                )
            }
        };
        rep.check(&check.metric("matvec", be.doors_report().matvec))?;
    }

    let check = golden_check(args, &current)?;
    if check.status == Status::Fail {
        receipt.failures += 1;
    }
    let _ = writeln!(
        receipt.text,
        "# summary\tarm=loader-goldens\tstatus={}\t{}",
        check.status.as_str(),
        check.message
    );
    rep.check(&check)?;
    let _ = writeln!(receipt.text, "# verdict\tfailures={}", receipt.failures);
    std::fs::write(&args.receipt, &receipt.text).map_err(|e| {
        GateError::new(format!(
            "{}: cannot write the receipt: {e}; pass a writable RECEIPT.tsv path",
            args.receipt.display()
        ))
    })?;
    say!("receipt: {}", args.receipt.display());
    Ok(rep.finish())
}

/// The doors the gate runs under: the environment's, with every lossy door that would make
/// a same-configuration parity gate fail for a reason that is not a bug set to the
/// exactness instrument's setting (today the q8_0 KV cache, kept only when `kv_q8` asks
/// for it). Returns them with the doors row's `instrument` text: what was pinned and why.
fn pin_instrument(env: Doors, kv_q8: bool) -> (Doors, String) {
    let text = match (env.kv_q8, kv_q8) {
        (_, true) => "kv=q8_0 (asked for with --kv-q8)".to_string(),
        (true, false) => "kv pinned f32 (MEMRA_KV_Q8=1 in the environment set aside; \
                          --kv-q8 gates the q8_0 cache)"
            .to_string(),
        (false, false) => "kv pinned f32".to_string(),
    };
    (Doors { kv_q8, ..env }, text)
}

/// sha256 of this gate's own binary (`unknown(…)` when it cannot be read).
fn binary_sha256() -> String {
    std::env::current_exe()
        .and_then(std::fs::read)
        .map(|b| goldens::hex(&Sha256::digest(&b)))
        .unwrap_or_else(|e| format!("unknown({e})"))
}

fn receipt_header(doors: &serde_json::Value, arms: &str, program_len: usize) -> String {
    let sha = binary_sha256();
    format!(
        "# reference-gate\tbinary_sha256={sha}\tdoors={doors}\tpolicy=max_abs<=0.01&max_rel<=0.01,argmax\tarms={arms}\tprogram_len={program_len}\tchunk={CHUNK}\n\
         arm\tkind\trow\tmax_abs\tmax_rel\trel_rms\targmax_ref\targmax_got\tverdict\n"
    )
}

/// What one arm compares: its program and the oracle's rows for it — computed once
/// (`want`), or per program by the oracle following that program's trace (`follow`: the
/// model, when the backend records traces; `want` is then empty).
struct ArmInput<'a> {
    name: String,
    tokens: Vec<u32>,
    want: Vec<f32>,
    quantized: bool,
    follow: Option<&'a LlamaModel>,
}

/// The tie-following oracle's rows for the program `be` just ran on `seq`, with what
/// following found; `fallback` (the oracle run once) when the arm does not follow.
fn program_oracle(
    be: &mut dyn Backend,
    input: &ArmInput,
    seq: SeqId,
    program: &'static str,
    follows: &mut Vec<(&'static str, FollowReport)>,
) -> Result<Vec<f32>, EngineError> {
    let Some(model) = input.follow else {
        return Ok(input.want.clone());
    };
    let trace = be.take_trace().ok_or_else(|| {
        EngineError::Unavailable("the backend stopped recording its activation trace".into())
    })?;
    let f = oracle::forward_following(model, &input.tokens, &trace, seq)
        .map_err(|e| EngineError::Model(format!("the following oracle refused: {e}")))?;
    follows.push((program, f.report));
    Ok(f.logits)
}

/// One arm: prefill rows, decode-after-prefill rows (single-sequence and batched paths)
/// against the oracle, and chunked prefill against one-shot prefill.
// Over 150 lines: the arm's rows in the order its receipt lists them (prefill, decode after
// prefill on the single and batched paths, chunked against one-shot prefill), all over one
// backend and one oracle.
fn check_arm(
    be: &mut dyn Backend,
    input: &ArmInput,
    policy: Policy,
    receipt: &mut Receipt,
    rep: &Reporter,
) -> Result<Check, EngineError> {
    let (arm, tokens, quantized) = (
        input.name.as_str(),
        input.tokens.as_slice(),
        input.quantized,
    );
    let v = be.config().n_vocab;
    let prefill_len = tokens.len().saturating_sub(DECODE_ROWS).max(1);
    // What the arm ran, so the receipt alone says which program its rows belong to.
    let _ = writeln!(
        receipt.text,
        "# arm\tarm={arm}\tvocab={v}\tprompt_len={prefill_len}\tdecode_steps={}\ttokens={}",
        tokens.len().saturating_sub(prefill_len),
        tokens
            .iter()
            .map(u32::to_string)
            .collect::<Vec<_>>()
            .join(",")
    );
    let seq = SeqId(0);
    let mut follows = Vec::new();
    // Whatever ran before this arm is not part of its programs.
    be.take_trace();
    let one_shot = with_seq(be, seq, tokens.len(), |be| be.prefill(seq, tokens))?;
    let want_prefill = program_oracle(be, input, seq, "prefill", &mut follows)?;
    rep.artifact(
        &format!("{arm}.safetensors"),
        &[("logits".into(), [tokens.len(), v], one_shot.as_slice())],
    )
    .map_err(|e| EngineError::Unavailable(e.to_string()))?;
    let single = with_seq(be, seq, tokens.len(), |be| {
        let mut rows = be.prefill(seq, &tokens[..prefill_len])?;
        for &t in &tokens[prefill_len..] {
            rows.extend(be.decode_step_h(seq, t)?);
        }
        Ok(rows)
    })?;
    let want_single = program_oracle(be, input, seq, "decode", &mut follows)?;
    let batched = with_seq(be, seq, tokens.len(), |be| {
        let mut rows = be.prefill(seq, &tokens[..prefill_len])?;
        for &t in &tokens[prefill_len..] {
            rows.extend(be.decode_step_batch(&[seq], &[t])?);
        }
        Ok(rows)
    })?;
    let want_batched = program_oracle(be, input, seq, "decode-batch", &mut follows)?;
    let chunked = with_seq(be, seq, tokens.len(), |be| {
        let mut rows = Vec::new();
        for c in tokens.chunks(CHUNK) {
            rows.extend(be.prefill(seq, c)?);
        }
        Ok(rows)
    })?;
    // The decode program again, after a prefill written in chunks: what a chunk left in the
    // cache is read by every later step.
    let after_chunks = with_seq(be, seq, tokens.len(), |be| {
        let mut rows = Vec::new();
        for c in tokens[..prefill_len].chunks(CHUNK) {
            rows.extend(be.prefill(seq, c)?);
        }
        for &t in &tokens[prefill_len..] {
            rows.extend(be.decode_step_h(seq, t)?);
        }
        Ok(rows)
    })?;

    let mut rows = Vec::new();
    // The largest |logit| of the reference rows: how large the values were that the
    // absolute bound of the policy was applied to.
    let mut ref_absmax = 0.0f64;
    // The chunked program is compared with the one-shot prefill, not the oracle.
    be.take_trace();
    let class = if quantized && input.follow.is_none() {
        Class::Q8Flips
    } else {
        Class::Oracle
    };
    let mut cmp =
        |kind: &'static str, reference: &[f32], got: &[f32], first_row: usize, class: Class| {
            for (i, (r, g)) in reference
                .chunks_exact(v)
                .zip(got.chunks_exact(v))
                .enumerate()
            {
                let mut verdict = policy.row(r, g);
                if class == Class::Bitwise {
                    verdict.ok &= bit_identical(r, g);
                }
                ref_absmax = r
                    .iter()
                    .filter(|x| x.is_finite())
                    .fold(ref_absmax, |m, x| m.max(f64::from(x.abs())));
                let status = match (verdict.ok, class) {
                    (true, _) => Status::Pass,
                    (false, Class::Q8Flips)
                        if g.iter().all(|x| x.is_finite())
                            && verdict.rel_rms <= Q8_REL_RMS_FAIL =>
                    {
                        Status::Warn
                    }
                    (false, _) => Status::Fail,
                };
                let row = Row {
                    arm: arm.to_string(),
                    kind,
                    row: first_row + i,
                    v: verdict,
                    verdict: status,
                };
                receipt.row(&row);
                rows.push((row, r.to_vec(), g.to_vec()));
            }
        };
    cmp("prefill", &want_prefill, &one_shot, 0, class);
    cmp(
        "decode",
        &want_single[prefill_len * v..],
        &single[prefill_len * v..],
        prefill_len,
        class,
    );
    cmp(
        "decode-batch",
        &want_batched[prefill_len * v..],
        &batched[prefill_len * v..],
        prefill_len,
        class,
    );
    // Chunked against one-shot prefill is the engine against itself through one
    // composition (every row of a prompt is computed alike, whatever rows share its pass):
    // bit for bit. So is decode after a chunked prefill against decode after a one-shot one.
    cmp("chunked", &one_shot, &chunked, 0, Class::Bitwise);
    cmp(
        "decode-after-chunked",
        &single[prefill_len * v..],
        &after_chunks[prefill_len * v..],
        prefill_len,
        Class::Bitwise,
    );

    // A hard mismatch of the following oracle (a q8_1 value the backend produced that no
    // rounding tie explains) fails the arm even when the logits happen to agree.
    let mut ties = 0;
    let mut mismatches = 0;
    let mut first_quant = None;
    for (program, f) in &follows {
        ties += f.ties_followed;
        mismatches += f.mismatch_count;
        let _ = writeln!(
            receipt.text,
            "# follow\tarm={arm}\tprogram={program}\tsites={}\tties_followed={}\tmismatches={}{}",
            f.sites,
            f.ties_followed,
            f.mismatch_count,
            f.mismatches
                .first()
                .map(|m| format!("\tfirst={m}"))
                .unwrap_or_default()
        );
        if first_quant.is_none() {
            first_quant = f.mismatches.first().map(|m| format!("{program}: {m}"));
        }
    }
    receipt.failures += follows.iter().filter(|(_, f)| f.mismatch_count > 0).count();
    let failures = rows
        .iter()
        .filter(|(r, _, _)| r.verdict == Status::Fail)
        .count()
        + usize::from(mismatches > 0);
    let warnings = rows
        .iter()
        .filter(|(r, _, _)| r.verdict == Status::Warn)
        .count();
    let max_abs = rows.iter().map(|(r, _, _)| r.v.max_abs).fold(0.0, f64::max);
    let max_rel = rows.iter().map(|(r, _, _)| r.v.max_rel).fold(0.0, f64::max);
    let rel_rms = rows.iter().map(|(r, _, _)| r.v.rel_rms).fold(0.0, f64::max);
    let _ = writeln!(
        receipt.text,
        "# summary\tarm={arm}\trows={}\tfailures={failures}\twarnings={warnings}\tmax_abs={max_abs:.3e}\tmax_rel={max_rel:.3e}\trel_rms={rel_rms:.3e}\tref_absmax={ref_absmax:.3e}",
        rows.len()
    );
    let first_bad = rows.iter().find(|(r, _, _)| r.verdict == Status::Fail);
    let first_warn = rows.iter().find(|(r, _, _)| r.verdict == Status::Warn);
    let status = if failures > 0 {
        Status::Fail
    } else if warnings > 0 {
        Status::Warn
    } else {
        Status::Pass
    };
    let shown = first_bad.or(first_warn);
    let mut check = Check::new(
        format!("reference.{arm}"),
        status,
        match (shown, &first_quant) {
            (None, Some(q)) => format!(
                "{mismatches} q8_1 values differ from the tie-following oracle beyond a \
                 rounding tie; first: {q}"
            ),
            (None, None) => format!(
                "{} rows (prefill, decode, decode-batch within policy; chunked, \
                 decode-after-chunked bit for bit)",
                rows.len()
            ),
            (Some((r, _, _)), _) => format!(
                "{failures} rows fail and {warnings} warn (q8_1 rounding flips) of {}; first: {} \
                 row {} (max_abs {:.3e}, max_rel {:.3e}, argmax ref {} got {})",
                rows.len(),
                r.kind,
                r.row,
                r.v.max_abs,
                r.v.max_rel,
                r.v.argmax_ref,
                r.v.argmax_got
            ),
        },
    )
    .metric("rows", rows.len())
    .metric("failures", failures)
    .metric("warnings", warnings)
    .metric("max_abs", max_abs)
    .metric("max_rel", max_rel)
    .metric("rel_rms", rel_rms)
    .metric(
        "oracle",
        if input.follow.is_some() {
            "q8_1-following"
        } else if quantized {
            "q8_1"
        } else {
            "f32"
        },
    )
    .metric("ties_followed", ties)
    .metric("quant_mismatches", mismatches);
    if let Some((r, reference, got)) = shown {
        let index = r.v.first_bad.unwrap_or(r.v.argmax_got as usize);
        check.first_mismatch = Some(FirstMismatch {
            step: None,
            row: r.row,
            index,
            reference: reference[index] as f64,
            got: got[index] as f64,
        });
    }
    Ok(check)
}

/// Runs `f` on a fresh sequence of `capacity` positions, closing it afterwards.
fn with_seq<T>(
    be: &mut dyn Backend,
    seq: SeqId,
    capacity: usize,
    f: impl FnOnce(&mut dyn Backend) -> Result<T, EngineError>,
) -> Result<T, EngineError> {
    be.open_sequence(seq, capacity)?;
    let out = f(be);
    be.close_sequence(seq)?;
    out
}

/// Mints or checks the loader goldens.
fn golden_check(args: &Args, current: &Goldens) -> Result<Check, GateError> {
    let path: &Path = &args.goldens;
    if args.write_goldens {
        let by = format!(
            "reference-gate {} binary_sha256={}",
            env!("CARGO_PKG_VERSION"),
            binary_sha256()
        );
        goldens::write(path, current, &by)?;
        return Ok(Check::new(
            "loader-goldens",
            Status::Pass,
            format!(
                "minted {} tensor digests into {}",
                current.len(),
                path.display()
            ),
        )
        .metric("tensors", current.len()));
    }
    let banked = match goldens::read(path) {
        Ok(b) => b,
        Err(e) => {
            return Ok(Check::new("loader-goldens", Status::Fail, e.to_string()));
        }
    };
    let diff = goldens::diff(&banked, current);
    let c = if diff.is_empty() {
        Check::new(
            "loader-goldens",
            Status::Pass,
            format!("{} tensor digests match {}", current.len(), path.display()),
        )
    } else {
        Check::new(
            "loader-goldens",
            Status::Fail,
            format!(
                "{} of {} tensors moved against {}: {}",
                diff.len(),
                banked.len(),
                path.display(),
                diff.iter().take(5).cloned().collect::<Vec<_>>().join("; ")
            ),
        )
    };
    Ok(c.metric("tensors", current.len())
        .metric("moved", diff.len()))
}
