//! The kernel-check cases: each uploads deterministic inputs, runs one kernel at one geometry
//! on the GPU, runs its twin on the host, and compares — bitwise where the composition is
//! mirrored, within a stated tolerance where `exp` is involved. Geometries are the real model
//! shapes (576, 1536, 49152 rows; 4096, 11008) plus ragged ones (rows not a multiple of a
//! block's rows, cols = 32 * odd).

use std::ops::Range;

use cudarc::driver::{CudaSlice, DeviceRepr, ValidAsZeroBits};
use half::{bf16, f16};

use super::report::{CheckRow, compare_f32, compare_u32};
use crate::blocks::{BlockQ4_0, BlockQ4_1, BlockQ8_0, BlockQ8_1, QK};
use crate::cuda::{DeviceWeights, Gpu};
use crate::error::KernelError;
use crate::twin::{self, AttnShape, MatvecFamily, WeightRows};

type R<T> = Result<T, KernelError>;

/// Deterministic inputs (64-bit LCG, high bits).
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0xD1B5_4A32_D192_ED03)
    }
    pub fn u32(&mut self) -> u32 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (self.0 >> 32) as u32
    }
    /// Uniform in [-1, 1).
    pub fn f(&mut self) -> f32 {
        (self.u32() >> 8) as f32 / 8_388_608.0 - 1.0
    }
    /// Roughly normal (sum of four uniforms), unit-ish variance.
    pub fn n(&mut self) -> f32 {
        (self.f() + self.f() + self.f() + self.f()) * 0.866
    }
    pub fn vec(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| self.n() * scale).collect()
    }
}

fn up<T: DeviceRepr>(gpu: &Gpu, data: &[T]) -> R<CudaSlice<T>> {
    gpu.stream()
        .clone_htod(data)
        .map_err(KernelError::driver("copying inputs to the device"))
}
fn down<T: DeviceRepr>(gpu: &Gpu, s: &CudaSlice<T>) -> R<Vec<T>> {
    gpu.stream()
        .clone_dtoh(s)
        .map_err(KernelError::driver("copying results to the host"))
}
fn zeros<T: DeviceRepr + ValidAsZeroBits>(gpu: &Gpu, n: usize) -> R<CudaSlice<T>> {
    gpu.stream()
        .alloc_zeros(n.max(1))
        .map_err(KernelError::driver("allocating device memory"))
}

/// q8_1 blocks as words (d, s, then the 32 quants) for a bitwise comparison.
fn q8_words(b: &[BlockQ8_1]) -> Vec<u32> {
    let mut w = Vec::with_capacity(b.len() * 34);
    for blk in b {
        w.push(blk.d.to_bits() as u32);
        w.push(blk.s.to_bits() as u32);
        w.extend(blk.qs.iter().map(|&q| q as i32 as u32));
    }
    w
}

fn quantize_host(x: &[f32]) -> Vec<BlockQ8_1> {
    let mut q = vec![
        BlockQ8_1 {
            d: f16::ZERO,
            s: f16::ZERO,
            qs: [0; QK]
        };
        x.len() / QK
    ];
    twin::quantize_q8_1(x, &mut q).expect("x is whole blocks");
    q
}

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

