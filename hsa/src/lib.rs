//! The HSA backend of kreplay.
//!
//! Given the `HsaApiTable` a tools library receives in `OnLoad` (from the real ROCm runtime or
//! from `kreplay-softhsa`), [`install`] first checks which ROCm release laid the table out
//! ([`check_table`]: majors and sizes; see `docs/rocm.md`), keeps a copy of the runtime's own
//! entries for kreplay's calls and writes wrappers into the table, each at its offset in that
//! release's order and only where the runtime's table has the entry:
//!
//! - `hsa_amd_memory_pool_allocate/free`, `hsa_memory_allocate/free`, `hsa_amd_memory_lock`
//!   (and `_to_pool`, `unlock`), IPC and interop mappings, `hsa_amd_vmem_*` mappings and the ring
//!   buffers of soft queues (`hsa_soft_queue_create`) feed the snapshot inventory (owner agent and kind from `hsa_amd_pointer_info`, or from the pool of a
//!   virtual memory handle);
//! - `hsa_queue_create/destroy`: application queues become intercept queues whose packets reach
//!   kreplay's handler; a single kernel dispatch with a replay service configured runs through
//!   the pass loop (writer lock on the agent, drain of every queue on the agent and its async
//!   copies, snapshot, passes with kreplay's own completion signal, restores, the application's
//!   completion fired once); a multi-packet batch is forwarded unchanged in one piece, each of
//!   its dispatches declined as `batch_or_graph`; anything else is forwarded unchanged;
//! - every runtime write path (`hsa_amd_memory_async_copy`, `_on_engine`, `_rect`,
//!   `hsa_memory_copy`, `hsa_amd_memory_fill`, and the image extension's `hsa_ext_image_import`,
//!   `_copy`, `_clear` and `_export`) is serialized against replays on the agents it touches, the
//!   asynchronous ones counted until their completion signal fires (docs/abi.md §3 rule 9).
//! - `hsa_code_object_reader_create_from_memory`/`_from_file` and the executable loads: the
//!   code objects' metadata says which kernels may print, call the host or use the device heap,
//!   and their dispatches are declined (`untracked_memory`) instead of replayed.
//!
//! The tool side (which contexts exist, the replay callbacks, dispatch records) is reached
//! through [`ToolHooks`], implemented by the C ABI crate. The replay service may be configured
//! after installation: ordinary dispatches and copies start waiting for replay windows from the
//! first one that sees it configured. A panic inside kreplay never reaches the runtime, and the
//! application's dispatch still runs (or its completion still fires) exactly once. After
//! [`finalize`] every wrapper passes straight through.
//!
//! Installing into a copy of softhsa's table (what the runtime hands a tools library in
//! `OnLoad`) and allocating through it, as the application would:
//!
//! ```
//! use std::sync::Arc;
//! use kreplay_softhsa::{OwnedApiTable, testing::Hsa};
//! # use kreplay_ctxmask::ContextRegistry;
//! # use kreplay_hsa::{DispatchRecord, ToolHooks};
//! # use kreplay_passloop::{DispatchInfo, ReplayRecord, ReplayTool, ToolAnswer};
//! # struct NoServices(ContextRegistry);
//! # struct Once;
//! # impl ReplayTool for Once {
//! #     fn config_enter(&mut self, _: &DispatchInfo) -> ToolAnswer { ToolAnswer::OPT_OUT }
//! #     fn pass_enter(&mut self, _: &DispatchInfo, _: u64, _: u64) {}
//! #     fn pass_exit(&mut self, _: &DispatchInfo, _: u64, _: u64) -> kreplay_passloop::ContinueChange {
//! #         kreplay_passloop::ContinueChange::Keep
//! #     }
//! #     fn should_continue(&mut self, _: &DispatchInfo, _: u64, _: u64) -> bool { false }
//! #     fn snapshot(&mut self, _: &DispatchInfo, _: kreplay_passloop::Phase, _: &kreplay_passloop::MemoryOpReport) {}
//! #     fn restore(&mut self, _: &DispatchInfo, _: kreplay_passloop::Phase,
//! #                _: &kreplay_passloop::RestoreRequest, _: &kreplay_passloop::MemoryOpReport) {}
//! #     fn config_exit(&mut self, _: &DispatchInfo, _: &kreplay_passloop::ReplayOutcome) {}
//! # }
//! # impl ToolHooks for NoServices {
//! #     fn replay_configured(&self) -> bool { false }
//! #     fn dispatch_tracing_configured(&self) -> bool { false }
//! #     fn replay_tool(&self) -> Box<dyn ReplayTool + '_> { Box::new(Once) }
//! #     fn contexts(&self) -> &ContextRegistry { &self.0 }
//! #     fn dispatch_completed(&self, _: &DispatchRecord) {}
//! #     fn replay_finished(&self, _: &ReplayRecord) {}
//! #     fn warn(&self, _: &str) {}
//! #     fn warn_once(&self, _: &'static str, _: &str) {}
//! # }
//! let mut table = OwnedApiTable::softhsa();
//! // SAFETY: the copy's sub-tables are valid for as long as `table` lives.
//! let runtime = unsafe { Hsa::from_table(table.table()) };
//! let _session = runtime.init().unwrap();
//! let tool = Arc::new(NoServices(ContextRegistry::new())); // the C ABI layer, in a real tool
//!
//! // SAFETY: the table is valid, ours to modify, and outlives every call made through it.
//! unsafe { kreplay_hsa::install(table.as_mut_ptr(), tool, Default::default()) }.unwrap();
//!
//! // The application calls through the modified table: its device allocations are tracked.
//! // SAFETY: as above.
//! let app = unsafe { Hsa::from_table(table.table()) };
//! let gpu = app.gpu_agents().unwrap()[0];
//! let buffer = app.allocate(app.coarse_pool(gpu).unwrap(), 4096).unwrap();
//! assert_eq!(kreplay_hsa::tracked_kind(buffer as u64), Some(kreplay_snapshot::MemoryKind::CoarseDevice));
//! app.free(buffer).unwrap();
//! assert_eq!(kreplay_hsa::tracked_kind(buffer as u64), None);
//! ```

