//! The API table layouts of ROCm releases whose headers differ from the bound ones.
//!
//! [`crate::AmdExtTable`] is the AMD extension table of ROCm 5.2.3's `hsa_api_trace.h` (what
//! the bindings are generated from); ROCm 5.2 to 5.4 hand out exactly that table (major 1, 400
//! bytes) and 5.5 the same with three entries more (424 bytes: `hsa_amd_spm_*`, inserted after
//! the entries kreplay uses). ROCm 5.6 inserted `hsa_amd_memory_async_copy_on_engine` and
//! `hsa_amd_memory_copy_engine_status` right after `hsa_amd_memory_async_copy`, moving every
//! later entry by 16 bytes, under the same major 1 (456 bytes). From ROCm 6.0 (majors 2) the
//! tables only grow by appending, so [`AmdExtTableV2`] (ROCm 5.6's order, then the entries 6.0
//! to 6.2 appended) describes every later runtime up to its own size; a newer runtime's table
//! is longer and its `minor_id` (the size it was built with) says how much of it exists.
//!
//! The core table never changed shape (125 entries, 1016 bytes; major 2 from ROCm 6.0). The root
//! table gained `tools_` in 6.1 (major 3) and `pc_sampling_ext_` in 6.2: [`HsaApiTableV3`].
//!
//! The order of entries is taken from the public `hsa_api_trace.h` of each release; the offsets
//! of every entry kreplay uses are asserted below, so a mistake here does not compile.

use std::ffi::{c_int, c_void};

use crate::*;

/// `hsa_amd_sdma_engine_id_t` (ROCm 5.6+): one bit per SDMA engine.
pub type hsa_amd_sdma_engine_id_t = u32;
/// `hsa_amd_memory_type_t` (ROCm 6.0+).
pub type hsa_amd_memory_type_t = u32;
/// `MEMORY_TYPE_NONE`.
pub const MEMORY_TYPE_NONE: hsa_amd_memory_type_t = 0;
/// `MEMORY_TYPE_PINNED`.
pub const MEMORY_TYPE_PINNED: hsa_amd_memory_type_t = 1;
/// `hsa_queue_info_attribute_t` (ROCm 6.2+).
pub type hsa_queue_info_attribute_t = u32;

/// `hsa_amd_vmem_alloc_handle_t` (ROCm 6.0+): a physical memory handle of the virtual memory API.
#[repr(C)]
#[derive(Debug, Default, Copy, Clone, PartialEq, Eq, Hash)]
pub struct hsa_amd_vmem_alloc_handle_t {
    pub handle: u64,
}

/// `hsa_amd_memory_access_desc_t` (ROCm 6.0+): one agent's access to a virtual memory mapping.
#[repr(C)]
#[derive(Debug, Default, Copy, Clone)]
pub struct hsa_amd_memory_access_desc_t {
    pub permissions: hsa_access_permission_t,
    pub agent_handle: hsa_agent_t,
}

/// The root table of ROCm 6.1 and later (major 3): ROCm 5.x and 6.0's root (48 bytes), then
/// `tools_` (6.1, 56 bytes) and `pc_sampling_ext_` (6.2, 64 bytes). The two tables kreplay
/// never uses are opaque here.
#[repr(C)]
#[derive(Debug, Copy, Clone)]
pub struct HsaApiTableV3 {
    pub version: ApiTableVersion,
    pub core_: *mut CoreApiTable,
    pub amd_ext_: *mut AmdExtTable,
    pub finalizer_ext_: *mut FinalizerExtTable,
    pub image_ext_: *mut ImageExtTable,
    pub tools_: *mut c_void,
    pub pc_sampling_ext_: *mut c_void,
}

impl Default for HsaApiTableV3 {
    fn default() -> Self {
        HsaApiTableV3 {
            version: ApiTableVersion::default(),
            core_: std::ptr::null_mut(),
            amd_ext_: std::ptr::null_mut(),
            finalizer_ext_: std::ptr::null_mut(),
            image_ext_: std::ptr::null_mut(),
            tools_: std::ptr::null_mut(),
            pc_sampling_ext_: std::ptr::null_mut(),
        }
    }
}

