//! Entry points of the AMD extension table (`AmdExtTable`).

use super::core::{QueueCallback, allocate, create_queue, create_signal, for_each};
use super::{
    HsaResult, guard_or, info, put, put_bytes, read_array, unsupported_entries, with_runtime,
};
use crate::copy::CopyJob;
use crate::handlers::SignalHandler;
use crate::memory::{Allocation, Backing};
use crate::queue::QueueKind;
use crate::runtime::{self, Runtime};
use crate::signal::{Order, WaitCondition, condition_holds, wait_any};
use crate::time::deadline_after;
use crate::topology::AgentKind;
use hsa_sys::*;
use std::ffi::{c_int, c_void};
use std::mem::{offset_of, size_of};
use std::sync::atomic::Ordering;

// ---------------------------------------------------------------------------------------------
// Coherency and profiling

pub(crate) unsafe extern "C" fn hsa_amd_coherency_get_type(
    agent: hsa_agent_t,
    coherency_type: *mut hsa_amd_coherency_type_t,
) -> hsa_status_t {
    with_runtime(|rt| {
        rt.gpu_agent(agent.handle)?;
        // SAFETY: HSA contract: `coherency_type` points to an hsa_amd_coherency_type_t.
        unsafe { put(coherency_type, HSA_AMD_COHERENCY_TYPE_COHERENT) }
    })
}

pub(crate) unsafe extern "C" fn hsa_amd_coherency_set_type(
    agent: hsa_agent_t,
    coherency_type: hsa_amd_coherency_type_t,
) -> hsa_status_t {
    // Host memory is always coherent; both settings are accepted.
    with_runtime(|rt| {
        rt.gpu_agent(agent.handle)?;
        if coherency_type > HSA_AMD_COHERENCY_TYPE_NONCOHERENT {
            return Err(HSA_STATUS_ERROR_INVALID_ARGUMENT);
        }
        Ok(())
    })
}

pub(crate) unsafe extern "C" fn hsa_amd_profiling_set_profiler_enabled(
    queue: *mut hsa_queue_t,
    enable: c_int,
) -> hsa_status_t {
    with_runtime(|rt| {
        rt.queue(queue)?.set_profiling(enable != 0);
        Ok(())
    })
}

pub(crate) unsafe extern "C" fn hsa_amd_profiling_async_copy_enable(enable: bool) -> hsa_status_t {
    with_runtime(|rt| {
        rt.async_copy_profiling.store(enable, Ordering::Release);
        Ok(())
    })
}

pub(crate) unsafe extern "C" fn hsa_amd_profiling_get_dispatch_time(
    agent: hsa_agent_t,
    signal: hsa_signal_t,
    time: *mut hsa_amd_profiling_dispatch_time_t,
) -> hsa_status_t {
    with_runtime(|rt| {
        rt.gpu_agent(agent.handle)?;
        let (start, end) = rt.signal(signal.handle)?.dispatch_time();
        // SAFETY: HSA contract: `time` points to an hsa_amd_profiling_dispatch_time_t.
        unsafe { put(time, hsa_amd_profiling_dispatch_time_t { start, end }) }
    })
}

pub(crate) unsafe extern "C" fn hsa_amd_profiling_get_async_copy_time(
    signal: hsa_signal_t,
    time: *mut hsa_amd_profiling_async_copy_time_t,
) -> hsa_status_t {
    with_runtime(|rt| {
        let (start, end) = rt
            .signal(signal.handle)?
            .copy_time()
            .ok_or(HSA_STATUS_ERROR)?;
        // SAFETY: HSA contract: `time` points to an hsa_amd_profiling_async_copy_time_t.
        unsafe { put(time, hsa_amd_profiling_async_copy_time_t { start, end }) }
    })
}

pub(crate) unsafe extern "C" fn hsa_amd_profiling_convert_tick_to_system_domain(
    agent: hsa_agent_t,
    agent_tick: u64,
    system_tick: *mut u64,
) -> hsa_status_t {
    // Agents use the system timestamp directly, so the conversion is the identity.
    with_runtime(|rt| {
        rt.agent(agent.handle)?;
        // SAFETY: HSA contract: `system_tick` points to a u64.
        unsafe { put(system_tick, agent_tick) }
    })
}

// ---------------------------------------------------------------------------------------------
// Signals

pub(crate) unsafe extern "C" fn hsa_amd_signal_create(
    initial_value: hsa_signal_value_t,
    num_consumers: u32,
    consumers: *const hsa_agent_t,
    attributes: u64,
    signal: *mut hsa_signal_t,
) -> hsa_status_t {
    let gpu_only = attributes & u64::from(HSA_AMD_SIGNAL_AMD_GPU_ONLY) != 0;
    with_runtime(|rt| {
        create_signal(
            rt,
            initial_value,
            num_consumers,
            consumers,
            gpu_only,
            signal,
        )
    })
}

pub(crate) unsafe extern "C" fn hsa_amd_signal_async_handler(
    signal: hsa_signal_t,
    cond: hsa_signal_condition_t,
    value: hsa_signal_value_t,
    handler: hsa_amd_signal_handler,
    arg: *mut c_void,
) -> hsa_status_t {
    with_runtime(|rt| {
        let signal = rt.signal(signal.handle)?;
        let handler = handler.ok_or(HSA_STATUS_ERROR_INVALID_ARGUMENT)?;
        // As on ROCm, only a signal the host may wait for (one backed by an interrupt there)
        // can have a handler.
        if signal.is_device_only() {
            return Err(HSA_STATUS_ERROR_INVALID_SIGNAL);
        }
        condition_holds(cond, 0, 0).ok_or(HSA_STATUS_ERROR_INVALID_ARGUMENT)?;
        rt.handlers.register(SignalHandler {
            signal,
            cond,
            value,
            handler,
            arg: arg as usize,
        })
    })
}

pub(crate) unsafe extern "C" fn hsa_amd_async_function(
    callback: Option<unsafe extern "C" fn(*mut c_void)>,
    arg: *mut c_void,
) -> hsa_status_t {
    with_runtime(|rt| {
        let callback = callback.ok_or(HSA_STATUS_ERROR_INVALID_ARGUMENT)?;
        rt.handlers.call(callback, arg as usize)
    })
}

