//! `reference-gate` end to end through the real binary: green on the synthesized arms with
//! the banked goldens, the receipt TSV format, the canary, moved or missing goldens, minting,
//! usage errors, and the real model arm when the checkpoint is present.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// Every synthesized arm, in the gate's order.
const ARMS: [&str; 9] = [
    "q8_0",
    "q4_1",
    "q4_0",
    "f16",
    "bf16",
    "tiny",
    "rope1e5",
    "rope5e5-hd128-gqa4",
    "mha",
];

struct Run {
    code: i32,
    stdout: String,
    stderr: String,
    receipt: String,
    rows: Vec<Value>,
}

impl Run {
    fn status(&self, name: &str) -> &str {
        self.rows
            .iter()
            .find(|r| r["check"] == name)
            .and_then(|r| r["status"].as_str())
            .unwrap_or_else(|| panic!("no check {name}: {}", self.stdout))
    }
}

/// Runs the gate from the repository root (where the default goldens path resolves).
fn gate(args: &[&str], env: &[(&str, &str)]) -> Run {
    let dir = tempfile::tempdir().unwrap();
    let receipt = dir.path().join("receipt.tsv");
    let checks = dir.path().join("checks.jsonl");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_reference-gate"));
    for var in memra_engine::doors::DOOR_VARIABLES {
        cmd.env_remove(var);
    }
    let out = cmd
        .current_dir(repo_root())
        .env("MEMRA_BACKEND", "cpu")
        .env("MEMRA_ORCH_CHECKS", &checks)
        .env_remove("MEMRA_ORCH_ARTIFACTS")
        .arg(&receipt)
        .args(args)
        .envs(env.iter().copied())
        .output()
        .unwrap();
    Run {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        receipt: std::fs::read_to_string(&receipt).unwrap_or_default(),
        rows: std::fs::read_to_string(&checks)
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect(),
    }
}