/// The AMD extension table in the order of ROCm 5.6 and later (majors 1 at 456 bytes, 2 from
/// ROCm 6.0), through the last entry ROCm 6.2 appended (576 bytes) and the ROCm 7 entries up to
/// `hsa_amd_agent_preload` (AMD extension interface 1.19, 656 bytes), in the order of the public
/// `hsa_api_trace.h`. The entries shared with [`AmdExtTable`] have the same names and types; the
/// ROCm 7 entries kreplay never calls are typed as opaque function pointers (only their place
/// matters).
#[repr(C)]
#[derive(Debug, Default, Copy, Clone)]
pub struct AmdExtTableV2 {
    pub version: ApiTableVersion,
    pub hsa_amd_coherency_get_type_fn: Option<
        unsafe extern "C" fn(
            arg1: hsa_agent_t,
            arg2: *mut hsa_amd_coherency_type_t,
        ) -> hsa_status_t,
    >,
    pub hsa_amd_coherency_set_type_fn: Option<
        unsafe extern "C" fn(arg1: hsa_agent_t, arg2: hsa_amd_coherency_type_t) -> hsa_status_t,
    >,
    pub hsa_amd_profiling_set_profiler_enabled_fn:
        Option<unsafe extern "C" fn(arg1: *mut hsa_queue_t, arg2: c_int) -> hsa_status_t>,
    pub hsa_amd_profiling_async_copy_enable_fn:
        Option<unsafe extern "C" fn(arg1: bool) -> hsa_status_t>,
    pub hsa_amd_profiling_get_dispatch_time_fn: Option<
        unsafe extern "C" fn(
            arg1: hsa_agent_t,
            arg2: hsa_signal_t,
            arg3: *mut hsa_amd_profiling_dispatch_time_t,
        ) -> hsa_status_t,
    >,
    pub hsa_amd_profiling_get_async_copy_time_fn: Option<
        unsafe extern "C" fn(
            arg1: hsa_signal_t,
            arg2: *mut hsa_amd_profiling_async_copy_time_t,
        ) -> hsa_status_t,
    >,
    pub hsa_amd_profiling_convert_tick_to_system_domain_fn:
        Option<unsafe extern "C" fn(arg1: hsa_agent_t, arg2: u64, arg3: *mut u64) -> hsa_status_t>,
    pub hsa_amd_signal_async_handler_fn: Option<
        unsafe extern "C" fn(
            arg1: hsa_signal_t,
            arg2: hsa_signal_condition_t,
            arg3: hsa_signal_value_t,
            arg4: hsa_amd_signal_handler,
            arg5: *mut c_void,
        ) -> hsa_status_t,
    >,
    pub hsa_amd_async_function_fn: Option<
        unsafe extern "C" fn(
            arg1: Option<unsafe extern "C" fn(arg1: *mut c_void)>,
            arg2: *mut c_void,
        ) -> hsa_status_t,
    >,
    pub hsa_amd_signal_wait_any_fn: Option<
        unsafe extern "C" fn(
            arg1: u32,
            arg2: *mut hsa_signal_t,
            arg3: *mut hsa_signal_condition_t,
            arg4: *mut hsa_signal_value_t,
            arg5: u64,
            arg6: hsa_wait_state_t,
            arg7: *mut hsa_signal_value_t,
        ) -> u32,
    >,
    pub hsa_amd_queue_cu_set_mask_fn: Option<
        unsafe extern "C" fn(arg1: *const hsa_queue_t, arg2: u32, arg3: *const u32) -> hsa_status_t,
    >,
    pub hsa_amd_memory_pool_get_info_fn: Option<
        unsafe extern "C" fn(
            arg1: hsa_amd_memory_pool_t,
            arg2: hsa_amd_memory_pool_info_t,
            arg3: *mut c_void,
        ) -> hsa_status_t,
    >,
    pub hsa_amd_agent_iterate_memory_pools_fn: Option<
        unsafe extern "C" fn(
            arg1: hsa_agent_t,
            arg2: Option<
                unsafe extern "C" fn(
                    arg1: hsa_amd_memory_pool_t,
                    arg2: *mut c_void,
                ) -> hsa_status_t,
            >,
            arg3: *mut c_void,
        ) -> hsa_status_t,
    >,
    pub hsa_amd_memory_pool_allocate_fn: Option<
        unsafe extern "C" fn(
            arg1: hsa_amd_memory_pool_t,
            arg2: usize,
            arg3: u32,
            arg4: *mut *mut c_void,
        ) -> hsa_status_t,
    >,
    pub hsa_amd_memory_pool_free_fn:
        Option<unsafe extern "C" fn(arg1: *mut c_void) -> hsa_status_t>,
    pub hsa_amd_memory_async_copy_fn: Option<
        unsafe extern "C" fn(
            arg1: *mut c_void,
            arg2: hsa_agent_t,
            arg3: *const c_void,
            arg4: hsa_agent_t,
            arg5: usize,
            arg6: u32,
            arg7: *const hsa_signal_t,
            arg8: hsa_signal_t,
        ) -> hsa_status_t,
    >,
    pub hsa_amd_memory_async_copy_on_engine_fn: Option<
        unsafe extern "C" fn(
            dst: *mut c_void,
            dst_agent: hsa_agent_t,
            src: *const c_void,
            src_agent: hsa_agent_t,
            size: usize,
            num_dep_signals: u32,
            dep_signals: *const hsa_signal_t,
            completion_signal: hsa_signal_t,
            engine_id: hsa_amd_sdma_engine_id_t,
            force_copy_on_sdma: bool,
        ) -> hsa_status_t,
    >,
    pub hsa_amd_memory_copy_engine_status_fn: Option<
        unsafe extern "C" fn(
            dst_agent: hsa_agent_t,
            src_agent: hsa_agent_t,
            engine_ids_mask: *mut u32,
        ) -> hsa_status_t,
    >,
    pub hsa_amd_agent_memory_pool_get_info_fn: Option<
        unsafe extern "C" fn(
            arg1: hsa_agent_t,
            arg2: hsa_amd_memory_pool_t,
            arg3: hsa_amd_agent_memory_pool_info_t,
            arg4: *mut c_void,
        ) -> hsa_status_t,
    >,
    pub hsa_amd_agents_allow_access_fn: Option<
        unsafe extern "C" fn(
            arg1: u32,
            arg2: *const hsa_agent_t,
            arg3: *const u32,
            arg4: *const c_void,
        ) -> hsa_status_t,
    >,
    pub hsa_amd_memory_pool_can_migrate_fn: Option<
        unsafe extern "C" fn(
            arg1: hsa_amd_memory_pool_t,
            arg2: hsa_amd_memory_pool_t,
            arg3: *mut bool,
        ) -> hsa_status_t,
    >,
    pub hsa_amd_memory_migrate_fn: Option<
        unsafe extern "C" fn(
            arg1: *const c_void,
            arg2: hsa_amd_memory_pool_t,
            arg3: u32,
        ) -> hsa_status_t,
    >,
    pub hsa_amd_memory_lock_fn: Option<
        unsafe extern "C" fn(
            arg1: *mut c_void,
            arg2: usize,
            arg3: *mut hsa_agent_t,
            arg4: c_int,
            arg5: *mut *mut c_void,
        ) -> hsa_status_t,
    >,
    pub hsa_amd_memory_unlock_fn: Option<unsafe extern "C" fn(arg1: *mut c_void) -> hsa_status_t>,
    pub hsa_amd_memory_fill_fn:
        Option<unsafe extern "C" fn(arg1: *mut c_void, arg2: u32, arg3: usize) -> hsa_status_t>,
    pub hsa_amd_interop_map_buffer_fn: Option<
        unsafe extern "C" fn(
            arg1: u32,
            arg2: *mut hsa_agent_t,
            arg3: c_int,
            arg4: u32,
            arg5: *mut usize,
            arg6: *mut *mut c_void,
            arg7: *mut usize,
            arg8: *mut *const c_void,
        ) -> hsa_status_t,
    >,
    pub hsa_amd_interop_unmap_buffer_fn:
        Option<unsafe extern "C" fn(arg1: *mut c_void) -> hsa_status_t>,
    pub hsa_amd_image_create_fn: Option<
        unsafe extern "C" fn(
            arg1: hsa_agent_t,
            arg2: *const hsa_ext_image_descriptor_t,
            arg3: *const hsa_amd_image_descriptor_t,
            arg4: *const c_void,
            arg5: hsa_access_permission_t,
            arg6: *mut hsa_ext_image_t,
        ) -> hsa_status_t,
    >,
    pub hsa_amd_pointer_info_fn: Option<
        unsafe extern "C" fn(
            arg1: *const c_void,
            arg2: *mut hsa_amd_pointer_info_t,
            arg3: Option<unsafe extern "C" fn(arg1: usize) -> *mut c_void>,
            arg4: *mut u32,
            arg5: *mut *mut hsa_agent_t,
        ) -> hsa_status_t,
    >,
    pub hsa_amd_pointer_info_set_userdata_fn:
        Option<unsafe extern "C" fn(arg1: *const c_void, arg2: *mut c_void) -> hsa_status_t>,
    pub hsa_amd_ipc_memory_create_fn: Option<
        unsafe extern "C" fn(
            arg1: *mut c_void,
            arg2: usize,
            arg3: *mut hsa_amd_ipc_memory_t,
        ) -> hsa_status_t,
    >,
    pub hsa_amd_ipc_memory_attach_fn: Option<
        unsafe extern "C" fn(
            arg1: *const hsa_amd_ipc_memory_t,
            arg2: usize,
            arg3: u32,
            arg4: *const hsa_agent_t,
            arg5: *mut *mut c_void,
        ) -> hsa_status_t,
    >,
    pub hsa_amd_ipc_memory_detach_fn:
        Option<unsafe extern "C" fn(arg1: *mut c_void) -> hsa_status_t>,
    pub hsa_amd_signal_create_fn: Option<
        unsafe extern "C" fn(
            arg1: hsa_signal_value_t,
            arg2: u32,
            arg3: *const hsa_agent_t,
            arg4: u64,
            arg5: *mut hsa_signal_t,
        ) -> hsa_status_t,
    >,
    pub hsa_amd_ipc_signal_create_fn: Option<
        unsafe extern "C" fn(arg1: hsa_signal_t, arg2: *mut hsa_amd_ipc_signal_t) -> hsa_status_t,
    >,
    pub hsa_amd_ipc_signal_attach_fn: Option<
        unsafe extern "C" fn(
            arg1: *const hsa_amd_ipc_signal_t,
            arg2: *mut hsa_signal_t,
        ) -> hsa_status_t,
    >,
    pub hsa_amd_register_system_event_handler_fn: Option<
        unsafe extern "C" fn(
            arg1: hsa_amd_system_event_callback_t,
            arg2: *mut c_void,
        ) -> hsa_status_t,
    >,
    pub hsa_amd_queue_intercept_create_fn: Option<
        unsafe extern "C" fn(
            arg1: hsa_agent_t,
            arg2: u32,
            arg3: hsa_queue_type32_t,
            arg4: Option<
                unsafe extern "C" fn(arg1: hsa_status_t, arg2: *mut hsa_queue_t, arg3: *mut c_void),
            >,
            arg5: *mut c_void,
            arg6: u32,
            arg7: u32,
            arg8: *mut *mut hsa_queue_t,
        ) -> hsa_status_t,
    >,
    pub hsa_amd_queue_intercept_register_fn: Option<
        unsafe extern "C" fn(
            arg1: *mut hsa_queue_t,
            arg2: hsa_amd_queue_intercept_handler,
            arg3: *mut c_void,
        ) -> hsa_status_t,
    >,
    pub hsa_amd_queue_set_priority_fn: Option<
        unsafe extern "C" fn(
            arg1: *mut hsa_queue_t,
            arg2: hsa_amd_queue_priority_t,
        ) -> hsa_status_t,
    >,
    pub hsa_amd_memory_async_copy_rect_fn: Option<
        unsafe extern "C" fn(
            arg1: *const hsa_pitched_ptr_t,
            arg2: *const hsa_dim3_t,
            arg3: *const hsa_pitched_ptr_t,
            arg4: *const hsa_dim3_t,
            arg5: *const hsa_dim3_t,
            arg6: hsa_agent_t,
            arg7: hsa_amd_copy_direction_t,
            arg8: u32,
            arg9: *const hsa_signal_t,
            arg10: hsa_signal_t,
        ) -> hsa_status_t,
    >,
    pub hsa_amd_runtime_queue_create_register_fn: Option<
        unsafe extern "C" fn(
            arg1: hsa_amd_runtime_queue_notifier,
            arg2: *mut c_void,
        ) -> hsa_status_t,
    >,
    pub hsa_amd_memory_lock_to_pool_fn: Option<
        unsafe extern "C" fn(
            arg1: *mut c_void,
            arg2: usize,
            arg3: *mut hsa_agent_t,
            arg4: c_int,
            arg5: hsa_amd_memory_pool_t,
            arg6: u32,
            arg7: *mut *mut c_void,
        ) -> hsa_status_t,
    >,
    pub hsa_amd_register_deallocation_callback_fn: Option<
        unsafe extern "C" fn(
            arg1: *mut c_void,
            arg2: hsa_amd_deallocation_callback_t,
            arg3: *mut c_void,
        ) -> hsa_status_t,
    >,
    pub hsa_amd_deregister_deallocation_callback_fn: Option<
        unsafe extern "C" fn(
            arg1: *mut c_void,
            arg2: hsa_amd_deallocation_callback_t,
        ) -> hsa_status_t,
    >,
    pub hsa_amd_signal_value_pointer_fn: Option<
        unsafe extern "C" fn(
            arg1: hsa_signal_t,
            arg2: *mut *mut hsa_signal_value_t,
        ) -> hsa_status_t,
    >,
    pub hsa_amd_svm_attributes_set_fn: Option<
        unsafe extern "C" fn(
            arg1: *mut c_void,
            arg2: usize,
            arg3: *mut hsa_amd_svm_attribute_pair_t,
            arg4: usize,
        ) -> hsa_status_t,
    >,
    pub hsa_amd_svm_attributes_get_fn: Option<
        unsafe extern "C" fn(
            arg1: *mut c_void,
            arg2: usize,
            arg3: *mut hsa_amd_svm_attribute_pair_t,
            arg4: usize,
        ) -> hsa_status_t,
    >,
    pub hsa_amd_svm_prefetch_async_fn: Option<
        unsafe extern "C" fn(
            arg1: *mut c_void,
            arg2: usize,
            arg3: hsa_agent_t,
            arg4: u32,
            arg5: *const hsa_signal_t,
            arg6: hsa_signal_t,
        ) -> hsa_status_t,
    >,
    pub hsa_amd_spm_acquire_fn:
        Option<unsafe extern "C" fn(preferred_agent: hsa_agent_t) -> hsa_status_t>,
    pub hsa_amd_spm_release_fn:
        Option<unsafe extern "C" fn(preferred_agent: hsa_agent_t) -> hsa_status_t>,
    pub hsa_amd_spm_set_dest_buffer_fn: Option<
        unsafe extern "C" fn(
            preferred_agent: hsa_agent_t,
            size_in_bytes: usize,
            timeout: *mut u32,
            size_copied: *mut u32,
            dest: *mut c_void,
            is_data_loss: *mut bool,
        ) -> hsa_status_t,
    >,
    pub hsa_amd_queue_cu_get_mask_fn: Option<
        unsafe extern "C" fn(arg1: *const hsa_queue_t, arg2: u32, arg3: *mut u32) -> hsa_status_t,
    >,
    pub hsa_amd_portable_export_dmabuf_fn: Option<
        unsafe extern "C" fn(
            ptr: *const c_void,
            size: usize,
            dmabuf: *mut c_int,
            offset: *mut u64,
        ) -> hsa_status_t,
    >,
    pub hsa_amd_portable_close_dmabuf_fn:
        Option<unsafe extern "C" fn(dmabuf: c_int) -> hsa_status_t>,
    pub hsa_amd_vmem_address_reserve_fn: Option<
        unsafe extern "C" fn(
            va: *mut *mut c_void,
            size: usize,
            address: u64,
            flags: u64,
        ) -> hsa_status_t,
    >,
    pub hsa_amd_vmem_address_free_fn:
        Option<unsafe extern "C" fn(va: *mut c_void, size: usize) -> hsa_status_t>,
    pub hsa_amd_vmem_handle_create_fn: Option<
        unsafe extern "C" fn(
            pool: hsa_amd_memory_pool_t,
            size: usize,
            type_: hsa_amd_memory_type_t,
            flags: u64,
            memory_handle: *mut hsa_amd_vmem_alloc_handle_t,
        ) -> hsa_status_t,
    >,
    pub hsa_amd_vmem_handle_release_fn:
        Option<unsafe extern "C" fn(memory_handle: hsa_amd_vmem_alloc_handle_t) -> hsa_status_t>,
    pub hsa_amd_vmem_map_fn: Option<
        unsafe extern "C" fn(
            va: *mut c_void,
            size: usize,
            in_offset: usize,
            memory_handle: hsa_amd_vmem_alloc_handle_t,
            flags: u64,
        ) -> hsa_status_t,
    >,
    pub hsa_amd_vmem_unmap_fn:
        Option<unsafe extern "C" fn(va: *mut c_void, size: usize) -> hsa_status_t>,
    pub hsa_amd_vmem_set_access_fn: Option<
        unsafe extern "C" fn(
            va: *mut c_void,
            size: usize,
            desc: *const hsa_amd_memory_access_desc_t,
            desc_cnt: usize,
        ) -> hsa_status_t,
    >,
    pub hsa_amd_vmem_get_access_fn: Option<
        unsafe extern "C" fn(
            va: *mut c_void,
            perms: *mut hsa_access_permission_t,
            agent_handle: hsa_agent_t,
        ) -> hsa_status_t,
    >,
    pub hsa_amd_vmem_export_shareable_handle_fn: Option<
        unsafe extern "C" fn(
            dmabuf_fd: *mut c_int,
            handle: hsa_amd_vmem_alloc_handle_t,
            flags: u64,
        ) -> hsa_status_t,
    >,
    pub hsa_amd_vmem_import_shareable_handle_fn: Option<
        unsafe extern "C" fn(
            dmabuf_fd: c_int,
            handle: *mut hsa_amd_vmem_alloc_handle_t,
        ) -> hsa_status_t,
    >,
    pub hsa_amd_vmem_retain_alloc_handle_fn: Option<
        unsafe extern "C" fn(
            memory_handle: *mut hsa_amd_vmem_alloc_handle_t,
            addr: *mut c_void,
        ) -> hsa_status_t,
    >,
    pub hsa_amd_vmem_get_alloc_properties_from_handle_fn: Option<
        unsafe extern "C" fn(
            memory_handle: hsa_amd_vmem_alloc_handle_t,
            pool: *mut hsa_amd_memory_pool_t,
            type_: *mut hsa_amd_memory_type_t,
        ) -> hsa_status_t,
    >,
    pub hsa_amd_agent_set_async_scratch_limit_fn:
        Option<unsafe extern "C" fn(agent: hsa_agent_t, threshold: usize) -> hsa_status_t>,
    pub hsa_amd_queue_get_info_fn: Option<
        unsafe extern "C" fn(
            queue: *mut hsa_queue_t,
            attribute: hsa_queue_info_attribute_t,
            value: *mut c_void,
        ) -> hsa_status_t,
    >,
    pub hsa_amd_vmem_address_reserve_align_fn: Option<
        unsafe extern "C" fn(
            va: *mut *mut c_void,
            size: usize,
            address: u64,
            alignment: u64,
            flags: u64,
        ) -> hsa_status_t,
    >,
    pub hsa_amd_enable_logging_fn: Option<OpaqueEntry>,
    pub hsa_amd_signal_wait_all_fn: Option<OpaqueEntry>,
    pub hsa_amd_memory_get_preferred_copy_engine_fn: Option<OpaqueEntry>,
    pub hsa_amd_portable_export_dmabuf_v2_fn: Option<OpaqueEntry>,
    pub hsa_amd_ais_file_write_fn: Option<OpaqueEntry>,
    pub hsa_amd_ais_file_read_fn: Option<
        unsafe extern "C" fn(
            handle: hsa_amd_ais_file_handle_t,
            device_ptr: *mut c_void,
            size: u64,
            file_offset: i64,
            size_copied: *mut u64,
            status: *mut i32,
        ) -> hsa_status_t,
    >,
    pub hsa_amd_counted_queue_acquire_fn: Option<OpaqueEntry>,
    pub hsa_amd_counted_queue_release_fn: Option<OpaqueEntry>,
    pub hsa_amd_memory_async_batch_copy_fn: Option<
        unsafe extern "C" fn(
            copy_ops: *const hsa_amd_memory_copy_op_t,
            num_copy_ops: u32,
            num_dep_signals: u32,
            dep_signals: *const hsa_signal_t,
        ) -> hsa_status_t,
    >,
    pub hsa_amd_agent_preload_fn: Option<OpaqueEntry>,
}

