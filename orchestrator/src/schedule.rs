//! The scheduler: which ready cell starts next and on what. It leases resources — GPUs
//! exclusively (`gpus = n`, NVLink-connected sets preferred), CPU slots for `gpus = 0`
//! (`--jobs`) — orders ready cells longest-remaining-path first using the previous run's
//! durations, and says up front when a request can never be met.
//!
//! It does not spawn anything (the executor does) and does not track verdicts (the runner
//! does).

use std::collections::{BinaryHeap, HashMap};

use crate::events::Placement;
use crate::gpus::Inventory;
use crate::plan::{CellIndex, Plan};

/// Seconds assumed for a cell the previous run did not time, when nothing else is known.
pub const DEFAULT_ESTIMATE: f64 = 1.0;

/// Free and busy GPUs and CPU slots.
#[derive(Debug, Clone)]
pub struct Pool {
    /// `Gpu::index` of each inventory position, and the NVLink peers (by index).
    gpu_index: Vec<u32>,
    peers: Vec<Vec<u32>>,
    gpu_busy: Vec<bool>,
    cpu_busy: Vec<bool>,
}

impl Pool {
    pub fn new(inventory: &Inventory, cpu_slots: usize) -> Pool {
        Pool {
            gpu_index: inventory.gpus.iter().map(|g| g.index).collect(),
            peers: inventory
                .gpus
                .iter()
                .map(|g| g.nvlink_peers.clone())
                .collect(),
            gpu_busy: vec![false; inventory.gpus.len()],
            cpu_busy: vec![false; cpu_slots.max(1)],
        }
    }

    pub fn gpu_count(&self) -> usize {
        self.gpu_index.len()
    }

    pub fn cpu_slots(&self) -> usize {
        self.cpu_busy.len()
    }

    /// Why a request for `gpus` GPUs can never be met on this inventory, if it cannot.
    pub fn impossible(&self, gpus: u32) -> Option<String> {
        let have = self.gpu_index.len();
        (gpus as usize > have).then(|| {
            format!(
                "needs {gpus} GPU{}, {have} detected",
                if gpus == 1 { "" } else { "s" }
            )
        })
    }

    /// Leases resources for a cell needing `gpus` GPUs (a CPU slot when 0), or `None` when
    /// they are busy now.
    pub fn try_lease(&mut self, gpus: u32) -> Option<Placement> {
        if gpus == 0 {
            let slot = self.cpu_busy.iter().position(|b| !b)?;
            self.cpu_busy[slot] = true;
            return Some(Placement::CpuSlot(slot));
        }
        let free: Vec<usize> = (0..self.gpu_busy.len())
            .filter(|&i| !self.gpu_busy[i])
            .collect();
        let n = gpus as usize;
        if free.len() < n {
            return None;
        }
        let chosen = self.best_set(&free, n);
        for &i in &chosen {
            self.gpu_busy[i] = true;
        }
        Some(Placement::Gpus(chosen))
    }

    pub fn release(&mut self, placement: &Placement) {
        match placement {
            Placement::CpuSlot(s) => self.cpu_busy[*s] = false,
            Placement::Gpus(list) => {
                for &i in list {
                    self.gpu_busy[i] = false;
                }
            }
        }
    }

