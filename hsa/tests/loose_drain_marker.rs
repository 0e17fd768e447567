//! A drain asks another queue of the agent for a marker by writing a wake-up packet into its
//! ring as one more producer, within the drain's deadline. Another producer may take the last
//! free slot between kreplay's check for room and its reservation: kreplay must then give up at
//! its deadline, not wait for a slot that may never come.

// Each test file uses part of the shared harness.
#[allow(dead_code)]
#[macro_use]
mod support;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use hsa_sys::*;
use kreplay_drain::DrainConfig;
use kreplay_hsa::InstallOptions;
use kreplay_passloop::ToolAnswer;
use kreplay_softhsa::{OwnedApiTable, TableLayout, WorkGroup};
use support::app::{self, Aql};
use support::tool::{Script, TestHooks};

/// The drain's deadline.
const DRAIN: Duration = Duration::from_millis(300);
/// How long the replayed dispatch may take to complete (a drain that gives up at its deadline
/// takes about [`DRAIN`]).
const COMPLETES_WITHIN: Duration = Duration::from_secs(20);

/// The queue whose slots another producer takes, as an address (0: none yet).
static OTHER_QUEUE: AtomicU64 = AtomicU64::new(0);
/// Set when the next read of that queue's read index must come with its last slots taken.
static ARMED: AtomicBool = AtomicBool::new(false);

fn nothing(_: &WorkGroup) {}

/// softhsa's `hsa_queue_load_read_index_scacquire`; while armed, for [`OTHER_QUEUE`], another
/// producer first reserves every free slot of the ring (and never publishes them), as a
/// thread racing kreplay for the last slot would.
unsafe extern "C" fn load_read_index_racing(queue: *const hsa_queue_t) -> u64 {
    // SAFETY: softhsa's own table is valid for the process.
    let core = unsafe { &*kreplay_softhsa::api_table().core_ };
    let load = core
        .hsa_queue_load_read_index_scacquire_fn
        .expect("load read index");
    // SAFETY: the caller's queue, forwarded unchanged.
    let read = unsafe { load(queue) };
    if queue as u64 == OTHER_QUEUE.load(Ordering::SeqCst) && ARMED.swap(false, Ordering::SeqCst) {
        let add = core
            .hsa_queue_add_write_index_scacq_screl_fn
            .expect("add write index");
        // SAFETY: a live queue of softhsa's; its size and indices are read as any producer does.
        unsafe {
            let size = u64::from((*queue).size);
            let write = add(queue, 0);
            add(queue, (read + size).saturating_sub(write));
        }
    }
    read
}

scenarios! {
    /// A dispatch replayed on one queue while another queue of the agent forwarded work since
    /// its last marker; the other queue's last free slots go to another producer while kreplay
    /// reserves one for its wake-up packet. The dispatch completes (declined for the drain's
    /// timeout, or replayed) rather than hang in the drain.
    fn a_drain_marker_request_that_loses_the_last_slot_gives_up_at_its_deadline() {
        let layout = TableLayout::from_env().expect("a known table layout");
        let table: &'static mut OwnedApiTable = Box::leak(Box::new(OwnedApiTable::softhsa_with(layout)));
        // SAFETY: the copy's core table is valid, and only this scenario uses it so far.
        unsafe {
            (*(*table.as_mut_ptr()).core_).hsa_queue_load_read_index_scacquire_fn =
                Some(load_read_index_racing);
        }
        let hooks = TestHooks::new(0);
        let app = app::install_into(table, hooks.clone(), InstallOptions { drain: DrainConfig::new(DRAIN), ..Default::default() });
        hooks.configure_replay(true);
        hooks.set_script(Script::new(|_, info| {
            if info.workgroup_size[0] == 64 {
                ARMED.store(true, Ordering::SeqCst);
                ToolAnswer::passes(2)
            } else {
                ToolAnswer::OPT_OUT
            }
        }));
        let gpu = app.gpus[0];
        let pools = app.pools(gpu);
        let kernel = kreplay_softhsa::register_kernel("loose_nothing", nothing);
        let args = app.kernargs(&pools, 0u64);
        let other = app.queue(gpu);
        OTHER_QUEUE.store(other.0 as u64, Ordering::SeqCst);
        let first = app.signal(1);
        app.dispatch(other, Aql::dispatch(kernel, 1, 32, args, first));
        assert_eq!(app.wait_zero(first), 0, "the other queue's dispatch completed");

        let q = app.queue(gpu);
        let done = app.signal(1);
        let submitting = std::thread::spawn(move || {
            app.dispatch(q, Aql::dispatch(kernel, 1, 64, args, done));
        });
        assert_eq!(
            app.wait_zero_within(done, COMPLETES_WITHIN),
            0,
            "the replayed dispatch completed"
        );
        assert!(!ARMED.load(Ordering::SeqCst), "the drain asked the other queue for a marker");
        submitting.join().expect("the submitting thread ends");
    }
}
