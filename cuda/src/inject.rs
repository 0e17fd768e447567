//! Injection into unmodified CUDA applications: the CUPTI driver-API callback, allocation
//! tracking, copy fencing and the replay of every launch through a tool.
//!
//! libkreplay (the library named by `CUDA_INJECTION64_PATH`) exports `InitializeInjection`, which
//! the driver calls during `cuInit`; it calls [`initialize_injection`] with its [`Tools`]: the
//! tools configured through the C ABI (`kreplay.h`), or the built-in tool that replays every
//! launch N times ([`BuiltIn`], `KREPLAY_PASSES`). kreplay then subscribes to CUPTI's driver-API
//! callbacks for allocations, frees, virtual-memory mappings, copies, memsets and launches, and
//! at exit prints a summary on standard error and hands the totals to the tools.

use crate::late::{self, Late};
use kreplay_wtrack::threads::NoCancel;
use std::cell::RefCell;
use std::collections::BTreeMap;
use std::ffi::{CStr, c_int, c_void};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use kreplay_ctxmask::ContextRegistry;
use kreplay_locks::{AgentGroups, AgentLocks};
use kreplay_passloop::{DispatchInfo, ReplayOutcome, ReplayRecord, ReplayTool};
use kreplay_snapshot::{
    Allocation, Capture, Delta, Filter, Footprint, Inventory, MemoryKind, NewAllocation,
    RestoreStrategy, SnapshotScope, Snapshotter,
};
use parking_lot::Mutex;

use crate::capture::{CaptureStream, Captures};
use crate::choice::{ChoiceKey, DeviceChoice, per_restore_ns};
use crate::config::{Config, LogLevel};
use crate::contexts::{Contexts, SyncError};
use crate::cupti::{
    self, API_ENTER, API_EXIT, CB_DOMAIN_DRIVER_API, CB_DOMAIN_RESOURCE,
    CBID_RESOURCE_CONTEXT_DESTROY_STARTING, CBID_RESOURCE_MODULE_LOADED,
    CBID_RESOURCE_MODULE_UNLOAD_STARTING, CallbackData, CallbackDomain, CallbackId,
    CtxEnablePeerAccessParams, Cupti, ExternalMemoryGetMappedBufferParams,
    GraphAddMemAllocNodeParams, GraphAddNodeParams, GraphAddNodeV2Params, GraphInstantiateParams,
    GraphLaunchParams, GraphicsMappedPointerParams, GraphicsUnmapParams,
    LaunchCooperativeKernelParams, LaunchKernelExParams, LaunchKernelParams, MemAllocAsyncParams,
    MemAllocFromPoolAsyncParams, MemAllocParams, MemAllocPitchParams, MemFreeAsyncParams,
    MemFreeParams, MemMapParams, MemPoolSetAccessParams, MemSetAccessParams, MemUnmapParams,
    ModuleResourceData, PointerOutParams, ResourceData, StreamCaptureParams, SubscriberHandle,
    SurfObjectCreateParams, SurfObjectDestroyParams, cbid,
};
use crate::devruntime::DeviceRuntime;
use crate::drainer::Drainer;
use crate::driver::{
    CU_STREAM_CAPTURE_STATUS_NONE, CUDA_ERROR_CONTEXT_IS_DESTROYED, CUDA_ERROR_INVALID_CONTEXT,
    CUDA_SUCCESS, CuContext, CuFunction, CuModule, CuResult, CuStream, Driver, DriverGraphs,
};
use crate::fence;
use crate::globals::{ModuleLookup, ModuleRegistry, Range};
use crate::graphmem::{CU_GRAPH_NODE_TYPE_MEM_ALLOC, GraphAlloc, GraphMemory, Place};
use crate::guard::Guard;
use crate::launch::{CudaLaunch, Launch, LaunchApi};
use crate::memory::{CudaMemory, MemoryTimes};
use crate::scope::{ArgumentsUnknown, Param, argument_values, launch_filter, untracked_at};
use crate::timing::PassTimer;
use crate::toolwork::{self, Before, Target, ToolWorkIo};
use crate::tracking::{Forgotten, MemoryWatch, UnmapUndo};
use crate::watchdog::Watchdog;
use crate::window::{Enqueued, LaunchOps, Mark, Window, WindowContext};

/// What the backend asks of the tool side.
pub trait Tools: Send + Sync + 'static {
    /// Whether any launch may be replayed (then ordinary launches, copies and memsets take the
    /// reader side of their device's lock).
    fn replay_wanted(&self) -> bool;
    /// The tool that decides one launch; `None`: launches are only tracked, never replayed.
    fn replay_tool(&self) -> Option<Box<dyn ReplayTool>>;
    /// The tool contexts (PASS ENTER's context toggles act on their replay masks).
    fn contexts(&self) -> &'static ContextRegistry;
    /// One launch went through the replay window (`kernel`: CUPTI's name for it).
    fn replay_finished(&self, _record: &ReplayRecord, _kernel: &str) {}
    /// Whether any KERNEL_DISPATCH tracing service is configured (asked at every launch: keep
    /// it cheap). Then every pass of a replayed launch, and every launch run once, is timed on
    /// the GPU and handed to [`dispatch_completed`](Self::dispatch_completed).
    fn dispatch_tracing_configured(&self) -> bool {
        false
    }
    /// A kernel finished: one pass of a replayed launch (`pass: Some`, on the launching thread
    /// before that pass's PASS EXIT, under its context mask) or a launch run once (`None`, at
    /// its API EXIT, on the launching thread).
    fn dispatch_completed(&self, _record: &DispatchRecord) {}
    /// KERNEL_DISPATCH ENQUEUE ENTER of a submission about to happen, on the launching thread:
    /// pass `Some(pass)` of a replayed launch (under its context mask) or a launch run once
    /// (`None`). Returns what delivers its EXIT right after the submission. Asked only while
    /// dispatch tracing is configured, for the launches whose completions are reported.
    fn dispatch_enqueue(&self, _info: &DispatchInfo, _pass: Option<u64>) -> Option<Enqueued> {
        None
    }
    /// The process is exiting; `summary` holds the backend's totals.
    fn at_exit(&self, _summary: &Summary) {}
}

/// One executed kernel: a launch run once (`pass == None`) or one pass of a replayed launch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DispatchRecord {
    /// The launch (the same `dispatch_id` for every pass of one replay).
    pub info: kreplay_passloop::DispatchInfo,
    /// The pass index when replayed.
    pub pass: Option<u64>,
    /// Begin on the GPU, nanoseconds of `CLOCK_MONOTONIC` (0 when it could not be measured;
    /// see [`crate::timing`]).
    pub start_ns: u64,
    /// End on the GPU, same clock.
    pub end_ns: u64,
}

/// The built-in tool side: every launch replayed `passes` times, no C tools.
#[derive(Debug)]
pub struct BuiltIn {
    /// Passes per launch (1: tracking only).
    pub passes: u64,
}

impl Tools for BuiltIn {
    fn replay_wanted(&self) -> bool {
        self.passes > 1
    }
    fn replay_tool(&self) -> Option<Box<dyn ReplayTool>> {
        (self.passes > 1).then(|| Box::new(FixedPasses::new(self.passes)) as Box<dyn ReplayTool>)
    }
    fn contexts(&self) -> &'static ContextRegistry {
        ContextRegistry::global()
    }
}

/// The built-in tool: every launch the same number of times, nothing else.
pub use kreplay_passloop::FixedPasses;

/// One device (context) as the backend keeps it.
struct DeviceState {
    ordinal: i32,
    memory: Arc<CudaMemory>,
    snapshotter: Snapshotter,
    filter: Filter,
    /// `auto`'s measured choice of where detection runs (see [`crate::choice`]).
    choice: Mutex<DeviceChoice>,
    /// Device-heap use on this context (see [`crate::devruntime`]).
    runtime: DeviceRuntime,
    /// Whether the device reads and writes pageable host memory directly (HMM, ATS).
    pageable: bool,
    /// The drain before each snapshot, bounded by the drain timeout: one per context, so that
    /// a device whose drain is stuck does not hold up another's.
    drainer: Drainer,
}

/// Counters printed in the exit summary.
#[derive(Default)]
struct Stats {
    launches: AtomicU64,
    replayed: AtomicU64,
    passes: AtomicU64,
    failed: AtomicU64,
    graph_launches: AtomicU64,
    auto_device: AtomicU64,
    auto_full: AtomicU64,
    allocations: AtomicU64,
    frees: AtomicU64,
    managed: AtomicU64,
    bytes_snapshotted: AtomicU64,
    bytes_restored: AtomicU64,
    snapshot_ns: AtomicU64,
    restore_ns: AtomicU64,
    restores: AtomicU64,
    relaunch_ns: AtomicU64,
    drain_ns: AtomicU64,
    replay_ns: AtomicU64,
    callbacks: AtomicU64,
    callback_ns: AtomicU64,
    module_callbacks: AtomicU64,
    module_ns: AtomicU64,
    init_ns: AtomicU64,
    declines: Mutex<BTreeMap<String, u64>>,
    /// Calls a tool made from its replay callbacks into memory a snapshot held.
    tool_work: AtomicU64,
    /// Bytes of such work folded into snapshots.
    tool_work_kept: AtomicU64,
    /// Such calls whose work a later restore may have undone (reported on stderr).
    tool_work_lost: AtomicU64,
}

impl Stats {
    /// Counts one callback in `count` and, when the returned guard drops, adds the time since
    /// `start` to `ns`.
    fn timed<'a>(&self, count: &'a AtomicU64, ns: &'a AtomicU64, start: Instant) -> Timed<'a> {
        count.fetch_add(1, Ordering::Relaxed);
        Timed { ns, start }
    }
}

/// Adds the time it lived to a counter when it drops (see [`Stats::timed`]).
struct Timed<'a> {
    ns: &'a AtomicU64,
    start: Instant,
}

impl Drop for Timed<'_> {
    fn drop(&mut self) {
        let ns = u64::try_from(self.start.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.ns.fetch_add(ns, Ordering::Relaxed);
    }
}

/// The backend's totals at exit (also the summary line on standard error).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Summary {
    /// Passes the built-in tool asks for (`KREPLAY_PASSES`; 1 when C tools decide).
    pub passes_per_launch: u64,
    /// Kernel launches seen.
    pub launches: u64,
    /// Launches replayed.
    pub replayed: u64,
    /// Passes run, the application's own launches included.
    pub passes_run: u64,
    /// Replays that failed (a pass or a restore).
    pub failed: u64,
    /// Declined launches by reason.
    pub declined: BTreeMap<String, u64>,
    /// Graph launches (run once).
    pub graph_launches: u64,
    /// Replays `auto` ran with detection on the device, and with full copies (see
    /// [`crate::choice`]).
    pub auto_device: u64,
    /// See `auto_device`.
    pub auto_full: u64,
    /// Allocations and mappings tracked.
    pub allocations: u64,
    /// Frees and unmaps of tracked memory.
    pub frees: u64,
    /// Managed allocations seen (never snapshotted: launches decline while one is live).
    pub managed_allocations: u64,
    /// Bytes copied into snapshots.
    pub bytes_snapshotted: u64,
    /// Bytes written back by restores.
    pub bytes_restored: u64,
    /// Restores.
    pub restores: u64,
    /// Time taking snapshots, ns.
    pub snapshot_ns: u64,
    /// Time restoring, ns.
    pub restore_ns: u64,
    /// Device shadow bytes still held.
    pub shadow_bytes_held: u64,
    /// Time of the passes after the application's own (re-launch, its wait, the tool's pass
    /// callbacks), ns: the kernels' repeated executions.
    pub relaunch_ns: u64,
    /// Time draining the device before snapshots, ns.
    pub drain_ns: u64,
    /// Time of whole replay windows (lock wait, drain, snapshot, every pass and restore; pass
    /// 0 includes the wait for the application's own launch), ns.
    pub replay_ns: u64,
    /// Host time of the device-memory calls under the snapshots and restores, every device
    /// summed (what part of `snapshot_ns` and `restore_ns` they are, and how much of them is
    /// waiting for the GPU).
    pub memory: MemoryTimes,
    /// Driver-API callbacks handled (API ENTER and EXIT each count; kreplay's own calls and
    /// calls made while kreplay is in the driver are not handled and not counted).
    pub callbacks: u64,
    /// Time inside those callbacks, ns: what interception adds to the application's driver
    /// calls, replay windows included (`callback_ns - replay_ns` is interception alone).
    pub callback_ns: u64,
    /// Module load and unload callbacks.
    pub module_callbacks: u64,
    /// Time inside them (reading a loaded module's image for its variables), ns.
    pub module_ns: u64,
    /// Time of the library's start-up in the injection entry point (loading CUPTI,
    /// subscribing, the configuration), ns.
    pub init_ns: u64,
    /// Calls a tool made from its callbacks inside replay windows that may write memory the
    /// window's snapshot held (see [`crate::toolwork`]).
    pub tool_work: u64,
    /// Bytes those calls wrote there, kept by the restores that followed.
    pub tool_work_kept_bytes: u64,
    /// Of those calls, the ones whose work may have been undone (each reported on stderr).
    pub tool_work_lost: u64,
}

impl std::fmt::Display for Summary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let declines: Vec<String> = self
            .declined
            .iter()
            .map(|(k, v)| format!("{k}:{v}"))
            .collect();
        let m = &self.memory;
        let ms = |ns: u64| ns as f64 / 1e6;
        write!(
            f,
            "summary passes_per_launch={} launches={} replayed={} passes_run={} failed={} \
             declined=[{}] graph_launches={} allocations={} frees={} \
             managed_allocations={} bytes_snapshotted={} bytes_restored={} restores={} \
             snapshot_ms={:.3} restore_ms={:.3} shadow_bytes_held={} relaunch_ms={:.3} \
             drain_ms={:.3} replay_ms={:.3} copies={} copy_ms={:.3} copy_wait_ms={:.3} \
             verified={} verified_ms={:.3} verified_wait_ms={:.3} lists_uploaded={} hashes={} \
             hash_ms={:.3} hash_wait_ms={:.3} shadow_allocs={} shadow_alloc_ms={:.3} \
             auto_device={} auto_full={} callbacks={} callback_ms={:.3} intercept_ms={:.3} \
             module_callbacks={} module_ms={:.3} init_ms={:.3} tool_work={} \
             tool_work_kept_bytes={} tool_work_lost={}",
            self.passes_per_launch,
            self.launches,
            self.replayed,
            self.passes_run,
            self.failed,
            declines.join(","),
            self.graph_launches,
            self.allocations,
            self.frees,
            self.managed_allocations,
            self.bytes_snapshotted,
            self.bytes_restored,
            self.restores,
            self.snapshot_ns as f64 / 1e6,
            self.restore_ns as f64 / 1e6,
            self.shadow_bytes_held,
            self.relaunch_ns as f64 / 1e6,
            self.drain_ns as f64 / 1e6,
            self.replay_ns as f64 / 1e6,
            m.copies,
            ms(m.copy_ns),
            ms(m.copy_wait_ns),
            m.verified,
            ms(m.verified_ns),
            ms(m.verified_wait_ns),
            m.lists_uploaded,
            m.hashes,
            ms(m.hash_ns),
            ms(m.hash_wait_ns),
            m.shadow_allocs,
            ms(m.shadow_alloc_ns),
            self.auto_device,
            self.auto_full,
            self.callbacks,
            ms(self.callback_ns),
            ms(self.callback_ns.saturating_sub(self.replay_ns)),
            self.module_callbacks,
            ms(self.module_ns),
            ms(self.init_ns),
            self.tool_work,
            self.tool_work_kept_bytes,
            self.tool_work_lost,
        )
    }
}

