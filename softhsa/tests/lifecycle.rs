//! `hsa_init` / `hsa_shut_down` and object lifetimes. The tests of this file observe the global
//! state of the runtime, so they run one at a time (the SERIAL lock), in their own process.

mod common;

use common::*;
use hsa_sys::*;
use kreplay_softhsa::testing::{Dispatch, Hsa};
use std::sync::{Mutex, MutexGuard};
use std::time::Instant;

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Threads of this process whose name starts with `prefix` (Linux), or `None` elsewhere.
fn threads_named(prefix: &str) -> Option<usize> {
    let tasks = std::fs::read_dir("/proc/self/task").ok()?;
    Some(
        tasks
            .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
            .filter(|name| name.starts_with(prefix))
            .count(),
    )
}

/// Waits (bounded) until the number of threads named `prefix*` satisfies `ok`. Thread names
/// lag a little: a new thread takes its name when it first runs, and a joined thread can linger
/// in /proc for a moment after its join returned.
fn eventually(prefix: &str, ok: impl Fn(usize) -> bool) -> bool {
    let deadline = Instant::now() + PROMPT;
    loop {
        match threads_named(prefix) {
            None => return true,
            Some(n) if ok(n) => return true,
            Some(_) if Instant::now() > deadline => return false,
            Some(_) => std::thread::yield_now(),
        }
    }
}

fn settles_at(prefix: &str, expected: usize) -> bool {
    eventually(prefix, |n| n == expected)
}

#[test]
fn calls_before_hsa_init_return_not_initialized() {
    let _serial = serial();
    let hsa = Hsa::softhsa();
    let (c, a) = (*hsa.core(), *hsa.amd());
    let mut value = 0u64;
    let mut signal = hsa_signal_t { handle: 0 };
    // SAFETY: table entries with HSA signatures; out pointers are live locals.
    unsafe {
        assert_eq!(
            c.hsa_shut_down_fn.unwrap()(),
            HSA_STATUS_ERROR_NOT_INITIALIZED
        );
        assert_eq!(
            c.hsa_system_get_info_fn.unwrap()(HSA_SYSTEM_INFO_TIMESTAMP, (&raw mut value).cast()),
            HSA_STATUS_ERROR_NOT_INITIALIZED
        );
        assert_eq!(
            c.hsa_iterate_agents_fn.unwrap()(None, std::ptr::null_mut()),
            HSA_STATUS_ERROR_NOT_INITIALIZED
        );
        assert_eq!(
            c.hsa_signal_create_fn.unwrap()(0, 0, std::ptr::null(), &mut signal),
            HSA_STATUS_ERROR_NOT_INITIALIZED
        );
        assert_eq!(
            a.hsa_amd_memory_pool_free_fn.unwrap()(std::ptr::null_mut()),
            HSA_STATUS_ERROR_NOT_INITIALIZED
        );
        assert_eq!(
            c.hsa_executable_destroy_fn.unwrap()(hsa_executable_t { handle: 1 }),
            HSA_STATUS_ERROR_NOT_INITIALIZED
        );
        assert_eq!(
            c.hsa_signal_load_relaxed_fn.unwrap()(hsa_signal_t { handle: 1 }),
            0
        );
    }
}

#[test]
fn init_and_shut_down_are_reference_counted() {
    let _serial = serial();
    let hsa = Hsa::softhsa();
    let outer = hsa.init().unwrap();
    let inner = hsa.init().unwrap();
    drop(inner);
    let s = hsa
        .signal_create(1)
        .expect("still initialized after one of two shut-downs");
    hsa.signal_destroy(s).unwrap();
    drop(outer);
    assert_eq!(
        hsa.signal_create(1).err(),
        Some(HSA_STATUS_ERROR_NOT_INITIALIZED)
    );
    let shut_down = hsa.core().hsa_shut_down_fn.unwrap();
    // SAFETY: table entry with the HSA signature.
    assert_eq!(unsafe { shut_down() }, HSA_STATUS_ERROR_NOT_INITIALIZED);
}

#[test]
fn a_new_init_starts_fresh_and_old_handles_are_invalid() {
    let _serial = serial();
    let hsa = Hsa::softhsa();
    let session = hsa.init().unwrap();
    let old_gpu = hsa.gpu_agents().unwrap()[0];
    let old_signal = hsa.signal_create(1).unwrap();
    let old_buffer = hsa
        .allocate(hsa.coarse_pool(old_gpu).unwrap(), 4096)
        .unwrap();
    drop(session);
    let _session = hsa.init().unwrap();
    assert_eq!(
        hsa.signal_destroy(old_signal),
        Err(HSA_STATUS_ERROR_INVALID_SIGNAL)
    );
    assert_eq!(
        hsa.device_type(old_gpu),
        Err(HSA_STATUS_ERROR_INVALID_AGENT)
    );
    assert_eq!(
        hsa.free(old_buffer),
        Err(HSA_STATUS_ERROR_INVALID_ALLOCATION),
        "freed by the shut-down"
    );
    assert_eq!(hsa.gpu_agents().unwrap().len(), 2);
}

