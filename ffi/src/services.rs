//! The process-wide registry of configured callback tracing services, as the backend sees it.
//!
//! Tools configure services through `kreplay_configure_callback_tracing_service` (or
//! [`configure_callback_tracing`] from Rust) while their `initialize` runs; when tool
//! initialization ends the configuration is locked and the set of services never changes again.
//!
//! The backend reads the configuration through cheap, lock-free-to-hold snapshots:
//! - [`replay_configured`] / [`dispatch_tracing_configured`]: one relaxed atomic load each, for the
//!   ordinary dispatch path;
//! - [`replay_owner`]: the single KERNEL_REPLAY service, if any;
//! - [`dispatch_tracers`]: every KERNEL_DISPATCH service;
//! - [`table`]: all of it at once.
//!
//! Delivering a record goes through [`CallbackService::deliver`], which honours the service's
//! operation filter and whether its context is active for the dispatch happening now on this
//! thread (globally started and not masked off by a replay pass).
//!
//! ```
//! use kreplay::abi::{CallbackKind, CallbackRecord, UserData};
//! use kreplay::services;
//! use kreplay_ctxmask::ContextRegistry;
//! use std::ffi::c_void;
//!
//! unsafe extern "C" fn on_record(_: CallbackRecord, _: *mut UserData, _: *mut c_void) {}
//!
//! let ctx = ContextRegistry::global().create();
//! services::configure_callback_tracing(ctx, CallbackKind::KERNEL_DISPATCH, None, on_record,
//!                                      std::ptr::null_mut())
//!     .unwrap();
//! assert!(services::dispatch_tracing_configured());
//! assert!(services::dispatch_tracers().iter().any(|s| s.context == ctx));
//! ```

use std::cell::Cell;
use std::ffi::c_void;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

use kreplay_ctxmask::{ContextId, ContextRegistry};
use parking_lot::{Mutex, RwLock};

use crate::abi::{
    CallbackFn, CallbackKind, CallbackPhase, CallbackRecord, ContextHandle, DeclineReason, Status,
    UserData,
};

/// Which operations of one kind a service reports (a bit per operation value).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct OperationFilter {
    bits: u64,
}

impl OperationFilter {
    /// Every operation of `kind` (NONE excluded). Empty for a kind that is not configurable.
    pub const fn all_of(kind: CallbackKind) -> OperationFilter {
        let limit = kind.operation_limit();
        let bits = if limit <= 1 {
            0
        } else {
            // Bits 1..limit.
            (u64::MAX >> (64 - limit)) & !1
        };
        OperationFilter { bits }
    }

    /// Exactly `operations` of `kind`; `None` if one of them is NONE or not an operation of
    /// `kind`. Duplicates are allowed.
    pub fn from_operations(kind: CallbackKind, operations: &[u32]) -> Option<OperationFilter> {
        let valid = OperationFilter::all_of(kind);
        let mut bits = 0u64;
        for &operation in operations {
            if !valid.contains(operation) {
                return None;
            }
            bits |= 1u64 << operation;
        }
        Some(OperationFilter { bits })
    }

    /// Does the filter let `operation` through?
    pub const fn contains(self, operation: u32) -> bool {
        operation < 64 && self.bits & (1u64 << operation) != 0
    }

    /// Does the filter let nothing through?
    pub const fn is_empty(self) -> bool {
        self.bits == 0
    }
}

/// One configured callback tracing service.
#[derive(Clone, Copy, Debug)]
pub struct CallbackService {
    /// The context the service belongs to.
    pub context: ContextId,
    /// Its kind.
    pub kind: CallbackKind,
    /// The operations it reports.
    pub operations: OperationFilter,
    /// The tool's callback.
    pub callback: CallbackFn,
    /// The tool's pointer, passed to every call.
    pub callback_data: *mut c_void,
}

// SAFETY: a service is the tool's promise that `callback` may be called with `callback_data` from
// any thread (runtime threads deliver records). kreplay never dereferences `callback_data`; it only
// hands it back to the tool's callback.
unsafe impl Send for CallbackService {}
// SAFETY: as above; a `CallbackService` is immutable plain data.
unsafe impl Sync for CallbackService {}

