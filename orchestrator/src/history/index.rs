//! The history index: one SQLite database, `<receipts>/.memra-index/index.sqlite` (WAL
//! journal), holding for every run of every manifest its summary and, per cell, the facts
//! history shows (verdict, `inputs` digest, seconds, tags, and the whole [`CellFacts`]),
//! with the cells' metrics and artifact digests in tables of their own for anyone who
//! queries the file. `history`, `report`, the run aliases and `diff`'s flaky window read it
//! instead of every receipt of every run, and read only the rows they show: one cell's
//! history over a year reads one row a run.
//!
//! The index is only a cache; the trees are the truth. Every open checks it against the
//! runs on disk (the set of run folders and each `run.json`'s mtime, size and inode): a run
//! whose rows are missing or stale is read from its tree again and filed, the rows of a
//! deleted run go (checked again under the write lock), all in one write transaction. The
//! reads that follow see one snapshot; a run whose rows are not in it as they should be (filed
//! meanwhile from another `run.json`, dropped by another process, edited) is read from its
//! tree, so an answer never lacks a run or holds a stale one. Every row carries a seal (the
//! sha256 of its run folder, cell id and JSON); a row whose seal does not match, or a run whose
//! cell rows are not the cells its cell set names, is not trusted: its run is read from the
//! tree and its rows dropped for the next open to file again. A database SQLite finds
//! corrupt, or of another schema, is rebuilt from the trees — deleted only under an exclusive
//! lock (`.memra-index/lock`, which every open holds shared), so never under another process
//! that has it open; one that cannot be opened or written at all (a read-only mount, a link or
//! a FIFO at its name, a lock held past 30 s) is not used: history reads the trees, slower but
//! right, and says so on stderr. `run` writes the rows of a run when it finishes, in one
//! transaction. Nothing here writes inside a run's tree.

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::ops::Range;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::time::Duration;

use rayon::prelude::*;
use rusqlite::{Connection, OpenFlags, OptionalExtension, TransactionBehavior, params};

use super::build::{self, RunOnDisk};
use super::{CellFacts, HistoryError, INDEX_SCHEMA, RunRecord, RunSummary, Stamp};
use crate::receipt::error::ReceiptError;

/// The folder of the index under a receipts folder.
pub const INDEX_DIR: &str = ".memra-index";

/// The database's file name in [`INDEX_DIR`].
pub const DB_FILE: &str = "index.sqlite";

/// The lock every open holds shared, and a rebuild exclusive, in [`INDEX_DIR`].
const LOCK_FILE: &str = "lock";

/// The schema of the database (SQLite's `user_version`). A file of another version is
/// rebuilt.
const DB_VERSION: i64 = 107;

/// How long a reader or writer waits for another process's write to end.
const BUSY: Duration = Duration::from_secs(30);

/// How [`open`] uses the index.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Mode {
    /// Open it, check it against the trees, bring it up to date, and read from it.
    #[default]
    Use,
    /// Read every run from its tree; neither read nor write the index.
    Ignore,
}

/// The index database under a receipts folder.
pub fn path(receipts: &Path) -> PathBuf {
    receipts.join(INDEX_DIR).join(DB_FILE)
}

const SCHEMA: &str = "
CREATE TABLE runs(
    id INTEGER PRIMARY KEY,
    manifest TEXT NOT NULL,
    dir TEXT NOT NULL UNIQUE,
    mtime_ns INTEGER NOT NULL,
    size INTEGER NOT NULL,
    inode INTEGER NOT NULL,
    run_id TEXT NOT NULL,
    start TEXT NOT NULL,
    verdict TEXT NOT NULL,
    summary TEXT NOT NULL,
    cellset TEXT NOT NULL,
    seal TEXT NOT NULL
);
CREATE INDEX runs_by_manifest ON runs(manifest);
CREATE TABLE cellsets(
    digest TEXT PRIMARY KEY,
    outline TEXT NOT NULL
);
CREATE TABLE cells(
    run INTEGER NOT NULL,
    cell TEXT NOT NULL,
    verdict TEXT NOT NULL,
    good INTEGER NOT NULL,
    inputs TEXT NOT NULL,
    seconds REAL NOT NULL,
    tags TEXT NOT NULL,
    facts TEXT NOT NULL,
    seal TEXT NOT NULL,
    PRIMARY KEY(run, cell)
);
CREATE INDEX cells_by_cell ON cells(cell, run);
CREATE TABLE metrics(
    run INTEGER NOT NULL,
    cell TEXT NOT NULL,
    name TEXT NOT NULL,
    value REAL,
    PRIMARY KEY(run, cell, name)
) WITHOUT ROWID;
CREATE TABLE artifacts(
    run INTEGER NOT NULL,
    cell TEXT NOT NULL,
    name TEXT NOT NULL,
    sha256 TEXT NOT NULL,
    PRIMARY KEY(run, cell, name)
) WITHOUT ROWID;
";

/// Why the database could not serve.
#[derive(Debug)]
enum DbError {
    /// SQLite says the file is not a database, or a damaged one: rebuild it.
    Corrupt(rusqlite::Error),
    /// Anything else (permissions, a full disk, a lock held too long, a link at its name).
    Unusable(String),
}

impl From<rusqlite::Error> for DbError {
    fn from(e: rusqlite::Error) -> Self {
        if is_corrupt(&e) {
            DbError::Corrupt(e)
        } else {
            DbError::Unusable(e.to_string())
        }
    }
}

fn is_corrupt(e: &rusqlite::Error) -> bool {
    use rusqlite::ErrorCode::{DatabaseCorrupt, NotADatabase};
    matches!(e.sqlite_error_code(), Some(DatabaseCorrupt | NotADatabase))
}

impl std::fmt::Display for DbError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DbError::Corrupt(e) => write!(f, "corrupt ({e})"),
            DbError::Unusable(why) => f.write_str(why),
        }
    }
}

/// The seal of a row: the sha256, in hex, of what names it and its JSON.
fn seal(parts: &[&str]) -> String {
    crate::words::digest::sha256_hex(parts.join("\0").as_bytes())
}

/// Whether `sealed` is [`seal`] of `parts` (computed without joining them).
fn is_sealed(sealed: &str, parts: &[&str]) -> bool {
    use sha2::Digest as _;
    let mut h = sha2::Sha256::new();
    for (k, p) in parts.iter().enumerate() {
        if k > 0 {
            h.update(b"\0");
        }
        h.update(p.as_bytes());
    }
    let digest = h.finalize();
    sealed.len() == 64
        && sealed
            .as_bytes()
            .chunks(2)
            .zip(digest.iter())
            .all(|(pair, b)| pair == hex_pair(*b).as_slice())
}

/// A byte as two lower-case hex digits.
fn hex_pair(b: u8) -> [u8; 2] {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    [DIGITS[usize::from(b >> 4)], DIGITS[usize::from(b & 15)]]
}

/// Column `k` of `row` as text borrowed from SQLite (a value of another type is an error,
/// as a row that is not what was written).
fn borrowed<'r>(row: &'r rusqlite::Row, k: usize) -> rusqlite::Result<&'r str> {
    row.get_ref(k)?.as_str().map_err(|e| {
        rusqlite::Error::FromSqlConversionFailure(k, rusqlite::types::Type::Text, Box::new(e))
    })
}

/// The seal of a cell set's outline: its digest, which is also its key.
fn set_digest(outline: &str) -> String {
    crate::words::digest::sha256_hex(outline.as_bytes())
}

/// The index folder's lock, held shared by every open connection and exclusive by a rebuild
/// that deletes the file.
struct IndexLock {
    _held: std::fs::File,
}

