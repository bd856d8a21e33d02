//! `describe`, the text of `memra-engine info`, on a synthetic checkpoint.

mod common;

use memra_engine::gguf::{GgufFile, describe};

#[test]
fn describes_shape_types_and_metadata() {
    let path = common::synth_model("tiny-untied", "q4_1", 0);
    let text = describe(&GgufFile::open(&path).unwrap());
    let text = text.replace(&path.display().to_string(), "[PATH]");
    insta::assert_snapshot!(text);
}
