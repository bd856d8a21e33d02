//! The identity of a sequence, shared by the engine API, the backends and the sampler.
//!
//! This module owns only the identifier and how it prints; what a sequence holds (its
//! length, its KV caches) belongs to each backend.

use std::fmt;

/// The identity of a sequence. The caller picks it, and it keys the sampler's Philox stream,
/// so a sequence samples the same tokens whichever batch it runs in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SeqId(pub u32);

impl fmt::Display for SeqId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "sequence {}", self.0)
    }
}
