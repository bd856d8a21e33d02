//! `sampling-gate`: the engine's sampled tokens held to the independent reference sampler
//! (`memra_engine::reference::sampler`), so a fault the kernel twin and the CUDA sampler share,
//! which kernel-check cannot see, still fails a gate.
//!
//! Two rows hold what both sides would otherwise share:
//! - `stream`: the engine's uniform for a few `(seed, sequence, step)` keys with seeds of
//!   2^32 and more (the gate's are) against [`STREAM_KATS`], known answers computed apart
//!   from memra's code (`scripts/philox-words.py`): the reference sampler draws at the
//!   engine's own `twin::draw_uniform`, so a wrong stream would otherwise be compared only
//!   with itself.
//! - `positions`: the gate counts each sequence's position itself (prompt length plus steps
//!   taken) and keys the reference's draws by that count, not by the backend's `seq_len`,
//!   which the engine's sampler keys its own draws by; the row fails where the two disagree.
//!
//! Two kinds of check, under every parameter set of [`PARAM_SETS`] (temperature 0.7, 1.0,
//! 1.3 by top-p 1.0, 0.9, 0.5, 0.2, and six top-k sets: k = 1, 8, 40 alone and 5, 40, 100
//! under a nucleus):
//! - `steps[…]`: a prompt program decoded through the backend's sampled paths — a batch of
//!   one row per parameter set through `decode_step_batch_sampled_rows` (logits read back
//!   from `parked_logits`), and each set alone through `decode_step_h_sampled` (logits from
//!   a twin sequence fed the same tokens through `decode_step_h`) — with each step's token
//!   compared with the reference's at the engine's own uniform. Ambiguous draws (the
//!   reference's flag) are counted, not compared; one mismatch fails the row.
//! - `distribution[…]`: on a few fixed logits rows taken from the engine, [`Settings::draws`]
//!   draws from the engine's sampler at consecutive steps of the Philox stream, and a
//!   chi-square test of the counts against the reference's probabilities (bins with an
//!   expected count below 5 pooled). It fails when `p <` [`P_FAIL`], or when a draw lands
//!   outside the reference's nucleus.
//! - `tied[…]`: the same test on the most spread row with exact ties planted at the cuts
//!   ([`TIED_SETS`]): the engine's logits have none, so without it "every token tied with
//!   the k-th is kept" would be held by unit tests alone. `--part` runs one family of rows.
//!
//! It owns the programs, the comparisons and the verdict; the chi-square arithmetic is
//! [`crate::chi_square`]'s, the engine's sampler `memra_engine::sampling`, the reference
//! `memra_engine::reference::sampler`. `docs/gates.md`
//! ("sampling-gate") is the user's guide.

use std::path::PathBuf;

use clap::Parser;
use serde_json::json;

use crate::chi_square::{chi2_sf, pooled_chi2};
use crate::ledger::host_argmax;
use crate::output::{GateError, GateExit, Reporter};
use crate::workload::prompts;
use memra_engine::backend::{Backend, EngineError, SeqId, open_backend};
use memra_engine::doors::Doors;
use memra_engine::reference::sampler;
use memra_engine::sampling::{self, SamplingParams};
use memra_engine::sampling::{draw_uniform, philox4x32_10};
use memra_protocol::{Check, FirstMismatch, Status};

/// Flags of `sampling-gate`. Exit status: 0 pass, 1 a check failed, 2 bad flags, pins or
/// model.
#[derive(Debug, Parser)]
#[command(
    name = "sampling-gate",
    about = "The engine's sampled tokens vs an independent f64 reference sampler (temperature \
             + top-k + top-p, the engine's Philox stream): per parameter set, every unambiguous \
             decode step's token, and a chi-square test of many draws on fixed logits rows (fails at \
             p < 1e-6). Exit 0 pass, 1 fail, 2 usage or setup error."
)]
pub struct Args {
    /// The GGUF checkpoint.
    pub model: PathBuf,
    /// Decode steps per sequence.
    #[arg(long, default_value_t = 16)]
    pub steps: usize,
    /// Prompt length of the programs.
    #[arg(long, default_value_t = 6)]
    pub plen: usize,
    /// Draws per distribution test (at least 100).
    #[arg(long, default_value_t = 4000)]
    pub draws: usize,
    /// Fixed logits rows of the distribution test (the most spread rows the batched run saw).
    #[arg(long, default_value_t = 3)]
    pub rows: usize,
    /// Which rows to run: every row, or one family (`steps`: stream, steps and positions;
    /// `distribution`: the engine's rows; `tied`: the rows with exact ties at the cuts).
    #[arg(long, value_enum, default_value_t = Part::All)]
    pub part: Part,
}

/// The families of rows `--part` selects.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Part {
    All,
    Steps,
    Distribution,
    Tied,
}

impl Part {
    fn runs(self, family: Part) -> bool {
        self == Part::All || self == family
    }
}

