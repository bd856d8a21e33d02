//! The `memra-engine` binary end to end: every subcommand on a synthesized checkpoint, the
//! acceptance run on the real model when it is present, and exit code 2 for bad input.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn bin() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_memra-engine"));
    for var in memra_engine::doors::DOOR_VARIABLES {
        c.env_remove(var);
    }
    c
}

fn run(args: &[&str]) -> Output {
    bin().args(args).output().unwrap()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn synth_tiny(dir: &Path) -> PathBuf {
    let path = dir.join("tiny.gguf");
    let o = run(&[
        "synth",
        "--preset",
        "tiny",
        "--quant",
        "q4_1",
        "--seed",
        "3",
        "--out",
        path.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).contains("wrote"), "{}", stdout(&o));
    path
}

#[test]
fn subcommands_run_on_a_synthesized_model() {
    let dir = tempfile::tempdir().unwrap();
    let model = synth_tiny(dir.path());
    let m = model.to_str().unwrap();

    let o = run(&["info", m]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).contains("architecture: llama"), "{}", stdout(&o));

    let o = run(&["tokenize", m, "--text", "hello world"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let ids: Vec<u32> = serde_json::from_str(stdout(&o).trim()).unwrap();
    assert!(!ids.is_empty());

    let generate = |extra: &[&str]| {
        let mut args = vec!["generate", m, "--prompt", "hello", "--max-tokens", "8"];
        args.extend_from_slice(extra);
        let o = run(&args);
        assert!(o.status.success(), "{}", stderr(&o));
        assert!(stderr(&o).contains("\"backend\":\"cpu\""), "{}", stderr(&o));
        stdout(&o)
    };
    assert_eq!(generate(&["--temp", "0"]), generate(&["--temp", "0"]));
    let sampled = generate(&["--temp", "1", "--seed", "5"]);
    assert_eq!(sampled, generate(&["--temp", "1", "--seed", "5"]));

    // Dump: the F32 tensor `logits` [T, n_vocab] equals the engine's prefill rows.
    let out = dir.path().join("logits.safetensors");
    let o = run(&[
        "dump",
        m,
        "--tokens",
        "5,6,7",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let bytes = std::fs::read(&out).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let t = st.tensor("logits").unwrap();
    assert_eq!(t.dtype(), safetensors::Dtype::F32);
    assert_eq!(t.shape(), &[3, 512]);
    let dumped: Vec<f32> = t
        .data()
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect();
    let mut engine =
        memra_engine::engine::Engine::open(&model, memra_engine::doors::Doors::default()).unwrap();
    assert_eq!(dumped, engine.logits(&[5, 6, 7]).unwrap());
    // --decode-from N: the rows past N come from the single-sequence decode path.
    let o = run(&[
        "dump",
        m,
        "--tokens",
        "5,6,7,8",
        "--decode-from",
        "2",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let bytes = std::fs::read(&out).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let decoded: Vec<f32> = st
        .tensor("logits")
        .unwrap()
        .data()
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect();
    let seq = memra_engine::backend::SeqId(0);
    let be = &mut engine.backend;
    be.open_sequence(seq, 4).unwrap();
    let mut want = be.prefill(seq, &[5, 6]).unwrap();
    want.extend(be.decode_step_h(seq, 7).unwrap());
    want.extend(be.decode_step_h(seq, 8).unwrap());
    be.close_sequence(seq).unwrap();
    assert_eq!(decoded, want);
    for bad in ["0", "5"] {
        let o = run(&[
            "dump",
            m,
            "--tokens",
            "5,6,7,8",
            "--decode-from",
            bad,
            "--out",
            out.to_str().unwrap(),
        ]);
        assert_eq!(o.status.code(), Some(2));
        assert!(
            stderr(&o).contains("outside the program of 4 tokens"),
            "{}",
            stderr(&o)
        );
    }
    // Run by hand, the dump writes no checks file; under the orchestrator it appends the
    // doors row of the paths it ran, performance switches included.
    assert!(!dir.path().join("checks.jsonl").exists());
    let checks = dir.path().join("checks.jsonl");
    let o = bin()
        .args([
            "dump",
            m,
            "--tokens",
            "5,6,7",
            "--out",
            out.to_str().unwrap(),
        ])
        .env("MEMRA_ORCH_CHECKS", &checks)
        .env("MEMRA_PDL", "0")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let text = std::fs::read_to_string(&checks).unwrap();
    let rows: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(rows.len(), 1, "{text}");
    assert_eq!(rows[0]["doors"]["backend"], "cpu", "{text}");
    assert_eq!(rows[0]["doors"]["pdl"], false, "{text}");
    assert_eq!(rows[0]["doors"]["prologues"], true, "{text}");

    // A tiny bench: an 8-token prefill, two decode steps, one repetition.
    let tiny = |extra: &[&str]| {
        let mut args = vec![
            "bench",
            m,
            "--prompt-len",
            "8",
            "--steps",
            "2",
            "--reps",
            "1",
        ];
        args.extend_from_slice(extra);
        run(&args)
    };
    let o = tiny(&["--batch", "1,2"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let table = stdout(&o);
    for line in [
        "prefill (prime, 8 tokens)",
        "decode B=1",
        "decode B=2",
        "tokens/s",
    ] {
        assert!(table.contains(line), "{table}");
    }
    // Decode timed after a longer prompt says the context it ran at; a context of 0 is
    // refused.
    let o = tiny(&["--batch", "1", "--context", "24"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stdout(&o).contains("2 steps at context 24)"),
        "{}",
        stdout(&o)
    );
    let o = run(&["bench", m, "--context", "0"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("--context"), "{}", stderr(&o));
}

#[test]
fn bad_input_exits_2_with_a_clear_message() {
    let o = run(&["generate", "/nonexistent/model.gguf", "--prompt", "x"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("/nonexistent/model.gguf: no such model file"),
        "{}",
        stderr(&o)
    );

    let o = run(&["generate", "--prompt"]);
    assert_eq!(o.status.code(), Some(2));

    let dir = tempfile::tempdir().unwrap();
    let model = synth_tiny(dir.path());
    let m = model.to_str().unwrap();
    let o = bin()
        .args(["generate", m, "--prompt", "x"])
        .env("MEMRA_MMVQ", "2")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("MEMRA_MMVQ=\"2\": accepted values are 0, 1"),
        "{}",
        stderr(&o)
    );

    let o = bin()
        .args(["generate", m, "--prompt", "x"])
        .env("MEMRA_BACKEND", "cuda")
        .output()
        .unwrap();
    // Without a GPU (CI) the CUDA backend cannot start: exit 2, naming the pin and the way
    // out. On a GPU machine it runs.
    if o.status.code() != Some(0) {
        assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
        assert!(stderr(&o).contains("MEMRA_BACKEND=cuda"), "{}", stderr(&o));
        assert!(stderr(&o).contains("MEMRA_BACKEND=cpu"), "{}", stderr(&o));
    }

    let o = run(&["generate", m, "--prompt", "x", "--top-p", "0"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("top-p 0 must lie in (0, 1]"),
        "{}",
        stderr(&o)
    );

    let o = run(&[
        "dump",
        m,
        "--tokens",
        "99999",
        "--out",
        "/tmp/never.safetensors",
    ]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("token 99999 is outside the vocabulary"),
        "{}",
        stderr(&o)
    );

    // A --only text that names no door setting is refused before any device is opened,
    // with the settings listed.
    let o = run(&["bench", m, "--door-matrix", "--only", "mmvq=7"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("--only \"mmvq=7\" matches no door setting")
            && stderr(&o).contains("mmvq=1 nofuse=0 fa3=1"),
        "{}",
        stderr(&o)
    );
    let o = run(&["bench", m, "--only", "mmvq=1"]);
    assert_eq!(o.status.code(), Some(2), "--only without --door-matrix");

    let not_gguf = dir.path().join("not.gguf");
    std::fs::write(&not_gguf, b"hello").unwrap();
    let o = run(&["info", not_gguf.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
}

/// The acceptance run of issue 3: greedy generation on SmolLM2 is coherent and identical
/// across runs.
#[test]
fn real_model_generates_a_coherent_deterministic_continuation() {
    let Some(model) = common::real_model() else {
        return;
    };
    let m = model.to_str().unwrap();
    let args = [
        "generate",
        m,
        "--prompt",
        "The capital of France is",
        "--max-tokens",
        "16",
        "--temp",
        "0",
    ];
    let first = run(&args);
    assert!(first.status.success(), "{}", stderr(&first));
    let text = stdout(&first);
    assert!(text.contains("Paris"), "continuation: {text:?}");
    assert_eq!(text, stdout(&run(&args)));
}

/// `generate` with `env` and `extra` flags on `model`; the bytes it streamed.
fn generate_bytes(
    model: &str,
    prompt: &str,
    tokens: &str,
    extra: &[&str],
    env: &[(&str, &str)],
) -> String {
    let mut args = vec![
        "generate",
        model,
        "--prompt",
        prompt,
        "--max-tokens",
        tokens,
    ];
    args.extend_from_slice(extra);
    let o = bin()
        .args(&args)
        .envs(env.iter().copied())
        .output()
        .unwrap();
    assert!(o.status.success(), "{args:?}: {}", stderr(&o));
    stdout(&o)
}

/// The first byte at which two outputs part, if they do.
fn parts_at(a: &str, b: &str) -> Option<usize> {
    a.bytes()
        .zip(b.bytes())
        .position(|(x, y)| x != y)
        .or((a.len() != b.len()).then(|| a.len().min(b.len())))
}

/// `generate --spec K` for every K of `ks` streams plain `generate`'s bytes, and plain
/// generation on the fused single tier (`plain-single`) parts from them, so the prompt meets
/// a near-tie and the comparison has teeth.
fn spec_equals_plain_where_the_fused_tier_parts(m: &str, prompt: &str, n: &str, ks: &[&str]) {
    let plain = generate_bytes(m, prompt, n, &["--temp", "0"], &[]);
    for k in ks {
        let spec = generate_bytes(m, prompt, n, &["--spec", k], &[]);
        assert_eq!(parts_at(&plain, &spec), None, "--spec {k}");
    }
    let defect = [("MEMRA_GATE_DEFECT", "plain-single")];
    let fused = generate_bytes(m, prompt, n, &["--temp", "0"], &defect);
    assert!(
        parts_at(&plain, &fused).is_some(),
        "the fused tier never parted: the prompt tests nothing"
    );
}

/// Speculative decoding does not change what the user gets: under the default pins
/// `generate --spec K` streams plain `generate`'s bytes, for every K, on a stream long enough
/// to cross the attention windows at 64 and 128. Plain generation's steps on the fused
/// single-sequence tier (`plain-single`, what `generate` ran before the batched body became
/// its B=1 contract) part from them on this prompt, so the comparison has teeth.
#[test]
fn generate_with_spec_equals_plain_generate_on_the_tiny_model() {
    let dir = tempfile::tempdir().unwrap();
    let model = synth_tiny(dir.path());
    let m = model.to_str().unwrap();
    let (prompt, n) = (TINY_PROMPT, "160");
    spec_equals_plain_where_the_fused_tier_parts(m, prompt, n, &["1", "4", "8"]);
    // A --max-tokens past the context (up to usize::MAX) stops both at the context's end.
    let max = usize::MAX.to_string();
    assert_eq!(
        generate_bytes(m, prompt, &max, &["--temp", "0"], &[]),
        generate_bytes(m, prompt, &max, &["--spec", "4"], &[])
    );

    // The shortcut that sends plain steps to the fused tier refuses --spec (exit 2, both
    // fixes named); under the equalized pins it is one composition and --spec runs.
    let o = bin()
        .args(["generate", m, "--prompt", prompt, "--spec", "4"])
        .env("MEMRA_SERVE_B1FAST", "1")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("MEMRA_NO_FUSE_NORMQ=1"),
        "{}",
        stderr(&o)
    );
    let eq = [
        ("MEMRA_SERVE_B1FAST", "1"),
        ("MEMRA_MMVQ", "0"),
        ("MEMRA_NO_FUSE_NORMQ", "1"),
    ];
    assert_eq!(
        generate_bytes(m, prompt, "40", &["--spec", "4"], &eq),
        generate_bytes(m, prompt, "40", &["--temp", "0"], &eq)
    );
}

/// The prompt of the tiny model's test: its plain greedy stream meets a near-tie where the
/// fused tier chooses another token.
const TINY_PROMPT: &str = "once upon a time";

/// [`generate_with_spec_equals_plain_generate_on_the_tiny_model`] on the real SmolLM2.
#[test]
fn generate_with_spec_equals_plain_generate_on_the_real_model() {
    let Some(model) = common::real_model() else {
        return;
    };
    let m = model.to_str().unwrap();
    let (prompt, n) = (REAL_PROMPT, "140");
    spec_equals_plain_where_the_fused_tier_parts(m, prompt, n, &["4"]);
}

/// The real model's prompt: its plain greedy stream meets a near-tie where the fused tier
/// chooses another token.
const REAL_PROMPT: &str = "Once upon a time";
