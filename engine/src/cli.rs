//! The `memra-engine` command line: argument parsing and validation, and the printing of
//! each subcommand's result. Everything it runs lives in the library (`engine`, `synth`,
//! `bench`, `gguf::describe`).
//!
//! Exit codes: 0 success; 1 the engine failed while running; 2 bad input (flags, model
//! path, model file, doors).

use std::io::Write;
use std::path::{Path, PathBuf};

use clap::{Parser, Subcommand};

use crate::backend::EngineError;
use crate::bench::{self, BenchPlan};
use crate::doors::Doors;
use crate::engine::{Engine, OpenError, Utf8Stream};
use crate::gguf::GgufFile;
use crate::model::LlamaModel;
use crate::sampling::SamplingParams;

/// Process exit codes.
pub mod exit {
    pub const OK: i32 = 0;
    /// The engine failed while running.
    pub const FAILED: i32 = 1;
    /// Bad flags, model path, model file or doors.
    pub const BAD_INPUT: i32 = 2;
}

#[derive(Debug, Parser)]
#[command(
    name = "memra-engine",
    version,
    about = "A small llama-architecture GGUF inference engine",
    after_help = "Exit codes: 0 success, 1 the engine failed while running, 2 bad input \
                  (flags, model path, model file, MEMRA_* doors).\n\
                  Doors (environment): MEMRA_BACKEND, MEMRA_MMVQ, MEMRA_NO_FUSE_NORMQ, \
                  MEMRA_FA3, MEMRA_SERVE_B1FAST, MEMRA_KV_Q8, MEMRA_PP_STAGES, MEMRA_PP_DEVICES, \
                  MEMRA_PP_SPLITS, MEMRA_GATE_SEED; test-only: MEMRA_GATE_CANARY, \
                  MEMRA_GATE_DEFECT.\n\
                  Performance switches (the same bits either way; named in every doors row): \
                  MEMRA_MMA, MEMRA_PDL, MEMRA_MMA_RESIDENT, MEMRA_SMALL_BATCH, MEMRA_CLAIM_SM, \
                  MEMRA_PROLOGUES, MEMRA_PROMPT_TILE."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Architecture, shapes, tensor types and bytes of a GGUF model.
    Info { model: PathBuf },
    /// Token ids of a text, as one JSON array line.
    Tokenize {
        model: PathBuf,
        #[arg(long)]
        text: String,
    },
    /// Streams a continuation of a prompt to stdout (status on stderr).
    Generate {
        model: PathBuf,
        #[arg(long)]
        prompt: String,
        #[arg(long, default_value_t = 64)]
        max_tokens: usize,
        /// 0 = greedy argmax.
        #[arg(long, default_value_t = 0.0)]
        temp: f32,
        /// Keep the K most probable tokens (ties at the K-th kept) before top-p; 0 = all.
        #[arg(long, default_value_t = 0, value_name = "K")]
        top_k: u32,
        #[arg(long, default_value_t = 1.0)]
        top_p: f32,
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// Speculative decoding with drafts of up to K tokens (prompt lookup, greedy
        /// verify; needs --temp 0).
        #[arg(long, value_name = "K")]
        spec: Option<usize>,
    },
    /// Writes a deterministic synthetic checkpoint.
    Synth {
        #[arg(long)]
        preset: String,
        #[arg(long)]
        quant: String,
        #[arg(long, default_value_t = 0)]
        seed: u64,
        #[arg(long)]
        out: PathBuf,
    },
    /// Writes the logits after every position of a prompt program as the F32 tensor
    /// `logits` [T, n_vocab] of a safetensors file; under the orchestrator it also appends
    /// the doors row of the paths it ran to `MEMRA_ORCH_CHECKS`.
    Dump {
        model: PathBuf,
        #[arg(long, conflicts_with = "tokens", required_unless_present = "tokens")]
        prompt: Option<String>,
        /// Comma-separated token ids.
        #[arg(long, value_delimiter = ',')]
        tokens: Option<Vec<u32>>,
        /// Prefill only the first N tokens and feed the rest through the single-sequence
        /// decode path one at a time (default: one prefill of the whole program).
        #[arg(long, value_name = "N")]
        decode_from: Option<usize>,
        #[arg(long)]
        out: PathBuf,
    },
    /// Throughput table of the backend the doors pick: decode tokens/s at B=1 and B=8,
    /// prefill tokens/s (and speculative decoding with --spec K).
    Bench {
        /// Model to run; without it, the real SmolLM2 checkpoint in models/ when present,
        /// else a synthesized checkpoint of the smollm2-135m shape.
        model: Option<PathBuf>,
        #[arg(long, default_value_t = 128)]
        prompt_len: usize,
        #[arg(long, default_value_t = 32)]
        steps: usize,
        #[arg(long, default_value_t = 3)]
        reps: usize,
        /// Decode batch sizes, comma-separated.
        #[arg(long, value_delimiter = ',', default_value = "1,8")]
        batch: Vec<usize>,
        /// Prime each decoding sequence with N tokens first, to time decode at a long
        /// context (default: a prompt of 8 tokens).
        #[arg(long, value_name = "N")]
        context: Option<usize>,
        /// GPU table instead: decode tokens/s at every --batch size under each door
        /// setting, weight GB/s and the device's copy bandwidth (needs a CUDA device).
        #[arg(long)]
        door_matrix: bool,
        /// With --door-matrix: only the door settings whose label contains this text, e.g.
        /// "mmvq=1 nofuse=0 fa3=1" (the labels are the table's first column).
        #[arg(long, requires = "door_matrix")]
        only: Option<String>,
        /// Also speculative decoding with drafts of up to K tokens against plain greedy at
        /// B=1, on a repetitive and a non-repetitive prompt (tokens/s, tokens per verify,
        /// accepted share of the drafts).
        #[arg(long, value_name = "K", conflicts_with = "door_matrix")]
        spec: Option<usize>,
    },
}

