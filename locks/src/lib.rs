//! Per-agent reader/writer locks for kernel replay windows.
//!
//! While a replay service is configured, every ordinary dispatch on an agent takes that agent's
//! lock on the *reader* side, and a replay holds the *writer* side for its whole window (from the
//! drain before the snapshot to the last restore). Agents are independent: replaying on one agent
//! never blocks dispatches or replays on another, unless the backend linked them into a group
//! ([`AgentGroups`]: agents whose kernels may write each other's memory), whose replays take the
//! writer side of every agent of the group in ascending key order.
//!
//! [`AgentLocks`] is the registry. Agents are named by a `u64` key (a backend's agent handle) and
//! their locks are created lazily on first use.
//!
//! # Example
//!
//! ```
//! use kreplay_locks::{AgentLocks, ReadAccess};
//!
//! let locks = AgentLocks::new();
//! // No replay service configured: ordinary dispatches take nothing.
//! assert!(matches!(locks.read(7), Ok(ReadAccess::NotNeeded)));
//!
//! locks.set_enabled(true);
//! {
//!     let dispatch = locks.read(7).unwrap();
//!     assert!(dispatch.is_locked());
//! } // reader side released here
//!
//! // A replay window on agent 7.
//! let window = locks.write(7).unwrap();
//! // A dispatch issued from inside the window on the same thread and agent is detected
//! // instead of deadlocking; the backend runs it once, unreplayed.
//! assert!(locks.read(7).is_err());
//! assert!(locks.write(7).is_err());
//! // Other agents are not affected.
//! assert!(locks.read(8).unwrap().is_locked());
//! drop(window);
//! assert!(locks.read(7).unwrap().is_locked());
//! ```
//!
//! # Hold the reader side until the dispatch is submitted, not until it completes
//!
//! An ordinary dispatch takes the reader side around *submitting* its work (writing the packet,
//! ringing the doorbell) and releases it right after, while the kernel may still be running. It
//! must not keep the guard until the kernel completes:
//!
//! - the replay that waits for the writer side would then wait for every kernel in flight on the
//!   agent, through the lock, with no deadline and no way to report a stuck queue; waiting for
//!   submitted work to finish is the drain's job (`kreplay-drain`), which runs *after* the writer
//!   side is taken and has a deadline;
//! - reader guards are not `Send`: completion is noticed on another thread, which cannot release
//!   them;
//! - a tool callback that runs at completion and submits another dispatch on the agent would
//!   queue behind a waiting writer while the first guard blocks that writer.
//!
//! So the writer side guarantees that no *submission* is in progress on the agent; the drain
//! then guarantees that nothing submitted is still running.
//!
//! # Design
//!
//! **Registry.** The registry is a chain of open-addressing tables. The first table has a fixed
//! number of slots (64 by default, see [`AgentLocks::with_slots`]); each slot is a
//! [`OnceLock`] holding one agent's lock. An agent is looked up by linear probing from a hash of
//! its key; the first empty slot on the probe path is claimed with `OnceLock::get_or_init`, so
//! two threads creating the same agent at once agree on one lock. Slots are never emptied, so a
//! key's probe path never changes once it is placed. When every slot of a table is taken by other
//! agents, lookup moves on to an overflow table twice as large, created lazily the same way.
//! After an agent's lock exists, finding it costs a hash and a few acquire loads: no global lock
//! is ever taken, on the hot path or on creation (creation only waits for the one thread
//! initialising the same slot).
//!
//! **Enabled switch.** [`AgentLocks::set_enabled`] says whether a replay service is configured.
//! While disabled, [`AgentLocks::read`] costs one relaxed atomic load and takes nothing. The
//! writer side always locks, whatever the switch says.
//!
//! **Re-entrancy.** Each agent lock records which thread holds its writer side (a per-thread
//! token, never reused). A reader or writer request on agent A from the thread that holds A's
//! writer side returns [`Reentrant`] instead of deadlocking. A writer request on A from a thread
//! that holds a reader guard on A (a replay requested from inside an ordinary dispatch) is also
//! [`Reentrant`], since upgrading would deadlock. Each thread keeps a small thread-local list of
//! the reader guards it holds: a thread that already holds a reader guard takes further reader
//! guards *recursively*, so a nested ordinary dispatch never queues behind a waiting writer while
//! its own outer reader blocks that writer. (Once a thread's thread-locals are destroyed, a lock
//! taken from a later thread-local destructor is listed in the thread's late copy of that list,
//! `kreplay_late`, so the same rules hold at thread exit.)
//!
//! **Fairness.** The locks are `parking_lot`'s raw reader/writer locks, which are task-fair: once
//! a writer is waiting, new (non-recursive) readers queue behind it, so a replay is never starved
//! by a steady stream of ordinary dispatches. Recursive reader acquisitions (a thread that already
//! holds a reader guard) skip that queue, which is what makes nesting deadlock-free.
//!
//! **Guards.** Reader guards ([`ReadGuard`], [`OwnedReadGuard`]) belong to the thread that took
//! them and are not `Send`. The writer guard [`WriteGuard`] is owned (`'static`), `Send` and
//! `Sync`, so a backend can keep it in its replay state for the whole window and release it from
//! any thread. Re-entrancy stays attributed to the thread that acquired it until
//! [`WriteGuard::adopt_current_thread`] moves it.

