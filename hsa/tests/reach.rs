//! What a replayed kernel can reach is what the snapshot covers: every kind of memory a kernel
//! argument points into (coarse-grained on the dispatch's agent or on another agent,
//! fine-grained, host, kernarg-pool memory, memory kreplay never saw allocated), and the
//! writable module-scope variables of the executables loaded on the agent.
//!
//! Each scenario runs the same kernel as an application would, replayed with three passes, and
//! asserts that the application's result equals one unprofiled run (`x + 1`, a counter at 1),
//! or that the replay was declined with the right reason and the dispatch ran once.

#[macro_use]
#[allow(dead_code)]
mod support;

use std::ffi::c_void;
use std::sync::atomic::{AtomicU32, Ordering};

use hsa_sys::*;
use kreplay_drain::DrainConfig;
use kreplay_hsa::InstallOptions;
use kreplay_passloop::{LoopEnd, MemoryOpReport, Phase, ReplayOutcome};
use kreplay_snapshot::SnapshotConfig;
use kreplay_softhsa::WorkGroup;
use support::app::{self, App, Aql, Pools, Ptr, WAIT};
use support::tool::{Event, Script, TestHooks};

/// Arguments of `add_one`.
#[repr(C)]
#[derive(Clone, Copy)]
struct AddArgs {
    buf: u64,
    len: u32,
    pad: u32,
}

static RUNS: AtomicU32 = AtomicU32::new(0);

/// `x[i] += 1` for the first `len` elements; work-group 0 counts the run.
fn add_one(group: &WorkGroup) {
    // SAFETY: every dispatch of this kernel carries an `AddArgs` block.
    let args: AddArgs = unsafe { group.kernargs() };
    if group.group_id() == [0, 0, 0] {
        RUNS.fetch_add(1, Ordering::SeqCst);
    }
    for [i, _, _] in group.work_items() {
        if i < args.len {
            // SAFETY: the buffer holds `len` u32; each work-item owns index `i`.
            unsafe { *(args.buf as *mut u32).add(i as usize) += 1 };
        }
    }
}

/// One work-item: `*counter += 1` (an atomic, as a kernel bumping a shared counter would).
fn bump(group: &WorkGroup) {
    // SAFETY: every dispatch of this kernel carries an `AddArgs` block.
    let args: AddArgs = unsafe { group.kernargs() };
    RUNS.fetch_add(1, Ordering::SeqCst);
    // SAFETY: the argument points at a live, 4-byte aligned u32.
    let counter = unsafe { &*(args.buf as *const AtomicU32) };
    counter.fetch_add(1, Ordering::SeqCst);
}

/// Where the loaded `reach_count` module variable lives (the kernel's code refers to it
/// directly, as code refers to a `__device__` global; no argument points at it).
static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// `counter += 1` on the module variable, once per dispatch.
fn count_in_module(_: &WorkGroup) {
    RUNS.fetch_add(1, Ordering::SeqCst);
    let addr = COUNTER.load(Ordering::SeqCst);
    // SAFETY: the test stored the address of the live, aligned u32 variable.
    unsafe { &*(addr as *const AtomicU32) }.fetch_add(1, Ordering::SeqCst);
}

/// Arguments of `add_everywhere`: five buffers of `len` u32 each.
#[repr(C)]
#[derive(Clone, Copy)]
struct ManyArgs {
    bufs: [u64; 5],
    len: u32,
    pad: u32,
}

/// `x[i] += 1` in each of five buffers.
fn add_everywhere(group: &WorkGroup) {
    // SAFETY: every dispatch of this kernel carries a `ManyArgs` block.
    let args: ManyArgs = unsafe { group.kernargs() };
    if group.group_id() == [0, 0, 0] {
        RUNS.fetch_add(1, Ordering::SeqCst);
    }
    for [i, _, _] in group.work_items() {
        if i < args.len {
            for buf in args.bufs {
                // SAFETY: each buffer holds `len` u32; each work-item owns index `i`.
                unsafe { *(buf as *mut u32).add(i as usize) += 1 };
            }
        }
    }
}

