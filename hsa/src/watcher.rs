//! kreplay's own thread for the completions it forwards to the application.
//!
//! A fenced async copy and a traced dispatch run with a completion signal of kreplay's; when
//! that signal reaches 0, kreplay does its bookkeeping and then decrements the application's
//! signal. The runtime's async signal handlers would do, but the runtime runs them all on one
//! thread, one at a time: an application handler that waits for such a completion (a stream
//! callback waiting for the copy it follows) would block the very thread that must deliver it.
//! So kreplay waits for its own signals on a thread of its own (`hsa_amd_signal_wait_any` over
//! every pending signal and a wake-up signal of its own) and runs what each completion does on
//! threads of its own, one more whenever a completion waits and none is free (a tool's COMPLETE
//! callback may wait for a dispatch it submitted, whose completion comes through here too). It
//! falls back to the runtime's handlers only where the waiting thread cannot be had.

use std::collections::VecDeque;

use hsa_sys::*;
use parking_lot::{Condvar, Mutex};

use crate::backend::{Backend, backend};

/// What runs once a watched signal reached 0.
type Job = Box<dyn FnOnce() + Send>;

/// How long the thread waits before it looks at its list again without being woken (a bound on
/// a wake-up missed, never relied on).
const IDLE_WAIT: std::time::Duration = std::time::Duration::from_millis(50);

/// The watched signals and the thread that waits for them.
#[derive(Default)]
pub(crate) struct Watcher {
    inner: Mutex<Inner>,
    /// The threads that run the jobs of the signals that reached 0.
    runners: Runners,
}

/// Threads that run completion jobs: one more is started whenever a job waits and none is
/// idle, so a job that blocks (a tool's COMPLETE callback waiting for a dispatch it submitted,
/// whose own completion is another job) never holds up the others; a thread idle for a while
/// beyond the first ends.
#[derive(Default)]
struct Runners {
    state: Mutex<RunnersState>,
    work: Condvar,
}

#[derive(Default)]
struct RunnersState {
    jobs: VecDeque<Job>,
    idle: usize,
    threads: usize,
}

/// How long a runner beyond the first waits for a job before it ends.
const RUNNER_IDLE: std::time::Duration = std::time::Duration::from_secs(5);

impl Runners {
    /// Runs `job` on a runner thread (on this thread if none can be started).
    fn run(&'static self, job: Job) {
        let mut state = self.state.lock();
        state.jobs.push_back(job);
        if state.jobs.len() <= state.idle {
            self.work.notify_one();
            return;
        }
        let spawned = kreplay_wtrack::threads::spawn(
            std::thread::Builder::new().name("kreplay-completion".into()),
            move || self.serve(),
        );
        match spawned {
            Ok(_) => state.threads += 1,
            Err(_) => {
                let job = state.jobs.pop_back();
                drop(state);
                if let Some(job) = job {
                    run_job(job);
                }
            }
        }
    }

    fn serve(&self) {
        let mut state = self.state.lock();
        loop {
            if let Some(job) = state.jobs.pop_front() {
                drop(state);
                run_job(job);
                state = self.state.lock();
                continue;
            }
            state.idle += 1;
            let timed_out = self.work.wait_for(&mut state, RUNNER_IDLE).timed_out();
            state.idle -= 1;
            if timed_out && state.jobs.is_empty() && state.threads > 1 {
                state.threads -= 1;
                return;
            }
        }
    }
}

/// Runs one completion job; a panic in it is reported, not spread.
fn run_job(job: Job) {
    if std::panic::catch_unwind(std::panic::AssertUnwindSafe(job)).is_err() {
        log::error!("internal error while forwarding a completion");
    }
}

#[derive(Default)]
struct Inner {
    /// Signals the thread waits for, each with what runs when it reaches 0.
    pending: Vec<(hsa_signal_t, Job)>,
    /// Rung (incremented) whenever `pending` grows; `None` until the thread is started (once).
    wake: Option<hsa_signal_t>,
    /// The thread could not be started (no signal, no thread, no `wait_any`): never again.
    unavailable: bool,
}

impl Watcher {
    /// The watcher's locks for the fork set (`crate::fork`): its signal list (held while the
    /// runtime creates and rings its wake-up signal), then the runners' queue.
    pub(crate) fn fork_locks(&self) -> [crate::fork::Lock<'_>; 2] {
        [&self.inner, &self.runners.state]
    }

    /// In the child of a fork, once the fork set's locks are unlocked again: the watcher thread
    /// and the completion threads are the parent's and do not exist here. Counted as idle, a
    /// job handed to them (the completions a gate of the forking thread held, opened in the
    /// child) would wait for them for ever; the next job starts a thread of the child's own
    /// instead, as does the next watched signal. What was pending or queued is the parent's
    /// (its completions are delivered there) and is forgotten, not run nor dropped (dropping
    /// would free memory in a fork handler).
    pub(crate) fn forget_threads_in_child(&self) {
        let mut runners = self.runners.state.lock();
        std::mem::forget(std::mem::take(&mut runners.jobs));
        runners.idle = 0;
        runners.threads = 0;
        drop(runners);
        let mut inner = self.inner.lock();
        std::mem::forget(std::mem::take(&mut inner.pending));
        inner.wake = None;
    }

