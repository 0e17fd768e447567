//! The drain before a snapshot, bounded in time (SPEC rule 5 and `agent_drain_stuck`).
//!
//! `cuCtxSynchronize` waits for every stream of the device, with no timeout. A stream may hold
//! work that ends only once the launching thread goes on: a kernel that waits for a flag the
//! host sets after this launch, or for another process's kernel that waits for ours. Drained
//! on the launching thread, such a program would never end. So the drain runs on a thread of
//! kreplay's own, and the launch waits for it at most the drain timeout
//! (`KREPLAY_DRAIN_TIMEOUT_MS`, the setting the HSA backend's drains obey): past it the replay is
//! declined and the launch runs once, as the application made it, while the drain thread goes
//! on waiting for the device. A later drain first waits, within its own timeout, for that one
//! to end: the device cannot be idle before.
//!
//! [`Drainer`] takes the synchronisation as a function of the context, so its rules run
//! without a GPU.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

/// Waits until every stream of a context (an opaque handle) is idle, or says why it failed.
pub type SyncFn = dyn Fn(usize) -> Result<(), String> + Send + Sync;

#[derive(Default)]
struct State {
    /// Whether the drain thread runs.
    started: bool,
    /// The last drain asked for.
    asked: u64,
    /// The drain waiting to start: its id and context.
    pending: Option<(u64, usize)>,
    /// Whether the drain thread is synchronising now.
    busy: bool,
    /// The last drain that ended.
    ended: u64,
    /// How the drains that ended went, by id, until their askers take them (one asker's result
    /// is never another's: a second drain may end before the first asker wakes up).
    results: BTreeMap<u64, Result<(), String>>,
    /// The [`Drainer`] was dropped: the drain thread ends once it is idle.
    closed: bool,
}

/// How many drains' results wait for their askers at most.
const RESULTS_KEPT: usize = 64;

struct Shared {
    state: Mutex<State>,
    changed: Condvar,
    sync: Box<SyncFn>,
}

/// Drains contexts on a thread of its own, each drain waited for at most `timeout`.
pub struct Drainer {
    shared: Arc<Shared>,
    timeout: Duration,
}

impl std::fmt::Debug for Drainer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Drainer")
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl Drainer {
    /// A drainer that synchronises with `sync` and gives up waiting after `timeout`.
    pub fn new(
        timeout: Duration,
        sync: impl Fn(usize) -> Result<(), String> + Send + Sync + 'static,
    ) -> Drainer {
        Drainer {
            shared: Arc::new(Shared {
                state: Mutex::new(State::default()),
                changed: Condvar::new(),
                sync: Box::new(sync),
            }),
            timeout,
        }
    }

    /// How long a drain is waited for.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Drain context `ctx`: `Ok` once every stream of it is idle; an error when the
    /// synchronisation failed, or when it (or an earlier one still running) did not end within
    /// the timeout.
    pub fn drain(&self, ctx: usize) -> Result<(), String> {
        let deadline = Instant::now() + self.timeout;
        let shared = &self.shared;
        let mut s = shared.state.lock();
        if !s.started {
            let worker = shared.clone();
            // Started with the application's asynchronous signals blocked, whatever the mask
            // of the launching thread (`kreplay_wtrack::threads`).
            kreplay_wtrack::threads::spawn(
                std::thread::Builder::new().name("kreplay-drain".into()),
                move || worker.run(),
            )
            .map_err(|e| format!("cannot start the drain thread: {e}"))?;
            s.started = true;
        }
        while s.busy || s.pending.is_some() {
            if shared.changed.wait_until(&mut s, deadline).timed_out() {
                return Err(format!(
                    "an earlier drain of the device has not ended after {:?} \
                     (KREPLAY_DRAIN_TIMEOUT_MS): work on the device waits for something that \
                     has not happened yet",
                    self.timeout
                ));
            }
        }
        s.asked += 1;
        let id = s.asked;
        s.pending = Some((id, ctx));
        shared.changed.notify_all();
        while s.ended < id {
            if shared.changed.wait_until(&mut s, deadline).timed_out() && s.ended < id {
                return Err(format!(
                    "the device's streams did not drain within {:?} (KREPLAY_DRAIN_TIMEOUT_MS): \
                     work already on the device waits for something after this launch",
                    self.timeout
                ));
            }
        }
        s.results
            .remove(&id)
            .unwrap_or_else(|| Err("the drain's result was lost".to_owned()))
    }
}

impl Drainer {
    /// Waits until no drain runs or waits to run, at most until `deadline`: whether it is idle
    /// now. A context about to be destroyed waits for this, so that the drain thread is not
    /// synchronising it while the driver destroys it (a drain that began before the context was
    /// forgotten may have listed it).
    pub fn wait_idle(&self, deadline: Instant) -> bool {
        let shared = &self.shared;
        let mut s = shared.state.lock();
        while s.busy || s.pending.is_some() {
            if shared.changed.wait_until(&mut s, deadline).timed_out() {
                return !(s.busy || s.pending.is_some());
            }
        }
        true
    }
}

