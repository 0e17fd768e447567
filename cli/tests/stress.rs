//! `kreplay stress` in the test suite: short seeded runs of the built binary (each bounded by the
//! command's own watchdog as well as by its few seconds of operations), with the whole mix,
//! re-entrant tool dispatches (from PASS ENTER and PASS EXIT, onto both agents) included.

mod support;

use std::process::Output;

fn kreplay(args: &[&str], env: &[(&str, &str)]) -> Output {
    support::kreplay_with(args, env)
}

fn text(output: &Output) -> String {
    format!(
        "--- stdout ---\n{}\n--- stderr ---\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

fn stress(extra: &[&str], env: &[(&str, &str)]) -> Output {
    let mut args = vec!["stress", "--seconds", "2", "--threads", "4"];
    args.extend_from_slice(extra);
    kreplay(&args, env)
}

/// The line starting with `prefix`.
fn line<'a>(out: &'a str, prefix: &str) -> &'a str {
    out.lines()
        .find(|l| l.starts_with(prefix))
        .unwrap_or_else(|| panic!("no line starting {prefix:?} in\n{out}"))
}

/// The number right after `label` in the line starting with `prefix`.
fn number_after(out: &str, prefix: &str, label: &str) -> u64 {
    let line = line(out, prefix);
    let at = line
        .find(label)
        .unwrap_or_else(|| panic!("no {label:?} in {line:?}"));
    let digits: String = line[at + label.len()..]
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    digits
        .parse()
        .unwrap_or_else(|_| panic!("no number after {label:?} in {line:?}"))
}

/// The number right before `label` in the line starting with `prefix`.
fn number_before(out: &str, prefix: &str, label: &str) -> u64 {
    let line = line(out, prefix);
    let at = line
        .find(label)
        .unwrap_or_else(|| panic!("no {label:?} in {line:?}"));
    let before = &line[..at];
    let start = before
        .rfind(|c: char| !c.is_ascii_digit())
        .map_or(0, |i| i + 1);
    before[start..]
        .parse()
        .unwrap_or_else(|_| panic!("no number before {label:?} in {line:?}"))
}

#[test]
fn a_short_seeded_stress_run_loses_no_byte_and_no_completion() {
    let output = stress(&["--seed", "7"], &[]);
    let out = text(&output);
    assert_eq!(output.status.code(), Some(0), "{out}");
    assert!(out.contains("stress: PASSED"), "{out}");
    assert!(
        out.contains("equal the reference run without kreplay"),
        "{out}"
    );
    assert!(out.contains("completions: 0 lost, 0 extra"), "{out}");
    // The run really mixed what it claims: replays with passes and restores, opted-out
    // dispatches, shared queues, dispatches on the peer agent, allocations, async copies and
    // context toggles.
    assert!(
        number_before(&out, "operations:", " dispatches") > 100,
        "{out}"
    );
    for label in [
        " to be replayed",
        " opted out",
        " on shared",
        " on the peer agent",
        " alloc/free",
        " async copies",
        " memory copies",
        " fills",
    ] {
        assert!(
            number_before(&out, "operations:", label) > 0,
            "{label}: {out}"
        );
    }
    assert!(number_before(&out, "replay:", " replayed") > 0, "{out}");
    assert!(number_before(&out, "replay:", " passes") > 0, "{out}");
    assert!(
        number_before(&out, "tool:", " toggles as specified") > 0,
        "{out}"
    );
    assert_every_reentrant_dispatch_completed(&out);
}

/// The tool issued re-entrant dispatches and every one completed (their effects on the tool's
/// buffer are checked by the command itself).
fn assert_every_reentrant_dispatch_completed(out: &str) {
    let issued = number_before(out, "tool:", " re-entrant dispatches completed");
    assert!(issued > 0, "{out}");
    assert!(
        line(out, "tool:").contains(&format!(", {issued} of {issued} re-entrant")),
        "{out}"
    );
}

