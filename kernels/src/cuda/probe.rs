//! Launcher of the probe family (`probe.cu`): the read ceiling the benchmark measures the
//! matvecs against. No decode step runs it, so it has no twin and no kernel-check case;
//! [`crate::sources::BENCH_ONLY`] keeps it out of the modules a decoding device loads.

use cudarc::driver::{CudaSlice, LaunchConfig};

use super::{Gpu, int, need};
use crate::error::KernelError;
use crate::sources;

impl Gpu {
    /// The read ceiling (`probe_read_u4`, a benchmark reference): reads every 16-byte word
    /// of `buf` over `blocks` blocks of 256 threads, each thread four words in flight.
    pub fn probe_read(
        &self,
        buf: &CudaSlice<u8>,
        blocks: u32,
        out: &mut CudaSlice<u32>,
    ) -> Result<(), KernelError> {
        const K: &str = "probe_read_u4";
        need(K, "out", out.len(), blocks as usize)?;
        let n = int(K, "16-byte words", buf.len() / 16)?;
        let cfg = LaunchConfig {
            grid_dim: (blocks.max(1), 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: the kernel reads the first n 16-byte words of buf (n = len / 16; device
        // allocations are 256-byte aligned) and writes at most out[blockIdx.x], blocks of
        // which were checked above.
        unsafe { self.launch(&sources::PROBE, K, cfg, &[buf, &n, out]) }
    }
}
