//! Memory that changes size at one address between dispatches, through the virtual memory API
//! (`hsa_amd_vmem_*`, ROCm 6.x tables): a mapping unmapped and a larger one mapped at the same
//! address, and an unmap the runtime refuses (the mapping stays). Each dispatch after it either
//! sees every pass start from its first pass's bytes and ends with one run's result, or is
//! declined and runs once.

#[macro_use]
#[allow(dead_code, unused_macros)]
mod support;

use std::ffi::c_void;

use hsa_sys::layouts::{AmdExtTableV2, hsa_amd_vmem_alloc_handle_t};
use hsa_sys::*;
use kreplay_drain::DrainConfig;
use kreplay_hsa::InstallOptions;
use kreplay_passloop::{LoopEnd, ReplayOutcome};
use kreplay_snapshot::{RestoreStrategy, SnapshotConfig, StoreTier};
use kreplay_softhsa::WorkGroup;
use support::app::{self, App, Aql, WAIT};
use support::tool::{Script, TestHooks};

/// softhsa's allocation granule: reservations, handles and mappings are multiples of it.
const GRANULE: usize = 4096;

#[repr(C)]
#[derive(Clone, Copy)]
struct Args {
    buf: u64,
    len: u32,
    pad: u32,
}

/// `buf[i] += 1` for `i < len`.
fn add_one(group: &WorkGroup) {
    // SAFETY: every dispatch of this kernel carries an `Args` block.
    let args: Args = unsafe { group.kernargs() };
    for [i, _, _] in group.work_items() {
        if i < args.len {
            // SAFETY: the buffer holds `len` u32s; each work-item owns index `i`.
            unsafe { *(args.buf as *mut u32).add(i as usize) += 1 };
        }
    }
}

/// `table[0][i] += 1` for `i < len`: the words are reached through a pointer kept in memory
/// (`buf` holds the address of the words), not through the kernel's arguments.
fn add_one_through_a_table(group: &WorkGroup) {
    // SAFETY: every dispatch of this kernel carries an `Args` block.
    let args: Args = unsafe { group.kernargs() };
    // SAFETY: `buf` holds one u64, the address of `len` u32s.
    let words = unsafe { (args.buf as *const u64).read() } as *mut u32;
    for [i, _, _] in group.work_items() {
        if i < args.len {
            // SAFETY: as above; each work-item owns index `i`.
            unsafe { *words.add(i as usize) += 1 };
        }
    }
}

fn amd6(app: &App) -> &'static AmdExtTableV2 {
    app.amd_v2().expect("a ROCm 6.x table")
}

/// Calls one entry of the ROCm 6.x AMD extension table.
macro_rules! amd6 {
    ($app:expr, $entry:ident ( $($arg:expr),* $(,)? )) => {{
        let f = amd6(&$app).$entry.expect(stringify!($entry));
        // SAFETY: every call site passes arguments that satisfy the entry's HSA contract.
        unsafe { f($($arg),*) }
    }};
}

fn ok(status: hsa_status_t, what: &str) {
    assert_eq!(status, HSA_STATUS_SUCCESS, "{what} failed with {status:#x}");
}

fn setup(strategy: RestoreStrategy) -> (App, std::sync::Arc<TestHooks>) {
    let hooks = TestHooks::new(0);
    let app = app::install(
        hooks.clone(),
        InstallOptions {
            snapshot: SnapshotConfig::default()
                .with_store(StoreTier::Host)
                .with_strategy(strategy),
            drain: DrainConfig::new(WAIT),
            ..Default::default()
        },
    );
    hooks.configure_replay(true);
    hooks.set_script(Script::passes(3));
    (app, hooks)
}

/// A handle of `granules` granules from the agent's coarse-grained pool, mapped at `va`.
fn map(app: &App, va: u64, granules: usize) -> hsa_amd_vmem_alloc_handle_t {
    let pool = app.pools(app.gpus[0]).coarse;
    let mut handle = hsa_amd_vmem_alloc_handle_t::default();
    ok(
        amd6!(
            app,
            hsa_amd_vmem_handle_create_fn(pool, granules * GRANULE, 0, 0, &mut handle)
        ),
        "create",
    );
    ok(
        amd6!(
            app,
            hsa_amd_vmem_map_fn(va as *mut c_void, granules * GRANULE, 0, handle, 0)
        ),
        "map",
    );
    handle
}

