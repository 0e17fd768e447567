//! The stress tool, written against kreplay's C ABI as a C tool would be.
//!
//! - Two KERNEL_DISPATCH tracing contexts and one KERNEL_REPLAY context, all started; one more
//!   context created and never started.
//! - CONFIG ENTER: dispatches of the mix's "replayed" kernel get a pass count of 2 to 4 (from the
//!   dispatch id); every other dispatch is opted out (`replay_pass_count` left NULL).
//! - With toggles on, PASS ENTER *p* starts tracing context *p mod 2* and stops the other, tries
//!   the never-started context and an unknown handle (both must be refused), and PASS EXIT tries a
//!   toggle outside PASS ENTER (must be refused). A dispatch record of pass *p* reaching the
//!   masked-off context is a problem.
//! - With re-entrant dispatches on, PASS ENTER 0 of every few replays dispatches `tool_add` over
//!   the tool's own buffer (on one agent or the other) and waits for it, bounded: each must run
//!   once, promptly, and its effect must survive the replay.

use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_void};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::Duration;

use kreplay::abi::{
    CallbackFn, CallbackKind, CallbackPhase, CallbackRecord, ClientFinalizeFn, ClientId,
    ContextHandle, ContextToggleFn, KernelDispatchData, KernelDispatchInfo, KernelReplayData,
    KernelReplayOperation, REPLAY_PASS_NONE, Status, ToolConfigureResult, UserData,
};
use kreplay::api::{
    kreplay_configure_callback_tracing_service, kreplay_create_context, kreplay_force_configure,
    kreplay_start_context,
};
use kreplay_workloads::stress::tool_side::ToolDispatcher;

/// How the tool behaves.
#[derive(Clone, Copy, Debug)]
pub struct ToolConfig {
    /// The kernel object whose dispatches are replayed (every other one is opted out).
    pub replayed_kernel: u64,
    /// Context toggles (valid and invalid) in every replay.
    pub toggles: bool,
    /// A re-entrant dispatch at PASS ENTER 0 of every `reentrant_every`-th replay, and at PASS
    /// EXIT 0 of as many others (0 = never).
    pub reentrant_every: u64,
}

/// How long a re-entrant tool dispatch may take.
pub const REENTRANT_DEADLINE: Duration = Duration::from_secs(10);

/// What the tool saw and did.
#[derive(Clone, Debug, Default)]
pub struct ToolReport {
    /// CONFIG ENTERs.
    pub config_enters: u64,
    /// CONFIG EXITs.
    pub config_exits: u64,
    /// PASS ENTERs.
    pub passes: u64,
    /// Toggle calls that did what docs/abi.md §2 promises.
    pub toggles_ok: u64,
    /// Dispatch records carrying a pass.
    pub pass_records: u64,
    /// Dispatch records carrying no pass.
    pub plain_records: u64,
    /// Re-entrant dispatches issued.
    pub reentrant_issued: u64,
    /// Re-entrant dispatches that completed before their deadline.
    pub reentrant_completed: u64,
    /// Everything that broke a rule.
    pub problems: Vec<String>,
}

struct StressTool {
    config: ToolConfig,
    tracing: Mutex<Vec<ContextHandle>>,
    never_started: Mutex<ContextHandle>,
    /// The stop toggle handed out at the last PASS ENTER of each dispatch, tried at PASS EXIT.
    stop_toggles: Mutex<HashMap<u64, ContextToggleFn>>,
    dispatcher: Mutex<Option<ToolDispatcher>>,
    /// Set when a re-entrant dispatch missed its deadline: the dispatcher is not used again.
    dispatcher_abandoned: std::sync::atomic::AtomicBool,
    config_enters: AtomicU64,
    config_exits: AtomicU64,
    passes: AtomicU64,
    toggles_ok: AtomicU64,
    pass_records: AtomicU64,
    plain_records: AtomicU64,
    reentrant_issued: AtomicU64,
    reentrant_completed: AtomicU64,
    problems: Mutex<Vec<String>>,
}

static TOOL: OnceLock<StressTool> = OnceLock::new();

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl StressTool {
    fn problem(&self, problem: String) {
        let mut problems = lock(&self.problems);
        if problems.len() < 1000 {
            problems.push(problem);
        }
    }
}

