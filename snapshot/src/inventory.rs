//! The allocation inventory: which device allocations exist right now, fed by a backend's
//! alloc/free hooks, and the filters that pick the allocations a replay must snapshot.

use std::collections::BTreeMap;
use std::fmt;

use parking_lot::{RwLock, RwLockReadGuard};
use smallvec::SmallVec;

/// What kind of memory an allocation is. Only [`MemoryKind::CoarseDevice`] is ever snapshotted
/// (SPEC §3 rule 3); the other kinds are tracked so lookups and frees stay exact.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum MemoryKind {
    /// Coarse-grained device memory (VRAM): the only kind a replay snapshots.
    CoarseDevice,
    /// Fine-grained device memory, coherent with the host or peers while a kernel runs.
    FineDevice,
    /// Kernel argument memory.
    Kernarg,
    /// Host (system) memory made visible to the device.
    Host,
    /// Code objects and other executable memory.
    Executable,
}

impl MemoryKind {
    /// Every kind, in declaration order.
    pub const ALL: [MemoryKind; 5] = [
        MemoryKind::CoarseDevice,
        MemoryKind::FineDevice,
        MemoryKind::Kernarg,
        MemoryKind::Host,
        MemoryKind::Executable,
    ];

    /// A short snake_case name (`coarse_device`, `fine_device`, `kernarg`, `host`, `executable`).
    pub fn as_str(self) -> &'static str {
        match self {
            MemoryKind::CoarseDevice => "coarse_device",
            MemoryKind::FineDevice => "fine_device",
            MemoryKind::Kernarg => "kernarg",
            MemoryKind::Host => "host",
            MemoryKind::Executable => "executable",
        }
    }

    /// Whether a replay snapshot may include this kind: coarse-grained device memory only.
    pub fn is_snapshot_eligible(self) -> bool {
        self == MemoryKind::CoarseDevice
    }

    const fn bit(self) -> u8 {
        1 << (self as u8)
    }
}

impl fmt::Display for MemoryKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A set of [`MemoryKind`]s (a small bitset).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct KindSet(u8);

impl KindSet {
    /// No kind at all.
    pub const EMPTY: KindSet = KindSet(0);
    /// Every kind.
    pub const ALL: KindSet = KindSet(0b1_1111);

    /// The set holding just `kind`.
    pub const fn only(kind: MemoryKind) -> Self {
        KindSet(kind.bit())
    }

    /// This set plus `kind`.
    pub const fn with(self, kind: MemoryKind) -> Self {
        KindSet(self.0 | kind.bit())
    }

    /// Whether `kind` is in the set.
    pub const fn contains(self, kind: MemoryKind) -> bool {
        self.0 & kind.bit() != 0
    }
}

impl fmt::Debug for KindSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_set()
            .entries(MemoryKind::ALL.iter().filter(|k| self.contains(**k)))
            .finish()
    }
}

/// One tracked allocation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Allocation {
    /// First byte (a device address).
    pub base: u64,
    /// Length in bytes.
    pub size: u64,
    /// The agent that owns the memory (a backend's agent handle).
    pub owner_agent: u64,
    /// What kind of memory it is.
    pub kind: MemoryKind,
    /// Monotonic id of this allocation within its inventory: an address reused after a free
    /// gets a new, larger generation, so it is never mistaken for the freed allocation.
    pub generation: u64,
}

impl Allocation {
    /// One past the last byte (saturating at `u64::MAX`).
    pub fn end(&self) -> u64 {
        self.base.saturating_add(self.size)
    }

    /// Whether `addr` lies inside the allocation.
    pub fn contains(&self, addr: u64) -> bool {
        addr >= self.base && addr < self.end()
    }

    /// The region (base, size, generation) a snapshot of this allocation covers.
    pub fn region(&self) -> Region {
        Region {
            base: self.base,
            size: self.size,
            generation: self.generation,
        }
    }
}

