//! The workspace's layering holds: no crate has an import circle (`scripts/import-cycles`
//! reads the `use` lines of every module and prints the circles it finds), the
//! orchestrator's stages use only the stages its `lib.rs` lists before them, below the
//! command layer nothing names it (`crate::cmd` appears only in `cmd/`), and no library
//! function runs over 150 lines without a reason beside it. Also the README's validate
//! output, which must be what the shipped manifests validate to.

use std::path::{Path, PathBuf};
use std::process::Command;

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("orchestrator/ has a parent")
        .to_path_buf()
}

/// The crates' sources, as the scripts below take them.
const SOURCES: [&str; 5] = [
    "orchestrator/src",
    "engine/src",
    "gates/src",
    "kernels/src",
    "protocol/src",
];

/// Runs `python3 scripts/<script> args…` from the workspace root: its exit status and its
/// stdout and stderr as one text. `None`, after saying so, where python3 cannot run.
fn script(script: &str, args: &[&str]) -> Option<(bool, String)> {
    let root = workspace();
    match Command::new("python3")
        .arg(root.join("scripts").join(script))
        .args(args)
        .current_dir(&root)
        .output()
    {
        Ok(o) => Some((
            o.status.success(),
            format!(
                "{}{}",
                String::from_utf8_lossy(&o.stdout),
                String::from_utf8_lossy(&o.stderr)
            ),
        )),
        Err(e) => {
            eprintln!("skipped: cannot run python3: {e}");
            None
        }
    }
}

#[test]
fn no_crate_of_the_workspace_has_an_import_circle() {
    for src in SOURCES {
        let Some((ok, text)) = script("import-cycles", &[src]) else {
            return;
        };
        assert!(ok && text.starts_with("no import circle"), "{src}:\n{text}");
    }
}

/// The stages in the order `lib.rs`'s first lines list them (`[`words`]`, `[`machine`]`, …):
/// each may use only itself and the stages before it, and every folder of `src/` is one.
#[test]
fn the_orchestrators_stages_use_only_the_stages_below_them() {
    let root = workspace();
    let lib = std::fs::read_to_string(root.join("orchestrator/src/lib.rs")).unwrap();
    let mut order: Vec<String> = Vec::new();
    for line in lib.lines().take_while(|l| l.starts_with("//!")) {
        for part in line.split("[`").skip(1) {
            let name = part.split('`').next().unwrap_or_default().to_string();
            if !name.is_empty() && !order.contains(&name) {
                order.push(name);
            }
        }
    }
    assert!(order.len() >= 10, "lib.rs lists its stages: {order:?}");
    let order = order.join(",");
    let Some((ok, text)) = script("import-cycles", &["orchestrator/src", "--order", &order]) else {
        return;
    };
    assert!(
        ok && text.contains(" 0 arrows back up"),
        "stages {order}:\n{text}"
    );
}

/// The gates are a crate over the engine's public API and the protocol: no other crate of
/// the workspace among their dependencies (a gate that reached into the kernels or the
/// orchestrator would check something users do not run).
#[test]
fn the_gates_depend_on_the_engine_and_the_protocol_only() {
    let root = workspace();
    let text = std::fs::read_to_string(root.join("gates/Cargo.toml")).unwrap();
    let manifest: toml::Table = text.parse().unwrap();
    let deps = manifest["dependencies"].as_table().unwrap();
    let ours: Vec<&str> = deps
        .keys()
        .map(String::as_str)
        .filter(|k| k.starts_with("memra-"))
        .collect();
    assert_eq!(ours, ["memra-engine", "memra-protocol"], "gates/Cargo.toml");
    let engine_lib = std::fs::read_to_string(root.join("engine/src/lib.rs")).unwrap();
    assert!(
        !engine_lib.contains("mod gates"),
        "the gates live in gates/, not in the engine library"
    );
}

/// No function of the workspace's library code runs over 150 lines without a reason
/// written beside it (`// Over 150 lines: …`, `scripts/long-functions`).
#[test]
fn every_long_library_function_says_why() {
    let Some((ok, text)) = script("long-functions", &SOURCES) else {
        return;
    };
    assert!(ok && text.contains(" 0 without a reason"), "{text}");
}

#[test]
fn only_the_command_layer_names_the_command_line() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut offenders = Vec::new();
    let mut stack = vec![src.clone()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
                continue;
            }
            if path.extension().is_none_or(|e| e != "rs") {
                continue;
            }
            let rel = path
                .strip_prefix(&src)
                .unwrap()
                .to_string_lossy()
                .replace('\\', "/");
            let allowed = rel.starts_with("cmd/");
            if !allowed
                && std::fs::read_to_string(&path)
                    .unwrap()
                    .contains("crate::cmd")
            {
                offenders.push(rel);
            }
        }
    }
    assert!(
        offenders.is_empty(),
        "these modules below the command layer name crate::cmd: {offenders:?}"
    );
}

/// The README's tour shows `memra-orch validate manifests/*.toml`; its lines must be what the
/// shipped manifests validate to today, so the counts a newcomer reads are never stale.
#[test]
fn the_readmes_validate_lines_match_the_shipped_manifests() {
    let root = workspace();
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let mut manifests: Vec<PathBuf> = std::fs::read_dir(root.join("manifests"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "toml"))
        .collect();
    manifests.sort();
    let out = Command::new(env!("CARGO_BIN_EXE_memra-orch"))
        .current_dir(&root)
        .arg("validate")
        .args(manifests.iter().map(|p| p.strip_prefix(&root).unwrap()))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        assert!(
            readme.contains(&format!("    {line}\n")),
            "README.md does not show `{line}`; update the tour's validate output"
        );
    }
}

/// The README's main command builds with exactly the command the smoke manifest's `build`
/// cell runs, so the first run compiles the workspace once (a different command, or a
/// `cargo run -p memra-orch` with another feature set, would compile it twice).
#[test]
fn the_readmes_main_command_builds_what_the_smoke_battery_builds() {
    let root = workspace();
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let smoke = std::fs::read_to_string(root.join("manifests/smoke.toml")).unwrap();
    let build = smoke
        .lines()
        .find_map(|l| l.strip_prefix("build = \""))
        .and_then(|rest| rest.strip_suffix('"'))
        .expect("smoke.toml sets [vars] build");
    let main = format!("    {build} && target/release/memra-orch run manifests/smoke.toml");
    assert!(
        readme.lines().any(|l| l == main),
        "README.md's set-up command must be `{}`",
        main.trim()
    );
    // The test command is the first indented line after "Run the tests", and `.ci/run` runs
    // exactly it as one of its lines.
    let test = readme
        .lines()
        .skip_while(|l| !l.starts_with("Run the tests"))
        .find_map(|l| l.strip_prefix("    "))
        .expect("README.md says `Run the tests` and then the command, indented");
    assert!(
        test.starts_with("cargo test --workspace --locked"),
        "README's test command runs the workspace's tests: {test}"
    );
    let ci = std::fs::read_to_string(root.join(".ci/run")).unwrap();
    assert!(
        ci.lines().any(|l| l == test),
        "README and .ci/run run the same test command: `.ci/run` must hold the line `{test}`"
    );
}
