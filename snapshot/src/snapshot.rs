//! Taking snapshots and restoring them.

use std::collections::TryReserveError;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::config::{ConfigError, RestoreStrategy, SnapshotConfig, StoreTier};
use crate::copy::{
    WriteOutcome, copy_pieces_to_host, copy_to_host, copy_to_shadow, hash_and_restore, hash_live,
    hash_store, restore_on_device, windows, write_back,
};
use crate::device::{Capabilities, CopyError, DeviceMemory, VerifyRange};
use crate::inventory::{Filter, Inventory, Region};
use crate::layout::{Layout, Piece, marked_indices};
use crate::learned::{
    Key, Learned, PROBE_EVERY, SharedMemory, estimate, full_is_cheaper, new_kernel_hashes_pay,
    refresh_copy_rate, restore_unfollowed_ns, snapshot_hashes_pay, store_hashes_pay,
};
use crate::report::{RestoreError, RestoreReport, SnapshotError, SnapshotReport};
use crate::source::{RegionSource, SourceBreakdown};
use crate::store::{Store, StoreSource};
use crate::track::{self, Followed, Outlook, PassClock, Tracking, tracking_pays};
use smallvec::SmallVec;

/// The id of the next snapshot taken (see `Snapshot::id`).
static NEXT_SNAPSHOT_ID: AtomicU64 = AtomicU64::new(1);

/// Under the auto strategy, snapshots smaller than this are always restored in full.
pub const AUTO_FULL_BELOW_BYTES: u64 = 1 << 20;

/// Takes snapshots of device memory through one device. Holds the configuration and a kept
/// store for reuse. `Send + Sync`; several snapshots may be taken at once (each gets its own
/// store).
pub struct Snapshotter {
    inventory: Arc<Inventory>,
    source: Arc<StoreSource>,
    config: SnapshotConfig,
    /// What restores learned, per kernel and region set, and the machine's measured rates.
    memory: SharedMemory,
}

/// The selection a snapshot will copy, with its size: what SNAPSHOT ENTER reports as planned;
/// and, when the caller knows it, how many restores the replay plans after the snapshot.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct SnapshotPlan {
    layout: Layout,
    agent: Option<u64>,
    /// Source of each region of `layout`, in the same order.
    sources: Vec<RegionSource>,
    /// The agents whose copy fences the copies hold (`None`: every agent).
    fence: Option<SmallVec<[u64; 2]>>,
    /// Restores the replay plans after the snapshot (see
    /// [`with_planned_restores`](SnapshotPlan::with_planned_restores)).
    restores: Option<u64>,
    /// The restore strategy of this snapshot when not the configured one (see
    /// [`with_strategy`](SnapshotPlan::with_strategy)).
    strategy: Option<RestoreStrategy>,
}

impl SnapshotPlan {
    /// The regions to copy, sorted by base.
    pub fn regions(&self) -> &[Region] {
        &self.layout.regions
    }

    /// Bytes to copy.
    pub fn bytes(&self) -> u64 {
        self.layout.bytes
    }

    /// Chunks those bytes form.
    pub fn chunks(&self) -> u64 {
        self.layout.chunks() as u64
    }

    /// The owner agent the plan is restricted to (where a device shadow would be allocated).
    pub fn agent(&self) -> Option<u64> {
        self.agent
    }

    /// Why each region is in the plan, in the order of [`regions`](SnapshotPlan::regions).
    pub fn sources(&self) -> &[RegionSource] {
        &self.sources
    }

    /// Regions and bytes per source.
    pub fn breakdown(&self) -> SourceBreakdown {
        SourceBreakdown::of(self.layout.regions.iter().zip(&self.sources))
    }

    /// The plan for a replay that plans `restores` restores after the snapshot (N - 1 for N
    /// passes; at most that many when the replay may stop earlier), or `None` when it does not
    /// know (an indefinite loop). Under `auto` this decides whether the snapshot hashes its
    /// chunks: only when the restores planned repay the hashing (see
    /// [`Snapshotter::take_for_kernel`]); without it, auto expects what the kernel's earlier
    /// dispatch restored, or for a kernel seen for the first time what the latest dispatch of
    /// any kernel restored. A replay that runs past the restores planned stays correct (and
    /// may hash the store then): the number only steers cost, never what is restored.
    pub fn with_planned_restores(mut self, restores: Option<u64>) -> Self {
        self.restores = restores;
        self
    }

    /// The restores planned after the snapshot, if known.
    pub fn planned_restores(&self) -> Option<u64> {
        self.restores
    }

    /// The plan for a snapshot restored by `strategy` instead of the snapshotter's configured
    /// strategy (`None`: the configured one). For a caller that measured, per launch, which way
    /// of restoring is cheaper (a backend choosing between full device copies and verified
    /// restores on the device): `writeset` then hashes the snapshot and verifies every restore,
    /// whatever `auto`'s rates would have said. Every strategy but `writeset-unverified`
    /// verifies, so a caller choosing among `full`, `hash` and `writeset` keeps auto's
    /// guarantees.
    pub fn with_strategy(mut self, strategy: Option<RestoreStrategy>) -> Self {
        self.strategy = strategy;
        self
    }

    /// The strategy this plan asks for instead of the configured one, if any.
    pub fn strategy(&self) -> Option<RestoreStrategy> {
        self.strategy
    }

    pub(crate) fn fence_agents(&self) -> Option<SmallVec<[u64; 2]>> {
        self.fence.clone()
    }
}

/// How restores of one snapshot decide what to write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    Full,
    Hash,
    /// A write set verified before every pass: the set is written from the store, every other
    /// chunk is hashed.
    Writeset,
    /// A write set written without hashing between verifications (the opt-in shortcut).
    WritesetUnverified,
    /// Auto: before each restore, the cheapest of full, hash and verified write set by the
    /// machine's measured rates and what this kernel's restores changed; where the device's
    /// writes can be followed and that looks cheaper, tracked restores until one costs more
    /// than a full restore would.
    Adaptive,
    /// Tracked restores (hash restores where writes cannot be followed).
    Tracked,
}

/// What one restore does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Step {
    /// Write every chunk.
    Full,
    /// Write the learned write set without hashing.
    Learned,
    /// Hash every live chunk (outside the write set when `predict`: those are written from the
    /// store unhashed) and write the changed ones; `learn` adds them to the write set.
    Detect { learn: bool, predict: bool },
    /// Write back the chunks of the pages the tracker saw written, hashing nothing.
    Tracked,
}

/// The restore a [`RestoreRequest`] would get, known before it runs (RESTORE ENTER data).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct RestorePlan {
    /// Strategy the restore will use (never `Auto`).
    pub strategy: RestoreStrategy,
    /// Whether it hashes every live chunk.
    pub verify: bool,
    /// Upper bound of the bytes it writes.
    pub bytes_planned: u64,
    /// Bytes it hashes.
    pub bytes_to_hash: u64,
}

/// A request to restore memory before the next pass.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RestoreRequest {
    /// Index of the pass that will run on the restored memory.
    pub next_pass: u64,
    /// Whether that pass may be the last one (the last of N, or whenever a continue callback
    /// could stop the loop). Such a restore always verifies with hashes.
    pub may_be_final: bool,
}

