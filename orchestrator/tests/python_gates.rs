//! Gates written in Python with `memra_gate` (protocol/python), run by the real binary: BF16
//! logits and I32 token streams compared under every policy (`bitwise`, `ulp`, `kl`,
//! `topk`, `tokens`), each with a case that must pass and one that must fail for the reason
//! the policy names; and pin attestation for a variable outside `MEMRA_*` that the gate
//! never read. The Python comes from `scripts/python-venv` (numpy and memra_gate installed),
//! which these tests make when it is missing.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use crate::run_support::{Fixture, logged};

/// The virtual environment's python, made once per test binary.
pub fn python() -> &'static Path {
    static PYTHON: OnceLock<PathBuf> = OnceLock::new();
    PYTHON.get_or_init(|| {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let out = Command::new(root.join("scripts/python-venv"))
            .output()
            .expect("scripts/python-venv runs");
        assert!(
            out.status.success(),
            "scripts/python-venv failed (the Python gate tests need numpy and memra_gate):\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        PathBuf::from(String::from_utf8(out.stdout).unwrap().trim())
    })
}

fn gate() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/python/logits_gate.py")
}

/// One arm per perturbation, then the compares.
fn manifest(compares: &str, top: &str) -> String {
    let mut m = format!("schema = 1\nname = \"py\"\n{top}\n[defaults]\ntimeout = \"2m\"\n\n");
    for p in ["none", "same", "ulp", "kl", "topk", "tokens"] {
        let value = if p == "same" { "none" } else { p };
        m.push_str(&format!(
            "[[arm]]\nid = \"{p}\"\nrun = [\"{}\", \"{}\"]\nenv = {{ GATE_PERTURB = \"{value}\" }}\n\n",
            python().display(),
            gate().display()
        ));
    }
    m + compares
}

fn compare(id: &str, candidate: &str, artifact: &str, policy: &str, expect_fail: bool) -> String {
    format!(
        "[[compare]]\nid = \"{id}\"\nreference = \"none\"\ncandidates = [\"{candidate}\"]\n\
         artifact = \"{artifact}\"\npolicy = {policy}\n{}\n",
        if expect_fail {
            "expect = \"fail\"\n"
        } else {
            ""
        }
    )
}

