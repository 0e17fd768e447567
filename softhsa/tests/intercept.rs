//! Queue interception (`hsa_amd_queue_intercept_create` / `_register`) through the API table.

mod common;

use common::*;
use hsa_sys::*;
use kreplay_softhsa::testing::{Dispatch, Hsa};
use std::ffi::c_void;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

/// What a counting handler saw.
#[derive(Default)]
struct Seen {
    packets: AtomicU32,
    calls: AtomicU32,
    first_index: AtomicU64,
    kernels: Mutex<Vec<u64>>,
    log: Mutex<Vec<&'static str>>,
}

fn seen(data: *mut c_void) -> &'static Seen {
    // SAFETY: every handler below is registered with a pointer to a Seen that outlives the queue.
    unsafe { &*data.cast::<Seen>() }
}

/// Reads the kernel objects of a batch of dispatch packets.
fn kernel_objects(pkts: *const c_void, count: u64) -> Vec<u64> {
    let packets = pkts.cast::<hsa_kernel_dispatch_packet_t>();
    (0..count as usize)
        // SAFETY: the runtime hands `count` packets at `pkts` to the handler.
        .map(|i| unsafe { (*packets.add(i)).kernel_object })
        .collect()
}

unsafe extern "C" fn count_and_forward(
    pkts: *const c_void,
    count: u64,
    user_pkt_index: u64,
    data: *mut c_void,
    writer: hsa_amd_queue_intercept_packet_writer,
) {
    let s = seen(data);
    if s.calls.fetch_add(1, Ordering::AcqRel) == 0 {
        s.first_index.store(user_pkt_index, Ordering::Release);
    }
    s.packets.fetch_add(count as u32, Ordering::AcqRel);
    s.kernels
        .lock()
        .unwrap()
        .extend(kernel_objects(pkts, count));
    s.log.lock().unwrap().push("first");
    // SAFETY: the writer the runtime gave us, called with the packets we were given.
    unsafe { writer.unwrap()(pkts, count) };
}

fn register(
    hsa: &Hsa,
    queue: *mut hsa_queue_t,
    handler: hsa_amd_queue_intercept_handler,
    data: &Seen,
) -> hsa_status_t {
    let f = hsa.amd().hsa_amd_queue_intercept_register_fn.unwrap();
    // SAFETY: table entry with the HSA signature; `data` outlives the queue.
    unsafe { f(queue, handler, std::ptr::from_ref(data).cast_mut().cast()) }
}

#[test]
fn a_handler_sees_counts_and_forwards_every_packet() {
    let (hsa, _session) = open();
    let gpu = hsa.gpu_agents().unwrap()[0];
    let queue = hsa.intercept_queue_create(gpu, 16).unwrap();
    let s = Seen::default();
    assert_eq!(
        register(&hsa, queue, Some(count_and_forward), &s),
        HSA_STATUS_SUCCESS
    );
    let data = hsa
        .allocate(hsa.coarse_pool(gpu).unwrap(), 64 * 4)
        .unwrap()
        .cast::<u32>();
    let mut args = AddOneArgs { data };
    let done = hsa.signal_create(3).unwrap();
    for _ in 0..3 {
        // SAFETY: live queue; args outlive the dispatches.
        unsafe {
            hsa.dispatch(
                queue,
                &Dispatch::linear(add_one_kernel(), 64, 16, (&raw mut args).cast(), done),
            )
        };
    }
    assert!(hsa.wait_zero(done, PROMPT));
    assert_eq!(s.packets.load(Ordering::Acquire), 3);
    assert_eq!(
        s.first_index.load(Ordering::Acquire),
        0,
        "user_pkt_index of the first packet"
    );
    assert_eq!(*s.kernels.lock().unwrap(), vec![add_one_kernel(); 3]);
    // SAFETY: completed; 64 u32s.
    assert!(unsafe { read_u32s(data, 64) }.iter().all(|&v| v == 3));
    // The application's view: its own ring, fully consumed.
    let core = *hsa.core();
    // SAFETY: table entries on a live queue; ring headers are readable.
    unsafe {
        assert_eq!(
            core.hsa_queue_load_read_index_scacquire_fn.unwrap()(queue),
            3
        );
        let header = (*queue).base_address.cast::<u16>().read_volatile();
        assert_eq!(
            u32::from(header & 0xff),
            HSA_PACKET_TYPE_INVALID,
            "slot handed back"
        );
        hsa.queue_destroy(queue).unwrap();
    }
}

