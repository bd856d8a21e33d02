//! `exact-gate`: the engine held statistically to the exact model, the float64 forward pass
//! of the quantized weights with no activation quantization (`reference::forward_exact`),
//! the way llama.cpp's `perplexity --kl-divergence` holds a quantization to its base model.
//!
//! Per arm (a checkpoint) and engine path (one-shot prefill; prefill then single-sequence
//! decode) it measures over every position of the arm's programs: the mean and the 99th
//! percentile of the KL divergence `KL(P_exact ‖ P_engine)`, top-1 agreement, and the RMS
//! of the logit difference. Each is held to a bound banked per model and door setting in
//! `engine/goldens/exact-bounds.toml` by a calibration run (`--calibrate`), so the gate
//! fails when the engine moves further from the exact model than it was, while a change
//! that keeps its accuracy passes. An arm with no banked bound fails closed and says how to
//! calibrate it.
//!
//! It owns the arms, the programs, the statistics, the bounds file and the verdict; the
//! exact model is `memra_engine::reference`'s. `docs/gates.md` ("exact-gate") is the user's guide.

use std::fmt::Write as _;
use std::io::Read as _;
use std::path::{Path, PathBuf};

use clap::Parser;
use serde::{Deserialize, Serialize};
use serde_json::json;
use sha2::{Digest, Sha256};

use crate::goldens::hex;
use crate::output::{GateError, GateExit, Reporter, say};
use crate::workload::prompts;
use memra_engine::backend::{Backend, EngineError, SeqId, open_backend};
use memra_engine::doors::{Doors, DoorsReport};
use memra_engine::gguf::GgufFile;
use memra_engine::model::LlamaModel;
use memra_engine::tokenizer::Tokenizer;
use memra_protocol::{Check, Status};

/// Flags of `exact-gate`. Exit status: 0 pass, 1 a bound failed or is missing, 2 bad
/// flags, pins, model or unwritable file.
#[derive(Debug, Parser)]
#[command(
    name = "exact-gate",
    about = "The engine vs the exact float64 model of its quantized weights: mean and p99 KL \
             divergence, top-1 agreement and RMS logit difference per arm and path, held to \
             bounds banked by a calibration run. Exit 0 pass, 1 fail, 2 usage or setup error."
)]
pub struct Args {
    /// Where to write the receipt TSV (one row per position, a summary per arm and path).
    pub receipt: PathBuf,
    /// A GGUF checkpoint to hold as well (repeatable). One with a tokenizer runs the four
    /// prompts of docs/numerics.md; one without runs synthetic token programs.
    #[arg(long)]
    pub model: Vec<PathBuf>,
    /// Leave out the synthesized arms (only the --model checkpoints run).
    #[arg(long)]
    pub no_synth: bool,
    /// The banked bounds (relative to the working directory).
    #[arg(long, default_value = "engine/goldens/exact-bounds.toml")]
    pub bounds: PathBuf,
    /// Measure every arm and bank its bounds (replacing the entries of the same model, doors
    /// and path, keeping every other) instead of checking them.
    #[arg(long)]
    pub calibrate: bool,
}

/// The synthesized arms: (arm, preset, weight type). Seed [`SYNTH_SEED`], so the files, and
/// with them the banked bounds' model digests, are the same on every machine.
const SYNTH_ARMS: [(&str, &str, &str); 4] = [
    ("q4_1", "tiny", "q4_1"),
    ("q4_0", "tiny", "q4_0"),
    ("q8_0", "tiny", "q8_0"),
    ("f16", "tiny", "f16"),
];
const SYNTH_SEED: u64 = 11;

/// The prompts of a checkpoint with a tokenizer: the four of the float64 comparison in
/// docs/numerics.md (54 positions on SmolLM2-135M).
pub const PROMPTS: [&str; 4] = [
    "The capital of France is",
    "def fibonacci(n):\n    if n <= 1:\n        return n",
    "Once upon a time, in a small village,",
    "1 + 1 = 2, 2 + 2 = 4, 3 + 3 =",
];

/// Length of the long program every arm also runs: past 128 positions, so attention reads
/// across several 64-position chunks of the cache.
pub const LONG_LEN: usize = 140;