#[test]
fn bf16_logits_and_i32_tokens_under_every_policy() {
    let cases = [
        ("bitwise-same", "same", "logits", "\"bitwise\"", false),
        ("bitwise-ulp", "ulp", "logits", "\"bitwise\"", true),
        ("ulp-within", "ulp", "logits", "{ max_ulp = 1 }", false),
        ("ulp-beyond", "ulp", "logits", "{ max_ulp = 0 }", true),
        ("kl-within", "kl", "logits", "{ kl_max = 0.5 }", false),
        (
            "kl-beyond",
            "kl",
            "logits",
            "{ kl_mean = 1e-9, kl_max = 1e-8 }",
            true,
        ),
        ("topk-same", "same", "logits", "{ topk = 5 }", false),
        (
            "topk-sunk",
            "topk",
            "logits",
            "{ topk = 5, min_overlap = 1.0 }",
            true,
        ),
        ("tokens-same", "same", "tokens", "\"tokens\"", false),
        ("tokens-part", "tokens", "tokens", "\"tokens\"", true),
        (
            "tokens-prefix",
            "tokens",
            "tokens",
            "{ tokens = true, min_prefix = 5 }",
            false,
        ),
        ("tokens-bitwise", "same", "tokens", "\"bitwise\"", false),
    ];
    let compares: String = cases
        .iter()
        .map(|(id, cand, art, policy, fail)| {
            compare(id, cand, &format!("{art}.safetensors"), policy, *fail)
        })
        .collect();
    let f = Fixture::new(&manifest(&compares, ""));
    let out = logged(f.run(&["--jobs", "2"]));
    assert_eq!(out.status.code(), Some(0), "every cell as expected");
    for (id, cand, _, _, fail) in cases {
        let cell = format!("{id}[candidate={cand}]");
        let r = f.receipt(&cell);
        assert_eq!(r["verdict"], "pass", "{cell}: {r:#}");
        let c = &r["compare"];
        let failures: Vec<String> = c["failures"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap().to_string())
            .collect();
        assert_eq!(!failures.is_empty(), fail, "{cell}: {failures:?}");
        let t = &c["tensors"][0];
        let dtype = if id.starts_with("tokens") {
            "I32"
        } else {
            "BF16"
        };
        assert_eq!(t["dtype"], dtype, "{cell}");
        let why = failures.join("; ");
        match id {
            "bitwise-ulp" => assert!(
                why.contains("(BF16): 1 of 384 values differ in bits (first at row 3, index 10"),
                "{why}"
            ),
            "ulp-within" => assert_eq!(t["max_ulp"], 1),
            "ulp-beyond" => assert!(
                why.contains("1 of 384 values are more than 0 ulp apart"),
                "{why}"
            ),
            "kl-within" => {
                let max = t["kl_max"].as_f64().unwrap();
                assert!(max > 0.0 && max < 0.5, "{max}");
            }
            "kl-beyond" => {
                assert!(why.contains("kl: the KL divergence of row 2"), "{why}");
                assert!(why.contains("above kl_mean"), "{why}");
            }
            "topk-same" => assert_eq!(t["topk_min_overlap"], 1.0),
            "topk-sunk" => assert!(why.contains("topk: row 1 shares 4 of its top 5"), "{why}"),
            "tokens-part" => {
                assert!(
                    why.contains("tokens: 1 of 3 sequences part (first: sequence 1 at step 5"),
                    "{why}"
                );
                assert_eq!(t["divergences"][0]["step"], 5);
            }
            "tokens-prefix" => assert_eq!(t["diverged"], 1),
            _ => {}
        }
    }
    // `show` labels the numbers by the policy that produced them.
    let show = Command::new(env!("CARGO_BIN_EXE_memra-orch"))
        .args([
            "show",
            "latest",
            "tokens-part[candidate=tokens]",
            "--receipts",
        ])
        .arg(f.path().join("receipts"))
        .current_dir(f.path())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&show.stdout);
    assert!(
        text.contains("tokens: tokens: 1 of 3 sequences part: sequence 1 at step 5"),
        "{text}"
    );
    assert!(text.contains("I32 [3, 8]"), "{text}");
}

#[test]
fn a_pin_the_gate_never_read_is_flagged_whatever_its_prefix() {
    let compares = compare("knob", "fake", "logits.safetensors", "\"bitwise\"", false)
        + &compare(
            "ubatch-cmp",
            "ubatch",
            "logits.safetensors",
            "\"bitwise\"",
            false,
        );
    let arms = format!(
        "[[arm]]\nid = \"fake\"\nrun = [\"{py}\", \"{g}\"]\nenv = {{ LLAMA_FAKE_KNOB = \"1\" }}\n\n\
         [[arm]]\nid = \"ubatch\"\nrun = [\"{py}\", \"{g}\"]\nenv = {{ LLAMA_N_UBATCH = \"1\" }}\n\n",
        py = python().display(),
        g = gate().display()
    );
    let f = Fixture::new(&manifest(&(arms + &compares), "attest = [\"LLAMA_\"]"));
    let out = logged(f.run(&["--jobs", "2"]));
    assert_eq!(out.status.code(), Some(0));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("report \"pin not read\""), "{stdout}");
    let flagged = |id: &str| -> Vec<String> {
        f.receipt(id)["checks"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|c| c["check"] == "pin not read")
            .map(|c| c["message"].as_str().unwrap().to_string())
            .collect()
    };
    let fake = flagged("fake");
    assert_eq!(fake.len(), 1, "{fake:?}");
    assert!(
        fake[0].contains(
            "pin LLAMA_FAKE_KNOB=1 (fake) was set but the gate does not report reading it"
        ),
        "{fake:?}"
    );
    // A pin the gate read is attested; so is the reference, which sets none.
    assert!(flagged("ubatch").is_empty());
    assert!(flagged("none").is_empty());
    let summary = std::fs::read_to_string(f.tree().join("summary.md")).unwrap();
    assert!(
        summary.contains("## Warnings: pin not read (1)"),
        "{summary}"
    );
    // The ignored pin also left the bits alone: the compare passes, its candidate warns.
    assert_eq!(f.verdict("knob[candidate=fake]"), "pass");
}