pub(crate) unsafe extern "C" fn hsa_amd_signal_wait_any(
    signal_count: u32,
    signals: *mut hsa_signal_t,
    conds: *mut hsa_signal_condition_t,
    values: *mut hsa_signal_value_t,
    timeout_hint: u64,
    wait_hint: hsa_wait_state_t,
    satisfying_value: *mut hsa_signal_value_t,
) -> u32 {
    let run = || -> Result<u32, hsa_status_t> {
        let rt = runtime::current()?;
        let count = signal_count as usize;
        if count == 0 {
            return Err(HSA_STATUS_ERROR_INVALID_ARGUMENT);
        }
        // SAFETY: HSA contract: each array holds `signal_count` elements.
        let (handles, conds, values) = unsafe {
            (
                read_array(signals, count)?,
                read_array(conds, count)?,
                read_array(values, count)?,
            )
        };
        // As on ROCm, null and invalid signals are left out of the wait (the index returned
        // still counts them); with none left there is nothing to wait for.
        let (positions, waits): (Vec<usize>, Vec<WaitCondition>) = handles
            .iter()
            .zip(conds.iter().zip(values.iter()))
            .enumerate()
            .filter_map(|(i, (s, (&cond, &compare)))| {
                let signal = rt.signal(s.handle).ok()?;
                Some((
                    i,
                    WaitCondition {
                        signal,
                        cond,
                        compare,
                    },
                ))
            })
            .unzip();
        if waits.is_empty() {
            return Err(HSA_STATUS_ERROR_INVALID_SIGNAL);
        }
        let (index, value) = wait_any(
            &waits,
            deadline_after(timeout_hint),
            wait_hint,
            Order::Acquire,
        )
        .ok_or(HSA_STATUS_ERROR)?;
        if !satisfying_value.is_null() {
            // SAFETY: HSA contract: a non-null `satisfying_value` points to a signal value.
            unsafe { put(satisfying_value, value)? };
        }
        Ok(positions[index] as u32)
    };
    guard_or(Err(HSA_STATUS_ERROR), run).unwrap_or(u32::MAX)
}

pub(crate) unsafe extern "C" fn hsa_amd_signal_value_pointer(
    signal: hsa_signal_t,
    value_ptr: *mut *mut hsa_signal_value_t,
) -> hsa_status_t {
    with_runtime(|rt| {
        let signal = rt.signal(signal.handle)?;
        // SAFETY: HSA contract: `value_ptr` points to storage for a pointer. The value lives as
        // long as the signal (until hsa_signal_destroy); writes through it wake nobody.
        unsafe { put(value_ptr, signal.value_ptr()) }
    })
}

unsupported_entries! {
    /// Signals are process-local.
    hsa_amd_ipc_signal_create(hsa_signal_t, *mut hsa_amd_ipc_signal_t);
    /// Signals are process-local.
    hsa_amd_ipc_signal_attach(*const hsa_amd_ipc_signal_t, *mut hsa_signal_t);
}

// ---------------------------------------------------------------------------------------------
// Queues

#[allow(clippy::too_many_arguments)]
pub(crate) unsafe extern "C" fn hsa_amd_queue_intercept_create(
    agent: hsa_agent_t,
    size: u32,
    queue_type: hsa_queue_type32_t,
    callback: QueueCallback,
    data: *mut c_void,
    _private_segment_size: u32,
    _group_segment_size: u32,
    queue: *mut *mut hsa_queue_t,
) -> hsa_status_t {
    create_queue(true, agent, size, queue_type, callback, data, queue)
}

pub(crate) unsafe extern "C" fn hsa_amd_queue_intercept_register(
    queue: *mut hsa_queue_t,
    callback: hsa_amd_queue_intercept_handler,
    user_data: *mut c_void,
) -> hsa_status_t {
    with_runtime(|rt| {
        let q = rt.queue(queue)?;
        let QueueKind::Intercept(state) = &q.kind else {
            return Err(HSA_STATUS_ERROR_INVALID_QUEUE);
        };
        if state.register(callback, user_data as usize) {
            Ok(())
        } else {
            Err(HSA_STATUS_ERROR_INVALID_ARGUMENT)
        }
    })
}

pub(crate) unsafe extern "C" fn hsa_amd_queue_set_priority(
    queue: *mut hsa_queue_t,
    priority: hsa_amd_queue_priority_t,
) -> hsa_status_t {
    with_runtime(|rt| {
        // Every queue gets a thread of its own; priorities are validated and accepted.
        rt.queue(queue)?;
        if priority > HSA_AMD_QUEUE_PRIORITY_HIGH {
            return Err(HSA_STATUS_ERROR_INVALID_ARGUMENT);
        }
        Ok(())
    })
}

fn compute_units(rt: &Runtime) -> usize {
    rt.workers.count() + 1
}

pub(crate) unsafe extern "C" fn hsa_amd_queue_cu_set_mask(
    queue: *const hsa_queue_t,
    num_cu_mask_count: u32,
    cu_mask: *const u32,
) -> hsa_status_t {
    with_runtime(|rt| {
        let q = rt.queue(queue)?;
        if !num_cu_mask_count.is_multiple_of(32) {
            return Err(HSA_STATUS_ERROR_INVALID_ARGUMENT);
        }
        if num_cu_mask_count == 0 {
            // hsa_ext_amd.h: no bits is a request to enable every compute unit (the mask of a
            // new queue); no array need be given.
            q.set_cu_mask(Vec::new());
            return Ok(());
        }
        if cu_mask.is_null() {
            return Err(HSA_STATUS_ERROR_INVALID_ARGUMENT);
        }
        // SAFETY: HSA contract: `cu_mask` holds num_cu_mask_count bits (checked multiple of 32).
        let mask = unsafe { read_array(cu_mask, num_cu_mask_count as usize / 32) }?;
        let units = compute_units(rt);
        let reduced = mask.iter().enumerate().any(|(word, bits)| {
            (0..32).any(|bit| bits & (1 << bit) != 0 && word * 32 + bit >= units)
        });
        q.set_cu_mask(mask);
        if reduced {
            Err(HSA_STATUS_CU_MASK_REDUCED)
        } else {
            Ok(())
        }
    })
}

pub(crate) unsafe extern "C" fn hsa_amd_queue_cu_get_mask(
    queue: *const hsa_queue_t,
    num_cu_mask_count: u32,
    cu_mask: *mut u32,
) -> hsa_status_t {
    with_runtime(|rt| {
        let q = rt.queue(queue)?;
        if num_cu_mask_count == 0 || cu_mask.is_null() {
            return Err(HSA_STATUS_ERROR_INVALID_ARGUMENT);
        }
        let units = compute_units(rt);
        let mut mask = q.cu_mask();
        if mask.is_empty() {
            mask = (0..units.div_ceil(32))
                .map(|word| {
                    let bits = units.saturating_sub(word * 32).min(32);
                    if bits == 32 {
                        u32::MAX
                    } else {
                        (1u32 << bits) - 1
                    }
                })
                .collect();
        }
        let words = num_cu_mask_count.div_ceil(32) as usize;
        mask.resize(words, 0);
        let bytes: Vec<u8> = mask.iter().flat_map(|w| w.to_ne_bytes()).collect();
        // SAFETY: HSA contract: `cu_mask` has room for num_cu_mask_count bits (rounded up to
        // whole 32-bit words).
        unsafe { put_bytes(cu_mask.cast(), &bytes) }
    })
}

pub(crate) unsafe extern "C" fn hsa_amd_runtime_queue_create_register(
    callback: hsa_amd_runtime_queue_notifier,
    _user_data: *mut c_void,
) -> hsa_status_t {
    // softhsa never creates queues of its own, so the notifier has nothing to report.
    with_runtime(|_| {
        callback
            .map(|_| ())
            .ok_or(HSA_STATUS_ERROR_INVALID_ARGUMENT)
    })
}

