//! AQL queues and the packet processor, driven through the API table.

mod common;

use common::*;
use hsa_sys::*;
use kreplay_softhsa::testing::{Dispatch, barrier_and_packet, dispatch_packet, packet_header};
use kreplay_softhsa::{WorkGroup, register_kernel};
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, AtomicU16, AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

#[test]
fn a_dispatch_written_by_hand_adds_one_per_run() {
    let (hsa, _session) = open();
    let core = *hsa.core();
    let gpu = hsa.gpu_agents().unwrap()[0];
    let pool = hsa.coarse_pool(gpu).unwrap();
    let n = 1000usize;
    let data = hsa.allocate(pool, n * 4).unwrap().cast::<u32>();
    let mut args = AddOneArgs { data };
    let queue = hsa.queue_create(gpu, 64).unwrap();
    let done = hsa.signal_create(1).unwrap();
    let kernel = add_one_kernel();

    for run in 1..=2u32 {
        hsa.signal_store(done, 1);
        // The HSA producer protocol, spelled out: reserve a slot, fill the body, publish the
        // header (with setup) atomically last, ring the doorbell.
        // SAFETY: table entries with HSA signatures on a live queue; the slot is reserved by us.
        unsafe {
            let index = core.hsa_queue_add_write_index_scacq_screl_fn.unwrap()(queue, 1);
            let ring = (*queue).base_address.cast::<hsa_kernel_dispatch_packet_t>();
            let slot = ring.add((index % u64::from((*queue).size)) as usize);
            let packet = dispatch_packet(&Dispatch::linear(
                kernel,
                n as u32,
                64,
                (&raw mut args).cast(),
                done,
            ));
            // Body (bytes 2..64, setup included) first, then the header with one release store.
            let body = std::ptr::from_ref(&packet).cast::<u8>().add(2);
            std::ptr::copy_nonoverlapping(body, slot.cast::<u8>().add(2), 62);
            (*slot.cast::<AtomicU16>()).store(packet.header, Ordering::Release);
            core.hsa_signal_store_screlease_fn.unwrap()((*queue).doorbell_signal, index as i64);
        }
        assert!(hsa.wait_zero(done, PROMPT), "dispatch {run} completed");
        // SAFETY: the kernel completed; the buffer holds n u32s.
        let values = unsafe { read_u32s(data, n) };
        assert!(
            values.iter().all(|&v| v == run),
            "after {run} runs every element is {run}"
        );
    }
    // SAFETY: created above.
    unsafe { hsa.queue_destroy(queue) }.unwrap();
    hsa.free(data.cast()).unwrap();
}

#[test]
fn a_small_ring_wraps_and_consumed_slots_are_marked_invalid() {
    let (hsa, _session) = open();
    let core = *hsa.core();
    let gpu = hsa.gpu_agents().unwrap()[1];
    let data = hsa
        .allocate(hsa.coarse_pool(gpu).unwrap(), 4)
        .unwrap()
        .cast::<u32>();
    let mut args = AddOneArgs { data };
    let queue = hsa.queue_create(gpu, 4).unwrap();
    let done = hsa.signal_create(25).unwrap();
    for _ in 0..25 {
        let d = Dispatch::linear(add_one_kernel(), 1, 1, (&raw mut args).cast(), done);
        // SAFETY: live queue; args outlive the dispatches (we wait below).
        unsafe { hsa.dispatch(queue, &d) };
    }
    assert!(hsa.wait_zero(done, PROMPT));
    // SAFETY: completed; one u32.
    assert_eq!(unsafe { *data }, 25);
    // SAFETY: table entries on a live queue; ring slots are readable.
    unsafe {
        assert_eq!(
            core.hsa_queue_load_write_index_scacquire_fn.unwrap()(queue),
            25
        );
        let read = core.hsa_queue_load_read_index_scacquire_fn.unwrap()(queue);
        assert_eq!(read, 25, "every packet was consumed");
        let ring = (*queue).base_address.cast::<AtomicU16>();
        for slot in 0..4 {
            let header = (*ring.add(slot * 32)).load(Ordering::Acquire);
            assert_eq!(u32::from(header & 0xff), HSA_PACKET_TYPE_INVALID);
        }
        hsa.queue_destroy(queue).unwrap();
    }
}

