//! kernel-check: runs every CUDA kernel against its host twin at the real and ragged
//! geometries and reports through the gate protocol (DESIGN §5): one check row per kernel and
//! geometry plus a `{"doors": …}` row appended to `MEMRA_ORCH_CHECKS` when it is set, a
//! printed report either way, exit 0 when all pass and 1 when any fails. Without a GPU or the
//! CUDA libraries it prints the reason and exits 0 with `skip` rows.
//!
//! `MEMRA_GATE_CANARY=1` plants a defect (every quantized matvec drops the last block of row
//! 0), which kernel-check must report as failures. The environment is read once, here.

pub mod bench;
pub mod cases;
pub mod report;

use std::path::PathBuf;

use memra_protocol::{AppendError, ChecksWriter, DoorsRow, Status, vars};

use self::report::CheckRow;
use crate::cuda::Gpu;
use crate::tuning::{Tuning, TuningIssue};

/// What kernel-check takes from the environment, read once at start.
#[derive(Debug, Clone, Default)]
pub struct CheckEnv {
    /// `MEMRA_ORCH_CHECKS`: the JSON-lines file to append to.
    pub checks: Option<PathBuf>,
    /// `MEMRA_GATE_CANARY=1`.
    pub canary: bool,
    /// `MEMRA_GATE_SEED`: offsets the random inputs.
    pub seed: u64,
    /// The performance switches the device is opened with (the matvec cases run every form
    /// either way, switching the forms themselves).
    pub tuning: Tuning,
    /// Switches set to values they do not accept; kernel-check refuses to start with any.
    pub tuning_issues: Vec<TuningIssue>,
}

impl CheckEnv {
    pub fn from_env() -> Self {
        let var = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        let (tuning, tuning_issues) = Tuning::from_env();
        CheckEnv {
            tuning,
            tuning_issues,
            checks: var(vars::CHECKS).map(PathBuf::from),
            canary: var("MEMRA_GATE_CANARY").is_some_and(|v| v != "0"),
            seed: var("MEMRA_GATE_SEED")
                .and_then(|v| v.parse().ok())
                .unwrap_or(0),
        }
    }
}

/// Appends rows to the checks file (when there is one); an unwritable file is reported on
/// stderr and makes the run fail, since the orchestrator would otherwise see no rows.
struct Sink {
    writer: ChecksWriter,
    broken: bool,
}

impl Sink {
    fn row(&mut self, row: &CheckRow) {
        let res = self.writer.check(&row.to_check());
        self.note(res);
    }

    fn doors(&mut self, doors: &DoorsRow) {
        let res = self.writer.doors(doors);
        self.note(res);
    }

    fn note(&mut self, res: Result<(), AppendError>) {
        if let Err(e) = res {
            if !self.broken {
                eprintln!(
                    "kernel-check: cannot append to MEMRA_ORCH_CHECKS={}: {}",
                    e.path.display(),
                    e.source
                );
            }
            self.broken = true;
        }
    }
}

