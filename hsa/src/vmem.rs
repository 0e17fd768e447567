//! The virtual memory API of ROCm 6.0+ (`hsa_amd_vmem_*`): physical memory handles mapped into
//! reserved address ranges. A mapped range is an allocation like any other for the snapshot
//! inventory, owned by the agent of the pool its handle came from; the agents it was made
//! accessible to are recorded beside it.
//!
//! Handles are counted as the runtime counts them (created or imported: 1, each retain: +1,
//! each release: -1). Exporting a handle neither creates nor writes memory and passes through
//! unwrapped.
//!
//! Reserved address ranges (`hsa_amd_vmem_address_reserve`, `_reserve_align`, `_free`) are
//! remembered: a range backed by several handles mapped side by side is one buffer to a kernel,
//! which, given a pointer into it, may write any of its mappings. A kernel argument into a
//! reservation therefore reaches every mapping inside it ([`VmemTracker::mappings_reached`]).

use std::collections::{BTreeMap, HashMap};
use std::ffi::{c_int, c_void};

use hsa_sys::layouts::{
    hsa_amd_memory_access_desc_t, hsa_amd_memory_type_t, hsa_amd_vmem_alloc_handle_t,
};
use hsa_sys::*;
use kreplay_snapshot::{MemoryKind, NewAllocation};
use parking_lot::Mutex;

use crate::backend::{Backend, backend, guarded};
use crate::original::forward;

/// What kreplay knows of one physical memory handle.
#[derive(Clone, Copy, Debug)]
struct Handle {
    /// Owner agent and kind of the memory, from its pool.
    owner: u64,
    kind: MemoryKind,
    references: u64,
}

/// One mapped range.
#[derive(Clone, Debug)]
struct Mapping {
    size: u64,
    /// (agent, `hsa_access_permission_t`) as last set with `hsa_amd_vmem_set_access`.
    access: Vec<(u64, u32)>,
}

/// Handles and mappings of the process.
#[derive(Default)]
pub(crate) struct VmemTracker {
    handles: Mutex<HashMap<u64, Handle>>,
    mappings: Mutex<HashMap<u64, Mapping>>,
    /// Reserved address ranges: base to size.
    reservations: Mutex<BTreeMap<u64, u64>>,
}

impl VmemTracker {
    /// The tracker's locks for the fork set (`crate::fork`): handles, mappings, reservations.
    pub(crate) fn fork_locks(&self) -> [crate::fork::Lock<'_>; 3] {
        [&self.handles, &self.mappings, &self.reservations]
    }

    /// The bases of the mappings inside the reservation `addr` lies in, or ends (one past its
    /// last byte: an end pointer); none when `addr` is in no reservation.
    pub(crate) fn mappings_reached(&self, addr: u64) -> Vec<u64> {
        let reservation = {
            let reservations = self.reservations.lock();
            let within = |a: u64| crate::reach::range_containing(&reservations, a);
            within(addr).or_else(|| {
                addr.checked_sub(1)
                    .and_then(within)
                    .filter(|&(base, size)| base.saturating_add(size) == addr)
            })
        };
        let Some((base, size)) = reservation else {
            return Vec::new();
        };
        let end = base.saturating_add(size);
        let mut inside: Vec<u64> = self
            .mappings
            .lock()
            .keys()
            .copied()
            .filter(|&m| m >= base && m < end)
            .collect();
        inside.sort_unstable();
        inside
    }

    /// The access list of the mapping containing `addr`.
    pub(crate) fn access(&self, addr: u64) -> Option<Vec<(u64, u32)>> {
        self.mappings
            .lock()
            .iter()
            .find(|(base, m)| addr >= **base && addr - **base < m.size)
            .map(|(_, m)| m.access.clone())
    }
}

/// The owner agent and memory kind of a pool (the agent whose pool list holds it).
fn pool_owner(b: &Backend, pool: hsa_amd_memory_pool_t) -> Option<(u64, MemoryKind)> {
    let agent = b.original.agents().into_iter().find(|&agent| {
        b.original
            .pools(agent)
            .iter()
            .any(|p| p.handle == pool.handle)
    })?;
    let flags = b
        .original
        .pool_info_u32(pool, HSA_AMD_MEMORY_POOL_INFO_GLOBAL_FLAGS)
        .unwrap_or(0);
    let kind = if b.original.agent_device_type(agent) == Some(HSA_DEVICE_TYPE_CPU) {
        MemoryKind::Host
    } else if flags & HSA_AMD_MEMORY_POOL_GLOBAL_FLAG_KERNARG_INIT != 0 {
        MemoryKind::Kernarg
    } else if flags & HSA_AMD_MEMORY_POOL_GLOBAL_FLAG_COARSE_GRAINED != 0 {
        MemoryKind::CoarseDevice
    } else {
        MemoryKind::FineDevice
    };
    Some((agent.handle, kind))
}

