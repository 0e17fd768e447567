//! Allocation tracking (the alloc/free wrappers) and the snapshot crate's view of HSA memory.

use std::ffi::c_void;

use hsa_sys::*;

use kreplay_snapshot::{
    Allocation, Capabilities, ChunkWrite, CopyError, DeviceCopy, DeviceMemory, HostWindow,
    MemoryKind, NewAllocation,
};

use crate::backend::{Backend, backend, guarded};
use crate::original::forward;

/// Classifies a fresh allocation from the runtime's pointer info (docs/abi.md §3 rule 3):
/// returns (base, size, owner agent, kind).
pub(crate) fn classify(b: &Backend, ptr: *const c_void) -> Option<(u64, u64, u64, MemoryKind)> {
    let info = b.original.pointer_info(ptr)?;
    let flags = info.global_flags;
    let kind = if b.original.agent_device_type(info.agentOwner) == Some(HSA_DEVICE_TYPE_CPU) {
        MemoryKind::Host
    } else if flags & HSA_AMD_MEMORY_POOL_GLOBAL_FLAG_KERNARG_INIT != 0 {
        MemoryKind::Kernarg
    } else if flags & HSA_AMD_MEMORY_POOL_GLOBAL_FLAG_COARSE_GRAINED != 0 {
        MemoryKind::CoarseDevice
    } else {
        MemoryKind::FineDevice
    };
    let base = info.agentBaseAddress as u64;
    (base != 0).then_some((base, info.sizeInBytes as u64, info.agentOwner.handle, kind))
}

/// Records a successful allocation in the inventory (after finalization: nothing).
fn track(ptr: *mut c_void, executable: bool) {
    let b = backend();
    if b.is_finalized() || ptr.is_null() {
        return;
    }
    match classify(b, ptr) {
        Some((base, size, owner, kind)) => {
            let kind = if executable {
                MemoryKind::Executable
            } else {
                kind
            };
            b.inventory.on_alloc(NewAllocation {
                base,
                size,
                owner_agent: owner,
                kind,
            });
        }
        None => b.hooks.warn(&format!(
            "allocation {ptr:p} has no pointer info; it is not tracked"
        )),
    }
}

/// What kreplay forgot of memory before the runtime releases it, for [`refused`].
#[derive(Default)]
pub(crate) struct Forgotten {
    /// The inventory's record of the allocation, if it had one.
    pub(crate) allocation: Option<Allocation>,
    /// The images whose data lies in it, by handle.
    images: Vec<(u64, crate::images::ImageData)>,
}

impl Forgotten {
    /// Only the inventory's record of `allocation`.
    pub(crate) fn allocation(allocation: Option<Allocation>) -> Forgotten {
        Forgotten {
            allocation,
            images: Vec::new(),
        }
    }
}

/// Forgets an allocation before the runtime frees it (waits for a restore in progress), with
/// the images over it, and returns them for [`refused`].
fn untrack(ptr: *mut c_void) -> Forgotten {
    let b = backend();
    if b.is_finalized() || ptr.is_null() {
        return Forgotten::default();
    }
    let images = b
        .inventory
        .lookup(ptr as u64)
        .map(|a| b.images.forget_within(a.base, a.end()))
        .unwrap_or_default();
    Forgotten {
        allocation: b.inventory.on_free(ptr as u64),
        images,
    }
}

/// Forgets the allocation containing `ptr` (by the base its entry was recorded under) before
/// the runtime releases it, with the images over it: for entries that take an interior or host
/// address. Returns them for [`refused`].
fn untrack_containing(ptr: *const c_void) -> Forgotten {
    let b = backend();
    if b.is_finalized() || ptr.is_null() {
        return Forgotten::default();
    }
    let Some(base) = b
        .original
        .pointer_info(ptr)
        .map(|info| info.agentBaseAddress as u64)
        .filter(|&base| base != 0)
        .or_else(|| b.inventory.lookup(ptr as u64).map(|a| a.base))
    else {
        return Forgotten::default();
    };
    let images = b
        .inventory
        .lookup(base)
        .map(|a| b.images.forget_within(a.base, a.end()))
        .unwrap_or_default();
    Forgotten {
        allocation: b.inventory.on_free(base),
        images,
    }
}

