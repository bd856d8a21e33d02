//! Work that spans two devices: peer access between their contexts, events that order one
//! device's stream after another's, and the copy of a buffer from one device to another.
//!
//! This module owns only the cross-device primitives; it decides nothing about when to use
//! them (the engine's CUDA backend orders its pipeline segments with them). Every [`Gpu`]
//! keeps CUDA's per-buffer event tracking off, so nothing orders two streams implicitly:
//! a stream that must see another stream's writes waits on a [`Fence`] recorded after them.
//! Errors come back as [`KernelError::Driver`] naming the two devices; nothing here panics.

use cudarc::driver::{CudaEvent, DevicePtr, DevicePtrMut, sys};

use super::Gpu;
use crate::error::KernelError;

impl Gpu {
    /// The CUDA ordinal of this device.
    pub fn ordinal(&self) -> usize {
        self.ctx.ordinal()
    }

    /// Whether kernels on this device can read and write `peer`'s memory once peer access
    /// is enabled (`cuDeviceCanAccessPeer`). A device is never its own peer.
    pub fn can_access_peer(&self, peer: &Gpu) -> Result<bool, KernelError> {
        if self.ordinal() == peer.ordinal() {
            return Ok(false);
        }
        let mut can: std::ffi::c_int = 0;
        // SAFETY: `can` is a valid out-pointer for the call's duration, and both device
        // handles come from live contexts.
        unsafe { sys::cuDeviceCanAccessPeer(&mut can, self.ctx.cu_device(), peer.ctx.cu_device()) }
            .result()
            .map_err(KernelError::driver(format!(
                "asking whether CUDA device {} can access device {}",
                self.ordinal(),
                peer.ordinal()
            )))?;
        Ok(can != 0)
    }

    /// Lets kernels on this device access `peer`'s memory when the hardware allows it;
    /// returns whether access is on afterwards (`false`: the pair has no peer path, and
    /// copies between them still work through [`copy_peer`], staged by the driver).
    ///
    /// Two grants are needed: context peer access covers `cuMemAlloc` memory, and the
    /// access list of `peer`'s memory pool covers stream-ordered allocations
    /// (`cuMemAllocAsync`, which cudarc uses wherever the device supports pools); context
    /// peer access alone leaves pool memory unreachable.
    pub fn enable_peer_access(&self, peer: &Gpu) -> Result<bool, KernelError> {
        if !self.can_access_peer(peer)? {
            return Ok(false);
        }
        let what = || {
            format!(
                "enabling peer access from CUDA device {} to device {}",
                self.ordinal(),
                peer.ordinal()
            )
        };
        // The access is granted to the context current on the calling thread.
        self.ctx
            .bind_to_thread()
            .map_err(KernelError::driver(what()))?;
        // SAFETY: this device's context is current and `peer`'s context is alive (held by
        // `peer`); flags must be 0.
        let r = unsafe { sys::cuCtxEnablePeerAccess(peer.ctx.cu_ctx(), 0) };
        match r {
            sys::cudaError_enum::CUDA_SUCCESS
            // Primary contexts are shared per device, so another opening of the same pair
            // in this process may have enabled it already.
            | sys::cudaError_enum::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED => {}
            other => {
                return Err(KernelError::Driver {
                    what: what(),
                    source: cudarc::driver::DriverError(other),
                });
            }
        }
        if peer.ctx.has_async_alloc() {
            let pool_what = || format!("{} (its memory pool)", what());
            let mut pool: sys::CUmemoryPool = std::ptr::null_mut();
            // SAFETY: `pool` is a valid out-pointer and the device handle is live.
            unsafe { sys::cuDeviceGetMemPool(&mut pool, peer.ctx.cu_device()) }
                .result()
                .map_err(KernelError::driver(pool_what()))?;
            let access = sys::CUmemAccessDesc {
                location: sys::CUmemLocation {
                    type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
                    id: self.ctx.cu_device(),
                },
                flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
            };
            // SAFETY: `pool` is `peer`'s current pool (where its stream-ordered allocations
            // come from), `access` is one valid descriptor naming another device, and the
            // pair can access each other (checked above). The grant covers the pool's
            // existing and future allocations.
            unsafe { sys::cuMemPoolSetAccess(pool, &access, 1) }
                .result()
                .map_err(KernelError::driver(pool_what()))?;
        }
        Ok(true)
    }

