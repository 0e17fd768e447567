//! Injection into unmodified CUDA applications: the CUPTI driver-API callback, allocation
//! tracking, copy fencing and the replay of every launch through a tool.
//!
//! libkreplay (the library named by `CUDA_INJECTION64_PATH`) exports `InitializeInjection`, which
//! the driver calls during `cuInit`; it calls [`initialize_injection`] with its [`Tools`]: the
//! tools configured through the C ABI (`kreplay.h`), or the built-in tool that replays every
//! launch N times ([`BuiltIn`], `KREPLAY_PASSES`). kreplay then subscribes to CUPTI's driver-API
//! callbacks for allocations, frees, virtual-memory mappings, copies, memsets and launches, and
//! at exit prints a summary on standard error and hands the totals to the tools.

mod calls;
mod launch;
mod summary;

use summary::Stats;
pub use summary::Summary;

use kreplay_late::Late;
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
use crate::choice::{
    ChoiceKey, DeviceChoice, chosen_strategy, detection_for, hash_on_device_for, per_restore_ns,
};
use crate::config::{Config, LogLevel};
use crate::contexts::{Contexts, FreedIn, SyncError};
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
use crate::graphmem::{
    CU_GRAPH_NODE_TYPE_MEM_ALLOC, ExecDestroyed, GraphAlloc, GraphFreed, GraphMemory, Place,
};
use crate::guard::Guard;
use crate::launch::{CudaLaunch, Launch, LaunchApi};
use crate::memory::{CudaMemory, MemoryTimes};
use crate::scope::{ArgumentsUnknown, Param, argument_values, launch_filter, untracked_at};
use crate::timing::PassTimer;
use crate::toolwork::{self, Before, Target, ToolWorkIo};
use crate::tracking::{
    Forgotten, GraphicsUnmapped, InFlight, MemoryWatch, Removal, SurfaceDestroyed, UnmapUndo,
};
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

struct Backend {
    driver: &'static Driver,
    config: Config,
    tools: Box<dyn Tools>,
    watch: MemoryWatch,
    /// What the API ENTER of each free in progress forgot, and the context its allocation was
    /// noted in: put back at the API EXIT of a free that failed.
    frees: InFlight<(Freed, Option<FreedIn>)>,
    /// What the API ENTER of each `cuMemUnmap` in progress changed (by its address): put back
    /// at the API EXIT of one that failed.
    unmaps: InFlight<UnmapUndo>,
    /// What the API ENTER of each `cuGraphExecDestroy` in progress forgot (by its executable
    /// graph): put back at the API EXIT of one the driver refused.
    exec_destroys: InFlight<Option<ExecDestroyed>>,
    /// The same for each `cuSurfObjectDestroy` in progress (by its surface object).
    surface_destroys: InFlight<Option<SurfaceDestroyed>>,
    /// The same for each `cuGraphicsUnmapResources` in progress (by each resource it names),
    /// with the context each ended pointer was noted in.
    graphics_unmaps: InFlight<(GraphicsUnmapped, Vec<Owner>)>,
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
    /// The wait, bounded by the drain timeout, for the kernel of a launch whose device could
    /// not be told (see `settle_unknown_device`).
    unknown_drainer: Drainer,
}

/// An allocation's base and the context it was noted in ([`Contexts::note_allocation`]), as
/// the API ENTER of its end found it.
type Owner = (u64, Option<FreedIn>);

/// What the API ENTER of a free forgot ([`Backend::on_app_free`]), to put back at its API
/// EXIT should the driver refuse the free.
#[derive(Debug)]
enum Freed {
    /// Memory of the watch or the inventory.
    Tracked(Forgotten),
    /// A backed graph allocation.
    Graph(GraphFreed),
}

impl Removal for Freed {
    fn removed_nothing(&self) -> bool {
        match self {
            Freed::Tracked(forgotten) => forgotten.removed_nothing(),
            Freed::Graph(_) => false,
        }
    }
}

/// The device ordinal of a launch whose context's device cannot be told (`cuCtxGetDevice`
/// failed inside its callback): its `DispatchInfo::agent_id` is `u64::MAX`, and it is never
/// replayed.
const UNKNOWN_DEVICE: i32 = -1;

