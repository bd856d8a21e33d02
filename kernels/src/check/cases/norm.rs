//! The norm family's cases: RMS norm and its fused q8_1 form (with q8_1 quantization on
//! the same inputs, in one group so that the rows and the inputs drawn stay in their order),
//! and the engine's norm step in its one-block and split forms.

use cudarc::driver::CudaSlice;
use half::f16;

use super::{R, Rng, down, q8_words, quantize_host, up, zeros};
use crate::blocks::{BlockQ8_1, QK};
use crate::check::report::{CheckRow, compare_f32, compare_u32};
use crate::cuda::Gpu;
use crate::twin;

/// q8_1 quantization and both norms at every width.
pub fn norm_and_quantize(gpu: &Gpu, rng: &mut Rng) -> R<Vec<CheckRow>> {
    let mut rows = Vec::new();
    let nrows = 3;
    for cols in [576usize, 1536, 4096, 11008, 32 * 37, 96] {
        let x = rng.vec(nrows * cols, 2.0);
        let g: Vec<f32> = (0..cols).map(|_| 1.0 + 0.3 * rng.f()).collect();
        let (dx, dg) = (up(gpu, &x)?, up(gpu, &g)?);
        let geo = format!("{nrows}x{cols}");

        let mut dq = zeros::<BlockQ8_1>(gpu, nrows * cols / QK)?;
        gpu.quantize_q8_1(&dx, &mut dq)?;
        let want = q8_words(&quantize_host(&x));
        rows.push(compare_u32(
            format!("kernel-check/quantize_q8_1_f32/{geo}"),
            &want,
            &q8_words(&down(gpu, &dq)?),
            34,
        ));

        let mut dout = zeros::<f32>(gpu, nrows * cols)?;
        gpu.rmsnorm(&dx, &dg, &mut dout, nrows, cols, 1e-5)?;
        let mut want = vec![0.0; nrows * cols];
        for r in 0..nrows {
            let span = r * cols..(r + 1) * cols;
            twin::rmsnorm(&x[span.clone()], &g, 1e-5, &mut want[span]).expect("lengths fit");
        }
        rows.push(compare_f32(
            format!("kernel-check/rmsnorm_f32/{geo}"),
            &want,
            &down(gpu, &dout)?,
            cols,
            None,
        ));

        let mut dr = zeros::<f32>(gpu, nrows)?;
        gpu.rmsnorm_quantize_fused(&dx, &dg, &mut dq, &mut dr, nrows, cols, 1e-5)?;
        let mut wq = vec![
            BlockQ8_1 {
                d: f16::ZERO,
                s: f16::ZERO,
                qs: [0; QK]
            };
            nrows * cols / QK
        ];
        let mut wr = vec![0.0f32; nrows];
        for r in 0..nrows {
            wr[r] = twin::rmsnorm_quantize_fused(
                &x[r * cols..(r + 1) * cols],
                &g,
                1e-5,
                &mut wq[r * cols / QK..(r + 1) * cols / QK],
            )
            .expect("lengths fit");
        }
        rows.push(compare_u32(
            format!("kernel-check/rmsnorm_quantize_fused_f32/q/{geo}"),
            &q8_words(&wq),
            &q8_words(&down(gpu, &dq)?),
            34,
        ));
        rows.push(compare_f32(
            format!("kernel-check/rmsnorm_quantize_fused_f32/r/{geo}"),
            &wr,
            &down(gpu, &dr)?,
            1,
            None,
        ));
    }
    Ok(rows)
}

/// The twins' norm step of one row: `v = x + delta` (when given), then q8_1 of
/// `rmsnorm(v)` (separate tier, `r` None) or `rmsnorm_quantize_fused(v)` and its `r`.
pub(super) fn twin_norm_step(
    x: &[f32],
    delta: Option<&[f32]>,
    g: &[f32],
    fused: bool,
) -> (Vec<f32>, Vec<BlockQ8_1>, Option<f32>) {
    let mut v = x.to_vec();
    if let Some(d) = delta {
        twin::add(&mut v, d).expect("lengths fit");
    }
    if fused {
        let mut q = quantize_host(&vec![0.0; v.len()]);
        let r = twin::rmsnorm_quantize_fused(&v, g, 1e-5, &mut q).expect("lengths fit");
        (v, q, Some(r))
    } else {
        let mut y = vec![0.0; v.len()];
        twin::rmsnorm(&v, g, 1e-5, &mut y).expect("lengths fit");
        (v, quantize_host(&y), None)
    }
}

