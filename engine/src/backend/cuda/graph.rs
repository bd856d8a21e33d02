//! CUDA graphs of the decode step: a captured segment of a pass, the key it is replayed
//! under, and the capture itself.
//!
//! This module owns capturing and what a graph depends on; which launches a graph holds is
//! [`super::step::encode`], and when the backend replays or recaptures is
//! [`super::CudaBackend`]'s.

use cudarc::driver::{CudaGraph, sys};

use super::device::{Scratch, device_err, kernel_err};
use super::segments::Segment;
use super::step::encode;
use super::tap::Tap;
use super::{PassCtx, Tier};
use crate::backend::Walk;
use crate::error::EngineError;

/// A captured decode step.
pub(super) struct Graph(pub(super) CudaGraph);

// SAFETY: a CudaGraph holds raw driver handles that must not be used from two threads at
// once. The backend owns its graphs outright and touches them only through `&mut self`, so
// moving the backend to another thread moves them with it and never shares them.
unsafe impl Send for Graph {}

/// What a captured graph depends on besides buffer addresses: the rows, the composition and
/// the split-K grid (a power of two of chunks, so a growing sequence recaptures rarely), and
/// the walk (a split graph holds the boundary copies an unsplit one lacks). Each key holds
/// one graph per segment of the walk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) struct GraphKey {
    pub(super) rows: usize,
    pub(super) tier: Tier,
    pub(super) chunks: usize,
    pub(super) walk: Walk,
    /// Whether the attention launches do the RoPE and KV store ([`PassCtx::fuse_rope`]): a
    /// graph captured with the separate `rope_store_rows` launch never replays for a pass
    /// that may skip it, nor the other way round.
    pub(super) fuse_rope: bool,
    /// Whether the head holds the test-only reversed norm launch
    /// ([`PassCtx::reversed_head_norm`]): a graph replays only for passes that want the
    /// launches it was captured with.
    pub(super) reversed_head_norm: bool,
    /// The rows each boundary copy moves ([`PassCtx::boundary_rows`]): fewer than `rows`
    /// only under the test-only `stage-column` defect of a verify pass.
    pub(super) boundary_rows: usize,
}

/// Captures the launches of segment `k` of one pass as a graph on its device's stream.
pub(super) fn capture(
    ctx: &PassCtx,
    k: usize,
    seg: &Segment,
    s: &mut Scratch,
) -> Result<Graph, EngineError> {
    let stream = ctx.dm.gpus[seg.slot].stream();
    stream
        .begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED)
        .map_err(|e| device_err("starting the graph capture", e))?;
    // A captured graph records nothing: tracing passes never capture.
    let encoded = encode(ctx, k, seg, s, &mut Tap::off());
    // End the capture whatever happened, so the stream is usable again.
    let ended = stream.end_capture(sys::CUgraphInstantiate_flags(0));
    encoded.map_err(kernel_err)?;
    match ended {
        Ok(Some(g)) => Ok(Graph(g)),
        Ok(None) => Err(EngineError::Unavailable(
            "the decode graph capture recorded nothing".into(),
        )),
        Err(e) => Err(device_err("instantiating the decode graph", e)),
    }
}
