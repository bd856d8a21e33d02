//! Input an adversarial user writes: a tiny manifest that expands to 10^9 cells, secrets in
//! pins, URLs, argv and `[vars]`, matrix values that are shell code, and gate messages full
//! of terminal control sequences. Each must end in a clear refusal or in output that holds
//! the value harmlessly; none may take the machine, leak a secret or drive the terminal.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::run_support::{Fixture, files_under};

/// Runs `memra-orch ARGS` in `dir` and returns (exit code, stdout + stderr, wall time, max
/// RSS in KiB), the RSS read from the kernel's accounting of exactly that child (`wait4`).
#[allow(
    clippy::zombie_processes,
    reason = "the child is reaped by wait4, which std cannot do"
)]
fn measured(dir: &Path, args: &[&str]) -> (i32, String, Duration, i64) {
    let start = Instant::now();
    let child = Command::new(env!("CARGO_BIN_EXE_memra-orch"))
        .args(args)
        .current_dir(dir)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id() as libc::pid_t;
    // The outputs are small (a few diagnostics); reading them after the child ended cannot
    // block it on a full pipe.
    let mut status = 0;
    // SAFETY: an all-zero rusage is a valid value of the plain C struct.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `pid` is our own unreaped child; status and usage point at live locals.
    let r = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
    assert_eq!(r, pid, "wait4: {}", std::io::Error::last_os_error());
    let elapsed = start.elapsed();
    let mut text = String::new();
    let (mut out, mut err) = (child.stdout.unwrap(), child.stderr.unwrap());
    use std::io::Read;
    out.read_to_string(&mut text).unwrap();
    err.read_to_string(&mut text).unwrap();
    let code = if libc::WIFEXITED(status) {
        libc::WEXITSTATUS(status)
    } else {
        -1
    };
    (code, text, elapsed, usage.ru_maxrss)
}

fn axis_file(dir: &Path, name: &str, axis: &str) {
    let values: Vec<String> = (0..1000).map(|i| format!("\"{i}\"")).collect();
    let text = format!("[axes]\n{axis} = [{}]\n", values.join(", "));
    std::fs::write(dir.join(name), text).unwrap();
}

#[test]
fn a_billion_cells_are_refused_fast_without_allocating_them() {
    let dir = tempfile::tempdir().unwrap();
    axis_file(dir.path(), "a.toml", "A");
    axis_file(dir.path(), "b.toml", "B");
    axis_file(dir.path(), "c.toml", "C");
    std::fs::write(
        dir.path().join("m.toml"),
        "schema = 1\nname = \"big\"\n[[arm]]\nid = \"x\"\nrun = [\"true\"]\n\
         env_matrix = [\"a.toml\", \"b.toml\", \"c.toml\"]\n",
    )
    .unwrap();
    let (code, text, elapsed, rss_kib) = measured(dir.path(), &["validate", "m.toml"]);
    assert_eq!(code, 2, "{text}");
    assert!(
        text.contains("node `x` expands to 1000000000 cells, more than the limit of 100000"),
        "{text}"
    );
    assert!(text.contains("set `max_cells = N`"), "{text}");
    assert!(elapsed < Duration::from_secs(10), "took {elapsed:?}");
    assert!(rss_kib < 200 * 1024, "max RSS {rss_kib} KiB");

    // The same cap counts the whole manifest, and `max_cells` raises it.
    std::fs::write(
        dir.path().join("two.toml"),
        "schema = 1\nname = \"two\"\n\
         [[arm]]\nid = \"x\"\nrun = [\"true\"]\nenv_matrix = [\"a.toml\"]\n\
         [[arm]]\nid = \"y\"\nrun = [\"true\"]\nenv_matrix = [\"b.toml\"]\n",
    )
    .unwrap();
    let manifest = std::fs::read_to_string(dir.path().join("two.toml")).unwrap();
    std::fs::write(
        dir.path().join("two.toml"),
        format!("max_cells = 1500\n{manifest}"),
    )
    .unwrap();
    let (code, text, ..) = measured(dir.path(), &["validate", "two.toml"]);
    assert_eq!(code, 2, "{text}");
    assert!(
        text.contains(
            "node `y` expands to 1000 cells, which takes the manifest past the limit of 1500 cells"
        ),
        "{text}"
    );
    std::fs::write(
        dir.path().join("two.toml"),
        format!("max_cells = 2000\n{manifest}"),
    )
    .unwrap();
    let (code, text, ..) = measured(dir.path(), &["validate", "two.toml"]);
    assert_eq!(code, 0, "{text}");
}

