//! The start of a handler call of a queue the application destroys meanwhile: a replay on
//! another queue of the agent rings the application's idle queue for a drain marker; the
//! runtime hands that store to a doorbell thread of its own (the replay runs inside a handler),
//! whose handler call has begun when the application destroys the idle queue. The call must go
//! on with state that is still there, and end.
//!
//! Memory freed while the destroy runs is filled with a pattern and kept (this test binary's
//! allocator), so that a handler call reading state freed under it reads garbage, not the
//! values it had.

// Each test file uses part of the shared harness.
#[allow(dead_code)]
#[macro_use]
mod support;

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use kreplay_ctxmask::ContextRegistry;
use kreplay_drain::DrainConfig;
use kreplay_hsa::{DispatchRecord, InstallOptions, ToolHooks};
use kreplay_passloop::{DispatchInfo, ReplayRecord, ReplayTool};
use kreplay_softhsa::WorkGroup;
use support::app::{self, Aql, WAIT};
use support::tool::{Script, TestHooks};
use support::{bounded, wait_flag};

/// While set, freed memory is overwritten with [`POISON_BYTE`] and never handed out again.
static POISON: AtomicBool = AtomicBool::new(false);
const POISON_BYTE: u8 = 0xa5;

struct Poisoning;

// SAFETY: every block comes from `System` with the caller's layout; a block freed while
// `POISON` is set is overwritten (it is the caller's no more) and kept, never reused.
unsafe impl GlobalAlloc for Poisoning {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded from the caller.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        if POISON.load(Ordering::SeqCst) {
            // SAFETY: the caller hands back `layout.size()` bytes it owned at `ptr`.
            unsafe { std::ptr::write_bytes(ptr, POISON_BYTE, layout.size()) };
            return;
        }
        // SAFETY: forwarded from the caller.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: Poisoning = Poisoning;

/// Set: the next handler call that begins on a runtime doorbell thread waits at its start.
static GATE_ARMED: AtomicBool = AtomicBool::new(false);
/// Set once that call waits.
static GATE_ENTERED: AtomicBool = AtomicBool::new(false);
/// Lets it go on.
static GATE_OPEN: AtomicBool = AtomicBool::new(false);

/// The name softhsa gives the threads that serve doorbell stores made from inside handlers (as
/// ROCm's asynchronous doorbell thread does), as the kernel keeps it (15 bytes).
const DOORBELL_THREAD: &str = "softhsa-doorbel";

/// [`TestHooks`], but the first question a handler call on a doorbell thread asks (whether a
/// replay service is configured, its first) waits until the test lets it go on.
struct Gated(Arc<TestHooks>);

impl ToolHooks for Gated {
    fn replay_configured(&self) -> bool {
        let on_doorbell_thread = std::thread::current()
            .name()
            .is_some_and(|n| n.starts_with(DOORBELL_THREAD));
        if on_doorbell_thread && GATE_ARMED.swap(false, Ordering::SeqCst) {
            GATE_ENTERED.store(true, Ordering::SeqCst);
            wait_flag(&GATE_OPEN);
        }
        self.0.replay_configured()
    }
    fn dispatch_tracing_configured(&self) -> bool {
        self.0.dispatch_tracing_configured()
    }
    fn replay_tool(&self) -> Box<dyn ReplayTool + '_> {
        self.0.replay_tool()
    }
    fn contexts(&self) -> &ContextRegistry {
        self.0.contexts()
    }
    fn dispatch_completed(&self, record: &DispatchRecord) {
        self.0.dispatch_completed(record)
    }
    fn dispatch_enqueue(
        &self,
        infos: &[DispatchInfo],
        pass: Option<u64>,
        submit: &mut dyn FnMut(),
    ) {
        self.0.dispatch_enqueue(infos, pass, submit)
    }
    fn replay_finished(&self, record: &ReplayRecord) {
        self.0.replay_finished(record)
    }
    fn warn(&self, message: &str) {
        self.0.warn(message)
    }
    fn warn_once(&self, key: &'static str, message: &str) {
        self.0.warn_once(key, message)
    }
}