/// Forwards each packet twice: a copy with its own completion signal (waited for, so the
/// handler blocks on forwarded work), then the original.
unsafe extern "C" fn forward_twice(
    pkts: *const c_void,
    count: u64,
    _user_pkt_index: u64,
    data: *mut c_void,
    writer: hsa_amd_queue_intercept_packet_writer,
) {
    let hsa = Hsa::softhsa();
    let s = seen(data);
    let writer = writer.unwrap();
    let packets = pkts.cast::<hsa_kernel_dispatch_packet_t>();
    for i in 0..count as usize {
        // SAFETY: the runtime hands `count` packets at `pkts`.
        let original = unsafe { *packets.add(i) };
        let mut replay = original;
        let mine = hsa.signal_create(1).unwrap();
        replay.completion_signal = mine;
        // SAFETY: the runtime's writer, given one 64-byte packet.
        unsafe { writer(std::ptr::from_ref(&replay).cast(), 1) };
        if !hsa.wait_zero(mine, PROMPT) {
            s.log
                .lock()
                .unwrap()
                .push("the forwarded copy did not complete");
        }
        hsa.signal_destroy(mine).unwrap();
        s.packets.fetch_add(1, Ordering::AcqRel);
        // SAFETY: as above.
        unsafe { writer(std::ptr::from_ref(&original).cast(), 1) };
    }
}

#[test]
fn a_handler_that_forwards_a_packet_twice_runs_the_kernel_twice() {
    let (hsa, _session) = open();
    let gpu = hsa.gpu_agents().unwrap()[1];
    let queue = hsa.intercept_queue_create(gpu, 16).unwrap();
    let s = Seen::default();
    assert_eq!(
        register(&hsa, queue, Some(forward_twice), &s),
        HSA_STATUS_SUCCESS
    );
    let data = hsa
        .allocate(hsa.coarse_pool(gpu).unwrap(), 4)
        .unwrap()
        .cast::<u32>();
    let mut args = AddOneArgs { data };
    let done = hsa.signal_create(1).unwrap();
    // SAFETY: live queue; args outlive the dispatch.
    unsafe {
        hsa.dispatch(
            queue,
            &Dispatch::linear(add_one_kernel(), 1, 1, (&raw mut args).cast(), done),
        )
    };
    assert!(hsa.wait_zero(done, PROMPT));
    // SAFETY: both runs completed (the copy before the original was forwarded).
    assert_eq!(unsafe { *data }, 2, "x += 1 ran twice");
    assert_eq!(
        hsa.signal_load(done),
        0,
        "the application's signal was decremented once"
    );
    assert!(
        s.log.lock().unwrap().is_empty(),
        "{:?}",
        s.log.lock().unwrap()
    );
    // SAFETY: created above.
    unsafe { hsa.queue_destroy(queue) }.unwrap();
}

/// What each handler of a three-handler chain saw, and the packet the last-registered one adds.
struct Chain {
    /// (handler, user_pkt_index, kernarg addresses of the packets it was given), in call order.
    log: Mutex<Vec<(&'static str, u64, Vec<u64>)>>,
    /// A dispatch the handler registered last adds behind every packet it is given.
    extra: hsa_kernel_dispatch_packet_t,
}

fn chain(data: *mut c_void) -> &'static Chain {
    // SAFETY: the chain handlers below are registered with a pointer to a Chain that outlives
    // the queue.
    unsafe { &*data.cast::<Chain>() }
}

