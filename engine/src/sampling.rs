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
/// The arithmetic the engine selects tokens with, for whoever holds it to an independent
/// reference (the gates): greedy argmax, and the Philox stream and the uniform draw made
/// from it.
pub use memra_kernels::twin::{argmax, draw_uniform, philox4x32_10, uniform_from_philox};

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

/// [`sample_token_with`] for many draws from one row: the row's preparation (softmax, cuts
/// and kept sums) done once, each [`PreparedRow::draw`] the token [`sample_token_with`]
/// gives for the same row, parameters, sequence and step (it is the same routine split in
/// two: `twin::sample_with` is `Prepared::from_row` then `pick`).
pub struct PreparedRow {
    prepared: twin::Prepared,
    seed: u64,
}

impl PreparedRow {
    /// Prepares `logits` under `params` keeping `nucleus`.
    pub fn new(
        logits: &[f32],
        params: &SamplingParams,
        nucleus: Nucleus,
    ) -> Result<PreparedRow, EngineError> {
        params.validate()?;
        if logits.is_empty() {
            return Err(EngineError::Empty { what: "logits row" });
        }
        Ok(PreparedRow {
            prepared: twin::Prepared::from_row(
                logits,
                params.temperature,
                params.top_k,
                params.top_p,
                nucleus,
            ),
            seed: params.seed,
        })
    }

    /// The token drawn for sequence `seq` at `step`.
    pub fn draw(&self, seq: SeqId, step: usize) -> u32 {
        self.prepared
            .pick(twin::draw_uniform(self.seed, seq.0, step as u32))
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A prepared row draws the tokens `sample_token_with` gives, step by step, under every
    /// nucleus and truncation, ties at the cuts included.
    #[test]
    fn a_prepared_row_draws_what_sample_token_with_draws() {
        let mut row: Vec<f32> = (0..3000u32)
            .map(|i| ((i.wrapping_mul(2_654_435_761) >> 16) % 1000) as f32 / 97.0)
            .collect();
        row[17] = row[5];
        let nuclei = [
            Nucleus::Exact,
            Nucleus::OneEarly,
            Nucleus::KOneMore,
            Nucleus::KDropTies,
        ];
        for (temperature, top_k, top_p) in
            [(1.0, 0, 1.0), (0.7, 40, 0.9), (1.3, 8, 0.2), (0.0, 0, 1.0)]
        {
            let p = SamplingParams {
                temperature,
                top_k,
                top_p,
                seed: 1 << 33,
            };
            for nucleus in nuclei {
                let prepared = PreparedRow::new(&row, &p, nucleus).unwrap();
                for step in 0..300 {
                    let want = sample_token_with(&row, &p, SeqId(3), step, nucleus).unwrap();
                    assert_eq!(
                        prepared.draw(SeqId(3), step),
                        want,
                        "{p:?} {nucleus:?} {step}"
                    );
                }
            }
        }
        assert!(PreparedRow::new(&[], &SamplingParams::greedy(), Nucleus::Exact).is_err());
    }
}
