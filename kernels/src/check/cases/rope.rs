//! The rope family's case: RoPE with and without the post-scale.

use super::{R, Rng, down, up};
use crate::check::report::{CheckRow, compare_f32};
use crate::cuda::Gpu;
use crate::twin;

/// RoPE with and without the post-scale, two rows at different positions.
pub fn rope(gpu: &Gpu, rng: &mut Rng) -> R<Vec<CheckRow>> {
    let mut out = Vec::new();
    for (heads, hd, positions) in [
        (9usize, 64usize, [0usize, 2047]),
        (3, 64, [1, 17]),
        (32, 128, [5, 4095]),
    ] {
        let n_pos = 4096;
        let table = twin::rope_table(hd, 100_000.0, n_pos);
        let dt = up(gpu, &table)?;
        let x = rng.vec(2 * heads * hd, 1.5);
        let scales = [0.75f32, 1.3];
        for post in [false, true] {
            let mut want = x.clone();
            for b in 0..2 {
                let s = post.then_some(scales[b]);
                twin::rope(
                    &mut want[b * heads * hd..(b + 1) * heads * hd],
                    positions[b],
                    &table,
                    heads,
                    hd,
                    s,
                )
                .expect("shapes fit");
            }
            let mut dx = up(gpu, &x)?;
            let dpos = up(gpu, &positions.map(|p| p as i32))?;
            let ds = up(gpu, &scales)?;
            gpu.rope(&mut dx, &dt, post.then_some(&ds), &dpos, 2, heads, hd)?;
            let tag = if post { "post-scale" } else { "plain" };
            out.push(compare_f32(
                format!(
                    "kernel-check/rope_f32/{heads}x{hd}/pos={}+{}/{tag}",
                    positions[0], positions[1]
                ),
                &want,
                &down(gpu, &dx)?,
                heads * hd,
                None,
            ));
        }
    }
    Ok(out)
}
