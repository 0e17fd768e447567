//! The cost of whole replays: snapshot plus every restore of an N-pass replay (learning and
//! verification included), per strategy, for a first dispatch of a kernel and for later
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
    /// Independent dispatch sequences per cell of up to [`ReplayConfig::long_passes`] passes,
    /// each on a kernel nothing was learned about: the first dispatch of a cell is the best of
    /// the sequences' first dispatches, the later dispatch the best of all their later ones.
    pub sequences: usize,
    /// Replays of more passes than this are long: they get [`ReplayConfig::long_sequences`]
    /// sequences per cell instead (their many restores already average out noise).
    pub long_passes: u64,
    /// Sequences per cell of a long replay (at least 1).
    pub long_sequences: usize,
    /// Dispatches of the kernel per sequence: the first is cold, the later ones reuse what the
    /// earlier ones learned (at least 2).
    pub dispatches: usize,
    /// The store tiers.
    pub tiers: Vec<StoreTier>,
}

impl ReplayConfig {
    /// Sequences measured per cell of `passes` passes (at least 1).
    pub fn sequences_for(&self, passes: u64) -> usize {
        if passes > self.long_passes {
            self.long_sequences.max(1)
        } else {
            self.sequences.max(1)
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
                RestoreStrategy::Auto,
                RestoreStrategy::WritesetUnverified,
            ],
            patterns: Pattern::ALL.to_vec(),
            sequences: 3,
            long_passes: 8,
            long_sequences: 1,
            dispatches: 2,
            tiers: vec![StoreTier::Host],
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
    /// Snapshot plus every restore of a kernel's first dispatch (nothing learned about that
    /// kernel before), the best of the cell's sequences.
    pub first_seconds: f64,
    /// The same for a later dispatch of the kernel (the best of the cell's later ones), reusing
    /// what the earlier dispatches learned.
    pub later_seconds: f64,
    /// Dispatch sequences measured (`first_seconds` is the best of their first dispatches).
    pub sequences: usize,
    /// Dispatches per sequence (`later_seconds` is the best of all but the first ones).
    pub dispatches: usize,
    /// What the snapshots and restores of every dispatch measured did.
    pub choices: Choices,
    /// One full restore of the footprint in the same tier, measured in the same run.
    pub full_restore_seconds: f64,
    /// The machine's copy ceiling, GB/s.
    pub copy_ceiling_gbps: f64,
}

impl ReplayRow {
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
}

impl Choices {
    /// Counts a restore by what it did (not by the strategy it reports: `auto` reports a
    /// learning hash pass as a write-set restore): no hashing and no learned set means full,
    /// hashing all of the snapshot's bytes means hash, anything else wrote the learned set.
    fn restore(&mut self, report: &RestoreReport, snapshot_bytes: u64) {
        if !report.verified && !report.unverified {
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
    let plan = snapshotter
        .plan(&Filter::for_replay(1))
        .map_err(|e| e.to_string())?;
    let start = Instant::now();
    let mut snapshot: Snapshot = snapshotter
        .take_for_kernel(plan, kernel)
        .map_err(|e| e.to_string())?;
    let mut spent = start.elapsed();
    choices.dispatches += 1;
    choices.hashed_snapshots += u64::from(snapshot.report().hashed);
    for pass in 0..passes {
        let written = pattern.chunks(chunks, fraction, dispatch, pass);
        bench
            .map
            .dirty(&bench.device, &written, dispatch * 1000 + pass + 1)
            .map_err(|e| e.to_string())?;
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
    drop(snapshot);
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

/// Measures every cell of `config` at `footprint` on `bench`; `copy_ceiling_gbps` is the
/// ceiling measured for that footprint; `progress` sees each row as soon as it is measured.
///
/// One snapshotter per tier and strategy lives through the footprint (it keeps the machine's
/// measured rates, as a process's snapshotter does), but only one of them holds a store at a
/// time: a strategy's store is allocated and faulted in by an untimed snapshot (a process pays
/// that once, not per dispatch) before its replays of a (dirty, pattern) block and released
/// after them, so the memory used stays at the footprint plus one store. Every cell replays
/// another kernel, so each cell's first dispatch has nothing learned before it.
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
        let snapshotters = config
            .strategies
            .iter()
            .map(|&strategy| {
                snapshotter(bench, strategy, tier, matrix.chunk_size).map(|s| (strategy, s))
            })
            .collect::<Result<Vec<_>, String>>()?;
        for &fraction in &config.dirty_fractions {
            for &pattern in &config.patterns {
                for (strategy, snapshotter) in &snapshotters {
                    drop(
                        snapshotter
                            .snapshot(&Filter::for_replay(1))
                            .map_err(|e| e.to_string())?,
                    );
                    for &passes in &config.passes {
                        let sequences = config.sequences_for(passes);
                        let dispatches = config.dispatches.max(2);
                        let mut first = f64::INFINITY;
                        let mut later = f64::INFINITY;
                        let mut choices = Choices::default();
                        for _ in 0..sequences {
                            kernel += 1;
                            for d in 0..dispatches as u64 {
                                let t = replay_once(
                                    bench,
                                    snapshotter,
                                    kernel,
                                    pattern,
                                    fraction,
                                    d,
                                    passes,
                                    &mut choices,
                                )?
                                .as_secs_f64();
                                if d == 0 {
                                    first = first.min(t);
                                } else {
                                    later = later.min(t);
                                }
                            }
                        }
                        let row = ReplayRow {
                            footprint,
                            dirty_fraction: fraction,
                            pattern,
                            passes,
                            tier,
                            strategy: *strategy,
                            first_seconds: first,
                            later_seconds: later,
                            sequences,
                            dispatches,
                            choices,
                            full_restore_seconds: full_restore,
                            copy_ceiling_gbps,
                        };
                        progress(&row);
                        rows.push(row);
                    }
                    snapshotter.release_cached_store();
                }
            }
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
        RestoreStrategy::Full | RestoreStrategy::Hash | RestoreStrategy::Writeset
    )
}

/// One verdict of the auto target: a cell (footprint, dirty, pattern, N) and dispatch kind.
#[derive(Clone, Debug, PartialEq)]
pub struct AutoCheck {
    /// `first` or `later`.
    pub dispatch: &'static str,
    /// The cell.
    pub cell: String,
    /// auto's time / the best verified fixed strategy's time.
    pub ratio: f64,
    /// The best strategy.
    pub best: RestoreStrategy,
}

/// auto against the best verified fixed strategy in every cell where both were measured.
pub fn check_auto(rows: &[ReplayRow]) -> Vec<AutoCheck> {
    let mut checks = Vec::new();
    for auto in rows.iter().filter(|r| r.strategy == RestoreStrategy::Auto) {
        let same = |r: &&ReplayRow| {
            r.footprint == auto.footprint
                && r.dirty_fraction == auto.dirty_fraction
                && r.pattern == auto.pattern
                && r.passes == auto.passes
                && r.tier == auto.tier
                && is_fixed_verified(r.strategy)
        };
        let cell = format!(
            "{} {} {} {} N={}",
            format_bytes(auto.footprint),
            auto.tier,
            format_percent(auto.dirty_fraction),
            auto.pattern,
            auto.passes
        );
        for (dispatch, time) in [
            (
                "first",
                (|r: &ReplayRow| r.first_seconds) as fn(&ReplayRow) -> f64,
            ),
            ("later", |r: &ReplayRow| r.later_seconds),
        ] {
            if let Some(best) = rows
                .iter()
                .filter(same)
                .min_by(|a, b| time(a).total_cmp(&time(b)))
            {
                checks.push(AutoCheck {
                    dispatch,
                    cell: cell.clone(),
                    ratio: time(auto) / time(best),
                    best: best.strategy,
                });
            }
        }
    }
    checks
}

/// Columns of the per-replay table with their minimum widths (see [`crate::table_header`]).
const REPLAY_COLUMNS: [(&str, usize); 14] = [
    ("footprint", 9),
    ("dirty", 5),
    ("pattern", 15),
    ("N", 2),
    ("tier", 6),
    ("strategy", 19),
    ("first dispatch", 14),
    ("/N full", 7),
    ("later dispatch", 14),
    ("/N full", 7),
    ("N full restores", 15),
    ("N copies at ceiling", 19),
    ("hashed snapshots", 16),
    ("restores full/hash/set", 22),
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
        r.strategy.to_string(),
        format_seconds(r.first_seconds),
        format!("{:.3}", r.first_seconds / r.n_full()),
        format_seconds(r.later_seconds),
        format!("{:.3}", r.later_seconds / r.n_full()),
        format_seconds(r.n_full()),
        format_seconds(r.n_ceiling()),
        format!("{}/{}", r.choices.hashed_snapshots, r.choices.dispatches),
        format!(
            "{}/{}/{}",
            r.choices.full, r.choices.hash, r.choices.writeset
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
    fn auto_is_held_against_the_best_verified_fixed_strategy_of_its_cell() {
        let row = |strategy, first: f64, later: f64| ReplayRow {
            footprint: 1 << 20,
            dirty_fraction: 0.01,
            pattern: Pattern::SameScattered,
            passes: 4,
            tier: StoreTier::Host,
            strategy,
            first_seconds: first,
            later_seconds: later,
            sequences: 3,
            dispatches: 2,
            choices: Choices::default(),
            full_restore_seconds: 1.0,
            copy_ceiling_gbps: 10.0,
        };
        let rows = vec![
            row(RestoreStrategy::Full, 4.0, 4.0),
            row(RestoreStrategy::Hash, 2.0, 2.0),
            row(RestoreStrategy::Writeset, 2.5, 1.5),
            row(RestoreStrategy::WritesetUnverified, 0.1, 0.1),
            row(RestoreStrategy::Auto, 2.1, 1.8),
        ];
        let checks = check_auto(&rows);
        assert_eq!(checks.len(), 2);
        assert_eq!(
            checks[0].best,
            RestoreStrategy::Hash,
            "unverified never counts"
        );
        assert!((checks[0].ratio - 1.05).abs() < 1e-9);
        assert_eq!(checks[1].best, RestoreStrategy::Writeset);
        assert!((checks[1].ratio - 1.2).abs() < 1e-9);
        assert!(format_replay_table(&rows).contains("N copies at ceiling"));
    }
}
