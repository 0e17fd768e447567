//! `kreplay run` end to end, without a GPU: the "program" is a shell script that behaves as a
//! program with kreplay injected would (it writes the record the injected library writes at
//! exit into the record folder) and dumps the environment it was given, so the command's argument handling, the
//! environment it sets, the record it reads back, the table, the outputs and --check are
//! checked from the outside.

#[path = "../../ffi/tests/common/mod.rs"]
mod common;
mod support;

use std::path::{Path, PathBuf};
use std::process::Output;

/// A fresh folder for one test.
fn scratch(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("kreplay-run-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The record a CUDA run of two kernels leaves (as libkreplay writes it).
const RECORD: &str = r#"{
  "backend": "cuda",
  "tool": "built-in",
  "passes_requested": PASSES,
  "kernels": [
    {"kernel": "add_one", "launches": 5, "replayed": 5, "passes": 15, "snapshot_bytes": 4194304,
     "tier": "device", "strategy": "full", "restores": 10, "restore_ms": 1.5, "failed": 0,
     "declines": {}},
    {"kernel": "scale", "launches": 2, "replayed": 1, "passes": 4, "snapshot_bytes": 1024,
     "tier": "host", "strategy": "full", "restores": 2, "restore_ms": 0.25, "failed": 0,
     "declines": {"untracked_memory": 1}}
  ],
  "graph_launches": 3,
  "managed_allocations": 1,
  "tool_work": 3,
  "tool_work_kept_bytes": 4096,
  "tool_work_lost": 1
}"#;

/// Writes the fake program into `dir`: it dumps its kreplay-related environment to
/// `dir/env.txt`, writes `records` records as that many processes would (one file each; none:
/// kreplay never loaded), prints `checksum 42` (or, when `differ_under_kreplay`, another
/// checksum while injected) and exits with `exit`.
fn fake_program_of(dir: &Path, records: u32, differ_under_kreplay: bool, exit: i32) -> PathBuf {
    let script = dir.join("app.sh");
    let record: String = (0..records)
        .map(|p| {
            format!(
                "if [ -n \"$KREPLAY_RECORD_DIR\" ]; then cat > \"$KREPLAY_RECORD_DIR/kreplay-record-$$-{p}.json\" <<'EOF'\n{}\nEOF\nfi\n",
                RECORD.replace("PASSES", "3")
            )
        })
        .collect();
    let checksum = if differ_under_kreplay {
        "if [ -n \"$CUDA_INJECTION64_PATH$HSA_TOOLS_LIB\" ]; then echo \"checksum 43\"; else echo \"checksum 42\"; fi\n"
    } else {
        "echo \"checksum 42\"\n"
    };
    let text = format!(
        "#!/bin/sh\n\
         env | grep -E '^(CUDA_INJECTION64_PATH|HSA_TOOLS_LIB|KREPLAY_)' | sort > \"{env}\"\n\
         echo \"args: $*\" >> \"{env}\"\n\
         {record}{checksum}exit {exit}\n",
        env = dir.join("env.txt").display()
    );
    support::write_executable(&script, &text);
    script
}

/// [`fake_program_of`] with one process's record or none.
fn fake_program(dir: &Path, write_record: bool, differ_under_kreplay: bool, exit: i32) -> PathBuf {
    fake_program_of(dir, u32::from(write_record), differ_under_kreplay, exit)
}

/// A file standing in for libkreplay.so (the fake program never loads it).
fn fake_library(dir: &Path) -> PathBuf {
    let lib = dir.join("libkreplay.so");
    std::fs::write(&lib, b"not loaded by the fake program").unwrap();
    lib
}

fn kreplay(args: &[&str]) -> Output {
    support::kreplay_with(args, &[])
}

/// `kreplay run OPTIONS --library LIB -- PROGRAM...` with `env` set.
fn run_with(options: &[&str], lib: &Path, program: &[&str], env: &[(&str, &str)]) -> Output {
    let mut args = vec!["run"];
    args.extend_from_slice(options);
    args.extend(["--library", lib.to_str().unwrap(), "--"]);
    args.extend_from_slice(program);
    support::kreplay_with(&args, env)
}

/// `kreplay run OPTIONS --library LIB -- PROGRAM...`.
fn run(options: &[&str], lib: &Path, program: &[&str]) -> Output {
    run_with(options, lib, program, &[])
}

/// The standard output of a command that must have exited 0 (both outputs shown if not).
#[track_caller]
fn succeeded(out: &Output) -> String {
    let stdout = text(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{stdout}\n{}",
        text(&out.stderr)
    );
    stdout
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn env_seen(dir: &Path) -> String {
    std::fs::read_to_string(dir.join("env.txt")).unwrap_or_default()
}

#[test]
fn run_on_cuda_injects_libkreplay_with_the_built_in_tool_and_prints_the_kernels() {
    let dir = scratch("cuda");
    let app = fake_program(&dir, true, false, 0);
    let lib = fake_library(&dir);
    let out = run(
        &["--backend", "cuda", "--passes", "3"],
        &lib,
        &[app.to_str().unwrap(), "--size", "-n 4"],
    );
    let stdout = succeeded(&out);
    let env = env_seen(&dir);
    let lib = lib.canonicalize().unwrap();
    assert!(
        env.contains(&format!("CUDA_INJECTION64_PATH={}", lib.display())),
        "{env}"
    );
    assert!(env.contains("KREPLAY_PASSES=3"), "{env}");
    assert!(env.contains("KREPLAY_RECORD_DIR="), "{env}");
    assert!(!env.contains("HSA_TOOLS_LIB"), "{env}");
    assert!(!env.contains("KREPLAY_TOOL_LIBRARIES"), "{env}");
    assert!(
        env.contains("args: --size -n 4"),
        "arguments passed as given: {env}"
    );
    // The table: one row per kernel, then the totals.
    let header = stdout
        .lines()
        .find(|l| l.starts_with("kernel"))
        .expect(&stdout);
    for column in [
        "launches", "passes", "snapshot", "tier", "strategy", "restore", "declines",
    ] {
        assert!(header.contains(column), "{header}");
    }
    let add_one = stdout
        .lines()
        .find(|l| l.starts_with("add_one"))
        .expect(&stdout);
    for cell in ["5", "15", "4.00 MiB", "device", "full", "1.500 ms"] {
        assert!(add_one.contains(cell), "{add_one}");
    }
    let scale = stdout
        .lines()
        .find(|l| l.starts_with("scale"))
        .expect(&stdout);
    assert!(scale.contains("untracked_memory:1"), "{scale}");
    assert!(
        stdout.contains("2 kernel(s), 7 launch(es) on cuda (built-in tool, 3 passes)"),
        "{stdout}"
    );
    assert!(stdout.contains("3 graph launch(es)"), "{stdout}");
    assert!(stdout.contains("1 managed allocation(s)"), "{stdout}");
    // Work a tool issued from its replay callbacks: what was kept, and, loudly, what may not be.
    assert!(
        stdout.contains("2 tool call(s) from replay callbacks kept (4096 bytes)"),
        "{stdout}"
    );
    assert!(
        stdout.contains("1 tool call(s) from replay callbacks may have been undone by a restore"),
        "{stdout}"
    );
    // The record folder is the command's own business: removed after reading.
    let record = env
        .lines()
        .find_map(|l| l.strip_prefix("KREPLAY_RECORD_DIR="))
        .unwrap();
    assert!(!Path::new(record).exists(), "{record} left behind");
}

#[test]
fn the_records_of_several_processes_are_added_up_per_kernel() {
    let dir = scratch("processes");
    let app = fake_program_of(&dir, 2, false, 0);
    let lib = fake_library(&dir);
    let json = dir.join("out.json");
    let out = run(
        &["--backend", "cuda", "-o", json.to_str().unwrap()],
        &lib,
        &[app.to_str().unwrap()],
    );
    let stdout = succeeded(&out);
    assert!(
        stdout.contains("2 kernel(s), 14 launch(es) on cuda in 2 processes"),
        "{stdout}"
    );
    let add_one = stdout.lines().find(|l| l.starts_with("add_one")).unwrap();
    assert!(
        add_one.contains("8.00 MiB") && add_one.contains("3.000 ms"),
        "{add_one}"
    );
    let record: kreplay::run_record::RunRecord =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(record.processes, 2);
    assert_eq!(record.kernels[1].declines.get("untracked_memory"), Some(&2));
    assert_eq!(
        (
            record.tool_work,
            record.tool_work_kept_bytes,
            record.tool_work_lost
        ),
        (6, 8192, 2),
        "added up over the processes"
    );
}

#[test]
fn run_on_rocm_sets_hsa_tools_lib_and_a_tool_replaces_the_built_in_one() {
    let dir = scratch("hsa-tool");
    let app = fake_program(&dir, true, false, 0);
    let lib = fake_library(&dir);
    let tool = dir.join("libmytool.so");
    std::fs::write(&tool, b"a tool").unwrap();
    let out = run(
        &["--backend=hsa", "--tool", tool.to_str().unwrap()],
        &lib,
        &[app.to_str().unwrap()],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let env = env_seen(&dir);
    assert!(env.contains("HSA_TOOLS_LIB="), "{env}");
    assert!(!env.contains("CUDA_INJECTION64_PATH"), "{env}");
    assert!(
        env.contains(&format!("KREPLAY_TOOL_LIBRARIES={}", tool.display())),
        "{env}"
    );
    assert!(!env.contains("KREPLAY_PASSES"), "the tool decides: {env}");
}

#[test]
fn check_passes_when_both_runs_print_the_same_and_writes_csv_and_json() {
    let dir = scratch("check-same");
    let app = fake_program(&dir, true, false, 0);
    let lib = fake_library(&dir);
    for ext in ["csv", "json"] {
        let output = dir.join(format!("kernels.{ext}"));
        let out = run(
            &[
                "--backend",
                "cuda",
                "--check",
                "-o",
                output.to_str().unwrap(),
            ],
            &lib,
            &[app.to_str().unwrap()],
        );
        let stdout = succeeded(&out);
        assert!(
            stdout.starts_with("checksum 42\n"),
            "the program's output first: {stdout}"
        );
        assert!(
            stdout.contains("check: the standard output is the same with and without kreplay"),
            "{stdout}"
        );
        assert!(
            stdout.contains(&format!("wrote {}", output.display())),
            "the command says what it wrote: {stdout}"
        );
        // The second run had no kreplay: its environment dump (the last run's) shows none.
        let env = env_seen(&dir);
        assert!(!env.contains("CUDA_INJECTION64_PATH"), "{env}");
        assert!(!env.contains("KREPLAY_"), "{env}");
        let written = std::fs::read_to_string(&output).unwrap();
        if ext == "json" {
            let v: serde_json::Value = serde_json::from_str(&written).unwrap();
            assert_eq!(v["kernels"][0]["kernel"], "add_one");
            assert_eq!(v["kernels"][1]["declines"]["untracked_memory"], 1);
        } else {
            let mut lines = written.lines();
            assert_eq!(
                lines.next().unwrap(),
                "kernel,launches,replayed,passes,snapshot_bytes,tier,strategy,restores,\
                 restore_ms,failed,declines"
            );
            assert_eq!(
                lines.next().unwrap(),
                "add_one,5,5,15,4194304,device,full,10,1.5,0,-"
            );
            assert_eq!(
                lines.next().unwrap(),
                "scale,2,1,4,1024,host,full,2,0.25,0,untracked_memory:1"
            );
        }
    }
}

#[test]
fn a_csv_of_a_program_that_launched_no_kernel_still_has_its_header() {
    // A program that loaded kreplay and launched nothing (a smoke test, a run on the wrong
    // device): the CSV must still be a CSV with its columns, which readers of it expect.
    let dir = scratch("csv-empty");
    let app = dir.join("app.sh");
    support::write_executable(
        &app,
        "#!/bin/sh\n\
         cat > \"$KREPLAY_RECORD_DIR/kreplay-record-$$.json\" <<'EOF'\n\
         {\"backend\": \"cuda\", \"tool\": \"built-in\", \"passes_requested\": 4, \"kernels\": [],\n\
          \"graph_launches\": 0, \"managed_allocations\": 0}\n\
         EOF\n",
    );
    let lib = fake_library(&dir);
    let csv = dir.join("kernels.csv");
    let out = run(
        &["--backend", "cuda", "-o", csv.to_str().unwrap()],
        &lib,
        &[app.to_str().unwrap()],
    );
    let stdout = succeeded(&out);
    assert!(stdout.contains("0 kernel(s), 0 launch(es)"), "{stdout}");
    assert_eq!(
        std::fs::read_to_string(&csv).unwrap(),
        "kernel,launches,replayed,passes,snapshot_bytes,tier,strategy,restores,restore_ms,\
         failed,declines\n"
    );
}

#[test]
fn an_output_past_the_file_size_limit_is_an_error_and_leaves_no_half_file() {
    // Under a file size limit (`ulimit -f`, set by some batch systems) the program's small
    // record fits but the JSON kreplay writes with -o does not: kreplay must say so and exit
    // 1, not die of SIGXFSZ and leave a truncated JSON behind.
    use std::os::unix::process::CommandExt;
    let dir = scratch("output-fsize");
    let app = dir.join("app.sh");
    support::write_executable(
        &app,
        "#!/bin/sh\n\
         printf '%s' '{\"backend\":\"cuda\",\"tool\":\"built-in\",\"passes_requested\":4,\"kernels\":[{\"kernel\":\"k\",\"launches\":1,\"replayed\":1,\"passes\":4,\"snapshot_bytes\":64,\"tier\":\"host\",\"strategy\":\"full\",\"restores\":3,\"restore_ms\":0.1,\"failed\":0,\"declines\":{}}],\"graph_launches\":0,\"managed_allocations\":0}' \
           > \"$KREPLAY_RECORD_DIR/kreplay-record-$$.json\"\n",
    );
    let lib = fake_library(&dir);
    let json = dir.join("kernels.json");
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_kreplay"));
    command.args([
        "run",
        "--backend",
        "cuda",
        "--library",
        lib.to_str().unwrap(),
        "-o",
        json.to_str().unwrap(),
        "--",
        app.to_str().unwrap(),
    ]);
    for (name, _) in std::env::vars_os() {
        if name.to_string_lossy().starts_with("KREPLAY_") {
            command.env_remove(name);
        }
    }
    // SAFETY: setrlimit is async-signal-safe; the closure touches nothing else.
    unsafe {
        command.pre_exec(|| {
            let limit = libc::rlimit {
                rlim_cur: 400,
                rlim_max: libc::RLIM_INFINITY,
            };
            if libc::setrlimit(libc::RLIMIT_FSIZE, &limit) == 0 {
                Ok(())
            } else {
                Err(std::io::Error::last_os_error())
            }
        })
    };
    let out = command.output().unwrap();
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{:?}: {stderr}", out.status);
    assert!(
        stderr.contains(json.to_str().unwrap()) && stderr.contains("RLIMIT_FSIZE"),
        "{stderr}"
    );
    assert!(!json.exists(), "a truncated {} is left", json.display());
}

#[test]
fn check_fails_with_a_diff_summary_when_the_outputs_differ() {
    let dir = scratch("check-differ");
    let app = fake_program(&dir, true, true, 0);
    let lib = fake_library(&dir);
    let out = run(
        &["--backend", "cuda", "--check"],
        &lib,
        &[app.to_str().unwrap()],
    );
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("check failed: standard output differs"),
        "{stderr}"
    );
    assert!(
        stderr.contains("checksum 43") && stderr.contains("checksum 42"),
        "{stderr}"
    );
}

#[test]
fn a_program_that_fails_or_records_nothing_or_cannot_start_is_reported() {
    let dir = scratch("failures");
    let lib = fake_library(&dir);
    let run_on_cuda = |app: &str| run(&["--backend", "cuda"], &lib, &[app]);
    // Exits 3 after recording: the table is still printed, the command fails.
    let app = fake_program(&dir, true, false, 3);
    let out = run_on_cuda(app.to_str().unwrap());
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("exited with exit status: 3"),
        "{}",
        text(&out.stderr)
    );
    assert!(text(&out.stdout).contains("add_one"));
    // No record: kreplay was never loaded.
    let app = fake_program(&dir, false, false, 0);
    let out = run_on_cuda(app.to_str().unwrap());
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("kreplay recorded nothing"),
        "{}",
        text(&out.stderr)
    );
    // No such program.
    let missing = dir.join("no-such-program");
    let out = run_on_cuda(missing.to_str().unwrap());
    assert_eq!(out.status.code(), Some(1));
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("cannot start") && stderr.contains("no-such-program"),
        "{stderr}"
    );
}