pub(crate) unsafe extern "C" fn hsa_amd_register_system_event_handler(
    callback: hsa_amd_system_event_callback_t,
    _data: *mut c_void,
) -> hsa_status_t {
    // softhsa raises no system events (no memory faults on host memory).
    with_runtime(|_| {
        callback
            .map(|_| ())
            .ok_or(HSA_STATUS_ERROR_INVALID_ARGUMENT)
    })
}

// ---------------------------------------------------------------------------------------------
// Memory pools and allocations

type PoolCallback =
    Option<unsafe extern "C" fn(hsa_amd_memory_pool_t, *mut c_void) -> hsa_status_t>;

fn pool_index(rt: &Runtime, pool: hsa_amd_memory_pool_t) -> Result<usize, hsa_status_t> {
    rt.topology
        .pool_index(pool.handle)
        .ok_or(HSA_STATUS_ERROR_INVALID_MEMORY_POOL)
}

pub(crate) unsafe extern "C" fn hsa_amd_agent_iterate_memory_pools(
    agent: hsa_agent_t,
    callback: PoolCallback,
    data: *mut c_void,
) -> hsa_status_t {
    with_runtime(|rt| {
        let index = rt.agent(agent.handle)?;
        let callback = callback.ok_or(HSA_STATUS_ERROR_INVALID_ARGUMENT)?;
        let pools = &rt.topology.agents[index].pools;
        for_each(
            pools.iter().map(|&p| rt.topology.pools[p].handle),
            |handle| {
                // SAFETY: the application's callback, called with (pool, data) per the contract.
                unsafe { callback(hsa_amd_memory_pool_t { handle }, data) }
            },
        )
    })
}

pub(crate) unsafe extern "C" fn hsa_amd_memory_pool_get_info(
    memory_pool: hsa_amd_memory_pool_t,
    attribute: hsa_amd_memory_pool_info_t,
    value: *mut c_void,
) -> hsa_status_t {
    with_runtime(|rt| {
        let bytes = info::pool(rt, pool_index(rt, memory_pool)?, attribute)?;
        // SAFETY: HSA contract: `value` has room for the attribute's type.
        unsafe { put_bytes(value, &bytes) }
    })
}

pub(crate) unsafe extern "C" fn hsa_amd_agent_memory_pool_get_info(
    agent: hsa_agent_t,
    memory_pool: hsa_amd_memory_pool_t,
    attribute: hsa_amd_agent_memory_pool_info_t,
    value: *mut c_void,
) -> hsa_status_t {
    with_runtime(|rt| {
        let agent = rt.agent(agent.handle)?;
        let bytes = info::agent_pool(rt, agent, pool_index(rt, memory_pool)?, attribute)?;
        // SAFETY: HSA contract: `value` has room for the attribute's type.
        unsafe { put_bytes(value, &bytes) }
    })
}

/// The allocation flags (PCIe, contiguous, executable on ROCm 6 and later) change nothing in
/// host memory, and flags softhsa does not know are ignored, as ROCm 6 and later ignore them.
pub(crate) unsafe extern "C" fn hsa_amd_memory_pool_allocate(
    memory_pool: hsa_amd_memory_pool_t,
    size: usize,
    _flags: u32,
    ptr: *mut *mut c_void,
) -> hsa_status_t {
    with_runtime(|rt| allocate(rt, pool_index(rt, memory_pool)?, size, ptr))
}

pub(crate) unsafe extern "C" fn hsa_amd_memory_pool_free(ptr: *mut c_void) -> hsa_status_t {
    // SAFETY: the same contract as hsa_memory_free, which frees any runtime allocation.
    unsafe { super::core::hsa_memory_free(ptr) }
}

pub(crate) unsafe extern "C" fn hsa_amd_agents_allow_access(
    num_agents: u32,
    agents: *const hsa_agent_t,
    _flags: *const u32,
    ptr: *const c_void,
) -> hsa_status_t {
    with_runtime(|rt| {
        if num_agents == 0 || ptr.is_null() {
            return Err(HSA_STATUS_ERROR_INVALID_ARGUMENT);
        }
        // SAFETY: HSA contract: `agents` lists `num_agents` agents.
        let agents = unsafe { read_array(agents, num_agents as usize) }?;
        let indices = agents
            .iter()
            .map(|a| rt.agent(a.handle))
            .collect::<Result<Vec<_>, _>>()?;
        // Memory the runtime did not allocate (plain host memory) is already reachable.
        let _ = rt.memory.update(ptr as usize, |a| {
            for index in indices {
                if !a.granted.contains(&index) {
                    a.granted.push(index);
                }
            }
        });
        Ok(())
    })
}

pub(crate) unsafe extern "C" fn hsa_amd_memory_pool_can_migrate(
    src_memory_pool: hsa_amd_memory_pool_t,
    dst_memory_pool: hsa_amd_memory_pool_t,
    result: *mut bool,
) -> hsa_status_t {
    with_runtime(|rt| {
        pool_index(rt, src_memory_pool)?;
        pool_index(rt, dst_memory_pool)?;
        // SAFETY: HSA contract: `result` points to a bool.
        unsafe { put(result, false) }
    })
}

/// `hsa_amd_svm_attributes_set`: where SVM is supported (`SoftHsaConfig::svm_supported` or
/// `svm_accessible_by_default`), attributes of a page-aligned range of host memory are accepted
/// and checked (known attributes, known agents for the per-agent ones); softhsa keeps nothing,
/// since its kernels, host code, reach the range either way. Elsewhere the call fails, as on a
/// machine without SVM.
pub(crate) unsafe extern "C" fn hsa_amd_svm_attributes_set(
    ptr: *mut c_void,
    size: usize,
    attributes: *mut hsa_amd_svm_attribute_pair_t,
    count: usize,
) -> hsa_status_t {
    with_runtime(|rt| {
        if !(rt.config.svm_supported || rt.config.svm_accessible_by_default) {
            return Err(HSA_STATUS_ERROR);
        }
        const PAGE: usize = 4096;
        if ptr.is_null()
            || size == 0
            || !(ptr as usize).is_multiple_of(PAGE)
            || !size.is_multiple_of(PAGE)
            || attributes.is_null()
            || count == 0
        {
            return Err(HSA_STATUS_ERROR_INVALID_ARGUMENT);
        }
        // SAFETY: HSA contract: `attributes` holds `count` pairs.
        let pairs = unsafe { read_array(attributes.cast_const(), count) }?;
        for pair in pairs {
            let attribute =
                u32::try_from(pair.attribute).map_err(|_| HSA_STATUS_ERROR_INVALID_ARGUMENT)?;
            match attribute {
                HSA_AMD_SVM_ATTRIB_AGENT_ACCESSIBLE
                | HSA_AMD_SVM_ATTRIB_AGENT_ACCESSIBLE_IN_PLACE
                | HSA_AMD_SVM_ATTRIB_AGENT_NO_ACCESS
                | HSA_AMD_SVM_ATTRIB_PREFERRED_LOCATION
                | HSA_AMD_SVM_ATTRIB_PREFETCH_LOCATION => {
                    rt.agent(pair.value)?;
                }
                HSA_AMD_SVM_ATTRIB_GLOBAL_FLAG
                | HSA_AMD_SVM_ATTRIB_READ_ONLY
                | HSA_AMD_SVM_ATTRIB_HIVE_LOCAL
                | HSA_AMD_SVM_ATTRIB_MIGRATION_GRANULARITY
                | HSA_AMD_SVM_ATTRIB_READ_MOSTLY => {}
                _ => return Err(HSA_STATUS_ERROR_INVALID_ARGUMENT),
            }
        }
        Ok(())
    })
}

