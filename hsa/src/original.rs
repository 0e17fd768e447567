//! The runtime's own entry points, saved before kreplay installs its wrappers.
//!
//! kreplay makes every call of its own through this copy, never through the (wrapped) table the
//! application uses, so its internal allocations, queues and copies are never seen by its wrappers.

use std::ffi::c_void;

use hsa_sys::layouts::AmdExtTableV2;
use hsa_sys::*;

use crate::layout::{self, TableShape};

/// Copies of the runtime's core and AMD extension tables as they were before installation.
///
/// The AMD extension entries are kept in the ROCm 5.6+ order whatever the runtime's own order
/// ([`layout::copy_amd`]); an entry the runtime does not have is null here.
pub(crate) struct Original {
    core: CoreApiTable,
    amd: AmdExtTableV2,
    shape: TableShape,
}

// SAFETY: the tables hold only function pointers into the runtime, which are callable from any
// thread (the HSA API is thread safe) and never change after the copy.
unsafe impl Send for Original {}
// SAFETY: see `Send`; shared access only reads the function pointers.
unsafe impl Sync for Original {}

/// Calls one saved entry; `install` checked that every entry used here is present.
macro_rules! call {
    ($table:expr, $entry:ident ( $($arg:expr),* $(,)? )) => {{
        let f = $table.$entry.expect(concat!("checked at install: ", stringify!($entry)));
        // SAFETY: `f` is the runtime's own entry point for this function; callers pass arguments
        // that satisfy the HSA contract of that function (documented at each call site).
        unsafe { f($($arg),*) }
    }};
}

/// Calls a runtime entry on behalf of the application (a wrapper forwarding its call):
/// `HSA_STATUS_ERROR` if the runtime lacks it, which never happens for a wrapper, installed only
/// over an entry the runtime has.
macro_rules! forward {
    ($b:expr, $table:ident . $entry:ident ( $($arg:expr),* $(,)? )) => {{
        match $b.original.$table().$entry {
            // SAFETY: the runtime's own entry point, called with the application's arguments
            // unchanged (or kreplay's completion signal in place of the application's), under
            // the same HSA contract the application's call was made under.
            Some(f) => unsafe { f($($arg),*) },
            None => hsa_sys::HSA_STATUS_ERROR,
        }
    }};
}
pub(crate) use forward;

/// Entries kreplay calls itself; installation fails with a clear message if one is missing.
macro_rules! required {
    ($($table:ident . $entry:ident),* $(,)?) => {
        fn missing_entry(core: &CoreApiTable, amd: &AmdExtTableV2) -> Option<&'static str> {
            $( if $table(core, amd).$entry.is_none() { return Some(stringify!($entry)); } )*
            None
        }
    };
}

fn core<'a>(core: &'a CoreApiTable, _: &'a AmdExtTableV2) -> &'a CoreApiTable {
    core
}
fn amd<'a>(_: &'a CoreApiTable, amd: &'a AmdExtTableV2) -> &'a AmdExtTableV2 {
    amd
}

required!(
    core.hsa_signal_create_fn,
    core.hsa_signal_destroy_fn,
    core.hsa_signal_load_scacquire_fn,
    core.hsa_signal_add_screlease_fn,
    core.hsa_signal_subtract_screlease_fn,
    core.hsa_signal_wait_scacquire_fn,
    core.hsa_queue_destroy_fn,
    core.hsa_memory_copy_fn,
    core.hsa_memory_allocate_fn,
    core.hsa_memory_free_fn,
    core.hsa_agent_get_info_fn,
    core.hsa_queue_create_fn,
    core.hsa_queue_add_write_index_scacq_screl_fn,
    core.hsa_queue_load_read_index_scacquire_fn,
    core.hsa_signal_store_relaxed_fn,
    core.hsa_signal_store_screlease_fn,
    core.hsa_system_get_info_fn,
    core.hsa_iterate_agents_fn,
    amd.hsa_amd_memory_pool_allocate_fn,
    amd.hsa_amd_memory_pool_free_fn,
    amd.hsa_amd_memory_pool_get_info_fn,
    amd.hsa_amd_agent_iterate_memory_pools_fn,
    amd.hsa_amd_pointer_info_fn,
    amd.hsa_amd_memory_async_copy_fn,
    amd.hsa_amd_signal_async_handler_fn,
    amd.hsa_amd_queue_intercept_create_fn,
    amd.hsa_amd_queue_intercept_register_fn,
    amd.hsa_amd_profiling_get_dispatch_time_fn,
    amd.hsa_amd_profiling_set_profiler_enabled_fn,
    amd.hsa_amd_memory_lock_fn,
    amd.hsa_amd_memory_unlock_fn,
);