impl IndexLock {
    /// The lock file, made when missing; never through a link, never a FIFO.
    fn open(receipts: &Path) -> Result<std::fs::File, DbError> {
        use std::os::unix::fs::OpenOptionsExt;
        let file = receipts.join(INDEX_DIR).join(LOCK_FILE);
        let f = std::fs::OpenOptions::new()
            .create(true)
            .read(true)
            .write(true)
            .truncate(false)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
            .open(&file)
            .map_err(|e| DbError::Unusable(format!("cannot open {}: {e}", file.display())))?;
        if !f.metadata().is_ok_and(|m| m.is_file()) {
            return Err(DbError::Unusable(format!(
                "{} is not a plain file; remove it",
                file.display()
            )));
        }
        Ok(f)
    }

    fn shared(receipts: &Path) -> Result<IndexLock, DbError> {
        let f = Self::open(receipts)?;
        // SAFETY: flock on a descriptor this function owns.
        if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_SH) } != 0 {
            return Err(DbError::Unusable(format!(
                "cannot lock the index: {}",
                std::io::Error::last_os_error()
            )));
        }
        Ok(IndexLock { _held: f })
    }

    /// The exclusive lock, only if no other process holds the index open.
    fn exclusive_now(receipts: &Path) -> Option<IndexLock> {
        let f = Self::open(receipts).ok()?;
        // SAFETY: flock on a descriptor this function owns.
        let got = unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0;
        got.then_some(IndexLock { _held: f })
    }
}

/// Deletes a damaged database so that the next open rebuilds it, when no other process holds
/// it open (deleting a SQLite file under an open connection corrupts what it writes next).
/// Says whether it did.
fn remove_damaged(receipts: &Path) -> bool {
    let Some(_exclusive) = IndexLock::exclusive_now(receipts) else {
        return false;
    };
    for f in db_files(&path(receipts)) {
        let _ = std::fs::remove_file(f);
    }
    true
}

/// The database and the files SQLite keeps beside it.
fn db_files(file: &Path) -> [PathBuf; 4] {
    ["", "-wal", "-shm", "-journal"].map(|suffix| {
        let mut p = file.as_os_str().to_owned();
        p.push(suffix);
        PathBuf::from(p)
    })
}

/// The history of one manifest as the index holds it, checked against the trees: its runs
/// oldest first, and the cells of any of them on demand.
pub struct Index {
    runs: Vec<RunSummary>,
    source: Source,
    /// The database file (for messages).
    file: PathBuf,
    receipts: PathBuf,
}

// One per command: boxing the database's side would buy nothing.
#[allow(clippy::large_enum_variant)]
enum Source {
    /// Rows in the database; `keys[i]` is the row id of `runs[i]` (`None`: the run was read
    /// from its tree), `on_disk[i]` its folder, `cellsets[i]` its cell set's digest.
    Db {
        conn: Box<Connection>,
        _lock: IndexLock,
        keys: Vec<Option<i64>>,
        on_disk: Vec<RunOnDisk>,
        cellsets: Vec<String>,
        /// Runs read from their trees instead of their rows, by position.
        replaced: RefCell<HashMap<usize, Rc<RunRecord>>>,
        /// Row ids whose rows were not what was written, dropped when the index closes.
        untrusted: RefCell<Vec<(i64, String)>>,
        /// The cell ids of each cell set read so far, by digest.
        sets: RefCell<HashMap<String, Rc<Outline>>>,
        /// SQLite met a damaged page while reading: the file is rebuilt when it closes.
        damaged: Cell<bool>,
    },
    /// Every record in memory (read from the trees).
    Memory(Vec<RunRecord>),
}

/// Opens the history of `manifest` under `receipts` (see the module's header).
pub fn open(receipts: &Path, manifest: &str, mode: Mode) -> Result<Index, HistoryError> {
    let on_disk = build::runs_on_disk(receipts, manifest);
    if mode == Mode::Ignore {
        return from_trees(on_disk);
    }
    let file = path(receipts);
    let mut tries = 0;
    loop {
        tries += 1;
        match open_db(receipts, &file, manifest, &on_disk) {
            Ok(Ok(index)) => return Ok(index),
            Ok(Err(e)) => return Err(e),
            Err(DbError::Corrupt(e)) if tries == 1 => {
                if remove_damaged(receipts) {
                    eprintln!(
                        "memra-orch: the history index {} is damaged ({e}); rebuilding it from the run folders",
                        file.display()
                    );
                } else {
                    eprintln!(
                        "memra-orch: the history index {} is damaged ({e}) and open in another memra-orch; reading the run folders instead (it is rebuilt once no other process has it open)",
                        file.display()
                    );
                    return from_trees(on_disk);
                }
            }
            Err(e) => {
                eprintln!(
                    "memra-orch: the history index {} cannot be used ({e}); reading the run folders instead",
                    file.display()
                );
                return from_trees(on_disk);
            }
        }
    }
}

/// [`open`] for a reader that has a cheaper way than every receipt of every run (the run
/// heads: each `run.json` alone): `None`, without a word on stderr, where the database
/// cannot serve (it cannot be opened or written, is damaged and open in another process,
/// or a run's receipts cannot be read), so the caller reads what it needs itself.
pub fn open_rows(receipts: &Path, manifest: &str) -> Option<Index> {
    let on_disk = build::runs_on_disk(receipts, manifest);
    let file = path(receipts);
    for tries in 1..=2 {
        match open_db(receipts, &file, manifest, &on_disk) {
            Ok(Ok(index)) => return Some(index),
            Err(DbError::Corrupt(e)) if tries == 1 && remove_damaged(receipts) => {
                eprintln!(
                    "memra-orch: the history index {} is damaged ({e}); rebuilding it from the run folders",
                    file.display()
                );
            }
            _ => return None,
        }
    }
    None
}

/// Every run of `manifest` under `receipts`, oldest first (by start, then run id), with
/// every cell: [`open`] and [`Index::records`] of all runs.
pub fn records(
    receipts: &Path,
    manifest: &str,
    mode: Mode,
) -> Result<Vec<RunRecord>, HistoryError> {
    let index = open(receipts, manifest, mode)?;
    index.records(0..index.runs.len(), None)
}

fn from_trees(on_disk: Vec<RunOnDisk>) -> Result<Index, HistoryError> {
    let refs: Vec<&RunOnDisk> = on_disk.iter().collect();
    let mut records: Vec<RunRecord> = read_trees(&refs)?
        .into_iter()
        .filter_map(|(_, r)| r)
        .collect();
    sort(&mut records, |r| (&r.run.start, &r.run.id, &r.run.dir));
    Ok(Index {
        runs: records.iter().map(|r| r.run.clone()).collect(),
        source: Source::Memory(records),
        file: PathBuf::new(),
        receipts: PathBuf::new(),
    })
}

/// Reads runs from their trees in parallel, each with `None` for a folder whose run.json
/// cannot be read (not a run, as for `ls`) or that went or changed while it was read; a
/// receipt that cannot be read in a run still there is a broken run, and history says so.
fn read_trees<'a>(
    runs: &[&'a RunOnDisk],
) -> Result<Vec<(&'a RunOnDisk, Option<RunRecord>)>, HistoryError> {
    let fresh: Vec<Result<(&RunOnDisk, Option<RunRecord>), ReceiptError>> = runs
        .par_iter()
        .map(|r| match build::read(r) {
            Ok(rec) => Ok((*r, Some(rec))),
            Err(e) if e.path == r.dir.join("run.json") => Ok((*r, None)),
            // A run deleted (by gc) or replaced while it was read is not a broken run: it is
            // left out as one no longer there, or read again by the next command.
            Err(_) if build::stamp(&r.dir.join("run.json")) != Some(r.stamp) => Ok((*r, None)),
            Err(e) => Err(e),
        })
        .collect();
    let mut out = Vec::with_capacity(fresh.len());
    for f in fresh {
        out.push(f?);
    }
    Ok(out)
}

/// Oldest first by start time; a run of unknown age (dated in the future, or a start that
/// does not parse) comes before every other (as `ls` lists it last), so it never stands as
/// the newest night.
fn sort<T>(items: &mut [T], key: impl Fn(&T) -> (&String, &String, &String)) {
    items.sort_by_cached_key(|r| {
        let (start, id, dir) = key(r);
        (
            !crate::receipt::resolve::unknown_age(start),
            crate::receipt::resolve::start_time(start),
            id.clone(),
            dir.clone(),
        )
    });
}