/// Shared body of `hsa_amd_memory_lock` and `hsa_amd_memory_lock_to_pool`.
fn lock(
    rt: &Runtime,
    host_ptr: *mut c_void,
    size: usize,
    agents: *mut hsa_agent_t,
    num_agent: c_int,
    agent_ptr: *mut *mut c_void,
) -> HsaResult {
    // hsa_ext_amd.h: a null array with no agents names every agent; an array must list some.
    if host_ptr.is_null()
        || size == 0
        || agent_ptr.is_null()
        || num_agent < 0
        || (!agents.is_null() && num_agent == 0)
    {
        return Err(HSA_STATUS_ERROR_INVALID_ARGUMENT);
    }
    // SAFETY: HSA contract: `agents` lists `num_agent` agents (null with 0 means all).
    let agents = unsafe { read_array(agents.cast_const(), num_agent as usize) }?;
    let granted = agents
        .iter()
        .map(|a| rt.agent(a.handle))
        .collect::<Result<Vec<_>, _>>()?;
    rt.memory.lock(
        host_ptr as usize,
        size,
        0,
        HSA_AMD_MEMORY_POOL_GLOBAL_FLAG_FINE_GRAINED,
    )?;
    rt.memory
        .update(host_ptr as usize, |a| a.granted = granted)?;
    // Agents share the host address space, so the agent pointer is the host pointer.
    // SAFETY: `agent_ptr` is the caller's out pointer (checked non-null).
    unsafe { put(agent_ptr, host_ptr) }
}

pub(crate) unsafe extern "C" fn hsa_amd_memory_lock(
    host_ptr: *mut c_void,
    size: usize,
    agents: *mut hsa_agent_t,
    num_agent: c_int,
    agent_ptr: *mut *mut c_void,
) -> hsa_status_t {
    with_runtime(|rt| lock(rt, host_ptr, size, agents, num_agent, agent_ptr))
}

#[allow(clippy::too_many_arguments)]
pub(crate) unsafe extern "C" fn hsa_amd_memory_lock_to_pool(
    host_ptr: *mut c_void,
    size: usize,
    agents: *mut hsa_agent_t,
    num_agent: c_int,
    pool: hsa_amd_memory_pool_t,
    _flags: u32,
    agent_ptr: *mut *mut c_void,
) -> hsa_status_t {
    with_runtime(|rt| {
        pool_index(rt, pool)?;
        lock(rt, host_ptr, size, agents, num_agent, agent_ptr)
    })
}

pub(crate) unsafe extern "C" fn hsa_amd_memory_unlock(host_ptr: *mut c_void) -> hsa_status_t {
    with_runtime(|rt| rt.memory.unlock(host_ptr as usize))
}

/// Whether the `bytes` at `ptr` lie inside one live runtime allocation
/// (`HSA_STATUS_ERROR_INVALID_ALLOCATION` if not).
fn inside_allocation(rt: &Runtime, ptr: *mut c_void, bytes: usize) -> HsaResult {
    let allocation = rt
        .memory
        .find(ptr as usize)
        .ok_or(HSA_STATUS_ERROR_INVALID_ALLOCATION)?;
    if ptr as usize - allocation.base + bytes > allocation.size {
        return Err(HSA_STATUS_ERROR_INVALID_ALLOCATION);
    }
    Ok(())
}

pub(crate) unsafe extern "C" fn hsa_amd_memory_fill(
    ptr: *mut c_void,
    value: u32,
    count: usize,
) -> hsa_status_t {
    with_runtime(|rt| {
        if ptr.is_null() || !(ptr as usize).is_multiple_of(4) {
            return Err(HSA_STATUS_ERROR_INVALID_ARGUMENT);
        }
        if count == 0 {
            return Ok(());
        }
        let bytes = count
            .checked_mul(4)
            .ok_or(HSA_STATUS_ERROR_INVALID_ARGUMENT)?;
        inside_allocation(rt, ptr, bytes)?;
        let words = ptr.cast::<u32>();
        for i in 0..count {
            // SAFETY: the range [ptr, ptr + 4*count) lies inside a live runtime allocation
            // (checked above) and ptr is 4-byte aligned.
            unsafe { words.add(i).write(value) };
        }
        Ok(())
    })
}

/// The agents that can reach an allocation: every agent for host memory, otherwise the owner
/// and the agents granted access.
fn accessible_agents(rt: &Runtime, allocation: &Allocation) -> Vec<hsa_agent_t> {
    let host = match allocation.backing {
        Backing::Pool { pool, .. } => rt.topology.pools[pool].kind.is_host(),
        Backing::Locked => true,
        Backing::Vmem { handle } => rt
            .memory
            .vmem_pool(handle)
            .is_ok_and(|pool| rt.topology.pools[pool].kind.is_host()),
    };
    let agents = &rt.topology.agents;
    let indices: Vec<usize> = if host {
        (0..agents.len()).collect()
    } else {
        let mut v = vec![allocation.owner];
        v.extend(
            allocation
                .granted
                .iter()
                .filter(|&&g| g != allocation.owner),
        );
        v
    };
    indices
        .into_iter()
        .map(|i| hsa_agent_t {
            handle: agents[i].handle,
        })
        .collect()
}

