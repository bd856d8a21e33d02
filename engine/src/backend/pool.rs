//! The CPU pass's threads: the caller of a pass and `threads - 1` workers that take the tasks
//! of its parallel regions, and wait for the next region awake.
//!
//! A decode step at B=1 is about five regions a layer (q/k/v, attention, the output
//! projection, gate/up, down) with a few microseconds of one-thread work between them (the
//! norm, the quantization, SwiGLU). rayon's idle worker yields about 32 rounds and then
//! sleeps, so at two threads nearly every region began with a futex wake: measured on the
//! 2-core development machine, 2–8 µs a region against a worker that waits awake, about
//! 150 regions a token. Here a worker that finds no region spins for [`SPIN_FOR`] (longer
//! than the gaps inside a pass), then yields [`YIELD_ROUNDS`] times, then parks until the
//! next region: back-to-back regions find it awake, and an idle backend costs nothing.
//! rayon has no setting for its idle rounds, and the scoped pools of crates.io sleep on a
//! lock between jobs, hence this small one.
//!
//! [`Pool::each`] hands every item of a slice to exactly one task and returns when all
//! tasks are done. A worker joins a region only while it is open: one that wakes late (parked,
//! or descheduled by the host) finds it closed and leaves it alone, so the caller never waits
//! for a sleeper, only for tasks already taken. A task that panics is caught on its worker
//! and raised again on the caller after the region.
//!
//! One caller at a time runs a region over the threads (the backend's `&mut self` pass): a
//! region started while another is running (from another thread, or from inside a task) runs
//! on its own caller's thread, item after item.
//!
//! The pool starts as many workers as it is asked for, up to [`MAX_THREADS`] in all, and
//! stops at the first the system refuses. More threads than the CPUs the process may run on
//! spin against each other and slow a pass down; the backend's default is one per CPU.

use std::any::Any;
use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::{JoinHandle, Thread};
use std::time::{Duration, Instant};

/// How long a worker with nothing to do spins before it starts yielding: longer than the
/// one-thread gaps between a pass's regions (tens of microseconds), short enough that a
/// backend between passes gives its cores back at once.
const SPIN_FOR: Duration = Duration::from_micros(200);

/// The most threads a pool runs on, the caller included.
pub(crate) const MAX_THREADS: usize = 1024;

/// `yield_now` calls after the spin, before the worker parks.
const YIELD_ROUNDS: u32 = 16;

/// The region being run: `n` tasks of `task`, on the caller's stack.
struct Region<'a> {
    n: usize,
    task: &'a (dyn Fn(usize) + Sync),
}

struct Shared {
    /// The id of the open region (ids count up from 1), or 0 between regions.
    open: AtomicUsize,
    /// The open region, a `*const Region` valid while `open` holds its id and until `active`
    /// drops to zero after that.
    region: AtomicPtr<()>,
    /// The next task index to take.
    next: AtomicUsize,
    /// Workers inside a region (checking it is open, or running its tasks).
    active: AtomicUsize,
    /// Workers parked, or about to park, waiting for a region.
    sleepers: AtomicUsize,
    /// The first panic of a task on a worker, raised again on the caller.
    panic: Mutex<Option<Box<dyn Any + Send>>>,
    /// Set while a caller runs a region: a second caller (another thread, or a task) runs
    /// its region on itself instead.
    busy: AtomicBool,
    /// The last region id handed out.
    last_id: AtomicUsize,
    stop: AtomicBool,
}

/// See the module documentation.
pub(crate) struct Pool {
    shared: Arc<Shared>,
    threads: Vec<Thread>,
    workers: Vec<JoinHandle<()>>,
}

/// A pointer to the items of a region, shared by its tasks; task `i` alone touches item `i`.
struct Items<U>(*mut U);

// SAFETY: the items are `Send` and every task reaches a different one (see `Pool::each`), so
// sharing the base pointer between threads hands each item to one thread only.
unsafe impl<U: Send> Sync for Items<U> {}

