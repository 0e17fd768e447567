//! Memory CUDA graphs allocate, through the replay window over a host fake whose graph
//! allocations have no memory behind them until their graph is launched: touching one then is
//! an illegal address (on a GPU it poisons the context and the application dies), counted here
//! and failing the copy.
//!
//! The launch operations consult [`GraphMemory`] the way the injected library does
//! (`covered` asks [`GraphMemory::untracked_reason`], the argument scan asks
//! [`GraphMemory::argument_reason`] for values kreplay does not track), and the "driver" calls
//! the bookkeeping where the callbacks do: a captured `cuMemAllocAsync` or
//! `cuGraphAddMemAllocNode` at its API EXIT, `cuGraphInstantiate*` with the graph's memory
//! nodes, `cuGraphLaunch` at its API EXIT, `cuMemFreeAsync` at its API ENTER.

#[allow(dead_code)] // each test file uses part of it
mod graph_device;

use std::cell::RefCell;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use graph_device::GraphDevice;
use kreplay_ctxmask::ContextRegistry;
use kreplay_cuda::graphmem::{
    CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH, GraphAlloc, GraphApi, GraphMemory, GraphNodes,
    Place, walk,
};
use kreplay_cuda::scope::launch_filter;
use kreplay_cuda::{LaunchOps, Window, WindowContext};
use kreplay_locks::AgentLocks;
use kreplay_passloop::{
    ContinueChange, DeclineReason, DispatchInfo, MemoryOpReport, Phase, ReplayOutcome,
    ReplayRecord, ReplayTool, RestoreRequest, ToolAnswer,
};
use kreplay_snapshot::{
    Filter, Inventory, MemoryKind, NewAllocation, SnapshotConfig, Snapshotter, StoreTier,
};

const AGENT: u64 = 0;
/// An ordinary tracked allocation (`cudaMalloc`): its first 8 bytes hold a pointer.
const X: u64 = 0;
const X_SIZE: u64 = 4096;
/// A graph allocation.
const G: u64 = 8192;
const G_SIZE: u64 = 4096;

/// The kernel outside the graph: `x += 1` on every word of the buffer whose address the first
/// 8 bytes of `X` hold (a pointer kept in device memory), and on `X`'s last word.
fn bump_through_pointer(device: &GraphDevice) {
    device.bump_through_pointer(G_SIZE / 4);
    device.add_one(X + X_SIZE - 4, 1);
}

/// A device with `X` tracked, graph allocation `G` known to the fake driver, and the graph
/// bookkeeping.
struct Rig {
    device: Arc<GraphDevice>,
    inventory: Arc<Inventory>,
    graphs: GraphMemory,
    snapshotter: Snapshotter,
    locks: AgentLocks,
    filter: Filter,
    registry: ContextRegistry,
    events: Arc<Mutex<Vec<String>>>,
}

fn rig() -> Rig {
    let device = Arc::new(GraphDevice::new(&[(G, G_SIZE)]));
    let inventory = Arc::new(Inventory::new());
    inventory.on_alloc(NewAllocation {
        base: X,
        size: X_SIZE,
        owner_agent: AGENT,
        kind: MemoryKind::CoarseDevice,
    });
    let snapshotter = Snapshotter::new(
        inventory.clone(),
        device.clone(),
        SnapshotConfig::default().with_store(StoreTier::Host),
    )
    .unwrap();
    let locks = AgentLocks::new();
    locks.set_enabled(true);
    Rig {
        device,
        inventory,
        graphs: GraphMemory::new(),
        snapshotter,
        locks,
        filter: Filter::for_replay(AGENT),
        registry: ContextRegistry::new(),
        events: Arc::default(),
    }
}

fn g_alloc() -> GraphAlloc {
    GraphAlloc {
        base: G,
        size: G_SIZE,
        place: Place::Device(AGENT as i32),
    }
}

impl Rig {
    /// `cudaMallocAsync` on a capturing stream returned `G`.
    fn capture_alloc(&self) {
        self.graphs.on_captured_alloc(&self.inventory, g_alloc());
    }

