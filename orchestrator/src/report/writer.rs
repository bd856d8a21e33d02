//! The receipt writer: a run listener that files each node's receipt as soon as the node
//! finishes, keeps `run.json` current (written at the start with `verdict = "running"`,
//! rewritten at the end), and renders `summary.md` and `junit.xml` when the run ends, after
//! pin attestation (`attest`) added its warnings to the receipts concerned.
//!
//! Every file is written atomically, so a run killed at any point leaves a tree that
//! `run --resume` can complete. Receipts carried forward from an earlier run are listed in
//! `run.json` with where they are, never copied or rewritten.

use super::junit::RenderError;
use crate::receipt::error::{ReceiptError, ReceiptErrorKind as Kind};
use crate::receipt::tree::Tree;
use crate::receipt::{NodeIndexEntry, NodeReceipt, RunReceipt, write_atomic, write_json};
use crate::run::events::{Event, FinishError, Listener};
use crate::words::diskfull::{DiskFull, Reserve};

/// Writes the receipt tree of one run.
#[derive(Debug)]
pub struct ReceiptWriter {
    tree: Tree,
    run: RunReceipt,
    entries: Vec<Option<NodeIndexEntry>>,
    receipts: Vec<Option<Box<NodeReceipt>>>,
    /// Every compare's (reference, candidate) cell positions, for pin attestation.
    pairs: Vec<(usize, usize)>,
    attest: Vec<String>,
    errors: Vec<WriteError>,
    /// Set when a write finds the disk full; shared with the run loop.
    disk_full: DiskFull,
    /// Space kept back in the tree for the last writes of a run whose disk fills.
    reserve: Option<Reserve>,
}

/// One file of the receipt tree that could not be written.
#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    #[error(transparent)]
    Receipt(#[from] ReceiptError),
    #[error(transparent)]
    Junit(#[from] RenderError),
}

/// The receipt tree a run left is missing files or holds stale ones: every write that
/// failed, in the order the run attempted them. Each one's text ends in what to do.
#[derive(Debug, thiserror::Error)]
#[error(
    "the receipt tree is incomplete: {}",
    errors.iter().map(ToString::to_string).collect::<Vec<_>>().join("; ")
)]
pub struct IncompleteTree {
    pub errors: Vec<WriteError>,
}

impl ReceiptWriter {
    /// `header` is `run.json` as known before the run (no nodes, no end).
    pub fn new(tree: Tree, header: RunReceipt, cells: usize) -> ReceiptWriter {
        ReceiptWriter {
            tree,
            run: header,
            entries: vec![None; cells],
            receipts: vec![None; cells],
            pairs: Vec::new(),
            attest: Vec::new(),
            errors: Vec::new(),
            disk_full: DiskFull::new(),
            reserve: None,
        }
    }

    /// The flag the run loop watches: a write that finds the disk full sets it.
    pub fn with_disk_full(mut self, flag: DiskFull) -> ReceiptWriter {
        self.disk_full = flag;
        self
    }

    /// The compares' (reference, candidate) cell positions, so attestation also checks that
    /// a candidate's differing pins show in its doors row.
    /// The manifest's `attest` prefixes: variables named so must be reported read.
    pub fn with_attest(mut self, prefixes: Vec<String>) -> ReceiptWriter {
        self.attest = prefixes;
        self
    }

    pub fn with_pairs(mut self, pairs: Vec<(usize, usize)>) -> ReceiptWriter {
        self.pairs = pairs;
        self
    }

    /// The receipt of each cell, by plan order (`None` for cells not written).
    pub fn receipts(&self) -> &[Option<Box<NodeReceipt>>] {
        &self.receipts
    }

    /// `run.json` as last written.
    pub fn run(&self) -> &RunReceipt {
        &self.run
    }

    /// Keeps a failed write for [`Listener::finish`]; a disk-full one also sets the flag.
    /// Returns whether the write succeeded.
    fn record(&mut self, r: Result<(), impl Into<WriteError>>) -> bool {
        match r {
            Ok(()) => true,
            Err(e) => {
                let e = e.into();
                if let WriteError::Receipt(re) = &e
                    && re.is_disk_full()
                {
                    self.disk_full.set(&re.path);
                }
                self.errors.push(e);
                false
            }
        }
    }
}

