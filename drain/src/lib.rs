//! Waiting until an agent's queues and asynchronous copies are idle, with one deadline and typed
//! "stuck" outcomes instead of hangs.
//!
//! Before kernel replay snapshots an agent's memory, nothing else may be running on that agent:
//! [`drain_agent`] waits for the dispatch's own queue, then every sibling queue on the agent, then
//! every in-flight asynchronous copy, all within one [`DrainConfig::timeout`]. After each pass,
//! [`wait_pass`] waits for the pass's completion and for every completion handler it triggered.
//!
//! The crate knows nothing about any device runtime. A backend describes what it has through
//! three small traits: [`QueueView`] (a queue that can say whether it is idle),
//! [`AsyncCopyTracker`] (a count of copies in flight) and [`PassCompletion`] (one pass's
//! completion and its pending handlers). [`InFlightCounter`] is a ready-made tracker with a
//! blocking wait.
//!
//! # Example
//!
//! ```
//! use kreplay_drain::{drain_agent, AgentStuck, DrainConfig, DrainStuck, InFlightCounter, QueueView};
//! use std::sync::atomic::{AtomicBool, Ordering};
//! use std::time::Duration;
//!
//! struct Queue { id: u64, busy: AtomicBool }
//! impl QueueView for Queue {
//!     fn id(&self) -> u64 { self.id }
//!     fn is_idle(&self) -> bool { !self.busy.load(Ordering::Acquire) }
//! }
//!
//! let own = Queue { id: 1, busy: AtomicBool::new(false) };
//! let sibling = Queue { id: 2, busy: AtomicBool::new(false) };
//! let copies = InFlightCounter::new();
//! let config = DrainConfig::default();
//!
//! let report = drain_agent(&own, &[&own, &sibling], &[&copies], &config).unwrap();
//! assert_eq!(report.queues_checked, 2); // the own queue is not checked twice
//!
//! // A copy that never completes is reported, not waited on forever.
//! copies.start();
//! let quick = DrainConfig::new(Duration::from_millis(5));
//! let stuck = drain_agent(&own, &[&sibling], &[&copies], &quick).unwrap_err();
//! assert_eq!(stuck.reason(), "agent_drain_stuck");
//! assert!(matches!(
//!     stuck,
//!     DrainStuck::Agent(ref s) if s.stuck == AgentStuck::AsyncCopies { in_flight: 1 }
//! ));
//! copies.finish();
//! assert!(drain_agent(&own, &[&sibling], &[&copies], &quick).is_ok());
//! ```
//!
//! # Waiting strategy
//!
//! Unless a backend provides its own blocking wait through a trait hook (`wait_idle`,
//! `wait_complete`, `wait_handlers`, e.g. a wait on a completion signal), waiting follows
//! [`WaitStrategy::DEFAULT`]:
//!
//! 1. spin for a bounded number of checks (256), with [`std::hint::spin_loop`] between them,
//!    which catches work finishing within microseconds at no scheduling cost;
//! 2. then give the core away with [`std::thread::yield_now`] for a bounded number of checks (32);
//! 3. then sleep between checks with exponential backoff, starting at 10 µs and capped at 1 ms,
//!    so a long wait costs almost no CPU and still notices completion within about 1 ms.
//!
//! The deadline is checked before every step and each sleep is cut short at the deadline, so a
//! wait returns at most about one check past it. The condition is checked once more at the
//! deadline before giving up.
//!
//! Every wait first checks the plain condition (`is_idle`, `in_flight() == 0`, ...) and only
//! calls a hook when that finds work outstanding, so draining idle queues costs one check each.

use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

/// Default drain budget: 10 seconds.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

/// How to wait for a condition without a backend-provided blocking wait.
///
/// See the [crate docs](crate#waiting-strategy).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct WaitStrategy {
    /// Checks made with a spin-loop hint between them.
    pub spins: u32,
    /// Checks made after yielding the thread, once spinning is over.
    pub yields: u32,
    /// First sleep between checks once yielding is over.
    pub first_sleep: Duration,
    /// Longest sleep between checks (the backoff doubles up to this).
    pub max_sleep: Duration,
}

impl WaitStrategy {
    /// The strategy used by the trait hooks' default implementations.
    pub const DEFAULT: WaitStrategy = WaitStrategy {
        spins: 256,
        yields: 32,
        first_sleep: Duration::from_micros(10),
        max_sleep: Duration::from_millis(1),
    };

