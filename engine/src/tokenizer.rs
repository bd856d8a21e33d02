//! Byte-level BPE tokenization (GPT-2 style) built from a GGUF file's `tokenizer.ggml.*`
//! metadata: encoding through the `tokenizers` crate, decoding to exact bytes.
//!
//! This module owns the mapping from GGUF tokenizer metadata to a working tokenizer, for the
//! `gpt2` model with the `smollm` (single digits first, then the GPT-2 pattern), `gpt2` and
//! `default` pre-tokenizers. Chat templates and sampling are not here.

use std::collections::HashMap;

use thiserror::Error;
use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::models::bpe::{BPE, Vocab};
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::{AddedToken, Tokenizer as HfTokenizer};

use crate::gguf::{GgufError, GgufFile};

/// The `tokenizer.ggml.pre` values memra implements.
pub const SUPPORTED_PRE: [&str; 3] = ["smollm", "gpt2", "default"];

/// GGUF token types (`enum llama_token_type`) that mark special tokens.
const TOKEN_TYPE_CONTROL: i64 = 3;
const TOKEN_TYPE_USER_DEFINED: i64 = 4;

/// What can go wrong building or running the tokenizer.
#[derive(Debug, Error)]
pub enum TokenizerError {
    #[error(transparent)]
    Gguf(#[from] GgufError),
    #[error("{file}: {problem}")]
    Unsupported { file: String, problem: String },
    #[error("{file}: tokenizer metadata is inconsistent: {problem}")]
    Inconsistent { file: String, problem: String },
    #[error("cannot encode the text: {0}")]
    Encode(String),
    #[error("token id {id} is outside the vocabulary of {n_vocab} tokens")]
    BadId { id: u32, n_vocab: usize },
}

/// A byte-level BPE tokenizer with the special tokens of its model.
pub struct Tokenizer {
    inner: HfTokenizer,
    /// The same tokenizer with special-token matching off, for `parse_special = false`.
    plain: HfTokenizer,
    /// Token texts by id, in the byte-level alphabet.
    tokens: Vec<String>,
    special: Vec<bool>,
    unicode_to_byte: HashMap<char, u8>,
    bos: Option<u32>,
    eos: Option<u32>,
    add_bos: bool,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("n_vocab", &self.tokens.len())
            .field("bos", &self.bos)
            .field("eos", &self.eos)
            .finish()
    }
}

/// GPT-2's `bytes_to_unicode`: the printable character that stands for each byte in a
/// byte-level BPE vocabulary (printable Latin-1 bytes stand for themselves, the others are
/// moved to U+0100 and up in byte order).
pub fn byte_to_unicode() -> [char; 256] {
    let mut out = ['\0'; 256];
    let mut n = 0u32;
    for b in 0..=255u8 {
        let printable = matches!(b, b'!'..=b'~' | 0xa1..=0xac | 0xae..=0xff);
        out[b as usize] = if printable {
            char::from(b)
        } else {
            n += 1;
            char::from_u32(255 + n).expect("U+0100..U+0143 are valid chars")
        };
    }
    out
}

