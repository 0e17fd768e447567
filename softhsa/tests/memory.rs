//! Memory pools, regions, pointer info and copies through the API table.

mod common;

use common::*;
use hsa_sys::*;
use kreplay_softhsa::testing::{Hsa, PoolKind};
use std::alloc::Layout;
use std::ffi::c_void;
use std::mem::{offset_of, size_of};
use std::time::Duration;

fn pool_info<T: Default>(
    hsa: &Hsa,
    pool: hsa_amd_memory_pool_t,
    attribute: hsa_amd_memory_pool_info_t,
) -> T {
    let mut value = T::default();
    let f = hsa.amd().hsa_amd_memory_pool_get_info_fn.unwrap();
    // SAFETY: table entry; `value` has the attribute's type.
    let status = unsafe { f(pool, attribute, (&raw mut value).cast()) };
    assert_eq!(status, HSA_STATUS_SUCCESS, "attribute {attribute}");
    value
}

#[test]
fn gpu_agents_have_coarse_fine_and_kernarg_pools_and_the_cpu_has_host_pools() {
    let (hsa, _session) = open();
    for gpu in hsa.gpu_agents().unwrap() {
        let flags: Vec<u32> = hsa
            .pools(gpu)
            .unwrap()
            .iter()
            .map(|&p| hsa.pool_flags(p).unwrap())
            .collect();
        assert_eq!(
            flags,
            vec![
                HSA_AMD_MEMORY_POOL_GLOBAL_FLAG_COARSE_GRAINED,
                HSA_AMD_MEMORY_POOL_GLOBAL_FLAG_FINE_GRAINED,
                HSA_AMD_MEMORY_POOL_GLOBAL_FLAG_KERNARG_INIT
                    | HSA_AMD_MEMORY_POOL_GLOBAL_FLAG_FINE_GRAINED,
            ]
        );
        let coarse = hsa.coarse_pool(gpu).unwrap();
        assert_eq!(
            pool_info::<u32>(&hsa, coarse, HSA_AMD_MEMORY_POOL_INFO_SEGMENT),
            HSA_AMD_SEGMENT_GLOBAL
        );
        assert_eq!(
            pool_info::<usize>(&hsa, coarse, HSA_AMD_MEMORY_POOL_INFO_SIZE),
            16 << 30
        );
        assert!(pool_info::<bool>(
            &hsa,
            coarse,
            HSA_AMD_MEMORY_POOL_INFO_RUNTIME_ALLOC_ALLOWED
        ));
        assert_eq!(
            pool_info::<usize>(&hsa, coarse, HSA_AMD_MEMORY_POOL_INFO_RUNTIME_ALLOC_GRANULE),
            4096
        );
        assert_eq!(
            pool_info::<usize>(
                &hsa,
                coarse,
                HSA_AMD_MEMORY_POOL_INFO_RUNTIME_ALLOC_ALIGNMENT
            ),
            4096
        );
        assert!(!pool_info::<bool>(
            &hsa,
            coarse,
            HSA_AMD_MEMORY_POOL_INFO_ACCESSIBLE_BY_ALL
        ));
    }
    let cpu = hsa.cpu_agent().unwrap();
    let flags: Vec<u32> = hsa
        .pools(cpu)
        .unwrap()
        .iter()
        .map(|&p| hsa.pool_flags(p).unwrap())
        .collect();
    assert_eq!(
        flags,
        vec![
            HSA_AMD_MEMORY_POOL_GLOBAL_FLAG_FINE_GRAINED,
            HSA_AMD_MEMORY_POOL_GLOBAL_FLAG_KERNARG_INIT
                | HSA_AMD_MEMORY_POOL_GLOBAL_FLAG_FINE_GRAINED,
        ]
    );
    let system = hsa.pool(cpu, PoolKind::Fine).unwrap();
    assert!(pool_info::<bool>(
        &hsa,
        system,
        HSA_AMD_MEMORY_POOL_INFO_ACCESSIBLE_BY_ALL
    ));
}

