//! The engine API every backend implements (DESIGN §7): sequences with their own KV caches,
//! prompt prefill, single-sequence decode (`decode_step_h`), batched decode
//! (`decode_step_batch`) and their sampled variants, the batched one with sampling
//! parameters per row (`decode_step_batch_sampled_rows`).
//!
//! This module owns the contract (the [`Backend`] trait, the row and batch rules, the
//! canary rule) and backend selection from the doors. Every call of the API is walked once,
//! here, in the trait's provided methods: the walk is cleared ([`Backend::check_walk`]), the
//! rows are checked against the open sequences ([`Sequences`]) before any cache moves, the
//! backend computes them ([`Backend::run_rows`], the one thing a backend must do besides
//! holding caches), and the positions are committed, with the planted bookkeeping defects
//! applied in one place. The sequence identity and the error type live below it, in
//! `crate::seq` and `crate::error`, so the sampler can use them without importing the
//! backends; they are re-exported here as part of the API. *How* rows are computed belongs
//! to each backend: [`cpu`] builds them from the kernel twins; the CUDA backend from the
//! kernels.

pub mod cpu;
pub mod cuda;
mod pool;
pub mod sequences;
pub mod stages;
pub mod trace;

pub use crate::error::EngineError;
pub use crate::seq::SeqId;

use crate::doors::{BackendChoice, Doors, DoorsReport, GateDefect};
use crate::model::{LlamaConfig, LlamaModel};
use crate::sampling::SamplingParams;
pub use sequences::Sequences;
use std::ops::Range;

/// How a batched pass walks a pipeline placement (`MEMRA_PP_STAGES`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Walk {
    /// Stage by stage, each stage after the first on its own buffers, filled by a boundary
    /// copy from the previous stage's.
    Split,
    /// Every stage-owned layer in order on one body's buffers, no boundary.
    Unsplit,
}

/// A [`Walk`] that [`Backend::check_walk`] let through (or the split walk, which is never
/// refused). Only the backend module (and the backends inside it) can build one, so a caller
/// outside reaches [`Backend::run_rows`], which takes it, only with a walk some backend's
/// `check_walk` cleared: the refusal lives once, above the backends. The token does not name
/// its backend; hand a pass only the one its own `check_walk` returned, as the trait's
/// provided methods do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClearedWalk(Walk);

impl ClearedWalk {
    /// The walk that was cleared.
    pub fn walk(self) -> Walk {
        self.0
    }

    /// The split walk, which every placement runs.
    const SPLIT: ClearedWalk = ClearedWalk(Walk::Split);
}

/// The key to [`Backend::sequences_mut`]: only the backend module can make one, so the
/// lengths and capacities a backend's sequences hold change only through the engine API.
/// (Each backend still checks every row against the caches it holds before it writes them,
/// so not even a sequences table changed by other means can make it write past a cache.)
pub struct SeqsKey(());

/// What a pass of [`Backend::run_rows`] is: which composition it runs and which planted
/// defects apply to it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Pass {
    /// Prompt rows of one sequence, in the separate composition.
    Prompt,
    /// One row of the single-sequence path: the fused tier where the backend runs it.
    Single,
    /// A step of the batched path, one row per sequence, in the separate composition (the
    /// `batch-reduction` defect applies at two rows or more).
    Batched,
    /// A verify forward, in the batched path's composition (the `stage-column` defect
    /// applies).
    Verify,
}

/// Which composition a pass runs (DESIGN §7): the *separate* one (rmsnorm, then q8_1, every
/// scale inside the matvec) of prompts, the batched path and verify forwards, or the *fused*
/// tier of the single-sequence path (rmsnorm+quantize fused, the norm factor applied after).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Tier {
    Separate,
    Fused,
}

