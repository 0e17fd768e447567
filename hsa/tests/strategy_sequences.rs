//! Sequences of dispatches of one kernel under every restore strategy and store tier, with
//! writes that change between dispatches: data-dependent writes, writes that move to chunks
//! never written before, writes that stop, writes of the value memory already held, writes
//! across chunk boundaries and into the last partial chunk of an allocation. After every
//! dispatch memory must be what one ordinary run leaves, and every pass must start from the
//! bytes the first pass saw (under `writeset-unverified`, every pass after a verified restore).

#[allow(dead_code)]
#[macro_use]
mod support;

use std::sync::Arc;

use kreplay_drain::DrainConfig;
use kreplay_hsa::InstallOptions;
use kreplay_passloop::{LoopEnd, Phase, ReplayOutcome};
use kreplay_snapshot::{RestoreStrategy, SnapshotConfig, SnapshotScope, StoreTier};
use kreplay_softhsa::WorkGroup;
use parking_lot::Mutex;
use support::app::{self, App, Aql, Pools, Ptr, Queue, WAIT};
use support::tool::{Event, Script, TestHooks};

/// The chunk size of most scenarios (the offsets below are multiples of it).
const CHUNK: usize = 4096;
/// The chunk size snapshots use: [`CHUNK`] unless a scenario sets another.
static CHUNK_SIZE: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(CHUNK as u64);

/// (tag, checksum of the buffer) at the start of every run of `prog`, in order.
static INPUTS: Mutex<Vec<(u32, u64)>> = Mutex::new(Vec::new());

const INC: u32 = 0;
const SET: u32 = 1;
const COUNTER: u32 = 2;
const PREFIX: u32 = 3;
const NOTHING: u32 = 4;

#[repr(C)]
#[derive(Clone, Copy, Default, Debug)]
struct Prog {
    buf: u64,
    len: u64,
    off: u64,
    n: u64,
    tag: u32,
    op: u32,
    val: u32,
    stride: u32,
}

