//! C tools: the order and thread of a dispatch's KERNEL_DISPATCH records (docs/abi.md §2,
//! "Callback flow" and what follows it; kreplay.h, "Threads") under contention: tools slow in
//! their callbacks, an ENQUEUE EXIT that outlasts its kernel, several packets in one doorbell
//! write, a queue that fills up, threads sharing queues, counting beside tracing, and a COMPLETE
//! callback that submits a dispatch it asks to replay. Each scenario runs in a child process
//! with a deadline; the tool (`enqueue_gate.c`) checks every dispatch's records.

mod common;
#[path = "c_probe_tools/harness.rs"]
mod harness;

use std::collections::HashMap;
use std::path::Path;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use harness::*;
use hsa_sys::{hsa_queue_t, hsa_signal_t};
use kreplay_softhsa::testing::{Dispatch, Hsa, PoolKind, barrier_and_packet, dispatch_packet};
use kreplay_softhsa::{OwnedApiTable, register_kernel};

const DEADLINE: Duration = Duration::from_secs(120);

/// The application's completion signals by the grid size that names their dispatch (each
/// dispatch of the child has a grid of its own: `ELEMENTS` plus a multiple of 64).
static SIGNALS: Mutex<Option<HashMap<u32, hsa_signal_t>>> = Mutex::new(None);
static NEXT_TAG: AtomicU32 = AtomicU32::new(1);

/// The tool's `app_wait(grid, timeout_ms)`: 0 once the application's signal of the dispatch
/// with that grid size is 0, 1 when it is not within the time, 2 for an unknown dispatch.
extern "C" fn app_wait(grid: u32, timeout_ms: u32) -> i32 {
    let Some(signal) = SIGNALS
        .lock()
        .unwrap()
        .as_ref()
        .and_then(|m| m.get(&grid).copied())
    else {
        return 2;
    };
    let Some(gpu) = TOOL_GPU.get() else { return 2 };
    if gpu
        .hsa
        .wait_zero(signal, Duration::from_millis(u64::from(timeout_ms)))
    {
        0
    } else {
        1
    }
}

/// One packet of an application's doorbell write.
#[derive(Clone, Copy)]
enum Item {
    /// `x += 1` over buffer `b`.
    Add(usize),
    /// A barrier-AND packet (barrier bit set) waiting for the completion of the write's item `i`
    /// (an `Add`).
    After(usize),
}

struct Child<'a> {
    hsa: &'a Hsa,
    kernel: u64,
    kernarg_pool: hsa_sys::hsa_amd_memory_pool_t,
    buffers: Vec<(*mut u32, Vec<u32>)>,
    runs: Vec<AtomicU32>,
}

// SAFETY: the buffers are device addresses valid for the child's life; HSA calls are thread
// safe; each buffer is written by one dispatch at a time (each thread has its own).
unsafe impl Sync for Child<'_> {}

