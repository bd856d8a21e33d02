//! The tokenizer loads the synthetic checkpoints' vocabulary and uses its merges.

mod common;

use memra_engine::gguf::GgufFile;
use memra_engine::synth::synth_vocab;
use memra_engine::tokenizer::Tokenizer;

#[test]
fn synthetic_vocabulary_encodes_with_its_merges_and_round_trips() {
    let f = GgufFile::open(common::synth_model("tiny", "q8_0", 0)).unwrap();
    let t = Tokenizer::from_gguf(&f).unwrap();
    assert_eq!(t.n_vocab(), 512);
    // The first merges extend "Ġ" by the most frequent letters, so " e" and " t" are single
    // tokens while a rare pair is spelled with byte tokens.
    let v = synth_vocab(512);
    let id = |s: &str| v.tokens.iter().position(|x| x == s).unwrap() as u32;
    assert_eq!(t.encode(" e").unwrap(), vec![id("Ġe")]);
    assert_eq!(t.encode(" t").unwrap(), vec![id("Ġt")]);
    assert_eq!(t.encode("Q").unwrap(), vec![id("Q")]);
    assert_eq!(t.encode("12").unwrap(), vec![id("1"), id("2")]);
    assert_eq!(t.encode("<|im_end|>").unwrap(), vec![2]);
    for text in ["the quick brown fox", "Ünïcödé 🦀\n\t", ""] {
        assert_eq!(t.decode(&t.encode(text).unwrap()).unwrap(), text);
    }
}

#[test]
fn unsupported_or_inconsistent_metadata_is_a_clear_error() {
    use memra_engine::gguf::MetaValue;
    let src = common::synth_model("tiny", "q8_0", 0);
    let err = |key: &str, value: Option<MetaValue>| {
        Tokenizer::from_gguf(&common::edited(&src, key, value))
            .unwrap_err()
            .to_string()
    };
    let report = [
        err("tokenizer.ggml.model", Some("llama".into())),
        err("tokenizer.ggml.pre", Some("llama-bpe".into())),
        err("tokenizer.ggml.tokens", None),
        err(
            "tokenizer.ggml.merges",
            Some(MetaValue::string_array(["Ġ e", "nospace"])),
        ),
        err(
            "tokenizer.ggml.merges",
            Some(MetaValue::string_array(["Ġ zzz"])),
        ),
        err(
            "tokenizer.ggml.token_type",
            Some(MetaValue::i32_array([3, 3])),
        ),
        err("tokenizer.ggml.eos_token_id", Some(MetaValue::U32(512))),
    ]
    .join("\n");
    insta::assert_snapshot!(report);
}

#[test]
fn gpt2_and_default_pre_tokenizers_load_and_round_trip() {
    let src = common::synth_model("tiny", "q8_0", 0);
    for pre in ["gpt2", "default"] {
        let f = common::edited(&src, "tokenizer.ggml.pre", Some(pre.into()));
        let t = Tokenizer::from_gguf(&f).unwrap();
        let text = "the 2024 <|im_end|> ünï";
        let ids = t.encode(text).unwrap();
        assert!(ids.contains(&2), "{pre}: special token parsed");
        assert_eq!(t.decode(&ids).unwrap(), text, "{pre}");
    }
}
