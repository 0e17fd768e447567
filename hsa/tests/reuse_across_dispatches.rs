//! What kreplay carries from one dispatch of a kernel to the next (write sets learned per kernel
//! and region set, a footprint kept followed with its store, auto's history) against an
//! application that changes its memory between dispatches: every pass of every dispatch must
//! start from the bytes the application left, and the final memory must be what one ordinary
//! run of each dispatch leaves.

#[allow(dead_code)]
#[macro_use]
mod support;

use std::sync::Arc;

use kreplay_drain::DrainConfig;
use kreplay_hsa::InstallOptions;
use kreplay_passloop::{LoopEnd, Phase, ReplayOutcome, RestoreStrategy as Strategy};
use kreplay_snapshot::{RestoreStrategy, SnapshotConfig, StoreTier};
use kreplay_softhsa::WorkGroup;
use parking_lot::Mutex;
use support::app::{self, App, Aql, Pools, Ptr, Queue, WAIT};
use support::tool::{Event, Script, TestHooks};

/// (tag, checksum of the buffer) at the start of every run of `mix`.
static INPUTS: Mutex<Vec<(u32, u64)>> = Mutex::new(Vec::new());

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct MixArgs {
    buf: u64,
    words: u32,
    tag: u32,
    first: u32,
    count: u32,
    stride: u32,
    /// 0: `x = 3x + j`; 1: where `x` is odd `x = 3x + 1`, else the word half a buffer on gets 7.
    mode: u32,
    /// A second buffer (0: none) of `words2` u32 whose first `count2` words get `5x + 1`.
    buf2: u64,
    words2: u32,
    count2: u32,
}

fn checksum(words: &[u32]) -> u64 {
    words.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &w| {
        (h ^ u64::from(w)).wrapping_mul(0x0100_0000_01b3)
    })
}

fn model2(mem2: &mut [u32], a: &MixArgs) {
    for x in mem2.iter_mut().take(a.count2 as usize) {
        *x = x.wrapping_mul(5).wrapping_add(1);
    }
}

/// What one run of `mix` does to `mem`.
fn model(mem: &mut [u32], a: &MixArgs) {
    let words = a.words as usize;
    for i in 0..a.count as usize {
        let j = (a.first as usize + i * a.stride.max(1) as usize) % words;
        match a.mode {
            0 => mem[j] = mem[j].wrapping_mul(3).wrapping_add(j as u32),
            _ => {
                if mem[j] & 1 == 1 {
                    mem[j] = mem[j].wrapping_mul(3).wrapping_add(1);
                } else {
                    let k = (j + words / 2) % words;
                    mem[k] = mem[k].wrapping_add(7);
                }
            }
        }
    }
}

/// One work-item does the whole dispatch, after noting a checksum of what it starts from.
fn mix(group: &WorkGroup) {
    // SAFETY: every dispatch of this kernel carries a `MixArgs` block.
    let a: MixArgs = unsafe { group.kernargs() };
    if group.group_id() != [0, 0, 0] {
        return;
    }
    // SAFETY: the scenario sized the buffer for `words` u32.
    let mem = unsafe { std::slice::from_raw_parts_mut(a.buf as *mut u32, a.words as usize) };
    let mut sum = checksum(mem);
    if a.buf2 != 0 {
        // SAFETY: the scenario sized the second buffer for `words2` u32.
        let mem2 = unsafe { std::slice::from_raw_parts_mut(a.buf2 as *mut u32, a.words2 as usize) };
        sum ^= checksum(mem2).rotate_left(1);
        model2(mem2, &a);
    }
    INPUTS.lock().push((a.tag, sum));
    model(mem, &a);
}

struct Env {
    app: App,
    hooks: Arc<TestHooks>,
    pools: Pools,
    q: Queue,
    tag: std::cell::Cell<u32>,
}

fn setup(snapshot: SnapshotConfig, passes: u64) -> Env {
    let hooks = TestHooks::new(0);
    let app = app::install(
        hooks.clone(),
        InstallOptions {
            drain: DrainConfig::new(WAIT),
            snapshot,
            ..Default::default()
        },
    );
    hooks.configure_replay(true);
    hooks.set_script(Script::passes(passes));
    let pools = app.pools(app.gpus[0]);
    let q = app.queue(app.gpus[0]);
    Env {
        app,
        hooks,
        pools,
        q,
        tag: std::cell::Cell::new(0),
    }
}