struct Backend {
    driver: &'static Driver,
    config: Config,
    tools: Box<dyn Tools>,
    watch: MemoryWatch,
    /// What the API ENTER of each free in progress forgot, and the context its allocation was
    /// noted in: put back at the API EXIT of a free that failed.
    frees: Mutex<Vec<(Forgotten, Option<usize>)>>,
    /// What the API ENTER of each `cuMemUnmap` in progress changed (by its address): put back
    /// at the API EXIT of one that failed.
    unmaps: Mutex<Vec<(u64, UnmapUndo)>>,
    /// Memory CUDA graphs allocate: unbacked until a graph holding it is launched.
    graphs: GraphMemory,
    inventory: Arc<Inventory>,
    locks: AgentLocks,
    /// Stream captures in progress (a replay does not drain a device while one is).
    captures: Captures,
    devices: Mutex<Vec<(usize, Arc<DeviceState>)>>,
    /// The contexts seen and their devices: a drain waits for every one of the launch's device.
    contexts: Arc<Contexts>,
    /// Devices linked by peer access: a replay on one locks and drains its whole group.
    peers: AgentGroups,
    next_dispatch: AtomicU64,
    stats: Stats,
    warned_graph: AtomicBool,
    /// Whether a launch kreplay does not replay was warned about.
    warned_launch: AtomicBool,
    warned_managed: AtomicBool,
    warned_surfaces: AtomicBool,
    /// The cubins of loaded modules: the writable module-scope variables of launched kernels.
    modules: ModuleRegistry,
    /// Parameter layouts per function (`None`: the driver cannot describe it).
    layouts: Mutex<std::collections::HashMap<usize, Option<Arc<[Param]>>>>,
    warned_layout: AtomicBool,
    warned_cubin: AtomicBool,
    /// Warns about a pass that does not end, every drain timeout (see [`crate::watchdog`]).
    watchdog: Watchdog,
}

static BACKEND: OnceLock<Backend> = OnceLock::new();
static CUPTI: OnceLock<(Cupti, usize)> = OnceLock::new();

/// A launch between its API ENTER and EXIT on this thread.
struct Pending {
    window: Window,
    launch: Launch,
    /// The launch's context's state, found at ENTER.
    device: Arc<DeviceState>,
    tool: Box<dyn ReplayTool>,
    /// The launch's events while dispatch tracing is configured.
    timer: Option<PassTimer>,
    /// No tool decides launches: the window only times the launch for dispatch tracing (it
    /// runs once and is not accounted as a replay decision).
    trace_only: bool,
}

/// A launch's operations as the injected library runs them: the driver's, plus the check
/// that no live memory escapes the snapshot.
struct InjectedLaunch<'a> {
    inner: CudaLaunch<'a>,
    watch: &'a MemoryWatch,
    graphs: &'a GraphMemory,
    /// At API ENTER: what the launch's snapshot covers (see [`Backend::launch_scope`]).
    scope: Option<LaunchScope<'a>>,
    captures: &'a Captures,
    /// Set while dispatch tracing is configured: the launch's passes are timed and reported.
    traced: Option<(&'a PassTimer, &'a dyn Tools)>,
    /// At API ENTER: the launch's device, for the tool's work inside its window.
    device: Option<&'a Arc<DeviceState>>,
}

impl LaunchOps for InjectedLaunch<'_> {
    fn replayable(&self) -> Result<(), String> {
        self.inner.replayable()
    }
    fn covered(&self) -> Result<(), String> {
        self.watch
            .untracked_reason(self.inner.launch.ctx as usize)
            .or_else(|| self.graphs.untracked_reason())
            .map_or(Ok(()), Err)
    }
    fn scope(&self, base: &Filter) -> Result<Filter, String> {
        match &self.scope {
            Some(s) => s
                .backend
                .launch_scope(&self.inner.launch, s.device, s.kernel, base),
            None => Ok(base.clone()),
        }
    }
    fn kernel_key(&self, kernel_id: u64) -> u64 {
        match &self.scope {
            Some(s) => s.backend.modules.kernel_key(kernel_id as usize),
            None => kernel_id,
        }
    }
    /// `auto`'s choice for this launch ([`Backend::choose_detection`]), applied to the
    /// device's shared detection setting here, where the window holds the device's writer
    /// side: a launch of another thread choosing for the same device meanwhile cannot change
    /// it between this snapshot and this launch's last restore.
    fn snapshot_strategy(&self) -> Option<RestoreStrategy> {
        let (_, on) = CHOSEN.with(std::cell::Cell::get)?;
        if let Some(s) = &self.scope {
            s.device.memory.set_hash_on_device(on);
        }
        chosen_strategy(on)
    }
    fn drainable(&self) -> Result<(), String> {
        self.captures
            .check_drainable(self.inner.launch.device as u64)
    }
    fn drain_timeout(&self) -> Option<Duration> {
        self.inner.drainer.map(Drainer::timeout)
    }
    fn watchdog(&self) -> Option<&Watchdog> {
        BACKEND.get().map(|b| &b.watchdog)
    }
    fn linked_devices(&self) -> Option<Vec<u64>> {
        let s = self.scope.as_ref()?;
        Some(s.backend.peers.group(s.device.ordinal as u64))
    }
    fn drain(&self) -> Result<(), String> {
        self.inner.drain()?;
        let (Some(drainer), Some(s)) = (self.inner.drainer, &self.scope) else {
            return Ok(());
        };
        // The group as it is now, its writer sides held (see `linked_devices`). The drain
        // thread synchronises every context seen on the device of the one named.
        s.backend
            .peer_contexts(s.device.ordinal)
            .iter()
            .try_for_each(|&ctx| drainer.drain(ctx))
    }
    fn wait(&self) -> Result<(), String> {
        self.inner.wait()
    }
    fn relaunch(&self) -> Result<(), String> {
        self.inner.relaunch()
    }
    fn mark(&self, at: Mark) {
        if let Some((timer, _)) = self.traced {
            let marked = match at {
                Mark::Before => timer.mark_start(),
                Mark::After => timer.mark_end(),
            };
            if let Err(e) = marked {
                log(LogLevel::Warn, format!("dispatch timing: {e}"));
            }
        }
    }
    fn enqueue(&self, info: &DispatchInfo, pass: Option<u64>) -> Option<Enqueued> {
        self.traced
            .and_then(|(_, tools)| tools.dispatch_enqueue(info, pass))
    }
    fn tool_work(&self) -> Option<Box<dyn ToolWorkIo>> {
        let device = self.device?.clone();
        Some(Box::new(DeviceWork {
            device,
            ctx: self.inner.launch.ctx as usize,
        }))
    }
    fn completed(&self, info: &DispatchInfo, pass: Option<u64>) {
        if let Some((timer, tools)) = self.traced {
            let (start_ns, end_ns) = timer.times().unwrap_or_else(|e| {
                log(LogLevel::Warn, format!("dispatch timing: {e}"));
                (0, 0)
            });
            tools.dispatch_completed(&DispatchRecord {
                info: *info,
                pass,
                start_ns,
                end_ns,
            });
        }
    }
}

/// What [`Backend::launch_scope`] needs beside the launch.
struct LaunchScope<'a> {
    backend: &'a Backend,
    device: &'a DeviceState,
    kernel: Option<&'a str>,
}

/// The launched function's module and variables, from the driver.
struct DriverModules<'a> {
    driver: &'a Driver,
    function: CuFunction,
}

impl ModuleLookup for DriverModules<'_> {
    fn module(&self) -> Result<u64, String> {
        // SAFETY: the function the application is launching, inside its launch call.
        unsafe { self.driver.function_module(self.function) }.map(|m| m as u64)
    }
    fn global(&self, module: u64, name: &str) -> Option<Range> {
        // SAFETY: the module the driver named for the launched function, loaded while it is
        // being launched.
        unsafe { self.driver.module_global(module as CuModule, name) }
    }
    fn load(&self) {
        if let Some(load) = self.driver.optional.func_load {
            // SAFETY: the function the application is launching; loading it (and its module)
            // is what the launch would do anyway.
            let _ = unsafe { load(self.function) };
        }
        let _ = self.module();
    }
}

thread_local! {
    static PENDING: RefCell<Option<Pending>> = const { RefCell::new(None) };
    /// The reader side a launch without a window holds from its API ENTER to its EXIT.
    static UNWINDOWED: RefCell<Option<kreplay_locks::OwnedReadAccess>> = const { RefCell::new(None) };
    /// [`PENDING`] and [`UNWINDOWED`] once they are destroyed: a launch from a thread-local
    /// destructor at thread exit (see `crate::late`).
    static PENDING_LATE: Late<Option<Pending>> = const { Late::new() };
    static UNWINDOWED_LATE: Late<Option<kreplay_locks::OwnedReadAccess>> = const { Late::new() };
    /// `auto`'s choice for the launch this thread is replaying: its key and whether detection
    /// runs on the device, made when the window asks for the launch's scope (see `launch_scope`).
    static CHOSEN: std::cell::Cell<Option<(ChoiceKey, bool)>> = const { std::cell::Cell::new(None) };
}

/// What one restore of a device shadow costs: a fixed part per restore plus the footprint at a
/// rate.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RestoreCost {
    /// Microseconds every restore costs (launches, copies of lists, the wait).
    pub fixed_us: f64,
    /// Bytes of footprint per microsecond (1e6 = 1 TB/s).
    pub bytes_per_us: f64,
}

impl RestoreCost {
    /// Microseconds of one restore of `footprint` bytes.
    pub fn at(&self, footprint: u64) -> f64 {
        self.fixed_us + footprint as f64 / self.bytes_per_us
    }
}

/// A full restore of a device shadow (copy engine), fitted to `kreplay bench --backend cuda` on
/// the H200 (one allocation; 64 MiB 0.043 ms, 256 MiB 0.142, 1 GiB 0.531, 32 GiB 16.38):
/// 20 us + footprint at 2.10 TB/s.
pub const FULL_RESTORE_COST: RestoreCost = RestoreCost {
    fixed_us: 20.0,
    bytes_per_us: 2.10e6,
};

/// A verified restore on the device (`kreplay_restore_verified` and `kreplay_gather_found`,
/// one wait) with little written, fitted to the same bench (0.1% written; 64 MiB 0.075 ms,
/// 256 MiB 0.103, 1 GiB 0.285, 32 GiB 7.85): 41 us + footprint at 4.40 TB/s.
pub const VERIFIED_RESTORE_COST: RestoreCost = RestoreCost {
    fixed_us: 41.0,
    bytes_per_us: 4.40e6,
};

/// Whether the device kernels are offered to the snapshot for a launch whose tracked footprint
/// on its device is `footprint` bytes. `hash`, `writeset` and `writeset-unverified` always
/// detect on the device. `auto` does where a verified restore on the device costs less than a
/// full copy by the measured costs above (from about 84 MB; smaller footprints are restored in
/// full); the snapshot crate's `auto` then chooses per restore between a full restore, a hash
/// restore and the learned write set from what the kernel's restores changed.
pub fn hash_on_device_for(strategy: RestoreStrategy, footprint: u64) -> bool {
    strategy != RestoreStrategy::Auto
        || VERIFIED_RESTORE_COST.at(footprint) < FULL_RESTORE_COST.at(footprint)
}

/// Whether a verified restore on the device can ever beat a full copy of `footprint` bytes: not
/// where the full copy costs less than a verified restore's fixed part alone (its launches, the
/// bitmap's round trip), whatever the launch writes (below about 44 MB by the costs above).
pub fn device_can_win(footprint: u64) -> bool {
    FULL_RESTORE_COST.at(footprint) > VERIFIED_RESTORE_COST.fixed_us
}

/// `auto`'s choice for a launch with key `key` over `footprint` bytes: never the device where it
/// cannot win ([`device_can_win`]: such launches are not spent measuring it), else what this
/// process measured (`measured`, see [`crate::choice`]) or the fitted model alone.
pub fn detection_for(
    choice: &DeviceChoice,
    key: ChoiceKey,
    footprint: u64,
    measured: bool,
) -> bool {
    let prior = hash_on_device_for(RestoreStrategy::Auto, footprint);
    if !device_can_win(footprint) {
        false
    } else if measured {
        choice.choose(key, prior)
    } else {
        prior
    }
}

/// The snapshot strategy of a launch `auto` chose to restore with detection on the device (`on`)
/// or not: hash restores (the snapshot hashed on the device, each restore hashing every chunk
/// there and writing back the changed ones in the same launches), so that the choice's two modes
/// are two different ways of restoring and what it measures of each is that way's cost; full
/// copies stay with `auto` (which copies a device shadow in full when the device offers no
/// hash). Not the verified write set: it writes the learned set and verifies only the rest,
/// which saves reading the set, but its lists cost host time per chunk of the set, and in
/// `kreplay bench --backend cuda`'s whole replays on the H200 it cost more than hash restores
/// wherever either beat full copies (38 passes, 10% written: 0.835 of N full restores against
/// 0.662 at 32 GiB, 15.6 against 13.9 ms at 1 GiB; 1.04-1.13 times at 0.1% and 1%).
pub fn chosen_strategy(on: bool) -> Option<RestoreStrategy> {
    on.then_some(RestoreStrategy::Hash)
}

fn log(level: LogLevel, msg: impl std::fmt::Display) {
    let configured = BACKEND.get().map_or(LogLevel::Warn, |b| b.config.log);
    emit(configured, level, format_args!("{msg}"));
}

/// One message of the backend at `level`, printed when `configured` (`KREPLAY_LOG`) lets it
/// through: to the process's logger through the `log` facade (target `kreplay`, prefixed
/// `cuda:`; libkreplay installs its stderr sink before the backend starts), or, in a process
/// with no logger taking it, on standard error prefixed `kreplay-cuda:`, so nothing is lost.
pub fn emit(configured: LogLevel, level: LogLevel, message: std::fmt::Arguments<'_>) {
    if level > configured || configured == LogLevel::Off || level == LogLevel::Off {
        return;
    }
    let facade = match level {
        LogLevel::Warn => log::Level::Warn,
        LogLevel::Info => log::Level::Info,
        _ => log::Level::Debug,
    };
    let metadata = log::Metadata::builder()
        .level(facade)
        .target("kreplay")
        .build();
    if facade <= log::max_level() && log::logger().enabled(&metadata) {
        log::log!(target: "kreplay", facade, "cuda: {message}");
    } else {
        eprintln!("kreplay-cuda: {message}");
    }
}