/// Validated settings.
#[derive(Debug, Clone, Copy)]
pub struct Settings {
    pub steps: usize,
    pub plen: usize,
    pub draws: usize,
    pub rows: usize,
    pub part: Part,
}

/// Every (temperature, top-k, top-p) the step checks run: each temperature with no
/// truncation and with nuclei from wide to narrow, then top-k alone (k = 1 must be the
/// argmax) and top-k under a nucleus (top-p cuts inside what top-k kept). Top-k 0 is none.
pub const PARAM_SETS: [(f32, u32, f32); 18] = [
    (0.7, 0, 1.0),
    (0.7, 0, 0.9),
    (0.7, 0, 0.5),
    (0.7, 0, 0.2),
    (1.0, 0, 1.0),
    (1.0, 0, 0.9),
    (1.0, 0, 0.5),
    (1.0, 0, 0.2),
    (1.3, 0, 1.0),
    (1.3, 0, 0.9),
    (1.3, 0, 0.5),
    (1.3, 0, 0.2),
    (1.0, 1, 1.0),
    (0.7, 8, 1.0),
    (1.3, 40, 1.0),
    (1.0, 5, 0.9),
    (1.3, 40, 0.5),
    (1.0, 100, 0.2),
];

/// The sets of the distribution test: one per temperature and every top-p, so each row is
/// tested without truncation and through nuclei of three widths, and two under top-k (alone,
/// and with a nucleus inside it).
pub const DIST_SETS: [(f32, u32, f32); 6] = [
    (1.0, 0, 1.0),
    (0.7, 0, 0.9),
    (1.3, 0, 0.5),
    (1.0, 0, 0.2),
    (1.0, 8, 1.0),
    (1.3, 40, 0.9),
];

/// The sets of the tied rows (`tied_row`): top-k 8, whose k-th ties with the next token;
/// top-k 40, whose k-th ties with every later token; and top-p 0.9 alone, whose cut lands
/// inside that tied tail wherever the tail holds more than a tenth of the mass.
pub const TIED_SETS: [(f32, u32, f32); 3] = [(1.0, 8, 1.0), (1.0, 40, 1.0), (1.0, 0, 0.9)];

/// The cuts `tied_row` ties: a pair at the k-th of top-k [`TIE_PAIR_K`], and the whole tail
/// from the k-th of top-k [`TIE_TAIL_K`] on.
const TIE_PAIR_K: usize = 8;
const TIE_TAIL_K: usize = 40;

/// A distribution test fails when the chi-square p-value falls below this. With eighteen
/// tests a run, a correct sampler fails one by chance about once in 10^5 runs.
pub const P_FAIL: f64 = 1e-6;

/// Base of the sampling seeds (offset by `MEMRA_GATE_SEED` and the set index).
const SEED_BASE: u64 = 0x5a3b_11e0_0000_0000;

/// Known answers of the sampling stream: `(seed, seq, step, word, u)`, the first word of
/// Philox4x32-10 with counter `[step, seq, 0, 0]` and key `[seed_lo, seed_hi]` and the
/// uniform drawn from it (its top 24 bits times 2^-24). Computed by
/// `scripts/philox-words.py`, a Python restatement of Philox from the paper that checks
/// itself against Random123's known answers first; its output pasted here. Every seed is at
/// least 2^32, so a key that lost its high word fails, and the keys span the gate's own
/// (the seed base, its set and distribution offsets, the batch, single-path and
/// distribution sequence ids) and the extremes of the counter.
pub const STREAM_KATS: [(u64, u32, u32, u32, f64); 7] = [
    (0x5a3b11e000000000, 0, 7, 0xd0441c0d, 0.8135392665863037),
    (0x5a3b11e00000000b, 11, 22, 0x418bdc9e, 0.2560403347015381),
    (
        0x5a3b11e000050000,
        902,
        3999,
        0x40fa2125,
        0.2538166642189026,
    ),
    (0x5a3b11e09e3779ba, 103, 9, 0x884583b6, 0.5323106646537781),
    (0xffffffff00000001, 207, 1, 0x968cb875, 0.5880846977233887),
    (0x0000000100000000, 0, 0, 0xfdde3e0b, 0.9916723966598511),
    (
        0x8000000000000000,
        4294967295,
        4294967295,
        0xf08ed589,
        0.9396794438362122,
    ),
];

/// Sequence ids of the programs: the batch rows, the single-path sequences and their twins,
/// the distribution rows' streams.
const BATCH_ID: u32 = 0;
const SINGLE_ID: u32 = 100;
const TWIN_ID: u32 = 200;
const DIST_ID: u32 = 900;
const TIED_ID: u32 = 950;

/// Runs the gate on the process arguments and environment; returns the exit status.
pub fn main() -> i32 {
    crate::output::gate_main::<Args>("sampling-gate", run_gate)
}