use std::cell::{Cell, RefCell};
use std::fmt;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use kreplay_late::Late;
use parking_lot::RawRwLock;
use parking_lot::lock_api::{
    RawRwLock as _, RawRwLockRecursive as _, RawRwLockRecursiveTimed as _, RawRwLockTimed as _,
};

/// Number of slots in the first table of a registry made by [`AgentLocks::new`].
pub const DEFAULT_SLOTS: usize = 64;

/// The most slots [`AgentLocks::with_slots`] gives the first table (a larger count would only
/// allocate memory up front; the agents beyond go to overflow tables).
pub const MAX_SLOTS: usize = 1 << 16;

/// Token meaning "no thread holds the writer side". Thread tokens start at 1.
const NO_WRITER: u64 = 0;

static NEXT_THREAD_TOKEN: AtomicU64 = AtomicU64::new(1);

thread_local! {
    /// This thread's token (0 until first needed).
    static THREAD_TOKEN: Cell<u64> = const { Cell::new(0) };
    /// Addresses of the agent locks this thread holds reader guards on (one entry per guard).
    static HELD_READS: RefCell<Vec<usize>> = const { RefCell::new(Vec::new()) };
    /// [`HELD_READS`] once it is destroyed: locks taken from a thread-local destructor at
    /// thread exit (see `kreplay_late`).
    static HELD_READS_LATE: Late<Vec<usize>> = const { Late::new() };
}

/// A unique, never reused token for the calling thread.
fn current_thread_token() -> u64 {
    THREAD_TOKEN
        .try_with(|cell| {
            let token = cell.get();
            if token != 0 {
                return token;
            }
            let token = NEXT_THREAD_TOKEN.fetch_add(1, Ordering::Relaxed);
            cell.set(token);
            token
        })
        // Never taken (a `Cell<u64>` has no destructor, so it outlives thread teardown); were
        // it gone, a fresh token nobody else holds, so nothing matches it.
        .unwrap_or_else(|_| NEXT_THREAD_TOKEN.fetch_add(1, Ordering::Relaxed))
}

/// How many reader guards the calling thread holds, and how many of them are on `addr`.
fn held_reads(addr: usize) -> (usize, usize) {
    kreplay_late::with(&HELD_READS, &HELD_READS_LATE, |held| {
        let held = held.borrow();
        (held.len(), held.iter().filter(|&&a| a == addr).count())
    })
}

fn record_read(addr: usize) {
    kreplay_late::with(&HELD_READS, &HELD_READS_LATE, |held| {
        held.borrow_mut().push(addr)
    });
}

fn forget_read(addr: usize) {
    kreplay_late::with(&HELD_READS, &HELD_READS_LATE, |held| {
        let mut held = held.borrow_mut();
        if let Some(pos) = held.iter().rposition(|&a| a == addr) {
            held.swap_remove(pos);
        }
    });
}

fn hash_key(key: u64) -> usize {
    // Fibonacci hashing: spreads sequential handles and pointer-like handles alike.
    (key.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32) as usize
}

/// A dispatch or replay request on an agent whose writer side the calling thread already holds
/// (or a replay request on an agent this thread holds a reader guard on).
///
/// The backend should run the dispatch once, unreplayed (decline reason `reentrant_dispatch`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reentrant {
    /// The agent the request was made on.
    pub agent: u64,
}

