//! Host memory made accessible to agents with `hsa_amd_svm_attributes_set` (shared virtual
//! memory, as managed memory may be where XNACK is off): the runtime knows no allocation there
//! (`hsa_amd_pointer_info` says unknown), yet an agent's kernel given a pointer into it writes
//! it. No snapshot holds such memory, so a dispatch whose arguments point into it must not be
//! replayed in silence: it is declined (`untracked_memory`) and runs once, leaving one run's
//! result.

#[macro_use]
#[allow(dead_code)]
mod support;

use std::sync::atomic::{AtomicU32, Ordering};

use hsa_sys::*;
use kreplay_drain::DrainConfig;
use kreplay_hsa::InstallOptions;
use kreplay_passloop::{DeclineReason, RanOnceReason, ReplayOutcome};
use kreplay_snapshot::{SnapshotConfig, SnapshotScope};
use kreplay_softhsa::WorkGroup;
use support::app::{self, App, Aql, WAIT};
use support::tool::{Script, TestHooks};

static RUNS: AtomicU32 = AtomicU32::new(0);

#[repr(C)]
#[derive(Clone, Copy)]
struct Args {
    buf: u64,
    len: u32,
    pad: u32,
}

/// `buf[i] += 1`; work-group 0 counts the run.
fn add_one(group: &WorkGroup) {
    // SAFETY: every dispatch of this kernel carries an `Args` block.
    let args: Args = unsafe { group.kernargs() };
    if group.group_id() == [0, 0, 0] {
        RUNS.fetch_add(1, Ordering::SeqCst);
    }
    for [i, _, _] in group.work_items() {
        if i < args.len {
            // SAFETY: `buf` holds `len` u32; each work-item owns index `i`.
            unsafe { *(args.buf as *mut u32).add(i as usize) += 1 };
        }
    }
}

const PAGE: usize = 4096;

/// One page-aligned page of host memory, leaked (the scenario's process ends with it).
fn page() -> &'static mut [u32] {
    let layout = std::alloc::Layout::from_size_align(PAGE, PAGE).expect("a page layout");
    // SAFETY: a non-zero size; the page is zeroed and lives for the rest of the process.
    let ptr = unsafe { std::alloc::alloc_zeroed(layout) }.cast::<u32>();
    assert!(!ptr.is_null());
    // SAFETY: `PAGE` bytes at `ptr`, owned by nobody else.
    unsafe { std::slice::from_raw_parts_mut(ptr, PAGE / 4) }
}

fn setup(scope: SnapshotScope) -> App {
    kreplay_softhsa::configure(kreplay_softhsa::SoftHsaConfig {
        svm_supported: true,
        ..Default::default()
    })
    .expect("softhsa configured");
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
    HOOKS.with(|h| *h.borrow_mut() = Some(hooks));
    app
}

thread_local! {
    static HOOKS: std::cell::RefCell<Option<std::sync::Arc<TestHooks>>> =
        const { std::cell::RefCell::new(None) };
}

/// Makes `words` accessible to GPU 0 in place, as HIP does for managed memory.
fn make_accessible(app: &App, words: &mut [u32]) {
    let mut attrs = [hsa_amd_svm_attribute_pair_t {
        attribute: u64::from(HSA_AMD_SVM_ATTRIB_AGENT_ACCESSIBLE_IN_PLACE),
        value: app.gpus[0].handle,
    }];
    let set = app
        .amd()
        .hsa_amd_svm_attributes_set_fn
        .expect("hsa_amd_svm_attributes_set");
    // SAFETY: a page-aligned range of this process's memory and one valid attribute pair.
    let status = unsafe {
        set(
            words.as_mut_ptr().cast(),
            std::mem::size_of_val(words),
            attrs.as_mut_ptr(),
            attrs.len(),
        )
    };
    assert_eq!(status, HSA_STATUS_SUCCESS);
}

/// Runs `add_one` over the first `len` of `words` and asserts a decline and one run's result.
fn declined_once(app: &App, words: &mut [u32], len: u32) {
    let init: Vec<u32> = (0..words.len() as u32).map(|i| 9 + 3 * i).collect();
    words.copy_from_slice(&init);
    let pools = app.pools(app.gpus[0]);
    let kernel = kreplay_softhsa::register_kernel("reach_svm_add_one", add_one);
    let args = app.kernargs(
        &pools,
        Args {
            buf: words.as_ptr() as u64,
            len,
            pad: 0,
        },
    );
    let q = app.queue(app.gpus[0]);
    let done = app.signal(1);
    app.dispatch(q, Aql::dispatch(kernel, len, 64, args, done));
    assert_eq!(app.wait_zero(done), 0);
    let hooks = HOOKS.with(|h| h.borrow().clone()).expect("set up");
    let id = hooks
        .configured_dispatches()
        .last()
        .expect("a dispatch")
        .dispatch_id;
    let outcome = hooks.finished_record(id).outcome;
    let mut expected = init.clone();
    for x in &mut expected[..len as usize] {
        *x += 1;
    }
    let wrong = words
        .iter()
        .zip(&expected)
        .position(|(a, e)| a != e)
        .map(|i| (i, words[i], expected[i]));
    assert_eq!(
        wrong,
        None,
        "first wrong word (index, value, one run's value); outcome {outcome:?}, the kernel ran {} \
         times",
        RUNS.load(Ordering::SeqCst)
    );
    match outcome {
        ReplayOutcome::RanOnce {
            why: RanOnceReason::Declined(d),
        } => {
            assert_eq!(d.reason, DeclineReason::UntrackedMemory, "{d:?}");
            assert!(
                d.detail.contains("hsa_amd_svm_attributes_set"),
                "{}",
                d.detail
            );
        }
        other => panic!("expected an untracked_memory decline, got {other:?}"),
    }
    assert_eq!(RUNS.load(Ordering::SeqCst), 1, "the dispatch ran once");
}

scenarios! {
    /// Default scope, a pointer to the start of the range.
    fn a_kernel_writing_svm_memory_is_declined_and_runs_once() {
        let app = setup(SnapshotScope::Agent);
        let words = page();
        make_accessible(&app, words);
        declined_once(&app, words, 256);
    }

    /// `referenced` scope, a pointer into the middle of the range.
    fn a_pointer_into_the_middle_of_svm_memory_is_declined_under_the_referenced_scope() {
        let app = setup(SnapshotScope::Referenced);
        let words = page();
        make_accessible(&app, words);
        declined_once(&app, &mut words[100..], 64);
    }
}
