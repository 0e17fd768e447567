//! End-to-end tests of the `kreplay` binary: each test runs the built executable.

mod support;

use std::path::PathBuf;
use std::process::Output;

/// Runs `kreplay args...` with no `KREPLAY_*` settings inherited from the environment.
fn kreplay(args: &[&str]) -> Output {
    support::kreplay_with(args, &[])
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// A fresh path in the test scratch directory.
fn scratch(name: &str) -> PathBuf {
    let path = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("kreplay-cli-{}-{name}", std::process::id()));
    let _ = std::fs::remove_file(&path);
    path
}

#[test]
fn demo_with_default_options_passes_verification_and_exits_0() {
    let output = kreplay(&["demo"]);
    let text = stdout(&output);
    assert_eq!(output.status.code(), Some(0), "{text}\n{}", stderr(&output));
    assert!(
        text.contains("verification: PASS — results equal an unprofiled run (4 buffers,"),
        "{text}"
    );
    assert!(
        text.contains("module variables 12 region(s), 48 B; adopted 0 region(s)"),
        "the module counter is in every snapshot: {text}"
    );
    assert!(
        text.contains("12 replayed, 12 as planned; 48 kernel runs"),
        "{text}"
    );
    assert!(
        text.contains("every pass reached exactly its own context"),
        "{text}"
    );
    // One table row per dispatch, each seen by c0, c1, c2, c3 on passes 0..3.
    let rows = text.lines().filter(|l| l.contains("c0|c1|c2|c3")).count();
    assert_eq!(rows, 12, "{text}");
}

#[test]
fn demo_without_restore_shows_the_wrong_answer_and_exits_1() {
    let output = kreplay(&["demo", "--no-restore", "--elements", "16k"]);
    let text = stdout(&output);
    assert_eq!(output.status.code(), Some(1), "{text}\n{}", stderr(&output));
    assert!(text.contains("verification: FAIL — buffer "), "{text}");
    assert!(text.contains("(profiled) != "), "{text}");
    assert!(
        text.contains("Restoring the snapshot before every pass is what prevents this"),
        "{text}"
    );
    assert!(!text.contains("verification: PASS"), "{text}");
}

#[test]
fn demo_with_one_pass_replays_nothing_and_still_passes() {
    let output = kreplay(&["demo", "--passes", "1", "--elements", "4096"]);
    let text = stdout(&output);
    assert_eq!(output.status.code(), Some(0), "{text}\n{}", stderr(&output));
    assert!(
        text.contains("0 replayed, 12 as planned; 12 kernel runs"),
        "{text}"
    );
    assert!(text.contains("verification: PASS"), "{text}");
    assert!(text.contains("no dispatch was replayed"), "{text}");
}

#[test]
fn demo_csv_and_json_carry_the_replay_pass_of_every_pass_record() {
    let csv_path = scratch("passes.csv");
    let json_path = scratch("passes.json");
    let output = kreplay(&[
        "demo",
        "--passes",
        "3",
        "--elements",
        "8192",
        "--csv",
        csv_path.to_str().unwrap(),
        "--json",
        json_path.to_str().unwrap(),
    ]);
    assert_eq!(
        output.status.code(),
        Some(0),
        "{}\n{}",
        stdout(&output),
        stderr(&output)
    );

    let csv = std::fs::read_to_string(&csv_path).expect("the CSV file was written");
    let mut lines = csv.lines();
    let header: Vec<&str> = lines.next().unwrap().split(',').collect();
    let column = |name: &str| {
        header
            .iter()
            .position(|h| *h == name)
            .unwrap_or_else(|| panic!("no {name} column in {header:?}"))
    };
    let (pass, contexts, dispatch) = (
        column("replay_pass"),
        column("contexts"),
        column("dispatch_id"),
    );
    let rows: Vec<Vec<&str>> = lines.map(|l| l.split(',').collect()).collect();
    assert_eq!(rows.len(), 12 * 3, "{csv}");
    for (i, row) in rows.iter().enumerate() {
        let expected = (i % 3).to_string();
        assert_eq!(row[pass], expected, "row {i}: {row:?}");
        // The tool masks every context but pass i's own: context i alone saw pass i.
        assert_eq!(row[contexts], expected, "row {i}: {row:?}");
        assert_eq!(
            row[dispatch],
            rows[i - i % 3][dispatch],
            "passes share a dispatch id"
        );
    }

    // Every snapshot holds the demo's three buffers as agent memory and the code object's
    // writable `remixes` counter (4 bytes) as a module variable; its read-only constant is not.
    let (agent, module_regions, module_bytes) = (
        column("snapshot_agent_regions"),
        column("snapshot_module_variable_regions"),
        column("snapshot_module_variable_bytes"),
    );
    for row in &rows {
        assert_eq!(
            (row[agent], row[module_regions], row[module_bytes]),
            ("3", "1", "4"),
            "{row:?}"
        );
    }

    let json = std::fs::read_to_string(&json_path).expect("the JSON file was written");
    let document: serde_json::Value = serde_json::from_str(&json).expect("the JSON parses");
    let dispatches = document["dispatches"].as_array().expect("a dispatch list");
    assert_eq!(dispatches.len(), 12, "{json}");
    for dispatch in dispatches {
        let passes = dispatch["passes"].as_array().expect("a pass list");
        let numbers: Vec<u64> = passes
            .iter()
            .map(|p| p["replay_pass"].as_u64().expect("a pass number"))
            .collect();
        assert_eq!(numbers, [0, 1, 2], "{dispatch}");
        assert_eq!(
            dispatch["snapshot_sources"]["module_variables"],
            serde_json::json!({"regions": 1, "bytes": 4}),
            "{dispatch}"
        );
    }
    assert_eq!(document["verification"]["pass"], true, "{json}");
    let _ = std::fs::remove_file(csv_path);
    let _ = std::fs::remove_file(json_path);
}

