//! The cost of whole replays: snapshot plus every restore of an N-pass replay (learning and
//! verification included), the passes' own writes and the snapshot's end, per strategy, for a first dispatch of a kernel and for later
//! dispatches of the same kernel that reuse what the earlier ones learned; beside N full
//! restores and N copies at the machine's copy ceiling.

use std::fmt;
use std::time::{Duration, Instant};

use kreplay_snapshot::{
    Filter, RestoreReport, RestoreRequest, RestoreStrategy, Snapshot, SnapshotConfig, Snapshotter,
    StoreTier,
};

use crate::matrix::{Bench, MatrixConfig};
use crate::output::{format_bytes, format_percent, format_seconds};
use crate::workload::SplitMix64;

/// Which chunks each simulated pass writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Pattern {
    /// The same randomly placed chunks in every pass and every dispatch.
    SameScattered,
    /// The same run of consecutive chunks in every pass and every dispatch.
    SameContiguous,
    /// Other randomly placed chunks in every pass.
    DifferentScattered,
    /// Another run of consecutive chunks in every pass.
    DifferentContiguous,
}

impl Pattern {
    /// Every pattern, in report order.
    pub const ALL: [Pattern; 4] = [
        Pattern::SameScattered,
        Pattern::SameContiguous,
        Pattern::DifferentScattered,
        Pattern::DifferentContiguous,
    ];

    /// The name used in tables.
    pub fn as_str(self) -> &'static str {
        match self {
            Pattern::SameScattered => "same-scattered",
            Pattern::SameContiguous => "same-contiguous",
            Pattern::DifferentScattered => "diff-scattered",
            Pattern::DifferentContiguous => "diff-contiguous",
        }
    }

    /// The chunks pass `pass` of dispatch `dispatch` writes, out of `chunks`.
    pub fn chunks(self, chunks: u64, fraction: f64, dispatch: u64, pass: u64) -> Vec<u64> {
        let k = crate::ChunkMap::picked(chunks, fraction);
        let seed = match self {
            Pattern::SameScattered | Pattern::SameContiguous => 0x5EED,
            Pattern::DifferentScattered | Pattern::DifferentContiguous => {
                0x5EED ^ (dispatch << 32) ^ (pass + 1)
            }
        };
        let mut rng = SplitMix64::new(seed);
        match self {
            Pattern::SameScattered | Pattern::DifferentScattered => {
                let mut all: Vec<u64> = (0..chunks).collect();
                for i in 0..k {
                    let j = i + rng.below(chunks - i);
                    all.swap(i as usize, j as usize);
                }
                all.truncate(k as usize);
                all
            }
            Pattern::SameContiguous | Pattern::DifferentContiguous => {
                let start = rng.below(chunks - k + 1);
                (start..start + k).collect()
            }
        }
    }
}

impl fmt::Display for Pattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Repetitions of a cell of a short replay, by default. On the 2-core machine the verified
/// strategies of a cell cost within 10% of each other and one repetition of any of them spreads
/// by 10-50%; `auto` is judged against the cheapest of three such estimates, which is biased low
/// when they tie, so each estimate needs enough repetitions (with 7 and 5, two or three of 64
/// cells missed 1.10x from one run to the next, never the same cells twice).
pub const DEFAULT_REPEATS: usize = 9;
/// Repetitions of a cell of a long replay, by default.
pub const DEFAULT_LONG_REPEATS: usize = 7;

/// What to measure.
#[derive(Clone, Debug)]
pub struct ReplayConfig {
    /// Footprints in bytes.
    pub footprints: Vec<u64>,
    /// Fractions of chunks each pass writes.
    pub dirty_fractions: Vec<f64>,
    /// Passes per replay.
    pub passes: Vec<u64>,
    /// Strategies measured (`writeset-unverified` is shown but never counted as the best).
    pub strategies: Vec<RestoreStrategy>,
    /// Dirty patterns.
    pub patterns: Vec<Pattern>,
    /// Repetitions of each cell: every repetition replays one dispatch sequence per strategy,
    /// the strategies one after the other in an order shuffled anew each repetition, each
    /// sequence on a kernel nothing was learned about. A strategy's figure is the lower
    /// quartile of its repetitions (`low_quartile`), so every strategy of a cell is judged by
    /// the same statistic over the same stretch of time.
    pub repeats: usize,
    /// Replays of more passes than this are long: they get [`ReplayConfig::long_repeats`]
    /// repetitions instead (each already holds many restores).
    pub long_passes: u64,
    /// Repetitions of a cell of a long replay (at least 1).
    pub long_repeats: usize,
    /// Dispatches of the kernel per sequence: the first is cold, the later ones reuse what the
    /// earlier ones learned (at least 2).
    pub dispatches: usize,
    /// The store tiers.
    pub tiers: Vec<StoreTier>,
    /// Replays `full` a second time in every repetition, as a strategy of its own (a
    /// [`ReplayRow::control`] row): the same work measured twice, so [`check_control`] shows
    /// how far the statistic moves when nothing differs but the moment it was measured.
    pub control: bool,
}

impl ReplayConfig {
    /// Whether the control is measured (it needs `full` among the strategies).
    pub fn has_control(&self) -> bool {
        self.control && self.strategies.contains(&RestoreStrategy::Full)
    }

