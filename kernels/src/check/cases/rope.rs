//! The rope family's cases: RoPE with and without the post-scale, and the q8_0 KV cache's
//! rounding of the rows a pass stored.

use super::{R, Rng, down, up};
use crate::check::report::{CheckRow, compare_f32};
use crate::cuda::{AttnRows, Gpu};
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

/// The q8_0 KV cache's rounding: three rows of caches (one with a zero block, one at a
/// position outside the table, left alone), K and V, against the twin bit for bit.
pub fn kv_round_q8_0(gpu: &Gpu, rng: &mut Rng) -> R<Vec<CheckRow>> {
    let mut out = Vec::new();
    for (kvd, qmax) in [(192usize, 127), (512, 127), (192, 15)] {
        let (n_pos, positions) = (8usize, [3i32, 0, 9]);
        let mut k: Vec<Vec<f32>> = (0..3).map(|_| rng.vec(n_pos * kvd, 2.0)).collect();
        let v: Vec<Vec<f32>> = (0..3).map(|_| rng.vec(n_pos * kvd, 0.5)).collect();
        k[1][..32].iter_mut().for_each(|x| *x = 0.0);
        let dk = k.iter().map(|c| up(gpu, c)).collect::<R<Vec<_>>>()?;
        let dv = v.iter().map(|c| up(gpu, c)).collect::<R<Vec<_>>>()?;
        let kp: Vec<u64> = dk.iter().map(|c| gpu.address(c)).collect();
        let vp: Vec<u64> = dv.iter().map(|c| gpu.address(c)).collect();
        let (dpos, dkp, dvp) = (up(gpu, &positions)?, up(gpu, &kp)?, up(gpu, &vp)?);
        let rows = AttnRows {
            pos: &dpos,
            k_cache: &dkp,
            v_cache: &dvp,
            batch: 3,
        };
        gpu.kv_round_q8_0_rows(&rows, kvd, n_pos, qmax)?;
        for (name, host, dev) in [("k", &k, &dk), ("v", &v, &dv)] {
            let mut want: Vec<f32> = Vec::new();
            let mut got: Vec<f32> = Vec::new();
            for (b, (h, d)) in host.iter().zip(dev).enumerate() {
                let mut w = h.clone();
                let p = positions[b];
                if (0..n_pos as i32).contains(&p) {
                    let at = p as usize * kvd;
                    twin::kv_round_blocks(&mut w[at..at + kvd], qmax).expect("whole blocks");
                }
                want.extend(w);
                got.extend(down(gpu, d)?);
            }
            out.push(compare_f32(
                format!("kernel-check/kv_round_q8_0_rows_f32/kvd={kvd}/qmax={qmax}/{name}"),
                &want,
                &got,
                kvd,
                None,
            ));
        }
    }
    Ok(out)
}