/// Host copies (or a device shadow) of every selected region, and the state of dirty detection.
/// Dropping it frees the store (or keeps it for the next snapshot, see
/// `SnapshotConfig::keep_store`).
pub struct Snapshot {
    /// The agents whose copy fences restores hold (`None`: every agent).
    pub(crate) fence: Option<SmallVec<[u64; 2]>>,
    pub(crate) layout: Layout,
    pub(crate) store: Store,
    pub(crate) source: Arc<StoreSource>,
    pub(crate) inventory: Arc<Inventory>,
    caps: Capabilities,
    mode: Mode,
    verify_every: u32,
    keep_store: bool,
    report: SnapshotReport,
    /// Hash of every chunk as snapshotted (empty under `Mode::Full`).
    pub(crate) hashes: Vec<u64>,
    /// Names `hashes` and the store for a device's verified restores (unique in the process).
    id: u64,
    /// Scratch for hashes of live memory, reused across restores.
    live_hashes: Vec<u64>,
    /// Scratch for the ranges of a device's verified restore, reused across restores.
    verify_ranges: Vec<VerifyRange>,
    /// Learned write set (`None` until the first learning hash pass, unless an earlier
    /// dispatch of the same kernel left one).
    learned: Option<WriteSet>,
    /// Whether chunk hashes were taken (restores other than full need them).
    hashed: bool,
    /// Under auto, when the snapshot was taken without hashes: the restores that choice
    /// expected, or (a snapshot whose writes were followed) the restores its replay planned.
    /// A replay that runs past them, or that stops following writes short of them, may hash
    /// the store instead (see `Snapshot::store_hash_due`).
    expected_restores: Option<u64>,
    /// Under auto, whether this replay followed writes and stopped because that cost more
    /// than it saved (see `Snapshot::stop_tracking_if_dear`).
    stopped_following: bool,
    /// The kernel and region set this snapshot's learning is kept under, if any.
    key: Option<Key>,
    memory: SharedMemory,
    /// Chunks changed at the latest restore that hashed everything / outside the set at the
    /// latest predicting restore; restores in a row auto wrote in full.
    stats: Learned,
    restores_since_hash: u32,
    /// Set after a failed restore: the next one hashes everything.
    needs_verify: bool,
    /// The pages of the regions followed since the snapshot (`None`: not followed, or no
    /// longer trusted: restores then write in full or hash).
    tracking: Option<Tracking>,
    /// Whether the regions stay followed after the snapshot is dropped (see [`Followed`]).
    keep_following: bool,
    /// The chunks the latest restore found changed, where it knew each of them.
    repeats: Repeats,
    /// Whether the passes were expected to write what the pass before wrote when the snapshot
    /// was taken (see `track::Outlook::repeat`), until a restore measures it.
    repeat: f64,
    /// The passes between restores, timed while writes are followed (what a fault costs them).
    passes: PassClock,
    /// Folded changes a device shadow refused to take (see [`Snapshot::fold`]): every restore
    /// writes them after the store's bytes.
    pub(crate) overlay: Vec<crate::fold::Overlay>,
}

pub(crate) fn try_vec<T: Clone>(len: usize, value: T) -> Result<Vec<T>, TryReserveError> {
    let mut v = Vec::new();
    v.try_reserve_exact(len)?;
    v.resize(len, value);
    Ok(v)
}

impl Snapshotter {
    /// A snapshotter over `inventory` and `device`. Fails when the configuration is invalid.
    pub fn new(
        inventory: Arc<Inventory>,
        device: Arc<dyn DeviceMemory>,
        config: SnapshotConfig,
    ) -> Result<Self, ConfigError> {
        config.validate()?;
        Ok(Snapshotter {
            inventory,
            source: Arc::new(StoreSource::new(device)),
            config,
            memory: SharedMemory::default(),
        })
    }

    /// The inventory snapshots are taken from.
    pub fn inventory(&self) -> &Arc<Inventory> {
        &self.inventory
    }

    pub(crate) fn device(&self) -> &dyn DeviceMemory {
        &*self.source.device
    }

    /// The configuration.
    pub fn config(&self) -> &SnapshotConfig {
        &self.config
    }

    /// Select the regions `filter` picks and check the plan against the budget.
    ///
    /// Errors: `UntrackedMemory` when a required address lies in no tracked allocation,
    /// `FootprintBudget` when the plan exceeds `max_bytes`.
    pub fn plan(&self, filter: &Filter) -> Result<SnapshotPlan, SnapshotError> {
        let selected = self
            .inventory
            .select_checked(filter)
            .map_err(|addr| SnapshotError::UntrackedMemory { addr })?;
        // Copies fence the filter's agent and the owner of every selected allocation, so no
        // free of any of them runs under a copy.
        let fence = filter.agent().map(|agent| {
            let mut agents: SmallVec<[u64; 2]> = SmallVec::new();
            agents.push(agent);
            for owner in selected.iter().filter_map(|s| s.owner) {
                if !agents.contains(&owner) {
                    agents.push(owner);
                }
            }
            agents
        });
        let sources = selected.iter().map(|s| s.source).collect();
        let regions = selected.iter().map(|s| s.region).collect();
        let layout = Layout::new(regions, self.config.chunk_size);
        self.check_budget(layout.bytes)?;
        Ok(SnapshotPlan {
            layout,
            agent: filter.agent(),
            sources,
            fence,
            restores: None,
            strategy: None,
        })
    }

    fn check_budget(&self, planned: u64) -> Result<(), SnapshotError> {
        match self.config.max_bytes {
            Some(budget) if planned > budget => {
                Err(SnapshotError::FootprintBudget { planned, budget })
            }
            _ => Ok(()),
        }
    }

    /// Copy the planned regions into a store. Regions freed since planning are left out (and
    /// counted in `regions_skipped`). Device memory is only read; on error every store is
    /// released and nothing was written. Nothing learned is kept for later dispatches (see
    /// [`take_for_kernel`](Snapshotter::take_for_kernel)).
    pub fn take(&self, plan: SnapshotPlan) -> Result<Snapshot, SnapshotError> {
        self.take_keyed(plan, None)
    }

    /// [`take`](Snapshotter::take) for a dispatch of `kernel`: the write set and the figures
    /// earlier dispatches of the same kernel over the same regions learned are reused (the
    /// write set is restored from the store without hashing; `auto` picks its strategy from
    /// them), and what this snapshot's restores learn is kept for the next dispatch when it is
    /// dropped. Every restore still verifies under `writeset` and `auto`.
    pub fn take_for_kernel(
        &self,
        plan: SnapshotPlan,
        kernel: u64,
    ) -> Result<Snapshot, SnapshotError> {
        self.take_keyed(plan, Some(kernel))
    }

    /// Kernels whose learned state is kept.
    pub fn kernels_learned(&self) -> usize {
        self.memory.lock().len()
    }

