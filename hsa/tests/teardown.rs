//! The application tearing things down on another thread while one of its dispatches is being
//! replayed: memory, queues, signals. The tool holds the replay at PASS ENTER of pass 1 until
//! the other thread has done its part, so the window is deterministic. Whatever the other
//! thread does, the replayed buffer ends as one run leaves it, the application's completion
//! fires once, nothing hangs and the process keeps running.

#[allow(dead_code)]
#[macro_use]
mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use hsa_sys::hsa_signal_t;
use kreplay_hsa::InstallOptions;
use kreplay_passloop::{LoopEnd, ReplayOutcome};
use kreplay_snapshot::{RestoreStrategy, SnapshotConfig};
use kreplay_softhsa::WorkGroup;
use parking_lot::Mutex;
use support::app::{self, App, Aql, Pools, Ptr, Queue};
use support::counted::{AddOneArgs, add_one};
use support::tool::{Script, TestHooks};

/// Set when the replay reached PASS ENTER of pass 1.
static HELD: AtomicBool = AtomicBool::new(false);
/// Set by the scenario once the other thread did its part.
static RELEASE: AtomicBool = AtomicBool::new(false);

const PASSES: u64 = 3;
const LEN: u32 = 1024;

struct Env {
    app: App,
    hooks: Arc<TestHooks>,
    pools: Pools,
}

fn setup(strategy: RestoreStrategy) -> Env {
    let hooks = TestHooks::new(0);
    let app = app::install(
        hooks.clone(),
        InstallOptions {
            snapshot: SnapshotConfig::default().with_strategy(strategy),
            ..Default::default()
        },
    );
    hooks.configure_replay(true);
    // Every dispatch is replayed in PASSES passes; the first one is held at pass 1.
    hooks.set_script(Script::passes(PASSES).on_pass_enter(|_, _, pass, _| {
        if pass == 1 && !HELD.swap(true, Ordering::SeqCst) {
            assert!(
                support::wait_flag(&RELEASE),
                "the scenario never released the replay"
            );
        }
    }));
    let pools = app.pools(app.gpus[0]);
    Env { app, hooks, pools }
}

fn values(len: u32) -> Vec<u32> {
    (0..len).map(|i| i * 3 + 1).collect()
}

fn plus_one(v: &[u32]) -> Vec<u32> {
    v.iter().map(|x| x + 1).collect()
}

impl Env {
    fn add(&self, buf: Ptr, done: hsa_signal_t) -> Aql {
        let kernarg = self.app.kernargs(
            &self.pools,
            AddOneArgs {
                buf: buf.0,
                len: LEN,
                pad: 0,
            },
        );
        let kernel = kreplay_softhsa::register_kernel("teardown_add_one", add_one);
        Aql::dispatch(kernel, LEN, 64, kernarg, done)
    }

    /// Dispatches `add_one` over a fresh buffer on `queue` from a thread of its own, waits
    /// until its replay is held at pass 1, runs `during` on this thread, releases the replay
    /// and checks the buffer, the completion and the outcome. Returns the outcome.
    fn held_replay(
        &self,
        queue: Queue,
        done: hsa_signal_t,
        during: impl FnOnce(),
    ) -> ReplayOutcome {
        let init = values(LEN);
        let buf = self.app.buffer(self.pools.coarse, &init);
        let packet = self.add(buf, done);
        let app = self.app;
        let submitter = std::thread::spawn(move || app.dispatch(queue, packet));
        assert!(support::wait_flag(&HELD), "the replay never reached pass 1");
        during();
        RELEASE.store(true, Ordering::SeqCst);
        support::bounded(
            Duration::from_secs(10),
            vec![Box::new(move || submitter.join().is_ok())],
        )
        .into_iter()
        .for_each(|joined| assert!(joined, "the submitting thread panicked"));
        let id = self
            .hooks
            .configured_dispatches()
            .first()
            .expect("the dispatch reached CONFIG ENTER")
            .dispatch_id;
        let outcome = self.hooks.finished_record(id).outcome;
        assert_eq!(
            self.app.read(buf, LEN as usize),
            plus_one(&init),
            "{outcome:?}"
        );
        outcome
    }

