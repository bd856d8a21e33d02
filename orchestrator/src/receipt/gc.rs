//! Deleting old runs (`memra-orch gc --keep N`): which runs go, every one but the N newest
//! (by start time) of each manifest, except each manifest's last green run (the baseline a
//! morning diff and `diff --against last-green` read) and runs whose receipts a kept run
//! carries ([`plan`]); and deleting one ([`delete`]). A run is deleted under the run lock of its
//! manifest folder, so a run writing there is never pulled out from under (that run is kept
//! and named). Only folders holding a `run.json` are ever deleted: anything else under the
//! receipts folder is not ours. `gc` is the only command that deletes receipts.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::error::{ReceiptError, ReceiptErrorKind as Kind};
use super::resolve::FoundRun;
use super::tree::{RunLock, is_run_id};
pub use crate::plan::Retention;

/// What `gc` decided.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct GcPlan {
    /// Runs to delete, newest first within each manifest, each with why.
    pub delete: Vec<PathBuf>,
    /// Why each run of `delete` goes (`past --keep 30`, `older than 90days`, `to fit 50G`).
    pub why: BTreeMap<PathBuf, String>,
    /// Runs past a limit that stay because a kept run carries receipts from them, each with
    /// the run that does.
    pub kept_for_carry: Vec<(PathBuf, PathBuf)>,
    /// Runs of unknown age ([`super::resolve::unknown_age`]: dated in the future, or a
    /// start that does not parse), with their start: neither counted nor deleted.
    pub kept_future: Vec<(PathBuf, String)>,
    /// Runs past a limit that stay because each is its manifest's last green run.
    pub kept_green: Vec<PathBuf>,
    /// Runs past a limit that stay because each is its manifest's newest run.
    pub kept_newest: Vec<PathBuf>,
    /// With a size limit: the bytes of the runs in scope before and after, and whether what
    /// is kept still passes the limit (every run left is protected).
    pub bytes_before: Option<u64>,
    pub bytes_after: Option<u64>,
    pub over_size: bool,
}

