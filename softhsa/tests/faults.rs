//! Fault injection: every fault strikes where it says, as the HSA status or delay it promises,
//! only while a plan is installed, and the same seed strikes the same calls.
//!
//! The plan is process-wide, so the tests of this file take turns (`serial`).

mod common;

use common::{AddOneArgs, PROMPT, add_one_kernel, open};
use hsa_sys::{
    HSA_STATUS_ERROR, HSA_STATUS_ERROR_INVALID_ARGUMENT, HSA_STATUS_ERROR_OUT_OF_RESOURCES,
    HSA_STATUS_SUCCESS, hsa_signal_t,
};
use kreplay_softhsa::faults::{self, Fault, FaultPlan};
use kreplay_softhsa::testing::{Dispatch, Hsa};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

static SERIAL: Mutex<()> = Mutex::new(());

/// Takes this file's turn and starts from no plan and zero counts; the plan is removed again
/// when the guard drops.
struct Turn(#[allow(dead_code)] MutexGuard<'static, ()>);

fn serial() -> Turn {
    let guard = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    faults::install(None);
    faults::reset_counts();
    Turn(guard)
}

impl Drop for Turn {
    fn drop(&mut self) {
        faults::install(None);
    }
}

fn memory_copy(hsa: &Hsa, dst: *mut u8, src: *const u8, len: usize) -> u32 {
    let f = hsa.core().hsa_memory_copy_fn.unwrap();
    // SAFETY: both ranges are `len` bytes of live allocations.
    unsafe { f(dst.cast(), src.cast(), len) }
}

fn async_copy(hsa: &Hsa, dst: *mut u8, src: *const u8, len: usize, done: hsa_signal_t) -> u32 {
    let gpu = hsa.gpu_agents().unwrap()[0];
    let f = hsa.amd().hsa_amd_memory_async_copy_fn.unwrap();
    // SAFETY: both ranges are `len` bytes of live allocations on `gpu`, kept alive until
    // `done` reaches 0 (the callers wait for it).
    unsafe {
        f(
            dst.cast(),
            gpu,
            src.cast(),
            gpu,
            len,
            0,
            std::ptr::null(),
            done,
        )
    }
}

fn buffers(hsa: &Hsa, len: usize) -> (*mut u8, *mut u8) {
    let gpu = hsa.gpu_agents().unwrap()[0];
    let pool = hsa.coarse_pool(gpu).unwrap();
    let src = hsa.allocate(pool, len).unwrap();
    let dst = hsa.allocate(pool, len).unwrap();
    // SAFETY: softhsa device memory is host memory; both are `len` bytes.
    unsafe {
        std::ptr::write_bytes(src, 0xab, len);
        std::ptr::write_bytes(dst, 0x11, len);
    }
    (src, dst)
}

fn bytes(ptr: *const u8, len: usize) -> Vec<u8> {
    // SAFETY: `ptr` is a live allocation of at least `len` bytes.
    unsafe { std::slice::from_raw_parts(ptr, len) }.to_vec()
}

#[test]
fn pool_allocate_fault_returns_out_of_resources_until_the_plan_is_removed() {
    let _turn = serial();
    let (hsa, _session) = open();
    let gpu = hsa.gpu_agents().unwrap()[0];
    let pool = hsa.coarse_pool(gpu).unwrap();
    faults::install(Some(FaultPlan::new(1).with(Fault::PoolAllocate, 1.0)));
    assert_eq!(
        hsa.allocate(pool, 4096),
        Err(HSA_STATUS_ERROR_OUT_OF_RESOURCES)
    );
    let region_alloc = hsa.core().hsa_memory_allocate_fn.unwrap();
    let mut out = std::ptr::null_mut();
    // SAFETY: a valid out pointer; softhsa's regions are its pools under the same handles.
    let status = unsafe {
        region_alloc(
            hsa_sys::hsa_region_t {
                handle: pool.handle,
            },
            64,
            &mut out,
        )
    };
    assert_eq!(status, HSA_STATUS_ERROR_OUT_OF_RESOURCES);
    assert_eq!(faults::fired(Fault::PoolAllocate), 2);
    faults::install(None);
    let ptr = hsa.allocate(pool, 4096).expect("allocations work again");
    hsa.free(ptr).unwrap();
}

#[test]
fn copy_fault_fails_hsa_memory_copy_and_moves_nothing() {
    let _turn = serial();
    let (hsa, _session) = open();
    let (src, dst) = buffers(&hsa, 4096);
    faults::install(Some(FaultPlan::new(1).with(Fault::Copy, 1.0)));
    assert_eq!(memory_copy(&hsa, dst, src, 4096), HSA_STATUS_ERROR);
    assert_eq!(bytes(dst, 4096), vec![0x11; 4096], "nothing was copied");
    assert_eq!(faults::fired(Fault::Copy), 1);
    faults::install(None);
    assert_eq!(memory_copy(&hsa, dst, src, 4096), HSA_STATUS_SUCCESS);
    assert_eq!(bytes(dst, 4096), vec![0xab; 4096]);
}

#[test]
fn async_copy_fault_fails_the_submission_and_leaves_the_signal_alone() {
    let _turn = serial();
    let (hsa, _session) = open();
    let (src, dst) = buffers(&hsa, 4096);
    let done = hsa.signal_create(1).unwrap();
    faults::install(Some(FaultPlan::new(1).with(Fault::AsyncCopy, 1.0)));
    assert_eq!(
        async_copy(&hsa, dst, src, 4096, done),
        HSA_STATUS_ERROR_OUT_OF_RESOURCES
    );
    assert_eq!(hsa.signal_load(done), 1, "a refused copy never completes");
    assert_eq!(bytes(dst, 4096), vec![0x11; 4096]);
    faults::install(None);
    assert_eq!(async_copy(&hsa, dst, src, 4096, done), HSA_STATUS_SUCCESS);
    assert!(hsa.wait_zero(done, PROMPT));
    assert_eq!(bytes(dst, 4096), vec![0xab; 4096]);
    hsa.signal_destroy(done).unwrap();
}

#[test]
fn signal_create_fault_fails_both_signal_constructors() {
    let _turn = serial();
    let (hsa, _session) = open();
    faults::install(Some(FaultPlan::new(1).with(Fault::SignalCreate, 1.0)));
    assert_eq!(
        hsa.signal_create(1).err(),
        Some(HSA_STATUS_ERROR_OUT_OF_RESOURCES)
    );
    let amd_create = hsa.amd().hsa_amd_signal_create_fn.unwrap();
    let mut signal = hsa_signal_t { handle: 0 };
    // SAFETY: no consumers, a valid out pointer.
    let status = unsafe { amd_create(1, 0, std::ptr::null(), 0, &mut signal) };
    assert_eq!(status, HSA_STATUS_ERROR_OUT_OF_RESOURCES);
    assert_eq!(signal.handle, 0, "no signal was handed out");
    assert_eq!(faults::fired(Fault::SignalCreate), 2);
    faults::install(None);
    let signal = hsa.signal_create(1).expect("signals can be created again");
    hsa.signal_destroy(signal).unwrap();
}

/// Dispatches `add_one` over 64 elements and returns (time to completion, the buffer).
fn timed_dispatch(hsa: &Hsa) -> (Duration, Vec<u32>) {
    let gpu = hsa.gpu_agents().unwrap()[0];
    let data = hsa
        .allocate(hsa.coarse_pool(gpu).unwrap(), 64 * 4)
        .unwrap()
        .cast::<u32>();
    let mut args = AddOneArgs { data };
    let queue = hsa.queue_create(gpu, 64).unwrap();
    let done = hsa.signal_create(1).unwrap();
    let dispatch = Dispatch::linear(add_one_kernel(), 64, 64, (&raw mut args).cast(), done);
    let start = Instant::now();
    // SAFETY: the queue is live and `args` outlives the dispatch (waited for below).
    unsafe { hsa.dispatch(queue, &dispatch) };
    assert!(hsa.wait_zero(done, PROMPT * 2), "the dispatch completed");
    let took = start.elapsed();
    // SAFETY: the kernel completed; the buffer holds 64 u32s.
    let values = unsafe { std::slice::from_raw_parts(data, 64) }.to_vec();
    // SAFETY: created above, destroyed once, idle.
    unsafe { hsa.queue_destroy(queue) }.unwrap();
    hsa.signal_destroy(done).unwrap();
    (took, values)
}

#[test]
fn slow_kernel_fault_delays_the_dispatch_but_it_still_runs_once() {
    let _turn = serial();
    let (hsa, _session) = open();
    faults::install(Some(
        FaultPlan::new(1).with_delay(Fault::SlowKernel, Duration::from_millis(300)),
    ));
    let (took, values) = timed_dispatch(&hsa);
    assert!(took >= Duration::from_millis(300), "took {took:?}");
    assert_eq!(values, vec![1; 64]);
    assert_eq!(faults::fired(Fault::SlowKernel), 1);
}

#[test]
fn queue_stall_fault_keeps_the_packet_in_the_queue_for_the_stall() {
    let _turn = serial();
    let (hsa, _session) = open();
    faults::install(Some(
        FaultPlan::new(1).with_delay(Fault::QueueStall, Duration::from_millis(400)),
    ));
    let (took, values) = timed_dispatch(&hsa);
    assert!(took >= Duration::from_millis(400), "took {took:?}");
    assert_eq!(values, vec![1; 64]);
    assert!(faults::fired(Fault::QueueStall) >= 1);
}

#[test]
fn async_copy_delay_fault_lands_the_copy_late_but_whole() {
    let _turn = serial();
    let (hsa, _session) = open();
    let (src, dst) = buffers(&hsa, 4096);
    let done = hsa.signal_create(1).unwrap();
    faults::install(Some(
        FaultPlan::new(1).with_delay(Fault::AsyncCopyDelay, Duration::from_millis(300)),
    ));
    let start = Instant::now();
    assert_eq!(async_copy(&hsa, dst, src, 4096, done), HSA_STATUS_SUCCESS);
    assert!(hsa.wait_zero(done, PROMPT));
    assert!(start.elapsed() >= Duration::from_millis(300));
    assert_eq!(bytes(dst, 4096), vec![0xab; 4096]);
    assert_eq!(faults::fired(Fault::AsyncCopyDelay), 1);
    hsa.signal_destroy(done).unwrap();
}

#[test]
fn skip_first_aims_the_fault_at_a_later_call() {
    let _turn = serial();
    let (hsa, _session) = open();
    let (src, dst) = buffers(&hsa, 64);
    faults::install(Some(FaultPlan::new(1).skip_first(Fault::Copy, 2)));
    let statuses: Vec<u32> = (0..4).map(|_| memory_copy(&hsa, dst, src, 64)).collect();
    assert_eq!(
        statuses,
        [
            HSA_STATUS_SUCCESS,
            HSA_STATUS_SUCCESS,
            HSA_STATUS_ERROR,
            HSA_STATUS_ERROR
        ]
    );
}

#[test]
fn the_same_seed_fails_the_same_calls_and_another_seed_does_not() {
    let _turn = serial();
    let (hsa, _session) = open();
    let (src, dst) = buffers(&hsa, 64);
    let pattern = |seed: u64| -> Vec<bool> {
        faults::install(Some(FaultPlan::new(seed).with(Fault::Copy, 0.3)));
        (0..300)
            .map(|_| memory_copy(&hsa, dst, src, 64) != HSA_STATUS_SUCCESS)
            .collect()
    };
    let first = pattern(5);
    assert_eq!(first, pattern(5));
    assert_ne!(first, pattern(6));
    let failed = first.iter().filter(|&&f| f).count();
    assert!(
        (45..135).contains(&failed),
        "about 30% of 300, got {failed}"
    );
}

/// Runs this test binary again for test `name` with `KREPLAY_SOFTHSA_FAULTS=spec`; returns its
/// success and output.
fn child_with_env(name: &str, spec: &str) -> (bool, String) {
    let output = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", name, "--nocapture", "--test-threads=1"])
        .env(faults::ENV_VAR, spec)
        .env("SOFTHSA_FAULTS_TEST_CHILD", "1")
        .output()
        .expect("the child runs");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    (output.status.success(), text)
}

fn in_child() -> bool {
    std::env::var_os("SOFTHSA_FAULTS_TEST_CHILD").is_some()
}

#[test]
fn a_malformed_environment_spec_fails_hsa_init_naming_the_variable() {
    if in_child() {
        let hsa = Hsa::softhsa();
        let init = hsa.core().hsa_init_fn.unwrap();
        // SAFETY: hsa_init has no preconditions.
        let status = unsafe { init() };
        assert_eq!(status, HSA_STATUS_ERROR_INVALID_ARGUMENT);
        println!("child-checked");
        return;
    }
    let (ok, text) = child_with_env(
        "a_malformed_environment_spec_fails_hsa_init_naming_the_variable",
        "copy:0.5,bogus:1",
    );
    assert!(ok, "{text}");
    assert!(text.contains("child-checked"), "{text}");
    assert!(
        text.contains("KREPLAY_SOFTHSA_FAULTS") && text.contains("unknown fault 'bogus'"),
        "{text}"
    );
}

#[test]
fn an_environment_spec_switches_faults_on_at_hsa_init() {
    if in_child() {
        let (hsa, _session) = open();
        let gpu = hsa.gpu_agents().unwrap()[0];
        let pool = hsa.coarse_pool(gpu).unwrap();
        assert_eq!(
            hsa.allocate(pool, 64),
            Err(HSA_STATUS_ERROR_OUT_OF_RESOURCES)
        );
        assert_eq!(faults::current().unwrap().seed, 3);
        println!("child-checked");
        return;
    }
    let (ok, text) = child_with_env(
        "an_environment_spec_switches_faults_on_at_hsa_init",
        "pool_allocate:1,seed:3",
    );
    assert!(ok, "{text}");
    assert!(text.contains("child-checked"), "{text}");
}

#[test]
fn at_most_stops_the_fault_after_that_many_strikes() {
    let _turn = serial();
    let (hsa, _session) = open();
    let (src, dst) = buffers(&hsa, 64);
    faults::install(Some(FaultPlan::new(1).at_most(Fault::Copy, 2)));
    let statuses: Vec<u32> = (0..4).map(|_| memory_copy(&hsa, dst, src, 64)).collect();
    assert_eq!(
        statuses,
        [
            HSA_STATUS_ERROR,
            HSA_STATUS_ERROR,
            HSA_STATUS_SUCCESS,
            HSA_STATUS_SUCCESS
        ]
    );
    assert_eq!(faults::fired(Fault::Copy), 2);
}

#[test]
fn once_installed_the_api_wins_over_the_environment_even_when_it_removes_the_plan() {
    if in_child() {
        faults::install(None);
        let (hsa, _session) = open();
        let gpu = hsa.gpu_agents().unwrap()[0];
        let pool = hsa.coarse_pool(gpu).unwrap();
        let ptr = hsa
            .allocate(pool, 64)
            .expect("the environment's plan is not read after install(None)");
        hsa.free(ptr).unwrap();
        assert!(faults::current().is_none());
        println!("child-checked");
        return;
    }
    let (ok, text) = child_with_env(
        "once_installed_the_api_wins_over_the_environment_even_when_it_removes_the_plan",
        "pool_allocate:1",
    );
    assert!(ok, "{text}");
    assert!(text.contains("child-checked"), "{text}");
}
