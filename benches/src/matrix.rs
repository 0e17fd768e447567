//! The measurement matrix: snapshot and restore cost against ceilings measured in the same run.

use std::cell::RefCell;
use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::ceiling::{Ceiling, copy_ceiling, read_ceiling};
use crate::device::{HostDevice, HostDeviceOptions};
use crate::paired::{DEFAULT_PAIRED_SAMPLES, HASH_PASS, PairedRatio, interleave};
use crate::replay::{ReplayConfig, ReplayRow};
use crate::targets::HASH_RESTORE_DIRTY;
use crate::workload::ChunkMap;
use kreplay_snapshot::{
    Filter, Inventory, MemoryKind, RestoreRequest, RestoreStrategy, Snapshot, SnapshotConfig,
    Snapshotter, StoreTier,
};

/// What a row measured.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Operation {
    /// Ceiling: the machine's copy rate, the best of several independent copy methods (threads,
    /// block layouts, ordinary and streaming stores) between two host buffers of the
    /// footprint's size (measured before and after the footprint's other rows, the better
    /// kept). See [`crate::copy_ceiling`].
    Memcpy,
    /// Ceiling: the machine's read rate, the best of several independent read methods (idem).
    ReadPass,
    /// Taking a snapshot (copy into the store, plus chunk hashes when the strategy needs them)
    /// into a store kept from an earlier snapshot, as successive replays do.
    Snapshot,
    /// The first snapshot of a snapshotter: the store is allocated and its pages faulted in.
    SnapshotCold,
    /// One steady-state restore after a pass dirtied the given fraction of chunks. A restore
    /// that followed the pass's writes (tracked) also carries what following them cost the
    /// pass: the faults of its first store to each page.
    Restore,
    /// A hash pass over the live memory with nothing to restore (hash strategy, 0% dirty).
    Detect,
}

impl Operation {
    /// The name used in tables and CSV.
    pub fn as_str(self) -> &'static str {
        match self {
            Operation::Memcpy => "copy_ceiling",
            Operation::ReadPass => "read_ceiling",
            Operation::Snapshot => "snapshot",
            Operation::SnapshotCold => "snapshot_cold",
            Operation::Restore => "restore",
            Operation::Detect => "detect",
        }
    }

    /// Whether the row is a ceiling measurement.
    pub fn is_ceiling(self) -> bool {
        matches!(self, Operation::Memcpy | Operation::ReadPass)
    }

    /// The ceiling a row of this operation is compared to: memcpy for snapshots and restores,
    /// the read pass for detection, the row itself for ceilings.
    pub fn ceiling(self) -> Operation {
        match self {
            Operation::Snapshot | Operation::SnapshotCold | Operation::Restore => Operation::Memcpy,
            Operation::Detect => Operation::ReadPass,
            ceiling => ceiling,
        }
    }
}

impl fmt::Display for Operation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One measurement.
#[derive(Clone, Debug, PartialEq)]
pub struct BenchRow {
    /// Tracked bytes.
    pub footprint: u64,
    /// Fraction of chunks the simulated pass changed (0 for snapshots and ceilings).
    pub dirty_fraction: f64,
    /// Restore strategy configured (`None` for ceilings).
    pub strategy: Option<RestoreStrategy>,
    /// Store tier used (`None` for ceilings).
    pub tier: Option<StoreTier>,
    /// What was measured.
    pub operation: Operation,
    /// Best wall time over the repetitions.
    pub seconds: f64,
    /// Footprint bytes per second, in GB/s (10^9): for partial restores an effective rate.
    pub gbps: f64,
    /// The ceiling the row compares to (memcpy for snapshot and restore, the read pass for
    /// detection; the row's own rate for ceilings).
    pub ceiling_gbps: f64,
    /// `gbps / ceiling_gbps`.
    pub ratio: f64,
}

/// What to measure.
#[derive(Clone, Debug)]
pub struct MatrixConfig {
    /// Footprints in bytes.
    pub footprints: Vec<u64>,
    /// Dirty fractions in `0.0..=1.0`.
    pub dirty_fractions: Vec<f64>,
    /// Strategies (each gets its own snapshots).
    pub strategies: Vec<RestoreStrategy>,
    /// Store tiers (`Auto` is allowed and reported as the tier it picked).
    pub tiers: Vec<StoreTier>,
    /// Chunk size.
    pub chunk_size: u64,
    /// The footprint is split into this many allocations of equal size.
    pub regions: usize,
    /// Timed repetitions per measurement; the best is kept.
    pub repeats: usize,
    /// Whether the device hands out host windows (a software device) or is reached through
    /// reads and writes only (a discrete GPU).
    pub host_windows: bool,
    /// Spill directory for the file tier (`None`: the system temporary directory).
    pub spill_dir: Option<PathBuf>,
    /// Timed passes of each side when full snapshots, full restores and hash detection are
    /// paired with their ceiling (see [`crate::PairedRatio`]); the targets judge those pairs.
    pub paired_samples: usize,
}