    /// The set of `n` free GPUs with the most NVLink-connected pairs; among equals, the
    /// lowest positions (so placement is deterministic). Exhaustive for the machine sizes
    /// that exist (C(8,4) = 70 sets); beyond a bound it takes the first free ones.
    fn best_set(&self, free: &[usize], n: usize) -> Vec<usize> {
        const MAX_SETS: u64 = 20_000;
        if n == 1 || n == free.len() || binomial(free.len() as u64, n as u64) > MAX_SETS {
            return free[..n].to_vec();
        }
        let mut best: Option<(usize, Vec<usize>)> = None;
        let mut combo: Vec<usize> = (0..n).collect();
        loop {
            let set: Vec<usize> = combo.iter().map(|&k| free[k]).collect();
            let links = self.links(&set);
            if best.as_ref().is_none_or(|(b, _)| links > *b) {
                best = Some((links, set));
            }
            // Next combination in lexicographic order.
            let mut i = n;
            while i > 0 && combo[i - 1] == free.len() - n + i - 1 {
                i -= 1;
            }
            if i == 0 {
                break;
            }
            combo[i - 1] += 1;
            for j in i..n {
                combo[j] = combo[j - 1] + 1;
            }
        }
        best.map(|(_, s)| s).unwrap_or_else(|| free[..n].to_vec())
    }

    fn links(&self, set: &[usize]) -> usize {
        let mut links = 0;
        for (a, &i) in set.iter().enumerate() {
            for &j in &set[a + 1..] {
                if self.peers[i].contains(&self.gpu_index[j])
                    || self.peers[j].contains(&self.gpu_index[i])
                {
                    links += 1;
                }
            }
        }
        links
    }
}

fn binomial(n: u64, k: u64) -> u64 {
    let k = k.min(n - k.min(n));
    let mut r: u64 = 1;
    for i in 0..k {
        r = r.saturating_mul(n - i) / (i + 1);
    }
    r
}

/// Each cell's duration from the previous run of the manifest, by cell id.
pub fn estimates(plan: &Plan, previous: &HashMap<String, f64>) -> Vec<Option<f64>> {
    plan.cells
        .iter()
        .map(|c| previous.get(&c.id.0).copied())
        .collect()
}

/// Longest remaining path of each cell: its own estimated duration plus the longest chain
/// of dependents after it. Unknown durations count as the mean of the known ones (or
/// [`DEFAULT_ESTIMATE`]). Cells on a cycle (which a validated plan never has) get their own
/// duration only.
pub fn priorities(plan: &Plan, estimates: &[Option<f64>]) -> Vec<f64> {
    let known: Vec<f64> = estimates.iter().flatten().copied().collect();
    let fallback = if known.is_empty() {
        DEFAULT_ESTIMATE
    } else {
        known.iter().sum::<f64>() / known.len() as f64
    };
    let own: Vec<f64> = estimates.iter().map(|e| e.unwrap_or(fallback)).collect();
    let dependents = plan.dependents();
    let n = plan.cells.len();
    // Kahn's order over the reversed edges: a cell is final once all its dependents are.
    let mut pending: Vec<usize> = dependents.iter().map(Vec::len).collect();
    let mut stack: Vec<usize> = (0..n).filter(|&i| pending[i] == 0).collect();
    let mut out = own.clone();
    let mut done = vec![false; n];
    while let Some(i) = stack.pop() {
        done[i] = true;
        let tail = dependents[i].iter().map(|d| out[d.0]).fold(0.0, f64::max);
        out[i] = own[i] + tail;
        for need in &plan.cells[i].needs {
            pending[need.0] -= 1;
            if pending[need.0] == 0 {
                stack.push(need.0);
            }
        }
    }
    out
}

/// Ready cells, highest priority first; ties go to the earlier cell in plan order. CPU
/// cells and GPU cells wait in separate heaps, so a full set of CPU slots costs one look
/// however many CPU cells wait, and GPU cells are tried only while a GPU is free.
#[derive(Debug, Default)]
pub struct ReadyQueue {
    cpu: BinaryHeap<Entry>,
    gpu: BinaryHeap<Entry>,
}

#[derive(Debug, PartialEq)]
struct Entry {
    priority: f64,
    cell: CellIndex,
    gpus: u32,
}

impl Eq for Entry {}

impl Ord for Entry {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.priority
            .total_cmp(&other.priority)
            .then_with(|| other.cell.cmp(&self.cell))
    }
}

