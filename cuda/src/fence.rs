//! Device writes (and reads) by the application outside the launches kreplay replays: copies,
//! memsets, stream memory operations and graph launches, fenced against replay windows, as on
//! HSA.
//!
//! Such a call takes the reader side of its device's lock at API ENTER and gives it back at API
//! EXIT ([`enter`], [`exit`]), as an ordinary (run once) `cuLaunchKernel` does in the window
//! code. So:
//!
//! * a call that begins while a replay window holds the device (writer side, from the launch's
//!   API ENTER to its API EXIT), on any thread, waits until the window closes: what it writes
//!   never lands between a snapshot and a restore (where a restore would undo it), and it never
//!   reads a pass's intermediate bytes;
//! * a replay window waits for the calls in progress; the asynchronous work they enqueued is
//!   then waited for by the window's drain (`cuCtxSynchronize`) before the snapshot.
//!
//! The readers a thread holds are kept on a thread-local stack (ENTER and EXIT of one call
//! come on the same thread, and kreplay's own calls never get here: the re-entry guard).

use kreplay_late::Late;
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
    /// A stream memory operation (`cuStreamWriteValue*`, `cuStreamBatchMemOp*`): writes words
    /// when its stream reaches it.
    StreamWrite,
    /// A graph launch: its kernels, copies and memsets run once, not replayed.
    Graph,
    /// A kernel launch kreplay does not replay (`cbid::UNREPLAYED_LAUNCHES`): it runs once.
    Launch,
    /// Work queued on a stream that waits (`cbid::STREAM_WAITS`: `cuStreamWaitValue*`,
    /// `cuStreamWaitEvent`, a host function or stream callback): it writes nothing, but queued
    /// on a replayed launch's stream inside its window it stands between the application's
    /// launch and the re-launches, and what it waits for may be a fenced call that waits for
    /// the window (a `cuStreamWriteValue32` on another thread): the passes would never end.
    Wait,
}

/// Where a copy or memset writes, as far as its first parameter tells.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Destination {
    /// Host memory (`cuMemcpyDtoH*`): no device memory is written.
    Host,
    /// Device memory at this address (a 1D memset, `cuMemcpyHtoD*` / `DtoD*`) or, for
    /// `cuMemcpy` / `cuMemcpyAsync`, an address of either kind.
    Address,
    /// Anything else (2D and 3D copies, peer and batched copies, arrays, stream writes,
    /// launches): not described.
    Unknown,
}

/// Where driver-API call `id` writes: for [`Destination::Address`] the destination is the
/// first parameter of the call, a `CUdeviceptr` (ids from CUDA 13.0's `cupti_driver_cbid.h`).
pub fn destination(id: CallbackId) -> Destination {
    match id {
        // cuMemcpyDtoH{,Async}_v2, their _ptds and _ptsz forms
        278 | 279 | 398 | 422 => Destination::Host,
        // cuMemsetD{8,16,32}{_v2,Async} and their _v2_ptds / Async_ptsz forms
        249..=251 | 216 | 218 | 220 | 411..=413 | 428..=430
        // cuMemcpyHtoD{,Async}_v2, cuMemcpyDtoD{,Async}_v2, cuMemcpy, cuMemcpyAsync, and
        // their _ptds / _ptsz forms
        | 276 | 277 | 280 | 281 | 305 | 306 | 397 | 399 | 408 | 418 | 421 | 423 => {
            Destination::Address
        }
        _ => Destination::Unknown,
    }
}

/// Bytes per element of a [`Destination::Address`] call's count: 1 for copies (a byte count)
/// and `cuMemsetD8*`, 2 for `cuMemsetD16*`, 4 for `cuMemsetD32*`.
fn element_bytes(id: CallbackId) -> u64 {
    match id {
        250 | 218 | 412 | 429 => 2,
        251 | 220 | 413 | 430 => 4,
        _ => 1,
    }
}

