//! A C tool collects more counters than one pass allows, in one run of the application: it plans
//! its counters into passes (3 here), answers that count from replay_pass_count and counts a
//! different configuration in each pass. Every dispatch gets every counter exactly once, in its
//! planned pass, with the values one run produces (the kernel's memory shows one run). A
//! configuration over a block's per-pass limit is refused with its own status. Masking the
//! counting context off for one pass drops exactly that pass's records, while dispatch tracing
//! still reports every pass.
//!
//! One test in this file: the loaded library and its tool are process-wide.

mod common;

use std::collections::BTreeMap;
use std::ffi::{CStr, CString, c_char, c_int};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use hsa_sys::HsaApiTable;
use kreplay::abi::Status;
use kreplay_softhsa::testing::{Dispatch, Hsa, PoolKind};
use kreplay_softhsa::{OwnedApiTable, WorkGroup, register_kernel};

/// Mirror of `counting_record_t` in tests/c/counting_tool.c.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
struct Record {
    counter: u64,
    dispatch_id: u64,
    replay_pass: u64,
    value: f64,
}

/// Mirror of `counting_trace_t`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
struct Trace {
    dispatch_id: u64,
    replay_pass: u64,
}

const ITEMS: u32 = 1000;
const BINS: u32 = 16;

#[derive(Clone, Copy)]
#[repr(C)]
struct Args {
    input: *const u32,
    bins: *const AtomicU32,
}

/// One load and one atomic add per work-item: bins[input[i] % BINS] += 1.
fn histogram(group: &WorkGroup) {
    // SAFETY: the test passes Args covering the grid and BINS bins.
    let args: Args = unsafe { group.kernargs() };
    let mut n = 0;
    for [x, _, _] in group.work_items() {
        // SAFETY: x < ITEMS, the input's length; the bin index is reduced modulo BINS.
        unsafe {
            let v = *args.input.add(x as usize);
            (*args.bins.add((v % BINS) as usize)).fetch_add(1, Ordering::Relaxed);
        }
        n += 1;
    }
    group.count_load(n, 4 * n);
    group.count_atomics(n);
}

const WANTED: [&str; 7] = [
    "SQ_WAVES",
    "SQ_WORKGROUPS",
    "SQ_WORK_ITEMS",
    "SQ_INSTS_VMEM_RD",
    "SQ_INSTS_VMEM_WR",
    "TCP_READ_BYTES",
    "TCC_ATOMIC",
];
/// What one run of the histogram (1000 items, groups of 128) counts, in WANTED's order.
const EXPECTED: [f64; 7] = [16.0, 8.0, 1000.0, 1000.0, 0.0, 4000.0, 1000.0];