/// The kernarg addresses of a batch of dispatch packets (which packet is which).
fn kernargs(pkts: *const c_void, count: u64) -> Vec<u64> {
    let packets = pkts.cast::<hsa_kernel_dispatch_packet_t>();
    (0..count as usize)
        // SAFETY: the runtime (or a writer's caller) hands `count` packets at `pkts`.
        .map(|i| unsafe { (*packets.add(i)).kernarg_address } as u64)
        .collect()
}

/// Registered first: passes on every packet but the added one.
unsafe extern "C" fn registered_first(
    pkts: *const c_void,
    count: u64,
    user_pkt_index: u64,
    data: *mut c_void,
    writer: hsa_amd_queue_intercept_packet_writer,
) {
    let c = chain(data);
    let seen = kernargs(pkts, count);
    c.log
        .lock()
        .unwrap()
        .push(("first", user_pkt_index, seen.clone()));
    let packets = pkts.cast::<hsa_kernel_dispatch_packet_t>();
    for (i, kernarg) in seen.into_iter().enumerate() {
        if kernarg != c.extra.kernarg_address as u64 {
            // SAFETY: the runtime's writer, given one of the packets we were given.
            unsafe { writer.unwrap()(packets.add(i).cast(), 1) };
        }
    }
}

/// Registered second: passes everything on unchanged.
unsafe extern "C" fn registered_second(
    pkts: *const c_void,
    count: u64,
    user_pkt_index: u64,
    data: *mut c_void,
    writer: hsa_amd_queue_intercept_packet_writer,
) {
    let c = chain(data);
    c.log
        .lock()
        .unwrap()
        .push(("second", user_pkt_index, kernargs(pkts, count)));
    // SAFETY: the runtime's writer, called with the packets we were given.
    unsafe { writer.unwrap()(pkts, count) };
}

/// Registered last: passes on what it is given with one more dispatch behind.
unsafe extern "C" fn registered_last(
    pkts: *const c_void,
    count: u64,
    user_pkt_index: u64,
    data: *mut c_void,
    writer: hsa_amd_queue_intercept_packet_writer,
) {
    let c = chain(data);
    c.log
        .lock()
        .unwrap()
        .push(("last", user_pkt_index, kernargs(pkts, count)));
    let packets = pkts.cast::<hsa_kernel_dispatch_packet_t>();
    // SAFETY: the runtime hands `count` packets at `pkts`; they are copied.
    let mut out: Vec<hsa_kernel_dispatch_packet_t> = (0..count as usize)
        .map(|i| unsafe { *packets.add(i) })
        .collect();
    out.push(c.extra);
    // SAFETY: the runtime's writer, given `out.len()` packets.
    unsafe { writer.unwrap()(out.as_ptr().cast(), out.len() as u64) };
}