fn checksum(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// What one run of `prog` does to `mem`.
fn model(mem: &mut [u8], p: &Prog) {
    let (off, n) = (p.off as usize, p.n as usize);
    match p.op {
        INC => mem[off..off + n]
            .iter_mut()
            .for_each(|b| *b = b.wrapping_add(1)),
        SET => mem[off..off + n].iter_mut().for_each(|b| *b = p.val as u8),
        COUNTER => {
            // A counter at `off`; the run writes `n` bytes where the counter says, so each
            // dispatch writes further on (wrapping), into chunks never written before.
            let mut c = [0u8; 4];
            c.copy_from_slice(&mem[off..off + 4]);
            let c = u32::from_ne_bytes(c).wrapping_add(1);
            mem[off..off + 4].copy_from_slice(&c.to_ne_bytes());
            let len = mem.len();
            for i in 0..n {
                let at = (c as usize * p.stride as usize + i) % len;
                if !(off..off + 4).contains(&at) {
                    mem[at] = mem[at].wrapping_mul(3).wrapping_add(c as u8);
                }
            }
        }
        PREFIX => {
            for i in off + 1..off + n {
                mem[i] = mem[i].wrapping_add(mem[i - 1]);
            }
        }
        _ => {}
    }
}

/// Set to make the next run of `prog` fault halfway.
static FAULT_NEXT: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// One work-item does the whole dispatch, after noting a checksum of what it starts from.
fn prog(group: &WorkGroup) {
    // SAFETY: every dispatch of this kernel carries a `Prog` block.
    let p: Prog = unsafe { group.kernargs() };
    if group.group_id() != [0, 0, 0] {
        return;
    }
    if FAULT_NEXT.swap(false, std::sync::atomic::Ordering::SeqCst) {
        // Half the work, then a fault (softhsa puts the queue into its error state).
        // SAFETY: as below.
        let mem = unsafe { std::slice::from_raw_parts_mut(p.buf as *mut u8, p.len as usize) };
        let half = Prog { n: p.n / 2, ..p };
        model(mem, &half);
        panic!("simulated memory fault");
    }
    // SAFETY: the scenario allocated `len` bytes at `buf`.
    let mem = unsafe { std::slice::from_raw_parts_mut(p.buf as *mut u8, p.len as usize) };
    INPUTS.lock().push((p.tag, checksum(mem)));
    model(mem, &p);
}

struct Env {
    app: App,
    hooks: Arc<TestHooks>,
    pools: Pools,
    q: Queue,
    strategy: RestoreStrategy,
}

/// Whether kreplay reaches device memory only through the runtime's copies (as on ROCm, where
/// it has no host window on it), for the scenarios that ask.
static RUNTIME_COPIES: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

fn setup(strategy: RestoreStrategy, store: StoreTier, scope: SnapshotScope) -> Env {
    let hooks = TestHooks::new(0);
    let app = app::install(
        hooks.clone(),
        InstallOptions {
            drain: DrainConfig::new(WAIT),
            snapshot: SnapshotConfig::default()
                .with_store(store)
                .with_strategy(strategy)
                .with_chunk_size(CHUNK_SIZE.load(std::sync::atomic::Ordering::Relaxed))
                .with_scope(scope),
            force_runtime_copies: RUNTIME_COPIES.load(std::sync::atomic::Ordering::Relaxed),
            ..Default::default()
        },
    );
    hooks.configure_replay(true);
    let pools = app.pools(app.gpus[0]);
    let q = app.queue(app.gpus[0]);
    Env {
        app,
        hooks,
        pools,
        q,
        strategy,
    }
}

static TAG: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

fn host<'a>(p: Ptr, len: usize) -> &'a mut [u8] {
    // SAFETY: the scenario allocated at least `len` bytes at `p`, host memory on softhsa.
    unsafe { std::slice::from_raw_parts_mut(p.0 as *mut u8, len) }
}

impl Env {
    /// Runs `kernel` with `p` (its tag set here) on queue `q` in `passes` passes, and checks
    /// the passes' inputs and the memory after it against `want` (updated to one run).
    fn run_on(
        &self,
        q: Queue,
        kernel: u64,
        mut p: Prog,
        want: &mut [u8],
        passes: Option<u64>,
        what: &str,
    ) {
        let tag = TAG.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
        p.tag = tag;
        let before = checksum(want);
        let kernarg = self.app.kernargs(&self.pools, p);
        let done = self.app.signal(1);
        self.app
            .dispatch(q, Aql::dispatch(kernel, 1, 1, kernarg, done));
        assert_eq!(self.app.wait_zero(done), 0, "{what}: completion");
        let id = self
            .hooks
            .configured_dispatches()
            .into_iter()
            .rev()
            .find(|d| d.queue_id == self.queue_id(q))
            .map(|d| d.dispatch_id);
        let inputs: Vec<u64> = INPUTS
            .lock()
            .iter()
            .filter(|(t, _)| *t == tag)
            .map(|(_, c)| *c)
            .collect();
        model(want, &p);
        let mem = host(Ptr(p.buf), p.len as usize);
        let wrong: Vec<usize> = (0..want.len()).filter(|&i| mem[i] != want[i]).collect();
        let id = id.expect("the dispatch was configured");
        let record = self.hooks.finished_record(id);
        let passes = passes.unwrap_or_else(|| passes_of(id));
        // Passes that started after an unverified restore may see other bytes (the opt-in
        // shortcut); every other pass must see the first pass's.
        let mut unverified_before = vec![false; inputs.len()];
        for e in self.hooks.events_of(id) {
            if let Event::Restore {
                phase: Phase::Exit,
                request,
                report,
                ..
            } = e
            {
                assert!(!report.failed, "{what}: a restore failed: {report:?}");
                if let Some(u) = unverified_before.get_mut(request.next_pass as usize) {
                    *u = report.unverified;
                }
            }
        }
        let bad_inputs: Vec<usize> = inputs
            .iter()
            .enumerate()
            .filter(|&(i, &c)| c != before && !unverified_before[i])
            .map(|(i, _)| i)
            .collect();
        assert!(
            inputs.len() as u64 == passes && bad_inputs.is_empty() && wrong.is_empty(),
            "{what} ({:?}): outcome {:?}; {} passes ran, passes {bad_inputs:?} started from other \
             bytes; {} bytes differ, first at {:?} (holds {:?}, want {:?})",
            self.strategy,
            record.outcome,
            inputs.len(),
            wrong.len(),
            wrong.first(),
            wrong.first().map(|&i| mem[i]),
            wrong.first().map(|&i| want[i]),
        );
        if passes > 1 {
            assert_eq!(
                record.outcome,
                ReplayOutcome::Replayed {
                    passes,
                    end: LoopEnd::LastPass
                },
                "{what}"
            );
        }
    }

    /// The id the tool is given for queue `q`.
    fn queue_id(&self, q: Queue) -> u64 {
        // SAFETY: a live queue the scenario created.
        unsafe { (*q.0).id }
    }

    fn run(&self, kernel: u64, p: Prog, want: &mut [u8], passes: u64, what: &str) {
        self.hooks.set_script(Script::passes(passes));
        self.run_on(self.q, kernel, p, want, Some(passes), what);
    }
}

/// The pass count of dispatch `id` under [`varied`].
fn passes_of(id: u64) -> u64 {
    2 + id % 5
}

/// A script giving each dispatch [`passes_of`] passes.
fn varied() -> Script {
    Script::new(|_, info| kreplay_passloop::ToolAnswer::passes(passes_of(info.dispatch_id)))
}

/// The whole sequence on one buffer of `len` bytes (not a whole number of chunks).
fn sequence(strategy: RestoreStrategy, store: StoreTier, scope: SnapshotScope) {
    let env = setup(strategy, store, scope);
    let kernel = kreplay_softhsa::register_kernel("seq_prog", prog);
    let len = 24 * CHUNK + 77;
    let buf = env.app.alloc(env.pools.coarse, len);
    let init: Vec<u8> = (0..len).map(|i| (i * 131 % 251) as u8).collect();
    host(buf, len).copy_from_slice(&init);
    let mut want = init;
    let base = Prog {
        buf: buf.0,
        len: len as u64,
        ..Default::default()
    };
    let mem = || host(buf, len);
    let steps: Vec<(Prog, u64)> = vec![
        // x += 1 in chunk 0.
        (
            Prog {
                op: INC,
                off: 0,
                n: 100,
                ..base
            },
            4,
        ),
        // The same again, then across the boundary of chunks 4 and 5 (never written before).
        (
            Prog {
                op: INC,
                off: 0,
                n: 100,
                ..base
            },
            3,
        ),
        (
            Prog {
                op: INC,
                off: 5 * CHUNK as u64 - 3,
                n: 6,
                ..base
            },
            5,
        ),
        // The last partial chunk, to its last byte.
        (
            Prog {
                op: INC,
                off: len as u64 - 10,
                n: 10,
                ..base
            },
            4,
        ),
        // Writes that stop.
        (
            Prog {
                op: NOTHING,
                ..base
            },
            4,
        ),
        // The value memory holds (invisible to a comparison), then other values there.
        (
            Prog {
                op: SET,
                off: 9 * CHUNK as u64,
                n: 64,
                val: 7,
                ..base
            },
            3,
        ),
        (
            Prog {
                op: SET,
                off: 9 * CHUNK as u64,
                n: 64,
                val: 7,
                ..base
            },
            3,
        ),
        (
            Prog {
                op: SET,
                off: 9 * CHUNK as u64 + 32,
                n: 64,
                val: 9,
                ..base
            },
            3,
        ),
        // A kernel that reads what it wrote.
        (
            Prog {
                op: PREFIX,
                off: 2 * CHUNK as u64 - 50,
                n: 3000,
                ..base
            },
            4,
        ),
        (
            Prog {
                op: PREFIX,
                off: 2 * CHUNK as u64 - 50,
                n: 3000,
                ..base
            },
            9,
        ),
    ];
    for (i, (p, passes)) in steps.into_iter().enumerate() {
        env.run(
            kernel,
            p,
            &mut want,
            passes,
            &format!("step {i} {:?}", p.op),
        );
        // The application between dispatches: stores into chunks written and not.
        let m = mem();
        for at in [i, 5 * CHUNK - 1, 9 * CHUNK + 40, len - 1, 13 * CHUNK + i] {
            m[at] = m[at].wrapping_add(11);
            want[at] = m[at];
        }
    }
    // A counter: each dispatch writes further on, into chunks never written before; the
    // passes of one dispatch all write the same place.
    let counter = Prog {
        op: COUNTER,
        off: 20 * CHUNK as u64,
        n: 40,
        stride: 3 * CHUNK as u32 + 17,
        ..base
    };
    mem()[20 * CHUNK..20 * CHUNK + 4].copy_from_slice(&0u32.to_ne_bytes());
    want[20 * CHUNK..20 * CHUNK + 4].copy_from_slice(&0u32.to_ne_bytes());
    for round in 0..12u64 {
        env.run(
            kernel,
            counter,
            &mut want,
            [3, 2, 9, 4, 17, 2, 3, 5, 8, 9, 2, 4][round as usize],
            &format!("counter round {round}"),
        );
    }
}

scenarios! {
    fn a_sequence_under_writeset_leaves_every_dispatch_exact() {
        sequence(RestoreStrategy::Writeset, StoreTier::Host, SnapshotScope::Agent);
    }
    fn a_sequence_under_unverified_write_sets_leaves_every_dispatch_exact() {
        sequence(RestoreStrategy::WritesetUnverified, StoreTier::Host, SnapshotScope::Agent);
    }
    fn a_sequence_under_tracked_leaves_every_dispatch_exact() {
        sequence(RestoreStrategy::Tracked, StoreTier::Host, SnapshotScope::Referenced);
    }
    fn a_sequence_under_auto_leaves_every_dispatch_exact() {
        sequence(RestoreStrategy::Auto, StoreTier::File, SnapshotScope::Referenced);
    }
    fn a_sequence_under_hash_leaves_every_dispatch_exact() {
        sequence(RestoreStrategy::Hash, StoreTier::File, SnapshotScope::Agent);
    }
    fn a_sequence_under_full_leaves_every_dispatch_exact() {
        sequence(RestoreStrategy::Full, StoreTier::Host, SnapshotScope::Agent);
    }
    fn a_sequence_under_auto_on_the_host_tier_leaves_every_dispatch_exact() {
        sequence(RestoreStrategy::Auto, StoreTier::Host, SnapshotScope::Agent);
    }
}

/// A buffer freed between dispatches and allocated again with another size (where the runtime
/// may give the same address), the kernel writing its last partial chunk each time.
fn reallocated(strategy: RestoreStrategy, store: StoreTier, scope: SnapshotScope) {
    let env = setup(strategy, store, scope);
    let kernel = kreplay_softhsa::register_kernel("seq_prog", prog);
    let mut len = 6 * CHUNK + 100;
    let mut buf = env.app.alloc(env.pools.coarse, len);
    for (round, next) in [
        6 * CHUNK + 100,
        6 * CHUNK + 10,
        6 * CHUNK + 3000,
        3 * CHUNK,
        9 * CHUNK + 1,
        6 * CHUNK + 100,
    ]
    .into_iter()
    .enumerate()
    {
        let init: Vec<u8> = (0..len).map(|i| (i * 7 + round * 13) as u8).collect();
        host(buf, len).copy_from_slice(&init);
        let mut want = init;
        for (k, passes) in [3u64, 4, 2, 9].into_iter().enumerate() {
            let p = Prog {
                buf: buf.0,
                len: len as u64,
                op: if k == 2 { PREFIX } else { INC },
                off: (len - 200 + k * 17) as u64 % len as u64,
                n: (200 - k * 17) as u64,
                ..Default::default()
            };
            env.run(
                kernel,
                p,
                &mut want,
                passes,
                &format!("round {round} ({buf:?}, {len} bytes) dispatch {k}"),
            );
            let m = host(buf, len);
            m[len - 1] ^= 0x80;
            want[len - 1] = m[len - 1];
        }
        env.app.free(buf);
        len = next;
        buf = env.app.alloc(env.pools.coarse, len);
    }
}

/// Four threads, each with a queue and a buffer of its own, dispatch the same kernel with their
/// own arguments; between dispatches each changes its buffer through the runtime.
fn concurrent(strategy: RestoreStrategy, store: StoreTier, scope: SnapshotScope) {
    let env = Arc::new(setup(strategy, store, scope));
    env.hooks.set_script(varied());
    let kernel = kreplay_softhsa::register_kernel("seq_prog", prog);
    let jobs: Vec<Box<dyn FnOnce() + Send>> = (0..4usize)
        .map(|t| {
            let env = env.clone();
            Box::new(move || {
                let q = env.app.queue(env.app.gpus[0]);
                let len = (5 + t) * CHUNK + 8 * t + 4;
                let init: Vec<u32> = (0..len as u32 / 4)
                    .map(|i| i.wrapping_mul(2654435761) ^ t as u32)
                    .collect();
                let buf = env.app.buffer(env.pools.coarse, &init);
                let mut want: Vec<u8> = init.iter().flat_map(|w| w.to_ne_bytes()).collect();
                for round in 0..8usize {
                    let p = Prog {
                        buf: buf.0,
                        len: len as u64,
                        op: [INC, COUNTER, PREFIX, SET][round % 4],
                        off: [(round * 1000) % len, 0, CHUNK - 7, len - 30][round % 4] as u64,
                        n: [300, 16, 900, 30][round % 4],
                        val: round as u32,
                        stride: CHUNK as u32 + 5,
                        ..Default::default()
                    };
                    env.run_on(
                        q,
                        kernel,
                        p,
                        &mut want,
                        None,
                        &format!("thread {t} round {round}"),
                    );
                    let vals: Vec<u32> = (0..50).map(|i| i * 3 + round as u32).collect();
                    let at = (round * 997 + t * 8) % (len / 4 - 50);
                    env.app.write(Ptr(buf.0 + at as u64 * 4), &vals);
                    let bytes: Vec<u8> = vals.iter().flat_map(|w| w.to_ne_bytes()).collect();
                    want[at * 4..at * 4 + 200].copy_from_slice(&bytes);
                }
            }) as Box<dyn FnOnce() + Send>
        })
        .collect();
    support::bounded(std::time::Duration::from_secs(60), jobs);
}

scenarios! {
    fn a_sequence_on_a_device_shadow_under_writeset_leaves_every_dispatch_exact() {
        sequence(RestoreStrategy::Writeset, StoreTier::Device, SnapshotScope::Agent);
    }
    fn a_sequence_on_a_device_shadow_under_unverified_write_sets_leaves_every_dispatch_exact() {
        sequence(RestoreStrategy::WritesetUnverified, StoreTier::Device, SnapshotScope::Referenced);
    }
    fn a_sequence_on_a_device_shadow_under_hash_leaves_every_dispatch_exact() {
        sequence(RestoreStrategy::Hash, StoreTier::Device, SnapshotScope::Agent);
    }
    fn a_sequence_on_a_device_shadow_under_auto_leaves_every_dispatch_exact() {
        sequence(RestoreStrategy::Auto, StoreTier::Device, SnapshotScope::Agent);
    }
    fn reallocated_buffers_under_full_leave_every_dispatch_exact() {
        reallocated(RestoreStrategy::Full, StoreTier::Host, SnapshotScope::Referenced);
    }
    fn reallocated_buffers_under_hash_leave_every_dispatch_exact() {
        reallocated(RestoreStrategy::Hash, StoreTier::File, SnapshotScope::Referenced);
    }
    fn reallocated_buffers_under_writeset_leave_every_dispatch_exact() {
        reallocated(RestoreStrategy::Writeset, StoreTier::Host, SnapshotScope::Referenced);
    }
    fn reallocated_buffers_under_unverified_write_sets_leave_every_dispatch_exact() {
        reallocated(RestoreStrategy::WritesetUnverified, StoreTier::Host, SnapshotScope::Agent);
    }
    fn reallocated_buffers_under_tracked_leave_every_dispatch_exact() {
        reallocated(RestoreStrategy::Tracked, StoreTier::Host, SnapshotScope::Referenced);
    }
    fn reallocated_buffers_under_auto_leave_every_dispatch_exact() {
        reallocated(RestoreStrategy::Auto, StoreTier::Host, SnapshotScope::Agent);
    }
}

scenarios! {
    fn threads_dispatching_one_kernel_under_writeset_leave_every_dispatch_exact() {
        concurrent(RestoreStrategy::Writeset, StoreTier::Host, SnapshotScope::Agent);
    }
    fn threads_dispatching_one_kernel_under_unverified_write_sets_leave_every_dispatch_exact() {
        concurrent(RestoreStrategy::WritesetUnverified, StoreTier::Host, SnapshotScope::Agent);
    }
    fn threads_dispatching_one_kernel_under_tracked_leave_every_dispatch_exact() {
        concurrent(RestoreStrategy::Tracked, StoreTier::Host, SnapshotScope::Agent);
    }
    fn threads_dispatching_one_kernel_under_auto_leave_every_dispatch_exact() {
        concurrent(RestoreStrategy::Auto, StoreTier::Host, SnapshotScope::Referenced);
    }
}

/// Between two dispatches under `strategy`, the application discards part of its buffer with
/// `madvise(MADV_DONTNEED)` (the pages read back as zeros: a fast way to clear memory), then
/// dispatches the kernel again: every pass must start from the zeros.
fn discarded_between_dispatches(strategy: RestoreStrategy) {
    if kreplay_wtrack::available().is_err() {
        eprintln!("skipped: writes cannot be followed here");
        return;
    }
    let env = setup(strategy, StoreTier::Host, SnapshotScope::Referenced);
    let kernel = kreplay_softhsa::register_kernel("seq_prog", prog);
    let page = kreplay_wtrack::page_size();
    let len = 64 * page;
    let buf = env.app.alloc(env.pools.coarse, len);
    let init: Vec<u8> = (0..len).map(|i| (i % 251) as u8 | 1).collect();
    host(buf, len).copy_from_slice(&init);
    let mut want = init;
    // The kernel reads every byte of pages 8 to 40 and writes them (prefix sums).
    let p = Prog {
        buf: buf.0,
        len: len as u64,
        op: PREFIX,
        off: 8 * page as u64,
        n: 32 * page as u64,
        ..Default::default()
    };
    env.run(kernel, p, &mut want, 4, "before");
    env.run(kernel, p, &mut want, 4, "again");
    // Pages the passes did not write.
    let at = (buf.0 as usize).div_ceil(page) * page + 44 * page;
    // SAFETY: whole pages inside the application's own private buffer.
    let discarded = unsafe { libc::madvise(at as *mut _, 8 * page, libc::MADV_DONTNEED) };
    assert_eq!(discarded, 0);
    let first = at - buf.0 as usize;
    want[first..first + 8 * page]
        .iter_mut()
        .for_each(|b| *b = 0);
    assert!(
        host(buf, len)[first..first + 8 * page]
            .iter()
            .all(|&b| b == 0)
    );
    // Now the kernel writes them, from what it reads there.
    let p = Prog {
        off: 40 * page as u64,
        n: 16 * page as u64,
        ..p
    };
    env.run(kernel, p, &mut want, 4, "after the discard");
    env.run(kernel, p, &mut want, 3, "after that");
}

scenarios! {
    fn pages_discarded_between_tracked_dispatches_are_seen_by_the_next_snapshot() {
        discarded_between_dispatches(RestoreStrategy::Tracked);
    }
    fn pages_discarded_between_auto_dispatches_are_seen_by_the_next_snapshot() {
        discarded_between_dispatches(RestoreStrategy::Auto);
    }
}

fn through_runtime_copies() {
    RUNTIME_COPIES.store(true, std::sync::atomic::Ordering::Relaxed);
}

scenarios! {
    fn through_runtime_copies_a_sequence_under_writeset_leaves_every_dispatch_exact() {
        through_runtime_copies();
        sequence(RestoreStrategy::Writeset, StoreTier::Host, SnapshotScope::Agent);
    }
    fn through_runtime_copies_a_sequence_under_unverified_write_sets_leaves_every_dispatch_exact() {
        through_runtime_copies();
        sequence(RestoreStrategy::WritesetUnverified, StoreTier::File, SnapshotScope::Referenced);
    }
    fn through_runtime_copies_a_sequence_under_hash_leaves_every_dispatch_exact() {
        through_runtime_copies();
        sequence(RestoreStrategy::Hash, StoreTier::Host, SnapshotScope::Agent);
    }
    fn through_runtime_copies_a_sequence_under_auto_leaves_every_dispatch_exact() {
        through_runtime_copies();
        sequence(RestoreStrategy::Auto, StoreTier::Host, SnapshotScope::Agent);
    }
    fn through_runtime_copies_a_sequence_under_tracked_leaves_every_dispatch_exact() {
        through_runtime_copies();
        sequence(RestoreStrategy::Tracked, StoreTier::Host, SnapshotScope::Agent);
    }
    fn through_runtime_copies_a_sequence_on_a_device_shadow_leaves_every_dispatch_exact() {
        through_runtime_copies();
        sequence(RestoreStrategy::Writeset, StoreTier::Device, SnapshotScope::Agent);
    }
    fn through_runtime_copies_reallocated_buffers_under_writeset_leave_every_dispatch_exact() {
        through_runtime_copies();
        reallocated(RestoreStrategy::Writeset, StoreTier::Host, SnapshotScope::Referenced);
    }
    fn through_runtime_copies_reallocated_buffers_under_auto_leave_every_dispatch_exact() {
        through_runtime_copies();
        reallocated(RestoreStrategy::Auto, StoreTier::Host, SnapshotScope::Agent);
    }
    fn through_runtime_copies_threads_under_writeset_leave_every_dispatch_exact() {
        through_runtime_copies();
        concurrent(RestoreStrategy::Writeset, StoreTier::Host, SnapshotScope::Agent);
    }
    fn through_runtime_copies_threads_under_auto_leave_every_dispatch_exact() {
        through_runtime_copies();
        concurrent(RestoreStrategy::Auto, StoreTier::Host, SnapshotScope::Agent);
    }
}

fn chunks_of(bytes: u64) {
    CHUNK_SIZE.store(bytes, std::sync::atomic::Ordering::Relaxed);
}

scenarios! {
    fn odd_chunks_under_tracked_leave_every_dispatch_exact() {
        chunks_of(1000);
        sequence(RestoreStrategy::Tracked, StoreTier::Host, SnapshotScope::Agent);
    }
    fn odd_chunks_under_writeset_leave_every_dispatch_exact() {
        chunks_of(1000);
        sequence(RestoreStrategy::Writeset, StoreTier::Host, SnapshotScope::Agent);
    }
    fn chunks_larger_than_pages_and_not_a_multiple_of_them_under_tracked_leave_every_dispatch_exact() {
        chunks_of(6000);
        sequence(RestoreStrategy::Tracked, StoreTier::Host, SnapshotScope::Agent);
    }
    fn chunks_larger_than_pages_and_not_a_multiple_of_them_under_auto_leave_every_dispatch_exact() {
        chunks_of(6000);
        sequence(RestoreStrategy::Auto, StoreTier::Host, SnapshotScope::Referenced);
    }
    fn the_smallest_chunks_under_unverified_write_sets_leave_every_dispatch_exact() {
        chunks_of(512);
        sequence(RestoreStrategy::WritesetUnverified, StoreTier::Device, SnapshotScope::Agent);
    }
    fn the_default_chunks_under_tracked_leave_every_dispatch_exact() {
        chunks_of(64 * 1024);
        sequence(RestoreStrategy::Tracked, StoreTier::Host, SnapshotScope::Agent);
    }
    fn the_default_chunks_under_hash_leave_every_dispatch_exact() {
        chunks_of(64 * 1024);
        through_runtime_copies();
        sequence(RestoreStrategy::Hash, StoreTier::File, SnapshotScope::Agent);
    }
}

/// A module variable (a `__device__` array beside a small counter and a read-only table)
/// that `prog` updates through an argument pointing at it, dispatch after dispatch: a counter
/// that moves the writes, writes into its last bytes, writes that stop.
fn module_variable(strategy: RestoreStrategy, scope: SnapshotScope) {
    use hsa_sys::HSA_EXECUTABLE_SYMBOL_INFO_VARIABLE_ADDRESS;
    let env = setup(strategy, StoreTier::Host, scope);
    let hsa = env.app.hsa();
    let gpu = env.app.gpus[0];
    let kernel = kreplay_softhsa::register_kernel("seq_prog", prog);
    let len = 5 * CHUNK + 44;
    let init: Vec<u8> = (0..len).map(|i| (i * 29 % 253) as u8).collect();
    let code = kreplay_softhsa::CodeObject::new()
        .kernel("seq_prog", kernel, std::mem::size_of::<Prog>() as u32)
        .variable("seq_small", &[3u8; 20])
        .variable("seq_array", &init)
        .readonly_variable("seq_table", &[1u8; 300]);
    let exe = hsa.load_executable(gpu, &code).expect("the code loads");
    let sym = hsa.symbol(exe, gpu, "seq_array").expect("the variable");
    let addr = hsa
        .symbol_u64(sym, HSA_EXECUTABLE_SYMBOL_INFO_VARIABLE_ADDRESS)
        .expect("its address");
    let mut want = init;
    host(Ptr(addr), 4).copy_from_slice(&[0; 4]);
    want[..4].copy_from_slice(&[0; 4]);
    let base = Prog {
        buf: addr,
        len: len as u64,
        ..Default::default()
    };
    let steps = [
        (
            Prog {
                op: COUNTER,
                off: 0,
                n: 50,
                stride: CHUNK as u32 - 3,
                ..base
            },
            3,
        ),
        (
            Prog {
                op: COUNTER,
                off: 0,
                n: 50,
                stride: CHUNK as u32 - 3,
                ..base
            },
            4,
        ),
        (
            Prog {
                op: INC,
                off: len as u64 - 9,
                n: 9,
                ..base
            },
            3,
        ),
        (
            Prog {
                op: NOTHING,
                ..base
            },
            3,
        ),
        (
            Prog {
                op: COUNTER,
                off: 0,
                n: 50,
                stride: CHUNK as u32 - 3,
                ..base
            },
            9,
        ),
        (
            Prog {
                op: PREFIX,
                off: 7,
                n: len as u64 - 7,
                ..base
            },
            4,
        ),
        (
            Prog {
                op: COUNTER,
                off: 0,
                n: 50,
                stride: CHUNK as u32 - 3,
                ..base
            },
            2,
        ),
        (
            Prog {
                op: COUNTER,
                off: 0,
                n: 50,
                stride: CHUNK as u32 - 3,
                ..base
            },
            5,
        ),
    ];
    for (i, (p, passes)) in steps.into_iter().enumerate() {
        env.run(
            kernel,
            p,
            &mut want,
            passes,
            &format!("module variable step {i}"),
        );
        let m = host(Ptr(addr), len);
        m[len - 2] = m[len - 2].wrapping_add(1);
        want[len - 2] = m[len - 2];
    }
}

scenarios! {
    fn a_module_variable_under_tracked_leaves_every_dispatch_exact() {
        module_variable(RestoreStrategy::Tracked, SnapshotScope::Referenced);
    }
    fn a_module_variable_under_auto_leaves_every_dispatch_exact() {
        module_variable(RestoreStrategy::Auto, SnapshotScope::Agent);
    }
    fn a_module_variable_under_writeset_leaves_every_dispatch_exact() {
        module_variable(RestoreStrategy::Writeset, SnapshotScope::Referenced);
    }
    fn a_module_variable_under_unverified_write_sets_leaves_every_dispatch_exact() {
        module_variable(RestoreStrategy::WritesetUnverified, SnapshotScope::Agent);
    }
    fn a_module_variable_under_hash_leaves_every_dispatch_exact() {
        module_variable(RestoreStrategy::Hash, SnapshotScope::Referenced);
    }
}

scenarios! {
    fn a_sequence_on_a_device_shadow_under_tracked_leaves_every_dispatch_exact() {
        sequence(RestoreStrategy::Tracked, StoreTier::Device, SnapshotScope::Agent);
    }
    fn a_sequence_in_a_spill_file_under_tracked_leaves_every_dispatch_exact() {
        sequence(RestoreStrategy::Tracked, StoreTier::File, SnapshotScope::Referenced);
    }
    fn threads_on_a_device_shadow_under_tracked_leave_every_dispatch_exact() {
        concurrent(RestoreStrategy::Tracked, StoreTier::Device, SnapshotScope::Agent);
    }
    fn threads_in_a_spill_file_under_auto_leave_every_dispatch_exact() {
        concurrent(RestoreStrategy::Auto, StoreTier::File, SnapshotScope::Agent);
    }
    fn reallocated_buffers_on_a_device_shadow_under_hash_leave_every_dispatch_exact() {
        reallocated(RestoreStrategy::Hash, StoreTier::Device, SnapshotScope::Agent);
    }
    fn reallocated_buffers_in_a_spill_file_under_tracked_leave_every_dispatch_exact() {
        reallocated(RestoreStrategy::Tracked, StoreTier::File, SnapshotScope::Agent);
    }
}

/// [`discarded_between_dispatches`] for pages the passes wrote every time, which tracked
/// restores leave unprotected (writing them back costs less than their faults).
fn discarded_pages_the_passes_kept_writing(strategy: RestoreStrategy) {
    if kreplay_wtrack::available().is_err() {
        eprintln!("skipped: writes cannot be followed here");
        return;
    }
    let env = setup(strategy, StoreTier::Host, SnapshotScope::Referenced);
    let kernel = kreplay_softhsa::register_kernel("seq_prog", prog);
    let page = kreplay_wtrack::page_size();
    let len = 64 * page;
    let buf = env.app.alloc(env.pools.coarse, len);
    let init: Vec<u8> = (0..len).map(|i| (i % 251) as u8 | 1).collect();
    host(buf, len).copy_from_slice(&init);
    let mut want = init;
    let first = (buf.0 as usize).div_ceil(page) * page + 8 * page - buf.0 as usize;
    // x += 1 over 16 whole pages, in every pass of every dispatch.
    let p = Prog {
        buf: buf.0,
        len: len as u64,
        op: INC,
        off: first as u64,
        n: 16 * page as u64,
        ..Default::default()
    };
    env.run(kernel, p, &mut want, 6, "before");
    env.run(kernel, p, &mut want, 6, "again");
    let at = buf.0 as usize + first;
    // SAFETY: whole pages inside the application's own private buffer.
    let discarded = unsafe { libc::madvise(at as *mut _, 16 * page, libc::MADV_DONTNEED) };
    assert_eq!(discarded, 0);
    want[first..first + 16 * page]
        .iter_mut()
        .for_each(|b| *b = 0);
    assert!(
        host(buf, len)[first..first + 16 * page]
            .iter()
            .all(|&b| b == 0)
    );
    env.run(kernel, p, &mut want, 6, "after the discard");
    env.run(kernel, p, &mut want, 3, "after that");
}

scenarios! {
    fn pages_the_passes_kept_writing_discarded_between_tracked_dispatches_are_seen() {
        discarded_pages_the_passes_kept_writing(RestoreStrategy::Tracked);
    }
    fn pages_the_passes_kept_writing_discarded_between_auto_dispatches_are_seen() {
        discarded_pages_the_passes_kept_writing(RestoreStrategy::Auto);
    }
}

/// Two buffers of sizes that are not a multiple of the store's alignment, snapshotted together
/// (the agent's memory) into a device shadow the CPU can read (the software runtime's), the
/// kernel writing the last bytes of each in turn: the restores that hash must write back the
/// snapshot's bytes of whichever region lies last in the shadow, past the first one's padding.
fn odd_sized_regions_in_a_device_shadow(strategy: RestoreStrategy) {
    let env = setup(strategy, StoreTier::Device, SnapshotScope::Agent);
    // A kernel per buffer: no write set learned on one buffer steers the other's restores.
    let kernels = [
        kreplay_softhsa::register_kernel("seq_prog_a", prog),
        kreplay_softhsa::register_kernel("seq_prog_b", prog),
    ];
    let sizes = [3 * CHUNK + 5, 2 * CHUNK + 33];
    let bufs: Vec<Ptr> = sizes
        .iter()
        .map(|&len| env.app.alloc(env.pools.coarse, len))
        .collect();
    let mut wants: Vec<Vec<u8>> = sizes
        .iter()
        .zip(&bufs)
        .map(|(&len, &buf)| {
            let init: Vec<u8> = (0..len).map(|i| (i * 17 % 249) as u8).collect();
            host(buf, len).copy_from_slice(&init);
            init
        })
        .collect();
    for round in 0..3 {
        for (k, (&len, &buf)) in sizes.iter().zip(&bufs).enumerate() {
            let p = Prog {
                buf: buf.0,
                len: len as u64,
                op: INC,
                off: len as u64 - 40,
                n: 40,
                ..Default::default()
            };
            env.run(
                kernels[k],
                p,
                &mut wants[k],
                3,
                &format!("round {round}, buffer {k}"),
            );
        }
    }
}

scenarios! {
    fn hash_restores_from_a_device_shadow_of_odd_sized_regions_write_back_exactly() {
        odd_sized_regions_in_a_device_shadow(RestoreStrategy::Hash);
    }
    fn writeset_restores_from_a_device_shadow_of_odd_sized_regions_write_back_exactly() {
        odd_sized_regions_in_a_device_shadow(RestoreStrategy::Writeset);
    }
}

/// Under `strategy` and `store`, the tool frees a buffer of the footprint at the first PASS
/// EXIT and allocates another (of another size, where the runtime may give the same address),
/// into which it stores a pattern: the restores that follow skip the freed buffer and never
/// write the new one, the kernel's own buffer ends as one run leaves it, and the next dispatches
/// (the new buffer now in their footprint) are exact too.
fn freed_and_reallocated_mid_replay(strategy: RestoreStrategy, store: StoreTier) {
    use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
    let env = setup(strategy, store, SnapshotScope::Agent);
    let kernel = kreplay_softhsa::register_kernel("seq_prog", prog);
    let len = 4 * CHUNK + 9;
    let a = env.app.alloc(env.pools.coarse, len);
    let init: Vec<u8> = (0..len).map(|i| (i * 5 % 247) as u8).collect();
    host(a, len).copy_from_slice(&init);
    let mut want = init;
    let b_len = 3 * CHUNK + 1;
    let b = env.app.alloc(env.pools.coarse, b_len);
    host(b, b_len).fill(0x11);
    let c_len = 5 * CHUNK + 3;
    static C: AtomicU64 = AtomicU64::new(0);
    let (app, pools) = (env.app, env.pools);
    env.hooks
        .set_script(Script::passes(4).on_pass_exit(move |_, _, pass, _| {
            if pass == 0 {
                app.free(b);
                let c = app.alloc(pools.coarse, c_len);
                host(c, c_len).fill(0x77);
                C.store(c.0, SeqCst);
            }
            kreplay_passloop::ContinueChange::Keep
        }));
    let p = Prog {
        buf: a.0,
        len: len as u64,
        op: INC,
        off: 0,
        n: len as u64,
        ..Default::default()
    };
    env.run_on(
        env.q,
        kernel,
        p,
        &mut want,
        Some(4),
        "the buffer freed mid-replay",
    );
    let c = Ptr(C.load(SeqCst));
    assert!(
        host(c, c_len).iter().all(|&x| x == 0x77),
        "{strategy:?}/{store:?}: the allocation made during the replay ({c:?}, freed {b:?}) was written"
    );
    let mut want_c = vec![0x77u8; c_len];
    for (i, passes) in [3u64, 5, 2].into_iter().enumerate() {
        env.run(
            kernel,
            p,
            &mut want,
            passes,
            &format!("after, dispatch {i} on the kernel's buffer"),
        );
        let pc = Prog {
            buf: c.0,
            len: c_len as u64,
            op: PREFIX,
            off: 1,
            n: c_len as u64 - 1,
            ..p
        };
        env.run(
            kernel,
            pc,
            &mut want_c,
            passes,
            &format!("after, dispatch {i} on the new buffer"),
        );
    }
}

scenarios! {
    fn a_buffer_freed_and_reallocated_mid_replay_under_hash_on_a_device_shadow() {
        freed_and_reallocated_mid_replay(RestoreStrategy::Hash, StoreTier::Device);
    }
    fn a_buffer_freed_and_reallocated_mid_replay_under_writeset() {
        freed_and_reallocated_mid_replay(RestoreStrategy::Writeset, StoreTier::Host);
    }
    fn a_buffer_freed_and_reallocated_mid_replay_under_unverified_write_sets() {
        freed_and_reallocated_mid_replay(RestoreStrategy::WritesetUnverified, StoreTier::File);
    }
    fn a_buffer_freed_and_reallocated_mid_replay_under_tracked() {
        freed_and_reallocated_mid_replay(RestoreStrategy::Tracked, StoreTier::Host);
    }
    fn a_buffer_freed_and_reallocated_mid_replay_under_auto() {
        freed_and_reallocated_mid_replay(RestoreStrategy::Auto, StoreTier::Host);
    }
    fn a_buffer_freed_and_reallocated_mid_replay_under_full() {
        freed_and_reallocated_mid_replay(RestoreStrategy::Full, StoreTier::Device);
    }
}

/// A sequence of dispatches of one kernel in which one replay's second pass faults (its queue
/// fails): the tool learns that the pass failed; the application goes on with a new queue, and
/// every later dispatch of the kernel starts from what memory holds then and is exact.
fn a_failing_pass_in_a_sequence(strategy: RestoreStrategy, store: StoreTier) {
    use std::sync::atomic::Ordering::SeqCst;
    let env = setup(strategy, store, SnapshotScope::Agent);
    let kernel = kreplay_softhsa::register_kernel("seq_prog", prog);
    let len = 12 * CHUNK + 7;
    let buf = env.app.alloc(env.pools.coarse, len);
    let init: Vec<u8> = (0..len).map(|i| (i * 3 % 241) as u8).collect();
    host(buf, len).copy_from_slice(&init);
    let mut want = init;
    let p = Prog {
        buf: buf.0,
        len: len as u64,
        op: INC,
        off: 5,
        n: 6 * CHUNK as u64,
        ..Default::default()
    };
    env.run(kernel, p, &mut want, 4, "before");
    env.run(kernel, p, &mut want, 3, "again");
    // The second pass of the next dispatch faults.
    env.hooks
        .set_script(Script::passes(4).on_pass_enter(|_, _, pass, _| {
            if pass == 1 {
                FAULT_NEXT.store(true, SeqCst);
            }
        }));
    let doomed = env.app.queue(env.app.gpus[0]);
    let kernarg = env.app.kernargs(&env.pools, Prog { tag: u32::MAX, ..p });
    let done = env.app.signal(1);
    env.app
        .dispatch(doomed, Aql::dispatch(kernel, 1, 1, kernarg, done));
    let id = env
        .hooks
        .configured_dispatches()
        .into_iter()
        .rev()
        .find(|d| d.queue_id == env.queue_id(doomed))
        .expect("the dispatch was configured")
        .dispatch_id;
    let record = env.hooks.finished_record(id);
    assert!(
        matches!(record.outcome, ReplayOutcome::PassFailed { pass: 1, .. }),
        "{strategy:?}/{store:?}: the tool learns the second pass failed: {:?}",
        record.outcome
    );
    // The application goes on from what memory holds, on a new queue.
    want.copy_from_slice(host(buf, len));
    let q = env.app.queue(env.app.gpus[0]);
    for (i, passes) in [4u64, 2, 5, 3].into_iter().enumerate() {
        env.hooks.set_script(Script::passes(passes));
        let pi = Prog {
            op: [INC, PREFIX][i % 2],
            off: (i * 1000) as u64,
            n: (7 * CHUNK) as u64,
            ..p
        };
        env.run_on(
            q,
            kernel,
            pi,
            &mut want,
            Some(passes),
            &format!("after the failure, dispatch {i}"),
        );
    }
}

scenarios! {
    fn after_a_failing_pass_later_dispatches_are_exact_under_tracked() {
        a_failing_pass_in_a_sequence(RestoreStrategy::Tracked, StoreTier::Host);
    }
    fn after_a_failing_pass_later_dispatches_are_exact_under_writeset() {
        a_failing_pass_in_a_sequence(RestoreStrategy::Writeset, StoreTier::Host);
    }
    fn after_a_failing_pass_later_dispatches_are_exact_under_auto() {
        a_failing_pass_in_a_sequence(RestoreStrategy::Auto, StoreTier::File);
    }
    fn after_a_failing_pass_later_dispatches_are_exact_under_hash_on_a_device_shadow() {
        a_failing_pass_in_a_sequence(RestoreStrategy::Hash, StoreTier::Device);
    }
    fn after_a_failing_pass_later_dispatches_are_exact_under_unverified_write_sets() {
        a_failing_pass_in_a_sequence(RestoreStrategy::WritesetUnverified, StoreTier::Host);
    }
}

/// Two threads, one per GPU agent, each dispatching the same kernel over a buffer of its own
/// agent: their replays run at the same time and hand each other the one footprint kept
/// followed (each snapshot of the other's memory stops following it); every dispatch exact.
fn two_agents_at_once(strategy: RestoreStrategy, store: StoreTier) {
    let env = Arc::new(setup(strategy, store, SnapshotScope::Agent));
    env.hooks.set_script(varied());
    let kernel = kreplay_softhsa::register_kernel("seq_prog", prog);
    let jobs: Vec<Box<dyn FnOnce() + Send>> = (0..2usize)
        .map(|t| {
            let env = env.clone();
            Box::new(move || {
                let agent = env.app.gpus[t];
                let pools = env.app.pools(agent);
                let q = env.app.queue(agent);
                let len = (9 + 3 * t) * CHUNK + 13;
                let buf = env.app.alloc(pools.coarse, len);
                let init: Vec<u8> = (0..len).map(|i| (i * 11 + t) as u8).collect();
                host(buf, len).copy_from_slice(&init);
                let mut want = init;
                for round in 0..12usize {
                    let p = Prog {
                        buf: buf.0,
                        len: len as u64,
                        op: [INC, COUNTER, PREFIX][round % 3],
                        off: [(round * 2000) % (len - 3000), 0, 100][round % 3] as u64,
                        n: [3000, 64, 5000][round % 3],
                        stride: CHUNK as u32 + 9,
                        ..Default::default()
                    };
                    let what = format!("agent {t} round {round}");
                    let tag = TAG.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
                    let p = Prog { tag, ..p };
                    let before = checksum(&want);
                    let kernarg = env.app.kernargs(&pools, p);
                    let done = env.app.signal(1);
                    env.app
                        .dispatch(q, Aql::dispatch(kernel, 1, 1, kernarg, done));
                    assert_eq!(env.app.wait_zero(done), 0, "{what}");
                    model(&mut want, &p);
                    let inputs: Vec<u64> = INPUTS
                        .lock()
                        .iter()
                        .filter(|(g, _)| *g == tag)
                        .map(|(_, c)| *c)
                        .collect();
                    assert!(
                        inputs.len() >= 2 && inputs.iter().all(|&c| c == before),
                        "{what}: passes started from other bytes ({} passes)",
                        inputs.len()
                    );
                    assert!(
                        host(buf, len) == &want[..],
                        "{what}: memory is not one run's"
                    );
                    // The application between dispatches, through the runtime.
                    env.app.fill(
                        Ptr(buf.0 + (round * 4 * 1000 % (len - 400)) as u64 / 4 * 4),
                        0x0101_0101 * round as u32,
                        100,
                    );
                    let at = (round * 4 * 1000 % (len - 400)) / 4 * 4;
                    want[at..at + 400].iter_mut().for_each(|b| *b = round as u8);
                }
            }) as Box<dyn FnOnce() + Send>
        })
        .collect();
    support::bounded(std::time::Duration::from_secs(60), jobs);
}

scenarios! {
    fn two_agents_at_once_under_tracked_leave_every_dispatch_exact() {
        two_agents_at_once(RestoreStrategy::Tracked, StoreTier::Host);
    }
    fn two_agents_at_once_under_auto_leave_every_dispatch_exact() {
        two_agents_at_once(RestoreStrategy::Auto, StoreTier::Auto);
    }
    fn two_agents_at_once_under_writeset_on_device_shadows_leave_every_dispatch_exact() {
        two_agents_at_once(RestoreStrategy::Writeset, StoreTier::Device);
    }
    fn two_agents_at_once_under_unverified_write_sets_leave_every_dispatch_exact() {
        two_agents_at_once(RestoreStrategy::WritesetUnverified, StoreTier::File);
    }
}

/// A seeded mix: up to five buffers of odd sizes (the agent's memory, all in every snapshot),
/// some freed and allocated again between dispatches, the kernel on one of them at a time with
/// an operation, offset and pass count drawn at random, and the application storing into them
/// between dispatches.
fn seeded_mix(strategy: RestoreStrategy, store: StoreTier) {
    let env = setup(strategy, store, SnapshotScope::Agent);
    for seed in 1..4 {
        seeded_mix_with(&env, seed);
    }
}

fn seeded_mix_with(env: &Env, seed: u64) {
    let kernel = kreplay_softhsa::register_kernel("seq_prog", prog);
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut next = move |n: usize| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state % n as u64) as usize
    };
    let mut bufs: Vec<(Ptr, Vec<u8>)> = Vec::new();
    let fresh = |next: &mut dyn FnMut(usize) -> usize| {
        let len = (1 + next(9)) * CHUNK + next(CHUNK) + 1;
        let buf = env.app.alloc(env.pools.coarse, len);
        let init: Vec<u8> = (0..len).map(|i| (i * 7 + len) as u8).collect();
        host(buf, len).copy_from_slice(&init);
        (buf, init)
    };
    for _ in 0..3 {
        bufs.push(fresh(&mut next));
    }
    for step in 0..40 {
        match next(6) {
            0 if bufs.len() > 1 => {
                let (buf, _) = bufs.swap_remove(next(bufs.len()));
                env.app.free(buf);
            }
            1 if bufs.len() < 5 => bufs.push(fresh(&mut next)),
            _ => {}
        }
        let k = next(bufs.len());
        let (buf, want) = &mut bufs[k];
        let len = want.len();
        let off = next(len - 8);
        let p = Prog {
            buf: buf.0,
            len: len as u64,
            op: [INC, SET, COUNTER, PREFIX, NOTHING][next(5)],
            off: off as u64,
            n: (1 + next(len - off - 4)) as u64,
            val: next(3) as u32,
            stride: (1 + next(3 * CHUNK)) as u32,
            ..Default::default()
        };
        let passes = [2u64, 3, 4, 9][next(4)];
        env.run(
            kernel,
            p,
            want,
            passes,
            &format!("seed {seed}, step {step}, buffer {k}"),
        );
        let at = next(len);
        let m = host(*buf, len);
        m[at] = m[at].wrapping_add(1);
        want[at] = m[at];
    }
    for (buf, _) in bufs {
        env.app.free(buf);
    }
}