#[test]
fn bad_arguments_are_explained_and_exit_2() {
    for (args, needle) in [
        (
            vec!["demo", "--passes", "0"],
            "invalid value '0' for '--passes <N>': must be at least 1",
        ),
        (
            vec!["demo", "--passes", "lots"],
            "invalid value 'lots' for '--passes <N>'",
        ),
        (
            vec!["demo", "--elements"],
            "a value is required for '--elements <N>'",
        ),
        (
            vec!["demo", "--csv", "--no-restore"],
            "a value is required for '--csv <PATH>'",
        ),
        (
            vec!["demo", "--passes", "--elements", "1k"],
            "a value is required for '--passes <N>'",
        ),
        (
            vec!["demo", "--frobnicate"],
            "unexpected argument '--frobnicate'",
        ),
        (
            vec!["demo", "--no-restore", "--no-restore"],
            "cannot be used multiple times",
        ),
        (vec!["bench-all"], "unrecognized subcommand 'bench-all'"),
        (vec![], "no command given"),
    ] {
        let output = kreplay(&args);
        let error = stderr(&output);
        assert_eq!(output.status.code(), Some(2), "{args:?}: {error}");
        assert!(error.starts_with("kreplay: error: "), "{args:?}: {error}");
        assert!(error.contains(needle), "{args:?}: {error}");
        assert!(
            error.contains("--help"),
            "{args:?} should point at the help: {error}"
        );
        assert!(output.stdout.is_empty(), "{args:?} printed to stdout");
    }
}