#[test]
fn agents_reach_their_own_and_host_pools_by_default_but_not_other_devices_pools() {
    let (hsa, _session) = open();
    let f = hsa.amd().hsa_amd_agent_memory_pool_get_info_fn.unwrap();
    let access = |agent, pool| {
        let mut value = u32::MAX;
        // SAFETY: table entry; ACCESS is a u32.
        let status = unsafe {
            f(
                agent,
                pool,
                HSA_AMD_AGENT_MEMORY_POOL_INFO_ACCESS,
                (&raw mut value).cast(),
            )
        };
        assert_eq!(status, HSA_STATUS_SUCCESS);
        value
    };
    let gpus = hsa.gpu_agents().unwrap();
    let cpu = hsa.cpu_agent().unwrap();
    let (own, other) = (
        hsa.coarse_pool(gpus[0]).unwrap(),
        hsa.coarse_pool(gpus[1]).unwrap(),
    );
    assert_eq!(
        access(gpus[0], own),
        HSA_AMD_MEMORY_POOL_ACCESS_ALLOWED_BY_DEFAULT
    );
    assert_eq!(
        access(gpus[0], other),
        HSA_AMD_MEMORY_POOL_ACCESS_DISALLOWED_BY_DEFAULT
    );
    let system = hsa.pool(cpu, PoolKind::Fine).unwrap();
    assert_eq!(
        access(gpus[1], system),
        HSA_AMD_MEMORY_POOL_ACCESS_ALLOWED_BY_DEFAULT
    );
}

#[test]
fn allocations_are_zeroed_page_aligned_and_freed() {
    let (hsa, _session) = open();
    let gpu = hsa.gpu_agents().unwrap()[0];
    for kind in [PoolKind::Coarse, PoolKind::Fine, PoolKind::Kernarg] {
        let pool = hsa.pool(gpu, kind).unwrap();
        let p = hsa.allocate(pool, 10_000).unwrap();
        assert_eq!(p as usize % 4096, 0);
        // SAFETY: 10 000 bytes were allocated.
        let bytes = unsafe { std::slice::from_raw_parts_mut(p, 10_000) };
        assert!(bytes.iter().all(|&b| b == 0));
        bytes.fill(0xab);
        hsa.free(p).unwrap();
    }
}

fn pointer_info(
    hsa: &Hsa,
    ptr: *const c_void,
    size: u32,
) -> (hsa_status_t, hsa_amd_pointer_info_t) {
    let mut info = hsa_amd_pointer_info_t {
        size,
        ..Default::default()
    };
    let f = hsa.amd().hsa_amd_pointer_info_fn.unwrap();
    // SAFETY: table entry; `info` is a whole struct, its `size` field may declare less.
    let status = unsafe {
        f(
            ptr,
            &mut info,
            None,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
        )
    };
    (status, info)
}

#[test]
fn pointer_info_reports_owner_flags_base_and_size_for_interior_pointers() {
    let (hsa, _session) = open();
    let full = size_of::<hsa_amd_pointer_info_t>() as u32;
    for agent in hsa.agents().unwrap() {
        for pool in hsa.pools(agent).unwrap() {
            let p = hsa.allocate(pool, 3000).unwrap();
            let (status, info) = pointer_info(&hsa, p.wrapping_add(1234).cast(), full);
            assert_eq!(status, HSA_STATUS_SUCCESS);
            assert_eq!(info.type_, HSA_EXT_POINTER_TYPE_HSA);
            assert_eq!(
                info.agentOwner.handle, agent.handle,
                "owner is the pool's agent"
            );
            assert_eq!(info.global_flags, hsa.pool_flags(pool).unwrap());
            assert_eq!(info.agentBaseAddress, p.cast());
            assert_eq!(info.hostBaseAddress, p.cast());
            assert_eq!(info.sizeInBytes, 3000);
            hsa.free(p).unwrap();
        }
    }
}

