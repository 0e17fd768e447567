//! The drain with zero, huge and unbounded budgets (`Duration::MAX`): they wait or report, never
//! panic on the arithmetic of their deadlines.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use kreplay_drain::{
    DrainConfig, InFlightCounter, PassCompletion, QueueView, WaitStrategy, drain_agent, wait_pass,
    wait_pass_patiently,
};

struct Queue {
    id: u64,
    busy: Arc<AtomicBool>,
}
impl QueueView for Queue {
    fn id(&self) -> u64 {
        self.id
    }
    fn is_idle(&self) -> bool {
        !self.busy.load(Ordering::Acquire)
    }
}

struct Pass {
    complete: Arc<AtomicBool>,
    handlers: Arc<AtomicUsize>,
}
impl PassCompletion for Pass {
    fn is_complete(&self) -> bool {
        self.complete.load(Ordering::Acquire)
    }
    fn pending_handlers(&self) -> usize {
        self.handlers.load(Ordering::Acquire)
    }
}

/// Runs `body` on a thread and fails if it takes longer than `limit` (never hangs the suite).
fn bounded<T: Send + 'static>(limit: Duration, body: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(body));
        let _ = tx.send(result);
    });
    match rx.recv_timeout(limit) {
        Ok(Ok(value)) => value,
        Ok(Err(panic)) => std::panic::resume_unwind(panic),
        Err(_) => panic!("did not finish within {limit:?}"),
    }
}

/// "Wait as long as it takes": a caller that never wants a drain to give up passes the largest
/// duration. Idle queues must drain at once, and a queue that goes idle later must be waited for.
#[test]
fn an_unbounded_drain_timeout_waits_instead_of_panicking() {
    bounded(Duration::from_secs(20), || {
        let busy = Arc::new(AtomicBool::new(false));
        let own = Queue {
            id: 1,
            busy: busy.clone(),
        };
        let copies = InFlightCounter::new();
        let forever = DrainConfig::new(Duration::MAX);
        drain_agent(&own, &[], &[&copies], &forever).expect("idle queues drain");
    });
}

#[test]
fn an_unbounded_pass_timeout_waits_instead_of_panicking() {
    bounded(Duration::from_secs(20), || {
        let complete = Arc::new(AtomicBool::new(true));
        let handlers = Arc::new(AtomicUsize::new(0));
        let pass = Pass {
            complete: complete.clone(),
            handlers: handlers.clone(),
        };
        let forever = DrainConfig::new(Duration::from_secs(1)).with_pass_timeout(Duration::MAX);
        wait_pass(&pass, &forever).expect("a complete pass");
    });
}

#[test]
fn an_unbounded_warning_interval_waits_patiently_instead_of_panicking() {
    bounded(Duration::from_secs(20), || {
        let complete = Arc::new(AtomicBool::new(false));
        let handlers = Arc::new(AtomicUsize::new(0));
        let pass = Pass {
            complete: complete.clone(),
            handlers: handlers.clone(),
        };
        let finisher = {
            let complete = complete.clone();
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(30));
                complete.store(true, Ordering::Release);
            })
        };
        let forever = DrainConfig::new(Duration::from_secs(1)).with_pass_timeout(Duration::MAX);
        let mut warnings = 0;
        wait_pass_patiently(&pass, &forever, &mut |_| warnings += 1).expect("completes");
        finisher.join().unwrap();
        assert_eq!(warnings, 0);
    });
}

/// A zero budget is a valid configuration: idle work drains, busy work is reported at once.
#[test]
fn zero_budgets_report_instead_of_waiting() {
    bounded(Duration::from_secs(20), || {
        let busy = Arc::new(AtomicBool::new(true));
        let own = Queue {
            id: 9,
            busy: busy.clone(),
        };
        let zero = DrainConfig::new(Duration::ZERO);
        let started = Instant::now();
        let stuck = drain_agent(&own, &[], &[], &zero).unwrap_err();
        assert_eq!(stuck.reason(), "queue_drain_stuck");
        assert!(started.elapsed() < Duration::from_secs(1));
        busy.store(false, Ordering::Release);
        drain_agent(&own, &[&own], &[], &zero).unwrap();
        let pass = Pass {
            complete: Arc::new(AtomicBool::new(true)),
            handlers: Arc::new(AtomicUsize::new(2)),
        };
        assert_eq!(
            wait_pass(&pass, &zero).unwrap_err().reason(),
            "pass_drain_stuck"
        );
        let counter = InFlightCounter::new();
        counter.start();
        assert!(!counter.wait_zero(Instant::now()));
        counter.finish();
        assert!(counter.wait_zero(Instant::now()));
    });
}

/// A strategy tuned to sleep long between checks (fields are public) still returns at the
/// deadline and does not overflow its backoff.
#[test]
fn a_strategy_with_a_huge_first_sleep_returns_at_the_deadline() {
    bounded(Duration::from_secs(20), || {
        let mut strategy = WaitStrategy::DEFAULT;
        strategy.spins = 0;
        strategy.yields = 0;
        strategy.first_sleep = Duration::MAX;
        strategy.max_sleep = Duration::MAX;
        let started = Instant::now();
        let mut checks = 0;
        let done = strategy.wait_until(started + Duration::from_millis(20), || {
            checks += 1;
            false
        });
        assert!(!done);
        assert!(started.elapsed() < Duration::from_secs(5));
    });
}
