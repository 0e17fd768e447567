//! Warnings about a pass that does not end.
//!
//! A running pass is never abandoned (`kreplay_passloop::ReplayDevice::run_pass`): its kernel
//! may still write, so the window waits for it however long it runs. On CUDA that wait is one
//! blocking `cuStreamSynchronize`; a pass whose kernel waits for something that cannot come
//! while the window is open (a kernel of another launch the window holds back) then hangs the
//! program with nothing said. So each pass's wait is watched: while it lasts, a warning is given
//! every interval (the drain timeout, as the HSA backend warns), naming the pass, the launch and
//! its device, and the wait goes on.
//!
//! One thread of its own per [`Watchdog`], started at the first watch, asleep while nothing is
//! watched; a watch costs a lock and a notification.

use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

/// The wait being watched: pass `pass` of launch `dispatch` on device `device`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PassWait {
    /// The device (agent) the launch runs on.
    pub device: u64,
    /// The launch's dispatch id.
    pub dispatch: u64,
    /// The pass (0: the application's own launch).
    pub pass: u64,
}

impl std::fmt::Display for PassWait {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "pass {} of dispatch {} on device {}",
            self.pass, self.dispatch, self.device
        )
    }
}

/// What a watchdog says about a wait that lasts: the wait, and how long it has lasted.
pub type Warn = dyn Fn(&PassWait, Duration) + Send + Sync;

struct Watch {
    id: u64,
    what: PassWait,
    since: Instant,
    next: Instant,
}

#[derive(Default)]
struct State {
    next_id: u64,
    watches: Vec<Watch>,
    started: bool,
    closed: bool,
}

struct Shared {
    state: Mutex<State>,
    changed: Condvar,
    every: Duration,
    warn: Box<Warn>,
}

/// Warns every interval about each watched wait until it ends (see the module docs).
pub struct Watchdog {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for Watchdog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Watchdog")
            .field("every", &self.shared.every)
            .finish_non_exhaustive()
    }
}

/// A wait being watched; the warnings about it stop when this drops.
#[must_use = "the wait is watched only while this lives"]
pub struct Watched<'a> {
    shared: &'a Shared,
    id: u64,
}

impl Drop for Watched<'_> {
    fn drop(&mut self) {
        self.shared.state.lock().watches.retain(|w| w.id != self.id);
    }
}

impl Watchdog {
    /// A watchdog that calls `warn` every `every` (at least 1 ms) about each wait that lasts.
    pub fn new(
        every: Duration,
        warn: impl Fn(&PassWait, Duration) + Send + Sync + 'static,
    ) -> Self {
        Watchdog {
            shared: Arc::new(Shared {
                state: Mutex::new(State::default()),
                changed: Condvar::new(),
                every: every.max(Duration::from_millis(1)),
                warn: Box::new(warn),
            }),
        }
    }

    /// Watches `what` until the returned guard drops: the first warning comes one interval
    /// from now. Where no thread can be started, nothing is said (the wait is not affected).
    pub fn watch(&self, what: PassWait) -> Watched<'_> {
        let shared = &self.shared;
        let mut s = shared.state.lock();
        if !s.started {
            s.started = true;
            let worker = shared.clone();
            // Started with the application's asynchronous signals blocked, as kreplay's other
            // threads (`kreplay_wtrack::threads`).
            let _ = kreplay_wtrack::threads::spawn(
                std::thread::Builder::new().name("kreplay-watch".into()),
                move || worker.run(),
            );
        }
        let id = s.next_id;
        s.next_id += 1;
        let since = Instant::now();
        s.watches.push(Watch {
            id,
            what,
            since,
            next: since + shared.every,
        });
        shared.changed.notify_all();
        Watched { shared, id }
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.shared.state.lock().closed = true;
        self.shared.changed.notify_all();
    }
}

impl Shared {
    fn run(&self) {
        let mut s = self.state.lock();
        loop {
            if s.closed && s.watches.is_empty() {
                return;
            }
            let now = Instant::now();
            let mut due = Vec::new();
            for w in s.watches.iter_mut().filter(|w| w.next <= now) {
                due.push((w.what, now - w.since));
                w.next = now + self.every;
            }
            if !due.is_empty() {
                // Said without the lock: a warning may take its time.
                drop(s);
                for (what, waited) in &due {
                    (self.warn)(what, *waited);
                }
                s = self.state.lock();
                continue;
            }
            match s.watches.iter().map(|w| w.next).min() {
                Some(next) => {
                    let _ = self.changed.wait_until(&mut s, next);
                }
                None => self.changed.wait(&mut s),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    fn pass(pass: u64) -> PassWait {
        PassWait {
            device: 1,
            dispatch: 7,
            pass,
        }
    }

    #[test]
    fn a_wait_is_warned_about_every_interval_until_it_ends() {
        let (tx, rx) = mpsc::channel();
        let tx = std::sync::Mutex::new(tx);
        let dog = Watchdog::new(Duration::from_millis(20), move |w, waited| {
            let _ = tx.lock().unwrap().send((*w, waited));
        });
        let watched = dog.watch(pass(2));
        let first = rx.recv_timeout(Duration::from_secs(5)).expect("warned");
        let second = rx
            .recv_timeout(Duration::from_secs(5))
            .expect("warned again");
        assert_eq!((first.0, second.0), (pass(2), pass(2)));
        assert!(first.1 >= Duration::from_millis(20), "{:?}", first.1);
        assert!(second.1 > first.1);
        assert_eq!(
            pass(2).to_string(),
            "pass 2 of dispatch 7 on device 1",
            "the warning names the pass"
        );
        drop(watched);
        // Drained of what was already said, nothing more comes.
        while rx.recv_timeout(Duration::from_millis(60)).is_ok() {}
        assert!(rx.recv_timeout(Duration::from_millis(60)).is_err());
    }

    #[test]
    fn a_short_wait_is_never_warned_about() {
        let (tx, rx) = mpsc::channel::<()>();
        let tx = std::sync::Mutex::new(tx);
        let dog = Watchdog::new(Duration::from_secs(60), move |_, _| {
            let _ = tx.lock().unwrap().send(());
        });
        for p in 0..100 {
            drop(dog.watch(pass(p)));
        }
        assert!(rx.recv_timeout(Duration::from_millis(50)).is_err());
    }
}
