//! The matvec family's cases: the quantized matvec in every form the device has (the
//! single-row, small-batch, warp and tensor-core forms, each at the model shapes and ragged
//! ones, batched and against its own B = 1 row), the float-weight matvec, the single-row
//! matvec with the norm step as its prologue, and the head's post-scale.

use std::ops::Range;

use cudarc::driver::CudaSlice;
use half::{bf16, f16};

use super::norm::twin_norm_step;
use super::{R, Rng, down, quantize_host, up, zeros};
use crate::blocks::{BlockQ4_0, BlockQ4_1, BlockQ8_0, BlockQ8_1, QK};
use crate::check::report::{CheckRow, compare_f32};
use crate::cuda::{DeviceWeights, Gpu, MmaResident, SmallBatch};
use crate::twin::{self, MatvecFamily, WeightRows};

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
pub(in crate::check) struct MatvecForm {
    pub fam: MatvecFamily,
    pub mma: bool,
    pub resident: bool,
    pub small: bool,
}

/// Every form, in the order the rows are printed.
pub(in crate::check) const MATVEC_FORMS: [MatvecForm; 5] = [
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
