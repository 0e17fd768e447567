//! The application forks while another of its threads is inside one of the HSA backend's short
//! critical sections (the executables it tracks, its signals, its queue registry, a queue's own
//! lock, its replay groups, its one-time lookup of the GPUs) or while its completion threads
//! are idle. Only the forking thread exists in the child: a lock another thread held at the
//! fork would stay held there for good, and the child's first HSA call that needs it (loading or
//! unloading a module, creating a signal, turning profiling on for its queue, destroying a
//! queue, granting access) would wait forever. Each child uses HSA as an application does
//! (creates a queue, dispatches, waits for the completion) and must finish within a bound; a
//! child still running then is killed and counts as hung.

#[allow(dead_code)]
#[macro_use]
mod support;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use hsa_sys::layouts::AmdExtTableV2;
use hsa_sys::*;
use kreplay_hsa::{DispatchRecord, InstallOptions, ToolHooks};
use kreplay_passloop::ReplayOutcome;
use kreplay_softhsa::{OwnedApiTable, TableLayout};
use support::app::{self, App, Aql};
use support::counted::{AddOneArgs, add_one};
use support::tool::{Script, TestHooks, Wrap, Wrapped};
use support::wait_child;

const LEN: u32 = 256;
/// What a child dispatches: one work-group.
const CHILD_LEN: u32 = 64;

/// The kernel of a module no one dispatches.
fn nothing(_: &kreplay_softhsa::WorkGroup) {}

fn values(len: u32) -> Vec<u32> {
    (0..len).map(|i| i * 5 + 1).collect()
}

fn plus_one(v: &[u32]) -> Vec<u32> {
    v.iter().map(|x| x + 1).collect()
}

/// Forks; the child runs `child` (its exit code; a panic is 100) and leaves with `_exit`.
/// Returns the child's pid in the parent.
fn fork_running(child: impl FnOnce() -> i32) -> libc::pid_t {
    // SAFETY: the child only makes HSA calls and leaves with _exit.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork failed");
    if pid == 0 {
        let code = std::panic::catch_unwind(std::panic::AssertUnwindSafe(child)).unwrap_or(100);
        // SAFETY: leaves the child without running the parent's exit handlers.
        unsafe { libc::_exit(code) };
    }
    pid
}

/// Forks 100 times while another thread runs `churn` over and over, each child running
/// `child` ([`fork_running`]) and waited for at most 10 s; asserts that every child ended with
/// 0 (the forks stop at the first that did not).
fn fork_while(churn: impl Fn() + Sync, child: impl Fn() -> i32) {
    let stop = AtomicBool::new(false);
    let mut failures = Vec::new();
    std::thread::scope(|scope| {
        scope.spawn(|| {
            while !stop.load(Ordering::Relaxed) {
                churn();
            }
        });
        for round in 0..100 {
            let pid = fork_running(&child);
            match wait_child(pid, Duration::from_secs(10)) {
                Some(0) => {}
                other => {
                    failures.push(format!(
                        "fork {round}: the child ended with {other:?} (None: hung)"
                    ));
                    break;
                }
            }
        }
        stop.store(true, Ordering::Relaxed);
    });
    assert!(failures.is_empty(), "{failures:#?}");
}

/// What every child does, as an application would after a fork: a queue of its own with
/// profiling on (as HIP turns it on for every stream's queue), a signal, a buffer, one dispatch
/// whose completion it waits for and whose result it checks; the queue and signal destroyed.
/// `kernel` is registered by the parent (softhsa's kernel list is a lock of its own). One
/// work-group: softhsa then hands nothing to its worker threads, which are the parent's (it
/// takes no fork handlers, and waking them goes through parking_lot's process-wide table of
/// parked threads, which a thread of the parent may have been changing at the fork).
/// 0 on success; 3: the completion never fired; 4: a wrong result; 6: a call failed.
fn use_hsa(app: App, kernel: u64) -> i32 {
    let pools = app.pools(app.gpus[0]);
    let init = values(CHILD_LEN);
    let buf = app.buffer(pools.coarse, &init);
    let queue = app.queue(app.gpus[0]);
    let profile = app
        .amd()
        .hsa_amd_profiling_set_profiler_enabled_fn
        .expect("profiling");
    // SAFETY: a queue of this process, alive.
    if unsafe { profile(queue.0, 1) } != HSA_STATUS_SUCCESS {
        return 6;
    }
    let done = app.signal(1);
    let kernarg = app.kernargs(
        &pools,
        AddOneArgs {
            buf: buf.0,
            len: CHILD_LEN,
            pad: 0,
        },
    );
    app.dispatch(queue, Aql::dispatch(kernel, CHILD_LEN, 64, kernarg, done));
    if app.wait_zero_within(done, Duration::from_secs(5)) != 0 {
        return 3;
    }
    if app.read(buf, CHILD_LEN as usize) != plus_one(&init) {
        return 4;
    }
    let destroy = app
        .core()
        .hsa_signal_destroy_fn
        .expect("hsa_signal_destroy");
    // SAFETY: the signal created above, destroyed once.
    if unsafe { destroy(done) } != HSA_STATUS_SUCCESS {
        return 6;
    }
    app.destroy_queue(queue);
    0
}