impl Default for MatrixConfig {
    fn default() -> Self {
        MatrixConfig {
            footprints: vec![256 << 20],
            dirty_fractions: vec![0.0, 0.01, 0.1, 1.0],
            strategies: vec![
                RestoreStrategy::Full,
                RestoreStrategy::Hash,
                RestoreStrategy::Writeset,
                RestoreStrategy::Tracked,
            ],
            tiers: vec![StoreTier::Host, StoreTier::File, StoreTier::Device],
            chunk_size: kreplay_snapshot::DEFAULT_CHUNK_SIZE,
            regions: 4,
            repeats: 3,
            host_windows: true,
            spill_dir: None,
            paired_samples: DEFAULT_PAIRED_SAMPLES,
        }
    }
}

impl MatrixConfig {
    /// The sizes of the allocations `footprint` is split into (`regions` of them, equal up to
    /// one byte).
    pub fn region_sizes(&self, footprint: u64) -> Vec<u64> {
        let n = self.regions.max(1) as u64;
        (0..n)
            .map(|i| footprint / n + u64::from(i < footprint % n))
            .filter(|&size| size > 0)
            .collect()
    }

    /// Chunks of `footprint` (every allocation chunked on its own).
    pub fn chunks(&self, footprint: u64) -> u64 {
        let chunk = self.chunk_size.max(1);
        self.region_sizes(footprint)
            .iter()
            .map(|size| size.div_ceil(chunk))
            .sum()
    }

    /// Bytes a restore at most copies after a pass that dirtied `fraction` of the chunks of
    /// `footprint`: the picked chunks, whole.
    pub fn dirty_bytes(&self, footprint: u64, fraction: f64) -> u64 {
        ChunkMap::picked(self.chunks(footprint), fraction) * self.chunk_size
    }
}

fn best<F: FnMut() -> Result<Duration, String>>(repeats: usize, mut f: F) -> Result<f64, String> {
    let mut best = f64::INFINITY;
    for _ in 0..repeats.max(1) {
        best = best.min(f()?.as_secs_f64());
    }
    Ok(best)
}

fn rate(bytes: u64, seconds: f64) -> f64 {
    if seconds > 0.0 {
        bytes as f64 / seconds / 1e9
    } else {
        f64::INFINITY
    }
}

fn try_buffer(len: usize, fill: u8) -> Result<Vec<u8>, String> {
    let mut v = Vec::new();
    v.try_reserve_exact(len)
        .map_err(|e| format!("ceiling buffer of {len} bytes: {e}"))?;
    v.resize(len, fill);
    Ok(v)
}

/// The copy and read ceilings of one footprint, with how they were obtained.
#[derive(Clone, Debug, PartialEq)]
pub struct FootprintCeilings {
    /// Tracked bytes.
    pub footprint: u64,
    /// The copy ceiling.
    pub copy: Ceiling,
    /// The read ceiling.
    pub read: Ceiling,
}

fn measure_ceilings(footprint: u64, repeats: usize) -> Result<FootprintCeilings, String> {
    let len = usize::try_from(footprint).map_err(|_| "footprint exceeds the address space")?;
    let src = try_buffer(len, 0xA5)?;
    let mut dst = try_buffer(len, 0)?;
    let copy = copy_ceiling(&src, &mut dst, repeats);
    drop(dst);
    let read = read_ceiling(&src, repeats);
    Ok(FootprintCeilings {
        footprint,
        copy,
        read,
    })
}

fn ceiling_rows(c: &FootprintCeilings) -> Vec<BenchRow> {
    let row = |operation, ceiling: &Ceiling| BenchRow {
        footprint: c.footprint,
        dirty_fraction: 0.0,
        strategy: None,
        tier: None,
        operation,
        seconds: ceiling.seconds,
        gbps: ceiling.gbps,
        ceiling_gbps: ceiling.gbps,
        ratio: 1.0,
    };
    vec![
        row(Operation::Memcpy, &c.copy),
        row(Operation::ReadPass, &c.read),
    ]
}

