//! Compare cells and the files a gate leaves, end to end through `memra-orch run`: a
//! misspelt `artifact` ends `error` with a did-you-mean; links and FIFOs among a gate's files
//! are protocol errors, never followed or opened; a comparison that hangs ends `timeout` at
//! the node's deadline and `cancelled` on Ctrl-C, and the run exits promptly either way.
//!
//! A hanging comparison is made with `MEMRA_ORCH_TEST_HOLD_COMPARE` (a switch of debug
//! builds only), since nothing a gate can write still makes the comparison block.

use std::io::{BufRead, BufReader};
use std::process::{Child, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use crate::run_support::{Fixture, read_json};

const HEADER: &str = "schema = 1\nname = \"cmp-cells\"\n\n[defaults]\ngpus = 0\n\n";

/// The reference and candidate arms, both writing `logits.safetensors`, then `extra`.
fn manifest(candidate_run: &str, extra: &str) -> String {
    format!(
        "{HEADER}[[arm]]\nid = \"ref\"\nrun = [\"{{gates}}/logits.sh\", \"same\"]\n\n\
         [[arm]]\nid = \"cand\"\n{candidate_run}\n\n{extra}"
    )
}

fn compare(artifact: &str, more: &str) -> String {
    format!(
        "[[compare]]\nid = \"pair\"\nreference = \"ref\"\ncandidates = [\"cand\"]\n\
         artifact = \"{artifact}\"\npolicy = \"bitwise\"\n{more}"
    )
}

const PAIR: &str = "pair[candidate=cand]";

fn reason(f: &Fixture, id: &str) -> String {
    f.receipt(id)["reason"].as_str().unwrap_or("").to_string()
}

#[test]
fn a_misspelt_artifact_ends_error_naming_what_the_cell_wrote() {
    let f = Fixture::new(&manifest(
        "run = [\"{gates}/logits.sh\", \"same\"]",
        &compare("logit.safetensors", ""),
    ));
    let out = f.run(&[]);
    assert_eq!(out.status.code(), Some(1));
    let r = f.receipt(PAIR);
    assert_eq!(r["verdict"], "error", "{r:#}");
    assert_eq!(r["attempts"][0]["outcome"], "error");
    let why = reason(&f, PAIR);
    assert!(
        why.contains("the reference cell `ref` wrote no artifact `logit.safetensors`"),
        "{why}"
    );
    assert!(
        why.contains("it wrote `logits.safetensors`; did you mean `logits.safetensors`?"),
        "{why}"
    );
    assert!(why.contains("the candidate cell `cand`"), "{why}");
    // The report says the same, so `show` prints it, with the attempt's outcome.
    assert_eq!(
        r["compare"]["failures"].as_array().unwrap().len(),
        2,
        "{r:#}"
    );
    let text = show(&f, PAIR, "text");
    assert!(text.contains("\n  result:    error\n"), "{text}");
}

#[test]
fn a_cell_that_wrote_no_artifacts_is_told_so() {
    let f = Fixture::new(&manifest(
        "run = [\"{gates}/pass.sh\"]",
        &compare("logits.safetensors", ""),
    ));
    f.run(&[]);
    assert_eq!(f.verdict(PAIR), "error");
    let why = reason(&f, PAIR);
    assert!(
        why.contains("the candidate cell `cand` wrote no artifact"),
        "{why}"
    );
    assert!(why.contains("it wrote no artifacts at all"), "{why}");
    assert!(!why.contains("reference"), "{why}");
}

#[test]
fn a_fifo_artifact_is_refused_at_once() {
    let f = Fixture::new(&manifest(
        "shell = true\nrun = [\"mkfifo \\\"$MEMRA_ORCH_ARTIFACTS/logits.safetensors\\\"\"]",
        &compare("logits.safetensors", "timeout = \"2s\"\n"),
    ));
    let t = Instant::now();
    f.run(&[]);
    assert!(t.elapsed() < Duration::from_secs(30), "{:?}", t.elapsed());
    let cand = f.receipt("cand");
    assert_eq!(cand["verdict"], "error", "{cand:#}");
    let why = reason(&f, "cand");
    assert!(why.starts_with("protocol error: "), "{why}");
    assert!(
        why.contains("logits.safetensors is a FIFO, not a regular file"),
        "{why}"
    );
    assert_eq!(f.verdict(PAIR), "blocked");
}

#[test]
fn a_linked_artifact_is_refused_and_its_target_left_alone() {
    let f = Fixture::new(&manifest(
        "shell = true\nrun = [\"ln -s \\\"$PWD/outside.safetensors\\\" \\\"$MEMRA_ORCH_ARTIFACTS/logits.safetensors\\\"\"]",
        &compare("logits.safetensors", ""),
    ));
    let target = f.path().join("outside.safetensors");
    std::fs::write(&target, b"not for the receipt").unwrap();
    let before = std::fs::metadata(&target).unwrap();
    f.run(&[]);
    let why = reason(&f, "cand");
    assert_eq!(f.verdict("cand"), "error", "{why}");
    assert!(why.starts_with("protocol error: "), "{why}");
    assert!(
        why.contains("logits.safetensors is a symbolic link"),
        "{why}"
    );
    assert!(
        f.receipt("cand")["artifacts"]
            .as_array()
            .unwrap()
            .is_empty(),
        "nothing of the target is recorded"
    );
    assert_eq!(f.verdict(PAIR), "blocked");
    assert_eq!(std::fs::read(&target).unwrap(), b"not for the receipt");
    let after = std::fs::metadata(&target).unwrap();
    assert_eq!(before.modified().unwrap(), after.modified().unwrap());
}

#[test]
fn a_linked_artifacts_folder_is_a_protocol_error() {
    let f = Fixture::new(&format!(
        "{HEADER}[[arm]]\nid = \"swap\"\nshell = true\n\
         run = [\"rmdir \\\"$MEMRA_ORCH_ARTIFACTS\\\" && ln -s \\\"$PWD/elsewhere\\\" \\\"$MEMRA_ORCH_ARTIFACTS\\\"\"]\n"
    ));
    std::fs::create_dir(f.path().join("elsewhere")).unwrap();
    std::fs::write(f.path().join("elsewhere/secret"), b"x").unwrap();
    f.run(&[]);
    let why = reason(&f, "swap");
    assert_eq!(f.verdict("swap"), "error", "{why}");
    assert!(why.starts_with("protocol error: "), "{why}");
    assert!(why.contains("artifacts is a symbolic link"), "{why}");
}

#[test]
fn a_linked_checks_file_is_a_protocol_error_and_never_read() {
    let f = Fixture::new(&format!(
        "{HEADER}[[arm]]\nid = \"swap\"\nshell = true\n\
         run = [\"rm \\\"$MEMRA_ORCH_CHECKS\\\" && ln -s \\\"$PWD/rows.jsonl\\\" \\\"$MEMRA_ORCH_CHECKS\\\"\"]\n"
    ));
    std::fs::write(
        f.path().join("rows.jsonl"),
        "{\"check\":\"planted\",\"status\":\"pass\"}\n",
    )
    .unwrap();
    f.run(&[]);
    let r = f.receipt("swap");
    assert_eq!(r["verdict"], "error", "{r:#}");
    let why = reason(&f, "swap");
    assert!(why.starts_with("protocol error: "), "{why}");
    assert!(why.contains("checks.jsonl is a symbolic link"), "{why}");
    assert!(r["checks"].as_array().unwrap().is_empty(), "{r:#}");
}

#[test]
fn a_hung_compare_ends_timeout_at_its_deadline() {
    let f = Fixture::new(&manifest(
        "run = [\"{gates}/logits.sh\", \"same\"]",
        &compare("logits.safetensors", "timeout = \"2s\"\n"),
    ));
    let t = Instant::now();
    let mut child = Guard(
        f.command(&[])
            .env("MEMRA_ORCH_TEST_HOLD_COMPARE", "1")
            .stdout(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let status = exits_within(&mut child, Duration::from_secs(30));
    assert_eq!(status.code(), Some(1), "{:?}", t.elapsed());
    let r = f.receipt(PAIR);
    assert_eq!(r["verdict"], "timeout", "{r:#}");
    let secs = r["attempts"][0]["seconds"].as_f64().unwrap();
    assert!((2.0..10.0).contains(&secs), "{secs}");
    assert!(reason(&f, PAIR).starts_with("timed out after 2s"), "{r:#}");
}

/// Kills the run if the test ends before it does.
struct Guard(Child);

impl Drop for Guard {
    fn drop(&mut self) {
        if matches!(self.0.try_wait(), Ok(None)) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// Waits for the run to exit, failing the test if it takes longer than `limit`.
fn exits_within(child: &mut Guard, limit: Duration) -> std::process::ExitStatus {
    let t = Instant::now();
    loop {
        if let Some(s) = child.0.try_wait().unwrap() {
            return s;
        }
        assert!(t.elapsed() < limit, "the run did not exit within {limit:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn ctrl_c_cancels_a_hung_compare_and_the_run_exits_promptly() {
    let f = Fixture::new(&manifest(
        "run = [\"{gates}/logits.sh\", \"same\"]",
        &compare("logits.safetensors", ""),
    ));
    let mut child = Guard(
        f.command(&[])
            .env("MEMRA_ORCH_TEST_HOLD_COMPARE", "1")
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let (tx, rx) = mpsc::channel();
    let stderr = child.0.stderr.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let line = rx
            .recv_timeout(deadline.saturating_duration_since(Instant::now()))
            .expect("the compare never started");
        if line.starts_with("start") && line.contains(PAIR) {
            break;
        }
    }
    // The comparison is held now; give it a moment to be inside it.
    std::thread::sleep(Duration::from_millis(300));
    // SAFETY: signalling the child we spawned, by its pid.
    unsafe { libc_kill(child.0.id() as i32, 2) };
    let status = exits_within(&mut child, Duration::from_secs(20));
    assert_eq!(status.code(), Some(130));
    let r = f.receipt(PAIR);
    assert_eq!(r["verdict"], "cancelled", "{r:#}");
    assert_eq!(r["attempts"][0]["outcome"], "cancelled");
    assert_eq!(read_json(&f.tree().join("run.json"))["interrupted"], true);
}

unsafe extern "C" {
    #[link_name = "kill"]
    fn libc_kill(pid: i32, sig: i32) -> i32;
}

/// `memra-orch show` on one node of the fixture's tree.
fn show(f: &Fixture, node: &str, format: &str) -> String {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_memra-orch"))
        .arg("show")
        .arg(f.tree())
        .arg(node)
        .args(["--format", format])
        .output()
        .unwrap();
    assert!(out.status.code().is_some(), "{out:?}");
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn show_prints_a_compare_as_a_table() {
    let f = Fixture::new(&manifest(
        "run = [\"{gates}/logits.sh\", \"moved\"]",
        &compare("logits.safetensors", ""),
    ));
    f.run(&[]);
    assert_eq!(f.verdict(PAIR), "fail");
    let text = show(&f, PAIR, "text");
    let start = text.find("\ncompare:").expect("a compare section");
    let table = text[start..].replace(&*f.tree().to_string_lossy(), "[tree]");
    let slug = f.receipt(PAIR)["slug"].as_str().unwrap().to_string();
    let table = table
        .replace(f.receipt("ref")["slug"].as_str().unwrap(), "[ref]")
        .replace(f.receipt("cand")["slug"].as_str().unwrap(), "[cand]")
        .replace(&slug, "[pair]");
    insta::assert_snapshot!(table);
    // The JSON view stays the stored report.
    let json: serde_json::Value = serde_json::from_str(&show(&f, PAIR, "json")).unwrap();
    assert_eq!(json["compare"]["mismatches"], 1);
}

#[test]
fn show_escapes_control_characters_a_gate_wrote() {
    let f = Fixture::new(&format!(
        "{HEADER}[[arm]]\nid = \"loud\"\nshell = true\n\
         run = [\"printf '{{\\\"check\\\":\\\"c\\\",\\\"status\\\":\\\"fail\\\",\\\"message\\\":\\\"\\\\\\\\u001b[2Jgone\\\\\\\\u0000\\\"}}\\\\n' >> \\\"$MEMRA_ORCH_CHECKS\\\"; exit 1\"]\n"
    ));
    f.run(&[]);
    let r = f.receipt("loud");
    assert_eq!(
        r["checks"][0]["message"], "\u{1b}[2Jgone\u{0}",
        "the receipt keeps what the gate wrote: {r:#}"
    );
    let text = show(&f, "loud", "text");
    assert!(!text.contains('\u{1b}') && !text.contains('\0'), "{text:?}");
    assert!(text.contains("\\x1b[2Jgone\\x00"), "{text}");
}

#[test]
fn show_prints_argmax_agreement_for_argmax_policies() {
    let f = Fixture::new(&manifest(
        "run = [\"{gates}/logits.sh\", \"moved\"]",
        "[[compare]]\nid = \"pair\"\nreference = \"ref\"\ncandidates = [\"cand\"]\n\
         artifact = \"logits.safetensors\"\npolicy = { min_agree = 1.0 }\n",
    ));
    f.run(&[]);
    let text = show(&f, PAIR, "text");
    let rows: Vec<&str> = text.lines().skip_while(|l| *l != "compare:").collect();
    assert!(rows.iter().any(|l| l.ends_with("argmax agree")), "{text}");
    // Row 0 is [1, 1] against [1, 2]: the argmax moves from index 0 to 1.
    assert!(
        rows.iter()
            .any(|l| l.starts_with("  logits") && l.ends_with("0/1")),
        "{text}"
    );
    assert!(text.contains("(argmax: ref 0, got 1)"), "{text}");
    assert!(text.contains("policy:    { min_agree = 1 }"), "{text}");
}