// ---------------------------------------------------------------------------------------------
// Runtime entries the scenarios replace (below kreplay, as the runtime): each forwards to
// softhsa's own.

type Iterate = unsafe extern "C" fn(
    hsa_executable_t,
    hsa_agent_t,
    Option<
        unsafe extern "C" fn(
            hsa_executable_t,
            hsa_agent_t,
            hsa_executable_symbol_t,
            *mut std::ffi::c_void,
        ) -> hsa_status_t,
    >,
    *mut std::ffi::c_void,
) -> hsa_status_t;
type IterateAgents = unsafe extern "C" fn(
    Option<unsafe extern "C" fn(hsa_agent_t, *mut std::ffi::c_void) -> hsa_status_t>,
    *mut std::ffi::c_void,
) -> hsa_status_t;
type LoadReadIndex = unsafe extern "C" fn(*const hsa_queue_t) -> u64;
type SignalDestroy = unsafe extern "C" fn(hsa_signal_t) -> hsa_status_t;
type Profiling = unsafe extern "C" fn(*mut hsa_queue_t, std::ffi::c_int) -> hsa_status_t;

static ITERATE: OnceLock<Iterate> = OnceLock::new();
static SIGNAL_DESTROY: OnceLock<SignalDestroy> = OnceLock::new();
static LOAD_READ_INDEX: OnceLock<LoadReadIndex> = OnceLock::new();
static ITERATE_AGENTS: OnceLock<IterateAgents> = OnceLock::new();

/// Set by the scenario: the next walk of the agents waits until [`RELEASE`].
static PARK_AGENTS: AtomicBool = AtomicBool::new(false);
/// That walk is waiting.
static AGENTS_PARKED: AtomicBool = AtomicBool::new(false);

/// softhsa's walk of the agents; the armed one first waits (bounded) for [`RELEASE`].
unsafe extern "C" fn parking_iterate_agents(
    callback: Option<unsafe extern "C" fn(hsa_agent_t, *mut std::ffi::c_void) -> hsa_status_t>,
    data: *mut std::ffi::c_void,
) -> hsa_status_t {
    if PARK_AGENTS.swap(false, Ordering::SeqCst) {
        AGENTS_PARKED.store(true, Ordering::SeqCst);
        let deadline = Instant::now() + Duration::from_secs(60);
        while !RELEASE.load(Ordering::SeqCst) && Instant::now() < deadline {
            std::thread::park_timeout(Duration::from_millis(5));
        }
    }
    // SAFETY: softhsa's own entry with the caller's arguments.
    unsafe { ITERATE_AGENTS.get().expect("saved")(callback, data) }
}

/// Set by the scenario to a queue: the next read of its read index waits until [`RELEASE`].
static PARK_READ_OF: AtomicUsize = AtomicUsize::new(0);
/// That read is waiting (kreplay's caller inside the queue's critical section).
static READ_PARKED: AtomicBool = AtomicBool::new(false);