/// A device with `footprint` bytes of tracked memory in `regions` allocations.
pub(crate) struct Bench {
    pub(crate) device: Arc<HostDevice>,
    pub(crate) inventory: Arc<Inventory>,
    pub(crate) map: ChunkMap,
}

impl Bench {
    fn new(config: &MatrixConfig, footprint: u64) -> Result<Self, String> {
        let options = HostDeviceOptions {
            device_shadow: true,
            device_hash: false,
            batched_writes: true,
        };
        let device = if config.host_windows {
            // SAFETY: the matrix runs one operation at a time on this thread: nothing touches
            // device memory while a snapshot or restore runs, and nothing is freed meanwhile.
            unsafe { HostDevice::with_host_windows(options) }
        } else {
            HostDevice::new(options)
        };
        let device = Arc::new(device);
        let inventory = Arc::new(Inventory::new());
        for (i, size) in config.region_sizes(footprint).into_iter().enumerate() {
            let addr = device.alloc_tracked(&inventory, size, 1, MemoryKind::CoarseDevice)?;
            device
                .fill(addr, size, i as u8 ^ 0x3C)
                .map_err(|e| e.to_string())?;
        }
        let regions = inventory.select(&Filter::for_replay(1));
        let map = ChunkMap::new(&regions, config.chunk_size);
        Ok(Bench {
            device,
            inventory,
            map,
        })
    }

    fn snapshotter(
        &self,
        config: &MatrixConfig,
        strategy: RestoreStrategy,
        tier: StoreTier,
    ) -> Result<Snapshotter, String> {
        let snapshot_config = SnapshotConfig::default()
            .with_store(tier)
            .with_strategy(strategy)
            .with_chunk_size(config.chunk_size)
            // Timed restores are steady-state (unverified) ones; verification is measured as
            // the detect row.
            .with_verify_every(0)
            .with_spill_dir(config.spill_dir.clone());
        Snapshotter::new(self.inventory.clone(), self.device.clone(), snapshot_config)
            .map_err(|e| e.to_string())
    }
}

const NOT_FINAL: RestoreRequest = RestoreRequest {
    next_pass: 1,
    may_be_final: false,
};

/// Run the matrix: for every footprint, the ceilings, then for every tier and strategy the
/// snapshot and, for every dirty fraction, a steady-state restore (after one untimed pass that
/// lets the write set be learned); the hash strategy at 0% dirty also yields the detect row.
/// Every figure is the best of `repeats` runs. The ceilings are measured before and again after
/// the footprint's other measurements and the better of the two is kept, so that a slow start
/// or a drift of the machine's memory bandwidth during a long footprint does not lower them.
pub fn run_matrix(config: &MatrixConfig) -> Result<Vec<BenchRow>, String> {
    Ok(run_all(config, None, |_| {})?.rows)
}

/// Everything one `kreplay bench` run measures.
#[derive(Clone, Debug, Default)]
pub struct BenchResults {
    /// The matrix rows, ceilings first per footprint.
    pub rows: Vec<BenchRow>,
    /// The ceilings with how they were obtained (the better of the two measurements).
    pub ceilings: Vec<FootprintCeilings>,
    /// The per-replay rows.
    pub replay: Vec<ReplayRow>,
    /// Full snapshots, full restores and hash detection timed in turn with their ceiling.
    pub paired: Vec<PairedRatio>,
}