mod backend;
mod cancel;
mod copies;
mod counting;
mod devruntime;
mod dispatch;
mod fold;
mod fork;
mod images;
mod layout;
mod memory;
mod original;
mod peers;
mod queues;
mod reach;
mod replay;
mod signals;
mod soft_queues;
mod svm;
mod vmem;
mod waits;
mod watcher;

pub use counting::{CounterDesc, CountingError, agent_counters, check_counters};
pub use layout::{AmdOrder, TableShape, Version};

use std::fmt;
use std::sync::Arc;

use kreplay_ctxmask::ContextRegistry;
use kreplay_drain::DrainConfig;
use kreplay_passloop::{DispatchInfo, ReplayRecord, ReplayTool};
use kreplay_snapshot::SnapshotConfig;

/// One executed kernel: an ordinary dispatch (`pass == None`) or one pass of a replay.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DispatchRecord {
    /// The dispatch (the same `dispatch_id` for every pass of one replay).
    pub info: DispatchInfo,
    /// The pass index when replayed.
    pub pass: Option<u64>,
    /// Start of execution in nanoseconds of the runtime's system clock (0 when it gave none).
    pub start_ns: u64,
    /// End of execution in nanoseconds of the runtime's system clock (0 when it gave none).
    pub end_ns: u64,
}

