//! `KREPLAY_REPLAY_BUDGET_MS`: a pass that runs past the per-dispatch budget is finished, never
//! cut short, the application's completion waits for it, and no further pass starts; the C tool
//! learns at CONFIG EXIT that kreplay ended the loop early because of the budget. A dispatch
//! within the budget runs all its passes.
//!
//! One test in this file: the loaded library and its tool are process-wide. The C tool is
//! tests/c/outcomes_tool.c.

mod common;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::outcomes_tool::{self, OutcomesTool};
use kreplay::abi::{KernelReplayOperation, ReplayEnd, ReplayOutcomeKind, Status};
use kreplay_softhsa::testing::{Dispatch, Hsa, PoolKind};
use kreplay_softhsa::{OwnedApiTable, WorkGroup, register_kernel};
use libloading::os::unix::{RTLD_GLOBAL, RTLD_NOW};

/// Long enough that the quick three-pass dispatch fits even on a loaded machine.
const BUDGET: Duration = Duration::from_millis(1000);
const ELEMENTS: u32 = 64;
/// The longest anything may take before the test counts it as a failure.
const WAIT: Duration = Duration::from_secs(10);

#[derive(Clone, Copy)]
#[repr(C)]
struct Args {
    data: *mut u32,
}

/// Runs started so far.
static STARTED: AtomicUsize = AtomicUsize::new(0);
/// While false, a run waits (at most `WAIT`) before doing its work.
static GATE_OPEN: AtomicBool = AtomicBool::new(true);

/// `x[i] += 1`, behind the gate.
fn gated_add(group: &WorkGroup) {
    // SAFETY: the test passes an `Args` kernarg block.
    let args: Args = unsafe { group.kernargs() };
    if group.group_id() == [0, 0, 0] {
        STARTED.fetch_add(1, Ordering::SeqCst);
    }
    let deadline = Instant::now() + WAIT;
    while !GATE_OPEN.load(Ordering::SeqCst) && Instant::now() < deadline {
        std::thread::yield_now();
    }
    for [x, _, _] in group.work_items() {
        if x < ELEMENTS {
            // SAFETY: the buffer holds ELEMENTS u32; each work-item owns one.
            unsafe { *args.data.add(x as usize) += 1 };
        }
    }
}