/// An entry of a runtime table kreplay never calls: a function pointer whose signature does not
/// matter here (never call through it).
pub type OpaqueEntry = unsafe extern "C" fn();

/// The file of `hsa_amd_ais_file_read` (ROCm 7, experimental): on Linux its `fd`.
#[repr(C)]
#[derive(Clone, Copy)]
#[allow(non_camel_case_types)]
pub union hsa_amd_ais_file_handle_t {
    pub handle: *mut c_void,
    pub fd: c_int,
    pub pad: [u8; 8],
}

impl std::fmt::Debug for hsa_amd_ais_file_handle_t {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // SAFETY: every bit pattern of the 8 bytes is a valid `[u8; 8]`.
        write!(f, "hsa_amd_ais_file_handle_t({:?})", unsafe { self.pad })
    }
}

/// `HSA_AMD_MEMORY_COPY_OP_VERSION`: the only `version` of [`hsa_amd_memory_copy_op_t`] a
/// runtime of AMD extension interface 1.17 accepts.
pub const HSA_AMD_MEMORY_COPY_OP_VERSION: u16 = 1;
/// `hsa_amd_memory_copy_op_type_t`: one source to one destination (lists when `num_entries` > 0).
pub const HSA_AMD_MEMORY_COPY_OP_LINEAR: u16 = 0;
/// `hsa_amd_memory_copy_op_type_t`: one source to the `num_entries` destinations of `dst_list`.
pub const HSA_AMD_MEMORY_COPY_OP_LINEAR_BROADCAST: u16 = 1;
/// `hsa_amd_memory_copy_op_type_t`: two buffers exchanged.
pub const HSA_AMD_MEMORY_COPY_OP_LINEAR_SWAP: u16 = 2;

