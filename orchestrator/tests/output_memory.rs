//! Memory use of reading what a gate left: `checks.jsonl` is parsed line by line keeping at
//! most the receipt's rows, and text verdicts scan stdout line by line, so the peak resident
//! size stays far below the files' sizes. Each measurement runs in a child process (this
//! test binary again, running [`child`]) that reports its peak resident size (`VmHWM`).
//!
//! The ordinary test uses 32 MB of checks and 128 MB of stdout, which the whole-file
//! readers needed 480 MB and 256 MB for; the `#[ignore]`d one is the full measurement
//! (200 MB of checks, 2 GB of stdout), run by hand:
//! `cargo test --locked -p memra-orch --test integration output_memory::full -- --ignored --nocapture`.

use std::io::{BufWriter, Write};
use std::path::Path;
use std::process::Command;

use memra_orch::gate::checks::{MAX_ROWS, judge_text_file, read_checks};
use memra_orch::plan::TextVerdict;
use memra_orch::words::verdict::Verdict;
use regex::Regex;

/// The peak resident size the whole-file readers would far exceed.
const LIMIT_KB: u64 = 100 * 1024;

/// Writes `bytes` (about) of check rows the way a gate writes them, with a failing row at
/// the end.
fn write_checks(path: &Path, bytes: u64) {
    let mut w = BufWriter::new(std::fs::File::create(path).unwrap());
    let mut written = 0u64;
    let mut i = 0u64;
    while written < bytes {
        let line = format!(
            "{{\"check\":\"decode-row-{i}\",\"status\":\"pass\",\"metrics\":{{\"maxdiff\":0.0,\"compared\":49152}},\"message\":\"row {i} agrees bit for bit\"}}\n"
        );
        written += line.len() as u64;
        w.write_all(line.as_bytes()).unwrap();
        i += 1;
    }
    w.write_all(b"{\"check\":\"last\",\"status\":\"fail\",\"message\":\"the last row\"}\n")
        .unwrap();
    w.write_all(b"{\"doors\":{\"backend\":\"cpu\"}}\n").unwrap();
}

/// Writes `bytes` (about) of log lines with `ALL GREEN` as the last line.
fn write_stdout(path: &Path, bytes: u64) {
    let mut w = BufWriter::with_capacity(1 << 20, std::fs::File::create(path).unwrap());
    let line = b"step 000123: tokens 4096 tok/s 1234.5 loss 0.000 everything is fine here, go on\n";
    let mut written = 0u64;
    while written < bytes {
        w.write_all(line).unwrap();
        written += line.len() as u64;
    }
    w.write_all(b"ALL GREEN\n").unwrap();
}

/// Runs [`child`] in a new process of this binary on `job` and returns its peak resident
/// size in kB, printing it.
fn peak_kb(job: &str, path: &Path, size: u64) -> u64 {
    let out = Command::new(std::env::current_exe().unwrap())
        .args([
            "output_memory::child",
            "--exact",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("MEMRA_TEST_MEMORY_JOB", job)
        .env("MEMRA_TEST_MEMORY_FILE", path)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let field = |name: &str| -> u64 {
        // The harness may print `test … ` before the first line.
        text.lines()
            .find_map(|l| l.find(name).map(|i| &l[i + name.len()..]))
            .unwrap_or_else(|| panic!("no {name} in {text}"))
            .trim()
            .parse()
            .unwrap()
    };
    let (before, peak) = (field("baseline_kb:"), field("peak_kb:"));
    println!(
        "{job}: {} MB read, peak resident {} MB (the process before reading: {} MB)",
        size >> 20,
        peak / 1024,
        before / 1024
    );
    peak
}

fn measure(checks_bytes: u64, stdout_bytes: u64) {
    let dir = tempfile::tempdir().unwrap();
    let checks = dir.path().join("checks.jsonl");
    write_checks(&checks, checks_bytes);
    let peak = peak_kb("checks", &checks, checks_bytes);
    assert!(peak < LIMIT_KB, "checks: peak {peak} kB");
    std::fs::remove_file(&checks).unwrap();
    let stdout = dir.path().join("stdout.log");
    write_stdout(&stdout, stdout_bytes);
    let peak = peak_kb("stdout", &stdout, stdout_bytes);
    assert!(peak < LIMIT_KB, "stdout: peak {peak} kB");
}

#[test]
fn reading_large_outputs_stays_small() {
    measure(32 << 20, 128 << 20);
}

#[test]
#[ignore = "writes 2 GB; run by hand for the figures"]
fn full() {
    measure(200 << 20, 2 << 30);
}

fn vm_hwm_kb() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmHWM in /proc/self/status")
}

/// The measuring side, run by [`peak_kb`] in a child process; without its job variable (a
/// plain `--ignored` run) it has nothing to measure and returns.
#[test]
#[ignore = "the child process of output_memory's measurements"]
fn child() {
    let (Some(job), Some(file)) = (
        std::env::var_os("MEMRA_TEST_MEMORY_JOB"),
        std::env::var_os("MEMRA_TEST_MEMORY_FILE"),
    ) else {
        return;
    };
    let path = Path::new(&file);
    println!("baseline_kb: {}", vm_hwm_kb());
    match job.to_str().unwrap() {
        "checks" => {
            let r = read_checks(path);
            assert!(r.problems.is_empty(), "{:?}", r.problems);
            // The kept prefix, the failing row at the end, the row counting the rest.
            assert_eq!(r.checks.len(), MAX_ROWS + 2);
            assert_eq!(r.first_failed().unwrap().check, "last");
            assert!(r.doors.is_some());
        }
        "stdout" => {
            let tv = TextVerdict {
                pass: Some(Regex::new("^ALL GREEN").unwrap()),
                fail: Some(Regex::new("FAIL").unwrap()),
            };
            assert_eq!(judge_text_file(&tv, path).0, Verdict::Pass);
        }
        other => panic!("unknown job {other}"),
    }
    println!("peak_kb: {}", vm_hwm_kb());
}