#[test]
fn synthesized_arms_are_green_against_the_banked_goldens() {
    let r = gate(&[], &[]);
    assert_eq!(r.code, 0, "{}\n{}", r.stdout, r.stderr);
    assert_eq!(r.status("reference.tiny"), "pass");
    assert_eq!(r.status("loader-goldens"), "pass");
    // The CPU backend traces its q8_1 activations, so the quantized arms meet the strict
    // policy against the tie-following oracle: pass, not warn, and no hard mismatch.
    for arm in ["reference.q8_0", "reference.q4_1"] {
        assert_eq!(r.status(arm), "pass", "{}", r.stdout);
        let c = r.rows.iter().find(|c| c["check"] == arm).unwrap();
        assert_eq!(c["metrics"]["oracle"], "q8_1-following", "{c}");
        assert_eq!(c["metrics"]["quant_mismatches"], 0, "{c}");
        assert_eq!(c["metrics"]["warnings"], 0, "{c}");
        assert!(c["metrics"]["max_abs"].as_f64().unwrap() <= 1e-2, "{c}");
    }
    let lines: Vec<&str> = r.receipt.lines().collect();
    assert!(lines[0].starts_with("# reference-gate\tbinary_sha256="));
    let sha = lines[0]
        .split('\t')
        .nth(1)
        .unwrap()
        .trim_start_matches("binary_sha256=");
    assert_eq!(sha.len(), 64);
    assert_eq!(
        lines[1],
        "arm\tkind\trow\tmax_abs\tmax_rel\trel_rms\targmax_ref\targmax_got\tverdict"
    );
    assert_eq!(*lines.last().unwrap(), "# verdict\tfailures=0");
    for program in ["prefill", "decode", "decode-batch"] {
        assert!(
            lines.iter().any(|l| l
                .starts_with(&format!("# follow\tarm=q4_1\tprogram={program}\t"))
                && l.contains("\tmismatches=0")),
            "no clean follow line for q4_1 {program}: {}",
            r.receipt
        );
    }
    for kind in [
        "prefill",
        "decode",
        "decode-batch",
        "chunked",
        "decode-after-chunked",
    ] {
        assert!(
            lines
                .iter()
                .any(|l| l.starts_with(&format!("tiny\t{kind}\t"))),
            "no tiny {kind} rows"
        );
    }
    assert_eq!(
        lines
            .iter()
            .filter(|l| l.starts_with("# summary\t"))
            .count(),
        10,
        "nine arms and the goldens"
    );
    // The receipt alone says what ran: the arm list and program shape in the header, each
    // arm's token program and vocabulary, and how large the compared logits were.
    assert!(
        lines[0].contains("\tarms=q8_0,q4_1,q4_0,f16,bf16,tiny,rope1e5,rope5e5-hd128-gqa4,mha\t")
            && lines[0].contains("\tprogram_len=20\t"),
        "{}",
        lines[0]
    );
    for arm in ARMS {
        let line = lines
            .iter()
            .find(|l| l.starts_with(&format!("# arm\tarm={arm}\t")))
            .unwrap_or_else(|| panic!("no `# arm` line of {arm}"));
        assert!(
            line.contains("\tprompt_len=12\tdecode_steps=8\ttokens=")
                && line.split("tokens=").nth(1).unwrap().split(',').count() == 20,
            "{line}"
        );
        let summary = lines
            .iter()
            .find(|l| l.starts_with(&format!("# summary\tarm={arm}\t")))
            .unwrap();
        let absmax: f64 = summary
            .split("ref_absmax=")
            .nth(1)
            .unwrap()
            .parse()
            .unwrap();
        assert!(absmax > 1.0, "{summary}");
    }
    for arm in ARMS {
        assert!(
            lines
                .iter()
                .any(|l| l.starts_with(&format!("# summary\tarm={arm}\t"))
                    && l.contains("\tfailures=0\t")),
            "no clean summary of arm {arm}"
        );
    }
    // The float arm is within the policy by orders of magnitude.
    let tiny = r
        .rows
        .iter()
        .find(|c| c["check"] == "reference.tiny")
        .unwrap();
    assert!(tiny["metrics"]["max_abs"].as_f64().unwrap() < 1e-4);
    assert!(r.rows[0]["doors"]["policy"].is_string());
    // The arms with real checkpoints' constants (RoPE bases, epsilon, head width, GQA
    // ratios, vocabularies that are not powers of two) meet the oracle too.
    for (arm, vocab) in [("rope1e5", 997), ("rope5e5-hd128-gqa4", 512), ("mha", 771)] {
        assert_eq!(
            r.status(&format!("reference.{arm}")),
            "pass",
            "{}",
            r.stdout
        );
        assert!(
            r.receipt
                .contains(&format!("# arm\tarm={arm}\tvocab={vocab}\t")),
            "{arm}"
        );
    }
}

/// The q8_0 KV cache asked for in the environment is set aside: the gate runs the f32
/// cache its oracle models, and its doors row says so. Asked for with `--kv-q8`, the cache
/// is gated, and its rounding fails the f32 oracle's policy.
#[test]
fn the_environment_cannot_put_the_q8_0_cache_into_the_instrument() {
    let doors = |r: &Run| {
        r.rows
            .iter()
            .find_map(|row| row.get("doors").cloned())
            .unwrap_or_else(|| panic!("no doors row: {}", r.stdout))
    };
    let r = gate(&[], &[("MEMRA_KV_Q8", "1")]);
    assert_eq!(r.code, 0, "{}\n{}", r.stdout, r.stderr);
    let d = doors(&r);
    assert_eq!(d["kv"], "f32", "{d}");
    let instrument = d["instrument"].as_str().unwrap();
    assert!(
        instrument.contains("kv pinned f32") && instrument.contains("MEMRA_KV_Q8=1"),
        "{instrument}"
    );
    assert!(r.stdout.contains("set aside"), "{}", r.stdout);

    let r = gate(&["--kv-q8"], &[]);
    assert_eq!(r.code, 1, "{}\n{}", r.stdout, r.stderr);
    let d = doors(&r);
    assert_eq!(d["kv"], "q8_0", "{d}");
    assert!(d["instrument"].as_str().unwrap().contains("--kv-q8"), "{d}");
    assert_eq!(r.status("reference.q8_0"), "fail", "{}", r.stdout);
}