/// One operation of `hsa_amd_memory_async_batch_copy` (ROCm 7, AMD extension interface 1.17),
/// laid out as the public `hsa_ext_amd.h` declares it. The header's anonymous unions are single
/// words here, named after their scalar member: `src` (or `src_list`), `src_agent` (or
/// `src_agent_list`), `dst_agent` (or `dst_agent_list`), `dst` (or `dst_list`), and `size`
/// (`size`/`unused_size`, `src_size`/`dst_size`, or `size_list`/`reserved0`); `wait` and
/// `signal` are the header's wait-before and signal-after blocks, as words. Every operation of
/// one batch carries the same `completion_signal`, set by the caller to the number of
/// operations and decremented once per operation completed.
#[repr(C)]
#[derive(Debug, Default, Copy, Clone)]
#[allow(non_camel_case_types)]
pub struct hsa_amd_memory_copy_op_t {
    pub version: u16,
    pub type_: u16,
    pub num_entries: u16,
    pub traffic_class: u16,
    pub completion_signal: hsa_signal_t,
    pub src: u64,
    pub src_agent: u64,
    pub dst_agent: u64,
    pub dst: u64,
    pub size: [u64; 2],
    pub wait: [u64; 4],
    pub signal: [u64; 3],
    pub reserved1: u64,
}

