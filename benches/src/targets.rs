//! The snapshot and restore targets of kreplay's design, evaluated from the rows of one matrix
//! run: every verdict compares figures measured in that same run.

use std::fmt;

use kreplay_snapshot::{RestoreStrategy, StoreTier};

use crate::matrix::{BenchRow, MatrixConfig, Operation};
use crate::output::{format_bytes, format_seconds};
use crate::paired::{PAIRED_STATISTIC, PairedRatio, median};

/// Full snapshot and restore must reach this fraction of the machine's copy ceiling.
pub const FULL_COPY_MIN_RATIO: f64 = 0.85;
/// Hash detection must reach this fraction of the machine's read ceiling.
pub const DETECTION_MIN_RATIO: f64 = 0.85;
/// A hash restore at 1% dirty may cost the hash pass plus this many copies of the dirty bytes.
pub const HASH_RESTORE_COPY_FACTOR: f64 = 1.5;
/// The changed fraction of the hash restore target.
pub const HASH_RESTORE_DIRTY: f64 = 0.01;
/// A write-set restore at 1% dirty may cost at most this fraction of a full restore.
pub const WRITESET_MAX_RATIO: f64 = 0.1;
/// A write-set restore at 0% dirty must cost less than this fraction of a full restore.
pub const WRITESET_IDLE_MAX_RATIO: f64 = 0.01;

/// One performance target.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Target {
    /// Full snapshot and full restore at >= 85% of the copy ceiling.
    FullCopy,
    /// Hash detection (a hash restore with nothing dirty) at >= 85% of the read ceiling.
    HashDetection,
    /// A hash restore at 1% dirty costs at most the hash pass plus 1.5 copies of the dirty bytes.
    HashRestore,
    /// A write-set restore at 1% dirty costs at most 1/10 of a full restore.
    WritesetRestore,
    /// A write-set restore at 0% dirty costs less than 1% of a full restore.
    WritesetIdle,
}

impl Target {
    /// Every target, in the order they are reported.
    pub const ALL: [Target; 5] = [
        Target::FullCopy,
        Target::HashDetection,
        Target::HashRestore,
        Target::WritesetRestore,
        Target::WritesetIdle,
    ];

    /// The target in words.
    pub fn describe(self) -> &'static str {
        match self {
            Target::FullCopy => "full snapshot/restore >= 85% of the copy ceiling",
            Target::HashDetection => "hash detection >= 85% of the read ceiling",
            Target::HashRestore => {
                "hash restore at 1% dirty <= hash pass + 1.5x copy of the dirty bytes"
            }
            Target::WritesetRestore => {
                "write-set (learned or tracked) restore at 1% dirty <= 1/10 of full restore"
            }
            Target::WritesetIdle => {
                "write-set (learned or tracked) restore at 0% dirty < 1% of full restore"
            }
        }
    }

    /// What a run must include for the target to be evaluated.
    pub fn needs(self) -> &'static str {
        match self {
            Target::FullCopy => "strategy full, paired with the copy ceiling",
            Target::HashDetection => "strategy hash, paired with the read ceiling",
            Target::HashRestore => "strategy hash, paired with the hash pass",
            Target::WritesetRestore => "strategies full and writeset or tracked and dirty 1%",
            Target::WritesetIdle => "strategies full and writeset or tracked and dirty 0%",
        }
    }
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.describe())
    }
}

/// The verdict on one target at one footprint and store tier.
#[derive(Clone, Debug, PartialEq)]
pub struct TargetCheck {
    /// The target.
    pub target: Target,
    /// The footprint (`None` when the target could not be evaluated at all).
    pub footprint: Option<u64>,
    /// The store tier (`None` when the target could not be evaluated at all).
    pub tier: Option<StoreTier>,
    /// `Some(true)` met, `Some(false)` not met, `None` not evaluated.
    pub met: Option<bool>,
    /// The measured numbers and the limit they were held to (or why nothing was evaluated).
    pub detail: String,
}