const WORDS: usize = 64;

#[repr(C)]
#[derive(Clone, Copy)]
struct AddArgs {
    buf: u64,
    len: u32,
    add: u32,
}

/// `buf[i] += add`.
fn add(group: &WorkGroup) {
    // SAFETY: every dispatch of this kernel carries an `AddArgs` block.
    let args: AddArgs = unsafe { group.kernargs() };
    for [i, _, _] in group.work_items() {
        if i < args.len {
            // SAFETY: the buffer holds `len` u32s; each work-item owns index `i`.
            unsafe { *(args.buf as *mut u32).add(i as usize) += args.add };
        }
    }
}

/// Threads of this process serving doorbell stores now.
fn doorbell_threads() -> usize {
    std::fs::read_dir("/proc/self/task")
        .map(|tasks| {
            tasks
                .filter_map(Result::ok)
                .filter_map(|t| std::fs::read_to_string(t.path().join("comm")).ok())
                .filter(|comm| comm.trim_end().starts_with(DOORBELL_THREAD))
                .count()
        })
        .unwrap_or(0)
}

scenarios! {
    /// Queue I, idle (its one dispatch long done), is rung by the drain of a replay on queue Q
    /// of the same agent; the doorbell thread's handler call of I has begun when the
    /// application destroys I. The destroy returns, the replayed dispatch completes once, and
    /// the handler call of I goes on and ends: it read the state kreplay keeps for I, freed by
    /// the destroy under it (it waited for the lock of freed memory for ever).
    fn a_handler_call_begun_before_its_queue_is_destroyed_ends() {
        let hooks = TestHooks::new(0);
        let app = app::install(
            Arc::new(Gated(hooks.clone())),
            InstallOptions { drain: DrainConfig::new(WAIT), ..Default::default() },
        );
        let gpu = app.gpus[0];
        let pools = app.pools(gpu);
        let kernel = kreplay_softhsa::register_kernel("entry_add", add);
        let args = |buf: support::app::Ptr| {
            app.kernargs(&pools, AddArgs { buf: buf.0, len: WORDS as u32, add: 1 })
        };
        // I ran a dispatch before any replay service: the next drain asks it for a marker.
        let idle = app.queue(gpu);
        let idle_buf = app.buffer(pools.coarse, &[1; WORDS]);
        let idle_done = app.signal(1);
        app.dispatch(idle, Aql::dispatch(kernel, WORDS as u32, 64, args(idle_buf), idle_done));
        assert_eq!(app.wait_zero(idle_done), 0, "I's dispatch completed");

        hooks.configure_replay(true);
        hooks.set_script(Script::passes(2));
        GATE_ARMED.store(true, Ordering::SeqCst);
        let q = app.queue(gpu);
        let buf = app.buffer(pools.coarse, &[5; WORDS]);
        let done = app.signal(1);
        let dispatch = Aql::dispatch(kernel, WORDS as u32, 64, args(buf), done);
        let replaying = std::thread::spawn(move || {
            app.dispatch(q, dispatch);
            app.wait_zero_within(done, WAIT * 2)
        });
        assert!(wait_flag(&GATE_ENTERED), "the drain rang I, and a doorbell thread handles it");

        POISON.store(true, Ordering::SeqCst);
        let started = Instant::now();
        app.destroy_queue(idle);
        let destroy_took = started.elapsed();
        let completed = replaying.join().expect("the replaying thread ends");
        POISON.store(false, Ordering::SeqCst);
        assert!(destroy_took < WAIT, "the destroy of I returned (took {destroy_took:?})");
        assert_eq!(completed, 0, "the replayed dispatch completed");
        assert_eq!(app.read(buf, WORDS), vec![6; WORDS], "it ran once");

        GATE_OPEN.store(true, Ordering::SeqCst);
        let ended = bounded(WAIT * 2, vec![Box::new(|| {
            let deadline = Instant::now() + Duration::from_secs(5);
            while doorbell_threads() > 0 && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(5));
            }
            doorbell_threads()
        })]);
        assert_eq!(ended, vec![0], "the handler call of the destroyed queue I ended");
    }
}