/// A contiguous range of device memory belonging to one allocation generation: what a selection
/// yields and what a snapshot holds a copy of.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Region {
    /// First byte (a device address).
    pub base: u64,
    /// Length in bytes.
    pub size: u64,
    /// The generation of the allocation the region was taken from.
    pub generation: u64,
}

/// Which allocations a snapshot covers.
///
/// [`Filter::for_replay`] is the rule of SPEC §3 (rules 2 and 3): the dispatch's agent only,
/// coarse-grained device memory only.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Filter {
    owner_agent: Option<u64>,
    kinds: KindSet,
    required: SmallVec<[u64; 4]>,
}

impl Filter {
    /// Every tracked allocation, whatever its agent or kind.
    pub fn any() -> Self {
        Filter {
            owner_agent: None,
            kinds: KindSet::ALL,
            required: SmallVec::new(),
        }
    }

    /// The replay rule: allocations owned by `agent` that are coarse-grained device memory.
    pub fn for_replay(agent: u64) -> Self {
        Filter::any()
            .owner(agent)
            .kinds(KindSet::only(MemoryKind::CoarseDevice))
    }

    /// Keep only allocations owned by `agent`.
    pub fn owner(mut self, agent: u64) -> Self {
        self.owner_agent = Some(agent);
        self
    }

    /// Keep only allocations of these kinds.
    pub fn kinds(mut self, kinds: KindSet) -> Self {
        self.kinds = kinds;
        self
    }

    /// Require `addr` (an address the dispatch is known to use) to lie inside some tracked
    /// allocation; planning fails with `untracked_memory` when it does not. An address inside an
    /// allocation the filter excludes (another agent's, fine-grained, ...) is fine.
    pub fn require(mut self, addr: u64) -> Self {
        self.required.push(addr);
        self
    }

    /// Whether `allocation` is selected by this filter.
    pub fn matches(&self, allocation: &Allocation) -> bool {
        self.owner_agent.is_none_or(|a| a == allocation.owner_agent)
            && self.kinds.contains(allocation.kind)
    }

    /// The owner agent this filter is restricted to, if any.
    pub fn agent(&self) -> Option<u64> {
        self.owner_agent
    }

    /// The addresses given to [`Filter::require`].
    pub fn required(&self) -> &[u64] {
        &self.required
    }
}

#[derive(Debug)]
struct Table {
    by_base: BTreeMap<u64, Allocation>,
    next_generation: u64,
}

impl Table {
    fn containing(&self, addr: u64) -> Option<&Allocation> {
        self.by_base
            .range(..=addr)
            .next_back()
            .map(|(_, a)| a)
            .filter(|a| a.contains(addr))
    }

    fn select(&self, filter: &Filter) -> Vec<Region> {
        self.by_base
            .values()
            .filter(|a| a.size > 0 && filter.matches(a))
            .map(Allocation::region)
            .collect()
    }

    fn is_live(&self, region: &Region) -> bool {
        self.by_base
            .get(&region.base)
            .is_some_and(|a| a.generation == region.generation)
    }
}

/// The set of live allocations, fed by a backend's alloc/free hooks. Thread-safe.
///
/// Allocations are kept in an ordered map behind one reader/writer lock: `on_alloc` and
/// `on_free` take the write side for a map insert/remove (O(log n), no I/O, no allocation beyond
/// the map node), lookups take the read side. Snapshot and restore copies hold the read side for
/// their whole duration, so a free from another thread waits until the copy is done and can
/// never race a write into freed memory.
///
/// ```
/// use kreplay_snapshot::{Filter, Inventory, MemoryKind};
///
/// static INVENTORY: Inventory = Inventory::new();
/// let g1 = INVENTORY.on_alloc(0x1000, 0x100, 7, MemoryKind::CoarseDevice);
/// assert_eq!(INVENTORY.lookup(0x1080).unwrap().generation, g1);
/// INVENTORY.on_free(0x1000);
/// let g2 = INVENTORY.on_alloc(0x1000, 0x100, 7, MemoryKind::CoarseDevice);
/// assert!(g2 > g1); // same address, different allocation
/// assert_eq!(INVENTORY.select(&Filter::for_replay(7)).len(), 1);
/// ```
#[derive(Debug)]
pub struct Inventory {
    table: RwLock<Table>,
}

