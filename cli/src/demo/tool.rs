//! The demo's profiling tool, written against kreplay's C ABI exactly as a C tool would be:
//! `extern "C"` callbacks, `kreplay::abi` types, and only the exported `kreplay_*` functions.
//!
//! In its initialize it creates N contexts with KERNEL_DISPATCH tracing (context *i* stands for
//! "the service of pass *i*"), starts them, and one context with KERNEL_REPLAY. For every
//! dispatch:
//! - CONFIG ENTER: it sets `replay_pass_count` (answering N) and stores the dispatch's state in
//!   `user_data`, which comes back in the pass-count callback and in every PASS;
//! - PASS ENTER *i*: it masks context *i mod N* on and every other one off with
//!   `replay_start_context` / `replay_stop_context`, and probes the two refusals docs/abi.md §2 promises
//!   (a never-started context, and a toggle outside PASS ENTER, tried at PASS EXIT);
//! - SNAPSHOT / RESTORE: it records bytes, regions, tier and strategy;
//! - every event is checked against the callback order ([`OrderCheck`]).
//!
//! Dispatch records are counted per dispatch, per context and per `replay_pass`.
//!
//! Only one context in the process may configure kernel replay. When another tool (one given
//! with `kreplay demo --tool`, initialized before this one) already drives replay, this tool
//! steps aside: it keeps one KERNEL_DISPATCH context and reports what that context observed
//! ([`ToolReport::replay_by_other`]), so the demo still verifies the application and prints
//! its table.

use std::collections::{BTreeMap, HashMap};
use std::ffi::{c_char, c_int, c_void};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};

use kreplay::abi::{
    CallbackFn, CallbackKind, CallbackPhase, CallbackRecord, ClientFinalizeFn, ClientId,
    ContextHandle, ContextToggleFn, DeclineReason, KernelDispatchData, KernelDispatchInfo,
    KernelReplayData, KernelReplayMemoryData, KernelReplayOperation, REPLAY_PASS_NONE,
    RestoreStrategy, SnapshotTier, Status, ToolConfigureResult, UserData,
};
use kreplay::api::{
    kreplay_configure_callback_tracing_service, kreplay_create_context, kreplay_force_configure,
    kreplay_start_context,
};

use super::order::{OrderCheck, ReplayEvent};

/// A snapshot or restore as its EXIT record described it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemoryEvent {
    /// SNAPSHOT: 0; RESTORE: the pass whose writes were undone.
    pub pass: u64,
    /// Bytes the snapshot covers.
    pub bytes_planned: u64,
    /// Bytes copied.
    pub bytes_moved: u64,
    /// Allocations covered.
    pub regions: u64,
    /// RESTORE: chunks copied back.
    pub chunks: u64,
    /// Where the snapshot lives.
    pub tier: SnapshotTier,
    /// How restores are done.
    pub strategy: RestoreStrategy,
    /// Success, declined or restore failed.
    pub status: Status,
    /// Why the snapshot was declined, if it was.
    pub decline: DeclineReason,
    /// SNAPSHOT: (regions, bytes) from the agent's memory, referenced memory, module variables
    /// and adopted memory.
    pub sources: [(u64, u64); 4],
    /// RESTORE: the write set was restored without verification (the explicit opt-in).
    pub unverified: bool,
}

impl MemoryEvent {
    fn from_payload(payload: &KernelReplayMemoryData) -> Self {
        MemoryEvent {
            pass: payload.current_pass,
            bytes_planned: payload.bytes_planned,
            bytes_moved: payload.bytes_moved,
            regions: payload.regions,
            chunks: payload.chunks_restored,
            tier: payload.tier,
            strategy: payload.strategy,
            status: payload.status,
            decline: payload.decline_reason,
            sources: [
                (payload.agent_regions, payload.agent_bytes),
                (payload.referenced_regions, payload.referenced_bytes),
                (
                    payload.module_variable_regions,
                    payload.module_variable_bytes,
                ),
                (payload.adopted_regions, payload.adopted_bytes),
            ],
            unverified: payload.unverified != 0,
        }
    }
}