/// softhsa's read-index load; the armed queue's first waits (bounded) for [`RELEASE`].
unsafe extern "C" fn parking_load_read_index(queue: *const hsa_queue_t) -> u64 {
    let armed = PARK_READ_OF.load(Ordering::SeqCst);
    if armed != 0
        && armed == queue as usize
        && PARK_READ_OF
            .compare_exchange(armed, 0, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok()
    {
        READ_PARKED.store(true, Ordering::SeqCst);
        let deadline = Instant::now() + Duration::from_secs(60);
        while !RELEASE.load(Ordering::SeqCst) && Instant::now() < deadline {
            std::thread::park_timeout(Duration::from_millis(5));
        }
    }
    // SAFETY: softhsa's own entry with the caller's argument.
    unsafe { LOAD_READ_INDEX.get().expect("saved")(queue) }
}
static PROFILING: OnceLock<Profiling> = OnceLock::new();

/// Set by the scenario: the next symbol walk waits in the runtime until [`RELEASE`].
static PARK_WALK: AtomicBool = AtomicBool::new(false);
/// The walk is waiting (kreplay's caller inside its critical section).
static WALK_PARKED: AtomicBool = AtomicBool::new(false);
static RELEASE: AtomicBool = AtomicBool::new(false);

/// softhsa's symbol walk; the armed one first waits (bounded) for [`RELEASE`].
unsafe extern "C" fn parking_iterate(
    exe: hsa_executable_t,
    agent: hsa_agent_t,
    callback: Option<
        unsafe extern "C" fn(
            hsa_executable_t,
            hsa_agent_t,
            hsa_executable_symbol_t,
            *mut std::ffi::c_void,
        ) -> hsa_status_t,
    >,
    data: *mut std::ffi::c_void,
) -> hsa_status_t {
    if PARK_WALK.swap(false, Ordering::SeqCst) {
        WALK_PARKED.store(true, Ordering::SeqCst);
        let deadline = Instant::now() + Duration::from_secs(60);
        while !RELEASE.load(Ordering::SeqCst) && Instant::now() < deadline {
            std::thread::park_timeout(Duration::from_millis(5));
        }
    }
    // SAFETY: softhsa's own entry with the caller's arguments.
    unsafe { ITERATE.get().expect("saved")(exe, agent, callback, data) }
}

/// softhsa's signal destroy, but a zero handle is refused at once (without entering softhsa).
unsafe extern "C" fn quick_signal_destroy(signal: hsa_signal_t) -> hsa_status_t {
    if signal.handle == 0 {
        return HSA_STATUS_ERROR_INVALID_ARGUMENT;
    }
    // SAFETY: softhsa's own entry with the caller's argument.
    unsafe { SIGNAL_DESTROY.get().expect("saved")(signal) }
}

/// softhsa's profiling switch, but a null queue is refused at once.
unsafe extern "C" fn quick_profiling(queue: *mut hsa_queue_t, on: std::ffi::c_int) -> hsa_status_t {
    if queue.is_null() {
        return HSA_STATUS_ERROR_INVALID_QUEUE;
    }
    // SAFETY: softhsa's own entry with the caller's arguments.
    unsafe { PROFILING.get().expect("saved")(queue, on) }
}

/// softhsa's table with the entries above in place of its own.
fn table_with_stand_ins() -> &'static mut OwnedApiTable {
    let layout = TableLayout::from_env().expect("a known table layout");
    let table: &'static mut OwnedApiTable =
        Box::leak(Box::new(OwnedApiTable::softhsa_with(layout)));
    // SAFETY: the copy's sub-tables are valid, laid out in `layout`'s order, and used by no one
    // else yet.
    unsafe {
        let core = &mut *(*table.as_mut_ptr()).core_;
        let _ = ITERATE.set(core.hsa_executable_iterate_agent_symbols_fn.expect("walk"));
        core.hsa_executable_iterate_agent_symbols_fn = Some(parking_iterate);
        let _ = SIGNAL_DESTROY.set(core.hsa_signal_destroy_fn.expect("signal destroy"));
        core.hsa_signal_destroy_fn = Some(quick_signal_destroy);
        let _ = LOAD_READ_INDEX.set(core.hsa_queue_load_read_index_scacquire_fn.expect("read"));
        core.hsa_queue_load_read_index_scacquire_fn = Some(parking_load_read_index);
        let _ = ITERATE_AGENTS.set(core.hsa_iterate_agents_fn.expect("agents"));
        core.hsa_iterate_agents_fn = Some(parking_iterate_agents);
        let amd = (*table.as_mut_ptr()).amd_ext_;
        let slot = match layout {
            TableLayout::Rocm52 => {
                &mut (*amd.cast::<AmdExtTable>()).hsa_amd_profiling_set_profiler_enabled_fn
            }
            _ => &mut (*amd.cast::<AmdExtTableV2>()).hsa_amd_profiling_set_profiler_enabled_fn,
        };
        let _ = PROFILING.set(slot.expect("profiling"));
        *slot = Some(quick_profiling);
    }
    table
}

