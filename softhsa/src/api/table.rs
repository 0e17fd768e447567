//! Building the [`HsaApiTable`]: every core, AMD-extension and image-extension entry is filled;
//! the finalizer table is present with null entries (softhsa has no finalizer).

use super::{amd, core, image};
use hsa_sys::layouts::AmdExtTableV2;
use hsa_sys::*;
use std::mem::size_of;
use std::sync::OnceLock;

/// The tables, allocated once and never freed, so the pointers inside stay valid.
struct Tables {
    api: HsaApiTable,
}

// SAFETY: the tables are written once, before they are shared, and never mutated after; the raw
// pointers inside point to leaked, immutable tables.
unsafe impl Sync for Tables {}
// SAFETY: see the Sync impl.
unsafe impl Send for Tables {}

fn version(major: u32, size: usize, step: u32) -> ApiTableVersion {
    ApiTableVersion {
        major_id: major,
        minor_id: u32::try_from(size).unwrap_or(u32::MAX),
        step_id: step,
        reserved: 0,
    }
}

pub(crate) fn core_table() -> CoreApiTable {
    CoreApiTable {
        version: version(
            HSA_CORE_API_TABLE_MAJOR_VERSION,
            size_of::<CoreApiTable>(),
            HSA_CORE_API_TABLE_STEP_VERSION,
        ),
        hsa_init_fn: Some(core::hsa_init),
        hsa_shut_down_fn: Some(core::hsa_shut_down),
        hsa_system_get_info_fn: Some(core::hsa_system_get_info),
        hsa_system_extension_supported_fn: Some(core::hsa_system_extension_supported),
        hsa_system_get_extension_table_fn: Some(core::hsa_system_get_extension_table),
        hsa_iterate_agents_fn: Some(core::hsa_iterate_agents),
        hsa_agent_get_info_fn: Some(core::hsa_agent_get_info),
        hsa_queue_create_fn: Some(core::hsa_queue_create),
        hsa_soft_queue_create_fn: Some(core::hsa_soft_queue_create),
        hsa_queue_destroy_fn: Some(core::hsa_queue_destroy),
        hsa_queue_inactivate_fn: Some(core::hsa_queue_inactivate),
        hsa_queue_load_read_index_scacquire_fn: Some(core::hsa_queue_load_read_index_scacquire),
        hsa_queue_load_read_index_relaxed_fn: Some(core::hsa_queue_load_read_index_relaxed),
        hsa_queue_load_write_index_scacquire_fn: Some(core::hsa_queue_load_write_index_scacquire),
        hsa_queue_load_write_index_relaxed_fn: Some(core::hsa_queue_load_write_index_relaxed),
        hsa_queue_store_write_index_relaxed_fn: Some(core::hsa_queue_store_write_index_relaxed),
        hsa_queue_store_write_index_screlease_fn: Some(core::hsa_queue_store_write_index_screlease),
        hsa_queue_cas_write_index_scacq_screl_fn: Some(core::hsa_queue_cas_write_index_scacq_screl),
        hsa_queue_cas_write_index_scacquire_fn: Some(core::hsa_queue_cas_write_index_scacquire),
        hsa_queue_cas_write_index_relaxed_fn: Some(core::hsa_queue_cas_write_index_relaxed),
        hsa_queue_cas_write_index_screlease_fn: Some(core::hsa_queue_cas_write_index_screlease),
        hsa_queue_add_write_index_scacq_screl_fn: Some(core::hsa_queue_add_write_index_scacq_screl),
        hsa_queue_add_write_index_scacquire_fn: Some(core::hsa_queue_add_write_index_scacquire),
        hsa_queue_add_write_index_relaxed_fn: Some(core::hsa_queue_add_write_index_relaxed),
        hsa_queue_add_write_index_screlease_fn: Some(core::hsa_queue_add_write_index_screlease),
        hsa_queue_store_read_index_relaxed_fn: Some(core::hsa_queue_store_read_index_relaxed),
        hsa_queue_store_read_index_screlease_fn: Some(core::hsa_queue_store_read_index_screlease),
        hsa_agent_iterate_regions_fn: Some(core::hsa_agent_iterate_regions),
        hsa_region_get_info_fn: Some(core::hsa_region_get_info),
        hsa_agent_get_exception_policies_fn: Some(core::hsa_agent_get_exception_policies),
        hsa_agent_extension_supported_fn: Some(core::hsa_agent_extension_supported),
        hsa_memory_register_fn: Some(core::hsa_memory_register),
        hsa_memory_deregister_fn: Some(core::hsa_memory_deregister),
        hsa_memory_allocate_fn: Some(core::hsa_memory_allocate),
        hsa_memory_free_fn: Some(core::hsa_memory_free),
        hsa_memory_copy_fn: Some(core::hsa_memory_copy),
        hsa_memory_assign_agent_fn: Some(core::hsa_memory_assign_agent),
        hsa_signal_create_fn: Some(core::hsa_signal_create),
        hsa_signal_destroy_fn: Some(core::hsa_signal_destroy),
        hsa_signal_load_relaxed_fn: Some(core::hsa_signal_load_relaxed),
        hsa_signal_load_scacquire_fn: Some(core::hsa_signal_load_scacquire),
        hsa_signal_store_relaxed_fn: Some(core::hsa_signal_store_relaxed),
        hsa_signal_store_screlease_fn: Some(core::hsa_signal_store_screlease),
        hsa_signal_wait_relaxed_fn: Some(core::hsa_signal_wait_relaxed),
        hsa_signal_wait_scacquire_fn: Some(core::hsa_signal_wait_scacquire),
        hsa_signal_and_relaxed_fn: Some(core::hsa_signal_and_relaxed),
        hsa_signal_and_scacquire_fn: Some(core::hsa_signal_and_scacquire),
        hsa_signal_and_screlease_fn: Some(core::hsa_signal_and_screlease),
        hsa_signal_and_scacq_screl_fn: Some(core::hsa_signal_and_scacq_screl),
        hsa_signal_or_relaxed_fn: Some(core::hsa_signal_or_relaxed),
        hsa_signal_or_scacquire_fn: Some(core::hsa_signal_or_scacquire),
        hsa_signal_or_screlease_fn: Some(core::hsa_signal_or_screlease),
        hsa_signal_or_scacq_screl_fn: Some(core::hsa_signal_or_scacq_screl),
        hsa_signal_xor_relaxed_fn: Some(core::hsa_signal_xor_relaxed),
        hsa_signal_xor_scacquire_fn: Some(core::hsa_signal_xor_scacquire),
        hsa_signal_xor_screlease_fn: Some(core::hsa_signal_xor_screlease),
        hsa_signal_xor_scacq_screl_fn: Some(core::hsa_signal_xor_scacq_screl),
        hsa_signal_exchange_relaxed_fn: Some(core::hsa_signal_exchange_relaxed),
        hsa_signal_exchange_scacquire_fn: Some(core::hsa_signal_exchange_scacquire),
        hsa_signal_exchange_screlease_fn: Some(core::hsa_signal_exchange_screlease),
        hsa_signal_exchange_scacq_screl_fn: Some(core::hsa_signal_exchange_scacq_screl),
        hsa_signal_add_relaxed_fn: Some(core::hsa_signal_add_relaxed),
        hsa_signal_add_scacquire_fn: Some(core::hsa_signal_add_scacquire),
        hsa_signal_add_screlease_fn: Some(core::hsa_signal_add_screlease),
        hsa_signal_add_scacq_screl_fn: Some(core::hsa_signal_add_scacq_screl),
        hsa_signal_subtract_relaxed_fn: Some(core::hsa_signal_subtract_relaxed),
        hsa_signal_subtract_scacquire_fn: Some(core::hsa_signal_subtract_scacquire),
        hsa_signal_subtract_screlease_fn: Some(core::hsa_signal_subtract_screlease),
        hsa_signal_subtract_scacq_screl_fn: Some(core::hsa_signal_subtract_scacq_screl),
        hsa_signal_cas_relaxed_fn: Some(core::hsa_signal_cas_relaxed),
        hsa_signal_cas_scacquire_fn: Some(core::hsa_signal_cas_scacquire),
        hsa_signal_cas_screlease_fn: Some(core::hsa_signal_cas_screlease),
        hsa_signal_cas_scacq_screl_fn: Some(core::hsa_signal_cas_scacq_screl),
        hsa_isa_from_name_fn: Some(core::hsa_isa_from_name),
        hsa_isa_get_info_fn: Some(core::hsa_isa_get_info),
        hsa_isa_compatible_fn: Some(core::hsa_isa_compatible),
        hsa_code_object_serialize_fn: Some(core::hsa_code_object_serialize),
        hsa_code_object_deserialize_fn: Some(core::hsa_code_object_deserialize),
        hsa_code_object_destroy_fn: Some(core::hsa_code_object_destroy),
        hsa_code_object_get_info_fn: Some(core::hsa_code_object_get_info),
        hsa_code_object_get_symbol_fn: Some(core::hsa_code_object_get_symbol),
        hsa_code_symbol_get_info_fn: Some(core::hsa_code_symbol_get_info),
        hsa_code_object_iterate_symbols_fn: Some(core::hsa_code_object_iterate_symbols),
        hsa_executable_create_fn: Some(core::hsa_executable_create),
        hsa_executable_destroy_fn: Some(core::hsa_executable_destroy),
        hsa_executable_load_code_object_fn: Some(core::hsa_executable_load_code_object),
        hsa_executable_freeze_fn: Some(core::hsa_executable_freeze),
        hsa_executable_get_info_fn: Some(core::hsa_executable_get_info),
        hsa_executable_global_variable_define_fn: Some(core::hsa_executable_global_variable_define),
        hsa_executable_agent_global_variable_define_fn: Some(
            core::hsa_executable_agent_global_variable_define,
        ),
        hsa_executable_readonly_variable_define_fn: Some(
            core::hsa_executable_readonly_variable_define,
        ),
        hsa_executable_validate_fn: Some(core::hsa_executable_validate),
        hsa_executable_get_symbol_fn: Some(core::hsa_executable_get_symbol),
        hsa_executable_symbol_get_info_fn: Some(core::hsa_executable_symbol_get_info),
        hsa_executable_iterate_symbols_fn: Some(core::hsa_executable_iterate_symbols),
        hsa_status_string_fn: Some(core::hsa_status_string),
        hsa_extension_get_name_fn: Some(core::hsa_extension_get_name),
        hsa_system_major_extension_supported_fn: Some(core::hsa_system_major_extension_supported),
        hsa_system_get_major_extension_table_fn: Some(core::hsa_system_get_major_extension_table),
        hsa_agent_major_extension_supported_fn: Some(core::hsa_agent_major_extension_supported),
        hsa_cache_get_info_fn: Some(core::hsa_cache_get_info),
        hsa_agent_iterate_caches_fn: Some(core::hsa_agent_iterate_caches),
        hsa_signal_silent_store_relaxed_fn: Some(core::hsa_signal_silent_store_relaxed),
        hsa_signal_silent_store_screlease_fn: Some(core::hsa_signal_silent_store_screlease),
        hsa_signal_group_create_fn: Some(core::hsa_signal_group_create),
        hsa_signal_group_destroy_fn: Some(core::hsa_signal_group_destroy),
        hsa_signal_group_wait_any_scacquire_fn: Some(core::hsa_signal_group_wait_any_scacquire),
        hsa_signal_group_wait_any_relaxed_fn: Some(core::hsa_signal_group_wait_any_relaxed),
        hsa_agent_iterate_isas_fn: Some(core::hsa_agent_iterate_isas),
        hsa_isa_get_info_alt_fn: Some(core::hsa_isa_get_info_alt),
        hsa_isa_get_exception_policies_fn: Some(core::hsa_isa_get_exception_policies),
        hsa_isa_get_round_method_fn: Some(core::hsa_isa_get_round_method),
        hsa_wavefront_get_info_fn: Some(core::hsa_wavefront_get_info),
        hsa_isa_iterate_wavefronts_fn: Some(core::hsa_isa_iterate_wavefronts),
        hsa_code_object_get_symbol_from_name_fn: Some(core::hsa_code_object_get_symbol_from_name),
        hsa_code_object_reader_create_from_file_fn: Some(
            core::hsa_code_object_reader_create_from_file,
        ),
        hsa_code_object_reader_create_from_memory_fn: Some(
            core::hsa_code_object_reader_create_from_memory,
        ),
        hsa_code_object_reader_destroy_fn: Some(core::hsa_code_object_reader_destroy),
        hsa_executable_create_alt_fn: Some(core::hsa_executable_create_alt),
        hsa_executable_load_program_code_object_fn: Some(
            core::hsa_executable_load_program_code_object,
        ),
        hsa_executable_load_agent_code_object_fn: Some(core::hsa_executable_load_agent_code_object),
        hsa_executable_validate_alt_fn: Some(core::hsa_executable_validate_alt),
        hsa_executable_get_symbol_by_name_fn: Some(core::hsa_executable_get_symbol_by_name),
        hsa_executable_iterate_agent_symbols_fn: Some(core::hsa_executable_iterate_agent_symbols),
        hsa_executable_iterate_program_symbols_fn: Some(
            core::hsa_executable_iterate_program_symbols,
        ),
    }
}