/// What [`run_all`] reports as it goes, in this order for every footprint: `Ceilings`, a `Row`
/// per matrix measurement, a `Paired` per paired ratio, `ReplayStart` and a `Replay` per whole-replay row (when replays are
/// measured), then `CeilingsAgain`. Rows carry the ratio to the ceilings measured before them;
/// the results [`run_all`] returns carry the ratio to the better of both measurements.
#[derive(Clone, Copy, Debug)]
pub enum Progress<'a> {
    /// A footprint starts: its ceilings, measured before its rows.
    Ceilings(&'a FootprintCeilings),
    /// A matrix row, as soon as it is measured.
    Row(&'a BenchRow),
    /// A row of kreplay's timed in turn with its ceiling, as soon as it is measured.
    Paired(&'a PairedRatio),
    /// The footprint's whole replays start.
    ReplayStart {
        /// Tracked bytes.
        footprint: u64,
    },
    /// A whole-replay row, as soon as it is measured.
    Replay(&'a ReplayRow),
    /// The ceilings measured again after the footprint's rows.
    CeilingsAgain {
        /// The second measurement.
        again: &'a FootprintCeilings,
        /// The better of both, which the returned rows' ratios use.
        best: &'a FootprintCeilings,
    },
}

/// The matrix of [`run_matrix`] and, when `replay` is given, the per-replay costs of
/// [`crate::ReplayConfig`] at the footprints of `config` that `replay` lists too (measured on
/// the same tracked memory, after the footprint's matrix rows); `progress` sees every
/// measurement as it is made (see [`Progress`]).
pub fn run_all(
    config: &MatrixConfig,
    replay: Option<&ReplayConfig>,
    mut progress: impl FnMut(Progress<'_>),
) -> Result<BenchResults, String> {
    let mut results = BenchResults::default();
    for &footprint in &config.footprints {
        let first = results.rows.len();
        let before = measure_ceilings(footprint, config.repeats)?;
        progress(Progress::Ceilings(&before));
        for row in ceiling_rows(&before) {
            progress(Progress::Row(&row));
            results.rows.push(row);
        }
        let bench = measure_footprint(config, footprint, &mut results.rows, &mut progress)?;
        for pair in measure_paired(config, &bench, footprint, &before)? {
            progress(Progress::Paired(&pair));
            results.paired.push(pair);
        }
        if let Some(replay) = replay.filter(|r| r.footprints.contains(&footprint)) {
            progress(Progress::ReplayStart { footprint });
            results.replay.extend(crate::replay::measure(
                replay,
                config,
                &bench,
                footprint,
                before.copy.gbps,
                |row| progress(Progress::Replay(row)),
            )?);
        }
        drop(bench);
        let again = measure_ceilings(footprint, config.repeats)?;
        keep_best_ceilings(&mut results.rows[first..], &ceiling_rows(&again));
        let best = FootprintCeilings {
            footprint,
            copy: before.copy.clone().better(again.copy.clone()),
            read: before.read.clone().better(again.read.clone()),
        };
        progress(Progress::CeilingsAgain {
            again: &again,
            best: &best,
        });
        for row in results
            .replay
            .iter_mut()
            .filter(|r| r.footprint == footprint)
        {
            row.copy_ceiling_gbps = best.copy.gbps;
        }
        results.ceilings.push(best);
    }
    Ok(results)
}

/// Raises the ceiling rows of one footprint's `rows` to `again` where that is better, and
/// recomputes every row's ceiling and ratio.
fn keep_best_ceilings(rows: &mut [BenchRow], again: &[BenchRow]) {
    for ceiling in rows.iter_mut().filter(|r| r.operation.is_ceiling()) {
        if let Some(other) = again
            .iter()
            .find(|a| a.operation == ceiling.operation && a.seconds < ceiling.seconds)
        {
            *ceiling = other.clone();
        }
    }
    let best: Vec<(Operation, f64)> = rows
        .iter()
        .filter(|r| r.operation.is_ceiling())
        .map(|r| (r.operation, r.gbps))
        .collect();
    for row in rows.iter_mut() {
        if let Some(&(_, gbps)) = best.iter().find(|(op, _)| *op == row.operation.ceiling()) {
            row.ceiling_gbps = gbps;
            row.ratio = row.gbps / gbps;
        }
    }
}

/// A snapshot for a one-pass replay of everything `snapshotter` tracks, and how long taking it
/// took (planning not included).
fn timed_take(snapshotter: &Snapshotter) -> Result<(Snapshot, Duration), String> {
    let plan = snapshotter
        .plan(&Filter::for_replay(1))
        .map_err(|e| e.to_string())?;
    // A snapshot that starts following writes where its strategy does, not one continuing
    // the footprint the previous snapshot kept followed (see `Snapshotter::following`).
    snapshotter.stop_following();
    let start = Instant::now();
    let s = snapshotter.take(plan).map_err(|e| e.to_string())?;
    Ok((s, start.elapsed()))
}

/// Full snapshots and full restores timed in turn with the copy ceiling, hash detection with
/// the read ceiling, and hash restores after 1% of the chunks changed with hash restores after
/// nothing changed, `config.paired_samples` passes of each side, per tier (when the
/// configuration has those strategies). The ceilings' side runs the best method of `ceilings`
/// on buffers of the footprint's size, allocated for this and freed after.
fn measure_paired(
    config: &MatrixConfig,
    bench: &Bench,
    footprint: u64,
    ceilings: &FootprintCeilings,
) -> Result<Vec<PairedRatio>, String> {
    use RestoreStrategy::{Full, Hash};
    let (Some(copy), Some(read)) = (ceilings.copy.best, ceilings.read.best) else {
        return Ok(Vec::new());
    };
    let has = |s| config.strategies.contains(&s);
    if !has(Full) && !has(Hash) {
        return Ok(Vec::new());
    }
    let len = usize::try_from(footprint).map_err(|_| "footprint exceeds the address space")?;
    let src = try_buffer(len, 0xA5)?;
    let mut dst = try_buffer(len, 0)?;
    let samples = config.paired_samples.max(1);
    let mut out = Vec::new();
    for &tier in &config.tiers {
        for strategy in [Full, Hash].into_iter().filter(|&s| has(s)) {
            let snapshotter = bench.snapshotter(config, strategy, tier)?;
            let take = || timed_take(&snapshotter);
            let (first, _) = take()?; // allocates the store, untimed
            let used_tier = first.tier();
            drop(first);
            let pair = |operation, ceiling: &Ceiling, (c, r): (Vec<f64>, Vec<f64>)| PairedRatio {
                footprint,
                tier: used_tier,
                operation,
                strategy: strategy.to_string(),
                baseline: Operation::ceiling(operation).to_string(),
                ceiling_method: ceiling.method.clone(),
                ceiling_seconds: c,
                row_seconds: r,
            };
            if strategy == Full {
                let series = interleave(
                    samples,
                    || Ok(copy.copy_once(&src, &mut dst)),
                    || take().map(|(_, t)| t),
                )?;
                out.push(pair(Operation::Snapshot, &ceilings.copy, series));
            }
            let (snapshot, _) = take()?;
            let snapshot = RefCell::new(snapshot);
            let restore = || -> Result<Duration, String> {
                let start = Instant::now();
                snapshot
                    .borrow_mut()
                    .restore(&NOT_FINAL)
                    .map_err(|e| e.to_string())?;
                Ok(start.elapsed())
            };
            restore()?; // pass 0, untimed, as in the matrix
            if strategy == Full {
                let series = interleave(samples, || Ok(copy.copy_once(&src, &mut dst)), restore)?;
                out.push(pair(Operation::Restore, &ceilings.copy, series));
                continue;
            }
            let series = interleave(samples, || Ok(read.read_once(&src)), restore)?;
            out.push(pair(Operation::Detect, &ceilings.read, series));
            // A hash restore after a pass that changed 1% of the chunks, in turn with the hash
            // pass alone (a restore of the same snapshot with nothing changed).
            let chunks = bench.map.pick(HASH_RESTORE_DIRTY, 0x5EED);
            let mut salt = 0;
            let dirty_restore = || -> Result<Duration, String> {
                salt += 1;
                bench
                    .map
                    .dirty(&bench.device, &chunks, salt)
                    .map_err(|e| e.to_string())?;
                restore()
            };
            let (c, r) = interleave(samples, restore, dirty_restore)?;
            out.push(PairedRatio {
                footprint,
                tier: used_tier,
                operation: Operation::Restore,
                strategy: strategy.to_string(),
                baseline: HASH_PASS.into(),
                ceiling_method: "hash restores of the same snapshot with nothing changed".into(),
                ceiling_seconds: c,
                row_seconds: r,
            });
        }
    }
    Ok(out)
}

/// The rows of one footprint, ceilings first.
fn measure_footprint(
    config: &MatrixConfig,
    footprint: u64,
    rows: &mut Vec<BenchRow>,
    progress: &mut impl FnMut(Progress<'_>),
) -> Result<Bench, String> {
    let copy_ceiling = rows[rows.len() - 2].gbps;
    let read_ceiling = rows[rows.len() - 1].gbps;
    let bench = Bench::new(config, footprint)?;
    let row = |strategy, tier, operation, dirty_fraction, seconds: f64, ceiling: f64| {
        let gbps = rate(footprint, seconds);
        BenchRow {
            footprint,
            dirty_fraction,
            strategy: Some(strategy),
            tier: Some(tier),
            operation,
            seconds,
            gbps,
            ceiling_gbps: ceiling,
            ratio: gbps / ceiling,
        }
    };
    let mut push = |row: BenchRow| {
        progress(Progress::Row(&row));
        rows.push(row);
    };
    for &tier in &config.tiers {
        for &strategy in &config.strategies {
            let snapshotter = bench.snapshotter(config, strategy, tier)?;
            let take = || timed_take(&snapshotter);
            // The first snapshot allocates the store; the others reuse it, as successive
            // replays do.
            let (first, cold) = take()?;
            let used_tier = first.tier();
            drop(first);
            push(row(
                strategy,
                used_tier,
                Operation::SnapshotCold,
                0.0,
                cold.as_secs_f64(),
                copy_ceiling,
            ));
            let seconds = best(config.repeats, || take().map(|(_, t)| t))?;
            push(row(
                strategy,
                used_tier,
                Operation::Snapshot,
                0.0,
                seconds,
                copy_ceiling,
            ));
            for (i, &fraction) in config.dirty_fractions.iter().enumerate() {
                let chunks = bench.map.pick(fraction, 0xC0FFEE + i as u64);
                let (mut snapshot, _) = take()?;
                let mut salt = 0;
                let mut pass = |snapshot: &mut Snapshot| -> Result<Duration, String> {
                    let mut dirty = || {
                        salt += 1;
                        let start = Instant::now();
                        bench
                            .map
                            .dirty(&bench.device, &chunks, salt)
                            .map(|()| start.elapsed())
                            .map_err(|e| e.to_string())
                    };
                    // The same chunks written twice: the first time pays a fault per page
                    // where writes are followed, the second finds them writable (and cached).
                    let (first, again) = (dirty()?, dirty()?);
                    let start = Instant::now();
                    let report = snapshot.restore(&NOT_FINAL).map_err(|e| e.to_string())?;
                    let restore = start.elapsed();
                    // A restore that followed writes is charged what following them cost the
                    // pass: the first writing's excess over the second (at least the faults).
                    Ok(if report.strategy == RestoreStrategy::Tracked {
                        restore + first.saturating_sub(again)
                    } else {
                        restore
                    })
                };
                pass(&mut snapshot)?; // pass 0: the write set is learned here
                let seconds = best(config.repeats, || pass(&mut snapshot))?;
                push(row(
                    strategy,
                    used_tier,
                    Operation::Restore,
                    fraction,
                    seconds,
                    copy_ceiling,
                ));
                if strategy == RestoreStrategy::Hash && fraction == 0.0 {
                    push(row(
                        strategy,
                        used_tier,
                        Operation::Detect,
                        0.0,
                        seconds,
                        read_ceiling,
                    ));
                }
            }
        }
    }
    Ok(bench)
}

/// What the benches' tests share (the free space of a spill folder).
#[cfg(test)]
#[path = "../tests/support/mod.rs"]
mod test_support;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::matrix::test_support as support;

    #[test]
    fn footprints_split_into_equal_regions_and_dirty_bytes_count_whole_chunks() {
        let config = MatrixConfig {
            regions: 4,
            chunk_size: 4096,
            ..Default::default()
        };
        assert_eq!(config.region_sizes(10), vec![3, 3, 2, 2]);
        assert_eq!(config.region_sizes(2), vec![1, 1]);
        // 4 regions of 100 KiB: 25 chunks each.
        assert_eq!(config.chunks(400 << 10), 100);
        assert_eq!(config.dirty_bytes(400 << 10, 0.01), 4096);
        assert_eq!(config.dirty_bytes(400 << 10, 0.0), 0);
        assert_eq!(config.dirty_bytes(400 << 10, 1.0), 100 * 4096);
    }

    #[test]
    fn the_better_of_two_ceiling_measurements_is_kept_and_ratios_follow() {
        let row = |operation, seconds: f64, ceiling_gbps: f64| {
            let gbps = rate(1 << 30, seconds);
            BenchRow {
                footprint: 1 << 30,
                dirty_fraction: 0.0,
                strategy: None,
                tier: None,
                operation,
                seconds,
                gbps,
                ceiling_gbps,
                ratio: gbps / ceiling_gbps,
            }
        };
        let slow_copy = rate(1 << 30, 0.2);
        let read = rate(1 << 30, 0.05);
        let mut rows = vec![
            row(Operation::Memcpy, 0.2, slow_copy),
            row(Operation::ReadPass, 0.05, read),
            row(Operation::Restore, 0.1, slow_copy),
            row(Operation::Detect, 0.1, read),
        ];
        let again = [
            row(Operation::Memcpy, 0.1, 0.0),
            row(Operation::ReadPass, 0.08, 0.0),
        ];
        keep_best_ceilings(&mut rows, &again);
        assert_eq!(rows[0].seconds, 0.1, "the faster memcpy is kept");
        assert_eq!(rows[1].seconds, 0.05, "the slower read pass is not");
        assert!((rows[2].ratio - 1.0).abs() < 1e-12, "{:?}", rows[2]);
        assert_eq!(rows[2].ceiling_gbps, rows[0].gbps);
        assert!((rows[3].ratio - 0.5).abs() < 1e-12, "{:?}", rows[3]);
    }

    #[test]
    fn every_row_carries_the_ceiling_of_its_operation() {
        let config = MatrixConfig {
            footprints: vec![256 << 10],
            dirty_fractions: vec![0.0, 0.25],
            tiers: vec![StoreTier::Host],
            chunk_size: 4096,
            repeats: 1,
            ..Default::default()
        };
        let rows = run_matrix(&config).unwrap();
        let ceiling = |op| {
            rows.iter()
                .find(|r| r.operation == op)
                .map(|r| r.gbps)
                .unwrap()
        };
        for r in &rows {
            assert_eq!(r.ceiling_gbps, ceiling(r.operation.ceiling()), "{r:?}");
        }
        assert_eq!(Operation::Detect.ceiling(), Operation::ReadPass);
        assert_eq!(Operation::Restore.ceiling(), Operation::Memcpy);
    }

    #[test]
    fn full_copies_hash_detection_and_hash_restores_are_paired_in_equal_samples() {
        // The file tier's samples spill to the system temporary directory.
        if !support::spill_room(&std::env::temp_dir(), 16 << 20) {
            return;
        }
        let config = MatrixConfig {
            footprints: vec![256 << 10],
            dirty_fractions: vec![0.0, 0.25],
            tiers: vec![StoreTier::Host, StoreTier::File],
            chunk_size: 4096,
            repeats: 1,
            paired_samples: 4,
            ..Default::default()
        };
        let mut before = None;
        let results = run_all(&config, None, |event| {
            if let Progress::Ceilings(c) = event {
                before = Some(c.clone());
            }
        })
        .unwrap();
        let seen: Vec<(StoreTier, Operation, &str)> = results
            .paired
            .iter()
            .map(|p| (p.tier, p.operation, p.strategy.as_str()))
            .collect();
        assert_eq!(
            seen,
            [StoreTier::Host, StoreTier::File]
                .into_iter()
                .flat_map(|t| [
                    (t, Operation::Snapshot, "full"),
                    (t, Operation::Restore, "full"),
                    (t, Operation::Detect, "hash"),
                    (t, Operation::Restore, "hash"),
                ])
                .collect::<Vec<_>>()
        );
        // The ceiling side runs the best method of the ceilings measured before the rows; the
        // hash restore after a changing pass is held against the hash pass.
        let ceilings = before.unwrap();
        for p in &results.paired {
            assert_eq!(
                (p.ceiling_seconds.len(), p.row_seconds.len()),
                (4, 4),
                "{p:?}"
            );
            match (p.operation, p.strategy.as_str()) {
                (Operation::Detect, _) => assert_eq!(p.ceiling_method, ceilings.read.method),
                (Operation::Restore, "hash") => {
                    assert_eq!(p.baseline, HASH_PASS);
                    assert!(p.describe().contains("vs hash pass"), "{}", p.describe());
                }
                _ => assert_eq!(p.ceiling_method, ceilings.copy.method, "{p:?}"),
            }
        }
    }

    #[test]
    fn the_paired_hash_restores_leave_memory_as_snapshotted() {
        // Every restore after a changing pass must bring the bytes back: a hash restore that
        // found nothing would be cheaper and wrong.
        let config = MatrixConfig {
            footprints: vec![256 << 10],
            dirty_fractions: vec![0.0],
            tiers: vec![StoreTier::Host],
            chunk_size: 4096,
            paired_samples: 3,
            ..Default::default()
        };
        let bench = Bench::new(&config, 256 << 10).unwrap();
        let regions = bench.inventory.select(&Filter::for_replay(1));
        let before: Vec<Vec<u8>> = regions
            .iter()
            .map(|r| bench.device.to_vec(r.base, r.size).unwrap())
            .collect();
        let ceilings = measure_ceilings(256 << 10, 1).unwrap();
        let pairs = measure_paired(&config, &bench, 256 << 10, &ceilings).unwrap();
        let hash = pairs
            .iter()
            .find(|p| p.baseline == HASH_PASS)
            .expect("a paired hash restore");
        assert_eq!(hash.row_seconds.len(), 3);
        for (r, bytes) in regions.iter().zip(&before) {
            assert_eq!(&bench.device.to_vec(r.base, r.size).unwrap(), bytes);
        }
    }

    #[test]
    fn every_measurement_is_reported_as_it_is_made_in_footprint_order() {
        let config = MatrixConfig {
            footprints: vec![256 << 10, 512 << 10],
            dirty_fractions: vec![0.0, 0.1],
            tiers: vec![StoreTier::Host],
            chunk_size: 4096,
            repeats: 1,
            ..Default::default()
        };
        let replay = ReplayConfig {
            footprints: vec![512 << 10],
            dirty_fractions: vec![0.1],
            passes: vec![3],
            ..Default::default()
        };
        let mut events: Vec<String> = Vec::new();
        let results = run_all(&config, Some(&replay), |event| {
            events.push(match event {
                Progress::Ceilings(c) => format!("ceilings {}", c.footprint),
                Progress::Row(r) => format!("row {} {}", r.footprint, r.operation),
                Progress::Paired(p) => format!("paired {} {}", p.footprint, p.operation),
                Progress::ReplayStart { footprint } => format!("replays {footprint}"),
                Progress::Replay(r) => format!("replay {} {}", r.footprint, r.strategy),
                Progress::CeilingsAgain { again, best } => {
                    assert!(best.copy.gbps >= again.copy.gbps);
                    format!("again {}", again.footprint)
                }
            })
        })
        .unwrap();
        let rows = events.iter().filter(|e| e.starts_with("row ")).count();
        assert_eq!(rows, results.rows.len(), "every matrix row, once");
        let paired = events.iter().filter(|e| e.starts_with("paired ")).count();
        assert_eq!(paired, results.paired.len());
        assert_eq!(
            paired,
            2 * 4,
            "full snapshot, full restore, detect, hash restore per footprint"
        );
        let replays = events.iter().filter(|e| e.starts_with("replay ")).count();
        assert_eq!(replays, results.replay.len());
        // Replays only at the footprint they list: 4 patterns x (6 strategies and the control).
        assert_eq!(replays, 4 * 7);
        assert_eq!(results.replay.iter().filter(|r| r.control).count(), 4);
        assert!(results.replay.iter().all(|r| r.footprint == 512 << 10));
        // What each strategy's replays did: DEFAULT_REPEATS repetitions of a sequence of 2
        // dispatches of 3 passes (2 restores each); the untimed dispatch before them is not
        // counted.
        let reps = crate::replay::DEFAULT_REPEATS;
        for r in &results.replay {
            let c = r.choices;
            let dispatches = 2 * reps as u64;
            assert_eq!(r.repeats, reps, "{r:?}");
            assert_eq!((r.first_times.len(), r.later_times.len()), (reps, reps));
            assert_eq!(c.dispatches, dispatches, "{r:?}");
            assert_eq!(
                c.full + c.hash + c.writeset + c.tracked,
                2 * dispatches,
                "{r:?}"
            );
            assert!(r.first_range.0 <= r.first_seconds && r.first_seconds <= r.first_range.1);
            assert!(r.later_range.0 <= r.later_seconds && r.later_seconds <= r.later_range.1);
            match r.strategy {
                RestoreStrategy::Full => {
                    assert_eq!((c.hashed_snapshots, c.full), (0, 2 * dispatches));
                }
                RestoreStrategy::Hash => {
                    assert_eq!((c.hashed_snapshots, c.hash), (dispatches, 2 * dispatches));
                }
                // Learning restores hash everything; the others write the learned set.
                RestoreStrategy::Writeset => {
                    assert_eq!((c.hashed_snapshots, c.full), (dispatches, 0));
                    assert!(c.writeset > 0 && c.hash > 0, "{c:?}");
                }
                _ => {}
            }
        }
        let at = |e: &str| events.iter().position(|x| x == e).unwrap();
        assert_eq!(at("ceilings 262144"), 0);
        assert!(at("again 262144") < at("ceilings 524288"));
        assert!(at("ceilings 524288") < at("paired 524288 restore"));
        assert!(at("paired 524288 detect") < at("replays 524288"));
        assert!(at("ceilings 524288") < at("replays 524288"));
        assert!(at("replays 524288") < at("again 524288"));
        assert_eq!(at("again 524288"), events.len() - 1);
        assert!(!events.contains(&"replays 262144".to_string()));
        // Each footprint's rows come between its two ceiling measurements.
        let first_large_row = at("row 524288 copy_ceiling");
        assert!(at("ceilings 524288") < first_large_row);
        assert!(
            events[..at("again 262144")]
                .iter()
                .filter(|e| e.starts_with("row "))
                .all(|e| e.starts_with("row 262144"))
        );
    }
}