/// A failure with the exit code it maps to.
struct Failure {
    code: i32,
    message: String,
}

fn bad(message: impl ToString) -> Failure {
    Failure {
        code: exit::BAD_INPUT,
        message: message.to_string(),
    }
}

fn failed(message: impl ToString) -> Failure {
    Failure {
        code: exit::FAILED,
        message: message.to_string(),
    }
}

impl From<OpenError> for Failure {
    fn from(e: OpenError) -> Failure {
        match e {
            OpenError::Engine(e) => engine_failure(e),
            other => bad(other),
        }
    }
}

fn engine_failure(e: EngineError) -> Failure {
    match e {
        EngineError::Unavailable(_)
        | EngineError::BadToken { .. }
        | EngineError::BadSampling(_)
        | EngineError::Empty { .. }
        | EngineError::BadCapacity { .. }
        | EngineError::Model(_) => bad(e),
        other => failed(other),
    }
}

/// Entry point of the `memra-engine` binary; returns the process exit code.
pub fn main() -> i32 {
    run(std::env::args_os())
}

/// Runs the command line `args` (program name first).
pub fn run(args: impl IntoIterator<Item = std::ffi::OsString>) -> i32 {
    let cli = match Cli::try_parse_from(args) {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            return if e.use_stderr() {
                exit::BAD_INPUT
            } else {
                exit::OK
            };
        }
    };
    match dispatch(cli.command) {
        Ok(()) => exit::OK,
        Err(f) => {
            eprintln!("memra-engine: error: {}", f.message);
            f.code
        }
    }
}

fn doors() -> Result<Doors, Failure> {
    Doors::from_env().map_err(|e| bad(format!("bad door pins:\n{e}")))
}

fn check_model_path(path: &Path) -> Result<(), Failure> {
    if path.is_file() {
        Ok(())
    } else {
        Err(bad(format!(
            "{}: no such model file; pass the path of a .gguf file (scripts/fetch-model \
             brings SmolLM2, `memra-engine synth` writes synthetic ones)",
            path.display()
        )))
    }
}

