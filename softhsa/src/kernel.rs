//! Host kernels: the process-wide kernel registry and the per-work-group view a kernel receives.

use parking_lot::RwLock;

/// A host kernel. It is called once per work-group of a dispatch; work-groups of one dispatch may
/// run in parallel on different threads, so a kernel must only touch memory its work-group owns
/// (or use atomics).
pub type KernelFn = fn(&WorkGroup);

/// What one invocation of a [`KernelFn`] sees: its work-group id, the dispatch geometry and the
/// kernel argument block of the dispatch packet.
#[derive(Debug, Clone, Copy)]
pub struct WorkGroup {
    group_id: [u32; 3],
    workgroup_size: [u32; 3],
    grid_size: [u32; 3],
    kernarg: *const u8,
    /// The dispatch's counter events (`crate::counters`), or null when it is not counted.
    events: *const crate::counters::DispatchEvents,
}

impl WorkGroup {
    /// Builds the view of one work-group (the packet processor does this for every group).
    pub(crate) fn new(
        group_id: [u32; 3],
        workgroup_size: [u32; 3],
        grid_size: [u32; 3],
        kernarg: *const u8,
    ) -> Self {
        Self {
            group_id,
            workgroup_size,
            grid_size,
            kernarg,
            events: std::ptr::null(),
        }
    }

    /// The same view, reporting counter events to `events` (null: not counted).
    pub(crate) fn with_events(self, events: *const crate::counters::DispatchEvents) -> Self {
        Self { events, ..self }
    }

    pub(crate) fn events_ptr(&self) -> *const crate::counters::DispatchEvents {
        self.events
    }

    /// The id of this work-group in each dimension.
    pub fn group_id(&self) -> [u32; 3] {
        self.group_id
    }

    /// The work-group size of the dispatch (work-items per group in each dimension).
    pub fn workgroup_size(&self) -> [u32; 3] {
        self.workgroup_size
    }

    /// The grid size of the dispatch (work-items in each dimension).
    pub fn grid_size(&self) -> [u32; 3] {
        self.grid_size
    }

    /// The dispatch packet's `kernarg_address` (may be null).
    pub fn kernarg_ptr(&self) -> *const u8 {
        self.kernarg
    }

    /// Reads the kernel argument block as a `T` (unaligned read).
    ///
    /// Panics (which the packet processor reports as a queue error) when the dispatch has no
    /// kernel argument block.
    ///
    /// # Safety
    /// The caller asserts that the dispatch's kernel argument block holds a valid `T`.
    pub unsafe fn kernargs<T: Copy>(&self) -> T {
        assert!(
            !self.kernarg.is_null(),
            "kernel expects arguments but kernarg_address is null"
        );
        // SAFETY: non-null, and the caller asserts the block holds a valid T; the read is
        // unaligned because AQL only promises 16-byte alignment of the block.
        unsafe { std::ptr::read_unaligned(self.kernarg.cast::<T>()) }
    }

    /// The flat global `[x, y, z]` ids of this group's work-items, clipped to the grid, x fastest.
    pub fn work_items(&self) -> impl Iterator<Item = [u32; 3]> + use<> {
        let range = |d: usize| {
            let start = u64::from(self.group_id[d]) * u64::from(self.workgroup_size[d]);
            let end = (start + u64::from(self.workgroup_size[d])).min(u64::from(self.grid_size[d]));
            // Both bounds fit in u32 because they are clipped to the u32 grid size.
            (start.min(end) as u32)..(end as u32)
        };
        let (xs, ys, zs) = (range(0), range(1), range(2));
        zs.flat_map(move |z| {
            let xs = xs.clone();
            ys.clone()
                .flat_map(move |y| xs.clone().map(move |x| [x, y, z]))
        })
    }
}

/// Tag in the high bits of every kernel object handed out, so a stray integer is unlikely to name
/// a registered kernel and the low bits index the registry.
const KERNEL_OBJECT_TAG: u64 = 0x6b72_0000_0000_0000;
const KERNEL_OBJECT_INDEX_MASK: u64 = 0x0000_ffff_ffff_ffff;

struct Registered {
    name: &'static str,
    f: KernelFn,
}

static KERNELS: RwLock<Vec<Registered>> = RwLock::new(Vec::new());

/// Registers a host kernel and returns the non-zero `kernel_object` value to put in dispatch
/// packets. Registering the same name with the same function again returns the same value.
pub fn register_kernel(name: &'static str, f: KernelFn) -> u64 {
    let mut kernels = KERNELS.write();
    let index = match kernels
        .iter()
        .position(|k| k.name == name && std::ptr::fn_addr_eq(k.f, f))
    {
        Some(index) => index,
        None => {
            kernels.push(Registered { name, f });
            kernels.len() - 1
        }
    };
    KERNEL_OBJECT_TAG | index as u64
}

/// The name a kernel object was registered under, or `None` if it names no registered kernel.
pub fn kernel_name(kernel_object: u64) -> Option<&'static str> {
    let index = registry_index(kernel_object)?;
    KERNELS.read().get(index).map(|k| k.name)
}

/// The kernel function behind a kernel object.
pub(crate) fn lookup_kernel(kernel_object: u64) -> Option<KernelFn> {
    let index = registry_index(kernel_object)?;
    KERNELS.read().get(index).map(|k| k.f)
}

fn registry_index(kernel_object: u64) -> Option<usize> {
    if kernel_object & !KERNEL_OBJECT_INDEX_MASK != KERNEL_OBJECT_TAG {
        return None;
    }
    usize::try_from(kernel_object & KERNEL_OBJECT_INDEX_MASK).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn noop(_: &WorkGroup) {}
    /// Not empty: an optimized build merges identical functions into one address, and the
    /// registry tells kernels apart by their function.
    fn other(g: &WorkGroup) {
        std::hint::black_box(g.group_id());
    }

    #[test]
    fn registering_twice_returns_the_same_nonzero_object() {
        let a = register_kernel("kernel_unit_noop", noop);
        let b = register_kernel("kernel_unit_noop", noop);
        assert_ne!(a, 0);
        assert_eq!(a, b);
        assert_eq!(kernel_name(a), Some("kernel_unit_noop"));
        let c = register_kernel("kernel_unit_noop", other);
        assert_ne!(
            a, c,
            "a different function under the same name is a new kernel"
        );
    }

    #[test]
    fn unknown_kernel_objects_have_no_name() {
        assert_eq!(kernel_name(0), None);
        assert_eq!(kernel_name(12345), None);
        assert_eq!(kernel_name(KERNEL_OBJECT_TAG | 0xffff_ffff), None);
    }

    #[test]
    fn work_items_are_clipped_to_the_grid() {
        let wg = WorkGroup::new([1, 0, 0], [4, 2, 1], [6, 1, 1], std::ptr::null());
        let items: Vec<_> = wg.work_items().collect();
        assert_eq!(items, vec![[4, 0, 0], [5, 0, 0]]);
        let wg = WorkGroup::new([0, 1, 0], [2, 2, 1], [2, 4, 1], std::ptr::null());
        let items: Vec<_> = wg.work_items().collect();
        assert_eq!(items, vec![[0, 2, 0], [1, 2, 0], [0, 3, 0], [1, 3, 0]]);
    }
}