/// What one record says, apart from the service that receives it.
#[derive(Clone, Copy, Debug)]
pub struct TraceEvent {
    /// An operation of the service's kind (e.g. `KernelReplayOperation::PASS.0`).
    pub operation: u32,
    /// The phase.
    pub phase: CallbackPhase,
    /// Shared by every record of one operation (see [`next_correlation_id`]).
    pub correlation_id: u64,
    /// KERNEL_REPLAY CONFIG EXIT: why the dispatch was not replayed; else NONE.
    pub decline_reason: DeclineReason,
    /// The payload for this kind and operation (e.g. `*mut KernelReplayData`).
    pub payload: *mut c_void,
}

impl CallbackService {
    /// Does this service report `operation`?
    pub fn wants(&self, operation: u32) -> bool {
        self.operations.contains(operation)
    }

    /// The record this service would receive for `event`, stamped with the calling thread.
    pub fn record(&self, event: &TraceEvent) -> CallbackRecord {
        CallbackRecord {
            context_id: ContextHandle::from(self.context),
            thread_id: current_thread_id(),
            correlation_id: event.correlation_id,
            kind: self.kind,
            operation: event.operation,
            phase: event.phase,
            decline_reason: event.decline_reason,
            payload: event.payload,
        }
    }

    /// Calls the tool's callback for `event` if the service reports this operation and its
    /// context is active for the dispatch happening now on this thread
    /// (`ContextRegistry::global().is_active`: started, and not masked off by the innermost
    /// replay loop of this thread). Returns whether the callback ran.
    ///
    /// # Safety
    /// `event.payload` must point to the payload type the header documents for this kind and
    /// operation (or be null where none is documented), valid for reads and for the writes the
    /// header allows the tool, for the duration of the call.
    pub unsafe fn deliver(&self, event: &TraceEvent, user_data: &mut UserData) -> bool {
        self.wants(event.operation)
            && call_if_active(self.context, true, || {
                if is_retired(self.context, Some(self.kind)) {
                    return false;
                }
                // SAFETY: the caller guarantees the payload; `user_data` is a live exclusive
                // reference.
                unsafe { self.invoke(event, user_data) };
                true
            })
            .unwrap_or(false)
    }

    /// Like [`deliver`](Self::deliver), but consults only the context's global started state,
    /// not replay masks. For the KERNEL_REPLAY owner: a tool masking its own replay context off
    /// for a pass must still see the rest of that replay.
    ///
    /// # Safety
    /// As for [`deliver`](Self::deliver).
    pub unsafe fn deliver_if_started(&self, event: &TraceEvent, user_data: &mut UserData) -> bool {
        self.wants(event.operation)
            && call_if_active(self.context, false, || {
                if is_retired(self.context, Some(self.kind)) {
                    return false;
                }
                // SAFETY: the caller guarantees the payload; `user_data` is a live exclusive
                // reference.
                unsafe { self.invoke(event, user_data) };
                true
            })
            .unwrap_or(false)
    }

    /// # Safety
    /// As for [`deliver`](Self::deliver).
    unsafe fn invoke(&self, event: &TraceEvent, user_data: &mut UserData) {
        let record = self.record(event);
        // SAFETY: `callback` is the tool's function of type `kreplay_callback_tracing_cb_t`,
        // registered for exactly this use; the record is by value, `user_data` is valid for the
        // call, and the payload is the caller's responsibility.
        unsafe { (self.callback)(record, user_data, self.callback_data) };
    }
}

/// Slots of [`RUNNING`]: contexts share one when their ids are equal modulo this (a finalize
/// then also waits for the other's callbacks, never the reverse).
const RUNNING_SLOTS: usize = 64;

/// Callbacks running now, on any thread, per context slot: counted without a lock, since every
/// callback of every service passes here.
static RUNNING: [AtomicUsize; RUNNING_SLOTS] = [const { AtomicUsize::new(0) }; RUNNING_SLOTS];
/// Finalizes waiting for callbacks to end (a callback ending notifies only when there is one).
static RUNNING_WAITERS: AtomicUsize = AtomicUsize::new(0);
static RUNNING_LOCK: Mutex<()> = Mutex::new(());
static RUNNING_ENDED: parking_lot::Condvar = parking_lot::Condvar::new();