impl Original {
    /// Checks the table's shape ([`layout::inspect`]), then copies the tables behind it.
    ///
    /// # Safety
    /// `table` must point to a valid `HsaApiTable` whose `core_` and `amd_ext_` point to valid,
    /// fully initialized tables (as the runtime hands to a tools library's `OnLoad`).
    pub(crate) unsafe fn capture(table: *const HsaApiTable) -> Result<Self, String> {
        // SAFETY: forwarded from the caller.
        let shape = unsafe { layout::inspect(table) }?;
        // SAFETY: `inspect` checked both pointers non-null and the sizes they declare; the
        // caller guarantees that many bytes are readable.
        let (core, amd) = unsafe {
            (
                layout::copy_core((*table).core_, &shape),
                layout::copy_amd((*table).amd_ext_, &shape),
            )
        };
        if let Some(entry) = missing_entry(&core, &amd) {
            return Err(format!(
                "the HSA runtime ({}, {}) does not provide {entry}, which kreplay needs",
                shape.release,
                layout::describe(&shape)
            ));
        }
        Ok(Self { core, amd, shape })
    }

    /// The shape of the runtime's table.
    pub(crate) fn shape(&self) -> &TableShape {
        &self.shape
    }

    /// The runtime's AMD extension entries (ROCm 5.6+ order; absent ones are null).
    pub(crate) fn amd(&self) -> &AmdExtTableV2 {
        &self.amd
    }

    /// The runtime's core entries.
    pub(crate) fn core(&self) -> &CoreApiTable {
        &self.core
    }

    pub(crate) fn signal_create(&self, initial: i64) -> Result<hsa_signal_t, hsa_status_t> {
        let mut signal = hsa_signal_t { handle: 0 };
        // `consumers` may be null when their count is 0; `signal` is a valid out pointer.
        let status = call!(
            self.core,
            hsa_signal_create_fn(initial, 0, std::ptr::null(), &mut signal)
        );
        if status == HSA_STATUS_SUCCESS {
            Ok(signal)
        } else {
            Err(status)
        }
    }

    pub(crate) fn signal_destroy(&self, signal: hsa_signal_t) {
        // A signal created by `signal_create` and no longer used by any packet.
        call!(self.core, hsa_signal_destroy_fn(signal));
    }

    pub(crate) fn signal_load(&self, signal: hsa_signal_t) -> i64 {
        call!(self.core, hsa_signal_load_scacquire_fn(signal))
    }

    pub(crate) fn signal_add(&self, signal: hsa_signal_t, value: i64) {
        call!(self.core, hsa_signal_add_screlease_fn(signal, value))
    }

    pub(crate) fn signal_subtract(&self, signal: hsa_signal_t, value: i64) {
        call!(self.core, hsa_signal_subtract_screlease_fn(signal, value))
    }

    pub(crate) fn signal_store_relaxed(&self, signal: hsa_signal_t, value: i64) {
        call!(self.core, hsa_signal_store_relaxed_fn(signal, value))
    }

    pub(crate) fn signal_store_screlease(&self, signal: hsa_signal_t, value: i64) {
        call!(self.core, hsa_signal_store_screlease_fn(signal, value))
    }

    /// Reserves `count` packet slots of `queue` (a queue the runtime created).
    pub(crate) fn queue_add_write_index(&self, queue: *const hsa_queue_t, count: u64) -> u64 {
        call!(
            self.core,
            hsa_queue_add_write_index_scacq_screl_fn(queue, count)
        )
    }

