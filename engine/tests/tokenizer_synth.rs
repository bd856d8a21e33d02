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
