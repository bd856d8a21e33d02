//! `memra-orch diff` end to end: a scratch git repository runs a battery of fixture gates at
//! two commits, and the diff between the two receipt trees must name a regression, a fix, a
//! node still failing, bits moved (with the artifact), metric drift, a doors change, a new
//! node and a passing node removed (lost coverage), in text, markdown and JSON (snapshots
//! with commits, times and paths redacted), exit 1 because something regressed, and find
//! nothing between a run and itself. Lost coverage (passed, now skipped or absent) fails the
//! diff unless `--allow-lost`; a removed node that was not passing stays a removed node.

use crate::diff_support::{HEADER, Repo, arm, have_git, stdout};

struct Two {
    repo: Repo,
    old: String,
    new: String,
}

fn two_commits() -> Option<Two> {
    if !have_git() {
        eprintln!("skipped: git is not available, and diff resolves commits through git");
        return None;
    }
    let repo = Repo::new();
    let one = [
        HEADER.to_string(),
        arm("steady", "pass", "0.5", "same", "fast"),
        arm("regress", "pass", "0.5", "r", "fast"),
        arm("fixed", "fail", "0.5", "f", "fast"),
        arm("stuck", "fail", "0.5", "s", "fast"),
        arm("moved", "pass", "0.5", "bits-1", "fast"),
        arm("drift", "pass", "1.0", "d", "fast"),
        arm("rerouted", "pass", "0.5", "x", "fast"),
        arm("gone", "pass", "0.5", "g", "fast"),
    ]
    .concat();
    let old = repo.commit(&[("manifest.toml", &one)], "one");
    let out = repo.run("manifest.toml");
    assert_eq!(
        out.status.code(),
        Some(1),
        "two cells fail at the first commit"
    );
    let two = [
        HEADER.to_string(),
        arm("steady", "pass", "0.5", "same", "fast"),
        arm("regress", "fail", "0.5", "r", "fast"),
        arm("fixed", "pass", "0.5", "f", "fast"),
        arm("stuck", "fail", "0.5", "s", "fast"),
        arm("moved", "pass", "0.5", "bits-2", "fast"),
        arm("drift", "pass", "1.2", "d", "fast"),
        arm("rerouted", "pass", "0.5", "x", "slow"),
        arm("fresh", "pass", "0.5", "n", "fast"),
    ]
    .concat();
    let new = repo.commit(&[("manifest.toml", &two)], "two");
    let out = repo.run("manifest.toml");
    assert_eq!(out.status.code(), Some(1));
    assert!(repo.tree(&old, "battery").join("run.json").is_file());
    assert!(repo.tree(&new, "battery").join("run.json").is_file());
    Some(Two { repo, old, new })
}