impl Reentrant {
    /// The decline reason for this outcome (docs/abi.md §4): `reentrant_dispatch`.
    pub fn reason(&self) -> &'static str {
        "reentrant_dispatch"
    }
}

impl fmt::Display for Reentrant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "re-entrant request on agent {:#x}: this thread is already inside a replay window \
             or dispatch on that agent",
            self.agent
        )
    }
}

impl std::error::Error for Reentrant {}

/// Why [`AgentLocks::try_write_for`] did not return the writer side.
///
/// `#[non_exhaustive]`: a match outside this crate needs a wildcard arm.
///
/// ```compile_fail
/// use kreplay_locks::TryWriteError;
///
/// fn timed_out(e: TryWriteError) -> bool {
///     match e {
///         TryWriteError::Reentrant(_) => false,
///         TryWriteError::TimedOut { .. } => true,
///     }
/// }
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum TryWriteError {
    /// The calling thread already holds this agent's lock; see [`Reentrant`].
    Reentrant(Reentrant),
    /// The writer side could not be taken within the timeout (the agent looks stuck).
    TimedOut {
        /// The agent whose lock was requested.
        agent: u64,
        /// How long the request waited.
        waited: Duration,
    },
}

impl fmt::Display for TryWriteError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TryWriteError::Reentrant(r) => r.fmt(f),
            TryWriteError::TimedOut { agent, waited } => write!(
                f,
                "could not take the replay lock of agent {agent:#x} within {waited:?}"
            ),
        }
    }
}

impl std::error::Error for TryWriteError {}

impl From<Reentrant> for TryWriteError {
    fn from(r: Reentrant) -> Self {
        TryWriteError::Reentrant(r)
    }
}

/// One agent's reader/writer lock, owned by an [`AgentLocks`] registry.
///
/// Obtained with [`AgentLocks::agent_lock`] for inspection; locking goes through the registry.
pub struct AgentLock {
    agent: u64,
    raw: RawRwLock,
    /// Token of the thread the writer side is attributed to, or `NO_WRITER`.
    writer: AtomicU64,
}

impl AgentLock {
    fn new(agent: u64) -> Self {
        AgentLock {
            agent,
            raw: RawRwLock::INIT,
            writer: AtomicU64::new(NO_WRITER),
        }
    }

    /// The agent key this lock belongs to.
    pub fn agent(&self) -> u64 {
        self.agent
    }

    /// Whether some thread currently holds the writer side (a replay window is open). A writer
    /// still waiting for readers to leave (it marks the raw lock to keep new readers out) does
    /// not hold it yet, and does not count.
    pub fn is_write_locked(&self) -> bool {
        self.writer.load(Ordering::Acquire) != NO_WRITER && self.raw.is_locked_exclusive()
    }

    /// Whether the lock is held at all (reader or writer side).
    pub fn is_locked(&self) -> bool {
        self.raw.is_locked()
    }

    fn addr(&self) -> usize {
        self as *const AgentLock as usize
    }

    fn acquire_shared(&self) -> Result<(), Reentrant> {
        let me = current_thread_token();
        if self.writer.load(Ordering::Relaxed) == me {
            return Err(Reentrant { agent: self.agent });
        }
        let (held_any, _) = held_reads(self.addr());
        if held_any > 0 {
            // Nested reader on this thread: must not queue behind a waiting writer that our
            // outer reader guard is blocking.
            self.raw.lock_shared_recursive();
        } else {
            self.raw.lock_shared();
        }
        record_read(self.addr());
        Ok(())
    }

    /// Like `acquire_shared`, giving up after `timeout` (`Ok(false)`).
    fn try_acquire_shared_for(&self, timeout: Duration) -> Result<bool, Reentrant> {
        let me = current_thread_token();
        if self.writer.load(Ordering::Relaxed) == me {
            return Err(Reentrant { agent: self.agent });
        }
        let (held_any, _) = held_reads(self.addr());
        let taken = if held_any > 0 {
            self.raw.try_lock_shared_recursive_for(timeout)
        } else {
            self.raw.try_lock_shared_for(timeout)
        };
        if taken {
            record_read(self.addr());
        }
        Ok(taken)
    }

    fn release_shared(&self) {
        forget_read(self.addr());
        // SAFETY: only called from a reader guard's drop, and every reader guard is created
        // right after a successful `acquire_shared` on this lock; each guard releases once.
        unsafe { self.raw.unlock_shared() };
    }

