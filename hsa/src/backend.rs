//! The installed backend: process-global state behind the `extern "C"` wrappers.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use hsa_sys::layouts::AmdExtTableV2;
use hsa_sys::*;
use kreplay_drain::DrainConfig;
use kreplay_locks::AgentLocks;
use kreplay_snapshot::{Inventory, Snapshotter};

use crate::copies::CopyTracker;
use crate::original::Original;
use crate::queues::QueueRegistry;
use crate::{InstallError, InstallOptions, ToolHooks};

pub(crate) struct Backend {
    pub(crate) original: Original,
    pub(crate) inventory: Arc<Inventory>,
    pub(crate) snapshotter: Snapshotter,
    pub(crate) locks: AgentLocks,
    pub(crate) queues: QueueRegistry,
    pub(crate) copies: CopyTracker,
    /// kreplay's thread for the completions it forwards (`crate::watcher`).
    pub(crate) watcher: crate::watcher::Watcher,
    /// Open replays that re-entrant work must not be erased from (`crate::fold`).
    pub(crate) windows: crate::fold::Windows,
    /// Ring buffers of soft queues.
    pub(crate) soft_queues: crate::soft_queues::SoftQueues,
    /// The runtime's image entries and the images created (`crate::images`).
    pub(crate) images: crate::images::Images,
    /// The application's live signals (`crate::signals`).
    pub(crate) signals: crate::signals::Signals,
    /// Virtual memory handles and mappings (`hsa_amd_vmem_*`).
    pub(crate) vmem: crate::vmem::VmemTracker,
    /// Host ranges made accessible to agents as shared virtual memory (`crate::svm`).
    pub(crate) svm: crate::svm::SvmRanges,
    /// Agents linked by peer-access grants, replayed as one group (`crate::peers`).
    pub(crate) peers: crate::peers::Peers,
    pub(crate) hooks: Arc<dyn ToolHooks>,
    pub(crate) drain: DrainConfig,
    /// See [`InstallOptions::skip_restore`].
    pub(crate) skip_restore: bool,
    /// The snapshot store tier is chosen automatically (not forced by configuration).
    pub(crate) auto_store: bool,
    /// See [`InstallOptions::force_runtime_copies`].
    pub(crate) force_runtime_copies: bool,
    /// Host ranges locked for the agents (snapshot stores): (host address, length, the address
    /// agents use).
    pub(crate) locked_host: parking_lot::Mutex<Vec<(usize, usize, usize)>>,
    /// The CPU agent, looked up on first use.
    pub(crate) cpu_agent: OnceLock<Option<hsa_agent_t>>,
    /// Every GPU agent of the system, ascending, looked up at installation (see
    /// [`Backend::gpus`]).
    gpus: Vec<u64>,
    /// Signal-wait timeouts are in timestamp ticks; this converts.
    pub(crate) ticks_per_second: u64,
    /// Agents reach any host memory of the process (SVM accessible by default, XNACK on): a
    /// kernel argument that is an address mapped in the process may be written by the kernel.
    pub(crate) svm_by_default: bool,
    /// Per agent: see [`Backend::host_visible_device_memory`].
    host_visible: parking_lot::Mutex<std::collections::HashMap<u64, bool>>,
    finalized: AtomicBool,
    next_dispatch_id: AtomicU64,
}

static BACKEND: OnceLock<Backend> = OnceLock::new();

/// Vendor name the software HSA runtime (kreplay-softhsa) reports for its agents, whose device
/// memory is host memory.
pub(crate) const SOFTWARE_RUNTIME_VENDOR: &str = "kreplay";

/// The installed backend. Only the wrappers call this, and they exist only after installation.
pub(crate) fn backend() -> &'static Backend {
    BACKEND
        .get()
        .expect("kreplay's HSA wrappers run only after installation")
}

pub(crate) fn installed() -> Option<&'static Backend> {
    BACKEND.get()
}

/// Runs a wrapper body; a panic becomes `HSA_STATUS_ERROR` instead of crossing into C.
pub(crate) fn guarded(f: impl FnOnce() -> hsa_status_t) -> hsa_status_t {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(status) => status,
        Err(_) => {
            log::error!("internal error in an HSA wrapper; the call failed with HSA_STATUS_ERROR");
            HSA_STATUS_ERROR
        }
    }
}