#[test]
fn a_stress_run_with_injected_faults_loses_nothing_and_reports_the_faults() {
    let args = [
        "--seed",
        "11",
        "--faults",
        "copy:0.03,pool_allocate:0.03,async_copy:0.03,signal_create:0.05,slow_kernel:0.02@3,async_copy_delay:0.03@3",
    ];
    let output = stress(&args, &[]);
    let out = text(&output);
    assert_eq!(output.status.code(), Some(0), "{out}");
    assert!(out.contains("stress: PASSED"), "{out}");
    assert_every_reentrant_dispatch_completed(&out);
    assert!(out.contains("faults injected:"), "{out}");
    // kreplay creates signals for every replay: they fail too, and the replay is declined.
    assert!(
        number_after(&out, "faults injected:", "signal_create=") > 0,
        "{out}"
    );
    assert!(
        number_before(&out, "operations:", " runtime calls retried") > 0,
        "the application saw the faults and retried: {out}"
    );
}

/// On a ROCm 7 table every other asynchronous copy is a batch of two operations
/// (`hsa_amd_memory_async_batch_copy`), which kreplay fences with a completion signal of its
/// own: with copy faults and late copies, nothing is lost and every completion fires once.
#[test]
fn a_stress_run_on_a_rocm_7_table_issues_batch_copies_and_loses_nothing() {
    let args = [
        "--seed",
        "17",
        "--faults",
        "async_copy:0.03,async_copy_delay:0.05@3,copy:0.02",
    ];
    let output = stress(&args, &[("KREPLAY_SOFTHSA_TABLE", "7")]);
    let out = text(&output);
    assert_eq!(output.status.code(), Some(0), "{out}");
    assert!(out.contains("stress: PASSED"), "{out}");
    assert!(
        number_before(&out, "operations:", " as ROCm 7 batches") > 0,
        "{out}"
    );
    assert_every_reentrant_dispatch_completed(&out);
}

#[test]
fn a_stress_run_without_restores_reports_the_lost_bytes_and_exits_1() {
    let output = kreplay(
        &[
            "stress",
            "--seconds",
            "1",
            "--threads",
            "2",
            "--no-restore",
            "--no-memory-copy",
            "--no-fill",
            "--no-reentrant",
            "--no-opt-out",
        ],
        &[],
    );
    let out = text(&output);
    assert_eq!(output.status.code(), Some(1), "{out}");
    assert!(out.contains("differ from the reference"), "{out}");
    assert!(out.contains("stress: FAILED"), "{out}");
    assert!(
        out.contains("reproduce with: kreplay stress --seconds 1 --seed 1 --threads 2"),
        "{out}"
    );
}

#[test]
fn a_malformed_fault_spec_is_a_usage_error_naming_the_option_or_variable() {
    let output = kreplay(&["stress", "--faults", "copy:2"], &[]);
    assert_eq!(output.status.code(), Some(2), "{}", text(&output));
    assert!(
        text(&output).contains("'--faults <SPEC>'") && text(&output).contains("[0, 1]"),
        "{}",
        text(&output)
    );

    let output = kreplay(
        &["stress", "--seconds", "1"],
        &[("KREPLAY_SOFTHSA_FAULTS", "stall:0.1")],
    );
    assert_eq!(output.status.code(), Some(1), "{}", text(&output));
    assert!(
        text(&output).contains("KREPLAY_SOFTHSA_FAULTS") && text(&output).contains("'stall'"),
        "{}",
        text(&output)
    );
}

