//! `kreplay profile` from the outside: the binary, its report and its files.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::process::{Command, Output};

fn kreplay(args: &[&str]) -> Output {
    kreplay_with(args, &[])
}

fn kreplay_with(args: &[&str], env: &[(&str, &str)]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kreplay"))
        .args(args)
        .env_remove("KREPLAY_TOOL_LIBRARIES")
        .env_remove("KREPLAY_SOFTHSA_FAULTS")
        .envs(env.iter().copied())
        .output()
        .expect("run kreplay")
}

fn scratch(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("profile-tests");
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

/// Three groups; SQ_WAVES is in the first and the third.
const GROUPS: [&str; 15] = [
    "profile",
    "--pmc",
    "SQ_WAVES",
    "SQ_WORKGROUPS",
    "TCP_READ_BYTES",
    "--pmc",
    "SQ_WORK_ITEMS",
    "SQ_INSTS_VMEM_RD",
    "TCC_ATOMIC",
    "GRBM_DURATION_NS",
    "--pmc",
    "SQ_INSTS_VMEM_WR",
    "TCP_WRITE_BYTES",
    "SQ_WAVES",
    "--elements",
];

fn groups_then(rest: &[&str]) -> Vec<String> {
    GROUPS
        .iter()
        .chain(["5000"].iter())
        .chain(rest)
        .map(|s| (*s).to_owned())
        .collect()
}

fn run_ok(args: &[String]) -> String {
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = kreplay(&args);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "kreplay {args:?} failed: {}\n{stdout}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// (dispatch_id, replay_pass, run, group, kernel, counter, value) of each CSV row.
type CsvRow = (u64, String, u64, u64, String, String, f64);

fn read_csv(path: &PathBuf) -> Vec<CsvRow> {
    let text = std::fs::read_to_string(path).unwrap();
    let mut lines = text.lines();
    assert_eq!(
        lines.next(),
        Some("dispatch_id,replay_pass,run,group,kernel,agent,counter,value")
    );
    lines
        .map(|line| {
            let f: Vec<&str> = line.split(',').collect();
            assert_eq!(f.len(), 8, "{line}");
            (
                f[0].parse().unwrap(),
                f[1].to_owned(),
                f[2].parse().unwrap(),
                f[3].parse().unwrap(),
                f[4].to_owned(),
                f[6].to_owned(),
                f[7].parse().unwrap(),
            )
        })
        .collect()
}

#[test]
fn three_groups_run_the_application_once_and_every_dispatch_gets_every_counter_once_per_pass() {
    let csv = scratch("three.csv");
    let report = run_ok(&groups_then(&["-o", csv.to_str().unwrap(), "--", "all"]));
    assert!(
        report.contains("3 counter group(s), kernel replay, 1 run(s)"),
        "{report}"
    );
    let rows = read_csv(&csv);
    assert!(rows.iter().all(|r| r.2 == 0), "one run of the application");
    let dispatches: BTreeSet<u64> = rows.iter().map(|r| r.0).collect();
    // saxpy, histogram, stencil, reduction, and the demo's four kernels: each dispatched once.
    assert_eq!(dispatches.len(), 8, "{dispatches:?}");
    let wanted: BTreeSet<(String, String)> = [
        ("0", "SQ_WAVES"),
        ("0", "SQ_WORKGROUPS"),
        ("0", "TCP_READ_BYTES"),
        ("1", "SQ_WORK_ITEMS"),
        ("1", "SQ_INSTS_VMEM_RD"),
        ("1", "TCC_ATOMIC"),
        ("1", "GRBM_DURATION_NS"),
        ("2", "SQ_INSTS_VMEM_WR"),
        ("2", "TCP_WRITE_BYTES"),
        ("2", "SQ_WAVES"),
    ]
    .iter()
    .map(|(p, c)| ((*p).to_owned(), (*c).to_owned()))
    .collect();
    for d in &dispatches {
        let got: Vec<(String, String)> = rows
            .iter()
            .filter(|r| r.0 == *d)
            .map(|r| (r.1.clone(), r.5.clone()))
            .collect();
        assert_eq!(got.len(), wanted.len(), "dispatch {d}: {got:?}");
        assert_eq!(
            got.into_iter().collect::<BTreeSet<_>>(),
            wanted,
            "dispatch {d}"
        );
    }
    // Values one run produces: saxpy over 5000 items loads 2 floats and stores 1 per item.
    let value = |kernel: &str, pass: &str, counter: &str| {
        rows.iter()
            .find(|r| r.4 == kernel && r.1 == pass && r.5 == counter)
            .map(|r| r.6)
    };
    assert_eq!(value("saxpy", "0", "TCP_READ_BYTES"), Some(40000.0));
    assert_eq!(value("saxpy", "2", "TCP_WRITE_BYTES"), Some(20000.0));
    assert_eq!(value("histogram_atomic", "1", "TCC_ATOMIC"), Some(5000.0));
    assert_eq!(
        value("reduction", "1", "TCC_ATOMIC"),
        Some(20.0),
        "one atomic per group"
    );
    assert!(report.contains("bytes_per_work_item = 12"), "{report}");
    assert!(report.contains("atomic_fraction = 0.5000"), "{report}");
}

#[test]
fn a_counter_in_two_groups_is_reported_once_per_pass_and_never_summed() {
    let json = scratch("twice.json");
    run_ok(&groups_then(&["-o", json.to_str().unwrap(), "--", "saxpy"]));
    let doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(doc["replay_mode"], "kernel");
    let rows = doc["rows"].as_array().unwrap();
    let waves: Vec<(u64, f64)> = rows
        .iter()
        .filter(|r| r["counter"] == "SQ_WAVES")
        .map(|r| {
            (
                r["replay_pass"].as_u64().unwrap(),
                r["value"].as_f64().unwrap(),
            )
        })
        .collect();
    // 5000 items in groups of 256: 19 groups of 4 wavefronts and one of 136 items (3).
    assert_eq!(
        waves,
        vec![(0, 79.0), (2, 79.0)],
        "one row per pass, each the true value"
    );
}

#[test]
fn csv_and_json_rows_parse_and_carry_the_pass_in_both_replay_modes() {
    for mode in ["kernel", "application"] {
        let csv = scratch(&format!("rows-{mode}.csv"));
        let json = scratch(&format!("rows-{mode}.json"));
        for out in [&csv, &json] {
            run_ok(&groups_then(&[
                "--replay-mode",
                mode,
                "-o",
                out.to_str().unwrap(),
                "--",
                "histogram",
            ]));
        }
        let csv_rows = read_csv(&csv);
        let doc: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
        let json_rows = doc["rows"].as_array().unwrap();
        assert_eq!(csv_rows.len(), 10, "{mode}");
        assert_eq!(json_rows.len(), 10, "{mode}");
        for r in json_rows {
            for key in [
                "dispatch_id",
                "replay_pass",
                "kernel",
                "agent",
                "counter",
                "value",
            ] {
                assert!(r.get(key).is_some(), "{mode}: {key} in {r}");
            }
            assert_eq!(r["kernel"], "histogram_atomic");
        }
        let runs: BTreeSet<u64> = csv_rows.iter().map(|r| r.2).collect();
        if mode == "kernel" {
            let passes: BTreeSet<&str> = csv_rows.iter().map(|r| r.1.as_str()).collect();
            assert_eq!(passes, BTreeSet::from(["0", "1", "2"]));
            assert!(json_rows.iter().all(|r| r["replay_pass"].is_u64()));
            assert_eq!(runs, BTreeSet::from([0]));
        } else {
            // Application replay: the dispatch is not replayed (no pass); one run per group.
            assert!(csv_rows.iter().all(|r| r.1.is_empty()));
            assert!(json_rows.iter().all(|r| r["replay_pass"].is_null()));
            assert_eq!(runs, BTreeSet::from([0, 1, 2]));
            let groups: BTreeMap<u64, u64> = csv_rows.iter().map(|r| (r.2, r.3)).collect();
            assert_eq!(groups, BTreeMap::from([(0, 0), (1, 1), (2, 2)]));
        }
    }
}

#[test]
fn kernel_replay_values_equal_application_replay_values_for_deterministic_kernels() {
    let report = run_ok(&groups_then(&["--check", "--", "all"]));
    assert!(
        report.contains("check: kernel replay values equal application replay values"),
        "{report}"
    );
}

#[test]
fn more_counters_than_one_pass_in_one_group_is_a_clear_error() {
    let out = kreplay(&[
        "profile",
        "--pmc",
        "SQ_WAVES",
        "SQ_WORKGROUPS",
        "SQ_WORK_ITEMS",
        "--",
        "saxpy",
    ]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr
            .contains("--pmc group 1 (SQ_WAVES SQ_WORKGROUPS SQ_WORK_ITEMS) does not fit one pass")
            && stderr.contains("block SQ can count at most 2 counters in one pass"),
        "{stderr}"
    );
    // The same counters as a flat list are planned into passes instead.
    let planned = run_ok(&[
        "profile".into(),
        "--counters".into(),
        "SQ_WAVES".into(),
        "SQ_WORKGROUPS".into(),
        "SQ_WORK_ITEMS".into(),
        "--".into(),
        "saxpy".into(),
    ]);
    assert!(planned.contains("2 counter group(s)"), "{planned}");
}

#[test]
fn bad_profile_command_lines_are_usage_errors() {
    for (args, says) in [
        (&["profile", "--", "saxpy"][..], "no counters given"),
        (&["profile", "--pmc", "SQ_WAVES"][..], "<WORKLOAD>"),
        (
            &["profile", "--pmc", "SQ_WAVES", "--", "nope"][..],
            "unknown workload 'nope'",
        ),
        (
            &[
                "profile",
                "--pmc",
                "SQ_WAVES",
                "--replay-mode",
                "both",
                "--",
                "saxpy",
            ][..],
            "--replay-mode",
        ),
        (
            &["profile", "--pmc", "--", "saxpy"][..],
            "a value is required for '--pmc",
        ),
    ] {
        let out = kreplay(args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(says), "{args:?}: {stderr}");
    }
    let out = kreplay(&["profile", "--pmc", "NOT_A_COUNTER", "--", "saxpy"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown counter 'NOT_A_COUNTER'"));
    let out = kreplay(&["profile", "--pmc", "SQ_WAVES", "-o", "x.txt", "--", "saxpy"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains(".csv or .json"));
}

/// Kernel replay that cannot give every pass (declined for the snapshot budget, or ended by the
/// time budget before the last group) makes the profile incomplete: it says which dispatches and
/// fails (it exited 0 with their values quietly missing). More groups than the cap on passes
/// allows is an error before the workload runs (settings.rs).
#[test]
fn a_kernel_replay_that_did_not_count_every_group_is_reported_incomplete_and_fails() {
    for (setting, value, elements, why) in [
        (
            "KREPLAY_MAX_SNAPSHOT_BYTES",
            "1",
            "1000",
            "replay declined: footprint_budget",
        ),
        ("KREPLAY_REPLAY_BUDGET_MS", "1", "300000", "budget"),
    ] {
        let csv = scratch(&format!("incomplete-{setting}.csv"));
        let out = kreplay_with(
            &[
                "profile",
                "--counters",
                "SQ_WAVES",
                "SQ_WORKGROUPS",
                "SQ_WORK_ITEMS",
                "TCC_ATOMIC",
                "--elements",
                elements,
                "-o",
                csv.to_str().unwrap(),
                "--",
                "histogram",
            ],
            &[(setting, value)],
        );
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert_eq!(out.status.code(), Some(1), "{setting}: {stdout}");
        assert!(
            stdout.contains("INCOMPLETE") && stdout.contains("counter group(s) counted"),
            "{setting}: {stdout}"
        );
        assert!(stdout.contains(why), "{setting}: {why}: {stdout}");
    }
}

/// A counter listed twice in one group is one counter of a set: one row per dispatch, pass and
/// counter (it was counted and reported twice).
#[test]
fn a_counter_listed_twice_in_a_group_is_counted_once() {
    let csv = scratch("twice.csv");
    let out = kreplay(&[
        "profile",
        "--pmc",
        "SQ_WAVES",
        "SQ_WAVES",
        "--pmc",
        "SQ_WORK_ITEMS",
        "--elements",
        "1000",
        "-o",
        csv.to_str().unwrap(),
        "--",
        "histogram",
    ]);
    assert!(out.status.success(), "{out:?}");
    let rows = read_csv(&csv);
    let mut seen = BTreeSet::new();
    for r in &rows {
        assert!(
            seen.insert((r.0, r.1.clone(), r.5.clone())),
            "counted twice: {r:?}"
        );
    }
}

/// `--check` with only the duration asked for has no value to compare, but kernel and
/// application replay still agree on which rows exist and on the workload's results: the check
/// passes and says the duration was not compared (it reported the two modes as differing).
#[test]
fn check_with_only_the_duration_compares_rows_and_results_and_passes() {
    let out = kreplay(&[
        "profile",
        "--pmc",
        "GRBM_DURATION_NS",
        "--pmc",
        "GRBM_DURATION_NS",
        "--elements",
        "1000",
        "--check",
        "--",
        "saxpy",
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    assert!(!stdout.contains("DIFFER"), "{stdout}");
    assert!(
        stdout.contains("check: kernel replay and application replay give the same rows"),
        "{stdout}"
    );
}

/// `--help` names every column `-o` writes (it left out `run` and `group`).
#[test]
fn help_names_every_column_of_the_output_file() {
    let out = kreplay(&["profile", "--help"]);
    let help = String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ");
    assert!(
        help.contains("(dispatch_id, replay_pass, run, group, kernel, agent, counter, value)"),
        "{help}"
    );
}

/// A dispatch whose counters could not be collected at all (here: kreplay could not create the
/// completion signal it counts on, and forwarded the dispatch uncounted) leaves the profile
/// incomplete in both replay modes: it exited 0 with that dispatch's rows quietly missing.
#[test]
fn a_dispatch_that_counted_nothing_makes_the_profile_incomplete_in_both_modes() {
    let mut hit = 0;
    for mode in ["application", "kernel"] {
        for seed in 1..=6 {
            let csv = scratch(&format!("uncounted-{mode}-{seed}.csv"));
            let _ = std::fs::remove_file(&csv);
            let faults = format!("signal_create:0.3,seed:{seed}");
            let out = kreplay_with(
                &[
                    "profile",
                    "--pmc",
                    "SQ_WAVES",
                    "--pmc",
                    "TCC_ATOMIC",
                    "--replay-mode",
                    mode,
                    "--elements",
                    "1000",
                    "-o",
                    csv.to_str().unwrap(),
                    "--",
                    "all",
                ],
                &[("KREPLAY_SOFTHSA_FAULTS", &faults)],
            );
            let stdout = String::from_utf8_lossy(&out.stdout);
            let stderr = String::from_utf8_lossy(&out.stderr);
            if !stderr.contains("forwarded without KERNEL_DISPATCH records or counters") {
                continue;
            }
            hit += 1;
            assert_eq!(
                out.status.code(),
                Some(1),
                "{mode}, seed {seed}: a dispatch counted nothing\n{stdout}\n{stderr}"
            );
            if csv.exists() {
                assert!(
                    stdout.contains("INCOMPLETE"),
                    "{mode}, seed {seed}: {stdout}"
                );
            }
        }
    }
    assert!(hit > 0, "no seed made kreplay forward a dispatch uncounted");
}

/// The report's group line lists a counter given twice in a group (in any case) once, as it is
/// counted (it listed it as often as it was given).
#[test]
fn a_group_line_lists_a_counter_given_twice_once() {
    let report = run_ok(&[
        "profile".into(),
        "--pmc".into(),
        "SQ_WAVES".into(),
        "sq_waves".into(),
        "--pmc".into(),
        "TCC_ATOMIC".into(),
        "--elements".into(),
        "300".into(),
        "--".into(),
        "saxpy".into(),
    ]);
    assert!(
        report
            .lines()
            .any(|l| l.trim_end() == "  group 1 (pass 0): SQ_WAVES"),
        "{report}"
    );
}

/// The INCOMPLETE list names each dispatch's kernel as the tables do, by its name, so a reader
/// can find it among them (it gave the kernel object's address, which appears nowhere else).
#[test]
fn an_incomplete_dispatch_is_listed_under_its_kernel_name() {
    let out = kreplay_with(
        &[
            "profile",
            "--pmc",
            "SQ_WAVES",
            "--pmc",
            "SQ_WORK_ITEMS",
            "--elements",
            "64",
            "--",
            "saxpy",
        ],
        &[("KREPLAY_MAX_SNAPSHOT_BYTES", "1")],
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    let line = stdout
        .lines()
        .find(|l| l.contains("counter group(s) counted"))
        .unwrap_or_else(|| panic!("no INCOMPLETE line: {stdout}"));
    assert!(
        line.contains("(kernel saxpy)") && !line.contains("0x"),
        "{line}"
    );
}

/// A workload named without the `--` before it is taken as one more counter of the group before
/// it; the error says so and how to write it (it said only that no workload was given, with the
/// workload right there on the command line).
#[test]
fn a_workload_given_without_the_separator_is_explained() {
    for args in [
        &["profile", "--pmc", "SQ_WAVES", "saxpy"][..],
        &["profile", "--counters", "SQ_WAVES", "TCC_ATOMIC", "all"][..],
    ] {
        let out = kreplay(args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        let workload = args.last().unwrap();
        assert!(
            stderr.contains(&format!(
                "'{workload}' was taken as a counter of {}",
                args[1]
            )) && stderr.contains(&format!("-- {workload}")),
            "{args:?}: {stderr}"
        );
    }
    // Without a workload anywhere, the error still names what is missing.
    let out = kreplay(&["profile", "--pmc", "SQ_WAVES"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("<WORKLOAD>"));
}

/// `--check` runs kernel replay whatever `--replay-mode` says: above the cap on passes, the
/// error's advice is to leave out `--check` (it advised `--replay-mode application`, which
/// changes nothing with `--check`).
#[test]
fn check_above_the_pass_cap_advises_what_helps() {
    let out = kreplay_with(
        &[
            "profile",
            "--pmc",
            "SQ_WAVES",
            "--pmc",
            "SQ_WORK_ITEMS",
            "--replay-mode",
            "application",
            "--check",
            "--",
            "saxpy",
        ],
        &[("KREPLAY_MAX_PASSES", "1")],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("KREPLAY_MAX_PASSES=1")
            && stderr.contains("without --check")
            && !stderr.contains("--replay-mode application"),
        "{stderr}"
    );
}