fn reserve(app: &App, granules: usize) -> u64 {
    let mut va: *mut c_void = std::ptr::null_mut();
    ok(
        amd6!(
            app,
            hsa_amd_vmem_address_reserve_fn(&mut va, granules * GRANULE, 0, 0)
        ),
        "reserve",
    );
    va as u64
}

fn read_words(addr: u64, len: usize) -> Vec<u32> {
    // SAFETY: `addr` holds `len` readable u32 (mapped memory of the scenario).
    (0..len)
        .map(|i| unsafe { (addr as *const u32).add(i).read() })
        .collect()
}

/// Writes distinct values over `words` u32s at `va`, dispatches `x += 1` over them, and returns
/// the outcome, with the words as they were before and after.
fn add_one_over(
    app: &App,
    hooks: &TestHooks,
    va: u64,
    words: usize,
    seed: u32,
) -> (ReplayOutcome, Vec<u32>, Vec<u32>) {
    let init: Vec<u32> = (0..words as u32).map(|i| seed + 7 * i).collect();
    for (i, v) in init.iter().enumerate() {
        // SAFETY: the range holds `words` writable u32.
        unsafe { (va as *mut u32).add(i).write(*v) };
    }
    let pools = app.pools(app.gpus[0]);
    let kernel = kreplay_softhsa::register_kernel("tiers_vmem_add_one", add_one);
    let kernarg = app.kernargs(
        &pools,
        Args {
            buf: va,
            len: words as u32,
            pad: 0,
        },
    );
    let q = app.queue(app.gpus[0]);
    let done = app.signal(1);
    app.dispatch(q, Aql::dispatch(kernel, words as u32, 64, kernarg, done));
    assert_eq!(app.wait_zero(done), 0);
    let dispatch = hooks
        .configured_dispatches()
        .last()
        .expect("a dispatch")
        .dispatch_id;
    let outcome = hooks.finished_record(dispatch).outcome;
    (outcome, init, read_words(va, words))
}

fn one_run(init: &[u32]) -> Vec<u32> {
    init.iter().map(|v| v + 1).collect()
}

const REPLAYED: ReplayOutcome = ReplayOutcome::Replayed {
    passes: 3,
    end: LoopEnd::LastPass,
};

/// A mapping followed page by page after its replay (`tracked`), unmapped, and a handle twice
/// its size mapped at the same address: the next replay over the larger mapping restores all
/// of it.
fn larger_mapping_at_the_same_address() {
    let (app, hooks) = setup(RestoreStrategy::Tracked);
    let va = reserve(&app, 4);
    let small = map(&app, va, 2);
    let words = 2 * GRANULE / 4;
    let (outcome, init, after) = add_one_over(&app, &hooks, va, words, 3);
    assert_eq!((outcome, after), (REPLAYED, one_run(&init)));
    ok(
        amd6!(app, hsa_amd_vmem_unmap_fn(va as *mut c_void, 2 * GRANULE)),
        "unmap",
    );
    ok(amd6!(app, hsa_amd_vmem_handle_release_fn(small)), "release");
    map(&app, va, 4);

    let words = 4 * GRANULE / 4;
    let (outcome, init, after) = add_one_over(&app, &hooks, va, words, 11);

    assert_eq!(
        after,
        one_run(&init),
        "one run's result over the whole larger mapping"
    );
    assert_eq!(outcome, REPLAYED);
}

/// An unmap the runtime refuses (a size other than the mapping's): the mapping stays, and so
/// must kreplay's knowledge of it; the next dispatch over it ends with one run's result.
fn a_refused_unmap() {
    let (app, hooks) = setup(RestoreStrategy::Full);
    let va = reserve(&app, 4);
    map(&app, va, 2);
    let status = amd6!(app, hsa_amd_vmem_unmap_fn(va as *mut c_void, GRANULE));
    assert_ne!(
        status, HSA_STATUS_SUCCESS,
        "the runtime refuses a partial unmap"
    );

    let words = 2 * GRANULE / 4;
    let (outcome, init, after) = add_one_over(&app, &hooks, va, words, 5);

    assert_eq!(
        after,
        one_run(&init),
        "one run's result, not one per pass ({outcome:?})"
    );
    assert_eq!(outcome, REPLAYED);
}

