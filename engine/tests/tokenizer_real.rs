//! The tokenizer on the real SmolLM2 vocabulary (skipped when the model cannot be fetched).
//!
//! Expected ids are derived from the vocabulary itself: a string that is one whole token of
//! the vocabulary must encode to that token, digits must be split one per token by the
//! `smollm` pre-tokenizer, and every text must decode back to itself.

mod common;

use std::sync::OnceLock;

use memra_engine::gguf::GgufFile;
use memra_engine::tokenizer::Tokenizer;

fn tok() -> Option<&'static Tokenizer> {
    static TOK: OnceLock<Option<Tokenizer>> = OnceLock::new();
    TOK.get_or_init(|| {
        let path = common::real_model()?;
        let f = GgufFile::open(path).unwrap();
        Some(Tokenizer::from_gguf(&f).unwrap())
    })
    .as_ref()
}

fn ids(t: &Tokenizer, pieces: &[&str]) -> Vec<u32> {
    pieces
        .iter()
        .map(|p| {
            t.token_id(p)
                .unwrap_or_else(|| panic!("{p:?} is not a token"))
        })
        .collect()
}

#[test]
fn special_tokens_and_ids() {
    let Some(t) = tok() else { return };
    assert_eq!(t.n_vocab(), 49152);
    assert_eq!((t.bos(), t.eos(), t.adds_bos()), (Some(1), Some(2), false));
    assert_eq!(t.token_id("<|im_start|>"), Some(1));
    assert_eq!(t.token_id("<|im_end|>"), Some(2));
    assert!(t.is_special(0) && t.is_special(2) && !t.is_special(1000));
}

#[test]
fn whole_word_tokens_encode_to_themselves() {
    let Some(t) = tok() else { return };
    assert_eq!(
        t.encode("Hello world").unwrap(),
        ids(t, &["Hello", "Ġworld"])
    );
    assert_eq!(t.encode(" the").unwrap(), ids(t, &["Ġthe"]));
    assert_eq!(
        t.encode("The cat sat").unwrap(),
        ids(t, &["The", "Ġcat", "Ġsat"])
    );
}

#[test]
fn digits_are_split_one_per_token() {
    let Some(t) = tok() else { return };
    assert_eq!(
        t.encode("12345").unwrap(),
        ids(t, &["1", "2", "3", "4", "5"])
    );
    // The digit split comes before the GPT-2 pattern, so the space before a number stays a
    // token of its own instead of joining the first digit.
    assert_eq!(
        t.encode("in 2024").unwrap(),
        ids(t, &["in", "Ġ", "2", "0", "2", "4"])
    );
}

#[test]
fn chat_markup_parses_special_tokens_only_when_asked() {
    let Some(t) = tok() else { return };
    let text = "<|im_start|>user\nHi<|im_end|>";
    assert_eq!(
        t.encode(text).unwrap(),
        ids(t, &["<|im_start|>", "user", "Ċ", "Hi", "<|im_end|>"])
    );
    let plain = t.encode_with(text, false, false).unwrap();
    assert!(!plain.contains(&1) && !plain.contains(&2), "{plain:?}");
    assert_eq!(t.decode(&plain).unwrap(), text);
    assert_eq!(
        t.decode_bytes(&t.encode(text).unwrap(), true).unwrap(),
        b"user\nHi"
    );
}

#[test]
fn unicode_emoji_and_whitespace_round_trip() {
    let Some(t) = tok() else { return };
    for text in [
        "",
        " ",
        "   leading and trailing   ",
        "tabs\tand\nnewlines\r\n\n",
        "naïve café — “quotes”",
        "日本語のテキスト",
        "emoji 🦀🚀 and ZWJ 👩‍💻",
        "mixed 3.14159 and 1e-5, x=42;",
        "\u{0}\u{7f}\u{ad}",
    ] {
        let enc = t.encode(text).unwrap();
        assert_eq!(t.decode(&enc).unwrap(), text, "{enc:?}");
    }
}

#[test]
fn a_token_can_end_inside_a_character() {
    let Some(t) = tok() else { return };
    // "🦀" is four bytes and not a token, so it is spelled with byte tokens; their bytes
    // concatenate to the character even though no single token is valid UTF-8.
    let enc = t.encode("🦀").unwrap();
    assert!(enc.len() > 1, "{enc:?}");
    let bytes: Vec<u8> = enc
        .iter()
        .flat_map(|&i| t.token_bytes(i).unwrap())
        .collect();
    assert_eq!(bytes, "🦀".as_bytes());
    assert!(t.token_bytes(49152).is_err());
}
