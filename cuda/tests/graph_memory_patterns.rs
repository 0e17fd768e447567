//! Sequences of graph operations that kreplay's graph-memory bookkeeping handles
//! correctly (the companion of `graph_memory_edges.rs`). The driver is
//! modelled as `inject` drives `kreplay_cuda::graphmem`; the fake device tracks, word by word,
//! which graph addresses have memory behind them, so a copy of any word of a graph address range
//! that no live allocation maps is an illegal address.

#[allow(dead_code)] // each test file uses part of it
mod graph_device;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use graph_device::Passes;
use kreplay_ctxmask::ContextRegistry;
use kreplay_cuda::contexts::Contexts;
use kreplay_cuda::graphmem::{
    CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH, GraphAlloc, GraphMemory, GraphNodes, Place,
};
use kreplay_cuda::scope::launch_filter;
use kreplay_cuda::{LaunchOps, Window, WindowContext};
use kreplay_locks::AgentLocks;
use kreplay_passloop::{DeclineReason, DispatchInfo, ReplayOutcome, ReplayRecord};
use kreplay_snapshot::{
    CopyError, DeviceMemory, Filter, Inventory, MemoryKind, NewAllocation, SnapshotConfig,
    Snapshotter, StoreTier,
};

const WORDS: usize = 8192;
/// Ordinary tracked allocation of device 0; its first 8 bytes hold a pointer.
const X: u64 = 0;
const X_SIZE: u64 = 4096;
/// Graph virtual address range [GRAPH_VA, GRAPH_VA + GRAPH_VA_SIZE).
const GRAPH_VA: u64 = 8192;
const GRAPH_VA_SIZE: u64 = 16384;
const G: u64 = GRAPH_VA;
const G_SIZE: u64 = 4096;
const CTX0: usize = 0xc0;

/// Word-granular fake device: graph addresses are reserved; a reserved word has memory behind
/// it only while mapped.
struct FakeGpu {
    words: Mutex<Vec<u32>>,
    mapped: Mutex<Vec<bool>>,
    illegal: AtomicUsize,
}

fn reserved(word: usize) -> bool {
    let a = word as u64 * 4;
    (GRAPH_VA..GRAPH_VA + GRAPH_VA_SIZE).contains(&a)
}

impl FakeGpu {
    fn new() -> FakeGpu {
        FakeGpu {
            words: Mutex::new((0..WORDS as u32).collect()),
            mapped: Mutex::new(vec![false; WORDS]),
            illegal: AtomicUsize::new(0),
        }
    }
    fn check(&self, addr: u64, len: u64) -> Result<(), CopyError> {
        let m = self.mapped.lock().unwrap();
        for w in (addr / 4) as usize..(addr + len).div_ceil(4) as usize {
            if reserved(w) && !m[w] {
                self.illegal.fetch_add(1, Ordering::SeqCst);
                return Err(CopyError::Failed {
                    addr,
                    len,
                    detail: format!("CUDA_ERROR_ILLEGAL_ADDRESS at {:#x}", w * 4),
                });
            }
        }
        Ok(())
    }
    fn map(&self, base: u64, size: u64, fill: u32) {
        let mut m = self.mapped.lock().unwrap();
        let mut w = self.words.lock().unwrap();
        for i in (base / 4) as usize..((base + size) / 4) as usize {
            m[i] = true;
            w[i] = fill;
        }
    }
    fn unmap(&self, base: u64, size: u64) {
        let mut m = self.mapped.lock().unwrap();
        for i in (base / 4) as usize..((base + size) / 4) as usize {
            m[i] = false;
        }
    }
    fn word(&self, addr: u64) -> u32 {
        self.words.lock().unwrap()[addr as usize / 4]
    }
    fn set_pointer(&self, value: u64) {
        let mut w = self.words.lock().unwrap();
        w[0] = value as u32;
        w[1] = (value >> 32) as u32;
    }
    fn add_one(&self, addr: u64, words: u64) {
        if self.check(addr, words * 4).is_err() {
            return;
        }
        let mut w = self.words.lock().unwrap();
        for i in addr / 4..addr / 4 + words {
            w[i as usize] += 1;
        }
    }
    /// `x += 1` on `words` words at the address `X`'s first 8 bytes hold.
    fn bump_through_pointer(&self, words: u64) {
        let target = {
            let w = self.words.lock().unwrap();
            u64::from(w[0]) | (u64::from(w[1]) << 32)
        };
        self.add_one(target, words);
    }
}

