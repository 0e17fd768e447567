//! Memory that CUDA graphs allocate, with its real lifecycle: what a snapshot may copy of it, and
//! when.
//!
//! A graph allocation is made by a memory-allocation node: one added with
//! `cuGraphAddMemAllocNode` (or `cuGraphAddNode` with a `CU_GRAPH_NODE_TYPE_MEM_ALLOC` node), or
//! the one the driver makes of a `cuMemAllocAsync` / `cuMemAllocFromPoolAsync` on a stream being
//! captured. The call returns the allocation's address at once (fixed across instantiations and
//! launches), but **no memory is behind that address until a graph holding the node is
//! launched**: a snapshot copying it would be an illegal-address error that poisons the
//! context. After a launch the allocation is ordinary device memory of its device until it is
//! freed: by `cuMemFreeAsync` / `cuMemFree`, by a memory-free node (`cuGraphAddMemFreeNode`, or a
//! `cuMemFreeAsync` captured into a graph) of a later launched graph, or by a free node of its own
//! graph, which ends it within that graph's run.
//!
//! So [`GraphMemory`] keeps each graph allocation in one of two states:
//!
//! * **unbacked** (known, no memory behind it): from the node's creation or the captured
//!   allocation until a graph holding it is launched, and again after a free while an
//!   executable graph still holds its node (the next launch allocates it at the same address).
//!   It is never in the inventory, so no snapshot copies it, whatever the scope; a launch whose
//!   argument points into it is declined (`untracked_memory`,
//!   [`GraphMemory::argument_reason`]): the launch runs once, nothing is lost.
//! * **backed**: from the API EXIT of a successful `cuGraphLaunch` (`_ptsz`) of an executable
//!   graph holding its node until it is freed. A device allocation is in the inventory as
//!   device memory of its device, snapshotted like any `cuMemAllocAsync` allocation (the drain
//!   before a snapshot waits for the graph to have run). An allocation whose pool is not
//!   pinned device memory (host or managed memory) is not snapshotted: while one is backed,
//!   every launch is declined ([`GraphMemory::untracked_reason`]).
//!
//! Which allocation and free nodes an executable graph holds is read when it is instantiated
//! (API EXIT of `cuGraphInstantiate*`, [`walk`] of the source graph and of its child graphs) and
//! applied at each of its launches: allocations first, then frees. An executable graph whose
//! nodes could not be read may allocate memory kreplay cannot describe: once it is launched,
//! every later launch of the process is declined. `CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH`
//! frees a graph's unfreed allocations before it runs again, which allocates them again at the
//! same addresses: they stay backed, and nothing else needs doing.
//!
//! [`GraphMemory`] is bookkeeping only (the driver is reached through [`GraphApi`]), so its rules
//! are tested without a GPU.

use std::collections::{BTreeMap, HashMap};

use kreplay_snapshot::{Filter, Inventory, MemoryKind, NewAllocation};
use parking_lot::Mutex;

/// `CU_GRAPH_NODE_TYPE_GRAPH` (cuda.h's `CUgraphNodeType`): a child graph node.
pub const CU_GRAPH_NODE_TYPE_GRAPH: i32 = 4;
/// `CU_GRAPH_NODE_TYPE_MEM_ALLOC`.
pub const CU_GRAPH_NODE_TYPE_MEM_ALLOC: i32 = 10;
/// `CU_GRAPH_NODE_TYPE_MEM_FREE`.
pub const CU_GRAPH_NODE_TYPE_MEM_FREE: i32 = 11;
/// `CU_MEM_ALLOCATION_TYPE_PINNED` (`CUmemAllocationType`): the pool's memory is pinned memory
/// of its location.
pub const CU_MEM_ALLOCATION_TYPE_PINNED: i32 = 1;
/// `CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH`.
pub const CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH: u64 = 1;
/// How deep child graphs are followed before the walk gives up (a graph cannot contain itself,
/// so only a broken driver answer goes this deep).
const MAX_DEPTH: usize = 32;