// Over 150 lines: one match arm per subcommand, each turning its arguments into one library
// call.
fn dispatch(command: Command) -> Result<(), Failure> {
    match command {
        Command::Info { model } => {
            check_model_path(&model)?;
            let file = GgufFile::open(&model).map_err(bad)?;
            print!("{}", crate::gguf::describe(&file));
            Ok(())
        }
        Command::Tokenize { model, text } => {
            check_model_path(&model)?;
            let file = GgufFile::open(&model).map_err(bad)?;
            let tok = crate::tokenizer::Tokenizer::from_gguf(&file).map_err(bad)?;
            let ids = tok.encode(&text).map_err(bad)?;
            println!("{}", serde_json::to_string(&ids).map_err(failed)?);
            Ok(())
        }
        Command::Generate {
            model,
            prompt,
            max_tokens,
            temp,
            top_k,
            top_p,
            seed,
            spec,
        } => {
            let params = SamplingParams {
                temperature: temp,
                top_k,
                top_p,
                seed,
            };
            params.validate().map_err(bad)?;
            if spec == Some(0) {
                return Err(bad(
                    "--spec 0: give a draft length of at least 1, e.g. --spec 4",
                ));
            }
            if spec.is_some() && temp != 0.0 {
                return Err(bad(format!(
                    "--spec verifies drafts greedily, so it needs --temp 0 (got --temp {temp}); \
                     drop --spec to sample"
                )));
            }
            let doors = doors()?;
            check_model_path(&model)?;
            let mut engine = Engine::open(&model, doors)?;
            if let Some(why) = spec.and_then(|_| engine.spec_refusal()) {
                return Err(bad(format!("--spec: {why}")));
            }
            let ids = engine.encode(&prompt)?;
            if let Some(d) = engine.doors.gate_defect {
                eprintln!(
                    "memra-engine: MEMRA_GATE_DEFECT={}: a test-only planted defect is in force; \
                     this output is not the engine's",
                    d.as_str()
                );
            }
            eprintln!(
                "memra-engine: {} prompt tokens, doors {}",
                ids.len(),
                engine.backend.doors_report().to_json()
            );
            let start = std::time::Instant::now();
            let mut stream = Utf8Stream::default();
            let mut stdout = std::io::stdout().lock();
            let mut bad_token = None;
            let mut write_token =
                |tok: &crate::tokenizer::Tokenizer, t: u32| match tok.token_bytes(t) {
                    Ok(bytes) => {
                        let _ = write!(stdout, "{}", stream.push(&bytes));
                        let _ = stdout.flush();
                    }
                    Err(e) => bad_token = Some(e),
                };
            let mut spec_stats = None;
            let generated = match spec {
                None => engine.generate(&ids, max_tokens, &params, &mut write_token),
                Some(k) => engine
                    .generate_spec(&ids, max_tokens, k, &mut write_token)
                    .map(|(out, stats)| {
                        spec_stats = Some(stats);
                        out
                    }),
            }
            .map_err(engine_failure);
            let _ = writeln!(stdout, "{}", stream.finish());
            if let Some(e) = bad_token {
                return Err(failed(e));
            }
            let generated = generated?;
            let secs = start.elapsed().as_secs_f64();
            eprintln!(
                "memra-engine: {} tokens in {secs:.2} s ({:.1} tokens/s)",
                generated.len(),
                generated.len() as f64 / secs
            );
            if let Some(st) = spec_stats {
                eprintln!(
                    "memra-engine: speculative K={}: {} verifies, {:.2} tokens per verify, {} \
                     of {} drafted tokens accepted",
                    spec.unwrap_or(0),
                    st.verifies,
                    st.tokens_per_verify(),
                    st.accepted,
                    st.drafted
                );
            }
            Ok(())
        }
        Command::Synth {
            preset,
            quant,
            seed,
            out,
        } => {
            let summary = crate::synth::write_preset(&preset, &quant, seed, &out).map_err(bad)?;
            println!("{summary}");
            Ok(())
        }
        Command::Dump {
            model,
            prompt,
            tokens,
            decode_from,
            out,
        } => {
            let doors = doors()?;
            let defect = doors.gate_defect.map(|d| d.as_str()).unwrap_or("none");
            check_model_path(&model)?;
            let mut engine = Engine::open(&model, doors)?;
            let ids = match (prompt, tokens) {
                (Some(p), _) => engine.encode(&p)?,
                (None, Some(t)) => t,
                (None, None) => return Err(bad("pass --prompt TEXT or --tokens 1,2,3")),
            };
            let n_vocab = engine.backend.config().n_vocab;
            if decode_from.is_some_and(|n| n == 0 || n > ids.len()) {
                return Err(bad(format!(
                    "--decode-from {} is outside the program of {} tokens; pass 1..={}",
                    decode_from.unwrap_or(0),
                    ids.len(),
                    ids.len()
                )));
            }
            let logits = engine
                .logits_decoding_from(&ids, decode_from.unwrap_or(ids.len()))
                .map_err(engine_failure)?;
            write_logits(&out, &logits, ids.len(), n_vocab)?;
            // Under the orchestrator the dump names the paths it ran, as every gate does, so
            // a compare of two dumps shows which doors and switches each side ran (and pin
            // attestation can hold a candidate's pins to them). Run by hand, it writes nothing.
            // A planted defect is named, as every gate names it, so a dump under one can
            // never pass for a real run.
            let mut row = engine.backend.doors_report().doors_row();
            row.insert("defect", defect);
            memra_protocol::ChecksWriter::from_env()
                .doors(&row)
                .map_err(failed)?;
            eprintln!(
                "memra-engine: wrote logits [{}, {n_vocab}] to {}",
                ids.len(),
                out.display()
            );
            Ok(())
        }
        Command::Bench {
            model,
            prompt_len,
            steps,
            reps,
            batch,
            context,
            door_matrix,
            only,
            spec,
        } => {
            let doors = doors()?;
            let plan = BenchPlan {
                prompt_len,
                decode_steps: steps,
                batches: batch,
                reps,
                decode_context: context,
            };
            if plan.batches.contains(&0)
                || plan.prompt_len == 0
                || plan.decode_steps == 0
                || plan.decode_context == Some(0)
            {
                return Err(bad(
                    "--batch sizes, --prompt-len, --steps and --context must all be at least 1",
                ));
            }
            let (model, title, _tmp) = bench_model(model)?;
            if door_matrix {
                return cuda_door_matrix(model, &title, &doors, &plan, only.as_deref());
            }
            let mut backend = crate::backend::open_backend(model, &doors).map_err(bad)?;
            let report = backend.doors_report().to_json();
            if spec == Some(0) {
                return Err(bad(
                    "--spec 0: give a draft length of at least 1, e.g. --spec 4",
                ));
            }
            let mut rows = bench::run(backend.as_mut(), &doors, &plan).map_err(engine_failure)?;
            if let Some(k) = spec {
                rows.extend(bench::run_spec(backend.as_mut(), &plan, k).map_err(engine_failure)?);
            }
            let threads = rayon::current_num_threads();
            println!(
                "{}",
                bench::render(
                    &format!("memra-engine bench: {title}, {threads} threads, doors {report}"),
                    &rows
                )
            );
            Ok(())
        }
    }
}

