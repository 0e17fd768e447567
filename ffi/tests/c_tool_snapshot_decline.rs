//! A snapshot that cannot be stored is a decline the tool sees at SNAPSHOT EXIT (status and
//! reason in the payload, not only on stderr) and again at CONFIG EXIT; the dispatch runs once
//! and memory is as after one run. The store is made unavailable by a file-tier snapshot whose
//! spill folder is removed after start-up (a missing one is refused at start-up).
//!
//! One test in this file: the loaded library and its tool are process-wide. The C tool is
//! tests/c/outcomes_tool.c.

mod common;

use std::time::Duration;

use common::outcomes_tool::{self, OutcomesTool};
use kreplay::abi::{DeclineReason, KernelReplayOperation, ReplayOutcomeKind, Status};
use kreplay_softhsa::testing::{Dispatch, Hsa, PoolKind};
use kreplay_softhsa::{OwnedApiTable, WorkGroup, register_kernel};
use libloading::os::unix::{RTLD_GLOBAL, RTLD_NOW};

/// Long enough that the quick three-pass dispatch fits even on a loaded machine.
const ELEMENTS: u32 = 256;

#[derive(Clone, Copy)]
#[repr(C)]
struct Args {
    data: *mut u32,
}

/// `x[i] += 1`.
fn add_one(group: &WorkGroup) {
    // SAFETY: the test passes an `Args` kernarg block.
    let args: Args = unsafe { group.kernargs() };
    for [x, _, _] in group.work_items() {
        if x < ELEMENTS {
            // SAFETY: the buffer holds ELEMENTS u32; each work-item owns one.
            unsafe { *args.data.add(x as usize) += 1 };
        }
    }
}

#[test]
fn a_snapshot_that_cannot_be_stored_is_a_decline_the_tool_sees_at_snapshot_exit() {
    assert!(
        common::have_compiler("cc"),
        "the C ABI test needs the system C compiler `cc`"
    );
    let tool_path = outcomes_tool::build("c_tool_snapshot_decline");
    let scratch = common::scratch_dir("c_tool_snapshot_decline");
    // Of this process: another copy of this test binary may remove its own at the same time.
    let missing = scratch.join(format!(
        "spill-folder-removed-after-start-up-{}",
        std::process::id()
    ));
    std::fs::create_dir_all(&missing).unwrap();
    // SAFETY: setting the environment before any other thread of this test reads it.
    unsafe {
        std::env::set_var("KREPLAY_TOOL_LIBRARIES", &tool_path);
        std::env::set_var("KREPLAY_SNAPSHOT_STORE", "file");
        std::env::set_var("KREPLAY_SPILL_DIR", &missing);
    }
    let kreplay = common::load_libkreplay(RTLD_NOW | RTLD_GLOBAL);
    let mut table = OwnedApiTable::softhsa();
    // SAFETY: `table` is a valid table we own for the rest of the test.
    assert!(unsafe { (kreplay.on_load)(table.as_mut_ptr(), 1, 0, std::ptr::null()) });
    std::fs::remove_dir(&missing).unwrap();
    let tool = OutcomesTool::open(&tool_path);
    // SAFETY: no dispatch yet.
    unsafe { tool.answer(3, false) };

    // SAFETY: the table stays alive and valid while `hsa` is used.
    let hsa = unsafe { Hsa::from_table(table.table()) };
    let _session = hsa.init().expect("hsa_init");
    let gpu = hsa.gpu_agents().expect("agents")[0];
    let pool = hsa.coarse_pool(gpu).expect("coarse pool");
    let kernarg_pool = hsa.pool(gpu, PoolKind::Kernarg).expect("kernarg pool");
    let kernel = register_kernel("c_tool_snapshot_decline_add_one", add_one);
    let queue = hsa.queue_create(gpu, 64).expect("queue");
    let data = hsa
        .allocate(pool, ELEMENTS as usize * 4)
        .expect("buffer")
        .cast::<u32>();
    let init: Vec<u32> = (0..ELEMENTS).map(|i| 9 + 5 * i).collect();
    // SAFETY: softhsa device memory is host memory; the buffer holds ELEMENTS u32.
    unsafe { std::ptr::copy_nonoverlapping(init.as_ptr(), data, ELEMENTS as usize) };
    let args = hsa
        .allocate(kernarg_pool, std::mem::size_of::<Args>())
        .expect("kernargs")
        .cast::<Args>();
    // SAFETY: the kernarg allocation holds one Args.
    unsafe { args.write(Args { data }) };
    let done = hsa.signal_create(1).expect("signal");
    // SAFETY: `queue` is live; the packet names a registered kernel with valid kernargs.
    unsafe {
        hsa.dispatch(
            queue,
            &Dispatch::linear(kernel, ELEMENTS, 64, args.cast(), done),
        )
    };
    assert!(
        hsa.wait_zero(done, Duration::from_secs(10)),
        "completion fires"
    );
    assert_eq!(hsa.signal_load(done), 0, "completion fires exactly once");
    // SAFETY: the dispatch completed.
    let now = unsafe { std::slice::from_raw_parts(data, ELEMENTS as usize) };
    let expected: Vec<u32> = init.iter().map(|x| x + 1).collect();
    assert_eq!(now, &expected[..], "ran once, memory as after one run");

    // SAFETY: no replay runs any more.
    let events = unsafe { tool.events() };
    let counters = tool.counters();
    assert_eq!(
        events.len(),
        2,
        "SNAPSHOT EXIT and CONFIG EXIT: {events:#?}"
    );
    let (snapshot, config) = (events[0], events[1]);
    assert_eq!(snapshot.operation, KernelReplayOperation::SNAPSHOT.0);
    assert_eq!(Status(snapshot.status), Status::ERROR_REPLAY_DECLINED);
    let reason = DeclineReason(snapshot.decline_reason);
    assert_eq!(
        reason,
        DeclineReason::SNAPSHOT_FAILED,
        "a store that cannot be created is a failed snapshot"
    );
    assert_eq!(snapshot.bytes_moved, 0, "nothing was kept");
    assert_eq!(config.operation, KernelReplayOperation::CONFIG.0);
    assert_eq!(
        (
            ReplayOutcomeKind(config.outcome),
            Status(config.status),
            DeclineReason(config.decline_reason),
            config.passes_run
        ),
        (
            ReplayOutcomeKind::DECLINED,
            Status::ERROR_REPLAY_DECLINED,
            reason,
            1
        )
    );
    assert_eq!((counters.declines, counters.replays), (1, 0));
    assert_eq!(counters.declines_by_reason[reason.0 as usize], 1);

    hsa.signal_destroy(done).expect("destroy");
    // SAFETY: the queue is live and no longer used.
    unsafe { hsa.queue_destroy(queue) }.expect("queue destroy");
    hsa.free(data.cast()).expect("free");
    // SAFETY: OnUnload takes no arguments; kreplay finalizes its tools.
    unsafe { (kreplay.on_unload)() };
}