/// Where a graph allocation's memory lives.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Place {
    /// Pinned device memory of the device of this ordinal: snapshotted once backed.
    Device(i32),
    /// Anything else (host or managed memory, a location that cannot be read): why it is not
    /// snapshotted.
    Other(String),
}

impl Place {
    /// From a node's pool properties (`CUmemPoolProps`: `allocType`, `location.type`,
    /// `location.id`).
    pub fn from_pool(alloc_type: i32, location_type: i32, location_id: i32) -> Place {
        if alloc_type == CU_MEM_ALLOCATION_TYPE_PINNED
            && location_type == crate::tracking::CU_MEM_LOCATION_TYPE_DEVICE
            && location_id >= 0
        {
            Place::Device(location_id)
        } else {
            Place::Other(format!(
                "its pool is not pinned device memory (allocation type {alloc_type}, location \
                 type {location_type})"
            ))
        }
    }
}

/// One graph allocation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GraphAlloc {
    /// Its address.
    pub base: u64,
    /// Its size in bytes.
    pub size: u64,
    /// Where its memory lives.
    pub place: Place,
}

impl GraphAlloc {
    fn end(&self) -> u64 {
        self.base.saturating_add(self.size)
    }
    fn contains(&self, addr: u64) -> bool {
        addr >= self.base && addr < self.end()
    }
}

/// The memory nodes of an executable graph: what each of its launches allocates and frees.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GraphNodes {
    /// Its allocation nodes.
    pub allocs: Vec<GraphAlloc>,
    /// The addresses its free nodes free.
    pub frees: Vec<u64>,
}

/// A backed graph allocation a free's API ENTER ended ([`GraphMemory::free_enter`]), to put
/// back if the driver refuses the free ([`GraphMemory::free_failed`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GraphFreed {
    alloc: GraphAlloc,
    /// Its allocation in the inventory (device memory).
    tracked: Option<kreplay_snapshot::Allocation>,
    /// Whether it became unbacked (an executable graph still holds its node).
    unbacked_again: bool,
}

impl GraphFreed {
    /// The freed address.
    pub fn base(&self) -> u64 {
        self.alloc.base
    }
}

/// An executable graph the API ENTER of its `cuGraphExecDestroy` forgot
/// ([`GraphMemory::exec_destroy_enter`]), kept until the call's API EXIT: a destroy the driver
/// refuses leaves it live ([`GraphMemory::exec_destroy_failed`]).
#[derive(Debug)]
pub struct ExecDestroyed {
    exec: usize,
    kept: Exec,
}

/// What one launch changed, for the caller's accounting.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Launched {
    /// Allocations that became backed: base and device (`None`: not device memory, or placed
    /// on another device than the launch's, not snapshotted: see [`GraphMemory::on_launched`]).
    /// Device ones were added to the inventory.
    pub backed: Vec<(u64, Option<i32>)>,
    /// Backed allocations the launch's free nodes freed (removed from the inventory).
    pub freed: Vec<u64>,
    /// Set when the graph's nodes could not be read at its instantiation (why): from now on
    /// every launch is declined.
    pub unreadable: Option<String>,
}

/// The graph nodes kreplay reads from the driver at instantiation (see [`walk`]): handles are
/// opaque numbers here.
pub trait GraphApi {
    /// The nodes of `graph` (`cuGraphGetNodes`).
    fn nodes(&self, graph: usize) -> Result<Vec<usize>, String>;
    /// The type of `node` (`cuGraphNodeGetType`, a `CUgraphNodeType`).
    fn node_type(&self, node: usize) -> Result<i32, String>;
    /// What allocation node `node` allocates (`cuGraphMemAllocNodeGetParams`).
    fn alloc(&self, node: usize) -> Result<GraphAlloc, String>;
    /// What free node `node` frees (`cuGraphMemFreeNodeGetParams`).
    fn freed(&self, node: usize) -> Result<u64, String>;
    /// The graph of child graph node `node` (`cuGraphChildGraphNodeGetGraph`).
    fn child(&self, node: usize) -> Result<usize, String>;
}