/// Seed of the synthetic token programs: fixed, not `MEMRA_GATE_SEED`, because the bounds
/// are banked for exactly these programs.
const PROGRAM_SEED: u64 = 0x00e8_ac70;

/// The two engine paths each arm runs its programs through.
const PATHS: [&str; 2] = ["prefill", "decode"];

/// The suffix of the paths that hold the q8_0 KV cache (`MEMRA_KV_Q8=1`) to the f32 cache
/// under the same doors instead of to the exact model: `prefill:vs-f32-cache` and
/// `decode:vs-f32-cache`, banked like the others.
const VS_F32_CACHE: &str = ":vs-f32-cache";
const VS_F32_PREFILL: &str = "prefill:vs-f32-cache";
const VS_F32_DECODE: &str = "decode:vs-f32-cache";

/// How a calibration turns measured values into bounds: KL grows with the square of the
/// logit error, so its bounds get more headroom than the RMS. A floor keeps the bounds of
/// float arms (errors near f32 precision) from being stricter than the measurement's own
/// noise.
const KL_MEAN_MARGIN: f64 = 1.5;
const KL_P99_MARGIN: f64 = 2.0;
const RMS_MARGIN: f64 = 1.25;
const KL_FLOOR: f64 = 1e-9;
const RMS_FLOOR: f64 = 1e-5;
/// Top-1 agreement may fall by this share of the positions (at least one position).
const TOP1_SLACK: f64 = 0.02;

/// Format version of the bounds file.
pub const BOUNDS_FORMAT: u32 = 1;

/// Runs the gate on the process arguments and environment; returns the exit status.
pub fn main() -> i32 {
    crate::output::gate_main::<Args>("exact-gate", run_gate)
}

/// One checkpoint under test.
struct Arm {
    name: String,
    sha256: String,
    model: LlamaModel,
    /// "prompts" (tokenized text) or "synthetic".
    programs_kind: &'static str,
    programs: Vec<Vec<u32>>,
}

/// What one path of one arm measured over every position of its programs.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Measured {
    pub positions: usize,
    pub kl_mean: f64,
    pub kl_p99: f64,
    pub kl_max: f64,
    /// Share of positions whose argmax equals the exact model's.
    pub top1: f64,
    /// RMS of `engine − exact` over every logit of every position.
    pub rms: f64,
    /// Median and max of |Δlogit| at the exact model's five largest logits per position.
    pub top5_median: f64,
    pub top5_max: f64,
}

/// One banked entry: the bounds of one model, door setting and path, with what the
/// calibration measured.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Bound {
    pub arm: String,
    pub model_sha256: String,
    pub doors: String,
    pub path: String,
    pub kl_mean_max: f64,
    pub kl_p99_max: f64,
    pub rms_max: f64,
    pub top1_min: f64,
    pub calibrated_by: String,
    pub calibrated: Measured,
}

/// The bounds file.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BoundsFile {
    pub format: u32,
    #[serde(default)]
    pub bound: Vec<Bound>,
}

impl Bound {
    /// The bounds a calibration banks for `m`.
    pub fn from_measured(
        arm: &str,
        sha: &str,
        doors: &str,
        path: &str,
        m: Measured,
        by: &str,
    ) -> Bound {
        let slack = (TOP1_SLACK * m.positions as f64).ceil().max(1.0) / m.positions.max(1) as f64;
        Bound {
            arm: arm.to_string(),
            model_sha256: sha.to_string(),
            doors: doors.to_string(),
            path: path.to_string(),
            kl_mean_max: (m.kl_mean * KL_MEAN_MARGIN).max(KL_FLOOR),
            kl_p99_max: (m.kl_p99 * KL_P99_MARGIN).max(KL_FLOOR),
            rms_max: (m.rms * RMS_MARGIN).max(RMS_FLOOR),
            top1_min: (m.top1 - slack).max(0.0),
            calibrated_by: by.to_string(),
            calibrated: m,
        }
    }

