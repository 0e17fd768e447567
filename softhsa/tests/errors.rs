//! Bad input returns the status a real runtime returns, never a crash.

mod common;

use common::*;
use hsa_sys::*;
use std::ffi::c_void;
use std::ptr::{null, null_mut};

const NO_SIGNAL: hsa_signal_t = hsa_signal_t { handle: 0 };
const BAD_AGENT: hsa_agent_t = hsa_agent_t {
    handle: 0x1234_5678,
};

#[test]
fn null_out_pointers_are_invalid_arguments() {
    let (hsa, _session) = open();
    let (c, a) = (*hsa.core(), *hsa.amd());
    let gpu = hsa.gpu_agents().unwrap()[0];
    let pool = hsa.coarse_pool(gpu).unwrap();
    // SAFETY: table entries with HSA signatures; the null pointers are what is being tested.
    unsafe {
        assert_eq!(
            c.hsa_system_get_info_fn.unwrap()(HSA_SYSTEM_INFO_TIMESTAMP, null_mut()),
            HSA_STATUS_ERROR_INVALID_ARGUMENT
        );
        assert_eq!(
            c.hsa_agent_get_info_fn.unwrap()(gpu, HSA_AGENT_INFO_NAME, null_mut()),
            HSA_STATUS_ERROR_INVALID_ARGUMENT
        );
        assert_eq!(
            c.hsa_iterate_agents_fn.unwrap()(None, null_mut()),
            HSA_STATUS_ERROR_INVALID_ARGUMENT
        );
        assert_eq!(
            c.hsa_queue_create_fn.unwrap()(
                gpu,
                64,
                HSA_QUEUE_TYPE_MULTI,
                None,
                null_mut(),
                0,
                0,
                null_mut()
            ),
            HSA_STATUS_ERROR_INVALID_ARGUMENT
        );
        assert_eq!(
            c.hsa_signal_create_fn.unwrap()(1, 0, null(), null_mut()),
            HSA_STATUS_ERROR_INVALID_ARGUMENT
        );
        assert_eq!(
            c.hsa_signal_create_fn.unwrap()(1, 2, null(), &mut hsa_signal_t { handle: 0 }),
            HSA_STATUS_ERROR_INVALID_ARGUMENT
        );
        assert_eq!(
            a.hsa_amd_memory_pool_allocate_fn.unwrap()(pool, 64, 0, null_mut()),
            HSA_STATUS_ERROR_INVALID_ARGUMENT
        );
        assert_eq!(
            a.hsa_amd_memory_pool_get_info_fn.unwrap()(
                pool,
                HSA_AMD_MEMORY_POOL_INFO_SIZE,
                null_mut()
            ),
            HSA_STATUS_ERROR_INVALID_ARGUMENT
        );
        assert_eq!(
            a.hsa_amd_pointer_info_fn.unwrap()(null(), null_mut(), None, null_mut(), null_mut()),
            HSA_STATUS_ERROR_INVALID_ARGUMENT
        );
        assert_eq!(
            c.hsa_memory_copy_fn.unwrap()(null_mut(), null(), 8),
            HSA_STATUS_ERROR_INVALID_ARGUMENT
        );
        assert_eq!(
            a.hsa_amd_agent_iterate_memory_pools_fn.unwrap()(gpu, None, null_mut()),
            HSA_STATUS_ERROR_INVALID_ARGUMENT
        );
        assert_eq!(
            c.hsa_queue_destroy_fn.unwrap()(null_mut()),
            HSA_STATUS_ERROR_INVALID_ARGUMENT
        );
    }
}

#[test]
fn queue_sizes_must_be_powers_of_two_within_the_agent_limits() {
    let (hsa, _session) = open();
    let create = hsa.core().hsa_queue_create_fn.unwrap();
    let gpu = hsa.gpu_agents().unwrap()[0];
    let try_create = |size: u32, queue_type: u32, agent: hsa_agent_t| {
        let mut queue = null_mut();
        // SAFETY: table entry; `queue` is a live out pointer.
        let status = unsafe { create(agent, size, queue_type, None, null_mut(), 0, 0, &mut queue) };
        assert!(
            queue.is_null() || status == HSA_STATUS_SUCCESS,
            "no queue on failure"
        );
        status
    };
    assert_eq!(
        try_create(0, HSA_QUEUE_TYPE_MULTI, gpu),
        HSA_STATUS_ERROR_INVALID_ARGUMENT
    );
    assert_eq!(
        try_create(48, HSA_QUEUE_TYPE_MULTI, gpu),
        HSA_STATUS_ERROR_INVALID_ARGUMENT
    );
    assert_eq!(
        try_create(1 << 20, HSA_QUEUE_TYPE_MULTI, gpu),
        HSA_STATUS_ERROR_INVALID_QUEUE_CREATION
    );
    assert_eq!(try_create(64, 77, gpu), HSA_STATUS_ERROR_INVALID_ARGUMENT);
    assert_eq!(
        try_create(64, HSA_QUEUE_TYPE_MULTI, BAD_AGENT),
        HSA_STATUS_ERROR_INVALID_AGENT
    );
    let cpu = hsa.cpu_agent().unwrap();
    assert_eq!(
        try_create(64, HSA_QUEUE_TYPE_MULTI, cpu),
        HSA_STATUS_ERROR_INVALID_AGENT,
        "the CPU agent has no AQL queues"
    );
}

