//! kreplay as an HSA tools library: `OnLoad` / `OnUnload`, and the bridge between the HSA backend
//! and the tools configured through the C ABI.
//!
//! [`on_load`] reads the `KREPLAY_*` configuration, initializes every tool (their
//! `kreplay_configure` / initialize, where contexts and services are configured), and installs
//! the HSA backend into the runtime's table with `Hooks` as its view of the tools: the
//! KERNEL_REPLAY owner drives each replay through `CReplayTool`, and KERNEL_DISPATCH services
//! receive one COMPLETE record per executed kernel (per pass when replayed, filtered by the
//! pass's context mask).

use std::ffi::{c_char, c_void};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use kreplay_ctxmask::ContextRegistry;
use kreplay_hsa::{DispatchRecord, InstallOptions, ToolHooks};
use kreplay_passloop::{
    ContinueChange, DispatchInfo, LoopLimits, MemoryOpReport, Phase, ReplayOutcome, ReplayRecord,
    ReplayTool, RestoreRequest,
};
use parking_lot::Mutex;

use crate::abi::{
    AgentId, CallbackPhase, DeclineReason, Dim3, KernelDispatchData, KernelDispatchInfo,
    KernelDispatchOperation, KernelReplayData, KernelReplayMemoryData, KernelReplayOperation,
    QueueId, ReplayOutcomeKind, RestoreStrategy, SnapshotTier, Status, UserData,
};
use crate::config::Config;
use crate::logging::{self, Severity};
use crate::services::{self, CallbackService, TraceEvent};

static SKIP_RESTORE: AtomicBool = AtomicBool::new(false);
/// `KREPLAY_MAX_PASSES` as read at load.
static MAX_PASSES: AtomicU64 = AtomicU64::new(kreplay_passloop::DEFAULT_MAX_PASSES);
/// `KREPLAY_REPLAY_BUDGET_MS` as read at load (0: no budget).
static BUDGET_MS: AtomicU64 = AtomicU64::new(0);
/// `KREPLAY_PASSES` as read at load: the built-in tool's passes (1: off).
static BUILTIN_PASSES: AtomicU64 = AtomicU64::new(1);
static COLLECT_RECORDS: AtomicBool = AtomicBool::new(false);
static RECORDS: Mutex<Vec<ReplayRecord>> = Mutex::new(Vec::new());

/// This module's locks in the order they nest, taken before a fork (see `crate::fork`).
pub(crate) static FORK_LOCKS: [&crate::fork::Held; 1] = [&RECORDS];

/// Makes replay skip every restore (set before [`on_load`]). Only to demonstrate the wrong
/// results replay without restore gives; never in a real tool.
pub fn set_skip_restore_for_demo(skip: bool) {
    SKIP_RESTORE.store(skip, Ordering::Relaxed);
}

/// Keeps the cost record of every dispatch that goes through the replay loop, for
/// [`take_replay_records`]. Off by default (a long-running process would accumulate them).
pub fn set_collect_replay_records(collect: bool) {
    COLLECT_RECORDS.store(collect, Ordering::Relaxed);
}

/// Names kernels in kreplay's warnings: `names` maps a kernel object to its name (`None`
/// where it does not know it). For a host that knows its kernels, like the demo on softhsa;
/// without it, warnings name a kernel by its object.
pub fn set_kernel_names(names: fn(u64) -> Option<&'static str>) {
    let _ = KERNEL_NAMES.set(names);
}

static KERNEL_NAMES: std::sync::OnceLock<fn(u64) -> Option<&'static str>> =
    std::sync::OnceLock::new();

/// The records kept since the last call (see [`set_collect_replay_records`]).
pub fn take_replay_records() -> Vec<ReplayRecord> {
    std::mem::take(&mut *RECORDS.lock())
}

/// What the exported `OnLoad` does: configuration, tool initialization, backend installation.
///
/// # Safety
/// `table` must be the runtime's valid `HsaApiTable`, modifiable and alive for every later call
/// through it (the `OnLoad` contract).
pub unsafe fn on_load(table: *mut hsa_sys::HsaApiTable) -> Result<(), String> {
    let config = Config::from_env().map_err(|e| e.to_string())?;
    // A host with a logger of its own keeps it; any other gets kreplay's stderr sink.
    logging::install_stderr_logger();
    logging::set_level(config.log);
    // Everything that can refuse the load is checked before any tool code runs: a tool
    // initialized into a kreplay that then fails to load would be left without replay.
    // SAFETY: forwarded from the caller (null is checked, not read).
    unsafe { kreplay_hsa::check_table(table) }.map_err(|e| e.to_string())?;
    check_snapshot_config(&config)?;
    let record_dir = crate::run_record::dir_from_env()?;
    apply_limits(&config);
    let report = crate::lifecycle::initialize_tools().map_err(|e| e.to_string())?;
    start_recording(record_dir, "hsa", &report);
    let options = InstallOptions {
        snapshot: config.snapshot_config(),
        drain: kreplay_drain::DrainConfig::new(config.drain_timeout),
        skip_restore: SKIP_RESTORE.load(Ordering::Relaxed),
        ..InstallOptions::default()
    };
    // SAFETY: forwarded from the caller.
    unsafe { kreplay_hsa::install(table, Arc::new(Hooks), options) }.map_err(|e| e.to_string())
}