/// Passes on the runtime's `status` for the release of `forgotten`, tracking it again (and
/// knowing the images over it again) where the runtime refused the release: the memory is
/// still that allocation, and a kernel that reaches it (through a pointer kept in memory, which
/// no argument shows, or through an image handle) must find it in the next snapshot rather
/// than have its passes add up in it.
pub(crate) fn refused(status: hsa_status_t, forgotten: Forgotten) -> hsa_status_t {
    if status != HSA_STATUS_SUCCESS {
        let b = backend();
        if let Some(allocation) = forgotten.allocation {
            b.inventory.reinstate(allocation);
        }
        b.images.reinstate(forgotten.images);
    }
    status
}

/// `HSA_AMD_MEMORY_POOL_EXECUTABLE_FLAG` of newer runtimes (bit 2 of the allocate flags).
const POOL_EXECUTABLE_FLAG: u32 = 1 << 2;

pub(crate) unsafe extern "C" fn pool_allocate(
    pool: hsa_amd_memory_pool_t,
    size: usize,
    flags: u32,
    ptr: *mut *mut c_void,
) -> hsa_status_t {
    guarded(|| {
        let status = backend().original.pool_allocate(pool, size, flags, ptr);
        if status == HSA_STATUS_SUCCESS && !ptr.is_null() {
            // SAFETY: the runtime wrote the new allocation through the caller's valid out pointer.
            track(unsafe { *ptr }, flags & POOL_EXECUTABLE_FLAG != 0);
        }
        status
    })
}

pub(crate) unsafe extern "C" fn pool_free(ptr: *mut c_void) -> hsa_status_t {
    guarded(|| {
        let forgotten = untrack(ptr);
        refused(backend().original.pool_free(ptr), forgotten)
    })
}

pub(crate) unsafe extern "C" fn memory_allocate(
    region: hsa_region_t,
    size: usize,
    ptr: *mut *mut c_void,
) -> hsa_status_t {
    guarded(|| {
        let status = backend().original.memory_allocate(region, size, ptr);
        if status == HSA_STATUS_SUCCESS && !ptr.is_null() {
            // SAFETY: the runtime wrote the new allocation through the caller's valid out pointer.
            track(unsafe { *ptr }, false);
        }
        status
    })
}

pub(crate) unsafe extern "C" fn memory_free(ptr: *mut c_void) -> hsa_status_t {
    guarded(|| {
        let forgotten = untrack(ptr);
        refused(backend().original.memory_free(ptr), forgotten)
    })
}

/// Wrapper of `hsa_amd_agents_allow_access`: a grant of a GPU's memory to other GPUs links
/// them into one replay group (`crate::peers`). Grants of memory the CPU owns link nothing: a
/// replay whose dispatch points into such memory holds every GPU itself
/// (`crate::peers::replay_agents`).
pub(crate) unsafe extern "C" fn agents_allow_access(
    num_agents: u32,
    agents: *const hsa_agent_t,
    flags: *const u32,
    ptr: *const c_void,
) -> hsa_status_t {
    guarded(|| {
        let b = backend();
        let granted: &[hsa_agent_t] = if agents.is_null() {
            &[]
        } else {
            // SAFETY: the caller passes `num_agents` agent handles at `agents` (the runtime
            // rejects the call otherwise, and nothing is linked then).
            unsafe { std::slice::from_raw_parts(agents, num_agents as usize) }
        };
        let members = grant_members(b, ptr, granted.iter().copied());
        // A grant made while a replay holds one of the agents waits for it to end: that replay
        // took its group before the grant, so a kernel of the newly linked agent would not wait
        // for it.
        let _fence = b
            .replay_active()
            .then(|| crate::copies::readers(b, &members));
        let status = forward!(
            b,
            amd.hsa_amd_agents_allow_access_fn(num_agents, agents, flags, ptr)
        );
        // Once finalized (the child of a fork included) no replay starts any more: the groups
        // are left as they are. Their lock is not in the fork set (`crate::fork`): a replay of
        // the parent's may have been reading them at the fork.
        if status == HSA_STATUS_SUCCESS && !b.is_finalized() {
            b.peers.link(&members);
        }
        status
    })
}

/// The GPU agents a grant of the memory at `ptr` to `granted` links into one replay group
/// (`crate::peers`): the GPU owning it and the GPUs among `granted`. None when the CPU owns the
/// memory, or the runtime does not know it: such a grant links nothing.
pub(crate) fn grant_members(
    b: &Backend,
    ptr: *const c_void,
    granted: impl Iterator<Item = hsa_agent_t>,
) -> Vec<u64> {
    let Some(info) = (!ptr.is_null())
        .then(|| b.original.pointer_info(ptr))
        .flatten()
    else {
        return Vec::new();
    };
    if crate::copies::gpu_agents(b, [info.agentOwner]).is_empty() {
        return Vec::new();
    }
    crate::copies::gpu_agents(b, granted.chain([info.agentOwner]))
}