#[test]
fn queue_fields_describe_a_real_aql_queue() {
    let (hsa, _session) = open();
    let gpu = hsa.gpu_agents().unwrap()[0];
    let a = hsa.queue_create(gpu, 128).unwrap();
    let b = hsa.queue_create(gpu, 128).unwrap();
    // SAFETY: live queues; hsa_queue_t fields are readable.
    unsafe {
        assert_eq!((*a).size, 128);
        assert_eq!((*a).type_, HSA_QUEUE_TYPE_MULTI);
        assert_eq!(
            (*a).features & HSA_QUEUE_FEATURE_KERNEL_DISPATCH,
            HSA_QUEUE_FEATURE_KERNEL_DISPATCH
        );
        assert_eq!(
            (*a).base_address as usize % 64,
            0,
            "ring is 64-byte aligned"
        );
        assert_ne!((*a).id, (*b).id, "queue ids are unique");
        assert_ne!((*a).doorbell_signal.handle, 0);
        // The doorbell is a real signal: it can be loaded through the table.
        let load = hsa.core().hsa_signal_load_relaxed_fn.unwrap();
        assert_eq!(load((*a).doorbell_signal), 0);
        hsa.queue_destroy(a).unwrap();
        hsa.queue_destroy(b).unwrap();
    }
}

#[test]
fn a_queue_smaller_than_the_minimum_size_is_created_with_the_minimum_size() {
    // hsa.h: "The size of the newly created queue is the maximum of size and the value of
    // HSA_AGENT_INFO_QUEUE_MIN_SIZE in agent."
    let (hsa, _session) = open();
    let gpu = hsa.gpu_agents().unwrap()[0];
    let mut min = 0u32;
    // SAFETY: table entry; QUEUE_MIN_SIZE is a u32.
    let status = unsafe {
        hsa.core().hsa_agent_get_info_fn.unwrap()(
            gpu,
            HSA_AGENT_INFO_QUEUE_MIN_SIZE,
            (&raw mut min).cast(),
        )
    };
    assert_eq!(status, HSA_STATUS_SUCCESS);
    assert!(min > 1, "the agent has a minimum to round up to");
    let mut size = 1;
    while size < min {
        let queue = hsa
            .queue_create(gpu, size)
            .unwrap_or_else(|status| panic!("a queue of {size} packets: status {status:#x}"));
        // SAFETY: a live queue.
        assert_eq!(unsafe { (*queue).size }, min, "asked for {size} packets");
        let done = hsa.signal_create(1).unwrap();
        // SAFETY: a live queue.
        unsafe { hsa.submit(queue, &barrier_and_packet(&[], done, false)) };
        assert!(hsa.wait_zero(done, PROMPT));
        // SAFETY: created above.
        unsafe { hsa.queue_destroy(queue) }.unwrap();
        size *= 2;
    }
}

static SLOW_GROUPS_DONE: AtomicU32 = AtomicU32::new(0);

/// Each work-group spins briefly, then counts itself done.
fn slow_groups(_: &WorkGroup) {
    let until = Instant::now() + Duration::from_micros(200);
    while Instant::now() < until {
        std::hint::spin_loop();
    }
    SLOW_GROUPS_DONE.fetch_add(1, Ordering::AcqRel);
}

/// Records how many slow work-groups had finished when it started.
fn observe_slow_groups(group: &WorkGroup) {
    // SAFETY: dispatches of this kernel pass a pointer to one u32.
    let out: *mut u32 = unsafe { group.kernargs() };
    // SAFETY: the u32 outlives the dispatch.
    unsafe { *out = SLOW_GROUPS_DONE.load(Ordering::Acquire) };
}