    /// The application keeps running: another dispatch is replayed and adds exactly one.
    fn still_replays(&self) {
        let init = values(LEN);
        let buf = self.app.buffer(self.pools.coarse, &init);
        let queue = self.app.queue(self.app.gpus[0]);
        let done = self.app.signal(1);
        self.app.dispatch(queue, self.add(buf, done));
        assert_eq!(self.app.wait_zero(done), 0);
        assert_eq!(self.app.read(buf, LEN as usize), plus_one(&init));
    }
}

/// Runs `work` on a thread of its own and fails (instead of hanging) when it does not finish
/// within a few seconds while the replay is held: what the application does on another thread
/// must not wait for a replay that waits for the tool.
fn promptly<T: Send + 'static>(what: &str, work: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(work());
    });
    rx.recv_timeout(Duration::from_secs(3))
        .unwrap_or_else(|_| panic!("{what} waited for the held replay"))
}

fn replayed(outcome: &ReplayOutcome) -> bool {
    matches!(
        outcome,
        ReplayOutcome::Replayed {
            passes: PASSES,
            end: LoopEnd::LastPass,
            ..
        }
    )
}

fn free_in_footprint_and_reuse(strategy: RestoreStrategy) {
    let env = setup(strategy);
    let other = values(LEN);
    let victim = env.app.buffer(env.pools.coarse, &other);
    let queue = env.app.queue(env.app.gpus[0]);
    let done = env.app.signal(1);
    let fresh: Arc<Mutex<Option<Ptr>>> = Arc::default();
    let (app, pools, f) = (env.app, env.pools, fresh.clone());
    let outcome = env.held_replay(queue, done, move || {
        promptly("a free of snapshotted memory", move || {
            app.free(victim);
            let p = app.alloc(pools.coarse, LEN as usize * 4);
            // A CPU store into memory allocated after the free: no restore may write there.
            // SAFETY: softhsa's coarse memory is host memory; `p` holds LEN u32s.
            unsafe {
                std::slice::from_raw_parts_mut(p.0 as *mut u32, LEN as usize).fill(0x5a5a_5a5a)
            };
            *f.lock() = Some(p);
        });
    });
    assert!(replayed(&outcome), "{outcome:?}");
    assert_eq!(env.app.wait_zero(done), 0);
    let fresh = fresh.lock().expect("allocated");
    assert_eq!(
        env.app.read(fresh, LEN as usize),
        vec![0x5a5a_5a5a; LEN as usize]
    );
    env.still_replays();
}

/// The application, for its queue error callback.
static APP: std::sync::OnceLock<App> = std::sync::OnceLock::new();
/// Set once the application's queue error callback destroyed its queue.
static DESTROYED_IN_CALLBACK: AtomicBool = AtomicBool::new(false);

/// A queue error callback that destroys the queue that failed, as an application giving up on
/// it would.
unsafe extern "C" fn destroy_on_error(
    _: hsa_sys::hsa_status_t,
    queue: *mut hsa_sys::hsa_queue_t,
    _: *mut std::ffi::c_void,
) {
    let app = APP.get().expect("the application");
    app.destroy_queue(Queue(queue));
    DESTROYED_IN_CALLBACK.store(true, Ordering::SeqCst);
}

/// A kernel that faults (softhsa puts its queue into the error state).
fn faulting(_: &WorkGroup) {
    panic!("simulated GPU memory fault");
}

/// CPU time (clock ticks) the threads whose name starts with `prefix` used so far.
fn cpu_ticks(prefix: &str) -> u64 {
    let mut total = 0;
    for task in std::fs::read_dir("/proc/self/task").expect("/proc/self/task") {
        let path = task.expect("a task").path();
        let (Ok(name), Ok(stat)) = (
            std::fs::read_to_string(path.join("comm")),
            std::fs::read_to_string(path.join("stat")),
        ) else {
            continue;
        };
        if !name.starts_with(prefix) {
            continue;
        }
        // Fields after the parenthesized name: state is the 3rd field, utime the 14th.
        let fields: Vec<&str> = stat[stat.rfind(')').expect("a stat line") + 2..]
            .split(' ')
            .collect();
        total += fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    }
    total
}

