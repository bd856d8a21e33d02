//! Artifacts stored once: a content-addressed folder under the receipts folder,
//! `<receipts>/.memra-store/<first two hex digits>/<sha256>`, holding one copy of every
//! artifact content. After an attempt, each artifact file the gate wrote is replaced by a
//! hard link to its object ([`intern`]); a content new to the store is first copied into it,
//! hashed as it is written, so an object always holds the bytes its name says even if a
//! process that escaped the attempt kept writing to the gate's file: a logit dump that is identical across cells, reps and nights
//! takes its bytes once, while every attempt folder still holds it under its own name and
//! every receipt says what it said before (name, size, sha256). Hard links are used because
//! they need nothing but the file system the receipts are on and keep every reader (compares,
//! `diff`, `show`, a user's `cp`) working on plain files; std has `hard_link` and nothing else
//! is needed, so no crate is taken for it.
//!
//! What is never interned, and stays a plain file of its own: a file with more than one link
//! (it was not the gate's own new file: the gate may have linked something of another run or
//! of the user's), a file whose size or digest no longer match what was listed, and any file
//! when the store is on another file system or cannot be written (the copy the gate wrote is
//! then the only one, as before). An object already in the store replaces the attempt's file
//! only after their bytes compare equal, so a damaged object is never spread. Objects (and
//! so every interned name of them) are read-only (0444): a later write through one name
//! would change them all. A file that is kept is left exactly as the gate wrote it.
//!
//! `gc` sweeps objects that no attempt folder links any more ([`sweep`]).

use std::fs::File;
use std::io::Read;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// The store's folder name under the receipts folder.
pub use crate::gate::packed::STORE_DIR;

/// The store of the receipts folder `receipts`.
pub fn store_dir(receipts: &Path) -> PathBuf {
    receipts.join(STORE_DIR)
}

/// What [`intern`] did with one file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Interned {
    /// The file became a link to an object that was already stored: its bytes are saved.
    Shared,
    /// The file's content is new to the store: it is now the store's object too.
    Added,
    /// Left as it was (see the module's rules).
    Kept,
}

/// Stores `file` (an artifact of `bytes` bytes and digest `sha256`, just listed) once.
/// Errors are not the attempt's problem: any failure leaves the file as the gate wrote it
/// and says [`Interned::Kept`].
pub fn intern(store: &Path, file: &Path, bytes: u64, sha256: &str) -> Interned {
    intern_inner(store, file, bytes, sha256).unwrap_or(Interned::Kept)
}

fn intern_inner(store: &Path, file: &Path, bytes: u64, sha256: &str) -> std::io::Result<Interned> {
    if sha256.len() != 64 || !sha256.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Ok(Interned::Kept);
    }
    let meta = std::fs::symlink_metadata(file)?;
    if !meta.file_type().is_file() || meta.nlink() != 1 || meta.len() != bytes {
        return Ok(Interned::Kept);
    }
    let shard = store.join(&sha256[..2]);
    std::fs::create_dir_all(&shard)?;
    let object = shard.join(sha256);
    let mut added = false;
    if std::fs::symlink_metadata(&object).is_err() {
        // A copy, hashed as it is written: the object holds exactly the bytes its name
        // says, whatever happens to the gate's own file later.
        let tmp = shard.join(temp_name("copy"));
        let copied = copy_hashed(file, &tmp);
        match copied {
            Ok(digest) if digest == sha256 => {
                std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o444))?;
                match std::fs::hard_link(&tmp, &object) {
                    Ok(()) => added = true,
                    Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                    Err(e) => {
                        let _ = std::fs::remove_file(&tmp);
                        return Err(e);
                    }
                }
                std::fs::remove_file(&tmp)?;
            }
            other => {
                let _ = std::fs::remove_file(&tmp);
                other?;
                return Ok(Interned::Kept);
            }
        }
    }
    // The content is stored: replace the file by a link to the object, after making sure
    // the object holds the same bytes (a damaged object is never spread).
    let om = std::fs::symlink_metadata(&object)?;
    if !om.file_type().is_file() || om.len() != bytes || om.ino() == meta.ino() {
        return Ok(Interned::Kept);
    }
    if !same_bytes(file, &object)? {
        return Ok(Interned::Kept);
    }
    let link = shard.join(temp_name("link"));
    std::fs::hard_link(&object, &link)?;
    if let Err(e) = std::fs::rename(&link, file) {
        let _ = std::fs::remove_file(&link);
        return Err(e);
    }
    Ok(if added {
        Interned::Added
    } else {
        Interned::Shared
    })
}