/// One pass of one dispatch as the tool saw it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PassObservation {
    /// Tracing contexts (by slot: context *i* is slot *i*) that got a dispatch record carrying
    /// this pass's `replay_pass`.
    pub contexts: Vec<usize>,
    /// Dispatch records carrying this pass's `replay_pass`, over all contexts.
    pub records: u32,
    /// Whether PASS EXIT came for this pass.
    pub exited: bool,
}

/// Everything the tool saw of one dispatch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DispatchObservation {
    /// The dispatch id of every record of this dispatch.
    pub dispatch_id: u64,
    /// The kernel (for HSA: its kernel object).
    pub kernel_id: u64,
    /// Passes the tool asked for.
    pub planned_passes: u64,
    /// Passes entered, in order (index = pass).
    pub passes: Vec<PassObservation>,
    /// Contexts whose dispatch records carried no pass (the dispatch was not replayed).
    pub unreplayed_contexts: Vec<usize>,
    /// Dispatch records that carried no pass.
    pub unreplayed_records: u32,
    /// SNAPSHOT EXIT.
    pub snapshot: Option<MemoryEvent>,
    /// RESTORE EXITs, in order.
    pub restores: Vec<MemoryEvent>,
    /// CONFIG EXIT: `current_pass` (passes that ran) and the record's decline reason.
    pub config_exit: Option<(u64, DeclineReason)>,
    /// Context toggles at PASS ENTER that did what docs/abi.md §2 promises.
    pub toggles_ok: u64,
    /// Everything that broke a rule: callback order, user data, toggle results, records.
    pub problems: Vec<String>,
}

impl DispatchObservation {
    fn new(info: &KernelDispatchInfo, planned_passes: u64) -> Self {
        DispatchObservation {
            dispatch_id: info.dispatch_id,
            kernel_id: info.kernel_id,
            planned_passes,
            passes: Vec::new(),
            unreplayed_contexts: Vec::new(),
            unreplayed_records: 0,
            snapshot: None,
            restores: Vec::new(),
            config_exit: None,
            toggles_ok: 0,
            problems: Vec::new(),
        }
    }

    /// A dispatch known only from its dispatch records (another tool drove its replay).
    fn observed(dispatch_id: u64, kernel_id: u64) -> Self {
        DispatchObservation {
            dispatch_id,
            kernel_id,
            planned_passes: 0,
            passes: Vec::new(),
            unreplayed_contexts: Vec::new(),
            unreplayed_records: 0,
            snapshot: None,
            restores: Vec::new(),
            config_exit: None,
            toggles_ok: 0,
            problems: Vec::new(),
        }
    }
}

/// What the tool saw over the whole run.
#[derive(Clone, Debug, Default)]
pub struct ToolReport {
    /// Tracing contexts, by slot.
    pub tracing_contexts: Vec<ContextHandle>,
    /// Whether initialize ran and succeeded.
    pub initialized: bool,
    /// Whether finalize ran.
    pub finalized: bool,
    /// Another tool owns the KERNEL_REPLAY service: this tool only traced dispatches, and
    /// `dispatches` are built from the dispatch records it received.
    pub replay_by_other: bool,
    /// Every dispatch whose CONFIG ENTER came (or, when `replay_by_other`, every dispatch with a
    /// dispatch record), by dispatch id.
    pub dispatches: Vec<DispatchObservation>,
    /// Problems not tied to one finished dispatch.
    pub problems: Vec<String>,
}

/// Registers the demo tool with `kreplay_force_configure`; it will run `passes` passes per
/// dispatch. Once per process.
pub fn register(passes: u64) -> Result<(), String> {
    if TOOL.set(DemoTool::new(passes)).is_err() {
        return Err("the demo tool is already registered in this process".into());
    }
    let status = kreplay_force_configure(Some(configure));
    if status != Status::SUCCESS {
        return Err(format!("kreplay_force_configure: {status}"));
    }
    Ok(())
}

/// Whether another tool owns the KERNEL_REPLAY service (known once tools are initialized): the
/// demo's tool then only observes, and the passes are that tool's.
pub fn replay_by_other() -> bool {
    TOOL.get()
        .is_some_and(|tool| lock(&tool.setup).replay_by_other)
}

