//! NVRTC compilation of the kernel families and the on-disk PTX cache.
//!
//! A family compiles on first use for the device's compute capability with `--fmad=false`
//! (the twins' composition has no FMA) and NVRTC's exact defaults for division, square root
//! and denormals. The PTX is cached under `MEMRA_KERNEL_CACHE`, else
//! `$XDG_CACHE_HOME/memra/ptx`, else `~/.cache/memra/ptx`, keyed by
//! sha256(composed source, options, NVRTC version), so a changed kernel, option or compiler
//! never reuses stale PTX. A compile error names the `.cu` file and line.
//!
//! This module does not load modules into a context or launch anything ([`crate::cuda`]).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::error::KernelError;
use crate::sources::KernelSource;

/// Options every family is compiled with, besides the architecture.
pub const BASE_OPTIONS: [&str; 4] = [
    "--fmad=false",
    "--prec-div=true",
    "--prec-sqrt=true",
    "--ftz=false",
];

/// The full NVRTC option list for `arch` (e.g. `compute_90`).
pub fn options(arch: &str) -> Vec<String> {
    let mut o: Vec<String> = BASE_OPTIONS.iter().map(|s| s.to_string()).collect();
    o.push(format!("--gpu-architecture={arch}"));
    o
}

/// The cache key: hex sha256 of the composed source, the options and the NVRTC version.
pub fn cache_key(composed: &str, options: &[String], nvrtc_version: (i32, i32)) -> String {
    let mut h = Sha256::new();
    h.update(composed.as_bytes());
    h.update([0u8]);
    h.update(options.join(" ").as_bytes());
    h.update([0u8]);
    h.update(format!("nvrtc {}.{}", nvrtc_version.0, nvrtc_version.1).as_bytes());
    let mut hex = String::with_capacity(64);
    for b in h.finalize().iter() {
        let _ = write!(hex, "{b:02x}");
    }
    hex
}

/// The cache folder from the environment: `MEMRA_KERNEL_CACHE`, `XDG_CACHE_HOME/memra/ptx`
/// or `HOME/.cache/memra/ptx`; `None` when none is set (compiles then go uncached).
pub fn cache_dir_from(get: impl Fn(&str) -> Option<String>) -> Option<PathBuf> {
    let set = |k: &str| get(k).filter(|v| !v.is_empty());
    if let Some(dir) = set("MEMRA_KERNEL_CACHE") {
        return Some(PathBuf::from(dir));
    }
    if let Some(xdg) = set("XDG_CACHE_HOME") {
        return Some(Path::new(&xdg).join("memra").join("ptx"));
    }
    set("HOME").map(|home| Path::new(&home).join(".cache").join("memra").join("ptx"))
}

/// [`cache_dir_from`] the process environment.
pub fn cache_dir() -> Option<PathBuf> {
    cache_dir_from(|k| std::env::var(k).ok())
}

/// A folder of `<family>-<key>.ptx` files.
#[derive(Debug, Clone)]
pub struct PtxCache {
    dir: PathBuf,
}

impl PtxCache {
    pub fn new(dir: PathBuf) -> Self {
        PtxCache { dir }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn path(&self, file: &str, key: &str) -> PathBuf {
        let stem = file.trim_end_matches(".cu");
        self.dir
            .join(format!("{stem}-{}.ptx", &key[..key.len().min(32)]))
    }

    /// The cached PTX, if present and readable.
    pub fn get(&self, file: &str, key: &str) -> Option<String> {
        std::fs::read_to_string(self.path(file, key))
            .ok()
            .filter(|s| !s.is_empty())
    }

    /// Stores PTX atomically (write a temporary file, then rename), so a concurrent reader
    /// never sees half a file.
    pub fn put(&self, file: &str, key: &str, ptx: &str) -> Result<PathBuf, KernelError> {
        let cache_err = |path: &Path| {
            let path = path.to_path_buf();
            move |source| KernelError::Cache { path, source }
        };
        std::fs::create_dir_all(&self.dir).map_err(cache_err(&self.dir))?;
        let path = self.path(file, key);
        let tmp = path.with_extension(format!("tmp.{}", std::process::id()));
        std::fs::write(&tmp, ptx).map_err(cache_err(&tmp))?;
        std::fs::rename(&tmp, &path).map_err(cache_err(&path))?;
        Ok(path)
    }
}

/// PTX of one family and where it came from.
#[derive(Debug, Clone)]
pub struct CompiledPtx {
    pub file: &'static str,
    pub ptx: String,
    pub key: String,
    /// True when read from the disk cache instead of compiled.
    pub from_cache: bool,
    /// Set when the cache could not be written (the PTX is still usable).
    pub cache_warning: Option<String>,
}

/// Checks that the NVRTC library can be loaded (calling into a missing library would panic
/// inside cudarc's dynamic loader) and returns its version.
pub fn nvrtc_version() -> Result<(i32, i32), KernelError> {
    // SAFETY: `is_culib_present` only tries to open the library by its candidate names.
    if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        return Err(KernelError::Unavailable {
            library: "libnvrtc",
            detail: "no libnvrtc.so found on the library path".into(),
        });
    }
    let (mut major, mut minor) = (0i32, 0i32);
    // SAFETY: the library is present (checked above); both pointers are valid for writes.
    let rc = unsafe { cudarc::nvrtc::sys::nvrtcVersion(&mut major, &mut minor) };
    if rc != cudarc::nvrtc::sys::nvrtcResult::NVRTC_SUCCESS {
        return Err(KernelError::Unavailable {
            library: "libnvrtc",
            detail: format!("nvrtcVersion returned {rc:?}"),
        });
    }
    Ok((major, minor))
}