impl Tokenizer {
    /// Builds the tokenizer described by `file`'s `tokenizer.ggml.*` metadata.
    pub fn from_gguf(file: &GgufFile) -> Result<Tokenizer, TokenizerError> {
        let name = file.path().display().to_string();
        let unsupported = |problem: String| TokenizerError::Unsupported {
            file: name.clone(),
            problem,
        };
        let inconsistent = |problem: String| TokenizerError::Inconsistent {
            file: name.clone(),
            problem,
        };
        let model = file.get_str("tokenizer.ggml.model")?;
        if model != "gpt2" {
            return Err(unsupported(format!(
                "tokenizer.ggml.model is {model:?}; memra implements the byte-level BPE model \"gpt2\" only"
            )));
        }
        let pre = match file.get("tokenizer.ggml.pre") {
            Some(_) => file.get_str("tokenizer.ggml.pre")?,
            None => "default",
        };
        let pre_tokenizer = match pre {
            "smollm" => PreTokenizerWrapper::Sequence(Sequence::new(vec![
                PreTokenizerWrapper::Digits(Digits::new(true)),
                PreTokenizerWrapper::ByteLevel(ByteLevel::new(false, true, true)),
            ])),
            "gpt2" | "default" => PreTokenizerWrapper::ByteLevel(ByteLevel::new(false, true, true)),
            other => {
                return Err(unsupported(format!(
                    "tokenizer.ggml.pre is {other:?}; supported pre-tokenizers: {}",
                    SUPPORTED_PRE.join(", ")
                )));
            }
        };
        let tokens: Vec<String> = file
            .get_str_array("tokenizer.ggml.tokens")?
            .into_iter()
            .map(String::from)
            .collect();
        if tokens.is_empty() {
            return Err(inconsistent("tokenizer.ggml.tokens is empty".into()));
        }
        let types = file.get_int_array_opt("tokenizer.ggml.token_type")?;
        if let Some(t) = &types
            && t.len() != tokens.len()
        {
            return Err(inconsistent(format!(
                "tokenizer.ggml.token_type has {} entries but tokenizer.ggml.tokens has {}",
                t.len(),
                tokens.len()
            )));
        }
        let special: Vec<bool> = match &types {
            Some(t) => t
                .iter()
                .map(|&ty| ty == TOKEN_TYPE_CONTROL || ty == TOKEN_TYPE_USER_DEFINED)
                .collect(),
            None => vec![false; tokens.len()],
        };
        let merges: Vec<(String, String)> = file
            .get_str_array("tokenizer.ggml.merges")?
            .into_iter()
            .enumerate()
            .map(|(i, m)| {
                m.split_once(' ')
                    .map(|(a, b)| (a.to_string(), b.to_string()))
                    .ok_or_else(|| {
                        inconsistent(format!(
                            "merge #{i} {m:?} is not two tokens separated by a space"
                        ))
                    })
            })
            .collect::<Result<_, _>>()?;
        let vocab: Vocab = tokens
            .iter()
            .enumerate()
            .map(|(i, t)| (t.clone(), i as u32))
            .collect();
        let bpe = BPE::builder()
            .vocab_and_merges(vocab, merges)
            .build()
            .map_err(|e| {
                inconsistent(format!(
                    "the BPE vocabulary and merges do not fit together: {e}"
                ))
            })?;
        let mut inner = HfTokenizer::new(bpe);
        inner.with_pre_tokenizer(Some(pre_tokenizer));
        inner.with_decoder(Some(ByteLevelDecoder::default()));
        let added: Vec<AddedToken> = tokens
            .iter()
            .zip(&special)
            .filter(|(_, s)| **s)
            .map(|(t, _)| AddedToken::from(t.clone(), true))
            .collect();
        inner.add_special_tokens(&added);
        // With special-token matching off, the added-vocabulary pass leaves the text whole
        // and the BPE model encodes `<|im_end|>` like any other characters.
        let mut plain = inner.clone();
        plain.set_encode_special_tokens(true);

        let id = |key: &str| -> Result<Option<u32>, TokenizerError> {
            match file.get_u32_opt(key)? {
                Some(v) if v as usize >= tokens.len() => Err(inconsistent(format!(
                    "{key} = {v} is outside the vocabulary of {} tokens",
                    tokens.len()
                ))),
                v => Ok(v),
            }
        };
        let bos = id("tokenizer.ggml.bos_token_id")?;
        let eos = id("tokenizer.ggml.eos_token_id")?;
        let add_bos = file
            .get_bool_opt("tokenizer.ggml.add_bos_token")?
            .unwrap_or(false)
            && bos.is_some();
        let unicode_to_byte = byte_to_unicode()
            .iter()
            .enumerate()
            .map(|(b, &c)| (c, b as u8))
            .collect();
        Ok(Tokenizer {
            inner,
            plain,
            tokens,
            special,
            unicode_to_byte,
            bos,
            eos,
            add_bos,
        })
    }

    /// Number of tokens in the vocabulary.
    pub fn n_vocab(&self) -> usize {
        self.tokens.len()
    }

    /// Beginning-of-sequence token, if the model has one.
    pub fn bos(&self) -> Option<u32> {
        self.bos
    }

    /// End-of-sequence token, if the model has one.
    pub fn eos(&self) -> Option<u32> {
        self.eos
    }

