//! Accuracy and speed of `exp_mirrored`, the `exp` both backends share: every f32 of its
//! domain (`-103.98 ≤ x ≤ 88.72`, where the result is neither 0 nor infinity by the range
//! checks) against the correctly rounded value (f64 `exp` rounded once to f32), counted by
//! ulp distance, then the cost per call against the host's `f32::exp`.
//!
//! `cargo bench -p memra-kernels --bench exp` prints the table; docs/numerics.md quotes it.

use std::hint::black_box;
use std::time::Instant;

use memra_kernels::twin::exp_mirrored;

fn main() {
    let lo = f32::from_bits(0xc2cf_f5c3);
    let hi = f32::from_bits(0x42b1_70a4);
    // Every non-negative float up to hi, then every negative one down to lo.
    let ranges = [(0u32, hi.to_bits()), (0x8000_0000u32, lo.to_bits())];
    let mut hist = [0u64; 4]; // 0, 1, 2, more ulp
    let (mut worst, mut worst_x) = (0u32, 0.0f32);
    let (mut sub_hist, mut total) = ([0u64; 4], 0u64);
    let start = Instant::now();
    for (a, b) in ranges {
        for bits in a..=b {
            let x = f32::from_bits(bits);
            let got = exp_mirrored(x);
            let want = (x as f64).exp() as f32;
            let d = got.to_bits().abs_diff(want.to_bits());
            let slot = (d as usize).min(3);
            if want.is_normal() {
                hist[slot] += 1;
                if d > worst {
                    (worst, worst_x) = (d, x);
                }
            } else {
                sub_hist[slot] += 1;
            }
            total += 1;
        }
    }
    let secs = start.elapsed().as_secs_f64();
    println!("exp_mirrored against the correctly rounded exp, every f32 in [{lo}, {hi}]");
    println!("| results | 0 ulp | 1 ulp | 2 ulp | > 2 ulp | worst |");
    println!("|---|---|---|---|---|---|");
    println!(
        "| normal ({}) | {} | {} | {} | {} | {worst} ulp at x = {worst_x:e} |",
        hist.iter().sum::<u64>(),
        hist[0],
        hist[1],
        hist[2],
        hist[3]
    );
    println!(
        "| subnormal ({}) | {} | {} | {} | {} | |",
        sub_hist.iter().sum::<u64>(),
        sub_hist[0],
        sub_hist[1],
        sub_hist[2],
        sub_hist[3]
    );
    println!("({total} inputs in {secs:.1} s)");

    // Cost per call over softmax-like inputs (x ≤ 0).
    let xs: Vec<f32> = (0..1 << 20).map(|i| -(i as f32) * 1e-5).collect();
    let time = |f: &dyn Fn(f32) -> f32| {
        let start = Instant::now();
        let mut acc = 0.0f32;
        for _ in 0..20 {
            for &x in &xs {
                acc += f(black_box(x));
            }
        }
        black_box(acc);
        start.elapsed().as_secs_f64() * 1e9 / (20.0 * xs.len() as f64)
    };
    let mirrored = time(&exp_mirrored);
    let host = time(&f32::exp);
    println!("| per call | exp_mirrored | f32::exp |");
    println!("|---|---|---|");
    println!("| ns | {mirrored:.2} | {host:.2} |");
}
