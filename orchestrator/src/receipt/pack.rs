//! Packed runs: a finished run's `nodes/` folder (every cell's receipt, logs, checks and
//! artifacts) as one archive, `<run>/nodes.zip`, so a night adds a handful of files to the
//! receipts folder instead of thousands, and `gc` deletes a run in a few unlinks.
//!
//! The archive is a plain zip (deflate): `unzip -l`, `unzip -p nodes.zip
//! nodes/<slug>/attempt-1/stdout.log` and Python's `zipfile` read it, and `unzip` in the run
//! folder gives back the tree as it was. An artifact the store holds ([`super::store`]) is
//! not copied into the archive: its entry is a symbolic link to the store's object,
//! `../…/../.memra-store/<aa>/<sha256>` (as many `..` as lead up to the receipts folder),
//! which resolves from where the entry would be unzipped. Those links are the only links an archive holds: a tree holding a link,
//! a FIFO or anything but plain files and folders is never packed (it stays a tree, and the
//! run says why).
//!
//! Every reader of receipts goes through one rule: a path below `<run>/nodes/` that does not
//! exist is looked up in `<run>/nodes.zip` ([`read`], [`files_below`]). The archive is made
//! complete under a temporary name and renamed into place before `nodes/` is removed, so a
//! reader at any moment finds each file in one of the two; a packer killed while removing
//! `nodes/` leaves a tree that every file of is also in the archive, and `gc` finishes the
//! removal. The archive is written while holding the store's lock ([`super::store::lock`]),
//! after checking that every object it links to is in the store, and `gc` sweeps the store
//! under the same lock and keeps every object an archive links to.
//!
//! A zip and not a tar stream: a reader takes one receipt out of a thousand through the
//! archive's central directory without decompressing the rest, and the zip crate checks each
//! entry's CRC-32 as it is read, so a damaged archive is an error, never wrong bytes.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::Write;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use serde::Deserialize;
use zip::write::SimpleFileOptions;

use crate::gate::attempt_file::kind_of;
use crate::gate::packed::{PACK, is_sha256, link_target, open_archive, zip_io};

/// What [`pack`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Packed {
    /// Plain files written into the archive.
    pub files: u64,
    /// Artifacts written as links to the store's objects.
    pub linked: u64,
    /// The archive's size.
    pub bytes: u64,
    /// Why `nodes/` could not be removed after the archive was in place (the archive holds
    /// every file of it; `gc` removes it later).
    pub left: Option<String>,
}

/// Why a run was not packed. The run's tree is then as it was.
#[derive(Debug, thiserror::Error)]
pub enum PackError {
    #[error(
        "{} is a {what}; a run whose cell folders hold anything but plain files and folders \
         stays unpacked",
        path.display()
    )]
    NotPlain { path: PathBuf, what: &'static str },
    #[error("{} is not a run folder (its name is not a run id)", path.display())]
    NotARun { path: PathBuf },
    #[error("{}: {error}", path.display())]
    Io {
        path: PathBuf,
        error: std::io::Error,
    },
}

fn io_at(path: &Path) -> impl Fn(std::io::Error) -> PackError + '_ {
    move |error| PackError::Io {
        path: path.to_path_buf(),
        error,
    }
}

/// One thing found under `nodes/`.
enum Found {
    Folder,
    File { len: u64, dev: u64, ino: u64 },
}

/// What a receipt says its attempts wrote: enough to tell which files are the store's.
#[derive(Deserialize)]
struct Listed {
    slug: String,
    #[serde(default)]
    attempts: Vec<ListedAttempt>,
}

#[derive(Deserialize)]
struct ListedAttempt {
    n: u32,
    #[serde(default)]
    artifacts: Vec<super::Artifact>,
}

