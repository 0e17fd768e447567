//! Runtime allocations: real, zeroed, page-aligned host memory charged to a pool's budget, plus
//! the address map `hsa_amd_pointer_info` answers from.

use crate::api::HsaResult;
use crate::topology::{ALLOC_GRANULE, Topology};
use hsa_sys::{
    HSA_STATUS_ERROR_INVALID_ALLOCATION, HSA_STATUS_ERROR_INVALID_ARGUMENT,
    HSA_STATUS_ERROR_OUT_OF_RESOURCES, HSA_STATUS_ERROR_RESOURCE_FREE,
    hsa_amd_deallocation_callback_t, hsa_status_t,
};
use parking_lot::RwLock;
use std::alloc::Layout;
use std::collections::BTreeMap;

/// How an address range came to be known to the runtime.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Backing {
    /// Allocated from a pool; freed with the pool's budget.
    Pool { pool: usize, charged: u64 },
    /// Application memory registered with `hsa_amd_memory_lock`.
    Locked,
    /// A physical memory handle mapped into a reserved range (`hsa_amd_vmem_map`).
    Vmem { handle: u64 },
}

/// What the address map knows about one range.
#[derive(Debug, Clone)]
pub(crate) struct Allocation {
    pub(crate) base: usize,
    pub(crate) size: usize,
    pub(crate) backing: Backing,
    /// Index of the owning agent.
    pub(crate) owner: usize,
    pub(crate) global_flags: u32,
    pub(crate) user_data: usize,
    /// Agents granted access explicitly (`hsa_amd_agents_allow_access`), by index.
    pub(crate) granted: Vec<usize>,
    /// For a virtual memory mapping: (agent index, `hsa_access_permission_t`) as last set with
    /// `hsa_amd_vmem_set_access`.
    pub(crate) permissions: Vec<(usize, u32)>,
    dealloc_callbacks: Vec<(DeallocCallback, usize)>,
}

type DeallocCallback = unsafe extern "C" fn(*mut std::ffi::c_void, *mut std::ffi::c_void);

/// The address map of one runtime instance.
#[derive(Default)]
pub(crate) struct Memory {
    map: RwLock<BTreeMap<usize, Allocation>>,
    vmem: parking_lot::Mutex<Vmem>,
}

/// The virtual memory API's state: reserved address ranges (inaccessible anonymous mappings),
/// physical memory handles (one memory file each, charged to its pool) and the handles mapped
/// into reserved ranges (shared mappings of the file, so two mappings of one handle see the
/// same bytes, as on ROCm).
#[derive(Default)]
struct Vmem {
    reservations: BTreeMap<usize, usize>,
    handles: std::collections::HashMap<u64, PhysicalHandle>,
    next_handle: u64,
}

struct PhysicalHandle {
    fd: std::os::fd::OwnedFd,
    size: usize,
    pool: usize,
    charged: u64,
    /// Application references (create: 1, retain: +1, release: -1) plus one per mapping; the
    /// memory is returned when both reach zero.
    references: u64,
    mappings: u64,
}

fn layout_for(charged: u64) -> Result<Layout, hsa_status_t> {
    let size = usize::try_from(charged).map_err(|_| HSA_STATUS_ERROR_OUT_OF_RESOURCES)?;
    Layout::from_size_align(size, ALLOC_GRANULE).map_err(|_| HSA_STATUS_ERROR_OUT_OF_RESOURCES)
}

impl Memory {
    /// Allocates `size` bytes from pool `pool`: zeroed, aligned to [`ALLOC_GRANULE`], charged to
    /// the pool's budget rounded up to the granule. More than the budget's limit (the pool's
    /// `ALLOC_MAX_SIZE`) is `HSA_STATUS_ERROR_INVALID_ALLOCATION`; more than what is left of it,
    /// `HSA_STATUS_ERROR_OUT_OF_RESOURCES`.
    pub(crate) fn allocate(
        &self,
        topology: &Topology,
        pool: usize,
        size: usize,
    ) -> Result<*mut u8, hsa_status_t> {
        if size == 0 {
            return Err(HSA_STATUS_ERROR_INVALID_ARGUMENT);
        }
        let p = &topology.pools[pool];
        // More than ALLOC_MAX_SIZE (the budget's limit) can never be allocated: that is an
        // invalid allocation, not a lack of memory now.
        if u64::try_from(size).map_or(true, |size| size > p.budget.limit()) {
            return Err(HSA_STATUS_ERROR_INVALID_ALLOCATION);
        }
        crate::faults::check(crate::faults::Fault::PoolAllocate)?;
        let charged = size
            .checked_next_multiple_of(ALLOC_GRANULE)
            .and_then(|s| u64::try_from(s).ok())
            .ok_or(HSA_STATUS_ERROR_OUT_OF_RESOURCES)?;
        let layout = layout_for(charged)?;
        p.budget.reserve(charged)?;
        // SAFETY: the layout has a non-zero size (size > 0 was checked above).
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        if ptr.is_null() {
            p.budget.release(charged);
            return Err(HSA_STATUS_ERROR_OUT_OF_RESOURCES);
        }
        let base = ptr as usize;
        self.map.write().insert(
            base,
            Allocation {
                base,
                size,
                backing: Backing::Pool { pool, charged },
                owner: p.agent,
                global_flags: p.kind.global_flags(),
                user_data: 0,
                granted: Vec::new(),
                permissions: Vec::new(),
                dealloc_callbacks: Vec::new(),
            },
        );
        Ok(ptr)
    }