/// The twin's batched matvec over all host threads (rows split in ranges), `[b][rows]`.
fn twin_batch(
    fam: MatvecFamily,
    w: WeightRows,
    rows: usize,
    cols: usize,
    xs: &[BlockQ8_1],
    batch: usize,
) -> Vec<f32> {
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(32);
    let chunk = rows.div_ceil(threads).max(1);
    let ranges: Vec<Range<usize>> = (0..rows)
        .step_by(chunk)
        .map(|s| s..(s + chunk).min(rows))
        .collect();
    let parts: Vec<Vec<f32>> = std::thread::scope(|s| {
        let hs: Vec<_> = ranges
            .iter()
            .map(|r| {
                let r = r.clone();
                s.spawn(move || {
                    let mut y = vec![0.0f32; batch * r.len()];
                    twin::matvec_batch_rows(fam, w, cols, xs, batch, r, &mut y)
                        .expect("shapes fit");
                    y
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().expect("twin thread"))
            .collect()
    });
    let mut ys = vec![0.0f32; batch * rows];
    for (r, part) in ranges.iter().zip(&parts) {
        for b in 0..batch {
            ys[b * rows + r.start..b * rows + r.end]
                .copy_from_slice(&part[b * r.len()..(b + 1) * r.len()]);
        }
    }
    ys
}

fn q4_1_blocks(rng: &mut Rng, n: usize) -> Vec<BlockQ4_1> {
    (0..n)
        .map(|_| {
            let mut qs = [0u8; 16];
            qs.iter_mut().for_each(|b| *b = rng.u32() as u8);
            BlockQ4_1 {
                d: f16::from_f32(0.002 + 0.01 * rng.f().abs()),
                m: f16::from_f32(-0.08 * rng.f().abs()),
                qs,
            }
        })
        .collect()
}

/// Every quantized type, both families, batched and B = 1, at the real and ragged shapes.
pub fn matvec(gpu: &Gpu, rng: &mut Rng) -> R<Vec<CheckRow>> {
    let mut out = Vec::new();
    let geoms: [(usize, usize, &[usize]); 9] = [
        (576, 576, &[1, 3, 8, 64]),
        (1536, 576, &[1, 3, 8, 64]),
        (576, 1536, &[1, 3, 8, 64]),
        (49152, 576, &[1, 3, 8]),
        (4096, 4096, &[1, 3]),
        (11008, 4096, &[1, 3]),
        (4096, 11008, &[1, 3, 8]),
        (1003, 32 * 37, &[1, 3, 8, 64]),
        (5, 96, &[1, 3, 8, 64]),
    ];
    for (rows, cols, batches) in geoms {
        let nb = cols / QK;
        let bmax = *batches.last().expect("non-empty");
        let x = rng.vec(bmax * cols, 1.0);
        let xq = quantize_host(&x);
        let dxq = up(gpu, &xq)?;
        let singles: Vec<CudaSlice<BlockQ8_1>> = (0..bmax)
            .map(|b| up(gpu, &xq[b * nb..(b + 1) * nb]))
            .collect::<R<_>>()?;
        let q41 = q4_1_blocks(rng, rows * nb);
        let q40: Vec<BlockQ4_0> = q41.iter().map(|b| BlockQ4_0 { d: b.d, qs: b.qs }).collect();
        let q80: Vec<BlockQ8_0> = q41
            .iter()
            .map(|b| {
                let mut qs = [0i8; QK];
                qs.iter_mut().for_each(|q| *q = (rng.u32() % 255) as i8);
                BlockQ8_0 {
                    d: f16::from_f32(b.d.to_f32() * 0.1),
                    qs,
                }
            })
            .collect();
        let (d40, d41, d80) = (up(gpu, &q40)?, up(gpu, &q41)?, up(gpu, &q80)?);
        let kinds = [
            ("q4_0", WeightRows::Q4_0(&q40), DeviceWeights::Q4_0(&d40)),
            ("q4_1", WeightRows::Q4_1(&q41), DeviceWeights::Q4_1(&d41)),
            ("q8_0", WeightRows::Q8_0(&q80), DeviceWeights::Q8_0(&d80)),
        ];
        for (ty, hw, dw) in kinds {
            for fam in [MatvecFamily::Mmvq, MatvecFamily::Dp4a] {
                let kernel = format!("matvec_{}_{ty}", fam.name());
                let want = twin_batch(fam, hw, rows, cols, &xq, bmax);
                let mut last = Vec::new();
                for &b in batches {
                    let mut dy = zeros::<f32>(gpu, b * rows)?;
                    gpu.matvec(fam, dw, rows, cols, &dxq, b, &mut dy)?;
                    last = down(gpu, &dy)?;
                    out.push(compare_f32(
                        format!("kernel-check/{kernel}/{rows}x{cols}/B={b}"),
                        &want[..b * rows],
                        &last,
                        rows,
                        None,
                    ));
                }
                let mut single = Vec::with_capacity(bmax * rows);
                for xs in &singles {
                    let mut dy = zeros::<f32>(gpu, rows)?;
                    gpu.matvec(fam, dw, rows, cols, xs, 1, &mut dy)?;
                    single.extend(down(gpu, &dy)?);
                }
                out.push(compare_f32(
                    format!("kernel-check/{kernel}/{rows}x{cols}/batched-row==B1/B={bmax}"),
                    &single,
                    &last,
                    rows,
                    None,
                ));
            }
        }
    }
    Ok(out)
}

/// F32 / F16 / BF16 weights with f32 activations.
pub fn matvec_float(gpu: &Gpu, rng: &mut Rng) -> R<Vec<CheckRow>> {
    let mut out = Vec::new();
    for (rows, cols) in [(576usize, 576usize), (1003, 32 * 37 + 5), (49152, 576)] {
        let batch = 3;
        let wf = rng.vec(rows * cols, 0.05);
        let wh: Vec<f16> = wf.iter().map(|&v| f16::from_f32(v)).collect();
        let wb: Vec<bf16> = wf.iter().map(|&v| bf16::from_f32(v)).collect();
        let x = rng.vec(batch * cols, 1.0);
        let dx = up(gpu, &x)?;
        let hbits: Vec<u16> = wh.iter().map(|v| v.to_bits()).collect();
        let bbits: Vec<u16> = wb.iter().map(|v| v.to_bits()).collect();
        let (df, dh, db) = (up(gpu, &wf)?, up(gpu, &hbits)?, up(gpu, &bbits)?);
        let kinds = [
            ("f32", WeightRows::F32(&wf), DeviceWeights::F32(&df)),
            ("f16", WeightRows::F16(&wh), DeviceWeights::F16(&dh)),
            ("bf16", WeightRows::BF16(&wb), DeviceWeights::BF16(&db)),
        ];
        for (ty, hw, dw) in kinds {
            let mut want = vec![0.0f32; batch * rows];
            for b in 0..batch {
                twin::matvec_f32(
                    hw,
                    rows,
                    cols,
                    &x[b * cols..(b + 1) * cols],
                    &mut want[b * rows..(b + 1) * rows],
                )
                .expect("shapes fit");
            }
            let mut dy = zeros::<f32>(gpu, batch * rows)?;
            gpu.matvec_float(dw, rows, cols, &dx, batch, &mut dy)?;
            out.push(compare_f32(
                format!("kernel-check/matvec_float_{ty}/{rows}x{cols}/B={batch}"),
                &want,
                &down(gpu, &dy)?,
                rows,
                None,
            ));
        }
    }
    Ok(out)
}

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

/// Both attention families against their twins (tolerance: `expf` vs `f32::exp`).
pub fn attention(gpu: &Gpu, rng: &mut Rng) -> R<Vec<CheckRow>> {
    let mut out = Vec::new();
    let tol = 2e-5;
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
                Some(tol),
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
                Some(tol),
            ));
        }
    }
    Ok(out)
}