fn host<'a>(p: Ptr, words: usize) -> &'a mut [u32] {
    // SAFETY: the scenario allocated at least `words` u32 at `p`, host memory on softhsa.
    unsafe { std::slice::from_raw_parts_mut(p.0 as *mut u32, words) }
}

impl Env {
    /// Runs `kernel` (a registered `mix`) with `args` (its tag set here), checks every pass
    /// started from `want`'s bytes and that memory after it is `want` after one run.
    /// Returns the dispatch's id.
    fn run(&self, kernel: u64, args: MixArgs, want: &mut [u32], passes: u64, what: &str) -> u64 {
        self.run2(kernel, args, want, &mut [], passes, what)
    }

    /// The strategy SNAPSHOT EXIT reported for dispatch `id`, and each RESTORE EXIT's.
    fn strategies(&self, id: u64) -> (Strategy, Vec<Strategy>) {
        let mut snapshot = None;
        let mut restores = Vec::new();
        for e in self.hooks.events_of(id) {
            match e {
                Event::Snapshot {
                    phase: Phase::Exit,
                    report,
                    ..
                } => snapshot = Some(report.strategy),
                Event::Restore {
                    phase: Phase::Exit,
                    report,
                    ..
                } => restores.push(report.strategy),
                _ => {}
            }
        }
        (snapshot.expect("a SNAPSHOT EXIT"), restores)
    }

