//! `KREPLAY_*` settings are checked before any command measures or runs anything (`kreplay run`:
//! before the program starts): a bad value, or a spill folder where no spill file can be
//! created, is an error naming it, at once.

mod support;

use std::path::PathBuf;
use std::process::Output;
use std::time::{Duration, Instant};

/// Runs `kreplay args...` with `settings` as the only `KREPLAY_*` variables.
fn kreplay(args: &[&str], settings: &[(&str, &str)]) -> Output {
    support::kreplay_with(args, settings)
}

/// A command line of every command that installs kreplay, each small.
const COMMANDS: [&[&str]; 5] = [
    &["demo", "--elements", "1k"],
    &[
        "bench",
        "--footprints",
        "4K",
        "--passes",
        "none",
        "--repeats",
        "1",
    ],
    &["bench-dispatch", "--dispatches", "10", "--allocations", "1"],
    &["stress", "--seconds", "1", "--threads", "2"],
    &["profile", "--pmc", "SQ_WAVES", "--", "saxpy"],
];

fn assert_refused_at_start(args: &[&str], settings: &[(&str, &str)], named: &str) {
    let started = Instant::now();
    let output = kreplay(args, settings);
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(
        output.status.code(),
        Some(1),
        "{args:?}: {stdout}\n{stderr}"
    );
    assert!(stderr.contains(named), "{args:?} names {named}: {stderr}");
    assert_eq!(
        stderr.lines().count(),
        1,
        "{args:?}: one error, no dispatch declined one by one: {stderr}"
    );
    assert!(
        !stdout.contains("dispatch") && !stdout.contains("GB/s"),
        "{args:?}: nothing ran: {stdout}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "{args:?} ran first"
    );
}

#[test]
fn a_bad_setting_is_an_error_for_every_command_before_it_runs() {
    for args in COMMANDS {
        assert_refused_at_start(args, &[("KREPLAY_RESTORE", "bogus")], "KREPLAY_RESTORE");
    }
}

#[test]
fn bench_on_cuda_refuses_a_bad_setting_before_it_looks_for_a_driver() {
    // It read no setting at all: KREPLAY_RESTORE=bogus measured on a GPU machine without a
    // word, and here the missing driver was reported instead of the bad value.
    let args = [
        "bench",
        "--backend",
        "cuda",
        "--footprints",
        "64K",
        "--passes",
        "none",
        "--repeats",
        "1",
    ];
    for (setting, named) in [
        (("KREPLAY_RESTORE", "bogus"), "KREPLAY_RESTORE"),
        (("KREPLAY_MAX_PASSES", "0"), "KREPLAY_MAX_PASSES"),
        (
            ("KREPLAY_CUDA_DEVICE_HEAP", "bogus"),
            "KREPLAY_CUDA_DEVICE_HEAP",
        ),
    ] {
        assert_refused_at_start(&args, &[setting], named);
    }
}

#[test]
fn an_unknown_software_runtime_table_layout_is_an_error_for_every_command_before_it_runs() {
    // KREPLAY_SOFTHSA_TABLE=7.0 meant the ROCm 7 layout; it ran on the 5.2 one instead, with a
    // line on stderr and exit 0.
    for args in COMMANDS {
        assert_refused_at_start(
            args,
            &[("KREPLAY_SOFTHSA_TABLE", "7.0")],
            "KREPLAY_SOFTHSA_TABLE",
        );
    }
}

#[test]
fn a_spill_folder_that_cannot_hold_files_is_an_error_for_every_command_before_it_runs() {
    let missing = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("settings-{}-no-such-folder", std::process::id()));
    let missing = missing.to_str().unwrap();
    for args in COMMANDS {
        assert_refused_at_start(args, &[("KREPLAY_SPILL_DIR", missing)], missing);
        // The variable too, not the snapshot configuration's field (`spill_dir`).
        assert_refused_at_start(args, &[("KREPLAY_SPILL_DIR", missing)], "KREPLAY_SPILL_DIR");
    }
}