/// Decides which runs go. `runs` is newest first (as `list_runs` gives it); `size_of`
/// gives a run's bytes (asked only with a size limit, newest first, so a file several runs
/// link is counted in the newest). Never deleted: runs of other manifests than `manifest`,
/// runs of unknown age, each manifest's newest run, each manifest's last green run (the
/// baseline a morning diff and `--against last-green` read), and the runs a kept run
/// carries receipts from.
pub fn plan(
    runs: &[FoundRun],
    r: &Retention,
    manifest: Option<&str>,
    now: std::time::SystemTime,
    size_of: &mut dyn FnMut(&FoundRun) -> u64,
) -> GcPlan {
    let mut out = GcPlan::default();
    // Each manifest's newest run of known age that ended green: the baseline stays.
    let mut last_green: BTreeMap<&str, &Path> = BTreeMap::new();
    for run in runs {
        if !super::resolve::unknown_age(&run.run.start) && super::resolve::green(run) {
            last_green.entry(run.run.name.as_str()).or_insert(&run.dir);
        }
    }
    // In scope, known age, newest first: (run, protected-as, doomed-because).
    let mut scope: Vec<(&FoundRun, Option<&'static str>, Option<String>)> = Vec::new();
    let mut others: Vec<&FoundRun> = Vec::new();
    let mut per_manifest: BTreeMap<&str, usize> = BTreeMap::new();
    for run in runs {
        if manifest.is_some_and(|m| run.run.name != m) {
            others.push(run);
            continue;
        }
        if super::resolve::unknown_age(&run.run.start) {
            out.kept_future
                .push((run.dir.clone(), run.run.start.clone()));
            others.push(run);
            continue;
        }
        let seen = per_manifest.entry(run.run.name.as_str()).or_default();
        *seen += 1;
        let protected = if *seen == 1 {
            Some("newest")
        } else if last_green.get(run.run.name.as_str()) == Some(&run.dir.as_path()) {
            Some("green")
        } else {
            None
        };
        let mut why = None;
        if let Some(k) = r.keep
            && *seen > k
        {
            why = Some(format!("past --keep {k}"));
        }
        if let Some(age) = r.max_age
            && super::resolve::start_time(&run.run.start)
                .and_then(|t| now.duration_since(t).ok())
                .is_some_and(|a| a > age)
        {
            why.get_or_insert_with(|| {
                format!(
                    "older than {}",
                    humantime::format_duration(std::time::Duration::from_secs(age.as_secs()))
                )
            });
        }
        scope.push((run, protected, why));
    }
    // The runs the kept ones read carried receipts from, and who reads them.
    let needed = |scope: &[(&FoundRun, Option<&'static str>, Option<String>)],
                  others: &[&FoundRun]|
     -> BTreeMap<PathBuf, PathBuf> {
        let mut needed = BTreeMap::new();
        let kept = scope
            .iter()
            .filter(|(_, p, why)| why.is_none() || p.is_some())
            .map(|(run, _, _)| *run)
            .chain(others.iter().copied());
        for run in kept {
            for s in run
                .run
                .nodes
                .iter()
                .filter_map(|e| e.carried.as_ref()?.source_dir(&run.dir))
            {
                needed.entry(s).or_insert_with(|| run.dir.clone());
            }
        }
        needed
    };
    let gone = |need: &BTreeMap<PathBuf, PathBuf>,
                e: &(&FoundRun, Option<&'static str>, Option<String>)| {
        e.2.is_some() && e.1.is_none() && !need.contains_key(&e.0.dir)
    };
    if let Some(limit) = r.max_size {
        let sizes: Vec<u64> = scope.iter().map(|(run, _, _)| size_of(run)).collect();
        let before: u64 = sizes.iter().sum();
        out.bytes_before = Some(before);
        let mut need = needed(&scope, &others);
        let mut left: u64 = scope
            .iter()
            .zip(&sizes)
            .filter(|(e, _)| !gone(&need, e))
            .map(|(_, b)| *b)
            .sum();
        // The oldest run that may go, until the rest fits.
        while left > limit {
            let pick = scope
                .iter()
                .enumerate()
                .rev()
                .find(|(_, e)| e.2.is_none() && e.1.is_none() && !need.contains_key(&e.0.dir))
                .map(|(i, _)| i);
            let Some(i) = pick else {
                out.over_size = true;
                break;
            };
            scope[i].2 = Some("the oldest that could go to fit the size limit".to_string());
            need = needed(&scope, &others);
            left = scope
                .iter()
                .zip(&sizes)
                .filter(|(e, _)| !gone(&need, e))
                .map(|(_, b)| *b)
                .sum();
        }
        out.bytes_after = Some(left);
    }
    let need = needed(&scope, &others);
    for e in &scope {
        let (run, protected, why) = e;
        if why.is_none() {
            continue;
        }
        match (protected, need.get(&run.dir)) {
            (Some("newest"), _) => out.kept_newest.push(run.dir.clone()),
            (Some(_), _) => out.kept_green.push(run.dir.clone()),
            (None, Some(by)) => out.kept_for_carry.push((run.dir.clone(), by.clone())),
            (None, None) => {
                out.delete.push(run.dir.clone());
                out.why
                    .insert(run.dir.clone(), why.clone().unwrap_or_default());
            }
        }
    }
    out
}

/// The bytes of the files under a run's folder that no newer run counted: a file several
/// runs (or attempts) link, as every stored artifact is, is counted once, in the newest run
/// holding it. Links are not followed.
pub fn run_bytes(dir: &Path, seen: &mut std::collections::HashSet<(u64, u64)>) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let mut total = 0u64;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            let Ok(m) = e.path().symlink_metadata() else {
                continue;
            };
            if m.is_dir() {
                stack.push(e.path());
            } else if m.is_file() && seen.insert((m.dev(), m.ino())) {
                total += m.len();
                // A packed run's stored artifacts are the store's objects its archive
                // links to.
                if d == dir && e.file_name() == crate::gate::packed::PACK {
                    total += linked_bytes(&e.path(), seen);
                }
            }
        }
    }
    total
}