impl Child<'_> {
    fn packet(&self, item: Item, signals: &[hsa_signal_t]) -> ([u8; 64], Option<hsa_signal_t>) {
        match item {
            Item::Add(b) => {
                let args = self
                    .hsa
                    .allocate(self.kernarg_pool, std::mem::size_of::<AddOneArgs>())
                    .expect("kernargs")
                    .cast::<AddOneArgs>();
                // SAFETY: the kernarg allocation holds one AddOneArgs.
                unsafe {
                    args.write(AddOneArgs {
                        data: self.buffers[b].0,
                        len: ELEMENTS as u32,
                    })
                };
                let done = self.hsa.signal_create(1).expect("signal");
                let grid = ELEMENTS as u32 + 64 * NEXT_TAG.fetch_add(1, Ordering::Relaxed);
                SIGNALS
                    .lock()
                    .unwrap()
                    .get_or_insert_with(HashMap::new)
                    .insert(grid, done);
                let mut d = Dispatch::linear(self.kernel, grid, 64, args.cast(), done);
                d.barrier = false;
                self.runs[b].fetch_add(1, Ordering::Relaxed);
                // SAFETY: both are 64-byte plain-data packets.
                let bytes = unsafe {
                    std::mem::transmute::<hsa_sys::hsa_kernel_dispatch_packet_t, [u8; 64]>(
                        dispatch_packet(&d),
                    )
                };
                (bytes, Some(done))
            }
            Item::After(i) => {
                let packet = barrier_and_packet(&[signals[i]], hsa_signal_t { handle: 0 }, true);
                (
                    // SAFETY: both are 64-byte plain-data packets.
                    unsafe {
                        std::mem::transmute::<hsa_sys::hsa_barrier_and_packet_t, [u8; 64]>(packet)
                    },
                    None,
                )
            }
        }
    }

    /// Writes `items` into `queue` with one doorbell store (waiting for room first); returns the
    /// completion signals of its dispatches.
    fn write(&self, queue: *mut hsa_queue_t, items: &[Item]) -> Vec<hsa_signal_t> {
        let mut signals = Vec::new();
        let mut bytes = Vec::new();
        for &item in items {
            let (packet, signal) = self.packet(item, &signals);
            bytes.push(packet);
            // An `After` names an earlier item by its index among the write's items.
            signals.push(signal.unwrap_or(hsa_signal_t { handle: 0 }));
        }
        let core = self.hsa.core();
        let add = core.hsa_queue_add_write_index_scacq_screl_fn.unwrap();
        let load_read = core.hsa_queue_load_read_index_scacquire_fn.unwrap();
        let store = core.hsa_signal_store_screlease_fn.unwrap();
        let n = bytes.len() as u64;
        // SAFETY: `queue` is live; producers only read these fields.
        let (base, size, doorbell) = unsafe {
            (
                (*queue).base_address.cast::<u8>(),
                u64::from((*queue).size),
                (*queue).doorbell_signal,
            )
        };
        assert!(n <= size, "a write fits the ring");
        // SAFETY: table entries with the HSA signatures, on a live queue.
        let first = unsafe { add(queue, n) };
        // SAFETY: as above.
        while first + n > unsafe { load_read(queue) } + size {
            std::thread::yield_now();
        }
        for (k, packet) in bytes.iter().enumerate() {
            let slot = ((first + k as u64) % size) as usize * 64;
            // SAFETY: the slots are ours (reserved, and free once the read index passed them);
            // each body is copied first, then its header published with a release store.
            unsafe {
                std::ptr::copy_nonoverlapping(packet.as_ptr().add(2), base.add(slot + 2), 62);
                let header = u16::from_ne_bytes([packet[0], packet[1]]);
                (*base.add(slot).cast::<std::sync::atomic::AtomicU16>())
                    .store(header, Ordering::Release);
            }
        }
        // SAFETY: the doorbell of a live queue.
        unsafe { store(doorbell, (first + n - 1) as i64) };
        signals.into_iter().filter(|s| s.handle != 0).collect()
    }

    fn wait_all(&self, signals: &[hsa_signal_t], problems: &mut Vec<String>) {
        for &s in signals {
            if !self.hsa.wait_zero(s, Duration::from_secs(20)) {
                problems.push(format!(
                    "an application completion signal is {} after 20 s",
                    self.hsa.signal_load(s)
                ));
            }
        }
    }

    fn check(&self) -> Vec<String> {
        let mut problems = Vec::new();
        for (b, (ptr, init)) in self.buffers.iter().enumerate() {
            let runs = self.runs[b].load(Ordering::Relaxed);
            // SAFETY: every dispatch completed.
            let now = unsafe { std::slice::from_raw_parts(*ptr, ELEMENTS) };
            if let Some(i) = now.iter().zip(init).position(|(n, i)| *n != i + runs) {
                problems.push(format!(
                    "buffer {b} element {i} is {} (initial {}, {runs} run(s))",
                    now[i], init[i]
                ));
            }
        }
        problems
    }
}

/// What the application does.
#[derive(Clone, Copy)]
enum Shape {
    /// One thread, one dispatch per write, each waited for: `rounds` rounds over `buffers`.
    Single { buffers: usize, rounds: u32 },
    /// One thread; each round one write of a dispatch, a barrier waiting for it, and two more
    /// dispatches.
    Batch { rounds: u32 },
    /// One thread on a queue of 4 slots (single-producer where `single`, on which kreplay adds
    /// its drain markers to the application's writes): `dispatches` single writes over 2
    /// buffers, none waited for before the last is written.
    SmallQueue { dispatches: u32, single: bool },
    /// `threads` threads on 2 shared queues, each over a buffer of its own, `rounds` dispatches
    /// each, each waited for.
    Threads { threads: usize, rounds: u32 },
}

