use super::*;

use std::sync::atomic::AtomicBool;
use std::sync::mpsc;
use std::thread;

/// Upper bound for anything expected to happen; never reached in a passing run.
const LONG: Duration = Duration::from_secs(10);
/// Deadline used for drains that are expected to get stuck.
const SHORT: Duration = Duration::from_millis(50);

/// A queue whose idleness the test controls, counting how it is consulted.
struct TestQueue {
    id: u64,
    idle: AtomicBool,
    checks: AtomicUsize,
    /// Told (once) when the queue is checked while busy: the drain is waiting on it.
    waiting: Mutex<Option<mpsc::Sender<()>>>,
}

impl TestQueue {
    fn new(id: u64, idle: bool) -> Self {
        TestQueue {
            id,
            idle: AtomicBool::new(idle),
            checks: AtomicUsize::new(0),
            waiting: Mutex::new(None),
        }
    }

    /// A busy queue that reports on `tx` when a drain first finds it busy.
    fn busy_reporting(id: u64, tx: mpsc::Sender<()>) -> Self {
        let q = Self::new(id, false);
        *q.waiting.lock().unwrap() = Some(tx);
        q
    }

    fn checks(&self) -> usize {
        self.checks.load(Ordering::SeqCst)
    }
}

impl QueueView for TestQueue {
    fn id(&self) -> u64 {
        self.id
    }

    fn is_idle(&self) -> bool {
        self.checks.fetch_add(1, Ordering::SeqCst);
        let idle = self.idle.load(Ordering::SeqCst);
        if !idle && let Some(tx) = self.waiting.lock().unwrap().take() {
            let _ = tx.send(());
        }
        idle
    }
}

/// A queue that never looks idle by polling but has a blocking wait that says it is.
struct SignalQueue {
    id: u64,
    hook_calls: AtomicUsize,
}

impl QueueView for SignalQueue {
    fn id(&self) -> u64 {
        self.id
    }

    fn is_idle(&self) -> bool {
        false
    }

    fn wait_idle(&self, _deadline: Instant) -> bool {
        self.hook_calls.fetch_add(1, Ordering::SeqCst);
        true
    }
}

/// A copy tracker with a fixed count (polled through the default wait).
struct FixedCopies(usize);

impl AsyncCopyTracker for FixedCopies {
    fn in_flight(&self) -> usize {
        self.0
    }
}

/// A pass whose completion and handlers the test controls; handlers use a blocking counter.
struct TestPass {
    complete: AtomicBool,
    handlers: InFlightCounter,
    complete_hook_calls: AtomicUsize,
    handler_hook_calls: AtomicUsize,
}

impl TestPass {
    fn new(complete: bool, handlers: usize) -> Self {
        let pass = TestPass {
            complete: AtomicBool::new(complete),
            handlers: InFlightCounter::new(),
            complete_hook_calls: AtomicUsize::new(0),
            handler_hook_calls: AtomicUsize::new(0),
        };
        for _ in 0..handlers {
            pass.handlers.start();
        }
        pass
    }
}

impl PassCompletion for TestPass {
    fn is_complete(&self) -> bool {
        self.complete.load(Ordering::SeqCst)
    }

    fn pending_handlers(&self) -> usize {
        self.handlers.count()
    }

    fn wait_complete(&self, deadline: Instant) -> bool {
        self.complete_hook_calls.fetch_add(1, Ordering::SeqCst);
        WaitStrategy::DEFAULT.wait_until(deadline, || self.is_complete())
    }

    fn wait_handlers(&self, deadline: Instant) -> bool {
        self.handler_hook_calls.fetch_add(1, Ordering::SeqCst);
        self.handlers.wait_zero(deadline)
    }
}

/// Waits (bounded) until some thread is blocked in `counter.wait_zero`.
fn until_someone_waits_on(counter: &InFlightCounter) {
    let deadline = Instant::now() + LONG;
    assert!(
        WaitStrategy::DEFAULT.wait_until(deadline, || counter.waiters.load(Ordering::SeqCst) > 0),
        "nobody started waiting on the counter"
    );
}

