//! Loading llama GGUF files into the model's per-layer structs: the real SmolLM2 file (its
//! shape and tensor types as DESIGN §1 states them) and synthesized ones of every weight type.

mod common;

use memra_engine::model::{LlamaModel, WeightData};

#[test]
fn real_model_loads_with_its_documented_shape_and_types() {
    let Some(path) = common::real_model() else {
        return;
    };
    let m = LlamaModel::open(&path).unwrap();
    let c = &m.config;
    assert_eq!(
        (
            c.n_layer,
            c.n_embd,
            c.n_ff,
            c.n_head,
            c.n_head_kv,
            c.head_dim,
            c.n_vocab
        ),
        (30, 576, 1536, 9, 3, 64, 49152)
    );
    assert_eq!(c.rope_base, 100_000.0);
    assert!(m.output.is_none(), "SmolLM2's head is tied to token_embd");
    assert!(matches!(m.token_embd.data, WeightData::Q8_0(_)));
    assert!(matches!(m.head().data, WeightData::Q8_0(_)));
    for l in &m.layers {
        for w in [&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down] {
            assert!(
                matches!(w.data, WeightData::Q4_1(_)),
                "{} is {}",
                w.name,
                w.data.type_name()
            );
        }
    }
    assert_eq!((m.layers[0].wk.rows, m.layers[0].wk.cols), (192, 576));
    assert_eq!(
        (m.layers[7].w_down.rows, m.layers[7].w_down.cols),
        (576, 1536)
    );
}

#[test]
fn synthesized_models_load_in_every_weight_type() {
    let dir = tempfile::tempdir().unwrap();
    for (quant, ty) in [
        ("q4_0", "q4_0"),
        ("q4_1", "q4_1"),
        ("q8_0", "q8_0"),
        ("f16", "f16"),
        ("bf16", "bf16"),
        ("f32", "f32"),
    ] {
        for preset in ["tiny", "tiny-untied"] {
            let path = dir.path().join(format!("{preset}-{quant}.gguf"));
            memra_engine::synth::write_preset(preset, quant, 1, &path).unwrap();
            let m = LlamaModel::open(&path).unwrap();
            assert_eq!(m.layers.len(), 4);
            assert_eq!(m.layers[2].wq.data.type_name(), ty, "{preset} {quant}");
            assert_eq!(m.output.is_some(), preset == "tiny-untied");
            m.validate().unwrap();
        }
    }
}

#[test]
fn a_file_that_is_not_a_model_is_an_error_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("junk.gguf");
    std::fs::write(&path, b"GGUF but not really").unwrap();
    let err = LlamaModel::open(&path).unwrap_err().to_string();
    assert!(err.contains("junk.gguf"), "{err}");
}