/// A norm step's outputs against the twins' (`want`: the updated residual, its q8_1 blocks,
/// r): the residual as row `x_row`, the blocks, then `between`, then r when `got` has it (the
/// fused tier).
#[allow(clippy::too_many_arguments)]
fn norm_rows(
    gpu: &Gpu,
    out: &mut Vec<CheckRow>,
    kernel: &str,
    x_row: &str,
    geo: &str,
    cols: usize,
    want: (&[f32], &[BlockQ8_1], &[f32]),
    got: (
        &CudaSlice<f32>,
        &CudaSlice<BlockQ8_1>,
        Option<&CudaSlice<f32>>,
    ),
    between: Option<CheckRow>,
) -> R<()> {
    out.push(compare_f32(
        format!("kernel-check/{kernel}/{x_row}/{geo}"),
        want.0,
        &down(gpu, got.0)?,
        cols,
        None,
    ));
    out.push(compare_u32(
        format!("kernel-check/{kernel}/q/{geo}"),
        &q8_words(want.1),
        &q8_words(&down(gpu, got.1)?),
        34,
    ));
    out.extend(between);
    if let Some(r) = got.2 {
        out.push(compare_f32(
            format!("kernel-check/{kernel}/r/{geo}"),
            want.2,
            &down(gpu, r)?,
            1,
            None,
        ));
    }
    Ok(())
}

/// The norm step (`add_rmsnorm_q8_1_f32`, its wide form and its memory path) against the
/// twins' add + rmsnorm + quantize composition, both tiers, 3 rows with a residual update.
pub fn norm_step(gpu: &Gpu, rng: &mut Rng) -> R<Vec<CheckRow>> {
    let mut out = Vec::new();
    let nrows = 3;
    // 576 and 96: registers of the narrow kernel; 1184 and 4096: the wide kernel; 11008:
    // the narrow kernel's memory path.
    for cols in [576usize, 96, 32 * 37, 4096, 11008] {
        let kernel = if cols > Gpu::NORM_PROLOGUE_MAX_COLS && cols <= Gpu::NORM_WIDE_MAX_COLS {
            "add_rmsnorm_q8_1_wide_f32"
        } else {
            "add_rmsnorm_q8_1_f32"
        };
        let x = rng.vec(nrows * cols, 2.0);
        let delta = rng.vec(nrows * cols, 0.5);
        let g: Vec<f32> = (0..cols).map(|_| 1.0 + 0.3 * rng.f()).collect();
        let (dd, dg) = (up(gpu, &delta)?, up(gpu, &g)?);
        for fused in [false, true] {
            let tier = if fused { "fused" } else { "separate" };
            let geo = format!("{nrows}x{cols}/{tier}");
            let mut dx = up(gpu, &x)?;
            let mut dq = zeros::<BlockQ8_1>(gpu, nrows * cols / QK)?;
            let mut dr = zeros::<f32>(gpu, nrows)?;
            let mut dxf = zeros::<f32>(gpu, nrows * cols)?;
            gpu.add_rmsnorm_q8_1(
                &mut dx,
                Some(&dd),
                &dg,
                Some(&mut dxf),
                &mut dq,
                fused.then_some(&mut dr),
                nrows,
                cols,
                1e-5,
            )?;
            let (mut wv, mut wq, mut wr) = (Vec::new(), Vec::new(), Vec::new());
            for r in 0..nrows {
                let span = r * cols..(r + 1) * cols;
                let (v, q, rf) = twin_norm_step(&x[span.clone()], Some(&delta[span]), &g, fused);
                wv.extend(v);
                wq.extend(q);
                wr.extend(rf);
            }
            let want = (&wv[..], &wq[..], &wr[..]);
            let got = (&dx, &dq, fused.then_some(&dr));
            norm_rows(gpu, &mut out, kernel, "x", &geo, cols, want, got, None)?;
            // The wide rows split over blocks, out of place, with the f32 values.
            if kernel != "add_rmsnorm_q8_1_wide_f32" {
                continue;
            }
            let k = "add_rmsnorm_q8_1_split_f32";
            // x read after the programmatic-launch wait, and before it (x_early: uploaded by a
            // copy just before, so final when the kernel starts).
            let groups = cols.div_ceil(256);
            for (x_early, share) in [(false, 1), (true, 1), (true, 2), (false, 3), (true, groups)] {
                let geo = match (x_early, share) {
                    (false, 1) => geo.clone(),
                    (true, 1) => format!("{geo}/x-early"),
                    (true, s) => format!("{geo}/x-early/share-{s}"),
                    (false, s) => format!("{geo}/share-{s}"),
                };
                let sx = up(gpu, &x)?;
                let mut sxo = zeros::<f32>(gpu, nrows * cols)?;
                let mut sq = zeros::<BlockQ8_1>(gpu, nrows * cols / QK)?;
                let mut sr = zeros::<f32>(gpu, nrows)?;
                let mut sxf = zeros::<f32>(gpu, nrows * cols)?;
                gpu.add_rmsnorm_q8_1_split(
                    &sx,
                    Some(&dd),
                    &dg,
                    &mut sxo,
                    Some(&mut sxf),
                    &mut sq,
                    fused.then_some(&mut sr),
                    nrows,
                    cols,
                    1e-5,
                    x_early,
                    share,
                )?;
                let xf = compare_f32(
                    format!("kernel-check/{k}/xf==one-block/{geo}"),
                    &down(gpu, &dxf)?,
                    &down(gpu, &sxf)?,
                    cols,
                    None,
                );
                let want = (&wv[..], &wq[..], &wr[..]);
                let got = (&sxo, &sq, fused.then_some(&sr));
                norm_rows(gpu, &mut out, k, "x_out", &geo, cols, want, got, Some(xf))?;
            }
        }
    }
    Ok(out)
}