/// The database, opened read-write and made when missing, with the index's shared lock.
/// The index folder and the file must be what they claim: a link or anything but a plain
/// file at either name is refused (the index would be written wherever it leads, or a FIFO
/// would hang every read).
fn connect(receipts: &Path, file: &Path) -> Result<(Connection, IndexLock), DbError> {
    let dir = receipts.join(INDEX_DIR);
    match std::fs::symlink_metadata(&dir) {
        Ok(m) if m.file_type().is_dir() => {}
        Ok(_) => {
            return Err(DbError::Unusable(format!(
                "{} is a link or a file, not the index folder; remove it",
                dir.display()
            )));
        }
        Err(_) => std::fs::create_dir_all(&dir)
            .map_err(|e| DbError::Unusable(format!("cannot create {}: {e}", dir.display())))?,
    }
    let lock = IndexLock::shared(receipts)?;
    for p in db_files(file) {
        if let Ok(m) = std::fs::symlink_metadata(&p)
            && !m.file_type().is_file()
        {
            return Err(DbError::Unusable(format!(
                "{} is not a plain file; remove it",
                p.display()
            )));
        }
    }
    let conn = Connection::open_with_flags(
        file,
        OpenFlags::SQLITE_OPEN_READ_WRITE
            | OpenFlags::SQLITE_OPEN_CREATE
            | OpenFlags::SQLITE_OPEN_NO_MUTEX
            | OpenFlags::SQLITE_OPEN_NOFOLLOW,
    )?;
    conn.busy_timeout(BUSY)?;
    conn.pragma_update(None, "journal_mode", "WAL")?;
    conn.pragma_update(None, "synchronous", "NORMAL")?;
    let version: i64 = conn.pragma_query_value(None, "user_version", |r| r.get(0))?;
    if version != DB_VERSION {
        let tx = conn.unchecked_transaction_immediate()?;
        // Checked again under the write lock: another process may have made it meanwhile.
        let version: i64 = tx.pragma_query_value(None, "user_version", |r| r.get(0))?;
        if version != DB_VERSION {
            tx.execute_batch(
                "DROP TABLE IF EXISTS runs; DROP TABLE IF EXISTS cells;
                 DROP TABLE IF EXISTS metrics; DROP TABLE IF EXISTS artifacts;
                 DROP TABLE IF EXISTS cellsets;",
            )?;
            tx.execute_batch(SCHEMA)?;
            tx.pragma_update(None, "user_version", DB_VERSION)?;
        }
        tx.commit()?;
    }
    Ok((conn, lock))
}

/// A write transaction taken at once (`BEGIN IMMEDIATE`): the index's connection is
/// shared by reference, which `Connection::transaction_with_behavior` does not take.
trait Immediate {
    fn unchecked_transaction_immediate(&self) -> rusqlite::Result<rusqlite::Transaction<'_>>;
}

impl Immediate for Connection {
    fn unchecked_transaction_immediate(&self) -> rusqlite::Result<rusqlite::Transaction<'_>> {
        rusqlite::Transaction::new_unchecked(self, TransactionBehavior::Immediate)
    }
}

/// Brings the rows of `manifest` up to date with `on_disk` and opens a read snapshot of
/// them. The outer error is the database's; the inner one a tree's (a broken run, which
/// history reports rather than hides).
fn open_db(
    receipts: &Path,
    file: &Path,
    manifest: &str,
    on_disk: &[RunOnDisk],
) -> Result<Result<Index, HistoryError>, DbError> {
    let (conn, lock) = connect(receipts, file)?;
    let rows = stamps(&conn, manifest)?;
    let listed: HashMap<&str, &RunOnDisk> = on_disk.iter().map(|r| (r.rel.as_str(), r)).collect();
    let stale: Vec<&RunOnDisk> = on_disk
        .iter()
        .filter(|r| rows.get(&r.rel) != Some(&r.stamp))
        .collect();
    let gone: Vec<&String> = rows
        .keys()
        .filter(|d| !listed.contains_key(d.as_str()))
        .collect();
    // Read before the write lock is taken, so other processes wait only for the writes.
    let fresh = match read_trees(&stale) {
        Ok(f) => f,
        Err(e) => return Ok(Err(e)),
    };
    if !fresh.is_empty() || !gone.is_empty() {
        let tx = conn.unchecked_transaction_immediate()?;
        for dir in gone {
            // A run filed by another process after this one listed the folders is not gone.
            if build::stamp(&receipts.join(dir).join("run.json")).is_none() {
                delete_run(&tx, dir)?;
            }
        }
        for (disk, record) in &fresh {
            match record {
                Some(r) => insert(&tx, manifest, r)?,
                // Not a run (any more): no rows of it either.
                None => delete_run(&tx, &disk.rel)?,
            }
        }
        tx.commit()?;
    }
    let fresh: HashMap<&str, RunRecord> = fresh
        .into_iter()
        .filter_map(|(d, r)| Some((d.rel.as_str(), r?)))
        .collect();
    // One snapshot for every read that follows, so the runs and their cells agree.
    conn.execute_batch("BEGIN")?;
    let mut held: HashMap<String, (i64, Stamp, String, String, String)> = HashMap::new();
    {
        let mut q = conn.prepare_cached(
            "SELECT id, dir, mtime_ns, size, inode, summary, cellset, seal FROM runs WHERE manifest = ?1",
        )?;
        let mut rows = q.query(params![manifest])?;
        while let Some(row) = rows.next()? {
            let dir: String = row.get(1)?;
            let stamp = Stamp {
                mtime_ns: row.get(2)?,
                size: row.get::<_, i64>(3)? as u64,
                inode: row.get::<_, i64>(4)? as u64,
            };
            held.insert(
                dir,
                (row.get(0)?, stamp, row.get(5)?, row.get(6)?, row.get(7)?),
            );
        }
    }
    // Every run on disk is in the answer: from its rows when they are there, sealed and of
    // the run.json listed, else from its tree (filed meanwhile from another run.json, or
    // dropped by another process: the next open files it again).
    let mut runs: Vec<Listed> = Vec::with_capacity(on_disk.len());
    let mut untrusted = Vec::new();
    let mut missing: Vec<&RunOnDisk> = Vec::new();
    for disk in on_disk {
        let row = held.remove(&disk.rel);
        let trusted = row
            .as_ref()
            .and_then(|(id, stamp, summary, cellset, sealed)| {
                if *sealed != seal(&[&disk.rel, summary, cellset]) {
                    untrusted.push((*id, disk.rel.clone()));
                    return None;
                }
                let s = serde_json::from_str::<RunSummary>(summary).ok()?;
                (*stamp == disk.stamp && s.dir == disk.rel).then(|| (s, *id, cellset.clone()))
            });
        match trusted {
            Some((s, id, cellset)) => runs.push((s, Some(id), disk.clone(), cellset, None)),
            None => match fresh.get(disk.rel.as_str()) {
                Some(r) => runs.push((
                    r.run.clone(),
                    None,
                    disk.clone(),
                    String::new(),
                    Some(r.clone()),
                )),
                None => missing.push(disk),
            },
        }
    }
    let late = match read_trees(&missing) {
        Ok(f) => f,
        Err(e) => return Ok(Err(e)),
    };
    for (disk, record) in late {
        if let Some(r) = record {
            runs.push((r.run.clone(), None, disk.clone(), String::new(), Some(r)));
        }
    }
    sort(&mut runs, |(s, ..)| (&s.start, &s.id, &s.dir));
    let mut summaries = Vec::with_capacity(runs.len());
    let mut keys = Vec::with_capacity(runs.len());
    let mut disk = Vec::with_capacity(runs.len());
    let mut cellsets = Vec::with_capacity(runs.len());
    let mut replaced = HashMap::new();
    for (i, (summary, key, d, cellset, record)) in runs.into_iter().enumerate() {
        summaries.push(summary);
        keys.push(key);
        disk.push(d);
        cellsets.push(cellset);
        if let Some(r) = record {
            replaced.insert(i, Rc::new(r));
        }
    }
    Ok(Ok(Index {
        runs: summaries,
        source: Source::Db {
            conn: Box::new(conn),
            _lock: lock,
            keys,
            on_disk: disk,
            cellsets,
            replaced: RefCell::new(replaced),
            untrusted: RefCell::new(untrusted),
            sets: RefCell::new(HashMap::new()),
            damaged: Cell::new(false),
        },
        file: file.to_path_buf(),
        receipts: receipts.to_path_buf(),
    }))
}

