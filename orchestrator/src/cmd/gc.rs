//! `memra-orch gc --keep N`: finds the runs under the receipts folder and deletes all but
//! the newest N of each manifest, its last green run and the runs those carry receipts from
//! (or prints what it would delete).

use crate::ExitCode;
use crate::cli::GcArgs;
use crate::receipt::gc::{delete, plan, sweep_leftovers};
use crate::receipt::resolve::{list_runs, receipts_root};

/// The `gc` subcommand.
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
    let keep = usize::try_from(args.keep).unwrap_or(usize::MAX);
    let decided = plan(&runs, keep, args.manifest.as_deref());
    let doomed = &decided.delete;
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
            crate::report::escape::control(&dir.display().to_string())
        );
    }
    let mut failed = false;
    let mut deleted = 0usize;
    for dir in doomed {
        if args.dry_run {
            println!("would delete {}", dir.display());
            continue;
        }
        match delete(dir) {
            Ok(()) => {
                deleted += 1;
                println!("deleted {}", dir.display())
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
                crate::report::escape::control(&dir.display().to_string())
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
        // Artifacts no run links any more leave the store.
        let store = crate::receipt::store::store_dir(&receipts);
        match crate::receipt::store::sweep(&store) {
            Ok(s) if s.objects > 0 => println!(
                "removed {} stored artifact{} ({} bytes) that no kept run holds",
                s.objects,
                if s.objects == 1 { "" } else { "s" },
                s.bytes
            ),
            Ok(_) => {}
            Err(e) => {
                eprintln!(
                    "memra-orch gc: {}: cannot sweep the artifact store: {e}",
                    store.display()
                );
                failed = true;
            }
        }
    }
    println!(
        "{} of {} runs {}deleted; kept the newest {} per manifest",
        if args.dry_run { doomed.len() } else { deleted },
        runs.len(),
        if args.dry_run { "would be " } else { "" },
        args.keep
    );
    // A tree kept because a run holds it, or one the file system would not let go, means
    // the request was not fully met; it is not a fault of memra-orch.
    if failed {
        ExitCode::NotAsExpected
    } else {
        ExitCode::Ok
    }
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
