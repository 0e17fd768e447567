//! Runtime writes that bypass kernels, racing a replay on the same agent (docs/abi.md §3 rule 9).
//!
//! A dispatch on GPU 0 is replayed 3 times; while its first pass runs, another thread writes a
//! *different* coarse-grained buffer of GPU 0 through one of the runtime's write paths. Every
//! coarse buffer of the agent is in the replay's snapshot, so a write that lands mid-replay is
//! reverted by the next restore (all 4096 words lost). Fenced, the write waits for the replay to
//! end and is what memory ends with.
//!
//! The first pass's kernel waits (bounded) for the write to return before it finishes: without
//! the fence the write lands while the pass runs, every time; with it, the write cannot return
//! before the replay ends, so the pass waits out its bound, which is what the test checks.

#[macro_use]
#[allow(dead_code, unused_macros)]
mod support;

use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use hsa_sys::*;
use kreplay_drain::DrainConfig;
use kreplay_hsa::InstallOptions;
use kreplay_passloop::{LoopEnd, ReplayOutcome};
use kreplay_snapshot::{RestoreStrategy, SnapshotConfig};
use kreplay_softhsa::WorkGroup;
use support::app::{self, App, Aql, Pools, Ptr, WAIT};
use support::tool::{Script, TestHooks};

/// Words the racing write covers.
const WORDS: usize = 4096;
/// How long the first pass waits for the racing write to return.
const WRITE_WINDOW: Duration = Duration::from_millis(300);

/// Set by the first pass's kernel once it runs (the replay window is open).
static PASS_RUNNING: AtomicBool = AtomicBool::new(false);
/// Set by the writing thread once its write returned (or, for an asynchronous write, landed).
static WRITE_DONE: AtomicBool = AtomicBool::new(false);
/// Set if any pass saw the write done while the replay was still running.
static WRITE_SEEN_MID_REPLAY: AtomicBool = AtomicBool::new(false);

#[repr(C)]
#[derive(Clone, Copy)]
struct Args {
    buf: u64,
    len: u32,
    pad: u32,
}

/// `buf[i] += 1`; the first run also opens the window for the racing write and gives it up to
/// [`WRITE_WINDOW`] to complete.
fn racing_add(group: &WorkGroup) {
    // SAFETY: every dispatch of this kernel carries an `Args` block.
    let args: Args = unsafe { group.kernargs() };
    if group.group_id() == [0, 0, 0] {
        if !PASS_RUNNING.swap(true, Ordering::SeqCst) {
            let deadline = Instant::now() + WRITE_WINDOW;
            while !WRITE_DONE.load(Ordering::SeqCst) && Instant::now() < deadline {
                std::thread::yield_now();
            }
        }
        if WRITE_DONE.load(Ordering::SeqCst) {
            WRITE_SEEN_MID_REPLAY.store(true, Ordering::SeqCst);
        }
    }
    for [i, _, _] in group.work_items() {
        if i < args.len {
            // SAFETY: `buf` holds `len` u32; each work-item owns index `i`.
            unsafe { *(args.buf as *mut u32).add(i as usize) += 1 };
        }
    }
}

/// Checks an HSA status.
fn ok(status: hsa_status_t, what: &str) {
    assert_eq!(status, HSA_STATUS_SUCCESS, "{what} failed with {status:#x}");
}

/// One runtime write path: writes [`WORDS`] words of `value` into `target` (a coarse buffer of
/// GPU 0) and returns once they landed. `source` is a host buffer holding those words.
type Write = fn(app: &App, target: Ptr, source: Ptr, value: u32);

/// Waits for an application completion signal of an asynchronous write.
fn landed(app: &App, signal: hsa_signal_t) {
    assert_eq!(app.wait_zero(signal), 0, "the write completed");
}

fn with_memory_copy(app: &App, target: Ptr, _source: Ptr, value: u32) {
    app.write(target, &[value; WORDS]);
}

fn with_memory_fill(app: &App, target: Ptr, _source: Ptr, value: u32) {
    let fill = app
        .amd()
        .hsa_amd_memory_fill_fn
        .expect("hsa_amd_memory_fill");
    // SAFETY: `target` holds WORDS u32 of a live allocation.
    ok(unsafe { fill(target.raw(), value, WORDS) }, "memory fill");
}

fn with_async_copy_rect(app: &App, target: Ptr, source: Ptr, _value: u32) {
    let rect = app
        .amd()
        .hsa_amd_memory_async_copy_rect_fn
        .expect("hsa_amd_memory_async_copy_rect");
    // 16 rows of 1 KiB, one slice.
    let pitched = |p: Ptr| hsa_pitched_ptr_t {
        base: p.raw(),
        pitch: 1024,
        slice: WORDS * 4,
    };
    let origin = hsa_dim3_t { x: 0, y: 0, z: 0 };
    let range = hsa_dim3_t {
        x: 1024,
        y: (WORDS * 4 / 1024) as u32,
        z: 1,
    };
    let done = app.signal(1);
    // SAFETY: both pitched regions lie inside live allocations of WORDS u32; the structs are
    // alive for the call.
    let status = unsafe {
        rect(
            &pitched(target),
            &origin,
            &pitched(source),
            &origin,
            &range,
            app.gpus[0],
            hsaHostToDevice,
            0,
            std::ptr::null(),
            done,
        )
    };
    ok(status, "rect copy");
    landed(app, done);
}