impl Backend {
    /// Every GPU agent of the system (handles, ascending): the agents whose kernels may write
    /// memory the CPU owns. The runtime's agents do not change while it runs. Looked up at
    /// installation, not on first use: a one-time lookup another thread of the parent was
    /// inside at a `fork` would never end in the child, whose next module unload or fenced call
    /// would wait for it for good.
    pub(crate) fn gpus(&self) -> &[u64] {
        &self.gpus
    }

    pub(crate) fn is_finalized(&self) -> bool {
        self.finalized.load(Ordering::Acquire)
    }

    /// Finalized while a replay that began before is still running (its writer side is held):
    /// work submitted now waits for it to end.
    pub(crate) fn finalized_with_open_replays(&self) -> bool {
        self.is_finalized() && self.locks.is_enabled() && self.locks.any_write_locked()
    }

    /// Whether dispatches and copies go through replay handling now: a replay service is
    /// configured and kreplay is not finalized.
    ///
    /// A tool may configure its replay service after installation (its initialization can run
    /// after `OnLoad`), so the agents' reader side is switched on here, the first time the
    /// service is seen, rather than only at installation; without it ordinary dispatches and
    /// async copies would not wait for replay windows (docs/abi.md §3 rules 1 and 9).
    pub(crate) fn replay_active(&self) -> bool {
        if self.is_finalized() || !self.hooks.replay_configured() {
            return false;
        }
        if !self.locks.is_enabled() {
            self.locks.set_enabled(true);
            if self.is_finalized() {
                // Lost a race with `finalize`: nothing is replayed from now on (the reader side
                // on is harmless: no writer comes any more).
                return false;
            }
        }
        true
    }

    /// Whether the CPU may read and write `agent`'s device memory directly at the address the
    /// runtime reports as `hostBaseAddress`. Only the software runtime (vendor
    /// [`SOFTWARE_RUNTIME_VENDOR`]) guarantees that for coarse-grained memory; on a real GPU the
    /// snapshot goes through the runtime's copies instead. Cached per agent.
    pub(crate) fn host_visible_device_memory(&self, agent: hsa_agent_t) -> bool {
        if self.force_runtime_copies {
            return false;
        }
        if let Some(&visible) = self.host_visible.lock().get(&agent.handle) {
            return visible;
        }
        let visible = self.original.agent_vendor(agent).as_deref() == Some(SOFTWARE_RUNTIME_VENDOR);
        self.host_visible.lock().insert(agent.handle, visible);
        visible
    }

    pub(crate) fn next_dispatch_id(&self) -> u64 {
        self.next_dispatch_id.fetch_add(1, Ordering::Relaxed) + 1
    }

    /// Waits until `signal` reaches 0 or `deadline` passes (the runtime's wait may return early,
    /// e.g. on a timeout hint or a spurious wake-up, so this re-waits). True when it reached 0.
    pub(crate) fn wait_signal_zero(&self, signal: hsa_signal_t, deadline: Instant) -> bool {
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if self.original.signal_wait_eq(signal, 0, self.ticks(left)) == 0 {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
        }
    }

    /// The deadline `timeout` from now. A timeout past what an `Instant` holds (the drain
    /// configuration's `Duration::MAX`, "no limit") gives a deadline about a century ahead
    /// instead of panicking in a runtime callback.
    pub(crate) fn deadline_after(timeout: Duration) -> Instant {
        let now = Instant::now();
        now.checked_add(timeout)
            .or_else(|| now.checked_add(Duration::from_secs(100 * 365 * 24 * 3600)))
            .unwrap_or(now)
    }

    /// Timestamp ticks as nanoseconds.
    pub(crate) fn nanos(&self, ticks: u64) -> u64 {
        let ns = u128::from(ticks) * 1_000_000_000 / u128::from(self.ticks_per_second.max(1));
        u64::try_from(ns).unwrap_or(u64::MAX)
    }

    pub(crate) fn ticks(&self, d: Duration) -> u64 {
        let ticks = d
            .as_nanos()
            .saturating_mul(u128::from(self.ticks_per_second))
            / 1_000_000_000;
        u64::try_from(ticks).unwrap_or(u64::MAX)
    }
}