    /// Every bound `m` breaks, as `name value > bound` phrases (empty = within bounds).
    pub fn broken(&self, m: &Measured) -> Vec<String> {
        let mut out = Vec::new();
        let mut over = |name: &str, v: f64, max: f64| {
            // NaN breaks the bound too.
            if v.is_nan() || v > max {
                out.push(format!("{name} {v:.3e} > {max:.3e}"));
            }
        };
        over("kl_mean", m.kl_mean, self.kl_mean_max);
        over("kl_p99", m.kl_p99, self.kl_p99_max);
        over("rms", m.rms, self.rms_max);
        if m.top1.is_nan() || m.top1 < self.top1_min {
            out.push(format!("top1 {:.4} < {:.4}", m.top1, self.top1_min));
        }
        out
    }
}

impl BoundsFile {
    /// Reads the file; a missing file is an empty one (every arm then fails as
    /// uncalibrated). Errors name the file and the fix.
    pub fn read(path: &Path) -> Result<BoundsFile, GateError> {
        let text = match std::fs::read_to_string(path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Ok(BoundsFile {
                    format: BOUNDS_FORMAT,
                    bound: Vec::new(),
                });
            }
            Err(e) => {
                return Err(GateError::new(format!(
                    "{}: cannot read the exact-model bounds: {e}; pass --bounds FILE",
                    path.display()
                )));
            }
        };
        let file: BoundsFile = toml::from_str(&text).map_err(|e| {
            GateError::new(format!(
                "{}: not an exact-model bounds file: {e}; re-bank it with exact-gate --calibrate",
                path.display()
            ))
        })?;
        if file.format != BOUNDS_FORMAT {
            return Err(GateError::new(format!(
                "{}: bounds format {} (this gate reads {BOUNDS_FORMAT}); re-bank it with \
                 exact-gate --calibrate",
                path.display(),
                file.format
            )));
        }
        Ok(file)
    }

    /// The entry for a model, door setting and path.
    pub fn find(&self, sha: &str, doors: &str, path: &str) -> Option<&Bound> {
        self.bound
            .iter()
            .find(|b| b.model_sha256 == sha && b.doors == doors && b.path == path)
    }

    /// Puts `b` in, replacing the entry of the same model, doors and path.
    pub fn bank(&mut self, b: Bound) {
        self.bound.retain(|o| {
            !(o.model_sha256 == b.model_sha256 && o.doors == b.doors && o.path == b.path)
        });
        self.bound.push(b);
        self.bound.sort_by(|a, b| {
            (&a.arm, &a.doors, &a.path, &a.model_sha256).cmp(&(
                &b.arm,
                &b.doors,
                &b.path,
                &b.model_sha256,
            ))
        });
    }

    /// Writes the file atomically, creating its folder.
    pub fn write(&self, path: &Path) -> Result<(), GateError> {
        let fail = |e: String| {
            GateError::new(format!(
                "{}: cannot write the exact-model bounds: {e}; pass --bounds with a writable path",
                path.display()
            ))
        };
        let body = toml::to_string(self).map_err(|e| fail(e.to_string()))?;
        let text = format!(
            "# memra exact-model bounds: written by `exact-gate --calibrate`, read by exact-gate.\n\
             # One entry per model (sha256 of the GGUF file), door setting and engine path; each\n\
             # bound is the calibrated value with headroom (kl_mean x{KL_MEAN_MARGIN}, kl_p99 \
             x{KL_P99_MARGIN}, rms x{RMS_MARGIN},\n\
             # top1 minus {TOP1_SLACK} of the positions). See docs/gates.md, \"exact-gate\".\n\n{body}"
        );
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|e| fail(e.to_string()))?;
        }
        let tmp = path.with_extension("toml.tmp");
        std::fs::write(&tmp, text).map_err(|e| fail(e.to_string()))?;
        std::fs::rename(&tmp, path).map_err(|e| fail(e.to_string()))
    }
}