thread_local! {
    /// Callbacks running on this thread now, per slot of [`RUNNING`]. Plain counters with no
    /// destructor, so that they stay usable while the thread's thread-locals are destroyed: a
    /// callback of a dispatch an application makes from a thread-local destructor (at thread
    /// exit) is still known as this thread's, and an unload or finalize it calls does not wait
    /// for it (which could only end once that wait did).
    static RUNNING_HERE: [Cell<usize>; RUNNING_SLOTS] =
        const { [const { Cell::new(0) }; RUNNING_SLOTS] };
}

/// This thread's count of callbacks running in `slot` (an index of [`RUNNING`]).
fn running_here(slot: usize) -> usize {
    RUNNING_HERE.try_with(|h| h[slot].get()).unwrap_or(0)
}

/// Registers [`in_forked_child`] to run in the child of every `fork` of the process (once).
pub(crate) fn watch_forks() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        unsafe extern "C" {
            fn pthread_atfork(
                prepare: Option<extern "C" fn()>,
                parent: Option<extern "C" fn()>,
                child: Option<extern "C" fn()>,
            ) -> std::ffi::c_int;
        }
        // SAFETY: registers plain extern "C" functions that never unwind (see below and
        // `crate::fork`).
        if unsafe {
            pthread_atfork(
                Some(crate::fork::prepare),
                Some(crate::fork::in_parent),
                Some(in_forked_child),
            )
        } != 0
        {
            crate::kreplay_warn!(
                "cannot register a fork handler: the unload of a forked child may wait for \
                 callbacks of its parent's threads, and its kreplay calls for locks other \
                 threads of the parent held"
            );
        }
    });
}

/// Runs in the child of a `fork`, where only the forking thread exists: the callbacks the
/// parent's other threads were running never end there, so they are no longer counted (an
/// unload or client finalize in the child would wait for them). The forking thread's own
/// callbacks (a tool that forks from its callback) stay counted: they end, in the child too.
/// Finalizes running on the parent's other threads are forgotten the same way. First, the locks
/// the fork's prepare handler took are unlocked (`crate::fork`). Only atomics and this thread's
/// own lists are touched, and a lock only if it is free.
extern "C" fn in_forked_child() {
    // Nothing here unwinds (a plain reset of atomics); guarded all the same.
    let _ = std::panic::catch_unwind(crate::fork::in_child);
    for (index, slot) in RUNNING.iter().enumerate() {
        slot.store(running_here(index), Ordering::SeqCst);
    }
    // No finalize of the parent's waits here.
    RUNNING_WAITERS.store(0, Ordering::SeqCst);
    // Naming this thread can panic in a thread being torn down: nothing crosses into C.
    let _ = std::panic::catch_unwind(crate::lifecycle::forget_finalizes_of_other_threads);
}

fn slot_index(context: ContextId) -> usize {
    (context.0 % RUNNING_SLOTS as u64) as usize
}

fn running_slot(context: ContextId) -> &'static AtomicUsize {
    &RUNNING[slot_index(context)]
}

/// One callback of a context in progress, from before its started check to its return.
struct Running(ContextId);

impl Running {
    fn enter(context: ContextId) -> Running {
        running_slot(context).fetch_add(1, Ordering::SeqCst);
        // Pairs with the fence in `wait_for_callbacks`: either this callback's started check
        // (after the fence) sees the stop, or the finalize's count (after its fence) sees this
        // callback. The stop and the check are not SeqCst themselves, so the fences order them.
        std::sync::atomic::fence(Ordering::SeqCst);
        let _ = RUNNING_HERE.try_with(|h| {
            let here = &h[slot_index(context)];
            here.set(here.get() + 1);
        });
        Running(context)
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = RUNNING_HERE.try_with(|h| {
            let here = &h[slot_index(self.0)];
            here.set(here.get().saturating_sub(1));
        });
        running_slot(self.0).fetch_sub(1, Ordering::SeqCst);
        if RUNNING_WAITERS.load(Ordering::SeqCst) > 0 {
            // Under the lock: a waiter checks and waits under it, so this cannot fall between.
            let _lock = RUNNING_LOCK.lock();
            RUNNING_ENDED.notify_all();
        }
    }
}