    /// Reserves the packet slot at `expected` of `queue` (a queue the runtime created) if its
    /// write index is still `expected`: the write index seen (`expected` where the slot is
    /// reserved), or None where the runtime lacks the entry.
    pub(crate) fn queue_cas_write_index(
        &self,
        queue: *const hsa_queue_t,
        expected: u64,
    ) -> Option<u64> {
        let f = self.core.hsa_queue_cas_write_index_scacq_screl_fn?;
        // SAFETY: the runtime's own entry point; `queue` is a live queue of the runtime's, and
        // the exchange moves its write index by one slot only if no producer moved it since.
        Some(unsafe { f(queue, expected, expected.saturating_add(1)) })
    }

    pub(crate) fn queue_load_read_index(&self, queue: *const hsa_queue_t) -> u64 {
        call!(self.core, hsa_queue_load_read_index_scacquire_fn(queue))
    }

    /// Waits until `signal` equals `value` or `timeout_ticks` pass; returns the last value seen.
    pub(crate) fn signal_wait_eq(
        &self,
        signal: hsa_signal_t,
        value: i64,
        timeout_ticks: u64,
    ) -> i64 {
        call!(
            self.core,
            hsa_signal_wait_scacquire_fn(
                signal,
                HSA_SIGNAL_CONDITION_EQ,
                value,
                timeout_ticks,
                HSA_WAIT_STATE_BLOCKED
            )
        )
    }

    pub(crate) fn memory_copy(
        &self,
        dst: *mut c_void,
        src: *const c_void,
        size: usize,
    ) -> hsa_status_t {
        // The caller passes ranges inside live allocations (or host memory it owns).
        call!(self.core, hsa_memory_copy_fn(dst, src, size))
    }

    pub(crate) fn pointer_info(&self, ptr: *const c_void) -> Option<hsa_amd_pointer_info_t> {
        let mut info = hsa_amd_pointer_info_t {
            size: std::mem::size_of::<hsa_amd_pointer_info_t>() as u32,
            ..Default::default()
        };
        // Null agent list outputs are allowed; `info.size` says how much the runtime may write.
        let status = call!(
            self.amd,
            hsa_amd_pointer_info_fn(
                ptr.cast_mut(),
                &mut info,
                None,
                std::ptr::null_mut(),
                std::ptr::null_mut()
            )
        );
        (status == HSA_STATUS_SUCCESS && info.type_ != HSA_EXT_POINTER_TYPE_UNKNOWN).then_some(info)
    }

    pub(crate) fn agent_device_type(&self, agent: hsa_agent_t) -> Option<hsa_device_type_t> {
        let mut device: hsa_device_type_t = 0;
        // HSA_AGENT_INFO_DEVICE writes one hsa_device_type_t.
        let status = call!(
            self.core,
            hsa_agent_get_info_fn(
                agent,
                HSA_AGENT_INFO_DEVICE,
                (&mut device as *mut hsa_device_type_t).cast()
            )
        );
        (status == HSA_STATUS_SUCCESS).then_some(device)
    }

    /// The first CPU agent (where host memory lives, for async copies from it).
    pub(crate) fn cpu_agent(&self) -> Option<hsa_agent_t> {
        unsafe extern "C" fn visit(agent: hsa_agent_t, data: *mut c_void) -> hsa_status_t {
            // SAFETY: `data` is the `(&Original, Option<agent>)` pair passed below, alive for the walk.
            let (original, found) =
                unsafe { &mut *data.cast::<(&Original, Option<hsa_agent_t>)>() };
            if original.agent_device_type(agent) == Some(HSA_DEVICE_TYPE_CPU) {
                *found = Some(agent);
                return HSA_STATUS_INFO_BREAK;
            }
            HSA_STATUS_SUCCESS
        }
        let mut state: (&Original, Option<hsa_agent_t>) = (self, None);
        // `visit` only touches `state`, which outlives the call.
        call!(
            self.core,
            hsa_iterate_agents_fn(
                Some(visit),
                (&mut state as *mut (&Original, Option<hsa_agent_t>)).cast()
            )
        );
        state.1
    }

