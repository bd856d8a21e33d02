//! The launches of one decode step on one segment, as named blocks that read side by side
//! with the CPU backend's forward pass (`backend/cpu.rs`): the embedding, one layer's
//! attention block, one layer's feed-forward block and the head, with the same-device
//! stage boundary copies of a split walk between layers.
//!
//! This module owns *what is launched, in which order, with which arguments*; the buffers
//! are [`super::device::Scratch`]'s, replaying the launches as graphs is [`super::graph`],
//! the copies between devices are [`super::segments::hand_over`], and recording the
//! quantization sites is [`super::tap::Tap`].

use cudarc::driver::CudaSlice;
use memra_kernels::blocks::{BlockQ8_1, QK};
use memra_kernels::cuda::{AttnRows, Gpu, RopeStoreArgs, attention_can_quantize};
use memra_kernels::error::KernelError;
use memra_kernels::twin::MatvecFamily;

use super::device::Scratch;
use super::segments::Segment;
use super::tap::Tap;
use super::weights::{DevLayer, DevWeight};
use super::{PassCtx, Tier};
use crate::backend::Walk;
use crate::backend::trace::Site;

/// `y = W · x` for `n` rows: q8_1 activations for quantized weights, f32 for float ones.
#[allow(clippy::too_many_arguments)]
fn matvec(
    gpu: &Gpu,
    family: MatvecFamily,
    w: &DevWeight,
    xq: &CudaSlice<BlockQ8_1>,
    xf: &CudaSlice<f32>,
    n: usize,
    y: &mut CudaSlice<f32>,
) -> Result<(), KernelError> {
    if w.quantized() {
        gpu.matvec(family, w.view(), w.rows, w.cols, xq, n, y)
    } else {
        gpu.matvec_float(w.view(), w.rows, w.cols, xf, n, y)
    }
}

/// The norm step of [`Gpu::add_rmsnorm_q8_1`] on the stream in `x`: with `split`, the
/// split-over-blocks kernel writes the updated stream to `x_alt` and the two swap (wide
/// rows, see [`encode`]); otherwise in place. `x_early`: the launch before this one
/// does not write `x` (see [`Gpu::add_rmsnorm_q8_1_split`]).
#[allow(clippy::too_many_arguments)]
fn norm_step<'a>(
    gpu: &Gpu,
    split: bool,
    x: &mut &'a mut CudaSlice<f32>,
    x_alt: &mut &'a mut CudaSlice<f32>,
    delta: Option<&CudaSlice<f32>>,
    g: &CudaSlice<f32>,
    xf: Option<&mut CudaSlice<f32>>,
    xq: &mut CudaSlice<BlockQ8_1>,
    r_out: Option<&mut CudaSlice<f32>>,
    n: usize,
    d: usize,
    eps: f32,
    x_early: bool,
) -> Result<(), KernelError> {
    if split {
        let share = Gpu::norm_split_share(n, d);
        gpu.add_rmsnorm_q8_1_split(x, delta, g, x_alt, xf, xq, r_out, n, d, eps, x_early, share)?;
        std::mem::swap(x, x_alt);
    } else {
        gpu.add_rmsnorm_q8_1(x, delta, g, xf, xq, r_out, n, d, eps)?;
    }
    Ok(())
}

/// The state of one segment's launches: the pass's choices of launch structure, the
/// residual stream the walk is on now and the scratch buffers the launches write.
struct Step<'a> {
    ctx: &'a PassCtx<'a>,
    gpu: &'a Gpu,
    rope_table: &'a CudaSlice<f32>,
    fused: bool,
    geo: RopeStoreArgs,
    scale: f32,
    /// Single-row passes of the mmvq family compute the norm steps inside the matvecs that
    /// consume them (see [`encode`]).
    prologues: bool,
    /// Rows too wide for the prologue take the norm step split over blocks (see
    /// [`encode`]).
    split_norm: bool,
    /// The residual stream: the scratch's for the first stage, a stage's own buffers after
    /// each boundary of a split walk.
    x: &'a mut CudaSlice<f32>,
    /// The buffer the next prologue or split norm writes the updated stream to; it swaps
    /// with `x`.
    x_alt: &'a mut CudaSlice<f32>,
    delta: &'a mut CudaSlice<f32>,
    /// Whether a layer ran yet, i.e. whether `delta` holds a pending update to add.
    walked: bool,
    xf: &'a mut CudaSlice<f32>,
    hf: &'a mut CudaSlice<f32>,
    att: &'a mut CudaSlice<f32>,
    xq: &'a mut CudaSlice<BlockQ8_1>,
    r: &'a mut CudaSlice<f32>,
    qkv: &'a mut CudaSlice<f32>,
    gu: &'a mut CudaSlice<f32>,
    part_o: &'a mut CudaSlice<f32>,
    part_ml: &'a mut CudaSlice<f32>,
    naive: &'a mut CudaSlice<f32>,
    logits: &'a mut CudaSlice<f32>,
    pos: &'a CudaSlice<i32>,
    max_len: usize,
}