/// Runs kernel-check with `env`; returns the process exit code.
pub fn run(env: &CheckEnv) -> i32 {
    let mut sink = Sink {
        writer: ChecksWriter::new(env.checks.clone()),
        broken: false,
    };
    println!(
        "kernel-check: every CUDA kernel against its host twin (seed {}, canary {})",
        env.seed, env.canary
    );
    let mut gpu = match Gpu::open(0, &env.tuning) {
        Ok(g) => g,
        Err(e) => {
            let reason = format!("no usable GPU: {e}");
            println!("kernel-check: SKIP: {reason}");
            sink.row(&CheckRow::skip("kernel-check", reason));
            sink.doors(&with_tuning(
                DoorsRow::new()
                    .with("backend", "none")
                    .with("canary", env.canary),
                &env.tuning,
            ));
            return if sink.broken { 1 } else { 0 };
        }
    };
    if env.canary {
        gpu.set_matvec_canary(Some(0));
    }
    let (maj, min) = gpu.nvrtc_version();
    println!(
        "device: {} ({}), NVRTC {maj}.{min}, kernel cache: {}",
        gpu.name(),
        gpu.arch(),
        gpu.cache().map_or(
            "none (no HOME / XDG_CACHE_HOME / MEMRA_KERNEL_CACHE)".into(),
            |c| c.dir().display().to_string()
        )
    );
    let t0 = std::time::Instant::now();
    let mut rows: Vec<CheckRow> = Vec::new();
    match gpu.load_all() {
        Ok(()) => {
            let compiled = gpu.compiled();
            let cached = compiled.iter().filter(|c| c.from_cache).count();
            println!(
                "modules: {} loaded ({cached} from the cache) in {:.2} s",
                compiled.len(),
                t0.elapsed().as_secs_f64()
            );
            for c in compiled.iter().filter_map(|c| c.cache_warning.as_ref()) {
                println!("warning: {c}");
            }
            let mut rng = cases::Rng::new(env.seed);
            type Case =
                fn(&Gpu, &mut cases::Rng) -> Result<Vec<CheckRow>, crate::error::KernelError>;
            let all: [(&str, Case); 13] = [
                ("norm-quantize", cases::norm_and_quantize),
                ("matvec", cases::matvec),
                ("matvec-float", cases::matvec_float),
                ("norm-step", cases::norm_step),
                ("row-prologues", cases::row_prologues),
                ("head-post-scale", cases::head_post_scale),
                ("rope", cases::rope),
                ("kv-round-q8_0", cases::kv_round_q8_0),
                ("attention", cases::attention),
                ("attention-rope-rows", cases::attention_rope_rows),
                ("attention-prompt-rows", cases::attention_prompt_rows),
                ("elementwise", cases::elementwise),
                ("sampling", cases::sampling),
            ];
            for (name, case) in all {
                match case(&gpu, &mut rng) {
                    Ok(r) => rows.extend(r),
                    Err(e) => rows.push(CheckRow::error(
                        format!("kernel-check/{name}"),
                        e.to_string(),
                    )),
                }
            }
        }
        Err(e) => rows.push(CheckRow::error("kernel-check/compile", e.to_string())),
    }
    for r in &rows {
        println!("{}", r.line());
        sink.row(r);
    }
    let failed = rows.iter().filter(|r| r.status == Status::Fail).count();
    sink.doors(&with_tuning(
        DoorsRow::new()
            .with("backend", "cuda")
            .with("device", gpu.name())
            .with("arch", gpu.arch())
            .with("nvrtc", format!("{maj}.{min}"))
            .with("matvec", "mmvq+dp4a")
            .with("attention", "naive+split-k")
            .with("fmad", false)
            .with("canary", env.canary),
        &gpu.tuning(),
    ));
    println!(
        "kernel-check: {} checks, {} failed, {:.1} s{}",
        rows.len(),
        failed,
        t0.elapsed().as_secs_f64(),
        if failed == 0 {
            " — ALL GREEN"
        } else {
            " — FAIL"
        }
    );
    if failed > 0 || sink.broken { 1 } else { 0 }
}

const USAGE: &str = "usage: kernel-check [bench | compile [--arch ARCH]]\n\
  (no argument)  every kernel against its host twin, gate protocol; exit 0 pass, 1 fail\n\
  bench          device time per kernel call at the model geometries, as a table\n\
  compile        every kernel family through NVRTC (no GPU needed; ARCH default compute_90),\n\
                 no FMA contraction where the twins mirror the composition, the planted\n\
                 defects' defines, and a planted compile error that must be rejected;\n\
                 exit 0 pass, 1 fail, 2 no NVRTC";

/// The planted defects' defines with a small family each plants something in: SiLU's
/// `exp_model` (elementwise.cu), `quantize_lane` (quantize.cu) and the tiled prompt
/// attention's copy (attention.cu).
const PLANTED: [(&str, &str); 3] = [
    ("elementwise.cu", crate::cuda::EXP_DEFECT),
    ("quantize.cu", crate::cuda::Q8_BLOCK_SUM_DEFECT),
    ("attention.cu", crate::cuda::PROMPT_TILE_DEFECT),
];

