//! Queue lifecycles seen from the application: a destroy the runtime refuses, a queue destroyed
//! by one thread while another thread's replay drains its agent, packet slots reserved by
//! compare-and-swap. Every scenario is bounded in time and asserts what the application sees.

// Each test file uses part of the shared harness.
#[allow(dead_code)]
#[macro_use]
mod support;

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use hsa_sys::*;
use kreplay_drain::DrainConfig;
use kreplay_hsa::InstallOptions;
use kreplay_passloop::{ContinueChange, ToolAnswer};
use kreplay_softhsa::{OwnedApiTable, TableLayout, WorkGroup};
use support::app::{self, App, Aql, Ptr, Queue, WAIT};
use support::tool::{Script, TestHooks};
use support::{bounded, wait_flag};

/// A drain's deadline in these scenarios.
const DRAIN: Duration = Duration::from_millis(500);
/// Words of the buffers the kernels write.
const WORDS: usize = 64;

#[repr(C)]
#[derive(Clone, Copy)]
struct AddArgs {
    buf: u64,
    len: u32,
    add: u32,
}

/// `buf[i] += add`.
fn add(group: &WorkGroup) {
    // SAFETY: every dispatch of this kernel carries an `AddArgs` block.
    let args: AddArgs = unsafe { group.kernargs() };
    for [i, _, _] in group.work_items() {
        if i < args.len {
            // SAFETY: the buffer holds `len` u32s; each work-item owns index `i`.
            unsafe { *(args.buf as *mut u32).add(i as usize) += args.add };
        }
    }
}

/// Set by [`gated_add`] once it runs.
static GATED_STARTED: AtomicBool = AtomicBool::new(false);
/// Lets [`gated_add`] go on.
static GATED_GO: AtomicBool = AtomicBool::new(false);
/// Set by [`gated_add`] once its writes are done.
static GATED_WROTE: AtomicBool = AtomicBool::new(false);

/// [`add`] once [`GATED_GO`] is set (it gives up waiting after [`WAIT`]).
fn gated_add(group: &WorkGroup) {
    GATED_STARTED.store(true, Ordering::SeqCst);
    let deadline = Instant::now() + WAIT;
    while !GATED_GO.load(Ordering::SeqCst) && Instant::now() < deadline {
        std::thread::yield_now();
    }
    add(group);
    GATED_WROTE.store(true, Ordering::SeqCst);
}

fn kernel_args(app: &App, agent: hsa_agent_t, buf: Ptr, len: u32, add: u32) -> Ptr {
    let pools = app.pools(agent);
    app.kernargs(
        &pools,
        AddArgs {
            buf: buf.0,
            len,
            add,
        },
    )
}

/// softhsa's own core table (the runtime under kreplay's wrappers).
fn softhsa_core() -> &'static CoreApiTable {
    // SAFETY: softhsa's table is valid for the process.
    unsafe { &*kreplay_softhsa::api_table().core_ }
}

/// Set to make the runtime refuse the next `hsa_queue_destroy`.
static REFUSE_DESTROY: AtomicBool = AtomicBool::new(false);

/// softhsa's `hsa_queue_destroy`, but for a call made while [`REFUSE_DESTROY`] is set, which
/// the runtime refuses (leaving the queue as it was).
unsafe extern "C" fn queue_destroy_refusing(queue: *mut hsa_queue_t) -> hsa_status_t {
    if REFUSE_DESTROY.swap(false, Ordering::SeqCst) {
        return HSA_STATUS_ERROR;
    }
    let destroy = softhsa_core().hsa_queue_destroy_fn.expect("queue destroy");
    // SAFETY: the caller's queue, forwarded unchanged.
    unsafe { destroy(queue) }
}

/// A table copy of the scenario's layout whose core table `prepare` changed before kreplay is
/// installed into it.
fn table_with(prepare: impl FnOnce(&mut CoreApiTable)) -> &'static mut OwnedApiTable {
    let layout = TableLayout::from_env().expect("a known table layout");
    let table: &'static mut OwnedApiTable =
        Box::leak(Box::new(OwnedApiTable::softhsa_with(layout)));
    // SAFETY: the copy's core table is valid, and only this scenario uses it so far.
    prepare(unsafe { &mut *(*table.as_mut_ptr()).core_ });
    table
}