    /// Strategies replayed in every repetition, the control included (each keeps a store).
    pub fn replayed(&self) -> usize {
        self.strategies.len() + usize::from(self.has_control())
    }

    /// Repetitions of a cell of `passes` passes (at least 1).
    pub fn repeats_for(&self, passes: u64) -> usize {
        if passes > self.long_passes {
            self.long_repeats.max(1)
        } else {
            self.repeats.max(1)
        }
    }
}

impl Default for ReplayConfig {
    fn default() -> Self {
        ReplayConfig {
            footprints: vec![256 << 20],
            dirty_fractions: vec![0.01, 0.1],
            passes: vec![2, 4, 8, 38],
            strategies: vec![
                RestoreStrategy::Full,
                RestoreStrategy::Hash,
                RestoreStrategy::Writeset,
                RestoreStrategy::Tracked,
                RestoreStrategy::Auto,
                RestoreStrategy::WritesetUnverified,
            ],
            patterns: Pattern::ALL.to_vec(),
            repeats: DEFAULT_REPEATS,
            long_passes: 8,
            long_repeats: DEFAULT_LONG_REPEATS,
            dispatches: 2,
            tiers: vec![StoreTier::Host],
            control: true,
        }
    }
}

/// The memory cost of the replays of one cell and strategy.
#[derive(Clone, Debug, PartialEq)]
pub struct ReplayRow {
    /// Tracked bytes.
    pub footprint: u64,
    /// Fraction of chunks each pass writes.
    pub dirty_fraction: f64,
    /// Which chunks.
    pub pattern: Pattern,
    /// Passes of each replay.
    pub passes: u64,
    /// The store tier.
    pub tier: StoreTier,
    /// Strategy configured.
    pub strategy: RestoreStrategy,
    /// The control: `full` measured a second time in the same repetitions (see
    /// [`ReplayConfig::control`]); never judged as a strategy.
    pub control: bool,
    /// Snapshot plus every restore of a kernel's first dispatch (nothing learned about that
    /// kernel before): the lower quartile of the cell's repetitions (`low_quartile`).
    pub first_seconds: f64,
    /// The fastest and slowest of those first dispatches.
    pub first_range: (f64, f64),
    /// Their median (shown beside the figure, not judged).
    pub first_median: f64,
    /// The same for the later dispatches of the kernel (the lower quartile of all of them),
    /// which reuse what the earlier dispatches learned.
    pub later_seconds: f64,
    /// The fastest and slowest of those later dispatches.
    pub later_range: (f64, f64),
    /// Their median (shown beside the figure, not judged).
    pub later_median: f64,
    /// Every first dispatch's time, in the order of the repetitions.
    pub first_times: Vec<f64>,
    /// Every later dispatch's time, repetition by repetition (within one, in dispatch order).
    pub later_times: Vec<f64>,
    /// Repetitions measured (one dispatch sequence each).
    pub repeats: usize,
    /// Dispatches per sequence (all but the first are later dispatches).
    pub dispatches: usize,
    /// What the snapshots and restores of every dispatch measured did.
    pub choices: Choices,
    /// One full restore of the footprint in the same tier, measured in the same run.
    pub full_restore_seconds: f64,
    /// The machine's copy ceiling, GB/s.
    pub copy_ceiling_gbps: f64,
}

impl ReplayRow {
    /// Every repetition's whole dispatch sequence: its first dispatch plus its later ones.
    pub fn sequence_times(&self) -> Vec<f64> {
        let later = self.dispatches.saturating_sub(1).max(1);
        self.first_times
            .iter()
            .zip(self.later_times.chunks(later))
            .map(|(first, later)| first + later.iter().sum::<f64>())
            .collect()
    }

    /// N full restores.
    pub fn n_full(&self) -> f64 {
        self.passes as f64 * self.full_restore_seconds
    }

    /// N copies of the footprint at the copy ceiling.
    pub fn n_ceiling(&self) -> f64 {
        self.passes as f64 * self.footprint as f64 / (self.copy_ceiling_gbps * 1e9)
    }
}

const KERNEL: u64 = 0x4B45_524E;

/// What the restores of a cell's replays did: how many snapshots hashed their chunks and how
/// many restores wrote everything, hashed everything, or wrote a learned write set (verified or
/// not), over every dispatch of the cell.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Choices {
    /// Dispatches measured.
    pub dispatches: u64,
    /// Of them, those whose snapshot hashed every chunk.
    pub hashed_snapshots: u64,
    /// Restores that wrote every chunk.
    pub full: u64,
    /// Restores that hashed every chunk and wrote the changed ones.
    pub hash: u64,
    /// Restores that wrote the learned write set.
    pub writeset: u64,
    /// Restores that wrote back the chunks of the pages followed as written (tracked).
    pub tracked: u64,
}

impl Choices {
    /// Counts a restore by what it did (not by the strategy it reports: `auto` reports a
    /// learning hash pass as a write-set restore): no hashing and no learned set means full,
    /// hashing all of the snapshot's bytes means hash, anything else wrote the learned set.
    fn restore(&mut self, report: &RestoreReport, snapshot_bytes: u64) {
        if report.strategy == RestoreStrategy::Tracked {
            self.tracked += 1;
        } else if !report.verified && !report.unverified {
            self.full += 1;
        } else if report.verified && report.bytes_hashed >= snapshot_bytes {
            self.hash += 1;
        } else {
            self.writeset += 1;
        }
    }
}

