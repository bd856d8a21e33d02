//! `memra-orch show RUN [NODE]`: finds the run, reads it and prints the run view or one
//! node's view, as text or as the stored JSON. Exit 1 when what is shown did not end as
//! expected.

use crate::cmd::cli::{ShowArgs, ShowFormat, ShowLog};
use crate::receipt::error::FindError;
use crate::receipt::load::{find, load};
use crate::receipt::resolve::{receipts_root, resolve_with};
use crate::report::show::{node_text, run_text};
use crate::words::exit::ExitCode;

/// The `show` subcommand.
pub fn command(args: &ShowArgs) -> ExitCode {
    let run = || -> Result<(Vec<u8>, ExitCode), FindError> {
        let receipts = receipts_root(args.receipts.as_deref())?;
        let dir = resolve_with(
            &args.run,
            &receipts,
            args.manifest.as_deref(),
            &crate::history::heads::heads,
        )?;
        let run = load(&dir)?;
        let Some(query) = &args.node else {
            let code = if run.run.verdict == "pass" {
                ExitCode::Ok
            } else {
                ExitCode::NotAsExpected
            };
            let text = match args.format {
                ShowFormat::Text => run_text(&run),
                ShowFormat::Json => pretty(&run.run),
            };
            return Ok((text.into_bytes(), code));
        };
        let node = find(&run, query)?;
        let code = if node.entry.verdict.as_expected() {
            ExitCode::Ok
        } else {
            ExitCode::NotAsExpected
        };
        if let Some(which) = args.log {
            return log_file(&run, node, which, args.attempt).map(|t| (t, code));
        }
        let text = match (&node.receipt, args.format) {
            (Some(r), ShowFormat::Text) => node_text(&run, r),
            (Some(r), ShowFormat::Json) => pretty(r),
            (None, _) => format!(
                "{}: {} — {}\n(the run wrote no receipt for it: it was not selected by --filter)\n",
                node.entry.id,
                node.entry.verdict,
                node.entry.reason.as_deref().unwrap_or("")
            ),
        };
        Ok((text.into_bytes(), code))
    };
    match run() {
        Ok((text, code)) => {
            use std::io::{IsTerminal as _, Write as _};
            let mut out = std::io::stdout().lock();
            // A gate's log reaches a terminal with its control characters escaped; into a
            // file or a pipe it goes as stored.
            let text = if args.log.is_some() && out.is_terminal() {
                crate::words::escape::terminal(&String::from_utf8_lossy(&text), false)
                    .into_owned()
                    .into_bytes()
            } else {
                text
            };
            match out.write_all(&text).and_then(|()| out.flush()) {
                Ok(()) => code,
                // A closed pipe (`| head`) is not an error of the command.
                Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => code,
                Err(e) => {
                    eprintln!("memra-orch show: cannot write the output: {e}");
                    ExitCode::Internal
                }
            }
        }
        Err(e) => {
            eprintln!("memra-orch show: {e}");
            ExitCode::Usage
        }
    }
}

/// `show RUN NODE --log FILE`: the file of the node's last attempt (or `attempt`), read
/// from its folder or from its packed run's archive.
fn log_file(
    run: &crate::receipt::load::LoadedRun,
    node: &crate::receipt::load::LoadedNode,
    which: ShowLog,
    attempt: Option<u32>,
) -> Result<Vec<u8>, FindError> {
    let none = |why: String| FindError::NoLog(format!("{}: {why}", node.entry.id));
    let Some(r) = &node.receipt else {
        return Err(none(
            "the run wrote no receipt for it (not selected by --filter)".into(),
        ));
    };
    let n = match attempt {
        Some(n) if r.attempts.iter().any(|a| a.n == n) => n,
        Some(n) => {
            let have: Vec<String> = r.attempts.iter().map(|a| a.n.to_string()).collect();
            return Err(none(format!(
                "no attempt {n}; it has {}",
                if have.is_empty() {
                    "none".to_string()
                } else {
                    have.join(", ")
                }
            )));
        }
        None => match r.attempts.last() {
            Some(a) => a.n,
            None => return Err(none("it ran no attempt".into())),
        },
    };
    let source = node
        .entry
        .carried
        .as_ref()
        .and_then(|c| c.source_dir(&run.dir))
        .unwrap_or_else(|| run.dir.clone());
    let attempt_dir = crate::receipt::tree::Tree { dir: source }.attempt_dir(&r.slug, n);
    let name = which.file_name();
    let mut file = crate::gate::attempt_file::open(&attempt_dir, std::path::Path::new(name))
        .map_err(|e| none(e.to_string()))?;
    let mut bytes = Vec::new();
    std::io::Read::read_to_end(&mut file, &mut bytes)
        .map_err(|e| none(format!("{}: {e}", attempt_dir.join(name).display())))?;
    Ok(bytes)
}

fn pretty<T: serde::Serialize>(v: &T) -> String {
    let mut s = serde_json::to_string_pretty(v).unwrap_or_default();
    s.push('\n');
    s
}
