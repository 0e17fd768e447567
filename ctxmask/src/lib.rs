//! Context ids, the global set of started contexts, and the thread-scoped per-pass context mask of
//! kernel replay.
//!
//! A *context* bundles profiling services. Tools create contexts and start or stop them globally;
//! only started contexts receive callbacks. While one kernel dispatch is replayed in several
//! passes, the tool may mask which of the already-started contexts take part in each pass. That
//! mask is local to the replay loop (it lives on the loop's thread), sticky across the passes of
//! one loop, reset when the loop ends, and it never changes the global state.
//!
//! ```
//! use kreplay_ctxmask::{ContextRegistry, ToggleError, replay_stop_context};
//!
//! let registry = ContextRegistry::new();
//! let counters = registry.create();
//! let tracing = registry.create();
//! registry.start(counters).unwrap();
//! registry.start(tracing).unwrap();
//!
//! // Outside of a replay loop's PASS ENTER the toggles are refused.
//! assert_eq!(replay_stop_context(tracing), Err(ToggleError::NotArmed));
//!
//! {
//!     let mask = registry.begin_replay();
//!     {
//!         let _armed = mask.arm(); // PASS ENTER of pass 0
//!         replay_stop_context(tracing).unwrap();
//!     }
//!     // The mask holds for this thread's dispatches until the loop ends ...
//!     assert!(registry.is_active(counters));
//!     assert!(!registry.is_active(tracing));
//!     // ... and global state is untouched.
//!     assert!(registry.is_started(tracing).unwrap());
//! }
//! // The loop has ended: the mask is gone.
//! assert!(registry.is_active(tracing));
//! ```
//!
//! The cost of [`ContextRegistry::is_active`] while no replay loop of the registry runs anywhere
//! in the process is one relaxed atomic load beside the started check (itself a few loads, no
//! lock).

use std::cell::RefCell;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering};

use kreplay_late::Late;

/// A context id. Handles start at 1; 0 is never a valid context.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ContextId(pub u64);

/// Why a context operation on a [`ContextRegistry`] failed.
///
/// `#[non_exhaustive]`: a match outside this crate needs a wildcard arm.
///
/// ```compile_fail
/// use kreplay_ctxmask::ContextError;
///
/// fn unknown(e: ContextError) -> bool {
///     match e {
///         ContextError::UnknownContext => true,
///     }
/// }
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ContextError {
    /// The id was never created by this registry.
    UnknownContext,
}

impl std::fmt::Display for ContextError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ContextError::UnknownContext => f.write_str("unknown context id"),
        }
    }
}

impl std::error::Error for ContextError {}

/// Why a replay toggle ([`replay_start_context`] / [`replay_stop_context`]) was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ToggleError {
    /// Called outside PASS ENTER of a replay loop on this thread
    /// (docs/abi.md §2: `KREPLAY_STATUS_ERROR_CONTEXT_ERROR`).
    NotArmed,
    /// The context was not globally active when the loop began
    /// (docs/abi.md §2: `KREPLAY_STATUS_ERROR_CONTEXT_NOT_STARTED`).
    NotStarted,
}

impl std::fmt::Display for ToggleError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ToggleError::NotArmed => {
                f.write_str("replay context toggles are legal only during PASS ENTER")
            }
            ToggleError::NotStarted => {
                f.write_str("the context was not globally started when the replay began")
            }
        }
    }
}

impl std::error::Error for ToggleError {}

/// Number of slots in the first segment of the started-flag table; segment `k` holds
/// `FIRST_SEGMENT << k` slots.
const FIRST_SEGMENT: u64 = 64;
/// Number of segments: room for `FIRST_SEGMENT * (2^SEGMENTS - 1)` contexts.
const SEGMENTS: usize = 32;

/// Where slot `index` (0-based) lives: `(segment, offset in segment)`.
fn slot_position(index: u64) -> (usize, usize) {
    let block = index / FIRST_SEGMENT + 1;
    let segment = (u64::BITS - 1 - block.leading_zeros()) as usize;
    let segment_start = FIRST_SEGMENT * ((1u64 << segment) - 1);
    (segment, (index - segment_start) as usize)
}