#[test]
fn unknown_agents_and_attributes_are_rejected() {
    let (hsa, _session) = open();
    let (c, a) = (*hsa.core(), *hsa.amd());
    let gpu = hsa.gpu_agents().unwrap()[0];
    let pool = hsa.coarse_pool(gpu).unwrap();
    let mut buffer = [0u8; 128];
    let out: *mut c_void = buffer.as_mut_ptr().cast();
    // SAFETY: table entries; `buffer` is large enough for any attribute.
    unsafe {
        assert_eq!(
            c.hsa_agent_get_info_fn.unwrap()(BAD_AGENT, HSA_AGENT_INFO_NAME, out),
            HSA_STATUS_ERROR_INVALID_AGENT
        );
        assert_eq!(
            c.hsa_agent_get_info_fn.unwrap()(hsa_agent_t { handle: 0 }, HSA_AGENT_INFO_NAME, out),
            HSA_STATUS_ERROR_INVALID_AGENT
        );
        assert_eq!(
            c.hsa_agent_get_info_fn.unwrap()(gpu, 0x7777, out),
            HSA_STATUS_ERROR_INVALID_ARGUMENT
        );
        assert_eq!(
            c.hsa_system_get_info_fn.unwrap()(0x7777, out),
            HSA_STATUS_ERROR_INVALID_ARGUMENT
        );
        assert_eq!(
            a.hsa_amd_memory_pool_get_info_fn.unwrap()(pool, 0x7777, out),
            HSA_STATUS_ERROR_INVALID_ARGUMENT
        );
        assert_eq!(
            a.hsa_amd_memory_pool_get_info_fn.unwrap()(
                hsa_amd_memory_pool_t { handle: 1 },
                HSA_AMD_MEMORY_POOL_INFO_SIZE,
                out
            ),
            HSA_STATUS_ERROR_INVALID_MEMORY_POOL
        );
        assert_eq!(
            a.hsa_amd_agent_iterate_memory_pools_fn.unwrap()(BAD_AGENT, None, null_mut()),
            HSA_STATUS_ERROR_INVALID_AGENT
        );
        assert_eq!(
            a.hsa_amd_agent_memory_pool_get_info_fn.unwrap()(
                BAD_AGENT,
                pool,
                HSA_AMD_AGENT_MEMORY_POOL_INFO_ACCESS,
                out
            ),
            HSA_STATUS_ERROR_INVALID_AGENT
        );
    }
}

