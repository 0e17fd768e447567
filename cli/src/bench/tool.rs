//! The dispatch benchmark's tool, written against kreplay's C ABI like any tool: one context
//! with the KERNEL_REPLAY service and nothing else. At CONFIG ENTER it either sets the pass-count
//! callback (which answers [`set_passes`]'s N) or leaves it NULL (the per-dispatch opt-out). It
//! counts what it sees, so the benchmark can check that each dispatch took the path it measures.
//!
//! The callbacks do as little as a tool can (a few relaxed atomics), so the figures are
//! kreplay's cost, not the tool's. SNAPSHOT and RESTORE EXIT records are summarized the same
//! way (regions in the snapshot, strategy of each restore), so the benchmark can check what a
//! replay really snapshotted and restored.

use std::ffi::{c_char, c_int, c_void};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

use kreplay::abi::{
    CallbackKind, CallbackPhase, CallbackRecord, ClientFinalizeFn, ClientId, ContextHandle,
    KernelDispatchInfo, KernelReplayData, KernelReplayMemoryData, KernelReplayOperation,
    RestoreStrategy, Status, ToolConfigureResult, UserData,
};
use kreplay::api::{
    kreplay_configure_callback_tracing_service, kreplay_create_context, kreplay_force_configure,
    kreplay_start_context,
};

/// Passes the tool asks for at the next CONFIG ENTERs; 0 leaves the pass-count callback NULL.
static PASSES: AtomicU64 = AtomicU64::new(0);
static CONFIG_ENTERS: AtomicU64 = AtomicU64::new(0);
static PASS_ENTERS: AtomicU64 = AtomicU64::new(0);
static CALLBACK_ERRORS: AtomicU64 = AtomicU64::new(0);
static SNAPSHOT_EXITS: AtomicU64 = AtomicU64::new(0);
static SNAPSHOT_FAILURES: AtomicU64 = AtomicU64::new(0);
static SNAPSHOT_REGIONS_MIN: AtomicU64 = AtomicU64::new(u64::MAX);
static SNAPSHOT_REGIONS_MAX: AtomicU64 = AtomicU64::new(0);
/// RESTORE EXIT records per strategy (none, full, hash, writeset) and failed restores.
static RESTORES: [AtomicU64; 5] = [const { AtomicU64::new(0) }; 5];
static REGISTERED: OnceLock<()> = OnceLock::new();
static SETUP_ERROR: OnceLock<String> = OnceLock::new();

/// What the tool has seen since it was registered.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ToolCounts {
    /// CONFIG ENTER records (one per dispatch that reached the replay path).
    pub config_enters: u64,
    /// PASS ENTER records.
    pub pass_enters: u64,
    /// Callbacks that panicked or received a record without its payload.
    pub errors: u64,
}

/// What the SNAPSHOT and RESTORE EXIT records said since [`reset_memory_reports`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemoryReports {
    /// SNAPSHOT EXIT records.
    pub snapshots: u64,
    /// Of those, snapshots that were declined.
    pub snapshot_failures: u64,
    /// Fewest and most regions a snapshot covered (`None` before the first).
    pub regions: Option<(u64, u64)>,
    /// RESTORE EXIT records by strategy: full, hash, write set.
    pub restores_full: u64,
    /// See `restores_full`.
    pub restores_hash: u64,
    /// See `restores_full`.
    pub restores_writeset: u64,
    /// RESTORE EXIT records that reported a failure.
    pub restore_failures: u64,
}

/// Forgets the SNAPSHOT and RESTORE reports so far.
pub fn reset_memory_reports() {
    SNAPSHOT_EXITS.store(0, Ordering::Relaxed);
    SNAPSHOT_FAILURES.store(0, Ordering::Relaxed);
    SNAPSHOT_REGIONS_MIN.store(u64::MAX, Ordering::Relaxed);
    SNAPSHOT_REGIONS_MAX.store(0, Ordering::Relaxed);
    for count in &RESTORES {
        count.store(0, Ordering::Relaxed);
    }
}

/// The SNAPSHOT and RESTORE reports since [`reset_memory_reports`].
pub fn memory_reports() -> MemoryReports {
    let snapshots = SNAPSHOT_EXITS.load(Ordering::Relaxed);
    let restores = |i: usize| RESTORES[i].load(Ordering::Relaxed);
    MemoryReports {
        snapshots,
        snapshot_failures: SNAPSHOT_FAILURES.load(Ordering::Relaxed),
        regions: (snapshots > 0).then(|| {
            (
                SNAPSHOT_REGIONS_MIN.load(Ordering::Relaxed),
                SNAPSHOT_REGIONS_MAX.load(Ordering::Relaxed),
            )
        }),
        restores_full: restores(1),
        restores_hash: restores(2),
        restores_writeset: restores(3),
        restore_failures: restores(4),
    }
}

/// Registers the tool with `kreplay_force_configure` (before kreplay is loaded). Once per
/// process.
pub fn register() -> Result<(), String> {
    if REGISTERED.set(()).is_err() {
        return Err("the benchmark tool is already registered in this process".into());
    }
    match kreplay_force_configure(Some(configure)) {
        Status::SUCCESS => Ok(()),
        status => Err(format!("kreplay_force_configure: {status}")),
    }
}

/// Why the tool's initialize failed, if it did (it runs inside kreplay's `OnLoad`).
pub fn setup_error() -> Option<String> {
    SETUP_ERROR.get().cloned()
}

/// Makes the tool answer `passes` at the following CONFIG ENTERs (0: opt out, leaving the
/// pass-count callback NULL).
pub fn set_passes(passes: u64) {
    PASSES.store(passes, Ordering::Relaxed);
}