#[test]
fn stress_options_parse_and_bad_values_name_the_option() {
    use kreplay_cli::args::{Command as Cli, parse};
    let Ok(Cli::Stress(options)) = parse([
        "stress",
        "--seconds",
        "5",
        "--seed",
        "18446744073709551615",
        "--threads=2",
        "--no-fill",
        "--no-reentrant",
        "--faults",
        "copy:0.5,seed:3",
    ]) else {
        panic!("a valid stress command line");
    };
    assert_eq!(
        (options.seconds, options.seed, options.threads),
        (5, u64::MAX, 2)
    );
    assert!(!options.mix.fill && options.mix.memory_copy && !options.reentrant && options.toggles);
    assert_eq!(options.faults.as_deref(), Some("copy:0.5,seed:3"));
    for (args, needle) in [
        (vec!["stress", "--seconds", "0"], "'--seconds <S>'"),
        (vec!["stress", "--threads", "100000"], "'--threads <N>'"),
        (vec!["stress", "--seed", "-1"], "'--seed <X>'"),
        (
            vec!["stress", "--faults", "slow_kernel:0.1@x"],
            "'--faults <SPEC>'",
        ),
        (
            vec!["stress", "--no-fill", "--no-fill"],
            "cannot be used multiple times",
        ),
    ] {
        let error = parse(args.clone()).expect_err(&format!("{args:?}"));
        assert!(error.to_string().contains(needle), "{args:?}: {error}");
    }
}

#[test]
fn a_stress_run_with_queues_stalled_past_the_drain_budget_loses_nothing() {
    let args = ["--seed", "13", "--faults", "queue_stall:0.004@200"];
    let output = stress(&args, &[("KREPLAY_DRAIN_TIMEOUT_MS", "100")]);
    let out = text(&output);
    assert_eq!(output.status.code(), Some(0), "{out}");
    assert!(out.contains("stress: PASSED"), "{out}");
    assert!(
        number_after(&out, "faults injected:", "queue_stall=") > 0,
        "{out}"
    );
}

#[test]
fn faults_come_from_the_environment_when_no_option_names_them() {
    let args = ["--seed", "5"];
    let output = stress(
        &args,
        &[(
            "KREPLAY_SOFTHSA_FAULTS",
            "pool_allocate:0.05,async_copy:0.05",
        )],
    );
    let out = text(&output);
    assert_eq!(output.status.code(), Some(0), "{out}");
    assert!(
        out.contains("faults: async_copy:0.05,pool_allocate:0.05,seed:5"),
        "the variable's plan, drawn from --seed: {out}"
    );
    assert!(out.contains("faults injected:"), "{out}");
}

/// The command line printed to repeat a failed run carries the `KREPLAY_*` settings the run was
/// made under (a ROCm 7 table adds batch copies to the mix; the restore strategy and store tier
/// change what is tested): it gave the options only, so the line ran another test.
#[test]
fn the_reproducing_command_line_carries_the_settings_of_the_run() {
    // The run's replays spill their few KiB to the system temporary directory (file tier).
    if !support::spill_room(&std::env::temp_dir(), 16 << 20) {
        return;
    }
    let output = kreplay(
        &["stress", "--seconds", "1", "--threads", "1", "--no-restore"],
        &[
            ("KREPLAY_SOFTHSA_TABLE", "7"),
            ("KREPLAY_RESTORE", "hash"),
            ("KREPLAY_SNAPSHOT_STORE", "file"),
            ("KREPLAY_SOFTHSA_FAULTS", "copy:0.001"),
        ],
    );
    let out = text(&output);
    assert_eq!(output.status.code(), Some(1), "{out}");
    let repro = line(&out, "reproduce with: ");
    assert!(
        repro.starts_with(
            "reproduce with: KREPLAY_RESTORE=hash KREPLAY_SNAPSHOT_STORE=file \
             KREPLAY_SOFTHSA_TABLE=7 kreplay stress --seconds 1 --seed 1 --threads 1 \
             --faults copy:0.001,seed:1"
        ),
        "{repro}"
    );
    // The faults are in --faults, which wins over the variable: not repeated.
    assert!(!repro.contains("KREPLAY_SOFTHSA_FAULTS"), "{repro}");
}
