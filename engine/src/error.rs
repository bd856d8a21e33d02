//! Why an engine call was refused: the one error type of the engine API, shared by the
//! backends, the sampler and the engine driver.
//!
//! This module owns the variants and their messages; deciding when a call is refused
//! belongs to the code that refuses it.

use crate::seq::SeqId;

/// Why an engine call was refused. Every message names the value and what to do.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum EngineError {
    #[error("{0} is already open; close it first or pick another id")]
    SequenceExists(SeqId),
    #[error("{0} is not open; open it with open_sequence first")]
    UnknownSequence(SeqId),
    #[error("{seq} appears twice in one batch; every batch row needs its own sequence")]
    DuplicateInBatch { seq: SeqId },
    #[error(
        "{seq} is full: it holds {len} of {capacity} positions and {adding} more were asked; \
         open it with a larger capacity"
    )]
    CacheFull {
        seq: SeqId,
        len: usize,
        capacity: usize,
        adding: usize,
    },
    #[error("cannot rewind {seq} to {to} positions: it holds {len}; a rewind only drops positions")]
    RewindPast { seq: SeqId, len: usize, to: usize },
    #[error("capacity {capacity} is outside 1..={n_ctx} (the model's context length)")]
    BadCapacity { capacity: usize, n_ctx: usize },
    #[error("token {token} is outside the vocabulary (n_vocab = {n_vocab})")]
    BadToken { token: u32, n_vocab: usize },
    #[error("batch has {seqs} sequences but {tokens} tokens; pass one token per sequence")]
    BatchShape { seqs: usize, tokens: usize },
    #[error("empty {what}: pass at least one token")]
    Empty { what: &'static str },
    #[error("bad sampling parameters: {0}")]
    BadSampling(String),
    #[error("{0}")]
    Unavailable(String),
    #[error("{0}")]
    Model(String),
}