impl Default for Inventory {
    fn default() -> Self {
        Inventory::new()
    }
}

impl Inventory {
    /// An empty inventory. `const`, so a backend can keep one in a `static`.
    pub const fn new() -> Self {
        Inventory {
            table: RwLock::new(Table {
                by_base: BTreeMap::new(),
                next_generation: 1,
            }),
        }
    }

    /// Record a new allocation and return its generation (starting at 1, strictly increasing).
    ///
    /// A runtime never hands out overlapping live allocations, so any tracked allocation that
    /// overlaps the new one must have been freed without the free being seen: it is dropped and
    /// will never be snapshotted or restored into.
    pub fn on_alloc(&self, base: u64, size: u64, owner_agent: u64, kind: MemoryKind) -> u64 {
        let mut table = self.table.write();
        let generation = table.next_generation;
        table.next_generation += 1;
        let end = base.saturating_add(size);
        // Stale entries overlapping [base, end): the one starting at or below base, and any
        // starting inside the new range.
        let mut stale: SmallVec<[u64; 2]> = SmallVec::new();
        if let Some((&b, a)) = table.by_base.range(..=base).next_back()
            && (b == base || a.end() > base)
        {
            stale.push(b);
        }
        if end > base {
            stale.extend(
                table
                    .by_base
                    .range(base.saturating_add(1)..end)
                    .map(|(&b, _)| b),
            );
        }
        for b in stale {
            table.by_base.remove(&b);
        }
        table.by_base.insert(
            base,
            Allocation {
                base,
                size,
                owner_agent,
                kind,
                generation,
            },
        );
        generation
    }

    /// Forget the allocation that starts at `base`. Returns it, or `None` when no tracked
    /// allocation starts there (memory allocated before tracking began, or a double free).
    ///
    /// Waits while a snapshot or restore copy is in progress.
    pub fn on_free(&self, base: u64) -> Option<Allocation> {
        self.table.write().by_base.remove(&base)
    }

    /// The live allocation containing `addr`, if any.
    pub fn lookup(&self, addr: u64) -> Option<Allocation> {
        self.table.read().containing(addr).copied()
    }

    /// The live allocation starting exactly at `base`, if any.
    pub fn get(&self, base: u64) -> Option<Allocation> {
        self.table.read().by_base.get(&base).copied()
    }

    /// Whether `region` still belongs to a live allocation of the same generation.
    pub fn is_live(&self, region: &Region) -> bool {
        self.table.read().is_live(region)
    }

    /// Number of live allocations.
    pub fn len(&self) -> usize {
        self.table.read().by_base.len()
    }

    /// Whether no allocation is tracked.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The regions of every live, non-empty allocation the filter selects, sorted by base.
    /// (Required addresses are checked by planning, not here.)
    pub fn select(&self, filter: &Filter) -> Vec<Region> {
        self.table.read().select(filter)
    }

    /// Snapshot planning: the selection plus the first required address that lies in no
    /// tracked allocation.
    pub(crate) fn select_checked(&self, filter: &Filter) -> Result<Vec<Region>, u64> {
        let table = self.table.read();
        if let Some(&addr) = filter
            .required()
            .iter()
            .find(|&&addr| table.containing(addr).is_none())
        {
            return Err(addr);
        }
        Ok(table.select(filter))
    }

    /// Hold the read side: frees wait until the returned guard drops.
    pub(crate) fn pin(&self) -> Pinned<'_> {
        Pinned {
            table: self.table.read(),
        }
    }
}

/// The inventory's read side, held across a copy so that no free can run meanwhile.
pub(crate) struct Pinned<'a> {
    table: RwLockReadGuard<'a, Table>,
}

impl Pinned<'_> {
    pub(crate) fn is_live(&self, region: &Region) -> bool {
        self.table.is_live(region)
    }
}