#[test]
fn bench_prints_the_matrix_with_ceilings_and_targets_and_writes_csv_and_svg() {
    // The file tier's rows spill 4 MiB footprints to the system temporary directory.
    if !support::spill_room(&std::env::temp_dir(), 16 << 20) {
        return;
    }
    let csv_path = scratch("matrix.csv");
    let svg_path = scratch("restore.svg");
    let started = std::time::Instant::now();
    let output = kreplay(&[
        "bench",
        "--footprints",
        "4M",
        "--dirty",
        "0,1",
        "--repeats",
        "1",
        "--passes",
        "none",
        "--csv",
        csv_path.to_str().unwrap(),
        "--svg",
        svg_path.to_str().unwrap(),
    ]);
    let text = stdout(&output);
    assert_eq!(output.status.code(), Some(0), "{text}\n{}", stderr(&output));
    assert!(started.elapsed() < std::time::Duration::from_secs(60));

    let header = text
        .lines()
        .find(|l| l.starts_with("footprint  "))
        .unwrap_or_else(|| panic!("no table header: {text}"));
    for column in ["time", "GB/s", "ceiling", "ceiling GB/s", "ratio"] {
        assert!(header.contains(column), "{column} missing: {header}");
    }
    // Ceilings first, then 3 tiers x 4 strategies (full, hash, writeset, tracked) x
    // (2 snapshots + 2 restores) + 3 detect rows.
    let rows: Vec<&str> = text.lines().filter(|l| l.starts_with("4MiB")).collect();
    assert_eq!(rows.len(), 2 + 3 * 4 * 4 + 3, "{text}");
    assert!(
        rows.iter()
            .any(|r| r.contains(" detect ") && r.contains("read_ceiling"))
    );
    assert!(
        rows.iter()
            .filter(|r| r.contains(" restore "))
            .all(|r| r.contains("copy_ceiling")),
        "{text}"
    );
    assert!(
        text.contains("targets (judged from this run's rows):"),
        "{text}"
    );
    assert!(
        text.contains("write-set (learned or tracked) restore at 1% dirty <= 1/10 of full restore")
    );
    assert!(text.contains(" met, "), "{text}");
    // The scope case: the agent scope snapshots the whole footprint, the referenced scope the
    // 1% the kernel's argument points at.
    assert!(
        text.contains("snapshot scope: a kernel whose argument points at 1 of 100"),
        "{text}"
    );
    let scope_line = |name: &str| {
        text.lines()
            .find(|l| l.trim_start().starts_with(name) && l.contains("MiB"))
            .unwrap_or_else(|| panic!("no {name} scope line: {text}"))
            .split_whitespace()
            .map(str::to_string)
            .collect::<Vec<_>>()
    };
    let (agent, referenced) = (scope_line("agent "), scope_line("referenced "));
    assert_eq!(
        agent[1], agent[2],
        "agent scope: snapshot = footprint: {agent:?}"
    );
    assert_ne!(
        referenced[1], referenced[2],
        "referenced scope: 1%: {referenced:?}"
    );

    let csv = std::fs::read_to_string(&csv_path).expect("the CSV file was written");
    let mut lines = csv.lines();
    assert_eq!(lines.next(), Some(kreplay_benches::CSV_HEADER));
    assert_eq!(lines.count(), rows.len());
    let svg = std::fs::read_to_string(&svg_path).expect("the SVG file was written");
    assert!(svg.starts_with("<svg"), "{svg}");
    assert!(svg.contains("copy ceiling"));
    let _ = std::fs::remove_file(csv_path);
    let _ = std::fs::remove_file(svg_path);
}

#[test]
fn bench_dispatch_measures_every_path_and_writes_its_figures() {
    let csv_path = scratch("dispatch.csv");
    let output = kreplay(&[
        "bench-dispatch",
        "--dispatches",
        "40",
        "--allocations",
        "30",
        "--inventory",
        "20,50",
        "--csv",
        csv_path.to_str().unwrap(),
    ]);
    let text = stdout(&output);
    assert_eq!(output.status.code(), Some(0), "{text}\n{}", stderr(&output));
    for needle in [
        "softhsa queue (baseline)",
        "kreplay queue, replayed (2 passes)",
        "kreplay queue, tool opts out",
        "kreplay queue, no service",
        "child, no replay service",
        "30 others (10 fine-grained on its agent, 10 kernarg, 10 on another agent)",
        "(a) replayed, 2 passes",
        "(b) opted out",
        "(c) no replay service",
        "own work, opt-out - pass-through, paired per round",
        "own work, no-service - pass-through, paired per round",
        "for comparison, not judged",
        "judged by the median of paired differences",
        "target < 100.00 µs",
        "target < 1.00 µs",
        "two 20 ms kernels written to one queue (no barrier bit) in a child process",
        "kreplay queue, replay service configured, tool opts out: one alone",
        "per-pass hand-off: replays of 10 passes alternating with replays of 2",
        ", not pinned:",
        "child process pinned to one CPU (sched_setaffinity):",
        "overhead per pass beyond the kernel:",
        "target <= 20.00 µs",
        "snapshot and restore of a real inventory",
    ] {
        assert!(text.contains(needle), "{needle} missing: {text}");
    }
    // Each inventory is a row whose region count every SNAPSHOT EXIT record confirmed: the
    // added allocations plus the dispatch's own buffer.
    for regions in ["21", "51"] {
        assert!(
            text.lines()
                .any(|l| l.trim_start().starts_with(&format!("{regions} ")) && l.contains("KiB")),
            "no inventory row of {regions} regions: {text}"
        );
    }
    let csv = std::fs::read_to_string(&csv_path).expect("the CSV file was written");
    assert!(csv.starts_with("measurement,median_ns,p10_ns,p90_ns,samples\n"));
    for name in [
        "softhsa.round_trip,",
        "replayed.round_trip,",
        "opted_out.submit,",
        "none.no_service.submit,",
        "replay_loop.snapshot,",
        "derived.a_replay_fixed_cost_vs_runs,",
        "derived.b_opt_out_handler,",
        "derived.c_no_service_handler,",
        "own.opted_out_minus_intercept,",
        "own.intercept,",
        "none.own.no_service_minus_intercept,",
        "none.own.no_service,",
        "overlap.softhsa.pair,",
        "overlap.opted_out.pair,",
        "handoff.pass_later,",
        "handoff.kernel,",
        "handoff.overhead,",
        "handoff.slope,",
        "pinned.handoff.pass_later,",
        "pinned.handoff.overhead,",
        "inventory.20.snapshot_per_region,",
        "inventory.50.restore_per_region,",
        "inventory.50.regions,51.0,",
    ] {
        assert!(csv.contains(name), "{name} missing: {csv}");
    }
    // 40 timed dispatches per lane (plus as many path checks for the kreplay lanes).
    assert!(csv.contains("softhsa.submit,"), "{csv}");
    assert!(
        csv.lines()
            .any(|l| l.starts_with("softhsa.submit,") && l.ends_with(",40")),
        "{csv}"
    );
    let _ = std::fs::remove_file(csv_path);
}