/// See [`crate::install`].
pub(crate) unsafe fn install(
    table: *mut HsaApiTable,
    hooks: Arc<dyn ToolHooks>,
    options: InstallOptions,
) -> Result<(), InstallError> {
    if BACKEND.get().is_some() {
        return Err(InstallError::AlreadyInstalled);
    }
    // SAFETY: the caller guarantees `table` is a valid, initialized HSA API table.
    let original = unsafe { Original::capture(table) }.map_err(InstallError::Table)?;
    // SAFETY: as for `Original::capture`; the image table is read only where the root holds it.
    let images = unsafe { crate::images::Images::capture(table) };
    let ticks_per_second = original.timestamp_frequency().unwrap_or(1_000_000_000);
    let svm_by_default = original.svm_accessible_by_default();
    let gpus = crate::copies::gpus_among(&original, original.agents());
    let inventory = Arc::new(Inventory::new());
    let auto_store = options.snapshot.store == kreplay_snapshot::StoreTier::Auto;
    let snapshotter = Snapshotter::new(
        inventory.clone(),
        Arc::new(crate::memory::HsaMemory),
        options.snapshot,
    )
    .map_err(|e| InstallError::Config(e.to_string()))?;
    let locks = AgentLocks::new();
    locks.set_enabled(hooks.replay_configured());
    let backend = Backend {
        original,
        inventory,
        snapshotter,
        locks,
        queues: QueueRegistry::default(),
        copies: CopyTracker::default(),
        watcher: crate::watcher::Watcher::default(),
        windows: crate::fold::Windows::default(),
        soft_queues: crate::soft_queues::SoftQueues::default(),
        vmem: crate::vmem::VmemTracker::default(),
        svm: crate::svm::SvmRanges::default(),
        images,
        signals: crate::signals::Signals::default(),
        peers: crate::peers::Peers::default(),
        hooks,
        drain: options.drain,
        skip_restore: options.skip_restore,
        auto_store,
        force_runtime_copies: options.force_runtime_copies,
        locked_host: parking_lot::Mutex::default(),
        cpu_agent: OnceLock::new(),
        gpus,
        ticks_per_second,
        svm_by_default,
        host_visible: parking_lot::Mutex::default(),
        finalized: AtomicBool::new(false),
        next_dispatch_id: AtomicU64::new(0),
    };
    BACKEND
        .set(backend)
        .map_err(|_| InstallError::AlreadyInstalled)?;
    let b = installed().expect("set just above");
    // SAFETY: registers plain extern "C" functions that never unwind: the prepare and parent
    // handlers take and release the backend's locks (`crate::fork`), the child's resets them and
    // stores atomics (no allocation, no lock that could be held: async-signal-safe, as a
    // handler run in the child of a multithreaded process must be).
    if unsafe {
        libc::pthread_atfork(
            Some(crate::fork::prepare),
            Some(crate::fork::in_parent),
            Some(in_forked_child),
        )
    } != 0
    {
        log::warn!(
            "cannot register kreplay's fork handlers: a child forked during a replay may wait \
             for the parent's replay, and its HSA calls for locks other threads of the parent \
             held"
        );
    }
    // SAFETY: `Original::capture` checked the table's shape and that both sub-tables are
    // non-null; the caller lets us modify the table (the hsa_api_trace contract of a tools
    // library's OnLoad). The backend is set, so the wrappers find it from their first call on.
    unsafe { install_wrappers(table, &b.original) };
    // SAFETY: the same table, writable; the image table was captured from it.
    unsafe { crate::images::install_wrappers(table, &b.images) };
    Ok(())
}

/// Writes a wrapper over a core entry the runtime has (inside its declared size, non-null).
macro_rules! wrap_core {
    ($table:expr, $original:expr, $($entry:ident = $wrapper:expr),* $(,)?) => {$({
        let offset = std::mem::offset_of!(CoreApiTable, $entry);
        if $original.shape().core_has(offset) && $original.core().$entry.is_some() {
            let mut typed = CoreApiTable::default();
            typed.$entry = Some($wrapper);
            // SAFETY: the entry lies inside the size the runtime declares for its core table
            // (checked), and `typed.$entry` has the entry's type.
            unsafe { crate::layout::write_entry($table, offset, typed.$entry) };
        }
    })*};
}

