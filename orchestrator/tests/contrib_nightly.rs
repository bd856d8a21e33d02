//! The shipped nightly wrapper (`contrib/memra-nightly`) and its cron and systemd units, run
//! as a night would run them: a git remote, a checkout the wrapper pulls, a manifest whose
//! `[notify]` command records the morning summary, a commit pushed between two nights that
//! makes the gate fail. Also what must never pass quietly: a night whose lock is still
//! held, a build that fails, a configuration that names nothing. The units pass
//! `systemd-analyze verify` (skipped, loudly, where it is not installed, except in CI).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use crate::diff_support::git_at as git;
use crate::run_support::gates;

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// A remote, a clone to push from and the nightly's own checkout.
struct Night {
    dir: tempfile::TempDir,
}

impl Night {
    fn new() -> Night {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        git(d, &["init", "-q", "--bare", "-b", "main", "origin.git"]);
        git(d, &["clone", "-q", "origin.git", "work"]);
        let work = d.join("work");
        git(&work, &["checkout", "-q", "-b", "main"]);
        std::fs::write(
            work.join("manifest.toml"),
            format!(
                r#"schema = 1
name = "wrapped"

[notify]
command = ["./notify.sh"]
on = ["always"]

[[arm]]
id = "quality"
run = ["{}/nightly.sh", "@${{root}}/mode", "0.25", "x"]
gpus = 0
"#,
                gates().display()
            ),
        )
        .unwrap();
        std::fs::write(work.join("mode"), "pass\n").unwrap();
        std::fs::write(work.join(".gitignore"), "receipts/\n").unwrap();
        let notify = work.join("notify.sh");
        std::fs::write(&notify, "#!/bin/sh\ncat > \"$NOTIFY_OUT\"\n").unwrap();
        let mut p = std::fs::metadata(&notify).unwrap().permissions();
        std::os::unix::fs::PermissionsExt::set_mode(&mut p, 0o755);
        std::fs::set_permissions(&notify, p).unwrap();
        git(&work, &["add", "-A"]);
        git(&work, &["commit", "-q", "-m", "a battery"]);
        git(&work, &["push", "-q", "origin", "main"]);
        git(d, &["clone", "-q", "-b", "main", "origin.git", "nightly"]);
        Night { dir }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Writes a configuration with `extra` lines appended and returns its path.
    fn config(&self, extra: &str) -> PathBuf {
        let d = self.path();
        let text = format!(
            "MEMRA_REPO={}\nMEMRA_MANIFEST=manifest.toml\nMEMRA_BUILD=true\nMEMRA_ORCH={}\n\
             MEMRA_RUN_ARGS=\"--gpus none\"\nMEMRA_LOG_DIR={}\nMEMRA_NOTIFY=\"cat > {}\"\n{extra}",
            d.join("nightly").display(),
            env!("CARGO_BIN_EXE_memra-orch"),
            d.join("logs").display(),
            d.join("wrapper-told.txt").display(),
        );
        let path = d.join("nightly.env");
        std::fs::write(&path, text).unwrap();
        path
    }

    fn wrapper(&self, config: &Path) -> Output {
        let out = Command::new(repo_root().join("contrib/memra-nightly"))
            .arg(config)
            .env("NOTIFY_OUT", self.path().join("summary-got.txt"))
            .env("MEMRA_GPU_LOCK_DIR", self.path().join("leases"))
            .current_dir(self.path())
            .output()
            .unwrap();
        eprintln!(
            "--- wrapper exit {:?}\n{}{}",
            out.status.code(),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        out
    }

    fn read(&self, name: &str) -> String {
        std::fs::read_to_string(self.path().join(name)).unwrap_or_default()
    }

    fn logs(&self) -> Vec<PathBuf> {
        let mut l: Vec<PathBuf> = std::fs::read_dir(self.path().join("logs"))
            .map(|r| r.flatten().map(|e| e.path()).collect())
            .unwrap_or_default();
        l.retain(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("nightly-")
        });
        l.sort();
        l
    }

    fn push_mode(&self, mode: &str) -> String {
        let work = self.path().join("work");
        std::fs::write(work.join("mode"), format!("{mode}\n")).unwrap();
        git(&work, &["commit", "-q", "-am", &format!("gate: {mode}")]);
        git(&work, &["push", "-q", "origin", "main"]);
        let out = Command::new("git")
            .arg("-C")
            .arg(&work)
            .args(["rev-parse", "HEAD"])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }
}

#[test]
fn two_nights_pull_build_run_and_send_the_morning_summary() {
    let n = Night::new();
    let config = n.config("MEMRA_KEEP_LOGS=2\n");
    let first = n.wrapper(&config);
    assert_eq!(first.status.code(), Some(0));
    let got = n.read("summary-got.txt");
    assert!(got.starts_with("PASS wrapped run "), "{got}");
    let logs = n.logs();
    assert_eq!(logs.len(), 1);
    let log = std::fs::read_to_string(&logs[0]).unwrap();
    for want in [
        "pull: origin main",
        "build: true",
        "run ended with exit 0",
        "summary:",
        "PASS wrapped run ",
        "notify: sent the summary to ./notify.sh",
    ] {
        assert!(log.contains(want), "{want:?} not in the log:\n{log}");
    }
    assert!(
        n.read("wrapper-told.txt").is_empty(),
        "a good night tells MEMRA_NOTIFY nothing"
    );

    // A commit makes the gate fail; the next night pulls it and says so first.
    let sha = n.push_mode("fail");
    let second = n.wrapper(&config);
    assert_eq!(second.status.code(), Some(1));
    let head = Command::new("git")
        .arg("-C")
        .arg(n.path().join("nightly"))
        .args(["rev-parse", "HEAD"])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&head.stdout).trim(), sha);
    let got = n.read("summary-got.txt");
    let lines: Vec<&str> = got.lines().collect();
    assert!(
        lines[0].starts_with("FAIL wrapped run ") && lines[0].contains("1 regression"),
        "{got}"
    );
    assert!(
        got.contains("REGRESSED quality pass -> fail: quality: err 0.25 is above the bound 0.5"),
        "{got}"
    );
    assert!(
        got.contains(&sha[..12]),
        "the night names the commit it ran:\n{got}"
    );
    assert!(
        lines[1].starts_with("gate: fail · 1 cells: fail 1"),
        "and its subject:\n{got}"
    );
    // A third night: the logs kept are the newest two.
    n.wrapper(&config);
    assert_eq!(n.logs().len(), 2);
}

