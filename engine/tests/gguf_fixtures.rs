//! Replays every file in `tests/fixtures/gguf/` (fuzzer seeds and any input the fuzzer ever
//! found crashing) through the same reader path the fuzz target drives.

use std::path::Path;

use memra_engine::gguf::fuzz::exercise;

#[test]
fn fixtures_never_panic() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/gguf");
    let mut names: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    names.sort();
    assert!(!names.is_empty(), "{} holds no fixtures", dir.display());
    for path in names {
        let data = std::fs::read(&path).unwrap();
        // A panic inside fails the test and names nothing, so say which file runs.
        eprintln!("replaying {}", path.display());
        let out = exercise(&data);
        if path.file_name().unwrap() == "micro-q4_1.gguf" {
            // The seed is a complete model: the fuzzer starts from inputs that reach every
            // reader, not just the header parser.
            assert!(out.opened && out.hparams && out.tokenizer, "{out:?}");
            assert_eq!(out.tensors_read, 11);
        }
    }
}
