//! Sequences of graph operations against kreplay's graph-memory bookkeeping
//! (`kreplay_cuda::graphmem`), driven the way the injected library drives it
//! (`cuda/src/inject/`: a captured `cuMemAllocAsync` or an allocation node at its API EXIT,
//! `cuGraphInstantiate*` with the walked memory nodes, `cuGraphLaunch` at its API EXIT,
//! `cuMemFree*` at ENTER, a context's end through `Contexts::forget`), over the fake device of
//! `graph_memory.rs`: a graph allocation has memory behind it only while its allocation node's
//! run is not undone by a free, and a copy touching it otherwise is an illegal address.
//!
//! Every test here states the behaviour CUDA's documented rules require; each failed before
//! the fix its comment describes (what kreplay did then).

#[allow(dead_code)] // each test file uses part of it
mod graph_device;

use std::sync::Arc;
use std::sync::atomic::Ordering;

use graph_device::{GraphDevice, Passes};
use kreplay_ctxmask::ContextRegistry;
use kreplay_cuda::contexts::Contexts;
use kreplay_cuda::graphmem::{GraphAlloc, GraphMemory, GraphNodes, Place};
use kreplay_cuda::scope::launch_filter;
use kreplay_cuda::{LaunchOps, Window, WindowContext};
use kreplay_locks::AgentLocks;
use kreplay_passloop::{DispatchInfo, ReplayOutcome, ReplayRecord};
use kreplay_snapshot::{
    Filter, Inventory, MemoryKind, NewAllocation, SnapshotConfig, Snapshotter, StoreTier,
};

/// An ordinary tracked allocation (`cudaMalloc`) of device 0: its first 8 bytes hold a pointer.
const X: u64 = 0;
const X_SIZE: u64 = 4096;
/// A graph allocation's address.
const G: u64 = 8192;
const G_SIZE: u64 = 4096;
/// An ordinary tracked allocation of device 1.
const Y: u64 = 12288;
const Y_SIZE: u64 = 1024;

/// The process: `X` tracked on device 0 (and `Y` on device 1), the graph bookkeeping and the
/// contexts, as the injected library keeps them.
struct Rig {
    gpu: Arc<GraphDevice>,
    inventory: Arc<Inventory>,
    graphs: GraphMemory,
    contexts: Contexts,
    snapshotter: Snapshotter,
    locks: AgentLocks,
    registry: ContextRegistry,
}

/// The application's context on device 0.
const CTX0: usize = 0xc0;

fn rig() -> Rig {
    let gpu = Arc::new(GraphDevice::new(&[(G, G_SIZE)]));
    let inventory = Arc::new(Inventory::new());
    for (base, size, agent) in [(X, X_SIZE, 0), (Y, Y_SIZE, 1)] {
        inventory.on_alloc(NewAllocation {
            base,
            size,
            owner_agent: agent,
            kind: MemoryKind::CoarseDevice,
        });
    }
    let snapshotter = Snapshotter::new(
        inventory.clone(),
        gpu.clone(),
        SnapshotConfig::default().with_store(StoreTier::Host),
    )
    .unwrap();
    let locks = AgentLocks::new();
    locks.set_enabled(true);
    Rig {
        gpu,
        inventory,
        graphs: GraphMemory::new(),
        contexts: Contexts::default(),
        snapshotter,
        locks,
        registry: ContextRegistry::new(),
    }
}

fn alloc(base: u64, place: Place) -> GraphAlloc {
    GraphAlloc {
        base,
        size: G_SIZE,
        place,
    }
}

fn g_dev0() -> GraphAlloc {
    alloc(G, Place::Device(0))
}

impl Rig {
    /// `cuGraphInstantiate*` of a graph with these memory nodes (in `cuGraphGetNodes` order).
    fn instantiate(&self, exec: usize, allocs: &[GraphAlloc], frees: &[u64], flags: u64) {
        let nodes = GraphNodes {
            allocs: allocs.to_vec(),
            frees: frees.to_vec(),
        };
        self.graphs.on_instantiated(exec, Ok(nodes), flags);
    }

    /// `inject`'s `on_graph_launched` at the API EXIT of a successful `cuGraphLaunch` in
    /// context `ctx`.
    fn launched(&self, exec: usize, ctx: usize) {
        let launched = self.graphs.on_launched(&self.inventory, exec, Some(0));
        for &(base, _) in &launched.backed {
            self.contexts.note_allocation(ctx, base);
        }
        for &base in &launched.freed {
            self.contexts.note_free(base);
        }
    }

