//! C tools: the documented callback flow (docs/abi.md §2: pass-count table,
//! callback flow, CONFIG EXIT fields, user_data, correlation ids, threads, payload sizes and
//! "every field that does not apply set to zero") held against what a C tool really receives.

mod common;
#[path = "c_probe_tools/harness.rs"]
mod harness;

use std::path::Path;
use std::time::Duration;

use harness::*;
use kreplay_softhsa::OwnedApiTable;
use kreplay_softhsa::testing::Hsa;

const DEADLINE: Duration = Duration::from_secs(120);
const NONE: u64 = u64::MAX;

#[repr(C)]
#[derive(Clone, Copy, Debug)]
struct Ev {
    dispatch_id: u64,
    kind: u32,
    operation: u32,
    phase: u32,
    outcome: u32,
    current_pass: u64,
    total_passes: u64,
    end_reason: u32,
    status: i32,
    payload_decline: u32,
    record_decline: u32,
    passes_run: u64,
    correlation_id: u64,
    size: u64,
    user_ok: u32,
    ctx_ok: u32,
    tid_ok: u32,
    toggles_set: u32,
    bytes_planned: u64,
    bytes_moved: u64,
    chunks_restored: u64,
    regions: u64,
    tier: u32,
    strategy: u32,
    source_bytes: u64,
}

/// What the contract says one answer gives.
struct Expect {
    replayed: Option<(u64, u64)>, // (passes, total_passes reported)
    continue_calls: Vec<(u64, u64)>,
    pass_count_calls: usize,
    outcome: u32,
    end: u32,
    status: i32,
    decline: u32,
    passes_run: u64,
}

