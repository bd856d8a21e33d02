//! Compare cells for the plan builder: one cell per candidate cell, paired with the
//! reference cell per DESIGN §3 (a one-cell reference pairs with everything; otherwise the
//! shared axis values must match exactly one reference cell, else it is a manifest error).

use std::collections::{BTreeMap, HashMap};

use super::{Builder, DEFAULT_TIMEOUT, with_defaults, written_inputs};
use crate::load::manifest::RawNode;
use crate::load::matrix;
use crate::plan::{Cell, CellId, CellIndex, CompareSpec, Expect, NodeId, NodeKind, Policy};

impl Builder<'_, '_> {
    // Over 150 lines: a compare node's expansion (each candidate against the reference, per
    // matrix cell) with its diagnostics beside the keys they are about.
    pub(super) fn compare_cells(
        &mut self,
        raw: &RawNode,
        defaults: &RawNode,
        nodes: &[RawNode],
        ids: &HashMap<&str, usize>,
        node_cells: &[Vec<usize>],
        cells: &[Cell],
    ) -> Vec<Cell> {
        let n = with_defaults(raw, defaults);
        let id = n.id.as_ref().expect("checked").get_ref().clone();
        let mut missing = Vec::new();
        if n.reference.is_none() {
            missing.push("`reference = \"node-id\"`");
        }
        if n.candidates.as_ref().is_none_or(|c| c.is_empty()) {
            missing.push("`candidates = [\"node-id\"]`");
        }
        if n.artifact.is_none() {
            missing.push("`artifact = \"logits.safetensors\"`");
        }
        if !missing.is_empty() {
            let msg = format!(
                "[[compare]] `{id}` is missing {}",
                missing
                    .iter()
                    .map(|m| format!("{}`", m.split(' ').next().unwrap_or(m)))
                    .collect::<Vec<_>>()
                    .join(", ")
            );
            self.err(n.span.clone(), msg, format!("add {}", missing.join(", ")));
            return Vec::new();
        }
        let reference = n.reference.as_ref().expect("checked");
        let artifact = n.artifact.as_ref().expect("checked").get_ref().clone();
        let policy = n.policy.clone().unwrap_or(Policy::Bitwise);
        let Some(&ref_node) = ids.get(reference.get_ref().as_str()) else {
            return Vec::new();
        };
        if nodes[ref_node].kind == Some(NodeKind::Compare) {
            return Vec::new();
        }
        let ref_cells = &node_cells[ref_node];
        let tags: Vec<String> = n
            .tags
            .iter()
            .flatten()
            .map(|t| t.get_ref().clone())
            .collect();
        let mut out = Vec::new();
        for cand in n.candidates.iter().flatten() {
            let Some(&cand_node) = ids.get(cand.get_ref().as_str()) else {
                continue;
            };
            if nodes[cand_node].kind == Some(NodeKind::Compare) {
                continue;
            }
            if cand_node == ref_node {
                let msg = format!(
                    "compare `{id}` names `{}` as both reference and candidate",
                    cand.get_ref()
                );
                self.err(
                    cand.span(),
                    msg,
                    "compare a node against a different one".into(),
                );
                continue;
            }
            for &c in &node_cells[cand_node] {
                let cand_cell = &cells[c];
                let matches: Vec<usize> = if ref_cells.len() == 1 {
                    ref_cells.clone()
                } else {
                    ref_cells
                        .iter()
                        .copied()
                        .filter(|&r| {
                            cells[r].axes.iter().all(|(k, v)| {
                                cand_cell.axes.iter().all(|(ck, cv)| ck != k || cv == v)
                            })
                        })
                        .collect()
                };
                if matches.len() != 1 {
                    let shared: Vec<&str> = cand_cell
                        .axes
                        .iter()
                        .filter(|(k, _)| {
                            ref_cells
                                .iter()
                                .any(|&r| cells[r].axes.iter().any(|(rk, _)| rk == k))
                        })
                        .map(|(k, _)| k.as_str())
                        .collect();
                    let msg = if matches.is_empty() {
                        format!(
                            "compare `{id}`: candidate cell `{}` matches no cell of reference `{}`",
                            cand_cell.id.0,
                            reference.get_ref()
                        )
                    } else {
                        let names: Vec<&str> =
                            matches.iter().map(|&m| cells[m].id.0.as_str()).collect();
                        format!(
                            "compare `{id}`: candidate cell `{}` matches {} cells of reference `{}`: {}",
                            cand_cell.id.0,
                            matches.len(),
                            reference.get_ref(),
                            names.join(", ")
                        )
                    };
                    let help = if shared.is_empty() {
                        "the reference has several cells but shares no axis with this candidate; give both the axes that should line up, or make the reference one cell".to_string()
                    } else {
                        format!(
                            "cells are paired on their shared axes ({}); make exactly one reference cell match",
                            shared.join(", ")
                        )
                    };
                    self.err(cand.span(), msg, help);
                    continue;
                }
                let mut axes = vec![("candidate".to_string(), cand.get_ref().clone())];
                axes.extend(cand_cell.axes.iter().cloned());
                out.push(Cell {
                    id: CellId(matrix::cell_id(&id, &axes)),
                    node: NodeId(id.clone()),
                    kind: NodeKind::Compare,
                    axes,
                    description: n.description.clone(),
                    tags: tags.clone(),
                    argv: Vec::new(),
                    shell: false,
                    cwd: self.root.to_path_buf(),
                    env: BTreeMap::new(),
                    gpus: 0,
                    cpus: None,
                    memory: None,
                    timeout: n.timeout.unwrap_or(DEFAULT_TIMEOUT),
                    max_output: crate::plan::DEFAULT_MAX_OUTPUT,
                    reps: 1,
                    deterministic: true,
                    retries: 0,
                    expect: n.expect.unwrap_or(Expect::Pass),
                    expect_fail: Vec::new(),
                    info: Vec::new(),
                    verdict: None,
                    produces: Vec::new(),
                    creates: Vec::new(),
                    inputs: written_inputs(&n),
                    // A compare's inputs are its two artifacts, which its digest holds.
                    hermetic: n.hermetic.as_ref().is_some_and(|h| *h.get_ref()),
                    needs: vec![CellIndex(matches[0]), CellIndex(c)],
                    compare: Some(CompareSpec {
                        reference: CellIndex(matches[0]),
                        candidate: CellIndex(c),
                        artifact: artifact.clone(),
                        policy: policy.clone(),
                    }),
                });
            }
        }
        out
    }
}
