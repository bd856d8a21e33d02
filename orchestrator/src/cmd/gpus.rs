//! `memra-orch gpus`: the inventory a run would use, as a table or as the JSON the receipts
//! record. The table is followed by each GPU's machine-wide lease (free, or who holds it);
//! the JSON stays the inventory alone, in the shape `run.json` records.

use crate::cmd::cli::GpusArgs;
use crate::machine::gpus::{GpusFormat, detect, render_text};
use crate::machine::lease::{LockDir, render_leases};
use crate::words::exit::ExitCode;

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
        GpusFormat::Json if !args.health => {
            println!(
                "{}",
                serde_json::to_string_pretty(&inv).expect("inventory serializes")
            );
        }
        GpusFormat::Json => {}
    }
    if args.health {
        let monitor = match crate::machine::health::Monitor::new() {
            Ok(m) if inv.source == crate::machine::gpus::InventorySource::Nvml => m.with_nvml(),
            Ok(m) => m,
            Err(e) => {
                eprintln!("memra-orch gpus: {e}");
                return ExitCode::Usage;
            }
        };
        let readings: Vec<(
            crate::machine::health::GpuRef,
            String,
            crate::machine::health::Reading,
        )> = inv
            .gpus
            .iter()
            .map(|g| {
                let r = crate::machine::health::GpuRef {
                    index: g.index,
                    uuid: g.uuid.clone(),
                };
                let reading = monitor.read_at_rest(&r);
                (r, g.name.clone(), reading)
            })
            .collect();
        match args.format {
            GpusFormat::Text => print!("{}", crate::machine::health::render(&readings)),
            GpusFormat::Json => {
                let rows: Vec<serde_json::Value> = readings
                    .iter()
                    .map(|(g, name, r)| {
                        serde_json::json!({
                            "gpu": g.index, "uuid": g.uuid, "name": name,
                            "health": r, "unfit": r.standing_fault(),
                        })
                    })
                    .collect();
                println!(
                    "{}",
                    serde_json::to_string_pretty(&rows).expect("readings serialize")
                );
            }
        }
    }
    ExitCode::Ok
}