    /// Waits until `done()` returns true (returns true) or `deadline` passes (returns false).
    ///
    /// Returns false only once `Instant::now() >= deadline` and a last check failed.
    pub fn wait_until(&self, deadline: Instant, mut done: impl FnMut() -> bool) -> bool {
        if done() {
            return true;
        }
        let mut spins = 0;
        let mut yields = 0;
        let mut sleep = self.first_sleep;
        loop {
            let now = Instant::now();
            if now >= deadline {
                return done();
            }
            if spins < self.spins {
                spins += 1;
                std::hint::spin_loop();
            } else if yields < self.yields {
                yields += 1;
                std::thread::yield_now();
            } else {
                std::thread::sleep(sleep.min(deadline - now));
                sleep = sleep.saturating_mul(2).min(self.max_sleep);
            }
            if done() {
                return true;
            }
        }
    }
}

impl Default for WaitStrategy {
    fn default() -> Self {
        Self::DEFAULT
    }
}

/// A queue as the drain sees it.
pub trait QueueView {
    /// An identifier for reports (e.g. the backend's queue handle). Two views with the same id
    /// are the same queue.
    fn id(&self) -> u64;

    /// Whether the queue is idle right now: everything written to it has been processed and
    /// nothing is executing (e.g. read index == write index and no packet active).
    fn is_idle(&self) -> bool;

    /// Blocks until the queue is idle (true) or `deadline` passes (false).
    ///
    /// Called only after [`is_idle`](Self::is_idle) returned false. The default polls
    /// `is_idle` with [`WaitStrategy::DEFAULT`]; override it with a real blocking wait when the
    /// backend has one.
    fn wait_idle(&self, deadline: Instant) -> bool {
        WaitStrategy::DEFAULT.wait_until(deadline, || self.is_idle())
    }
}

/// The asynchronous copies in flight on an agent, counted from submission to completion.
pub trait AsyncCopyTracker {
    /// Copies submitted and not yet completed.
    fn in_flight(&self) -> usize;

    /// Blocks until no copy is in flight (true) or `deadline` passes (false).
    ///
    /// Called only after [`in_flight`](Self::in_flight) returned non-zero. The default polls
    /// with [`WaitStrategy::DEFAULT`].
    fn wait_idle(&self, deadline: Instant) -> bool {
        WaitStrategy::DEFAULT.wait_until(deadline, || self.in_flight() == 0)
    }
}

/// One replay pass as [`wait_pass`] sees it: its completion and the completion handlers it
/// triggered.
pub trait PassCompletion {
    /// Whether the pass's kernel has completed (e.g. its completion signal fired).
    fn is_complete(&self) -> bool;

    /// Completion handlers of this pass that have started or are due and have not finished.
    fn pending_handlers(&self) -> usize;

    /// Blocks until the pass is complete (true) or `deadline` passes (false).
    ///
    /// Called only after [`is_complete`](Self::is_complete) returned false. The default polls
    /// with [`WaitStrategy::DEFAULT`].
    fn wait_complete(&self, deadline: Instant) -> bool {
        WaitStrategy::DEFAULT.wait_until(deadline, || self.is_complete())
    }

    /// Blocks until no handler is pending (true) or `deadline` passes (false).
    ///
    /// Called only after [`pending_handlers`](Self::pending_handlers) returned non-zero. The
    /// default polls with [`WaitStrategy::DEFAULT`].
    fn wait_handlers(&self, deadline: Instant) -> bool {
        WaitStrategy::DEFAULT.wait_until(deadline, || self.pending_handlers() == 0)
    }

    /// Why the pass can never complete, once that is known (the queue it runs on failed, so
    /// its completion will not come): [`wait_pass_patiently`] then stops waiting, unless
    /// [`is_complete`](Self::is_complete) says the pass completed after all. Asked only while
    /// the pass has not completed. `None` (the default): it may still complete.
    fn failed(&self) -> Option<String> {
        None
    }
}