/// ROCm keeps a queue's handlers in registration order and calls the one registered last with
/// the application's packets; its writer calls the one registered before it, and the writer of
/// the first-registered handler writes into the hardware queue (ROCR-Runtime's
/// `InterceptQueue`). A tool that creates the queue and registers first is therefore the one
/// nearest the hardware: what it writes is seen by no other handler.
#[test]
fn the_handler_registered_last_is_called_first_and_the_first_writes_to_the_hardware_queue() {
    let (hsa, _session) = open();
    let gpu = hsa.gpu_agents().unwrap()[0];
    let queue = hsa.intercept_queue_create(gpu, 16).unwrap();
    let pool = hsa.coarse_pool(gpu).unwrap();
    let x = hsa.allocate(pool, 4).unwrap().cast::<u32>();
    let y = hsa.allocate(pool, 4).unwrap().cast::<u32>();
    let mut x_args = AddOneArgs { data: x };
    let mut y_args = AddOneArgs { data: y };
    let y_done = hsa.signal_create(1).unwrap();
    let c = Chain {
        log: Mutex::new(Vec::new()),
        extra: kreplay_softhsa::testing::dispatch_packet(&Dispatch::linear(
            add_one_kernel(),
            1,
            1,
            (&raw mut y_args).cast(),
            y_done,
        )),
    };
    let f = hsa.amd().hsa_amd_queue_intercept_register_fn.unwrap();
    for handler in [registered_first, registered_second, registered_last] {
        // SAFETY: table entry; `c` outlives the queue.
        let status = unsafe {
            f(
                queue,
                Some(handler),
                std::ptr::from_ref(&c).cast_mut().cast(),
            )
        };
        assert_eq!(status, HSA_STATUS_SUCCESS);
    }
    let written = std::sync::Arc::new(Mutex::new(Vec::new()));
    let sink = written.clone();
    kreplay_softhsa::testing::wrap_hardware_writes(queue, move |batch, write| {
        sink.lock()
            .unwrap()
            .push(kernargs(batch.as_ptr().cast(), batch.len() as u64));
        write();
    })
    .unwrap();
    let done = hsa.signal_create(1).unwrap();
    // SAFETY: live queue; args outlive the dispatch.
    unsafe {
        hsa.dispatch(
            queue,
            &Dispatch::linear(add_one_kernel(), 1, 1, (&raw mut x_args).cast(), done),
        )
    };
    assert!(hsa.wait_zero(done, PROMPT));
    let (xa, ya) = ((&raw mut x_args) as u64, (&raw mut y_args) as u64);
    assert_eq!(
        *c.log.lock().unwrap(),
        vec![
            ("last", 0, vec![xa]),
            ("second", 0, vec![xa, ya]),
            ("first", 0, vec![xa, ya]),
        ],
        "called last-registered first, each writer feeding the handler registered before"
    );
    // SAFETY: `x`'s dispatch completed; `y`'s was never written to the hardware queue (the
    // first-registered handler dropped it), so nothing writes either.
    let (xv, yv) = unsafe { (*x, *y) };
    assert_eq!(xv, 1, "the application's dispatch ran once");
    assert_eq!(yv, 0, "what the first-registered handler dropped never ran");
    assert_eq!(hsa.signal_load(y_done), 1);
    assert_eq!(
        *written.lock().unwrap(),
        vec![vec![xa]],
        "one write reached the hardware queue: the first-registered handler's"
    );
    // SAFETY: created above.
    unsafe { hsa.queue_destroy(queue) }.unwrap();
}

#[test]
fn hardware_writes_are_observable_on_intercept_queues_only() {
    let (hsa, _session) = open();
    let gpu = hsa.gpu_agents().unwrap()[0];
    let plain = hsa.queue_create(gpu, 16).unwrap();
    assert_eq!(
        kreplay_softhsa::testing::wrap_hardware_writes(plain, |_, write| write()),
        Err(HSA_STATUS_ERROR_INVALID_QUEUE)
    );
    // SAFETY: created above.
    unsafe { hsa.queue_destroy(plain) }.unwrap();
}

/// The state of the re-entrancy test: the handler submits one extra packet into the very queue
/// it is handling, from inside the handler.
struct Reentry {
    seen: Seen,
    queue: AtomicU64,
    extra: Mutex<Option<Dispatch>>,
}

unsafe extern "C" fn resubmit_into_same_queue(
    pkts: *const c_void,
    count: u64,
    _user_pkt_index: u64,
    data: *mut c_void,
    writer: hsa_amd_queue_intercept_packet_writer,
) {
    // SAFETY: registered with a pointer to a Reentry that outlives the queue.
    let r = unsafe { &*data.cast::<Reentry>() };
    r.seen.packets.fetch_add(count as u32, Ordering::AcqRel);
    if let Some(extra) = r.extra.lock().unwrap().take() {
        let queue = r.queue.load(Ordering::Acquire) as *mut hsa_queue_t;
        // SAFETY: the intercept queue is live; ringing its doorbell here re-enters the runtime
        // on this thread, which must not deadlock.
        unsafe { Hsa::softhsa().dispatch(queue, &extra) };
    }
    // SAFETY: the runtime's writer, given the packets we were given.
    unsafe { writer.unwrap()(pkts, count) };
}