/// The door setting a bound is banked under: the numeric doors the backend reports it ran.
/// Left out are what promises the same bits and has a gate holding it to that promise — the
/// pipeline split (`pp.split` and the pp compares) and the performance switches
/// (`switches-change-no-bit`) — and the seed and the canary. So a split run is held to the
/// unsplit model's bounds: against the exact model, not only against the unsplit path of the
/// same code.
///
/// The KV cache's values join the key only when they are not f32 (`kv=q8_0`), so the bounds
/// banked before the q8_0 cache existed keep their keys.
pub fn doors_key(r: &DoorsReport) -> String {
    let kv = if r.kv == "f32" {
        String::new()
    } else {
        format!(",kv={}", r.kv)
    };
    format!(
        "backend={},matvec={},norm={},attention={},b1fast={}{kv}",
        r.backend, r.matvec, r.norm, r.attention, r.b1fast
    )
}

/// The statistics of `got` (f32 engine logits) against `exact`, both `[n, v]`, with each
/// position's KL divergence.
pub fn measure(exact: &[f64], got: &[f32], v: usize) -> (Measured, Vec<PositionStat>) {
    let mut per = Vec::new();
    let mut sq = 0.0f64;
    let mut top5 = Vec::new();
    for (r, g) in exact.chunks_exact(v).zip(got.chunks_exact(v)) {
        let g: Vec<f64> = g.iter().map(|&x| x as f64).collect();
        let lr = log_softmax(r);
        let lg = log_softmax(&g);
        let kl: f64 = lr
            .iter()
            .zip(&lg)
            .map(|(&a, &b)| {
                if a == f64::NEG_INFINITY {
                    0.0
                } else {
                    a.exp() * (a - b)
                }
            })
            .sum();
        let (ar, ag) = (argmax(r), argmax(&g));
        let mut max_abs = 0.0f64;
        for (&a, &b) in r.iter().zip(&g) {
            let d = b - a;
            sq += d * d;
            max_abs = max_abs.max(d.abs());
        }
        let mut order: Vec<usize> = (0..v).collect();
        order.sort_by(|&i, &j| r[j].total_cmp(&r[i]));
        top5.extend(order.iter().take(5).map(|&i| (g[i] - r[i]).abs()));
        per.push(PositionStat {
            kl: if kl.is_finite() {
                kl.max(0.0)
            } else {
                f64::INFINITY
            },
            top1_exact: ar,
            top1_engine: ag,
            max_abs,
        });
    }
    let n = per.len();
    let mut kls: Vec<f64> = per.iter().map(|p| p.kl).collect();
    kls.sort_by(f64::total_cmp);
    top5.sort_by(f64::total_cmp);
    let pick = |sorted: &[f64], q: f64| -> f64 {
        if sorted.is_empty() {
            return 0.0;
        }
        // Nearest rank: the smallest value with at least q of the positions at or below it.
        let k = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
        sorted[k - 1]
    };
    let m = Measured {
        positions: n,
        kl_mean: kls.iter().sum::<f64>() / n.max(1) as f64,
        kl_p99: pick(&kls, 0.99),
        kl_max: kls.last().copied().unwrap_or(0.0),
        top1: per.iter().filter(|p| p.top1_exact == p.top1_engine).count() as f64 / n.max(1) as f64,
        rms: (sq / (n * v).max(1) as f64).sqrt(),
        top5_median: median(&top5),
        top5_max: top5.last().copied().unwrap_or(0.0),
    };
    (m, per)
}

