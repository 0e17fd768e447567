//! Hardware-like counters through softhsa's counter extension table.

mod common;

use common::*;
use hsa_sys::soft_counters::*;
use hsa_sys::*;
use kreplay_softhsa::testing::{Dispatch, Hsa};
use kreplay_softhsa::{WorkGroup, register_kernel};
use std::collections::HashMap;
use std::ffi::CStr;
use std::sync::atomic::{AtomicU32, Ordering};

#[derive(Clone, Copy)]
#[repr(C)]
struct HistArgs {
    input: *const u32,
    bins: *const AtomicU32,
    nbins: u32,
}

/// Loads one u32 per item and adds one to its bin atomically.
fn histogram(group: &WorkGroup) {
    // SAFETY: dispatches pass HistArgs covering the grid and `nbins` bins.
    let args: HistArgs = unsafe { group.kernargs() };
    let mut n = 0;
    for [x, _, _] in group.work_items() {
        // SAFETY: x is inside the grid, the input's length.
        let v = unsafe { *args.input.add(x as usize) };
        // SAFETY: the index is reduced modulo the bin count.
        unsafe { &*args.bins.add((v % args.nbins) as usize) }.fetch_add(1, Ordering::Relaxed);
        n += 1;
    }
    group.count_load(n, n * 4);
    group.count_atomics(n);
}

fn table(hsa: &Hsa) -> SoftCountersTable {
    let mut t = SoftCountersTable::default();
    // SAFETY: a table entry with its HSA signature; `t` is writable for its size.
    let status = unsafe {
        hsa.core().hsa_system_get_major_extension_table_fn.unwrap()(
            SOFT_COUNTERS_EXTENSION,
            SOFT_COUNTERS_VERSION_MAJOR,
            size_of::<SoftCountersTable>(),
            (&raw mut t).cast(),
        )
    };
    assert_eq!(status, HSA_STATUS_SUCCESS);
    t
}

fn ids_by_name(t: &SoftCountersTable, agent: hsa_agent_t) -> HashMap<String, u32> {
    let mut n = 0;
    // SAFETY: extension entries with their documented signatures, valid out pointers.
    unsafe {
        assert_eq!(t.counter_count.unwrap()(agent, &mut n), HSA_STATUS_SUCCESS);
        (0..n)
            .map(|i| {
                let mut info = soft_counter_info_t::default();
                assert_eq!(
                    t.counter_info.unwrap()(agent, i, &mut info),
                    HSA_STATUS_SUCCESS
                );
                assert!(!CStr::from_ptr(info.description).to_bytes().is_empty());
                (CStr::from_ptr(info.name).to_str().unwrap().to_owned(), i)
            })
            .collect()
    }
}

#[test]
fn a_programmed_dispatch_reports_its_real_events() {
    let (hsa, _session) = open();
    let t = table(&hsa);
    let gpu = hsa.gpu_agents().unwrap()[0];
    let ids = ids_by_name(&t, gpu);
    let pool = hsa.coarse_pool(gpu).unwrap();
    let items = 1000u32;
    let input = hsa
        .allocate(pool, items as usize * 4)
        .unwrap()
        .cast::<u32>();
    let bins = hsa.allocate(pool, 16 * 4).unwrap().cast::<AtomicU32>();
    for i in 0..items {
        // SAFETY: inside the allocation.
        unsafe { *input.add(i as usize) = i };
    }
    let mut args = HistArgs {
        input,
        bins,
        nbins: 16,
    };
    let kernel = register_kernel("counters_histogram", histogram);
    let queue = hsa.queue_create(gpu, 64).unwrap();
    let done = hsa.signal_create(1).unwrap();
    let want = ["SQ_WORK_ITEMS", "SQ_WAVES", "TCP_READ_BYTES", "TCC_ATOMIC"];
    let program: Vec<u32> = want.iter().map(|n| ids[*n]).collect();
    // SAFETY: extension entry; `program` holds `len` ids.
    let status = unsafe { t.program.unwrap()(gpu, done, program.as_ptr(), program.len() as u32) };
    assert_eq!(status, HSA_STATUS_SUCCESS);
    let dispatch = Dispatch::linear(kernel, items, 128, (&raw mut args).cast(), done);
    // SAFETY: live queue; args outlive the dispatch (waited for below).
    unsafe { hsa.dispatch(queue, &dispatch) };
    assert!(hsa.wait_zero(done, PROMPT));
    let mut values = vec![0.0; program.len()];
    // SAFETY: extension entry; `values` has room for every programmed counter.
    let status = unsafe { t.read.unwrap()(done, values.as_mut_ptr(), values.len() as u32) };
    assert_eq!(status, HSA_STATUS_SUCCESS);
    // 1000 items in groups of 128: 8 groups (the last of 104), 2 waves each.
    assert_eq!(values, [1000.0, 16.0, 4000.0, 1000.0]);
    // Read once: the values are taken.
    // SAFETY: as above.
    let again = unsafe { t.read.unwrap()(done, values.as_mut_ptr(), values.len() as u32) };
    assert_eq!(again, HSA_STATUS_ERROR_INVALID_SIGNAL);

    // Derived counters, from hardware counters of the same pass.
    let derived = [ids["ATOMIC_FRACTION"], ids["MEM_BYTES"]];
    hsa.signal_store(done, 1);
    // SAFETY: as above.
    let status = unsafe { t.program.unwrap()(gpu, done, derived.as_ptr(), 2) };
    assert_eq!(status, HSA_STATUS_SUCCESS);
    // SAFETY: as above.
    unsafe { hsa.dispatch(queue, &dispatch) };
    assert!(hsa.wait_zero(done, PROMPT));
    let mut two = [0.0; 2];
    // SAFETY: as above.
    let status = unsafe { t.read.unwrap()(done, two.as_mut_ptr(), 2) };
    assert_eq!(status, HSA_STATUS_SUCCESS);
    assert_eq!(
        two,
        [0.5, 4000.0],
        "atomics / (loads + stores + atomics); loaded + stored"
    );

    // An unprogrammed dispatch counts nothing and leaves nothing to read.
    hsa.signal_store(done, 1);
    // SAFETY: as above.
    unsafe { hsa.dispatch(queue, &dispatch) };
    assert!(hsa.wait_zero(done, PROMPT));
    // SAFETY: as above.
    let none = unsafe { t.read.unwrap()(done, values.as_mut_ptr(), values.len() as u32) };
    assert_eq!(none, HSA_STATUS_ERROR_INVALID_SIGNAL);
    // SAFETY: created above, destroyed once.
    unsafe { hsa.queue_destroy(queue) }.unwrap();
}

