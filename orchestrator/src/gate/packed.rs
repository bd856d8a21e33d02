//! Reading packed runs (`receipt::pack` writes them): a path below `<run>/nodes/` that is not
//! there is looked up in `<run>/nodes.zip` ([`read`], [`files_below`]); [`links`] lists the
//! store objects an archive links to, for `gc`'s sweep. It sits below the receipt layer so
//! that every reader of a gate's files (`attempt_file`, `receipt::read_json`) can use it.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Component, Path, PathBuf};
use std::sync::{Arc, Mutex};

use zip::ZipArchive;

/// The archive's name in a run folder.
pub const PACK: &str = "nodes.zip";

/// The store's folder name under the receipts folder (`receipt::store`); named here, the
/// lowest layer that needs it.
pub const STORE_DIR: &str = ".memra-store";

/// Whether a folder name is a run id (so a manifest folder's `nodes/` of the old layout and
/// anything else in it is not taken for a run).
pub fn is_run_id(name: &str) -> bool {
    let b = name.as_bytes();
    b.len() == 25
        && b[..8].iter().all(u8::is_ascii_digit)
        && b[8] == b'T'
        && b[9..15].iter().all(u8::is_ascii_digit)
        && b[15] == b'.'
        && b[16..19].iter().all(u8::is_ascii_digit)
        && b[19] == b'Z'
        && b[20] == b'-'
        && b[21..].iter().all(u8::is_ascii_hexdigit)
}

/// The member listing the store objects an archive links to, one sha256 a line, for `gc`'s
/// sweep to read in one go. Outside `nodes/`, so never taken for a file of the tree.
pub const LINKS: &str = ".memra-links";

/// The longest member read into memory (a receipt, checks, a log); a log is capped well
/// below this when it is written.
pub const MAX_MEMBER: u64 = 1 << 30;

/// A member of an archive as read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Member {
    /// A file's bytes.
    Bytes(Vec<u8>),
    /// A stored artifact: the store's object holding it.
    Object(PathBuf),
    /// A folder.
    Folder,
}

/// Where `path` would be kept in an archive: the archive of the nearest run folder above
/// it whose `nodes.zip` is a plain file, and the member's name (`nodes/…`). `None` for a
/// path that is not below a packed run's `nodes/`.
pub fn locate(path: &Path) -> Option<(PathBuf, String)> {
    // Only the nearest `nodes` whose parent is a run folder: a `nodes.zip` a gate left in
    // its own folder, or one above the receipts folder, is never taken for a run's.
    let above = path
        .ancestors()
        .find(|a| a.file_name().is_some_and(|n| n == "nodes"))?;
    let run = above.parent()?;
    if !run
        .file_name()
        .and_then(|n| n.to_str())
        .is_some_and(is_run_id)
    {
        return None;
    }
    let pack = run.join(PACK);
    if !std::fs::symlink_metadata(&pack).is_ok_and(|m| m.is_file()) {
        return None;
    }
    let mut parts = Vec::new();
    for c in path.strip_prefix(run).ok()?.components() {
        match c {
            Component::Normal(p) => parts.push(p.to_str()?),
            _ => return None,
        }
    }
    Some((pack, parts.join("/")))
}

/// The receipts folder of the run whose archive is `pack` (`<receipts>/<commit>/<manifest>/
/// <run>/nodes.zip`), from the resolved path, so a relative or linked path still finds the
/// store.
fn receipts_of(pack: &Path) -> std::io::Result<PathBuf> {
    let run = pack.parent().unwrap_or(Path::new("."));
    let run = std::fs::canonicalize(if run.as_os_str().is_empty() {
        Path::new(".")
    } else {
        run
    })?;
    run.ancestors()
        .nth(3)
        .map(Path::to_path_buf)
        .ok_or_else(|| {
            std::io::Error::other(format!("{}: not in a receipts folder", pack.display()))
        })
}

