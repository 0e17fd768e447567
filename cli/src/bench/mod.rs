//! `kreplay bench` and `kreplay bench-dispatch`: what replay costs, measured beside ceilings.
//!
//! - `kreplay bench` ([`run`]) runs the snapshot/restore matrix of
//!   [`kreplay_benches::run_matrix`] once, prints every row with the ceiling measured in the same
//!   run beside it, judges the design's targets from those rows and optionally writes CSV and an
//!   SVG plot;
//! - `kreplay bench-dispatch` ([`dispatch::run`]) measures the fixed cost kreplay adds per
//!   dispatch on the software HSA runtime, with the minimal tool of [`tool`].

pub mod dispatch;
pub mod tool;

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;

use kreplay_benches::{
    BenchRow, MatrixConfig, SCOPE_REGIONS, ScopeRow, TargetCheck, check_targets, format_bytes,
    format_percent, format_seconds, format_table, run_matrix, run_scope_case, write_csv, write_svg,
};

use crate::args::BenchOptions;

/// What a `kreplay bench` run produced.
#[derive(Clone, Debug)]
pub struct BenchOutcome {
    /// Every measurement.
    pub rows: Vec<BenchRow>,
    /// The targets, judged from `rows`.
    pub targets: Vec<TargetCheck>,
    /// The snapshot scope case at the largest footprint.
    pub scopes: Vec<ScopeRow>,
}

/// Memory the matrix needs at a footprint: the tracked memory, a store and a spare device
/// shadow (the memcpy ceiling's two buffers are freed before those are allocated).
fn memory_needed(footprint: u64) -> u64 {
    footprint.saturating_mul(3)
}

/// `MemAvailable` of /proc/meminfo, in bytes.
fn available_memory() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

fn create(path: &Path) -> Result<BufWriter<File>, String> {
    File::create(path)
        .map(BufWriter::new)
        .map_err(|e| format!("cannot write {}: {e}", path.display()))
}

/// "1 CPU", "2 CPUs": the CPUs this process may run on.
pub(crate) fn cpus() -> String {
    match std::thread::available_parallelism().map_or(0, |n| n.get()) {
        1 => "1 CPU".to_string(),
        n => format!("{n} CPUs"),
    }
}

fn list<T>(items: &[T], show: impl Fn(&T) -> String) -> String {
    items.iter().map(show).collect::<Vec<_>>().join(", ")
}

/// The matrix configuration `options` describe.
pub fn matrix_config(options: &BenchOptions) -> MatrixConfig {
    MatrixConfig {
        footprints: options.footprints.clone(),
        dirty_fractions: options.dirty_fractions.clone(),
        strategies: options.strategies.clone(),
        tiers: options.tiers.clone(),
        repeats: options.repeats,
        host_windows: !options.discrete,
        ..MatrixConfig::default()
    }
}

/// The targets section: one line per target, footprint and tier, with the figures and the
/// verdict.
pub fn render_targets(checks: &[TargetCheck]) -> String {
    let mut text = String::from("targets (judged from this run's rows):\n");
    let width = checks
        .iter()
        .map(|c| c.footprint.map_or(1, |f| format_bytes(f).len()))
        .max()
        .unwrap_or(1);
    let tier_width = checks
        .iter()
        .map(|c| c.tier.map_or(1, |t| t.as_str().len()))
        .max()
        .unwrap_or(1);
    let mut current = None;
    for check in checks {
        if current != Some(check.target) {
            current = Some(check.target);
            text += &format!("  {}\n", check.target);
        }
        let footprint = check.footprint.map_or("-".into(), format_bytes);
        let tier = check.tier.map_or("-", |t| t.as_str());
        text += &format!(
            "    {footprint:<width$}  {tier:<tier_width$}  {:<13}  {}\n",
            check.verdict(),
            check.detail
        );
    }
    let count = |met: Option<bool>| checks.iter().filter(|c| c.met == met).count();
    text += &format!(
        "  {} met, {} not met, {} not evaluated\n",
        count(Some(true)),
        count(Some(false)),
        count(None)
    );
    text
}

/// The scope section: both scopes for a kernel that references 1% of the footprint.
pub fn render_scopes(rows: &[ScopeRow]) -> String {
    let mut text = format!(
        "snapshot scope: a kernel whose argument points at 1 of {SCOPE_REGIONS} equal \
         allocations of the agent, rewriting all of it (host store, auto restore):\n"
    );
    text += "  scope       footprint   snapshot   snap time  restored   restore time\n";
    for r in rows {
        text += &format!(
            "  {:<10}  {:>9}  {:>9}  {:>10}  {:>9}  {:>12}\n",
            r.scope.as_str(),
            format_bytes(r.footprint),
            format_bytes(r.bytes_snapshotted),
            format_seconds(r.snapshot_seconds),
            format_bytes(r.bytes_restored),
            format_seconds(r.restore_seconds),
        );
    }
    text
}

