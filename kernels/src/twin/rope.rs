//! Twin of `rope.cu`: rotary position embedding in ggml's "normal" mode (adjacent pairs
//! `(x[2i], x[2i+1])` of each head rotate by angle `pos * base^(-2i/head_dim)`), with the
//! sin/cos taken from a host-computed table so GPU and twin rotate by identical numbers.

use super::{ShapeError, check_len};

/// The table for positions `0..n_pos`: `[pos][i][cos, sin]` for pair `i < head_dim / 2`, so
/// `head_dim` floats per position. Angles and their sine/cosine are computed in f64 and
/// rounded once to f32, independent of any libm's f32 accuracy.
pub fn rope_table(head_dim: usize, base: f32, n_pos: usize) -> Vec<f32> {
    let half = head_dim / 2;
    let mut t = Vec::with_capacity(n_pos * half * 2);
    for pos in 0..n_pos {
        for i in 0..half {
            let theta = (base as f64).powf(-2.0 * i as f64 / head_dim as f64);
            let angle = pos as f64 * theta;
            t.push(angle.cos() as f32);
            t.push(angle.sin() as f32);
        }
    }
    t
}

/// Rotates `x` (`n_heads * head_dim` values, head after head) in place for position `pos`.
///
/// Composition per pair: `a = x[2i]`, `b = x[2i+1]`; with a post-scale `s` (the fused tier's
/// RMS factor), `a = a*s`, `b = b*s` first; then `x[2i] = a*c - b*sn`, `x[2i+1] = a*sn + b*c`,
/// each product rounded separately (no FMA).
pub fn rope(
    x: &mut [f32],
    pos: usize,
    table: &[f32],
    n_heads: usize,
    head_dim: usize,
    post_scale: Option<f32>,
) -> Result<(), ShapeError> {
    check_len(
        "rope",
        "x",
        x.len(),
        n_heads * head_dim,
        "x holds n_heads * head_dim values",
    )?;
    if !head_dim.is_multiple_of(2) || (pos + 1) * head_dim > table.len() {
        return Err(ShapeError {
            op: "rope",
            arg: "table",
            got: table.len(),
            expected: (pos + 1) * (head_dim + head_dim % 2),
            expected_why: "the table needs head_dim floats per position up to pos (even head_dim)",
        });
    }
    let row = &table[pos * head_dim..(pos + 1) * head_dim];
    for head in x.chunks_exact_mut(head_dim) {
        for (pair, cs) in head.chunks_exact_mut(2).zip(row.chunks_exact(2)) {
            let (mut a, mut b) = (pair[0], pair[1]);
            if let Some(s) = post_scale {
                a *= s;
                b *= s;
            }
            let (c, sn) = (cs[0], cs[1]);
            pair[0] = a * c - b * sn;
            pair[1] = a * sn + b * c;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rotation_preserves_norm_and_matches_f64() {
        let (hd, heads, pos) = (64, 3, 17);
        let t = rope_table(hd, 10000.0, 32);
        let x0: Vec<f32> = (0..hd * heads).map(|i| (i as f32 * 0.37).sin()).collect();
        let mut x = x0.clone();
        rope(&mut x, pos, &t, heads, hd, None).unwrap();
        for h in 0..heads {
            for i in 0..hd / 2 {
                let ang = pos as f64 * 10000f64.powf(-2.0 * i as f64 / hd as f64);
                let (a, b) = (x0[h * hd + 2 * i] as f64, x0[h * hd + 2 * i + 1] as f64);
                let want0 = a * ang.cos() - b * ang.sin();
                let want1 = a * ang.sin() + b * ang.cos();
                assert!((x[h * hd + 2 * i] as f64 - want0).abs() < 1e-6);
                assert!((x[h * hd + 2 * i + 1] as f64 - want1).abs() < 1e-6);
            }
        }
        // Position 0 is the identity.
        let mut y = x0.clone();
        rope(&mut y, 0, &t, heads, hd, None).unwrap();
        assert_eq!(y, x0);
    }

    #[test]
    fn post_scale_is_applied_before_rotation() {
        let t = rope_table(4, 10000.0, 4);
        let mut a = vec![1.0, 2.0, 3.0, 4.0];
        let mut b: Vec<f32> = a.iter().map(|v| v * 0.5).collect();
        rope(&mut a, 3, &t, 1, 4, Some(0.5)).unwrap();
        rope(&mut b, 3, &t, 1, 4, None).unwrap();
        assert_eq!(a, b);
    }

    #[test]
    fn position_past_table_is_an_error() {
        let t = rope_table(4, 10000.0, 2);
        let err = rope(&mut [0.0; 4], 2, &t, 1, 4, None).unwrap_err();
        assert_eq!(err.arg, "table");
    }
}

/// Rounds one cached K or V row (`kv_dim` values, a multiple of 32) in place to what a q8_0
/// block holds, block by block of 32 values (the q8_0 KV cache, `MEMRA_KV_Q8=1`):
/// `d = amax / 127`, `q = round(x * (1 / d))` (half away from zero; 0 for an all-zero
/// block), the stored value `f16(d) * q`. Every product is rounded once, so the value is
/// exactly the dequantized q8_0 one. Twin of `kv_round_q8_0_rows_f32` in `rope.cu`.
pub fn kv_round_q8_0(row: &mut [f32]) -> Result<(), ShapeError> {
    kv_round_blocks(row, 127)
}

/// [`kv_round_q8_0`] with `qmax` levels each side of zero instead of 127 (`d = amax / qmax`):
/// the engine's test-only `kv-q8-coarse` defect rounds with 15, a 5-bit cache.
pub fn kv_round_blocks(row: &mut [f32], qmax: i32) -> Result<(), ShapeError> {
    if !row.len().is_multiple_of(32) {
        return Err(ShapeError {
            op: "kv_round_q8_0",
            arg: "row",
            got: row.len(),
            expected: row.len().next_multiple_of(32),
            expected_why: "a cached row is whole q8_0 blocks of 32 values",
        });
    }
    for block in row.chunks_exact_mut(32) {
        let amax = block.iter().fold(0.0f32, |m, &x| m.max(x.abs()));
        let d = amax / qmax as f32;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        let dh = half::f16::from_f32(d).to_f32();
        for x in block.iter_mut() {
            *x = dh * (*x * id).round();
        }
    }
    Ok(())
}

#[cfg(test)]
mod kv_q8_tests {
    use super::*;

    #[test]
    fn a_rounded_row_is_its_q8_0_blocks_dequantized() {
        let mut row: Vec<f32> = (0..64)
            .map(|i| ((i * 37 % 23) as f32 - 11.0) * 0.173)
            .collect();
        row[40..].iter_mut().for_each(|x| *x = 0.0);
        let before = row.clone();
        kv_round_q8_0(&mut row).unwrap();
        for (b, (blk, orig)) in row.chunks(32).zip(before.chunks(32)).enumerate() {
            let amax = orig.iter().fold(0.0f32, |m, &x| m.max(x.abs()));
            let d = half::f16::from_f32(amax / 127.0).to_f32();
            for (&x, &o) in blk.iter().zip(orig) {
                let q = x / d;
                assert!(
                    d == 0.0 || (q.round() == q && q.abs() <= 127.0),
                    "block {b}: {x} {q}"
                );
                assert!(
                    (x - o).abs() <= 0.5 * d * 1.01 + amax * 1e-3,
                    "block {b}: {o} -> {x}"
                );
            }
        }
        assert!(row[40..].iter().all(|&x| x == 0.0));
        assert!(kv_round_q8_0(&mut [0.0; 33]).is_err());
    }
}