#[test]
fn an_unknown_pointer_is_reported_as_unknown_with_success() {
    let (hsa, _session) = open();
    let local = 5u64;
    let (status, info) = pointer_info(
        &hsa,
        (&raw const local).cast(),
        size_of::<hsa_amd_pointer_info_t>() as u32,
    );
    assert_eq!(status, HSA_STATUS_SUCCESS);
    assert_eq!(info.type_, HSA_EXT_POINTER_TYPE_UNKNOWN);
    assert_eq!(info.sizeInBytes, 0);
}

#[test]
fn pointer_info_writes_only_the_fields_within_the_declared_size() {
    let (hsa, _session) = open();
    let gpu = hsa.gpu_agents().unwrap()[0];
    let p = hsa.allocate(hsa.coarse_pool(gpu).unwrap(), 64).unwrap();
    let declared = offset_of!(hsa_amd_pointer_info_t, userData) as u32;
    let mut info = hsa_amd_pointer_info_t {
        size: declared,
        global_flags: 0xdead,
        ..Default::default()
    };
    info.agentOwner.handle = 0xbeef;
    let f = hsa.amd().hsa_amd_pointer_info_fn.unwrap();
    // SAFETY: table entry; `info` is a whole struct.
    let status = unsafe {
        f(
            p.cast(),
            &mut info,
            None,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
        )
    };
    assert_eq!(status, HSA_STATUS_SUCCESS);
    assert_eq!(info.size, declared, "the size field is the caller's");
    assert_eq!(
        info.sizeInBytes, 64,
        "fields inside the declared size are written"
    );
    assert_eq!(
        (info.agentOwner.handle, info.global_flags),
        (0xbeef, 0xdead),
        "fields beyond it are not"
    );
    hsa.free(p).unwrap();
}

#[test]
fn user_data_and_accessible_agents_are_reported() {
    let (hsa, _session) = open();
    let amd = *hsa.amd();
    let gpus = hsa.gpu_agents().unwrap();
    let p = hsa
        .allocate(hsa.coarse_pool(gpus[0]).unwrap(), 128)
        .unwrap();
    let mut tag = 0u8;
    unsafe extern "C" fn alloc(bytes: usize) -> *mut c_void {
        // SAFETY: a non-zero size with pointer alignment; freed by the test with the same layout.
        unsafe { std::alloc::alloc(Layout::from_size_align(bytes, 8).unwrap()).cast() }
    }
    let mut count = 0u32;
    let mut agents: *mut hsa_agent_t = std::ptr::null_mut();
    let mut info = hsa_amd_pointer_info_t {
        size: size_of::<hsa_amd_pointer_info_t>() as u32,
        ..Default::default()
    };
    // SAFETY: table entries with HSA signatures; the out pointers are live locals.
    unsafe {
        assert_eq!(
            amd.hsa_amd_pointer_info_set_userdata_fn.unwrap()(p.cast(), (&raw mut tag).cast()),
            HSA_STATUS_SUCCESS
        );
        let allow = amd.hsa_amd_agents_allow_access_fn.unwrap();
        assert_eq!(
            allow(1, &gpus[1], std::ptr::null(), p.cast()),
            HSA_STATUS_SUCCESS
        );
        let f = amd.hsa_amd_pointer_info_fn.unwrap();
        assert_eq!(
            f(
                p.add(5).cast(),
                &mut info,
                Some(alloc),
                &mut count,
                &mut agents
            ),
            HSA_STATUS_SUCCESS
        );
        assert_eq!(info.userData, (&raw mut tag).cast());
        let list = std::slice::from_raw_parts(agents, count as usize).to_vec();
        std::alloc::dealloc(
            agents.cast(),
            Layout::from_size_align(count as usize * 8, 8).unwrap(),
        );
        let handles: Vec<u64> = list.iter().map(|a| a.handle).collect();
        assert_eq!(
            handles,
            vec![gpus[0].handle, gpus[1].handle],
            "owner first, then the agent granted access"
        );
        let unknown = 0u8;
        assert_eq!(
            amd.hsa_amd_pointer_info_set_userdata_fn.unwrap()(
                (&raw const unknown).cast(),
                std::ptr::null_mut()
            ),
            HSA_STATUS_ERROR_INVALID_ARGUMENT
        );
    }
    hsa.free(p).unwrap();
}