/// A refused unmap with the mapping reached only through a pointer kept in a buffer of the
/// agent's (nothing in the kernel's arguments points into it): the agent scope must still hold
/// it. It used to be forgotten before the runtime refused, so each pass added one more.
fn a_refused_unmap_of_memory_reached_through_a_table() {
    refused_release_of_memory_reached_through_a_table(|app, va| {
        amd6!(app, hsa_amd_vmem_unmap_fn(va as *mut c_void, GRANULE))
    });
}

/// The same with `hsa_amd_memory_pool_free` of the mapping, which the runtime refuses (it is
/// no pool allocation).
fn a_refused_pool_free_of_memory_reached_through_a_table() {
    refused_release_of_memory_reached_through_a_table(|app, va| {
        let free = app.amd().hsa_amd_memory_pool_free_fn.expect("pool free");
        // SAFETY: a mapped address of this process; the runtime checks what it is.
        unsafe { free(va as *mut c_void) }
    });
}

/// Maps two granules, has `release` refused by the runtime, then replays `x += 1` over the
/// mapping reached through a table, and asserts one run's result.
fn refused_release_of_memory_reached_through_a_table(release: fn(&App, u64) -> hsa_status_t) {
    let (app, hooks) = setup(RestoreStrategy::Full);
    let va = reserve(&app, 4);
    map(&app, va, 2);
    let status = release(&app, va);
    assert_ne!(
        status, HSA_STATUS_SUCCESS,
        "the runtime refuses the release"
    );
    let pools = app.pools(app.gpus[0]);
    let table = app.alloc(pools.coarse, GRANULE);
    // SAFETY: the table holds GRANULE writable bytes.
    unsafe { (table.0 as *mut u64).write(va) };
    let words = 2 * GRANULE / 4;
    let init: Vec<u32> = (0..words as u32).map(|i| 9 + 7 * i).collect();
    for (i, v) in init.iter().enumerate() {
        // SAFETY: the mapping holds `words` writable u32.
        unsafe { (va as *mut u32).add(i).write(*v) };
    }
    let kernel =
        kreplay_softhsa::register_kernel("tiers_vmem_add_one_table", add_one_through_a_table);
    let kernarg = app.kernargs(
        &pools,
        Args {
            buf: table.0,
            len: words as u32,
            pad: 0,
        },
    );
    let q = app.queue(app.gpus[0]);
    let done = app.signal(1);
    app.dispatch(q, Aql::dispatch(kernel, words as u32, 64, kernarg, done));
    assert_eq!(app.wait_zero(done), 0);
    let dispatch = hooks
        .configured_dispatches()
        .last()
        .expect("a dispatch")
        .dispatch_id;
    let outcome = hooks.finished_record(dispatch).outcome;

    let after = read_words(va, words);
    let expected = one_run(&init);
    let wrong = (0..words)
        .find(|&i| after[i] != expected[i])
        .map(|i| (i, after[i], expected[i]));
    assert_eq!(
        wrong, None,
        "first wrong word (index, value, one run's value) after {outcome:?}"
    );
    assert_eq!(outcome, REPLAYED);
}

#[test]
fn an_unmap_the_runtime_refuses_leaves_memory_reached_through_a_table_snapshotted() {
    support::isolated_on(
        "an_unmap_the_runtime_refuses_leaves_memory_reached_through_a_table_snapshotted",
        &["6.2"],
        a_refused_unmap_of_memory_reached_through_a_table,
    );
}

#[test]
fn a_pool_free_the_runtime_refuses_leaves_memory_reached_through_a_table_snapshotted() {
    support::isolated_on(
        "a_pool_free_the_runtime_refuses_leaves_memory_reached_through_a_table_snapshotted",
        &["6.2"],
        a_refused_pool_free_of_memory_reached_through_a_table,
    );
}

#[test]
fn a_larger_mapping_at_the_address_of_an_unmapped_one_is_restored_whole() {
    support::isolated_on(
        "a_larger_mapping_at_the_address_of_an_unmapped_one_is_restored_whole",
        &["6.2"],
        larger_mapping_at_the_same_address,
    );
}

#[test]
fn an_unmap_the_runtime_refuses_leaves_the_mapping_snapshotted() {
    support::isolated_on(
        "an_unmap_the_runtime_refuses_leaves_the_mapping_snapshotted",
        &["6.2"],
        a_refused_unmap,
    );
}
