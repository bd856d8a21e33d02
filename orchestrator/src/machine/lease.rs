//! Machine-wide GPU leases: the lock that every memra-orch process on a host honours before
//! a cell takes a GPU, so two runs never share one. A lease is an `flock(2)` on one lock
//! file per GPU (named by its UUID, fake GPUs by their fake ids) in a lock folder that all
//! users of the box share. The kernel drops the lock when its holder dies, SIGKILL
//! included, so there is no pid file to go stale and no takeover race. While the lock is
//! held, the file says who holds it (pid, manifest, receipt tree, cell, since).
//!
//! Who may own the folder: root or the user running memra-orch. A folder owned by anyone
//! else (say, made by another user after a reboot) lets its owner remove lock files that
//! runs hold, so it is refused, as is a link in its place or a folder every user may write
//! without the sticky bit. A lock file may belong to anyone (its owner can still unlink it
//! while another user's run holds it), so each lease also binds an abstract Unix socket named
//! after the folder and the GPU: a name in the kernel, not in the folder, that nobody can
//! remove and that dies with its holder, so a run that took a fresh file at an unlinked lock
//! file's name still finds the GPU leased. After `flock`, the file held is checked to be the
//! one at the path (as `RunLock::acquire` does).
//!
//! This module owns the folder, the lock files and the holder text. It does not choose
//! which GPUs a cell gets or when it retries (the scheduler does), and it does not print
//! (the runner turns a refusal into an event).

use std::ffi::OsString;
use std::fs::{File, OpenOptions, TryLockError};
use std::io;
use std::os::unix::fs::{DirBuilderExt, FileExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use serde::{Deserialize, Serialize};

use crate::machine::gpus::Gpu;

/// The environment variable that moves the lock folder.
pub const LOCK_DIR_ENV: &str = "MEMRA_GPU_LOCK_DIR";

/// The lock folder when [`LOCK_DIR_ENV`] is not set. It is spelled out instead of taken
/// from `std::env::temp_dir()`: that follows each user's TMPDIR (often per user or per
/// batch job), and users whose runs look in different folders would share GPUs.
pub const DEFAULT_LOCK_DIR: &str = "/tmp/memra-orch-gpu-leases";

/// Mode of the default folder: everyone may create lock files, nobody may delete another
/// user's (the sticky bit), like /tmp itself.
const SHARED_DIR_MODE: u32 = 0o1777;

/// Mode of a lock file: readable and writable by everyone, so that whichever user's run
/// holds the lease can record itself as holder. Writing the file does not take the lock;
/// the worst another user can do is mislead the waiting line.
const LOCK_FILE_MODE: u32 = 0o666;

/// Where the lock files live.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LockDir {
    path: PathBuf,
    /// The default folder, shared by every user of the machine (created 1777); a folder
    /// given by [`LOCK_DIR_ENV`] is the caller's, created with their umask.
    shared: bool,
}

impl LockDir {
    /// The folder named by [`LOCK_DIR_ENV`] (read once, here), or the default.
    pub fn from_env() -> LockDir {
        LockDir::from_value(std::env::var_os(LOCK_DIR_ENV))
    }

    /// The folder for a value of [`LOCK_DIR_ENV`] (`None` or empty: the default).
    pub fn from_value(value: Option<OsString>) -> LockDir {
        match value.filter(|v| !v.is_empty()) {
            Some(v) => LockDir {
                path: PathBuf::from(v),
                shared: false,
            },
            None => LockDir {
                path: PathBuf::from(DEFAULT_LOCK_DIR),
                shared: true,
            },
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The lock file of a GPU.
    pub fn lock_file(&self, gpu: &Gpu) -> PathBuf {
        self.path.join(format!("{}.lock", lock_name(gpu)))
    }

    /// Creates the folder when it is missing. Only a folder this call created gets the
    /// shared mode: one that exists belongs to whoever made it.
    fn prepare(&self) -> Result<(), LeaseError> {
        let err = |error| LeaseError::Folder {
            path: self.path.clone(),
            error,
        };
        if self.shared {
            match std::fs::DirBuilder::new().mode(0o700).create(&self.path) {
                Ok(()) => std::fs::set_permissions(
                    &self.path,
                    std::fs::Permissions::from_mode(SHARED_DIR_MODE),
                )
                .map_err(err)?,
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(err(e)),
            }
        } else {
            std::fs::create_dir_all(&self.path).map_err(err)?;
        }
        let untrusted = |error| LeaseError::Untrusted {
            path: self.path.clone(),
            error,
        };
        let meta = std::fs::symlink_metadata(&self.path).map_err(err)?;
        if meta.file_type().is_symlink() {
            return Err(untrusted(io::Error::other(
                "it is a link; the lease folder must be a real folder (remove the link)",
            )));
        }
        if !meta.is_dir() {
            return Err(err(io::Error::other("it is not a folder")));
        }
        // SAFETY: geteuid takes no arguments and cannot fail.
        let me = unsafe { libc::geteuid() };
        if meta.uid() != 0 && meta.uid() != me {
            return Err(untrusted(io::Error::other(format!(
                "it is owned by uid {}, who could remove the lock files your runs hold; only \
                 root or you may own it: have root make it (`install -d -m 1777 {}`)",
                meta.uid(),
                self.path.display()
            ))));
        }
        let mode = meta.permissions().mode();
        if mode & 0o022 != 0 && mode & 0o1000 == 0 {
            return Err(untrusted(io::Error::other(format!(
                "every user may write it and it has no sticky bit, so anyone could remove the \
                 lock files runs hold; `chmod +t {}`",
                self.path.display()
            ))));
        }
        Ok(())
    }
}

/// The name a GPU's lock file has: its UUID (fake GPUs: `GPU-fake-<i>`), or its NVML index
/// when NVML gave no UUID. Characters that do not belong in a file name become `_`.
fn lock_name(gpu: &Gpu) -> String {
    let name = if gpu.uuid.is_empty() {
        format!("nvml-index-{}", gpu.index)
    } else {
        gpu.uuid.clone()
    };
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// Why the leases of a run could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum LeaseError {
    #[error(
        "cannot use the GPU lock folder {}: {error}; set {LOCK_DIR_ENV} to a folder every \
         memra-orch user of this machine can write",
        path.display()
    )]
    Folder { path: PathBuf, error: io::Error },
    #[error("cannot use the GPU lock folder {}: {error}", path.display())]
    Untrusted { path: PathBuf, error: io::Error },
}