/// The counts so far.
pub fn counts() -> ToolCounts {
    ToolCounts {
        config_enters: CONFIG_ENTERS.load(Ordering::Relaxed),
        pass_enters: PASS_ENTERS.load(Ordering::Relaxed),
        errors: CALLBACK_ERRORS.load(Ordering::Relaxed),
    }
}

unsafe extern "C" fn configure(
    _version: u32,
    _runtime_version: *const c_char,
    _priority: u32,
    client_id: *mut ClientId,
) -> *mut ToolConfigureResult {
    catch_unwind(|| {
        if !client_id.is_null() {
            // SAFETY: kreplay passes a valid client id the tool may name (static string).
            unsafe { (*client_id).name = c"kreplay-bench-dispatch".as_ptr() };
        }
        // Lives for the rest of the process, as the contract asks (configure runs once).
        Box::into_raw(Box::new(ToolConfigureResult {
            size: size_of::<ToolConfigureResult>(),
            initialize: Some(initialize),
            finalize: None,
            tool_data: std::ptr::null_mut(),
        }))
    })
    .unwrap_or(std::ptr::null_mut())
}

unsafe extern "C" fn initialize(_finalize: ClientFinalizeFn, _tool_data: *mut c_void) -> c_int {
    let result = catch_unwind(|| {
        let mut context = ContextHandle::default();
        // SAFETY: a valid out-pointer.
        let status = unsafe { kreplay_create_context(&mut context) };
        if status != Status::SUCCESS {
            return Err(format!("kreplay_create_context: {status}"));
        }
        // SAFETY: no operation list (every operation); the callback has the C signature and
        // may run on any thread; no callback data.
        let status = unsafe {
            kreplay_configure_callback_tracing_service(
                context,
                CallbackKind::KERNEL_REPLAY,
                std::ptr::null(),
                0,
                Some(on_replay_record),
                std::ptr::null_mut(),
            )
        };
        if status != Status::SUCCESS {
            return Err(format!(
                "kreplay_configure_callback_tracing_service: {status}"
            ));
        }
        match kreplay_start_context(context) {
            Status::SUCCESS => Ok(()),
            status => Err(format!("kreplay_start_context: {status}")),
        }
    });
    match result {
        Ok(Ok(())) => 0,
        Ok(Err(why)) => {
            let _ = SETUP_ERROR.set(why);
            1
        }
        Err(_) => {
            let _ = SETUP_ERROR.set("internal error in the tool's initialize".into());
            1
        }
    }
}

unsafe extern "C" fn pass_count(_info: KernelDispatchInfo, _user_data: UserData) -> u64 {
    PASSES.load(Ordering::Relaxed)
}

unsafe extern "C" fn on_replay_record(
    record: CallbackRecord,
    _user_data: *mut UserData,
    _callback_data: *mut c_void,
) {
    let handled = catch_unwind(AssertUnwindSafe(|| {
        let operation = KernelReplayOperation(record.operation);
        if record.phase == CallbackPhase::EXIT
            && (operation == KernelReplayOperation::SNAPSHOT
                || operation == KernelReplayOperation::RESTORE)
        {
            if record.payload.is_null() {
                return false;
            }
            // SAFETY: SNAPSHOT and RESTORE records carry a
            // `kreplay_callback_tracing_kernel_replay_memory_data_t`, valid for the callback.
            let payload = unsafe { &*record.payload.cast::<KernelReplayMemoryData>() };
            note_memory_report(operation, payload);
            return true;
        }
        if record.phase != CallbackPhase::ENTER
            || !(operation == KernelReplayOperation::CONFIG
                || operation == KernelReplayOperation::PASS)
        {
            return true;
        }
        if record.payload.is_null() {
            return false;
        }
        if operation == KernelReplayOperation::PASS {
            PASS_ENTERS.fetch_add(1, Ordering::Relaxed);
            return true;
        }
        CONFIG_ENTERS.fetch_add(1, Ordering::Relaxed);
        if PASSES.load(Ordering::Relaxed) > 0 {
            // SAFETY: CONFIG records carry a `kreplay_callback_tracing_kernel_replay_data_t`
            // the tool may write at CONFIG ENTER, valid for the callback.
            let payload = unsafe { &mut *record.payload.cast::<KernelReplayData>() };
            payload.replay_pass_count = Some(pass_count);
        }
        true
    }));
    if !matches!(handled, Ok(true)) {
        CALLBACK_ERRORS.fetch_add(1, Ordering::Relaxed);
    }
}

/// Counts one SNAPSHOT or RESTORE EXIT record.
fn note_memory_report(operation: KernelReplayOperation, payload: &KernelReplayMemoryData) {
    if operation == KernelReplayOperation::SNAPSHOT {
        SNAPSHOT_EXITS.fetch_add(1, Ordering::Relaxed);
        if payload.status != Status::SUCCESS {
            SNAPSHOT_FAILURES.fetch_add(1, Ordering::Relaxed);
        }
        SNAPSHOT_REGIONS_MIN.fetch_min(payload.regions, Ordering::Relaxed);
        SNAPSHOT_REGIONS_MAX.fetch_max(payload.regions, Ordering::Relaxed);
        return;
    }
    let slot = if payload.status != Status::SUCCESS {
        4
    } else if payload.strategy == RestoreStrategy::FULL {
        1
    } else if payload.strategy == RestoreStrategy::HASH {
        2
    } else if payload.strategy == RestoreStrategy::WRITESET {
        3
    } else {
        0
    };
    RESTORES[slot].fetch_add(1, Ordering::Relaxed);
}
