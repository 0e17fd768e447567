//! `plan_groups` on a long request list whose lower bound is unreachable: the exact search
//! recursed once per request, so its depth grew with the list until the stack overflowed; past
//! 64 requests first-fit stands. (Own file: a stack overflow aborts the whole test binary.)

use kreplay_passloop::{HardwareCounter, plan_groups};

fn hw(block: usize, id: u32) -> HardwareCounter {
    HardwareCounter { block, id }
}

/// 10,000 copies of one three-counter request of block 2 (they all share one pass), then four
/// requests over blocks 0 and 1 (limit 1 each) that need four passes although the per-block
/// lower bound says two. First-fit gives 4 passes; the search for 2 and 3 passes places all
/// 10,000 large requests before it meets the conflict.
#[test]
fn many_identical_requests_plus_a_conflict_do_not_overflow_the_stack() {
    // A thread with the standard library's default stack (2 MiB), as a profiler's worker has.
    let handle = std::thread::Builder::new()
        .name("planner".into())
        .spawn(|| {
            let mut requests: Vec<Vec<HardwareCounter>> = (0..10_000)
                .map(|_| vec![hw(2, 20), hw(2, 21), hw(2, 22)])
                .collect();
            requests.push(vec![hw(0, 0), hw(1, 10)]);
            requests.push(vec![hw(0, 1), hw(1, 11)]);
            requests.push(vec![hw(0, 0), hw(1, 11)]);
            requests.push(vec![hw(0, 1), hw(1, 10)]);
            plan_groups(&requests, &[1, 1, 3]).map(|g| g.len())
        })
        .unwrap();
    assert_eq!(handle.join().unwrap(), Ok(4));
}