    fn check_write_reentrancy(&self, me: u64) -> Result<(), Reentrant> {
        if self.writer.load(Ordering::Relaxed) == me || held_reads(self.addr()).1 > 0 {
            return Err(Reentrant { agent: self.agent });
        }
        Ok(())
    }

    fn acquire_exclusive(&self) -> Result<(), Reentrant> {
        let me = current_thread_token();
        self.check_write_reentrancy(me)?;
        self.raw.lock_exclusive();
        self.writer.store(me, Ordering::Release);
        Ok(())
    }

    fn try_acquire_exclusive_for(&self, timeout: Duration) -> Result<(), TryWriteError> {
        let me = current_thread_token();
        self.check_write_reentrancy(me)?;
        let start = Instant::now();
        if !self.raw.try_lock_exclusive_for(timeout) {
            return Err(TryWriteError::TimedOut {
                agent: self.agent,
                waited: start.elapsed(),
            });
        }
        self.writer.store(me, Ordering::Release);
        Ok(())
    }

    fn release_exclusive(&self) {
        self.writer.store(NO_WRITER, Ordering::Relaxed);
        // SAFETY: only called from `WriteGuard::drop`, and a `WriteGuard` is only created after
        // `acquire_exclusive`/`try_acquire_exclusive_for` succeeded on this lock; the guard
        // releases once. parking_lot's raw lock may be released from any thread (the
        // `deadlock_detection` feature, which would object, is not enabled by this crate).
        unsafe { self.raw.unlock_exclusive() };
    }
}

impl fmt::Debug for AgentLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AgentLock")
            .field("agent", &self.agent)
            .field("write_locked", &self.is_write_locked())
            .field("locked", &self.is_locked())
            .finish()
    }
}

/// One open-addressing table of the registry, with a lazily created, larger overflow table.
struct Table {
    slots: Box<[OnceLock<Arc<AgentLock>>]>,
    next: OnceLock<Box<Table>>,
}

impl Table {
    fn new(slots: usize) -> Self {
        Table {
            slots: (0..slots).map(|_| OnceLock::new()).collect(),
            next: OnceLock::new(),
        }
    }
}

/// The registry of per-agent reader/writer locks.
///
/// See the [crate docs](crate) for the design. Share it between threads by reference (it is
/// `Sync`), e.g. in a `static` or an `Arc`.
pub struct AgentLocks {
    enabled: AtomicBool,
    root: Table,
}

impl Default for AgentLocks {
    fn default() -> Self {
        Self::new()
    }
}

impl AgentLocks {
    /// A disabled registry with [`DEFAULT_SLOTS`] slots before overflow.
    pub fn new() -> Self {
        Self::with_slots(DEFAULT_SLOTS)
    }

    /// A disabled registry whose first table has `slots` slots (rounded up to a power of two,
    /// at least 1, at most [`MAX_SLOTS`]). Agents beyond that go to overflow tables, which are
    /// just as lock-free.
    pub fn with_slots(slots: usize) -> Self {
        AgentLocks {
            enabled: AtomicBool::new(false),
            root: Table::new(slots.clamp(1, MAX_SLOTS).next_power_of_two()),
        }
    }

    /// Turns the reader side on (a replay service is configured) or off.
    pub fn set_enabled(&self, enabled: bool) {
        self.enabled.store(enabled, Ordering::Relaxed);
    }

    /// Whether ordinary dispatches currently take the reader side.
    pub fn is_enabled(&self) -> bool {
        self.enabled.load(Ordering::Relaxed)
    }

    /// The lock of `agent`, created on first use.
    pub fn agent_lock(&self, agent: u64) -> &AgentLock {
        self.lookup(agent)
    }

    /// How many agent locks have been created so far.
    pub fn len(&self) -> usize {
        let mut count = 0;
        let mut table = Some(&self.root);
        while let Some(t) = table {
            count += t.slots.iter().filter(|s| s.get().is_some()).count();
            table = t.next.get().map(|b| &**b);
        }
        count
    }

    /// Whether some thread holds the writer side of any agent (a replay window is open
    /// somewhere; see [`AgentLock::is_write_locked`]). Looks at every agent's lock once.
    pub fn any_write_locked(&self) -> bool {
        let mut table = Some(&self.root);
        while let Some(t) = table {
            if t.slots
                .iter()
                .any(|s| s.get().is_some_and(|l| l.is_write_locked()))
            {
                return true;
            }
            table = t.next.get().map(|b| &**b);
        }
        false
    }

