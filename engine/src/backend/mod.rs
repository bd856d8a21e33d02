//! The engine API every backend implements (DESIGN §7): sequences with their own KV caches,
//! prompt prefill, single-sequence decode (`decode_step_h`), batched decode
//! (`decode_step_batch`) and their sampled variants, the batched one with sampling
//! parameters per row (`decode_step_batch_sampled_rows`).
//!
//! This module owns the contract (the [`Backend`] trait, the row and batch rules, the
//! canary rule) and backend selection from the doors. The sequence identity and the error
//! type live below it, in `crate::seq` and `crate::error`, so the sampler can use them
//! without importing the backends; they are re-exported here as part of the API. *How* a
//! step is computed belongs to each backend: [`cpu`] builds it from the kernel twins; the
//! CUDA backend from the kernels.

pub mod cpu;
pub mod cuda;
pub mod stages;
pub mod trace;

pub use crate::error::EngineError;
pub use crate::seq::SeqId;

use crate::doors::{BackendChoice, Doors, DoorsReport, GateDefect};
use crate::model::{LlamaConfig, LlamaModel};
use crate::sampling::SamplingParams;

/// How a batched pass walks a pipeline placement (`MEMRA_PP_STAGES`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Walk {
    /// Stage by stage, each stage after the first on its own buffers, filled by a boundary
    /// copy from the previous stage's.
    Split,
    /// Every stage-owned layer in order on one body's buffers, no boundary.
    Unsplit,
}

/// A [`Walk`] that [`Backend::check_walk`] let through. Only the backend module (and the
/// backends inside it) can build one, so a caller outside reaches [`Backend::batch_pass`] and
/// [`Backend::verify_pass`], which take it, only with a walk some backend's `check_walk`
/// cleared: the refusal lives once, above the backends. The token does not name its backend;
/// hand a pass only the one its own `check_walk` returned, as the trait's provided methods do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClearedWalk(Walk);

impl ClearedWalk {
    /// The walk that was cleared.
    pub fn walk(self) -> Walk {
        self.0
    }
}

/// The engine API shared by the CPU and CUDA backends.
///
/// Logits come back row-major as `[rows, n_vocab]` f32. Sampled variants return one token per
/// row, drawn by [`crate::sampling::sample_token`] keyed by (seed, [`SeqId`], step), where the
/// step is the position the sampled token will take in its sequence.
pub trait Backend: Send {
    /// The model shape.
    fn config(&self) -> &LlamaConfig;

    /// The code paths this backend runs under its doors (DESIGN §5 `{"doors":…}` row).
    fn doors_report(&self) -> DoorsReport;

    /// Opens an empty sequence with room for `capacity` positions.
    fn open_sequence(&mut self, seq: SeqId, capacity: usize) -> Result<(), EngineError>;

    /// Closes a sequence and frees its caches.
    fn close_sequence(&mut self, seq: SeqId) -> Result<(), EngineError>;

    /// Number of positions a sequence holds.
    fn seq_len(&self, seq: SeqId) -> Result<usize, EngineError>;

    /// Appends `tokens` to the sequence and returns the logits after every one of them:
    /// `[tokens.len(), n_vocab]`.
    fn prefill(&mut self, seq: SeqId, tokens: &[u32]) -> Result<Vec<f32>, EngineError>;

    /// The lean prefill: appends `tokens` and fills the caches, computing logits only after
    /// the last token (`[n_vocab]`).
    fn prime(&mut self, seq: SeqId, tokens: &[u32]) -> Result<Vec<f32>, EngineError>;

    /// One decode step of one sequence on the single-sequence path: appends `token`,
    /// returns `[n_vocab]` logits.
    fn decode_step_h(&mut self, seq: SeqId, token: u32) -> Result<Vec<f32>, EngineError>;

    /// The stage plan the model was placed by (one stage when unsplit).
    fn stage_plan(&self) -> &stages::StagePlan;

    /// The doors this backend was opened with.
    fn doors(&self) -> &Doors;

    /// The batched decode pass over `walk`, for [`Backend::decode_step_batch_walk`]:
    /// backends compute, and the refusal of the unsplit walk lives once, in
    /// [`Backend::check_walk`], the only source of a [`ClearedWalk`].
    fn batch_pass(
        &mut self,
        walk: ClearedWalk,
        seqs: &[SeqId],
        tokens: &[u32],
    ) -> Result<Vec<f32>, EngineError>;