/// Packs the `nodes/` of the finished run at `run_dir` into `nodes.zip` and removes the
/// folder. `Ok(None)` when there is nothing to pack (no `nodes/`, or packed already and
/// nothing left over). Any error leaves the tree as it was. The caller holds the run lock
/// of the run's manifest folder (`run` while filing, `gc --pack`), so no other packer works
/// on the run and a temporary archive found there is a killed packer's.
pub fn pack(run_dir: &Path) -> Result<Option<Packed>, PackError> {
    let is_run = run_dir
        .file_name()
        .is_some_and(|n| super::tree::is_run_id(&n.to_string_lossy()));
    if !is_run {
        return Err(PackError::NotARun {
            path: run_dir.to_path_buf(),
        });
    }
    let nodes = run_dir.join("nodes");
    match std::fs::symlink_metadata(&nodes) {
        Ok(m) if m.is_dir() => {}
        Ok(m) => {
            return Err(PackError::NotPlain {
                path: nodes,
                what: kind_of(&m.file_type()),
            });
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io_at(&nodes)(e)),
    }
    let target = run_dir.join(PACK);
    remove_stale_temps(run_dir);
    if std::fs::symlink_metadata(&target).is_ok() {
        // A packer was stopped while removing `nodes/`: what is left is in the archive.
        return finish_removal(run_dir).map(|left| {
            Some(Packed {
                left,
                ..Packed::default()
            })
        });
    }
    let found = walk(&nodes)?;
    let artifacts = listed_artifacts(run_dir, &found);
    let receipts = run_dir
        .ancestors()
        .nth(3)
        .ok_or_else(|| PackError::NotARun {
            path: run_dir.to_path_buf(),
        })?;
    let store = super::store::store_dir(receipts);
    let temp = run_dir.join(format!(".{PACK}.{}.tmp", std::process::id()));
    let written = (|| {
        // Held from the check that an object is stored until the archive naming it is in
        // place: gc's sweep, under the same lock, then sees the archive.
        let _lock = super::store::lock(&store).map_err(io_at(&store))?;
        let out = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o644)
            .open(&temp)
            .map_err(io_at(&temp))?;
        let mut zip = zip::ZipWriter::new(std::io::BufWriter::new(out));
        let mut packed = Packed::default();
        let mut linked = std::collections::BTreeSet::new();
        for (name, what) in &found {
            let path = run_dir.join(name);
            let zerr = |e: zip::result::ZipError| PackError::Io {
                path: path.clone(),
                error: zip_io(e),
            };
            match what {
                Found::Folder => zip
                    .add_directory(format!("{name}/"), SimpleFileOptions::default())
                    .map_err(zerr)?,
                Found::File { len, dev, ino } => {
                    if let Some((a, object)) = artifacts
                        .get(name)
                        .and_then(|a| stored_object(&store, a, *len, (*dev, *ino)).map(|o| (a, o)))
                    {
                        zip.add_symlink(
                            name,
                            link_target(name, &object),
                            SimpleFileOptions::default(),
                        )
                        .map_err(zerr)?;
                        packed.linked += 1;
                        linked.insert(a.sha256.clone());
                        continue;
                    }
                    let mut file = open_plain(&path)?;
                    let mode = file.metadata().map_err(io_at(&path))?.mode() & 0o777;
                    let options = SimpleFileOptions::default()
                        .compression_method(zip::CompressionMethod::Deflated)
                        .unix_permissions(mode)
                        .large_file(*len >= u64::from(u32::MAX));
                    zip.start_file(name, options).map_err(zerr)?;
                    std::io::copy(&mut file, &mut zip).map_err(io_at(&path))?;
                    packed.files += 1;
                }
            }
        }
        let list: String = linked.iter().map(|s| format!("{s}\n")).collect();
        zip.start_file(
            crate::gate::packed::LINKS,
            SimpleFileOptions::default().compression_method(zip::CompressionMethod::Deflated),
        )
        .and_then(|()| zip.write_all(list.as_bytes()).map_err(Into::into))
        .map_err(|e| io_at(&temp)(zip_io(e)))?;
        let mut out = zip
            .finish()
            .map_err(|e| io_at(&temp)(zip_io(e)))?
            .into_inner()
            .map_err(|e| io_at(&temp)(e.into_error()))?;
        out.flush().map_err(io_at(&temp))?;
        out.sync_all().map_err(io_at(&temp))?;
        packed.bytes = out.metadata().map_err(io_at(&temp))?.len();
        // A link, not a rename: it fails rather than replace an archive that appeared.
        std::fs::hard_link(&temp, &target).map_err(io_at(&target))?;
        let _ = std::fs::remove_file(&temp);
        if let Ok(dir) = File::open(run_dir) {
            let _ = dir.sync_all();
        }
        Ok(packed)
    })();
    let mut packed = match written {
        Ok(p) => p,
        Err(e) => {
            let _ = std::fs::remove_file(&temp);
            return Err(e);
        }
    };
    // The archive is in place: what goes wrong from here is a leftover, not a failure.
    packed.left = finish_removal(run_dir).unwrap_or_else(|e| Some(e.to_string()));
    Ok(Some(packed))
}