scenarios! {
    fn a_seeded_mix_under_hash_on_device_shadows() {
        seeded_mix(RestoreStrategy::Hash, StoreTier::Device);
    }
    fn a_seeded_mix_under_writeset() {
        seeded_mix(RestoreStrategy::Writeset, StoreTier::Host);
    }
    fn a_seeded_mix_under_unverified_write_sets_on_device_shadows() {
        seeded_mix(RestoreStrategy::WritesetUnverified, StoreTier::Device);
    }
    fn a_seeded_mix_under_tracked() {
        seeded_mix(RestoreStrategy::Tracked, StoreTier::Host);
    }
    fn a_seeded_mix_under_auto() {
        seeded_mix(RestoreStrategy::Auto, StoreTier::Auto);
    }
    fn a_seeded_mix_under_auto_in_spill_files() {
        seeded_mix(RestoreStrategy::Auto, StoreTier::File);
    }
    fn a_seeded_mix_under_full_on_device_shadows() {
        seeded_mix(RestoreStrategy::Full, StoreTier::Device);
    }
}

scenarios! {
    fn a_seeded_mix_through_runtime_copies_under_writeset() {
        through_runtime_copies();
        seeded_mix(RestoreStrategy::Writeset, StoreTier::Host);
    }
    fn a_seeded_mix_through_runtime_copies_under_auto_on_device_shadows() {
        through_runtime_copies();
        seeded_mix(RestoreStrategy::Auto, StoreTier::Device);
    }
    fn a_seeded_mix_in_odd_chunks_under_tracked() {
        chunks_of(1000);
        seeded_mix(RestoreStrategy::Tracked, StoreTier::Host);
    }
    fn a_seeded_mix_in_odd_chunks_under_hash_on_device_shadows() {
        chunks_of(6000);
        seeded_mix(RestoreStrategy::Hash, StoreTier::Device);
    }
}

