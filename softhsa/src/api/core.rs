//! Entry points of the core table (`CoreApiTable`).

use super::{
    HsaResult, guard, guard_or, info, put, put_bytes, read_array, unsupported_entries, with_runtime,
};
use crate::queue::{Queue, QueueParams, stop_queue};
use crate::runtime::{self, Runtime};
use crate::signal::{Order, Rmw, Signal, WaitCondition, wait_any};
use crate::time::deadline_after;
use crate::topology::AgentKind;
use hsa_sys::*;
use std::ffi::{CStr, c_char, c_void};
use std::sync::Arc;
use std::sync::atomic::Ordering;

/// The error callback argument of the queue-creating entry points.
pub(crate) type QueueCallback =
    Option<unsafe extern "C" fn(hsa_status_t, *mut hsa_queue_t, *mut c_void)>;

// ---------------------------------------------------------------------------------------------
// Initialization and system information

pub(crate) unsafe extern "C" fn hsa_init() -> hsa_status_t {
    guard_or(HSA_STATUS_ERROR, runtime::init)
}

pub(crate) unsafe extern "C" fn hsa_shut_down() -> hsa_status_t {
    guard_or(HSA_STATUS_ERROR, runtime::shut_down)
}

pub(crate) unsafe extern "C" fn hsa_system_get_info(
    attribute: hsa_system_info_t,
    value: *mut c_void,
) -> hsa_status_t {
    with_runtime(|_| {
        let bytes = info::system(attribute)?;
        // SAFETY: HSA contract: `value` has room for the attribute's type.
        unsafe { put_bytes(value, &bytes) }
    })
}

fn check_extension(extension: u16) -> HsaResult {
    let extension = u32::from(extension);
    if extension <= HSA_EXTENSION_STD_LAST
        || (HSA_AMD_FIRST_EXTENSION..=HSA_AMD_LAST_EXTENSION).contains(&extension)
    {
        Ok(())
    } else {
        Err(HSA_STATUS_ERROR_INVALID_ARGUMENT)
    }
}

pub(crate) unsafe extern "C" fn hsa_system_extension_supported(
    extension: u16,
    _version_major: u16,
    _version_minor: u16,
    result: *mut bool,
) -> hsa_status_t {
    with_runtime(|_| {
        check_extension(extension)?;
        // SAFETY: HSA contract: `result` points to a bool.
        unsafe { put(result, false) }
    })
}

pub(crate) unsafe extern "C" fn hsa_system_major_extension_supported(
    extension: u16,
    _version_major: u16,
    version_minor: *mut u16,
    result: *mut bool,
) -> hsa_status_t {
    with_runtime(|_| {
        check_extension(extension)?;
        if version_minor.is_null() {
            return Err(HSA_STATUS_ERROR_INVALID_ARGUMENT);
        }
        // SAFETY: HSA contract: `result` points to a bool.
        unsafe { put(result, false) }
    })
}

pub(crate) unsafe extern "C" fn hsa_agent_extension_supported(
    extension: u16,
    agent: hsa_agent_t,
    _version_major: u16,
    _version_minor: u16,
    result: *mut bool,
) -> hsa_status_t {
    with_runtime(|rt| {
        rt.agent(agent.handle)?;
        check_extension(extension)?;
        // SAFETY: HSA contract: `result` points to a bool.
        unsafe { put(result, false) }
    })
}

pub(crate) unsafe extern "C" fn hsa_agent_major_extension_supported(
    extension: u16,
    agent: hsa_agent_t,
    _version_major: u16,
    version_minor: *mut u16,
    result: *mut bool,
) -> hsa_status_t {
    with_runtime(|rt| {
        rt.agent(agent.handle)?;
        check_extension(extension)?;
        if version_minor.is_null() {
            return Err(HSA_STATUS_ERROR_INVALID_ARGUMENT);
        }
        // SAFETY: HSA contract: `result` points to a bool.
        unsafe { put(result, false) }
    })
}

pub(crate) unsafe extern "C" fn hsa_extension_get_name(
    extension: u16,
    name: *mut *const c_char,
) -> hsa_status_t {
    with_runtime(|_| {
        let text: &'static CStr = match u32::from(extension) {
            HSA_EXTENSION_FINALIZER => c"HSA_EXTENSION_FINALIZER",
            HSA_EXTENSION_IMAGES => c"HSA_EXTENSION_IMAGES",
            HSA_EXTENSION_PERFORMANCE_COUNTERS => c"HSA_EXTENSION_PERFORMANCE_COUNTERS",
            HSA_EXTENSION_PROFILING_EVENTS => c"HSA_EXTENSION_PROFILING_EVENTS",
            HSA_EXTENSION_AMD_PROFILER => c"HSA_EXTENSION_AMD_PROFILER",
            HSA_EXTENSION_AMD_LOADER => c"HSA_EXTENSION_AMD_LOADER",
            HSA_EXTENSION_AMD_AQLPROFILE => c"HSA_EXTENSION_AMD_AQLPROFILE",
            _ => return Err(HSA_STATUS_ERROR_INVALID_ARGUMENT),
        };
        // SAFETY: HSA contract: `name` points to a `const char*`.
        unsafe { put(name, text.as_ptr()) }
    })
}

unsupported_entries! {
    /// No extension tables are provided (all extensions report unsupported).
    hsa_system_get_extension_table(u16, u16, u16, *mut c_void);
}

/// Only softhsa's counter extension (`hsa_sys::soft_counters`) has a table.
pub(crate) unsafe extern "C" fn hsa_system_get_major_extension_table(
    extension: u16,
    version_major: u16,
    table_length: usize,
    table: *mut c_void,
) -> hsa_status_t {
    crate::counters::major_extension_table(extension, version_major, table_length, table)
}