#[test]
fn bad_command_lines_get_clear_errors() {
    let dir = scratch("usage");
    let app = fake_program(&dir, true, false, 0);
    let app = app.to_str().unwrap();
    let lib = fake_library(&dir);
    let lib = lib.to_str().unwrap();
    for (args, status, expect) in [
        (vec!["run"], 2, "PROGRAM"),
        (vec!["run", "--passes", "1", "--", app], 2, "--passes"),
        (vec!["run", "--passes", "0", "--", app], 2, "--passes"),
        (vec!["run", "--backend", "metal", "--", app], 2, "--backend"),
        (vec!["run", "-o", "out.txt", "--", app], 2, ".csv or .json"),
        (
            vec!["run", "--passes", "4", "--tool", "/x.so", "--", app],
            2,
            "cannot be used with",
        ),
        (
            vec![
                "run",
                "--backend",
                "cuda",
                "--library",
                "/nonexistent/libkreplay.so",
                "--",
                app,
            ],
            1,
            "--library: no such file: /nonexistent/libkreplay.so",
        ),
        (
            vec![
                "run",
                "--backend",
                "cuda",
                "--library",
                lib,
                "--tool",
                "/nonexistent/t.so",
                "--",
                app,
            ],
            1,
            "--tool: no such file",
        ),
    ] {
        let out = kreplay(&args);
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(status), "{args:?}: {stderr}");
        assert!(stderr.contains(expect), "{args:?}: {stderr}");
    }
    assert!(!dir.join("env.txt").exists(), "no program was started");
}

