//! `memra-orch history [CELL-FILTER…]`: finds the receipts folder and the manifest (the only
//! one there, or `--manifest`), reads the history of the selected cells through the index
//! and prints it. Exit 0; 2 when the receipts, the manifest or a matching cell cannot be
//! found, or a run's receipts cannot be read part-way (what was printed before stands, the
//! error follows on stderr); 3 when the output cannot be written. A closed pipe ends it
//! quietly with 0 (`| head`), the index closed as after any read.
//!
//! The cells are read from the index [`PART`] at a time by a thread of their own, while
//! this one formats and writes the part before; each part is freed once written (back on
//! the reading thread, where it was allocated). A thousand cells' timelines are never all
//! in memory, and the JSON is the model [`history::History`] serializes, written a part at
//! a time.

use std::io::Write as _;

use crate::cmd::cli::HistoryArgs;
use crate::history::render::{self, HistoryFormat};
use crate::words::exit::ExitCode;
use std::sync::mpsc::Receiver;

use crate::history::{self, HistoryError, Options, index, steps};
use crate::receipt::resolve::receipts_root;

/// How many cells are read and printed at once.
const PART: usize = 64;

/// The `history` subcommand.
pub fn command(args: &HistoryArgs) -> ExitCode {
    let mut out = std::io::stdout().lock();
    match command_inner(args, &mut out).and_then(|()| out.flush().map_err(Failure::Write)) {
        Ok(()) => ExitCode::Ok,
        // A closed pipe (`| head`) is not an error of the command.
        Err(Failure::Write(e)) if e.kind() == std::io::ErrorKind::BrokenPipe => ExitCode::Ok,
        Err(Failure::Write(e)) => {
            eprintln!("memra-orch history: cannot write the output: {e}");
            ExitCode::Internal
        }
        Err(Failure::Read(message)) => {
            eprintln!("memra-orch history: {message}");
            ExitCode::Usage
        }
    }
}

enum Failure {
    Read(String),
    Write(std::io::Error),
}

impl From<HistoryError> for Failure {
    fn from(e: HistoryError) -> Self {
        Failure::Read(e.to_string())
    }
}

/// What the reading thread sends: the window's head, then its cells a part at a time, then
/// the end (a channel that closes before it is a reader that stopped: an error, never a
/// shorter history).
enum Message {
    Head {
        receipts: std::path::PathBuf,
        manifest: String,
        runs: Vec<history::RunSummary>,
        cells: usize,
    },
    Part(Vec<history::CellHistory>),
    End,
}

fn command_inner(args: &HistoryArgs, out: &mut impl std::io::Write) -> Result<(), Failure> {
    let receipts =
        receipts_root(args.receipts.as_deref()).map_err(|e| Failure::Read(e.to_string()))?;
    let manifest = history::pick_manifest(&receipts, args.manifest.as_deref())?;
    let opts = Options {
        filters: args.filters.clone(),
        last: args.last.map(|n| usize::try_from(n).unwrap_or(usize::MAX)),
        index: index::Mode::Use,
    };
    // One thread reads the index while this one formats and writes what it read before.
    std::thread::scope(|s| {
        let (tx, rx) = std::sync::mpsc::sync_channel::<Result<Message, HistoryError>>(2);
        // Parts written come back to be freed where they were allocated (a free from
        // another thread contends for the reader's arena).
        let (done_tx, done_rx) = std::sync::mpsc::channel::<Vec<history::CellHistory>>();
        s.spawn(move || {
            let window = match history::open(&receipts, &manifest, &opts) {
                Ok(w) => w,
                Err(e) => {
                    let _ = tx.send(Err(e));
                    return;
                }
            };
            let head = Message::Head {
                receipts: window.receipts().to_path_buf(),
                manifest: window.manifest().to_string(),
                runs: window.runs().to_vec(),
                cells: window.cells().len(),
            };
            if tx.send(Ok(head)).is_err() {
                return;
            }
            for part in window.cells().chunks(PART) {
                let read = window.part(part).map(|h| Message::Part(h.cells));
                let failed = read.is_err();
                // A closed channel is a writer that stopped (a closed pipe, an error).
                if tx.send(read).is_err() || failed {
                    return;
                }
                while let Ok(part) = done_rx.try_recv() {
                    drop(part);
                }
            }
            let _ = tx.send(Ok(Message::End));
        });
        write(args, &rx, &done_tx, out)
    })
}

