//! The CPU backend: the engine API computed with the kernel twins of `memra_kernels::twin`,
//! so every number is the one the CUDA kernels produce (up to `exp`).
//!
//! It owns scheduling on the host (its threads, `backend::pool`, over matvec rows, heads and
//! per-row steps, never changing a row's arithmetic), the KV caches and the choice between
//! the two decode compositions of DESIGN §7: the *separate* composition (rmsnorm → q8_1 →
//! matvec with every scale inside) used by prefill and the batched path, and the *fused* tier
//! of the single-sequence path (rmsnorm+quantize fused, the norm factor applied as a post-op
//! by RoPE, the KV store, SwiGLU and the head's scale). The numeric definition of each step
//! is the twins'.
//!
//! Layers live in [`Stage`]s, each owning its layers' weights, their KV caches and its own
//! `[B, n_embd]` input buffer, placed by the backend-independent [`StagePlan`]. The split walk
//! runs stage by stage with an explicit boundary copy from one stage's buffer into the next,
//! so `MEMRA_PP_STAGES` splits the model the way a multi-GPU backend does; the unsplit walk
//! ([`Backend::decode_step_batch_walk`] over [`super::Walk::Unsplit`]) runs the same stage-owned layers as one body.

use std::collections::BTreeMap;
use std::ops::Range;

use memra_kernels::blocks::{BlockQ8_1, QK};
use memra_kernels::twin::{self, AttnShape, MatvecFamily, WeightRows};

use super::pool::Pool;
use super::stages::{StagePlan, boundary_copy};
use super::trace::{ActivationTrace, Composition, Site, SiteKey, SiteRecord};
use super::{
    Backend, ClearedWalk, Pass, RowSpec, SeqsKey, Sequences, Tier, Walk, check_row_params, norm_eps,
};
use crate::doors::{Doors, DoorsReport, GateDefect};
use crate::error::EngineError;
use crate::model::{LayerWeights, LlamaConfig, LlamaModel, Weight, WeightData};
use crate::sampling::SamplingParams;
use crate::seq::SeqId;

/// The KV cache of one sequence in one layer: `capacity` positions of `kv_dim` floats each.
struct LayerKv {
    k: Vec<f32>,
    v: Vec<f32>,
}

/// One layer: its weights and the KV caches of every open sequence.
struct CpuLayer {
    w: LayerWeights,
    kv: BTreeMap<SeqId, LayerKv>,
}

/// A pipeline stage: a contiguous range of layers it owns outright.
pub struct Stage {
    /// The model layers this stage runs.
    pub layers: Range<usize>,
    blocks: Vec<CpuLayer>,
    /// The stage's `[B, n_embd]` activations: filled by the boundary copy from the previous
    /// stage (by the embedding on stage 0), updated in place by the stage's layers.
    input: Vec<f32>,
}

/// The CPU backend. See the module docs.
pub struct CpuBackend {
    config: LlamaConfig,
    doors: Doors,
    family: MatvecFamily,
    token_embd: Weight,
    output_norm: Vec<f32>,
    output: Option<Weight>,
    stages: Vec<Stage>,
    rope_table: Vec<f32>,
    seqs: Sequences,
    quantized: bool,
    /// The `[B, n_vocab]` logits of the last sampled batched step (the lean tick).
    parked: Option<Vec<f32>>,
    /// The load-time stage plan the stages were placed by.
    plan: StagePlan,
    /// The activation trace being recorded, when enabled ([`Backend::start_trace`]); with
    /// `None` no site is copied anywhere.
    trace: Option<ActivationTrace>,
    /// The threads of a pass's parallel regions ([`CpuBackend::with_threads`]).
    pool: Pool,
}

/// The activations of a batch of rows in the two forms the matvecs take: f32 (float
/// weights) and q8_1 (quantized weights). `scale` is the per-row factor the fused tier
/// applies after the matvec (`None` on the separate composition).
struct Acts {
    f: Vec<f32>,
    q: Vec<BlockQ8_1>,
    scale: Option<Vec<f32>>,
}

/// The fewest rows of one task of a matvec: enough work to amortise scheduling.
const MIN_ROWS_PER_TASK: usize = 64;

/// Tasks per thread a matvec's rows are cut into: enough for balance, few enough that a
/// task's setup (the activation blocks rearranged once per call, the task's own output) and
/// the hand-off stay small beside its rows. Measured on the 2-core development machine with
/// the pool's tasks (two threads, SmolLM2 shape, 8 runs alternating, medians): 2 gave
/// prefill 346 / decode 165 / B=8 293 tokens/s against 318 / 153 / 281 for 4; 1 and 3 gave
/// less than 2.
const TASKS_PER_THREAD: usize = 2;