#[test]
fn bad_bench_arguments_are_explained_and_exit_2() {
    for (args, needle) in [
        (
            vec!["bench", "--footprints", "4X"],
            "invalid value '4X' for '--footprints <LIST>'",
        ),
        (
            vec!["bench", "--dirty", "150"],
            "invalid value '150' for '--dirty <LIST>'",
        ),
        (
            vec!["bench", "--strategies", "full,best"],
            "'best': expected full, hash, writeset, writeset-unverified, tracked or auto",
        ),
        (
            vec!["bench", "--tiers", "ram"],
            "'ram': expected host, file",
        ),
        (
            vec!["bench", "--repeats"],
            "a value is required for '--repeats <N>'",
        ),
        (vec!["bench", "--quick"], "unexpected argument '--quick'"),
        (
            vec!["bench-dispatch", "--passes", "1"],
            "invalid value '1' for '--passes <N>'",
        ),
        (
            vec!["bench-dispatch", "--service", "maybe"],
            "possible values: replay, none, overlap",
        ),
    ] {
        let output = kreplay(&args);
        let error = stderr(&output);
        assert_eq!(output.status.code(), Some(2), "{args:?}: {error}");
        assert!(error.starts_with("kreplay: error: "), "{args:?}: {error}");
        assert!(error.contains(needle), "{args:?}: {error}");
        assert!(
            error.contains(&format!("'kreplay {} --help'", args[0])),
            "{error}"
        );
        assert!(output.stdout.is_empty(), "{args:?} printed to stdout");
    }
}

#[test]
fn bench_with_an_unwritable_output_file_fails_before_measuring() {
    let output = kreplay(&[
        "bench",
        "--footprints",
        "4M",
        "--svg",
        "/nonexistent-kreplay-dir/plot.svg",
    ]);
    assert_eq!(output.status.code(), Some(1), "{}", stderr(&output));
    assert!(stderr(&output).contains("cannot write /nonexistent-kreplay-dir/plot.svg"));
    assert!(
        !stdout(&output).contains("footprint "),
        "{}",
        stdout(&output)
    );
}

#[test]
fn help_lists_the_commands_and_each_command_has_its_own_help() {
    let output = kreplay(&["--help"]);
    assert_eq!(output.status.code(), Some(0));
    let text = stdout(&output);
    assert!(text.contains("Commands:"), "{text}");
    assert!(text.contains("  demo "), "{text}");
    assert!(text.contains("  bench "), "{text}");
    assert!(text.contains("  bench-dispatch "), "{text}");
    assert!(text.contains("  help "), "{text}");

    let output = kreplay(&["demo", "--help"]);
    assert_eq!(output.status.code(), Some(0));
    let text = stdout(&output);
    for option in ["--passes", "--no-restore", "--elements", "--json", "--csv"] {
        assert!(text.contains(option), "{option} missing: {text}");
    }
    assert_eq!(stdout(&kreplay(&["help", "demo"])), text);

    for command in ["bench", "bench-dispatch"] {
        let output = kreplay(&[command, "--help"]);
        assert_eq!(output.status.code(), Some(0));
        let text = stdout(&output);
        assert!(text.starts_with(&format!("kreplay {command} — ")), "{text}");
        assert_eq!(stdout(&kreplay(&["help", command])), text);
    }
}