static BACKEND: OnceLock<Backend> = OnceLock::new();
static CUPTI: OnceLock<(Cupti, usize)> = OnceLock::new();

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
        // And the wait for a launch of unknown device, which may be synchronising it.
        let drainers = drainers
            .iter()
            .map(|d| &d.drainer)
            .chain([&self.unknown_drainer]);
        for drainer in drainers {
            if !drainer.wait_idle(Instant::now() + drainer.timeout()) {
                log(
                    LogLevel::Warn,
                    format!(
                        "context {key:#x} is destroyed while a drain of its device still runs \
                         after {:?}",
                        drainer.timeout()
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
            // Managed memory ends with its context too, and with it the declines it caused;
            // shared memory opened there, with every reference to it.
            self.watch.end_references(base);
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
        let all = if described && current.is_some() {
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
        let launch = unsafe { decode_launch(id, data.function_params, std::ptr::null_mut(), 0) }?;
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

    /// The application's allocation at `base` ended (freed, or with its context): a backed
    /// graph allocation leaves the graph bookkeeping, a managed allocation the watch, any other
    /// the inventory. Returns what the API ENTER of a free forgot, to put back if it fails.
    fn on_app_free(&self, base: u64) -> Freed {
        if let Some(freed) = self.graphs.free_enter(&self.inventory, base) {
            self.stats.frees.fetch_add(1, Ordering::Relaxed);
            log(
                LogLevel::Debug,
                format!("graph allocation at {base:#x} freed"),
            );
            return Freed::Graph(freed);
        }
        let forgotten = self.watch.free_enter(Some(&self.inventory), base);
        if forgotten.allocation.is_some() {
            self.stats.frees.fetch_add(1, Ordering::Relaxed);
            log(LogLevel::Debug, format!("free at {base:#x}"));
        }
        Freed::Tracked(forgotten)
    }

    /// The API EXIT of a free whose ENTER forgot the memory at `base`: a free that failed left
    /// the memory live, and it is tracked again as it was.
    fn free_exit(&self, base: u64, result: CuResult) {
        let exited = self.frees.exit(base, result == CUDA_SUCCESS);
        for (forgotten, owner) in exited.back {
            if let Some(owner) = &owner
                && self.contexts.ended_since(owner)
            {
                // Its context ended meanwhile (another thread's cuCtxDestroy or
                // cudaDeviceReset), and the memory with it: nothing is live to put back.
                log(
                    LogLevel::Debug,
                    format!("free at {base:#x} failed ({result}) after its context ended"),
                );
                continue;
            }
            let owner = owner.map(|o| o.ctx);
            let back = match forgotten {
                Freed::Tracked(forgotten) => self.watch.free_failed(&self.inventory, forgotten),
                Freed::Graph(freed) => self.graphs.free_failed(&self.inventory, freed),
            };
            if back {
                if let Some(ctx) = owner {
                    self.contexts.note_allocation(ctx, base);
                }
                log(
                    LogLevel::Debug,
                    format!("free at {base:#x} failed ({result}): its memory is tracked again"),
                );
            }
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

    /// A reference to shared memory at `base` ended (closed or unmapped): the memory ends with
    /// its last one.
    fn on_shared_end(&self, base: u64) {
        if self.watch.on_shared_end(base) {
            self.contexts.note_free(base);
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

/// The launch a launch callback describes; `None` for a `cuLaunchKernelEx` given no
/// configuration (the driver refuses it; nothing is submitted).
///
/// # Safety
/// `params` is the parameter struct of driver-API callback `id` (one of [`cbid::LAUNCHES`]).
unsafe fn decode_launch(
    id: CallbackId,
    params: *const c_void,
    ctx: CuContext,
    device: i32,
) -> Option<Launch> {
    let per_thread = matches!(
        id,
        cbid::CU_LAUNCH_KERNEL_PTSZ
            | cbid::CU_LAUNCH_KERNEL_EX_PTSZ
            | cbid::CU_LAUNCH_COOPERATIVE_KERNEL_PTSZ
    );
    Some(match id {
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
            // SAFETY: cuLaunchKernelEx_params, whose config is null or points to the caller's
            // CUlaunchConfig, alive during the call.
            let (p, c) = unsafe {
                let p = *(params as *const LaunchKernelExParams);
                (p, *p.config.as_ref()?)
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
    })
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
    let contexts = Arc::new(Contexts::default());
    let backend = Backend {
        driver,
        config,
        tools,
        watch: MemoryWatch::new(),
        frees: InFlight::new(),
        unmaps: InFlight::new(),
        exec_destroys: InFlight::new(),
        surface_destroys: InFlight::new(),
        graphics_unmaps: InFlight::new(),
        graphs: GraphMemory::new(),
        inventory: Arc::new(Inventory::new()),
        locks,
        captures: Captures::new(),
        devices: Mutex::new(Vec::new()),
        unknown_drainer: context_drainer(driver, drain_timeout, contexts.clone()),
        contexts,
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
    fn written(&self, footprint: &Footprint, addr: u64, len: u64) -> Result<Delta, String> {
        self.device
            .snapshotter
            .written_within(footprint, addr, len)
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
            let l = unsafe { decode_launch(id, (&raw const p).cast(), ctx, 2) }.expect("decoded");
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
            let l = unsafe { decode_launch(id, (&raw const ex).cast(), ctx, 0) }.expect("decoded");
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

    /// `cuLaunchKernelEx(NULL, f, ...)` is refused by the driver (an error code the application
    /// sees); reading the missing configuration at API ENTER would crash the application in
    /// kreplay's callback instead.
    #[test]
    fn a_launch_ex_without_a_configuration_is_left_to_the_driver_to_refuse() {
        let mut args: [*mut c_void; 1] = [std::ptr::null_mut()];
        let ex = LaunchKernelExParams {
            config: std::ptr::null(),
            f: 0x50 as CuFunction,
            kernel_params: args.as_mut_ptr(),
            extra: std::ptr::null_mut(),
        };
        for id in [cbid::CU_LAUNCH_KERNEL_EX, cbid::CU_LAUNCH_KERNEL_EX_PTSZ] {
            // SAFETY: a cuLaunchKernelEx_params whose config is null, as an application may pass.
            let l = unsafe { decode_launch(id, (&raw const ex).cast(), std::ptr::null_mut(), 0) };
            assert!(
                l.is_none(),
                "{id}: decoded a launch without a configuration"
            );
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
            let l = unsafe { decode_launch(id, (&raw const p).cast(), ctx, 1) }.expect("decoded");
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
}