    /// `CUPTI_CBID_RESOURCE_CONTEXT_DESTROY_STARTING` (`inject`'s
    /// `before_context_destroyed`): what the context's allocations were end with it.
    fn context_destroyed(&self, ctx: usize) {
        for base in self.contexts.forget(ctx) {
            if !self.graphs.on_free(&self.inventory, base) {
                self.inventory.on_free(base);
            }
        }
    }

    fn illegal(&self) -> usize {
        self.gpu.illegal.load(Ordering::SeqCst)
    }
}

/// A launch on `device` scoped as the injected library scopes it: the device's tracked
/// allocations (agent scope) plus what `values` point into, graph memory consulted for what the
/// inventory does not hold; its drain synchronises `device` alone (no peer group).
struct Launch<'a, K> {
    rig: &'a Rig,
    device: u64,
    values: Vec<u64>,
    kernel: K,
}

impl<K: Fn()> LaunchOps for Launch<'_, K> {
    fn replayable(&self) -> Result<(), String> {
        Ok(())
    }
    fn covered(&self) -> Result<(), String> {
        self.rig.graphs.untracked_reason().map_or(Ok(()), Err)
    }
    fn scope(&self, base: &Filter) -> Result<Filter, String> {
        launch_filter(
            base.clone(),
            &self.rig.inventory,
            &[],
            &self.values,
            |v, _| self.rig.graphs.argument_reason(v),
        )
        .map(|s| s.filter)
    }
    fn drain(&self) -> Result<(), String> {
        self.rig.gpu.drain(self.device);
        Ok(())
    }
    fn wait(&self) -> Result<(), String> {
        Ok(())
    }
    fn relaunch(&self) -> Result<(), String> {
        (self.kernel)();
        Ok(())
    }
}

/// ENTER, the application's launch (`kernel`), EXIT, with 4 passes asked, on `device`.
fn run_on(rig: &Rig, device: u64, values: &[u64], kernel: impl Fn()) -> ReplayRecord {
    let ops = Launch {
        rig,
        device,
        values: values.to_vec(),
        kernel,
    };
    let filter = Filter::for_replay(device);
    let cx = WindowContext {
        locks: &rig.locks,
        snapshotter: &rig.snapshotter,
        filter: &filter,
        registry: &rig.registry,
        group: &[],
    };
    let mut tool = Passes::default();
    let info = DispatchInfo {
        agent_id: device,
        ..DispatchInfo::default()
    };
    let window = Window::enter(cx, &mut tool, info, &ops);
    (ops.kernel)();
    window.exit(&mut tool, &rig.registry, &ops, Ok(()))
}

fn run(rig: &Rig, values: &[u64], kernel: impl Fn()) -> ReplayRecord {
    run_on(rig, 0, values, kernel)
}

fn replayed(record: &ReplayRecord) -> bool {
    matches!(record.outcome, ReplayOutcome::Replayed { passes: 4, .. })
}

// ------------------------------------------------------------------------------------------
// 1. Before the fix: address reuse within one graph.
//
// CUDA programming guide, "Address Reuse within a Graph": "CUDA may reuse memory within a
// graph by assigning the same virtual address ranges to different allocations whose lifetimes
// do not overlap" (an allocation node that depends on a free node may get the freed address).
// A capture of `tmp = cudaMallocAsync(); k(tmp); cudaFreeAsync(tmp); out = cudaMallocAsync();
// k2(out)` is that shape: `out` may get `tmp`'s address, and `out` outlives the graph.
// ------------------------------------------------------------------------------------------

/// The graph of the capture above, run once: `tmp` and `out` at the same address `G`, `tmp`
/// freed inside the graph, `out` live after it (holding 1000 in every word).
fn launch_graph_reusing_an_address(r: &Rig) {
    // Both captured allocations returned G (API EXIT of each cuMemAllocAsync); the captured
    // cuMemFreeAsync of tmp between them is a free node (ignored at its API ENTER).
    r.graphs.on_captured_alloc(&r.inventory, g_dev0());
    r.graphs.on_captured_alloc(&r.inventory, g_dev0());
    // cuGraphGetNodes: alloc tmp, free tmp, alloc out.
    r.instantiate(0xe1, &[g_dev0(), g_dev0()], &[G], 0);
    // The graph runs: tmp allocated, freed, out allocated at the same address.
    r.gpu.map(G, 7);
    r.gpu.unmap(G);
    r.gpu.map(G, 1000);
    r.launched(0xe1, CTX0);
}