/// Who holds a lease, as the lock file says it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Holder {
    pub pid: u32,
    pub manifest: String,
    /// The receipt tree folder of the holding run.
    pub tree: PathBuf,
    pub cell: String,
    /// When the lease was taken (RFC 3339, UTC).
    pub since: String,
}

impl std::fmt::Display for Holder {
    /// The lock files are writable by every user: their text is shown with every control
    /// character escaped, so it cannot drive the terminal.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "memra-orch pid {}, manifest {} (cell {})",
            self.pid,
            safe(&self.manifest),
            safe(&self.cell)
        )
    }
}

/// Text another user wrote (holder lines, names in the shared folder) with every control
/// and bidi character escaped, so it cannot drive the terminal.
fn safe(s: &str) -> String {
    s.chars()
        .flat_map(|c| {
            let bidi = matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}');
            if c.is_control() || bidi {
                c.escape_unicode().collect::<Vec<_>>()
            } else {
                vec![c]
            }
        })
        .collect()
}

/// What keeps a GPU from a cell: a holder, one that has not said who it is, or a lock that
/// cannot be taken at all. Its text follows `waiting for gpu N: `.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Blocker {
    Held(Holder),
    /// The lock is held, but the file does not name a memra-orch holder (another program
    /// took it, or the holder is still writing its name).
    Unknown,
    /// Taking the lock failed for another reason than its being held.
    Failed {
        path: PathBuf,
        error: String,
    },
}

impl std::fmt::Display for Blocker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Blocker::Held(h) => write!(f, "held by {h}"),
            Blocker::Unknown => write!(
                f,
                "held by another process (its lock file does not say who)"
            ),
            Blocker::Failed { path, error } => write!(
                f,
                "cannot lock {}: {error}; set {LOCK_DIR_ENV} to a folder on a local file system",
                path.display()
            ),
        }
    }
}

/// The holder fields that stay the same for every lease of one run.
#[derive(Debug, Clone)]
pub struct Run {
    pub manifest: String,
    pub tree: PathBuf,
}

/// One GPU's lock file, open for the whole run so that taking a lease is one `flock`.
#[derive(Debug)]
struct LockFile {
    path: PathBuf,
    /// `None` when the file at the lock's name cannot be used (another user's file we may
    /// not open, a folder, a FIFO, a link): the lease is then its abstract name alone.
    file: Option<File>,
    /// Why the file cannot be used, when it cannot.
    unusable: Option<String>,
    /// Sorting key: the file name, so every process takes a set in the same order.
    name: String,
    /// The file could be opened for writing (it can hold our holder text).
    writable: bool,
    /// The abstract socket name of this lease ([`abstract_name`]).
    lease_name: String,
    /// The bound socket while this process holds the lease.
    socket: std::sync::Mutex<Option<std::os::unix::net::UnixListener>>,
}

/// The lock files of a run's GPUs, by inventory position. Every method takes `&self`: a
/// lease is state in the kernel, not here, and the scheduler that calls these keeps its own
/// record of what it took.
#[derive(Debug)]
pub struct GpuLocks {
    files: Vec<LockFile>,
    run: Run,
}