/// `kernel-check compile`: every family compiled by NVRTC for `arch`, without the disk
/// cache. A family whose text uses no `expf` must contain no FMA (the twins cannot mirror a
/// contraction); each family of [`PLANTED`] compiled again under its planted defect's define
/// must compile and give other PTX (a misspelt define would leave the defect unplanted, and
/// code under an `#ifdef` is otherwise compiled only on a GPU under that defect); the
/// canary, a source with an undefined name on its line 3, must be rejected with that file
/// and line. Needs libnvrtc only (`scripts/fetch-nvrtc` on machines without CUDA).
fn compile_all(arch: &'static str) -> i32 {
    use crate::compile::{compile, compile_with, nvrtc_version};
    use crate::error::KernelError;
    use crate::sources::{ALL, KernelSource};
    let version = match nvrtc_version() {
        Ok(v) => v,
        Err(e) => {
            eprintln!(
                "kernel-check compile: {e}; on a machine without CUDA, \
                 `LD_LIBRARY_PATH=$(scripts/fetch-nvrtc) kernel-check compile` brings NVRTC 13.0"
            );
            return 2;
        }
    };
    println!(
        "kernel-check compile: {} families for {arch} with NVRTC {}.{}",
        ALL.len(),
        version.0,
        version.1
    );
    let mut failed = 0;
    for src in ALL {
        match compile(&src, arch, None) {
            Ok(c) => {
                let kernels = c.ptx.matches(".entry").count();
                let fma = !src.text.contains("expf(") && c.ptx.contains("fma.rn.f32");
                if fma {
                    failed += 1;
                    println!(
                        "FAIL compile/{}: the PTX holds fma.rn.f32 although the family uses no \
                         expf; --fmad=false must keep every multiply and add separate",
                        src.file
                    );
                } else {
                    println!(
                        "PASS compile/{} kernels={kernels} ptx_bytes={}",
                        src.file,
                        c.ptx.len()
                    );
                }
            }
            Err(e) => {
                failed += 1;
                println!("FAIL compile/{}: {e}", src.file);
            }
        }
    }
    for (file, define) in PLANTED {
        let Some(src) = ALL.iter().find(|s| s.file == file) else {
            failed += 1;
            println!("FAIL compile/{file}+{define}: no family {file}");
            continue;
        };
        match (
            compile(src, arch, None),
            compile_with(src, arch, None, &[define]),
        ) {
            (Ok(clean), Ok(planted)) if clean.ptx != planted.ptx => {
                println!("PASS compile/{file}+{define} planted PTX differs");
            }
            (Ok(_), Ok(_)) => {
                failed += 1;
                println!(
                    "FAIL compile/{file}+{define}: the PTX is the same with the define, so the \
                     defect it plants is not compiled in (is the #ifdef spelt {define}?)"
                );
            }
            (Err(e), _) | (_, Err(e)) => {
                failed += 1;
                println!("FAIL compile/{file}+{define}: {e}");
            }
        }
    }
    let canary = KernelSource {
        file: "canary.cu",
        text: "// the compile check's planted defect\n\
               extern \"C\" __global__ void canary_f32(float* x) {\n    \
               x[0] = undefined_name;\n}\n",
    };
    match compile(&canary, arch, None) {
        Err(KernelError::Compile { file, line, .. }) if file == "canary.cu" && line == 3 => {
            println!("PASS compile/canary rejected as expected at canary.cu:3");
        }
        other => {
            failed += 1;
            println!(
                "FAIL compile/canary: expected a compile error at canary.cu:3, got {}",
                match other {
                    Ok(_) => "a successful compile".to_string(),
                    Err(e) => e.to_string(),
                }
            );
        }
    }
    if failed == 0 {
        println!("kernel-check compile: ALL GREEN");
        0
    } else {
        println!("kernel-check compile: {failed} failed");
        1
    }
}

/// The doors row with the performance switches appended.
fn with_tuning(mut doors: DoorsRow, tuning: &Tuning) -> DoorsRow {
    for (k, v) in tuning.fields() {
        doors.insert(k, v);
    }
    doors
}

/// Entry point of the `kernel-check` binary.
pub fn main() -> i32 {
    let env = CheckEnv::from_env();
    if !env.tuning_issues.is_empty() {
        for i in &env.tuning_issues {
            eprintln!(
                "kernel-check: {}={:?}: {}; set it to one of those or unset it",
                i.variable, i.value, i.problem
            );
        }
        return 2;
    }
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args
        .iter()
        .map(String::as_str)
        .collect::<Vec<_>>()
        .as_slice()
    {
        [] => run(&env),
        ["bench"] => match Gpu::open(0, &env.tuning).and_then(|gpu| bench::run(&gpu)) {
            Ok(()) => 0,
            Err(e) => {
                eprintln!("kernel-check bench: {e}");
                1
            }
        },
        ["compile"] => compile_all("compute_90"),
        ["compile", "--arch", arch] => {
            if !arch.starts_with("compute_") {
                eprintln!(
                    "kernel-check compile: --arch {arch} is not an NVRTC virtual architecture; \
                     give one like compute_90"
                );
                return 2;
            }
            // NVRTC takes the architecture as a 'static str; one small string per run.
            compile_all(Box::leak(arch.to_string().into_boxed_str()))
        }
        ["-h" | "--help"] => {
            println!("{USAGE}");
            0
        }
        other => {
            eprintln!("kernel-check: unexpected arguments {other:?}\n{USAGE}");
            2
        }
    }
}
