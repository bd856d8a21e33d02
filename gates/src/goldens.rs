//! Loader goldens: the sha256 of every tensor of the reference gate's synthesized
//! checkpoints as the shared loader (`LlamaModel::from_gguf`, which the engine and the oracle
//! both read) put it into the model, and of the model's shape, minted once into a banked TSV
//! file (`engine/goldens/loader.tsv`) and checked on every later run, so a change in the
//! loader, the dequantizers or the synthesizer shows up as a named tensor whose bits moved.
//! Digesting the loaded model rather than the file is the point: a tensor loaded into the
//! wrong slot, or a hyperparameter read wrong, moves the engine and the oracle alike, so only
//! a golden of what the loader produced can see it.
//!
//! It owns the file format and the comparison. Which checkpoints are digested is the
//! reference gate's choice.

use std::collections::BTreeMap;
use std::path::Path;

use sha2::{Digest, Sha256};

use crate::output::GateError;
use memra_engine::gguf::GgufFile;
use memra_engine::hparams::{OUTPUT, OUTPUT_NORM, TOKEN_EMBD, layer_tensor};
use memra_engine::model::LlamaModel;

/// Format version written in the file's first line.
pub const FORMAT: &str = "# memra loader goldens v1";

/// (arm, tensor name) → hex sha256 of the tensor's f32 values, little-endian, storage order.
pub type Goldens = BTreeMap<(String, String), String>;

/// Digests every tensor of the GGUF file at `path` under `arm`, straight from the file (the
/// loader's view is [`digest_model`]; the two agree on every tensor when the loader is
/// right).
pub fn digest_file(arm: &str, path: &Path) -> Result<Goldens, GateError> {
    let file = GgufFile::open(path)
        .map_err(|e| GateError::new(format!("{}: cannot read back: {e}", path.display())))?;
    let mut out = Goldens::new();
    for info in file.tensors() {
        let values = file
            .dequantize(&info.name)
            .map_err(|e| GateError::new(format!("{}: {e}", path.display())))?;
        let mut h = Sha256::new();
        for v in &values {
            h.update(v.to_le_bytes());
        }
        out.insert((arm.to_string(), info.name.clone()), hex(&h.finalize()));
    }
    Ok(out)
}

/// Digests what the loader produced for `model` under `arm`: every weight slot under the
/// GGUF name of the slot (not the name the weight carries, so a tensor in the wrong slot
/// moves that slot's digest), as f32 values in storage order, and the shape as `(config)`.
pub fn digest_model(arm: &str, model: &LlamaModel) -> Goldens {
    let mut out = Goldens::new();
    let mut put = |name: String, values: &[f32]| {
        let mut h = Sha256::new();
        for v in values {
            h.update(v.to_le_bytes());
        }
        out.insert((arm.to_string(), name), hex(&h.finalize()));
    };
    put(TOKEN_EMBD.to_string(), &model.token_embd.to_f32());
    put(OUTPUT_NORM.to_string(), &model.output_norm);
    if let Some(o) = &model.output {
        put(OUTPUT.to_string(), &o.to_f32());
    }
    for (l, w) in model.layers.iter().enumerate() {
        put(layer_tensor(l, "attn_norm"), &w.attn_norm);
        put(layer_tensor(l, "ffn_norm"), &w.ffn_norm);
        for (role, m) in [
            ("attn_q", &w.wq),
            ("attn_k", &w.wk),
            ("attn_v", &w.wv),
            ("attn_output", &w.wo),
            ("ffn_gate", &w.w_gate),
            ("ffn_up", &w.w_up),
            ("ffn_down", &w.w_down),
        ] {
            put(layer_tensor(l, role), &m.to_f32());
        }
    }
    let c = &model.config;
    let shape = format!(
        "n_layer={} n_embd={} n_ff={} n_head={} n_head_kv={} head_dim={} n_vocab={} n_ctx={} \
         rope_base_bits={:08x} rms_eps_bits={:08x} tied={}",
        c.n_layer,
        c.n_embd,
        c.n_ff,
        c.n_head,
        c.n_head_kv,
        c.head_dim,
        c.n_vocab,
        c.n_ctx,
        c.rope_base.to_bits(),
        c.rms_eps.to_bits(),
        model.output.is_none()
    );
    out.insert(
        (arm.to_string(), "(config)".to_string()),
        hex(&Sha256::digest(shape.as_bytes())),
    );
    out
}

/// Lower-case hex of a digest.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Writes the goldens file (atomically), creating its folder. `minted_by` names the build
/// that minted it (a comment line the reader skips), so a file can be traced to its binary.
pub fn write(path: &Path, goldens: &Goldens, minted_by: &str) -> Result<(), GateError> {
    let fail = |e: std::io::Error| {
        GateError::new(format!(
            "{}: cannot write the goldens: {e}; pass --goldens with a writable path",
            path.display()
        ))
    };
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(fail)?;
    }
    let mut text = format!("{FORMAT}\n# minted by {minted_by}\n# arm\ttensor\tsha256(f32 le)\n");
    for ((arm, tensor), digest) in goldens {
        text.push_str(&format!("{arm}\t{tensor}\t{digest}\n"));
    }
    let tmp = path.with_extension("tsv.tmp");
    std::fs::write(&tmp, text).map_err(fail)?;
    std::fs::rename(&tmp, path).map_err(fail)
}

