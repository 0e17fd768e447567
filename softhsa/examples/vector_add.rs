//! A complete HSA program written against the API table alone: find a GPU agent and its pools,
//! copy two vectors to device memory, dispatch `c = a + b` on an AQL queue, wait for the
//! completion signal, copy the result back and verify it.
//!
//! Run with `cargo run -p kreplay-softhsa --example vector_add`.

use hsa_sys::*;
use kreplay_softhsa::{WorkGroup, api_table, register_kernel};
use std::ffi::c_void;
use std::mem::size_of;
use std::process::ExitCode;
use std::ptr::{null, null_mut};
use std::sync::atomic::{AtomicU16, Ordering};

const N: usize = 1 << 20;
const WORKGROUP: u16 = 256;

/// The kernel argument block, as a compiler would lay it out.
#[derive(Clone, Copy)]
#[repr(C)]
struct Args {
    a: *const f32,
    b: *const f32,
    c: *mut f32,
    n: u32,
}

/// `c[i] = a[i] + b[i]` for this work-group's items.
fn vector_add(group: &WorkGroup) {
    // SAFETY: every dispatch of this kernel passes an `Args` block.
    let args: Args = unsafe { group.kernargs() };
    for [i, _, _] in group.work_items() {
        if i < args.n {
            let i = i as usize;
            // SAFETY: i < n, the length of all three buffers; each item owns c[i].
            unsafe { *args.c.add(i) = *args.a.add(i) + *args.b.add(i) };
        }
    }
}

fn check(status: hsa_status_t, what: &str) -> Result<(), String> {
    if status == HSA_STATUS_SUCCESS {
        Ok(())
    } else {
        Err(format!("{what} failed with status {status:#x}"))
    }
}

unsafe extern "C" fn find_gpu(agent: hsa_agent_t, data: *mut c_void) -> hsa_status_t {
    let core = table_core();
    let mut device: hsa_device_type_t = 0;
    // SAFETY: a table entry; `device` is a u32 as HSA_AGENT_INFO_DEVICE requires.
    let status = unsafe {
        core.hsa_agent_get_info_fn.unwrap()(agent, HSA_AGENT_INFO_DEVICE, (&raw mut device).cast())
    };
    if status == HSA_STATUS_SUCCESS && device == HSA_DEVICE_TYPE_GPU {
        // SAFETY: `data` is the Option<hsa_agent_t> passed by main.
        unsafe { *data.cast::<Option<hsa_agent_t>>() = Some(agent) };
        return HSA_STATUS_INFO_BREAK;
    }
    status
}

/// The pools main looks for: (coarse-grained, kernarg).
type Pools = (Option<hsa_amd_memory_pool_t>, Option<hsa_amd_memory_pool_t>);

unsafe extern "C" fn find_pools(pool: hsa_amd_memory_pool_t, data: *mut c_void) -> hsa_status_t {
    let amd = table_amd();
    let mut flags = 0u32;
    // SAFETY: a table entry; GLOBAL_FLAGS is a u32.
    let status = unsafe {
        amd.hsa_amd_memory_pool_get_info_fn.unwrap()(
            pool,
            HSA_AMD_MEMORY_POOL_INFO_GLOBAL_FLAGS,
            (&raw mut flags).cast(),
        )
    };
    // SAFETY: `data` is the Pools tuple passed by main.
    let pools = unsafe { &mut *data.cast::<Pools>() };
    if flags & HSA_AMD_MEMORY_POOL_GLOBAL_FLAG_COARSE_GRAINED != 0 {
        pools.0.get_or_insert(pool);
    }
    if flags & HSA_AMD_MEMORY_POOL_GLOBAL_FLAG_KERNARG_INIT != 0 {
        pools.1.get_or_insert(pool);
    }
    status
}

fn table_core() -> CoreApiTable {
    // SAFETY: softhsa's table points to a valid, never-freed core table.
    unsafe { *api_table().core_ }
}

fn table_amd() -> AmdExtTable {
    // SAFETY: softhsa's table points to a valid, never-freed AMD extension table.
    unsafe { *api_table().amd_ext_ }
}

