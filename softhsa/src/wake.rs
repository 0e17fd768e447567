//! Blocking without busy-waiting: threads register on the [`WakeList`]s of the objects they wait
//! for and park; whoever changes such an object calls [`WakeList::wake_all`].
//!
//! The protocol has no lost wake-ups: a waiter registers, issues a SeqCst fence, then checks its
//! condition and parks; a changer makes its change, issues a SeqCst fence, then reads the
//! registration count. Either the waiter sees the change or the changer sees the waiter, and
//! `Thread::unpark` before `park` makes that `park` return at once.
//!
//! Before it parks, a waiter may *poll* its condition for a short, bounded time (see
//! [`set_polling`]): a change that comes within that time is then seen without a wake-up, which
//! across CPUs (an idle CPU woken by an interrupt, a virtual CPU rescheduled by its host) costs
//! tens of microseconds, far more than the hand-off itself. Polling is what a GPU runtime does
//! too before it sleeps on a completion interrupt. A poller offers its CPU between rounds
//! (`sched_yield`), so a thread waiting for that CPU (often the one that will make the change)
//! runs at once instead of after the poll. Polling is bounded twice: in time (then the waiter
//! parks, so an idle process burns no CPU) and in the number of threads polling at once (at
//! most one per CPU the process may run on; the others park at once). On one CPU it is off:
//! there the change can only come once the poller gives the CPU up.

use parking_lot::Mutex;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering, fence};
use std::thread::{self, Thread};
use std::time::{Duration, Instant};

/// How long an `HSA_WAIT_STATE_ACTIVE` wait spins before it parks.
const ACTIVE_SPIN: Duration = Duration::from_micros(20);

/// How long a waiter polls before it parks, in nanoseconds (0: it parks at once).
static POLL_NANOS: AtomicU64 = AtomicU64::new(0);
/// At most this many threads poll at once.
static MAX_POLLERS: AtomicUsize = AtomicUsize::new(0);
/// Threads polling now.
static POLLERS: AtomicUsize = AtomicUsize::new(0);

/// Sets how long a waiter polls before it parks and how many may poll at once (a runtime
/// instance sets it when it starts; 0 for either turns polling off).
pub(crate) fn set_polling(poll: Duration, max_pollers: usize) {
    let nanos = u64::try_from(poll.as_nanos()).unwrap_or(u64::MAX);
    POLL_NANOS.store(nanos, Ordering::Relaxed);
    MAX_POLLERS.store(max_pollers, Ordering::Relaxed);
}

/// The CPUs this process may run on (its affinity mask, as the standard library reads it).
pub(crate) fn usable_cpus() -> usize {
    thread::available_parallelism().map_or(1, |n| n.get())
}

/// A place among the threads polling now; given back on drop.
struct PollSlot;

impl PollSlot {
    /// A place, unless polling is off or as many threads as allowed already poll.
    fn take() -> Option<PollSlot> {
        let max = MAX_POLLERS.load(Ordering::Relaxed);
        POLLERS
            .fetch_update(Ordering::AcqRel, Ordering::Relaxed, |n| {
                (n < max).then_some(n + 1)
            })
            .ok()
            .map(|_| PollSlot)
    }
}