/// The next message; a channel closed early is an error.
fn next(rx: &Receiver<Result<Message, HistoryError>>) -> Result<Message, Failure> {
    match rx.recv() {
        Ok(m) => Ok(m?),
        Err(_) => Err(Failure::Read(
            "the index reader stopped before the last cell; run the command again".into(),
        )),
    }
}

/// Formats what the reader sends, a part at a time, and writes it to `out`.
fn write(
    args: &HistoryArgs,
    rx: &Receiver<Result<Message, HistoryError>>,
    done: &std::sync::mpsc::Sender<Vec<history::CellHistory>>,
    out: &mut impl std::io::Write,
) -> Result<(), Failure> {
    let Message::Head {
        receipts,
        manifest,
        runs,
        cells: count,
    } = next(rx)?
    else {
        return Err(Failure::Read("the index reader sent no head".into()));
    };
    // Cell names and messages came from manifests and gates: no control or bidirectional
    // character reaches the terminal raw (JSON escapes its own).
    let mut put = |text: &str| {
        let text = match args.format {
            HistoryFormat::Json => std::borrow::Cow::Borrowed(text),
            _ => crate::words::escape::terminal(text, false),
        };
        out.write_all(text.as_bytes()).map_err(Failure::Write)
    };
    // Each part, until the end.
    let mut each = |f: &mut dyn FnMut(&[history::CellHistory]) -> Result<(), Failure>| loop {
        match next(rx)? {
            Message::Part(cells) => {
                f(&cells)?;
                let _ = done.send(cells);
            }
            Message::End => return Ok::<(), Failure>(()),
            Message::Head { .. } => {
                return Err(Failure::Read("the index reader sent a second head".into()));
            }
        }
    };
    if args.steps {
        let mut items = Vec::new();
        each(&mut |cells| {
            items.extend(steps::steps_of(cells));
            Ok(())
        })?;
        steps::sort(&mut items);
        let text = match args.format {
            HistoryFormat::Json => {
                serde_json::to_string_pretty(&items).map_err(|e| Failure::Read(e.to_string()))?
                    + "\n"
            }
            f => {
                let scope = steps::Scope {
                    manifest: &manifest,
                    cells: count,
                    runs: runs.len(),
                };
                steps::render(&scope, &items, f == HistoryFormat::Markdown)
            }
        };
        return put(&text);
    }
    let headline = render::headline_of(&manifest, &runs, count);
    let (head, render_cells): (String, fn(&mut String, &[history::CellHistory])) = match args.format
    {
        HistoryFormat::Json => {
            let model = history::History {
                receipts,
                manifest,
                runs,
                cells: Vec::new(),
            };
            return json(&model, &mut put, &mut each);
        }
        HistoryFormat::Text => (headline, render::text_cells),
        HistoryFormat::Markdown => (render::markdown_head(&headline), render::markdown_cells),
    };
    put(&format!("{head}\n"))?;
    let mut text = String::new();
    each(&mut |cells| {
        text.clear();
        render_cells(&mut text, cells);
        put(&text)
    })
}

/// The whole history model as JSON, written as [`history::History`] serializes: `model`'s
/// fields (it holds no cells) and then the cells a part at a time.
fn json(
    model: &history::History,
    put: &mut impl FnMut(&str) -> Result<(), Failure>,
    each: &mut impl FnMut(
        &mut dyn FnMut(&[history::CellHistory]) -> Result<(), Failure>,
    ) -> Result<(), Failure>,
) -> Result<(), Failure> {
    let bad = |e: serde_json::Error| Failure::Read(e.to_string());
    // The model with no cells ends `"cells": []\n}`: its head is everything before the
    // brackets, and each cell follows at the indentation of an element of that list.
    let empty = serde_json::to_string_pretty(model).map_err(bad)?;
    let head = empty
        .strip_suffix("[]\n}")
        .ok_or_else(|| Failure::Read("the history model did not end with its cells".into()))?;
    put(head)?;
    put("[")?;
    let mut first = true;
    let mut text = String::new();
    each(&mut |cells| {
        text.clear();
        for c in cells {
            text.push_str(if first { "\n    " } else { ",\n    " });
            first = false;
            let cell = serde_json::to_string_pretty(c).map_err(bad)?;
            text.push_str(&cell.replace('\n', "\n    "));
        }
        put(&text)
    })?;
    // No cell: the list stays `[]`, as the model with none prints.
    put(if first { "]\n}\n" } else { "\n  ]\n}\n" })
}
