//! Twins of `elementwise.cu`: SwiGLU, residual add, scale and the KV-cache store. Each
//! element is independent, so the composition is the per-element formula alone.

use super::{ShapeError, check_len, exp_mirrored};

/// `silu(g) = g / (1 + exp(-g))`, with the device's `exp` ([`exp_mirrored`]).
#[inline(always)]
pub fn silu(g: f32) -> f32 {
    g / (1.0 + exp_mirrored(-g))
}

/// `out[i] = silu(g) * u` with `g = gate[i]`, `u = up[i]`, both first multiplied by the
/// post-scale when there is one (the fused tier's RMS factor).
pub fn swiglu(
    gate: &[f32],
    up: &[f32],
    out: &mut [f32],
    post_scale: Option<f32>,
) -> Result<(), ShapeError> {
    check_len(
        "swiglu",
        "up",
        up.len(),
        gate.len(),
        "up pairs with gate element by element",
    )?;
    check_len(
        "swiglu",
        "out",
        out.len(),
        gate.len(),
        "out has one value per gate element",
    )?;
    for ((o, &g), &u) in out.iter_mut().zip(gate).zip(up) {
        let (g, u) = match post_scale {
            Some(s) => (g * s, u * s),
            None => (g, u),
        };
        *o = silu(g) * u;
    }
    Ok(())
}

/// Residual add in place: `x[i] = x[i] + y[i]`.
pub fn add(x: &mut [f32], y: &[f32]) -> Result<(), ShapeError> {
    check_len(
        "add",
        "y",
        y.len(),
        x.len(),
        "y pairs with x element by element",
    )?;
    for (a, &b) in x.iter_mut().zip(y) {
        *a += b;
    }
    Ok(())
}

/// Scale in place: `y[i] = y[i] * s` (the fused tier's post-op on the output head).
pub fn scale(y: &mut [f32], s: f32) {
    for v in y {
        *v *= s;
    }
}

/// Stores `src` (one token's `row_len` values, e.g. `n_kv_heads * head_dim`) at position `pos`
/// of a position-major cache, multiplied by the post-scale when there is one (the fused tier's
/// RMS factor on v).
pub fn kv_store(
    cache: &mut [f32],
    pos: usize,
    src: &[f32],
    post_scale: Option<f32>,
) -> Result<(), ShapeError> {
    let n = src.len();
    if (pos + 1) * n > cache.len() {
        return Err(ShapeError {
            op: "kv_store",
            arg: "cache",
            got: cache.len(),
            expected: (pos + 1) * n,
            expected_why: "the cache must hold src.len() values for every position up to pos",
        });
    }
    let dst = &mut cache[pos * n..(pos + 1) * n];
    match post_scale {
        Some(s) => dst.iter_mut().zip(src).for_each(|(d, &v)| *d = v * s),
        None => dst.copy_from_slice(src),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn swiglu_matches_f64_formula() {
        let g: Vec<f32> = (0..100).map(|i| (i as f32 - 50.0) / 8.0).collect();
        let u: Vec<f32> = (0..100).map(|i| (i as f32) / 30.0 - 1.0).collect();
        let mut out = vec![0.0; 100];
        swiglu(&g, &u, &mut out, Some(0.75)).unwrap();
        for i in 0..100 {
            let (gs, us) = (g[i] as f64 * 0.75, u[i] as f64 * 0.75);
            let want = gs / (1.0 + (-gs).exp()) * us;
            assert!((out[i] as f64 - want).abs() <= 1e-6 * (1.0 + want.abs()));
        }
    }

    #[test]
    fn kv_store_writes_its_row_only() {
        let mut cache = vec![-1.0; 12];
        kv_store(&mut cache, 1, &[1.0, 2.0, 3.0, 4.0], Some(2.0)).unwrap();
        assert_eq!(
            cache,
            [
                -1.0, -1.0, -1.0, -1.0, 2.0, 4.0, 6.0, 8.0, -1.0, -1.0, -1.0, -1.0
            ]
        );
        assert!(kv_store(&mut cache, 3, &[0.0; 4], None).is_err());
    }

    #[test]
    fn add_and_scale() {
        let mut x = vec![1.0, 2.0];
        add(&mut x, &[0.5, 0.25]).unwrap();
        scale(&mut x, 2.0);
        assert_eq!(x, [3.0, 4.5]);
        assert!(add(&mut x, &[1.0]).is_err());
    }
}
