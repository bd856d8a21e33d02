//! `memra-orch bisect --good A --bad B CELL`: resolves the commits, the manifest and the
//! receipts folder, checks that the cell exists, divides the GPUs among the job slots,
//! saves the request for `--resume`, installs the signal handlers, runs the search with a
//! progress line per tested commit on stderr and prints the report. Exit 0 when a culprit
//! is found, 1 when the range holds no change, 2 on usage errors (a good commit that is not
//! good among them), 5 when no single commit can be named (a flaky cell, or skipped commits
//! that leave a range), 130 when interrupted.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use crate::bisect::probe::{self, Setting, Slot};
use crate::bisect::report::{Outcome, Report};
use crate::bisect::state::{self, Saved};
use crate::bisect::{Request, Stop, git};
use crate::cmd::cli::{BisectArgs, BisectFormat};
use crate::machine::gpus::{GpuSpec, Inventory};
use crate::receipt::resolve;
use crate::words::exit::ExitCode;

/// The `bisect` subcommand.
pub fn command(args: &BisectArgs) -> ExitCode {
    match command_inner(args) {
        Ok(code) => code,
        Err((code, message)) => {
            eprintln!("memra-orch bisect: {message}");
            code
        }
    }
}

type Failure = (ExitCode, String);

fn usage(m: impl Into<String>) -> Failure {
    (ExitCode::Usage, m.into())
}

