//! Running a dispatch's grid: work-groups are claimed one at a time from an atomic counter by
//! the queue's packet-processor thread and by a shared pool of worker threads. The processor
//! always takes part, so a dispatch makes progress even when every worker is busy elsewhere,
//! and queues never wait on each other for workers.

use crate::kernel::{KernelFn, WorkGroup};
use parking_lot::{Condvar, Mutex};
use std::collections::VecDeque;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;

/// The geometry and code of one kernel dispatch.
#[derive(Clone, Copy)]
pub(crate) struct Grid {
    pub(crate) kernel: KernelFn,
    pub(crate) grid_size: [u32; 3],
    pub(crate) workgroup_size: [u32; 3],
    /// The kernarg address, as an integer so the job can move between threads.
    pub(crate) kernarg: usize,
    /// The address of the dispatch's counter events, 0 when it is not counted.
    pub(crate) events: usize,
}

impl Grid {
    /// Work-groups per dimension (the last group of a dimension may be partial).
    fn groups(&self) -> [u64; 3] {
        std::array::from_fn(|d| {
            u64::from(self.grid_size[d]).div_ceil(u64::from(self.workgroup_size[d].max(1)))
        })
    }

    /// Total work-groups, or `None` if the count does not fit in 64 bits.
    pub(crate) fn group_count(&self) -> Option<u64> {
        let [x, y, z] = self.groups();
        x.checked_mul(y)?.checked_mul(z)
    }
}

/// A kernel that panicked in at least one work-group.
#[derive(Debug)]
pub(crate) struct KernelPanicked;

struct GridJob {
    grid: Grid,
    groups: [u64; 3],
    total: u64,
    next: AtomicU64,
    done: AtomicU64,
    panicked: AtomicBool,
    finish: Mutex<()>,
    finished: Condvar,
}

impl GridJob {
    fn exhausted(&self) -> bool {
        self.next.load(Ordering::Relaxed) >= self.total
    }

    /// Claims and runs work-groups until none are left.
    fn work(&self) {
        loop {
            let index = self.next.fetch_add(1, Ordering::Relaxed);
            if index >= self.total {
                return;
            }
            if !self.panicked.load(Ordering::Relaxed) {
                self.run_group(index);
            }
            if self.done.fetch_add(1, Ordering::AcqRel) + 1 == self.total {
                let _guard = self.finish.lock();
                self.finished.notify_all();
            }
        }
    }

    fn run_group(&self, index: u64) {
        let [gx, gy, _] = self.groups;
        let id = [index % gx, (index / gx) % gy, index / (gx * gy)];
        // Each id is below its dimension's group count, which is at most the u32 grid size.
        let group_id = id.map(|v| u32::try_from(v).unwrap_or(u32::MAX));
        let group = WorkGroup::new(
            group_id,
            self.grid.workgroup_size,
            self.grid.grid_size,
            self.grid.kernarg as *const u8,
        )
        .with_events(self.grid.events as *const crate::counters::DispatchEvents);
        let kernel = self.grid.kernel;
        if catch_unwind(AssertUnwindSafe(|| kernel(&group))).is_err() {
            self.panicked.store(true, Ordering::Relaxed);
        }
    }

    fn wait_finished(&self) {
        let mut guard = self.finish.lock();
        while self.done.load(Ordering::Acquire) < self.total {
            self.finished.wait(&mut guard);
        }
    }
}

#[derive(Default)]
struct Shared {
    jobs: Mutex<VecDeque<Arc<GridJob>>>,
    available: Condvar,
    stop: AtomicBool,
}

/// The worker pool shared by every queue of a runtime instance.
pub(crate) struct Workers {
    shared: Arc<Shared>,
    threads: Mutex<Vec<JoinHandle<()>>>,
    count: usize,
}

impl Workers {
    /// Starts `count` worker threads (0 is allowed: processors then run grids alone).
    pub(crate) fn start(count: usize) -> Self {
        let shared = Arc::new(Shared::default());
        let threads = (0..count)
            .map(|i| {
                let shared = shared.clone();
                std::thread::Builder::new()
                    .name(format!("softhsa-worker-{i}"))
                    .spawn(move || worker_loop(&shared))
                    .expect("spawn softhsa worker thread")
            })
            .collect();
        Self {
            shared,
            threads: Mutex::new(threads),
            count,
        }
    }

    /// The number of worker threads (fixed when the pool starts).
    pub(crate) fn count(&self) -> usize {
        self.count
    }

    /// Runs every work-group of `grid` and returns once all have finished.
    pub(crate) fn run(&self, grid: Grid) -> Result<(), KernelPanicked> {
        let groups = grid.groups();
        let total = grid.group_count().unwrap_or(0);
        let job = Arc::new(GridJob {
            grid,
            groups,
            total,
            next: AtomicU64::new(0),
            done: AtomicU64::new(0),
            panicked: AtomicBool::new(false),
            finish: Mutex::new(()),
            finished: Condvar::new(),
        });
        let shared_with_workers = total > 1 && self.count > 0;
        if shared_with_workers {
            self.shared.jobs.lock().push_back(job.clone());
            self.shared.available.notify_all();
        }
        job.work();
        if shared_with_workers {
            self.shared.jobs.lock().retain(|j| !Arc::ptr_eq(j, &job));
        }
        job.wait_finished();
        if job.panicked.load(Ordering::Relaxed) {
            Err(KernelPanicked)
        } else {
            Ok(())
        }
    }

    /// Stops and joins the worker threads.
    pub(crate) fn shutdown(&self) {
        self.shared.stop.store(true, Ordering::Release);
        {
            let _jobs = self.shared.jobs.lock();
            self.shared.available.notify_all();
        }
        for thread in self.threads.lock().drain(..) {
            let _ = thread.join();
        }
    }
}

fn worker_loop(shared: &Shared) {
    loop {
        let job = {
            let mut jobs = shared.jobs.lock();
            loop {
                while jobs.front().is_some_and(|j| j.exhausted()) {
                    jobs.pop_front();
                }
                if let Some(job) = jobs.front() {
                    break job.clone();
                }
                if shared.stop.load(Ordering::Acquire) {
                    return;
                }
                shared.available.wait(&mut jobs);
            }
        };
        job.work();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU32;

    static HITS: [AtomicU32; 64] = [const { AtomicU32::new(0) }; 64];

    fn count_items(group: &WorkGroup) {
        for [x, y, _] in group.work_items() {
            HITS[(y * 8 + x) as usize].fetch_add(1, Ordering::Relaxed);
        }
    }

    fn boom(_: &WorkGroup) {
        panic!("kernel failure");
    }

    #[test]
    fn every_work_item_runs_exactly_once() {
        let workers = Workers::start(2);
        let grid = Grid {
            kernel: count_items,
            grid_size: [7, 8, 1],
            workgroup_size: [2, 3, 1],
            kernarg: 0,
            events: 0,
        };
        assert_eq!(grid.group_count(), Some(4 * 3));
        workers.run(grid).unwrap();
        for y in 0..8 {
            for x in 0..8 {
                let expected = u32::from(x < 7);
                assert_eq!(HITS[y * 8 + x].load(Ordering::Relaxed), expected, "{x},{y}");
            }
        }
        workers.shutdown();
    }

    #[test]
    fn a_panicking_kernel_is_reported() {
        let workers = Workers::start(1);
        let grid = Grid {
            kernel: boom,
            grid_size: [4, 1, 1],
            workgroup_size: [1, 1, 1],
            kernarg: 0,
            events: 0,
        };
        assert!(workers.run(grid).is_err());
        workers.shutdown();
    }
}