impl TargetCheck {
    /// `met`, `NOT MET` or `not evaluated`.
    pub fn verdict(&self) -> &'static str {
        match self.met {
            Some(true) => "met",
            Some(false) => "NOT MET",
            None => "not evaluated",
        }
    }
}

fn same(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-9
}

/// Lookup of rows by what they measured.
struct Rows<'a>(&'a [BenchRow], &'a [PairedRatio]);

impl<'a> Rows<'a> {
    fn find(
        &self,
        footprint: u64,
        tier: StoreTier,
        strategy: RestoreStrategy,
        operation: Operation,
        dirty: f64,
    ) -> Option<&'a BenchRow> {
        self.0.iter().find(|r| {
            r.footprint == footprint
                && r.tier == Some(tier)
                && r.strategy == Some(strategy)
                && r.operation == operation
                && same(r.dirty_fraction, dirty)
        })
    }

    fn paired(
        &self,
        footprint: u64,
        tier: StoreTier,
        operation: Operation,
        strategy: RestoreStrategy,
    ) -> Option<&'a PairedRatio> {
        self.1.iter().find(|p| {
            p.footprint == footprint
                && p.tier == tier
                && p.operation == operation
                && p.strategy == strategy.to_string()
        })
    }

    fn ceiling(&self, footprint: u64, operation: Operation) -> Option<&'a BenchRow> {
        self.0
            .iter()
            .find(|r| r.footprint == footprint && r.operation == operation)
    }

    /// The store tiers measured at `footprint`, in the order they appear.
    fn tiers(&self, footprint: u64) -> Vec<StoreTier> {
        let mut tiers = Vec::new();
        for r in self.0.iter().filter(|r| r.footprint == footprint) {
            if let Some(tier) = r.tier
                && !tiers.contains(&tier)
            {
                tiers.push(tier);
            }
        }
        tiers
    }
}

