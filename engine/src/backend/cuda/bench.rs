//! The GPU throughput table of `memra-engine bench --door-matrix`: decode tokens/s at
//! several batch sizes under each distinct door setting, the weight bytes per second that
//! implies, and the device's copy bandwidth measured in the same run as the yardstick.
//!
//! It owns the workload and the timing of the CUDA decode loop (lean ticks: greedy tokens
//! picked on the device, only tokens copied back, as a server runs); it asserts nothing
//! about speed. The CPU table is `crate::bench`.

use std::sync::Arc;
use std::time::Instant;

use cudarc::driver::sys;

use super::{CudaBackend, DevModel, device_err};
use crate::backend::Backend;
use crate::doors::Doors;
use crate::error::EngineError;
use crate::sampling::SamplingParams;
use crate::seq::SeqId;

/// Prompt length before the timed steps, and untimed steps that capture the graphs.
const PROMPT: usize = 8;
const WARM: usize = 2;

/// The distinct door settings of the decode step: under MEMRA_MMVQ=0 the fused tier is
/// refused, so MEMRA_NO_FUSE_NORMQ changes nothing there and is listed once. B=1 runs plain
/// generation's step (the batched body at B=1), so the fused single-sequence tier is
/// measured through its opt-in door, `MEMRA_SERVE_B1FAST=1`, in a last setting (`b1fast=1`),
/// at B=1 only (it changes nothing at larger batches).
pub fn door_settings(base: &Doors) -> Vec<(String, Doors)> {
    let mut out = Vec::new();
    for (mmvq, no_fuse) in [(true, false), (true, true), (false, true)] {
        for fa3 in [true, false] {
            let label = format!(
                "mmvq={} nofuse={} fa3={}",
                mmvq as u8,
                if mmvq {
                    (no_fuse as u8).to_string()
                } else {
                    "-".into()
                },
                fa3 as u8
            );
            out.push((
                label,
                Doors {
                    mmvq,
                    no_fuse_normq: no_fuse,
                    fa3,
                    serve_b1fast: false,
                    ..base.clone()
                },
            ));
        }
    }
    out.push((
        "mmvq=1 nofuse=0 fa3=1 b1fast=1".to_string(),
        Doors {
            mmvq: true,
            no_fuse_normq: false,
            fa3: true,
            serve_b1fast: true,
            ..base.clone()
        },
    ));
    out
}

/// The door settings `bench --door-matrix --only TEXT` measures: those whose label contains
/// `only`, or all of them without it.
pub fn door_settings_matching(base: &Doors, only: Option<&str>) -> Vec<(String, Doors)> {
    door_settings(base)
        .into_iter()
        .filter(|(label, _)| only.is_none_or(|o| label.contains(o)))
        .collect()
}

/// Device-to-device copy bandwidth of the primary device in bytes/s (read + written) over
/// `bytes`-sized buffers, the best of `reps` timed copies.
pub fn copy_bandwidth(dm: &DevModel, bytes: usize, reps: usize) -> Result<f64, EngineError> {
    let stream = dm.primary().stream().clone();
    let err = |what: &str| {
        let what = what.to_string();
        move |e| device_err(&what, e)
    };
    let src = stream
        .alloc_zeros::<u8>(bytes)
        .map_err(err("allocating the copy source"))?;
    let mut dst = stream
        .alloc_zeros::<u8>(bytes)
        .map_err(err("allocating the copy destination"))?;
    stream
        .memcpy_dtod(&src, &mut dst)
        .map_err(err("warming the copy"))?;
    let flags = Some(sys::CUevent_flags::CU_EVENT_DEFAULT);
    let mut best = f64::INFINITY;
    for _ in 0..reps.max(1) {
        let start = stream
            .record_event(flags)
            .map_err(err("recording an event"))?;
        stream
            .memcpy_dtod(&src, &mut dst)
            .map_err(err("copying on the device"))?;
        let end = stream
            .record_event(flags)
            .map_err(err("recording an event"))?;
        end.synchronize().map_err(err("waiting for the copy"))?;
        let ms = start
            .elapsed_ms(&end)
            .map_err(err("reading the copy time"))? as f64;
        best = best.min(ms / 1e3);
    }
    Ok(2.0 * bytes as f64 / best)
}

/// One measured cell.
#[derive(Debug, Clone)]
pub struct Cell {
    pub doors: String,
    pub graphs: bool,
    pub batch: usize,
    /// Best seconds per decode step.
    pub step_s: f64,
}

impl Cell {
    pub fn tokens_per_s(&self) -> f64 {
        self.batch as f64 / self.step_s
    }
}