/// Four threads share one queue, each dispatching the same kernel over a buffer of its own (so
/// one handler call may carry several of their packets, replayed one by one in queue order).
///
/// The buffers are written with the CPU before any thread dispatches: a plain CPU store into the
/// agent's memory while another thread's dispatch replays may be undone by that replay's restore
/// (docs/rocm.md, "Plain CPU stores cannot be fenced"), so a thread initializing its buffer
/// while the others already dispatch could see its own initialization reverted.
fn threads_sharing_a_queue(strategy: RestoreStrategy, store: StoreTier) {
    let env = Arc::new(setup(strategy, store, SnapshotScope::Agent));
    env.hooks.set_script(Script::passes(3));
    let kernel = kreplay_softhsa::register_kernel("seq_prog", prog);
    let buffers: Vec<(Ptr, usize, Vec<u8>)> = (0..4usize)
        .map(|t| {
            let len = (3 + t) * CHUNK + 5 * t + 1;
            let buf = env.app.alloc(env.pools.coarse, len);
            let init: Vec<u8> = (0..len).map(|i| (i * 13 + t) as u8).collect();
            host(buf, len).copy_from_slice(&init);
            (buf, len, init)
        })
        .collect();
    let jobs: Vec<Box<dyn FnOnce() + Send>> = buffers
        .into_iter()
        .enumerate()
        .map(|(t, (buf, len, init))| {
            let env = env.clone();
            Box::new(move || {
                let mut want = init;
                for round in 0..10usize {
                    let tag = TAG.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
                    let p = Prog {
                        buf: buf.0,
                        len: len as u64,
                        tag,
                        op: [INC, PREFIX, COUNTER][round % 3],
                        off: [round * 300, 10, 0][round % 3] as u64,
                        n: [2000, len - 20, 32][round % 3] as u64,
                        stride: 2 * CHUNK as u32 + 1,
                        ..Default::default()
                    };
                    let what = format!("thread {t} round {round}");
                    let before = checksum(&want);
                    let kernarg = env.app.kernargs(&env.pools, p);
                    let done = env.app.signal(1);
                    env.app
                        .dispatch(env.q, Aql::dispatch(kernel, 1, 1, kernarg, done));
                    assert_eq!(env.app.wait_zero(done), 0, "{what}");
                    model(&mut want, &p);
                    let inputs: Vec<u64> = INPUTS
                        .lock()
                        .iter()
                        .filter(|(g, _)| *g == tag)
                        .map(|(_, c)| *c)
                        .collect();
                    assert!(
                        inputs.len() == 3 && inputs.iter().all(|&c| c == before),
                        "{what}: {} passes, not all from the first pass's bytes",
                        inputs.len()
                    );
                    assert!(
                        host(buf, len) == &want[..],
                        "{what}: memory is not one run's"
                    );
                }
            }) as Box<dyn FnOnce() + Send>
        })
        .collect();
    support::bounded(std::time::Duration::from_secs(60), jobs);
}

