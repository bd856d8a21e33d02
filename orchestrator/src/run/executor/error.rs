//! The ways running a cell fails around its gate: a file or folder of the attempt that
//! cannot be made or read, a command that cannot be started or waited for, a text verdict
//! that does not compile ([`ExecError`], for the local executor), and a Slurm job that
//! cannot be written, submitted or sized ([`SlurmError`], for the Slurm executor).
//!
//! It owns the wording only; the operations that fail are in the sibling modules. These
//! messages become a receipt's or an attempt's `reason`, so their text is part of the
//! receipt format: changing a word changes what `diff` and `show` print of older runs.

use std::path::PathBuf;
use std::process::ExitStatus;

/// A local attempt (or the cell around it) that could not run its gate.
#[derive(Debug, thiserror::Error)]
pub enum ExecError {
    /// A file or folder operation of the cell, and where.
    #[error("{}: {kind}", path.display())]
    File { path: PathBuf, kind: FileErrorKind },
    #[error("{node}: the node has an empty `run`; give it a command")]
    EmptyRun { node: String },
    #[error(
        "cannot start {program:?} in {}: {error}; check that the program exists, is executable, and that \
         its folder is on the inherited PATH or the path is relative to the root",
        cwd.display()
    )]
    Spawn {
        program: String,
        cwd: PathBuf,
        error: std::io::Error,
    },
    /// A file of the attempt that was not opened; a refusal (a link, not a regular file)
    /// is the gate's protocol error.
    #[error("{}{}", if .0.is_refusal() { "protocol error: " } else { "" }, .0)]
    AttemptFile(crate::gate::attempt_file::OpenError),
    #[error("waiting for pid {pgid} failed: {error}")]
    Wait { pgid: i32, error: std::io::Error },
    /// The attempt's supervisor ended without saying how the gate ended.
    #[error(
        "{0}; run the cell again, and if this repeats look for what kills memra-orch's children"
    )]
    Supervisor(String),
    #[error("{node}: verdict.{which} {pattern:?} is not a valid regex: {error}")]
    BadRegex {
        node: String,
        /// `pass` or `fail`.
        which: &'static str,
        pattern: String,
        error: regex::Error,
    },
}

impl ExecError {
    pub fn file(path: impl Into<PathBuf>, kind: FileErrorKind) -> ExecError {
        ExecError::File {
            path: path.into(),
            kind,
        }
    }
}

/// What went wrong at an [`ExecError::File`]'s path.
#[derive(Debug, thiserror::Error)]
pub enum FileErrorKind {
    #[error("cannot create the attempt's TMPDIR: {0}")]
    CreateTmp(std::io::Error),
    #[error("cannot create the attempt folder: {0}")]
    CreateAttemptDir(std::io::Error),
    #[error("cannot create the checks file: {0}")]
    CreateChecks(std::io::Error),
    #[error("cannot create stdout.log: {0}")]
    CreateStdout(std::io::Error),
    #[error("cannot create stderr.log: {0}")]
    CreateStderr(std::io::Error),
    #[error("cannot write the log: {0}")]
    WriteLog(std::io::Error),
    #[error("cannot clear the node folder: {0}")]
    ClearNodeDir(std::io::Error),
    #[error("cannot create the node folder: {0}")]
    CreateNodeDir(std::io::Error),
    #[error("cannot list artifacts: {0}")]
    ListArtifacts(std::io::Error),
    /// The type of an entry of the artifacts folder could not be read.
    #[error("{0}")]
    ArtifactType(std::io::Error),
    #[error("cannot hash artifact: {0}")]
    HashArtifact(std::io::Error),
}