/// Rows of one task of a matvec of `rows` rows on `threads` threads: `rows` cut into about
/// [`TASKS_PER_THREAD`] tasks per thread, never fewer than [`MIN_ROWS_PER_TASK`] rows.
fn rows_per_task(rows: usize, threads: usize) -> usize {
    rows.div_ceil(TASKS_PER_THREAD * threads)
        .max(MIN_ROWS_PER_TASK)
}

impl CpuBackend {
    /// Builds the backend over `model` with `doors` (read once by the caller), its passes on
    /// as many threads as rayon's pool has (`RAYON_NUM_THREADS`, else one per CPU).
    pub fn new(model: LlamaModel, doors: Doors) -> Result<CpuBackend, EngineError> {
        CpuBackend::with_threads(model, doors, rayon::current_num_threads())
    }

    /// [`CpuBackend::new`] with its passes on `threads` threads (the caller's included; 0
    /// counts as 1, at most 1,024). The thread count moves no bit: it only cuts the same
    /// per-row and per-head work into other tasks. More threads than the CPUs the process
    /// may run on spin against each other and slow a pass down.
    pub fn with_threads(
        model: LlamaModel,
        doors: Doors,
        threads: usize,
    ) -> Result<CpuBackend, EngineError> {
        model.validate().map_err(EngineError::Model)?;
        let quantized = model.has_quantized();
        let config = model.config.clone();
        let plan = StagePlan::from_doors(&doors, config.n_layer).map_err(EngineError::Model)?;
        let mut layers: Vec<Option<LayerWeights>> = model.layers.into_iter().map(Some).collect();
        let stages = plan
            .stages
            .iter()
            .map(|spec| Stage {
                blocks: spec
                    .layers
                    .clone()
                    .filter_map(|i| layers[i].take())
                    .map(|w| CpuLayer {
                        w,
                        kv: BTreeMap::new(),
                    })
                    .collect(),
                layers: spec.layers.clone(),
                input: Vec::new(),
            })
            .collect();
        let family = if doors.mmvq {
            MatvecFamily::Mmvq
        } else {
            MatvecFamily::Dp4a
        };
        let rope_table = twin::rope_table(config.head_dim, config.rope_base, config.n_ctx);
        Ok(CpuBackend {
            family,
            doors,
            token_embd: model.token_embd,
            output_norm: model.output_norm,
            output: model.output,
            stages,
            rope_table,
            seqs: Sequences::default(),
            quantized,
            parked: None,
            plan,
            config,
            trace: None,
            pool: Pool::new(threads),
        })
    }

    /// Gives the model back (closing every sequence), e.g. to rebuild the backend under
    /// other doors without reading the file again.
    pub fn into_model(self) -> LlamaModel {
        LlamaModel {
            config: self.config,
            token_embd: self.token_embd,
            layers: self
                .stages
                .into_iter()
                .flat_map(|s| s.blocks.into_iter().map(|l| l.w))
                .collect(),
            output_norm: self.output_norm,
            output: self.output,
        }
    }

    /// The pipeline stages and the layers each owns.
    pub fn stages(&self) -> &[Stage] {
        &self.stages
    }

    fn head(&self) -> &Weight {
        self.output.as_ref().unwrap_or(&self.token_embd)
    }

