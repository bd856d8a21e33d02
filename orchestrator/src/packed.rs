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
    for above in path.ancestors() {
        if above.file_name().is_none_or(|n| n != "nodes") {
            continue;
        }
        let run = above.parent()?;
        let pack = run.join(PACK);
        if !std::fs::symlink_metadata(&pack).is_ok_and(|m| m.is_file()) {
            continue;
        }
        let mut parts = Vec::new();
        for c in path.strip_prefix(run).ok()?.components() {
            match c {
                Component::Normal(p) => parts.push(p.to_str()?),
                _ => return None,
            }
        }
        return Some((pack, parts.join("/")));
    }
    None
}

/// Reads `path` from the archive of its packed run. `Ok(None)` when `path` is not below a
/// packed run or the archive has no such member; a member longer than `limit` is an error.
pub fn read(path: &Path, limit: u64) -> std::io::Result<Option<Member>> {
    let Some((pack, name)) = locate(path) else {
        return Ok(None);
    };
    let mut archive = open_archive(&pack)?;
    let index = archive
        .index_for_name(&name)
        .or_else(|| archive.index_for_name(&format!("{name}/")));
    let Some(index) = index else {
        return Ok(None);
    };
    let mut entry = archive.by_index(index).map_err(zip_io)?;
    if entry.is_dir() {
        return Ok(Some(Member::Folder));
    }
    let bad = |what: String| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("{}: {name}: {what}", pack.display()),
        )
    };
    if entry.is_symlink() {
        let mut target = String::new();
        entry
            .by_ref()
            .take(4096)
            .read_to_string(&mut target)
            .map_err(|e| bad(e.to_string()))?;
        let receipts = pack
            .ancestors()
            .nth(4)
            .ok_or_else(|| bad("not in a receipts folder".into()))?;
        return link_object(receipts, &name, &target)
            .map(|o| Some(Member::Object(o)))
            .ok_or_else(|| bad(format!("a link to {target:?}, not to the artifact store")));
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
    let mut archive = open_archive(pack)?;
    if let Some(i) = archive.index_for_name(LINKS) {
        let mut text = String::new();
        archive
            .by_index(i)
            .map_err(zip_io)?
            .take(64 << 20)
            .read_to_string(&mut text)?;
        return Ok(text
            .lines()
            .filter(|l| is_sha256(l))
            .map(str::to_string)
            .collect());
    }
    let receipts = pack.ancestors().nth(4).unwrap_or(Path::new("/"));
    let mut out = Vec::new();
    for i in 0..archive.len() {
        // The central directory says which entries are links; only those are read.
        if !archive.by_index_data(i).map_err(zip_io)?.is_symlink() {
            continue;
        }
        let mut entry = archive.by_index_raw(i).map_err(zip_io)?;
        let name = entry.name().map_err(zip_io)?.into_owned();
        let mut target = String::new();
        entry.by_ref().take(4096).read_to_string(&mut target)?;
        if let Some(object) = link_object(receipts, &name, &target)
            && let Some(sha) = object.file_name()
        {
            out.push(sha.to_string_lossy().into_owned());
        }
    }
    Ok(out)
}

/// A file read at its own offset, so clones of one open archive read side by side.
#[derive(Clone)]
pub(crate) struct At {
    file: Arc<File>,
    pos: u64,
    len: u64,
}

impl Read for At {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.file.read_at(buf, self.pos)?;
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
/// of one archive, and the central directory is parsed once.
static OPEN: Mutex<Vec<(PathBuf, ZipArchive<At>)>> = Mutex::new(Vec::new());
const KEEP_OPEN: usize = 8;

pub(crate) fn open_archive(pack: &Path) -> std::io::Result<ZipArchive<At>> {
    if let Ok(mut open) = OPEN.lock()
        && let Some(i) = open.iter().position(|(p, _)| p == pack)
    {
        let hit = open.remove(i);
        let archive = hit.1.clone();
        open.insert(0, hit);
        return Ok(archive);
    }
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
    if let Ok(mut open) = OPEN.lock() {
        open.insert(0, (pack.to_path_buf(), archive.clone()));
        open.truncate(KEEP_OPEN);
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
