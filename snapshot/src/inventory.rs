//! The allocation inventory: which device allocations exist right now, fed by a backend's
//! alloc/free hooks, and the filters that pick the allocations a replay must snapshot.

use std::collections::BTreeMap;
use std::fmt;

use parking_lot::{Mutex, RwLock, RwLockReadGuard, RwLockWriteGuard};
use smallvec::SmallVec;

use crate::source::RegionSource;

/// What kind of memory an allocation is. The owner-agent rule selects
/// [`MemoryKind::CoarseDevice`] only; an address the dispatch uses reaches every kind but
/// [`MemoryKind::Executable`], which is never snapshotted.
///
/// `#[non_exhaustive]`: a match outside this crate needs a wildcard arm.
///
/// ```
/// use kreplay_snapshot::MemoryKind;
///
/// fn device_side(kind: MemoryKind) -> bool {
///     match kind {
///         MemoryKind::CoarseDevice | MemoryKind::FineDevice => true,
///         _ => false,
///     }
/// }
/// assert!(device_side(MemoryKind::CoarseDevice));
/// ```
///
/// ```compile_fail
/// use kreplay_snapshot::MemoryKind;
///
/// fn device_side(kind: MemoryKind) -> bool {
///     match kind {
///         MemoryKind::CoarseDevice | MemoryKind::FineDevice => true,
///         MemoryKind::Kernarg | MemoryKind::Host | MemoryKind::Executable => false,
///     }
/// }
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum MemoryKind {
    /// Coarse-grained device memory (VRAM): the kind the owner-agent rule snapshots.
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

    /// Whether the owner-agent rule ([`Filter::for_replay`]) selects this kind: coarse-grained
    /// device memory only.
    pub fn is_snapshot_eligible(self) -> bool {
        self == MemoryKind::CoarseDevice
    }

    /// Whether a snapshot may ever include this kind, when an address the dispatch uses points
    /// into it ([`Filter::reach`]): every kind but executable memory.
    pub fn is_reachable(self) -> bool {
        self != MemoryKind::Executable
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

/// An allocation a backend's alloc hook reports to [`Inventory::on_alloc`]: named fields, so
/// the base, the size and the owner can never be passed in the wrong order.
///
/// ```
/// use kreplay_snapshot::{Inventory, MemoryKind, NewAllocation};
///
/// let inventory = Inventory::new();
/// inventory.on_alloc(NewAllocation {
///     base: 0x1000,
///     size: 0x100,
///     owner_agent: 7,
///     kind: MemoryKind::CoarseDevice,
/// });
/// assert_eq!(inventory.lookup(0x10ff).unwrap().size, 0x100);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct NewAllocation {
    /// First byte (a device address).
    pub base: u64,
    /// Length in bytes.
    pub size: u64,
    /// The agent that owns the memory (a backend's agent handle).
    pub owner_agent: u64,
    /// What kind of memory it is.
    pub kind: MemoryKind,
}

/// One tracked allocation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
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
    ///
    /// Generation 0 is never handed out by an inventory: it marks a region outside the inventory
    /// that a caller vouches for ([`Filter::vouch`]).
    pub fn region(&self) -> Region {
        Region {
            base: self.base,
            size: self.size,
            generation: self.generation,
        }
    }
}

/// A contiguous range of device memory belonging to one allocation generation: what a selection
/// yields and what a snapshot holds a copy of. Generation 0: a range outside the inventory that
/// the caller vouched for ([`Filter::vouch`]), live for the whole snapshot.
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
/// [`Filter::for_replay`] is the owner-agent rule of docs/abi.md §3: the dispatch's agent
/// only, coarse-grained device memory only. [`Filter::reach`] adds the allocation an address points into, whatever
/// its owner or kind (executable memory excepted), and [`Filter::vouch`] a range outside the
/// inventory (a module-scope variable); each selected region remembers its [`RegionSource`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Filter {
    owner_agent: Option<u64>,
    kinds: KindSet,
    required: SmallVec<[u64; 4]>,
    reached: SmallVec<[(u64, RegionSource); 8]>,
    vouched: Vec<(u64, u64, RegionSource)>,
}

impl Filter {
    /// Every tracked allocation, whatever its agent or kind.
    pub fn any() -> Self {
        Filter {
            owner_agent: None,
            kinds: KindSet::ALL,
            required: SmallVec::new(),
            reached: SmallVec::new(),
            vouched: Vec::new(),
        }
    }

