//! Copy engines for `hsa_amd_memory_async_copy`: one thread per engine (an agent and a copy
//! direction, numbered by the caller), started on first use.
//! Each engine runs its copies in submission order; a copy waits until all its dependency
//! signals are 0, copies, then decrements its completion signal by one.

use crate::runtime::join_unless_current;
use crate::signal::{Order, Signal};
use crate::time::now_ticks;
use crate::wake::{WakeList, block_until};
use parking_lot::{Condvar, Mutex};
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::{JoinHandle, Thread};

/// One queued copy.
pub(crate) struct CopyJob {
    pub(crate) deps: Vec<Arc<Signal>>,
    pub(crate) completion: Arc<Signal>,
    /// Record start/end on the completion signal (`hsa_amd_profiling_async_copy_enable`).
    pub(crate) profile: bool,
    /// Moves the bytes.
    pub(crate) work: Box<dyn FnOnce() + Send>,
    /// How many completions the copy reports on `completion` once it ran (a batch's operations;
    /// 1 for a single copy).
    pub(crate) completions: u32,
}

#[derive(Default)]
struct EngineShared {
    jobs: Mutex<VecDeque<CopyJob>>,
    available: Condvar,
    stop: AtomicBool,
}

struct Engine {
    shared: Arc<EngineShared>,
    thread: Thread,
    handle: Mutex<Option<JoinHandle<()>>>,
}

/// The copy engines of one runtime instance, keyed by engine number.
#[derive(Default)]
pub(crate) struct CopyEngines {
    engines: Mutex<HashMap<usize, Arc<Engine>>>,
    stopped: AtomicBool,
}

impl CopyEngines {
    /// Queues `job` on engine `number`; returns before the copy runs.
    pub(crate) fn submit(&self, number: usize, job: CopyJob) -> Result<(), hsa_sys::hsa_status_t> {
        crate::faults::check(crate::faults::Fault::AsyncCopy)?;
        let engine = {
            let mut engines = self.engines.lock();
            if self.stopped.load(Ordering::Acquire) {
                return Err(hsa_sys::HSA_STATUS_ERROR_NOT_INITIALIZED);
            }
            match engines.get(&number) {
                Some(engine) => engine.clone(),
                None => {
                    let engine = Arc::new(start_engine(number)?);
                    engines.insert(number, engine.clone());
                    engine
                }
            }
        };
        engine.shared.jobs.lock().push_back(job);
        engine.shared.available.notify_one();
        Ok(())
    }

    /// Stops and joins every engine; queued copies that have not started are dropped.
    pub(crate) fn shutdown(&self) {
        let engines: Vec<Arc<Engine>> = {
            let mut engines = self.engines.lock();
            self.stopped.store(true, Ordering::Release);
            engines.drain().map(|(_, e)| e).collect()
        };
        for engine in engines {
            engine.shared.stop.store(true, Ordering::Release);
            {
                let _jobs = engine.shared.jobs.lock();
                engine.shared.available.notify_all();
            }
            engine.thread.unpark();
            if let Some(handle) = engine.handle.lock().take() {
                join_unless_current(handle);
            }
        }
    }
}

fn start_engine(number: usize) -> Result<Engine, hsa_sys::hsa_status_t> {
    let shared = Arc::new(EngineShared::default());
    let worker = shared.clone();
    let handle = std::thread::Builder::new()
        .name(format!("softhsa-copy-{number}"))
        .spawn(move || engine_loop(&worker))
        .map_err(|_| hsa_sys::HSA_STATUS_ERROR_OUT_OF_RESOURCES)?;
    Ok(Engine {
        shared,
        thread: handle.thread().clone(),
        handle: Mutex::new(Some(handle)),
    })
}

fn engine_loop(shared: &EngineShared) {
    loop {
        let job = {
            let mut jobs = shared.jobs.lock();
            loop {
                if shared.stop.load(Ordering::Acquire) {
                    return;
                }
                if let Some(job) = jobs.pop_front() {
                    break job;
                }
                shared.available.wait(&mut jobs);
            }
        };
        let lists: Vec<&WakeList> = job.deps.iter().map(|s| &s.wake).collect();
        let ready = block_until(&lists, None, false, || {
            if shared.stop.load(Ordering::Acquire) {
                Some(false)
            } else if job.deps.iter().all(|s| s.load(Order::Acquire) == 0) {
                Some(true)
            } else {
                None
            }
        });
        if ready != Some(true) {
            return;
        }
        crate::faults::delay(crate::faults::Fault::AsyncCopyDelay, || {
            shared.stop.load(Ordering::Acquire)
        });
        let start = now_ticks();
        (job.work)();
        if job.profile {
            job.completion.record_copy_time(start, now_ticks());
        }
        for _ in 0..job.completions {
            job.completion.complete_one();
        }
    }
}
