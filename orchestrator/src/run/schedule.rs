//! The scheduler: which ready cell starts next and on what. It leases resources — GPUs
//! exclusively (`gpus = n`, NVLink-connected sets preferred), CPU slots for `gpus = 0`
//! (`--jobs`) — orders ready cells longest-remaining-path first using the previous run's
//! durations, and says up front when a request can never be met. A GPU is exclusive within
//! the run by its busy flag and across the machine by its lease ([`crate::machine::lease`]): a set
//! is placed only when both are free, and a GPU another process holds is tried again every
//! [`LEASE_POLL`].
//!
//! It does not spawn anything (the executor does) and does not track verdicts (the runner
//! does).

use std::collections::{BinaryHeap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::machine::gpus::Inventory;
use crate::machine::lease::{Blocker, GpuLocks};
use crate::plan::{CellIndex, Plan};
use crate::run::events::Placement;

/// Seconds assumed for a cell the previous run did not time, when nothing else is known.
pub const DEFAULT_ESTIMATE: f64 = 1.0;

/// How long a GPU found leased by another process counts as taken before its lock is
/// tried again: often enough that a freed GPU is picked up within a blink, rarely enough
/// that a waiting run costs nothing.
pub const LEASE_POLL: Duration = Duration::from_millis(250);

/// Free and busy GPUs and CPU slots.
#[derive(Debug, Clone)]
pub struct Pool {
    /// `Gpu::index` of each inventory position, and the NVLink peers (by index).
    gpu_index: Vec<u32>,
    peers: Vec<Vec<u32>>,
    gpu_busy: Vec<bool>,
    cpu_busy: Vec<bool>,
    /// Every slot a cell of `cpus > 1` holds, by the first (the slot its placement names).
    cpu_groups: HashMap<usize, Vec<usize>>,
    /// The machine-wide leases, by inventory position (`None`: this run takes none).
    locks: Option<Arc<GpuLocks>>,
    /// GPUs last found leased by another process: when, and by whom.
    held: Vec<Option<(Instant, Blocker)>>,
    /// The model of each GPU, for a retry that must land on the same model.
    model: Vec<String>,
    /// GPUs that faulted in this run ([`crate::machine::health`]): they take no new cells.
    quarantined: Vec<bool>,
}

/// Why a cell cannot be placed now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NotNow {
    /// Its resources are busy with this run's own cells.
    Busy,
    /// Enough GPUs are free in this run, but another process leases one of them:
    /// `gpu` (its `Gpu::index`) and what holds it.
    Leased { gpu: u32, blocker: Blocker },
}

/// A cell that waits for a GPU another process leases, as [`ReadyQueue::take_placeable`]
/// reports it: when the wait begins, and again when the GPU or what holds it changes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseWait {
    pub cell: CellIndex,
    /// The `Gpu::index` of the GPU it waits for.
    pub gpu: u32,
    pub blocker: Blocker,
}