#[test]
fn run_says_a_tool_or_library_path_that_names_a_folder_is_a_folder() {
    let dir = scratch("folder-paths");
    let app = fake_program(&dir, true, false, 0);
    let app = app.to_str().unwrap();
    let lib = fake_library(&dir);
    let lib = lib.to_str().unwrap();
    let folder = dir.join("libtool.so");
    std::fs::create_dir_all(&folder).unwrap();
    let folder = folder.to_str().unwrap();
    for (args, expect) in [
        (
            vec![
                "run",
                "--backend",
                "hsa",
                "--library",
                lib,
                "--tool",
                folder,
                "--",
                app,
            ],
            format!("--tool: {folder} is a folder, not a library file"),
        ),
        (
            vec!["run", "--backend", "hsa", "--library", folder, "--", app],
            format!("--library: {folder} is a folder, not a library file"),
        ),
    ] {
        let out = kreplay(&args);
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {stderr}");
        assert!(stderr.contains(&expect), "{args:?}: {stderr}");
        assert!(!stderr.contains("no such file"), "{args:?}: {stderr}");
    }
    assert!(!dir.join("env.txt").exists(), "no program was started");
}

#[test]
fn help_documents_the_run_command() {
    let out = kreplay(&["run", "--help"]);
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0));
    assert!(
        stdout.contains("[-o FILE.csv|FILE.json] [--library PATH] -- PROGRAM"),
        "the usage line lists every option README's does: {stdout}"
    );
    for word in [
        "CUDA_INJECTION64_PATH",
        "HSA_TOOLS_LIB",
        "--passes",
        "--tool",
        "--backend",
        "--check",
        "--library",
        "KREPLAY_LIBRARY",
    ] {
        assert!(stdout.contains(word), "{word}: {stdout}");
    }
}