#[test]
fn bench_spills_its_file_tier_in_the_spill_folder() {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("settings-{}-spill", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    if !support::spill_room(&dir, 1 << 20) {
        let _ = std::fs::remove_dir(&dir);
        return;
    }
    let output = kreplay(
        &[
            "bench",
            "--footprints",
            "64K",
            "--passes",
            "none",
            "--repeats",
            "1",
            "--tiers",
            "file",
            "--strategies",
            "full",
            "--dirty",
            "0",
        ],
        &[("KREPLAY_SPILL_DIR", dir.to_str().unwrap())],
    );
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(output.status.code(), Some(0), "{stdout}");
    assert!(
        stdout.contains(&format!("file tier spills in {}", dir.display())),
        "{stdout}"
    );
    assert!(
        stdout
            .lines()
            .any(|l| l.contains(" file ") && l.contains(" restore "))
    );
    assert_eq!(
        std::fs::read_dir(&dir).unwrap().count(),
        0,
        "spill files are unlinked"
    );
    std::fs::remove_dir(dir).unwrap();
}

/// `kreplay run --backend BACKEND [extra] --library FAKE -- PROGRAM`, where PROGRAM only notes
/// that it ran; returns whether it ran.
fn run_command(
    name: &str,
    backend: &str,
    extra: &[&str],
    settings: &[(&str, &str)],
) -> (Output, bool) {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("settings-{}-run-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let lib = dir.join("libkreplay.so");
    std::fs::write(&lib, b"not loaded").unwrap();
    let ran = dir.join("ran");
    let program = dir.join("app.sh");
    support::write_executable(&program, &format!("#!/bin/sh\ntouch '{}'\n", ran.display()));
    let mut args = vec!["run", "--backend", backend];
    args.extend_from_slice(extra);
    args.extend(["--library", lib.to_str().unwrap(), "--"]);
    args.push(program.to_str().unwrap());
    let output = kreplay(&args, settings);
    (output, ran.exists())
}

#[test]
fn run_refuses_a_bad_setting_before_the_program_runs() {
    // The injected library would refuse to load, after which the whole program (hours of
    // training) runs unprofiled and the run ends with "recorded nothing"; with KREPLAY_LOG=off
    // not even the program's standard error says why.
    let missing = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!(
        "settings-{}-run-no-such-folder",
        std::process::id()
    ));
    let missing = missing.to_str().unwrap();
    for (backend, setting, named) in [
        ("hsa", ("KREPLAY_RESTORE", "bogus"), "KREPLAY_RESTORE"),
        ("cuda", ("KREPLAY_MAX_PASSES", "0"), "KREPLAY_MAX_PASSES"),
        ("hsa", ("KREPLAY_SPILL_DIR", missing), missing),
        ("hsa", ("KREPLAY_SPILL_DIR", missing), "KREPLAY_SPILL_DIR"),
        (
            "cuda",
            ("KREPLAY_CUDA_DEVICE_HEAP", "bogus"),
            "KREPLAY_CUDA_DEVICE_HEAP",
        ),
    ] {
        let (output, ran) = run_command("bad", backend, &[], &[setting, ("KREPLAY_LOG", "off")]);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!ran, "{setting:?}: the program ran first: {stderr}");
        assert_eq!(output.status.code(), Some(1), "{setting:?}: {stderr}");
        assert!(
            stderr.contains(named),
            "{setting:?} names {named}: {stderr}"
        );
    }
    // What kreplay run sets itself is not the environment's to spoil.
    for (extra, setting) in [
        (
            &["--scope", "agent"][..],
            ("KREPLAY_SNAPSHOT_SCOPE", "bogus"),
        ),
        (&["--passes", "3"][..], ("KREPLAY_PASSES", "bogus")),
        (&[][..], ("KREPLAY_CUDA_PASSES", "bogus")),
    ] {
        let (output, ran) = run_command("overridden", "hsa", extra, &[setting]);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            ran && !stderr.contains(setting.0),
            "{extra:?} {setting:?}: {stderr}"
        );
    }
}

#[test]
fn run_refuses_more_passes_than_the_cap_on_passes_allows() {
    // Every launch would be declined (invalid_pass_count) and run once: the whole program
    // would run for a table of declines and a warning per launch.
    let (output, ran) = run_command(
        "over-cap",
        "hsa",
        &["--passes", "8"],
        &[("KREPLAY_MAX_PASSES", "4")],
    );
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!ran, "the program ran first: {stderr}");
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("--passes 8") && stderr.contains("KREPLAY_MAX_PASSES"),
        "{stderr}"
    );
    let (_, ran) = run_command(
        "at-cap",
        "hsa",
        &["--passes", "4"],
        &[("KREPLAY_MAX_PASSES", "4")],
    );
    assert!(ran, "4 passes are within a cap of 4");
}