    /// A new fence of this device (an event without timing).
    pub fn fence(&self) -> Result<Fence, KernelError> {
        let event = self
            .ctx
            .new_event(None)
            .map_err(KernelError::driver(format!(
                "creating an event on CUDA device {}",
                self.ordinal()
            )))?;
        Ok(Fence {
            event,
            ordinal: self.ordinal(),
        })
    }
}

/// A point in one device's stream that another device's stream can wait for. Recording it
/// again moves the point; a wait already queued keeps the point it saw.
pub struct Fence {
    event: CudaEvent,
    ordinal: usize,
}

impl Fence {
    /// Marks the end of the work queued on `gpu`'s stream so far; `gpu` must be the device
    /// the fence was made on.
    pub fn record(&self, gpu: &Gpu) -> Result<(), KernelError> {
        self.event
            .record(gpu.stream())
            .map_err(KernelError::driver(format!(
                "recording an event of CUDA device {} on the stream of device {}",
                self.ordinal,
                gpu.ordinal()
            )))
    }

    /// Makes the work queued on `gpu`'s stream from now on wait until the recorded point is
    /// reached (on the device; the host does not block). `gpu` may be any device.
    pub fn wait(&self, gpu: &Gpu) -> Result<(), KernelError> {
        gpu.stream()
            .wait(&self.event)
            .map_err(KernelError::driver(format!(
                "making CUDA device {} wait for an event of device {}",
                gpu.ordinal(),
                self.ordinal
            )))
    }
}

/// Copies `src` (on device `from`) into the start of `dst` (on device `to`) on `from`'s
/// stream with `cuMemcpyPeerAsync`, which works with or without peer access. The copy is
/// ordered after earlier work on `from`'s stream only: the caller orders `to`'s readers and
/// writers of `dst` around it with fences.
pub fn copy_peer<T, Src, Dst>(
    from: &Gpu,
    src: &Src,
    to: &Gpu,
    dst: &mut Dst,
) -> Result<(), KernelError>
where
    Src: DevicePtr<T>,
    Dst: DevicePtrMut<T>,
{
    if dst.len() < src.len() {
        return Err(KernelError::Shape {
            kernel: "peer copy",
            message: format!(
                "the destination on CUDA device {} holds {} elements, the source on device {} \
                 {}",
                to.ordinal(),
                dst.len(),
                from.ordinal(),
                src.len()
            ),
        });
    }
    let what = || {
        format!(
            "copying {} bytes from CUDA device {} to device {}",
            src.num_bytes(),
            from.ordinal(),
            to.ordinal()
        )
    };
    from.ctx
        .bind_to_thread()
        .map_err(KernelError::driver(what()))?;
    let stream = from.stream();
    let bytes = src.num_bytes();
    // Event tracking is off on every `Gpu`, so taking the pointers queues no waits and
    // records no events; the guards are inert.
    let (src_ptr, _src_guard) = src.device_ptr(stream);
    let (dst_ptr, _dst_guard) = dst.device_ptr_mut(stream);
    // SAFETY: both pointers are live allocations of their contexts (borrowed for the call),
    // `bytes` fits both (checked above), and the stream belongs to the current context.
    unsafe {
        sys::cuMemcpyPeerAsync(
            dst_ptr,
            to.ctx.cu_ctx(),
            src_ptr,
            from.ctx.cu_ctx(),
            bytes,
            stream.cu_stream(),
        )
    }
    .result()
    .map_err(KernelError::driver(what()))
}