#[allow(clippy::too_many_arguments)]
fn replay_once(
    bench: &Bench,
    snapshotter: &Snapshotter,
    kernel: u64,
    pattern: Pattern,
    fraction: f64,
    dispatch: u64,
    passes: u64,
    choices: &mut Choices,
) -> Result<Duration, String> {
    let chunks = bench.map.chunks();
    // As the pass loop does: the snapshot is told the restores the replay plans.
    let plan = snapshotter
        .plan(&Filter::for_replay(1))
        .map_err(|e| e.to_string())?
        .with_planned_restores(Some(passes - 1));
    let start = Instant::now();
    let mut snapshot: Snapshot = snapshotter
        .take_for_kernel(plan, kernel)
        .map_err(|e| e.to_string())?;
    let mut spent = start.elapsed();
    choices.dispatches += 1;
    choices.hashed_snapshots += u64::from(snapshot.report().hashed);
    for pass in 0..passes {
        let written = pattern.chunks(chunks, fraction, dispatch, pass);
        // The pass's own writes are counted: where writes are followed, the first store to
        // each page costs the pass a fault.
        let start = Instant::now();
        bench
            .map
            .dirty(&bench.device, &written, dispatch * 1000 + pass + 1)
            .map_err(|e| e.to_string())?;
        spent += start.elapsed();
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
        spent += start.elapsed();
        choices.restore(&report, snapshot.bytes());
    }
    // Ending the replay is counted too: a snapshot that followed writes and does not keep
    // following them stops here, which walks the footprint's page tables again (one that keeps
    // following them stops when its sequence ends, see `measure`).
    let start = Instant::now();
    drop(snapshot);
    spent += start.elapsed();
    Ok(spent)
}

fn snapshotter(
    bench: &Bench,
    strategy: RestoreStrategy,
    tier: StoreTier,
    chunk: u64,
) -> Result<Snapshotter, String> {
    let config = SnapshotConfig::default()
        .with_store(tier)
        .with_strategy(strategy)
        .with_chunk_size(chunk);
    Snapshotter::new(bench.inventory.clone(), bench.device.clone(), config)
        .map_err(|e| e.to_string())
}

fn full_restore_seconds(bench: &Bench, tier: StoreTier, chunk: u64) -> Result<f64, String> {
    let full = snapshotter(bench, RestoreStrategy::Full, tier, chunk)?;
    let mut s = full
        .snapshot(&Filter::for_replay(1))
        .map_err(|e| e.to_string())?;
    // The best of 5: the baseline every row of the tier is divided by.
    let mut best = f64::INFINITY;
    for _ in 0..5 {
        let start = Instant::now();
        s.restore(&RestoreRequest {
            next_pass: 1,
            may_be_final: false,
        })
        .map_err(|e| e.to_string())?;
        best = best.min(start.elapsed().as_secs_f64());
    }
    Ok(best)
}

