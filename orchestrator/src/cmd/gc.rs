//! `memra-orch gc [--keep N] [--older-than AGE] [--max-size SIZE]`: finds the runs under the
//! receipts folder and deletes what a limit says (all but the newest N of each manifest,
//! runs older than AGE, the oldest until the rest fit SIZE), never a manifest's newest run,
//! its last green run or the runs those carry receipts from (or prints what it would
//! delete, and why).

use std::path::Path;

use crate::cmd::cli::GcArgs;
use crate::receipt::gc::{Retention, delete, plan, run_bytes, sweep_leftovers};
use crate::receipt::resolve::{list_runs, receipts_root};
use crate::run::executor::output::format_size;
use crate::words::exit::ExitCode;

/// The `gc` subcommand.
// Over 150 lines: the subcommand's steps in order (the receipts folder and its runs, the
// retention asked for, the plan of what goes and why each kept tree stays, said line by line,
// then the deletion, what an earlier gc left, the history index and whether the request was
// met).
pub fn command(args: &GcArgs) -> ExitCode {
    let receipts = match receipts_root(args.receipts.as_deref()) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("memra-orch gc: {e}");
            return ExitCode::Usage;
        }
    };
    let runs = match list_runs(&receipts) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("memra-orch gc: {e}");
            return ExitCode::Usage;
        }
    };
    let retention = Retention {
        keep: args.keep.map(|k| usize::try_from(k).unwrap_or(usize::MAX)),
        max_age: args.older_than,
        max_size: args.max_size,
    };
    if let Some(m) = &args.manifest
        && !runs.iter().any(|r| &r.run.name == m)
    {
        let mut names: Vec<&str> = runs.iter().map(|r| r.run.name.as_str()).collect();
        names.sort_unstable();
        names.dedup();
        eprintln!(
            "memra-orch gc: no run of manifest {m:?} under {} (it holds runs of: {}); check \
             --manifest",
            receipts.display(),
            if names.is_empty() {
                "none".to_string()
            } else {
                names.join(", ")
            }
        );
        return ExitCode::Usage;
    }
    if retention.is_empty() && !args.pack {
        eprintln!(
            "memra-orch gc: say what to keep: --keep N (the newest N runs of each manifest),              --older-than DURATION (e.g. 90d) and/or --max-size SIZE (e.g. 50G)"
        );
        return ExitCode::Usage;
    }
    let mut seen = std::collections::HashSet::new();
    if retention.is_empty() {
        // `gc --pack` alone: pack, delete nothing.
        let failed = pack_kept(&runs, &[], args);
        return if args.dry_run {
            ExitCode::Ok
        } else {
            finish_store(&receipts, failed)
        };
    }
    let decided = plan(
        &runs,
        &retention,
        args.manifest.as_deref(),
        std::time::SystemTime::now(),
        &mut |r| run_bytes(&r.dir, &mut seen),
    );
    let doomed = &decided.delete;
    for dir in &decided.kept_newest {
        println!(
            "kept {}: the newest run of its manifest (a limit never deletes it)",
            dir.display()
        );
    }
    for (dir, by) in &decided.kept_for_carry {
        println!(
            "kept {}: {} carries receipts from it",
            dir.display(),
            by.display()
        );
    }
    for dir in &decided.kept_green {
        println!(
            "kept {}: the last green run of its manifest (the baseline a diff against \
             last-green reads)",
            dir.display()
        );
    }
    for (dir, start) in &decided.kept_future {
        let why = if crate::receipt::resolve::start_time(start).is_some() {
            format!(
                "dated {start}, ahead of this machine's clock (its clock was ahead when it ran)"
            )
        } else {
            format!("its start time {start:?} does not parse")
        };
        println!(
            "kept {}: {why}, so its age is unknown and it is neither counted nor deleted; \
             remove it by hand when it is not wanted",
            crate::words::escape::control(&dir.display().to_string())
        );
    }
    let mut failed = false;
    let mut deleted = 0usize;
    for dir in doomed {
        let why = decided.why.get(dir).map(String::as_str).unwrap_or_default();
        if args.dry_run {
            println!("would delete {} ({why})", dir.display());
            continue;
        }
        match delete(dir, &runs) {
            Ok(()) => {
                deleted += 1;
                println!("deleted {} ({why})", dir.display())
            }
            Err(e)
                if matches!(
                    e.kind,
                    crate::receipt::error::ReceiptErrorKind::CarriedBy(_)
                ) =>
            {
                // Not a failure: the rule held, checked again under the lock.
                println!("kept {}: {}", dir.display(), e.kind);
            }
            Err(e) => {
                match &e.kind {
                    // The lock is held by a run or by another gc of that manifest folder.
                    crate::receipt::error::ReceiptErrorKind::Locked(h) => eprintln!(
                        "memra-orch gc: kept {}: its manifest folder is locked{} by {}; run gc \
                         again once it ends",
                        dir.display(),
                        h.pid.map(|p| format!(" (pid {p})")).unwrap_or_default(),
                        if h.gc {
                            "another gc"
                        } else {
                            "a run in progress"
                        }
                    ),
                    _ => eprintln!("memra-orch gc: kept {}: {e}", dir.display()),
                }
                failed = true;
            }
        }
    }
    if !args.dry_run {
        // What a gc killed mid-deletion left behind goes too.
        let (leftovers, stuck) = sweep_all_leftovers(&receipts);
        for (dir, why) in &stuck {
            eprintln!(
                "memra-orch gc: cannot remove {}, left by a gc that was killed: {why}; remove it \
                 by hand",
                crate::words::escape::control(&dir.display().to_string())
            );
            failed = true;
        }
        if leftovers > 0 {
            println!(
                "removed {leftovers} partly deleted run{} that a killed gc left",
                if leftovers == 1 { "" } else { "s" }
            );
        }
        // The history index drops the deleted runs now rather than at its next read.
        let names: std::collections::BTreeSet<&str> = runs
            .iter()
            .filter(|r| doomed.contains(&r.dir))
            .map(|r| r.run.name.as_str())
            .collect();
        for name in names {
            let _ = crate::history::index::prune(&receipts, name);
        }
        failed |= pack_kept(&runs, doomed, args);
        failed |= sweep_store(&receipts);
    }
    let mut limits = Vec::new();
    if let Some(k) = args.keep {
        limits.push(format!("the newest {k} per manifest"));
    }
    if let Some(a) = args.older_than {
        limits.push(format!(
            "runs younger than {}",
            humantime::format_duration(a)
        ));
    }
    if let Some(m) = args.max_size {
        limits.push(format!(
            "at most {} ({} before, {} after)",
            format_size(m),
            about(decided.bytes_before.unwrap_or(0)),
            about(decided.bytes_after.unwrap_or(0))
        ));
    }
    println!(
        "{} of {} runs {}deleted; kept {}",
        if args.dry_run { doomed.len() } else { deleted },
        runs.len(),
        if args.dry_run { "would be " } else { "" },
        limits.join(", ")
    );
    if decided.over_size {
        // A limit the protected runs alone pass is not met, and says so.
        eprintln!(
            "memra-orch gc: the runs kept still take {}, over --max-size {}: every run left is \
             its manifest's newest, its last green run, a run a kept run carries from or of \
             unknown age; raise the limit or free space elsewhere",
            about(decided.bytes_after.unwrap_or(0)),
            format_size(args.max_size.unwrap_or(0))
        );
        failed = true;
    }
    // A tree kept because a run holds it, or one the file system would not let go, means
    // the request was not fully met; it is not a fault of memra-orch.
    if failed {
        ExitCode::NotAsExpected
    } else {
        ExitCode::Ok
    }
}