fn assert_waited_full_deadline(waited: Duration, started: Instant) {
    let elapsed = started.elapsed();
    assert!(
        waited >= SHORT,
        "gave up after {waited:?}, before the deadline"
    );
    assert!(
        elapsed >= SHORT,
        "returned after {elapsed:?}, before the deadline"
    );
    assert!(elapsed < Duration::from_secs(5), "took {elapsed:?}");
}

#[test]
fn idle_queues_and_copies_drain_at_once() {
    let own = TestQueue::new(1, true);
    let siblings: Vec<TestQueue> = (2..5).map(|id| TestQueue::new(id, true)).collect();
    let sibling_refs: Vec<&dyn QueueView> = siblings.iter().map(|q| q as &dyn QueueView).collect();
    let copies = InFlightCounter::new();

    let report = drain_agent(&own, &sibling_refs, &[&copies], &DrainConfig::default()).unwrap();

    assert_eq!(report.queues_checked, 4);
    assert_eq!(report.copy_trackers_checked, 1);
    assert_eq!(report.waited_on, 0);
    assert_eq!(own.checks(), 1);
    for q in &siblings {
        assert_eq!(q.checks(), 1, "queue {} checked more than once", q.id);
    }
    assert!(report.elapsed < LONG);
}

#[test]
fn own_queue_listed_among_siblings_is_checked_once() {
    let own = TestQueue::new(1, true);
    let sibling = TestQueue::new(2, true);
    let report = drain_agent(
        &own,
        &[&own, &sibling, &sibling],
        &[],
        &DrainConfig::default(),
    )
    .unwrap();
    assert_eq!(report.queues_checked, 2);
    assert_eq!(own.checks(), 1);
    assert_eq!(sibling.checks(), 1);
}

#[test]
fn busy_sibling_that_finishes_is_drained() {
    let (tx, rx) = mpsc::channel();
    let own = TestQueue::new(1, true);
    let sibling = TestQueue::busy_reporting(2, tx);
    let started = Instant::now();
    let report = thread::scope(|s| {
        let finishing = &sibling;
        s.spawn(move || {
            // Finish the sibling's work only once the drain is seen waiting on it.
            rx.recv_timeout(LONG)
                .expect("drain never checked the sibling");
            finishing.idle.store(true, Ordering::SeqCst);
        });
        drain_agent(&own, &[&sibling], &[], &DrainConfig::new(LONG))
    })
    .expect("a sibling that went idle was reported stuck");
    assert_eq!(report.queues_checked, 2);
    assert_eq!(report.waited_on, 1);
    assert!(sibling.checks() >= 2);
    assert!(started.elapsed() < LONG);
}

#[test]
fn in_flight_copies_that_complete_are_drained() {
    let own = TestQueue::new(1, true);
    let copies = InFlightCounter::new();
    copies.start();
    copies.start();
    let report = thread::scope(|s| {
        s.spawn(|| {
            until_someone_waits_on(&copies);
            copies.finish();
            copies.finish();
        });
        drain_agent(&own, &[], &[&copies], &DrainConfig::new(LONG))
    })
    .expect("copies that completed were reported stuck");
    assert_eq!(report.waited_on, 1);
    assert_eq!(copies.count(), 0);
}

#[test]
fn stuck_own_queue_is_queue_drain_stuck_at_the_deadline() {
    let own = TestQueue::new(7, false);
    let sibling = TestQueue::new(8, true);
    let copies = FixedCopies(0);
    let started = Instant::now();
    let err = drain_agent(&own, &[&sibling], &[&copies], &DrainConfig::new(SHORT)).unwrap_err();
    match err {
        DrainStuck::Queue(QueueDrainStuck { queue, waited }) => {
            assert_eq!(queue, 7);
            assert_waited_full_deadline(waited, started);
        }
        other => panic!("expected the own queue to be stuck, got {other:?}"),
    }
    assert_eq!(err.reason(), "queue_drain_stuck");
    assert_eq!(
        sibling.checks(),
        0,
        "siblings checked after the own queue got stuck"
    );
    assert!(err.to_string().contains("queue_drain_stuck"));
}