    /// [`run`](Env::run) with a second buffer (`args.buf2`, expected to hold `want2`).
    fn run2(
        &self,
        kernel: u64,
        mut args: MixArgs,
        want: &mut [u32],
        want2: &mut [u32],
        passes: u64,
        what: &str,
    ) -> u64 {
        let tag = self.tag.get() + 1;
        self.tag.set(tag);
        args.tag = tag;
        let mut before = checksum(want);
        if args.buf2 != 0 {
            before ^= checksum(want2).rotate_left(1);
        }
        let kernarg = self.app.kernargs(&self.pools, args);
        let done = self.app.signal(1);
        self.app
            .dispatch(self.q, Aql::dispatch(kernel, 1, 1, kernarg, done));
        assert_eq!(self.app.wait_zero(done), 0);
        let id = self
            .hooks
            .configured_dispatches()
            .last()
            .expect("a dispatch")
            .dispatch_id;
        let record = self.hooks.finished_record(id);
        let inputs: Vec<u64> = INPUTS
            .lock()
            .iter()
            .filter(|(t, _)| *t == tag)
            .map(|(_, c)| *c)
            .collect();
        model(want, &args);
        if args.buf2 != 0 {
            model2(want2, &args);
            let mem2 = host(Ptr(args.buf2), args.words2 as usize);
            assert!(mem2 == want2, "{what}: the second buffer differs");
        }
        let mem = host(Ptr(args.buf), args.words as usize);
        let wrong: Vec<usize> = (0..want.len())
            .filter(|&i| mem[i] != want[i])
            .take(6)
            .collect();
        assert!(
            inputs.len() as u64 == passes
                && inputs.iter().all(|&c| c == before)
                && wrong.is_empty(),
            "{what}: outcome {:?}; passes started from the right bytes: {:?}; words {wrong:?} hold {:?}, want {:?}",
            record.outcome,
            inputs.iter().map(|&c| c == before).collect::<Vec<_>>(),
            wrong.iter().map(|&i| mem[i]).collect::<Vec<_>>(),
            wrong.iter().map(|&i| want[i]).collect::<Vec<_>>(),
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
        id
    }
}

fn config(strategy: RestoreStrategy, store: StoreTier) -> SnapshotConfig {
    SnapshotConfig::default()
        .with_store(store)
        .with_strategy(strategy)
        .with_chunk_size(4096)
}

/// A buffer of `words`, dispatches that write different chunks each time, some depending on the
/// contents, with the application changing memory between them (plain stores, runtime copies
/// and fills).
fn moving_writes(strategy: RestoreStrategy, store: StoreTier) {
    let env = setup(config(strategy, store), 4);
    let kernel = kreplay_softhsa::register_kernel("reuse_mix", mix);
    let words = 256 * 1024; // 1 MiB: 256 chunks
    let init: Vec<u32> = (0..words as u32)
        .map(|i| i.wrapping_mul(2654435761))
        .collect();
    let buf = env.app.buffer(env.pools.coarse, &init);
    let mut want = init.clone();
    let base = MixArgs {
        buf: buf.0,
        words: words as u32,
        ..Default::default()
    };
    let what = format!("{strategy:?}/{store:?}");
    for round in 0..6u32 {
        // Chunks A then B then A again, and a content-dependent pass.
        let first = [0, 128 * 1024, 0, 4000, 7, 99_999][round as usize];
        let args = MixArgs {
            first,
            count: 2048,
            stride: 1 + round * 37,
            mode: round % 2,
            ..base
        };
        let passes = [4, 1, 4, 2, 1, 7][round as usize];
        env.hooks.set_script(Script::passes(passes));
        env.run(
            kernel,
            args,
            &mut want,
            passes,
            &format!("{what} round {round}"),
        );
        // The application between dispatches.
        let mem = host(buf, words);
        for i in (round as usize * 13..words).step_by(4099) {
            mem[i] = mem[i].wrapping_add(round + 1);
            want[i] = mem[i];
        }
        let vals: Vec<u32> = (0..1000).map(|i| i * 7 + round).collect();
        let at = (round as usize * 30_011) % (words - 2000);
        env.app.write(Ptr(buf.0 + at as u64 * 4), &vals);
        want[at..at + 1000].copy_from_slice(&vals);
        let fat = (round as usize * 50_021 + 77) % (words - 3000);
        env.app
            .fill(Ptr(buf.0 + fat as u64 * 4), 0x5555_0000 | round, 2500);
        want[fat..fat + 2500]
            .iter_mut()
            .for_each(|x| *x = 0x5555_0000 | round);
    }
}

scenarios! {
    /// Verified write sets learned by one dispatch and used by the next, while the kernel's
    /// writes move (other chunks, or chunks chosen by the contents) and the application stores,
    /// copies and fills between dispatches; some dispatches run once (one pass), which neither
    /// snapshots nor restores.
    fn a_write_set_learned_by_one_dispatch_never_leaves_the_next_ones_moved_writes_unrestored() {
        moving_writes(RestoreStrategy::Writeset, StoreTier::Host);
    }

    /// The same under tracked restores: a footprint kept followed between dispatches, its next
    /// snapshot copying only the pages written since (one-pass dispatches between them).
    fn a_footprint_kept_followed_sees_every_change_between_dispatches_whatever_the_pass_counts() {
        moving_writes(RestoreStrategy::Tracked, StoreTier::Host);
    }

    /// The same under auto, which follows writes or not from what earlier dispatches learned.
    fn auto_choosing_from_what_earlier_dispatches_learned_keeps_every_pass_exact() {
        moving_writes(RestoreStrategy::Auto, StoreTier::File);
    }
}

/// Region sets that overlap but differ, a buffer freed and allocated again (other sizes), the
/// same kernel on other buffers, and hundreds of other kernels between two dispatches.
fn changing_region_sets(strategy: RestoreStrategy) {
    let config = SnapshotConfig::default()
        .with_store(StoreTier::Host)
        .with_strategy(strategy)
        .with_chunk_size(4096)
        .with_scope(kreplay_snapshot::SnapshotScope::Referenced);
    let env = setup(config, 3);
    let kernel = kreplay_softhsa::register_kernel("reuse_mix", mix);
    let words = 64 * 1024;
    let a = env.app.buffer(env.pools.coarse, &vec![1; words]);
    let b = env.app.buffer(env.pools.coarse, &vec![2; words]);
    let mut wa = vec![1u32; words];
    let mut wb = vec![2u32; words];
    let one = MixArgs {
        buf: a.0,
        words: words as u32,
        first: 5,
        count: 300,
        stride: 17,
        ..Default::default()
    };
    let both = MixArgs {
        buf2: b.0,
        words2: words as u32,
        count2: 100,
        ..one
    };
    let what = format!("{strategy:?}");
    for round in 0..3u32 {
        env.run2(
            kernel,
            both,
            &mut wa,
            &mut wb,
            3,
            &format!("{what} round {round}: a and b"),
        );
        host(a, words)[round as usize * 999] = 42 + round;
        wa[round as usize * 999] = 42 + round;
        host(b, words)[50 + round as usize] = 7 + round;
        wb[50 + round as usize] = 7 + round;
        env.run(kernel, one, &mut wa, 3, &format!("{what} round {round}: a"));
        host(b, words)[60 + round as usize] = 9 + round;
        wb[60 + round as usize] = 9 + round;
        env.run2(
            kernel,
            MixArgs {
                buf: b.0,
                buf2: a.0,
                count2: 10,
                ..both
            },
            &mut wb,
            &mut wa,
            3,
            &format!("{what} round {round}: b and a"),
        );
        host(a, words)[70] = round;
        wa[70] = round;
    }
    // Hundreds of other kernels (each its own learned state), then the first again.
    for k in 0..300u32 {
        let name: &'static str = Box::leak(format!("reuse_mix_{k}").into_boxed_str());
        let other = kreplay_softhsa::register_kernel(name, mix);
        let args = MixArgs {
            first: k * 7,
            count: 3,
            ..one
        };
        env.run(other, args, &mut wa, 3, &format!("{what} kernel {k}"));
    }
    host(a, words)[5] = 1234;
    wa[5] = 1234;
    env.run2(
        kernel,
        both,
        &mut wa,
        &mut wb,
        3,
        &format!("{what}: after 300 kernels"),
    );
    // Freed and allocated again, smaller then larger, at whatever address the runtime gives.
    let mut a = a;
    for (i, w) in [words / 2, words, words * 2].into_iter().enumerate() {
        env.app.free(a);
        let again = env.app.alloc(env.pools.coarse, w * 4);
        let mut wa2: Vec<u32> = (0..w as u32).map(|x| x ^ 0xabcd).collect();
        host(again, w).copy_from_slice(&wa2);
        let args = MixArgs {
            buf: again.0,
            words: w as u32,
            first: 3,
            count: 500,
            stride: 11,
            ..both
        };
        env.run2(
            kernel,
            args,
            &mut wa2,
            &mut wb,
            3,
            &format!("{what} realloc {i} ({again:?} after {a:?})"),
        );
        host(again, w)[9] = 99;
        wa2[9] = 99;
        env.run2(
            kernel,
            args,
            &mut wa2,
            &mut wb,
            3,
            &format!("{what} realloc {i} again"),
        );
        env.app.free(again);
        a = env.app.alloc(env.pools.coarse, words * 4);
        host(a, words).copy_from_slice(&wa);
        env.run(
            kernel,
            MixArgs { buf: a.0, ..one },
            &mut wa,
            3,
            &format!("{what} realloc {i} back ({a:?})"),
        );
    }
}

scenarios! {
    /// Learned state is kept per kernel and region set, the least recently used dropped beyond
    /// 256: a kernel whose region set grows, shrinks and swaps roles between dispatches, 300
    /// other kernels between two of its dispatches, and its buffer freed and allocated again at
    /// other sizes; every pass of every dispatch exact.
    fn learned_state_follows_region_sets_that_change_and_outlives_300_other_kernels() {
        changing_region_sets(RestoreStrategy::Writeset);
    }
}

scenarios! {
    /// Between two tracked dispatches the application zeroes part of its buffer by mapping fresh
    /// anonymous memory over it (`mmap(MAP_FIXED)`, a fast way to clear large ranges): the pages
    /// are no longer the ones kreplay followed, so the next snapshot cannot continue from what
    /// it followed; it must copy the buffer as it is now, and every pass start from the zeros.
    /// Under `tracked` the replay still follows writes (with a tracker of its own), and its
    /// snapshot reports the strategy its restores use.
    fn memory_mapped_over_a_followed_buffer_between_dispatches_is_snapshotted_as_it_is() {
        if kreplay_wtrack::available().is_err() { return; }
        let env = setup(config(RestoreStrategy::Tracked, StoreTier::Host), 4);
        let kernel = kreplay_softhsa::register_kernel("reuse_mix", mix);
        let page = kreplay_wtrack::page_size();
        let bytes = 4 << 20;
        let words = bytes / 4;
        let init: Vec<u32> = (0..words as u32).map(|i| i | 1).collect();
        let buf = env.app.buffer(env.pools.coarse, &init);
        let mut want = init.clone();
        // Odd words: mode 1 multiplies them; every 97th word of the buffer.
        let args = MixArgs { buf: buf.0, words: words as u32, first: 0, count: (words / 97) as u32, stride: 97, mode: 1, ..Default::default() };
        env.run(kernel, args, &mut want, 4, "before");
        // Fresh zero pages over 64 pages in the middle of the buffer.
        let at = (buf.0 as usize).div_ceil(page) * page + 100 * page;
        // SAFETY: a range inside the application's own buffer, replaced by private anonymous
        // memory of the same protection.
        let p = unsafe {
            libc::mmap(at as *mut _, 64 * page, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED, -1, 0)
        };
        assert_eq!(p as usize, at);
        let first = (at - buf.0 as usize) / 4;
        want[first..first + 64 * page / 4].iter_mut().for_each(|x| *x = 0);
        let id = env.run(kernel, args, &mut want, 4, "after the mmap");
        // What the snapshot says is what the restores do: still following writes (a tracker
        // of its own, the one kept could not say what was written), or restoring without.
        let (snapshot, restores) = env.strategies(id);
        assert!(
            restores.iter().all(|r| *r == snapshot),
            "the snapshot reported {snapshot:?}, its restores were {restores:?}"
        );
        assert_eq!(snapshot, Strategy::Tracked, "writes are followed again");
        host(buf, words)[first + 5] = 77;
        want[first + 5] = 77;
        env.run(kernel, args, &mut want, 4, "again");
    }
}

#[path = "support/uring.rs"]
mod uring;

scenarios! {
    /// After a tracked replay kept its footprint followed, the application registers its buffer
    /// with io_uring, reads a file into it (the kernel writes through its own mapping of the
    /// pinned pages, unseen by any page protection), and unregisters it again, all before the
    /// next dispatch: pinning the pages for writing marked them written, so the next snapshot
    /// copies them and every pass starts from the bytes read.
    fn a_buffer_pinned_read_into_and_unpinned_between_dispatches_is_seen_by_the_next_replay() {
        if kreplay_wtrack::available().is_err() { return; }
        let env = setup(config(RestoreStrategy::Tracked, StoreTier::Host), 4);
        let kernel = kreplay_softhsa::register_kernel("reuse_mix", mix);
        let page = kreplay_wtrack::page_size();
        let words = 64 * page / 4;
        let init: Vec<u32> = (0..words as u32).collect();
        let buf = env.app.buffer(env.pools.coarse, &init);
        let mut want = init.clone();
        // The kernel writes the first page only.
        let args = MixArgs { buf: buf.0, words: words as u32, first: 0, count: 64, stride: 1, ..Default::default() };
        env.run(kernel, args, &mut want, 4, "before");
        assert_eq!(kreplay_wtrack::pinned_bytes(), 0);
        let Some(ring) = uring::Ring::new() else {
            eprintln!("skipped: no io_uring");
            return;
        };
        // Pages 16 to 32 of the buffer (with the page before, where the buffer is not aligned).
        let registered = (buf.0 as usize + 16 * page) & !(page - 1);
        ring.register_buffer(registered, 16 * page).expect("registering the buffer");
        let data: Vec<u32> = (0..8 * page as u32 / 4).map(|i| 900_000 + i).collect();
        let bytes: Vec<u8> = data.iter().flat_map(|v| v.to_ne_bytes()).collect();
        let file = uring::memfd_with(&bytes);
        let at = 20 * page;
        assert_eq!(ring.read_fixed(file, buf.0 as usize + at, bytes.len(), 0).expect("READ_FIXED"), bytes.len());
        ring.unregister_buffers().expect("unregistering the buffer");
        assert_eq!(kreplay_wtrack::pinned_bytes(), 0, "unpinned before the next dispatch");
        want[at / 4..at / 4 + data.len()].copy_from_slice(&data);
        env.run(kernel, args, &mut want, 4, "after the read");
    }
}
