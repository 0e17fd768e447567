//! Fair judging of a row against its ceiling: the ceiling and the row are timed in turn
//! (ceiling, row, ceiling, row, ...) over the same bytes, the same number of times, and the
//! ratio applies one statistic to both series. A ceiling that is the best of many passes held
//! against a row that is the best of a few would judge the sampling, not the code.

use std::time::Duration;

use kreplay_snapshot::StoreTier;

use crate::matrix::Operation;
use crate::output::format_bytes;

/// The statistic applied to both series of a [`PairedRatio`]: the median (on a shared machine
/// the best of many passes rests on one lucky moment; the median of equally many passes of each
/// does not favour either side).
pub const PAIRED_STATISTIC: &str = "median";

/// The baseline of a hash restore after a pass that changed some chunks: a hash restore of the
/// same snapshot after a pass that changed nothing.
pub const HASH_PASS: &str = "hash pass";

/// Timed passes of each side per paired ratio when the configuration does not say otherwise.
pub const DEFAULT_PAIRED_SAMPLES: usize = 15;

/// A row of kreplay's and its ceiling, measured in turn over the same bytes.
#[derive(Clone, Debug, PartialEq)]
pub struct PairedRatio {
    /// Tracked bytes (both sides move or read this many).
    pub footprint: u64,
    /// The store tier of kreplay's side.
    pub tier: StoreTier,
    /// kreplay's operation (snapshot, restore or detect; `strategy` says which).
    pub operation: Operation,
    /// kreplay's restore strategy, in words.
    pub strategy: String,
    /// What the row is held against: a ceiling (`copy_ceiling`, `read_ceiling`) or another
    /// operation of kreplay's (`hash pass`).
    pub baseline: String,
    /// How the baseline was measured (for a ceiling, the best of the independent methods tried
    /// before the rows).
    pub ceiling_method: String,
    /// The ceiling's timed passes, in the order taken.
    pub ceiling_seconds: Vec<f64>,
    /// kreplay's timed passes, in the order taken (pass `i` right after ceiling pass `i`).
    pub row_seconds: Vec<f64>,
}

/// The median of `values` (the mean of the middle two for an even count; NaN when empty).
pub fn median(values: &[f64]) -> f64 {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

fn fastest(values: &[f64]) -> f64 {
    values.iter().copied().fold(f64::INFINITY, f64::min)
}

impl PairedRatio {
    /// Timed passes of each side.
    pub fn samples(&self) -> usize {
        self.row_seconds.len().min(self.ceiling_seconds.len())
    }

    /// kreplay's rate over the ceiling's, both by [`PAIRED_STATISTIC`] over their passes (the
    /// same bytes on both sides, so the inverse ratio of the times).
    pub fn ratio(&self) -> f64 {
        median(&self.ceiling_seconds) / median(&self.row_seconds)
    }

    /// The same ratio from the fastest pass of each side (shown, not judged).
    pub fn best_ratio(&self) -> f64 {
        fastest(&self.ceiling_seconds) / fastest(&self.row_seconds)
    }

    /// kreplay's rate by the statistic, GB/s.
    pub fn row_gbps(&self) -> f64 {
        self.footprint as f64 / median(&self.row_seconds) / 1e9
    }

    /// The ceiling's rate by the statistic, GB/s.
    pub fn ceiling_gbps(&self) -> f64 {
        self.footprint as f64 / median(&self.ceiling_seconds) / 1e9
    }

    /// One line: what was paired, how, and the ratio.
    pub fn describe(&self) -> String {
        format!(
            "{} {} {} {}: {:.2} GB/s vs {} {:.2} GB/s = {:.3}x ({} of {} interleaved passes \
             each; best of each {:.3}x; {} by {})",
            format_bytes(self.footprint),
            self.tier,
            self.strategy,
            self.operation,
            self.row_gbps(),
            self.baseline,
            self.ceiling_gbps(),
            self.ratio(),
            PAIRED_STATISTIC,
            self.samples(),
            self.best_ratio(),
            self.baseline,
            self.ceiling_method,
        )
    }
}

/// Times `ceiling` and `row` in turn, `samples` times each, starting with the ceiling:
/// the ceiling's and the row's seconds, in the order taken. A failing pass stops the
/// measurement with its error.
pub fn interleave(
    samples: usize,
    mut ceiling: impl FnMut() -> Result<Duration, String>,
    mut row: impl FnMut() -> Result<Duration, String>,
) -> Result<(Vec<f64>, Vec<f64>), String> {
    let samples = samples.max(1);
    let (mut c, mut r) = (Vec::with_capacity(samples), Vec::with_capacity(samples));
    for _ in 0..samples {
        c.push(ceiling()?.as_secs_f64());
        r.push(row()?.as_secs_f64());
    }
    Ok((c, r))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;

    fn paired(ceiling: &[f64], row: &[f64]) -> PairedRatio {
        PairedRatio {
            footprint: 1 << 30,
            tier: StoreTier::Host,
            operation: Operation::Restore,
            strategy: "full".into(),
            baseline: "copy_ceiling".into(),
            ceiling_method: "2 threads, 1 MiB blocks round robin, memcpy stores".into(),
            ceiling_seconds: ceiling.to_vec(),
            row_seconds: row.to_vec(),
        }
    }

    #[test]
    fn ceiling_and_row_passes_alternate_and_are_equally_many() {
        let order = RefCell::new(Vec::new());
        let (c, r) = interleave(
            4,
            || {
                order.borrow_mut().push('c');
                Ok(Duration::from_millis(10))
            },
            || {
                order.borrow_mut().push('r');
                Ok(Duration::from_millis(20))
            },
        )
        .unwrap();
        assert_eq!(order.into_inner().iter().collect::<String>(), "crcrcrcr");
        assert_eq!((c.len(), r.len()), (4, 4));
        assert!(c.iter().all(|&s| s == 0.010) && r.iter().all(|&s| s == 0.020));
    }

    #[test]
    fn a_failing_pass_stops_the_pairing_with_its_error() {
        let mut calls = 0;
        let e = interleave(
            5,
            || Ok(Duration::from_millis(1)),
            || {
                calls += 1;
                if calls == 2 {
                    Err("restore failed".to_string())
                } else {
                    Ok(Duration::from_millis(1))
                }
            },
        )
        .unwrap_err();
        assert_eq!(e, "restore failed");
    }

    #[test]
    fn the_ratio_applies_the_median_to_both_sides_not_the_best() {
        // One lucky ceiling pass (5 ms) must not decide the ratio; nor one lucky row pass.
        let p = paired(
            &[0.005, 0.010, 0.010, 0.011, 0.012],
            &[0.011, 0.004, 0.012, 0.013, 0.020],
        );
        assert_eq!(p.samples(), 5);
        assert!((p.ratio() - 0.010 / 0.012).abs() < 1e-12, "{}", p.ratio());
        assert!((p.best_ratio() - 0.005 / 0.004).abs() < 1e-12);
        assert!((p.ceiling_gbps() / p.row_gbps() - 0.012 / 0.010).abs() < 1e-9);
        assert_eq!(median(&[3.0, 1.0, 2.0, 4.0]), 2.5);
    }

    #[test]
    fn the_description_states_the_sampling_and_the_ceiling_method() {
        let text = paired(&[0.1; 15], &[0.125; 15]).describe();
        for part in [
            "median of 15 interleaved passes each",
            "0.800x",
            "copy_ceiling",
            "ceiling by 2 threads, 1 MiB blocks round robin, memcpy stores",
            "1GiB host full restore",
        ] {
            assert!(text.contains(part), "{part:?} in {text}");
        }
    }
}
