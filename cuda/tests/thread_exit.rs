//! Launches on application threads that are cancelled during their replay, or that launch
//! from a thread-local destructor at thread exit, over the host fake of `window_host.rs`.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kreplay_ctxmask::ContextRegistry;
use kreplay_cuda::{LaunchOps, Window};
use kreplay_passloop::{
    ContinueChange, DispatchInfo, MemoryOpReport, Phase, ReplayOutcome, ReplayTool, RestoreRequest,
    ToolAnswer,
};
use kreplay_snapshot::SnapshotConfig;

mod fake_device;
use fake_device::{HostMemory, OneDevice};

const AGENT: u64 = 0;
const WORDS: usize = 1024;
const PASSES: u64 = 3;

/// The fake's launch: `relaunch` adds 1 to every word.
struct AddOne(Arc<HostMemory>);

impl LaunchOps for AddOne {
    fn replayable(&self) -> Result<(), String> {
        Ok(())
    }
    fn drain(&self) -> Result<(), String> {
        Ok(())
    }
    fn wait(&self) -> Result<(), String> {
        Ok(())
    }
    fn relaunch(&self) -> Result<(), String> {
        self.0.add_one();
        Ok(())
    }
}

/// What a tool's PASS ENTER of pass 1 does.
type OnPass1 = fn();

/// A tool asking for [`PASSES`] that runs `on_pass_1` in PASS ENTER of pass 1 and keeps the
/// outcome CONFIG EXIT gives it.
struct Tool {
    on_pass_1: OnPass1,
    outcome: Arc<Mutex<Option<ReplayOutcome>>>,
}

impl ReplayTool for Tool {
    fn config_enter(&mut self, _: &DispatchInfo) -> ToolAnswer {
        ToolAnswer::passes(PASSES)
    }
    fn pass_enter(&mut self, _: &DispatchInfo, pass: u64, _: u64) {
        if pass == 1 {
            (self.on_pass_1)();
        }
    }
    fn pass_exit(&mut self, _: &DispatchInfo, _: u64, _: u64) -> ContinueChange {
        ContinueChange::Keep
    }
    fn should_continue(&mut self, _: &DispatchInfo, _: u64, _: u64) -> bool {
        true
    }
    fn snapshot(&mut self, _: &DispatchInfo, _: Phase, _: &MemoryOpReport) {}
    fn restore(&mut self, _: &DispatchInfo, _: Phase, _: &RestoreRequest, _: &MemoryOpReport) {}
    fn config_exit(&mut self, _: &DispatchInfo, outcome: &ReplayOutcome) {
        *self.outcome.lock().unwrap() = Some(outcome.clone());
    }
}

/// One device and the outcome its launch's tool was given.
struct Rig {
    device: OneDevice,
    registry: ContextRegistry,
    outcome: Arc<Mutex<Option<ReplayOutcome>>>,
}

impl Rig {
    fn new() -> Rig {
        Rig {
            device: OneDevice::new(WORDS, AGENT, SnapshotConfig::default()),
            registry: ContextRegistry::new(),
            outcome: Arc::default(),
        }
    }

    /// ENTER, the application's launch, EXIT, as the CUPTI callbacks of one launch run them.
    fn launch(&self, on_pass_1: OnPass1) {
        let ops = AddOne(self.device.memory.clone());
        let mut tool = Tool {
            on_pass_1,
            outcome: self.outcome.clone(),
        };
        let cx = self.device.context(&self.registry);
        let window = Window::enter(cx, &mut tool, DispatchInfo::default(), &ops);
        self.device.memory.add_one();
        window.exit(&mut tool, &self.registry, &ops, Ok(()));
    }

    /// Memory is as one run of the kernel leaves it, and the tool was told the launch was
    /// replayed.
    fn expect_replayed_once(&self) {
        let words = self.device.memory.0.lock().unwrap().clone();
        let bad = (0..WORDS).find(|&i| words[i] != i as u32 + 1);
        assert_eq!(bad, None, "word {bad:?} is not what one run leaves");
        let outcome = self.outcome.lock().unwrap().clone();
        assert!(
            matches!(outcome, Some(ReplayOutcome::Replayed { .. })),
            "{outcome:?}"
        );
    }
}

/// Waits (at most 10 s) for `flag`.
fn wait_flag(flag: &AtomicBool) -> bool {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !flag.load(Ordering::SeqCst) {
        if Instant::now() > deadline {
            return false;
        }
        std::thread::yield_now();
    }
    true
}

/// glibc's and musl's value.
const PTHREAD_CANCEL_DISABLE: libc::c_int = 1;

unsafe extern "C" {
    fn pthread_cancel(thread: libc::pthread_t) -> libc::c_int;
    fn pthread_setcancelstate(state: libc::c_int, old: *mut libc::c_int) -> libc::c_int;
}

/// Runs `routine(arg)` on a new raw thread (as a C application's) and returns it.
fn raw_thread(
    routine: extern "C" fn(*mut libc::c_void) -> *mut libc::c_void,
    arg: *mut libc::c_void,
) -> libc::pthread_t {
    // SAFETY: zeroed storage for the new thread's id.
    let mut thread: libc::pthread_t = unsafe { std::mem::zeroed() };
    // SAFETY: a start routine and an argument that outlives the thread.
    let created = unsafe { libc::pthread_create(&mut thread, std::ptr::null(), routine, arg) };
    assert_eq!(created, 0);
    thread
}

static CANCEL_HELD: AtomicBool = AtomicBool::new(false);
static CANCEL_RELEASE: AtomicBool = AtomicBool::new(false);
static CANCEL_RETURNED: AtomicBool = AtomicBool::new(false);