/// Snapshot settings that replace what differs from run to run: the two commits, times,
/// the scratch folder, the manifest digests and floating-point timings.
fn redacted(two: &Two) -> insta::Settings {
    let mut s = insta::Settings::clone_current();
    let root = two.repo.path().to_string_lossy().into_owned();
    let canonical = two.repo.path().canonicalize().unwrap();
    s.add_filter(&regex::escape(&canonical.to_string_lossy()), "[repo]");
    s.add_filter(&regex::escape(&root), "[repo]");
    s.add_filter(&two.old, "[old-commit]");
    s.add_filter(&two.new, "[new-commit]");
    s.add_filter(&two.old[..12], "[old-commit]");
    s.add_filter(&two.new[..12], "[new-commit]");
    s.add_filter(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z", "[time]");
    s.add_filter(r"\d{8}T\d{6}\.\d{3}Z-[0-9a-f]{4}", "[run-id]");
    s.add_filter(
        r"manifest sha256: [0-9a-f]+ → [0-9a-f]+",
        "manifest sha256: [a] → [b]",
    );
    s.add_filter(
        r"\| manifest sha256 \| [0-9a-f]+ \| [0-9a-f]+ \|",
        "| manifest sha256 | [a] | [b] |",
    );
    s
}

#[test]
fn two_commits_diff_in_three_formats() {
    let Some(two) = two_commits() else { return };
    let settings = redacted(&two);
    let text = two
        .repo
        .orch(&["diff", "HEAD~1", "HEAD", "--color", "never"]);
    assert_eq!(
        text.status.code(),
        Some(1),
        "a regression makes the diff exit 1"
    );
    let text = stdout(&text);
    for needle in [
        "REGRESSIONS (1)",
        "regress",
        "FIXES (1)",
        "STILL FAILING (1)",
        "BITS MOVED (1)",
        "out.bin",
        "METRIC DRIFT",
        "max_abs: 1.0 → 1.2 (+20.0%)",
        "DOORS CHANGED (1)",
        "NEW NODES (1)",
        "fresh",
        "LOST COVERAGE (1)",
        "gone     pass → absent",
    ] {
        assert!(text.contains(needle), "{needle:?} missing from\n{text}");
    }
    assert!(!text.contains('\x1b'), "--color never writes no escapes");
    settings.bind(|| insta::assert_snapshot!("text", text));

    let md = two
        .repo
        .orch(&["diff", "HEAD~1", "HEAD", "--format", "markdown"]);
    assert_eq!(md.status.code(), Some(1));
    let md = stdout(&md);
    assert!(
        md.contains("### Regressions (1)") && md.contains("### Bits moved (1)"),
        "{md}"
    );
    settings.bind(|| insta::assert_snapshot!("markdown", md));

    let json = two
        .repo
        .orch(&["diff", "HEAD~1", "HEAD", "--format", "json"]);
    assert_eq!(json.status.code(), Some(1));
    let v: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    let ids = |key: &str| json_ids(&v, key);
    assert_eq!(ids("regressions"), ["regress"]);
    assert_eq!(ids("fixes"), ["fixed"]);
    assert_eq!(ids("still_failing"), ["stuck"]);
    assert_eq!(ids("bits_moved"), ["moved"]);
    assert_eq!(v["bits_moved"][0]["artifacts"][0]["name"], "out.bin");
    assert_eq!(ids("metric_drift"), ["drift", "fixed", "regress"]);
    assert_eq!(ids("doors_changed"), ["rerouted"]);
    assert_eq!(ids("new_nodes"), ["fresh"]);
    // A passing node that left the manifest is lost coverage, not merely removed.
    assert_eq!(ids("lost_coverage"), ["gone"]);
    assert_eq!(ids("removed_nodes"), Vec::<String>::new());
    settings.bind(|| insta::assert_json_snapshot!("json", v));

    // Colour on request, and NO_COLOR does not apply to an explicit `always`.
    let coloured = two
        .repo
        .orch(&["diff", "HEAD~1", "HEAD", "--color", "always"]);
    assert!(stdout(&coloured).contains("\x1b[1;31mREGRESSIONS (1)\x1b[0m"));
}

#[test]
fn commits_folders_and_latest_name_the_same_runs() {
    let Some(two) = two_commits() else { return };
    let by_commit = stdout(
        &two.repo
            .orch(&["diff", &two.old[..7], &two.new, "--format", "json"]),
    );
    let old_dir = two.repo.tree(&two.old, "battery");
    let new_dir = two.repo.tree(&two.new, "battery");
    let by_folder = stdout(&two.repo.orch(&[
        "diff",
        old_dir.to_str().unwrap(),
        new_dir.to_str().unwrap(),
        "--format",
        "json",
    ]));
    let by_age = stdout(
        &two.repo
            .orch(&["diff", "previous", "latest", "--format", "json"]),
    );
    let strip = |s: &str| {
        let mut v: serde_json::Value = serde_json::from_str(s).unwrap();
        for side in ["old", "new"] {
            v[side]["dir"] = serde_json::Value::Null;
        }
        v
    };
    assert_eq!(strip(&by_commit), strip(&by_folder));
    assert_eq!(strip(&by_commit), strip(&by_age));
    assert_eq!(strip(&by_commit)["old"]["commit"], two.old.as_str());
}

#[test]
fn a_run_diffed_with_itself_says_so() {
    let Some(two) = two_commits() else { return };
    // "No differences" would hide what changed since the run before (a green night named
    // by both `last-green` and `latest`): the diff says the two names are one run.
    for format in ["text", "markdown", "json"] {
        let out = two.repo.orch(&["diff", "HEAD", "HEAD", "--format", format]);
        // Nothing between them is no proof of health: HEAD's run has failing cells.
        assert_eq!(out.status.code(), Some(1), "{format}");
        let s = stdout(&out);
        assert!(!s.contains("no differences"), "{s}");
        match format {
            "json" => {
                let v: serde_json::Value = serde_json::from_str(&s).unwrap();
                assert!(v["same_run"].as_str().unwrap().contains(&two.new), "{v:#}");
                assert!(v["note"].as_str().unwrap().contains("name the same run"));
            }
            _ => assert!(
                s.contains("HEAD and HEAD name the same run")
                    && s.contains("that run is NOT all as expected"),
                "{s}"
            ),
        }
    }
    // Reversed, the fix is a regression: the exit code follows the direction.
    let out = two
        .repo
        .orch(&["diff", "HEAD", "HEAD~1", "--format", "json"]);
    assert_eq!(out.status.code(), Some(1));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["regressions"][0]["id"], "fixed");
}

