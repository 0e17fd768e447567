//! Memory that reaches kernels without `hsa_amd_memory_pool_allocate`: virtual memory mappings
//! (`hsa_amd_vmem_*`, ROCm 6.x) and locked host memory (`hsa_amd_memory_lock`,
//! `hsa_amd_memory_lock_to_pool`) are tracked in the inventory with their owner and kind; a
//! coarse-grained mapping of the replayed agent is snapshotted and restored like any of its
//! allocations.

#[macro_use]
#[allow(dead_code, unused_macros)]
mod support;

use std::ffi::c_void;

use hsa_sys::layouts::{AmdExtTableV2, hsa_amd_memory_access_desc_t, hsa_amd_vmem_alloc_handle_t};
use hsa_sys::*;
use kreplay_drain::DrainConfig;
use kreplay_hsa::InstallOptions;
use kreplay_passloop::{LoopEnd, ReplayOutcome};
use kreplay_snapshot::MemoryKind;
use kreplay_softhsa::WorkGroup;
use support::app::{self, App, Aql, WAIT};
use support::tool::{Script, TestHooks};

fn ok(status: hsa_status_t, what: &str) {
    assert_eq!(status, HSA_STATUS_SUCCESS, "{what} failed with {status:#x}");
}

#[repr(C)]
#[derive(Clone, Copy)]
struct Args {
    buf: u64,
    len: u32,
    pad: u32,
}

/// `buf[i] += 1`.
fn add_one(group: &WorkGroup) {
    // SAFETY: every dispatch of this kernel carries an `Args` block.
    let args: Args = unsafe { group.kernargs() };
    for [i, _, _] in group.work_items() {
        if i < args.len {
            // SAFETY: `buf` holds `len` u32; each work-item owns index `i`.
            unsafe { *(args.buf as *mut u32).add(i as usize) += 1 };
        }
    }
}

fn setup() -> (App, std::sync::Arc<TestHooks>) {
    let hooks = TestHooks::new(0);
    let app = app::install(
        hooks.clone(),
        InstallOptions {
            drain: DrainConfig::new(WAIT),
            ..Default::default()
        },
    );
    hooks.configure_replay(true);
    (app, hooks)
}

/// Replays `x += 1` over `len` words at `buf` three times on GPU 0 and checks the single-run
/// result.
fn replay_add(app: &App, hooks: &TestHooks, buf: u64, len: u32) {
    hooks.set_script(Script::passes(3));
    let pools = app.pools(app.gpus[0]);
    let before = read_words(buf, len);
    let kernel = kreplay_softhsa::register_kernel("add_one", add_one);
    let kernarg = app.kernargs(&pools, Args { buf, len, pad: 0 });
    let q = app.queue(app.gpus[0]);
    let done = app.signal(1);
    app.dispatch(q, Aql::dispatch(kernel, len, 64, kernarg, done));
    assert_eq!(app.wait_zero(done), 0);
    let dispatch = hooks
        .configured_dispatches()
        .last()
        .expect("a dispatch")
        .dispatch_id;
    assert_eq!(
        hooks.finished_record(dispatch).outcome,
        ReplayOutcome::Replayed {
            passes: 3,
            end: LoopEnd::LastPass
        }
    );
    let after = read_words(buf, len);
    let expected: Vec<u32> = before.iter().map(|v| v + 1).collect();
    assert_eq!(after, expected, "single-run results");
}

/// Reads words the CPU can reach directly (softhsa's memory is host memory).
fn read_words(addr: u64, len: u32) -> Vec<u32> {
    // SAFETY: `addr` holds `len` readable u32 (mapped or locked memory of the scenario).
    (0..len as usize)
        .map(|i| unsafe { (addr as *const u32).add(i).read() })
        .collect()
}

fn vmem(app: &App) -> &'static AmdExtTableV2 {
    app.amd_v2().expect("a ROCm 6.x table")
}

/// Calls one entry of the ROCm 6.x AMD extension table.
macro_rules! amd6 {
    ($app:expr, $entry:ident ( $($arg:expr),* $(,)? )) => {{
        let f = vmem(&$app).$entry.expect(stringify!($entry));
        // SAFETY: every call site passes arguments that satisfy the entry's HSA contract.
        unsafe { f($($arg),*) }
    }};
}