#[test]
fn a_spent_budget_stops_further_passes_but_never_the_running_one() {
    assert!(
        common::have_compiler("cc"),
        "the C ABI test needs the system C compiler `cc`"
    );
    let tool_path = outcomes_tool::build("c_tool_budget");
    // SAFETY: setting the environment before any other thread of this test reads it.
    unsafe {
        std::env::set_var("KREPLAY_TOOL_LIBRARIES", &tool_path);
        std::env::set_var("KREPLAY_REPLAY_BUDGET_MS", BUDGET.as_millis().to_string());
    }
    let kreplay = common::load_libkreplay(RTLD_NOW | RTLD_GLOBAL);
    let mut table = OwnedApiTable::softhsa();
    // SAFETY: `table` is a valid table we own for the rest of the test.
    assert!(unsafe { (kreplay.on_load)(table.as_mut_ptr(), 1, 0, std::ptr::null()) });
    let tool = OutcomesTool::open(&tool_path);

    // SAFETY: the table stays alive and valid while `hsa` is used.
    let hsa = unsafe { Hsa::from_table(table.table()) };
    let _session = hsa.init().expect("hsa_init");
    let gpu = hsa.gpu_agents().expect("agents")[0];
    let pool = hsa.coarse_pool(gpu).expect("coarse pool");
    let kernarg_pool = hsa.pool(gpu, PoolKind::Kernarg).expect("kernarg pool");
    let kernel = register_kernel("c_tool_budget_gated_add", gated_add);
    let queue = hsa.queue_create(gpu, 64).expect("queue");
    let data = hsa
        .allocate(pool, ELEMENTS as usize * 4)
        .expect("buffer")
        .cast::<u32>();
    let init: Vec<u32> = (0..ELEMENTS).map(|i| 100 + 7 * i).collect();
    // SAFETY: softhsa device memory is host memory; the buffer holds ELEMENTS u32.
    unsafe { std::ptr::copy_nonoverlapping(init.as_ptr(), data, ELEMENTS as usize) };
    let args = hsa
        .allocate(kernarg_pool, std::mem::size_of::<Args>())
        .expect("kernargs")
        .cast::<Args>();
    // SAFETY: the kernarg allocation holds one Args.
    unsafe { args.write(Args { data }) };

    // Five passes wanted; pass 0 stays blocked until the budget is spent. The replay runs in
    // this thread, so a second thread releases the kernel, and first looks at the completion.
    // SAFETY: no dispatch is in flight.
    unsafe { tool.answer(5, false) };
    GATE_OPEN.store(false, Ordering::SeqCst);
    let done = hsa.signal_create(1).expect("signal");
    let completion_while_running = std::thread::scope(|scope| {
        let releaser = scope.spawn(|| {
            let deadline = Instant::now() + WAIT;
            while STARTED.load(Ordering::SeqCst) == 0 {
                assert!(Instant::now() < deadline, "pass 0 never started");
                std::thread::yield_now();
            }
            // The pass outlives the budget (which began before the pass started).
            std::thread::sleep(BUDGET + Duration::from_millis(20));
            let completion = hsa.signal_load(done);
            GATE_OPEN.store(true, Ordering::SeqCst);
            completion
        });
        // SAFETY: `queue` is live; the packet names a registered kernel with valid kernargs.
        unsafe {
            hsa.dispatch(
                queue,
                &Dispatch::linear(kernel, ELEMENTS, 64, args.cast(), done),
            )
        };
        releaser.join().expect("the releasing thread")
    });
    assert_eq!(
        completion_while_running, 1,
        "the completion waits for the running pass"
    );
    assert!(hsa.wait_zero(done, WAIT), "completion fires");
    assert_eq!(hsa.signal_load(done), 0, "completion fires exactly once");
    assert_eq!(STARTED.load(Ordering::SeqCst), 1, "no further pass started");

    // Within the budget: all passes.
    // SAFETY: as above.
    unsafe { tool.answer(3, false) };
    let quick = hsa.signal_create(1).expect("signal");
    // SAFETY: as above.
    unsafe {
        hsa.dispatch(
            queue,
            &Dispatch::linear(kernel, ELEMENTS, 64, args.cast(), quick),
        )
    };
    assert!(hsa.wait_zero(quick, WAIT), "completion fires");
    assert_eq!(STARTED.load(Ordering::SeqCst), 4);

    // SAFETY: every dispatch completed.
    let now = unsafe { std::slice::from_raw_parts(data, ELEMENTS as usize) };
    let expected: Vec<u32> = init.iter().map(|x| x + 2).collect();
    assert_eq!(now, &expected[..], "as after two ordinary runs");

    // SAFETY: no replay runs any more.
    let events = unsafe { tool.events() };
    let exits: Vec<(ReplayOutcomeKind, ReplayEnd, Status, u64)> = events
        .iter()
        .filter(|e| e.operation == KernelReplayOperation::CONFIG.0)
        .map(|e| {
            (
                ReplayOutcomeKind(e.outcome),
                ReplayEnd(e.end_reason),
                Status(e.status),
                e.passes_run,
            )
        })
        .collect();
    assert_eq!(
        exits,
        vec![
            (
                ReplayOutcomeKind::ENDED_EARLY,
                ReplayEnd::BUDGET,
                Status::SUCCESS,
                1
            ),
            (
                ReplayOutcomeKind::REPLAYED,
                ReplayEnd::LAST_PASS,
                Status::SUCCESS,
                3
            ),
        ]
    );

    hsa.signal_destroy(done).expect("destroy");
    hsa.signal_destroy(quick).expect("destroy");
    // SAFETY: the queue is live and no longer used.
    unsafe { hsa.queue_destroy(queue) }.expect("queue destroy");
    hsa.free(data.cast()).expect("free");
    // SAFETY: OnUnload takes no arguments; kreplay finalizes its tools.
    unsafe { (kreplay.on_unload)() };
}