#[test]
fn a_handler_submitting_to_its_own_queue_does_not_deadlock_and_its_packet_runs() {
    let (hsa, _session) = open();
    let gpu = hsa.gpu_agents().unwrap()[0];
    let queue = hsa.intercept_queue_create(gpu, 16).unwrap();
    let data = hsa
        .allocate(hsa.coarse_pool(gpu).unwrap(), 4)
        .unwrap()
        .cast::<u32>();
    let mut args = AddOneArgs { data };
    let done = hsa.signal_create(2).unwrap();
    let packet = Dispatch::linear(add_one_kernel(), 1, 1, (&raw mut args).cast(), done);
    let r = Reentry {
        seen: Seen::default(),
        queue: AtomicU64::new(queue as u64),
        extra: Mutex::new(Some(packet)),
    };
    let f = hsa.amd().hsa_amd_queue_intercept_register_fn.unwrap();
    // SAFETY: table entry; `r` outlives the queue.
    let status = unsafe {
        f(
            queue,
            Some(resubmit_into_same_queue),
            std::ptr::from_ref(&r).cast_mut().cast(),
        )
    };
    assert_eq!(status, HSA_STATUS_SUCCESS);
    // SAFETY: live queue; args outlive the dispatches.
    unsafe { hsa.dispatch(queue, &packet) };
    assert!(hsa.wait_zero(done, PROMPT), "both packets completed");
    assert_eq!(
        r.seen.packets.load(Ordering::Acquire),
        2,
        "the nested packet was handled too"
    );
    // SAFETY: completed.
    assert_eq!(unsafe { *data }, 2);
    // SAFETY: created above.
    unsafe { hsa.queue_destroy(queue) }.unwrap();
}

#[test]
fn without_handlers_packets_go_straight_to_the_hardware_queue() {
    let (hsa, _session) = open();
    let gpu = hsa.gpu_agents().unwrap()[1];
    let queue = hsa.intercept_queue_create(gpu, 4).unwrap();
    let data = hsa
        .allocate(hsa.coarse_pool(gpu).unwrap(), 4)
        .unwrap()
        .cast::<u32>();
    let mut args = AddOneArgs { data };
    let done = hsa.signal_create(10).unwrap();
    for _ in 0..10 {
        // SAFETY: live queue; args outlive the dispatches.
        unsafe {
            hsa.dispatch(
                queue,
                &Dispatch::linear(add_one_kernel(), 1, 1, (&raw mut args).cast(), done),
            )
        };
    }
    assert!(hsa.wait_zero(done, PROMPT));
    // SAFETY: completed.
    let value = unsafe { *data };
    assert_eq!(
        value, 10,
        "both rings (size 4) wrapped without losing packets"
    );
    // SAFETY: created above.
    unsafe { hsa.queue_destroy(queue) }.unwrap();
}