#[test]
fn destroyed_queues_and_freed_allocations_are_no_longer_valid() {
    let _serial = serial();
    let (hsa, _session) = open();
    let gpu = hsa.gpu_agents().unwrap()[0];
    let queue = hsa.intercept_queue_create(gpu, 16).unwrap();
    let buffer = hsa.allocate(hsa.coarse_pool(gpu).unwrap(), 64).unwrap();
    // SAFETY: created above; the second destroy is what is being tested (nothing else runs in
    // this process, so the address cannot have been reused).
    unsafe {
        hsa.queue_destroy(queue).unwrap();
        assert_eq!(
            hsa.queue_destroy(queue),
            Err(HSA_STATUS_ERROR_INVALID_QUEUE)
        );
    }
    let register = hsa.amd().hsa_amd_queue_intercept_register_fn.unwrap();
    // SAFETY: table entry; the queue pointer is stale on purpose.
    let value = unsafe { register(queue, None, std::ptr::null_mut()) };
    assert_eq!(value, HSA_STATUS_ERROR_INVALID_QUEUE);
    hsa.free(buffer).unwrap();
    assert_eq!(hsa.free(buffer), Err(HSA_STATUS_ERROR_INVALID_ALLOCATION));
}

/// Whether the `len` bytes at `ptr` can be read, asked of the kernel (a write of them into a
/// pipe fails with EFAULT where they cannot), so that the test itself never faults.
fn readable(ptr: *const u8, len: usize) -> bool {
    let mut fds = [0; 2];
    // SAFETY: `fds` has room for the two descriptors.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0, "a pipe");
    // SAFETY: the kernel checks the source range itself; both descriptors are ours.
    let written = unsafe { libc::write(fds[1], ptr.cast(), len) };
    // SAFETY: the descriptors made above, closed once.
    unsafe {
        libc::close(fds[0]);
        libc::close(fds[1]);
    }
    written == len as isize
}

/// As a real queue's ring goes away with the queue, the ring of a destroyed queue is made
/// inaccessible (a tool still reading it faults at once instead of reading reused memory),
/// while its `hsa_queue_t` and indices stay readable as freed memory would.
#[test]
fn a_destroyed_queues_ring_can_no_longer_be_read() {
    let _serial = serial();
    let (hsa, _session) = open();
    let gpu = hsa.gpu_agents().unwrap()[0];
    for intercept in [false, true] {
        let queue = if intercept {
            hsa.intercept_queue_create(gpu, 16).unwrap()
        } else {
            hsa.queue_create(gpu, 16).unwrap()
        };
        // SAFETY: a live queue; its ring is `size` 64-byte slots at `base_address`.
        let (base, bytes) = unsafe {
            (
                (*queue).base_address.cast::<u8>(),
                (*queue).size as usize * 64,
            )
        };
        let add = hsa.core().hsa_queue_add_write_index_scacq_screl_fn.unwrap();
        // SAFETY: a live queue (one slot reserved, never written).
        assert_eq!(unsafe { add(queue, 1) }, 0);
        assert!(readable(base, bytes), "a live queue's ring is readable");
        // SAFETY: created above, destroyed once.
        unsafe { hsa.queue_destroy(queue) }.unwrap();
        assert!(
            !readable(base, bytes),
            "a destroyed queue's ring is gone (intercept {intercept})"
        );
        let load = hsa.core().hsa_queue_load_write_index_relaxed_fn.unwrap();
        // SAFETY: the queue is destroyed on purpose: its memory stays readable in softhsa.
        let write_index = unsafe { load(queue) };
        assert_eq!(write_index, 1, "its write index reads as it was left");
    }
}

#[test]
fn destroying_an_intercept_queue_also_stops_its_hardware_queue() {
    let _serial = serial();
    let (hsa, _session) = open();
    let gpu = hsa.gpu_agents().unwrap()[0];
    assert!(settles_at("softhsa-queue", 0));
    let queue = hsa.intercept_queue_create(gpu, 16).unwrap();
    assert!(
        settles_at("softhsa-queue", 1),
        "one packet processor, for the hardware queue"
    );
    // SAFETY: created above.
    unsafe { hsa.queue_destroy(queue) }.unwrap();
    assert!(
        settles_at("softhsa-queue", 0),
        "the hardware queue's processor stopped"
    );
}

unsafe extern "C" fn never_done(_: hsa_signal_value_t, _: *mut std::ffi::c_void) -> bool {
    true
}