/// Every kind of memory an argument can reach, written by one kernel under `strategy` (and
/// through the runtime's copy API only when `runtime_copies`): one run's result in each.
fn every_kind_once_under(strategy: kreplay_snapshot::RestoreStrategy, runtime_copies: bool) {
    let hooks = TestHooks::new(0);
    let app = app::install(
        hooks.clone(),
        InstallOptions {
            snapshot: SnapshotConfig::default()
                .with_strategy(strategy)
                .with_chunk_size(4096),
            drain: DrainConfig::new(WAIT),
            force_runtime_copies: runtime_copies,
            ..Default::default()
        },
    );
    hooks.configure_replay(true);
    hooks.set_script(Script::passes(4));
    let env = Env {
        pools: [app.pools(app.gpus[0]), app.pools(app.gpus[1])],
        app,
        hooks,
    };
    let len = 4096u32;
    let init = values(len as usize);
    let bufs = [
        env.app.buffer(env.pools[0].coarse, &init),
        env.app.buffer(env.pools[1].coarse, &init),
        env.app.buffer(env.pools[0].fine, &init),
        env.app.buffer(env.app.host_pool(), &init),
        env.app.buffer(env.pools[0].kernarg, &init),
    ];
    let kernel = kreplay_softhsa::register_kernel("reach_add_everywhere", add_everywhere);
    let q = env.app.queue(env.app.gpus[0]);
    let done = env.app.signal(1);
    let args = env.app.kernargs(
        &env.pools[0],
        ManyArgs {
            bufs: bufs.map(|b| b.0),
            len,
            pad: 0,
        },
    );
    env.app
        .dispatch(q, Aql::dispatch(kernel, len, 256, args, done));
    assert_eq!(env.app.wait_zero(done), 0);
    let id = env.only_dispatch();
    assert_eq!(
        env.hooks.finished_record(id).outcome,
        ReplayOutcome::Replayed {
            passes: 4,
            end: LoopEnd::LastPass
        }
    );
    assert_eq!(RUNS.load(Ordering::SeqCst), 4);
    for (i, buf) in bufs.iter().enumerate() {
        assert_eq!(
            env.app.read(*buf, len as usize),
            plus_one(&init),
            "buffer {i} under {strategy}"
        );
    }
    let exit = env.snapshot_exit(id);
    assert_eq!(
        (exit.sources.agent.regions, exit.sources.referenced.regions),
        (1, 4),
        "{exit:?}"
    );
}

struct Env {
    app: App,
    hooks: std::sync::Arc<TestHooks>,
    pools: [Pools; 2],
}

fn setup(snapshot: SnapshotConfig) -> Env {
    let hooks = TestHooks::new(0);
    let app = app::install(
        hooks.clone(),
        InstallOptions {
            snapshot,
            drain: DrainConfig::new(WAIT),
            ..Default::default()
        },
    );
    hooks.configure_replay(true);
    hooks.set_script(Script::passes(3));
    let pools = [app.pools(app.gpus[0]), app.pools(app.gpus[1])];
    Env { app, hooks, pools }
}

fn values(len: usize) -> Vec<u32> {
    (0..len as u32).map(|i| 7 + 5 * i).collect()
}

fn plus_one(v: &[u32]) -> Vec<u32> {
    v.iter().map(|x| x + 1).collect()
}

impl Env {
    /// Dispatches `add_one` over `len` elements of `buf` on GPU 0 and waits for it.
    fn add_one(&self, buf: Ptr, len: u32) -> u64 {
        let kernel = kreplay_softhsa::register_kernel("reach_add_one", add_one);
        let q = self.app.queue(self.app.gpus[0]);
        let done = self.app.signal(1);
        let args = self.app.kernargs(
            &self.pools[0],
            AddArgs {
                buf: buf.0,
                len,
                pad: 0,
            },
        );
        self.app
            .dispatch(q, Aql::dispatch(kernel, len.max(1), 64, args, done));
        assert_eq!(
            self.app.wait_zero(done),
            0,
            "the application's completion fires"
        );
        self.only_dispatch()
    }

    fn only_dispatch(&self) -> u64 {
        let ids: Vec<u64> = self
            .hooks
            .configured_dispatches()
            .iter()
            .map(|i| i.dispatch_id)
            .collect();
        assert_eq!(ids.len(), 1, "one dispatch at CONFIG ENTER: {ids:?}");
        ids[0]
    }

    fn snapshot_exit(&self, dispatch: u64) -> MemoryOpReport {
        self.hooks
            .events_of(dispatch)
            .iter()
            .find_map(|e| match e {
                Event::Snapshot {
                    phase: Phase::Exit,
                    report,
                    ..
                } => Some(*report),
                _ => None,
            })
            .expect("a SNAPSHOT EXIT")
    }