pub(crate) unsafe extern "C" fn hsa_status_string(
    status: hsa_status_t,
    string: *mut *const c_char,
) -> hsa_status_t {
    guard(|| {
        let text = status_text(status).ok_or(HSA_STATUS_ERROR_INVALID_ARGUMENT)?;
        // SAFETY: HSA contract: `string` points to a `const char*`.
        unsafe { put(string, text.as_ptr()) }
    })
}

fn status_text(status: hsa_status_t) -> Option<&'static CStr> {
    Some(match status {
        HSA_STATUS_SUCCESS => c"HSA_STATUS_SUCCESS: The function has been executed successfully.",
        HSA_STATUS_INFO_BREAK => c"HSA_STATUS_INFO_BREAK: A traversal over a list of elements has been interrupted by the application before completing.",
        HSA_STATUS_ERROR => c"HSA_STATUS_ERROR: A generic error has occurred.",
        HSA_STATUS_ERROR_INVALID_ARGUMENT => c"HSA_STATUS_ERROR_INVALID_ARGUMENT: One of the actual arguments does not meet a precondition stated in the documentation of the corresponding formal argument.",
        HSA_STATUS_ERROR_INVALID_QUEUE_CREATION => c"HSA_STATUS_ERROR_INVALID_QUEUE_CREATION: The requested queue creation is not valid.",
        HSA_STATUS_ERROR_INVALID_ALLOCATION => c"HSA_STATUS_ERROR_INVALID_ALLOCATION: The requested allocation is not valid.",
        HSA_STATUS_ERROR_INVALID_AGENT => c"HSA_STATUS_ERROR_INVALID_AGENT: The agent is invalid.",
        HSA_STATUS_ERROR_INVALID_REGION => c"HSA_STATUS_ERROR_INVALID_REGION: The memory region is invalid.",
        HSA_STATUS_ERROR_INVALID_SIGNAL => c"HSA_STATUS_ERROR_INVALID_SIGNAL: The signal is invalid.",
        HSA_STATUS_ERROR_INVALID_QUEUE => c"HSA_STATUS_ERROR_INVALID_QUEUE: The queue is invalid.",
        HSA_STATUS_ERROR_OUT_OF_RESOURCES => c"HSA_STATUS_ERROR_OUT_OF_RESOURCES: The runtime failed to allocate the necessary resources.",
        HSA_STATUS_ERROR_INVALID_PACKET_FORMAT => c"HSA_STATUS_ERROR_INVALID_PACKET_FORMAT: The AQL packet is malformed.",
        HSA_STATUS_ERROR_RESOURCE_FREE => c"HSA_STATUS_ERROR_RESOURCE_FREE: An error has been detected while releasing a resource.",
        HSA_STATUS_ERROR_NOT_INITIALIZED => c"HSA_STATUS_ERROR_NOT_INITIALIZED: An API other than hsa_init has been invoked while the reference count of the HSA runtime is zero.",
        HSA_STATUS_ERROR_REFCOUNT_OVERFLOW => c"HSA_STATUS_ERROR_REFCOUNT_OVERFLOW: The maximum reference count for the object has been reached.",
        HSA_STATUS_ERROR_INCOMPATIBLE_ARGUMENTS => c"HSA_STATUS_ERROR_INCOMPATIBLE_ARGUMENTS: The arguments passed to a function are not compatible.",
        HSA_STATUS_ERROR_INVALID_INDEX => c"HSA_STATUS_ERROR_INVALID_INDEX: The index is invalid.",
        HSA_STATUS_ERROR_INVALID_ISA => c"HSA_STATUS_ERROR_INVALID_ISA: The instruction set architecture is invalid.",
        HSA_STATUS_ERROR_INVALID_ISA_NAME => c"HSA_STATUS_ERROR_INVALID_ISA_NAME: The instruction set architecture name is invalid.",
        HSA_STATUS_ERROR_INVALID_CODE_OBJECT => c"HSA_STATUS_ERROR_INVALID_CODE_OBJECT: The code object is invalid.",
        HSA_STATUS_ERROR_INVALID_EXECUTABLE => c"HSA_STATUS_ERROR_INVALID_EXECUTABLE: The executable is invalid.",
        HSA_STATUS_ERROR_FROZEN_EXECUTABLE => c"HSA_STATUS_ERROR_FROZEN_EXECUTABLE: The executable is frozen.",
        HSA_STATUS_ERROR_INVALID_SYMBOL_NAME => c"HSA_STATUS_ERROR_INVALID_SYMBOL_NAME: There is no symbol with the given name.",
        HSA_STATUS_ERROR_VARIABLE_ALREADY_DEFINED => c"HSA_STATUS_ERROR_VARIABLE_ALREADY_DEFINED: The variable is already defined.",
        HSA_STATUS_ERROR_VARIABLE_UNDEFINED => c"HSA_STATUS_ERROR_VARIABLE_UNDEFINED: The variable is undefined.",
        HSA_STATUS_ERROR_EXCEPTION => c"HSA_STATUS_ERROR_EXCEPTION: An HSAIL operation resulted in a hardware exception.",
        HSA_STATUS_ERROR_INVALID_CODE_SYMBOL => c"HSA_STATUS_ERROR_INVALID_CODE_SYMBOL: The code object symbol is invalid.",
        HSA_STATUS_ERROR_INVALID_EXECUTABLE_SYMBOL => c"HSA_STATUS_ERROR_INVALID_EXECUTABLE_SYMBOL: The executable symbol is invalid.",
        HSA_STATUS_ERROR_INVALID_FILE => c"HSA_STATUS_ERROR_INVALID_FILE: The file descriptor is invalid.",
        HSA_STATUS_ERROR_INVALID_CODE_OBJECT_READER => c"HSA_STATUS_ERROR_INVALID_CODE_OBJECT_READER: The code object reader is invalid.",
        HSA_STATUS_ERROR_INVALID_CACHE => c"HSA_STATUS_ERROR_INVALID_CACHE: The cache is invalid.",
        HSA_STATUS_ERROR_INVALID_WAVEFRONT => c"HSA_STATUS_ERROR_INVALID_WAVEFRONT: The wavefront is invalid.",
        HSA_STATUS_ERROR_INVALID_SIGNAL_GROUP => c"HSA_STATUS_ERROR_INVALID_SIGNAL_GROUP: The signal group is invalid.",
        HSA_STATUS_ERROR_INVALID_RUNTIME_STATE => c"HSA_STATUS_ERROR_INVALID_RUNTIME_STATE: The HSA runtime is not in the configuration state.",
        HSA_STATUS_ERROR_FATAL => c"HSA_STATUS_ERROR_FATAL: The queue received an error that may require process termination.",
        _ => return None,
    })
}