/// Set by this test's own prepare handler, which runs before kreplay's (handlers registered
/// later run first).
static FORK_PREPARING: AtomicBool = AtomicBool::new(false);

extern "C" fn note_fork_prepare() {
    FORK_PREPARING.store(true, Ordering::SeqCst);
}

scenarios! {
    /// A replay lists the symbols of the modules loaded on its agent (their writable variables
    /// go into its snapshot) while another thread forks; the runtime's walk is held there until
    /// a good while after the fork began. The child loads a module of its own (create, load,
    /// freeze, as `hipModuleLoad` does) and dispatches: it must not wait for the parent's list
    /// of executables, which the walking thread, absent from the child, held at the fork.
    fn a_child_forked_while_a_replay_lists_module_symbols_can_load_a_module() {
        let hooks = TestHooks::new(0);
        let app = app::install_into(table_with_stand_ins(), hooks.clone(), InstallOptions::default());
        hooks.configure_replay(true);
        hooks.set_script(Script::passes(2));
        let gpu = app.gpus[0];
        let pools = app.pools(gpu);
        // A module loaded on the agent: the replay's snapshot walks its symbols.
        let unrelated = kreplay_softhsa::register_kernel("life_fork_locks_unrelated", nothing);
        let code = kreplay_softhsa::CodeObject::new()
            .kernel("life_fork_locks_unrelated", unrelated, 0)
            .variable("life_fork_locks_table", &[7u8; 64]);
        app.hsa().load_executable(gpu, &code).expect("a module loads");

        let kernel = kreplay_softhsa::register_kernel("life_fork_locks_add_one", add_one);
        let init = values(LEN);
        let buf = app.buffer(pools.coarse, &init);
        let kernarg = app.kernargs(&pools, AddOneArgs { buf: buf.0, len: LEN, pad: 0 });
        let queue = app.queue(gpu);
        let done = app.signal(1);
        PARK_WALK.store(true, Ordering::SeqCst);
        let packet = Aql::dispatch(kernel, LEN, 64, kernarg, done);
        let submitter = std::thread::spawn(move || app.dispatch(queue, packet));
        assert!(support::wait_flag(&WALK_PARKED), "the replay never walked the module's symbols");

        // The walk goes on (and kreplay's critical section ends) only a second after the fork
        // began: far longer than a fork takes, so without a prepare handler that waits for it
        // the child is made while it is still inside.
        // SAFETY: registers a plain extern "C" function that stores an atomic.
        assert_eq!(unsafe { libc::pthread_atfork(Some(note_fork_prepare), None, None) }, 0);
        let releaser = std::thread::spawn(|| {
            assert!(support::wait_flag(&FORK_PREPARING), "the fork never began");
            std::thread::sleep(Duration::from_secs(1));
            RELEASE.store(true, Ordering::SeqCst);
        });
        let pid = fork_running(|| {
            let code = kreplay_softhsa::CodeObject::new()
                .kernel("life_fork_locks_unrelated", unrelated, 0);
            if app.hsa().load_executable(gpu, &code).is_err() {
                return 7;
            }
            use_hsa(app, kernel)
        });
        let child = wait_child(pid, Duration::from_secs(20));
        RELEASE.store(true, Ordering::SeqCst);
        releaser.join().expect("the releasing thread");
        submitter.join().expect("the submitting thread");
        assert_eq!(app.wait_zero(done), 0);
        assert_eq!(app.read(buf, LEN as usize), plus_one(&init));
        assert_eq!(
            child,
            Some(0),
            "the forked child (None: it hung and was killed; 3: its completion never fired; \
             4: wrong result; 6: a call failed; 7: its module did not load; 100: it panicked)"
        );
        let id = hooks.configured_dispatches().first().expect("CONFIG ENTER").dispatch_id;
        let outcome = hooks.finished_record(id).outcome;
        assert!(matches!(outcome, ReplayOutcome::Replayed { passes: 2, .. }), "{outcome:?}");
    }

    /// Another thread of the application is in and out of kreplay's signal list and queue
    /// registry all the time (signal destroys, profiling switches) while the main thread forks
    /// again and again: every child creates a signal and a queue, turns profiling on, dispatches
    /// and destroys what it made, and must finish.
    fn children_forked_while_a_thread_churns_signals_and_queue_lookups_finish() {
        let hooks = TestHooks::new(0);
        let app = app::install_into(table_with_stand_ins(), hooks.clone(), InstallOptions::default());
        hooks.configure_replay(true);
        hooks.set_script(Script::passes(2));
        let destroy = app.core().hsa_signal_destroy_fn.expect("hsa_signal_destroy");
        let profile = app.amd().hsa_amd_profiling_set_profiler_enabled_fn.expect("profiling");
        // No queue of the parent's: softhsa's threads for one, starting up, may hold softhsa's
        // own locks at the first fork (softhsa takes no fork handlers).
        let kernel = kreplay_softhsa::register_kernel("life_fork_locks_add_one", add_one);
        fork_while(
            // SAFETY: a zero handle and a null queue: both refused (by the runtime's
            // stand-ins), after kreplay looked them up in its lists.
            || unsafe {
                destroy(hsa_signal_t { handle: 0 });
                profile(std::ptr::null_mut(), 0);
            },
            || use_hsa(app, kernel),
        );
    }

    /// A replay drains the other queue of its agent: it asks that queue for a drain marker and
    /// rings it, reading its ring's indices under the queue's own lock, and the runtime's read
    /// is held there while the main thread forks. The child destroys that queue (as its own
    /// teardown would): the destroy returns, whatever the runtime answers for a queue of the
    /// parent's, and the child goes on using HSA; it must not wait for the queue's lock, which
    /// the draining thread, absent from the child, held at the fork.
    fn a_child_forked_while_a_replay_rings_another_queue_can_destroy_that_queue() {
        let hooks = TestHooks::new(0);
        let app = app::install_into(table_with_stand_ins(), hooks.clone(), InstallOptions::default());
        let gpu = app.gpus[0];
        let pools = app.pools(gpu);
        let kernel = kreplay_softhsa::register_kernel("life_fork_locks_add_one", add_one);
        let init = values(LEN);
        let buf = app.buffer(pools.coarse, &init);
        let kernarg = app.kernargs(&pools, AddOneArgs { buf: buf.0, len: LEN, pad: 0 });
        let replayed = app.queue(gpu);
        let other = app.queue(gpu);
        // Work forwarded on the other queue before replay is configured: the next replay's
        // drain asks it for a marker.
        let first = app.signal(1);
        app.dispatch(other, Aql::dispatch(kernel, LEN, 64, kernarg, first));
        assert_eq!(app.wait_zero(first), 0);
        hooks.configure_replay(true);
        hooks.set_script(Script::passes(2));
        PARK_READ_OF.store(other.0 as usize, Ordering::SeqCst);
        let done = app.signal(1);
        let packet = Aql::dispatch(kernel, LEN, 64, kernarg, done);
        let submitter = std::thread::spawn(move || app.dispatch(replayed, packet));
        assert!(support::wait_flag(&READ_PARKED), "the replay never rang the other queue");

        let pid = fork_running(|| {
            let destroy = app.core().hsa_queue_destroy_fn.expect("hsa_queue_destroy");
            // SAFETY: a queue the parent created, destroyed once in this process.
            let _ = unsafe { destroy(other.0) };
            use_hsa(app, kernel)
        });
        let child = wait_child(pid, Duration::from_secs(20));
        RELEASE.store(true, Ordering::SeqCst);
        submitter.join().expect("the submitting thread");
        assert_eq!(app.wait_zero(done), 0);
        assert_eq!(app.read(buf, LEN as usize), plus_one(&plus_one(&init)));
        assert_eq!(
            child,
            Some(0),
            "the forked child (None: it hung and was killed; 3: its completion never fired; \
             4: wrong result; 6: a call failed; 100: it panicked)"
        );
        let id = hooks.configured_dispatches().first().expect("CONFIG ENTER").dispatch_id;
        let outcome = hooks.finished_record(id).outcome;
        assert!(matches!(outcome, ReplayOutcome::Replayed { passes: 2, .. }), "{outcome:?}");
    }

    /// The application unloads a module (`hsa_executable_destroy`, which kreplay fences against
    /// the replays of every GPU) on one thread while another forks; should kreplay look the
    /// system's GPUs up then, the runtime's walk of the agents is held until the child is done.
    /// The child loads and unloads a module of its own: it must not wait for a one-time lookup
    /// that a thread absent from the child began.
    fn a_child_forked_while_a_module_unload_looks_up_the_gpus_can_unload_a_module() {
        let hooks = TestHooks::new(0);
        let app = app::install_into(table_with_stand_ins(), hooks.clone(), InstallOptions::default());
        let gpu = app.gpus[0];
        let unrelated = kreplay_softhsa::register_kernel("life_fork_locks_unrelated", nothing);
        let kernel = kreplay_softhsa::register_kernel("life_fork_locks_add_one", add_one);
        let code = kreplay_softhsa::CodeObject::new()
            .kernel("life_fork_locks_unrelated", unrelated, 0);
        let exe = app.hsa().load_executable(gpu, &code).expect("a module loads");
        PARK_AGENTS.store(true, Ordering::SeqCst);
        let unloaded = Arc::new(AtomicBool::new(false));
        let unloader = {
            let unloaded = unloaded.clone();
            std::thread::spawn(move || {
                app.hsa().destroy_executable(exe).expect("the module unloads");
                unloaded.store(true, Ordering::SeqCst);
            })
        };
        // Either the unload is inside the lookup now, or it needed none and is done.
        let deadline = Instant::now() + Duration::from_secs(10);
        while !AGENTS_PARKED.load(Ordering::SeqCst)
            && !unloaded.load(Ordering::SeqCst)
            && Instant::now() < deadline
        {
            std::thread::yield_now();
        }
        assert!(
            AGENTS_PARKED.load(Ordering::SeqCst) || unloaded.load(Ordering::SeqCst),
            "the unload neither looked the agents up nor ended"
        );
        let pid = fork_running(|| {
            let Ok(mine) = app.hsa().load_executable(gpu, &code) else {
                return 7;
            };
            if app.hsa().destroy_executable(mine).is_err() {
                return 8;
            }
            use_hsa(app, kernel)
        });
        let child = wait_child(pid, Duration::from_secs(20));
        RELEASE.store(true, Ordering::SeqCst);
        unloader.join().expect("the unloading thread");
        assert_eq!(
            child,
            Some(0),
            "the forked child (None: it hung and was killed; 3: its completion never fired; \
             4: wrong result; 6: a call failed; 7: its module did not load; 8: nor unload; \
             100: it panicked)"
        );
    }

    /// Another thread asks for the replay groups of an agent all the time (as every replay does
    /// when it starts) while the main thread forks again and again: every child grants a second
    /// GPU access to a buffer (`hsa_amd_agents_allow_access`, as a peer-access enable or a
    /// pinned allocation does), dispatches, and must finish.
    fn children_forked_while_a_thread_reads_the_replay_groups_can_grant_access() {
        let hooks = TestHooks::new(0);
        let app = app::install_into(table_with_stand_ins(), hooks.clone(), InstallOptions::default());
        hooks.configure_replay(true);
        let kernel = kreplay_softhsa::register_kernel("life_fork_locks_add_one", add_one);
        let [gpu0, gpu1] = app.gpus;
        let pools = app.pools(gpu0);
        let allow = app.amd().hsa_amd_agents_allow_access_fn.expect("allow access");
        fork_while(
            || {
                std::hint::black_box(kreplay_hsa::replay_group(gpu0.handle));
            },
            || {
                let buf = app.buffer(pools.coarse, &values(LEN));
                // SAFETY: one agent handle; a buffer of this process.
                if unsafe { allow(1, &gpu1, std::ptr::null(), buf.raw()) } != HSA_STATUS_SUCCESS {
                    return 6;
                }
                use_hsa(app, kernel)
            },
        );
    }

    /// A tool forks from its ENQUEUE EXIT callback once the write's kernel finished, its COMPLETE
    /// record held back until the callback returns; kreplay's completion threads were idle at the
    /// fork. In the child the callback returns and the held record must be delivered there, by a
    /// completion thread of the child's own: the parent's idle ones do not exist in it.
    fn a_child_forked_in_enqueue_exit_gets_its_held_completion_delivered() {
        let hooks = Wrapped::new(
            1,
            Forking {
                armed: AtomicBool::new(false),
                completed: AtomicUsize::new(0),
                first_waits: AtomicBool::new(true),
            },
        );
        let app = app::install(hooks.clone(), InstallOptions::default());
        let _ = APP.set(app);
        let pools = app.pools(app.gpus[0]);
        let kernel = kreplay_softhsa::register_kernel("life_fork_locks_add_one", add_one);
        let buf = app.buffer(pools.coarse, &values(LEN));
        let kernarg = app.kernargs(&pools, AddOneArgs { buf: buf.0, len: LEN, pad: 0 });
        let queue = app.queue(app.gpus[0]);
        // Two completion threads: the first COMPLETE waits until the second is delivered, which
        // then needs a thread of its own. Both are idle once both returned.
        let first = app.signal(1);
        app.dispatch(queue, Aql::dispatch(kernel, LEN, 64, kernarg, first));
        let deadline = Instant::now() + Duration::from_secs(10);
        while hooks.wrap.completed.load(Ordering::SeqCst) == 0 && Instant::now() < deadline {
            std::thread::yield_now();
        }
        let second = app.signal(1);
        app.dispatch(queue, Aql::dispatch(kernel, LEN, 64, kernarg, second));
        assert_eq!(app.wait_zero(first), 0);
        assert_eq!(app.wait_zero(second), 0);
        let deadline = Instant::now() + Duration::from_secs(10);
        while hooks.inner.records().len() < 2 && Instant::now() < deadline {
            std::thread::yield_now();
        }
        assert_eq!(hooks.inner.records().len(), 2, "the two warm-up records");

        let third = app.signal(1);
        hooks.wrap.armed.store(true, Ordering::SeqCst);
        FORK_WAITS_FOR.store(third.handle as usize, Ordering::SeqCst);
        app.dispatch(queue, Aql::dispatch(kernel, LEN, 64, kernarg, third));
        if IN_CHILD.load(Ordering::SeqCst) {
            let code = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                if !kreplay_hsa::deliver_held_completions(Duration::from_secs(5)) {
                    return 1;
                }
                if hooks.inner.records().len() != 3 {
                    return 2;
                }
                0
            }))
            .unwrap_or(100);
            // SAFETY: leaves the child without running the parent's exit handlers.
            unsafe { libc::_exit(code) };
        }
        let pid = CHILD.load(Ordering::SeqCst);
        assert!(pid > 0, "the tool's ENQUEUE EXIT did not fork");
        assert_eq!(app.wait_zero(third), 0);
        assert_eq!(
            wait_child(pid, Duration::from_secs(30)),
            Some(0),
            "the child (1: its held COMPLETE was never delivered, the wait ran to its limit; \
             2: the record is missing; 100: it panicked; None: it hung)"
        );
        assert!(kreplay_hsa::deliver_held_completions(Duration::from_secs(30)));
    }
}

