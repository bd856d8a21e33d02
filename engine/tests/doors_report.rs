//! The doors a backend reports are the paths that ran, not the pins as given: a refused
//! tier shows as refused, `MEMRA_BACKEND=cuda` is a clear error in this build, and the report
//! is the flat `{"doors":…}` row of DESIGN §5.

use std::collections::HashMap;

use memra_engine::backend::{EngineError, open_backend};
use memra_engine::doors::{BackendChoice, Doors};
use memra_engine::model::LlamaModel;

fn tiny(quant: &str) -> LlamaModel {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tiny.gguf");
    memra_engine::synth::write_preset("tiny", quant, 41, &path).unwrap();
    LlamaModel::open(&path).unwrap()
}

fn pins(pairs: &[(&str, &str)]) -> Doors {
    let map: HashMap<String, String> = pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    Doors::from_lookup(|k| map.get(k).cloned()).unwrap()
}

#[test]
fn defaults_report_the_fused_mmvq_split_k_paths() {
    let be = open_backend(tiny("q4_1"), &Doors::default()).unwrap();
    let row = be.doors_report().to_row();
    assert_eq!(
        row,
        serde_json::json!({"doors": {
            "backend": "cpu", "matvec": "mmvq", "norm": "fused", "attention": "split-k",
            "b1fast": false, "kv": "f32", "pp_stages": 1, "pp_devices": "cpu", "pp_splits": "0",
            "gate_seed": 0, "canary": false, "mma": true, "pdl": true,
            "mma_resident": "auto", "small_batch": "auto", "claim_sm": true, "prologues": true,
            "prompt_tile": true
        }})
    );
}

#[test]
fn a_performance_switch_shows_in_the_doors_row() {
    let plain = open_backend(tiny("q4_1"), &Doors::default()).unwrap();
    let no_pdl = open_backend(tiny("q4_1"), &pins(&[("MEMRA_PDL", "0")])).unwrap();
    let (a, b) = (
        plain.doors_report().to_row(),
        no_pdl.doors_report().to_row(),
    );
    assert_ne!(a, b, "MEMRA_PDL=0 must be told apart by the doors row");
    assert_eq!(b["doors"]["pdl"], false);
    let resident = open_backend(tiny("q4_1"), &pins(&[("MEMRA_MMA_RESIDENT", "0")])).unwrap();
    assert_eq!(
        resident.doors_report().to_row()["doors"]["mma_resident"],
        "0"
    );
}

#[test]
fn the_fused_tier_is_refused_under_dp4a_and_the_report_says_so() {
    let be = open_backend(tiny("q4_1"), &pins(&[("MEMRA_MMVQ", "0")])).unwrap();
    let r = be.doors_report();
    assert_eq!((r.matvec, r.norm), ("dp4a", "separate"));

    let be = open_backend(
        tiny("q4_1"),
        &pins(&[
            ("MEMRA_NO_FUSE_NORMQ", "1"),
            ("MEMRA_FA3", "0"),
            ("MEMRA_SERVE_B1FAST", "1"),
            ("MEMRA_PP_STAGES", "2"),
            ("MEMRA_GATE_SEED", "7"),
        ]),
    )
    .unwrap();
    let r = be.doors_report();
    assert_eq!(
        (r.matvec, r.norm, r.attention),
        ("mmvq", "separate", "naive")
    );
    assert!(r.b1fast);
    assert_eq!(
        (r.pp_stages, r.pp_splits.as_str(), r.gate_seed),
        (2, "0,2", 7)
    );
}

#[test]
fn float_models_report_the_float_matvec() {
    let be = open_backend(tiny("f16"), &Doors::default()).unwrap();
    assert_eq!(be.doors_report().matvec, "float");
}

#[test]
fn cuda_without_a_gpu_is_a_clear_error_and_auto_always_opens() {
    let doors = pins(&[("MEMRA_BACKEND", "cuda")]);
    assert_eq!(doors.backend, BackendChoice::Cuda);
    // Where CUDA cannot start (no GPU or no CUDA libraries, as in CI) the error names the
    // pin and the way out; on a GPU machine the CUDA backend opens.
    match open_backend(tiny("q4_1"), &doors) {
        Ok(be) => assert_eq!(be.doors_report().backend, "cuda"),
        Err(err) => {
            assert!(matches!(err, EngineError::Unavailable(_)), "{err:?}");
            let msg = err.to_string();
            assert!(msg.contains("MEMRA_BACKEND=cuda"), "{msg}");
            assert!(msg.contains("MEMRA_BACKEND=cpu"), "{msg}");
        }
    }
    let be = open_backend(tiny("q4_1"), &pins(&[("MEMRA_BACKEND", "auto")])).unwrap();
    assert!(["cpu", "cuda"].contains(&be.doors_report().backend));
}

#[test]
fn a_split_that_does_not_fit_the_model_is_refused_naming_the_pin() {
    let err = open_backend(tiny("q4_1"), &pins(&[("MEMRA_PP_STAGES", "9")]))
        .err()
        .unwrap();
    assert!(err.to_string().contains("MEMRA_PP_STAGES=9"), "{err}");
}
