//! Kernel launches through `cuLaunchKernelEx`, so every launch can carry the programmatic
//! dependent launch (PDL) attribute.
//!
//! With PDL a kernel's blocks may be scheduled while the kernel before it in the stream is
//! still running; each kernel in `kernels/cuda/` begins with `pdl_wait()`
//! (`griddepcontrol.wait`, see `common.cuh`), which blocks until the previous grid has
//! finished and its writes are visible, so no kernel touches an activation before its
//! producer is done. What PDL hides is the launch latency and the block ramp-up between two
//! dependent kernels, which dominate the small kernels of a decode step. The arithmetic is
//! untouched, so the bits are the same with PDL on or off (`MEMRA_PDL=0` switches it off for
//! comparison).
//!
//! cudarc's launch builder has no launch attributes, hence this small builder of our own.
//! [`Gpu::launch`] is the one tail every launcher ends in: look the kernel up, put its
//! arguments in order, launch, and name the kernel in a driver error. It owns nothing beyond
//! one launch; the length checks that make a launch safe stay in each launcher, beside the
//! `// SAFETY:` comment that relies on them.

use std::ffi::c_void;

use cudarc::driver::{
    CudaFunction, CudaSlice, CudaStream, CudaView, CudaViewMut, DevicePtr, DriverError,
    LaunchConfig, sys,
};

use super::{DeviceWeights, Gpu};
use crate::error::KernelError;
use crate::sources::KernelSource;

/// A kernel argument as the 8-byte word the driver reads (device pointers are 8 bytes;
/// 4-byte scalars sit in the low bytes, which is where a little-endian read of their size
/// finds them).
pub(crate) trait KernelArg {
    fn word(&self, stream: &CudaStream) -> u64;
}

impl<T> KernelArg for CudaSlice<T> {
    fn word(&self, stream: &CudaStream) -> u64 {
        self.device_ptr(stream).0
    }
}
impl<T> KernelArg for CudaView<'_, T> {
    fn word(&self, stream: &CudaStream) -> u64 {
        self.device_ptr(stream).0
    }
}
impl<T> KernelArg for CudaViewMut<'_, T> {
    fn word(&self, stream: &CudaStream) -> u64 {
        self.device_ptr(stream).0
    }
}
impl KernelArg for u64 {
    fn word(&self, _: &CudaStream) -> u64 {
        *self
    }
}
impl KernelArg for i32 {
    fn word(&self, _: &CudaStream) -> u64 {
        *self as u32 as u64
    }
}
impl KernelArg for u32 {
    fn word(&self, _: &CudaStream) -> u64 {
        *self as u64
    }
}
impl KernelArg for f32 {
    fn word(&self, _: &CudaStream) -> u64 {
        self.to_bits() as u64
    }
}

/// An optional pointer argument: the buffer's address, or null for `None` (the kernels test
/// their optional pointers before use).
impl<T: KernelArg> KernelArg for Option<&T> {
    fn word(&self, stream: &CudaStream) -> u64 {
        self.map_or(0, |a| a.word(stream))
    }
}
impl<T: KernelArg> KernelArg for Option<&mut T> {
    fn word(&self, stream: &CudaStream) -> u64 {
        self.as_ref().map_or(0, |a| a.word(stream))
    }
}

impl<'a> DeviceWeights<'a> {
    /// The weights as a kernel argument: their device address, whatever the type.
    pub(super) fn arg(self) -> &'a dyn KernelArg {
        match self {
            DeviceWeights::Q4_0(s) => s,
            DeviceWeights::Q4_1(s) => s,
            DeviceWeights::Q8_0(s) => s,
            DeviceWeights::F32(s) => s,
            DeviceWeights::F16(s) => s,
            DeviceWeights::BF16(s) => s,
        }
    }
}

impl Gpu {
    /// Launches kernel `name` of `src` over `cfg` with `args`, on this device's stream, with
    /// programmatic dependent launch where the device was opened with it. The kernel is
    /// compiled and loaded on first use.
    ///
    /// # Safety
    /// `args` must be the kernel's parameters in order, each of its type, and the kernel
    /// must stay inside the buffers it is given for this grid.
    pub(super) unsafe fn launch(
        &self,
        src: &KernelSource,
        name: &'static str,
        cfg: LaunchConfig,
        args: &[&dyn KernelArg],
    ) -> Result<(), KernelError> {
        let f = self.func(src, name)?;
        // SAFETY: the caller vouches for the arguments and the grid.
        unsafe { self.launch_func(&f, name, cfg, args) }
    }

    /// [`Gpu::launch`] of a function already looked up (the launchers that ask the driver
    /// about the function first, for its shared memory or occupancy).
    ///
    /// # Safety
    /// As for [`Gpu::launch`].
    pub(super) unsafe fn launch_func(
        &self,
        f: &CudaFunction,
        name: &str,
        cfg: LaunchConfig,
        args: &[&dyn KernelArg],
    ) -> Result<(), KernelError> {
        let mut b = Launch::new(&self.stream, f, self.pdl);
        for a in args {
            b.arg(*a);
        }
        // SAFETY: the caller vouches for the arguments and the grid.
        unsafe { b.launch(cfg) }.map_err(KernelError::driver(format!("launching {name}")))
    }
}

/// One launch being assembled: the function, the stream and the argument words in order.
struct Launch<'a> {
    stream: &'a CudaStream,
    func: &'a CudaFunction,
    words: Vec<u64>,
    pdl: bool,
}

impl<'a> Launch<'a> {
    fn new(stream: &'a CudaStream, func: &'a CudaFunction, pdl: bool) -> Self {
        Launch {
            stream,
            func,
            words: Vec::with_capacity(16),
            pdl,
        }
    }

    /// Appends the next kernel argument.
    fn arg<A: KernelArg + ?Sized>(&mut self, a: &A) -> &mut Self {
        self.words.push(a.word(self.stream));
        self
    }

    /// Launches on the stream (binding its context to this thread first, as work on several
    /// devices from one thread needs).
    ///
    /// # Safety
    /// The arguments must be the kernel's parameters in order, each of its type, and the
    /// kernel must stay inside the buffers it is given for this grid.
    unsafe fn launch(&mut self, cfg: LaunchConfig) -> Result<(), DriverError> {
        self.stream.context().bind_to_thread()?;
        let mut params: Vec<*mut c_void> = self
            .words
            .iter_mut()
            .map(|w| w as *mut u64 as *mut c_void)
            .collect();
        // SAFETY: the attribute union is plain data; zero is a valid pattern for it.
        let mut attr: sys::CUlaunchAttribute = unsafe { std::mem::zeroed() };
        attr.id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
        attr.value.programmaticStreamSerializationAllowed = 1;
        let config = sys::CUlaunchConfig {
            gridDimX: cfg.grid_dim.0,
            gridDimY: cfg.grid_dim.1,
            gridDimZ: cfg.grid_dim.2,
            blockDimX: cfg.block_dim.0,
            blockDimY: cfg.block_dim.1,
            blockDimZ: cfg.block_dim.2,
            sharedMemBytes: cfg.shared_mem_bytes,
            hStream: self.stream.cu_stream(),
            attrs: &mut attr,
            numAttrs: u32::from(self.pdl),
        };
        // SAFETY: `params` points at one live word per kernel parameter for the duration of
        // the call (the driver copies them before returning); the config and attribute
        // outlive the call; the caller vouches for the kernel's contract.
        unsafe {
            sys::cuLaunchKernelEx(
                &config,
                self.func.cu_function(),
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        }
        .result()
    }
}