/// Budgets for draining.
///
/// `#[non_exhaustive]`: built with [`DrainConfig::new`] (or `default`) and
/// [`with_pass_timeout`](DrainConfig::with_pass_timeout).
///
/// ```
/// use std::time::Duration;
/// use kreplay_drain::DrainConfig;
///
/// let config = DrainConfig::new(Duration::from_secs(2)).with_pass_timeout(Duration::from_secs(30));
/// assert_eq!(config.timeout, Duration::from_secs(2));
/// ```
///
/// ```compile_fail
/// use std::time::Duration;
/// use kreplay_drain::DrainConfig;
///
/// let config = DrainConfig { timeout: Duration::from_secs(2), pass_timeout: Duration::from_secs(30) };
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct DrainConfig {
    /// Budget for one [`drain_agent`] call (own queue, siblings and copies together).
    pub timeout: Duration,
    /// Budget for one [`wait_pass`] call (completion and handlers together). For
    /// [`wait_pass_patiently`], which never gives up on a running pass, the time before the
    /// first warning about a long pass (later ones come at doubling gaps,
    /// [`next_warning_gap`]).
    pub pass_timeout: Duration,
}

impl DrainConfig {
    /// Both budgets set to `timeout`.
    pub const fn new(timeout: Duration) -> Self {
        DrainConfig {
            timeout,
            pass_timeout: timeout,
        }
    }

    /// Both budgets set to `ms` milliseconds (the unit of `KREPLAY_DRAIN_TIMEOUT_MS`).
    pub const fn from_timeout_ms(ms: u64) -> Self {
        Self::new(Duration::from_millis(ms))
    }

    /// This configuration with a different pass budget.
    pub const fn with_pass_timeout(self, pass_timeout: Duration) -> Self {
        DrainConfig {
            pass_timeout,
            ..self
        }
    }
}

impl Default for DrainConfig {
    /// [`DEFAULT_TIMEOUT`] for both budgets.
    fn default() -> Self {
        Self::new(DEFAULT_TIMEOUT)
    }
}

/// What a successful [`drain_agent`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct DrainReport {
    /// Queues checked: the own queue plus each distinct sibling.
    pub queues_checked: usize,
    /// Async-copy trackers checked.
    pub copy_trackers_checked: usize,
    /// How many of those were busy at first look and had to be waited for.
    pub waited_on: usize,
    /// Time the whole drain took.
    pub elapsed: Duration,
}

/// What a successful [`wait_pass`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct PassReport {
    /// Whether the pass was still running at first look.
    pub waited_for_completion: bool,
    /// Handlers pending at first look after completion.
    pub handlers_waited_on: usize,
    /// Time the whole wait took.
    pub elapsed: Duration,
}

/// A pass [`wait_pass_patiently`] stopped waiting for: its completion can never come.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct PassNeverCompletes {
    /// Why ([`PassCompletion::failed`]).
    pub why: String,
    /// Time waited before that was known.
    pub waited: Duration,
}

/// `at + wait`, or a time so far ahead it never comes where that is past what an `Instant`
/// holds (a timeout of `Duration::MAX` means no limit).
fn later(at: Instant, wait: Duration) -> Instant {
    at.checked_add(wait)
        .or_else(|| at.checked_add(FOREVER))
        .unwrap_or(at)
}

/// What [`later`] waits where the time asked for is past what an `Instant` holds: about a
/// century.
const FOREVER: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// The longest gap between two warnings about one long wait, unless the first interval is
/// longer still.
pub const MAX_WARNING_GAP: Duration = Duration::from_secs(60);

/// The gap before the next warning about a long wait, after one given `gap` after the last
/// (the first comes `interval` into the wait): twice as long, up to [`MAX_WARNING_GAP`] (or
/// `interval` where that is longer). A short interval (a drain timeout of a few milliseconds)
/// then warns a few times about a long pass, not once per interval for as long as it runs.
pub fn next_warning_gap(gap: Duration, interval: Duration) -> Duration {
    gap.saturating_mul(2).min(interval.max(MAX_WARNING_GAP))
}

/// How often [`wait_pass_patiently`] asks a running pass whether it failed.
const FAILURE_CHECK: Duration = Duration::from_millis(20);

/// The dispatch's own queue did not go idle in time (`queue_drain_stuck`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct QueueDrainStuck {
    /// The own queue's id.
    pub queue: u64,
    /// Time spent in the drain before giving up.
    pub waited: Duration,
}

impl QueueDrainStuck {
    /// The decline reason (docs/abi.md §4): `queue_drain_stuck`.
    pub fn reason(&self) -> &'static str {
        "queue_drain_stuck"
    }
}