    /// `cuGraphInstantiate*` of a graph with these memory nodes made `exec`.
    fn instantiate(&self, exec: usize, allocs: &[GraphAlloc], frees: &[u64], flags: u64) {
        let nodes = GraphNodes {
            allocs: allocs.to_vec(),
            frees: frees.to_vec(),
        };
        self.graphs.on_instantiated(exec, Ok(nodes), flags);
    }

    /// `cuGraphLaunch` of `exec`: the graph runs (its allocation nodes map `allocs`, filled
    /// with `fill`; its free nodes unmap `frees`), then its API EXIT.
    fn graph_launch(&self, exec: usize, allocs: &[u64], frees: &[u64], fill: u32) {
        for &a in allocs {
            self.device.map(a, fill);
        }
        for &f in frees {
            self.device.unmap(f);
        }
        self.graphs.on_launched(&self.inventory, exec, Some(0));
    }

    /// `cuMemFreeAsync` of `base` on an ordinary stream.
    fn free(&self, base: u64) {
        if !self.graphs.on_free(&self.inventory, base) {
            self.inventory.on_free(base);
        }
        self.device.unmap(base);
    }

    fn context(&self) -> WindowContext<'_> {
        WindowContext {
            locks: &self.locks,
            snapshotter: &self.snapshotter,
            filter: &self.filter,
            registry: &self.registry,
            group: &[],
        }
    }

    fn illegal(&self) -> usize {
        self.device.illegal.load(Ordering::SeqCst)
    }
}

/// A launch whose snapshot is scoped as the injected library scopes it: the device's tracked
/// allocations and what its argument `values` point into, graph memory consulted for what the
/// inventory does not hold.
struct GraphAwareLaunch<'a, K> {
    rig: &'a Rig,
    values: Vec<u64>,
    kernel: K,
}

impl<K: Fn()> LaunchOps for GraphAwareLaunch<'_, K> {
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
        self.rig.events.lock().unwrap().push("drain".into());
        Ok(())
    }
    fn wait(&self) -> Result<(), String> {
        Ok(())
    }
    fn relaunch(&self) -> Result<(), String> {
        self.rig.events.lock().unwrap().push("relaunch".into());
        (self.kernel)();
        Ok(())
    }
}

/// A tool asking for `passes`.
struct Passes(u64, Arc<Mutex<Vec<String>>>, RefCell<Option<ReplayOutcome>>);

impl ReplayTool for Passes {
    fn config_enter(&mut self, _: &DispatchInfo) -> ToolAnswer {
        ToolAnswer::passes(self.0)
    }
    fn pass_enter(&mut self, _: &DispatchInfo, _: u64, _: u64) {}
    fn pass_exit(&mut self, _: &DispatchInfo, _: u64, _: u64) -> ContinueChange {
        ContinueChange::Keep
    }
    fn should_continue(&mut self, _: &DispatchInfo, _: u64, _: u64) -> bool {
        true
    }
    fn snapshot(&mut self, _: &DispatchInfo, phase: Phase, _: &MemoryOpReport) {
        self.1.lock().unwrap().push(format!("snapshot {phase:?}"));
    }
    fn restore(&mut self, _: &DispatchInfo, _: Phase, _: &RestoreRequest, _: &MemoryOpReport) {}
    fn config_exit(&mut self, _: &DispatchInfo, outcome: &ReplayOutcome) {
        *self.2.borrow_mut() = Some(outcome.clone());
    }
}

/// ENTER, the application's launch (`kernel`), EXIT, with 4 passes asked.
fn run(rig: &Rig, values: &[u64], kernel: impl Fn()) -> ReplayRecord {
    rig.events.lock().unwrap().clear();
    let ops = GraphAwareLaunch {
        rig,
        values: values.to_vec(),
        kernel,
    };
    let mut tool = Passes(4, rig.events.clone(), RefCell::new(None));
    let window = Window::enter(rig.context(), &mut tool, DispatchInfo::default(), &ops);
    (ops.kernel)();
    let record = window.exit(&mut tool, &rig.registry, &ops, Ok(()));
    assert_eq!(tool.2.borrow().as_ref(), Some(&record.outcome));
    record
}