fn order_child(shape: Shape) {
    let mut table = OwnedApiTable::softhsa();
    let loaded = load_kreplay(&mut table);
    let mut problems = Vec::new();
    if !loaded.loaded {
        problems.push("OnLoad returned false".to_string());
    }
    let tools: Vec<String> = std::env::var("KREPLAY_TOOL_LIBRARIES")
        .unwrap_or_default()
        .split(':')
        .filter(|p| !p.is_empty())
        .map(str::to_string)
        .collect();
    {
        // SAFETY: the table stays alive and valid while `hsa` is used.
        let hsa = unsafe { Hsa::from_table(table.table()) };
        let session = hsa.init().expect("hsa_init");
        give_tool_gpu(&table, Path::new(&tools[0]));
        // SAFETY: the tool is loaded by kreplay; `probe_set_app_wait` takes this function.
        let lib = unsafe { libloading::Library::new(&tools[0]) }.expect("tool library");
        // SAFETY: as above.
        if let Ok(set) = unsafe {
            lib.get::<unsafe extern "C" fn(extern "C" fn(u32, u32) -> i32)>(b"probe_set_app_wait\0")
        } {
            // SAFETY: as above.
            unsafe { set(app_wait) };
        }
        let agent = hsa.gpu_agents().expect("agents")[0];
        let pool = hsa.coarse_pool(agent).expect("coarse pool");
        let buffers_needed = match shape {
            Shape::Single { buffers, .. } => buffers,
            Shape::Batch { .. } => 3,
            Shape::SmallQueue { .. } => 2,
            Shape::Threads { threads, .. } => threads,
        };
        let buffers = (0..buffers_needed)
            .map(|b| {
                let ptr = hsa
                    .allocate(pool, ELEMENTS * 4)
                    .expect("buffer")
                    .cast::<u32>();
                let init: Vec<u32> = (0..ELEMENTS as u32).map(|i| i * 7 + b as u32).collect();
                // SAFETY: softhsa device memory is host memory; ELEMENTS u32.
                unsafe { std::ptr::copy_nonoverlapping(init.as_ptr(), ptr, ELEMENTS) };
                (ptr, init)
            })
            .collect::<Vec<_>>();
        let child = Child {
            hsa: &hsa,
            kernel: register_kernel("probe_c_add_one", add_one),
            kernarg_pool: hsa.pool(agent, PoolKind::Kernarg).expect("kernarg pool"),
            runs: (0..buffers.len()).map(|_| AtomicU32::new(0)).collect(),
            buffers,
        };
        match shape {
            Shape::Single { buffers, rounds } => {
                let queue = hsa.queue_create(agent, 64).expect("queue");
                for _ in 0..rounds {
                    for b in 0..buffers {
                        let s = child.write(queue, &[Item::Add(b)]);
                        child.wait_all(&s, &mut problems);
                    }
                }
            }
            Shape::Batch { rounds } => {
                let queue = hsa.queue_create(agent, 64).expect("queue");
                for _ in 0..rounds {
                    let s = child.write(
                        queue,
                        &[Item::Add(0), Item::After(0), Item::Add(1), Item::Add(2)],
                    );
                    child.wait_all(&s, &mut problems);
                }
            }
            Shape::SmallQueue { dispatches, single } => {
                let queue = if single {
                    let mut queue: *mut hsa_queue_t = std::ptr::null_mut();
                    // SAFETY: the table's hsa_queue_create with valid arguments.
                    let status = unsafe {
                        hsa.core().hsa_queue_create_fn.unwrap()(
                            agent,
                            4,
                            hsa_sys::HSA_QUEUE_TYPE_SINGLE,
                            None,
                            std::ptr::null_mut(),
                            u32::MAX,
                            u32::MAX,
                            &mut queue,
                        )
                    };
                    assert_eq!(status, hsa_sys::HSA_STATUS_SUCCESS, "single-producer queue");
                    queue
                } else {
                    hsa.queue_create(agent, 4).expect("queue")
                };
                let mut all = Vec::new();
                for k in 0..dispatches {
                    all.extend(child.write(queue, &[Item::Add(k as usize % 2)]));
                }
                child.wait_all(&all, &mut problems);
            }
            Shape::Threads { threads, rounds } => {
                let queues: Vec<usize> = (0..2)
                    .map(|_| hsa.queue_create(agent, 64).expect("queue") as usize)
                    .collect();
                let child = &child;
                let found: Vec<Vec<String>> = std::thread::scope(|s| {
                    let handles: Vec<_> = (0..threads)
                        .map(|t| {
                            let queue = queues[t % 2] as *mut hsa_queue_t as usize;
                            s.spawn(move || {
                                let mut problems = Vec::new();
                                for _ in 0..rounds {
                                    let sig =
                                        child.write(queue as *mut hsa_queue_t, &[Item::Add(t)]);
                                    child.wait_all(&sig, &mut problems);
                                }
                                problems
                            })
                        })
                        .collect();
                    handles.into_iter().map(|h| h.join().unwrap()).collect()
                });
                problems.extend(found.into_iter().flatten());
            }
        }
        problems.extend(child.check());
        std::mem::forget(session);
    }
    // SAFETY: the runtime's shutdown call.
    unsafe { (loaded.on_unload)() };
    for tool in &tools {
        let r = tool_report(Path::new(tool));
        if !r.is_empty() {
            problems.push(format!(
                "tool {}: {r}",
                Path::new(tool).file_name().unwrap().to_string_lossy()
            ));
        }
    }
    for p in &problems {
        println!("TOOL-PROBLEM: {p}");
    }
    println!("PROBE-DONE");
}