    /// Asserts the dispatch was replayed with three passes, and returns its SNAPSHOT EXIT.
    fn replayed(&self, dispatch: u64) -> MemoryOpReport {
        assert_eq!(
            self.hooks.finished_record(dispatch).outcome,
            ReplayOutcome::Replayed {
                passes: 3,
                end: LoopEnd::LastPass
            }
        );
        assert_eq!(
            RUNS.load(Ordering::SeqCst),
            3,
            "the kernel ran once per pass"
        );
        self.snapshot_exit(dispatch)
    }
}

/// Allocates from `pool` through softhsa's own table, not the copy kreplay wraps: memory the
/// runtime knows and kreplay never saw allocated.
fn untracked_alloc(pool: hsa_amd_memory_pool_t, bytes: usize) -> Ptr {
    let amd = kreplay_softhsa::api_table().amd_ext_;
    let mut ptr: *mut c_void = std::ptr::null_mut();
    // SAFETY: softhsa's own AMD table is valid for the process; the out pointer is valid.
    let status = unsafe {
        ((*amd)
            .hsa_amd_memory_pool_allocate_fn
            .expect("pool allocate"))(pool, bytes, 0, &mut ptr)
    };
    assert_eq!(status, HSA_STATUS_SUCCESS);
    Ptr(ptr as u64)
}