    /// Runs `rows` through the model as `pass` over `walk`, appending each row's K and V to
    /// its sequence's caches, and returns the logits of the rows selected by `logits_rows`
    /// (`[selected, n_vocab]`). `pass` picks the composition ([`Tier::of`]) and says where the
    /// test-only `batch-reduction` and `stage-column` defects apply. The pass runs on the
    /// calling thread, its parallel regions (about five a layer) on the backend's pool.
    fn forward_walk(
        &mut self,
        rows: &[RowSpec],
        logits_rows: Range<usize>,
        walk: Walk,
        pass: Pass,
    ) -> Result<Vec<f32>, EngineError> {
        let tier = Tier::of(pass, &self.doors);
        let batched = pass == Pass::Batched;
        let c = self.config.clone();
        let n = rows.len();
        let mut x = vec![0.0f32; n * c.n_embd];
        for (xr, row) in x.chunks_exact_mut(c.n_embd).zip(rows) {
            self.token_embd.row_f32(row.token as usize, xr);
        }
        let family = self.family;
        let ctx = PassCtx {
            pool: &self.pool,
            c: &c,
            family,
            tier,
            split_k: self.doors.fa3,
            rope_table: &self.rope_table,
            eps: norm_eps(&self.doors, tier == Tier::Fused, c.rms_eps),
            block_sum_defect: self.doors.gate_defect == Some(GateDefect::Q8BlockSum),
            kv_q8: self
                .doors
                .kv_q8
                .then(|| GateDefect::kv_qmax(self.doors.gate_defect)),
        };
        match walk {
            Walk::Unsplit => {
                for stage in &mut self.stages {
                    for (j, layer) in stage.blocks.iter_mut().enumerate() {
                        let rec = Recorder {
                            trace: self.trace.as_mut(),
                            layer: stage.layers.start + j,
                            rows,
                        };
                        layer_forward(&ctx, layer, rows, &mut x, rec)?;
                    }
                }
            }
            Walk::Split => {
                let skip_copy = self.doors.gate_defect == Some(GateDefect::BoundaryCopy);
                let drop_column =
                    pass == Pass::Verify && self.doors.gate_defect == Some(GateDefect::StageColumn);
                for s in 0..self.stages.len() {
                    if s == 0 {
                        boundary_copy(&x, &mut self.stages[0].input);
                    } else if skip_copy {
                        // The planted defect: the stage runs on whatever its buffer held.
                        self.stages[s].input.resize(x.len(), 0.0);
                    } else if drop_column {
                        // The planted defect: the last column keeps the stale buffer.
                        let (done, rest) = self.stages.split_at_mut(s);
                        let (from, to) = (&done[s - 1].input, &mut rest[0].input);
                        to.resize(from.len(), 0.0);
                        let keep = from.len() - c.n_embd;
                        to[..keep].copy_from_slice(&from[..keep]);
                    } else {
                        let (done, rest) = self.stages.split_at_mut(s);
                        boundary_copy(&done[s - 1].input, &mut rest[0].input);
                    }
                    let stage = &mut self.stages[s];
                    for (j, layer) in stage.blocks.iter_mut().enumerate() {
                        let rec = Recorder {
                            trace: self.trace.as_mut(),
                            layer: stage.layers.start + j,
                            rows,
                        };
                        layer_forward(&ctx, layer, rows, &mut stage.input, rec)?;
                    }
                }
                if let Some(last) = self.stages.last() {
                    boundary_copy(&last.input, &mut x);
                }
            }
        }
        let sel = &x[logits_rows.start * c.n_embd..logits_rows.end * c.n_embd];
        if sel.is_empty() {
            return Ok(Vec::new());
        }
        let reversed = batched
            && rows.len() >= 2
            && self.doors.gate_defect == Some(GateDefect::BatchReduction);
        let acts = ctx.quantized(if reversed {
            reversed_sum_acts(&self.pool, sel, &self.output_norm, c.rms_eps)?
        } else {
            normed_acts(
                &self.pool,
                sel,
                &self.output_norm,
                norm_eps(&self.doors, tier == Tier::Fused, c.rms_eps),
                tier,
            )?
        });
        let mut rec = Recorder {
            trace: self.trace.as_mut(),
            layer: c.n_layer,
            rows: &rows[logits_rows],
        };
        rec.record(Site::HeadIn, &acts);
        let mut logits = matmul(&self.pool, family, self.head(), &acts)?;
        post_scale_rows(&mut logits, c.n_vocab, &acts)?;
        Ok(logits)
    }
}

/// The fewest rows of a pass whose per-row steps (norms, quantization, RoPE, SwiGLU) are
/// spread over the threads: a prompt's or a wide batch's, not a single row's, where the
/// hand-off would cost more than the step. Rows are independent, so no bit moves.
const PAR_MIN_ROWS: usize = 4;

/// Runs `f` on every pair of a row of `a` (`wa` values) and a row of `b` (`wb` values), over
/// the pool's threads when there are [`PAR_MIN_ROWS`] rows or more.
fn each_row<T: Sync, U: Send>(
    pool: &Pool,
    a: &[T],
    wa: usize,
    b: &mut [U],
    wb: usize,
    f: impl Fn(usize, &[T], &mut [U]) -> Result<(), memra_kernels::twin::ShapeError> + Sync,
) -> Result<(), EngineError> {
    debug_assert_eq!(a.len() / wa.max(1), b.len() / wb.max(1), "rows of a and b");
    if a.len() / wa.max(1) >= PAR_MIN_ROWS {
        let mut outs: Vec<&mut [U]> = b.chunks_exact_mut(wb).collect();
        pool.each(&mut outs, |i, br| f(i, &a[i * wa..(i + 1) * wa], br))
    } else {
        a.chunks_exact(wa)
            .zip(b.chunks_exact_mut(wb))
            .enumerate()
            .try_for_each(|(i, (ar, br))| f(i, ar, br))
    }
    .map_err(twin_err)
}