/// This build's libkreplay.so (built beside the test binaries as a dependency of the CLI).
fn libkreplay() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let deps = exe.parent().unwrap();
    [
        deps.join("libkreplay.so"),
        deps.parent().unwrap().join("libkreplay.so"),
    ]
    .into_iter()
    .find(|p| p.is_file())
    .expect("cargo builds libkreplay.so (the cdylib) beside the test binaries")
}

/// The softhsa-hosted application of examples/softhsa_app.rs (cargo test builds examples).
fn softhsa_app() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let app = exe
        .parent()
        .unwrap()
        .parent()
        .unwrap()
        .join("examples/softhsa_app");
    assert!(app.is_file(), "cargo test builds {}", app.display());
    app
}

#[test]
fn run_on_the_software_runtime_replays_every_dispatch_with_the_real_library_and_check_passes() {
    let lib = libkreplay();
    let app = softhsa_app();
    let json = scratch("softhsa").join("kernels.json");
    let out = run(
        &[
            "--backend",
            "hsa",
            "--passes",
            "3",
            "--check",
            "-o",
            json.to_str().unwrap(),
        ],
        &lib,
        &[app.to_str().unwrap()],
    );
    let stdout = succeeded(&out);
    assert!(stdout.contains("checksum buffer 2 sum"), "{stdout}");
    assert!(
        stdout.contains("check: the standard output is the same with and without kreplay"),
        "{stdout}"
    );
    let record: kreplay::run_record::RunRecord =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(record.backend, "hsa");
    assert_eq!(
        (record.tool.as_str(), record.passes_requested),
        ("built-in", 3)
    );
    let launches: u64 = record.kernels.iter().map(|k| k.launches).sum();
    let replayed: u64 = record.kernels.iter().map(|k| k.replayed).sum();
    let passes: u64 = record.kernels.iter().map(|k| k.passes).sum();
    let restores: u64 = record.kernels.iter().map(|k| k.restores).sum();
    assert_eq!(launches, 6, "3 buffers x 2 dispatches");
    assert_eq!((replayed, passes, restores), (6, 18, 12));
    assert!(
        record
            .kernels
            .iter()
            .all(|k| k.snapshot_bytes > 0 && !k.tier.is_empty())
    );
    assert!(
        stdout.contains("6 launch(es) on hsa (built-in tool, 3 passes): 6 replayed, 0 declined"),
        "{stdout}"
    );
}

