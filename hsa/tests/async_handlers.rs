//! The runtime's asynchronous-handler thread runs the application's
//! `hsa_amd_signal_async_handler` callbacks. An application handler that issues a (fenced)
//! runtime write into the replayed agent's memory waits for the replay; a tool's async copy from
//! a replay callback, which the replay waits for, must not need that thread to be counted as
//! landed (it did: nothing moved).

#[macro_use]
#[allow(dead_code, unused_macros)]
mod support;

use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use hsa_sys::*;
use kreplay_drain::DrainConfig;
use kreplay_hsa::InstallOptions;
use kreplay_passloop::{LoopEnd, ReplayOutcome};
use kreplay_softhsa::WorkGroup;
use support::app::{self, App, Aql, Ptr, WAIT};
use support::bounded;
use support::tool::{Script, TestHooks};

#[repr(C)]
#[derive(Clone, Copy)]
struct Args {
    buf: u64,
    len: u32,
    pad: u32,
}

static PASS_RUNNING: AtomicBool = AtomicBool::new(false);
static HANDLER_ENTERED: AtomicBool = AtomicBool::new(false);
static HANDLER_DONE: AtomicBool = AtomicBool::new(false);
/// The application's other buffer (GPU 0), written by the handler.
static OTHER: AtomicU64 = AtomicU64::new(0);
/// The App, for the handler.
static APP: std::sync::OnceLock<App> = std::sync::OnceLock::new();

const WORDS: usize = 256;

/// `buf[i] += 1`; the first run waits (bounded) until the application's handler is blocked.
fn gated_add(group: &WorkGroup) {
    // SAFETY: every dispatch of this kernel carries an `Args` block.
    let args: Args = unsafe { group.kernargs() };
    if group.group_id() == [0, 0, 0] && !PASS_RUNNING.swap(true, Ordering::SeqCst) {
        let deadline = Instant::now() + Duration::from_secs(2);
        while !HANDLER_ENTERED.load(Ordering::SeqCst) && Instant::now() < deadline {
            std::thread::yield_now();
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    for [i, _, _] in group.work_items() {
        if i < args.len {
            // SAFETY: the buffer holds `len` u32; each work-item owns index `i`.
            unsafe { *(args.buf as *mut u32).add(i as usize) += 1 };
        }
    }
}

/// The application's handler: when its event fires, it writes its other buffer of GPU 0.
unsafe extern "C" fn app_handler(_value: hsa_signal_value_t, _arg: *mut c_void) -> bool {
    HANDLER_ENTERED.store(true, Ordering::SeqCst);
    let app = APP.get().expect("set");
    app.write(Ptr(OTHER.load(Ordering::SeqCst)), &[0x5eed; WORDS]);
    HANDLER_DONE.store(true, Ordering::SeqCst);
    false
}

static TOOL_COPIES: AtomicBool = AtomicBool::new(true);

scenarios! {
    /// Control: the same without the tool's copy (the handler simply waits for the replay).
    fn an_app_async_handler_writing_the_agent_waits_for_the_replay() {
        TOOL_COPIES.store(false, Ordering::SeqCst);
        handler_scenario();
    }

    /// A tool copies from PASS ENTER of pass 1 (re-entrant work, supported); the application's
    /// async handler is blocked in `hsa_memory_copy` into GPU 0 memory meanwhile.
    fn an_app_async_handler_writing_the_agent_and_a_tool_copy_do_not_deadlock() {
        handler_scenario();
    }
}

fn handler_scenario() {
    let hooks = TestHooks::new(0);
    let app = app::install(
        hooks.clone(),
        InstallOptions {
            drain: DrainConfig::new(Duration::from_secs(1)),
            ..Default::default()
        },
    );
    APP.set(app).ok();
    hooks.configure_replay(true);
    let gpu0 = app.gpus[0];
    let pools = app.pools(gpu0);
    let init: Vec<u32> = (0..WORDS as u32).map(|i| 5 * i).collect();
    let buf = app.buffer(pools.coarse, &init);
    let other = app.buffer(pools.coarse, &[1; WORDS]);
    OTHER.store(other.0, Ordering::SeqCst);
    let scratch = app.buffer(pools.coarse, &[0; WORDS]);
    let source = app.buffer(app.host_pool(), &[7; WORDS]);
    let tool_done = app.signal(1);
    let cpu = app.cpu;
    hooks.set_script(Script::passes(3).on_pass_enter(move |_, _, pass, _| {
        if pass == 1 && TOOL_COPIES.load(Ordering::SeqCst) {
            // The tool saves something with an async copy (it does not even wait for it).
            app.async_copy(scratch, gpu0, source, cpu, WORDS * 4, tool_done);
        }
    }));

    let event = app.signal(1);
    let register = app
        .amd()
        .hsa_amd_signal_async_handler_fn
        .expect("async handler");
    // SAFETY: a live signal, a handler of the right type.
    let status = unsafe {
        register(
            event,
            HSA_SIGNAL_CONDITION_EQ,
            0,
            Some(app_handler),
            std::ptr::null_mut(),
        )
    };
    assert_eq!(status, HSA_STATUS_SUCCESS);

    let kernel = kreplay_softhsa::register_kernel("handlers_gated_add", gated_add);
    let kernarg = app.kernargs(
        &pools,
        Args {
            buf: buf.0,
            len: WORDS as u32,
            pad: 0,
        },
    );
    let q = app.queue(gpu0);
    let done = app.signal(1);
    let store = app.core().hsa_signal_store_screlease_fn.expect("store");
    let jobs: Vec<Box<dyn FnOnce() -> i64 + Send>> = vec![
        Box::new(move || {
            app.dispatch(q, Aql::dispatch(kernel, WORDS as u32, 64, kernarg, done));
            app.wait_zero(done)
        }),
        Box::new(move || {
            let deadline = Instant::now() + WAIT;
            while !PASS_RUNNING.load(Ordering::SeqCst) && Instant::now() < deadline {
                std::thread::yield_now();
            }
            // The application's event fires while GPU 0's replay runs.
            // SAFETY: a live signal.
            unsafe { store(event, 0) };
            0
        }),
    ];
    let results = bounded(Duration::from_secs(15), jobs);
    assert_eq!(results[0], 0, "the dispatch completed");
    let deadline = Instant::now() + WAIT;
    while !HANDLER_DONE.load(Ordering::SeqCst) && Instant::now() < deadline {
        std::thread::yield_now();
    }
    assert!(
        HANDLER_DONE.load(Ordering::SeqCst),
        "the application's handler finished"
    );
    let dispatch = hooks.configured_dispatches()[0].dispatch_id;
    assert_eq!(
        hooks.finished_record(dispatch).outcome,
        ReplayOutcome::Replayed {
            passes: 3,
            end: LoopEnd::LastPass
        }
    );
    assert_eq!(
        app.read(other, WORDS),
        vec![0x5eed; WORDS],
        "the handler's write kept"
    );
    let expected: Vec<u32> = init.iter().map(|v| v + 1).collect();
    assert_eq!(app.read(buf, WORDS), expected, "single-run results");
}