/// Sizes (`minor_id`) of the tables of each release, from the public headers.
pub mod sizes {
    /// Root table of ROCm 5.x and 6.0.
    pub const ROOT_5: u32 = 48;
    /// Root table of ROCm 6.1 (`tools_` appended).
    pub const ROOT_6_1: u32 = 56;
    /// Root table of ROCm 6.2 and later (`pc_sampling_ext_` appended).
    pub const ROOT_6_2: u32 = 64;
    /// Core table of every release since ROCm 5.0.
    pub const CORE: u32 = 1016;
    /// AMD extension table of ROCm 5.2 to 5.4.
    pub const AMD_5_2: u32 = 400;
    /// AMD extension table of ROCm 5.5 (`hsa_amd_spm_*` inserted before the last entry).
    pub const AMD_5_5: u32 = 424;
    /// AMD extension table of ROCm 5.6 and 5.7.
    pub const AMD_5_6: u32 = 456;
    /// AMD extension table of ROCm 6.0 (`hsa_amd_vmem_*` appended).
    pub const AMD_6_0: u32 = 552;
    /// AMD extension table of ROCm 6.2.
    pub const AMD_6_2: u32 = 576;
    /// AMD extension table through `hsa_amd_agent_preload` (a ROCm 7 runtime of AMD extension
    /// interface 1.19; what [`super::AmdExtTableV2`] describes). Later runtimes append more.
    pub const AMD_7_PRELOAD: u32 = 656;
}