impl Backend {
    /// Whether `stream` still captures after a `cuStreamEndCapture` that failed (one that
    /// reported the capture invalidated ended it; one called on the wrong thread did not).
    /// When the driver cannot tell, the capture is taken as still in progress.
    fn still_capturing(&self, stream: crate::driver::CuStream, per_thread: bool) -> bool {
        let d = self.driver;
        let f = if per_thread {
            d.stream_is_capturing_ptsz
        } else {
            d.stream_is_capturing
        };
        let mut status = CU_STREAM_CAPTURE_STATUS_NONE;
        // SAFETY: the stream the application just passed to cuStreamEndCapture; an invalid
        // handle is an error code.
        let rc = unsafe { f(stream, &mut status) };
        rc != CUDA_SUCCESS || status != CU_STREAM_CAPTURE_STATUS_NONE
    }

    fn ordinal(&self, ctx: CuContext) -> Option<i32> {
        // The call's context is current on the calling thread inside its callback.
        self.contexts
            .ordinal(ctx as usize, || self.driver.current_device().ok())
    }

    /// The device of context `ctx`, which need not be current (it is made current for the
    /// question when kreplay has not seen it, and the caller's context is made current again).
    fn context_ordinal(&self, ctx: CuContext) -> Option<i32> {
        self.contexts.ordinal(ctx as usize, || {
            let previous = self.driver.current_context();
            // SAFETY: a context the application named in a call that succeeded.
            unsafe { self.driver.make_current(ctx) }.ok()?;
            let device = self.driver.current_device().ok();
            // SAFETY: the context current on this thread before.
            let _ = unsafe { self.driver.make_current(previous) };
            device
        })
    }

    /// The devices a call that may link devices waits for (see [`fence::links_devices`]):
    /// every device kreplay has state for and the calling context's, ascending.
    fn linking_devices(&self, ctx: CuContext) -> Vec<u64> {
        if !self.locks.is_enabled() {
            return Vec::new();
        }
        let mut devices = self.known_devices();
        devices.extend(self.ordinal(ctx).map(|o| o as u64));
        devices.sort_unstable();
        devices.dedup();
        devices
    }

    /// A context of each other device of `ordinal`'s peer group (drained with it).
    fn peer_contexts(&self, ordinal: i32) -> Vec<usize> {
        self.peers
            .group(ordinal as u64)
            .iter()
            .filter(|&&d| d != ordinal as u64)
            .filter_map(|&d| self.contexts.on_device(d as i32).first().copied())
            .collect()
    }

    /// `call` let the kernels of `devices` reach each other's memory: from now on a replay on
    /// any of them locks and drains them all.
    fn link_devices(&self, devices: &[u64], call: &str) {
        let mut devices = devices.to_vec();
        devices.sort_unstable();
        devices.dedup();
        if devices.len() < 2 {
            return;
        }
        self.peers.link(&devices);
        log(
            LogLevel::Debug,
            format!("{call} links devices {devices:?}: replays on them lock and drain them all"),
        );
    }

    /// Context `ctx` is about to be destroyed (`cuCtxDestroy`, or a primary context's reset by
    /// `cudaDeviceReset`): kreplay frees what it holds there (a kept shadow, scratch memory, its
    /// kernels' module) while the context is alive, forgets the context and the allocations
    /// that end with it, and gives the calling thread its current context back. Kept, that
    /// state would name memory and kernels of a context that no longer exists: on the H200 the
    /// next launches after a `cudaDeviceReset` copied through stale handles and crashed the
    /// program in the driver (`device_reset.cu`).
    fn before_context_destroyed(&self, ctx: CuContext) {
        let key = ctx as usize;
        let ordinal = self.contexts.ordinal(key, || None);
        let dying = self.contexts.forget(key);
        self.watch.on_context_destroyed(key);
        // Forgotten, the context is in no later drain; a drain of its device already running
        // may have listed it, and must not synchronise it while the driver destroys it: wait
        // for it (at most the drain timeout, then the destruction goes on regardless).
        let drainers: Vec<Arc<DeviceState>> = self
            .devices
            .lock()
            .iter()
            .filter(|(_, d)| Some(d.ordinal) == ordinal)
            .map(|(_, d)| d.clone())
            .collect();
        for d in drainers {
            if !d.drainer.wait_idle(Instant::now() + d.drainer.timeout()) {
                log(
                    LogLevel::Warn,
                    format!(
                        "context {key:#x} is destroyed while a drain of its device still runs \
                         after {:?}",
                        d.drainer.timeout()
                    ),
                );
            }
        }
        log(
            LogLevel::Debug,
            format!(
                "context {key:#x} ends: {} allocation(s) end with it",
                dying.len()
            ),
        );
        for base in dying {
            // Managed memory ends with its context too, and with it the declines it caused.
            self.on_app_free(base);
        }
        let state = {
            let mut devices = self.devices.lock();
            let at = devices.iter().position(|(c, _)| *c == key);
            at.map(|i| devices.remove(i).1)
        };
        if let Some(state) = state {
            let previous = self.driver.current_context();
            drop(state);
            // SAFETY: the context current on this thread when the application made its call
            // (or none); freeing kreplay's memory may have made `ctx` current instead.
            if unsafe { self.driver.make_current(previous) }.is_err() {
                log(
                    LogLevel::Warn,
                    "could not make the calling thread's context current again",
                );
            }
        }
    }

    fn device(&self, ctx: CuContext) -> Result<Arc<DeviceState>, String> {
        let key = ctx as usize;
        let mut devices = self.devices.lock();
        if let Some((_, d)) = devices.iter().find(|(c, _)| *c == key) {
            return Ok(d.clone());
        }
        let ordinal = self.ordinal(ctx).ok_or("cannot tell the launch's device")?;
        // SAFETY: the context of a launch in progress; applications launch in primary contexts,
        // which stay alive until CUDA is torn down at exit.
        let memory = unsafe {
            CudaMemory::new(
                self.driver,
                self.inventory.clone(),
                ctx,
                self.config.shadow,
                self.config.snapshot.store,
            )
        }
        .map_err(|e| e.to_string())?;
        memory.set_hash_on_device(hash_on_device_for(self.config.snapshot.strategy, 0));
        let snapshotter = Snapshotter::new(
            self.inventory.clone(),
            memory.clone(),
            self.config.snapshot.clone(),
        )
        .map_err(|e| e.to_string())?;
        let state = Arc::new(DeviceState {
            ordinal,
            memory,
            snapshotter,
            filter: Filter::for_replay(ordinal as u64),
            choice: Mutex::new(DeviceChoice::default()),
            runtime: DeviceRuntime::new(),
            // Unknown counts as able: a pageable address in an argument is then declined.
            pageable: self.driver.pageable_memory_access(ordinal).unwrap_or(true),
            drainer: context_drainer(
                self.driver,
                self.config.drain_timeout,
                self.contexts.clone(),
            ),
        });
        devices.push((key, state.clone()));
        Ok(state)
    }

    fn on_alloc(&self, id: CallbackId, ctx: CuContext, base: u64, size: u64, what: &str) {
        let device = allocation_device(id, self.ordinal(ctx), || self.driver.device_ordinal(base));
        let Some(ordinal) = device else {
            log(
                LogLevel::Warn,
                format!("{what} at {base:#x}: unknown device, not tracked"),
            );
            return;
        };
        self.graphs.on_other_alloc(base, size);
        self.inventory.on_alloc(NewAllocation {
            base,
            size,
            owner_agent: ordinal as u64,
            kind: MemoryKind::CoarseDevice,
        });
        self.stats.allocations.fetch_add(1, Ordering::Relaxed);
        log(
            LogLevel::Debug,
            format!("{what} {size} bytes at {base:#x} on device {ordinal}"),
        );
    }

    /// The devices kreplay has state for (where windows may be open).
    fn known_devices(&self) -> Vec<u64> {
        self.devices
            .lock()
            .iter()
            .map(|(_, d)| d.ordinal as u64)
            .collect()
    }

    /// The devices whose replay windows fenced call `id` waits for (see
    /// [`fence::devices_to_fence`]).
    fn fenced_devices(&self, id: CallbackId, data: &CallbackData) -> Vec<u64> {
        if !self.locks.is_enabled() {
            // No replay can happen: the fence takes nothing, whatever the devices.
            return Vec::new();
        }
        let current = self.ordinal(data.context).map(|o| o as u64);
        let described = fence::destination(id) != fence::Destination::Unknown;
        // SAFETY: CUPTI's parameter struct of call `id`, valid during the callback. A memset's
        // second field is its value: a number, looked up like an address (at worst one more
        // device waited for).
        let owners = match unsafe { fence::leading_addresses(id, data.function_params) } {
            Some(addresses) => addresses.map(|a| self.inventory.lookup(a).map(|x| x.owner_agent)),
            None => [None, None],
        };
        let all = if described {
            Vec::new()
        } else {
            self.known_devices()
        };
        fence::devices_to_fence(current, &owners, described, &all)
    }

    /// A call `id` (see [`writes_device`]) a tool made from one of its callbacks inside a
    /// replay window: at API ENTER, what of the window's snapshot it may write is watched; at
    /// API EXIT, what it wrote there is kept for the window's next restore (see
    /// [`crate::toolwork`]).
    fn tool_call(&self, id: CallbackId, data: &CallbackData) {
        if data.callback_site != API_ENTER {
            // SAFETY: at API EXIT, function_return_value points to the call's CUresult.
            let succeeded = !data.function_return_value.is_null()
                && unsafe { *(data.function_return_value as *const CuResult) } == CUDA_SUCCESS;
            let kept = toolwork::after(succeeded);
            self.stats.tool_work_kept.fetch_add(kept, Ordering::Relaxed);
            return;
        }
        let name = api_name(data.function_name);
        let values;
        // SAFETY: CUPTI's parameter struct of call `id`, valid during the callback.
        let target = match unsafe { fence::writes(id, data.function_params) } {
            fence::Writes::Range { addr, len } => Target::Range { addr, len },
            fence::Writes::Nothing => return,
            // A 2D memset: inside the allocation holding its destination.
            fence::Writes::Within(dst) => {
                values = vec![dst];
                Target::Reached(&values)
            }
            fence::Writes::Unknown => match self.tool_launch_values(id, data) {
                Some(v) => {
                    values = v;
                    Target::Reached(&values)
                }
                None => Target::Anything,
            },
        };
        match toolwork::before(&name, target) {
            Before::Watching(_) | Before::Failed => {
                self.stats.tool_work.fetch_add(1, Ordering::Relaxed);
            }
            Before::NotKept => {
                self.stats.tool_work.fetch_add(1, Ordering::Relaxed);
                self.stats.tool_work_lost.fetch_add(1, Ordering::Relaxed);
                log(
                    LogLevel::Warn,
                    format!(
                        "a tool called {name} from a callback inside a replay window that keeps \
                         no such work: the next restore may undo what it wrote"
                    ),
                );
            }
            Before::Outside | Before::Untouched => {}
        }
    }

    /// The argument values of a tool's kernel launch `id`, where they are trusted to name all
    /// the memory the kernel reaches (`KREPLAY_SNAPSHOT_SCOPE=referenced`, as for the
    /// application's launches) and the driver describes the kernel's parameters; `None` for
    /// any other call: it may write anything.
    fn tool_launch_values(&self, id: CallbackId, data: &CallbackData) -> Option<Vec<u64>> {
        if !cbid::LAUNCHES.contains(&id)
            || data.function_params.is_null()
            || self.config.snapshot.scope != SnapshotScope::Referenced
        {
            return None;
        }
        // SAFETY: one of the launch ids, with CUPTI's parameter struct; the context and
        // device are not used for reading the arguments.
        let launch = unsafe { decode_launch(id, data.function_params, std::ptr::null_mut(), 0) };
        self.launch_argument_values(&launch).ok()
    }

    /// Counts (and warns once about) the work a fenced call runs once that kreplay never
    /// replays: graph launches, and the launches of [`cbid::UNREPLAYED_LAUNCHES`]. kreplay does
    /// not see which kernels they run, so where a loaded module has a kernel that can use the
    /// device heap, they may have run it: the launch's context counts as having used the heap
    /// (see [`crate::devruntime`]).
    fn note_unreplayed(&self, write: fence::DeviceWrite, ctx: CuContext) {
        match write {
            fence::DeviceWrite::Graph => {
                self.stats.graph_launches.fetch_add(1, Ordering::Relaxed);
                if !self.warned_graph.swap(true, Ordering::Relaxed) {
                    log(LogLevel::Warn, "graph launches run once, not replayed");
                }
            }
            fence::DeviceWrite::Launch => {
                if !self.warned_launch.swap(true, Ordering::Relaxed) {
                    log(
                        LogLevel::Warn,
                        "launches through cuLaunch, cuLaunchGrid(Async) or \
                         cuLaunchCooperativeKernelMultiDevice run once, not replayed",
                    );
                }
            }
            _ => return,
        }
        let what = if write == fence::DeviceWrite::Graph {
            "a graph launch"
        } else {
            "a launch kreplay does not replay"
        };
        if let Some((kernel, calls)) = self.modules.heap_user() {
            // Finding the context's state may make driver calls of kreplay's own: in relaxed
            // capture mode, as every other callback's (fenced calls otherwise make none).
            let _relaxed = self.driver.relaxed_capture();
            match self.device(ctx) {
                Ok(device) => device
                    .runtime
                    .note(&format!("{kernel} (loaded; {what} may run it)"), &calls),
                Err(e) => log(
                    LogLevel::Warn,
                    format!("{what} that may use the device heap: {e}"),
                ),
            }
        }
    }

    /// The application's allocation at `base` ended (freed, or with its context): a managed
    /// allocation leaves the watch, any other the inventory.
    /// What the API ENTER of a free forgot (nothing for graph memory, which is not put back).
    fn on_app_free(&self, base: u64) -> Option<Forgotten> {
        if self.graphs.on_free(&self.inventory, base) {
            self.stats.frees.fetch_add(1, Ordering::Relaxed);
            log(
                LogLevel::Debug,
                format!("graph allocation at {base:#x} freed"),
            );
            return None;
        }
        let forgotten = self.watch.free_enter(Some(&self.inventory), base);
        if forgotten.allocation.is_some() {
            self.stats.frees.fetch_add(1, Ordering::Relaxed);
            log(LogLevel::Debug, format!("free at {base:#x}"));
        }
        Some(forgotten)
    }

    /// The API EXIT of a free whose ENTER forgot the memory at `base`: a free that failed left
    /// the memory live, and it is tracked again as it was.
    fn free_exit(&self, base: u64, result: CuResult) {
        let entry = {
            let mut frees = self.frees.lock();
            let at = frees.iter().rposition(|(f, _)| f.base == base);
            at.map(|at| frees.swap_remove(at))
        };
        let Some((forgotten, owner)) = entry else {
            return;
        };
        if result == CUDA_SUCCESS {
            return;
        }
        if self.watch.free_failed(&self.inventory, forgotten) {
            if let Some(ctx) = owner {
                self.contexts.note_allocation(ctx, base);
            }
            log(
                LogLevel::Debug,
                format!("free at {base:#x} failed ({result}): its memory is tracked again"),
            );
        }
    }