/// The snapshot settings' own checks (a spill folder no file can be created in, say), made
/// before any tool is initialized: the backend would refuse them only at its installation,
/// after the tools had run, and a tool initialized into a kreplay that fails to load is never
/// finalized.
pub(crate) fn check_snapshot_config(config: &Config) -> Result<(), String> {
    config.check_snapshot_config()
}

/// Takes the loop limits and the built-in tool's passes from `config` (at load, on either
/// backend).
pub(crate) fn apply_limits(config: &Config) {
    MAX_PASSES.store(config.max_passes, Ordering::Relaxed);
    BUDGET_MS.store(
        config
            .replay_budget
            .map_or(0, |b| b.as_millis().clamp(1, u128::from(u64::MAX)) as u64),
        Ordering::Relaxed,
    );
    BUILTIN_PASSES.store(config.passes, Ordering::Relaxed);
}

/// The built-in tool's passes (`KREPLAY_PASSES`; 1: off).
pub(crate) fn builtin_passes() -> u64 {
    BUILTIN_PASSES.load(Ordering::Relaxed)
}

/// Whether dispatches go through the replay loop: a tool owns KERNEL_REPLAY, or the built-in
/// tool is on, or `kreplay run` records the run (then every dispatch is counted, replayed or
/// not: without a tool that replays, each runs once through the loop).
pub(crate) fn replay_wanted() -> bool {
    services::replay_configured() || builtin_passes() > 1 || crate::run_record::active()
}

/// The tool that decides one dispatch: the KERNEL_REPLAY owner's callbacks, else the built-in
/// tool when `KREPLAY_PASSES` asks for replay or the run is recorded (one pass: the dispatch
/// runs once and is counted); `None` otherwise. Its memory reports are noted for the run
/// record.
pub(crate) fn tool_for_dispatch() -> Option<Box<dyn ReplayTool>> {
    match services::replay_owner() {
        Some(owner) => Some(Box::new(crate::run_record::Recording(CReplayTool::new(
            Some(owner),
        )))),
        None if builtin_passes() > 1 || crate::run_record::active() => Some(Box::new(
            crate::run_record::Recording(crate::run_record::built_in_passes(builtin_passes())),
        )),
        None => None,
    }
}

/// Starts the run record when `KREPLAY_RECORD_DIR` named a folder (`dir`, from
/// [`crate::run_record::dir_from_env`]); it is written there at unload and at exit.
pub(crate) fn start_recording(
    dir: Option<std::path::PathBuf>,
    backend: &str,
    tools: &crate::lifecycle::InitReport,
) {
    let Some(dir) = dir else {
        return;
    };
    let (tool, passes) = if services::replay_configured() {
        ("tools", 0)
    } else {
        ("built-in", builtin_passes())
    };
    crate::run_record::start(dir, backend, tool, passes, tools.problems(), tools.notes());
    // SAFETY: registers a plain extern "C" function that never unwinds.
    unsafe { atexit(write_record_at_exit) };
}

unsafe extern "C" {
    fn atexit(f: extern "C" fn()) -> std::ffi::c_int;
}

extern "C" fn write_record_at_exit() {
    let _ = std::panic::catch_unwind(crate::run_record::write);
}

/// What the exported `OnUnload` does: replay stops, tools are finalized, and the replay
/// counters are printed (`KREPLAY_LOG=info`).
pub fn on_unload() {
    kreplay_hsa::finalize();
    // Kernels that finished while their ENQUEUE EXIT ran have their COMPLETE held until it
    // returned; the application may have seen them complete: delivered before the contexts
    // stop. Bounded like the wait for callbacks at finalization.
    if !kreplay_hsa::deliver_held_completions(Duration::from_secs(10)) {
        logging::log(
            Severity::Warn,
            format_args!(
                "an ENQUEUE callback did not return within 10 s of OnUnload: the COMPLETE \
                 records it held back are not delivered"
            ),
        );
    }
    crate::lifecycle::finalize_tools();
    crate::run_record::write();
    if services::replay_configured() || crate::counters::snapshot().dispatches > 0 {
        crate::kreplay_info!("{}", crate::counters::summary(&crate::counters::snapshot()));
    }
}

/// The loop limits read at load (`KREPLAY_MAX_PASSES`, `KREPLAY_REPLAY_BUDGET_MS`).
pub(crate) fn loop_limits() -> LoopLimits {
    let budget_ms = BUDGET_MS.load(Ordering::Relaxed);
    LoopLimits::new(MAX_PASSES.load(Ordering::Relaxed))
        .with_budget((budget_ms > 0).then(|| Duration::from_millis(budget_ms)))
}