impl fmt::Display for QueueDrainStuck {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: queue {:#x} did not go idle within {:?}",
            self.reason(),
            self.queue,
            self.waited
        )
    }
}

impl std::error::Error for QueueDrainStuck {}

/// What kept an agent from draining.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum AgentStuck {
    /// A sibling queue on the agent did not go idle.
    SiblingQueue {
        /// The sibling queue's id.
        queue: u64,
    },
    /// Asynchronous copies on the agent did not complete.
    AsyncCopies {
        /// Copies still in flight when the drain gave up.
        in_flight: usize,
    },
}

/// A sibling queue or an asynchronous copy did not go idle in time (`agent_drain_stuck`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct AgentDrainStuck {
    /// What was stuck.
    pub stuck: AgentStuck,
    /// Time spent in the drain before giving up.
    pub waited: Duration,
}

impl AgentDrainStuck {
    /// The decline reason (docs/abi.md §4): `agent_drain_stuck`.
    pub fn reason(&self) -> &'static str {
        "agent_drain_stuck"
    }
}

impl fmt::Display for AgentDrainStuck {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.stuck {
            AgentStuck::SiblingQueue { queue } => write!(
                f,
                "{}: sibling queue {queue:#x} did not go idle within {:?}",
                self.reason(),
                self.waited
            ),
            AgentStuck::AsyncCopies { in_flight } => write!(
                f,
                "{}: {in_flight} async cop{} still in flight after {:?}",
                self.reason(),
                if in_flight == 1 { "y" } else { "ies" },
                self.waited
            ),
        }
    }
}

impl std::error::Error for AgentDrainStuck {}

/// What kept a pass from finishing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum PassStuck {
    /// The pass's kernel did not complete.
    Completion,
    /// The kernel completed but some completion handlers did not finish.
    Handlers {
        /// Handlers still pending when the wait gave up.
        pending: usize,
    },
}

/// A pass's completion or its completion handlers did not finish in time (`pass_drain_stuck`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct PassDrainStuck {
    /// What was stuck.
    pub stuck: PassStuck,
    /// Time spent waiting before giving up.
    pub waited: Duration,
}

impl PassDrainStuck {
    /// The decline reason (docs/abi.md §4): `pass_drain_stuck`.
    pub fn reason(&self) -> &'static str {
        "pass_drain_stuck"
    }
}

impl fmt::Display for PassDrainStuck {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.stuck {
            PassStuck::Completion => write!(
                f,
                "{}: the pass did not complete within {:?}",
                self.reason(),
                self.waited
            ),
            PassStuck::Handlers { pending } => write!(
                f,
                "{}: {pending} completion handler(s) still pending after {:?}",
                self.reason(),
                self.waited
            ),
        }
    }
}

impl std::error::Error for PassDrainStuck {}

/// Why [`drain_agent`] failed.
///
/// `#[non_exhaustive]`: a match outside this crate needs a wildcard arm (or use
/// [`reason`](DrainStuck::reason) and [`waited`](DrainStuck::waited)).
///
/// ```compile_fail
/// use kreplay_drain::DrainStuck;
///
/// fn queue(stuck: DrainStuck) -> bool {
///     match stuck {
///         DrainStuck::Queue(_) => true,
///         DrainStuck::Agent(_) => false,
///     }
/// }
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum DrainStuck {
    /// The dispatch's own queue did not go idle.
    Queue(QueueDrainStuck),
    /// A sibling queue or async copies did not go idle.
    Agent(AgentDrainStuck),
}

impl DrainStuck {
    /// The decline reason (docs/abi.md §4): `queue_drain_stuck` or `agent_drain_stuck`.
    pub fn reason(&self) -> &'static str {
        match self {
            DrainStuck::Queue(s) => s.reason(),
            DrainStuck::Agent(s) => s.reason(),
        }
    }

    /// Time spent in the drain before giving up.
    pub fn waited(&self) -> Duration {
        match self {
            DrainStuck::Queue(s) => s.waited,
            DrainStuck::Agent(s) => s.waited,
        }
    }
}

impl fmt::Display for DrainStuck {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DrainStuck::Queue(s) => s.fmt(f),
            DrainStuck::Agent(s) => s.fmt(f),
        }
    }
}

impl std::error::Error for DrainStuck {}

