//! Opening the files a gate left in its attempt folder (`checks.jsonl`, `stdout.log`, the
//! files under `artifacts/`) so that reading them can neither escape the folder, nor block,
//! nor read something that is not a file.
//!
//! Everything below the attempt folder is opened one component at a time relative to its
//! parent (`openat`) with `O_NOFOLLOW`: a symbolic link at any level is refused, never
//! followed. The last component is opened with `O_NONBLOCK` and checked with `fstat` on the
//! opened descriptor, so a FIFO, a socket or a device is refused instead of hanging the
//! reader, and nothing can be swapped between the check and the read. The attempt folder
//! itself, and the path above it, belong to the orchestrator's receipt tree and are opened
//! as they are (a tree may well live behind a link the user made).
//!
//! It owns the opening and the wording of refusals; what is read from the files, and what a
//! refusal does to a cell, is the caller's (`checks`, `judge`, the executors).

use std::ffi::CString;
use std::fs::File;
use std::io::Read;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

use sha2::{Digest, Sha256};

/// Why a file below an attempt folder was not opened.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error("{} does not exist", path.display())]
    NotFound { path: PathBuf },
    #[error(
        "{} is a symbolic link; a gate's files must be regular files inside its attempt \
         folder, and links there are never followed",
        path.display()
    )]
    Symlink { path: PathBuf },
    #[error(
        "{} is a {what}, not a regular file; a gate's files must be regular files",
        path.display()
    )]
    NotRegular { path: PathBuf, what: &'static str },
    #[error("{} is a {what}, not a folder", path.display())]
    NotAFolder { path: PathBuf, what: &'static str },
    #[error(
        "{} is not a relative path below the attempt folder (no `..`, no leading `/`)",
        path.display()
    )]
    Outside { path: PathBuf },
    #[error("cannot open {}: {error}", path.display())]
    Io {
        path: PathBuf,
        error: std::io::Error,
    },
}

impl OpenError {
    /// The path the error is about.
    pub fn path(&self) -> &Path {
        match self {
            OpenError::NotFound { path }
            | OpenError::Symlink { path }
            | OpenError::NotRegular { path, .. }
            | OpenError::NotAFolder { path, .. }
            | OpenError::Outside { path }
            | OpenError::Io { path, .. } => path,
        }
    }

    /// A refusal (link, not a regular file, outside): the gate broke the protocol, which
    /// retrying would only repeat. A missing file or an I/O error is not one.
    pub fn is_refusal(&self) -> bool {
        matches!(
            self,
            OpenError::Symlink { .. }
                | OpenError::NotRegular { .. }
                | OpenError::NotAFolder { .. }
                | OpenError::Outside { .. }
        )
    }
}

/// Opens `rel`, a relative path below the attempt folder `attempt`, for reading: no link
/// followed at any level below `attempt`, never blocking, a regular file only.
pub fn open(attempt: &Path, rel: &Path) -> Result<File, OpenError> {
    match open_here(attempt, rel) {
        Err(OpenError::NotFound { path }) => {
            from_pack(attempt, rel).unwrap_or(Err(OpenError::NotFound { path }))
        }
        other => other,
    }
}

/// `rel` below `attempt` from the archive of a packed run (`receipt::pack`): a stored
/// artifact opens as the store's object, any other member as an unnamed temporary file
/// holding its bytes. `None` when `attempt` is not in a packed run or its archive has no
/// such member.
fn from_pack(attempt: &Path, rel: &Path) -> Option<Result<File, OpenError>> {
    use crate::gate::packed::{self as pack, Opened};
    let full = attempt.join(rel);
    if normal_components(rel).is_err() {
        return Some(Err(OpenError::Outside { path: full }));
    }
    let io = |error| OpenError::Io {
        path: full.clone(),
        error,
    };
    match pack::open(&full) {
        Ok(None) => None,
        Ok(Some(Opened::Folder)) => Some(Err(OpenError::NotRegular {
            path: full.clone(),
            what: "folder",
        })),
        Ok(Some(Opened::Object(object))) => Some(open_path(&object)),
        Ok(Some(Opened::File(file))) => Some(Ok(file)),
        Err(error) => Some(Err(io(error))),
    }
}