/// A Slurm job that could not be prepared or submitted (the text becomes the cell's
/// `reason`), a job whose state could not be polled (printed when the executor gives up on
/// it), or a cluster whose GPUs could not be counted (printed before the run starts).
#[derive(Debug, thiserror::Error)]
pub enum SlurmError {
    #[error(
        "{}: cannot write a Slurm job file: {error}; the receipt folder must be writable \
         and shared with the compute nodes",
        path.display()
    )]
    WriteJobFile {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("{node}: cannot serialise the job: {error}")]
    SerialiseJob {
        node: String,
        error: serde_json::Error,
    },
    #[error("{}: cannot remove the old receipt: {error}", path.display())]
    RemoveOldReceipt {
        path: PathBuf,
        error: std::io::Error,
    },
    /// The run was interrupted before the job went to `sbatch`; not a failure of the cell.
    #[error("cancelled: the run was interrupted before this cell was submitted")]
    Cancelled,
    #[error("cannot run sbatch: {0}; is this a Slurm submit host (slurm-client installed)?")]
    RunSbatch(std::io::Error),
    #[error(
        "sbatch {} failed ({status}): {stderr}; check the partition, account and --slurm-arg values",
        args.join(" ")
    )]
    Sbatch {
        args: Vec<String>,
        status: ExitStatus,
        /// sbatch's standard error, trimmed.
        stderr: String,
    },
    #[error("sbatch --parsable printed {stdout:?}, not a job id")]
    NotAJobId { stdout: String },
    /// The next three are why a poll of a job's state failed; the job may be fine.
    #[error("cannot run scontrol: {0}")]
    RunScontrol(std::io::Error),
    #[error("scontrol show job {id}: {stderr}")]
    Scontrol {
        id: String,
        /// scontrol's standard error, trimmed.
        stderr: String,
    },
    #[error("scontrol show job {id} printed no JobState")]
    NoJobState { id: String },
    #[error("cannot run sinfo: {0}; --executor slurm needs the Slurm client tools on PATH")]
    RunSinfo(std::io::Error),
    #[error(
        "sinfo failed: {stderr}; check that slurmctld answers (run `sinfo` here), or set the GPU slots by hand with --gpus fake:N"
    )]
    Sinfo {
        /// sinfo's standard error, trimmed.
        stderr: String,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    fn io() -> std::io::Error {
        std::io::Error::from(std::io::ErrorKind::PermissionDenied)
    }

    /// These texts are stored in receipts; older runs must read the same after a release.
    #[test]
    fn stored_texts_keep_their_wording() {
        let e = io().to_string();
        let cases = [
            (
                ExecError::file("/t/t0", FileErrorKind::CreateTmp(io())),
                format!("/t/t0: cannot create the attempt's TMPDIR: {e}"),
            ),
            (
                ExecError::file("/n/a", FileErrorKind::CreateAttemptDir(io())),
                format!("/n/a: cannot create the attempt folder: {e}"),
            ),
            (
                ExecError::file("/n", FileErrorKind::ClearNodeDir(io())),
                format!("/n: cannot clear the node folder: {e}"),
            ),
            (
                ExecError::file("/n/x", FileErrorKind::ArtifactType(io())),
                format!("/n/x: {e}"),
            ),
            (
                ExecError::EmptyRun {
                    node: "a[x=1]".into(),
                },
                "a[x=1]: the node has an empty `run`; give it a command".into(),
            ),
            (
                ExecError::Spawn {
                    program: "gate".into(),
                    cwd: "/root".into(),
                    error: io(),
                },
                format!(
                    "cannot start \"gate\" in /root: {e}; check that the program exists, is \
                     executable, and that its folder is on the inherited PATH or the path is \
                     relative to the root"
                ),
            ),
        ];
        for (err, want) in cases {
            assert_eq!(err.to_string(), want);
        }
        let slurm = [
            (
                SlurmError::WriteJobFile {
                    path: "/s/j.json".into(),
                    error: io(),
                },
                format!(
                    "/s/j.json: cannot write a Slurm job file: {e}; the receipt folder must be \
                     writable and shared with the compute nodes"
                ),
            ),
            (
                SlurmError::Cancelled,
                "cancelled: the run was interrupted before this cell was submitted".into(),
            ),
            (
                SlurmError::NotAJobId {
                    stdout: "oops\n".into(),
                },
                "sbatch --parsable printed \"oops\\n\", not a job id".into(),
            ),
        ];
        for (err, want) in slurm {
            assert_eq!(err.to_string(), want);
        }
    }
}