    /// Every agent of the system.
    pub(crate) fn agents(&self) -> Vec<hsa_agent_t> {
        unsafe extern "C" fn visit(agent: hsa_agent_t, data: *mut c_void) -> hsa_status_t {
            // SAFETY: `data` is the Vec passed below, alive for the walk.
            unsafe { (*data.cast::<Vec<hsa_agent_t>>()).push(agent) };
            HSA_STATUS_SUCCESS
        }
        let mut agents: Vec<hsa_agent_t> = Vec::new();
        // `visit` only touches `agents`, which outlives the call.
        call!(
            self.core,
            hsa_iterate_agents_fn(Some(visit), (&raw mut agents).cast())
        );
        agents
    }

    /// Every memory pool of `agent`.
    pub(crate) fn pools(&self, agent: hsa_agent_t) -> Vec<hsa_amd_memory_pool_t> {
        unsafe extern "C" fn visit(pool: hsa_amd_memory_pool_t, data: *mut c_void) -> hsa_status_t {
            // SAFETY: `data` is the Vec passed below, alive for the walk.
            unsafe { (*data.cast::<Vec<hsa_amd_memory_pool_t>>()).push(pool) };
            HSA_STATUS_SUCCESS
        }
        let mut pools: Vec<hsa_amd_memory_pool_t> = Vec::new();
        // `visit` only touches `pools`, which outlives the call.
        call!(
            self.amd,
            hsa_amd_agent_iterate_memory_pools_fn(agent, Some(visit), (&raw mut pools).cast())
        );
        pools
    }

    /// Locks (pins) host memory for every agent; returns the address agents must use for it.
    pub(crate) fn memory_lock(&self, ptr: *mut c_void, size: usize) -> Option<*mut c_void> {
        let mut agent_ptr: *mut c_void = std::ptr::null_mut();
        // A null agent list with count 0 makes the memory accessible to every agent.
        let status = call!(
            self.amd,
            hsa_amd_memory_lock_fn(ptr, size, std::ptr::null_mut(), 0, &mut agent_ptr)
        );
        (status == HSA_STATUS_SUCCESS && !agent_ptr.is_null()).then_some(agent_ptr)
    }

    pub(crate) fn memory_unlock(&self, ptr: *mut c_void) {
        // `ptr` was locked by `memory_lock` and is no longer used by any agent.
        call!(self.amd, hsa_amd_memory_unlock_fn(ptr));
    }

    /// The agent's vendor name (`HSA_AGENT_INFO_VENDOR_NAME`).
    pub(crate) fn agent_vendor(&self, agent: hsa_agent_t) -> Option<String> {
        self.agent_text(agent, HSA_AGENT_INFO_VENDOR_NAME)
    }

    /// The agent's name (`HSA_AGENT_INFO_NAME`, e.g. `gfx942`).
    pub(crate) fn agent_name(&self, agent: hsa_agent_t) -> Option<String> {
        self.agent_text(agent, HSA_AGENT_INFO_NAME)
    }

    fn agent_text(&self, agent: hsa_agent_t, attribute: hsa_agent_info_t) -> Option<String> {
        let mut name = [0u8; 64];
        // HSA_AGENT_INFO_NAME and HSA_AGENT_INFO_VENDOR_NAME write a NUL-padded char[64].
        let status = call!(
            self.core,
            hsa_agent_get_info_fn(agent, attribute, name.as_mut_ptr().cast())
        );
        (status == HSA_STATUS_SUCCESS).then(|| {
            let len = name.iter().position(|&b| b == 0).unwrap_or(name.len());
            String::from_utf8_lossy(&name[..len]).into_owned()
        })
    }