fn open_here(attempt: &Path, rel: &Path) -> Result<File, OpenError> {
    let (dir, last) = open_parent(attempt, rel)?;
    let full = attempt.join(rel);
    let fd = openat(
        &dir,
        last,
        libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC | libc::O_NOCTTY,
        &full,
    )?;
    let file = File::from(fd);
    let meta = file.metadata().map_err(|error| OpenError::Io {
        path: full.clone(),
        error,
    })?;
    if !meta.file_type().is_file() {
        return Err(OpenError::NotRegular {
            path: full,
            what: kind_of(&meta.file_type()),
        });
    }
    Ok(file)
}

/// Opens a file by its full path with the same rules for its last component only (the
/// folder it is in is taken as the attempt folder): for callers that hold a file path, not
/// an attempt folder and a path below it.
pub fn open_path(path: &Path) -> Result<File, OpenError> {
    match (path.parent(), path.file_name()) {
        (Some(dir), Some(name)) => open(
            if dir.as_os_str().is_empty() {
                Path::new(".")
            } else {
                dir
            },
            Path::new(name),
        ),
        _ => Err(OpenError::Outside {
            path: path.to_path_buf(),
        }),
    }
}

/// Checks that `rel` (a folder below `attempt`) and every folder above it up to `attempt`
/// are real folders, not links. `Ok(false)` when it does not exist.
pub fn check_dir(attempt: &Path, rel: &Path) -> Result<bool, OpenError> {
    let mut path = attempt.to_path_buf();
    for c in normal_components(rel)? {
        path.push(c);
        match std::fs::symlink_metadata(&path) {
            Ok(m) if m.file_type().is_symlink() => return Err(OpenError::Symlink { path }),
            Ok(m) if !m.is_dir() => {
                return Err(OpenError::NotAFolder {
                    what: kind_of(&m.file_type()),
                    path,
                });
            }
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
            Err(error) => return Err(OpenError::Io { path, error }),
        }
    }
    Ok(true)
}

/// Every regular file below the folder `rel` of `attempt`, as paths relative to that
/// folder, sorted; a link or anything that is neither a folder nor a regular file below it
/// is an error naming it. A missing folder has no files.
pub fn files_below(attempt: &Path, rel: &Path) -> Result<Vec<PathBuf>, OpenError> {
    if !check_dir(attempt, rel)? {
        // A packed run's folder is in its archive.
        let full = attempt.join(rel);
        return match crate::gate::packed::files_below(&full) {
            Ok(found) => Ok(found.unwrap_or_default()),
            Err(error) => Err(OpenError::Io { path: full, error }),
        };
    }
    let root = attempt.join(rel);
    let mut out = Vec::new();
    let mut stack = vec![PathBuf::new()];
    while let Some(sub) = stack.pop() {
        let dir = root.join(&sub);
        let entries = std::fs::read_dir(&dir).map_err(|error| OpenError::Io {
            path: dir.clone(),
            error,
        })?;
        for entry in entries {
            let entry = entry.map_err(|error| OpenError::Io {
                path: dir.clone(),
                error,
            })?;
            let name = sub.join(entry.file_name());
            let path = root.join(&name);
            // `file_type` of a directory entry does not follow links.
            let ft = entry.file_type().map_err(|error| OpenError::Io {
                path: path.clone(),
                error,
            })?;
            if ft.is_symlink() {
                return Err(OpenError::Symlink { path });
            } else if ft.is_dir() {
                stack.push(name);
            } else if ft.is_file() {
                out.push(name);
            } else {
                return Err(OpenError::NotRegular {
                    path,
                    what: kind_of(&ft),
                });
            }
        }
    }
    out.sort();
    Ok(out)
}