impl GpuLocks {
    /// Opens (creating where needed) the lock file of every GPU in `gpus`, in the folder
    /// `dir` (created when missing). Nothing is locked yet.
    pub fn open(dir: &LockDir, gpus: &[Gpu], run: Run) -> Result<GpuLocks, LeaseError> {
        dir.prepare()?;
        let canonical = std::fs::canonicalize(&dir.path).unwrap_or_else(|_| dir.path.clone());
        let files = gpus
            .iter()
            .map(|g| {
                let mut f = open_lock_file(dir.lock_file(g), lock_name(g));
                f.lease_name = abstract_name(&canonical, &f.name);
                f
            })
            .collect();
        Ok(GpuLocks { files, run })
    }

    pub fn len(&self) -> usize {
        self.files.len()
    }

    /// The GPUs (by inventory position) whose lock file cannot be used, each with a line
    /// saying why and what to do; their leases are held by name alone.
    pub fn by_name_only(&self) -> Vec<(usize, String)> {
        self.files
            .iter()
            .enumerate()
            .filter_map(|(i, f)| {
                let why = f.unusable.as_ref()?;
                Some((
                    i,
                    format!(
                        "the GPU lock file {} cannot be used ({why}); this GPU's lease is held by \
                         its name in the kernel only, which runs in another network namespace \
                         (a container) do not see; its owner or root can remove it",
                        safe(&f.path.display().to_string())
                    ),
                ))
            })
            .collect()
    }

    pub fn is_empty(&self) -> bool {
        self.files.is_empty()
    }

    /// Takes the leases of every position in `positions` for `cell`, or none of them: the
    /// locks are tried in lock-file order (the same in every process, so two runs wanting
    /// overlapping sets cannot each hold a part the other waits for), and when one is
    /// held the ones already taken are given back. `Err` names the first position that
    /// could not be taken and what holds it.
    pub fn try_take(&self, positions: &[usize], cell: &str) -> Result<(), (usize, Blocker)> {
        let mut order = positions.to_vec();
        order.sort_by(|&a, &b| self.files[a].name.cmp(&self.files[b].name));
        let since = humantime::format_rfc3339_seconds(SystemTime::now()).to_string();
        for (k, &p) in order.iter().enumerate() {
            if let Err(blocker) = self.files[p].try_lock() {
                self.release(&order[..k]);
                return Err((p, blocker));
            }
        }
        let holder = Holder {
            pid: std::process::id(),
            manifest: self.run.manifest.clone(),
            tree: self.run.tree.clone(),
            cell: cell.to_string(),
            since,
        };
        let mut text = serde_json::to_vec(&holder).expect("a holder serializes");
        text.push(b'\n');
        for &p in positions {
            let lock = &self.files[p];
            // Writing over any old text (a killed holder leaves its own) and then cutting
            // it to length, instead of truncating first, leaves no extra moment in which
            // a waiting run reads an empty file. The text is only for people: a lease
            // whose text could not be written is still held.
            if let Some(file) = lock.file.as_ref().filter(|_| lock.writable)
                && file.write_all_at(&text, 0).is_ok()
            {
                let _ = file.set_len(text.len() as u64);
            }
        }
        Ok(())
    }

    /// Gives back the leases of `positions` (which this process holds), clearing the
    /// holder text first so that it never names a run that no longer holds the GPU.
    pub fn release(&self, positions: &[usize]) {
        for &p in positions {
            let lock = &self.files[p];
            if let Some(file) = &lock.file {
                if lock.writable {
                    let _ = file.set_len(0);
                }
                lock.unbind();
                let _ = file.unlock();
            } else {
                lock.unbind();
            }
        }
    }
}

/// Open flags for lock files. The folder is writable by every user, so a name in it may
/// be a symbolic link planted by another user to a file of ours: never following one
/// (and never blocking on a planted FIFO) keeps the holder text out of anything but a
/// plain lock file.
const OPEN_FLAGS: i32 = libc::O_NOFOLLOW | libc::O_NONBLOCK;

/// How often [`LockFile::bind_soon`] looks again, and how long it waits between looks.
const BIND_RETRIES: u32 = 20;
const BIND_RETRY_PAUSE: std::time::Duration = std::time::Duration::from_millis(2);

/// Held for reading while a process is spawned (every spawn of a run's worker threads goes
/// through it), for writing while a lease's socket is closed. A child between fork and exec
/// holds a copy of every descriptor, so a socket closed then would stay bound (its name
/// leased) until the child execs; with the guard no child is in that window when a lease is
/// given back. (An flock needs no such care: unlocking frees the lock for every copy.)
pub static SPAWN_GUARD: std::sync::RwLock<()> = std::sync::RwLock::new(());