    /// Nothing by the owner-agent rule, but restricted to `agent` (where a device shadow goes):
    /// the start of a selection made only of [`reach`](Filter::reach) and
    /// [`vouch`](Filter::vouch) entries.
    pub fn referenced_only(agent: u64) -> Self {
        Filter::any().owner(agent).kinds(KindSet::EMPTY)
    }

    /// Select the tracked allocation containing `addr`, whatever its owner agent or kind, except
    /// executable memory (never snapshotted), labelled `source` unless the owner-agent rule
    /// already selects it. Planning fails with `untracked_memory` when no tracked allocation
    /// contains `addr`.
    pub fn reach(mut self, addr: u64, source: RegionSource) -> Self {
        self.reached.push((addr, source));
        self
    }

    /// Select `size` bytes at `base`, a range the inventory does not hold (e.g. a module-scope
    /// variable inside loaded code), labelled `source`. The caller vouches that the range stays
    /// valid memory for the life of the snapshot. Bytes an allocation the filter selects, or
    /// another vouched range, already covers are not selected twice: vouched ranges that
    /// overlap are merged, and the part of one inside a selected allocation is left to it.
    pub fn vouch(mut self, base: u64, size: u64, source: RegionSource) -> Self {
        if size > 0 {
            self.vouched.push((base, size, source));
        }
        self
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

    /// The addresses given to [`Filter::reach`], in the order given.
    pub fn reached(&self) -> impl Iterator<Item = u64> + '_ {
        self.reached.iter().map(|&(addr, _)| addr)
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

    /// Entries overlapping [base, end): the one starting at or below `base` (if it reaches past
    /// it, or starts exactly there) and every one starting inside the range. An empty range
    /// overlaps nothing.
    fn overlapping(&self, base: u64, end: u64) -> impl Iterator<Item = &Allocation> {
        let below = self
            .by_base
            .range(..=base)
            .next_back()
            .map(|(_, a)| a)
            .filter(move |a| end > base && (a.base == base || a.end() > base));
        let inside = (end > base)
            .then(|| {
                self.by_base
                    .range(base.saturating_add(1)..end)
                    .map(|(_, a)| a)
            })
            .into_iter()
            .flatten();
        below.into_iter().chain(inside)
    }

    /// Drops the entries overlapping [base, end); returns how many.
    fn remove_overlapping(&mut self, base: u64, end: u64) -> usize {
        let stale: SmallVec<[u64; 2]> = self.overlapping(base, end).map(|a| a.base).collect();
        for b in &stale {
            self.by_base.remove(b);
        }
        stale.len()
    }

    fn select(&self, filter: &Filter) -> Vec<Region> {
        self.by_base
            .values()
            .filter(|a| a.size > 0 && filter.matches(a))
            .map(Allocation::region)
            .collect()
    }

    fn is_live(&self, region: &Region) -> bool {
        region.generation == 0
            || self
                .by_base
                .get(&region.base)
                .is_some_and(|a| a.generation == region.generation)
    }

    /// The owner-agent selection, then the reached allocations, then the vouched ranges, with
    /// each region's source and owner (`None` for a vouched range), sorted by base.
    fn select_all(&self, filter: &Filter) -> Result<Vec<Selected>, u64> {
        let mut picked: BTreeMap<u64, Selected> = self
            .by_base
            .values()
            .filter(|a| a.size > 0 && filter.matches(a))
            .map(|a| (a.base, Selected::of(a, RegionSource::Agent)))
            .collect();
        for &(addr, source) in &filter.reached {
            let a = self.containing(addr).ok_or(addr)?;
            if a.size > 0 && a.kind.is_reachable() {
                // Adopted memory was unknown until now: it counts as adopted even where the
                // owner-agent rule would select it today.
                picked
                    .entry(a.base)
                    .and_modify(|s| {
                        if source == RegionSource::Adopted {
                            s.source = source;
                        }
                    })
                    .or_insert_with(|| Selected::of(a, source));
            }
        }
        // Vouched ranges, merged where they overlap or touch, less what the picked
        // allocations cover: no two regions of a selection may share a byte (a byte in two
        // regions is restored from one copy and folded into the other, and a longer range
        // vouched at a base already picked must not be cut to the shorter).
        let mut vouched: Vec<(u64, u64, RegionSource)> = filter
            .vouched
            .iter()
            .map(|&(base, size, source)| (base, base.saturating_add(size), source))
            .collect();
        vouched.sort_by_key(|&(base, end, _)| (base, std::cmp::Reverse(end)));
        let mut merged: Vec<(u64, u64, RegionSource)> = Vec::with_capacity(vouched.len());
        for (base, end, source) in vouched {
            match merged.last_mut() {
                Some(last) if base <= last.1 => last.1 = last.1.max(end),
                _ => merged.push((base, end, source)),
            }
        }
        let allocations: Vec<(u64, u64)> = picked
            .values()
            .map(|s| (s.region.base, s.region.base.saturating_add(s.region.size)))
            .collect();
        let mut add = |base: u64, end: u64, source: RegionSource| {
            picked.insert(
                base,
                Selected {
                    region: Region {
                        base,
                        size: end - base,
                        generation: 0,
                    },
                    source,
                    owner: None,
                },
            );
        };
        for (base, end, source) in merged {
            let mut at = base;
            for &(a_base, a_end) in allocations.iter().filter(|&&(b, e)| b < end && e > base) {
                if a_base > at {
                    add(at, a_base, source);
                }
                at = at.max(a_end);
            }
            if at < end {
                add(at, end, source);
            }
        }
        Ok(picked.into_values().collect())
    }
}

/// One region a filter selected.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Selected {
    pub(crate) region: Region,
    pub(crate) source: RegionSource,
    /// The owner agent of an inventory allocation (`None`: a vouched range).
    pub(crate) owner: Option<u64>,
}

