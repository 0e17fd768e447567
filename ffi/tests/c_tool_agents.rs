//! C tools: a slow replay callback on one agent must not block another agent
//! (docs/abi.md §3 rule 1, kreplay.h "Threads").

mod common;
#[path = "c_probe_tools/harness.rs"]
mod harness;

use std::path::Path;
use std::time::{Duration, Instant};

use harness::*;
use kreplay_softhsa::OwnedApiTable;
use kreplay_softhsa::testing::Hsa;

fn two_agents_child() {
    let mut table = OwnedApiTable::softhsa();
    let loaded = load_kreplay(&mut table);
    let tool = std::env::var("KREPLAY_TOOL_LIBRARIES").unwrap();
    // SAFETY: the tool is loaded; accessors of slow_callback.c.
    let lib = unsafe { libloading::Library::new(&tool) }.unwrap();
    let mut problems = Vec::new();
    {
        // SAFETY: the table stays alive while `hsa` is used.
        let hsa = unsafe { Hsa::from_table(table.table()) };
        let session = hsa.init().expect("hsa_init");
        let mut app0 = App::new(&hsa, 0, 1);
        let mut app1 = App::new(&hsa, 1, 1);
        // SAFETY: as above.
        unsafe {
            lib.get::<unsafe extern "C" fn(u64)>(b"probe_slow_agent\0")
                .unwrap()(app0.agent.handle);
        }
        // SAFETY: as above.
        let sleeping = unsafe {
            *lib.get::<unsafe extern "C" fn() -> i32>(b"probe_sleeping\0")
                .unwrap()
        };
        // Warm up agent 1 (its queue, its first replay) before the measurement.
        problems.extend(app1.round());
        std::thread::scope(|s| {
            let t0 = s.spawn(|| app0.round());
            let start = Instant::now();
            // SAFETY: plain accessor.
            while unsafe { sleeping() } == 0 && start.elapsed() < Duration::from_secs(10) {
                std::thread::sleep(Duration::from_millis(1));
            }
            let t = Instant::now();
            let r = app1.round();
            let took = t.elapsed();
            // SAFETY: plain accessor.
            let still = unsafe { sleeping() } != 0;
            problems.extend(r);
            if took > Duration::from_millis(800) {
                problems.push(format!(
                    "a dispatch on agent 1 took {took:?} while a PASS ENTER callback on agent 0 slept \
                     1.5 s (still sleeping when it finished: {still})"
                ));
            }
            problems.extend(t0.join().unwrap());
        });
        problems.extend(app0.check());
        problems.extend(app1.check());
        drop(session);
    }
    // SAFETY: the runtime's shutdown call.
    unsafe { (loaded.on_unload)() };
    let r = tool_report(Path::new(&tool));
    if !r.is_empty() {
        problems.push(r);
    }
    for p in &problems {
        println!("TOOL-PROBLEM: {p}");
    }
    println!("PROBE-DONE");
}

#[test]
fn a_slow_pass_enter_on_one_agent_does_not_block_dispatches_on_another() {
    let name = "a_slow_pass_enter_on_one_agent_does_not_block_dispatches_on_another";
    if in_child(name) {
        return two_agents_child();
    }
    let (problems, run) = run_scenario(name, &["slow_callback.c"], &[], Duration::from_secs(60));
    assert!(
        problems.is_empty(),
        "problems: {problems:#?}\n{}",
        run.report()
    );
}