/// The abstract socket name of a lease: the lock folder's identity (its device, inode and
/// birth time, so users who reach one folder by different paths — links, bind mounts —
/// meet, and a folder made later on a reused inode is another folder) and the lock file's
/// name. A folder that cannot be looked at falls back to its path.
fn abstract_name(folder: &Path, lock: &str) -> String {
    match std::fs::metadata(folder) {
        Ok(m) => {
            let born = m
                .created()
                .ok()
                .and_then(|t| t.duration_since(SystemTime::UNIX_EPOCH).ok())
                .map_or(0, |d| d.as_nanos());
            // Hashed, so the name stays well inside a socket address's 108 bytes.
            let id = format!("{:x}-{:x}-{born:x}", m.dev(), m.ino());
            let digest = crate::words::digest::sha256_hex(id.as_bytes());
            format!("memra-orch-gpu-lease/{}/{lock}", &digest[..16])
        }
        Err(_) => {
            let digest = crate::words::digest::sha256_hex(folder.as_os_str().as_encoded_bytes());
            format!("memra-orch-gpu-lease/{}/{lock}", &digest[..16])
        }
    }
}

impl LockFile {
    /// Binds the lease's abstract socket; `false` when another process holds the name.
    fn bind(&self) -> io::Result<bool> {
        use std::os::linux::net::SocketAddrExt;
        let addr = std::os::unix::net::SocketAddr::from_abstract_name(self.lease_name.as_bytes())?;
        match std::os::unix::net::UnixListener::bind_addr(&addr) {
            Ok(l) => {
                *self.socket.lock().unwrap_or_else(|p| p.into_inner()) = Some(l);
                Ok(true)
            }
            Err(e) if e.kind() == io::ErrorKind::AddrInUse => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// [`LockFile::bind`] with the flock already held: a name still bound then is most
    /// often this process's own lease given back a moment ago, whose socket a child it
    /// started just before still holds. The kernel lets the parent of a vfork-style spawn
    /// go on as soon as the child's exec has replaced its memory, before the exec closes
    /// the child's close-on-exec descriptors, so [`SPAWN_GUARD`] cannot close that window;
    /// it lasts microseconds. A few short retries let it pass; a name that stays bound is
    /// held by another process (one whose lock file was unlinked).
    fn bind_soon(&self) -> io::Result<bool> {
        for _ in 0..BIND_RETRIES {
            if self.bind()? {
                return Ok(true);
            }
            std::thread::sleep(BIND_RETRY_PAUSE);
        }
        self.bind()
    }

    fn unbind(&self) {
        let _no_fork = SPAWN_GUARD.write().unwrap_or_else(|p| p.into_inner());
        self.socket.lock().unwrap_or_else(|p| p.into_inner()).take();
    }

    /// Whether the file this process holds is still the one at the lock's path.
    fn still_at_path(&self) -> bool {
        let Some(file) = &self.file else {
            return false;
        };
        match (file.metadata(), std::fs::symlink_metadata(&self.path)) {
            (Ok(held), Ok(now)) => held.ino() == now.ino() && held.dev() == now.dev(),
            _ => false,
        }
    }

    fn try_lock(&self) -> Result<(), Blocker> {
        let Some(file) = &self.file else {
            // By name alone: the name is what every memra-orch process binds.
            return match self.bind() {
                Ok(true) => Ok(()),
                Ok(false) => Err(Blocker::Unknown),
                Err(e) => Err(Blocker::Failed {
                    path: self.path.clone(),
                    error: e.to_string(),
                }),
            };
        };
        let mut tries = 0;
        loop {
            match file.try_lock() {
                Ok(()) => {
                    // A lock on a file no longer at the path guards nothing, and the
                    // abstract name is what stays held when a lock file is unlinked.
                    let taken = self.still_at_path() && matches!(self.bind_soon(), Ok(true));
                    if taken {
                        return Ok(());
                    }
                    let _ = file.unlock();
                    if !self.still_at_path() {
                        return Err(Blocker::Failed {
                            path: self.path.clone(),
                            error: "the lock file was removed or replaced while this run had it \
                                    open; start the run again"
                                .to_string(),
                        });
                    }
                    return Err(match read_holder(file) {
                        Some(h) => Blocker::Held(h),
                        None => Blocker::Unknown,
                    });
                }
                Err(TryLockError::WouldBlock) => match read_holder(file) {
                    Some(h) => return Err(Blocker::Held(h)),
                    // A holder writes its name right after taking the lock and clears it
                    // right before giving it back: a file that names nobody is most often
                    // one of those instants. One more look, a moment later, keeps them
                    // from being reported as a stranger's lock.
                    None if tries == 0 => {
                        tries += 1;
                        std::thread::sleep(std::time::Duration::from_millis(5));
                    }
                    None => return Err(Blocker::Unknown),
                },
                Err(TryLockError::Error(e)) => {
                    return Err(Blocker::Failed {
                        path: self.path.clone(),
                        error: e.to_string(),
                    });
                }
            }
        }
    }
}

/// Opens a GPU's lock file, creating it when missing. Anything at its name that cannot be
/// used as a lock file — another user's file we may not open, a folder, a FIFO, a link, a
/// file with a second name — is left untouched and the lease is held by name alone
/// ([`LockFile::unusable`]): such a thing in the shared folder must not stop every run.
fn open_lock_file(path: PathBuf, name: String) -> LockFile {
    let opts = |create: bool| {
        let mut o = OpenOptions::new();
        o.read(true)
            .write(true)
            .mode(LOCK_FILE_MODE)
            .custom_flags(OPEN_FLAGS);
        if create {
            o.create_new(true);
        }
        o
    };
    // Only a file this call creates gets its mode widened (the umask narrowed it) so other
    // users' runs can write their holder text; a file that exists is never changed, whoever
    // owns it and whatever it is a name of.
    let opened = match opts(true).open(&path) {
        Ok(f) => {
            let _ = f.set_permissions(std::fs::Permissions::from_mode(LOCK_FILE_MODE));
            Ok((f, true))
        }
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => match opts(false).open(&path) {
            Ok(f) => Ok((f, true)),
            // Another user's file that is not writable for us still takes an flock (flock
            // does not need write access); only our holder text cannot be written.
            Err(e) if e.kind() == io::ErrorKind::PermissionDenied => {
                open_read_only(&path).map(|f| (f, false))
            }
            Err(e) => Err(e),
        },
        Err(e) => Err(e),
    };
    let unusable = |why: String| LockFile {
        path: path.clone(),
        file: None,
        unusable: Some(why),
        name: name.clone(),
        writable: false,
        lease_name: String::new(),
        socket: std::sync::Mutex::new(None),
    };
    let (file, writable) = match opened {
        Ok(x) => x,
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
            return unusable("it is a link".to_string());
        }
        Err(e) => return unusable(e.to_string()),
    };
    // A hard link planted in the shared folder would be another file of ours under a lock
    // file's name; only a plain file with one name is a lock file.
    let plain = file.metadata().is_ok_and(|m| m.is_file() && m.nlink() == 1);
    if !plain {
        return unusable(
            "it is not a plain file with one name (a folder, a link or a special file)".to_string(),
        );
    }
    LockFile {
        path,
        file: Some(file),
        unusable: None,
        name,
        writable,
        lease_name: String::new(),
        socket: std::sync::Mutex::new(None),
    }
}

fn open_read_only(path: &Path) -> io::Result<File> {
    OpenOptions::new()
        .read(true)
        .custom_flags(OPEN_FLAGS)
        .open(path)
}

/// The holder a lock file names, if its text is a whole holder record.
fn read_holder(file: &File) -> Option<Holder> {
    let mut text = Vec::new();
    // Positioned reads, like the holder's positioned writes, need no seek.
    let mut buf = [0u8; 4096];
    let mut at = 0u64;
    loop {
        let n = file.read_at(&mut buf, at).ok()?;
        if n == 0 {
            break;
        }
        text.extend_from_slice(&buf[..n]);
        at += n as u64;
        if text.len() > 64 * 1024 {
            return None;
        }
    }
    serde_json::from_slice(text.trim_ascii()).ok()
}

/// Whether a GPU's lease is held now, for `memra-orch gpus`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeaseState {
    Free,
    Taken(Blocker),
    /// The lock file cannot be used (why); runs lease the GPU by its name alone, which
    /// is held or not.
    ByNameOnly {
        why: String,
        held: bool,
    },
}