#[test]
fn an_unwritable_output_file_is_an_error_exit_1() {
    let output = kreplay(&[
        "demo",
        "--elements",
        "1024",
        "--csv",
        "/nonexistent-kreplay-dir/out.csv",
    ]);
    assert_eq!(output.status.code(), Some(1), "{}", stderr(&output));
    assert!(stderr(&output).contains("cannot write /nonexistent-kreplay-dir/out.csv"));
}

#[test]
fn help_of_help_works_and_every_help_is_the_same_through_help() {
    let output = kreplay(&["help", "--help"]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert!(
        stdout(&output).starts_with("kreplay help — "),
        "{}",
        stdout(&output)
    );
    assert_eq!(stdout(&kreplay(&["help"])), stdout(&kreplay(&["--help"])));
}

#[test]
fn demo_checks_its_output_paths_before_running() {
    let dir = scratch("unwritable-before");
    std::fs::create_dir_all(&dir).expect("a folder where a file is expected");
    for path in [
        dir.clone(),
        PathBuf::from("/nonexistent-kreplay-dir/out.json"),
    ] {
        let output = kreplay(&["demo", "--elements", "1k", "--json", path.to_str().unwrap()]);
        assert_eq!(output.status.code(), Some(1), "{}", stderr(&output));
        assert!(
            stderr(&output).contains(&format!("cannot write {}", path.display())),
            "{}",
            stderr(&output)
        );
        assert!(
            stdout(&output).is_empty(),
            "nothing runs when an output cannot be written: {}",
            stdout(&output)
        );
    }
}

/// Runs `kreplay args...` with exactly the `KREPLAY_*` settings given.
fn kreplay_with(args: &[&str], settings: &[(&str, &str)]) -> Output {
    support::kreplay_with(args, settings)
}

#[test]
fn info_logging_says_where_each_snapshot_came_from_under_both_scopes() {
    // 256 elements: x, y and the 256 histogram bins are 1 KiB each. Under `referenced` each
    // kernel's snapshot holds only what its arguments point at: scale_add x; axpy y, x;
    // histogram y, bins; remix y, bins, x.
    let referenced_per_kernel = ["1 (1024 B)", "2 (2048 B)", "2 (2048 B)", "3 (3072 B)"];
    for scope in ["agent", "referenced"] {
        let output = kreplay_with(
            &["demo", "--elements", "256", "--passes", "2"],
            &[("KREPLAY_LOG", "info"), ("KREPLAY_SNAPSHOT_SCOPE", scope)],
        );
        let (text, log) = (stdout(&output), stderr(&output));
        assert_eq!(output.status.code(), Some(0), "{text}\n{log}");
        assert!(text.contains("verification: PASS"), "{text}");
        let lines: Vec<&str> = log.lines().filter(|l| l.contains(" snapshot: ")).collect();
        assert_eq!(
            lines.len(),
            12,
            "one info line per snapshot under {scope}: {log}"
        );
        for (i, line) in lines.iter().enumerate() {
            let (agent, referenced) = match scope {
                "agent" => ("3 (3072 B)", "0 (0 B)"),
                _ => ("0 (0 B)", referenced_per_kernel[i % 4]),
            };
            let expected = format!(
                "agent memory {agent}, referenced {referenced}, module variables 1 (4 B), \
                 adopted 0 (0 B)"
            );
            assert!(
                line.contains(&expected),
                "{scope}, dispatch {}: {line}",
                i + 1
            );
        }
    }
    let output = kreplay_with(
        &["demo", "--elements", "256"],
        &[("KREPLAY_SNAPSHOT_SCOPE", "everything")],
    );
    assert_ne!(output.status.code(), Some(0));
    assert!(
        stderr(&output)
            .contains("KREPLAY_SNAPSHOT_SCOPE=\"everything\": expected one of agent, referenced"),
        "{}",
        stderr(&output)
    );
}

#[test]
fn demo_table_ends_with_a_total_row_and_points_to_its_legend() {
    let output = kreplay(&["demo", "--passes", "3", "--elements", "4k"]);
    let text = stdout(&output);
    assert_eq!(output.status.code(), Some(0), "{text}\n{}", stderr(&output));
    let header = text
        .lines()
        .find(|l| l.trim_start().starts_with("id "))
        .unwrap_or_else(|| panic!("no table header: {text}"));
    assert!(header.contains("passes total"), "{header}");
    assert!(header.contains("restores total"), "{header}");
    let total = text
        .lines()
        .find(|l| l.trim_start().starts_with("total"))
        .unwrap_or_else(|| panic!("no total row: {text}"));
    let cells: Vec<&str> = total.split_whitespace().collect();
    // 12 dispatches of 3 passes each.
    assert_eq!(&cells[..4], ["total", "12", "dispatches", "36"], "{total}");
    assert!(
        text.contains("'total' adds up every dispatch")
            && text.contains("'kreplay demo --help' explains every column"),
        "{text}"
    );
    assert!(text.contains("memory (total, all dispatches): "), "{text}");

    let help = kreplay(&["demo", "--help"]);
    let help = stdout(&help);
    for column in [
        "contexts per pass",
        "snapshot ",
        "restored ",
        "lock wait",
        "drain ",
        "snap time",
        "passes total",
        "restores total",
    ] {
        assert!(help.contains(&format!("  {column}")), "{column}: {help}");
    }
    assert!(
        help.contains("The last row, 'total', adds up every dispatch"),
        "{help}"
    );
}

#[test]
fn demo_claims_per_pass_masking_only_when_passes_ran() {
    // A 1000-byte snapshot budget declines every replay: four passes were asked, none ran.
    let output = kreplay_with(
        &["demo", "--passes", "4", "--elements", "1k"],
        &[("KREPLAY_MAX_SNAPSHOT_BYTES", "1000")],
    );
    let text = stdout(&output);
    assert!(
        text.contains("dispatches: 12, 0 replayed"),
        "{text}\n{}",
        stderr(&output)
    );
    assert!(!text.contains("per-pass masking"), "{text}");
    assert!(!text.contains("every pass reached"), "{text}");
}

#[test]
fn demo_warnings_name_kernels_and_agents() {
    // Every replay is declined by a 1000-byte snapshot budget, and kreplay warns for each.
    let output = kreplay_with(
        &["demo", "--passes", "2", "--elements", "1k"],
        &[("KREPLAY_MAX_SNAPSHOT_BYTES", "1000")],
    );
    let warnings = stderr(&output);
    let declines: Vec<&str> = warnings
        .lines()
        .filter(|l| l.contains("declined (footprint_budget"))
        .collect();
    assert_eq!(declines.len(), 12, "{warnings}");
    for (line, kernel) in declines
        .iter()
        .zip(["scale_add", "axpy", "histogram", "remix"].iter().cycle())
    {
        assert!(
            line.contains(&format!("(kernel {kernel}, agent 'softgpu', queue ")),
            "{line}"
        );
    }
}

/// `bench --strategies` measures writeset-unverified on softhsa too (the opt-in shortcut beside
/// the verified write set): its help and its error for an unknown name list it with the others
/// (both left it out, so a user could not know it was there).
#[test]
fn bench_help_and_errors_list_every_strategy_bench_measures() {
    let help = stdout(&kreplay(&["bench", "--help"]));
    let line = help
        .lines()
        .skip_while(|l| !l.contains("--strategies"))
        .nth(1)
        .unwrap_or_default();
    assert!(line.contains("writeset-unverified"), "{line}");
    let bad = kreplay(&["bench", "--strategies", "fast"]);
    assert_eq!(bad.status.code(), Some(2));
    assert!(
        stderr(&bad).contains("writeset-unverified"),
        "{}",
        stderr(&bad)
    );
    let out = kreplay(&[
        "bench",
        "--strategies",
        "writeset-unverified",
        "--footprints",
        "64K",
        "--dirty",
        "10",
        "--tiers",
        "host",
        "--repeats",
        "1",
        "--passes",
        "none",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(
        stdout(&out).contains("writeset-unverified  host    restore"),
        "{}",
        stdout(&out)
    );
}

/// `run --help` and `profile --help` give their usage once (each printed a usage line of its own
/// and then clap's, two different `Usage:` lines one after the other).
#[test]
fn run_and_profile_help_give_one_usage_line() {
    for command in ["run", "profile"] {
        let help = stdout(&kreplay(&[command, "--help"]));
        assert_eq!(help.matches("Usage:").count(), 1, "{command}:\n{help}");
    }
    let help = stdout(&kreplay(&["run", "--help"]));
    assert!(
        help.contains("Usage: kreplay run [--passes N] [--tool PATH]"),
        "{help}"
    );
}