#[test]
fn a_zero_signal_handle_is_an_invalid_signal() {
    let (hsa, _session) = open();
    let (c, a) = (*hsa.core(), *hsa.amd());
    let gpu = hsa.gpu_agents().unwrap()[0];
    let pool = hsa.coarse_pool(gpu).unwrap();
    let buffer = hsa.allocate(pool, 64).unwrap();
    let live = hsa.signal_create(1).unwrap();
    // SAFETY: table entries with HSA signatures; the zero handle is what is being tested.
    unsafe {
        // hsa.h: "HSA_STATUS_ERROR_INVALID_ARGUMENT The handle in signal is 0."
        assert_eq!(
            c.hsa_signal_destroy_fn.unwrap()(NO_SIGNAL),
            HSA_STATUS_ERROR_INVALID_ARGUMENT
        );
        assert_eq!(c.hsa_signal_load_scacquire_fn.unwrap()(NO_SIGNAL), 0);
        c.hsa_signal_store_screlease_fn.unwrap()(NO_SIGNAL, 5);
        c.hsa_signal_add_scacq_screl_fn.unwrap()(NO_SIGNAL, 5);
        assert_eq!(c.hsa_signal_cas_scacq_screl_fn.unwrap()(NO_SIGNAL, 0, 1), 0);
        assert_eq!(
            c.hsa_signal_wait_scacquire_fn.unwrap()(
                NO_SIGNAL,
                HSA_SIGNAL_CONDITION_EQ,
                1,
                u64::MAX,
                HSA_WAIT_STATE_BLOCKED
            ),
            0,
            "returns at once"
        );
        assert_eq!(
            a.hsa_amd_signal_async_handler_fn.unwrap()(
                NO_SIGNAL,
                HSA_SIGNAL_CONDITION_EQ,
                0,
                None,
                null_mut()
            ),
            HSA_STATUS_ERROR_INVALID_SIGNAL
        );
        let copy = a.hsa_amd_memory_async_copy_fn.unwrap();
        assert_eq!(
            copy(
                buffer.cast(),
                gpu,
                buffer.add(32).cast(),
                gpu,
                16,
                0,
                null(),
                NO_SIGNAL
            ),
            HSA_STATUS_ERROR_INVALID_SIGNAL
        );
        assert_eq!(
            copy(
                buffer.cast(),
                gpu,
                buffer.add(32).cast(),
                gpu,
                16,
                1,
                &NO_SIGNAL,
                live
            ),
            HSA_STATUS_ERROR_INVALID_SIGNAL
        );
        let mut time = hsa_amd_profiling_dispatch_time_t::default();
        assert_eq!(
            a.hsa_amd_profiling_get_dispatch_time_fn.unwrap()(gpu, NO_SIGNAL, &mut time),
            HSA_STATUS_ERROR_INVALID_SIGNAL
        );
        let mut ptr = null_mut();
        assert_eq!(
            a.hsa_amd_signal_value_pointer_fn.unwrap()(NO_SIGNAL, &mut ptr),
            HSA_STATUS_ERROR_INVALID_SIGNAL
        );
    }
    assert_eq!(hsa.signal_load(live), 1, "the rejected copy never ran");
    hsa.free(buffer).unwrap();
}

#[test]
fn a_pool_refuses_zero_sized_and_over_limit_allocations() {
    let (hsa, _session) = open();
    let gpu = hsa.gpu_agents().unwrap()[0];
    let pool = hsa.coarse_pool(gpu).unwrap();
    assert_eq!(
        hsa.allocate(pool, 0),
        Err(HSA_STATUS_ERROR_INVALID_ARGUMENT)
    );
    assert_eq!(
        hsa.allocate(pool, (16 << 30) + 1),
        Err(HSA_STATUS_ERROR_INVALID_ALLOCATION)
    );
    assert_eq!(
        hsa.allocate(pool, usize::MAX),
        Err(HSA_STATUS_ERROR_INVALID_ALLOCATION)
    );
    assert_eq!(
        hsa.allocate(hsa_amd_memory_pool_t { handle: 1 }, 64),
        Err(HSA_STATUS_ERROR_INVALID_MEMORY_POOL)
    );
}

#[test]
fn queue_entries_given_an_unknown_queue_neither_crash_nor_succeed() {
    let (hsa, _session) = open();
    let (c, a) = (*hsa.core(), *hsa.amd());
    let mut fake = hsa_queue_t::default();
    let q: *mut hsa_queue_t = &mut fake;
    // SAFETY: table entries; the fake queue is readable memory the runtime must not trust.
    unsafe {
        assert_eq!(c.hsa_queue_load_read_index_scacquire_fn.unwrap()(q), 0);
        assert_eq!(c.hsa_queue_add_write_index_relaxed_fn.unwrap()(q, 1), 0);
        c.hsa_queue_store_write_index_screlease_fn.unwrap()(q, 9);
        assert_eq!(
            c.hsa_queue_destroy_fn.unwrap()(q),
            HSA_STATUS_ERROR_INVALID_QUEUE
        );
        assert_eq!(
            c.hsa_queue_inactivate_fn.unwrap()(q),
            HSA_STATUS_ERROR_INVALID_QUEUE
        );
        assert_eq!(
            a.hsa_amd_profiling_set_profiler_enabled_fn.unwrap()(q, 1),
            HSA_STATUS_ERROR_INVALID_QUEUE
        );
        assert_eq!(
            a.hsa_amd_queue_intercept_register_fn.unwrap()(q, None, null_mut()),
            HSA_STATUS_ERROR_INVALID_QUEUE
        );
        assert_eq!(
            a.hsa_amd_queue_set_priority_fn.unwrap()(q, HSA_AMD_QUEUE_PRIORITY_HIGH),
            HSA_STATUS_ERROR_INVALID_QUEUE
        );
    }
    assert_eq!(fake.size, 0, "the fake queue was not written");
}