    fn take_keyed(
        &self,
        plan: SnapshotPlan,
        kernel: Option<u64>,
    ) -> Result<Snapshot, SnapshotError> {
        let start = Instant::now();
        self.check_budget(plan.layout.bytes)?;
        // Every copy, hash and restore of the snapshot runs on kreplay's pool: a process where
        // it cannot start (no thread to be had) declines here, before anything is allocated.
        crate::pool::ready().map_err(|detail| SnapshotError::StoreUnavailable {
            tier: self.config.store,
            bytes: plan.layout.store_len,
            detail,
        })?;
        let device: &dyn DeviceMemory = &*self.source.device;
        let caps = device.capabilities();
        // A footprint still followed after an earlier replay: continued from when this snapshot
        // covers the same allocations (its store holds their bytes, but for the pages written
        // since), else stopped here, before anything is allocated or followed anew.
        let mut followed = self.source.take_followed();
        // Not when memory is pinned for I/O now: the kernel may have written it unseen.
        if let Some(f) = followed.take_if(|f| {
            !f.fits(&plan.layout, self.config.store) || !track::may_stay_followed(None)
        }) {
            self.end_followed(f);
        }
        // Allocate before pinning the inventory: a backend's shadow allocation must not wait
        // on (or deadlock with) frees.
        let (mut store, mut kept) = match followed {
            Some(Followed {
                mut store,
                tracking,
                ..
            }) => {
                store.reused = true;
                (store, Some(tracking))
            }
            None => (
                self.source
                    .acquire(plan.layout.store_len, plan.agent, &self.config)
                    .map_err(|detail| SnapshotError::StoreUnavailable {
                        tier: self.config.store,
                        bytes: plan.layout.store_len,
                        detail,
                    })?,
                None,
            ),
        };
        let tier = store.tier();
        let planned = plan.layout.bytes;
        let pinned = self.inventory.pin(plan.fence.as_deref());
        let live: Vec<bool> = plan
            .layout
            .regions
            .iter()
            .map(|r| pinned.is_live(r))
            .collect();
        let skipped = live.iter().filter(|l| !**l).count() as u64;
        let sources: Vec<RegionSource> = plan
            .sources
            .iter()
            .zip(&live)
            .filter(|(_, l)| **l)
            .map(|(s, _)| *s)
            .collect();
        let layout = if skipped == 0 {
            plan.layout
        } else {
            let kept = plan
                .layout
                .regions
                .iter()
                .zip(&live)
                .filter(|(_, l)| **l)
                .map(|(r, _)| *r)
                .collect();
            Layout::new(kept, self.config.chunk_size)
        };
        let all_live = vec![true; layout.regions.len()];
        let wins = windows(device, &layout, &all_live);
        let host_access = wins.iter().all(Option::is_some);
        let strategy = plan.strategy.unwrap_or(self.config.strategy);
        let mode = self.mode_for(strategy, layout.bytes, tier, caps, host_access);
        let trackable = caps.cpu_writes && host_access && layout.bytes > 0;
        let learns = matches!(mode, Mode::Writeset | Mode::Adaptive);
        let key = kernel
            .filter(|_| learns)
            .map(|k| Key::new(k, &layout.regions, layout.chunk_size));
        let earlier = key.and_then(|k| self.memory.lock().get(&k, layout.chunks()));
        // Whether the kernel's passes write what the pass before wrote: as its earlier dispatch
        // measured it, else as the latest dispatch of any kernel that measured it did, else
        // taken to (a replay runs the same kernel on the same bytes each pass).
        let repeat = earlier
            .as_ref()
            .and_then(|e| e.repeat)
            .or(self.memory.lock().typical_repeat)
            .unwrap_or(1.0);
        // Auto skips the hashes when they would not pay for themselves over the restores
        // expected (see `snapshot_hashes_pay`): those the replay plans, when it said; else
        // those of the kernel's earlier dispatch, or for a kernel seen for the first time those
        // of the latest dispatch of any kernel. What the earlier dispatches learned decides what
        // each restore is expected to save. A probe hashes again every `PROBE_EVERY` full
        // restores.
        let expected_restores = match (&earlier, mode) {
            (_, Mode::Full) => None,
            (_, _) if plan.restores.is_some() => plan.restores,
            (Some(e), _) => Some(e.restores),
            (None, _) => self.memory.lock().typical_restores,
        };
        // The footprint still followed can be continued only whole: a region freed since (left
        // out of this layout) ends it.
        if skipped > 0 || !trackable {
            end_tracking(&mut kept, &self.memory);
        }
        let followed = kept.is_some();
        // A snapshot of the same footprint as the one before it: expected to be followed by
        // another, which could continue following it.
        let footprint = {
            use std::hash::{Hash, Hasher};
            let mut h = std::collections::hash_map::DefaultHasher::new();
            (&layout.regions, layout.chunk_size).hash(&mut h);
            h.finish()
        };
        let continues = self.config.keep_store
            && store.reusable()
            && self.memory.lock().last_footprint.replace(footprint) == Some(footprint);
        // Followed from before the copy, so the first pass's writes are seen. Under auto only
        // where it looks cheaper than what auto would do otherwise (see `tracking_pays`).
        let tracking = match mode {
            Mode::Tracked if trackable => {
                let prices = self.memory.lock().track.resolve();
                kept.take().or_else(|| Tracking::arm(&wins, prices))
            }
            Mode::Adaptive if trackable && self.config.track_writes => {
                let (pays, prices) = {
                    let memory = self.memory.lock();
                    let outlook = Outlook {
                        restores: expected_restores,
                        // What the kernel's earlier dispatch found changed; when it restored
                        // in full (which says nothing of it), what other kernels changed.
                        dirty: match &earlier {
                            Some(Learned {
                                dirty_chunks: Some(d),
                                ..
                            }) => Some(*d as f64 / layout.chunks().max(1) as f64),
                            _ => memory.typical_dirty,
                        },
                        repeat: Some(repeat),
                        earlier: earlier.as_ref(),
                        bytes: layout.bytes,
                        chunks: layout.chunks() as u64,
                        chunk_size: layout.chunk_size,
                        followed,
                        continues,
                    };
                    let prices = memory.track.resolve();
                    let pays = prices
                        .is_some_and(|prices| tracking_pays(&memory.rates, &prices, &outlook));
                    (pays, prices)
                };
                pays.then(|| kept.take().or_else(|| Tracking::arm(&wins, prices)))
                    .flatten()
            }
            _ => None,
        };
        // Not continued (another mode, or not worth it): stop following it now.
        let continued = followed && kept.is_none() && tracking.is_some();
        end_tracking(&mut kept, &self.memory);
        if let Some(t) = tracking.as_ref().filter(|_| !continued) {
            self.memory.lock().track.record(t);
        }
        // Continuing to follow: only the pages written since the last snapshot differ from the
        // store. They are protected again before they are copied, so a write racing the copy
        // is seen by the next restore. A tracker that cannot say, or refuses, is ended, and
        // everything is copied; under `tracked` the pages are followed by a tracker of their
        // own from before that copy (else restored as `hash`, below), as if none had been kept.
        let mut tracking = tracking;
        let incremental = continued
            .then_some(tracking.as_mut())
            .flatten()
            .and_then(|t| {
                let changed = t.changed(&layout, &all_live, &wins)?;
                let pieces = layout.runs_of(&all_live, changed);
                t.rearm(&layout, &wins, &pieces, false).then_some(pieces)
            })
            .filter(|_| store.device_addr().is_none());
        if continued && incremental.is_none() {
            end_tracking(&mut tracking, &self.memory);
            if mode == Mode::Tracked {
                let prices = self.memory.lock().track.resolve();
                tracking = Tracking::arm(&wins, prices);
                if let Some(t) = &tracking {
                    self.memory.lock().track.record(t);
                }
            }
        }
        // Asked to track where writes cannot be followed: hash restores instead.
        let mode = if mode == Mode::Tracked && tracking.is_none() {
            Mode::Hash
        } else {
            mode
        };
        let hashed = match mode {
            Mode::Full | Mode::Tracked => false,
            Mode::Adaptive if tracking.is_some() => false,
            Mode::Adaptive => {
                let memory = self.memory.lock();
                let chunks = layout.chunks() as u64;
                let pays = |restores| {
                    snapshot_hashes_pay(
                        &memory.rates,
                        earlier.as_ref(),
                        restores,
                        chunks,
                        layout.chunk_size,
                    )
                };
                match (&earlier, expected_restores) {
                    (Some(e), _) if e.full_streak >= PROBE_EVERY => true,
                    // A kernel seen for the first time, or whose earlier dispatches restored in
                    // full (they say nothing about what it changes): what other kernels changed
                    // is a guess.
                    (None, Some(r))
                    | (
                        Some(Learned {
                            dirty_chunks: None, ..
                        }),
                        Some(r),
                    ) => new_kernel_hashes_pay(
                        &memory.rates,
                        r,
                        chunks,
                        layout.chunk_size,
                        memory.typical_dirty,
                    ),
                    (Some(_), expected) => expected.is_none_or(pays),
                    // Nothing known at all: hash (a replay may be long).
                    (None, None) => true,
                }
            }
            _ => true,
        };
        let mut hashes = try_vec(if hashed { layout.chunks() } else { 0 }, 0u64).map_err(|e| {
            SnapshotError::StoreUnavailable {
                tier,
                bytes: layout.chunks() as u64 * 8,
                detail: format!("chunk hash table: {e}"),
            }
        })?;
        let copy_start = Instant::now();
        // Kept followed after the replay where its store is kept; under auto not when over half
        // its pages were written since the last snapshot: faults on those cost the application
        // more than the copy following saves.
        let keep_following = self.config.keep_store
            && store.reusable()
            && !(mode == Mode::Adaptive
                && incremental.is_some()
                && tracking
                    .as_ref()
                    .is_some_and(|t| 2 * t.last_pages.unwrap_or(0) as usize > t.followed_pages()));
        let copied = match (&incremental, store.device_addr()) {
            (Some(pieces), _) => {
                let len = layout.store_len as usize;
                Ok(copy_pieces_to_host(
                    &layout,
                    &wins,
                    &mut store.bytes_mut()[..len],
                    pieces,
                ))
            }
            (None, Some(shadow)) => copy_to_shadow(device, &layout, shadow).and_then(|n| {
                if hashed {
                    hash_live(device, caps, &layout, &all_live, &wins, &mut hashes, None)?;
                }
                Ok(n)
            }),
            (None, None) => {
                let len = layout.store_len as usize;
                let dst = &mut store.bytes_mut()[..len];
                copy_to_host(
                    device,
                    &layout,
                    &wins,
                    dst,
                    hashed.then_some(&mut hashes[..]),
                )
            }
        };
        drop(pinned);
        // Copies into a kept host store teach the machine's rates (a fresh store's first touch
        // would not), with and without hashing.
        if let Ok(n) = copied
            && store.reused
            && store.device_addr().is_none()
            && incremental.is_none()
        {
            let mut memory = self.memory.lock();
            if hashed {
                memory.rates.record_hashed_copy(n, copy_start.elapsed());
            } else {
                memory.rates.record_copy(n, copy_start.elapsed());
            }
        }
        let bytes_moved = match copied {
            Ok(n) => n,
            Err(e) => {
                if self.config.keep_store {
                    self.source.give_back(store);
                }
                return Err(SnapshotError::CopyFailed(e));
            }
        };

        let learned = earlier
            .as_ref()
            .and_then(|e| WriteSet::from_flags(&layout, e.write_set.clone()));
        let report = SnapshotReport {
            bytes_planned: planned,
            bytes_moved,
            regions: layout.regions.len() as u64,
            regions_skipped: skipped,
            chunks: layout.chunks() as u64,
            tier,
            strategy: match mode {
                Mode::Full => RestoreStrategy::Full,
                Mode::Tracked => RestoreStrategy::Tracked,
                Mode::Adaptive if tracking.is_some() => RestoreStrategy::Tracked,
                Mode::Adaptive if !hashed => RestoreStrategy::Full,
                Mode::Hash => RestoreStrategy::Hash,
                Mode::Writeset | Mode::WritesetUnverified | Mode::Adaptive => {
                    RestoreStrategy::Writeset
                }
            },
            pinned: store.pinned(),
            hashed,
            elapsed: start.elapsed(),
            sources: SourceBreakdown::of(layout.regions.iter().zip(&sources)),
        };
        let mut passes = PassClock::default();
        passes.restart(tracking.is_some());
        Ok(Snapshot {
            fence: plan.fence,
            layout,
            store,
            source: self.source.clone(),
            inventory: self.inventory.clone(),
            caps,
            mode,
            verify_every: self.config.verify_every,
            keep_store: self.config.keep_store,
            report,
            hashes,
            id: NEXT_SNAPSHOT_ID.fetch_add(1, Ordering::Relaxed),
            live_hashes: Vec::new(),
            verify_ranges: Vec::new(),
            learned,
            hashed,
            expected_restores: expected_restores.filter(|_| mode == Mode::Adaptive && !hashed),
            stopped_following: false,
            key,
            memory: self.memory.clone(),
            stats: earlier
                .map(|e| Learned { restores: 0, ..e })
                .unwrap_or_default(),
            restores_since_hash: 0,
            needs_verify: false,
            keep_following,
            tracking,
            repeats: Repeats::default(),
            repeat,
            passes,
            overlay: Vec::new(),
        })
    }