/// Source of unique registry identities (used to tag replay frames); 0 is the process-wide
/// registry's.
static NEXT_REGISTRY: AtomicU64 = AtomicU64::new(1);

/// The set of contexts of a process (or of one test): creation, global start/stop, and the
/// entry to per-replay masking.
///
/// Started flags live in a table of segments that never move once allocated, so reading a
/// context's state takes no lock. The registry is `Send + Sync`.
///
/// Nothing in it waits for another thread, so it is safe across `fork`: a segment is allocated
/// outside the table and put in with one compare-and-swap (a thread that loses the race frees
/// its copy), and the process-wide registry is a plain static. A thread of the parent that was
/// creating a context at the fork leaves at most a context id the child never hands out, never
/// a one-time initialization the child would wait on for good.
pub struct ContextRegistry {
    /// Identity of this registry, so a thread's replay frames know whom they belong to.
    identity: u64,
    /// Number of contexts created so far (ids `1..=created`).
    created: AtomicU64,
    /// Started flag of context `id` at slot `id - 1`: segment `k` is null until allocated, then
    /// `FIRST_SEGMENT << k` flags (a `Box<[AtomicBool]>` of that length, freed on drop).
    segments: [AtomicPtr<AtomicBool>; SEGMENTS],
    /// Number of replay loops of this registry running now, on all threads.
    replay_loops: AtomicUsize,
}

impl std::fmt::Debug for ContextRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ContextRegistry")
            .field("contexts", &self.created.load(Ordering::Acquire))
            .field("active", &self.active_contexts())
            .finish()
    }
}

impl Default for ContextRegistry {
    fn default() -> Self {
        Self::new()
    }
}

impl ContextRegistry {
    /// An empty registry (no contexts).
    pub fn new() -> Self {
        Self::with_identity(NEXT_REGISTRY.fetch_add(1, Ordering::Relaxed))
    }

    const fn with_identity(identity: u64) -> Self {
        ContextRegistry {
            identity,
            created: AtomicU64::new(0),
            segments: [const { AtomicPtr::new(std::ptr::null_mut()) }; SEGMENTS],
            replay_loops: AtomicUsize::new(0),
        }
    }

