//! One function that drives every reader of an untrusted GGUF image, shared by the cargo-fuzz
//! target (`fuzz/fuzz_targets/gguf_open.rs`) and the regression test that replays the
//! fuzzer's findings (`engine/tests/gguf_fixtures.rs`), so both run the same code.
//!
//! This module owns no parsing of its own; it only calls the public API.

use super::{GgufFile, describe};
use crate::hparams::LlamaHparams;
use crate::tokenizer::Tokenizer;

/// Tensors above this many bytes are not dequantized, so a fuzzed header cannot make one
/// input take seconds (the bounds were already checked against the image size).
const MAX_DEQUANT_BYTES: u64 = 1 << 22;

/// What `exercise` got through, for tests that want to see the path taken.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Outcome {
    pub opened: bool,
    pub hparams: bool,
    pub tokenizer: bool,
    pub tensors_read: usize,
}

/// Parses `data` as a GGUF image and, when that succeeds, reads everything a loader would:
/// hyper-parameters, the description, every tensor's view and dequantization, the tokenizer
/// (with an encode/decode round trip). Errors are fine; a panic is the bug being hunted.
pub fn exercise(data: &[u8]) -> Outcome {
    let mut out = Outcome::default();
    let Ok(file) = GgufFile::from_bytes("fuzz.gguf", data.to_vec()) else {
        return out;
    };
    out.opened = true;
    out.hparams = LlamaHparams::from_gguf(&file).is_ok();
    let _ = describe(&file);
    for t in file.tensors() {
        let _ = file.weight_view(&t.name);
        if t.n_bytes <= MAX_DEQUANT_BYTES && file.dequantize(&t.name).is_ok() {
            out.tensors_read += 1;
        }
    }
    if let Ok(tok) = Tokenizer::from_gguf(&file) {
        out.tokenizer = true;
        if let Ok(ids) = tok.encode("fuzz 123 <|im_end|> ünï 🦀") {
            let _ = tok.decode(&ids);
        }
        let _ = tok.decode(&[0, u32::MAX]);
    }
    out
}