/// Writes a wrapper over an AMD extension entry the runtime has, at its offset in the runtime's
/// own order.
macro_rules! wrap_amd {
    ($table:expr, $original:expr, $($entry:ident = $wrapper:expr),* $(,)?) => {$({
        let shape = $original.shape();
        let v2 = std::mem::offset_of!(AmdExtTableV2, $entry);
        if let Some(offset) = crate::layout::amd_offset(shape.amd_order, v2)
            .filter(|&o| shape.amd_has(o))
            .filter(|_| $original.amd().$entry.is_some())
        {
            let mut typed = AmdExtTableV2::default();
            typed.$entry = Some($wrapper);
            // SAFETY: the entry lies inside the size the runtime declares for its AMD extension
            // table, at its offset in that table's order (checked), and `typed.$entry` has the
            // entry's type (the same in every order).
            unsafe { crate::layout::write_entry($table, offset, typed.$entry) };
        }
    })*};
}

/// Installs every wrapper whose entry the runtime has.
///
/// # Safety
/// `table` is the table `original` was captured from, writable.
unsafe fn install_wrappers(table: *mut HsaApiTable, original: &Original) {
    // SAFETY: the caller's table; `capture` checked both pointers non-null.
    let (core, amd) = unsafe { ((*table).core_.cast::<u8>(), (*table).amd_ext_.cast::<u8>()) };
    use crate::{copies, memory, queues, soft_queues, vmem};
    wrap_core!(
        core,
        original,
        hsa_queue_create_fn = queues::queue_create,
        hsa_queue_destroy_fn = soft_queues::queue_destroy,
        hsa_queue_inactivate_fn = queues::queue_inactivate,
        hsa_queue_add_write_index_scacq_screl_fn = queues::queue_add_write_index_scacq_screl,
        hsa_queue_add_write_index_scacquire_fn = queues::queue_add_write_index_scacquire,
        hsa_queue_add_write_index_relaxed_fn = queues::queue_add_write_index_relaxed,
        hsa_queue_add_write_index_screlease_fn = queues::queue_add_write_index_screlease,
        hsa_queue_cas_write_index_scacq_screl_fn = queues::queue_cas_write_index_scacq_screl,
        hsa_queue_cas_write_index_scacquire_fn = queues::queue_cas_write_index_scacquire,
        hsa_queue_cas_write_index_relaxed_fn = queues::queue_cas_write_index_relaxed,
        hsa_queue_cas_write_index_screlease_fn = queues::queue_cas_write_index_screlease,
        hsa_queue_store_write_index_relaxed_fn = queues::queue_store_write_index_relaxed,
        hsa_queue_store_write_index_screlease_fn = queues::queue_store_write_index_screlease,
        hsa_signal_store_relaxed_fn = queues::signal_store_relaxed,
        hsa_signal_store_screlease_fn = queues::signal_store_screlease,
        hsa_soft_queue_create_fn = soft_queues::soft_queue_create,
        hsa_memory_allocate_fn = memory::memory_allocate,
        hsa_memory_free_fn = memory::memory_free,
        hsa_memory_copy_fn = copies::memory_copy,
        hsa_signal_create_fn = crate::signals::signal_create,
        hsa_signal_destroy_fn = crate::signals::signal_destroy,
    );
    // Executables are tracked only where every entry reach needs exists.
    if crate::reach::capture(original.core()) {
        wrap_core!(
            core,
            original,
            hsa_executable_create_fn = crate::reach::executable_create,
            hsa_executable_create_alt_fn = crate::reach::executable_create_alt,
            hsa_executable_destroy_fn = crate::reach::executable_destroy,
            hsa_executable_freeze_fn = crate::reach::executable_freeze,
        );
        // Code object metadata: which kernels may print or call the host (`crate::devruntime`).
        wrap_core!(
            core,
            original,
            hsa_code_object_reader_create_from_memory_fn =
                crate::devruntime::reader_create_from_memory,
            hsa_code_object_reader_create_from_file_fn = crate::devruntime::reader_create_from_file,
            hsa_code_object_reader_destroy_fn = crate::devruntime::reader_destroy,
            hsa_executable_load_agent_code_object_fn = crate::devruntime::load_agent_code_object,
            hsa_executable_load_program_code_object_fn =
                crate::devruntime::load_program_code_object,
        );
    }
    wrap_amd!(
        amd,
        original,
        hsa_amd_memory_pool_allocate_fn = memory::pool_allocate,
        hsa_amd_memory_pool_free_fn = memory::pool_free,
        hsa_amd_queue_intercept_create_fn = queues::intercept_create,
        hsa_amd_queue_intercept_register_fn = queues::intercept_register,
        hsa_amd_memory_async_copy_fn = copies::async_copy,
        hsa_amd_profiling_get_async_copy_time_fn = copies::async_copy_time,
        hsa_amd_profiling_set_profiler_enabled_fn = queues::set_profiler_enabled,
        hsa_amd_memory_async_copy_on_engine_fn = copies::async_copy_on_engine,
        hsa_amd_memory_async_copy_rect_fn = copies::async_copy_rect,
        hsa_amd_memory_async_batch_copy_fn = copies::async_batch_copy,
        hsa_amd_ais_file_read_fn = copies::ais_file_read,
        hsa_amd_memory_fill_fn = copies::memory_fill,
        hsa_amd_agents_allow_access_fn = memory::agents_allow_access,
        hsa_amd_memory_lock_fn = memory::memory_lock,
        hsa_amd_memory_lock_to_pool_fn = memory::memory_lock_to_pool,
        hsa_amd_memory_unlock_fn = memory::memory_unlock,
        hsa_amd_ipc_memory_attach_fn = memory::ipc_memory_attach,
        hsa_amd_ipc_memory_detach_fn = memory::ipc_memory_detach,
        hsa_amd_interop_map_buffer_fn = memory::interop_map_buffer,
        hsa_amd_interop_unmap_buffer_fn = memory::interop_unmap_buffer,
        hsa_amd_image_create_fn = crate::images::amd_image_create,
        hsa_amd_signal_create_fn = crate::signals::amd_signal_create,
        hsa_amd_vmem_handle_create_fn = vmem::handle_create,
        hsa_amd_vmem_handle_release_fn = vmem::handle_release,
        hsa_amd_vmem_import_shareable_handle_fn = vmem::import_shareable_handle,
        hsa_amd_vmem_retain_alloc_handle_fn = vmem::retain_alloc_handle,
        hsa_amd_vmem_map_fn = vmem::map,
        hsa_amd_vmem_unmap_fn = vmem::unmap,
        hsa_amd_vmem_set_access_fn = vmem::set_access,
        hsa_amd_vmem_address_reserve_fn = vmem::address_reserve,
        hsa_amd_vmem_address_reserve_align_fn = vmem::address_reserve_align,
        hsa_amd_vmem_address_free_fn = vmem::address_free,
        hsa_amd_svm_attributes_set_fn = crate::svm::attributes_set,
    );
}

