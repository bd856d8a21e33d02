//! `run --metrics-file PATH`: the run as a Prometheus textfile (the text exposition format,
//! version 0.0.4, that node_exporter's textfile collector reads from `*.prom` files).
//!
//! The file is written twice, each time whole and atomically (a temporary file in the same
//! folder, renamed over PATH): when the run starts, saying only that it runs
//! (`memra_run_running 1`, the start time, the run's id), so a run killed outright (SIGKILL,
//! a lost machine) leaves a file an alert can see stuck at "running"; and when it has ended,
//! from `run.json` as finally written plus the exit code, so the counts are the receipt
//! tree's own. This module owns the metric names, labels and the rendering; the numbers all
//! come from the [`RunReceipt`] it is handed, and it decides nothing about verdicts.

use std::fmt::Write as _;
use std::io::Write as _;
use std::path::{Path, PathBuf};

use crate::receipt::RunReceipt;
use crate::run::events::{Event, Listener};
use crate::words::exit::ExitCode;
use crate::words::verdict::Verdict;

/// Why `--metrics-file PATH` cannot be used; found before anything runs.
#[derive(Debug, thiserror::Error)]
pub enum MetricsPathError {
    #[error("--metrics-file {}: is a directory; give a file path in it, such as {}", path.display(), path.join("memra.prom").display())]
    IsDirectory { path: PathBuf },
    #[error("--metrics-file {}: the folder {} does not exist; create it or give a path in an existing folder", path.display(), dir.display())]
    NoFolder { path: PathBuf, dir: PathBuf },
    #[error("--metrics-file {}: cannot write in {}: {error}; give a path in a folder memra-orch may write", path.display(), dir.display())]
    NotWritable {
        path: PathBuf,
        dir: PathBuf,
        error: std::io::Error,
    },
    #[error("--metrics-file {}: the file exists and is not a metrics file memra-orch wrote; it would be overwritten: remove it or give another path", path.display())]
    Foreign { path: PathBuf },
}

/// How every metrics file memra-orch writes begins.
const FIRST_LINE: &str = "# HELP memra_run_info ";

/// A metrics file that could not be written at the end of a run.
#[derive(Debug, thiserror::Error)]
#[error("--metrics-file {}: cannot write: {error}; check the folder is writable and has space", path.display())]
pub struct MetricsWriteError {
    pub path: PathBuf,
    pub error: std::io::Error,
}

/// Checks that PATH can become the metrics file: not a directory, in a folder that exists
/// and that memra-orch may create files in (tried with a temporary file, removed at once).
pub fn check_path(path: &Path) -> Result<(), MetricsPathError> {
    if path.is_dir() {
        return Err(MetricsPathError::IsDirectory {
            path: path.to_path_buf(),
        });
    }
    // `out/` names a folder even when it does not exist; the file would be `out`.
    let names_folder = std::os::unix::ffi::OsStrExt::as_bytes(path.as_os_str()).ends_with(b"/");
    let dir = if names_folder {
        path.to_path_buf()
    } else {
        folder_of(path)
    };
    if names_folder || !dir.is_dir() {
        return Err(MetricsPathError::NoFolder {
            path: path.to_path_buf(),
            dir,
        });
    }
    // An existing file is replaced only when it is empty or one memra-orch wrote: a typo
    // (`--metrics-file manifest.toml`) must not cost the user a file.
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        let ours = meta.is_file()
            && (meta.len() == 0
                || crate::gate::attempt_file::open_path(path).is_ok_and(|f| {
                    use std::io::Read as _;
                    let mut head = Vec::new();
                    f.take(FIRST_LINE.len() as u64)
                        .read_to_end(&mut head)
                        .is_ok()
                        && head == FIRST_LINE.as_bytes()
                }));
        if !ours {
            return Err(MetricsPathError::Foreign {
                path: path.to_path_buf(),
            });
        }
    }
    temp_in(&dir, path)
        .map(drop)
        .map_err(|error| MetricsPathError::NotWritable {
            path: path.to_path_buf(),
            dir,
            error,
        })
}

