//! `kreplay stress`: the stress mix ([`kreplay_workloads::stress`]) under kreplay and the stress
//! tool ([`tool`]), optionally with softhsa's fault injection, then again without kreplay and
//! without faults as the reference; every buffer is compared, every completion accounted for.
//!
//! 1. kreplay is loaded into a private copy of softhsa's table (as `kreplay demo` does) with the
//!    stress tool; the fault plan is switched on; the application threads run for `--seconds`.
//! 2. The faults are switched off, kreplay is unloaded, and the same per-thread operation
//!    sequences run through softhsa's own table: the reference.
//! 3. The report: operations, replays, passes, bytes restored, declines per reason, failures,
//!    faults that struck, the tool's checks, and the comparison. Any differing byte, lost or
//!    extra completion, stopped thread or tool problem fails the run.

pub mod tool;

use std::collections::BTreeMap;
use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::args::StressOptions;
use crate::format::format_bytes;
use kreplay_passloop::{RanOnceReason, ReplayOutcome, ReplayRecord};
use kreplay_softhsa::OwnedApiTable;
use kreplay_softhsa::faults::{self, Fault, FaultPlan};
use kreplay_softhsa::testing::Hsa;
use kreplay_workloads::stress::{self as workload, Limit, StressConfig, StressRun};

/// How a stress run ended (when it ran to the end).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StressOutcome {
    /// Nothing lost, nothing extra, no problem.
    pub passed: bool,
}

static RAN: AtomicBool = AtomicBool::new(false);

/// Words per tool buffer.
const TOOL_WORDS: u32 = 256;

/// The fault plan of a run: `--faults`, else `KREPLAY_SOFTHSA_FAULTS`, else none. A spec without
/// `seed:` draws from the run's seed.
pub fn fault_plan(options: &StressOptions) -> Result<Option<FaultPlan>, String> {
    let (spec, plan) = match &options.faults {
        Some(spec) => (
            spec.clone(),
            FaultPlan::parse(spec).map_err(|e| format!("--faults '{spec}': {e}"))?,
        ),
        None => match FaultPlan::from_env()? {
            Some(plan) => (std::env::var(faults::ENV_VAR).unwrap_or_default(), plan),
            None => return Ok(None),
        },
    };
    let mut plan = plan;
    if !spec.contains("seed") {
        plan.seed = options.seed;
    }
    Ok(Some(plan))
}

/// Runs `kreplay stress`, printing the report to `out`.
pub fn run(options: &StressOptions, out: &mut dyn Write) -> Result<StressOutcome, String> {
    if RAN.swap(true, Ordering::SeqCst) {
        return Err(
            "the stress run already ran in this process (kreplay installs into one HSA \
                    table per process)"
                .into(),
        );
    }
    let plan = fault_plan(options)?;
    // From here on this command decides when faults strike (softhsa would otherwise read
    // KREPLAY_SOFTHSA_FAULTS itself at every hsa_init, the reference run's too).
    faults::install(None);
    let kernels = workload::kernels::StressKernels::register();
    let config = StressConfig {
        threads: options.threads,
        seed: options.seed,
        mix: options.mix,
        ..StressConfig::default()
    };
    let tool_config = tool::ToolConfig {
        replayed_kernel: kernels.replayed,
        toggles: options.toggles,
        reentrant_every: if options.reentrant { 4 } else { 0 },
    };

    // A watchdog: whatever happens below, the command ends.
    let limit = Duration::from_secs(options.seconds) + Duration::from_secs(180);
    std::thread::Builder::new()
        .name("stress-watchdog".into())
        .spawn(move || {
            let start = Instant::now();
            // Waits for the wall clock only: the process exits if it is still running then.
            while start.elapsed() < limit {
                std::thread::park_timeout(limit - start.elapsed());
            }
            eprintln!(
                "kreplay: error: the stress run did not end within {limit:?} (a hang): failing"
            );
            std::process::exit(crate::args::EXIT_FAILURE);
        })
        .map_err(|e| format!("cannot start the watchdog: {e}"))?;

    // 1. Under kreplay, with faults.
    tool::register(tool_config)?;
    kreplay::hsa_tool::set_collect_replay_records(true);
    if !options.restore {
        kreplay::hsa_tool::set_skip_restore_for_demo(true);
    }
    let source = kreplay_softhsa::api_table();
    let mut table = OwnedApiTable::softhsa();
    // SAFETY: softhsa's own table is complete and static.
    let hold = unsafe { Hsa::from_table(source) }
        .init()
        .map_err(|s| format!("hsa_init returned {s:#x}"))?;
    // SAFETY: `table` is a complete, writable copy of softhsa's table that outlives every call
    // made through it (it is dropped at the end of this function, after on_unload).
    unsafe { crate::hosted::load_kreplay(table.as_mut_ptr()) }?;
    let dispatcher = if options.reentrant {
        // SAFETY: the table kreplay is installed in, alive until after on_unload.
        Some(unsafe {
            workload::tool_side::ToolDispatcher::new(table.table(), kernels.tool_add, TOOL_WORDS)
        }?)
    } else {
        None
    };
    if let Some(dispatcher) = dispatcher {
        tool::set_dispatcher(dispatcher);
    }
    faults::reset_counts();
    faults::install(plan.clone());
    // SAFETY: as above.
    let profiled = unsafe {
        workload::run(
            table.table(),
            kernels,
            &config,
            &Limit::Time(Duration::from_secs(options.seconds)),
        )
    };
    faults::install(None);
    let fired: Vec<(Fault, u64)> = Fault::ALL
        .iter()
        .map(|&f| (f, faults::fired(f)))
        .filter(|&(_, n)| n > 0)
        .collect();
    let tool_buffer = tool::take_dispatcher().map(|d| d.values());
    kreplay::hsa_tool::on_unload();
    drop(hold);
    let profiled = profiled?;
    let records = kreplay::hsa_tool::take_replay_records();
    let tool_report = tool::report();

    // 2. The reference: the same operations, no kreplay, no faults.
    // SAFETY: softhsa's own table is complete and static.
    let reference = unsafe {
        workload::run(
            source,
            kernels,
            &config,
            &Limit::Ops(profiled.ops_per_thread.clone()),
        )
    }?;

    // 3. Report.
    let report = Report::build(
        options,
        plan.as_ref(),
        &profiled,
        &reference,
        &records,
        &tool_report,
        tool_buffer.as_deref(),
        &fired,
    );
    out.write_all(report.text.as_bytes())
        .and_then(|()| out.flush())
        .map_err(|e| format!("cannot write the report: {e}"))?;
    drop(table);
    Ok(StressOutcome {
        passed: report.passed,
    })
}