    /// The verify pass over `walk`, for [`Backend::verify_batch_walk`].
    fn verify_pass(
        &mut self,
        walk: ClearedWalk,
        seqs: &[SeqId],
        drafts: &[Vec<u32>],
    ) -> Result<Vec<f32>, EngineError>;

    /// Refuses the unsplit walk on a split placement ([`stages::StagePlan::unsplit_refusal`]),
    /// before any cache is touched, unless `MEMRA_PP_ALLOW_UNSPLIT_BATCH=1`; a walk that may
    /// run comes back cleared.
    fn check_walk(&self, walk: Walk) -> Result<ClearedWalk, EngineError> {
        let plan = self.stage_plan();
        if walk == Walk::Unsplit && plan.is_split() && !self.doors().pp_allow_unsplit_batch {
            return Err(EngineError::Unavailable(plan.unsplit_refusal()));
        }
        Ok(ClearedWalk(walk))
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
    /// one body (the pipeline gate's localizer).
    fn decode_step_batch_walk(
        &mut self,
        walk: Walk,
        seqs: &[SeqId],
        tokens: &[u32],
    ) -> Result<Vec<f32>, EngineError> {
        let walk = self.check_walk(walk)?;
        self.batch_pass(walk, seqs, tokens)
    }

    /// The verify forward of speculative decoding: appends `drafts[b]` (T_b ≥ 1 tokens: the
    /// last accepted token, then the draft) to `seqs[b]` in one pass and returns the logits
    /// after every appended position, sequence by sequence: `[ΣT_b, n_vocab]`. It runs the
    /// batched path's composition, so column j of sequence b is bit-identical to the logits
    /// [`Backend::decode_step_batch`] returns for the same token at the same position.
    /// Every row is checked ([`verify_rows`]) before any cache moves; the positions stay
    /// appended until [`Backend::rewind`] drops the rejected ones.
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
        self.verify_pass(walk, seqs, drafts)
    }

    /// Cuts `seq` back to its first `len` positions, as if the rest were never appended:
    /// later positions are written over and no attention reads past the length. Refused
    /// ([`EngineError::RewindPast`]) when `len` exceeds what the sequence holds.
    fn rewind(&mut self, seq: SeqId, len: usize) -> Result<(), EngineError>;

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

    /// [`Backend::decode_step_h`], then one sampled token.
    fn decode_step_h_sampled(
        &mut self,
        seq: SeqId,
        token: u32,
        params: &SamplingParams,
    ) -> Result<u32, EngineError> {
        let logits = self.decode_step_h(seq, token)?;
        let step = self.seq_len(seq)?;
        crate::sampling::sample_token(&logits, params, seq, step)
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
        let n_vocab = self.config().n_vocab;
        seqs.iter()
            .zip(params)
            .zip(logits.chunks_exact(n_vocab))
            .map(|((&seq, p), row)| {
                let step = self.seq_len(seq)?;
                crate::sampling::sample_token(row, p, seq, step)
            })
            .collect()
    }
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

/// One row of a forward pass: which sequence, at which position, with which token. Shared by
/// the backends so both read a batch the same way.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RowSpec {
    pub(crate) seq: SeqId,
    pub(crate) pos: usize,
    pub(crate) token: u32,
}

/// Refuses a token outside the vocabulary.
pub(crate) fn check_token(token: u32, n_vocab: usize) -> Result<(), EngineError> {
    if (token as usize) < n_vocab {
        Ok(())
    } else {
        Err(EngineError::BadToken { token, n_vocab })
    }
}

/// Room for `adding` more positions in `seq`, which holds `len` of `capacity`: the first new
/// position, or why there is none. Looking the sequence up is the backend's.
pub(crate) fn reserve_positions(
    seq: SeqId,
    len: usize,
    capacity: usize,
    adding: usize,
) -> Result<usize, EngineError> {
    if len + adding > capacity {
        return Err(EngineError::CacheFull {
            seq,
            len,
            capacity,
            adding,
        });
    }
    Ok(len)
}

