//! `memra-orch gpus`: the inventory a run would use, as a table or as the JSON the receipts
//! record.

use crate::ExitCode;
use crate::cli::GpusArgs;
use crate::gpus::{GpusFormat, detect, render_text};

/// The `gpus` subcommand.
pub fn command(args: &GpusArgs) -> ExitCode {
    let inv = detect(&args.gpus);
    if let Some(note) = &inv.note {
        eprintln!("note: {note}");
    }
    match args.format {
        GpusFormat::Text => print!("{}", render_text(&inv)),
        GpusFormat::Json => {
            println!(
                "{}",
                serde_json::to_string_pretty(&inv).expect("inventory serializes")
            );
        }
    }
    ExitCode::Ok
}
