//! Runtime allocations: real, zeroed, page-aligned host memory charged to a pool's budget, plus
//! the address map `hsa_amd_pointer_info` answers from.

use crate::topology::{ALLOC_GRANULE, Topology};
use hsa_sys::{
    HSA_STATUS_ERROR_INVALID_ALLOCATION, HSA_STATUS_ERROR_INVALID_ARGUMENT,
    HSA_STATUS_ERROR_OUT_OF_RESOURCES, hsa_amd_deallocation_callback_t, hsa_status_t,
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
    dealloc_callbacks: Vec<(DeallocCallback, usize)>,
}

type DeallocCallback = unsafe extern "C" fn(*mut std::ffi::c_void, *mut std::ffi::c_void);

/// The address map of one runtime instance.
#[derive(Default)]
pub(crate) struct Memory {
    map: RwLock<BTreeMap<usize, Allocation>>,
}

fn layout_for(charged: u64) -> Result<Layout, hsa_status_t> {
    let size = usize::try_from(charged).map_err(|_| HSA_STATUS_ERROR_OUT_OF_RESOURCES)?;
    Layout::from_size_align(size, ALLOC_GRANULE).map_err(|_| HSA_STATUS_ERROR_OUT_OF_RESOURCES)
}

impl Memory {
    /// Allocates `size` bytes from pool `pool`: zeroed, aligned to [`ALLOC_GRANULE`], charged to
    /// the pool's budget rounded up to the granule.
    pub(crate) fn allocate(
        &self,
        topology: &Topology,
        pool: usize,
        size: usize,
    ) -> Result<*mut u8, hsa_status_t> {
        if size == 0 {
            return Err(HSA_STATUS_ERROR_INVALID_ARGUMENT);
        }
        let charged = size
            .checked_next_multiple_of(ALLOC_GRANULE)
            .and_then(|s| u64::try_from(s).ok())
            .ok_or(HSA_STATUS_ERROR_OUT_OF_RESOURCES)?;
        let p = &topology.pools[pool];
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