fn median(sorted: &[f64]) -> f64 {
    match sorted.len() {
        0 => 0.0,
        n if n % 2 == 1 => sorted[n / 2],
        n => (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0,
    }
}

/// One position of the receipt.
#[derive(Debug, Clone, Copy)]
pub struct PositionStat {
    pub kl: f64,
    pub top1_exact: usize,
    pub top1_engine: usize,
    pub max_abs: f64,
}

fn log_softmax(x: &[f64]) -> Vec<f64> {
    let max = x.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let lse = max + x.iter().map(|&v| (v - max).exp()).sum::<f64>().ln();
    x.iter().map(|&v| v - lse).collect()
}

fn argmax(x: &[f64]) -> usize {
    let mut best = 0;
    for (i, &v) in x.iter().enumerate() {
        if v > x[best] || (x[best].is_nan() && !v.is_nan()) {
            best = i;
        }
    }
    best
}

/// sha256 of a file, streamed.
fn file_sha256(path: &Path) -> Result<String, GateError> {
    let mut f = std::fs::File::open(path)
        .map_err(|e| GateError::new(format!("{}: cannot read: {e}", path.display())))?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f
            .read(&mut buf)
            .map_err(|e| GateError::new(format!("{}: cannot read: {e}", path.display())))?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Ok(hex(&h.finalize()))
}

/// Loads a checkpoint as an arm with its programs.
fn load_arm(name: &str, path: &Path) -> Result<Arm, GateError> {
    let bad = |e: String| {
        GateError::new(format!(
            "cannot load {}: {e}; pass a llama GGUF checkpoint",
            path.display()
        ))
    };
    let file = GgufFile::open(path).map_err(|e| bad(e.to_string()))?;
    let model = LlamaModel::from_gguf(&file).map_err(|e| bad(e.to_string()))?;
    let v = model.config.n_vocab;
    let (programs_kind, mut programs) = match Tokenizer::from_gguf(&file) {
        Ok(tok) => {
            let programs = PROMPTS
                .iter()
                .map(|p| tok.encode(p))
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| bad(format!("cannot tokenize the prompts: {e}")))?;
            ("prompts", programs)
        }
        Err(_) => ("synthetic", prompts(v, 4, 14, PROGRAM_SEED, 3000)),
    };
    // The long program: the short ones end to end, repeated up to LONG_LEN positions.
    let long: Vec<u32> = programs
        .iter()
        .flatten()
        .copied()
        .cycle()
        .take(LONG_LEN)
        .collect();
    programs.push(long);
    let need = programs.iter().map(Vec::len).max().unwrap_or(0);
    if need > model.config.n_ctx {
        return Err(bad(format!(
            "its context ({}) is shorter than the {need}-position program",
            model.config.n_ctx
        )));
    }
    Ok(Arm {
        name: name.to_string(),
        sha256: file_sha256(path)?,
        model,
        programs_kind,
        programs,
    })
}