/// Looks at a GPU's lease without taking it for longer than the look. A lock file that
/// does not exist is free; otherwise a shared lock is tried and given back at once (a run
/// that tries the lease in that instant sees it held and tries again a moment later). What
/// a run could not use as a lock file is shown as it uses it: by name alone.
pub fn probe(dir: &LockDir, gpu: &Gpu) -> LeaseState {
    let path = dir.lock_file(gpu);
    // The lease's abstract name is held even when its lock file was unlinked.
    let canonical = std::fs::canonicalize(&dir.path).unwrap_or_else(|_| dir.path.clone());
    let name = abstract_name(&canonical, &lock_name(gpu));
    let held_by_name = {
        use std::os::linux::net::SocketAddrExt;
        std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes())
            .and_then(|a| std::os::unix::net::UnixListener::bind_addr(&a))
            .is_err_and(|e| e.kind() == io::ErrorKind::AddrInUse)
    };
    let by_name = |why: String| LeaseState::ByNameOnly {
        why,
        held: held_by_name,
    };
    let file = match open_read_only(&path) {
        // A run uses nothing but a plain file with one name: neither does the probe.
        Ok(f) if !f.metadata().is_ok_and(|m| m.is_file() && m.nlink() == 1) => {
            return by_name(
                "it is not a plain file with one name (a folder, a link or a special file)"
                    .to_string(),
            );
        }
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return if held_by_name {
                LeaseState::Taken(Blocker::Unknown)
            } else {
                LeaseState::Free
            };
        }
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => return by_name("it is a link".into()),
        Err(e) => return by_name(e.to_string()),
    };
    match file.try_lock_shared() {
        Ok(()) => {
            let _ = file.unlock();
            if held_by_name {
                LeaseState::Taken(Blocker::Unknown)
            } else {
                LeaseState::Free
            }
        }
        Err(TryLockError::WouldBlock) => LeaseState::Taken(
            read_holder(&file)
                .map(Blocker::Held)
                .unwrap_or(Blocker::Unknown),
        ),
        Err(TryLockError::Error(e)) => LeaseState::Taken(Blocker::Failed {
            path,
            error: e.to_string(),
        }),
    }
}

