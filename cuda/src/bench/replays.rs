//! Whole replays on the GPU (`kreplay bench --backend cuda`, after the restore rows): what a
//! replay of N passes costs in memory work, as a launch replayed by the injected backend pays
//! it, beside N full restores of the same tier.
//!
//! A replay's cost is its snapshot, every one of its N - 1 restores (the first restores that
//! learn a write set and the verifications before a pass that may be the last included) and
//! the end of its snapshot; the passes themselves (`x += 1` over the written fraction) are the
//! program's work and are not counted. Each cell (footprint, tier, N, written fraction,
//! strategy) replays a sequence of [`DISPATCHES`] dispatches of one kernel over the same
//! memory, as a program launching the same kernel again and again: the first has nothing
//! learned about its kernel, the later ones reuse what the earlier ones learned (the snapshot
//! crate keys it by kernel). `auto` is the injected backend's: per dispatch the device's
//! measured choice between full device copies and verified restores on the device
//! ([`crate::choice::detection_for`], fed each dispatch's cost per restore as the backend feeds
//! it), then the snapshot crate's `auto`. Before each dispatch's last pass memory is hashed on
//! the device and compared with the hashes taken before its first (untimed): a replay whose
//! restores left one chunk unlike the snapshot stops the bench with an error.

use std::sync::Arc;
use std::time::{Duration, Instant};

use kreplay_snapshot::{
    Filter, Inventory, RestoreReport, RestoreRequest, RestoreStrategy, SnapshotConfig, Snapshotter,
    StoreTier,
};

use super::{BenchTier, CHUNK, fraction_label, snapshot_as_asked};
use crate::choice::{ChoiceKey, DeviceChoice, per_restore_ns};
use crate::choice::{chosen_strategy, detection_for, hash_on_device_for};
use crate::memory::CudaMemory;

/// Dispatches of the kernel per cell: the first, then three reusing what it learned (the
/// device's measured choice decides a kernel after one launch with full copies and two on the
/// device, so `auto`'s third and fourth dispatches restore the way it measured cheaper).
pub const DISPATCHES: usize = 4;

/// The strategies whole replays are measured with: those of the restore rows, then `auto`.
pub fn replay_strategies(strategies: &[RestoreStrategy]) -> Vec<RestoreStrategy> {
    let mut all: Vec<RestoreStrategy> = strategies.to_vec();
    if !all.contains(&RestoreStrategy::Auto) {
        all.push(RestoreStrategy::Auto);
    }
    all
}

/// What a sequence's restores were.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RestoreCounts {
    /// Full restores.
    pub full: u64,
    /// Hash restores (every chunk hashed, the changed ones written back).
    pub hash: u64,
    /// Verified write-set restores (the set written, every other chunk verified).
    pub writeset: u64,
    /// Restores that wrote a learned set without verifying the rest (opt-in only).
    pub unverified: u64,
}

impl RestoreCounts {
    /// Count one restore by what its report says it was.
    pub fn add(&mut self, r: &RestoreReport) {
        self.add_kind(r.strategy, r.unverified);
    }

    /// Count one restore of `strategy` (as a report names it), `unverified` where it wrote a
    /// learned set without verifying the rest.
    pub fn add_kind(&mut self, strategy: RestoreStrategy, unverified: bool) {
        if unverified {
            self.unverified += 1;
            return;
        }
        match strategy {
            RestoreStrategy::Full => self.full += 1,
            RestoreStrategy::Hash => self.hash += 1,
            _ => self.writeset += 1,
        }
    }
}

impl std::fmt::Display for RestoreCounts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}/{}/{}/{}",
            self.full, self.hash, self.writeset, self.unverified
        )
    }
}

/// One whole-replay cell as measured.
#[derive(Clone, Debug, PartialEq)]
pub struct ReplayMeasured {
    /// Footprint, bytes.
    pub footprint: u64,
    /// Where the snapshots were kept.
    pub tier: BenchTier,
    /// The strategy asked for.
    pub strategy: RestoreStrategy,
    /// The fraction each pass writes.
    pub fraction: f64,
    /// Passes per replay.
    pub passes: u64,
    /// Each dispatch's replay cost, ms, in order.
    pub dispatch_ms: Vec<f64>,
    /// N full restores of this tier and footprint: the best full restore of the restore rows
    /// times N, else N times the tier's copy ceiling (device to device, or pinned host to
    /// device), ms.
    pub n_full_ms: f64,
    /// The restores of every dispatch of the cell.
    pub restores: RestoreCounts,
    /// Dispatches restored with detection on the device (always all but under `auto`).
    pub on_device: usize,
}

