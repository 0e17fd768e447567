//! Support for the end-to-end tests: a one-process-per-scenario harness, the HSA application
//! side ([`app`]) and the test tool ([`tool`]).

pub mod app;
pub mod counted;
pub mod tool;

use std::io::Read;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Set in a child process to the name of the scenario it runs.
const CHILD_ENV: &str = "KREPLAY_HSA_E2E_SCENARIO";
/// Printed by a child when its scenario returned (so a child that ran nothing cannot pass).
const DONE_MARK: &str = "kreplay-e2e-scenario-done:";
/// Printed by a child whose scenario was skipped, before the reason (passed on by the parent).
const SKIP_MARK: &str = "skipped: ";
/// After this long a scenario's process that has stopped using CPU counts as hung. The longest
/// scenarios (a 96 MiB footprint followed over eleven dispatches, in a debug build) use about
/// 15 s of CPU; alone on a 2-core machine they take about 25 s, but beside other test processes
/// on a loaded machine more than 90 s of wall-clock time, so wall-clock time alone cannot tell
/// a slow scenario from a hung one: a scenario still using CPU past this point goes on, up to
/// [`CHILD_CPU_BUDGET`] of CPU and [`CHILD_HARD_DEADLINE`] of wall-clock time. A scenario that
/// finishes never waits for any of these.
const CHILD_DEADLINE: Duration = Duration::from_secs(90);
/// Past [`CHILD_DEADLINE`], a scenario's process that used less CPU than this over the last
/// [`PROGRESS_WINDOW`] is hung (every thread blocked). A loaded machine still gives a runnable
/// process far more than this.
const MIN_PROGRESS: Duration = Duration::from_millis(50);
/// The window [`MIN_PROGRESS`] is measured over.
const PROGRESS_WINDOW: Duration = Duration::from_secs(10);
/// The most CPU a scenario's process may use: one spinning without end (a livelock) fails after
/// this, however loaded the machine.
const CHILD_CPU_BUDGET: Duration = Duration::from_secs(90);
/// The longest a scenario's process may run, whatever it does.
const CHILD_HARD_DEADLINE: Duration = Duration::from_secs(600);

/// The API table layouts every scenario runs against (softhsa's `KREPLAY_SOFTHSA_TABLE`): the
/// ROCm 5.2 layout of the bindings and the ROCm 6.x/7.x one.
pub const LAYOUTS: [&str; 2] = ["5.2", "6.2"];

/// Runs `scenario` in a process of its own, once per table layout of [`LAYOUTS`].
///
/// kreplay's HSA backend is process-global (installed once, plain `extern "C"` wrappers), so
/// each scenario re-executes this test binary for its own test only. In that child (marked by
/// an environment variable) the scenario runs; in the parent the child's exit status and
/// completion mark are asserted, with the child's output printed on failure.
pub fn isolated(name: &str, scenario: fn()) {
    isolated_on(name, &LAYOUTS, scenario);
}

/// [`isolated`] for the table layouts `layouts` only.
pub fn isolated_on(name: &str, layouts: &[&str], scenario: fn()) {
    if let Ok(running) = std::env::var(CHILD_ENV) {
        assert_eq!(running, name, "a scenario child must run only its own test");
        scenario();
        println!("{DONE_MARK}{name}");
        return;
    }
    for layout in layouts {
        isolated_with(name, layout);
    }
}