// ---------------------------------------------------------------------------------------------
// Agents, caches, ISAs

type AgentCallback = Option<unsafe extern "C" fn(hsa_agent_t, *mut c_void) -> hsa_status_t>;

/// Calls `callback` for each item until it returns something other than success.
pub(crate) fn for_each<T: Copy>(
    items: impl IntoIterator<Item = T>,
    callback: impl Fn(T) -> hsa_status_t,
) -> HsaResult {
    for item in items {
        let status = callback(item);
        if status != HSA_STATUS_SUCCESS {
            return Err(status);
        }
    }
    Ok(())
}

pub(crate) unsafe extern "C" fn hsa_iterate_agents(
    callback: AgentCallback,
    data: *mut c_void,
) -> hsa_status_t {
    with_runtime(|rt| {
        let callback = callback.ok_or(HSA_STATUS_ERROR_INVALID_ARGUMENT)?;
        for_each(rt.topology.agents.iter().map(|a| a.handle), |handle| {
            // SAFETY: the application's callback, called with (agent, data) per the contract of
            // hsa_iterate_agents.
            unsafe { callback(hsa_agent_t { handle }, data) }
        })
    })
}

pub(crate) unsafe extern "C" fn hsa_agent_get_info(
    agent: hsa_agent_t,
    attribute: hsa_agent_info_t,
    value: *mut c_void,
) -> hsa_status_t {
    with_runtime(|rt| {
        let index = rt.agent(agent.handle)?;
        let bytes = info::agent(rt, index, attribute)?;
        // SAFETY: HSA contract: `value` has room for the attribute's type.
        unsafe { put_bytes(value, &bytes) }
    })
}

pub(crate) unsafe extern "C" fn hsa_agent_get_exception_policies(
    agent: hsa_agent_t,
    _profile: hsa_profile_t,
    mask: *mut u16,
) -> hsa_status_t {
    with_runtime(|rt| {
        rt.agent(agent.handle)?;
        // SAFETY: HSA contract: `mask` points to a u16.
        unsafe { put(mask, 0) }
    })
}

pub(crate) unsafe extern "C" fn hsa_agent_iterate_caches(
    agent: hsa_agent_t,
    callback: Option<unsafe extern "C" fn(hsa_cache_t, *mut c_void) -> hsa_status_t>,
    _data: *mut c_void,
) -> hsa_status_t {
    // Caches are not modelled: the iteration is empty.
    with_runtime(|rt| {
        rt.agent(agent.handle)?;
        callback
            .map(|_| ())
            .ok_or(HSA_STATUS_ERROR_INVALID_ARGUMENT)
    })
}

pub(crate) unsafe extern "C" fn hsa_cache_get_info(
    _cache: hsa_cache_t,
    _attribute: hsa_cache_info_t,
    _value: *mut c_void,
) -> hsa_status_t {
    with_runtime(|_| Err(HSA_STATUS_ERROR_INVALID_CACHE))
}

pub(crate) unsafe extern "C" fn hsa_agent_iterate_isas(
    agent: hsa_agent_t,
    callback: Option<unsafe extern "C" fn(hsa_isa_t, *mut c_void) -> hsa_status_t>,
    data: *mut c_void,
) -> hsa_status_t {
    with_runtime(|rt| {
        let index = rt.agent(agent.handle)?;
        let callback = callback.ok_or(HSA_STATUS_ERROR_INVALID_ARGUMENT)?;
        let isas = (rt.topology.agents[index].kind == AgentKind::Gpu).then_some(info::ISA_HANDLE);
        for_each(isas, |handle| {
            // SAFETY: the application's callback, called with (isa, data) per the contract.
            unsafe { callback(hsa_isa_t { handle }, data) }
        })
    })
}

fn check_isa(isa: hsa_isa_t) -> HsaResult {
    if isa.handle == info::ISA_HANDLE {
        Ok(())
    } else {
        Err(HSA_STATUS_ERROR_INVALID_ISA)
    }
}

pub(crate) unsafe extern "C" fn hsa_isa_from_name(
    name: *const c_char,
    isa: *mut hsa_isa_t,
) -> hsa_status_t {
    with_runtime(|_| {
        if name.is_null() {
            return Err(HSA_STATUS_ERROR_INVALID_ARGUMENT);
        }
        // SAFETY: HSA contract: `name` is a NUL-terminated string.
        let name = unsafe { CStr::from_ptr(name) };
        if name.to_bytes() != info::ISA_NAME.as_bytes() {
            return Err(HSA_STATUS_ERROR_INVALID_ISA_NAME);
        }
        // SAFETY: HSA contract: `isa` points to an hsa_isa_t.
        unsafe {
            put(
                isa,
                hsa_isa_t {
                    handle: info::ISA_HANDLE,
                },
            )
        }
    })
}

pub(crate) unsafe extern "C" fn hsa_isa_get_info(
    isa: hsa_isa_t,
    attribute: hsa_isa_info_t,
    index: u32,
    value: *mut c_void,
) -> hsa_status_t {
    with_runtime(|_| {
        check_isa(isa)?;
        if index != 0 {
            return Err(HSA_STATUS_ERROR_INVALID_INDEX);
        }
        let bytes = info::isa(attribute)?;
        // SAFETY: HSA contract: `value` has room for the attribute's type.
        unsafe { put_bytes(value, &bytes) }
    })
}