pub(crate) fn amd_table() -> AmdExtTable {
    AmdExtTable {
        version: version(
            HSA_AMD_EXT_API_TABLE_MAJOR_VERSION,
            size_of::<AmdExtTable>(),
            HSA_AMD_EXT_API_TABLE_STEP_VERSION,
        ),
        hsa_amd_coherency_get_type_fn: Some(amd::hsa_amd_coherency_get_type),
        hsa_amd_coherency_set_type_fn: Some(amd::hsa_amd_coherency_set_type),
        hsa_amd_profiling_set_profiler_enabled_fn: Some(
            amd::hsa_amd_profiling_set_profiler_enabled,
        ),
        hsa_amd_profiling_async_copy_enable_fn: Some(amd::hsa_amd_profiling_async_copy_enable),
        hsa_amd_profiling_get_dispatch_time_fn: Some(amd::hsa_amd_profiling_get_dispatch_time),
        hsa_amd_profiling_get_async_copy_time_fn: Some(amd::hsa_amd_profiling_get_async_copy_time),
        hsa_amd_profiling_convert_tick_to_system_domain_fn: Some(
            amd::hsa_amd_profiling_convert_tick_to_system_domain,
        ),
        hsa_amd_signal_async_handler_fn: Some(amd::hsa_amd_signal_async_handler),
        hsa_amd_async_function_fn: Some(amd::hsa_amd_async_function),
        hsa_amd_signal_wait_any_fn: Some(amd::hsa_amd_signal_wait_any),
        hsa_amd_queue_cu_set_mask_fn: Some(amd::hsa_amd_queue_cu_set_mask),
        hsa_amd_memory_pool_get_info_fn: Some(amd::hsa_amd_memory_pool_get_info),
        hsa_amd_agent_iterate_memory_pools_fn: Some(amd::hsa_amd_agent_iterate_memory_pools),
        hsa_amd_memory_pool_allocate_fn: Some(amd::hsa_amd_memory_pool_allocate),
        hsa_amd_memory_pool_free_fn: Some(amd::hsa_amd_memory_pool_free),
        hsa_amd_memory_async_copy_fn: Some(amd::hsa_amd_memory_async_copy),
        hsa_amd_agent_memory_pool_get_info_fn: Some(amd::hsa_amd_agent_memory_pool_get_info),
        hsa_amd_agents_allow_access_fn: Some(amd::hsa_amd_agents_allow_access),
        hsa_amd_memory_pool_can_migrate_fn: Some(amd::hsa_amd_memory_pool_can_migrate),
        hsa_amd_memory_migrate_fn: Some(amd::hsa_amd_memory_migrate),
        hsa_amd_memory_lock_fn: Some(amd::hsa_amd_memory_lock),
        hsa_amd_memory_unlock_fn: Some(amd::hsa_amd_memory_unlock),
        hsa_amd_memory_fill_fn: Some(amd::hsa_amd_memory_fill),
        hsa_amd_interop_map_buffer_fn: Some(amd::hsa_amd_interop_map_buffer),
        hsa_amd_interop_unmap_buffer_fn: Some(amd::hsa_amd_interop_unmap_buffer),
        hsa_amd_image_create_fn: Some(amd::hsa_amd_image_create),
        hsa_amd_pointer_info_fn: Some(amd::hsa_amd_pointer_info),
        hsa_amd_pointer_info_set_userdata_fn: Some(amd::hsa_amd_pointer_info_set_userdata),
        hsa_amd_ipc_memory_create_fn: Some(amd::hsa_amd_ipc_memory_create),
        hsa_amd_ipc_memory_attach_fn: Some(amd::hsa_amd_ipc_memory_attach),
        hsa_amd_ipc_memory_detach_fn: Some(amd::hsa_amd_ipc_memory_detach),
        hsa_amd_signal_create_fn: Some(amd::hsa_amd_signal_create),
        hsa_amd_ipc_signal_create_fn: Some(amd::hsa_amd_ipc_signal_create),
        hsa_amd_ipc_signal_attach_fn: Some(amd::hsa_amd_ipc_signal_attach),
        hsa_amd_register_system_event_handler_fn: Some(amd::hsa_amd_register_system_event_handler),
        hsa_amd_queue_intercept_create_fn: Some(amd::hsa_amd_queue_intercept_create),
        hsa_amd_queue_intercept_register_fn: Some(amd::hsa_amd_queue_intercept_register),
        hsa_amd_queue_set_priority_fn: Some(amd::hsa_amd_queue_set_priority),
        hsa_amd_memory_async_copy_rect_fn: Some(amd::hsa_amd_memory_async_copy_rect),
        hsa_amd_runtime_queue_create_register_fn: Some(amd::hsa_amd_runtime_queue_create_register),
        hsa_amd_memory_lock_to_pool_fn: Some(amd::hsa_amd_memory_lock_to_pool),
        hsa_amd_register_deallocation_callback_fn: Some(
            amd::hsa_amd_register_deallocation_callback,
        ),
        hsa_amd_deregister_deallocation_callback_fn: Some(
            amd::hsa_amd_deregister_deallocation_callback,
        ),
        hsa_amd_signal_value_pointer_fn: Some(amd::hsa_amd_signal_value_pointer),
        hsa_amd_svm_attributes_set_fn: Some(amd::hsa_amd_svm_attributes_set),
        hsa_amd_svm_attributes_get_fn: Some(amd::hsa_amd_svm_attributes_get),
        hsa_amd_svm_prefetch_async_fn: Some(amd::hsa_amd_svm_prefetch_async),
        hsa_amd_queue_cu_get_mask_fn: Some(amd::hsa_amd_queue_cu_get_mask),
    }
}