/// `rmsnorm` of every row in the composition of `tier`, as activations for a matvec.
fn normed_acts(
    pool: &Pool,
    x: &[f32],
    g: &[f32],
    eps: f32,
    tier: Tier,
) -> Result<Acts, EngineError> {
    let d = g.len();
    let n = x.len() / d;
    let mut q = vec![zero_q8_1(); x.len() / QK];
    match tier {
        Tier::Separate => {
            let mut f = vec![0.0f32; x.len()];
            each_row(pool, x, d, &mut f, d, |_, xr, fr| {
                twin::rmsnorm(xr, g, eps, fr)
            })?;
            each_row(pool, &f, d, &mut q, d / QK, |_, fr, qr| {
                twin::quantize_q8_1(fr, qr)
            })?;
            Ok(Acts { f, q, scale: None })
        }
        Tier::Fused => {
            let mut scale = Vec::with_capacity(n);
            for (xr, qr) in x.chunks_exact(d).zip(q.chunks_exact_mut(d / QK)) {
                scale.push(twin::rmsnorm_quantize_fused(xr, g, eps, qr).map_err(twin_err)?);
            }
            // Float weights in the fused tier see the same unscaled x·g that was quantized.
            let f = x
                .chunks_exact(d)
                .flat_map(|xr| xr.iter().zip(g).map(|(&a, &b)| a * b))
                .collect();
            Ok(Acts {
                f,
                q,
                scale: Some(scale),
            })
        }
    }
}

/// The test-only `batch-reduction` defect, used only when a batched step has B ≥ 2: the
/// final rmsnorm sums its squares backwards (another reduction order than the twin's) and
/// applies the norm factor after the head matvec, where q8_1 rounding cannot absorb the
/// difference.
fn reversed_sum_acts(pool: &Pool, x: &[f32], g: &[f32], eps: f32) -> Result<Acts, EngineError> {
    let d = g.len();
    let mut scale = Vec::with_capacity(x.len() / d);
    for xr in x.chunks_exact(d) {
        let ss = xr.iter().rev().fold(0.0f32, |acc, &v| acc + v * v);
        scale.push(1.0 / (ss / d as f32 + eps).sqrt());
    }
    let f: Vec<f32> = x
        .chunks_exact(d)
        .flat_map(|xr| xr.iter().zip(g).map(|(&a, &b)| a * b))
        .collect();
    let mut acts = plain_acts(pool, f, d)?;
    acts.scale = Some(scale);
    Ok(acts)
}

/// Plain activations (no norm, no post-op): the attention output into `wo`, SwiGLU into
/// `w_down`.
fn plain_acts(pool: &Pool, x: Vec<f32>, width: usize) -> Result<Acts, EngineError> {
    let mut q = vec![zero_q8_1(); x.len() / QK];
    each_row(pool, &x, width, &mut q, width / QK, |_, xr, qr| {
        twin::quantize_q8_1(xr, qr)
    })?;
    Ok(Acts {
        f: x,
        q,
        scale: None,
    })
}

/// Applies the fused tier's per-row factor to a `[rows, width]` output with the twins'
/// scale kernel (a no-op on the separate composition).
fn post_scale_rows(y: &mut [f32], width: usize, acts: &Acts) -> Result<(), EngineError> {
    if let Some(scale) = &acts.scale {
        for (yr, &r) in y.chunks_exact_mut(width).zip(scale) {
            twin::scale(yr, r);
        }
    }
    Ok(())
}

fn zero_q8_1() -> BlockQ8_1 {
    BlockQ8_1 {
        d: half::f16::ZERO,
        s: half::f16::ZERO,
        qs: [0; QK],
    }
}

fn twin_err(e: impl std::fmt::Display) -> EngineError {
    EngineError::Model(format!("kernel twin refused a call: {e}"))
}

fn weight_rows(w: &Weight) -> WeightRows<'_> {
    match &w.data {
        WeightData::Q4_0(v) => WeightRows::Q4_0(v),
        WeightData::Q4_1(v) => WeightRows::Q4_1(v),
        WeightData::Q8_0(v) => WeightRows::Q8_0(v),
        WeightData::F32(v) => WeightRows::F32(v),
        WeightData::F16(v) => WeightRows::F16(v),
        WeightData::BF16(v) => WeightRows::BF16(v),
    }
}