    /// The process-wide registry.
    pub fn global() -> &'static ContextRegistry {
        static GLOBAL: ContextRegistry = ContextRegistry::with_identity(0);
        &GLOBAL
    }

    /// Creates a new, stopped context.
    ///
    /// # Panics
    /// When more than `64 * (2^32 - 1)` contexts were created (memory runs out long before).
    pub fn create(&self) -> ContextId {
        let index = self.created.fetch_add(1, Ordering::AcqRel);
        let (segment, _) = slot_position(index);
        assert!(segment < SEGMENTS, "kreplay: too many contexts");
        self.segment(segment);
        ContextId(index + 1)
    }

    /// Starts `id` globally.
    pub fn start(&self, id: ContextId) -> Result<(), ContextError> {
        self.flag(id)
            .ok_or(ContextError::UnknownContext)?
            .store(true, Ordering::Release);
        Ok(())
    }

    /// Stops `id` globally.
    pub fn stop(&self, id: ContextId) -> Result<(), ContextError> {
        self.flag(id)
            .ok_or(ContextError::UnknownContext)?
            .store(false, Ordering::Release);
        Ok(())
    }

    /// Global state only (ignores any replay mask).
    pub fn is_started(&self, id: ContextId) -> Result<bool, ContextError> {
        self.flag(id)
            .map(|flag| flag.load(Ordering::Acquire))
            .ok_or(ContextError::UnknownContext)
    }

    /// Is `id` active for the dispatch happening now on this thread: globally started and, if a
    /// replay loop of this registry runs on this thread, not masked off by the innermost one.
    /// One relaxed atomic load (plus the started check) when no replay loop of this registry
    /// runs anywhere in the process. Unknown ids are never active.
    pub fn is_active(&self, id: ContextId) -> bool {
        if !self.is_started(id).unwrap_or(false) {
            return false;
        }
        // Relaxed is enough: a loop on *this* thread incremented the counter in this thread's
        // program order, so this load sees at least that increment until the loop's own guard
        // decrements it again.
        if self.replay_loops.load(Ordering::Relaxed) == 0 {
            return true;
        }
        with_innermost_frame_of(self.identity, |frame| {
            frame.is_none_or(|frame| !frame.is_masked_off(id))
        })
    }

    /// All contexts active for the current dispatch on this thread (same rule as
    /// [`is_active`](Self::is_active)), in increasing id order.
    pub fn active_contexts(&self) -> Vec<ContextId> {
        let started = self.started_contexts();
        if self.replay_loops.load(Ordering::Relaxed) == 0 {
            return started;
        }
        with_innermost_frame_of(self.identity, |frame| match frame {
            None => started,
            Some(frame) => started
                .into_iter()
                .filter(|&id| !frame.is_masked_off(id))
                .collect(),
        })
    }

    /// Begins a replay loop on this thread: remembers which contexts are started now and
    /// installs a thread-scoped override map (empty = nothing masked). Dropping the guard removes
    /// it (masks reset). Loops nest per thread (a stack): the inner guard hides the outer until
    /// dropped.
    pub fn begin_replay(&self) -> ReplayMask<'_> {
        let frame = Frame {
            serial: NEXT_FRAME.fetch_add(1, Ordering::Relaxed),
            registry: self.identity,
            started_at_begin: self.started_contexts(),
            masked_off: Vec::new(),
            armed: 0,
        };
        let serial = frame.serial;
        with_stack(|stack| stack.push(frame));
        self.replay_loops.fetch_add(1, Ordering::Relaxed);
        ReplayMask {
            registry: self,
            serial,
            not_send: PhantomData,
        }
    }

    /// The contexts started globally right now, in increasing id order.
    fn started_contexts(&self) -> Vec<ContextId> {
        let created = self.created.load(Ordering::Acquire);
        (1..=created)
            .map(ContextId)
            .filter(|&id| self.is_started(id).unwrap_or(false))
            .collect()
    }

    /// The started flag of `id`, if `id` was created by this registry.
    fn flag(&self, id: ContextId) -> Option<&AtomicBool> {
        if id.0 == 0 || id.0 > self.created.load(Ordering::Acquire) {
            return None;
        }
        let (segment, offset) = slot_position(id.0 - 1);
        Some(&self.segment(segment)[offset])
    }

    /// Segment `segment`, allocating it on first use (lock-free, see the type's doc).
    fn segment(&self, segment: usize) -> &[AtomicBool] {
        let len = (FIRST_SEGMENT << segment) as usize;
        let slot = &self.segments[segment];
        let mut flags = slot.load(Ordering::Acquire);
        if flags.is_null() {
            let fresh: Box<[AtomicBool]> = (0..len).map(|_| AtomicBool::new(false)).collect();
            let fresh = Box::into_raw(fresh).cast::<AtomicBool>();
            flags = match slot.compare_exchange(
                std::ptr::null_mut(),
                fresh,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => fresh,
                Err(installed) => {
                    // SAFETY: `fresh` came from `Box::into_raw` of `len` flags just above and
                    // was never published.
                    drop(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(fresh, len)) });
                    installed
                }
            };
        }
        // SAFETY: a non-null segment pointer is a live allocation of `len` flags (put in above
        // or by another thread, with Release), freed only when the registry is dropped.
        unsafe { std::slice::from_raw_parts(flags, len) }
    }
}

impl Drop for ContextRegistry {
    fn drop(&mut self) {
        for (segment, slot) in self.segments.iter_mut().enumerate() {
            let flags = *slot.get_mut();
            if !flags.is_null() {
                let len = (FIRST_SEGMENT << segment) as usize;
                // SAFETY: put in by `segment` from `Box::into_raw` of `len` flags; no borrow
                // of the registry outlives this `&mut self`.
                drop(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(flags, len)) });
            }
        }
    }
}

/// Source of unique frame serials (process-wide, so a frame is never confused with another).
static NEXT_FRAME: AtomicU64 = AtomicU64::new(1);