pub(crate) unsafe extern "C" fn hsa_isa_get_info_alt(
    isa: hsa_isa_t,
    attribute: hsa_isa_info_t,
    value: *mut c_void,
) -> hsa_status_t {
    with_runtime(|_| {
        check_isa(isa)?;
        let bytes = info::isa(attribute)?;
        // SAFETY: HSA contract: `value` has room for the attribute's type.
        unsafe { put_bytes(value, &bytes) }
    })
}

pub(crate) unsafe extern "C" fn hsa_isa_compatible(
    code_object_isa: hsa_isa_t,
    agent_isa: hsa_isa_t,
    result: *mut bool,
) -> hsa_status_t {
    with_runtime(|_| {
        check_isa(code_object_isa)?;
        check_isa(agent_isa)?;
        // SAFETY: HSA contract: `result` points to a bool.
        unsafe { put(result, true) }
    })
}

pub(crate) unsafe extern "C" fn hsa_isa_get_exception_policies(
    isa: hsa_isa_t,
    _profile: hsa_profile_t,
    mask: *mut u16,
) -> hsa_status_t {
    with_runtime(|_| {
        check_isa(isa)?;
        // SAFETY: HSA contract: `mask` points to a u16.
        unsafe { put(mask, 0) }
    })
}

pub(crate) unsafe extern "C" fn hsa_isa_get_round_method(
    isa: hsa_isa_t,
    _fp_type: hsa_fp_type_t,
    _flush_mode: hsa_flush_mode_t,
    round_method: *mut hsa_round_method_t,
) -> hsa_status_t {
    with_runtime(|_| {
        check_isa(isa)?;
        // SAFETY: HSA contract: `round_method` points to an hsa_round_method_t.
        unsafe { put(round_method, HSA_ROUND_METHOD_SINGLE) }
    })
}

pub(crate) unsafe extern "C" fn hsa_isa_iterate_wavefronts(
    isa: hsa_isa_t,
    callback: Option<unsafe extern "C" fn(hsa_wavefront_t, *mut c_void) -> hsa_status_t>,
    data: *mut c_void,
) -> hsa_status_t {
    with_runtime(|_| {
        check_isa(isa)?;
        let callback = callback.ok_or(HSA_STATUS_ERROR_INVALID_ARGUMENT)?;
        for_each([info::WAVEFRONT_HANDLE], |handle| {
            // SAFETY: the application's callback, called with (wavefront, data).
            unsafe { callback(hsa_wavefront_t { handle }, data) }
        })
    })
}

pub(crate) unsafe extern "C" fn hsa_wavefront_get_info(
    wavefront: hsa_wavefront_t,
    attribute: hsa_wavefront_info_t,
    value: *mut c_void,
) -> hsa_status_t {
    with_runtime(|_| {
        if wavefront.handle != info::WAVEFRONT_HANDLE {
            return Err(HSA_STATUS_ERROR_INVALID_WAVEFRONT);
        }
        let bytes = info::wavefront(attribute)?;
        // SAFETY: HSA contract: `value` has room for the attribute's type.
        unsafe { put_bytes(value, &bytes) }
    })
}

// ---------------------------------------------------------------------------------------------
// Queues

/// Shared body of `hsa_queue_create` and `hsa_amd_queue_intercept_create`.
pub(crate) fn create_queue(
    intercept: bool,
    agent: hsa_agent_t,
    size: u32,
    queue_type: hsa_queue_type32_t,
    callback: QueueCallback,
    data: *mut c_void,
    queue: *mut *mut hsa_queue_t,
) -> hsa_status_t {
    with_runtime(|rt| {
        if queue.is_null() {
            return Err(HSA_STATUS_ERROR_INVALID_ARGUMENT);
        }
        let params = QueueParams {
            agent: rt.agent(agent.handle)?,
            size: crate::queue::hardware_queue_size(size),
            queue_type,
            callback,
            callback_data: data as usize,
        };
        let created = if intercept {
            crate::queue::create_intercept_queue(rt, &params)?
        } else {
            crate::queue::create_hardware_queue(rt, &params)?
        };
        // SAFETY: HSA contract: `queue` points to storage for an `hsa_queue_t*` (checked non-null).
        unsafe { put(queue, created.hsa_ptr()) }
    })
}

#[allow(clippy::too_many_arguments)]
pub(crate) unsafe extern "C" fn hsa_queue_create(
    agent: hsa_agent_t,
    size: u32,
    queue_type: hsa_queue_type32_t,
    callback: QueueCallback,
    data: *mut c_void,
    _private_segment_size: u32,
    _group_segment_size: u32,
    queue: *mut *mut hsa_queue_t,
) -> hsa_status_t {
    create_queue(false, agent, size, queue_type, callback, data, queue)
}

pub(crate) unsafe extern "C" fn hsa_soft_queue_create(
    region: hsa_region_t,
    size: u32,
    queue_type: hsa_queue_type32_t,
    _features: u32,
    doorbell_signal: hsa_signal_t,
    queue: *mut *mut hsa_queue_t,
) -> hsa_status_t {
    with_runtime(|rt| {
        if queue.is_null() {
            return Err(HSA_STATUS_ERROR_INVALID_ARGUMENT);
        }
        let pool = rt
            .topology
            .pool_index(region.handle)
            .ok_or(HSA_STATUS_ERROR_INVALID_REGION)?;
        let doorbell = rt.signal(doorbell_signal.handle)?;
        let params = QueueParams {
            agent: rt.topology.pools[pool].agent,
            size,
            queue_type,
            callback: None,
            callback_data: 0,
        };
        let created = crate::queue::create_soft_queue(rt, &params, doorbell)?;
        // SAFETY: HSA contract: `queue` points to storage for an `hsa_queue_t*`.
        unsafe { put(queue, created.hsa_ptr()) }
    })
}

