//! The two reduction trees every kernel uses, written out on the host: the warp butterfly
//! (`__shfl_xor_sync` with offsets 16, 8, 4, 2, 1) and the block reduction built on it. Kernels
//! that sum floats across threads use exactly these, so the twins can mirror the order.

/// Sum of 32 lane values in the order of the GPU's xor butterfly. On the GPU lane `i` adds the
/// value of lane `i ^ o` for `o` = 16, 8, 4, 2, 1; because IEEE addition is commutative, lanes
/// `i` and `i ^ o` then hold the same value, so folding the upper half onto the lower half is
/// the same composition. Lane 0 (every lane, on the GPU) ends with the result.
#[inline(always)]
pub fn warp_sum(lanes: &mut [f32; 32]) -> f32 {
    for o in [16, 8, 4, 2, 1] {
        for i in 0..o {
            lanes[i] += lanes[i + o];
        }
    }
    lanes[0]
}

/// Sum of one value per thread of a block (`partials.len()` threads, a multiple of 32, at most
/// 1024) in the order of `block_sum` in `common.cuh`: each warp reduces its 32 lanes with
/// [`warp_sum`], warp sums go to shared memory, and warp 0 reduces them with [`warp_sum`]
/// again, lanes past the number of warps contributing `0.0` (adding `+0.0` changes no bits
/// except `-0.0`, which the kernels never produce as a warp sum of squares or exponentials).
pub fn block_sum(partials: &[f32]) -> f32 {
    debug_assert!(partials.len().is_multiple_of(32) && partials.len() <= 1024);
    let mut warps = [0.0f32; 32];
    for (w, chunk) in partials.chunks_exact(32).enumerate() {
        let mut lanes = [0.0f32; 32];
        lanes.copy_from_slice(chunk);
        warps[w] = warp_sum(&mut lanes);
    }
    warp_sum(&mut warps)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The fold must equal an explicit simulation of the xor butterfly on every lane, and on
    /// random data it is a different tree from a left-to-right sum (why twins mirror it).
    #[test]
    fn warp_sum_matches_butterfly_simulation() {
        let mut state = 0x1234_5678u32;
        let mut differs_from_sequential = 0;
        for _ in 0..100 {
            let mut lanes = [0.0f32; 32];
            for v in lanes.iter_mut() {
                state = state.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                let mant = (state >> 8) as f32 / 16_777_216.0 - 0.5;
                *v = mant * (2.0f32).powi((state % 16) as i32);
            }
            let mut sim = lanes;
            for o in [16usize, 8, 4, 2, 1] {
                let prev = sim;
                for i in 0..32 {
                    sim[i] = prev[i] + prev[i ^ o];
                }
            }
            let folded = warp_sum(&mut lanes.clone());
            for v in sim {
                assert_eq!(v.to_bits(), folded.to_bits());
            }
            let seq: f32 = lanes.iter().sum();
            differs_from_sequential += (seq.to_bits() != folded.to_bits()) as usize;
        }
        assert!(differs_from_sequential > 10, "{differs_from_sequential}");
    }
}
