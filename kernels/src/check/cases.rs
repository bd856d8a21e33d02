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
use crate::cuda::{AttnRows, DeviceWeights, Gpu, MmaResident, RopeStoreArgs, SmallBatch};
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

/// A form of the quantized matvec that kernel-check and its bench run: the family and, for
/// the mmvq family's batched rows, the tensor-core form (`mma`), with the activations
/// resident in shared memory (`resident`, "mmar") or streamed ("mma"), the warp form (the
/// fallback of older devices and of MEMRA_MMA=0), or the small-batch warp forms (`small`:
/// batches of 2 to 4 rows only).
#[derive(Debug, Clone, Copy)]
pub(super) struct MatvecForm {
    pub fam: MatvecFamily,
    pub mma: bool,
    pub resident: bool,
    pub small: bool,
}

/// Every form, in the order the rows are printed.
pub(super) const MATVEC_FORMS: [MatvecForm; 5] = [
    MatvecForm {
        fam: MatvecFamily::Mmvq,
        mma: true,
        resident: true,
        small: false,
    },
    MatvecForm {
        fam: MatvecFamily::Mmvq,
        mma: true,
        resident: false,
        small: false,
    },
    MatvecForm {
        fam: MatvecFamily::Mmvq,
        mma: false,
        resident: false,
        small: false,
    },
    MatvecForm {
        fam: MatvecFamily::Mmvq,
        mma: false,
        resident: false,
        small: true,
    },
    MatvecForm {
        fam: MatvecFamily::Dp4a,
        mma: false,
        resident: false,
        small: false,
    },
];

impl MatvecForm {
    /// Whether the device has this form for rows of `cols` columns of weight blocks of
    /// `block_bytes` bytes: the int8 MMA for the tensor-core ones, and room in shared memory
    /// for the resident one.
    pub fn available(self, gpu: &Gpu, block_bytes: usize, cols: usize) -> bool {
        (!self.mma || gpu.set_int8_mma(true))
            && (!self.resident || gpu.mma_resident_fits(block_bytes, cols))
    }

    /// Switches `gpu`'s batched matvecs to this form.
    pub fn select(self, gpu: &Gpu) {
        gpu.set_int8_mma(self.mma);
        gpu.set_mma_resident(if self.resident {
            MmaResident::Always
        } else {
            MmaResident::Never
        });
        gpu.set_small_batch(if self.small {
            SmallBatch::Always
        } else {
            SmallBatch::Never
        });
    }

    /// The batch sizes of `batches` (the geometry's, up to `bmax`) this form runs: the
    /// small-batch forms take 2 to 4 rows whatever the geometry lists.
    pub fn batches(self, batches: &[usize], bmax: usize) -> Vec<usize> {
        if self.small {
            (2..=4).filter(|&b| b <= bmax).collect()
        } else {
            batches.to_vec()
        }
    }

    /// The kernel name its rows carry at batch `b`, e.g. `matvec_mmvq_mmar_q4_1` (the
    /// small-batch forms run under `SmallBatch::Always`: two rows take `b2`, more `b4`).
    pub fn label(self, ty: &str, b: usize) -> String {
        if self.small {
            let width = if b <= 2 { 2 } else { 4 };
            return format!("matvec_{}_b{width}_{ty}", self.fam.name());
        }
        let form = match (self.mma, self.resident) {
            // Batches of at most 8 rows take the resident form's two-step ring.
            (true, true) if b <= 8 => "_mmar2",
            (true, true) => "_mmar",
            (true, false) => "_mma",
            _ => "",
        };
        format!("matvec_{}{form}_{ty}", self.fam.name())
    }

    /// Runs `f` with the switches of `gpu` the forms change, and restores them after.
    pub fn restoring<T>(gpu: &Gpu, f: impl FnOnce() -> T) -> T {
        let initial = (gpu.int8_mma(), gpu.mma_resident(), gpu.small_batch());
        let out = f();
        gpu.set_int8_mma(initial.0);
        gpu.set_mma_resident(initial.1);
        gpu.set_small_batch(initial.2);
        out
    }
}

/// Every quantized type, both families, batched and B = 1, at the real and ragged shapes.
pub fn matvec(gpu: &Gpu, rng: &mut Rng) -> R<Vec<CheckRow>> {
    MatvecForm::restoring(gpu, || matvec_forms(gpu, rng))
}