/// The verdict (`met`) and the detail line of one target at one footprint and tier, or `None`
/// when the rows it needs are missing.
fn evaluate(
    target: Target,
    config: &MatrixConfig,
    rows: &Rows<'_>,
    footprint: u64,
    tier: StoreTier,
) -> Option<(bool, String)> {
    use RestoreStrategy::{Full, Hash, Tracked, Writeset};
    let find = |strategy, operation, dirty| rows.find(footprint, tier, strategy, operation, dirty);
    match target {
        Target::FullCopy => {
            let snapshot = rows.paired(footprint, tier, Operation::Snapshot, Full)?;
            let restore = rows.paired(footprint, tier, Operation::Restore, Full)?;
            let worst = snapshot.ratio().min(restore.ratio());
            Some((
                worst >= FULL_COPY_MIN_RATIO,
                format!(
                    "snapshot {:.2} GB/s vs copy ceiling {:.2} GB/s = {:.2}x, full restore {:.2} \
                     GB/s vs {:.2} GB/s = {:.2}x ({PAIRED_STATISTIC}s of {} passes of each side \
                     taken in turn; copy ceiling by {}); need >= {FULL_COPY_MIN_RATIO:.2}x",
                    snapshot.row_gbps(),
                    snapshot.ceiling_gbps(),
                    snapshot.ratio(),
                    restore.row_gbps(),
                    restore.ceiling_gbps(),
                    restore.ratio(),
                    restore.samples().min(snapshot.samples()),
                    restore.ceiling_method,
                ),
            ))
        }
        Target::HashDetection => {
            let detect = rows.paired(footprint, tier, Operation::Detect, Hash)?;
            Some((
                detect.ratio() >= DETECTION_MIN_RATIO,
                format!(
                    "hash pass {:.2} GB/s vs read ceiling {:.2} GB/s = {:.2}x \
                     ({PAIRED_STATISTIC}s of {} passes of each side taken in turn; read ceiling \
                     by {}); need >= {DETECTION_MIN_RATIO:.2}x",
                    detect.row_gbps(),
                    detect.ceiling_gbps(),
                    detect.ratio(),
                    detect.samples(),
                    detect.ceiling_method,
                ),
            ))
        }
        Target::HashRestore => {
            let pair = rows.paired(footprint, tier, Operation::Restore, Hash)?;
            let memcpy = rows.ceiling(footprint, Operation::Memcpy)?;
            let dirty = config.dirty_bytes(footprint, HASH_RESTORE_DIRTY);
            let copy = dirty as f64 / (memcpy.gbps * 1e9);
            let (restore, pass) = (median(&pair.row_seconds), median(&pair.ceiling_seconds));
            let limit = pass + HASH_RESTORE_COPY_FACTOR * copy;
            Some((
                restore <= limit,
                format!(
                    "restore {} vs limit {} = hash pass {} + {HASH_RESTORE_COPY_FACTOR} x copy of \
                     {} at memcpy {:.2} GB/s ({}) ({PAIRED_STATISTIC}s of {} restores after 1% \
                     changed and {} after nothing changed, taken in turn)",
                    format_seconds(restore),
                    format_seconds(limit),
                    format_seconds(pass),
                    format_bytes(dirty),
                    memcpy.gbps,
                    format_seconds(copy),
                    pair.row_seconds.len(),
                    pair.ceiling_seconds.len(),
                ),
            ))
        }
        Target::WritesetRestore | Target::WritesetIdle => {
            let (dirty, max, strict) = if target == Target::WritesetRestore {
                (0.01, WRITESET_MAX_RATIO, false)
            } else {
                (0.0, WRITESET_IDLE_MAX_RATIO, true)
            };
            // Restores that write back what a pass wrote: the learned write set (verified),
            // or the pages followed as written (tracked); the cheaper of those measured.
            let set = [Writeset, Tracked]
                .into_iter()
                .filter_map(|s| find(s, Operation::Restore, dirty))
                .min_by(|a, b| a.seconds.total_cmp(&b.seconds))?;
            let full = find(Full, Operation::Restore, dirty)?;
            let ratio = set.seconds / full.seconds;
            let met = if strict { ratio < max } else { ratio <= max };
            let name = set.strategy.map_or("?", RestoreStrategy::as_str);
            Some((
                met,
                format!(
                    "{name} {} = {ratio:.4}x of full restore {}; need {} {max:.2}x",
                    format_seconds(set.seconds),
                    format_seconds(full.seconds),
                    if strict { "<" } else { "<=" }
                ),
            ))
        }
    }
}