#[test]
fn the_canary_fails_every_arm() {
    let r = gate(&[], &[("MEMRA_GATE_CANARY", "1")]);
    assert_eq!(r.code, 1, "{}", r.stdout);
    // Every arm by the policy; the quantized arms also by hard q8_1 mismatches against
    // the tie-following oracle.
    for arm in ["reference.tiny", "reference.q8_0", "reference.q4_1"] {
        assert_eq!(r.status(arm), "fail", "{arm}: {}", r.stdout);
    }
    for arm in ["reference.q8_0", "reference.q4_1"] {
        let c = r.rows.iter().find(|c| c["check"] == arm).unwrap();
        assert!(
            c["metrics"]["quant_mismatches"].as_u64().unwrap() > 0,
            "{c}"
        );
    }
    let last = r.receipt.lines().last().unwrap();
    assert!(last.starts_with("# verdict\tfailures=") && last != "# verdict\tfailures=0");
}

/// A cache written wrong by a chunked prefill fails the chunked rows and the decode steps
/// after a chunked prefill, and nothing else: the one-shot programs never continue a
/// sequence, so the oracle rows stay green.
#[test]
fn a_cache_written_wrong_by_chunks_fails_the_chunked_programs_only() {
    // The shortest program the gate takes still catches it.
    let r = gate(
        &["--program-len", "15"],
        &[("MEMRA_GATE_DEFECT", "chunk-cache")],
    );
    assert_eq!(r.code, 1, "{}", r.stdout);
    let r = gate(&[], &[("MEMRA_GATE_DEFECT", "chunk-cache")]);
    assert_eq!(r.code, 1, "{}", r.stdout);
    let failing: Vec<(&str, &str)> = r
        .receipt
        .lines()
        .filter(|l| !l.starts_with('#') && l.ends_with("\tFAIL"))
        .map(|l| {
            let mut f = l.split('\t');
            (f.next().unwrap(), f.next().unwrap())
        })
        .collect();
    for arm in ARMS {
        for kind in ["chunked", "decode-after-chunked"] {
            assert!(
                failing.contains(&(arm, kind)),
                "{arm} {kind} must fail: {}",
                r.receipt
            );
        }
        assert_eq!(r.status(&format!("reference.{arm}")), "fail");
    }
    assert!(
        failing
            .iter()
            .all(|(_, k)| *k == "chunked" || *k == "decode-after-chunked"),
        "{failing:?}"
    );
    assert_eq!(r.status("loader-goldens"), "pass");
}

/// A block sum one f16 step high fails every quantized arm through the tie-following
/// oracle, which names the `s`: the Q8_0 arms, whose weights never read `s`, on the block
/// sums alone with their logits as close as ever. The float arms never quantize and stay
/// green.
#[test]
fn a_block_sum_off_by_one_step_fails_every_quantized_arm_on_s() {
    let r = gate(&[], &[("MEMRA_GATE_DEFECT", "q8-block-sum")]);
    assert_eq!(r.code, 1, "{}", r.stdout);
    let quantized = ["q8_0", "q4_1", "q4_0", "rope1e5", "rope5e5-hd128-gqa4"];
    for arm in ARMS {
        let c = r
            .rows
            .iter()
            .find(|c| c["check"] == format!("reference.{arm}"))
            .unwrap();
        if quantized.contains(&arm) {
            assert_eq!(c["status"], "fail", "{c}");
            assert!(
                c["metrics"]["quant_mismatches"].as_u64().unwrap() > 0,
                "{c}"
            );
            // The first value every program's following rejects is a block sum.
            let follows: Vec<&str> = r
                .receipt
                .lines()
                .filter(|l| l.starts_with(&format!("# follow\tarm={arm}\t")))
                .collect();
            assert_eq!(follows.len(), 3, "{}", r.receipt);
            for l in follows {
                assert!(l.contains(": s oracle "), "{l}");
            }
        } else {
            assert_eq!(c["status"], "pass", "{c}");
        }
    }
    for arm in ["q8_0", "rope5e5-hd128-gqa4"] {
        let c = r
            .rows
            .iter()
            .find(|c| c["check"] == format!("reference.{arm}"))
            .unwrap();
        assert!(c["metrics"]["max_abs"].as_f64().unwrap() < 1e-5, "{c}");
    }
    assert_eq!(r.status("loader-goldens"), "pass");
}