/// Copies the entries two layouts share, by name.
macro_rules! common_entries {
    ($from:expr => $to:expr) => {{
        let (from, to) = ($from, $to);
        to.version = from.version;
        to.hsa_amd_coherency_get_type_fn = from.hsa_amd_coherency_get_type_fn;
        to.hsa_amd_coherency_set_type_fn = from.hsa_amd_coherency_set_type_fn;
        to.hsa_amd_profiling_set_profiler_enabled_fn =
            from.hsa_amd_profiling_set_profiler_enabled_fn;
        to.hsa_amd_profiling_async_copy_enable_fn = from.hsa_amd_profiling_async_copy_enable_fn;
        to.hsa_amd_profiling_get_dispatch_time_fn = from.hsa_amd_profiling_get_dispatch_time_fn;
        to.hsa_amd_profiling_get_async_copy_time_fn = from.hsa_amd_profiling_get_async_copy_time_fn;
        to.hsa_amd_profiling_convert_tick_to_system_domain_fn =
            from.hsa_amd_profiling_convert_tick_to_system_domain_fn;
        to.hsa_amd_signal_async_handler_fn = from.hsa_amd_signal_async_handler_fn;
        to.hsa_amd_async_function_fn = from.hsa_amd_async_function_fn;
        to.hsa_amd_signal_wait_any_fn = from.hsa_amd_signal_wait_any_fn;
        to.hsa_amd_queue_cu_set_mask_fn = from.hsa_amd_queue_cu_set_mask_fn;
        to.hsa_amd_memory_pool_get_info_fn = from.hsa_amd_memory_pool_get_info_fn;
        to.hsa_amd_agent_iterate_memory_pools_fn = from.hsa_amd_agent_iterate_memory_pools_fn;
        to.hsa_amd_memory_pool_allocate_fn = from.hsa_amd_memory_pool_allocate_fn;
        to.hsa_amd_memory_pool_free_fn = from.hsa_amd_memory_pool_free_fn;
        to.hsa_amd_memory_async_copy_fn = from.hsa_amd_memory_async_copy_fn;
        to.hsa_amd_agent_memory_pool_get_info_fn = from.hsa_amd_agent_memory_pool_get_info_fn;
        to.hsa_amd_agents_allow_access_fn = from.hsa_amd_agents_allow_access_fn;
        to.hsa_amd_memory_pool_can_migrate_fn = from.hsa_amd_memory_pool_can_migrate_fn;
        to.hsa_amd_memory_migrate_fn = from.hsa_amd_memory_migrate_fn;
        to.hsa_amd_memory_lock_fn = from.hsa_amd_memory_lock_fn;
        to.hsa_amd_memory_unlock_fn = from.hsa_amd_memory_unlock_fn;
        to.hsa_amd_memory_fill_fn = from.hsa_amd_memory_fill_fn;
        to.hsa_amd_interop_map_buffer_fn = from.hsa_amd_interop_map_buffer_fn;
        to.hsa_amd_interop_unmap_buffer_fn = from.hsa_amd_interop_unmap_buffer_fn;
        to.hsa_amd_image_create_fn = from.hsa_amd_image_create_fn;
        to.hsa_amd_pointer_info_fn = from.hsa_amd_pointer_info_fn;
        to.hsa_amd_pointer_info_set_userdata_fn = from.hsa_amd_pointer_info_set_userdata_fn;
        to.hsa_amd_ipc_memory_create_fn = from.hsa_amd_ipc_memory_create_fn;
        to.hsa_amd_ipc_memory_attach_fn = from.hsa_amd_ipc_memory_attach_fn;
        to.hsa_amd_ipc_memory_detach_fn = from.hsa_amd_ipc_memory_detach_fn;
        to.hsa_amd_signal_create_fn = from.hsa_amd_signal_create_fn;
        to.hsa_amd_ipc_signal_create_fn = from.hsa_amd_ipc_signal_create_fn;
        to.hsa_amd_ipc_signal_attach_fn = from.hsa_amd_ipc_signal_attach_fn;
        to.hsa_amd_register_system_event_handler_fn = from.hsa_amd_register_system_event_handler_fn;
        to.hsa_amd_queue_intercept_create_fn = from.hsa_amd_queue_intercept_create_fn;
        to.hsa_amd_queue_intercept_register_fn = from.hsa_amd_queue_intercept_register_fn;
        to.hsa_amd_queue_set_priority_fn = from.hsa_amd_queue_set_priority_fn;
        to.hsa_amd_memory_async_copy_rect_fn = from.hsa_amd_memory_async_copy_rect_fn;
        to.hsa_amd_runtime_queue_create_register_fn = from.hsa_amd_runtime_queue_create_register_fn;
        to.hsa_amd_memory_lock_to_pool_fn = from.hsa_amd_memory_lock_to_pool_fn;
        to.hsa_amd_register_deallocation_callback_fn =
            from.hsa_amd_register_deallocation_callback_fn;
        to.hsa_amd_deregister_deallocation_callback_fn =
            from.hsa_amd_deregister_deallocation_callback_fn;
        to.hsa_amd_signal_value_pointer_fn = from.hsa_amd_signal_value_pointer_fn;
        to.hsa_amd_svm_attributes_set_fn = from.hsa_amd_svm_attributes_set_fn;
        to.hsa_amd_svm_attributes_get_fn = from.hsa_amd_svm_attributes_get_fn;
        to.hsa_amd_svm_prefetch_async_fn = from.hsa_amd_svm_prefetch_async_fn;
        to.hsa_amd_queue_cu_get_mask_fn = from.hsa_amd_queue_cu_get_mask_fn;
    }};
}