fn scenario(name: &str, env: &[(&str, &str)]) {
    let (problems, run) = run_scenario(name, &["enqueue_gate.c"], env, DEADLINE);
    assert!(
        problems.is_empty(),
        "problems: {problems:#?}\n{}",
        run.report()
    );
}

/// A COMPLETE callback of a dispatch run once that submits a dispatch of its own and asks 3
/// passes for it: the dispatch is replayed whether the kernel it completes finished before its
/// ENQUEUE EXIT returned (forced here: ENQUEUE EXIT waits until the application's signal is 0)
/// or after; it was declined `reentrant_dispatch`, or waited for a drain that could not end,
/// when the kernel had finished early.
#[test]
fn a_complete_callback_of_a_kernel_that_finished_during_enqueue_exit_can_have_its_work_replayed() {
    let name = "a_complete_callback_of_a_kernel_that_finished_during_enqueue_exit_can_have_its_work_replayed";
    if in_child(name) {
        return order_child(Shape::Single {
            buffers: 1,
            rounds: 3,
        });
    }
    scenario(
        name,
        &[
            ("PROBE_REPLAY", "opt"),
            ("PROBE_EXIT_WAIT", "signal"),
            ("PROBE_SUBMIT", "1"),
        ],
    );
}

/// An ENQUEUE EXIT that waits for the application's completion signal returns (the signal is
/// not held back), and COMPLETE comes after it, on a thread of kreplay's own (kreplay.h).
#[test]
fn an_enqueue_exit_waiting_for_the_applications_signal_sees_complete_after_it_on_kreplays_thread() {
    let name = "an_enqueue_exit_waiting_for_the_applications_signal_sees_complete_after_it_on_kreplays_thread";
    if in_child(name) {
        return order_child(Shape::Single {
            buffers: 2,
            rounds: 3,
        });
    }
    scenario(name, &[("PROBE_EXIT_WAIT", "signal")]);
}

/// The same with a replay service whose tool opts out of every dispatch (each runs once through
/// the pass loop), and with counting beside tracing: every dispatch's counters after its
/// ENQUEUE EXIT.
#[test]
fn a_dispatch_run_once_by_the_replay_owner_gets_complete_and_counters_after_a_slow_enqueue_exit() {
    let name = "a_dispatch_run_once_by_the_replay_owner_gets_complete_and_counters_after_a_slow_enqueue_exit";
    if in_child(name) {
        return order_child(Shape::Single {
            buffers: 2,
            rounds: 3,
        });
    }
    scenario(
        name,
        &[
            ("PROBE_REPLAY", "opt"),
            ("PROBE_EXIT_WAIT", "signal"),
            ("PROBE_COUNT", "1"),
        ],
    );
}

/// An ENQUEUE EXIT that waits for its own COMPLETE does not get it while it waits, and does not
/// hang.
#[test]
fn an_enqueue_exit_waiting_for_its_complete_does_not_get_it_meanwhile() {
    let name = "an_enqueue_exit_waiting_for_its_complete_does_not_get_it_meanwhile";
    if in_child(name) {
        return order_child(Shape::Single {
            buffers: 1,
            rounds: 3,
        });
    }
    scenario(
        name,
        &[("PROBE_EXIT_WAIT", "complete"), ("PROBE_COUNT", "1")],
    );
}

/// Several packets in one doorbell write (a dispatch, a barrier waiting for its completion, two
/// more dispatches) with an ENQUEUE EXIT that waits for each dispatch's signal.
#[test]
fn a_write_of_dispatches_and_a_barrier_on_one_of_them_keeps_the_record_order_with_a_slow_enqueue_exit()
 {
    let name = "a_write_of_dispatches_and_a_barrier_on_one_of_them_keeps_the_record_order_with_a_slow_enqueue_exit";
    if in_child(name) {
        return order_child(Shape::Batch { rounds: 3 });
    }
    scenario(name, &[("PROBE_EXIT_WAIT", "signal"), ("PROBE_COUNT", "1")]);
}