scenarios! {
    /// The runtime refuses the application's `hsa_queue_destroy` of queue Q, which the
    /// application then goes on using: a kernel on Q writes a buffer while a dispatch on
    /// another queue of the agent, reading and writing the same buffer, comes up for replay.
    /// The replay's drain must wait for Q (or give up and run the dispatch once), as for any
    /// queue: a replay that snapshotted the buffer beside Q's running kernel would restore it
    /// over that kernel's write, and the application would lose it.
    fn a_queue_whose_destroy_was_refused_is_still_drained_by_replays() {
        let table = table_with(|core| core.hsa_queue_destroy_fn = Some(queue_destroy_refusing));
        let hooks = TestHooks::new(0);
        let app = app::install_into(
            table,
            hooks.clone(),
            InstallOptions { drain: DrainConfig::new(DRAIN), ..Default::default() },
        );
        hooks.configure_replay(true);
        // The gated kernel (work-group 32) runs as it is; the other (64) in 2 passes, letting
        // the gated kernel write at the end of its first pass (only a replay that did not wait
        // for it gets there while it runs).
        hooks.set_script(
            Script::new(|_, info| {
                if info.workgroup_size[0] == 64 { ToolAnswer::passes(2) } else { ToolAnswer::OPT_OUT }
            })
            .on_pass_exit(|_, _, pass, _| {
                if pass == 0 {
                    GATED_GO.store(true, Ordering::SeqCst);
                    assert!(wait_flag(&GATED_WROTE), "the gated kernel wrote");
                }
                ContinueChange::Keep
            }),
        );
        let gpu = app.gpus[0];
        let pools = app.pools(gpu);
        let buf = app.buffer(pools.coarse, &[10; WORDS]);
        let q = app.queue(gpu);
        REFUSE_DESTROY.store(true, Ordering::SeqCst);
        let destroy = app.core().hsa_queue_destroy_fn.expect("queue destroy");
        // SAFETY: a live queue of this application.
        let status = unsafe { destroy(q.0) };
        assert_ne!(status, HSA_STATUS_SUCCESS, "the runtime refused the destroy");

        // Q is still the application's: a kernel there adds 100 to the first 32 words.
        let gated = kreplay_softhsa::register_kernel("lifecycle_gated_add", gated_add);
        let gated_done = app.signal(1);
        let gated_args = kernel_args(&app, gpu, buf, 32, 100);
        app.dispatch(q, Aql::dispatch(gated, 32, 32, gated_args, gated_done));
        assert!(wait_flag(&GATED_STARTED), "the gated kernel runs");

        // A dispatch adding 1 to every word, on another queue of the agent.
        let r = app.queue(gpu);
        let kernel = kreplay_softhsa::register_kernel("lifecycle_add", add);
        let done = app.signal(1);
        let args = kernel_args(&app, gpu, buf, WORDS as u32, 1);
        let waited = bounded(WAIT * 3, vec![Box::new(move || {
            app.dispatch(r, Aql::dispatch(kernel, WORDS as u32, 64, args, done));
            app.wait_zero(done)
        })]);
        assert_eq!(waited, vec![0], "the dispatch completed");
        GATED_GO.store(true, Ordering::SeqCst);
        assert_eq!(app.wait_zero(gated_done), 0, "the gated kernel completed");

        let mut expected = vec![111; 32];
        expected.extend([11; 32]);
        assert_eq!(app.read(buf, WORDS), expected, "both kernels' writes are there, once each");
        app.destroy_queue(q);
        app.destroy_queue(r);
    }
}

/// A way to reserve one packet slot other than adding to the write index.
#[derive(Clone, Copy)]
enum Reserve {
    /// A compare-and-swap entry of the write index, retried until no producer moved it.
    Cas(unsafe extern "C" fn(*const hsa_queue_t, u64, u64) -> u64),
    /// A store entry of the write index (the sole producer's way).
    Store(unsafe extern "C" fn(*const hsa_queue_t, u64)),
}