/// A run as an open lists it: its summary, row id (`None`: read from its tree), folder, cell
/// set digest, and its record when read from the tree.
type Listed = (
    RunSummary,
    Option<i64>,
    RunOnDisk,
    String,
    Option<RunRecord>,
);

/// The stamps of the runs of `manifest` the database holds, by folder.
fn stamps(conn: &Connection, manifest: &str) -> Result<HashMap<String, Stamp>, DbError> {
    let mut q =
        conn.prepare_cached("SELECT dir, mtime_ns, size, inode FROM runs WHERE manifest = ?1")?;
    let rows = q.query_map(params![manifest], |row| {
        Ok((
            row.get::<_, String>(0)?,
            Stamp {
                mtime_ns: row.get(1)?,
                size: row.get::<_, i64>(2)? as u64,
                inode: row.get::<_, i64>(3)? as u64,
            },
        ))
    })?;
    Ok(rows.collect::<Result<_, _>>()?)
}

fn delete_rows(tx: &Connection, id: i64) -> rusqlite::Result<()> {
    for table in ["cells", "metrics", "artifacts"] {
        tx.execute(&format!("DELETE FROM {table} WHERE run = ?1"), params![id])?;
    }
    tx.execute("DELETE FROM runs WHERE id = ?1", params![id])?;
    Ok(())
}

fn delete_run(tx: &Connection, dir: &str) -> rusqlite::Result<()> {
    let id: Option<i64> = tx
        .query_row("SELECT id FROM runs WHERE dir = ?1", params![dir], |r| {
            r.get(0)
        })
        .optional()?;
    match id {
        Some(id) => delete_rows(tx, id),
        None => Ok(()),
    }
}

/// Files one run's rows (replacing any it had), inside the caller's transaction.
fn insert(tx: &Connection, manifest: &str, r: &RunRecord) -> Result<(), DbError> {
    delete_run(tx, &r.run.dir)?;
    let json = |v: &dyn erased::Json| v.json().map_err(|e| DbError::Unusable(e.to_string()));
    let summary = json(&r.run)?;
    // The run's cell ids and tags, shared by every run of the same cells: what a window's
    // outline reads instead of every cell row.
    let outline: BTreeMap<&String, &Vec<String>> =
        r.cells.iter().map(|(id, f)| (id, &f.tags)).collect();
    let outline = json(&outline)?;
    let cellset = set_digest(&outline);
    // The digest names the content: a row left damaged is replaced.
    tx.prepare_cached("INSERT OR REPLACE INTO cellsets(digest, outline) VALUES (?1, ?2)")?
        .execute(params![cellset, outline])?;
    tx.prepare_cached(
        "INSERT INTO runs(manifest, dir, mtime_ns, size, inode, run_id, start, verdict, summary, cellset, seal)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)",
    )?
    .execute(params![
        manifest,
        r.run.dir,
        r.stamp.mtime_ns,
        r.stamp.size as i64,
        r.stamp.inode as i64,
        r.run.id,
        r.run.start,
        r.run.verdict,
        summary,
        cellset,
        seal(&[&r.run.dir, &summary, &cellset]),
    ])?;
    let run = tx.last_insert_rowid();
    let mut cell = tx.prepare_cached(
        "INSERT INTO cells(run, cell, verdict, good, inputs, seconds, tags, facts, seal)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
    )?;
    let mut metric =
        tx.prepare_cached("INSERT INTO metrics(run, cell, name, value) VALUES (?1, ?2, ?3, ?4)")?;
    let mut artifact = tx
        .prepare_cached("INSERT INTO artifacts(run, cell, name, sha256) VALUES (?1, ?2, ?3, ?4)")?;
    for (id, f) in &r.cells {
        let facts = json(f)?;
        let tags = json(&f.tags)?;
        cell.execute(params![
            run,
            id,
            f.verdict.to_string(),
            f.good,
            f.inputs,
            f.seconds,
            tags,
            facts,
            seal(&[&r.run.dir, id, &facts]),
        ])?;
        for (name, value) in &f.metrics {
            metric.execute(params![run, id, name, value.is_finite().then_some(*value)])?;
        }
        for (name, sha) in &f.artifacts {
            artifact.execute(params![run, id, name, sha])?;
        }
    }
    Ok(())
}

/// JSON of anything serialisable, behind one object-safe call.
mod erased {
    pub trait Json {
        fn json(&self) -> serde_json::Result<String>;
    }
    impl<T: serde::Serialize> Json for T {
        fn json(&self) -> serde_json::Result<String> {
            serde_json::to_string(self)
        }
    }
}

/// How many runs before a window [`Index::previous`] reads for the cells it misses, before
/// looking the rest up cell by cell.
const SCAN_BACK: usize = 3;

/// A set of cell ids with their tags.
type Outline = BTreeMap<String, Vec<String>>;

impl Index {
    /// The runs, oldest first (by start, then run id; a run of unknown age first).
    pub fn runs(&self) -> &[RunSummary] {
        &self.runs
    }

    /// For the runs in `range`: every cell id, with its tags in the newest of them that has
    /// it.
    pub fn outline(&self, range: Range<usize>) -> Result<Outline, HistoryError> {
        let mut out = BTreeMap::new();
        match &self.source {
            Source::Memory(records) => {
                for r in &records[range] {
                    for (id, f) in &r.cells {
                        out.insert(id.clone(), f.tags.clone());
                    }
                }
            }
            Source::Db { cellsets, .. } => {
                // Runs of one cell set share its outline: each set is read once, in the
                // order of the newest run using it, so the newest tags win.
                let mut newest: HashMap<&str, usize> = HashMap::new();
                let mut parts: Vec<(usize, bool)> = Vec::new();
                for i in range {
                    if self.replaced(i).is_some() {
                        parts.push((i, false));
                    } else {
                        newest.insert(&cellsets[i], i);
                    }
                }
                parts.extend(newest.into_values().map(|i| (i, true)));
                parts.sort();
                for (i, shared) in parts {
                    match shared.then(|| self.set_of(i)).flatten() {
                        Some(set) => out.extend(set.iter().map(|(k, v)| (k.clone(), v.clone()))),
                        None => {
                            let r = self.tree_record(i)?;
                            out.extend(r.cells.iter().map(|(id, f)| (id.clone(), f.tags.clone())));
                        }
                    }
                }
            }
        }
        Ok(out)
    }

    /// The records of the runs in `range` with their cells, or only the cells in `only`.
    pub fn records(
        &self,
        range: Range<usize>,
        only: Option<&BTreeSet<String>>,
    ) -> Result<Vec<RunRecord>, HistoryError> {
        match &self.source {
            Source::Memory(records) => Ok(records[range]
                .iter()
                .map(|r| RunRecord {
                    schema: r.schema,
                    stamp: r.stamp,
                    run: r.run.clone(),
                    cells: r
                        .cells
                        .iter()
                        .filter(|(id, _)| only.is_none_or(|o| o.contains(*id)))
                        .map(|(id, f)| (id.clone(), f.clone()))
                        .collect(),
                })
                .collect()),
            Source::Db { on_disk, .. } => range
                .map(|i| {
                    Ok(RunRecord {
                        schema: INDEX_SCHEMA,
                        stamp: on_disk[i].stamp,
                        run: self.runs[i].clone(),
                        cells: self.cells(i, only)?,
                    })
                })
                .collect(),
        }
    }