#[test]
fn a_slot_reserved_past_a_full_ring_is_neither_run_twice_nor_lost() {
    // Five packet ids reserved at once on a ring of four: the fifth producer waits for room.
    // The doorbell rung for the first four must hand exactly those four on (ROCm processes at
    // most a ring's worth past its read index), not the slot of packet 0 again as packet 4.
    let (hsa, _session) = open();
    let c = *hsa.core();
    let gpu = hsa.gpu_agents().unwrap()[0];
    let queue = hsa.intercept_queue_create(gpu, 4).unwrap();
    let done: Vec<hsa_signal_t> = (0..5).map(|_| hsa.signal_create(1).unwrap()).collect();
    // SAFETY: a live queue; its fields are read-only for producers.
    let (base, size, doorbell) = unsafe {
        (
            (*queue).base_address.cast::<hsa_barrier_and_packet_t>(),
            u64::from((*queue).size),
            (*queue).doorbell_signal,
        )
    };
    assert_eq!(size, 4);
    let publish = |index: u64| {
        let packet = kreplay_softhsa::testing::barrier_and_packet(&[], done[index as usize], false);
        // SAFETY: slot `index` is ours (reserved below, and free: the read index is past the
        // packet that used it before); body first, then the header with a release store.
        unsafe {
            let slot = base.add((index % size) as usize);
            std::ptr::copy_nonoverlapping(
                std::ptr::from_ref(&packet).cast::<u8>().add(2),
                slot.cast::<u8>().add(2),
                62,
            );
            (*slot.cast::<std::sync::atomic::AtomicU16>()).store(packet.header, Ordering::Release);
        }
    };
    // SAFETY: table entries on a live queue.
    unsafe {
        let first = c.hsa_queue_add_write_index_scacq_screl_fn.unwrap()(queue, 5);
        assert_eq!(first, 0);
        for index in 0..4 {
            publish(index);
        }
        c.hsa_signal_store_screlease_fn.unwrap()(doorbell, 3);
        let deadline = std::time::Instant::now() + PROMPT;
        while c.hsa_queue_load_read_index_scacquire_fn.unwrap()(queue) < 1 {
            assert!(std::time::Instant::now() < deadline, "no room came");
            std::thread::yield_now();
        }
        publish(4);
        c.hsa_signal_store_screlease_fn.unwrap()(doorbell, 4);
    }
    for (i, &signal) in done.iter().enumerate() {
        assert!(hsa.wait_zero(signal, PROMPT), "packet {i} ran");
    }
    let values: Vec<i64> = done.iter().map(|&s| hsa.signal_load(s)).collect();
    assert_eq!(values, vec![0; 5], "every packet ran exactly once");
    // SAFETY: created above.
    unsafe { hsa.queue_destroy(queue) }.unwrap();
}

#[test]
fn registering_on_a_plain_queue_or_without_a_handler_is_rejected() {
    let (hsa, _session) = open();
    let gpu = hsa.gpu_agents().unwrap()[0];
    let plain = hsa.queue_create(gpu, 16).unwrap();
    let intercept = hsa.intercept_queue_create(gpu, 16).unwrap();
    let s = Seen::default();
    assert_eq!(
        register(&hsa, plain, Some(count_and_forward), &s),
        HSA_STATUS_ERROR_INVALID_QUEUE
    );
    assert_eq!(
        register(&hsa, intercept, None, &s),
        HSA_STATUS_ERROR_INVALID_ARGUMENT
    );
    // SAFETY: both created above.
    unsafe {
        hsa.queue_destroy(plain).unwrap();
        hsa.queue_destroy(intercept).unwrap();
    }
}

unsafe extern "C" fn record_queue_error(
    status: hsa_status_t,
    queue: *mut hsa_queue_t,
    data: *mut c_void,
) {
    // SAFETY: registered with a pointer to an AtomicU64 pair that outlives the queue.
    let out = unsafe { &*data.cast::<[AtomicU64; 2]>() };
    out[0].store(queue as u64, Ordering::Release);
    out[1].store(u64::from(status), Ordering::Release);
}

#[test]
fn errors_of_the_hardware_queue_are_reported_against_the_intercept_queue() {
    let (hsa, _session) = open();
    let gpu = hsa.gpu_agents().unwrap()[0];
    let out = [AtomicU64::new(0), AtomicU64::new(0)];
    let mut queue = std::ptr::null_mut();
    let create = hsa.amd().hsa_amd_queue_intercept_create_fn.unwrap();
    // SAFETY: table entry; `out` outlives the queue.
    let status = unsafe {
        create(
            gpu,
            16,
            HSA_QUEUE_TYPE_MULTI,
            Some(record_queue_error),
            std::ptr::from_ref(&out).cast_mut().cast(),
            0,
            0,
            &mut queue,
        )
    };
    assert_eq!(status, HSA_STATUS_SUCCESS);
    let done = hsa.signal_create(1).unwrap();
    // SAFETY: live queue.
    unsafe {
        hsa.dispatch(
            queue,
            &Dispatch::linear(0xdead, 1, 1, std::ptr::null_mut(), done),
        )
    };
    let deadline = std::time::Instant::now() + PROMPT;
    while out[1].load(Ordering::Acquire) == 0 && std::time::Instant::now() < deadline {
        std::thread::yield_now();
    }
    assert_eq!(
        out[1].load(Ordering::Acquire),
        u64::from(HSA_STATUS_ERROR_INVALID_CODE_OBJECT)
    );
    assert_eq!(out[0].load(Ordering::Acquire), queue as u64);
    // SAFETY: created above.
    unsafe { hsa.queue_destroy(queue) }.unwrap();
}