impl Tier {
    /// The composition of `pass` under `doors`: the fused tier for the single-sequence path
    /// where the doors allow it (`MEMRA_MMVQ` on, `MEMRA_NOFUSE_NORMQ` off), the separate one
    /// everywhere else.
    pub(crate) fn of(pass: Pass, doors: &Doors) -> Tier {
        if pass == Pass::Single && doors.mmvq && !doors.no_fuse_normq {
            Tier::Fused
        } else {
            Tier::Separate
        }
    }

    /// Its name in the doors row (`norm`) for the single-sequence path under `doors`.
    pub(crate) fn single_name(doors: &Doors) -> &'static str {
        match Tier::of(Pass::Single, doors) {
            Tier::Fused => "fused",
            Tier::Separate => "separate",
        }
    }
}

/// The engine API shared by the CPU and CUDA backends.
///
/// Logits come back row-major as `[rows, n_vocab]` f32. Sampled variants return one token per
/// row, drawn as [`crate::sampling::sample_token`] draws it, keyed by (seed, [`SeqId`], step),
/// where the step is the position the sampled token will take in its sequence.
///
/// A backend implements the accessors, [`Backend::open_sequence`] and
/// [`Backend::close_sequence`] (its caches) and [`Backend::run_rows`] (its arithmetic); every
/// other method is provided, walked once here, and a backend overrides one only to compute
/// the same thing its own way (the CUDA backend samples on the device).
pub trait Backend: Send {
    /// The model shape.
    fn config(&self) -> &LlamaConfig;

    /// The code paths this backend runs under its doors (DESIGN §5 `{"doors":…}` row).
    fn doors_report(&self) -> DoorsReport;

    /// Opens an empty sequence with room for `capacity` positions.
    fn open_sequence(&mut self, seq: SeqId, capacity: usize) -> Result<(), EngineError>;

    /// Closes a sequence and frees its caches.
    fn close_sequence(&mut self, seq: SeqId) -> Result<(), EngineError>;

    /// The sequences this backend holds, as the engine API sees them.
    fn sequences(&self) -> &Sequences;

    /// [`Backend::sequences`], to commit the positions a pass appended. Only the trait's
    /// provided methods can call it: a [`SeqsKey`] cannot be made outside the backend module
    /// (a wrapper forwards the one it is given).
    fn sequences_mut(&mut self, key: &SeqsKey) -> &mut Sequences;

    /// The stage plan the model was placed by (one stage when unsplit).
    fn stage_plan(&self) -> &stages::StagePlan;

    /// The doors this backend was opened with.
    fn doors(&self) -> &Doors;

    /// Computes `rows` (checked by [`Sequences`], every row's position reserved but not yet
    /// committed; the backend checks again that each row's sequence has caches with room for
    /// its position before anything runs) as one `pass` over `walk`, writing each row's K and
    /// V at its position, and
    /// returns the logits of the rows in `logits` (`[logits.len(), n_vocab]`). This is all a
    /// backend computes: the checks, the commits, the canary rule and the bookkeeping defects
    /// live above it, in the trait's provided methods and [`Sequences`]. A backend may refuse
    /// a walk it cannot run on its devices, before anything runs.
    fn run_rows(
        &mut self,
        walk: ClearedWalk,
        rows: &[RowSpec],
        pass: Pass,
        logits: Range<usize>,
    ) -> Result<Vec<f32>, EngineError>;

    /// Number of positions a sequence holds.
    fn seq_len(&self, seq: SeqId) -> Result<usize, EngineError> {
        self.sequences().len(seq)
    }

    /// Appends `tokens` to the sequence and returns the logits after every one of them:
    /// `[tokens.len(), n_vocab]`.
    fn prefill(&mut self, seq: SeqId, tokens: &[u32]) -> Result<Vec<f32>, EngineError> {
        let n_vocab = self.config().n_vocab;
        let rows = self
            .sequences()
            .prompt_rows(self.doors(), n_vocab, seq, tokens)?;
        let logits = self.run_rows(ClearedWalk::SPLIT, &rows, Pass::Prompt, 0..rows.len())?;
        let doors = self.doors().clone();
        self.sequences_mut(&SeqsKey(()))
            .commit_prompt(&doors, &rows);
        Ok(logits)
    }