/// The first `file(line): error: message` of an NVRTC log.
pub fn first_error(log: &str) -> Option<(String, u32, String)> {
    for l in log.lines() {
        let Some(pos) = l.find("): error") else {
            continue;
        };
        let head = &l[..pos];
        let Some(open) = head.rfind('(') else {
            continue;
        };
        let Ok(line) = head[open + 1..].parse::<u32>() else {
            continue;
        };
        let file = head[..open].trim().to_string();
        let message = l[pos + "): error".len()..]
            .trim_start_matches(':')
            .trim()
            .to_string();
        return Some((file, line, message));
    }
    None
}

/// Compiles `src` for `arch` (e.g. `compute_90`), through `cache` when there is one.
pub fn compile(
    src: &KernelSource,
    arch: &'static str,
    cache: Option<&PtxCache>,
) -> Result<CompiledPtx, KernelError> {
    compile_with(src, arch, cache, &[])
}

/// [`compile`] with `#define NAME 1` for each of `defines` ahead of the source
/// ([`KernelSource::composed_with`]); the defines are part of the composed text, so of the
/// cache key too.
pub fn compile_with(
    src: &KernelSource,
    arch: &'static str,
    cache: Option<&PtxCache>,
    defines: &[&str],
) -> Result<CompiledPtx, KernelError> {
    let version = nvrtc_version()?;
    let composed = src.composed_with(defines);
    let opts = options(arch);
    let key = cache_key(&composed, &opts, version);
    if let Some(ptx) = cache.and_then(|c| c.get(src.file, &key)) {
        return Ok(CompiledPtx {
            file: src.file,
            ptx,
            key,
            from_cache: true,
            cache_warning: None,
        });
    }
    let copts = cudarc::nvrtc::CompileOptions {
        fmad: Some(false),
        prec_div: Some(true),
        prec_sqrt: Some(true),
        ftz: Some(false),
        arch: Some(arch),
        name: Some(src.file.to_string()),
        ..Default::default()
    };
    let ptx = cudarc::nvrtc::compile_ptx_with_opts(&composed, copts).map_err(|e| match e {
        cudarc::nvrtc::CompileError::CompileError { log, .. } => {
            let log = log.to_string_lossy().into_owned();
            let (file, line, message) = first_error(&log).unwrap_or_else(|| {
                (
                    src.file.to_string(),
                    0,
                    "NVRTC failed without a located error".into(),
                )
            });
            KernelError::Compile {
                file,
                line,
                message,
                log,
            }
        }
        other => KernelError::Compile {
            file: src.file.to_string(),
            line: 0,
            message: format!("NVRTC could not compile: {other}"),
            log: String::new(),
        },
    })?;
    let ptx = ptx.to_src();
    let cache_warning = match cache.map(|c| c.put(src.file, &key, &ptx)) {
        Some(Err(e)) => Some(e.to_string()),
        _ => None,
    };
    Ok(CompiledPtx {
        file: src.file,
        ptx,
        key,
        from_cache: false,
        cache_warning,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_changes_with_source_options_and_compiler() {
        let o = options("compute_90");
        let base = cache_key("src", &o, (13, 0));
        assert_eq!(base.len(), 64);
        assert_eq!(base, cache_key("src", &o, (13, 0)));
        assert_ne!(base, cache_key("src2", &o, (13, 0)));
        assert_ne!(base, cache_key("src", &options("compute_80"), (13, 0)));
        assert_ne!(base, cache_key("src", &o, (13, 1)));
        assert!(o.contains(&"--fmad=false".to_string()));
    }

    #[test]
    fn cache_dir_precedence() {
        fn env(pairs: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
            move |k| {
                pairs
                    .iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| v.to_string())
            }
        }
        const ALL: [(&str, &str); 3] = [
            ("MEMRA_KERNEL_CACHE", "/k"),
            ("XDG_CACHE_HOME", "/x"),
            ("HOME", "/h"),
        ];
        assert_eq!(cache_dir_from(env(&ALL)), Some(PathBuf::from("/k")));
        assert_eq!(
            cache_dir_from(env(&[ALL[1], ALL[2]])),
            Some(PathBuf::from("/x/memra/ptx"))
        );
        assert_eq!(
            cache_dir_from(env(&[ALL[2]])),
            Some(PathBuf::from("/h/.cache/memra/ptx"))
        );
        assert_eq!(cache_dir_from(env(&[("MEMRA_KERNEL_CACHE", "")])), None);
    }

    #[test]
    fn cache_round_trip_is_keyed() {
        let dir = tempfile::tempdir().unwrap();
        let cache = PtxCache::new(dir.path().join("nested"));
        let key = cache_key("a", &options("compute_90"), (13, 0));
        assert_eq!(cache.get("norm.cu", &key), None);
        let path = cache.put("norm.cu", &key, ".version 9.0").unwrap();
        assert!(
            path.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("norm-")
        );
        assert_eq!(cache.get("norm.cu", &key).as_deref(), Some(".version 9.0"));
        let other = cache_key("b", &options("compute_90"), (13, 0));
        assert_eq!(cache.get("norm.cu", &other), None);
    }

    #[test]
    fn unwritable_cache_is_an_error_naming_the_path() {
        let dir = tempfile::tempdir().unwrap();
        let blocker = dir.path().join("file");
        std::fs::write(&blocker, "x").unwrap();
        let err = PtxCache::new(blocker.join("sub"))
            .put("norm.cu", &"0".repeat(64), "p")
            .unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.contains("file/sub") && msg.contains("MEMRA_KERNEL_CACHE"),
            "{msg}"
        );
    }

    #[test]
    fn first_error_locates_file_and_line() {
        let log = "norm.cu(12): warning: unused\nmatvec_mmvq.cu(41): error: identifier \"acc2\" is undefined\n\n1 error detected";
        assert_eq!(
            first_error(log),
            Some((
                "matvec_mmvq.cu".into(),
                41,
                "identifier \"acc2\" is undefined".into()
            ))
        );
        assert_eq!(first_error("no errors here"), None);
    }
}