/// The thread a recording handler ran on.
static HANDLER_THREAD: Mutex<Option<std::thread::ThreadId>> = Mutex::new(None);

unsafe extern "C" fn note_thread_and_forward(
    pkts: *const c_void,
    count: u64,
    _user_pkt_index: u64,
    _data: *mut c_void,
    writer: hsa_amd_queue_intercept_packet_writer,
) {
    *HANDLER_THREAD.lock().unwrap() = Some(std::thread::current().id());
    // SAFETY: the writer the runtime gave us, called with the packets we were given.
    unsafe { writer.unwrap()(pkts, count) };
}

/// A dispatch an application object makes from its thread-local destructor.
struct DispatchAtExit {
    queue: usize,
    args: usize,
    done: hsa_signal_t,
}

impl Drop for DispatchAtExit {
    fn drop(&mut self) {
        let hsa = Hsa::softhsa();
        // SAFETY: a live queue; the leaked arguments outlive the dispatch.
        unsafe {
            hsa.dispatch(
                self.queue as *mut hsa_queue_t,
                &Dispatch::linear(
                    add_one_kernel(),
                    64,
                    16,
                    self.args as *mut c_void,
                    self.done,
                ),
            )
        };
    }
}

thread_local! {
    static AT_EXIT: std::cell::RefCell<Option<DispatchAtExit>> =
        const { std::cell::RefCell::new(None) };
}

/// A doorbell store from a thread-local destructor, made after the runtime's own thread-local
/// state of that thread was destroyed (first used after the destructor was registered), still
/// runs the queue's handlers, on the storing thread, as ROCm's per-thread cursor allows.
#[test]
fn a_doorbell_store_from_a_thread_local_destructor_runs_the_handlers_on_its_thread() {
    let (hsa, _session) = open();
    let gpu = hsa.gpu_agents().unwrap()[0];
    let queue = hsa.intercept_queue_create(gpu, 16).unwrap();
    assert_eq!(
        register(&hsa, queue, Some(note_thread_and_forward), &Seen::default()),
        HSA_STATUS_SUCCESS
    );
    let data = hsa
        .allocate(hsa.coarse_pool(gpu).unwrap(), 64 * 4)
        .unwrap()
        .cast::<u32>();
    let args: &'static mut AddOneArgs = Box::leak(Box::new(AddOneArgs { data }));
    let args = std::ptr::from_mut(args) as usize;
    let (first, last) = (hsa.signal_create(1).unwrap(), hsa.signal_create(1).unwrap());
    let queue_addr = queue as usize;
    let thread = std::thread::spawn(move || {
        AT_EXIT.with(|a| {
            *a.borrow_mut() = Some(DispatchAtExit {
                queue: queue_addr,
                args,
                done: last,
            })
        });
        let hsa = Hsa::softhsa();
        // SAFETY: a live queue; the leaked arguments outlive the dispatch.
        unsafe {
            hsa.dispatch(
                queue_addr as *mut hsa_queue_t,
                &Dispatch::linear(add_one_kernel(), 64, 16, args as *mut c_void, first),
            )
        };
        std::thread::current().id()
    });
    let storing = thread.join().unwrap();
    assert!(hsa.wait_zero(first, PROMPT));
    assert!(
        hsa.wait_zero(last, PROMPT),
        "the store from the destructor was never processed"
    );
    assert_eq!(*HANDLER_THREAD.lock().unwrap(), Some(storing));
    // SAFETY: completed; 64 u32s.
    assert!(unsafe { read_u32s(data, 64) }.iter().all(|&v| v == 2));
}

