//! The trace tap of a pass: where its quantization sites go, nowhere by default or into
//! the backend's activation trace.
//!
//! This module owns copying a site back and recording it; which launches produce the
//! sites is [`super::step`], and the trace itself is [`crate::backend::trace`].

use std::ops::Range;

use cudarc::driver::CudaSlice;
use memra_kernels::blocks::{BlockQ8_1, QK};
use memra_kernels::cuda::Gpu;
use memra_kernels::error::KernelError;

use crate::backend::RowSpec;
use crate::backend::trace::{ActivationTrace, Composition, Site, SiteKey, SiteRecord};

/// Where a pass's quantization sites go: nowhere (`trace: None`, the default, costing one
/// branch per site) or into the backend's activation trace, one record per row.
pub(super) struct Tap<'a> {
    pub(super) trace: Option<&'a mut ActivationTrace>,
    /// The pass's rows, in the order of the step buffers.
    pub(super) rows: &'a [RowSpec],
    /// The rows whose head input is recorded (see [`super::CudaBackend::pass`]).
    pub(super) head: Range<usize>,
}

impl Tap<'_> {
    /// A tap that records nothing.
    pub(super) fn off() -> Tap<'static> {
        Tap {
            trace: None,
            rows: &[],
            head: 0..0,
        }
    }

    /// Whether sites are being recorded.
    pub(super) fn on(&self) -> bool {
        self.trace.is_some()
    }

    /// Copies one site back and records each row's blocks: the first `rows * width / 32`
    /// blocks of `xq` and, in the fused composition, the first `rows` norm factors of `r`.
    /// The copies are queued on `gpu`'s stream, the stream whose launches produced the site,
    /// and waited for before the next launch is queued, so they see exactly this site.
    pub(super) fn record(
        &mut self,
        gpu: &Gpu,
        layer: usize,
        site: Site,
        xq: &CudaSlice<BlockQ8_1>,
        width: usize,
        r: Option<&CudaSlice<f32>>,
    ) -> Result<(), KernelError> {
        let Some(trace) = self.trace.as_deref_mut() else {
            return Ok(());
        };
        let keep = if site == Site::HeadIn {
            self.head.clone()
        } else {
            0..self.rows.len()
        };
        if keep.is_empty() {
            return Ok(());
        }
        let n = self.rows.len();
        let per_row = width / QK;
        let driver = |source| KernelError::Driver {
            what: format!("copying the {site} activations of layer {layer} back for the trace"),
            source,
        };
        let stream = gpu.stream();
        let empty = BlockQ8_1 {
            d: half::f16::ZERO,
            s: half::f16::ZERO,
            qs: [0; QK],
        };
        let mut blocks = vec![empty; n * per_row];
        stream
            .memcpy_dtoh(&xq.slice(..n * per_row), &mut blocks)
            .map_err(driver)?;
        let factors = match r {
            Some(r) => {
                let mut f = vec![0.0f32; n];
                stream.memcpy_dtoh(&r.slice(..n), &mut f).map_err(driver)?;
                Some(f)
            }
            None => None,
        };
        stream.synchronize().map_err(driver)?;
        for i in keep {
            let row = &self.rows[i];
            let r = factors.as_ref().map(|f| f[i]);
            trace.record(
                SiteKey {
                    seq: row.seq,
                    pos: row.pos,
                    layer,
                    site,
                },
                SiteRecord {
                    composition: if r.is_some() {
                        Composition::Fused
                    } else {
                        Composition::Separate
                    },
                    blocks: blocks[i * per_row..(i + 1) * per_row].to_vec(),
                    r,
                },
            );
        }
        Ok(())
    }
}