    /// Stop following a footprint kept followed after its replay: the kernel un-protects its
    /// pages (timed, for the prices of later decisions), and its store goes back for reuse.
    fn end_followed(&self, followed: Followed) {
        end_followed(followed, &self.source, &self.memory);
    }

    /// Stop following the footprint still followed after its replay, if any (see
    /// [`following`](Snapshotter::following)); returns whether one was. The next snapshot of it
    /// then copies all of it again. A snapshot of other allocations does this itself.
    pub fn stop_following(&self) -> bool {
        let followed = self.source.take_followed();
        let was = followed.is_some();
        if let Some(f) = followed {
            self.end_followed(f);
        }
        was
    }

    /// What a fault on a followed page costs the passes, in nanoseconds per page, as the passes
    /// of this snapshotter's replays measured it (the median of the latest five measurements:
    /// where a replay's passes write the same pages, its first pass faults on each and its
    /// third on none); `None` until one did. `auto` prices following writes by it, and until
    /// then by `kreplay-wtrack`'s probe of a small mapping.
    pub fn measured_fault_ns(&self) -> Option<f64> {
        self.memory.lock().track.fault_ns.median()
    }

    /// Bytes of the footprint whose writes are still followed after the replay that followed
    /// them ended, if any. Where a replay followed writes (`tracked`, or `auto` where that
    /// pays) and kept its store (`keep_store`), its regions stay followed when its snapshot is
    /// dropped: the first write to each page afterwards (by anyone in this process) costs a
    /// minor fault, and the next snapshot of the same allocations copies only the pages written
    /// since instead of all of them, and starts following at no cost.
    pub fn following(&self) -> Option<u64> {
        self.source.followed_bytes()
    }

    /// [`plan`](Snapshotter::plan) then [`take`](Snapshotter::take).
    pub fn snapshot(&self, filter: &Filter) -> Result<Snapshot, SnapshotError> {
        self.take(self.plan(filter)?)
    }

    /// Free the store kept for reuse, if any, and stop following a footprint still followed
    /// (see [`stop_following`](Snapshotter::stop_following)).
    pub fn release_cached_store(&self) {
        self.stop_following();
        self.source.release_cached();
    }

    /// The auto rule: small footprints restore in full, and so do device shadows when the
    /// device has no hash kernel and the memory is not host-visible (hashing would then drag
    /// every byte over the host link while a full restore stays on the device); everything
    /// else learns a write set.
    fn mode_for(
        &self,
        strategy: RestoreStrategy,
        bytes: u64,
        tier: StoreTier,
        caps: Capabilities,
        host_access: bool,
    ) -> Mode {
        match strategy {
            RestoreStrategy::Full => Mode::Full,
            RestoreStrategy::Hash => Mode::Hash,
            RestoreStrategy::Writeset => Mode::Writeset,
            RestoreStrategy::WritesetUnverified => Mode::WritesetUnverified,
            RestoreStrategy::Tracked => Mode::Tracked,
            RestoreStrategy::Auto => {
                let costly_hash = tier == StoreTier::Device && !caps.device_hash && !host_access;
                if bytes < AUTO_FULL_BELOW_BYTES || costly_hash {
                    Mode::Full
                } else {
                    Mode::Adaptive
                }
            }
        }
    }
}

impl Snapshot {
    /// What taking the snapshot did.
    pub fn report(&self) -> &SnapshotReport {
        &self.report
    }

    /// The regions held, sorted by base.
    pub fn regions(&self) -> &[Region] {
        &self.layout.regions
    }

    /// Bytes held.
    pub fn bytes(&self) -> u64 {
        self.layout.bytes
    }

    /// The tier the bytes are stored in.
    pub fn tier(&self) -> StoreTier {
        self.report.tier
    }

    /// The chunk size of hashing and partial restores.
    pub fn chunk_size(&self) -> u64 {
        self.layout.chunk_size
    }

    /// Chunks in the learned write set, once a hash pass has learned it.
    pub fn learned_chunks(&self) -> Option<u64> {
        self.learned.as_ref().map(|set| set.count)
    }

