//! A kernel given a soft queue (`hsa_soft_queue_create`: a queue whose packets application code
//! processes) enqueues into it: it reserves a slot by bumping the queue's write index, writes a
//! packet into the ring buffer and rings the doorbell. The write index and the doorbell are the
//! runtime's, not memory any snapshot holds, and the host sees each enqueue: replayed, the
//! kernel would enqueue once per pass (the write index ending at +N). Such a dispatch must run
//! once, declined with a reason.

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
use support::app::{self, Aql, WAIT};
use support::tool::{Script, TestHooks};

static RUNS: AtomicU32 = AtomicU32::new(0);

#[repr(C)]
#[derive(Clone, Copy)]
struct EnqueueArgs {
    queue: u64,
}

/// One work-item enqueues one packet (its header only) into the soft queue and rings its
/// doorbell, as a kernel enqueueing agent-dispatch packets for the host does.
fn enqueue(group: &WorkGroup) {
    // SAFETY: every dispatch of this kernel carries an `EnqueueArgs` block.
    let args: EnqueueArgs = unsafe { group.kernargs() };
    RUNS.fetch_add(1, Ordering::SeqCst);
    let q = args.queue as *mut hsa_queue_t;
    // SAFETY: softhsa's own core table is valid for the process.
    let core = unsafe { &*kreplay_softhsa::api_table().core_ };
    let add = core
        .hsa_queue_add_write_index_screlease_fn
        .expect("add write index");
    let store = core.hsa_signal_store_screlease_fn.expect("signal store");
    // SAFETY: the argument is a live soft queue; its ring holds `size` packets.
    unsafe {
        let slot = add(q, 1);
        let ring = (*q).base_address.cast::<u8>();
        let at = (slot % u64::from((*q).size)) as usize * AQL_PACKET_SIZE;
        ring.add(at)
            .cast::<u16>()
            .write(HSA_PACKET_TYPE_AGENT_DISPATCH as u16);
        store((*q).doorbell_signal, slot as i64);
    }
}

fn enqueued_once(scope: SnapshotScope) {
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
    let create = app
        .core()
        .hsa_soft_queue_create_fn
        .expect("soft queue create");
    let load_write = app
        .core()
        .hsa_queue_load_write_index_scacquire_fn
        .expect("load write index");
    let doorbell = app.signal(-1);
    // softhsa's regions are its pools.
    let region = hsa_region_t {
        handle: app.host_pool().handle,
    };
    let mut queue: *mut hsa_queue_t = std::ptr::null_mut();
    // SAFETY: a valid region and doorbell signal; `queue` is a valid out pointer.
    let status = unsafe { create(region, 64, HSA_QUEUE_TYPE_MULTI, 0, doorbell, &mut queue) };
    assert_eq!(status, HSA_STATUS_SUCCESS);
    let pools = app.pools(app.gpus[0]);
    let kernel = kreplay_softhsa::register_kernel("reach_soft_queue_enqueue", enqueue);
    let args = app.kernargs(
        &pools,
        EnqueueArgs {
            queue: queue as u64,
        },
    );
    let q = app.queue(app.gpus[0]);
    let done = app.signal(1);
    app.dispatch(q, Aql::dispatch(kernel, 1, 1, args, done));
    assert_eq!(app.wait_zero(done), 0);
    let id = hooks
        .configured_dispatches()
        .last()
        .expect("a dispatch")
        .dispatch_id;
    let outcome = hooks.finished_record(id).outcome;
    // SAFETY: the soft queue is live.
    let write_index = unsafe { load_write(queue) };
    assert_eq!(
        (write_index, RUNS.load(Ordering::SeqCst)),
        (1, 1),
        "one packet enqueued by one run; outcome {outcome:?}"
    );
    match outcome {
        ReplayOutcome::RanOnce {
            why: RanOnceReason::Declined(d),
        } => {
            assert_eq!(d.reason, DeclineReason::UntrackedMemory, "{d:?}");
            assert!(d.detail.contains("soft queue"), "{}", d.detail);
        }
        other => panic!("expected an untracked_memory decline, got {other:?}"),
    }
}

scenarios! {
    fn a_kernel_enqueueing_into_a_soft_queue_is_declined_and_enqueues_once() {
        enqueued_once(SnapshotScope::Agent);
    }

    fn a_kernel_enqueueing_into_a_soft_queue_is_declined_under_the_referenced_scope() {
        enqueued_once(SnapshotScope::Referenced);
    }
}