pub(crate) unsafe extern "C" fn hsa_amd_pointer_info(
    ptr: *const c_void,
    info: *mut hsa_amd_pointer_info_t,
    alloc: Option<unsafe extern "C" fn(usize) -> *mut c_void>,
    num_agents_accessible: *mut u32,
    accessible: *mut *mut hsa_agent_t,
) -> hsa_status_t {
    type P = hsa_amd_pointer_info_t;
    with_runtime(|rt| {
        if info.is_null() {
            return Err(HSA_STATUS_ERROR_INVALID_ARGUMENT);
        }
        // SAFETY: HSA contract: `info` points to a struct whose `size` field the caller set.
        let given = unsafe { std::ptr::addr_of!((*info).size).read_unaligned() } as usize;
        if given < offset_of!(P, type_) + size_of::<hsa_amd_pointer_type_t>() {
            return Err(HSA_STATUS_ERROR_INVALID_ARGUMENT);
        }
        if !accessible.is_null() && alloc.is_none() {
            return Err(HSA_STATUS_ERROR_INVALID_ARGUMENT);
        }
        let found = rt.memory.find(ptr as usize);
        let base = found.as_ref().map_or(0, |a| a.base);
        let kind = match found.as_ref().map(|a| a.backing) {
            Some(Backing::Pool { .. } | Backing::Vmem { .. }) => HSA_EXT_POINTER_TYPE_HSA,
            Some(Backing::Locked) => HSA_EXT_POINTER_TYPE_LOCKED,
            None => HSA_EXT_POINTER_TYPE_UNKNOWN,
        };
        let owner = found
            .as_ref()
            .map_or(0, |a| rt.topology.agents[a.owner].handle);
        let base_ptr = base as *mut c_void;
        // Writes one field when it lies within the size the caller declared.
        macro_rules! field {
            ($name:ident, $value:expr) => {
                let value = $value;
                if offset_of!(P, $name) + size_of_val(&value) <= given {
                    // SAFETY: the field lies within the `given` bytes the caller declared for
                    // `info`; the write is unaligned-safe.
                    unsafe { std::ptr::addr_of_mut!((*info).$name).write_unaligned(value) };
                }
            };
        }
        field!(type_, kind);
        field!(agentBaseAddress, base_ptr);
        field!(hostBaseAddress, base_ptr);
        field!(sizeInBytes, found.as_ref().map_or(0, |a| a.size));
        field!(
            userData,
            found.as_ref().map_or(0, |a| a.user_data) as *mut c_void
        );
        field!(agentOwner, hsa_agent_t { handle: owner });
        field!(global_flags, found.as_ref().map_or(0, |a| a.global_flags));
        let list = found
            .as_ref()
            .map_or_else(Vec::new, |a| accessible_agents(rt, a));
        if !num_agents_accessible.is_null() {
            // SAFETY: a non-null out pointer of the caller.
            unsafe { put(num_agents_accessible, list.len() as u32)? };
        }
        if let (false, Some(alloc)) = (accessible.is_null(), alloc) {
            let array = if list.is_empty() {
                std::ptr::null_mut()
            } else {
                // SAFETY: the caller's allocator, called with a byte count per the contract.
                let array =
                    unsafe { alloc(list.len() * size_of::<hsa_agent_t>()) }.cast::<hsa_agent_t>();
                if array.is_null() {
                    return Err(HSA_STATUS_ERROR_OUT_OF_RESOURCES);
                }
                for (i, agent) in list.iter().enumerate() {
                    // SAFETY: the allocator returned room for list.len() agents.
                    unsafe { array.add(i).write_unaligned(*agent) };
                }
                array
            };
            // SAFETY: a non-null out pointer of the caller.
            unsafe { put(accessible, array)? };
        }
        Ok(())
    })
}

pub(crate) unsafe extern "C" fn hsa_amd_pointer_info_set_userdata(
    ptr: *const c_void,
    userdata: *mut c_void,
) -> hsa_status_t {
    with_runtime(|rt| {
        rt.memory
            .update(ptr as usize, |a| a.user_data = userdata as usize)
    })
}

pub(crate) unsafe extern "C" fn hsa_amd_register_deallocation_callback(
    ptr: *mut c_void,
    callback: hsa_amd_deallocation_callback_t,
    user_data: *mut c_void,
) -> hsa_status_t {
    with_runtime(|rt| {
        rt.memory
            .add_dealloc_callback(ptr as usize, callback, user_data as usize)
    })
}

pub(crate) unsafe extern "C" fn hsa_amd_deregister_deallocation_callback(
    ptr: *mut c_void,
    callback: hsa_amd_deallocation_callback_t,
) -> hsa_status_t {
    with_runtime(|rt| rt.memory.remove_dealloc_callback(ptr as usize, callback))
}

// ---------------------------------------------------------------------------------------------
// Asynchronous copies

/// Validates the dependencies and completion signal and queues `work` on an agent's engine; the
/// job reports `completions` completions once it ran (a batch's operations; 1 for one copy).
/// A copy that moves no bytes (`empty`) is only validated: as on ROCm, it neither waits for its
/// dependencies nor decrements its completion signal.
#[allow(clippy::too_many_arguments)]
fn submit_copy(
    rt: &Runtime,
    engine: usize,
    num_dep_signals: u32,
    dep_signals: *const hsa_signal_t,
    completion_signal: hsa_signal_t,
    work: Box<dyn FnOnce() + Send>,
    completions: u32,
    empty: bool,
) -> HsaResult {
    let completion = rt.signal(completion_signal.handle)?;
    // SAFETY: HSA contract: `dep_signals` lists `num_dep_signals` signals.
    let deps = unsafe { read_array(dep_signals, num_dep_signals as usize) }?
        .iter()
        .map(|s| rt.signal(s.handle))
        .collect::<Result<Vec<_>, _>>()?;
    if empty {
        return Ok(());
    }
    let profile = rt.async_copy_profiling.load(Ordering::Acquire);
    if profile {
        completion.mark_profiled_copy();
    }
    rt.copies.submit(
        engine,
        CopyJob {
            deps,
            completion,
            profile,
            work,
            completions,
        },
    )
}

/// The directions a copy engine serves (see [`engine_agent`]).
const HOST_TO_DEVICE: usize = 0;
const DEVICE_TO_HOST: usize = 1;
const DEVICE_TO_DEVICE: usize = 2;
const DIRECTIONS: usize = 3;

/// The engine of agent `agent` that serves copies in `direction`.
fn engine(agent: usize, direction: usize) -> usize {
    agent * DIRECTIONS + direction
}

/// The engine that runs a copy to agent `dst` from agent `src`: one of the GPU involved (of
/// `dst` when both are), and, as ROCm gives each direction a blit of its own, one per
/// direction, so copies in different directions are ordered only by their dependencies.
fn engine_agent(rt: &Runtime, dst: usize, src: usize) -> usize {
    let gpu = |agent: usize| rt.topology.agents[agent].kind == AgentKind::Gpu;
    match (gpu(dst), gpu(src)) {
        (true, false) => engine(dst, HOST_TO_DEVICE),
        (false, true) => engine(src, DEVICE_TO_HOST),
        _ => engine(dst, DEVICE_TO_DEVICE),
    }
}

#[allow(clippy::too_many_arguments)]
pub(crate) unsafe extern "C" fn hsa_amd_memory_async_copy(
    dst: *mut c_void,
    dst_agent: hsa_agent_t,
    src: *const c_void,
    src_agent: hsa_agent_t,
    size: usize,
    num_dep_signals: u32,
    dep_signals: *const hsa_signal_t,
    completion_signal: hsa_signal_t,
) -> hsa_status_t {
    with_runtime(|rt| {
        if dst.is_null() || src.is_null() {
            return Err(HSA_STATUS_ERROR_INVALID_ARGUMENT);
        }
        let engine = engine_agent(rt, rt.agent(dst_agent.handle)?, rt.agent(src_agent.handle)?);
        let (dst, src) = (dst as usize, src as usize);
        let work = Box::new(move || {
            // SAFETY: the hsa_amd_memory_async_copy contract keeps both `size`-byte ranges valid
            // until the completion signal is decremented; `copy` tolerates overlap.
            unsafe { std::ptr::copy(src as *const u8, dst as *mut u8, size) };
        });
        submit_copy(
            rt,
            engine,
            num_dep_signals,
            dep_signals,
            completion_signal,
            work,
            1,
            size == 0,
        )
    })
}