impl Listener for ReceiptWriter {
    // Over 150 lines: one arm per `Event` variant, each filing what its event means in the
    // receipt tree.
    fn on_event(&mut self, event: &Event) {
        match event {
            Event::RunStarted { .. } => {
                let nodes = self.tree.nodes();
                let r = std::fs::create_dir_all(&nodes)
                    .map_err(|e| ReceiptError::new(nodes, Kind::Create(e)))
                    .and_then(|()| write_json(&self.tree.run_json(), &self.run));
                self.record(r);
                self.reserve = Some(Reserve::take(&self.tree.dir));
            }
            Event::NodeFinished {
                cell,
                id,
                kind,
                verdict,
                reason,
                seconds,
                receipt,
                carried,
            } => {
                self.entries[cell.0] = Some(NodeIndexEntry {
                    id: id.0.clone(),
                    kind: *kind,
                    slug: receipt.as_ref().map(|r| r.slug.clone()),
                    verdict: *verdict,
                    seconds: *seconds,
                    reason: reason.clone(),
                    carried: carried.clone(),
                    warns: receipt
                        .as_ref()
                        .map_or(0, |r| u32::try_from(r.warnings().len()).unwrap_or(u32::MAX)),
                    warning: receipt.as_ref().and_then(|r| r.warning_line()),
                });
                if let Some(r) = receipt {
                    // A carried receipt stays in the tree of the run that measured it.
                    if carried.is_none() {
                        let dir = self.tree.node_dir(&r.slug);
                        let res = std::fs::create_dir_all(&dir)
                            .map_err(|e| ReceiptError::new(dir, Kind::Create(e)))
                            .and_then(|()| write_json(&self.tree.receipt_json(&r.slug), r));
                        let full = res.as_ref().is_err_and(ReceiptError::is_disk_full);
                        if !self.record(res)
                            && full
                            && let Some(e) = self.entries[cell.0].as_mut()
                        {
                            // The index says what happened to a cell whose receipt is lost.
                            e.reason = Some(format!(
                                "disk full at {}: its receipt could not be written (the cell ended {})",
                                self.tree.dir.display(),
                                e.verdict
                            ));
                            e.verdict = crate::words::verdict::Verdict::Error;
                            e.slug = None;
                        }
                    }
                    self.receipts[cell.0] = Some(r.clone());
                }
            }
            Event::RunFinished {
                counts,
                elapsed,
                interrupted,
                unmet,
            } => {
                // A full disk: give the reserve back first, so the last files fit.
                let full = self.disk_full.get().map(|p| p.display().to_string());
                if full.is_some()
                    && let Some(mut r) = self.reserve.take()
                {
                    r.release();
                }
                self.run.nodes = self.entries.iter().flatten().cloned().collect();
                self.run.counts = counts.clone();
                if full.is_some() {
                    // Cells whose receipts were lost changed verdict here.
                    self.run.counts =
                        crate::words::verdict::count(self.run.nodes.iter().map(|n| n.verdict));
                }
                self.run.disk_full = full.clone();
                self.run.end = Some(
                    humantime::format_rfc3339_millis(std::time::SystemTime::now()).to_string(),
                );
                self.run.seconds = Some(elapsed.as_secs_f64());
                self.run.interrupted = *interrupted;
                self.run.unmet = unmet.clone();
                let ok = counts.iter().all(|(v, n)| *n == 0 || v.as_expected());
                let ok = ok && full.is_none();
                // Only the hardware went wrong: every cell as expected or a device fault.
                let hardware = !self.run.quarantined_gpus.is_empty()
                    && counts.iter().all(|(v, n)| {
                        *n == 0
                            || v.as_expected()
                            || *v == crate::words::verdict::Verdict::DeviceFault
                    });
                self.run.verdict = if ok && !interrupted && unmet.is_none() && !hardware {
                    "pass"
                } else if hardware && full.is_none() && !interrupted && unmet.is_none() {
                    "device-fault"
                } else {
                    "fail"
                }
                .to_string();
                // Pin attestation needs every cell's doors row, so it runs once all are in;
                // it only adds warning checks, so receipts filed earlier stay valid until
                // they are rewritten here.
                let (findings, unread, changed) =
                    crate::report::attest::attest(&mut self.receipts, &self.pairs, &self.attest);
                for i in changed {
                    // Another run's tree is never written: a carried receipt keeps what its
                    // own run attested, and this run's summary lists the findings.
                    let carried = self.entries[i]
                        .as_ref()
                        .is_some_and(|e| e.carried.is_some());
                    if carried {
                        continue;
                    }
                    if let Some(r) = &self.receipts[i] {
                        let res = write_json(&self.tree.receipt_json(&r.slug), r);
                        self.record(res);
                    }
                }
                let r = write_json(&self.tree.run_json(), &self.run);
                self.record(r);
                let mut md = super::summary::markdown(&self.run);
                md.push_str(&crate::report::attest::markdown(&findings, &unread));
                let r = write_atomic(&self.tree.summary_md(), md.as_bytes());
                self.record(r);
                match super::junit::render(&self.run, &self.receipts) {
                    Ok(xml) => {
                        let r = write_atomic(&self.tree.junit_xml(), xml.as_bytes());
                        self.record(r);
                    }
                    Err(e) => {
                        self.record(Err(e));
                    }
                }
                if let Some(mut r) = self.reserve.take() {
                    r.release();
                }
            }
            Event::GpuQuarantined {
                id,
                gpu,
                uuid,
                fault,
                retry,
                ..
            } => {
                self.run.quarantined_gpus.push(crate::receipt::Quarantined {
                    gpu: *gpu,
                    uuid: uuid.clone(),
                    cell: id.0.clone(),
                    fault: fault.clone(),
                    retried: *retry,
                });
            }
            Event::NodeStarted { .. }
            | Event::WaitingForGpu { .. }
            | Event::AttemptFinished { .. }
            | Event::JobChanged { .. }
            | Event::StillRunning { .. } => {}
        }
    }

    fn finish(&mut self) -> Result<(), FinishError> {
        if self.errors.is_empty() {
            Ok(())
        } else {
            Err(FinishError::new(IncompleteTree {
                errors: std::mem::take(&mut self.errors),
            }))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_incomplete_tree_lists_every_failed_write() {
        let denied = || std::io::Error::from(std::io::ErrorKind::PermissionDenied);
        let e = IncompleteTree {
            errors: vec![
                ReceiptError::new("/r/run.json", Kind::Write(denied())).into(),
                ReceiptError::new("/r/nodes", Kind::Create(denied())).into(),
            ],
        };
        let d = denied();
        assert_eq!(
            e.to_string(),
            format!(
                "the receipt tree is incomplete: /r/run.json: cannot write: {d}; check the \
                 receipt folder is writable; /r/nodes: cannot create: {d}; check the receipt \
                 folder is writable"
            )
        );
    }
}
