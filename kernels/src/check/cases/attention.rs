//! The attention family's cases: both attention families against their twins, and the
//! decode kernels that do the RoPE and KV store themselves against the prompt pass's
//! launches on the device and against the twins.

use super::{R, Rng, down, q8_words, up, zeros};
use crate::blocks::{BlockQ8_1, QK};
use crate::check::report::{CheckRow, compare_f32, compare_u32};
use crate::cuda::{AttnRows, Gpu, RopeStoreArgs};
use crate::twin::{self, AttnShape};

/// Both attention families against their twins, bit for bit (both sides' `exp` is
/// `exp_mirrored`).
pub fn attention(gpu: &Gpu, rng: &mut Rng) -> R<Vec<CheckRow>> {
    let mut out = Vec::new();
    let cases: [(usize, usize, usize, &[usize]); 2] = [
        (9, 3, 64, &[1, 63, 64, 65, 300, 2048]),
        (32, 8, 128, &[1, 129, 1000]),
    ];
    for (nh, nkv, hd, tokens) in cases {
        for &n in tokens {
            let s = AttnShape {
                n_heads: nh,
                n_kv_heads: nkv,
                head_dim: hd,
                n_tokens: n,
            };
            let q = rng.vec(nh * hd, 1.0);
            let k = rng.vec(n * nkv * hd, 1.0);
            let v = rng.vec(n * nkv * hd, 1.0);
            let scale = 1.0 / (hd as f32).sqrt();
            let (dq, dk, dv) = (up(gpu, &q)?, up(gpu, &k)?, up(gpu, &v)?);
            let geo = format!("{nh}/{nkv}x{hd}/n={n}");

            let mut want = vec![0.0; nh * hd];
            twin::attention_naive(&q, &k, &v, &s, scale, &mut want).expect("shapes fit");
            let mut dout = zeros::<f32>(gpu, nh * hd)?;
            let mut scratch = zeros::<f32>(gpu, nh * n)?;
            gpu.attention_naive(&dq, &dk, &dv, &mut dout, &mut scratch, &s, scale)?;
            out.push(compare_f32(
                format!("kernel-check/attention_naive_f32/{geo}"),
                &want,
                &down(gpu, &dout)?,
                hd,
                None,
            ));

            twin::attention_split_k(&q, &k, &v, &s, scale, &mut want).expect("shapes fit");
            let chunks = n.div_ceil(twin::SPLIT_K_CHUNK);
            let mut po = zeros::<f32>(gpu, nh * chunks * hd)?;
            let mut pml = zeros::<f32>(gpu, nh * chunks * 2)?;
            gpu.attention_split_k(&dq, &dk, &dv, &mut dout, &mut po, &mut pml, &s, scale)?;
            out.push(compare_f32(
                format!("kernel-check/attention_split_k_f32/{geo}"),
                &want,
                &down(gpu, &dout)?,
                hd,
                None,
            ));
        }
    }
    Ok(out)
}

/// Which attention family a fused decode check runs.
#[derive(Clone, Copy, PartialEq)]
enum Family {
    Naive,
    SplitK,
}

/// The device outputs of one decode attention (fused or unfused) over fresh copies of the
/// caches: `out`, its q8_1 blocks and every row's K and V cache afterwards.
struct DecodeOut {
    out: Vec<f32>,
    outq: Vec<BlockQ8_1>,
    caches: Vec<f32>,
}

/// The inputs of one fused decode check: B rows of one qkv buffer, each with its own caches
/// (filled for the positions before its own; its own slot holds NaN so that a kernel that
/// reads it before writing it fails).
struct DecodeCase {
    nh: usize,
    nkv: usize,
    hd: usize,
    positions: Vec<usize>,
    qkv: Vec<f32>,
    k: Vec<Vec<f32>>,
    v: Vec<Vec<f32>>,
    table: Vec<f32>,
    scales: Vec<f32>,
}

impl DecodeCase {
    fn stride(&self) -> usize {
        (self.nh + 2 * self.nkv) * self.hd
    }
    fn kvd(&self) -> usize {
        self.nkv * self.hd
    }

