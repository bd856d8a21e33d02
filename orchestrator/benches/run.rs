//! Overhead of `memra-orch run` per arm: 224 (the shipped nightly's cell count) and 1,000
//! trivial arms (`true`) at `--jobs 2`, packed (the default) and `--no-pack`, next to the
//! same processes spawned by a bare loop on two threads, in the same process. Prints a table
//! per count; `cargo bench -p memra-orch --bench run`. The receipts and the attempts' TMPDIRs
//! go to the temporary folder (`TMPDIR`, default /tmp), whose file system the table names:
//! creating and removing files is most of the overhead, so `TMPDIR=/path/on/the/nightly/disk`
//! measures the disk the nightly writes to.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const ROUNDS: usize = 3;

fn manifest(dir: &Path, arms: usize) -> std::path::PathBuf {
    let values: Vec<String> = (0..arms).map(|i| format!("\"{i}\"")).collect();
    let text = format!(
        "schema = 1\nname = \"bench\"\n\n[[arm]]\nid = \"t\"\nrun = [\"true\"]\ngpus = 0\nmatrix = {{ i = [{}] }}\n",
        values.join(", ")
    );
    let path = dir.join(format!("bench-{arms}.toml"));
    std::fs::write(&path, text).unwrap();
    path
}

/// `arms` `true` processes, two threads spawning and waiting in turn.
fn bare_loop(arms: usize) -> Duration {
    let t = Instant::now();
    std::thread::scope(|s| {
        for _ in 0..2 {
            s.spawn(|| {
                for _ in 0..arms / 2 {
                    let ok = Command::new("true")
                        .stdin(Stdio::null())
                        .stdout(Stdio::null())
                        .stderr(Stdio::null())
                        .status()
                        .unwrap()
                        .success();
                    assert!(ok);
                }
            });
        }
    });
    t.elapsed()
}

/// One `memra-orch run` of the 1,000-arm manifest, receipts into a fresh folder.
fn orchestrated(manifest: &Path, receipts: &Path, extra: &[&str]) -> Duration {
    let t = Instant::now();
    let out = Command::new(env!("CARGO_BIN_EXE_memra-orch"))
        .arg("run")
        .arg(manifest)
        .arg("--receipts")
        .arg(receipts)
        .args(["--commit", "bench", "--jobs", "2", "--progress", "quiet"])
        .args(extra)
        .output()
        .unwrap();
    let elapsed = t.elapsed();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    elapsed
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn main() {
    for arms in [224, 1000] {
        table(arms);
    }
}

fn table(arms: usize) {
    let dir = tempfile::tempdir().unwrap();
    let manifest = manifest(dir.path(), arms);
    let mut bare = Vec::new();
    let mut orch = Vec::new();
    let mut unpacked = Vec::new();
    for round in 0..ROUNDS {
        bare.push(bare_loop(arms));
        orch.push(orchestrated(
            &manifest,
            &dir.path().join(format!("receipts-{round}")),
            &[],
        ));
        unpacked.push(orchestrated(
            &manifest,
            &dir.path().join(format!("unpacked-{round}")),
            &["--no-pack"],
        ));
    }
    // Every arm has its receipt: in the packed run's archive, in the other run's tree.
    let run_dir = |receipts: &str| {
        std::fs::read_dir(dir.path().join(receipts).join("bench/bench"))
            .unwrap()
            .flatten()
            .map(|e| e.path())
            .find(|p| p.join("run.json").is_file())
            .unwrap()
    };
    let packed = run_dir("receipts-0").join("nodes.zip");
    let receipts = memra_orch::gate::packed::files_below(&packed.with_file_name("nodes"))
        .unwrap()
        .unwrap_or_default()
        .iter()
        .filter(|p| p.ends_with("receipt.json"))
        .count();
    assert_eq!(
        receipts,
        arms,
        "every arm has its receipt in {}",
        packed.display()
    );
    let tree = run_dir("unpacked-0").join("nodes");
    assert_eq!(
        std::fs::read_dir(&tree).map(|d| d.count()).unwrap_or(0),
        arms
    );
    let (b, o, u) = (median(bare), median(orch), median(unpacked));
    let per = |d: Duration| d.as_secs_f64() * 1e3 / arms as f64;
    println!(
        "\n{arms} trivial arms (`true`), 2 parallel, median of {ROUNDS} rounds, receipts in {} ({})",
        dir.path().display(),
        file_system(dir.path())
    );
    println!("| what                                       | wall s | ms per arm |");
    println!("|--------------------------------------------|-------:|-----------:|");
    println!(
        "| bare spawn loop, 2 threads                 | {:>6.3} | {:>10.3} |",
        b.as_secs_f64(),
        per(b)
    );
    println!(
        "| memra-orch run --jobs 2 --no-pack (a tree) | {:>6.3} | {:>10.3} |",
        u.as_secs_f64(),
        per(u)
    );
    println!(
        "| memra-orch run --jobs 2 (packed, default)  | {:>6.3} | {:>10.3} |",
        o.as_secs_f64(),
        per(o)
    );
    println!(
        "| orchestration overhead, --no-pack          | {:>6.3} | {:>10.3} |",
        (u.saturating_sub(b)).as_secs_f64(),
        per(u.saturating_sub(b))
    );
    println!(
        "| orchestration overhead, packed             | {:>6.3} | {:>10.3} |",
        (o.saturating_sub(b)).as_secs_f64(),
        per(o.saturating_sub(b))
    );
}

/// The file system `dir` is on, by its statfs magic number.
fn file_system(dir: &Path) -> String {
    use std::os::unix::ffi::OsStrExt as _;
    let Ok(c) = std::ffi::CString::new(dir.as_os_str().as_bytes()) else {
        return "unknown".into();
    };
    // SAFETY: statfs writes only into the zeroed struct it is given; `c` is a valid C string.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statfs(c.as_ptr(), &mut st) } != 0 {
        return "unknown".into();
    }
    match st.f_type as i64 {
        0xEF53 => "ext4".into(),
        0x0102_1994 => "tmpfs".into(),
        0x5846_5342 => "xfs".into(),
        0x9123_683E => "btrfs".into(),
        0x794C_7630 => "overlayfs".into(),
        other => format!("file system 0x{other:x}"),
    }
}