/// Every reservation entry but the adding ones, by name.
fn reservations(app: &App) -> [(&'static str, Reserve); 6] {
    let core = app.core();
    let cas = |f: Option<_>| Reserve::Cas(f.expect("a compare-and-swap entry"));
    let store = |f: Option<_>| Reserve::Store(f.expect("a store entry"));
    [
        (
            "cas scacq_screl",
            cas(core.hsa_queue_cas_write_index_scacq_screl_fn),
        ),
        (
            "cas scacquire",
            cas(core.hsa_queue_cas_write_index_scacquire_fn),
        ),
        (
            "cas relaxed",
            cas(core.hsa_queue_cas_write_index_relaxed_fn),
        ),
        (
            "cas screlease",
            cas(core.hsa_queue_cas_write_index_screlease_fn),
        ),
        (
            "store relaxed",
            store(core.hsa_queue_store_write_index_relaxed_fn),
        ),
        (
            "store screlease",
            store(core.hsa_queue_store_write_index_screlease_fn),
        ),
    ]
}

/// Writes `packet` into `queue` as [`App::dispatch`] does, but reserving its slot with
/// `reserve`.
fn dispatch_reserving(app: &App, queue: Queue, reserve: Reserve, packet: Aql) {
    // SAFETY: `queue.0` is a live queue this application created.
    let q = unsafe { &*queue.0 };
    let load_write = app
        .core()
        .hsa_queue_load_write_index_scacquire_fn
        .expect("load write index");
    let load_read = app
        .core()
        .hsa_queue_load_read_index_scacquire_fn
        .expect("load read index");
    let deadline = Instant::now() + WAIT;
    let index = loop {
        assert!(
            Instant::now() < deadline,
            "no slot of queue {} could be reserved",
            q.id
        );
        // SAFETY: a live queue of this application.
        let write = unsafe { load_write(queue.0) };
        // SAFETY: as above.
        if write - unsafe { load_read(queue.0) } >= u64::from(q.size) {
            std::thread::yield_now();
            continue;
        }
        match reserve {
            Reserve::Cas(cas) => {
                // SAFETY: as above; the exchange reserves slot `write` if no producer took it.
                if unsafe { cas(queue.0, write, write + 1) } == write {
                    break write;
                }
            }
            Reserve::Store(store) => {
                // SAFETY: as above; this thread is the queue's only producer now (the
                // application's thread is inside the replay this callback is part of).
                unsafe { store(queue.0, write + 1) };
                break write;
            }
        }
    };
    let slot = (q.base_address as usize + (index % u64::from(q.size)) as usize * 64) as *mut u8;
    let bytes: [u8; 64] = packet_bytes(packet);
    // SAFETY: `slot` is the 64-byte ring slot reserved above; bytes 4..64 are the body, written
    // before the header publishes it.
    unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr().add(4), slot.add(4), 60) };
    // SAFETY: the slot is 64-byte aligned, so its first 4 bytes are an aligned u32 that the
    // packet processor reads atomically; release order publishes the body.
    let header = unsafe { &*slot.cast::<std::sync::atomic::AtomicU32>() };
    header.store(
        u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]),
        Ordering::Release,
    );
    let store = app
        .core()
        .hsa_signal_store_screlease_fn
        .expect("signal store");
    // SAFETY: the queue's own doorbell signal.
    unsafe { store(q.doorbell_signal, index as i64) };
}

fn packet_bytes(packet: Aql) -> [u8; 64] {
    // SAFETY: `Aql` is 64 bytes of plain data.
    unsafe { std::mem::transmute::<Aql, [u8; 64]>(packet) }
}

/// Runs of [`counted_add`] per tag.
static RUNS: [AtomicU32; 16] = [const { AtomicU32::new(0) }; 16];

/// [`add`], counting its runs per tag (in `add`'s place in the arguments).
fn counted_add(group: &WorkGroup) {
    // SAFETY: every dispatch of this kernel carries an `AddArgs` block.
    let args: AddArgs = unsafe { group.kernargs() };
    if group.group_id() == [0, 0, 0] {
        RUNS[args.add as usize].fetch_add(1, Ordering::SeqCst);
    }
    for [i, _, _] in group.work_items() {
        if i < args.len {
            // SAFETY: the buffer holds `len` u32s; each work-item owns index `i`.
            unsafe { *(args.buf as *mut u32).add(i as usize) += 1 };
        }
    }
}