#[test]
fn memory_copy_and_fill_move_real_bytes() {
    let (hsa, _session) = open();
    let c = *hsa.core();
    let amd = *hsa.amd();
    let gpu = hsa.gpu_agents().unwrap()[0];
    let a = hsa.allocate(hsa.coarse_pool(gpu).unwrap(), 4096).unwrap();
    let b = hsa.allocate(hsa.coarse_pool(gpu).unwrap(), 4096).unwrap();
    // SAFETY: table entries on live 4096-byte allocations.
    unsafe {
        assert_eq!(
            amd.hsa_amd_memory_fill_fn.unwrap()(a.cast(), 0x0102_0304, 1024),
            HSA_STATUS_SUCCESS
        );
        assert!(read_u32s(a.cast(), 1024).iter().all(|&v| v == 0x0102_0304));
        assert_eq!(
            c.hsa_memory_copy_fn.unwrap()(b.cast(), a.cast(), 4096),
            HSA_STATUS_SUCCESS
        );
        assert!(read_u32s(b.cast(), 1024).iter().all(|&v| v == 0x0102_0304));
        assert_eq!(
            amd.hsa_amd_memory_fill_fn.unwrap()(a.add(2).cast(), 0, 1),
            HSA_STATUS_ERROR_INVALID_ARGUMENT,
            "unaligned"
        );
        assert_eq!(
            amd.hsa_amd_memory_fill_fn.unwrap()(a.cast(), 0, 1025),
            HSA_STATUS_ERROR_INVALID_ALLOCATION,
            "past the end"
        );
    }
    hsa.free(a).unwrap();
    hsa.free(b).unwrap();
}

#[test]
fn async_copy_waits_for_its_dependency_then_copies_and_decrements_completion() {
    let (hsa, _session) = open();
    let f = hsa.amd().hsa_amd_memory_async_copy_fn.unwrap();
    let gpus = hsa.gpu_agents().unwrap();
    let n = 1 << 16;
    let src = hsa
        .allocate(hsa.coarse_pool(gpus[0]).unwrap(), n * 4)
        .unwrap()
        .cast::<u32>();
    let dst = hsa
        .allocate(hsa.coarse_pool(gpus[1]).unwrap(), n * 4)
        .unwrap()
        .cast::<u32>();
    // SAFETY: n u32s were allocated.
    unsafe { std::slice::from_raw_parts_mut(src, n) }
        .iter_mut()
        .enumerate()
        .for_each(|(i, v)| *v = i as u32);
    let dep = hsa.signal_create(1).unwrap();
    let done = hsa.signal_create(1).unwrap();
    // SAFETY: table entry; both buffers stay live until `done` reaches 0.
    let status = unsafe {
        f(
            dst.cast(),
            gpus[1],
            src.cast(),
            gpus[0],
            n * 4,
            1,
            &dep,
            done,
        )
    };
    assert_eq!(status, HSA_STATUS_SUCCESS);
    assert!(
        !hsa.wait_zero(done, Duration::from_millis(20)),
        "the copy waited for its dependency"
    );
    // SAFETY: the copy has not started (its dependency is still 1).
    assert!(unsafe { read_u32s(dst, n) }.iter().all(|&v| v == 0));
    hsa.signal_store(dep, 0);
    assert!(hsa.wait_zero(done, PROMPT), "completion decremented");
    // SAFETY: the copy completed.
    let copied = unsafe { read_u32s(dst, n) };
    assert!(copied.iter().enumerate().all(|(i, &v)| v == i as u32));
    hsa.free(src.cast()).unwrap();
    hsa.free(dst.cast()).unwrap();
}