fn settings(args: &Args) -> Result<Settings, GateError> {
    if args.steps == 0 {
        return Err(GateError::new("--steps 0: give at least one decode step"));
    }
    if args.plen == 0 {
        return Err(GateError::new("--plen 0: prompts need at least one token"));
    }
    if args.draws < 100 {
        return Err(GateError::new(format!(
            "--draws {}: a chi-square test needs at least 100 draws (a few thousand is the \
             useful range)",
            args.draws
        )));
    }
    if args.rows == 0 || args.rows > PARAM_SETS.len() * args.steps {
        return Err(GateError::new(format!(
            "--rows {}: give 1 to {} fixed logits rows (they are picked from the {} rows x \
             --steps {} the batched run sees)",
            args.rows,
            PARAM_SETS.len() * args.steps,
            PARAM_SETS.len(),
            args.steps
        )));
    }
    Ok(Settings {
        steps: args.steps,
        plen: args.plen,
        draws: args.draws,
        rows: args.rows,
        part: args.part,
    })
}

/// The parameters of set `i` under the doors' seed.
fn params(i: usize, gate_seed: u64) -> SamplingParams {
    let (temperature, top_k, top_p) = PARAM_SETS[i];
    SamplingParams {
        temperature,
        top_k,
        top_p,
        seed: SEED_BASE ^ gate_seed.wrapping_mul(0x9e37_79b9) ^ i as u64,
    }
}

/// A set in a row name: `T=…,top_p=…`, with `top_k=…` between them where the set has top-k.
fn set_label((t, k, p): (f32, u32, f32)) -> String {
    if k == 0 {
        format!("T={t},top_p={p}")
    } else {
        format!("T={t},top_k={k},top_p={p}")
    }
}

/// The whole gate: flags, doors and model are read here; errors before the first check are
/// setup errors (exit 2).
pub fn run_gate(args: &Args) -> Result<GateExit, GateError> {
    let s = settings(args)?;
    let doors = Doors::from_env().map_err(|e| GateError::new(format!("bad pins: {e}")))?;
    let model = crate::output::open_model(&args.model)?;
    let need = s.plen + 4 + s.steps + 1;
    if need > model.config.n_ctx {
        return Err(GateError::new(format!(
            "--plen {} and --steps {} need {need} positions but the model's context is {}; \
             lower them",
            s.plen, s.steps, model.config.n_ctx
        )));
    }
    let mut be = open_backend(model, &doors).map_err(|e| GateError::new(e.to_string()))?;
    let mut rep = Reporter::from_env("sampling-gate");
    let extra = [
        ("steps", json!(s.steps)),
        ("plen", json!(s.plen)),
        ("draws", json!(s.draws)),
        ("dist_rows", json!(s.rows)),
        ("param_sets", json!(PARAM_SETS.len())),
        ("part", json!(format!("{:?}", s.part).to_lowercase())),
        ("p_fail", json!(P_FAIL)),
    ];
    rep.header(&be.doors_report(), &doors, &extra)?;
    gate(&mut *be, &doors, &s, &mut rep)?;
    Ok(rep.finish())
}

/// Every check of the gate on an open backend.
pub fn gate(
    be: &mut dyn Backend,
    doors: &Doors,
    s: &Settings,
    rep: &mut Reporter,
) -> Result<(), GateError> {
    let sets: Vec<SamplingParams> = (0..PARAM_SETS.len())
        .map(|i| params(i, doors.gate_seed))
        .collect();
    let n_vocab = be.config().n_vocab;
    let ps = prompts(n_vocab, sets.len(), s.plen, doors.gate_seed, 0);
    let steps_part = s.part.runs(Part::Steps);
    if steps_part {
        rep.check(&stream_check())?;
    }
    let mut tallies = vec![Tally::default(); sets.len()];
    let mut positions = Positions::default();
    let mut dist_rows = Vec::new();
    match batched(be, &ps, &sets, s.steps, &mut tallies, &mut positions) {
        Ok(seen) => dist_rows = spread_rows(seen, s.rows),
        Err(e) => {
            for t in &mut tallies {
                t.refused.get_or_insert(format!("batched path: {e}"));
            }
        }
    }
    if steps_part {
        for (i, p) in sets.iter().enumerate() {
            if let Err(e) = single(be, &ps[i], i, p, s.steps, &mut tallies[i], &mut positions) {
                tallies[i]
                    .refused
                    .get_or_insert(format!("single-sequence path: {e}"));
            }
        }
        for (i, t) in tallies.iter().enumerate() {
            rep.check(&t.check(&format!("steps[{}]", set_label(PARAM_SETS[i]))))?;
        }
        rep.check(&positions.check("positions"))?;
    }
    let nucleus = sampling::nucleus(doors);
    let dist_part = if s.part.runs(Part::Distribution) {
        &dist_rows[..]
    } else {
        &[]
    };
    for (r, row) in dist_part.iter().enumerate() {
        for (j, &set) in DIST_SETS.iter().enumerate() {
            rep.check(&distribution_row(
                &format!("distribution[row={r},{}]", set_label(set)),
                row,
                set,
                SEED_BASE ^ doors.gate_seed ^ (((r * DIST_SETS.len() + j) as u64) << 16),
                SeqId(DIST_ID + r as u32),
                s.draws,
                nucleus,
            ))?;
        }
    }
    if let Some(row) = dist_rows.first().filter(|_| s.part.runs(Part::Tied)) {
        tied_checks(row, doors, s.draws, nucleus, rep)?;
    }
    if dist_rows.is_empty() && s.part != Part::Steps {
        rep.check(&Check::new(
            "distribution",
            Status::Fail,
            "no logits rows: the batched run that provides them was refused (see the steps \
             rows, or run with --part steps)",
        ))?;
    }
    Ok(())
}