#[test]
fn tool_facing_queue_settings_are_accepted_on_real_queues() {
    let (hsa, _session) = open();
    let (c, a) = (*hsa.core(), *hsa.amd());
    let gpu = hsa.gpu_agents().unwrap()[0];
    let queue = hsa.queue_create(gpu, 16).unwrap();
    let mut mask = [0u32; 2];
    // SAFETY: table entries on a live queue; the mask arrays have the declared bit counts.
    unsafe {
        assert_eq!(
            a.hsa_amd_queue_set_priority_fn.unwrap()(queue, HSA_AMD_QUEUE_PRIORITY_HIGH),
            HSA_STATUS_SUCCESS
        );
        assert_eq!(
            a.hsa_amd_queue_set_priority_fn.unwrap()(queue, 9),
            HSA_STATUS_ERROR_INVALID_ARGUMENT
        );
        assert_eq!(
            a.hsa_amd_queue_cu_set_mask_fn.unwrap()(queue, 32, &0b1),
            HSA_STATUS_SUCCESS
        );
        assert_eq!(
            a.hsa_amd_queue_cu_set_mask_fn.unwrap()(queue, 31, &0b1),
            HSA_STATUS_ERROR_INVALID_ARGUMENT
        );
        assert_eq!(
            a.hsa_amd_queue_cu_get_mask_fn.unwrap()(queue, 64, mask.as_mut_ptr()),
            HSA_STATUS_SUCCESS
        );
        assert_eq!(mask, [0b1, 0]);
        assert_eq!(
            a.hsa_amd_profiling_async_copy_enable_fn.unwrap()(false),
            HSA_STATUS_SUCCESS
        );
        assert_eq!(
            c.hsa_queue_inactivate_fn.unwrap()(queue),
            HSA_STATUS_SUCCESS
        );
        hsa.queue_destroy(queue).unwrap();
    }
}

#[test]
fn a_cu_mask_of_zero_bits_enables_every_compute_unit_again() {
    // hsa_ext_amd.h: "If num_cu_mask_count is 0 then the request is interpreted as a request
    // to enable all CUs and no cu_mask array need be given."
    let (hsa, _session) = open();
    let a = *hsa.amd();
    let gpu = hsa.gpu_agents().unwrap()[0];
    let queue = hsa.queue_create(gpu, 16).unwrap();
    let mut initial = [0u32; 4];
    let mut after = [0u32; 4];
    // SAFETY: table entries on a live queue; the mask arrays hold 128 bits.
    unsafe {
        assert_eq!(
            a.hsa_amd_queue_cu_get_mask_fn.unwrap()(queue, 128, initial.as_mut_ptr()),
            HSA_STATUS_SUCCESS
        );
        assert_eq!(
            a.hsa_amd_queue_cu_set_mask_fn.unwrap()(queue, 32, &0b1),
            HSA_STATUS_SUCCESS
        );
        assert_eq!(
            a.hsa_amd_queue_cu_set_mask_fn.unwrap()(queue, 0, std::ptr::null()),
            HSA_STATUS_SUCCESS
        );
        assert_eq!(
            a.hsa_amd_queue_cu_get_mask_fn.unwrap()(queue, 128, after.as_mut_ptr()),
            HSA_STATUS_SUCCESS
        );
        hsa.queue_destroy(queue).unwrap();
    }
    assert_ne!(
        initial,
        [0b1, 0, 0, 0],
        "the agent has more than one compute unit"
    );
    assert_eq!(after, initial, "every compute unit is enabled again");
}

#[test]
fn entries_softhsa_does_not_provide_return_an_error() {
    let (hsa, _session) = open();
    let (c, a) = (*hsa.core(), *hsa.amd());
    let mut ipc = hsa_amd_ipc_memory_t::default();
    let mut local = [0u8; 16];
    // SAFETY: table entries; out pointers are live locals.
    unsafe {
        assert_eq!(
            c.hsa_code_object_destroy_fn.unwrap()(hsa_code_object_t { handle: 1 }),
            HSA_STATUS_ERROR
        );
        assert_eq!(
            a.hsa_amd_ipc_memory_create_fn.unwrap()(local.as_mut_ptr().cast(), 16, &mut ipc),
            HSA_STATUS_ERROR
        );
        assert_eq!(
            c.hsa_system_get_extension_table_fn.unwrap()(0, 1, 0, local.as_mut_ptr().cast()),
            HSA_STATUS_ERROR
        );
    }
}
