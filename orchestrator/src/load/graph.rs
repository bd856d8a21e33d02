//! The dependency graph of a plan: node-level checks (unknown ids with a did-you-mean;
//! cycles, found as strongly connected components with petgraph and named in order) and
//! the cell-level topological order. The graph
//! orders; it does not schedule or run anything.

use std::collections::HashMap;
use std::ops::Range;

use petgraph::algo::tarjan_scc;
use petgraph::graph::{DiGraph, NodeIndex};

use crate::plan::{CellIndex, Plan};
use crate::words::diagnostics::did_you_mean;

/// A dependency edge as written: `from` needs `to`, at `span` of the manifest.
#[derive(Debug, Clone)]
pub struct Edge {
    pub from: usize,
    pub to: usize,
    pub span: Range<usize>,
}

/// A node-level problem, located at a span of the manifest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GraphError {
    pub span: Range<usize>,
    pub message: String,
    pub help: String,
}

/// Resolves a node id written at `span` against the known ids; the error suggests the
/// closest known id.
pub fn resolve(
    ids: &HashMap<&str, usize>,
    name: &str,
    span: Range<usize>,
    what: &str,
) -> Result<usize, GraphError> {
    if let Some(&i) = ids.get(name) {
        return Ok(i);
    }
    let help = match did_you_mean(name, ids.keys().copied()) {
        Some(s) => format!("did you mean `{s}`?"),
        None => {
            let mut known: Vec<&str> = ids.keys().copied().collect();
            known.sort_unstable();
            format!("the node ids are: {}", known.join(", "))
        }
    };
    Err(GraphError {
        span,
        message: format!("unknown node id `{name}` in `{what}`"),
        help,
    })
}

/// Every dependency cycle among `names.len()` nodes, each reported once, named in order
/// (`a → b → c → a`) and located at the edge that leaves its first node (in manifest order).
pub fn cycles(names: &[&str], edges: &[Edge]) -> Vec<GraphError> {
    let mut g: DiGraph<usize, usize> = DiGraph::with_capacity(names.len(), edges.len());
    let nodes: Vec<NodeIndex> = (0..names.len()).map(|i| g.add_node(i)).collect();
    for (e_i, e) in edges.iter().enumerate() {
        g.add_edge(nodes[e.from], nodes[e.to], e_i);
    }
    let mut out = Vec::new();
    let mut sccs = tarjan_scc(&g);
    sccs.iter_mut().for_each(|c| c.sort());
    sccs.sort();
    for scc in sccs {
        let start = scc[0];
        let self_loop = g.find_edge(start, start);
        if scc.len() == 1 && self_loop.is_none() {
            continue;
        }
        let in_scc = |n: NodeIndex| scc.binary_search(&n).is_ok();
        // Walk from the first node along edges inside the component until the walk returns
        // to it; a breadth-first search gives the shortest such cycle, which reads best.
        let path = shortest_cycle(&g, start, &in_scc);
        let mut text: Vec<&str> = path.iter().map(|&n| names[g[n]]).collect();
        text.push(names[g[start]]);
        let first_edge = path.get(1).copied().unwrap_or(start);
        let edge = g
            .find_edge(start, first_edge)
            .map(|e| &edges[g[e]])
            .expect("cycle edges exist");
        out.push(GraphError {
            span: edge.span.clone(),
            message: format!("dependency cycle: {}", text.join(" → ")),
            help: "remove one of these `needs` (or `reference`/`candidates`) so the nodes can be ordered".into(),
        });
    }
    out
}

fn shortest_cycle(
    g: &DiGraph<usize, usize>,
    start: NodeIndex,
    in_scc: &dyn Fn(NodeIndex) -> bool,
) -> Vec<NodeIndex> {
    let mut prev: HashMap<NodeIndex, NodeIndex> = HashMap::new();
    let mut queue = std::collections::VecDeque::from([start]);
    let mut neighbors: Vec<NodeIndex>;
    while let Some(n) = queue.pop_front() {
        neighbors = g.neighbors(n).filter(|&m| in_scc(m)).collect();
        neighbors.sort();
        for m in neighbors {
            if m == start {
                let mut path = vec![n];
                let mut cur = n;
                while cur != start {
                    cur = prev[&cur];
                    path.push(cur);
                }
                path.reverse();
                path.dedup();
                return path;
            }
            if let std::collections::hash_map::Entry::Vacant(e) = prev.entry(m) {
                e.insert(n);
                queue.push_back(m);
            }
        }
    }
    vec![start]
}

/// Cells in a topological order (dependencies first); among cells that are ready at the
/// same time the one earliest in the plan comes first, so the listing reads in manifest order
/// wherever the dependencies allow. `None` when the cells contain a cycle (a validated plan
/// never does).
pub fn topological_order(plan: &Plan) -> Option<Vec<CellIndex>> {
    use std::cmp::Reverse;
    use std::collections::BinaryHeap;
    let dependents = plan.dependents();
    let mut missing: Vec<usize> = plan.cells.iter().map(|c| c.needs.len()).collect();
    let mut ready: BinaryHeap<Reverse<usize>> = (0..plan.cells.len())
        .filter(|&i| missing[i] == 0)
        .map(Reverse)
        .collect();
    let mut order = Vec::with_capacity(plan.cells.len());
    while let Some(Reverse(i)) = ready.pop() {
        order.push(CellIndex(i));
        for d in &dependents[i] {
            missing[d.0] -= 1;
            if missing[d.0] == 0 {
                ready.push(Reverse(d.0));
            }
        }
    }
    (order.len() == plan.cells.len()).then_some(order)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn e(from: usize, to: usize) -> Edge {
        Edge {
            from,
            to,
            span: from * 10..from * 10 + 1,
        }
    }

    #[test]
    fn cycles_are_named_in_order() {
        let names = ["a", "b", "c", "d"];
        let errs = cycles(&names, &[e(0, 1), e(1, 2), e(2, 0), e(3, 3)]);
        assert_eq!(errs.len(), 2);
        assert_eq!(errs[0].message, "dependency cycle: a → b → c → a");
        assert_eq!(errs[0].span, 0..1);
        assert_eq!(errs[1].message, "dependency cycle: d → d");
        assert!(cycles(&names, &[e(0, 1), e(1, 2)]).is_empty());
    }

    #[test]
    fn unknown_ids_suggest() {
        let ids: HashMap<&str, usize> = [("build", 0), ("decode", 1)].into_iter().collect();
        let err = resolve(&ids, "biuld", 0..5, "needs").unwrap_err();
        assert_eq!(err.help, "did you mean `build`?");
        assert_eq!(resolve(&ids, "decode", 0..1, "needs"), Ok(1));
    }
}