    /// Frees a pool allocation by its base address, after running its deallocation callbacks.
    pub(crate) fn free(&self, topology: &Topology, ptr: usize) -> Result<(), hsa_status_t> {
        let allocation = {
            let mut map = self.map.write();
            match map.get(&ptr) {
                Some(a) if matches!(a.backing, Backing::Pool { .. }) => map.remove(&ptr),
                _ => None,
            }
        }
        .ok_or(HSA_STATUS_ERROR_INVALID_ALLOCATION)?;
        release(topology, allocation);
        Ok(())
    }

    /// Registers application memory locked for agent access; the agent pointer is the host
    /// pointer itself because every agent shares the host's address space.
    pub(crate) fn lock(
        &self,
        ptr: usize,
        size: usize,
        owner: usize,
        global_flags: u32,
    ) -> Result<(), hsa_status_t> {
        if ptr == 0 || size == 0 {
            return Err(HSA_STATUS_ERROR_INVALID_ARGUMENT);
        }
        let mut map = self.map.write();
        if let Some(existing) = map.get(&ptr) {
            // Locking the same range again is accepted, as it is reference counted in ROCm.
            return if existing.backing == Backing::Locked {
                Ok(())
            } else {
                Err(HSA_STATUS_ERROR_INVALID_ARGUMENT)
            };
        }
        map.insert(
            ptr,
            Allocation {
                base: ptr,
                size,
                backing: Backing::Locked,
                owner,
                global_flags,
                user_data: 0,
                granted: Vec::new(),
                permissions: Vec::new(),
                dealloc_callbacks: Vec::new(),
            },
        );
        Ok(())
    }

    /// Forgets a range registered by [`Memory::lock`].
    pub(crate) fn unlock(&self, ptr: usize) -> Result<(), hsa_status_t> {
        let mut map = self.map.write();
        match map.get(&ptr) {
            Some(a) if a.backing == Backing::Locked => {
                map.remove(&ptr);
                Ok(())
            }
            _ => Err(HSA_STATUS_ERROR_INVALID_ARGUMENT),
        }
    }

