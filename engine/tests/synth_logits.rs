//! Synthetic checkpoints behave like trained models numerically: run through the host f32
//! oracle, their logits are spread out, peaked and position-dependent, in every weight type.

mod common;

use memra_engine::model::LlamaModel;
use memra_engine::reference;

/// Statistics of one logits row: (std, top-1 minus top-2 gap, argmax, softmax top-1 prob).
fn row_stats(row: &[f32]) -> (f64, f64, usize, f64) {
    let n = row.len() as f64;
    let mean = row.iter().map(|&v| v as f64).sum::<f64>() / n;
    let std = (row.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / n).sqrt();
    let mut idx: Vec<usize> = (0..row.len()).collect();
    idx.sort_by(|&a, &b| row[b].total_cmp(&row[a]));
    let max = row[idx[0]] as f64;
    let z: f64 = row.iter().map(|&v| (v as f64 - max).exp()).sum();
    (std, max - row[idx[1]] as f64, idx[0], 1.0 / z)
}

#[test]
fn logits_are_non_degenerate_in_every_type() {
    let prompt: Vec<u32> = (0..16).map(|i| (i * 37 + 5) % 512).collect();
    for quant in ["f32", "q4_1", "q8_0", "bf16"] {
        let model = LlamaModel::open(common::synth_model("tiny", quant, 0)).unwrap();
        let logits = reference::forward(&model, &prompt).unwrap();
        let rows: Vec<_> = logits.chunks(512).map(row_stats).collect();
        let argmaxes: std::collections::HashSet<usize> = rows.iter().map(|r| r.2).collect();
        println!("{quant}: (std, gap, argmax, p_top) per position: {rows:.3?}");
        for &(std, gap, _, p) in &rows {
            assert!(
                std.is_finite() && (0.5..20.0).contains(&std),
                "{quant}: logit std {std}"
            );
            assert!(gap > 0.0, "{quant}: tied top logits");
            // Peaked but not one-hot: the top token is far above uniform (1/512).
            assert!((0.01..0.999).contains(&p), "{quant}: top probability {p}");
        }
        assert!(
            argmaxes.len() >= 4,
            "{quant}: next token barely depends on the context: {argmaxes:?}"
        );
    }
}