#[test]
fn the_demo_help_says_how_a_tracked_restore_shows_in_the_strategy_column() {
    // KREPLAY_RESTORE=tracked showed `writeset` in every row, and the help listed no
    // `tracked`: the setting looked ignored.
    let output = kreplay(
        &["demo", "--elements", "64k"],
        &[("KREPLAY_RESTORE", "tracked")],
    );
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(output.status.code(), Some(0), "{stdout}");
    let rows: Vec<&str> = stdout
        .lines()
        .filter(|l| l.trim_start().starts_with(|c: char| c.is_ascii_digit()))
        .collect();
    assert!(
        !rows.is_empty() && rows.iter().all(|l| l.contains(" writeset ")),
        "{stdout}"
    );
    let help = kreplay(&["demo", "--help"], &[]);
    let help = String::from_utf8_lossy(&help.stdout);
    let words = help.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(
        words.contains("a tracked restore (KREPLAY_RESTORE=tracked"),
        "{help}"
    );
}

#[test]
fn the_cuda_choices_take_any_case_as_every_other_choice_does() {
    // KREPLAY_RESTORE=Tracked, KREPLAY_LOG=Info and the like are read in any case, with
    // spaces around; KREPLAY_CUDA_DEVICE_HEAP=Trust and KREPLAY_CUDA_AUTO_DEVICE=MODEL were
    // refused (spaces were taken).
    for setting in [
        ("KREPLAY_RESTORE", " Tracked "),
        ("KREPLAY_CUDA_DEVICE_HEAP", "Trust"),
        ("KREPLAY_CUDA_DEVICE_HEAP", " DECLINE "),
        ("KREPLAY_CUDA_AUTO_DEVICE", "MODEL"),
        ("KREPLAY_CUDA_AUTO_DEVICE", " Measured"),
    ] {
        let (output, ran) = run_command("cuda-case", "cuda", &[], &[setting]);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(ran && !stderr.contains(setting.0), "{setting:?}: {stderr}");
    }
}

#[test]
fn a_drain_timeout_or_built_in_pass_count_of_zero_is_an_error_for_every_command() {
    // README: both are at least 1; 0 is not "no timeout" or "off".
    for args in COMMANDS {
        for setting in [("KREPLAY_DRAIN_TIMEOUT_MS", "0"), ("KREPLAY_PASSES", "0")] {
            assert_refused_at_start(args, &[setting], setting.0);
        }
    }
}

#[test]
fn the_store_setting_forces_its_tier_and_auto_keeps_host_memory_on_the_software_runtime() {
    for (store, tier) in [
        ("device", "device"),
        ("host", "host"),
        ("file", "file"),
        (" FILE ", "file"),
        ("auto", "host"),
    ] {
        // The file tier spills the demo's few KiB to the system temporary directory.
        if tier == "file" && !support::spill_room(&std::env::temp_dir(), 1 << 20) {
            continue;
        }
        let output = kreplay(
            &["demo", "--elements", "1k"],
            &[("KREPLAY_SNAPSHOT_STORE", store)],
        );
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert_eq!(output.status.code(), Some(0), "{store}: {stdout}");
        let rows: Vec<&str> = stdout
            .lines()
            .filter(|l| l.trim_start().starts_with(|c: char| c.is_ascii_digit()))
            .collect();
        assert!(
            !rows.is_empty() && rows.iter().all(|l| l.contains(&format!(" {tier} "))),
            "{store}: every row in the {tier} tier: {stdout}"
        );
    }
}

#[test]
fn a_snapshot_budget_below_the_footprint_declines_every_replay_whatever_the_tier() {
    for store in ["device", "host", "file", "auto"] {
        let output = kreplay(
            &["demo", "--elements", "1k"],
            &[
                ("KREPLAY_MAX_SNAPSHOT_BYTES", "4 KiB"),
                ("KREPLAY_SNAPSHOT_STORE", store),
            ],
        );
        let stdout = String::from_utf8_lossy(&output.stdout);
        let stderr = String::from_utf8_lossy(&output.stderr);
        // Not replayed as planned: the demo says so with exit status 1.
        assert_eq!(output.status.code(), Some(1), "{store}: {stdout}");
        assert!(
            stdout.contains("dispatches: 12, 0 replayed"),
            "{store}: {stdout}"
        );
        assert_eq!(
            stderr
                .lines()
                .filter(|l| l.contains("footprint_budget") && l.contains("4096 bytes"))
                .count(),
            12,
            "{store}: {stderr}"
        );
    }
}

