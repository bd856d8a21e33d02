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
//! whose row is missing or stale is read from its tree again, the rows of a deleted run go,
//! and both happen in one write transaction. Every row carries the sha256 of its JSON: a row
//! whose seal does not match is not trusted (its run is read from the tree, and its rows are
//! dropped for the next open to rewrite). A database that SQLite finds corrupt, or of
//! another schema, is rebuilt from the trees; one that cannot be opened or written at all (a
//! read-only mount, a link or a FIFO at its name, a lock held past 30 s) is not used: history
//! reads the trees, slower but right, and says so on stderr. `run` writes the rows of a run
//! when it finishes, in one transaction; concurrent runs, `gc` and readers are serialised by
//! SQLite's locks. Nothing here writes inside a run's tree.

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::ops::Range;
use std::path::{Path, PathBuf};
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

/// The schema of the database (SQLite's `user_version`). A file of another version is
/// rebuilt.
const DB_VERSION: i64 = 104;

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
    seal TEXT NOT NULL,
    cellset TEXT NOT NULL
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
        use rusqlite::ErrorCode::{DatabaseCorrupt, NotADatabase};
        match e.sqlite_error_code() {
            Some(DatabaseCorrupt | NotADatabase) => DbError::Corrupt(e),
            _ => DbError::Unusable(e.to_string()),
        }
    }
}

impl std::fmt::Display for DbError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DbError::Corrupt(e) => write!(f, "corrupt ({e})"),
            DbError::Unusable(why) => f.write_str(why),
        }
    }
}

/// The seal of a row's JSON: its sha256, in hex.
fn seal(json: &str) -> String {
    crate::digest::sha256_hex(json.as_bytes())
}

/// The history of one manifest as the index holds it, checked against the trees: its runs
/// oldest first, and the cells of any of them on demand.
pub struct Index {
    runs: Vec<RunSummary>,
    source: Source,
    /// The database file (for messages).
    file: PathBuf,
}