impl AmdExtTableV2 {
    /// The table in this layout with the entries of a ROCm 5.2-layout table (the version header
    /// included); entries the older layout lacks are null.
    pub fn from_v1(v1: &AmdExtTable) -> Self {
        let mut v2 = AmdExtTableV2::default();
        common_entries!(v1 => &mut v2);
        v2
    }

    /// This table's entries in the ROCm 5.2 layout (the version header included): for code
    /// written against the bound layout, never to hand to a runtime as it is.
    pub fn to_v1(&self) -> AmdExtTable {
        let mut v1 = AmdExtTable::default();
        common_entries!(self => &mut v1);
        v1
    }
}

/// Asserts at compile time that each entry sits at the byte offset the headers give.
macro_rules! assert_offsets {
    ($table:ty { $($entry:ident: $offset:expr),* $(,)? }) => {
        const _: () = {
            $( assert!(
                std::mem::offset_of!($table, $entry) == $offset,
                concat!("wrong offset of ", stringify!($table), "::", stringify!($entry))
            ); )*
        };
    };
}

// The root and core tables: one layout for every supported release.
assert_offsets!(HsaApiTable {
    core_: 16,
    amd_ext_: 24,
    finalizer_ext_: 32,
    image_ext_: 40
});
assert_offsets!(HsaApiTableV3 {
    core_: 16,
    amd_ext_: 24,
    finalizer_ext_: 32,
    image_ext_: 40,
    tools_: 48,
    pc_sampling_ext_: 56,
});
// The image extension table: one layout from ROCm 5.2 to 7.x (major 1, then 2; the runtime's
// own additions, such as `hsa_amd_image_get_info_max_dim`, live past the public table).
assert_offsets!(ImageExtTable {
    hsa_ext_image_create_fn: 32,
    hsa_ext_image_import_fn: 40,
    hsa_ext_image_export_fn: 48,
    hsa_ext_image_copy_fn: 56,
    hsa_ext_image_clear_fn: 64,
    hsa_ext_image_destroy_fn: 72,
    hsa_ext_image_create_with_layout_fn: 112,
});
assert_offsets!(CoreApiTable {
    hsa_system_get_info_fn: 32,
    hsa_iterate_agents_fn: 56,
    hsa_agent_get_info_fn: 64,
    hsa_queue_create_fn: 72,
    hsa_soft_queue_create_fn: 80,
    hsa_queue_destroy_fn: 88,
    hsa_agent_iterate_regions_fn: 232,
    hsa_region_get_info_fn: 240,
    hsa_memory_allocate_fn: 280,
    hsa_memory_free_fn: 288,
    hsa_memory_copy_fn: 296,
    hsa_signal_create_fn: 312,
    hsa_signal_destroy_fn: 320,
    hsa_signal_load_scacquire_fn: 336,
    hsa_signal_wait_scacquire_fn: 368,
    hsa_signal_add_screlease_fn: 520,
    hsa_signal_subtract_screlease_fn: 552,
});

// ROCm 5.2 to 5.5 (major 1, 400 or 424 bytes): the bound layout.
assert_offsets!(AmdExtTable {
    hsa_amd_profiling_set_profiler_enabled_fn: 32,
    hsa_amd_profiling_get_dispatch_time_fn: 48,
    hsa_amd_signal_async_handler_fn: 72,
    hsa_amd_memory_pool_get_info_fn: 104,
    hsa_amd_agent_iterate_memory_pools_fn: 112,
    hsa_amd_memory_pool_allocate_fn: 120,
    hsa_amd_memory_pool_free_fn: 128,
    hsa_amd_memory_async_copy_fn: 136,
    hsa_amd_memory_lock_fn: 176,
    hsa_amd_memory_unlock_fn: 184,
    hsa_amd_memory_fill_fn: 192,
    hsa_amd_interop_map_buffer_fn: 200,
    hsa_amd_interop_unmap_buffer_fn: 208,
    hsa_amd_pointer_info_fn: 224,
    hsa_amd_ipc_memory_attach_fn: 248,
    hsa_amd_ipc_memory_detach_fn: 256,
    hsa_amd_queue_intercept_create_fn: 296,
    hsa_amd_queue_intercept_register_fn: 304,
    hsa_amd_memory_async_copy_rect_fn: 320,
    hsa_amd_memory_lock_to_pool_fn: 336,
});