impl Pool {
    /// A pool of `threads` threads in all (1 to [`MAX_THREADS`]; 0 counts as 1): the caller and
    /// `threads - 1` workers (none for one thread, when every region runs on the caller). When
    /// the system refuses to start a worker, no more are tried; the regions still run, on the
    /// threads started.
    pub(crate) fn new(threads: usize) -> Pool {
        let shared = Arc::new(Shared {
            open: AtomicUsize::new(0),
            region: AtomicPtr::new(std::ptr::null_mut()),
            next: AtomicUsize::new(0),
            active: AtomicUsize::new(0),
            sleepers: AtomicUsize::new(0),
            panic: Mutex::new(None),
            busy: AtomicBool::new(false),
            last_id: AtomicUsize::new(0),
            stop: AtomicBool::new(false),
        });
        let workers: Vec<JoinHandle<()>> = (1..threads.clamp(1, MAX_THREADS))
            .map_while(|i| {
                let s = shared.clone();
                std::thread::Builder::new()
                    .name(format!("memra-cpu-{i}"))
                    .spawn(move || worker(&s))
                    .ok()
            })
            .collect();
        Pool {
            shared,
            threads: workers.iter().map(|w| w.thread().clone()).collect(),
            workers,
        }
    }

    /// The threads a region runs on, the caller included.
    pub(crate) fn threads(&self) -> usize {
        self.workers.len() + 1
    }

    /// Runs `f(i, &mut items[i])` for every item, over the caller and the workers, and
    /// returns when every call is done: the error of the lowest-numbered failing item, if any.
    /// A panic in a call is raised again here once no thread is inside the region any more
    /// (on the inline path at once, the items after it not run).
    pub(crate) fn each<U: Send, E: Send>(
        &self,
        items: &mut [U],
        f: impl Fn(usize, &mut U) -> Result<(), E> + Sync,
    ) -> Result<(), E> {
        let failed: Mutex<Option<(usize, E)>> = Mutex::new(None);
        let base = Items(items.as_mut_ptr());
        let base = &base;
        let task = |i: usize| {
            // SAFETY: `i < items.len()` (the region has that many tasks), each index is taken
            // by exactly one task (`next` counts up once per take), and `items` stays
            // borrowed for the whole region, so this is the only reference to item `i`.
            let item = unsafe { &mut *base.0.add(i) };
            if let Err(e) = f(i, item) {
                let mut slot = failed.lock().unwrap_or_else(PoisonError::into_inner);
                if slot.as_ref().is_none_or(|(j, _)| i < *j) {
                    *slot = Some((i, e));
                }
            }
        };
        self.run(items.len(), &task);
        match failed.into_inner().unwrap_or_else(PoisonError::into_inner) {
            Some((_, e)) => Err(e),
            None => Ok(()),
        }
    }

    /// Runs `task(i)` for every `i` in `0..n`; see [`Pool::each`].
    fn run(&self, n: usize, task: &(dyn Fn(usize) + Sync)) {
        let s = &*self.shared;
        if self.workers.is_empty() || n <= 1 || s.busy.swap(true, Ordering::Acquire) {
            (0..n).for_each(task);
            return;
        }
        let region = Region { n, task };
        let id = s.last_id.load(Ordering::Relaxed).wrapping_add(1).max(1);
        s.last_id.store(id, Ordering::Relaxed);
        // A panic left by a region that unwound on the caller is not this region's. Taken out
        // under the lock and dropped outside it, where a payload whose drop panics is caught.
        let stale = s
            .panic
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        drop_quietly(stale);
        s.next.store(0, Ordering::Relaxed);
        s.region
            .store(&region as *const Region as *mut (), Ordering::Relaxed);
        // SeqCst with the workers' `sleepers` increment and `open` load: either a worker
        // about to park sees this region, or this load sees it parking and unparks it.
        s.open.store(id, Ordering::SeqCst);
        if s.sleepers.load(Ordering::SeqCst) > 0 {
            for t in &self.threads {
                t.unpark();
            }
        }
        // The region lives on this stack: whatever happens below, close it and wait for
        // every worker inside it before this frame is left.
        struct Close<'a>(&'a Shared);
        impl Drop for Close<'_> {
            fn drop(&mut self) {
                // SeqCst with the workers' `active` increment and `open` check: a worker
                // counted after this load has not read the region and will find it closed.
                self.0.open.store(0, Ordering::SeqCst);
                let mut round = 0u32;
                while self.0.active.load(Ordering::SeqCst) != 0 {
                    round += 1;
                    if round.is_multiple_of(1024) {
                        std::thread::yield_now();
                    } else {
                        std::hint::spin_loop();
                    }
                }
                self.0.busy.store(false, Ordering::Release);
            }
        }
        let close = Close(s);
        take_tasks(s, &region);
        drop(close);
        let panic = s
            .panic
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(p) = panic {
            resume_unwind(p);
        }
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        for t in &self.threads {
            t.unpark();
        }
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