impl ReplayMeasured {
    /// The first dispatch's cost, ms.
    pub fn first_ms(&self) -> f64 {
        self.dispatch_ms.first().copied().unwrap_or(f64::NAN)
    }

    /// The median of the later dispatches' costs, ms (NaN without any).
    pub fn later_ms(&self) -> f64 {
        let mut later: Vec<f64> = self.dispatch_ms.iter().skip(1).copied().collect();
        if later.is_empty() {
            return f64::NAN;
        }
        later.sort_by(f64::total_cmp);
        let mid = later.len() / 2;
        if later.len() % 2 == 1 {
            later[mid]
        } else {
            (later[mid - 1] + later[mid]) / 2.0
        }
    }
}

/// What one cell needs of the footprint being measured.
pub(super) struct Rig<'a> {
    /// The tier's device memory (its store kind set up for the tier).
    pub mem: &'a Arc<CudaMemory>,
    /// The tier's snapshotter, shared by every cell as a process shares one (see [`snapshotter`]).
    pub snapshotter: &'a Snapshotter,
    /// The tier as the rows name it.
    pub tier: BenchTier,
    /// Footprint, bytes.
    pub bytes: u64,
    /// One pass: `x += 1` over a fraction of the footprint, waited for.
    pub touch: &'a dyn Fn(f64) -> Result<(), String>,
    /// The footprint's chunk hashes, computed on the device.
    pub hashes: &'a dyn Fn() -> Result<Vec<u64>, String>,
}

/// The snapshotter of a tier's whole replays: configured `auto`, as the injected backend's is
/// by default (each sequence's plan names its strategy), with the default verification rules,
/// its store kept between snapshots. One untimed snapshot allocates that store (pinned host
/// memory for the host tiers), which a process pays once, not per replay.
pub(super) fn snapshotter(
    inventory: &Arc<Inventory>,
    mem: &Arc<CudaMemory>,
    store: StoreTier,
    bytes: u64,
) -> Result<Snapshotter, String> {
    let config = SnapshotConfig::default()
        .with_store(store)
        .with_chunk_size(CHUNK)
        .with_max_bytes(Some(bytes * 2));
    let snapshotter =
        Snapshotter::new(inventory.clone(), mem.clone(), config).map_err(|e| e.to_string())?;
    drop(
        snapshotter
            .snapshot(&Filter::for_replay(0))
            .map_err(|e| e.to_string())?,
    );
    Ok(snapshotter)
}

/// Replays [`DISPATCHES`] dispatches of kernel `kernel` in `passes` passes each, writing
/// `fraction` every pass, under `strategy`; returns each dispatch's cost (snapshot, restores,
/// the snapshot's end), the restores' kinds and how many dispatches detected on the device.
/// `choice` is the device's measured choice, kept across cells as a process keeps it.
pub(super) fn replay_sequence(
    rig: &Rig<'_>,
    choice: &mut DeviceChoice,
    strategy: RestoreStrategy,
    fraction: f64,
    passes: u64,
    kernel: u64,
) -> Result<(Vec<f64>, RestoreCounts, usize), String> {
    let snapshotter = rig.snapshotter;
    let mut counts = RestoreCounts::default();
    let mut on_device = 0;
    let mut times = Vec::with_capacity(DISPATCHES);
    let label = fraction_label(fraction);
    for dispatch in 0..DISPATCHES {
        let before = (rig.hashes)()?;
        // As the injected backend does: `auto` asks the device's measured choice, every other
        // strategy detects on the device.
        let chosen = (strategy == RestoreStrategy::Auto).then(|| {
            let key = ChoiceKey::new(kernel as usize, rig.bytes);
            (key, detection_for(choice, key, rig.bytes, true))
        });
        let on = chosen.map_or(hash_on_device_for(strategy, rig.bytes), |(_, on)| on);
        rig.mem.set_hash_on_device(on);
        on_device += usize::from(on);
        let plan = snapshotter
            .plan(&Filter::for_replay(0))
            .map_err(|e| e.to_string())?
            .with_planned_restores(Some(passes - 1))
            .with_strategy(match chosen {
                Some((_, on)) => chosen_strategy(on),
                None => Some(strategy),
            });
        let start = Instant::now();
        let mut snapshot = snapshotter
            .take_for_kernel(plan, kernel)
            .map_err(|e| e.to_string())?;
        let snapshot_time = start.elapsed();
        let r = snapshot.report();
        snapshot_as_asked(rig.tier, rig.bytes, r.bytes_moved, r.tier, r.pinned)?;
        let mut restore_time = Duration::ZERO;
        for pass in 0..passes {
            (rig.touch)(fraction)?;
            if pass + 1 == passes {
                break;
            }
            let start = Instant::now();
            let report = snapshot
                .restore(&RestoreRequest {
                    next_pass: pass + 1,
                    may_be_final: pass + 2 == passes,
                })
                .map_err(|e| e.to_string())?;
            restore_time += start.elapsed();
            counts.add(&report);
            if pass + 2 == passes {
                let now = (rig.hashes)()?;
                let wrong = now.iter().zip(&before).filter(|(a, b)| a != b).count();
                if wrong > 0 || now.len() != before.len() {
                    return Err(format!(
                        "{} GiB {} {strategy} {label} written, {passes} passes, dispatch \
                         {dispatch}: before the last pass {wrong} chunks differ from the snapshot",
                        rig.bytes as f64 / (1u64 << 30) as f64,
                        rig.tier.as_str(),
                    ));
                }
            }
        }
        let start = Instant::now();
        drop(snapshot);
        let total = snapshot_time + restore_time + start.elapsed();
        if let Some((key, on)) = chosen
            && let Some(ns) = per_restore_ns(
                snapshot_time.as_nanos() as u64,
                restore_time.as_nanos() as u64,
                (passes - 1) as usize,
            )
        {
            choice.record(key, on, ns);
        }
        times.push(total.as_secs_f64() * 1e3);
    }
    rig.mem.set_hash_on_device(true);
    Ok((times, counts, on_device))
}

