//! The snapshot store's tiers and limits seen from the application, on the software runtime: a
//! footprint at the budget and one byte over it, a spill folder that went away after start-up,
//! and memory freed and allocated again larger between dispatches. Either every pass sees the
//! first pass's bytes and memory ends as after one run, or the dispatch is declined with a
//! reason and runs once; nothing is left in the spill folder. Every scenario runs in a process
//! of its own.

#[allow(dead_code)]
#[macro_use]
mod support;

use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};

use kreplay_drain::DrainConfig;
use kreplay_hsa::InstallOptions;
use kreplay_passloop::{DeclineReason, LoopEnd, RanOnceReason, ReplayOutcome};
use kreplay_snapshot::{RestoreStrategy, SnapshotConfig, StoreTier};
use kreplay_softhsa::WorkGroup;
use support::app::{self, App, Pools, Ptr, WAIT};
use support::tool::{Script, TestHooks};

/// Runs of `add_one` per tag.
static RUNS: [AtomicU32; 8] = [const { AtomicU32::new(0) }; 8];

#[repr(C)]
#[derive(Clone, Copy)]
struct AddArgs {
    buf: u64,
    len: u32,
    tag: u32,
}

/// `buf[i] += 1`; work-group 0 counts the run.
fn add_one(group: &WorkGroup) {
    // SAFETY: every dispatch of this kernel carries an `AddArgs` block.
    let args: AddArgs = unsafe { group.kernargs() };
    if group.group_id() == [0, 0, 0] {
        RUNS[args.tag as usize].fetch_add(1, Ordering::SeqCst);
    }
    for [i, _, _] in group.work_items() {
        if i < args.len {
            // SAFETY: the buffer holds `len` u32s; each work-item owns index `i`.
            unsafe { *(args.buf as *mut u32).add(i as usize) += 1 };
        }
    }
}

fn runs(tag: u32) -> u32 {
    RUNS[tag as usize].load(Ordering::SeqCst)
}

fn values(start: u32, len: usize) -> Vec<u32> {
    (0..len as u32).map(|i| start + 7 * i).collect()
}

fn plus_one(v: &[u32]) -> Vec<u32> {
    v.iter().map(|x| x + 1).collect()
}

fn declined(outcome: &ReplayOutcome) -> Option<DeclineReason> {
    match outcome {
        ReplayOutcome::RanOnce {
            why: RanOnceReason::Declined(d),
        } => Some(d.reason),
        _ => None,
    }
}

fn replayed(passes: u64) -> ReplayOutcome {
    ReplayOutcome::Replayed {
        passes,
        end: LoopEnd::LastPass,
    }
}

struct Env {
    app: App,
    hooks: std::sync::Arc<TestHooks>,
    pools: Pools,
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
    let pools = app.pools(app.gpus[0]);
    Env { app, hooks, pools }
}

impl Env {
    /// Dispatches `add_one` over the `len` u32s at `buf`, waits for the application's
    /// completion (fired exactly once) and returns the dispatch's outcome and snapshot bytes.
    fn add(&self, buf: Ptr, len: u32, tag: u32) -> (ReplayOutcome, u64) {
        let queue = self.app.queue(self.app.gpus[0]);
        let done = self.app.signal(1);
        let kernarg = self.app.kernargs(
            &self.pools,
            AddArgs {
                buf: buf.0,
                len,
                tag,
            },
        );
        let kernel = kreplay_softhsa::register_kernel("tiers_add_one", add_one);
        self.app.dispatch(
            queue,
            app::Aql::dispatch(kernel, len.max(64), 64, kernarg, done),
        );
        assert_eq!(
            self.app.wait_zero(done),
            0,
            "the application's completion fired"
        );
        assert_eq!(self.app.load(done), 0, "the completion fired exactly once");
        let id = self
            .hooks
            .configured_dispatches()
            .last()
            .expect("a dispatch reached CONFIG ENTER")
            .dispatch_id;
        let record = self.hooks.finished_record(id);
        (record.outcome, record.cost.bytes_snapshotted)
    }
}

/// 4096 u32s: 16 KiB, a whole number of the runtime's allocation granules.
const LEN: u32 = 4096;
const FOOTPRINT: u64 = LEN as u64 * 4;

fn host_tier() -> SnapshotConfig {
    SnapshotConfig::default()
        .with_store(StoreTier::Host)
        .with_strategy(RestoreStrategy::Full)
}