/// The rows of one batched decode step, validated before any cache moves: one token per
/// sequence, no sequence twice, every token in the vocabulary, and room in every cache
/// (`reserve(seq)` returns the position the row takes, or why it cannot). The canary rule
/// ([`canary_token`]) applies to each row as a [`TokenSite::BatchRow`].
pub(crate) fn batch_rows(
    seqs: &[SeqId],
    tokens: &[u32],
    doors: &Doors,
    n_vocab: usize,
    reserve: impl Fn(SeqId) -> Result<usize, EngineError>,
) -> Result<Vec<RowSpec>, EngineError> {
    if seqs.len() != tokens.len() {
        return Err(EngineError::BatchShape {
            seqs: seqs.len(),
            tokens: tokens.len(),
        });
    }
    if seqs.is_empty() {
        return Err(EngineError::Empty { what: "batch" });
    }
    let mut rows = Vec::with_capacity(seqs.len());
    for (b, (&seq, &token)) in seqs.iter().zip(tokens).enumerate() {
        check_token(token, n_vocab)?;
        if seqs[..b].contains(&seq) {
            return Err(EngineError::DuplicateInBatch { seq });
        }
        let pos = reserve(seq)?;
        let site = TokenSite::BatchRow {
            row: b,
            rows: seqs.len(),
        };
        let token = canary_token(doors, token, n_vocab, site);
        rows.push(RowSpec { seq, pos, token });
    }
    Ok(rows)
}

/// The rows of one verify forward, validated before any cache moves: one draft per
/// sequence, no sequence twice, no empty draft, every token in the vocabulary, and room in
/// every cache (`reserve(seq, n)` returns the first of `n` positions, or why there are
/// none). Rows go sequence by sequence, each draft's positions in order. Verify rows are no
/// canary site ([`canary_token`]): the plumbing canary belongs to the prompt and decode
/// paths.
pub(crate) fn verify_rows(
    seqs: &[SeqId],
    drafts: &[Vec<u32>],
    n_vocab: usize,
    reserve: impl Fn(SeqId, usize) -> Result<usize, EngineError>,
) -> Result<Vec<RowSpec>, EngineError> {
    if seqs.len() != drafts.len() {
        return Err(EngineError::BatchShape {
            seqs: seqs.len(),
            tokens: drafts.len(),
        });
    }
    if seqs.is_empty() {
        return Err(EngineError::Empty {
            what: "verify batch",
        });
    }
    let mut rows = Vec::with_capacity(drafts.iter().map(Vec::len).sum());
    for (b, (&seq, draft)) in seqs.iter().zip(drafts).enumerate() {
        if seqs[..b].contains(&seq) {
            return Err(EngineError::DuplicateInBatch { seq });
        }
        if draft.is_empty() {
            return Err(EngineError::Empty {
                what: "verify draft",
            });
        }
        for &t in draft {
            check_token(t, n_vocab)?;
        }
        let start = reserve(seq, draft.len())?;
        rows.extend(draft.iter().enumerate().map(|(i, &token)| RowSpec {
            seq,
            pos: start + i,
            token,
        }));
    }
    Ok(rows)
}

/// The length a rewind of `seq` (holding `len`) to `to` leaves: `to`, or why not. Under
/// the test-only `rewind-slot` defect a rewind that drops anything keeps one rejected slot.
/// Shared by every backend so the defect reaches each alike.
pub(crate) fn rewind_len(
    doors: &Doors,
    seq: SeqId,
    len: usize,
    to: usize,
) -> Result<usize, EngineError> {
    if to > len {
        return Err(EngineError::RewindPast { seq, len, to });
    }
    if to < len && doors.gate_defect == Some(GateDefect::RewindSlot) {
        return Ok(to + 1);
    }
    Ok(to)
}

/// The test-only `verify-column` defect on a verify forward's logits (`[ΣT_b, n_vocab]`,
/// drafts of `lens`): every column after a sequence's first takes the column before it.
/// Shared by every backend so the defect reaches each alike.
pub(crate) fn verify_column_defect(
    doors: &Doors,
    lens: &[usize],
    logits: &mut [f32],
    n_vocab: usize,
) {
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

/// How many of a prompt's `rows` positions a backend commits to the sequence: all of them,
/// except under `MEMRA_GATE_DEFECT=chunk-cache`, where a prompt that continues the sequence
/// (its first row is not position 0) commits one too few. Shared by every backend so the
/// defect reaches each alike.
pub(crate) fn prompt_commit(doors: &Doors, rows: &[RowSpec]) -> usize {
    let continues = rows.first().is_some_and(|r| r.pos > 0);
    if continues && rows.len() > 1 && doors.gate_defect == Some(GateDefect::ChunkCache) {
        rows.len() - 1
    } else {
        rows.len()
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