#[test]
fn the_older_cuda_name_of_the_built_in_pass_count_is_read_on_hsa_too() {
    // The docs called KREPLAY_CUDA_PASSES a CUDA-only name; libkreplay reads it on either
    // backend when KREPLAY_PASSES is not set.
    let dir = scratch("cuda-passes-on-hsa");
    let out = std::process::Command::new(softhsa_app())
        .env("HSA_TOOLS_LIB", libkreplay())
        .env_remove("KREPLAY_PASSES")
        .env("KREPLAY_CUDA_PASSES", "3")
        .env("KREPLAY_RECORD_DIR", &dir)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let file = std::fs::read_dir(&dir)
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    let record: kreplay::run_record::RunRecord =
        serde_json::from_str(&std::fs::read_to_string(file).unwrap()).unwrap();
    assert_eq!(record.passes_requested, 3);
    let readme = include_str!("../../README.md");
    let row = readme
        .lines()
        .find(|l| l.starts_with("| `KREPLAY_PASSES`"))
        .unwrap();
    assert!(row.contains("read on either backend"), "{row}");
}

#[test]
fn a_software_runtime_program_refuses_an_unknown_table_layout() {
    // It ran on the 5.2 layout with a line on stderr and exit 0: a run meant for the ROCm 7
    // table (KREPLAY_SOFTHSA_TABLE=7.0) tried another one and said it passed.
    let lib = libkreplay();
    let app = softhsa_app();
    let out = run_with(
        &["--backend", "hsa", "--passes", "2"],
        &lib,
        &[app.to_str().unwrap()],
        &[("KREPLAY_SOFTHSA_TABLE", "7.0")],
    );
    let stderr = text(&out.stderr);
    assert_ne!(out.status.code(), Some(0), "{stderr}");
    assert!(
        stderr.contains("KREPLAY_SOFTHSA_TABLE") && !stderr.contains("using the ROCm"),
        "{stderr}"
    );
    assert!(!text(&out.stdout).contains("checksum"), "it did not run");
}

#[test]
fn run_with_a_c_tool_on_the_software_runtime_lets_the_tool_decide_and_check_passes() {
    if !common::have_compiler("cc") {
        return;
    }
    let dir = scratch("softhsa-tool");
    let tool = dir.join("libpass_counter.so");
    common::build_c_library_from(
        &common::example_source("c-tool/pass_counter.c"),
        &tool,
        "c11",
        &[],
    );
    let summary = dir.join("pass_counter.txt");
    let lib = libkreplay();
    let app = softhsa_app();
    let out = run_with(
        &[
            "--backend",
            "hsa",
            "--check",
            "--tool",
            tool.to_str().unwrap(),
        ],
        &lib,
        &[app.to_str().unwrap()],
        &[
            ("EXAMPLE_TOOL_PASSES", "5"),
            ("EXAMPLE_TOOL_OUTPUT", summary.to_str().unwrap()),
        ],
    );
    let stdout = succeeded(&out);
    assert!(
        stdout.contains("6 launch(es) on hsa (your tool): 6 replayed, 0 declined"),
        "{stdout}"
    );
    let total_passes: u64 = stdout
        .lines()
        .filter(|l| l.starts_with("kernel 0x"))
        .map(|l| l.split_whitespace().nth(3).unwrap().parse::<u64>().unwrap())
        .sum();
    assert_eq!(
        total_passes, 30,
        "the tool's 5 passes per dispatch: {stdout}"
    );
    let said = std::fs::read_to_string(&summary).unwrap();
    assert!(said.contains("6 dispatches, 6 replayed"), "{said}");
}