/// The `tied[…]` rows: the distribution test under [`TIED_SETS`] on [`tied_row`] of the
/// most spread row, so the contract's "every token tied with the k-th is kept" (and the
/// nucleus' ties at its cut) is held end to end, which no row of the engine's own logits,
/// free of exact ties, can do.
fn tied_checks(
    row: &[f32],
    doors: &Doors,
    draws: usize,
    nucleus: sampling::Nucleus,
    rep: &mut Reporter,
) -> Result<(), GateError> {
    let Some(tied) = tied_row(row) else {
        return rep.check(&Check::new(
            "tied",
            Status::Warn,
            format!(
                "a vocabulary of {} tokens is too small for the tied rows (they tie the \
                 {TIE_TAIL_K}th token with every later one and need {} tokens): nothing held",
                row.len(),
                TIE_TAIL_K + 2
            ),
        ));
    };
    for (j, &set) in TIED_SETS.iter().enumerate() {
        rep.check(&distribution_row(
            &format!("tied[{}]", set_label(set)),
            &tied,
            set,
            SEED_BASE ^ doors.gate_seed ^ (((1 << 15) + j as u64) << 16),
            SeqId(TIED_ID + j as u32),
            draws,
            nucleus,
        ))?;
    }
    Ok(())
}

/// The check `name`: [`distribution_test`] of `draws` draws from `row` under `set` with the
/// engine's sampler (keeping `nucleus`), keyed by `seed` and `seq`.
fn distribution_row(
    name: &str,
    row: &[f32],
    (temperature, top_k, top_p): (f32, u32, f32),
    seed: u64,
    seq: SeqId,
    draws: usize,
    nucleus: sampling::Nucleus,
) -> Check {
    let p = SamplingParams {
        temperature,
        top_k,
        top_p,
        seed,
    };
    // The row prepared once and drawn from at every step: the tokens of
    // `sample_token_with` at those steps (`sampling::PreparedRow`), without redoing the
    // softmax and the cuts' bisections for each of thousands of draws.
    let prepared = match sampling::PreparedRow::new(row, &p, nucleus) {
        Ok(r) => r,
        Err(e) => {
            return Check::new(
                name,
                Status::Fail,
                format!("the engine's sampler refused: {e}"),
            );
        }
    };
    let draw = |step: usize| Ok(prepared.draw(seq, step));
    match distribution_test(row, &p, draws, draw) {
        Ok(d) => d.check(name),
        Err(e) => Check::new(
            name,
            Status::Fail,
            format!("the engine's sampler refused: {e}"),
        ),
    }
}

/// `row` with exact ties at two top-k cuts: the token ranked [`TIE_PAIR_K`] + 1 takes the
/// logit of the [`TIE_PAIR_K`]-th (a pair across the cut of top-k 8), and every token from
/// the [`TIE_TAIL_K`]-th on takes the [`TIE_TAIL_K`]-th's (the whole tail tied with the
/// k-th of top-k 40, and a nucleus that reaches into the tail cuts inside that tie). Ranks
/// are by logit, descending, ties to the lower id, NaN left where it is. `None` when the
/// row has fewer than [`TIE_TAIL_K`] + 2 ordered tokens.
fn tied_row(row: &[f32]) -> Option<Vec<f32>> {
    let mut order: Vec<usize> = (0..row.len()).filter(|&i| !row[i].is_nan()).collect();
    if order.len() < TIE_TAIL_K + 2 {
        return None;
    }
    order.sort_by(|&a, &b| row[b].total_cmp(&row[a]));
    let mut tied = row.to_vec();
    tied[order[TIE_PAIR_K]] = row[order[TIE_PAIR_K - 1]];
    let tail = row[order[TIE_TAIL_K - 1]];
    for &i in &order[TIE_TAIL_K..] {
        tied[i] = tail;
    }
    Some(tied)
}

/// The `stream` row: the engine's Philox words and uniforms at [`STREAM_KATS`].
fn stream_check() -> Check {
    stream_check_with(|seed, seq, step| {
        let key = [seed as u32, (seed >> 32) as u32];
        (
            philox4x32_10([step, seq, 0, 0], key)[0],
            f64::from(draw_uniform(seed, seq, step)),
        )
    })
}