/// Reads `path` from the archive of its packed run. `Ok(None)` when `path` is not below a
/// packed run or the archive has no such member; a member longer than `limit` is an error.
pub fn read(path: &Path, limit: u64) -> std::io::Result<Option<Member>> {
    let Some((pack, name, mut archive, index)) = find(path)? else {
        return Ok(None);
    };
    let mut entry = archive.by_index(index).map_err(zip_io)?;
    let bad = |what: String| invalid_member(&pack, &name, what);
    if let Some(kind) = special(&pack, &name, &mut entry)? {
        return Ok(Some(kind));
    }
    if entry.size() > limit {
        return Err(bad(format!(
            "{} bytes, more than the {limit} read of it",
            entry.size()
        )));
    }
    let mut bytes = Vec::with_capacity(usize::try_from(entry.size()).unwrap_or(0));
    entry
        .by_ref()
        .take(limit)
        .read_to_end(&mut bytes)
        .map_err(|e| bad(e.to_string()))?;
    Ok(Some(Member::Bytes(bytes)))
}

/// A member of an archive opened for reading.
#[derive(Debug)]
pub enum Opened {
    /// A plain member, decompressed into an unnamed temporary file (whatever its size).
    File(File),
    /// A stored artifact: the store's object holding it.
    Object(PathBuf),
    /// A folder.
    Folder,
}

/// Opens `path` from the archive of its packed run, as [`read`] finds it, without holding
/// the member in memory. `Ok(None)` as for [`read`].
pub fn open(path: &Path) -> std::io::Result<Option<Opened>> {
    let Some((pack, name, mut archive, index)) = find(path)? else {
        return Ok(None);
    };
    let mut entry = archive.by_index(index).map_err(zip_io)?;
    match special(&pack, &name, &mut entry)? {
        Some(Member::Folder) => return Ok(Some(Opened::Folder)),
        Some(Member::Object(o)) => return Ok(Some(Opened::Object(o))),
        _ => {}
    }
    let mut file = tempfile::tempfile()?;
    std::io::copy(&mut entry, &mut file)
        .map_err(|e| invalid_member(&pack, &name, e.to_string()))?;
    file.seek(SeekFrom::Start(0))?;
    Ok(Some(Opened::File(file)))
}

/// An archive, a member's name and its index in it.
type Found = (PathBuf, String, ZipArchive<At>, usize);

/// The archive holding `path` and the member's index in it.
fn find(path: &Path) -> std::io::Result<Option<Found>> {
    let Some((pack, name)) = locate(path) else {
        return Ok(None);
    };
    let archive = open_archive(&pack)?;
    let index = archive
        // By the raw (UTF-8) name, a hash lookup: `index_for_name` scans every member
        // decoding its name whenever a name is missing.
        .index_for_name_raw(name.as_bytes())
        .or_else(|| archive.index_for_name_raw(format!("{name}/").as_bytes()));
    Ok(index.map(|i| (pack, name, archive, i)))
}

fn invalid_member(pack: &Path, name: &str, what: String) -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::InvalidData,
        format!("{}: {name}: {what}", pack.display()),
    )
}

/// A folder or a stored artifact's link, as what it stands for; `None` for a plain member.
fn special<R: Read + ZipEntry>(
    pack: &Path,
    name: &str,
    entry: &mut R,
) -> std::io::Result<Option<Member>> {
    if entry.dir() {
        return Ok(Some(Member::Folder));
    }
    if !entry.link() {
        return Ok(None);
    }
    let mut target = String::new();
    entry
        .take(4096)
        .read_to_string(&mut target)
        .map_err(|e| invalid_member(pack, name, e.to_string()))?;
    let receipts = receipts_of(pack)?;
    link_object(&receipts, name, &target)
        .map(|o| Some(Member::Object(o)))
        .ok_or_else(|| {
            invalid_member(
                pack,
                name,
                format!("a link to {target:?}, not to the artifact store"),
            )
        })
}

/// What [`special`] asks of an entry.
trait ZipEntry {
    fn dir(&self) -> bool;
    fn link(&self) -> bool;
}

impl<R: Read> ZipEntry for zip::read::ZipFile<'_, R> {
    fn dir(&self) -> bool {
        self.is_dir()
    }
    fn link(&self) -> bool {
        self.is_symlink()
    }
}