fn replayed(record: &ReplayRecord) -> bool {
    matches!(record.outcome, ReplayOutcome::Replayed { passes: 4, .. })
}

fn declined_untracked(record: &ReplayRecord) -> String {
    let d = record.outcome.decline().expect("declined");
    assert_eq!(d.reason, DeclineReason::UntrackedMemory, "{d}");
    d.detail.clone()
}

/// Between the end of a capture and the graph's first launch, a launch of another kernel is
/// replayed with the device's tracked memory, and its snapshot never touches the captured
/// allocation, which has no memory behind it (tracked like any other allocation, it was copied:
/// an illegal address that kills the application).
#[test]
fn a_captured_allocation_is_never_copied_before_its_graph_runs() {
    let r = rig();
    r.capture_alloc();
    let record = run(&r, &[X], || r.device.add_one(X, X_SIZE / 4));
    assert_eq!(
        r.illegal(),
        0,
        "a copy touched the unbacked graph allocation"
    );
    assert!(replayed(&record), "{:?}", record.outcome);
    assert_eq!(r.device.word(X), 1, "one run's increment");
    assert_eq!(r.device.word(X + X_SIZE - 4), X_SIZE as u32 / 4);
    assert!(r.graphs.is_unbacked(G));
    assert!(r.inventory.lookup(G).is_none());
}

/// A launch whose argument points into a graph allocation that has no memory behind it yet is
/// declined before any drain or copy, with a reason that names it.
#[test]
fn a_launch_pointing_into_an_unlaunched_graph_allocation_is_declined() {
    for node_by_node in [false, true] {
        let r = rig();
        if node_by_node {
            r.graphs.on_alloc_node(&r.inventory, g_alloc());
        } else {
            r.capture_alloc();
        }
        let record = run(&r, &[X, G + 64], || {});
        let why = declined_untracked(&record);
        assert!(
            why.contains("graph allocation") && why.contains("0x2000"),
            "{why}"
        );
        assert_eq!(r.illegal(), 0);
        let events = r.events.lock().unwrap();
        assert!(
            !events
                .iter()
                .any(|e| e == "drain" || e.starts_with("snapshot")),
            "{events:?}"
        );
    }
}

/// Once the graph has run, its allocation is ordinary device memory: a kernel outside the graph
/// that reaches it only through a pointer kept in memory is replayed with it restored, so it
/// holds one run's increment. After a stream free it is gone: no copy touches it again.
#[test]
fn after_its_graph_runs_a_captured_allocation_is_snapshotted_and_restored_until_freed() {
    let r = rig();
    r.capture_alloc();
    r.instantiate(0xe1, &[g_alloc()], &[], 0);
    r.graph_launch(0xe1, &[G], &[], 1000);
    assert!(r.graphs.is_backed(G));
    r.device.set_pointer(X, G);
    let record = run(&r, &[X], || bump_through_pointer(&r.device));
    assert!(replayed(&record), "{:?}", record.outcome);
    assert_eq!(r.illegal(), 0);
    for at in (G..G + G_SIZE).step_by(4) {
        assert_eq!(r.device.word(at), 1001, "word at {at:#x}: not one run's");
    }
    // Freed (cuMemFreeAsync): out of the inventory, and the next snapshot leaves it alone.
    r.free(G);
    assert!(r.inventory.lookup(G).is_none() && !r.graphs.is_backed(G));
    let record = run(&r, &[X], || r.device.add_one(X + 8, 1));
    assert!(replayed(&record), "{:?}", record.outcome);
    assert_eq!(r.illegal(), 0);
    // Its executable graph still allocates it: until the graph runs again it has no memory.
    let why = declined_untracked(&run(&r, &[G], || {}));
    assert!(why.contains("graph allocation"), "{why}");
}