    /// Whether no agent lock has been created yet.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lookup(&self, agent: u64) -> &Arc<AgentLock> {
        let mut table = &self.root;
        let hash = hash_key(agent);
        loop {
            let mask = table.slots.len() - 1;
            for i in 0..table.slots.len() {
                let slot = &table.slots[(hash.wrapping_add(i)) & mask];
                let entry = match slot.get() {
                    Some(entry) => entry,
                    None => slot.get_or_init(|| Arc::new(AgentLock::new(agent))),
                };
                if entry.agent == agent {
                    return entry;
                }
            }
            let size = table.slots.len() * 2;
            table = table.next.get_or_init(|| Box::new(Table::new(size)));
        }
    }

    /// Reader side for an ordinary dispatch on `agent`.
    ///
    /// Hold the returned guard while the dispatch is being submitted and drop it right after,
    /// not when the dispatch completes (see the crate documentation: waiting for completion is
    /// the drain's job, after the writer side is taken).
    ///
    /// Returns [`ReadAccess::NotNeeded`] when the registry is disabled (one relaxed load, no
    /// lock), [`ReadAccess::Locked`] otherwise (blocking while a replay window is open on the
    /// agent), or [`Reentrant`] when the calling thread holds the agent's writer side.
    pub fn read(&self, agent: u64) -> Result<ReadAccess<'_>, Reentrant> {
        if !self.enabled.load(Ordering::Relaxed) {
            return Ok(ReadAccess::NotNeeded);
        }
        let lock = &**self.lookup(agent);
        lock.acquire_shared()?;
        Ok(ReadAccess::Locked(ReadGuard {
            lock,
            _not_send: PhantomData,
        }))
    }

    /// Like [`read`](Self::read), but waiting in slices of `slice` and calling `between` after
    /// each slice that did not get the lock: a caller that must keep serving others while it
    /// waits (a queue handler) does so in `between`.
    pub fn read_serving(
        &self,
        agent: u64,
        slice: Duration,
        mut between: impl FnMut(),
    ) -> Result<ReadAccess<'_>, Reentrant> {
        if !self.enabled.load(Ordering::Relaxed) {
            return Ok(ReadAccess::NotNeeded);
        }
        let lock = &**self.lookup(agent);
        while !lock.try_acquire_shared_for(slice)? {
            between();
        }
        Ok(ReadAccess::Locked(ReadGuard {
            lock,
            _not_send: PhantomData,
        }))
    }

    /// Like [`read`](Self::read), but giving up after `timeout`: `Ok(None)` when a writer still
    /// holds the agent then. A thread that holds another agent's writer side uses it with a zero
    /// timeout, so that it never waits for a writer that may be waiting for it.
    pub fn try_read_for(
        &self,
        agent: u64,
        timeout: Duration,
    ) -> Result<Option<ReadAccess<'_>>, Reentrant> {
        if !self.enabled.load(Ordering::Relaxed) {
            return Ok(Some(ReadAccess::NotNeeded));
        }
        let lock = &**self.lookup(agent);
        if !lock.try_acquire_shared_for(timeout)? {
            return Ok(None);
        }
        Ok(Some(ReadAccess::Locked(ReadGuard {
            lock,
            _not_send: PhantomData,
        })))
    }

    /// Like [`read`](Self::read), with a guard that does not borrow the registry.
    pub fn read_owned(&self, agent: u64) -> Result<OwnedReadAccess, Reentrant> {
        if !self.enabled.load(Ordering::Relaxed) {
            return Ok(OwnedReadAccess::NotNeeded);
        }
        let lock = Arc::clone(self.lookup(agent));
        lock.acquire_shared()?;
        Ok(OwnedReadAccess::Locked(OwnedReadGuard {
            lock,
            _not_send: PhantomData,
        }))
    }

    /// Writer side for a replay window on `agent`, waiting as long as it takes.
    ///
    /// Always locks, whether or not the registry is enabled. Returns [`Reentrant`] when the
    /// calling thread already holds this agent's writer side or a reader guard on it.
    pub fn write(&self, agent: u64) -> Result<WriteGuard, Reentrant> {
        let lock = Arc::clone(self.lookup(agent));
        lock.acquire_exclusive()?;
        Ok(WriteGuard { lock })
    }

    /// Like [`write`](Self::write), but waiting in slices of `slice` and calling `between` after
    /// each slice that did not get the lock (see [`read_serving`](Self::read_serving)).
    pub fn write_serving(
        &self,
        agent: u64,
        slice: Duration,
        mut between: impl FnMut(),
    ) -> Result<WriteGuard, Reentrant> {
        loop {
            // Never gives up: `None` does not come back.
            let taken = self.write_until(agent, slice, || {
                between();
                true
            })?;
            if let Some(guard) = taken {
                return Ok(guard);
            }
        }
    }

    /// Like [`write_serving`](Self::write_serving), but `keep_waiting`, called after each slice
    /// that did not get the lock, may give up: `Ok(None)` when it returned `false`.
    pub fn write_until(
        &self,
        agent: u64,
        slice: Duration,
        mut keep_waiting: impl FnMut() -> bool,
    ) -> Result<Option<WriteGuard>, Reentrant> {
        let lock = Arc::clone(self.lookup(agent));
        loop {
            match lock.try_acquire_exclusive_for(slice) {
                Ok(()) => return Ok(Some(WriteGuard { lock })),
                Err(TryWriteError::Reentrant(r)) => return Err(r),
                Err(TryWriteError::TimedOut { .. }) => {
                    if !keep_waiting() {
                        return Ok(None);
                    }
                }
            }
        }
    }

    /// Writer sides of every agent of `agents` (a replay's group, ascending), waiting in slices
    /// of `slice` and calling `between` after each slice that did not get a lock (see
    /// [`write_serving`](Self::write_serving)). An agent listed more than once is locked once
    /// (one guard, at its first place).
    ///
    /// Never waits while it holds one: it takes each agent's side without waiting, and where
    /// one is busy gives back the sides it took, waits for that one alone, then tries the rest
    /// again. A group's writer that held one agent while it waited for the next would wait for
    /// ever on a thread that holds the next agent's reader side and takes a nested reader side
    /// of the first (an ordinary dispatch whose submission dispatches on a linked agent).
    pub fn write_all_serving(
        &self,
        agents: &[u64],
        slice: Duration,
        mut between: impl FnMut(),
    ) -> Result<Vec<WriteGuard>, Reentrant> {
        loop {
            // Never gives up: `None` does not come back.
            let taken = self.write_all_until(agents, slice, || {
                between();
                true
            })?;
            if let Some(guards) = taken {
                return Ok(guards);
            }
        }
    }

    /// Like [`write_all_serving`](Self::write_all_serving), but `keep_waiting`, called after
    /// each slice that did not get a lock (while none is held), may give up: `Ok(None)` when it
    /// returned `false`, every side taken given back.
    pub fn write_all_until(
        &self,
        agents: &[u64],
        slice: Duration,
        mut keep_waiting: impl FnMut() -> bool,
    ) -> Result<Option<Vec<WriteGuard>>, Reentrant> {
        let mut waited: Option<WriteGuard> = None;
        loop {
            let mut guards: Vec<WriteGuard> = Vec::with_capacity(agents.len());
            let mut busy = None;
            for &agent in agents {
                if guards.iter().any(|g| g.lock.agent == agent) {
                    // Listed again: its side is already taken, by this call.
                    continue;
                }
                if let Some(held) = waited.take_if(|g| g.lock.agent == agent) {
                    guards.push(held);
                    continue;
                }
                let lock = Arc::clone(self.lookup(agent));
                match lock.try_acquire_exclusive_for(Duration::ZERO) {
                    Ok(()) => guards.push(WriteGuard { lock }),
                    Err(TryWriteError::Reentrant(r)) => return Err(r),
                    Err(TryWriteError::TimedOut { .. }) => {
                        busy = Some(agent);
                        break;
                    }
                }
            }
            let Some(agent) = busy else {
                return Ok(Some(guards));
            };
            // Nothing held while waiting (the one waited for before, if any, is given back
            // with the rest).
            drop(guards);
            drop(waited.take());
            match self.write_until(agent, slice, &mut keep_waiting)? {
                Some(guard) => waited = Some(guard),
                None => return Ok(None),
            }
        }
    }

    /// Writer side for a replay window on `agent`, giving up after `timeout`.
    ///
    /// Use it to report a stuck agent instead of hanging.
    pub fn try_write_for(
        &self,
        agent: u64,
        timeout: Duration,
    ) -> Result<WriteGuard, TryWriteError> {
        let lock = Arc::clone(self.lookup(agent));
        lock.try_acquire_exclusive_for(timeout)?;
        Ok(WriteGuard { lock })
    }
}