/// The files (plain ones and stored artifacts) below the folder `path` of a packed run, as
/// paths relative to it, sorted. `None` when `path` is not below a packed run.
pub fn files_below(path: &Path) -> std::io::Result<Option<Vec<PathBuf>>> {
    let Some((pack, name)) = locate(path) else {
        return Ok(None);
    };
    let archive = open_archive(&pack)?;
    let prefix = format!("{name}/");
    let mut out = Vec::new();
    for n in archive.file_names() {
        let n = n.map_err(zip_io)?;
        if let Some(rest) = n.strip_prefix(&prefix)
            && !rest.is_empty()
            && !rest.ends_with('/')
        {
            out.push(PathBuf::from(rest));
        }
    }
    out.sort();
    Ok(Some(out))
}

/// Whether a folder `path` of a packed run is in its archive.
pub fn has_folder(path: &Path) -> bool {
    matches!(read(path, 0), Ok(Some(Member::Folder)))
}

/// The store objects the archive `pack` links to (their sha256 names): from its list
/// ([`LINKS`]), one member read, or where an archive has none, from its links themselves.
pub fn links(pack: &Path) -> std::io::Result<Vec<String>> {
    // Read afresh, never from the cache: the sweep's safety rests on what is there now.
    let mut archive = open_fresh(pack)?;
    const MAX_LIST: u64 = 256 << 20;
    if let Some(i) = archive.index_for_name_raw(LINKS.as_bytes()) {
        let mut entry = archive.by_index(i).map_err(zip_io)?;
        if entry.size() > MAX_LIST {
            return Err(std::io::Error::other(format!(
                "{}: its {LINKS} is {} bytes, more than memra-orch reads",
                pack.display(),
                entry.size()
            )));
        }
        let mut text = String::new();
        entry.read_to_string(&mut text)?;
        return Ok(text
            .lines()
            .filter(|l| is_sha256(l))
            .map(str::to_string)
            .collect());
    }
    let mut out = Vec::new();
    for i in 0..archive.len() {
        // The central directory says which entries are links; only those are read
        // (decompressed: another zip tool may have deflated one).
        if !archive.by_index_data(i).map_err(zip_io)?.is_symlink() {
            continue;
        }
        let mut entry = archive.by_index(i).map_err(zip_io)?;
        let name = entry.name().map_err(zip_io)?.into_owned();
        let mut target = String::new();
        entry.by_ref().take(4096).read_to_string(&mut target)?;
        if let Some(object) = link_object(Path::new(""), &name, &target)
            && let Some(sha) = object.file_name()
        {
            out.push(sha.to_string_lossy().into_owned());
        }
    }
    Ok(out)
}

/// A file read at its own offset, so clones of one open archive read side by side, through
/// a small read-ahead window of its own: the zip reader asks for a central directory a few
/// bytes at a time, which unbuffered would be a system call each.
#[derive(Clone)]
pub(crate) struct At {
    file: Arc<File>,
    pos: u64,
    len: u64,
    /// Bytes of the file from `start`.
    window: Vec<u8>,
    start: u64,
}

const WINDOW: usize = 64 << 10;

impl Read for At {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let end = self.start + self.window.len() as u64;
        if self.pos < self.start || self.pos >= end {
            // A read as large as the window goes straight to the file.
            if buf.len() >= WINDOW {
                let n = self.file.read_at(buf, self.pos)?;
                self.pos += n as u64;
                return Ok(n);
            }
            self.window.resize(WINDOW, 0);
            let n = self.file.read_at(&mut self.window, self.pos)?;
            self.window.truncate(n);
            self.start = self.pos;
            if n == 0 {
                return Ok(0);
            }
        }
        let at = usize::try_from(self.pos - self.start).unwrap_or(usize::MAX);
        let n = buf.len().min(self.window.len() - at);
        buf[..n].copy_from_slice(&self.window[at..at + n]);
        self.pos += n as u64;
        Ok(n)
    }
}