    fn set_chunks(&self) -> u64 {
        self.learned.as_ref().map_or(0, |set| set.count)
    }

    /// Auto took this snapshot without hashes: expecting few restores, or to follow writes.
    /// Once a replay has run past the restores expected, and a restore is requested that may
    /// not be the last, the replay is assumed to go on for at least as many restores again as
    /// it has done; once following writes stopped short of the restores planned, the restores
    /// left are ahead. When hashing the store (its bytes are the snapshot's) is repaid over
    /// those, that restore hashes it first (see `hash_store`), and from it on auto chooses
    /// among the verified strategies as if the snapshot had hashed (otherwise every restore
    /// left would be a full one: in `kreplay bench` on the 2-core host, 10% of 256 MiB written,
    /// other chunks each pass, 38 passes, two first dispatches in six stopped following after
    /// their first restore and restored in full from then on, and first dispatches cost 1.31
    /// times hash restores' in all). A store on the device is left alone (its bytes are not the
    /// host's to hash).
    fn store_hash_due(&self, req: &RestoreRequest) -> bool {
        let eligible = self.mode == Mode::Adaptive
            && self.tracking.is_none()
            && !self.hashed
            && !req.may_be_final
            && self.store.device_addr().is_none();
        let Some(expected) = self.expected_restores.filter(|_| eligible) else {
            return false;
        };
        let done = self.stats.restores;
        let ahead = if done >= expected {
            done + 1
        } else if self.stopped_following {
            expected - done
        } else {
            return false;
        };
        let chunks = self.layout.chunks() as u64;
        let rates = self.memory.lock().rates;
        store_hashes_pay(
            &rates,
            &self.stats,
            self.set_chunks(),
            ahead,
            chunks,
            self.layout.chunk_size,
        )
    }

    /// Gives the snapshot's hashes a new name: a device may keep a copy of them by it
    /// ([`crate::VerifiedRestore::snapshot_id`]), so hashes that changed must not keep the old.
    pub(crate) fn rename(&mut self) {
        self.id = NEXT_SNAPSHOT_ID.fetch_add(1, Ordering::Relaxed);
    }

    /// Hash every chunk of the store: the hashes the snapshot did not take. Without memory for
    /// them nothing changes (restores stay full).
    fn hash_store(&mut self) {
        let Ok(mut hashes) = try_vec(self.layout.chunks(), 0u64) else {
            return;
        };
        let hash_start = Instant::now();
        let len = self.layout.store_len as usize;
        let bytes = hash_store(&self.layout, &self.store.bytes()[..len], &mut hashes);
        self.memory
            .lock()
            .rates
            .record_hash(bytes, hash_start.elapsed());
        self.hashes = hashes;
        self.rename();
        self.hashed = true;
        self.expected_restores = None;
    }

    /// Auto stops following writes once a tracked restore, with the faults its pass paid,
    /// cost more than restoring without following would (see `restore_unfollowed_ns`: a full
    /// restore of the footprint at the measured copy rate, or hashing the store and restoring
    /// the verified way over the restores the replay still plans; before any copy was
    /// measured, once a pass wrote a quarter of the footprint): the passes write too many
    /// pages for tracking to pay. Later restores are full ones, unless hashing the store pays
    /// over the restores the replay still plans (see `store_hash_due`). Weighed against a full
    /// restore only, following writes that cost less than a copy but more than hash restores
    /// went on for whole replays (in `kreplay bench`, 10% of 256 MiB written, other chunks
    /// each pass: 0.72 of N full restores against 0.57 for hash restores).
    fn stop_tracking_if_dear(&mut self, restore: std::time::Duration) {
        let Some(t) = &self.tracking else {
            return;
        };
        // Where the passes write what the pass before wrote, only the first two passes fault
        // on every page written (and one after each revisit): judged by what the passes after
        // them pay, a kernel whose writes repeat is not stopped for its first pass's faults.
        let repeat = self.stats.repeat.unwrap_or(self.repeat);
        let faults = match track::faulting_share(repeat) {
            Some(fresh) => t.fault.mul_f64(t.last_pages.unwrap_or(0) as f64 * fresh),
            None => t.last_faults(),
        };
        let tracked = (restore + faults).as_nanos() as f64;
        // The restores still planned, where the store could be hashed for them.
        let left = self
            .expected_restores
            .filter(|_| self.store.device_addr().is_none())
            .map(|expected| expected.saturating_sub(self.stats.restores));
        let unfollowed = restore_unfollowed_ns(
            &self.memory.lock().rates,
            &self.stats,
            self.set_chunks(),
            (
                self.layout.bytes,
                self.layout.chunks() as u64,
                self.layout.chunk_size,
            ),
            left,
        );
        let dear = match unfollowed {
            Some(unfollowed) => tracked > unfollowed,
            // No copy measured yet: a first store to a followed page costs several copies of
            // the page (a fault against a memcpy), so passes that write a quarter of the
            // footprint or more are not worth following.
            None => t.last_written_bytes().saturating_mul(4) >= self.layout.bytes,
        };
        if dear {
            end_tracking(&mut self.tracking, &self.memory);
            self.stopped_following = true;
        }
    }

    fn step(&self, req: &RestoreRequest) -> (Step, RestoreStrategy) {
        let predict = self.set_chunks() > 0;
        // Only `tracked` and auto ever follow writes.
        if self.tracking.is_some() {
            return (Step::Tracked, RestoreStrategy::Tracked);
        }
        match self.mode {
            Mode::Full | Mode::Tracked => (Step::Full, RestoreStrategy::Full),
            Mode::Hash => (
                Step::Detect {
                    learn: false,
                    predict: false,
                },
                RestoreStrategy::Hash,
            ),
            // Verified write sets: the set is written from the store and every other chunk is
            // hashed, so what the set does not cover is found and written back (a repair), and
            // every pass starts from the snapshot.
            Mode::Writeset => (
                Step::Detect {
                    learn: true,
                    predict,
                },
                RestoreStrategy::Writeset,
            ),
            Mode::Adaptive => {
                if !self.hashed && !self.store_hash_due(req) {
                    return (Step::Full, RestoreStrategy::Full);
                }
                let learn = |predict| {
                    (
                        Step::Detect {
                            learn: true,
                            predict,
                        },
                        RestoreStrategy::Writeset,
                    )
                };
                if self.stats.full_streak >= PROBE_EVERY {
                    return learn(false);
                }
                let rates = self.memory.lock().rates;
                let all = self.layout.chunks() as u64;
                match estimate(
                    &rates,
                    &self.stats,
                    all,
                    self.set_chunks(),
                    self.layout.chunk_size,
                ) {
                    // Nothing known about this kernel yet: learn.
                    None => learn(predict),
                    // Full is cheapest, or close enough to it that a stale copy rate cannot
                    // tell (the full restore then measures a copy again).
                    Some(c)
                        if full_is_cheaper(&c, self.stats.full_streak == 0)
                            || refresh_copy_rate(&rates, &c) =>
                    {
                        (Step::Full, RestoreStrategy::Full)
                    }
                    Some(c) => learn(predict && c.writeset <= c.hash),
                }
            }
            Mode::WritesetUnverified => {
                let due =
                    self.verify_every > 0 && self.restores_since_hash + 1 >= self.verify_every;
                let step = if self.learned.is_none() || self.needs_verify || req.may_be_final || due
                {
                    Step::Detect {
                        learn: true,
                        predict: false,
                    }
                } else {
                    Step::Learned
                };
                (step, RestoreStrategy::Writeset)
            }
        }
    }

    /// What [`restore`](Snapshot::restore) would do for `req`, before doing it.
    pub fn plan_restore(&self, req: &RestoreRequest) -> RestorePlan {
        let (step, strategy) = self.step(req);
        self.plan_for(step, strategy)
    }