impl fmt::Debug for AgentLocks {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AgentLocks")
            .field("enabled", &self.is_enabled())
            .field("agents", &self.len())
            .finish()
    }
}

/// Outcome of [`AgentLocks::read`].
#[must_use = "the reader side is released as soon as this is dropped"]
#[derive(Debug)]
pub enum ReadAccess<'a> {
    /// The registry is disabled: nothing was locked.
    NotNeeded,
    /// The reader side is held until the guard is dropped.
    Locked(ReadGuard<'a>),
}

impl ReadAccess<'_> {
    /// Whether the reader side was taken.
    pub fn is_locked(&self) -> bool {
        matches!(self, ReadAccess::Locked(_))
    }
}

/// Outcome of [`AgentLocks::read_owned`].
#[must_use = "the reader side is released as soon as this is dropped"]
#[derive(Debug)]
pub enum OwnedReadAccess {
    /// The registry is disabled: nothing was locked.
    NotNeeded,
    /// The reader side is held until the guard is dropped.
    Locked(OwnedReadGuard),
}

impl OwnedReadAccess {
    /// Whether the reader side was taken.
    pub fn is_locked(&self) -> bool {
        matches!(self, OwnedReadAccess::Locked(_))
    }
}

/// Reader side of one agent's lock, borrowed from the registry. Released on drop.
///
/// Not `Send`: it must be dropped on the thread that took it.
#[must_use = "the reader side is released as soon as this is dropped"]
pub struct ReadGuard<'a> {
    lock: &'a AgentLock,
    _not_send: PhantomData<*const ()>,
}