/// The device range a [`Destination::Address`] call writes, every byte of it: its destination
/// and its count times the element size. Every such call's parameter struct starts with the
/// destination (a `CUdeviceptr`) and has its count (`N` or `ByteCount`, a `size_t`) at byte 16,
/// after the value or the source (`cuMemsetD32_v2_params`, `cuMemcpyHtoD_v2_params`,
/// `cuMemcpyAsync_params` and their kin in CUDA's `generated_cuda_meta.h`). `None` for any
/// other call.
///
/// # Safety
/// `params` is null or the parameter struct of driver-API callback `id`.
pub unsafe fn written_range(id: CallbackId, params: *const std::ffi::c_void) -> Option<(u64, u64)> {
    if destination(id) != Destination::Address || params.is_null() {
        return None;
    }
    // SAFETY: per the layout above, for a parameter struct of call `id`.
    let (dst, count) = unsafe {
        (
            *(params as *const u64),
            *((params as *const u8).add(16) as *const usize),
        )
    };
    Some((dst, (count as u64).saturating_mul(element_bytes(id))))
}

/// The destination of a memset of any shape (`cuMemsetD2D32_v2` and its kin included): every
/// memset's parameter struct starts with it, a `CUdeviceptr`, and a memset writes inside the
/// one allocation holding it. `None` for any other call.
///
/// # Safety
/// `params` is null or the parameter struct of driver-API callback `id`.
pub unsafe fn memset_destination(id: CallbackId, params: *const std::ffi::c_void) -> Option<u64> {
    if !cbid::MEMSET.contains(&id) || params.is_null() {
        return None;
    }
    // SAFETY: a memset's parameter struct starts with its destination.
    Some(unsafe { *(params as *const u64) })
}

/// What device memory a call writes, as far as its parameters tell.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Writes {
    /// No device memory (a copy to the host).
    Nothing,
    /// Every byte of `len` bytes at `addr` ([`written_range`]).
    Range {
        /// First byte.
        addr: u64,
        /// Bytes.
        len: u64,
    },
    /// Some bytes of the allocation holding this address (a 2D memset,
    /// [`memset_destination`]).
    Within(u64),
    /// Not described: a launch, a 2D, 3D, peer, batched or array copy, a stream write.
    Unknown,
}

/// What call `id` writes (see [`Writes`]).
///
/// # Safety
/// `params` is null or the parameter struct of driver-API callback `id`.
pub unsafe fn writes(id: CallbackId, params: *const std::ffi::c_void) -> Writes {
    // SAFETY: forwarded.
    let (range, set_at) = unsafe { (written_range(id, params), memset_destination(id, params)) };
    match (range, set_at) {
        (Some((addr, len)), _) => Writes::Range { addr, len },
        _ if destination(id) == Destination::Host => Writes::Nothing,
        (None, Some(dst)) => Writes::Within(dst),
        (None, None) => Writes::Unknown,
    }
}

/// The two addresses a described call's parameters start with (destination and source of a 1D
/// copy; a memset's destination and its value, a number), whose owners the call's fence waits
/// for too ([`devices_to_fence`]); `None` for a call [`destination`] does not describe.
///
/// # Safety
/// `params` is null or the parameter struct of driver-API callback `id`.
pub unsafe fn leading_addresses(
    id: CallbackId,
    params: *const std::ffi::c_void,
) -> Option<[u64; 2]> {
    if destination(id) == Destination::Unknown || params.is_null() {
        return None;
    }
    let p = params as *const u64;
    // SAFETY: every described call's parameter struct starts with two 8-byte fields.
    Some(unsafe { [*p, *p.add(1)] })
}

/// Whether driver-API callback `id` is a call kreplay fences, and what kind.
pub fn device_write(id: CallbackId) -> Option<DeviceWrite> {
    if cbid::MEMCPY.contains(&id) {
        Some(DeviceWrite::Copy)
    } else if cbid::MEMSET.contains(&id) {
        Some(DeviceWrite::Set)
    } else if cbid::STREAM_WRITES.contains(&id) {
        Some(DeviceWrite::StreamWrite)
    } else if matches!(id, cbid::CU_GRAPH_LAUNCH | cbid::CU_GRAPH_LAUNCH_PTSZ) {
        Some(DeviceWrite::Graph)
    } else if cbid::UNREPLAYED_LAUNCHES.contains(&id) {
        Some(DeviceWrite::Launch)
    } else if cbid::STREAM_WAITS.contains(&id) {
        Some(DeviceWrite::Wait)
    } else {
        None
    }
}