#[test]
fn the_last_shut_down_stops_every_runtime_thread() {
    let _serial = serial();
    let hsa = Hsa::softhsa();
    {
        let _session = hsa.init().unwrap();
        let gpu = hsa.gpu_agents().unwrap()[0];
        let queue = hsa.queue_create(gpu, 16).unwrap();
        let blocked = hsa.signal_create(1).unwrap();
        let done = hsa.signal_create(1).unwrap();
        // A barrier that can never be satisfied keeps the processor waiting at shut-down.
        // SAFETY: live queue.
        unsafe {
            hsa.submit(
                queue,
                &kreplay_softhsa::testing::barrier_and_packet(&[blocked], done, true),
            )
        };
        let buffer = hsa.allocate(hsa.coarse_pool(gpu).unwrap(), 64).unwrap();
        let copy = hsa.amd().hsa_amd_memory_async_copy_fn.unwrap();
        let handler = hsa.amd().hsa_amd_signal_async_handler_fn.unwrap();
        // SAFETY: table entries; the copy waits on `blocked` for ever, the handler never fires.
        unsafe {
            assert_eq!(
                copy(
                    buffer.cast(),
                    gpu,
                    buffer.add(32).cast(),
                    gpu,
                    8,
                    1,
                    &blocked,
                    done
                ),
                HSA_STATUS_SUCCESS
            );
            assert_eq!(
                handler(
                    blocked,
                    HSA_SIGNAL_CONDITION_EQ,
                    0,
                    Some(never_done),
                    std::ptr::null_mut()
                ),
                HSA_STATUS_SUCCESS
            );
        }
        assert!(
            eventually("softhsa-", |n| n >= 4),
            "workers, processor, copy engine and handler thread are running"
        );
    }
    assert!(
        settles_at("softhsa-", 0),
        "every thread stopped by hsa_shut_down"
    );
}

#[test]
fn many_threads_may_init_work_and_shut_down_concurrently() {
    let _serial = serial();
    let kernel = add_one_kernel();
    let workers: Vec<_> = (0..6)
        .map(|t| {
            std::thread::spawn(move || {
                let hsa = Hsa::softhsa();
                for i in 0..15 {
                    let _session = hsa.init().unwrap();
                    let s = hsa.signal_create(1).unwrap();
                    if i % 5 == t % 5 {
                        let gpu = hsa.gpu_agents().unwrap()[t % 2];
                        let data = hsa
                            .allocate(hsa.coarse_pool(gpu).unwrap(), 4)
                            .unwrap()
                            .cast::<u32>();
                        let mut args = AddOneArgs { data };
                        let queue = hsa.queue_create(gpu, 4).unwrap();
                        // SAFETY: live queue; args outlive the dispatch (waited for below).
                        unsafe {
                            hsa.dispatch(
                                queue,
                                &Dispatch::linear(kernel, 1, 1, (&raw mut args).cast(), s),
                            )
                        };
                        assert!(hsa.wait_zero(s, PROMPT));
                        // SAFETY: completed.
                        assert_eq!(unsafe { *data }, 1);
                        // SAFETY: created above.
                        unsafe { hsa.queue_destroy(queue) }.unwrap();
                    } else {
                        hsa.signal_store(s, 0);
                    }
                    assert_eq!(hsa.signal_load(s), 0);
                    hsa.signal_destroy(s).unwrap();
                }
            })
        })
        .collect();
    for w in workers {
        w.join().unwrap();
    }
    let shut_down = Hsa::softhsa().core().hsa_shut_down_fn.unwrap();
    // SAFETY: table entry with the HSA signature.
    let value = unsafe { shut_down() };
    assert_eq!(
        value, HSA_STATUS_ERROR_NOT_INITIALIZED,
        "every init was matched"
    );
    assert!(settles_at("softhsa-", 0));
}

/// The memory mappings of this process (Linux), or `None` elsewhere.
fn mappings() -> Option<usize> {
    Some(
        std::fs::read_to_string("/proc/self/maps")
            .ok()?
            .lines()
            .count(),
    )
}

/// A program that creates and destroys queues all along (a queue per task) keeps what softhsa
/// holds of its destroyed queues bounded: a mapping kept per destroyed queue until
/// `hsa_shut_down` would run the process out of mappings (`vm.max_map_count`), after which
/// every allocation needing one fails.
#[test]
fn creating_and_destroying_many_queues_keeps_the_mappings_bounded() {
    let _serial = serial();
    let (hsa, _session) = open();
    let gpu = hsa.gpu_agents().unwrap()[0];
    let round = |n: usize| {
        for i in 0..n {
            let queue = if i % 2 == 0 {
                hsa.queue_create(gpu, 16).unwrap()
            } else {
                hsa.intercept_queue_create(gpu, 16).unwrap()
            };
            // SAFETY: created just above, destroyed once.
            unsafe { hsa.queue_destroy(queue) }.unwrap();
        }
    };
    // Whatever a first round keeps for good (thread stacks, caches).
    round(600);
    let Some(before) = mappings() else { return };
    round(1200);
    let after = mappings().unwrap();
    assert!(
        after < before + 200,
        "{} more mappings after 1200 more queues were created and destroyed",
        after - before.min(after)
    );
}