/// The cancelled thread's launch: holds pass 1 until released, then reaches a cancellation
/// point, as a tool's `printf` does.
fn held_then_cancellation_point() {
    CANCEL_HELD.store(true, Ordering::SeqCst);
    if wait_flag(&CANCEL_RELEASE) {
        // SAFETY: no preconditions; a cancellation point.
        unsafe { libc::usleep(1) };
    }
}

/// The application's thread: launches, then turns cancellation off so that the request made
/// meanwhile does not act in this test's own code.
extern "C" fn cancellable(arg: *mut libc::c_void) -> *mut libc::c_void {
    // SAFETY: `arg` is the rig the test leaked for this thread.
    let rig = unsafe { &*arg.cast::<Rig>() };
    rig.launch(held_then_cancellation_point);
    // SAFETY: a plain call on this thread's own cancellation state.
    unsafe { pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, std::ptr::null_mut()) };
    CANCEL_RETURNED.store(true, Ordering::SeqCst);
    std::ptr::null_mut()
}

/// The application cancels its thread while that thread's launch is being replayed, and the
/// tool then reaches a cancellation point in PASS ENTER. The replay finishes, the launch's API
/// EXIT returns and the cancellation is left for the application's own code, as without
/// kreplay (a launch has no cancellation point). Before, the cancellation unwound through
/// kreplay's frames inside the CUPTI callback: the process aborted ("exception not
/// rethrown") or the replay was cut with memory unrestored and the device lock held.
#[test]
fn a_thread_cancelled_during_its_replay_finishes_the_replay_first() {
    let rig: &'static Rig = Box::leak(Box::new(Rig::new()));
    let thread = raw_thread(cancellable, std::ptr::from_ref(rig).cast_mut().cast());
    assert!(wait_flag(&CANCEL_HELD), "the replay never reached pass 1");
    // SAFETY: `thread` is alive: it is held inside its replay.
    assert_eq!(unsafe { pthread_cancel(thread) }, 0);
    CANCEL_RELEASE.store(true, Ordering::SeqCst);
    assert!(
        wait_flag(&CANCEL_RETURNED),
        "the cancelled thread's launch never returned"
    );
    // SAFETY: the thread returned from its routine (or is about to); joined once.
    let joined = unsafe { libc::pthread_join(thread, std::ptr::null_mut()) };
    assert_eq!(joined, 0);
    rig.expect_replayed_once();
    assert!(
        rig.device.locks.write(AGENT).is_ok(),
        "the device lock was given back"
    );
}

/// The rig the thread-local destructor launches on, and what came of it.
static LATE_RIG: Mutex<Option<&'static Rig>> = Mutex::new(None);
/// Set by the destructor: whether its launch panicked.
static LATE_PANICKED: Mutex<Option<bool>> = Mutex::new(None);

/// A destructor of thread-specific data (as a C++ `thread_local`'s or a `pthread_key_create`
/// destructor of the application's), run at thread exit after Rust's thread-locals, kreplay's
/// included, were destroyed: it launches.
extern "C" fn launch_at_thread_exit(_value: *mut libc::c_void) {
    // Nothing unwinds out of the destructor: a panic is what the test reports.
    let panicked = std::panic::catch_unwind(|| {
        let rig = LATE_RIG.lock().unwrap().expect("a rig");
        rig.launch(|| {});
    })
    .is_err();
    if let Ok(mut seen) = LATE_PANICKED.lock() {
        *seen = Some(panicked);
    }
}

/// The application's thread: a first launch (kreplay's thread-locals come to life), then a
/// value whose destructor launches again at thread exit.
extern "C" fn launches_then_exits(arg: *mut libc::c_void) -> *mut libc::c_void {
    // SAFETY: `arg` is the rig the test leaked for this thread.
    let rig = unsafe { &*arg.cast::<Rig>() };
    rig.launch(|| {});
    // SAFETY: zeroed storage for the key.
    let mut key: libc::pthread_key_t = unsafe { std::mem::zeroed() };
    // SAFETY: a valid out pointer and a destructor that never unwinds.
    let created = unsafe { libc::pthread_key_create(&mut key, Some(launch_at_thread_exit)) };
    assert_eq!(created, 0);
    // SAFETY: a key just created; any non-null value makes the destructor run.
    assert_eq!(unsafe { libc::pthread_setspecific(key, arg) }, 0);
    std::ptr::null_mut()
}

/// A launch the application makes from a thread-local destructor at thread exit, after
/// kreplay's own thread-locals were destroyed, is replayed like any other: the tool gets its
/// CONFIG EXIT and memory is as one run leaves it. Before, the window touched a destroyed
/// thread-local right after the snapshot: a panic (an internal error in the CUPTI callback),
/// the launch run with no replay and the tool never told how it ended.
#[test]
fn a_launch_from_a_thread_local_destructor_is_replayed_and_reported() {
    let first: &'static Rig = Box::leak(Box::new(Rig::new()));
    let late: &'static Rig = Box::leak(Box::new(Rig::new()));
    *LATE_RIG.lock().unwrap() = Some(late);
    let thread = raw_thread(
        launches_then_exits,
        std::ptr::from_ref(first).cast_mut().cast(),
    );
    // SAFETY: a thread of this test, joined once; its destructors ran when this returns.
    let joined = unsafe { libc::pthread_join(thread, std::ptr::null_mut()) };
    assert_eq!(joined, 0);
    first.expect_replayed_once();
    assert_eq!(
        *LATE_PANICKED.lock().unwrap(),
        Some(false),
        "the destructor's launch panicked (None: it never ran)"
    );
    late.expect_replayed_once();
    assert!(
        late.device.locks.write(AGENT).is_ok(),
        "the device lock was given back"
    );
}