/// A virtual memory mapping of GPU 0's coarse pool is an allocation of GPU 0 with the access
/// the application set; a replay restores it; unmapping forgets it.
#[test]
fn a_virtual_memory_mapping_is_tracked_with_owner_and_access_and_restored() {
    support::isolated_on(
        "a_virtual_memory_mapping_is_tracked_with_owner_and_access_and_restored",
        &["6.2"],
        || {
            let (app, hooks) = setup();
            let size = 2 * 4096;
            let mut va: *mut c_void = std::ptr::null_mut();
            ok(
                amd6!(app, hsa_amd_vmem_address_reserve_fn(&mut va, size, 0, 0)),
                "reserve",
            );
            let pool = app.pools(app.gpus[0]).coarse;
            let mut handle = hsa_amd_vmem_alloc_handle_t::default();
            ok(
                amd6!(
                    app,
                    hsa_amd_vmem_handle_create_fn(pool, size, 0, 0, &mut handle)
                ),
                "create",
            );
            ok(
                amd6!(app, hsa_amd_vmem_map_fn(va, size, 0, handle, 0)),
                "map",
            );
            let access = [
                hsa_amd_memory_access_desc_t {
                    permissions: HSA_ACCESS_PERMISSION_RW,
                    agent_handle: app.gpus[0],
                },
                hsa_amd_memory_access_desc_t {
                    permissions: HSA_ACCESS_PERMISSION_RO,
                    agent_handle: app.gpus[1],
                },
            ];
            ok(
                amd6!(
                    app,
                    hsa_amd_vmem_set_access_fn(va, size, access.as_ptr(), 2)
                ),
                "set access",
            );

            let addr = va as u64;
            assert_eq!(
                kreplay_hsa::tracked_kind(addr + 100),
                Some(MemoryKind::CoarseDevice)
            );
            assert_eq!(kreplay_hsa::tracked_owner(addr), Some(app.gpus[0].handle));
            assert_eq!(
                kreplay_hsa::tracked_access(addr),
                Some(vec![
                    (app.gpus[0].handle, HSA_ACCESS_PERMISSION_RW),
                    (app.gpus[1].handle, HSA_ACCESS_PERMISSION_RO)
                ])
            );
            // Read-only access cannot write GPU 0's memory: the agents stay apart.
            let (g0, g1) = (app.gpus[0].handle, app.gpus[1].handle);
            assert_eq!(kreplay_hsa::replay_group(g0), [g0]);
            // SAFETY: the mapping is 8 KiB of writable memory.
            unsafe { std::ptr::write_bytes(va.cast::<u8>(), 3, size) };
            replay_add(&app, &hooks, addr, 2048);
            // Write access makes GPU 1 a peer: replays on either take and drain both.
            let access = [hsa_amd_memory_access_desc_t {
                permissions: HSA_ACCESS_PERMISSION_RW,
                agent_handle: app.gpus[1],
            }];
            ok(
                amd6!(
                    app,
                    hsa_amd_vmem_set_access_fn(va, size, access.as_ptr(), 1)
                ),
                "set access",
            );
            let both = if g0 < g1 { [g0, g1] } else { [g1, g0] };
            assert_eq!(kreplay_hsa::replay_group(g0), both);
            assert_eq!(kreplay_hsa::replay_group(g1), both);
            replay_add(&app, &hooks, addr, 2048);

            // A second reference (retain) keeps the handle; unmapping forgets the range.
            let mut again = hsa_amd_vmem_alloc_handle_t::default();
            ok(
                amd6!(app, hsa_amd_vmem_retain_alloc_handle_fn(&mut again, va)),
                "retain",
            );
            assert_eq!(again, handle);
            ok(amd6!(app, hsa_amd_vmem_unmap_fn(va, size)), "unmap");
            assert_eq!(kreplay_hsa::tracked_kind(addr), None);
            assert_eq!(kreplay_hsa::tracked_access(addr), None);
            ok(
                amd6!(app, hsa_amd_vmem_handle_release_fn(handle)),
                "release",
            );
            ok(
                amd6!(app, hsa_amd_vmem_handle_release_fn(handle)),
                "release the retained one",
            );
            ok(amd6!(app, hsa_amd_vmem_address_free_fn(va, size)), "free");
        },
    );
}