impl Selected {
    fn of(a: &Allocation, source: RegionSource) -> Self {
        Selected {
            region: a.region(),
            source,
            owner: Some(a.owner_agent),
        }
    }
}

/// The set of live allocations, fed by a backend's alloc/free hooks. Thread-safe.
///
/// Allocations are kept in an ordered map behind a reader/writer lock held only for the map
/// operation itself (O(log n), no I/O): `on_alloc` and `on_free` take its write side, lookups its
/// read side.
///
/// Copies are fenced per agent. A snapshot or restore of one agent's memory holds that agent's
/// *copy fence* (read side) for its whole duration; freeing an allocation of that agent takes the
/// fence's write side first, so it waits until the copy is done and can never race a write into
/// freed memory. Allocations, and frees of other agents' memory, do not wait. (An allocation
/// that overlaps stale entries whose free was missed also waits for the stale entries' fences
/// before dropping them.) A copy not restricted to one agent fences every agent.
///
/// ```
/// use kreplay_snapshot::{Filter, Inventory, MemoryKind, NewAllocation};
///
/// static INVENTORY: Inventory = Inventory::new();
/// let buffer = NewAllocation {
///     base: 0x1000,
///     size: 0x100,
///     owner_agent: 7,
///     kind: MemoryKind::CoarseDevice,
/// };
/// let g1 = INVENTORY.on_alloc(buffer);
/// assert_eq!(INVENTORY.lookup(0x1080).unwrap().generation, g1);
/// INVENTORY.on_free(0x1000);
/// let g2 = INVENTORY.on_alloc(buffer);
/// assert!(g2 > g1); // same address, different allocation
/// assert_eq!(INVENTORY.select(&Filter::for_replay(7)).len(), 1);
/// ```
#[derive(Debug)]
pub struct Inventory {
    table: RwLock<Table>,
    /// Read side: a copy fenced to one agent, or a free/overlap drop (with that agent's fence).
    /// Write side: a copy fenced to every agent.
    all_agents: RwLock<()>,
    /// One copy fence per agent, created on first use and kept for the life of the process
    /// (agents are few; leaking one small lock each gives guards that outlive no borrow).
    fences: Mutex<Vec<(u64, &'static RwLock<()>)>>,
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
            all_agents: RwLock::new(()),
            fences: Mutex::new(Vec::new()),
        }
    }

    /// The copy fence of `agent`.
    fn fence(&self, agent: u64) -> &'static RwLock<()> {
        let mut fences = self.fences.lock();
        if let Some((_, fence)) = fences.iter().find(|(a, _)| *a == agent) {
            return fence;
        }
        let fence: &'static RwLock<()> = Box::leak(Box::new(RwLock::new(())));
        fences.push((agent, fence));
        fence
    }

    /// Waits until no copy of any of `agents`' memory is in progress; holding the returned
    /// guards keeps new copies of them from starting.
    fn exclude_copies(&self, agents: &mut SmallVec<[u64; 2]>) -> CopyExclusion<'_> {
        agents.sort_unstable();
        agents.dedup();
        let all = self.all_agents.read();
        // One order (ascending agent) for every thread that takes several fences.
        let fences = agents.iter().map(|&a| self.fence(a).write()).collect();
        CopyExclusion {
            _all: all,
            _fences: fences,
        }
    }

    /// Record a new allocation and return its generation (starting at 1, strictly increasing).
    ///
    /// A runtime never hands out overlapping live allocations, so any tracked allocation that
    /// overlaps the new one must have been freed without the free being seen: it is dropped and
    /// will never be snapshotted or restored into.
    ///
    /// A size running past the end of the address space is cut to end there. A zero-byte
    /// allocation holds no memory: it overlaps nothing, drops nothing, and is not tracked (its
    /// generation is still handed out; [`on_free`](Self::on_free) of it returns `None`).
    pub fn on_alloc(&self, allocation: NewAllocation) -> u64 {
        let NewAllocation {
            base,
            size,
            owner_agent,
            kind,
        } = allocation;
        let size = size.min(u64::MAX - base);
        let end = base + size;
        let _exclusion = self.exclude_copies_overlapping(base, end);
        let mut table = self.table.write();
        let generation = table.next_generation;
        table.next_generation += 1;
        if size == 0 {
            return generation;
        }
        table.remove_overlapping(base, end);
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

    /// Forget every tracked allocation overlapping the `size` bytes at `base`: memory freed
    /// without the free being seen, now that the range is known to hold something else (what
    /// [`on_alloc`](Self::on_alloc) does for a new allocation there, for memory that is not to
    /// be tracked yet). Waits while a copy of their agents is in progress. Returns how many.
    pub fn forget_overlapping(&self, base: u64, size: u64) -> usize {
        let end = base.saturating_add(size);
        let _exclusion = self.exclude_copies_overlapping(base, end);
        self.table.write().remove_overlapping(base, end)
    }

    /// Stale entries overlapping `[base, end)` are about to be dropped, and a copy may be
    /// writing into them: waits for their agents' copies and holds them off (never while
    /// holding the map lock). `None` when nothing overlaps.
    fn exclude_copies_overlapping(&self, base: u64, end: u64) -> Option<CopyExclusion<'_>> {
        let mut stale_agents: SmallVec<[u64; 2]> = self
            .table
            .read()
            .overlapping(base, end)
            .map(|a| a.owner_agent)
            .collect();
        (!stale_agents.is_empty()).then(|| self.exclude_copies(&mut stale_agents))
    }

    /// Forget the allocation that starts at `base`. Returns it, or `None` when no tracked
    /// allocation starts there (memory allocated before tracking began, or a double free).
    ///
    /// Waits while a snapshot or restore copy of the allocation's agent is in progress.
    pub fn on_free(&self, base: u64) -> Option<Allocation> {
        let agent = self
            .table
            .read()
            .by_base
            .get(&base)
            .map(|a| a.owner_agent)?;
        let _exclusion = self.exclude_copies(&mut SmallVec::from_elem(agent, 1));
        self.table.write().by_base.remove(&base)
    }

    /// Tracks `allocation` again, as it was: its free (after [`on_free`](Self::on_free)) did
    /// not happen, so the memory is still that allocation, generation included (a snapshot
    /// taken before restores it). Nothing is put back where a tracked allocation overlaps it
    /// now (memory handed out since is what lives there); returns whether it was put back.
    ///
    /// ```
    /// use kreplay_snapshot::{Inventory, MemoryKind, NewAllocation};
    ///
    /// let inventory = Inventory::new();
    /// let buffer = NewAllocation {
    ///     base: 0x1000,
    ///     size: 0x100,
    ///     owner_agent: 0,
    ///     kind: MemoryKind::CoarseDevice,
    /// };
    /// let generation = inventory.on_alloc(buffer);
    /// let freed = inventory.on_free(0x1000).unwrap();
    /// // The free failed: the same allocation, same generation.
    /// assert!(inventory.reinstate(freed));
    /// assert_eq!(inventory.get(0x1000).unwrap().generation, generation);
    /// // Memory allocated at the address since wins.
    /// let freed = inventory.on_free(0x1000).unwrap();
    /// let newer = inventory.on_alloc(NewAllocation { base: 0x1080, ..buffer });
    /// assert!(!inventory.reinstate(freed));
    /// assert_eq!(inventory.lookup(0x1080).unwrap().generation, newer);
    /// ```
    pub fn reinstate(&self, allocation: Allocation) -> bool {
        let mut table = self.table.write();
        if allocation.generation == 0
            || allocation.generation >= table.next_generation
            || table
                .overlapping(allocation.base, allocation.end())
                .next()
                .is_some()
        {
            return false;
        }
        table.by_base.insert(allocation.base, allocation);
        true
    }

    /// The live allocation containing `addr`, if any.
    pub fn lookup(&self, addr: u64) -> Option<Allocation> {
        self.table.read().containing(addr).copied()
    }

    /// The live allocation that ends exactly at `addr` (`addr` is one past its last byte: an
    /// end pointer), if any.
    pub fn ending_at(&self, addr: u64) -> Option<Allocation> {
        self.lookup(addr.checked_sub(1)?)
            .filter(|a| a.end() == addr)
    }

    /// The live allocation starting exactly at `base`, if any.
    pub fn get(&self, base: u64) -> Option<Allocation> {
        self.table.read().by_base.get(&base).copied()
    }

    /// Whether `region` still belongs to a live allocation of the same generation (a vouched
    /// region, generation 0, always does).
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

    /// Snapshot planning: the selection with sources and owners, or the first required or
    /// reached address that lies in no tracked allocation.
    pub(crate) fn select_checked(&self, filter: &Filter) -> Result<Vec<Selected>, u64> {
        let table = self.table.read();
        if let Some(&addr) = filter
            .required()
            .iter()
            .find(|&&addr| table.containing(addr).is_none())
        {
            return Err(addr);
        }
        table.select_all(filter)
    }

    /// Fences copies of the memory of `agents` (every agent's when `None`): frees of that memory
    /// wait until the returned guard drops.
    pub(crate) fn pin(&self, agents: Option<&[u64]>) -> Pinned<'_> {
        let fence = match agents {
            Some(agents) => {
                let all = self.all_agents.read();
                // Ascending order, as `exclude_copies` takes them.
                let mut sorted: SmallVec<[u64; 2]> = agents.iter().copied().collect();
                sorted.sort_unstable();
                sorted.dedup();
                Fence::Some {
                    _all: all,
                    _agents: sorted.iter().map(|&a| self.fence(a).read()).collect(),
                }
            }
            None => Fence::All {
                _all: self.all_agents.write(),
            },
        };
        Pinned {
            inventory: self,
            _fence: fence,
        }
    }
}

