//! Re-entrant work that survives restores.
//!
//! Work issued from inside a replay window (a tool's dispatch from a callback, onto any queue of
//! any agent; a copy or fill a callback makes) runs at once, and may write memory that an open
//! replay (its own, or another agent's) holds in its snapshot. The next restore of that replay
//! would write the snapshot back over it. So every open replay registers a [`Window`] once its
//! snapshot is planned, and re-entrant work is issued under a *hold* of every open window
//! ([`hold_open`]): the hold waits until the window's memory is quiet (no pass kernel running,
//! no snapshot, restore or fold in progress), takes a [`Capture`] of the window's footprint if
//! none is pending, and keeps the window's owner from moving on until the work is submitted.
//! Before its next pass's kernel and before its next restore, the owner settles the window
//! ([`Window::settle`]): it waits for the re-entrant work (side queues, counted copies), lists
//! what changed since the capture (a [`Delta`]: byte for byte, so a pass's own writes around it
//! are not mixed in) and, whole, the ranges copies and fills are known to have written
//! ([`Holds::wrote`]: a comparison cannot see a byte written with the value it held), and folds
//! it into the snapshot (`kreplay_snapshot::Snapshot::fold`) at the
//! next restore. Restores then bring the work's bytes back, under every strategy and store tier.
//!
//! Lock order: a window's state mutex is a leaf (never held while waiting for anything but its
//! own condition); a hold waits only for a window's owner to finish a step that never waits for
//! holds (a pass's kernel, a snapshot copy, a settle or a restore), and an owner waits for holds
//! only between steps, so holds and owners never wait on each other in a cycle. A window's own
//! thread (a tool callback run inside the pass, while the kernel runs) never waits for itself:
//! it waits for its own kernel's signal instead.

use std::sync::Arc;
use std::thread::ThreadId;
use std::time::{Duration, Instant};

use hsa_sys::hsa_signal_t;
use kreplay_snapshot::{Capture, Delta, Footprint};
use parking_lot::{Condvar, Mutex};

use crate::backend::Backend;

/// How long a waiter sleeps on a condition before it looks again (signals are not condvars).
const POLL: Duration = Duration::from_millis(1);

#[derive(Clone, Copy)]
enum Phase {
    /// The owner is copying (snapshot, settle, restore): holds wait.
    Busy,
    /// Memory moves only through re-entrant work: holds proceed.
    Quiet,
    /// A pass's kernel was submitted with this completion signal: holds proceed once it is 0.
    Kernel(hsa_signal_t),
}

struct State {
    phase: Phase,
    holders: u32,
    capture: Option<Capture>,
    /// A capture could not be taken: the next settle warns that work may be overwritten.
    capture_failed: bool,
    /// Ranges of the footprint that work known to write them whole (a copy, a fill) wrote
    /// since the last settle: taken whole, as a capture cannot tell a byte written with the
    /// value it held from one not written.
    written: Vec<(u64, u64)>,
}

/// One open replay whose snapshot re-entrant work must not be erased from.
pub(crate) struct Window {
    owner: ThreadId,
    footprint: Footprint,
    state: Mutex<State>,
    changed: Condvar,
}

/// The open windows, and the holds in progress (by ticket), so that a window opening waits for
/// the holds that began before it (they do not know it) to end.
#[derive(Default)]
pub(crate) struct Windows {
    reg: Mutex<Registry>,
    changed: Condvar,
}

#[derive(Default)]
struct Registry {
    open: Vec<Arc<Window>>,
    next_ticket: u64,
    active: Vec<u64>,
}

impl Windows {
    /// Opens a window over `footprint`, owned by the calling thread, busy (the owner is about to
    /// copy the snapshot). Returns once no hold that began before it is still in progress.
    pub(crate) fn open(&self, footprint: Footprint) -> Arc<Window> {
        let window = Arc::new(Window {
            owner: std::thread::current().id(),
            footprint,
            state: Mutex::new(State {
                phase: Phase::Busy,
                holders: 0,
                capture: None,
                capture_failed: false,
                written: Vec::new(),
            }),
            changed: Condvar::new(),
        });
        let mut reg = self.reg.lock();
        reg.open.push(window.clone());
        let opened = reg.next_ticket;
        while reg.active.iter().any(|&t| t < opened) {
            self.changed.wait_for(&mut reg, POLL);
        }
        window
    }