/// The folder a path names a file in (`.` for a bare file name).
fn folder_of(path: &Path) -> PathBuf {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// A temporary file beside `path`, named `.<name>.<random>.tmp` so that the textfile
/// collector, which reads only `*.prom`, never reads a half-written one.
fn temp_in(dir: &Path, path: &Path) -> std::io::Result<tempfile::NamedTempFile> {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    tempfile::Builder::new()
        .prefix(&format!(".{name}."))
        .suffix(".tmp")
        .tempfile_in(dir)
}

/// Replaces `path` with `text` atomically. The file is made readable by everyone (0644):
/// the collector usually runs as another user, and the metrics hold nothing secret (cell
/// ids, verdicts, times).
fn write_atomic(path: &Path, text: &str) -> Result<(), MetricsWriteError> {
    let fail = |error| MetricsWriteError {
        path: path.to_path_buf(),
        error,
    };
    let mut tmp = temp_in(&folder_of(path), path).map_err(fail)?;
    tmp.write_all(text.as_bytes()).map_err(fail)?;
    tmp.as_file()
        .set_permissions(std::os::unix::fs::PermissionsExt::from_mode(0o644))
        .map_err(fail)?;
    // A failed rename drops (and so removes) the temporary file.
    tmp.persist(path).map_err(|e| fail(e.error))?;
    Ok(())
}

/// The metrics-file listener: writes the "running" file when the run starts; the caller
/// writes the final one with [`MetricsFile::finish_run`] once `run.json` is final and the
/// exit code known.
pub struct MetricsFile {
    path: PathBuf,
    header: RunReceipt,
}

impl MetricsFile {
    /// `header` is `run.json` as known before the run (see `ReceiptWriter::new`).
    pub fn new(path: PathBuf, header: RunReceipt) -> MetricsFile {
        MetricsFile { path, header }
    }

    /// Writes the final file from the run as recorded and the process's exit code.
    pub fn finish_run(&self, run: &RunReceipt, exit: ExitCode) -> Result<(), MetricsWriteError> {
        write_atomic(&self.path, &render(run, Some(exit)))
    }
}

impl Listener for MetricsFile {
    fn on_event(&mut self, event: &Event) {
        if let Event::RunStarted { .. } = event
            && let Err(e) = write_atomic(&self.path, &render(&self.header, None))
        {
            // The run goes on: the final write says whether the file could be made.
            eprintln!("memra-orch run: {e}");
        }
    }
}

/// One metric family: its name, type and help, then its samples.
struct Family<'a> {
    out: &'a mut String,
}

impl<'a> Family<'a> {
    fn new(out: &'a mut String, name: &str, kind: &str, help: &str) -> Family<'a> {
        let _ = writeln!(out, "# HELP {name} {}", escape_help(help));
        let _ = writeln!(out, "# TYPE {name} {kind}");
        Family { out }
    }

    fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: f64) {
        self.out.push_str(name);
        if !labels.is_empty() {
            self.out.push('{');
            for (i, (k, v)) in labels.iter().enumerate() {
                if i > 0 {
                    self.out.push(',');
                }
                let _ = write!(self.out, "{k}=\"{}\"", escape_label(v));
            }
            self.out.push('}');
        }
        let _ = writeln!(self.out, " {value}");
    }
}