/// An allocation node added node by node (`cuGraphAddMemAllocNode`) becomes tracked device
/// memory when a graph holding it is launched (untracked, the kernel outside the graph was
/// replayed with it unrestored: four increments instead of one).
#[test]
fn a_node_by_node_allocation_becomes_tracked_when_its_graph_is_launched() {
    let r = rig();
    r.graphs.on_alloc_node(&r.inventory, g_alloc());
    r.instantiate(0xe2, &[g_alloc()], &[], 0);
    assert!(declined_untracked(&run(&r, &[G], || {})).contains("graph allocation"));
    r.graph_launch(0xe2, &[G], &[], 7);
    let a = r.inventory.lookup(G + 100).expect("tracked once launched");
    assert_eq!((a.base, a.size, a.owner_agent), (G, G_SIZE, AGENT));
    r.device.set_pointer(X, G);
    for launches in 1..=3u32 {
        let record = run(&r, &[X], || bump_through_pointer(&r.device));
        assert!(replayed(&record), "{:?}", record.outcome);
        assert_eq!(
            r.device.word(G),
            7 + launches,
            "after {launches} launch(es)"
        );
        assert_eq!(r.device.word(G + G_SIZE - 4), 7 + launches);
    }
    assert_eq!(r.illegal(), 0);
}

/// A free node of a later launched graph ends the allocation; the graph that allocates it
/// allocates it again at its next launch, and with auto-free on relaunch its relaunch keeps
/// it tracked, once.
#[test]
fn free_nodes_and_relaunches_follow_the_allocation() {
    let r = rig();
    r.graphs.on_alloc_node(&r.inventory, g_alloc());
    r.instantiate(
        0xa,
        &[g_alloc()],
        &[],
        CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH,
    );
    r.instantiate(0xb, &[], &[G], 0);
    assert_eq!(r.graphs.auto_frees(0xa), Some(true));
    assert_eq!(r.graphs.auto_frees(0xb), Some(false));
    r.graph_launch(0xa, &[G], &[], 5);
    assert!(r.inventory.get(G).is_some());
    // Auto-free on relaunch: freed and allocated again at the same address.
    r.graph_launch(0xa, &[G], &[], 5);
    assert!(r.graphs.is_backed(G));
    assert_eq!(r.inventory.len(), 2, "X and G, each once");
    // Graph B's free node.
    r.graph_launch(0xb, &[], &[G], 0);
    assert!(r.inventory.get(G).is_none());
    assert!(
        r.graphs.is_unbacked(G),
        "graph A allocates it again when it runs"
    );
    let record = run(&r, &[X], || r.device.add_one(X, 1));
    assert!(replayed(&record));
    assert_eq!(r.illegal(), 0);
    r.graph_launch(0xa, &[G], &[], 5);
    assert!(r.inventory.get(G).is_some());
    // A destroyed executable graph leaves what it allocated live until freed, then forgotten.
    r.graphs.on_exec_destroyed(0xa);
    r.graphs.on_exec_destroyed(0xb);
    assert!(r.inventory.get(G).is_some());
    r.free(G);
    assert!(!r.graphs.is_unbacked(G) && !r.graphs.is_backed(G));
    assert_eq!(r.graphs.argument_reason(G), None);
}