/// Registers the tool with `kreplay_force_configure`. Once per process.
pub fn register(config: ToolConfig) -> Result<(), String> {
    let tool = StressTool {
        config,
        tracing: Mutex::default(),
        never_started: Mutex::default(),
        stop_toggles: Mutex::default(),
        dispatcher: Mutex::new(None),
        dispatcher_abandoned: std::sync::atomic::AtomicBool::new(false),
        config_enters: AtomicU64::new(0),
        config_exits: AtomicU64::new(0),
        passes: AtomicU64::new(0),
        toggles_ok: AtomicU64::new(0),
        pass_records: AtomicU64::new(0),
        plain_records: AtomicU64::new(0),
        reentrant_issued: AtomicU64::new(0),
        reentrant_completed: AtomicU64::new(0),
        problems: Mutex::default(),
    };
    if TOOL.set(tool).is_err() {
        return Err("the stress tool is already registered in this process".into());
    }
    match kreplay_force_configure(Some(configure)) {
        Status::SUCCESS => Ok(()),
        status => Err(format!("kreplay_force_configure: {status}")),
    }
}

/// Hands the tool the objects it dispatches with from inside its callbacks.
pub fn set_dispatcher(dispatcher: ToolDispatcher) {
    if let Some(tool) = TOOL.get() {
        *lock(&tool.dispatcher) = Some(dispatcher);
    }
}

/// Takes the dispatcher back (after the application finished); `None` if it was abandoned.
pub fn take_dispatcher() -> Option<ToolDispatcher> {
    let tool = TOOL.get()?;
    let dispatcher = lock(&tool.dispatcher).take();
    if tool.dispatcher_abandoned.load(Ordering::SeqCst) {
        // A dispatch of it may still be in flight: its memory must stay alive.
        std::mem::forget(dispatcher);
        return None;
    }
    dispatcher
}

/// What the tool saw so far.
pub fn report() -> ToolReport {
    let Some(tool) = TOOL.get() else {
        return ToolReport::default();
    };
    let load = |a: &AtomicU64| a.load(Ordering::SeqCst);
    ToolReport {
        config_enters: load(&tool.config_enters),
        config_exits: load(&tool.config_exits),
        passes: load(&tool.passes),
        toggles_ok: load(&tool.toggles_ok),
        pass_records: load(&tool.pass_records),
        plain_records: load(&tool.plain_records),
        reentrant_issued: load(&tool.reentrant_issued),
        reentrant_completed: load(&tool.reentrant_completed),
        problems: lock(&tool.problems).clone(),
    }
}

/// Runs a callback body; a panic is recorded as a problem instead of crossing into C.
fn guarded<R>(what: &str, fallback: R, body: impl FnOnce(&StressTool) -> R) -> R {
    let Some(tool) = TOOL.get() else {
        return fallback;
    };
    match catch_unwind(AssertUnwindSafe(|| body(tool))) {
        Ok(result) => result,
        Err(_) => {
            tool.problem(format!("internal error in the stress tool's {what}"));
            fallback
        }
    }
}

unsafe extern "C" fn configure(
    _version: u32,
    _runtime_version: *const c_char,
    _priority: u32,
    client_id: *mut ClientId,
) -> *mut ToolConfigureResult {
    guarded("configure", std::ptr::null_mut(), |_| {
        if !client_id.is_null() {
            // SAFETY: kreplay passes a valid client id the tool may name (static string).
            unsafe { (*client_id).name = c"kreplay-stress".as_ptr() };
        }
        // Lives for the rest of the process (the tool is registered once).
        Box::into_raw(Box::new(ToolConfigureResult {
            size: size_of::<ToolConfigureResult>(),
            initialize: Some(initialize),
            finalize: Some(finalize),
            tool_data: std::ptr::null_mut(),
        }))
    })
}

unsafe extern "C" fn initialize(_finalize: ClientFinalizeFn, _tool_data: *mut c_void) -> c_int {
    guarded("initialize", 1, |tool| match set_up(tool) {
        Ok(()) => 0,
        Err(problem) => {
            tool.problem(format!("initialize: {problem}"));
            1
        }
    })
}

unsafe extern "C" fn finalize(_tool_data: *mut c_void) {
    guarded("finalize", (), |_| ());
}