/// HSA tools-library entry point: the runtime calls it with its API table at start-up.
///
/// # Safety
/// Called by the HSA runtime with its valid API table.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn OnLoad(
    table: *mut hsa_sys::HsaApiTable,
    _runtime_version: u64,
    _failed_tool_count: u64,
    _failed_tool_names: *const *const c_char,
) -> bool {
    let loaded = std::panic::catch_unwind(|| {
        // SAFETY: the runtime passes its valid table.
        unsafe { on_load(table) }
    });
    match loaded {
        Ok(Ok(())) => true,
        Ok(Err(why)) => {
            logging::report_failure(format_args!("not loaded: {why}"));
            // Loaded before in this process and recording (`kreplay run`): the runtime was
            // started again, and the record says that session's kernels are missing.
            if crate::run_record::active() {
                let _ = std::panic::catch_unwind(crate::run_record::note_unprofiled_session);
            }
            false
        }
        Err(_) => {
            logging::report_failure(format_args!("not loaded: internal error"));
            false
        }
    }
}

/// HSA tools-library entry point: the runtime calls it at shutdown.
#[unsafe(no_mangle)]
pub extern "C" fn OnUnload() {
    if std::panic::catch_unwind(on_unload).is_err() {
        logging::report_failure(format_args!("internal error while unloading"));
    }
}

/// The C view of a dispatch.
pub(crate) fn c_dispatch_info(info: &DispatchInfo) -> KernelDispatchInfo {
    dispatch_info(info)
}

fn dispatch_info(info: &DispatchInfo) -> KernelDispatchInfo {
    let dim = |d: [u32; 3]| Dim3 {
        x: d[0],
        y: d[1],
        z: d[2],
    };
    KernelDispatchInfo {
        agent_id: AgentId {
            handle: info.agent_id,
        },
        queue_id: QueueId {
            handle: info.queue_id,
        },
        kernel_id: info.kernel_id,
        dispatch_id: info.dispatch_id,
        private_segment_size: info.private_segment_size,
        group_segment_size: info.group_segment_size,
        workgroup_size: dim(info.workgroup_size),
        grid_size: dim(info.grid_size),
        ..Default::default()
    }
}

/// The backend's view of the tools configured through the C ABI.
struct Hooks;

impl ToolHooks for Hooks {
    fn replay_configured(&self) -> bool {
        replay_wanted()
    }

    fn dispatch_tracing_configured(&self) -> bool {
        services::dispatch_tracing_configured()
    }

    fn replay_tool(&self) -> Box<dyn ReplayTool + '_> {
        tool_for_dispatch().unwrap_or_else(|| Box::new(CReplayTool::new(None)))
    }

    fn contexts(&self) -> &ContextRegistry {
        ContextRegistry::global()
    }

    fn dispatch_completed(&self, record: &DispatchRecord) {
        dispatch_completed(&record.info, record.pass, record.start_ns, record.end_ns);
    }

    fn dispatch_enqueue(
        &self,
        infos: &[DispatchInfo],
        pass: Option<u64>,
        submit: &mut dyn FnMut(),
    ) {
        let enqueue = EnqueueRecords::enter(infos, pass);
        submit();
        enqueue.exit();
    }

    fn counting_configured(&self) -> bool {
        crate::counting::configured()
    }

    fn dispatch_counters(&self, info: &DispatchInfo, pass: Option<u64>) -> Option<Vec<u32>> {
        crate::counting::pick(info, pass)
    }

    fn counters_collected(
        &self,
        info: &DispatchInfo,
        pass: Option<u64>,
        ids: &[u32],
        values: &[f64],
    ) {
        crate::counting::deliver(info, pass, ids, values);
    }

    fn replay_finished(&self, record: &ReplayRecord) {
        crate::counters::record_dispatch(record);
        if crate::run_record::active() {
            let name = self
                .kernel_name(record.info.kernel_id)
                .unwrap_or_else(|| format!("kernel {:#x}", record.info.kernel_id));
            crate::run_record::add(record, &name);
        }
        if COLLECT_RECORDS.load(Ordering::Relaxed) {
            RECORDS.lock().push(record.clone());
        }
    }

    fn kernel_name(&self, kernel_object: u64) -> Option<String> {
        KERNEL_NAMES
            .get()
            .and_then(|names| names(kernel_object))
            .map(str::to_string)
    }

    fn warn(&self, message: &str) {
        logging::log(Severity::Warn, format_args!("{message}"));
    }

    fn warn_once(&self, key: &'static str, message: &str) {
        logging::warn_once(key, format_args!("{message}"));
    }
}

fn tier(t: kreplay_passloop::StoreTier) -> SnapshotTier {
    match t {
        kreplay_passloop::StoreTier::None => SnapshotTier::NONE,
        kreplay_passloop::StoreTier::Device => SnapshotTier::DEVICE,
        kreplay_passloop::StoreTier::Host => SnapshotTier::HOST,
        kreplay_passloop::StoreTier::File => SnapshotTier::FILE,
        _ => SnapshotTier::NONE,
    }
}