/// Wrapper of `hsa_amd_memory_lock`: locked host memory is memory a kernel may write, tracked
/// (as host memory at the address agents use) so the snapshot rules can include it.
pub(crate) unsafe extern "C" fn memory_lock(
    host_ptr: *mut c_void,
    size: usize,
    agents: *mut hsa_agent_t,
    num_agent: std::ffi::c_int,
    agent_ptr: *mut *mut c_void,
) -> hsa_status_t {
    guarded(|| {
        let b = backend();
        let status = forward!(
            b,
            amd.hsa_amd_memory_lock_fn(host_ptr, size, agents, num_agent, agent_ptr)
        );
        track_out(status, agent_ptr);
        status
    })
}

/// Wrapper of `hsa_amd_memory_lock_to_pool`: see [`memory_lock`].
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe extern "C" fn memory_lock_to_pool(
    host_ptr: *mut c_void,
    size: usize,
    agents: *mut hsa_agent_t,
    num_agent: std::ffi::c_int,
    pool: hsa_amd_memory_pool_t,
    flags: u32,
    agent_ptr: *mut *mut c_void,
) -> hsa_status_t {
    guarded(|| {
        let b = backend();
        let status = forward!(
            b,
            amd.hsa_amd_memory_lock_to_pool_fn(
                host_ptr, size, agents, num_agent, pool, flags, agent_ptr
            )
        );
        track_out(status, agent_ptr);
        status
    })
}

/// Wrapper of `hsa_amd_memory_unlock`.
pub(crate) unsafe extern "C" fn memory_unlock(host_ptr: *mut c_void) -> hsa_status_t {
    guarded(|| {
        let forgotten = untrack_containing(host_ptr);
        refused(
            forward!(backend(), amd.hsa_amd_memory_unlock_fn(host_ptr)),
            forgotten,
        )
    })
}

/// Wrapper of `hsa_amd_ipc_memory_attach`: memory another process shares is tracked like an
/// allocation of this one (its owner and kind from the runtime's pointer info).
pub(crate) unsafe extern "C" fn ipc_memory_attach(
    handle: *const hsa_amd_ipc_memory_t,
    len: usize,
    num_agents: u32,
    mapping_agents: *const hsa_agent_t,
    mapped_ptr: *mut *mut c_void,
) -> hsa_status_t {
    guarded(|| {
        let b = backend();
        let status = forward!(
            b,
            amd.hsa_amd_ipc_memory_attach_fn(handle, len, num_agents, mapping_agents, mapped_ptr)
        );
        track_out(status, mapped_ptr);
        status
    })
}

/// Wrapper of `hsa_amd_ipc_memory_detach`.
pub(crate) unsafe extern "C" fn ipc_memory_detach(mapped_ptr: *mut c_void) -> hsa_status_t {
    guarded(|| {
        let forgotten = untrack_containing(mapped_ptr);
        refused(
            forward!(backend(), amd.hsa_amd_ipc_memory_detach_fn(mapped_ptr)),
            forgotten,
        )
    })
}

/// Wrapper of `hsa_amd_interop_map_buffer`: a graphics buffer mapped for agents is tracked.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe extern "C" fn interop_map_buffer(
    num_agents: u32,
    agents: *mut hsa_agent_t,
    interop_handle: std::ffi::c_int,
    flags: u32,
    size: *mut usize,
    ptr: *mut *mut c_void,
    metadata_size: *mut usize,
    metadata: *mut *const c_void,
) -> hsa_status_t {
    guarded(|| {
        let b = backend();
        let status = forward!(
            b,
            amd.hsa_amd_interop_map_buffer_fn(
                num_agents,
                agents,
                interop_handle,
                flags,
                size,
                ptr,
                metadata_size,
                metadata
            )
        );
        track_out(status, ptr);
        status
    })
}

/// Wrapper of `hsa_amd_interop_unmap_buffer`.
pub(crate) unsafe extern "C" fn interop_unmap_buffer(ptr: *mut c_void) -> hsa_status_t {
    guarded(|| {
        let forgotten = untrack_containing(ptr);
        refused(
            forward!(backend(), amd.hsa_amd_interop_unmap_buffer_fn(ptr)),
            forgotten,
        )
    })
}

/// Tracks the memory a successful call returned through `out`.
fn track_out(status: hsa_status_t, out: *mut *mut c_void) {
    if status == HSA_STATUS_SUCCESS && !out.is_null() {
        // SAFETY: the runtime wrote the new address through the caller's valid out pointer.
        track(unsafe { *out }, false);
    }
}

