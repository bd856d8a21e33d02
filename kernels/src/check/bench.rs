//! `kernel-check bench`: device time per kernel call at the model geometries, as a table.
//! Each case is timed with CUDA events over repeated launches; quantized weights rotate over
//! enough copies that the bytes streamed per pass exceed the H200's ~60 MB L2 where memory
//! allows, so the large shapes measure DRAM bandwidth rather than the cache. Timings are
//! measured, never asserted.

use cudarc::driver::sys::CUevent_flags;

use super::cases::{MATVEC_FORMS, MatvecForm, Rng};
use crate::blocks::{BlockQ4_1, BlockQ8_0, BlockQ8_1, QK};
use crate::cuda::{DeviceWeights, Gpu};
use crate::error::KernelError;
use crate::twin::{AttnShape, SPLIT_K_CHUNK};

type R<T> = Result<T, KernelError>;

const ITERS: usize = 50;
/// Bytes of weights to rotate through per timing loop.
const ROTATE_BYTES: usize = 256 << 20;

/// Mean device microseconds of `f` over [`ITERS`] calls after 3 warm-up calls.
fn time_us(gpu: &Gpu, mut f: impl FnMut(usize) -> R<()>) -> R<f64> {
    for i in 0..3 {
        f(i)?;
    }
    let ev = |what| {
        move |e| KernelError::Driver {
            what: format!("recording the {what} event"),
            source: e,
        }
    };
    let start = gpu
        .stream()
        .record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
        .map_err(ev("start"))?;
    for i in 0..ITERS {
        f(i)?;
    }
    let end = gpu
        .stream()
        .record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
        .map_err(ev("end"))?;
    let ms = start
        .elapsed_ms(&end)
        .map_err(KernelError::driver("reading event times"))?;
    Ok(ms as f64 * 1000.0 / ITERS as f64)
}

fn zeros<T: cudarc::driver::DeviceRepr + cudarc::driver::ValidAsZeroBits>(
    gpu: &Gpu,
    n: usize,
) -> R<cudarc::driver::CudaSlice<T>> {
    gpu.stream()
        .alloc_zeros(n.max(1))
        .map_err(KernelError::driver("allocating device memory"))
}

/// The resources of the kernels the decode step spends its time in, at their launch shapes
/// on the llama-7B geometry: registers, spills and resident blocks per multiprocessor.
fn resources(gpu: &Gpu) -> R<()> {
    use crate::sources::{MATVEC_MMVQ, NORM};
    let row4096 = 128 * std::mem::size_of::<BlockQ8_1>();
    let row11008 = 344 * std::mem::size_of::<BlockQ8_1>();
    let kernels = [
        (&MATVEC_MMVQ, "matvec_mmvq_b1_q4_1", 256, row4096),
        (&MATVEC_MMVQ, "matvec_mmvq_b1_q4_1", 256, row11008),
        (&MATVEC_MMVQ, "matvec_mmvq_b1_q8_0", 256, row4096),
        (&MATVEC_MMVQ, "matvec_mmvq_q4_1", 256, 8 * row4096),
        (&MATVEC_MMVQ, "matvec_mmvq_mma_q4_1", 256, gpu.mma_smem(20)),
        (&MATVEC_MMVQ, "matvec_mmvq_mma_q8_0", 256, gpu.mma_smem(34)),
        (
            &MATVEC_MMVQ,
            "matvec_mmvq_mmar_q4_1",
            512,
            gpu.mmar_smem(20, 4096),
        ),
        (
            &MATVEC_MMVQ,
            "matvec_mmvq_mmar_q8_0",
            512,
            gpu.mmar_smem(34, 4096),
        ),
        (
            &MATVEC_MMVQ,
            "matvec_mmvq_b1_norm_q4_1",
            256,
            18 * std::mem::size_of::<BlockQ8_1>(),
        ),
        (&NORM, "add_rmsnorm_q8_1_f32", 256, 0),
        (&NORM, "add_rmsnorm_q8_1_wide_f32", 256, 0),
        (&NORM, "add_rmsnorm_q8_1_split_f32", 256, 0),
    ];
    println!(
        "| kernel | threads | dynamic smem | registers | local bytes | static smem | blocks/SM |"
    );
    println!("|---|---|---|---|---|---|---|");
    for (src, name, threads, smem) in kernels {
        let r = gpu.kernel_resources(src, name, threads, smem)?;
        println!(
            "| {name} | {threads} | {smem} | {} | {} | {} | {} |",
            r.registers, r.local_bytes, r.static_smem, r.blocks_per_sm
        );
    }
    println!();
    Ok(())
}