/// One replay loop's state on its thread.
struct Frame {
    /// Identity of this frame, held by its [`ReplayMask`].
    serial: u64,
    /// Identity of the registry the loop belongs to.
    registry: u64,
    /// Contexts started globally when the loop began, sorted: the only ones toggles may mask.
    started_at_begin: Vec<ContextId>,
    /// Contexts masked off for the passes of this loop, sorted.
    masked_off: Vec<ContextId>,
    /// Number of live [`Armed`] guards of this frame (toggles are legal while > 0).
    armed: usize,
}

impl Frame {
    fn is_masked_off(&self, id: ContextId) -> bool {
        self.masked_off.binary_search(&id).is_ok()
    }

    fn toggle(&mut self, id: ContextId, enable: bool) -> Result<(), ToggleError> {
        if self.armed == 0 {
            return Err(ToggleError::NotArmed);
        }
        if self.started_at_begin.binary_search(&id).is_err() {
            return Err(ToggleError::NotStarted);
        }
        match (self.masked_off.binary_search(&id), enable) {
            (Ok(at), true) => {
                self.masked_off.remove(at);
            }
            (Err(at), false) => self.masked_off.insert(at, id),
            _ => {}
        }
        Ok(())
    }
}

thread_local! {
    /// This thread's replay loops, innermost last.
    static REPLAY_STACK: RefCell<Vec<Frame>> = const { RefCell::new(Vec::new()) };
    /// The replay loops of this thread once [`REPLAY_STACK`] is destroyed: a dispatch replayed
    /// from a thread-local destructor of the application's, at thread exit, after kreplay's own
    /// locals went.
    static REPLAY_STACK_LATE: Late<Vec<Frame>> = const { Late::new() };
}

/// Runs `f` on this thread's replay loops: its thread-local stack, or, once that is destroyed,
/// the stack's late copy (`kreplay_late`). `f` never calls out.
fn with_stack<R>(f: impl FnOnce(&mut Vec<Frame>) -> R) -> R {
    kreplay_late::with(&REPLAY_STACK, &REPLAY_STACK_LATE, |stack| {
        f(&mut stack.borrow_mut())
    })
}

/// Runs `f` on the innermost frame of registry `registry` on this thread (None if there is
/// none).
fn with_innermost_frame_of<R>(registry: u64, f: impl FnOnce(Option<&Frame>) -> R) -> R {
    with_stack(|stack| f(stack.iter().rev().find(|frame| frame.registry == registry)))
}

/// Runs `f` on the frame with serial `serial` on this thread.
fn with_frame<R>(serial: u64, f: impl FnOnce(&mut Frame) -> R) -> R {
    with_stack(|stack| {
        let frame = stack
            .iter_mut()
            .rev()
            .find(|frame| frame.serial == serial)
            .expect("a live ReplayMask always has its frame on its own thread");
        f(frame)
    })
}

/// One replay loop's context mask on the thread that began it (see
/// [`ContextRegistry::begin_replay`]). Dropping it ends the loop's masking.
///
/// It is bound to its thread:
///
/// ```compile_fail
/// let registry = kreplay_ctxmask::ContextRegistry::new();
/// let mask = registry.begin_replay();
/// std::thread::scope(|s| {
///     s.spawn(move || drop(mask));
/// });
/// ```
pub struct ReplayMask<'a> {
    registry: &'a ContextRegistry,
    serial: u64,
    /// Makes the type `!Send` and `!Sync`: the frame lives in this thread's locals.
    not_send: PhantomData<*const ()>,
}

impl std::fmt::Debug for ReplayMask<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        with_frame(self.serial, |frame| {
            f.debug_struct("ReplayMask")
                .field("started_at_begin", &frame.started_at_begin)
                .field("masked_off", &frame.masked_off)
                .field("armed", &(frame.armed > 0))
                .finish()
        })
    }
}

