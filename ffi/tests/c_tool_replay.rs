//! A tool written in C, compiled with the system C compiler against kreplay.h and loaded through
//! `KREPLAY_TOOL_LIBRARIES`, drives kernel replay on softhsa the way it would on ROCm: the test
//! loads this build's libkreplay.so, calls its `OnLoad` with (a copy of) softhsa's API table,
//! and then runs an ordinary HSA program through that table. The application must see single-run
//! results and one completion; the C tool must have seen the callback flow of docs/abi.md §2, one dispatch record
//! per pass from exactly the context it enabled for that pass, and its user data throughout.
//!
//! One test in this file: the loaded library and its tool are process-wide.

mod common;

use std::ffi::{CStr, c_char, c_int};
use std::path::PathBuf;
use std::time::Duration;

use kreplay_softhsa::testing::{Dispatch, Hsa};
use kreplay_softhsa::{OwnedApiTable, WorkGroup, register_kernel};
use libloading::os::unix::{RTLD_GLOBAL, RTLD_NOW};

/// Mirror of `c_tool_event_t` in tests/c/replay_tool.c.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
struct CToolEvent {
    kind: u32,
    operation: u32,
    phase: u32,
    tracer: u32,
    dispatch_id: u64,
    current_pass: u64,
    total_passes: u64,
    bytes_planned: u64,
    bytes_moved: u64,
    user_data: u64,
    decline_reason: u32,
    tier: u32,
}

const KIND_DISPATCH: u32 = 1;
const KIND_REPLAY: u32 = 2;
const CONFIG: u32 = 1;
const PASS: u32 = 2;
const SNAPSHOT: u32 = 3;
const RESTORE: u32 = 4;
const ENQUEUE: u32 = 1;
const COMPLETE: u32 = 2;
const ENTER: u32 = 1;
const EXIT: u32 = 2;
const ELEMENTS: usize = 4096;
const BUFFERS: usize = 3;

#[derive(Clone, Copy)]
#[repr(C)]
struct AddOneArgs {
    data: *mut u32,
    len: u32,
}

/// `x[i] += 1`: replay without restore would accumulate one per pass.
fn add_one(group: &WorkGroup) {
    // SAFETY: the test passes an `AddOneArgs` kernarg block.
    let args: AddOneArgs = unsafe { group.kernargs() };
    for [x, _, _] in group.work_items() {
        if x < args.len {
            // SAFETY: `data` holds `len` u32 in live device memory; each work-item owns one.
            unsafe { *args.data.add(x as usize) += 1 };
        }
    }
}

fn build_c_tool() -> PathBuf {
    let out = common::scratch_dir("c_tool_replay").join("libreplay_tool.so");
    common::build_c_library("replay_tool.c", &out);
    out
}