/// Every launch of segment `k` of one pass, in stream order on the segment's device: the
/// embedding when the segment holds stage 0, its stages' layers (with the same-device
/// boundary copies of a split walk between them) and the head when it is the last segment.
/// The unsplit walk is one segment on the primary over every stage. With `tap` on, each
/// quantization site is copied back after the launch that produced it (eager passes only).
pub(super) fn encode(
    ctx: &PassCtx,
    k: usize,
    seg: &Segment,
    s: &mut Scratch,
    tap: &mut Tap,
) -> Result<(), KernelError> {
    let dm = ctx.dm;
    let gpu = &dm.gpus[seg.slot];
    let rope_table = &dm.rope_tables[seg.slot];
    let c = &dm.config;
    let (n, fused) = (ctx.n, ctx.tier == Tier::Fused);
    let d = c.n_embd;
    let geo = RopeStoreArgs {
        n_head: c.n_head,
        n_head_kv: c.n_head_kv,
        head_dim: c.head_dim,
    };
    let scale = 1.0 / (c.head_dim as f32).sqrt();
    let Scratch {
        x,
        x_alt,
        delta,
        xf,
        hf,
        att,
        xq,
        r,
        qkv,
        gu,
        part_o,
        part_ml,
        naive,
        logits,
        pos,
        tokens,
        max_len,
        stage_bufs,
        ..
    } = s;
    let mut stage_bufs: Vec<Option<&mut (CudaSlice<f32>, CudaSlice<f32>)>> =
        stage_bufs.iter_mut().map(Option::as_mut).collect();
    let mut buffers_of = |si: usize| {
        stage_bufs
            .get_mut(si)
            .and_then(Option::take)
            .map(|b| (&mut b.0, &mut b.1))
            .ok_or_else(|| KernelError::Shape {
                kernel: "stage boundary copy",
                message: format!(
                    "stage {si} has no buffers on CUDA device {} ({} stages)",
                    gpu.ordinal(),
                    ctx.stages.len()
                ),
            })
    };
    // The residual stream the walk is on now: the scratch's for the first stage, a stage's
    // own buffers after each boundary of a split walk (filled by the peer copy of
    // `hand_over` when the segment starts after stage 0).
    let (x, delta) = if seg.stages.start == 0 || ctx.walk == Walk::Unsplit {
        (x, delta)
    } else {
        buffers_of(seg.stages.start)?
    };
    // Whether a layer ran yet, i.e. whether `delta` holds a pending update to add.
    let walked = ctx.walk == Walk::Split && ctx.walked_before(seg.stages.start);
    // Single-row passes of the mmvq family compute the norm steps inside the matvecs that
    // consume them (a launch structure, not a numeric door: the blocks are the standalone
    // kernel's bits under both tiers, see docs/numerics.md), for quantized weights and rows
    // within the prologue's width, unless `MEMRA_PROLOGUES=0`. Traced passes keep the
    // standalone kernels, whose outputs are the sites the trace copies back.
    let prologues_on = gpu.tuning().prologues;
    let prologues = n == 1 && ctx.family == MatvecFamily::Mmvq && !tap.on() && prologues_on;
    // Rows too wide for the prologue (llama-7B's 4096), single or batched, take the norm step
    // split over blocks, out of place: it writes the updated stream to `x_alt` and the walk
    // swaps, as it does after a prologue (both norms of every layer, so again an even number
    // of flips).
    let split_norm = !tap.on()
        && prologues_on
        && d > Gpu::NORM_PROLOGUE_MAX_COLS
        && d <= Gpu::NORM_WIDE_MAX_COLS;
    let mut step = Step {
        ctx,
        gpu,
        rope_table,
        fused,
        geo,
        scale,
        prologues,
        split_norm,
        x,
        x_alt,
        delta,
        walked,
        xf,
        hf,
        att,
        xq,
        r,
        qkv,
        gu,
        part_o,
        part_ml,
        naive,
        logits,
        pos,
        max_len: *max_len,
    };

    if seg.stages.start == 0 {
        step.embed(tokens)?;
    }
    for si in seg.stages.clone() {
        if si > seg.stages.start && ctx.walk == Walk::Split {
            let (sx, sd) = buffers_of(si)?;
            step.enter_stage(si, sx, sd)?;
        }
        for l in ctx.stages[si].clone() {
            let layer = &dm.layers[l];
            // Both norms of a layer take the prologue or neither, so the residual stream
            // flips buffers an even number of times and the layer ends where it started
            // (the boundary copies and `hand_over` read it there).
            let fuse_norms = step.norm_prologue(&layer.wqkv) && step.norm_prologue(&layer.w_gu);
            step.attention(l, layer, fuse_norms, tap)?;
            step.feed_forward(l, layer, fuse_norms, tap)?;
            step.walked = true;
        }
    }
    if k + 1 < ctx.n_segments {
        // A later segment, on another device, continues from this residual stream.
        return Ok(());
    }
    step.head(tap)
}