/// Records one more reference to `handle`, learning its pool from the runtime if it is new.
fn retain(b: &Backend, handle: hsa_amd_vmem_alloc_handle_t, pool: Option<hsa_amd_memory_pool_t>) {
    if let Some(h) = b.vmem.handles.lock().get_mut(&handle.handle) {
        h.references += 1;
        return;
    }
    let pool = pool.or_else(|| {
        let mut pool = hsa_amd_memory_pool_t { handle: 0 };
        let mut kind: hsa_amd_memory_type_t = 0;
        let status = forward!(
            b,
            amd.hsa_amd_vmem_get_alloc_properties_from_handle_fn(handle, &mut pool, &mut kind)
        );
        (status == HSA_STATUS_SUCCESS).then_some(pool)
    });
    match pool.and_then(|p| pool_owner(b, p)) {
        Some((owner, kind)) => {
            b.vmem
                .handles
                .lock()
                .entry(handle.handle)
                .or_insert(Handle {
                    owner,
                    kind,
                    references: 0,
                });
            if let Some(h) = b.vmem.handles.lock().get_mut(&handle.handle) {
                h.references += 1;
            }
        }
        None => b.hooks.warn(&format!(
            "virtual memory handle {:#x} has no known pool; memory mapped from it is not tracked",
            handle.handle
        )),
    }
}

fn reserved(b: &Backend, status: hsa_status_t, va: *mut *mut c_void, size: usize) -> hsa_status_t {
    if status == HSA_STATUS_SUCCESS && !va.is_null() && size > 0 && !b.is_finalized() {
        // SAFETY: the runtime wrote the reserved address through the caller's valid out pointer.
        let base = unsafe { va.read_unaligned() } as u64;
        b.vmem.reservations.lock().insert(base, size as u64);
    }
    status
}

pub(crate) unsafe extern "C" fn address_reserve(
    va: *mut *mut c_void,
    size: usize,
    address: u64,
    flags: u64,
) -> hsa_status_t {
    guarded(|| {
        let b = backend();
        let status = forward!(
            b,
            amd.hsa_amd_vmem_address_reserve_fn(va, size, address, flags)
        );
        reserved(b, status, va, size)
    })
}

pub(crate) unsafe extern "C" fn address_reserve_align(
    va: *mut *mut c_void,
    size: usize,
    address: u64,
    alignment: u64,
    flags: u64,
) -> hsa_status_t {
    guarded(|| {
        let b = backend();
        let status = forward!(
            b,
            amd.hsa_amd_vmem_address_reserve_align_fn(va, size, address, alignment, flags)
        );
        reserved(b, status, va, size)
    })
}

pub(crate) unsafe extern "C" fn address_free(va: *mut c_void, size: usize) -> hsa_status_t {
    guarded(|| {
        let b = backend();
        let status = forward!(b, amd.hsa_amd_vmem_address_free_fn(va, size));
        if status == HSA_STATUS_SUCCESS {
            b.vmem.reservations.lock().remove(&(va as u64));
        }
        status
    })
}

pub(crate) unsafe extern "C" fn handle_create(
    pool: hsa_amd_memory_pool_t,
    size: usize,
    type_: hsa_amd_memory_type_t,
    flags: u64,
    out: *mut hsa_amd_vmem_alloc_handle_t,
) -> hsa_status_t {
    guarded(|| {
        let b = backend();
        let status = forward!(
            b,
            amd.hsa_amd_vmem_handle_create_fn(pool, size, type_, flags, out)
        );
        if status == HSA_STATUS_SUCCESS && !out.is_null() && !b.is_finalized() {
            // SAFETY: the runtime wrote the handle through the caller's valid out pointer.
            retain(b, unsafe { out.read_unaligned() }, Some(pool));
        }
        status
    })
}

pub(crate) unsafe extern "C" fn import_shareable_handle(
    dmabuf_fd: c_int,
    out: *mut hsa_amd_vmem_alloc_handle_t,
) -> hsa_status_t {
    guarded(|| {
        let b = backend();
        let status = forward!(
            b,
            amd.hsa_amd_vmem_import_shareable_handle_fn(dmabuf_fd, out)
        );
        if status == HSA_STATUS_SUCCESS && !out.is_null() && !b.is_finalized() {
            // SAFETY: the runtime wrote the handle through the caller's valid out pointer.
            retain(b, unsafe { out.read_unaligned() }, None);
        }
        status
    })
}

pub(crate) unsafe extern "C" fn retain_alloc_handle(
    out: *mut hsa_amd_vmem_alloc_handle_t,
    addr: *mut c_void,
) -> hsa_status_t {
    guarded(|| {
        let b = backend();
        let status = forward!(b, amd.hsa_amd_vmem_retain_alloc_handle_fn(out, addr));
        if status == HSA_STATUS_SUCCESS && !out.is_null() && !b.is_finalized() {
            // SAFETY: the runtime wrote the handle through the caller's valid out pointer.
            retain(b, unsafe { out.read_unaligned() }, None);
        }
        status
    })
}