/// Runs the scenario `name` in a child process whose softhsa hands out `layout`'s table.
pub fn isolated_with(name: &str, layout: &str) {
    let exe = std::env::current_exe().expect("the test binary's path");
    let mut child = Command::new(exe)
        // `--include-ignored`: an ignored scenario, run with `--ignored`, runs in its child too.
        .args([
            "--exact",
            name,
            "--nocapture",
            "--test-threads=1",
            "--include-ignored",
        ])
        .env(CHILD_ENV, name)
        .env(kreplay_softhsa::TABLE_LAYOUT_ENV, layout)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the scenario's process starts");
    // The pipes close when the child exits; readers report through a channel so the wait is
    // bounded by a deadline.
    let (tx, rx) = mpsc::channel::<(usize, String)>();
    let pipes: Vec<Box<dyn Read + Send>> = vec![
        Box::new(child.stdout.take().expect("piped stdout")),
        Box::new(child.stderr.take().expect("piped stderr")),
    ];
    for (i, mut pipe) in pipes.into_iter().enumerate() {
        let tx = tx.clone();
        std::thread::spawn(move || {
            let mut bytes = Vec::new();
            let _ = pipe.read_to_end(&mut bytes);
            let _ = tx.send((i, String::from_utf8_lossy(&bytes).into_owned()));
        });
    }
    drop(tx);
    let started = Instant::now();
    let mut output = [String::new(), String::new()];
    let mut received = 0;
    let mut timed_out = None;
    // CPU time of the child at the start of each progress window.
    let mut window: (Instant, Duration) = (started, Duration::ZERO);
    while received < 2 {
        match rx.recv_timeout(Duration::from_secs(1)) {
            Ok((i, text)) => {
                output[i] = text;
                received += 1;
                continue;
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
            Err(mpsc::RecvTimeoutError::Timeout) => {}
        }
        let now = Instant::now();
        // Unreadable once the child exited: its pipes close and the loop ends soon after.
        let Some(cpu) = cpu_time_of(child.id()) else {
            continue;
        };
        if now - started >= CHILD_HARD_DEADLINE {
            timed_out = Some(format!("ran {CHILD_HARD_DEADLINE:?}"));
        } else if cpu >= CHILD_CPU_BUDGET {
            timed_out = Some(format!("used {CHILD_CPU_BUDGET:?} of CPU"));
        } else if now - window.0 >= PROGRESS_WINDOW {
            if now - started >= CHILD_DEADLINE && cpu.saturating_sub(window.1) < MIN_PROGRESS {
                timed_out = Some(format!(
                    "ran {:?} and used {:?} of CPU in its last {PROGRESS_WINDOW:?} (hung)",
                    now - started,
                    cpu.saturating_sub(window.1)
                ));
            }
            window = (now, cpu);
        }
        if timed_out.is_some() {
            break;
        }
    }
    if timed_out.is_some() {
        let _ = child.kill();
    }
    let status = child.wait().expect("the scenario's process is waited for");
    let report = format!(
        "--- stdout of {name} (table layout {layout}) ---\n{}\n--- stderr of {name} ---\n{}",
        output[0], output[1]
    );
    if let Some(why) = timed_out {
        panic!("scenario {name} (table layout {layout}) did not finish: it {why}\n{report}");
    }
    assert!(
        status.success(),
        "scenario {name} (table layout {layout}) failed ({status})\n{report}"
    );
    assert!(
        output[0].contains(&format!("{DONE_MARK}{name}")),
        "scenario {name} did not run its body\n{report}"
    );
    // The mark may follow the child's harness's "test NAME ... " on the same line.
    for (_, why) in output[0].lines().filter_map(|l| l.split_once(SKIP_MARK)) {
        eprintln!("{SKIP_MARK}{name} (table layout {layout}): {why}");
    }
}

/// The CPU time (user and system, every thread) this process used so far.
pub fn process_cpu_time() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid clock id and a valid out-pointer.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime");
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// The CPU time (user and system, every thread) process `pid` used so far, from
/// `/proc/<pid>/stat`; `None` once it cannot be read.
fn cpu_time_of(pid: u32) -> Option<Duration> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The fields after the command name (which may hold spaces, in parentheses): state is
    // field 3, utime field 14 and stime field 15, in clock ticks.
    let fields: Vec<&str> = stat
        .get(stat.rfind(')')? + 1..)?
        .split_whitespace()
        .collect();
    let ticks: u64 = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    // SAFETY: sysconf only reads a configuration value.
    let per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    let per_second = u64::try_from(per_second).ok().filter(|&t| t > 0)?;
    Some(Duration::from_nanos(
        ticks.saturating_mul(1_000_000_000) / per_second,
    ))
}