fn build() -> Tables {
    let core: &'static mut CoreApiTable = Box::leak(Box::new(core_table()));
    let amd: &'static mut AmdExtTable = Box::leak(Box::new(amd_table()));
    let finalizer: &'static mut FinalizerExtTable = Box::leak(Box::new(FinalizerExtTable {
        version: version(
            HSA_FINALIZER_API_TABLE_MAJOR_VERSION,
            size_of::<FinalizerExtTable>(),
            HSA_FINALIZER_API_TABLE_STEP_VERSION,
        ),
        ..FinalizerExtTable::default()
    }));
    let image: &'static mut ImageExtTable = Box::leak(Box::new(ImageExtTable {
        version: version(
            HSA_IMAGE_API_TABLE_MAJOR_VERSION,
            size_of::<ImageExtTable>(),
            HSA_IMAGE_API_TABLE_STEP_VERSION,
        ),
        hsa_ext_image_get_capability_fn: Some(image::hsa_ext_image_get_capability),
        hsa_ext_image_data_get_info_fn: Some(image::hsa_ext_image_data_get_info),
        hsa_ext_image_create_fn: Some(image::hsa_ext_image_create),
        hsa_ext_image_import_fn: Some(image::hsa_ext_image_import),
        hsa_ext_image_export_fn: Some(image::hsa_ext_image_export),
        hsa_ext_image_copy_fn: Some(image::hsa_ext_image_copy),
        hsa_ext_image_clear_fn: Some(image::hsa_ext_image_clear),
        hsa_ext_image_destroy_fn: Some(image::hsa_ext_image_destroy),
        hsa_ext_sampler_create_fn: Some(image::hsa_ext_sampler_create),
        hsa_ext_sampler_destroy_fn: Some(image::hsa_ext_sampler_destroy),
        hsa_ext_image_get_capability_with_layout_fn: Some(
            image::hsa_ext_image_get_capability_with_layout,
        ),
        hsa_ext_image_data_get_info_with_layout_fn: Some(
            image::hsa_ext_image_data_get_info_with_layout,
        ),
        hsa_ext_image_create_with_layout_fn: Some(image::hsa_ext_image_create_with_layout),
    }));
    Tables {
        api: HsaApiTable {
            version: version(
                HSA_API_TABLE_MAJOR_VERSION,
                size_of::<HsaApiTable>(),
                HSA_API_TABLE_STEP_VERSION,
            ),
            core_: core,
            amd_ext_: amd,
            finalizer_ext_: finalizer,
            image_ext_: image,
        },
    }
}

