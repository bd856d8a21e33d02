//! Launchers of the sample family (`sample.cu`): greedy argmax over logits, temperature,
//! top-k and top-p sampling, and the two building blocks kernel-check compares on their own
//! (`exp_mirrored`, Philox4x32-10). The twins are [`crate::twin::argmax`] and
//! [`crate::twin::sample`].

use cudarc::driver::{CudaSlice, LaunchConfig};

use super::{Gpu, int, need, shape};
use crate::error::KernelError;
use crate::sources;
use crate::twin::{Nucleus, SAMPLE_THREADS};

/// argmax_f32 (sample.cu): threads per block and elements per block.
const ARGMAX_THREADS: u32 = 256;

const ARGMAX_CHUNK: usize = ARGMAX_THREADS as usize * 8;

/// Words of scratch [`Gpu::argmax`] needs for `batch` rows of `n` logits: per row a counter
/// and each chunk's best value and index.
pub fn argmax_scratch_len(batch: usize, n: usize) -> usize {
    batch * (1 + 2 * n.div_ceil(ARGMAX_CHUNK))
}

impl Gpu {
    /// Greedy pick of `batch` rows of `n` logits into `out`: the largest value, ties to the
    /// lower index, NaN never winning. `scratch` holds [`argmax_scratch_len`] words, zeroed
    /// when allocated; every launch leaves it zeroed again (its counters).
    pub fn argmax(
        &self,
        logits: &CudaSlice<f32>,
        out: &mut CudaSlice<u32>,
        scratch: &mut CudaSlice<u32>,
        batch: usize,
        n: usize,
    ) -> Result<(), KernelError> {
        const K: &str = "argmax_f32";
        if n == 0 || batch == 0 {
            return Err(shape(
                K,
                format!("batch = {batch} and n = {n} must be positive"),
            ));
        }
        need(K, "logits", logits.len(), batch * n)?;
        need(K, "out", out.len(), batch)?;
        need(K, "scratch", scratch.len(), argmax_scratch_len(batch, n))?;
        let ni = int(K, "n", n)?;
        let cfg = LaunchConfig {
            grid_dim: (n.div_ceil(ARGMAX_CHUNK) as u32, batch as u32, 1),
            block_dim: (ARGMAX_THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: batch rows of n logits, batch outputs and the scratch's per-row counter and
        // chunk partials, all checked above.
        unsafe { self.launch(&sources::SAMPLE, K, cfg, &[logits, out, scratch, &ni]) }
    }

    /// Temperature + top-k + top-p sampling of `batch` rows of `n` logits (`top_k` 0 keeps
    /// every token), row `b` keyed by `(seed, seq[b], step[b])`; `p_scratch` holds
    /// `batch * n` floats.
    #[allow(clippy::too_many_arguments)]
    pub fn sample(
        &self,
        logits: &CudaSlice<f32>,
        p_scratch: &mut CudaSlice<f32>,
        out: &mut CudaSlice<u32>,
        batch: usize,
        n: usize,
        temp: f32,
        top_k: u32,
        top_p: f32,
        seed: u64,
        seq: &CudaSlice<u32>,
        step: &CudaSlice<u32>,
    ) -> Result<(), KernelError> {
        const K: &str = "sample_f32";
        need(K, "logits", logits.len(), batch * n)?;
        need(K, "p_scratch", p_scratch.len(), batch * n)?;
        need(K, "out", out.len(), batch)?;
        need(K, "seq", seq.len(), batch)?;
        need(K, "step", step.len(), batch)?;
        let ni = int(K, "n", n)?;
        let (lo, hi) = (seed as u32, (seed >> 32) as u32);
        let cfg = LaunchConfig {
            grid_dim: (batch as u32, 1, 1),
            block_dim: (SAMPLE_THREADS as u32, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: every buffer was checked for batch rows of n (or one value per row).
        unsafe {
            self.launch(
                &sources::SAMPLE,
                K,
                cfg,
                &[
                    logits, p_scratch, out, &ni, &temp, &top_k, &top_p, &lo, &hi, seq, step,
                ],
            )
        }
    }

    /// [`Gpu::sample`] with parameters per row: row `b` is drawn under `temp[b]`, `top_k[b]`,
    /// `top_p[b]` and `seed[b]`, keyed by `(seed[b], seq[b], step[b])`, and is the argmax
    /// where `temp[b]` is 0, so one launch serves a batch that mixes greedy and sampled rows.
    /// Each row's token is the one [`Gpu::sample`] draws for that row under its parameters.
    /// `nucleus` is [`Nucleus::Exact`] except under the planted `top-p-cut`, `top-k-cut` and
    /// `top-k-ties` test defects.
    #[allow(clippy::too_many_arguments)]
    pub fn sample_rows(
        &self,
        logits: &CudaSlice<f32>,
        p_scratch: &mut CudaSlice<f32>,
        out: &mut CudaSlice<u32>,
        batch: usize,
        n: usize,
        temp: &CudaSlice<f32>,
        top_k: &CudaSlice<u32>,
        top_p: &CudaSlice<f32>,
        seed: &CudaSlice<u64>,
        seq: &CudaSlice<u32>,
        step: &CudaSlice<u32>,
        nucleus: Nucleus,
    ) -> Result<(), KernelError> {
        const K: &str = "sample_rows_f32";
        if n == 0 || batch == 0 {
            return Err(shape(
                K,
                format!("batch = {batch} and n = {n} must be positive"),
            ));
        }
        need(K, "logits", logits.len(), batch * n)?;
        need(K, "p_scratch", p_scratch.len(), batch * n)?;
        need(K, "out", out.len(), batch)?;
        need(K, "temp", temp.len(), batch)?;
        need(K, "top_k", top_k.len(), batch)?;
        need(K, "top_p", top_p.len(), batch)?;
        need(K, "seed", seed.len(), batch)?;
        need(K, "seq", seq.len(), batch)?;
        need(K, "step", step.len(), batch)?;
        let ni = int(K, "n", n)?;
        // sample.cu's DEFECT_TOP_P_EARLY, DEFECT_TOP_K_ONE_MORE and DEFECT_TOP_K_DROP_TIES.
        let defect: i32 = match nucleus {
            Nucleus::Exact => 0,
            Nucleus::OneEarly => 1,
            Nucleus::KOneMore => 2,
            Nucleus::KDropTies => 3,
        };
        let cfg = LaunchConfig {
            grid_dim: (batch as u32, 1, 1),
            block_dim: (SAMPLE_THREADS as u32, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: every buffer was checked for batch rows of n (or one value per row);
        // defect is the kernel's trailing int.
        unsafe {
            self.launch(
                &sources::SAMPLE,
                K,
                cfg,
                &[
                    logits, p_scratch, out, &ni, temp, top_k, top_p, seed, seq, step, &defect,
                ],
            )
        }
    }

    /// `out[i] = exp_mirrored(x[i])` for `n` values (the sampler's exp; for kernel-check).
    pub fn exp_mirrored(
        &self,
        x: &CudaSlice<f32>,
        out: &mut CudaSlice<f32>,
        n: usize,
    ) -> Result<(), KernelError> {
        const K: &str = "exp_mirrored_f32";
        need(K, "x", x.len(), n)?;
        need(K, "out", out.len(), n)?;
        let ni = int(K, "n", n)?;
        // SAFETY: x and out hold n floats, checked above.
        unsafe { self.launch(&sources::SAMPLE, K, Self::ew_cfg(n), &[x, out, &ni]) }
    }

    /// Philox4x32-10 of `n` counters (4 words each) under `key`, for checking the device
    /// generator against the twin.
    pub fn philox(
        &self,
        ctr: &CudaSlice<u32>,
        out: &mut CudaSlice<u32>,
        key: [u32; 2],
        n: usize,
    ) -> Result<(), KernelError> {
        const K: &str = "philox_u32";
        need(K, "ctr", ctr.len(), 4 * n)?;
        need(K, "out", out.len(), 4 * n)?;
        let ni = int(K, "n", n)?;
        // SAFETY: ctr and out hold 4 * n words, checked above.
        unsafe {
            self.launch(
                &sources::SAMPLE,
                K,
                Self::ew_cfg(n),
                &[ctr, out, &key[0], &key[1], &ni],
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The launcher's block size and chunk agree with the kernel's, and the scratch holds a
    /// counter and two words per chunk for each row.
    #[test]
    fn argmax_constants_match_the_kernel_source() {
        let sample = sources::SAMPLE.text;
        assert!(sample.contains(&format!("#define ARGMAX_THREADS {ARGMAX_THREADS}\n")));
        assert!(sample.contains("#define ARGMAX_CHUNK (ARGMAX_THREADS * 8)\n"));
        assert_eq!(argmax_scratch_len(2, 49152), 2 * (1 + 2 * 24));
    }

    /// The defect codes the launcher passes are the kernel's.
    #[test]
    fn defect_codes_match_the_kernel_source() {
        let sample = sources::SAMPLE.text;
        assert!(sample.contains("#define DEFECT_TOP_P_EARLY 1\n"));
        assert!(sample.contains("#define DEFECT_TOP_K_ONE_MORE 2\n"));
        assert!(sample.contains("#define DEFECT_TOP_K_DROP_TIES 3\n"));
    }
}