    /// The lean prefill: appends `tokens` and fills the caches, computing logits only after
    /// the last token (`[n_vocab]`).
    fn prime(&mut self, seq: SeqId, tokens: &[u32]) -> Result<Vec<f32>, EngineError> {
        let n_vocab = self.config().n_vocab;
        let rows = self
            .sequences()
            .prompt_rows(self.doors(), n_vocab, seq, tokens)?;
        let last = rows.len() - 1..rows.len();
        let logits = self.run_rows(ClearedWalk::SPLIT, &rows, Pass::Prompt, last)?;
        let doors = self.doors().clone();
        self.sequences_mut(&SeqsKey(()))
            .commit_prompt(&doors, &rows);
        Ok(logits)
    }

    /// One decode step of one sequence on the single-sequence path: appends `token`,
    /// returns `[n_vocab]` logits.
    fn decode_step_h(&mut self, seq: SeqId, token: u32) -> Result<Vec<f32>, EngineError> {
        let n_vocab = self.config().n_vocab;
        let row = self
            .sequences()
            .single_row(self.doors(), n_vocab, seq, token)?;
        let logits = self.run_rows(ClearedWalk::SPLIT, &[row], Pass::Single, 0..1)?;
        self.sequences_mut(&SeqsKey(())).commit(seq, 1);
        Ok(logits)
    }

    /// Refuses the unsplit walk on a split placement ([`stages::StagePlan::unsplit_refusal`]),
    /// before any cache is touched, unless `MEMRA_PP_ALLOW_UNSPLIT_BATCH=1`; a walk that may
    /// run comes back cleared.
    /// A backend that cannot run a walk on its devices overrides this to refuse it as well,
    /// after [`clear_walk`].
    fn check_walk(&self, walk: Walk) -> Result<ClearedWalk, EngineError> {
        clear_walk(self.stage_plan(), self.doors(), walk)
    }

    /// One decode step of B sequences on the batched path: appends `tokens[b]` to `seqs[b]`,
    /// returns `[B, n_vocab]`. Row b is bit-identical to the same sequence run alone at B=1.
    fn decode_step_batch(
        &mut self,
        seqs: &[SeqId],
        tokens: &[u32],
    ) -> Result<Vec<f32>, EngineError> {
        self.decode_step_batch_walk(Walk::Split, seqs, tokens)
    }

    /// [`Backend::decode_step_batch`] over `walk`. [`Walk::Unsplit`] runs every layer in one
    /// walk, with no stage boundary: on an unsplit model it equals the split walk bit for
    /// bit; on a split placement it is refused ([`Backend::check_walk`]) unless
    /// `MEMRA_PP_ALLOW_UNSPLIT_BATCH=1`, and then walks the stage-owned weights and caches as
    /// one body (the pipeline gate's localizer). Under `MEMRA_SERVE_B1FAST=1` a split step of
    /// one row takes the single-sequence path ([`Backend::decode_step_h`]). Every row is
    /// checked ([`Sequences::batch_rows`]) before any cache moves.
    fn decode_step_batch_walk(
        &mut self,
        walk: Walk,
        seqs: &[SeqId],
        tokens: &[u32],
    ) -> Result<Vec<f32>, EngineError> {
        let walk = self.check_walk(walk)?;
        if walk.walk() == Walk::Split
            && seqs.len() == 1
            && tokens.len() == 1
            && self.doors().serve_b1fast
        {
            return self.decode_step_h(seqs[0], tokens[0]);
        }
        let n_vocab = self.config().n_vocab;
        let rows = self
            .sequences()
            .batch_rows(self.doors(), n_vocab, seqs, tokens)?;
        let logits = self.run_rows(walk, &rows, Pass::Batched, 0..rows.len())?;
        for &seq in seqs {
            self.sequences_mut(&SeqsKey(())).commit(seq, 1);
        }
        Ok(logits)
    }

