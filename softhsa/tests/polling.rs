//! Polling before blocking: waiters and idle packet processors poll for a bounded time, then
//! park, so an idle process burns no CPU; with one CPU nobody polls; a bad setting is refused.
//!
//! The tests of this file configure the runtime and read CPU times of the whole process, so
//! they run one at a time.

mod common;

use common::*;
use hsa_sys::*;
use kreplay_softhsa::testing::{Dispatch, Hsa};
use kreplay_softhsa::{POLL_ENV, SoftHsaConfig, configure};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

static SERIAL: Mutex<()> = Mutex::new(());

/// Most CPU time a few hundred milliseconds of waiting may use with a 2 ms poll. A thread that
/// never stopped polling would use all of them, or on a machine loaded by other work its share
/// (about a fifth at a load average of 10 on 2 CPUs: some 80 ms).
const BOUND: Duration = Duration::from_millis(30);

fn serial() -> MutexGuard<'static, ()> {
    SERIAL
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn with_poll(poll: Duration) {
    configure(SoftHsaConfig {
        poll_before_block: Some(poll),
        ..SoftHsaConfig::default()
    })
    .expect("configure softhsa");
}

/// CPU time of `clock` (a thread or the process) so far.
fn cpu_time(clock: libc::clockid_t) -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid clock id and a valid out-pointer.
    let rc = unsafe { libc::clock_gettime(clock, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime");
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// The calling thread's CPU time spent in a wait on a signal that never changes, bounded by
/// `wait`.
fn cpu_of_unsatisfied_wait(hsa: &Hsa, wait: Duration) -> Duration {
    let signal = hsa.signal_create(1).unwrap();
    let before = cpu_time(libc::CLOCK_THREAD_CPUTIME_ID);
    let started = Instant::now();
    assert_eq!(hsa.signal_wait(signal, HSA_SIGNAL_CONDITION_EQ, 0, wait), 1);
    assert!(started.elapsed() >= wait, "the wait ends at its timeout");
    let spent = cpu_time(libc::CLOCK_THREAD_CPUTIME_ID) - before;
    hsa.signal_destroy(signal).unwrap();
    spent
}

#[test]
fn a_wait_that_is_never_satisfied_polls_briefly_then_blocks() {
    let _serial = serial();
    with_poll(Duration::from_millis(2));
    let (hsa, _session) = open();
    let wait = Duration::from_millis(400);
    let spent = cpu_of_unsatisfied_wait(&hsa, wait);
    // At most the 2 ms poll plus the cost of parking and waking; a waiter that kept polling
    // would spend the 400 ms, or its share of them on a busy machine.
    assert!(
        spent < BOUND,
        "a 400 ms wait with a 2 ms poll used {spent:?} of CPU"
    );
}

#[test]
fn idle_packet_processors_poll_briefly_then_park() {
    let _serial = serial();
    with_poll(Duration::from_millis(2));
    let (hsa, _session) = open();
    let gpu = hsa.gpu_agents().unwrap()[0];
    let queues: Vec<_> = (0..4).map(|_| hsa.queue_create(gpu, 64).unwrap()).collect();
    let kernel = add_one_kernel();
    let data = hsa
        .allocate(hsa.coarse_pool(gpu).unwrap(), 64 * 4)
        .unwrap()
        .cast::<u32>();
    let mut args = AddOneArgs { data };
    let done = hsa.signal_create(0).unwrap();
    for &queue in &queues {
        hsa.signal_store(done, 1);
        let dispatch = Dispatch::linear(kernel, 64, 64, (&raw mut args).cast(), done);
        // SAFETY: a live queue; `args` and the buffer outlive the dispatch, waited for below.
        unsafe { hsa.dispatch(queue, &dispatch) };
        assert!(hsa.wait_zero(done, PROMPT));
    }
    // Every processor just ran a packet and polls for the next; none comes.
    let before = cpu_time(libc::CLOCK_PROCESS_CPUTIME_ID);
    std::thread::sleep(Duration::from_millis(500));
    let spent = cpu_time(libc::CLOCK_PROCESS_CPUTIME_ID) - before;
    assert!(
        spent < BOUND,
        "4 idle queues with a 2 ms poll used {spent:?} of CPU in 500 ms"
    );
    // SAFETY: the kernels completed; the buffer holds 64 u32s.
    let values = unsafe { std::slice::from_raw_parts(data, 64) };
    assert!(values.iter().all(|&v| v == 4), "{values:?}");
    for queue in queues {
        // SAFETY: created above, every dispatch waited for.
        unsafe { hsa.queue_destroy(queue) }.unwrap();
    }
    hsa.signal_destroy(done).unwrap();
}

#[test]
fn nobody_polls_when_the_process_may_use_one_cpu() {
    let _serial = serial();
    with_poll(Duration::from_millis(300));
    // The runtime reads the affinity of the thread that initializes it; its own threads inherit
    // this thread's. A test thread of its own, so the pin ends with it.
    let spent = std::thread::spawn(|| {
        // SAFETY: an all-zero cpu_set_t is an empty set; CPU_SET writes inside it.
        let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
        // SAFETY: pid 0 is this thread; `set` is a valid cpu_set_t.
        let rc =
            unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) };
        assert_eq!(rc, 0, "sched_getaffinity");
        let cpu = (0..libc::CPU_SETSIZE as usize)
            // SAFETY: the index is below CPU_SETSIZE.
            .find(|&cpu| unsafe { libc::CPU_ISSET(cpu, &set) })
            .expect("some CPU is allowed");
        // SAFETY: as above.
        let mut one: libc::cpu_set_t = unsafe { std::mem::zeroed() };
        // SAFETY: the index is below CPU_SETSIZE.
        unsafe { libc::CPU_SET(cpu, &mut one) };
        // SAFETY: pid 0 is this thread; `one` is a valid cpu_set_t.
        let rc =
            unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &one) };
        assert_eq!(rc, 0, "sched_setaffinity");
        let (hsa, _session) = open();
        cpu_of_unsatisfied_wait(&hsa, Duration::from_millis(200))
    })
    .join()
    .expect("the pinned thread");
    // A poller would have spent most of the 200 ms wait polling (its poll is 300 ms).
    assert!(
        spent < Duration::from_millis(60),
        "a 200 ms wait on one CPU used {spent:?} of CPU"
    );
}

