//! The application forks while a tool callback runs on another thread (a replay held at PASS
//! ENTER), and the child ends its HSA session (`hsa_shut_down`, which calls `OnUnload`). The
//! callback the parent's thread was running does not exist in the child: the child's unload
//! must not wait for it.

mod common;
#[path = "c_probe_tools/harness.rs"]
mod harness;

use std::ffi::c_int;
use std::time::{Duration, Instant};

use harness::*;
use kreplay_softhsa::OwnedApiTable;
use kreplay_softhsa::testing::Hsa;

unsafe extern "C" {
    fn fork() -> c_int;
    fn waitpid(pid: c_int, status: *mut c_int, options: c_int) -> c_int;
    fn kill(pid: c_int, signal: c_int) -> c_int;
    fn _exit(code: c_int) -> !;
}

/// Forks; the child calls `on_unload` and leaves at once. The problem to report, if any: the
/// child's unload took 3 s or more (it waited for `waited_for`), or the child ended otherwise.
fn unload_in_forked_child(on_unload: unsafe extern "C" fn(), waited_for: &str) -> Option<String> {
    // SAFETY: the child only calls OnUnload and leaves with _exit.
    let pid = unsafe { fork() };
    if pid == 0 {
        let begun = Instant::now();
        // SAFETY: the runtime's shutdown call, in the child.
        unsafe { on_unload() };
        let code = if begun.elapsed() < Duration::from_secs(3) {
            0
        } else {
            1
        };
        // SAFETY: leaves the child at once.
        unsafe { _exit(code) };
    }
    assert!(pid > 0, "fork failed");
    match wait_child(pid, Duration::from_secs(30)) {
        Some(0) => None,
        Some(1) => Some(format!(
            "the forked child's OnUnload waited for {waited_for}"
        )),
        other => Some(format!("the forked child ended with {other:?}")),
    }
}

const WNOHANG: c_int = 1;
const SIGKILL: c_int = 9;