/// `out` is live after the graph ran: a kernel reaching it through a pointer kept in device
/// memory must be replayed with it restored (one run's increment, 1001). kreplay ends it with
/// the free node of `tmp` (same address), leaves it out of the inventory, and the replays add 4.
#[test]
fn an_allocation_reusing_a_freed_address_in_its_graph_is_restored_between_passes() {
    let r = rig();
    launch_graph_reusing_an_address(&r);
    r.gpu.set_pointer(X, G);
    let record = run(&r, &[X], || r.gpu.bump_through_pointer(G_SIZE / 4));
    assert!(replayed(&record), "{:?}", record.outcome);
    assert_eq!(r.illegal(), 0);
    assert_eq!(
        r.gpu.word(G),
        1001,
        "graph allocation at {G:#x} is live after its graph ran (backed={}, unbacked={}, \
         tracked={}): the replays must leave one run's increment",
        r.graphs.is_backed(G),
        r.graphs.is_unbacked(G),
        r.inventory.get(G).is_some()
    );
}

/// The same live `out`, given to a kernel as its argument: it has memory behind it, so the
/// launch is replayed (kreplay declines it as "no memory behind it until a graph holding it is
/// launched", and keeps declining every launch given it until the application frees it).
#[test]
fn a_launch_given_an_allocation_reusing_a_freed_address_in_its_graph_is_replayed() {
    let r = rig();
    launch_graph_reusing_an_address(&r);
    let record = run(&r, &[G], || r.gpu.add_one(G, 1));
    assert!(
        replayed(&record),
        "live graph allocation at {G:#x} given as argument: {:?}",
        record.outcome
    );
    assert_eq!(r.gpu.word(G), 1001);
    assert_eq!(r.illegal(), 0);
}

// ------------------------------------------------------------------------------------------
// 2. Before the fix: graph memory outside device memory never ends with its context.
// ------------------------------------------------------------------------------------------

/// A graph allocation from a host pool (`Place::Other`) declines every launch while it is live.
/// When its context ends (`cuCtxDestroy`, `cudaDeviceReset`), it is gone, and so must the
/// declines be. kreplay never notes such an allocation with its context (only device ones are
/// reported as `backed` by `on_launched`), so every launch of the process stays declined.
#[test]
fn graph_memory_outside_device_memory_ends_with_its_context() {
    let r = rig();
    let host = alloc(G, Place::from_pool(1, 2, 0));
    r.graphs.on_alloc_node(&r.inventory, host.clone());
    r.instantiate(0xd, &[host], &[], 0);
    r.gpu.map(G, 0);
    r.launched(0xd, CTX0);
    assert!(r.graphs.untracked_reason().is_some(), "declines while live");
    r.graphs.on_exec_destroyed(0xd);
    r.context_destroyed(CTX0);
    r.gpu.unmap(G);
    // A later launch (in a new context) with no graph memory of any kind live.
    let record = run(&r, &[X], || r.gpu.add_one(X, 1));
    assert!(
        replayed(&record),
        "the host-pool graph allocation ended with its context, yet: {:?}",
        record.outcome
    );
}

// ------------------------------------------------------------------------------------------
// 3. Before the fix: a graph allocation on another device than the launching context's.
//
// A graph launched on a stream of device 0 whose allocation node places its memory on device 1
// (`poolProps.location.id = 1`, no access descriptors: device 1 alone reaches it). Its memory
// exists only once GPU execution reaches the allocation node (programming guide: "A graph
// allocation's lifetime ... begins when GPU execution reaches the allocating graph node"), on
// device 0's stream. kreplay makes it tracked memory of device 1 at the API EXIT of
// cuGraphLaunch, but a replay on device 1 drains only device 1's contexts.
// ------------------------------------------------------------------------------------------

#[test]
fn a_replay_on_another_device_never_copies_a_graph_allocation_its_graph_has_not_reached() {
    let r = rig();
    let on1 = alloc(G, Place::Device(1));
    r.graphs.on_alloc_node(&r.inventory, on1.clone());
    r.instantiate(0xa1, &[on1], &[], 0);
    // cuGraphLaunch on device 0's stream: queued behind device 0's work; API EXIT.
    r.gpu.submit(0, |gpu| gpu.map(G, 5));
    r.launched(0xa1, CTX0);
    // A kernel on device 1 (agent scope: every tracked allocation of device 1).
    let record = run_on(&r, 1, &[Y], || r.gpu.add_one(Y, 1));
    assert_eq!(
        r.illegal(),
        0,
        "a snapshot of device 1 copied {G:#x} before device 0's stream ran its allocation node \
         (outcome {:?})",
        record.outcome
    );
}