/// Calls `call`, a tool callback of `context` (callback tracing, dispatch counting, the replay
/// owner's function callbacks), only if the context is active on this thread now (`masked`:
/// started and not masked off by this thread's replay loop) or, without `masked`, started.
/// Counted as running from before that check to its return, so a finalize that stopped the
/// context after the check waits for the call (see [`wait_for_callbacks`]). `None` when the
/// callback did not run.
pub(crate) fn call_if_active<R>(
    context: ContextId,
    masked: bool,
    call: impl FnOnce() -> R,
) -> Option<R> {
    let _running = Running::enter(context);
    let registry = ContextRegistry::global();
    let active = if masked {
        registry.is_active(context)
    } else {
        registry.is_started(context).unwrap_or(false)
    };
    active.then(call)
}

/// Services whose tool has been finalized, keyed by context and kind (`None`: the dispatch
/// counting service): their context may be another tool's, still started, so stopping the
/// finalized tool's contexts does not silence them. Checked by every delivery after its
/// started check; [`ANY_RETIRED`] spares the look-up until one exists.
static RETIRED_SERVICES: RwLock<Vec<(ContextId, Option<CallbackKind>)>> = RwLock::new(Vec::new());
static ANY_RETIRED: AtomicBool = AtomicBool::new(false);

/// Delivers nothing more through the service of `kind` (`None`: the dispatch counting service)
/// on `context`: its tool has been finalized. Call before waiting for the callbacks of
/// `context` ([`wait_for_callbacks`]): a callback that passed its check before is waited for,
/// one that comes after sees the service retired.
pub(crate) fn retire_service(context: ContextId, kind: Option<CallbackKind>) {
    let mut retired = RETIRED_SERVICES.write();
    if !retired.contains(&(context, kind)) {
        retired.push((context, kind));
    }
    ANY_RETIRED.store(true, Ordering::SeqCst);
}

/// Whether the service of `kind` (`None`: dispatch counting) on `context` was retired. One
/// atomic load until a service has been retired.
pub(crate) fn is_retired(context: ContextId, kind: Option<CallbackKind>) -> bool {
    ANY_RETIRED.load(Ordering::SeqCst) && RETIRED_SERVICES.read().contains(&(context, kind))
}

/// This module's locks in the order they nest, taken before a fork (see `crate::fork`).
pub(crate) static FORK_LOCKS: [&crate::fork::Held; 4] =
    [&SERVICES, &RETIRED_SERVICES, &TABLE, &RUNNING_LOCK];

/// Whether a tool callback runs on this thread now (this thread is inside it).
pub(crate) fn in_callback() -> bool {
    RUNNING_HERE
        .try_with(|h| h.iter().any(|c| c.get() > 0))
        .unwrap_or(false)
}

/// Waits until no callback of `contexts` runs on another thread (ones running on this thread,
/// which is inside them, are not waited for), at most `limit`; false when some still ran then.
/// Called once the contexts are stopped: no new callback of theirs starts.
pub(crate) fn wait_for_callbacks(contexts: &[ContextId], limit: std::time::Duration) -> bool {
    let busy = || {
        contexts.iter().any(|&c| {
            let index = slot_index(c);
            RUNNING[index].load(Ordering::SeqCst) > running_here(index)
        })
    };
    // The contexts were stopped before this call (a Release store): the fence orders that
    // store before the counts read below, as `Running::enter` orders its count before its
    // started check. Without both, a callback could pass its check while this reads its slot
    // as idle (a store waiting in this CPU's buffer while the count is read).
    std::sync::atomic::fence(Ordering::SeqCst);
    let deadline = std::time::Instant::now() + limit;
    RUNNING_WAITERS.fetch_add(1, Ordering::SeqCst);
    let mut lock = RUNNING_LOCK.lock();
    let ended = loop {
        if !busy() {
            break true;
        }
        if RUNNING_ENDED.wait_until(&mut lock, deadline).timed_out() {
            break !busy();
        }
    };
    drop(lock);
    RUNNING_WAITERS.fetch_sub(1, Ordering::SeqCst);
    ended
}