#[test]
fn a_barrier_packet_starts_after_every_earlier_packet_completed() {
    let (hsa, _session) = open();
    let gpu = hsa.gpu_agents().unwrap()[0];
    let queue = hsa.queue_create(gpu, 64).unwrap();
    let slow = register_kernel("slow_groups", slow_groups);
    let observe = register_kernel("observe_slow_groups", observe_slow_groups);
    let done = hsa.signal_create(2).unwrap();
    let mut seen: u32 = 0;
    let mut out: *mut u32 = &raw mut seen;
    let mut first = Dispatch::linear(slow, 64, 1, std::ptr::null_mut(), done);
    first.barrier = false;
    let mut second = Dispatch::linear(observe, 1, 1, (&raw mut out).cast(), done);
    second.barrier = true;
    // SAFETY: live queue; kernargs outlive the dispatches.
    unsafe {
        hsa.dispatch(queue, &first);
        hsa.dispatch(queue, &second);
    }
    assert!(hsa.wait_zero(done, PROMPT));
    assert_eq!(
        seen, 64,
        "the barrier packet saw all 64 work-groups of the earlier packet done"
    );
    // SAFETY: created above.
    unsafe { hsa.queue_destroy(queue) }.unwrap();
}

#[test]
fn packets_of_one_queue_complete_in_submission_order() {
    let (hsa, _session) = open();
    let gpu = hsa.gpu_agents().unwrap()[1];
    let queue = hsa.queue_create(gpu, 16).unwrap();
    let log: Vec<AtomicU64> = (0..10).map(|_| AtomicU64::new(u64::MAX)).collect();
    let next = AtomicU32::new(0);
    let done = hsa.signal_create(10).unwrap();
    let mut args: Vec<OrderArgs> = (0..10)
        .map(|id| OrderArgs {
            log: log.as_ptr(),
            next: &next,
            id,
        })
        .collect();
    for a in &mut args {
        let d = Dispatch::linear(
            record_order_kernel(),
            1,
            1,
            std::ptr::from_mut(a).cast(),
            done,
        );
        // SAFETY: live queue; args outlive the dispatches.
        unsafe { hsa.dispatch(queue, &d) };
    }
    assert!(hsa.wait_zero(done, PROMPT));
    let order: Vec<u64> = log.iter().map(|v| v.load(Ordering::Acquire)).collect();
    assert_eq!(order, (0..10).collect::<Vec<u64>>());
    // SAFETY: created above.
    unsafe { hsa.queue_destroy(queue) }.unwrap();
}

#[test]
fn a_barrier_and_packet_waits_for_a_signal_set_later_by_another_thread() {
    let (hsa, _session) = open();
    let gpu = hsa.gpu_agents().unwrap()[0];
    let queue = hsa.queue_create(gpu, 16).unwrap();
    let dep = hsa.signal_create(1).unwrap();
    let barrier_done = hsa.signal_create(1).unwrap();
    let kernel_done = hsa.signal_create(1).unwrap();
    let data = hsa
        .allocate(hsa.coarse_pool(gpu).unwrap(), 4)
        .unwrap()
        .cast::<u32>();
    let mut args = AddOneArgs { data };
    // SAFETY: live queue; args outlive the dispatch.
    unsafe {
        hsa.submit(queue, &barrier_and_packet(&[dep], barrier_done, false));
        hsa.dispatch(
            queue,
            &Dispatch::linear(add_one_kernel(), 1, 1, (&raw mut args).cast(), kernel_done),
        );
    }
    let data_addr = data as usize;
    let setter = std::thread::spawn(move || {
        // While `dep` is 1 neither the barrier nor the kernel behind it may complete.
        let blocked = !hsa.wait_zero(barrier_done, Duration::from_millis(30));
        // SAFETY: the buffer is live until the test frees it after joining.
        let untouched = unsafe { *(data_addr as *const u32) } == 0;
        hsa.signal_store(dep, 0);
        (blocked, untouched)
    });
    let (blocked, untouched) = setter.join().unwrap();
    assert!(
        blocked,
        "the barrier completed while its dependency was still 1"
    );
    assert!(untouched, "the kernel behind the barrier ran too early");
    assert!(hsa.wait_zero(barrier_done, PROMPT));
    assert!(hsa.wait_zero(kernel_done, PROMPT));
    // SAFETY: completed.
    assert_eq!(unsafe { *data }, 1);
    // SAFETY: created above.
    unsafe { hsa.queue_destroy(queue) }.unwrap();
}