enum Source {
    /// Rows in the database; `keys[i]` is the row id of `runs[i]`, `on_disk[i]` its folder.
    Db {
        conn: Box<Connection>,
        keys: Vec<i64>,
        on_disk: Vec<RunOnDisk>,
        /// The digest of each run's cell set (`cellsets`).
        cellsets: Vec<String>,
        /// Runs whose rows failed their seal: read from their trees instead, by key.
        replaced: RefCell<HashMap<i64, RunRecord>>,
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
                eprintln!(
                    "memra-orch: the history index {} is damaged ({e}); rebuilding it from the run folders",
                    file.display()
                );
                remove_db(&file);
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
    let mut records = read_trees(&refs)?;
    sort(&mut records, |r| (&r.run.start, &r.run.id, &r.run.dir));
    Ok(Index {
        runs: records.iter().map(|r| r.run.clone()).collect(),
        source: Source::Memory(records),
        file: PathBuf::new(),
    })
}

/// Reads runs from their trees in parallel. A folder whose run.json cannot be read is not a
/// run (as for `ls`); a receipt that cannot be read is a broken run, and history says so.
fn read_trees(runs: &[&RunOnDisk]) -> Result<Vec<RunRecord>, HistoryError> {
    let fresh: Vec<Result<Option<RunRecord>, ReceiptError>> = runs
        .par_iter()
        .map(|r| match build::read(r) {
            Ok(rec) => Ok(Some(rec)),
            Err(e) if e.path == r.dir.join("run.json") => Ok(None),
            Err(e) => Err(e),
        })
        .collect();
    let mut out = Vec::with_capacity(fresh.len());
    for f in fresh {
        out.extend(f?);
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

fn remove_db(file: &Path) {
    for suffix in ["", "-wal", "-shm", "-journal"] {
        let mut p = file.as_os_str().to_owned();
        p.push(suffix);
        let _ = std::fs::remove_file(PathBuf::from(p));
    }
}

/// The database, opened read-write and made when missing. The index folder and the file
/// must be what they claim: a link or anything but a plain file at either name is refused
/// (the index would be written wherever it leads, or a FIFO would hang every read).
fn connect(receipts: &Path, file: &Path) -> Result<Connection, DbError> {
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
    for suffix in ["", "-wal", "-shm"] {
        let mut p = file.as_os_str().to_owned();
        p.push(suffix);
        if let Ok(m) = std::fs::symlink_metadata(PathBuf::from(&p))
            && !m.file_type().is_file()
        {
            return Err(DbError::Unusable(format!(
                "{} is not a plain file; remove it",
                PathBuf::from(p).display()
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
    Ok(conn)
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
    let conn = connect(receipts, file)?;
    let rows = stamps(&conn, manifest)?;
    let by_dir: HashMap<&str, &RunOnDisk> = on_disk.iter().map(|r| (r.rel.as_str(), r)).collect();
    let stale: Vec<&RunOnDisk> = on_disk
        .iter()
        .filter(|r| rows.get(&r.rel) != Some(&r.stamp))
        .collect();
    let gone: Vec<&String> = rows
        .keys()
        .filter(|d| !by_dir.contains_key(d.as_str()))
        .collect();
    if !stale.is_empty() || !gone.is_empty() {
        let fresh = match read_trees(&stale) {
            Ok(f) => f,
            Err(e) => return Ok(Err(e)),
        };
        let tx = conn.unchecked_transaction_immediate()?;
        for dir in gone {
            delete_run(&tx, dir)?;
        }
        for r in &fresh {
            insert(&tx, manifest, r)?;
        }
        tx.commit()?;
    }
    // One snapshot for every read that follows: a run filed meanwhile by another process
    // cannot make the runs and their cells disagree.
    conn.execute_batch("BEGIN")?;
    let mut runs: Vec<(RunSummary, i64, RunOnDisk, String)> = Vec::with_capacity(on_disk.len());
    {
        let mut q = conn.prepare_cached(
            "SELECT id, dir, mtime_ns, size, inode, summary, seal, cellset FROM runs WHERE manifest = ?1",
        )?;
        let mut rows = q.query(params![manifest])?;
        while let Some(row) = rows.next()? {
            let dir: String = row.get(1)?;
            let stamp = Stamp {
                mtime_ns: row.get(2)?,
                size: row.get::<_, i64>(3)? as u64,
                inode: row.get::<_, i64>(4)? as u64,
            };
            // A run that changed since the check above was filed by another process from
            // a newer run.json; it is read again from its tree below.
            let Some(disk) = by_dir.get(dir.as_str()) else {
                continue;
            };
            let summary: String = row.get(5)?;
            let sealed: String = row.get(6)?;
            let parsed = (sealed == seal(&summary))
                .then(|| serde_json::from_str::<RunSummary>(&summary).ok())
                .flatten();
            match parsed {
                Some(s) if disk.stamp == stamp => {
                    runs.push((s, row.get(0)?, (*disk).clone(), row.get(7)?));
                }
                _ => return Err(DbError::Corrupt(rusqlite::Error::InvalidQuery)),
            }
        }
    }
    sort(&mut runs, |(s, _, _, _)| (&s.start, &s.id, &s.dir));
    let mut summaries = Vec::with_capacity(runs.len());
    let mut keys = Vec::with_capacity(runs.len());
    let mut disk = Vec::with_capacity(runs.len());
    let mut cellsets = Vec::with_capacity(runs.len());
    for (summary, key, d, cellset) in runs {
        summaries.push(summary);
        keys.push(key);
        disk.push(d);
        cellsets.push(cellset);
    }
    Ok(Ok(Index {
        runs: summaries,
        source: Source::Db {
            conn: Box::new(conn),
            keys,
            on_disk: disk,
            cellsets,
            replaced: RefCell::new(HashMap::new()),
        },
        file: file.to_path_buf(),
    }))
}

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

fn delete_run(tx: &Connection, dir: &str) -> rusqlite::Result<()> {
    let id: Option<i64> = tx
        .query_row("SELECT id FROM runs WHERE dir = ?1", params![dir], |r| {
            r.get(0)
        })
        .optional()?;
    if let Some(id) = id {
        for table in ["cells", "metrics", "artifacts"] {
            tx.execute(&format!("DELETE FROM {table} WHERE run = ?1"), params![id])?;
        }
        tx.execute("DELETE FROM runs WHERE id = ?1", params![id])?;
    }
    Ok(())
}

/// Files one run's rows (replacing any it had), inside the caller's transaction.
fn insert(tx: &Connection, manifest: &str, r: &RunRecord) -> Result<(), DbError> {
    delete_run(tx, &r.run.dir)?;
    let summary = serde_json::to_string(&r.run).map_err(|e| DbError::Unusable(e.to_string()))?;
    // The run's cell ids and tags, shared by every run of the same cells: what a window's
    // outline reads instead of every cell row.
    let outline: BTreeMap<&String, &Vec<String>> =
        r.cells.iter().map(|(id, f)| (id, &f.tags)).collect();
    let outline = serde_json::to_string(&outline).map_err(|e| DbError::Unusable(e.to_string()))?;
    let cellset = seal(&outline);
    tx.prepare_cached("INSERT OR IGNORE INTO cellsets(digest, outline) VALUES (?1, ?2)")?
        .execute(params![cellset, outline])?;
    tx.prepare_cached(
        "INSERT INTO runs(manifest, dir, mtime_ns, size, inode, run_id, start, verdict, summary, seal, cellset)
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
        seal(&summary),
        cellset,
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
        let facts = serde_json::to_string(f).map_err(|e| DbError::Unusable(e.to_string()))?;
        let tags = serde_json::to_string(&f.tags).map_err(|e| DbError::Unusable(e.to_string()))?;
        cell.execute(params![
            run,
            id,
            f.verdict.to_string(),
            f.good,
            f.inputs,
            f.seconds,
            tags,
            facts,
            seal(&facts),
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

impl Index {
    /// The runs, oldest first (by start, then run id; a run of unknown age first).
    pub fn runs(&self) -> &[RunSummary] {
        &self.runs
    }

    /// For the runs in `range`: every cell id, with its tags in the newest of them that has
    /// it.
    pub fn outline(
        &self,
        range: Range<usize>,
    ) -> Result<BTreeMap<String, Vec<String>>, HistoryError> {
        let mut out = BTreeMap::new();
        match &self.source {
            Source::Memory(records) => {
                for r in &records[range] {
                    for (id, f) in &r.cells {
                        out.insert(id.clone(), f.tags.clone());
                    }
                }
            }
            Source::Db { conn, cellsets, .. } => {
                // Runs of one cell set share its outline: each set is read once, in the
                // order of the newest run using it, so the newest tags win.
                let mut newest: HashMap<&str, usize> = HashMap::new();
                let mut parts: Vec<(usize, Option<&str>)> = Vec::new();
                for i in range {
                    if self.replaced(i).is_some() {
                        parts.push((i, None));
                    } else {
                        newest.insert(&cellsets[i], i);
                    }
                }
                parts.extend(newest.into_iter().map(|(d, i)| (i, Some(d))));
                parts.sort();
                let mut q =
                    self.db(conn.prepare_cached("SELECT outline FROM cellsets WHERE digest = ?1"))?;
                for (i, digest) in parts {
                    let set = match digest {
                        Some(d) => self
                            .db(q
                                .query_row(params![d], |row| row.get::<_, String>(0))
                                .optional())?
                            .filter(|text| seal(text) == d)
                            .and_then(|text| {
                                serde_json::from_str::<BTreeMap<String, Vec<String>>>(&text).ok()
                            }),
                        None => None,
                    };
                    match set {
                        Some(set) => out.extend(set),
                        None => {
                            // A run read from its tree, or a set whose row is not what was
                            // written: the run's own cells.
                            if self.replaced(i).is_none() {
                                self.replace(i)?;
                            }
                            if let Some(r) = self.replaced(i) {
                                out.extend(r.cells.into_iter().map(|(id, f)| (id, f.tags)));
                            }
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
            Source::Db { .. } => range
                .map(|i| {
                    Ok(RunRecord {
                        schema: INDEX_SCHEMA,
                        stamp: self.stamp(i),
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
            Source::Db { conn, keys, .. } => {
                let position: HashMap<i64, usize> = keys[..before]
                    .iter()
                    .enumerate()
                    .map(|(i, k)| (*k, i))
                    .collect();
                let mut q = self.db(conn.prepare_cached("SELECT run FROM cells WHERE cell = ?1"))?;
                for id in cells {
                    let runs = self.db(q.query_map(params![id], |row| row.get::<_, i64>(0)))?;
                    let mut newest = None;
                    for run in runs {
                        if let Some(&i) = position.get(&self.db(run)?) {
                            newest = newest.max(Some(i));
                        }
                    }
                    // A run whose rows were replaced from its tree may hold it too.
                    for i in self.replaced_before(&position) {
                        if self.replaced(i).is_some_and(|r| r.cells.contains_key(id)) {
                            newest = newest.max(Some(i));
                        }
                    }
                    if let Some(i) = newest {
                        let one = BTreeSet::from([id.clone()]);
                        if let Some(f) = self.cells(i, Some(&one))?.remove(id) {
                            out.insert(id.clone(), f);
                        }
                    }
                }
            }
        }
        Ok(out)
    }

    /// The cells of run `i` (all, or those in `only`).
    fn cells(
        &self,
        i: usize,
        only: Option<&BTreeSet<String>>,
    ) -> Result<BTreeMap<String, CellFacts>, HistoryError> {
        let Source::Db { conn, keys, .. } = &self.source else {
            unreachable!("cells() reads the database");
        };
        if let Some(r) = self.replaced(i) {
            return Ok(r
                .cells
                .into_iter()
                .filter(|(id, _)| only.is_none_or(|o| o.contains(id)))
                .collect());
        }
        let mut out = BTreeMap::new();
        let mut bad = false;
        let mut take = |id: String, facts: String, sealed: String| match (sealed == seal(&facts))
            .then(|| serde_json::from_str::<CellFacts>(&facts).ok())
            .flatten()
        {
            Some(f) => {
                out.insert(id, f);
            }
            None => bad = true,
        };
        match only {
            // A few cells are looked up; many are read with the run's rows.
            Some(o) if o.len() <= 16 => {
                let mut q = self.db(conn.prepare_cached(
                    "SELECT facts, seal FROM cells WHERE run = ?1 AND cell = ?2",
                ))?;
                for id in o {
                    let row = self.db(q
                        .query_row(params![keys[i], id], |row| {
                            Ok((row.get::<_, String>(0)?, row.get::<_, String>(1)?))
                        })
                        .optional())?;
                    if let Some((facts, sealed)) = row {
                        take(id.clone(), facts, sealed);
                    }
                }
            }
            _ => {
                let mut q = self
                    .db(conn.prepare_cached("SELECT cell, facts, seal FROM cells WHERE run = ?1"))?;
                let rows = self.db(q.query_map(params![keys[i]], |row| {
                    Ok((
                        row.get::<_, String>(0)?,
                        row.get::<_, String>(1)?,
                        row.get::<_, String>(2)?,
                    ))
                }))?;
                for row in rows {
                    let (id, facts, sealed) = self.db(row)?;
                    if only.is_none_or(|o| o.contains(&id)) {
                        take(id, facts, sealed);
                    }
                }
            }
        }
        if bad {
            // A row that is not what was written: this run is read from its tree, and its
            // rows are dropped when the index is closed, for the next open to rewrite.
            self.replace(i)?;
            return self.cells(i, only);
        }
        Ok(out)
    }

    fn stamp(&self, i: usize) -> Stamp {
        match &self.source {
            Source::Db { on_disk, .. } => on_disk[i].stamp,
            Source::Memory(records) => records[i].stamp,
        }
    }

    fn replaced(&self, i: usize) -> Option<RunRecord> {
        match &self.source {
            Source::Db { replaced, keys, .. } => replaced.borrow().get(&keys[i]).cloned(),
            Source::Memory(_) => None,
        }
    }

    /// The positions (among `position`'s runs) of the runs read from their trees.
    fn replaced_before(&self, position: &HashMap<i64, usize>) -> Vec<usize> {
        match &self.source {
            Source::Db { replaced, .. } => replaced
                .borrow()
                .keys()
                .filter_map(|k| position.get(k).copied())
                .collect(),
            Source::Memory(_) => Vec::new(),
        }
    }

    fn replace(&self, i: usize) -> Result<(), HistoryError> {
        let Source::Db {
            keys,
            on_disk,
            replaced,
            ..
        } = &self.source
        else {
            return Ok(());
        };
        let record = read_trees(&[&on_disk[i]])?.pop().ok_or_else(|| {
            HistoryError::Receipt(ReceiptError::new(
                on_disk[i].dir.join("run.json"),
                crate::receipt::error::ReceiptErrorKind::NoRunJson,
            ))
        })?;
        replaced.borrow_mut().insert(keys[i], record);
        Ok(())
    }

    /// A database error met while reading a snapshot that was checked: the file changed
    /// under it in a way SQLite could not serve. History stops with the error rather than
    /// showing part of a run.
    fn db<T>(&self, r: rusqlite::Result<T>) -> Result<T, HistoryError> {
        r.map_err(|e| {
            HistoryError::Receipt(ReceiptError::new(
                &self.file,
                crate::receipt::error::ReceiptErrorKind::Read(std::io::Error::other(format!(
                    "{e}; remove the index file and run the command again (it is rebuilt from the run folders)"
                ))),
            ))
        })
    }
}

impl Drop for Index {
    fn drop(&mut self) {
        if let Source::Db { conn, replaced, .. } = &self.source {
            let _ = conn.execute_batch("COMMIT");
            let bad: Vec<i64> = replaced.borrow().keys().copied().collect();
            if !bad.is_empty()
                && let Ok(tx) = conn.unchecked_transaction_immediate()
            {
                for id in bad {
                    for table in ["cells", "metrics", "artifacts"] {
                        let _ =
                            tx.execute(&format!("DELETE FROM {table} WHERE run = ?1"), params![id]);
                    }
                    let _ = tx.execute("DELETE FROM runs WHERE id = ?1", params![id]);
                }
                let _ = tx.commit();
            }
        }
    }
}

/// Files the record of a run that just finished (replacing any row of its folder), in one
/// transaction.
pub fn append(receipts: &Path, manifest: &str, record: &RunRecord) -> Result<(), String> {
    let file = path(receipts);
    let conn = connect(receipts, &file).map_err(|e| e.to_string())?;
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
    let conn = connect(receipts, &file).map_err(|e| e.to_string())?;
    let on_disk: std::collections::HashSet<String> = build::runs_on_disk(receipts, manifest)
        .into_iter()
        .map(|r| r.rel)
        .collect();
    let tx = conn
        .unchecked_transaction_immediate()
        .map_err(|e| e.to_string())?;
    let held = stamps(&tx, manifest).map_err(|e| e.to_string())?;
    for dir in held.keys().filter(|d| !on_disk.contains(*d)) {
        delete_run(&tx, dir).map_err(|e| e.to_string())?;
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
}