    /// Closes `window`: later holds do not see it, and holds waiting for it proceed.
    pub(crate) fn close(&self, window: &Arc<Window>) {
        self.reg.lock().open.retain(|w| !Arc::ptr_eq(w, window));
        window.quiet();
    }
}

/// Holds of every window open when it was taken; dropping it lets their owners move on.
pub(crate) struct Holds<'a> {
    windows: &'a Windows,
    ticket: u64,
    held: Vec<Arc<Window>>,
}

impl Drop for Holds<'_> {
    fn drop(&mut self) {
        for window in &self.held {
            let mut state = window.state.lock();
            state.holders -= 1;
            window.changed.notify_all();
        }
        let mut reg = self.windows.reg.lock();
        reg.active.retain(|&t| t != self.ticket);
        self.windows.changed.notify_all();
    }
}

impl Holds<'_> {
    /// The work held for wrote all `len` bytes at `addr` (a copy's destination, a fill): the
    /// parts the held windows' snapshots hold are taken whole at their next settle.
    pub(crate) fn wrote(&self, addr: u64, len: u64) {
        for window in &self.held {
            let pieces = window.footprint.pieces(addr, len);
            window.state.lock().written.extend(pieces);
        }
    }
}

/// Holds every open window for re-entrant work about to be issued: waits until each one's
/// memory is quiet, captures its footprint if no capture is pending, and keeps its owner from
/// its next step until the returned holds are dropped (after the work was submitted, or, for a
/// synchronous write, done).
pub(crate) fn hold_open(b: &Backend) -> Holds<'_> {
    let windows = &b.windows;
    let (ticket, open) = {
        let mut reg = windows.reg.lock();
        let ticket = reg.next_ticket;
        reg.next_ticket += 1;
        reg.active.push(ticket);
        (ticket, reg.open.clone())
    };
    let mut holds = Holds {
        windows,
        ticket,
        held: Vec::with_capacity(open.len()),
    };
    let me = std::thread::current().id();
    for window in open {
        let mut state = window.state.lock();
        loop {
            match state.phase {
                Phase::Quiet => break,
                // The owner's own thread, between steps of its own (a callback from inside a
                // step): nothing else moves this window's memory now.
                Phase::Busy if window.owner == me => break,
                Phase::Busy => {}
                Phase::Kernel(signal) => {
                    if b.original.signal_load(signal) == 0 {
                        break;
                    }
                    if window.owner == me {
                        // A callback while the owner's own pass runs: wait for that kernel
                        // (never abandoned, so never given up on).
                        drop(state);
                        while !b.wait_signal_zero(signal, Backend::deadline_after(b.drain.timeout))
                        {
                        }
                        state = window.state.lock();
                        continue;
                    }
                }
            }
            window.changed.wait_for(&mut state, POLL);
        }
        state.holders += 1;
        if state.capture.is_none() && !state.capture_failed {
            match b.snapshotter.capture(&window.footprint) {
                Ok(capture) => state.capture = Some(capture),
                Err(e) => {
                    state.capture_failed = true;
                    log::warn!("cannot capture a replay's memory before re-entrant work: {e}");
                }
            }
        }
        drop(state);
        holds.held.push(window);
    }
    holds
}

impl Window {
    /// The memory this window's snapshot holds.
    pub(crate) fn footprint(&self) -> &Footprint {
        &self.footprint
    }

    /// The owner, between steps: waits until no hold is in progress, then marks the window
    /// busy (holds wait from now on).
    pub(crate) fn busy(&self) {
        let mut state = self.state.lock();
        while state.holders > 0 {
            self.changed.wait_for(&mut state, POLL);
        }
        state.phase = Phase::Busy;
    }