#[test]
fn vars_that_multiply_each_other_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let mut m = String::from("schema = 1\nname = \"laughs\"\n[vars]\nv0 = \"0123456789\"\n");
    for i in 1..10 {
        let prev = format!("${{v{}}}", i - 1);
        m.push_str(&format!("v{i} = \"{}\"\n", prev.repeat(10)));
    }
    m.push_str("[[arm]]\nid = \"x\"\nrun = [\"echo\", \"${v9}\"]\n");
    std::fs::write(dir.path().join("m.toml"), m).unwrap();
    let (code, text, elapsed, rss_kib) = measured(dir.path(), &["validate", "m.toml"]);
    assert_eq!(code, 2, "{text}");
    assert!(text.contains("bytes after substitution"), "{text}");
    assert!(elapsed < Duration::from_secs(10), "took {elapsed:?}");
    assert!(rss_kib < 200 * 1024, "max RSS {rss_kib} KiB");
}

const SECRETS: &str = r#"
schema = 1
name = "secrets"

[env]
DB_PASS = "db-pass-hunter2"
MIRROR = "https://bob:url-pass-hunter3@example.com/pkg"

[isolation]
inherit = ["PATH"]
secret = ["token", "deploy_id"]

[vars]
token = "argv-secret-tok"
deploy_id = "marked-var-value"

[[arm]]
id = "say"
run = ["{gates}/say.sh", "--token", "${vars.token}", "id=${deploy_id}"]
env = { DEPLOY = "${deploy_id}" }
gpus = 0

[[arm]]
id = "env"
run = 'echo "seen: $DB_PASS $MIRROR $DEPLOY"'
shell = true
env = { DEPLOY = "${deploy_id}" }
gpus = 0

[[arm]]
id = "missing"
run = ["/nonexistent/${vars.token}/gate"]
gpus = 0
"#;

const CLEAR: [&str; 5] = [
    "db-pass-hunter2",
    "url-pass-hunter3",
    "argv-secret-tok",
    "marked-var-value",
    "hunter",
];

#[test]
fn secrets_reach_the_gate_and_nothing_the_orchestrator_writes_or_prints() {
    let f = Fixture::new(SECRETS);
    let out = f.run(&[]);
    // `missing` cannot start, so the run fails; everything else passes.
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(f.verdict("say"), "pass");
    assert_eq!(f.verdict("env"), "pass");

    // The child gets the real values.
    let say = crate::run_support::read_text(&f.attempt_dir("say", 1).join("stdout.log")).unwrap();
    assert_eq!(say, "--token\nargv-secret-tok\nid=marked-var-value\n");
    let env = crate::run_support::read_text(&f.attempt_dir("env", 1).join("stdout.log")).unwrap();
    assert_eq!(
        env,
        "seen: db-pass-hunter2 https://bob:url-pass-hunter3@example.com/pkg marked-var-value\n"
    );

    // Nothing else in the tree holds them: receipts, run.json, summary.md, junit.xml.
    let mut checked = 0;
    for file in files_under(&f.tree()) {
        let name = file.file_name().unwrap().to_string_lossy().into_owned();
        if name == "stdout.log" || name == "stderr.log" {
            continue;
        }
        let text =
            String::from_utf8_lossy(&crate::run_support::read_bytes(&file).unwrap()).into_owned();
        for secret in CLEAR {
            assert!(
                !text.contains(secret),
                "{secret} in {}:\n{text}",
                file.display()
            );
        }
        checked += 1;
    }
    assert!(checked >= 6, "only {checked} files checked");
    let say = f.receipt("say");
    assert_eq!(say["argv"][2], "<redacted>");
    assert_eq!(say["argv"][3], "id=<redacted>");
    assert_eq!(say["env"]["DEPLOY"], "<redacted>");
    let env = f.receipt("env");
    assert_eq!(env["env"]["DB_PASS"], "<redacted>");
    assert_eq!(
        env["env"]["MIRROR"],
        "https://bob:<redacted>@example.com/pkg"
    );
    let missing = f.receipt("missing");
    assert!(
        missing["reason"]
            .as_str()
            .unwrap()
            .contains("/nonexistent/<redacted>/gate"),
        "{missing:#}"
    );
    // Nor the run's own output.
    let printed = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    for secret in CLEAR {
        assert!(!printed.contains(secret), "{secret} printed:\n{printed}");
    }

    // Nor `plan`, in any format.
    for format in ["text", "json"] {
        let out = Command::new(env!("CARGO_BIN_EXE_memra-orch"))
            .args(["plan", "manifest.toml", "--format", format])
            .current_dir(f.path())
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(0));
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains("<redacted>"), "{text}");
        for secret in CLEAR {
            assert!(
                !text.contains(secret),
                "{secret} in plan --format {format}:\n{text}"
            );
        }
    }
}