/// Best time per decode step of `b` sequences over `steps` steps (best of `reps`): B=1 as
/// plain generation steps (`engine::plain_step_sampled`: the batched body, or the
/// single-sequence path under `MEMRA_SERVE_B1FAST=1`), larger batches on the batched path,
/// greedy lean ticks.
pub fn time_decode(
    dm: &Arc<DevModel>,
    doors: &Doors,
    graphs: bool,
    b: usize,
    steps: usize,
    reps: usize,
    context: usize,
) -> Result<f64, EngineError> {
    let mut be = CudaBackend::with_model(dm.clone(), doors.clone())?;
    be.set_graphs(graphs);
    let v = dm.config.n_vocab;
    let greedy = SamplingParams::greedy();
    let seqs: Vec<SeqId> = (0..b as u32).map(SeqId).collect();
    let token = |i: usize, s: usize| ((i * 7919 + s * 104_729 + 17) % v) as u32;
    let mut best = f64::INFINITY;
    for _ in 0..reps.max(1) {
        for &s in &seqs {
            be.open_sequence(s, context + WARM + steps)?;
            let prompt: Vec<u32> = (0..context).map(|i| token(i, s.0 as usize)).collect();
            be.prime(s, &prompt)?;
        }
        let mut t0 = Instant::now();
        for i in 0..WARM + steps {
            if i == WARM {
                t0 = Instant::now();
            }
            let feed: Vec<u32> = seqs.iter().map(|s| token(1000 + i, s.0 as usize)).collect();
            if b == 1 {
                crate::engine::plain_step_sampled(&mut be, doors, seqs[0], feed[0], &greedy)?;
            } else {
                be.decode_step_batch_sampled(&seqs, &feed, &greedy)?;
            }
        }
        best = best.min(t0.elapsed().as_secs_f64() / steps as f64);
        for &s in &seqs {
            be.close_sequence(s)?;
        }
    }
    Ok(best)
}

/// Measures every door setting (those whose label contains `only`, when given) at every
/// batch size, plus B=1 without graphs under the first of them, and renders the table.
#[allow(clippy::too_many_arguments)]
pub fn door_matrix(
    dm: &Arc<DevModel>,
    title: &str,
    base: &Doors,
    batches: &[usize],
    steps: usize,
    reps: usize,
    only: Option<&str>,
    context: Option<usize>,
) -> Result<String, EngineError> {
    let context = context.unwrap_or(PROMPT);
    let copy = copy_bandwidth(dm, 1 << 30, 10)?;
    let wbytes = dm.step_weight_bytes() as f64;
    let mut cells = Vec::new();
    let settings = door_settings_matching(base, only);
    for (label, doors) in &settings {
        for &b in batches {
            if doors.serve_b1fast && b > 1 {
                continue;
            }
            let step_s = time_decode(dm, doors, true, b, steps, reps, context)?;
            cells.push(Cell {
                doors: label.clone(),
                graphs: true,
                batch: b,
                step_s,
            });
        }
    }
    if let Some((label, doors)) = settings.first() {
        let step_s = time_decode(dm, doors, false, 1, steps, reps, context)?;
        cells.push(Cell {
            doors: label.clone(),
            graphs: false,
            batch: 1,
            step_s,
        });
    }
    let mut out = format!(
        "memra-engine bench --door-matrix: {title} on {}\n\
         weights read per step: {:.1} MB; device-to-device copy of 1 GiB (read + written), \
         best of 10: {:.0} GB/s; {steps} timed steps after a {context}-token prompt and {WARM} \
         warm-up steps, best of {reps}\n",
        dm.device_names(),
        wbytes / 1e6,
        copy / 1e9
    );
    out += "| doors                    | graphs | B  | tokens/s  | ms/step | weight GB/s | % of copy | vs B=1 |\n";
    out += "|--------------------------|--------|----|-----------|---------|-------------|-----------|--------|\n";
    for c in &cells {
        let gbs = wbytes / c.step_s;
        let b1 = cells
            .iter()
            .find(|o| o.doors == c.doors && o.graphs == c.graphs && o.batch == 1)
            .map(|o| c.tokens_per_s() / o.tokens_per_s());
        out += &format!(
            "| {:<24} | {:<6} | {:>2} | {:>9.0} | {:>7.3} | {:>11.0} | {:>8.1}% | {:>6} |\n",
            c.doors,
            if c.graphs { "yes" } else { "no" },
            c.batch,
            c.tokens_per_s(),
            c.step_s * 1e3,
            gbs / 1e9,
            100.0 * gbs / copy,
            b1.map_or("-".into(), |r| format!("{r:.1}x"))
        );
    }
    Ok(out)
}