    /// Whether the model asks for a BOS token before the prompt (`tokenizer.ggml.add_bos_token`).
    pub fn adds_bos(&self) -> bool {
        self.add_bos
    }

    /// Whether `id` is a special (control) token.
    pub fn is_special(&self, id: u32) -> bool {
        self.special.get(id as usize).copied().unwrap_or(false)
    }

    /// The id of the token whose text is exactly `text` (in the byte-level alphabet for
    /// ordinary tokens, e.g. `Ġthe`; verbatim for special tokens such as `<|im_end|>`).
    pub fn token_id(&self, text: &str) -> Option<u32> {
        self.inner.token_to_id(text)
    }

    /// The stored text of token `id`.
    pub fn token_text(&self, id: u32) -> Option<&str> {
        self.tokens.get(id as usize).map(String::as_str)
    }

    /// Encodes `text` as the model expects a prompt: special-token texts such as
    /// `<|im_start|>` become their tokens, and BOS is prepended when the model asks for it.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, TokenizerError> {
        self.encode_with(text, self.add_bos, true)
    }

    /// Encodes `text`, choosing whether to prepend BOS and whether special-token texts in it
    /// are parsed as special tokens (`true`) or encoded as ordinary text (`false`, for
    /// untrusted input).
    pub fn encode_with(
        &self,
        text: &str,
        add_bos: bool,
        parse_special: bool,
    ) -> Result<Vec<u32>, TokenizerError> {
        let mut ids = Vec::new();
        if add_bos && let Some(b) = self.bos {
            ids.push(b);
        }
        let tok = if parse_special {
            &self.inner
        } else {
            &self.plain
        };
        let enc = tok
            .encode_fast(text, false)
            .map_err(|e| TokenizerError::Encode(e.to_string()))?;
        ids.extend_from_slice(enc.get_ids());
        Ok(ids)
    }

    /// The bytes token `id` stands for: the UTF-8 of a special token's text, or the bytes
    /// behind an ordinary token's byte-level characters. A token can end inside a multi-byte
    /// character, so streaming output should concatenate bytes before converting to text.
    pub fn token_bytes(&self, id: u32) -> Result<Vec<u8>, TokenizerError> {
        let text = self.token_text(id).ok_or(TokenizerError::BadId {
            id,
            n_vocab: self.tokens.len(),
        })?;
        if self.is_special(id) {
            return Ok(text.as_bytes().to_vec());
        }
        // A character outside the byte alphabet cannot come from a byte-level vocabulary; it
        // is kept as its UTF-8 so nothing is silently dropped.
        let mut out = Vec::with_capacity(text.len());
        for c in text.chars() {
            match self.unicode_to_byte.get(&c) {
                Some(&b) => out.push(b),
                None => out.extend_from_slice(c.encode_utf8(&mut [0; 4]).as_bytes()),
            }
        }
        Ok(out)
    }

    /// Decodes `ids` to bytes, optionally leaving out special tokens.
    pub fn decode_bytes(&self, ids: &[u32], skip_special: bool) -> Result<Vec<u8>, TokenizerError> {
        let mut out = Vec::new();
        for &id in ids {
            if skip_special && self.is_special(id) {
                continue;
            }
            out.extend(self.token_bytes(id)?);
        }
        Ok(out)
    }

    /// Decodes `ids` to text (invalid UTF-8, e.g. a sequence cut inside a character, becomes
    /// U+FFFD), keeping special tokens' text.
    pub fn decode(&self, ids: &[u32]) -> Result<String, TokenizerError> {
        Ok(String::from_utf8_lossy(&self.decode_bytes(ids, false)?).into_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_alphabet_matches_gpt2() {
        let m = byte_to_unicode();
        assert_eq!(m[b' ' as usize], 'Ġ');
        assert_eq!(m[b'\n' as usize], 'Ċ');
        assert_eq!(m[b'\t' as usize], 'ĉ');
        assert_eq!(m[b'a' as usize], 'a');
        assert_eq!(m[0xad], 'Ń');
        let distinct: std::collections::HashSet<char> = m.iter().copied().collect();
        assert_eq!(distinct.len(), 256);
    }
}