    /// The agent's first pool that is global, coarse-grained and allows runtime allocation.
    pub(crate) fn coarse_pool(&self, agent: hsa_agent_t) -> Option<hsa_amd_memory_pool_t> {
        unsafe extern "C" fn visit(pool: hsa_amd_memory_pool_t, data: *mut c_void) -> hsa_status_t {
            // SAFETY: `data` is the `(&Original, Option<pool>)` pair passed below, alive for the walk.
            let (original, found) =
                unsafe { &mut *data.cast::<(&Original, Option<hsa_amd_memory_pool_t>)>() };
            let segment = original.pool_info_u32(pool, HSA_AMD_MEMORY_POOL_INFO_SEGMENT);
            let flags = original.pool_info_u32(pool, HSA_AMD_MEMORY_POOL_INFO_GLOBAL_FLAGS);
            let alloc =
                original.pool_info_u32(pool, HSA_AMD_MEMORY_POOL_INFO_RUNTIME_ALLOC_ALLOWED);
            if segment == Some(HSA_AMD_SEGMENT_GLOBAL)
                && flags.is_some_and(|f| f & HSA_AMD_MEMORY_POOL_GLOBAL_FLAG_COARSE_GRAINED != 0)
                && alloc.is_some_and(|a| a & 0xff != 0)
            {
                *found = Some(pool);
                return HSA_STATUS_INFO_BREAK;
            }
            HSA_STATUS_SUCCESS
        }
        let mut state: (&Original, Option<hsa_amd_memory_pool_t>) = (self, None);
        // `visit` only touches `state`, which outlives the call.
        call!(
            self.amd,
            hsa_amd_agent_iterate_memory_pools_fn(
                agent,
                Some(visit),
                (&mut state as *mut (&Original, Option<hsa_amd_memory_pool_t>)).cast()
            )
        );
        state.1
    }

    /// A pool attribute of at most 4 bytes (segment, flags, booleans), zero-extended.
    pub(crate) fn pool_info_u32(
        &self,
        pool: hsa_amd_memory_pool_t,
        attribute: hsa_amd_memory_pool_info_t,
    ) -> Option<u32> {
        let mut value = 0u64;
        // Every attribute read through here is at most 4 bytes; an 8-byte buffer is large enough.
        let status = call!(
            self.amd,
            hsa_amd_memory_pool_get_info_fn(pool, attribute, (&mut value as *mut u64).cast())
        );
        (status == HSA_STATUS_SUCCESS).then_some(value as u32)
    }

    pub(crate) fn pool_allocate(
        &self,
        pool: hsa_amd_memory_pool_t,
        size: usize,
        flags: u32,
        out: *mut *mut c_void,
    ) -> hsa_status_t {
        call!(
            self.amd,
            hsa_amd_memory_pool_allocate_fn(pool, size, flags, out)
        )
    }

    pub(crate) fn pool_free(&self, ptr: *mut c_void) -> hsa_status_t {
        call!(self.amd, hsa_amd_memory_pool_free_fn(ptr))
    }

    pub(crate) fn memory_allocate(
        &self,
        region: hsa_region_t,
        size: usize,
        out: *mut *mut c_void,
    ) -> hsa_status_t {
        call!(self.core, hsa_memory_allocate_fn(region, size, out))
    }

    pub(crate) fn memory_free(&self, ptr: *mut c_void) -> hsa_status_t {
        call!(self.core, hsa_memory_free_fn(ptr))
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) fn async_copy(
        &self,
        dst: *mut c_void,
        dst_agent: hsa_agent_t,
        src: *const c_void,
        src_agent: hsa_agent_t,
        size: usize,
        num_deps: u32,
        deps: *const hsa_signal_t,
        completion: hsa_signal_t,
    ) -> hsa_status_t {
        call!(
            self.amd,
            hsa_amd_memory_async_copy_fn(
                dst, dst_agent, src, src_agent, size, num_deps, deps, completion
            )
        )
    }

    /// `hsa_amd_signal_wait_any` over `signals` (each with its condition and value), for at
    /// most about `timeout_ticks`; `None` when the runtime lacks it.
    pub(crate) fn signal_wait_any(
        &self,
        signals: &mut [hsa_signal_t],
        conds: &mut [hsa_signal_condition_t],
        values: &mut [hsa_signal_value_t],
        timeout_ticks: u64,
    ) -> Option<u32> {
        let f = self.amd.hsa_amd_signal_wait_any_fn?;
        debug_assert!(signals.len() == conds.len() && conds.len() == values.len());
        let mut satisfying: hsa_signal_value_t = 0;
        // SAFETY: three arrays of `signals.len()` entries each, live for the call, and an out
        // value; the runtime's own entry point.
        Some(unsafe {
            f(
                signals.len() as u32,
                signals.as_mut_ptr(),
                conds.as_mut_ptr(),
                values.as_mut_ptr(),
                timeout_ticks,
                HSA_WAIT_STATE_BLOCKED,
                &raw mut satisfying,
            )
        })
    }

