//! Through libkreplay.so and a tool written in C: a kernel whose code object metadata gives it
//! a printf buffer (`hidden_printf_buffer`: on ROCm it may print on every run) is declined
//! before any snapshot, the tool seeing only CONFIG EXIT with `untracked_memory`, and runs
//! once, so the application sees its line once; the kernel of the same code object without it
//! is replayed in the 4 passes the tool asks for.
//!
//! One test in this file: the loaded library and its tool are process-wide. The C tool is
//! tests/c/outcomes_tool.c; the code object is softhsa's ELF form, carrying the metadata note a
//! ROCm code object carries.

mod common;

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use common::outcomes_tool::{self, Event, OutcomesTool};
use hsa_sys::HSA_EXECUTABLE_SYMBOL_INFO_KERNEL_OBJECT;
use kreplay::abi::{DeclineReason, KernelReplayOperation, ReplayOutcomeKind, Status};
use kreplay_softhsa::testing::{Dispatch, Hsa, PoolKind};
use kreplay_softhsa::{CodeObject, OwnedApiTable, WorkGroup, register_kernel};
use libloading::os::unix::{RTLD_GLOBAL, RTLD_NOW};

const PASSES: u64 = 4;

#[derive(Clone, Copy)]
#[repr(C)]
struct Args {
    x: *mut u32,
}

/// Lines the application would see printed, one per run of `say`.
static PRINTED: AtomicU32 = AtomicU32::new(0);
/// Runs of `add`.
static ADDED: AtomicU32 = AtomicU32::new(0);

fn bump(group: &WorkGroup) {
    // SAFETY: the test passes an `Args` kernarg block pointing at a live u32.
    unsafe { *group.kernargs::<Args>().x += 1 };
}

fn say(group: &WorkGroup) {
    PRINTED.fetch_add(1, Ordering::SeqCst);
    bump(group);
}

fn add(group: &WorkGroup) {
    ADDED.fetch_add(1, Ordering::SeqCst);
    bump(group);
}

#[test]
fn a_kernel_that_may_print_is_declined_before_any_snapshot_and_prints_once() {
    assert!(
        common::have_compiler("cc"),
        "the C ABI test needs the system C compiler `cc`"
    );
    let tool_path = outcomes_tool::build("c_tool_device_printf");
    // SAFETY: setting the environment before any other thread of this test reads it.
    unsafe { std::env::set_var("KREPLAY_TOOL_LIBRARIES", &tool_path) };
    let kreplay = common::load_libkreplay(RTLD_NOW | RTLD_GLOBAL);
    let mut table = OwnedApiTable::softhsa();
    // SAFETY: `table` is a valid table we own for the rest of the test.
    assert!(unsafe { (kreplay.on_load)(table.as_mut_ptr(), 1, 0, std::ptr::null()) });
    let tool = OutcomesTool::open(&tool_path);
    // SAFETY: no dispatch yet.
    unsafe { tool.answer(PASSES, false) };

    // SAFETY: the table stays alive and valid while `hsa` is used.
    let hsa = unsafe { Hsa::from_table(table.table()) };
    let _session = hsa.init().expect("hsa_init");
    let gpu = hsa.gpu_agents().expect("agents")[0];
    let pool = hsa.coarse_pool(gpu).expect("coarse pool");
    let kernarg_pool = hsa.pool(gpu, PoolKind::Kernarg).expect("kernarg pool");
    let code = CodeObject::new()
        .kernel(
            "device_printf_say",
            register_kernel("device_printf_say", say),
            8,
        )
        .kernel(
            "device_printf_add",
            register_kernel("device_printf_add", add),
            8,
        )
        .hidden_args("device_printf_say", &["hidden_printf_buffer"])
        .hidden_args("device_printf_add", &["hidden_block_count_x"]);
    let exe = hsa
        .load_executable_bytes(gpu, &code.to_elf())
        .expect("the ELF code object loads");
    let queue = hsa.queue_create(gpu, 64).expect("queue");

    // Runs kernel symbol `symbol` once on x = 10; returns x after.
    let run = |symbol: &str| -> u32 {
        let sym = hsa.symbol(exe, gpu, symbol).expect("kernel symbol");
        let object = hsa
            .symbol_u64(sym, HSA_EXECUTABLE_SYMBOL_INFO_KERNEL_OBJECT)
            .unwrap();
        let x = hsa.allocate(pool, 4).expect("x").cast::<u32>();
        // SAFETY: softhsa device memory is host memory; the allocation holds one u32.
        unsafe { x.write(10) };
        let args = hsa
            .allocate(kernarg_pool, std::mem::size_of::<Args>())
            .expect("kernargs")
            .cast::<Args>();
        // SAFETY: the kernarg allocation holds one Args.
        unsafe { args.write(Args { x }) };
        let done = hsa.signal_create(1).expect("signal");
        // SAFETY: `queue` is live; the packet names a loaded kernel with valid kernargs.
        unsafe { hsa.dispatch(queue, &Dispatch::linear(object, 1, 1, args.cast(), done)) };
        assert!(
            hsa.wait_zero(done, Duration::from_secs(10)),
            "completion fires"
        );
        hsa.signal_destroy(done).expect("destroy");
        // SAFETY: the dispatch completed.
        unsafe { x.read() }
    };

    assert_eq!(run("device_printf_say.kd"), 11, "one run's result");
    assert_eq!(
        PRINTED.load(Ordering::SeqCst),
        1,
        "printed once, not once per pass"
    );
    assert_eq!(run("device_printf_add.kd"), 11, "restored between passes");
    assert_eq!(ADDED.load(Ordering::SeqCst) as u64, PASSES, "replayed");

    // SAFETY: no replay runs any more.
    let events = unsafe { tool.events() };
    let counters = tool.counters();
    // The first dispatch: CONFIG EXIT alone (no SNAPSHOT: declined before any).
    let first = events[0].dispatch_id;
    let of_first: Vec<&Event> = events.iter().filter(|e| e.dispatch_id == first).collect();
    assert_eq!(of_first.len(), 1, "CONFIG EXIT only: {of_first:#?}");
    let config = of_first[0];
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
            DeclineReason::UNTRACKED_MEMORY,
            1
        )
    );
    // The second: replayed in every pass.
    let last = events.last().expect("events");
    assert_ne!(last.dispatch_id, first);
    assert_eq!(last.operation, KernelReplayOperation::CONFIG.0);
    assert_eq!(
        (ReplayOutcomeKind(last.outcome), last.passes_run),
        (ReplayOutcomeKind::REPLAYED, PASSES)
    );
    assert_eq!((counters.declines, counters.replays), (1, 1));
    assert_eq!(
        counters.declines_by_reason[DeclineReason::UNTRACKED_MEMORY.0 as usize],
        1
    );

    // SAFETY: the queue is live and no longer used.
    unsafe { hsa.queue_destroy(queue) }.expect("queue destroy");
    // SAFETY: OnUnload takes no arguments; kreplay finalizes its tools.
    unsafe { (kreplay.on_unload)() };
}