#[test]
fn a_record_folder_that_does_not_exist_is_an_error_for_every_command_before_it_runs() {
    // bench measured past it with exit 0, and bench-dispatch found out in its first child.
    let missing = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("settings-{}-no-record-folder", std::process::id()));
    let missing = missing.to_str().unwrap();
    for args in COMMANDS {
        assert_refused_at_start(
            args,
            &[("KREPLAY_RECORD_DIR", missing)],
            "KREPLAY_RECORD_DIR",
        );
    }
}

#[test]
fn a_bad_software_runtime_poll_or_fault_setting_is_one_error_for_every_command_before_it_runs() {
    // They were read only by the hsa_init that starts the runtime: two lines (the runtime's,
    // then a failed hsa_init) for most commands, and bench, which starts none, ran past them,
    // unlike KREPLAY_SOFTHSA_TABLE.
    for args in COMMANDS {
        for setting in [
            ("KREPLAY_SOFTHSA_POLL_US", "2000000"),
            ("KREPLAY_SOFTHSA_FAULTS", "copy:2"),
        ] {
            assert_refused_at_start(args, &[setting], setting.0);
        }
    }
}

#[test]
fn a_tool_library_that_cannot_be_used_is_an_error_for_every_command_that_hosts_tools() {
    // Each of these runs a tool of its own, and a KREPLAY_TOOL_LIBRARIES tool beside it: one
    // that does not load must end the command with an error, not leave it to run without the
    // tool and exit 0.
    let missing = "/nonexistent/kreplay-tool-that-is-not-there.so";
    for args in COMMANDS.iter().filter(|args| args[0] != "bench") {
        let output = kreplay(args, &[("KREPLAY_TOOL_LIBRARIES", missing)]);
        let stdout = String::from_utf8_lossy(&output.stdout);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(
            output.status.code(),
            Some(1),
            "{args:?}: {stdout}\n{stderr}"
        );
        assert!(
            stderr.contains(missing),
            "{args:?} names the tool: {stderr}"
        );
        assert!(
            !stdout.contains("PASSED")
                && !stdout.contains("µs")
                && !stdout.contains("pass counter"),
            "{args:?}: nothing measured or reported as passing: {stdout}"
        );
    }
}

#[test]
fn a_pass_count_above_the_cap_on_passes_is_an_error_for_every_command_before_it_runs() {
    // Every dispatch would be declined (invalid_pass_count) and run once: the demo failed with
    // a list of 60 problems, the profile with every dispatch INCOMPLETE and bench-dispatch
    // with a child's warnings, each after running everything.
    let cap = [("KREPLAY_MAX_PASSES", "2")];
    assert_refused_at_start(
        &["demo", "--elements", "1k", "--passes", "4"],
        &cap,
        "KREPLAY_MAX_PASSES=2",
    );
    assert_refused_at_start(
        &[
            "profile",
            "--pmc",
            "SQ_WAVES",
            "--pmc",
            "SQ_WORK_ITEMS",
            "--pmc",
            "TCC_ATOMIC",
            "--",
            "saxpy",
        ],
        &cap,
        "KREPLAY_MAX_PASSES=2",
    );
    assert_refused_at_start(
        &[
            "bench-dispatch",
            "--dispatches",
            "10",
            "--allocations",
            "1",
            "--passes",
            "4",
        ],
        &cap,
        "KREPLAY_MAX_PASSES=2",
    );
    // The hand-off's replays of 10 passes need a cap of 10, whatever --passes says.
    assert_refused_at_start(
        &[
            "bench-dispatch",
            "--dispatches",
            "10",
            "--allocations",
            "1",
            "--passes",
            "2",
        ],
        &[("KREPLAY_MAX_PASSES", "8")],
        "KREPLAY_MAX_PASSES=8",
    );
}

#[test]
fn a_pass_count_within_the_cap_on_passes_runs() {
    let cap = [("KREPLAY_MAX_PASSES", "2")];
    let output = kreplay(&["demo", "--elements", "1k", "--passes", "2"], &cap);
    assert_eq!(
        output.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    // Application replay runs the workload once per group: no pass count to cap.
    let output = kreplay(
        &[
            "profile",
            "--pmc",
            "SQ_WAVES",
            "--pmc",
            "SQ_WORK_ITEMS",
            "--pmc",
            "TCC_ATOMIC",
            "--replay-mode",
            "application",
            "--",
            "saxpy",
        ],
        &cap,
    );
    assert_eq!(
        output.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
}
