//! Kernel arguments whose pointers sit at any byte offset: a packed struct passed by value
//! (`struct __attribute__((packed)) { char tag; int* p; }`) puts its pointer at an odd offset of
//! the kernarg segment. The memory it names must be in the snapshot like that of an aligned
//! pointer: a replayed `x += 1` leaves one run's result.

#[macro_use]
#[allow(dead_code)]
mod support;

use std::sync::atomic::{AtomicU32, Ordering};

use kreplay_drain::DrainConfig;
use kreplay_hsa::InstallOptions;
use kreplay_passloop::{LoopEnd, ReplayOutcome};
use kreplay_snapshot::{SnapshotConfig, SnapshotScope};
use kreplay_softhsa::WorkGroup;
use support::app::{self, App, Aql, Pools, Ptr, WAIT};
use support::tool::{Script, TestHooks};

static RUNS: AtomicU32 = AtomicU32::new(0);

/// Packed: the pointer sits at offset `N` (1, 2 or 3 here), after `N` tag bytes.
#[repr(C, packed)]
#[derive(Clone, Copy)]
struct Tagged<const N: usize> {
    tag: [u8; N],
    buf: u64,
    len: u32,
}

fn add_one_tagged<const N: usize>(group: &WorkGroup) {
    // SAFETY: every dispatch of this kernel carries a `Tagged<N>` block.
    let args: Tagged<N> = unsafe { group.kernargs() };
    if group.group_id() == [0, 0, 0] {
        RUNS.fetch_add(1, Ordering::SeqCst);
    }
    let (len, buf) = (args.len, args.buf);
    for [i, _, _] in group.work_items() {
        if i < len {
            // SAFETY: the buffer holds `len` u32; each work-item owns index `i`.
            unsafe { *(buf as *mut u32).add(i as usize) += 1 };
        }
    }
}

struct Env {
    app: App,
    hooks: std::sync::Arc<TestHooks>,
    pools: Pools,
}

fn setup(scope: SnapshotScope) -> Env {
    let hooks = TestHooks::new(0);
    let app = app::install(
        hooks.clone(),
        InstallOptions {
            snapshot: SnapshotConfig::default().with_scope(scope),
            drain: DrainConfig::new(WAIT),
            ..Default::default()
        },
    );
    hooks.configure_replay(true);
    hooks.set_script(Script::passes(3));
    let pools = app.pools(app.gpus[0]);
    Env { app, hooks, pools }
}

impl Env {
    /// Runs `add_one_tagged::<N>` over a fresh 64-word buffer of `pool` and asserts one run's
    /// result and a replay of three passes.
    fn once_at_offset<const N: usize>(&self, pool: hsa_sys::hsa_amd_memory_pool_t) {
        let init: Vec<u32> = (0..64).map(|i| 7 + 5 * i).collect();
        let buf: Ptr = self.app.buffer(pool, &init);
        let kernel = kreplay_softhsa::register_kernel("reach_args_tagged", add_one_tagged::<N>);
        let q = self.app.queue(self.app.gpus[0]);
        let done = self.app.signal(1);
        let args = self.app.kernargs(
            &self.pools,
            Tagged::<N> {
                tag: [0x5a; N],
                buf: buf.0,
                len: 64,
            },
        );
        let before = RUNS.load(Ordering::SeqCst);
        self.app
            .dispatch(q, Aql::dispatch(kernel, 64, 64, args, done));
        assert_eq!(self.app.wait_zero(done), 0);
        let id = self
            .hooks
            .configured_dispatches()
            .last()
            .expect("a dispatch")
            .dispatch_id;
        let outcome = self.hooks.finished_record(id).outcome;
        let runs = RUNS.load(Ordering::SeqCst) - before;
        let expected: Vec<u32> = init.iter().map(|x| x + 1).collect();
        assert_eq!(
            self.app.read(buf, 64),
            expected,
            "pointer at offset {N}: outcome {outcome:?}, the kernel ran {runs} times"
        );
        assert_eq!(
            outcome,
            ReplayOutcome::Replayed {
                passes: 3,
                end: LoopEnd::LastPass
            }
        );
    }
}

/// A large argument block (a struct passed by value), its pointer 6000 bytes in: more than
/// kernels usually take, as much as a kernel may.
#[repr(C)]
#[derive(Clone, Copy)]
struct Large {
    table: [u64; 750],
    buf: u64,
    len: u32,
    pad: u32,
}

fn add_one_large(group: &WorkGroup) {
    // SAFETY: every dispatch of this kernel carries a `Large` block.
    let args: Large = unsafe { group.kernargs() };
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

scenarios! {
    /// A kernel no executable describes (its argument size unknown) with 6 KiB of arguments:
    /// the pointer past the first 4 KiB into fine-grained memory is still found.
    fn a_pointer_deep_in_large_arguments_of_an_undescribed_kernel_is_applied_once() {
        let env = setup(SnapshotScope::Agent);
        let init: Vec<u32> = (0..64).map(|i| 7 + 5 * i).collect();
        let buf: Ptr = env.app.buffer(env.pools.fine, &init);
        let kernel = kreplay_softhsa::register_kernel("reach_args_large", add_one_large);
        let q = env.app.queue(env.app.gpus[0]);
        let done = env.app.signal(1);
        let args = env.app.kernargs(&env.pools, Large { table: [0; 750], buf: buf.0, len: 64, pad: 0 });
        env.app.dispatch(q, Aql::dispatch(kernel, 64, 64, args, done));
        assert_eq!(env.app.wait_zero(done), 0);
        let id = env.hooks.configured_dispatches().last().expect("a dispatch").dispatch_id;
        let outcome = env.hooks.finished_record(id).outcome;
        let expected: Vec<u32> = init.iter().map(|x| x + 1).collect();
        assert_eq!(env.app.read(buf, 64), expected, "outcome {outcome:?}, runs {}", RUNS.load(Ordering::SeqCst));
        assert_eq!(outcome, ReplayOutcome::Replayed { passes: 3, end: LoopEnd::LastPass });
    }

    /// Fine-grained memory (outside the agent scope's starting point): only the argument scan
    /// brings it into the snapshot.
    fn a_pointer_at_an_odd_offset_into_fine_memory_is_applied_once() {
        let env = setup(SnapshotScope::Agent);
        env.once_at_offset::<1>(env.pools.fine);
        env.once_at_offset::<2>(env.pools.fine);
        env.once_at_offset::<3>(env.pools.fine);
    }

    /// The agent's coarse-grained memory under `referenced` scope.
    fn a_pointer_at_an_odd_offset_into_coarse_memory_under_referenced_scope_is_applied_once() {
        let env = setup(SnapshotScope::Referenced);
        env.once_at_offset::<1>(env.pools.coarse);
        env.once_at_offset::<3>(env.pools.coarse);
    }

    /// Host memory (any GPU may write it).
    fn a_pointer_at_an_odd_offset_into_host_memory_is_applied_once() {
        let env = setup(SnapshotScope::Agent);
        env.once_at_offset::<2>(env.app.host_pool());
    }
}