#[test]
fn a_barrier_or_packet_completes_when_any_dependency_reaches_zero() {
    let (hsa, _session) = open();
    let gpu = hsa.gpu_agents().unwrap()[0];
    let queue = hsa.queue_create(gpu, 16).unwrap();
    let a = hsa.signal_create(1).unwrap();
    let b = hsa.signal_create(1).unwrap();
    let done = hsa.signal_create(1).unwrap();
    let mut packet = barrier_and_packet(&[a, b], done, true);
    packet.header = packet_header(HSA_PACKET_TYPE_BARRIER_OR, true);
    // SAFETY: a barrier-OR packet has the barrier-AND layout; live queue.
    unsafe { hsa.submit(queue, &packet) };
    assert!(
        !hsa.wait_zero(done, Duration::from_millis(20)),
        "no dependency is 0 yet"
    );
    hsa.signal_store(b, 0);
    assert!(hsa.wait_zero(done, PROMPT));
    assert_eq!(hsa.signal_load(a), 1);
    // SAFETY: created above.
    unsafe { hsa.queue_destroy(queue) }.unwrap();
}

#[test]
fn a_barrier_or_packet_treats_null_dependencies_as_never_satisfied() {
    // hsa.h: in a barrier-OR packet "signals with a handle value of 0 ... are interpreted by
    // the packet processor as dependencies not satisfied" (unlike barrier-AND, where they are
    // satisfied). One with only null dependencies never completes.
    let (hsa, _session) = open();
    let gpu = hsa.gpu_agents().unwrap()[0];
    let queue = hsa.queue_create(gpu, 16).unwrap();
    let done = hsa.signal_create(1).unwrap();
    let mut packet = barrier_and_packet(&[], done, true);
    packet.header = packet_header(HSA_PACKET_TYPE_BARRIER_OR, true);
    // SAFETY: a barrier-OR packet has the barrier-AND layout; live queue.
    unsafe { hsa.submit(queue, &packet) };
    assert!(
        !hsa.wait_zero(done, Duration::from_millis(30)),
        "a barrier-OR packet whose dependencies are all null completed"
    );
    // Destroying the queue ends the wait.
    // SAFETY: created above.
    unsafe { hsa.queue_destroy(queue) }.unwrap();
    assert_eq!(hsa.signal_load(done), 1);
}

/// Kernel arguments of the overlap test: `a_saw_b` is set when kernel A observed B running.
#[repr(C)]
struct Overlap {
    b_started: AtomicBool,
    a_saw_b: AtomicBool,
}

fn overlap_a(group: &WorkGroup) {
    // SAFETY: dispatched with a pointer to a live Overlap.
    let o: &Overlap = unsafe { &*group.kernargs::<*const Overlap>() };
    let deadline = Instant::now() + PROMPT;
    while !o.b_started.load(Ordering::Acquire) && Instant::now() < deadline {
        std::thread::yield_now();
    }
    o.a_saw_b
        .store(o.b_started.load(Ordering::Acquire), Ordering::Release);
}

fn overlap_b(group: &WorkGroup) {
    // SAFETY: dispatched with a pointer to a live Overlap.
    let o: &Overlap = unsafe { &*group.kernargs::<*const Overlap>() };
    o.b_started.store(true, Ordering::Release);
}