    /// Device memory shared from another process or API appeared at `base` in context `ctx`
    /// (`size` where the call says it): snapshotted as memory of the device that holds it, as
    /// the driver says, or, where the driver cannot describe it, counted so that launches
    /// decline while it is mapped (see `tracking`).
    fn on_shared(&self, ctx: CuContext, base: u64, size: Option<u64>, what: &str) {
        let size = size
            .filter(|&n| n > 0)
            .or_else(|| self.driver.range_size(base));
        let device = self
            .driver
            .device_ordinal(base)
            .or_else(|| self.ordinal(ctx));
        match self
            .watch
            .record_shared(&self.inventory, base, size, device)
        {
            Ok(device) => {
                let linked = shared_link(self.ordinal(ctx), device);
                self.link_devices(&linked, what);
                self.contexts.note_allocation(ctx as usize, base);
                self.stats.allocations.fetch_add(1, Ordering::Relaxed);
                log(
                    LogLevel::Debug,
                    format!(
                        "{what}: {} bytes at {base:#x} on device {device}",
                        size.unwrap_or(0)
                    ),
                );
            }
            Err(why) => log(
                LogLevel::Warn,
                format!(
                    "{what} at {base:#x}: {why}; launches run once (untracked_memory) while it \
                     is mapped"
                ),
            ),
        }
    }

    /// Shared memory at `base` ended (closed or unmapped).
    fn on_shared_end(&self, base: u64) {
        if self.watch.on_shared_end(base) {
            self.on_free(base);
        }
    }

    /// Whether an asynchronous allocation or free on `stream` (`per_thread`: a `_ptsz` call) in
    /// context `ctx` is being captured into a graph. Where the driver cannot say, it is taken as
    /// captured while a capture kreplay follows is in progress on the device: a captured
    /// allocation taken for an ordinary one would be snapshotted with no memory behind it.
    fn captured(&self, stream: CuStream, per_thread: bool, ctx: CuContext) -> bool {
        // SAFETY: the stream the application passed to the allocation or free in progress.
        unsafe { self.driver.stream_capturing(stream, per_thread) }.unwrap_or_else(|| {
            self.ordinal(ctx)
                .is_some_and(|o| self.captures.on_device(o as u64) > 0)
        })
    }

    /// A `cuMemAllocAsync` captured into a graph returned `base`: the driver made an allocation
    /// node of it, with no memory behind it until a graph holding it is launched.
    fn on_captured_alloc(&self, ctx: CuContext, base: u64, size: u64) {
        // The pool's device, as far as the call tells; the graph's instantiation reads the
        // node's own placement.
        let place = match self.ordinal(ctx) {
            Some(o) => Place::Device(o),
            None => Place::Other("the capturing context's device is not known".to_owned()),
        };
        let alloc = GraphAlloc { base, size, place };
        self.on_graph_alloc_node(alloc, &[], "cuMemAllocAsync captured into a graph");
    }

    /// An allocation node was made (`what`): known, never snapshotted, until a graph holding
    /// it is launched. `peers`: the devices its access list lets reach it (linked with its
    /// own, as `cuMemSetAccess` links them).
    fn on_graph_alloc_node(&self, alloc: GraphAlloc, peers: &[u64], what: &str) {
        log(
            LogLevel::Debug,
            format!(
                "{what}: {} bytes at {:#x} ({:?}), no memory behind it until a graph holding it \
                 is launched",
                alloc.size, alloc.base, alloc.place
            ),
        );
        if let Place::Device(d) = alloc.place
            && !peers.is_empty()
        {
            let mut devices = peers.to_vec();
            devices.push(d as u64);
            self.link_devices(&devices, what);
        }
        self.graphs.on_alloc_node(&self.inventory, alloc);
    }

    /// `cuGraphInstantiate*` made executable graph `exec` of `graph` with `flags`: which memory
    /// its launches allocate and free is read now, from the graph and its child graphs.
    fn on_graph_instantiated(&self, exec: usize, graph: usize, flags: u64) {
        let nodes = crate::graphmem::walk(graph, &DriverGraphs(self.driver));
        match &nodes {
            Ok(n) if !n.allocs.is_empty() || !n.frees.is_empty() => log(
                LogLevel::Debug,
                format!(
                    "graph {exec:#x} instantiated (flags {flags:#x}): {} allocation node(s), {} \
                     free node(s)",
                    n.allocs.len(),
                    n.frees.len()
                ),
            ),
            Ok(_) => {}
            Err(why) => log(
                LogLevel::Warn,
                format!(
                    "the memory nodes of graph {exec:#x} cannot be read ({why}): once it is \
                     launched, launches run once (untracked_memory)"
                ),
            ),
        }
        self.graphs.on_instantiated(exec, nodes, flags);
    }

    /// `cuGraphLaunch` of `exec` in context `ctx` succeeded: its allocations have memory
    /// behind them and are tracked (ending with the context), its free nodes' end.
    fn on_graph_launched(&self, exec: usize, ctx: CuContext) {
        let launched = self
            .graphs
            .on_launched(&self.inventory, exec, self.ordinal(ctx));
        for &(base, device) in &launched.backed {
            // Every kind ends with the context, the ones not snapshotted too (they decline
            // launches while live).
            self.contexts.note_allocation(ctx as usize, base);
            self.stats.allocations.fetch_add(1, Ordering::Relaxed);
            let what = match device {
                Some(d) => format!("on device {d} is tracked"),
                None => "is live, not snapshotted".to_owned(),
            };
            log(
                LogLevel::Debug,
                format!("graph {exec:#x} launched: its allocation at {base:#x} {what}"),
            );
        }
        for &base in &launched.freed {
            self.contexts.note_free(base);
            self.stats.frees.fetch_add(1, Ordering::Relaxed);
            log(
                LogLevel::Debug,
                format!("graph {exec:#x} launched: its free node freed {base:#x}"),
            );
        }
        if let Some(why) = launched.unreadable {
            log(
                LogLevel::Warn,
                format!("{why}: launches run once (untracked_memory)"),
            );
        }
    }

    /// Forgets the tracked allocation at `base`; returns it.
    fn on_free(&self, base: u64) -> Option<Allocation> {
        let freed = self.inventory.on_free(base);
        if freed.is_some() {
            self.stats.frees.fetch_add(1, Ordering::Relaxed);
            log(LogLevel::Debug, format!("free at {base:#x}"));
        }
        freed
    }

    /// The application is about to allocate: give back kreplay's kept shadow on its device,
    /// unless a stream of the device is being captured (`cuMemFree` may synchronize the
    /// device, and a capture is not risked for it; an allocation captured into a graph takes
    /// no memory now anyway).
    fn before_app_alloc(&self, ctx: CuContext) {
        if let Some(o) = self.ordinal(ctx)
            && self.captures.on_device(o as u64) > 0
        {
            return;
        }
        let key = ctx as usize;
        let state = self
            .devices
            .lock()
            .iter()
            .find(|(c, _)| *c == key)
            .map(|(_, d)| d.clone());
        if let Some(d) = state {
            d.memory.release_kept_shadow();
        }
    }

    /// Warn once that surfaces stop replays (see [`crate::tracking`]).
    fn warn_surfaces(&self) {
        if !self.warned_surfaces.swap(true, Ordering::Relaxed) {
            log(
                LogLevel::Warn,
                "surfaces (cuSurfObjectCreate, cuSurfRefSetArray) let kernels write CUDA arrays, \
                 which are not snapshotted: launches run once, declined as untracked_memory, \
                 while a surface object is live (and after a surface reference is bound)",
            );
        }
    }

    /// The snapshot filter of `launch` (see [`crate::scope`]): its module's writable variables,
    /// what its arguments point into, from the device's filter `base` (agent scope) or from
    /// nothing (referenced scope).
    fn launch_scope(
        &self,
        launch: &Launch,
        device: &DeviceState,
        kernel: Option<&str>,
        base: &Filter,
    ) -> Result<Filter, String> {
        let lookup = DriverModules {
            driver: self.driver,
            function: launch.function,
        };
        let variables = self.modules.variables_of(
            launch.ctx as usize,
            launch.function as usize,
            kernel,
            &lookup,
        )?;
        // After the variables: finding them loads the module when it is loaded lazily, and
        // with it the cubin that says which device-runtime functions the kernel calls.
        if let Some(kernel) = kernel {
            let calls = self.modules.runtime_calls(kernel);
            device
                .runtime
                .check(kernel, &calls, self.config.device_heap)?;
        }
        let referenced = self.config.snapshot.scope == SnapshotScope::Referenced;
        let (start, values, narrowed) = match self.launch_argument_values(launch) {
            Ok(values) if referenced => {
                (Filter::referenced_only(device.ordinal as u64), values, true)
            }
            Ok(values) => (base.clone(), values, false),
            Err(why) => {
                if referenced && !self.warned_layout.swap(true, Ordering::Relaxed) {
                    let why = match why {
                        ArgumentsUnknown::NoLayout => {
                            "the driver cannot describe a kernel's parameters (cuFuncGetParamInfo, \
                             CUDA 12.4)"
                                .to_string()
                        }
                        ArgumentsUnknown::BadExtra(e) => format!("a launch's extra array: {e}"),
                    };
                    log(
                        LogLevel::Warn,
                        format!(
                            "KREPLAY_SNAPSHOT_SCOPE=referenced: {why}; such launches snapshot \
                             the agent scope"
                        ),
                    );
                }
                (base.clone(), Vec::new(), false)
            }
        };
        // A graph allocation with no memory behind it is known to kreplay but never in the
        // inventory: an argument pointing into it declines the launch before any copy.
        let scoped = launch_filter(start, &self.inventory, &variables, &values, |v, end| {
            self.graphs
                .argument_reason(v)
                .or_else(|| self.untracked_memory_kind(v, device.pageable, end))
        })?;
        if self.config.snapshot.strategy == RestoreStrategy::Auto {
            // Chosen here, once per replayed launch (the window asks for the scope only of a
            // launch it replays, before the snapshot): the referenced footprint when narrowed,
            // else the device's tracked allocations.
            let footprint = if narrowed {
                scoped.referenced_bytes + scoped.variable_bytes
            } else {
                self.inventory.select(base).iter().map(|r| r.size).sum()
            };
            let key = self.modules.kernel_key(launch.function as usize);
            self.choose_detection(device, key as usize, footprint);
        }
        Ok(scoped.filter)
    }

    /// The argument values of `launch`, read with the driver's description of the launched
    /// function's parameters (asked once per function).
    fn launch_argument_values(&self, launch: &Launch) -> Result<Vec<u64>, ArgumentsUnknown> {
        let layout = if launch.params.is_null() {
            None
        } else {
            self.layout(launch.function)
        };
        // SAFETY: the launch call's own parameters, read during its API ENTER callback; the
        // layout is the driver's description of the launched function.
        unsafe { argument_values(launch.params, launch.extra, layout.as_deref()) }
    }

    /// `auto`: offer the device kernels to the snapshot of a launch of `function` (its kernel
    /// key, [`ModuleRegistry::kernel_key`]) over `footprint` bytes or not, as the device's
    /// measured choice says, and remember the choice for the snapshot (which applies it to the
    /// device, see `InjectedLaunch::snapshot_strategy`) and for [`Self::learn_choice`]. The kernels are
    /// loaded here when chosen, so that their loading is not counted in the first snapshot that
    /// uses them.
    fn choose_detection(&self, device: &DeviceState, function: usize, footprint: u64) {
        let key = ChoiceKey::new(function, footprint);
        let on = detection_for(
            &device.choice.lock(),
            key,
            footprint,
            self.config.auto_measured,
        );
        if on {
            device.memory.load_kernels();
        }
        // Applied to the device under its writer lock (`snapshot_strategy`), not here.
        CHOSEN.with(|c| c.set(Some((key, on))));
    }