/// Runs the benchmark and prints its table.
// Over 150 lines: a table of benchmark rows, one block per kernel family and shape, printed as
// measured.
pub fn run(gpu: &Gpu) -> R<()> {
    resources(gpu)?;
    let mut rng = Rng::new(1);
    println!("| kernel | geometry | B | µs/call | weight GB/s | rotated MB |");
    println!("|---|---|---|---|---|---|");
    for (rows, cols) in [
        (576usize, 576usize),
        (1536, 576),
        (576, 1536),
        (49152, 576),
        (4096, 4096),
        (11008, 4096),
        (4096, 11008),
    ] {
        let nb = cols / QK;
        let x: Vec<BlockQ8_1> = (0..64 * nb)
            .map(|_| {
                let mut qs = [0i8; QK];
                qs.iter_mut().for_each(|q| *q = (rng.u32() % 255) as i8);
                BlockQ8_1 {
                    d: half::f16::from_f32(0.01),
                    s: half::f16::from_f32(0.1),
                    qs,
                }
            })
            .collect();
        let dx = gpu
            .stream()
            .clone_htod(&x)
            .map_err(KernelError::driver("copying activations"))?;
        for ty in ["q4_1", "q8_0"] {
            let block_bytes = if ty == "q4_1" { 20 } else { 34 };
            let bytes = rows * nb * block_bytes;
            let copies = (ROTATE_BYTES / bytes).clamp(1, 64);
            // Zeroed blocks are valid weights, and the kernels' time depends on the bytes
            // they stream, not on the values.
            let w41: Vec<_> = if ty == "q4_1" {
                (0..copies)
                    .map(|_| zeros::<BlockQ4_1>(gpu, rows * nb))
                    .collect::<R<_>>()?
            } else {
                Vec::new()
            };
            let w80: Vec<_> = if ty == "q8_0" {
                (0..copies)
                    .map(|_| zeros::<BlockQ8_0>(gpu, rows * nb))
                    .collect::<R<_>>()?
            } else {
                Vec::new()
            };
            let weights = |i: usize| match ty {
                "q4_1" => DeviceWeights::Q4_1(&w41[i % copies]),
                _ => DeviceWeights::Q8_0(&w80[i % copies]),
            };
            // The batched rows in every form the device has (MatvecForm).
            MatvecForm::restoring(gpu, || -> R<()> {
                for form in MATVEC_FORMS {
                    if !form.available(gpu, block_bytes, cols) {
                        continue;
                    }
                    for batch in form.batches(&[1, 8, 64], 64) {
                        if form.mma && batch == 1 {
                            continue;
                        }
                        form.select(gpu);
                        let mut y = zeros::<f32>(gpu, batch * rows)?;
                        let us = time_us(gpu, |i| {
                            gpu.matvec(form.fam, weights(i), rows, cols, &dx, batch, &mut y)
                        })?;
                        println!(
                            "| {} | {rows}x{cols} | {batch} | {us:.2} | {:.0} | {} |",
                            form.label(ty, batch),
                            bytes as f64 / us / 1e3,
                            (bytes * copies) >> 20
                        );
                    }
                }
                Ok(())
            })?;
        }
    }
    // The read ceiling for the matvecs above: the same bytes, read and nothing else, by a
    // grid of one block per 1024 words (every thread loads four, as a single-row matvec's
    // lanes do) and by a grid the device holds at once (8 blocks per multiprocessor).
    for mb in [10.5f64, 28.2, 56.4] {
        let bytes = ((mb * 1e6) as usize).next_multiple_of(4096);
        let copies = (ROTATE_BYTES / bytes).clamp(1, 64);
        let bufs: Vec<_> = (0..copies)
            .map(|_| zeros::<u8>(gpu, bytes))
            .collect::<R<_>>()?;
        let words = (bytes / 16) as u32;
        for (what, blocks) in [
            ("one-shot", words.div_ceil(1024)),
            ("resident", 8 * gpu.sm_count()),
        ] {
            let mut out = zeros::<u32>(gpu, blocks as usize)?;
            let us = time_us(gpu, |i| gpu.probe_read(&bufs[i % copies], blocks, &mut out))?;
            println!(
                "| probe_read_u4 ({what}) | {mb} MB | 1 | {us:.2} | {:.0} | {} |",
                bytes as f64 / us / 1e3,
                (bytes * copies) >> 20
            );
        }
    }
    for cols in [576usize, 4096] {
        let x = zeros::<f32>(gpu, cols)?;
        let g = zeros::<f32>(gpu, cols)?;
        let mut q = zeros::<BlockQ8_1>(gpu, cols / QK)?;
        let mut r = zeros::<f32>(gpu, 1)?;
        let us = time_us(gpu, |_| gpu.quantize_q8_1(&x, &mut q))?;
        println!("| quantize_q8_1_f32 | {cols} | 1 | {us:.2} | | |");
        let us = time_us(gpu, |_| {
            gpu.rmsnorm_quantize_fused(&x, &g, &mut q, &mut r, 1, cols, 1e-5)
        })?;
        println!("| rmsnorm_quantize_fused_f32 | {cols} | 1 | {us:.2} | | |");
    }
    for (nh, nkv, hd, n) in [(9usize, 3usize, 64usize, 2048usize), (32, 8, 128, 4096)] {
        let s = AttnShape {
            n_heads: nh,
            n_kv_heads: nkv,
            head_dim: hd,
            n_tokens: n,
        };
        let q = zeros::<f32>(gpu, nh * hd)?;
        let k = zeros::<f32>(gpu, n * nkv * hd)?;
        let v = zeros::<f32>(gpu, n * nkv * hd)?;
        let mut out = zeros::<f32>(gpu, nh * hd)?;
        let mut scratch = zeros::<f32>(gpu, nh * n)?;
        let chunks = n.div_ceil(SPLIT_K_CHUNK);
        let mut po = zeros::<f32>(gpu, nh * chunks * hd)?;
        let mut pml = zeros::<f32>(gpu, nh * chunks * 2)?;
        let us = time_us(gpu, |_| {
            gpu.attention_naive(&q, &k, &v, &mut out, &mut scratch, &s, 0.125)
        })?;
        println!("| attention_naive_f32 | {nh}/{nkv}x{hd} n={n} | 1 | {us:.2} | | |");
        let us = time_us(gpu, |_| {
            gpu.attention_split_k(&q, &k, &v, &mut out, &mut po, &mut pml, &s, 0.125)
        })?;
        println!("| attention_split_k_f32 (+combine) | {nh}/{nkv}x{hd} n={n} | 1 | {us:.2} | | |");
    }
    let vocab = 49152;
    let logits = gpu
        .stream()
        .clone_htod(&rng.vec(8 * vocab, 3.0))
        .map_err(KernelError::driver("copying logits"))?;
    let mut p = zeros::<f32>(gpu, 8 * vocab)?;
    let mut tok = zeros::<u32>(gpu, 8)?;
    let seq = gpu
        .stream()
        .clone_htod(&(0..8u32).collect::<Vec<_>>())
        .map_err(KernelError::driver("copying seqs"))?;
    let step = zeros::<u32>(gpu, 8)?;
    let mut scratch = zeros::<u32>(gpu, crate::cuda::argmax_scratch_len(1, vocab))?;
    let us = time_us(gpu, |_| {
        gpu.argmax(&logits, &mut tok, &mut scratch, 1, vocab)
    })?;
    println!("| argmax_f32 | {vocab} | 1 | {us:.2} | | |");
    for (temp, top_k, top_p) in [(0.7f32, 0u32, 1.0f32), (0.7, 0, 0.9), (0.7, 40, 0.9)] {
        let us = time_us(gpu, |_| {
            gpu.sample(
                &logits, &mut p, &mut tok, 8, vocab, temp, top_k, top_p, 7, &seq, &step,
            )
        })?;
        println!(
            "| sample_f32 temp={temp} top_k={top_k} top_p={top_p} | {vocab} | 8 | {us:.2} | | |"
        );
    }
    Ok(())
}