#[test]
fn run_says_when_the_tool_stayed_inactive_because_its_configure_returned_null() {
    if !common::have_compiler("cc") {
        return;
    }
    let dir = scratch("declining-tool");
    // As the guide's kreplay_configure does when built against another major version.
    let source = dir.join("declines.c");
    std::fs::write(
        &source,
        "#include \"kreplay.h\"\n\
         kreplay_tool_configure_result_t* kreplay_configure(uint32_t version, const char* rt,\n\
             uint32_t priority, kreplay_client_id_t* client_id) {\n\
             (void)version; (void)rt; (void)priority;\n\
             client_id->name = \"declines\";\n\
             return NULL;\n\
         }\n",
    )
    .unwrap();
    let tool = dir.join("libdeclines.so");
    common::build_c_library_from(&source, &tool, "c99", &[]);
    let out = run(
        &["--backend", "hsa", "--tool", tool.to_str().unwrap()],
        &libkreplay(),
        &[softhsa_app().to_str().unwrap()],
    );
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains(&format!(
            "kreplay: tool \"declines\" (client 1, from {}) stayed inactive: its \
             kreplay_configure returned NULL",
            tool.display()
        )),
        "a tool that replays nothing because it declined must be named, not left to guess \
         from the table:\n{stderr}"
    );
    // Declining is the tool's choice (abi.md), not a failure of the run.
    let stdout = succeeded(&out);
    assert!(stdout.contains("no tool replays"), "{stdout}");
}