scenarios! {
    /// A tool reserves a slot of the queue being replayed with each compare-and-swap and each
    /// store entry of the write index (instead of adding to it) from PASS ENTER, dispatches
    /// there and waits for it: as with a slot reserved by adding, the dispatch is re-entrant
    /// work and runs once, inside the callback, instead of waiting behind the replay that
    /// waits for it (and being replayed after it).
    fn a_tool_dispatch_reserved_by_compare_and_swap_or_store_runs_inside_the_callback() {
        let hooks = TestHooks::new(0);
        let app = app::install(
            hooks.clone(),
            InstallOptions { drain: DrainConfig::new(WAIT), ..Default::default() },
        );
        hooks.configure_replay(true);
        let gpu = app.gpus[0];
        let pools = app.pools(gpu);
        let kernel = kreplay_softhsa::register_kernel("lifecycle_counted_add", counted_add);
        let q = app.queue(gpu);
        let mut failures = Vec::new();
        for (tag, (name, reserve)) in reservations(&app).into_iter().enumerate() {
            let tag = tag as u32 * 2;
            let buf = app.buffer(pools.coarse, &[7; WORDS]);
            let inner_buf = app.buffer(pools.fine, &[40; WORDS]);
            let (done, inner_done) = (app.signal(1), app.signal(1));
            let outer_args = kernel_args(&app, gpu, buf, WORDS as u32, tag);
            let inner_args = kernel_args(&app, gpu, inner_buf, WORDS as u32, tag + 1);
            let outer = Aql::dispatch(kernel, WORDS as u32, 64, outer_args, done);
            let inner = Aql::dispatch(kernel, WORDS as u32, 32, inner_args, inner_done);
            let inner_wait = std::sync::Arc::new(parking_lot::Mutex::new(None));
            let w = inner_wait.clone();
            hooks.set_script(Script::passes(3).on_pass_enter(move |_, info, pass, _| {
                if info.workgroup_size[0] == 64 && pass == 0 {
                    dispatch_reserving(&app, q, reserve, inner);
                    *w.lock() = Some(app.wait_zero_within(inner_done, Duration::from_secs(2)));
                }
            }));
            let finished = bounded(WAIT * 3, vec![Box::new(move || {
                app.dispatch(q, outer);
                app.wait_zero(done)
            })]);
            assert_eq!(finished, vec![0], "{name}: the replayed dispatch completed");
            assert_eq!(app.wait_zero(inner_done), 0, "{name}: the tool's dispatch completed");
            let seen = (
                *inner_wait.lock(),
                RUNS[tag as usize].load(Ordering::SeqCst),
                RUNS[tag as usize + 1].load(Ordering::SeqCst),
                app.read(inner_buf, WORDS)[0],
            );
            if seen != (Some(0), 3, 1, 41) {
                failures.push(format!(
                    "{name}: (the wait inside the callback, passes, the tool's runs, its word) \
                     = {seen:?}"
                ));
            }
        }
        assert!(failures.is_empty(), "{failures:#?}");
    }
}

/// The queue whose read index the drain loads ([`load_read_index_destroying`]), as an address.
static MARKED_QUEUE: AtomicU64 = AtomicU64::new(0);
/// Set while the next load of [`MARKED_QUEUE`]'s read index must wait for a destroy.
static DESTROY_ARMED: AtomicBool = AtomicBool::new(false);
/// Asks the destroying thread to destroy its queue.
static DESTROY_ASKED: AtomicBool = AtomicBool::new(false);
/// Set by the destroying thread once its destroy returned.
static DESTROY_DONE: AtomicBool = AtomicBool::new(false);

/// softhsa's `hsa_queue_load_read_index_scacquire`; while armed, for [`MARKED_QUEUE`] (which
/// only a drain asking it for a marker loads), another thread first destroys its queue: a
/// queue is destroyed after the drain listed its agent's queues, before it looks at them.
unsafe extern "C" fn load_read_index_destroying(queue: *const hsa_queue_t) -> u64 {
    if queue as u64 == MARKED_QUEUE.load(Ordering::SeqCst)
        && DESTROY_ARMED.swap(false, Ordering::SeqCst)
    {
        DESTROY_ASKED.store(true, Ordering::SeqCst);
        assert!(
            wait_flag(&DESTROY_DONE),
            "the other thread destroyed its queue"
        );
    }
    let load = softhsa_core()
        .hsa_queue_load_read_index_scacquire_fn
        .expect("load read index");
    // SAFETY: the caller's queue, forwarded unchanged.
    unsafe { load(queue) }
}

