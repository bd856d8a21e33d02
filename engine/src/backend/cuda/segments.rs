//! The pipeline stages of a pass grouped into segments (consecutive stages on one device,
//! the unit of a captured graph and of a stream), the two walks over them, and the
//! hand-over of the residual stream between segments on different devices.
//!
//! This module owns the shape of a walk and the boundary between devices; the launches
//! inside a segment, including the same-device boundary copies, are [`super::step`].

use std::ops::Range;

use memra_kernels::cuda::{Fence, copy_peer};

use super::PassCtx;
use super::device::{Scratch, kernel_err};
use crate::error::EngineError;

/// Consecutive stages on one device: the unit of a captured graph and of a stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Segment {
    pub(super) stages: Range<usize>,
    pub(super) slot: usize,
}

/// Groups consecutive stages with the same slot (`stage_slot[s]`) into segments.
pub(super) fn segments(stage_slot: &[usize]) -> Vec<Segment> {
    let mut out: Vec<Segment> = Vec::new();
    for (s, &slot) in stage_slot.iter().enumerate() {
        match out.last_mut() {
            Some(seg) if seg.slot == slot => seg.stages.end = s + 1,
            _ => out.push(Segment {
                stages: s..s + 1,
                slot,
            }),
        }
    }
    out
}

/// The events of one boundary between segments on different devices.
pub(super) struct Handoff {
    /// On the receiving device: recorded before the copy, so the copy waits until the
    /// receiver's earlier work (the previous pass over its stage buffers) is done.
    pub(super) ready: Fence,
    /// On the sending device: recorded after the copy; the receiver waits for it.
    pub(super) copied: Fence,
}

/// Hands the residual stream of segment `from` (its last stage's output) to the first stage
/// of segment `to` on another device, eagerly between the two segments' launches:
///
/// 1. the receiver records `ready`, and the sender waits for it: the receiver's earlier
///    work, which may still read the stage buffers about to be overwritten, comes first;
/// 2. the sender copies `x` (and the pending `delta` once a layer ran) into the receiving
///    stage's buffers with a peer copy queued after the sending segment on its own stream;
/// 3. the sender records `copied`, and the receiver waits for it before its segment.
///
/// Under the boundary-copy defect the copies are left out but the events stay, so the
/// receiving stage runs on whatever its buffers held while the pass still ends, as ever,
/// on the head's stream after every earlier segment.
pub(super) fn hand_over(
    ctx: &PassCtx,
    handoff: &Handoff,
    from: &Segment,
    to: &Segment,
    slots: &mut [Scratch],
) -> Result<(), EngineError> {
    let (src_gpu, dst_gpu) = (&ctx.dm.gpus[from.slot], &ctx.dm.gpus[to.slot]);
    let (last, first) = (from.stages.end - 1, to.stages.start);
    let (src, dst) = pair_mut(slots, from.slot, to.slot).ok_or_else(|| {
        EngineError::Model(format!(
            "stage {last} and stage {first} are on the same device slot {}, yet in different \
             segments",
            from.slot
        ))
    })?;
    let missing = |stage: usize| {
        EngineError::Model(format!(
            "stage {stage} has no residual buffers on its device ({} stages)",
            ctx.stages.len()
        ))
    };
    let (sx, sd) = src.stream_after(last).ok_or_else(|| missing(last))?;
    let (dx, dd) = dst
        .stage_bufs
        .get_mut(first)
        .and_then(Option::as_mut)
        .ok_or_else(|| missing(first))?;
    let m = ctx.boundary_rows * ctx.dm.config.n_embd;
    handoff.ready.record(dst_gpu).map_err(kernel_err)?;
    handoff.ready.wait(src_gpu).map_err(kernel_err)?;
    if !ctx.skip_boundary_copy {
        copy_peer(src_gpu, &sx.slice(..m), dst_gpu, &mut dx.slice_mut(..m)).map_err(kernel_err)?;
        if ctx.walked_before(first) {
            copy_peer(src_gpu, &sd.slice(..m), dst_gpu, &mut dd.slice_mut(..m))
                .map_err(kernel_err)?;
        }
    }
    handoff.copied.record(src_gpu).map_err(kernel_err)?;
    handoff.copied.wait(dst_gpu).map_err(kernel_err)
}

/// `&v[a]` and `&mut v[b]` for `a != b`.
fn pair_mut<T>(v: &mut [T], a: usize, b: usize) -> Option<(&T, &mut T)> {
    if a == b || a >= v.len() || b >= v.len() {
        return None;
    }
    if a < b {
        let (lo, hi) = v.split_at_mut(b);
        Some((&lo[a], &mut hi[0]))
    } else {
        let (lo, hi) = v.split_at_mut(a);
        Some((&hi[0], &mut lo[b]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cuda::Placement;
    use crate::backend::stages::StagePlan;
    use crate::doors::Doors;

    fn seg(stages: Range<usize>, slot: usize) -> Segment {
        Segment { stages, slot }
    }

    #[test]
    fn consecutive_stages_on_one_device_form_one_segment() {
        // One device: today's single graph.
        assert_eq!(segments(&[0, 0, 0]), vec![seg(0..3, 0)]);
        assert_eq!(segments(&[0]), vec![seg(0..1, 0)]);
        assert_eq!(segments(&[0, 1]), vec![seg(0..1, 0), seg(1..2, 1)]);
        assert_eq!(segments(&[0, 0, 1, 1]), vec![seg(0..2, 0), seg(2..4, 1)]);
        // A device that comes back later is a new segment on the same slot.
        assert_eq!(
            segments(&[0, 1, 0]),
            vec![seg(0..1, 0), seg(1..2, 1), seg(2..3, 0)]
        );
    }

    #[test]
    fn segments_follow_the_placement_of_a_plan() {
        let doors = Doors {
            pp_stages: 4,
            pp_devices: vec![1, 1, 0, 0],
            ..Doors::default()
        };
        let plan = StagePlan::from_doors(&doors, 8).unwrap();
        let p = Placement::of(&plan);
        assert_eq!(p.ordinals, vec![1, 0]);
        assert_eq!(segments(&p.stage_slot), vec![seg(0..2, 0), seg(2..4, 1)]);
    }

    #[test]
    fn pair_mut_refuses_one_slot_twice() {
        let mut v = vec![1, 2, 3];
        assert!(pair_mut(&mut v, 1, 1).is_none());
        assert!(pair_mut(&mut v, 0, 3).is_none());
        let (a, b) = pair_mut(&mut v, 2, 0).unwrap();
        *b += *a;
        let (a, b) = pair_mut(&mut v, 0, 1).unwrap();
        *b += *a;
        assert_eq!(v, vec![4, 6, 3]);
    }
}