pub(crate) unsafe extern "C" fn hsa_queue_destroy(queue: *mut hsa_queue_t) -> hsa_status_t {
    with_runtime(|rt| {
        if queue.is_null() {
            return Err(HSA_STATUS_ERROR_INVALID_ARGUMENT);
        }
        let q = rt
            .unregister_queue(queue)
            .ok_or(HSA_STATUS_ERROR_INVALID_QUEUE)?;
        stop_queue(rt, &q);
        crate::queue::revoke_ring(&q);
        rt.keep_destroyed(q);
        Ok(())
    })
}

pub(crate) unsafe extern "C" fn hsa_queue_inactivate(queue: *mut hsa_queue_t) -> hsa_status_t {
    with_runtime(|rt| {
        rt.queue(queue)?.inactivate();
        Ok(())
    })
}

/// Runs `f` on the queue behind `queue`; an unknown queue (or no runtime) yields `fallback`.
/// A destroyed queue's indices are still there, as the memory of a real queue stays readable
/// a while after its destroy: the index entries act on them as ROCm's act on that memory (its
/// ring is gone, see `Ring::revoke`).
fn with_queue<T>(queue: *const hsa_queue_t, fallback: T, f: impl FnOnce(&Queue) -> T) -> T {
    let run = || match runtime::current().and_then(|rt| rt.queue_or_destroyed(queue)) {
        Ok(q) => Some(f(&q)),
        Err(_) => None,
    };
    guard_or(None, run).unwrap_or(fallback)
}

macro_rules! queue_index_entries {
    (load: [$($load:ident($lfield:ident, $lorder:ident);)*]
     store: [$($store:ident($sfield:ident, $sorder:ident);)*]
     add: [$($add:ident($aorder:ident);)*]
     cas: [$($cas:ident($corder:ident, $cfail:ident);)*]) => {
        $(pub(crate) unsafe extern "C" fn $load(queue: *const hsa_queue_t) -> u64 {
            with_queue(queue, 0, |q| q.$lfield.load(Ordering::$lorder))
        })*
        $(pub(crate) unsafe extern "C" fn $store(queue: *const hsa_queue_t, value: u64) {
            with_queue(queue, (), |q| q.$sfield.store(value, Ordering::$sorder))
        })*
        $(pub(crate) unsafe extern "C" fn $add(queue: *const hsa_queue_t, value: u64) -> u64 {
            with_queue(queue, 0, |q| q.write_index.fetch_add(value, Ordering::$aorder))
        })*
        $(pub(crate) unsafe extern "C" fn $cas(queue: *const hsa_queue_t, expected: u64, value: u64) -> u64 {
            with_queue(queue, 0, |q| {
                match q.write_index.compare_exchange(expected, value, Ordering::$corder, Ordering::$cfail) {
                    Ok(v) | Err(v) => v,
                }
            })
        })*
    };
}

queue_index_entries! {
    load: [
        hsa_queue_load_read_index_scacquire(read_index, Acquire);
        hsa_queue_load_read_index_relaxed(read_index, Relaxed);
        hsa_queue_load_write_index_scacquire(write_index, Acquire);
        hsa_queue_load_write_index_relaxed(write_index, Relaxed);
    ]
    store: [
        hsa_queue_store_write_index_relaxed(write_index, Relaxed);
        hsa_queue_store_write_index_screlease(write_index, Release);
        hsa_queue_store_read_index_relaxed(read_index, Relaxed);
        hsa_queue_store_read_index_screlease(read_index, Release);
    ]
    add: [
        hsa_queue_add_write_index_scacq_screl(AcqRel);
        hsa_queue_add_write_index_scacquire(Acquire);
        hsa_queue_add_write_index_relaxed(Relaxed);
        hsa_queue_add_write_index_screlease(Release);
    ]
    cas: [
        hsa_queue_cas_write_index_scacq_screl(AcqRel, Acquire);
        hsa_queue_cas_write_index_scacquire(Acquire, Acquire);
        hsa_queue_cas_write_index_relaxed(Relaxed, Relaxed);
        hsa_queue_cas_write_index_screlease(Release, Relaxed);
    ]
}

// ---------------------------------------------------------------------------------------------
// Regions and memory

pub(crate) unsafe extern "C" fn hsa_agent_iterate_regions(
    agent: hsa_agent_t,
    callback: Option<unsafe extern "C" fn(hsa_region_t, *mut c_void) -> hsa_status_t>,
    data: *mut c_void,
) -> hsa_status_t {
    with_runtime(|rt| {
        let index = rt.agent(agent.handle)?;
        let callback = callback.ok_or(HSA_STATUS_ERROR_INVALID_ARGUMENT)?;
        let pools = &rt.topology.agents[index].pools;
        for_each(
            pools.iter().map(|&p| rt.topology.pools[p].handle),
            |handle| {
                // SAFETY: the application's callback, called with (region, data) per the contract.
                unsafe { callback(hsa_region_t { handle }, data) }
            },
        )
    })
}

pub(crate) unsafe extern "C" fn hsa_region_get_info(
    region: hsa_region_t,
    attribute: hsa_region_info_t,
    value: *mut c_void,
) -> hsa_status_t {
    with_runtime(|rt| {
        let index = rt
            .topology
            .pool_index(region.handle)
            .ok_or(HSA_STATUS_ERROR_INVALID_REGION)?;
        let bytes = info::region(rt, index, attribute)?;
        // SAFETY: HSA contract: `value` has room for the attribute's type.
        unsafe { put_bytes(value, &bytes) }
    })
}

pub(crate) unsafe extern "C" fn hsa_memory_register(ptr: *mut c_void, size: usize) -> hsa_status_t {
    // Every agent already reaches all host memory; registration only validates.
    with_runtime(|_| {
        if ptr.is_null() && size > 0 {
            return Err(HSA_STATUS_ERROR_INVALID_ARGUMENT);
        }
        Ok(())
    })
}