/// Evaluates every [`Target`] at every footprint and store tier of `rows` and `paired` (the
/// results of [`crate::run_all`] with `config`). The targets held to a ceiling (full copies,
/// hash detection) are judged only from `paired`: each side timed equally often, in turn, by
/// one statistic. A target the run has no rows for yields one check with
/// `met: None` saying what the run must include.
///
/// ```
/// use kreplay_benches::{MatrixConfig, Target, check_targets, run_all};
/// use kreplay_snapshot::StoreTier;
///
/// let config = MatrixConfig {
///     footprints: vec![1 << 20],
///     dirty_fractions: vec![0.0, 0.01],
///     tiers: vec![StoreTier::Host],
///     chunk_size: 4096,
///     repeats: 1,
///     paired_samples: 3,
///     ..Default::default()
/// };
/// let results = run_all(&config, None, |_| {}).unwrap();
/// let checks = check_targets(&config, &results.rows, &results.paired);
/// assert_eq!(checks.len(), Target::ALL.len()); // one footprint, one tier
/// assert!(checks.iter().all(|c| c.met.is_some()));
/// ```
pub fn check_targets(
    config: &MatrixConfig,
    rows: &[BenchRow],
    paired: &[PairedRatio],
) -> Vec<TargetCheck> {
    let rows = Rows(rows, paired);
    let mut footprints: Vec<u64> = Vec::new();
    for r in rows.0 {
        if !footprints.contains(&r.footprint) {
            footprints.push(r.footprint);
        }
    }
    let mut checks = Vec::new();
    for target in Target::ALL {
        let before = checks.len();
        for &footprint in &footprints {
            for tier in rows.tiers(footprint) {
                if let Some((met, detail)) = evaluate(target, config, &rows, footprint, tier) {
                    checks.push(TargetCheck {
                        target,
                        footprint: Some(footprint),
                        tier: Some(tier),
                        met: Some(met),
                        detail,
                    });
                }
            }
        }
        if checks.len() == before {
            checks.push(TargetCheck {
                target,
                footprint: None,
                tier: None,
                met: None,
                detail: format!("this run lacks the rows it needs ({})", target.needs()),
            });
        }
    }
    checks
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::paired::HASH_PASS;

    const MIB: u64 = 1 << 20;

    fn row(
        strategy: Option<RestoreStrategy>,
        operation: Operation,
        dirty: f64,
        seconds: f64,
        ceiling_gbps: f64,
    ) -> BenchRow {
        let gbps = 64.0 * MIB as f64 / seconds / 1e9;
        BenchRow {
            footprint: 64 * MIB,
            dirty_fraction: dirty,
            strategy,
            tier: strategy.map(|_| StoreTier::Host),
            operation,
            seconds,
            gbps,
            ceiling_gbps,
            ratio: gbps / ceiling_gbps,
        }
    }

    fn config() -> MatrixConfig {
        MatrixConfig {
            footprints: vec![64 * MIB],
            chunk_size: 64 << 10,
            ..Default::default()
        }
    }

    /// memcpy 10 ms, read pass 5 ms; full copies at `full` seconds, detection at `detect`,
    /// hash restore at 1% at `hash1`, write set at `ws1` / `ws0`.
    fn rows(full: f64, detect: f64, hash1: f64, ws1: f64, ws0: f64) -> Vec<BenchRow> {
        use RestoreStrategy::*;
        let memcpy = 64.0 * MIB as f64 / 0.010 / 1e9;
        let read = 64.0 * MIB as f64 / 0.005 / 1e9;
        vec![
            row(None, Operation::Memcpy, 0.0, 0.010, memcpy),
            row(None, Operation::ReadPass, 0.0, 0.005, read),
            row(Some(Full), Operation::Snapshot, 0.0, full, memcpy),
            row(Some(Full), Operation::Restore, 0.0, full, memcpy),
            row(Some(Full), Operation::Restore, 0.01, full, memcpy),
            row(Some(Hash), Operation::Restore, 0.0, detect, memcpy),
            row(Some(Hash), Operation::Detect, 0.0, detect, read),
            row(Some(Hash), Operation::Restore, 0.01, hash1, memcpy),
            row(Some(Writeset), Operation::Restore, 0.0, ws0, memcpy),
            row(Some(Writeset), Operation::Restore, 0.01, ws1, memcpy),
        ]
    }

    /// Each side timed 5 times in turn: the ceilings at memcpy 10 ms and read pass 5 ms, the
    /// full copies at `full` and detection at `detect`.
    fn paired(full: f64, detect: f64, hash1: f64) -> Vec<PairedRatio> {
        let pair = |operation: Operation, strategy: &str, ceiling: f64, row: f64| PairedRatio {
            footprint: 64 * MIB,
            tier: StoreTier::Host,
            operation,
            strategy: strategy.into(),
            baseline: operation.ceiling().to_string(),
            ceiling_method: "2 threads, 1 MiB blocks round robin".into(),
            ceiling_seconds: vec![ceiling; 5],
            row_seconds: vec![row; 5],
        };
        vec![
            pair(Operation::Snapshot, "full", 0.010, full),
            pair(Operation::Restore, "full", 0.010, full),
            pair(Operation::Detect, "hash", 0.005, detect),
            PairedRatio {
                baseline: HASH_PASS.into(),
                ..pair(Operation::Restore, "hash", detect, hash1)
            },
        ]
    }

    fn check(full: f64, detect: f64, hash1: f64, ws1: f64, ws0: f64) -> Vec<TargetCheck> {
        check_targets(
            &config(),
            &rows(full, detect, hash1, ws1, ws0),
            &paired(full, detect, hash1),
        )
    }

    fn verdicts(checks: &[TargetCheck]) -> Vec<Option<bool>> {
        checks.iter().map(|c| c.met).collect()
    }

    #[test]
    fn figures_within_the_limits_meet_every_target() {
        let checks = check(0.011, 0.0055, 0.0056, 0.001, 0.00005);
        assert_eq!(verdicts(&checks), vec![Some(true); 5], "{checks:#?}");
        assert!(
            checks[0].detail.contains("need >= 0.85x"),
            "{}",
            checks[0].detail
        );
        assert_eq!(checks[0].tier, Some(StoreTier::Host));
    }

    #[test]
    fn each_target_fails_when_its_figure_crosses_the_limit() {
        // 1% of 1024 chunks of 64 KiB = 10 chunks = 640 KiB; a copy at memcpy speed (6.7 GB/s)
        // takes ~0.098 ms, so the hash restore limit is 6.3 ms + 0.147 ms.
        let checks = check(0.0126, 0.0063, 0.0066, 0.0013, 0.0002);
        assert_eq!(
            verdicts(&checks),
            vec![
                Some(false),
                Some(false),
                Some(false),
                Some(false),
                Some(false)
            ],
            "{checks:#?}"
        );
        assert!(checks[2].detail.contains("640KiB"), "{}", checks[2].detail);
    }

    #[test]
    fn the_write_set_targets_take_the_cheaper_of_the_learned_and_the_tracked_set() {
        use RestoreStrategy::{Full, Tracked};
        let memcpy = 64.0 * MIB as f64 / 0.010 / 1e9;
        let judge = |tracked1: f64, tracked0: f64| {
            // The learned set misses both (0.5x and 0.1x of full).
            let mut all = rows(0.011, 0.0055, 0.0056, 0.0055, 0.0011);
            all.push(row(
                Some(Tracked),
                Operation::Restore,
                0.01,
                tracked1,
                memcpy,
            ));
            all.push(row(
                Some(Tracked),
                Operation::Restore,
                0.0,
                tracked0,
                memcpy,
            ));
            let checks = check_targets(&config(), &all, &paired(0.011, 0.0055, 0.0056));
            checks
                .into_iter()
                .filter(|c| matches!(c.target, Target::WritesetRestore | Target::WritesetIdle))
                .collect::<Vec<_>>()
        };
        let met = judge(0.0011, 0.0001);
        assert_eq!(verdicts(&met), vec![Some(true), Some(true)], "{met:#?}");
        assert!(
            met.iter().all(|c| c.detail.starts_with("tracked ")),
            "{met:#?}"
        );
        // Tracked dearer than the learned set: the learned set is judged, and misses.
        let missed = judge(0.009, 0.005);
        assert_eq!(
            verdicts(&missed),
            vec![Some(false), Some(false)],
            "{missed:#?}"
        );
        assert!(
            missed.iter().all(|c| c.detail.starts_with("writeset ")),
            "{missed:#?}"
        );
        // Without full restores there is nothing to judge against.
        let no_full: Vec<BenchRow> = rows(0.011, 0.0055, 0.0056, 0.0055, 0.0011)
            .into_iter()
            .filter(|r| r.strategy != Some(Full))
            .collect();
        let checks = check_targets(&config(), &no_full, &[]);
        assert!(
            checks
                .iter()
                .filter(|c| c.target == Target::WritesetRestore)
                .all(|c| c.met.is_none())
        );
    }

    #[test]
    fn targets_without_their_rows_are_reported_as_not_evaluated() {
        let only_full: Vec<BenchRow> = rows(0.011, 0.0055, 0.0056, 0.001, 0.00005)
            .into_iter()
            .filter(|r| r.strategy.is_none() || r.strategy == Some(RestoreStrategy::Full))
            .collect();
        let only_full_paired: Vec<PairedRatio> = paired(0.011, 0.0055, 0.0056)
            .into_iter()
            .filter(|p| p.strategy == "full")
            .collect();
        let checks = check_targets(&config(), &only_full, &only_full_paired);
        assert_eq!(verdicts(&checks), vec![Some(true), None, None, None, None]);
        assert!(
            checks[1].detail.contains("strategy hash"),
            "{}",
            checks[1].detail
        );
        assert_eq!(checks[1].verdict(), "not evaluated");
    }

    #[test]
    fn ceiling_targets_are_judged_from_the_paired_medians_not_from_the_rows() {
        // The rows (best of a few) say the copies and the hash pass run at the ceiling; the
        // paired passes, taken in turn with the ceiling, say 0.80x: the paired ones decide.
        let rows = rows(0.010, 0.005, 0.0051, 0.001, 0.00005);
        let mut pairs = paired(0.0125, 0.00625, 0.0063);
        pairs[1].row_seconds = vec![0.009, 0.0125, 0.0125, 0.013, 0.020]; // median 0.0125
        let checks = check_targets(&config(), &rows, &pairs);
        assert_eq!(
            &verdicts(&checks)[..2],
            &[Some(false), Some(false)],
            "{checks:#?}"
        );
        for (c, says) in checks[..2].iter().zip(["full restore", "hash pass"]) {
            assert!(c.detail.contains("0.80x"), "{}", c.detail);
            assert!(c.detail.contains(says), "{}", c.detail);
            assert!(
                c.detail
                    .contains("medians of 5 passes of each side taken in turn"),
                "{}",
                c.detail
            );
        }
        assert!(checks[0].detail.contains("copy ceiling by 2 threads"));
    }

    #[test]
    fn ceiling_targets_without_paired_passes_are_not_evaluated() {
        let checks = check_targets(&config(), &rows(0.010, 0.005, 0.0051, 0.001, 0.00005), &[]);
        assert_eq!(&verdicts(&checks)[..3], &[None, None, None], "{checks:#?}");
        assert!(checks[0].detail.contains("paired with the copy ceiling"));
        assert!(checks[2].detail.contains("paired with the hash pass"));
        assert_eq!(&verdicts(&checks)[3..], &[Some(true); 2]);
    }

    #[test]
    fn the_hash_restore_target_is_judged_from_restores_taken_in_turn_with_the_hash_pass() {
        // The rows (best of a few, taken minutes apart) put the restore at 1% far over the hash
        // pass; the medians of restores taken in turn put it within: the paired ones decide.
        let rows = rows(0.011, 0.0040, 0.0080, 0.001, 0.00005);
        let mut pairs = paired(0.011, 0.0055, 0.0056);
        let within = check_targets(&config(), &rows, &pairs);
        assert_eq!(within[2].met, Some(true), "{:#?}", within[2]);
        assert!(
            within[2].detail.contains("hash pass 5.500ms")
                && within[2]
                    .detail
                    .contains("medians of 5 restores after 1% changed"),
            "{}",
            within[2].detail
        );
        // And the other way round: a restore at 1% whose median is over the limit.
        pairs[3].row_seconds = vec![0.0050, 0.0058, 0.0059, 0.0060, 0.0061];
        let over = check_targets(&config(), &rows, &pairs);
        assert_eq!(over[2].met, Some(false), "{:#?}", over[2]);
    }
}