#[test]
fn a_bad_poll_setting_in_the_environment_is_refused_by_hsa_init() {
    let _serial = serial();
    configure(SoftHsaConfig::default()).unwrap();
    let hsa = Hsa::softhsa();
    // Digits only, as every other number kreplay reads from the environment: a sign or a space
    // is as likely a typo as a different value.
    for bad in ["fast", "-1", "2000000", " 50", "+5", "50 ", ""] {
        // SAFETY: the tests of this file run one at a time and no other thread of this process
        // reads the environment while this one writes it.
        unsafe { std::env::set_var(POLL_ENV, bad) };
        let status = hsa.init().map(|_| ()).unwrap_err();
        assert_eq!(
            status, HSA_STATUS_ERROR_INVALID_ARGUMENT,
            "{POLL_ENV}={bad}"
        );
    }
    // SAFETY: as above.
    unsafe { std::env::set_var(POLL_ENV, "0") };
    let session = hsa.init();
    // SAFETY: as above.
    unsafe { std::env::remove_var(POLL_ENV) };
    assert!(session.is_ok(), "{POLL_ENV}=0 turns polling off");
}

#[test]
fn an_inactive_queue_with_a_packet_waiting_burns_no_cpu() {
    let _serial = serial();
    with_poll(Duration::from_millis(2));
    let (hsa, _session) = open();
    let gpu = hsa.gpu_agents().unwrap()[0];
    let queue = hsa.queue_create(gpu, 64).unwrap();
    let inactivate = hsa.core().hsa_queue_inactivate_fn.unwrap();
    // SAFETY: a live queue of this runtime.
    assert_eq!(unsafe { inactivate(queue) }, HSA_STATUS_SUCCESS);
    let done = hsa.signal_create(1).unwrap();
    let kernel = add_one_kernel();
    let data = hsa
        .allocate(hsa.coarse_pool(gpu).unwrap(), 64 * 4)
        .unwrap()
        .cast::<u32>();
    let mut args = AddOneArgs { data };
    let dispatch = Dispatch::linear(kernel, 64, 64, (&raw mut args).cast(), done);
    // SAFETY: a live queue; an inactive queue runs nothing, so `args` is never read after this
    // test ends (the queue is destroyed first).
    unsafe { hsa.dispatch(queue, &dispatch) };
    // The processor sees a packet it may not run: it must park, not poll for ever.
    let before = cpu_time(libc::CLOCK_PROCESS_CPUTIME_ID);
    std::thread::sleep(Duration::from_millis(400));
    let spent = cpu_time(libc::CLOCK_PROCESS_CPUTIME_ID) - before;
    assert_eq!(hsa.signal_load(done), 1, "an inactive queue runs nothing");
    // SAFETY: created above; its packet never runs.
    unsafe { hsa.queue_destroy(queue) }.unwrap();
    assert!(
        spent < BOUND,
        "an inactive queue with a waiting packet used {spent:?} of CPU in 400 ms"
    );
}