struct Report {
    text: String,
    passed: bool,
}

#[derive(Default)]
struct ReplayTotals {
    through_loop: u64,
    replayed: u64,
    opted_out: u64,
    single_pass: u64,
    passes: u64,
    bytes_restored: u64,
    declines: BTreeMap<String, u64>,
    pass_failures: u64,
    restore_failures: u64,
    bytes_unrestored: u64,
}

impl ReplayTotals {
    fn of(records: &[ReplayRecord]) -> Self {
        let mut totals = ReplayTotals::default();
        for record in records {
            totals.through_loop += 1;
            totals.passes += record.cost.passes_run;
            totals.bytes_restored += record.cost.bytes_restored;
            match &record.outcome {
                ReplayOutcome::Replayed { .. } => totals.replayed += 1,
                ReplayOutcome::RanOnce { why } => match why {
                    RanOnceReason::OptedOut => totals.opted_out += 1,
                    RanOnceReason::SinglePass => totals.single_pass += 1,
                    RanOnceReason::Declined(decline) => {
                        *totals
                            .declines
                            .entry(decline.reason.to_string())
                            .or_default() += 1;
                    }
                    #[allow(unreachable_patterns)]
                    other => {
                        *totals.declines.entry(format!("{other:?}")).or_default() += 1;
                    }
                },
                ReplayOutcome::PassFailed { decline, .. } => {
                    totals.pass_failures += 1;
                    *totals
                        .declines
                        .entry(format!("{} (pass failed)", decline.reason))
                        .or_default() += 1;
                }
                ReplayOutcome::RestoreFailed { failure, .. } => {
                    totals.restore_failures += 1;
                    totals.bytes_unrestored += failure.bytes_unrestored;
                }
                #[allow(unreachable_patterns)]
                other => {
                    *totals.declines.entry(format!("{other:?}")).or_default() += 1;
                }
            }
        }
        totals
    }
}

