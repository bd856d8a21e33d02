//! Every kernel family compiles through NVRTC on any machine, GPU or not: the test brings
//! NVRTC 13.0 with `scripts/fetch-nvrtc` (a pip download, cached under target/nvrtc) and runs
//! `kernel-check compile` with it on the library path, so a CUDA syntax error, a lost
//! `--fmad=false` or a compile check that stopped rejecting bad code fails CI, which has no
//! CUDA. Without a reachable package index the test prints why and skips, like the tests of
//! the real model.

use std::path::{Path, PathBuf};
use std::process::Command;

use memra_kernels::sources::ALL;

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("kernels/ has a parent")
        .to_path_buf()
}

/// The folder holding libnvrtc.so.13, or `None` (printed) when it cannot be downloaded.
fn nvrtc_dir() -> Option<PathBuf> {
    let script = repo_root().join("scripts/fetch-nvrtc");
    let out = Command::new(&script)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", script.display()));
    match out.status.code() {
        Some(0) => Some(PathBuf::from(
            String::from_utf8_lossy(&out.stdout).trim().to_string(),
        )),
        Some(2) => {
            eprintln!(
                "skip: NVRTC is not available: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            );
            None
        }
        _ => panic!(
            "scripts/fetch-nvrtc failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ),
    }
}

fn kernel_check_compile(library_path: Option<&Path>) -> (Option<i32>, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_kernel-check"));
    cmd.arg("compile");
    match library_path {
        Some(dir) => {
            let old = std::env::var("LD_LIBRARY_PATH").unwrap_or_default();
            cmd.env("LD_LIBRARY_PATH", format!("{}:{old}", dir.display()));
        }
        None => {
            cmd.env_remove("LD_LIBRARY_PATH");
        }
    }
    let out = cmd.output().expect("kernel-check runs");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code(), text)
}

#[test]
fn every_kernel_family_compiles_with_nvrtc_and_the_canary_is_rejected() {
    let Some(dir) = nvrtc_dir() else {
        return;
    };
    let (code, text) = kernel_check_compile(Some(&dir));
    eprintln!("{text}");
    assert_eq!(code, Some(0), "{text}");
    for src in ALL {
        assert!(
            text.contains(&format!("PASS compile/{} kernels=", src.file)),
            "{} missing from:\n{text}",
            src.file
        );
    }
    for planted in [
        "elementwise.cu+MEMRA_DEFECT_EXP_ULP",
        "quantize.cu+MEMRA_DEFECT_Q8_BLOCK_SUM",
        "attention.cu+MEMRA_DEFECT_PROMPT_TILE",
    ] {
        assert!(
            text.contains(&format!("PASS compile/{planted} planted PTX differs")),
            "{planted} missing from:\n{text}"
        );
    }
    assert!(text.contains("PASS compile/canary rejected as expected at canary.cu:3"));
    assert!(text.contains("NVRTC 13.0"), "{text}");
}

#[test]
fn kernel_check_compile_without_nvrtc_names_the_fetch_script() {
    let (code, text) = kernel_check_compile(None);
    match code {
        // A machine with CUDA installed finds NVRTC on its own.
        Some(0) => assert!(text.contains("ALL GREEN"), "{text}"),
        Some(2) => assert!(
            text.contains("scripts/fetch-nvrtc") && text.contains("libnvrtc"),
            "{text}"
        ),
        other => panic!("unexpected exit {other:?}:\n{text}"),
    }
}