    /// The twin composition of row b: `twin::rope` of q and k, `twin::kv_store` of k (no
    /// scale) and v (the post-scale), then the family's attention twin. Returns the output
    /// and the row's caches after the store.
    fn twin_row(&self, b: usize, post: bool, family: Family) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
        let (nh, nkv, hd, p) = (self.nh, self.nkv, self.hd, self.positions[b]);
        let (qd, kvd) = (nh * hd, self.kvd());
        let row = &self.qkv[b * self.stride()..(b + 1) * self.stride()];
        let s = post.then_some(self.scales[b]);
        let mut q = row[..qd].to_vec();
        let mut k = row[qd..qd + kvd].to_vec();
        twin::rope(&mut q, p, &self.table, nh, hd, s).expect("shapes fit");
        twin::rope(&mut k, p, &self.table, nkv, hd, s).expect("shapes fit");
        let (mut kc, mut vc) = (self.k[b].clone(), self.v[b].clone());
        twin::kv_store(&mut kc, p, &k, None).expect("shapes fit");
        twin::kv_store(&mut vc, p, &row[qd + kvd..], s).expect("shapes fit");
        let shape = AttnShape {
            n_heads: nh,
            n_kv_heads: nkv,
            head_dim: hd,
            n_tokens: p + 1,
        };
        let n = (p + 1) * kvd;
        let scale = 1.0 / (hd as f32).sqrt();
        let mut out = vec![0.0; qd];
        match family {
            Family::Naive => twin::attention_naive(&q, &kc[..n], &vc[..n], &shape, scale, &mut out),
            Family::SplitK => {
                twin::attention_split_k(&q, &kc[..n], &vc[..n], &shape, scale, &mut out)
            }
        }
        .expect("shapes fit");
        (out, kc, vc)
    }

    /// Runs the fused kernel (`fused`) or `rope_store_rows` then the unfused kernel.
    fn run(&self, gpu: &Gpu, post: bool, family: Family, fused: bool) -> R<DecodeOut> {
        let (nh, hd, bt) = (self.nh, self.hd, self.positions.len());
        let qd = nh * hd;
        let g = RopeStoreArgs {
            n_head: nh,
            n_head_kv: self.nkv,
            head_dim: hd,
        };
        let longest = self.positions.iter().max().map_or(1, |p| p + 1);
        let scale = 1.0 / (hd as f32).sqrt();
        let mut dqkv = up(gpu, &self.qkv)?;
        let dt = up(gpu, &self.table)?;
        let ds = up(gpu, &self.scales)?;
        let post_scale = post.then_some(&ds);
        let dk = self.k.iter().map(|c| up(gpu, c)).collect::<R<Vec<_>>>()?;
        let dv = self.v.iter().map(|c| up(gpu, c)).collect::<R<Vec<_>>>()?;
        let kp: Vec<u64> = dk.iter().map(|c| gpu.address(c)).collect();
        let vp: Vec<u64> = dv.iter().map(|c| gpu.address(c)).collect();
        let pos: Vec<i32> = self.positions.iter().map(|&p| p as i32).collect();
        let (dpos, dkp, dvp) = (up(gpu, &pos)?, up(gpu, &kp)?, up(gpu, &vp)?);
        let rows = AttnRows {
            pos: &dpos,
            k_cache: &dkp,
            v_cache: &dvp,
            batch: bt,
        };
        let mut out = zeros::<f32>(gpu, bt * qd)?;
        let mut outq = zeros::<BlockQ8_1>(gpu, bt * qd / QK)?;
        if !fused {
            gpu.rope_store_rows(&mut dqkv, &dt, post_scale, &rows, g)?;
        }
        match family {
            Family::Naive => {
                let mut scratch = zeros::<f32>(gpu, bt * nh * longest)?;
                if fused {
                    gpu.attention_rope_naive_rows(
                        &dqkv,
                        &dt,
                        post_scale,
                        &rows,
                        &mut out,
                        Some(&mut outq),
                        &mut scratch,
                        g,
                        longest,
                        scale,
                    )?;
                } else {
                    gpu.attention_naive_rows(
                        &dqkv,
                        self.stride(),
                        &rows,
                        &mut out,
                        Some(&mut outq),
                        &mut scratch,
                        g,
                        longest,
                        scale,
                    )?;
                }
            }
            Family::SplitK => {
                // One chunk more than the longest row needs: the chunks past every row's
                // length must exit without writing.
                let chunks = longest.div_ceil(twin::SPLIT_K_CHUNK) + 1;
                let mut po = zeros::<f32>(gpu, bt * nh * chunks * hd)?;
                let mut pml = zeros::<f32>(gpu, bt * nh * chunks * 2)?;
                if fused {
                    gpu.attention_rope_split_k_rows(
                        &dqkv,
                        &dt,
                        post_scale,
                        &rows,
                        &mut out,
                        Some(&mut outq),
                        &mut po,
                        &mut pml,
                        g,
                        chunks,
                        scale,
                    )?;
                } else {
                    gpu.attention_split_k_rows(
                        &dqkv,
                        self.stride(),
                        &rows,
                        &mut out,
                        Some(&mut outq),
                        &mut po,
                        &mut pml,
                        g,
                        chunks,
                        scale,
                    )?;
                }
            }
        }
        let mut caches = Vec::new();
        for (k, v) in dk.iter().zip(&dv) {
            caches.extend(down(gpu, k)?);
            caches.extend(down(gpu, v)?);
        }
        Ok(DecodeOut {
            out: down(gpu, &out)?,
            outq: down(gpu, &outq)?,
            caches,
        })
    }
}

