//! The error type of everything that touches CUDA: missing libraries, NVRTC compile errors
//! mapped to the `.cu` file and line, kernel cache I/O, driver failures and launch arguments
//! that do not fit a kernel.

use std::path::PathBuf;

/// What went wrong while compiling, loading or launching a kernel.
#[derive(Debug, thiserror::Error)]
pub enum KernelError {
    /// A CUDA library could not be loaded on this machine.
    #[error(
        "{library} could not be loaded ({detail}); install the NVIDIA driver / CUDA 13 runtime \
         libraries or run on the CPU backend"
    )]
    Unavailable {
        /// `libcuda` or `libnvrtc`.
        library: &'static str,
        /// What the probe saw.
        detail: String,
    },
    /// NVRTC rejected a kernel source.
    #[error("{file}:{line}: {message}\nfull NVRTC log:\n{log}")]
    Compile {
        /// The `.cu` or `.cuh` file the first error points into.
        file: String,
        /// Its line.
        line: u32,
        /// The first error message.
        message: String,
        /// NVRTC's whole log.
        log: String,
    },
    /// The kernel cache folder could not be used.
    #[error("kernel cache {path}: {source}; set MEMRA_KERNEL_CACHE to a writable folder")]
    Cache {
        /// The file or folder.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A CUDA driver call failed.
    #[error("CUDA driver error while {what}: {source}")]
    Driver {
        /// What was being done (e.g. `loading module matvec_mmvq.cu`).
        what: String,
        /// The driver's error.
        source: cudarc::driver::DriverError,
    },
    /// Launch arguments that do not fit the kernel.
    #[error("{kernel}: {message}")]
    Shape {
        /// The kernel's `extern "C"` name.
        kernel: &'static str,
        /// What does not fit, with the values.
        message: String,
    },
}

impl KernelError {
    /// Wraps a driver error with what was being done.
    pub(crate) fn driver(
        what: impl Into<String>,
    ) -> impl FnOnce(cudarc::driver::DriverError) -> Self {
        let what = what.into();
        move |source| KernelError::Driver { what, source }
    }
}