#[test]
fn run_check_with_the_example_tool_as_documented_passes_and_the_summary_goes_to_stderr() {
    if !common::have_compiler("cc") {
        return;
    }
    let dir = scratch("example-tool-check");
    let tool = dir.join("libpass_counter.so");
    common::build_c_library_from(
        &common::example_source("c-tool/pass_counter.c"),
        &tool,
        "c11",
        &[],
    );
    // No EXAMPLE_TOOL_OUTPUT: the summary goes where the example puts it by default. The
    // application's standard output must be the same with and without kreplay.
    let out = run(
        &[
            "--backend",
            "hsa",
            "--check",
            "--tool",
            tool.to_str().unwrap(),
        ],
        &libkreplay(),
        &[softhsa_app().to_str().unwrap()],
    );
    let stdout = succeeded(&out);
    assert!(
        stdout.contains("check: the standard output is the same with and without kreplay"),
        "{stdout}"
    );
    assert!(
        text(&out.stderr).contains("pass_counter: 6 dispatches, 6 replayed"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn run_reports_a_tool_whose_kreplay_configure_is_a_variable_and_the_program_still_runs() {
    if !common::have_compiler("cc") {
        return;
    }
    let dir = scratch("variable-tool");
    let source = dir.join("variable.c");
    std::fs::write(
        &source,
        "void *kreplay_configure = 0; /* a slip: the pointer, not the function */\n",
    )
    .unwrap();
    let tool = dir.join("libvariable.so");
    common::build_c_library_from(&source, &tool, "c99", &[]);
    let out = run(
        &["--backend", "hsa", "--tool", tool.to_str().unwrap()],
        &libkreplay(),
        &[softhsa_app().to_str().unwrap()],
    );
    let stdout = text(&out.stdout);
    let stderr = text(&out.stderr);
    assert!(
        stdout.contains("checksum buffer 2 sum"),
        "the program runs to its end, without the tool:\n{stdout}\n{stderr}"
    );
    assert!(
        stderr.contains("kreplay_configure is not a function"),
        "the tool is named and why it cannot be used:\n{stderr}"
    );
    assert_eq!(out.status.code(), Some(1), "{stderr}");
}

/// A C tool whose `kreplay_configure` hands over `init` (C source defining
/// `static int init(kreplay_client_finalize_t, void*)` and what it uses), built as
/// `lib<name>.so`, run by `kreplay run --tool` over the software runtime's program; `None`
/// where there is no C compiler.
fn run_c_tool_with_init(name: &str, init: &str) -> Option<Output> {
    if !common::have_compiler("cc") {
        return None;
    }
    let dir = scratch(name);
    let source = dir.join(format!("{name}.c"));
    std::fs::write(
        &source,
        format!(
            "#include \"kreplay.h\"\n\
             {init}\n\
             kreplay_tool_configure_result_t* kreplay_configure(uint32_t v, const char* rt,\n\
                 uint32_t p, kreplay_client_id_t* c) {{\n\
                 static kreplay_tool_configure_result_t result =\n\
                     {{sizeof(kreplay_tool_configure_result_t), init, NULL, NULL}};\n\
                 (void)v; (void)rt; (void)p; c->name = \"{name}\"; return &result;\n\
             }}\n"
        ),
    )
    .unwrap();
    let tool = dir.join(format!("lib{name}.so"));
    common::build_c_library_from(&source, &tool, "c99", &[]);
    Some(run(
        &["--backend", "hsa", "--tool", tool.to_str().unwrap()],
        &libkreplay(),
        &[softhsa_app().to_str().unwrap()],
    ))
}

#[test]
fn a_tool_that_configures_kernel_replay_but_never_starts_its_context_is_told_why_nothing_replays() {
    let Some(out) = run_c_tool_with_init(
        "unstarted",
        "static void on_replay(kreplay_callback_tracing_record_t r, kreplay_user_data_t* u,\n\
                               void* d) { (void)r; (void)u; (void)d; }\n\
         static int init(kreplay_client_finalize_t f, void* t) {\n\
             kreplay_context_id_t c; (void)f; (void)t;\n\
             if (kreplay_create_context(&c)) return 1;\n\
             /* the slip: configured, never started */\n\
             return kreplay_configure_callback_tracing_service(c,\n\
                 KREPLAY_CALLBACK_TRACING_KERNEL_REPLAY, NULL, 0, on_replay, NULL);\n\
         }",
    ) else {
        return;
    };
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("configured kernel replay on a context it has not started"),
        "the author learns why no dispatch is replayed:\n{stderr}"
    );
    let stdout = succeeded(&out);
    assert!(stdout.contains("0 replayed"), "{stdout}");
}

#[test]
fn a_replay_that_failed_fails_the_run_even_when_the_program_succeeds() {
    let dir = scratch("failed-replay");
    let lib = fake_library(&dir);
    let record = RECORD.replace("PASSES", "3").replace(
        "\"restore_ms\": 1.5, \"failed\": 0",
        "\"restore_ms\": 1.5, \"failed\": 1",
    );
    assert!(record.contains("\"failed\": 1"));
    let app = dir.join("app.sh");
    support::write_executable(
        &app,
        &format!(
            "#!/bin/sh\n\
             if [ -n \"$KREPLAY_RECORD_DIR\" ]; then cat > \"$KREPLAY_RECORD_DIR/kreplay-record-$$-0.json\" <<'EOF'\n{record}\nEOF\nfi\n\
             echo \"checksum 42\"\nexit 0\n"
        ),
    );
    let out = run(&["--backend", "cuda"], &lib, &[app.to_str().unwrap()]);
    let stderr = text(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(1),
        "a failed restore may have lost application data: the run must not pass\n{}\n{stderr}",
        text(&out.stdout)
    );
    assert!(
        stderr.contains("1 replay(s) failed"),
        "stderr says what failed:\n{stderr}"
    );
}

#[test]
fn run_names_the_tool_option_when_the_tool_it_was_given_cannot_be_loaded() {
    let dir = scratch("tool-not-a-library");
    let tool = dir.join("libnot_a_library.so");
    std::fs::write(&tool, "not an ELF file\n").unwrap();
    let out = run(
        &["--backend", "hsa", "--tool", tool.to_str().unwrap()],
        &libkreplay(),
        &[softhsa_app().to_str().unwrap()],
    );
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    // The user passed --tool; KREPLAY_TOOL_LIBRARIES is how it reaches the program.
    assert!(
        stderr.contains(&format!("kreplay: --tool: cannot use {}: ", tool.display())),
        "{stderr}"
    );
}

#[test]
fn a_refused_service_configuration_whose_status_the_tool_ignores_is_still_reported() {
    // The slip: the callback is left NULL and the returned status is never looked at.
    let Some(out) = run_c_tool_with_init(
        "ignores",
        "static int init(kreplay_client_finalize_t f, void* t) {\n\
             kreplay_context_id_t c; (void)f; (void)t;\n\
             kreplay_create_context(&c);\n\
             kreplay_configure_callback_tracing_service(c,\n\
                 KREPLAY_CALLBACK_TRACING_KERNEL_REPLAY, NULL, 0, NULL, NULL);\n\
             kreplay_start_context(c);\n\
             return 0;\n\
         }",
    ) else {
        return;
    };
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains(
            "kreplay_configure_callback_tracing_service(KERNEL_REPLAY) refused \
             (KREPLAY_STATUS_ERROR_INVALID_ARGUMENT): the callback is NULL"
        ),
        "kreplay says which call was refused and why, for the tool that did not look:\n{stderr}"
    );
}

#[test]
fn a_refused_counting_service_whose_status_the_tool_ignores_is_still_reported() {
    let Some(out) = run_c_tool_with_init(
        "ignores_counting",
        "static int init(kreplay_client_finalize_t f, void* t) {\n\
             kreplay_context_id_t c; (void)f; (void)t;\n\
             kreplay_create_context(&c);\n\
             kreplay_configure_dispatch_counting_service(c, NULL, NULL, NULL);\n\
             kreplay_start_context(c);\n\
             return 0;\n\
         }",
    ) else {
        return;
    };
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains(
            "kreplay_configure_dispatch_counting_service refused \
             (KREPLAY_STATUS_ERROR_INVALID_ARGUMENT): a callback is NULL"
        ),
        "{stderr}"
    );
}

#[test]
fn the_users_own_hsa_tools_lib_is_kept_after_libkreplay() {
    // Another ROCm tool the user runs alongside (HSA_TOOLS_LIB is a list): it still loads,
    // after kreplay's library, and the command says so.
    let dir = scratch("hsa-tools-lib-kept");
    let app = fake_program(&dir, true, false, 0);
    let lib = fake_library(&dir);
    let theirs = "\"/opt/other tool/libtrace.so\" /opt/libcount.so";
    let out = run_with(
        &["--backend=hsa"],
        &lib,
        &[app.to_str().unwrap()],
        &[("HSA_TOOLS_LIB", theirs)],
    );
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    let env = env_seen(&dir);
    assert!(
        env.contains(&format!("HSA_TOOLS_LIB={} {theirs}\n", lib.display())),
        "{env}"
    );
    assert!(
        stderr.contains("HSA_TOOLS_LIB") && stderr.contains(theirs),
        "{stderr}"
    );
}