/// The decode attention kernels that do the RoPE and KV store themselves
/// (`attention_rope_naive_rows_f32`, `attention_rope_split_k_rows_f32`): against the twin
/// composition (`twin::rope`, `twin::kv_store`, then the attention twin; bit for bit, output
/// and caches), and bit for bit against `rope_store_rows_f32`
/// followed by the unfused rows kernel on the device (output, its q8_1 blocks, caches). Rows
/// of one launch sit at different positions, up to several split-K chunks and past the
/// naive kernel's shared score buffer (1024 tokens), and on both sides of the last position
/// whose whole context the naive kernel reads from its prefetch buffers alone (63, for heads
/// up to 64 wide; 31 would be for 128-wide heads, which keep the general path).
pub fn attention_rope_rows(gpu: &Gpu, rng: &mut Rng) -> R<Vec<CheckRow>> {
    let mut out = Vec::new();
    let cases: [(usize, usize, usize, &[usize]); 6] = [
        (9, 3, 64, &[0, 17, 64, 200, 1100]),
        (9, 3, 64, &[9]),
        (9, 3, 64, &[63, 62, 64]),
        (32, 32, 128, &[5, 65, 130]),
        (32, 32, 128, &[63]),
        (32, 32, 128, &[31, 0, 32]),
    ];
    for (nh, nkv, hd, positions) in cases {
        let kvd = nkv * hd;
        let n_pos = 2048;
        let caches = |rng: &mut Rng| -> Vec<Vec<f32>> {
            positions
                .iter()
                .map(|&p| {
                    let mut c = rng.vec((p + 1) * kvd, 1.0);
                    c[p * kvd..].fill(f32::NAN);
                    c
                })
                .collect()
        };
        let (k, v) = (caches(rng), caches(rng));
        let case = DecodeCase {
            nh,
            nkv,
            hd,
            positions: positions.to_vec(),
            qkv: rng.vec(positions.len() * (nh + 2 * nkv) * hd, 1.0),
            k,
            v,
            table: twin::rope_table(hd, 10_000.0, n_pos),
            scales: (0..positions.len()).map(|b| 0.6 + 0.2 * b as f32).collect(),
        };
        let pos_tag = positions
            .iter()
            .map(usize::to_string)
            .collect::<Vec<_>>()
            .join("+");
        for family in [Family::Naive, Family::SplitK] {
            for post in [false, true] {
                let name = match family {
                    Family::Naive => "attention_rope_naive_rows_f32",
                    Family::SplitK => "attention_rope_split_k_rows_f32",
                };
                let tag = if post { "post-scale" } else { "plain" };
                let at = format!("kernel-check/{name}/{nh}/{nkv}x{hd}/pos={pos_tag}/{tag}");
                let fused = case.run(gpu, post, family, true)?;
                let unfused = case.run(gpu, post, family, false)?;
                let (mut want, mut want_caches) = (Vec::new(), Vec::new());
                for b in 0..positions.len() {
                    let (o, kc, vc) = case.twin_row(b, post, family);
                    want.extend(o);
                    want_caches.extend(kc);
                    want_caches.extend(vc);
                }
                out.push(compare_f32(
                    format!("{at}/vs-twin"),
                    &want,
                    &fused.out,
                    hd,
                    None,
                ));
                out.push(compare_f32(
                    format!("{at}/kv-store-vs-twin"),
                    &want_caches,
                    &fused.caches,
                    kvd,
                    None,
                ));
                out.push(compare_f32(
                    format!("{at}/vs-unfused"),
                    &unfused.out,
                    &fused.out,
                    hd,
                    None,
                ));
                out.push(compare_u32(
                    format!("{at}/q8_1-vs-unfused"),
                    &q8_words(&unfused.outq),
                    &q8_words(&fused.outq),
                    34,
                ));
            }
        }
    }
    Ok(out)
}