/// `y[b] = W · x[b]` for every activation row, `[batch, w.rows]`.
fn matmul(
    pool: &Pool,
    family: MatvecFamily,
    w: &Weight,
    acts: &Acts,
) -> Result<Vec<f32>, EngineError> {
    Ok(matmul_many(pool, family, &[w], acts)?.remove(0))
}

/// [`matmul`] for several weights reading the same activations (q, k and v; gate and up),
/// in one parallel region so the threads meet once instead of once per weight. Rows of each
/// `W` are split across threads; each output value is one twin call with the arithmetic of
/// a single-row matvec, so neither the split nor the batch size changes a bit. A task writes
/// its rows straight into the output when there is one activation row (a decode step, the
/// head of a prime), where they are contiguous; with several, into a part of its own copied
/// into place after.
fn matmul_many(
    pool: &Pool,
    family: MatvecFamily,
    ws: &[&Weight],
    acts: &Acts,
) -> Result<Vec<Vec<f32>>, EngineError> {
    let tasks: Vec<(usize, Range<usize>)> = ws
        .iter()
        .enumerate()
        .flat_map(|(i, w)| {
            let per = rows_per_task(w.rows, pool.threads());
            (0..w.rows)
                .step_by(per)
                .map(move |s| (i, s..(s + per).min(w.rows)))
        })
        .collect();
    let mut ys: Vec<Vec<f32>> = ws
        .iter()
        .map(|w| vec![0.0f32; acts.f.len() / w.cols * w.rows])
        .collect();
    if ws.iter().all(|w| acts.f.len() == w.cols) {
        // One activation row: task (i, r) owns ys[i][r], cut off in task order.
        let mut outs: Vec<&mut [f32]> = Vec::with_capacity(tasks.len());
        for (y, i) in ys.iter_mut().zip(0..) {
            let mut rest = y.as_mut_slice();
            for (_, r) in tasks.iter().filter(|(j, _)| *j == i) {
                let (head, tail) = std::mem::take(&mut rest).split_at_mut(r.len());
                outs.push(head);
                rest = tail;
            }
        }
        pool.each(&mut outs, |k, out| {
            let (i, r) = &tasks[k];
            weight_rows_of(family, ws[*i], acts, r.clone(), out)
        })
        .map_err(twin_err)?;
        return Ok(ys);
    }
    let mut parts: Vec<Vec<f32>> = vec![Vec::new(); tasks.len()];
    pool.each(&mut parts, |k, part| {
        let (i, r) = &tasks[k];
        let w = ws[*i];
        *part = vec![0.0f32; acts.f.len() / w.cols * r.len()];
        weight_rows_of(family, w, acts, r.clone(), part)
    })
    .map_err(twin_err)?;
    for ((i, r), part) in tasks.iter().zip(&parts) {
        let rows = ws[*i].rows;
        for (b, chunk) in part.chunks_exact(r.len()).enumerate() {
            ys[*i][b * rows + r.start..b * rows + r.end].copy_from_slice(chunk);
        }
    }
    Ok(ys)
}

/// Rows `r` of `W · x[b]` for every activation row `b` into `out` (`[batch, r.len()]`),
/// each value one twin call with the arithmetic of a single-row matvec.
fn weight_rows_of(
    family: MatvecFamily,
    w: &Weight,
    acts: &Acts,
    r: Range<usize>,
    out: &mut [f32],
) -> Result<(), twin::TwinError> {
    let batch = acts.f.len() / w.cols;
    let wr = weight_rows(w);
    if w.data.is_quantized() {
        twin::matvec_batch_rows(family, wr, w.cols, &acts.q, batch, r, out)
    } else {
        out.chunks_exact_mut(r.len())
            .zip(acts.f.chunks_exact(w.cols))
            .try_for_each(|(yb, xb)| twin::matvec_f32_rows(wr, w.cols, xb, r.clone(), yb))
    }
}