/// Every configured service, grouped by kind. Immutable: configuring publishes a new table.
#[derive(Debug, Default)]
pub struct ServiceTable {
    by_kind: [Arc<[CallbackService]>; CallbackKind::LAST.0 as usize],
}

impl ServiceTable {
    /// The services of `kind`, in configuration order (empty for unknown kinds).
    pub fn of_kind(&self, kind: CallbackKind) -> &[CallbackService] {
        self.by_kind
            .get(kind.0 as usize)
            .map(|services| &services[..])
            .unwrap_or(&[])
    }

    /// The KERNEL_REPLAY service (at most one exists).
    pub fn replay_owner(&self) -> Option<&CallbackService> {
        self.of_kind(CallbackKind::KERNEL_REPLAY).first()
    }

    /// The KERNEL_DISPATCH services.
    pub fn dispatch_tracers(&self) -> &[CallbackService] {
        self.of_kind(CallbackKind::KERNEL_DISPATCH)
    }

    /// Is any service configured?
    pub fn is_empty(&self) -> bool {
        self.by_kind.iter().all(|services| services.is_empty())
    }

    fn build(services: &[CallbackService]) -> ServiceTable {
        let mut table = ServiceTable::default();
        for (index, slot) in table.by_kind.iter_mut().enumerate() {
            *slot = services
                .iter()
                .filter(|service| service.kind.0 as usize == index)
                .copied()
                .collect();
        }
        table
    }
}

/// The authoritative list (configuration order); guarded so checks and insertion are atomic.
static SERVICES: Mutex<Vec<CallbackService>> = Mutex::new(Vec::new());
/// The published table readers use.
static TABLE: RwLock<Option<Arc<ServiceTable>>> = RwLock::new(None);
static LOCKED: AtomicBool = AtomicBool::new(false);
static REPLAY_CONFIGURED: AtomicBool = AtomicBool::new(false);
static DISPATCH_TRACING_CONFIGURED: AtomicBool = AtomicBool::new(false);
static NEXT_CORRELATION_ID: AtomicU64 = AtomicU64::new(1);

/// Is a KERNEL_REPLAY service configured? One relaxed atomic load.
#[inline]
pub fn replay_configured() -> bool {
    REPLAY_CONFIGURED.load(Ordering::Relaxed)
}

/// Is any KERNEL_DISPATCH service configured? One relaxed atomic load.
#[inline]
pub fn dispatch_tracing_configured() -> bool {
    DISPATCH_TRACING_CONFIGURED.load(Ordering::Relaxed)
}

/// Has tool initialization ended, closing configuration?
pub fn configuration_locked() -> bool {
    LOCKED.load(Ordering::Acquire)
}

/// The current table of services.
pub fn table() -> Arc<ServiceTable> {
    if let Some(table) = TABLE.read().as_ref() {
        return Arc::clone(table);
    }
    Arc::new(ServiceTable::default())
}

/// The KERNEL_REPLAY service, if one is configured.
pub fn replay_owner() -> Option<CallbackService> {
    if !replay_configured() {
        return None;
    }
    // Read under the lock: no clone of the table's Arc on every dispatch.
    TABLE
        .read()
        .as_ref()
        .and_then(|table| table.replay_owner().copied())
}

/// Every KERNEL_DISPATCH service, in configuration order (a shared slice: no copy is made).
pub fn dispatch_tracers() -> Arc<[CallbackService]> {
    match TABLE.read().as_ref() {
        Some(table) => Arc::clone(&table.by_kind[CallbackKind::KERNEL_DISPATCH.0 as usize]),
        None => Arc::from(Vec::new()),
    }
}