    /// The verify forward of speculative decoding: appends `drafts[b]` (T_b ≥ 1 tokens: the
    /// last accepted token, then the draft) to `seqs[b]` in one pass and returns the logits
    /// after every appended position, sequence by sequence: `[ΣT_b, n_vocab]`. It runs the
    /// batched path's composition, so column j of sequence b is bit-identical to the logits
    /// [`Backend::decode_step_batch`] returns for the same token at the same position.
    /// Every row is checked ([`Sequences::verify_rows`]) before any cache moves; the
    /// positions stay appended until [`Backend::rewind`] drops the rejected ones.
    fn verify_batch(
        &mut self,
        seqs: &[SeqId],
        drafts: &[Vec<u32>],
    ) -> Result<Vec<f32>, EngineError> {
        self.verify_batch_walk(Walk::Split, seqs, drafts)
    }

    /// [`Backend::verify_batch`] over `walk`, the unsplit walk refused on a split placement
    /// like [`Backend::decode_step_batch_walk`]'s (the ppspec gate's localizer).
    fn verify_batch_walk(
        &mut self,
        walk: Walk,
        seqs: &[SeqId],
        drafts: &[Vec<u32>],
    ) -> Result<Vec<f32>, EngineError> {
        let walk = self.check_walk(walk)?;
        let n_vocab = self.config().n_vocab;
        let rows = self.sequences().verify_rows(n_vocab, seqs, drafts)?;
        let mut logits = self.run_rows(walk, &rows, Pass::Verify, 0..rows.len())?;
        for (&seq, d) in seqs.iter().zip(drafts) {
            self.sequences_mut(&SeqsKey(())).commit(seq, d.len());
        }
        let lens: Vec<usize> = drafts.iter().map(Vec::len).collect();
        verify_column_defect(self.doors(), &lens, &mut logits, n_vocab);
        Ok(logits)
    }

    /// Cuts `seq` back to its first `len` positions, as if the rest were never appended:
    /// later positions are written over and no attention reads past the length. Refused
    /// ([`EngineError::RewindPast`]) when `len` exceeds what the sequence holds.
    fn rewind(&mut self, seq: SeqId, len: usize) -> Result<(), EngineError> {
        let doors = self.doors().clone();
        self.sequences_mut(&SeqsKey(())).rewind(&doors, seq, len)
    }

    /// The `[B, n_vocab]` logits parked by the last [`Backend::decode_step_batch_sampled`]
    /// (the lean tick, which returns only tokens), bit-identical to what
    /// [`Backend::decode_step_batch`] returns for the same step.
    fn parked_logits(&self) -> Result<Vec<f32>, EngineError> {
        Err(EngineError::Unavailable(
            "this backend does not park the logits of a sampled step (parked_logits)".into(),
        ))
    }

    /// Starts recording an activation trace ([`trace::ActivationTrace`]): the q8_1 blocks
    /// of every quantization site of every later forward pass, for the tie-following oracle.
    /// Returns whether this backend can trace; the default cannot.
    fn start_trace(&mut self) -> bool {
        false
    }

    /// The trace recorded since [`Backend::start_trace`] or the last take, leaving an empty
    /// one recording; `None` when this backend is not tracing.
    fn take_trace(&mut self) -> Option<trace::ActivationTrace> {
        None
    }

    /// [`Backend::decode_step_h`], then one token from the host sampler under this
    /// backend's doors (the planted `top-p-cut` defect reaches it too).
    fn decode_step_h_sampled(
        &mut self,
        seq: SeqId,
        token: u32,
        params: &SamplingParams,
    ) -> Result<u32, EngineError> {
        let logits = self.decode_step_h(seq, token)?;
        let step = self.seq_len(seq)?;
        let nucleus = crate::sampling::nucleus(self.doors());
        crate::sampling::sample_token_with(&logits, params, seq, step, nucleus)
    }

