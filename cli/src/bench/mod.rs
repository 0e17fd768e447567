//! `kreplay bench` and `kreplay bench-dispatch`: what replay costs, measured beside ceilings.
//!
//! - `kreplay bench` ([`run`]) runs the snapshot/restore matrix of
//!   [`kreplay_benches::run_matrix`] once, prints every row with the ceiling measured in the same
//!   run beside it, judges the design's targets from those rows and optionally writes CSV and an
//!   SVG plot;
//! - `kreplay bench-dispatch` ([`dispatch::run`]) measures the fixed cost kreplay adds per
//!   dispatch on the software HSA runtime, with the minimal tool of [`tool`].

pub mod cuda;
pub mod dispatch;
pub mod tool;

use std::io::Write;

use kreplay_benches::{
    AUTO_MAX_OVER_BEST, AutoCheck, BenchRow, FootprintCeilings, MatrixConfig, Progress,
    ReplayConfig, ReplayRow, SCOPE_REGIONS, ScopeRow, TargetCheck, check_auto, check_control,
    check_targets, format_bytes, format_percent, format_seconds, low_quartile_words,
    replay_table_header, replay_table_line, run_all, run_scope_case, table_header, table_line,
    write_csv, write_svg,
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
    /// The ceilings with how they were obtained.
    pub ceilings: Vec<FootprintCeilings>,
    /// Whole-replay costs.
    pub replay: Vec<ReplayRow>,
    /// auto against the best verified fixed strategy, per replay cell.
    pub auto: Vec<AutoCheck>,
    /// The control (full measured twice) against full, per replay cell.
    pub control: Vec<AutoCheck>,
}

/// kreplay's settings from the environment, checked before a benchmark measures anything: a bad
/// `KREPLAY_*` value is an error here as it is for every command that installs kreplay, and so
/// is a `KREPLAY_SPILL_DIR` where no spill file can be created or a `KREPLAY_RECORD_DIR` that is
/// not an existing folder.
pub(crate) fn checked_settings() -> Result<kreplay::config::Config, String> {
    let settings = kreplay::config::Config::from_env().map_err(|e| e.to_string())?;
    settings.check_snapshot_config()?;
    // Not a setting the configuration reads, but one libkreplay refuses at load.
    kreplay::run_record::dir_from_env()?;
    Ok(settings)
}

/// Memory the matrix needs at a footprint: the tracked memory, a store and a spare device
/// shadow, and while full copies and hash detection are timed in turn with their ceiling, the
/// ceiling's two buffers beside them.
fn memory_needed(footprint: u64) -> u64 {
    footprint.saturating_mul(5)
}

/// Memory the whole replays need at a footprint: the tracked memory and one store per strategy
/// (the strategies of a cell are replayed in turn, each keeping its store).
fn replay_memory_needed(footprint: u64, strategies: usize) -> u64 {
    footprint.saturating_mul(strategies as u64 + 1)
}

/// `WHAT FOOTPRINT needs about NEEDED of memory and AVAILABLE is available`, the two amounts in
/// the largest binary unit each reaches, to a tenth (the room is read in KiB: an exact rendering
/// of it would be a count of KiB).
fn memory_shortfall(what: &str, footprint: u64, needed: u64, available: u64) -> String {
    fn approx(bytes: u64) -> String {
        const UNITS: [(u64, &str); 4] = [
            (1 << 40, "TiB"),
            (1 << 30, "GiB"),
            (1 << 20, "MiB"),
            (1 << 10, "KiB"),
        ];
        match UNITS.iter().find(|&&(unit, _)| bytes >= unit) {
            Some(&(unit, name)) if bytes.is_multiple_of(unit) => format!("{}{name}", bytes / unit),
            Some(&(unit, name)) => format!("{:.1}{name}", bytes as f64 / unit as f64),
            None => format!("{bytes}B"),
        }
    }
    let verb = if what.starts_with("the whole replays") {
        "need"
    } else {
        "needs"
    };
    format!(
        "{what} {} {verb} about {} of memory and {} is available",
        format_bytes(footprint),
        approx(needed),
        approx(available)
    )
}

