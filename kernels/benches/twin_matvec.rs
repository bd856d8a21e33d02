//! Throughput of the host matvec twins at the SmolLM2-135M shapes (single rows and batches of
//! 8, as prefill runs them), one thread, as a table,
//! and the time of one host sampling draw over the 49152-token vocabulary. The CPU backend
//! runs the model through these functions, so this is its decode ceiling.

use std::time::Instant;

use half::f16;
use memra_kernels::blocks::{BlockQ4_0, BlockQ4_1, BlockQ8_0, BlockQ8_1};
use memra_kernels::twin::{MatvecFamily, WeightRows, matvec_batch, quantize_q8_1, sample};

fn main() {
    let mut state = 1u32;
    let mut next = move || {
        state = state.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
        state
    };
    let filter = std::env::args().skip(1).find(|a| !a.starts_with('-'));
    println!(
        "| weights | rows x cols | batch | family | µs/call (best of 15) | ns/block-row | GMAC/s |"
    );
    println!("|---|---|---|---|---|---|---|");
    for (ty, rows, cols, batch) in [
        ("Q4_1", 576, 576, 1),
        ("Q4_1", 1536, 576, 1),
        ("Q4_1", 576, 1536, 1),
        ("Q4_0", 1536, 576, 1),
        ("Q8_0", 1536, 576, 1),
        ("Q8_0", 49152, 576, 1),
        ("Q4_1", 1536, 576, 8),
        ("Q4_1", 576, 1536, 8),
    ] {
        // `cargo bench --bench twin_matvec -- Q8_0` runs only the cases of that weight type.
        if filter.as_deref().is_some_and(|f| f != ty) {
            continue;
        }
        let nb = cols / 32;
        let x: Vec<f32> = (0..batch * cols)
            .map(|_| (next() >> 8) as f32 / 16_777_216.0 - 0.5)
            .collect();
        let mut xq = vec![
            BlockQ8_1 {
                d: f16::ZERO,
                s: f16::ZERO,
                qs: [0; 32]
            };
            batch * nb
        ];
        quantize_q8_1(&x, &mut xq).expect("x is whole blocks");
        let q41: Vec<BlockQ4_1> = (0..rows * nb)
            .map(|_| BlockQ4_1 {
                d: f16::from_f32(0.01),
                m: f16::from_f32(-0.05),
                qs: [next() as u8; 16],
            })
            .collect();
        let q40: Vec<BlockQ4_0> = q41.iter().map(|b| BlockQ4_0 { d: b.d, qs: b.qs }).collect();
        let q80: Vec<BlockQ8_0> = (0..rows * nb)
            .map(|_| BlockQ8_0 {
                d: f16::from_f32(0.01),
                qs: [next() as i8; 32],
            })
            .collect();
        let w = match ty {
            "Q4_1" => WeightRows::Q4_1(&q41),
            "Q4_0" => WeightRows::Q4_0(&q40),
            _ => WeightRows::Q8_0(&q80),
        };
        let mut y = vec![0.0f32; batch * rows];
        for fam in [MatvecFamily::Mmvq, MatvecFamily::Dp4a] {
            // The machine may be shared, so the best of several timed runs is reported: it is
            // the run least disturbed by other work.
            let reps = (20_000_000 / (batch * rows * cols)).max(2);
            matvec_batch(fam, w, rows, cols, &xq, batch, &mut y).expect("shapes fit");
            let mut best = f64::INFINITY;
            for _ in 0..15 {
                let t = Instant::now();
                for _ in 0..reps {
                    matvec_batch(fam, w, rows, cols, &xq, batch, &mut y).expect("shapes fit");
                }
                best = best.min(t.elapsed().as_secs_f64() / reps as f64);
            }
            println!(
                "| {ty} | {rows} x {cols} | {batch} | {} | {:.1} | {:.2} | {:.2} |",
                fam.name(),
                best * 1e6,
                best * 1e9 / (batch * rows * nb) as f64,
                (batch * rows * cols) as f64 / best / 1e9
            );
        }
    }
    let logits: Vec<f32> = (0..49152)
        .map(|_| ((next() >> 8) as f32 / 16_777_216.0 - 0.5) * 12.0)
        .collect();
    println!();
    println!("| sampling (49152 logits) | µs/draw |");
    println!("|---|---|");
    for (temp, top_k, top_p) in [
        (0.0f32, 0u32, 1.0f32),
        (0.7, 0, 1.0),
        (0.7, 0, 0.9),
        (0.7, 40, 1.0),
        (0.7, 40, 0.9),
    ] {
        let reps = 200;
        let t = Instant::now();
        let mut acc = 0u32;
        for step in 0..reps {
            acc = acc.wrapping_add(sample(&logits, temp, top_k, top_p, 7, 0, step));
        }
        let us = t.elapsed().as_secs_f64() / reps as f64 * 1e6;
        println!("| temp {temp} top_k {top_k} top_p {top_p} | {us:.0} |");
        std::hint::black_box(acc);
    }
}