/// The feed-forward hidden activations of one row, `swiglu(gate · x, up · x)` quantized to
/// q8_1, in one region: a task takes a range of hidden units (whole q8_1 blocks), computes
/// their gate and up rows, their SwiGLU and their blocks, so a decode step's SwiGLU and
/// quantization run over the threads without a region of their own. Every value is the
/// twin call the separate steps make ([`matmul_many`], [`twin::swiglu`], [`plain_acts`]) on
/// a part of the row; the steps are elementwise or per block, so no bit moves.
fn ffn_hidden_one_row(
    pool: &Pool,
    family: MatvecFamily,
    w_gate: &Weight,
    w_up: &Weight,
    acts: &Acts,
) -> Result<Acts, EngineError> {
    let ff = w_gate.rows;
    let per = rows_per_task(ff, pool.threads()).next_multiple_of(QK);
    let post = acts.scale.as_ref().map(|s| s[0]);
    let mut gate = vec![0.0f32; ff];
    let mut up = vec![0.0f32; ff];
    let mut h = vec![0.0f32; ff];
    let mut q = vec![zero_q8_1(); ff / QK];
    type Part<'a> = (
        usize,
        &'a mut [f32],
        &'a mut [f32],
        &'a mut [f32],
        &'a mut [BlockQ8_1],
    );
    let mut parts: Vec<Part> = gate
        .chunks_mut(per)
        .zip(up.chunks_mut(per))
        .zip(h.chunks_mut(per).zip(q.chunks_mut(per / QK)))
        .enumerate()
        .map(|(k, ((gp, upp), (hp, qp)))| (k * per, gp, upp, hp, qp))
        .collect();
    pool.each(&mut parts, |_, (start, gp, upp, hp, qp)| {
        let r = *start..*start + hp.len();
        weight_rows_of(family, w_gate, acts, r.clone(), gp)?;
        weight_rows_of(family, w_up, acts, r, upp)?;
        twin::swiglu(gp, upp, hp, post)?;
        twin::quantize_q8_1(hp, qp)?;
        Ok::<(), twin::TwinError>(())
    })
    .map_err(twin_err)?;
    Ok(Acts {
        f: h,
        q,
        scale: None,
    })
}

/// Where a layer's quantization sites go when tracing: nowhere (`trace: None`, the
/// default, costing one branch per site) or into the backend's trace.
struct Recorder<'a> {
    trace: Option<&'a mut ActivationTrace>,
    layer: usize,
    rows: &'a [RowSpec],
}

impl Recorder<'_> {
    /// Copies each row's q8_1 blocks (and the fused tier's factor) of one site.
    fn record(&mut self, site: Site, acts: &Acts) {
        let Some(trace) = self.trace.as_deref_mut() else {
            return;
        };
        if self.rows.is_empty() || acts.q.is_empty() {
            return;
        }
        let per_row = acts.q.len() / self.rows.len();
        for (i, (row, blocks)) in self
            .rows
            .iter()
            .zip(acts.q.chunks_exact(per_row))
            .enumerate()
        {
            let r = acts.scale.as_ref().map(|s| s[i]);
            trace.record(
                SiteKey {
                    seq: row.seq,
                    pos: row.pos,
                    layer: self.layer,
                    site,
                },
                SiteRecord {
                    composition: if r.is_some() {
                        Composition::Fused
                    } else {
                        Composition::Separate
                    },
                    blocks: blocks.to_vec(),
                    r,
                },
            );
        }
    }
}

/// What every layer of one forward pass shares.
struct PassCtx<'a> {
    pool: &'a Pool,
    c: &'a LlamaConfig,
    family: MatvecFamily,
    tier: Tier,
    split_k: bool,
    rope_table: &'a [f32],
    /// The rms epsilon of this pass's norm steps ([`norm_eps`]).
    eps: f32,
    /// Whether the planted `q8-block-sum` defect is set ([`PassCtx::quantized`]).
    block_sum_defect: bool,
    /// Under `MEMRA_KV_Q8=1`, the levels each side of zero every stored K and V row is
    /// rounded with (127: q8_0; [`GateDefect::kv_qmax`]).
    kv_q8: Option<i32>,
}

impl PassCtx<'_> {
    /// Activations as this pass stores them: under the test-only `q8-block-sum` defect every
    /// q8_1 block's sum `s` one f16 step high, its bits plus one where it is finite and not
    /// zero (the CUDA `quantize_lane` under `MEMRA_DEFECT_Q8_BLOCK_SUM`, line for line), so
    /// the two backends stay bit-identical under it. A zero sum is spared: one subnormal
    /// step off zero would fail the oracle's follower under any width of its tie window, so
    /// a window grown far too wide would still look sharp.
    fn quantized(&self, mut acts: Acts) -> Acts {
        if self.block_sum_defect {
            for b in &mut acts.q {
                if b.s.is_finite() && b.s.to_bits() & 0x7fff != 0 {
                    b.s = half::f16::from_bits(b.s.to_bits() + 1);
                }
            }
        }
        acts
    }
}