/// `MemAvailable` of /proc/meminfo, in bytes.
fn available_memory() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
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

/// The replay configuration `options` describe (`None`: no per-replay section). Whole replays
/// run at the smallest footprint unless `--replay-footprints` names others: they replay every
/// cell several times over the footprint, so at the largest footprints they would take most of
/// the run.
pub fn replay_config(options: &BenchOptions) -> Option<ReplayConfig> {
    if options.replay_passes.is_empty() || options.replay_dirty.is_empty() {
        return None;
    }
    let smallest = options.footprints.iter().copied().min();
    let defaults = ReplayConfig::default();
    Some(ReplayConfig {
        repeats: options.replay_repeats.0.unwrap_or(defaults.repeats),
        long_repeats: options.replay_repeats.1.unwrap_or(defaults.long_repeats),
        footprints: options
            .replay_footprints
            .clone()
            .unwrap_or_else(|| smallest.into_iter().collect()),
        dirty_fractions: options.replay_dirty.clone(),
        passes: options.replay_passes.clone(),
        tiers: options.replay_tiers.clone(),
        ..defaults
    })
}

/// A ceilings section under `title`: each ceiling with the method that reached it.
pub fn render_ceilings(title: &str, ceilings: &[FootprintCeilings]) -> String {
    let mut text = format!("{title}:\n");
    for c in ceilings {
        text += &format!(
            "  {} copy: {}\n  {} read: {}\n",
            format_bytes(c.footprint),
            c.copy.describe(),
            format_bytes(c.footprint),
            c.read.describe()
        );
    }
    text
}

/// Whether a ratio of the auto check is not within [`AUTO_MAX_OVER_BEST`]: a ratio that could
/// not be computed (NaN, no repetitions to compare) is not within it either.
fn over_limit(ratio: f64) -> bool {
    ratio.is_nan() || ratio > AUTO_MAX_OVER_BEST
}

/// "K of N cells within 1.10x, worst Wx" of `checks` by the ratio `pick` takes.
fn cells_within(checks: &[AutoCheck], pick: fn(&AutoCheck) -> f64) -> String {
    let over = checks.iter().filter(|c| over_limit(pick(c))).count();
    let worst = checks
        .iter()
        .map(pick)
        .max_by(f64::total_cmp)
        .map_or(String::new(), |w| format!(", worst {w:.3}x"));
    format!(
        "{} of {} cells within {AUTO_MAX_OVER_BEST:.2}x{worst}",
        checks.len() - over,
        checks.len()
    )
}

/// How a check's dispatches are named: "first dispatch", "later dispatch", "sequence".
fn label(c: &AutoCheck) -> String {
    match c.dispatch {
        "sequence" => "sequence".to_string(),
        d => format!("{d} dispatch"),
    }
}

/// The control section: how far the auto check's statistics move when the same work (full) is
/// measured twice in the same repetitions; the cells that strayed most (paired) first.
pub fn render_control(checks: &[AutoCheck]) -> String {
    if checks.is_empty() {
        return String::new();
    }
    let mut text = String::from(
        "control: full replayed a second time in every repetition, as a strategy of its own, \
         against full by the auto check's statistics (the same work, so any ratio but 1 is \
         measurement; the five sequences that strayed most):\n",
    );
    let checks: Vec<AutoCheck> = checks.iter().filter(|c| c.judged).cloned().collect();
    let checks = &checks[..];
    let mut sorted: Vec<&AutoCheck> = checks.iter().collect();
    sorted.sort_by(|a, b| b.paired_ratio.total_cmp(&a.paired_ratio));
    for c in sorted.iter().take(5) {
        text += &format!(
            "  {:<14}  {:<34}  paired {:.3}x  lower quartiles {:.3}x; medians {:.3}x\n",
            label(c),
            c.cell,
            c.paired_ratio,
            c.ratio,
            c.median_ratio,
        );
    }
    text += &format!(
        "  paired (as judged for auto): {}; lower quartiles: {}; medians: {}\n",
        cells_within(checks, |c| c.paired_ratio),
        cells_within(checks, |c| c.ratio),
        cells_within(checks, |c| c.median_ratio)
    );
    text
}