impl ReadGuard<'_> {
    /// The agent this guard reads.
    pub fn agent(&self) -> u64 {
        self.lock.agent
    }
}

impl Drop for ReadGuard<'_> {
    fn drop(&mut self) {
        self.lock.release_shared();
    }
}

impl fmt::Debug for ReadGuard<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReadGuard")
            .field("agent", &self.lock.agent)
            .finish()
    }
}

/// Reader side of one agent's lock, owning a reference to it (`'static`). Released on drop.
///
/// Not `Send`: it must be dropped on the thread that took it.
#[must_use = "the reader side is released as soon as this is dropped"]
pub struct OwnedReadGuard {
    lock: Arc<AgentLock>,
    _not_send: PhantomData<*const ()>,
}

impl OwnedReadGuard {
    /// The agent this guard reads.
    pub fn agent(&self) -> u64 {
        self.lock.agent
    }
}

impl Drop for OwnedReadGuard {
    fn drop(&mut self) {
        self.lock.release_shared();
    }
}

impl fmt::Debug for OwnedReadGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OwnedReadGuard")
            .field("agent", &self.lock.agent)
            .finish()
    }
}

/// Writer side of one agent's lock: a replay window. Released on drop.
///
/// Owned (`'static`), `Send` and `Sync`, so it can live in a backend's replay state and be
/// dropped on any thread.
#[must_use = "the replay window closes as soon as this is dropped"]
pub struct WriteGuard {
    lock: Arc<AgentLock>,
}

impl WriteGuard {
    /// The agent this window is on.
    pub fn agent(&self) -> u64 {
        self.lock.agent
    }

    /// Attributes the window to the calling thread: from now on, requests on this agent from
    /// this thread are [`Reentrant`], and requests from the thread that acquired it block like
    /// anyone else's. Use it when a replay window continues on another thread.
    pub fn adopt_current_thread(&self) {
        self.lock
            .writer
            .store(current_thread_token(), Ordering::Relaxed);
    }
}

impl Drop for WriteGuard {
    fn drop(&mut self) {
        self.lock.release_exclusive();
    }
}

impl fmt::Debug for WriteGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WriteGuard")
            .field("agent", &self.lock.agent)
            .finish()
    }
}

pub mod fork;
mod groups;
pub use groups::AgentGroups;

#[cfg(test)]
mod tests;

/// The README's example, compiled and run as a doctest so that it cannot go stale.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
