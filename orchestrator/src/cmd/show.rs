//! `memra-orch show RUN [NODE]`: finds the run, reads it and prints the run view or one
//! node's view, as text or as the stored JSON. Exit 1 when what is shown did not end as
//! expected.

use crate::ExitCode;
use crate::cli::{ShowArgs, ShowFormat};
use crate::receipt::error::FindError;
use crate::receipt::load::{find, load};
use crate::receipt::resolve::{receipts_root, resolve_with};
use crate::report::show::{node_text, run_text};

/// The `show` subcommand.
pub fn command(args: &ShowArgs) -> ExitCode {
    let run = || -> Result<(String, ExitCode), FindError> {
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
            return Ok((text, code));
        };
        let node = find(&run, query)?;
        let code = if node.entry.verdict.as_expected() {
            ExitCode::Ok
        } else {
            ExitCode::NotAsExpected
        };
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
        Ok((text, code))
    };
    match run() {
        Ok((text, code)) => {
            print!("{text}");
            code
        }
        Err(e) => {
            eprintln!("memra-orch show: {e}");
            ExitCode::Usage
        }
    }
}

fn pretty<T: serde::Serialize>(v: &T) -> String {
    let mut s = serde_json::to_string_pretty(v).unwrap_or_default();
    s.push('\n');
    s
}