/// Removes the temporary archives a killed packer left in `run_dir`.
fn remove_stale_temps(run_dir: &Path) {
    let Ok(entries) = std::fs::read_dir(run_dir) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if name.starts_with(&format!(".{PACK}.")) && name.ends_with(".tmp") {
            let _ = std::fs::remove_file(e.path());
        }
    }
}

/// Removes the `nodes/` of a packed run: each file the archive holds with the same size
/// (a link to the store: by name), then the folders left empty. `Ok(Some(why))` when
/// anything stays (a file the archive lacks or holds otherwise, one written meanwhile).
fn finish_removal(run_dir: &Path) -> Result<Option<String>, PackError> {
    let nodes = run_dir.join("nodes");
    let pack = run_dir.join(PACK);
    let archive = open_archive(&pack).map_err(io_at(&pack))?;
    let mut held: std::collections::HashMap<String, Option<u64>> = std::collections::HashMap::new();
    for i in 0..archive.len() {
        let entry = archive
            .by_index_data(i)
            .map_err(|e| io_at(&pack)(zip_io(e)))?;
        let name = entry
            .name()
            .map_err(|e| io_at(&pack)(zip_io(e)))?
            .into_owned();
        let size = (!entry.is_symlink()).then(|| entry.size());
        held.insert(name, size);
    }
    let found = walk(&nodes)?;
    let mut kept = None;
    for (name, what) in found.iter().rev() {
        let path = run_dir.join(name);
        match what {
            Found::File { len, .. } => match held.get(name) {
                Some(size) if size.is_none_or(|s| s == *len) => {
                    if let Err(e) = std::fs::remove_file(&path) {
                        kept.get_or_insert(format!("cannot remove {}: {e}", path.display()));
                    }
                }
                _ => {
                    kept.get_or_insert(format!(
                        "{} holds {name}, which {} does not hold as it is: left as it is",
                        nodes.display(),
                        pack.display()
                    ));
                }
            },
            // Deepest first (the walk is sorted), so a folder's files are gone before it.
            Found::Folder => {
                let _ = std::fs::remove_dir(&path);
            }
        }
    }
    if let Err(e) = std::fs::remove_dir(&nodes) {
        kept.get_or_insert(format!("cannot remove {}: {e}", nodes.display()));
    }
    Ok(kept)
}