#[test]
fn a_c_tool_collects_three_passes_of_counters_in_one_run_and_a_masked_pass_drops_its_records() {
    assert!(
        common::have_compiler("cc"),
        "the C ABI test needs the system C compiler `cc`"
    );
    let tool_path = common::scratch_dir("c_tool_counting").join("libcounting_tool.so");
    common::build_c_library("counting_tool.c", &tool_path);
    // SAFETY: setting the environment before any other thread of this test reads it.
    unsafe { std::env::set_var("KREPLAY_TOOL_LIBRARIES", &tool_path) };
    // SAFETY: libkreplay.so's initializers do nothing; RTLD_NOW|RTLD_GLOBAL as a runtime would.
    let library = unsafe {
        libloading::os::unix::Library::open(
            Some(common::libkreplay()),
            libloading::os::unix::RTLD_NOW | libloading::os::unix::RTLD_GLOBAL,
        )
    }
    .expect("load libkreplay.so");
    type OnLoad = unsafe extern "C" fn(*mut HsaApiTable, u64, u64, *const *const c_char) -> bool;
    // SAFETY: the exported entry point has exactly this signature.
    let on_load = unsafe { *library.get::<OnLoad>(b"OnLoad\0").expect("OnLoad") };
    let mut table = OwnedApiTable::softhsa();
    // SAFETY: `table` is a valid table we own for the rest of the test.
    assert!(unsafe { on_load(table.as_mut_ptr(), 1, 0, std::ptr::null()) });
    // SAFETY: the tool library's kreplay_* references resolve to the global libkreplay.
    let tool = unsafe { libloading::Library::new(&tool_path) }.expect("tool library");

    // SAFETY: the table stays alive and valid while `hsa` is used.
    let hsa = unsafe { Hsa::from_table(table.table()) };
    let _session = hsa.init().expect("hsa_init");
    let gpu = hsa.gpu_agents().expect("agents")[0];

    let names: Vec<CString> = WANTED.iter().map(|n| CString::new(*n).unwrap()).collect();
    let pointers: Vec<*const c_char> = names.iter().map(|n| n.as_ptr()).collect();
    type Prepare = unsafe extern "C" fn(u64, *const *const c_char, usize, *mut u32) -> i64;
    type CreateOne = unsafe extern "C" fn(u64, *const *const c_char, usize) -> c_int;
    type Mask = unsafe extern "C" fn(u64);
    type Records = unsafe extern "C" fn(*mut Record, usize) -> usize;
    type Traces = unsafe extern "C" fn(*mut Trace, usize) -> usize;
    type Clear = unsafe extern "C" fn();
    type Failure = unsafe extern "C" fn(*mut c_int) -> *const c_char;
    // SAFETY: signatures as defined in counting_tool.c.
    let (prepare, create_one, mask, records, traces, clear, failure) = unsafe {
        (
            *tool.get::<Prepare>(b"counting_tool_prepare\0").unwrap(),
            *tool
                .get::<CreateOne>(b"counting_tool_create_one\0")
                .unwrap(),
            *tool.get::<Mask>(b"counting_tool_mask_pass\0").unwrap(),
            *tool.get::<Records>(b"counting_tool_records\0").unwrap(),
            *tool.get::<Traces>(b"counting_tool_traces\0").unwrap(),
            *tool.get::<Clear>(b"counting_tool_clear\0").unwrap(),
            *tool.get::<Failure>(b"counting_tool_failure\0").unwrap(),
        )
    };

    // More SQ counters than SQ counts in one pass, as one configuration: refused.
    // SAFETY: `pointers` holds the names' pointers.
    let status = unsafe { create_one(gpu.handle, pointers.as_ptr(), 3) };
    assert_eq!(Status(status), Status::ERROR_EXCEEDS_PASS_LIMIT);
    // Planned: 5 SQ counters, 2 per pass, take 3 passes.
    let mut pass_of = [u32::MAX; WANTED.len()];
    // SAFETY: as above; `pass_of` has one entry per name.
    let passes = unsafe {
        prepare(
            gpu.handle,
            pointers.as_ptr(),
            WANTED.len(),
            pass_of.as_mut_ptr(),
        )
    };
    assert_eq!(passes, 3, "the planner's pass count");
    assert!(pass_of.iter().all(|&p| p < 3), "{pass_of:?}");

    let pool = hsa.coarse_pool(gpu).expect("coarse pool");
    let kernarg_pool = hsa.pool(gpu, PoolKind::Kernarg).expect("kernarg pool");
    let input = hsa
        .allocate(pool, ITEMS as usize * 4)
        .expect("input")
        .cast::<u32>();
    let bins = hsa
        .allocate(pool, BINS as usize * 4)
        .expect("bins")
        .cast::<AtomicU32>();
    for i in 0..ITEMS {
        // SAFETY: inside the input allocation.
        unsafe { *input.add(i as usize) = i * 7 };
    }
    let args = hsa
        .allocate(kernarg_pool, size_of::<Args>())
        .expect("kernargs")
        .cast::<Args>();
    // SAFETY: the kernarg allocation holds one Args.
    unsafe { args.write(Args { input, bins }) };
    let kernel = register_kernel("c_tool_counting_histogram", histogram);
    let queue = hsa.queue_create(gpu, 64).expect("queue");
    let run = || {
        let done = hsa.signal_create(1).expect("signal");
        // SAFETY: live queue; the packet names a registered kernel with valid kernargs.
        unsafe {
            hsa.dispatch(
                queue,
                &Dispatch::linear(kernel, ITEMS, 128, args.cast(), done),
            )
        };
        assert!(
            hsa.wait_zero(done, Duration::from_secs(10)),
            "completion fires"
        );
        hsa.signal_destroy(done).expect("destroy signal");
    };
    let collected = || {
        let mut out = vec![Record::default(); 256];
        // SAFETY: `out` has room for 256 records.
        let n = unsafe { records(out.as_mut_ptr(), out.len()) };
        out.truncate(n);
        let mut seen = vec![Trace::default(); 256];
        // SAFETY: as above.
        let t = unsafe { traces(seen.as_mut_ptr(), seen.len()) };
        seen.truncate(t);
        (out, seen)
    };
    let bin_total = || -> u32 {
        (0..BINS as usize)
            // SAFETY: inside the bins allocation; no kernel runs now.
            .map(|b| unsafe { (*bins.add(b)).load(Ordering::Relaxed) })
            .sum()
    };

    // One application dispatch: three passes, every counter once, in its planned pass.
    run();
    assert_eq!(bin_total(), ITEMS, "the bins show one run, not three");
    let (got, seen) = collected();
    let dispatch = got.first().expect("records").dispatch_id;
    let by_counter: BTreeMap<u64, Vec<&Record>> = got.iter().fold(BTreeMap::new(), |mut m, r| {
        m.entry(r.counter).or_insert_with(Vec::new).push(r);
        m
    });
    assert_eq!(got.len(), WANTED.len(), "{got:#?}");
    assert_eq!(
        by_counter.len(),
        WANTED.len(),
        "each counter once: {got:#?}"
    );
    for r in &got {
        assert_eq!(r.dispatch_id, dispatch, "one dispatch");
        assert!(r.replay_pass < 3, "{r:?}");
    }
    let mut passes_seen: Vec<u64> = got.iter().map(|r| r.replay_pass).collect();
    passes_seen.sort_unstable();
    passes_seen.dedup();
    assert_eq!(passes_seen, vec![0, 1, 2]);
    let mut want: Vec<(u64, u64)> = pass_of
        .iter()
        .zip(EXPECTED)
        .map(|(&p, v)| (u64::from(p), v as u64))
        .collect();
    let mut have: Vec<(u64, u64)> = got
        .iter()
        .map(|r| (r.replay_pass, r.value as u64))
        .collect();
    want.sort_unstable();
    have.sort_unstable();
    assert_eq!(
        have, want,
        "every counter's value from one run, in its planned pass"
    );
    let mut traced: Vec<u64> = seen
        .iter()
        .filter(|t| t.dispatch_id == dispatch)
        .map(|t| t.replay_pass)
        .collect();
    traced.sort_unstable();
    assert_eq!(traced, vec![0, 1, 2], "dispatch tracing carries the pass");

    // Masking the counting context off for pass 1 drops exactly pass 1's records.
    // SAFETY: plain setters of the tool, between dispatches.
    unsafe {
        clear();
        mask(1);
    }
    run();
    assert_eq!(bin_total(), 2 * ITEMS, "two runs in all");
    let (got, seen) = collected();
    let mut passes_seen: Vec<u64> = got.iter().map(|r| r.replay_pass).collect();
    passes_seen.sort_unstable();
    passes_seen.dedup();
    assert_eq!(passes_seen, vec![0, 2], "{got:#?}");
    let kept = pass_of.iter().filter(|&&p| p != 1).count();
    assert_eq!(
        got.len(),
        kept,
        "every record of passes 0 and 2, none of pass 1"
    );
    let mut traced: Vec<u64> = seen.iter().map(|t| t.replay_pass).collect();
    traced.sort_unstable();
    assert_eq!(
        traced,
        vec![0, 1, 2],
        "tracing (not masked) still sees pass 1"
    );

    let mut count = 0;
    // SAFETY: returns the tool's static message.
    let first = unsafe { CStr::from_ptr(failure(&mut count)) }
        .to_string_lossy()
        .into_owned();
    assert_eq!(count, 0, "the C tool's own checks failed: {first}");
    // SAFETY: created above, destroyed once.
    unsafe { hsa.queue_destroy(queue) }.expect("queue destroy");
}