/// The auto section: the worst cells first.
pub fn render_auto(checks: &[AutoCheck]) -> String {
    let mut text = format!(
        "auto against the best verified fixed strategy (full, hash, writeset, tracked) of each \
         cell; target <= {AUTO_MAX_OVER_BEST:.2}x, judged paired: against each verified fixed \
         strategy the median over the repetitions of auto's time / that strategy's time in the \
         same repetition, the largest of those (a drift of the machine's speed between \
         repetitions falls on both sides of a pair; the control below shows how far each \
         statistic strays when the same work is measured twice). Shown, not judged: lower \
         quartile against the lowest lower quartile, the same with medians, spread (slowest / \
         fastest repetition) and auto's slowest repetition / the best's lower quartile. Judged \
         per dispatch sequence (a repetition's first dispatch and its later ones summed: what a \
         first dispatch pays to set up what later ones reuse, a write set learned or a \
         footprint kept followed, is repaid within the sequence); first and later dispatches \
         apart are shown, not judged:\n"
    );
    let mut sorted: Vec<&AutoCheck> = checks.iter().collect();
    // Sequences first, each kind the worst first.
    sorted.sort_by(|a, b| {
        b.judged
            .cmp(&a.judged)
            .then(b.paired_ratio.total_cmp(&a.paired_ratio))
    });
    let shown: Vec<AutoCheck> = checks.iter().filter(|c| !c.judged).cloned().collect();
    let checks: Vec<AutoCheck> = checks.iter().filter(|c| c.judged).cloned().collect();
    let checks = &checks[..];
    let over = checks.iter().filter(|c| over_limit(c.paired_ratio)).count();
    let worst = sorted.first().map_or(String::new(), |c| {
        format!("; worst {:.3}x ({}, {})", c.paired_ratio, label(c), c.cell)
    });
    for c in &sorted {
        text += &format!(
            "  {:<14}  {:<34}  paired {:.3}x of {:<8}  lower quartiles {:.3}x of {:<8}  medians {:.3}x; spread auto {:.3}, {} {:.3}; auto's slowest {:.3}x{}\n",
            label(c),
            c.cell,
            c.paired_ratio,
            c.paired_best.to_string(),
            c.ratio,
            c.best.to_string(),
            c.median_ratio,
            c.auto_spread,
            c.best,
            c.best_spread,
            c.worst_ratio,
            match (c.judged, over_limit(c.paired_ratio)) {
                (true, true) => "  NOT MET",
                (false, true) => "  (shown)",
                _ => "",
            }
        );
    }
    for kind in ["first", "later"] {
        let of_kind: Vec<AutoCheck> = shown
            .iter()
            .filter(|c| c.dispatch == kind)
            .cloned()
            .collect();
        if !of_kind.is_empty() {
            text += &format!(
                "  {kind} dispatches alone (shown, not judged): {}\n",
                cells_within(&of_kind, |c| c.paired_ratio)
            );
        }
    }
    text += &format!(
        "  with lower quartiles instead (shown, not judged): {}\n",
        cells_within(checks, |c| c.ratio)
    );
    text += &format!(
        "  with medians instead (shown, not judged): {}\n",
        cells_within(checks, |c| c.median_ratio)
    );
    text += &format!(
        "  {} of {} cells within {AUTO_MAX_OVER_BEST:.2}x{worst}: {}\n",
        checks.len() - over,
        checks.len(),
        match (checks.is_empty(), over) {
            (true, _) => "not evaluated",
            (false, 0) => "met",
            (false, _) => "NOT MET",
        }
    );
    text
}

/// One line of a targets section: a target judged at one footprint and tier.
pub struct Verdict<'a> {
    /// The target, in words (lines of one target are grouped under it).
    pub target: &'a str,
    /// The footprint (`None`: the target was not evaluated at any).
    pub footprint: Option<u64>,
    /// The tier (`None`: as for the footprint).
    pub tier: Option<&'a str>,
    /// `Some(true)` met, `Some(false)` not met, `None` not evaluated.
    pub met: Option<bool>,
    /// The figures and the limit they were held to, or why nothing was evaluated.
    pub detail: &'a str,
}

