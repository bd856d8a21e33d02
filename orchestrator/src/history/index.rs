//! The history index: `<receipts>/.memra-index/<manifest>.jsonl`, one [`RunRecord`] a line,
//! so `history` over a year of nightlies reads one file instead of every `receipt.json` of
//! every run.
//!
//! The index is only a cache; the trees are the truth. Every read checks it against the
//! runs on disk (the set of run folders and each `run.json`'s mtime, size and inode): a run
//! whose record is missing, stale, of another format or on a torn line is read from its
//! tree again, a record of a deleted run is dropped, and the index is rewritten (temporary
//! file + rename) when anything differed. `run` appends the line of a run when it finishes
//! (one `write` of the whole line in append mode); two writers racing can only lose a line,
//! which the next read rebuilds. Nothing here writes inside a run's tree.

use std::collections::HashMap;
use std::io::{Read, Seek, SeekFrom, Write};

use std::path::{Path, PathBuf};

use rayon::prelude::*;

use super::build::{self, RunOnDisk};
use super::{HistoryError, INDEX_SCHEMA, RunRecord, Stamp};
use crate::receipt::error::{ReceiptError, ReceiptErrorKind as Kind};

/// The folder of the index files under a receipts folder.
pub const INDEX_DIR: &str = ".memra-index";

/// How [`records`] uses the index.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Mode {
    /// Read it, check it, read what it lacks from the trees, and rewrite it when it was
    /// not up to date.
    #[default]
    Use,
    /// Read every run from its tree; neither read nor write the index.
    Ignore,
}

/// The index file of a manifest.
pub fn path(receipts: &Path, manifest: &str) -> PathBuf {
    receipts.join(INDEX_DIR).join(format!("{manifest}.jsonl"))
}

/// The index as read: the trustworthy records by run folder, and whether any line was not
/// (torn, unreadable, unsealed or wrongly sealed, another format, a duplicate, a run no
/// longer on disk).
#[derive(Debug, Default)]
struct Cached {
    records: HashMap<String, RunRecord>,
    untrusted: bool,
}

/// The largest index read; one past it is not trusted and is rebuilt from the trees (a
/// year of a thousand-cell nightly is well under it).
const MAX_INDEX_BYTES: u64 = 1 << 30;

/// The longest line read: a line is one run, a few hundred bytes a cell. A longer one is
/// skipped unread (and the index rewritten), so a planted giant line costs no memory.
const MAX_LINE_BYTES: usize = 16 << 20;

/// Lines are parsed in parallel in batches of about this many bytes: reading stays in
/// bounded memory beyond the records kept, however large the file.
const BATCH_BYTES: usize = 8 << 20;

/// And at most this many lines a batch (a run's line is kilobytes; a flood of short lines
/// must not pile up either).
const BATCH_LINES: usize = 1024;

/// The seal of a line's JSON: its sha256, in hex. A line is written `<seal> <json>`.
fn seal(json: &[u8]) -> String {
    crate::digest::sha256_hex(json)
}

/// The record on one line, when the line is whole, sealed by its own JSON and of this
/// format.
fn parse_line(line: &[u8]) -> Option<RunRecord> {
    let (sealed, json) = line.split_at_checked(64)?;
    let json = json.strip_prefix(b" ")?;
    if sealed != seal(json).as_bytes() {
        return None;
    }
    serde_json::from_slice::<RunRecord>(json)
        .ok()
        .filter(|r| r.schema == INDEX_SCHEMA)
}

