//! Soft queues (`hsa_soft_queue_create`): queues whose packets are processed by application code,
//! not by an agent, so they never reach kreplay's intercept handler and need no drain. Their
//! ring buffer is memory a kernel may write (a kernel enqueueing agent-dispatch packets for the
//! host), so it is tracked in the inventory from creation to `hsa_queue_destroy`, owned by the
//! agent of the region it was allocated from. A dispatch whose arguments hold a soft queue (a
//! kernel that may enqueue into it, once per pass) is declined (`crate::reach`).

use std::collections::HashMap;
use std::ffi::c_void;

use hsa_sys::*;
use kreplay_snapshot::{MemoryKind, NewAllocation};
use parking_lot::Mutex;

use crate::backend::{Backend, backend, guarded};
use crate::original::forward;

/// Ring buffers of live soft queues: queue address -> ring base.
#[derive(Default)]
pub(crate) struct SoftQueues {
    rings: Mutex<HashMap<usize, u64>>,
}

/// The bytes at a queue's address a kernel given it reaches: ROCm's `amd_queue_t`, which begins
/// with the `hsa_queue_t` and holds the write and read indices after it (256 bytes).
const QUEUE_BYTES: u64 = 256;

impl SoftQueues {
    /// The rings' lock, for the fork set (`crate::fork`).
    pub(crate) fn fork_lock(&self) -> crate::fork::Lock<'_> {
        &self.rings
    }

    /// The live soft queue whose `hsa_queue_t` (with the runtime's fields after it: its write
    /// index) `value` points into, if any. A kernel given it can enqueue packets for the host,
    /// which sees each one; no snapshot holds the write index or the doorbell.
    pub(crate) fn holding(&self, value: u64) -> Option<u64> {
        self.rings
            .lock()
            .keys()
            .map(|&q| q as u64)
            .find(|&q| value >= q && value - q < QUEUE_BYTES)
    }
}

/// The agent owning `region` and the kind of its memory.
fn region_owner(b: &Backend, region: hsa_region_t) -> Option<(u64, MemoryKind)> {
    unsafe extern "C" fn visit(region: hsa_region_t, data: *mut c_void) -> hsa_status_t {
        // SAFETY: `data` is the Vec passed below, alive for the walk.
        unsafe { (*data.cast::<Vec<u64>>()).push(region.handle) };
        HSA_STATUS_SUCCESS
    }
    let agent = b.original.agents().into_iter().find(|&agent| {
        let mut regions: Vec<u64> = Vec::new();
        let status = forward!(
            b,
            core.hsa_agent_iterate_regions_fn(agent, Some(visit), (&raw mut regions).cast())
        );
        status == HSA_STATUS_SUCCESS && regions.contains(&region.handle)
    })?;
    let mut flags: u32 = 0;
    // HSA_REGION_INFO_GLOBAL_FLAGS writes one u32.
    let status = forward!(
        b,
        core.hsa_region_get_info_fn(
            region,
            HSA_REGION_INFO_GLOBAL_FLAGS,
            (&raw mut flags).cast()
        )
    );
    if status != HSA_STATUS_SUCCESS {
        return None;
    }
    let kind = if b.original.agent_device_type(agent) == Some(HSA_DEVICE_TYPE_CPU) {
        MemoryKind::Host
    } else if flags & HSA_REGION_GLOBAL_FLAG_KERNARG != 0 {
        MemoryKind::Kernarg
    } else if flags & HSA_REGION_GLOBAL_FLAG_COARSE_GRAINED != 0 {
        MemoryKind::CoarseDevice
    } else {
        MemoryKind::FineDevice
    };
    Some((agent.handle, kind))
}

/// Wrapper of `hsa_soft_queue_create`.
pub(crate) unsafe extern "C" fn soft_queue_create(
    region: hsa_region_t,
    size: u32,
    type_: hsa_queue_type32_t,
    features: u32,
    doorbell_signal: hsa_signal_t,
    queue: *mut *mut hsa_queue_t,
) -> hsa_status_t {
    guarded(|| {
        let b = backend();
        let status = forward!(
            b,
            core.hsa_soft_queue_create_fn(region, size, type_, features, doorbell_signal, queue)
        );
        if status != HSA_STATUS_SUCCESS || queue.is_null() || b.is_finalized() {
            return status;
        }
        // SAFETY: the runtime wrote a live queue through the caller's valid out pointer.
        let q = unsafe { *queue };
        if q.is_null() {
            return status;
        }
        // SAFETY: a live queue the runtime just created.
        let (base, slots) = unsafe { ((*q).base_address as u64, u64::from((*q).size)) };
        match region_owner(b, region) {
            Some((owner, kind)) if base != 0 => {
                b.inventory.on_alloc(NewAllocation {
                    base,
                    size: slots * AQL_PACKET_SIZE as u64,
                    owner_agent: owner,
                    kind,
                });
                b.soft_queues.rings.lock().insert(q as usize, base);
            }
            _ => b.hooks.warn(&format!(
                "the ring buffer of soft queue {q:p} has no known region; it is not tracked"
            )),
        }
        status
    })
}

/// Wrapper of `hsa_queue_destroy`: forgets a soft queue's ring buffer, then destroys the queue
/// as every other queue is ([`crate::queues::queue_destroy`]).
///
/// Where the runtime refuses the destroy, the queue and its ring live on: the ring is tracked
/// again, and a kernel given the queue is still known to reach it (`crate::reach`), rather
/// than replayed, enqueueing once per pass.
pub(crate) unsafe extern "C" fn queue_destroy(queue: *mut hsa_queue_t) -> hsa_status_t {
    guarded(|| {
        let b = backend();
        let ring = b.soft_queues.rings.lock().remove(&(queue as usize));
        let forgotten = match ring {
            // Before the runtime frees it: waits for a restore in progress.
            Some(base) if !b.is_finalized() => b.inventory.on_free(base),
            _ => None,
        };
        // SAFETY: forwarded from the application's call.
        let status = unsafe { crate::queues::queue_destroy(queue) };
        if status != HSA_STATUS_SUCCESS
            && let Some(base) = ring
        {
            if let Some(allocation) = forgotten {
                b.inventory.reinstate(allocation);
            }
            b.soft_queues.rings.lock().insert(queue as usize, base);
        }
        status
    })
}