pub(crate) unsafe extern "C" fn hsa_memory_deregister(
    ptr: *mut c_void,
    size: usize,
) -> hsa_status_t {
    // SAFETY: same contract as hsa_memory_register.
    unsafe { hsa_memory_register(ptr, size) }
}

/// Shared body of the allocating entry points.
pub(crate) fn allocate(rt: &Runtime, pool: usize, size: usize, ptr: *mut *mut c_void) -> HsaResult {
    if ptr.is_null() {
        return Err(HSA_STATUS_ERROR_INVALID_ARGUMENT);
    }
    let memory = rt.memory.allocate(&rt.topology, pool, size)?;
    // SAFETY: `ptr` is the caller's out pointer (checked non-null), per the API contract.
    unsafe { put(ptr, memory.cast::<c_void>()) }
}

pub(crate) unsafe extern "C" fn hsa_memory_allocate(
    region: hsa_region_t,
    size: usize,
    ptr: *mut *mut c_void,
) -> hsa_status_t {
    with_runtime(|rt| {
        let pool = rt
            .topology
            .pool_index(region.handle)
            .ok_or(HSA_STATUS_ERROR_INVALID_REGION)?;
        allocate(rt, pool, size, ptr)
    })
}

pub(crate) unsafe extern "C" fn hsa_memory_free(ptr: *mut c_void) -> hsa_status_t {
    with_runtime(|rt| {
        if ptr.is_null() {
            return Ok(());
        }
        rt.memory.free(&rt.topology, ptr as usize)
    })
}

pub(crate) unsafe extern "C" fn hsa_memory_copy(
    dst: *mut c_void,
    src: *const c_void,
    size: usize,
) -> hsa_status_t {
    with_runtime(|_| {
        if dst.is_null() || src.is_null() {
            return Err(HSA_STATUS_ERROR_INVALID_ARGUMENT);
        }
        crate::faults::check(crate::faults::Fault::Copy)?;
        // SAFETY: HSA contract: both ranges are `size` bytes of accessible memory; `copy`
        // tolerates overlap.
        unsafe { std::ptr::copy(src.cast::<u8>(), dst.cast::<u8>(), size) };
        Ok(())
    })
}

pub(crate) unsafe extern "C" fn hsa_memory_assign_agent(
    ptr: *mut c_void,
    agent: hsa_agent_t,
    _access: hsa_access_permission_t,
) -> hsa_status_t {
    with_runtime(|rt| {
        if ptr.is_null() {
            return Err(HSA_STATUS_ERROR_INVALID_ARGUMENT);
        }
        rt.agent(agent.handle).map(|_| ())
    })
}

// ---------------------------------------------------------------------------------------------
// Signals

/// Checks a consumer list and creates a signal (shared with `hsa_amd_signal_create`, whose
/// `HSA_AMD_SIGNAL_AMD_GPU_ONLY` attribute is `gpu_only`).
pub(crate) fn create_signal(
    rt: &Runtime,
    initial: hsa_signal_value_t,
    num_consumers: u32,
    consumers: *const hsa_agent_t,
    gpu_only: bool,
    signal: *mut hsa_signal_t,
) -> HsaResult {
    if signal.is_null() {
        return Err(HSA_STATUS_ERROR_INVALID_ARGUMENT);
    }
    crate::faults::check(crate::faults::Fault::SignalCreate)?;
    // SAFETY: HSA contract: `consumers` lists `num_consumers` agents.
    let consumers = unsafe { read_array(consumers, num_consumers as usize) }?;
    let mut host_consumes = consumers.is_empty();
    for (i, consumer) in consumers.iter().enumerate() {
        // hsa.h: a consumer named twice is an invalid argument.
        if consumers[..i].iter().any(|c| c.handle == consumer.handle) {
            return Err(HSA_STATUS_ERROR_INVALID_ARGUMENT);
        }
        let index = rt.agent(consumer.handle)?;
        host_consumes |= rt.topology.agents[index].kind == AgentKind::Cpu;
    }
    let created = rt.create_signal(initial);
    if gpu_only || !host_consumes {
        created.set_device_only();
    }
    // SAFETY: `signal` is the caller's out pointer (checked non-null).
    unsafe {
        put(
            signal,
            hsa_signal_t {
                handle: created.handle(),
            },
        )
    }
}

pub(crate) unsafe extern "C" fn hsa_signal_create(
    initial_value: hsa_signal_value_t,
    num_consumers: u32,
    consumers: *const hsa_agent_t,
    signal: *mut hsa_signal_t,
) -> hsa_status_t {
    with_runtime(|rt| create_signal(rt, initial_value, num_consumers, consumers, false, signal))
}

pub(crate) unsafe extern "C" fn hsa_signal_destroy(signal: hsa_signal_t) -> hsa_status_t {
    with_runtime(|rt| {
        // hsa.h: a zero handle is an invalid argument (any other unknown one an invalid signal).
        if signal.handle == 0 {
            return Err(HSA_STATUS_ERROR_INVALID_ARGUMENT);
        }
        rt.destroy_signal(signal.handle)
    })
}

/// Runs `f` on the signal behind `signal`; an invalid handle (or no runtime) yields `fallback`.
fn with_signal<T>(signal: hsa_signal_t, fallback: T, f: impl FnOnce(&Arc<Signal>) -> T) -> T {
    let run = || match runtime::current().and_then(|rt| rt.signal(signal.handle)) {
        Ok(s) => Some(f(&s)),
        Err(_) => None,
    };
    guard_or(None, run).unwrap_or(fallback)
}

