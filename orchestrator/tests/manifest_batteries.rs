//! What the shipped batteries (`manifests/smoke.toml` on the CPU, `manifests/h200-single.toml`
//! on one GPU) run of `decode-batch-gate`: prompts past 64 and past 128 positions, the
//! pipeline split through a batch list, the B=1 fast path per stage, and the planted split
//! defects as negative cells. Read through `memra-orch plan`, so the cells are checked as
//! they would run (vars substituted, matrices expanded). Running them is
//! `smoke_manifest`'s business (and the GPU box's).

use std::path::PathBuf;
use std::process::Command;

use serde_json::Value;

/// The repository root, or `None` outside a git checkout (the manifests' paths resolve
/// against the git top-level, DESIGN §3); the tests then skip, saying why.
fn repo_root() -> Option<PathBuf> {
    let out = Command::new("git")
        .arg("-C")
        .arg(env!("CARGO_MANIFEST_DIR"))
        .args(["rev-parse", "--show-toplevel"])
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()))
}

/// The planned cells of a shipped manifest, or `None` (skipped) outside a git checkout.
fn cells(manifest: &str) -> Option<Vec<Value>> {
    let Some(root) = repo_root() else {
        eprintln!(
            "skipped: {} is not inside a git checkout",
            env!("CARGO_MANIFEST_DIR")
        );
        return None;
    };
    let out = Command::new(env!("CARGO_BIN_EXE_memra-orch"))
        .arg("plan")
        .arg(root.join(manifest))
        .args(["--format", "json"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{manifest}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let plan: Value = serde_json::from_slice(&out.stdout).unwrap();
    Some(plan["cells"].as_array().unwrap().clone())
}

/// A cell of `decode-batch-gate`, its flags read the way the gate reads them.
struct Gate<'a> {
    cell: &'a Value,
    argv: Vec<&'a str>,
}

impl<'a> Gate<'a> {
    fn of(cell: &'a Value) -> Option<Gate<'a>> {
        let argv: Vec<&str> = cell["argv"]
            .as_array()?
            .iter()
            .map(|a| a.as_str().unwrap())
            .collect();
        argv.first()?
            .ends_with("decode-batch-gate")
            .then_some(Gate { cell, argv })
    }

    fn flag(&self, name: &str) -> Option<&'a str> {
        let i = self.argv.iter().position(|a| *a == name)?;
        self.argv.get(i + 1).copied()
    }

    fn id(&self) -> &str {
        self.cell["id"].as_str().unwrap()
    }

    /// `--plen`, or the gate's default of 8.
    fn plen(&self) -> usize {
        self.flag("--plen").map_or(8, |p| p.parse().unwrap())
    }

    /// `--batch` as a list, or the gate's default of 4.
    fn batches(&self) -> Vec<usize> {
        self.flag("--batch")
            .unwrap_or("4")
            .split(',')
            .map(|b| b.parse().unwrap())
            .collect()
    }

    fn pp(&self) -> bool {
        self.flag("--mode") == Some("pp")
    }

    fn env(&self, var: &str) -> Option<&str> {
        self.cell["env"][var].as_str()
    }

    fn expects_pass(&self) -> bool {
        self.cell["expect"] == "pass"
    }
}

fn gates(cells: &[Value]) -> Vec<Gate<'_>> {
    cells.iter().filter_map(Gate::of).collect()
}