/// Device memory as the snapshot crate sees it: copies through the runtime's `hsa_memory_copy`,
/// direct host access where the runtime reports a host address for the allocation, and device
/// shadows allocated from the agent's coarse-grained pool (never tracked).
pub(crate) struct HsaMemory;

/// How many times kreplay issues one of its own runtime copies (snapshot, restore, capture)
/// before it counts as failed: a transient refusal (a copy engine briefly out of resources)
/// would otherwise fail a whole restore, and leave memory neither as the pass left it nor as
/// the snapshot holds it where the restore's other copies went through. Copying the same bytes
/// again is harmless.
const COPY_ATTEMPTS: usize = 3;

/// `attempt` until it succeeds, at most [`COPY_ATTEMPTS`] times; its last status.
fn attempted(mut attempt: impl FnMut() -> hsa_status_t) -> hsa_status_t {
    let mut status = HSA_STATUS_ERROR;
    for _ in 0..COPY_ATTEMPTS {
        status = attempt();
        if status == HSA_STATUS_SUCCESS {
            break;
        }
    }
    status
}

fn copy_failed(addr: u64, len: usize, status: hsa_status_t) -> CopyError {
    CopyError::failed(
        addr,
        len as u64,
        format!("hsa_memory_copy returned status {status:#x}"),
    )
}

impl HsaMemory {
    /// The address agents use for host memory at `ptr`: its locked alias when it lies in a
    /// range [`DeviceMemory::register_host`] locked, else `ptr` itself.
    fn agent_address(b: &Backend, ptr: *const u8) -> *const c_void {
        let addr = ptr as usize;
        b.locked_host
            .lock()
            .iter()
            .find(|&&(host, len, _)| addr >= host && addr < host + len)
            .map_or(ptr.cast(), |&(host, _, agent)| {
                (agent + (addr - host)) as *const c_void
            })
    }
}

impl DeviceMemory for HsaMemory {
    fn capabilities(&self) -> Capabilities {
        // Writes of scattered chunks go out as one list of async copies with one completion
        // signal (used where the snapshot cannot touch device memory directly).
        // Host windows are handed out only for the software runtime's memory, which its kernels
        // and copies (host code on this process's threads) alone write: writes to it can be
        // followed in the page tables.
        Capabilities::NONE
            .with_batched_writes(true)
            .with_cpu_writes(true)
    }

