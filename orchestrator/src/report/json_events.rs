//! `run --events json`: the run as a stream of JSON lines on stdout, one object per event,
//! for tools that follow a run live (as nextest's `--message-format libtest-json` does).
//!
//! Every line carries `"type"` and `"schema"` ([`EVENTS_SCHEMA`]); the types are
//! `run-started`, `cell-started`, `attempt-finished`, `cell-finished` and, once `run.json`
//! is final and the exit code known, `run-finished` (written by [`JsonEvents::finish_run`]).
//! Each line is flushed as it is written. The events arrive redacted (the runner sends every
//! event through `Event::redacted`), so no secret reaches the stream; JSON escapes control
//! characters itself. This module owns the line format only: the human display, and where
//! it goes, are `progress`'s and the `run` command's.

use std::collections::BTreeMap;
use std::io::Write;

use serde::Serialize;

use crate::plan::NodeKind;
use crate::receipt::RunReceipt;
use crate::receipt::tree::Tree;
use crate::run::events::{Event, Listener, Placement};
use crate::words::exit::ExitCode;
use crate::words::verdict::Verdict;

/// The version of the line format. A change that removes or renames a field, or changes
/// its meaning, bumps it; new fields and new `type`s may appear within a version, so a
/// consumer ignores what it does not know.
pub const EVENTS_SCHEMA: u32 = 1;

/// The formats of `run --events`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum EventFormat {
    /// One JSON object per line on stdout.
    Json,
}

/// One line of the stream.
#[derive(Serialize)]
#[serde(tag = "type", rename_all = "kebab-case")]
enum Line<'a> {
    RunStarted {
        schema: u32,
        run: &'a str,
        manifest: &'a str,
        commit: &'a str,
        tree: String,
        start: &'a str,
        cells: usize,
        gpus: usize,
        cpu_slots: usize,
    },
    CellStarted {
        schema: u32,
        cell: &'a str,
        /// The GPUs' indices as exported in CUDA_VISIBLE_DEVICES; empty on a CPU slot.
        gpus: Vec<u32>,
        cpu_slot: Option<usize>,
    },
    AttemptFinished {
        schema: u32,
        cell: &'a str,
        attempt: u32,
        rep: u32,
        outcome: Verdict,
        seconds: f64,
    },
    CellFinished {
        schema: u32,
        cell: &'a str,
        kind: NodeKind,
        verdict: Verdict,
        as_expected: bool,
        reason: Option<&'a str>,
        seconds: f64,
        gpus: Vec<u32>,
        receipt: Option<String>,
        carried_from: Option<&'a str>,
    },
    /// A GPU faulted during a cell's attempt and takes no new cells for the rest of the run.
    GpuQuarantined {
        schema: u32,
        cell: &'a str,
        gpu: u32,
        uuid: &'a str,
        fault: &'a str,
        /// How the cell's try on the GPU ended.
        ended: Verdict,
        /// The cell runs again on a healthy GPU of the same model.
        retry: bool,
    },
    RunFinished {
        schema: u32,
        run: &'a str,
        verdict: &'a str,
        exit: i32,
        counts: &'a BTreeMap<Verdict, usize>,
        cells: usize,
        seconds: Option<f64>,
        end: Option<&'a str>,
        interrupted: bool,
        unmet: Option<&'a str>,
        disk_full: Option<&'a str>,
    },
}

/// The JSON-lines listener, writing to `out` (stdout in `run`).
pub struct JsonEvents<W: Write> {
    sink: Sink<W>,
    tree: Tree,
    header: RunReceipt,
    /// The `Gpu::index` of each inventory position, for placements.
    gpu_index: Vec<u32>,
}

impl<W: Write> JsonEvents<W> {
    /// `header` is `run.json` as known before the run; `gpu_index` maps inventory positions
    /// to the GPUs' exported indices.
    pub fn new(out: W, tree: Tree, header: RunReceipt, gpu_index: Vec<u32>) -> JsonEvents<W> {
        JsonEvents {
            sink: Sink { out, broken: false },
            tree,
            header,
            gpu_index,
        }
    }

    /// Writes the last line, `run-finished`, from the run as recorded and the exit code.
    pub fn finish_run(&mut self, run: &RunReceipt, exit: ExitCode) {
        self.sink.write(&Line::RunFinished {
            schema: EVENTS_SCHEMA,
            run: run.run_id.as_deref().unwrap_or("-"),
            verdict: &run.verdict,
            exit: exit.code(),
            counts: &run.counts,
            cells: run.nodes.len(),
            seconds: run.seconds,
            end: run.end.as_deref(),
            interrupted: run.interrupted,
            unmet: run.unmet.as_deref(),
            disk_full: run.disk_full.as_deref(),
        });
    }

    /// The writer handed to [`JsonEvents::new`].
    pub fn into_inner(self) -> W {
        self.sink.out
    }
}

/// Where the lines go.
struct Sink<W: Write> {
    out: W,
    /// Set once a write failed (the reader went away): the run goes on without the stream.
    broken: bool,
}

impl<W: Write> Sink<W> {
    fn write(&mut self, line: &Line<'_>) {
        if self.broken {
            return;
        }
        let mut text = serde_json::to_vec(line).expect("an event line serialises");
        text.push(b'\n');
        if let Err(e) = self.out.write_all(&text).and_then(|()| self.out.flush()) {
            self.broken = true;
            eprintln!(
                "memra-orch run: --events json: cannot write to stdout ({e}); the run goes on \
                 without the event stream"
            );
        }
    }
}

