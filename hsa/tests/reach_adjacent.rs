//! Allocations that lie side by side: one ends where the next begins (a runtime that packs
//! small allocations back to back, neighbouring locked ranges of one host buffer). A kernel given
//! the end pointer of the first (`end()`, one past its last byte) walks back from it: that value
//! is also the start of the second, and both allocations are what the kernel may write. A
//! replayed `end[-1 - i] += 1` must leave one run's result in the first.

#[macro_use]
#[allow(dead_code)]
mod support;

use std::ffi::c_void;
use std::sync::atomic::{AtomicU32, Ordering};

use hsa_sys::*;
use kreplay_drain::DrainConfig;
use kreplay_hsa::InstallOptions;
use kreplay_passloop::{LoopEnd, ReplayOutcome};
use kreplay_snapshot::{SnapshotConfig, SnapshotScope};
use kreplay_softhsa::WorkGroup;
use support::app::{self, App, Aql, WAIT};
use support::tool::{Script, TestHooks};

static RUNS: AtomicU32 = AtomicU32::new(0);

#[repr(C)]
#[derive(Clone, Copy)]
struct EndArgs {
    end: u64,
    len: u32,
    pad: u32,
}

/// `end[-1 - i] += 1` for `i < len`: the argument is one past the end of the buffer.
fn add_one_before_end(group: &WorkGroup) {
    // SAFETY: every dispatch of this kernel carries an `EndArgs` block.
    let args: EndArgs = unsafe { group.kernargs() };
    if group.group_id() == [0, 0, 0] {
        RUNS.fetch_add(1, Ordering::SeqCst);
    }
    for [i, _, _] in group.work_items() {
        if i < args.len {
            // SAFETY: `len` u32 lie before `end`; each work-item owns one.
            unsafe { *(args.end as *mut u32).sub(1 + i as usize) += 1 };
        }
    }
}

const PAGE: usize = 4096;

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

/// Two pages of host memory, each locked for the agents on its own: two tracked allocations,
/// the second beginning where the first ends.
fn two_locked_pages(app: &App) -> &'static mut [u32] {
    let layout = std::alloc::Layout::from_size_align(2 * PAGE, PAGE).expect("a layout");
    // SAFETY: a non-zero size; the pages live for the rest of the scenario's process.
    let ptr = unsafe { std::alloc::alloc_zeroed(layout) }.cast::<u32>();
    assert!(!ptr.is_null());
    let lock = app.amd().hsa_amd_memory_lock_fn.expect("memory lock");
    for page in 0..2 {
        let mut agent_ptr: *mut c_void = std::ptr::null_mut();
        // SAFETY: one page of the live buffer above; a null agent list means every agent.
        let status = unsafe {
            lock(
                ptr.cast::<u8>().add(page * PAGE).cast(),
                PAGE,
                std::ptr::null_mut(),
                0,
                &mut agent_ptr,
            )
        };
        assert_eq!(status, HSA_STATUS_SUCCESS);
        assert_eq!(agent_ptr as usize, ptr as usize + page * PAGE);
    }
    // SAFETY: `2 * PAGE` bytes at `ptr`, owned by nobody else.
    unsafe { std::slice::from_raw_parts_mut(ptr, 2 * PAGE / 4) }
}

/// Replays `end[-1 - i] += 1` over the whole first page, given the end of the first page (the
/// start of the second), and asserts one run's result in both pages.
fn once_from_the_end_of_the_first(app: &App, hooks: &TestHooks, words: &mut [u32]) {
    let init: Vec<u32> = (0..words.len() as u32).map(|i| 11 + 2 * i).collect();
    words.copy_from_slice(&init);
    let per_page = (PAGE / 4) as u32;
    let end = words.as_ptr() as u64 + PAGE as u64;
    let pools = app.pools(app.gpus[0]);
    let kernel = kreplay_softhsa::register_kernel("reach_adjacent_before_end", add_one_before_end);
    let args = app.kernargs(
        &pools,
        EndArgs {
            end,
            len: per_page,
            pad: 0,
        },
    );
    let q = app.queue(app.gpus[0]);
    let done = app.signal(1);
    app.dispatch(q, Aql::dispatch(kernel, per_page, 64, args, done));
    assert_eq!(app.wait_zero(done), 0);
    let id = hooks
        .configured_dispatches()
        .last()
        .expect("a dispatch")
        .dispatch_id;
    let outcome = hooks.finished_record(id).outcome;
    let mut expected = init.clone();
    for x in &mut expected[..per_page as usize] {
        *x += 1;
    }
    let wrong = words
        .iter()
        .zip(&expected)
        .position(|(a, e)| a != e)
        .map(|i| (i, words[i], expected[i]));
    assert_eq!(
        wrong, None,
        "first wrong word (index, value, one run's value); outcome {outcome:?}"
    );
    assert_eq!(
        outcome,
        ReplayOutcome::Replayed {
            passes: 3,
            end: LoopEnd::LastPass
        }
    );
    assert_eq!(RUNS.load(Ordering::SeqCst), 3);
}

scenarios! {
    /// Host memory, default scope (host memory is in a snapshot only where arguments reach it).
    fn an_end_pointer_that_starts_the_next_allocation_reaches_the_one_it_ends() {
        let (app, hooks) = setup(SnapshotScope::Agent);
        let words = two_locked_pages(&app);
        once_from_the_end_of_the_first(&app, &hooks, words);
    }

    /// The same under `referenced` scope.
    fn an_end_pointer_that_starts_the_next_allocation_reaches_the_one_it_ends_under_referenced_scope() {
        let (app, hooks) = setup(SnapshotScope::Referenced);
        let words = two_locked_pages(&app);
        once_from_the_end_of_the_first(&app, &hooks, words);
    }
}