impl Seek for At {
    fn seek(&mut self, to: SeekFrom) -> std::io::Result<u64> {
        let pos = match to {
            SeekFrom::Start(p) => Some(p),
            SeekFrom::End(d) => self.len.checked_add_signed(d),
            SeekFrom::Current(d) => self.pos.checked_add_signed(d),
        };
        self.pos = pos.ok_or_else(|| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
        Ok(self.pos)
    }
}

/// Archives opened lately, newest first: a `diff` or a history rebuild reads many members
/// of one archive, and a report reads the shown runs' archives by turns, so each central
/// directory is parsed once. Bounded by members rather than archives (a member costs about
/// 150 bytes held): a year of a 224-cell nightly stays open whole, while a year of
/// 1,000-cell runs keeps its newest few dozen.
static OPEN: Mutex<Vec<(PathBuf, ZipArchive<At>)>> = Mutex::new(Vec::new());
const KEEP_MEMBERS: usize = 400_000;

pub(crate) fn open_archive(pack: &Path) -> std::io::Result<ZipArchive<At>> {
    if let Ok(mut open) = OPEN.lock()
        && let Some(i) = open.iter().position(|(p, _)| p == pack)
    {
        let hit = open.remove(i);
        let archive = hit.1.clone();
        open.insert(0, hit);
        return Ok(archive);
    }
    let archive = open_fresh(pack)?;
    if let Ok(mut open) = OPEN.lock() {
        open.insert(0, (pack.to_path_buf(), archive.clone()));
        let mut held = 0;
        let keep = open
            .iter()
            .take_while(|(_, a)| {
                held += a.len();
                held <= KEEP_MEMBERS
            })
            .count();
        open.truncate(keep.max(1));
    }
    Ok(archive)
}

/// Opens and parses the archive `pack` (a plain file, never through a link).
fn open_fresh(pack: &Path) -> std::io::Result<ZipArchive<At>> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(pack)?;
    let meta = file.metadata()?;
    if !meta.is_file() {
        return Err(std::io::Error::other(format!(
            "{} is not a plain file",
            pack.display()
        )));
    }
    let at = At {
        file: Arc::new(file),
        pos: 0,
        len: meta.len(),
        window: Vec::new(),
        start: 0,
    };
    let invalid = |what: String| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("{}: {what}", pack.display()),
        )
    };
    let archive = ZipArchive::new(at).map_err(|e| invalid(e.to_string()))?;
    // Two members of one name would let a reader see either: never one of ours.
    if archive.has_duplicate_names() {
        return Err(invalid("two members share a name".into()));
    }
    Ok(archive)
}

pub(crate) fn zip_io(e: zip::result::ZipError) -> std::io::Error {
    match e {
        zip::result::ZipError::Io(e) => e,
        zip::result::ZipError::FileNotFound => std::io::ErrorKind::NotFound.into(),
        other => std::io::Error::new(std::io::ErrorKind::InvalidData, other.to_string()),
    }
}

pub(crate) fn is_sha256(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| b.is_ascii_hexdigit())
}

/// The link an archive holds for a stored artifact at `name` (`nodes/…`): up from where the
/// entry would be unzipped in its run folder to the receipts folder, then into the store.
pub(crate) fn link_target(name: &str, object: &Path) -> String {
    // From the entry's folder up to the run folder, then run → manifest → commit → receipts.
    let up = name.split('/').count() - 1 + 3;
    let shard = object
        .parent()
        .and_then(Path::file_name)
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    let sha = object
        .file_name()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    format!("{}{}/{shard}/{sha}", "../".repeat(up), STORE_DIR)
}

/// The object a link of an archive names, checked to be exactly the shape
/// [`link_target`] writes for `name`.
fn link_object(receipts: &Path, name: &str, target: &str) -> Option<PathBuf> {
    let up = name.split('/').count() - 1 + 3;
    let rest = target.strip_prefix(&"../".repeat(up))?;
    let rest = rest.strip_prefix(STORE_DIR)?.strip_prefix('/')?;
    let (shard, sha) = rest.split_once('/')?;
    (is_sha256(sha) && shard.len() == 2 && sha.starts_with(shard))
        .then(|| receipts.join(STORE_DIR).join(shard).join(sha))
}
