//! `max_output` bounds each log of an attempt: a gate printing past it has its log cut with
//! a marker line, is stopped, and ends `error` with a reason naming the cap and how to raise
//! it; the key works on a node and in `[defaults]`, and a bad size is refused.

use std::process::Command;

use crate::run_support::Fixture;

const MIB: u64 = 1 << 20;

#[test]
fn a_gate_printing_past_max_output_ends_error_with_its_log_cut() {
    let f = Fixture::new(
        r#"
schema = 1
name = "spew"

[defaults]
gpus = 0
max_output = "1MiB"

[[arm]]
id = "out"
run = ["{gates}/spew.sh"]

[[arm]]
id = "err"
run = ["{gates}/spew.sh", "stderr"]
max_output = "2MiB"
retries = 2

[[arm]]
id = "quiet"
run = ["{gates}/pass.sh"]
"#,
    );
    let out = f.run(&[]);
    assert_eq!(out.status.code(), Some(1));
    for (id, log, cap, text) in [
        ("out", "stdout.log", MIB, "1MiB"),
        ("err", "stderr.log", 2 * MIB, "2MiB"),
    ] {
        let receipt = f.receipt(id);
        assert_eq!(receipt["verdict"], "error", "{receipt:#}");
        let reason = receipt["reason"].as_str().unwrap();
        assert!(
            reason.contains(&format!("{log} passed max_output = \"{text}\""))
                && reason.contains("raise the node's `max_output`"),
            "{reason}"
        );
        // A gate that prints too much would print as much again: no retry.
        assert_eq!(
            receipt["attempts"].as_array().unwrap().len(),
            1,
            "{receipt:#}"
        );
        let bytes = crate::run_support::read_bytes(&f.attempt_dir(id, 1).join(log)).unwrap();
        let marker =
            format!("\n[memra-orch: {log} cut at max_output = \"{text}\"; the gate was stopped]\n");
        assert_eq!(bytes.len() as u64, cap + marker.len() as u64);
        assert!(bytes.ends_with(marker.as_bytes()), "{log} has no marker");
        assert!(bytes.starts_with(b"memra-spew\nmemra-spew\n"));
    }
    assert_eq!(f.verdict("quiet"), "pass");
}

#[test]
fn a_bad_max_output_is_refused_naming_the_fix() {
    let f = Fixture::new(
        r#"
schema = 1
name = "bad"

[[arm]]
id = "a"
run = ["true"]
max_output = "lots"
"#,
    );
    let out = Command::new(env!("CARGO_BIN_EXE_memra-orch"))
        .arg("validate")
        .arg(f.path().join("manifest.toml"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr
            .contains("`max_output` must be a size above zero such as \"1GiB\", found `\"lots\"`")
            && stderr.contains("write `max_output = \"4GiB\"`"),
        "{stderr}"
    );
}