#[test]
fn a_zero_byte_async_copy_succeeds_without_touching_its_completion_signal() {
    // hsa_ext_amd.h: "If size is 0, no copy is performed and the function returns success";
    // ROCm then neither waits for the dependencies nor decrements the completion signal.
    let (hsa, _session) = open();
    let f = hsa.amd().hsa_amd_memory_async_copy_fn.unwrap();
    let gpu = hsa.gpu_agents().unwrap()[0];
    let cpu = hsa.cpu_agent().unwrap();
    let buffer = hsa.allocate(hsa.coarse_pool(gpu).unwrap(), 64).unwrap();
    let host = [7u8; 64];
    let never = hsa.signal_create(1).unwrap();
    let empty_done = hsa.signal_create(1).unwrap();
    let done = hsa.signal_create(1).unwrap();
    // SAFETY: table entry; nothing is copied.
    let status = unsafe {
        f(
            buffer.cast(),
            gpu,
            host.as_ptr().cast(),
            cpu,
            0,
            1,
            &never,
            empty_done,
        )
    };
    assert_eq!(status, HSA_STATUS_SUCCESS);
    // A real copy between the same agents afterwards is not held up by the empty one's
    // dependency, which never reaches 0.
    // SAFETY: table entry; both buffers stay live until `done` reaches 0.
    let status = unsafe {
        f(
            buffer.cast(),
            gpu,
            host.as_ptr().cast(),
            cpu,
            64,
            0,
            std::ptr::null(),
            done,
        )
    };
    assert_eq!(status, HSA_STATUS_SUCCESS);
    assert!(hsa.wait_zero(done, PROMPT), "the real copy completed");
    assert_eq!(
        hsa.signal_load(empty_done),
        1,
        "the empty copy decremented its completion signal"
    );
    hsa.free(buffer).unwrap();
}

#[test]
fn a_device_to_host_copy_is_not_held_up_by_a_waiting_host_to_device_copy() {
    // ROCm gives host-to-device and device-to-host copies of a GPU engines (blits) of their
    // own: copies in different directions are not ordered with each other, only through
    // dependency signals.
    let (hsa, _session) = open();
    let f = hsa.amd().hsa_amd_memory_async_copy_fn.unwrap();
    let gpu = hsa.gpu_agents().unwrap()[0];
    let cpu = hsa.cpu_agent().unwrap();
    let device = hsa.allocate(hsa.coarse_pool(gpu).unwrap(), 64).unwrap();
    let host = hsa
        .allocate(hsa.pool(cpu, PoolKind::Fine).unwrap(), 64)
        .unwrap();
    let gate = hsa.signal_create(1).unwrap();
    let upload = hsa.signal_create(1).unwrap();
    let download = hsa.signal_create(1).unwrap();
    // SAFETY: table entries; both buffers stay live until both copies completed.
    unsafe {
        assert_eq!(
            f(device.cast(), gpu, host.cast(), cpu, 32, 1, &gate, upload),
            HSA_STATUS_SUCCESS
        );
        assert_eq!(
            f(
                host.add(32).cast(),
                cpu,
                device.add(32).cast(),
                gpu,
                32,
                0,
                std::ptr::null(),
                download
            ),
            HSA_STATUS_SUCCESS
        );
    }
    assert!(
        hsa.wait_zero(download, PROMPT),
        "the download ran while the upload waited for its dependency"
    );
    assert_eq!(hsa.signal_load(upload), 1, "the upload still waits");
    hsa.signal_store(gate, 0);
    assert!(hsa.wait_zero(upload, PROMPT));
    hsa.free(device).unwrap();
    hsa.free(host).unwrap();
}