/// A label value as the text format spells it: backslash, double quote and line feed
/// escaped (`\\`, `\"`, `\n`); everything else as it is.
pub fn escape_label(v: &str) -> String {
    let mut out = String::with_capacity(v.len());
    for c in v.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

/// HELP text escapes only backslash and line feed.
fn escape_help(v: &str) -> String {
    v.replace('\\', "\\\\").replace('\n', "\\n")
}

/// Seconds since the epoch of a timestamp `run.json` wrote (RFC 3339), if it parses.
fn epoch(rfc3339: &str) -> Option<f64> {
    let t = humantime::parse_rfc3339(rfc3339).ok()?;
    Some(t.duration_since(std::time::UNIX_EPOCH).ok()?.as_secs_f64())
}

/// The text of the metrics file for `run`: the running file when `exit` is `None`, the
/// final one otherwise. Every series carries `manifest` and `commit`; the per-cell ones add
/// `cell`. The families are gauges: the file is a snapshot of one run, which a later run
/// replaces, so no value only grows.
pub fn render(run: &RunReceipt, exit: Option<ExitCode>) -> String {
    let mut out = String::new();
    let base = [
        ("manifest", run.name.as_str()),
        ("commit", run.commit.as_str()),
    ];
    let id = run.run_id.as_deref().unwrap_or("-");
    let mut info: Vec<(&str, &str)> = base.to_vec();
    info.push(("run", id));
    Family::new(
        &mut out,
        "memra_run_info",
        "gauge",
        "The run this file describes (its id in the run label); always 1.",
    )
    .sample("memra_run_info", &info, 1.0);
    Family::new(
        &mut out,
        "memra_run_running",
        "gauge",
        "1 while the run goes (or when it was killed before it could finish), 0 once it ended.",
    )
    .sample(
        "memra_run_running",
        &base,
        if exit.is_some() { 0.0 } else { 1.0 },
    );
    if let Some(t) = epoch(&run.start) {
        Family::new(
            &mut out,
            "memra_run_start_timestamp_seconds",
            "gauge",
            "When the run started, in seconds since the Unix epoch.",
        )
        .sample("memra_run_start_timestamp_seconds", &base, t);
    }
    let Some(exit) = exit else {
        return out;
    };
    if let Some(t) = run.end.as_deref().and_then(epoch) {
        Family::new(
            &mut out,
            "memra_run_end_timestamp_seconds",
            "gauge",
            "When the run ended, in seconds since the Unix epoch.",
        )
        .sample("memra_run_end_timestamp_seconds", &base, t);
    }
    Family::new(
        &mut out,
        "memra_run_duration_seconds",
        "gauge",
        "Wall time of the run.",
    )
    .sample(
        "memra_run_duration_seconds",
        &base,
        run.seconds.unwrap_or(0.0),
    );
    Family::new(
        &mut out,
        "memra_run_exit_code",
        "gauge",
        "The exit code of memra-orch run (0 all as expected, 1 not as expected, 130 interrupted; see memra-orch run --help).",
    )
    .sample("memra_run_exit_code", &base, f64::from(exit.code()));
    Family::new(
        &mut out,
        "memra_run_success",
        "gauge",
        "1 when run.json's verdict is pass and the exit code is 0, else 0.",
    )
    .sample(
        "memra_run_success",
        &base,
        if run.verdict == "pass" && exit == ExitCode::Ok {
            1.0
        } else {
            0.0
        },
    );
    Family::new(
        &mut out,
        "memra_run_interrupted",
        "gauge",
        "1 when the run was interrupted (Ctrl-C, SIGTERM, SIGHUP), else 0.",
    )
    .sample(
        "memra_run_interrupted",
        &base,
        if run.interrupted { 1.0 } else { 0.0 },
    );
    Family::new(
        &mut out,
        "memra_run_quarantined_gpus",
        "gauge",
        "GPUs that faulted during the run and took no new cells (run.json quarantined_gpus).",
    )
    .sample(
        "memra_run_quarantined_gpus",
        &base,
        run.quarantined_gpus.len() as f64,
    );
    let mut cells = Family::new(
        &mut out,
        "memra_run_cells",
        "gauge",
        "Cells of the run by verdict, as run.json counts them (every verdict, zeros included).",
    );
    for v in Verdict::ALL {
        let n = run.counts.get(&v).copied().unwrap_or(0);
        let mut labels = base.to_vec();
        labels.push(("verdict", v.as_str()));
        cells.sample("memra_run_cells", &labels, n as f64);
    }
    let mut verdicts = Family::new(
        &mut out,
        "memra_cell_verdict",
        "gauge",
        "One series per cell, with its verdict in the verdict label; always 1.",
    );
    for n in &run.nodes {
        let mut labels = base.to_vec();
        labels.push(("cell", n.id.as_str()));
        labels.push(("verdict", n.verdict.as_str()));
        verdicts.sample("memra_cell_verdict", &labels, 1.0);
    }
    let mut seconds = Family::new(
        &mut out,
        "memra_cell_duration_seconds",
        "gauge",
        "Wall time of each cell, all its attempts (0 for cells that did not run).",
    );
    for n in &run.nodes {
        let mut labels = base.to_vec();
        labels.push(("cell", n.id.as_str()));
        seconds.sample("memra_cell_duration_seconds", &labels, n.seconds);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_values_escape_backslash_quote_and_newline() {
        assert_eq!(escape_label(r#"a\b"c"#), r#"a\\b\"c"#);
        assert_eq!(escape_label("x\ny"), "x\\ny");
        assert_eq!(escape_label("gen[dtype=f16,n=2]"), "gen[dtype=f16,n=2]");
    }

    #[test]
    fn a_sample_line_quotes_every_label() {
        let mut out = String::new();
        Family::new(&mut out, "m", "gauge", "h\\x\ny").sample(
            "m",
            &[("cell", "a\"b"), ("verdict", "pass")],
            1.5,
        );
        assert_eq!(
            out,
            "# HELP m h\\\\x\\ny\n# TYPE m gauge\nm{cell=\"a\\\"b\",verdict=\"pass\"} 1.5\n"
        );
    }

    #[test]
    fn a_directory_or_a_missing_folder_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let e = check_path(dir.path()).unwrap_err();
        assert!(matches!(e, MetricsPathError::IsDirectory { .. }), "{e}");
        assert!(e.to_string().contains("memra.prom"), "{e}");
        let e = check_path(&dir.path().join("no/such/x.prom")).unwrap_err();
        assert!(matches!(e, MetricsPathError::NoFolder { .. }), "{e}");
        let slash = format!("{}/out/", dir.path().display());
        let e = check_path(Path::new(&slash)).unwrap_err();
        assert!(matches!(e, MetricsPathError::NoFolder { .. }), "{e}");
        check_path(&dir.path().join("x.prom")).unwrap();
        // The probe leaves nothing behind.
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }
}
