//! Token selection from a row of logits: greedy argmax (ties → lowest index) or temperature
//! (+ top-k, + top-p) sampling with a Philox4x32-10 stream keyed by (seed, sequence, step).
//!
//! This module owns the parameters, their validation and the keying rule; the arithmetic is
//! the kernel twin's (`memra_kernels::twin::{argmax, sample}`), so the CPU backend samples
//! exactly what the CUDA sampling kernel would. Temperature, top-k (the k most probable
//! tokens, ties at the k-th kept) and then the nucleus over what top-k kept are the whole
//! contract; `reference::sampler` is its independent restatement.

use memra_kernels::twin;

pub use memra_kernels::twin::Nucleus;

use crate::doors::{Doors, GateDefect};
use crate::error::EngineError;
use crate::seq::SeqId;

/// How the next token is chosen.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SamplingParams {
    /// 0 = greedy argmax; > 0 divides the logits before the softmax.
    pub temperature: f32,
    /// Keep the `top_k` most probable tokens (and any tied with the k-th) before the
    /// nucleus; 0, or at least the vocabulary, keeps every token.
    pub top_k: u32,
    /// Nucleus mass in (0, 1] of what top-k kept; 1 = no truncation.
    pub top_p: f32,
    /// Key of the Philox stream, together with the sequence id and the step.
    pub seed: u64,
}

impl SamplingParams {
    /// Greedy argmax.
    pub fn greedy() -> SamplingParams {
        SamplingParams {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            seed: 0,
        }
    }

    /// Checks the ranges, naming the bad value and the accepted range.
    pub fn validate(&self) -> Result<(), EngineError> {
        if !(self.temperature.is_finite() && self.temperature >= 0.0) {
            return Err(EngineError::BadSampling(format!(
                "temperature {} must be a finite number >= 0 (0 = greedy)",
                self.temperature
            )));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(EngineError::BadSampling(format!(
                "top-p {} must lie in (0, 1] (1 = no truncation)",
                self.top_p
            )));
        }
        Ok(())
    }
}

/// The token chosen from `logits` for sequence `seq` at `step` (the position the token will
/// take in its sequence). The same (seed, seq, step) and logits give the same token whatever
/// batch the sequence ran in.
pub fn sample_token(
    logits: &[f32],
    params: &SamplingParams,
    seq: SeqId,
    step: usize,
) -> Result<u32, EngineError> {
    sample_token_with(logits, params, seq, step, Nucleus::Exact)
}

/// The nucleus the backends' samplers keep under `doors`: the contract's, one token fewer at
/// the top-p cut under the planted `top-p-cut` defect, one more at the top-k cut under
/// `top-k-cut`, exactly k (ties at the cut dropped) under `top-k-ties`.
pub fn nucleus(doors: &Doors) -> Nucleus {
    match doors.gate_defect {
        Some(GateDefect::TopPCut) => Nucleus::OneEarly,
        Some(GateDefect::TopKCut) => Nucleus::KOneMore,
        Some(GateDefect::TopKTies) => Nucleus::KDropTies,
        _ => Nucleus::Exact,
    }
}

/// [`sample_token`] with a choice of nucleus (the backends pass [`nucleus`] of their doors).
pub fn sample_token_with(
    logits: &[f32],
    params: &SamplingParams,
    seq: SeqId,
    step: usize,
    nucleus: Nucleus,
) -> Result<u32, EngineError> {
    params.validate()?;
    if logits.is_empty() {
        return Err(EngineError::Empty { what: "logits row" });
    }
    if params.temperature == 0.0 {
        return Ok(twin::argmax(logits));
    }
    Ok(twin::sample_with(
        logits,
        params.temperature,
        params.top_k,
        params.top_p,
        params.seed,
        seq.0,
        step as u32,
        nucleus,
    ))
}