/// Runs `work` on threads and returns their results, failing the scenario (instead of hanging
/// it) when they do not all finish within `limit`. A job that panics fails the scenario at
/// once, with the job's panic message (not as a deadlock once `limit` has passed).
pub fn bounded<T: Send + 'static>(
    limit: Duration,
    work: Vec<Box<dyn FnOnce() -> T + Send>>,
) -> Vec<T> {
    let (tx, rx) = mpsc::channel();
    let n = work.len();
    for (i, job) in work.into_iter().enumerate() {
        let tx = tx.clone();
        std::thread::spawn(move || {
            let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(job));
            let _ = tx.send((i, result));
        });
    }
    drop(tx);
    let deadline = Instant::now() + limit;
    let mut results: Vec<Option<T>> = (0..n).map(|_| None).collect();
    for _ in 0..n {
        match rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok((i, Ok(value))) => results[i] = Some(value),
            Ok((i, Err(payload))) => panic!(
                "job {i} of {n} panicked: {}",
                payload
                    .downcast_ref::<&str>()
                    .copied()
                    .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
                    .unwrap_or("(a panic payload that is not a string)")
            ),
            Err(_) => panic!("deadlock: the scenario's threads did not finish within {limit:?}"),
        }
    }
    results
        .into_iter()
        .map(|r| r.expect("every job reported"))
        .collect()
}

/// Waits until `flag` is set, at most [`app::WAIT`]; returns whether it was.
pub fn wait_flag(flag: &AtomicBool) -> bool {
    let deadline = Instant::now() + app::WAIT;
    while !flag.load(Ordering::SeqCst) {
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::yield_now();
    }
    true
}

/// Waits for child process `pid` at most `limit`, killing it when it is still running then.
/// Returns its exit status (minus the signal's number when a signal ended it), or `None` when
/// it had to be killed.
#[allow(dead_code)] // for the scenario files that fork
pub fn wait_child(pid: libc::pid_t, limit: Duration) -> Option<i32> {
    let deadline = Instant::now() + limit;
    loop {
        let mut status = 0;
        // SAFETY: `pid` is a child of this process; `status` is a valid out pointer.
        if unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) } == pid {
            return Some(if libc::WIFEXITED(status) {
                libc::WEXITSTATUS(status)
            } else {
                -libc::WTERMSIG(status)
            });
        }
        if Instant::now() >= deadline {
            // SAFETY: ends the child we started; reaped right after.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
                libc::waitpid(pid, &mut status, 0);
            }
            return None;
        }
        std::thread::park_timeout(Duration::from_millis(10));
    }
}

/// Declares scenarios: each becomes a `#[test]` that runs its body in a process of its own.
macro_rules! scenarios {
    ($( $(#[$meta:meta])* fn $name:ident() $body:block )*) => {
        $(
            $(#[$meta])*
            #[test]
            fn $name() {
                fn body() $body
                $crate::support::isolated(stringify!($name), body);
            }
        )*
    };
}

/// Room kept beyond a test's own spill files, for the other writers on the same file system
/// (other tests, builds) between the check and the spill.
const SPILL_SLACK: u64 = 64 << 20;

/// Why spill files of `bytes` bytes in all would be declined in `dir` now for want of room
/// (`kreplay_snapshot::spill_room`), or `None` where they fit (or the room cannot be read):
/// on a machine with little disk free the file tier's tests depend on the machine, not the
/// code.
pub fn short_of_spill_room(dir: &std::path::Path, bytes: u64) -> Option<String> {
    let room = kreplay_snapshot::spill_room(dir)?;
    (room < bytes + SPILL_SLACK).then(|| {
        format!(
            "{} leaves {room} bytes for spill files: too little for {bytes}",
            dir.display()
        )
    })
}

/// In a scenario's process ([`isolated`]): ends the scenario here, as passed and with the
/// reason printed (the parent passes it on), when spill files of `bytes` bytes would not fit
/// in `dir` (see [`short_of_spill_room`]).
pub fn skip_unless_spill_room(dir: &std::path::Path, bytes: u64) {
    let Some(why) = short_of_spill_room(dir, bytes) else {
        return;
    };
    let name = std::env::var(CHILD_ENV).expect("skip_unless_spill_room runs in a scenario");
    println!("{SKIP_MARK}{why}");
    println!("{DONE_MARK}{name}");
    let _ = std::io::Write::flush(&mut std::io::stdout());
    std::process::exit(0);
}