/// The decode-gate cells every battery must hold, whatever else it runs.
fn assert_battery_covers_the_decode_gate(manifest: &str, cells: &[Value]) {
    let gates = gates(cells);
    let ids = |f: &dyn Fn(&Gate) -> bool| -> Vec<String> {
        gates
            .iter()
            .filter(|g| f(g))
            .map(|g| g.id().to_string())
            .collect()
    };
    // Attention over chunks of 64 positions: across two and across three of them.
    let two_chunks = ids(&|g| g.expects_pass() && (65..=128).contains(&g.plen()));
    let three_chunks = ids(&|g| g.expects_pass() && g.plen() > 128);
    assert!(
        !two_chunks.is_empty(),
        "{manifest}: no decode-batch-gate cell with 64 < --plen <= 128"
    );
    assert!(
        !three_chunks.is_empty(),
        "{manifest}: no decode-batch-gate cell with --plen > 128"
    );
    // The fourth split arm: the B=1 fast path per stage, green, with B=1 in its batch list.
    let b1fast = ids(&|g| {
        g.pp()
            && g.expects_pass()
            && g.env("MEMRA_SERVE_B1FAST") == Some("1")
            && g.env("MEMRA_GATE_DEFECT").is_none()
            && g.batches().contains(&1)
    });
    assert!(
        !b1fast.is_empty(),
        "{manifest}: no green pp cell under MEMRA_SERVE_B1FAST=1 running B=1"
    );
    // Each planted split defect as a negative cell of the pp gate.
    for defect in ["stage-range", "boundary-copy"] {
        let caught =
            ids(&|g| g.pp() && !g.expects_pass() && g.env("MEMRA_GATE_DEFECT") == Some(defect));
        assert!(
            !caught.is_empty(),
            "{manifest}: no pp cell under MEMRA_GATE_DEFECT={defect} with expect = \"fail\""
        );
    }
    // A compare of a pp cell with its unsplit reference pairs logits of the same batch
    // size only when both run the same batch list (the first size is logits.safetensors).
    for c in cells.iter().filter(|c| c["kind"] == "compare") {
        let gate = |id: &Value| gates.iter().find(|g| g.cell["id"] == *id);
        let Some(candidate) = gate(&c["compare"]["candidate"]).filter(|g| g.pp()) else {
            continue;
        };
        let reference = gate(&c["compare"]["reference"])
            .unwrap_or_else(|| panic!("{manifest}: {} has no gate as reference", c["id"]));
        assert_eq!(
            reference.batches(),
            candidate.batches(),
            "{manifest}: {} pairs batch lists that differ",
            c["id"]
        );
    }
}

#[test]
fn the_smoke_battery_covers_long_prompts_the_b1_fast_split_and_the_split_defects() {
    let Some(cells) = cells("manifests/smoke.toml") else {
        return;
    };
    assert_battery_covers_the_decode_gate("smoke.toml", &cells);
    // CI runs smoke on two cores: the long-prompt cells stay short.
    for g in gates(&cells).iter().filter(|g| g.plen() > 64) {
        let steps: usize = g.flag("--steps").unwrap().parse().unwrap();
        assert!(
            steps <= 4 && g.batches().iter().all(|&b| b <= 4),
            "{}",
            g.id()
        );
    }
}

#[test]
fn the_one_gpu_battery_covers_long_prompts_a_batch_list_split_and_the_split_defects() {
    let Some(cells) = cells("manifests/h200-single.toml") else {
        return;
    };
    assert_battery_covers_the_decode_gate("h200-single.toml", &cells);
    let gates = gates(&cells);
    // Every pp cell runs the split at B=1, 4 and 8, not B=4 alone.
    let pp: Vec<&Gate> = gates.iter().filter(|g| g.pp()).collect();
    assert!(pp.len() >= 4, "pp, pp-b1fast and the two defect cells");
    for g in &pp {
        assert_eq!(g.batches(), [1, 4, 8], "{}", g.id());
    }
    // Each batch size of the plain split is compared with the unsplit run, bitwise.
    let artifacts: Vec<&str> = cells
        .iter()
        .filter(|c| c["kind"] == "compare" && c["compare"]["candidate"] == "pp")
        .map(|c| c["compare"]["artifact"].as_str().unwrap())
        .collect();
    for a in [
        "logits.safetensors",
        "logits.b4.safetensors",
        "logits.b8.safetensors",
    ] {
        assert!(
            artifacts.contains(&a),
            "no pp compare of {a}: {artifacts:?}"
        );
    }
}