    fn plan_for(&self, step: Step, strategy: RestoreStrategy) -> RestorePlan {
        let all = self.layout.bytes;
        let set_bytes = self.learned.as_ref().map_or(0, |set| set.bytes);
        let (bytes_planned, bytes_to_hash) = match step {
            Step::Full => (all, 0),
            Step::Learned => (set_bytes, 0),
            Step::Detect { predict: false, .. } => (all, all),
            Step::Detect { predict: true, .. } => (all, all - set_bytes),
            Step::Tracked => (all, 0),
        };
        RestorePlan {
            strategy,
            verify: matches!(step, Step::Detect { .. }),
            bytes_planned,
            bytes_to_hash,
        }
    }

    /// Write the snapshot back so device memory holds the snapshotted bytes again, writing only
    /// what the strategy finds changed. Regions freed (or reused by a newer allocation) since
    /// the snapshot are skipped, never written, and listed in the report. Frees wait until the
    /// restore is done.
    ///
    /// A hash pass that cannot read device memory falls back to a full restore. An error means
    /// device memory may now differ from the snapshot: it says how many bytes were not restored.
    pub fn restore(&mut self, req: &RestoreRequest) -> Result<RestoreReport, RestoreError> {
        let start = Instant::now();
        let pass_time = self.passes.pass_time(start);
        // Decided (with the step) before the store is hashed, as `plan_restore` decided it.
        let hash_store_now = self.store_hash_due(req);
        let (mut step, mut strategy) = self.step(req);
        if hash_store_now {
            self.hash_store();
            if !self.hashed {
                // No memory for the hashes: this restore writes everything after all.
                (step, strategy) = (Step::Full, RestoreStrategy::Full);
            }
        }
        self.stats.restores += 1;
        let plan = self.plan_for(step, strategy);
        let device: &dyn DeviceMemory = &*self.source.device;
        let layout = &self.layout;

        let pinned = self.inventory.pin(self.fence.as_deref());
        let live: Vec<bool> = layout.regions.iter().map(|r| pinned.is_live(r)).collect();
        let skipped: Vec<Region> = layout
            .regions
            .iter()
            .zip(&live)
            .filter(|(_, l)| !**l)
            .map(|(r, _)| *r)
            .collect();
        let wins = windows(device, layout, &live);
        let live_chunks: usize = (0..layout.regions.len())
            .filter(|&r| live[r])
            .map(|r| layout.region_chunks(r))
            .sum();
        let mut report = RestoreReport {
            bytes_planned: plan.bytes_planned,
            bytes_moved: 0,
            bytes_hashed: 0,
            regions: (layout.regions.len() - skipped.len()) as u64,
            regions_skipped: skipped.len() as u64,
            skipped,
            chunks: live_chunks as u64,
            chunks_restored: 0,
            repaired_chunks: 0,
            tier: self.report.tier,
            strategy,
            verified: false,
            unverified: matches!(step, Step::Learned),
            bytes_left_open: 0,
            elapsed: Default::default(),
        };

        let mut pieces: Vec<Piece> = Vec::new();
        // Whether the device's verified restore already wrote `pieces` back (or, when set, the
        // bytes and chunks of the learned set it wrote).
        let mut written = false;
        let mut written_totals: Option<(u64, u64)> = None;
        // Bytes the hash pass itself wrote back (see `hash_and_restore`).
        let mut fused_writes: Option<u64> = None;
        let skipped_none = live.iter().all(|l| *l);
        if let Step::Detect { learn, predict } = step {
            // The set is taken out while its flags steer the hash pass, and put back below.
            let predicted = if predict { self.learned.take() } else { None };
            let skip = predicted.as_ref().map(|set| &set.chunks[..]);
            let hash_start = Instant::now();
            // A device that hashes, compares and writes back in one operation does the whole
            // restore (the learned set included) and reports what it found changed.
            let on_device = if self.caps.verified_restore {
                restore_on_device(
                    device,
                    layout,
                    &live,
                    &self.store,
                    skip,
                    (&self.hashes, self.id),
                    &mut self.verify_ranges,
                )
            } else {
                Err(CopyError::Unsupported)
            };
            let hashed = match on_device {
                Ok(found) => {
                    written = true;
                    Ok(found)
                }
                // Some chunks may have been written: the full restore below rewrites all.
                Err(CopyError::Failed { .. }) => Err(()),
                Err(_) => if self.live_hashes.len() == layout.chunks() {
                    Ok(())
                } else {
                    try_vec(layout.chunks(), 0u64)
                        .map(|v| self.live_hashes = v)
                        .map_err(|_| ())
                }
                .and_then(|()| {
                    // Hashing everything through host windows from a snapshot the CPU can read:
                    // changed chunks are written back as soon as they are found.
                    let all_windows =
                        (0..layout.regions.len()).all(|r| !live[r] || wins[r].is_some());
                    let store = (skip.is_none() && !self.caps.device_hash && all_windows)
                        .then(|| store_host_bytes(device, &self.store, layout.store_len))
                        .flatten();
                    match store {
                        Some(store) => {
                            let (bytes, wrote) = hash_and_restore(
                                layout,
                                &live,
                                &wins,
                                store,
                                &self.hashes,
                                &mut self.live_hashes,
                            );
                            written = true;
                            fused_writes = Some(wrote);
                            Ok(bytes)
                        }
                        None => hash_live(
                            device,
                            self.caps,
                            layout,
                            &live,
                            &wins,
                            &mut self.live_hashes,
                            skip,
                        )
                        .map_err(|_| ()),
                    }
                })
                .map(|bytes| {
                    let changed =
                        changed_chunks(layout, &live, &self.hashes, &self.live_hashes, skip)
                            .collect();
                    (bytes, changed)
                }),
            };
            match hashed {
                Ok((bytes, changed)) => {
                    let set_chunks = predicted.as_ref().map(|set| set.count);
                    // Hashed around a learned set (not a whole pass) where it held any chunk.
                    let predicting_now = set_chunks.is_some_and(|n| n > 0);
                    if let Some(repeat) = self
                        .repeats
                        .measure(&changed, set_chunks.filter(|_| predict))
                    {
                        self.stats.repeat = Some(repeat);
                    }
                    if bytes > 0 {
                        let mut memory = self.memory.lock();
                        let mut elapsed = hash_start.elapsed();
                        if let Some(wrote) = fused_writes {
                            // The hash pass wrote the changed chunks back as it went: what a
                            // write-back of them costs is not hashing (at most half the pass is
                            // taken for it, so one slow write-back cannot make hashing look
                            // free).
                            let writes = memory.rates.scattered_per_byte(wrote) * wrote as f64;
                            elapsed = elapsed.saturating_sub(
                                Duration::from_nanos(writes as u64).min(elapsed / 2),
                            );
                        }
                        if predicting_now {
                            memory.rates.record_partial_hash(bytes, elapsed);
                        } else {
                            memory.rates.record_hash(bytes, elapsed);
                        }
                    }
                    report.bytes_hashed = bytes;
                    report.verified = true;
                    // Written by the device already, nothing to learn: only the totals are
                    // needed, not a list of pieces (at 1% of 32 GiB, 5 Ki of them built and
                    // dropped again, 30-40 us of host time in series with the GPU).
                    let found = if written && !learn && predicted.is_none() {
                        let (mut bytes, mut chunks) = (0, 0);
                        layout.for_runs_of(&live, changed, |p| {
                            bytes += layout.piece_span(&p).1;
                            chunks += p.count as u64;
                        });
                        written_totals = Some((bytes, chunks));
                        Vec::new()
                    } else {
                        layout.runs_of(&live, changed)
                    };
                    let dirty: u64 = written_totals.map_or_else(
                        || found.iter().map(|p| p.count as u64).sum(),
                        |(_, chunks)| chunks,
                    );
                    let predicting = predicted.is_some();
                    if predicted.is_some() {
                        self.learned = predicted;
                    }
                    if predicting {
                        self.stats.missed_chunks = Some(dirty);
                    } else {
                        self.stats.dirty_chunks = Some(dirty);
                    }
                    self.stats.full_streak = 0;
                    self.restores_since_hash = 0;
                    self.needs_verify = false;
                    if learn {
                        match &mut self.learned {
                            // Chunks changed outside the learned set: repaired by this restore.
                            Some(set) => report.repaired_chunks = set.add(layout, &found),
                            None => {
                                self.learned = WriteSet::new(layout);
                                if let Some(set) = &mut self.learned {
                                    set.add(layout, &found);
                                }
                            }
                        }
                        // No memory for the set: keep detecting on every restore.
                        self.needs_verify = self.learned.is_none();
                    }
                    pieces = match (&self.learned, predicting) {
                        // Written by the device already, every region live: the set's own
                        // totals are what was written, no need to cut it into pieces again.
                        (Some(set), true) if written && skipped_none => {
                            written_totals = Some((set.bytes, set.count));
                            Vec::new()
                        }
                        // The set (which now holds every changed chunk too) is written whole.
                        (Some(set), true) => layout.runs_of(&live, marked_indices(&set.chunks)),
                        _ => found,
                    };
                }
                Err(()) => {
                    written = false;
                    if predicted.is_some() {
                        self.learned = predicted;
                    }
                    // Unknown what changed: write everything back.
                    step = Step::Full;
                    report.strategy = RestoreStrategy::Full;
                }
            }
        }
        if step == Step::Tracked {
            match self
                .tracking
                .as_mut()
                .and_then(|t| t.changed(layout, &live, &wins))
            {
                Some(changed) => {
                    report.verified = true;
                    self.stats.dirty_chunks = Some(changed.len() as u64);
                    if let Some(repeat) = self.tracking.as_ref().and_then(|t| t.last_repeat) {
                        self.stats.repeat = Some(repeat);
                    }
                    self.stats.full_streak = 0;
                    pieces = layout.runs_of(&live, changed);
                }
                None => {
                    // The tracker cannot say what was written: write everything back, and
                    // trust it no more.
                    end_tracking(&mut self.tracking, &self.memory);
                    step = Step::Full;
                    report.strategy = RestoreStrategy::Full;
                }
            }
        }
        match step {
            Step::Tracked => {}
            Step::Full => {
                // A device shadow is copied region by region; the host tiers copy pieces in
                // parallel.
                pieces = if self.store.device_addr().is_some() {
                    layout.whole_regions(&live)
                } else {
                    layout.full_pieces(&live)
                };
                if self.mode == Mode::Adaptive {
                    self.stats.full_streak += 1;
                }
            }
            Step::Learned => {
                if let Some(set) = &self.learned {
                    pieces = layout.runs_of(&live, marked_indices(&set.chunks));
                }
                self.restores_since_hash += 1;
            }
            Step::Detect { .. } => {}
        }

        let write_start = Instant::now();
        let mut outcome = if let Some((bytes, chunks)) = written_totals.filter(|_| written) {
            WriteOutcome::totals(bytes, chunks)
        } else if written {
            WriteOutcome::written(layout, &pieces)
        } else {
            write_back(device, self.caps, layout, &wins, &self.store, &pieces)
        };
        // Folded changes the store could not take go on top of what it brought back.
        crate::fold::apply_overlay(device, layout, &live, &self.overlay, &mut outcome);
        // The write-back alone: a tracked restore protects the pages again below, which is no
        // part of what a write-back of these bytes costs (counted in, it raised every rate
        // the measurements share, copies' and hash passes' too, by up to half).
        let write_elapsed = write_start.elapsed();
        if step == Step::Tracked {
            // Written back: follow those bytes again. A tracker that refuses, or a write-back
            // that failed, leaves pages unfollowed: no more tracked restores.
            let rearmed = outcome.error.is_none()
                && self
                    .tracking
                    .as_mut()
                    .is_some_and(|t| t.rearm(layout, &wins, &pieces, true));
            if !rearmed {
                end_tracking(&mut self.tracking, &self.memory);
            }
            report.bytes_left_open = self.tracking.as_ref().map_or(0, Tracking::open_bytes);
        }
        if !matches!(step, Step::Detect { .. }) {
            // What this restore found changed, chunk by chunk, is not known to the next.
            self.repeats.forget();
        }
        drop(pinned);
        // A tracked restore's write-back is not taken as a sample of the machine's speed: the
        // rates are relative to a level every sample moves, and the chunks of the pages a pass
        // wrote (scattered or one run, many or few) cost per byte what their shape does. While
        // auto followed writes every pass, such samples were the only ones, and moved the level
        // by the shape of the writes: in `kreplay bench` after the contiguous cells, a copy
        // was priced at nearly twice what it cost, and following writes that cost more than
        // hash restores looked cheaper. Tracked restores price their write-backs themselves
        // (`track::TrackPrices::written_ns`).
        if outcome.error.is_none() && !written && step != Step::Tracked {
            let mut memory = self.memory.lock();
            if measures_copy_rate(step) {
                memory.rates.record_copy(outcome.bytes, write_elapsed);
            } else {
                memory.rates.record_scattered(outcome.bytes, write_elapsed);
            }
        }
        report.bytes_moved = outcome.bytes;
        report.chunks_restored = outcome.chunks;
        report.elapsed = start.elapsed();
        if step == Step::Tracked {
            if let Some(t) = &self.tracking {
                let fault = pass_time.and_then(|time| self.passes.pass(time, t.last_fresh_pages()));
                let mut memory = self.memory.lock();
                memory.track.record_restore(t, report.elapsed);
                if let Some(fault) = fault {
                    memory.track.record_fault(fault);
                }
            }
            if self.mode == Mode::Adaptive {
                self.stop_tracking_if_dear(report.elapsed);
            }
        }
        // The next pass starts now; timed only while writes are followed.
        self.passes.restart(self.tracking.is_some());
        match outcome.error {
            None => Ok(report),
            Some(error) => {
                self.needs_verify = true;
                Err(RestoreError {
                    error,
                    bytes_lost: outcome.lost_bytes,
                    chunks_lost: outcome.lost_chunks,
                    report: Box::new(report),
                })
            }
        }
    }
}