/// A name for a temporary entry of the store, unique to this process and call.
fn temp_name(what: &str) -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    format!(
        ".{what}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// Copies `from` (not through a link) to the new file `to`, returning the sha256 of what
/// was written.
fn copy_hashed(from: &Path, to: &Path) -> std::io::Result<String> {
    use sha2::{Digest, Sha256};
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut src = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(from)?;
    let mut dst = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(to)?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 16];
    loop {
        let n = src.read(&mut buf)?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        dst.write_all(&buf[..n])?;
    }
    dst.sync_all()?;
    Ok(crate::words::digest::hex(&hasher.finalize()))
}

/// Whether two files hold the same bytes (read in blocks, stopping at the first difference).
fn same_bytes(a: &Path, b: &Path) -> std::io::Result<bool> {
    let (mut fa, mut fb) = (File::open(a)?, File::open(b)?);
    let (mut ba, mut bb) = (vec![0u8; 1 << 16], vec![0u8; 1 << 16]);
    loop {
        let na = read_full(&mut fa, &mut ba)?;
        let nb = read_full(&mut fb, &mut bb)?;
        if na != nb || ba[..na] != bb[..nb] {
            return Ok(false);
        }
        if na == 0 {
            return Ok(true);
        }
    }
}

fn read_full(f: &mut File, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match f.read(&mut buf[n..])? {
            0 => break,
            k => n += k,
        }
    }
    Ok(n)
}

/// Takes the store's lock (`<store>/.lock`, an OS lock that dies with its holder), creating
/// the store when it is missing. Packing a run holds it from checking that the objects its
/// archive links to are stored until the archive is in place, and [`sweep`] holds it
/// throughout, so an object an archive links to is never swept.
pub fn lock(store: &Path) -> std::io::Result<File> {
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::create_dir_all(store)?;
    let path = store.join(".lock");
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o644)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(&path)?;
    if !file.metadata()?.is_file() {
        return Err(std::io::Error::other(format!(
            "{} is not a plain file",
            path.display()
        )));
    }
    loop {
        // SAFETY: flock on a descriptor this function owns.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) } == 0 {
            return Ok(file);
        }
        let e = std::io::Error::last_os_error();
        if e.kind() != std::io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// What [`sweep`] removed.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Swept {
    pub objects: u64,
    pub bytes: u64,
}

/// Removes every object no attempt folder links any more (its link count is 1: the store's
/// own name) and no packed run's archive links to, and temporaries an interrupted intern
/// left more than an hour ago. Only plain files named by a sha256 inside two-hex-digit
/// folders are touched; anything else under the store is left alone. Runs under way add
/// links as they go, so an object added this instant has two links already; the archives
/// are read under the store's lock ([`lock`]), which a packer holds until its archive is in
/// place. An archive that cannot be read stops the sweep: what it links to is unknown.
pub fn sweep(store: &Path) -> std::io::Result<Swept> {
    let mut swept = Swept::default();
    if std::fs::symlink_metadata(store).is_err() {
        return Ok(swept);
    }
    let _lock = lock(store)?;
    let receipts = store.parent().unwrap_or(Path::new("."));
    let mut linked = std::collections::HashSet::new();
    for pack in packs(receipts)? {
        let names = crate::gate::packed::links(&pack)
            .map_err(|e| std::io::Error::new(e.kind(), format!("{}: {e}", pack.display())))?;
        linked.extend(names);
    }
    let shards = match std::fs::read_dir(store) {
        Ok(s) => s,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(swept),
        Err(e) => return Err(e),
    };
    for shard in shards.flatten() {
        let name = shard.file_name().to_string_lossy().into_owned();
        if name.len() != 2 || !shard.file_type().is_ok_and(|t| t.is_dir()) {
            continue;
        }
        let Ok(objects) = std::fs::read_dir(shard.path()) else {
            continue;
        };
        for object in objects.flatten() {
            let oname = object.file_name().to_string_lossy().into_owned();
            let is_object = oname.len() == 64
                && oname.starts_with(&name)
                && oname.bytes().all(|b| b.is_ascii_hexdigit());
            let Ok(meta) = object.path().symlink_metadata() else {
                continue;
            };
            let stale_temp = oname.starts_with('.')
                && meta
                    .modified()
                    .ok()
                    .and_then(|m| m.elapsed().ok())
                    .is_some_and(|age| age > std::time::Duration::from_secs(3600));
            if is_object
                && meta.file_type().is_file()
                && meta.nlink() == 1
                && !linked.contains(&oname)
            {
                // One object that cannot go (another user's) does not stop the sweep.
                if std::fs::remove_file(object.path()).is_ok() {
                    swept.objects += 1;
                    swept.bytes += meta.len();
                }
            } else if stale_temp {
                // What an interrupted intern left (a copy or a link an hour old).
                let _ = std::fs::remove_file(object.path());
            }
        }
        // An empty shard goes; one with objects stays (removing fails, as it should).
        let _ = std::fs::remove_dir(shard.path());
    }
    Ok(swept)
}