/// Takes tasks of `region` until none is left.
fn take_tasks(s: &Shared, region: &Region) {
    loop {
        let i = s.next.fetch_add(1, Ordering::Relaxed);
        if i >= region.n {
            return;
        }
        (region.task)(i);
    }
}

/// A worker: waits for each region (spinning, then yielding, then parked), takes its tasks
/// while it is open, leaves it.
fn worker(s: &Shared) {
    let mut seen = 0usize;
    loop {
        let Some(id) = wait_for_region(s, seen) else {
            return;
        };
        seen = id;
        s.active.fetch_add(1, Ordering::SeqCst);
        if s.open.load(Ordering::SeqCst) == id {
            // SAFETY: the region's id is still open after this worker was counted active, so
            // the caller has not closed it and will not leave `run` (where `region` lives)
            // before `active` drops back, below.
            let region = unsafe { &*(s.region.load(Ordering::Relaxed) as *const Region) };
            if let Err(p) = catch_unwind(AssertUnwindSafe(|| take_tasks(s, region))) {
                let mut slot = s.panic.lock().unwrap_or_else(PoisonError::into_inner);
                let extra = if slot.is_none() {
                    *slot = Some(p);
                    None
                } else {
                    Some(p)
                };
                drop(slot);
                drop_quietly(extra);
            }
        }
        s.active.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Drops a panic payload, catching a panic its own drop raises: a worker must get back to
/// its `active` count, and a caller to its region's guard.
fn drop_quietly(p: Option<Box<dyn Any + Send>>) {
    if let Some(p) = p {
        let _ = catch_unwind(AssertUnwindSafe(move || drop(p)));
    }
}

/// Waits until a region other than `seen` is open and returns its id, or `None` once the pool
/// is stopping.
fn wait_for_region(s: &Shared, seen: usize) -> Option<usize> {
    let fresh = |id: usize| id != 0 && id != seen;
    let start = Instant::now();
    let mut round = 0u32;
    let mut yields = 0u32;
    loop {
        let id = s.open.load(Ordering::Acquire);
        if fresh(id) {
            return Some(id);
        }
        if s.stop.load(Ordering::Relaxed) {
            return None;
        }
        round = round.wrapping_add(1);
        if !round.is_multiple_of(64) || start.elapsed() < SPIN_FOR {
            std::hint::spin_loop();
        } else if yields < YIELD_ROUNDS {
            yields += 1;
            std::thread::yield_now();
        } else {
            s.sleepers.fetch_add(1, Ordering::SeqCst);
            if !fresh(s.open.load(Ordering::SeqCst)) && !s.stop.load(Ordering::SeqCst) {
                std::thread::park();
            }
            s.sleepers.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_item_is_handed_to_one_task_over_many_regions() {
        for threads in [1, 2, 3, 5] {
            let pool = Pool::new(threads);
            assert_eq!(pool.threads(), threads);
            for n in [0usize, 1, 2, 7, 64, 300] {
                let mut hits = vec![0u32; n];
                for _ in 0..40 {
                    pool.each(&mut hits, |_, h| {
                        *h += 1;
                        Ok::<(), ()>(())
                    })
                    .unwrap();
                }
                assert!(
                    hits.iter().all(|&h| h == 40),
                    "{threads} threads, {n} items"
                );
            }
        }
    }

    #[test]
    fn a_parked_worker_wakes_for_the_next_region() {
        let pool = Pool::new(2);
        let mut a = vec![0usize; 16];
        pool.each(&mut a, |i, v| {
            *v = i;
            Ok::<(), ()>(())
        })
        .unwrap();
        // Long past the spin and the yields: the worker is parked.
        std::thread::sleep(Duration::from_millis(50));
        let seen = Mutex::new(std::collections::HashSet::new());
        let start = Instant::now();
        pool.each(&mut a, |i, v| {
            *v += i;
            seen.lock().unwrap().insert(std::thread::current().id());
            // Each task waits (up to 10 s, for a loaded machine) until both threads have
            // taken one: the caller alone cannot finish the region early.
            while seen.lock().unwrap().len() < 2 && start.elapsed() < Duration::from_secs(10) {
                std::thread::sleep(Duration::from_millis(1));
            }
            Ok::<(), ()>(())
        })
        .unwrap();
        assert_eq!(a, (0..16).map(|i| 2 * i).collect::<Vec<_>>());
        assert_eq!(
            seen.into_inner().unwrap().len(),
            2,
            "both threads took tasks"
        );
    }

    #[test]
    fn a_region_started_inside_a_task_runs_on_that_task_s_thread() {
        let pool = Pool::new(3);
        let mut outer = vec![vec![(0u32, None); 10]; 6];
        let mut outer_threads = vec![None; 6];
        let mut both: Vec<_> = outer.iter_mut().zip(outer_threads.iter_mut()).collect();
        pool.each(&mut both, |i, (inner, at)| {
            **at = Some(std::thread::current().id());
            pool.each(inner, |j, (v, t)| {
                *v = (i * 10 + j) as u32;
                *t = Some(std::thread::current().id());
                Ok::<(), ()>(())
            })
        })
        .unwrap();
        for (inner, at) in outer.iter().zip(&outer_threads) {
            assert!(at.is_some() && inner.iter().all(|(_, t)| t == at));
        }
        let flat: Vec<u32> = outer.into_iter().flatten().map(|(v, _)| v).collect();
        assert_eq!(flat, (0..60).collect::<Vec<_>>());
    }

    /// A region where the tasks `fails` picks panic (one, or several on both threads) panics
    /// its caller, and the next region runs every item, 20 times over.
    #[test]
    fn a_panicking_task_panics_the_caller_and_the_next_region_is_clean() {
        let pool = Pool::new(2);
        let patterns: [&(dyn Fn(usize) -> bool + Sync); 2] = [&|i| i == 50, &|i| i % 16 == 15];
        for fails in patterns {
            for _ in 0..20 {
                let mut items = vec![0u8; 64];
                let r = catch_unwind(AssertUnwindSafe(|| {
                    pool.each(&mut items, |i, _| {
                        // Slow enough that both threads are inside the region.
                        std::thread::sleep(Duration::from_micros(200));
                        assert!(!fails(i), "task {i}");
                        Ok::<(), ()>(())
                    })
                }));
                assert!(r.is_err());
                let mut n = vec![0u8; 64];
                pool.each(&mut n, |_, v| {
                    *v = 1;
                    Ok::<(), ()>(())
                })
                .unwrap();
                assert!(n.iter().all(|&v| v == 1));
            }
        }
    }

    #[test]
    fn a_thread_count_past_the_cap_starts_the_cap() {
        assert_eq!(Pool::new(0).threads(), 1);
        // At most the cap (a system may refuse threads before it).
        let threads = Pool::new(MAX_THREADS + 5).threads();
        assert!((2..=MAX_THREADS).contains(&threads), "{threads} threads");
    }

    #[test]
    fn the_lowest_failing_item_is_reported() {
        let pool = Pool::new(2);
        let mut items = vec![0u8; 100];
        let err = pool
            .each(&mut items, |i, _| if i % 7 == 3 { Err(i) } else { Ok(()) })
            .unwrap_err();
        assert_eq!(err, 3);
    }
}