pub(crate) unsafe extern "C" fn handle_release(
    handle: hsa_amd_vmem_alloc_handle_t,
) -> hsa_status_t {
    guarded(|| {
        let b = backend();
        let status = forward!(b, amd.hsa_amd_vmem_handle_release_fn(handle));
        if status == HSA_STATUS_SUCCESS {
            let mut handles = b.vmem.handles.lock();
            if let Some(h) = handles.get_mut(&handle.handle) {
                h.references = h.references.saturating_sub(1);
                if h.references == 0 {
                    handles.remove(&handle.handle);
                }
            }
        }
        status
    })
}

pub(crate) unsafe extern "C" fn map(
    va: *mut c_void,
    size: usize,
    in_offset: usize,
    handle: hsa_amd_vmem_alloc_handle_t,
    flags: u64,
) -> hsa_status_t {
    guarded(|| {
        let b = backend();
        let status = forward!(
            b,
            amd.hsa_amd_vmem_map_fn(va, size, in_offset, handle, flags)
        );
        if status != HSA_STATUS_SUCCESS || b.is_finalized() || va.is_null() {
            return status;
        }
        let known = b.vmem.handles.lock().get(&handle.handle).copied();
        let known = known.or_else(|| {
            retain(b, handle, None);
            // Not the application's reference: only learned to classify the mapping.
            let mut handles = b.vmem.handles.lock();
            let h = handles.get_mut(&handle.handle)?;
            h.references -= 1;
            let copy = *h;
            if h.references == 0 {
                handles.remove(&handle.handle);
            }
            Some(copy)
        });
        match known {
            Some(h) => {
                b.inventory.on_alloc(NewAllocation {
                    base: va as u64,
                    size: size as u64,
                    owner_agent: h.owner,
                    kind: h.kind,
                });
                b.vmem.mappings.lock().insert(
                    va as u64,
                    Mapping {
                        size: size as u64,
                        access: Vec::new(),
                    },
                );
            }
            None => b.hooks.warn(&format!(
                "mapping {va:p} of virtual memory handle {:#x} is not tracked",
                handle.handle
            )),
        }
        status
    })
}

pub(crate) unsafe extern "C" fn unmap(va: *mut c_void, size: usize) -> hsa_status_t {
    guarded(|| {
        let b = backend();
        let mapping = if b.is_finalized() {
            None
        } else {
            b.vmem.mappings.lock().remove(&(va as u64))
        };
        // Before the runtime unmaps it: waits for a restore in progress.
        let forgotten = mapping
            .as_ref()
            .and_then(|_| b.inventory.on_free(va as u64));
        let status = forward!(b, amd.hsa_amd_vmem_unmap_fn(va, size));
        // Refused (a size other than the mapping's): the mapping stays, and so does what is
        // known of it.
        if status != HSA_STATUS_SUCCESS
            && let Some(mapping) = mapping
        {
            b.vmem.mappings.lock().entry(va as u64).or_insert(mapping);
        }
        crate::memory::refused(status, crate::memory::Forgotten::allocation(forgotten))
    })
}

pub(crate) unsafe extern "C" fn set_access(
    va: *mut c_void,
    size: usize,
    desc: *const hsa_amd_memory_access_desc_t,
    count: usize,
) -> hsa_status_t {
    guarded(|| {
        let b = backend();
        let access: Vec<(u64, u32)> = if desc.is_null() {
            Vec::new()
        } else {
            (0..count)
                .map(|i| {
                    // SAFETY: the caller passes `count` descriptors at `desc` (the runtime
                    // rejects the call otherwise, and nothing is recorded then).
                    let d = unsafe { desc.add(i).read_unaligned() };
                    (d.agent_handle.handle, d.permissions)
                })
                .collect()
        };
        // Peer access to a GPU's memory: the agents that may write it replay with its owner. A
        // grant made while a replay holds one of them waits for it to end (see
        // `crate::memory::agents_allow_access`).
        let writers = access
            .iter()
            .filter(|&&(_, permissions)| permissions & HSA_ACCESS_PERMISSION_WO != 0)
            .map(|&(handle, _)| hsa_agent_t { handle });
        let members = crate::memory::grant_members(b, va, writers);
        let _fence = b
            .replay_active()
            .then(|| crate::copies::readers(b, &members));
        let status = forward!(b, amd.hsa_amd_vmem_set_access_fn(va, size, desc, count));
        if status == HSA_STATUS_SUCCESS && !desc.is_null() {
            // Not once finalized: see `crate::memory::agents_allow_access`.
            if !b.is_finalized() {
                b.peers.link(&members);
            }
            // Each call replaces the previous permissions of every agent.
            if let Some(m) = b.vmem.mappings.lock().get_mut(&(va as u64)) {
                m.access = access;
            }
        }
        status
    })
}

/// The recorded access list of the mapping containing `addr` (for tests and diagnostics).
pub(crate) fn access(addr: u64) -> Option<Vec<(u64, u32)>> {
    crate::backend::installed().and_then(|b| b.vmem.access(addr))
}