impl ReplayMask<'_> {
    /// Arms the toggles for the duration of the returned guard (PASS ENTER).
    pub fn arm(&self) -> Armed<'_> {
        with_frame(self.serial, |frame| frame.armed += 1);
        Armed { mask: self }
    }

    /// Is this context taking part in the current pass: started at loop begin and not masked
    /// off? Global state still wins: a context stopped globally during the loop takes part in no
    /// further pass, and a context started globally during the loop (which toggles cannot mask)
    /// takes part. This is [`ContextRegistry::is_active`] as seen through this mask.
    pub fn is_enabled(&self, id: ContextId) -> bool {
        self.registry.is_started(id).unwrap_or(false)
            && with_frame(self.serial, |frame| !frame.is_masked_off(id))
    }

    /// The contexts masked off by toggles so far, in increasing id order.
    pub fn masked_off(&self) -> Vec<ContextId> {
        with_frame(self.serial, |frame| frame.masked_off.clone())
    }

    /// The contexts that were globally started when this loop began, in increasing id order.
    pub fn started_at_begin(&self) -> Vec<ContextId> {
        with_frame(self.serial, |frame| frame.started_at_begin.clone())
    }
}

impl Drop for ReplayMask<'_> {
    fn drop(&mut self) {
        with_stack(|stack| {
            if let Some(at) = stack.iter().rposition(|frame| frame.serial == self.serial) {
                stack.remove(at);
            }
        });
        self.registry.replay_loops.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Toggles are armed while this guard lives (see [`ReplayMask::arm`]).
pub struct Armed<'m> {
    mask: &'m ReplayMask<'m>,
}

impl std::fmt::Debug for Armed<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Armed").finish_non_exhaustive()
    }
}

impl Drop for Armed<'_> {
    fn drop(&mut self) {
        let serial = self.mask.serial;
        with_stack(|stack| {
            if let Some(frame) = stack.iter_mut().rev().find(|frame| frame.serial == serial) {
                frame.armed -= 1;
            }
        });
    }
}

/// Routes a toggle to the innermost replay loop of the calling thread.
fn toggle(id: ContextId, enable: bool) -> Result<(), ToggleError> {
    with_stack(|stack| match stack.last_mut() {
        None => Err(ToggleError::NotArmed),
        Some(frame) => frame.toggle(id, enable),
    })
}

/// Unmasks `id` for the passes of the innermost replay loop of the calling thread (what the C
/// ABI's `replay_start_context` calls). Legal only while that loop is armed (PASS ENTER); the
/// context must have been globally started when the loop began. Never changes global state.
pub fn replay_start_context(id: ContextId) -> Result<(), ToggleError> {
    toggle(id, true)
}

/// Masks `id` off for the passes of the innermost replay loop of the calling thread (what the C
/// ABI's `replay_stop_context` calls). Same rules as [`replay_start_context`].
pub fn replay_stop_context(id: ContextId) -> Result<(), ToggleError> {
    toggle(id, false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slot_positions_cover_every_index_once_in_order() {
        let mut expected = (0usize, 0usize);
        for index in 0..(FIRST_SEGMENT * 15) {
            let position = slot_position(index);
            assert_eq!(position, expected, "index {index}");
            let segment_len = (FIRST_SEGMENT << expected.0) as usize;
            expected = if expected.1 + 1 == segment_len {
                (expected.0 + 1, 0)
            } else {
                (expected.0, expected.1 + 1)
            };
        }
    }

    #[test]
    fn last_slot_of_the_last_segment_is_in_range() {
        let last = FIRST_SEGMENT * ((1u64 << SEGMENTS) - 1) - 1;
        let (segment, offset) = slot_position(last);
        assert_eq!(segment, SEGMENTS - 1);
        assert_eq!(offset as u64, (FIRST_SEGMENT << (SEGMENTS - 1)) - 1);
        assert_eq!(slot_position(last + 1).0, SEGMENTS);
    }

    #[test]
    fn contexts_beyond_the_first_segment_keep_their_own_state() {
        let registry = ContextRegistry::new();
        let ids: Vec<_> = (0..300).map(|_| registry.create()).collect();
        for id in ids.iter().filter(|id| id.0 % 3 == 0) {
            registry.start(*id).unwrap();
        }
        for id in &ids {
            assert_eq!(registry.is_started(*id), Ok(id.0 % 3 == 0), "{id:?}");
        }
    }
}

/// The README's example, compiled and run as a doctest so that it cannot go stale.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