#[test]
fn moved_or_missing_goldens_fail_naming_the_tensor() {
    let dir = tempfile::tempdir().unwrap();
    let banked = std::fs::read_to_string(repo_root().join("engine/goldens/loader.tsv")).unwrap();
    let line = banked
        .lines()
        .find(|l| l.starts_with("q4_1\tblk.1.ffn_down.weight\t"))
        .expect("the banked goldens cover q4_1 blk.1.ffn_down.weight");
    let digest = line.rsplit('\t').next().unwrap();
    let flipped = format!(
        "{}{}",
        if digest.starts_with('0') { "1" } else { "0" },
        &digest[1..]
    );
    let moved = dir.path().join("moved.tsv");
    std::fs::write(&moved, banked.replace(digest, &flipped)).unwrap();
    let r = gate(&["--goldens", moved.to_str().unwrap()], &[]);
    assert_eq!(r.code, 1);
    assert_eq!(r.status("loader-goldens"), "fail");
    assert!(
        r.stdout.contains("q4_1/blk.1.ffn_down.weight: sha256"),
        "{}",
        r.stdout
    );

    let missing = dir.path().join("none.tsv");
    let r = gate(&["--goldens", missing.to_str().unwrap()], &[]);
    assert_eq!(r.code, 1);
    assert!(r.stdout.contains("--write-goldens"), "{}", r.stdout);

    let minted = dir.path().join("new/loader.tsv");
    let m = minted.to_str().unwrap();
    assert_eq!(gate(&["--goldens", m, "--write-goldens"], &[]).code, 0);
    // The digests are deterministic; the `# minted by` line names the build, so it differs
    // between builds and is compared for its shape only.
    let text = std::fs::read_to_string(&minted).unwrap();
    let data = |t: &str| -> Vec<String> {
        t.lines()
            .filter(|l| !l.starts_with("# minted by "))
            .map(str::to_string)
            .collect()
    };
    assert_eq!(data(&text), data(&banked), "minting is deterministic");
    assert!(
        text.lines().nth(1).is_some_and(
            |l| l.starts_with("# minted by reference-gate ") && l.contains(" binary_sha256=")
        ),
        "the minted file names its build: {}",
        text.lines().nth(1).unwrap_or_default()
    );
    assert_eq!(
        gate(&["--goldens", m], &[]).status("loader-goldens"),
        "pass"
    );
}

#[test]
fn bad_model_and_flags_exit_2() {
    let r = gate(&["--model", "/nonexistent.gguf"], &[]);
    assert_eq!(r.code, 2);
    assert!(
        r.stderr.contains("cannot load --model /nonexistent.gguf"),
        "{}",
        r.stderr
    );
    assert!(r.rows.is_empty());
    let r = gate(&["--frobnicate"], &[]);
    assert_eq!(r.code, 2);
    // Fewer than three prefill chunks leave the chunked rows nothing to hold.
    let r = gate(&["--program-len", "14"], &[]);
    assert_eq!(r.code, 2);
    assert!(r.stderr.contains("give at least 15"), "{}", r.stderr);
    let r = gate(&[], &[("MEMRA_BACKEND", "tpu")]);
    assert_eq!(r.code, 2);
    assert!(r.stderr.contains("MEMRA_BACKEND=\"tpu\""), "{}", r.stderr);
}

#[test]
fn the_real_model_arm_runs_when_the_checkpoint_is_present() {
    let model = repo_root().join("models/SmolLM2-135M-Instruct.Q4_1.gguf");
    if !model.exists() {
        eprintln!(
            "skip: {} is absent (scripts/fetch-model brings it)",
            model.display()
        );
        return;
    }
    let r = gate(&["--model", model.to_str().unwrap()], &[]);
    assert_eq!(r.code, 0, "{}", r.stdout);
    assert_eq!(r.status("reference.model"), "pass", "{}", r.stdout);
    assert!(
        r.receipt
            .lines()
            .any(|l| l.starts_with("model\tchunked\t19\t"))
    );
}