    /// [`Backend::decode_step_batch_sampled_rows`] with the same parameters for every row.
    fn decode_step_batch_sampled(
        &mut self,
        seqs: &[SeqId],
        tokens: &[u32],
        params: &SamplingParams,
    ) -> Result<Vec<u32>, EngineError> {
        self.decode_step_batch_sampled_rows(seqs, tokens, &vec![*params; seqs.len()])
    }

    /// [`Backend::decode_step_batch`], then one token per row, row `b` chosen under
    /// `params[b]` (one set per row, so a batch may mix greedy and sampled rows). Row `b`'s
    /// token is the one the same sequence gets alone under `params[b]`. The parameters are
    /// checked ([`check_row_params`]) before any cache moves.
    fn decode_step_batch_sampled_rows(
        &mut self,
        seqs: &[SeqId],
        tokens: &[u32],
        params: &[SamplingParams],
    ) -> Result<Vec<u32>, EngineError> {
        check_row_params(seqs, params)?;
        let logits = self.decode_step_batch(seqs, tokens)?;
        host_sample_rows(self, seqs, params, &logits)
    }
}

/// One token per row of a batched step's `logits` (its positions committed), row `b` drawn
/// by the host sampler under `params[b]` and `be`'s doors, keyed by the position the token
/// will take. Under the test-only `sample-counter` defect the stream is keyed by the batch
/// row as well, and the `top-p-cut` defect reaches the nucleus.
pub(crate) fn host_sample_rows<B: Backend + ?Sized>(
    be: &B,
    seqs: &[SeqId],
    params: &[SamplingParams],
    logits: &[f32],
) -> Result<Vec<u32>, EngineError> {
    let doors = be.doors();
    let wrong_counter = doors.gate_defect == Some(GateDefect::SampleCounter);
    let nucleus = crate::sampling::nucleus(doors);
    seqs.iter()
        .zip(params)
        .zip(logits.chunks_exact(be.config().n_vocab))
        .enumerate()
        .map(|(b, ((&seq, p), row))| {
            let step = be.seq_len(seq)?;
            let counter = if wrong_counter { step + b } else { step };
            crate::sampling::sample_token_with(row, p, seq, counter, nucleus)
        })
        .collect()
}

/// The refusal of [`Backend::check_walk`]: the unsplit walk on a split placement, unless
/// `MEMRA_PP_ALLOW_UNSPLIT_BATCH=1`.
pub(crate) fn clear_walk(
    plan: &stages::StagePlan,
    doors: &Doors,
    walk: Walk,
) -> Result<ClearedWalk, EngineError> {
    if walk == Walk::Unsplit && plan.is_split() && !doors.pp_allow_unsplit_batch {
        return Err(EngineError::Unavailable(plan.unsplit_refusal()));
    }
    Ok(ClearedWalk(walk))
}

/// Refuses per-row sampling parameters that are not one valid set per sequence of the batch.
pub(crate) fn check_row_params(
    seqs: &[SeqId],
    params: &[SamplingParams],
) -> Result<(), EngineError> {
    if params.len() != seqs.len() {
        return Err(EngineError::BadSampling(format!(
            "{} sampling parameter sets for a batch of {} sequences: give one set per row",
            params.len(),
            seqs.len()
        )));
    }
    params.iter().try_for_each(SamplingParams::validate)
}

/// One row of a forward pass: which sequence, at which position, with which token (after
/// the canary rule). Built only by [`Sequences`], which checks it against the sequence's
/// capacity and the vocabulary when it is built, so a caller outside the engine can hand
/// [`Backend::run_rows`] only rows the engine made. A row can be kept and handed over again
/// later, when its sequence may be gone or smaller: [`Backend::run_rows`] checks every row
/// against the caches the backend holds before it writes any.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RowSpec {
    pub(crate) seq: SeqId,
    pub(crate) pos: usize,
    pub(crate) token: u32,
}

