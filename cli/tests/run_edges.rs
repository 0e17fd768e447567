//! `kreplay run` from the outside, in the situations a user hits: a `--tool` that cannot be
//! used, `--check` on programs that read their input, leave processes behind, fail only
//! without kreplay or print bytes that are not UTF-8, interruptions, workers that outlive the
//! program, and option values the shell allows (paths that are not UTF-8, negative counts).
//! Every run is killed after a deadline.

#[allow(dead_code)]
mod bounded {
    use std::io::{Read, Write};
    use std::os::unix::process::CommandExt;
    use std::path::{Path, PathBuf};
    use std::process::{Command, Stdio};
    use std::time::{Duration, Instant};

    pub struct Ran {
        pub code: Option<i32>,
        pub stdout: String,
        pub stdout_bytes: Vec<u8>,
        pub stderr: String,
        pub timed_out: bool,
        pub elapsed: Duration,
    }

    impl std::fmt::Debug for Ran {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(
                f,
                "code={:?} timed_out={} elapsed={:?}\n--- stdout ---\n{}\n--- stderr ---\n{}",
                self.code, self.timed_out, self.elapsed, self.stdout, self.stderr
            )
        }
    }

    pub fn kreplay_exe() -> &'static str {
        env!("CARGO_BIN_EXE_kreplay")
    }

    /// The kreplay command, with inherited KREPLAY_* / injection variables removed, in its own
    /// process group (so a deadline kill takes its children too).
    pub fn command(args: &[&std::ffi::OsStr], env: &[(&str, &std::ffi::OsStr)]) -> Command {
        let mut c = Command::new(kreplay_exe());
        c.args(args);
        for (name, _) in std::env::vars_os() {
            let n = name.to_string_lossy();
            if n.starts_with("KREPLAY_") || n == "CUDA_INJECTION64_PATH" || n == "HSA_TOOLS_LIB" {
                c.env_remove(name);
            }
        }
        for (k, v) in env {
            c.env(k, v);
        }
        c.process_group(0);
        c
    }

    /// Runs `c` with `stdin` bytes (None: /dev/null), killing its process group after
    /// `deadline`.
    pub fn run(mut c: Command, stdin: Option<&[u8]>, deadline: Duration) -> Ran {
        c.stdout(Stdio::piped()).stderr(Stdio::piped());
        c.stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        });
        let start = Instant::now();
        let mut child = c.spawn().expect("kreplay starts");
        let pgid = child.id() as i32;
        if let Some(bytes) = stdin {
            let mut si = child.stdin.take().unwrap();
            let bytes = bytes.to_vec();
            std::thread::spawn(move || {
                let _ = si.write_all(&bytes);
            });
        }
        let mut so = child.stdout.take().unwrap();
        let mut se = child.stderr.take().unwrap();
        let to = std::thread::spawn(move || {
            let mut v = Vec::new();
            let _ = so.read_to_end(&mut v);
            v
        });
        let te = std::thread::spawn(move || {
            let mut v = Vec::new();
            let _ = se.read_to_end(&mut v);
            v
        });
        let mut timed_out = false;
        let status = loop {
            if let Some(s) = child.try_wait().unwrap() {
                break s;
            }
            if start.elapsed() > deadline {
                timed_out = true;
                // SAFETY: kills the process group this test created.
                unsafe { libc::kill(-pgid, libc::SIGKILL) };
                break child.wait().unwrap();
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let elapsed = start.elapsed();
        // Anything still holding the pipes (a stray descendant) is killed too, so the readers end.
        if !timed_out {
            let grace = Instant::now();
            while !to.is_finished() || !te.is_finished() {
                if grace.elapsed() > Duration::from_secs(5) {
                    // SAFETY: kills the process group this test created.
                    unsafe { libc::kill(-pgid, libc::SIGKILL) };
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        let stdout_bytes = to.join().unwrap();
        let stderr = te.join().unwrap();
        Ran {
            code: status.code(),
            stdout: String::from_utf8_lossy(&stdout_bytes).into_owned(),
            stdout_bytes,
            stderr: String::from_utf8_lossy(&stderr).into_owned(),
            timed_out,
            elapsed,
        }
    }

    /// `kreplay ARGS` with strings, no stdin, a deadline.
    pub fn kreplay(args: &[&str], env: &[(&str, &str)], deadline_s: u64) -> Ran {
        let a: Vec<&std::ffi::OsStr> = args.iter().map(std::ffi::OsStr::new).collect();
        let e: Vec<(&str, &std::ffi::OsStr)> = env
            .iter()
            .map(|(k, v)| (*k, std::ffi::OsStr::new(v)))
            .collect();
        run(command(&a, &e), None, Duration::from_secs(deadline_s))
    }

    /// A fresh folder for one test.
    pub fn scratch(name: &str) -> PathBuf {
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("run-edges-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    /// This build's libkreplay.so.
    pub fn libkreplay() -> PathBuf {
        let exe = std::env::current_exe().unwrap();
        let deps = exe.parent().unwrap();
        [
            deps.join("libkreplay.so"),
            deps.parent().unwrap().join("libkreplay.so"),
        ]
        .into_iter()
        .find(|p| p.is_file())
        .expect("libkreplay.so beside the test binaries")
    }

    /// examples/softhsa_app.
    pub fn softhsa_app() -> PathBuf {
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

    /// Writes an executable shell script, through a child process: this test process, whose
    /// other threads fork all the time, must never hold it open for writing (a child forked at
    /// that moment keeps the descriptor until its exec, and executing the script then fails
    /// with ETXTBSY, "Text file busy").
    pub fn script(dir: &Path, name: &str, body: &str) -> PathBuf {
        let p = dir.join(name);
        let mut child = Command::new("sh")
            .args(["-c", "cat > \"$0\" && chmod 755 \"$0\""])
            .arg(&p)
            .stdin(Stdio::piped())
            .spawn()
            .expect("sh runs");
        child
            .stdin
            .take()
            .unwrap()
            .write_all(format!("#!/bin/sh\n{body}").as_bytes())
            .unwrap();
        assert!(child.wait().unwrap().success(), "{} written", p.display());
        p
    }

    /// A shell snippet writing a minimal one-kernel record, as libkreplay does at exit.
    pub const WRITE_RECORD: &str = r#"if [ -n "$KREPLAY_RECORD_DIR" ]; then cat > "$KREPLAY_RECORD_DIR/kreplay-record-$$.json" <<'REC'
{"backend":"hsa","tool":"built-in","passes_requested":4,"kernels":[{"kernel":"k","launches":1,"replayed":1,"passes":4,"snapshot_bytes":64,"tier":"host","strategy":"full","restores":3,"restore_ms":0.1,"failed":0,"declines":{}}],"graph_launches":0,"managed_allocations":0}
REC
fi
"#;
}

use bounded::*;
use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

// ---- tool ----

fn build_c(dir: &Path, name: &str, source: &str) -> Option<PathBuf> {
    let src = dir.join(format!("{name}.c"));
    std::fs::write(&src, source).unwrap();
    let lib = dir.join(format!("lib{name}.so"));
    let ok = std::process::Command::new("cc")
        .args(["-std=c11", "-fPIC", "-shared", "-I"])
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/../ffi/include"))
        .arg(&src)
        .arg("-o")
        .arg(&lib)
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    ok.then_some(lib)
}

fn run_with_tool(tool: &Path, json: &Path, env: &[(&str, &str)]) -> Ran {
    let lib = libkreplay();
    let app = softhsa_app();
    kreplay(
        &[
            "run",
            "--backend",
            "hsa",
            "--library",
            lib.to_str().unwrap(),
            "--tool",
            tool.to_str().unwrap(),
            "-o",
            json.to_str().unwrap(),
            "--",
            app.to_str().unwrap(),
        ],
        env,
        120,
    )
}

/// What the JSON says: (tool, launches).
fn recorded(json: &Path) -> (String, u64) {
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(json).unwrap_or_default())
            .unwrap_or(serde_json::Value::Null);
    let launches = v["kernels"]
        .as_array()
        .map(|ks| ks.iter().map(|k| k["launches"].as_u64().unwrap_or(0)).sum())
        .unwrap_or(0);
    (v["tool"].as_str().unwrap_or("").to_string(), launches)
}

#[test]
fn a_tool_that_is_not_a_library_is_not_a_successful_run() {
    let dir = scratch("tool-not-elf");
    let tool = dir.join("libnot_a_tool.so");
    std::fs::write(&tool, b"this is not an ELF file").unwrap();
    let json = dir.join("k.json");
    let ran = run_with_tool(&tool, &json, &[]);
    assert!(!ran.timed_out, "{ran:?}");
    assert_ne!(
        ran.code,
        Some(0),
        "the tool was never loaded (stderr says so), nothing was replayed, yet exit 0: {ran:?}"
    );
}

#[test]
fn a_tool_without_kreplay_configure_is_not_a_successful_run() {
    let dir = scratch("tool-no-entry");
    let Some(tool) = build_c(
        &dir,
        "noentry",
        "int not_kreplay_configure(void) { return 0; }\n",
    ) else {
        return;
    };
    let json = dir.join("k.json");
    let ran = run_with_tool(&tool, &json, &[]);
    assert!(!ran.timed_out, "{ran:?}");
    let (tool_name, launches) = recorded(&json);
    assert_ne!(
        ran.code,
        Some(0),
        "tool has no kreplay_configure; record says tool={tool_name:?}, launches={launches}: {ran:?}"
    );
}

#[test]
fn a_tool_whose_initialize_fails_is_not_a_successful_run() {
    let dir = scratch("tool-init-fails");
    let src = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../examples/c-tool/pass_counter.c"
    ))
    .unwrap();
    let Some(tool) = build_c(&dir, "pass_counter", &src) else {
        return;
    };
    let json = dir.join("k.json");
    // pass_counter's initialize returns 1 for EXAMPLE_TOOL_PASSES=0 (kreplay marks it failed).
    let ran = run_with_tool(&tool, &json, &[("EXAMPLE_TOOL_PASSES", "0")]);
    assert!(!ran.timed_out, "{ran:?}");
    let (tool_name, launches) = recorded(&json);
    assert!(
        ran.code != Some(0) || (tool_name != "built-in" && launches == 6),
        "tool failed to initialize; exit {:?}, record says tool={tool_name:?} launches={launches} \
         (the app made 6): {ran:?}",
        ran.code
    );
}

#[test]
fn launches_a_tool_declined_to_replay_are_still_counted() {
    // A valid tool that answers kreplay_configure with NULL (stays inactive) — the README: the
    // table lists launches per kernel; the application made 6.
    let dir = scratch("tool-declines");
    let Some(tool) = build_c(
        &dir,
        "declines",
        "#include <kreplay.h>\n\
         kreplay_tool_configure_result_t* kreplay_configure(uint32_t v, const char* r, uint32_t p,\n\
             kreplay_client_id_t* id) { (void)v; (void)r; (void)p; (void)id; return NULL; }\n",
    ) else {
        return;
    };
    let json = dir.join("k.json");
    let ran = run_with_tool(&tool, &json, &[]);
    assert!(!ran.timed_out, "{ran:?}");
    let (tool_name, launches) = recorded(&json);
    assert_eq!(
        launches, 6,
        "the app dispatched 6 kernels; record tool={tool_name:?}: {ran:?}"
    );
}

#[test]
fn a_tool_named_relative_to_the_current_folder_is_the_one_loaded() {
    // `--tool libmine.so` or `--tool ./libmine.so` names a file in kreplay's current folder
    // (it is checked there); the program must load that file even when it changes folder
    // first, and a bare name must not send the dynamic loader to its search path.
    let dir = scratch("tool-relative");
    let Some(_tool) = build_c(
        &dir,
        "inactive",
        "#include <kreplay.h>\n\
         kreplay_tool_configure_result_t* kreplay_configure(uint32_t v, const char* r, uint32_t p,\n\
             kreplay_client_id_t* id) { (void)v; (void)r; (void)p; (void)id; return NULL; }\n",
    ) else {
        return;
    };
    let app = softhsa_app();
    let launcher = script(
        &dir,
        "elsewhere.sh",
        &format!("cd /\nexec '{}'\n", app.display()),
    );
    let lib = libkreplay();
    for (tool, program) in [
        ("libinactive.so", app.as_path()),
        ("./libinactive.so", launcher.as_path()),
    ] {
        let args: Vec<&OsStr> = vec![
            OsStr::new("run"),
            OsStr::new("--backend"),
            OsStr::new("hsa"),
            OsStr::new("--library"),
            lib.as_os_str(),
            OsStr::new("--tool"),
            OsStr::new(tool),
            OsStr::new("--"),
            program.as_os_str(),
        ];
        let mut c = command(&args, &[]);
        c.current_dir(&dir);
        let ran = run(c, None, Duration::from_secs(60));
        assert!(!ran.timed_out, "{ran:?}");
        assert_eq!(
            ran.code,
            Some(0),
            "--tool {tool} exists but the program could not load it: {ran:?}"
        );
    }
    // A path with a colon cannot be one entry of KREPLAY_TOOL_LIBRARIES: said so, not split.
    let odd = dir.join("a:b");
    std::fs::create_dir_all(&odd).unwrap();
    std::fs::copy(dir.join("libinactive.so"), odd.join("libinactive.so")).unwrap();
    let ran = kreplay(
        &[
            "run",
            "--backend",
            "hsa",
            "--library",
            lib.to_str().unwrap(),
            "--tool",
            odd.join("libinactive.so").to_str().unwrap(),
            "--",
            app.to_str().unwrap(),
        ],
        &[],
        60,
    );
    assert_eq!(ran.code, Some(1), "{ran:?}");
    assert!(
        ran.stderr.contains("--tool") && ran.stderr.contains("':'"),
        "{ran:?}"
    );
}

#[test]
fn with_a_tool_the_older_pass_count_variable_from_the_environment_replays_nothing() {
    // `KREPLAY_CUDA_PASSES` is the older name of `KREPLAY_PASSES` (docs/cuda.md), perhaps still
    // exported in the user's shell. With `--tool` the tool decides: a tool that replays
    // nothing must not get every launch replayed by the built-in tool behind its back.
    let dir = scratch("tool-old-passes");
    let Some(tool) = build_c(
        &dir,
        "inactive",
        "#include <kreplay.h>\n\
         kreplay_tool_configure_result_t* kreplay_configure(uint32_t v, const char* r, uint32_t p,\n\
             kreplay_client_id_t* id) { (void)v; (void)r; (void)p; (void)id; return NULL; }\n",
    ) else {
        return;
    };
    let json = dir.join("k.json");
    let ran = run_with_tool(&tool, &json, &[("KREPLAY_CUDA_PASSES", "3")]);
    assert!(!ran.timed_out, "{ran:?}");
    let record: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap_or_default())
            .unwrap_or_default();
    let kernel = &record["kernels"][0];
    assert_eq!(
        (kernel["launches"].as_u64(), kernel["passes"].as_u64()),
        (Some(6), Some(6)),
        "the tool replays nothing, yet launches ran several passes: {ran:?}"
    );
    assert_eq!(ran.code, Some(0), "{ran:?}");
}

// ---- check ----

fn check_run(dir: &Path, body: &str, extra: &[&str], stdin: Option<&[u8]>, deadline_s: u64) -> Ran {
    let app = script(dir, "app.sh", body);
    let lib = dir.join("libkreplay.so");
    std::fs::write(&lib, b"not loaded by the script").unwrap();
    let mut args: Vec<&str> = vec![
        "run",
        "--backend",
        "hsa",
        "--library",
        lib.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    args.push("--");
    let app = app.to_str().unwrap().to_string();
    args.push(&app);
    let a: Vec<&std::ffi::OsStr> = args.iter().map(std::ffi::OsStr::new).collect();
    run(command(&a, &[]), stdin, Duration::from_secs(deadline_s))
}

#[test]
fn check_does_not_wait_for_an_input_that_never_ends_when_the_program_reads_none() {
    // `ssh gpu-box kreplay run --check -- ./app`, `docker exec -i`, a parent process that
    // keeps a pipe to its child: the standard input is a pipe that stays open. A program that
    // reads none of it must run, under --check too, not wait for an end that never comes.
    let dir = scratch("check-open-stdin");
    let app = script(&dir, "app.sh", &format!("{WRITE_RECORD}echo checksum 42\n"));
    let lib = dir.join("libkreplay.so");
    std::fs::write(&lib, b"not loaded by the script").unwrap();
    let args = [
        "run",
        "--backend",
        "hsa",
        "--library",
        lib.to_str().unwrap(),
        "--check",
        "--",
        app.to_str().unwrap(),
    ];
    let a: Vec<&OsStr> = args.iter().map(OsStr::new).collect();
    let mut c = command(&a, &[]);
    c.stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let mut child = c.spawn().unwrap();
    // Held open, never written, until the end of the test.
    let _input = child.stdin.take();
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break Some(status);
        }
        if started.elapsed() > Duration::from_secs(20) {
            // SAFETY: kills the process group this test created.
            unsafe { libc::kill(-(child.id() as i32), libc::SIGKILL) };
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut stdout = String::new();
    let mut stderr = String::new();
    use std::io::Read;
    let _ = child.stdout.take().unwrap().read_to_string(&mut stdout);
    let _ = child.stderr.take().unwrap().read_to_string(&mut stderr);
    assert!(
        status.is_some(),
        "kreplay run --check waited for the end of a standard input the program never reads"
    );
    assert_eq!(status.unwrap().code(), Some(0), "{stdout}\n{stderr}");
    assert!(
        stdout.contains("check: the standard output is the same"),
        "{stdout}"
    );
}

#[test]
fn check_does_not_hang_on_a_background_child_that_holds_the_input_it_was_given() {
    // A launcher that starts a helper on its standard input and exits without reading it: the
    // input given to the run without kreplay can never all be written, which must not hold up
    // the command until the helper ends.
    let dir = scratch("check-bg-stdin");
    let body = format!("{WRITE_RECORD}exec 3<&0\nsleep 60 <&3 >/dev/null 2>&1 &\necho launched\n");
    let input = vec![b'x'; 1 << 20];
    let ran = check_run(&dir, &body, &["--check"], Some(&input), 30);
    assert!(
        !ran.timed_out && ran.elapsed < Duration::from_secs(20),
        "kreplay run --check waited for a helper holding its input: {ran:?}"
    );
}

#[test]
fn check_of_a_program_that_reads_its_input_compares_like_with_like() {
    // The same program, the same input: both runs must see it. The profiled run inherits and
    // consumes stdin, the plain run then reads an empty stream.
    let dir = scratch("check-stdin");
    let body =
        format!("{WRITE_RECORD}sum=$(wc -c | tr -d ' ')\necho \"checksum of input: $sum\"\n");
    let ran = check_run(&dir, &body, &["--check"], Some(b"0123456789\n"), 30);
    assert!(!ran.timed_out, "{ran:?}");
    assert_eq!(
        ran.code,
        Some(0),
        "a deterministic program given the same input was reported as differing: {ran:?}"
    );
}

#[test]
fn check_does_not_hang_on_a_program_that_leaves_a_background_child() {
    // A launcher that starts a long-lived helper (daemon, server) and exits. Without --check
    // kreplay returns as soon as the program exits; with --check it must too.
    let dir = scratch("check-bg");
    let body = format!("{WRITE_RECORD}sleep 60 &\necho launched\n");
    let plain = check_run(&dir, &body, &[], None, 30);
    assert!(
        !plain.timed_out && plain.elapsed < Duration::from_secs(10),
        "without --check: {plain:?}"
    );
    let ran = check_run(&dir, &body, &["--check"], None, 20);
    assert!(
        !ran.timed_out && ran.elapsed < Duration::from_secs(10),
        "kreplay run --check waits for every holder of the program's stdout pipe, not for the \
         program: {ran:?}"
    );
}

#[test]
fn check_fails_when_the_program_fails_only_without_kreplay() {
    // Same standard output, exit 0 under kreplay, exit 3 without it: the two runs did not agree,
    // yet the check says they are the same and the command exits 0.
    let dir = scratch("check-status");
    let body = format!(
        "{WRITE_RECORD}echo checksum 42\nif [ -n \"$HSA_TOOLS_LIB\" ]; then exit 0; else exit 3; fi\n"
    );
    let ran = check_run(&dir, &body, &["--check"], None, 30);
    assert!(!ran.timed_out, "{ran:?}");
    assert_ne!(
        ran.code,
        Some(0),
        "the runs with and without kreplay ended differently: {ran:?}"
    );
}

#[test]
fn check_names_the_differing_line_when_the_output_has_a_non_utf8_byte() {
    // A program printing a binary header line then results: the results differ on line 2.
    let dir = scratch("check-binary");
    let body = format!(
        "{WRITE_RECORD}printf '\\377\\376 header\\n'\nif [ -n \"$HSA_TOOLS_LIB\" ]; then echo 'sum 1'; else echo 'sum 2'; fi\n"
    );
    let ran = check_run(&dir, &body, &["--check"], None, 30);
    assert!(!ran.timed_out, "{ran:?}");
    assert_eq!(ran.code, Some(1), "{ran:?}");
    assert!(
        ran.stderr.contains("line 2")
            && ran.stderr.contains("sum 1")
            && ran.stderr.contains("sum 2"),
        "the difference is not reported line by line for output with one non-UTF-8 byte: {ran:?}"
    );
}

// ---- behaviour that is correct (kept as controls) ----

#[test]
fn crash_under_kreplay_with_same_output_fails() {
    let dir = scratch("check-crash");
    let body = format!(
        "{WRITE_RECORD}echo checksum 42\nif [ -n \"$HSA_TOOLS_LIB\" ]; then kill -SEGV $$; fi\n"
    );
    let ran = check_run(&dir, &body, &["--check"], None, 30);
    assert!(!ran.timed_out, "{ran:?}");
    assert_eq!(ran.code, Some(1), "{ran:?}");
}

#[test]
fn no_trailing_newline_difference_fails() {
    let dir = scratch("check-eol");
    let body = format!(
        "{WRITE_RECORD}if [ -n \"$HSA_TOOLS_LIB\" ]; then printf 'a\\nb'; else printf 'a\\nb\\n'; fi\n"
    );
    let ran = check_run(&dir, &body, &["--check"], None, 30);
    assert_eq!(ran.code, Some(1), "{ran:?}");
}

#[test]
fn huge_identical_output_and_child_output_pass() {
    let dir = scratch("check-huge");
    let body = format!(
        "{WRITE_RECORD}head -c 67108864 /dev/zero | tr '\\0' 'x'\necho\nsh -c 'echo from child'\n"
    );
    let ran = check_run(&dir, &body, &["--check"], None, 120);
    assert!(!ran.timed_out, "{:?}", ran.code);
    assert_eq!(ran.code, Some(0), "{}", ran.stderr);
    assert!(ran.stdout.contains("from child\n"));
    assert!(
        ran.stdout
            .contains("check: the standard output is the same")
    );
}

#[test]
fn check_of_a_large_output_that_differs_everywhere_fits_in_the_memory_of_the_two_outputs() {
    // A program that prints a long log with a timing on every line: both outputs are held
    // (60 MiB each here), but comparing them must not cost many times that again (a string per
    // line of each, an index per differing line), which ran kreplay out of memory after both
    // runs, without a verdict. 768 MiB of data is room for the two outputs and their buffers'
    // growth several times over.
    let dir = scratch("check-large-diff");
    let body = format!(
        "{WRITE_RECORD}if [ -n \"$KREPLAY_RECORD_DIR\" ]; then seq 1 8000000; \
         else seq 2 8000001; fi\n"
    );
    let app = script(&dir, "app.sh", &body);
    let lib = dir.join("libkreplay.so");
    std::fs::write(&lib, b"not loaded by the script").unwrap();
    let args = [
        "run",
        "--backend",
        "hsa",
        "--library",
        lib.to_str().unwrap(),
        "--check",
        "--",
        app.to_str().unwrap(),
    ];
    let a: Vec<&OsStr> = args.iter().map(OsStr::new).collect();
    let mut c = command(&a, &[]);
    // SAFETY: setrlimit is async-signal-safe; the closure touches nothing else.
    unsafe {
        use std::os::unix::process::CommandExt;
        c.pre_exec(|| {
            let limit = libc::rlimit {
                rlim_cur: 768 << 20,
                rlim_max: 768 << 20,
            };
            if libc::setrlimit(libc::RLIMIT_DATA, &limit) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let ran = run(c, None, Duration::from_secs(240));
    assert!(!ran.timed_out, "{:?} {}", ran.code, ran.stderr);
    assert_eq!(ran.code, Some(1), "{}", ran.stderr);
    assert!(
        ran.stderr.contains(
            "standard output differs: 8000000 line(s) with kreplay, 8000000 without, \
             8000000 line(s) differ"
        ) && ran
            .stderr
            .contains("line 5:\n    with kreplay:    5\n    without kreplay: 6")
            && ran.stderr.contains("... and 7999995 more"),
        "{}",
        ran.stderr
    );
}

#[test]
fn check_with_a_large_file_as_input_gives_it_to_both_runs_without_holding_it_in_memory() {
    // `kreplay run --check -- ./infer < dataset.bin`: a file as standard input can be read
    // again by the second run from where the first started; keeping every byte the first read
    // (to hand it to the second) ran kreplay out of memory for an input larger than it has.
    // 256 MiB of data for kreplay, a 320 MiB input (a sparse file: no disk used).
    let dir = scratch("check-file-input");
    let input = dir.join("input.bin");
    std::fs::File::create(&input)
        .unwrap()
        .set_len(320 << 20)
        .unwrap();
    let body = format!("{WRITE_RECORD}wc -c\n");
    let app = script(&dir, "app.sh", &body);
    let lib = dir.join("libkreplay.so");
    std::fs::write(&lib, b"not loaded by the script").unwrap();
    let args = [
        "run",
        "--backend",
        "hsa",
        "--library",
        lib.to_str().unwrap(),
        "--check",
        "--",
        app.to_str().unwrap(),
    ];
    let a: Vec<&OsStr> = args.iter().map(OsStr::new).collect();
    let mut c = command(&a, &[]);
    let file = std::fs::File::open(&input).unwrap();
    c.stdin(file);
    // SAFETY: setrlimit is async-signal-safe; the closure touches nothing else.
    unsafe {
        use std::os::unix::process::CommandExt;
        c.pre_exec(|| {
            let limit = libc::rlimit {
                rlim_cur: 256 << 20,
                rlim_max: 256 << 20,
            };
            if libc::setrlimit(libc::RLIMIT_DATA, &limit) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    c.stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let child = c.spawn().unwrap();
    let group = child.id() as i32;
    let (done, finished) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = done.send(child.wait_with_output());
    });
    let Ok(out) = finished.recv_timeout(Duration::from_secs(120)) else {
        // SAFETY: the process group of the kreplay this test started.
        unsafe { libc::kill(-group, libc::SIGKILL) };
        panic!("kreplay run --check with a file as input did not end");
    };
    let out = out.unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");
    assert!(
        stdout.starts_with(&format!("{}\n", 320u64 << 20))
            && stdout.contains("check: the standard output is the same"),
        "{stdout}\n{stderr}"
    );
    let _ = std::fs::remove_file(&input);
}

#[test]
fn check_in_a_loop_reading_a_file_leaves_the_rest_of_the_file_to_the_loop() {
    // `while read f; do kreplay run --check -- ./app "$f"; done < list.txt`: the loop's file is
    // kreplay's standard input. A program that reads none of it must leave it where it was, as
    // without kreplay; reading it ahead (to give the second run the same input) took the
    // lines the loop had not read yet.
    let dir = scratch("check-loop-file");
    let list = dir.join("list.txt");
    std::fs::write(&list, "a\nb\nc\n").unwrap();
    let app = script(&dir, "app.sh", &format!("{WRITE_RECORD}echo item \"$1\"\n"));
    let lib = dir.join("libkreplay.so");
    std::fs::write(&lib, b"not loaded by the script").unwrap();
    let loop_script = script(
        &dir,
        "loop.sh",
        &format!(
            "while read f; do '{k}' run --backend hsa --library '{lib}' --check -- '{app}' \"$f\" \
             >/dev/null 2>&1 || echo failed; echo done \"$f\"; done < '{list}'\n",
            k = kreplay_exe(),
            lib = lib.display(),
            app = app.display(),
            list = list.display()
        ),
    );
    let mut c = std::process::Command::new(&loop_script);
    for (name, _) in std::env::vars_os() {
        if name.to_string_lossy().starts_with("KREPLAY_") {
            c.env_remove(name);
        }
    }
    std::os::unix::process::CommandExt::process_group(&mut c, 0);
    let ran = run(c, None, Duration::from_secs(60));
    assert_eq!(
        ran.stdout, "done a\ndone b\ndone c\n",
        "the loop lost lines to kreplay run --check: {ran:?}"
    );
}

#[test]
fn check_with_a_named_pipe_as_input_whose_writer_is_gone_runs() {
    // `kreplay run --check -- ./app < fifo`, the FIFO's writer already done: its input is
    // passed on and kept as any pipe's; opening the FIFO again (as a file given as input is)
    // would wait for a writer that never comes.
    let dir = scratch("check-fifo-input");
    let fifo = dir.join("in.fifo");
    let path = std::ffi::CString::new(fifo.as_os_str().as_bytes()).unwrap();
    // SAFETY: a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(path.as_ptr(), 0o600) }, 0);
    let writer = {
        let fifo = fifo.clone();
        std::thread::spawn(move || std::fs::write(fifo, b"line\n"))
    };
    // Opening the read end waits for the writer, which writes and closes.
    let input = std::fs::File::open(&fifo).unwrap();
    writer.join().unwrap().unwrap();
    let app = script(&dir, "app.sh", &format!("{WRITE_RECORD}cat\n"));
    let lib = dir.join("libkreplay.so");
    std::fs::write(&lib, b"not loaded by the script").unwrap();
    let args = [
        "run",
        "--backend",
        "hsa",
        "--library",
        lib.to_str().unwrap(),
        "--check",
        "--",
        app.to_str().unwrap(),
    ];
    let a: Vec<&OsStr> = args.iter().map(OsStr::new).collect();
    let mut c = command(&a, &[]);
    c.stdin(input)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let child = c.spawn().unwrap();
    drop(c);
    let group = child.id() as i32;
    let (done, finished) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = done.send(child.wait_with_output());
    });
    let Ok(out) = finished.recv_timeout(Duration::from_secs(20)) else {
        // SAFETY: the process group of the kreplay this test started.
        unsafe { libc::kill(-group, libc::SIGKILL) };
        panic!("kreplay run waited for a writer of its input that never comes");
    };
    let out = out.unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");
    assert!(stdout.starts_with("line\n"), "{stdout}\n{stderr}");
}

/// What the kernel says process `pid` waits in (empty when it cannot be read).
fn waiting_in(pid: i32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/wchan")).unwrap_or_default()
}

/// Waits (up to 10 s) until process `pid` waits for the other end of a FIFO to be opened.
fn wait_for_fifo_open(pid: i32) -> bool {
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(10) {
        if waiting_in(pid) == "wait_for_partner" {
            return true;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    false
}

#[test]
fn check_interrupted_between_its_two_runs_does_not_start_the_second() {
    // A job runner stopping `kreplay run --check` once the program's first run has ended,
    // while kreplay writes what it recorded: the run without kreplay must not start (it would
    // run to its end, ignoring the interruption, and on a long program that is as long as the
    // first). The -o file is a FIFO here, so that kreplay waits in a known place for the
    // signal.
    let dir = scratch("check-interrupted-between");
    let fifo = dir.join("k.json");
    let path = std::ffi::CString::new(fifo.as_os_str().as_bytes()).unwrap();
    // SAFETY: a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(path.as_ptr(), 0o600) }, 0);
    let started = dir.join("plain-started");
    let app = script(
        &dir,
        "app.sh",
        &format!(
            "if [ -z \"$KREPLAY_RECORD_DIR\" ]; then echo > '{}'; fi\n{WRITE_RECORD}",
            started.display()
        ),
    );
    let lib = dir.join("libkreplay.so");
    std::fs::write(&lib, b"not loaded by the script").unwrap();
    let args = [
        "run",
        "--backend",
        "hsa",
        "--library",
        lib.to_str().unwrap(),
        "--check",
        "-o",
        fifo.to_str().unwrap(),
        "--",
        app.to_str().unwrap(),
    ];
    let a: Vec<&OsStr> = args.iter().map(OsStr::new).collect();
    let mut c = command(&a, &[]);
    c.stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped());
    let mut child = c.spawn().unwrap();
    let pid = child.id() as i32;
    let kill_all = || {
        // SAFETY: the process group of the kreplay this test started.
        unsafe { libc::kill(-pid, libc::SIGKILL) };
    };
    let drain = |fifo: &Path| std::fs::read_to_string(fifo).unwrap_or_default();
    // kreplay only asks whether it may write the file before the program starts (it does not
    // open it then), so the first open is kreplay writing what the first run recorded.
    let waits = wait_for_fifo_open(pid);
    if !waits {
        let seen = waiting_in(pid);
        let ended = child.try_wait().unwrap();
        kill_all();
        let _ = child.wait();
        let mut stderr = String::new();
        let _ = std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr);
        assert!(
            ended.is_none(),
            "kreplay ended without writing its -o file: {ended:?} {stderr}"
        );
        if seen.is_empty() || seen == "0" {
            eprintln!("skipped: where a process waits cannot be read ({seen:?})");
            return;
        }
        panic!("kreplay never opened its -o FIFO (waiting in {seen:?}): {stderr}");
    }
    // SAFETY: the kreplay process this test started.
    unsafe { libc::kill(pid, libc::SIGTERM) };
    let written = drain(&fifo);
    let t = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break Some(status);
        }
        if t.elapsed() > Duration::from_secs(20) {
            break None;
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    kill_all();
    let _ = child.wait();
    let mut stderr = String::new();
    let _ = std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr);
    assert!(status.is_some(), "{stderr}");
    assert!(written.contains("\"kernel\": \"k\""), "{written:?}");
    assert!(
        !started.exists(),
        "the run without kreplay started after the interruption: {stderr}"
    );
    assert_eq!(status.unwrap().code(), Some(1), "{stderr}");
    assert!(stderr.contains("interrupted"), "{stderr}");
}

#[test]
fn program_that_closes_stdout_early_passes() {
    let dir = scratch("check-close");
    let body = format!("{WRITE_RECORD}echo first\nexec 1>&-\necho lost 2>/dev/null\nexit 0\n");
    let ran = check_run(&dir, &body, &["--check"], None, 30);
    assert!(!ran.timed_out, "{ran:?}");
    assert_eq!(ran.code, Some(0), "{ran:?}");
}

#[test]
fn stderr_only_difference_is_not_compared() {
    let dir = scratch("check-stderr");
    let body = format!(
        "{WRITE_RECORD}echo same\nif [ -n \"$HSA_TOOLS_LIB\" ]; then echo A >&2; else echo B >&2; fi\n"
    );
    let ran = check_run(&dir, &body, &["--check"], None, 30);
    assert_eq!(ran.code, Some(0), "README: stdout only: {ran:?}");
}

// ---- process ----

fn record_dirs(tmp: &Path) -> Vec<String> {
    std::fs::read_dir(tmp)
        .unwrap()
        .filter_map(Result::ok)
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("kreplay-run-"))
        .collect()
}

fn alive(pid: i32) -> bool {
    // SAFETY: signal 0 only checks for existence.
    unsafe { libc::kill(pid, 0) == 0 }
}

fn wait_for_file(p: &Path) -> String {
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(10) {
        if let Ok(s) = std::fs::read_to_string(p)
            && s.ends_with('\n')
        {
            return s;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("{} never written", p.display());
}

/// Starts `kreplay run` on a program that records its pid and sleeps; returns (kreplay child,
/// program pid, TMPDIR).
fn start_sleeper(name: &str) -> (std::process::Child, i32, std::path::PathBuf) {
    let dir = scratch(name);
    let tmp = dir.join("tmp");
    std::fs::create_dir_all(&tmp).unwrap();
    let pidfile = dir.join("pid");
    let app = script(
        &dir,
        "app.sh",
        &format!("echo $$ > '{}'\nexec sleep 30\n", pidfile.display()),
    );
    let lib = dir.join("libkreplay.so");
    std::fs::write(&lib, b"x").unwrap();
    let args = [
        "run",
        "--backend",
        "hsa",
        "--library",
        lib.to_str().unwrap(),
        "--",
        app.to_str().unwrap(),
    ];
    let a: Vec<&std::ffi::OsStr> = args.iter().map(std::ffi::OsStr::new).collect();
    let mut c = command(&a, &[("TMPDIR", tmp.as_os_str())]);
    c.stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    let child = c.spawn().unwrap();
    let pid: i32 = wait_for_file(&pidfile).trim().parse().unwrap();
    (child, pid, tmp)
}

#[test]
fn interrupting_kreplay_run_still_reports_what_the_program_recorded() {
    // Profiling a long run and stopping it with Ctrl-C: the program ends cleanly (its record
    // is written), and what it recorded until then must be shown and written, not thrown away.
    let dir = scratch("interrupt-report");
    let pidfile = dir.join("pid");
    let app = script(
        &dir,
        "app.sh",
        &format!(
            "{WRITE_RECORD}trap 'kill $sleeper; exit 130' INT\n\
             sleep 30 &\nsleeper=$!\necho $$ > '{pid}'\nwait $sleeper\n",
            pid = pidfile.display()
        ),
    );
    let lib = dir.join("libkreplay.so");
    std::fs::write(&lib, b"not loaded by the script").unwrap();
    let json = dir.join("k.json");
    let args = [
        "run",
        "--backend",
        "hsa",
        "--library",
        lib.to_str().unwrap(),
        "-o",
        json.to_str().unwrap(),
        "--",
        app.to_str().unwrap(),
    ];
    let a: Vec<&OsStr> = args.iter().map(OsStr::new).collect();
    let mut c = command(&a, &[]);
    c.stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let mut child = c.spawn().unwrap();
    wait_for_file(&pidfile);
    // SAFETY: the kreplay process this test started.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let (status, stdout, stderr) = {
        use std::io::Read;
        let mut out = String::new();
        let mut err = String::new();
        let _ = child.stdout.take().unwrap().read_to_string(&mut out);
        let _ = child.stderr.take().unwrap().read_to_string(&mut err);
        (child.wait().unwrap(), out, err)
    };
    assert_eq!(status.code(), Some(1), "{stdout}\n{stderr}");
    assert!(stderr.contains("interrupted"), "{stderr}");
    assert!(
        stdout.contains("1 kernel(s), 1 launch(es) on hsa"),
        "the table of what was recorded is missing: {stdout}\n{stderr}"
    );
    let written = std::fs::read_to_string(&json).unwrap_or_default();
    assert!(written.contains("\"kernel\": \"k\""), "-o: {written:?}");
}

#[test]
fn interrupting_kreplay_run_leaves_no_record_folder_behind() {
    // Ctrl-C in a terminal: SIGINT to the whole foreground process group.
    let (mut child, pid, tmp) = start_sleeper("sigint");
    assert_eq!(
        record_dirs(&tmp).len(),
        1,
        "the run's record folder exists while it runs"
    );
    // SAFETY: the group this test created.
    unsafe { libc::kill(-(child.id() as i32), libc::SIGINT) };
    let _ = child.wait();
    std::thread::sleep(Duration::from_millis(200));
    let left = record_dirs(&tmp);
    // SAFETY: kills the process group of the kreplay this test started.
    unsafe { libc::kill(-(child.id() as i32), libc::SIGKILL) };
    let _ = pid;
    assert!(left.is_empty(), "left in TMPDIR after Ctrl-C: {left:?}");
}

#[test]
fn terminating_kreplay_run_does_not_leave_the_program_running() {
    // A job runner stopping the command (SIGTERM to kreplay's pid, as `kill PID`, Python's
    // Popen.terminate(), systemd's main-process kill do).
    let (mut child, pid, tmp) = start_sleeper("sigterm");
    // SAFETY: the kreplay process this test started.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let _ = child.wait();
    // kreplay waits for the program before it exits: by now the program has ended.
    let orphan = alive(pid);
    let left = record_dirs(&tmp);
    // SAFETY: kills the process group of the kreplay this test started.
    unsafe { libc::kill(-(child.id() as i32), libc::SIGKILL) };
    assert!(
        !orphan && left.is_empty(),
        "after SIGTERM to kreplay: program still running = {orphan}, record folders left = {left:?}"
    );
}

#[test]
fn terminating_kreplay_run_ends_what_a_launcher_left_running_too() {
    // `kreplay run -- ./train.sh`, the script running its worker without exec: SIGTERM passed
    // on to the script ends the script, not its worker, which kreplay adopted. Stopping the
    // command must not leave the worker running on the GPU.
    let dir = scratch("sigterm-launcher");
    let workerfile = dir.join("worker");
    let app = script(
        &dir,
        "launch.sh",
        &format!("sleep 30 &\necho $! > '{}'\nwait\n", workerfile.display()),
    );
    let lib = dir.join("libkreplay.so");
    std::fs::write(&lib, b"x").unwrap();
    let args = [
        "run",
        "--backend",
        "hsa",
        "--library",
        lib.to_str().unwrap(),
        "--",
        app.to_str().unwrap(),
    ];
    let a: Vec<&OsStr> = args.iter().map(OsStr::new).collect();
    let mut c = command(&a, &[]);
    c.stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    let mut child = c.spawn().unwrap();
    let worker: i32 = wait_for_file(&workerfile).trim().parse().unwrap();
    // SAFETY: the kreplay process this test started.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let _ = child.wait();
    let left = alive(worker);
    // SAFETY: the process group of the kreplay this test started, and its worker.
    unsafe {
        libc::kill(-(child.id() as i32), libc::SIGKILL);
        libc::kill(worker, libc::SIGKILL);
    }
    assert!(
        !left,
        "after SIGTERM to kreplay, the launcher's worker is still running"
    );
}

#[test]
fn a_signal_ignored_when_kreplay_run_starts_stays_ignored_for_the_program() {
    // `nohup kreplay run -- ./train.sh &` ignores SIGHUP, and a shell script's background job
    // ignores SIGINT: the program inherits that, as it would without kreplay, and survives the
    // hangup (here, the signals it sends itself) instead of dying of it.
    let dir = scratch("ignored-signals");
    let app = script(
        &dir,
        "app.sh",
        &format!("kill -HUP $$\nkill -INT $$\nkill -TERM $$\necho survived\n{WRITE_RECORD}"),
    );
    let lib = dir.join("libkreplay.so");
    std::fs::write(&lib, b"not loaded by the script").unwrap();
    let args = [
        "run",
        "--backend",
        "hsa",
        "--library",
        lib.to_str().unwrap(),
        "--",
        app.to_str().unwrap(),
    ];
    let a: Vec<&OsStr> = args.iter().map(OsStr::new).collect();
    let mut c = command(&a, &[]);
    // SAFETY: signal is async-signal-safe; the closure touches nothing else.
    unsafe {
        use std::os::unix::process::CommandExt;
        c.pre_exec(|| {
            for signal in [libc::SIGHUP, libc::SIGINT, libc::SIGTERM] {
                libc::signal(signal, libc::SIG_IGN);
            }
            Ok(())
        });
    }
    let ran = run(c, None, Duration::from_secs(30));
    assert!(
        ran.code == Some(0) && ran.stdout.contains("survived"),
        "the program died of a signal it was started ignoring: {ran:?}"
    );
}

#[test]
fn processes_the_program_orphans_are_reaped_while_it_runs() {
    // A long run whose program starts helpers through a shell that exits at once
    // (`os.system("cmd &")`): kreplay adopts them, and each one that ended stayed a zombie,
    // holding its process id, until the program ended; in a container with a process limit the
    // program's own forks fail once enough have piled up. Once its shells returned, every
    // helper is kreplay's child, running or ended; the program waits (up to 10 s) until kreplay
    // has no child left but itself and kreplay's own (named kreplay), and reports how many
    // are left.
    let dir = scratch("orphans-reaped");
    let ran = check_run(&dir, &orphans_body(""), &[], None, 60);
    assert!(!ran.timed_out, "{ran:?}");
    assert!(
        ran.code == Some(0) && ran.stdout.contains("orphans left 0\n"),
        "orphans that ended are left unreaped while the program runs: {ran:?}"
    );
}

/// A program that runs `first`, starts 40 helpers through shells that exit at once, waits (up
/// to 10 s) until kreplay has no child left but the program and kreplay's own (named
/// kreplay), and prints `orphans left N`.
fn orphans_body(first: &str) -> String {
    format!(
        "{first}\ni=0\nwhile [ $i -lt 40 ]; do sh -c 'sleep 0 & exit 0'; i=$((i+1)); done\n\
         left() {{ cat /proc/[0-9]*/stat 2>/dev/null | awk -v p=$PPID -v me=$$ \
         '$4 == p && $1 != me && $2 != \"(kreplay)\"' | wc -l; }}\n\
         n=0\nwhile [ $n -lt 200 ]; do z=$(left); [ \"$z\" -eq 0 ] && break; sleep 0.05; \
         n=$((n+1)); done\n\
         echo orphans left $z\n{WRITE_RECORD}"
    )
}

#[test]
fn orphans_are_still_reaped_after_kreplays_own_helper_process_ended() {
    // kreplay run's own child that tells signals sent to its process group apart ends early
    // (killed by someone): it stays unreaped until the run ends, and must not stop the
    // program's orphans from being reaped meanwhile.
    let dir = scratch("orphans-reaped-witness-gone");
    let kill_it = "w=$(cat /proc/[0-9]*/stat 2>/dev/null | awk -v p=$PPID \
                   '$4 == p && $2 == \"(kreplay)\" {print $1}')\n\
                   [ -n \"$w\" ] && kill -KILL $w";
    let ran = check_run(&dir, &orphans_body(kill_it), &[], None, 60);
    assert!(!ran.timed_out, "{ran:?}");
    assert!(
        ran.code == Some(0) && ran.stdout.contains("orphans left 0\n"),
        "orphans that ended are left unreaped while the program runs: {ran:?}"
    );
}

#[test]
fn a_program_started_with_sigchld_ignored_is_waited_for_and_inherits_the_ignore() {
    // A parent that ignores SIGCHLD (some services and job runners do) passes that on: the
    // kernel then reaps kreplay's children itself, and kreplay lost the program ("No child
    // processes"), its record and the table, as soon as it ended. The program must still run
    // as it would without kreplay, SIGCHLD ignored.
    let dir = scratch("sigchld-ignored");
    let record = WRITE_RECORD
        .lines()
        .find(|l| l.starts_with('{'))
        .unwrap()
        .replace('"', "\\\"");
    let program = dir.join("prog.awk");
    std::fs::write(
        &program,
        format!(
            "BEGIN {{\n\
             while ((getline line < \"/proc/self/status\") > 0) if (line ~ /^SigIgn/) print line\n\
             dir = ENVIRON[\"KREPLAY_RECORD_DIR\"]\n\
             if (dir != \"\") {{ f = dir \"/kreplay-record-1.json\"; print \"{record}\" > f; close(f) }}\n\
             }}\n"
        ),
    )
    .unwrap();
    let lib = dir.join("libkreplay.so");
    std::fs::write(&lib, b"not loaded by the program").unwrap();
    let args: Vec<&OsStr> = ["run", "--backend", "hsa", "--library"]
        .iter()
        .map(OsStr::new)
        .chain([lib.as_os_str()])
        .chain(["--", "awk", "-f"].map(OsStr::new))
        .chain([program.as_os_str()])
        .collect();
    let mut c = command(&args, &[]);
    // SAFETY: signal is async-signal-safe; the closure touches nothing else.
    unsafe {
        use std::os::unix::process::CommandExt;
        c.pre_exec(|| {
            libc::signal(libc::SIGCHLD, libc::SIG_IGN);
            Ok(())
        });
    }
    let ran = run(c, None, Duration::from_secs(30));
    assert!(
        ran.code == Some(0) && ran.stdout.contains("1 kernel(s), 1 launch(es) on hsa"),
        "{ran:?}"
    );
    let ignored = ran
        .stdout
        .lines()
        .find_map(|l| l.strip_prefix("SigIgn:"))
        .and_then(|mask| u64::from_str_radix(mask.trim(), 16).ok())
        .expect("the program printed its ignored signals");
    assert!(
        ignored & (1 << (libc::SIGCHLD - 1)) != 0,
        "the program no longer ignores SIGCHLD: {ran:?}"
    );
}

#[test]
fn the_output_file_is_written_even_when_standard_output_is_gone() {
    // `kreplay run -o k.json -- ./train.sh` in an ssh session that dropped (the terminal is
    // gone) or piped into a reader that ended: the table cannot be shown, but the file asked
    // for must still be written, not lost with it.
    let dir = scratch("output-without-stdout");
    let app = script(&dir, "app.sh", WRITE_RECORD);
    let lib = dir.join("libkreplay.so");
    std::fs::write(&lib, b"not loaded by the script").unwrap();
    for check in [None, Some("--check")] {
        let json = dir.join("k.json");
        let _ = std::fs::remove_file(&json);
        let args: Vec<&str> = [
            "run",
            "--backend",
            "hsa",
            "--library",
            lib.to_str().unwrap(),
            "-o",
            json.to_str().unwrap(),
        ]
        .into_iter()
        .chain(check)
        .chain(["--", app.to_str().unwrap()])
        .collect();
        let a: Vec<&OsStr> = args.iter().map(OsStr::new).collect();
        let mut c = command(&a, &[]);
        let (reader, writer) = std::io::pipe().unwrap();
        drop(reader);
        c.stdout(writer).stderr(std::process::Stdio::piped());
        let child = c.spawn().unwrap();
        drop(c);
        let group = child.id() as i32;
        let (done, finished) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = done.send(child.wait_with_output());
        });
        let Ok(out) = finished.recv_timeout(Duration::from_secs(30)) else {
            // SAFETY: the process group of the kreplay this test started.
            unsafe { libc::kill(-group, libc::SIGKILL) };
            panic!("kreplay run did not end");
        };
        let out = out.unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{stderr}");
        assert!(stderr.contains("cannot write the output"), "{stderr}");
        let written = std::fs::read_to_string(&json).unwrap_or_default();
        assert!(
            written.contains("\"kernel\": \"k\""),
            "-o was not written ({check:?}): {written:?}\n{stderr}"
        );
    }
}

#[test]
fn a_program_that_signals_its_own_process_group_does_not_interrupt_kreplay_run() {
    // A launcher that ends its helpers with `kill 0` (or os.killpg(0, SIGTERM)), itself
    // protected from it: without kreplay the signal stays in the program's own process group.
    // Under kreplay run the program shares kreplay's group, and the signal reached kreplay as
    // well, which took it for an interruption and failed a run that succeeded. (A process the
    // program started is recognized too while it lives, which one that sends and exits at
    // once may no longer do when the signal is handled: not asserted here.)
    let dir = scratch("own-group-signal");
    let body = format!(
        "sleep 30 &\ntrap '' TERM HUP\nkill -TERM 0\nkill -HUP 0\nwait\n{WRITE_RECORD}exit 0\n"
    );
    let ran = check_run(&dir, &body, &[], None, 30);
    assert!(!ran.timed_out, "the helper was not ended: {ran:?}");
    assert_eq!(ran.code, Some(0), "{ran:?}");
    assert!(!ran.stderr.contains("interrupted"), "{ran:?}");
}

#[test]
fn a_program_that_sends_user_signals_to_its_own_process_group_is_still_profiled() {
    // A launcher that notifies its workers with SIGUSR1 or SIGUSR2 sent to its process group
    // (handling the signal itself): under kreplay run the group is kreplay's, whose default
    // action for both is to end: kreplay died without a word, the run record and the table
    // lost, the program left running.
    let dir = scratch("own-group-user-signals");
    let body = format!(
        "trap 'echo usr1' USR1\ntrap 'echo usr2' USR2\nkill -USR1 0\nkill -USR2 0\n\
         {WRITE_RECORD}exit 0\n"
    );
    let ran = check_run(&dir, &body, &[], None, 30);
    assert!(!ran.timed_out, "{ran:?}");
    assert_eq!(ran.code, Some(0), "{ran:?}");
    assert!(
        ran.stdout.starts_with("usr1\nusr2\n") && ran.stdout.contains("1 kernel(s)"),
        "each signal reached the program once, and the run was reported: {ran:?}"
    );
}

#[test]
fn a_user_signal_sent_to_kreplay_run_alone_is_passed_on_to_the_program() {
    // A job runner warning of the end of its time limit with SIGUSR1 to the process it
    // started, kreplay: the program must get it (to checkpoint), and kreplay must not die.
    let dir = scratch("user-signal-to-kreplay");
    let body = format!(
        "got=0\ntrap 'got=1' USR1\nkill -USR1 $PPID\n\
         while [ $got = 0 ]; do sleep 0.02; done\necho passed on\n{WRITE_RECORD}exit 0\n"
    );
    let ran = check_run(&dir, &body, &[], None, 20);
    assert!(!ran.timed_out, "the program never got it: {ran:?}");
    assert_eq!(ran.code, Some(0), "{ran:?}");
    assert!(
        ran.stdout.starts_with("passed on\n") && ran.stdout.contains("1 kernel(s)"),
        "{ran:?}"
    );
}

#[test]
fn a_program_that_makes_itself_a_group_leader_can_read_the_terminal() {
    // Started by a job-control shell, a program leads its own process group already, so making
    // itself a group leader (setpgid(0, 0), as daemons' helpers and some launchers do) changes
    // nothing, and it reads its terminal. Under kreplay run it left kreplay's group, which holds
    // the terminal, and the kernel stopped it at its first read (SIGTTIN): kreplay run waited
    // for good, saying nothing. The terminal is a pseudo-terminal from `script`.
    let dir = scratch("own-group-terminal");
    if std::process::Command::new("script")
        .arg("--version")
        .output()
        .is_err()
    {
        eprintln!("skipped: no `script` to give kreplay a terminal");
        return;
    }
    let source = dir.join("reader.c");
    std::fs::write(
        &source,
        "#include <stdio.h>\n#include <unistd.h>\nint main(void) {\n  char line[64];\n  \
         setpgid(0, 0);\n  if (!fgets(line, sizeof line, stdin)) return 3;\n  \
         printf(\"read: %s\", line);\n  return 0;\n}\n",
    )
    .unwrap();
    let reader = dir.join("reader");
    let built = std::process::Command::new("cc")
        .arg(&source)
        .arg("-o")
        .arg(&reader)
        .status()
        .is_ok_and(|s| s.success());
    assert!(built, "this test needs `cc`");
    let lib = dir.join("libkreplay.so");
    std::fs::write(&lib, b"not loaded by the program").unwrap();
    let line = format!(
        "'{}' run --backend hsa --library '{}' -- '{}'; echo kreplay-exit=$?",
        kreplay_exe(),
        lib.display(),
        reader.display()
    );
    let mut c = std::process::Command::new("script");
    c.args(["-qec", &line, "/dev/null"]);
    for (name, _) in std::env::vars_os() {
        if name.to_string_lossy().starts_with("KREPLAY_") {
            c.env_remove(name);
        }
    }
    {
        use std::os::unix::process::CommandExt;
        c.process_group(0);
    }
    let mut child = c
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let pgid = child.id() as i32;
    // Kept open until the end: `script` ends the session at the end of its input.
    let mut input = child.stdin.take().unwrap();
    std::io::Write::write_all(&mut input, b"hello\n").unwrap();
    let mut output = child.stdout.take().unwrap();
    let reading = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = std::io::Read::read_to_string(&mut output, &mut text);
        text
    });
    let started = Instant::now();
    let ended = loop {
        if child.try_wait().unwrap().is_some() {
            break true;
        }
        if started.elapsed() > Duration::from_secs(20) {
            break false;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    // SAFETY: the process group this test made for `script`.
    unsafe { libc::kill(-pgid, libc::SIGKILL) };
    let _ = child.wait();
    // kreplay and the program are in a session of their own below `script` (a stopped program
    // outlives its hangup): every process running from this test's folder is ended too.
    let mine = dir.to_string_lossy().into_owned();
    for entry in std::fs::read_dir("/proc").unwrap().filter_map(Result::ok) {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        if String::from_utf8_lossy(&cmdline).contains(&mine) && !ended {
            // SAFETY: a process started from this test's own scratch folder.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    }
    drop(input);
    let text = reading.join().unwrap();
    assert!(
        ended,
        "kreplay run waited for the stopped program: {text:?}"
    );
    assert!(text.contains("read: hello"), "{text:?}");
    // The program read its line; kreplay then found no record (the library is not loaded).
    assert!(text.contains("kreplay-exit=1"), "{text:?}");
}

#[test]
fn kreplay_run_ends_when_its_own_helper_process_was_stopped() {
    // kreplay run's own child in its process group stopped by someone (SIGSTOP to the group,
    // SIGCONT to the program only): the run must still end with the program.
    let dir = scratch("witness-stopped");
    let body = format!(
        "w=$(cat /proc/[0-9]*/stat 2>/dev/null | awk -v p=$PPID \
         '$4 == p && $2 == \"(kreplay)\" {{print $1}}')\n[ -n \"$w\" ] && kill -STOP $w\n\
         {WRITE_RECORD}"
    );
    let ran = check_run(&dir, &body, &[], None, 20);
    let stopped = ran.timed_out;
    assert!(
        !stopped,
        "kreplay run waited for its stopped helper: {ran:?}"
    );
    assert_eq!(ran.code, Some(0), "{ran:?}");
}

#[test]
fn sigquit_reaches_the_program_once_and_a_program_that_survives_it_is_still_profiled() {
    // Ctrl-\ (SIGQUIT to the terminal's process group) asks a JVM for a thread dump, a Go
    // program for its goroutines: a program may print and run on. kreplay run died of it
    // (with a core dump), leaving the program running unprofiled and its table lost. One sent
    // to the group reaches the program once; one sent to kreplay alone is passed on.
    let dir = scratch("sigquit");
    let (ready, quits) = (dir.join("ready"), dir.join("quits"));
    let app = script(
        &dir,
        "app.sh",
        &format!(
            "n=0\ntrap 'n=$((n+1)); echo quits $n > \"{q}\"' QUIT\necho > '{r}'\n\
             while [ $n -lt 2 ]; do sleep 0.02; done\necho quits $n\n{WRITE_RECORD}",
            q = quits.display(),
            r = ready.display()
        ),
    );
    let lib = dir.join("libkreplay.so");
    std::fs::write(&lib, b"not loaded by the script").unwrap();
    let args = [
        "run",
        "--backend",
        "hsa",
        "--library",
        lib.to_str().unwrap(),
        "--",
        app.to_str().unwrap(),
    ];
    let a: Vec<&OsStr> = args.iter().map(OsStr::new).collect();
    let mut c = command(&a, &[]);
    c.stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let child = c.spawn().unwrap();
    let pid = child.id() as i32;
    let (done, finished) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = done.send(child.wait_with_output());
    });
    wait_for_file(&ready);
    // SAFETY: the process group of the kreplay this test started.
    unsafe { libc::kill(-pid, libc::SIGQUIT) };
    let first = wait_for_file(&quits);
    // SAFETY: the kreplay process this test started (not reaped yet: the waiting thread
    // has not returned, or the assertion below fails first).
    unsafe { libc::kill(pid, libc::SIGQUIT) };
    let out = finished.recv_timeout(Duration::from_secs(10));
    // SAFETY: the process group of the kreplay this test started.
    unsafe { libc::kill(-pid, libc::SIGKILL) };
    assert_eq!(first, "quits 1\n");
    let out = out
        .expect("the program never got the second SIGQUIT")
        .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");
    assert!(
        stdout.starts_with("quits 2\n") && stdout.contains("1 kernel(s), 1 launch(es) on hsa"),
        "{stdout}\n{stderr}"
    );
}

/// `kreplay run --backend hsa --library … [extra] -o k.json -- launcher`, with the JSON record.
fn run_launcher(dir: &Path, launcher: &Path, extra: &[&str]) -> (Ran, serde_json::Value) {
    let lib = libkreplay();
    let json = dir.join("k.json");
    let mut args = vec!["run", "--backend", "hsa"];
    args.extend_from_slice(extra);
    args.extend_from_slice(&[
        "--library",
        lib.to_str().unwrap(),
        "-o",
        json.to_str().unwrap(),
        "--",
        launcher.to_str().unwrap(),
    ]);
    let ran = kreplay(&args, &[], 60);
    let record = serde_json::from_str(&std::fs::read_to_string(&json).unwrap_or_default())
        .unwrap_or_default();
    (ran, record)
}

#[test]
fn a_worker_process_that_outlives_the_launcher_fails_the_run() {
    // A launcher that runs one worker in the foreground and one in the background, then exits:
    // the background worker's kernels cannot be in the table (they were silently missing). It
    // starts well after the moment kreplay gives processes left behind to end (2 s), and ends
    // on its own.
    let dir = scratch("outlive");
    let app = softhsa_app();
    let launcher = script(
        &dir,
        "launch.sh",
        &format!(
            "'{a}'\n( sleep 6; '{a}' ) >/dev/null 2>&1 &\nexit 0\n",
            a = app.display()
        ),
    );
    let (ran, record) = run_launcher(&dir, &launcher, &[]);
    assert_eq!(ran.code, Some(1), "{ran:?}");
    assert!(ran.stderr.contains("still running"), "{ran:?}");
    assert_eq!(
        record["processes"], 1,
        "the table holds the launcher's worker only"
    );
}

#[test]
fn a_worker_that_crashed_after_loading_kreplay_fails_the_run_though_the_launcher_succeeded() {
    // A launcher that ignores how its workers end: one worker crashes after its kernels ran,
    // before it could write its record. The table lacks its kernels; that must not pass as a
    // complete result.
    let dir = scratch("crashed-worker");
    let app = softhsa_app();
    let launcher = script(
        &dir,
        "launch.sh",
        &format!(
            "'{a}'\nSOFTHSA_APP_CRASH=1 '{a}'\nexit 0\n",
            a = app.display()
        ),
    );
    let (ran, record) = run_launcher(&dir, &launcher, &[]);
    assert!(!ran.timed_out, "{ran:?}");
    assert_eq!(
        ran.code,
        Some(1),
        "a process that loaded kreplay left no record, yet the run passed: {ran:?}"
    );
    assert!(ran.stderr.contains("without writing its record"), "{ran:?}");
    assert_eq!(
        record["processes"], 2,
        "both processes are counted: {record}"
    );
    assert_eq!(record["incomplete"], 1, "{record}");
    assert_eq!(record["kernels"][0]["launches"], 6, "{record}");
}

#[test]
fn a_helper_that_ends_shortly_after_the_program_does_not_fail_the_run() {
    // Python's multiprocessing (forkserver or spawn: the resource tracker, the fork server)
    // leaves helpers that end once the program's end closes their pipe, after cleaning up.
    // They are not workers left running, and the run must not fail because of them.
    let dir = scratch("helper-ends");
    let fifo = dir.join("pipe");
    let made = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    if !made {
        return;
    }
    let body = format!(
        "{WRITE_RECORD}( cat '{f}' > /dev/null; sleep 0.3 ) &\nexec 3> '{f}'\necho done\n",
        f = fifo.display()
    );
    for extra in [&[][..], &["--check"][..]] {
        let ran = check_run(&dir, &body, extra, None, 30);
        assert!(!ran.timed_out, "{ran:?}");
        assert_eq!(
            ran.code,
            Some(0),
            "{extra:?}: a helper ending 0.3 s after the program failed the run: {ran:?}"
        );
        assert!(!ran.stderr.contains("still running"), "{ran:?}");
    }
}

#[test]
fn a_runtime_started_again_where_kreplay_cannot_load_again_fails_the_run() {
    // A program that shuts the runtime down and starts it again: kreplay is loaded once per
    // process (a known limit), so the second session's kernels are not seen. The table then
    // lacks them, and must not pass for a complete one.
    let dir = scratch("two-sessions");
    let app = softhsa_app();
    let launcher = script(
        &dir,
        "again.sh",
        &format!("SOFTHSA_APP_SESSIONS=2 exec '{}'\n", app.display()),
    );
    let (ran, record) = run_launcher(&dir, &launcher, &[]);
    assert!(!ran.timed_out, "{ran:?}");
    assert_eq!(
        ran.stdout.matches("checksum buffer 2").count(),
        2,
        "both sessions ran: {ran:?}"
    );
    assert_eq!(
        ran.code,
        Some(1),
        "the second session's kernels are missing, yet the run passed: {ran:?}"
    );
    assert!(ran.stderr.contains("runtime again"), "{ran:?}");
    assert_eq!(record["sessions_unprofiled"], 1, "{record}");
}

#[test]
fn a_program_that_replaces_itself_after_loading_kreplay_is_not_reported_as_one_clean_run() {
    // exec keeps the process id: the new image's record must not overwrite, in silence, the
    // one the first image wrote when it loaded kreplay (whose kernels are lost: it never got to
    // its exit handlers).
    let dir = scratch("exec-again");
    let app = softhsa_app();
    let launcher = script(
        &dir,
        "again.sh",
        &format!("SOFTHSA_APP_EXEC_AGAIN=1 exec '{}'\n", app.display()),
    );
    let (ran, record) = run_launcher(&dir, &launcher, &[]);
    assert!(!ran.timed_out, "{ran:?}");
    assert_eq!(
        ran.stdout.matches("checksum buffer 2").count(),
        2,
        "both images ran: {ran:?}"
    );
    assert_eq!(
        ran.code,
        Some(1),
        "the first image's kernels are missing, yet the run passed: {ran:?}"
    );
    assert_eq!(
        (record["processes"].as_u64(), record["incomplete"].as_u64()),
        (Some(2), Some(1)),
        "{record}"
    );
}

// ---- controls ----

#[test]
fn two_sequential_processes_add_up() {
    let dir = scratch("two");
    let app = softhsa_app();
    let launcher = script(
        &dir,
        "two.sh",
        &format!("'{a}' && '{a}'\n", a = app.display()),
    );
    let (ran, v) = run_launcher(&dir, &launcher, &["--passes", "3"]);
    assert_eq!(ran.code, Some(0), "{ran:?}");
    assert_eq!(v["processes"], 2);
    assert_eq!(v["kernels"][0]["launches"], 12);
    assert_eq!(v["kernels"][0]["passes"], 36);
    assert!(
        ran.stdout.contains("12 launch(es) on hsa in 2 processes"),
        "{ran:?}"
    );
}

// ---- args ----

#[test]
fn a_library_path_that_is_not_utf8_is_accepted_like_the_program_path() {
    // Linux paths are bytes; the program and its arguments may be any bytes, and so may the
    // library (README: --library PATH).
    let dir = scratch("nonutf8-lib");
    let mut name = dir.clone().into_os_string().into_vec();
    name.extend_from_slice(b"/lib\xffkreplay.so");
    let lib = OsString::from_vec(name);
    std::fs::copy(libkreplay(), &lib).unwrap();
    let app = softhsa_app();
    let args: Vec<&OsStr> = vec![
        OsStr::new("run"),
        OsStr::new("--backend"),
        OsStr::new("hsa"),
        OsStr::new("--library"),
        &lib,
        OsStr::new("--"),
        app.as_os_str(),
    ];
    let ran = run(command(&args, &[]), None, Duration::from_secs(60));
    assert_eq!(
        ran.code,
        Some(0),
        "an existing library at a non-UTF-8 path is refused: {ran:?}"
    );
}

#[test]
fn an_output_path_that_is_not_utf8_is_accepted_or_named_in_the_error() {
    let dir = scratch("nonutf8-out");
    let mut name = dir.clone().into_os_string().into_vec();
    name.extend_from_slice(b"/k\xff.json");
    let out = OsString::from_vec(name);
    let app = softhsa_app();
    let lib = libkreplay();
    let args: Vec<&OsStr> = vec![
        OsStr::new("run"),
        OsStr::new("--backend"),
        OsStr::new("hsa"),
        OsStr::new("--library"),
        lib.as_os_str(),
        OsStr::new("-o"),
        &out,
        OsStr::new("--"),
        app.as_os_str(),
    ];
    let ran = run(command(&args, &[]), None, Duration::from_secs(60));
    assert!(
        ran.code == Some(0) || ran.stderr.contains("--output") || ran.stderr.contains("-o"),
        "the error does not say which argument it refuses: {ran:?}"
    );
    let _ = out.as_bytes();
}

#[test]
fn a_negative_pass_count_gets_the_range_error_not_a_misleading_tip() {
    let app = softhsa_app();
    let ran = kreplay(
        &["run", "--passes", "-1", "--", app.to_str().unwrap()],
        &[],
        30,
    );
    assert_eq!(ran.code, Some(2), "{ran:?}");
    assert!(
        !ran.stderr.contains("use '-- -1'"),
        "the tip would make -1 the PROGRAM: {ran:?}"
    );
    assert!(ran.stderr.contains("--passes"), "{ran:?}");
}

#[test]
fn a_library_in_a_folder_whose_name_has_spaces_or_quotes_is_loaded_on_rocm() {
    // ROCm's runtime splits HSA_TOOLS_LIB at spaces (a list of tool libraries), with `"` and
    // `\` as quoting: kreplay's library installed under "My Tools" must still be one library.
    let dir = scratch("lib-spaces");
    let folder = dir.join("My Tools \"v2\"");
    std::fs::create_dir_all(&folder).unwrap();
    let lib = folder.join("libkreplay.so");
    std::fs::copy(libkreplay(), &lib).unwrap();
    let app = softhsa_app();
    let ran = kreplay(
        &[
            "run",
            "--backend",
            "hsa",
            "--library",
            lib.to_str().unwrap(),
            "--",
            app.to_str().unwrap(),
        ],
        &[],
        60,
    );
    assert!(!ran.timed_out, "{ran:?}");
    assert_eq!(ran.code, Some(0), "{ran:?}");
    assert!(ran.stdout.contains("6 launch(es) on hsa"), "{ran:?}");
}

// ---- controls ----

#[test]
fn bad_values_get_usage_errors() {
    let app = softhsa_app();
    let app = app.to_str().unwrap();
    for (args, code, needle) in [
        (vec!["run", app], 2, "unexpected argument"),
        (vec!["run", "--passes", "0", "--", app], 2, "--passes"),
        (vec!["run", "--passes", "abc", "--", app], 2, "--passes"),
        (
            vec!["run", "--passes", "99999999999999999999999", "--", app],
            2,
            "at most 1024",
        ),
        (
            vec!["run", "--passes", "1025", "--", app],
            2,
            "at most 1024",
        ),
        (vec!["run", "-o", "x.txt", "--", app], 2, ".csv or .json"),
        (vec!["run", "--scope", "all", "--", app], 2, "--scope"),
        (
            vec!["run", "--backend", "hsa", "--backend", "cuda", "--", app],
            2,
            "multiple",
        ),
        (
            vec![
                "run",
                "--backend",
                "hsa",
                "-o",
                "/nonexistent/k.csv",
                "--",
                app,
            ],
            1,
            "cannot write",
        ),
        (
            vec!["run", "--backend", "hsa", "--library", "/tmp", "--", app],
            1,
            "--library",
        ),
    ] {
        let ran = kreplay(&args, &[], 30);
        assert_eq!(ran.code, Some(code), "{args:?}: {ran:?}");
        assert!(ran.stderr.contains(needle), "{args:?}: {ran:?}");
    }
    let lib = libkreplay();
    for prog in ["no-such-program-on-path", "/etc/passwd", "/tmp"] {
        let ran = kreplay(
            &[
                "run",
                "--backend",
                "hsa",
                "--library",
                lib.to_str().unwrap(),
                "--",
                prog,
            ],
            &[],
            30,
        );
        assert_eq!(ran.code, Some(1), "{ran:?}");
        assert!(
            ran.stderr.contains("cannot start") && ran.stderr.contains(prog),
            "{ran:?}"
        );
    }
}

#[test]
fn cuda_backend_without_gpu_fails_cleanly() {
    let lib = libkreplay();
    let app = softhsa_app();
    let ran = kreplay(
        &[
            "run",
            "--backend",
            "cuda",
            "--library",
            lib.to_str().unwrap(),
            "--",
            app.to_str().unwrap(),
        ],
        &[],
        60,
    );
    assert_eq!(ran.code, Some(1), "{ran:?}");
    assert!(ran.stderr.contains("recorded nothing"), "{ran:?}");
}

#[test]
fn a_record_folder_that_is_empty_or_missing_is_refused_at_load_not_lost_at_exit() {
    // KREPLAY_RECORD_DIR set by hand (or from a script's unset variable): an empty value must
    // not write records into whatever folder the program runs in, and a missing folder must
    // be said when kreplay loads, not after the whole run, when the record is lost.
    let dir = scratch("record-dir");
    let app = softhsa_app();
    for value in ["", "/nonexistent-kreplay-record-folder"] {
        let mut c = std::process::Command::new(&app);
        for (name, _) in std::env::vars_os() {
            if name.to_string_lossy().starts_with("KREPLAY_") {
                c.env_remove(name);
            }
        }
        c.env("HSA_TOOLS_LIB", libkreplay())
            .env("KREPLAY_PASSES", "2")
            .env("KREPLAY_RECORD_DIR", value)
            .current_dir(&dir);
        let ran = run(c, None, Duration::from_secs(60));
        assert!(!ran.timed_out, "{ran:?}");
        let left: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .filter_map(Result::ok)
            .map(|e| e.file_name())
            .collect();
        assert!(
            left.is_empty(),
            "KREPLAY_RECORD_DIR={value:?} wrote into the current folder: {left:?}"
        );
        assert!(
            ran.stderr.contains("not loaded") && ran.stderr.contains("KREPLAY_RECORD_DIR"),
            "KREPLAY_RECORD_DIR={value:?} is not refused at load: {ran:?}"
        );
    }
}

#[test]
fn a_relative_temporary_folder_still_gives_the_program_a_record_folder_it_can_reach() {
    // TMPDIR relative to where kreplay starts, and a program that changes folder before it
    // loads kreplay: the record folder kreplay made must still be the one the program writes
    // into.
    let dir = scratch("relative-tmpdir");
    std::fs::create_dir_all(dir.join("tmp")).unwrap();
    let app = softhsa_app();
    let launcher = script(
        &dir,
        "elsewhere.sh",
        &format!("cd /\nexec '{}'\n", app.display()),
    );
    let lib = libkreplay();
    let args: Vec<&OsStr> = vec![
        OsStr::new("run"),
        OsStr::new("--backend"),
        OsStr::new("hsa"),
        OsStr::new("--library"),
        lib.as_os_str(),
        OsStr::new("--"),
        launcher.as_os_str(),
    ];
    let mut c = command(&args, &[("TMPDIR", OsStr::new("tmp"))]);
    c.current_dir(&dir);
    let ran = run(c, None, Duration::from_secs(60));
    assert!(!ran.timed_out, "{ran:?}");
    assert_eq!(ran.code, Some(0), "{ran:?}");
    assert!(ran.stdout.contains("6 launch(es) on hsa"), "{ran:?}");
}

// ---- limits ----

#[test]
fn a_file_size_limit_below_the_record_does_not_kill_the_program_at_exit() {
    // A program run under `ulimit -f` (a test harness, a batch system): writing the record at
    // exit must not raise SIGXFSZ in it, so that it dies of a signal only under kreplay; the
    // missing record is explained instead.
    let dir = scratch("fsize-record");
    let app = softhsa_app();
    let launcher = script(
        &dir,
        "limited.sh",
        &format!("ulimit -f 0\nexec '{}'\n", app.display()),
    );
    let (ran, _) = run_launcher(&dir, &launcher, &[]);
    assert!(!ran.timed_out, "{ran:?}");
    assert!(
        ran.stdout.contains("checksum buffer 2"),
        "the program ran: {ran:?}"
    );
    assert!(
        !ran.stderr.contains("SIGXFSZ") && !ran.stderr.contains("signal"),
        "the program was killed at exit by kreplay's record: {ran:?}"
    );
    assert!(
        ran.stderr.contains("RLIMIT_FSIZE"),
        "why the record is missing is not said: {ran:?}"
    );
    assert_eq!(ran.code, Some(1), "no record, no table: {ran:?}");
}

/// A pseudo-terminal: (master, slave) descriptors, both left open for the test's life.
/// `None` where the machine has no pseudo-terminals (a container without `/dev/pts`).
fn pseudo_terminal() -> Option<(i32, i32)> {
    // SAFETY: plain calls on descriptors this function opens; the name buffer is large enough
    // and NUL-terminated by ptsname_r.
    unsafe {
        let master = libc::posix_openpt(libc::O_RDWR | libc::O_NOCTTY);
        if master < 0 {
            eprintln!(
                "skipped: no pseudo-terminal (posix_openpt: {})",
                std::io::Error::last_os_error()
            );
            return None;
        }
        assert_eq!(libc::grantpt(master), 0);
        assert_eq!(libc::unlockpt(master), 0);
        let mut name = [0 as libc::c_char; 128];
        assert_eq!(libc::ptsname_r(master, name.as_mut_ptr(), name.len()), 0);
        let slave = libc::open(name.as_ptr(), libc::O_RDWR | libc::O_NOCTTY);
        assert!(
            slave >= 0,
            "open the slave: {}",
            std::io::Error::last_os_error()
        );
        Some((master, slave))
    }
}

/// A program that counts the SIGINTs it gets, in its handler (a shell's traps would run once
/// for two SIGINTs that came close together): it writes `ready` once its handlers are in
/// place, `interrupted` at the first SIGINT, and `total N` when a SIGTERM ends it.
const COUNT_SIGINTS: &str = r#"
#include <signal.h>
#include <stdio.h>
static volatile sig_atomic_t ints = 0, term = 0;
static void on_int(int s) { (void)s; ints++; }
static void on_term(int s) { (void)s; term = 1; }
static void say(const char *path, const char *mode, const char *what, int n) {
    FILE *f = fopen(path, mode);
    if (f) { fprintf(f, what, n); fclose(f); }
}
int main(int argc, char **argv) {
    if (argc != 3) return 2;
    struct sigaction a = {0};
    sigset_t both, none;
    sigemptyset(&none);
    sigemptyset(&both);
    sigaddset(&both, SIGINT);
    sigaddset(&both, SIGTERM);
    sigprocmask(SIG_BLOCK, &both, 0);
    a.sa_handler = on_int;
    sigaction(SIGINT, &a, 0);
    a.sa_handler = on_term;
    sigaction(SIGTERM, &a, 0);
    say(argv[1], "w", "ready\n", 0);
    int told = 0;
    while (!term) {
        sigsuspend(&none);
        if (ints && !told) { say(argv[2], "w", "interrupted\n", 0); told = 1; }
    }
    say(argv[2], "a", "total %d\n", ints);
    return 0;
}
"#;

#[test]
fn ctrl_c_in_the_terminal_reaches_the_program_once() {
    // Ctrl-C in a terminal: the terminal sends SIGINT to its whole foreground process group,
    // the program included. kreplay run must not pass on a second one: a program that
    // force-quits on a second SIGINT (Python's and PyTorch's launchers, many servers) would
    // skip its cleanup. A SIGTERM to kreplay, passed on after any SIGINT it passes on (its
    // handlers do not nest), makes the program report the SIGINTs it got and exit.
    let dir = scratch("ctrl-c-once");
    let (ints, ready) = (dir.join("ints"), dir.join("ready"));
    let src = dir.join("count_sigints.c");
    std::fs::write(&src, COUNT_SIGINTS).unwrap();
    let counter = dir.join("count_sigints");
    let built = std::process::Command::new("cc")
        .arg(&src)
        .arg("-o")
        .arg(&counter)
        .status()
        .is_ok_and(|s| s.success());
    if !built {
        eprintln!("skipped: no C compiler (cc) to build the program");
        return;
    }
    let lib = dir.join("libkreplay.so");
    std::fs::write(&lib, b"not loaded by the script").unwrap();
    let Some((master, slave)) = pseudo_terminal() else {
        return;
    };
    let mut c = std::process::Command::new(kreplay_exe());
    c.args(["run", "--backend", "hsa", "--library"])
        .arg(&lib)
        .arg("--")
        .args([&counter, &ready, &ints])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    for (name, _) in std::env::vars_os() {
        let n = name.to_string_lossy();
        if n.starts_with("KREPLAY_") || n == "HSA_TOOLS_LIB" || n == "CUDA_INJECTION64_PATH" {
            c.env_remove(name);
        }
    }
    // SAFETY: setsid and ioctl are async-signal-safe; the closure touches nothing else. kreplay
    // becomes the leader of a session whose controlling terminal is the pseudo-terminal, its
    // process group the terminal's foreground group, as in a shell.
    unsafe {
        use std::os::unix::process::CommandExt;
        c.pre_exec(move || {
            if libc::setsid() < 0 || libc::ioctl(slave, libc::TIOCSCTTY, 0) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = c.spawn().unwrap();
    let kill_all = |child: &std::process::Child| {
        // SAFETY: the session (one process group) of the kreplay this test started.
        unsafe { libc::kill(-(child.id() as i32), libc::SIGKILL) };
    };
    wait_for_file(&ready);
    // The terminal's interrupt character.
    // SAFETY: writes one byte from a live buffer to the master this test opened.
    let wrote = unsafe { libc::write(master, b"\x03".as_ptr().cast(), 1) };
    assert_eq!(wrote, 1);
    wait_for_file(&ints);
    // SAFETY: the kreplay process this test started.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let t = Instant::now();
    let report = loop {
        let text = std::fs::read_to_string(&ints).unwrap_or_default();
        if text.contains("total") || t.elapsed() > Duration::from_secs(10) {
            break text;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let _ = child.wait();
    kill_all(&child);
    // SAFETY: the descriptors pseudo_terminal opened.
    unsafe {
        libc::close(master);
        libc::close(slave);
    }
    assert!(
        report.ends_with("total 1\n"),
        "SIGINTs the program got from one Ctrl-C: {report:?}"
    );
}

/// A program that counts the SIGINTs it gets, in its handler: it writes `ready` once its
/// handlers are in place, `ints N` each time the count grows, and `total N` when a SIGTERM
/// ends it (SIGINT, the lower number, is always delivered before a SIGTERM pending with it).
const COUNT_EACH_SIGINT: &str = r#"
#include <signal.h>
#include <stdio.h>
static volatile sig_atomic_t ints = 0, term = 0;
static void on_int(int s) { (void)s; ints++; }
static void on_term(int s) { (void)s; term = 1; }
static void say(const char *path, const char *what, int n) {
    FILE *f = fopen(path, "w");
    if (f) { fprintf(f, what, n); fclose(f); }
}
int main(int argc, char **argv) {
    if (argc != 3) return 2;
    struct sigaction a = {0};
    sigset_t both, none;
    sigemptyset(&none);
    sigemptyset(&both);
    sigaddset(&both, SIGINT);
    sigaddset(&both, SIGTERM);
    sigprocmask(SIG_BLOCK, &both, 0);
    a.sa_handler = on_int;
    sigaction(SIGINT, &a, 0);
    a.sa_handler = on_term;
    sigaction(SIGTERM, &a, 0);
    say(argv[1], "ready\n", 0);
    int told = 0;
    while (!term) {
        sigsuspend(&none);
        if (ints != told) { told = ints; say(argv[2], "ints %d\n", told); }
    }
    say(argv[2], "total %d\n", ints);
    return 0;
}
"#;

#[test]
fn a_signal_sent_to_kreplays_process_group_reaches_the_program_once() {
    // `kill -INT -PGID`, supervisord's stopasgroup, a job runner stopping a process group: the
    // signal reaches every process of kreplay's group, the program included, as it would
    // without kreplay. kreplay run must not pass on a second one (a program that force-quits
    // on a second SIGINT would skip its cleanup). Several rounds, as a second one, where it
    // comes, comes only when the program handled the first before kreplay passed it on.
    group_sigints("group-signal-once", 8, None);
}

#[test]
fn a_group_signal_reaches_the_program_once_though_kreplays_helper_answers_late() {
    // kreplay asks its helper process (the witness) whether a signal was sent to the whole
    // group. On a loaded machine the answer can take a while: it is waited for, not taken as
    // "no" after a second, which passed the signal on a second time. Here the helper is
    // stopped for 2.5 s while the first round's SIGINT is handled.
    group_sigints(
        "group-signal-late-witness",
        2,
        Some(Duration::from_millis(2500)),
    );
}

/// Sends `rounds` SIGINTs to the process group of a `kreplay run` whose program counts them,
/// each once the program counted the one before, and checks that it counted each once. With
/// `stall`, kreplay's helper process is stopped that long while the first is handled.
fn group_sigints(name: &str, rounds: usize, stall: Option<Duration>) {
    let dir = scratch(name);
    let (ints, ready) = (dir.join("ints"), dir.join("ready"));
    let src = dir.join("count_each_sigint.c");
    std::fs::write(&src, COUNT_EACH_SIGINT).unwrap();
    let counter = dir.join("count_each_sigint");
    let built = std::process::Command::new("cc")
        .arg(&src)
        .arg("-o")
        .arg(&counter)
        .status()
        .is_ok_and(|s| s.success());
    if !built {
        eprintln!("skipped: no C compiler (cc) to build the program");
        return;
    }
    let lib = dir.join("libkreplay.so");
    std::fs::write(&lib, b"not loaded by the program").unwrap();
    let args: Vec<&OsStr> = ["run", "--backend", "hsa", "--library"]
        .iter()
        .map(OsStr::new)
        .chain([lib.as_os_str(), OsStr::new("--")])
        .chain([counter.as_os_str(), ready.as_os_str(), ints.as_os_str()])
        .collect();
    // In a process group of its own, which it leads, as a shell starts a job.
    let mut c = command(&args, &[]);
    c.stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    let mut child = c.spawn().unwrap();
    let group = child.id() as i32;
    let kill_all = || {
        // SAFETY: the process group of the kreplay this test started.
        unsafe { libc::kill(-group, libc::SIGKILL) };
    };
    let read_until = |done: &dyn Fn(&str) -> bool| -> String {
        let t = Instant::now();
        loop {
            let text = std::fs::read_to_string(&ints).unwrap_or_default();
            if (text.ends_with('\n') && done(&text)) || t.elapsed() > Duration::from_secs(10) {
                return text;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    };
    wait_for_file(&ready);
    let witness = witness_of(group);
    for round in 1..=rounds {
        let stalled = stall.filter(|_| round == 1).map(|d| (d, witness));
        if let Some((_, witness)) = stalled {
            // SAFETY: kreplay's own helper process, its child (found by parent and name).
            unsafe { libc::kill(witness, libc::SIGSTOP) };
        }
        // SAFETY: the process group of the kreplay this test started.
        unsafe { libc::kill(-group, libc::SIGINT) };
        if let Some((d, witness)) = stalled {
            std::thread::sleep(d);
            // SAFETY: as above.
            unsafe { libc::kill(witness, libc::SIGCONT) };
        }
        let seen = read_until(&|text| {
            text.trim()
                .rsplit(' ')
                .next()
                .and_then(|n| n.parse::<usize>().ok())
                .is_some_and(|n| n >= round)
        });
        if !seen.starts_with("ints ") {
            kill_all();
            let _ = child.wait();
            panic!("round {round}: the program did not count the SIGINT: {seen:?}");
        }
        // The next one is sent once kreplay asked the witness about this one (the witness took
        // it): two SIGINTs pending at once in the witness are one (standard signals do not
        // queue), and kreplay would take the second for one sent to it alone.
        let t = Instant::now();
        while holds_signal(witness, libc::SIGINT) && t.elapsed() < Duration::from_secs(20) {
            std::thread::sleep(Duration::from_millis(5));
        }
    }
    // SAFETY: the kreplay process this test started.
    unsafe { libc::kill(group, libc::SIGTERM) };
    let report = read_until(&|text| text.starts_with("total"));
    let _ = child.wait();
    kill_all();
    assert_eq!(
        report,
        format!("total {rounds}\n"),
        "SIGINTs the program got from {rounds} sent to kreplay's process group"
    );
}

/// Whether process `pid` has `signal` pending (for the whole process), from /proc.
fn holds_signal(pid: i32, signal: i32) -> bool {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("ShdPnd:"))
        .and_then(|mask| u64::from_str_radix(mask.trim(), 16).ok())
        .is_some_and(|mask| mask & (1 << (signal - 1)) != 0)
}

/// The process id of `kreplay`'s helper process: its child that is a kreplay too.
fn witness_of(kreplay: i32) -> i32 {
    let t = Instant::now();
    loop {
        for entry in std::fs::read_dir("/proc").unwrap().flatten() {
            let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
                continue;
            };
            let Some((head, rest)) = stat.rsplit_once(") ") else {
                continue;
            };
            let parent = rest.split(' ').nth(1).and_then(|p| p.parse::<i32>().ok());
            if parent == Some(kreplay) && head.ends_with("(kreplay") {
                return head.split(' ').next().unwrap().parse().unwrap();
            }
        }
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "no helper process of kreplay {kreplay} found"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}