#[test]
fn a_signal_no_profiled_copy_completed_has_no_async_copy_time() {
    // ROCm answers hsa_amd_profiling_get_async_copy_time with HSA_STATUS_ERROR for a signal
    // that was never the completion signal of an async copy made with copy profiling on (it
    // knows no agent whose clock the timestamps would come from).
    let (hsa, _session) = open();
    let never_copied = hsa.signal_create(0).unwrap();
    let mut time = hsa_amd_profiling_async_copy_time_t::default();
    // SAFETY: table entry; `time` is a live out value.
    let status = unsafe {
        hsa.amd().hsa_amd_profiling_get_async_copy_time_fn.unwrap()(never_copied, &mut time)
    };
    assert_eq!(status, HSA_STATUS_ERROR);
}

#[test]
fn async_copy_profiling_records_the_copy_time() {
    let (hsa, _session) = open();
    let amd = *hsa.amd();
    let gpu = hsa.gpu_agents().unwrap()[0];
    let cpu = hsa.cpu_agent().unwrap();
    let src = hsa
        .allocate(hsa.pool(cpu, PoolKind::Fine).unwrap(), 4096)
        .unwrap();
    let dst = hsa.allocate(hsa.coarse_pool(gpu).unwrap(), 4096).unwrap();
    let done = hsa.signal_create(1).unwrap();
    let mut time = hsa_amd_profiling_async_copy_time_t::default();
    // SAFETY: table entries; both buffers stay live until `done` reaches 0.
    unsafe {
        assert_eq!(
            amd.hsa_amd_profiling_async_copy_enable_fn.unwrap()(true),
            HSA_STATUS_SUCCESS
        );
        let copy = amd.hsa_amd_memory_async_copy_fn.unwrap();
        assert_eq!(
            copy(
                dst.cast(),
                gpu,
                src.cast(),
                cpu,
                4096,
                0,
                std::ptr::null(),
                done
            ),
            HSA_STATUS_SUCCESS
        );
        assert!(hsa.wait_zero(done, PROMPT));
        assert_eq!(
            amd.hsa_amd_profiling_get_async_copy_time_fn.unwrap()(done, &mut time),
            HSA_STATUS_SUCCESS
        );
    }
    assert!(time.start > 0 && time.start <= time.end, "{time:?}");
    hsa.free(src).unwrap();
    hsa.free(dst).unwrap();
}

#[test]
fn rectangular_async_copies_move_each_row() {
    let (hsa, _session) = open();
    let f = hsa.amd().hsa_amd_memory_async_copy_rect_fn.unwrap();
    let gpu = hsa.gpu_agents().unwrap()[0];
    let pool = hsa.coarse_pool(gpu).unwrap();
    let (src, dst) = (
        hsa.allocate(pool, 64 * 8).unwrap(),
        hsa.allocate(pool, 64 * 8).unwrap(),
    );
    // SAFETY: 512 bytes were allocated.
    unsafe { std::slice::from_raw_parts_mut(src, 512) }
        .iter_mut()
        .enumerate()
        .for_each(|(i, b)| *b = i as u8);
    let pitched = |base: *mut u8| hsa_pitched_ptr_t {
        base: base.cast(),
        pitch: 64,
        slice: 512,
    };
    let (s, d) = (pitched(src), pitched(dst));
    let src_offset = hsa_dim3_t { x: 4, y: 1, z: 0 };
    let dst_offset = hsa_dim3_t { x: 0, y: 2, z: 0 };
    let range = hsa_dim3_t { x: 8, y: 3, z: 1 };
    let done = hsa.signal_create(1).unwrap();
    // SAFETY: table entry; the pitched regions stay live until `done` reaches 0.
    let status = unsafe {
        f(
            &d,
            &dst_offset,
            &s,
            &src_offset,
            &range,
            gpu,
            hsaDeviceToDevice,
            0,
            std::ptr::null(),
            done,
        )
    };
    assert_eq!(status, HSA_STATUS_SUCCESS);
    assert!(hsa.wait_zero(done, PROMPT));
    // SAFETY: completed; 512 bytes.
    let out = unsafe { std::slice::from_raw_parts(dst, 512) };
    for row in 0..3 {
        let expected: Vec<u8> = (0..8).map(|x| ((row + 1) * 64 + 4 + x) as u8).collect();
        assert_eq!(
            &out[(row + 2) * 64..(row + 2) * 64 + 8],
            expected.as_slice(),
            "row {row}"
        );
    }
    assert!(
        out[..128].iter().all(|&b| b == 0),
        "rows outside the range are untouched"
    );
}