impl RowSpec {
    /// The sequence the row appends to.
    pub fn seq(&self) -> SeqId {
        self.seq
    }

    /// The position the row takes.
    pub fn pos(&self) -> usize {
        self.pos
    }

    /// The token it feeds.
    pub fn token(&self) -> u32 {
        self.token
    }
}

/// The test-only `verify-column` defect on a verify forward's logits (`[ΣT_b, n_vocab]`,
/// drafts of `lens`): every column after a sequence's first takes the column before it.
/// Shared by every backend so the defect reaches each alike.
fn verify_column_defect(doors: &Doors, lens: &[usize], logits: &mut [f32], n_vocab: usize) {
    if doors.gate_defect != Some(GateDefect::VerifyColumn) {
        return;
    }
    let mut start = 0;
    for &t in lens {
        for j in (1..t).rev() {
            let (a, b) = logits.split_at_mut((start + j) * n_vocab);
            b[..n_vocab].copy_from_slice(&a[(start + j - 1) * n_vocab..]);
        }
        start += t;
    }
}

/// Opens the backend the doors ask for: `cpu`; `cuda`, failing with what is missing when no
/// usable device is there; `auto`, the CUDA backend when a device and the CUDA libraries
/// are present and the CPU backend otherwise, saying so once per process on stderr.
pub fn open_backend(model: LlamaModel, doors: &Doors) -> Result<Box<dyn Backend>, EngineError> {
    let model = if doors.gate_defect == Some(GateDefect::WeightBlock) {
        plant_weight_block(model)
    } else {
        model
    };
    match doors.backend {
        BackendChoice::Cpu => Ok(Box::new(cpu::CpuBackend::new(model, doors.clone())?)),
        BackendChoice::Cuda => Ok(Box::new(
            cuda::CudaBackend::new(&model, doors.clone()).map_err(|e| match e {
                EngineError::Unavailable(why) => EngineError::Unavailable(format!(
                    "MEMRA_BACKEND=cuda: {why}; use MEMRA_BACKEND=cpu or auto to run on the CPU"
                )),
                other => other,
            })?,
        )),
        BackendChoice::Auto => match cuda::open_devices(doors) {
            Ok(gpus) => Ok(Box::new(cuda::CudaBackend::on_devices(
                gpus,
                &model,
                doors.clone(),
            )?)),
            Err(why) => {
                announce_cpu_fallback(&why);
                Ok(Box::new(cpu::CpuBackend::new(model, doors.clone())?))
            }
        },
    }
}

/// The rms epsilon a norm step uses: the model's, except under `MEMRA_GATE_DEFECT=fused-norm`,
/// where the fused tier (`fused`: rmsnorm+quantize with the factor as a post-op) takes 1.0.
/// Shared by every backend so the defect reaches each alike.
pub(crate) fn norm_eps(doors: &Doors, fused: bool, eps: f32) -> f32 {
    if fused && doors.gate_defect == Some(GateDefect::FusedNorm) {
        1.0
    } else {
        eps
    }
}

/// The planted defect of `MEMRA_GATE_DEFECT=weight-block`: the first block of row 0 of
/// layer 0's `ffn_down` scaled by −16 (a quantized block's `d`, and `m` for q4_1; the 32
/// values of a float block). One block of 32 weights out of the whole model: every backend
/// and path computes with it alike, so the gates that compare the engine with itself cannot
/// see it, and one that holds it to the exact model must.
pub fn plant_weight_block(mut model: LlamaModel) -> LlamaModel {
    use crate::model::WeightData;
    let Some(layer) = model.layers.first_mut() else {
        return model;
    };
    let k = half::f16::from_f32(-16.0);
    match &mut layer.w_down.data {
        WeightData::Q4_0(b) => b[0].d *= k,
        WeightData::Q4_1(b) => {
            b[0].d *= k;
            b[0].m *= k;
        }
        WeightData::Q8_0(b) => b[0].d *= k,
        WeightData::F32(v) => v[..32].iter_mut().for_each(|x| *x *= -16.0),
        WeightData::F16(v) => v[..32].iter_mut().for_each(|x| *x *= k),
        WeightData::BF16(v) => v[..32]
            .iter_mut()
            .for_each(|x| *x *= half::bf16::from_f32(-16.0)),
    }
    model
}

