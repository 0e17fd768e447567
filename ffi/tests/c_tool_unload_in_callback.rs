//! A tool calls OnUnload from inside one of its own callbacks (tests/c_probe_tools/
//! unload_from_callback.c), at each kind of record in turn. The call must return, finalize the
//! tool once, and leave the application's results those of one run; nothing of the tool may
//! begin after it.

mod common;
#[path = "c_probe_tools/harness.rs"]
mod harness;

use std::time::Duration;

use harness::*;

const DEADLINE: Duration = Duration::from_secs(60);

fn scenario(name: &str, at: &str) {
    let (problems, run) = run_scenario(
        name,
        &["unload_from_callback.c"],
        &[("PROBE_AT", at)],
        DEADLINE,
    );
    assert!(
        problems.is_empty(),
        "problems: {problems:#?}\n{}",
        run.report()
    );
}

macro_rules! unload_at {
    ($($test:ident => $at:literal,)*) => {$(
        #[test]
        fn $test() {
            let name = stringify!($test);
            if in_child(name) {
                return standard_child(2, 2);
            }
            scenario(name, $at);
        }
    )*};
}

unload_at! {
    unload_from_config_enter_returns_and_finalizes_the_tool_once => "config_enter",
    unload_from_pass_enter_returns_and_finalizes_the_tool_once => "pass_enter",
    unload_from_snapshot_exit_returns_and_finalizes_the_tool_once => "snapshot_exit",
    unload_from_restore_enter_returns_and_finalizes_the_tool_once => "restore_enter",
    unload_from_enqueue_enter_returns_and_finalizes_the_tool_once => "enqueue_enter",
    unload_from_enqueue_exit_returns_and_finalizes_the_tool_once => "enqueue_exit",
    unload_from_complete_returns_and_finalizes_the_tool_once => "complete",
}

/// Dispatches once more over buffer 1 of the application when the thread ends, from a
/// thread-local destructor (as a C++ `thread_local` object or a `pthread_key_create` destructor
/// of an application may).
struct DispatchAtExit(std::cell::Cell<Option<(usize, std::path::PathBuf)>>);

impl Drop for DispatchAtExit {
    fn drop(&mut self) {
        let Some((app, tool)) = self.0.take() else {
            return;
        };
        // The tool calls OnUnload from the ENQUEUE EXIT of this dispatch.
        // SAFETY: the tool library is loaded by kreplay; `probe_arm` has this signature.
        unsafe {
            let lib = libloading::Library::new(&tool).expect("tool library");
            lib.get::<unsafe extern "C" fn()>(b"probe_arm\0")
                .expect("probe_arm exported")();
        }
        // SAFETY: the application outlives this thread (joined before it is dropped).
        let app = unsafe { &*(app as *const App<'_>) };
        if let Err(e) = app.dispatch(1) {
            println!("TOOL-PROBLEM: at thread exit: {e}");
        }
    }
}

thread_local! {
    static AT_EXIT: DispatchAtExit = const { DispatchAtExit(std::cell::Cell::new(None)) };
}

/// A thread of the application first sets up its destructor (so that it runs after kreplay's
/// own thread-locals of that thread were destroyed: destructors run in the reverse order of
/// their registration), then dispatches once, then ends: its destructor dispatches again and
/// the tool calls OnUnload from that dispatch's ENQUEUE EXIT.
fn thread_exit_child() {
    let tool = std::env::var("KREPLAY_TOOL_LIBRARIES").expect("the tool");
    let mut table = kreplay_softhsa::OwnedApiTable::softhsa();
    let loaded = load_kreplay(&mut table);
    let mut problems = Vec::new();
    {
        // SAFETY: the table stays alive and valid while `hsa` is used.
        let hsa = unsafe { kreplay_softhsa::testing::Hsa::from_table(table.table()) };
        let session = hsa.init().expect("hsa_init");
        let mut app = App::new(&hsa, 0, 2);
        let at = &app as *const App<'_> as usize;
        let worker = std::thread::spawn(move || {
            AT_EXIT.with(|a| a.0.set(Some((at, tool.into()))));
            // SAFETY: as in the destructor.
            let app = unsafe { &*(at as *const App<'_>) };
            app.dispatch(0).err()
        });
        // `join` returns once the thread ended, its destructors run.
        problems.extend(worker.join().expect("the thread ran"));
        app.rounds_done = 1;
        // Buffer 0 got one dispatch, buffer 1 one: one round's results.
        problems.extend(app.check());
        drop(session);
    }
    // SAFETY: the runtime's shutdown call (the tool's own was the first: this one finds nothing
    // left to do).
    unsafe { (loaded.on_unload)() };
    let report = tool_report(std::path::Path::new(
        &std::env::var("KREPLAY_TOOL_LIBRARIES").unwrap(),
    ));
    if !report.is_empty() {
        problems.push(report);
    }
    for p in &problems {
        println!("TOOL-PROBLEM: {p}");
    }
    println!("PROBE-DONE");
}

#[test]
fn unload_from_enqueue_exit_in_a_thread_local_destructor_returns_at_once() {
    let name = "unload_from_enqueue_exit_in_a_thread_local_destructor_returns_at_once";
    if in_child(name) {
        return thread_exit_child();
    }
    let (problems, run) = run_scenario(
        name,
        &["unload_from_callback.c"],
        &[("PROBE_AT", "enqueue_exit"), ("PROBE_ARMED", "0")],
        DEADLINE,
    );
    assert!(
        problems.is_empty(),
        "problems: {problems:#?}\n{}",
        run.report()
    );
}
