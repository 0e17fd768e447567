//! The ROCm 6.x virtual memory API as softhsa hands it out in the 6.2 table layout: reserved
//! ranges, physical handles charged to their pool, shared mappings, access lists, and the
//! release and free rules of ROCm.

mod common;

use common::*;
use hsa_sys::layouts::{
    AmdExtTableV2, hsa_amd_memory_access_desc_t, hsa_amd_memory_type_t, hsa_amd_vmem_alloc_handle_t,
};
use hsa_sys::*;
use kreplay_softhsa::{OwnedApiTable, TableLayout};
use std::ffi::c_void;

/// Calls one entry of the ROCm 6.x AMD extension table.
macro_rules! amd6 {
    ($amd:expr, $entry:ident ( $($arg:expr),* $(,)? )) => {{
        let f = $amd.$entry.expect(stringify!($entry));
        // SAFETY: every call site passes arguments that satisfy the entry's HSA contract.
        unsafe { f($($arg),*) }
    }};
}

#[test]
fn two_mappings_of_one_handle_share_its_bytes_and_the_rules_of_rocm_hold() {
    let (hsa, _session) = open();
    let table = OwnedApiTable::softhsa_with(TableLayout::Rocm62);
    // SAFETY: the 6.2 layout's AMD extension table is an AmdExtTableV2 (its version says so).
    let amd: &AmdExtTableV2 = unsafe { &*table.table().amd_ext_.cast() };
    assert_eq!(amd.version.major_id, 2);
    let gpu = hsa.gpu_agents().unwrap()[0];
    let pool = hsa.coarse_pool(gpu).unwrap();
    let size = 4096;

    // Sizes must be whole pages.
    let mut va: *mut c_void = std::ptr::null_mut();
    assert_eq!(
        amd6!(amd, hsa_amd_vmem_address_reserve_fn(&mut va, 100, 0, 0)),
        HSA_STATUS_ERROR_INVALID_ARGUMENT
    );
    let mut a: *mut c_void = std::ptr::null_mut();
    let mut b: *mut c_void = std::ptr::null_mut();
    assert_eq!(
        amd6!(amd, hsa_amd_vmem_address_reserve_fn(&mut a, size, 0, 0)),
        0
    );
    assert_eq!(
        amd6!(amd, hsa_amd_vmem_address_reserve_fn(&mut b, size, 0, 0)),
        0
    );
    let mut handle = hsa_amd_vmem_alloc_handle_t::default();
    assert_eq!(
        amd6!(
            amd,
            hsa_amd_vmem_handle_create_fn(pool, size, 0, 0, &mut handle)
        ),
        0
    );
    let mut owner_pool = hsa_amd_memory_pool_t { handle: 0 };
    let mut kind: hsa_amd_memory_type_t = 7;
    assert_eq!(
        amd6!(
            amd,
            hsa_amd_vmem_get_alloc_properties_from_handle_fn(handle, &mut owner_pool, &mut kind)
        ),
        0
    );
    assert_eq!((owner_pool.handle, kind), (pool.handle, 0));

    // The same physical memory at two addresses.
    assert_eq!(amd6!(amd, hsa_amd_vmem_map_fn(a, size, 0, handle, 0)), 0);
    assert_eq!(amd6!(amd, hsa_amd_vmem_map_fn(b, size, 0, handle, 0)), 0);
    // SAFETY: both mappings are 4 KiB of writable memory.
    unsafe {
        a.cast::<u32>().add(10).write(0xfeed);
        assert_eq!(b.cast::<u32>().add(10).read(), 0xfeed);
    }
    // Mapping over a mapping is refused.
    assert_eq!(
        amd6!(amd, hsa_amd_vmem_map_fn(a, size, 0, handle, 0)),
        HSA_STATUS_ERROR_INVALID_ARGUMENT
    );
    // Access: set per agent, read back; an agent never given access has none.
    let desc = [hsa_amd_memory_access_desc_t {
        permissions: HSA_ACCESS_PERMISSION_RO,
        agent_handle: gpu,
    }];
    assert_eq!(
        amd6!(amd, hsa_amd_vmem_set_access_fn(a, size, desc.as_ptr(), 1)),
        0
    );
    let mut perms: hsa_access_permission_t = 0;
    assert_eq!(
        amd6!(amd, hsa_amd_vmem_get_access_fn(a, &mut perms, gpu)),
        0
    );
    assert_eq!(perms, HSA_ACCESS_PERMISSION_RO);
    let cpu = hsa.agents().unwrap()[0];
    assert_eq!(
        amd6!(amd, hsa_amd_vmem_get_access_fn(a, &mut perms, cpu)),
        HSA_STATUS_ERROR_INVALID_ALLOCATION
    );
    // pointer info sees the mapping as the pool's agent's memory.
    let mut info = hsa_amd_pointer_info_t {
        size: std::mem::size_of::<hsa_amd_pointer_info_t>() as u32,
        ..Default::default()
    };
    let pointer_info = hsa.amd().hsa_amd_pointer_info_fn.unwrap();
    // SAFETY: a valid info struct with its size set; no agent list requested.
    let status = unsafe {
        pointer_info(
            b.cast_const().byte_add(8),
            &mut info,
            None,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
        )
    };
    assert_eq!(status, 0);
    assert_eq!(
        (info.agentBaseAddress, info.agentOwner.handle),
        (b, gpu.handle)
    );

    // Released while mapped: the memory lives until the last mapping goes; a range with a
    // mapping cannot be freed.
    assert_eq!(amd6!(amd, hsa_amd_vmem_handle_release_fn(handle)), 0);
    assert_eq!(
        amd6!(amd, hsa_amd_vmem_address_free_fn(a, size)),
        HSA_STATUS_ERROR_RESOURCE_FREE
    );
    assert_eq!(amd6!(amd, hsa_amd_vmem_unmap_fn(a, size)), 0);
    // SAFETY: the second mapping is still there.
    assert_eq!(unsafe { b.cast::<u32>().add(10).read() }, 0xfeed);
    assert_eq!(amd6!(amd, hsa_amd_vmem_unmap_fn(b, size)), 0);
    assert_eq!(
        amd6!(amd, hsa_amd_vmem_handle_release_fn(handle)),
        HSA_STATUS_ERROR_INVALID_ALLOCATION,
        "the handle is gone"
    );
    assert_eq!(amd6!(amd, hsa_amd_vmem_address_free_fn(a, size)), 0);
    assert_eq!(amd6!(amd, hsa_amd_vmem_address_free_fn(b, size)), 0);
}