#[test]
fn without_attest_a_gate_reporting_reads_is_still_held_to_what_its_pairs_vary() {
    let arms = format!(
        "[[arm]]\nid = \"fake\"\nrun = [\"{}\", \"{}\"]\nenv = {{ VLLM_KNOB = \"on\" }}\n\n",
        python().display(),
        gate().display()
    );
    let compares = compare("knob", "fake", "logits.safetensors", "\"bitwise\"", false);
    let f = Fixture::new(&manifest(&(arms + &compares), ""));
    let out = logged(f.run(&["--jobs", "2"]));
    assert_eq!(out.status.code(), Some(0));
    let checks = f.receipt("fake")["checks"].clone();
    assert!(
        checks
            .as_array()
            .unwrap()
            .iter()
            .any(|c| c["check"] == "pin not read" && c["pin"] == "VLLM_KNOB"),
        "{checks:#}"
    );
}

/// The inode of a cell's first artifact file `name`.
fn inode(tree: &Path, cell: &str, name: &str) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let node = crate::run_support::node_dir_in(tree, cell);
    // From the folder, or the store's object a packed run's archive links to.
    memra_orch::gate::attempt_file::open_path(&node.join("attempt-1/artifacts").join(name))
        .unwrap()
        .metadata()
        .unwrap()
        .ino()
}

#[test]
fn identical_artifacts_are_stored_once_across_cells_and_nights_and_gc_sweeps_them() {
    let f = Fixture::new(&manifest("", ""));
    logged(f.run(&["--jobs", "2"]));
    let first = f.tree();
    logged(f.run(&["--jobs", "2"]));
    let second = crate::run_support::newest_run(&f.manifest_dir());
    assert_ne!(first, second);
    // Two cells that wrote the same bytes, and one cell on two nights: one file.
    let a = inode(&first, "none", "logits.safetensors");
    assert_eq!(a, inode(&first, "same", "logits.safetensors"));
    assert_eq!(a, inode(&second, "none", "logits.safetensors"));
    // Different bytes stay different files, and the receipts still say what each holds.
    assert_ne!(a, inode(&first, "ulp", "logits.safetensors"));
    let r = f.receipt("none");
    let listed = &r["attempts"][0]["artifacts"];
    assert!(
        listed.to_string().contains("logits.safetensors"),
        "{listed}"
    );
    let store = f.path().join("receipts/.memra-store");
    let objects = |store: &Path| -> usize {
        std::fs::read_dir(store)
            .map(|d| {
                d.flatten()
                    // The shards; `.lock` beside them is the store's lock.
                    .filter(|s| s.file_type().is_ok_and(|t| t.is_dir()))
                    .map(|s| std::fs::read_dir(s.path()).unwrap().count())
                    .sum()
            })
            .unwrap_or(0)
    };
    // 6 arms write 2 files each on each night: logits in 4 distinct contents (none, same
    // and tokens write the same), tokens in 2. Twenty-four files, six objects.
    assert_eq!(objects(&store), 6);
    // `ls` does not take the store for a commit.
    let ls = Command::new(env!("CARGO_BIN_EXE_memra-orch"))
        .args(["ls", "--receipts"])
        .arg(f.path().join("receipts"))
        .output()
        .unwrap();
    assert!(!String::from_utf8_lossy(&ls.stdout).contains(".memra-store"));
    let gc = |keep: &str| {
        logged(
            Command::new(env!("CARGO_BIN_EXE_memra-orch"))
                .args(["gc", "--keep", keep, "--receipts"])
                .arg(f.path().join("receipts"))
                .output()
                .unwrap(),
        )
    };
    // The kept run still links every object.
    gc("1");
    assert_eq!(objects(&store), 6);
    assert!(!first.exists() && second.exists());
    // Once no run holds them, gc sweeps them.
    std::fs::remove_dir_all(&second).unwrap();
    let out = gc("1");
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("removed 6 stored artifacts"),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert_eq!(objects(&store), 0);
}
