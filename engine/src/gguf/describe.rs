//! A human description of a GGUF file, printed by `memra-engine info`.
//!
//! This module owns only the wording and layout of that text; every fact comes from the
//! parsed file and `LlamaHparams`.

use std::collections::BTreeMap;
use std::fmt::Write;

use super::{GgmlType, GgufFile};
use crate::hparams::LlamaHparams;

/// Describes `file`: format, architecture and shape, tensor types with their byte totals, and
/// the metadata keys (arrays abbreviated).
pub fn describe(file: &GgufFile) -> String {
    let mut s = String::new();
    let mib = |b: u64| b as f64 / (1024.0 * 1024.0);
    // Writing to a String cannot fail, so the results of writeln! are ignored below.
    let _ = writeln!(s, "file:         {}", file.path().display());
    let _ = writeln!(
        s,
        "format:       GGUF v{}, {} bytes ({:.1} MiB), alignment {}, data at {}",
        file.version(),
        file.file_len(),
        mib(file.file_len()),
        file.alignment(),
        file.data_offset()
    );
    let arch = file
        .get("general.architecture")
        .and_then(|v| v.as_str())
        .unwrap_or("(none)");
    let name = file
        .get("general.name")
        .and_then(|v| v.as_str())
        .unwrap_or("(none)");
    let _ = writeln!(s, "architecture: {arch}");
    let _ = writeln!(s, "name:         {name}");
    match LlamaHparams::from_gguf(file) {
        Ok(hp) => {
            let _ = writeln!(
                s,
                "shape:        {} layers, n_embd {}, n_ff {}, {} heads / {} KV heads, head_dim {}, vocab {}, context {}",
                hp.n_layer,
                hp.n_embd,
                hp.n_ff,
                hp.n_head,
                hp.n_head_kv,
                hp.head_dim,
                hp.n_vocab,
                hp.n_ctx
            );
            let _ = writeln!(
                s,
                "rope base:    {}, rms eps {:e}, output head {}, {:.1} M parameters",
                hp.rope_base,
                hp.rms_eps,
                if hp.tied_output {
                    "tied to token_embd"
                } else {
                    "output.weight"
                },
                hp.n_params() as f64 / 1e6
            );
        }
        Err(e) => {
            let _ = writeln!(s, "shape:        not a loadable llama model: {}", e.kind);
        }
    }
    let mut by_type: BTreeMap<GgmlType, (usize, u64, u64)> = BTreeMap::new();
    for t in file.tensors() {
        let e = by_type.entry(t.ty).or_default();
        e.0 += 1;
        e.1 += t.n_elements();
        e.2 += t.n_bytes;
    }
    let _ = writeln!(s, "tensors:      {}", file.tensors().len());
    let _ = writeln!(
        s,
        "  {:<6} {:>7} {:>14} {:>14} {:>10}",
        "type", "tensors", "elements", "bytes", "MiB"
    );
    for (ty, (n, elems, bytes)) in &by_type {
        let _ = writeln!(
            s,
            "  {:<6} {:>7} {:>14} {:>14} {:>10.2}",
            ty.name(),
            n,
            elems,
            bytes,
            mib(*bytes)
        );
    }
    let mut shapes: BTreeMap<String, (GgmlType, Vec<u64>, usize)> = BTreeMap::new();
    for t in file.tensors() {
        // Layers repeat the same tensors, so they are listed once with a count.
        let key = match t.name.strip_prefix("blk.") {
            Some(rest) => format!("blk.N.{}", rest.split_once('.').map_or(rest, |(_, r)| r)),
            None => t.name.clone(),
        };
        let e = shapes.entry(key).or_insert((t.ty, t.shape.clone(), 0));
        e.2 += 1;
    }
    for (name, (ty, shape, n)) in &shapes {
        let count = if *n > 1 {
            format!(" ×{n}")
        } else {
            String::new()
        };
        let _ = writeln!(s, "  {name:<28} {:<5} {shape:?}{count}", ty.name());
    }
    let _ = writeln!(s, "metadata:     {} keys", file.metadata().len());
    for (k, v) in file.metadata() {
        let mut text = v.to_string();
        if text.chars().count() > 100 {
            text = text.chars().take(100).collect::<String>() + "…";
        }
        let _ = writeln!(s, "  {k} = {text}");
    }
    s
}