/// One line per GPU saying whether its lease is held and by whom, for `memra-orch gpus`.
pub fn render_leases(dir: &LockDir, gpus: &[Gpu]) -> String {
    let mut s = format!("leases ({}):\n", dir.path().display());
    for g in gpus {
        let state = match probe(dir, g) {
            LeaseState::Free => "free".to_string(),
            LeaseState::Taken(Blocker::Held(h)) => {
                format!("leased by {h} since {}", h.since.escape_debug())
            }
            LeaseState::Taken(b) => b.to_string(),
            LeaseState::ByNameOnly { why, held } => format!(
                "{} (by name only: its lock file {} cannot be used: {}; its owner or root can \
                 remove it)",
                if held {
                    "held by another process"
                } else {
                    "free"
                },
                safe(&dir.lock_file(g).display().to_string()),
                safe(&why)
            ),
        };
        s.push_str(&format!("  gpu {}: {state}\n", g.index));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::machine::gpus::Inventory;

    fn locks(dir: &Path, n: u32, manifest: &str) -> GpuLocks {
        let d = LockDir::from_value(Some(dir.as_os_str().to_owned()));
        GpuLocks::open(
            &d,
            &Inventory::fake(n).gpus,
            Run {
                manifest: manifest.into(),
                tree: PathBuf::from("/r/tree"),
            },
        )
        .unwrap()
    }

    #[test]
    fn a_set_is_taken_whole_or_not_at_all() {
        let dir = tempfile::tempdir().unwrap();
        // Two runs (one lock file description each, so flock sets them apart even in one
        // process) on the same two GPUs.
        let a = locks(dir.path(), 2, "a");
        let b = locks(dir.path(), 2, "b");
        a.try_take(&[1], "one").unwrap();
        let (pos, blocker) = b.try_take(&[0, 1], "both").unwrap_err();
        assert_eq!(pos, 1);
        let Blocker::Held(h) = blocker else {
            panic!("{blocker:?}")
        };
        assert_eq!((h.manifest.as_str(), h.cell.as_str()), ("a", "one"));
        // `b` gave GPU 0 back when GPU 1 was held: `a` can take it.
        a.try_take(&[0], "zero").unwrap();
        a.release(&[0, 1]);
        b.try_take(&[0, 1], "both").unwrap();
        assert!(a.try_take(&[0], "zero").is_err());
    }

    /// A copy of a lease's socket that outlives its release by a moment (a child started
    /// just before, still inside its exec) does not make the next cell wait as if another
    /// process held the GPU; a copy that lasts still blocks, as a holder by name.
    #[test]
    fn a_lease_given_back_is_taken_again_while_a_fleeting_copy_of_its_socket_closes() {
        let dir = tempfile::tempdir().unwrap();
        let a = locks(dir.path(), 1, "a");
        let copy = |ms: u64| {
            a.try_take(&[0], "first").unwrap();
            let dup = a.files[0]
                .socket
                .lock()
                .unwrap()
                .as_ref()
                .unwrap()
                .try_clone()
                .unwrap();
            let t = std::thread::spawn(move || {
                std::thread::sleep(std::time::Duration::from_millis(ms));
                drop(dup);
            });
            a.release(&[0]);
            t
        };
        let t = copy(10);
        a.try_take(&[0], "second").unwrap();
        t.join().unwrap();
        a.release(&[0]);
        let t = copy(500);
        assert!(matches!(
            a.try_take(&[0], "third"),
            Err((0, Blocker::Unknown))
        ));
        t.join().unwrap();
        a.try_take(&[0], "fourth").unwrap();
    }

    #[test]
    fn the_lock_file_says_who_holds_it_while_held() {
        let dir = tempfile::tempdir().unwrap();
        let a = locks(dir.path(), 1, "h200-single");
        let b = locks(dir.path(), 1, "other");
        a.try_take(&[0], "decode[q=q4]").unwrap();
        let text = std::fs::read_to_string(dir.path().join("GPU-fake-0.lock")).unwrap();
        let h: Holder = serde_json::from_str(&text).unwrap();
        assert_eq!(h.pid, std::process::id());
        assert_eq!(h.tree, Path::new("/r/tree"));
        assert!(humantime::parse_rfc3339(&h.since).is_ok(), "{}", h.since);
        let (_, blocker) = b.try_take(&[0], "x").unwrap_err();
        assert_eq!(
            blocker.to_string(),
            format!(
                "held by memra-orch pid {}, manifest h200-single (cell decode[q=q4])",
                std::process::id()
            )
        );
        let d = LockDir::from_value(Some(dir.path().as_os_str().to_owned()));
        let gpu = &Inventory::fake(1).gpus[0];
        assert_eq!(probe(&d, gpu), LeaseState::Taken(blocker));
        a.release(&[0]);
        assert_eq!(
            std::fs::read_to_string(dir.path().join("GPU-fake-0.lock")).unwrap(),
            "",
            "a released lease names nobody"
        );
        assert_eq!(probe(&d, gpu), LeaseState::Free);
        b.try_take(&[0], "x").unwrap();
    }

    #[test]
    fn a_lock_without_a_holder_record_says_so() {
        let dir = tempfile::tempdir().unwrap();
        let b = locks(dir.path(), 1, "b");
        let other = File::open(dir.path().join("GPU-fake-0.lock")).unwrap();
        other.lock().unwrap();
        let (_, blocker) = b.try_take(&[0], "x").unwrap_err();
        assert_eq!(blocker, Blocker::Unknown);
        assert_eq!(
            blocker.to_string(),
            "held by another process (its lock file does not say who)"
        );
        drop(other);
        b.try_take(&[0], "x").unwrap();
    }

    #[test]
    fn anything_but_a_plain_lock_file_leaves_the_lease_by_name_and_is_untouched() {
        let dir = tempfile::tempdir().unwrap();
        let victim = dir.path().join("victim");
        std::fs::write(&victim, "keep me").unwrap();
        std::fs::set_permissions(&victim, std::fs::Permissions::from_mode(0o600)).unwrap();
        let lock = dir.path().join("GPU-fake-0.lock");
        let d = LockDir::from_value(Some(dir.path().as_os_str().to_owned()));
        let gpu = &Inventory::fake(1).gpus[0];
        let plant: [(&str, &dyn Fn()); 4] = [
            ("a link", &|| {
                std::os::unix::fs::symlink(&victim, &lock).unwrap()
            }),
            ("a second name", &|| {
                std::fs::hard_link(&victim, &lock).unwrap()
            }),
            ("a folder", &|| std::fs::create_dir(&lock).unwrap()),
            ("a FIFO", &|| {
                let c = std::ffi::CString::new(lock.as_os_str().as_encoded_bytes()).unwrap();
                // SAFETY: a valid NUL-terminated path and a mode.
                assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o666) }, 0);
            }),
        ];
        for (what, plant) in plant {
            plant();
            let a = locks(dir.path(), 1, "a");
            let b = locks(dir.path(), 1, "b");
            let said = a.by_name_only();
            assert_eq!(said.len(), 1, "{what}");
            assert!(
                said[0].1.contains("GPU-fake-0.lock"),
                "{what}: {}",
                said[0].1
            );
            // The name alone still keeps two runs apart, and `gpus` says what runs do.
            a.try_take(&[0], "x").unwrap();
            assert_eq!(
                b.try_take(&[0], "y").unwrap_err().1,
                Blocker::Unknown,
                "{what}"
            );
            assert!(
                matches!(probe(&d, gpu), LeaseState::ByNameOnly { held: true, .. }),
                "{what}"
            );
            a.release(&[0]);
            assert!(
                matches!(probe(&d, gpu), LeaseState::ByNameOnly { held: false, .. }),
                "{what}"
            );
            b.try_take(&[0], "y").unwrap();
            b.release(&[0]);
            assert_eq!(
                std::fs::read_to_string(&victim).unwrap(),
                "keep me",
                "{what}"
            );
            assert_eq!(
                std::fs::metadata(&victim).unwrap().permissions().mode() & 0o777,
                0o600,
                "{what}: the file behind it keeps its mode"
            );
            if lock.is_dir() && !lock.is_symlink() {
                std::fs::remove_dir(&lock).unwrap();
            } else {
                std::fs::remove_file(&lock).unwrap();
            }
        }
        // A plain file is used as the lock again.
        assert!(locks(dir.path(), 1, "a").by_name_only().is_empty());
    }

    #[test]
    fn a_lock_file_that_exists_is_never_changed() {
        let dir = tempfile::tempdir().unwrap();
        let lock = dir.path().join("GPU-fake-0.lock");
        std::fs::write(&lock, "").unwrap();
        std::fs::set_permissions(&lock, std::fs::Permissions::from_mode(0o600)).unwrap();
        // SAFETY: geteuid cannot fail.
        if unsafe { libc::geteuid() } == 0 {
            // As root (CI): another user's private file stays theirs and private.
            std::os::unix::fs::chown(&lock, Some(65534), Some(65534)).unwrap();
        }
        let a = locks(dir.path(), 1, "a");
        a.try_take(&[0], "x").unwrap();
        a.release(&[0]);
        assert_eq!(
            std::fs::metadata(&lock).unwrap().permissions().mode() & 0o777,
            0o600
        );
    }

    #[test]
    fn one_folder_reached_through_a_bind_mount_is_one_set_of_leases() {
        let dir = tempfile::tempdir().unwrap();
        let real = dir.path().join("real");
        let bind = dir.path().join("bind");
        std::fs::create_dir_all(real.join("GPU-fake-0.lock")).unwrap();
        std::fs::create_dir(&bind).unwrap();
        let mounted = std::process::Command::new("mount")
            .arg("--bind")
            .arg(&real)
            .arg(&bind)
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !mounted {
            eprintln!("skipped: cannot bind-mount here (needs root)");
            return;
        }
        // The lock file is unusable (a folder): the lease is its name alone, which must be
        // the same whichever path leads to the folder.
        let a = locks(&real, 1, "a");
        let b = locks(&bind, 1, "b");
        a.try_take(&[0], "x").unwrap();
        let taken = b.try_take(&[0], "y");
        a.release(&[0]);
        let _ = std::process::Command::new("umount").arg(&bind).status();
        assert!(taken.is_err(), "two runs held GPU 0 through two paths");
    }

    #[test]
    fn the_default_folder_is_shared_and_lock_files_are_writable_by_all() {
        let dir = tempfile::tempdir().unwrap();
        let shared = LockDir {
            path: dir.path().join("leases"),
            shared: true,
        };
        GpuLocks::open(
            &shared,
            &Inventory::fake(1).gpus,
            Run {
                manifest: "m".into(),
                tree: PathBuf::new(),
            },
        )
        .unwrap();
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o7777;
        assert_eq!(mode(shared.path()), 0o1777);
        assert_eq!(mode(&shared.path().join("GPU-fake-0.lock")), 0o666);
        assert_eq!(
            LockDir::from_value(None).path(),
            Path::new(DEFAULT_LOCK_DIR)
        );
        assert_eq!(
            LockDir::from_value(Some("".into())).path(),
            Path::new(DEFAULT_LOCK_DIR)
        );
    }

    #[test]
    fn lock_names_come_from_uuids() {
        let mut g = Inventory::fake(1).gpus.remove(0);
        assert_eq!(lock_name(&g), "GPU-fake-0");
        g.uuid = "GPU-ab/../c d".into();
        assert_eq!(lock_name(&g), "GPU-ab____c_d");
        g.uuid.clear();
        g.index = 3;
        assert_eq!(lock_name(&g), "nvml-index-3");
    }

    #[test]
    fn a_held_lock_file_that_is_unlinked_still_keeps_the_gpu() {
        let dir = tempfile::tempdir().unwrap();
        let a = locks(dir.path(), 1, "a");
        a.try_take(&[0], "cell-a").unwrap();
        // Another user removes the lock file while run `a` holds it; run `b` creates a fresh
        // one at the same name and takes its flock, but not the lease.
        std::fs::remove_file(dir.path().join("GPU-fake-0.lock")).unwrap();
        let b = locks(dir.path(), 1, "b");
        assert!(b.try_take(&[0], "cell-b").is_err(), "two runs share GPU 0");
        let probe_dir = LockDir::from_value(Some(dir.path().as_os_str().to_owned()));
        assert!(matches!(
            probe(&probe_dir, &Inventory::fake(1).gpus[0]),
            LeaseState::Taken(_)
        ));
        a.release(&[0]);
        b.try_take(&[0], "cell-b").unwrap();
    }

    #[test]
    fn a_lease_folder_of_another_user_or_a_link_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let real = dir.path().join("real");
        std::fs::create_dir(&real).unwrap();
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&real, &link).unwrap();
        let open = |p: &Path| {
            GpuLocks::open(
                &LockDir::from_value(Some(p.as_os_str().to_owned())),
                &Inventory::fake(1).gpus,
                Run {
                    manifest: "m".into(),
                    tree: PathBuf::from("/t"),
                },
            )
        };
        let e = open(&link).unwrap_err().to_string();
        assert!(e.contains("it is a link"), "{e}");
        std::fs::set_permissions(&real, std::fs::Permissions::from_mode(0o777)).unwrap();
        let e = open(&real).unwrap_err().to_string();
        assert!(e.contains("no sticky bit"), "{e}");
        std::fs::set_permissions(&real, std::fs::Permissions::from_mode(0o1777)).unwrap();
        open(&real).unwrap();
        // SAFETY: geteuid cannot fail.
        if unsafe { libc::geteuid() } == 0 {
            // As root (CI): a folder another user made is refused.
            let theirs = dir.path().join("theirs");
            std::fs::create_dir(&theirs).unwrap();
            std::os::unix::fs::chown(&theirs, Some(65534), Some(65534)).unwrap();
            let e = open(&theirs).unwrap_err().to_string();
            assert!(e.contains("owned by uid 65534"), "{e}");
        }
    }

    #[test]
    fn holder_text_cannot_drive_the_terminal() {
        let h = Holder {
            pid: 1,
            manifest: "m\u{1b}[2J".into(),
            tree: PathBuf::from("/t"),
            cell: "c\u{202e}x\u{7}".into(),
            since: "now".into(),
        };
        let text = h.to_string();
        assert!(
            !text.chars().any(|c| c.is_control() || c == '\u{202e}'),
            "{text:?}"
        );
        assert!(text.contains("\\u{1b}[2J"), "{text}");
    }
}