fn scratch(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("tiers-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

scenarios! {
    /// A footprint exactly as large as the budget fits it: replayed, +1.
    fn a_footprint_exactly_at_the_budget_is_replayed() {
        let env = setup(host_tier().with_max_bytes(Some(FOOTPRINT)));
        let init = values(3, LEN as usize);
        let buf = env.app.buffer(env.pools.coarse, &init);
        assert_eq!(env.app.allocation_size(buf), FOOTPRINT);

        let (outcome, bytes) = env.add(buf, LEN, 1);

        assert_eq!(outcome, replayed(3));
        assert_eq!(bytes, FOOTPRINT);
        assert_eq!(runs(1), 3);
        assert_eq!(env.app.read(buf, LEN as usize), plus_one(&init));
    }

    /// One byte over the budget: declined `footprint_budget`, run once, +1.
    fn a_footprint_one_byte_over_the_budget_is_declined_and_runs_once() {
        let env = setup(host_tier().with_max_bytes(Some(FOOTPRINT - 1)));
        let init = values(5, LEN as usize);
        let buf = env.app.buffer(env.pools.coarse, &init);

        let (outcome, _) = env.add(buf, LEN, 1);

        assert_eq!(declined(&outcome), Some(DeclineReason::FootprintBudget), "{outcome:?}");
        let ReplayOutcome::RanOnce { why: RanOnceReason::Declined(decline) } = &outcome else {
            unreachable!()
        };
        assert!(
            decline.detail.contains(&FOOTPRINT.to_string())
                && decline.detail.contains(&(FOOTPRINT - 1).to_string()),
            "the reason gives the footprint and the budget: {}",
            decline.detail
        );
        assert_eq!(runs(1), 1);
        assert_eq!(env.app.read(buf, LEN as usize), plus_one(&init));
    }

    /// The spill folder, usable at start-up, removed before a dispatch that spills: declined
    /// with a reason, run once, +1; made again, the next dispatch spills and is replayed, and
    /// nothing is left in it.
    fn a_spill_folder_removed_after_start_up_declines_until_it_is_back() {
        let spill = scratch("removed");
        let env = setup(
            host_tier()
                .with_store(StoreTier::File)
                .with_spill_dir(Some(spill.clone())),
        );
        let init = values(9, LEN as usize);
        let buf = env.app.buffer(env.pools.coarse, &init);
        std::fs::remove_dir(&spill).unwrap();

        let (outcome, _) = env.add(buf, LEN, 1);

        assert_eq!(declined(&outcome), Some(DeclineReason::SnapshotFailed), "{outcome:?}");
        let ReplayOutcome::RanOnce { why: RanOnceReason::Declined(decline) } = &outcome else {
            unreachable!()
        };
        assert!(
            decline.detail.contains(&spill.display().to_string()),
            "the reason names the folder: {}",
            decline.detail
        );
        assert_eq!(runs(1), 1);
        assert_eq!(env.app.read(buf, LEN as usize), plus_one(&init));
        assert!(!spill.exists(), "the folder is not made again behind the user's back");

        std::fs::create_dir(&spill).unwrap();
        let (outcome, _) = env.add(buf, LEN, 2);
        assert_eq!(outcome, replayed(3));
        assert_eq!(env.app.read(buf, LEN as usize), plus_one(&plus_one(&init)));
        assert_eq!(std::fs::read_dir(&spill).unwrap().count(), 0, "no spill file left");
        let _ = std::fs::remove_dir_all(&spill);
    }

    /// Memory followed page by page after a replay (`tracked`, the store kept), then freed and
    /// allocated again larger, at the same address where the runtime hands it out there: the
    /// next dispatch over it snapshots the new allocation whole (never the kept store's older,
    /// shorter bytes), and its passes see its first pass's bytes.
    fn memory_freed_and_allocated_again_larger_is_snapshotted_whole() {
        let env = setup(
            SnapshotConfig::default()
                .with_store(StoreTier::Host)
                .with_strategy(RestoreStrategy::Tracked),
        );
        let init = values(1, LEN as usize);
        let small = env.app.buffer(env.pools.coarse, &init);
        let (outcome, _) = env.add(small, LEN, 1);
        assert_eq!(outcome, replayed(3));
        env.app.free(small);
        // Ask for the larger allocation until the runtime hands it out at the same address
        // (bounded; the rest of the check holds wherever it lands).
        let mut held = Vec::new();
        let large = loop {
            let p = env.app.alloc(env.pools.coarse, 4 * FOOTPRINT as usize);
            if p.0 == small.0 || held.len() >= 64 {
                break p;
            }
            held.push(p);
        };
        for p in held {
            env.app.free(p);
        }
        let init = values(11, 4 * LEN as usize);
        env.app.write(large, &init);

        let (outcome, bytes) = env.add(large, 4 * LEN, 2);

        assert_eq!(outcome, replayed(3));
        assert_eq!(bytes, 4 * FOOTPRINT);
        assert_eq!(runs(2), 3);
        assert_eq!(env.app.read(large, 4 * LEN as usize), plus_one(&init));
        println!("same address: {}", large.0 == small.0);
    }

    /// A dispatch that holds no memory (no buffer of the agent's, none referenced) under the
    /// file tier, with a budget of zero bytes and no spill folder at all: nothing is to be kept,
    /// so nothing is made and the replay goes ahead.
    fn a_dispatch_holding_no_memory_replays_under_a_zero_budget_without_a_spill_folder() {
        let spill = scratch("none");
        let env = setup(
            host_tier()
                .with_store(StoreTier::File)
                .with_max_bytes(Some(0))
                .with_spill_dir(Some(spill.clone())),
        );
        std::fs::remove_dir(&spill).unwrap();

        let (outcome, bytes) = env.add(Ptr(0), 0, 1);

        assert_eq!((outcome, bytes), (replayed(3), 0));
        assert_eq!(runs(1), 3);
        assert!(!spill.exists());
    }

    /// The same under the device tier: no shadow is needed.
    fn a_dispatch_holding_no_memory_replays_under_the_device_tier() {
        let env = setup(host_tier().with_store(StoreTier::Device));

        let (outcome, bytes) = env.add(Ptr(0), 0, 1);

        assert_eq!((outcome, bytes), (replayed(3), 0));
        assert_eq!(runs(1), 3);
    }
}