/// KERNEL_DISPATCH ENQUEUE of one submission (ordinary dispatches, `pass == None`, or one pass
/// of a replay): [`enter`](Self::enter) delivers ENTER before it to every dispatch tracing
/// service whose context is active on the calling thread, [`exit`](Self::exit) EXIT after it to
/// those of them still active then (a context started in between gets no EXIT without its
/// ENTER). ENTER and EXIT of one dispatch share a correlation id and, per service, the
/// `user_data`; every service gets its own copy of the payload in every record (the payload has
/// no field a tool sets: what one service writes there reaches no other record). Both backends
/// deliver through here.
pub(crate) struct EnqueueRecords {
    tracers: Arc<[CallbackService]>,
    /// The pass these submissions are, or `None` for a dispatch that is no pass of a replay.
    pass: Option<u64>,
    payloads: Vec<KernelDispatchData>,
    correlation: Vec<u64>,
    /// One per (service, dispatch), service-major.
    user_data: Vec<UserData>,
    /// Whether the service received the dispatch's ENTER; indexed like `user_data`.
    entered: Vec<bool>,
}

impl EnqueueRecords {
    /// ENQUEUE ENTER of `infos`, about to be submitted.
    pub(crate) fn enter(infos: &[DispatchInfo], pass: Option<u64>) -> EnqueueRecords {
        let tracers = services::dispatch_tracers();
        let payloads = infos
            .iter()
            .map(|info| {
                let mut payload = KernelDispatchData::new(dispatch_info(info));
                if let Some(pass) = pass {
                    payload.replay_pass = pass;
                }
                payload
            })
            .collect();
        let correlation = infos
            .iter()
            .map(|_| services::next_correlation_id())
            .collect();
        let user_data = vec![UserData::ZERO; tracers.len() * infos.len()];
        let entered = vec![false; tracers.len() * infos.len()];
        let mut records = EnqueueRecords {
            tracers,
            pass,
            payloads,
            correlation,
            user_data,
            entered,
        };
        records.deliver(CallbackPhase::ENTER);
        records
    }

    /// ENQUEUE EXIT: the submission happened.
    pub(crate) fn exit(mut self) {
        self.deliver(CallbackPhase::EXIT);
    }

    fn deliver(&mut self, phase: CallbackPhase) {
        let dispatches = self.payloads.len();
        for (s, service) in self.tracers.iter().enumerate() {
            for (d, payload) in self.payloads.iter().enumerate() {
                let mut copy = *payload;
                let event = TraceEvent {
                    operation: KernelDispatchOperation::ENQUEUE.0,
                    phase,
                    correlation_id: self.correlation[d],
                    decline_reason: DeclineReason::NONE,
                    payload: (&mut copy as *mut KernelDispatchData).cast::<c_void>(),
                };
                let at = s * dispatches + d;
                if phase == CallbackPhase::EXIT && !self.entered[at] {
                    continue;
                }
                // SAFETY: a KERNEL_DISPATCH payload, alive and exclusively ours for the call.
                let delivered = unsafe {
                    deliver_dispatch(service, self.pass, &event, &mut self.user_data[at])
                };
                if phase == CallbackPhase::ENTER {
                    self.entered[at] = delivered;
                }
            }
        }
    }
}

/// KERNEL_DISPATCH COMPLETE of one executed kernel (an ordinary dispatch, `pass == None`, or one
/// pass of a replay) to every dispatch tracing service whose context is active on this thread
/// now; both backends deliver through here.
pub(crate) fn dispatch_completed(
    info: &kreplay_passloop::DispatchInfo,
    pass: Option<u64>,
    start_ns: u64,
    end_ns: u64,
) {
    let mut payload = KernelDispatchData::new(dispatch_info(info));
    payload.start_timestamp = start_ns;
    payload.end_timestamp = end_ns;
    if let Some(pass) = pass {
        payload.replay_pass = pass;
    }
    let correlation_id = services::next_correlation_id();
    for service in services::dispatch_tracers().iter() {
        // Each service its own copy: what one writes into it reaches no other.
        let mut copy = payload;
        let event = TraceEvent {
            operation: KernelDispatchOperation::COMPLETE.0,
            phase: CallbackPhase::NONE,
            correlation_id,
            decline_reason: DeclineReason::NONE,
            payload: (&mut copy as *mut KernelDispatchData).cast::<c_void>(),
        };
        let mut user_data = UserData::ZERO;
        // SAFETY: a KERNEL_DISPATCH payload, alive and exclusively ours during the call.
        unsafe { deliver_dispatch(service, pass, &event, &mut user_data) };
    }
}

/// Delivers a KERNEL_DISPATCH record of `pass` to `service`. Replay masks apply only to the passes
/// of the replay that set them ("they only mask the current dispatch"): a record of a pass
/// consults the mask of this thread's innermost replay loop, whose pass it is; a dispatch that
/// is no pass (`None`: run once, or submitted by a tool from inside a replay callback) only its
/// context's started state, never the mask of a replay it happens to be submitted during.
///
/// # Safety
/// As for [`CallbackService::deliver`].
unsafe fn deliver_dispatch(
    service: &CallbackService,
    pass: Option<u64>,
    event: &TraceEvent,
    user_data: &mut UserData,
) -> bool {
    // SAFETY: forwarded from the caller.
    unsafe {
        if pass.is_some() {
            service.deliver(event, user_data)
        } else {
            service.deliver_if_started(event, user_data)
        }
    }
}