#[test]
fn more_counters_than_a_block_counts_in_one_pass_is_refused_naming_the_limit() {
    let (hsa, _session) = open();
    let t = table(&hsa);
    let gpu = hsa.gpu_agents().unwrap()[0];
    let ids = ids_by_name(&t, gpu);
    let sq: Vec<u32> = [
        "SQ_WAVES",
        "SQ_WORKGROUPS",
        "SQ_WORK_ITEMS",
        "SQ_INSTS_VMEM_RD",
        "SQ_INSTS_VMEM_WR",
    ]
    .iter()
    .map(|n| ids[*n])
    .collect();
    let mut message = [0 as std::ffi::c_char; 256];
    // SAFETY: extension entry; `sq` holds its ids, `message` its length.
    let status =
        unsafe { t.check.unwrap()(gpu, sq.as_ptr(), 5, message.as_mut_ptr(), message.len()) };
    assert_eq!(status, HSA_STATUS_ERROR_OUT_OF_RESOURCES);
    // SAFETY: `check` wrote a NUL-terminated message.
    let text = unsafe { CStr::from_ptr(message.as_ptr()) }
        .to_str()
        .unwrap();
    assert!(
        text.contains("block SQ can count at most 2 counters"),
        "{text}"
    );
    let done = hsa.signal_create(1).unwrap();
    // SAFETY: as above.
    let status = unsafe { t.program.unwrap()(gpu, done, sq.as_ptr(), 5) };
    assert_eq!(status, HSA_STATUS_ERROR_OUT_OF_RESOURCES);
    // SAFETY: as above; two fit.
    let status = unsafe { t.check.unwrap()(gpu, sq.as_ptr(), 2, message.as_mut_ptr(), 0) };
    assert_eq!(status, HSA_STATUS_SUCCESS);
    // A CPU agent has no counters.
    let mut n = 7;
    // SAFETY: as above.
    unsafe { t.counter_count.unwrap()(hsa.cpu_agent().unwrap(), &mut n) };
    assert_eq!(n, 0);
}

/// Runs add_one over `n` items on `agent`, completing `done`.
fn add_one_on(hsa: &Hsa, agent: hsa_agent_t, n: u32, done: hsa_signal_t) {
    let pool = hsa.coarse_pool(agent).unwrap();
    let data = hsa.allocate(pool, n as usize * 4).unwrap().cast::<u32>();
    let mut args = AddOneArgs { data };
    let queue = hsa.queue_create(agent, 64).unwrap();
    let dispatch = Dispatch::linear(add_one_kernel(), n, 64, (&raw mut args).cast(), done);
    // SAFETY: live queue; args outlive the dispatch (waited for below).
    unsafe { hsa.dispatch(queue, &dispatch) };
    assert!(hsa.wait_zero(done, PROMPT));
    // SAFETY: created above; its dispatch completed.
    unsafe { hsa.queue_destroy(queue) }.unwrap();
    hsa.free(data.cast()).unwrap();
}

/// `program` is for "the next dispatch on `agent` whose completion signal is `signal`": a
/// dispatch on another agent completing the same signal first does not take it (it did).
#[test]
fn a_programming_for_one_agent_is_left_to_the_next_dispatch_on_that_agent() {
    let (hsa, _session) = open();
    let t = table(&hsa);
    let gpus = hsa.gpu_agents().unwrap();
    assert!(gpus.len() >= 2, "softhsa has two GPU agents");
    let items = ids_by_name(&t, gpus[0])["SQ_WORK_ITEMS"];
    let done = hsa.signal_create(1).unwrap();
    // SAFETY: extension entry; one id.
    let status = unsafe { t.program.unwrap()(gpus[0], done, &items, 1) };
    assert_eq!(status, HSA_STATUS_SUCCESS);
    add_one_on(&hsa, gpus[1], 100, done);
    hsa.signal_store(done, 1);
    add_one_on(&hsa, gpus[0], 300, done);
    let mut value = [0.0f64; 1];
    // SAFETY: extension entry; one value of room.
    let status = unsafe { t.read.unwrap()(done, value.as_mut_ptr(), 1) };
    assert_eq!(status, HSA_STATUS_SUCCESS);
    assert_eq!(value[0], 300.0, "the dispatch on the other agent took it");
}