impl Drop for Drainer {
    fn drop(&mut self) {
        self.shared.state.lock().closed = true;
        self.shared.changed.notify_all();
    }
}

impl Shared {
    fn run(&self) {
        loop {
            let (id, ctx) = {
                let mut s = self.state.lock();
                loop {
                    if let Some(p) = s.pending.take() {
                        s.busy = true;
                        break p;
                    }
                    if s.closed {
                        return;
                    }
                    self.changed.wait(&mut s);
                }
            };
            // A panic in the synchronisation is that drain's failure, never the thread's end
            // (every later drain would wait for it).
            let result =
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| (self.sync)(ctx)))
                    .unwrap_or_else(|_| {
                        Err(format!("the synchronisation of context {ctx:#x} panicked"))
                    });
            let mut s = self.state.lock();
            s.busy = false;
            s.ended = id;
            s.results.insert(id, result);
            // Results of askers that gave up waiting are never taken: keep the latest few.
            while s.results.len() > RESULTS_KEPT {
                s.results.pop_first();
            }
            self.changed.notify_all();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    /// A device whose drains wait until `release` is sent something (a stuck stream), when
    /// `stuck` says so for the context.
    fn gated(stuck: usize) -> (Drainer, mpsc::Sender<()>, Arc<Mutex<Vec<usize>>>) {
        let (release, gate) = mpsc::channel::<()>();
        let gate = Mutex::new(gate);
        let seen = Arc::new(Mutex::new(Vec::new()));
        let log = seen.clone();
        let d = Drainer::new(Duration::from_millis(200), move |ctx| {
            log.lock().push(ctx);
            if ctx == stuck {
                gate.lock()
                    .recv_timeout(Duration::from_secs(10))
                    .map_err(|e| format!("test gate: {e}"))?;
            }
            if ctx == 99 {
                return Err("cuCtxSynchronize failed".into());
            }
            Ok(())
        });
        (d, release, seen)
    }

    #[test]
    fn the_drain_thread_ends_when_its_drainer_is_dropped() {
        let (d, _release, _seen) = gated(7);
        assert_eq!(d.drain(1), Ok(()));
        let shared = Arc::downgrade(&d.shared);
        drop(d);
        let deadline = Instant::now() + Duration::from_secs(10);
        // The thread holds the last reference to the shared state until it returns.
        while shared.upgrade().is_some() {
            assert!(
                Instant::now() < deadline,
                "the drain thread is still running"
            );
            std::thread::yield_now();
        }
    }

    #[test]
    fn a_drain_that_ends_is_waited_for_and_its_failure_reported() {
        let (d, _release, seen) = gated(7);
        assert_eq!(d.drain(1), Ok(()));
        assert_eq!(d.drain(2), Ok(()));
        let e = d.drain(99).unwrap_err();
        assert!(e.contains("cuCtxSynchronize"), "{e}");
        assert_eq!(*seen.lock(), [1, 2, 99]);
    }

    #[test]
    fn waiting_for_idle_ends_when_the_drain_thread_has_nothing_left_or_at_the_deadline() {
        let (d, release, _seen) = gated(7);
        assert!(d.wait_idle(Instant::now()), "never started: idle");
        assert_eq!(d.drain(1), Ok(()));
        assert!(d.wait_idle(Instant::now()), "a drain that ended");
        assert!(d.drain(7).is_err(), "stuck past the timeout");
        let started = Instant::now();
        assert!(
            !d.wait_idle(started + Duration::from_millis(50)),
            "the stuck drain still runs"
        );
        assert!(started.elapsed() >= Duration::from_millis(50));
        release.send(()).unwrap();
        assert!(
            d.wait_idle(Instant::now() + Duration::from_secs(10)),
            "idle once the stuck work ended"
        );
    }

    #[test]
    fn a_stuck_drain_gives_up_at_the_timeout_and_the_next_waits_for_it_to_end() {
        let (d, release, seen) = gated(7);
        let started = Instant::now();
        let e = d.drain(7).unwrap_err();
        let waited = started.elapsed();
        assert!(
            e.contains("did not drain") && e.contains("KREPLAY_DRAIN_TIMEOUT_MS"),
            "{e}"
        );
        assert!(waited >= d.timeout(), "gave up after {waited:?}");
        assert!(waited < Duration::from_secs(5), "bounded: {waited:?}");
        // The device is still busy: the next drain cannot even start within its timeout.
        let e = d.drain(1).unwrap_err();
        assert!(e.contains("earlier drain"), "{e}");
        assert_eq!(*seen.lock(), [7]);
        // Once the stuck work ends, drains run again.
        release.send(()).unwrap();
        assert_eq!(d.drain(1), Ok(()));
        assert_eq!(*seen.lock(), [7, 1]);
    }
}