    /// For each cell of `cells`, its facts in the newest of the runs before `before` that
    /// has it (what the first run shown is compared with).
    pub fn previous(
        &self,
        before: usize,
        cells: &BTreeSet<String>,
    ) -> Result<BTreeMap<String, CellFacts>, HistoryError> {
        let mut out = BTreeMap::new();
        if before == 0 {
            return Ok(out);
        }
        match &self.source {
            Source::Memory(records) => {
                for id in cells {
                    if let Some(f) = records[..before].iter().rev().find_map(|r| r.cells.get(id)) {
                        out.insert(id.clone(), f.clone());
                    }
                }
            }
            Source::Db { .. } => {
                // The run just before the window holds nearly every cell: the few runs
                // before it are read for the cells still missing, newest first, before any
                // cell is looked up on its own.
                let mut missing = cells.clone();
                let scanned = before.saturating_sub(SCAN_BACK);
                for i in (scanned..before).rev() {
                    if missing.is_empty() {
                        return Ok(out);
                    }
                    for (id, f) in self.cells(i, Some(&missing))? {
                        missing.remove(&id);
                        out.insert(id, f);
                    }
                }
                for id in &missing {
                    // The newest run before those scanned whose cell set has the cell (a run
                    // whose set cannot be trusted may have it): its row is read, checked
                    // against that set, so a deleted row sends the run to its tree rather
                    // than the search to an older run.
                    let one = BTreeSet::from([id.clone()]);
                    for i in (0..scanned).rev() {
                        let has = match self.replaced(i) {
                            Some(r) => r.cells.contains_key(id),
                            None => self.set_of(i).is_none_or(|set| set.contains_key(id)),
                        };
                        if has && let Some(f) = self.cells(i, Some(&one))?.remove(id) {
                            out.insert(id.clone(), f);
                            break;
                        }
                    }
                }
            }
        }
        Ok(out)
    }

    /// The cells of run `i` (all, or those in `only`), from its rows when they are what was
    /// written and name exactly the cells of the run's cell set, else from its tree.
    fn cells(
        &self,
        i: usize,
        only: Option<&BTreeSet<String>>,
    ) -> Result<BTreeMap<String, CellFacts>, HistoryError> {
        let pick = |r: &RunRecord| -> BTreeMap<String, CellFacts> {
            r.cells
                .iter()
                .filter(|(id, _)| only.is_none_or(|o| o.contains(*id)))
                .map(|(id, f)| (id.clone(), f.clone()))
                .collect()
        };
        if let Some(r) = self.replaced(i) {
            return Ok(pick(&r));
        }
        match self.cells_from_rows(i, only) {
            Some(cells) => Ok(cells),
            None => {
                let r = self.tree_record(i)?;
                Ok(pick(&r))
            }
        }
    }

    /// [`Index::cells`] from the rows; `None` when they cannot be trusted (the run is then
    /// marked for its rows to be dropped).
    fn cells_from_rows(
        &self,
        i: usize,
        only: Option<&BTreeSet<String>>,
    ) -> Option<BTreeMap<String, CellFacts>> {
        let Source::Db {
            conn,
            keys,
            on_disk,
            ..
        } = &self.source
        else {
            return None;
        };
        let key = keys[i]?;
        let dir = on_disk[i].rel.as_str();
        let Some(set) = self.set_of(i) else {
            self.distrust(i);
            return None;
        };
        // The cells asked for that the run has, in order (the smaller set is walked).
        let expected: Vec<&String> = match only {
            Some(o) => o.iter().filter(|id| set.contains_key(*id)).collect(),
            None => set.keys().collect(),
        };
        // Each row is checked against its seal and parsed as it is read; the first that is
        // not what was written stops the reading.
        let mut out = BTreeMap::new();
        let mut trusted = true;
        let mut take = |id: &str, facts: &str, sealed: &str| -> bool {
            let parsed = is_sealed(sealed, &[dir, id, facts])
                .then(|| serde_json::from_str::<CellFacts>(facts).ok())
                .flatten();
            match parsed {
                Some(f) => {
                    out.insert(id.to_string(), f);
                    true
                }
                None => {
                    trusted = false;
                    false
                }
            }
        };
        let read: rusqlite::Result<()> = (|| {
            match only {
                // A few cells are looked up one by one.
                Some(o) if o.len() <= 16 => {
                    let mut q = conn.prepare_cached(
                        "SELECT facts, seal FROM cells WHERE run = ?1 AND cell = ?2",
                    )?;
                    for id in o {
                        let mut rows = q.query(params![key, id])?;
                        if let Some(row) = rows.next()? {
                            let (facts, sealed) = (borrowed(row, 0)?, borrowed(row, 1)?);
                            if !take(id, facts, sealed) {
                                return Ok(());
                            }
                        }
                    }
                }
                // A part of the cells: the rows between its first and last (in the order
                // SQLite keeps them, bytewise, as Rust orders strings).
                Some(o) => {
                    let (Some(low), Some(high)) = (o.first(), o.last()) else {
                        return Ok(());
                    };
                    let mut q = conn.prepare_cached(
                        "SELECT cell, facts, seal FROM cells WHERE run = ?1 AND cell BETWEEN ?2 AND ?3",
                    )?;
                    let mut rows = q.query(params![key, low, high])?;
                    while let Some(row) = rows.next()? {
                        let id = borrowed(row, 0)?;
                        if o.contains(id) && !take(id, borrowed(row, 1)?, borrowed(row, 2)?) {
                            return Ok(());
                        }
                    }
                }
                None => {
                    let mut q =
                        conn.prepare_cached("SELECT cell, facts, seal FROM cells WHERE run = ?1")?;
                    let mut rows = q.query(params![key])?;
                    while let Some(row) = rows.next()? {
                        if !take(borrowed(row, 0)?, borrowed(row, 1)?, borrowed(row, 2)?) {
                            return Ok(());
                        }
                    }
                }
            }
            Ok(())
        })();
        if let Err(e) = read {
            self.note_error(&e);
            self.distrust(i);
            return None;
        }
        if !trusted {
            self.distrust(i);
            return None;
        }
        // The rows must be the run's cells, no fewer (a deleted row) and no other.
        if !out.keys().eq(expected.iter().copied()) {
            self.distrust(i);
            return None;
        }
        Some(out)
    }

    /// The cell set of run `i`, when its row is what was written.
    fn set_of(&self, i: usize) -> Option<Rc<Outline>> {
        let Source::Db {
            conn,
            cellsets,
            sets,
            ..
        } = &self.source
        else {
            return None;
        };
        let digest = &cellsets[i];
        if let Some(s) = sets.borrow().get(digest) {
            return Some(Rc::clone(s));
        }
        let text = conn
            .prepare_cached("SELECT outline FROM cellsets WHERE digest = ?1")
            .and_then(|mut q| {
                q.query_row(params![digest], |row| row.get::<_, String>(0))
                    .optional()
            });
        let text = match text {
            Ok(t) => t?,
            Err(e) => {
                self.note_error(&e);
                return None;
            }
        };
        if set_digest(&text) != *digest {
            return None;
        }
        let set: Rc<Outline> = Rc::new(serde_json::from_str(&text).ok()?);
        sets.borrow_mut().insert(digest.clone(), Rc::clone(&set));
        Some(set)
    }

    fn replaced(&self, i: usize) -> Option<Rc<RunRecord>> {
        match &self.source {
            Source::Db { replaced, .. } => replaced.borrow().get(&i).cloned(),
            Source::Memory(_) => None,
        }
    }