/// The memory nodes of `graph` and of its child graphs, at any depth (a graph holding memory
/// nodes may be a child graph when its ownership moved to the parent). Conditional nodes are
/// not entered: their bodies may not hold memory nodes (cuda.h's
/// `CUDA_CONDITIONAL_NODE_PARAMS`). `Err` says what could not be read.
pub fn walk(graph: usize, api: &dyn GraphApi) -> Result<GraphNodes, String> {
    let mut out = GraphNodes::default();
    walk_into(graph, api, 0, &mut out)?;
    Ok(out)
}

fn walk_into(
    graph: usize,
    api: &dyn GraphApi,
    depth: usize,
    out: &mut GraphNodes,
) -> Result<(), String> {
    if depth > MAX_DEPTH {
        return Err(format!("child graphs nested deeper than {MAX_DEPTH}"));
    }
    for node in api.nodes(graph)? {
        match api.node_type(node)? {
            CU_GRAPH_NODE_TYPE_MEM_ALLOC => out.allocs.push(api.alloc(node)?),
            CU_GRAPH_NODE_TYPE_MEM_FREE => out.frees.push(api.freed(node)?),
            CU_GRAPH_NODE_TYPE_GRAPH => {
                let child = api.child(node)?;
                walk_into(child, api, depth + 1, out)?;
            }
            _ => {}
        }
    }
    Ok(())
}

#[derive(Debug)]
struct Exec {
    /// Its memory nodes, or why they could not be read.
    nodes: Result<GraphNodes, String>,
    /// Its instantiation flags.
    flags: u64,
}

#[derive(Debug, Default)]
struct State {
    /// Known graph allocations with no memory behind them now: base → allocation.
    unbacked: BTreeMap<u64, GraphAlloc>,
    /// Graph allocations a launch made and nothing freed yet: base → allocation.
    backed: BTreeMap<u64, GraphAlloc>,
    /// The executable graphs instantiated and not destroyed: handle → their memory nodes.
    execs: HashMap<usize, Exec>,
    /// Why memory of a launched graph cannot be described (set for good).
    blind: Option<String>,
}

impl State {
    /// Whether a live executable graph allocates at `base` (its next launch allocates it again).
    fn held(&self, base: u64) -> bool {
        self.execs.values().any(|e| {
            e.nodes
                .as_ref()
                .is_ok_and(|n| n.allocs.iter().any(|a| a.base == base))
        })
    }

    /// A backed allocation at `base` ended: out of the inventory, and unbacked again while an
    /// executable graph still holds its node. What it was, when it was backed (for
    /// [`GraphMemory::free_failed`]).
    fn end(&mut self, inventory: &Inventory, base: u64) -> Option<GraphFreed> {
        let alloc = self.backed.remove(&base)?;
        let tracked = match alloc.place {
            Place::Device(_) => inventory.on_free(base),
            Place::Other(_) => None,
        };
        let unbacked_again = self.held(base);
        if unbacked_again {
            self.unbacked.insert(base, alloc.clone());
        }
        Some(GraphFreed {
            alloc,
            tracked,
            unbacked_again,
        })
    }

    /// Known graph allocations overlapping `[base, base + size)` other than at `base` itself:
    /// their addresses were handed out again, so they no longer exist.
    fn forget_overlapping(&mut self, base: u64, size: u64) {
        let end = base.saturating_add(size.max(1));
        self.unbacked
            .retain(|&b, a| b == base || !(b < end && a.end() > base));
    }
}

/// The graph allocations of the process (see the module docs).
#[derive(Debug, Default)]
pub struct GraphMemory {
    state: Mutex<State>,
}

impl GraphMemory {
    /// Nothing known.
    pub fn new() -> GraphMemory {
        GraphMemory::default()
    }

    /// A `cuMemAllocAsync` (`cuMemAllocFromPoolAsync`) on a stream being captured returned
    /// `alloc`: the driver made an allocation node of it. Unbacked until a graph holding it is
    /// launched.
    pub fn on_captured_alloc(&self, inventory: &Inventory, alloc: GraphAlloc) {
        self.on_alloc_node(inventory, alloc);
    }