// ROCm 5.6 and later (major 1 at 456 bytes, major 2 from 6.0).
assert_offsets!(AmdExtTableV2 {
    hsa_amd_profiling_set_profiler_enabled_fn: 32,
    hsa_amd_profiling_get_dispatch_time_fn: 48,
    hsa_amd_signal_async_handler_fn: 72,
    hsa_amd_memory_pool_get_info_fn: 104,
    hsa_amd_agent_iterate_memory_pools_fn: 112,
    hsa_amd_memory_pool_allocate_fn: 120,
    hsa_amd_memory_pool_free_fn: 128,
    hsa_amd_memory_async_copy_fn: 136,
    hsa_amd_memory_async_copy_on_engine_fn: 144,
    hsa_amd_memory_lock_fn: 192,
    hsa_amd_memory_unlock_fn: 200,
    hsa_amd_memory_fill_fn: 208,
    hsa_amd_interop_map_buffer_fn: 216,
    hsa_amd_interop_unmap_buffer_fn: 224,
    hsa_amd_pointer_info_fn: 240,
    hsa_amd_ipc_memory_attach_fn: 264,
    hsa_amd_ipc_memory_detach_fn: 272,
    hsa_amd_queue_intercept_create_fn: 312,
    hsa_amd_queue_intercept_register_fn: 320,
    hsa_amd_memory_async_copy_rect_fn: 336,
    hsa_amd_memory_lock_to_pool_fn: 352,
    hsa_amd_queue_cu_get_mask_fn: 432,
    hsa_amd_portable_close_dmabuf_fn: 448,
    hsa_amd_vmem_address_reserve_fn: 456,
    hsa_amd_vmem_address_free_fn: 464,
    hsa_amd_vmem_handle_create_fn: 472,
    hsa_amd_vmem_handle_release_fn: 480,
    hsa_amd_vmem_map_fn: 488,
    hsa_amd_vmem_unmap_fn: 496,
    hsa_amd_vmem_set_access_fn: 504,
    hsa_amd_vmem_get_access_fn: 512,
    hsa_amd_vmem_export_shareable_handle_fn: 520,
    hsa_amd_vmem_import_shareable_handle_fn: 528,
    hsa_amd_vmem_retain_alloc_handle_fn: 536,
    hsa_amd_vmem_get_alloc_properties_from_handle_fn: 544,
    hsa_amd_agent_set_async_scratch_limit_fn: 552,
    hsa_amd_queue_get_info_fn: 560,
    hsa_amd_vmem_address_reserve_align_fn: 568,
    hsa_amd_ais_file_read_fn: 616,
    hsa_amd_memory_async_batch_copy_fn: 640,
    hsa_amd_agent_preload_fn: 648,
});

// A batch copy's operation (ROCm 7, public hsa_ext_amd.h).
assert_offsets!(hsa_amd_memory_copy_op_t {
    version: 0,
    type_: 2,
    num_entries: 4,
    traffic_class: 6,
    completion_signal: 8,
    src: 16,
    src_agent: 24,
    dst_agent: 32,
    dst: 40,
    size: 48,
    wait: 64,
    signal: 96,
    reserved1: 120,
});
const _: () = assert!(std::mem::size_of::<hsa_amd_memory_copy_op_t>() == 128);

const _: () = {
    assert!(std::mem::size_of::<HsaApiTable>() == sizes::ROOT_5 as usize);
    assert!(std::mem::size_of::<HsaApiTableV3>() == sizes::ROOT_6_2 as usize);
    assert!(std::mem::size_of::<CoreApiTable>() == sizes::CORE as usize);
    assert!(std::mem::size_of::<AmdExtTable>() == sizes::AMD_5_2 as usize);
    assert!(std::mem::size_of::<AmdExtTableV2>() == sizes::AMD_7_PRELOAD as usize);
    assert!(
        std::mem::offset_of!(AmdExtTableV2, hsa_amd_vmem_address_reserve_align_fn) + 8
            == sizes::AMD_6_2 as usize
    );
    // ROCm 5.6's table ends with the two dma-buf entries; 6.0's with the vmem entries.
    assert!(
        std::mem::offset_of!(AmdExtTableV2, hsa_amd_portable_close_dmabuf_fn) + 8
            == sizes::AMD_5_6 as usize
    );
    assert!(
        std::mem::offset_of!(
            AmdExtTableV2,
            hsa_amd_vmem_get_alloc_properties_from_handle_fn
        ) + 8
            == sizes::AMD_6_0 as usize
    );
};

/// Whether an AMD extension table of this version is in the ROCm 5.6+ order
/// ([`AmdExtTableV2`]): major 2 or later, or major 1 at ROCm 5.6's size.
pub fn amd_ext_is_v2(version: &ApiTableVersion) -> bool {
    version.major_id >= 2 || (version.major_id == 1 && version.minor_id >= sizes::AMD_5_6)
}

/// Reads an AMD extension table of either order into the bound (ROCm 5.2) layout, by entry
/// name: for code written against the bindings that calls through a table of another release.
/// Entries past the table's declared size (`minor_id`) are null.
///
/// # Safety
/// `table` points to a readable AMD extension table at least `minor_id` bytes long.
pub unsafe fn read_amd_ext_as_v1(table: *const AmdExtTable) -> AmdExtTable {
    // SAFETY: the version header is the first 16 bytes of every table (caller: readable).
    let version = unsafe { (*table).version };
    if amd_ext_is_v2(&version) {
        // SAFETY: forwarded from the caller.
        unsafe { read_prefix::<AmdExtTableV2>(table.cast(), version.minor_id as usize) }.to_v1()
    } else {
        // SAFETY: forwarded from the caller.
        let mut v1 = unsafe { read_prefix::<AmdExtTable>(table.cast(), version.minor_id as usize) };
        if version.minor_id != sizes::AMD_5_2 {
            // ROCm 5.5 inserted hsa_amd_spm_* before the last entry of the bound layout.
            v1.hsa_amd_queue_cu_get_mask_fn = None;
        }
        v1
    }
}

/// A `T` whose first `min(len, size_of T)` bytes come from `src`, the rest zero.
///
/// # Safety
/// `len` bytes are readable at `src`; all-zero is a valid `T` (a table of nullable entries).
unsafe fn read_prefix<T: Default>(src: *const u8, len: usize) -> T {
    let mut out = T::default();
    let len = len.min(std::mem::size_of::<T>());
    // SAFETY: per the caller, and `out` has room for `len <= size_of::<T>()` bytes.
    unsafe { std::ptr::copy_nonoverlapping(src, (&raw mut out).cast::<u8>(), len) };
    out
}