impl<W: Write> Listener for JsonEvents<W> {
    fn on_event(&mut self, event: &Event) {
        let line = match event {
            Event::RunStarted {
                total,
                gpus,
                cpu_slots,
                ..
            } => {
                let h = &self.header;
                Line::RunStarted {
                    schema: EVENTS_SCHEMA,
                    run: h.run_id.as_deref().unwrap_or("-"),
                    manifest: &h.name,
                    commit: &h.commit,
                    tree: self.tree.dir.to_string_lossy().into_owned(),
                    start: &h.start,
                    cells: *total,
                    gpus: *gpus,
                    cpu_slots: *cpu_slots,
                }
            }
            Event::NodeStarted { id, placement, .. } => {
                let (gpus, cpu_slot) = match placement {
                    Placement::Gpus(list) => (
                        list.iter()
                            .map(|&i| self.gpu_index.get(i).copied().unwrap_or(i as u32))
                            .collect(),
                        None,
                    ),
                    Placement::CpuSlot(s) => (Vec::new(), Some(*s)),
                };
                Line::CellStarted {
                    schema: EVENTS_SCHEMA,
                    cell: &id.0,
                    gpus,
                    cpu_slot,
                }
            }
            Event::AttemptFinished {
                id,
                attempt,
                rep,
                outcome,
                seconds,
                ..
            } => Line::AttemptFinished {
                schema: EVENTS_SCHEMA,
                cell: &id.0,
                attempt: *attempt,
                rep: *rep,
                outcome: *outcome,
                seconds: *seconds,
            },
            Event::NodeFinished {
                id,
                kind,
                verdict,
                reason,
                seconds,
                receipt,
                carried,
                ..
            } => {
                // A carried receipt is read where the run that measured it filed it.
                let path = receipt.as_ref().and_then(|r| match carried {
                    Some(c) => self
                        .tree
                        .carried_node_dir(c, &r.slug)
                        .map(|d| d.join("receipt.json")),
                    None => Some(self.tree.receipt_json(&r.slug)),
                });
                Line::CellFinished {
                    schema: EVENTS_SCHEMA,
                    cell: &id.0,
                    kind: *kind,
                    verdict: *verdict,
                    as_expected: verdict.as_expected(),
                    reason: reason.as_deref(),
                    seconds: *seconds,
                    gpus: receipt
                        .as_ref()
                        .map(|r| r.gpus.iter().map(|g| g.index).collect())
                        .unwrap_or_default(),
                    receipt: path.map(|p| p.to_string_lossy().into_owned()),
                    carried_from: carried.as_ref().and_then(|c| c.run.as_deref()),
                }
            }
            Event::GpuQuarantined {
                id,
                gpu,
                uuid,
                fault,
                ended,
                retry,
                ..
            } => Line::GpuQuarantined {
                schema: EVENTS_SCHEMA,
                cell: &id.0,
                gpu: *gpu,
                uuid,
                fault,
                ended: *ended,
                retry: *retry,
            },
            // Heartbeats, GPU waits and cluster job states are for the display; the last
            // line waits for run.json (`finish_run`).
            Event::WaitingForGpu { .. }
            | Event::JobChanged { .. }
            | Event::StillRunning { .. }
            | Event::RunFinished { .. } => return,
        };
        self.sink.write(&line);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A writer whose reader went away.
    struct Closed;

    impl Write for Closed {
        fn write(&mut self, _: &[u8]) -> std::io::Result<usize> {
            Err(std::io::ErrorKind::BrokenPipe.into())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    fn header() -> RunReceipt {
        serde_json::from_value(serde_json::json!({
            "schema": 1, "run_id": "20261201T224109.123Z-3f9a", "name": "m",
            "manifest": {"path": "m.toml", "bytes": 0, "sha256": ""}, "env_matrices": [], "commit": "c",
            "commit_sha": null, "dirty": false, "host": "h", "orchestrator_version": "0",
            "inventory": null, "cpu_slots": 1, "filters": [], "resumed": false,
            "start": "2026-12-01T22:41:09.123Z", "end": null, "seconds": null,
            "interrupted": false, "counts": {}, "verdict": "running", "nodes": []
        }))
        .unwrap()
    }

    fn started() -> Event {
        Event::RunStarted {
            total: 2,
            estimates: vec![None, None],
            gpus: 1,
            cpu_slots: 1,
        }
    }

    #[test]
    fn a_line_names_its_type_and_schema_and_places_by_exported_index() {
        let tree = Tree { dir: "/r/t".into() };
        let mut l = JsonEvents::new(Vec::new(), tree, header(), vec![3]);
        l.on_event(&started());
        l.on_event(&Event::NodeStarted {
            cell: crate::plan::CellIndex(0),
            id: crate::plan::CellId("a".into()),
            placement: Placement::Gpus(vec![0]),
        });
        let text = String::from_utf8(l.into_inner()).unwrap();
        let lines: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines[0]["type"], "run-started");
        assert_eq!(lines[0]["schema"], EVENTS_SCHEMA);
        assert_eq!(lines[0]["run"], "20261201T224109.123Z-3f9a");
        assert_eq!(lines[1]["type"], "cell-started");
        assert_eq!(lines[1]["gpus"], serde_json::json!([3]));
        assert_eq!(lines[1]["cpu_slot"], serde_json::Value::Null);
    }

    #[test]
    fn a_closed_stdout_stops_the_stream_and_not_the_run() {
        let tree = Tree { dir: "/r/t".into() };
        let mut l = JsonEvents::new(Closed, tree, header(), Vec::new());
        l.on_event(&started());
        assert!(l.sink.broken);
        l.finish_run(&header(), ExitCode::Ok);
    }
}
