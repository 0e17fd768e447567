//! Device writes (and reads) by the application's copies and memsets, fenced against replay
//! windows, as on HSA.
//!
//! A `cuMemcpy*` / `cuMemset*` call takes the reader side of its device's lock at API ENTER and
//! gives it back at API EXIT ([`enter`], [`exit`]). So:
//!
//! * a copy whose call begins while a replay window holds the device (writer side, from the
//!   launch's API ENTER to its API EXIT) waits until the window closes: it never lands between
//!   a snapshot and a restore, and never reads a pass's intermediate bytes;
//! * a replay window waits for the calls in progress; an asynchronous copy they enqueued is
//!   then waited for by the window's drain (`cuCtxSynchronize`) before the snapshot.
//!
//! The readers a thread holds are kept on a thread-local stack (ENTER and EXIT of one call
//! come on the same thread, and kreplay's own calls never get here: the re-entry guard).

use std::cell::RefCell;

use kreplay_locks::{AgentLocks, OwnedReadAccess};

use crate::cupti::{CallbackId, cbid};

/// What a fenced driver call does to device memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeviceWrite {
    /// A copy (`cuMemcpy*`): writes its destination, reads its source.
    Copy,
    /// A memset (`cuMemset*`).
    Set,
}

/// Whether driver-API callback `id` is a copy or a memset kreplay fences.
pub fn device_write(id: CallbackId) -> Option<DeviceWrite> {
    if cbid::MEMCPY.contains(&id) {
        Some(DeviceWrite::Copy)
    } else if cbid::MEMSET.contains(&id) {
        Some(DeviceWrite::Set)
    } else {
        None
    }
}

thread_local! {
    static HELD: RefCell<Vec<OwnedReadAccess>> = const { RefCell::new(Vec::new()) };
}

/// API ENTER of a copy or memset on `device`: waits while a replay window holds the device,
/// then holds the reader side until [`exit`]. `device` is `None` when the call's device is not
/// known (nothing is held, but [`exit`] stays balanced).
pub fn enter(locks: &AgentLocks, device: Option<u64>) {
    let access = device
        .and_then(|d| locks.read_owned(d).ok())
        .unwrap_or(OwnedReadAccess::NotNeeded);
    HELD.with(|h| h.borrow_mut().push(access));
}

/// API EXIT of the call [`enter`] fenced: its reader side is given back.
pub fn exit() {
    let access = HELD.with(|h| h.borrow_mut().pop());
    drop(access);
}

/// How many fenced calls the calling thread is inside (0 outside any).
pub fn depth() -> usize {
    HELD.with(|h| h.borrow().len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copies_and_memsets_are_classified_and_launches_are_not() {
        for id in cbid::MEMCPY {
            assert_eq!(device_write(id), Some(DeviceWrite::Copy), "{id}");
        }
        for id in cbid::MEMSET {
            assert_eq!(device_write(id), Some(DeviceWrite::Set), "{id}");
        }
        for id in [
            cbid::CU_LAUNCH_KERNEL,
            cbid::CU_MEM_ALLOC_V2,
            cbid::CU_MEM_MAP,
        ] {
            assert_eq!(device_write(id), None, "{id}");
        }
        // The ones the runtime API uses most: cudaMemcpy(Async) and cudaMemset(Async).
        for id in [305, 306, 418, 408, 249, 251, 216, 220, 428, 430] {
            assert!(device_write(id).is_some(), "{id}");
        }
    }

    #[test]
    fn batched_copies_are_fenced_like_every_other_copy() {
        // cuMemcpyBatchAsync, cuMemcpy3DBatchAsync and their _ptsz variants (CUDA 12.8+), and
        // the _v2 entry points the CUDA 13 headers map those names to (ids from CUDA 13.0's
        // cupti_driver_cbid.h): an application built against CUDA 13 only ever calls the _v2.
        for id in [776, 777, 778, 779, 796, 797, 798, 799] {
            assert_eq!(device_write(id), Some(DeviceWrite::Copy), "{id}");
            assert!(cbid::all().contains(&id), "callback {id} is enabled");
        }
    }

    #[test]
    fn enter_and_exit_nest_per_thread() {
        let locks = AgentLocks::new();
        locks.set_enabled(true);
        enter(&locks, Some(0));
        enter(&locks, None);
        assert_eq!(depth(), 2);
        assert!(locks.agent_lock(0).is_locked(), "reader held");
        exit();
        exit();
        assert_eq!(depth(), 0);
        assert!(!locks.agent_lock(0).is_locked());
    }
}