/// Locked host memory is tracked as host memory until it is unlocked (so the snapshot rules for
/// memory a kernel argument points into can include it).
#[test]
fn locked_host_memory_is_tracked_until_unlocked() {
    support::isolated("locked_host_memory_is_tracked_until_unlocked", || {
        let (app, _hooks) = setup();
        let lock = app.amd().hsa_amd_memory_lock_fn.expect("memory lock");
        let lock_to_pool = app
            .amd()
            .hsa_amd_memory_lock_to_pool_fn
            .expect("lock to pool");
        let unlock = app.amd().hsa_amd_memory_unlock_fn.expect("memory unlock");
        let host: &'static mut [u32] = Box::leak(vec![5u32; 1024].into_boxed_slice());
        let other: &'static mut [u32] = Box::leak(vec![0u32; 1024].into_boxed_slice());
        let mut agent_ptr: *mut c_void = std::ptr::null_mut();
        // SAFETY: 4 KiB of live host memory; a null agent list means every agent.
        ok(
            unsafe {
                lock(
                    host.as_mut_ptr().cast(),
                    4096,
                    std::ptr::null_mut(),
                    0,
                    &mut agent_ptr,
                )
            },
            "lock",
        );
        let mut other_ptr: *mut c_void = std::ptr::null_mut();
        let host_pool = app.host_pool();
        // SAFETY: as above, locked to the CPU's system pool.
        ok(
            unsafe {
                lock_to_pool(
                    other.as_mut_ptr().cast(),
                    4096,
                    std::ptr::null_mut(),
                    0,
                    host_pool,
                    0,
                    &mut other_ptr,
                )
            },
            "lock to pool",
        );
        assert_eq!(
            kreplay_hsa::tracked_kind(agent_ptr as u64),
            Some(MemoryKind::Host)
        );
        assert_eq!(
            kreplay_hsa::tracked_kind(other_ptr as u64 + 8),
            Some(MemoryKind::Host)
        );

        assert_eq!(
            kreplay_hsa::tracked_owner(agent_ptr as u64),
            Some(app.cpu.handle)
        );

        // SAFETY: both ranges were locked above and no kernel uses them any more.
        unsafe {
            ok(unlock(host.as_mut_ptr().cast()), "unlock");
            ok(unlock(other.as_mut_ptr().cast()), "unlock");
        }
        assert_eq!(kreplay_hsa::tracked_kind(agent_ptr as u64), None);
        assert_eq!(kreplay_hsa::tracked_kind(other_ptr as u64), None);
    });
}

/// The ring buffer of a soft queue (memory a kernel may write when it enqueues packets for the
/// host) is tracked from creation to destruction, owned by its region's agent.
#[test]
fn a_soft_queue_ring_buffer_is_tracked_until_the_queue_is_destroyed() {
    support::isolated(
        "a_soft_queue_ring_buffer_is_tracked_until_the_queue_is_destroyed",
        || {
            let (app, _hooks) = setup();
            let create = app
                .core()
                .hsa_soft_queue_create_fn
                .expect("soft queue create");
            let destroy = app.core().hsa_queue_destroy_fn.expect("queue destroy");
            let doorbell = app.signal(0);
            // softhsa's regions are its pools.
            let region = hsa_region_t {
                handle: app.host_pool().handle,
            };
            let mut queue: *mut hsa_queue_t = std::ptr::null_mut();
            // SAFETY: a valid region and doorbell signal; `queue` is a valid out pointer.
            ok(
                unsafe { create(region, 64, HSA_QUEUE_TYPE_MULTI, 0, doorbell, &mut queue) },
                "soft queue create",
            );
            // SAFETY: the queue was just created.
            let ring = unsafe { (*queue).base_address } as u64;
            assert_eq!(
                kreplay_hsa::tracked_kind(ring + 64 * 63),
                Some(MemoryKind::Host)
            );
            assert_eq!(kreplay_hsa::tracked_owner(ring), Some(app.cpu.handle));
            // SAFETY: the soft queue is live and unused.
            ok(unsafe { destroy(queue) }, "queue destroy");
            assert_eq!(kreplay_hsa::tracked_kind(ring), None);
        },
    );
}