/// Set by the cancelled thread once its doorbell store returned.
static RETURNED: AtomicBool = AtomicBool::new(false);

/// What the application's raw thread dispatches.
struct Submission {
    app: App,
    queue: Queue,
    packet: Aql,
}

/// The application's thread (a plain pthread, as a C application's): dispatches, then turns
/// cancellation off so that the request made meanwhile does not act in this test's own code.
extern "C" fn cancellable(arg: *mut std::ffi::c_void) -> *mut std::ffi::c_void {
    // SAFETY: `arg` is the leaked `Submission` made for this thread.
    let submission = unsafe { &*arg.cast::<Submission>() };
    submission.app.dispatch(submission.queue, submission.packet);
    // SAFETY: plain calls on this thread's own cancellation state.
    unsafe { pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, std::ptr::null_mut()) };
    RETURNED.store(true, Ordering::SeqCst);
    std::ptr::null_mut()
}

/// glibc's and musl's value.
const PTHREAD_CANCEL_DISABLE: libc::c_int = 1;

unsafe extern "C" {
    fn pthread_cancel(thread: libc::pthread_t) -> libc::c_int;
    fn pthread_setcancelstate(state: libc::c_int, old: *mut libc::c_int) -> libc::c_int;
}

fn freed_between_plan_and_copy(strategy: RestoreStrategy) {
    let env = setup(strategy);
    let snapshot_held = Arc::new(AtomicBool::new(false));
    let held = snapshot_held.clone();
    env.hooks
        .set_script(Script::passes(PASSES).on_snapshot(move |_, _, phase| {
            if phase == kreplay_passloop::Phase::Enter && !held.swap(true, Ordering::SeqCst) {
                assert!(
                    support::wait_flag(&RELEASE),
                    "the scenario never released the replay"
                );
            }
        }));
    let victim = env.app.buffer(env.pools.coarse, &values(LEN));
    let init = values(LEN);
    let buf = env.app.buffer(env.pools.coarse, &init);
    let queue = env.app.queue(env.app.gpus[0]);
    let done = env.app.signal(1);
    let packet = env.add(buf, done);
    let app = env.app;
    let submitter = std::thread::spawn(move || app.dispatch(queue, packet));
    assert!(
        support::wait_flag(&snapshot_held),
        "the replay never reached SNAPSHOT ENTER"
    );
    let pools = env.pools;
    let fresh = promptly("a free of planned memory", move || {
        app.free(victim);
        let p = app.alloc(pools.coarse, LEN as usize * 4);
        // SAFETY: softhsa's coarse memory is host memory; `p` holds LEN u32s.
        unsafe { std::slice::from_raw_parts_mut(p.0 as *mut u32, LEN as usize).fill(0x5a5a_5a5a) };
        p
    });
    RELEASE.store(true, Ordering::SeqCst);
    assert!(promptly("the replay", move || submitter.join().is_ok()));
    assert_eq!(env.app.wait_zero(done), 0);
    assert_eq!(env.app.read(buf, LEN as usize), plus_one(&init));
    assert_eq!(
        env.app.read(fresh, LEN as usize),
        vec![0x5a5a_5a5a; LEN as usize]
    );
    let id = env.hooks.configured_dispatches()[0].dispatch_id;
    let outcome = env.hooks.finished_record(id).outcome;
    assert!(replayed(&outcome), "{outcome:?}");
    env.still_replays();
}

/// What an application object kept per thread dispatches when the thread ends.
struct AtThreadExit {
    app: App,
    queue: Queue,
    buf: Ptr,
    done: hsa_signal_t,
    kernarg: Ptr,
}

thread_local! {
    /// Filled before the thread's first dispatch, so that its destructor is registered before
    /// any of kreplay's thread-locals and runs after they were destroyed.
    static FLUSH_AT_EXIT: std::cell::RefCell<Option<AtThreadExit>> = const { std::cell::RefCell::new(None) };
}

impl Drop for AtThreadExit {
    fn drop(&mut self) {
        let kernel = kreplay_softhsa::register_kernel("teardown_add_one", add_one);
        self.app.dispatch(
            self.queue,
            Aql::dispatch(kernel, LEN, 64, self.kernarg, self.done),
        );
        let _ = self.buf;
    }
}