/// The bytes of the store's objects the archive `pack` links to that were not counted yet.
fn linked_bytes(pack: &Path, seen: &mut std::collections::HashSet<(u64, u64)>) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let Some(receipts) = pack.ancestors().nth(4) else {
        return 0;
    };
    let store = super::store::store_dir(receipts);
    crate::gate::packed::links(pack)
        .unwrap_or_default()
        .iter()
        .filter_map(|sha| std::fs::symlink_metadata(store.join(&sha[..2]).join(sha)).ok())
        .filter(|m| m.is_file() && seen.insert((m.dev(), m.ino())))
        .map(|m| m.len())
        .sum()
}

/// The prefix of a run moved aside for deletion (`.gc-<name>-<pid>`), in its manifest
/// folder; never a run id, so never read as a run.
const TRASH_PREFIX: &str = ".gc-";

/// Deletes one run. Under the lock of its manifest folder (held only for that moment, so a
/// run starting meanwhile waits a blink rather than being refused) the run is moved aside:
/// a run folder is renamed; a tree of the layout before run ids is the manifest folder
/// itself, which may also hold newer runs, so only its own files are moved (`run.json`
/// first, so it stops being a run before anything else is touched). The moved tree is then
/// removed without the lock, and a manifest folder left with nothing but its lock goes under
/// the lock again, then its commit folder when that is empty too.
///
/// `known` are the runs the decision saw (their carrying was weighed then); only a run
/// folder that appeared since is read again under the lock.
pub fn delete(dir: &Path, known: &[FoundRun]) -> Result<(), ReceiptError> {
    let name = dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let new_layout = is_run_id(&name);
    let manifest_dir = if new_layout {
        dir.parent()
            .ok_or_else(|| ReceiptError::new(dir, Kind::NoParent))?
    } else {
        dir
    };
    let trash = manifest_dir.join(format!("{TRASH_PREFIX}{name}-{}", std::process::id()));
    {
        let _lock = RunLock::acquire_as(manifest_dir, true)?;
        // Decided before the lock was taken: a run that started and ended meanwhile may
        // carry receipts from this one (carried receipts come from sibling runs only), and
        // then it stays.
        if new_layout && let Some(by) = new_carrier(manifest_dir, dir, known) {
            return Err(ReceiptError::new(dir, Kind::CarriedBy(by)));
        }
        if new_layout {
            // Renamed aside first so that a reader never sees half a tree as a run. Gone
            // already: another gc took it in the meantime, which is what was asked.
            match std::fs::rename(dir, &trash) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound && !dir.exists() => {
                    return Ok(());
                }
                Err(e) => return Err(ReceiptError::new(dir, Kind::MoveAside(e))),
            }
        } else {
            std::fs::create_dir_all(&trash)
                .map_err(|e| ReceiptError::new(&trash, Kind::Create(e)))?;
            for part in ["run.json", "summary.md", "junit.xml", "nodes"] {
                let from = dir.join(part);
                if from.exists() {
                    std::fs::rename(&from, trash.join(part))
                        .map_err(|e| ReceiptError::new(&from, Kind::MoveAside(e)))?;
                }
            }
        }
    }
    std::fs::remove_dir_all(&trash).map_err(|e| ReceiptError::new(&trash, Kind::Delete(e)))?;
    remove_if_empty(manifest_dir);
    Ok(())
}

/// A run folder in `manifest_dir` that `known` does not hold and whose receipts carry from
/// `dir`.
fn new_carrier(manifest_dir: &Path, dir: &Path, known: &[FoundRun]) -> Option<PathBuf> {
    let known: std::collections::HashSet<&Path> = known.iter().map(|r| r.dir.as_path()).collect();
    std::fs::read_dir(manifest_dir)
        .ok()?
        .flatten()
        .map(|e| e.path())
        .filter(|p| p != dir && !known.contains(p.as_path()))
        .filter(|p| {
            p.file_name()
                .is_some_and(|n| is_run_id(&n.to_string_lossy()))
        })
        .find(|p| {
            super::read_json::<super::RunReceipt>(&p.join("run.json"))
                .ok()
                .flatten()
                .is_some_and(|r| {
                    r.nodes
                        .iter()
                        .filter_map(|e| e.carried.as_ref()?.source_dir(p))
                        .any(|s| s == dir)
                })
        })
}