macro_rules! signal_entries {
    (load: [$($load:ident($lorder:ident);)*]
     store: [$($store:ident($sorder:ident);)*]
     silent: [$($silent:ident($qorder:ident);)*]
     rmw: [$($rmw:ident($op:ident, $rorder:ident);)*]
     exchange: [$($xchg:ident($xorder:ident);)*]
     cas: [$($cas:ident($corder:ident);)*]
     wait: [$($wait:ident($worder:ident);)*]) => {
        $(pub(crate) unsafe extern "C" fn $load(signal: hsa_signal_t) -> hsa_signal_value_t {
            with_signal(signal, 0, |s| s.load(Order::$lorder))
        })*
        $(pub(crate) unsafe extern "C" fn $store(signal: hsa_signal_t, value: hsa_signal_value_t) {
            with_signal(signal, (), |s| s.store(value, Order::$sorder))
        })*
        $(pub(crate) unsafe extern "C" fn $silent(signal: hsa_signal_t, value: hsa_signal_value_t) {
            with_signal(signal, (), |s| s.silent_store(value, Order::$qorder))
        })*
        $(pub(crate) unsafe extern "C" fn $rmw(signal: hsa_signal_t, value: hsa_signal_value_t) {
            with_signal(signal, (), |s| { s.rmw(Rmw::$op, value, Order::$rorder); })
        })*
        $(pub(crate) unsafe extern "C" fn $xchg(signal: hsa_signal_t, value: hsa_signal_value_t) -> hsa_signal_value_t {
            with_signal(signal, 0, |s| s.rmw(Rmw::Exchange, value, Order::$xorder))
        })*
        $(pub(crate) unsafe extern "C" fn $cas(
            signal: hsa_signal_t,
            expected: hsa_signal_value_t,
            value: hsa_signal_value_t,
        ) -> hsa_signal_value_t {
            with_signal(signal, 0, |s| s.cas(expected, value, Order::$corder))
        })*
        $(pub(crate) unsafe extern "C" fn $wait(
            signal: hsa_signal_t,
            condition: hsa_signal_condition_t,
            compare_value: hsa_signal_value_t,
            timeout_hint: u64,
            wait_state_hint: hsa_wait_state_t,
        ) -> hsa_signal_value_t {
            with_signal(signal, 0, |s| {
                s.wait(condition, compare_value, deadline_after(timeout_hint), wait_state_hint, Order::$worder)
            })
        })*
    };
}

signal_entries! {
    load: [
        hsa_signal_load_relaxed(Relaxed);
        hsa_signal_load_scacquire(Acquire);
    ]
    store: [
        hsa_signal_store_relaxed(Relaxed);
        hsa_signal_store_screlease(Release);
    ]
    silent: [
        hsa_signal_silent_store_relaxed(Relaxed);
        hsa_signal_silent_store_screlease(Release);
    ]
    rmw: [
        hsa_signal_and_relaxed(And, Relaxed);
        hsa_signal_and_scacquire(And, Acquire);
        hsa_signal_and_screlease(And, Release);
        hsa_signal_and_scacq_screl(And, AcqRel);
        hsa_signal_or_relaxed(Or, Relaxed);
        hsa_signal_or_scacquire(Or, Acquire);
        hsa_signal_or_screlease(Or, Release);
        hsa_signal_or_scacq_screl(Or, AcqRel);
        hsa_signal_xor_relaxed(Xor, Relaxed);
        hsa_signal_xor_scacquire(Xor, Acquire);
        hsa_signal_xor_screlease(Xor, Release);
        hsa_signal_xor_scacq_screl(Xor, AcqRel);
        hsa_signal_add_relaxed(Add, Relaxed);
        hsa_signal_add_scacquire(Add, Acquire);
        hsa_signal_add_screlease(Add, Release);
        hsa_signal_add_scacq_screl(Add, AcqRel);
        hsa_signal_subtract_relaxed(Subtract, Relaxed);
        hsa_signal_subtract_scacquire(Subtract, Acquire);
        hsa_signal_subtract_screlease(Subtract, Release);
        hsa_signal_subtract_scacq_screl(Subtract, AcqRel);
    ]
    exchange: [
        hsa_signal_exchange_relaxed(Relaxed);
        hsa_signal_exchange_scacquire(Acquire);
        hsa_signal_exchange_screlease(Release);
        hsa_signal_exchange_scacq_screl(AcqRel);
    ]
    cas: [
        hsa_signal_cas_relaxed(Relaxed);
        hsa_signal_cas_scacquire(Acquire);
        hsa_signal_cas_screlease(Release);
        hsa_signal_cas_scacq_screl(AcqRel);
    ]
    wait: [
        hsa_signal_wait_relaxed(Relaxed);
        hsa_signal_wait_scacquire(Acquire);
    ]
}

pub(crate) unsafe extern "C" fn hsa_signal_group_create(
    num_signals: u32,
    signals: *const hsa_signal_t,
    num_consumers: u32,
    consumers: *const hsa_agent_t,
    signal_group: *mut hsa_signal_group_t,
) -> hsa_status_t {
    with_runtime(|rt| {
        // hsa.h also calls no consumers (and a null list) an invalid argument; ROCm accepts
        // them, and so does softhsa, which stands in for ROCm: a program that runs there runs
        // here.
        if num_signals == 0 || signal_group.is_null() {
            return Err(HSA_STATUS_ERROR_INVALID_ARGUMENT);
        }
        // SAFETY: HSA contract: `signals` lists `num_signals` signals.
        let handles = unsafe { read_array(signals, num_signals as usize) }?;
        // SAFETY: HSA contract: `consumers` lists `num_consumers` agents.
        let consumers = unsafe { read_array(consumers, num_consumers as usize) }?;
        for consumer in consumers {
            rt.agent(consumer.handle)?;
        }
        let members = handles
            .iter()
            .map(|s| rt.signal(s.handle))
            .collect::<Result<Vec<_>, _>>()?;
        let handle = rt.add_signal_group(Arc::from(members));
        // SAFETY: `signal_group` is the caller's out pointer (checked non-null).
        unsafe { put(signal_group, hsa_signal_group_t { handle }) }
    })
}