/// Forwards every batch behind a no-op barrier of its own, as a tool adding a marker packet
/// does: the hardware queue then takes more slots than the application's ring.
unsafe extern "C" fn forward_behind_a_marker(
    pkts: *const c_void,
    count: u64,
    _user_pkt_index: u64,
    data: *mut c_void,
    writer: hsa_amd_queue_intercept_packet_writer,
) {
    let s = seen(data);
    let writer = writer.unwrap();
    let marker =
        kreplay_softhsa::testing::barrier_and_packet(&[], hsa_signal_t { handle: 0 }, false);
    // SAFETY: the runtime's writer, given one 64-byte packet, then the packets it handed us.
    unsafe {
        writer(std::ptr::from_ref(&marker).cast(), 1);
        writer(pkts, count);
    }
    s.packets.fetch_add(count as u32, Ordering::AcqRel);
}

#[test]
fn a_doorbell_store_returns_while_the_hardware_queue_behind_the_handlers_is_full() {
    // ROCm's intercept queue keeps what does not fit the hardware ring aside and returns from
    // the doorbell store (the packets follow once the ring has room); softhsa's waited for
    // room in the storing thread. Here the hardware ring (4 slots) is held by a barrier the
    // application opens only after its third packet: a legitimate use of a ring of 4, which
    // a handler adding one packet per batch turned into a doorbell store that never returned.
    let (hsa, _session) = open();
    let gpu = hsa.gpu_agents().unwrap()[0];
    let queue = hsa.intercept_queue_create(gpu, 4).unwrap();
    let s = Seen::default();
    assert_eq!(
        register(&hsa, queue, Some(forward_behind_a_marker), &s),
        HSA_STATUS_SUCCESS
    );
    let gate = hsa.signal_create(1).unwrap();
    let opened = hsa.signal_create(1).unwrap();
    let done = hsa.signal_create(2).unwrap();
    let data = hsa
        .allocate(hsa.coarse_pool(gpu).unwrap(), 4)
        .unwrap()
        .cast::<u32>();
    let args = AddOneArgs { data };
    let (queue_addr, args_addr) = (queue as usize, std::ptr::from_ref(&args) as usize);
    let (tx, rx) = std::sync::mpsc::channel();
    let submitter = std::thread::spawn(move || {
        let hsa = Hsa::softhsa();
        let queue = queue_addr as *mut hsa_queue_t;
        let barrier = kreplay_softhsa::testing::barrier_and_packet(&[gate], opened, true);
        // SAFETY: a live queue; the kernel arguments outlive the dispatches (waited for below).
        unsafe {
            hsa.submit(queue, &barrier);
            for _ in 0..2 {
                hsa.dispatch(
                    queue,
                    &Dispatch::linear(add_one_kernel(), 1, 1, args_addr as *mut c_void, done),
                );
            }
        }
        let _ = tx.send(());
    });
    let returned = rx.recv_timeout(PROMPT).is_ok();
    // Opened either way, so that a store that did not return ends and the test does too.
    hsa.signal_store(gate, 0);
    submitter.join().unwrap();
    assert!(
        returned,
        "the doorbell store waited for the full hardware ring"
    );
    assert!(hsa.wait_zero(opened, PROMPT) && hsa.wait_zero(done, PROMPT));
    // SAFETY: both dispatches completed; one u32.
    assert_eq!(unsafe { read_u32s(data, 1) }, vec![2]);
    assert_eq!(s.packets.load(Ordering::Acquire), 3);
    // SAFETY: created above; everything completed.
    unsafe { hsa.queue_destroy(queue) }.unwrap();
}