/// [`stream_check`] over `draw(seed, seq, step)` = (first Philox word, uniform).
fn stream_check_with(draw: impl Fn(u64, u32, u32) -> (u32, f64)) -> Check {
    let (mut mismatches, mut first, mut words) = (0, None, String::new());
    for (i, &(seed, seq, step, word, u)) in STREAM_KATS.iter().enumerate() {
        let (got_word, got_u) = draw(seed, seq, step);
        if got_word != word || got_u != u {
            mismatches += 1;
            if first.is_none() {
                words = format!(
                    " (first at seed {seed:#018x}, sequence {seq}, step {step}: word \
                     {got_word:#010x}, known {word:#010x})"
                );
                first = Some(FirstMismatch {
                    step: Some(step as usize),
                    row: i,
                    index: seq as usize,
                    reference: u,
                    got: got_u,
                });
            }
        }
    }
    let (status, message) = if mismatches > 0 {
        (
            Status::Fail,
            format!(
                "the engine's random stream differs from the known Philox4x32-10 answers at \
                 {mismatches} of {} keys{words}: ref/got = uniforms; the reference sampler \
                 draws at the same uniforms, so no other row can see this",
                STREAM_KATS.len()
            ),
        )
    } else {
        (Status::Pass, String::new())
    };
    let mut c = Check::new("stream", status, message)
        .metric("keys", STREAM_KATS.len())
        .metric("mismatches", mismatches);
    c.first_mismatch = first;
    c
}

/// The positions the gate counted itself against the backend's `seq_len`, over both paths.
#[derive(Debug, Clone, Default)]
struct Positions {
    checked: usize,
    disagree: usize,
    /// The first disagreement: (sequence, the gate's count, the backend's `seq_len`).
    first: Option<(SeqId, usize, usize)>,
}

impl Positions {
    /// Holds the backend's length of `seq` to the gate's count `pos`.
    fn hold(&mut self, be: &dyn Backend, seq: SeqId, pos: usize) -> Result<(), EngineError> {
        let got = be.seq_len(seq)?;
        self.checked += 1;
        if got != pos {
            self.disagree += 1;
            self.first.get_or_insert((seq, pos, got));
        }
        Ok(())
    }

    fn check(&self, name: &str) -> Check {
        let (status, message) = if let Some((seq, pos, got)) = self.first {
            (
                Status::Fail,
                format!(
                    "the backend's seq_len disagrees with the position the gate counted (prompt \
                     length plus steps taken) {} of {} times, first for sequence {} ({got} \
                     against {pos}): the engine keys its sampling stream by seq_len",
                    self.disagree, self.checked, seq.0
                ),
            )
        } else if self.checked == 0 {
            (
                Status::Fail,
                "no position was checked: both sampled paths were refused (see the steps rows)"
                    .to_string(),
            )
        } else {
            (Status::Pass, String::new())
        };
        let mut c = Check::new(name, status, message)
            .metric("checked", self.checked)
            .metric("disagree", self.disagree);
        c.first_mismatch = self.first.map(|(seq, pos, got)| FirstMismatch {
            step: Some(pos),
            row: 0,
            index: seq.0 as usize,
            reference: pos as f64,
            got: got as f64,
        });
        c
    }
}

/// The `count` rows of `seen` whose distribution at temperature 1 has the most entropy
/// (earliest first among equals), in the order they were seen: a peaked row keeps one token
/// under every top-p and tests nothing, so the distribution test takes the spread ones.
fn spread_rows(seen: Vec<Vec<f32>>, count: usize) -> Vec<Vec<f32>> {
    let entropy = |row: &[f32]| -> f64 {
        let d = sampler::distribution(row, 1.0, 0, 1.0);
        -d.kept
            .iter()
            .filter(|k| k.1 > 0.0)
            .map(|&(_, p)| p * p.ln())
            .sum::<f64>()
    };
    let h: Vec<f64> = seen.iter().map(|r| entropy(r)).collect();
    let mut order: Vec<usize> = (0..seen.len()).collect();
    order.sort_by(|&a, &b| h[b].total_cmp(&h[a]));
    order.truncate(count);
    order.sort_unstable();
    let mut seen: Vec<Option<Vec<f32>>> = seen.into_iter().map(Some).collect();
    order.iter().filter_map(|&i| seen[i].take()).collect()
}