/// The snapshot's bytes as the CPU can read them: a host or file store's own memory, or a device
/// shadow's host window where the device offers one for all of it. `None` when the CPU cannot
/// read the snapshot directly. `bytes` is the store's length as laid out
/// ([`Layout::store_len`]: the regions with the padding between them), which store ranges
/// index into, not the regions' bytes alone.
fn store_host_bytes<'a>(
    device: &dyn DeviceMemory,
    store: &'a Store,
    bytes: u64,
) -> Option<&'a [u8]> {
    match store.device_addr() {
        None => Some(store.bytes()).filter(|b| b.len() as u64 >= bytes),
        Some(shadow) => {
            let window = device
                .host_window(shadow, bytes)
                .filter(|w| w.len() as u64 >= bytes)?;
            // SAFETY: the window covers `bytes` bytes of the shadow, which the store owns and
            // frees only when dropped (after `'a`); nothing but this snapshot writes a shadow,
            // and the caller only reads it while the snapshot is borrowed.
            Some(unsafe { std::slice::from_raw_parts(window.as_ptr(), bytes as usize) })
        }
    }
}

/// Stop following a footprint kept followed after its replay (timed, as [`end_tracking`]), and
/// offer its store back for reuse.
fn end_followed(followed: Followed, source: &StoreSource, memory: &SharedMemory) {
    let Followed {
        tracking, store, ..
    } = followed;
    end_tracking(&mut Some(tracking), memory);
    source.give_back(store);
}

/// Stop following writes (the kernel un-protects every page followed), timing it for the
/// prices of later decisions.
fn end_tracking(tracking: &mut Option<Tracking>, memory: &SharedMemory) {
    if let Some(t) = tracking.take() {
        let pages = t.followed_pages();
        let start = Instant::now();
        drop(t);
        memory.lock().track.record_end(pages, start.elapsed());
    }
}

