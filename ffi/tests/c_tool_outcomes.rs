//! A C tool learns how every replay ended from the payloads alone, and reads the per-process
//! counters through `kreplay_get_counters`: a pass count above `KREPLAY_MAX_PASSES` is declined
//! as invalid_pass_count, an indefinite loop ends early at the cap, a write outside the learned
//! write set is repaired before the very next pass and reported at RESTORE EXIT. Before any of
//! that, `OnLoad(NULL)` is refused without running any tool's initialize, and kreplay still
//! loads afterwards.
//!
//! One test in this file: the loaded library and its tool are process-wide.

mod common;

use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::time::Duration;

use common::outcomes_tool::{self, Event, OutcomesTool};
use kreplay::abi::{
    Counters, DeclineReason, KernelReplayOperation, ReplayEnd, ReplayOutcomeKind, Status,
};
use kreplay_softhsa::testing::{Dispatch, Hsa, PoolKind};
use kreplay_softhsa::{OwnedApiTable, WorkGroup, register_kernel};
use libloading::os::unix::{RTLD_GLOBAL, RTLD_NOW};

/// Elements of the buffer: 2 MiB, many 64 KiB chunks.
const ELEMENTS: usize = 512 * 1024;
/// Elements the kernel increments (the first chunk).
const TOUCHED: u32 = 64;
/// An element far from the touched ones (another chunk), written by one chosen run only.
const STRAY: usize = ELEMENTS / 2;

#[derive(Clone, Copy)]
#[repr(C)]
struct Args {
    data: *mut u32,
}

/// Runs of the kernel so far.
static RUNS: AtomicUsize = AtomicUsize::new(0);
/// The run (1-based) that also writes the stray element (0: none).
static STRAY_ON_RUN: AtomicUsize = AtomicUsize::new(0);
static STRAY_WRITES: AtomicU32 = AtomicU32::new(0);
/// What each run saw at the stray element before writing anything.
static SEEN_AT_STRAY: Mutex<Vec<u32>> = Mutex::new(Vec::new());

/// `x[i] += 1` over the first `TOUCHED` elements; the chosen run also does `x[STRAY] += 1`.
fn touch(group: &WorkGroup) {
    // SAFETY: the test passes an `Args` kernarg block.
    let args: Args = unsafe { group.kernargs() };
    if group.group_id() == [0, 0, 0] {
        let run = RUNS.fetch_add(1, Ordering::SeqCst) + 1;
        // SAFETY: the buffer holds ELEMENTS u32; only work-group 0 touches this element.
        let at_stray = unsafe { args.data.add(STRAY).read() };
        SEEN_AT_STRAY.lock().unwrap().push(at_stray);
        if run == STRAY_ON_RUN.load(Ordering::SeqCst) {
            STRAY_WRITES.fetch_add(1, Ordering::SeqCst);
            // SAFETY: the buffer holds ELEMENTS u32; only work-group 0 writes this element.
            unsafe { *args.data.add(STRAY) += 1 };
        }
    }
    for [x, _, _] in group.work_items() {
        if x < TOUCHED {
            // SAFETY: as above; each work-item owns one element.
            unsafe { *args.data.add(x as usize) += 1 };
        }
    }
}