/// A fresh correlation id (1, 2, ...) for one operation's records.
pub fn next_correlation_id() -> u64 {
    NEXT_CORRELATION_ID.fetch_add(1, Ordering::Relaxed)
}

/// The operating-system id of the calling thread (what records carry as `thread_id`).
pub fn current_thread_id() -> u64 {
    thread_id::current()
}

#[cfg(target_os = "linux")]
mod thread_id {
    use std::ffi::c_int;

    // SAFETY: `gettid` is provided by glibc (2.30+) and musl with exactly this signature.
    unsafe extern "C" {
        fn gettid() -> c_int;
    }

    thread_local! {
        static TID: u64 = {
            // SAFETY: gettid has no preconditions and cannot fail.
            let tid = unsafe { gettid() };
            tid as u64
        };
    }

    pub(super) fn current() -> u64 {
        TID.with(|tid| *tid)
    }
}

#[cfg(not(target_os = "linux"))]
mod thread_id {
    use std::sync::atomic::{AtomicU64, Ordering};

    static NEXT: AtomicU64 = AtomicU64::new(1);
    thread_local! {
        static TID: u64 = NEXT.fetch_add(1, Ordering::Relaxed);
    }

    pub(super) fn current() -> u64 {
        TID.with(|tid| *tid)
    }
}

/// Configures a callback tracing service (the Rust form of
/// `kreplay_configure_callback_tracing_service`). `operations: None` means every operation of
/// `kind`.
///
/// Errors, checked in this order: [`Status::ERROR_CONFIGURATION_LOCKED`] once tool initialization
/// has ended; [`Status::ERROR_INVALID_ARGUMENT`] for a kind that is not configurable or an
/// operation that is not one of `kind`; [`Status::ERROR_CONTEXT_NOT_FOUND`] for an unknown
/// context; [`Status::ERROR_SERVICE_ALREADY_CONFIGURED`] when the context already has `kind`, or
/// when `kind` is KERNEL_REPLAY and another context owns it.
pub fn configure_callback_tracing(
    context: ContextId,
    kind: CallbackKind,
    operations: Option<&[u32]>,
    callback: CallbackFn,
    callback_data: *mut c_void,
) -> Result<(), Status> {
    let mut services = SERVICES.lock();
    // Checked under the lock: `lock_configuration` takes it too, so nothing slips in after.
    if LOCKED.load(Ordering::Acquire) {
        return Err(Status::ERROR_CONFIGURATION_LOCKED);
    }
    if !kind.is_configurable() {
        return Err(Status::ERROR_INVALID_ARGUMENT);
    }
    let filter = match operations {
        None => OperationFilter::all_of(kind),
        Some(list) => {
            OperationFilter::from_operations(kind, list).ok_or(Status::ERROR_INVALID_ARGUMENT)?
        }
    };
    if ContextRegistry::global().is_started(context).is_err() {
        return Err(Status::ERROR_CONTEXT_NOT_FOUND);
    }
    if services
        .iter()
        .any(|s| s.kind == kind && (s.context == context || kind == CallbackKind::KERNEL_REPLAY))
    {
        return Err(Status::ERROR_SERVICE_ALREADY_CONFIGURED);
    }
    services.push(CallbackService {
        context,
        kind,
        operations: filter,
        callback,
        callback_data,
    });
    publish(&services);
    drop(services);
    crate::lifecycle::note_service_configured(context, Some(kind));
    Ok(())
}

/// Runs `f` while configuration is open (under the same lock as every configuration step);
/// [`Status::ERROR_CONFIGURATION_LOCKED`] once tool initialization has ended.
pub(crate) fn with_configuration_open<T>(
    f: impl FnOnce() -> Result<T, Status>,
) -> Result<T, Status> {
    let _services = SERVICES.lock();
    if LOCKED.load(Ordering::Acquire) {
        return Err(Status::ERROR_CONFIGURATION_LOCKED);
    }
    f()
}

/// Closes configuration (called when tool initialization ends).
pub(crate) fn lock_configuration() {
    let _services = SERVICES.lock();
    LOCKED.store(true, Ordering::Release);
}