/// softhsa's AMD extension table in the ROCm 5.6+ order, with the entries of those releases:
/// the caller sets its version (major and size) for the release it imitates.
pub(crate) fn amd_table_v2() -> AmdExtTableV2 {
    AmdExtTableV2 {
        hsa_amd_memory_async_copy_on_engine_fn: Some(amd::hsa_amd_memory_async_copy_on_engine),
        hsa_amd_memory_copy_engine_status_fn: Some(amd::hsa_amd_memory_copy_engine_status),
        hsa_amd_spm_acquire_fn: Some(amd::hsa_amd_spm_acquire),
        hsa_amd_spm_release_fn: Some(amd::hsa_amd_spm_release),
        hsa_amd_spm_set_dest_buffer_fn: Some(amd::hsa_amd_spm_set_dest_buffer),
        hsa_amd_portable_export_dmabuf_fn: Some(amd::hsa_amd_portable_export_dmabuf),
        hsa_amd_portable_close_dmabuf_fn: Some(amd::hsa_amd_portable_close_dmabuf),
        hsa_amd_vmem_address_reserve_fn: Some(amd::hsa_amd_vmem_address_reserve),
        hsa_amd_vmem_address_free_fn: Some(amd::hsa_amd_vmem_address_free),
        hsa_amd_vmem_handle_create_fn: Some(amd::hsa_amd_vmem_handle_create),
        hsa_amd_vmem_handle_release_fn: Some(amd::hsa_amd_vmem_handle_release),
        hsa_amd_vmem_map_fn: Some(amd::hsa_amd_vmem_map),
        hsa_amd_vmem_unmap_fn: Some(amd::hsa_amd_vmem_unmap),
        hsa_amd_vmem_set_access_fn: Some(amd::hsa_amd_vmem_set_access),
        hsa_amd_vmem_get_access_fn: Some(amd::hsa_amd_vmem_get_access),
        hsa_amd_vmem_export_shareable_handle_fn: Some(amd::hsa_amd_vmem_export_shareable_handle),
        hsa_amd_vmem_import_shareable_handle_fn: Some(amd::hsa_amd_vmem_import_shareable_handle),
        hsa_amd_vmem_retain_alloc_handle_fn: Some(amd::hsa_amd_vmem_retain_alloc_handle),
        hsa_amd_vmem_get_alloc_properties_from_handle_fn: Some(
            amd::hsa_amd_vmem_get_alloc_properties_from_handle,
        ),
        hsa_amd_agent_set_async_scratch_limit_fn: Some(amd::hsa_amd_agent_set_async_scratch_limit),
        hsa_amd_queue_get_info_fn: Some(amd::hsa_amd_queue_get_info),
        hsa_amd_vmem_address_reserve_align_fn: Some(amd::hsa_amd_vmem_address_reserve_align),
        hsa_amd_memory_async_batch_copy_fn: Some(amd::hsa_amd_memory_async_batch_copy),
        hsa_amd_ais_file_read_fn: Some(amd::hsa_amd_ais_file_read),
        ..AmdExtTableV2::from_v1(&amd_table())
    }
}