/// Whether driver-API callback `id` may link devices into one replay group
/// (`kreplay_locks::AgentGroups`): peer access (`cbid::PEER_ACCESS`), memory another device
/// holds opened here (`cbid::SHARED`'s opening calls), an allocation node whose access list
/// names other devices. Such a call is fenced from its API ENTER until the link is recorded at
/// its API EXIT, on every device that may have windows: a link made inside a window that holds
/// only one of the devices would let the other's ordinary launches, which may now write the
/// replayed device's memory, run between its snapshot and its restores.
pub fn links_devices(id: CallbackId) -> bool {
    cbid::PEER_ACCESS.contains(&id)
        || matches!(
            id,
            cbid::CU_IPC_OPEN_MEM_HANDLE
                | cbid::CU_IPC_OPEN_MEM_HANDLE_V2
                | cbid::CU_MEM_POOL_IMPORT_POINTER
                | cbid::CU_EXTERNAL_MEMORY_GET_MAPPED_BUFFER
                | cbid::CU_GRAPHICS_RESOURCE_GET_MAPPED_POINTER_V2
                | cbid::CU_GRAPH_ADD_MEM_ALLOC_NODE
                | cbid::CU_GRAPH_ADD_NODE
                | cbid::CU_GRAPH_ADD_NODE_V2
        )
}

/// The devices whose replay windows a fenced call must wait for, sorted, each once: the device
/// of its context (`current`), the devices owning the tracked memory its first two parameters
/// point into (`owners`: the destination and source of a 1D copy, which may be another device's
/// memory, reached through unified addressing or peer access; a memset's destination), and,
/// for a call whose memory the parameters do not describe (`described` false: 2D, 3D, peer,
/// batched and array copies, stream writes, graph launches), every device that
/// may have windows (`all`). A copy that reads another device's memory waits too: it must not
/// read a pass's bytes. So does a call whose context's device cannot be told (`current`
/// `None`): memory the inventory does not hold but a snapshot does (a module's variables) may
/// be any device's, so it waits for every device in `all`.
pub fn devices_to_fence(
    current: Option<u64>,
    owners: &[Option<u64>],
    described: bool,
    all: &[u64],
) -> Vec<u64> {
    let mut devices: Vec<u64> = current
        .into_iter()
        .chain(owners.iter().flatten().copied())
        .collect();
    if !described || current.is_none() {
        devices.extend_from_slice(all);
    }
    devices.sort_unstable();
    devices.dedup();
    devices
}

thread_local! {
    static HELD: RefCell<Vec<Vec<OwnedReadAccess>>> = const { RefCell::new(Vec::new()) };
    /// [`HELD`] once it is destroyed: calls made from a thread-local destructor at thread exit
    /// (see `kreplay_late`).
    static HELD_LATE: Late<Vec<Vec<OwnedReadAccess>>> = const { Late::new() };
}

/// Runs `f` on the reader sides this thread's fenced calls hold (see `kreplay_late`).
fn with_held<R>(f: impl FnOnce(&RefCell<Vec<Vec<OwnedReadAccess>>>) -> R) -> R {
    kreplay_late::with(&HELD, &HELD_LATE, f)
}

/// API ENTER of a fenced call that may touch the memory of `devices` (see
/// [`devices_to_fence`]): waits while a replay window holds any of them, then holds their
/// reader sides until [`exit`]. They are taken in ascending order; a window holds the writer
/// side of its own device only, so readers waiting in order never close a cycle. An empty list
/// (the call's device is not known) holds nothing, but [`exit`] stays balanced.
pub fn enter(locks: &AgentLocks, devices: &[u64]) {
    debug_assert!(devices.windows(2).all(|w| w[0] < w[1]), "sorted, each once");
    let held = devices
        .iter()
        .filter_map(|&d| locks.read_owned(d).ok())
        .collect();
    with_held(|h| h.borrow_mut().push(held));
}

