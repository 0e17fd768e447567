//! Every command that writes a file says so, naming the file, once the file is there.

mod support;

use std::path::PathBuf;
use std::process::Output;

fn kreplay(args: &[&str]) -> Output {
    support::kreplay_with(args, &[])
}

fn scratch(name: &str) -> String {
    let path = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("outputs-{}-{name}", std::process::id()));
    let _ = std::fs::remove_file(&path);
    path.to_str().unwrap().to_owned()
}

/// Runs `args`, which write `files`, and checks the report names each, after it was written.
fn assert_says_what_it_wrote(args: &[&str], files: &[&str]) {
    let output = kreplay(args);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(
        output.status.code(),
        Some(0),
        "{args:?}: {stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    for file in files {
        let len = std::fs::metadata(file)
            .unwrap_or_else(|e| panic!("{args:?} wrote {file}: {e}"))
            .len();
        assert!(len > 0, "{file} is empty");
        assert!(
            stdout
                .lines()
                .any(|l| l.starts_with(&format!("wrote {file}"))),
            "{args:?} says it wrote {file}: {stdout}"
        );
        let _ = std::fs::remove_file(file);
    }
}

#[test]
fn demo_says_what_it_wrote() {
    let (csv, json) = (scratch("demo.csv"), scratch("demo.json"));
    assert_says_what_it_wrote(
        &["demo", "--elements", "1k", "--csv", &csv, "--json", &json],
        &[&csv, &json],
    );
}

#[test]
fn bench_dispatch_says_what_it_wrote() {
    let csv = scratch("dispatch.csv");
    assert_says_what_it_wrote(
        &[
            "bench-dispatch",
            "--dispatches",
            "10",
            "--allocations",
            "1",
            "--csv",
            &csv,
        ],
        &[&csv],
    );
}

#[test]
fn profile_says_what_it_wrote() {
    let (csv, json) = (scratch("profile.csv"), scratch("profile.json"));
    for file in [&csv, &json] {
        assert_says_what_it_wrote(
            &["profile", "--pmc", "SQ_WAVES", "-o", file, "--", "saxpy"],
            &[file],
        );
    }
}

#[test]
fn bench_says_what_it_wrote() {
    let (csv, svg) = (scratch("bench.csv"), scratch("bench.svg"));
    let mut args = vec![
        "bench",
        "--footprints",
        "64K",
        "--dirty",
        "0,10",
        "--passes",
        "none",
        "--repeats",
        "1",
        "--csv",
        &csv,
        "--svg",
        &svg,
    ];
    // What is checked is the report of the files written, whatever the tiers: without room
    // for spill files in the system temporary directory the bench leaves out the file tier.
    if !support::spill_room(&std::env::temp_dir(), 1 << 20) {
        eprintln!("(the file tier is left out of the bench)");
        args.extend(["--tiers", "device,host"]);
    }
    assert_says_what_it_wrote(&args, &[&csv, &svg]);
}

/// Runs `args` under a file size limit (`ulimit -f`, which some batch systems set) of `limit`
/// bytes, which `file`, the output they write, exceeds: kreplay must say so and exit 1, not die
/// of SIGXFSZ leaving a truncated file that looks like a result.
fn assert_refuses_an_output_past_the_file_size_limit(args: &[&str], file: &str, limit: u64) {
    let stderr = assert_fails_under_a_file_size_limit_leaving_no_file(args, file, limit);
    assert!(
        stderr.contains(file) && stderr.contains("RLIMIT_FSIZE"),
        "{args:?}: {stderr}"
    );
}