#[test]
fn stuck_sibling_is_agent_drain_stuck_naming_the_sibling() {
    let own = TestQueue::new(1, true);
    let good = TestQueue::new(2, true);
    let stuck = TestQueue::new(3, false);
    let copies = InFlightCounter::new();
    copies.start();
    let started = Instant::now();
    let err =
        drain_agent(&own, &[&good, &stuck], &[&copies], &DrainConfig::new(SHORT)).unwrap_err();
    match err {
        DrainStuck::Agent(AgentDrainStuck {
            stuck: AgentStuck::SiblingQueue { queue },
            waited,
        }) => {
            assert_eq!(queue, 3);
            assert_waited_full_deadline(waited, started);
        }
        other => panic!("expected a stuck sibling, got {other:?}"),
    }
    assert_eq!(err.reason(), "agent_drain_stuck");
    assert_eq!(
        err.waited(),
        match err {
            DrainStuck::Agent(s) => s.waited,
            DrainStuck::Queue(s) => s.waited,
        }
    );
}

#[test]
fn stuck_copies_are_agent_drain_stuck_with_the_count() {
    let own = TestQueue::new(1, true);
    let sibling = TestQueue::new(2, true);
    let polled = FixedCopies(0);
    let blocking = InFlightCounter::new();
    blocking.start();
    blocking.start();
    let started = Instant::now();
    let err = drain_agent(
        &own,
        &[&sibling],
        &[&polled, &blocking],
        &DrainConfig::new(SHORT),
    )
    .unwrap_err();
    match err {
        DrainStuck::Agent(AgentDrainStuck {
            stuck: AgentStuck::AsyncCopies { in_flight },
            waited,
        }) => {
            assert_eq!(in_flight, 2);
            assert_waited_full_deadline(waited, started);
        }
        other => panic!("expected stuck copies, got {other:?}"),
    }
    assert_eq!(err.reason(), "agent_drain_stuck");

    // The polling default wait gives up at the deadline too.
    let started = Instant::now();
    let err = drain_agent(&own, &[], &[&FixedCopies(1)], &DrainConfig::new(SHORT)).unwrap_err();
    assert_eq!(
        err,
        DrainStuck::Agent(AgentDrainStuck {
            stuck: AgentStuck::AsyncCopies { in_flight: 1 },
            waited: err.waited(),
        })
    );
    assert_waited_full_deadline(err.waited(), started);
}

#[test]
fn own_sibling_and_copy_stalls_give_distinct_outcomes() {
    let idle = TestQueue::new(1, true);
    let busy = TestQueue::new(2, false);
    let config = DrainConfig::new(Duration::from_millis(5));
    let own_stuck = drain_agent(&busy, &[&idle], &[], &config).unwrap_err();
    let sibling_stuck = drain_agent(&idle, &[&busy], &[], &config).unwrap_err();
    let copy_stuck = drain_agent(&idle, &[], &[&FixedCopies(3)], &config).unwrap_err();

    assert!(matches!(
        own_stuck,
        DrainStuck::Queue(QueueDrainStuck { queue: 2, .. })
    ));
    assert!(matches!(
        sibling_stuck,
        DrainStuck::Agent(AgentDrainStuck {
            stuck: AgentStuck::SiblingQueue { queue: 2 },
            ..
        })
    ));
    assert!(matches!(
        copy_stuck,
        DrainStuck::Agent(AgentDrainStuck {
            stuck: AgentStuck::AsyncCopies { in_flight: 3 },
            ..
        })
    ));
    assert_eq!(own_stuck.reason(), "queue_drain_stuck");
    assert_eq!(sibling_stuck.reason(), "agent_drain_stuck");
    assert_eq!(copy_stuck.reason(), "agent_drain_stuck");
    assert!(sibling_stuck.to_string().contains("sibling queue 0x2"));
    assert!(copy_stuck.to_string().contains("3 async copies"));
}

#[test]
fn queue_wait_hook_is_used_when_provided() {
    let own = SignalQueue {
        id: 1,
        hook_calls: AtomicUsize::new(0),
    };
    let sibling = SignalQueue {
        id: 2,
        hook_calls: AtomicUsize::new(0),
    };
    // Polling alone would never see these queues idle; their blocking waits say they are.
    let report = drain_agent(&own, &[&sibling], &[], &DrainConfig::new(SHORT)).unwrap();
    assert_eq!(own.hook_calls.load(Ordering::SeqCst), 1);
    assert_eq!(sibling.hook_calls.load(Ordering::SeqCst), 1);
    assert_eq!(report.waited_on, 2);
}

