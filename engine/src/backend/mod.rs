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

use crate::doors::{BackendChoice, Doors, DoorsReport};
use crate::model::{LlamaConfig, LlamaModel};
use crate::sampling::SamplingParams;

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

    /// One decode step of B sequences on the batched path: appends `tokens[b]` to `seqs[b]`,
    /// returns `[B, n_vocab]`. Row b is bit-identical to the same sequence run alone at B=1.
    fn decode_step_batch(
        &mut self,
        seqs: &[SeqId],
        tokens: &[u32],
    ) -> Result<Vec<f32>, EngineError>;

    /// One decode step of B sequences through the unsplit batched body: every layer in one
    /// walk, with no stage boundary. On an unsplit model it equals
    /// [`Backend::decode_step_batch`] bit for bit. On a split placement it is refused with
    /// [`stages::StagePlan::unsplit_refusal`], before any cache is touched, unless
    /// `MEMRA_PP_ALLOW_UNSPLIT_BATCH=1`; then it walks the stage-owned weights and caches as
    /// one body (the pipeline gate's localizer).
    fn decode_step_batch_unsplit(
        &mut self,
        seqs: &[SeqId],
        tokens: &[u32],
    ) -> Result<Vec<f32>, EngineError> {
        let _ = (seqs, tokens);
        Err(EngineError::Unavailable(
            "this backend has no unsplit batched walk (decode_step_batch_unsplit)".into(),
        ))
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
/// ([`canary_token`]) applies to the last row of a batch of two or more.
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
        let last_of_many = seqs.len() >= 2 && b == seqs.len() - 1;
        let token = canary_token(doors, token, n_vocab, last_of_many);
        rows.push(RowSpec { seq, pos, token });
    }
    Ok(rows)
}

/// Opens the backend the doors ask for: `cpu`; `cuda`, failing with what is missing when no
/// usable device is there; `auto`, the CUDA backend when a device and the CUDA libraries
/// are present and the CPU backend otherwise, saying so once per process on stderr.
pub fn open_backend(model: LlamaModel, doors: &Doors) -> Result<Box<dyn Backend>, EngineError> {
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

/// Prints the reason `MEMRA_BACKEND=auto` runs on the CPU, the first time only.
fn announce_cpu_fallback(why: &str) {
    static SAID: std::sync::Once = std::sync::Once::new();
    SAID.call_once(|| {
        eprintln!("memra-engine: MEMRA_BACKEND=auto: no usable GPU ({why}); running on the CPU");
    });
}

/// The planted plumbing defect of `MEMRA_GATE_CANARY=1` (one wrong token), shared by every
/// backend so gates catch it the same way everywhere: the token a sequence receives at
/// position 1 through the single-sequence path or prefill, and the token of the last row of
/// a batched step with B ≥ 2, are replaced by the next vocabulary id.
pub fn canary_token(doors: &Doors, token: u32, n_vocab: usize, hit: bool) -> u32 {
    if doors.gate_canary && hit {
        ((token as usize + 1) % n_vocab) as u32
    } else {
        token
    }
}