impl From<QueueDrainStuck> for DrainStuck {
    fn from(s: QueueDrainStuck) -> Self {
        DrainStuck::Queue(s)
    }
}

impl From<AgentDrainStuck> for DrainStuck {
    fn from(s: AgentDrainStuck) -> Self {
        DrainStuck::Agent(s)
    }
}

fn queue_drained(queue: &dyn QueueView, deadline: Instant, waited_on: &mut usize) -> bool {
    if queue.is_idle() {
        return true;
    }
    *waited_on += 1;
    queue.wait_idle(deadline)
}

/// Waits until `own_queue`, then every queue in `siblings`, then every tracker in `copies` is
/// idle, all within `config.timeout`.
///
/// `siblings` may include `own_queue` (or repeat a queue): a queue whose id was already checked
/// is skipped. Stops at the first queue or tracker that does not go idle by the deadline.
pub fn drain_agent(
    own_queue: &dyn QueueView,
    siblings: &[&dyn QueueView],
    copies: &[&dyn AsyncCopyTracker],
    config: &DrainConfig,
) -> Result<DrainReport, DrainStuck> {
    let start = Instant::now();
    let deadline = later(start, config.timeout);
    let mut waited_on = 0;

    if !queue_drained(own_queue, deadline, &mut waited_on) {
        return Err(DrainStuck::Queue(QueueDrainStuck {
            queue: own_queue.id(),
            waited: start.elapsed(),
        }));
    }

    // Distinct ids checked so far; agents have few queues, so a linear scan is cheapest.
    let mut checked: Vec<u64> = Vec::with_capacity(siblings.len() + 1);
    checked.push(own_queue.id());
    for sibling in siblings {
        let id = sibling.id();
        if checked.contains(&id) {
            continue;
        }
        checked.push(id);
        if !queue_drained(*sibling, deadline, &mut waited_on) {
            return Err(DrainStuck::Agent(AgentDrainStuck {
                stuck: AgentStuck::SiblingQueue { queue: id },
                waited: start.elapsed(),
            }));
        }
    }

    for tracker in copies {
        if tracker.in_flight() == 0 {
            continue;
        }
        waited_on += 1;
        if !tracker.wait_idle(deadline) {
            return Err(DrainStuck::Agent(AgentDrainStuck {
                stuck: AgentStuck::AsyncCopies {
                    in_flight: tracker.in_flight(),
                },
                waited: start.elapsed(),
            }));
        }
    }

    Ok(DrainReport {
        queues_checked: checked.len(),
        copy_trackers_checked: copies.len(),
        waited_on,
        elapsed: start.elapsed(),
    })
}

/// Waits until `pass` has completed and all its completion handlers have finished, within
/// `config.pass_timeout`.
pub fn wait_pass(
    pass: &dyn PassCompletion,
    config: &DrainConfig,
) -> Result<PassReport, PassDrainStuck> {
    let start = Instant::now();
    let deadline = later(start, config.pass_timeout);

    let waited_for_completion = !pass.is_complete();
    if waited_for_completion && !pass.wait_complete(deadline) {
        return Err(PassDrainStuck {
            stuck: PassStuck::Completion,
            waited: start.elapsed(),
        });
    }

    let handlers_waited_on = pass.pending_handlers();
    if handlers_waited_on > 0 && !pass.wait_handlers(deadline) {
        return Err(PassDrainStuck {
            stuck: PassStuck::Handlers {
                pending: pass.pending_handlers(),
            },
            waited: start.elapsed(),
        });
    }

    Ok(PassReport {
        waited_for_completion,
        handlers_waited_on,
        elapsed: start.elapsed(),
    })
}