    /// An allocation node was added to a graph (`cuGraphAddMemAllocNode`, `cuGraphAddNode`):
    /// unbacked until a graph holding it is launched. Any tracked allocation overlapping its
    /// address was freed without kreplay seeing it, and is dropped: no snapshot may copy there.
    pub fn on_alloc_node(&self, inventory: &Inventory, alloc: GraphAlloc) {
        let mut s = self.state.lock();
        // A live graph allocation at that address stays: the new node may reuse it once a free
        // node the application added before it ran (the driver reuses addresses so), and until
        // then it is live memory.
        drop_overlapping(inventory, alloc.base, alloc.size, &s.backed);
        s.forget_overlapping(alloc.base, alloc.size);
        if !s.backed.contains_key(&alloc.base) {
            s.unbacked.insert(alloc.base, alloc);
        }
    }

    /// Any other allocation kreplay tracks was made at `base`: a graph allocation that still
    /// overlapped it no longer exists (its graph was destroyed and the address handed out
    /// again).
    pub fn on_other_alloc(&self, base: u64, size: u64) {
        let mut s = self.state.lock();
        s.forget_overlapping(base, size);
        s.unbacked.remove(&base);
    }

    /// Executable graph `exec` was instantiated (`flags`: its instantiation flags) from a graph
    /// whose memory nodes are `nodes`, or could not be read (why). Its allocations are known
    /// from now on (unbacked where no launch made them yet).
    pub fn on_instantiated(&self, exec: usize, nodes: Result<GraphNodes, String>, flags: u64) {
        let mut s = self.state.lock();
        if let Ok(n) = &nodes {
            for a in &n.allocs {
                if !s.backed.contains_key(&a.base) {
                    s.unbacked.insert(a.base, a.clone());
                }
            }
        }
        s.execs.insert(exec, Exec { nodes, flags });
    }

    /// `cuGraphLaunch` of `exec` on a stream of device `launch_device` (`None`: not known)
    /// succeeded. Per address, its allocation and free nodes change what is live: a graph may
    /// free an allocation and hand its address to another (CUDA reuses addresses within a
    /// graph), and may free what an earlier launch allocated, so the nodes at one address are
    /// counted (their order is the graph's, not known here; live before, each free ends one
    /// allocation, each allocation node makes one): live after the launch when more were made
    /// than ended. What stays live is backed (device memory added to `inventory`), what ended
    /// is freed. An allocation placed on another device than the launch's gets its memory when
    /// that device's stream reaches it, which a drain of its own device does not wait for: it
    /// is backed but not snapshotted (launches decline while it is live). Allocations of
    /// different sizes at one address that stays live are not described either. An
    /// executable graph kreplay did not see instantiated changes nothing.
    pub fn on_launched(
        &self,
        inventory: &Inventory,
        exec: usize,
        launch_device: Option<i32>,
    ) -> Launched {
        let mut out = Launched::default();
        let mut s = self.state.lock();
        let (nodes, flags) = match s.execs.get(&exec).map(|e| (e.nodes.clone(), e.flags)) {
            None => return out,
            Some((Err(why), _)) => {
                let why = format!(
                    "a graph whose memory nodes could not be read was launched ({why}): it may \
                     have allocated memory kreplay cannot describe"
                );
                s.blind.get_or_insert_with(|| why.clone());
                out.unreadable = Some(why);
                return out;
            }
            Some((Ok(nodes), flags)) => (nodes, flags),
        };
        let auto_free = flags & CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH != 0;
        let mut at: BTreeMap<u64, (Vec<GraphAlloc>, usize)> = BTreeMap::new();
        for a in nodes.allocs {
            at.entry(a.base).or_default().0.push(a);
        }
        for base in nodes.frees {
            at.entry(base).or_default().1 += 1;
        }
        for (base, (allocs, frees)) in at {
            // Relaunched with auto-free: what this graph allocated before is freed first.
            let live_before = s.backed.contains_key(&base) && (!auto_free || allocs.is_empty());
            let made = allocs.len();
            let live_after = usize::from(live_before) + made > frees;
            if !live_after {
                // Ending it leaves it unbacked while a graph still holds its node; a free of
                // nothing live changes nothing.
                if s.end(inventory, base).is_some() {
                    out.freed.push(base);
                }
                if made > 0 {
                    // Made and freed inside the launch: unbacked again, as the graph holds it.
                    s.unbacked.insert(base, allocs[0].clone());
                }
                continue;
            }
            if made == 0 {
                continue; // live before, untouched
            }
            // A new allocation at `base` is what stays live: whatever was there ended.
            if s.backed.contains_key(&base) {
                s.end(inventory, base);
            }
            s.unbacked.remove(&base);
            let mut alloc = allocs[0].clone();
            if allocs
                .iter()
                .any(|a| a.size != alloc.size || a.place != alloc.place)
            {
                alloc.place = Place::Other(
                    "allocation nodes of different sizes or places share its address within \
                     one graph"
                        .to_owned(),
                );
            }
            if let (Place::Device(d), Some(launch)) = (&alloc.place, launch_device)
                && *d != launch
            {
                alloc.place = Place::Other(format!(
                    "placed on device {d} by a graph launched on device {launch}"
                ));
            }
            match alloc.place {
                Place::Device(d) => {
                    inventory.on_alloc(NewAllocation {
                        base,
                        size: alloc.size,
                        owner_agent: d as u64,
                        kind: MemoryKind::CoarseDevice,
                    });
                    out.backed.push((base, Some(d)));
                }
                Place::Other(_) => out.backed.push((base, None)),
            }
            s.backed.insert(base, alloc);
        }
        out
    }