#[test]
fn a_night_that_cannot_run_is_told_and_never_passes() {
    let n = Night::new();
    // The build fails: nothing runs, MEMRA_NOTIFY hears of it, exit 77.
    let broken = n.config("MEMRA_BUILD=false\n");
    let out = n.wrapper(&broken);
    assert_eq!(out.status.code(), Some(77));
    let told = n.read("wrapper-told.txt");
    assert!(
        told.starts_with("FAIL memra nightly on ") && told.contains("the build failed"),
        "{told}"
    );
    assert!(!n.path().join("nightly/receipts").exists(), "nothing ran");

    // The last night still holds the lock: this one does not run, and says so (exit 75).
    let config = n.config("");
    std::fs::create_dir_all(n.path().join("logs")).unwrap();
    let lock = n.path().join("logs/.lock");
    let holder = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&lock)
        .unwrap();
    holder.lock().unwrap();
    let out = n.wrapper(&config);
    drop(holder);
    assert_eq!(out.status.code(), Some(75));
    assert!(
        n.read("wrapper-told.txt")
            .contains("another night still holds"),
        "{}",
        n.read("wrapper-told.txt")
    );

    // A pull that cannot fast-forward (a local commit in the nightly's checkout).
    let nightly = n.path().join("nightly");
    std::fs::write(nightly.join("local.txt"), "x").unwrap();
    git(&nightly, &["add", "local.txt"]);
    git(&nightly, &["commit", "-q", "-m", "local"]);
    n.push_mode("fail");
    let out = n.wrapper(&config);
    assert_eq!(out.status.code(), Some(76));
    assert!(n.read("wrapper-told.txt").contains("cannot fast-forward"));

    // A configuration that names nothing is refused with the fix.
    let out = n.wrapper(&n.path().join("no-such.env"));
    assert_eq!(out.status.code(), Some(64));
    assert!(String::from_utf8_lossy(&out.stderr).contains("copy contrib/nightly.env.example"));
    let bad = n.path().join("bad.env");
    std::fs::write(&bad, "MEMRA_MANIFEST=manifest.toml\n").unwrap();
    let out = n.wrapper(&bad);
    assert_eq!(out.status.code(), Some(64));
    assert!(String::from_utf8_lossy(&out.stderr).contains("set MEMRA_REPO"));
    let typo = n.config("MEMRA_PULL=yes\n");
    let out = n.wrapper(&typo);
    assert_eq!(out.status.code(), Some(64));
    assert!(String::from_utf8_lossy(&out.stderr).contains("MEMRA_PULL=yes: write 1"));
}