/// `hsa_amd_ais_file_read` (ROCm 7, experimental): reads `size` bytes of the file `handle.fd`
/// at `file_offset` into the runtime allocation at `device_ptr`, synchronously; the bytes read
/// go to `size_copied`, and `status` gets 0 (or the OS error number of a failed read).
pub(crate) unsafe extern "C" fn hsa_amd_ais_file_read(
    handle: hsa_sys::layouts::hsa_amd_ais_file_handle_t,
    device_ptr: *mut c_void,
    size: u64,
    file_offset: i64,
    size_copied: *mut u64,
    status: *mut i32,
) -> hsa_status_t {
    use std::os::unix::fs::FileExt;
    use std::os::unix::io::FromRawFd;
    with_runtime(|rt| {
        // SAFETY: the handle's `fd` member, as Linux callers set it.
        let fd = unsafe { handle.fd };
        let size = usize::try_from(size).map_err(|_| HSA_STATUS_ERROR_INVALID_ARGUMENT)?;
        let offset = u64::try_from(file_offset).map_err(|_| HSA_STATUS_ERROR_INVALID_ARGUMENT)?;
        if fd < 0 || device_ptr.is_null() || size == 0 {
            return Err(HSA_STATUS_ERROR_INVALID_ARGUMENT);
        }
        inside_allocation(rt, device_ptr, size)?;
        // SAFETY: the caller's open file, borrowed for the call: ManuallyDrop keeps it open.
        let file = std::mem::ManuallyDrop::new(unsafe { std::fs::File::from_raw_fd(fd) });
        // SAFETY: the range lies inside a live runtime allocation (checked above).
        let buffer = unsafe { std::slice::from_raw_parts_mut(device_ptr.cast::<u8>(), size) };
        let (copied, error) = match file.read_at(buffer, offset) {
            Ok(n) => (n as u64, 0),
            Err(e) => (0, e.raw_os_error().unwrap_or(-1)),
        };
        // SAFETY: the caller's out pointers, written when non-null.
        unsafe {
            if !size_copied.is_null() {
                *size_copied = copied;
            }
            if !status.is_null() {
                *status = error;
            }
        }
        if error == 0 {
            Ok(())
        } else {
            Err(HSA_STATUS_ERROR)
        }
    })
}

/// `hsa_amd_memory_async_batch_copy` (ROCm 7): linear operations only (`HSA_AMD_MEMORY_COPY_OP_LINEAR`,
/// one range or, with `num_entries` > 0, lists of ranges), without wait-before or
/// signal-after blocks; any other operation makes the whole call fail with
/// `HSA_STATUS_ERROR_INVALID_ARGUMENT` before anything is submitted. Every operation carries the
/// batch's one completion signal; the batch runs as one copy on the first operation's engine,
/// which decrements the signal once per operation when all ranges are copied.
pub(crate) unsafe extern "C" fn hsa_amd_memory_async_batch_copy(
    copy_ops: *const hsa_sys::layouts::hsa_amd_memory_copy_op_t,
    num_copy_ops: u32,
    num_dep_signals: u32,
    dep_signals: *const hsa_signal_t,
) -> hsa_status_t {
    use hsa_sys::layouts::{HSA_AMD_MEMORY_COPY_OP_LINEAR, HSA_AMD_MEMORY_COPY_OP_VERSION};
    with_runtime(|rt| {
        if num_copy_ops == 0 {
            return Err(HSA_STATUS_ERROR_INVALID_ARGUMENT);
        }
        // SAFETY: HSA contract: `copy_ops` lists `num_copy_ops` operations.
        let ops = unsafe { read_array(copy_ops, num_copy_ops as usize) }?;
        let signal = ops[0].completion_signal.handle;
        let mut jobs = Vec::with_capacity(ops.len());
        for op in &ops {
            if op.version != HSA_AMD_MEMORY_COPY_OP_VERSION
                || op.type_ != HSA_AMD_MEMORY_COPY_OP_LINEAR
                || op.completion_signal.handle != signal
                || op.wait != [0; 4]
                || op.signal != [0; 3]
            {
                return Err(HSA_STATUS_ERROR_INVALID_ARGUMENT);
            }
            let ranges: Vec<(usize, usize, usize, u64)> = if op.num_entries == 0 {
                vec![(
                    op.dst as usize,
                    op.src as usize,
                    op.size[0] as usize,
                    op.dst_agent,
                )]
            } else {
                let n = usize::from(op.num_entries);
                // SAFETY: HSA contract: with entries, `dst`, `src`, `size` and `dst_agent`
                // point to `num_entries` destinations, sources, sizes and agents.
                let (dsts, srcs, sizes, agents) = unsafe {
                    (
                        read_array(op.dst as *const usize, n)?,
                        read_array(op.src as *const usize, n)?,
                        read_array(op.size[0] as *const usize, n)?,
                        read_array(op.dst_agent as *const u64, n)?,
                    )
                };
                (0..n)
                    .map(|i| (dsts[i], srcs[i], sizes[i], agents[i]))
                    .collect()
            };
            let mut engine = None;
            for &(dst, src, _, dst_agent) in &ranges {
                if dst == 0 || src == 0 {
                    return Err(HSA_STATUS_ERROR_INVALID_ARGUMENT);
                }
                let (d, s) = (rt.agent(dst_agent)?, rt.agent(op.src_agent)?);
                engine.get_or_insert(engine_agent(rt, d, s));
            }
            jobs.push((engine.unwrap_or(0), ranges));
        }
        // One job for the whole batch, so that a failed submission leaves nothing submitted.
        let engine = jobs[0].0;
        let work = Box::new(move || {
            for (dst, src, size, _) in jobs.into_iter().flat_map(|(_, ranges)| ranges) {
                // SAFETY: the batch copy's contract keeps every range valid until the
                // completion signal is decremented; `copy` tolerates overlap.
                unsafe { std::ptr::copy(src as *const u8, dst as *mut u8, size) };
            }
        });
        let completion = hsa_signal_t { handle: signal };
        submit_copy(
            rt,
            engine,
            num_dep_signals,
            dep_signals,
            completion,
            work,
            num_copy_ops,
            false,
        )
    })
}

