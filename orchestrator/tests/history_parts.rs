//! `history` prints a manifest of many cells a part at a time (its reading thread sends the
//! cells in parts of 64): over 90 cells and three nights, every format, a window and a filter
//! print exactly what the history model read whole renders, and a reader that closes the
//! pipe early is not an error.

use std::io::Read as _;
use std::process::{Command, Stdio};

use memra_orch::history::{self, render, steps};

use crate::run_support::{Fixture, orch};

/// 90 cells of one arm whose artifact follows `bits`, and 3 of another that never moves, one
/// of them with an escape character in its id.
fn fixture() -> Fixture {
    let ns: Vec<String> = (0..90).map(|k| format!("\"{k:02}\"")).collect();
    Fixture::new(&format!(
        r#"
schema = 1
name = "parts"

[vars]
err = "0.25"
bits = "a"

[defaults]
gpus = 0

[[arm]]
id = "wide"
matrix = {{ n = [{}] }}
run = ["{{gates}}/nightly.sh", "pass", "${{err}}", "${{bits}}${{matrix.n}}"]

[[arm]]
id = "odd"
matrix = {{ v = ["plain", "esc\u001b[31m", "last"] }}
run = ["{{gates}}/nightly.sh", "pass", "0.5", "${{matrix.v}}"]
"#,
        ns.join(", ")
    ))
}

fn text(out: &std::process::Output) -> String {
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout.clone()).unwrap()
}

#[test]
fn many_cells_print_in_parts_exactly_as_the_whole_history_renders() {
    let f = fixture();
    for (err, bits) in [("0.25", "a"), ("0.3", "b"), ("0.25", "b")] {
        let out = f.run(&[
            "--var",
            &format!("err={err}"),
            "--var",
            &format!("bits={bits}"),
        ]);
        assert_eq!(out.status.code(), Some(0));
    }
    let receipts = f.path().join("receipts");
    let whole = |filters: &[&str], last: Option<usize>| {
        let opts = history::Options {
            filters: filters.iter().map(|s| s.to_string()).collect(),
            last,
            ..history::Options::default()
        };
        history::load(&receipts, "parts", &opts).unwrap()
    };
    let escaped = |s: String| memra_orch::words::escape::terminal(&s, false).into_owned();

    let h = whole(&[], None);
    assert_eq!(h.cells.len(), 93);
    let printed = text(&orch(&f, &["history"]));
    assert_eq!(printed, escaped(render::text(&h)));
    assert!(printed.contains("bits moved"), "{printed}");
    assert_eq!(
        text(&orch(&f, &["history", "--format", "markdown"])),
        escaped(render::markdown(&h))
    );
    assert_eq!(
        text(&orch(&f, &["history", "--format", "json"])),
        render::render(&h, render::HistoryFormat::Json)
    );
    // The JSON is the model: it reads back as the history read whole.
    let back: history::History =
        serde_json::from_str(&text(&orch(&f, &["history", "--format", "json"]))).unwrap();
    assert_eq!(back, h);

    // A window: its first night still compares with the night before it.
    let h = whole(&[], Some(2));
    assert_eq!(
        text(&orch(&f, &["history", "--last", "2"])),
        escaped(render::text(&h))
    );
    let moved = |c: &&history::CellHistory| c.points[0].bits_moved;
    assert_eq!(
        h.cells.iter().filter(moved).count(),
        90,
        "the wide cells' bits moved"
    );

    // A filter selecting cells across both arms.
    let h = whole(&["wide[[]n=7*]", "odd*", "!odd[[]v=last]"], None);
    assert_eq!(h.cells.len(), 10 + 2);
    assert_eq!(
        text(&orch(
            &f,
            &["history", "wide[[]n=7*]", "odd*", "!odd[[]v=last]"]
        )),
        escaped(render::text(&h))
    );

    // The feed gathers every part's steps before it sorts them.
    let h = whole(&[], None);
    let scope = steps::Scope {
        manifest: "parts",
        cells: h.cells.len(),
        runs: h.runs.len(),
    };
    assert_eq!(
        text(&orch(&f, &["history", "--steps"])),
        escaped(steps::render(&scope, &steps::feed(&h), false))
    );

    // A reader that stops early (`| head`) ends the command quietly: exit 0, nothing on
    // stderr.
    let mut child = Command::new(env!("CARGO_BIN_EXE_memra-orch"))
        .args(["history", "--format", "json", "--receipts"])
        .arg(&receipts)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = [0u8; 100];
    child.stdout.take().unwrap().read_exact(&mut first).unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{:?}", out.status);
    assert!(
        out.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