    /// Runs `job` on kreplay's watcher thread once `signal` reaches 0. Gives `job` back when
    /// the thread cannot be had (the caller then uses the runtime's handler).
    pub(crate) fn on_zero(&self, b: &Backend, signal: hsa_signal_t, job: Job) -> Result<(), Job> {
        let mut inner = self.inner.lock();
        if inner.unavailable || b.original.amd().hsa_amd_signal_wait_any_fn.is_none() {
            return Err(job);
        }
        let wake = match inner.wake {
            Some(wake) => wake,
            None => {
                let Ok(wake) = b.original.signal_create(0) else {
                    inner.unavailable = true;
                    return Err(job);
                };
                let spawned = kreplay_wtrack::threads::spawn(
                    std::thread::Builder::new().name("kreplay-completions".into()),
                    move || run(wake),
                );
                if spawned.is_err() {
                    b.original.signal_destroy(wake);
                    inner.unavailable = true;
                    return Err(job);
                }
                *inner.wake.insert(wake)
            }
        };
        inner.pending.push((signal, job));
        b.original.signal_add(wake, 1);
        Ok(())
    }

    /// Runs `job` now on a completion thread of kreplay's own (on this thread if none can be
    /// started), as a completion whose signal reached 0 runs.
    pub(crate) fn run_now(&'static self, job: Job) {
        self.runners.run(job);
    }

    /// The jobs whose signal reached 0, taken off the list.
    fn take_done(&self, b: &Backend) -> Vec<Job> {
        let mut inner = self.inner.lock();
        let mut done = Vec::new();
        let mut i = 0;
        while i < inner.pending.len() {
            if b.original.signal_load(inner.pending[i].0) == 0 {
                done.push(inner.pending.swap_remove(i).1);
            } else {
                i += 1;
            }
        }
        done
    }
}

/// The watcher thread: waits for any pending signal to reach 0 or for the wake-up signal to
/// move, runs the jobs whose signal reached 0 (outside the lock, in no particular order), and
/// waits again.
fn run(wake: hsa_signal_t) {
    let b = backend();
    let watcher: &Watcher = &b.watcher;
    let mut signals: Vec<hsa_signal_t> = Vec::new();
    let mut conds: Vec<hsa_signal_condition_t> = Vec::new();
    let mut values: Vec<hsa_signal_value_t> = Vec::new();
    loop {
        for job in watcher.take_done(b) {
            watcher.runners.run(job);
        }
        let seen = b.original.signal_load(wake);
        signals.clear();
        conds.clear();
        values.clear();
        signals.push(wake);
        conds.push(HSA_SIGNAL_CONDITION_NE);
        values.push(seen);
        for (signal, _) in &watcher.inner.lock().pending {
            signals.push(*signal);
            conds.push(HSA_SIGNAL_CONDITION_EQ);
            values.push(0);
        }
        let asked = std::time::Instant::now();
        let answer =
            b.original
                .signal_wait_any(&mut signals, &mut conds, &mut values, b.ticks(IDLE_WAIT));
        // No signal that holds, long before the timeout: the runtime refused the wait (the
        // application shut it down, or a signal is gone). Asking again at once would spin for
        // the rest of the process; wait out the interval first.
        if answer.is_none_or(|i| i as usize >= signals.len()) && asked.elapsed() < IDLE_WAIT / 2 {
            std::thread::sleep(IDLE_WAIT);
        }
    }
}

/// The argument of a completion handler, handed to the watcher thread.
struct HandlerArg(*mut std::ffi::c_void);

// SAFETY: the argument is a leaked box that the handler alone takes back, once, on whichever
// thread runs it (as the runtime's handler thread would).
unsafe impl Send for HandlerArg {}

/// A completion handler as the runtime takes one: `handler(0, arg)` must return false (it runs
/// once) and take `arg` back.
type Handler = unsafe extern "C" fn(hsa_signal_value_t, *mut std::ffi::c_void) -> bool;

/// `handler(0, arg)` as a job for the watcher.
fn job_of(handler: Handler, arg: *mut std::ffi::c_void) -> Job {
    let sent = HandlerArg(arg);
    Box::new(move || {
        let arg = sent;
        // SAFETY: the handler's own contract: its leaked argument, run once, here.
        unsafe { handler(0, arg.0) };
    })
}

/// Runs `handler(0, arg)` once `signal` reaches 0: on kreplay's watcher thread, or else as the
/// runtime's async handler.
pub(crate) fn when_zero(
    b: &Backend,
    signal: hsa_signal_t,
    handler: Handler,
    arg: *mut std::ffi::c_void,
) -> hsa_status_t {
    match b.watcher.on_zero(b, signal, job_of(handler, arg)) {
        Ok(()) => HSA_STATUS_SUCCESS,
        // The job was not kept and never runs: the runtime's handler takes `arg` instead.
        Err(_) => {
            b.original
                .signal_async_handler(signal, HSA_SIGNAL_CONDITION_EQ, 0, Some(handler), arg)
        }
    }
}

/// Runs `handler(0, arg)` once `signal` reaches 0, never on the runtime's async-handler thread
/// (which a replay may be blocking): on kreplay's watcher thread, or else on a thread of its
/// own that waits for that signal. False when neither could be had (`arg` is the caller's
/// still).
pub(crate) fn when_zero_off_runtime(
    b: &Backend,
    signal: hsa_signal_t,
    handler: Handler,
    arg: *mut std::ffi::c_void,
) -> bool {
    let Err(job) = b.watcher.on_zero(b, signal, job_of(handler, arg)) else {
        return true;
    };
    kreplay_wtrack::threads::spawn(
        std::thread::Builder::new().name("kreplay-completion".into()),
        move || {
            backend().original.signal_wait_eq(signal, 0, u64::MAX);
            job();
        },
    )
    .is_ok()
}