#[test]
fn two_queues_on_one_agent_run_kernels_at_the_same_time() {
    let (hsa, _session) = open();
    let gpu = hsa.gpu_agents().unwrap()[0];
    let q1 = hsa.queue_create(gpu, 16).unwrap();
    let q2 = hsa.queue_create(gpu, 16).unwrap();
    let overlap = Overlap {
        b_started: AtomicBool::new(false),
        a_saw_b: AtomicBool::new(false),
    };
    let mut arg: *const Overlap = &overlap;
    let done = hsa.signal_create(2).unwrap();
    let a = register_kernel("overlap_a", overlap_a);
    let b = register_kernel("overlap_b", overlap_b);
    // SAFETY: live queues; the argument outlives both dispatches.
    unsafe {
        hsa.dispatch(q1, &Dispatch::linear(a, 1, 1, (&raw mut arg).cast(), done));
        hsa.dispatch(q2, &Dispatch::linear(b, 1, 1, (&raw mut arg).cast(), done));
    }
    assert!(hsa.wait_zero(done, 2 * PROMPT));
    assert!(
        overlap.a_saw_b.load(Ordering::Acquire),
        "kernel A was still running when B started"
    );
    // SAFETY: created above.
    unsafe {
        hsa.queue_destroy(q1).unwrap();
        hsa.queue_destroy(q2).unwrap();
    }
}

#[test]
fn profiling_records_dispatch_start_and_end_on_the_completion_signal() {
    let (hsa, _session) = open();
    let amd = *hsa.amd();
    let gpu = hsa.gpu_agents().unwrap()[0];
    let queue = hsa.queue_create(gpu, 16).unwrap();
    let data = hsa
        .allocate(hsa.coarse_pool(gpu).unwrap(), 256)
        .unwrap()
        .cast::<u32>();
    let mut args = AddOneArgs { data };
    let profiled = hsa.signal_create(1).unwrap();
    let unprofiled = hsa.signal_create(1).unwrap();
    let mut time = hsa_amd_profiling_dispatch_time_t::default();
    // SAFETY: table entries with HSA signatures on live objects.
    unsafe {
        hsa.dispatch(
            queue,
            &Dispatch::linear(add_one_kernel(), 64, 64, (&raw mut args).cast(), unprofiled),
        );
        assert!(hsa.wait_zero(unprofiled, PROMPT));
        assert_eq!(
            amd.hsa_amd_profiling_set_profiler_enabled_fn.unwrap()(queue, 1),
            HSA_STATUS_SUCCESS
        );
        hsa.dispatch(
            queue,
            &Dispatch::linear(add_one_kernel(), 64, 64, (&raw mut args).cast(), profiled),
        );
        assert!(hsa.wait_zero(profiled, PROMPT));
        let get = amd.hsa_amd_profiling_get_dispatch_time_fn.unwrap();
        assert_eq!(get(gpu, profiled, &mut time), HSA_STATUS_SUCCESS);
        assert!(time.start > 0 && time.start <= time.end, "{time:?}");
        let mut now = 0u64;
        let info = hsa.core().hsa_system_get_info_fn.unwrap();
        assert_eq!(
            info(HSA_SYSTEM_INFO_TIMESTAMP, (&raw mut now).cast()),
            HSA_STATUS_SUCCESS
        );
        assert!(time.end <= now, "timestamps are in the system domain");
        let mut converted = 0u64;
        let convert = amd
            .hsa_amd_profiling_convert_tick_to_system_domain_fn
            .unwrap();
        assert_eq!(convert(gpu, time.start, &mut converted), HSA_STATUS_SUCCESS);
        assert_eq!(converted, time.start);
        let mut none = hsa_amd_profiling_dispatch_time_t::default();
        assert_eq!(get(gpu, unprofiled, &mut none), HSA_STATUS_SUCCESS);
        assert_eq!(
            (none.start, none.end),
            (0, 0),
            "nothing recorded without profiling"
        );
        hsa.queue_destroy(queue).unwrap();
    }
}