impl<'a> Step<'a> {
    /// Whether the norm step in front of `w` runs as the matvec's prologue: quantized
    /// weights and rows within the prologue's width, on a pass that takes prologues.
    fn norm_prologue(&self, w: &DevWeight) -> bool {
        let d = self.ctx.dm.config.n_embd;
        self.prologues && w.quantized() && d <= Gpu::NORM_PROLOGUE_MAX_COLS
    }

    /// The token embedding of every row into the residual stream (stage 0 only).
    fn embed(&mut self, tokens: &CudaSlice<u32>) -> Result<(), KernelError> {
        let dm = self.ctx.dm;
        let c = &dm.config;
        let (n, d) = (self.ctx.n, c.n_embd);
        self.gpu
            .embed(dm.token_embd.view(), c.n_vocab, d, tokens, self.x, n)
    }

    /// The same-device boundary of a split walk into stage `si`: copies the residual stream
    /// (and the pending update once a layer ran) into the stage's own buffers `sx` and `sd`,
    /// and walks on from those.
    fn enter_stage(
        &mut self,
        si: usize,
        sx: &'a mut CudaSlice<f32>,
        sd: &'a mut CudaSlice<f32>,
    ) -> Result<(), KernelError> {
        let (n, d) = (self.ctx.boundary_rows, self.ctx.dm.config.n_embd);
        if !self.ctx.skip_boundary_copy && n > 0 {
            let m = n * d;
            let stream = self.gpu.stream();
            stream
                .memcpy_dtod(&self.x.slice(..m), &mut sx.slice_mut(..m))
                .map_err(|source| KernelError::Driver {
                    what: format!("copying the residual stream into stage {si}"),
                    source,
                })?;
            if self.walked {
                stream
                    .memcpy_dtod(&self.delta.slice(..m), &mut sd.slice_mut(..m))
                    .map_err(|source| KernelError::Driver {
                        what: format!("copying the pending residual update into stage {si}"),
                        source,
                    })?;
            }
        }
        (self.x, self.delta) = (sx, sd);
        Ok(())
    }

