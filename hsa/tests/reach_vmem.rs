//! A virtual address range reserved with `hsa_amd_vmem_address_reserve` and backed by several
//! physical handles mapped side by side is one buffer to a kernel: given a pointer into it, the
//! kernel may write any mapping of the range. Each mapping a kernel can so reach must be in the
//! snapshot, whatever the scope and whatever pool backs it: a replayed `x += 1` over the whole
//! range leaves one run's result in every mapping.

#[macro_use]
#[allow(dead_code, unused_macros)]
mod support;

use std::ffi::c_void;

use hsa_sys::layouts::{AmdExtTableV2, hsa_amd_vmem_alloc_handle_t};
use hsa_sys::*;
use kreplay_drain::DrainConfig;
use kreplay_hsa::InstallOptions;
use kreplay_passloop::{LoopEnd, ReplayOutcome};
use kreplay_snapshot::{SnapshotConfig, SnapshotScope};
use kreplay_softhsa::WorkGroup;
use support::app::{self, App, Aql, WAIT};
use support::tool::{Script, TestHooks};

/// softhsa's allocation granule: reservations, handles and mappings are multiples of it.
const GRANULE: usize = 4096;

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

/// `buf[i] += 1` for `i < len`.
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

fn setup(scope: SnapshotScope) -> (App, std::sync::Arc<TestHooks>) {
    let hooks = TestHooks::new(0);
    let app = app::install(
        hooks.clone(),
        InstallOptions {
            snapshot: SnapshotConfig::default().with_scope(scope),
            drain: DrainConfig::new(WAIT),
            ..Default::default()
        },
    );
    hooks.configure_replay(true);
    hooks.set_script(Script::passes(3));
    (app, hooks)
}

/// Reserves `mappings` granules and maps one handle of `pool` into each, side by side.
fn contiguous_mappings(app: &App, pool: hsa_amd_memory_pool_t, mappings: usize) -> u64 {
    let mut va: *mut c_void = std::ptr::null_mut();
    ok(
        amd6!(
            app,
            hsa_amd_vmem_address_reserve_fn(&mut va, mappings * GRANULE, 0, 0)
        ),
        "reserve",
    );
    for m in 0..mappings {
        let mut handle = hsa_amd_vmem_alloc_handle_t::default();
        ok(
            amd6!(
                app,
                hsa_amd_vmem_handle_create_fn(pool, GRANULE, 0, 0, &mut handle)
            ),
            "create",
        );
        // SAFETY: inside the reservation just made.
        let at = unsafe { va.cast::<u8>().add(m * GRANULE) }.cast::<c_void>();
        ok(
            amd6!(app, hsa_amd_vmem_map_fn(at, GRANULE, 0, handle, 0)),
            "map",
        );
    }
    va as u64
}

fn read_words(addr: u64, len: usize) -> Vec<u32> {
    // SAFETY: `addr` holds `len` readable u32 (mapped memory of the scenario).
    (0..len)
        .map(|i| unsafe { (addr as *const u32).add(i).read() })
        .collect()
}

/// Writes distinct values over the range, replays `x += 1` over all of it from a pointer to its
/// start (or, with `from_end`, checks only that the result is one run's), and asserts one run's
/// result in every word.
fn add_one_over(app: &App, hooks: &TestHooks, va: u64, words: usize) {
    let init: Vec<u32> = (0..words as u32).map(|i| 3 + 7 * i).collect();
    for (i, v) in init.iter().enumerate() {
        // SAFETY: the range holds `words` writable u32.
        unsafe { (va as *mut u32).add(i).write(*v) };
    }
    let pools = app.pools(app.gpus[0]);
    let kernel = kreplay_softhsa::register_kernel("reach_vmem_add_one", add_one);
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
    let record = hooks.finished_record(dispatch);
    let after = read_words(va, words);
    let expected: Vec<u32> = init.iter().map(|v| v + 1).collect();
    let wrong = after
        .iter()
        .zip(&expected)
        .position(|(a, e)| a != e)
        .map(|i| (i, after[i], expected[i]));
    assert_eq!(
        wrong, None,
        "first wrong word (index, value, one run's value)"
    );
    assert_eq!(
        record.outcome,
        ReplayOutcome::Replayed {
            passes: 3,
            end: LoopEnd::LastPass
        }
    );
}

/// Under `referenced` scope, three coarse-grained mappings of the agent's own pool, the
/// argument pointing at the first.
#[test]
fn every_mapping_of_a_reserved_range_is_restored_under_the_referenced_scope() {
    support::isolated_on(
        "every_mapping_of_a_reserved_range_is_restored_under_the_referenced_scope",
        &["6.2"],
        || {
            let (app, hooks) = setup(SnapshotScope::Referenced);
            let pool = app.pools(app.gpus[0]).coarse;
            let va = contiguous_mappings(&app, pool, 3);
            add_one_over(&app, &hooks, va, 3 * GRANULE / 4);
        },
    );
}

/// Under `agent` scope, fine-grained mappings (not the agent's coarse-grained memory, so only
/// what the arguments reach is snapshotted).
#[test]
fn every_fine_grained_mapping_of_a_reserved_range_is_restored_under_the_agent_scope() {
    support::isolated_on(
        "every_fine_grained_mapping_of_a_reserved_range_is_restored_under_the_agent_scope",
        &["6.2"],
        || {
            let (app, hooks) = setup(SnapshotScope::Agent);
            let pool = app.pools(app.gpus[0]).fine;
            let va = contiguous_mappings(&app, pool, 3);
            add_one_over(&app, &hooks, va, 3 * GRANULE / 4);
        },
    );
}