scenarios! {
    /// Another thread frees a buffer the held replay snapshotted and allocates one of the same
    /// size (which may get its address): the free does not wait for the replay, and no restore
    /// writes into the new allocation.
    fn a_snapshotted_buffer_freed_and_reused_by_another_thread_mid_replay_full() {
        free_in_footprint_and_reuse(RestoreStrategy::Full);
    }

    fn a_snapshotted_buffer_freed_and_reused_by_another_thread_mid_replay_hash() {
        free_in_footprint_and_reuse(RestoreStrategy::Hash);
    }

    fn a_snapshotted_buffer_freed_and_reused_by_another_thread_mid_replay_auto() {
        free_in_footprint_and_reuse(RestoreStrategy::Auto);
    }

    /// Memory of the other GPU freed while a replay holds GPU 0: the free does not wait.
    fn memory_outside_the_footprint_freed_mid_replay_does_not_wait() {
        let env = setup(RestoreStrategy::Auto);
        let pools1 = env.app.pools(env.app.gpus[1]);
        let elsewhere = env.app.buffer(pools1.coarse, &[1; 64]);
        let host = env.app.alloc(env.app.host_pool(), 4096);
        let queue = env.app.queue(env.app.gpus[0]);
        let done = env.app.signal(1);
        let app = env.app;
        let outcome = env.held_replay(queue, done, move || {
            promptly("a free of memory outside the footprint", move || {
                app.free(elsewhere);
                app.free(host);
            });
        });
        assert!(replayed(&outcome), "{outcome:?}");
        assert_eq!(env.app.wait_zero(done), 0);
        env.still_replays();
    }

    /// An idle queue of the replayed agent destroyed mid-replay: no wait, the replay goes on.
    fn a_sibling_queue_destroyed_mid_replay() {
        let env = setup(RestoreStrategy::Auto);
        let queue = env.app.queue(env.app.gpus[0]);
        let sibling = env.app.queue(env.app.gpus[0]);
        let other_agent = env.app.queue(env.app.gpus[1]);
        let done = env.app.signal(1);
        let app = env.app;
        let outcome = env.held_replay(queue, done, move || {
            promptly("a queue destroy", move || {
                app.destroy_queue(sibling);
                app.destroy_queue(other_agent);
            });
        });
        assert!(replayed(&outcome), "{outcome:?}");
        assert_eq!(env.app.wait_zero(done), 0);
        env.still_replays();
    }

    /// The application destroys the completion signal of the dispatch being replayed (it
    /// gave up waiting): the replay ends, the process keeps running.
    fn the_completion_signal_destroyed_mid_replay() {
        let env = setup(RestoreStrategy::Auto);
        let queue = env.app.queue(env.app.gpus[0]);
        let done = env.app.signal(1);
        let app = env.app;
        env.held_replay(queue, done, move || {
            promptly("a signal destroy", move || {
                let destroy = app.core().hsa_signal_destroy_fn.expect("hsa_signal_destroy");
                // SAFETY: `done` is a live signal the application created.
                unsafe { destroy(done) };
            });
        });
        env.still_replays();
    }

    /// The application destroys the queue whose dispatch is being replayed, from another
    /// thread (it gave up waiting; per HSA the dispatch's results are then undefined): the
    /// destroy waits for the replay, which ends as one run would have, instead of the replay
    /// writing its next pass into the destroyed queue (before: a hang, then SIGSEGV).
    fn the_replayed_queue_destroyed_mid_replay_waits_for_the_replay() {
        let env = setup(RestoreStrategy::Auto);
        let queue = env.app.queue(env.app.gpus[0]);
        let done = env.app.signal(1);
        let app = env.app;
        let destroyer: Arc<Mutex<Option<std::thread::JoinHandle<()>>>> = Arc::default();
        let d = destroyer.clone();
        let outcome = env.held_replay(queue, done, move || {
            *d.lock() = Some(std::thread::spawn(move || app.destroy_queue(queue)));
            let deadline = std::time::Instant::now() + app::WAIT;
            while kreplay_hsa::queue_destroys_waiting() == 0 {
                assert!(std::time::Instant::now() < deadline, "the destroy never waited for the replay");
                std::thread::yield_now();
            }
        });
        assert!(replayed(&outcome), "{outcome:?}");
        assert_eq!(env.app.wait_zero(done), 0);
        let destroyer = destroyer.lock().take().expect("a destroying thread");
        assert!(promptly("the destroy after the replay", move || destroyer.join().is_ok()));
        env.still_replays();
    }

    /// A pass faults and the application's queue error callback destroys the queue whose
    /// dispatch is being replayed: the replay learns that the pass failed, its handler call
    /// returns, then the destroy completes; nothing hangs and the agent keeps working.
    fn a_queue_destroyed_by_its_error_callback_during_a_replay_does_not_hang() {
        let env = setup(RestoreStrategy::Auto);
        let _ = APP.set(env.app);
        let mut queue: *mut hsa_sys::hsa_queue_t = std::ptr::null_mut();
        let create = env.app.core().hsa_queue_create_fn.expect("hsa_queue_create");
        // SAFETY: valid agent, out pointer and callback.
        let status = unsafe {
            create(
                env.app.gpus[0],
                64,
                hsa_sys::HSA_QUEUE_TYPE_MULTI,
                Some(destroy_on_error),
                std::ptr::null_mut(),
                0,
                0,
                &raw mut queue,
            )
        };
        assert_eq!(status, hsa_sys::HSA_STATUS_SUCCESS);
        let queue = Queue(queue);
        RELEASE.store(true, Ordering::SeqCst);
        let kernel = kreplay_softhsa::register_kernel("teardown_faulting", faulting);
        let kernarg = env.app.kernargs(&env.pools, AddOneArgs { buf: 0, len: 0, pad: 0 });
        let done = env.app.signal(1);
        let app = env.app;
        promptly("a dispatch whose queue its error callback destroys", move || {
            app.dispatch(queue, Aql::dispatch(kernel, 64, 64, kernarg, done));
        });
        assert!(support::wait_flag(&DESTROYED_IN_CALLBACK), "the error callback destroyed the queue");
        let id = env.hooks.configured_dispatches()[0].dispatch_id;
        let outcome = env.hooks.finished_record(id).outcome;
        assert!(matches!(outcome, ReplayOutcome::PassFailed { pass: 0, .. }), "{outcome:?}");
        env.still_replays();
    }

    /// The application shuts the runtime down after kreplay's completion threads started (an
    /// async copy under a replay service): those threads go quiet instead of spinning on a
    /// runtime that answers every wait at once.
    fn kreplays_threads_do_not_spin_after_hsa_shut_down() {
        let env = setup(RestoreStrategy::Auto);
        let gpu = env.app.gpus[0];
        let (src, dst) = (env.app.buffer(env.pools.coarse, &[3; 1024]), env.app.alloc(env.pools.coarse, 4096));
        let copied = env.app.signal(1);
        env.app.async_copy(dst, gpu, src, gpu, 4096, copied);
        assert_eq!(env.app.wait_zero(copied), 0);
        let shut_down = env.app.core().hsa_shut_down_fn.expect("hsa_shut_down");
        // SAFETY: no argument; nothing of the application's is in flight.
        assert_eq!(unsafe { shut_down() }, hsa_sys::HSA_STATUS_SUCCESS);
        let before = cpu_ticks("kreplay-");
        let measured = std::time::Instant::now();
        while measured.elapsed() < Duration::from_millis(500) {
            std::thread::park_timeout(Duration::from_millis(50));
        }
        let used = cpu_ticks("kreplay-") - before;
        // 500 ms is 50 ticks of one core; an idle thread uses none.
        assert!(used < 10, "kreplay's threads used {used} ticks of CPU in 500 ms after hsa_shut_down");
    }

    /// The application cancels its thread while that thread's dispatch is being replayed, and
    /// the tool then reaches a cancellation point (a `write`, a `printf`, a sleep) in PASS
    /// ENTER. The replay finishes, the doorbell store returns and the cancellation is left
    /// for the application's own code, as without kreplay, where the store has no
    /// cancellation point (before: the cancellation unwound through kreplay's `extern "C"`
    /// frames and aborted the process).
    fn a_thread_cancelled_during_its_replay_finishes_the_replay_first() {
        let env = setup(RestoreStrategy::Auto);
        env.hooks.set_script(Script::passes(PASSES).on_pass_enter(|_, _, pass, _| {
            if pass == 1 && !HELD.swap(true, Ordering::SeqCst) {
                assert!(support::wait_flag(&RELEASE), "the scenario never released the replay");
                // A cancellation point, as a tool's printf is.
                // SAFETY: no preconditions.
                unsafe { libc::usleep(1) };
            }
        }));
        let init = values(LEN);
        let buf = env.app.buffer(env.pools.coarse, &init);
        let queue = env.app.queue(env.app.gpus[0]);
        let done = env.app.signal(1);
        let submission = Box::leak(Box::new(Submission {
            app: env.app,
            queue,
            packet: env.add(buf, done),
        }));
        // SAFETY: zeroed storage for the new thread's id.
        let mut thread: libc::pthread_t = unsafe { std::mem::zeroed() };
        // SAFETY: a start routine and its argument, alive for the rest of the process.
        let created = unsafe {
            libc::pthread_create(
                &mut thread,
                std::ptr::null(),
                cancellable,
                std::ptr::from_mut(submission).cast(),
            )
        };
        assert_eq!(created, 0);
        assert!(support::wait_flag(&HELD), "the replay never reached pass 1");
        // SAFETY: `thread` is alive: it is held inside its doorbell store.
        assert_eq!(unsafe { pthread_cancel(thread) }, 0);
        RELEASE.store(true, Ordering::SeqCst);
        assert!(support::wait_flag(&RETURNED), "the cancelled thread's doorbell store never returned");
        // SAFETY: the thread returned from its routine (or is about to).
        assert_eq!(unsafe { libc::pthread_join(thread, std::ptr::null_mut()) }, 0);
        assert_eq!(env.app.wait_zero(done), 0);
        assert_eq!(env.app.read(buf, LEN as usize), plus_one(&init));
        let id = env.hooks.configured_dispatches()[0].dispatch_id;
        let outcome = env.hooks.finished_record(id).outcome;
        assert!(replayed(&outcome), "{outcome:?}");
        env.still_replays();
    }

    /// An application object kept per thread dispatches a kernel from its destructor when the
    /// thread ends, after kreplay's own per-thread state was destroyed (it was first used after
    /// the object was made): the dispatch is replayed and the tool learns how it ended, as for
    /// any other.
    fn a_dispatch_from_a_thread_local_destructor_is_replayed_and_reported() {
        let env = setup(RestoreStrategy::Auto);
        RELEASE.store(true, Ordering::SeqCst);
        let init = values(LEN);
        let (first, last) = (env.app.buffer(env.pools.coarse, &init), env.app.buffer(env.pools.coarse, &init));
        let queue = env.app.queue(env.app.gpus[0]);
        let (done, exit_done) = (env.app.signal(1), env.app.signal(1));
        let packet = env.add(first, done);
        let exit_kernarg = env.app.kernargs(&env.pools, AddOneArgs { buf: last.0, len: LEN, pad: 0 });
        let app = env.app;
        let thread = std::thread::spawn(move || {
            FLUSH_AT_EXIT.with(|f| {
                *f.borrow_mut() = Some(AtThreadExit { app, queue, buf: last, done: exit_done, kernarg: exit_kernarg })
            });
            app.dispatch(queue, packet);
        });
        assert!(thread.join().is_ok(), "the application's thread ended normally");
        assert_eq!((env.app.wait_zero(done), env.app.wait_zero(exit_done)), (0, 0));
        assert_eq!(env.app.read(first, LEN as usize), plus_one(&init));
        assert_eq!(env.app.read(last, LEN as usize), plus_one(&init));
        let dispatches = env.hooks.configured_dispatches();
        assert_eq!(dispatches.len(), 2);
        for info in dispatches {
            let outcome = env.hooks.finished_record(info.dispatch_id).outcome;
            assert!(replayed(&outcome), "dispatch {}: {outcome:?}", info.dispatch_id);
        }
    }

    /// Another thread's dispatch on a second queue of the agent waits in its handler for the
    /// agent, held by the replay; the application destroys that second queue meanwhile: the
    /// destroy waits until the waiting dispatch was handled, instead of leaving it to write
    /// into the destroyed queue once the agent is free.
    fn a_queue_destroyed_while_its_dispatch_waits_for_the_agent_waits_for_it() {
        let env = setup(RestoreStrategy::Auto);
        let queue = env.app.queue(env.app.gpus[0]);
        let waiting_queue = env.app.queue(env.app.gpus[0]);
        let done = env.app.signal(1);
        let init = values(LEN);
        let waiting_buf = env.app.buffer(env.pools.coarse, &init);
        let waiting_done = env.app.signal(1);
        let waiting_packet = env.add(waiting_buf, waiting_done);
        let (app, hooks) = (env.app, env.hooks.clone());
        let destroyer: Arc<Mutex<Option<std::thread::JoinHandle<()>>>> = Arc::default();
        let d = destroyer.clone();
        let outcome = env.held_replay(queue, done, move || {
            std::thread::spawn(move || app.dispatch(waiting_queue, waiting_packet));
            let deadline = std::time::Instant::now() + app::WAIT;
            while hooks.configured_dispatches().len() < 2 {
                assert!(std::time::Instant::now() < deadline, "the second dispatch never reached its handler");
                std::thread::yield_now();
            }
            *d.lock() = Some(std::thread::spawn(move || app.destroy_queue(waiting_queue)));
            while kreplay_hsa::queue_destroys_waiting() == 0 {
                assert!(std::time::Instant::now() < deadline, "the destroy did not wait for the handler");
                std::thread::yield_now();
            }
        });
        assert!(replayed(&outcome), "{outcome:?}");
        assert_eq!((env.app.wait_zero(done), env.app.wait_zero(waiting_done)), (0, 0));
        let destroyer = destroyer.lock().take().expect("a destroying thread");
        assert!(promptly("the destroy", move || destroyer.join().is_ok()));
        assert_eq!(env.app.read(waiting_buf, LEN as usize), plus_one(&init));
        env.still_replays();
    }

    /// Another thread frees a buffer after the snapshot was planned (the tool holds SNAPSHOT
    /// ENTER) and allocates one of the same size, writing it from the CPU: the snapshot skips
    /// the freed buffer, no restore writes into the new one, and the replay ends as planned.
    fn a_buffer_freed_between_the_snapshots_plan_and_its_copy_is_skipped_full() {
        freed_between_plan_and_copy(RestoreStrategy::Full);
    }

    fn a_buffer_freed_between_the_snapshots_plan_and_its_copy_is_skipped_auto() {
        freed_between_plan_and_copy(RestoreStrategy::Auto);
    }
}