/// Set in the child of a `fork` (see [`in_forked_child`]).
static FORKED: AtomicBool = AtomicBool::new(false);

/// Whether this process is the child of a `fork` made after kreplay was installed: what the
/// parent's other threads were doing in kreplay (a handler call in progress, a replay) never
/// ends here, so nothing may wait for it.
pub(crate) fn forked_child() -> bool {
    FORKED.load(Ordering::SeqCst)
}

/// Runs in the child of a `fork`: only the forking thread exists there, so a replay window
/// the parent had open (its agent locks, its drained queues, its snapshot) has nobody left to
/// close it, and the child's copy of kreplay's state is a picture of the parent's threads
/// mid-way. The child replays nothing: kreplay is finalized there, as after `OnUnload` (every
/// wrapper passes through, queues created from now on are the runtime's own), and the agents'
/// reader side is switched off so that no dispatch of the child waits for a writer that
/// exists only in the parent. First the backend's locks, which the fork's prepare handler
/// took, are unlocked again and the parent's completion threads forgotten (`crate::fork`);
/// then only atomics are stored: a fork handler in a multithreaded process must be
/// async-signal-safe.
extern "C" fn in_forked_child() {
    let _ = catch_unwind(crate::fork::in_child);
    FORKED.store(true, Ordering::SeqCst);
    if let Some(b) = BACKEND.get() {
        b.finalized.store(true, Ordering::Release);
        b.locks.set_enabled(false);
    }
    crate::dispatch::forget_held_in_child();
}

/// See [`crate::finalize`].
pub(crate) fn finalize() {
    if let Some(b) = BACKEND.get() {
        b.finalized.store(true, Ordering::Release);
        // The reader side stays as it is: a replay that began before finalization may still be
        // running, and work submitted meanwhile on its agent waits for it (`crate::dispatch`).
        b.snapshotter.release_cached_store();
    }
}
