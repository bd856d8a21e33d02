//! The process exit codes of `memra-orch`, one enum, documented in `--help`.

/// Semantic exit codes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(i32)]
pub enum ExitCode {
    /// Every node ended as expected (skipped nodes included, unless a requirement is in
    /// force).
    Ok = 0,
    /// Something did not end as expected (fail, crash, timeout, error, blocked; skipped for
    /// lack of resources while a requirement is in force), or a diff found a regression or
    /// lost coverage.
    NotAsExpected = 1,
    /// The manifest or the command line is wrong; nothing ran.
    Usage = 2,
    /// memra-orch itself broke (a bug or an I/O failure of the receipt tree).
    Internal = 3,
    /// The machine does not meet the run's requirement (`[require]`, `--require-gpus`);
    /// nothing ran. Not a usage error: the same command succeeds on a machine that has it.
    RequirementUnmet = 4,
    /// `bisect` could not name one commit: the cell is flaky at a tested commit, or skipped
    /// commits leave a range the first change is in (both are in its report).
    Inconclusive = 5,
    /// Another run holds the lock of the receipt tree (sysexits' `EX_TEMPFAIL`); nothing
    /// ran. Not a usage error: the same command succeeds once that run ends, so a cron job
    /// can tell "try later" from "broken".
    Locked = 75,
    /// The file system of the receipt tree filled (ENOSPC, EDQUOT; sysexits' `EX_IOERR`):
    /// the run stopped starting cells, marked the cells it lost as `error: disk full at …`
    /// and finalized `run.json`. Not a gate failure: free space and run again.
    DiskFull = 74,
    /// A GPU faulted (an Xid of the hardware, an uncorrected ECC error, a page pending
    /// retirement, the GPU lost) and nothing but the hardware went wrong: every cell ended
    /// as expected or `device-fault` (sysexits' `EX_UNAVAILABLE`). A real failure beside a
    /// fault is exit 1.
    DeviceFault = 69,
    /// Interrupted by Ctrl-C, SIGTERM or SIGHUP; running nodes were cancelled.
    Interrupted = 130,
}

impl ExitCode {
    pub fn code(self) -> i32 {
        self as i32
    }
}

/// Text for `--help`.
pub const EXIT_CODES_HELP: &str = "\
Exit codes:
  0    every node ended as expected (skipped nodes do not fail a run without a requirement)
  1    something did not end as expected (with `[require]` or --require-gpus in force, a node
       skipped for lack of GPUs counts), or `diff` found a regression or lost coverage
  2    manifest or usage error: nothing ran
  3    internal error of memra-orch
  4    the machine does not meet the requirement (`[require]`, --require-gpus): nothing ran
  5    `bisect` could not name one commit: the cell is flaky, or untestable commits leave a
       range
  69   a GPU faulted (hardware Xid, uncorrected ECC error, page pending retirement, GPU lost)
       and every cell ended as expected or `device-fault`: the hardware's failure, not the
       code's; the GPU took no new cells (run.json `quarantined_gpus`)
  74   the disk of the receipt tree filled: the run stopped, its cells that could not finish
       or be recorded are `error: disk full at …`, run.json is final; free space, run again
  75   another run of this manifest at this commit holds the lock (after --wait-lock, if
       given): nothing ran; try again later
  130  interrupted (Ctrl-C / SIGTERM / SIGHUP): running nodes were cancelled";