scenarios! {
    /// A thread destroys its queue V (one slot reserved, not written) while another thread's
    /// dispatch on the same agent
    /// is being replayed, in the middle of the replay's drain, which waits for a third queue
    /// parked at a barrier and, while it waits, looks at the packets of every queue of the
    /// agent it listed. V's ring went away with V (softhsa revokes it, as a real queue's ring
    /// is freed): looking at it would fault. The destroy returns, the drain gives up at its
    /// deadline, the dispatch runs once, and the process lives on.
    fn a_queue_destroyed_during_another_threads_drain_is_not_read_after_its_destroy() {
        let table = table_with(|core| {
            core.hsa_queue_load_read_index_scacquire_fn = Some(load_read_index_destroying);
        });
        let hooks = TestHooks::new(0);
        let app = app::install_into(
            table,
            hooks.clone(),
            InstallOptions { drain: DrainConfig::new(DRAIN), ..Default::default() },
        );
        hooks.configure_replay(true);
        hooks.set_script(Script::passes(2));
        let gpu = app.gpus[0];
        let pools = app.pools(gpu);
        let victim = app.queue(gpu);
        // A queue parked at a barrier waiting for a signal only the host sets, after the replay.
        let parked = app.queue(gpu);
        let gate = app.signal(1);
        let parked_done = app.signal(1);
        app.submit(parked, &[Aql::barrier_and(&[gate], parked_done)]);
        MARKED_QUEUE.store(parked.0 as u64, Ordering::SeqCst);
        // V's thread reserved a slot and destroys V before writing it.
        let reserve = app.core().hsa_queue_add_write_index_scacq_screl_fn.expect("add write index");
        // SAFETY: a live queue of this application.
        assert_eq!(unsafe { reserve(victim.0, 1) }, 0, "slot 0 of V is reserved");

        let destroyer = std::thread::spawn(move || {
            let victim = victim; // the whole handle, which is Send
            if !wait_flag(&DESTROY_ASKED) {
                return None;
            }
            let destroy = app.core().hsa_queue_destroy_fn.expect("queue destroy");
            // SAFETY: a live queue of this application, used by no other thread.
            let status = unsafe { destroy(victim.0) };
            DESTROY_DONE.store(true, Ordering::SeqCst);
            Some(status)
        });

        let buf = app.buffer(pools.coarse, &[5; WORDS]);
        let kernel = kreplay_softhsa::register_kernel("lifecycle_add", add);
        let args = kernel_args(&app, gpu, buf, WORDS as u32, 1);
        let q = app.queue(gpu);
        let done = app.signal(1);
        DESTROY_ARMED.store(true, Ordering::SeqCst);
        let waited = bounded(WAIT * 3, vec![Box::new(move || {
            app.dispatch(q, Aql::dispatch(kernel, WORDS as u32, 64, args, done));
            app.wait_zero(done)
        })]);
        assert_eq!(waited, vec![0], "the dispatch completed");
        assert!(!DESTROY_ARMED.load(Ordering::SeqCst), "the drain asked the parked queue for a marker");
        assert_eq!(
            destroyer.join().expect("the destroying thread ends"),
            Some(HSA_STATUS_SUCCESS),
            "the queue was destroyed during the drain"
        );
        assert_eq!(app.read(buf, WORDS), vec![6; WORDS], "the dispatch ran once");
        app.store(gate, 0);
        assert_eq!(app.wait_zero(parked_done), 0, "the parked queue went on");
    }
}

/// Runs of [`enqueue`].
static ENQUEUES: AtomicU32 = AtomicU32::new(0);

/// Enqueues one packet (its header only) into the soft queue its argument names and rings the
/// queue's doorbell, as a kernel enqueueing work for the host does.
fn enqueue(group: &WorkGroup) {
    // SAFETY: every dispatch of this kernel carries the soft queue's address.
    let queue: u64 = unsafe { group.kernargs() };
    ENQUEUES.fetch_add(1, Ordering::SeqCst);
    let q = queue as *mut hsa_queue_t;
    let core = softhsa_core();
    let add = core
        .hsa_queue_add_write_index_screlease_fn
        .expect("add write index");
    let store = core.hsa_signal_store_screlease_fn.expect("signal store");
    // SAFETY: the argument is a live soft queue; its ring holds `size` packets.
    unsafe {
        let slot = add(q, 1);
        let at = (slot % u64::from((*q).size)) as usize * AQL_PACKET_SIZE;
        (*q).base_address
            .cast::<u8>()
            .add(at)
            .cast::<u16>()
            .write(HSA_PACKET_TYPE_AGENT_DISPATCH as u16);
        store((*q).doorbell_signal, slot as i64);
    }
}