// Over 150 lines: the subcommand's steps in order (the saved or new request, the repository
// and manifest, the good and bad commits and the line between them, the cell, the GPU slots,
// the worktrees' folder, the search, the report), each refusing with its own message.
fn command_inner(args: &BisectArgs) -> Result<ExitCode, Failure> {
    let receipts =
        resolve::receipts_root(args.receipts.as_deref()).map_err(|e| usage(e.to_string()))?;
    let saved = if args.resume {
        resume_request(args, &receipts)?
    } else {
        new_request(args, &receipts)?
    };
    let manifest = &saved.manifest;
    let repo = git::toplevel(manifest).map_err(|e| {
        usage(format!(
            "{} is not in a git repository ({e}); bisect tests the commits of the repository \
             that holds the manifest",
            manifest.display()
        ))
    })?;
    let repo = repo.canonicalize().unwrap_or(repo);
    let manifest_abs = manifest.canonicalize().map_err(|e| {
        usage(format!(
            "cannot read the manifest {}: {e}",
            manifest.display()
        ))
    })?;
    let manifest_rel = manifest_abs
        .strip_prefix(&repo)
        .map_err(|_| {
            usage(format!(
                "{} is not inside {}",
                manifest.display(),
                repo.display()
            ))
        })?
        .to_string_lossy()
        .into_owned();
    let request = &saved.request;
    let good = git::resolve_commit(&repo, &request.good).map_err(|e| usage(e.message))?;
    let bad = git::resolve_commit(&repo, &request.bad).map_err(|e| usage(e.message))?;
    if good == bad {
        return Err(usage(format!(
            "--good and --bad are the same commit ({}); name the last commit where the cell \
             was as expected and a later one where it is not",
            &good[..10]
        )));
    }
    let line = git::first_parent_line(&repo, &good, &bad)
        .map_err(|e| (ExitCode::Internal, e.to_string()))?
        .ok_or_else(|| {
            usage(format!(
                "--good {} is not an ancestor of --bad {} along first parents; bisect searches \
                 the first-parent line between them (swap them if they are the wrong way round)",
                request.good, request.bad
            ))
        })?;
    // The manifest as the user has it names the cell and the manifest's receipts folder.
    let plan = crate::load::load_plan_with_vars(manifest, &saved.vars)
        .map_err(|d| usage(d.to_string()))?;
    let Some(cell) = plan.cells.iter().find(|c| c.id.0 == request.cell) else {
        let near = plan
            .cells
            .iter()
            .map(|c| c.id.0.as_str())
            .filter(|id| id.starts_with(request.cell.split('[').next().unwrap_or("")))
            .take(5)
            .collect::<Vec<_>>();
        return Err(usage(format!(
            "{} has no cell `{}`{}; `memra-orch plan {}` lists the cell ids",
            manifest.display(),
            request.cell,
            if near.is_empty() {
                String::new()
            } else {
                format!(" (cells of that node: {})", near.join(", "))
            },
            manifest.display()
        )));
    };
    if request.bits && cell.kind == crate::plan::NodeKind::Compare {
        return Err(usage(format!(
            "--bits needs a cell that writes artifacts; `{}` is a compare node: bisect its \
             candidate arm with --bits, or bisect the compare without it",
            request.cell
        )));
    }
    let spec: GpuSpec = saved.gpus.parse().map_err(usage)?;
    let inventory = crate::machine::gpus::detect(&spec);
    let slots = slots(&saved.gpus, &spec, &inventory, request.jobs);
    let exe = std::env::current_exe().map_err(|e| {
        (
            ExitCode::Internal,
            format!("cannot find memra-orch itself: {e}"),
        )
    })?;
    let dir = state::state_dir(&receipts);
    // What an earlier bisect killed with SIGKILL left (worktrees and git's records) goes
    // first; then this bisect's folder names its owner so a later one can tell.
    crate::bisect::git::prune_stale(&repo);
    let worktrees = tempfile::Builder::new()
        .prefix(crate::bisect::git::WORKTREES_PREFIX)
        .tempdir()
        .map_err(|e| {
            (
                ExitCode::Internal,
                format!("cannot make a folder for the worktrees: {e}"),
            )
        })?;
    let _ = std::fs::write(
        worktrees.path().join(crate::bisect::git::OWNER_FILE),
        std::process::id().to_string(),
    );
    let setting = Setting {
        repo: repo.clone(),
        manifest_rel,
        manifest_name: plan.name.clone(),
        cell: request.cell.clone(),
        receipts: receipts.clone(),
        vars: saved.vars.clone(),
        share: saved.share.clone(),
        share_root: dir.join("share"),
        worktrees: worktrees.path().to_path_buf(),
        logs: dir.join("logs"),
        exe,
        grace: saved.grace.clone(),
        gpu_models: probe::models(
            &inventory
                .gpus
                .iter()
                .map(|g| g.name.clone())
                .collect::<Vec<_>>(),
        ),
    };
    state::save(&receipts, &saved).map_err(|e| (ExitCode::Internal, e))?;
    let interrupt = Arc::new(AtomicBool::new(false));
    for sig in crate::run::executor::process::cancel_signals() {
        signal_hook::flag::register(sig, Arc::clone(&interrupt)).map_err(|e| {
            (
                ExitCode::Internal,
                format!("cannot install the signal handler: {e}"),
            )
        })?;
    }
    eprintln!(
        "memra-orch bisect: {} commits after {} up to {} ({}), {} a time{}",
        line.len() - 1,
        &good[..10],
        &bad[..10],
        if request.bits {
            "first where the artifacts move"
        } else {
            "first where the cell is not as expected"
        },
        request.jobs,
        if request.reps > 1 {
            format!(", {} runs each", request.reps)
        } else {
            String::new()
        }
    );
    let mut progress = |t: &crate::bisect::report::Tested| eprintln!("  {}", t.line());
    let result = crate::bisect::bisect(&setting, request, &line, &slots, &interrupt, &mut progress);
    drop(worktrees);
    let report = match result {
        Ok(r) => r,
        Err(Stop::Interrupted(r)) => {
            print(&r, args.format);
            return Ok(ExitCode::Interrupted);
        }
        Err(Stop::Broken(why)) => return Err((ExitCode::Internal, why)),
    };
    state::clear(&receipts);
    print(&report, args.format);
    Ok(match report.outcome {
        Outcome::Found { .. } => ExitCode::Ok,
        Outcome::NoChange => ExitCode::NotAsExpected,
        Outcome::GoodIsBad | Outcome::GoodUntestable => ExitCode::Usage,
        Outcome::Range { .. } | Outcome::Flaky { .. } => ExitCode::Inconclusive,
        Outcome::Interrupted => ExitCode::Interrupted,
    })
}

fn print(report: &Report, format: BisectFormat) {
    let out = match format {
        BisectFormat::Text => report.text(),
        BisectFormat::Markdown => report.markdown(),
        BisectFormat::Json => report.json(),
    };
    print!("{out}");
}