struct ErrorLog {
    status: AtomicU32,
    queue: AtomicU64,
    calls: AtomicU32,
}

unsafe extern "C" fn record_error(
    status: hsa_status_t,
    queue: *mut hsa_queue_t,
    data: *mut c_void,
) {
    // SAFETY: `data` is the ErrorLog given to hsa_queue_create, alive for the queue's life.
    let log = unsafe { &*data.cast::<ErrorLog>() };
    log.queue.store(queue as u64, Ordering::Release);
    log.status.store(status, Ordering::Release);
    log.calls.fetch_add(1, Ordering::AcqRel);
}

fn queue_with_error_log(hsa: &kreplay_softhsa::testing::Hsa, log: &ErrorLog) -> *mut hsa_queue_t {
    let gpu = hsa.gpu_agents().unwrap()[0];
    let mut queue = std::ptr::null_mut();
    let create = hsa.core().hsa_queue_create_fn.unwrap();
    // SAFETY: table entry with the HSA signature; `log` outlives the queue in every test.
    let status = unsafe {
        create(
            gpu,
            16,
            HSA_QUEUE_TYPE_MULTI,
            Some(record_error),
            std::ptr::from_ref(log).cast_mut().cast(),
            0,
            0,
            &mut queue,
        )
    };
    assert_eq!(status, HSA_STATUS_SUCCESS);
    queue
}

fn wait_for_call(log: &ErrorLog) -> bool {
    let deadline = Instant::now() + PROMPT;
    while log.calls.load(Ordering::Acquire) == 0 {
        if Instant::now() > deadline {
            return false;
        }
        std::thread::yield_now();
    }
    true
}

#[test]
fn an_unknown_kernel_object_is_a_queue_error_and_later_packets_do_not_run() {
    let (hsa, _session) = open();
    let log = ErrorLog {
        status: AtomicU32::new(0),
        queue: AtomicU64::new(0),
        calls: AtomicU32::new(0),
    };
    let queue = queue_with_error_log(&hsa, &log);
    let bad_done = hsa.signal_create(1).unwrap();
    let good_done = hsa.signal_create(1).unwrap();
    let data = hsa
        .allocate(hsa.coarse_pool(hsa.gpu_agents().unwrap()[0]).unwrap(), 4)
        .unwrap()
        .cast::<u32>();
    let mut args = AddOneArgs { data };
    // SAFETY: live queue; args outlive the queue.
    unsafe {
        hsa.dispatch(
            queue,
            &Dispatch::linear(0x1234_5678, 1, 1, std::ptr::null_mut(), bad_done),
        );
        hsa.dispatch(
            queue,
            &Dispatch::linear(add_one_kernel(), 1, 1, (&raw mut args).cast(), good_done),
        );
    }
    assert!(wait_for_call(&log), "the error callback ran");
    assert_eq!(
        log.status.load(Ordering::Acquire),
        HSA_STATUS_ERROR_INVALID_CODE_OBJECT
    );
    assert_eq!(log.queue.load(Ordering::Acquire), queue as u64);
    assert!(
        !hsa.wait_zero(good_done, Duration::from_millis(20)),
        "a later packet ran"
    );
    // SAFETY: completion never came, so the kernel never touched the buffer.
    assert_eq!(unsafe { *data }, 0);
    assert_eq!(
        hsa.signal_load(bad_done),
        1,
        "the failed packet did not signal completion"
    );
    assert_eq!(log.calls.load(Ordering::Acquire), 1);
    // SAFETY: created above.
    unsafe { hsa.queue_destroy(queue) }.unwrap();
}