/// What the backend needs from the tool layer.
pub trait ToolHooks: Send + Sync + 'static {
    /// Whether a KERNEL_REPLAY service is configured (asked on every dispatch: keep it cheap).
    fn replay_configured(&self) -> bool;
    /// Whether any KERNEL_DISPATCH tracing service is configured (cheap as well).
    fn dispatch_tracing_configured(&self) -> bool;
    /// The replay tool adapter for one dispatch.
    fn replay_tool(&self) -> Box<dyn ReplayTool + '_>;
    /// Contexts whose replay mask the loop installs.
    fn contexts(&self) -> &ContextRegistry;
    /// A kernel finished (ordinary, or one pass). Called on the replay loop's thread for passes
    /// (so the pass's context mask applies) and on a runtime handler thread otherwise.
    fn dispatch_completed(&self, record: &DispatchRecord);
    /// KERNEL_DISPATCH ENQUEUE: `submit` writes `infos` (one pass `pass` of a replay, or
    /// ordinary dispatches) to the hardware queue; a tool layer announces them before (ENTER)
    /// and after (EXIT) calling it. Called only while dispatch tracing is configured, on the
    /// thread submitting (the pass's mask applies). The default just submits.
    fn dispatch_enqueue(
        &self,
        infos: &[DispatchInfo],
        pass: Option<u64>,
        submit: &mut dyn FnMut(),
    ) {
        let _ = (infos, pass);
        submit();
    }
    /// Whether a dispatch counting service is configured (asked on every dispatch: cheap).
    fn counting_configured(&self) -> bool {
        false
    }
    /// The counters `info` (pass `pass` of a replay, or an ordinary dispatch) counts, decided
    /// now, on the submitting thread (the pass's mask applies). `None`: nothing is counted.
    fn dispatch_counters(&self, info: &DispatchInfo, pass: Option<u64>) -> Option<Vec<u32>> {
        let _ = (info, pass);
        None
    }
    /// What a dispatch programmed by [`dispatch_counters`](Self::dispatch_counters) counted,
    /// `values[i]` for `ids[i]`, once its kernel has completed.
    fn counters_collected(
        &self,
        info: &DispatchInfo,
        pass: Option<u64>,
        ids: &[u32],
        values: &[f64],
    ) {
        let _ = (info, pass, ids, values);
    }
    /// A dispatch went through the replay loop (cost record and outcome).
    fn replay_finished(&self, record: &ReplayRecord);
    /// The name of the kernel behind a kernel object, where the tool layer knows it (warnings
    /// then name the kernel instead of its object). The default knows none.
    fn kernel_name(&self, kernel_object: u64) -> Option<String> {
        let _ = kernel_object;
        None
    }
    /// A warning for the user.
    fn warn(&self, message: &str);
    /// A warning printed once per `key` for the life of the process.
    fn warn_once(&self, key: &'static str, message: &str);
}

/// Settings of the backend (the C ABI layer fills them from the environment).
#[derive(Clone, Debug, Default)]
pub struct InstallOptions {
    /// Snapshot budget, store tier and restore strategy.
    pub snapshot: SnapshotConfig,
    /// Drain and pass deadlines.
    pub drain: DrainConfig,
    /// Skip every restore between passes. Only for demonstrating what replay without restore
    /// does to an application's results (`kreplay demo --no-restore`); never in a real tool.
    pub skip_restore: bool,
    /// Copy device memory only through the runtime's copy API (`hsa_memory_copy`, batched
    /// `hsa_amd_memory_async_copy`), even on the software runtime where the CPU could touch it
    /// directly: the path a discrete GPU takes, so it can be exercised without one.
    pub force_runtime_copies: bool,
}

/// Why [`install`] failed; the table is left unchanged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InstallError {
    /// kreplay is already installed in this process.
    AlreadyInstalled,
    /// The table is unusable (null, or an entry kreplay needs is missing).
    Table(String),
    /// The snapshot configuration is invalid.
    Config(String),
}

impl fmt::Display for InstallError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            InstallError::AlreadyInstalled => {
                f.write_str("kreplay is already installed into an HSA table in this process")
            }
            InstallError::Table(why) => write!(f, "cannot install into the HSA table: {why}"),
            InstallError::Config(why) => write!(f, "invalid snapshot configuration: {why}"),
        }
    }
}

impl std::error::Error for InstallError {}

