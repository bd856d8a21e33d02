//! Capturing a gate's stdout or stderr into its log file with a size cap (`max_output`), so
//! a gate that prints without end cannot fill the disk: past the cap the log ends with a
//! marker line, the rest of the stream is read and dropped (a writer blocked on a full pipe
//! would never see its stop signal otherwise), and the caller is told once, to stop the gate.
//!
//! It copies bytes; it does not spawn, judge or stop anything itself.

use std::fs::File;
use std::io::{Read, Write};

/// What a capture left.
#[derive(Debug, Default)]
pub struct Captured {
    /// The stream passed the cap and the log was cut there.
    pub truncated: bool,
    /// The first error writing the log, if any (the stream was still read to its end).
    pub error: Option<std::io::Error>,
}

/// Copies `from` into `to` until end-of-file, at most `cap` bytes of it; `log` names the
/// file in the marker line. `on_cap` runs once, when the cap is passed.
pub fn capture(
    mut from: impl Read,
    mut to: File,
    cap: u64,
    log: &str,
    on_cap: impl FnOnce(),
) -> Captured {
    let mut out = Captured::default();
    let mut on_cap = Some(on_cap);
    let mut written: u64 = 0;
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => {
                out.error.get_or_insert(e);
                break;
            }
        };
        if out.truncated {
            continue;
        }
        let room = cap.saturating_sub(written);
        let keep = n.min(usize::try_from(room).unwrap_or(usize::MAX));
        if out.error.is_none()
            && let Err(e) = to.write_all(&buf[..keep])
        {
            out.error = Some(e);
        }
        written += keep as u64;
        if keep < n {
            out.truncated = true;
            if out.error.is_none()
                && let Err(e) = to.write_all(marker(log, cap).as_bytes())
            {
                out.error = Some(e);
            }
            if let Some(f) = on_cap.take() {
                f();
            }
        }
    }
    out
}

/// The line that ends a cut log.
pub fn marker(log: &str, cap: u64) -> String {
    format!(
        "\n[memra-orch: {log} cut at max_output = \"{}\"; the gate was stopped]\n",
        format_size(cap)
    )
}

/// A byte count as a manifest would write it: `1GiB`, `512MiB`, or plain bytes.
pub fn format_size(bytes: u64) -> String {
    for (unit, shift) in [("TiB", 40), ("GiB", 30), ("MiB", 20), ("KiB", 10)] {
        if bytes >= 1 << shift && bytes.is_multiple_of(1 << shift) {
            return format!("{}{unit}", bytes >> shift);
        }
    }
    bytes.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stream_past_the_cap_is_cut_with_a_marker_and_read_to_its_end() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("stdout.log");
        let mut called = 0;
        let data = vec![b'x'; 3000];
        let mut rest = &data[..];
        let got = capture(
            &mut rest,
            File::create(&path).unwrap(),
            1024,
            "stdout.log",
            || called += 1,
        );
        assert!(got.truncated && got.error.is_none());
        assert_eq!(called, 1);
        assert!(rest.is_empty(), "the stream was not read to its end");
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(
            text,
            format!("{}{}", "x".repeat(1024), marker("stdout.log", 1024))
        );
        assert!(text.ends_with("cut at max_output = \"1KiB\"; the gate was stopped]\n"));
    }

    #[test]
    fn a_stream_within_the_cap_is_kept_whole() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("stderr.log");
        let got = capture(
            &b"hello"[..],
            File::create(&path).unwrap(),
            5,
            "stderr.log",
            || panic!("the cap was not passed"),
        );
        assert!(!got.truncated);
        assert_eq!(std::fs::read(&path).unwrap(), b"hello");
    }

    #[test]
    fn sizes_are_written_in_the_largest_exact_unit() {
        assert_eq!(format_size(1 << 30), "1GiB");
        assert_eq!(format_size(3 << 20), "3MiB");
        assert_eq!(format_size(1536), "1536");
        assert_eq!(format_size(0), "0");
    }
}