#[test]
fn an_unknown_packet_type_is_an_invalid_packet_format_error() {
    let (hsa, _session) = open();
    let log = ErrorLog {
        status: AtomicU32::new(0),
        queue: AtomicU64::new(0),
        calls: AtomicU32::new(0),
    };
    let queue = queue_with_error_log(&hsa, &log);
    let mut packet = barrier_and_packet(&[], hsa_signal_t { handle: 0 }, false);
    packet.header = packet_header(HSA_PACKET_TYPE_AGENT_DISPATCH, false);
    // SAFETY: a 64-byte packet on a live queue.
    unsafe { hsa.submit(queue, &packet) };
    assert!(wait_for_call(&log));
    assert_eq!(
        log.status.load(Ordering::Acquire),
        HSA_STATUS_ERROR_INVALID_PACKET_FORMAT
    );
    // SAFETY: created above.
    unsafe { hsa.queue_destroy(queue) }.unwrap();
}

fn panicking_kernel(_: &WorkGroup) {
    panic!("kernel bug");
}

#[test]
fn a_panicking_kernel_is_reported_as_an_exception_on_the_queue() {
    let (hsa, _session) = open();
    let log = ErrorLog {
        status: AtomicU32::new(0),
        queue: AtomicU64::new(0),
        calls: AtomicU32::new(0),
    };
    let queue = queue_with_error_log(&hsa, &log);
    let kernel = register_kernel("panicking_kernel", panicking_kernel);
    let done = hsa.signal_create(1).unwrap();
    // SAFETY: live queue.
    unsafe {
        hsa.dispatch(
            queue,
            &Dispatch::linear(kernel, 4, 1, std::ptr::null_mut(), done),
        )
    };
    assert!(wait_for_call(&log));
    assert_eq!(
        log.status.load(Ordering::Acquire),
        HSA_STATUS_ERROR_EXCEPTION
    );
    assert_eq!(hsa.signal_load(done), 1);
    // SAFETY: created above.
    unsafe { hsa.queue_destroy(queue) }.unwrap();
}

/// Fills a 2-D grid: `out[y * width + x] = y * 1000 + x`.
fn fill_2d(group: &WorkGroup) {
    // SAFETY: dispatched with a pointer to a buffer covering the grid.
    let out: *mut u32 = unsafe { group.kernargs() };
    let width = group.grid_size()[0];
    for [x, y, _] in group.work_items() {
        // SAFETY: (x, y) lies inside the grid the buffer covers.
        unsafe { *out.add((y * width + x) as usize) = y * 1000 + x };
    }
}

#[test]
fn a_two_dimensional_grid_runs_every_work_item_once_with_partial_groups() {
    let (hsa, _session) = open();
    let gpu = hsa.gpu_agents().unwrap()[1];
    let queue = hsa.queue_create(gpu, 16).unwrap();
    let (w, h) = (37u32, 19u32);
    let buffer = hsa
        .allocate(hsa.coarse_pool(gpu).unwrap(), (w * h * 4) as usize)
        .unwrap()
        .cast::<u32>();
    let mut out = buffer;
    let done = hsa.signal_create(1).unwrap();
    let kernel = register_kernel("fill_2d", fill_2d);
    let d = Dispatch {
        kernel_object: kernel,
        grid: [w, h, 1],
        workgroup: [8, 4, 1],
        kernarg: (&raw mut out).cast(),
        completion: done,
        barrier: true,
    };
    // SAFETY: live queue; the argument outlives the dispatch.
    unsafe { hsa.dispatch(queue, &d) };
    assert!(hsa.wait_zero(done, PROMPT));
    // SAFETY: completed; w*h u32s.
    let values = unsafe { read_u32s(buffer, (w * h) as usize) };
    for y in 0..h {
        for x in 0..w {
            assert_eq!(values[(y * w + x) as usize], y * 1000 + x);
        }
    }
    // SAFETY: created above.
    unsafe { hsa.queue_destroy(queue) }.unwrap();
}