    /// The owner submits a pass's kernel with completion `signal` (already non-zero).
    pub(crate) fn kernel(&self, signal: hsa_signal_t) {
        self.state.lock().phase = Phase::Kernel(signal);
        self.changed.notify_all();
    }

    /// The owner's step is over: re-entrant work may be issued.
    pub(crate) fn quiet(&self) {
        self.state.lock().phase = Phase::Quiet;
        self.changed.notify_all();
    }

    /// The owner, while busy: if re-entrant work was issued since the last settle, waits for
    /// it to land (every side queue, every counted copy; never given up on) and returns what it
    /// changed in this window's memory. `None` when nothing was issued.
    pub(crate) fn settle(&self, b: &Backend) -> Option<Result<Delta, String>> {
        let (capture, failed, written) = {
            let mut state = self.state.lock();
            let failed = std::mem::take(&mut state.capture_failed);
            let written = std::mem::take(&mut state.written);
            (state.capture.take(), failed, written)
        };
        if capture.is_none() && !failed {
            return None;
        }
        InFlight::mark(b, &self.footprint).wait_patiently(b);
        let delta = match capture {
            None => Err("its memory could not be captured first".to_string()),
            Some(capture) => b
                .snapshotter
                .changes(&capture)
                .map_err(|e| format!("its changes could not be read: {e}")),
        };
        // Ranges written whole go in after the comparison's runs: every byte of them, at
        // their current (the work's) values.
        let delta = delta.and_then(|mut delta| {
            for (addr, len) in written {
                let whole = b
                    .snapshotter
                    .written_within(&self.footprint, addr, len)
                    .map_err(|e| format!("what it wrote could not be read: {e}"))?;
                delta.append(whole);
            }
            Ok(delta)
        });
        Some(delta)
    }
}

/// What re-entrant work may still be doing to a footprint: a drain marker on every side queue,
/// and the copies counted into the memory of the agents whose memory it holds.
pub(crate) struct InFlight {
    sides: Vec<Arc<crate::queues::QueueState>>,
    counters: Vec<Arc<kreplay_drain::InFlightCounter>>,
}

impl InFlight {
    /// Puts a drain marker of its own on every side queue. Always a marker of its own: side
    /// queues are written by any thread at any time and several replays wait for them at once,
    /// so whether one "forwarded since the last marker" cannot be told here (another waiter may
    /// have just taken that mark, with its marker ahead of the packets this one must wait for).
    pub(crate) fn mark(b: &Backend, footprint: &Footprint) -> InFlight {
        let sides = b.queues.sides();
        for side in &sides {
            let marker = side.drain_marker(b);
            crate::queues::submit_side(b, side, &[marker]);
        }
        let counters = match footprint.agents() {
            Some(agents) => agents.iter().map(|&a| b.copies.counter(a)).collect(),
            None => b.copies.counters(),
        };
        InFlight { sides, counters }
    }

    /// Whether all of it landed by `deadline`.
    pub(crate) fn wait(&self, b: &Backend, deadline: Instant) -> bool {
        let mut landed = true;
        for side in &self.sides {
            landed &= b.wait_signal_zero(side.in_flight, deadline);
        }
        for counter in &self.counters {
            landed &= counter.wait_zero(deadline);
        }
        landed
    }

    /// Waits until all of it landed, however long it takes (what it writes must be seen whole
    /// before a replay goes on, or a restore would overwrite it), warning after the drain
    /// timeout and then at doubling gaps (`kreplay_drain::next_warning_gap`).
    pub(crate) fn wait_patiently(&self, b: &Backend) {
        let start = Instant::now();
        let mut gap = b.drain.timeout;
        while !self.wait(b, Backend::deadline_after(gap)) {
            gap = kreplay_drain::next_warning_gap(gap, b.drain.timeout);
            b.hooks.warn(&format!(
                "re-entrant work issued during a replay still running after {:.1} s; the \
                 replay waits for it (so that its restores keep what it writes)",
                start.elapsed().as_secs_f64()
            ));
        }
    }
}