#[test]
fn the_legacy_region_api_allocates_from_the_same_pools() {
    let (hsa, _session) = open();
    let c = *hsa.core();
    let gpu = hsa.gpu_agents().unwrap()[0];
    unsafe extern "C" fn collect(region: hsa_region_t, data: *mut c_void) -> hsa_status_t {
        // SAFETY: `data` is the Vec below.
        unsafe { (*data.cast::<Vec<hsa_region_t>>()).push(region) };
        HSA_STATUS_SUCCESS
    }
    let mut regions: Vec<hsa_region_t> = Vec::new();
    // SAFETY: table entries; out pointers are live locals of the attribute's type.
    unsafe {
        assert_eq!(
            c.hsa_agent_iterate_regions_fn.unwrap()(gpu, Some(collect), (&raw mut regions).cast()),
            HSA_STATUS_SUCCESS
        );
        let info = c.hsa_region_get_info_fn.unwrap();
        let coarse = regions
            .iter()
            .copied()
            .find(|&r| {
                let mut flags = 0u32;
                info(r, HSA_REGION_INFO_GLOBAL_FLAGS, (&raw mut flags).cast());
                flags & HSA_REGION_GLOBAL_FLAG_COARSE_GRAINED != 0
            })
            .expect("a coarse-grained region");
        let mut segment = u32::MAX;
        assert_eq!(
            info(coarse, HSA_REGION_INFO_SEGMENT, (&raw mut segment).cast()),
            HSA_STATUS_SUCCESS
        );
        assert_eq!(segment, HSA_REGION_SEGMENT_GLOBAL);
        let mut p: *mut c_void = std::ptr::null_mut();
        assert_eq!(
            c.hsa_memory_allocate_fn.unwrap()(coarse, 100, &mut p),
            HSA_STATUS_SUCCESS
        );
        let (_, pinfo) = pointer_info(&hsa, p, size_of::<hsa_amd_pointer_info_t>() as u32);
        assert_eq!(pinfo.agentOwner.handle, gpu.handle);
        assert_eq!(
            pinfo.global_flags,
            HSA_AMD_MEMORY_POOL_GLOBAL_FLAG_COARSE_GRAINED
        );
        assert_eq!(c.hsa_memory_free_fn.unwrap()(p), HSA_STATUS_SUCCESS);
        assert_eq!(
            c.hsa_memory_allocate_fn.unwrap()(hsa_region_t { handle: 3 }, 100, &mut p),
            HSA_STATUS_ERROR_INVALID_REGION
        );
    }
}

#[test]
fn an_allocation_larger_than_alloc_max_size_is_an_invalid_allocation() {
    // hsa.h and hsa_ext_amd.h: a size greater than ALLOC_MAX_SIZE is
    // HSA_STATUS_ERROR_INVALID_ALLOCATION; OUT_OF_RESOURCES means no memory is available now.
    let (hsa, _session) = open();
    let gpu = hsa.gpu_agents().unwrap()[0];
    let pool = hsa.coarse_pool(gpu).unwrap();
    let max: usize = pool_info(&hsa, pool, HSA_AMD_MEMORY_POOL_INFO_ALLOC_MAX_SIZE);
    for size in [max + 1, usize::MAX] {
        assert_eq!(
            hsa.allocate(pool, size),
            Err(HSA_STATUS_ERROR_INVALID_ALLOCATION),
            "pool allocation of {size} bytes"
        );
        let mut p: *mut c_void = std::ptr::null_mut();
        // SAFETY: table entry; a pool handle is also the handle of its region; `p` is a live
        // out pointer.
        let status = unsafe {
            hsa.core().hsa_memory_allocate_fn.unwrap()(
                hsa_region_t {
                    handle: pool.handle,
                },
                size,
                &mut p,
            )
        };
        assert_eq!(
            status, HSA_STATUS_ERROR_INVALID_ALLOCATION,
            "region allocation of {size} bytes"
        );
    }
}