fn matvec_forms(gpu: &Gpu, rng: &mut Rng) -> R<Vec<CheckRow>> {
    let mut out = Vec::new();
    let geoms: [(usize, usize, &[usize]); 10] = [
        (576, 576, &[1, 3, 8, 64]),
        (20011, 32 * 18, &[1, 3]),
        (1536, 576, &[1, 3, 8, 64]),
        (576, 1536, &[1, 3, 8, 64]),
        (49152, 576, &[1, 3, 8]),
        (4096, 4096, &[1, 3, 16]),
        (11008, 4096, &[1, 3, 64]),
        (4096, 11008, &[1, 3, 8, 17]),
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
        let (q40, q41, q80) = weights3(rng, rows * nb);
        let (d40, d41, d80) = (up(gpu, &q40)?, up(gpu, &q41)?, up(gpu, &q80)?);
        let kinds = [
            ("q4_0", WeightRows::Q4_0(&q40), DeviceWeights::Q4_0(&d40)),
            ("q4_1", WeightRows::Q4_1(&q41), DeviceWeights::Q4_1(&d41)),
            ("q8_0", WeightRows::Q8_0(&q80), DeviceWeights::Q8_0(&d80)),
        ];
        for (ty, hw, dw) in kinds {
            // The batched rows run in every form the device has (MatvecForm).
            let block_bytes = match dw {
                DeviceWeights::Q4_0(_) => 18,
                DeviceWeights::Q4_1(_) => 20,
                _ => 34,
            };
            for form in MATVEC_FORMS {
                if !form.available(gpu, block_bytes, cols) {
                    continue;
                }
                form.select(gpu);
                let fam = form.fam;
                let want = twin_batch(fam, hw, rows, cols, &xq, bmax);
                let runs = form.batches(batches, bmax);
                let mut last = (0, String::new(), Vec::new());
                for &b in &runs {
                    let kernel = form.label(ty, b);
                    let mut dy = zeros::<f32>(gpu, b * rows)?;
                    gpu.matvec(fam, dw, rows, cols, &dxq, b, &mut dy)?;
                    let got = down(gpu, &dy)?;
                    out.push(compare_f32(
                        format!("kernel-check/{kernel}/{rows}x{cols}/B={b}"),
                        &want[..b * rows],
                        &got,
                        rows,
                        None,
                    ));
                    last = (b, kernel, got);
                }
                let (blast, kernel, last) = last;
                let mut single = Vec::with_capacity(blast * rows);
                for xs in &singles[..blast] {
                    let mut dy = zeros::<f32>(gpu, rows)?;
                    gpu.matvec(fam, dw, rows, cols, xs, 1, &mut dy)?;
                    single.extend(down(gpu, &dy)?);
                }
                out.push(compare_f32(
                    format!("kernel-check/{kernel}/{rows}x{cols}/batched-row==B1/B={blast}"),
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
/// composition (`twin::rope`, `twin::kv_store`, then the attention twin; tolerance as the
/// attention checks, caches bitwise), and bit for bit against `rope_store_rows_f32`
/// followed by the unfused rows kernel on the device (output, its q8_1 blocks, caches). Rows
/// of one launch sit at different positions, up to several split-K chunks and past the
/// naive kernel's shared score buffer (1024 tokens), and on both sides of the last position
/// whose whole context the naive kernel reads from its prefetch buffers alone (63, for heads
/// up to 64 wide; 31 would be for 128-wide heads, which keep the general path).
pub fn attention_rope_rows(gpu: &Gpu, rng: &mut Rng) -> R<Vec<CheckRow>> {
    let mut out = Vec::new();
    let tol = 2e-5;
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
                    Some(tol),
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
    let mut scratch = zeros::<u32>(gpu, crate::cuda::argmax_scratch_len(batch, vocab))?;
    let want: Vec<u32> = logits.chunks(vocab).map(twin::argmax).collect();
    // Twice over the same scratch: the second launch relies on the first leaving its
    // counters at zero.
    for pass in 1..=2 {
        gpu.argmax(&dl, &mut dout, &mut scratch, batch, vocab)?;
        out.push(compare_u32(
            format!("kernel-check/argmax_f32/{batch}x{vocab}/launch-{pass}"),
            &want,
            &down(gpu, &dout)?,
            batch,
        ));
    }
    // Rows shorter than one chunk and ragged at the end, and the winner in the last chunk.
    for n in [5usize, 2048 * 3 + 17] {
        let mut l = rng.vec(batch * n, 3.0);
        l[n - 1] = 90.0;
        let dl = up(gpu, &l)?;
        let mut scratch = zeros::<u32>(gpu, crate::cuda::argmax_scratch_len(batch, n))?;
        gpu.argmax(&dl, &mut dout, &mut scratch, batch, n)?;
        let want: Vec<u32> = l.chunks(n).map(twin::argmax).collect();
        out.push(compare_u32(
            format!("kernel-check/argmax_f32/{batch}x{n}"),
            &want,
            &down(gpu, &dout)?,
            batch,
        ));
    }

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

/// Weights of every quantized type for `rows × nb` blocks (the shapes of [`matvec_forms`]).
fn weights3(rng: &mut Rng, n: usize) -> (Vec<BlockQ4_0>, Vec<BlockQ4_1>, Vec<BlockQ8_0>) {
    let q41 = q4_1_blocks(rng, n);
    let q40 = q41.iter().map(|b| BlockQ4_0 { d: b.d, qs: b.qs }).collect();
    let q80 = q41
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
    (q40, q41, q80)
}

/// The twins' norm step of one row: `v = x + delta` (when given), then q8_1 of
/// `rmsnorm(v)` (separate tier, `r` None) or `rmsnorm_quantize_fused(v)` and its `r`.
fn twin_norm_step(
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

/// The single-row matvecs with a norm prologue, bit for bit against the launches they
/// replace (the standalone norm step, then the single-row matvec) and against the twins'
/// composition: at the SmolLM2 shapes (576 → 960 qkv, 3072 gate/up, 49152 head) and a ragged
/// one, both tiers, with and without a pending residual update.
pub fn row_prologues(gpu: &Gpu, rng: &mut Rng) -> R<Vec<CheckRow>> {
    let mut out = Vec::new();
    for (rows, cols) in [
        (960usize, 576usize),
        (3072, 576),
        (49152, 576),
        (1003, 32 * 23),
    ] {
        let nb = cols / QK;
        let (q40, q41, q80) = weights3(rng, rows * nb);
        let (d40, d41, d80) = (up(gpu, &q40)?, up(gpu, &q41)?, up(gpu, &q80)?);
        let x = rng.vec(cols, 2.0);
        let delta = rng.vec(cols, 0.5);
        let g: Vec<f32> = (0..cols).map(|_| 1.0 + 0.3 * rng.f()).collect();
        let (dd, dg) = (up(gpu, &delta)?, up(gpu, &g)?);
        let kinds = [
            ("q4_0", WeightRows::Q4_0(&q40), DeviceWeights::Q4_0(&d40)),
            ("q4_1", WeightRows::Q4_1(&q41), DeviceWeights::Q4_1(&d41)),
            ("q8_0", WeightRows::Q8_0(&q80), DeviceWeights::Q8_0(&d80)),
        ];
        for (ty, hw, dw) in kinds {
            for fused in [false, true] {
                for with_delta in [false, true] {
                    let geo = format!(
                        "{rows}x{cols}/{}/delta={}",
                        if fused { "fused" } else { "separate" },
                        if with_delta { "set" } else { "null" }
                    );
                    let name = format!("kernel-check/matvec_mmvq_b1_norm_{ty}/{geo}");
                    let dl = with_delta.then_some(&dd);
                    // The launches the prologue replaces.
                    let mut sx = up(gpu, &x)?;
                    let mut sq = zeros::<BlockQ8_1>(gpu, nb)?;
                    let mut sr = zeros::<f32>(gpu, 1)?;
                    gpu.add_rmsnorm_q8_1(
                        &mut sx,
                        dl,
                        &dg,
                        None,
                        &mut sq,
                        fused.then_some(&mut sr),
                        1,
                        cols,
                        1e-5,
                    )?;
                    let mut sy = zeros::<f32>(gpu, rows)?;
                    gpu.matvec(MatvecFamily::Mmvq, dw, rows, cols, &sq, 1, &mut sy)?;
                    // The prologue.
                    let dx = up(gpu, &x)?;
                    let mut px = zeros::<f32>(gpu, cols)?;
                    let mut pr = zeros::<f32>(gpu, 1)?;
                    let mut py = zeros::<f32>(gpu, rows)?;
                    gpu.matvec_norm_b1(
                        dw,
                        rows,
                        cols,
                        &dx,
                        dl,
                        &dg,
                        1e-5,
                        &mut px,
                        fused.then_some(&mut pr),
                        &mut py,
                    )?;
                    let got = down(gpu, &py)?;
                    out.push(compare_f32(
                        format!("{name}/y==separate-launches"),
                        &down(gpu, &sy)?,
                        &got,
                        rows,
                        None,
                    ));
                    let (v, q, r) = twin_norm_step(&x, with_delta.then_some(&delta[..]), &g, fused);
                    let want = twin_batch(MatvecFamily::Mmvq, hw, rows, cols, &q, 1);
                    out.push(compare_f32(
                        format!("{name}/y==twins"),
                        &want,
                        &got,
                        rows,
                        None,
                    ));
                    out.push(compare_f32(
                        format!("{name}/x_out==twin-add"),
                        &v,
                        &down(gpu, &px)?,
                        cols,
                        None,
                    ));
                    if let Some(r) = r {
                        out.push(compare_f32(
                            format!("{name}/r==twin"),
                            &[r],
                            &down(gpu, &pr)?,
                            1,
                            None,
                        ));
                    }
                }
            }
        }
    }
    Ok(out)
}

/// The single-row matvec with the fused tier's head post-scale (`matvec_scaled_b1`) bit for
/// bit against the two launches it replaces (the matvec, then `scale_f32`), at the SmolLM2
/// head and a ragged shape.
pub fn head_post_scale(gpu: &Gpu, rng: &mut Rng) -> R<Vec<CheckRow>> {
    let mut out = Vec::new();
    for (rows, cols) in [(49152usize, 576usize), (1003, 32 * 37)] {
        let nb = cols / QK;
        let (q40, q41, q80) = weights3(rng, rows * nb);
        let (d40, d41, d80) = (up(gpu, &q40)?, up(gpu, &q41)?, up(gpu, &q80)?);
        let xq = up(gpu, &quantize_host(&rng.vec(cols, 1.0)))?;
        let post = up(gpu, &[0.5f32 + rng.f().abs()])?;
        let kinds = [
            ("q4_0", DeviceWeights::Q4_0(&d40)),
            ("q4_1", DeviceWeights::Q4_1(&d41)),
            ("q8_0", DeviceWeights::Q8_0(&d80)),
        ];
        for (ty, dw) in kinds {
            let mut want = zeros::<f32>(gpu, rows)?;
            gpu.matvec(MatvecFamily::Mmvq, dw, rows, cols, &xq, 1, &mut want)?;
            gpu.scale(&mut want, &post, rows, rows)?;
            let mut got = zeros::<f32>(gpu, rows)?;
            gpu.matvec_scaled_b1(dw, rows, cols, &xq, &post, &mut got)?;
            out.push(compare_f32(
                format!("kernel-check/matvec_mmvq_b1_{ty}/{rows}x{cols}/post==matvec+scale"),
                &down(gpu, &want)?,
                &down(gpu, &got)?,
                rows,
                None,
            ));
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The rows keep their kernel names: one per form, in the printed order.
    #[test]
    fn matvec_forms_name_their_kernels() {
        let labels: Vec<String> = MATVEC_FORMS.iter().map(|f| f.label("q4_1", 3)).collect();
        assert_eq!(
            labels,
            [
                "matvec_mmvq_mmar2_q4_1",
                "matvec_mmvq_mma_q4_1",
                "matvec_mmvq_q4_1",
                "matvec_mmvq_b4_q4_1",
                "matvec_dp4a_q4_1"
            ]
        );
        assert_eq!(MATVEC_FORMS[3].label("q8_0", 2), "matvec_mmvq_b2_q8_0");
        assert_eq!(MATVEC_FORMS[0].label("q8_0", 8), "matvec_mmvq_mmar2_q8_0");
        assert_eq!(MATVEC_FORMS[0].label("q8_0", 9), "matvec_mmvq_mmar_q8_0");
        assert_eq!(MATVEC_FORMS[3].batches(&[1, 3, 8], 8), [2, 3, 4]);
        assert_eq!(MATVEC_FORMS[3].batches(&[1, 3], 3), [2, 3]);
        assert_eq!(MATVEC_FORMS[2].batches(&[1, 3], 3), [1, 3]);
    }
}