fn strategy(s: kreplay_passloop::RestoreStrategy) -> RestoreStrategy {
    match s {
        kreplay_passloop::RestoreStrategy::Full => RestoreStrategy::FULL,
        kreplay_passloop::RestoreStrategy::Hash => RestoreStrategy::HASH,
        // The C ABI names both write-set restores WRITESET; the payload's `unverified` field
        // says which ran. A tracked restore writes back the set of chunks it saw written:
        // WRITESET too, never unverified.
        kreplay_passloop::RestoreStrategy::Writeset
        | kreplay_passloop::RestoreStrategy::WritesetUnverified
        | kreplay_passloop::RestoreStrategy::Tracked => RestoreStrategy::WRITESET,
        _ => RestoreStrategy::FULL,
    }
}

fn phase(p: Phase) -> CallbackPhase {
    match p {
        Phase::Enter => CallbackPhase::ENTER,
        Phase::Exit => CallbackPhase::EXIT,
    }
}

/// The KERNEL_REPLAY owner's callbacks as the pass loop's tool, for one dispatch.
///
/// One payload lives for the whole dispatch, so what the tool sets at CONFIG ENTER
/// (`replay_pass_count`, `replay_continue`) and at PASS EXIT (a new `replay_continue`) stays; one
/// `user_data` is shared by every callback of the dispatch.
pub(crate) struct CReplayTool {
    owner: Option<CallbackService>,
    payload: KernelReplayData,
    user_data: UserData,
    correlation_id: u64,
    /// Per KERNEL_REPLAY operation: whether the owner received the ENTER now open, so that it
    /// gets the EXIT only then (a context started again in between gets no EXIT alone).
    entered: [bool; KernelReplayOperation::LAST.0 as usize],
}

impl CReplayTool {
    pub(crate) fn new(owner: Option<CallbackService>) -> Self {
        CReplayTool {
            owner,
            payload: KernelReplayData::new(KernelDispatchInfo::default()),
            user_data: UserData::ZERO,
            correlation_id: 0,
            entered: [false; KernelReplayOperation::LAST.0 as usize],
        }
    }

    /// Delivers one KERNEL_REPLAY record with `payload` to the owner (started contexts only; the
    /// owner's own replay mask does not silence it).
    fn deliver(
        &mut self,
        operation: KernelReplayOperation,
        phase: CallbackPhase,
        decline: DeclineReason,
        payload: *mut c_void,
    ) -> bool {
        let Some(owner) = self.owner else {
            return false;
        };
        let entered = self.entered.get(operation.0 as usize).copied();
        if phase == CallbackPhase::EXIT && entered != Some(true) {
            return false;
        }
        let event = TraceEvent {
            operation: operation.0,
            phase,
            correlation_id: self.correlation_id,
            decline_reason: decline,
            payload,
        };
        // SAFETY: `payload` points to the KERNEL_REPLAY payload type the header documents for
        // `operation`, alive and exclusively ours for the call.
        let delivered = unsafe { owner.deliver_if_started(&event, &mut self.user_data) };
        if let Some(entered) = self.entered.get_mut(operation.0 as usize) {
            match phase {
                CallbackPhase::ENTER => *entered = delivered,
                CallbackPhase::EXIT => *entered = false,
                _ => {}
            }
        }
        delivered
    }

    /// Calls one of the owner's function callbacks (pass count, continue) while its context is
    /// still started, counted as a running callback: a tool that finalized itself (its contexts
    /// stopped) is called no more, and a finalize on another thread waits for the call to end.
    /// `None` when the owner is gone.
    fn call_owner<R>(&self, call: impl FnOnce() -> R) -> Option<R> {
        let owner = self.owner?;
        services::call_if_active(owner.context, false, || {
            // A service its tool configured on a context not its own outlives the tool's
            // finalize unless retired.
            (!services::is_retired(owner.context, Some(owner.kind))).then(call)
        })
        .flatten()
    }

    /// Delivers a CONFIG or PASS record. The tool gets a copy of kreplay's payload: only the
    /// fields the header lets it set are read back (`replay_pass_count` and `replay_continue` at
    /// CONFIG ENTER, `replay_continue` at PASS EXIT), so what it writes anywhere else (the
    /// dispatch, the pass indices, the CONFIG EXIT fields) never reaches a later record or the
    /// pass-count and continue callbacks. PASS ENTER's copy carries the context toggles.
    fn deliver_replay(
        &mut self,
        operation: KernelReplayOperation,
        phase: CallbackPhase,
        decline: DeclineReason,
    ) -> bool {
        let mut copy = self.payload;
        let pass_enter = operation == KernelReplayOperation::PASS && phase == CallbackPhase::ENTER;
        if pass_enter {
            crate::replay::arm_toggles(&mut copy);
        }
        let payload = (&mut copy as *mut KernelReplayData).cast::<c_void>();
        let delivered = self.deliver(operation, phase, decline, payload);
        if delivered {
            match (operation, phase) {
                (KernelReplayOperation::CONFIG, CallbackPhase::ENTER) => {
                    self.payload.replay_pass_count = copy.replay_pass_count;
                    self.payload.replay_continue = copy.replay_continue;
                }
                (KernelReplayOperation::PASS, CallbackPhase::EXIT) => {
                    self.payload.replay_continue = copy.replay_continue;
                }
                _ => {}
            }
        }
        delivered
    }

