//! The elementwise family's cases: SwiGLU (alone and quantized at once), the residual add, the
//! per-row scale and the KV store.

use super::{R, Rng, down, q8_words, quantize_host, up, zeros};
use crate::blocks::{BlockQ8_1, QK};
use crate::check::report::{CheckRow, compare_f32, compare_u32};
use crate::cuda::Gpu;
use crate::twin;

/// SwiGLU, residual add, scale and KV store, all bit for bit (SiLU's `exp` is
/// `exp_mirrored` on both sides), and the batched SwiGLU quantized to q8_1 in one kernel
/// against `twin::swiglu` then `twin::quantize_q8_1`.
pub fn elementwise(gpu: &Gpu, rng: &mut Rng) -> R<Vec<CheckRow>> {
    let mut out = Vec::new();
    let (rows, cols) = (3usize, 1536usize);
    let n = rows * cols;
    let g = rng.vec(n, 3.0);
    let u = rng.vec(n, 1.0);
    let scales = [0.5f32, 1.25, 3.0];
    let (dg, du, ds) = (up(gpu, &g)?, up(gpu, &u)?, up(gpu, &scales)?);
    for post in [false, true] {
        let want = twin_swiglu(&g, &u, &scales, cols, post);
        let mut dout = zeros::<f32>(gpu, n)?;
        gpu.swiglu(&dg, &du, &mut dout, post.then_some(&ds), n, cols)?;
        let tag = if post { "post-scale" } else { "plain" };
        out.push(compare_f32(
            format!("kernel-check/swiglu_f32/{rows}x{cols}/{tag}"),
            &want,
            &down(gpu, &dout)?,
            cols,
            None,
        ));
    }

    let mut want = g.clone();
    twin::add(&mut want, &u).expect("lengths fit");
    let mut dx = up(gpu, &g)?;
    gpu.add(&mut dx, &du, n)?;
    out.push(compare_f32(
        format!("kernel-check/add_f32/{n}"),
        &want,
        &down(gpu, &dx)?,
        cols,
        None,
    ));

    let mut want = g.clone();
    for (r, row) in want.chunks_mut(cols).enumerate() {
        twin::scale(row, scales[r]);
    }
    let mut dx = up(gpu, &g)?;
    gpu.scale(&mut dx, &ds, n, cols)?;
    out.push(compare_f32(
        format!("kernel-check/scale_f32/{rows}x{cols}"),
        &want,
        &down(gpu, &dx)?,
        cols,
        None,
    ));

    let row_len = 3 * 64;
    let mut cache = rng.vec(8 * row_len, 1.0);
    let src = rng.vec(row_len, 1.0);
    let mut dc = up(gpu, &cache)?;
    let dsrc = up(gpu, &src)?;
    gpu.kv_store(&mut dc, &dsrc, Some(&ds), 5, row_len)?;
    twin::kv_store(&mut cache, 5, &src, Some(scales[0])).expect("cache covers pos");
    out.push(compare_f32(
        format!("kernel-check/kv_store_f32/pos=5x{row_len}"),
        &cache,
        &down(gpu, &dc)?,
        row_len,
        None,
    ));

    // swiglu_q8_1_f32: rows of [gate | up], so row b's gate is g's row b and its up is u's.
    let n_ff = cols;
    let mut gu = Vec::with_capacity(2 * n);
    for r in 0..rows {
        gu.extend_from_slice(&g[r * cols..(r + 1) * cols]);
        gu.extend_from_slice(&u[r * cols..(r + 1) * cols]);
    }
    let dgu = up(gpu, &gu)?;
    for post in [false, true] {
        let want = twin_swiglu(&g, &u, &scales, cols, post);
        let want_q = quantize_host(&want);
        let mut dhf = zeros::<f32>(gpu, n)?;
        let mut dhq = zeros::<BlockQ8_1>(gpu, n / QK)?;
        gpu.swiglu_q8_1(
            &dgu,
            post.then_some(&ds),
            Some(&mut dhf),
            &mut dhq,
            rows,
            n_ff,
        )?;
        let tag = if post { "post-scale" } else { "plain" };
        out.push(compare_f32(
            format!("kernel-check/swiglu_q8_1_f32/{rows}x{n_ff}/{tag}/f32"),
            &want,
            &down(gpu, &dhf)?,
            cols,
            None,
        ));
        out.push(compare_u32(
            format!("kernel-check/swiglu_q8_1_f32/{rows}x{n_ff}/{tag}/q8_1"),
            &q8_words(&want_q),
            &q8_words(&down(gpu, &dhq)?),
            34,
        ));
    }
    Ok(out)
}

/// `twin::swiglu` over rows of `cols` elements, row `r` post-scaled by `scales[r]` when `post`.
fn twin_swiglu(g: &[f32], u: &[f32], scales: &[f32], cols: usize, post: bool) -> Vec<f32> {
    let mut want = vec![0.0; g.len()];
    for (r, &sc) in scales.iter().enumerate().take(g.len() / cols) {
        let span = r * cols..(r + 1) * cols;
        twin::swiglu(
            &g[span.clone()],
            &u[span.clone()],
            &mut want[span],
            post.then_some(sc),
        )
        .expect("lengths fit");
    }
    want
}