#[test]
fn unknown_runs_are_usage_errors_that_say_what_to_pass() {
    let Some(two) = two_commits() else { return };
    let out = two.repo.orch(&["diff", "no-such-ref", "HEAD"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("\"no-such-ref\"") && err.contains("latest"),
        "{err}"
    );
    // A commit git knows but that never ran.
    let root = two.repo.git(&["rev-list", "--max-parents=0", "HEAD"]);
    assert_eq!(root, two.old);
    two.repo.commit(&[("note.txt", "x")], "three");
    let out = two.repo.orch(&["diff", "HEAD~1", "HEAD"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("has no receipts for it"), "{err}");
    let out = two
        .repo
        .orch(&["diff", "HEAD~1", "HEAD~2", "--manifest", "nope"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--manifest"));
}

#[test]
fn a_cell_that_passed_and_is_now_skipped_or_gone_is_lost_coverage() {
    if !have_git() {
        eprintln!("skipped: git is not available, and diff resolves commits through git");
        return;
    }
    let repo = Repo::new();
    let one = [
        HEADER.to_string(),
        arm("kept", "pass", "0.5", "k", "fast"),
        arm("needs-gpu", "pass", "0.5", "g", "fast"),
        arm("dropped", "pass", "0.5", "d", "fast"),
        arm("broken", "fail", "0.5", "b", "fast"),
    ]
    .concat();
    repo.commit(&[("manifest.toml", &one)], "green");
    assert_eq!(repo.run("manifest.toml").status.code(), Some(1));
    // The second night asks a GPU for `needs-gpu` (none here: skipped) and no longer has
    // `dropped` (passing) or `broken` (failing).
    let two = [
        HEADER.to_string(),
        arm("kept", "pass", "0.5", "k", "fast"),
        arm("needs-gpu", "pass", "0.5", "g", "fast"),
        "gpus = 1\n\n".to_string(),
    ]
    .concat();
    repo.commit(&[("manifest.toml", &two)], "skips");
    assert_eq!(repo.run("manifest.toml").status.code(), Some(0));

    let text = repo.orch(&["diff", "HEAD~1", "HEAD", "--color", "never"]);
    assert_eq!(text.status.code(), Some(1), "lost coverage is a regression");
    let text = stdout(&text);
    assert!(text.contains("LOST COVERAGE (2)"), "{text}");
    assert!(
        text.contains("needs-gpu  pass → skipped  needs 1 GPU, 0 detected"),
        "{text}"
    );
    assert!(text.contains("dropped    pass → absent"), "{text}");
    assert!(text.contains("REMOVED NODES (1)\n  broken"), "{text}");
    assert!(!text.contains("OTHER VERDICT CHANGES"), "{text}");

    let json = repo.orch(&["diff", "HEAD~1", "HEAD", "--format", "json"]);
    assert_eq!(json.status.code(), Some(1));
    let v: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    let ids = |key: &str| json_ids(&v, key);
    // In plan order (OLD's, where both cells were), not by name.
    assert_eq!(ids("lost_coverage"), ["needs-gpu", "dropped"]);
    assert_eq!(v["lost_coverage"][0]["new"], "skipped");
    assert_eq!(v["lost_coverage"][1]["new"], serde_json::Value::Null);
    assert_eq!(ids("removed_nodes"), ["broken"]);
    assert_eq!(ids("other_verdict_changes"), Vec::<String>::new());
    assert_eq!(ids("regressions"), Vec::<String>::new());

    let md = repo.orch(&["diff", "HEAD~1", "HEAD", "--format", "markdown"]);
    assert_eq!(md.status.code(), Some(1));
    let md = stdout(&md);
    assert!(
        md.contains("### Lost coverage (2)") && md.contains("| `dropped` | pass | absent |"),
        "{md}"
    );

    // Allowed, it is still listed but no longer fails the diff.
    for format in ["text", "markdown", "json"] {
        let out = repo.orch(&["diff", "HEAD~1", "HEAD", "--allow-lost", "--format", format]);
        assert_eq!(out.status.code(), Some(0), "{format}");
        let s = stdout(&out);
        assert!(s.contains("needs-gpu") && s.contains("dropped"), "{s}");
    }
    let text = stdout(&repo.orch(&["diff", "HEAD~1", "HEAD", "--allow-lost", "--color", "never"]));
    assert!(
        text.contains("LOST COVERAGE (2)") && text.contains("allowed by --allow-lost"),
        "{text}"
    );
}

/// The `id` of every entry of the section `key` of a `diff --format json` report.
fn json_ids(v: &serde_json::Value, key: &str) -> Vec<String> {
    v[key]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x["id"].as_str().unwrap().to_string())
        .collect()
}