    fn deliver_memory(
        &mut self,
        operation: KernelReplayOperation,
        phase: Phase,
        pass: u64,
        report: &MemoryOpReport,
    ) {
        let mut data = KernelReplayMemoryData::new(self.payload.dispatch_info);
        data.current_pass = pass;
        data.bytes_planned = report.bytes_planned;
        data.bytes_moved = report.bytes_moved;
        data.regions = report.regions;
        data.chunks_restored = if operation == KernelReplayOperation::RESTORE {
            report.chunks
        } else {
            0
        };
        data.tier = tier(report.tier);
        // Before the snapshot nothing is chosen yet (under auto, not before each restore):
        // the strategy does not apply there.
        data.strategy = if operation == KernelReplayOperation::SNAPSHOT && phase == Phase::Enter {
            RestoreStrategy::NONE
        } else {
            strategy(report.strategy)
        };
        if operation == KernelReplayOperation::SNAPSHOT {
            let s = &report.sources;
            data.agent_regions = s.agent.regions;
            data.agent_bytes = s.agent.bytes;
            data.referenced_regions = s.referenced.regions;
            data.referenced_bytes = s.referenced.bytes;
            data.module_variable_regions = s.module_variables.regions;
            data.module_variable_bytes = s.module_variables.bytes;
            data.adopted_regions = s.adopted.regions;
            data.adopted_bytes = s.adopted.bytes;
            if phase == Phase::Exit && report.declined.is_none() {
                crate::kreplay_info!(
                    "dispatch {} snapshot: {} region(s), {} bytes ({} tier): agent memory {} ({} B), \
                     referenced {} ({} B), module variables {} ({} B), adopted {} ({} B)",
                    self.payload.dispatch_info.dispatch_id,
                    report.regions,
                    report.bytes_moved,
                    report.tier.as_str(),
                    s.agent.regions,
                    s.agent.bytes,
                    s.referenced.regions,
                    s.referenced.bytes,
                    s.module_variables.regions,
                    s.module_variables.bytes,
                    s.adopted.regions,
                    s.adopted.bytes
                );
            }
        }
        if phase == Phase::Exit {
            if let Some(reason) = report.declined {
                data.status = Status::ERROR_REPLAY_DECLINED;
                data.decline_reason = crate::counters::decline_reason(reason);
            } else if report.failed {
                data.status = Status::ERROR_RESTORE_FAILED;
                data.bytes_lost = report.bytes_lost;
            }
            if operation == KernelReplayOperation::RESTORE {
                data.chunks_repaired = report.repaired_chunks;
                data.unverified = u32::from(report.unverified);
                crate::counters::record_restore(report);
            }
        }
        let payload = (&mut data as *mut KernelReplayMemoryData).cast::<c_void>();
        self.deliver(operation, self::phase(phase), DeclineReason::NONE, payload);
    }
}

impl ReplayTool for CReplayTool {
    fn limits(&self) -> LoopLimits {
        loop_limits()
    }

    fn config_enter(&mut self, info: &DispatchInfo) -> kreplay_passloop::ToolAnswer {
        self.payload = KernelReplayData::new(dispatch_info(info));
        self.correlation_id = services::next_correlation_id();
        if !self.deliver_replay(
            KernelReplayOperation::CONFIG,
            CallbackPhase::ENTER,
            DeclineReason::NONE,
        ) {
            return kreplay_passloop::ToolAnswer::OPT_OUT;
        }
        let Some(pass_count) = self.payload.replay_pass_count else {
            return kreplay_passloop::ToolAnswer::OPT_OUT;
        };
        let (info, user_data) = (self.payload.dispatch_info, self.user_data);
        let Some(n) = self.call_owner(|| {
            // SAFETY: the tool's own `kreplay_pass_count_cb_t`, called with the documented
            // arguments.
            unsafe { pass_count(info, user_data) }
        }) else {
            return kreplay_passloop::ToolAnswer::OPT_OUT;
        };
        kreplay_passloop::ToolAnswer::new(Some(n), self.payload.replay_continue.is_some())
    }

    fn pass_enter(&mut self, _info: &DispatchInfo, pass: u64, total_passes: u64) {
        self.payload.current_pass = pass;
        self.payload.total_passes = total_passes;
        self.deliver_replay(
            KernelReplayOperation::PASS,
            CallbackPhase::ENTER,
            DeclineReason::NONE,
        );
    }

