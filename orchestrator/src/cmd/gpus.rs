//! `memra-orch gpus`: the inventory a run would use, as a table or as the JSON the receipts
//! record. The table is followed by each GPU's machine-wide lease (free, or who holds it);
//! the JSON stays the inventory alone, in the shape `run.json` records.

use crate::ExitCode;
use crate::cli::GpusArgs;
use crate::gpus::{GpusFormat, detect, render_text};
use crate::lease::{LockDir, render_leases};

/// The `gpus` subcommand.
pub fn command(args: &GpusArgs) -> ExitCode {
    let inv = detect(&args.gpus);
    if let Some(note) = &inv.note {
        eprintln!("note: {note}");
    }
    match args.format {
        GpusFormat::Text => {
            print!("{}", render_text(&inv));
            if !inv.gpus.is_empty() {
                print!("{}", render_leases(&LockDir::from_env(), &inv.gpus));
            }
        }
        GpusFormat::Json => {
            println!(
                "{}",
                serde_json::to_string_pretty(&inv).expect("inventory serializes")
            );
        }
    }
    ExitCode::Ok
}
