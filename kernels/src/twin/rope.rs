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