/// A `cuGraphExecDestroy` the driver refuses (a handle it does not know, a destroy racing
/// another) leaves the executable graph live. Its API ENTER forgot it, and it stayed forgotten:
/// its next launch was no longer known to allocate its memory, which stayed out of the
/// inventory, and a kernel writing it through a pointer kept in memory had its writes repeated
/// by every pass with no restore. Now it is tracked again at the call's API EXIT.
#[test]
fn a_graph_destroy_the_driver_refuses_leaves_its_launches_allocating() {
    let r = rig();
    r.capture_alloc();
    r.instantiate(0xe3, &[g_alloc()], &[], 0);
    r.graph_launch(0xe3, &[G], &[], 10);
    r.free(G);
    assert!(r.graphs.is_unbacked(G), "its graph allocates it again");
    let destroyed = r.graphs.exec_destroy_enter(0xe3);
    assert!(!r.graphs.allocates(0xe3), "forgotten during the call");
    // The driver refused the destroy.
    assert!(
        r.graphs
            .exec_destroy_failed(destroyed.expect("it was known"))
    );
    assert!(r.graphs.allocates(0xe3));
    assert!(r.graphs.is_unbacked(G), "no memory behind it until it runs");
    r.graph_launch(0xe3, &[G], &[], 20);
    assert!(
        r.inventory.get(G).is_some(),
        "backed by the launch, tracked"
    );
    r.device.set_pointer(X, G);
    let record = run(&r, &[X], || bump_through_pointer(&r.device));
    assert!(replayed(&record), "{:?}", record.outcome);
    assert_eq!(r.device.word(G), 21, "one run's increment");
    assert_eq!(r.illegal(), 0);
    // A destroy that succeeded forgets it for good; nothing comes back of an unknown handle.
    assert!(r.graphs.exec_destroy_enter(0xe3).is_some());
    assert!(!r.graphs.allocates(0xe3));
    assert!(r.graphs.exec_destroy_enter(0xe3).is_none());
    // A graph instantiated at the handle meanwhile is the live one: never overwritten.
    r.instantiate(0xe4, &[g_alloc()], &[], 0);
    let destroyed = r.graphs.exec_destroy_enter(0xe4).unwrap();
    r.instantiate(0xe4, &[], &[G], 0);
    assert!(!r.graphs.exec_destroy_failed(destroyed));
    assert!(!r.graphs.allocates(0xe4));
}

/// A graph that allocates and frees within itself leaves nothing to snapshot after it ran.
#[test]
fn an_allocation_freed_by_its_own_graph_is_never_snapshotted() {
    let r = rig();
    r.capture_alloc();
    r.instantiate(0xc, &[g_alloc()], &[G], 0);
    r.graph_launch(0xc, &[G], &[G], 3);
    assert!(r.inventory.get(G).is_none());
    assert!(r.graphs.is_unbacked(G));
    let record = run(&r, &[X], || r.device.add_one(X, 1));
    assert!(replayed(&record));
    assert!(declined_untracked(&run(&r, &[G + 4], || {})).contains("graph allocation"));
    assert_eq!(r.illegal(), 0);
}

/// Graph memory that is not pinned device memory (a host or managed pool) is not snapshotted:
/// while it is live every launch runs once.
#[test]
fn graph_memory_outside_device_memory_declines_launches_while_live() {
    let r = rig();
    let host = GraphAlloc {
        base: G,
        size: G_SIZE,
        place: Place::from_pool(1, 2, 0),
    };
    assert!(matches!(host.place, Place::Other(_)));
    r.graphs.on_alloc_node(&r.inventory, host.clone());
    r.instantiate(0xd, &[host], &[], 0);
    assert!(replayed(&run(&r, &[X], || r.device.add_one(X, 1))));
    r.graph_launch(0xd, &[G], &[], 0);
    assert!(r.inventory.get(G).is_none(), "never in the inventory");
    let why = declined_untracked(&run(&r, &[X], || r.device.add_one(X, 1)));
    assert!(why.contains("not snapshotted"), "{why}");
    r.free(G);
    assert!(replayed(&run(&r, &[X], || r.device.add_one(X, 1))));
    assert_eq!(r.illegal(), 0);
}