scenarios! {
    /// The runtime refuses the destroy of a soft queue, which the application goes on using:
    /// a kernel given it enqueues into it. That kernel must still run once (declined: the
    /// queue's write index and doorbell are no memory a snapshot holds), not once per pass.
    fn a_kernel_enqueueing_into_a_soft_queue_whose_destroy_was_refused_runs_once() {
        let table = table_with(|core| core.hsa_queue_destroy_fn = Some(queue_destroy_refusing));
        let hooks = TestHooks::new(0);
        let app = app::install_into(
            table,
            hooks.clone(),
            InstallOptions { drain: DrainConfig::new(WAIT), ..Default::default() },
        );
        hooks.configure_replay(true);
        hooks.set_script(Script::passes(3));
        let create = app.core().hsa_soft_queue_create_fn.expect("soft queue create");
        let doorbell = app.signal(-1);
        // softhsa's regions are its pools.
        let region = hsa_region_t { handle: app.host_pool().handle };
        let mut soft: *mut hsa_queue_t = std::ptr::null_mut();
        // SAFETY: a valid region and doorbell signal; `soft` is a valid out pointer.
        let status = unsafe { create(region, 64, HSA_QUEUE_TYPE_MULTI, 0, doorbell, &mut soft) };
        assert_eq!(status, HSA_STATUS_SUCCESS);
        REFUSE_DESTROY.store(true, Ordering::SeqCst);
        let destroy = app.core().hsa_queue_destroy_fn.expect("queue destroy");
        // SAFETY: a live queue of this application.
        assert_ne!(unsafe { destroy(soft) }, HSA_STATUS_SUCCESS, "the runtime refused the destroy");

        let gpu = app.gpus[0];
        let pools = app.pools(gpu);
        let kernel = kreplay_softhsa::register_kernel("lifecycle_enqueue", enqueue);
        let args = app.kernargs(&pools, soft as u64);
        let q = app.queue(gpu);
        let done = app.signal(1);
        app.dispatch(q, Aql::dispatch(kernel, 1, 1, args, done));
        assert_eq!(app.wait_zero(done), 0);
        let load_write = app.core().hsa_queue_load_write_index_scacquire_fn.expect("load write index");
        // SAFETY: the soft queue is live (its destroy was refused).
        let write_index = unsafe { load_write(soft) };
        assert_eq!(
            (write_index, ENQUEUES.load(Ordering::SeqCst)),
            (1, 1),
            "one packet enqueued by one run"
        );
        // SAFETY: as above; this destroy goes through.
        assert_eq!(unsafe { destroy(soft) }, HSA_STATUS_SUCCESS);
    }
}

/// Queue errors the application's callback heard of.
static QUEUE_ERRORS: AtomicU32 = AtomicU32::new(0);

unsafe extern "C" fn count_queue_error(
    _: hsa_status_t,
    _: *mut hsa_queue_t,
    _: *mut std::ffi::c_void,
) {
    QUEUE_ERRORS.fetch_add(1, Ordering::SeqCst);
}

/// A kernel that faults (softhsa puts its queue into the error state, as a memory fault does).
fn fault(_: &WorkGroup) {
    panic!("simulated GPU memory fault");
}

scenarios! {
    /// A queue of the agent failed (a kernel's memory fault: it runs nothing more), and the
    /// application goes on replaying dispatches on another queue of the agent. A failed queue
    /// is idle to every drain; asking it for a drain marker writes into a ring nobody empties
    /// any more, and once that is full every replay of the agent waits out the drain's
    /// deadline for a slot. The failed queue's ring is left as the application left it, and no
    /// replay waits for it.
    fn a_failed_queue_is_not_asked_for_drain_markers_by_later_replays_of_its_agent() {
        let drain = Duration::from_secs(3);
        let hooks = TestHooks::new(0);
        let app = app::install(
            hooks.clone(),
            InstallOptions { drain: DrainConfig::new(drain), ..Default::default() },
        );
        hooks.configure_replay(true);
        hooks.set_script(Script::new(|_, info| {
            if info.workgroup_size[0] == 64 { ToolAnswer::passes(2) } else { ToolAnswer::OPT_OUT }
        }));
        let gpu = app.gpus[0];
        let pools = app.pools(gpu);
        // The smallest queue the agent makes: its rings fill after a few packets.
        let mut failing: *mut hsa_queue_t = std::ptr::null_mut();
        let create = app.core().hsa_queue_create_fn.expect("queue create");
        // SAFETY: valid agent, out pointer and callback.
        let status = unsafe {
            create(gpu, 4, HSA_QUEUE_TYPE_MULTI, Some(count_queue_error), std::ptr::null_mut(), 0, 0, &raw mut failing)
        };
        assert_eq!(status, HSA_STATUS_SUCCESS);
        let failing = Queue(failing);
        let faulting = kreplay_softhsa::register_kernel("lifecycle_fault", fault);
        let args = kernel_args(&app, gpu, Ptr(0), 0, 0);
        app.dispatch(failing, Aql::dispatch(faulting, 1, 1, args, app.signal(1)));
        let deadline = Instant::now() + WAIT;
        while QUEUE_ERRORS.load(Ordering::SeqCst) == 0 && Instant::now() < deadline {
            std::thread::yield_now();
        }
        assert_eq!(QUEUE_ERRORS.load(Ordering::SeqCst), 1, "the queue failed");
        let load_write = app.core().hsa_queue_load_write_index_scacquire_fn.expect("load write index");
        // SAFETY: a live queue of this application.
        let written = unsafe { load_write(failing.0) };

        let q = app.queue(gpu);
        let kernel = kreplay_softhsa::register_kernel("lifecycle_add", add);
        let buf = app.buffer(pools.coarse, &[0; WORDS]);
        let args = kernel_args(&app, gpu, buf, WORDS as u32, 1);
        let mut slowest = Duration::ZERO;
        for _ in 0..12 {
            let done = app.signal(1);
            let started = Instant::now();
            let waited = bounded(drain * 3, vec![Box::new(move || {
                app.dispatch(q, Aql::dispatch(kernel, WORDS as u32, 64, args, done));
                app.wait_zero(done)
            })]);
            assert_eq!(waited, vec![0], "the dispatch completed");
            slowest = slowest.max(started.elapsed());
        }
        assert_eq!(app.read(buf, WORDS), vec![12; WORDS], "each dispatch ran once");
        // SAFETY: as above.
        let written_after = unsafe { load_write(failing.0) };
        assert_eq!(
            (written_after - written, slowest < drain),
            (0, true),
            "(packets written into the failed queue, no replay waited out the drain's deadline: \
             slowest {slowest:?})"
        );
    }
}