/// Reads a goldens file; errors name the file and line.
pub fn read(path: &Path) -> Result<Goldens, GateError> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        GateError::new(format!(
            "{}: cannot read the loader goldens: {e}; mint them once with --write-goldens (or \
             pass --goldens FILE; the default is relative to the working directory)",
            path.display()
        ))
    })?;
    let mut lines = text.lines();
    if lines.next() != Some(FORMAT) {
        return Err(GateError::new(format!(
            "{}:1: not a loader goldens file (expected the line {FORMAT:?}); re-mint it with \
             --write-goldens",
            path.display()
        )));
    }
    let mut out = Goldens::new();
    for (i, line) in lines.enumerate() {
        if line.starts_with('#') || line.trim().is_empty() {
            continue;
        }
        let f: Vec<&str> = line.split('\t').collect();
        if f.len() != 3 || f[2].len() != 64 || !f[2].bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(GateError::new(format!(
                "{}:{}: expected `arm<TAB>tensor<TAB>64 hex digits`, got {line:?}",
                path.display(),
                i + 2
            )));
        }
        out.insert((f[0].to_string(), f[1].to_string()), f[2].to_string());
    }
    Ok(out)
}

/// The differences between banked and current goldens, one line each (empty = identical).
pub fn diff(banked: &Goldens, current: &Goldens) -> Vec<String> {
    let mut out = Vec::new();
    for (key, want) in banked {
        match current.get(key) {
            None => out.push(format!("{}/{}: banked but not produced", key.0, key.1)),
            Some(got) if got != want => out.push(format!(
                "{}/{}: sha256 {} != banked {}",
                key.0,
                key.1,
                &got[..12],
                &want[..12]
            )),
            Some(_) => {}
        }
    }
    for key in current.keys().filter(|k| !banked.contains_key(*k)) {
        out.push(format!("{}/{}: produced but not banked", key.0, key.1));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The loader's view agrees with the file on every tensor, and a tensor loaded into
    /// the wrong slot moves the digests of exactly the slots it confused, though every
    /// tensor's own bits (and its name) are intact.
    #[test]
    fn the_loaded_model_is_digested_by_slot() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.gguf");
        memra_engine::synth::write_preset("tiny", "q4_1", 7, &path).unwrap();
        let model = LlamaModel::open(&path).unwrap();
        let loaded = digest_model("a", &model);
        let file = digest_file("a", &path).unwrap();
        for (k, v) in &file {
            assert_eq!(loaded.get(k), Some(v), "{k:?}");
        }
        assert_eq!(loaded.len(), file.len() + 1, "every tensor and the config");
        let mut swapped = model.clone();
        let l = &mut swapped.layers[1];
        std::mem::swap(&mut l.wk, &mut l.wv);
        let d = diff(&loaded, &digest_model("a", &swapped));
        assert_eq!(d.len(), 2, "{d:?}");
        assert!(d[0].starts_with("a/blk.1.attn_k.weight: sha256"), "{d:?}");
        assert!(d[1].starts_with("a/blk.1.attn_v.weight: sha256"), "{d:?}");
        let mut misread = model.clone();
        misread.config.rope_base *= 2.0;
        let d = diff(&loaded, &digest_model("a", &misread));
        assert_eq!(d.len(), 1, "{d:?}");
        assert!(d[0].starts_with("a/(config): sha256"), "{d:?}");
    }

    #[test]
    fn goldens_round_trip_and_diff_names_the_tensor() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("g/loader.tsv");
        let mut g = Goldens::new();
        g.insert(
            ("q8_0".into(), "blk.0.attn_q.weight".into()),
            "a".repeat(64),
        );
        g.insert(("q8_0".into(), "output_norm.weight".into()), "b".repeat(64));
        write(&path, &g, "test-build sha256=0").unwrap();
        assert!(
            std::fs::read_to_string(&path)
                .unwrap()
                .contains("\n# minted by test-build sha256=0\n")
        );
        let back = read(&path).unwrap();
        assert_eq!(back, g);
        let mut moved = g.clone();
        moved.insert(
            ("q8_0".into(), "blk.0.attn_q.weight".into()),
            "c".repeat(64),
        );
        moved.remove(&("q8_0".into(), "output_norm.weight".into()));
        let d = diff(&g, &moved);
        assert_eq!(d.len(), 2, "{d:?}");
        assert!(d[0].starts_with("q8_0/blk.0.attn_q.weight: sha256 cccccccccccc"));
        assert!(d[1].contains("output_norm.weight: banked but not produced"));
        std::fs::write(&path, "nope\n").unwrap();
        assert!(
            read(&path)
                .unwrap_err()
                .to_string()
                .contains(":1: not a loader goldens")
        );
    }
}