#[test]
fn matrix_values_in_shell_text_are_data_not_commands() {
    let f = Fixture::new(
        r#"
schema = 1
name = "inject"

[vars]
build = "echo built"

[[arm]]
id = "echo"
run = "printf '%s|' ${matrix.v} \"${matrix.v}\" '${matrix.v}'; ${raw:build}"
shell = true
matrix = { v = ["$(touch pwned)", "a'b\"c `touch pwned2` $HOME"] }
gpus = 0
"#,
    );
    let out = f.run(&[]);
    assert_eq!(out.status.code(), Some(0));
    assert!(!f.path().join("pwned").exists());
    assert!(!f.path().join("pwned2").exists());
    let cells = f.run_json()["nodes"].as_array().unwrap().clone();
    let mut seen = Vec::new();
    for c in &cells {
        let id = c["id"].as_str().unwrap();
        let stdout =
            crate::run_support::read_text(&f.attempt_dir(id, 1).join("stdout.log")).unwrap();
        seen.push(stdout);
    }
    assert_eq!(
        seen,
        [
            "$(touch pwned)|$(touch pwned)|$(touch pwned)|built\n",
            "a'b\"c `touch pwned2` $HOME|a'b\"c `touch pwned2` $HOME|a'b\"c `touch pwned2` $HOME|built\n"
        ]
    );
}

#[test]
fn control_characters_from_a_gate_are_escaped_on_the_terminal_and_in_reports() {
    let f = Fixture::new(
        r#"
schema = 1
name = "ansi"

[[arm]]
id = "noisy"
run = ["./noisy.sh"]
gpus = 0
"#,
    );
    let gate = f.path().join("noisy.sh");
    std::fs::write(
        &gate,
        "#!/bin/sh\nprintf '%s\\n' '{\"check\":\"c\",\"status\":\"fail\",\"message\":\"bad \\u001b[2J\\u001b]0;owned\\u0007 \\u0000 \\u202e end\"}' >> \"$MEMRA_ORCH_CHECKS\"\nexit 1\n",
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&gate, std::fs::Permissions::from_mode(0o755)).unwrap();
    let out = f.run(&[]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(f.verdict("noisy"), "fail");
    let clean = |what: &str, text: &str| {
        for bad in ['\u{1b}', '\0', '\u{7}', '\u{202e}'] {
            assert!(!text.contains(bad), "{bad:?} in {what}:\n{text:?}");
        }
    };
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    clean("stderr", &stderr);
    clean("stdout", &stdout);
    assert!(
        format!("{stdout}{stderr}").contains("bad \\x1b[2J\\x1b]0;owned\\x07 \\x00 \\u{202e} end"),
        "{stdout}{stderr}"
    );
    let summary = std::fs::read_to_string(f.tree().join("summary.md")).unwrap();
    clean("summary.md", &summary);
    assert!(summary.contains("\\x1b[2J"), "{summary}");
    let junit = std::fs::read_to_string(f.tree().join("junit.xml")).unwrap();
    clean("junit.xml", &junit);
    assert!(junit.contains("\\x1b[2J"), "{junit}");
}

#[test]
fn env_matrix_files_that_are_devices_fifos_or_huge_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("fifo.toml");
    let c = std::ffi::CString::new(fifo.to_string_lossy().as_bytes()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let huge = dir.path().join("huge.toml");
    std::fs::File::create(&huge)
        .unwrap()
        .set_len(memra_orch::load::MAX_FILE_BYTES + 1)
        .unwrap();
    std::fs::write(
        dir.path().join("m.toml"),
        "schema = 1\nname = \"dev\"\n[[arm]]\nid = \"x\"\nrun = [\"true\"]\n\
         env_matrix = [\"/dev/zero\", \"fifo.toml\", \"huge.toml\"]\n",
    )
    .unwrap();
    let (code, text, elapsed, rss_kib) = measured(dir.path(), &["validate", "m.toml"]);
    assert_eq!(code, 2, "{text}");
    assert_eq!(text.matches("not a regular file").count(), 2, "{text}");
    assert!(text.contains("larger than 16 MiB"), "{text}");
    assert!(elapsed < Duration::from_secs(10), "took {elapsed:?}");
    assert!(rss_kib < 200 * 1024, "max RSS {rss_kib} KiB");
}

#[test]
fn needs_between_two_large_nodes_are_capped() {
    let dir = tempfile::tempdir().unwrap();
    let values: Vec<String> = (0..4000).map(|i| format!("\"{i}\"")).collect();
    let axis = values.join(", ");
    std::fs::write(
        dir.path().join("m.toml"),
        format!(
            "schema = 1\nname = \"edges\"\n\
             [[arm]]\nid = \"a\"\nrun = [\"true\"]\nmatrix = {{ v = [{axis}] }}\n\
             [[arm]]\nid = \"b\"\nneeds = [\"a\"]\nrun = [\"true\"]\nmatrix = {{ v = [{axis}] }}\n"
        ),
    )
    .unwrap();
    let (code, text, elapsed, _) = measured(dir.path(), &["validate", "m.toml"]);
    assert_eq!(code, 2, "{text}");
    assert!(
        text.contains("node `b` has 4000 cells that each need 4000"),
        "{text}"
    );
    assert!(elapsed < Duration::from_secs(10), "took {elapsed:?}");
}