/// Every whole-replay cell of one footprint and tier: for each N of `config.passes`, each
/// strategy of [`replay_strategies`] and each written fraction, one sequence of
/// [`DISPATCHES`] dispatches of a kernel of its own (`kernel` counts them); `full_ms` is the
/// tier's full restore (or copy ceiling), ms. `emit` sees each cell as it is measured.
pub(super) fn measure(
    rig: &Rig<'_>,
    config: &super::BenchConfig,
    full_ms: f64,
    kernel: &mut u64,
    emit: &mut dyn FnMut(&ReplayMeasured) -> Result<(), String>,
) -> Result<Vec<ReplayMeasured>, String> {
    // One measured choice for the tier's cells, as a process keeps one per device.
    let mut choice = DeviceChoice::default();
    let mut cells = Vec::new();
    for &passes in &config.passes {
        for strategy in replay_strategies(&config.strategies) {
            for &fraction in &config.fractions {
                *kernel += 1;
                let (dispatch_ms, restores, on_device) =
                    replay_sequence(rig, &mut choice, strategy, fraction, passes, *kernel)?;
                let m = ReplayMeasured {
                    footprint: rig.bytes,
                    tier: rig.tier,
                    strategy,
                    fraction,
                    passes,
                    dispatch_ms,
                    n_full_ms: full_ms * passes as f64,
                    restores,
                    on_device,
                };
                emit(&m)?;
                cells.push(m);
            }
        }
    }
    Ok(cells)
}

/// `auto` beside the cheapest verified fixed strategy (full, hash, writeset) of its cell, by
/// the later dispatches' medians: `(auto's ratio, the strategy)`; `None` where the cell lacks
/// `auto` or every verified strategy.
pub fn auto_against_best(cell: &[&ReplayMeasured]) -> Option<(f64, RestoreStrategy)> {
    let auto = cell
        .iter()
        .find(|m| m.strategy == RestoreStrategy::Auto)?
        .later_ms();
    let (best, strategy) = cell
        .iter()
        .filter(|m| {
            matches!(
                m.strategy,
                RestoreStrategy::Full | RestoreStrategy::Hash | RestoreStrategy::Writeset
            )
        })
        .map(|m| (m.later_ms(), m.strategy))
        .min_by(|a, b| a.0.total_cmp(&b.0))?;
    Some((auto / best, strategy))
}