/// Packs the kept runs (`runs` less `doomed`, of `--manifest` when given) that hold a tree
/// of cell folders: with `--pack` every finished one, and always the ones a packer stopped
/// while removing their tree (their archive is complete). A run in progress holds its
/// manifest folder's lock and is left alone. Whether anything failed.
fn pack_kept(
    runs: &[crate::receipt::resolve::FoundRun],
    doomed: &[std::path::PathBuf],
    args: &GcArgs,
) -> bool {
    use crate::receipt::pack;
    let mut failed = false;
    let (mut packed, mut files) = (0usize, 0u64);
    for run in runs {
        if run.id.is_none()
            || doomed.contains(&run.dir)
            || args.manifest.as_ref().is_some_and(|m| &run.run.name != m)
            || !run.dir.join("nodes").is_dir()
        {
            continue;
        }
        let leftover = run.dir.join(crate::gate::packed::PACK).exists();
        if !leftover && (!args.pack || run.run.verdict == "running") {
            continue;
        }
        if args.dry_run {
            println!("would pack {}", run.dir.display());
            continue;
        }
        let Some(manifest_dir) = run.dir.parent() else {
            continue;
        };
        // Held only while this run is packed, as `delete` does.
        let lock = match crate::receipt::tree::RunLock::acquire_as(manifest_dir, true) {
            Ok(l) => l,
            Err(e) => {
                eprintln!("memra-orch gc: not packed {}: {e}", run.dir.display());
                failed = true;
                continue;
            }
        };
        match pack::pack(&run.dir) {
            Ok(Some(p)) => {
                packed += 1;
                files += p.files + p.linked;
                if let Some(left) = p.left {
                    eprintln!("memra-orch gc: packed {}, but {left}", run.dir.display());
                    failed = true;
                }
            }
            Ok(None) => {}
            Err(e) => {
                eprintln!("memra-orch gc: not packed {}: {e}", run.dir.display());
                failed = true;
            }
        }
        drop(lock);
    }
    if packed > 0 {
        println!(
            "packed {packed} run{} ({files} files) into their nodes.zip",
            if packed == 1 { "" } else { "s" }
        );
    }
    failed
}