/// The archives of every packed run under `receipts` (`<commit>/<manifest>/<run id>/`
/// `nodes.zip`), folders behind links included. Any error but a folder vanishing (a gc
/// deleting it) fails: an archive not seen would leave its objects unprotected.
fn packs(receipts: &Path) -> std::io::Result<Vec<PathBuf>> {
    fn at(p: &Path) -> impl Fn(std::io::Error) -> std::io::Error + '_ {
        move |e| std::io::Error::new(e.kind(), format!("{}: {e}", p.display()))
    }
    let dirs = |p: &Path| -> std::io::Result<Vec<PathBuf>> {
        let entries = match std::fs::read_dir(p) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(at(p)(e)),
        };
        let mut out = Vec::new();
        for e in entries {
            let e = e.map_err(at(p))?;
            if e.file_name().to_string_lossy().starts_with('.') {
                continue;
            }
            let path = e.path();
            match std::fs::metadata(&path) {
                Ok(m) if m.is_dir() => out.push(path),
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(at(&path)(e)),
            }
        }
        Ok(out)
    };
    let mut out = Vec::new();
    for commit in dirs(receipts)? {
        for manifest in dirs(&commit)? {
            for run in dirs(&manifest)? {
                let is_run = run
                    .file_name()
                    .is_some_and(|n| super::tree::is_run_id(&n.to_string_lossy()));
                let pack = run.join(crate::gate::packed::PACK);
                match std::fs::symlink_metadata(&pack) {
                    Ok(m) if is_run && m.is_file() => out.push(pack),
                    Ok(_) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => return Err(at(&pack)(e)),
                }
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sha(b: &[u8]) -> String {
        crate::words::digest::sha256_hex(b)
    }

    #[test]
    fn identical_files_share_one_object_and_read_the_same() {
        let dir = tempfile::tempdir().unwrap();
        let store = dir.path().join(STORE_DIR);
        let (a, b) = (dir.path().join("a"), dir.path().join("b"));
        std::fs::write(&a, b"logits").unwrap();
        std::fs::write(&b, b"logits").unwrap();
        let s = sha(b"logits");
        assert_eq!(intern(&store, &a, 6, &s), Interned::Added);
        assert_eq!(intern(&store, &b, 6, &s), Interned::Shared);
        let (ma, mb) = (a.metadata().unwrap(), b.metadata().unwrap());
        assert_eq!(ma.ino(), mb.ino());
        assert_eq!(ma.nlink(), 3);
        assert_eq!(std::fs::read(&b).unwrap(), b"logits");
        assert_eq!(ma.permissions().mode() & 0o777, 0o444);
        // Interning again changes nothing.
        assert_eq!(intern(&store, &b, 6, &s), Interned::Kept);
        // Nothing is swept while an attempt folder links the object.
        assert_eq!(sweep(&store).unwrap(), Swept::default());
        std::fs::remove_file(&a).unwrap();
        std::fs::remove_file(&b).unwrap();
        assert_eq!(
            sweep(&store).unwrap(),
            Swept {
                objects: 1,
                bytes: 6
            }
        );
        assert!(!store.join(&s[..2]).exists());
    }

    #[test]
    fn what_is_not_the_gates_own_new_file_is_kept_as_it_is() {
        let dir = tempfile::tempdir().unwrap();
        let store = dir.path().join(STORE_DIR);
        let s = sha(b"x");
        // A second link to the file (say, to a file of the user's).
        let outside = dir.path().join("outside");
        std::fs::write(&outside, b"x").unwrap();
        let linked = dir.path().join("linked");
        std::fs::hard_link(&outside, &linked).unwrap();
        assert_eq!(intern(&store, &linked, 1, &s), Interned::Kept);
        // A symbolic link, a size that does not match, a digest that is not one.
        let sym = dir.path().join("sym");
        std::os::unix::fs::symlink(&outside, &sym).unwrap();
        assert_eq!(intern(&store, &sym, 1, &s), Interned::Kept);
        let f = dir.path().join("f");
        std::fs::write(&f, b"x").unwrap();
        assert_eq!(intern(&store, &f, 2, &s), Interned::Kept);
        assert_eq!(intern(&store, &f, 1, "../../etc"), Interned::Kept);
        // A damaged object is never spread: the file keeps its own bytes.
        assert_eq!(intern(&store, &f, 1, &s), Interned::Added);
        let object = store.join(&s[..2]).join(&s);
        std::fs::set_permissions(&object, std::fs::Permissions::from_mode(0o644)).unwrap();
        std::fs::remove_file(&f).unwrap();
        std::fs::write(&object, b"y").unwrap();
        let g = dir.path().join("g");
        std::fs::write(&g, b"x").unwrap();
        assert_eq!(intern(&store, &g, 1, &s), Interned::Kept);
        assert_eq!(std::fs::read(&g).unwrap(), b"x");
    }
}