/// Runs `kreplay bench`: the matrix, the table, the targets, and the CSV and SVG files asked
/// for. Output files are created before the matrix runs, so a bad path fails at once.
pub fn run(options: &BenchOptions, out: &mut dyn Write) -> Result<BenchOutcome, String> {
    let config = matrix_config(options);
    let largest = config.footprints.iter().copied().max().unwrap_or(0);
    if let Some(available) = available_memory()
        && memory_needed(largest) > available
    {
        return Err(format!(
            "the matrix at {} needs about {} of memory and {} is available; choose smaller \
             --footprints",
            format_bytes(largest),
            format_bytes(memory_needed(largest)),
            format_bytes(available)
        ));
    }
    let mut csv = options.csv.as_deref().map(create).transpose()?;
    let mut svg = options.svg.as_deref().map(create).transpose()?;

    let cpus = cpus();
    let device = if options.discrete {
        "a device without host windows, reached through reads and writes only (--discrete)"
    } else {
        "a device whose memory the snapshot reaches through host windows (like the software HSA \
         runtime)"
    };
    let header = format!(
        "kreplay bench: snapshot and restore on {device}; {cpus}\n\
         footprints {}; dirty {}; strategies {}; tiers {}; {} allocations per footprint, \
         {} chunks; best of {}\n\n",
        list(&config.footprints, |f| format_bytes(*f)),
        list(&config.dirty_fractions, |d| format_percent(*d)),
        list(&config.strategies, |s| s.to_string()),
        list(&config.tiers, |t| t.to_string()),
        config.regions,
        format_bytes(config.chunk_size),
        config.repeats,
    );
    let write = |out: &mut dyn Write, text: &str| {
        out.write_all(text.as_bytes())
            .and_then(|()| out.flush())
            .map_err(|e| format!("cannot write the report: {e}"))
    };
    write(out, &header)?;

    let rows = run_matrix(&config)?;
    let targets = check_targets(&config, &rows);
    let mut text = format_table(&rows);
    text += "\ntime: best of the repetitions. GB/s: footprint bytes per second (for restores of \
             part of the footprint an effective rate, not bytes moved). ceiling: measured in \
             this run over the same bytes (memcpy: the better of a one-thread and a parallel \
             copy; read_pass: a parallel read of every word); ratio = GB/s / ceiling GB/s. \
             snapshot_cold: a snapshotter's first snapshot (store allocated and faulted in); \
             snapshot and restore: steady state. detect: a hash restore with nothing dirty \
             (the hash pass alone).\n\n";
    text += &render_targets(&targets);
    let scopes = run_scope_case(largest, config.repeats, config.host_windows)?;
    text += "\n";
    text += &render_scopes(&scopes);
    write(out, &text)?;

    if let (Some(path), Some(file)) = (&options.csv, csv.as_mut()) {
        write_csv(&rows, &mut *file)
            .and_then(|()| file.flush())
            .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
        write(out, &format!("wrote {}\n", path.display()))?;
    }
    if let (Some(path), Some(file)) = (&options.svg, svg.as_mut()) {
        write_svg(&rows, &mut *file)
            .and_then(|()| file.flush())
            .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
        write(out, &format!("wrote {}\n", path.display()))?;
    }
    Ok(BenchOutcome {
        rows,
        targets,
        scopes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use kreplay_snapshot::{RestoreStrategy, StoreTier};

    #[test]
    fn options_become_the_matrix_configuration() {
        let options = BenchOptions {
            footprints: vec![1 << 20],
            dirty_fractions: vec![0.0, 0.5],
            strategies: vec![RestoreStrategy::Hash],
            tiers: vec![StoreTier::File],
            repeats: 2,
            discrete: true,
            ..BenchOptions::default()
        };
        let config = matrix_config(&options);
        assert_eq!(config.footprints, vec![1 << 20]);
        assert_eq!(config.dirty_fractions, vec![0.0, 0.5]);
        assert_eq!(config.strategies, vec![RestoreStrategy::Hash]);
        assert_eq!(config.tiers, vec![StoreTier::File]);
        assert_eq!(config.repeats, 2);
        assert!(!config.host_windows);
    }

    #[test]
    fn a_small_matrix_prints_rows_with_ceilings_and_every_target() {
        let options = BenchOptions {
            footprints: vec![256 << 10],
            dirty_fractions: vec![0.0, 0.01],
            tiers: vec![StoreTier::Host],
            repeats: 1,
            ..BenchOptions::default()
        };
        let mut out = Vec::new();
        let outcome = run(&options, &mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(
            text.contains("ceiling GB/s") && text.contains("memcpy"),
            "{text}"
        );
        assert!(
            text.contains("targets (judged from this run's rows):"),
            "{text}"
        );
        for target in kreplay_benches::Target::ALL {
            assert!(
                text.contains(target.describe()),
                "{target:?} missing: {text}"
            );
        }
        // 3 ceilings; 3 strategies x (2 snapshots + 2 restores); 1 detect row.
        assert_eq!(outcome.rows.len(), 3 + 3 * 4 + 1);
        assert_eq!(outcome.targets.len(), kreplay_benches::Target::ALL.len());
    }

    #[test]
    fn too_large_a_footprint_for_this_machine_is_refused_before_running() {
        let Some(available) = available_memory() else {
            return;
        };
        let options = BenchOptions {
            footprints: vec![available],
            ..BenchOptions::default()
        };
        let error = run(&options, &mut Vec::new()).unwrap_err();
        assert!(error.contains("choose smaller --footprints"), "{error}");
    }
}
