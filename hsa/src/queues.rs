//! Application queues become intercept queues with kreplay's handler, and every queue kreplay
//! created is known per agent so a replay can drain its siblings (docs/abi.md §3 rule 5).

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::Arc;
use std::time::Instant;

use hsa_sys::*;
use kreplay_drain::QueueView;
use parking_lot::Mutex;

use crate::backend::{Backend, backend, guarded};

/// One application queue as kreplay sees it.
///
/// While a replay service is configured, every batch forwarded to the hardware queue is followed
/// by a barrier-AND marker packet (barrier bit set, no dependencies) whose completion signal is
/// `in_flight`: the signal counts forwarded batches that have not completed, so "this queue is
/// idle" is `in_flight == 0`, observable from any thread without touching the hardware queue.
pub(crate) struct QueueState {
    /// The queue the application sees (its `hsa_queue_t`).
    pub(crate) queue: *mut hsa_queue_t,
    /// The queue's id as the runtime reports it.
    pub(crate) id: u64,
    pub(crate) agent: hsa_agent_t,
    pub(crate) in_flight: hsa_signal_t,
}

// SAFETY: `queue` is only used as an identity and handed back to the runtime, whose queue API is
// thread safe; the signal is a runtime handle usable from any thread.
unsafe impl Send for QueueState {}
// SAFETY: see `Send`; no interior state is mutated through `&QueueState`.
unsafe impl Sync for QueueState {}

impl QueueState {
    /// A marker that completes when everything forwarded before it has completed.
    pub(crate) fn marker(&self) -> hsa_barrier_and_packet_t {
        hsa_barrier_and_packet_t {
            header: barrier_header(),
            completion_signal: self.in_flight,
            ..Default::default()
        }
    }
}

/// Header of a barrier-AND packet with the barrier bit and system-scope fences.
pub(crate) fn barrier_header() -> u16 {
    ((HSA_PACKET_TYPE_BARRIER_AND << HSA_PACKET_HEADER_TYPE)
        | (1 << HSA_PACKET_HEADER_BARRIER)
        | (HSA_FENCE_SCOPE_SYSTEM << HSA_PACKET_HEADER_SCACQUIRE_FENCE_SCOPE)
        | (HSA_FENCE_SCOPE_SYSTEM << HSA_PACKET_HEADER_SCRELEASE_FENCE_SCOPE)) as u16
}

/// [`QueueView`] over a queue's in-flight signal, waiting with a blocking signal wait.
pub(crate) struct QueueIdle<'a> {
    pub(crate) backend: &'a Backend,
    pub(crate) state: &'a QueueState,
}

impl QueueView for QueueIdle<'_> {
    fn id(&self) -> u64 {
        self.state.id
    }

    fn is_idle(&self) -> bool {
        self.backend.original.signal_load(self.state.in_flight) == 0
    }

    fn wait_idle(&self, deadline: Instant) -> bool {
        self.backend
            .wait_signal_zero(self.state.in_flight, deadline)
    }
}

/// Queues kreplay created, per agent.
#[derive(Default)]
pub(crate) struct QueueRegistry {
    by_agent: Mutex<HashMap<u64, Vec<Arc<QueueState>>>>,
}

impl QueueRegistry {
    /// Every queue on `agent` (the caller's own included).
    pub(crate) fn on_agent(&self, agent: u64) -> Vec<Arc<QueueState>> {
        self.by_agent
            .lock()
            .get(&agent)
            .cloned()
            .unwrap_or_default()
    }

    fn add(&self, state: Arc<QueueState>) {
        self.by_agent
            .lock()
            .entry(state.agent.handle)
            .or_default()
            .push(state);
    }

    fn remove(&self, queue: *mut hsa_queue_t) -> Option<Arc<QueueState>> {
        let mut map = self.by_agent.lock();
        for list in map.values_mut() {
            if let Some(i) = list.iter().position(|s| s.queue == queue) {
                return Some(list.swap_remove(i));
            }
        }
        None
    }
}

type QueueErrorCallback = Option<unsafe extern "C" fn(hsa_status_t, *mut hsa_queue_t, *mut c_void)>;

/// Wrapper of `hsa_queue_create`: the application gets an intercept queue whose packets reach
/// kreplay's handler before the hardware queue.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe extern "C" fn queue_create(
    agent: hsa_agent_t,
    size: u32,
    type_: hsa_queue_type32_t,
    callback: QueueErrorCallback,
    data: *mut c_void,
    private_segment_size: u32,
    group_segment_size: u32,
    queue: *mut *mut hsa_queue_t,
) -> hsa_status_t {
    guarded(|| {
        let b = backend();
        if b.is_finalized() {
            return b.original.queue_create(
                agent,
                size,
                type_,
                callback,
                data,
                private_segment_size,
                group_segment_size,
                queue,
            );
        }
        if queue.is_null() {
            return HSA_STATUS_ERROR_INVALID_ARGUMENT;
        }
        let in_flight = match b.original.signal_create(0) {
            Ok(s) => s,
            Err(status) => return status,
        };
        let status = b.original.intercept_create(
            agent,
            size,
            type_,
            callback,
            data,
            private_segment_size,
            group_segment_size,
            queue,
        );
        if status != HSA_STATUS_SUCCESS {
            b.original.signal_destroy(in_flight);
            return status;
        }
        // SAFETY: the runtime wrote a valid queue pointer through the caller's out pointer.
        let q = unsafe { *queue };
        // SAFETY: `q` is the live queue the runtime just created.
        let id = unsafe { (*q).id };
        let state = Arc::new(QueueState {
            queue: q,
            id,
            agent,
            in_flight,
        });
        // Per-pass timestamps for dispatch records; harmless for the application.
        b.original.set_profiler_enabled(q, true);
        let status = b.original.intercept_register(
            q,
            Some(crate::dispatch::intercept_handler),
            Arc::as_ptr(&state).cast_mut().cast(),
        );
        if status != HSA_STATUS_SUCCESS {
            b.original.queue_destroy(q);
            b.original.signal_destroy(in_flight);
            return status;
        }
        b.queues.add(state);
        HSA_STATUS_SUCCESS
    })
}

/// Wrapper of `hsa_queue_destroy`: forgets the queue, then destroys it and its signal.
pub(crate) unsafe extern "C" fn queue_destroy(queue: *mut hsa_queue_t) -> hsa_status_t {
    guarded(|| {
        let b = backend();
        let state = b.queues.remove(queue);
        let status = b.original.queue_destroy(queue);
        if let Some(state) = state {
            if status == HSA_STATUS_SUCCESS {
                // The queue is gone: no marker can still reference the signal. The handler's
                // pointer to `state` died with the queue; the registry's Arc was the owner.
                b.original.signal_destroy(state.in_flight);
            } else {
                b.queues.add(state);
            }
        }
        status
    })
}