    pub(crate) fn signal_async_handler(
        &self,
        signal: hsa_signal_t,
        condition: hsa_signal_condition_t,
        value: i64,
        handler: hsa_amd_signal_handler,
        arg: *mut c_void,
    ) -> hsa_status_t {
        call!(
            self.amd,
            hsa_amd_signal_async_handler_fn(signal, condition, value, handler, arg)
        )
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) fn intercept_create(
        &self,
        agent: hsa_agent_t,
        size: u32,
        type_: hsa_queue_type32_t,
        callback: Option<unsafe extern "C" fn(hsa_status_t, *mut hsa_queue_t, *mut c_void)>,
        data: *mut c_void,
        private_segment_size: u32,
        group_segment_size: u32,
        out: *mut *mut hsa_queue_t,
    ) -> hsa_status_t {
        call!(
            self.amd,
            hsa_amd_queue_intercept_create_fn(
                agent,
                size,
                type_,
                callback,
                data,
                private_segment_size,
                group_segment_size,
                out
            )
        )
    }

    pub(crate) fn intercept_register(
        &self,
        queue: *mut hsa_queue_t,
        handler: hsa_amd_queue_intercept_handler,
        data: *mut c_void,
    ) -> hsa_status_t {
        call!(
            self.amd,
            hsa_amd_queue_intercept_register_fn(queue, handler, data)
        )
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) fn queue_create(
        &self,
        agent: hsa_agent_t,
        size: u32,
        type_: hsa_queue_type32_t,
        callback: Option<unsafe extern "C" fn(hsa_status_t, *mut hsa_queue_t, *mut c_void)>,
        data: *mut c_void,
        private_segment_size: u32,
        group_segment_size: u32,
        out: *mut *mut hsa_queue_t,
    ) -> hsa_status_t {
        call!(
            self.core,
            hsa_queue_create_fn(
                agent,
                size,
                type_,
                callback,
                data,
                private_segment_size,
                group_segment_size,
                out
            )
        )
    }

    /// Timestamp ticks per second (signal wait timeouts are given in ticks).
    pub(crate) fn timestamp_frequency(&self) -> Option<u64> {
        let mut hz = 0u64;
        // HSA_SYSTEM_INFO_TIMESTAMP_FREQUENCY writes one uint64_t.
        let status = call!(
            self.core,
            hsa_system_get_info_fn(
                HSA_SYSTEM_INFO_TIMESTAMP_FREQUENCY,
                (&mut hz as *mut u64).cast()
            )
        );
        (status == HSA_STATUS_SUCCESS && hz != 0).then_some(hz)
    }

    /// Whether agents reach any host memory of the process without registration
    /// (`HSA_AMD_SYSTEM_INFO_SVM_ACCESSIBLE_BY_DEFAULT`: XNACK on). Unknown counts as no.
    pub(crate) fn svm_accessible_by_default(&self) -> bool {
        let mut on = false;
        // The attribute writes one bool.
        let status = call!(
            self.core,
            hsa_system_get_info_fn(
                HSA_AMD_SYSTEM_INFO_SVM_ACCESSIBLE_BY_DEFAULT,
                (&mut on as *mut bool).cast()
            )
        );
        status == HSA_STATUS_SUCCESS && on
    }

    pub(crate) fn queue_destroy(&self, queue: *mut hsa_queue_t) -> hsa_status_t {
        call!(self.core, hsa_queue_destroy_fn(queue))
    }

    pub(crate) fn set_profiler_enabled(
        &self,
        queue: *mut hsa_queue_t,
        enabled: bool,
    ) -> hsa_status_t {
        call!(
            self.amd,
            hsa_amd_profiling_set_profiler_enabled_fn(queue, i32::from(enabled))
        )
    }

    /// Start and end ticks of the last dispatch that completed with `signal`.
    pub(crate) fn dispatch_time(
        &self,
        agent: hsa_agent_t,
        signal: hsa_signal_t,
    ) -> Option<(u64, u64)> {
        let mut time = hsa_amd_profiling_dispatch_time_t::default();
        let status = call!(
            self.amd,
            hsa_amd_profiling_get_dispatch_time_fn(agent, signal, &mut time)
        );
        (status == HSA_STATUS_SUCCESS).then_some((time.start, time.end))
    }
}