/// Waits until `pass` has completed and all its completion handlers have finished, however
/// long that takes: a running pass is never abandoned (its late writes would land after the
/// application was told it was done). When `config.pass_timeout` passes without the pass
/// finishing, `on_slow` is called with the time waited so far (a backend warns there) and the
/// wait goes on, calling it again after twice that gap each time ([`next_warning_gap`]). The one exception is a pass whose completion can never come
/// ([`PassCompletion::failed`], asked every few milliseconds while the pass has not completed):
/// the wait ends with why. A pass found complete is complete whatever `failed` says, and the
/// handlers of a completed pass are waited for however its queue fares since.
pub fn wait_pass_patiently(
    pass: &dyn PassCompletion,
    config: &DrainConfig,
    on_slow: &mut dyn FnMut(Duration),
) -> Result<PassReport, PassNeverCompletes> {
    let start = Instant::now();
    let interval = config.pass_timeout.max(Duration::from_millis(1));
    let mut gap = interval;
    let mut next_warning = later(start, interval);
    // `completing`: waiting for the pass's completion, which a failure ends. Its handlers,
    // once it completed, are waited for whatever its queue does since.
    let mut patiently =
        |done: &dyn Fn(Instant) -> bool, completing: bool| -> Result<(), PassNeverCompletes> {
            loop {
                if completing && let Some(why) = pass.failed() {
                    // A pass that completed meanwhile did: its queue failing after it (a later
                    // packet) says nothing about it.
                    if pass.is_complete() {
                        return Ok(());
                    }
                    return Err(PassNeverCompletes {
                        why,
                        waited: start.elapsed(),
                    });
                }
                if done(later(Instant::now(), FAILURE_CHECK).min(next_warning)) {
                    return Ok(());
                }
                if Instant::now() >= next_warning {
                    on_slow(start.elapsed());
                    gap = next_warning_gap(gap, interval);
                    next_warning = later(Instant::now(), gap);
                }
            }
        };
    let waited_for_completion = !pass.is_complete();
    if waited_for_completion {
        patiently(&|deadline| pass.wait_complete(deadline), true)?;
    }
    let handlers_waited_on = pass.pending_handlers();
    if handlers_waited_on > 0 {
        patiently(&|deadline| pass.wait_handlers(deadline), false)?;
    }
    Ok(PassReport {
        waited_for_completion,
        handlers_waited_on,
        elapsed: start.elapsed(),
    })
}

/// A count of operations in flight (async copies, completion handlers) with a blocking wait for
/// zero.
///
/// [`start`](Self::start) when an operation is submitted, [`finish`](Self::finish) when it has
/// completed (e.g. from its completion callback). Counting costs one atomic operation; waiters
/// block on a condition variable, and `finish` only touches it when someone is waiting.
/// Implements [`AsyncCopyTracker`] with that blocking wait.
#[derive(Debug, Default)]
pub struct InFlightCounter {
    count: AtomicUsize,
    waiters: AtomicUsize,
    lock: Mutex<()>,
    zero: Condvar,
}

impl InFlightCounter {
    /// A counter at zero.
    pub const fn new() -> Self {
        InFlightCounter {
            count: AtomicUsize::new(0),
            waiters: AtomicUsize::new(0),
            lock: Mutex::new(()),
            zero: Condvar::new(),
        }
    }

    /// One more operation in flight.
    pub fn start(&self) {
        self.count.fetch_add(1, Ordering::SeqCst);
    }

    /// One operation completed. A `finish` without a matching `start` is ignored (the count
    /// never goes below zero).
    pub fn finish(&self) {
        let previous = self
            .count
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1));
        if previous == Ok(1) && self.waiters.load(Ordering::SeqCst) > 0 {
            // Taking the lock orders this wake-up after a waiter's check-then-wait, so it is
            // never lost.
            let _guard = self.lock.lock().unwrap_or_else(|e| e.into_inner());
            self.zero.notify_all();
        }
    }

    /// Operations in flight now.
    pub fn count(&self) -> usize {
        self.count.load(Ordering::SeqCst)
    }

    /// Blocks until the count is zero (true) or `deadline` passes (false).
    pub fn wait_zero(&self, deadline: Instant) -> bool {
        if self.count() == 0 {
            return true;
        }
        self.waiters.fetch_add(1, Ordering::SeqCst);
        let mut guard = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        let idle = loop {
            if self.count() == 0 {
                break true;
            }
            let now = Instant::now();
            if now >= deadline {
                break false;
            }
            guard = self
                .zero
                .wait_timeout(guard, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        };
        drop(guard);
        self.waiters.fetch_sub(1, Ordering::SeqCst);
        idle
    }
}

impl AsyncCopyTracker for InFlightCounter {
    fn in_flight(&self) -> usize {
        self.count()
    }

    fn wait_idle(&self, deadline: Instant) -> bool {
        self.wait_zero(deadline)
    }
}

#[cfg(test)]
mod tests;

/// The README's example, compiled and run as a doctest so that it cannot go stale.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