    /// `hsa_amd_vmem_address_reserve`: an inaccessible range of `size` bytes (a multiple of the
    /// allocation granule), at `address` when that range is free.
    pub(crate) fn vmem_reserve(&self, size: usize, address: usize) -> Result<usize, hsa_status_t> {
        if size == 0 || !size.is_multiple_of(ALLOC_GRANULE) {
            return Err(HSA_STATUS_ERROR_INVALID_ARGUMENT);
        }
        // SAFETY: a new anonymous mapping with no access; `address` is only a hint (no
        // MAP_FIXED), so nothing existing is replaced.
        let ptr = unsafe {
            libc::mmap(
                address as *mut libc::c_void,
                size,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(HSA_STATUS_ERROR_OUT_OF_RESOURCES);
        }
        self.vmem.lock().reservations.insert(ptr as usize, size);
        Ok(ptr as usize)
    }

    /// `hsa_amd_vmem_address_free`: the whole reserved range, with nothing mapped in it.
    pub(crate) fn vmem_free(&self, va: usize, size: usize) -> Result<(), hsa_status_t> {
        let mut vmem = self.vmem.lock();
        match vmem.reservations.get(&va) {
            None => return Err(HSA_STATUS_ERROR_INVALID_ALLOCATION),
            Some(&reserved) if reserved != size => return Err(HSA_STATUS_ERROR_INVALID_ARGUMENT),
            Some(_) => {}
        }
        if self.map.read().range(va..va + size).next().is_some() {
            return Err(HSA_STATUS_ERROR_RESOURCE_FREE);
        }
        vmem.reservations.remove(&va);
        // SAFETY: exactly the range `vmem_reserve` mapped, with nothing mapped in it any more.
        unsafe { libc::munmap(va as *mut libc::c_void, size) };
        Ok(())
    }

    /// `hsa_amd_vmem_handle_create`: `size` bytes (a multiple of the granule) of pool `pool`.
    pub(crate) fn vmem_create(
        &self,
        topology: &Topology,
        pool: usize,
        size: usize,
    ) -> Result<u64, hsa_status_t> {
        use std::os::fd::FromRawFd;
        if size == 0 || !size.is_multiple_of(ALLOC_GRANULE) {
            return Err(HSA_STATUS_ERROR_INVALID_ARGUMENT);
        }
        let charged = u64::try_from(size).map_err(|_| HSA_STATUS_ERROR_OUT_OF_RESOURCES)?;
        let budget = &topology.pools[pool].budget;
        budget.reserve(charged)?;
        // SAFETY: a C string literal names the memory file; the flags are valid.
        let fd = unsafe { libc::memfd_create(c"softhsa-vmem".as_ptr(), libc::MFD_CLOEXEC) };
        if fd < 0 {
            budget.release(charged);
            return Err(HSA_STATUS_ERROR_OUT_OF_RESOURCES);
        }
        // SAFETY: `fd` is a new descriptor owned by nobody else.
        let fd = unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) };
        // SAFETY: a valid descriptor; the file is sized once, zero-filled by the kernel.
        if unsafe { libc::ftruncate(std::os::fd::AsRawFd::as_raw_fd(&fd), size as libc::off_t) }
            != 0
        {
            budget.release(charged);
            return Err(HSA_STATUS_ERROR_OUT_OF_RESOURCES);
        }
        let mut vmem = self.vmem.lock();
        vmem.next_handle += 1;
        let handle = vmem.next_handle;
        vmem.handles.insert(
            handle,
            PhysicalHandle {
                fd,
                size,
                pool,
                charged,
                references: 1,
                mappings: 0,
            },
        );
        Ok(handle)
    }

    /// `hsa_amd_vmem_handle_release`: drops one application reference; the memory goes once it
    /// is neither referenced nor mapped.
    pub(crate) fn vmem_release(&self, topology: &Topology, handle: u64) -> HsaResult {
        let mut vmem = self.vmem.lock();
        let h = vmem
            .handles
            .get_mut(&handle)
            .filter(|h| h.references > 0)
            .ok_or(HSA_STATUS_ERROR_INVALID_ALLOCATION)?;
        h.references -= 1;
        drop_unused(&mut vmem, topology, handle);
        Ok(())
    }

    /// `hsa_amd_vmem_retain_alloc_handle`: the handle mapped at `addr`, one reference more.
    pub(crate) fn vmem_retain(&self, addr: usize) -> Result<u64, hsa_status_t> {
        let handle = match self.find(addr).map(|a| a.backing) {
            Some(Backing::Vmem { handle }) => handle,
            _ => return Err(HSA_STATUS_ERROR_INVALID_ALLOCATION),
        };
        let mut vmem = self.vmem.lock();
        let h = vmem
            .handles
            .get_mut(&handle)
            .ok_or(HSA_STATUS_ERROR_INVALID_ALLOCATION)?;
        h.references += 1;
        Ok(handle)
    }

    /// `hsa_amd_vmem_get_alloc_properties_from_handle`: the handle's pool.
    pub(crate) fn vmem_pool(&self, handle: u64) -> Result<usize, hsa_status_t> {
        self.vmem
            .lock()
            .handles
            .get(&handle)
            .map(|h| h.pool)
            .ok_or(HSA_STATUS_ERROR_INVALID_ALLOCATION)
    }

    /// `hsa_amd_vmem_map`: the whole handle at `va`, inside one reservation, over nothing else
    /// mapped. The range becomes an allocation of the handle's pool's agent.
    pub(crate) fn vmem_map(
        &self,
        topology: &Topology,
        va: usize,
        size: usize,
        offset: usize,
        handle: u64,
    ) -> HsaResult {
        use std::os::fd::AsRawFd;
        let mut vmem = self.vmem.lock();
        let inside = vmem
            .reservations
            .range(..=va)
            .next_back()
            .is_some_and(|(&base, &len)| va.checked_add(size).is_some_and(|end| end <= base + len));
        let h = vmem
            .handles
            .get_mut(&handle)
            .ok_or(HSA_STATUS_ERROR_INVALID_ALLOCATION)?;
        if !inside || size != h.size || offset != 0 {
            return Err(HSA_STATUS_ERROR_INVALID_ARGUMENT);
        }
        let mut map = self.map.write();
        if map
            .range(..va + size)
            .next_back()
            .is_some_and(|(_, a)| a.base + a.size > va)
        {
            return Err(HSA_STATUS_ERROR_INVALID_ARGUMENT);
        }
        // SAFETY: [va, va+size) lies inside a reservation of ours (checked) with nothing mapped
        // in it (checked), so MAP_FIXED replaces only our own inaccessible pages.
        let ptr = unsafe {
            libc::mmap(
                va as *mut libc::c_void,
                size,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_FIXED,
                h.fd.as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(HSA_STATUS_ERROR_OUT_OF_RESOURCES);
        }
        h.mappings += 1;
        let p = &topology.pools[h.pool];
        map.insert(
            va,
            Allocation {
                base: va,
                size,
                backing: Backing::Vmem { handle },
                owner: p.agent,
                global_flags: p.kind.global_flags(),
                user_data: 0,
                granted: Vec::new(),
                permissions: Vec::new(),
                dealloc_callbacks: Vec::new(),
            },
        );
        Ok(())
    }

    /// `hsa_amd_vmem_unmap`: the mapping at `va` (its whole size) goes back to reserved.
    pub(crate) fn vmem_unmap(&self, topology: &Topology, va: usize, size: usize) -> HsaResult {
        let mut vmem = self.vmem.lock();
        let handle = {
            let mut map = self.map.write();
            let handle = match map.get(&va) {
                Some(a) if a.size != size => return Err(HSA_STATUS_ERROR_INVALID_ARGUMENT),
                Some(Allocation {
                    backing: Backing::Vmem { handle },
                    ..
                }) => *handle,
                _ => return Err(HSA_STATUS_ERROR_INVALID_ALLOCATION),
            };
            map.remove(&va);
            handle
        };
        // SAFETY: [va, va+size) is a mapping of ours inside a reservation; it becomes an
        // inaccessible anonymous range again (MAP_FIXED over our own pages).
        unsafe {
            libc::mmap(
                va as *mut libc::c_void,
                size,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE | libc::MAP_FIXED,
                -1,
                0,
            )
        };
        if let Some(h) = vmem.handles.get_mut(&handle) {
            h.mappings -= 1;
        }
        drop_unused(&mut vmem, topology, handle);
        Ok(())
    }

    /// The allocation containing `addr`, if any.
    pub(crate) fn find(&self, addr: usize) -> Option<Allocation> {
        let map = self.map.read();
        let (_, a) = map.range(..=addr).next_back()?;
        (addr - a.base < a.size).then(|| a.clone())
    }

    /// Applies `f` to the allocation containing `addr`.
    pub(crate) fn update(
        &self,
        addr: usize,
        f: impl FnOnce(&mut Allocation),
    ) -> Result<(), hsa_status_t> {
        let mut map = self.map.write();
        let (_, a) = map
            .range_mut(..=addr)
            .next_back()
            .ok_or(HSA_STATUS_ERROR_INVALID_ARGUMENT)?;
        if addr - a.base >= a.size {
            return Err(HSA_STATUS_ERROR_INVALID_ARGUMENT);
        }
        f(a);
        Ok(())
    }

    /// Adds a deallocation callback to the allocation containing `addr`.
    pub(crate) fn add_dealloc_callback(
        &self,
        addr: usize,
        callback: hsa_amd_deallocation_callback_t,
        user_data: usize,
    ) -> Result<(), hsa_status_t> {
        let callback = callback.ok_or(HSA_STATUS_ERROR_INVALID_ARGUMENT)?;
        self.update(addr, |a| a.dealloc_callbacks.push((callback, user_data)))
    }

    /// Removes a deallocation callback; `HSA_STATUS_ERROR_INVALID_ARGUMENT` if it was not there.
    pub(crate) fn remove_dealloc_callback(
        &self,
        addr: usize,
        callback: hsa_amd_deallocation_callback_t,
    ) -> Result<(), hsa_status_t> {
        let callback = callback.ok_or(HSA_STATUS_ERROR_INVALID_ARGUMENT)?;
        let mut found = false;
        self.update(addr, |a| {
            if let Some(pos) = a
                .dealloc_callbacks
                .iter()
                .position(|(cb, _)| std::ptr::fn_addr_eq(*cb, callback))
            {
                a.dealloc_callbacks.remove(pos);
                found = true;
            }
        })?;
        if found {
            Ok(())
        } else {
            Err(HSA_STATUS_ERROR_INVALID_ARGUMENT)
        }
    }

    /// Frees every remaining pool allocation (runtime teardown).
    pub(crate) fn free_all(&self, topology: &Topology) {
        let all = std::mem::take(&mut *self.map.write());
        for (_, allocation) in all {
            release(topology, allocation);
        }
        let vmem = std::mem::take(&mut *self.vmem.lock());
        for (va, size) in vmem.reservations {
            // SAFETY: a range `vmem_reserve` mapped; the runtime is going away and nothing may
            // use its memory any more.
            unsafe { libc::munmap(va as *mut libc::c_void, size) };
        }
        for h in vmem.handles.into_values() {
            topology.pools[h.pool].budget.release(h.charged);
        }
    }
}