impl Drop for PollSlot {
    fn drop(&mut self) {
        POLLERS.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Polls `poll` for up to the polling time set by [`set_polling`] (never past `deadline`), if a
/// place among the pollers is free; `None` when nothing came in that time (the caller parks).
pub(crate) fn poll_briefly<T>(
    deadline: Option<Instant>,
    mut poll: impl FnMut() -> Option<T>,
) -> Option<T> {
    let nanos = POLL_NANOS.load(Ordering::Relaxed);
    if nanos == 0 {
        return None;
    }
    let _slot = PollSlot::take()?;
    let mut end = Instant::now() + Duration::from_nanos(nanos);
    if let Some(deadline) = deadline {
        end = end.min(deadline);
    }
    loop {
        // Reading the clock costs more than a poll: look a few times between readings.
        for _ in 0..16 {
            std::hint::spin_loop();
            if let Some(done) = poll() {
                return Some(done);
            }
        }
        if Instant::now() >= end {
            return None;
        }
        // Offer the CPU between rounds: when the thread that will make the change waits for
        // this CPU (the scheduler placed both here, or other processes keep the other CPUs
        // busy), it runs now instead of after the poll; when nothing else waits, this returns
        // at once.
        thread::yield_now();
    }
}

static NEXT_TOKEN: AtomicU64 = AtomicU64::new(1);

/// The threads waiting for changes of one object.
#[derive(Default)]
pub(crate) struct WakeList {
    count: AtomicUsize,
    threads: Mutex<Vec<(u64, Thread)>>,
}

impl WakeList {
    /// Registers `thread`; it is unparked by every [`WakeList::wake_all`] until
    /// [`WakeList::unregister`] is called with the returned token.
    pub(crate) fn register_thread(&self, thread: Thread) -> u64 {
        let token = NEXT_TOKEN.fetch_add(1, Ordering::Relaxed);
        self.threads.lock().push((token, thread));
        self.count.fetch_add(1, Ordering::SeqCst);
        fence(Ordering::SeqCst);
        token
    }

    /// Removes a registration made by [`WakeList::register_thread`].
    pub(crate) fn unregister(&self, token: u64) {
        let mut threads = self.threads.lock();
        if let Some(pos) = threads.iter().position(|(t, _)| *t == token) {
            threads.swap_remove(pos);
            self.count.fetch_sub(1, Ordering::SeqCst);
        }
    }

    /// Registers the current thread for the life of the returned guard.
    pub(crate) fn register(&self) -> Registration<'_> {
        Registration {
            list: self,
            token: self.register_thread(thread::current()),
        }
    }

    /// Unparks every registered thread. Call after every change waiters may care about.
    pub(crate) fn wake_all(&self) {
        fence(Ordering::SeqCst);
        if self.count.load(Ordering::Relaxed) == 0 {
            return;
        }
        for (_, thread) in self.threads.lock().iter() {
            thread.unpark();
        }
    }
}

/// A registration of the current thread on a [`WakeList`], removed on drop.
pub(crate) struct Registration<'a> {
    list: &'a WakeList,
    token: u64,
}

impl Drop for Registration<'_> {
    fn drop(&mut self) {
        self.list.unregister(self.token);
    }
}

/// Blocks until `poll` returns `Some`, re-polling whenever one of `lists` is woken; gives up with
/// `None` once `deadline` has passed. With `spin`, polls in a tight loop for a short while first
/// (the `ACTIVE` wait state) before parking.
pub(crate) fn block_until<T>(
    lists: &[&WakeList],
    deadline: Option<Instant>,
    spin: bool,
    mut poll: impl FnMut() -> Option<T>,
) -> Option<T> {
    if let Some(done) = poll() {
        return Some(done);
    }
    if spin {
        let spin_end = Instant::now() + ACTIVE_SPIN;
        loop {
            std::hint::spin_loop();
            if let Some(done) = poll() {
                return Some(done);
            }
            let now = Instant::now();
            if deadline.is_some_and(|d| now >= d) {
                return None;
            }
            if now >= spin_end {
                break;
            }
        }
    } else if let Some(done) = poll_briefly(deadline, &mut poll) {
        return Some(done);
    }
    let _registrations: Vec<Registration<'_>> = lists.iter().map(|l| l.register()).collect();
    loop {
        if let Some(done) = poll() {
            return Some(done);
        }
        match deadline {
            None => thread::park(),
            Some(deadline) => {
                let now = Instant::now();
                if now >= deadline {
                    return None;
                }
                thread::park_timeout(deadline - now);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::AtomicBool;

    #[test]
    fn a_change_after_registration_wakes_the_waiter() {
        let list = Arc::new(WakeList::default());
        let flag = Arc::new(AtomicBool::new(false));
        let (l2, f2) = (list.clone(), flag.clone());
        let setter = thread::spawn(move || {
            f2.store(true, Ordering::SeqCst);
            l2.wake_all();
        });
        let deadline = Instant::now() + Duration::from_secs(5);
        let got = block_until(&[&list], Some(deadline), false, || {
            flag.load(Ordering::SeqCst).then_some(())
        });
        setter.join().unwrap();
        assert_eq!(got, Some(()));
        assert_eq!(list.count.load(Ordering::SeqCst), 0, "registration removed");
    }

    #[test]
    fn the_deadline_ends_a_wait_that_is_never_satisfied() {
        let list = WakeList::default();
        let start = Instant::now();
        let got: Option<()> = block_until(
            &[&list],
            Some(start + Duration::from_millis(20)),
            true,
            || None,
        );
        assert_eq!(got, None);
        assert!(start.elapsed() >= Duration::from_millis(20));
    }
}
