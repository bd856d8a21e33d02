//! The CUDA C sources, embedded at build time: one file per kernel family plus the shared
//! `common.cuh`. This module owns the list and how a family's compilable text is composed;
//! compiling and caching belong to [`crate::compile`].

/// The shared header every family is compiled with.
pub const COMMON: &str = include_str!("../cuda/common.cuh");

/// One `.cu` file of `kernels/cuda/`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct KernelSource {
    /// File name inside `kernels/cuda/`, e.g. `matvec_mmvq.cu`.
    pub file: &'static str,
    /// The file's text.
    pub text: &'static str,
}

macro_rules! family {
    ($name:ident, $file:literal) => {
        #[doc = concat!("`kernels/cuda/", $file, "`.")]
        pub const $name: KernelSource = KernelSource {
            file: $file,
            text: include_str!(concat!("../cuda/", $file)),
        };
    };
}

family!(QUANTIZE, "quantize.cu");
family!(NORM, "norm.cu");
family!(MATVEC_MMVQ, "matvec_mmvq.cu");
family!(MATVEC_DP4A, "matvec_dp4a.cu");
family!(MATVEC_FLOAT, "matvec_float.cu");
family!(ROPE, "rope.cu");
family!(ATTENTION, "attention.cu");
family!(ELEMENTWISE, "elementwise.cu");
family!(SAMPLE, "sample.cu");
family!(EMBED, "embed.cu");
family!(PROBE, "probe.cu");

/// Every family, in a fixed order.
pub const ALL: [KernelSource; 11] = [
    QUANTIZE,
    NORM,
    MATVEC_MMVQ,
    MATVEC_DP4A,
    MATVEC_FLOAT,
    ROPE,
    ATTENTION,
    ELEMENTWISE,
    SAMPLE,
    EMBED,
    PROBE,
];

/// Families only the benchmarks use: compiled with the rest (kernel-check, the NVRTC test),
/// but not loaded when a device opens for decoding ([`crate::cuda::Gpu::load_decode`]).
pub const BENCH_ONLY: [KernelSource; 1] = [PROBE];

impl KernelSource {
    /// The text NVRTC compiles: `common.cuh` then the family, each behind a `#line` directive
    /// so that compiler messages name the original file and line.
    pub fn composed(&self) -> String {
        self.composed_with(&[])
    }

    /// [`KernelSource::composed`] behind `#define NAME 1` for each of `defines` (the planted
    /// test defects are compiled in this way, so no kernel carries an argument for them).
    pub fn composed_with(&self, defines: &[&str]) -> String {
        let mut out = String::new();
        for d in defines {
            out.push_str(&format!("#define {d} 1\n"));
        }
        out.push_str(&format!(
            "#line 1 \"common.cuh\"\n{COMMON}\n#line 1 \"{}\"\n{}",
            self.file, self.text
        ));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The name of the kernel whose declaration `rest` continues (after `void `), past an
    /// optional `__launch_bounds__(...)`.
    fn kernel_name(rest: &str) -> &str {
        let rest = match rest.strip_prefix("__launch_bounds__(") {
            Some(r) => r.split_once(')').map_or(r, |(_, after)| after.trim_start()),
            None => rest,
        };
        rest.split('(').next().unwrap_or("").trim()
    }

    /// Every `extern "C"` kernel is named `<op>_<variant>` and every family is non-empty.
    #[test]
    fn families_declare_kernels() {
        for src in ALL {
            let names: Vec<&str> = src
                .text
                .split("extern \"C\" __global__ void ")
                .skip(1)
                .map(kernel_name)
                .collect();
            assert!(!names.is_empty(), "{} declares no kernel", src.file);
            for n in names {
                assert!(
                    n.contains('_'),
                    "{}: kernel {n} is not <op>_<variant>",
                    src.file
                );
            }
        }
    }

    /// Every kernel waits for its predecessor (PDL_ENTRY, directly or in the mmvq bodies that
    /// mmvq_entry, mmvq_rows_entry, mmvq_mma and mmvq_mmar_entry run):
    /// one kernel without the wait would let the next one run ahead of a result it needs.
    #[test]
    fn every_kernel_waits_for_its_predecessor() {
        for src in ALL {
            for body in src.text.split("extern \"C\" __global__ void ").skip(1) {
                let name = kernel_name(body);
                assert!(
                    body.contains("PDL_ENTRY;")
                        || body.contains("mmvq_entry<")
                        || body.contains("mmvq_rows_entry<")
                        || body.contains("mmvq_mma<")
                        || body.contains("mmvq_mmar_entry<"),
                    "{}: kernel {name} has no PDL_ENTRY",
                    src.file
                );
            }
        }
        assert!(MATVEC_MMVQ.text.contains("PDL_ENTRY;"));
    }

    #[test]
    fn composed_text_marks_file_boundaries() {
        let text = NORM.composed();
        assert!(text.starts_with("#line 1 \"common.cuh\"\n"));
        assert!(text.contains("\n#line 1 \"norm.cu\"\n"));
    }
}