#[allow(clippy::too_many_arguments)]
pub(crate) unsafe extern "C" fn hsa_amd_memory_async_copy_rect(
    dst: *const hsa_pitched_ptr_t,
    dst_offset: *const hsa_dim3_t,
    src: *const hsa_pitched_ptr_t,
    src_offset: *const hsa_dim3_t,
    range: *const hsa_dim3_t,
    copy_agent: hsa_agent_t,
    dir: hsa_amd_copy_direction_t,
    num_dep_signals: u32,
    dep_signals: *const hsa_signal_t,
    completion_signal: hsa_signal_t,
) -> hsa_status_t {
    with_runtime(|rt| {
        let agent = rt.agent(copy_agent.handle)?;
        let direction = if dir == hsaHostToDevice {
            HOST_TO_DEVICE
        } else if dir == hsaDeviceToHost {
            DEVICE_TO_HOST
        } else {
            DEVICE_TO_DEVICE
        };
        let engine = engine(agent, direction);
        if [dst_offset, src_offset, range].iter().any(|p| p.is_null())
            || dst.is_null()
            || src.is_null()
        {
            return Err(HSA_STATUS_ERROR_INVALID_ARGUMENT);
        }
        // SAFETY: HSA contract: the five pointers (checked non-null) point to their structs.
        let (dst, dst_offset, src, src_offset, range) = unsafe {
            (
                dst.read_unaligned(),
                dst_offset.read_unaligned(),
                src.read_unaligned(),
                src_offset.read_unaligned(),
                range.read_unaligned(),
            )
        };
        let fits = |p: &hsa_pitched_ptr_t, o: &hsa_dim3_t| {
            !p.base.is_null()
                && (o.x as usize + range.x as usize) <= p.pitch
                && (range.z <= 1 || (o.y as usize + range.y as usize) * p.pitch <= p.slice)
        };
        if !fits(&dst, &dst_offset) || !fits(&src, &src_offset) {
            return Err(HSA_STATUS_ERROR_INVALID_ARGUMENT);
        }
        let address = |p: &hsa_pitched_ptr_t, o: &hsa_dim3_t, y: u32, z: u32| {
            p.base as usize
                + (o.z as usize + z as usize) * p.slice
                + (o.y as usize + y as usize) * p.pitch
                + o.x as usize
        };
        let rows: Vec<(usize, usize)> = (0..range.z)
            .flat_map(|z| (0..range.y).map(move |y| (y, z)))
            .map(|(y, z)| {
                (
                    address(&src, &src_offset, y, z),
                    address(&dst, &dst_offset, y, z),
                )
            })
            .collect();
        let width = range.x as usize;
        let work = Box::new(move || {
            for (from, to) in rows {
                // SAFETY: the hsa_amd_memory_async_copy_rect contract keeps both pitched regions
                // valid until completion; each row lies within its pitch (checked above).
                unsafe { std::ptr::copy(from as *const u8, to as *mut u8, width) };
            }
        });
        submit_copy(
            rt,
            engine,
            num_dep_signals,
            dep_signals,
            completion_signal,
            work,
            1,
            range.x == 0 || range.y == 0 || range.z == 0,
        )
    })
}

// ---------------------------------------------------------------------------------------------
// Not provided: interop, images, IPC, SVM queries and prefetch, migration.

type ImageDescriptor = *const hsa_ext_image_descriptor_t;

unsupported_entries! {
    /// Memory never migrates between pools in softhsa.
    hsa_amd_memory_migrate(*const c_void, hsa_amd_memory_pool_t, u32);
    hsa_amd_interop_map_buffer(u32, *mut hsa_agent_t, c_int, u32, *mut usize, *mut *mut c_void, *mut usize, *mut *const c_void);
    hsa_amd_interop_unmap_buffer(*mut c_void);
    hsa_amd_image_create(hsa_agent_t, ImageDescriptor, *const hsa_amd_image_descriptor_t, *const c_void, hsa_access_permission_t, *mut hsa_ext_image_t);
    hsa_amd_ipc_memory_create(*mut c_void, usize, *mut hsa_amd_ipc_memory_t);
    hsa_amd_ipc_memory_attach(*const hsa_amd_ipc_memory_t, usize, u32, *const hsa_agent_t, *mut *mut c_void);
    hsa_amd_ipc_memory_detach(*mut c_void);
    hsa_amd_svm_attributes_get(*mut c_void, usize, *mut hsa_amd_svm_attribute_pair_t, usize);
    hsa_amd_svm_prefetch_async(*mut c_void, usize, hsa_agent_t, u32, *const hsa_signal_t, hsa_signal_t);
}

// ---------------------------------------------------------------------------------------------
// ROCm 5.6+ and 6.x entries (only in the tables handed out in those layouts)

use hsa_sys::layouts::{
    hsa_amd_memory_access_desc_t, hsa_amd_memory_type_t, hsa_amd_sdma_engine_id_t,
    hsa_amd_vmem_alloc_handle_t,
};

/// The SDMA engines every copy direction offers (softhsa copies on one worker per agent, so the
/// engine only selects nothing; two are reported as on a small GPU).
const SDMA_ENGINES: u32 = 0x3;

#[allow(clippy::too_many_arguments)]
pub(crate) unsafe extern "C" fn hsa_amd_memory_async_copy_on_engine(
    dst: *mut c_void,
    dst_agent: hsa_agent_t,
    src: *const c_void,
    src_agent: hsa_agent_t,
    size: usize,
    num_dep_signals: u32,
    dep_signals: *const hsa_signal_t,
    completion_signal: hsa_signal_t,
    engine_id: hsa_amd_sdma_engine_id_t,
    _force_copy_on_sdma: bool,
) -> hsa_status_t {
    if !engine_id.is_power_of_two() || engine_id & SDMA_ENGINES == 0 {
        return guard_or(HSA_STATUS_ERROR, || match runtime::current() {
            Ok(_) => HSA_STATUS_ERROR_INVALID_ARGUMENT,
            Err(status) => status,
        });
    }
    // SAFETY: the same contract as hsa_amd_memory_async_copy, forwarded from the caller.
    unsafe {
        hsa_amd_memory_async_copy(
            dst,
            dst_agent,
            src,
            src_agent,
            size,
            num_dep_signals,
            dep_signals,
            completion_signal,
        )
    }
}

pub(crate) unsafe extern "C" fn hsa_amd_memory_copy_engine_status(
    dst_agent: hsa_agent_t,
    src_agent: hsa_agent_t,
    engine_ids_mask: *mut u32,
) -> hsa_status_t {
    with_runtime(|rt| {
        rt.agent(dst_agent.handle)?;
        rt.agent(src_agent.handle)?;
        // SAFETY: the caller's out pointer (checked non-null by `put`).
        unsafe { put(engine_ids_mask, SDMA_ENGINES) }
    })
}

pub(crate) unsafe extern "C" fn hsa_amd_vmem_address_reserve(
    va: *mut *mut c_void,
    size: usize,
    address: u64,
    _flags: u64,
) -> hsa_status_t {
    with_runtime(|rt| {
        if va.is_null() {
            return Err(HSA_STATUS_ERROR_INVALID_ARGUMENT);
        }
        let ptr = rt.memory.vmem_reserve(size, address as usize)?;
        // SAFETY: the caller's out pointer (checked non-null).
        unsafe { put(va, ptr as *mut c_void) }
    })
}

