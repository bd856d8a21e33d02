//! memra's tokenizer against an independent Python implementation of byte-level BPE
//! (`common/bpe_reference.py`, GPT-2's published algorithm with the `smollm` digit split) on
//! the real SmolLM2 vocabulary and on a synthetic one. Skipped when the model, Python or its
//! packages are missing.

mod common;

use std::path::Path;

use memra_engine::gguf::GgufFile;
use memra_engine::tokenizer::Tokenizer;

const TEXTS: &[&str] = &[
    "Hello world",
    "The quick brown fox jumps over the lazy dog.",
    "in 2024, 12345 apples cost $3.50 (or 3,50 €)",
    "don't I'll we've they're it's she'd you'm",
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>",
    "日本語のテキストと中文",
    "emoji 🦀🚀 and ZWJ 👩‍💻 flags 🇫🇷",
    "  leading, trailing and   inner   spaces  ",
    "tabs\tand\nnewlines\r\n\n\nend",
    "fn main() { println!(\"{}\", x[0] + 1); } // code",
    "naïve café résumé — “quotes” ‘single’ …",
    "UPPER lower MiXeD CamelCase snake_case kebab-case",
    "½ ² ٣ ⅷ numbers in other scripts",
    "<|endoftext|><|endoftext|>",
    "a",
    "",
];

fn check(model: &Path) {
    let tok = Tokenizer::from_gguf(&GgufFile::open(model).unwrap()).unwrap();
    let input = serde_json::to_string(TEXTS).unwrap();
    let Some(out) = common::python_check("bpe_reference.py", &[model], &input) else {
        return;
    };
    let want: Vec<Vec<u32>> = serde_json::from_str(&out).unwrap();
    assert_eq!(want.len(), TEXTS.len());
    for (text, want) in TEXTS.iter().zip(want) {
        assert_eq!(tok.encode(text).unwrap(), want, "{text:?}");
    }
}

#[test]
fn matches_reference_bpe_on_the_real_vocabulary() {
    if let Some(model) = common::real_model() {
        check(&model);
    }
}

#[test]
fn matches_reference_bpe_on_a_synthetic_vocabulary() {
    check(&common::synth_model("tiny", "q8_0", 0));
}