/// SwiGLU (tolerance: SiLU's exp), residual add, scale and KV store (bitwise).
pub fn elementwise(gpu: &Gpu, rng: &mut Rng) -> R<Vec<CheckRow>> {
    let mut out = Vec::new();
    let (rows, cols) = (3usize, 1536usize);
    let n = rows * cols;
    let g = rng.vec(n, 3.0);
    let u = rng.vec(n, 1.0);
    let scales = [0.5f32, 1.25, 3.0];
    let (dg, du, ds) = (up(gpu, &g)?, up(gpu, &u)?, up(gpu, &scales)?);
    for post in [false, true] {
        let mut want = vec![0.0; n];
        for (r, &sc) in scales.iter().enumerate().take(rows) {
            let span = r * cols..(r + 1) * cols;
            twin::swiglu(
                &g[span.clone()],
                &u[span.clone()],
                &mut want[span],
                post.then_some(sc),
            )
            .expect("lengths fit");
        }
        let mut dout = zeros::<f32>(gpu, n)?;
        gpu.swiglu(&dg, &du, &mut dout, post.then_some(&ds), n, cols)?;
        let tag = if post { "post-scale" } else { "plain" };
        out.push(compare_f32(
            format!("kernel-check/swiglu_f32/{rows}x{cols}/{tag}"),
            &want,
            &down(gpu, &dout)?,
            cols,
            Some(1e-6),
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
    Ok(out)
}

/// Argmax (ties, NaN), Philox (known answers and random counters) and sampling.
pub fn sampling(gpu: &Gpu, rng: &mut Rng) -> R<Vec<CheckRow>> {
    let mut out = Vec::new();
    let vocab = 49152;
    let batch = 4;
    let mut logits = rng.vec(batch * vocab, 3.0);
    // Row 1: a tie for the maximum; row 2: NaN at the front and a tie; row 3: constant row.
    logits[vocab + 100] = 50.0;
    logits[vocab + 40000] = 50.0;
    logits[2 * vocab] = f32::NAN;
    logits[2 * vocab + 7] = 60.0;
    logits[2 * vocab + 9] = 60.0;
    logits[3 * vocab..4 * vocab].fill(0.25);
    let dl = up(gpu, &logits)?;
    let mut dout = zeros::<u32>(gpu, batch)?;
    gpu.argmax(&dl, &mut dout, batch, vocab)?;
    let want: Vec<u32> = logits.chunks(vocab).map(twin::argmax).collect();
    out.push(compare_u32(
        format!("kernel-check/argmax_f32/{batch}x{vocab}"),
        &want,
        &down(gpu, &dout)?,
        batch,
    ));

    let kat: [([u32; 4], [u32; 2]); 3] = [
        ([0; 4], [0; 2]),
        ([u32::MAX; 4], [u32::MAX; 2]),
        (
            [0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344],
            [0xa4093822, 0x299f31d0],
        ),
    ];
    let mut want = Vec::new();
    let mut got = Vec::new();
    for (c, k) in kat {
        want.extend(twin::philox4x32_10(c, k));
        let dc = up(gpu, &c)?;
        let mut dr = zeros::<u32>(gpu, 4)?;
        gpu.philox(&dc, &mut dr, k, 1)?;
        got.extend(down(gpu, &dr)?);
    }
    out.push(compare_u32(
        "kernel-check/philox_u32/random123-kat".into(),
        &want,
        &got,
        4,
    ));
    let n = 4096;
    let ctr: Vec<u32> = (0..4 * n).map(|_| rng.u32()).collect();
    let key = [rng.u32(), rng.u32()];
    let want: Vec<u32> = ctr
        .chunks(4)
        .flat_map(|c| twin::philox4x32_10([c[0], c[1], c[2], c[3]], key))
        .collect();
    let dc = up(gpu, &ctr)?;
    let mut dr = zeros::<u32>(gpu, 4 * n)?;
    gpu.philox(&dc, &mut dr, key, n)?;
    out.push(compare_u32(
        format!("kernel-check/philox_u32/{n}-counters"),
        &want,
        &down(gpu, &dr)?,
        4,
    ));

    // The sampler's exp against its twin over the whole domain it sees (x <= 0 after the
    // max is subtracted) plus the edges: zero, the subnormal range, the cut-offs, NaN.
    let mut xs: Vec<f32> = (0..1 << 16).map(|i| -110.0 * i as f32 / 65535.0).collect();
    xs.extend(rng.vec(1 << 14, 20.0));
    xs.extend([
        0.0,
        -0.0,
        -87.3,
        -103.9,
        -103.99,
        88.7,
        88.8,
        f32::NEG_INFINITY,
        f32::NAN,
    ]);
    let want: Vec<u32> = xs
        .iter()
        .map(|&x| twin::exp_mirrored(x).to_bits())
        .collect();
    let dx = up(gpu, &xs)?;
    let mut de = zeros::<f32>(gpu, xs.len())?;
    gpu.exp_mirrored(&dx, &mut de, xs.len())?;
    let got: Vec<u32> = down(gpu, &de)?.iter().map(|v| v.to_bits()).collect();
    out.push(compare_u32(
        format!("kernel-check/exp_mirrored_f32/{}-values", xs.len()),
        &want,
        &got,
        1,
    ));

    let batch = 8;
    let logits = rng.vec(batch * vocab, 2.5);
    let dl = up(gpu, &logits)?;
    let mut p = zeros::<f32>(gpu, batch * vocab)?;
    let seqs: Vec<u32> = (0..batch as u32).collect();
    let dseq = up(gpu, &seqs)?;
    let seed = 0x5eed_0000_0000_002a_u64;
    for (temp, top_p) in [(0.0f32, 1.0f32), (0.7, 0.9), (1.0, 1.0), (1.0, 0.5)] {
        let mut want = Vec::new();
        let mut got = Vec::new();
        for step in 0..25u32 {
            let dstep = up(gpu, &vec![step; batch])?;
            let mut dtok = zeros::<u32>(gpu, batch)?;
            gpu.sample(
                &dl, &mut p, &mut dtok, batch, vocab, temp, top_p, seed, &dseq, &dstep,
            )?;
            got.extend(down(gpu, &dtok)?);
            for (b, row) in logits.chunks(vocab).enumerate() {
                want.push(twin::sample(row, temp, top_p, seed, b as u32, step));
            }
        }
        out.push(compare_u32(
            format!("kernel-check/sample_f32/{batch}x{vocab}/temp={temp}/top_p={top_p}/25-steps"),
            &want,
            &got,
            batch,
        ));
    }
    Ok(out)
}