/// Prints the reason `MEMRA_BACKEND=auto` runs on the CPU, the first time only.
fn announce_cpu_fallback(why: &str) {
    static SAID: std::sync::Once = std::sync::Once::new();
    SAID.call_once(|| {
        eprintln!("memra-engine: MEMRA_BACKEND=auto: no usable GPU ({why}); running on the CPU");
    });
}

/// Where a token enters a sequence, for the canary rule ([`canary_token`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenSite {
    /// A prompt token (prefill or prime) taking position `pos`.
    Prompt { pos: usize },
    /// A token through the single-sequence path (`decode_step_h` and its sampled variant,
    /// also when `MEMRA_SERVE_B1FAST=1` routes a batched B=1 call there) taking position
    /// `pos` of a sequence whose last prompt ended at `prompt_end` (its length after its
    /// last prefill or prime).
    Single { pos: usize, prompt_end: usize },
    /// Row `row` of a batched step of `rows` rows (the split walk or the unsplit body).
    BatchRow { row: usize, rows: usize },
}

/// The planted plumbing defect of `MEMRA_GATE_CANARY=1` (a wrong token), shared by every
/// backend so gates catch it the same way everywhere. The token is replaced by the next
/// vocabulary id
/// - at position 1 of a prompt (so prompt-only programs such as reference-gate's prefill
///   see it),
/// - at one step of the single-sequence path, the first after a prompt (one wrong token at
///   one step, as the upstream design plants it: gate1, which runs the same primed prompts
///   through the single path and through the batched path at B=1, must see the two diverge
///   early on most draws from that one token; under `MEMRA_SERVE_B1FAST=1` both of its
///   sides take the single path and gate2 catches it instead),
/// - in the last row of every batched step with B ≥ 2 (so gate2, which runs the same
///   sequences alone at B=1 through the batched path, points at that row).
pub fn canary_token(doors: &Doors, token: u32, n_vocab: usize, site: TokenSite) -> u32 {
    let hit = match site {
        TokenSite::Prompt { pos } => pos == 1,
        TokenSite::Single { pos, prompt_end } => pos == prompt_end,
        TokenSite::BatchRow { row, rows } => rows >= 2 && row == rows - 1,
    };
    if doors.gate_canary && hit {
        ((token as usize + 1) % n_vocab) as u32
    } else {
        token
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_canary_hits_prompt_position_1_one_single_step_and_the_last_of_many_rows() {
        let on = Doors {
            gate_canary: true,
            ..Doors::default()
        };
        let hit = |site| canary_token(&on, 7, 8, site) != 7;
        assert!(hit(TokenSite::Prompt { pos: 1 }));
        assert!(!hit(TokenSite::Prompt { pos: 0 }) && !hit(TokenSite::Prompt { pos: 2 }));
        let single = |pos| TokenSite::Single { pos, prompt_end: 9 };
        assert!(hit(single(9)), "the first step after the prompt");
        assert!(!hit(single(10)) && !hit(single(8)), "no other step");
        assert!(hit(TokenSite::BatchRow { row: 3, rows: 4 }));
        assert!(!hit(TokenSite::BatchRow { row: 2, rows: 4 }));
        assert!(
            !hit(TokenSite::BatchRow { row: 0, rows: 1 }),
            "B=1 is gate1's reference"
        );
        assert_eq!(
            canary_token(&on, 7, 8, single(9)),
            0,
            "the next id, wrapped"
        );
        assert_eq!(canary_token(&Doors::default(), 7, 8, single(9)), 7);
    }
}