/// Removes a manifest folder that holds nothing but its lock file, and then its commit
/// folder when that is empty too; a run that holds the lock, or anything else in either
/// folder, leaves them be.
fn remove_if_empty(manifest_dir: &Path) {
    let Ok(lock) = RunLock::acquire_as(manifest_dir, true) else {
        return;
    };
    let only_lock = std::fs::read_dir(manifest_dir)
        .map(|d| d.flatten().all(|e| e.file_name() == ".lock"))
        .unwrap_or(false);
    if !only_lock {
        return;
    }
    let _ = lock.remove_file();
    drop(lock);
    // Removing fails, as it should, when a run created its lock file again meanwhile.
    if std::fs::remove_dir(manifest_dir).is_ok()
        && let Some(commit_dir) = manifest_dir.parent()
    {
        let _ = std::fs::remove_dir(commit_dir);
    }
}

/// What [`sweep_leftovers`] did: how many leftovers went, and the ones that would not go
/// (with why).
#[derive(Debug, Default)]
pub struct Swept {
    pub removed: usize,
    pub stuck: Vec<(PathBuf, String)>,
}

/// Removes what a gc that was killed while deleting left in a manifest folder: folders
/// `.gc-<name>-<pid>` whose gc process no longer lives.
pub fn sweep_leftovers(manifest_dir: &Path) -> Swept {
    let mut out = Swept::default();
    let Ok(entries) = std::fs::read_dir(manifest_dir) else {
        return out;
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        // Only `.gc-<run id>-<pid>`: a folder of that shape is what a gc moved aside, and a
        // user's own `.gc-notes-1` is not.
        let Some(pid) = name
            .strip_prefix(TRASH_PREFIX)
            .and_then(|rest| rest.rsplit_once('-'))
            .filter(|(run, _)| is_run_id(run))
            .and_then(|(_, pid)| pid.parse::<i32>().ok())
        else {
            continue;
        };
        // Only a real folder (not a link a gate planted) of a gc that is gone.
        if !e.file_type().is_ok_and(|t| t.is_dir()) || alive(pid) {
            continue;
        }
        match std::fs::remove_dir_all(e.path()) {
            Ok(()) => out.removed += 1,
            Err(err) => out.stuck.push((e.path(), err.to_string())),
        }
    }
    if out.removed > 0 {
        remove_if_empty(manifest_dir);
    }
    out
}

