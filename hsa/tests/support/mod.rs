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
/// The longest a scenario's process may run: a hang fails the test after this long. The
/// longest scenarios (a 96 MiB footprint followed over eleven dispatches, in a debug build)
/// take about 25 s alone on a 2-core machine and longer beside other test processes, so this
/// leaves them room; a scenario that finishes never waits for it.
const CHILD_DEADLINE: Duration = Duration::from_secs(90);

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
    let deadline = Instant::now() + CHILD_DEADLINE;
    let mut output = [String::new(), String::new()];
    let mut timed_out = false;
    for _ in 0..2 {
        match rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok((i, text)) => output[i] = text,
            Err(_) => {
                timed_out = true;
                break;
            }
        }
    }
    if timed_out {
        let _ = child.kill();
    }
    let status = child.wait().expect("the scenario's process is waited for");
    let report = format!(
        "--- stdout of {name} (table layout {layout}) ---\n{}\n--- stderr of {name} ---\n{}",
        output[0], output[1]
    );
    assert!(
        !timed_out,
        "scenario {name} (table layout {layout}) did not finish within {CHILD_DEADLINE:?}\n{report}"
    );
    assert!(
        status.success(),
        "scenario {name} (table layout {layout}) failed ({status})\n{report}"
    );
    assert!(
        output[0].contains(&format!("{DONE_MARK}{name}")),
        "scenario {name} did not run its body\n{report}"
    );
}

/// Runs `work` on threads and returns their results, failing the scenario (instead of hanging
/// it) when they do not all finish within `limit`.
pub fn bounded<T: Send + 'static>(
    limit: Duration,
    work: Vec<Box<dyn FnOnce() -> T + Send>>,
) -> Vec<T> {
    let (tx, rx) = mpsc::channel();
    let n = work.len();
    for (i, job) in work.into_iter().enumerate() {
        let tx = tx.clone();
        std::thread::spawn(move || {
            let _ = tx.send((i, job()));
        });
    }
    let deadline = Instant::now() + limit;
    let mut results: Vec<Option<T>> = (0..n).map(|_| None).collect();
    for _ in 0..n {
        match rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok((i, value)) => results[i] = Some(value),
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
