//! The GGUF reader against the real SmolLM2-135M-Instruct Q4_1 file (skipped when it cannot
//! be fetched).

mod common;

use memra_engine::gguf::{GgmlType, GgufFile, describe};
use memra_engine::hparams::LlamaHparams;

#[test]
fn real_model_header_and_hparams() {
    let Some(path) = common::real_model() else {
        return;
    };
    let f = GgufFile::open(&path).unwrap();
    println!("{}", describe(&f));
    let hp = LlamaHparams::from_gguf(&f).unwrap();
    assert_eq!(
        (
            hp.n_layer,
            hp.n_embd,
            hp.n_ff,
            hp.n_head,
            hp.n_head_kv,
            hp.head_dim,
            hp.n_vocab
        ),
        (30, 576, 1536, 9, 3, 64, 49152)
    );
    assert_eq!(hp.rope_base, 100000.0);
    assert_eq!(hp.rms_eps, 1e-5);
    assert!(hp.tied_output);
    assert_eq!(
        f.require_tensor("token_embd.weight").unwrap().ty,
        GgmlType::Q8_0
    );
}