/// Artifacts no kept run links any more leave the store. Whether that failed.
fn sweep_store(receipts: &Path) -> bool {
    let store = crate::receipt::store::store_dir(receipts);
    match crate::receipt::store::sweep(&store) {
        Ok(s) if s.objects > 0 => {
            println!(
                "removed {} stored artifact{} ({} bytes) that no kept run holds",
                s.objects,
                if s.objects == 1 { "" } else { "s" },
                s.bytes
            );
            false
        }
        Ok(_) => false,
        Err(e) => {
            eprintln!(
                "memra-orch gc: {}: cannot sweep the artifact store: {e}",
                store.display()
            );
            true
        }
    }
}

fn finish_store(receipts: &Path, failed: bool) -> ExitCode {
    if failed | sweep_store(receipts) {
        ExitCode::NotAsExpected
    } else {
        ExitCode::Ok
    }
}

/// A manifest's `[retention]`, applied by `run` when it ends: the runs of `name` its limits
/// delete go (never the newest, the last green one or what a kept run carries from), the
/// history index and the artifact store follow. Returns what to say, a line each.
pub fn apply_retention(receipts: &Path, name: &str, r: &Retention, own: &Path) -> Vec<String> {
    let runs = match list_runs(receipts) {
        Ok(r) => r,
        Err(e) => return vec![format!("retention: {e}")],
    };
    let mut seen = std::collections::HashSet::new();
    let decided = plan(
        &runs,
        r,
        Some(name),
        std::time::SystemTime::now(),
        &mut |run| run_bytes(&run.dir, &mut seen),
    );
    let mut said = Vec::new();
    let own = std::fs::canonicalize(own).unwrap_or_else(|_| own.to_path_buf());
    for dir in &decided.delete {
        // The run applying the limits is never among what they delete (a run at another
        // commit that finished first, or one dated a little ahead, is not "newer" than the
        // night that just ended).
        if std::fs::canonicalize(dir).is_ok_and(|d| d == own) {
            said.push(format!(
                "retention: kept {}: the run applying it is never deleted by it",
                dir.display()
            ));
            continue;
        }
        let why = decided.why.get(dir).map(String::as_str).unwrap_or_default();
        match delete(dir, &runs) {
            Ok(()) => said.push(format!("retention: deleted {} ({why})", dir.display())),
            Err(e) => said.push(format!("retention: kept {}: {e}", dir.display())),
        }
    }
    if decided.over_size {
        said.push(format!(
            "retention: the runs of {name} kept still take {}, over max_size {}: every run \
             left is protected (the newest, the last green run, one a kept run carries from)",
            about(decided.bytes_after.unwrap_or(0)),
            format_size(r.max_size.unwrap_or(0))
        ));
    }
    if !decided.delete.is_empty() {
        let _ = crate::history::index::prune(receipts, name);
        let _ = crate::receipt::store::sweep(&crate::receipt::store::store_dir(receipts));
    }
    said
}

/// A byte count to read, not to write back: `416.4KiB`, `2.5GiB`, `12B`.
fn about(bytes: u64) -> String {
    let mut v = bytes as f64;
    for unit in ["B", "KiB", "MiB", "GiB"] {
        if v < 1024.0 {
            return if unit == "B" {
                format!("{bytes}B")
            } else {
                format!("{v:.1}{unit}")
            };
        }
        v /= 1024.0;
    }
    format!("{v:.1}TiB")
}

/// [`sweep_leftovers`] in every manifest folder under the receipts folder (dot folders are
/// memra-orch's own, never commits).
fn sweep_all_leftovers(receipts: &std::path::Path) -> (usize, Vec<(std::path::PathBuf, String)>) {
    let dirs = |p: &std::path::Path| -> Vec<std::path::PathBuf> {
        std::fs::read_dir(p)
            .map(|d| {
                d.flatten()
                    .filter(|e| {
                        e.file_type().is_ok_and(|t| t.is_dir())
                            && !e.file_name().to_string_lossy().starts_with('.')
                    })
                    .map(|e| e.path())
                    .collect()
            })
            .unwrap_or_default()
    };
    let mut removed = 0;
    let mut stuck = Vec::new();
    for m in dirs(receipts).iter().flat_map(|c| dirs(c)) {
        let s = sweep_leftovers(&m);
        removed += s.removed;
        stuck.extend(s.stuck);
    }
    (removed, stuck)
}