/// Removes every service of `context` (a tool whose initialize failed). Refused once locked.
pub(crate) fn remove_context(context: ContextId) -> Result<usize, Status> {
    let mut services = SERVICES.lock();
    if LOCKED.load(Ordering::Acquire) {
        return Err(Status::ERROR_CONFIGURATION_LOCKED);
    }
    let before = services.len();
    services.retain(|s| s.context != context);
    let removed = before - services.len();
    if removed > 0 {
        publish(&services);
    }
    Ok(removed)
}

/// Removes the service of `kind` on `context` (one a tool that failed configured on a context
/// not its own). Refused once locked.
pub(crate) fn remove_service(context: ContextId, kind: CallbackKind) -> Result<bool, Status> {
    let mut services = SERVICES.lock();
    if LOCKED.load(Ordering::Acquire) {
        return Err(Status::ERROR_CONFIGURATION_LOCKED);
    }
    let before = services.len();
    services.retain(|s| !(s.context == context && s.kind == kind));
    let removed = services.len() != before;
    if removed {
        publish(&services);
    }
    Ok(removed)
}

/// Forgets every service and unlocks configuration (for test harnesses sharing one process).
pub(crate) fn reset() {
    let mut services = SERVICES.lock();
    services.clear();
    RETIRED_SERVICES.write().clear();
    ANY_RETIRED.store(false, Ordering::SeqCst);
    LOCKED.store(false, Ordering::Release);
    publish(&services);
}

fn publish(services: &[CallbackService]) {
    let table = ServiceTable::build(services);
    REPLAY_CONFIGURED.store(
        !table.of_kind(CallbackKind::KERNEL_REPLAY).is_empty(),
        Ordering::Relaxed,
    );
    DISPATCH_TRACING_CONFIGURED.store(!table.dispatch_tracers().is_empty(), Ordering::Relaxed);
    *TABLE.write() = Some(Arc::new(table));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::abi::{KernelDispatchOperation, KernelReplayOperation};

    #[test]
    fn all_operations_filter_covers_exactly_the_kinds_operations() {
        let replay = OperationFilter::all_of(CallbackKind::KERNEL_REPLAY);
        assert!(!replay.contains(KernelReplayOperation::NONE.0));
        for op in 1..KernelReplayOperation::LAST.0 {
            assert!(replay.contains(op));
        }
        assert!(!replay.contains(KernelReplayOperation::LAST.0));
        assert!(!replay.contains(64));
        assert!(!replay.contains(u32::MAX));

        let dispatch = OperationFilter::all_of(CallbackKind::KERNEL_DISPATCH);
        assert!(dispatch.contains(KernelDispatchOperation::ENQUEUE.0));
        assert!(dispatch.contains(KernelDispatchOperation::COMPLETE.0));
        assert!(!dispatch.contains(KernelDispatchOperation::LAST.0));

        assert!(OperationFilter::all_of(CallbackKind::NONE).is_empty());
        assert!(OperationFilter::all_of(CallbackKind(77)).is_empty());
    }

    #[test]
    fn explicit_operation_lists_keep_only_those_and_reject_unknown_ones() {
        let kind = CallbackKind::KERNEL_REPLAY;
        let filter = OperationFilter::from_operations(
            kind,
            &[KernelReplayOperation::PASS.0, KernelReplayOperation::PASS.0],
        )
        .unwrap();
        assert!(filter.contains(KernelReplayOperation::PASS.0));
        assert!(!filter.contains(KernelReplayOperation::CONFIG.0));
        assert!(OperationFilter::from_operations(kind, &[0]).is_none());
        assert!(OperationFilter::from_operations(kind, &[5]).is_none());
        assert!(OperationFilter::from_operations(kind, &[u32::MAX]).is_none());
        assert!(
            OperationFilter::from_operations(
                CallbackKind::KERNEL_DISPATCH,
                &[KernelReplayOperation::RESTORE.0]
            )
            .is_none()
        );
        assert!(
            OperationFilter::from_operations(kind, &[])
                .unwrap()
                .is_empty()
        );
    }
}