fn set_up(tool: &StressTool) -> Result<(), String> {
    let create = || {
        let mut context = ContextHandle::default();
        // SAFETY: a valid out-pointer.
        match unsafe { kreplay_create_context(&mut context) } {
            Status::SUCCESS => Ok(context),
            status => Err(format!("kreplay_create_context: {status}")),
        }
    };
    let configure = |context, kind, callback: CallbackFn, data: usize| {
        // SAFETY: no operation list (all operations); the callback has the C signature; `data`
        // is a slot number, never dereferenced.
        let status = unsafe {
            kreplay_configure_callback_tracing_service(
                context,
                kind,
                std::ptr::null(),
                0,
                Some(callback),
                std::ptr::without_provenance_mut(data),
            )
        };
        match status {
            Status::SUCCESS => Ok(()),
            status => Err(format!(
                "kreplay_configure_callback_tracing_service: {status}"
            )),
        }
    };
    let start = |context| match kreplay_start_context(context) {
        Status::SUCCESS => Ok(()),
        status => Err(format!("kreplay_start_context: {status}")),
    };
    let mut tracing = Vec::new();
    for slot in 0..2 {
        let context = create()?;
        configure(
            context,
            CallbackKind::KERNEL_DISPATCH,
            on_dispatch_record,
            slot,
        )?;
        start(context)?;
        tracing.push(context);
    }
    *lock(&tool.tracing) = tracing;
    let replay = create()?;
    configure(replay, CallbackKind::KERNEL_REPLAY, on_replay_record, 0)?;
    start(replay)?;
    *lock(&tool.never_started) = create()?;
    Ok(())
}

unsafe extern "C" fn on_dispatch_record(
    record: CallbackRecord,
    _user_data: *mut UserData,
    callback_data: *mut c_void,
) {
    guarded("dispatch callback", (), |tool| {
        if record.kind != CallbackKind::KERNEL_DISPATCH || record.payload.is_null() {
            tool.problem(format!(
                "a dispatch record of kind {:?} without a payload",
                record.kind
            ));
            return;
        }
        // SAFETY: KERNEL_DISPATCH records carry a dispatch payload valid for the callback.
        let payload = unsafe { &*record.payload.cast::<KernelDispatchData>() };
        if payload.replay_pass == REPLAY_PASS_NONE {
            tool.plain_records.fetch_add(1, Ordering::Relaxed);
            return;
        }
        tool.pass_records.fetch_add(1, Ordering::Relaxed);
        let slot = callback_data as usize;
        if tool.config.toggles && payload.replay_pass % 2 != slot as u64 {
            tool.problem(format!(
                "dispatch {}: context slot {slot} got a record of pass {}, masked off then",
                payload.dispatch_info.dispatch_id, payload.replay_pass
            ));
        }
    });
}

unsafe extern "C" fn pass_count(info: KernelDispatchInfo, _user_data: UserData) -> u64 {
    guarded("pass-count callback", 1, |_| 2 + info.dispatch_id % 3)
}

unsafe extern "C" fn on_replay_record(
    record: CallbackRecord,
    _user_data: *mut UserData,
    _callback_data: *mut c_void,
) {
    guarded("replay callback", (), |tool| {
        if record.kind != CallbackKind::KERNEL_REPLAY || record.payload.is_null() {
            tool.problem(format!(
                "a replay record of kind {:?} without a payload",
                record.kind
            ));
            return;
        }
        let operation = KernelReplayOperation(record.operation);
        if operation != KernelReplayOperation::CONFIG && operation != KernelReplayOperation::PASS {
            return;
        }
        // SAFETY: CONFIG and PASS records carry a replay payload the tool may write where the
        // header allows, valid for the callback.
        let payload = unsafe { &mut *record.payload.cast::<KernelReplayData>() };
        let id = payload.dispatch_info.dispatch_id;
        match (operation, record.phase) {
            (KernelReplayOperation::CONFIG, CallbackPhase::ENTER) => {
                tool.config_enters.fetch_add(1, Ordering::Relaxed);
                if payload.dispatch_info.kernel_id == tool.config.replayed_kernel {
                    payload.replay_pass_count = Some(pass_count);
                }
            }
            (KernelReplayOperation::CONFIG, CallbackPhase::EXIT) => {
                tool.config_exits.fetch_add(1, Ordering::Relaxed);
                lock(&tool.stop_toggles).remove(&id);
            }
            (KernelReplayOperation::PASS, CallbackPhase::ENTER) => {
                tool.passes.fetch_add(1, Ordering::Relaxed);
                if tool.config.toggles {
                    toggle_at_pass_enter(tool, payload);
                }
                if tool.config.reentrant_every > 0
                    && payload.current_pass == 0
                    && id % tool.config.reentrant_every == 0
                {
                    reentrant_dispatch(tool, id);
                }
            }
            (KernelReplayOperation::PASS, CallbackPhase::EXIT) => {
                if tool.config.toggles {
                    toggle_at_pass_exit(tool, payload);
                }
                // After the pass's kernel, before the next restore: kept all the same.
                if tool.config.reentrant_every > 0
                    && payload.current_pass == 0
                    && id % tool.config.reentrant_every == tool.config.reentrant_every / 2
                {
                    reentrant_dispatch(tool, id);
                }
            }
            (_, phase) => tool.problem(format!("dispatch {id}: a record with phase {phase:?}")),
        }
    });
}