/// Size and sha256 of `rel` below `attempt`, opened by [`open`].
pub fn sha256(attempt: &Path, rel: &Path) -> Result<(u64, String), OpenError> {
    let mut file = open(attempt, rel)?;
    let io = |error| OpenError::Io {
        path: attempt.join(rel),
        error,
    };
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 16];
    let mut total = 0u64;
    loop {
        let n = file.read(&mut buf).map_err(io)?;
        if n == 0 {
            break;
        }
        total += n as u64;
        hasher.update(&buf[..n]);
    }
    // Hex by hand: this module sits below `receipt`, which reads checks through `checks`.
    let hex = hasher
        .finalize()
        .iter()
        .fold(String::with_capacity(64), |mut s, b| {
            use std::fmt::Write;
            let _ = write!(s, "{b:02x}");
            s
        });
    Ok((total, hex))
}

/// Opens every folder of `rel` but the last component, each relative to the one before
/// with `O_NOFOLLOW`, and returns the last folder with the last component's name.
fn open_parent<'a>(
    attempt: &Path,
    rel: &'a Path,
) -> Result<(OwnedFd, &'a std::ffi::OsStr), OpenError> {
    let parts = normal_components(rel)?;
    let Some((last, folders)) = parts.split_last() else {
        return Err(OpenError::Outside {
            path: attempt.join(rel),
        });
    };
    let c = cstring(attempt)?;
    // SAFETY: `c` is a valid NUL-terminated path; the returned descriptor is checked.
    let fd = unsafe {
        libc::open(
            c.as_ptr(),
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(io_error(
            attempt.to_path_buf(),
            std::io::Error::last_os_error(),
        ));
    }
    // SAFETY: `fd` was just opened and is owned by nobody else.
    let mut dir = unsafe { OwnedFd::from_raw_fd(fd) };
    let mut path = attempt.to_path_buf();
    for f in folders {
        path.push(f);
        dir = openat(
            &dir,
            f,
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
            &path,
        )?;
    }
    Ok((dir, last))
}

/// The components of `rel`, which must all be plain names.
fn normal_components(rel: &Path) -> Result<Vec<&std::ffi::OsStr>, OpenError> {
    rel.components()
        .map(|c| match c {
            Component::Normal(n) => Ok(n),
            _ => Err(OpenError::Outside {
                path: rel.to_path_buf(),
            }),
        })
        .collect()
}

fn openat(
    dir: &OwnedFd,
    name: &std::ffi::OsStr,
    flags: i32,
    full: &Path,
) -> Result<OwnedFd, OpenError> {
    let c = cstring(Path::new(name))?;
    // SAFETY: `dir` is an open directory descriptor and `c` a NUL-terminated name without
    // a separator (a path component); the returned descriptor is checked.
    let fd = unsafe { libc::openat(dir.as_raw_fd(), c.as_ptr(), flags) };
    if fd < 0 {
        let error = std::io::Error::last_os_error();
        // O_NOFOLLOW on a link fails with ELOOP; with O_DIRECTORY a link may also show as
        // ENOTDIR, so the entry is looked at to say which it was.
        if matches!(
            error.raw_os_error(),
            Some(libc::ELOOP) | Some(libc::ENOTDIR)
        ) {
            match std::fs::symlink_metadata(full) {
                Ok(m) if m.file_type().is_symlink() => {
                    return Err(OpenError::Symlink {
                        path: full.to_path_buf(),
                    });
                }
                Ok(m) if !m.is_dir() && flags & libc::O_DIRECTORY != 0 => {
                    return Err(OpenError::NotAFolder {
                        path: full.to_path_buf(),
                        what: kind_of(&m.file_type()),
                    });
                }
                _ => {}
            }
        }
        return Err(io_error(full.to_path_buf(), error));
    }
    // SAFETY: `fd` was just opened and is owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn io_error(path: PathBuf, error: std::io::Error) -> OpenError {
    if error.kind() == std::io::ErrorKind::NotFound {
        OpenError::NotFound { path }
    } else {
        OpenError::Io { path, error }
    }
}

fn cstring(p: &Path) -> Result<CString, OpenError> {
    CString::new(p.as_os_str().as_bytes()).map_err(|_| OpenError::Outside {
        path: p.to_path_buf(),
    })
}

/// What kind of file a type is, in words.
/// What a file type is, in words (`symbolic link`, `FIFO`, `folder`, …).
pub(crate) fn kind_of(ft: &std::fs::FileType) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    if ft.is_file() {
        "regular file"
    } else if ft.is_dir() {
        "folder"
    } else if ft.is_symlink() {
        "symbolic link"
    } else if ft.is_fifo() {
        "FIFO"
    } else if ft.is_socket() {
        "socket"
    } else if ft.is_char_device() {
        "character device"
    } else if ft.is_block_device() {
        "block device"
    } else {
        "special file"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mkfifo(p: &Path) {
        let c = CString::new(p.as_os_str().as_bytes()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    }

    #[test]
    fn regular_files_open_and_everything_else_is_refused() {
        let t = tempfile::tempdir().unwrap();
        let a = t.path();
        std::fs::create_dir_all(a.join("artifacts/sub")).unwrap();
        std::fs::write(a.join("artifacts/sub/x.bin"), b"hello").unwrap();
        std::fs::write(t.path().join("outside"), b"secret").unwrap();
        assert_eq!(sha256(a, Path::new("artifacts/sub/x.bin")).unwrap().0, 5);
        std::os::unix::fs::symlink(a.join("outside"), a.join("artifacts/link")).unwrap();
        let e = open(a, Path::new("artifacts/link")).unwrap_err();
        assert!(matches!(e, OpenError::Symlink { .. }), "{e}");
        // A link in the middle of the path is refused too.
        std::os::unix::fs::symlink(a.join("artifacts/sub"), a.join("artifacts/dirlink")).unwrap();
        let e = open(a, Path::new("artifacts/dirlink/x.bin")).unwrap_err();
        assert!(matches!(e, OpenError::Symlink { .. }), "{e}");
        mkfifo(&a.join("artifacts/fifo"));
        let e = open(a, Path::new("artifacts/fifo")).unwrap_err();
        assert!(
            e.to_string().contains("is a FIFO, not a regular file"),
            "{e}"
        );
        assert!(matches!(
            open(a, Path::new("artifacts/../outside")),
            Err(OpenError::Outside { .. })
        ));
        assert!(matches!(
            open(a, Path::new("artifacts/none")),
            Err(OpenError::NotFound { .. })
        ));
        let e = files_below(a, Path::new("artifacts")).unwrap_err();
        assert!(e.is_refusal(), "{e}");
        // A file where a folder should be.
        let e = open(a, Path::new("artifacts/sub/x.bin/y")).unwrap_err();
        assert!(
            e.to_string()
                .ends_with("x.bin is a regular file, not a folder"),
            "{e}"
        );
    }

    #[test]
    fn a_linked_folder_is_refused_by_the_listing() {
        let t = tempfile::tempdir().unwrap();
        let real = t.path().join("real");
        std::fs::create_dir_all(&real).unwrap();
        std::fs::write(real.join("x"), b"1").unwrap();
        let a = t.path().join("attempt");
        std::fs::create_dir_all(&a).unwrap();
        assert!(files_below(&a, Path::new("artifacts")).unwrap().is_empty());
        std::os::unix::fs::symlink(&real, a.join("artifacts")).unwrap();
        let e = files_below(&a, Path::new("artifacts")).unwrap_err();
        assert!(matches!(e, OpenError::Symlink { .. }), "{e}");
        std::fs::remove_file(a.join("artifacts")).unwrap();
        std::fs::create_dir(a.join("artifacts")).unwrap();
        std::fs::write(a.join("artifacts/b"), b"2").unwrap();
        std::fs::create_dir(a.join("artifacts/d")).unwrap();
        std::fs::write(a.join("artifacts/d/a"), b"3").unwrap();
        assert_eq!(
            files_below(&a, Path::new("artifacts")).unwrap(),
            vec![PathBuf::from("b"), PathBuf::from("d/a")]
        );
    }
}