    /// Run `i` as its tree gives it (read once).
    fn tree_record(&self, i: usize) -> Result<Rc<RunRecord>, HistoryError> {
        if let Some(r) = self.replaced(i) {
            return Ok(r);
        }
        let Source::Db {
            on_disk, replaced, ..
        } = &self.source
        else {
            unreachable!("a record in memory is never read again");
        };
        let record = read_trees(&[&on_disk[i]])?
            .pop()
            .and_then(|(_, r)| r)
            .ok_or_else(|| {
                HistoryError::Receipt(ReceiptError::new(
                    on_disk[i].dir.join("run.json"),
                    crate::receipt::error::ReceiptErrorKind::NoRunJson,
                ))
            })?;
        let record = Rc::new(record);
        replaced.borrow_mut().insert(i, Rc::clone(&record));
        Ok(record)
    }

    /// Marks run `i`'s rows as not what was written: they are dropped when the index
    /// closes, and the next open files the run again.
    fn distrust(&self, i: usize) {
        if let Source::Db {
            keys,
            on_disk,
            untrusted,
            ..
        } = &self.source
            && let Some(key) = keys[i]
        {
            untrusted.borrow_mut().push((key, on_disk[i].rel.clone()));
        }
    }

    /// A database error met while reading: a damaged page marks the file for rebuilding.
    fn note_error(&self, e: &rusqlite::Error) {
        if let Source::Db { damaged, .. } = &self.source
            && is_corrupt(e)
        {
            damaged.set(true);
        }
    }
}

impl Drop for Index {
    fn drop(&mut self) {
        let source = std::mem::replace(&mut self.source, Source::Memory(Vec::new()));
        let Source::Db {
            conn,
            _lock,
            untrusted,
            damaged,
            ..
        } = source
        else {
            return;
        };
        let _ = conn.execute_batch("COMMIT");
        let bad = untrusted.into_inner();
        if !bad.is_empty()
            && !damaged.get()
            && let Ok(tx) = conn.unchecked_transaction_immediate()
        {
            for (id, dir) in bad {
                // Only the rows of that folder: another process may have filed it again
                // under another id (or this one, for another folder).
                let same: rusqlite::Result<Option<i64>> = tx
                    .query_row(
                        "SELECT id FROM runs WHERE id = ?1 AND dir = ?2",
                        params![id, dir],
                        |r| r.get(0),
                    )
                    .optional();
                if let Ok(Some(id)) = same {
                    let _ = delete_rows(&tx, id);
                }
            }
            let _ = tx.commit();
        }
        drop(conn);
        drop(_lock);
        if damaged.get() {
            if remove_damaged(&self.receipts) {
                eprintln!(
                    "memra-orch: the history index {} is damaged; it was read around and is rebuilt by the next command",
                    self.file.display()
                );
            } else {
                eprintln!(
                    "memra-orch: the history index {} is damaged; it was read around and is rebuilt once no other process has it open",
                    self.file.display()
                );
            }
        }
    }
}

/// Files the record of a run that just finished (replacing any row of its folder), in one
/// transaction.
pub fn append(receipts: &Path, manifest: &str, record: &RunRecord) -> Result<(), String> {
    let file = path(receipts);
    let (conn, _lock) = connect(receipts, &file).map_err(|e| e.to_string())?;
    let tx = conn
        .unchecked_transaction_immediate()
        .map_err(|e| e.to_string())?;
    insert(&tx, manifest, record).map_err(|e| e.to_string())?;
    tx.commit().map_err(|e| e.to_string())
}