/// The step comparisons of one parameter set over both paths.
#[derive(Debug, Clone, Default)]
struct Tally {
    compared: usize,
    ambiguous: usize,
    mismatches: usize,
    /// The first mismatch and the path it came from.
    first: Option<(FirstMismatch, &'static str)>,
    /// Why a path could not run (the engine refused).
    refused: Option<String>,
}

impl Tally {
    /// Compares the engine's `got` for `seq` at `step` (the position the token takes) with
    /// the reference's draw from `logits`; `row` names the batch row in a mismatch.
    #[allow(clippy::too_many_arguments)]
    fn compare(
        &mut self,
        path: &'static str,
        logits: &[f32],
        p: &SamplingParams,
        seq: SeqId,
        step: usize,
        row: usize,
        got: u32,
    ) {
        let r = sampler::sample(logits, p.temperature, p.top_k, p.top_p, p.seed, seq, step);
        if r.ambiguous {
            self.ambiguous += 1;
            return;
        }
        self.compared += 1;
        if r.token != got {
            self.mismatches += 1;
            self.first.get_or_insert((
                FirstMismatch {
                    step: Some(step),
                    row,
                    index: seq.0 as usize,
                    reference: r.token as f64,
                    got: got as f64,
                },
                path,
            ));
        }
    }