/// What the tool has seen so far (dispatches still in flight are reported as problems).
pub fn report() -> ToolReport {
    let Some(tool) = TOOL.get() else {
        return ToolReport::default();
    };
    let setup = lock(&tool.setup);
    let mut problems = lock(&tool.problems).clone();
    let mut dispatches: BTreeMap<u64, DispatchObservation> = lock(&tool.finished)
        .iter()
        .map(|o| (o.dispatch_id, o.clone()))
        .collect();
    for (id, state) in lock(&tool.in_flight).iter() {
        problems.push(format!("dispatch {id}: CONFIG EXIT never came"));
        dispatches.insert(*id, lock(&state.progress).observation.clone());
    }
    let records = lock(&tool.records);
    if setup.replay_by_other {
        // No CONFIG ENTER comes to this tool: every dispatch it traced is one it observed.
        let kernels = lock(&tool.kernels);
        for (id, counts) in records.iter() {
            let passes = counts.keys().filter_map(|(pass, _)| *pass).max();
            let observation = dispatches.entry(*id).or_insert_with(|| {
                DispatchObservation::observed(*id, kernels.get(id).copied().unwrap_or(0))
            });
            if let Some(last) = passes {
                observation.passes = vec![
                    PassObservation {
                        exited: true,
                        ..PassObservation::default()
                    };
                    last as usize + 1
                ];
            }
        }
    }
    for (id, counts) in records.iter() {
        let Some(observation) = dispatches.get_mut(id) else {
            problems.push(format!(
                "dispatch records for dispatch {id}, which never had CONFIG ENTER"
            ));
            continue;
        };
        for (&(pass, slot), &count) in counts {
            match pass {
                None => {
                    observation.unreplayed_records += count;
                    if !observation.unreplayed_contexts.contains(&slot) {
                        observation.unreplayed_contexts.push(slot);
                    }
                }
                Some(pass) => match observation.passes.get_mut(pass as usize) {
                    Some(seen) => {
                        seen.records += count;
                        if !seen.contexts.contains(&slot) {
                            seen.contexts.push(slot);
                        }
                    }
                    None => observation.problems.push(format!(
                        "context {slot} got a record for pass {pass}, which never had PASS ENTER"
                    )),
                },
            }
        }
    }
    ToolReport {
        tracing_contexts: setup.tracing.clone(),
        initialized: setup.initialized,
        finalized: setup.finalized,
        replay_by_other: setup.replay_by_other,
        dispatches: dispatches.into_values().collect(),
        problems,
    }
}

// ------------------------------------------------------------------------------------------------
// Tool state
// ------------------------------------------------------------------------------------------------

static TOOL: OnceLock<DemoTool> = OnceLock::new();

#[derive(Default)]
struct Setup {
    tracing: Vec<ContextHandle>,
    replay: ContextHandle,
    /// Created, never started: toggling it must be refused with CONTEXT_NOT_STARTED.
    never_started: ContextHandle,
    initialized: bool,
    finalized: bool,
    /// KERNEL_REPLAY was already configured by another tool's context.
    replay_by_other: bool,
}

/// Dispatch records: (replay pass, context slot) → count.
type RecordCounts = BTreeMap<(Option<u64>, usize), u32>;

struct DemoTool {
    passes: u64,
    setup: Mutex<Setup>,
    in_flight: Mutex<HashMap<u64, Arc<DispatchState>>>,
    finished: Mutex<Vec<DispatchObservation>>,
    records: Mutex<BTreeMap<u64, RecordCounts>>,
    /// Dispatch id → kernel id, from the dispatch records.
    kernels: Mutex<BTreeMap<u64, u64>>,
    problems: Mutex<Vec<String>>,
}

/// Per-dispatch state; `user_data` of the dispatch's records points at it.
struct DispatchState {
    progress: Mutex<Progress>,
}

struct Progress {
    observation: DispatchObservation,
    order: OrderCheck,
    /// The `replay_stop_context` of the last PASS ENTER, tried again at PASS EXIT.
    stop_toggle: ContextToggleFn,
}