/// Drops the rows of runs of `manifest` that no longer exist (after `gc`), without reading
/// any tree; a row whose run changed stays for the next open to replace.
pub fn prune(receipts: &Path, manifest: &str) -> Result<(), String> {
    let file = path(receipts);
    if std::fs::symlink_metadata(&file).is_err() {
        return Ok(());
    }
    let (conn, _lock) = connect(receipts, &file).map_err(|e| e.to_string())?;
    let tx = conn
        .unchecked_transaction_immediate()
        .map_err(|e| e.to_string())?;
    let held = stamps(&tx, manifest).map_err(|e| e.to_string())?;
    for dir in held.keys() {
        // Checked under the write lock, so a run filed meanwhile keeps its rows.
        if build::stamp(&receipts.join(dir).join("run.json")).is_none() {
            delete_run(&tx, dir).map_err(|e| e.to_string())?;
        }
    }
    tx.execute(
        "DELETE FROM cellsets WHERE digest NOT IN (SELECT cellset FROM runs)",
        [],
    )
    .map_err(|e| e.to_string())?;
    tx.commit().map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A run of manifest `m` at commit `c` with one cell `a` whose receipt has `inputs`.
    fn run(receipts: &Path, id: &str, start: &str, inputs: &str) -> PathBuf {
        run_of(receipts, id, start, &[("a", inputs)])
    }

    /// A run of manifest `m` at commit `c` with the cells given, each `(id, inputs)`.
    fn run_of(receipts: &Path, id: &str, start: &str, cells: &[(&str, &str)]) -> PathBuf {
        let dir = receipts.join("c/m").join(id);
        let nodes: Vec<serde_json::Value> = cells
            .iter()
            .enumerate()
            .map(|(k, (cell, inputs))| {
                let slug = format!("{cell}-{}", k + 1);
                std::fs::create_dir_all(dir.join("nodes").join(&slug)).unwrap();
                let receipt = serde_json::json!({"inputs": inputs, "seconds": 2.0,
                    "checks": [{"check": "acc", "status": "pass", "metrics": {"max_abs": 0.5}}],
                    "artifacts": [{"name": "out.bin", "bytes": 1, "sha256": "ab"}]});
                std::fs::write(
                    dir.join("nodes").join(&slug).join("receipt.json"),
                    receipt.to_string(),
                )
                .unwrap();
                serde_json::json!({"id": cell, "kind": "arm", "slug": slug, "verdict": "pass", "seconds": 2.0})
            })
            .collect();
        let run = serde_json::json!({
            "schema": 1, "run_id": id, "name": "m",
            "manifest": {"path": "m", "bytes": 0, "sha256": ""},
            "env_matrices": [], "commit": "c", "commit_sha": null, "dirty": false, "host": "h",
            "orchestrator_version": "0", "inventory": null, "cpu_slots": 1, "filters": [],
            "resumed": false, "start": start, "end": start, "seconds": 1.0,
            "interrupted": false, "counts": {"pass": cells.len()}, "verdict": "pass",
            "nodes": nodes
        });
        std::fs::write(dir.join("run.json"), run.to_string()).unwrap();
        dir
    }

    const ID1: &str = "20261201T000000.000Z-aaaa";
    const ID2: &str = "20261202T000000.000Z-bbbb";

    fn rows(r: &Path, sql: &str) -> i64 {
        let db = Connection::open(path(r)).unwrap();
        db.query_row(sql, [], |row| row.get(0)).unwrap()
    }

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
        assert_eq!(rows(r, "SELECT count(*) FROM runs"), 2);
        assert_eq!(
            rows(
                r,
                "SELECT count(*) FROM metrics WHERE name = 'acc/max_abs' AND value = 0.5"
            ),
            2,
            "metrics are rows of their own"
        );
        assert_eq!(
            records(r, "m", Mode::Ignore).unwrap(),
            got,
            "the trees agree"
        );
        // The cache answers without the trees' receipts...
        std::fs::remove_file(first.join("nodes/a-1/receipt.json")).unwrap();
        assert_eq!(records(r, "m", Mode::Use).unwrap(), got);
        // ...but never when run.json changed: that run is read again (and now has no
        // receipt for its cell).
        let text = std::fs::read_to_string(first.join("run.json")).unwrap();
        std::fs::write(first.join("run.json"), format!("{text} ")).unwrap();
        assert_eq!(records(r, "m", Mode::Use).unwrap()[0].cells["a"].inputs, "");
        // A deleted run drops out, by a read or by prune.
        std::fs::remove_dir_all(&first).unwrap();
        prune(r, "m").unwrap();
        assert_eq!(rows(r, "SELECT count(*) FROM runs"), 1);
        assert_eq!(rows(r, "SELECT count(*) FROM cells"), 1);
        run(r, ID1, "2026-12-01T00:00:00Z", "back");
        assert_eq!(
            records(r, "m", Mode::Use).unwrap()[0].cells["a"].inputs,
            "back"
        );
        std::fs::remove_dir_all(r.join("c/m").join(ID1)).unwrap();
        assert_eq!(records(r, "m", Mode::Use).unwrap().len(), 1);
        assert_eq!(rows(r, "SELECT count(*) FROM runs"), 1);
        // A run's rows filed by `run` are what the tree gives.
        let only = records(r, "m", Mode::Ignore).unwrap();
        std::fs::remove_file(path(r)).unwrap();
        append(r, "m", &only[0]).unwrap();
        assert_eq!(records(r, "m", Mode::Use).unwrap(), only);
    }

    #[test]
    fn a_seal_is_checked_without_joining_its_parts() {
        let parts = ["commit/nightly/run-1", "arm[x=1]", "{\"verdict\":\"pass\"}"];
        let sealed = seal(&parts);
        assert!(is_sealed(&sealed, &parts));
        // Another part, a changed digit, a digest in capitals or cut short: none is the seal.
        assert!(!is_sealed(
            &sealed,
            &["commit/nightly/run-1", "arm[x=1]", "{}"]
        ));
        assert!(!is_sealed(
            &sealed,
            &["commit/nightly/run-2", parts[1], parts[2]]
        ));
        let mut edited = sealed.clone().into_bytes();
        edited[63] = if edited[63] == b'0' { b'1' } else { b'0' };
        assert!(!is_sealed(&String::from_utf8(edited).unwrap(), &parts));
        assert!(!is_sealed(&sealed.to_uppercase(), &parts));
        assert!(!is_sealed(&sealed[..62], &parts));
    }

    #[test]
    fn an_edited_row_is_not_trusted_even_with_its_stamp_kept() {
        let tmp = tempfile::tempdir().unwrap();
        let r = tmp.path();
        run(r, ID1, "2026-12-01T00:00:00Z", "i1");
        let truth = records(r, "m", Mode::Use).unwrap();
        let db = Connection::open(path(r)).unwrap();
        let n = db
            .execute(
                "UPDATE cells SET facts = replace(facts, '/max_abs\":0.5', '/max_abs\":0.0')",
                [],
            )
            .unwrap();
        assert_eq!(n, 1);
        assert_eq!(
            rows(
                r,
                "SELECT count(*) FROM cells WHERE facts LIKE '%max_abs\":0.0%'"
            ),
            1
        );
        drop(db);
        assert_eq!(
            records(r, "m", Mode::Use).unwrap(),
            truth,
            "read from the tree"
        );
        // Its rows were dropped when the index closed, and the next open files them again.
        assert_eq!(rows(r, "SELECT count(*) FROM runs"), 0);
        assert_eq!(records(r, "m", Mode::Use).unwrap(), truth);
        assert_eq!(
            rows(
                r,
                "SELECT count(*) FROM cells WHERE facts LIKE '%max_abs\":0.5%'"
            ),
            1
        );
        // An edited run summary makes the whole file suspect: rebuilt.
        let db = Connection::open(path(r)).unwrap();
        db.execute(
            "UPDATE runs SET summary = replace(summary, 'pass', 'fail')",
            [],
        )
        .unwrap();
        drop(db);
        assert_eq!(records(r, "m", Mode::Use).unwrap(), truth);
    }

    #[test]
    fn rows_moved_between_cells_or_runs_dropped_or_repointed_are_not_trusted() {
        let tmp = tempfile::tempdir().unwrap();
        let r = tmp.path();
        let first = run(r, ID1, "2026-12-01T00:00:00Z", "i1");
        // A second cell in the first run.
        std::fs::create_dir_all(first.join("nodes/b-1")).unwrap();
        let text = std::fs::read_to_string(first.join("run.json")).unwrap();
        let text = text.replace(
            "\"nodes\":[",
            "\"nodes\":[{\"id\":\"b\",\"kind\":\"arm\",\"slug\":\"b-1\",\"verdict\":\"pass\",\"seconds\":1.0},",
        );
        std::fs::write(first.join("run.json"), text).unwrap();
        std::fs::write(
            first.join("nodes/b-1/receipt.json"),
            r#"{"inputs": "ib", "seconds": 1.0}"#,
        )
        .unwrap();
        run(r, ID2, "2026-12-02T00:00:00Z", "i2");
        let truth = records(r, "m", Mode::Use).unwrap();
        assert_eq!(truth[0].cells.len(), 2);
        let edit = |sql: &str| {
            let db = Connection::open(path(r)).unwrap();
            assert!(db.execute(sql, []).unwrap() > 0, "{sql}");
        };
        let fresh = |what: &str| {
            assert_eq!(records(r, "m", Mode::Use).unwrap(), truth, "{what}");
            // Dropped when the index closed, filed again by the next open.
            assert_eq!(
                records(r, "m", Mode::Use).unwrap(),
                truth,
                "{what}, refiled"
            );
            assert_eq!(rows(r, "SELECT count(*) FROM cells"), 3, "{what}");
        };
        // Two cells' ids swapped: each row's seal names its cell.
        let db = Connection::open(path(r)).unwrap();
        db.execute_batch(
            "UPDATE cells SET cell = 'tmp' WHERE cell = 'a' AND run IN (SELECT run FROM cells WHERE cell = 'b');
             UPDATE cells SET cell = 'a' WHERE cell = 'b';
             UPDATE cells SET cell = 'b' WHERE cell = 'tmp';",
        )
        .unwrap();
        drop(db);
        fresh("swapped cell ids");
        // A row moved to another run.
        edit("UPDATE cells SET run = (SELECT max(id) FROM runs) WHERE cell = 'b'");
        fresh("a row moved to another run");
        // A cell's row gone: the run's cell set still names it.
        edit("DELETE FROM cells WHERE cell = 'b'");
        fresh("a deleted row");
        // A run pointed at another cell set.
        edit(
            "UPDATE runs SET cellset = (SELECT cellset FROM runs ORDER BY id DESC LIMIT 1) WHERE id = (SELECT min(id) FROM runs)",
        );
        fresh("a repointed cell set");
        // A cell set's outline edited.
        edit("UPDATE cellsets SET outline = replace(outline, '\"b\"', '\"c\"')");
        fresh("an edited cell set");
    }

    #[test]
    fn a_damaged_database_is_deleted_only_when_no_other_process_has_it_open() {
        let tmp = tempfile::tempdir().unwrap();
        let r = tmp.path();
        run(r, ID1, "2026-12-01T00:00:00Z", "i1");
        records(r, "m", Mode::Use).unwrap();
        let held = IndexLock::shared(r).unwrap();
        assert!(!remove_damaged(r), "another holder keeps it");
        assert!(path(r).exists());
        drop(held);
        assert!(remove_damaged(r));
        assert!(!path(r).exists());
        // Garbage while another process has the index open: read around, not deleted.
        records(r, "m", Mode::Use).unwrap();
        let held = IndexLock::shared(r).unwrap();
        std::fs::write(path(r), vec![b'x'; 8192]).unwrap();
        let truth = records(r, "m", Mode::Ignore).unwrap();
        assert_eq!(records(r, "m", Mode::Use).unwrap(), truth);
        assert_eq!(std::fs::read(path(r)).unwrap(), vec![b'x'; 8192]);
        drop(held);
        assert_eq!(records(r, "m", Mode::Use).unwrap(), truth);
        assert_eq!(rows(r, "SELECT count(*) FROM runs"), 1, "rebuilt");
    }

    #[test]
    fn a_corrupt_missing_or_foreign_database_is_rebuilt_from_the_trees() {
        let tmp = tempfile::tempdir().unwrap();
        let r = tmp.path();
        run(r, ID1, "2026-12-01T00:00:00Z", "i1");
        run(r, ID2, "2026-12-02T00:00:00Z", "i2");
        let truth = records(r, "m", Mode::Use).unwrap();
        // Garbage over the file.
        std::fs::write(path(r), vec![b'x'; 8192]).unwrap();
        assert_eq!(records(r, "m", Mode::Use).unwrap(), truth);
        assert_eq!(rows(r, "SELECT count(*) FROM runs"), 2, "rebuilt");
        // A file cut short in the middle of its pages.
        let bytes = std::fs::read(path(r)).unwrap();
        let _ = std::fs::remove_file(format!("{}-wal", path(r).display()));
        std::fs::write(path(r), &bytes[..bytes.len().min(4096 + 100)]).unwrap();
        assert_eq!(records(r, "m", Mode::Use).unwrap(), truth);
        // Missing.
        std::fs::remove_file(path(r)).unwrap();
        assert_eq!(records(r, "m", Mode::Use).unwrap(), truth);
        // Of another schema version.
        let db = Connection::open(path(r)).unwrap();
        db.pragma_update(None, "user_version", 7).unwrap();
        db.execute("DELETE FROM cells", []).unwrap();
        drop(db);
        assert_eq!(records(r, "m", Mode::Use).unwrap(), truth);
        assert_eq!(rows(r, "PRAGMA user_version"), DB_VERSION);
    }

    #[test]
    fn a_link_or_a_fifo_at_the_index_is_neither_followed_nor_waited_on() {
        use std::os::unix::ffi::OsStrExt;
        let tmp = tempfile::tempdir().unwrap();
        let r = tmp.path().join("receipts");
        run(&r, ID1, "2026-12-01T00:00:00Z", "i1");
        let truth = records(&r, "m", Mode::Ignore).unwrap();
        std::fs::create_dir_all(r.join(INDEX_DIR)).unwrap();
        let elsewhere = tmp.path().join("elsewhere");
        std::fs::write(&elsewhere, "untouched").unwrap();
        std::os::unix::fs::symlink(&elsewhere, path(&r)).unwrap();
        assert_eq!(records(&r, "m", Mode::Use).unwrap(), truth);
        assert!(append(&r, "m", &truth[0]).is_err());
        assert_eq!(std::fs::read_to_string(&elsewhere).unwrap(), "untouched");
        std::fs::remove_file(path(&r)).unwrap();
        let fifo = std::ffi::CString::new(path(&r).as_os_str().as_bytes()).unwrap();
        // SAFETY: mkfifo reads a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
        assert_eq!(records(&r, "m", Mode::Use).unwrap(), truth);
        assert!(append(&r, "m", &truth[0]).is_err());
        assert!(prune(&r, "m").is_err());
    }

    #[test]
    fn a_window_reads_its_runs_and_each_cells_newest_row_before_it() {
        let tmp = tempfile::tempdir().unwrap();
        let r = tmp.path();
        run(r, ID1, "2026-12-01T00:00:00Z", "i1");
        run(r, ID2, "2026-12-02T00:00:00Z", "i2");
        run(r, "20261203T000000.000Z-cccc", "2026-12-03T00:00:00Z", "i2");
        let index = open(r, "m", Mode::Use).unwrap();
        assert_eq!(index.runs().len(), 3);
        let a = BTreeSet::from(["a".to_string()]);
        let before = index.previous(2, &a).unwrap();
        assert_eq!(before["a"].inputs, "i2", "the newest before the window");
        assert!(index.previous(0, &a).unwrap().is_empty());
        let shown = index.records(2..3, Some(&a)).unwrap();
        assert_eq!(shown.len(), 1);
        assert_eq!(shown[0].cells["a"].inputs, "i2");
        let outline = index.outline(0..3).unwrap();
        assert_eq!(outline.keys().collect::<Vec<_>>(), ["a"]);
    }

    #[test]
    fn the_row_before_a_window_is_found_however_far_back_it_is() {
        let tmp = tempfile::tempdir().unwrap();
        let r = tmp.path();
        // 24 cells in every run: a part of them is more than a few, read as a range.
        let many: Vec<String> = (0..24).map(|k| format!("m{k:02}")).collect();
        let night = |day: usize, extra: &[(&str, &str)]| {
            let inputs = format!("d{day}");
            let mut cells: Vec<(&str, &str)> =
                many.iter().map(|c| (c.as_str(), inputs.as_str())).collect();
            cells.extend_from_slice(extra);
            run_of(
                r,
                &format!("202611{day:02}T000000.000Z-{day:04}"),
                &format!("2026-11-{day:02}T00:00:00Z"),
                &cells,
            );
        };
        // `old` was last seen on day 1, far before the window; `near` on day 6, just
        // before it; `new` only inside it.
        night(1, &[("old", "o1"), ("near", "n1")]);
        for day in 2..=5 {
            night(day, &[("near", "n")]);
        }
        night(6, &[("near", "n6")]);
        for day in 7..=9 {
            night(day, &[("old", "o9"), ("near", "n9"), ("new", "w9")]);
        }
        let index = open(r, "m", Mode::Use).unwrap();
        assert_eq!(index.runs().len(), 9);
        let mut asked: BTreeSet<String> = many.iter().cloned().collect();
        asked.extend(["old", "near", "new"].map(String::from));
        let before = index.previous(6, &asked).unwrap();
        assert_eq!(before["old"].inputs, "o1", "found past the runs read whole");
        assert_eq!(before["near"].inputs, "n6");
        assert!(
            !before.contains_key("new"),
            "no run before the window has it"
        );
        assert!(many.iter().all(|c| before[c].inputs == "d6"));
        assert_eq!(before.len(), 26);
        // A part of the cells is read from the rows between its first and last, and holds
        // only its own: m16 … m23 sort between m15 and `near` and are left out, as is `old`.
        let mut part: BTreeSet<String> = many[..16].iter().cloned().collect();
        part.extend(["near", "new"].map(String::from));
        let shown = index.records(6..9, Some(&part)).unwrap();
        assert!(shown.iter().all(|r| r.cells.keys().eq(part.iter())));
        let some: BTreeSet<String> = ["m03", "near", "new", "old"].map(String::from).into();
        let shown = index.records(8..9, Some(&some)).unwrap();
        assert_eq!(
            shown[0].cells.keys().collect::<Vec<_>>(),
            ["m03", "near", "new", "old"]
        );
        assert_eq!(shown[0].cells["new"].inputs, "w9");
        // Every row read was trusted: none is dropped when the index closes.
        drop(index);
        assert_eq!(
            rows(r, "SELECT COUNT(*) FROM cells"),
            26 + 4 * 25 + 25 + 3 * 27
        );
    }

    #[test]
    fn a_deleted_row_far_before_a_window_sends_its_run_to_the_tree_not_the_search_further() {
        let tmp = tempfile::tempdir().unwrap();
        let r = tmp.path();
        let day = |d: usize, cells: &[(&str, &str)]| {
            run_of(
                r,
                &format!("202611{d:02}T000000.000Z-{d:04}"),
                &format!("2026-11-{d:02}T00:00:00Z"),
                cells,
            );
        };
        day(1, &[("a", "a1"), ("x", "x1")]);
        day(2, &[("a", "a2"), ("x", "x2")]);
        for d in 3..=7 {
            day(d, &[("a", "a")]);
        }
        drop(open(r, "m", Mode::Use).unwrap());
        // Night 2's row of `x` goes; its run row, stamp and cell set stay.
        let db = Connection::open(path(r)).unwrap();
        let gone = db
            .execute(
                "DELETE FROM cells WHERE cell = 'x' AND run = (SELECT id FROM runs WHERE run_id LIKE '%0002')",
                [],
            )
            .unwrap();
        assert_eq!(gone, 1);
        drop(db);
        let index = open(r, "m", Mode::Use).unwrap();
        let x = BTreeSet::from(["x".to_string()]);
        let before = index.previous(6, &x).unwrap();
        assert_eq!(
            before["x"].inputs, "x2",
            "night 2 read from its tree, not night 1"
        );
    }
}