fn with_async_copy_on_engine(app: &App, target: Ptr, source: Ptr, _value: u32) {
    let amd = app.amd_v2().expect("a ROCm 5.6+ table");
    let copy = amd
        .hsa_amd_memory_async_copy_on_engine_fn
        .expect("hsa_amd_memory_async_copy_on_engine");
    let done = app.signal(1);
    // SAFETY: both ranges are WORDS u32 of live allocations; engine 0 exists on softhsa.
    let status = unsafe {
        copy(
            target.raw(),
            app.gpus[0],
            source.0 as *const c_void,
            app.cpu,
            WORDS * 4,
            0,
            std::ptr::null(),
            done,
            1,
            false,
        )
    };
    ok(status, "copy on engine");
    landed(app, done);
}

/// Replays a dispatch on GPU 0 three times while `write` fills another coarse buffer of GPU 0
/// during the first pass; checks that nothing of the write is lost and that the kernel's own
/// buffer holds single-run results.
fn race(strategy: RestoreStrategy, write: Write) {
    let snapshot = SnapshotConfig::default().with_strategy(strategy);
    let hooks = TestHooks::new(0);
    let app = app::install(
        hooks.clone(),
        InstallOptions {
            drain: DrainConfig::new(WAIT),
            snapshot,
            ..Default::default()
        },
    );
    hooks.configure_replay(true);
    hooks.set_script(Script::passes(3));
    let pools: Pools = app.pools(app.gpus[0]);
    let init: Vec<u32> = (0..256).map(|i| 7 * i).collect();
    let buf = app.buffer(pools.coarse, &init);
    let target = app.buffer(pools.coarse, &[1; WORDS]);
    let source = app.buffer(app.host_pool(), &[0x5eed; WORDS]);
    let kernel = kreplay_softhsa::register_kernel("racing_add", racing_add);
    let kernarg = app.kernargs(
        &pools,
        Args {
            buf: buf.0,
            len: 256,
            pad: 0,
        },
    );

    let writer = std::thread::spawn(move || {
        let deadline = Instant::now() + WAIT;
        while !PASS_RUNNING.load(Ordering::SeqCst) && Instant::now() < deadline {
            std::thread::yield_now();
        }
        assert!(PASS_RUNNING.load(Ordering::SeqCst), "the first pass ran");
        write(&app, target, source, 0x5eed);
        WRITE_DONE.store(true, Ordering::SeqCst);
    });
    let q = app.queue(app.gpus[0]);
    let done = app.signal(1);
    app.dispatch(q, Aql::dispatch(kernel, 256, 64, kernarg, done));
    assert_eq!(
        app.wait_zero(done),
        0,
        "the application's dispatch completed"
    );
    writer.join().expect("the writing thread ends");

    let dispatch = hooks.configured_dispatches()[0].dispatch_id;
    assert_eq!(
        hooks.finished_record(dispatch).outcome,
        ReplayOutcome::Replayed {
            passes: 3,
            end: LoopEnd::LastPass
        }
    );
    let lost = app
        .read(target, WORDS)
        .iter()
        .filter(|&&w| w != 0x5eed)
        .count();
    assert_eq!(lost, 0, "{lost} of {WORDS} written words were lost");
    assert!(
        !WRITE_SEEN_MID_REPLAY.load(Ordering::SeqCst),
        "the write completed while the replay was running"
    );
    let expected: Vec<u32> = init.iter().map(|v| v + 1).collect();
    assert_eq!(app.read(buf, 256), expected, "single-run results");
}

scenarios! {
    /// `hsa_memory_copy` into another coarse buffer of the agent, full restores.
    fn an_hsa_memory_copy_during_a_replay_is_not_undone_by_a_full_restore() {
        race(RestoreStrategy::Full, with_memory_copy);
    }

    /// The same under write-set restores.
    fn an_hsa_memory_copy_during_a_replay_is_not_undone_by_a_writeset_restore() {
        race(RestoreStrategy::Writeset, with_memory_copy);
    }

    /// `hsa_amd_memory_fill` into another coarse buffer of the agent.
    fn a_memory_fill_during_a_replay_is_not_undone_by_a_restore() {
        race(RestoreStrategy::Full, with_memory_fill);
    }

    /// `hsa_amd_memory_async_copy_rect` into another coarse buffer of the agent.
    fn a_rect_copy_during_a_replay_is_not_undone_by_a_restore() {
        race(RestoreStrategy::Writeset, with_async_copy_rect);
    }
}

/// `hsa_amd_memory_async_copy_on_engine` (ROCm 5.6+ tables only) into another coarse buffer of
/// the agent.
#[test]
fn a_copy_on_engine_during_a_replay_is_not_undone_by_a_restore() {
    support::isolated_on(
        "a_copy_on_engine_during_a_replay_is_not_undone_by_a_restore",
        &["5.6", "6.2"],
        || race(RestoreStrategy::Full, with_async_copy_on_engine),
    );
}