    /// Layer `l`'s attention block, the previous layer's feed-forward output added first:
    /// the norm step and the q/k/v projection (one launch under `fuse_norms`), RoPE and the
    /// KV store, attention, and the output projection into `delta`.
    fn attention(
        &mut self,
        l: usize,
        layer: &DevLayer,
        fuse_norms: bool,
        tap: &mut Tap,
    ) -> Result<(), KernelError> {
        let (ctx, gpu, geo, scale) = (self.ctx, self.gpu, self.geo, self.scale);
        let c = &ctx.dm.config;
        let (n, fused) = (ctx.n, self.fused);
        let (d, qd, kvd) = (c.n_embd, c.q_dim(), c.kv_dim());
        if fuse_norms {
            gpu.matvec_norm_b1(
                layer.wqkv.view(),
                layer.wqkv.rows,
                d,
                self.x,
                self.walked.then_some(&*self.delta),
                &layer.attn_norm,
                ctx.eps,
                self.x_alt,
                fused.then_some(&mut *self.r),
                self.qkv,
            )?;
            std::mem::swap(&mut self.x, &mut self.x_alt);
        } else {
            norm_step(
                gpu,
                self.split_norm,
                &mut self.x,
                &mut self.x_alt,
                self.walked.then_some(&*self.delta),
                &layer.attn_norm,
                (!layer.wqkv.quantized()).then_some(&mut *self.xf),
                self.xq,
                fused.then_some(&mut *self.r),
                n,
                d,
                ctx.eps,
                // After a layer, x is the previous layer's feed-forward norm step's
                // output, three launches back; before the first, the embedding or a
                // boundary copy has just written it.
                self.walked,
            )?;
            tap.record(gpu, l, Site::AttnIn, self.xq, d, fused.then_some(&*self.r))?;
            matvec(gpu, ctx.family, &layer.wqkv, self.xq, self.xf, n, self.qkv)?;
        }
        let rows = AttnRows {
            pos: self.pos,
            k_cache: &ctx.kptr[l],
            v_cache: &ctx.vptr[l],
            batch: n,
        };
        let post_scale = fused.then_some(&*self.r);
        if !ctx.fuse_rope {
            gpu.rope_store_rows(self.qkv, self.rope_table, post_scale, &rows, geo)?;
        }
        if let Some(qmax) = ctx.kv_q8 {
            gpu.kv_round_q8_0_rows(&rows, kvd, c.n_ctx, qmax)?;
        }
        // The attention kernels quantize their output for a quantized wo when the head
        // width allows, saving a launch per layer; the blocks are the same either way.
        let quantize_in_attention = layer.wo.quantized() && attention_can_quantize(c.head_dim);
        let outq = quantize_in_attention.then_some(&mut *self.xq);
        // With a single chunk the split-K composition is the one-block-per-head one bit for
        // bit (the combine multiplies by expf(0) = 1 and adds to 0), so short contexts run the
        // single kernel and skip the combine launch. The fused forms compute exactly what
        // rope_store_rows followed by the unfused kernel computes.
        if ctx.split_k && ctx.chunks > 1 && ctx.fuse_rope {
            gpu.attention_rope_split_k_rows(
                self.qkv,
                self.rope_table,
                post_scale,
                &rows,
                self.att,
                outq,
                self.part_o,
                self.part_ml,
                geo,
                ctx.chunks,
                scale,
            )?;
        } else if ctx.split_k && ctx.chunks > 1 {
            // A prompt pass's rows read one cache: the tiled form (the same bits).
            let split_k_rows = if ctx.one_sequence {
                Gpu::attention_split_k_tile_rows
            } else {
                Gpu::attention_split_k_rows
            };
            split_k_rows(
                gpu,
                self.qkv,
                qd + 2 * kvd,
                &rows,
                self.att,
                outq,
                self.part_o,
                self.part_ml,
                geo,
                ctx.chunks,
                scale,
            )?;
        } else if ctx.fuse_rope {
            gpu.attention_rope_naive_rows(
                self.qkv,
                self.rope_table,
                post_scale,
                &rows,
                self.att,
                outq,
                self.naive,
                geo,
                self.max_len,
                scale,
            )?;
        } else {
            gpu.attention_naive_rows(
                self.qkv,
                qd + 2 * kvd,
                &rows,
                self.att,
                outq,
                self.naive,
                geo,
                self.max_len,
                scale,
            )?;
        }
        // A float wo reads `att` itself; the trace still holds the quantized attention
        // output there, as the CPU backend records it for every weight type.
        if (layer.wo.quantized() || tap.on()) && !quantize_in_attention {
            gpu.quantize_q8_1_n(self.att, self.xq, n * qd / QK)?;
        }
        tap.record(gpu, l, Site::AttnOut, self.xq, qd, None)?;
        matvec(gpu, ctx.family, &layer.wo, self.xq, self.att, n, self.delta)
    }