// ------------------------------------------------------------------------------------------
// 4. Before the fix: a new allocation node at the address of a live graph allocation drops it.
//
// Graph G holds allocation A (not freed in G); its executable graph ran, so A is live. The
// application then extends G (cuStreamBeginCaptureToGraph, or cuGraphAddMemFreeNode +
// cuGraphAddMemAllocNode): a free node for A, then an allocation node B that depends on it,
// to which CUDA may give A's address ("a new allocation node (2) that can reuse the address
// freed by a dependent node (1)"). A stays live until the application frees it. kreplay's
// `on_alloc_node` drops every inventory entry overlapping B's address, A included, while A
// stays in its `backed` map: A is no longer snapshotted.
// ------------------------------------------------------------------------------------------

#[test]
fn a_new_allocation_node_at_a_live_graph_allocation_s_address_leaves_it_tracked() {
    let r = rig();
    r.graphs.on_alloc_node(&r.inventory, g_dev0());
    r.instantiate(0xe4, &[g_dev0()], &[], 0);
    r.gpu.map(G, 1000);
    r.launched(0xe4, CTX0);
    // The free node added to G makes no callback kreplay follows; the new allocation node does.
    r.graphs.on_alloc_node(&r.inventory, g_dev0());
    r.gpu.set_pointer(X, G);
    let record = run(&r, &[X], || r.gpu.bump_through_pointer(G_SIZE / 4));
    assert!(replayed(&record), "{:?}", record.outcome);
    assert_eq!(
        r.gpu.word(G),
        1001,
        "A at {G:#x} is live (backed={}, tracked={}): one run's increment expected",
        r.graphs.is_backed(G),
        r.inventory.get(G).is_some()
    );
    assert_eq!(r.illegal(), 0);
}

// ------------------------------------------------------------------------------------------
// A free the driver refuses.
// ------------------------------------------------------------------------------------------

/// A `cuMemFree` of backed graph memory that the driver refuses (a free made during another
/// thread's capture in global mode, for instance) leaves the memory live: at the free's API
/// EXIT it is tracked again as the same allocation, and launches reaching it are replayed with
/// it restored. Before, the free's API ENTER forgot it for good: a launch given it was replayed
/// while the memory was outside every snapshot (here: the replays added 4, not 1).
#[test]
fn a_refused_free_of_backed_graph_memory_leaves_it_tracked_as_before() {
    let r = rig();
    r.graphs.on_alloc_node(&r.inventory, g_dev0());
    r.instantiate(0xf, &[g_dev0()], &[], 0);
    r.gpu.map(G, 1000);
    r.launched(0xf, CTX0);
    let generation = r
        .inventory
        .get(G)
        .expect("backed after the launch")
        .generation;
    // cuMemFree(G): API ENTER forgets it; the driver refuses; API EXIT puts it back.
    let freed = r
        .graphs
        .free_enter(&r.inventory, G)
        .expect("backed graph memory");
    assert!(
        r.inventory.get(G).is_none(),
        "out of every snapshot while it is freed"
    );
    assert!(r.graphs.is_unbacked(G), "its graph still holds the node");
    assert!(r.graphs.free_failed(&r.inventory, freed));
    assert!(r.graphs.is_backed(G) && !r.graphs.is_unbacked(G));
    assert_eq!(r.inventory.get(G).map(|a| a.generation), Some(generation));
    r.gpu.set_pointer(X, G);
    let record = run(&r, &[X], || r.gpu.bump_through_pointer(G_SIZE / 4));
    assert!(replayed(&record), "{:?}", record.outcome);
    assert_eq!(r.gpu.word(G), 1001, "one run's increment");
    assert_eq!(r.illegal(), 0);
    // A free that succeeds ends it as before.
    assert!(r.graphs.free_enter(&r.inventory, G).is_some());
    assert!(!r.graphs.is_backed(G) && r.inventory.get(G).is_none());
}

/// A refused free puts nothing back over memory allocated at the address since (the driver's
/// answer came after another allocation took it): what is live wins.
#[test]
fn a_refused_free_of_graph_memory_never_overwrites_memory_allocated_since() {
    let r = rig();
    r.graphs.on_alloc_node(&r.inventory, g_dev0());
    r.instantiate(0xf, &[g_dev0()], &[], 0);
    r.gpu.map(G, 0);
    r.launched(0xf, CTX0);
    let freed = r.graphs.free_enter(&r.inventory, G).unwrap();
    let newer = r.inventory.on_alloc(NewAllocation {
        base: G,
        size: 64,
        owner_agent: 0,
        kind: MemoryKind::CoarseDevice,
    });
    assert!(!r.graphs.free_failed(&r.inventory, freed));
    assert_eq!(r.inventory.get(G).map(|a| a.generation), Some(newer));
    assert!(!r.graphs.is_backed(G));
}