/// The whole gate; errors before the verdict are setup errors (exit 2).
// Over 150 lines: the gate's arms and paths in the order of its checks, over models it
// synthesizes once; each check's reference stays beside it.
pub fn run_gate(args: &Args) -> Result<GateExit, GateError> {
    let doors = Doors::from_env().map_err(|e| GateError::new(format!("bad pins: {e}")))?;
    let mut banked = BoundsFile::read(&args.bounds)?;
    let dir = tempfile::tempdir().map_err(|e| {
        GateError::new(format!("cannot create a temporary folder: {e}; set TMPDIR"))
    })?;
    let mut arms = Vec::new();
    if !args.no_synth {
        for (arm, preset, quant) in SYNTH_ARMS {
            let path = dir.path().join(format!("{arm}.gguf"));
            memra_engine::synth::write_preset(preset, quant, SYNTH_SEED, &path)
                .map_err(|e| GateError::new(format!("cannot synthesize the {arm} arm: {e}")))?;
            arms.push(load_arm(arm, &path)?);
        }
    }
    for p in &args.model {
        let stem = p
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| "model".into());
        arms.push(load_arm(&stem, p)?);
    }
    if arms.is_empty() {
        return Err(GateError::new(
            "no arms: --no-synth needs at least one --model checkpoint",
        ));
    }

    let by = format!(
        "exact-gate {} binary_sha256={}",
        env!("CARGO_PKG_VERSION"),
        binary_sha256()
    );
    let mut rep = Reporter::from_env("exact-gate");
    let mut receipt = String::new();
    for (i, arm) in arms.into_iter().enumerate() {
        let exact = arm
            .programs
            .iter()
            .map(|p| memra_engine::reference::forward_exact(&arm.model, p))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| {
                GateError::new(format!("the exact model refused the {} arm: {e}", arm.name))
            })?;
        let v = arm.model.config.n_vocab;
        // Under the q8_0 KV cache its distance from the f32 cache is held too: the same
        // doors with the f32 cache are the reference of the `:vs-f32-cache` paths.
        let mut f32_cache = if doors.kv_q8 {
            let d = Doors {
                kv_q8: false,
                ..doors.clone()
            };
            Some(open_backend(arm.model.clone(), &d).map_err(|e| GateError::new(e.to_string()))?)
        } else {
            None
        };
        let mut be = open_backend(arm.model, &doors).map_err(|e| GateError::new(e.to_string()))?;
        let report = be.doors_report();
        let key = doors_key(&report);
        if i == 0 {
            rep.header(
                &report,
                &doors,
                &[
                    (
                        "mode",
                        json!(if args.calibrate { "calibrate" } else { "check" }),
                    ),
                    ("bounds", json!(args.bounds.display().to_string())),
                ],
            )?;
            let _ = writeln!(
                receipt,
                "# exact-gate\tbinary_sha256={}\tdoors={}\tbounds={}\tmode={}\n\
                 arm\tpath\tprogram\tpos\tkl\ttop1_exact\ttop1_engine\tmax_abs",
                binary_sha256(),
                report.to_json(),
                args.bounds.display(),
                if args.calibrate { "calibrate" } else { "check" },
            );
        }
        let _ = writeln!(
            receipt,
            "# arm\tarm={}\tmodel_sha256={}\tvocab={v}\tprograms={}\tlengths={}",
            arm.name,
            arm.sha256,
            arm.programs_kind,
            arm.programs
                .iter()
                .map(|p| p.len().to_string())
                .collect::<Vec<_>>()
                .join(",")
        );
        for path in PATHS.iter().copied().chain(
            f32_cache
                .is_some()
                .then_some(PATHS.map(|p| {
                    if p == "prefill" {
                        VS_F32_PREFILL
                    } else {
                        VS_F32_DECODE
                    }
                }))
                .into_iter()
                .flatten(),
        ) {
            let vs_f32 = path.ends_with(VS_F32_CACHE);
            let engine_path = path.trim_end_matches(VS_F32_CACHE);
            let got = match engine_rows(&mut *be, &arm.programs, engine_path) {
                Ok(g) => g,
                Err(e) => {
                    let _ = writeln!(receipt, "# error\tarm={}\tpath={path}\t{e}", arm.name);
                    rep.check(&Check::new(
                        format!("exact.{}.{path}", arm.name),
                        Status::Fail,
                        format!("the engine refused: {e}"),
                    ))?;
                    continue;
                }
            };
            let cache_ref;
            let reference = match (&mut f32_cache, vs_f32) {
                (Some(r), true) => {
                    cache_ref = engine_rows(&mut **r, &arm.programs, engine_path)
                        .map_err(|e| {
                            GateError::new(format!(
                                "the f32-cache reference refused the {} arm: {e}",
                                arm.name
                            ))
                        })?
                        .into_iter()
                        .map(|rows| rows.into_iter().map(f64::from).collect::<Vec<f64>>())
                        .collect::<Vec<_>>();
                    &cache_ref
                }
                _ => &exact,
            };
            let mut all_exact = Vec::new();
            let mut all_got = Vec::new();
            for (p, (e, g)) in reference.iter().zip(&got).enumerate() {
                let (_, per) = measure(e, g, v);
                for (pos, s) in per.iter().enumerate() {
                    let _ = writeln!(
                        receipt,
                        "{}\t{path}\t{p}\t{pos}\t{:.3e}\t{}\t{}\t{:.3e}",
                        arm.name, s.kl, s.top1_exact, s.top1_engine, s.max_abs
                    );
                }
                all_exact.extend_from_slice(e);
                all_got.extend_from_slice(g);
            }
            let (m, _) = measure(&all_exact, &all_got, v);
            // The short programs alone (all but the long one): the positions of the float64
            // comparison table in docs/numerics.md.
            let short_len: usize = arm.programs[..arm.programs.len() - 1]
                .iter()
                .map(Vec::len)
                .sum();
            let (s, _) = measure(&all_exact[..short_len * v], &all_got[..short_len * v], v);
            let _ = writeln!(
                receipt,
                "# short\tarm={}\tpath={path}\tpositions={}\ttop1_agree={}\ttop5_median={:.4}\ttop5_max={:.4}\tkl_mean={:.4e}",
                arm.name,
                s.positions,
                (s.top1 * s.positions as f64).round() as usize,
                s.top5_median,
                s.top5_max,
                s.kl_mean
            );
            let check = if args.calibrate {
                let b = Bound::from_measured(&arm.name, &arm.sha256, &key, path, m, &by);
                let msg = format!(
                    "calibrated: banked kl_mean <= {:.3e}, kl_p99 <= {:.3e}, rms <= {:.3e}, top1 >= {:.4}",
                    b.kl_mean_max, b.kl_p99_max, b.rms_max, b.top1_min
                );
                banked.bank(b);
                Check::new(format!("exact.{}.{path}", arm.name), Status::Pass, msg)
            } else {
                judge(
                    &banked,
                    &arm.name,
                    &arm.sha256,
                    &key,
                    path,
                    &m,
                    &args.bounds,
                )
            };
            let _ = writeln!(
                receipt,
                "# summary\tarm={}\tpath={path}\tpositions={}\tkl_mean={:.4e}\tkl_p99={:.4e}\tkl_max={:.4e}\ttop1={:.4}\trms={:.4e}\ttop5_median={:.4}\ttop5_max={:.4}\tstatus={}",
                arm.name,
                m.positions,
                m.kl_mean,
                m.kl_p99,
                m.kl_max,
                m.top1,
                m.rms,
                m.top5_median,
                m.top5_max,
                check.status.as_str()
            );
            rep.check(
                &check
                    .metric("positions", m.positions)
                    .metric("kl_mean", m.kl_mean)
                    .metric("kl_p99", m.kl_p99)
                    .metric("kl_max", m.kl_max)
                    .metric("top1", m.top1)
                    .metric("rms", m.rms)
                    .metric("top5_median", m.top5_median),
            )?;
        }
    }
    if args.calibrate {
        banked.write(&args.bounds)?;
        say!("banked: {}", args.bounds.display());
    }
    let _ = writeln!(receipt, "# verdict\tfailures={}", rep.failures());
    std::fs::write(&args.receipt, &receipt).map_err(|e| {
        GateError::new(format!(
            "{}: cannot write the receipt: {e}; pass a writable RECEIPT.tsv path",
            args.receipt.display()
        ))
    })?;
    say!("receipt: {}", args.receipt.display());
    Ok(rep.finish())
}