/// The same through the pass loop (a replay service, every dispatch run once).
#[test]
fn a_write_of_dispatches_and_a_barrier_run_once_by_the_replay_owner_keeps_the_record_order() {
    let name =
        "a_write_of_dispatches_and_a_barrier_run_once_by_the_replay_owner_keeps_the_record_order";
    if in_child(name) {
        return order_child(Shape::Batch { rounds: 3 });
    }
    scenario(
        name,
        &[
            ("PROBE_REPLAY", "opt"),
            ("PROBE_EXIT_WAIT", "signal"),
            ("PROBE_COUNT", "1"),
        ],
    );
}

/// The same replayed in 3 passes, the tool slow in every callback: each pass's records in the
/// documented order.
#[test]
fn a_write_of_replayed_dispatches_and_a_barrier_keeps_the_per_pass_order_with_slow_callbacks() {
    let name =
        "a_write_of_replayed_dispatches_and_a_barrier_keeps_the_per_pass_order_with_slow_callbacks";
    if in_child(name) {
        return order_child(Shape::Batch { rounds: 2 });
    }
    scenario(
        name,
        &[
            ("PROBE_REPLAY", "3"),
            ("PROBE_SLOW_MS", "3"),
            ("PROBE_COUNT", "1"),
        ],
    );
}

/// A queue of 4 slots that fills up while the tool is slow in ENQUEUE EXIT.
#[test]
fn a_full_small_queue_with_a_slow_enqueue_exit_keeps_the_record_order() {
    let name = "a_full_small_queue_with_a_slow_enqueue_exit_keeps_the_record_order";
    if in_child(name) {
        return order_child(Shape::SmallQueue {
            dispatches: 24,
            single: false,
        });
    }
    scenario(
        name,
        &[
            ("PROBE_REPLAY", "opt"),
            ("PROBE_EXIT_WAIT", "signal"),
            ("PROBE_COUNT", "1"),
        ],
    );
}

/// Six threads on two shared queues, the tool slow in ENQUEUE EXIT, counting beside tracing.
#[test]
fn threads_sharing_queues_with_a_slow_enqueue_exit_keep_the_record_order() {
    let name = "threads_sharing_queues_with_a_slow_enqueue_exit_keep_the_record_order";
    if in_child(name) {
        return order_child(Shape::Threads {
            threads: 6,
            rounds: 4,
        });
    }
    scenario(name, &[("PROBE_EXIT_WAIT", "signal"), ("PROBE_COUNT", "1")]);
}

/// Threads sharing queues whose dispatches are replayed in 2 passes, the tool slow in every
/// callback.
#[test]
fn threads_sharing_queues_with_replayed_dispatches_keep_the_per_pass_order() {
    let name = "threads_sharing_queues_with_replayed_dispatches_keep_the_per_pass_order";
    if in_child(name) {
        return order_child(Shape::Threads {
            threads: 4,
            rounds: 3,
        });
    }
    scenario(
        name,
        &[
            ("PROBE_REPLAY", "2"),
            ("PROBE_SLOW_MS", "2"),
            ("PROBE_COUNT", "1"),
        ],
    );
}

/// What the body of a [`one_dispatch_child`] works with.
struct OneDispatch<'a> {
    hsa: &'a Hsa,
    child: &'a Child<'a>,
    /// The queue the application thread dispatches to (its address).
    queue: usize,
    /// The tool library (its `probe_*` exports).
    lib: &'a libloading::Library,
    loaded: &'a Loaded,
}

impl OneDispatch<'_> {
    /// Calls the tool's `void name(void)` export.
    fn tell_tool(&self, name: &[u8]) {
        // SAFETY: the probe tool exports `name` with this signature.
        unsafe {
            self.lib
                .get::<unsafe extern "C" fn()>(name)
                .expect("probe export")()
        };
    }

    /// Waits (10 s at most) for the first dispatch the tool saw and then for its application
    /// signal to reach 0; a problem when either does not come.
    fn wait_first_dispatch(&self, problems: &mut Vec<String>) {
        let start = std::time::Instant::now();
        let signal = loop {
            let seen = SIGNALS
                .lock()
                .unwrap()
                .as_ref()
                .and_then(|m| m.values().next().copied());
            if seen.is_some() || start.elapsed() > Duration::from_secs(10) {
                break seen;
            }
            std::thread::yield_now();
        };
        match signal {
            Some(signal) if self.hsa.wait_zero(signal, Duration::from_secs(10)) => {}
            _ => problems.push("the dispatch did not complete within 10 s".to_string()),
        }
    }
}