/// Reads the index at `path`, keeping the records `wanted` accepts (a record it refuses
/// marks the index for rewriting).
fn read_index(path: &Path, wanted: &(dyn Fn(&RunRecord) -> bool + Sync)) -> Cached {
    use std::io::BufRead;
    let mut out = Cached::default();
    // Any gate can write under the receipts folder: the index is opened without following
    // a link and without blocking (a FIFO in its place would hang every read), and only a
    // plain file of a sane size is read. Anything else is an index to rebuild.
    let f = match crate::attempt_file::open_path(path) {
        Ok(f) => f,
        Err(e) if e.is_refusal() => {
            out.untrusted = true;
            return out;
        }
        Err(_) => return out,
    };
    if f.metadata().map_or(true, |m| m.len() > MAX_INDEX_BYTES) {
        out.untrusted = true;
        return out;
    }
    let mut reader = std::io::BufReader::new(f.take(MAX_INDEX_BYTES));
    let mut batch: Vec<Vec<u8>> = Vec::new();
    let mut batch_bytes = 0usize;
    let mut done = false;
    while !done {
        let mut line = Vec::new();
        match (&mut reader)
            .take(MAX_LINE_BYTES as u64 + 1)
            .read_until(b'\n', &mut line)
        {
            Ok(0) => done = true,
            Ok(_) if line.ends_with(b"\n") => {
                line.pop();
                // Shorter than a seal and a space cannot be a record: not worth keeping.
                if line.len() <= 65 {
                    out.untrusted = true;
                } else {
                    batch_bytes += line.len();
                    batch.push(line);
                }
            }
            Ok(_) if line.len() > MAX_LINE_BYTES => {
                // Too long to be a run: skip to the end of the line without keeping it.
                out.untrusted = true;
                loop {
                    let buf = match reader.fill_buf() {
                        Ok(b) => b,
                        Err(_) => {
                            done = true;
                            break;
                        }
                    };
                    if buf.is_empty() {
                        done = true;
                        break;
                    }
                    match buf.iter().position(|b| *b == b'\n') {
                        Some(i) => {
                            reader.consume(i + 1);
                            break;
                        }
                        None => {
                            let n = buf.len();
                            reader.consume(n);
                        }
                    }
                }
            }
            // A last line without a newline is a torn line (a writer died mid-append)
            // and is never trusted; so is a file that cannot be read to its end.
            Ok(_) | Err(_) => {
                out.untrusted = true;
                done = true;
            }
        }
        if batch_bytes >= BATCH_BYTES || batch.len() >= BATCH_LINES || (done && !batch.is_empty()) {
            take_batch(std::mem::take(&mut batch), wanted, &mut out);
            batch_bytes = 0;
        }
    }
    out
}

/// Parses a batch of lines in parallel (a line is a whole run of up to thousands of cells:
/// that is what makes a warm read of a year of nightlies quick) and keeps what is wanted.
fn take_batch(lines: Vec<Vec<u8>>, wanted: &(dyn Fn(&RunRecord) -> bool + Sync), out: &mut Cached) {
    let parsed: Vec<Option<RunRecord>> = lines
        .par_iter()
        .map(|line| parse_line(line).filter(|r| wanted(r)))
        .collect();
    for parsed in parsed {
        match parsed {
            Some(r) => {
                // Two lines of one run: the later one is newer, but the file wants
                // rewriting.
                if out.records.insert(r.run.dir.clone(), r).is_some() {
                    out.untrusted = true;
                }
            }
            None => out.untrusted = true,
        }
    }
}