/// The check of one arm and path against its banked bound.
fn judge(
    banked: &BoundsFile,
    arm: &str,
    sha: &str,
    key: &str,
    path: &str,
    m: &Measured,
    file: &Path,
) -> Check {
    let name = format!("exact.{arm}.{path}");
    let Some(b) = banked.find(sha, key, path) else {
        return Check::new(
            name,
            Status::Fail,
            format!(
                "no bound banked in {} for this model (sha256 {}), doors {key} and path {path}; \
                 measure once with `exact-gate --calibrate` under the same pins and commit the file",
                file.display(),
                &sha[..16.min(sha.len())]
            ),
        );
    };
    let broken = b.broken(m);
    let c = if broken.is_empty() {
        Check::new(
            name,
            Status::Pass,
            format!(
                "within the banked bounds (kl_mean <= {:.3e}, kl_p99 <= {:.3e}, rms <= {:.3e}, top1 >= {:.4})",
                b.kl_mean_max, b.kl_p99_max, b.rms_max, b.top1_min
            ),
        )
    } else {
        Check::new(
            name,
            Status::Fail,
            format!(
                "further from the exact model than banked: {} (calibrated kl_mean {:.3e}, top1 {:.4}, rms {:.3e})",
                broken.join(", "),
                b.calibrated.kl_mean,
                b.calibrated.top1,
                b.calibrated.rms
            ),
        )
    };
    c.metric("kl_mean_max", b.kl_mean_max)
        .metric("kl_p99_max", b.kl_p99_max)
        .metric("rms_max", b.rms_max)
        .metric("top1_min", b.top1_min)
}