impl Report {
    #[allow(clippy::too_many_arguments)]
    fn build(
        options: &StressOptions,
        plan: Option<&FaultPlan>,
        profiled: &StressRun,
        reference: &StressRun,
        records: &[ReplayRecord],
        tool: &tool::ToolReport,
        tool_buffer: Option<&[u32]>,
        fired: &[(Fault, u64)],
    ) -> Report {
        let mut text = String::new();
        let mut failures: Vec<String> = Vec::new();
        let ops: u64 = profiled.ops_per_thread.iter().sum();
        let c = &profiled.counts;
        text.push_str(&format!(
            "kreplay stress: seed {}, {} threads, {} GPU agents, {:.1} s, faults: {}\n",
            options.seed,
            options.threads,
            profiled.agents,
            profiled.elapsed.as_secs_f64(),
            plan.map_or_else(|| "none".to_string(), FaultPlan::to_spec),
        ));
        text.push_str(&format!("mix: {}\n", mix_line(options)));
        text.push_str(&format!(
            "operations: {ops} ({} dispatches: {} to be replayed, {} opted out, {} on shared \
             queues, {} on the peer agent; {} alloc/free, {} async copies{}, {} memory copies, {} \
             fills; {} runtime calls retried)\n",
            c.dispatches(),
            c.replayed_dispatches,
            c.opted_out_dispatches,
            c.shared_queue_dispatches,
            c.peer_dispatches,
            c.alloc_frees,
            c.async_copies,
            if c.batch_copies > 0 {
                format!(" ({} as ROCm 7 batches)", c.batch_copies)
            } else {
                String::new()
            },
            c.memory_copies,
            c.fills,
            c.retries,
        ));
        let totals = ReplayTotals::of(records);
        text.push_str(&format!(
            "replay: {} dispatches through the loop, {} replayed, {} opted out, {} single-pass; \
             {} passes, {} restored\n",
            totals.through_loop,
            totals.replayed,
            totals.opted_out,
            totals.single_pass,
            totals.passes,
            format_bytes(totals.bytes_restored),
        ));
        let declines: u64 = totals.declines.values().sum();
        let decline_list = if totals.declines.is_empty() {
            "none".to_string()
        } else {
            totals
                .declines
                .iter()
                .map(|(reason, n)| format!("{reason}={n}"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        text.push_str(&format!("declines: {declines} ({decline_list})\n"));
        text.push_str(&format!(
            "failures reported by kreplay: {} restore failures ({} lost), {} failed passes\n",
            totals.restore_failures,
            format_bytes(totals.bytes_unrestored),
            totals.pass_failures,
        ));
        if plan.is_some() {
            let list = if fired.is_empty() {
                "none".to_string()
            } else {
                fired
                    .iter()
                    .map(|(f, n)| format!("{}={n}", f.name()))
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            text.push_str(&format!("faults injected: {list}\n"));
        }
        text.push_str(&format!(
            "tool: {} CONFIG ENTER / {} EXIT, {} passes, {} toggles as specified, {} pass \
             records, {} plain records",
            tool.config_enters,
            tool.config_exits,
            tool.passes,
            tool.toggles_ok,
            tool.pass_records,
            tool.plain_records,
        ));
        if options.reentrant {
            text.push_str(&format!(
                ", {} of {} re-entrant dispatches completed",
                tool.reentrant_completed, tool.reentrant_issued
            ));
        }
        text.push('\n');
        if tool.config_enters != tool.config_exits {
            failures.push(format!(
                "{} CONFIG ENTER but {} CONFIG EXIT",
                tool.config_enters, tool.config_exits
            ));
        }
        for problem in tool.problems.iter().take(10) {
            text.push_str(&format!("  tool problem: {problem}\n"));
        }
        if !tool.problems.is_empty() {
            failures.push(format!("{} tool problems", tool.problems.len()));
        }
        if options.reentrant {
            match tool_buffer {
                Some(values) => {
                    let expected = tool.reentrant_completed as u32;
                    let wrong = values.iter().filter(|&&v| v != expected).count();
                    if wrong > 0 {
                        failures.push(format!(
                            "the tool's buffer shows {wrong} of {} words unlike the {expected} \
                             re-entrant dispatches that completed (e.g. {:?}): their effects \
                             did not survive, or ran more than once",
                            values.len(),
                            values.first()
                        ));
                    }
                }
                None => failures.push(
                    "a re-entrant tool dispatch never completed; its buffer was abandoned".into(),
                ),
            }
        }

        let comparison = workload::compare(reference, profiled);
        for detail in &comparison.details {
            text.push_str(&format!("  differs: {detail}\n"));
        }
        if comparison.equal() {
            text.push_str(&format!(
                "buffers: all {} equal the reference run without kreplay (hashes compared)\n",
                comparison.buffers
            ));
        } else {
            text.push_str(&format!(
                "buffers: {} of {} differ from the reference, {} bytes lost\n",
                comparison.differing, comparison.buffers, comparison.bytes_differing
            ));
            failures.push(format!("{} bytes lost", comparison.bytes_differing));
        }
        text.push_str(&format!(
            "completions: {} lost, {} extra\n",
            profiled.lost_completions, profiled.extra_completions
        ));
        if profiled.lost_completions > 0 || profiled.extra_completions > 0 {
            failures.push(format!(
                "{} lost and {} extra completions",
                profiled.lost_completions, profiled.extra_completions
            ));
        }
        for error in profiled.errors.iter().chain(&reference.errors) {
            text.push_str(&format!("  stopped: {error}\n"));
        }
        if !profiled.errors.is_empty() || !reference.errors.is_empty() {
            failures.push(format!(
                "{} application threads stopped early",
                profiled.errors.len() + reference.errors.len()
            ));
        }
        let passed = failures.is_empty();
        if passed {
            text.push_str("stress: PASSED (nothing lost, every completion fired once)\n");
        } else {
            text.push_str(&format!("stress: FAILED: {}\n", failures.join("; ")));
            text.push_str(&format!(
                "reproduce with: {}kreplay {}\n",
                reproduce_settings(),
                reproduce(options, plan)
            ));
        }
        Report { text, passed }
    }
}

fn mix_line(options: &StressOptions) -> String {
    let m = options.mix;
    let mut on = vec!["replayed dispatches"];
    let switches = [
        (m.opt_out, "opted-out dispatches"),
        (m.shared_queues, "shared queues"),
        (m.alloc_free, "alloc/free"),
        (m.async_copy, "async copies"),
        (m.memory_copy, "memory copies"),
        (m.fill, "fills"),
        (m.peers, "peer access"),
        (options.toggles, "context toggles"),
        (options.reentrant, "re-entrant tool dispatches"),
    ];
    let mut off = Vec::new();
    for (enabled, name) in switches {
        if enabled {
            on.push(name);
        } else {
            off.push(name);
        }
    }
    let mut line = on.join(", ");
    if !off.is_empty() {
        line.push_str(&format!(" (off: {})", off.join(", ")));
    }
    if !options.restore {
        line.push_str(" [restores SKIPPED]");
    }
    line
}

/// The command line that repeats this run.
/// The `KREPLAY_*` settings of this process that a repeated run needs, as `NAME=value ` words
/// in name order (shell-quoted where needed). `KREPLAY_SOFTHSA_FAULTS` is left out: the faults
/// are given as `--faults`, which wins over it.
fn reproduce_settings() -> String {
    let mut settings: Vec<(String, String)> = std::env::vars_os()
        .filter_map(|(name, value)| Some((name.into_string().ok()?, value)))
        .filter(|(name, _)| name.starts_with("KREPLAY_") && name != "KREPLAY_SOFTHSA_FAULTS")
        .map(|(name, value)| (name, value.to_string_lossy().into_owned()))
        .collect();
    settings.sort();
    settings
        .iter()
        .map(|(name, value)| format!("{name}={} ", shell_word(value)))
        .collect()
}

/// `text` as one shell word: as it is when it holds only characters no shell treats specially,
/// else in single quotes.
fn shell_word(text: &str) -> String {
    let plain = !text.is_empty()
        && text
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_.,:/@%+=-".contains(&b));
    if plain {
        text.to_owned()
    } else {
        format!("'{}'", text.replace('\'', "'\\''"))
    }
}

fn reproduce(options: &StressOptions, plan: Option<&FaultPlan>) -> String {
    let m = options.mix;
    let mut line = format!(
        "stress --seconds {} --seed {} --threads {}",
        options.seconds, options.seed, options.threads
    );
    if let Some(plan) = plan {
        line.push_str(&format!(" --faults {}", plan.to_spec()));
    }
    for (enabled, flag) in [
        (m.opt_out, "--no-opt-out"),
        (m.shared_queues, "--no-shared-queues"),
        (m.alloc_free, "--no-alloc-free"),
        (m.async_copy, "--no-async-copy"),
        (m.memory_copy, "--no-memory-copy"),
        (m.fill, "--no-fill"),
        (m.peers, "--no-peers"),
        (options.toggles, "--no-toggles"),
        (options.reentrant, "--no-reentrant"),
        (options.restore, "--no-restore"),
    ] {
        if !enabled {
            line.push(' ');
            line.push_str(flag);
        }
    }
    line
}

#[cfg(test)]
mod tests {
    use super::shell_word;

    #[test]
    fn a_setting_is_quoted_only_where_a_shell_would_split_or_expand_it() {
        assert_eq!(shell_word("writeset-unverified"), "writeset-unverified");
        assert_eq!(shell_word("/tmp/a:/tmp/b"), "/tmp/a:/tmp/b");
        assert_eq!(shell_word(""), "''");
        assert_eq!(shell_word("a b"), "'a b'");
        assert_eq!(shell_word("$HOME"), "'$HOME'");
        assert_eq!(shell_word("it's"), "'it'\\''s'");
    }
}