#[test]
fn c_tool_replays_a_dispatch_through_the_c_abi_on_softhsa() {
    assert!(
        common::have_compiler("cc"),
        "the C ABI test needs the system C compiler `cc`"
    );
    let tool_path = build_c_tool();
    // SAFETY: setting the environment before any other thread of this test reads it.
    unsafe { std::env::set_var("KREPLAY_TOOL_LIBRARIES", &tool_path) };

    // As ROCm does with HSA_TOOLS_LIB: load the tools library with its symbols global (so the C
    // tool's kreplay_* calls resolve to it) and call OnLoad with the runtime's table.
    let kreplay = common::load_libkreplay(RTLD_NOW | RTLD_GLOBAL);

    let mut table = OwnedApiTable::softhsa();
    // SAFETY: `table` is a valid table we own for the rest of the test.
    let loaded = unsafe { (kreplay.on_load)(table.as_mut_ptr(), 1, 0, std::ptr::null()) };
    assert!(loaded, "OnLoad succeeds");

    // The application, through the (now wrapped) table only.
    // SAFETY: the table stays alive and valid while `hsa` is used.
    let hsa = unsafe { Hsa::from_table(table.table()) };
    let _session = hsa.init().expect("hsa_init");
    let gpu = hsa.gpu_agents().expect("agents")[0];
    let pool = hsa.coarse_pool(gpu).expect("coarse pool");
    let kernarg_pool = hsa
        .pool(gpu, kreplay_softhsa::testing::PoolKind::Kernarg)
        .expect("kernarg pool");
    let kernel = register_kernel("c_tool_add_one", add_one);
    let queue = hsa.queue_create(gpu, 64).expect("queue");
    let mut buffers = Vec::new();
    for b in 0..BUFFERS {
        let ptr = hsa
            .allocate(pool, ELEMENTS * 4)
            .expect("buffer")
            .cast::<u32>();
        let init: Vec<u32> = (0..ELEMENTS as u32).map(|i| i * 7 + b as u32).collect();
        // SAFETY: softhsa device memory is host memory; the buffer holds ELEMENTS u32.
        unsafe { std::ptr::copy_nonoverlapping(init.as_ptr(), ptr, ELEMENTS) };
        buffers.push((ptr, init));
    }
    for (ptr, _) in &buffers {
        let args = hsa
            .allocate(kernarg_pool, std::mem::size_of::<AddOneArgs>())
            .expect("kernargs")
            .cast::<AddOneArgs>();
        // SAFETY: the kernarg allocation holds one AddOneArgs.
        unsafe {
            args.write(AddOneArgs {
                data: *ptr,
                len: ELEMENTS as u32,
            })
        };
        let done = hsa.signal_create(1).expect("signal");
        // SAFETY: `queue` is live; the packet names a registered kernel with valid kernargs.
        unsafe {
            hsa.dispatch(
                queue,
                &Dispatch::linear(kernel, ELEMENTS as u32, 64, args.cast(), done),
            )
        };
        assert!(
            hsa.wait_zero(done, Duration::from_secs(10)),
            "the application's completion fires"
        );
        assert_eq!(
            hsa.signal_load(done),
            0,
            "the application's completion fires exactly once"
        );
        hsa.signal_destroy(done).expect("destroy signal");
    }
    for (ptr, init) in &buffers {
        // SAFETY: as above.
        let now = unsafe { std::slice::from_raw_parts(*ptr, ELEMENTS) };
        let wrong = now
            .iter()
            .zip(init)
            .position(|(now, init)| *now != init + 1);
        if let Some(i) = wrong {
            panic!(
                "each buffer must show exactly one x += 1 after a 3-pass replay: element {i} is {} (initial {})",
                now[i], init[i]
            );
        }
    }

    // What the C tool saw.
    type Count = unsafe extern "C" fn() -> usize;
    type Events = unsafe extern "C" fn() -> *const CToolEvent;
    type Failures = unsafe extern "C" fn(*mut *const c_char) -> c_int;
    type AllActive = unsafe extern "C" fn() -> c_int;
    // SAFETY: the tool library is already loaded by kreplay; these are its exported accessors.
    let tool = unsafe { libloading::Library::new(&tool_path) }.expect("tool library");
    // SAFETY: signatures as defined in replay_tool.c; the event log is not written concurrently
    // any more (every dispatch completed).
    let (events, failures, all_active) = unsafe {
        let count = tool.get::<Count>(b"c_tool_event_count\0").unwrap()();
        let events =
            std::slice::from_raw_parts(tool.get::<Events>(b"c_tool_events\0").unwrap()(), count)
                .to_vec();
        let mut first: *const c_char = std::ptr::null();
        let failures = tool.get::<Failures>(b"c_tool_failures\0").unwrap()(&mut first);
        let first = CStr::from_ptr(first).to_string_lossy().into_owned();
        (
            events,
            (failures, first),
            tool.get::<AllActive>(b"c_tool_contexts_active\0").unwrap()(),
        )
    };
    assert_eq!(
        failures.0, 0,
        "the C tool's own checks failed: {}",
        failures.1
    );
    assert_eq!(all_active, 1, "replay never changes global context state");

    let mut dispatch_ids: Vec<u64> = events
        .iter()
        .filter(|e| e.kind == KIND_REPLAY)
        .map(|e| e.dispatch_id)
        .collect();
    dispatch_ids.dedup();
    assert_eq!(
        dispatch_ids.len(),
        BUFFERS,
        "one replay per dispatch: {events:#?}"
    );
    for id in dispatch_ids {
        let replay: Vec<(u32, u32, u64)> = events
            .iter()
            .filter(|e| e.kind == KIND_REPLAY && e.dispatch_id == id)
            .map(|e| {
                (
                    e.operation,
                    e.phase,
                    if e.operation == SNAPSHOT {
                        0
                    } else {
                        e.current_pass
                    },
                )
            })
            .collect();
        let expected = vec![
            (CONFIG, ENTER, 0),
            (SNAPSHOT, ENTER, 0),
            (SNAPSHOT, EXIT, 0),
            (PASS, ENTER, 0),
            (PASS, EXIT, 0),
            (RESTORE, ENTER, 0),
            (RESTORE, EXIT, 0),
            (PASS, ENTER, 1),
            (PASS, EXIT, 1),
            (RESTORE, ENTER, 1),
            (RESTORE, EXIT, 1),
            (PASS, ENTER, 2),
            (PASS, EXIT, 2),
            (CONFIG, EXIT, 3),
        ];
        assert_eq!(
            replay, expected,
            "the callback flow (docs/abi.md §2) for dispatch {id}"
        );
        let snapshot_exit = events
            .iter()
            .find(|e| {
                e.kind == KIND_REPLAY
                    && e.dispatch_id == id
                    && e.operation == SNAPSHOT
                    && e.phase == EXIT
            })
            .unwrap();
        assert!(
            snapshot_exit.bytes_moved >= (BUFFERS * ELEMENTS * 4) as u64,
            "the snapshot copied every coarse-grained buffer: {snapshot_exit:?}"
        );
        assert!(
            events.iter().all(|e| e.kind != KIND_REPLAY
                || e.dispatch_id != id
                || e.operation != PASS
                || e.total_passes == 3),
            "total_passes is N on every PASS"
        );
        assert!(
            events.iter().all(|e| e.kind != KIND_REPLAY
                || e.dispatch_id != id
                || e.operation != CONFIG
                || e.phase != EXIT
                || e.decline_reason == 0),
            "not declined"
        );
        let records: Vec<(u32, u64, u32, u32)> = events
            .iter()
            .filter(|e| e.kind == KIND_DISPATCH && e.dispatch_id == id)
            .map(|e| (e.tracer, e.current_pass, e.operation, e.phase))
            .collect();
        let expected: Vec<(u32, u64, u32, u32)> = (0..3u64)
            .flat_map(|pass| {
                let tracer = pass as u32;
                [
                    (tracer, pass, ENQUEUE, ENTER),
                    (tracer, pass, ENQUEUE, EXIT),
                    (tracer, pass, COMPLETE, 0),
                ]
            })
            .collect();
        assert_eq!(
            records, expected,
            "per pass: ENQUEUE ENTER/EXIT and COMPLETE, only from the context enabled on it"
        );
    }

    // SAFETY: the queue is live and no longer used.
    unsafe { hsa.queue_destroy(queue) }.expect("queue destroy");
    for (ptr, _) in buffers {
        hsa.free(ptr.cast()).expect("free");
    }
    // SAFETY: OnUnload takes no arguments; kreplay finalizes its tools.
    unsafe { (kreplay.on_unload)() };
}