/// The child of the single-dispatch scenarios: kreplay loaded, the tool given GPU access and
/// `app_wait`, one buffer of `ELEMENTS` on GPU agent 0 and a queue of 64 slots; `body` returns
/// its problems. The runtime is not shut down (an application thread may still be inside
/// kreplay); OnUnload is called after `body` unless `body` called it. Then the results are
/// checked and the tool's report and the problems printed.
fn one_dispatch_child(unloads: bool, body: impl FnOnce(&OneDispatch<'_>) -> Vec<String>) {
    let mut table = OwnedApiTable::softhsa();
    let loaded = load_kreplay(&mut table);
    let mut problems = Vec::new();
    if !loaded.loaded {
        problems.push("OnLoad returned false".to_string());
    }
    let tool = std::env::var("KREPLAY_TOOL_LIBRARIES").unwrap();
    // SAFETY: the tool is loaded by kreplay; these exports have these signatures.
    let lib = unsafe { libloading::Library::new(&tool) }.expect("tool library");
    {
        // SAFETY: the table stays alive and valid while `hsa` is used.
        let hsa = unsafe { Hsa::from_table(table.table()) };
        let session = hsa.init().expect("hsa_init");
        give_tool_gpu(&table, Path::new(&tool));
        // SAFETY: as above.
        unsafe {
            lib.get::<unsafe extern "C" fn(extern "C" fn(u32, u32) -> i32)>(b"probe_set_app_wait\0")
                .expect("probe_set_app_wait")(app_wait)
        };
        let agent = hsa.gpu_agents().expect("agents")[0];
        let pool = hsa.coarse_pool(agent).expect("coarse pool");
        let ptr = hsa
            .allocate(pool, ELEMENTS * 4)
            .expect("buffer")
            .cast::<u32>();
        let init: Vec<u32> = (0..ELEMENTS as u32).collect();
        // SAFETY: softhsa device memory is host memory; ELEMENTS u32.
        unsafe { std::ptr::copy_nonoverlapping(init.as_ptr(), ptr, ELEMENTS) };
        let child = Child {
            hsa: &hsa,
            kernel: register_kernel("probe_c_add_one", add_one),
            kernarg_pool: hsa.pool(agent, PoolKind::Kernarg).expect("kernarg pool"),
            runs: vec![AtomicU32::new(0)],
            buffers: vec![(ptr, init)],
        };
        let queue = hsa.queue_create(agent, 64).expect("queue") as usize;
        problems.extend(body(&OneDispatch {
            hsa: &hsa,
            child: &child,
            queue,
            lib: &lib,
            loaded: &loaded,
        }));
        problems.extend(child.check());
        std::mem::forget(session);
    }
    if !unloads {
        // SAFETY: the runtime's shutdown call.
        unsafe { (loaded.on_unload)() };
    }
    let r = tool_report(Path::new(&tool));
    if !r.is_empty() {
        problems.push(format!("tool: {r}"));
    }
    for p in &problems {
        println!("TOOL-PROBLEM: {p}");
    }
    println!("PROBE-DONE");
}

/// One application thread dispatches once and waits; the main thread waits for that dispatch's
/// signal and then unloads kreplay (OnUnload), while the tool still lingers in the dispatch's
/// ENQUEUE EXIT (`unload_held.c`).
fn unload_child() {
    one_dispatch_child(true, |d| {
        let (child, queue) = (d.child, d.queue);
        std::thread::scope(|s| {
            let app = s.spawn(move || {
                let mut problems = Vec::new();
                let signals = child.write(queue as *mut hsa_queue_t, &[Item::Add(0)]);
                child.wait_all(&signals, &mut problems);
                problems
            });
            let mut problems = Vec::new();
            d.wait_first_dispatch(&mut problems);
            d.tell_tool(b"probe_unload_begins\0");
            // SAFETY: the runtime's shutdown call, made while the application thread is still
            // in its doorbell store.
            unsafe { (d.loaded.on_unload)() };
            problems.extend(app.join().unwrap());
            problems
        })
    });
}

/// OnUnload while a COMPLETE is held behind an ENQUEUE EXIT of another thread, after the
/// application saw the kernel complete: the COMPLETE still reaches the tool, once, before its
/// finalize (it was dropped: OnUnload stopped the context while the ENQUEUE EXIT ran, and the
/// held record then found it stopped).
#[test]
fn onunload_while_a_complete_is_held_behind_enqueue_exit_still_delivers_it_before_finalize() {
    let name =
        "onunload_while_a_complete_is_held_behind_enqueue_exit_still_delivers_it_before_finalize";
    if in_child(name) {
        return unload_child();
    }
    let (problems, run) = run_scenario(name, &["unload_held.c"], &[], DEADLINE);
    assert!(
        problems.is_empty(),
        "problems: {problems:#?}\n{}",
        run.report()
    );
}

/// A queue of 4 slots that fills up with dispatches replayed in 3 passes (their passes and
/// drain markers take slots too), the tool slow in every callback.
#[test]
fn a_full_small_queue_of_replayed_dispatches_keeps_the_per_pass_order() {
    let name = "a_full_small_queue_of_replayed_dispatches_keeps_the_per_pass_order";
    if in_child(name) {
        return order_child(Shape::SmallQueue {
            dispatches: 12,
            single: false,
        });
    }
    scenario(
        name,
        &[
            ("PROBE_REPLAY", "3"),
            ("PROBE_SLOW_MS", "1"),
            ("PROBE_COUNT", "1"),
        ],
    );
}

/// Threads sharing queues, each dispatch run once with an ENQUEUE EXIT that outlasts its kernel,
/// and COMPLETE callbacks that submit work of the tool's own, replayed in 3 passes, while the
/// other threads keep dispatching on the same agent.
#[test]
fn complete_callbacks_of_threads_sharing_queues_have_their_work_replayed() {
    let name = "complete_callbacks_of_threads_sharing_queues_have_their_work_replayed";
    if in_child(name) {
        return order_child(Shape::Threads {
            threads: 4,
            rounds: 3,
        });
    }
    scenario(
        name,
        &[
            ("PROBE_REPLAY", "opt"),
            ("PROBE_EXIT_WAIT", "signal"),
            ("PROBE_SUBMIT", "1"),
            ("PROBE_COUNT", "1"),
        ],
    );
}

/// Set by the cancelled application thread once its doorbell store returned.
static RETURNED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// What the application's raw thread writes.
struct Cancellable {
    child: *const Child<'static>,
    queue: usize,
}

/// glibc's and musl's value.
const PTHREAD_CANCEL_DISABLE: i32 = 1;

/// `pthread_t` on Linux (an unsigned long).
type PthreadT = std::ffi::c_ulong;

type StartRoutine = extern "C" fn(*mut std::ffi::c_void) -> *mut std::ffi::c_void;

unsafe extern "C" {
    fn pthread_create(
        thread: *mut PthreadT,
        attr: *const std::ffi::c_void,
        start: StartRoutine,
        arg: *mut std::ffi::c_void,
    ) -> i32;
    fn pthread_join(thread: PthreadT, ret: *mut *mut std::ffi::c_void) -> i32;
    fn pthread_cancel(thread: PthreadT) -> i32;
    fn pthread_setcancelstate(state: i32, old: *mut i32) -> i32;
}

/// The application's thread (a plain pthread, as a C application's): one dispatch, then
/// cancellation off so that the request made meanwhile does not act in this test's own code.
extern "C" fn cancellable(arg: *mut std::ffi::c_void) -> *mut std::ffi::c_void {
    // SAFETY: `arg` is the `Cancellable` made for this thread, alive until it is joined.
    let job = unsafe { &*arg.cast::<Cancellable>() };
    // SAFETY: the child outlives this thread (joined before it is dropped).
    let child = unsafe { &*job.child };
    child.write(job.queue as *mut hsa_queue_t, &[Item::Add(0)]);
    // SAFETY: a plain call on this thread's own cancellation state.
    unsafe { pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, std::ptr::null_mut()) };
    RETURNED.store(true, Ordering::SeqCst);
    std::ptr::null_mut()
}