    fn write_batch(&self, writes: &[ChunkWrite<'_>]) -> Result<(), CopyError> {
        let b = backend();
        let Some(first) = writes.first() else {
            return Ok(());
        };
        let Some(cpu) = *b.cpu_agent.get_or_init(|| b.original.cpu_agent()) else {
            return writes.iter().try_for_each(|w| self.write(w.addr, w.data));
        };
        let signal = b
            .original
            .signal_create(writes.len() as i64)
            .map_err(|status| {
                CopyError::failed(
                    first.addr,
                    0,
                    format!("cannot create a copy signal: status {status:#x}"),
                )
            })?;
        let mut failure = None;
        let mut submitted = 0usize;
        for w in writes {
            let Some(info) = b.original.pointer_info(w.addr as *const c_void) else {
                failure = Some(CopyError::failed(
                    w.addr,
                    w.data.len() as u64,
                    "no allocation at this address",
                ));
                break;
            };
            let status = attempted(|| {
                b.original.async_copy(
                    w.addr as *mut c_void,
                    info.agentOwner,
                    Self::agent_address(b, w.data.as_ptr()),
                    cpu,
                    w.data.len(),
                    0,
                    std::ptr::null(),
                    signal,
                )
            });
            if status != HSA_STATUS_SUCCESS {
                failure = Some(CopyError::failed(
                    w.addr,
                    w.data.len() as u64,
                    format!("hsa_amd_memory_async_copy returned status {status:#x}"),
                ));
                break;
            }
            submitted += 1;
        }
        // Copies never submitted will never count down: take them off before waiting.
        if submitted < writes.len() {
            b.original
                .signal_subtract(signal, (writes.len() - submitted) as i64);
        }
        // Copies in flight are writing the replay's memory from the store: like a running pass
        // they are never abandoned (a restore given up on would have them land later, over what
        // the application wrote after its completion, reading a store that may be freed). A
        // slow batch is warned about after the pass deadline, then at doubling gaps, and
        // waited for.
        let start = std::time::Instant::now();
        let mut gap = b.drain.pass_timeout;
        while !b.wait_signal_zero(signal, Backend::deadline_after(gap)) {
            gap = kreplay_drain::next_warning_gap(gap, b.drain.pass_timeout);
            b.hooks.warn(&format!(
                "a restore's {} async copies still in flight after {:.1} s; waiting for them \
                 (copies in flight are never abandoned)",
                submitted,
                start.elapsed().as_secs_f64()
            ));
        }
        b.original.signal_destroy(signal);
        failure.map_or(Ok(()), Err)
    }

    fn register_host(&self, ptr: *const u8, len: usize) -> bool {
        let b = backend();
        match b.original.memory_lock(ptr.cast_mut().cast(), len) {
            Some(agent_ptr) => {
                b.locked_host
                    .lock()
                    .push((ptr as usize, len, agent_ptr as usize));
                true
            }
            None => false,
        }
    }

    fn unregister_host(&self, ptr: *const u8, _len: usize) {
        let b = backend();
        let mut locked = b.locked_host.lock();
        if let Some(i) = locked.iter().position(|&(host, _, _)| host == ptr as usize) {
            locked.swap_remove(i);
            drop(locked);
            b.original.memory_unlock(ptr.cast_mut().cast());
        }
    }

    fn read(&self, addr: u64, dst: &mut [u8]) -> Result<(), CopyError> {
        let status = attempted(|| {
            backend().original.memory_copy(
                dst.as_mut_ptr().cast(),
                addr as *const c_void,
                dst.len(),
            )
        });
        if status == HSA_STATUS_SUCCESS {
            Ok(())
        } else {
            Err(copy_failed(addr, dst.len(), status))
        }
    }

    fn write(&self, addr: u64, src: &[u8]) -> Result<(), CopyError> {
        let status = attempted(|| {
            backend()
                .original
                .memory_copy(addr as *mut c_void, src.as_ptr().cast(), src.len())
        });
        if status == HSA_STATUS_SUCCESS {
            Ok(())
        } else {
            Err(copy_failed(addr, src.len(), status))
        }
    }

    fn host_window(&self, addr: u64, len: u64) -> Option<HostWindow> {
        let b = backend();
        let info = b.original.pointer_info(addr as *const c_void)?;
        if !b.host_visible_device_memory(info.agentOwner) {
            return None;
        }
        let host = info.hostBaseAddress as u64;
        let base = info.agentBaseAddress as u64;
        let end = base.checked_add(info.sizeInBytes as u64)?;
        if host == 0 || addr < base || addr.checked_add(len)? > end {
            return None;
        }
        let ptr = (host + (addr - base)) as *mut u8;
        // SAFETY: the runtime reports `hostBaseAddress` as the host-visible address of this live
        // allocation, and [addr, addr+len) lies inside it; the snapshot crate holds the
        // inventory's read side while it uses the window, so the allocation cannot be freed.
        Some(unsafe { HostWindow::new(ptr, len as usize) })
    }

    fn alloc_shadow(&self, agent: u64, size: u64) -> Option<u64> {
        let b = backend();
        if b.auto_store && b.host_visible_device_memory(hsa_agent_t { handle: agent }) {
            // Device memory that is host memory gains nothing from a device shadow, and a fresh
            // shadow costs page faults on every snapshot where the host store is reused: let the
            // automatic choice fall through to the host tier. A forced device tier still gets one.
            return None;
        }
        let pool = b.original.coarse_pool(hsa_agent_t { handle: agent })?;
        let mut ptr: *mut c_void = std::ptr::null_mut();
        let status = b
            .original
            .pool_allocate(pool, usize::try_from(size).ok()?, 0, &mut ptr);
        (status == HSA_STATUS_SUCCESS && !ptr.is_null()).then_some(ptr as u64)
    }

    fn free_shadow(&self, addr: u64, _size: u64) {
        backend().original.pool_free(addr as *mut c_void);
    }

    fn copy_on_device(&self, copies: &[DeviceCopy]) -> Result<(), CopyError> {
        let b = backend();
        // The runtime's copy is thread safe: issue the list from kreplay's pool so copies
        // overlap (on the software runtime each one is a memcpy on the calling thread).
        kreplay_snapshot::pool::map(copies.iter().collect(), |c| {
            let status = attempted(|| {
                b.original
                    .memory_copy(c.dst as *mut c_void, c.src as *const c_void, c.len as usize)
            });
            if status == HSA_STATUS_SUCCESS {
                Ok(())
            } else {
                Err(copy_failed(c.dst, c.len as usize, status))
            }
        })
        .into_iter()
        .collect()
    }
}