    fn pass_exit(&mut self, _info: &DispatchInfo, pass: u64, total_passes: u64) -> ContinueChange {
        self.payload.current_pass = pass;
        self.payload.total_passes = total_passes;
        let before = self.payload.replay_continue.map(|f| f as usize);
        self.deliver_replay(
            KernelReplayOperation::PASS,
            CallbackPhase::EXIT,
            DeclineReason::NONE,
        );
        match (before, self.payload.replay_continue.map(|f| f as usize)) {
            (Some(a), Some(b)) if a == b => ContinueChange::Keep,
            (None, None) => ContinueChange::Keep,
            (_, Some(_)) => ContinueChange::Set,
            (Some(_), None) => ContinueChange::Clear,
        }
    }

    fn should_continue(
        &mut self,
        _info: &DispatchInfo,
        current_pass: u64,
        total_passes: u64,
    ) -> bool {
        let (info, user_data) = (self.payload.dispatch_info, self.user_data);
        let next = match self.payload.replay_continue {
            Some(f) => self.call_owner(|| {
                // SAFETY: the tool's own `kreplay_continue_cb_t`, called with the documented
                // arguments.
                unsafe { f(info, current_pass, total_passes, user_data) != 0 }
            }),
            None => self.call_owner(|| true),
        };
        // None: finalized (or its context stopped) since: no more passes for it.
        next.unwrap_or(false)
    }

    fn snapshot(&mut self, _info: &DispatchInfo, phase: Phase, report: &MemoryOpReport) {
        self.deliver_memory(KernelReplayOperation::SNAPSHOT, phase, 0, report);
    }

    fn restore(
        &mut self,
        _info: &DispatchInfo,
        phase: Phase,
        request: &RestoreRequest,
        report: &MemoryOpReport,
    ) {
        self.deliver_memory(
            KernelReplayOperation::RESTORE,
            phase,
            request.completed_pass,
            report,
        );
    }