impl PartialOrd for Entry {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl ReadyQueue {
    pub fn push(&mut self, cell: CellIndex, priority: f64, gpus: u32) {
        let e = Entry {
            priority,
            cell,
            gpus,
        };
        if gpus == 0 {
            self.cpu.push(e)
        } else {
            self.gpu.push(e)
        }
    }

    pub fn is_empty(&self) -> bool {
        self.cpu.is_empty() && self.gpu.is_empty()
    }

    pub fn len(&self) -> usize {
        self.cpu.len() + self.gpu.len()
    }

    /// Takes every ready cell that can be placed now, in priority order within CPU cells
    /// and within GPU cells, leasing its resources; cells that do not fit stay queued. A
    /// lower-priority GPU cell may start before a higher one that waits for more GPUs
    /// (backfilling), which keeps GPUs busy.
    pub fn take_placeable(&mut self, pool: &mut Pool) -> Vec<(CellIndex, Placement)> {
        let mut started = Vec::new();
        while let Some(e) = self.cpu.peek() {
            match pool.try_lease(0) {
                Some(p) => {
                    started.push((e.cell, p));
                    self.cpu.pop();
                }
                None => break,
            }
        }
        let mut waiting = Vec::new();
        while pool.gpu_busy.iter().any(|b| !b)
            && let Some(e) = self.gpu.pop()
        {
            match pool.try_lease(e.gpus) {
                Some(p) => started.push((e.cell, p)),
                None => waiting.push(e),
            }
        }
        self.gpu.extend(waiting);
        started
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpus::Inventory;

    fn nvlink_pairs(n: u32, pairs: &[(u32, u32)]) -> Inventory {
        let mut inv = Inventory::fake(n);
        for &(a, b) in pairs {
            inv.gpus[a as usize].nvlink_peers.push(b);
            inv.gpus[b as usize].nvlink_peers.push(a);
        }
        inv
    }

    #[test]
    fn gpus_are_exclusive_and_released() {
        let mut pool = Pool::new(&Inventory::fake(4), 2);
        let a = pool.try_lease(2).unwrap();
        let b = pool.try_lease(2).unwrap();
        assert_eq!(a, Placement::Gpus(vec![0, 1]));
        assert_eq!(b, Placement::Gpus(vec![2, 3]));
        assert_eq!(pool.try_lease(1), None);
        pool.release(&a);
        assert_eq!(pool.try_lease(1), Some(Placement::Gpus(vec![0])));
    }

    #[test]
    fn cpu_slots_bound_gpu_free_cells() {
        let mut pool = Pool::new(&Inventory::fake(0), 2);
        assert_eq!(pool.try_lease(0), Some(Placement::CpuSlot(0)));
        assert_eq!(pool.try_lease(0), Some(Placement::CpuSlot(1)));
        assert_eq!(pool.try_lease(0), None);
    }

    #[test]
    fn nvlink_connected_sets_are_preferred() {
        // 0-1 not linked; 1-3 linked; 2-3 linked.
        let inv = nvlink_pairs(4, &[(1, 3), (2, 3)]);
        let mut pool = Pool::new(&inv, 1);
        assert_eq!(pool.try_lease(2), Some(Placement::Gpus(vec![1, 3])));
        let inv = nvlink_pairs(4, &[(0, 2), (2, 3), (0, 3)]);
        let mut pool = Pool::new(&inv, 1);
        assert_eq!(pool.try_lease(3), Some(Placement::Gpus(vec![0, 2, 3])));
    }

    #[test]
    fn impossible_requests_say_why() {
        let pool = Pool::new(&Inventory::fake(4), 1);
        assert_eq!(
            pool.impossible(8).as_deref(),
            Some("needs 8 GPUs, 4 detected")
        );
        assert_eq!(
            Pool::new(&Inventory::fake(0), 1).impossible(1).as_deref(),
            Some("needs 1 GPU, 0 detected")
        );
        assert_eq!(pool.impossible(4), None);
    }

    #[test]
    fn binomials() {
        assert_eq!(binomial(8, 4), 70);
        assert_eq!(binomial(5, 0), 1);
        assert_eq!(binomial(5, 5), 1);
    }

    #[test]
    fn queue_orders_by_priority_then_plan_order_and_backfills() {
        let mut q = ReadyQueue::default();
        q.push(CellIndex(0), 1.0, 0);
        q.push(CellIndex(1), 5.0, 0);
        q.push(CellIndex(2), 5.0, 0);
        // Cell 3 wants 2 GPUs (it waits), cell 4 one GPU at a lower priority (backfills).
        q.push(CellIndex(3), 9.0, 2);
        q.push(CellIndex(4), 2.0, 1);
        let mut pool = Pool::new(&Inventory::fake(1), 2);
        let started = q.take_placeable(&mut pool);
        let ids: Vec<usize> = started.iter().map(|(c, _)| c.0).collect();
        assert_eq!(ids, [1, 2, 4]);
        assert_eq!(q.len(), 2);
        // Nothing is free now: nothing starts, nothing is lost.
        assert!(q.take_placeable(&mut pool).is_empty());
        assert_eq!(q.len(), 2);
    }

    fn plan(needs: &[&[usize]]) -> Plan {
        use crate::plan::{Cell, CellId, Expect, NodeId, NodeKind, SourceFile};
        let cells = needs
            .iter()
            .enumerate()
            .map(|(i, n)| Cell {
                id: CellId(format!("c{i}")),
                node: NodeId(format!("c{i}")),
                kind: NodeKind::Arm,
                axes: Vec::new(),
                description: None,
                tags: Vec::new(),
                argv: vec!["true".into()],
                shell: false,
                cwd: "/".into(),
                env: Default::default(),
                gpus: 0,
                cpus: None,
                memory: None,
                timeout: std::time::Duration::from_secs(1),
                max_output: 1 << 30,
                reps: 1,
                deterministic: true,
                retries: 0,
                expect: Expect::Pass,
                verdict: None,
                produces: Vec::new(),
                creates: Vec::new(),
                inputs: Vec::new(),
                needs: n.iter().map(|&k| CellIndex(k)).collect(),
                compare: None,
            })
            .collect();
        Plan {
            name: "p".into(),
            description: None,
            manifest: SourceFile {
                path: "m".into(),
                sha256: String::new(),
            },
            env_matrices: Vec::new(),
            root: "/".into(),
            inherit: Vec::new(),
            require: Default::default(),
            cells,
        }
    }

    #[test]
    fn longest_remaining_path_uses_previous_durations() {
        // c0 -> c1 -> c2 (a chain), c3 alone but slow last time, c4 never timed.
        let p = plan(&[&[], &[0], &[1], &[], &[]]);
        let previous = HashMap::from([
            ("c0".to_string(), 1.0),
            ("c1".to_string(), 2.0),
            ("c2".to_string(), 3.0),
            ("c3".to_string(), 5.0),
        ]);
        let est = estimates(&p, &previous);
        assert_eq!(est[4], None);
        let pr = priorities(&p, &est);
        assert_eq!(pr[2], 3.0);
        assert_eq!(pr[1], 5.0);
        assert_eq!(pr[0], 6.0, "the head of the chain carries the whole chain");
        assert_eq!(pr[3], 5.0);
        // Unknown durations count as the mean of the known ones.
        assert_eq!(pr[4], 11.0 / 4.0);
        let mut q = ReadyQueue::default();
        for i in [0, 3, 4] {
            q.push(CellIndex(i), pr[i], 0);
        }
        let mut pool = Pool::new(&Inventory::fake(0), 3);
        let order: Vec<usize> = q
            .take_placeable(&mut pool)
            .iter()
            .map(|(c, _)| c.0)
            .collect();
        assert_eq!(order, [0, 3, 4]);
    }
}