pub(crate) unsafe extern "C" fn hsa_amd_vmem_address_reserve_align(
    va: *mut *mut c_void,
    size: usize,
    address: u64,
    alignment: u64,
    flags: u64,
) -> hsa_status_t {
    if alignment != 0 && (!alignment.is_power_of_two() || alignment > 4096) {
        // Reservations are page aligned; a larger alignment is not offered.
        return guard_or(HSA_STATUS_ERROR, || match runtime::current() {
            Ok(_) => HSA_STATUS_ERROR_INVALID_ARGUMENT,
            Err(status) => status,
        });
    }
    // SAFETY: forwarded from the caller.
    unsafe { hsa_amd_vmem_address_reserve(va, size, address, flags) }
}

pub(crate) unsafe extern "C" fn hsa_amd_vmem_address_free(
    va: *mut c_void,
    size: usize,
) -> hsa_status_t {
    with_runtime(|rt| rt.memory.vmem_free(va as usize, size))
}

pub(crate) unsafe extern "C" fn hsa_amd_vmem_handle_create(
    pool: hsa_amd_memory_pool_t,
    size: usize,
    _type: hsa_amd_memory_type_t,
    _flags: u64,
    memory_handle: *mut hsa_amd_vmem_alloc_handle_t,
) -> hsa_status_t {
    with_runtime(|rt| {
        if memory_handle.is_null() {
            return Err(HSA_STATUS_ERROR_INVALID_ARGUMENT);
        }
        let pool = pool_index(rt, pool)?;
        let handle = rt.memory.vmem_create(&rt.topology, pool, size)?;
        // SAFETY: the caller's out pointer (checked non-null).
        unsafe { put(memory_handle, hsa_amd_vmem_alloc_handle_t { handle }) }
    })
}

pub(crate) unsafe extern "C" fn hsa_amd_vmem_handle_release(
    memory_handle: hsa_amd_vmem_alloc_handle_t,
) -> hsa_status_t {
    with_runtime(|rt| rt.memory.vmem_release(&rt.topology, memory_handle.handle))
}

pub(crate) unsafe extern "C" fn hsa_amd_vmem_map(
    va: *mut c_void,
    size: usize,
    in_offset: usize,
    memory_handle: hsa_amd_vmem_alloc_handle_t,
    _flags: u64,
) -> hsa_status_t {
    with_runtime(|rt| {
        rt.memory.vmem_map(
            &rt.topology,
            va as usize,
            size,
            in_offset,
            memory_handle.handle,
        )
    })
}

pub(crate) unsafe extern "C" fn hsa_amd_vmem_unmap(va: *mut c_void, size: usize) -> hsa_status_t {
    with_runtime(|rt| rt.memory.vmem_unmap(&rt.topology, va as usize, size))
}

pub(crate) unsafe extern "C" fn hsa_amd_vmem_set_access(
    va: *mut c_void,
    size: usize,
    desc: *const hsa_amd_memory_access_desc_t,
    desc_cnt: usize,
) -> hsa_status_t {
    with_runtime(|rt| {
        // SAFETY: HSA contract: `desc` lists `desc_cnt` descriptors.
        let desc = unsafe { read_array(desc, desc_cnt) }?;
        let mut granted = Vec::with_capacity(desc.len());
        for d in &desc {
            let agent = rt.agent(d.agent_handle.handle)?;
            if d.permissions > HSA_ACCESS_PERMISSION_RW {
                return Err(HSA_STATUS_ERROR_INVALID_ARGUMENT);
            }
            granted.push((agent, d.permissions));
        }
        match rt.memory.find(va as usize) {
            Some(a) if a.base == va as usize && a.size == size => {}
            Some(_) => return Err(HSA_STATUS_ERROR_INVALID_ARGUMENT),
            None => return Err(HSA_STATUS_ERROR_INVALID_ALLOCATION),
        }
        // Each call replaces the permissions of every agent.
        rt.memory.update(va as usize, |a| {
            a.granted = granted
                .iter()
                .filter(|(_, p)| *p != 0)
                .map(|(agent, _)| *agent)
                .collect();
            a.permissions = granted;
        })
    })
}

pub(crate) unsafe extern "C" fn hsa_amd_vmem_get_access(
    va: *mut c_void,
    perms: *mut hsa_access_permission_t,
    agent_handle: hsa_agent_t,
) -> hsa_status_t {
    with_runtime(|rt| {
        let agent = rt.agent(agent_handle.handle)?;
        let allocation = rt
            .memory
            .find(va as usize)
            .filter(|a| matches!(a.backing, Backing::Vmem { .. }))
            .ok_or(HSA_STATUS_ERROR_INVALID_ALLOCATION)?;
        let permission = allocation
            .permissions
            .iter()
            .find(|(a, _)| *a == agent)
            .map(|(_, p)| *p)
            .ok_or(HSA_STATUS_ERROR_INVALID_ALLOCATION)?;
        // SAFETY: the caller's out pointer (checked non-null by `put`).
        unsafe { put(perms, permission) }
    })
}

pub(crate) unsafe extern "C" fn hsa_amd_vmem_retain_alloc_handle(
    memory_handle: *mut hsa_amd_vmem_alloc_handle_t,
    addr: *mut c_void,
) -> hsa_status_t {
    with_runtime(|rt| {
        if memory_handle.is_null() {
            return Err(HSA_STATUS_ERROR_INVALID_ARGUMENT);
        }
        let handle = rt.memory.vmem_retain(addr as usize)?;
        // SAFETY: the caller's out pointer (checked non-null).
        unsafe { put(memory_handle, hsa_amd_vmem_alloc_handle_t { handle }) }
    })
}

pub(crate) unsafe extern "C" fn hsa_amd_vmem_get_alloc_properties_from_handle(
    memory_handle: hsa_amd_vmem_alloc_handle_t,
    pool: *mut hsa_amd_memory_pool_t,
    type_: *mut hsa_amd_memory_type_t,
) -> hsa_status_t {
    with_runtime(|rt| {
        let index = rt.memory.vmem_pool(memory_handle.handle)?;
        let handle = rt.topology.pools[index].handle;
        // SAFETY: the caller's out pointers (each checked non-null by `put`).
        unsafe {
            put(pool, hsa_amd_memory_pool_t { handle })?;
            put(type_, hsa_sys::layouts::MEMORY_TYPE_NONE)
        }
    })
}

unsupported_entries! {
    /// Sharing memory between processes (dma-buf) is not provided.
    hsa_amd_vmem_export_shareable_handle(*mut c_int, hsa_amd_vmem_alloc_handle_t, u64);
    hsa_amd_vmem_import_shareable_handle(c_int, *mut hsa_amd_vmem_alloc_handle_t);
    hsa_amd_portable_export_dmabuf(*const c_void, usize, *mut c_int, *mut u64);
    hsa_amd_portable_close_dmabuf(c_int);
    /// No stream performance monitor.
    hsa_amd_spm_acquire(hsa_agent_t);
    hsa_amd_spm_release(hsa_agent_t);
    hsa_amd_spm_set_dest_buffer(hsa_agent_t, usize, *mut u32, *mut u32, *mut c_void, *mut bool);
    /// No scratch memory to limit.
    hsa_amd_agent_set_async_scratch_limit(hsa_agent_t, usize);
    hsa_amd_queue_get_info(*mut hsa_queue_t, u32, *mut c_void);
}