fn expect(tool: &StressTool, what: String, got: Status, wanted: &[Status]) {
    if wanted.contains(&got) {
        tool.toggles_ok.fetch_add(1, Ordering::Relaxed);
    } else {
        tool.problem(format!("{what} returned {got}, expected one of {wanted:?}"));
    }
}

fn toggle_at_pass_enter(tool: &StressTool, payload: &KernelReplayData) {
    let id = payload.dispatch_info.dispatch_id;
    let pass = payload.current_pass;
    let (Some(start), Some(stop)) = (payload.replay_start_context, payload.replay_stop_context)
    else {
        tool.problem(format!(
            "dispatch {id} PASS ENTER {pass}: no context toggles"
        ));
        return;
    };
    lock(&tool.stop_toggles).insert(id, Some(stop));
    let tracing = lock(&tool.tracing).clone();
    let never_started = *lock(&tool.never_started);
    for (slot, &context) in tracing.iter().enumerate() {
        let on = slot as u64 == pass % 2;
        // SAFETY: kreplay's toggles, called during PASS ENTER as the header allows.
        let got = unsafe { if on { start(context) } else { stop(context) } };
        expect(
            tool,
            format!("dispatch {id} PASS ENTER {pass}: toggling slot {slot}"),
            got,
            &[Status::SUCCESS],
        );
    }
    if pass == 0 {
        // SAFETY: as above; this context exists but was never started.
        let got = unsafe { start(never_started) };
        expect(
            tool,
            format!("dispatch {id}: starting a never-started context"),
            got,
            &[Status::ERROR_CONTEXT_NOT_STARTED],
        );
        // SAFETY: as above; no context has this handle.
        let got = unsafe {
            stop(ContextHandle {
                handle: 0xdead_beef_0000 + id,
            })
        };
        expect(
            tool,
            format!("dispatch {id}: stopping an unknown context"),
            got,
            &[
                Status::ERROR_CONTEXT_NOT_STARTED,
                Status::ERROR_CONTEXT_NOT_FOUND,
            ],
        );
    }
}

fn toggle_at_pass_exit(tool: &StressTool, payload: &KernelReplayData) {
    let id = payload.dispatch_info.dispatch_id;
    let Some(Some(stop)) = lock(&tool.stop_toggles).get(&id).copied() else {
        return;
    };
    let Some(&context) = lock(&tool.tracing).first() else {
        return;
    };
    // SAFETY: kreplay's toggle; outside PASS ENTER it must refuse and change nothing.
    let got = unsafe { stop(context) };
    expect(
        tool,
        format!(
            "dispatch {id} PASS EXIT {}: a toggle outside PASS ENTER",
            payload.current_pass
        ),
        got,
        &[Status::ERROR_CONTEXT_ERROR],
    );
}

fn reentrant_dispatch(tool: &StressTool, id: u64) {
    if tool.dispatcher_abandoned.load(Ordering::SeqCst) {
        return;
    }
    let mut dispatcher = lock(&tool.dispatcher);
    let Some(dispatcher) = dispatcher.as_mut() else {
        return;
    };
    let agent = (id / tool.config.reentrant_every.max(1)) as usize % dispatcher.agents();
    tool.reentrant_issued.fetch_add(1, Ordering::SeqCst);
    match dispatcher.add_one(agent, REENTRANT_DEADLINE) {
        Ok(true) => {
            tool.reentrant_completed.fetch_add(1, Ordering::SeqCst);
        }
        Ok(false) => {
            tool.dispatcher_abandoned.store(true, Ordering::SeqCst);
            tool.problem(format!(
                "dispatch {id}: a tool dispatch on agent {agent} from a replay callback did not \
                 complete within {REENTRANT_DEADLINE:?}"
            ));
        }
        Err(error) => tool.problem(format!("dispatch {id}: a tool dispatch failed: {error}")),
    }
}