    fn config_exit(&mut self, _info: &DispatchInfo, outcome: &ReplayOutcome) {
        let passes = match outcome {
            ReplayOutcome::Replayed { passes, .. } => *passes,
            ReplayOutcome::RanOnce { .. } => 1,
            ReplayOutcome::PassFailed { pass, .. } => pass + 1,
            ReplayOutcome::RestoreFailed { after_pass, .. } => after_pass + 1,
        };
        let (kind, end, reason) = crate::counters::classify(outcome);
        let p = &mut self.payload;
        // total_passes is a PASS field: it does not apply at CONFIG EXIT (passes_run does).
        p.total_passes = 0;
        p.current_pass = passes;
        p.passes_run = passes;
        p.outcome = kind;
        p.end_reason = end;
        p.decline_reason = reason;
        p.status = match kind {
            ReplayOutcomeKind::DECLINED => Status::ERROR_REPLAY_DECLINED,
            ReplayOutcomeKind::PASS_FAILED => Status::ERROR,
            ReplayOutcomeKind::RESTORE_FAILED => Status::ERROR_RESTORE_FAILED,
            _ => Status::SUCCESS,
        };
        p.bytes_lost = match outcome {
            ReplayOutcome::RestoreFailed { failure, .. } => failure.bytes_unrestored,
            _ => 0,
        };
        // The record's own field keeps its meaning: why the dispatch was not replayed.
        let record_reason =
            if kind == ReplayOutcomeKind::DECLINED || kind == ReplayOutcomeKind::PASS_FAILED {
                reason
            } else {
                DeclineReason::NONE
            };
        self.deliver_replay(
            KernelReplayOperation::CONFIG,
            CallbackPhase::EXIT,
            record_reason,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::services::OperationFilter;
    use kreplay_passloop::{Decline, LoopEnd, RanOnceReason, RestoreFailure};

    /// What one KERNEL_REPLAY record carried: (operation, phase, record's decline reason, the
    /// replay payload if CONFIG/PASS, the memory payload if SNAPSHOT/RESTORE).
    type Seen = (
        u32,
        CallbackPhase,
        DeclineReason,
        Option<KernelReplayData>,
        Option<KernelReplayMemoryData>,
    );

    static SEEN: Mutex<Vec<Seen>> = Mutex::new(Vec::new());

    unsafe extern "C" fn record(
        record: crate::abi::CallbackRecord,
        _user: *mut UserData,
        _data: *mut c_void,
    ) {
        let (mut replay, mut memory) = (None, None);
        // SAFETY: KERNEL_REPLAY payloads by operation, as the header documents; valid during the
        // call.
        unsafe {
            if record.operation == KernelReplayOperation::CONFIG.0
                || record.operation == KernelReplayOperation::PASS.0
            {
                let p = record.payload.cast::<KernelReplayData>();
                if record.phase == CallbackPhase::ENTER
                    && record.operation == KernelReplayOperation::CONFIG.0
                {
                    unsafe extern "C" fn three(_: KernelDispatchInfo, _: UserData) -> u64 {
                        3
                    }
                    (*p).replay_pass_count = Some(three);
                }
                replay = Some(*p);
            } else {
                memory = Some(*record.payload.cast::<KernelReplayMemoryData>());
            }
        }
        SEEN.lock().push((
            record.operation,
            record.phase,
            record.decline_reason,
            replay,
            memory,
        ));
    }

    fn tool() -> CReplayTool {
        let registry = ContextRegistry::global();
        let context = registry.create();
        registry.start(context).unwrap();
        CReplayTool::new(Some(CallbackService {
            context,
            kind: crate::abi::CallbackKind::KERNEL_REPLAY,
            operations: OperationFilter::all_of(crate::abi::CallbackKind::KERNEL_REPLAY),
            callback: record,
            callback_data: std::ptr::null_mut(),
        }))
    }

    fn last() -> Seen {
        *SEEN.lock().last().expect("a record")
    }

    /// Every unhappy ending reaches the C payloads, not only stderr: a declined snapshot, a
    /// failed restore with the bytes lost, a repair, an unverified restore, and each CONFIG EXIT.
    #[test]
    fn declines_failures_and_repairs_reach_the_c_payloads() {
        let info = DispatchInfo::default();
        let mut t = tool();
        assert_eq!(t.config_enter(&info).pass_count, Some(3));

        t.snapshot(&info, Phase::Enter, &MemoryOpReport::default());
        t.snapshot(
            &info,
            Phase::Exit,
            &MemoryOpReport {
                bytes_planned: 4096,
                declined: Some(kreplay_passloop::DeclineReason::FootprintBudget),
                ..Default::default()
            },
        );
        let m = last().4.expect("memory payload");
        assert_eq!(
            (m.status, m.decline_reason, m.bytes_moved),
            (
                Status::ERROR_REPLAY_DECLINED,
                DeclineReason::FOOTPRINT_BUDGET,
                0
            )
        );

        let request = RestoreRequest {
            completed_pass: 1,
            next_pass: 2,
            next_may_be_final: true,
        };
        t.restore(&info, Phase::Enter, &request, &MemoryOpReport::default());
        t.restore(
            &info,
            Phase::Exit,
            &request,
            &MemoryOpReport {
                bytes_moved: 100,
                failed: true,
                bytes_lost: 900,
                ..Default::default()
            },
        );
        let m = last().4.expect("memory payload");
        assert_eq!(
            (m.status, m.bytes_lost, m.current_pass),
            (Status::ERROR_RESTORE_FAILED, 900, 1)
        );

        t.restore(&info, Phase::Enter, &request, &MemoryOpReport::default());
        t.restore(
            &info,
            Phase::Exit,
            &request,
            &MemoryOpReport {
                chunks: 3,
                repaired_chunks: 2,
                unverified: true,
                ..Default::default()
            },
        );
        let m = last().4.expect("memory payload");
        assert_eq!(
            (m.status, m.chunks_restored, m.chunks_repaired, m.unverified),
            (Status::SUCCESS, 3, 2, 1)
        );

        let endings = [
            (
                ReplayOutcome::RestoreFailed {
                    after_pass: 1,
                    failure: RestoreFailure {
                        report: MemoryOpReport::default(),
                        bytes_unrestored: 900,
                        detail: String::new(),
                    },
                },
                (
                    ReplayOutcomeKind::RESTORE_FAILED,
                    crate::abi::ReplayEnd::NONE,
                    Status::ERROR_RESTORE_FAILED,
                    DeclineReason::NONE,
                    2,
                    900,
                ),
            ),
            (
                ReplayOutcome::Replayed {
                    passes: 2,
                    end: LoopEnd::Budget,
                },
                (
                    ReplayOutcomeKind::ENDED_EARLY,
                    crate::abi::ReplayEnd::BUDGET,
                    Status::SUCCESS,
                    DeclineReason::NONE,
                    2,
                    0,
                ),
            ),
            (
                ReplayOutcome::RanOnce {
                    why: RanOnceReason::Declined(Decline::new(
                        kreplay_passloop::DeclineReason::SnapshotFailed,
                        "no signal",
                    )),
                },
                (
                    ReplayOutcomeKind::DECLINED,
                    crate::abi::ReplayEnd::NONE,
                    Status::ERROR_REPLAY_DECLINED,
                    DeclineReason::SNAPSHOT_FAILED,
                    1,
                    0,
                ),
            ),
        ];
        for (outcome, expected) in endings {
            // An EXIT reaches the owner only after its ENTER.
            t.config_enter(&info);
            t.config_exit(&info, &outcome);
            let (operation, phase, record_reason, replay, _) = last();
            assert_eq!(
                (operation, phase),
                (KernelReplayOperation::CONFIG.0, CallbackPhase::EXIT)
            );
            let p = replay.expect("replay payload");
            assert_eq!(
                (
                    p.outcome,
                    p.end_reason,
                    p.status,
                    p.decline_reason,
                    p.passes_run,
                    p.bytes_lost
                ),
                expected,
                "{outcome:?}"
            );
            assert_eq!(record_reason, expected.3, "the record's own field agrees");
        }
    }
}