scenarios! {
    fn threads_sharing_a_queue_under_writeset() {
        threads_sharing_a_queue(RestoreStrategy::Writeset, StoreTier::Host);
    }
    fn threads_sharing_a_queue_under_tracked() {
        threads_sharing_a_queue(RestoreStrategy::Tracked, StoreTier::Host);
    }
    fn threads_sharing_a_queue_under_hash_on_device_shadows() {
        threads_sharing_a_queue(RestoreStrategy::Hash, StoreTier::Device);
    }
    fn threads_sharing_a_queue_under_auto() {
        threads_sharing_a_queue(RestoreStrategy::Auto, StoreTier::Auto);
    }
}

/// Runs of `moving` so far: each run writes somewhere else, as a kernel whose writes depend on
/// something no snapshot holds (a clock, a host counter) does.
static MOVES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// `x += 1` on 16 bytes at a chunk chosen by how many runs came before, after noting the
/// buffer's checksum (tagged as `prog`'s).
fn moving(group: &WorkGroup) {
    // SAFETY: every dispatch of this kernel carries a `Prog` block.
    let p: Prog = unsafe { group.kernargs() };
    if group.group_id() != [0, 0, 0] {
        return;
    }
    // SAFETY: the scenario allocated `len` bytes at `buf`.
    let mem = unsafe { std::slice::from_raw_parts_mut(p.buf as *mut u8, p.len as usize) };
    INPUTS.lock().push((p.tag, checksum(mem)));
    let run = MOVES.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    let at = (run as usize * CHUNK) % (p.len as usize - 16);
    model(
        mem,
        &Prog {
            op: INC,
            off: at as u64,
            n: 16,
            ..p
        },
    );
}