/// The reader sides a launch that gets no replay window of its device holds from its API ENTER
/// to its EXIT, so that it is not submitted inside another thread's window (whose restores
/// would undo what it writes): its device's, or, where its device could not be told
/// (`device` is `None`), those of every device in `known` (it may run on any of them), taken
/// in ascending order as [`enter`] takes them. A side this thread's own window holds is skipped
/// (a launch from inside a replay callback, which must not wait for itself).
pub fn launch_readers(
    locks: &AgentLocks,
    device: Option<u64>,
    known: &[u64],
) -> Vec<OwnedReadAccess> {
    let mut devices = match device {
        Some(d) => vec![d],
        None => known.to_vec(),
    };
    devices.sort_unstable();
    devices.dedup();
    devices
        .iter()
        .filter_map(|&d| locks.read_owned(d).ok())
        .collect()
}

/// API EXIT of the call [`enter`] fenced: its reader side is given back.
pub fn exit() {
    let access = with_held(|h| h.borrow_mut().pop());
    drop(access);
}

/// Calls [`exit`] when dropped: the API EXIT of a fenced call whose handling may return early.
#[derive(Debug)]
pub struct ExitOnDrop;

impl Drop for ExitOnDrop {
    fn drop(&mut self) {
        exit();
    }
}

/// How many fenced calls the calling thread is inside (0 outside any).
pub fn depth() -> usize {
    with_held(|h| h.borrow().len())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A launch whose device could not be told ran with no reader side at all: a replay
    /// window open on any device could snapshot, let it write, and restore over its writes.
    /// It now holds every known device's reader side (a window waits for it, and it for a
    /// window), each once; a launch of a known device holds its own only.
    #[test]
    fn a_launch_of_unknown_device_holds_every_known_devices_reader_side() {
        let locks = AgentLocks::new();
        locks.set_enabled(true);
        let held = launch_readers(&locks, None, &[2, 0, 2, 1]);
        assert_eq!(held.len(), 3);
        for d in 0..3 {
            assert!(locks.agent_lock(d).is_locked(), "device {d}");
        }
        let window = std::thread::scope(|s| {
            s.spawn(|| {
                locks
                    .try_write_for(1, std::time::Duration::from_millis(50))
                    .is_ok()
            })
            .join()
            .unwrap()
        });
        assert!(!window, "a window on device 1 opened during the launch");
        drop(held);
        assert!(!locks.agent_lock(1).is_locked());
        let own = launch_readers(&locks, Some(1), &[0, 1, 2]);
        assert_eq!(own.len(), 1);
        assert!(locks.agent_lock(1).is_locked() && !locks.agent_lock(0).is_locked());
    }

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
    fn every_call_that_changes_device_memory_outside_a_replayed_launch_is_fenced() {
        // Ids from CUDA 13.0's cupti_driver_cbid.h. Unfenced, such a call made on another thread
        // while a replay window is open lands between the snapshot and a restore, and the
        // restore undoes it (or a later pass reads it).
        let calls: [(&str, CallbackId); 26] = [
            ("cuMemcpyAtoD_v2", 284),
            ("cuMemcpyDtoA_v2", 285),
            ("cuMemcpyAtoA_v2", 286),
            ("cuMemcpyAtoH_v2", 282),
            ("cuMemcpyHtoA_v2", 292),
            ("cuMemcpyHtoAAsync_v2", 293),
            ("cuMemcpyDtoA_v2_ptds", 400),
            ("cuMemcpyAtoD_v2_ptds", 401),
            ("cuMemcpyHtoA_v2_ptds", 402),
            ("cuMemcpyHtoAAsync_v2_ptsz", 419),
            ("cuStreamWriteValue32", 460),
            ("cuStreamWriteValue32_ptsz", 461),
            ("cuStreamBatchMemOp", 462),
            ("cuStreamBatchMemOp_ptsz", 463),
            ("cuStreamWriteValue64", 475),
            ("cuStreamWriteValue64_ptsz", 476),
            ("cuStreamWriteValue32_v2", 663),
            ("cuStreamWriteValue32_v2_ptsz", 664),
            ("cuStreamWriteValue64_v2", 665),
            ("cuStreamWriteValue64_v2_ptsz", 666),
            ("cuStreamBatchMemOp_v2", 667),
            ("cuStreamBatchMemOp_v2_ptsz", 668),
            ("cuGraphLaunch", 514),
            ("cuGraphLaunch_ptsz", 515),
            ("cuMemcpyAsync", 306),
            ("cuMemsetD32Async", 220),
        ];
        for (name, id) in calls {
            assert!(device_write(id).is_some(), "{name} ({id}) is not fenced");
        }
        // Waits write nothing, but are fenced as waits (see `DeviceWrite::Wait`); the launches
        // kreplay replays take their lock in the window.
        for id in [458, 459, 473, 474, 659, 660, 661, 662] {
            assert_eq!(device_write(id), Some(DeviceWrite::Wait), "{id}");
        }
        for id in cbid::LAUNCHES {
            assert_eq!(device_write(id), None, "{id}");
        }
    }

    #[test]
    fn every_call_that_may_link_devices_is_fenced_as_a_link() {
        // Ids from CUDA 13.0's cupti_driver_cbid.h: peer access, memory another device holds
        // opened here, allocation nodes with an access list.
        let calls: [(&str, CallbackId); 11] = [
            ("cuCtxEnablePeerAccess", 313),
            ("cuMemSetAccess", 553),
            ("cuMemPoolSetAccess", 605),
            ("cuIpcOpenMemHandle", 329),
            ("cuIpcOpenMemHandle_v2", 567),
            ("cuMemPoolImportPointer", 616),
            ("cuExternalMemoryGetMappedBuffer", 486),
            ("cuGraphicsResourceGetMappedPointer_v2", 258),
            ("cuGraphAddMemAllocNode", 638),
            ("cuGraphAddNode", 712),
            ("cuGraphAddNode_v2", 723),
        ];
        for (name, id) in calls {
            assert!(links_devices(id), "{name} ({id})");
            assert!(cbid::all().contains(&id), "{name} ({id}) is not enabled");
            assert_eq!(device_write(id), None, "{name} ({id})");
        }
        for id in [cbid::CU_LAUNCH_KERNEL, cbid::CU_MEM_ALLOC_V2, 305, 458] {
            assert!(!links_devices(id), "{id}");
        }
    }

    #[test]
    fn copies_to_the_host_write_no_device_memory_and_simple_ones_name_their_destination() {
        for id in [278, 279, 398, 422] {
            assert_eq!(destination(id), Destination::Host, "{id}");
        }
        // Every id described is a fenced copy or memset.
        for id in 0..1000 {
            if destination(id) != Destination::Unknown {
                assert!(
                    matches!(device_write(id), Some(DeviceWrite::Copy | DeviceWrite::Set)),
                    "{id}"
                );
            }
        }
        // cuMemsetD32_v2, cuMemcpyHtoD_v2, cuMemcpyAsync; 2D copies and launches are not described.
        assert_eq!(destination(251), Destination::Address);
        assert_eq!(destination(276), Destination::Address);
        assert_eq!(destination(306), Destination::Address);
        assert_eq!(destination(287), Destination::Unknown);
        assert_eq!(destination(cbid::CU_LAUNCH_KERNEL), Destination::Unknown);
    }

    /// A memset's range is its count of elements of its width; a copy's its byte count.
    #[test]
    fn a_simple_copy_or_memset_names_every_byte_it_writes() {
        // cuMemsetD32Async_params: dstDevice, ui (padded), N, hStream.
        #[repr(C)]
        struct Set32 {
            dst: u64,
            value: u32,
            n: usize,
            stream: usize,
        }
        let set = Set32 {
            dst: 0x7000_0000,
            value: 7,
            n: 100,
            stream: 0,
        };
        let p = &set as *const Set32 as *const std::ffi::c_void;
        for (id, bytes) in [(220, 400), (251, 400), (430, 400), (250, 200), (249, 100)] {
            // SAFETY: every memset's struct has this prefix (the width of `value` aside).
            let range = unsafe { written_range(id, p) };
            assert_eq!(range, Some((0x7000_0000, bytes)), "{id}");
        }
        // cuMemcpyHtoD_v2_params: dstDevice, srcHost, ByteCount.
        let copy: [u64; 3] = [0x7100_0000, 0x1234, 4096];
        let p = copy.as_ptr() as *const std::ffi::c_void;
        for id in [276, 277, 280, 305, 306, 418] {
            // SAFETY: a copy's struct: destination, source, byte count.
            let range = unsafe { written_range(id, p) };
            assert_eq!(range, Some((0x7100_0000, 4096)), "{id}");
        }
        let _ = (set.value, set.stream);
        // SAFETY: not a simple copy or memset, and a null struct: never read.
        assert_eq!(unsafe { written_range(278, p) }, None, "to the host");
        // SAFETY: as above.
        assert_eq!(unsafe { written_range(254, p) }, None, "2D memset");
        // SAFETY: a null struct is never read.
        assert_eq!(unsafe { written_range(251, std::ptr::null()) }, None);
        // cuMemsetD2D32_v2_params: dstDevice, dstPitch, ui, Width, Height.
        let set_2d: [u64; 5] = [0x7200_0000, 4096, 7, 1024, 8];
        let p = set_2d.as_ptr() as *const std::ffi::c_void;
        for id in [252, 254, 226, 416, 433, 251] {
            // SAFETY: every memset's struct starts with its destination.
            let dst = unsafe { memset_destination(id, p) };
            assert_eq!(dst, Some(0x7200_0000), "{id}");
        }
        // SAFETY: a copy is not a memset: its struct is never read.
        assert_eq!(unsafe { memset_destination(276, p) }, None);
    }

    /// A copy into (or out of) another device's memory waits for that device's windows too; a
    /// call whose memory is not described waits for every device's.
    #[test]
    fn a_fenced_call_waits_for_the_devices_whose_memory_it_touches() {
        assert_eq!(
            devices_to_fence(Some(1), &[None, None], true, &[0, 1, 2]),
            vec![1]
        );
        assert_eq!(
            devices_to_fence(Some(1), &[Some(0), None], true, &[0, 1, 2]),
            vec![0, 1],
            "a copy from device 1's context into device 0's memory"
        );
        assert_eq!(
            devices_to_fence(Some(2), &[Some(2), Some(0)], true, &[]),
            vec![0, 2],
            "a copy reading device 0's memory"
        );
        assert_eq!(
            devices_to_fence(Some(1), &[None, None], false, &[2, 0, 1]),
            vec![0, 1, 2],
            "a 2D or peer copy: every device"
        );
        assert_eq!(
            devices_to_fence(None, &[None, None], true, &[]),
            Vec::<u64>::new()
        );
    }

    /// A copy or memset whose context's device could not be told, into memory the inventory
    /// does not hold (a module's `__device__` variable, which a snapshot of its device holds),
    /// waited for no window at all: written between a replay's snapshot and its restores, it
    /// was undone by them. It now waits for every device that may have windows.
    #[test]
    fn a_fenced_call_of_unknown_device_waits_for_every_device() {
        assert_eq!(
            devices_to_fence(None, &[None, None], true, &[2, 0]),
            vec![0, 2]
        );
        assert_eq!(
            devices_to_fence(None, &[Some(1), None], true, &[0, 1]),
            vec![0, 1]
        );
    }

    /// How a tool's call is watched and which addresses a fence looks up come from the same
    /// parameter structs: a 1D memset's range, a 2D memset's destination, a copy to the host
    /// (nothing written, but its source read), a copy's destination and source, a launch (not
    /// described).
    #[test]
    fn what_a_call_writes_and_touches_is_read_from_its_parameters() {
        let p = |v: &[u64]| v.as_ptr() as *const std::ffi::c_void;
        // cuMemsetD32_v2(dst, value, N)
        let set = [0x7000_0000u64, 5, 16];
        // SAFETY: each struct below has the layout of its call's parameters (at least the
        // fields read).
        unsafe {
            assert_eq!(
                writes(251, p(&set)),
                Writes::Range {
                    addr: 0x7000_0000,
                    len: 64
                }
            );
            assert_eq!(leading_addresses(251, p(&set)), Some([0x7000_0000, 5]));
            // cuMemsetD2D32_v2(dst, pitch, value, width, height)
            let set_2d = [0x7200_0000u64, 4096, 7, 1024, 8];
            assert_eq!(writes(254, p(&set_2d)), Writes::Within(0x7200_0000));
            assert_eq!(
                leading_addresses(254, p(&set_2d)),
                None,
                "a 2D memset: every device"
            );
            // cuMemcpyDtoH_v2(dstHost, srcDevice, ByteCount)
            let to_host = [0x1234u64, 0x7300_0000, 256];
            assert_eq!(writes(278, p(&to_host)), Writes::Nothing);
            assert_eq!(
                leading_addresses(278, p(&to_host)),
                Some([0x1234, 0x7300_0000]),
                "the source's device is waited for: a copy must not read a pass's bytes"
            );
            // cuMemcpyDtoD_v2(dst, src, ByteCount)
            let d2d = [0x7400_0000u64, 0x7500_0000, 128];
            assert_eq!(
                writes(280, p(&d2d)),
                Writes::Range {
                    addr: 0x7400_0000,
                    len: 128
                }
            );
            assert_eq!(
                leading_addresses(280, p(&d2d)),
                Some([0x7400_0000, 0x7500_0000])
            );
            assert_eq!(writes(cbid::CU_LAUNCH_KERNEL, p(&d2d)), Writes::Unknown);
            assert_eq!(writes(318, p(&d2d)), Writes::Unknown, "a peer copy");
            assert_eq!(leading_addresses(318, p(&d2d)), None);
            assert_eq!(leading_addresses(280, std::ptr::null()), None);
        }
    }

    #[test]
    fn launches_kreplay_does_not_replay_are_fenced_against_every_device() {
        // Ids from CUDA 13.0's cupti_driver_cbid.h. The legacy launches and the multi-device
        // cooperative launch are not replayed; unfenced, one made on another thread while a
        // replay window is open runs between the snapshot and a restore, and the restore undoes
        // what its kernel wrote.
        let calls: [(&str, CallbackId); 4] = [
            ("cuLaunch", 115),
            ("cuLaunchGrid", 116),
            ("cuLaunchGridAsync", 117),
            ("cuLaunchCooperativeKernelMultiDevice", 480),
        ];
        let enabled = cbid::all();
        for (name, id) in calls {
            assert!(device_write(id).is_some(), "{name} ({id}) is not fenced");
            assert!(enabled.contains(&id), "{name} ({id}) is never seen");
            // Its kernels may write any device's memory: every device with windows waits.
            assert_eq!(destination(id), Destination::Unknown, "{name}");
            // SAFETY: a null parameter struct, which `writes` accepts for any call.
            let w = unsafe { writes(id, std::ptr::null()) };
            assert_eq!(w, Writes::Unknown, "{name}");
        }
    }

    #[test]
    fn every_fenced_call_has_its_callback_enabled() {
        let enabled = cbid::all();
        for id in 0..1000 {
            if device_write(id).is_some() {
                assert!(
                    enabled.contains(&id),
                    "callback {id} is fenced but never enabled"
                );
            }
        }
    }

    #[test]
    fn enter_and_exit_nest_per_thread() {
        let locks = AgentLocks::new();
        locks.set_enabled(true);
        enter(&locks, &[0, 3]);
        enter(&locks, &[]);
        assert_eq!(depth(), 2);
        assert!(locks.agent_lock(0).is_locked(), "reader held");
        assert!(
            locks.agent_lock(3).is_locked(),
            "every device's reader held"
        );
        exit();
        exit();
        assert_eq!(depth(), 0);
        assert!(!locks.agent_lock(0).is_locked());
        assert!(!locks.agent_lock(3).is_locked());
    }
}