#[test]
fn a_night_refused_before_it_ran_never_logs_an_old_summary_as_its_own() {
    let n = Night::new();
    assert_eq!(n.wrapper(&n.config("")).status.code(), Some(0));
    // Tonight the machine lacks what the run requires: nothing runs (exit 4).
    let out = n.wrapper(&n.config("MEMRA_RUN_ARGS=\"--gpus none --require-gpus 1\"\n"));
    assert_eq!(out.status.code(), Some(4));
    let log = n
        .logs()
        .iter()
        .map(|p| std::fs::read_to_string(p).unwrap())
        .find(|l| l.contains("run ended with exit 4"))
        .expect("tonight's log");
    assert!(
        log.contains("summary: none, no run tonight (exit 4)"),
        "{log}"
    );
    assert!(!log.contains("PASS wrapped run"), "{log}");
    assert!(
        n.read("wrapper-told.txt")
            .contains("memra-orch run exited 4")
    );
}

#[test]
fn the_units_pass_systemd_analyze_verify_and_the_cron_line_is_well_formed() {
    let root = repo_root();
    let contrib = root.join("contrib");
    let cron = std::fs::read_to_string(contrib.join("cron/memra-nightly")).unwrap();
    let jobs: Vec<&str> = cron
        .lines()
        .filter(|l| !l.trim().is_empty() && !l.starts_with('#') && !l.contains('='))
        .collect();
    assert_eq!(jobs.len(), 1, "{cron}");
    let fields: Vec<&str> = jobs[0].split_whitespace().collect();
    // minute hour day month weekday user command config
    assert_eq!(fields.len(), 8, "{}", jobs[0]);
    assert!(
        fields[..5]
            .iter()
            .all(|f| f.chars().all(|c| c.is_ascii_digit() || c == '*'))
    );
    assert!(fields[6].ends_with("/contrib/memra-nightly"));

    let service = std::fs::read_to_string(contrib.join("systemd/memra-nightly.service")).unwrap();
    assert!(service.contains("ExecStart=/opt/memra/contrib/memra-nightly /etc/memra/nightly.env"));
    assert!(service.contains("KillSignal=SIGINT"));
    if Command::new("systemd-analyze")
        .arg("--version")
        .output()
        .is_err()
    {
        assert!(
            std::env::var_os("CI").is_none(),
            "systemd-analyze is not installed; CI must verify the units (apt-get install systemd)"
        );
        eprintln!("skipped: systemd-analyze is not installed; the units were not verified");
        return;
    }
    // The units as installed here: the wrapper at this checkout's path, run as root.
    let dir = tempfile::tempdir().unwrap();
    let wrapper = contrib.join("memra-nightly");
    std::fs::write(
        dir.path().join("memra-nightly.service"),
        service
            .replace(
                "/opt/memra/contrib/memra-nightly",
                &wrapper.to_string_lossy(),
            )
            .replace("User=memra", "User=root")
            .replace("Group=memra", "Group=root"),
    )
    .unwrap();
    std::fs::copy(
        contrib.join("systemd/memra-nightly.timer"),
        dir.path().join("memra-nightly.timer"),
    )
    .unwrap();
    let out = Command::new("systemd-analyze")
        .args(["verify", "--man=no"])
        .arg(dir.path().join("memra-nightly.service"))
        .arg(dir.path().join("memra-nightly.timer"))
        .output()
        .unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // Outside a booted systemd (a container) verify may note that it cannot reach the
    // manager; anything about the units themselves fails the test.
    let about_units: Vec<&str> = said
        .lines()
        .filter(|l| l.contains("memra-nightly"))
        .collect();
    assert!(about_units.is_empty(), "{said}");
    assert!(
        out.status.success() || !said.contains("memra-nightly"),
        "{said}"
    );
}