/// One transformer layer over every row, in place on the residual stream `x`.
fn layer_forward(
    ctx: &PassCtx,
    layer: &mut CpuLayer,
    rows: &[RowSpec],
    x: &mut [f32],
    mut rec: Recorder,
) -> Result<(), EngineError> {
    let PassCtx {
        c,
        family,
        tier,
        split_k,
        rope_table: table,
        eps,
        ..
    } = *ctx;
    let (qd, kvd, hd) = (c.q_dim(), c.kv_dim(), c.head_dim);
    let w = &layer.w;

    // Attention block.
    let pool = ctx.pool;
    let acts = ctx.quantized(normed_acts(pool, x, &w.attn_norm, eps, tier)?);
    rec.record(Site::AttnIn, &acts);
    let [mut q, mut k, v]: [Vec<f32>; 3] =
        matmul_many(pool, family, &[&w.wq, &w.wk, &w.wv], &acts)?
            .try_into()
            .expect("three weights give three outputs");
    let post = |i: usize| acts.scale.as_ref().map(|s| s[i]);
    each_row(pool, rows, 1, &mut q, qd, |i, r, qr| {
        twin::rope(qr, r[0].pos, table, c.n_head, hd, post(i))
    })?;
    each_row(pool, rows, 1, &mut k, kvd, |i, r, kr| {
        twin::rope(kr, r[0].pos, table, c.n_head_kv, hd, post(i))
    })?;
    for (i, row) in rows.iter().enumerate() {
        let r = post(i);
        let cache = layer
            .kv
            .get_mut(&row.seq)
            .ok_or(EngineError::UnknownSequence(row.seq))?;
        // K was scaled by RoPE already; V takes the fused tier's factor in the store.
        twin::kv_store(&mut cache.k, row.pos, &k[i * kvd..(i + 1) * kvd], None)
            .map_err(twin_err)?;
        twin::kv_store(&mut cache.v, row.pos, &v[i * kvd..(i + 1) * kvd], r).map_err(twin_err)?;
        if let Some(qmax) = ctx.kv_q8 {
            let at = row.pos * kvd..(row.pos + 1) * kvd;
            twin::kv_round_blocks(&mut cache.k[at.clone()], qmax).map_err(twin_err)?;
            twin::kv_round_blocks(&mut cache.v[at], qmax).map_err(twin_err)?;
        }
    }
    let scale = 1.0 / (hd as f32).sqrt();
    let mut att = vec![0.0f32; rows.len() * qd];
    let kv = &layer.kv;
    // One task per (row, head): a decode step's single row still spreads its heads over the
    // threads. Each head is the twin's own per-head call, so no bit moves.
    let mut heads: Vec<&mut [f32]> = att.chunks_exact_mut(hd).collect();
    pool.each(&mut heads, |i, out| {
        let (row, h) = (&rows[i / c.n_head], i % c.n_head);
        let cache = &kv[&row.seq];
        let shape = AttnShape {
            n_heads: c.n_head,
            n_kv_heads: c.n_head_kv,
            head_dim: hd,
            n_tokens: row.pos + 1,
        };
        let qr = &q[i / c.n_head * qd..][..qd];
        if split_k {
            twin::attention_split_k_head(h, qr, &cache.k, &cache.v, &shape, scale, out)
        } else {
            twin::attention_naive_head(h, qr, &cache.k, &cache.v, &shape, scale, out)
        }
    })
    .map_err(twin_err)?;
    drop(heads);
    let att = ctx.quantized(plain_acts(pool, att, qd)?);
    rec.record(Site::AttnOut, &att);
    let o = matmul(pool, family, &w.wo, &att)?;
    twin::add(x, &o).map_err(twin_err)?;

    // Feed-forward block.
    let acts = ctx.quantized(normed_acts(pool, x, &w.ffn_norm, eps, tier)?);
    rec.record(Site::FfnIn, &acts);
    let ff = c.n_ff;
    // n_ff is a multiple of 32 (LlamaConfig::validate), so one row's hidden units split into
    // whole q8_1 blocks.
    let h = if rows.len() == 1 {
        ffn_hidden_one_row(pool, family, &w.w_gate, &w.w_up, &acts)?
    } else {
        let [gate, up]: [Vec<f32>; 2] = matmul_many(pool, family, &[&w.w_gate, &w.w_up], &acts)?
            .try_into()
            .expect("two weights give two outputs");
        let mut h = vec![0.0f32; gate.len()];
        each_row(pool, &gate, ff, &mut h, ff, |i, g, hr| {
            let r = acts.scale.as_ref().map(|s| s[i]);
            twin::swiglu(g, &up[i * ff..(i + 1) * ff], hr, r)
        })?;
        plain_acts(pool, h, ff)?
    };
    let h = ctx.quantized(h);
    rec.record(Site::FfnDownIn, &h);
    let down = matmul(pool, family, &w.w_down, &h)?;
    twin::add(x, &down).map_err(twin_err)?;
    Ok(())
}