/// Installs kreplay's wrappers into `table` (once per process).
///
/// # Safety
/// `table` must point to a valid `HsaApiTable` whose core and AMD extension tables are valid and
/// may be modified, and which outlives every call made through it (the `OnLoad` contract).
pub unsafe fn install(
    table: *mut hsa_sys::HsaApiTable,
    hooks: Arc<dyn ToolHooks>,
    options: InstallOptions,
) -> Result<(), InstallError> {
    // SAFETY: forwarded from the caller.
    unsafe { backend::install(table, hooks, options) }
}

/// Checks that `table` is one [`install`] can use, without changing anything, so a tools library
/// can refuse a bad table before it initializes any tool: not null, the shape of a runtime
/// kreplay supports (majors and sizes of the root, core and AMD extension tables; see
/// `docs/rocm.md`), and every entry kreplay needs provided. Returns the shape.
///
/// # Safety
/// `table` is null or points to a readable `HsaApiTable` whose `core_` and `amd_ext_` are null or
/// point to tables at least as long as their `minor_id` says (what a runtime hands `OnLoad`).
pub unsafe fn check_table(table: *const hsa_sys::HsaApiTable) -> Result<TableShape, InstallError> {
    // SAFETY: forwarded from the caller; capturing only reads the tables.
    unsafe { original::Original::capture(table) }
        .map(|original| *original.shape())
        .map_err(InstallError::Table)
}

/// Stops replaying: from now on every wrapper passes straight through (docs/abi.md §3 rule 4).
pub fn finalize() {
    backend::finalize();
}

/// Waits, at most `limit`, until the KERNEL_DISPATCH COMPLETE records and counters held back
/// behind ENQUEUE EXIT callbacks (of kernels that finished while those ran) reached the tool
/// layer: for `OnUnload`, after [`finalize`] and before the tools' contexts are stopped, so that
/// a kernel the application saw complete is not left without its COMPLETE. False when some were
/// still held at `limit` (an ENQUEUE callback of another thread had not returned).
pub fn deliver_held_completions(limit: std::time::Duration) -> bool {
    dispatch::deliver_held(limit)
}

/// Whether [`install`] succeeded in this process.
pub fn is_installed() -> bool {
    backend::installed().is_some()
}

/// How many `hsa_queue_destroy` calls are waiting now for a handler call of their queue still
/// in progress (a replay of one of its dispatches): for tests that hold a replay.
#[doc(hidden)]
pub fn queue_destroys_waiting() -> usize {
    queues::destroys_waiting()
}

/// Number of allocations the inventory tracks now (0 before installation).
pub fn tracked_allocations() -> usize {
    backend::installed().map_or(0, |b| b.inventory.len())
}

/// The kind kreplay recorded for the allocation containing `addr`, if it tracks one.
pub fn tracked_kind(addr: u64) -> Option<kreplay_snapshot::MemoryKind> {
    backend::installed()
        .and_then(|b| b.inventory.lookup(addr))
        .map(|a| a.kind)
}

/// The owner agent kreplay recorded for the allocation containing `addr`, if it tracks one.
pub fn tracked_owner(addr: u64) -> Option<u64> {
    backend::installed()
        .and_then(|b| b.inventory.lookup(addr))
        .map(|a| a.owner_agent)
}

/// The agents a replay on `agent` takes and drains together, in handle order: `agent` and every
/// agent linked to it by peer-access grants (see ARCHITECTURE.md, "Concurrency").
pub fn replay_group(agent: u64) -> Vec<u64> {
    backend::installed().map_or_else(|| vec![agent], |b| b.peers.group(agent))
}

/// For a virtual memory mapping (`hsa_amd_vmem_map`) containing `addr`: the agents it was made
/// accessible to with `hsa_amd_vmem_set_access`, each with its `hsa_access_permission_t`.
pub fn tracked_access(addr: u64) -> Option<Vec<(u64, u32)>> {
    vmem::access(addr)
}
