//! `memra-orch history [CELL-FILTER…]`: finds the receipts folder and the manifest (the only
//! one there, or `--manifest`), reads the history of the selected cells through the index
//! and prints it. Exit 0; 2 when the receipts, the manifest or a matching cell cannot be
//! found.

use crate::ExitCode;
use crate::cli::HistoryArgs;
use crate::history::{self, HistoryError, Options, index};
use crate::receipt::resolve::receipts_root;

/// The `history` subcommand.
pub fn command(args: &HistoryArgs) -> ExitCode {
    match command_inner(args) {
        Ok(text) => {
            print!("{text}");
            ExitCode::Ok
        }
        Err(message) => {
            eprintln!("memra-orch history: {message}");
            ExitCode::Usage
        }
    }
}

fn command_inner(args: &HistoryArgs) -> Result<String, String> {
    let receipts = receipts_root(args.receipts.as_deref()).map_err(|e| e.to_string())?;
    let manifest = history::pick_manifest(&receipts, args.manifest.as_deref())
        .map_err(|e: HistoryError| e.to_string())?;
    let opts = Options {
        filters: args.filters.clone(),
        last: args.last.map(|n| usize::try_from(n).unwrap_or(usize::MAX)),
        index: index::Mode::Use,
    };
    let h = history::load(&receipts, &manifest, &opts).map_err(|e| e.to_string())?;
    let text = if args.steps {
        use crate::history::render::HistoryFormat;
        let items = history::steps::feed(&h);
        match args.format {
            HistoryFormat::Json => {
                serde_json::to_string_pretty(&items).map_err(|e| e.to_string())? + "\n"
            }
            f => history::steps::render(&h, &items, f == HistoryFormat::Markdown),
        }
    } else {
        history::render::render(&h, args.format)
    };
    // Cell names and messages came from manifests and gates: no control or bidirectional
    // character reaches the terminal raw (JSON escapes its own).
    Ok(match args.format {
        crate::history::render::HistoryFormat::Json => text,
        _ => crate::report::escape::terminal(&text, false).into_owned(),
    })
}
