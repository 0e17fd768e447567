//! A runtime whose queues overlap kernel dispatches (`SoftHsaConfig::overlap_dispatches`). Its
//! own process, so the configuration does not collide with the default one.

mod common;

use common::*;
use kreplay_softhsa::testing::{Dispatch, Hsa, Session};
use kreplay_softhsa::{SoftHsaConfig, WorkGroup, configure, register_kernel};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

fn open_overlapping() -> (Hsa, Session) {
    configure(SoftHsaConfig {
        overlap_dispatches: true,
        ..SoftHsaConfig::default()
    })
    .unwrap();
    open()
}

/// Kernel arguments of [`count_runs`].
#[derive(Clone, Copy)]
#[repr(C)]
struct CountArgs {
    gate: *const AtomicU32,
    started: *const AtomicU32,
    runs: *const AtomicU32,
}

/// Counts the dispatch's run and every start, then waits until `*gate != 0` (bounded).
fn count_runs(group: &WorkGroup) {
    // SAFETY: dispatches of this kernel pass CountArgs pointing at live atomics.
    let args: CountArgs = unsafe { group.kernargs() };
    // SAFETY: as above.
    let (gate, started, runs) = unsafe { (&*args.gate, &*args.started, &*args.runs) };
    runs.fetch_add(1, Ordering::AcqRel);
    started.fetch_add(1, Ordering::AcqRel);
    let deadline = Instant::now() + PROMPT;
    while gate.load(Ordering::Acquire) == 0 && Instant::now() < deadline {
        std::thread::yield_now();
    }
}

#[test]
fn a_full_ring_of_running_dispatches_does_not_start_its_first_packet_again() {
    // With as many dispatches running as the ring has slots, the slot after the last one is
    // the slot of the first, which is still valid (it is handed back once the dispatches
    // completed): it must not be taken for a new packet.
    let (hsa, _session) = open_overlapping();
    let kernel = register_kernel("overlap_count_runs", count_runs);
    let gpu = hsa.gpu_agents().unwrap()[0];
    let queue = hsa.queue_create(gpu, 4).unwrap();
    // SAFETY: a live queue.
    let size = unsafe { (*queue).size } as usize;
    let gate = AtomicU32::new(0);
    let started = AtomicU32::new(0);
    let runs: Vec<AtomicU32> = (0..size).map(|_| AtomicU32::new(0)).collect();
    let mut args: Vec<CountArgs> = runs
        .iter()
        .map(|r| CountArgs {
            gate: &gate,
            started: &started,
            runs: r,
        })
        .collect();
    let done = hsa.signal_create(size as i64).unwrap();
    for a in &mut args {
        let mut dispatch = Dispatch::linear(kernel, 1, 1, std::ptr::from_mut(a).cast(), done);
        dispatch.barrier = false;
        // SAFETY: a live queue; the arguments outlive the dispatches (waited for below).
        unsafe { hsa.submit(queue, &kreplay_softhsa::testing::dispatch_packet(&dispatch)) };
    }
    let deadline = Instant::now() + PROMPT;
    while started.load(Ordering::Acquire) < size as u32 {
        assert!(Instant::now() < deadline, "the dispatches started");
        std::thread::yield_now();
    }
    // Give a wrongly started extra dispatch the time to show itself before the gate opens.
    let look = Instant::now() + Duration::from_millis(50);
    while Instant::now() < look && started.load(Ordering::Acquire) == size as u32 {
        std::thread::yield_now();
    }
    gate.store(1, Ordering::Release);
    assert!(hsa.wait_zero(done, PROMPT));
    let counts: Vec<u32> = runs.iter().map(|r| r.load(Ordering::Acquire)).collect();
    assert_eq!(counts, vec![1; size], "each dispatch ran exactly once");
    // SAFETY: created above; every dispatch completed.
    unsafe { hsa.queue_destroy(queue) }.unwrap();
    assert_eq!(hsa.signal_load(done), 0);
}