/// What one look at the ready queue placed, and who waits for a lease.
#[derive(Debug, Default)]
pub struct Taken {
    pub started: Vec<(CellIndex, Placement)>,
    /// Waits to say: begun, or changed since last said.
    pub waiting: Vec<LeaseWait>,
    /// Cells of `started` that had waited for a lease, and for how many seconds.
    pub waited: Vec<(CellIndex, f64)>,
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
            cpu_groups: HashMap::new(),
            locks: None,
            held: vec![None; inventory.gpus.len()],
            model: inventory.gpus.iter().map(|g| g.name.clone()).collect(),
            quarantined: vec![false; inventory.gpus.len()],
        }
    }

    /// Keeps the GPU of this `Gpu::index` from every cell placed from now on (a device
    /// fault); the cell on it now finishes as it does.
    pub fn quarantine(&mut self, gpu: u32) {
        if let Some(i) = self.gpu_index.iter().position(|&g| g == gpu) {
            self.quarantined[i] = true;
        }
    }

    /// The model of the GPU of this `Gpu::index`.
    pub fn model_of(&self, gpu: u32) -> Option<&str> {
        let i = self.gpu_index.iter().position(|&g| g == gpu)?;
        Some(self.model[i].as_str())
    }

    /// How many GPUs (of `model`, when given) are not quarantined.
    pub fn healthy(&self, model: Option<&str>) -> usize {
        (0..self.gpu_index.len())
            .filter(|&i| !self.quarantined[i] && model.is_none_or(|m| self.model[i] == m))
            .count()
    }

    /// The quarantined GPUs, by `Gpu::index`.
    pub fn quarantined(&self) -> Vec<u32> {
        (0..self.gpu_index.len())
            .filter(|&i| self.quarantined[i])
            .map(|i| self.gpu_index[i])
            .collect()
    }

    /// The same pool taking a machine-wide lease on every GPU it places, through `locks`
    /// (opened for the same inventory).
    pub fn with_locks(self, locks: Option<Arc<GpuLocks>>) -> Pool {
        if let Some(l) = &locks {
            assert_eq!(
                l.len(),
                self.gpu_index.len(),
                "the lock files are opened for the pool's inventory"
            );
        }
        Pool { locks, ..self }
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

    /// Whether a GPU is free in this run and not known to be leased elsewhere (a lease
    /// seen more than [`LEASE_POLL`] ago is worth trying again).
    fn gpu_available(&self, i: usize) -> bool {
        !self.gpu_busy[i]
            && !self.quarantined[i]
            && self.held[i]
                .as_ref()
                .is_none_or(|(seen, _)| seen.elapsed() >= LEASE_POLL)
    }

    /// Leases resources for `cell` needing `gpus` GPUs (a CPU slot when 0), or says why not
    /// now. GPUs are taken machine-wide too when the pool has lock files: a chosen set
    /// of which one is leased elsewhere is given back whole, and the next best set of the
    /// remaining GPUs is tried.
    pub fn try_lease(&mut self, gpus: u32, cell: &str) -> Result<Placement, NotNow> {
        self.try_lease_of(gpus, cell, None)
    }

    /// [`Pool::try_lease`] on GPUs of `model` only, when given (a cell run again after a
    /// device fault goes to a twin of the GPU that faulted).
    pub fn try_lease_of(
        &mut self,
        gpus: u32,
        cell: &str,
        model: Option<&str>,
    ) -> Result<Placement, NotNow> {
        if gpus == 0 {
            return self.try_lease_cpus(1);
        }
        let n = gpus as usize;
        loop {
            let free: Vec<usize> = (0..self.gpu_busy.len())
                .filter(|&i| self.gpu_available(i) && model.is_none_or(|m| self.model[i] == m))
                .collect();
            if free.len() < n {
                return Err(self.why_not(n));
            }
            let chosen = self.best_set(&free, n);
            if let Some(locks) = &self.locks
                && let Err((position, blocker)) = locks.try_take(&chosen, cell)
            {
                // Each round marks one more GPU as leased, so the loop ends.
                self.held[position] = Some((Instant::now(), blocker));
                continue;
            }
            for &i in &chosen {
                self.gpu_busy[i] = true;
                self.held[i] = None;
            }
            return Ok(Placement::Gpus(chosen));
        }
    }

    /// Leases `cpus` CPU slots (`cpus` of a `gpus = 0` cell; 0 counts as 1, and more than the
    /// pool has as all of it, so such a cell runs alone rather than never), named by the
    /// first of them.
    pub fn try_lease_cpus(&mut self, cpus: u32) -> Result<Placement, NotNow> {
        let n = (cpus.max(1) as usize).min(self.cpu_busy.len());
        let free: Vec<usize> = (0..self.cpu_busy.len())
            .filter(|&i| !self.cpu_busy[i])
            .take(n)
            .collect();
        if free.len() < n {
            return Err(NotNow::Busy);
        }
        for &i in &free {
            self.cpu_busy[i] = true;
        }
        let first = free[0];
        if n > 1 {
            self.cpu_groups.insert(first, free);
        }
        Ok(Placement::CpuSlot(first))
    }

    /// Why `n` GPUs cannot be placed now: this run's own cells hold too many of them, or
    /// enough are free here and the first one another process leases is to blame.
    fn why_not(&self, n: usize) -> NotNow {
        let free_here: Vec<usize> = (0..self.gpu_busy.len())
            .filter(|&i| !self.gpu_busy[i] && !self.quarantined[i])
            .collect();
        if free_here.len() < n {
            return NotNow::Busy;
        }
        free_here
            .iter()
            .find_map(|&i| {
                self.held[i].as_ref().map(|(_, b)| NotNow::Leased {
                    gpu: self.gpu_index[i],
                    blocker: b.clone(),
                })
            })
            .unwrap_or(NotNow::Busy)
    }

    pub fn release(&mut self, placement: &Placement) {
        match placement {
            Placement::CpuSlot(s) => {
                for i in self.cpu_groups.remove(s).unwrap_or_else(|| vec![*s]) {
                    self.cpu_busy[i] = false;
                }
            }
            Placement::Gpus(list) => {
                if let Some(locks) = &self.locks {
                    locks.release(list);
                }
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
///
/// It also keeps the plan's dependency countdown (cargo's `DependencyQueue` shape): how
/// many dependencies each cell still waits for ([`ReadyQueue::waits_on_nothing`]), and
/// [`ReadyQueue::count_down`] when one of them finishes in a way the cell can use. What
/// a dependency's ending means for its dependents (run, blocked, skipped) is the runner's.
#[derive(Debug, Default)]
pub struct ReadyQueue {
    cpu: BinaryHeap<Entry>,
    gpu: BinaryHeap<Entry>,
    /// Per cell: the dependencies it still waits for.
    left: Vec<usize>,
    /// Per cell: the cells that need it.
    dependents: Vec<Vec<CellIndex>>,
    /// Cells waiting for a lease another process holds: since when, and the GPU and
    /// blocker last said.
    lease_waits: HashMap<CellIndex, (Instant, u32, Blocker)>,
}

#[derive(Debug, PartialEq)]
struct Entry {
    priority: f64,
    cell: CellIndex,
    gpus: u32,
    /// Only GPUs of this model (a retry after a device fault).
    model: Option<String>,
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
    /// An empty queue whose countdown starts at every cell's number of dependencies.
    pub fn for_plan(plan: &Plan) -> ReadyQueue {
        ReadyQueue {
            left: plan.cells.iter().map(|c| c.needs.len()).collect(),
            dependents: plan.dependents(),
            ..ReadyQueue::default()
        }
    }

    /// The cells that need `cell`, in plan order.
    pub fn dependents(&self, cell: CellIndex) -> &[CellIndex] {
        self.dependents.get(cell.0).map_or(&[], Vec::as_slice)
    }

    /// Whether `cell` waits for no dependency any more.
    pub fn waits_on_nothing(&self, cell: CellIndex) -> bool {
        self.left.get(cell.0).is_none_or(|&k| k == 0)
    }

    /// One dependency of `cell` finished in a way it can use; returns whether that was the
    /// last one it waited for (it became ready now, and only now).
    pub fn count_down(&mut self, cell: CellIndex) -> bool {
        match self.left.get_mut(cell.0) {
            Some(k) if *k > 0 => {
                *k -= 1;
                *k == 0
            }
            _ => false,
        }
    }

    pub fn push(&mut self, cell: CellIndex, priority: f64, gpus: u32) {
        self.push_on(cell, priority, gpus, None)
    }

    /// [`ReadyQueue::push`] for a cell that may only run on GPUs of `model`.
    pub fn push_on(&mut self, cell: CellIndex, priority: f64, gpus: u32, model: Option<String>) {
        let e = Entry {
            priority,
            cell,
            gpus,
            model,
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

    /// Takes every ready cell of `plan` that can be placed now, in priority order within
    /// CPU cells and within GPU cells, leasing its resources; cells that do not fit stay
    /// queued, in their place. A lower-priority GPU cell may start before a higher one that
    /// waits for more GPUs (backfilling), which keeps GPUs busy. Cells that were tried and
    /// wait for a GPU another process leases are reported in [`Taken::waiting`].
    pub fn take_placeable(&mut self, pool: &mut Pool, plan: &Plan) -> Taken {
        let mut taken = Taken::default();
        while let Some(e) = self.cpu.peek() {
            match pool.try_lease_cpus(plan.cell(e.cell).cpus.unwrap_or(1)) {
                Ok(p) => {
                    taken.started.push((e.cell, p));
                    self.cpu.pop();
                }
                Err(_) => break,
            }
        }
        let mut waiting = Vec::new();
        let mut leased: Option<(CellIndex, u32, Blocker)> = None;
        while (0..pool.gpu_busy.len()).any(|i| pool.gpu_available(i))
            && let Some(e) = self.gpu.pop()
        {
            match pool.try_lease_of(e.gpus, &plan.cell(e.cell).id.0, e.model.as_deref()) {
                Ok(p) => {
                    if let Some((since, _, _)) = self.lease_waits.remove(&e.cell) {
                        taken.waited.push((e.cell, since.elapsed().as_secs_f64()));
                    }
                    taken.started.push((e.cell, p))
                }
                Err(why) => {
                    if let NotNow::Leased { gpu, blocker } = why {
                        leased = Some((e.cell, gpu, blocker.clone()));
                        self.note_wait(e.cell, gpu, blocker, &mut taken.waiting);
                    }
                    waiting.push(e)
                }
            }
        }
        self.gpu.extend(waiting);
        // With no GPU busy with this run's own cells, every GPU cell still queued waits for
        // leases other processes hold, not just the one that was tried: its wait counts
        // from now too (for `lease_timeout`), and is said. Only once the tried cell has
        // waited past a few polls: a lease found held for an instant (its holder giving it
        // back) is no wait of the others.
        let lasting = leased.as_ref().is_some_and(|(c, _, _)| {
            self.lease_waits
                .get(c)
                .is_some_and(|(since, _, _)| since.elapsed() >= LEASE_POLL * 4)
        });
        if let Some((_, gpu, blocker)) = leased
            && lasting
            && !pool.gpu_busy.iter().any(|b| *b)
        {
            let mut rest: Vec<CellIndex> = self
                .gpu
                .iter()
                .map(|e| e.cell)
                .filter(|c| !self.lease_waits.contains_key(c))
                .collect();
            rest.sort();
            for c in rest {
                self.note_wait(c, gpu, blocker.clone(), &mut taken.waiting);
            }
        }
        taken
    }

    /// Takes out of the queue every GPU cell that needs more GPUs than are left healthy
    /// (of its model, when it has one): after a quarantine they can never be placed.
    pub fn take_unplaceable(&mut self, pool: &Pool) -> Vec<CellIndex> {
        let mut out = Vec::new();
        self.gpu.retain(|e| {
            let fits = e.gpus as usize <= pool.healthy(e.model.as_deref());
            if !fits {
                out.push(e.cell);
            }
            fits
        });
        for c in &out {
            self.lease_waits.remove(c);
        }
        out.sort();
        out
    }

    /// The cells now waiting for a lease another process holds: since when, the GPU and
    /// what holds it.
    pub fn lease_waits(&self) -> impl Iterator<Item = (CellIndex, Instant, u32, &Blocker)> {
        self.lease_waits
            .iter()
            .map(|(c, (since, gpu, b))| (*c, *since, *gpu, b))
    }

    /// Takes out of the queue every cell that has waited `limit` or longer for a lease
    /// another process holds, with the GPU, what holds it and how long it waited.
    pub fn expire_waits(&mut self, limit: Duration) -> Vec<(CellIndex, u32, Blocker, Duration)> {
        let mut expired: Vec<(CellIndex, u32, Blocker, Duration)> = self
            .lease_waits
            .iter()
            .filter(|(_, (since, _, _))| since.elapsed() >= limit)
            .map(|(c, (since, gpu, b))| (*c, *gpu, b.clone(), since.elapsed()))
            .collect();
        expired.sort_by_key(|e| e.0);
        for (cell, ..) in &expired {
            self.lease_waits.remove(cell);
        }
        self.gpu
            .retain(|e| !expired.iter().any(|(cell, ..)| *cell == e.cell));
        expired
    }

    /// Records that `cell` waits for `gpu`, held by `blocker`, and queues it to be said
    /// unless exactly that was said last.
    fn note_wait(&mut self, cell: CellIndex, gpu: u32, blocker: Blocker, say: &mut Vec<LeaseWait>) {
        let last = self.lease_waits.get(&cell);
        if last.is_some_and(|(_, g, b)| *g == gpu && *b == blocker) {
            return;
        }
        let since = last.map_or_else(Instant::now, |(t, _, _)| *t);
        self.lease_waits.insert(cell, (since, gpu, blocker.clone()));
        say.push(LeaseWait { cell, gpu, blocker });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::machine::gpus::Inventory;

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
        let a = pool.try_lease(2, "c").unwrap();
        let b = pool.try_lease(2, "c").unwrap();
        assert_eq!(a, Placement::Gpus(vec![0, 1]));
        assert_eq!(b, Placement::Gpus(vec![2, 3]));
        assert_eq!(pool.try_lease(1, "c").ok(), None);
        pool.release(&a);
        assert_eq!(pool.try_lease(1, "c").ok(), Some(Placement::Gpus(vec![0])));
    }

    #[test]
    fn cpu_slots_bound_gpu_free_cells() {
        let mut pool = Pool::new(&Inventory::fake(0), 2);
        assert_eq!(pool.try_lease(0, "c").ok(), Some(Placement::CpuSlot(0)));
        assert_eq!(pool.try_lease(0, "c").ok(), Some(Placement::CpuSlot(1)));
        assert_eq!(pool.try_lease(0, "c").ok(), None);
    }

    #[test]
    fn a_cell_of_several_cpus_holds_as_many_slots() {
        let mut pool = Pool::new(&Inventory::fake(0), 3);
        let two = pool.try_lease_cpus(2).unwrap();
        assert_eq!(two, Placement::CpuSlot(0));
        assert_eq!(pool.try_lease_cpus(2).ok(), None, "one slot is left");
        let one = pool.try_lease_cpus(1).unwrap();
        assert_eq!(one, Placement::CpuSlot(2));
        pool.release(&two);
        assert_eq!(pool.try_lease_cpus(2).ok(), Some(Placement::CpuSlot(0)));
        pool.release(&one);
        // More than the pool has is all of it, once everything else is done.
        let mut big = Pool::new(&Inventory::fake(0), 2);
        let all = big.try_lease_cpus(16).unwrap();
        assert_eq!(big.try_lease_cpus(1).ok(), None);
        big.release(&all);
        assert_eq!(big.try_lease_cpus(1).ok(), Some(Placement::CpuSlot(0)));
    }

    #[test]
    fn nvlink_connected_sets_are_preferred() {
        // 0-1 not linked; 1-3 linked; 2-3 linked.
        let inv = nvlink_pairs(4, &[(1, 3), (2, 3)]);
        let mut pool = Pool::new(&inv, 1);
        assert_eq!(
            pool.try_lease(2, "c").ok(),
            Some(Placement::Gpus(vec![1, 3]))
        );
        let inv = nvlink_pairs(4, &[(0, 2), (2, 3), (0, 3)]);
        let mut pool = Pool::new(&inv, 1);
        assert_eq!(
            pool.try_lease(3, "c").ok(),
            Some(Placement::Gpus(vec![0, 2, 3]))
        );
    }

    fn locks(dir: &std::path::Path, n: u32, manifest: &str) -> Arc<GpuLocks> {
        let d = crate::machine::lease::LockDir::from_value(Some(dir.as_os_str().to_owned()));
        let run = crate::machine::lease::Run {
            manifest: manifest.into(),
            tree: "/t".into(),
        };
        Arc::new(GpuLocks::open(&d, &Inventory::fake(n).gpus, run).unwrap())
    }

    #[test]
    fn gpus_leased_by_another_run_are_passed_over_or_waited_for() {
        let dir = tempfile::tempdir().unwrap();
        let other = locks(dir.path(), 2, "other");
        other.try_take(&[0], "theirs").unwrap();
        let mut pool =
            Pool::new(&Inventory::fake(2), 1).with_locks(Some(locks(dir.path(), 2, "m")));
        // Two GPUs are free here, but the other run leases GPU 0: a pair must wait, and
        // says for which GPU and whom.
        let Err(NotNow::Leased { gpu, blocker }) = pool.try_lease(2, "pair") else {
            panic!("a pair of which one GPU is leased elsewhere was placed")
        };
        assert_eq!(gpu, 0);
        let Blocker::Held(h) = blocker else {
            panic!("{blocker:?}")
        };
        assert_eq!((h.manifest.as_str(), h.cell.as_str()), ("other", "theirs"));
        // A single GPU cell takes the other GPU meanwhile; then a pair is short of GPUs in
        // this run (busy, not a lease wait), and one more single cell waits for GPU 0.
        assert_eq!(pool.try_lease(1, "one"), Ok(Placement::Gpus(vec![1])));
        assert_eq!(pool.try_lease(2, "pair"), Err(NotNow::Busy));
        assert!(matches!(
            pool.try_lease(1, "two"),
            Err(NotNow::Leased { gpu: 0, .. })
        ));
        pool.release(&Placement::Gpus(vec![1]));
        other.release(&[0]);
        // The freed lease is seen once the poll interval has passed.
        std::thread::sleep(LEASE_POLL);
        assert_eq!(pool.try_lease(2, "pair"), Ok(Placement::Gpus(vec![0, 1])));
        assert!(
            other.try_take(&[1], "x").is_err(),
            "the pair holds GPU 1 machine-wide"
        );
        pool.release(&Placement::Gpus(vec![0, 1]));
        other.try_take(&[0, 1], "x").unwrap();
    }

    #[test]
    fn a_lease_wait_is_said_once_and_again_when_the_holder_changes() {
        let dir = tempfile::tempdir().unwrap();
        let other = locks(dir.path(), 1, "other");
        other.try_take(&[0], "first").unwrap();
        let mut pool =
            Pool::new(&Inventory::fake(1), 1).with_locks(Some(locks(dir.path(), 1, "m")));
        let p = plan(&[&[]]);
        let mut q = ReadyQueue::default();
        q.push(CellIndex(0), 1.0, 1);
        let cells_of = |t: &Taken| -> Vec<String> {
            t.waiting
                .iter()
                .map(|w| match &w.blocker {
                    Blocker::Held(h) => format!("{} gpu {} {}", w.cell.0, w.gpu, h.cell),
                    b => format!("{b:?}"),
                })
                .collect()
        };
        let t = q.take_placeable(&mut pool, &p);
        assert!(t.started.is_empty());
        assert_eq!(cells_of(&t), ["0 gpu 0 first"]);
        std::thread::sleep(LEASE_POLL);
        assert!(
            cells_of(&q.take_placeable(&mut pool, &p)).is_empty(),
            "said once"
        );
        other.release(&[0]);
        other.try_take(&[0], "second").unwrap();
        std::thread::sleep(LEASE_POLL);
        assert_eq!(
            cells_of(&q.take_placeable(&mut pool, &p)),
            ["0 gpu 0 second"]
        );
        other.release(&[0]);
        std::thread::sleep(LEASE_POLL);
        let t = q.take_placeable(&mut pool, &p);
        assert_eq!(t.started, [(CellIndex(0), Placement::Gpus(vec![0]))]);
        assert_eq!(t.waited.len(), 1);
        assert!(
            t.waited[0].1 >= 2.0 * LEASE_POLL.as_secs_f64(),
            "{:?}",
            t.waited
        );
        assert!(q.is_empty());
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
        let p = plan(&[&[], &[], &[], &[], &[]]);
        let taken = q.take_placeable(&mut pool, &p);
        let ids: Vec<usize> = taken.started.iter().map(|(c, _)| c.0).collect();
        assert_eq!(ids, [1, 2, 4]);
        assert!(taken.waiting.is_empty());
        assert_eq!(q.len(), 2);
        // Nothing is free now: nothing starts, nothing is lost.
        assert!(q.take_placeable(&mut pool, &p).started.is_empty());
        assert_eq!(q.len(), 2);
    }

    #[test]
    fn the_countdown_makes_a_cell_ready_when_its_last_dependency_finishes() {
        // A diamond: c0 -> c1, c2 -> c3, and c4 alone.
        let p = plan(&[&[], &[0], &[0], &[1, 2], &[]]);
        let mut q = ReadyQueue::for_plan(&p);
        let ready: Vec<usize> = (0..5)
            .filter(|&i| q.waits_on_nothing(CellIndex(i)))
            .collect();
        assert_eq!(ready, [0, 4]);
        assert_eq!(q.dependents(CellIndex(0)), [CellIndex(1), CellIndex(2)]);
        assert!(q.dependents(CellIndex(3)).is_empty());
        assert!(q.count_down(CellIndex(1)));
        assert!(q.count_down(CellIndex(2)));
        // c3 needs both: the first to finish leaves it waiting, the second readies it.
        assert!(!q.count_down(CellIndex(3)));
        assert!(!q.waits_on_nothing(CellIndex(3)));
        assert!(q.count_down(CellIndex(3)));
        assert!(q.waits_on_nothing(CellIndex(3)));
        // Ready once: a count already at zero never readies a cell again.
        assert!(!q.count_down(CellIndex(3)));
        assert!(!q.count_down(CellIndex(9)));
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
                expect_fail: Vec::new(),
                info: Vec::new(),
                hermetic: false,
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
            fingerprints: Vec::new(),
            attest: Vec::new(),
            lease_timeout: None,
            cells,
            redact: Default::default(),
            notify: None,
            retention: None,
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
            .take_placeable(&mut pool, &p)
            .started
            .iter()
            .map(|(c, _)| c.0)
            .collect();
        assert_eq!(order, [0, 3, 4]);
    }
}