impl Backend for CpuBackend {
    fn config(&self) -> &LlamaConfig {
        &self.config
    }

    fn doors_report(&self) -> DoorsReport {
        let d = &self.doors;
        DoorsReport {
            backend: "cpu",
            matvec: if self.quantized {
                self.family.name()
            } else {
                "float"
            },
            norm: Tier::single_name(d),
            attention: if d.fa3 { "split-k" } else { "naive" },
            b1fast: d.serve_b1fast,
            kv: if d.kv_q8 { "q8_0" } else { "f32" },
            pp_stages: self.stages.len(),
            pp_devices: "cpu".into(),
            pp_splits: self
                .stages
                .iter()
                .map(|s| s.layers.start.to_string())
                .collect::<Vec<_>>()
                .join(","),
            gate_seed: d.gate_seed,
            canary: d.gate_canary,
            tuning: d.tuning,
        }
    }

    fn open_sequence(&mut self, seq: SeqId, capacity: usize) -> Result<(), EngineError> {
        self.seqs.check_open(seq, capacity, self.config.n_ctx)?;
        let kvd = self.config.kv_dim();
        for stage in &mut self.stages {
            for layer in &mut stage.blocks {
                layer.kv.insert(
                    seq,
                    LayerKv {
                        k: vec![0.0; capacity * kvd],
                        v: vec![0.0; capacity * kvd],
                    },
                );
            }
        }
        self.seqs.insert(seq, capacity);
        Ok(())
    }

    fn close_sequence(&mut self, seq: SeqId) -> Result<(), EngineError> {
        self.seqs.remove(seq)?;
        for stage in &mut self.stages {
            for layer in &mut stage.blocks {
                layer.kv.remove(&seq);
            }
        }
        Ok(())
    }

    fn stage_plan(&self) -> &StagePlan {
        &self.plan
    }

    fn doors(&self) -> &Doors {
        &self.doors
    }

    fn sequences(&self) -> &Sequences {
        &self.seqs
    }

    fn sequences_mut(&mut self, _: &SeqsKey) -> &mut Sequences {
        &mut self.seqs
    }

    /// The single-sequence pass runs the fused tier where the doors allow it; every other
    /// pass the separate composition.
    fn run_rows(
        &mut self,
        walk: ClearedWalk,
        rows: &[RowSpec],
        pass: Pass,
        logits: Range<usize>,
    ) -> Result<Vec<f32>, EngineError> {
        // A row kept from an earlier call, or rows of a sequences table changed by other
        // means, are refused here rather than by the twin that would store them.
        let kvd = self.config.kv_dim();
        if let Some(layer) = self.stages.iter().find_map(|s| s.blocks.first()) {
            for r in rows {
                let cache = layer
                    .kv
                    .get(&r.seq)
                    .ok_or(EngineError::UnknownSequence(r.seq))?;
                let capacity = cache.k.len() / kvd;
                if r.pos >= capacity {
                    return Err(EngineError::CacheFull {
                        seq: r.seq,
                        len: r.pos,
                        capacity,
                        adding: 1,
                    });
                }
            }
        }
        self.forward_walk(rows, logits, walk.walk(), pass)
    }

    fn start_trace(&mut self) -> bool {
        self.trace.get_or_insert_with(ActivationTrace::new);
        true
    }

    fn take_trace(&mut self) -> Option<ActivationTrace> {
        self.trace.as_mut().map(std::mem::take)
    }

    fn parked_logits(&self) -> Result<Vec<f32>, EngineError> {
        self.parked.clone().ok_or_else(|| {
            EngineError::Unavailable(
                "no logits are parked: run decode_step_batch_sampled first".into(),
            )
        })
    }

    /// The lean tick: one batched step whose logits stay parked in the backend
    /// ([`Backend::parked_logits`]) while only the tokens come back, row `b` chosen under
    /// `params[b]`.
    fn decode_step_batch_sampled_rows(
        &mut self,
        seqs: &[SeqId],
        tokens: &[u32],
        params: &[SamplingParams],
    ) -> Result<Vec<u32>, EngineError> {
        check_row_params(seqs, params)?;
        let logits = self.decode_step_batch(seqs, tokens)?;
        let out = super::host_sample_rows(self, seqs, params, &logits)?;
        self.parked = Some(logits);
        Ok(out)
    }
}