#[test]
fn completed_pass_without_handlers_returns_at_once() {
    let pass = TestPass::new(true, 0);
    let report = wait_pass(&pass, &DrainConfig::default()).unwrap();
    assert!(!report.waited_for_completion);
    assert_eq!(report.handlers_waited_on, 0);
    assert_eq!(pass.complete_hook_calls.load(Ordering::SeqCst), 0);
    assert_eq!(pass.handler_hook_calls.load(Ordering::SeqCst), 0);
}

#[test]
fn pass_waits_for_completion_then_handlers_through_the_hooks() {
    let pass = TestPass::new(false, 2);
    let (done_tx, done_rx) = mpsc::channel();
    let report = thread::scope(|s| {
        s.spawn(|| {
            // Complete once the pass wait is seen polling, then finish the handlers once the
            // wait is seen blocked on them.
            let deadline = Instant::now() + LONG;
            assert!(WaitStrategy::DEFAULT.wait_until(deadline, || {
                pass.complete_hook_calls.load(Ordering::SeqCst) > 0
            }));
            pass.complete.store(true, Ordering::SeqCst);
            until_someone_waits_on(&pass.handlers);
            pass.handlers.finish();
            pass.handlers.finish();
            done_tx.send(()).unwrap();
        });
        wait_pass(&pass, &DrainConfig::new(SHORT).with_pass_timeout(LONG))
    })
    .expect("a pass that finished was reported stuck");
    done_rx.try_recv().unwrap();
    assert!(report.waited_for_completion);
    assert_eq!(report.handlers_waited_on, 2);
    assert_eq!(pass.complete_hook_calls.load(Ordering::SeqCst), 1);
    assert_eq!(pass.handler_hook_calls.load(Ordering::SeqCst), 1);
}

#[test]
fn handler_that_never_finishes_is_pass_drain_stuck() {
    let pass = TestPass::new(true, 1);
    let started = Instant::now();
    let err = wait_pass(&pass, &DrainConfig::new(LONG).with_pass_timeout(SHORT)).unwrap_err();
    assert_eq!(err.stuck, PassStuck::Handlers { pending: 1 });
    assert_eq!(err.reason(), "pass_drain_stuck");
    assert_waited_full_deadline(err.waited, started);
    assert!(err.to_string().contains("pass_drain_stuck"));
}

#[test]
fn pass_that_never_completes_is_pass_drain_stuck_on_completion() {
    let pass = TestPass::new(false, 1);
    let started = Instant::now();
    let err = wait_pass(&pass, &DrainConfig::new(SHORT)).unwrap_err();
    assert_eq!(err.stuck, PassStuck::Completion);
    assert_eq!(err.reason(), "pass_drain_stuck");
    assert_waited_full_deadline(err.waited, started);
    assert_eq!(pass.handler_hook_calls.load(Ordering::SeqCst), 0);
}

#[test]
fn a_long_pass_is_waited_for_with_warnings_at_doubling_gaps_never_abandoned() {
    // The pass completes only after the third warning, its handler after the fifth: the wait
    // must still be there, and report success.
    let pass = TestPass::new(false, 1);
    let mut warnings: Vec<Duration> = Vec::new();
    let report = wait_pass_patiently(
        &pass,
        &DrainConfig::new(LONG).with_pass_timeout(SHORT),
        &mut |waited| {
            warnings.push(waited);
            match warnings.len() {
                3 => pass.complete.store(true, Ordering::SeqCst),
                5 => pass.handlers.finish(),
                _ => {}
            }
        },
    )
    .expect("completes");
    assert_eq!(warnings.len(), 5, "warnings until the pass finished");
    assert!(warnings.windows(2).all(|w| w[0] < w[1]), "{warnings:?}");
    assert!(
        warnings[0] >= SHORT,
        "the first warning comes after one interval"
    );
    assert!(report.waited_for_completion);
    assert_eq!(report.handlers_waited_on, 1);
    assert!(pass.is_complete() && pass.pending_handlers() == 0);
}