/// Runs `args` under a file size limit of `limit` bytes: they must fail with exit status 1
/// (not a signal) and leave no `file`. Returns their standard error.
fn assert_fails_under_a_file_size_limit_leaving_no_file(
    args: &[&str],
    file: &str,
    limit: u64,
) -> String {
    use std::os::unix::process::CommandExt;
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_kreplay"));
    command.args(args);
    for (name, _) in std::env::vars_os() {
        if name.to_string_lossy().starts_with("KREPLAY_") {
            command.env_remove(name);
        }
    }
    // SAFETY: setrlimit is async-signal-safe; the closure touches nothing else.
    unsafe {
        command.pre_exec(move || {
            let limit = libc::rlimit {
                rlim_cur: limit,
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
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(1),
        "{args:?}: {:?}: {stderr}",
        out.status
    );
    assert!(
        std::fs::metadata(file).is_err(),
        "{args:?} left a truncated {file}"
    );
    stderr.into_owned()
}

#[test]
fn profile_refuses_an_output_past_the_file_size_limit() {
    for file in [scratch("fsize-profile.csv"), scratch("fsize-profile.json")] {
        assert_refuses_an_output_past_the_file_size_limit(
            &["profile", "--pmc", "SQ_WAVES", "-o", &file, "--", "saxpy"],
            &file,
            40,
        );
    }
}

#[test]
fn demo_refuses_an_output_past_the_file_size_limit() {
    let (csv, json) = (scratch("fsize-demo.csv"), scratch("fsize-demo.json"));
    assert_refuses_an_output_past_the_file_size_limit(
        &["demo", "--elements", "1k", "--json", &json],
        &json,
        40,
    );
    assert_refuses_an_output_past_the_file_size_limit(
        &["demo", "--elements", "1k", "--csv", &csv],
        &csv,
        40,
    );
}

#[test]
fn a_bench_that_fails_leaves_no_empty_file() {
    // Under a file size limit of 40 bytes the bench's spill store cannot be made: the bench
    // fails before it measured anything, and must not leave an empty CSV or SVG behind.
    for (option, name) in [("--csv", "fails-bench.csv"), ("--svg", "fails-bench.svg")] {
        let file = scratch(name);
        assert_fails_under_a_file_size_limit_leaving_no_file(
            &[
                "bench",
                "--footprints",
                "64K",
                "--dirty",
                "0,10",
                "--passes",
                "none",
                "--repeats",
                "1",
                option,
                &file,
            ],
            &file,
            40,
        );
    }
}

#[test]
fn two_outputs_of_one_command_naming_the_same_file_are_refused() {
    // demo --csv F --json F wrote the JSON, then the CSV over it, and said it wrote both.
    let file = scratch("same.out");
    // The same file through its folder's parent.
    let path = PathBuf::from(&file);
    let folder = path.parent().unwrap();
    let relative = folder
        .join("..")
        .join(folder.file_name().unwrap())
        .join(path.file_name().unwrap());
    let relative = relative.to_str().unwrap();
    for args in [
        vec!["demo", "--elements", "1k", "--csv", &file, "--json", &file],
        vec![
            "demo",
            "--elements",
            "1k",
            "--csv",
            &file,
            "--json",
            relative,
        ],
        vec![
            "bench",
            "--footprints",
            "64K",
            "--csv",
            &file,
            "--svg",
            &file,
        ],
    ] {
        let out = kreplay(&args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains("same file"), "{args:?}: {stderr}");
        assert!(std::fs::metadata(&file).is_err(), "{args:?} wrote {file}");
    }
}

/// What `kreplay demo --elements 1k --json FILE` did where FILE, holding `previous`, lies on a
/// file system with no room left for another page (a tmpfs of one page, mounted in a mount
/// namespace of its own): its exit status, standard error, the folder's entries and FILE's
/// text afterwards. `None` where this process may not make such a namespace (not root, no
/// `unshare`).
fn demo_json_onto_a_full_disk(previous: &str) -> Option<(i32, String, Vec<String>, String)> {
    let dir = PathBuf::from(scratch("full-disk"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let script = r#"
        mount -t tmpfs -o size=4k kreplay-full "$1" || exit 77
        printf '%s' "$2" > "$1/out.json" || exit 77
        "$0" demo --elements 1k --json "$1/out.json" > /dev/null 2> "$1.stderr"
        echo "status $?" > "$1.result"
        ls -A "$1" >> "$1.result"
        echo "---" >> "$1.result"
        cat "$1/out.json" >> "$1.result" 2>&1
        exit 0
    "#;
    let mut command = std::process::Command::new("unshare");
    command
        .args(["--mount", "--propagation", "private", "sh", "-c", script])
        .arg(env!("CARGO_BIN_EXE_kreplay"))
        .arg(&dir)
        .arg(previous);
    for (name, _) in std::env::vars_os() {
        if name.to_string_lossy().starts_with("KREPLAY_") {
            command.env_remove(name);
        }
    }
    let ran = command.output().ok()?;
    if ran.status.code() != Some(0) {
        eprintln!(
            "skipped: no tmpfs in a mount namespace here ({:?}: {})",
            ran.status,
            String::from_utf8_lossy(&ran.stderr)
        );
        return None;
    }
    let result = std::fs::read_to_string(dir.with_extension("result")).unwrap();
    let stderr = std::fs::read_to_string(dir.with_extension("stderr")).unwrap();
    let _ = std::fs::remove_file(dir.with_extension("result"));
    let _ = std::fs::remove_file(dir.with_extension("stderr"));
    let _ = std::fs::remove_dir(&dir);
    let (head, file) = result.split_once("---\n").unwrap();
    let mut lines = head.lines();
    let status = lines.next().unwrap().strip_prefix("status ").unwrap();
    let entries = lines.map(str::to_owned).collect();
    Some((status.parse().unwrap(), stderr, entries, file.to_owned()))
}

#[test]
fn an_output_that_fills_the_disk_keeps_the_previous_file_and_leaves_no_temporary_file() {
    let previous = "{\"an\": \"earlier result\"}\n";
    let Some((status, stderr, entries, file)) = demo_json_onto_a_full_disk(previous) else {
        return;
    };
    assert_eq!(status, 1, "{stderr}");
    assert!(
        stderr.contains("out.json") && stderr.contains("No space left on device"),
        "the error names the file and what failed: {stderr}"
    );
    assert_eq!(
        entries,
        ["out.json"],
        "only the previous file is left: {stderr}"
    );
    assert_eq!(file, previous, "the previous file is kept as it was");
}

/// A named pipe given as an output file: its reader gets the whole output once, not the end of
/// its input from a check that opened and closed the pipe before the command ran (after which
/// the real write waited for ever for a reader that was gone).
#[test]
fn a_named_pipe_as_an_output_file_gets_the_whole_output() {
    use std::io::Read;
    use std::time::{Duration, Instant};
    let fifo = scratch("pipe.csv");
    let made = std::process::Command::new("mkfifo").arg(&fifo).status();
    if !made.is_ok_and(|s| s.success()) {
        eprintln!("skipped: mkfifo is not available");
        return;
    }
    let (tx, rx) = std::sync::mpsc::channel();
    let path = fifo.clone();
    std::thread::spawn(move || {
        let mut text = String::new();
        let read = std::fs::File::open(&path).and_then(|mut f| f.read_to_string(&mut text));
        let _ = tx.send(read.map(|_| text));
    });
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_kreplay"))
        .args(["demo", "--elements", "1k", "--csv", &fifo])
        .env_remove("KREPLAY_RESTORE")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("kreplay runs");
    let read = rx.recv_timeout(Duration::from_secs(60));
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break Some(status);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let _ = std::fs::remove_file(&fifo);
    let text = read
        .expect("the reader finished")
        .expect("the pipe was read");
    assert!(
        text.lines().count() > 1 && text.contains(','),
        "the reader got the CSV: {text:?}"
    );
    assert!(
        status.is_some_and(|s| s.success()),
        "kreplay ended: {status:?}"
    );
}