/// Set in the child of the fork (its own copy of memory).
static IN_CHILD: AtomicBool = AtomicBool::new(false);
/// The child's pid, in the parent.
static CHILD: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(0);
/// The application, for the hooks.
static APP: OnceLock<App> = OnceLock::new();
/// The application signal whose kernel the forking callback waits for before it forks.
static FORK_WAITS_FOR: AtomicUsize = AtomicUsize::new(0);

/// ENQUEUE EXIT forks once (armed), after the write's kernel finished; the first COMPLETE
/// waits for the second.
struct Forking {
    armed: AtomicBool,
    completed: AtomicUsize,
    first_waits: AtomicBool,
}

impl Wrap for Forking {
    fn dispatch_completed(&self, inner: &TestHooks, record: &DispatchRecord) {
        inner.dispatch_completed(record);
        self.completed.fetch_add(1, Ordering::SeqCst);
        if self.first_waits.swap(false, Ordering::SeqCst) {
            let deadline = Instant::now() + Duration::from_secs(10);
            while self.completed.load(Ordering::SeqCst) < 2 && Instant::now() < deadline {
                std::thread::yield_now();
            }
        }
    }
    fn dispatch_enqueue(&self, submit: &mut dyn FnMut()) {
        submit();
        if self.armed.swap(false, Ordering::SeqCst) {
            // The kernel finishes (its COMPLETE is held until this callback returns) before the
            // fork.
            let signal = hsa_signal_t {
                handle: FORK_WAITS_FOR.load(Ordering::SeqCst) as u64,
            };
            let deadline = Instant::now() + Duration::from_secs(10);
            let app = APP.get().expect("installed");
            while app.load(signal) != 0 && Instant::now() < deadline {
                std::thread::yield_now();
            }
            // SAFETY: the child only returns from this callback, asks for the held records and
            // leaves with _exit (see the scenario).
            let pid = unsafe { libc::fork() };
            if pid == 0 {
                IN_CHILD.store(true, Ordering::SeqCst);
            } else {
                CHILD.store(pid, Ordering::SeqCst);
            }
        }
    }
}