/// A kernel whose passes each write a chunk never written before, under `strategy`: no more than
/// 7 restores in a row go unverified (none but under `writeset-unverified`), the restore before
/// the last pass is verified (so the last pass starts from the first pass's bytes), every pass
/// after a verified restore does too, and memory ends as one run from the dispatch's bytes
/// leaves it.
fn writes_moving_every_pass(strategy: RestoreStrategy, store: StoreTier) {
    let env = setup(strategy, store, SnapshotScope::Referenced);
    let kernel = kreplay_softhsa::register_kernel("seq_moving", moving);
    let len = 64 * CHUNK;
    let buf = env.app.alloc(env.pools.coarse, len);
    let init: Vec<u8> = (0..len).map(|i| (i % 253) as u8).collect();
    host(buf, len).copy_from_slice(&init);
    for (round, passes) in [20u64, 9, 2, 17].into_iter().enumerate() {
        env.hooks.set_script(Script::passes(passes));
        let tag = TAG.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
        let before_bytes = host(buf, len).to_vec();
        let before = checksum(&before_bytes);
        let p = Prog {
            buf: buf.0,
            len: len as u64,
            tag,
            ..Default::default()
        };
        let kernarg = env.app.kernargs(&env.pools, p);
        let done = env.app.signal(1);
        env.app
            .dispatch(env.q, Aql::dispatch(kernel, 1, 1, kernarg, done));
        assert_eq!(env.app.wait_zero(done), 0);
        let last_run = MOVES.load(std::sync::atomic::Ordering::SeqCst) - 1;
        let id = env
            .hooks
            .configured_dispatches()
            .last()
            .expect("a dispatch")
            .dispatch_id;
        let record = env.hooks.finished_record(id);
        assert_eq!(
            record.outcome,
            ReplayOutcome::Replayed {
                passes,
                end: LoopEnd::LastPass
            },
            "round {round}"
        );
        let mut unverified = vec![false; passes as usize];
        for e in env.hooks.events_of(id) {
            if let Event::Restore {
                phase: Phase::Exit,
                request,
                report,
                ..
            } = e
            {
                assert!(!report.failed, "round {round}: {report:?}");
                unverified[request.next_pass as usize] = report.unverified;
            }
        }
        let longest = unverified
            .split(|u| !u)
            .map(<[bool]>::len)
            .max()
            .unwrap_or(0);
        let most = if strategy == RestoreStrategy::WritesetUnverified {
            7
        } else {
            0
        };
        assert!(
            longest <= most,
            "{strategy:?} round {round}: {longest} unverified restores in a row: {unverified:?}"
        );
        assert!(
            !unverified[passes as usize - 1],
            "round {round}: the last pass followed an unverified restore"
        );
        let inputs: Vec<u64> = INPUTS
            .lock()
            .iter()
            .filter(|(t, _)| *t == tag)
            .map(|(_, c)| *c)
            .collect();
        assert_eq!(inputs.len() as u64, passes, "round {round}");
        for (pass, c) in inputs.iter().enumerate() {
            assert!(
                unverified[pass] || *c == before,
                "round {round}: pass {pass} started from other bytes after a verified restore"
            );
        }
        let mut want = before_bytes;
        let at = (last_run as usize * CHUNK) % (len - 16);
        model(
            &mut want,
            &Prog {
                op: INC,
                off: at as u64,
                n: 16,
                ..p
            },
        );
        assert!(
            host(buf, len) == &want[..],
            "round {round}: memory is not one run's (the last pass's) from the dispatch's bytes"
        );
    }
}