/// Whether a restore's write-back measures the machine's copy rate: only a full one, a copy of
/// the whole footprint as a snapshot's is. Partial write-backs copy scattered chunks with
/// ordinary stores (under the streaming threshold) and cost more per byte; counted as copies,
/// they made a full restore look dearer than it is and hashing look as if it paid. They are
/// measured on their own, as the cost of writing back changed chunks.
fn measures_copy_rate(step: Step) -> bool {
    matches!(step, Step::Full)
}

/// Global indices of the chunks of live regions whose live hash differs from the snapshot's,
/// in order, leaving out the chunks `skip` marks (not hashed).
/// How many of the chunks a restore finds changed the restore before it found changed too,
/// measured by restores that hash: what tells auto whether a kernel's passes write the same
/// places each time (see `track::replay_costs`), where its writes were not followed.
#[derive(Debug, Default)]
struct Repeats {
    /// The chunks (global indices, ascending) the latest restore found changed, where it hashed
    /// every chunk; `None` after any other restore.
    last: Option<Vec<usize>>,
}

impl Repeats {
    /// Take in what a hashing restore found changed (`changed`, ascending; with `predicted`,
    /// the chunks in the learned set it wrote unread, only those outside the set) and return
    /// the share of this restore's changed chunks the restore before found changed too,
    /// where that can be told: after a restore that hashed every chunk, exactly by comparing
    /// the two; for a restore that wrote a set of `predicted` chunks unread, only where that
    /// set is what the restore before found (the pass is taken to change as many chunks as
    /// that one did, and the set's chunks as changed again).
    fn measure(&mut self, changed: &[usize], predicted: Option<u64>) -> Option<f64> {
        let last = self.last.take();
        match predicted {
            Some(set) => {
                let before = last.filter(|l| l.len() as u64 == set && set > 0)?.len();
                Some(1.0 - (changed.len() as f64 / before as f64).min(1.0))
            }
            None => {
                let share = last.filter(|_| !changed.is_empty()).map(|before| {
                    let (mut i, mut both) = (0, 0usize);
                    for &c in changed {
                        while i < before.len() && before[i] < c {
                            i += 1;
                        }
                        both += usize::from(before.get(i) == Some(&c));
                    }
                    both as f64 / changed.len() as f64
                });
                self.last = Some(changed.to_vec());
                share
            }
        }
    }

    /// Nothing known of what the latest restore found changed, chunk by chunk.
    fn forget(&mut self) {
        self.last = None;
    }
}

fn changed_chunks<'a>(
    layout: &'a Layout,
    live: &'a [bool],
    snap: &'a [u64],
    now: &'a [u64],
    skip: Option<&'a [bool]>,
) -> impl Iterator<Item = usize> + 'a {
    (0..layout.regions.len())
        .filter(move |&r| live[r])
        .flat_map(move |r| {
            let (lo, hi) = (layout.first_chunk[r], layout.first_chunk[r + 1]);
            snap[lo..hi]
                .iter()
                .zip(&now[lo..hi])
                .enumerate()
                .filter(|(_, (a, b))| a != b)
                .map(move |(i, _)| lo + i)
        })
        .filter(move |&c| skip.is_none_or(|set| !set[c]))
}

/// The learned write set: the chunks restores write without hashing.
#[derive(Debug)]
struct WriteSet {
    /// One flag per chunk of the layout.
    chunks: Vec<bool>,
    /// Flags set.
    count: u64,
    /// Bytes of the flagged chunks.
    bytes: u64,
}

impl WriteSet {
    /// An empty set for `layout`, or `None` when there is no memory for it.
    fn new(layout: &Layout) -> Option<Self> {
        Some(WriteSet {
            chunks: try_vec(layout.chunks(), false).ok()?,
            count: 0,
            bytes: 0,
        })
    }

    /// The set of the flagged chunks of `layout` (`None` when `flags` does not match it).
    fn from_flags(layout: &Layout, flags: Vec<bool>) -> Option<Self> {
        if flags.len() != layout.chunks() {
            return None;
        }
        let mut count = 0;
        let mut bytes = 0;
        for r in 0..layout.regions.len() {
            for k in 0..layout.region_chunks(r) {
                if flags[layout.first_chunk[r] + k] {
                    count += 1;
                    bytes += layout.span(r, k, 1).1;
                }
            }
        }
        Some(WriteSet {
            chunks: flags,
            count,
            bytes,
        })
    }

    /// Add the chunks of `pieces`; returns how many were not in the set yet.
    fn add(&mut self, layout: &Layout, pieces: &[Piece]) -> u64 {
        let mut added = 0;
        for p in pieces {
            for (k, c) in (p.first..p.first + p.count).zip(layout.global(p)) {
                if !self.chunks[c] {
                    self.chunks[c] = true;
                    self.bytes += layout.span(p.region, k, 1).1;
                    added += 1;
                }
            }
        }
        self.count += added;
        added
    }
}

impl Drop for Snapshot {
    fn drop(&mut self) {
        // Still following every region, restored without a failure since: keep following them
        // with the store (see `Followed`); an earlier footprint kept is stopped.
        let keep = self.keep_following
            && !self.needs_verify
            && self.layout.regions.iter().all(|r| r.generation != 0);
        match self.tracking.take() {
            Some(tracking) if keep && track::may_stay_followed(Some(&tracking)) => {
                let followed = Followed {
                    regions: self.layout.regions.clone(),
                    chunk_size: self.layout.chunk_size,
                    tracking,
                    store: self.store.take(),
                };
                if let Some(earlier) = self.source.keep_followed(followed) {
                    end_followed(earlier, &self.source, &self.memory);
                }
            }
            mut other => end_tracking(&mut other, &self.memory),
        }
        if let Some(key) = self.key {
            let mut learned = std::mem::take(&mut self.stats);
            learned.write_set = match self.learned.take() {
                Some(set) => set.chunks,
                None => vec![false; self.layout.chunks()],
            };
            let chunks = self.layout.chunks();
            let mut memory = self.memory.lock();
            memory.typical_restores = Some(learned.restores);
            if let Some(dirty) = learned.dirty_chunks.filter(|_| chunks > 0) {
                memory.typical_dirty = Some(dirty as f64 / chunks as f64);
            }
            if learned.repeat.is_some() {
                memory.typical_repeat = learned.repeat;
            }
            memory.put(key, learned);
        }
        if self.keep_store {
            self.source.give_back(self.store.take());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repeated_writes_are_measured_between_restores_that_hashed_every_chunk_or_a_set_learned_by_one()
     {
        let mut r = Repeats::default();
        // Nothing before the first: unknown.
        assert_eq!(r.measure(&[1, 5, 9, 12], None), None);
        // Three of four found again.
        assert_eq!(r.measure(&[1, 5, 7, 12], None), Some(0.75));
        // A restore that wrote the set of the four chunks the one before found, unread, and
        // found one more changed outside it: one of four moved.
        assert_eq!(r.measure(&[30], Some(4)), Some(0.75));
        // After it nothing is known chunk by chunk, nor after a restore that told nothing.
        assert_eq!(r.measure(&[2], None), None);
        r.forget();
        assert_eq!(r.measure(&[2], None), None);
        // A set that is not what the restore before found (carried from earlier dispatches)
        // says nothing of the pass before.
        assert_eq!(r.measure(&[], Some(9)), None);
        // Nothing changed: no share.
        assert_eq!(r.measure(&[], None), None);
    }

    #[test]
    fn only_full_restores_measure_the_copy_rate() {
        assert!(measures_copy_rate(Step::Full));
        for step in [
            Step::Learned,
            Step::Detect {
                learn: true,
                predict: true,
            },
            Step::Detect {
                learn: false,
                predict: false,
            },
        ] {
            assert!(!measures_copy_rate(step), "{step:?}");
        }
    }
}
