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

/// Every tensor of the real file, read and dequantized by memra, matches what llama.cpp's
/// gguf-py reads and dequantizes: type, shape, absolute offset and the f32 values bit for bit.
#[test]
fn real_model_tensors_match_gguf_py() {
    use sha2::{Digest, Sha256};
    let Some(path) = common::real_model() else {
        return;
    };
    let f = GgufFile::open(&path).unwrap();
    let names: Vec<&str> = f.tensors().iter().map(|t| t.name.as_str()).collect();
    let mut args = vec![std::path::Path::new("--dequant"), path.as_path()];
    args.extend(names.iter().map(std::path::Path::new));
    let Some(out) = common::python_check("gguf_py_check.py", &args, "") else {
        return;
    };
    let want: serde_json::Value = serde_json::from_str(&out).unwrap();
    for t in f.tensors() {
        let w = &want[&t.name];
        assert_eq!(
            w["type"].as_str().unwrap(),
            t.ty.name().to_uppercase(),
            "{}",
            t.name
        );
        assert_eq!(w["shape"], serde_json::json!(t.shape), "{}", t.name);
        assert_eq!(w["offset"].as_u64().unwrap(), t.start, "{}", t.name);
        let values = f.dequantize(&t.name).unwrap();
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        let sha: String = Sha256::digest(&bytes)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        assert_eq!(w["sha256"].as_str().unwrap(), sha, "{}", t.name);
    }
}