    fn check(&self, name: &str) -> Check {
        let (status, message) = if let Some(why) = &self.refused {
            (Status::Fail, format!("the engine refused: {why}"))
        } else if self.mismatches > 0 {
            let path = self.first.as_ref().map_or("", |f| f.1);
            (
                Status::Fail,
                format!(
                    "{} of {} unambiguous draws differ from the reference sampler (first on \
                     the {path} path: step = position, index = sequence id, ref/got = tokens)",
                    self.mismatches, self.compared
                ),
            )
        } else if self.compared == 0 {
            // Not evidence of a fault (a flat distribution over a large vocabulary can make
            // every draw ambiguous), but nothing was held either: a warning says so.
            (
                Status::Warn,
                "every draw was ambiguous: nothing was compared; raise --steps".to_string(),
            )
        } else {
            (Status::Pass, String::new())
        };
        let mut c = Check::new(name, status, message)
            .metric("compared", self.compared)
            .metric("ambiguous", self.ambiguous)
            .metric("mismatches", self.mismatches);
        c.first_mismatch = self.first.as_ref().map(|f| f.0);
        c
    }
}

/// The batch of one row per parameter set through `decode_step_batch_sampled_rows`, every
/// step's tokens held to the reference on the parked logits. Returns every logits row it
/// saw (the distribution test picks its fixed rows from them). Sequences are closed
/// afterwards, also on error.
fn batched(
    be: &mut dyn Backend,
    prompts: &[Vec<u32>],
    sets: &[SamplingParams],
    steps: usize,
    tallies: &mut [Tally],
    positions: &mut Positions,
) -> Result<Vec<Vec<f32>>, EngineError> {
    let n_vocab = be.config().n_vocab;
    let seqs: Vec<SeqId> = (0..prompts.len() as u32)
        .map(|b| SeqId(BATCH_ID + b))
        .collect();
    // The position of each sequence's next token, counted here, not asked of the backend.
    let mut pos: Vec<usize> = prompts.iter().map(Vec::len).collect();
    let mut opened = Vec::new();
    let result = (|| {
        let mut next = Vec::new();
        for (b, (&seq, prompt)) in seqs.iter().zip(prompts).enumerate() {
            be.open_sequence(seq, prompt.len() + steps + 1)?;
            opened.push(seq);
            next.push(host_argmax(&be.prime(seq, prompt)?));
            positions.hold(be, seq, pos[b])?;
        }
        let mut rows = Vec::new();
        for _ in 0..steps {
            let got = be.decode_step_batch_sampled_rows(&seqs, &next, sets)?;
            let logits = be.parked_logits()?;
            for (b, row) in logits.chunks_exact(n_vocab).enumerate() {
                // The token fed took position pos[b]; the one drawn takes the next.
                pos[b] += 1;
                positions.hold(be, seqs[b], pos[b])?;
                tallies[b].compare("batched", row, &sets[b], seqs[b], pos[b], b, got[b]);
                rows.push(row.to_vec());
            }
            next = got;
        }
        Ok(rows)
    })();
    for seq in opened {
        let _ = be.close_sequence(seq);
    }
    result
}

/// Set `i` alone through `decode_step_h_sampled`, its logits from a twin sequence fed the
/// same prompt and tokens through `decode_step_h` (the single-sequence path computes the
/// same bits for the same sequence). Sequences are closed afterwards, also on error.
fn single(
    be: &mut dyn Backend,
    prompt: &[u32],
    i: usize,
    p: &SamplingParams,
    steps: usize,
    tally: &mut Tally,
    positions: &mut Positions,
) -> Result<(), EngineError> {
    let (seq, twin) = (SeqId(SINGLE_ID + i as u32), SeqId(TWIN_ID + i as u32));
    let mut pos = prompt.len();
    let mut opened = Vec::new();
    let result = (|| {
        be.open_sequence(seq, prompt.len() + steps + 1)?;
        opened.push(seq);
        be.open_sequence(twin, prompt.len() + steps + 1)?;
        opened.push(twin);
        let mut next = host_argmax(&be.prime(seq, prompt)?);
        be.prime(twin, prompt)?;
        positions.hold(be, seq, pos)?;
        for _ in 0..steps {
            let got = be.decode_step_h_sampled(seq, next, p)?;
            let logits = be.decode_step_h(twin, next)?;
            pos += 1;
            positions.hold(be, seq, pos)?;
            positions.hold(be, twin, pos)?;
            tally.compare("single-sequence", &logits, p, seq, pos, 0, got);
            next = got;
        }
        Ok(())
    })();
    for s in opened {
        let _ = be.close_sequence(s);
    }
    result
}

/// What one distribution test found.
#[derive(Debug, Clone, PartialEq)]
pub struct DistributionTest {
    pub draws: usize,
    /// Tokens in the reference's nucleus.
    pub kept: usize,
    /// Bins after pooling, and the chi-square statistic over them.
    pub bins: usize,
    pub chi2: f64,
    pub p_value: f64,
    /// Draws of tokens outside every plausible nucleus of the reference, and the first such
    /// token.
    pub outside: usize,
    pub first_outside: Option<u32>,
}

/// Draws `draws` tokens with `draw(step)` (steps 0, 1, …) and tests their counts against
/// the reference's distribution of `row` under `p`.
pub fn distribution_test(
    row: &[f32],
    p: &SamplingParams,
    draws: usize,
    mut draw: impl FnMut(usize) -> Result<u32, EngineError>,
) -> Result<DistributionTest, EngineError> {
    let dist = sampler::distribution(row, p.temperature, p.top_k, p.top_p);
    let mut counts = vec![0usize; dist.kept.len()];
    let (mut outside, mut first_outside) = (0, None);
    for step in 0..draws {
        let t = draw(step)?;
        match dist.kept.binary_search_by_key(&t, |&(i, _)| i) {
            Ok(j) => counts[j] += 1,
            // A token only an alternative nucleus keeps is a legitimate f32 cut: not counted.
            Err(_) if dist.may_keep(t) => {}
            Err(_) => {
                outside += 1;
                first_outside.get_or_insert(t);
            }
        }
    }
    let expected: Vec<f64> = dist.kept.iter().map(|&(_, q)| q * draws as f64).collect();
    let (chi2, bins) = pooled_chi2(&counts, &expected);
    Ok(DistributionTest {
        draws,
        kept: dist.kept.len(),
        bins,
        chi2,
        p_value: chi2_sf(chi2, bins.saturating_sub(1)),
        outside,
        first_outside,
    })
}

impl DistributionTest {
    fn check(&self, name: &str) -> Check {
        let (status, message) = if self.outside > 0 {
            (
                Status::Fail,
                format!(
                    "{} of {} draws are outside the reference's nucleus of {} tokens (first: \
                     token {})",
                    self.outside,
                    self.draws,
                    self.kept,
                    self.first_outside.unwrap_or(0)
                ),
            )
        } else if self.p_value < P_FAIL {
            (
                Status::Fail,
                format!(
                    "the counts do not follow the reference's probabilities: chi2 {:.1} over \
                     {} bins, p = {:.2e} < {P_FAIL:e}",
                    self.chi2, self.bins, self.p_value
                ),
            )
        } else {
            (Status::Pass, String::new())
        };
        Check::new(name, status, message)
            .metric("draws", self.draws)
            .metric("kept", self.kept)
            .metric("bins", self.bins)
            .metric("chi2", self.chi2)
            .metric("p_value", self.p_value)
            .metric("outside", self.outside)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use memra_engine::sampling::uniform_from_philox;

    /// A sampler that never draws the cut token fails the test; the engine's host sampler
    /// passes it.
    #[test]
    fn distribution_test_catches_an_early_cut() {
        // Probabilities 0.5, 0.25, 0.125, 0.125: top_p 0.6 keeps tokens 0 and 1.
        let row: Vec<f32> = [4.0f64, 2.0, 1.0, 1.0]
            .iter()
            .map(|x| x.ln() as f32)
            .collect();
        let p = SamplingParams {
            temperature: 1.0,
            top_k: 0,
            top_p: 0.6,
            seed: 9,
        };
        let r = &row;
        let draw = |nucleus| {
            move |step: usize| sampling::sample_token_with(r, &p, SeqId(1), step, nucleus)
        };
        let good = distribution_test(&row, &p, 3000, draw(sampling::Nucleus::Exact)).unwrap();
        assert!(good.p_value > 1e-3 && good.outside == 0, "{good:?}");
        assert_eq!(good.check("x").status, Status::Pass);
        let bad = distribution_test(&row, &p, 3000, draw(sampling::Nucleus::OneEarly)).unwrap();
        assert!(bad.p_value < P_FAIL, "{bad:?}");
        assert_eq!(bad.check("x").status, Status::Fail);
        // Draws outside the nucleus fail however the counts look.
        let outside = distribution_test(&row, &p, 200, |_| Ok(3)).unwrap();
        assert_eq!(outside.outside, 200);
        assert_eq!(outside.check("x").status, Status::Fail);
    }

    /// The tied row ties exactly the pair across the cut of top-k 8 and the tail from the
    /// 40th token on; the contract keeps the ties, the tie-dropping defect does not, and
    /// the late top-k cut (k + 1) keeps what the contract keeps there.
    #[test]
    fn the_tied_row_ties_the_cuts_and_the_tie_dropping_cut_fails_it() {
        // Distinct logits, descending with the id from token 3 on, one NaN.
        let mut row: Vec<f32> = (0..64).map(|i| 5.0 - 0.125 * i as f32).collect();
        row.swap(0, 10);
        row[63] = f32::NAN;
        let tied = tied_row(&row).unwrap();
        let mut order: Vec<usize> = (0..63).collect();
        order.sort_by(|&a, &b| row[b].total_cmp(&row[a]));
        assert_eq!(tied[order[8]], row[order[7]]);
        assert_ne!(tied[order[9]], tied[order[8]]);
        assert!(order[40..].iter().all(|&i| tied[i] == row[order[39]]));
        assert!(order[..8].iter().all(|&i| tied[i] == row[i]));
        assert!(tied[63].is_nan());
        assert_eq!(tied_row(&row[..41]), None);
        for &(temperature, top_k, top_p) in &TIED_SETS[..2] {
            let p = SamplingParams {
                temperature,
                top_k,
                top_p,
                seed: 3 << 40,
            };
            let kept = sampler::distribution(&tied, temperature, top_k, top_p)
                .kept
                .len();
            assert_eq!(kept, if top_k == 8 { 9 } else { 63 });
            let test = |nucleus| {
                let draw = |step| sampling::sample_token_with(&tied, &p, SeqId(1), step, nucleus);
                distribution_test(&tied, &p, 4000, draw)
                    .unwrap()
                    .check("t")
                    .status
            };
            assert_eq!(test(sampling::Nucleus::Exact), Status::Pass);
            assert_eq!(test(sampling::Nucleus::KOneMore), Status::Pass);
            assert_eq!(test(sampling::Nucleus::KDropTies), Status::Fail);
        }
    }

    /// The engine's stream meets the known answers; a stream whose key lost its high word
    /// (or any other stream) does not.
    #[test]
    fn the_stream_row_holds_the_known_answers() {
        let c = stream_check();
        assert_eq!(c.status, Status::Pass, "{c:?}");
        assert_eq!(c.metrics["keys"], STREAM_KATS.len());
        let low_key_only = stream_check_with(|seed, seq, step| {
            let w = philox4x32_10([step, seq, 0, 0], [seed as u32, 0])[0];
            (w, f64::from(uniform_from_philox(w)))
        });
        assert_eq!(low_key_only.status, Status::Fail);
        assert_eq!(low_key_only.metrics["mismatches"], STREAM_KATS.len());
        let m = low_key_only.first_mismatch.unwrap();
        assert_eq!((m.step, m.row, m.index), (Some(7), 0, 0));
        assert!(
            low_key_only.message.contains("known 0xd0441c0d"),
            "{}",
            low_key_only.message
        );
    }

    #[test]
    fn positions_fail_where_seq_len_disagrees_and_when_nothing_was_checked() {
        assert_eq!(Positions::default().check("p").status, Status::Fail);
        let ok = Positions {
            checked: 3,
            ..Positions::default()
        };
        assert_eq!(ok.check("p").status, Status::Pass);
        let bad = Positions {
            checked: 3,
            disagree: 1,
            first: Some((SeqId(4), 7, 1)),
        };
        let c = bad.check("p");
        assert_eq!(c.status, Status::Fail);
        let m = c.first_mismatch.unwrap();
        assert_eq!(
            (m.step, m.index, m.reference, m.got),
            (Some(7), 4, 7.0, 1.0)
        );
    }

    #[test]
    fn tally_fails_on_a_mismatch_and_warns_when_nothing_was_compared() {
        let row = [0.0f32, 0.0, 0.0, 0.0];
        let p = SamplingParams {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            seed: 1,
        };
        let mut good = Tally::default();
        let mut bad = Tally::default();
        for step in 0..50 {
            let r = sampler::sample(&row, 1.0, 0, 1.0, 1, SeqId(0), step);
            good.compare("batched", &row, &p, SeqId(0), step, 0, r.token);
            bad.compare("batched", &row, &p, SeqId(0), step, 0, (r.token + 1) % 4);
        }
        assert_eq!(good.check("g").status, Status::Pass);
        let c = bad.check("b");
        assert_eq!(c.status, Status::Fail);
        assert!(c.first_mismatch.is_some());
        assert_eq!(Tally::default().check("e").status, Status::Warn);
    }
}