scenarios! {
    /// The baseline: coarse-grained memory of the dispatch's agent.
    fn x_plus_one_on_coarse_memory_of_the_agent_is_applied_once() {
        let env = setup(SnapshotConfig::default());
        let init = values(256);
        let buf = env.app.buffer(env.pools[0].coarse, &init);
        let id = env.add_one(buf, 256);
        let exit = env.replayed(id);
        assert_eq!(env.app.read(buf, 256), plus_one(&init));
        assert_eq!(exit.sources.agent.regions, 1, "{exit:?}");
        assert_eq!(exit.sources.referenced.regions, 0, "the buffer counts once, as agent memory: {exit:?}");
    }

    /// A buffer owned by the other GPU agent, written by a kernel on GPU 0.
    fn x_plus_one_on_coarse_memory_of_another_agent_is_applied_once() {
        let env = setup(SnapshotConfig::default());
        let init = values(256);
        let buf = env.app.buffer(env.pools[1].coarse, &init);
        let id = env.add_one(buf, 256);
        let exit = env.replayed(id);
        assert_eq!(env.app.read(buf, 256), plus_one(&init));
        assert_eq!(exit.sources.referenced.regions, 1, "{exit:?}");
        assert_eq!(exit.sources.referenced.bytes, env.app.allocation_size(buf));
    }

    /// An atomic counter in fine-grained memory ends at 1, not at the number of passes.
    fn an_atomic_counter_in_fine_grained_memory_ends_at_one() {
        let env = setup(SnapshotConfig::default());
        let counter = env.app.buffer(env.pools[0].fine, &[0]);
        let kernel = kreplay_softhsa::register_kernel("reach_bump", bump);
        let q = env.app.queue(env.app.gpus[0]);
        let done = env.app.signal(1);
        let args = env.app.kernargs(&env.pools[0], AddArgs { buf: counter.0, len: 1, pad: 0 });
        env.app.dispatch(q, Aql::dispatch(kernel, 1, 1, args, done));
        assert_eq!(env.app.wait_zero(done), 0);
        let id = env.only_dispatch();
        let exit = env.replayed(id);
        assert_eq!(env.app.read(counter, 1), vec![1]);
        assert_eq!(exit.sources.referenced.regions, 1, "{exit:?}");
    }

    /// Host memory (the CPU agent's pool) written by a kernel.
    fn x_plus_one_on_host_memory_is_applied_once() {
        let env = setup(SnapshotConfig::default());
        let init = values(128);
        let buf = env.app.buffer(env.app.host_pool(), &init);
        let id = env.add_one(buf, 128);
        env.replayed(id);
        assert_eq!(env.app.read(buf, 128), plus_one(&init));
    }

    /// A buffer the application placed in kernarg-pool memory and passes by pointer.
    fn x_plus_one_on_kernarg_pool_memory_is_applied_once() {
        let env = setup(SnapshotConfig::default());
        let init = values(64);
        let buf = env.app.buffer(env.pools[0].kernarg, &init);
        let id = env.add_one(buf, 64);
        env.replayed(id);
        assert_eq!(env.app.read(buf, 64), plus_one(&init));
    }

    /// Coarse-grained memory kreplay never saw allocated (allocated before the tool loaded, or
    /// through a path it does not wrap) is adopted with the runtime's base and size and
    /// snapshotted; the report counts it as adopted.
    fn untracked_memory_an_argument_points_into_is_adopted_and_restored() {
        let env = setup(SnapshotConfig::default());
        let init = values(256);
        let buf = untracked_alloc(env.pools[0].coarse, 1024);
        env.app.write(buf, &init);
        assert_eq!(kreplay_hsa::tracked_kind(buf.0), None, "kreplay did not see the allocation");
        // Point into the middle: the runtime's base and size are what is adopted.
        let id = env.add_one(Ptr(buf.0 + 64), 192);
        let exit = env.replayed(id);
        let mut expected = init.clone();
        for x in &mut expected[16..208] {
            *x += 1;
        }
        assert_eq!(env.app.read(buf, 256), expected);
        assert_eq!(exit.sources.adopted.regions, 1, "{exit:?}");
        assert_eq!(exit.sources.adopted.bytes, 1024);
        assert!(kreplay_hsa::tracked_kind(buf.0).is_some(), "adopted memory stays tracked");
    }

    /// Memory allocated with the executable flag is code: never snapshotted, even when an
    /// argument points into it.
    fn executable_memory_an_argument_points_into_is_not_snapshotted() {
        let env = setup(SnapshotConfig::default());
        let code = env.app.alloc_flags(env.pools[1].coarse, 4096, 1 << 2).0;
        assert_eq!(kreplay_hsa::tracked_kind(code), Some(kreplay_snapshot::MemoryKind::Executable));
        let init = values(64);
        let buf = env.app.buffer(env.pools[0].fine, &init);
        // The kernel writes `buf`; its second argument word points at the code.
        let id = {
            let kernel = kreplay_softhsa::register_kernel("reach_add_one", add_one);
            let q = env.app.queue(env.app.gpus[0]);
            let done = env.app.signal(1);
            #[repr(C)]
            #[derive(Clone, Copy)]
            struct WithCode { args: AddArgs, code: u64 }
            let args = env.app.kernargs(&env.pools[0], WithCode { args: AddArgs { buf: buf.0, len: 64, pad: 0 }, code });
            env.app.dispatch(q, Aql::dispatch(kernel, 64, 64, args, done));
            assert_eq!(env.app.wait_zero(done), 0);
            env.only_dispatch()
        };
        let exit = env.replayed(id);
        assert_eq!(env.app.read(buf, 64), plus_one(&init));
        assert_eq!(exit.sources.referenced.regions, 1, "only the fine-grained buffer: {exit:?}");
        assert_eq!(exit.sources.referenced.bytes, env.app.allocation_size(buf), "{exit:?}");
    }

    /// A kernel that increments a `__device__`-style counter of its executable: the counter
    /// ends at the number of dispatches, not dispatches × passes. The read-only variable beside
    /// it is not snapshotted, and a destroyed executable's variables are no longer enumerated.
    fn a_module_variable_counter_ends_at_the_number_of_dispatches() {
        let env = setup(SnapshotConfig::default()
            .with_scope(kreplay_snapshot::SnapshotScope::Referenced));
        let hsa = env.app.hsa();
        let gpu = env.app.gpus[0];
        let kernel = kreplay_softhsa::register_kernel("reach_count_in_module", count_in_module);
        let code = kreplay_softhsa::CodeObject::new()
            .kernel("reach_count_in_module", kernel, 0)
            .variable("reach_count", &0u32.to_ne_bytes())
            .readonly_variable("reach_limit", &[1u8; 64]);
        let exe = hsa.load_executable(gpu, &code).unwrap();
        let sym = hsa.symbol(exe, gpu, "reach_count").unwrap();
        let addr = hsa.symbol_u64(sym, HSA_EXECUTABLE_SYMBOL_INFO_VARIABLE_ADDRESS).unwrap();
        let object = hsa
            .symbol_u64(hsa.symbol(exe, gpu, "reach_count_in_module").unwrap(), HSA_EXECUTABLE_SYMBOL_INFO_KERNEL_OBJECT)
            .unwrap();
        COUNTER.store(addr, Ordering::SeqCst);
        let q = env.app.queue(gpu);
        for _ in 0..2 {
            let done = env.app.signal(1);
            env.app.dispatch(q, Aql::dispatch(object, 1, 1, Ptr(0), done));
            assert_eq!(env.app.wait_zero(done), 0);
        }
        assert_eq!(RUNS.load(Ordering::SeqCst), 6, "three passes of each dispatch ran");
        assert_eq!(env.app.read(Ptr(addr), 1), vec![2], "two dispatches, two increments");
        let ids: Vec<u64> = env.hooks.configured_dispatches().iter().map(|i| i.dispatch_id).collect();
        for id in &ids {
            let exit = env.snapshot_exit(*id);
            assert_eq!(exit.sources.module_variables.regions, 1, "only the writable variable: {exit:?}");
            assert_eq!(exit.sources.module_variables.bytes, 4);
            assert_eq!(exit.regions, 1, "{exit:?}");
        }
        hsa.destroy_executable(exe).unwrap();
        let buf = env.app.buffer(env.pools[0].coarse, &[1; 4]);
        let kernel = kreplay_softhsa::register_kernel("reach_add_one", add_one);
        let done = env.app.signal(1);
        let args = env.app.kernargs(&env.pools[0], AddArgs { buf: buf.0, len: 4, pad: 0 });
        env.app.dispatch(q, Aql::dispatch(kernel, 4, 4, args, done));
        assert_eq!(env.app.wait_zero(done), 0);
        let last = *env.hooks.configured_dispatches().last().map(|i| &i.dispatch_id).unwrap();
        assert_eq!(env.snapshot_exit(last).sources.module_variables.regions, 0, "a destroyed executable has no variables");
        assert_eq!(env.app.read(buf, 4), vec![2; 4]);
    }

    /// Every reachable kind, hash restores.
    fn every_kind_of_reachable_memory_is_written_once_under_hash_restores() {
        every_kind_once_under(kreplay_snapshot::RestoreStrategy::Hash, false);
    }

    /// Every reachable kind, verified write-set restores, through the runtime's copy API only.
    fn every_kind_of_reachable_memory_is_written_once_under_writeset_restores_via_runtime_copies() {
        every_kind_once_under(kreplay_snapshot::RestoreStrategy::Writeset, true);
    }

    /// Every reachable kind, the unverified write-set shortcut.
    fn every_kind_of_reachable_memory_is_written_once_under_unverified_writeset_restores() {
        every_kind_once_under(kreplay_snapshot::RestoreStrategy::WritesetUnverified, false);
    }

    /// Every reachable kind, full restores.
    fn every_kind_of_reachable_memory_is_written_once_under_full_restores() {
        every_kind_once_under(kreplay_snapshot::RestoreStrategy::Full, false);
    }

    /// Kernel arguments in memory the runtime does not know (here the application's stack), for
    /// a kernel no executable describes: their extent is unknown, so nothing bounds the scan.
    /// The replay is declined as `untracked_memory` and the dispatch runs once.
    fn arguments_in_memory_the_runtime_does_not_know_decline_as_untracked_memory() {
        let env = setup(SnapshotConfig::default());
        let init = values(64);
        let buf = env.app.buffer(env.pools[1].coarse, &init);
        let kernel = kreplay_softhsa::register_kernel("reach_add_one", add_one);
        let q = env.app.queue(env.app.gpus[0]);
        let done = env.app.signal(1);
        let args = Box::new(AddArgs { buf: buf.0, len: 64, pad: 0 });
        env.app.dispatch(q, Aql::dispatch(kernel, 64, 64, Ptr(&*args as *const AddArgs as u64), done));
        assert_eq!(env.app.wait_zero(done), 0);
        let id = env.only_dispatch();
        match env.hooks.finished_record(id).outcome {
            ReplayOutcome::RanOnce { why: kreplay_passloop::RanOnceReason::Declined(d) } => {
                assert_eq!(d.reason, kreplay_passloop::DeclineReason::UntrackedMemory, "{d:?}");
                assert!(d.detail.contains("kernel arguments"), "{}", d.detail);
            }
            other => panic!("expected an untracked_memory decline, got {other:?}"),
        }
        assert_eq!(RUNS.load(Ordering::SeqCst), 1, "the dispatch ran once");
        assert_eq!(env.app.read(buf, 64), plus_one(&init));
        // Declined while planning, before any memory was read: no SNAPSHOT callbacks; CONFIG
        // EXIT carries the reason.
        assert!(
            !env.hooks.events_of(id).iter().any(|e| matches!(e, Event::Snapshot { .. })),
            "no snapshot was taken"
        );
    }

    /// Where the agents reach any host memory of the process (SVM accessible by default, as on a
    /// ROCm machine with XNACK on), a kernel argument pointing into `malloc`ed memory may be
    /// written by the kernel and no snapshot holds it: the replay is declined and the kernel
    /// runs once. (Without SVM the same value is a plain number: no agent could use it.)
    fn an_argument_into_malloced_memory_declines_where_agents_reach_host_memory() {
        kreplay_softhsa::configure(kreplay_softhsa::SoftHsaConfig {
            svm_accessible_by_default: true,
            ..Default::default()
        })
        .expect("softhsa configured");
        let env = setup(SnapshotConfig::default());
        let init = values(64);
        let heap: &'static mut [u32] = Box::leak(init.clone().into_boxed_slice());
        let id = env.add_one(Ptr(heap.as_mut_ptr() as u64), 64);
        match env.hooks.finished_record(id).outcome {
            ReplayOutcome::RanOnce { why: kreplay_passloop::RanOnceReason::Declined(d) } => {
                assert_eq!(d.reason, kreplay_passloop::DeclineReason::UntrackedMemory, "{d:?}");
                assert!(d.detail.contains("XNACK"), "{}", d.detail);
            }
            other => panic!("expected an untracked_memory decline, got {other:?}"),
        }
        assert_eq!(RUNS.load(Ordering::SeqCst), 1, "the dispatch ran once");
        assert_eq!(heap.to_vec(), plus_one(&init));
    }

    /// An argument that points at a module variable of code loaded on the other agent: the
    /// writable variable is restored by address and size (the loader segment around it is not
    /// adopted), a read-only variable an argument points at is not snapshotted.
    fn an_argument_pointing_at_a_module_variable_restores_the_variable_not_its_segment() {
        let env = setup(SnapshotConfig::default()
            .with_scope(kreplay_snapshot::SnapshotScope::Referenced));
        let hsa = env.app.hsa();
        let other = env.app.gpus[1];
        let code = kreplay_softhsa::CodeObject::new()
            .variable("reach_remote_counter", &[0u8; 64])
            .readonly_variable("reach_remote_table", &[7u8; 256]);
        let exe = hsa.load_executable(other, &code).unwrap();
        let address = |name: &str| {
            let sym = hsa.symbol(exe, other, name).unwrap();
            hsa.symbol_u64(sym, HSA_EXECUTABLE_SYMBOL_INFO_VARIABLE_ADDRESS).unwrap()
        };
        let (counter, table) = (address("reach_remote_counter"), address("reach_remote_table"));
        assert_eq!(kreplay_hsa::tracked_kind(counter), None, "loader memory is not tracked");
        // Two words of arguments: the counter (written), the read-only table (only read).
        #[repr(C)]
        #[derive(Clone, Copy)]
        struct Args { args: AddArgs, table: u64 }
        let kernel = kreplay_softhsa::register_kernel("reach_add_one", add_one);
        let q = env.app.queue(env.app.gpus[0]);
        let done = env.app.signal(1);
        let args = env.app.kernargs(&env.pools[0], Args { args: AddArgs { buf: counter, len: 16, pad: 0 }, table });
        env.app.dispatch(q, Aql::dispatch(kernel, 16, 16, args, done));
        assert_eq!(env.app.wait_zero(done), 0);
        let id = env.only_dispatch();
        let exit = env.replayed(id);
        assert_eq!(env.app.read(Ptr(counter), 16), vec![1; 16], "one run's increments");
        assert_eq!(exit.sources.module_variables, kreplay_passloop::SourceTally { regions: 1, bytes: 64 }, "{exit:?}");
        assert_eq!((exit.regions, exit.sources.adopted.regions), (1, 0), "the segment is not adopted: {exit:?}");
        assert_eq!(kreplay_hsa::tracked_kind(counter), None, "nor tracked afterwards");
    }

    /// Under `referenced` scope an unrelated coarse buffer of the agent is not snapshotted, and
    /// the result is still one run's.
    fn the_referenced_scope_snapshots_only_what_the_arguments_reach() {
        let env = setup(SnapshotConfig::default()
            .with_scope(kreplay_snapshot::SnapshotScope::Referenced));
        let unrelated = env.app.buffer(env.pools[0].coarse, &values(4096));
        let init = values(256);
        let buf = env.app.buffer(env.pools[0].coarse, &init);
        let id = env.add_one(buf, 256);
        let exit = env.replayed(id);
        assert_eq!(env.app.read(buf, 256), plus_one(&init));
        assert_eq!(env.app.read(unrelated, 4096), values(4096));
        assert_eq!((exit.regions, exit.bytes_moved), (1, env.app.allocation_size(buf)), "{exit:?}");
        assert_eq!(exit.sources.agent.regions, 0);
        assert_eq!(exit.sources.referenced.regions, 1);
    }
}