/// An executable graph whose memory nodes could not be read may allocate memory kreplay cannot
/// describe: once it is launched, every launch is declined.
#[test]
fn a_launched_graph_whose_nodes_could_not_be_read_declines_every_later_launch() {
    let r = rig();
    r.graphs
        .on_instantiated(0xf, Err("cuGraphGetNodes failed".into()), 0);
    assert!(replayed(&run(&r, &[X], || r.device.add_one(X, 1))));
    r.graphs.on_launched(&r.inventory, 0xf, Some(0));
    let why = declined_untracked(&run(&r, &[X], || r.device.add_one(X, 1)));
    assert!(why.contains("cuGraphGetNodes failed"), "{why}");
    r.graphs.on_exec_destroyed(0xf);
    assert!(r.graphs.untracked_reason().is_some(), "for good");
}

/// A graph allocation whose address another allocation got (its graph was destroyed) is no
/// longer one; a tracked allocation under a new graph allocation was freed unseen and is
/// dropped, so no snapshot copies there.
#[test]
fn addresses_handed_out_again_end_what_was_there() {
    let r = rig();
    r.capture_alloc();
    r.graphs.on_other_alloc(G - 4096, 8192);
    assert_eq!(r.graphs.argument_reason(G + 8), None);
    // A stale entry (a free kreplay did not see) where the driver now puts a graph allocation.
    r.inventory.on_alloc(NewAllocation {
        base: G,
        size: G_SIZE,
        owner_agent: AGENT,
        kind: MemoryKind::CoarseDevice,
    });
    r.graphs.on_alloc_node(&r.inventory, g_alloc());
    assert!(r.inventory.get(G).is_none());
    assert!(replayed(&run(&r, &[X], || r.device.add_one(X, 1))));
    assert_eq!(r.illegal(), 0);
}

/// A fake driver graph: node handles are indices into `nodes` (type, payload), graphs are
/// lists of node indices.
struct FakeGraphs {
    graphs: Vec<Vec<usize>>,
    nodes: Vec<(i32, u64)>,
    broken: Option<usize>,
}

impl GraphApi for FakeGraphs {
    fn nodes(&self, graph: usize) -> Result<Vec<usize>, String> {
        self.graphs
            .get(graph)
            .cloned()
            .ok_or_else(|| format!("no graph {graph}"))
    }
    fn node_type(&self, node: usize) -> Result<i32, String> {
        if self.broken == Some(node) {
            return Err("cuGraphNodeGetType failed: CUDA_ERROR_INVALID_VALUE".into());
        }
        Ok(self.nodes[node].0)
    }
    fn alloc(&self, node: usize) -> Result<GraphAlloc, String> {
        Ok(GraphAlloc {
            base: self.nodes[node].1,
            size: 256,
            place: Place::Device(0),
        })
    }
    fn freed(&self, node: usize) -> Result<u64, String> {
        Ok(self.nodes[node].1)
    }
    fn child(&self, node: usize) -> Result<usize, String> {
        Ok(self.nodes[node].1 as usize)
    }
}

#[test]
fn the_walk_finds_memory_nodes_in_child_graphs_and_reports_what_it_cannot_read() {
    // Graph 0: a kernel node, an allocation at 0x1000, a child graph (graph 1); graph 1: a
    // free of 0x5000 and a child graph (graph 2) holding an allocation at 0x2000.
    let mut g = FakeGraphs {
        graphs: vec![vec![0, 1, 2], vec![3, 4], vec![5]],
        nodes: vec![
            (0, 0),
            (10, 0x1000),
            (4, 1),
            (11, 0x5000),
            (4, 2),
            (10, 0x2000),
        ],
        broken: None,
    };
    let nodes = walk(0, &g).unwrap();
    let bases: Vec<u64> = nodes.allocs.iter().map(|a| a.base).collect();
    assert_eq!(bases, vec![0x1000, 0x2000]);
    assert_eq!(nodes.frees, vec![0x5000]);
    g.broken = Some(4);
    let why = walk(0, &g).unwrap_err();
    assert!(why.contains("cuGraphNodeGetType"), "{why}");
    // A child graph that names itself (a broken answer) ends the walk with an error.
    g.broken = None;
    g.graphs[2] = vec![6];
    g.nodes.push((4, 2));
    assert!(walk(0, &g).unwrap_err().contains("nested deeper"));
}