fn new_request(args: &BisectArgs, receipts: &Path) -> Result<Saved, Failure> {
    let missing: Vec<&str> = [
        ("--good", args.good.is_none()),
        ("--bad", args.bad.is_none()),
        ("CELL", args.cell.is_none()),
    ]
    .into_iter()
    .filter_map(|(n, m)| m.then_some(n))
    .collect();
    if !missing.is_empty() {
        return Err(usage(format!(
            "{} missing: write `memra-orch bisect --good <commit> --bad <commit> <cell>` (or \
             --resume to continue the last bisection)",
            missing.join(", ")
        )));
    }
    let cell = args.cell.clone().unwrap_or_default();
    let manifest = match &args.manifest {
        Some(m) => m.clone(),
        None => manifest_of(&cell, receipts)?,
    };
    let manifest = std::env::current_dir()
        .map(|d| d.join(&manifest))
        .unwrap_or(manifest);
    for g in &args.artifact {
        if let Err(e) = globset::Glob::new(g) {
            return Err(usage(format!(
                "--artifact {g:?} is not a glob: {e}; give a file name or a pattern such as \
                 '*.safetensors'"
            )));
        }
    }
    for s in &args.share {
        if Path::new(s).is_absolute() || s.split('/').any(|p| p == ".." || p.is_empty()) {
            return Err(usage(format!(
                "--share {s}: name a path inside the repository, relative to its top (for \
                 example `target`)"
            )));
        }
    }
    Ok(Saved {
        schema: state::STATE_SCHEMA,
        request: Request {
            good: args.good.clone().unwrap_or_default(),
            bad: args.bad.clone().unwrap_or_default(),
            cell,
            bits: args.bits,
            artifacts: args.artifact.clone(),
            jobs: args.jobs as usize,
            reps: args.reps as usize,
        },
        manifest,
        vars: args.vars.clone(),
        share: args.share.clone(),
        gpus: args.gpus.clone(),
        grace: args.grace.clone(),
    })
}

fn resume_request(args: &BisectArgs, receipts: &Path) -> Result<Saved, Failure> {
    let given: Vec<&str> = [
        ("--good", args.good.is_some()),
        ("--bad", args.bad.is_some()),
        ("CELL", args.cell.is_some()),
        ("--manifest", args.manifest.is_some()),
        ("--bits", args.bits),
    ]
    .into_iter()
    .filter_map(|(n, g)| g.then_some(n))
    .collect();
    if !given.is_empty() {
        return Err(usage(format!(
            "--resume continues the last bisection with its own arguments; leave out {} (or \
             start a new bisection without --resume)",
            given.join(", ")
        )));
    }
    state::load(receipts).map_err(usage)
}

/// The manifest whose runs hold `cell`, when exactly one manifest's do.
fn manifest_of(cell: &str, receipts: &Path) -> Result<PathBuf, Failure> {
    let runs = resolve::list_runs(receipts).unwrap_or_default();
    let mut found: Vec<(String, PathBuf)> = Vec::new();
    for r in &runs {
        if r.run.nodes.iter().any(|n| n.id == cell)
            && !found.iter().any(|(name, _)| *name == r.run.name)
        {
            found.push((r.run.name.clone(), PathBuf::from(&r.run.manifest.path)));
        }
    }
    match found.as_slice() {
        [(_, path)] if path.exists() => Ok(path.clone()),
        [(name, path)] => Err(usage(format!(
            "the runs of `{name}` hold {cell}, but its manifest {} is not there any more; pass \
             --manifest",
            path.display()
        ))),
        [] => Err(usage(format!(
            "no run under {} holds a cell `{cell}`; pass --manifest <path> to say which manifest \
             it belongs to",
            receipts.display()
        ))),
        several => Err(usage(format!(
            "runs of several manifests hold `{cell}` ({}); pass --manifest <path>",
            several
                .iter()
                .map(|(n, _)| n.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ))),
    }
}

/// The `--gpus` of each job slot: the GPUs divided evenly among the slots, so candidates
/// tested at once never wait for each other's GPUs; with fewer GPUs than slots (or fake
/// ones) every slot gets the same set and the machine-wide leases keep them apart.
fn slots(given: &str, spec: &GpuSpec, inventory: &Inventory, jobs: usize) -> Vec<Slot> {
    let jobs = jobs.max(1);
    let per = inventory.gpus.len() / jobs;
    (0..jobs)
        .map(|k| {
            let gpus = match spec {
                GpuSpec::None => "none".to_string(),
                GpuSpec::Fake(n) => format!("fake:{n}"),
                _ if inventory.gpus.is_empty() => "none".to_string(),
                _ if per == 0 => given.to_string(),
                _ => inventory.gpus[k * per..(k + 1) * per]
                    .iter()
                    .map(|g| g.index.to_string())
                    .collect::<Vec<_>>()
                    .join(","),
            };
            Slot { index: k, gpus }
        })
        .collect()
}