/// The engine's logits for every program through `path`: one-shot prefill, or the first
/// half prefilled and the rest through the single-sequence decode path.
fn engine_rows(
    be: &mut dyn Backend,
    programs: &[Vec<u32>],
    path: &str,
) -> Result<Vec<Vec<f32>>, EngineError> {
    let seq = SeqId(0);
    let mut out = Vec::new();
    for p in programs {
        be.open_sequence(seq, p.len())?;
        let rows = (|| {
            if path == "prefill" {
                return be.prefill(seq, p);
            }
            let half = p.len().div_ceil(2);
            let mut rows = be.prefill(seq, &p[..half])?;
            for &t in &p[half..] {
                rows.extend(be.decode_step_h(seq, t)?);
            }
            Ok(rows)
        })();
        be.close_sequence(seq)?;
        out.push(rows?);
    }
    Ok(out)
}

/// sha256 of this gate's own binary (`unknown(…)` when it cannot be read).
fn binary_sha256() -> String {
    std::env::current_exe()
        .and_then(std::fs::read)
        .map(|b| hex(&Sha256::digest(&b)))
        .unwrap_or_else(|e| format!("unknown({e})"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kl_is_zero_for_equal_rows_and_grows_with_the_error() {
        let exact: Vec<f64> = (0..64).map(|i| (i as f64 * 0.37).sin() * 3.0).collect();
        let same: Vec<f32> = exact.iter().map(|&x| x as f32).collect();
        let (m, _) = measure(&exact, &same, 32);
        assert!(m.kl_mean < 1e-12 && m.top1 == 1.0 && m.rms < 1e-6, "{m:?}");
        let mut off = same.clone();
        off[3] += 0.5;
        let (m2, per) = measure(&exact, &off, 32);
        assert!(
            m2.kl_mean > 1e-4 && per[1].kl < 1e-12 && per[0].kl > 0.0,
            "{m2:?}"
        );
        assert!((m2.rms - (0.25f64 / 64.0).sqrt()).abs() < 1e-6);
    }

    #[test]
    fn a_calibrated_bound_holds_its_own_measurement_and_breaks_on_more_error() {
        let m = Measured {
            positions: 54,
            kl_mean: 0.01,
            kl_p99: 0.1,
            kl_max: 0.2,
            top1: 53.0 / 54.0,
            rms: 0.05,
            top5_median: 0.13,
            top5_max: 0.7,
        };
        let b = Bound::from_measured("a", "s", "d", "prefill", m, "t");
        assert!(b.broken(&m).is_empty());
        assert!((b.top1_min - 51.0 / 54.0).abs() < 1e-12, "{}", b.top1_min);
        let worse = Measured {
            kl_mean: 0.02,
            top1: 50.0 / 54.0,
            ..m
        };
        let broken = b.broken(&worse);
        assert_eq!(broken.len(), 2, "{broken:?}");
        assert!(broken[0].starts_with("kl_mean") && broken[1].starts_with("top1"));
        let nan = Measured { rms: f64::NAN, ..m };
        assert_eq!(b.broken(&nan).len(), 1, "a NaN must break its bound");
    }

    #[test]
    fn banking_replaces_only_the_same_key_and_the_file_round_trips() {
        let m = Measured {
            positions: 1,
            kl_mean: 1.0,
            kl_p99: 1.0,
            kl_max: 1.0,
            top1: 1.0,
            rms: 1.0,
            top5_median: 1.0,
            top5_max: 1.0,
        };
        let mut f = BoundsFile {
            format: BOUNDS_FORMAT,
            bound: Vec::new(),
        };
        f.bank(Bound::from_measured("a", "s1", "d", "prefill", m, "t"));
        f.bank(Bound::from_measured("a", "s1", "d", "decode", m, "t"));
        f.bank(Bound::from_measured(
            "a",
            "s1",
            "d",
            "prefill",
            Measured { rms: 2.0, ..m },
            "t",
        ));
        assert_eq!(f.bound.len(), 2);
        assert_eq!(f.find("s1", "d", "prefill").unwrap().calibrated.rms, 2.0);
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("g/b.toml");
        f.write(&p).unwrap();
        assert_eq!(BoundsFile::read(&p).unwrap(), f);
        std::fs::write(&p, "format = 9\n").unwrap();
        assert!(
            BoundsFile::read(&p)
                .unwrap_err()
                .to_string()
                .contains("format 9")
        );
        assert!(
            BoundsFile::read(&dir.path().join("none.toml"))
                .unwrap()
                .bound
                .is_empty()
        );
    }
}
