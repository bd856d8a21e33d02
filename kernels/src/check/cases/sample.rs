//! The sample family's cases: argmax, Philox4x32-10, the sampler's `exp_mirrored` and
//! sampled tokens.

use super::{R, Rng, down, up, zeros};
use crate::check::report::{CheckRow, compare_u32};
use crate::cuda::Gpu;
use crate::twin;

/// Argmax (ties, NaN), Philox (known answers and random counters) and sampling.
// Over 150 lines: a table of check cases (argmax ties and NaN, Philox known answers and
// counters, sampling), one block per case.
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
    for (temp, top_k, top_p) in [
        (0.0f32, 0u32, 1.0f32),
        (0.7, 0, 0.9),
        (1.0, 0, 1.0),
        (1.0, 0, 0.5),
        (0.7, 40, 1.0),
        (1.0, 8, 0.9),
        (1.3, 1, 1.0),
    ] {
        let mut want = Vec::new();
        let mut got = Vec::new();
        for step in 0..25u32 {
            let dstep = up(gpu, &vec![step; batch])?;
            let mut dtok = zeros::<u32>(gpu, batch)?;
            gpu.sample(
                &dl, &mut p, &mut dtok, batch, vocab, temp, top_k, top_p, seed, &dseq, &dstep,
            )?;
            got.extend(down(gpu, &dtok)?);
            for (b, row) in logits.chunks(vocab).enumerate() {
                want.push(twin::sample(row, temp, top_k, top_p, seed, b as u32, step));
            }
        }
        let k = if top_k > 0 {
            format!("/top_k={top_k}")
        } else {
            String::new()
        };
        out.push(compare_u32(
            format!(
                "kernel-check/sample_f32/{batch}x{vocab}/temp={temp}{k}/top_p={top_p}/25-steps"
            ),
            &want,
            &got,
            batch,
        ));
    }

    // Parameters per row: the rows are greedy or sampled under their own temperature, top-k,
    // top-p and seed, and each row must draw what the twin draws for it alone.
    let combos = [
        (0.0f32, 0u32, 1.0f32),
        (0.7, 0, 0.9),
        (1.0, 0, 1.0),
        (1.0, 0, 0.5),
        (0.7, 40, 1.0),
        (1.0, 8, 0.9),
        (1.3, 1, 1.0),
        (1.0, 3, 0.5),
    ];
    let temps: Vec<f32> = (0..batch).map(|b| combos[b % 8].0).collect();
    let top_ks: Vec<u32> = (0..batch).map(|b| combos[b % 8].1).collect();
    let top_ps: Vec<f32> = (0..batch).map(|b| combos[b % 8].2).collect();
    let seeds: Vec<u64> = (0..batch as u64).map(|b| seed ^ (b << 40) ^ b).collect();
    let (dtemp, dtopk, dtop, dseed) = (
        up(gpu, &temps)?,
        up(gpu, &top_ks)?,
        up(gpu, &top_ps)?,
        up(gpu, &seeds)?,
    );
    // The test-only defects (`MEMRA_GATE_DEFECT=top-p-cut`, `top-k-cut`, `top-k-ties`) as
    // well: the device's defect argument must drop (or keep) what the twin's
    // `Nucleus::OneEarly`, `Nucleus::KOneMore` and `Nucleus::KDropTies` do, so sampling-gate's
    // negative cells on the GPU fail for the defect they plant and nothing else. The same
    // rows rounded to a grid of 1/2 again: exact ties at every cut, where the contract keeps
    // every token tied with the k-th (and with the nucleus' last) and `KDropTies` differs.
    let tied: Vec<f32> = logits.iter().map(|&l| (l * 2.0).round() / 2.0).collect();
    let dtied = up(gpu, &tied)?;
    for (rows, dev, form) in [(&logits, &dl, ""), (&tied, &dtied, "/tied")] {
        for (nucleus, tag) in [
            (twin::Nucleus::Exact, ""),
            (twin::Nucleus::OneEarly, "/cut-early"),
            (twin::Nucleus::KOneMore, "/top-k-one-more"),
            (twin::Nucleus::KDropTies, "/top-k-drop-ties"),
        ] {
            let mut want = Vec::new();
            let mut got = Vec::new();
            for step in 0..25u32 {
                let dstep = up(gpu, &vec![step; batch])?;
                let mut dtok = zeros::<u32>(gpu, batch)?;
                gpu.sample_rows(
                    dev, &mut p, &mut dtok, batch, vocab, &dtemp, &dtopk, &dtop, &dseed, &dseq,
                    &dstep, nucleus,
                )?;
                got.extend(down(gpu, &dtok)?);
                for (b, row) in rows.chunks(vocab).enumerate() {
                    want.push(twin::sample_with(
                        row, temps[b], top_ks[b], top_ps[b], seeds[b], b as u32, step, nucleus,
                    ));
                }
            }
            out.push(compare_u32(
                format!(
                    "kernel-check/sample_rows_f32/{batch}x{vocab}/mixed-params{form}{tag}/25-steps"
                ),
                &want,
                &got,
                batch,
            ));
        }
    }
    Ok(out)
}