    /// Record what the launch just replayed on `device` cost per restore under the choice
    /// [`Self::choose_detection`] made for it.
    fn learn_choice(&self, device: &DeviceState, record: &ReplayRecord) {
        let Some((key, on)) = CHOSEN.with(std::cell::Cell::take) else {
            return;
        };
        if !matches!(record.outcome, ReplayOutcome::Replayed { .. }) {
            return;
        }
        let c = &record.cost;
        let restore: Duration = c.restore_times.iter().sum();
        let Some(ns) = per_restore_ns(
            c.snapshot.as_nanos() as u64,
            restore.as_nanos() as u64,
            c.restore_times.len(),
        ) else {
            return;
        };
        device.choice.lock().record(key, on, ns);
        let counter = if on {
            &self.stats.auto_device
        } else {
            &self.stats.auto_full
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// The parameter layout of `f`, asked of the driver once per function.
    fn layout(&self, f: CuFunction) -> Option<Arc<[Param]>> {
        if let Some(known) = self.layouts.lock().get(&(f as usize)) {
            return known.clone();
        }
        // SAFETY: the function the application is launching, inside its launch call.
        let layout: Option<Arc<[Param]>> = unsafe { self.driver.param_layout(f) }.map(Into::into);
        self.layouts.lock().insert(f as usize, layout.clone());
        layout
    }

    /// What the driver knows `addr` to be, when it is memory kreplay does not track and a
    /// kernel of a device with pageable memory access `pageable` may write (see
    /// [`untracked_at`]; `end`: an end pointer).
    fn untracked_memory_kind(&self, addr: u64, pageable: bool, end: bool) -> Option<String> {
        let kind = self.driver.memory_type(addr)?;
        let start = self.driver.range_start(addr);
        let tracked = start.is_some_and(|s| self.inventory.get(s).is_some());
        untracked_at(addr, end, kind, start, tracked, pageable).map(str::to_owned)
    }

    /// A resource-domain callback: a context about to be destroyed, a module loaded or about
    /// to be unloaded.
    fn on_resource(&self, id: CallbackId, data: &ResourceData) {
        if id == CBID_RESOURCE_CONTEXT_DESTROY_STARTING {
            // kreplay's own calls while it frees what it held in the context are not the
            // application's.
            let _guard = Guard::enter();
            self.before_context_destroyed(data.context);
            return;
        }
        if data.resource_descriptor.is_null() {
            return;
        }
        // SAFETY: for module callbacks the descriptor is a CUpti_ModuleResourceData, valid
        // during the callback.
        let m = unsafe { *(data.resource_descriptor as *const ModuleResourceData) };
        match id {
            CBID_RESOURCE_MODULE_LOADED => {
                let image: &[u8] = if m.cubin.is_null() {
                    &[]
                } else {
                    // SAFETY: CUPTI's copy of the loaded cubin, cubin_size bytes, valid during
                    // the callback (parsed, never kept).
                    unsafe { std::slice::from_raw_parts(m.cubin.cast(), m.cubin_size) }
                };
                match self.modules.on_loaded(m.module_id, image) {
                    Ok(n) => log(
                        LogLevel::Debug,
                        format!(
                            "module {} loaded ({} bytes): {n} writable module-scope variable(s)",
                            m.module_id, m.cubin_size
                        ),
                    ),
                    Err(e) => {
                        if !self.warned_cubin.swap(true, Ordering::Relaxed) {
                            log(
                                LogLevel::Warn,
                                format!(
                                    "the image of module {} cannot be read ({e}): launches of \
                                     its kernels run once (untracked_memory)",
                                    m.module_id
                                ),
                            );
                        }
                    }
                }
            }
            CBID_RESOURCE_MODULE_UNLOAD_STARTING => {
                self.modules.on_unloading(m.module_id);
                self.layouts.lock().clear();
            }
            _ => {}
        }
    }

    fn launch_enter(&self, launch: Launch, kernel: Option<&str>) {
        CHOSEN.with(|c| c.set(None));
        self.stats.launches.fetch_add(1, Ordering::Relaxed);
        let traced = self.tools.dispatch_tracing_configured();
        let (mut tool, trace_only) = match self.tools.replay_tool() {
            Some(tool) => (tool, false),
            // Not replayed, but timed and reported: a window of one pass.
            None if traced => (Box::new(FixedPasses::new(1)) as Box<dyn ReplayTool>, true),
            None => return self.ordinary_without_window(&launch),
        };
        let device = match self.device(launch.ctx) {
            Ok(d) => d,
            Err(e) => {
                log(LogLevel::Warn, format!("launch not replayed: {e}"));
                return self.ordinary_without_window(&launch);
            }
        };
        let cuda_launch = CudaLaunch {
            driver: self.driver,
            launch,
            drainer: Some(&device.drainer),
        };
        // A launch on a stream being captured into a graph does not run now (it is declined and
        // no record is due); an event recorded there would become a node of the graph.
        let timer = if traced && cuda_launch.replayable().is_ok() {
            PassTimer::new(self.driver, launch.effective_stream())
                .map_err(|e| log(LogLevel::Warn, format!("dispatch timing: {e}")))
                .ok()
        } else {
            None
        };
        // The devices whose kernels may write this device's memory, or whose memory its kernels
        // may write (peer access): a replay locks and drains them all (the window asks again
        // once it holds them, see `linked_devices`).
        let group = self.peers.group(device.ordinal as u64);
        let ops = InjectedLaunch {
            inner: cuda_launch,
            watch: &self.watch,
            graphs: &self.graphs,
            scope: Some(LaunchScope {
                backend: self,
                device: &device,
                kernel,
            }),
            captures: &self.captures,
            traced: timer.as_ref().map(|t| (t, &*self.tools)),
            device: Some(&device),
        };
        let id = self.next_dispatch.fetch_add(1, Ordering::Relaxed);
        let info = launch.dispatch_info(id, |a| ops.inner.attribute(a));
        let cx = WindowContext {
            locks: &self.locks,
            snapshotter: &device.snapshotter,
            filter: &device.filter,
            registry: self.tools.contexts(),
            group: &group,
        };
        let window = Window::enter(cx, &mut *tool, info, &ops);
        debug_assert_eq!(info.agent_id, device.ordinal as u64);
        late::with(&PENDING, &PENDING_LATE, |p| {
            *p.borrow_mut() = Some(Pending {
                window,
                launch,
                device: device.clone(),
                tool,
                timer,
                trace_only,
            })
        });
    }

    /// A launch that gets no window still runs as an ordinary one: it holds the reader side of
    /// its device until its API EXIT, so it is not submitted inside a replay window another
    /// thread holds there (whose restores would undo what it writes).
    fn ordinary_without_window(&self, launch: &Launch) {
        let read = self.locks.read_owned(launch.device as u64).ok();
        late::with(&UNWINDOWED, &UNWINDOWED_LATE, |u| *u.borrow_mut() = read);
    }

    fn launch_exit(&self, result: CuResult, symbol: Option<&CStr>) {
        late::with(&UNWINDOWED, &UNWINDOWED_LATE, |u| u.borrow_mut().take());
        let Some(Pending {
            window,
            launch,
            device,
            mut tool,
            timer,
            trace_only,
        }) = late::with(&PENDING, &PENDING_LATE, |p| p.borrow_mut().take())
        else {
            return;
        };
        let ops = InjectedLaunch {
            inner: CudaLaunch {
                driver: self.driver,
                launch,
                // The drain comes before the snapshot, at ENTER; nothing drains at EXIT.
                drainer: None,
            },
            watch: &self.watch,
            graphs: &self.graphs,
            scope: None,
            captures: &self.captures,
            traced: timer.as_ref().map(|t| (t, &*self.tools)),
            device: None,
        };
        let launched = self
            .driver
            .check("kernel launch", result)
            .map_err(|e| e.to_string());
        let record = window.exit(&mut *tool, self.tools.contexts(), &ops, launched);
        if let (ReplayOutcome::RanOnce { .. }, Some(kernel)) = (&record.outcome, symbol) {
            // A kernel that ran once without its scope being asked for (one pass) may still
            // have used the device heap: later launches on its context must know.
            let kernel = kernel.to_string_lossy();
            device
                .runtime
                .note(&kernel, &self.modules.runtime_calls(&kernel));
        }
        if trace_only {
            return;
        }
        self.learn_choice(&device, &record);
        let name = symbol.map_or(std::borrow::Cow::Borrowed("?"), CStr::to_string_lossy);
        self.account(&record, &name);
        self.tools.replay_finished(&record, &name);
    }

    fn account(&self, record: &ReplayRecord, name: &str) {
        let s = &self.stats;
        let c = &record.cost;
        s.passes.fetch_add(c.passes_run, Ordering::Relaxed);
        s.bytes_snapshotted
            .fetch_add(c.bytes_snapshotted, Ordering::Relaxed);
        s.bytes_restored
            .fetch_add(c.bytes_restored, Ordering::Relaxed);
        s.snapshot_ns
            .fetch_add(c.snapshot.as_nanos() as u64, Ordering::Relaxed);
        let restore: Duration = c.restore_times.iter().sum();
        s.restore_ns
            .fetch_add(restore.as_nanos() as u64, Ordering::Relaxed);
        s.restores
            .fetch_add(c.restore_times.len() as u64, Ordering::Relaxed);
        let relaunch: Duration = c.pass_times.iter().skip(1).sum();
        s.relaunch_ns
            .fetch_add(relaunch.as_nanos() as u64, Ordering::Relaxed);
        s.drain_ns
            .fetch_add(c.drain.as_nanos() as u64, Ordering::Relaxed);
        s.replay_ns
            .fetch_add(c.total.as_nanos() as u64, Ordering::Relaxed);
        match &record.outcome {
            ReplayOutcome::Replayed { passes, .. } => {
                s.replayed.fetch_add(1, Ordering::Relaxed);
                log(
                    LogLevel::Info,
                    format!(
                        "replayed {name} x{passes}: snapshot {} B in {:?}, restores {} B in {:?}",
                        c.bytes_snapshotted, c.snapshot, c.bytes_restored, restore
                    ),
                );
            }
            ReplayOutcome::RanOnce { .. } => {
                if let Some(d) = record.outcome.decline() {
                    *s.declines
                        .lock()
                        .entry(d.reason.as_str().to_owned())
                        .or_default() += 1;
                    log(LogLevel::Info, format!("{name} ran once: {d}"));
                }
            }
            ReplayOutcome::PassFailed { .. } | ReplayOutcome::RestoreFailed { .. } => {
                s.failed.fetch_add(1, Ordering::Relaxed);
                let why = record.diagnostic().unwrap_or_default();
                log(LogLevel::Warn, format!("replay of {name} failed: {why}"));
            }
        }
    }

    fn summary(&self) -> Summary {
        // One look at the devices (their lock is not reentrant).
        let (shadow_bytes_held, memory) = self.devices.lock().iter().fold(
            (0, MemoryTimes::default()),
            |(bytes, times), (_, d)| {
                (
                    bytes + d.memory.shadow_bytes(),
                    times.add(&d.memory.times()),
                )
            },
        );
        let s = &self.stats;
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        Summary {
            passes_per_launch: self.config.passes,
            launches: l(&s.launches),
            replayed: l(&s.replayed),
            passes_run: l(&s.passes),
            failed: l(&s.failed),
            declined: s.declines.lock().clone(),
            graph_launches: l(&s.graph_launches),
            auto_device: l(&s.auto_device),
            auto_full: l(&s.auto_full),
            allocations: l(&s.allocations),
            frees: l(&s.frees),
            managed_allocations: l(&s.managed),
            bytes_snapshotted: l(&s.bytes_snapshotted),
            bytes_restored: l(&s.bytes_restored),
            restores: l(&s.restores),
            snapshot_ns: l(&s.snapshot_ns),
            restore_ns: l(&s.restore_ns),
            relaunch_ns: l(&s.relaunch_ns),
            drain_ns: l(&s.drain_ns),
            replay_ns: l(&s.replay_ns),
            shadow_bytes_held,
            memory,
            callbacks: l(&s.callbacks),
            callback_ns: l(&s.callback_ns),
            module_callbacks: l(&s.module_callbacks),
            module_ns: l(&s.module_ns),
            init_ns: l(&s.init_ns),
            tool_work: l(&s.tool_work),
            tool_work_kept_bytes: l(&s.tool_work_kept),
            tool_work_lost: l(&s.tool_work_lost),
        }
    }

    /// One driver-API callback.
    ///
    /// # Safety
    /// `data` is the `CUpti_CallbackData` CUPTI passes for a driver-API callback of `id`.
    unsafe fn handle(&self, id: CallbackId, data: &CallbackData) {
        let enter = data.callback_site == API_ENTER;
        let exit = data.callback_site == API_EXIT;
        // SAFETY: at EXIT, function_return_value points to the call's CUresult.
        let result = || unsafe { *(data.function_return_value as *const CuResult) };
        let params = data.function_params;
        if let Some(write) = fence::device_write(id) {
            // No fenced call is one of the calls handled below.
            let graph = (write == fence::DeviceWrite::Graph).then(|| {
                // SAFETY: cuGraphLaunch(_ptsz)_params starts with the executable graph.
                unsafe { (*(params as *const GraphLaunchParams)).exec as usize }
            });
            if enter {
                self.note_unreplayed(write, data.context);
                if graph.is_some_and(|exec| self.graphs.allocates(exec)) {
                    // Its allocations take memory now: as before any allocation, kreplay's
                    // kept shadow makes room.
                    self.before_app_alloc(data.context);
                }
                let devices = self.fenced_devices(id, data);
                fence::enter(&self.locks, &devices);
            } else if exit {
                if let Some(exec) = graph
                    && result() == CUDA_SUCCESS
                {
                    // Before the reader side is given back: no replay window on the device
                    // snapshots while the graph's allocations become tracked memory.
                    self.on_graph_launched(exec, data.context);
                }
                fence::exit();
            }
            return;
        }
        // A call that may link devices into one replay group waits for the open windows of
        // every device that may have one, and holds new ones off until the link is recorded at
        // its API EXIT (below), so that a window never holds only part of a group.
        let linking = fence::links_devices(id);
        if linking && enter {
            fence::enter(&self.locks, &self.linking_devices(data.context));
        }
        let _linked = (linking && exit).then_some(fence::ExitOnDrop);
        if enter && cbid::takes_device_memory(id) {
            self.before_app_alloc(data.context);
        }
        match id {
            cbid::CU_MEM_ALLOC_V2
            | cbid::CU_MEM_ALLOC_ASYNC
            | cbid::CU_MEM_ALLOC_ASYNC_PTSZ
            | cbid::CU_MEM_ALLOC_FROM_POOL_ASYNC
            | cbid::CU_MEM_ALLOC_FROM_POOL_ASYNC_PTSZ
                if exit && result() == CUDA_SUCCESS =>
            {
                // SAFETY: these calls' parameter structs start with (CUdeviceptr*, size_t), and
                // on success *dptr holds the new allocation.
                let (base, size) = unsafe {
                    let p = &*(params as *const MemAllocParams);
                    (*p.dptr, p.bytesize as u64)
                };
                if id == cbid::CU_MEM_ALLOC_V2 {
                    self.contexts.note_allocation(data.context as usize, base);
                }
                // SAFETY: `params` is this call's parameter struct.
                let stream = unsafe { async_stream(id, params) };
                match stream {
                    Some((stream, per_thread))
                        if self.captured(stream, per_thread, data.context) =>
                    {
                        self.on_captured_alloc(data.context, base, size);
                    }
                    _ => self.on_alloc(id, data.context, base, size, "cuMemAlloc"),
                }
            }
            cbid::CU_MEM_ALLOC_PITCH_V2 if exit && result() == CUDA_SUCCESS => {
                // SAFETY: cuMemAllocPitch_v2_params; on success both out-pointers are set.
                let (base, size) = unsafe {
                    let p = &*(params as *const MemAllocPitchParams);
                    (*p.dptr, (*p.pitch as u64).saturating_mul(p.height as u64))
                };
                self.contexts.note_allocation(data.context as usize, base);
                self.on_alloc(id, data.context, base, size, "cuMemAllocPitch");
            }
            cbid::CU_MEM_FREE_V2 | cbid::CU_MEM_FREE_ASYNC | cbid::CU_MEM_FREE_ASYNC_PTSZ
                if enter =>
            {
                // SAFETY: these parameter structs start with the CUdeviceptr being freed.
                let base = unsafe { (*(params as *const MemFreeParams)).dptr };
                if id != cbid::CU_MEM_FREE_V2 {
                    // SAFETY: cuMemFreeAsync(_ptsz)_params.
                    let stream = unsafe { (*(params as *const MemFreeAsyncParams)).stream };
                    let per_thread = id == cbid::CU_MEM_FREE_ASYNC_PTSZ;
                    if self.captured(stream, per_thread, data.context) {
                        // A free node of the graph being captured: the memory stays until a
                        // graph holding the node is launched (read at its instantiation).
                        log(
                            LogLevel::Debug,
                            format!("cuMemFreeAsync of {base:#x} captured into a graph"),
                        );
                        return;
                    }
                }
                let owner = self.contexts.note_free(base);
                if let Some(forgotten) = self.on_app_free(base) {
                    self.frees.lock().push((forgotten, owner));
                }
            }
            cbid::CU_MEM_FREE_V2 | cbid::CU_MEM_FREE_ASYNC | cbid::CU_MEM_FREE_ASYNC_PTSZ
                if exit =>
            {
                // SAFETY: as at ENTER, the CUdeviceptr being freed.
                let base = unsafe { (*(params as *const MemFreeParams)).dptr };
                self.free_exit(base, result());
            }
            cbid::CU_GRAPH_ADD_MEM_ALLOC_NODE if exit && result() == CUDA_SUCCESS => {
                // SAFETY: cuGraphAddMemAllocNode_params; on success the driver wrote the
                // allocation's address into the application's nodeParams, alive during its call.
                let node = unsafe {
                    let p = *(params as *const GraphAddMemAllocNodeParams);
                    p.node_params.as_ref().copied()
                };
                if let Some(node) = node {
                    // SAFETY: the node's access list, `access_desc_count` entries, alive during
                    // the call.
                    let peers = unsafe { granted(node.access_descs, node.access_desc_count) };
                    self.on_graph_alloc_node(node.allocation(), &peers, "cuGraphAddMemAllocNode");
                }
            }
            cbid::CU_GRAPH_ADD_NODE | cbid::CU_GRAPH_ADD_NODE_V2
                if exit && result() == CUDA_SUCCESS =>
            {
                // SAFETY: cuGraphAddNode(_v2)_params; nodeParams points to the application's
                // CUgraphNodeParams (256 bytes), alive during its call, whose head is read.
                let node = unsafe {
                    let head = if id == cbid::CU_GRAPH_ADD_NODE {
                        (*(params as *const GraphAddNodeParams)).node_params
                    } else {
                        (*(params as *const GraphAddNodeV2Params)).node_params
                    };
                    head.as_ref()
                        .filter(|h| h.node_type == CU_GRAPH_NODE_TYPE_MEM_ALLOC)
                        .map(|h| h.alloc)
                };
                if let Some(node) = node {
                    // SAFETY: as above, the node's access list.
                    let peers = unsafe { granted(node.access_descs, node.access_desc_count) };
                    self.on_graph_alloc_node(node.allocation(), &peers, "cuGraphAddNode");
                }
            }
            id if cbid::GRAPH_INSTANTIATE.contains(&id) && exit && result() == CUDA_SUCCESS => {
                // SAFETY: every cuGraphInstantiate*_params starts with (CUgraphExec *, CUgraph);
                // on success the executable graph was written.
                let (exec, graph) = unsafe {
                    let p = *(params as *const GraphInstantiateParams);
                    (p.ph_graph_exec.as_ref().copied(), p.graph)
                };
                // SAFETY: the parameter struct of instantiate call `id`.
                let flags = unsafe { cupti::instantiate_flags(id, params) };
                if let Some(exec) = exec {
                    self.on_graph_instantiated(exec as usize, graph as usize, flags);
                }
            }
            cbid::CU_GRAPH_EXEC_DESTROY if enter => {
                // SAFETY: cuGraphExecDestroy_params is the executable graph.
                let exec = unsafe { (*(params as *const GraphLaunchParams)).exec };
                self.graphs.on_exec_destroyed(exec as usize);
            }
            cbid::CU_MEM_ALLOC_MANAGED if exit && result() == CUDA_SUCCESS => {
                // SAFETY: cuMemAllocManaged_params starts with (CUdeviceptr*, size_t); on
                // success *dptr holds the new allocation.
                let (base, size) = unsafe {
                    let p = &*(params as *const MemAllocParams);
                    (*p.dptr, p.bytesize as u64)
                };
                self.watch.on_managed_alloc(base, size);
                self.contexts.note_allocation(data.context as usize, base);
                self.stats.managed.fetch_add(1, Ordering::Relaxed);
                if !self.warned_managed.swap(true, Ordering::Relaxed) {
                    log(
                        LogLevel::Warn,
                        "managed memory (cuMemAllocManaged) is not snapshotted: launches run \
                         once, declined as untracked_memory, while managed memory is allocated",
                    );
                }
            }
            cbid::CU_CTX_ENABLE_PEER_ACCESS if exit && result() == CUDA_SUCCESS => {
                // SAFETY: cuCtxEnablePeerAccess_params.
                let peer = unsafe { (*(params as *const CtxEnablePeerAccessParams)).peer_context };
                let devices = [self.ordinal(data.context), self.context_ordinal(peer)];
                if let [Some(a), Some(b)] = devices {
                    self.link_devices(&[a as u64, b as u64], "cuCtxEnablePeerAccess");
                }
            }
            cbid::CU_MEM_SET_ACCESS if exit && result() == CUDA_SUCCESS => {
                // SAFETY: cuMemSetAccess_params, its access list `count` entries long.
                let (ptr, size, access) = unsafe {
                    let p = *(params as *const MemSetAccessParams);
                    (p.ptr, p.size as u64, access_list(p.desc, p.count))
                };
                let mut devices = cupti::granted_devices(&access);
                // The mappings whose own device may now write them are snapshotted from here
                // on (and the ones it no longer may, not).
                let (entered, left) = self
                    .watch
                    .record_access(&self.inventory, ptr, size, &access);
                let said = [
                    (entered, "is snapshotted"),
                    (left, "is no longer writable by its device, not snapshotted"),
                ];
                for (bases, what) in said {
                    for base in bases {
                        log(
                            LogLevel::Debug,
                            format!("cuMemSetAccess: mapping at {base:#x} {what}"),
                        );
                    }
                }
                // The mapping's own device (its handle's, as tracked), or where it is not
                // tracked the calling context's: one of them holds the memory.
                match self.watch.mapping_device(ptr) {
                    Some(d) => devices.push(d as u64),
                    None => devices.extend(self.ordinal(data.context).map(|o| o as u64)),
                }
                self.link_devices(&devices, "cuMemSetAccess");
            }
            cbid::CU_MEM_POOL_SET_ACCESS if exit && result() == CUDA_SUCCESS => {
                // SAFETY: cuMemPoolSetAccess_params, its access list `count` entries long.
                let mut devices = unsafe {
                    let p = *(params as *const MemPoolSetAccessParams);
                    granted(p.map, p.count)
                };
                if !devices.is_empty() {
                    // The pool's own device is not in the call: every device kreplay knows is
                    // linked with the ones granted (more waiting, never a missed writer).
                    devices.extend(self.known_devices());
                    devices.extend(self.ordinal(data.context).map(|o| o as u64));
                }
                self.link_devices(&devices, "cuMemPoolSetAccess");
            }
            cbid::CU_SURF_OBJECT_CREATE if exit && result() == CUDA_SUCCESS => {
                // SAFETY: cuSurfObjectCreate_params; on success *pSurfObject holds the new
                // surface object.
                let handle = unsafe {
                    let p = &*(params as *const SurfObjectCreateParams);
                    (!p.surface.is_null()).then(|| *p.surface)
                };
                if let Some(handle) = handle {
                    self.watch.on_surface_created(handle, data.context as usize);
                    self.warn_surfaces();
                }
            }
            cbid::CU_SURF_OBJECT_DESTROY if enter => {
                // SAFETY: cuSurfObjectDestroy_params.
                let handle = unsafe { (*(params as *const SurfObjectDestroyParams)).surface };
                self.watch.on_surface_destroyed(handle);
            }
            cbid::CU_SURF_REF_SET_ARRAY if exit && result() == CUDA_SUCCESS => {
                self.watch.on_surface_reference_bound(data.context as usize);
                self.warn_surfaces();
            }
            cbid::CU_IPC_OPEN_MEM_HANDLE
            | cbid::CU_IPC_OPEN_MEM_HANDLE_V2
            | cbid::CU_MEM_POOL_IMPORT_POINTER
                if exit && result() == CUDA_SUCCESS =>
            {
                // SAFETY: these calls' parameter structs start with the out-pointer of the new
                // device pointer, written on success.
                let base = unsafe { *(*(params as *const PointerOutParams)).dptr };
                let what = if id == cbid::CU_MEM_POOL_IMPORT_POINTER {
                    "cuMemPoolImportPointer"
                } else {
                    "cuIpcOpenMemHandle"
                };
                self.on_shared(data.context, base, None, what);
            }
            cbid::CU_IPC_CLOSE_MEM_HANDLE if enter => {
                // SAFETY: cuIpcCloseMemHandle_params is the CUdeviceptr being closed.
                let base = unsafe { (*(params as *const MemFreeParams)).dptr };
                self.contexts.note_free(base);
                self.on_shared_end(base);
            }
            cbid::CU_EXTERNAL_MEMORY_GET_MAPPED_BUFFER if exit && result() == CUDA_SUCCESS => {
                // SAFETY: cuExternalMemoryGetMappedBuffer_params; on success *devPtr is set, and
                // the buffer description the application passed is alive during the call.
                let (base, size) = unsafe {
                    let p = &*(params as *const ExternalMemoryGetMappedBufferParams);
                    (*p.dptr, p.buffer_desc.as_ref().map(|d| d.size))
                };
                self.on_shared(data.context, base, size, "cuExternalMemoryGetMappedBuffer");
            }
            cbid::CU_GRAPHICS_RESOURCE_GET_MAPPED_POINTER_V2
                if exit && result() == CUDA_SUCCESS =>
            {
                // SAFETY: cuGraphicsResourceGetMappedPointer_v2_params; on success the pointer
                // is set, and the size too where the application asked for it.
                let (base, size, resource) = unsafe {
                    let p = &*(params as *const GraphicsMappedPointerParams);
                    (
                        *p.dptr,
                        p.size.as_ref().map(|&n| n as u64),
                        p.resource as usize,
                    )
                };
                // Asked again for the same mapping: nothing new. A mapping that moved ends
                // the old one.
                match self.watch.on_graphics_unmapped(resource) {
                    Some(old) if old == base => {}
                    old => {
                        if let Some(old) = old {
                            self.on_shared_end(old);
                        }
                        self.on_shared(
                            data.context,
                            base,
                            size,
                            "cuGraphicsResourceGetMappedPointer",
                        );
                    }
                }
                self.watch.on_graphics_mapped(resource, base);
            }
            cbid::CU_GRAPHICS_UNMAP_RESOURCES | cbid::CU_GRAPHICS_UNMAP_RESOURCES_PTSZ if enter => {
                // SAFETY: cuGraphicsUnmapResources_params, its resource array `count` long.
                let resources: Vec<usize> = unsafe {
                    let p = &*(params as *const GraphicsUnmapParams);
                    if p.resources.is_null() {
                        Vec::new()
                    } else {
                        std::slice::from_raw_parts(p.resources, p.count as usize)
                            .iter()
                            .map(|&r| r as usize)
                            .collect()
                    }
                };
                for resource in resources {
                    if let Some(base) = self.watch.on_graphics_unmapped(resource) {
                        self.contexts.note_free(base);
                        self.on_shared_end(base);
                    }
                }
            }
            cbid::CU_MEM_MAP if exit && result() == CUDA_SUCCESS => {
                // SAFETY: cuMemMap_params.
                let p = unsafe { *(params as *const MemMapParams) };
                // The handle is still valid at the call's EXIT (the application releases it
                // afterwards, if at all); its location names the device, whatever context is
                // current.
                let location = self.driver.handle_location(p.handle);
                match self
                    .watch
                    .record_map(&self.inventory, p.ptr, p.size as u64, location)
                {
                    Ok(ordinal) => {
                        self.stats.allocations.fetch_add(1, Ordering::Relaxed);
                        log(
                            LogLevel::Debug,
                            format!(
                                "cuMemMap {} bytes at {:#x} on device {ordinal}",
                                p.size, p.ptr
                            ),
                        );
                    }
                    Err(why) => log(
                        LogLevel::Warn,
                        format!(
                            "cuMemMap of {} bytes at {:#x}: {why}; launches run once while it is \
                             mapped",
                            p.size, p.ptr
                        ),
                    ),
                }
            }
            cbid::CU_MEM_UNMAP if enter => {
                // SAFETY: cuMemUnmap_params.
                let p = unsafe { *(params as *const MemUnmapParams) };
                let (out, mut undo) = self.watch.unmap_enter(p.ptr, p.size as u64);
                for base in out.removed {
                    undo.allocations.extend(self.on_free(base));
                }
                self.unmaps.lock().push((p.ptr, undo));
            }
            cbid::CU_MEM_UNMAP if exit => {
                // SAFETY: cuMemUnmap_params.
                let p = unsafe { *(params as *const MemUnmapParams) };
                let undo = {
                    let mut unmaps = self.unmaps.lock();
                    let at = unmaps.iter().rposition(|(b, _)| *b == p.ptr);
                    at.map(|at| unmaps.swap_remove(at).1)
                };
                if let Some(undo) = &undo
                    && undo.partial
                    && result() == CUDA_SUCCESS
                {
                    // Said only once the driver has cut it: a refused unmap (the driver's
                    // answer to a part of a mapping) leaves the mapping whole and tracked.
                    log(
                        LogLevel::Warn,
                        format!(
                            "cuMemUnmap at {:#x} cut a mapping in part: launches run once while \
                             its rest is mapped",
                            p.ptr
                        ),
                    );
                }
                if let Some(undo) = undo
                    && result() != CUDA_SUCCESS
                {
                    // Still mapped: tracked again as before.
                    self.watch.unmap_failed(&self.inventory, undo);
                    log(
                        LogLevel::Debug,
                        format!(
                            "cuMemUnmap at {:#x} failed: its mappings are tracked again",
                            p.ptr
                        ),
                    );
                }
            }
            id if cbid::BEGIN_CAPTURE.contains(&id) => {
                // A capture cannot begin while a replay window drains or snapshots the device.
                let device = self.ordinal(data.context).map(|o| o as u64);
                if enter {
                    self.captures
                        .begin_enter(&self.locks, device, &self.known_devices());
                } else if exit {
                    let begun = (result() == CUDA_SUCCESS).then(|| {
                        // SAFETY: every cuStreamBeginCapture*_params starts with the stream.
                        let p = unsafe { *(params as *const StreamCaptureParams) };
                        let per_thread = matches!(
                            id,
                            cbid::CU_STREAM_BEGIN_CAPTURE_PTSZ
                                | cbid::CU_STREAM_BEGIN_CAPTURE_V2_PTSZ
                                | cbid::CU_STREAM_BEGIN_CAPTURE_TO_GRAPH_PTSZ
                        );
                        (CaptureStream::named(p.stream as usize, per_thread), device)
                    });
                    self.captures.begin_exit(begun);
                }
            }
            id if cbid::END_CAPTURE.contains(&id) && exit => {
                // SAFETY: both cuStreamEndCapture*_params start with the stream.
                let p = unsafe { *(params as *const StreamCaptureParams) };
                let per_thread = id == cbid::CU_STREAM_END_CAPTURE_PTSZ;
                if result() == CUDA_SUCCESS || !self.still_capturing(p.stream, per_thread) {
                    self.captures
                        .ended(CaptureStream::named(p.stream as usize, per_thread));
                }
            }
            cbid::CU_LAUNCH_KERNEL
            | cbid::CU_LAUNCH_KERNEL_PTSZ
            | cbid::CU_LAUNCH_KERNEL_EX
            | cbid::CU_LAUNCH_KERNEL_EX_PTSZ
            | cbid::CU_LAUNCH_COOPERATIVE_KERNEL
            | cbid::CU_LAUNCH_COOPERATIVE_KERNEL_PTSZ => {
                if enter {
                    let Some(ordinal) = self.ordinal(data.context) else {
                        return;
                    };
                    // SAFETY: params is the call's parameter struct for this callback id.
                    let launch = unsafe { decode_launch(id, params, data.context, ordinal) };
                    let symbol = (!data.symbol_name.is_null())
                        // SAFETY: CUPTI's NUL-terminated kernel name, valid during the callback.
                        .then(|| unsafe { CStr::from_ptr(data.symbol_name) })
                        .map(CStr::to_string_lossy);
                    self.launch_enter(launch, symbol.as_deref());
                } else if exit {
                    let symbol = (!data.symbol_name.is_null())
                        // SAFETY: CUPTI's NUL-terminated kernel name, valid during the callback.
                        .then(|| unsafe { CStr::from_ptr(data.symbol_name) });
                    self.launch_exit(result(), symbol);
                }
            }
            _ => {}
        }
    }
}

/// The stream of an asynchronous allocation call `id` (`cuMemAllocAsync`,
/// `cuMemAllocFromPoolAsync`, each with its `_ptsz` form) and whether it is a per-thread-stream
/// call; `None` for any other allocation call.
///
/// # Safety
/// `params` is the parameter struct of driver-API callback `id`.
unsafe fn async_stream(id: CallbackId, params: *const c_void) -> Option<(CuStream, bool)> {
    match id {
        cbid::CU_MEM_ALLOC_ASYNC | cbid::CU_MEM_ALLOC_ASYNC_PTSZ => {
            // SAFETY: cuMemAllocAsync(_ptsz)_params, per the caller.
            let stream = unsafe { (*(params as *const MemAllocAsyncParams)).stream };
            Some((stream, id == cbid::CU_MEM_ALLOC_ASYNC_PTSZ))
        }
        cbid::CU_MEM_ALLOC_FROM_POOL_ASYNC | cbid::CU_MEM_ALLOC_FROM_POOL_ASYNC_PTSZ => {
            // SAFETY: cuMemAllocFromPoolAsync(_ptsz)_params, per the caller.
            let stream = unsafe { (*(params as *const MemAllocFromPoolAsyncParams)).stream };
            Some((stream, id == cbid::CU_MEM_ALLOC_FROM_POOL_ASYNC_PTSZ))
        }
        _ => None,
    }
}

/// The devices that memory shared with this process and held by device `holder`, opened in a
/// context of `context_device`, links into one replay group: both, where they differ. The
/// context's kernels write the holder's memory (peer access, which `cuIpcOpenMemHandle` may
/// enable itself, `CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS`, with no `cuCtxEnablePeerAccess` to
/// link them), so a replay on either device locks and drains the other too.
fn shared_link(context_device: Option<i32>, holder: i32) -> Vec<u64> {
    let mut devices = vec![holder as u64];
    devices.extend(
        context_device
            .filter(|&d| d >= 0 && d != holder)
            .map(|d| d as u64),
    );
    devices
}

/// The device whose memory allocation call `id` returned, made in a context of
/// `context_device`: that device, but for `cuMemAllocFromPoolAsync`, whose pool may be another
/// device's than the stream's: the device the driver says holds the new pointer
/// (`pointer_device`, asked only then), else the context's. Attributed to the context's device,
/// such memory was left out of the snapshots of its own device's launches (a kernel there
/// writing it through a pointer kept in memory had its writes repeated by every pass).
fn allocation_device(
    id: CallbackId,
    context_device: Option<i32>,
    pointer_device: impl FnOnce() -> Option<i32>,
) -> Option<i32> {
    match id {
        cbid::CU_MEM_ALLOC_FROM_POOL_ASYNC | cbid::CU_MEM_ALLOC_FROM_POOL_ASYNC_PTSZ => {
            pointer_device().or(context_device)
        }
        _ => context_device,
    }
}

/// Whether driver-API call `id` puts work on a device that may write its memory: a launch of any
/// kind, a copy, a memset or a stream write.
fn writes_device(id: CallbackId) -> bool {
    fence::device_write(id).is_some_and(|w| w != fence::DeviceWrite::Wait)
        || cbid::LAUNCHES.contains(&id)
}

/// The drain before a launch's snapshot, on a thread of kreplay's own (see
/// [`crate::drainer`]): the launch's context and every other context seen on its device (see
/// [`crate::contexts`]).
fn context_drainer(driver: &'static Driver, timeout: Duration, contexts: Arc<Contexts>) -> Drainer {
    Drainer::new(timeout, move |ctx| {
        // The drain thread's own calls must neither fail nor invalidate a capture in progress
        // on another thread (the window drains only while no stream of the device captures).
        let _relaxed = driver.relaxed_capture();
        contexts.drain_device(ctx, |c| {
            let gone_or_failed = |e: crate::driver::CuError| match e.code {
                CUDA_ERROR_INVALID_CONTEXT | CUDA_ERROR_CONTEXT_IS_DESTROYED => SyncError::Gone,
                _ => SyncError::Failed(e.to_string()),
            };
            // SAFETY: a context kreplay saw in a call of the application's and that was not
            // destroyed since (`cuCtxDestroy` forgets it first); one the driver no longer knows
            // is an error code.
            unsafe { driver.make_current(c as CuContext) }.map_err(gone_or_failed)?;
            // SAFETY: synchronizes the current context: every stream of it.
            driver
                .check("cuCtxSynchronize", unsafe { (driver.ctx_synchronize)() })
                .map_err(gone_or_failed)
        })
    })
}

/// The launch a launch callback describes.
///
/// # Safety
/// `params` is the parameter struct of driver-API callback `id` (one of [`cbid::LAUNCHES`]).
unsafe fn decode_launch(
    id: CallbackId,
    params: *const c_void,
    ctx: CuContext,
    device: i32,
) -> Launch {
    let per_thread = matches!(
        id,
        cbid::CU_LAUNCH_KERNEL_PTSZ
            | cbid::CU_LAUNCH_KERNEL_EX_PTSZ
            | cbid::CU_LAUNCH_COOPERATIVE_KERNEL_PTSZ
    );
    match id {
        cbid::CU_LAUNCH_COOPERATIVE_KERNEL | cbid::CU_LAUNCH_COOPERATIVE_KERNEL_PTSZ => {
            // SAFETY: cuLaunchCooperativeKernel_params.
            let p = unsafe { *(params as *const LaunchCooperativeKernelParams) };
            Launch {
                ctx,
                device,
                api: LaunchApi::Cooperative,
                per_thread,
                function: p.f,
                grid: p.grid,
                block: p.block,
                shared_mem_bytes: p.shared_mem_bytes,
                stream: p.stream,
                params: p.kernel_params,
                extra: std::ptr::null_mut(),
            }
        }
        cbid::CU_LAUNCH_KERNEL_EX | cbid::CU_LAUNCH_KERNEL_EX_PTSZ => {
            // SAFETY: cuLaunchKernelEx_params, whose config points to the caller's CUlaunchConfig.
            let (p, c) = unsafe {
                let p = *(params as *const LaunchKernelExParams);
                (p, *p.config)
            };
            Launch {
                ctx,
                device,
                api: LaunchApi::KernelEx { config: p.config },
                per_thread,
                function: p.f,
                grid: c.grid_dim,
                block: c.block_dim,
                shared_mem_bytes: c.shared_mem_bytes,
                stream: c.stream,
                params: p.kernel_params,
                extra: p.extra,
            }
        }
        _ => {
            // SAFETY: cuLaunchKernel_params.
            let p = unsafe { *(params as *const LaunchKernelParams) };
            Launch {
                ctx,
                device,
                api: LaunchApi::Kernel,
                per_thread,
                function: p.f,
                grid: p.grid,
                block: p.block,
                shared_mem_bytes: p.shared_mem_bytes,
                stream: p.stream,
                params: p.kernel_params,
                extra: p.extra,
            }
        }
    }
}

/// CUPTI's callback: ignores kreplay's own calls (the re-entry guard), never unwinds.
unsafe extern "C" fn on_callback(
    _userdata: *mut c_void,
    domain: CallbackDomain,
    id: CallbackId,
    data: *const c_void,
) {
    if data.is_null() {
        return;
    }
    let Some(backend) = BACKEND.get() else {
        return;
    };
    let start = Instant::now();
    // kreplay's work runs on the application's thread inside its driver call (replays, the
    // tool's callbacks, file reads): a cancellation of the thread waits for its end, as
    // without kreplay (see `kreplay_wtrack::threads::NoCancel`).
    let _no_cancel = NoCancel::now();
    if domain == CB_DOMAIN_RESOURCE {
        // Bookkeeping only, and also while kreplay itself is in the driver: a module the
        // application launches may be loaded lazily from inside kreplay's own calls at a launch.
        let _timed = backend.stats.timed(
            &backend.stats.module_callbacks,
            &backend.stats.module_ns,
            start,
        );
        contained(
            || {
                // SAFETY: CUPTI passes a CUpti_ResourceData for the resource domain.
                let data = unsafe { &*(data as *const ResourceData) };
                backend.on_resource(id, data)
            },
            || format!("internal error in resource callback {id}"),
        );
        return;
    }
    if domain != CB_DOMAIN_DRIVER_API {
        return;
    }
    if Guard::active() {
        if crate::window::in_replay_callback() && writes_device(id) {
            // A tool's call from its replay callback (kreplay's own calls inside one are told
            // apart by `toolwork`).
            contained(
                || {
                    // SAFETY: CUPTI passes a CUpti_CallbackData for the driver-API domain.
                    let data = unsafe { &*(data as *const CallbackData) };
                    backend.tool_call(id, data)
                },
                || format!("internal error in callback {id} of a tool's call"),
            );
        }
        return;
    }
    let _guard = Guard::enter();
    let _timed = backend
        .stats
        .timed(&backend.stats.callbacks, &backend.stats.callback_ns, start);
    contained(
        || {
            // kreplay's own driver calls (snapshots, shadows, synchronizations, events) must neither
            // fail nor invalidate a capture in progress on another thread: they run in relaxed
            // capture mode, and the application's call gets its own mode back when this returns.
            // The fenced calls (copies, memsets, stream writes, graph launches)
            // make no driver call of their own.
            let _relaxed =
                (fence::device_write(id).is_none()).then(|| backend.driver.relaxed_capture());
            // SAFETY: CUPTI passes a CUpti_CallbackData for the driver-API domain.
            let data = unsafe { &*(data as *const CallbackData) };
            // SAFETY: as above, for callback id `id`.
            unsafe { backend.handle(id, data) }
        },
        || format!("internal error in callback {id}; the call was left alone"),
    );
}

/// Runs `f` (a callback's work) so that a panic never unwinds into CUPTI: one is caught and
/// reported as a warning, `why`.
fn contained(f: impl FnOnce(), why: impl FnOnce() -> String) {
    if catch_unwind(AssertUnwindSafe(f)).is_err() {
        log(LogLevel::Warn, why());
    }
}

unsafe extern "C" {
    fn atexit(f: extern "C" fn()) -> c_int;
}

extern "C" fn print_summary() {
    let _ = catch_unwind(|| {
        if let Some(b) = BACKEND.get() {
            let summary = b.summary();
            // A report rather than a diagnostic: one line on standard error, its own prefix
            // (scripts read it), unless KREPLAY_LOG=off.
            if b.config.log != LogLevel::Off {
                eprintln!("kreplay-cuda: {summary}");
            }
            b.tools.at_exit(&summary);
        }
    });
}

fn initialize(
    make_tools: impl FnOnce(&Config) -> Result<Box<dyn Tools>, String>,
) -> Result<(), String> {
    let start = Instant::now();
    let config = Config::from_env()?;
    let driver = Driver::get_in_init().map_err(|e| e.to_string())?;
    let cupti = Cupti::load()?;
    let tools = make_tools(&config)?;
    let locks = AgentLocks::new();
    locks.set_enabled(tools.replay_wanted());
    let passes = config.passes;
    let drain_timeout = config.drain_timeout;
    let backend = Backend {
        driver,
        config,
        tools,
        watch: MemoryWatch::new(),
        frees: Mutex::new(Vec::new()),
        unmaps: Mutex::new(Vec::new()),
        graphs: GraphMemory::new(),
        inventory: Arc::new(Inventory::new()),
        locks,
        captures: Captures::new(),
        devices: Mutex::new(Vec::new()),
        contexts: Arc::new(Contexts::default()),
        peers: AgentGroups::new(),
        next_dispatch: AtomicU64::new(1),
        stats: Stats::default(),
        warned_graph: AtomicBool::new(false),
        warned_launch: AtomicBool::new(false),
        warned_managed: AtomicBool::new(false),
        warned_surfaces: AtomicBool::new(false),
        modules: ModuleRegistry::new(),
        layouts: Mutex::new(Default::default()),
        warned_layout: AtomicBool::new(false),
        warned_cubin: AtomicBool::new(false),
        watchdog: Watchdog::new(drain_timeout, |what, waited| {
            log(
                LogLevel::Warn,
                format!(
                    "{what} still running after {:.1} s; waiting for it (a running pass is never \
                     abandoned; a kernel that waits for a launch of another thread, or of this \
                     thread after this launch, never ends while the replay holds the device)",
                    waited.as_secs_f64()
                ),
            )
        }),
    };
    if BACKEND.set(backend).is_err() {
        return Err("already initialized".into());
    }
    let mut subscriber: SubscriberHandle = std::ptr::null_mut();
    // SAFETY: subscribes our callback (a plain extern "C" fn that never unwinds) with no user
    // data; CUPTI writes the handle.
    let rc = unsafe { (cupti.subscribe)(&mut subscriber, on_callback, std::ptr::null_mut()) };
    if rc != 0 {
        return Err(format!(
            "cuptiSubscribe failed: {} (another CUPTI client in the process?)",
            cupti.describe(rc)
        ));
    }
    for id in cupti::cbid::all() {
        // SAFETY: a valid subscriber handle, the driver-API domain and a callback id of it.
        let rc = unsafe { (cupti.enable_callback)(1, subscriber, CB_DOMAIN_DRIVER_API, id) };
        if rc != 0 {
            log(
                LogLevel::Warn,
                format!("cuptiEnableCallback({id}) failed: {}", cupti.describe(rc)),
            );
        }
    }
    for id in [
        CBID_RESOURCE_CONTEXT_DESTROY_STARTING,
        CBID_RESOURCE_MODULE_LOADED,
        CBID_RESOURCE_MODULE_UNLOAD_STARTING,
    ] {
        // SAFETY: as above, for the resource domain.
        let rc = unsafe { (cupti.enable_callback)(1, subscriber, CB_DOMAIN_RESOURCE, id) };
        if rc != 0 {
            log(
                LogLevel::Warn,
                format!(
                    "cuptiEnableCallback(resource {id}) failed: {}: no module is reported, so \
                     every launch runs once (untracked_memory)",
                    cupti.describe(rc)
                ),
            );
        }
    }
    let _ = CUPTI.set((cupti, subscriber as usize));
    if let Some(b) = BACKEND.get() {
        let ns = u64::try_from(start.elapsed().as_nanos()).unwrap_or(u64::MAX);
        b.stats.init_ns.store(ns, Ordering::Relaxed);
    }
    // SAFETY: registers a plain extern "C" function that never unwinds.
    unsafe { atexit(print_summary) };
    log(
        LogLevel::Info,
        format!("injected: built-in tool {passes} pass(es) per kernel launch"),
    );
    Ok(())
}

/// What libkreplay's `InitializeInjection` (the entry point CUDA calls in the library named by
/// `CUDA_INJECTION64_PATH`) does: reads the configuration, makes the tool side with
/// `make_tools` (which may refuse), loads CUPTI and subscribes. Returns 1 when kreplay is
/// installed, 0 when it is not (the reason is printed; the application then runs untouched).
pub fn initialize_injection(
    make_tools: impl FnOnce(&Config) -> Result<Box<dyn Tools>, String>,
) -> c_int {
    match catch_unwind(AssertUnwindSafe(|| initialize(make_tools))) {
        Ok(Ok(())) => 1,
        Ok(Err(e)) => {
            eprintln!("kreplay-cuda: not installed: {e}");
            0
        }
        Err(_) => {
            eprintln!("kreplay-cuda: not installed: internal error during initialization");
            0
        }
    }
}

/// The devices an access list of `count` entries at `desc` gives access (see
/// [`cupti::devices_granted`]).
///
/// # Safety
/// `desc` is null or points to `count` `CUmemAccessDesc` entries.
unsafe fn granted(desc: *const cupti::MemAccessDesc, count: usize) -> Vec<u64> {
    // SAFETY: per the caller.
    cupti::granted_devices(&unsafe { access_list(desc, count) })
}

/// Each device an access list of `count` entries at `desc` names, with its flags
/// ([`cupti::device_access`]; empty for a null list).
///
/// # Safety
/// `desc` is null or points to `count` `CUmemAccessDesc` entries.
unsafe fn access_list(desc: *const cupti::MemAccessDesc, count: usize) -> Vec<(u64, i32)> {
    if desc.is_null() || count == 0 {
        return Vec::new();
    }
    // SAFETY: per the caller, `count` entries at `desc`.
    cupti::device_access(unsafe { std::slice::from_raw_parts(desc, count) })
}

/// CUPTI's name of a driver call (`function_name`), or a placeholder.
fn api_name(function: *const std::ffi::c_char) -> String {
    if function.is_null() {
        return "a driver call".to_string();
    }
    // SAFETY: CUPTI's NUL-terminated API name, valid during the callback.
    unsafe { CStr::from_ptr(function) }
        .to_string_lossy()
        .into_owned()
}

/// How a replay window on `device` reads memory around a tool's work (see
/// [`crate::toolwork`]): the drain of the device's contexts, and its snapshotter's captures.
struct DeviceWork {
    device: Arc<DeviceState>,
    /// The launch's context (the drain covers every context of the device).
    ctx: usize,
}

impl ToolWorkIo for DeviceWork {
    fn quiesce(&self) -> Result<(), String> {
        self.device.drainer.drain(self.ctx)
    }
    fn capture(&self, footprint: &Footprint) -> Result<Capture, String> {
        self.device
            .snapshotter
            .capture(footprint)
            .map_err(|e| e.to_string())
    }
    fn changes(&self, since: &Capture) -> Result<Delta, String> {
        self.device
            .snapshotter
            .changes(since)
            .map_err(|e| e.to_string())
    }
    fn written(&self, addr: u64, len: u64) -> Result<Delta, String> {
        self.device
            .snapshotter
            .written(addr, len)
            .map_err(|e| e.to_string())
    }
    fn lost(&self, call: &str, why: &str) {
        if let Some(backend) = BACKEND.get() {
            backend.stats.tool_work_lost.fetch_add(1, Ordering::Relaxed);
        }
        log(
            LogLevel::Warn,
            format!(
                "a tool's {call} from a callback inside a replay window on device {}: the next \
                 restore may undo what it wrote ({why})",
                self.device.ordinal
            ),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::driver::{CuFunction, CuLaunchConfig, CuStream};

    #[test]
    fn shared_memory_another_device_holds_links_it_with_the_opening_contexts_device() {
        // cuIpcOpenMemHandle (with CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS) in a context of device 0
        // of memory device 1 holds: device 0's kernels write device 1's memory, so a replay on
        // either must lock and drain both, as after cuCtxEnablePeerAccess.
        let mut linked = shared_link(Some(0), 1);
        linked.sort_unstable();
        assert_eq!(linked, vec![0, 1]);
        // Held by the context's own device, or the context's device unknown: nothing to link.
        assert!(shared_link(Some(1), 1).len() < 2);
        assert!(shared_link(None, 1).len() < 2);
    }

    #[test]
    fn an_allocation_from_another_devices_pool_belongs_to_that_device() {
        // cuMemAllocFromPoolAsync may take a pool of another device than the stream's: its
        // memory is that device's, snapshotted (and drained) with that device's launches.
        for id in [
            cbid::CU_MEM_ALLOC_FROM_POOL_ASYNC,
            cbid::CU_MEM_ALLOC_FROM_POOL_ASYNC_PTSZ,
        ] {
            assert_eq!(allocation_device(id, Some(0), || Some(1)), Some(1), "{id}");
            // Where the driver does not say, the context's device.
            assert_eq!(allocation_device(id, Some(0), || None), Some(0), "{id}");
        }
        // Every other allocation is its context's device's, without asking the driver.
        for id in [
            cbid::CU_MEM_ALLOC_V2,
            cbid::CU_MEM_ALLOC_PITCH_V2,
            cbid::CU_MEM_ALLOC_ASYNC,
            cbid::CU_MEM_ALLOC_ASYNC_PTSZ,
        ] {
            let asked = std::cell::Cell::new(false);
            let device = allocation_device(id, Some(0), || {
                asked.set(true);
                Some(1)
            });
            assert_eq!((device, asked.get()), (Some(0), false), "{id}");
        }
    }

    #[test]
    fn small_footprints_are_never_sent_to_the_device_to_be_measured() {
        let mut c = DeviceChoice::default();
        for mib in [2u64, 20, 40] {
            let key = ChoiceKey::new(7, mib << 20);
            // Measured with full copies: a key then measures the device, unless it cannot win.
            c.record(key, false, 40_000.0);
            assert!(!device_can_win(mib << 20), "{mib} MiB");
            assert!(!detection_for(&c, key, mib << 20, true), "{mib} MiB");
            assert!(!detection_for(&c, key, mib << 20, false), "{mib} MiB");
        }
        // From about 44 MB the device may win: measured there.
        let key = ChoiceKey::new(7, 60 << 20);
        assert!(device_can_win(60 << 20));
        c.record(key, false, 40_000.0);
        assert!(detection_for(&c, key, 60 << 20, true));
        assert!(!detection_for(&c, key, 60 << 20, false));
        assert!(detection_for(
            &c,
            ChoiceKey::new(8, 1 << 30),
            1 << 30,
            false
        ));
    }

    #[test]
    fn a_launch_auto_sends_to_the_device_is_snapshotted_for_hash_restores() {
        // On the device: hashed at the snapshot, every restore verified; full copies are left
        // to auto, which copies a shadow in full where the device offers no hash.
        assert_eq!(chosen_strategy(true), Some(RestoreStrategy::Hash));
        assert_eq!(chosen_strategy(false), None);
    }

    #[test]
    fn auto_detects_on_the_device_where_the_measured_costs_beat_a_full_copy() {
        assert!(!hash_on_device_for(RestoreStrategy::Auto, 0));
        // Measured on the H200: 64 MiB full 0.043 ms against 0.075 verified; 256 MiB 0.142
        // against 0.103.
        assert!(!hash_on_device_for(RestoreStrategy::Auto, 64 << 20));
        assert!(hash_on_device_for(RestoreStrategy::Auto, 256 << 20));
        assert!(hash_on_device_for(RestoreStrategy::Auto, 1 << 30));
        assert!(hash_on_device_for(RestoreStrategy::Auto, 32 << 30));
        let even = (VERIFIED_RESTORE_COST.fixed_us - FULL_RESTORE_COST.fixed_us)
            / (1.0 / FULL_RESTORE_COST.bytes_per_us - 1.0 / VERIFIED_RESTORE_COST.bytes_per_us);
        assert!((80e6..90e6).contains(&even), "break-even at {even} bytes");
        for s in [
            RestoreStrategy::Full,
            RestoreStrategy::Hash,
            RestoreStrategy::Writeset,
            RestoreStrategy::WritesetUnverified,
        ] {
            assert!(hash_on_device_for(s, 0), "{s}");
        }
    }

    #[test]
    fn launch_parameters_are_decoded_for_both_entry_points_and_their_per_thread_variants() {
        let mut args: [*mut c_void; 1] = [std::ptr::null_mut()];
        let p = LaunchKernelParams {
            f: 0x10 as CuFunction,
            grid: [4, 2, 1],
            block: [128, 1, 1],
            shared_mem_bytes: 64,
            stream: 0x20 as CuStream,
            kernel_params: args.as_mut_ptr(),
            extra: std::ptr::null_mut(),
        };
        let ctx = 0x30 as CuContext;
        for (id, per_thread) in [
            (cbid::CU_LAUNCH_KERNEL, false),
            (cbid::CU_LAUNCH_KERNEL_PTSZ, true),
        ] {
            // SAFETY: a cuLaunchKernel_params for a launch callback id.
            let l = unsafe { decode_launch(id, (&raw const p).cast(), ctx, 2) };
            assert_eq!(l.api, LaunchApi::Kernel);
            assert_eq!(l.per_thread, per_thread);
            assert_eq!(
                (l.grid, l.block, l.shared_mem_bytes),
                ([4, 2, 1], [128, 1, 1], 64)
            );
            assert_eq!(
                (l.function, l.stream, l.params),
                (p.f, p.stream, p.kernel_params)
            );
            assert_eq!((l.ctx, l.device), (ctx, 2));
        }
        let config = CuLaunchConfig {
            grid_dim: [7, 1, 1],
            block_dim: [32, 2, 1],
            shared_mem_bytes: 128,
            stream: 0x40 as CuStream,
            attrs: std::ptr::null_mut(),
            num_attrs: 0,
        };
        let ex = LaunchKernelExParams {
            config: &raw const config,
            f: 0x50 as CuFunction,
            kernel_params: args.as_mut_ptr(),
            extra: std::ptr::null_mut(),
        };
        for (id, per_thread) in [
            (cbid::CU_LAUNCH_KERNEL_EX, false),
            (cbid::CU_LAUNCH_KERNEL_EX_PTSZ, true),
        ] {
            // SAFETY: a cuLaunchKernelEx_params whose config points to a live CUlaunchConfig.
            let l = unsafe { decode_launch(id, (&raw const ex).cast(), ctx, 0) };
            assert_eq!(
                l.api,
                LaunchApi::KernelEx {
                    config: &raw const config
                }
            );
            assert_eq!(l.per_thread, per_thread);
            assert_eq!(
                (l.grid, l.block, l.shared_mem_bytes),
                ([7, 1, 1], [32, 2, 1], 128)
            );
            assert_eq!((l.function, l.stream), (ex.f, config.stream));
        }
    }

    #[test]
    fn cooperative_launches_are_decoded_as_launches_to_replay_not_as_fenced_calls() {
        let mut args: [*mut c_void; 1] = [std::ptr::null_mut()];
        let p = LaunchCooperativeKernelParams {
            f: 0x60 as CuFunction,
            grid: [132, 1, 1],
            block: [256, 1, 1],
            shared_mem_bytes: 512,
            stream: 0x70 as CuStream,
            kernel_params: args.as_mut_ptr(),
        };
        let ctx = 0x30 as CuContext;
        for (id, per_thread) in [
            (cbid::CU_LAUNCH_COOPERATIVE_KERNEL, false),
            (cbid::CU_LAUNCH_COOPERATIVE_KERNEL_PTSZ, true),
        ] {
            assert!(cbid::LAUNCHES.contains(&id), "{id} is not a launch");
            assert!(cbid::SUBSCRIBED.contains(&id), "{id} is not subscribed");
            assert_eq!(
                fence::device_write(id),
                None,
                "{id} is fenced, not replayed"
            );
            // SAFETY: a cuLaunchCooperativeKernel_params for a cooperative launch id.
            let l = unsafe { decode_launch(id, (&raw const p).cast(), ctx, 1) };
            assert_eq!(l.api, LaunchApi::Cooperative);
            assert_eq!(l.per_thread, per_thread);
            assert_eq!(
                (l.grid, l.block, l.shared_mem_bytes),
                ([132, 1, 1], [256, 1, 1], 512)
            );
            assert_eq!(
                (l.function, l.stream, l.params, l.extra),
                (p.f, p.stream, p.kernel_params, std::ptr::null_mut())
            );
            assert_eq!((l.ctx, l.device), (ctx, 1));
        }
    }

    /// The stream of a stream-ordered allocation is what tells a captured one (an allocation
    /// node, no memory behind it) from an ordinary one; a plain allocation has none.
    #[test]
    fn the_stream_of_an_asynchronous_allocation_is_read_for_each_entry_point() {
        let mut dptr: u64 = 0;
        let alloc = MemAllocAsyncParams {
            dptr: &raw mut dptr,
            bytesize: 64,
            stream: 0x20 as CuStream,
        };
        let pool = MemAllocFromPoolAsyncParams {
            dptr: &raw mut dptr,
            bytesize: 64,
            pool: 0x30 as *mut c_void,
            stream: 0x40 as CuStream,
        };
        // SAFETY: each a parameter struct of the id it is read as (none for cuMemAlloc_v2).
        unsafe {
            let p = (&raw const alloc).cast();
            let q = (&raw const pool).cast();
            assert_eq!(
                async_stream(cbid::CU_MEM_ALLOC_ASYNC, p),
                Some((alloc.stream, false))
            );
            assert_eq!(
                async_stream(cbid::CU_MEM_ALLOC_ASYNC_PTSZ, p),
                Some((alloc.stream, true))
            );
            assert_eq!(
                async_stream(cbid::CU_MEM_ALLOC_FROM_POOL_ASYNC, q),
                Some((pool.stream, false))
            );
            assert_eq!(
                async_stream(cbid::CU_MEM_ALLOC_FROM_POOL_ASYNC_PTSZ, q),
                Some((pool.stream, true))
            );
            assert_eq!(async_stream(cbid::CU_MEM_ALLOC_V2, p), None);
        }
    }

    #[test]
    fn the_built_in_tool_asks_for_the_configured_passes() {
        let tool = BuiltIn { passes: 38 }
            .replay_tool()
            .expect("38 passes replay");
        let answer = { tool }.config_enter(&kreplay_passloop::DispatchInfo::default());
        assert_eq!(answer, kreplay_passloop::ToolAnswer::passes(38));
        assert!(
            BuiltIn { passes: 1 }.replay_tool().is_none(),
            "one pass is no replay"
        );
    }
    #[test]
    fn the_summary_reports_interception_time_apart_from_the_replays() {
        let summary = Summary {
            callbacks: 12,
            callback_ns: 5_000_000,
            replay_ns: 3_000_000,
            module_callbacks: 4,
            module_ns: 250_000,
            init_ns: 1_500_000,
            ..Summary::default()
        };
        let line = summary.to_string();
        for part in [
            " callbacks=12 ",
            " callback_ms=5.000 ",
            " intercept_ms=2.000 ",
            " module_callbacks=4 ",
            " module_ms=0.250 ",
            " init_ms=1.500",
        ] {
            assert!(line.contains(part), "{part:?} in {line}");
        }
    }

    #[test]
    fn a_timed_callback_is_counted_and_its_time_added_when_it_ends() {
        let stats = Stats::default();
        let start = Instant::now() - Duration::from_millis(2);
        {
            let _t = stats.timed(&stats.callbacks, &stats.callback_ns, start);
            assert_eq!(stats.callbacks.load(Ordering::Relaxed), 1);
            assert_eq!(
                stats.callback_ns.load(Ordering::Relaxed),
                0,
                "added at the end"
            );
        }
        assert!(stats.callback_ns.load(Ordering::Relaxed) >= 2_000_000);
    }
}