scenarios! {
    fn unverified_write_sets_verify_every_eighth_restore_and_before_the_last_pass() {
        writes_moving_every_pass(RestoreStrategy::WritesetUnverified, StoreTier::Host);
    }
    fn write_sets_catch_writes_that_move_every_pass() {
        writes_moving_every_pass(RestoreStrategy::Writeset, StoreTier::Device);
    }
    fn tracked_restores_catch_writes_that_move_every_pass() {
        writes_moving_every_pass(RestoreStrategy::Tracked, StoreTier::Host);
    }
    fn auto_catches_writes_that_move_every_pass() {
        writes_moving_every_pass(RestoreStrategy::Auto, StoreTier::File);
    }
}

/// Between two dispatches under `strategy`, the application forks (as Python's multiprocessing
/// does); the child writes the buffer (its own copy) and exits, the parent then stores into the
/// buffer itself: the next dispatch starts from the parent's bytes.
fn forked_between_dispatches(strategy: RestoreStrategy) {
    let env = setup(strategy, StoreTier::Host, SnapshotScope::Referenced);
    let kernel = kreplay_softhsa::register_kernel("seq_prog", prog);
    let len = 32 * CHUNK;
    let buf = env.app.alloc(env.pools.coarse, len);
    let init: Vec<u8> = (0..len).map(|i| (i % 239) as u8).collect();
    host(buf, len).copy_from_slice(&init);
    let mut want = init;
    let p = Prog {
        buf: buf.0,
        len: len as u64,
        op: INC,
        off: 0,
        n: 8 * CHUNK as u64,
        ..Default::default()
    };
    env.run(kernel, p, &mut want, 4, "before");
    env.run(kernel, p, &mut want, 4, "again");
    // SAFETY: the child only stores into its copy of the buffer and leaves with _exit.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        host(buf, len).fill(0xEE);
        // SAFETY: ends the child at once, running nothing of the parent's.
        unsafe { libc::_exit(0) };
    }
    assert!(pid > 0, "fork");
    let mut status = 0;
    // SAFETY: waits for the child just forked.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    let m = host(buf, len);
    for at in [5, 3 * CHUNK + 1, 9 * CHUNK, 20 * CHUNK + 7] {
        m[at] = m[at].wrapping_add(50);
        want[at] = m[at];
    }
    let wide = Prog {
        n: 24 * CHUNK as u64,
        ..p
    };
    env.run(kernel, wide, &mut want, 4, "after the fork");
    env.run(kernel, wide, &mut want, 3, "after that");
}

scenarios! {
    fn a_fork_between_tracked_dispatches_changes_nothing_the_next_replay_sees_wrong() {
        forked_between_dispatches(RestoreStrategy::Tracked);
    }
    fn a_fork_between_auto_dispatches_changes_nothing_the_next_replay_sees_wrong() {
        forked_between_dispatches(RestoreStrategy::Auto);
    }
}

/// The harness itself: a job of [`support::bounded`] that panics fails the scenario at once,
/// with its message, instead of being reported as a deadlock once the limit has passed.
#[test]
fn a_panicking_bounded_job_is_reported_at_once_with_its_message() {
    let limit = std::time::Duration::from_secs(30);
    let started = std::time::Instant::now();
    let jobs: Vec<Box<dyn FnOnce() -> u32 + Send>> =
        vec![Box::new(|| 1), Box::new(|| panic!("the job's own message"))];
    let payload = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        support::bounded(limit, jobs)
    }))
    .expect_err("a panicking job fails bounded");
    let message = payload
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_default();
    assert!(
        started.elapsed() < limit / 2,
        "reported after {:?}",
        started.elapsed()
    );
    assert!(message.contains("the job's own message"), "{message}");
    assert!(!message.contains("deadlock"), "{message}");
}