/// The targets section of `kreplay bench` on either backend: a heading per target, under it
/// one line per footprint and tier with the verdict and the figures, then the counts.
pub fn render_verdicts(lines: &[Verdict<'_>]) -> String {
    let mut text = String::from("targets (judged from this run's rows):\n");
    let width = lines
        .iter()
        .map(|v| v.footprint.map_or(1, |f| format_bytes(f).len()))
        .max()
        .unwrap_or(1);
    let tier_width = lines
        .iter()
        .map(|v| v.tier.map_or(1, str::len))
        .max()
        .unwrap_or(1);
    let mut current = None;
    for v in lines {
        if current != Some(v.target) {
            current = Some(v.target);
            text += &format!("  {}\n", v.target);
        }
        let footprint = v.footprint.map_or("-".into(), format_bytes);
        let verdict = match v.met {
            Some(true) => "met",
            Some(false) => "NOT MET",
            None => "not evaluated",
        };
        text += &format!(
            "    {footprint:<width$}  {:<tier_width$}  {verdict:<13}  {}\n",
            v.tier.unwrap_or("-"),
            v.detail
        );
    }
    let count = |met: Option<bool>| lines.iter().filter(|v| v.met == met).count();
    text += &format!(
        "  {} met, {} not met, {} not evaluated\n",
        count(Some(true)),
        count(Some(false)),
        count(None)
    );
    text
}

/// The targets section of the software-runtime bench (see [`render_verdicts`]).
pub fn render_targets(checks: &[TargetCheck]) -> String {
    let lines: Vec<Verdict<'_>> = checks
        .iter()
        .map(|c| Verdict {
            target: c.target.describe(),
            footprint: c.footprint,
            tier: c.tier.map(|t| t.as_str()),
            met: c.met,
            detail: &c.detail,
        })
        .collect();
    render_verdicts(&lines)
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
    let settings = checked_settings()?;
    let mut config = matrix_config(options);
    config.spill_dir = settings.spill_dir;
    let largest = config.footprints.iter().copied().max().unwrap_or(0);
    let replay = replay_config(options);
    let replay_largest = replay.as_ref().map_or(0, |r| {
        r.footprints
            .iter()
            .filter(|f| config.footprints.contains(f))
            .copied()
            .max()
            .unwrap_or(0)
    });
    let replay_needed = replay_memory_needed(
        replay_largest,
        replay.as_ref().map_or(0, ReplayConfig::replayed),
    );
    if let Some(available) = available_memory() {
        if memory_needed(largest) > available {
            return Err(format!(
                "{}; choose smaller --footprints",
                memory_shortfall("the matrix at", largest, memory_needed(largest), available)
            ));
        }
        if replay_needed > available {
            return Err(format!(
                "{}; choose smaller --replay-footprints",
                memory_shortfall(
                    "the whole replays at",
                    replay_largest,
                    replay_needed,
                    available
                )
            ));
        }
    }

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
         {} chunks; best of {}{}\n\n",
        list(&config.footprints, |f| format_bytes(*f)),
        list(&config.dirty_fractions, |d| format_percent(*d)),
        list(&config.strategies, |s| s.to_string()),
        list(&config.tiers, |t| t.to_string()),
        config.regions,
        format_bytes(config.chunk_size),
        config.repeats,
        config
            .spill_dir
            .as_ref()
            .map_or_else(String::new, |d| format!(
                "; file tier spills in {} (KREPLAY_SPILL_DIR)",
                d.display()
            )),
    );
    let write = |out: &mut dyn Write, text: &str| {
        out.write_all(text.as_bytes())
            .and_then(|()| out.flush())
            .map_err(|e| format!("cannot write the report: {e}"))
    };
    write(out, &header)?;

    // Every measurement is printed (and flushed) as soon as it is made; a failed write stops
    // the printing and is reported once the run returns.
    let mut failed: Option<String> = None;
    let results = {
        let mut say = |text: &str| {
            if failed.is_none()
                && let Err(e) = write(out, text)
            {
                failed = Some(e);
            }
        };
        run_all(&config, replay.as_ref(), |event| match event {
            Progress::Ceilings(c) => {
                say(&render_ceilings(
                    "ceilings measured before",
                    std::slice::from_ref(c),
                ));
                say("\n");
                say(&table_header());
            }
            Progress::Row(row) => say(&table_line(row)),
            Progress::Paired(pair) => {
                let with = if pair.baseline == kreplay_benches::HASH_PASS {
                    "the hash pass"
                } else {
                    "its ceiling"
                };
                say(&format!("paired with {with}: {}\n", pair.describe()))
            }
            Progress::ReplayStart { footprint } => say(&format!(
                "\nwhole replays at {} (ratios to the ceilings measured before; see the end of \
                 the report for what the columns mean):\n{}",
                format_bytes(footprint),
                replay_table_header()
            )),
            Progress::Replay(row) => say(&replay_table_line(row)),
            Progress::CeilingsAgain { again, best } => {
                say("\n");
                say(&render_ceilings(
                    "ceilings measured again after",
                    std::slice::from_ref(again),
                ));
                say(&format!(
                    "  kept (the better of both, used by the CSV's ratios and the hash restore \
                     target): copy {:.2} GB/s, read {:.2} GB/s\n\n",
                    best.copy.gbps, best.read.gbps
                ));
            }
        })?
    };
    if let Some(e) = failed {
        return Err(e);
    }
    let rows = results.rows;
    let targets = check_targets(&config, &rows, &results.paired);
    let mut text = format!(
        "time: best of the repetitions. GB/s: footprint bytes per second (for restores of part \
         of the footprint an effective rate, not bytes moved). ceiling: the machine's copy or \
         read ceiling over the same bytes, above; ratio = GB/s / ceiling GB/s. snapshot_cold: a \
         snapshotter's first snapshot (store allocated and faulted in); snapshot and restore: \
         steady state (writeset and auto restores verify: every chunk outside the learned set \
         is hashed). detect: a hash restore with nothing dirty (the hash pass alone). The table's \
         ratios screen: a row's best of {repeats} against a ceiling's best of {repeats} passes of \
         each method tried; they are not judged. paired with its ceiling: a full snapshot, a full \
         restore or the hash pass timed {samples} times in turn with the ceiling's best method \
         (ceiling pass, kreplay pass, ceiling pass, ...) over as many bytes, each side reduced \
         to its {statistic}. paired with the hash pass: a hash restore after a pass that changed \
         1% of the chunks timed {samples} times in turn with a hash restore of the same snapshot \
         after nothing changed, each reduced to its {statistic}. The targets below judge only \
         these.\n\n",
        repeats = config.repeats,
        samples = config.paired_samples,
        statistic = kreplay_benches::PAIRED_STATISTIC,
    );
    text += &render_ceilings(
        "ceilings of this machine (code independent of kreplay's; the better of a measurement \
         before and one after the footprint's rows)",
        &results.ceilings,
    );
    text += "\n";
    text += &render_targets(&targets);
    write(out, &text)?;
    let scopes = run_scope_case(largest, config.repeats, config.host_windows)?;
    let mut text = String::from("\n");
    text += &render_scopes(&scopes);
    let auto = check_auto(&results.replay);
    let control = check_control(&results.replay);
    if !results.replay.is_empty() {
        let (repeats, long_repeats, dispatches, long_passes) =
            replay.as_ref().map_or((0, 0, 0, 0), |r| {
                (
                    r.repeats_for(r.long_passes),
                    r.repeats_for(r.long_passes + 1),
                    r.dispatches.max(2),
                    r.long_passes,
                )
            });
        text += &format!(
            "\nwhole replays (the tables above): snapshot plus every restore of an N-pass \
             replay (learning and verification included), and the passes' own writes of the \
             dirty chunks (where writes are followed, a pass pays a fault for the first store \
             to each page), and dropping the snapshot at the end (where writes were followed \
             and are not kept followed, the footprint is un-protected then). Each cell is \
             measured in {repeats} repetitions ({long_repeats} for more than {long_passes} \
             passes), after one untimed dispatch of N passes per strategy; a repetition replays, \
             for every strategy in turn (in an order shuffled anew each repetition), a sequence \
             of {dispatches} dispatches of a kernel nothing was learned about, starting with \
             nothing followed; where a replay followed writes, its footprint stays followed for \
             the next dispatch (whose snapshot copies only what was written since), and \
             stopping to follow it after the sequence is charged to its last dispatch. first \
             dispatch: the lower quartile of the strategy's first dispatches (of {repeats} \
             repetitions {}, of {long_repeats} {}); later dispatch: the same of its later ones, \
             which reuse what the earlier ones of their kernel learned or kept followed; \
             sequence: the same of the sequences (first and later dispatches of a repetition \
             summed); spread: the slowest of those repetitions \
             / the fastest; median: their median, shown, not judged. A low quantile because on a \
             shared machine interference only slows a repetition down; not the fastest, which \
             would rest on one lucky moment; the same statistic for every strategy, auto \
             included. /N full: divided by \
             N full restores of the footprint in the same tier (the best of 5) measured in this \
             run; N copies at ceiling: N copies of the footprint at the machine's copy ceiling. \
             hashed snapshots: the cell's dispatches whose snapshot hashed every chunk, of all \
             it measured; restores full/hash/set/tracked: how their restores went (wrote \
             everything; hashed everything and wrote what changed; wrote the learned write set, \
             hashing every other chunk but under writeset-unverified; wrote back the chunks of \
             the pages followed as written, hashing nothing). Every snapshot is told the \
             restores its replay plans (N - 1), as the pass loop tells it; the untimed dispatch \
             at the start of each cell lets every strategy start the cell from rates measured \
             replaying N passes. writeset-unverified skips verification between passes \
             (opt-in) and is never counted as the best. full (control) is full replayed once \
             more in every repetition, as a strategy of its own: never judged, it shows what \
             the statistics do to the same work measured twice (the control section).\n",
            low_quartile_words(repeats),
            low_quartile_words(long_repeats),
        );
        text += "\n";
        text += &render_auto(&auto);
        let control_text = render_control(&control);
        if !control_text.is_empty() {
            text += "\n";
            text += &control_text;
        }
    }
    write(out, &text)?;

    // Each file is made whole, then written at once: a bench that fails halfway, or a file
    // past the file size limit, leaves no file that looks like a result.
    type Render = fn(&[BenchRow], &mut Vec<u8>) -> std::io::Result<()>;
    let files: [(&Option<std::path::PathBuf>, Render); 2] = [
        (&options.csv, |rows, w| write_csv(rows, w)),
        (&options.svg, |rows, w| write_svg(rows, w)),
    ];
    for (path, render) in files {
        let Some(path) = path else { continue };
        let mut text = Vec::new();
        render(&rows, &mut text).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
        crate::output::write_whole(path, &text)?;
        write(out, &format!("wrote {}\n", path.display()))?;
    }
    Ok(BenchOutcome {
        rows,
        targets,
        scopes,
        ceilings: results.ceilings,
        replay: results.replay,
        auto,
        control,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use kreplay_snapshot::{RestoreStrategy, StoreTier};

    /// The memory available is read in KiB, so an exact rendering of it gave `24092088KiB`
    /// beside a need of `320GiB`: both are now given in the same, readable units.
    #[test]
    fn a_memory_shortfall_gives_need_and_room_in_comparable_units() {
        let text = memory_shortfall("the matrix at", 64 << 30, 320 << 30, 24_092_088 << 10);
        assert!(
            text.contains("needs about 320GiB of memory and 23.0GiB is available"),
            "{text}"
        );
        let small = memory_shortfall("the matrix at", 4 << 20, 20 << 20, 15_000 << 10);
        assert!(small.contains("and 14.6MiB is available"), "{small}");
    }

    fn auto_check(ratio: f64, median_ratio: f64, paired_ratio: f64) -> AutoCheck {
        AutoCheck {
            dispatch: "sequence",
            judged: true,
            cell: "256MiB host 1% same-scattered N=4".into(),
            ratio,
            median_ratio,
            best: RestoreStrategy::Hash,
            auto_spread: 1.2,
            best_spread: 1.1,
            worst_ratio: 1.3,
            paired_ratio,
            paired_best: RestoreStrategy::Writeset,
        }
    }

    #[test]
    fn the_auto_verdict_is_paired_and_the_other_statistics_are_shown_beside_it() {
        // A first dispatch alone over the limit is shown, not judged: its sequence decides.
        let first = AutoCheck {
            dispatch: "first",
            judged: false,
            ..auto_check(1.5, 1.5, 1.5)
        };
        let checks = [
            auto_check(1.02, 1.12, 1.01),
            // Over by lower quartiles, within paired: met.
            auto_check(1.11, 1.05, 1.03),
            // Within by lower quartiles and medians, over paired: not met.
            auto_check(0.97, 0.99, 1.131),
            first,
        ];
        let auto = render_auto(&checks);
        for part in [
            "with lower quartiles instead (shown, not judged): 2 of 3 cells within 1.10x, worst \
             1.110x",
            "with medians instead (shown, not judged): 2 of 3 cells within 1.10x, worst 1.120x",
            "2 of 3 cells within 1.10x; worst 1.131x (sequence, 256MiB host 1% \
             same-scattered N=4): NOT MET",
            "first dispatches alone (shown, not judged): 0 of 1 cells within 1.10x, worst 1.500x",
            "paired 1.131x of writeset  lower quartiles 0.970x of hash      medians 0.990x; \
             spread auto 1.200, hash 1.100; auto's slowest 1.300x  NOT MET",
            "paired 1.030x of writeset  lower quartiles 1.110x of hash",
            "paired 1.500x of writeset  lower quartiles 1.500x of hash      medians 1.500x; \
             spread auto 1.200, hash 1.100; auto's slowest 1.300x  (shown)",
        ] {
            assert!(auto.contains(part), "{part:?} in {auto}");
        }
        // The worst judged cell is listed first.
        let first_line = auto.lines().nth(1).unwrap();
        assert!(first_line.contains("paired 1.131x"), "{first_line}");
        // A ratio that could not be computed is not within the limit.
        let unknown = render_auto(&[auto_check(1.0, 1.0, f64::NAN)]);
        assert!(unknown.ends_with(": NOT MET\n"), "{unknown}");
        assert!(unknown.contains("0 of 1 cells within 1.10x"), "{unknown}");
        let within = [auto_check(1.3, 1.2, 1.09)];
        assert!(render_auto(&within).contains("1 of 1 cells within 1.10x; worst 1.090x"));
        assert!(render_auto(&within).ends_with(": met\n"));
        let control = render_control(&checks);
        assert!(
            control.contains(
                "paired (as judged for auto): 2 of 3 cells within 1.10x, worst 1.131x; lower \
                 quartiles: 2 of 3 cells within 1.10x, worst 1.110x; medians: 2 of 3 cells \
                 within 1.10x, worst 1.120x"
            ),
            "{control}"
        );
        assert!(render_control(&[]).is_empty());
    }

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
        let replay = replay_config(&options).unwrap();
        let defaults = ReplayConfig::default();
        assert_eq!(
            (replay.repeats, replay.long_repeats),
            (defaults.repeats, defaults.long_repeats)
        );
        let replay = replay_config(&BenchOptions {
            replay_repeats: (Some(9), Some(2)),
            ..options
        })
        .unwrap();
        assert_eq!((replay.repeats, replay.long_repeats), (9, 2));
    }

    #[test]
    fn a_small_matrix_prints_rows_with_ceilings_and_every_target() {
        let options = BenchOptions {
            footprints: vec![256 << 10],
            dirty_fractions: vec![0.0, 0.01],
            tiers: vec![StoreTier::Host],
            repeats: 1,
            replay_passes: vec![3],
            replay_dirty: vec![0.05],
            ..BenchOptions::default()
        };
        let mut out = Vec::new();
        let outcome = run(&options, &mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(
            text.contains("ceiling GB/s") && text.contains("copy_ceiling"),
            "{text}"
        );
        assert!(text.contains("copy: ") && text.contains(" by "), "{text}");
        assert!(
            text.contains("targets (judged from this run's rows):"),
            "{text}"
        );
        // Full copies and the hash pass are judged from passes taken in turn with their
        // ceiling, equally many of each, and the report says so.
        for part in [
            "256KiB host full snapshot: ",
            "256KiB host full restore: ",
            "256KiB host hash detect: ",
        ] {
            assert!(
                text.contains(&format!("paired with its ceiling: {part}")),
                "{part}: {text}"
            );
        }
        assert!(
            text.contains("median of 15 interleaved passes each"),
            "{text}"
        );
        assert!(text.contains("The table's ratios screen"), "{text}");
        let judged = &outcome.targets[0].detail;
        assert!(
            judged.contains("passes of each side taken in turn"),
            "{judged}"
        );
        for target in kreplay_benches::Target::ALL {
            assert!(
                text.contains(target.describe()),
                "{target:?} missing: {text}"
            );
        }
        // 2 ceilings; 4 strategies x (2 snapshots + 2 restores); 1 detect row.
        assert_eq!(outcome.rows.len(), 2 + 4 * 4 + 1);
        // 1 footprint x 1 tier x 1 dirty fraction x 4 patterns x 1 N x (6 strategies and the
        // control, full measured twice).
        assert_eq!(outcome.replay.len(), 4 * 7);
        // First dispatches, later dispatches and whole sequences per cell.
        assert_eq!(outcome.auto.len(), 4 * 3);
        assert_eq!(outcome.control.len(), 4 * 3);
        assert_eq!(outcome.auto.iter().filter(|c| c.judged).count(), 4);
        assert!(
            outcome
                .control
                .iter()
                .all(|c| c.best == RestoreStrategy::Full),
            "the control is held against full alone"
        );
        assert!(
            text.contains("whole replays") && text.contains("auto against"),
            "{text}"
        );
        assert!(
            text.contains("full (control)") && text.contains("control: full replayed a second"),
            "{text}"
        );
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

    #[test]
    fn whole_replays_too_large_for_this_machine_are_refused_before_running() {
        let Some(available) = available_memory() else {
            return;
        };
        // The matrix fits (5 footprints), the replays' store per strategy (6) does not.
        let footprint = available * 2 / 11;
        let options = BenchOptions {
            footprints: vec![footprint],
            replay_footprints: Some(vec![footprint]),
            ..BenchOptions::default()
        };
        let error = run(&options, &mut Vec::new()).unwrap_err();
        assert!(
            error.contains("choose smaller --replay-footprints"),
            "{error}"
        );
    }

    /// Records what was written by the time of each flush.
    #[derive(Default)]
    struct Flushes {
        text: Vec<u8>,
        at_flush: Vec<usize>,
    }

    impl Write for Flushes {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.text.extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            self.at_flush.push(self.text.len());
            Ok(())
        }
    }

    #[test]
    fn every_row_and_table_header_is_flushed_as_soon_as_it_is_measured() {
        let options = BenchOptions {
            footprints: vec![256 << 10],
            dirty_fractions: vec![0.0, 0.01],
            tiers: vec![StoreTier::Host],
            repeats: 1,
            replay_passes: vec![2],
            replay_dirty: vec![0.05],
            ..BenchOptions::default()
        };
        let mut out = Flushes::default();
        let outcome = run(&options, &mut out).unwrap();
        let text = String::from_utf8(out.text.clone()).unwrap();
        // Each table line ends exactly at a flush: it reached the reader before the next
        // measurement started.
        let mut ends = Vec::new();
        let mut pos = 0;
        for line in text.split_inclusive('\n') {
            pos += line.len();
            let header = line.trim_start().starts_with("footprint ");
            let matrix_row = line.starts_with("256KiB ");
            let replay_row = line.starts_with("  256KiB ")
                && (line.contains(" same-") || line.contains(" diff-"));
            if header || matrix_row || replay_row {
                ends.push(pos);
            }
        }
        // 2 table headers, the matrix rows and the replay rows.
        assert_eq!(
            ends.len(),
            2 + outcome.rows.len() + outcome.replay.len(),
            "{text}"
        );
        for end in ends {
            assert!(out.at_flush.contains(&end), "not flushed at {end}: {text}");
        }
        assert!(
            text.contains("cells within 1.10x; worst ") && text.contains(" spread auto "),
            "{text}"
        );
    }
}