/// The whole replays as a table: per footprint, tier, N and written fraction, each strategy's
/// first and later dispatches (ms and over N full restores) and its restores, then `auto`
/// against the cheapest verified fixed strategy of the cell (shown, not judged: one sequence
/// per cell).
pub fn render(rows: &[ReplayMeasured]) -> String {
    if rows.is_empty() {
        return String::new();
    }
    let mut text = format!(
        "whole replays (snapshot + every restore of an N-pass replay, the passes not counted; \
         {DISPATCHES} dispatches of one kernel per cell: the first, and the median of the later \
         ones reusing what it learned; /N full: over N full restores of the tier; restores \
         full/hash/set/unverified over all dispatches):\n"
    );
    text += &format!(
        "  {:<9} {:<8} {:>3} {:>6}  {:<20} {:>12} {:>8} {:>12} {:>8}  {:>12}  {:<15} {}\n",
        "footprint",
        "tier",
        "N",
        "dirty",
        "strategy",
        "first ms",
        "/N full",
        "later ms",
        "/N full",
        "N full ms",
        "restores",
        "on device"
    );
    let mut cells: Vec<(u64, BenchTier, u64, u64)> = Vec::new();
    for r in rows {
        let key = (r.footprint, r.tier, r.passes, r.fraction.to_bits());
        if !cells.contains(&key) {
            cells.push(key);
        }
    }
    for (footprint, tier, passes, fraction) in cells {
        let cell: Vec<&ReplayMeasured> = rows
            .iter()
            .filter(|r| {
                (r.footprint, r.tier, r.passes, r.fraction.to_bits())
                    == (footprint, tier, passes, fraction)
            })
            .collect();
        for r in &cell {
            text += &format!(
                "  {:<9} {:<8} {:>3} {:>6}  {:<20} {:>12.3} {:>8.3} {:>12.3} {:>8.3}  {:>12.3}  {:<15} {}/{}\n",
                format!("{}GiB", footprint as f64 / (1u64 << 30) as f64),
                tier.as_str(),
                passes,
                fraction_label(r.fraction),
                r.strategy.to_string(),
                r.first_ms(),
                r.first_ms() / r.n_full_ms,
                r.later_ms(),
                r.later_ms() / r.n_full_ms,
                r.n_full_ms,
                r.restores.to_string(),
                r.on_device,
                r.dispatch_ms.len(),
            );
        }
        if let Some((ratio, best)) = auto_against_best(&cell) {
            text += &format!(
                "  {:<9} {:<8} {:>3} {:>6}  auto / best verified fixed ({best}), later dispatches: {ratio:.3}x\n",
                "", "", "", "",
            );
        }
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(strategy: RestoreStrategy, dispatch_ms: &[f64]) -> ReplayMeasured {
        ReplayMeasured {
            footprint: 1 << 30,
            tier: BenchTier::Device,
            strategy,
            fraction: 0.01,
            passes: 38,
            dispatch_ms: dispatch_ms.to_vec(),
            n_full_ms: 19.0,
            restores: RestoreCounts::default(),
            on_device: dispatch_ms.len(),
        }
    }

    #[test]
    fn auto_is_always_among_the_whole_replays_and_only_once() {
        use RestoreStrategy::{Auto, Full, Hash};
        assert_eq!(replay_strategies(&[Full, Hash]), vec![Full, Hash, Auto]);
        assert_eq!(replay_strategies(&[Auto, Full]), vec![Auto, Full]);
    }

    #[test]
    fn the_later_figure_is_the_median_of_every_dispatch_after_the_first() {
        let r = row(RestoreStrategy::Hash, &[50.0, 9.0, 30.0, 10.0]);
        assert_eq!(r.first_ms(), 50.0);
        assert_eq!(r.later_ms(), 10.0);
        let r = row(RestoreStrategy::Hash, &[50.0, 9.0, 30.0, 10.0, 12.0]);
        assert_eq!(r.later_ms(), 11.0);
        assert!(row(RestoreStrategy::Hash, &[50.0]).later_ms().is_nan());
    }

    #[test]
    fn auto_is_set_beside_the_cheapest_verified_fixed_strategy_never_the_unverified_one() {
        use RestoreStrategy::{Auto, Full, Hash, Writeset, WritesetUnverified};
        let rows = [
            row(Full, &[20.0, 20.0, 20.0, 20.0]),
            row(Hash, &[12.0, 10.0, 10.0, 10.0]),
            row(Writeset, &[14.0, 11.0, 11.0, 11.0]),
            row(WritesetUnverified, &[9.0, 1.0, 1.0, 1.0]),
            row(Auto, &[20.0, 12.0, 11.0, 11.0]),
        ];
        let cell: Vec<&ReplayMeasured> = rows.iter().collect();
        let (ratio, best) = auto_against_best(&cell).unwrap();
        assert_eq!(best, Hash);
        assert!((ratio - 1.1).abs() < 1e-9, "{ratio}");
        assert_eq!(auto_against_best(&cell[..4]), None);
        let text = render(&rows);
        assert!(text.contains("auto / best verified fixed (hash), later dispatches: 1.100x"));
        assert_eq!(text.lines().count(), 2 + rows.len() + 1, "{text}");
    }

    #[test]
    fn restores_are_counted_by_what_each_report_says_it_was() {
        let mut c = RestoreCounts::default();
        for (strategy, unverified) in [
            (RestoreStrategy::Full, false),
            (RestoreStrategy::Hash, false),
            (RestoreStrategy::Writeset, false),
            (RestoreStrategy::Writeset, true),
            (RestoreStrategy::Writeset, false),
        ] {
            c.add_kind(strategy, unverified);
        }
        assert_eq!(c.to_string(), "1/1/2/1");
    }
}