/// Runs the exit scenario in a process of its own: the child exits with status 3 from the main
/// thread while another thread's dispatch is held in its replay.
#[test]
fn the_process_exits_promptly_while_a_replay_is_held() {
    const NAME: &str = "the_process_exits_promptly_while_a_replay_is_held";
    const CHILD: &str = "KREPLAY_HSA_TEARDOWN_EXIT_CHILD";
    if std::env::var_os(CHILD).is_some() {
        let env = setup(RestoreStrategy::Auto);
        let init = values(LEN);
        let buf = env.app.buffer(env.pools.coarse, &init);
        let queue = env.app.queue(env.app.gpus[0]);
        let done = env.app.signal(1);
        let packet = env.add(buf, done);
        let app = env.app;
        std::thread::spawn(move || app.dispatch(queue, packet));
        assert!(support::wait_flag(&HELD), "the replay never reached pass 1");
        println!("exiting while the replay is held");
        // SAFETY: ends the process; nothing of this thread's is left to drop that matters.
        unsafe { libc::exit(3) };
    }
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", NAME, "--nocapture", "--test-threads=1"])
        .env(CHILD, "1")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("the scenario's process starts");
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break Some(status);
        }
        if std::time::Instant::now() >= deadline {
            let _ = child.kill();
            break None;
        }
        std::thread::park_timeout(Duration::from_millis(20));
    };
    let output = child.wait_with_output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(text.contains("exiting while the replay is held"), "{text}");
    assert_eq!(
        status.and_then(|s| s.code()),
        Some(3),
        "the process did not exit with 3: {text}"
    );
}