/// The application's table, for [`destroy_on_error`].
static APP_CORE: AtomicU64 = AtomicU64::new(0);
/// The status of the destroy [`destroy_on_error`] made (u32::MAX: none yet).
static DESTROYED_ON_ERROR: AtomicU32 = AtomicU32::new(u32::MAX);

/// An application's queue error callback that destroys the queue that failed.
unsafe extern "C" fn destroy_on_error(
    _: hsa_status_t,
    source: *mut hsa_queue_t,
    _: *mut std::ffi::c_void,
) {
    // SAFETY: set to the application's core table (valid for the process) before the queue
    // was created.
    let core = unsafe { &*(APP_CORE.load(Ordering::SeqCst) as *const CoreApiTable) };
    let destroy = core.hsa_queue_destroy_fn.expect("queue destroy");
    // SAFETY: the queue that failed, which the application created and destroys once.
    let status = unsafe { destroy(source) };
    DESTROYED_ON_ERROR.store(status, Ordering::SeqCst);
}

scenarios! {
    /// A kernel being replayed faults on its first pass, and the application's queue error
    /// callback destroys the queue (from the runtime's thread), as applications that give up
    /// on a failed queue do. The replay ends (the tool hears that the pass failed), the destroy
    /// returns, the doorbell store returns, and another queue of the agent still replays.
    fn a_queue_destroyed_by_its_error_callback_during_a_replay_neither_hangs_nor_faults() {
        let hooks = TestHooks::new(0);
        let app = app::install(
            hooks.clone(),
            InstallOptions { drain: DrainConfig::new(DRAIN), ..Default::default() },
        );
        hooks.configure_replay(true);
        hooks.set_script(Script::passes(3));
        APP_CORE.store(std::ptr::from_ref(app.core()) as u64, Ordering::SeqCst);
        let gpu = app.gpus[0];
        let pools = app.pools(gpu);
        let mut failing: *mut hsa_queue_t = std::ptr::null_mut();
        let create = app.core().hsa_queue_create_fn.expect("queue create");
        // SAFETY: valid agent, out pointer and callback.
        let status = unsafe {
            create(gpu, 64, HSA_QUEUE_TYPE_MULTI, Some(destroy_on_error), std::ptr::null_mut(), 0, 0, &raw mut failing)
        };
        assert_eq!(status, HSA_STATUS_SUCCESS);
        let failing = Queue(failing);
        let faulting = kreplay_softhsa::register_kernel("lifecycle_fault", fault);
        let args = kernel_args(&app, gpu, Ptr(0), 0, 0);
        let fault_done = app.signal(1);
        let returned = bounded(WAIT * 3, vec![Box::new(move || {
            app.dispatch(failing, Aql::dispatch(faulting, 1, 1, args, fault_done));
        })]);
        assert_eq!(returned.len(), 1, "the doorbell store returned");
        let deadline = Instant::now() + WAIT;
        while DESTROYED_ON_ERROR.load(Ordering::SeqCst) == u32::MAX && Instant::now() < deadline {
            std::thread::yield_now();
        }
        assert_eq!(DESTROYED_ON_ERROR.load(Ordering::SeqCst), HSA_STATUS_SUCCESS, "the callback destroyed the queue");
        let first = hooks.configured_dispatches()[0].dispatch_id;
        assert!(hooks.finished_record(first).outcome.is_failure(), "the tool heard that the replay failed");

        let q = app.queue(gpu);
        let kernel = kreplay_softhsa::register_kernel("lifecycle_add", add);
        let buf = app.buffer(pools.coarse, &[0; WORDS]);
        let args = kernel_args(&app, gpu, buf, WORDS as u32, 1);
        let done = app.signal(1);
        let waited = bounded(WAIT * 3, vec![Box::new(move || {
            app.dispatch(q, Aql::dispatch(kernel, WORDS as u32, 64, args, done));
            app.wait_zero(done)
        })]);
        assert_eq!(waited, vec![0]);
        assert_eq!(app.read(buf, WORDS), vec![1; WORDS], "replayed, one run's result");
    }
}