/// Tests that need NVRTC (not a GPU): they run where libnvrtc loads and print why they skip
/// elsewhere.
#[cfg(test)]
mod nvrtc_tests {
    use super::*;
    use crate::sources;

    fn nvrtc_or_skip() -> bool {
        match nvrtc_version() {
            Ok(_) => true,
            Err(e) => {
                eprintln!("skipped: {e}");
                false
            }
        }
    }

    /// Every family compiles for sm_90 without FMA contraction, and a second compile comes
    /// from the cache.
    #[test]
    fn every_family_compiles_and_caches() {
        if !nvrtc_or_skip() {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let cache = PtxCache::new(dir.path().to_path_buf());
        for src in sources::ALL {
            let first = compile(&src, "compute_90", Some(&cache)).unwrap_or_else(|e| panic!("{e}"));
            assert!(
                !first.from_cache && first.ptx.contains(".entry"),
                "{}",
                src.file
            );
            // --fmad=false: no multiply-add contraction, or the twins could not mirror the
            // composition. CUDA's own expf uses FMA internally, which is why exp is the one
            // operation compared with a tolerance; families without it must have none.
            if !src.text.contains("expf(") {
                assert!(
                    !first.ptx.contains("fma.rn.f32"),
                    "{} contains an FMA",
                    src.file
                );
            }
            let second = compile(&src, "compute_90", Some(&cache)).unwrap();
            assert!(second.from_cache);
            assert_eq!(first.ptx, second.ptx);
        }
    }

    /// A compile error names the .cu file and its own line, not the composed text's line.
    #[test]
    fn compile_error_names_file_and_line() {
        if !nvrtc_or_skip() {
            return;
        }
        let broken = KernelSource {
            file: "broken.cu",
            text: "// line 1\nextern \"C\" __global__ void broken_f32(float* x) {\n    x[0] = undefined_name;\n}\n",
        };
        match compile(&broken, "compute_90", None) {
            Err(KernelError::Compile {
                file,
                line,
                message,
                ..
            }) => {
                assert_eq!((file.as_str(), line), ("broken.cu", 3), "{message}");
                assert!(message.contains("undefined_name"), "{message}");
            }
            other => panic!("expected a compile error, got {other:?}"),
        }
    }
}