/// Every run of `manifest` under `receipts`, oldest first (by start, then run id), read
/// through the index (see the module's header).
pub fn records(
    receipts: &Path,
    manifest: &str,
    mode: Mode,
) -> Result<Vec<RunRecord>, HistoryError> {
    let on_disk = build::runs_on_disk(receipts, manifest);
    let stamps: HashMap<&str, Stamp> = on_disk.iter().map(|r| (r.rel.as_str(), r.stamp)).collect();
    let mut cached = match mode {
        // Only records of runs on disk, of the run.json on disk, are kept while reading.
        Mode::Use => read_index(&path(receipts, manifest), &|r: &RunRecord| {
            stamps.get(r.run.dir.as_str()) == Some(&r.stamp)
        }),
        Mode::Ignore => Cached::default(),
    };
    let mut out: Vec<RunRecord> = Vec::with_capacity(on_disk.len());
    let mut missing: Vec<&RunOnDisk> = Vec::new();
    for r in &on_disk {
        match cached.records.remove(&r.rel) {
            Some(rec) => out.push(rec),
            None => missing.push(r),
        }
    }
    let fresh: Vec<Result<Option<RunRecord>, ReceiptError>> = missing
        .par_iter()
        .map(|r| match build::read(r) {
            Ok(rec) => Ok(Some(rec)),
            // A folder whose run.json cannot be read is not a run (as for `ls`); a receipt
            // that cannot be read is a broken run, and history says so.
            Err(e) if e.path == r.dir.join("run.json") => Ok(None),
            Err(e) => Err(e),
        })
        .collect();
    for f in fresh {
        out.extend(f?);
    }
    sort(&mut out);
    let stale = !missing.is_empty() || cached.untrusted;
    if mode == Mode::Use && stale {
        // The index is a cache: a receipts folder that cannot be written (a read-only
        // mount) still gets a right answer, only a slower one.
        let _ = write(receipts, manifest, &out);
    }
    Ok(out)
}

/// Oldest first by start time; a run of unknown age (dated in the future, or a start that
/// does not parse) comes before every other (as `ls` lists it last), so it never stands as
/// the newest night.
fn sort(records: &mut [RunRecord]) {
    records.sort_by_cached_key(|r| {
        (
            !crate::receipt::resolve::unknown_age(&r.run.start),
            crate::receipt::resolve::start_time(&r.run.start),
            r.run.id.clone(),
            r.run.dir.clone(),
        )
    });
}

/// A record's line: `<seal> <json>\n`.
fn line(record: &RunRecord, path: &Path) -> Result<Vec<u8>, ReceiptError> {
    let json =
        serde_json::to_vec(record).map_err(|e| ReceiptError::new(path, Kind::Serialise(e)))?;
    let mut bytes = seal(&json).into_bytes();
    bytes.push(b' ');
    bytes.extend(json);
    bytes.push(b'\n');
    Ok(bytes)
}

/// Rewrites the index of `manifest` to hold exactly `records` (temporary file + rename).
pub fn write(receipts: &Path, manifest: &str, records: &[RunRecord]) -> Result<(), ReceiptError> {
    let file = path(receipts, manifest);
    index_dir(receipts)?;
    let mut bytes = Vec::new();
    for r in records {
        bytes.extend(line(r, &file)?);
    }
    crate::receipt::write_atomic(&file, &bytes)
}

/// The index folder, made when missing; a link or anything but a folder at its name is
/// refused (the index would be written wherever it leads).
fn index_dir(receipts: &Path) -> Result<PathBuf, ReceiptError> {
    let dir = receipts.join(INDEX_DIR);
    match std::fs::symlink_metadata(&dir) {
        Ok(m) if m.file_type().is_dir() => Ok(dir),
        Ok(_) => Err(ReceiptError::new(
            &dir,
            Kind::CreateFolder(std::io::Error::other(
                "a link or a file where the index folder belongs; remove it",
            )),
        )),
        Err(_) => {
            std::fs::create_dir_all(&dir)
                .map_err(|e| ReceiptError::new(&dir, Kind::CreateFolder(e)))?;
            Ok(dir)
        }
    }
}

/// Appends the record of a run that just finished to its manifest's index, in one write.
/// A file left ending in a torn line gets a newline first, so the new line stands alone.
pub fn append(receipts: &Path, manifest: &str, record: &RunRecord) -> Result<(), ReceiptError> {
    use std::os::unix::fs::OpenOptionsExt;
    let file = path(receipts, manifest);
    index_dir(receipts)?;
    let mut bytes = line(record, &file)?;
    // Never through a link, never blocking on a FIFO, only into a plain file: anything else
    // at the index's name is refused (the next read rebuilds the index from the trees).
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(&file)
        .map_err(|e| ReceiptError::new(&file, Kind::Create(e)))?;
    if !f.metadata().is_ok_and(|m| m.is_file()) {
        return Err(ReceiptError::new(
            &file,
            Kind::Create(std::io::Error::other("not a plain file; remove it")),
        ));
    }
    let len = f
        .metadata()
        .map_err(|e| ReceiptError::new(&file, Kind::Read(e)))?
        .len();
    if len > 0 {
        let mut last = [0u8; 1];
        let read = f
            .seek(SeekFrom::Start(len - 1))
            .and_then(|_| f.read_exact(&mut last));
        if read.is_ok() && last[0] != b'\n' {
            bytes.insert(0, b'\n');
        }
    }
    f.write_all(&bytes)
        .map_err(|e| ReceiptError::new(&file, Kind::Write(e)))
}