    /// `cuGraphExecDestroy` of `exec`. What its launches allocated and nothing freed stays
    /// allocated (until `cuMemFree`, `cuMemFreeAsync` or another graph's free node).
    pub fn on_exec_destroyed(&self, exec: usize) {
        self.exec_destroy_enter(exec);
    }

    /// The API ENTER of a `cuGraphExecDestroy` of `exec`: forgotten as at
    /// [`on_exec_destroyed`](Self::on_exec_destroyed) (the driver may hand its handle to the
    /// next instantiation as soon as it destroyed it); what it was is returned, for
    /// [`exec_destroy_failed`](Self::exec_destroy_failed).
    pub fn exec_destroy_enter(&self, exec: usize) -> Option<ExecDestroyed> {
        let kept = self.state.lock().execs.remove(&exec)?;
        Some(ExecDestroyed { exec, kept })
    }

    /// The `cuGraphExecDestroy` whose API ENTER returned `destroyed` failed: the executable
    /// graph is still live, and its later launches still allocate and free what its nodes say,
    /// unless a graph instantiated since took its handle. Returns whether it was put back.
    pub fn exec_destroy_failed(&self, destroyed: ExecDestroyed) -> bool {
        let ExecDestroyed { exec, kept } = destroyed;
        let mut s = self.state.lock();
        if s.execs.contains_key(&exec) {
            return false;
        }
        if let Ok(n) = &kept.nodes {
            // Its allocations are known again (unbacked where nothing launched made them).
            for a in &n.allocs {
                if !s.backed.contains_key(&a.base) {
                    s.unbacked.insert(a.base, a.clone());
                }
            }
        }
        s.execs.insert(exec, kept);
        true
    }

    /// `cuMemFree` / `cuMemFreeAsync` (not captured) of `base`, or its context's end: true when
    /// it was a backed graph allocation (now out of `inventory`).
    pub fn on_free(&self, inventory: &Inventory, base: u64) -> bool {
        self.free_enter(inventory, base).is_some()
    }

    /// The API ENTER of a `cuMemFree`/`cuMemFreeAsync` of `base`: a backed graph allocation
    /// there ends as at [`on_free`](Self::on_free); what it was is returned, for
    /// [`free_failed`](Self::free_failed) should the driver refuse the free. `None`: no backed
    /// graph allocation starts there.
    pub fn free_enter(&self, inventory: &Inventory, base: u64) -> Option<GraphFreed> {
        self.state.lock().end(inventory, base)
    }

