//! The pipeline stage plan, shared by every backend: which layers each stage owns, on which
//! device it lives, and the rules a split placement obeys (DESIGN §7, `MEMRA_PP_*`).
//!
//! This module owns the load-time decision (from the doors and the layer count), the exact
//! refusal of an unsplit walk over a split placement, and the test-only `stage-range`
//! defect. It holds no weights and computes nothing: each backend places its stages' weights
//! and KV caches where the plan says and performs the boundary copies itself.

use std::fmt;
use std::ops::Range;

use crate::doors::{Doors, GateDefect};

/// One stage of a plan: its layers and its device ordinal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StageSpec {
    pub layers: Range<usize>,
    pub device: usize,
}

/// The split of a model's layers into pipeline stages, decided once at load time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StagePlan {
    pub stages: Vec<StageSpec>,
    pub n_layer: usize,
}

impl StagePlan {
    /// The plan the doors ask for over `n_layer` layers: `MEMRA_PP_STAGES` stages cut at
    /// `MEMRA_PP_SPLITS` (else evenly), stage `s` on device `MEMRA_PP_DEVICES[s]`. Errors
    /// name the pin that does not fit the model.
    ///
    /// Under the test-only `stage-range` defect every stage after the first starts one layer
    /// late, so the layer at each cut is owned by no stage.
    pub fn from_doors(doors: &Doors, n_layer: usize) -> Result<StagePlan, String> {
        let mut ranges = doors.stage_ranges(n_layer)?;
        if doors.pp_devices.len() != ranges.len() {
            return Err(format!(
                "MEMRA_PP_DEVICES={:?} names {} devices for {} stages; give one device \
                 ordinal per stage",
                join(&doors.pp_devices),
                doors.pp_devices.len(),
                ranges.len()
            ));
        }
        if doors.gate_defect == Some(GateDefect::StageRange) {
            for r in ranges.iter_mut().skip(1) {
                r.start = (r.start + 1).min(r.end);
            }
        }
        Ok(StagePlan {
            stages: ranges
                .into_iter()
                .zip(&doors.pp_devices)
                .map(|(layers, &device)| StageSpec { layers, device })
                .collect(),
            n_layer,
        })
    }

    /// Whether the layers are split across more than one stage.
    pub fn is_split(&self) -> bool {
        self.stages.len() > 1
    }

    /// The first layer of every stage, comma-separated (the doors row's `pp_splits`).
    pub fn splits_text(&self) -> String {
        join(
            &self
                .stages
                .iter()
                .map(|s| s.layers.start)
                .collect::<Vec<_>>(),
        )
    }

    /// The device of every stage, comma-separated (the doors row's `pp_devices`).
    pub fn devices_text(&self) -> String {
        join(&self.stages.iter().map(|s| s.device).collect::<Vec<_>>())
    }

    /// The refusal every backend returns, word for word, when the unsplit batched body is
    /// asked to walk this split placement without `MEMRA_PP_ALLOW_UNSPLIT_BATCH=1`. The
    /// refusal happens before anything runs, so no cache is touched.
    pub fn unsplit_refusal(&self) -> String {
        format!(
            "refused: the unsplit batched body cannot walk a split placement ({self}); it \
             would skip the stage boundary copies. Run decode_step_batch (the split walk), or \
             set MEMRA_PP_ALLOW_UNSPLIT_BATCH=1 to walk the body over the stage-owned \
             weights anyway (the pipeline gate's localizer does); no cache was touched"
        )
    }
}

impl fmt::Display for StagePlan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} stages:", self.stages.len())?;
        for (i, s) in self.stages.iter().enumerate() {
            write!(
                f,
                " [{i}] layers {}..{} on device {}",
                s.layers.start, s.layers.end, s.device
            )?;
        }
        Ok(())
    }
}

/// The exact `[rows, n_embd]` hand-over from one stage to the next: the next stage's input
/// buffer becomes a bitwise copy of the previous stage's output. A backend with stages on
/// several devices does the same with a peer copy.
pub fn boundary_copy(from: &[f32], to: &mut Vec<f32>) {
    to.clear();
    to.extend_from_slice(from);
}

fn join(v: &[usize]) -> String {
    v.iter()
        .map(|x| x.to_string())
        .collect::<Vec<_>>()
        .join(",")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::doors::PpSplits;

    fn doors(stages: usize, splits: PpSplits, defect: Option<GateDefect>) -> Doors {
        Doors {
            pp_stages: stages,
            pp_devices: (0..stages).rev().collect(),
            pp_splits: splits,
            gate_defect: defect,
            ..Doors::default()
        }
    }

    #[test]
    fn plan_covers_every_layer_once_with_its_device() {
        let plan = StagePlan::from_doors(&doors(3, PpSplits::Cuts(vec![1, 3]), None), 4).unwrap();
        let layers: Vec<_> = plan.stages.iter().map(|s| s.layers.clone()).collect();
        assert_eq!(layers, vec![0..1, 1..3, 3..4]);
        assert_eq!(plan.devices_text(), "2,1,0");
        assert_eq!(plan.splits_text(), "0,1,3");
        assert!(plan.is_split());
        assert!(
            !StagePlan::from_doors(&Doors::default(), 4)
                .unwrap()
                .is_split()
        );
    }

    #[test]
    fn the_stage_range_defect_drops_the_layer_at_each_cut() {
        let plan =
            StagePlan::from_doors(&doors(2, PpSplits::Even, Some(GateDefect::StageRange)), 4)
                .unwrap();
        let layers: Vec<_> = plan.stages.iter().map(|s| s.layers.clone()).collect();
        assert_eq!(layers, vec![0..2, 3..4]);
    }

    #[test]
    fn refusal_names_the_placement_and_the_pin() {
        let plan = StagePlan::from_doors(&doors(2, PpSplits::Even, None), 4).unwrap();
        let text = plan.unsplit_refusal();
        assert!(text.contains("[0] layers 0..2 on device 1 [1] layers 2..4 on device 0"));
        assert!(text.contains("MEMRA_PP_ALLOW_UNSPLIT_BATCH=1"));
    }

    #[test]
    fn mismatched_device_list_is_refused() {
        let mut d = doors(2, PpSplits::Even, None);
        d.pp_devices = vec![0];
        let err = StagePlan::from_doors(&d, 4).unwrap_err();
        assert!(
            err.contains("MEMRA_PP_DEVICES=\"0\" names 1 devices for 2 stages"),
            "{err}"
        );
    }
}