#[test]
fn an_hsa_tools_lib_that_names_libkreplay_already_is_not_loaded_twice() {
    let dir = scratch("hsa-tools-lib-twice");
    let app = fake_program(&dir, true, false, 0);
    let lib = fake_library(&dir);
    let theirs = format!("{} /opt/libcount.so", lib.display());
    let out = run_with(
        &["--backend=hsa"],
        &lib,
        &[app.to_str().unwrap()],
        &[("HSA_TOOLS_LIB", &theirs)],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let env = env_seen(&dir);
    assert!(
        env.contains(&format!(
            "HSA_TOOLS_LIB={} /opt/libcount.so\n",
            lib.display()
        )),
        "{env}"
    );
}

#[test]
fn a_users_cuda_injection_library_is_refused_before_the_program_runs() {
    // CUDA loads one injection library: kreplay's would silently replace theirs.
    let dir = scratch("cuda-injection-theirs");
    let app = fake_program(&dir, true, false, 0);
    let lib = fake_library(&dir);
    let out = run_with(
        &["--backend=cuda"],
        &lib,
        &[app.to_str().unwrap()],
        &[("CUDA_INJECTION64_PATH", "/opt/libcupti_tool.so")],
    );
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("CUDA_INJECTION64_PATH") && stderr.contains("/opt/libcupti_tool.so"),
        "{stderr}"
    );
    assert!(!dir.join("env.txt").exists(), "the program ran");
    // Naming kreplay's own library there is no conflict.
    let out = run_with(
        &["--backend=cuda"],
        &lib,
        &[app.to_str().unwrap()],
        &[("CUDA_INJECTION64_PATH", lib.to_str().unwrap())],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
}

#[test]
fn the_users_own_tool_libraries_are_kept_beside_the_built_in_tool_and_a_tool() {
    let dir = scratch("tool-libraries-kept");
    let app = fake_program(&dir, true, false, 0);
    let lib = fake_library(&dir);
    let tool = dir.join("libmytool.so");
    std::fs::write(&tool, b"a tool").unwrap();
    let theirs = [("KREPLAY_TOOL_LIBRARIES", "/opt/libobserver.so")];
    let out = run_with(&["--backend=cuda"], &lib, &[app.to_str().unwrap()], &theirs);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    let env = env_seen(&dir);
    assert!(
        env.contains("KREPLAY_TOOL_LIBRARIES=/opt/libobserver.so\n")
            && env.contains("KREPLAY_PASSES=4\n"),
        "{env}"
    );
    assert!(stderr.contains("/opt/libobserver.so"), "{stderr}");
    let out = run_with(
        &["--backend=cuda", "--tool", tool.to_str().unwrap()],
        &lib,
        &[app.to_str().unwrap()],
        &theirs,
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let env = env_seen(&dir);
    assert!(
        env.contains(&format!(
            "KREPLAY_TOOL_LIBRARIES=/opt/libobserver.so:{}\n",
            tool.display()
        )),
        "{env}"
    );
}

#[test]
fn the_other_runtimes_injection_variable_reaches_the_program_unchanged() {
    // A CUDA run leaves the user's ROCm tools alone, and a ROCm run the user's CUDA injection
    // library: kreplay injects through one runtime's variable only.
    let dir = scratch("other-runtime-kept");
    let app = fake_program(&dir, true, false, 0);
    let lib = fake_library(&dir);
    let out = run_with(
        &["--backend=cuda"],
        &lib,
        &[app.to_str().unwrap()],
        &[("HSA_TOOLS_LIB", "/opt/libtrace.so")],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let env = env_seen(&dir);
    assert!(env.contains("HSA_TOOLS_LIB=/opt/libtrace.so\n"), "{env}");
    let out = run_with(
        &["--backend=hsa"],
        &lib,
        &[app.to_str().unwrap()],
        &[("CUDA_INJECTION64_PATH", "/opt/libcupti_tool.so")],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let env = env_seen(&dir);
    assert!(
        env.contains("CUDA_INJECTION64_PATH=/opt/libcupti_tool.so\n"),
        "{env}"
    );
}

/// A program path that names a folder, or a file without execute permission, is said to be
/// that (both were "Permission denied", which sends a user after file modes and ownership).
#[test]
fn run_says_a_program_that_is_a_folder_or_not_executable_is_that() {
    let dir = scratch("program-paths");
    let lib = fake_library(&dir);
    let folder = dir.join("app");
    std::fs::create_dir_all(&folder).unwrap();
    let plain = dir.join("app.sh");
    std::fs::write(&plain, "#!/bin/sh\nexit 0\n").unwrap();
    for (program, expect) in [
        (&folder, "it is a folder, not a program"),
        (&plain, "it is not executable (no execute permission)"),
    ] {
        let program = program.to_str().unwrap();
        let out = run(&["--backend", "hsa"], &lib, &[program]);
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{program}: {stderr}");
        assert!(
            stderr.contains(&format!("cannot start {program}: {expect}")),
            "{program}: {stderr}"
        );
    }
}