    /// The free whose API ENTER returned `freed` failed: the memory is live, backed and
    /// tracked again as the same allocation (generation included, so a snapshot taken before
    /// still restores it), unless memory allocated at its address since took its place. True
    /// when it was put back.
    pub fn free_failed(&self, inventory: &Inventory, freed: GraphFreed) -> bool {
        let GraphFreed {
            alloc,
            tracked,
            unbacked_again,
        } = freed;
        let mut s = self.state.lock();
        if s.backed.contains_key(&alloc.base) {
            return false;
        }
        if let Some(allocation) = tracked
            && !inventory.reinstate(allocation)
        {
            return false;
        }
        if unbacked_again && s.unbacked.get(&alloc.base) == Some(&alloc) {
            s.unbacked.remove(&alloc.base);
        }
        s.backed.insert(alloc.base, alloc);
        true
    }

    /// What `addr`, a kernel argument kreplay does not track, is when it points into a graph
    /// allocation with no memory behind it: the launch is declined (a snapshot never copies
    /// such memory, and a kernel given it is not replayed).
    pub fn argument_reason(&self, addr: u64) -> Option<String> {
        let s = self.state.lock();
        let (_, a) = s.unbacked.range(..=addr).next_back()?;
        a.contains(addr).then(|| {
            format!(
                "a graph allocation of {} bytes at {:#x} (cuGraphAddMemAllocNode, or \
                 cuMemAllocAsync captured into a graph) that has no memory behind it until a \
                 graph holding it is launched",
                a.size, a.base
            )
        })
    }

    /// Why no launch may be replayed now: graph memory kreplay cannot snapshot is live (`None`:
    /// nothing).
    pub fn untracked_reason(&self) -> Option<String> {
        let s = self.state.lock();
        if let Some(why) = &s.blind {
            return Some(why.clone());
        }
        let mut other = s.backed.values().filter_map(|a| match &a.place {
            Place::Other(why) => Some((a, why)),
            Place::Device(_) => None,
        });
        let (first, why) = other.next()?;
        Some(format!(
            "{} graph allocation(s) live that are not snapshotted (first: {} bytes at {:#x}: {why})",
            1 + other.count(),
            first.size,
            first.base
        ))
    }

    /// Whether `exec` was instantiated with `CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH`
    /// (`None`: not known).
    pub fn auto_frees(&self, exec: usize) -> Option<bool> {
        self.state
            .lock()
            .execs
            .get(&exec)
            .map(|e| e.flags & CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH != 0)
    }

    /// Whether a launch of `exec` allocates memory (its graph has allocation nodes).
    pub fn allocates(&self, exec: usize) -> bool {
        self.state
            .lock()
            .execs
            .get(&exec)
            .is_some_and(|e| e.nodes.as_ref().is_ok_and(|n| !n.allocs.is_empty()))
    }

    /// Whether `base` is a known graph allocation with no memory behind it now.
    pub fn is_unbacked(&self, base: u64) -> bool {
        self.state.lock().unbacked.contains_key(&base)
    }

    /// Whether `base` is a graph allocation a launch made and nothing freed yet.
    pub fn is_backed(&self, base: u64) -> bool {
        self.state.lock().backed.contains_key(&base)
    }
}

/// Drops every tracked allocation overlapping `[base, base + size)`: the driver handed that
/// range out to a graph allocation, so those were freed without kreplay seeing it.
fn drop_overlapping(
    inventory: &Inventory,
    base: u64,
    size: u64,
    live_graph_allocations: &BTreeMap<u64, GraphAlloc>,
) {
    let end = base.saturating_add(size.max(1));
    let stale: Vec<u64> = inventory
        .select(&Filter::any())
        .iter()
        .filter(|r| r.base < end && r.base.saturating_add(r.size) > base)
        .filter(|r| !live_graph_allocations.contains_key(&r.base))
        .map(|r| r.base)
        .collect();
    for b in stale {
        inventory.on_free(b);
    }
}