impl DispatchState {
    fn problem(&self, problem: String) {
        lock(&self.progress).observation.problems.push(problem);
    }
}

impl Progress {
    fn follow(&mut self, event: ReplayEvent) {
        if let Err(problem) = self.order.advance(event) {
            self.observation
                .problems
                .push(format!("callback order: {problem}"));
        }
    }
}

impl DemoTool {
    fn new(passes: u64) -> Self {
        DemoTool {
            passes,
            setup: Mutex::default(),
            in_flight: Mutex::default(),
            finished: Mutex::default(),
            records: Mutex::default(),
            kernels: Mutex::default(),
            problems: Mutex::default(),
        }
    }

    fn problem(&self, problem: String) {
        lock(&self.problems).push(problem);
    }

    /// The in-flight state of `dispatch_id`, checking that `user_data` points at it.
    fn state(
        &self,
        dispatch_id: u64,
        user_data: Option<UserData>,
        what: &str,
    ) -> Option<Arc<DispatchState>> {
        let Some(state) = lock(&self.in_flight).get(&dispatch_id).cloned() else {
            self.problem(format!(
                "{what} for dispatch {dispatch_id} without CONFIG ENTER"
            ));
            return None;
        };
        if let Some(user_data) = user_data
            && user_data.bits() != Arc::as_ptr(&state) as u64
        {
            state.problem(format!(
                "{what}: user_data {:#x} is not the pointer stored at CONFIG ENTER",
                user_data.bits()
            ));
        }
        Some(state)
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Runs a callback body; a panic is recorded as a problem instead of crossing into C.
fn guarded<R>(what: &str, fallback: R, body: impl FnOnce(&DemoTool) -> R) -> R {
    let Some(tool) = TOOL.get() else {
        return fallback;
    };
    match catch_unwind(AssertUnwindSafe(|| body(tool))) {
        Ok(result) => result,
        Err(_) => {
            tool.problem(format!("internal error in the demo tool's {what}"));
            fallback
        }
    }
}

// ------------------------------------------------------------------------------------------------
// Discovery and lifecycle (`kreplay_configure_func_t`, initialize, finalize)
// ------------------------------------------------------------------------------------------------

unsafe extern "C" fn configure(
    _version: u32,
    _runtime_version: *const c_char,
    _priority: u32,
    client_id: *mut ClientId,
) -> *mut ToolConfigureResult {
    guarded("configure", std::ptr::null_mut(), |_| {
        if !client_id.is_null() {
            // SAFETY: kreplay passes a valid client id the tool may name (static string).
            unsafe { (*client_id).name = c"kreplay-demo".as_ptr() };
        }
        // The result must stay valid until finalize: it lives for the rest of the process
        // (configure runs once, because the tool can be registered once).
        Box::into_raw(Box::new(ToolConfigureResult {
            size: size_of::<ToolConfigureResult>(),
            initialize: Some(initialize),
            finalize: Some(finalize),
            tool_data: std::ptr::null_mut(),
        }))
    })
}

unsafe extern "C" fn initialize(_finalize: ClientFinalizeFn, _tool_data: *mut c_void) -> c_int {
    guarded("initialize", 1, |tool| match set_up_contexts(tool) {
        Ok(setup) => {
            *lock(&tool.setup) = setup;
            0
        }
        Err(problem) => {
            tool.problem(format!("initialize: {problem}"));
            1
        }
    })
}

fn set_up_contexts(tool: &DemoTool) -> Result<Setup, String> {
    let create = || {
        let mut context = ContextHandle::default();
        // SAFETY: a valid out-pointer.
        match unsafe { kreplay_create_context(&mut context) } {
            Status::SUCCESS => Ok(context),
            status => Err(format!("kreplay_create_context: {status}")),
        }
    };
    let configure =
        |context: ContextHandle, kind: CallbackKind, callback: CallbackFn, data: *mut c_void| {
            // SAFETY: no operation list (all operations); the callback has the C signature and may
            // run on any thread; `data` is a slot number, never dereferenced.
            let status = unsafe {
                kreplay_configure_callback_tracing_service(
                    context,
                    kind,
                    std::ptr::null(),
                    0,
                    Some(callback),
                    data,
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

    let mut setup = Setup {
        replay: create()?,
        ..Setup::default()
    };
    // SAFETY: as in `configure` above.
    let replay = unsafe {
        kreplay_configure_callback_tracing_service(
            setup.replay,
            CallbackKind::KERNEL_REPLAY,
            std::ptr::null(),
            0,
            Some(on_replay_record),
            std::ptr::null_mut(),
        )
    };
    match replay {
        Status::SUCCESS => start(setup.replay)?,
        // Another tool's context drives replay: observe its passes with one tracing context.
        Status::ERROR_SERVICE_ALREADY_CONFIGURED => setup.replay_by_other = true,
        status => {
            return Err(format!(
                "kreplay_configure_callback_tracing_service(KERNEL_REPLAY): {status}"
            ));
        }
    }
    let slots = if setup.replay_by_other {
        1
    } else {
        tool.passes
    };
    for slot in 0..slots as usize {
        let context = create()?;
        configure(
            context,
            CallbackKind::KERNEL_DISPATCH,
            on_dispatch_record,
            std::ptr::without_provenance_mut(slot),
        )?;
        start(context)?;
        setup.tracing.push(context);
    }
    setup.never_started = create()?;
    setup.initialized = true;
    Ok(setup)
}

unsafe extern "C" fn finalize(_tool_data: *mut c_void) {
    guarded("finalize", (), |tool| lock(&tool.setup).finalized = true);
}

// ------------------------------------------------------------------------------------------------
// KERNEL_DISPATCH records
// ------------------------------------------------------------------------------------------------

unsafe extern "C" fn on_dispatch_record(
    record: CallbackRecord,
    _user_data: *mut UserData,
    callback_data: *mut c_void,
) {
    guarded("dispatch callback", (), |tool| {
        let slot = callback_data as usize;
        if record.kind != CallbackKind::KERNEL_DISPATCH || record.payload.is_null() {
            tool.problem(format!(
                "a dispatch tracing record of kind {:?} without a dispatch payload",
                record.kind
            ));
            return;
        }
        let expected = lock(&tool.setup).tracing.get(slot).copied();
        if expected != Some(record.context_id) {
            tool.problem(format!(
                "a record for context {} reached the callback of context slot {slot}",
                record.context_id.handle
            ));
        }
        // SAFETY: KERNEL_DISPATCH records carry a `kreplay_callback_tracing_kernel_dispatch_data_t`
        // valid for the duration of the callback.
        let payload = unsafe { &*record.payload.cast::<KernelDispatchData>() };
        let pass = (payload.replay_pass != REPLAY_PASS_NONE).then_some(payload.replay_pass);
        lock(&tool.kernels).insert(
            payload.dispatch_info.dispatch_id,
            payload.dispatch_info.kernel_id,
        );
        *lock(&tool.records)
            .entry(payload.dispatch_info.dispatch_id)
            .or_default()
            .entry((pass, slot))
            .or_default() += 1;
    });
}

// ------------------------------------------------------------------------------------------------
// KERNEL_REPLAY records
// ------------------------------------------------------------------------------------------------

unsafe extern "C" fn pass_count(info: KernelDispatchInfo, user_data: UserData) -> u64 {
    guarded("pass-count callback", 1, |tool| {
        if let Some(state) = tool.state(info.dispatch_id, Some(user_data), "replay_pass_count") {
            lock(&state.progress).follow(ReplayEvent::PassCount);
        }
        tool.passes
    })
}

unsafe extern "C" fn on_replay_record(
    record: CallbackRecord,
    user_data: *mut UserData,
    _callback_data: *mut c_void,
) {
    guarded("replay callback", (), |tool| {
        if record.kind != CallbackKind::KERNEL_REPLAY
            || record.payload.is_null()
            || user_data.is_null()
        {
            tool.problem(format!(
                "a replay record ({:?}, operation {}) without payload or user data",
                record.kind, record.operation
            ));
            return;
        }
        let operation = KernelReplayOperation(record.operation);
        match operation {
            KernelReplayOperation::CONFIG | KernelReplayOperation::PASS => {
                // SAFETY: CONFIG and PASS records carry a
                // `kreplay_callback_tracing_kernel_replay_data_t` the tool may write where the
                // header says so, valid for the callback; `user_data` is valid for the callback.
                let (payload, user_data) = unsafe {
                    (
                        &mut *record.payload.cast::<KernelReplayData>(),
                        &mut *user_data,
                    )
                };
                if operation == KernelReplayOperation::CONFIG {
                    on_config(
                        tool,
                        record.phase,
                        record.decline_reason,
                        payload,
                        user_data,
                    );
                } else {
                    on_pass(tool, record.phase, payload, *user_data);
                }
            }
            KernelReplayOperation::SNAPSHOT | KernelReplayOperation::RESTORE => {
                // SAFETY: SNAPSHOT and RESTORE records carry a
                // `kreplay_callback_tracing_kernel_replay_memory_data_t` valid for the callback.
                let payload = unsafe { &*record.payload.cast::<KernelReplayMemoryData>() };
                on_memory(tool, operation, record.phase, payload);
            }
            other => tool.problem(format!("a replay record with unknown operation {other:?}")),
        }
    });
}

fn on_config(
    tool: &DemoTool,
    phase: CallbackPhase,
    decline: DeclineReason,
    payload: &mut KernelReplayData,
    user_data: &mut UserData,
) {
    let info = payload.dispatch_info;
    match phase {
        CallbackPhase::ENTER => {
            let mut progress = Progress {
                observation: DispatchObservation::new(&info, tool.passes),
                order: OrderCheck::new(tool.passes),
                stop_toggle: None,
            };
            progress.follow(ReplayEvent::ConfigEnter);
            let state = Arc::new(DispatchState {
                progress: Mutex::new(progress),
            });
            if let Some(old) = lock(&tool.in_flight).insert(info.dispatch_id, Arc::clone(&state)) {
                old.problem(format!(
                    "CONFIG ENTER came twice for dispatch {}",
                    info.dispatch_id
                ));
            }
            payload.replay_pass_count = Some(pass_count);
            payload.replay_continue = None;
            // The pointer stays valid until CONFIG EXIT, which reclaims this reference.
            user_data.ptr = Arc::into_raw(state).cast_mut().cast();
        }
        CallbackPhase::EXIT => {
            let Some(state) = lock(&tool.in_flight).remove(&info.dispatch_id) else {
                tool.problem(format!(
                    "CONFIG EXIT for dispatch {} without CONFIG ENTER",
                    info.dispatch_id
                ));
                return;
            };
            let observation = {
                let mut progress = lock(&state.progress);
                progress.follow(ReplayEvent::ConfigExit);
                if user_data.bits() != Arc::as_ptr(&state) as u64 {
                    progress.observation.problems.push(format!(
                        "CONFIG EXIT: user_data {:#x} is not the pointer stored at CONFIG ENTER",
                        user_data.bits()
                    ));
                }
                progress.observation.config_exit = Some((payload.current_pass, decline));
                progress.observation.clone()
            };
            // SAFETY: CONFIG ENTER leaked exactly one reference to this allocation into
            // user_data; it is given back here, once (the entry was removed from `in_flight`).
            drop(unsafe { Arc::from_raw(Arc::as_ptr(&state)) });
            lock(&tool.finished).push(observation);
        }
        other => tool.problem(format!("CONFIG record with phase {other:?}")),
    }
}

fn on_pass(tool: &DemoTool, phase: CallbackPhase, payload: &KernelReplayData, user_data: UserData) {
    let info = payload.dispatch_info;
    let pass = payload.current_pass;
    let Some(state) = tool.state(info.dispatch_id, Some(user_data), "PASS") else {
        return;
    };
    let (tracing, never_started) = {
        let setup = lock(&tool.setup);
        (setup.tracing.clone(), setup.never_started)
    };
    let mut progress = lock(&state.progress);
    match phase {
        CallbackPhase::ENTER => {
            progress.follow(ReplayEvent::PassEnter {
                pass,
                total: payload.total_passes,
            });
            progress.observation.passes.push(PassObservation::default());
            let (Some(start), Some(stop)) =
                (payload.replay_start_context, payload.replay_stop_context)
            else {
                progress.observation.problems.push(format!(
                    "PASS ENTER {pass}: the context toggles are not set"
                ));
                return;
            };
            progress.stop_toggle = Some(stop);
            let active = (pass % tracing.len().max(1) as u64) as usize;
            for (slot, &context) in tracing.iter().enumerate() {
                let (name, toggle) = if slot == active {
                    ("replay_start_context", start)
                } else {
                    ("replay_stop_context", stop)
                };
                // SAFETY: kreplay's toggle, called during PASS ENTER as the header allows.
                match unsafe { toggle(context) } {
                    Status::SUCCESS => progress.observation.toggles_ok += 1,
                    status => progress.observation.problems.push(format!(
                        "PASS ENTER {pass}: {name}(context slot {slot}) returned {status}"
                    )),
                }
            }
            if pass == 0 {
                // SAFETY: as above; the context exists but was never started.
                match unsafe { start(never_started) } {
                    Status::ERROR_CONTEXT_NOT_STARTED => progress.observation.toggles_ok += 1,
                    status => progress.observation.problems.push(format!(
                        "PASS ENTER 0: starting a never-started context returned {status}, \
                         expected CONTEXT_NOT_STARTED"
                    )),
                }
            }
        }
        CallbackPhase::EXIT => {
            progress.follow(ReplayEvent::PassExit { pass });
            if let Some(seen) = progress.observation.passes.get_mut(pass as usize) {
                seen.exited = true;
            }
            if let (Some(stop), Some(&context)) = (
                progress.stop_toggle,
                tracing.get((pass % tracing.len().max(1) as u64) as usize),
            ) {
                // SAFETY: kreplay's toggle; outside PASS ENTER it must refuse and change nothing.
                match unsafe { stop(context) } {
                    Status::ERROR_CONTEXT_ERROR => progress.observation.toggles_ok += 1,
                    status => progress.observation.problems.push(format!(
                        "PASS EXIT {pass}: replay_stop_context outside PASS ENTER returned \
                         {status}, expected CONTEXT_ERROR"
                    )),
                }
            }
        }
        other => progress
            .observation
            .problems
            .push(format!("PASS record with phase {other:?}")),
    }
}

fn on_memory(
    tool: &DemoTool,
    operation: KernelReplayOperation,
    phase: CallbackPhase,
    payload: &KernelReplayMemoryData,
) {
    let info = payload.dispatch_info;
    let what = if operation == KernelReplayOperation::SNAPSHOT {
        "SNAPSHOT"
    } else {
        "RESTORE"
    };
    let Some(state) = tool.state(info.dispatch_id, None, what) else {
        return;
    };
    let mut progress = lock(&state.progress);
    let after_pass = payload.current_pass;
    let event = match (operation, phase) {
        (KernelReplayOperation::SNAPSHOT, CallbackPhase::ENTER) => ReplayEvent::SnapshotEnter,
        (KernelReplayOperation::SNAPSHOT, CallbackPhase::EXIT) => ReplayEvent::SnapshotExit,
        (_, CallbackPhase::ENTER) => ReplayEvent::RestoreEnter { after_pass },
        (_, CallbackPhase::EXIT) => ReplayEvent::RestoreExit { after_pass },
        (_, other) => {
            progress
                .observation
                .problems
                .push(format!("{what} record with phase {other:?}"));
            return;
        }
    };
    progress.follow(event);
    if phase == CallbackPhase::EXIT {
        let memory = MemoryEvent::from_payload(payload);
        if memory.status != Status::SUCCESS {
            progress
                .observation
                .problems
                .push(format!("{what} EXIT reported {}", memory.status));
        }
        if operation == KernelReplayOperation::SNAPSHOT {
            progress.observation.snapshot = Some(memory);
        } else {
            progress.observation.restores.push(memory);
        }
    }
}