/// Guards that keep copies of some agents' memory from starting (see [`Inventory::on_free`]).
struct CopyExclusion<'a> {
    _all: RwLockReadGuard<'a, ()>,
    _fences: SmallVec<[RwLockWriteGuard<'static, ()>; 2]>,
}

/// The guards of a copy fence, held for their release on drop.
enum Fence<'a> {
    Some {
        _all: RwLockReadGuard<'a, ()>,
        _agents: SmallVec<[RwLockReadGuard<'static, ()>; 2]>,
    },
    All {
        _all: RwLockWriteGuard<'a, ()>,
    },
}

/// A copy fence held across a snapshot or restore copy, so that no free of the copied memory can
/// run meanwhile.
pub(crate) struct Pinned<'a> {
    inventory: &'a Inventory,
    _fence: Fence<'a>,
}

impl Pinned<'_> {
    pub(crate) fn is_live(&self, region: &Region) -> bool {
        self.inventory.is_live(region)
    }
}

/// Values below this are never addresses (the first page is never mapped).
pub const MIN_ADDRESS: u64 = 4096;

/// The 8-byte values at every 4-byte aligned position of kernel arguments `bytes` placed at
/// address or offset `offset` (only its alignment matters), at least [`MIN_ADDRESS`], appended
/// to `out`: what a backend resolves against the [`Inventory`] as possible pointers. A pointer
/// is 8-byte aligned, except inside a packed struct passed by value, where it may sit at 4. A
/// value naming nothing is a number.
pub fn aligned_values(bytes: &[u8], offset: usize, out: &mut Vec<u64>) {
    let skip = (4 - offset % 4) % 4;
    let words = bytes.get(skip..).unwrap_or(&[]);
    for at in (0..words.len().saturating_sub(7)).step_by(4) {
        let v = u64::from_ne_bytes(words[at..at + 8].try_into().expect("8 bytes"));
        if v >= MIN_ADDRESS {
            out.push(v);
        }
    }
}