/// See [`crate::api_table`].
pub(crate) fn api_table() -> &'static HsaApiTable {
    // (the ROCm 5.2 layout; `OwnedApiTable::softhsa_with` hands out the others)
    static TABLES: OnceLock<Tables> = OnceLock::new();
    &TABLES.get_or_init(build).api
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The entries of a table after its version header, as raw pointer-sized words.
    fn entries<T>(table: &T) -> Vec<usize> {
        let words = (size_of::<T>() - size_of::<ApiTableVersion>()) / size_of::<usize>();
        let first = std::ptr::from_ref(table).cast::<u8>();
        (0..words)
            .map(|i| {
                // SAFETY: every table is an ApiTableVersion followed by pointer-sized Option<fn>
                // entries, so each read stays inside `table` and reads an initialized word.
                unsafe {
                    first
                        .add(size_of::<ApiTableVersion>() + i * size_of::<usize>())
                        .cast::<usize>()
                        .read_unaligned()
                }
            })
            .collect()
    }

    #[test]
    fn every_core_and_amd_entry_is_filled() {
        let api = api_table();
        // SAFETY: the table points to leaked, initialized tables.
        let (core, amd) = unsafe { (&*api.core_, &*api.amd_ext_) };
        assert_eq!(entries(core).len(), 125);
        assert_eq!(entries(amd).len(), 48);
        assert!(entries(core).iter().all(|&e| e != 0));
        assert!(entries(amd).iter().all(|&e| e != 0));
        assert_eq!(core.version.minor_id as usize, size_of::<CoreApiTable>());
        assert!(!api.finalizer_ext_.is_null() && !api.image_ext_.is_null());
        // SAFETY: as above.
        let image = unsafe { &*api.image_ext_ };
        assert_eq!(entries(image).len(), 13);
        assert!(entries(image).iter().all(|&e| e != 0));
    }

    #[test]
    fn the_rocm6_amd_table_fills_every_entry_and_keeps_the_shared_ones() {
        let v2 = amd_table_v2();
        let through_6_2 = (hsa_sys::layouts::sizes::AMD_6_2 as usize - 16) / 8;
        assert!(entries(&v2)[..through_6_2].iter().all(|&e| e != 0));
        // Of the ROCm 7 entries, the two that write memory.
        assert!(v2.hsa_amd_memory_async_batch_copy_fn.is_some());
        assert!(v2.hsa_amd_ais_file_read_fn.is_some());
        // SAFETY: softhsa's table points to leaked, initialized tables.
        let v1 = unsafe { &*api_table().amd_ext_ };
        assert_eq!(
            v2.hsa_amd_pointer_info_fn.map(|f| f as usize),
            v1.hsa_amd_pointer_info_fn.map(|f| f as usize)
        );
        assert_eq!(entries(&v2.to_v1()), entries(v1));
    }
}
