//! Queue lifecycles seen from the application: a destroy the runtime refuses, a queue destroyed
//! by one thread while another thread's replay drains its agent, packet slots reserved by
//! compare-and-swap. Every scenario is bounded in time and asserts what the application sees.

// Each test file uses part of the shared harness.
#[allow(dead_code)]
#[macro_use]
mod support;

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use hsa_sys::*;
use kreplay_drain::DrainConfig;
use kreplay_hsa::InstallOptions;
use kreplay_passloop::{ContinueChange, ToolAnswer};
use kreplay_softhsa::{OwnedApiTable, TableLayout, WorkGroup};
use support::app::{self, App, Aql, Ptr, Queue, WAIT};
use support::tool::{Script, TestHooks};
use support::{bounded, wait_flag};

/// A drain's deadline in these scenarios.
const DRAIN: Duration = Duration::from_millis(500);
/// Words of the buffers the kernels write.
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

/// Set by [`gated_add`] once it runs.
static GATED_STARTED: AtomicBool = AtomicBool::new(false);
/// Lets [`gated_add`] go on.
static GATED_GO: AtomicBool = AtomicBool::new(false);
/// Set by [`gated_add`] once its writes are done.
static GATED_WROTE: AtomicBool = AtomicBool::new(false);

/// [`add`] once [`GATED_GO`] is set (it gives up waiting after [`WAIT`]).
fn gated_add(group: &WorkGroup) {
    GATED_STARTED.store(true, Ordering::SeqCst);
    let deadline = Instant::now() + WAIT;
    while !GATED_GO.load(Ordering::SeqCst) && Instant::now() < deadline {
        std::thread::yield_now();
    }
    add(group);
    GATED_WROTE.store(true, Ordering::SeqCst);
}

fn kernel_args(app: &App, agent: hsa_agent_t, buf: Ptr, len: u32, add: u32) -> Ptr {
    let pools = app.pools(agent);
    app.kernargs(
        &pools,
        AddArgs {
            buf: buf.0,
            len,
            add,
        },
    )
}

/// softhsa's own core table (the runtime under kreplay's wrappers).
fn softhsa_core() -> &'static CoreApiTable {
    // SAFETY: softhsa's table is valid for the process.
    unsafe { &*kreplay_softhsa::api_table().core_ }
}

/// Set to make the runtime refuse the next `hsa_queue_destroy`.
static REFUSE_DESTROY: AtomicBool = AtomicBool::new(false);

/// softhsa's `hsa_queue_destroy`, but for a call made while [`REFUSE_DESTROY`] is set, which
/// the runtime refuses (leaving the queue as it was).
unsafe extern "C" fn queue_destroy_refusing(queue: *mut hsa_queue_t) -> hsa_status_t {
    if REFUSE_DESTROY.swap(false, Ordering::SeqCst) {
        return HSA_STATUS_ERROR;
    }
    let destroy = softhsa_core().hsa_queue_destroy_fn.expect("queue destroy");
    // SAFETY: the caller's queue, forwarded unchanged.
    unsafe { destroy(queue) }
}

/// A table copy of the scenario's layout whose core table `prepare` changed before kreplay is
/// installed into it.
fn table_with(prepare: impl FnOnce(&mut CoreApiTable)) -> &'static mut OwnedApiTable {
    let layout = TableLayout::from_env().expect("a known table layout");
    let table: &'static mut OwnedApiTable =
        Box::leak(Box::new(OwnedApiTable::softhsa_with(layout)));
    // SAFETY: the copy's core table is valid, and only this scenario uses it so far.
    prepare(unsafe { &mut *(*table.as_mut_ptr()).core_ });
    table
}

scenarios! {
    /// The runtime refuses the application's `hsa_queue_destroy` of queue Q, which the
    /// application then goes on using: a kernel on Q writes a buffer while a dispatch on
    /// another queue of the agent, reading and writing the same buffer, comes up for replay.
    /// The replay's drain must wait for Q (or give up and run the dispatch once), as for any
    /// queue: a replay that snapshotted the buffer beside Q's running kernel would restore it
    /// over that kernel's write, and the application would lose it.
    fn a_queue_whose_destroy_was_refused_is_still_drained_by_replays() {
        let table = table_with(|core| core.hsa_queue_destroy_fn = Some(queue_destroy_refusing));
        let hooks = TestHooks::new(0);
        let app = app::install_into(
            table,
            hooks.clone(),
            InstallOptions { drain: DrainConfig::new(DRAIN), ..Default::default() },
        );
        hooks.configure_replay(true);
        // The gated kernel (work-group 32) runs as it is; the other (64) in 2 passes, letting
        // the gated kernel write at the end of its first pass (only a replay that did not wait
        // for it gets there while it runs).
        hooks.set_script(
            Script::new(|_, info| {
                if info.workgroup_size[0] == 64 { ToolAnswer::passes(2) } else { ToolAnswer::OPT_OUT }
            })
            .on_pass_exit(|_, _, pass, _| {
                if pass == 0 {
                    GATED_GO.store(true, Ordering::SeqCst);
                    assert!(wait_flag(&GATED_WROTE), "the gated kernel wrote");
                }
                ContinueChange::Keep
            }),
        );
        let gpu = app.gpus[0];
        let pools = app.pools(gpu);
        let buf = app.buffer(pools.coarse, &[10; WORDS]);
        let q = app.queue(gpu);
        REFUSE_DESTROY.store(true, Ordering::SeqCst);
        let destroy = app.core().hsa_queue_destroy_fn.expect("queue destroy");
        // SAFETY: a live queue of this application.
        let status = unsafe { destroy(q.0) };
        assert_ne!(status, HSA_STATUS_SUCCESS, "the runtime refused the destroy");

        // Q is still the application's: a kernel there adds 100 to the first 32 words.
        let gated = kreplay_softhsa::register_kernel("lifecycle_gated_add", gated_add);
        let gated_done = app.signal(1);
        let gated_args = kernel_args(&app, gpu, buf, 32, 100);
        app.dispatch(q, Aql::dispatch(gated, 32, 32, gated_args, gated_done));
        assert!(wait_flag(&GATED_STARTED), "the gated kernel runs");

        // A dispatch adding 1 to every word, on another queue of the agent.
        let r = app.queue(gpu);
        let kernel = kreplay_softhsa::register_kernel("lifecycle_add", add);
        let done = app.signal(1);
        let args = kernel_args(&app, gpu, buf, WORDS as u32, 1);
        let waited = bounded(WAIT * 3, vec![Box::new(move || {
            app.dispatch(r, Aql::dispatch(kernel, WORDS as u32, 64, args, done));
            app.wait_zero(done)
        })]);
        assert_eq!(waited, vec![0], "the dispatch completed");
        GATED_GO.store(true, Ordering::SeqCst);
        assert_eq!(app.wait_zero(gated_done), 0, "the gated kernel completed");

        let mut expected = vec![111; 32];
        expected.extend([11; 32]);
        assert_eq!(app.read(buf, WORDS), expected, "both kernels' writes are there, once each");
        app.destroy_queue(q);
        app.destroy_queue(r);
    }
}