/// Set when the dispatch on the queue the tool destroys reached CONFIG ENTER.
static OTHER_CONFIGURED: AtomicBool = AtomicBool::new(false);
/// The status of the tool's destroy (u32::MAX: none yet).
static TOOL_DESTROYED: AtomicU32 = AtomicU32::new(u32::MAX);
/// The thread that dispatches onto the queue the tool destroys.
static OTHER_THREAD: parking_lot::Mutex<Option<std::thread::JoinHandle<()>>> =
    parking_lot::Mutex::new(None);

scenarios! {
    /// A tool destroys queue Q2 (say, a queue it made for its own work) from a callback of a
    /// replay on queue Q1, while another thread's dispatch on Q2 is in its handler call (past
    /// CONFIG ENTER, waiting for Q1's replay, which holds the agent). kreplay cannot wait for
    /// that call (it waits for this very replay), so the destroy goes through; the other
    /// thread's handler call must still end without touching freed state and without running
    /// passes on a queue that is gone: its replay ends (the tool hears it failed) and its
    /// doorbell store returns.
    fn a_queue_a_tool_destroys_while_another_thread_is_in_its_handler_neither_hangs_nor_faults() {
        let hooks = TestHooks::new(0);
        let app = app::install(
            hooks.clone(),
            InstallOptions { drain: DrainConfig::new(DRAIN), ..Default::default() },
        );
        hooks.configure_replay(true);
        let gpu = app.gpus[0];
        let pools = app.pools(gpu);
        let q1 = app.queue(gpu);
        let q2 = app.queue(gpu);
        let kernel = kreplay_softhsa::register_kernel("lifecycle_add", add);
        let buf = app.buffer(pools.coarse, &[0; WORDS]);
        let other = app.buffer(pools.coarse, &[0; WORDS]);
        let args = kernel_args(&app, gpu, buf, WORDS as u32, 1);
        let other_args = kernel_args(&app, gpu, other, WORDS as u32, 1);
        let (done, other_done) = (app.signal(1), app.signal(1));
        hooks.set_script(
            Script::new(|_, info| {
                if info.workgroup_size[0] == 32 {
                    OTHER_CONFIGURED.store(true, Ordering::SeqCst);
                }
                ToolAnswer::passes(2)
            })
            .on_pass_exit(move |_, info, pass, _| {
                if info.workgroup_size[0] == 64 && pass == 0 {
                    let q2 = q2; // the whole handle, which is Send
                    *OTHER_THREAD.lock() = Some(std::thread::spawn(move || {
                        let q2 = q2; // the whole handle, which is Send
                        app.dispatch(q2, Aql::dispatch(kernel, WORDS as u32, 32, other_args, other_done));
                    }));
                    assert!(wait_flag(&OTHER_CONFIGURED), "the other dispatch is configured");
                    let destroy = app.core().hsa_queue_destroy_fn.expect("queue destroy");
                    // SAFETY: a live queue of this application, destroyed once.
                    TOOL_DESTROYED.store(unsafe { destroy(q2.0) }, Ordering::SeqCst);
                }
                ContinueChange::Keep
            }),
        );
        let finished = bounded(WAIT * 3, vec![Box::new(move || {
            app.dispatch(q1, Aql::dispatch(kernel, WORDS as u32, 64, args, done));
            app.wait_zero(done)
        })]);
        assert_eq!(finished, vec![0], "the replay on Q1 completed");
        let other_thread = OTHER_THREAD.lock().take().expect("the other thread started");
        let joined = bounded(WAIT * 3, vec![Box::new(move || other_thread.join().is_ok())]);
        assert_eq!(joined, vec![true], "the other thread's doorbell store returned");
        assert_eq!(TOOL_DESTROYED.load(Ordering::SeqCst), HSA_STATUS_SUCCESS, "the tool destroyed Q2");
        assert_eq!(app.read(buf, WORDS), vec![1; WORDS], "Q1's dispatch ran as one run");
        let infos = hooks.configured_dispatches();
        let other_id = infos.iter().find(|i| i.workgroup_size[0] == 32).expect("Q2's dispatch").dispatch_id;
        let outcome = hooks.finished_record(other_id).outcome;
        assert!(outcome.is_failure(), "Q2's dispatch did not run: {outcome:?}");
    }
}