/// `bench --door-matrix`: the model uploaded once, then the GPU table of
/// `backend::cuda::bench`.
fn cuda_door_matrix(
    model: LlamaModel,
    title: &str,
    doors: &Doors,
    plan: &BenchPlan,
    only: Option<&str>,
) -> Result<(), Failure> {
    use crate::backend::cuda;
    if let Some(o) = only
        && cuda::bench::door_settings_matching(doors, only).is_empty()
    {
        let labels: Vec<String> = cuda::bench::door_settings(doors)
            .into_iter()
            .map(|(label, _)| label)
            .collect();
        return Err(bad(format!(
            "--only {o:?} matches no door setting; the settings are: {}",
            labels.join(", ")
        )));
    }
    let gpus = cuda::open_devices(doors)
        .map_err(|why| bad(format!("bench --door-matrix needs a CUDA device: {why}")))?;
    let stages = crate::backend::stages::StagePlan::from_doors(doors, model.config.n_layer)
        .map_err(|why| bad(format!("bench --door-matrix: {why}")))?;
    let dm = std::sync::Arc::new(
        cuda::DevModel::upload_placed(gpus, &model, &stages).map_err(engine_failure)?,
    );
    drop(model);
    let table = cuda::bench::door_matrix(
        &dm,
        title,
        doors,
        &plan.batches,
        plan.decode_steps,
        plan.reps,
        only,
        plan.decode_context,
    )
    .map_err(engine_failure)?;
    println!("{table}");
    Ok(())
}

/// The bench model: the given file, else the real checkpoint in models/, else a synthesized
/// smollm2-135m-shaped checkpoint in a temporary folder (kept alive by the returned guard).
fn bench_model(
    model: Option<PathBuf>,
) -> Result<(LlamaModel, String, Option<tempfile::TempDir>), Failure> {
    // models/ of the working directory (where scripts/fetch-model puts it when run from the
    // repository root), then of the source tree this binary was built from.
    let name = "models/SmolLM2-135M-Instruct.Q4_1.gguf";
    let real = [
        PathBuf::from(name),
        Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(name),
    ]
    .into_iter()
    .find(|p| p.is_file());
    let path = match (model, real) {
        (Some(p), _) => {
            check_model_path(&p)?;
            p
        }
        (None, Some(real)) => real,
        (None, None) => {
            let dir = tempfile::tempdir().map_err(failed)?;
            let path = dir.path().join("smollm2-135m-q4_1.gguf");
            eprintln!(
                "memra-engine: no model given and none in models/; synthesizing smollm2-135m q4_1"
            );
            crate::synth::write_preset("smollm2-135m", "q4_1", 0, &path).map_err(failed)?;
            let m = LlamaModel::open(&path).map_err(bad)?;
            return Ok((m, "synthesized smollm2-135m q4_1".into(), Some(dir)));
        }
    };
    let m = LlamaModel::open(&path).map_err(bad)?;
    Ok((m, path.display().to_string(), None))
}

/// Writes `logits` ([rows, n_vocab]) as the F32 tensor `logits` of a safetensors file.
fn write_logits(out: &Path, logits: &[f32], rows: usize, n_vocab: usize) -> Result<(), Failure> {
    use safetensors::tensor::{Dtype, TensorView};
    let bytes: Vec<u8> = logits.iter().flat_map(|v| v.to_le_bytes()).collect();
    let view = TensorView::new(Dtype::F32, vec![rows, n_vocab], &bytes).map_err(failed)?;
    safetensors::serialize_to_file([("logits", view)], None, out).map_err(|e| {
        bad(format!(
            "{}: cannot write the safetensors file: {e}",
            out.display()
        ))
    })
}