/// The median of `times` (the mean of the two middle ones for an even count), and the fastest
/// and slowest.
pub(crate) fn median_and_range(times: &[f64]) -> (f64, (f64, f64)) {
    let mut sorted = times.to_vec();
    sorted.sort_by(f64::total_cmp);
    let n = sorted.len();
    if n == 0 {
        return (f64::NAN, (f64::NAN, f64::NAN));
    }
    let median = if n % 2 == 1 {
        sorted[n / 2]
    } else {
        (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0
    };
    (median, (sorted[0], sorted[n - 1]))
}

/// The lower quartile of `times` (the 25th percentile, interpolated linearly between the
/// repetitions ordered from fastest: of 5 the second fastest, of 7 the mean of the second and
/// third fastest, of 3 the mean of the two fastest). On a shared machine interference only ever
/// slows a repetition, so a low quantile comes closest to what the work itself costs, and unlike
/// the minimum it does not rest on one lucky repetition.
pub fn low_quartile(times: &[f64]) -> f64 {
    let mut sorted = times.to_vec();
    sorted.sort_by(f64::total_cmp);
    match sorted.len() {
        0 => f64::NAN,
        n => {
            let at = (n - 1) as f64 * 0.25;
            let lo = at.floor() as usize;
            let hi = (lo + 1).min(n - 1);
            sorted[lo] + (sorted[hi] - sorted[lo]) * (at - lo as f64)
        }
    }
}

/// Which repetitions the lower quartile (`low_quartile`) takes of `n`, in words ("the 3rd
/// fastest", "the mean of the 2nd and 3rd fastest").
pub fn low_quartile_words(n: usize) -> String {
    let ordinal = |i: usize| match i {
        1 => "fastest".to_string(),
        2 => "2nd fastest".to_string(),
        3 => "3rd fastest".to_string(),
        i => format!("{i}th fastest"),
    };
    let at = n.saturating_sub(1) as f64 * 0.25;
    let lo = at.floor() as usize;
    if n == 0 {
        "nothing".to_string()
    } else if at == lo as f64 || lo + 1 >= n {
        format!("the {}", ordinal(lo + 1))
    } else if at - lo as f64 == 0.5 {
        let hi = ordinal(lo + 2);
        format!(
            "the mean of the {} and {hi}",
            ordinal(lo + 1).trim_end_matches(" fastest")
        )
    } else {
        format!(
            "between the {} and the {}",
            ordinal(lo + 1).trim_end_matches(" fastest"),
            ordinal(lo + 2)
        )
    }
}

/// The order the strategies of a cell replay in, in repetition `rep`: a shuffle drawn from
/// the cell and the repetition, so that every strategy runs in every position and after every
/// other (interference that follows one kind of work falls on all of them alike), and the same
/// run replays the same order.
fn order(strategies: usize, cell: u64, rep: usize) -> Vec<usize> {
    let mut order: Vec<usize> = (0..strategies).collect();
    let mut rng = SplitMix64::new(0x0DE5_0000 ^ (cell << 16) ^ rep as u64);
    for i in (1..strategies).rev() {
        let j = rng.below(i as u64 + 1) as usize;
        order.swap(i, j);
    }
    order
}

/// What one strategy's sequences of a cell measured.
#[derive(Default)]
struct Samples {
    first: Vec<f64>,
    later: Vec<f64>,
    choices: Choices,
}

/// Measures every cell of `config` at `footprint` on `bench`; `copy_ceiling_gbps` is the
/// ceiling measured for that footprint; `progress` sees each row as soon as it is measured.
///
/// One snapshotter per tier and strategy lives through the footprint (it keeps the machine's
/// measured rates, as a process's snapshotter does), each with its store allocated and faulted
/// in by an untimed snapshot before the tier's replays (a process pays that once, not per
/// dispatch) and released after them: the memory used is the footprint plus one store per
/// strategy. Every snapshot is told the restores its replay plans (N - 1), as the pass loop
/// tells it. A cell (dirty, pattern, N) starts with one untimed dispatch of N passes per
/// strategy (of a kernel of its own), so that the rates a process replaying N passes has
/// measured are what the cell's dispatches start from, not those of the previous cell. Then
/// it is measured in repetitions; each repetition replays one dispatch sequence per strategy, in
/// an order shuffled anew each repetition ([`order`]), so that the machine's drifts (memory
/// bandwidth moves by tens of percent over minutes on a shared machine) and whatever one
/// strategy leaves behind for the next fall on every strategy alike. Every sequence replays
/// another kernel, so each first dispatch has nothing learned about its kernel before it.
/// Each sequence also starts with nothing followed: where a replay followed writes and its
/// snapshotter keeps following the footprint afterwards, the sequence's later dispatches
/// continue from it (their snapshots copy what was written since), and stopping to follow it
/// after the sequence is charged to its last dispatch.
pub(crate) fn measure(
    config: &ReplayConfig,
    matrix: &MatrixConfig,
    bench: &Bench,
    footprint: u64,
    copy_ceiling_gbps: f64,
    mut progress: impl FnMut(&ReplayRow),
) -> Result<Vec<ReplayRow>, String> {
    let mut rows = Vec::new();
    let mut kernel = KERNEL;
    for &tier in &config.tiers {
        let full_restore = full_restore_seconds(bench, tier, matrix.chunk_size)?;
        let control = config
            .has_control()
            .then_some((RestoreStrategy::Full, true));
        let snapshotters = config
            .strategies
            .iter()
            .map(|&strategy| (strategy, false))
            .chain(control)
            .map(|(strategy, control)| {
                snapshotter(bench, strategy, tier, matrix.chunk_size)
                    .map(|s| ((strategy, control), s))
            })
            .collect::<Result<Vec<_>, String>>()?;
        // Only their kept stores are wanted: each snapshot is dropped at once.
        for (_, snapshotter) in &snapshotters {
            drop(
                snapshotter
                    .snapshot(&Filter::for_replay(1))
                    .map_err(|e| e.to_string())?,
            );
        }
        let dispatches = config.dispatches.max(2);
        let mut cell = 0u64;
        for &fraction in &config.dirty_fractions {
            for &pattern in &config.patterns {
                for &passes in &config.passes {
                    let repeats = config.repeats_for(passes);
                    cell += 1;
                    let mut samples: Vec<Samples> =
                        snapshotters.iter().map(|_| Samples::default()).collect();
                    for (_, snapshotter) in &snapshotters {
                        kernel += 1;
                        replay_once(
                            bench,
                            snapshotter,
                            kernel,
                            pattern,
                            fraction,
                            0,
                            passes,
                            &mut Choices::default(),
                        )?;
                        snapshotter.stop_following();
                    }
                    for rep in 0..repeats {
                        for s in order(snapshotters.len(), cell, rep) {
                            kernel += 1;
                            // Each sequence starts with nothing followed, and ends following
                            // nothing: stopping to follow what its replays kept followed (see
                            // `Snapshotter::following`) is charged to its last dispatch.
                            for d in 0..dispatches as u64 {
                                let t = replay_once(
                                    bench,
                                    &snapshotters[s].1,
                                    kernel,
                                    pattern,
                                    fraction,
                                    d,
                                    passes,
                                    &mut samples[s].choices,
                                )?
                                .as_secs_f64();
                                if d == 0 {
                                    samples[s].first.push(t);
                                } else {
                                    samples[s].later.push(t);
                                }
                            }
                            let start = Instant::now();
                            snapshotters[s].1.stop_following();
                            let end = start.elapsed().as_secs_f64();
                            if let Some(last) = samples[s].later.last_mut() {
                                *last += end;
                            }
                        }
                    }
                    for (((strategy, control), _), sample) in snapshotters.iter().zip(&samples) {
                        let (first_median, first_range) = median_and_range(&sample.first);
                        let (later_median, later_range) = median_and_range(&sample.later);
                        let row = ReplayRow {
                            footprint,
                            dirty_fraction: fraction,
                            pattern,
                            passes,
                            tier,
                            strategy: *strategy,
                            control: *control,
                            first_seconds: low_quartile(&sample.first),
                            first_range,
                            first_median,
                            later_seconds: low_quartile(&sample.later),
                            later_range,
                            later_median,
                            first_times: sample.first.clone(),
                            later_times: sample.later.clone(),
                            repeats,
                            dispatches,
                            choices: sample.choices,
                            full_restore_seconds: full_restore,
                            copy_ceiling_gbps,
                        };
                        progress(&row);
                        rows.push(row);
                    }
                }
            }
        }
        for (_, snapshotter) in &snapshotters {
            snapshotter.release_cached_store();
        }
    }
    Ok(rows)
}

/// `auto` may cost at most this much more than the best verified fixed strategy in a cell.
pub const AUTO_MAX_OVER_BEST: f64 = 1.10;

/// The verified fixed strategies `auto` is held against.
fn is_fixed_verified(s: RestoreStrategy) -> bool {
    matches!(
        s,
        RestoreStrategy::Full
            | RestoreStrategy::Hash
            | RestoreStrategy::Writeset
            | RestoreStrategy::Tracked
    )
}

/// One verdict of the auto target: a cell (footprint, dirty, pattern, N) and dispatch kind.
#[derive(Clone, Debug, PartialEq)]
pub struct AutoCheck {
    /// `first`, `later` or `sequence` (a whole dispatch sequence: the first dispatch and the
    /// later ones of the same repetition, summed).
    pub dispatch: &'static str,
    /// Whether the target judges this check: the sequences. What one dispatch pays to set up
    /// what the next ones reuse (a write set learned, a footprint kept followed) is repaid in
    /// the same sequence, so first and later dispatches are shown apart but judged together.
    pub judged: bool,
    /// The cell.
    pub cell: String,
    /// auto's figure / the best verified fixed strategy's figure (lower quartiles; shown, not
    /// judged).
    pub ratio: f64,
    /// The same with medians (shown, not judged): auto's median / the lowest median of the
    /// verified fixed strategies.
    pub median_ratio: f64,
    /// The best strategy (the lowest figure: lower quartiles).
    pub best: RestoreStrategy,
    /// auto's slowest repetition / its fastest.
    pub auto_spread: f64,
    /// The best strategy's slowest repetition / its fastest.
    pub best_spread: f64,
    /// auto's slowest repetition / the best strategy's figure.
    pub worst_ratio: f64,
    /// What the target judges: against each verified fixed strategy, the median over the
    /// repetitions of auto's time / that strategy's time in the same repetition; of those, the
    /// largest (against [`AutoCheck::paired_best`]). The two ran within one repetition, so a
    /// drift of the machine's speed between repetitions falls on both, where the lower
    /// quartiles of two strategies can fall in minutes of different speed: `full` measured
    /// twice (the control) strayed by up to 1.40x by lower quartiles and at most 1.08x paired
    /// over five runs of the bench on the 2-core development machine.
    pub paired_ratio: f64,
    /// The strategy auto compares worst against, paired: the best one by that comparison.
    pub paired_best: RestoreStrategy,
}

/// The median of `a[i] / b[i]` over the pairs (NaN when there are none).
fn paired_median(a: &[f64], b: &[f64]) -> f64 {
    let ratios: Vec<f64> = a.iter().zip(b).map(|(x, y)| x / y).collect();
    median_and_range(&ratios).0
}

/// Slowest / fastest of a range.
fn spread((lo, hi): (f64, f64)) -> f64 {
    hi / lo
}

/// auto against the best verified fixed strategy in every cell where both were measured: paired
/// per repetition against each of them (judged, see [`AutoCheck::paired_ratio`]), and by the
/// lower quartiles and medians of the repetitions (shown).
pub fn check_auto(rows: &[ReplayRow]) -> Vec<AutoCheck> {
    compare_in_cells(
        rows,
        |r| r.strategy == RestoreStrategy::Auto && !r.control,
        |r| is_fixed_verified(r.strategy) && !r.control,
    )
}

/// The control against `full` in every cell where both were measured, by the same statistics
/// as [`check_auto`]: the same work measured twice, so its ratio is 1 but for the moment each
/// was measured, and how far it strays is how far the auto check can stray by measurement alone.
pub fn check_control(rows: &[ReplayRow]) -> Vec<AutoCheck> {
    compare_in_cells(
        rows,
        |r| r.control,
        |r| r.strategy == RestoreStrategy::Full && !r.control,
    )
}

/// Every `subject` row against the cheapest `reference` row of its cell (footprint, dirty
/// fraction, pattern, passes, tier), first and later dispatches apart.
fn compare_in_cells(
    rows: &[ReplayRow],
    subject: impl Fn(&ReplayRow) -> bool,
    reference: impl Fn(&ReplayRow) -> bool,
) -> Vec<AutoCheck> {
    type Pick = fn(&ReplayRow) -> (f64, (f64, f64), f64, Vec<f64>);
    let mut checks = Vec::new();
    for auto in rows.iter().filter(|r| subject(r)) {
        let same = |r: &&ReplayRow| {
            r.footprint == auto.footprint
                && r.dirty_fraction == auto.dirty_fraction
                && r.pattern == auto.pattern
                && r.passes == auto.passes
                && r.tier == auto.tier
                && reference(r)
        };
        let cell = format!(
            "{} {} {} {} N={}",
            format_bytes(auto.footprint),
            auto.tier,
            format_percent(auto.dirty_fraction),
            auto.pattern,
            auto.passes
        );
        let picks: [(&'static str, Pick); 3] = [
            ("first", |r| {
                (
                    r.first_seconds,
                    r.first_range,
                    r.first_median,
                    r.first_times.clone(),
                )
            }),
            ("later", |r| {
                (
                    r.later_seconds,
                    r.later_range,
                    r.later_median,
                    r.later_times.clone(),
                )
            }),
            ("sequence", |r| {
                let times = r.sequence_times();
                let (median, range) = median_and_range(&times);
                (low_quartile(&times), range, median, times)
            }),
        ];
        for (dispatch, time) in picks {
            if let Some(best) = rows
                .iter()
                .filter(same)
                .min_by(|a, b| time(a).0.total_cmp(&time(b).0))
            {
                let (auto_figure, auto_range, auto_median, auto_times) = time(auto);
                let (best_figure, best_range, _, _) = time(best);
                let (paired_ratio, paired_best) = rows
                    .iter()
                    .filter(same)
                    .map(|r| (paired_median(&auto_times, &time(r).3), r.strategy))
                    .max_by(|a, b| a.0.total_cmp(&b.0))
                    .unwrap_or((f64::NAN, best.strategy));
                let best_median = rows
                    .iter()
                    .filter(same)
                    .map(|r| time(r).2)
                    .min_by(f64::total_cmp)
                    .unwrap_or(f64::NAN);
                checks.push(AutoCheck {
                    dispatch,
                    judged: dispatch == "sequence",
                    cell: cell.clone(),
                    ratio: auto_figure / best_figure,
                    median_ratio: auto_median / best_median,
                    best: best.strategy,
                    auto_spread: spread(auto_range),
                    best_spread: spread(best_range),
                    worst_ratio: auto_range.1 / best_figure,
                    paired_ratio,
                    paired_best,
                });
            }
        }
    }
    checks
}

/// Columns of the per-replay table with their minimum widths (see [`crate::table_header`]).
const REPLAY_COLUMNS: [(&str, usize); 18] = [
    ("footprint", 9),
    ("dirty", 5),
    ("pattern", 15),
    ("N", 2),
    ("tier", 6),
    ("strategy", 19),
    ("first dispatch", 14),
    ("spread", 6),
    ("median", 10),
    ("/N full", 7),
    ("later dispatch", 14),
    ("spread", 6),
    ("median", 10),
    ("/N full", 7),
    ("N full restores", 15),
    ("N copies at ceiling", 19),
    ("hashed snapshots", 16),
    ("restores full/hash/set/tracked", 30),
];

fn replay_line(fields: &[String]) -> String {
    let widths = REPLAY_COLUMNS.map(|(h, w)| w.max(h.len()));
    let mut line = String::from("  ");
    line += &crate::output::fixed_line(fields, &widths, &[0, 1, 2, 3, 4, 5]);
    line
}

/// The header line of the per-replay table.
pub fn replay_table_header() -> String {
    replay_line(&REPLAY_COLUMNS.map(|(h, _)| h.to_string()))
}

/// One row of the per-replay table, aligned under [`replay_table_header`].
pub fn replay_table_line(r: &ReplayRow) -> String {
    replay_line(&[
        format_bytes(r.footprint),
        format_percent(r.dirty_fraction),
        r.pattern.to_string(),
        r.passes.to_string(),
        r.tier.to_string(),
        if r.control {
            format!("{} (control)", r.strategy)
        } else {
            r.strategy.to_string()
        },
        format_seconds(r.first_seconds),
        format!("{:.3}", spread(r.first_range)),
        format_seconds(r.first_median),
        format!("{:.3}", r.first_seconds / r.n_full()),
        format_seconds(r.later_seconds),
        format!("{:.3}", spread(r.later_range)),
        format_seconds(r.later_median),
        format!("{:.3}", r.later_seconds / r.n_full()),
        format_seconds(r.n_full()),
        format_seconds(r.n_ceiling()),
        format!("{}/{}", r.choices.hashed_snapshots, r.choices.dispatches),
        format!(
            "{}/{}/{}/{}",
            r.choices.full, r.choices.hash, r.choices.writeset, r.choices.tracked
        ),
    ])
}

/// The per-replay table: [`replay_table_header`] and a [`replay_table_line`] per row.
pub fn format_replay_table(rows: &[ReplayRow]) -> String {
    let mut out = replay_table_header();
    for r in rows {
        out += &replay_table_line(r);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_pick_the_requested_share_same_or_different_scattered_or_contiguous() {
        for pattern in Pattern::ALL {
            let a = pattern.chunks(1000, 0.05, 0, 0);
            let b = pattern.chunks(1000, 0.05, 1, 3);
            assert_eq!((a.len(), b.len()), (50, 50), "{pattern}");
            let same = matches!(pattern, Pattern::SameScattered | Pattern::SameContiguous);
            assert_eq!(a == b, same, "{pattern}");
            let contiguous = a.windows(2).all(|w| w[1] == w[0] + 1);
            assert_eq!(
                contiguous,
                matches!(
                    pattern,
                    Pattern::SameContiguous | Pattern::DifferentContiguous
                ),
                "{pattern}"
            );
            assert!(a.iter().all(|&c| c < 1000));
        }
    }

    #[test]
    fn medians_take_the_middle_and_ranges_the_extremes() {
        assert_eq!(median_and_range(&[3.0, 1.0, 2.0]), (2.0, (1.0, 3.0)));
        assert_eq!(median_and_range(&[4.0, 1.0, 2.0, 3.0]), (2.5, (1.0, 4.0)));
        assert_eq!(median_and_range(&[7.0]), (7.0, (7.0, 7.0)));
        assert!(median_and_range(&[]).0.is_nan());
    }

    #[test]
    fn the_figure_is_the_lower_quartile_of_the_repetitions() {
        assert_eq!(low_quartile(&[5.0, 1.0, 3.0, 2.0, 4.0]), 2.0);
        assert_eq!(
            low_quartile(&[7.0, 6.0, 5.0, 4.0, 3.0, 2.0, 1.0]),
            2.5,
            "between the 2nd and 3rd fastest"
        );
        assert_eq!(low_quartile(&[3.0, 1.0, 2.0]), 1.5);
        assert_eq!(low_quartile(&[9.0]), 9.0);
        assert!(low_quartile(&[]).is_nan());
        // One repetition slowed by another process does not move it; one lucky one barely.
        assert_eq!(low_quartile(&[2.0, 2.0, 2.0, 2.0, 9.0]), 2.0);
        assert_eq!(low_quartile(&[1.0, 2.0, 2.0, 2.0, 2.0]), 2.0);
    }

    #[test]
    fn the_words_for_the_lower_quartile_name_the_repetitions_it_takes() {
        assert_eq!(low_quartile_words(9), "the 3rd fastest");
        assert_eq!(
            low_quartile(&[9.0, 8.0, 7.0, 6.0, 5.0, 4.0, 3.0, 2.0, 1.0]),
            3.0
        );
        assert_eq!(low_quartile_words(7), "the mean of the 2nd and 3rd fastest");
        assert_eq!(low_quartile_words(5), "the 2nd fastest");
        assert_eq!(
            low_quartile_words(3),
            "the mean of the fastest and 2nd fastest"
        );
        assert_eq!(low_quartile_words(1), "the fastest");
        assert_eq!(low_quartile_words(6), "between the 2nd and the 3rd fastest");
    }

    #[test]
    fn strategies_replay_in_every_position_and_after_every_other() {
        let n = 5;
        let mut positions = vec![[false; 5]; n];
        let mut after = vec![[false; 5]; n];
        for cell in 0..4 {
            for rep in 0..7 {
                let o = order(n, cell, rep);
                let mut sorted = o.clone();
                sorted.sort();
                assert_eq!(sorted, (0..n).collect::<Vec<_>>(), "a permutation");
                assert_eq!(
                    o,
                    order(n, cell, rep),
                    "the same run replays the same order"
                );
                for (i, &s) in o.iter().enumerate() {
                    positions[s][i] = true;
                    if i > 0 {
                        after[s][o[i - 1]] = true;
                    }
                }
            }
        }
        for s in 0..n {
            assert!(
                positions[s].iter().all(|&p| p),
                "strategy {s}: {positions:?}"
            );
            let followed = (0..n).filter(|&t| t != s && after[s][t]).count();
            assert_eq!(followed, n - 1, "strategy {s} after every other: {after:?}");
        }
    }

    #[test]
    fn auto_is_held_against_the_best_verified_fixed_strategy_of_its_cell() {
        let row = |strategy, first: f64, later: f64| ReplayRow {
            first_seconds: first,
            first_range: (first * 0.9, first * 1.2),
            first_median: first * 1.1,
            later_seconds: later,
            later_range: (later, later * 1.1),
            later_median: later,
            first_times: vec![first * 0.9, first, first * 1.2],
            later_times: vec![later, later * 1.1, later],
            repeats: 5,
            ..cell_row(strategy, &[first])
        };
        let rows = vec![
            row(RestoreStrategy::Full, 4.0, 4.0),
            row(RestoreStrategy::Hash, 2.0, 2.0),
            row(RestoreStrategy::Writeset, 2.5, 1.5),
            row(RestoreStrategy::WritesetUnverified, 0.1, 0.1),
            row(RestoreStrategy::Auto, 2.1, 1.8),
        ];
        let checks = check_auto(&rows);
        assert_eq!(checks.len(), 3);
        // Judged: the whole sequence of each repetition (first + later dispatches summed).
        let seq = &checks[2];
        assert_eq!((seq.dispatch, seq.judged), ("sequence", true));
        assert!(
            !checks[0].judged && !checks[1].judged,
            "first and later are shown"
        );
        assert_eq!(
            rows[4].sequence_times(),
            vec![2.1 * 0.9 + 1.8, 2.1 + 1.8 * 1.1, 2.1 * 1.2 + 1.8]
        );
        let best_sequence = rows[..3]
            .iter()
            .map(|r| low_quartile(&r.sequence_times()))
            .fold(f64::INFINITY, f64::min);
        assert!((seq.ratio - low_quartile(&rows[4].sequence_times()) / best_sequence).abs() < 1e-9);
        assert_eq!(
            checks[0].best,
            RestoreStrategy::Hash,
            "unverified never counts"
        );
        assert!((checks[0].ratio - 1.05).abs() < 1e-9);
        // Medians are compared too, shown beside: auto 2.31 against hash's 2.2.
        assert!((checks[0].median_ratio - 1.05).abs() < 1e-9);
        assert_eq!(checks[1].best, RestoreStrategy::Writeset);
        assert!((checks[1].ratio - 1.2).abs() < 1e-9);
        // auto's spread and its slowest repetition against the best's median are shown too.
        assert!((checks[0].auto_spread - 1.2 / 0.9).abs() < 1e-9);
        assert!((checks[0].worst_ratio - 2.1 * 1.2 / 2.0).abs() < 1e-9);
        assert!((checks[1].best_spread - 1.1).abs() < 1e-9);
        assert!(format_replay_table(&rows).contains("N copies at ceiling"));
        // A control row is neither auto nor a strategy auto is held against.
        let mut with_control = rows.clone();
        with_control.push(ReplayRow {
            control: true,
            ..row(RestoreStrategy::Full, 0.05, 0.05)
        });
        assert_eq!(check_auto(&with_control), checks);
        let control = check_control(&with_control);
        assert_eq!(control.len(), 3);
        assert_eq!(control[0].best, RestoreStrategy::Full);
        assert!((control[0].ratio - 0.05 / 4.0).abs() < 1e-9);
        assert!(format_replay_table(&with_control).contains("full (control)"));
    }

    /// A row of one cell (1% same-scattered, 4 passes, host) whose first and later dispatches
    /// each took `times` in the repetitions.
    fn cell_row(strategy: RestoreStrategy, times: &[f64]) -> ReplayRow {
        let (median, range) = median_and_range(times);
        ReplayRow {
            footprint: 1 << 20,
            dirty_fraction: 0.01,
            pattern: Pattern::SameScattered,
            passes: 4,
            tier: StoreTier::Host,
            strategy,
            control: false,
            first_seconds: low_quartile(times),
            first_range: range,
            first_median: median,
            later_seconds: low_quartile(times),
            later_range: range,
            later_median: median,
            first_times: times.to_vec(),
            later_times: times.to_vec(),
            repeats: times.len(),
            dispatches: 2,
            choices: Choices::default(),
            full_restore_seconds: 1.0,
            copy_ceiling_gbps: 10.0,
        }
    }

    #[test]
    fn auto_is_judged_paired_per_repetition_against_every_verified_strategy() {
        use RestoreStrategy::{Auto, Full, Hash, Writeset};
        // hash ran in two fast moments auto did not share: by lower quartiles auto looks 1.31x
        // of it, paired it is 1.05x (and 0.70x of full).
        let hash = [0.8, 0.8, 1.0, 1.0, 1.0];
        let auto = [1.05; 5];
        let rows = vec![
            cell_row(Full, &[1.5; 5]),
            cell_row(Hash, &hash),
            cell_row(Auto, &auto),
        ];
        let seq = check_auto(&rows).into_iter().find(|c| c.judged).unwrap();
        assert!((seq.ratio - 1.05 / 0.8).abs() < 1e-9, "{seq:?}");
        assert!((seq.paired_ratio - 1.05).abs() < 1e-9, "{seq:?}");
        assert_eq!((seq.best, seq.paired_best), (Hash, Hash));
        // The write set beats auto by a sixth in most repetitions although hash has the
        // lowest quartile: auto is held against it.
        let mut rows = rows;
        rows.insert(2, cell_row(Writeset, &[1.0, 1.0, 0.9, 0.9, 0.9]));
        let seq = check_auto(&rows).into_iter().find(|c| c.judged).unwrap();
        assert_eq!((seq.best, seq.paired_best), (Hash, Writeset));
        assert!((seq.paired_ratio - 1.05 / 0.9).abs() < 1e-9, "{seq:?}");
        assert!(seq.paired_ratio > AUTO_MAX_OVER_BEST);
    }

    #[test]
    fn the_paired_ratio_divides_within_each_repetition_before_taking_the_median() {
        // The machine slowed down in the third repetition for both: unpaired, auto's slow
        // repetition would count against it; paired, every repetition says 1.05.
        let auto = [1.05, 2.1, 4.2];
        let best = [1.0, 2.0, 4.0];
        assert!((paired_median(&auto, &best) - 1.05).abs() < 1e-12);
        assert!((paired_median(&[3.0, 1.0, 2.0], &[1.0, 1.0, 1.0]) - 2.0).abs() < 1e-12);
        assert!(paired_median(&[], &[]).is_nan());
    }
}