/// Every folder and plain file below `nodes` (named from the run folder, `nodes/…`),
/// sorted; anything else is an error.
fn walk(nodes: &Path) -> Result<Vec<(String, Found)>, PackError> {
    let mut out = Vec::new();
    let mut stack = vec![("nodes".to_string(), nodes.to_path_buf())];
    while let Some((name, dir)) = stack.pop() {
        for entry in std::fs::read_dir(&dir).map_err(io_at(&dir))? {
            let entry = entry.map_err(io_at(&dir))?;
            let path = entry.path();
            let Some(leaf) = entry.file_name().to_str().map(str::to_string) else {
                return Err(PackError::NotPlain {
                    path,
                    what: "name that is not UTF-8",
                });
            };
            let child = format!("{name}/{leaf}");
            let meta = std::fs::symlink_metadata(&path).map_err(io_at(&path))?;
            let ft = meta.file_type();
            if ft.is_dir() {
                out.push((child.clone(), Found::Folder));
                stack.push((child, path));
            } else if ft.is_file() {
                out.push((
                    child,
                    Found::File {
                        len: meta.len(),
                        dev: meta.dev(),
                        ino: meta.ino(),
                    },
                ));
            } else {
                return Err(PackError::NotPlain {
                    path,
                    what: kind_of(&ft),
                });
            }
        }
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(out)
}

/// The artifacts the receipts list, by their name in the archive.
fn listed_artifacts(
    run_dir: &Path,
    found: &[(String, Found)],
) -> BTreeMap<String, super::Artifact> {
    let mut out = BTreeMap::new();
    for (name, _) in found {
        let Some(slug) = name
            .strip_prefix("nodes/")
            .and_then(|r| r.strip_suffix("/receipt.json"))
            .filter(|s| !s.contains('/'))
        else {
            continue;
        };
        let Ok(Some(listed)) = super::read_json::<Listed>(&run_dir.join(name)) else {
            continue;
        };
        if listed.slug != slug {
            continue;
        }
        for attempt in listed.attempts {
            for a in attempt.artifacts {
                let key = format!(
                    "nodes/{slug}/{}/artifacts/{}",
                    super::attempt_dir_name(attempt.n),
                    a.name
                );
                out.insert(key, a);
            }
        }
    }
    out
}

/// The store's object holding `a`, when the file (`len` bytes, `id` its device and inode)
/// is that very object.
fn stored_object(store: &Path, a: &super::Artifact, len: u64, id: (u64, u64)) -> Option<PathBuf> {
    if !is_sha256(&a.sha256) || a.bytes != len {
        return None;
    }
    let object = store.join(&a.sha256[..2]).join(&a.sha256);
    let m = std::fs::symlink_metadata(&object).ok()?;
    (m.is_file() && m.len() == len && (m.dev(), m.ino()) == id).then_some(object)
}

fn open_plain(path: &Path) -> Result<File, PackError> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
        .map_err(io_at(path))?;
    let meta = file.metadata().map_err(io_at(path))?;
    if !meta.is_file() {
        return Err(PackError::NotPlain {
            path: path.to_path_buf(),
            what: kind_of(&meta.file_type()),
        });
    }
    Ok(file)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gate::packed::{MAX_MEMBER, Member, has_folder, links, read};
    use crate::receipt::store::{self, STORE_DIR};
    use std::io::Read;

    const RUN: &str = "20261201T000000.000Z-abcd";

    /// A run folder with one cell: a receipt listing one artifact (interned in the store),
    /// logs, checks and an empty folder. Returns (receipts, run folder, artifact sha).
    fn run_tree(root: &Path) -> (PathBuf, PathBuf, String) {
        let receipts = root.join("receipts");
        let run = receipts.join("c1").join("smoke").join(RUN);
        let attempt = run.join("nodes/a-1/attempt-1");
        std::fs::create_dir_all(attempt.join("artifacts/sub")).unwrap();
        std::fs::create_dir_all(attempt.join("empty")).unwrap();
        std::fs::write(run.join("run.json"), "{}").unwrap();
        std::fs::write(attempt.join("stdout.log"), "hello\n").unwrap();
        std::fs::write(attempt.join("checks.jsonl"), "{\"check\":\"x\"}\n").unwrap();
        let bytes = b"logits bytes";
        let sha = crate::words::digest::sha256_hex(bytes);
        let art = attempt.join("artifacts/sub/l.bin");
        std::fs::write(&art, bytes).unwrap();
        assert_eq!(
            store::intern(&store::store_dir(&receipts), &art, 12, &sha),
            store::Interned::Added
        );
        // An artifact the store does not hold (its digest is not listed right).
        std::fs::write(attempt.join("artifacts/kept.bin"), b"kept").unwrap();
        let receipt = serde_json::json!({
            "slug": "a-1",
            "attempts": [{"n": 1, "artifacts": [
                {"name": "sub/l.bin", "bytes": 12, "sha256": sha},
                {"name": "kept.bin", "bytes": 4, "sha256": "0".repeat(64)}
            ]}]
        });
        std::fs::write(run.join("nodes/a-1/receipt.json"), receipt.to_string()).unwrap();
        (receipts, run, sha)
    }

    #[test]
    fn a_packed_run_reads_as_its_tree_did_and_keeps_its_objects_stored() {
        let dir = tempfile::tempdir().unwrap();
        let (receipts, run, sha) = run_tree(dir.path());
        let p = pack(&run).unwrap().unwrap();
        assert_eq!((p.files, p.linked, p.left), (4, 1, None));
        assert!(!run.join("nodes").exists() && run.join(PACK).is_file());
        // Receipts, logs and checks by their old paths.
        let r: serde_json::Value = crate::receipt::read_json(&run.join("nodes/a-1/receipt.json"))
            .unwrap()
            .unwrap();
        assert_eq!(r["slug"], "a-1");
        let attempt = run.join("nodes/a-1/attempt-1");
        let read = |rel: &str| {
            let mut s = Vec::new();
            crate::gate::attempt_file::open(&attempt, Path::new(rel))
                .unwrap()
                .read_to_end(&mut s)
                .unwrap();
            s
        };
        assert_eq!(read("stdout.log"), b"hello\n");
        assert_eq!(read("artifacts/sub/l.bin"), b"logits bytes");
        assert_eq!(read("artifacts/kept.bin"), b"kept");
        // The stored artifact is the store's object, not a copy.
        let object = receipts.join(STORE_DIR).join(&sha[..2]).join(&sha);
        assert_eq!(
            read_member(&attempt.join("artifacts/sub/l.bin")),
            Member::Object(object.clone())
        );
        assert_eq!(
            crate::gate::attempt_file::files_below(&attempt, Path::new("artifacts")).unwrap(),
            vec![PathBuf::from("kept.bin"), PathBuf::from("sub/l.bin")]
        );
        assert!(has_folder(&attempt.join("empty")));
        assert!(matches!(
            crate::gate::attempt_file::open(&attempt, Path::new("nothing")),
            Err(crate::gate::attempt_file::OpenError::NotFound { .. })
        ));
        assert_eq!(links(&run.join(PACK)).unwrap(), vec![sha.clone()]);
        // The archive alone holds the object now (link count 1), and the sweep keeps it.
        assert_eq!(std::fs::metadata(&object).unwrap().nlink(), 1);
        assert_eq!(
            store::sweep(&store::store_dir(&receipts)).unwrap(),
            store::Swept::default()
        );
        assert!(object.is_file());
        // Once the run is gone, so is the object.
        std::fs::remove_dir_all(&run).unwrap();
        assert_eq!(
            store::sweep(&store::store_dir(&receipts)).unwrap().objects,
            1
        );
        assert!(!object.exists());
    }

    fn read_member(path: &Path) -> Member {
        read(path, MAX_MEMBER).unwrap().unwrap()
    }

    #[test]
    fn the_archive_unzips_into_the_tree_with_links_into_the_store() {
        let dir = tempfile::tempdir().unwrap();
        let (_, run, _) = run_tree(dir.path());
        pack(&run).unwrap().unwrap();
        let mut archive = open_archive(&run.join(PACK)).unwrap();
        let i = archive
            .index_for_name("nodes/a-1/attempt-1/artifacts/sub/l.bin")
            .unwrap();
        let mut entry = archive.by_index(i).unwrap();
        assert!(entry.is_symlink());
        let mut target = String::new();
        entry.read_to_string(&mut target).unwrap();
        // Resolved from where the entry would be unzipped, it is the object.
        let at = run.join("nodes/a-1/attempt-1/artifacts/sub");
        std::fs::create_dir_all(&at).unwrap();
        assert_eq!(std::fs::read(at.join(&target)).unwrap(), b"logits bytes");
    }

    #[test]
    fn a_tree_holding_a_link_or_a_fifo_stays_unpacked() {
        let dir = tempfile::tempdir().unwrap();
        let (_, run, _) = run_tree(dir.path());
        let attempt = run.join("nodes/a-1/attempt-1");
        std::os::unix::fs::symlink("/etc/passwd", attempt.join("leak")).unwrap();
        let e = pack(&run).unwrap_err();
        assert!(e.to_string().contains("symbolic link"), "{e}");
        std::fs::remove_file(attempt.join("leak")).unwrap();
        let fifo = std::ffi::CString::new(attempt.join("pipe").to_str().unwrap()).unwrap();
        // SAFETY: a valid path.
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
        let e = pack(&run).unwrap_err();
        assert!(e.to_string().contains("FIFO"), "{e}");
        assert!(attempt.join("stdout.log").is_file() && !run.join(PACK).exists());
        let leftovers: Vec<_> = std::fs::read_dir(&run)
            .unwrap()
            .flatten()
            .map(|e| e.file_name())
            .collect();
        assert_eq!(leftovers.len(), 2, "no temporary left: {leftovers:?}");
        // Not a run folder: refused.
        assert!(matches!(
            pack(run.parent().unwrap()),
            Err(PackError::NotARun { .. })
        ));
    }

    #[test]
    fn a_packer_stopped_midway_is_finished_and_never_loses_a_file() {
        let dir = tempfile::tempdir().unwrap();
        let (_, run, _) = run_tree(dir.path());
        pack(&run).unwrap().unwrap();
        // As a packer killed while removing `nodes/` leaves it: part of the tree.
        let attempt = run.join("nodes/a-1/attempt-1");
        std::fs::create_dir_all(&attempt).unwrap();
        std::fs::write(attempt.join("stdout.log"), "hello\n").unwrap();
        // A file the archive does not hold is never removed.
        std::fs::write(attempt.join("extra"), "x").unwrap();
        let p = pack(&run).unwrap().unwrap();
        assert!(p.left.unwrap().contains("extra"));
        assert!(attempt.join("extra").is_file());
        std::fs::remove_file(attempt.join("extra")).unwrap();
        assert_eq!(pack(&run).unwrap().unwrap().left, None);
        assert!(!run.join("nodes").exists());
        assert_eq!(pack(&run).unwrap(), None);
    }

    #[test]
    fn a_damaged_or_forged_archive_is_an_error_never_other_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let (_, run, _) = run_tree(dir.path());
        pack(&run).unwrap().unwrap();
        // A forged link leading out of the store is refused.
        let forged = dir
            .path()
            .join("receipts/c1/smoke/20261201T000001.000Z-abcd");
        std::fs::create_dir_all(&forged).unwrap();
        let mut zip = zip::ZipWriter::new(File::create(forged.join(PACK)).unwrap());
        zip.add_symlink(
            "nodes/a-1/attempt-1/stdout.log",
            "../../../../../../../etc/passwd",
            SimpleFileOptions::default(),
        )
        .unwrap();
        zip.finish().unwrap();
        let e = read(&forged.join("nodes/a-1/attempt-1/stdout.log"), MAX_MEMBER).unwrap_err();
        assert!(e.to_string().contains("not to the artifact store"), "{e}");
        assert!(links(&forged.join(PACK)).unwrap().is_empty());
        // A flipped byte inside a deflated member fails its CRC.
        let path = run.join(PACK);
        let mut bytes = std::fs::read(&path).unwrap();
        let at = bytes
            .windows(b"stdout.log".len())
            .position(|w| w == b"stdout.log")
            .unwrap()
            + b"stdout.log".len()
            + 1;
        bytes[at] ^= 0x55;
        let damaged = dir
            .path()
            .join("receipts/c1/smoke/20261201T000002.000Z-abcd");
        std::fs::create_dir_all(&damaged).unwrap();
        std::fs::write(damaged.join(PACK), &bytes).unwrap();
        let got = read(&damaged.join("nodes/a-1/attempt-1/stdout.log"), MAX_MEMBER);
        assert!(got.is_err(), "{got:?}");
    }
    #[test]
    fn only_the_run_folders_archive_is_read_and_a_relative_path_finds_the_store() {
        let dir = tempfile::tempdir().unwrap();
        let (receipts, run, sha) = run_tree(dir.path());
        // A gate's own `nodes.zip` in a run that stays a tree is never taken for one.
        let planted = run.join("nodes/a-1/attempt-1/artifacts/sub");
        std::fs::copy(run.join("run.json"), planted.join("nodes.zip")).unwrap();
        assert_eq!(read(&planted.join("nodes/x"), MAX_MEMBER).unwrap(), None);
        std::fs::remove_file(planted.join("nodes.zip")).unwrap();
        pack(&run).unwrap().unwrap();
        // Through `..`, the store is the receipts folder's all the same.
        let roundabout = run
            .join("..")
            .join(RUN)
            .join("nodes/a-1/attempt-1/artifacts/sub/l.bin");
        let object = std::fs::canonicalize(&receipts)
            .unwrap()
            .join(STORE_DIR)
            .join(&sha[..2])
            .join(&sha);
        assert_eq!(read_member(&roundabout), Member::Object(object));
    }

    #[test]
    fn an_artifact_whose_object_was_swept_meanwhile_is_packed_as_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let (receipts, run, sha) = run_tree(dir.path());
        // A gc swept the object between the intern and the packing (the attempt's file
        // still holds the bytes).
        let object = receipts.join(STORE_DIR).join(&sha[..2]).join(&sha);
        std::fs::remove_file(&object).unwrap();
        let p = pack(&run).unwrap().unwrap();
        assert_eq!((p.files, p.linked), (5, 0));
        assert!(links(&run.join(PACK)).unwrap().is_empty());
        assert_eq!(
            read_member(&run.join("nodes/a-1/attempt-1/artifacts/sub/l.bin")),
            Member::Bytes(b"logits bytes".to_vec())
        );
    }
}