/// Drops the records of runs that no longer exist (after `gc`), without reading any tree;
/// a record whose run changed stays for the next read to replace.
pub fn prune(receipts: &Path, manifest: &str) -> Result<(), ReceiptError> {
    let file = path(receipts, manifest);
    if !file.exists() {
        return Ok(());
    }
    let on_disk: std::collections::HashSet<String> = build::runs_on_disk(receipts, manifest)
        .into_iter()
        .map(|r| r.rel)
        .collect();
    let cached = read_index(&file, &|r: &RunRecord| on_disk.contains(&r.run.dir));
    let mut kept: Vec<RunRecord> = cached.records.into_values().collect();
    sort(&mut kept);
    write(receipts, manifest, &kept)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A run of manifest `m` at commit `c` with one cell `a` whose receipt has `inputs`.
    fn run(receipts: &Path, id: &str, start: &str, inputs: &str) -> PathBuf {
        let dir = receipts.join("c/m").join(id);
        std::fs::create_dir_all(dir.join("nodes/a-1")).unwrap();
        let run = serde_json::json!({
            "schema": 1, "run_id": id, "name": "m",
            "manifest": {"path": "m", "bytes": 0, "sha256": ""},
            "env_matrices": [], "commit": "c", "commit_sha": null, "dirty": false, "host": "h",
            "orchestrator_version": "0", "inventory": null, "cpu_slots": 1, "filters": [],
            "resumed": false, "start": start, "end": start, "seconds": 1.0,
            "interrupted": false, "counts": {"pass": 1}, "verdict": "pass",
            "nodes": [{"id": "a", "kind": "arm", "slug": "a-1", "verdict": "pass", "seconds": 2.0}]
        });
        std::fs::write(dir.join("run.json"), run.to_string()).unwrap();
        let receipt = serde_json::json!({"inputs": inputs, "seconds": 2.0,
            "checks": [{"check": "acc", "status": "pass", "metrics": {"max_abs": 0.5}}],
            "artifacts": [{"name": "out.bin", "bytes": 1, "sha256": "ab"}]});
        std::fs::write(dir.join("nodes/a-1/receipt.json"), receipt.to_string()).unwrap();
        dir
    }

    const ID1: &str = "20261201T000000.000Z-aaaa";
    const ID2: &str = "20261202T000000.000Z-bbbb";

    #[test]
    fn the_index_is_checked_against_the_trees() {
        let tmp = tempfile::tempdir().unwrap();
        let r = tmp.path();
        run(r, ID2, "2026-12-02T00:00:00Z", "i2");
        let first = run(r, ID1, "2026-12-01T00:00:00Z", "i1");
        let got = records(r, "m", Mode::Use).unwrap();
        let ids: Vec<&str> = got.iter().map(|x| x.run.id.as_str()).collect();
        assert_eq!(ids, [ID1, ID2], "oldest first");
        assert_eq!(got[0].cells["a"].metrics["acc/max_abs"], 0.5);
        let file = path(r, "m");
        assert_eq!(std::fs::read_to_string(&file).unwrap().lines().count(), 2);
        // The cache answers without the trees' receipts...
        std::fs::remove_file(first.join("nodes/a-1/receipt.json")).unwrap();
        assert_eq!(records(r, "m", Mode::Use).unwrap(), got);
        // ...but never when run.json changed: that run is read again (and now has no
        // receipt for its cell).
        let text = std::fs::read_to_string(first.join("run.json")).unwrap();
        std::fs::write(first.join("run.json"), format!("{text} ")).unwrap();
        assert_eq!(records(r, "m", Mode::Use).unwrap()[0].cells["a"].inputs, "");
        std::fs::remove_dir_all(&first).unwrap();
        let first = run(r, ID1, "2026-12-01T00:00:00Z", "other");
        // A torn last line and a line of garbage are not trusted.
        let mut bytes = std::fs::read(&file).unwrap();
        bytes.extend(b"not json\n{\"schema\":1,\"stamp\":");
        std::fs::write(&file, &bytes).unwrap();
        let got = records(r, "m", Mode::Use).unwrap();
        assert_eq!(got[0].cells["a"].inputs, "other");
        let text = std::fs::read_to_string(&file).unwrap();
        assert_eq!(text.lines().count(), 2, "rewritten whole:\n{text}");
        // A deleted run drops out, by a read or by prune.
        std::fs::remove_dir_all(&first).unwrap();
        prune(r, "m").unwrap();
        assert_eq!(std::fs::read_to_string(&file).unwrap().lines().count(), 1);
        assert_eq!(records(r, "m", Mode::Use).unwrap().len(), 1);
        // An append after a torn line stands on a line of its own.
        let only = records(r, "m", Mode::Ignore).unwrap();
        std::fs::write(&file, b"{\"torn").unwrap();
        append(r, "m", &only[0]).unwrap();
        let cached = read_index(&file, &|_| true);
        assert_eq!(cached.records.len(), 1);
        assert!(cached.untrusted);
    }

    #[test]
    fn an_edited_line_is_not_trusted_even_with_its_stamp_kept() {
        let tmp = tempfile::tempdir().unwrap();
        let r = tmp.path();
        run(r, ID1, "2026-12-01T00:00:00Z", "i1");
        let truth = records(r, "m", Mode::Use).unwrap();
        let file = path(r, "m");
        let text = std::fs::read_to_string(&file).unwrap();
        assert!(text.contains("\"verdict\":\"pass\""), "{text}");
        // The seal left as it was, or the line written without one: either way the run is
        // read from its tree again.
        std::fs::write(&file, text.replace("\"max_abs\":0.5", "\"max_abs\":0.0")).unwrap();
        assert_eq!(records(r, "m", Mode::Use).unwrap(), truth);
        let unsealed = text
            .split_once(' ')
            .unwrap()
            .1
            .replace("\"max_abs\":0.5", "\"max_abs\":0.0");
        std::fs::write(&file, unsealed).unwrap();
        assert_eq!(records(r, "m", Mode::Use).unwrap(), truth);
        assert_eq!(
            std::fs::read_to_string(&file).unwrap(),
            text,
            "rewritten from the tree"
        );
    }

    #[test]
    fn a_line_too_long_to_be_a_run_is_skipped_unread() {
        let tmp = tempfile::tempdir().unwrap();
        let r = tmp.path();
        run(r, ID1, "2026-12-01T00:00:00Z", "i1");
        run(r, ID2, "2026-12-02T00:00:00Z", "i2");
        let truth = records(r, "m", Mode::Use).unwrap();
        let file = path(r, "m");
        let text = std::fs::read_to_string(&file).unwrap();
        let (first, second) = text.split_once('\n').unwrap();
        let mut planted = format!("{first}\n").into_bytes();
        planted.extend(std::iter::repeat_n(b'x', MAX_LINE_BYTES + 4096));
        planted.push(b'\n');
        planted.extend(second.as_bytes());
        std::fs::write(&file, &planted).unwrap();
        let cached = read_index(&file, &|_| true);
        assert!(cached.untrusted);
        assert_eq!(cached.records.len(), 2, "the lines around it are read");
        assert_eq!(records(r, "m", Mode::Use).unwrap(), truth);
        assert_eq!(std::fs::read_to_string(&file).unwrap(), text);
    }
}