impl DeviceMemory for FakeGpu {
    fn read(&self, addr: u64, dst: &mut [u8]) -> Result<(), CopyError> {
        self.check(addr, dst.len() as u64)?;
        let w = self.words.lock().unwrap();
        let bytes = w.iter().flat_map(|x| x.to_le_bytes()).skip(addr as usize);
        for (b, from) in dst.iter_mut().zip(bytes) {
            *b = from;
        }
        Ok(())
    }
    fn write(&self, addr: u64, src: &[u8]) -> Result<(), CopyError> {
        self.check(addr, src.len() as u64)?;
        let mut w = self.words.lock().unwrap();
        for (i, b) in src.iter().enumerate() {
            let at = addr as usize + i;
            let mut word = w[at / 4].to_le_bytes();
            word[at % 4] = *b;
            w[at / 4] = u32::from_le_bytes(word);
        }
        Ok(())
    }
}

struct Rig {
    gpu: Arc<FakeGpu>,
    inventory: Arc<Inventory>,
    graphs: GraphMemory,
    contexts: Contexts,
    snapshotter: Snapshotter,
    locks: AgentLocks,
    registry: ContextRegistry,
}

fn rig() -> Rig {
    let gpu = Arc::new(FakeGpu::new());
    let inventory = Arc::new(Inventory::new());
    inventory.on_alloc(NewAllocation {
        base: X,
        size: X_SIZE,
        owner_agent: 0,
        kind: MemoryKind::CoarseDevice,
    });
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

fn dev0(base: u64, size: u64) -> GraphAlloc {
    GraphAlloc {
        base,
        size,
        place: Place::Device(0),
    }
}

impl Rig {
    fn instantiate(&self, exec: usize, allocs: &[GraphAlloc], frees: &[u64], flags: u64) {
        let nodes = GraphNodes {
            allocs: allocs.to_vec(),
            frees: frees.to_vec(),
        };
        self.graphs.on_instantiated(exec, Ok(nodes), flags);
    }
    /// API EXIT of a successful cuGraphLaunch (as inject's on_graph_launched).
    fn launched(&self, exec: usize) {
        let l = self.graphs.on_launched(&self.inventory, exec, Some(0));
        for &(base, _) in &l.backed {
            self.contexts.note_allocation(CTX0, base);
        }
        for &base in &l.freed {
            self.contexts.note_free(base);
        }
    }
    /// cuMemFree / cuMemFreeAsync ENTER on an ordinary stream.
    fn app_free(&self, a: &GraphAlloc) {
        self.contexts.note_free(a.base);
        if !self.graphs.on_free(&self.inventory, a.base) {
            self.inventory.on_free(a.base);
        }
        self.gpu.unmap(a.base, a.size);
    }
    /// An ordinary tracked allocation (cuMemAlloc) returned `base` (inject's on_alloc).
    fn ordinary_alloc(&self, base: u64, size: u64) {
        self.graphs.on_other_alloc(base, size);
        self.inventory.on_alloc(NewAllocation {
            base,
            size,
            owner_agent: 0,
            kind: MemoryKind::CoarseDevice,
        });
        self.contexts.note_allocation(CTX0, base);
    }
    fn context_destroyed(&self) {
        for base in self.contexts.forget(CTX0) {
            if !self.graphs.on_free(&self.inventory, base) {
                self.inventory.on_free(base);
            }
        }
    }
    fn illegal(&self) -> usize {
        self.gpu.illegal.load(Ordering::SeqCst)
    }
}

struct Launch<'a, K> {
    rig: &'a Rig,
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

fn run(rig: &Rig, values: &[u64], kernel: impl Fn()) -> ReplayRecord {
    let ops = Launch {
        rig,
        values: values.to_vec(),
        kernel,
    };
    let filter = Filter::for_replay(0);
    let cx = WindowContext {
        locks: &rig.locks,
        snapshotter: &rig.snapshotter,
        filter: &filter,
        registry: &rig.registry,
        group: &[],
    };
    let mut tool = Passes::default();
    let window = Window::enter(cx, &mut tool, DispatchInfo::default(), &ops);
    (ops.kernel)();
    window.exit(&mut tool, &rig.registry, &ops, Ok(()))
}

fn replayed(record: &ReplayRecord) -> bool {
    matches!(record.outcome, ReplayOutcome::Replayed { passes: 4, .. })
}

fn declined_untracked(record: &ReplayRecord) -> String {
    let d = record.outcome.decline().expect("declined");
    assert_eq!(d.reason, DeclineReason::UntrackedMemory, "{d}");
    d.detail.clone()
}

/// A kernel bumping `words` words through the pointer in `X` is replayed with them restored.
fn expect_restored_through_pointer(r: &Rig, target: u64, words: u64) {
    r.gpu.set_pointer(target);
    let before = r.gpu.word(target);
    let record = run(r, &[X], || r.gpu.bump_through_pointer(words));
    assert!(replayed(&record), "{:?}", record.outcome);
    assert_eq!(
        r.gpu.word(target),
        before + 1,
        "one run's increment at {target:#x}"
    );
    assert_eq!(r.illegal(), 0);
}

/// Relaunching an executable graph whose allocation is live, without auto-free, fails in the
/// driver (cuGraphLaunch: CUDA_ERROR_INVALID_VALUE): no API EXIT success, nothing changes; the
/// live allocation stays tracked once and restored.
#[test]
fn a_refused_relaunch_changes_nothing() {
    let r = rig();
    let g = dev0(G, G_SIZE);
    r.graphs.on_alloc_node(&r.inventory, g.clone());
    r.instantiate(0xe, std::slice::from_ref(&g), &[], 0);
    r.gpu.map(G, G_SIZE, 100);
    r.launched(0xe);
    // The relaunch fails: inject calls on_graph_launched only for CUDA_SUCCESS.
    expect_restored_through_pointer(&r, G, G_SIZE / 4);
    assert_eq!(r.inventory.len(), 2);
}

/// Auto-free on relaunch, interleaved with another graph's free node and replays: always
/// tracked exactly while live, restored, never copied while freed.
#[test]
fn auto_free_relaunches_and_a_foreign_free_node_interleave_correctly() {
    let r = rig();
    let g = dev0(G, G_SIZE);
    r.graphs.on_alloc_node(&r.inventory, g.clone());
    r.instantiate(
        0xa,
        std::slice::from_ref(&g),
        &[],
        CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH,
    );
    r.instantiate(0xb, &[], &[G], 0);
    for round in 0..3 {
        r.gpu.map(G, G_SIZE, 10 * round);
        r.launched(0xa);
        expect_restored_through_pointer(&r, G, G_SIZE / 4);
        // Relaunch with auto-free: freed and allocated again at the same address.
        r.gpu.map(G, G_SIZE, 10 * round + 5);
        r.launched(0xa);
        assert_eq!(r.inventory.len(), 2, "X and G once");
        expect_restored_through_pointer(&r, G, G_SIZE / 4);
        // B's free node.
        r.gpu.unmap(G, G_SIZE);
        r.launched(0xb);
        assert!(r.inventory.get(G).is_none() && r.graphs.is_unbacked(G));
        assert!(replayed(&run(&r, &[X], || r.gpu.add_one(X + 8, 1))));
        assert_eq!(r.illegal(), 0);
    }
}

/// A graph whose free node frees another graph's allocation, launched before that allocation
/// was ever made (the driver's error, or a no-op), changes nothing; later the order is right.
#[test]
fn a_free_node_launched_before_its_allocation_changes_nothing() {
    let r = rig();
    let g = dev0(G, G_SIZE);
    r.graphs.on_alloc_node(&r.inventory, g.clone());
    r.instantiate(0xa, std::slice::from_ref(&g), &[], 0);
    r.instantiate(0xb, &[], &[G], 0);
    r.launched(0xb);
    assert!(r.graphs.is_unbacked(G) && r.inventory.get(G).is_none());
    assert!(replayed(&run(&r, &[X], || r.gpu.add_one(X + 8, 1))));
    r.gpu.map(G, G_SIZE, 3);
    r.launched(0xa);
    expect_restored_through_pointer(&r, G, G_SIZE / 4);
    r.gpu.unmap(G, G_SIZE);
    r.launched(0xb);
    assert!(replayed(&run(&r, &[X], || r.gpu.add_one(X + 8, 1))));
    assert_eq!(r.illegal(), 0);
}

/// cuGraphExecDestroy before the first launch: the allocation stays unbacked (its node still
/// fixes the address); a new instantiation launched makes it live; destroyed after that launch,
/// the allocation stays live until cuMemFree, then nothing is known of it.
#[test]
fn exec_destroy_before_and_after_launch() {
    let r = rig();
    let g = dev0(G, G_SIZE);
    r.graphs.on_alloc_node(&r.inventory, g.clone());
    r.instantiate(0x1, std::slice::from_ref(&g), &[], 0);
    r.graphs.on_exec_destroyed(0x1);
    assert!(declined_untracked(&run(&r, &[G], || {})).contains("graph allocation"));
    r.instantiate(0x2, std::slice::from_ref(&g), &[], 0);
    r.gpu.map(G, G_SIZE, 40);
    r.launched(0x2);
    r.graphs.on_exec_destroyed(0x2);
    expect_restored_through_pointer(&r, G, G_SIZE / 4);
    r.app_free(&g);
    assert!(!r.graphs.is_backed(G) && !r.graphs.is_unbacked(G));
    assert!(replayed(&run(&r, &[X], || r.gpu.add_one(X + 8, 1))));
    assert_eq!(r.illegal(), 0);
}

/// A cuMemFreeAsync captured into a graph (ignored at its ENTER) whose capture ends without a
/// graph, or whose graph is never launched: the allocation stays live and restored.
#[test]
fn a_captured_free_that_never_runs_leaves_the_allocation_tracked() {
    let r = rig();
    let g = dev0(G, G_SIZE);
    r.graphs.on_captured_alloc(&r.inventory, g.clone());
    r.instantiate(0xa, std::slice::from_ref(&g), &[], 0);
    r.gpu.map(G, G_SIZE, 9);
    r.launched(0xa);
    // cuMemFreeAsync(G, capturing stream): inject returns before any bookkeeping; then
    // cuStreamEndCapture fails (no graph).
    expect_restored_through_pointer(&r, G, G_SIZE / 4);
}

/// A captured allocation whose capture is invalidated stays known (launches given it decline,
/// no copy ever touches it); an ordinary allocation later made at its address forgets it.
#[test]
fn an_invalidated_capture_s_allocation_is_never_copied_and_forgotten_on_reuse() {
    let r = rig();
    let g = dev0(G, G_SIZE);
    r.graphs.on_captured_alloc(&r.inventory, g.clone());
    assert!(replayed(&run(&r, &[X], || r.gpu.add_one(X + 8, 1))));
    assert!(declined_untracked(&run(&r, &[G + 4], || {})).contains("graph allocation"));
    // The capture's graph is gone; cuMemAlloc hands the address out again.
    r.ordinary_alloc(G, G_SIZE);
    r.gpu.map(G, G_SIZE, 0);
    assert_eq!(r.graphs.argument_reason(G + 4), None);
    expect_restored_through_pointer(&r, G, G_SIZE / 4);
}

/// The context of a launched device graph allocation ends while its executable graph is still
/// known: the allocation leaves the inventory (no copy of it), launches given its address
/// decline (documented), and an ordinary allocation taking the address clears that.
#[test]
fn a_device_graph_allocation_ends_with_its_context() {
    let r = rig();
    let g = dev0(G, G_SIZE);
    r.graphs.on_alloc_node(&r.inventory, g.clone());
    r.instantiate(0xa, std::slice::from_ref(&g), &[], 0);
    r.gpu.map(G, G_SIZE, 1);
    r.launched(0xa);
    r.context_destroyed();
    r.gpu.unmap(G, G_SIZE);
    assert!(r.inventory.get(G).is_none());
    // (X was not noted with the context in this rig; it stays.)
    assert!(replayed(&run(&r, &[X], || r.gpu.add_one(X + 8, 1))));
    assert_eq!(r.illegal(), 0);
    r.ordinary_alloc(G, G_SIZE);
    r.gpu.map(G, G_SIZE, 0);
    expect_restored_through_pointer(&r, G, G_SIZE / 4);
}

/// Address reuse within a graph at a different base: `tmp` (8 KiB at G) freed inside the
/// graph, `out` (4 KiB at G + 4 KiB) live after it. The inventory drops `tmp` when `out` is
/// added, so `out` is tracked and restored, and `tmp`'s other half is never copied.
#[test]
fn address_reuse_within_a_graph_at_another_base_is_followed() {
    let r = rig();
    let tmp = dev0(G, 2 * G_SIZE);
    let out = dev0(G + G_SIZE, G_SIZE);
    r.graphs.on_captured_alloc(&r.inventory, tmp.clone());
    r.graphs.on_captured_alloc(&r.inventory, out.clone());
    r.instantiate(0xc, &[tmp.clone(), out.clone()], &[G], 0);
    r.gpu.map(G, 2 * G_SIZE, 1);
    r.gpu.unmap(G, 2 * G_SIZE);
    r.gpu.map(G + G_SIZE, G_SIZE, 500);
    r.launched(0xc);
    expect_restored_through_pointer(&r, G + G_SIZE, G_SIZE / 4);
    assert!(declined_untracked(&run(&r, &[G + 8], || {})).contains("graph allocation"));
    assert_eq!(r.illegal(), 0);
}

/// Child-graph memory nodes (ownership moved to the parent) are applied like the parent's:
/// allocation in the child, free in the parent.
#[test]
fn child_graph_allocations_and_parent_frees_apply_in_one_launch() {
    let r = rig();
    let a = dev0(G, G_SIZE);
    let b = dev0(G + G_SIZE, G_SIZE);
    r.graphs.on_alloc_node(&r.inventory, a.clone());
    r.graphs.on_alloc_node(&r.inventory, b.clone());
    // walk(): parent [free of a], child [alloc a, alloc b] gives allocs [a, b], frees [a].
    r.instantiate(0x9, &[a.clone(), b.clone()], &[G], 0);
    r.gpu.map(G, G_SIZE, 1);
    r.gpu.unmap(G, G_SIZE);
    r.gpu.map(G + G_SIZE, G_SIZE, 70);
    r.launched(0x9);
    assert!(r.inventory.get(G).is_none());
    expect_restored_through_pointer(&r, G + G_SIZE, G_SIZE / 4);
}

/// The graph-memory parameter layouts and callback ids, against CUDA 13.0's headers
/// (`nvidia-cuda-runtime` 13.0.96's `cuda.h`, `nvidia-cuda-cupti` 13.0.85's
/// `cupti_driver_cbid.h` and `generated_cuda_meta.h`; offsets printed by a C program compiled
/// against them with `offsetof`/`sizeof`).
#[test]
fn graph_parameter_layouts_and_ids_match_the_cuda_13_0_headers() {
    use kreplay_cuda::cupti::{
        GraphAddMemAllocNodeParams, GraphAddNodeParams, GraphAddNodeV2Params, GraphInstantiateInfo,
        GraphInstantiateWithFlagsParams, GraphInstantiateWithParamsParams, GraphLaunchParams,
        GraphNodeParamsHead, MemAllocAsyncParams, MemAllocFromPoolAsyncParams, MemAllocNodeParams,
        MemFreeAsyncParams, MemPoolProps, cbid,
    };
    use std::mem::{align_of, offset_of, size_of};
    assert_eq!(
        (size_of::<MemPoolProps>(), align_of::<MemPoolProps>()),
        (88, 8)
    );
    assert_eq!(offset_of!(MemPoolProps, location_type), 8);
    assert_eq!(offset_of!(MemPoolProps, win32_security_attributes), 16);
    assert_eq!(offset_of!(MemPoolProps, max_size), 24);
    assert_eq!(offset_of!(MemPoolProps, usage), 32);
    assert_eq!(size_of::<MemAllocNodeParams>(), 120);
    assert_eq!(offset_of!(MemAllocNodeParams, access_descs), 88);
    assert_eq!(offset_of!(MemAllocNodeParams, access_desc_count), 96);
    assert_eq!(offset_of!(MemAllocNodeParams, bytesize), 104);
    assert_eq!(offset_of!(MemAllocNodeParams, dptr), 112);
    // CUgraphNodeParams: 256 bytes, `alloc` at 16 (the head read here is its first 136).
    assert_eq!(offset_of!(GraphNodeParamsHead, alloc), 16);
    assert!(size_of::<GraphNodeParamsHead>() <= 256);
    assert_eq!(size_of::<GraphInstantiateInfo>(), 32);
    assert_eq!(offset_of!(GraphInstantiateInfo, upload_stream), 8);
    assert_eq!(offset_of!(GraphInstantiateInfo, result_out), 24);
    assert_eq!(offset_of!(GraphAddMemAllocNodeParams, node_params), 32);
    assert_eq!(offset_of!(GraphAddNodeParams, node_params), 32);
    assert_eq!(offset_of!(GraphAddNodeV2Params, dependency_data), 24);
    assert_eq!(offset_of!(GraphAddNodeV2Params, num_dependencies), 32);
    assert_eq!(offset_of!(GraphAddNodeV2Params, node_params), 40);
    assert_eq!(offset_of!(GraphInstantiateWithFlagsParams, flags), 16);
    assert_eq!(
        offset_of!(GraphInstantiateWithParamsParams, instantiate_params),
        16
    );
    assert_eq!(offset_of!(GraphLaunchParams, stream), 8);
    assert_eq!(offset_of!(MemFreeAsyncParams, stream), 8);
    assert_eq!(offset_of!(MemAllocAsyncParams, stream), 16);
    assert_eq!(offset_of!(MemAllocFromPoolAsyncParams, stream), 24);
    let ids = [
        (cbid::CU_GRAPH_INSTANTIATE, 513),
        (cbid::CU_GRAPH_LAUNCH, 514),
        (cbid::CU_GRAPH_LAUNCH_PTSZ, 515),
        (cbid::CU_GRAPH_EXEC_DESTROY, 516),
        (cbid::CU_GRAPH_INSTANTIATE_V2, 578),
        (cbid::CU_MEM_ALLOC_ASYNC, 598),
        (cbid::CU_MEM_ALLOC_ASYNC_PTSZ, 599),
        (cbid::CU_MEM_FREE_ASYNC, 600),
        (cbid::CU_MEM_FREE_ASYNC_PTSZ, 601),
        (cbid::CU_MEM_ALLOC_FROM_POOL_ASYNC, 611),
        (cbid::CU_MEM_ALLOC_FROM_POOL_ASYNC_PTSZ, 612),
        (cbid::CU_GRAPH_ADD_MEM_ALLOC_NODE, 638),
        (cbid::CU_GRAPH_INSTANTIATE_WITH_FLAGS, 643),
        (cbid::CU_GRAPH_INSTANTIATE_WITH_PARAMS, 656),
        (cbid::CU_GRAPH_INSTANTIATE_WITH_PARAMS_PTSZ, 657),
        (cbid::CU_GRAPH_ADD_NODE, 712),
        (cbid::CU_STREAM_BEGIN_CAPTURE_TO_GRAPH, 720),
        (cbid::CU_STREAM_BEGIN_CAPTURE_TO_GRAPH_PTSZ, 721),
        (cbid::CU_GRAPH_ADD_NODE_V2, 723),
    ];
    for (ours, header) in ids {
        assert_eq!(ours, header);
    }
}