#[test]
fn a_finished_pass_is_not_warned_about() {
    let pass = TestPass::new(true, 0);
    let report = wait_pass_patiently(&pass, &DrainConfig::new(SHORT), &mut |_| {
        panic!("no warning for a pass that is done")
    })
    .expect("completes");
    assert!(!report.waited_for_completion);
}

#[test]
fn wait_until_stops_only_at_the_deadline() {
    let strategy = WaitStrategy::DEFAULT;
    assert!(strategy.wait_until(Instant::now() + LONG, || true));

    let started = Instant::now();
    let mut checks = 0u64;
    assert!(!strategy.wait_until(started + SHORT, || {
        checks += 1;
        false
    }));
    let elapsed = started.elapsed();
    assert!(elapsed >= SHORT);
    assert!(elapsed < Duration::from_secs(5));
    // Spinning and yielding are bounded: the rest of the wait sleeps with backoff, so the
    // number of checks stays far below a busy loop's.
    let bound = u64::from(strategy.spins + strategy.yields) + 2 * SHORT.as_micros() as u64 / 10;
    assert!(checks <= bound, "{checks} checks in {elapsed:?}");

    // A condition that becomes true during the sleeping phase is noticed.
    let mut n = 0;
    assert!(strategy.wait_until(Instant::now() + LONG, || {
        n += 1;
        n > 400
    }));
}

#[test]
fn in_flight_counter_counts_and_ignores_unmatched_finish() {
    let counter = InFlightCounter::new();
    counter.finish();
    assert_eq!(counter.count(), 0);
    counter.start();
    counter.start();
    assert_eq!(counter.in_flight(), 2);
    counter.finish();
    assert!(!counter.wait_zero(Instant::now()));
    counter.finish();
    assert!(counter.wait_zero(Instant::now()));
    assert_eq!(counter.waiters.load(Ordering::SeqCst), 0);
}

#[test]
fn drain_config_defaults_and_millisecond_mapping() {
    assert_eq!(DrainConfig::default().timeout, Duration::from_secs(10));
    assert_eq!(DrainConfig::default().pass_timeout, Duration::from_secs(10));
    let config = DrainConfig::from_timeout_ms(250);
    assert_eq!(config.timeout, Duration::from_millis(250));
    assert_eq!(config.pass_timeout, Duration::from_millis(250));
    let config = config.with_pass_timeout(Duration::from_secs(60));
    assert_eq!(config.timeout, Duration::from_millis(250));
    assert_eq!(config.pass_timeout, Duration::from_secs(60));
}

#[test]
fn in_flight_counter_wakes_a_blocked_waiter_promptly() {
    // Races a finisher against a waiter many times; a lost wake-up would leave the waiter
    // asleep until its (long) deadline.
    let counter = InFlightCounter::new();
    for _ in 0..200 {
        counter.start();
        let started = Instant::now();
        let idle = thread::scope(|s| {
            s.spawn(|| counter.finish());
            counter.wait_zero(started + LONG)
        });
        assert!(idle);
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "waiter missed the wake-up"
        );
    }
    assert_eq!(counter.count(), 0);
}

#[test]
fn a_pass_that_can_never_complete_ends_the_wait_with_why() {
    // A pass whose queue failed: its completion never comes. The wait must stop soon after
    // the failure is known, not wait (and warn) for ever.
    struct Failing {
        failed_at: Instant,
    }
    impl PassCompletion for Failing {
        fn is_complete(&self) -> bool {
            false
        }
        fn pending_handlers(&self) -> usize {
            0
        }
        fn failed(&self) -> Option<String> {
            (Instant::now() >= self.failed_at).then(|| "its queue failed".to_string())
        }
    }
    let pass = Failing {
        failed_at: Instant::now() + SHORT,
    };
    let mut warnings = 0;
    let ended = wait_pass_patiently(
        &pass,
        &DrainConfig::new(LONG).with_pass_timeout(LONG),
        &mut |_| warnings += 1,
    )
    .expect_err("the pass never completes");
    assert_eq!(ended.why, "its queue failed");
    assert!(ended.waited >= SHORT, "{:?}", ended.waited);
    assert!(
        ended.waited < LONG,
        "stopped within a few checks of the failure, not at the warning interval: {:?}",
        ended.waited
    );
    assert_eq!(warnings, 0);
}