thread_local! {
    /// Restores (by the pass whose writes they undid) that said `unverified`, of the dispatch
    /// being checked.
    static UNVERIFIED: std::cell::RefCell<Vec<u64>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Was the restore before pass `k` unverified?
fn unverified_before(k: u64) -> bool {
    k > 0 && UNVERIFIED.with(|u| u.borrow().contains(&(k - 1)))
}

fn expect(answer: &str, max: u64) -> Expect {
    let once = |outcome, status, decline, calls| Expect {
        replayed: None,
        continue_calls: vec![],
        pass_count_calls: calls,
        outcome,
        end: 0,
        status,
        decline,
        passes_run: 1,
    };
    let replay = |passes: u64, total: u64, calls: Vec<(u64, u64)>, outcome: u32, end: u32| Expect {
        replayed: Some((passes, total)),
        continue_calls: calls,
        pass_count_calls: 1,
        outcome,
        end,
        status: 0,
        decline: 0,
        passes_run: passes,
    };
    let num = |s: &str| s.parse::<u64>().unwrap();
    match answer {
        "opt" => once(2, 0, 0, 0),
        "p1" => once(2, 0, 0, 1),
        "z" | "big" => once(3, 9, 8, 1),
        "inf" => replay(max, 0, (0..max - 1).map(|c| (c, 0)).collect(), 4, 4),
        a if a.starts_with("ind") => {
            let k = num(&a[3..]);
            replay(k + 1, 0, (0..=k).map(|c| (c, 0)).collect(), 1, 2)
        }
        a if a.starts_with("clr") => {
            let k = num(&a[3..]);
            replay(k + 1, 0, (0..k).map(|c| (c, 0)).collect(), 1, 3)
        }
        a if a.starts_with("set") => {
            // Asked right after the PASS EXIT that set it, or after the next pass when the
            // restore before that pass was unverified (docs/abi.md §2); see `unverified_before`.
            let (n, k) = match a[3..].split_once('k') {
                Some((n, k)) => (num(n), num(k)),
                None => (num(&a[3..]), 0),
            };
            let asked = k + u64::from(unverified_before(k));
            if asked + 1 >= n {
                // Never consulted after the last of N passes.
                replay(n, n, vec![], 1, 1)
            } else {
                replay(asked + 1, n, vec![(asked, n)], 1, 2)
            }
        }
        a if a.starts_with('n') && a.contains('s') => {
            let (n, k) = a[1..].split_once('s').unwrap();
            let (n, k) = (num(n), num(k));
            let passes = n.min(k + 1);
            let calls = (0..passes).filter(|&c| c + 1 < n).map(|c| (c, n)).collect();
            replay(passes, n, calls, 1, if k + 1 < n { 2 } else { 1 })
        }
        a if a.starts_with('n') => replay(num(&a[1..]), num(&a[1..]), vec![], 1, 1),
        other => panic!("unknown answer {other}"),
    }
}

/// (kind, operation, phase, current_pass) of every record of one dispatch, in order.
fn expected_flow(e: &Expect) -> Vec<(u32, u32, u32, u64)> {
    let mut v = vec![(2, 1, 1, 0)];
    match e.replayed {
        None => {
            // kreplay delivers CONFIG EXIT of a dispatch that runs once before it runs (its
            // ENQUEUE and COMPLETE follow); docs/abi.md only orders a replayed dispatch's
            // records, so this order is taken as given.
            v.push((2, 1, 2, 1));
            v.extend([(1, 1, 1, NONE), (1, 1, 2, NONE), (1, 2, 0, NONE)]);
        }
        Some((passes, _)) => {
            v.extend([(2, 3, 1, 0), (2, 3, 2, 0)]);
            for i in 0..passes {
                v.extend([
                    (2, 2, 1, i),
                    (1, 1, 1, i),
                    (1, 1, 2, i),
                    (1, 2, 0, i),
                    (2, 2, 2, i),
                ]);
                if i + 1 < passes {
                    v.extend([(2, 4, 1, i), (2, 4, 2, i)]);
                }
            }
            v.push((2, 1, 2, passes));
        }
    }
    v
}

fn check(plan: &[&str], max: u64, events: &[Ev]) -> Vec<String> {
    let mut problems = Vec::new();
    for (i, answer) in plan.iter().enumerate() {
        let id = i as u64 + 1;
        let mine: Vec<&Ev> = events.iter().filter(|ev| ev.dispatch_id == id).collect();
        UNVERIFIED.with(|u| {
            *u.borrow_mut() = mine
                .iter()
                .filter(|ev| ev.kind == 2 && ev.operation == 4 && ev.phase == 2 && ev.outcome == 1)
                .map(|ev| ev.current_pass)
                .collect()
        });
        let e = expect(answer, max);
        let flow: Vec<(u32, u32, u32, u64)> = mine
            .iter()
            .filter(|ev| ev.kind <= 2)
            .map(|ev| (ev.kind, ev.operation, ev.phase, ev.current_pass))
            .collect();
        let want = expected_flow(&e);
        if flow != want {
            problems.push(format!(
                "dispatch {id} ({answer}): flow (kind, op, phase, pass)\n  got  {flow:?}\n  want {want:?}"
            ));
        }
        let calls: Vec<(u64, u64)> = mine
            .iter()
            .filter(|ev| ev.kind == 100)
            .map(|ev| (ev.current_pass, ev.total_passes))
            .collect();
        if calls != e.continue_calls {
            problems.push(format!(
                "dispatch {id} ({answer}): continue calls (current, total) {calls:?}, want {:?}",
                e.continue_calls
            ));
        }
        let pc = mine.iter().filter(|ev| ev.kind == 101).count();
        if pc != e.pass_count_calls {
            problems.push(format!(
                "dispatch {id} ({answer}): {pc} pass-count calls, want {}",
                e.pass_count_calls
            ));
        }
        if let Some(x) = mine
            .iter()
            .find(|ev| ev.kind == 2 && ev.operation == 1 && ev.phase == 2)
        {
            let got = (
                x.outcome,
                x.end_reason,
                x.status,
                x.payload_decline,
                x.passes_run,
                x.current_pass,
            );
            let want = (
                e.outcome,
                e.end,
                e.status,
                e.decline,
                e.passes_run,
                e.passes_run,
            );
            if got != want {
                problems.push(format!(
                    "dispatch {id} ({answer}): CONFIG EXIT (outcome, end, status, decline, passes_run, current_pass) {got:?}, want {want:?}"
                ));
            }
            let record_decline = if e.outcome == 3 { e.decline } else { 0 };
            if x.record_decline != record_decline {
                problems.push(format!(
                    "dispatch {id} ({answer}): CONFIG EXIT record.decline_reason {}, want {record_decline}",
                    x.record_decline
                ));
            }
        }
        let replay: Vec<&&Ev> = mine.iter().filter(|ev| ev.kind == 2).collect();
        let strategies: std::collections::BTreeSet<(u32, u32, u32)> = replay
            .iter()
            .filter(|ev| ev.operation == 3 || ev.operation == 4)
            .map(|ev| (ev.operation, ev.phase, ev.strategy))
            .collect();
        let distinct: std::collections::BTreeSet<u32> = strategies.iter().map(|s| s.2).collect();
        let check_strategy = std::env::var_os("PROBE_CHECK_STRATEGY").is_some();
        // SNAPSHOT ENTER may leave the strategy unset (0, "does not apply"); any value it does
        // give must be the one the replay's restores use.
        let distinct: std::collections::BTreeSet<u32> =
            distinct.into_iter().filter(|&s| s != 0).collect();
        if check_strategy && distinct.len() > 1 {
            problems.push(format!(
                "dispatch {id} ({answer}): SNAPSHOT/RESTORE records of one replay name different restore strategies (operation, phase, strategy): {strategies:?}"
            ));
        }
        let corr: std::collections::BTreeSet<u64> =
            replay.iter().map(|ev| ev.correlation_id).collect();
        if corr.len() != 1 {
            problems.push(format!(
                "dispatch {id} ({answer}): replay records carry correlation ids {corr:?}"
            ));
        }
        for ev in &mine {
            let what = format!(
                "dispatch {id} ({answer}) kind {} op {} phase {} pass {}",
                ev.kind, ev.operation, ev.phase, ev.current_pass as i64
            );
            if ev.user_ok == 0 {
                problems.push(format!("{what}: user_data is not what CONFIG ENTER stored"));
            }
            if ev.kind <= 2 && ev.ctx_ok == 0 {
                problems.push(format!(
                    "{what}: record.context_id is not the service's context"
                ));
            }
            if ev.kind == 2 && ev.tid_ok == 0 {
                problems.push(format!(
                    "{what}: not on the thread that submitted the dispatch"
                ));
            }
            let size = match (ev.kind, ev.operation) {
                (1, _) => 160,
                (2, 1 | 2) => 216,
                (2, _) => 280,
                _ => ev.size,
            };
            if ev.size != size {
                problems.push(format!("{what}: payload size {}, want {size}", ev.size));
            }
            if ev.kind == 2 && (ev.operation == 3 || ev.operation == 4) {
                let enter = ev.phase == 1;
                // "every field that does not apply set to zero": bytes_moved and chunks_restored
                // are EXIT fields; chunks_restored is a RESTORE field.
                if enter && (ev.bytes_moved != 0 || ev.chunks_restored != 0) {
                    problems.push(format!(
                        "{what}: ENTER carries bytes_moved {} chunks_restored {}",
                        ev.bytes_moved, ev.chunks_restored
                    ));
                }
                if ev.operation == 3 && ev.chunks_restored != 0 {
                    problems.push(format!(
                        "{what}: SNAPSHOT carries chunks_restored {}",
                        ev.chunks_restored
                    ));
                }
                // SNAPSHOT ENTER comes before a store and a strategy are chosen: its tier and
                // strategy may be NONE.
                let tier_ok = (ev.tier > 0 || (ev.operation == 3 && enter)) && ev.tier < 5;
                let strategy_ok =
                    (ev.strategy > 0 || (ev.operation == 3 && enter)) && ev.strategy < 4;
                if ev.bytes_planned == 0 || ev.regions == 0 || !tier_ok || !strategy_ok {
                    problems.push(format!(
                        "{what}: bytes_planned {} regions {} tier {} strategy {}",
                        ev.bytes_planned, ev.regions, ev.tier, ev.strategy
                    ));
                }
                if ev.operation == 3
                    && !enter
                    && (ev.bytes_moved != ev.bytes_planned || ev.source_bytes != ev.bytes_moved)
                {
                    problems.push(format!(
                        "{what}: SNAPSHOT EXIT moved {} of {} planned, sources add up to {}",
                        ev.bytes_moved, ev.bytes_planned, ev.source_bytes
                    ));
                }
                if ev.operation == 4 && !enter && ev.bytes_moved > ev.bytes_planned {
                    problems.push(format!(
                        "{what}: RESTORE EXIT moved {} > planned {}",
                        ev.bytes_moved, ev.bytes_planned
                    ));
                }
                if ev.operation == 4 && !enter && (ev.bytes_moved > 0) != (ev.chunks_restored > 0) {
                    problems.push(format!(
                        "{what}: RESTORE EXIT moved {} bytes in {} chunks",
                        ev.bytes_moved, ev.chunks_restored
                    ));
                }
            }
            if ev.kind == 2 && (ev.operation == 1 || ev.operation == 2) {
                let pass_enter = ev.operation == 2 && ev.phase == 1;
                if (ev.toggles_set == 2) != pass_enter {
                    problems.push(format!("{what}: {} toggle pointer(s) set", ev.toggles_set));
                }
                let config_exit = ev.operation == 1 && ev.phase == 2;
                if !config_exit
                    && (
                        ev.outcome,
                        ev.end_reason,
                        ev.status,
                        ev.payload_decline,
                        ev.passes_run,
                    ) != (0, 0, 0, 0, 0)
                {
                    problems.push(format!("{what}: CONFIG EXIT fields set on another record"));
                }
                if ev.operation == 2 {
                    let total = e.replayed.map_or(0, |r| r.1);
                    if ev.total_passes != total {
                        problems.push(format!(
                            "{what}: total_passes {}, want {total}",
                            ev.total_passes
                        ));
                    }
                }
            }
        }
    }
    problems
}

fn contract_child(plan: &[&str]) {
    let mut table = OwnedApiTable::softhsa();
    let loaded = load_kreplay(&mut table);
    let tool = std::env::var("KREPLAY_TOOL_LIBRARIES").unwrap();
    // SAFETY: the tool is loaded; these accessors are defined in contract.c.
    let lib = unsafe { libloading::Library::new(&tool) }.unwrap();
    let mut problems = Vec::new();
    // SAFETY: as above.
    unsafe {
        lib.get::<unsafe extern "C" fn()>(b"probe_set_app_thread\0")
            .unwrap()()
    };
    {
        // SAFETY: the table stays alive while `hsa` is used.
        let hsa = unsafe { Hsa::from_table(table.table()) };
        let session = hsa.init().expect("hsa_init");
        let mut app = App::new(&hsa, 0, 1);
        for _ in plan {
            problems.extend(app.round());
        }
        problems.extend(app.check());
        drop(session);
    }
    // SAFETY: the runtime's shutdown call.
    unsafe { (loaded.on_unload)() };
    // SAFETY: accessors of contract.c; every dispatch completed.
    let events: Vec<Ev> = unsafe {
        let n = lib
            .get::<unsafe extern "C" fn() -> usize>(b"probe_event_count\0")
            .unwrap()();
        let p = lib
            .get::<unsafe extern "C" fn() -> *const Ev>(b"probe_events\0")
            .unwrap()();
        std::slice::from_raw_parts(p, n).to_vec()
    };
    let max = std::env::var("PROBE_MAX")
        .ok()
        .map_or(1024, |m| m.parse().unwrap());
    problems.extend(check(plan, max, &events));
    // kreplay_get_counters "returns the same information added up over the process".
    let mut counters = [0u64; 30];
    counters[0] = 240;
    // SAFETY: 240 writable bytes, size set.
    let status = unsafe {
        loaded
            .library
            .get::<unsafe extern "C" fn(*mut u64) -> i32>(b"kreplay_get_counters\0")
            .unwrap()(counters.as_mut_ptr())
    };
    let exits: Vec<&Ev> = events
        .iter()
        .filter(|e| e.kind == 2 && e.operation == 1 && e.phase == 2)
        .collect();
    let count = |o: u32| exits.iter().filter(|e| e.outcome == o).count() as u64;
    let passes: u64 = exits
        .iter()
        .filter(|e| e.outcome == 1 || e.outcome == 4)
        .map(|e| e.passes_run)
        .sum();
    let got = (
        status,
        counters[0],
        counters[1],
        counters[2],
        counters[3],
        counters[4],
        counters[5],
        counters[6],
        counters[14 + 8],
    );
    let want = (
        0,
        240,
        exits.len() as u64,
        count(1) + count(4),
        passes,
        count(2),
        count(3),
        count(4),
        exits
            .iter()
            .filter(|e| e.outcome == 3 && e.payload_decline == 8)
            .count() as u64,
    );
    if got != want {
        problems.push(format!("kreplay_get_counters (status, size, dispatches, replays, passes, ran_once, declines, ended_early, declines[invalid_pass_count]) {got:?}, want {want:?} from the CONFIG EXITs"));
    }
    for p in &problems {
        println!("TOOL-PROBLEM: {}", p.replace('\n', " | "));
    }
    println!("PROBE-DONE");
    let _ = Path::new("");
}

fn run_plan(name: &str, plan: &[&str], extra: &[(&str, &str)]) {
    let joined = plan.join(",");
    let mut env: Vec<(&str, &str)> = vec![("PROBE_PLAN", joined.as_str())];
    env.extend_from_slice(extra);
    let (problems, run) = run_scenario(name, &["contract.c"], &env, DEADLINE);
    assert!(
        problems.is_empty(),
        "problems:\n{}\n{}",
        problems.join("\n"),
        run.report()
    );
}

const PLAN: &[&str] = &[
    "opt", "p1", "z", "n3", "n4s1", "ind2", "clr1", "set3", "inf", "big", "n2s5",
];

#[test]
fn a_decline_decided_before_the_snapshot_reaches_the_tool_at_config_exit_alone() {
    let name = "a_decline_decided_before_the_snapshot_reaches_the_tool_at_config_exit_alone";
    if in_child(name) {
        return standard_child(2, 2);
    }
    let (problems, run) = run_scenario(
        name,
        &["decline_records.c"],
        &[("KREPLAY_MAX_SNAPSHOT_BYTES", "1")],
        DEADLINE,
    );
    assert!(problems.is_empty(), "{problems:#?}\n{}", run.report());
}

#[test]
fn a_dispatch_that_runs_once_gets_its_dispatch_records_after_its_config_exit() {
    let name = "a_dispatch_that_runs_once_gets_its_dispatch_records_after_its_config_exit";
    if in_child(name) {
        return standard_child(2, 2);
    }
    let (problems, run) = run_scenario(name, &["once_order.c"], &[], DEADLINE);
    assert!(problems.is_empty(), "{problems:#?}\n{}", run.report());
}

#[test]
fn counter_functions_in_initialize_say_that_no_runtime_is_loaded_yet() {
    let name = "counter_functions_in_initialize_say_that_no_runtime_is_loaded_yet";
    if in_child(name) {
        return standard_child(1, 1);
    }
    let (problems, run) = run_scenario(name, &["counters_in_initialize.c"], &[], DEADLINE);
    assert!(problems.is_empty(), "{problems:#?}\n{}", run.report());
}

#[test]
fn the_pass_count_table_and_callback_flow_hold_for_every_answer() {
    let name = "the_pass_count_table_and_callback_flow_hold_for_every_answer";
    if in_child(name) {
        return contract_child(PLAN);
    }
    run_plan(
        name,
        PLAN,
        &[("PROBE_MAX", "5"), ("KREPLAY_MAX_PASSES", "5")],
    );
}

const UNVERIFIED_PLAN: &[&str] = &["set5k1", "set5k2", "set5k3", "n5s2", "ind3", "n4"];

#[test]
fn a_continue_callback_set_at_pass_exit_is_asked_as_documented_with_unverified_restores() {
    let name =
        "a_continue_callback_set_at_pass_exit_is_asked_as_documented_with_unverified_restores";
    if in_child(name) {
        return contract_child(UNVERIFIED_PLAN);
    }
    run_plan(
        name,
        UNVERIFIED_PLAN,
        &[("KREPLAY_RESTORE", "writeset-unverified")],
    );
}

#[test]
fn a_continue_callback_set_at_pass_exit_is_asked_right_after_it() {
    let name = "a_continue_callback_set_at_pass_exit_is_asked_right_after_it";
    if in_child(name) {
        return contract_child(UNVERIFIED_PLAN);
    }
    run_plan(name, UNVERIFIED_PLAN, &[]);
}

#[test]
fn snapshot_enter_names_the_restore_strategy_the_restores_use_or_none() {
    let name = "snapshot_enter_names_the_restore_strategy_the_restores_use_or_none";
    let plan = &["n3"];
    if in_child(name) {
        return contract_child(plan);
    }
    run_plan(
        name,
        plan,
        &[("KREPLAY_RESTORE", "hash"), ("PROBE_CHECK_STRATEGY", "1")],
    );
}