/// The prompt chunk's split-K attention (`attention_split_k_tile_rows_f32`, rows reading
/// one cache in tiles of [`crate::cuda::PROMPT_TILE`]): bit for bit against the twin per row
/// and against the one-row kernel (`attention_split_k_rows_f32`) on the device (output and
/// its q8_1 blocks). Rows sit at consecutive positions, as a prompt chunk's do, across chunk
/// and tile boundaries with a ragged last tile; one case interleaves rows of two sequences,
/// so a tile's rows with another cache than its first row's take the one-row path.
// Over 150 lines: a table of cases, each one's reference from the twin row by row, its
// uploads, both kernels' runs and the four comparisons (output, q8_1 blocks, partials, m and l).
pub fn attention_prompt_rows(gpu: &Gpu, rng: &mut Rng) -> R<Vec<CheckRow>> {
    let mut out = Vec::new();
    // (heads, KV heads, head width, first position, rows, sequences)
    // Width 96 (Phi-3's) takes a chunk of K and V rows of exactly 48 KiB, past what a block
    // gets without opting in once the kernel's static shared memory counts; width 80 stays
    // under it.
    let cases: [(usize, usize, usize, usize, usize, usize); 9] = [
        (4, 2, 32, 30, 50, 1),
        (8, 2, 80, 30, 40, 1),
        (8, 4, 96, 40, 30, 1),
        (8, 2, 256, 50, 20, 1),
        (9, 3, 64, 0, 70, 1),
        (9, 3, 64, 1000, 40, 1),
        (32, 32, 128, 60, 64, 1),
        (32, 8, 128, 190, 33, 1),
        (9, 3, 64, 100, 37, 2),
    ];
    for (nh, nkv, hd, first, n_rows, n_seqs) in cases {
        let (qd, kvd) = (nh * hd, nkv * hd);
        let stride = (nh + 2 * nkv) * hd;
        let len = first + n_rows;
        let k: Vec<Vec<f32>> = (0..n_seqs).map(|_| rng.vec(len * kvd, 1.0)).collect();
        let v: Vec<Vec<f32>> = (0..n_seqs).map(|_| rng.vec(len * kvd, 1.0)).collect();
        let qkv = rng.vec(n_rows * stride, 1.0);
        let scale = 1.0 / (hd as f32).sqrt();
        // Row b belongs to sequence b % n_seqs at position first + b.
        let positions: Vec<usize> = (0..n_rows).map(|b| first + b).collect();
        let mut want = vec![0.0; n_rows * qd];
        for (b, &p) in positions.iter().enumerate() {
            let shape = AttnShape {
                n_heads: nh,
                n_kv_heads: nkv,
                head_dim: hd,
                n_tokens: p + 1,
            };
            let n = (p + 1) * kvd;
            let s = b % n_seqs;
            twin::attention_split_k(
                &qkv[b * stride..b * stride + qd],
                &k[s][..n],
                &v[s][..n],
                &shape,
                scale,
                &mut want[b * qd..(b + 1) * qd],
            )
            .expect("shapes fit");
        }
        let g = RopeStoreArgs {
            n_head: nh,
            n_head_kv: nkv,
            head_dim: hd,
        };
        let dqkv = up(gpu, &qkv)?;
        let dk = k.iter().map(|c| up(gpu, c)).collect::<R<Vec<_>>>()?;
        let dv = v.iter().map(|c| up(gpu, c)).collect::<R<Vec<_>>>()?;
        let kp: Vec<u64> = (0..n_rows).map(|b| gpu.address(&dk[b % n_seqs])).collect();
        let vp: Vec<u64> = (0..n_rows).map(|b| gpu.address(&dv[b % n_seqs])).collect();
        let pos: Vec<i32> = positions.iter().map(|&p| p as i32).collect();
        let (dpos, dkp, dvp) = (up(gpu, &pos)?, up(gpu, &kp)?, up(gpu, &vp)?);
        let rows = AttnRows {
            pos: &dpos,
            k_cache: &dkp,
            v_cache: &dvp,
            batch: n_rows,
        };
        // One chunk more than the longest row needs: those chunks must write nothing.
        let chunks = len.div_ceil(twin::SPLIT_K_CHUNK) + 1;
        let at = format!(
            "kernel-check/attention_split_k_tile_rows_f32/{nh}/{nkv}x{hd}/pos={first}..{}/seqs={n_seqs}",
            len - 1
        );
        // A tiled row that fell back to the one-row kernel would compare equal to it
        // without testing anything.
        if !gpu.tuning().prompt_tile {
            out.push(CheckRow::skip(
                at,
                "MEMRA_PROMPT_TILE=0: the tiled kernel is off",
            ));
            continue;
        }
        if !gpu.takes_prompt_tile(n_rows, hd)? {
            out.push(CheckRow::error(
                at,
                "the tiled kernel was not taken (its shared memory refused): nothing was checked",
            ));
            continue;
        }
        // The attention kernels quantize their output only for heads of at most 128.
        let quantized = crate::cuda::attention_can_quantize(hd);
        let mut results = Vec::new();
        for tiled in [true, false] {
            let mut o = zeros::<f32>(gpu, n_rows * qd)?;
            let mut oq = zeros::<BlockQ8_1>(gpu, n_rows * qd / QK)?;
            let mut po = zeros::<f32>(gpu, n_rows * nh * chunks * hd)?;
            let mut pml = zeros::<f32>(gpu, n_rows * nh * chunks * 2)?;
            let run = if tiled {
                Gpu::attention_split_k_tile_rows
            } else {
                Gpu::attention_split_k_rows
            };
            run(
                gpu,
                &dqkv,
                stride,
                &rows,
                &mut o,
                quantized.then_some(&mut oq),
                &mut po,
                &mut pml,
                g,
                chunks,
                scale,
            )?;
            results.push((
                down(gpu, &o)?,
                down(gpu, &oq)?,
                down(gpu, &po)?,
                down(gpu, &pml)?,
            ));
        }
        let (tiled, one_row) = (&results[0], &results[1]);
        out.push(compare_f32(
            format!("{at}/vs-twin"),
            &want,
            &tiled.0,
            hd,
            None,
        ));
        out.push(compare_f32(
            format!("{at}/vs-one-row"),
            &one_row.0,
            &tiled.0,
            hd,
            None,
        ));
        if quantized {
            out.push(compare_u32(
                format!("{at}/q8_1-vs-one-row"),
                &q8_words(&one_row.1),
                &q8_words(&tiled.1),
                34,
            ));
        }
        // The partials of both kernels, zero where a chunk lies past a row's length: the
        // same entries written with the same bits, and nothing past a row.
        out.push(compare_f32(
            format!("{at}/partials-vs-one-row"),
            &one_row.2,
            &tiled.2,
            hd,
            None,
        ));
        out.push(compare_f32(
            format!("{at}/max-and-sum-vs-one-row"),
            &one_row.3,
            &tiled.3,
            2,
            None,
        ));
    }
    Ok(out)
}