/// Returns a handle's memory and budget once it is neither referenced nor mapped.
fn drop_unused(vmem: &mut Vmem, topology: &Topology, handle: u64) {
    if vmem
        .handles
        .get(&handle)
        .is_some_and(|h| h.references == 0 && h.mappings == 0)
        && let Some(h) = vmem.handles.remove(&handle)
    {
        topology.pools[h.pool].budget.release(h.charged);
    }
}

/// Runs the deallocation callbacks, then returns the memory and its budget.
fn release(topology: &Topology, allocation: Allocation) {
    for (callback, user_data) in &allocation.dealloc_callbacks {
        // SAFETY: the application registered this callback for this allocation; the contract of
        // hsa_amd_register_deallocation_callback is that it is called with (base, user_data).
        unsafe { callback(allocation.base as *mut _, *user_data as *mut _) };
    }
    if let Backing::Pool { pool, charged } = allocation.backing {
        if let Ok(layout) = layout_for(charged) {
            // SAFETY: `base` came from alloc_zeroed with exactly this layout and is removed from
            // the map, so it is freed once.
            unsafe { std::alloc::dealloc(allocation.base as *mut u8, layout) };
        }
        topology.pools[pool].budget.release(charged);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::SoftHsaConfig;

    fn topology(vram: u64) -> Topology {
        Topology::new(&SoftHsaConfig {
            gpu_agents: 1,
            vram_bytes_per_agent: vram,
            ..SoftHsaConfig::default()
        })
    }

    #[test]
    fn allocations_are_zeroed_aligned_and_found_by_interior_pointers() {
        let t = topology(1 << 20);
        let m = Memory::default();
        let coarse = t.agents[1].pools[0];
        let p = m.allocate(&t, coarse, 100).unwrap();
        assert_eq!(p as usize % ALLOC_GRANULE, 0);
        // SAFETY: p points to 100 readable bytes.
        let bytes = unsafe { std::slice::from_raw_parts(p, 100) };
        assert!(bytes.iter().all(|&b| b == 0));
        let a = m.find(p as usize + 99).unwrap();
        assert_eq!((a.base, a.size, a.owner), (p as usize, 100, 1));
        assert!(m.find(p as usize + 100).is_none());
        m.free(&t, p as usize).unwrap();
        assert!(m.find(p as usize).is_none());
        assert_eq!(
            m.free(&t, p as usize),
            Err(HSA_STATUS_ERROR_INVALID_ALLOCATION)
        );
    }

    #[test]
    fn the_budget_is_a_limit_charged_in_granules() {
        let t = topology(3 * ALLOC_GRANULE as u64);
        let m = Memory::default();
        let coarse = t.agents[1].pools[0];
        let fine = t.agents[1].pools[1];
        let a = m.allocate(&t, coarse, 1).unwrap();
        let b = m.allocate(&t, fine, ALLOC_GRANULE + 1).unwrap();
        assert_eq!(
            m.allocate(&t, coarse, 1),
            Err(HSA_STATUS_ERROR_OUT_OF_RESOURCES),
            "coarse and fine VRAM share the agent's budget"
        );
        m.free(&t, b as usize).unwrap();
        let c = m.allocate(&t, coarse, 2 * ALLOC_GRANULE).unwrap();
        m.free_all(&t);
        let _ = (a, c);
        assert_eq!(
            m.allocate(&t, coarse, 0),
            Err(HSA_STATUS_ERROR_INVALID_ARGUMENT)
        );
    }
}