/// Whether a process of this pid exists (one of another user counts).
fn alive(pid: i32) -> bool {
    if pid <= 0 {
        return true;
    }
    // SAFETY: signal 0 only checks that the process exists; nothing is sent.
    let r = unsafe { libc::kill(pid, 0) };
    r == 0 || std::io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::receipt::{Carried, NodeIndexEntry, RunReceipt};

    /// `plan` with `--keep N` alone.
    fn keep(runs: &[FoundRun], n: usize, manifest: Option<&str>) -> GcPlan {
        let r = Retention {
            keep: Some(n),
            ..Retention::default()
        };
        plan(runs, &r, manifest, std::time::SystemTime::now(), &mut |_| 0)
    }

    fn found(dir: &str, name: &str, start: &str, carried: Option<Carried>) -> FoundRun {
        let mut run: RunReceipt = serde_json::from_value(serde_json::json!({
            "schema": 1, "name": name, "manifest": {"path": "m", "bytes": 0, "sha256": ""},
            "env_matrices": [], "commit": "c", "commit_sha": null, "dirty": false, "host": "h",
            "orchestrator_version": "0", "inventory": null, "cpu_slots": 1, "filters": [],
            "resumed": false, "start": start, "end": start, "seconds": 1.0,
            "interrupted": false, "counts": {}, "verdict": "pass", "nodes": []
        }))
        .unwrap();
        if let Some(c) = carried {
            run.nodes.push(NodeIndexEntry {
                id: "a".into(),
                kind: crate::plan::NodeKind::Arm,
                slug: Some("a-1".into()),
                verdict: crate::words::verdict::Verdict::Pass,
                seconds: 1.0,
                reason: None,
                carried: Some(c),
                warns: 0,
                warning: None,
            });
        }
        FoundRun {
            dir: PathBuf::from(dir),
            commit: "c".into(),
            id: Path::new(dir)
                .file_name()
                .map(|n| n.to_string_lossy().into_owned()),
            run,
        }
    }

    #[test]
    fn keeps_the_newest_and_what_they_carry_from() {
        let old = "/r/c/smoke/20261101T000000.000Z-aaaa";
        let mid = "/r/c/smoke/20261102T000000.000Z-bbbb";
        let new = "/r/c/smoke/20261103T000000.000Z-cccc";
        let runs = vec![
            found(
                new,
                "smoke",
                "2026-11-03T00:00:00Z",
                Some(Carried::from_run(Some("20261101T000000.000Z-aaaa"))),
            ),
            red(found(
                "/r/c/other/20261102T000000.000Z-dddd",
                "other",
                "2026-11-02T00:00:00Z",
                None,
            )),
            found(mid, "smoke", "2026-11-02T00:00:00Z", None),
            red(found(
                "/r/c/other/20261101T000000.000Z-eeee",
                "other",
                "2026-11-01T00:00:00Z",
                None,
            )),
            found(old, "smoke", "2026-11-01T00:00:00Z", None),
        ];
        let p = keep(&runs, 1, Some("smoke"));
        assert_eq!(p.delete, vec![PathBuf::from(mid)]);
        assert_eq!(
            p.kept_for_carry,
            vec![(PathBuf::from(old), PathBuf::from(new))]
        );
        // Another manifest's runs are never counted against this one.
        let p = keep(&runs, 1, Some("other"));
        assert_eq!(
            p.delete,
            vec![PathBuf::from("/r/c/other/20261101T000000.000Z-eeee")]
        );
    }

    /// A red run: one cell failed.
    fn red(mut r: FoundRun) -> FoundRun {
        r.run.counts.insert(crate::words::verdict::Verdict::Fail, 1);
        r.run.verdict = "fail".into();
        r
    }

    #[test]
    fn the_last_green_run_and_what_it_carries_from_are_never_deleted() {
        let base = "/r/c/smoke/20261101T000000.000Z-aaaa";
        let green = "/r/c/smoke/20261102T000000.000Z-bbbb";
        let older_green = "/r/c/smoke/20261101T120000.000Z-eeee";
        let runs = vec![
            red(found(
                "/r/c/smoke/20261105T000000.000Z-cccc",
                "smoke",
                "2026-11-05T00:00:00Z",
                None,
            )),
            red(found(
                "/r/c/smoke/20261104T000000.000Z-dddd",
                "smoke",
                "2026-11-04T00:00:00Z",
                None,
            )),
            found(
                green,
                "smoke",
                "2026-11-02T00:00:00Z",
                Some(Carried::from_run(Some("20261101T000000.000Z-aaaa"))),
            ),
            found(older_green, "smoke", "2026-11-01T12:00:00Z", None),
            red(found(base, "smoke", "2026-11-01T00:00:00Z", None)),
        ];
        let p = keep(&runs, 1, None);
        assert_eq!(p.kept_green, vec![PathBuf::from(green)]);
        assert_eq!(
            p.kept_for_carry,
            vec![(PathBuf::from(base), PathBuf::from(green))]
        );
        assert_eq!(
            p.delete,
            vec![
                PathBuf::from("/r/c/smoke/20261104T000000.000Z-dddd"),
                PathBuf::from(older_green)
            ]
        );
        // A run still in progress (no end) or of unknown age is no baseline.
        let mut unfinished = found(
            "/r/c/smoke/20261103T000000.000Z-ffff",
            "smoke",
            "2026-11-03T00:00:00Z",
            None,
        );
        unfinished.run.end = None;
        let runs = vec![
            red(found(
                "/r/c/smoke/20261105T000000.000Z-cccc",
                "smoke",
                "2026-11-05T00:00:00Z",
                None,
            )),
            unfinished,
            found(green, "smoke", "2026-11-02T00:00:00Z", None),
        ];
        let p = keep(&runs, 1, None);
        assert_eq!(p.kept_green, vec![PathBuf::from(green)]);
    }

    #[test]
    fn age_and_size_limits_delete_the_oldest_and_never_a_protected_run() {
        let day = |d: u32| format!("2026-11-{d:02}T00:00:00Z");
        let dir = |d: u32| format!("/r/c/smoke/202611{d:02}T000000.000Z-aaaa");
        // Nights 1..=6, newest first; night 2 is the last green one, night 6 the newest.
        let runs: Vec<FoundRun> = (1..=6)
            .rev()
            .map(|d| {
                let r = found(&dir(d), "smoke", &day(d), None);
                if d == 2 { r } else { red(r) }
            })
            .collect();
        let now = crate::receipt::resolve::start_time("2026-11-07T00:00:00Z").unwrap();
        let age = |days: u64| Retention {
            max_age: Some(std::time::Duration::from_secs(days * 86_400)),
            ..Retention::default()
        };
        // Older than 3.5 days: nights 1, 2, 3; night 2 is the baseline and stays.
        let p = plan(&runs, &age(3), None, now, &mut |_| 0);
        assert_eq!(p.delete, vec![PathBuf::from(dir(3)), PathBuf::from(dir(1))]);
        assert_eq!(p.why[&PathBuf::from(dir(3))], "older than 3days");
        assert_eq!(p.kept_green, vec![PathBuf::from(dir(2))]);
        // Everything is older than a day, but the newest run always stays.
        let p = plan(&runs, &age(0), None, now, &mut |_| 0);
        assert_eq!(p.kept_newest, vec![PathBuf::from(dir(6))]);
        assert_eq!(p.delete.len(), 4);
        // 10 bytes a run, 35 allowed: the oldest that may go go until 30 are left.
        let size = Retention {
            max_size: Some(35),
            ..Retention::default()
        };
        let p = plan(&runs, &size, None, now, &mut |_| 10);
        assert_eq!(
            p.delete,
            vec![
                PathBuf::from(dir(4)),
                PathBuf::from(dir(3)),
                PathBuf::from(dir(1))
            ]
        );
        assert_eq!((p.bytes_before, p.bytes_after), (Some(60), Some(30)));
        assert!(!p.over_size);
        // A limit nothing but protected runs could meet is said, not forced.
        let tiny = Retention {
            max_size: Some(5),
            ..Retention::default()
        };
        let p = plan(&runs, &tiny, None, now, &mut |_| 10);
        assert!(p.over_size);
        assert_eq!(p.delete.len(), 4);
        assert_eq!(p.bytes_after, Some(20));
    }

    #[test]
    fn run_bytes_counts_a_file_several_runs_link_once() {
        let tmp = tempfile::tempdir().unwrap();
        let (a, b) = (tmp.path().join("a"), tmp.path().join("b"));
        std::fs::create_dir_all(a.join("nodes")).unwrap();
        std::fs::create_dir_all(&b).unwrap();
        std::fs::write(a.join("nodes/x"), [0u8; 100]).unwrap();
        std::fs::hard_link(a.join("nodes/x"), b.join("x")).unwrap();
        std::fs::write(b.join("y"), [0u8; 7]).unwrap();
        std::os::unix::fs::symlink("/etc/passwd", b.join("link")).unwrap();
        let mut seen = std::collections::HashSet::new();
        assert_eq!(run_bytes(&b, &mut seen), 107);
        assert_eq!(run_bytes(&a, &mut seen), 0);
    }

    /// A run that began carrying from a doomed run after gc decided (it started and ended
    /// while gc worked) saves it: checked again under the lock.
    #[test]
    fn a_run_carried_from_since_gc_decided_is_kept() {
        let tmp = tempfile::tempdir().unwrap();
        let m = tmp.path().join("c/smoke");
        let old = m.join("20261101T000000.000Z-aaaa");
        let new = m.join("20261103T000000.000Z-cccc");
        std::fs::create_dir_all(&old).unwrap();
        std::fs::create_dir_all(&new).unwrap();
        let write = |dir: &Path, r: &FoundRun| {
            std::fs::write(dir.join("run.json"), serde_json::to_string(&r.run).unwrap()).unwrap()
        };
        write(
            &old,
            &found(old.to_str().unwrap(), "smoke", "2026-11-01T00:00:00Z", None),
        );
        write(
            &new,
            &found(
                new.to_str().unwrap(),
                "smoke",
                "2026-11-03T00:00:00Z",
                Some(Carried::from_run(Some("20261101T000000.000Z-aaaa"))),
            ),
        );
        let e = delete(&old, &[]).unwrap_err();
        assert!(
            matches!(e.kind, Kind::CarriedBy(ref by) if by == &new),
            "{e}"
        );
        assert!(old.join("run.json").exists());
    }

    #[test]
    fn only_what_a_gc_moved_aside_is_swept() {
        let tmp = tempfile::tempdir().unwrap();
        let m = tmp.path().join("c/smoke");
        // A pid no process has (above the kernel's pid limit).
        let theirs = m.join(".gc-20261103T000000.000Z-cccc-2147483000");
        let mine = m.join(".gc-notes-2147483000");
        std::fs::create_dir_all(&theirs).unwrap();
        std::fs::create_dir_all(&mine).unwrap();
        std::fs::write(mine.join("notes.txt"), "mine").unwrap();
        let swept = sweep_leftovers(&m);
        assert_eq!(swept.removed, 1);
        assert!(!theirs.exists() && mine.join("notes.txt").exists());
    }

    #[test]
    fn a_run_another_gc_deleted_meanwhile_is_no_error() {
        let tmp = tempfile::tempdir().unwrap();
        let run = tmp.path().join("c/smoke/20261103T000000.000Z-cccc");
        std::fs::create_dir_all(&run).unwrap();
        std::fs::write(run.join("run.json"), "{}").unwrap();
        delete(&run, &[]).unwrap();
        delete(&run, &[]).unwrap();
    }

    #[test]
    fn runs_of_unknown_age_are_neither_counted_nor_deleted() {
        let runs = vec![
            found("/r/c/smoke/x-future", "smoke", "2099-01-01T00:00:00Z", None),
            found("/r/c/smoke/x-garbled", "smoke", "zzz", None),
            found("/r/c/smoke/x-new", "smoke", "2026-11-03T00:00:00Z", None),
            found("/r/c/smoke/x-old", "smoke", "2026-11-02T00:00:00Z", None),
        ];
        let p = keep(&runs, 1, None);
        assert_eq!(p.delete, vec![PathBuf::from("/r/c/smoke/x-old")]);
        assert_eq!(p.kept_future.len(), 2);
    }

    #[test]
    fn deleting_an_old_layout_tree_keeps_the_runs_inside_it() {
        let tmp = tempfile::tempdir().unwrap();
        let m = tmp.path().join("c/smoke");
        let inner = m.join("20261103T000000.000Z-cccc");
        std::fs::create_dir_all(m.join("nodes/a-1")).unwrap();
        std::fs::create_dir_all(&inner).unwrap();
        std::fs::write(m.join("run.json"), "{}").unwrap();
        std::fs::write(inner.join("run.json"), "{}").unwrap();
        delete(&m, &[]).unwrap();
        assert!(!m.join("run.json").exists() && !m.join("nodes").exists());
        assert!(inner.join("run.json").is_file());
        delete(&inner, &[]).unwrap();
        assert!(!inner.exists());
        // Nothing but the lock was left: the manifest and commit folders went too.
        assert!(!tmp.path().join("c").exists());
    }
}