/// Waits for child `pid` at most `limit` (killing it then); its exit code, or `None`.
fn wait_child(pid: c_int, limit: Duration) -> Option<c_int> {
    let deadline = Instant::now() + limit;
    let mut status: c_int = 0;
    loop {
        // SAFETY: `pid` is our child; `status` is writable.
        if unsafe { waitpid(pid, &mut status, WNOHANG) } == pid {
            return ((status & 0x7f) == 0).then_some((status >> 8) & 0xff);
        }
        if Instant::now() >= deadline {
            // SAFETY: our child, reaped right after.
            unsafe {
                kill(pid, SIGKILL);
                waitpid(pid, &mut status, 0);
            }
            return None;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

struct Shared<'a>(&'a App<'a>);
// SAFETY: the application's buffers and queue are usable from any thread (HSA objects); the
// test only dispatches from one thread at a time.
unsafe impl Send for Shared<'_> {}
// SAFETY: as above.
unsafe impl Sync for Shared<'_> {}

fn fork_child_body() {
    let mut table = OwnedApiTable::softhsa();
    let loaded = load_kreplay(&mut table);
    let mut problems = Vec::new();
    assert!(loaded.loaded, "OnLoad returned false");
    let tool_path = std::env::var("KREPLAY_TOOL_LIBRARIES").unwrap();
    // SAFETY: the tool library kreplay loaded; these functions have these signatures.
    let tool = unsafe { libloading::Library::new(&tool_path) }.expect("tool library");
    // SAFETY: as above.
    let (held, release) = unsafe {
        (
            *tool
                .get::<unsafe extern "C" fn() -> c_int>(b"life_held\0")
                .unwrap(),
            *tool
                .get::<unsafe extern "C" fn()>(b"life_release\0")
                .unwrap(),
        )
    };
    {
        // SAFETY: the table stays alive and valid while `hsa` is used.
        let hsa = unsafe { Hsa::from_table(table.table()) };
        let session = hsa.init().expect("hsa_init");
        let mut app = App::new(&hsa, 0, 1);
        let shared = Shared(&app);
        std::thread::scope(|s| {
            let shared = &shared;
            let dispatcher = s.spawn(move || shared.0.dispatch(0));
            let until = Instant::now() + Duration::from_secs(20);
            // SAFETY: the tool's function.
            while unsafe { held() } == 0 {
                assert!(
                    Instant::now() < until,
                    "the replay never reached PASS ENTER"
                );
                std::thread::yield_now();
            }
            problems.extend(unload_in_forked_child(
                loaded.on_unload,
                "a callback of the parent's thread",
            ));
            // SAFETY: the tool's function.
            unsafe { release() };
            if let Err(e) = dispatcher.join().expect("the dispatching thread") {
                problems.push(e);
            }
        });
        app.rounds_done += 1;
        problems.extend(app.check());
        drop(session);
    }
    // SAFETY: the runtime's shutdown call.
    unsafe { (loaded.on_unload)() };
    for p in &problems {
        println!("TOOL-PROBLEM: {p}");
    }
    println!("PROBE-DONE");
}

#[test]
fn a_child_forked_while_a_callback_runs_unloads_without_waiting_for_it() {
    let name = "a_child_forked_while_a_callback_runs_unloads_without_waiting_for_it";
    if in_child(name) {
        return fork_child_body();
    }
    let (problems, run) = run_scenario(name, &["life_hold.c"], &[], Duration::from_secs(90));
    assert!(
        problems.is_empty(),
        "problems: {problems:#?}\n{}",
        run.report()
    );
}

fn fork_during_finalize_body() {
    let mut table = OwnedApiTable::softhsa();
    let loaded = load_kreplay(&mut table);
    let mut problems = Vec::new();
    assert!(loaded.loaded, "OnLoad returned false");
    let tool_path = std::env::var("KREPLAY_TOOL_LIBRARIES").unwrap();
    // SAFETY: the tool library kreplay loaded; these functions have these signatures.
    let tool = unsafe { libloading::Library::new(&tool_path) }.expect("tool library");
    // SAFETY: as above.
    let (start, in_fini, release, join) = unsafe {
        (
            *tool
                .get::<unsafe extern "C" fn() -> c_int>(b"life_finalize_async\0")
                .unwrap(),
            *tool
                .get::<unsafe extern "C" fn() -> c_int>(b"life_in_fini\0")
                .unwrap(),
            *tool
                .get::<unsafe extern "C" fn()>(b"life_release\0")
                .unwrap(),
            *tool.get::<unsafe extern "C" fn()>(b"life_join\0").unwrap(),
        )
    };
    // SAFETY: the tool's functions.
    unsafe {
        assert_eq!(start(), 0, "the tool's thread starts");
        let until = Instant::now() + Duration::from_secs(20);
        while in_fini() == 0 {
            assert!(Instant::now() < until, "the tool's finalize never ran");
            std::thread::yield_now();
        }
    }
    problems.extend(unload_in_forked_child(
        loaded.on_unload,
        "a finalize running on the parent's thread",
    ));
    // SAFETY: the tool's functions; the runtime's shutdown call.
    unsafe {
        release();
        join();
        (loaded.on_unload)();
    }
    for p in &problems {
        println!("TOOL-PROBLEM: {p}");
    }
    println!("PROBE-DONE");
}

#[test]
fn a_child_forked_while_a_tool_finalizes_unloads_without_waiting_for_it() {
    let name = "a_child_forked_while_a_tool_finalizes_unloads_without_waiting_for_it";
    if in_child(name) {
        return fork_during_finalize_body();
    }
    let (problems, run) = run_scenario(name, &["life_slow_fini.c"], &[], Duration::from_secs(90));
    assert!(
        problems.is_empty(),
        "problems: {problems:#?}\n{}",
        run.report()
    );
}