/// One application thread dispatches once; the main thread cancels it (deferred) while the tool
/// lingers in the dispatch's ENQUEUE EXIT after its kernel finished, and the tool then reaches a
/// cancellation point there.
fn cancel_child() {
    one_dispatch_child(false, |d| {
        let mut problems = Vec::new();
        let mut job = Cancellable {
            // SAFETY: only the lifetime is erased; the thread is joined before `child` drops.
            child: unsafe {
                std::mem::transmute::<*const Child<'_>, *const Child<'static>>(d.child)
            },
            queue: d.queue,
        };
        let mut thread: PthreadT = 0;
        // SAFETY: a start routine and its argument, alive until the thread is joined.
        let created = unsafe {
            pthread_create(
                &mut thread,
                std::ptr::null(),
                cancellable,
                std::ptr::from_mut(&mut job).cast(),
            )
        };
        assert_eq!(created, 0);
        d.wait_first_dispatch(&mut problems);
        // SAFETY: `thread` is alive: it is inside its doorbell store (the tool lingers).
        assert_eq!(unsafe { pthread_cancel(thread) }, 0);
        d.tell_tool(b"probe_cancel_sent\0");
        // SAFETY: joins the thread made above, once.
        assert_eq!(unsafe { pthread_join(thread, std::ptr::null_mut()) }, 0);
        if !RETURNED.load(Ordering::SeqCst) {
            problems
                .push("the application thread was cancelled inside its doorbell store".to_string());
        }
        problems
    });
}