pub(crate) unsafe extern "C" fn hsa_signal_group_destroy(
    signal_group: hsa_signal_group_t,
) -> hsa_status_t {
    with_runtime(|rt| {
        if rt.remove_signal_group(signal_group.handle) {
            Ok(())
        } else {
            Err(HSA_STATUS_ERROR_INVALID_SIGNAL_GROUP)
        }
    })
}

fn group_wait_any(
    signal_group: hsa_signal_group_t,
    conditions: *const hsa_signal_condition_t,
    compare_values: *const hsa_signal_value_t,
    wait_state_hint: hsa_wait_state_t,
    signal: *mut hsa_signal_t,
    value: *mut hsa_signal_value_t,
    order: Order,
) -> hsa_status_t {
    with_runtime(|rt| {
        let members = rt
            .signal_group(signal_group.handle)
            .ok_or(HSA_STATUS_ERROR_INVALID_SIGNAL_GROUP)?;
        if signal.is_null() || value.is_null() || conditions.is_null() || compare_values.is_null() {
            return Err(HSA_STATUS_ERROR_INVALID_ARGUMENT);
        }
        // SAFETY: HSA contract: one condition per member of the group.
        let conds = unsafe { read_array(conditions, members.len()) }?;
        // SAFETY: HSA contract: one compare value per member of the group.
        let values = unsafe { read_array(compare_values, members.len()) }?;
        let waits: Vec<WaitCondition> = members
            .iter()
            .zip(conds.iter().zip(values.iter()))
            .map(|(s, (&cond, &compare))| WaitCondition {
                signal: s.clone(),
                cond,
                compare,
            })
            .collect();
        let (index, observed) =
            wait_any(&waits, None, wait_state_hint, order).ok_or(HSA_STATUS_ERROR)?;
        // SAFETY: both out pointers are the caller's (checked non-null).
        unsafe {
            put(
                signal,
                hsa_signal_t {
                    handle: members[index].handle(),
                },
            )?;
            put(value, observed)
        }
    })
}

pub(crate) unsafe extern "C" fn hsa_signal_group_wait_any_scacquire(
    signal_group: hsa_signal_group_t,
    conditions: *const hsa_signal_condition_t,
    compare_values: *const hsa_signal_value_t,
    wait_state_hint: hsa_wait_state_t,
    signal: *mut hsa_signal_t,
    value: *mut hsa_signal_value_t,
) -> hsa_status_t {
    group_wait_any(
        signal_group,
        conditions,
        compare_values,
        wait_state_hint,
        signal,
        value,
        Order::Acquire,
    )
}

pub(crate) unsafe extern "C" fn hsa_signal_group_wait_any_relaxed(
    signal_group: hsa_signal_group_t,
    conditions: *const hsa_signal_condition_t,
    compare_values: *const hsa_signal_value_t,
    wait_state_hint: hsa_wait_state_t,
    signal: *mut hsa_signal_t,
    value: *mut hsa_signal_value_t,
) -> hsa_status_t {
    group_wait_any(
        signal_group,
        conditions,
        compare_values,
        wait_state_hint,
        signal,
        value,
        Order::Relaxed,
    )
}

// ---------------------------------------------------------------------------------------------
// Code objects and executables: softhsa loads its own host code objects (see
// `crate::executable`), from memory or from a file; the older code object API is not supported.

pub(crate) use crate::executable::{
    hsa_code_object_reader_create_from_file, hsa_code_object_reader_create_from_memory,
    hsa_code_object_reader_destroy, hsa_executable_create, hsa_executable_create_alt,
    hsa_executable_destroy, hsa_executable_freeze, hsa_executable_get_info,
    hsa_executable_get_symbol, hsa_executable_get_symbol_by_name,
    hsa_executable_iterate_agent_symbols, hsa_executable_iterate_program_symbols,
    hsa_executable_iterate_symbols, hsa_executable_load_agent_code_object,
    hsa_executable_symbol_get_info, hsa_executable_validate, hsa_executable_validate_alt,
};

type SerializeAlloc =
    Option<unsafe extern "C" fn(usize, hsa_callback_data_t, *mut *mut c_void) -> hsa_status_t>;
type CodeSymbolCallback =
    Option<unsafe extern "C" fn(hsa_code_object_t, hsa_code_symbol_t, *mut c_void) -> hsa_status_t>;

unsupported_entries! {
    hsa_code_object_serialize(hsa_code_object_t, SerializeAlloc, hsa_callback_data_t, *const c_char, *mut *mut c_void, *mut usize);
    hsa_code_object_deserialize(*mut c_void, usize, *const c_char, *mut hsa_code_object_t);
    hsa_code_object_destroy(hsa_code_object_t);
    hsa_code_object_get_info(hsa_code_object_t, hsa_code_object_info_t, *mut c_void);
    hsa_code_object_get_symbol(hsa_code_object_t, *const c_char, *mut hsa_code_symbol_t);
    hsa_code_object_get_symbol_from_name(hsa_code_object_t, *const c_char, *const c_char, *mut hsa_code_symbol_t);
    hsa_code_symbol_get_info(hsa_code_symbol_t, hsa_code_symbol_info_t, *mut c_void);
    hsa_code_object_iterate_symbols(hsa_code_object_t, CodeSymbolCallback, *mut c_void);
    hsa_executable_load_code_object(hsa_executable_t, hsa_agent_t, hsa_code_object_t, *const c_char);
    hsa_executable_load_program_code_object(hsa_executable_t, hsa_code_object_reader_t, *const c_char, *mut hsa_loaded_code_object_t);
    hsa_executable_global_variable_define(hsa_executable_t, *const c_char, *mut c_void);
    hsa_executable_agent_global_variable_define(hsa_executable_t, hsa_agent_t, *const c_char, *mut c_void);
    hsa_executable_readonly_variable_define(hsa_executable_t, hsa_agent_t, *const c_char, *mut c_void);
}