#[test]
fn a_c_tool_learns_every_outcome_and_reads_the_counters() {
    assert!(
        common::have_compiler("cc"),
        "the C ABI test needs the system C compiler `cc`"
    );
    let tool_path = outcomes_tool::build("c_tool_outcomes");
    // SAFETY: setting the environment before any other thread of this test reads it.
    unsafe {
        std::env::set_var("KREPLAY_TOOL_LIBRARIES", &tool_path);
        std::env::set_var("KREPLAY_MAX_PASSES", "4");
        // A verified write set, learned from pass 0 (what `auto` also does for this 2 MiB
        // footprint where writes cannot be followed; on the software runtime it follows them).
        std::env::set_var("KREPLAY_RESTORE", "writeset");
    }

    let kreplay = common::load_libkreplay(RTLD_NOW | RTLD_GLOBAL);
    let on_load = kreplay.on_load;

    // Bad tables are refused before any tool is initialized...
    // SAFETY: OnLoad must cope with a null table (that is what is tested).
    let loaded = unsafe { on_load(std::ptr::null_mut(), 1, 0, std::ptr::null()) };
    assert!(!loaded, "OnLoad(NULL) fails");
    let mut hollow = OwnedApiTable::softhsa();
    // SAFETY: our own copy; its root is made to point at no core table.
    unsafe { (*hollow.as_mut_ptr()).core_ = std::ptr::null_mut() };
    // SAFETY: OnLoad must refuse a table without a core table (that is what is tested).
    let loaded = unsafe { on_load(hollow.as_mut_ptr(), 1, 0, std::ptr::null()) };
    assert!(!loaded, "OnLoad with a table lacking its core table fails");
    let tool = OutcomesTool::open(&tool_path);
    let before = tool.initialized();
    assert_eq!(
        before, 0,
        "no tool's initialize ran for a table kreplay cannot use"
    );
    // ... and kreplay still loads with a good one.
    let mut table = OwnedApiTable::softhsa();
    // SAFETY: `table` is a valid table we own for the rest of the test.
    let loaded = unsafe { on_load(table.as_mut_ptr(), 1, 0, std::ptr::null()) };
    assert!(loaded, "OnLoad succeeds after a refused OnLoad(NULL)");
    assert_eq!(tool.initialized(), 1, "the tool initialized once");

    // SAFETY: the table stays alive and valid while `hsa` is used.
    let hsa = unsafe { Hsa::from_table(table.table()) };
    let _session = hsa.init().expect("hsa_init");
    let gpu = hsa.gpu_agents().expect("agents")[0];
    let pool = hsa.coarse_pool(gpu).expect("coarse pool");
    let kernarg_pool = hsa.pool(gpu, PoolKind::Kernarg).expect("kernarg pool");
    let kernel = register_kernel("c_tool_outcomes_touch", touch);
    let queue = hsa.queue_create(gpu, 64).expect("queue");
    let data = hsa
        .allocate(pool, ELEMENTS * 4)
        .expect("buffer")
        .cast::<u32>();
    let init: Vec<u32> = (0..ELEMENTS as u32)
        .map(|i| i.wrapping_mul(2654435761))
        .collect();
    // SAFETY: softhsa device memory is host memory; the buffer holds ELEMENTS u32.
    unsafe { std::ptr::copy_nonoverlapping(init.as_ptr(), data, ELEMENTS) };
    let args = hsa
        .allocate(kernarg_pool, std::mem::size_of::<Args>())
        .expect("kernargs")
        .cast::<Args>();
    // SAFETY: the kernarg allocation holds one Args.
    unsafe { args.write(Args { data }) };

    let mut expected_runs = 0usize;
    let mut ran = 0u32;
    let mut dispatch = |passes: u64, with_continue: bool, stray_on_pass: Option<usize>| {
        // SAFETY: the previous dispatch completed; the next is not made yet.
        unsafe { tool.answer(passes, with_continue) };
        let before = RUNS.load(Ordering::SeqCst);
        STRAY_ON_RUN.store(
            stray_on_pass.map_or(0, |p| before + p + 1),
            Ordering::SeqCst,
        );
        let done = hsa.signal_create(1).expect("signal");
        // SAFETY: `queue` is live; the packet names a registered kernel with valid kernargs.
        unsafe {
            hsa.dispatch(
                queue,
                &Dispatch::linear(kernel, TOUCHED, 64, args.cast(), done),
            )
        };
        assert!(
            hsa.wait_zero(done, Duration::from_secs(10)),
            "completion fires"
        );
        assert_eq!(hsa.signal_load(done), 0, "completion fires exactly once");
        hsa.signal_destroy(done).expect("destroy signal");
        ran += 1;
        RUNS.load(Ordering::SeqCst) - before
    };

    // (a) 5 passes with a cap of 4: declined, runs once.
    assert_eq!(dispatch(5, false, None), 1);
    expected_runs += 1;
    // (b) indefinite, continue never says stop: ends early at the cap.
    assert_eq!(dispatch(0, true, None), 4);
    expected_runs += 1;
    // (c) 4 passes; pass 1 also writes far outside what pass 0 wrote. Pass 2 cannot be the
    // last one, yet it must start from the bytes pass 0 saw.
    let seen_before = SEEN_AT_STRAY.lock().unwrap().len();
    assert_eq!(dispatch(4, false, Some(1)), 4);
    let seen: Vec<u32> = SEEN_AT_STRAY.lock().unwrap()[seen_before..].to_vec();
    assert_eq!(
        seen,
        vec![init[STRAY]; 4],
        "every pass saw the bytes the first pass saw"
    );
    expected_runs += 1;
    assert_eq!(
        STRAY_WRITES.load(Ordering::SeqCst),
        1,
        "the stray write happened"
    );
    // (d) one pass: the ordinary path.
    assert_eq!(dispatch(1, false, None), 1);
    expected_runs += 1;

    // SAFETY: every dispatch completed; nothing writes the buffer any more.
    let now = unsafe { std::slice::from_raw_parts(data, ELEMENTS) };
    for (i, (now, init)) in now.iter().zip(&init).enumerate() {
        let want = if i < TOUCHED as usize {
            init.wrapping_add(expected_runs as u32)
        } else {
            *init
        };
        assert_eq!(
            *now, want,
            "element {i}: as after {expected_runs} ordinary runs"
        );
    }

    // What the C tool saw.
    // SAFETY: no replay runs any more.
    let (events, failures) = unsafe { (tool.events(), tool.failures()) };
    let counters = tool.counters();
    assert_eq!(
        failures.0, 0,
        "the C tool's own checks failed: {}",
        failures.1
    );

    let config_exits: Vec<&Event> = events
        .iter()
        .filter(|e| e.operation == KernelReplayOperation::CONFIG.0)
        .collect();
    assert_eq!(config_exits.len(), 4, "{events:#?}");
    let outcome = |e: &Event| {
        (
            ReplayOutcomeKind(e.outcome),
            ReplayEnd(e.end_reason),
            Status(e.status),
            DeclineReason(e.decline_reason),
            e.passes_run,
            e.bytes_lost,
        )
    };
    assert_eq!(
        outcome(config_exits[0]),
        (
            ReplayOutcomeKind::DECLINED,
            ReplayEnd::NONE,
            Status::ERROR_REPLAY_DECLINED,
            DeclineReason::INVALID_PASS_COUNT,
            1,
            0
        ),
        "above the cap"
    );
    assert_eq!(
        DeclineReason(config_exits[0].record_decline_reason),
        DeclineReason::INVALID_PASS_COUNT
    );
    assert_eq!(
        outcome(config_exits[1]),
        (
            ReplayOutcomeKind::ENDED_EARLY,
            ReplayEnd::MAX_PASSES,
            Status::SUCCESS,
            DeclineReason::NONE,
            4,
            0
        ),
        "indefinite loop at the cap"
    );
    assert_eq!(
        outcome(config_exits[2]),
        (
            ReplayOutcomeKind::REPLAYED,
            ReplayEnd::LAST_PASS,
            Status::SUCCESS,
            DeclineReason::NONE,
            4,
            0
        )
    );
    assert_eq!(
        outcome(config_exits[3]),
        (
            ReplayOutcomeKind::RAN_ONCE,
            ReplayEnd::NONE,
            Status::SUCCESS,
            DeclineReason::NONE,
            1,
            0
        )
    );

    // The memory records of dispatch (c).
    let id = config_exits[2].dispatch_id;
    let memory: Vec<&Event> = events
        .iter()
        .filter(|e| e.dispatch_id == id && e.operation != KernelReplayOperation::CONFIG.0)
        .collect();
    assert_eq!(
        memory.len(),
        4,
        "SNAPSHOT EXIT and three RESTORE EXITs: {memory:#?}"
    );
    assert_eq!(memory[0].operation, KernelReplayOperation::SNAPSHOT.0);
    assert_eq!(
        (
            Status(memory[0].status),
            DeclineReason(memory[0].decline_reason)
        ),
        (Status::SUCCESS, DeclineReason::NONE)
    );
    for restore in &memory[1..] {
        assert_eq!(restore.operation, KernelReplayOperation::RESTORE.0);
        assert_eq!(Status(restore.status), Status::SUCCESS);
        assert_eq!(
            (restore.unverified, restore.bytes_lost),
            (0, 0),
            "{restore:?}"
        );
    }
    assert_eq!(memory[1].chunks_repaired, 0, "pass 0 stayed in its set");
    assert_eq!(
        kreplay::abi::RestoreStrategy(memory[2].strategy),
        kreplay::abi::RestoreStrategy::WRITESET,
        "a write-set restore"
    );
    assert_eq!(
        (memory[2].current_pass, memory[2].chunks_repaired),
        (1, 1),
        "the write outside the learned set is repaired before pass 2 and reported"
    );
    assert_eq!(
        memory[3].chunks_repaired, 0,
        "nothing left to repair before pass 3"
    );

    // The counters, as read through the C ABI.
    assert_eq!(counters.size, std::mem::size_of::<Counters>() as u64);
    assert_eq!(counters.dispatches, u64::from(ran));
    assert_eq!(counters.replays, 2);
    assert_eq!(counters.ended_early, 1);
    assert_eq!(counters.passes, 4 + 4);
    assert_eq!(counters.ran_once, 1);
    assert_eq!(counters.declines, 1);
    assert_eq!(
        counters.declines_by_reason[DeclineReason::INVALID_PASS_COUNT.0 as usize],
        1
    );
    assert_eq!(counters.chunks_repaired, 1);
    assert_eq!(counters.unverified_restores, 0);
    assert_eq!((counters.restore_failures, counters.bytes_lost), (0, 0));
    assert!(counters.bytes_snapshotted >= 2 * (ELEMENTS as u64) * 4);
    assert!(counters.bytes_restored > 0);

    // A caller that provides only the first fields gets only those.
    type GetCounters = unsafe extern "C" fn(*mut Counters) -> Status;
    // SAFETY: the exported function with the header's signature.
    let get = unsafe {
        *kreplay
            .library
            .get::<GetCounters>(b"kreplay_get_counters\0")
            .expect("kreplay_get_counters exported")
    };
    let mut short = [u64::MAX; 3];
    short[0] = 16;
    // SAFETY: 16 writable bytes are provided, as `size` says.
    assert_eq!(unsafe { get(short.as_mut_ptr().cast()) }, Status::SUCCESS);
    assert_eq!(
        short,
        [16, u64::from(ran), u64::MAX],
        "at most `size` bytes written"
    );
    // SAFETY: null is refused, not written.
    let refused = unsafe { get(std::ptr::null_mut()) };
    assert_eq!(refused, Status::ERROR_INVALID_ARGUMENT);

    // SAFETY: the queue is live and no longer used.
    unsafe { hsa.queue_destroy(queue) }.expect("queue destroy");
    hsa.free(data.cast()).expect("free");
    // SAFETY: OnUnload takes no arguments; kreplay finalizes its tools.
    unsafe { (kreplay.on_unload)() };
}