unsafe extern "C" fn note_free(ptr: *mut c_void, data: *mut c_void) {
    // SAFETY: registered with a pointer to a live usize.
    unsafe { *data.cast::<usize>() = ptr as usize };
}

#[test]
fn deallocation_callbacks_run_when_memory_is_freed() {
    let (hsa, _session) = open();
    let amd = *hsa.amd();
    let p = hsa
        .allocate(hsa.coarse_pool(hsa.gpu_agents().unwrap()[0]).unwrap(), 64)
        .unwrap();
    let mut freed = 0usize;
    // SAFETY: table entry; `freed` outlives the allocation.
    let status = unsafe {
        amd.hsa_amd_register_deallocation_callback_fn.unwrap()(
            p.cast(),
            Some(note_free),
            (&raw mut freed).cast(),
        )
    };
    assert_eq!(status, HSA_STATUS_SUCCESS);
    hsa.free(p).unwrap();
    assert_eq!(freed, p as usize);
}

#[test]
fn locked_host_memory_is_reported_as_locked() {
    let (hsa, _session) = open();
    let amd = *hsa.amd();
    let mut host = vec![0u8; 256];
    let mut agent_ptr: *mut c_void = std::ptr::null_mut();
    // SAFETY: table entries; `host` outlives the lock.
    unsafe {
        let status = amd.hsa_amd_memory_lock_fn.unwrap()(
            host.as_mut_ptr().cast(),
            256,
            std::ptr::null_mut(),
            0,
            &mut agent_ptr,
        );
        assert_eq!(status, HSA_STATUS_SUCCESS);
        assert_eq!(
            agent_ptr,
            host.as_mut_ptr().cast(),
            "agents share the host address space"
        );
        let (_, info) = pointer_info(
            &hsa,
            host.as_ptr().add(10).cast(),
            size_of::<hsa_amd_pointer_info_t>() as u32,
        );
        assert_eq!(info.type_, HSA_EXT_POINTER_TYPE_LOCKED);
        assert_eq!(info.sizeInBytes, 256);
        assert_eq!(
            amd.hsa_amd_memory_unlock_fn.unwrap()(host.as_mut_ptr().cast()),
            HSA_STATUS_SUCCESS
        );
        let (_, info) = pointer_info(
            &hsa,
            host.as_ptr().cast(),
            size_of::<hsa_amd_pointer_info_t>() as u32,
        );
        assert_eq!(info.type_, HSA_EXT_POINTER_TYPE_UNKNOWN);
    }
}

#[test]
fn locking_with_an_agent_array_of_no_agents_is_an_invalid_argument() {
    // hsa_ext_amd.h: INVALID_ARGUMENT when "agents not NULL but num_agent is 0" (a null array
    // with 0 agents is the way to name every agent).
    let (hsa, _session) = open();
    let amd = *hsa.amd();
    let mut agents = hsa.gpu_agents().unwrap();
    let mut host = vec![0u8; 256];
    let mut agent_ptr: *mut c_void = std::ptr::null_mut();
    // SAFETY: table entry; `host` and `agents` outlive the call; nothing stays locked.
    let status = unsafe {
        amd.hsa_amd_memory_lock_fn.unwrap()(
            host.as_mut_ptr().cast(),
            256,
            agents.as_mut_ptr(),
            0,
            &mut agent_ptr,
        )
    };
    assert_eq!(status, HSA_STATUS_ERROR_INVALID_ARGUMENT);
    let (_, info) = pointer_info(
        &hsa,
        host.as_ptr().cast(),
        size_of::<hsa_amd_pointer_info_t>() as u32,
    );
    assert_eq!(
        info.type_, HSA_EXT_POINTER_TYPE_UNKNOWN,
        "nothing was locked"
    );
}