fn run() -> Result<(), String> {
    let core = table_core();
    let amd = table_amd();
    let kernel_object = register_kernel("vector_add", vector_add);

    // SAFETY: every call in this block goes through table entries with the HSA
    // signatures; every pointer passed is either a live local, a runtime allocation of the size
    // used, or the queue the runtime created; the ring slot written is one we reserved.
    unsafe {
        check(core.hsa_init_fn.unwrap()(), "hsa_init")?;

        let mut gpu: Option<hsa_agent_t> = None;
        let status = core.hsa_iterate_agents_fn.unwrap()(Some(find_gpu), (&raw mut gpu).cast());
        let gpu = gpu.ok_or(format!("no GPU agent (status {status:#x})"))?;
        let mut pools: Pools = (None, None);
        check(
            amd.hsa_amd_agent_iterate_memory_pools_fn.unwrap()(
                gpu,
                Some(find_pools),
                (&raw mut pools).cast(),
            ),
            "hsa_amd_agent_iterate_memory_pools",
        )?;
        let (device, kernarg) = (
            pools.0.ok_or("no coarse-grained pool")?,
            pools.1.ok_or("no kernarg pool")?,
        );

        let bytes = N * size_of::<f32>();
        let allocate = |pool, size| -> Result<*mut c_void, String> {
            let mut ptr = null_mut();
            check(
                amd.hsa_amd_memory_pool_allocate_fn.unwrap()(pool, size, 0, &mut ptr),
                "hsa_amd_memory_pool_allocate",
            )?;
            Ok(ptr)
        };
        let (a, b, c) = (
            allocate(device, bytes)?,
            allocate(device, bytes)?,
            allocate(device, bytes)?,
        );
        let host_a: Vec<f32> = (0..N).map(|i| i as f32).collect();
        let host_b: Vec<f32> = (0..N).map(|i| (2 * i) as f32 + 0.5).collect();
        check(
            core.hsa_memory_copy_fn.unwrap()(a, host_a.as_ptr().cast(), bytes),
            "hsa_memory_copy",
        )?;
        check(
            core.hsa_memory_copy_fn.unwrap()(b, host_b.as_ptr().cast(), bytes),
            "hsa_memory_copy",
        )?;

        let args = allocate(kernarg, size_of::<Args>())?;
        args.cast::<Args>().write(Args {
            a: a.cast(),
            b: b.cast(),
            c: c.cast(),
            n: N as u32,
        });

        let mut queue: *mut hsa_queue_t = null_mut();
        check(
            core.hsa_queue_create_fn.unwrap()(
                gpu,
                256,
                HSA_QUEUE_TYPE_MULTI,
                None,
                null_mut(),
                u32::MAX,
                u32::MAX,
                &mut queue,
            ),
            "hsa_queue_create",
        )?;
        let mut done = hsa_signal_t { handle: 0 };
        check(
            core.hsa_signal_create_fn.unwrap()(1, 0, null(), &mut done),
            "hsa_signal_create",
        )?;

        // Reserve a slot, write the packet body, publish the header last, ring the doorbell.
        let index = core.hsa_queue_add_write_index_scacq_screl_fn.unwrap()(queue, 1);
        let slot = (*queue)
            .base_address
            .cast::<hsa_kernel_dispatch_packet_t>()
            .add((index % u64::from((*queue).size)) as usize);
        let packet = hsa_kernel_dispatch_packet_t {
            header: 0,
            setup: 1 << HSA_KERNEL_DISPATCH_PACKET_SETUP_DIMENSIONS,
            workgroup_size_x: WORKGROUP,
            workgroup_size_y: 1,
            workgroup_size_z: 1,
            reserved0: 0,
            grid_size_x: N as u32,
            grid_size_y: 1,
            grid_size_z: 1,
            private_segment_size: 0,
            group_segment_size: 0,
            kernel_object,
            kernarg_address: args,
            reserved2: 0,
            completion_signal: done,
        };
        let body = (&raw const packet).cast::<u8>().add(2);
        std::ptr::copy_nonoverlapping(
            body,
            slot.cast::<u8>().add(2),
            size_of::<hsa_kernel_dispatch_packet_t>() - 2,
        );
        let header = (HSA_PACKET_TYPE_KERNEL_DISPATCH << HSA_PACKET_HEADER_TYPE)
            | (1 << HSA_PACKET_HEADER_BARRIER)
            | (HSA_FENCE_SCOPE_SYSTEM << HSA_PACKET_HEADER_SCACQUIRE_FENCE_SCOPE)
            | (HSA_FENCE_SCOPE_SYSTEM << HSA_PACKET_HEADER_SCRELEASE_FENCE_SCOPE);
        (*slot.cast::<AtomicU16>()).store(header as u16, Ordering::Release);
        core.hsa_signal_store_screlease_fn.unwrap()((*queue).doorbell_signal, index as i64);

        let left = core.hsa_signal_wait_scacquire_fn.unwrap()(
            done,
            HSA_SIGNAL_CONDITION_EQ,
            0,
            10_000_000_000, // 10 s in 1 GHz timestamp ticks
            HSA_WAIT_STATE_BLOCKED,
        );
        if left != 0 {
            return Err("the dispatch did not complete within 10 s".into());
        }

        let mut result = vec![0f32; N];
        check(
            core.hsa_memory_copy_fn.unwrap()(result.as_mut_ptr().cast(), c, bytes),
            "hsa_memory_copy",
        )?;
        let wrong = (0..N)
            .filter(|&i| result[i] != host_a[i] + host_b[i])
            .count();

        check(
            core.hsa_queue_destroy_fn.unwrap()(queue),
            "hsa_queue_destroy",
        )?;
        check(
            core.hsa_signal_destroy_fn.unwrap()(done),
            "hsa_signal_destroy",
        )?;
        for ptr in [a, b, c, args] {
            check(
                amd.hsa_amd_memory_pool_free_fn.unwrap()(ptr),
                "hsa_amd_memory_pool_free",
            )?;
        }
        check(core.hsa_shut_down_fn.unwrap()(), "hsa_shut_down")?;

        if wrong > 0 {
            return Err(format!("{wrong} of {N} elements are wrong"));
        }
        println!(
            "vector_add: {N} elements in work-groups of {WORKGROUP} on kernel object {kernel_object:#x}: \
             all correct (c[1] = {}, c[{}] = {})",
            result[1],
            N - 1,
            result[N - 1]
        );
    }
    Ok(())
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("vector_add: {message}");
            ExitCode::FAILURE
        }
    }
}
