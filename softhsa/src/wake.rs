//! Blocking without busy-waiting: threads register on the [`WakeList`]s of the objects they wait
//! for and park; whoever changes such an object calls [`WakeList::wake_all`].
//!
//! The protocol has no lost wake-ups: a waiter registers, issues a SeqCst fence, then checks its
//! condition and parks; a changer makes its change, issues a SeqCst fence, then reads the
//! registration count. Either the waiter sees the change or the changer sees the waiter, and
//! `Thread::unpark` before `park` makes that `park` return at once.

use parking_lot::Mutex;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering, fence};
use std::thread::{self, Thread};
use std::time::{Duration, Instant};

/// How long an `HSA_WAIT_STATE_ACTIVE` wait spins before it parks.
const ACTIVE_SPIN: Duration = Duration::from_micros(20);

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
