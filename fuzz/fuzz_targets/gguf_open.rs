//! Fuzzes everything that reads an untrusted GGUF image: the header parser, the llama
//! hyper-parameters, the description, host dequantization, weight views and the tokenizer
//! loader. Any panic, overflow or out-of-bounds access is a bug; errors are the expected
//! outcome for almost every input.
#![no_main]

use libfuzzer_sys::fuzz_target;
use memra_engine::gguf::fuzz::exercise;

fuzz_target!(|data: &[u8]| {
    exercise(data);
});