/// The application's thread cancelled (deferred) while the tool lingers in ENQUEUE EXIT after
/// the kernel finished, the tool reaching a cancellation point there: the doorbell store
/// returns, the COMPLETE comes once, after ENQUEUE EXIT, on kreplay's thread, and the process
/// goes on.
#[test]
fn an_application_thread_cancelled_during_a_slow_enqueue_exit_gets_its_complete_once() {
    let name = "an_application_thread_cancelled_during_a_slow_enqueue_exit_gets_its_complete_once";
    if in_child(name) {
        return cancel_child();
    }
    scenario(
        name,
        &[("PROBE_EXIT_WAIT", "cancel"), ("PROBE_REPLAY", "opt")],
    );
}

/// A tool that stops its context in ENQUEUE EXIT, after the kernel finished: the COMPLETE held
/// back and the counters of that dispatch do not come.
#[test]
fn a_context_stopped_in_enqueue_exit_after_its_kernel_finished_gets_no_complete_or_counters() {
    let name =
        "a_context_stopped_in_enqueue_exit_after_its_kernel_finished_gets_no_complete_or_counters";
    if in_child(name) {
        return unload_child();
    }
    let (problems, run) = run_scenario(
        name,
        &["unload_held.c"],
        &[("PROBE_MODE", "stop")],
        DEADLINE,
    );
    assert!(
        problems.is_empty(),
        "problems: {problems:#?}\n{}",
        run.report()
    );
}

/// A tool that finalizes itself in ENQUEUE EXIT, after the kernel finished: nothing more
/// reaches it, the held COMPLETE and counters included.
#[test]
fn a_tool_finalized_in_enqueue_exit_after_its_kernel_finished_gets_no_complete_or_counters() {
    let name =
        "a_tool_finalized_in_enqueue_exit_after_its_kernel_finished_gets_no_complete_or_counters";
    if in_child(name) {
        return unload_child();
    }
    let (problems, run) = run_scenario(
        name,
        &["unload_held.c"],
        &[("PROBE_MODE", "finalize")],
        DEADLINE,
    );
    assert!(
        problems.is_empty(),
        "problems: {problems:#?}\n{}",
        run.report()
    );
}

/// A single-producer queue of 4 slots (kreplay adds its drain markers to the application's
/// writes there) that fills up while the tool is slow in ENQUEUE EXIT, the dispatches run once
/// through the pass loop, counted.
#[test]
fn a_full_small_single_producer_queue_with_a_slow_enqueue_exit_keeps_the_record_order() {
    let name = "a_full_small_single_producer_queue_with_a_slow_enqueue_exit_keeps_the_record_order";
    if in_child(name) {
        return order_child(Shape::SmallQueue {
            dispatches: 24,
            single: true,
        });
    }
    scenario(
        name,
        &[
            ("PROBE_REPLAY", "opt"),
            ("PROBE_EXIT_WAIT", "signal"),
            ("PROBE_COUNT", "1"),
        ],
    );
}

/// The same with every dispatch replayed in 3 passes, the tool slow in every callback.
#[test]
fn a_full_small_single_producer_queue_of_replayed_dispatches_keeps_the_per_pass_order() {
    let name = "a_full_small_single_producer_queue_of_replayed_dispatches_keeps_the_per_pass_order";
    if in_child(name) {
        return order_child(Shape::SmallQueue {
            dispatches: 12,
            single: true,
        });
    }
    scenario(
        name,
        &[
            ("PROBE_REPLAY", "3"),
            ("PROBE_SLOW_MS", "1"),
            ("PROBE_COUNT", "1"),
        ],
    );
}