    /// Layer `l`'s feed-forward block, the attention output added first: the norm step and
    /// the gate/up projection (one launch under `fuse_norms`), SwiGLU with the q8_1
    /// quantization of its output, and the down projection into `delta`.
    fn feed_forward(
        &mut self,
        l: usize,
        layer: &DevLayer,
        fuse_norms: bool,
        tap: &mut Tap,
    ) -> Result<(), KernelError> {
        let (ctx, gpu) = (self.ctx, self.gpu);
        let c = &ctx.dm.config;
        let (n, fused) = (ctx.n, self.fused);
        let (d, ff) = (c.n_embd, c.n_ff);
        if fuse_norms {
            gpu.matvec_norm_b1(
                layer.w_gu.view(),
                layer.w_gu.rows,
                d,
                self.x,
                Some(&*self.delta),
                &layer.ffn_norm,
                ctx.eps,
                self.x_alt,
                fused.then_some(&mut *self.r),
                self.gu,
            )?;
            std::mem::swap(&mut self.x, &mut self.x_alt);
        } else {
            norm_step(
                gpu,
                self.split_norm,
                &mut self.x,
                &mut self.x_alt,
                Some(&*self.delta),
                &layer.ffn_norm,
                (!layer.w_gu.quantized()).then_some(&mut *self.xf),
                self.xq,
                fused.then_some(&mut *self.r),
                n,
                d,
                ctx.eps,
                // x is this layer's attention norm step's output, three launches back.
                true,
            )?;
            tap.record(gpu, l, Site::FfnIn, self.xq, d, fused.then_some(&*self.r))?;
            matvec(gpu, ctx.family, &layer.w_gu, self.xq, self.xf, n, self.gu)?;
        }
        gpu.swiglu_q8_1(
            self.gu,
            fused.then_some(&*self.r),
            (!layer.w_down.quantized()).then_some(&mut *self.hf),
            self.xq,
            n,
            ff,
        )?;
        tap.record(gpu, l, Site::FfnDownIn, self.xq, ff, None)?;
        matvec(
            gpu,
            ctx.family,
            &layer.w_down,
            self.xq,
            self.hf,
            n,
            self.delta,
        )
    }

    /// The head: the output norm step and the output projection into `logits`, with the
    /// fused tier's post-scale.
    fn head(&mut self, tap: &mut Tap) -> Result<(), KernelError> {
        let (ctx, gpu) = (self.ctx, self.gpu);
        let dm = ctx.dm;
        let c = &dm.config;
        let (n, fused) = (ctx.n, self.fused);
        let d = c.n_embd;
        let head = dm.head();
        // Nothing reads the stream after the head's norm, so a flip here needs no partner.
        norm_step(
            gpu,
            self.split_norm,
            &mut self.x,
            &mut self.x_alt,
            self.walked.then_some(&*self.delta),
            &dm.output_norm,
            (!head.quantized()).then_some(&mut *self.xf),
            self.xq,
            fused.then_some(&mut *self.r),
            n,
            d,
            ctx.eps,
            self.walked,
        )?;
        // The planted `batch-reduction` defect, as the CPU backend plants it: the fused
        // composition (q8_1 of x * g, the factor applied to the logits after the matvec) with
        // the factor from a sum of squares in reverse order. It overwrites the norm step's
        // outputs; `self.x` holds the stream that step updated, whichever buffer it is on now.
        let reversed = ctx.reversed_head_norm;
        if reversed {
            gpu.rmsnorm_quantize_reversed(
                self.x,
                &dm.output_norm,
                (!head.quantized()).then_some(&mut *self.xf),
                self.xq,
                self.r,
                n,
                d,
                ctx.eps,
            )?;
        }
        let post_scale = fused || reversed;
        tap.record(
            gpu,
            c.n_layer,
            Site::HeadIn,
            self.xq,
            d,
            post_scale.then_some(&*self.r),
        )?;
        // The fused tier (single rows, mmvq) applies the head's post-scale as the matvec writes
        // each logit: the same multiply as the scale launch it saves.
        if fused && !reversed && n == 1 && ctx.family == MatvecFamily::Mmvq && head.quantized() {
            gpu.matvec_scaled_b1(
                head.view(),
                head.rows,
                head.cols,
                self.xq,
                self.r,
                self.logits,
            )?;
        } else {
            matvec(gpu, ctx.family, head, self.xq, self.xf, n, self.logits)?;
            if post_scale {
                gpu.scale(self.logits, self.r, n * c.n_vocab, c.n_vocab)?;
            }
        }
        Ok(())
    }
}
