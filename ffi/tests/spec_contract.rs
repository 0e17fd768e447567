//! SPEC §2 (payloads, pass-count table, callback flow, localized context control) and §5
//! (configuration) held statement by statement against C tools loaded as ROCm loads them, on the
//! software runtime (the harness of tests/c_probe_tools; the tools are tests/c_probe_tools/spec_*.c
//! and, for the pass-count answers, contract.c). Each test runs in a child process of its own.
//!
//! The payload tests also cover tools that do what the header does not ask of them: kreplay fills
//! in `size`, `dispatch_info` ("always set"; one `dispatch_id` for every pass), the pass indices
//! and "every field that does not apply set to zero"; a tool sets only `replay_pass_count` and
//! `replay_continue`. What a tool writes elsewhere in one record must not reach the next record,
//! another service's record, or the pass-count and continue callbacks.

mod common;
#[path = "c_probe_tools/harness.rs"]
mod harness;

use std::time::Duration;

use harness::*;

const DEADLINE: Duration = Duration::from_secs(120);

#[test]
fn what_a_tool_scribbles_over_a_payload_never_reaches_another_record_or_callback() {
    let name = "what_a_tool_scribbles_over_a_payload_never_reaches_another_record_or_callback";
    if in_child(name) {
        return standard_child(2, 2);
    }
    let (problems, run) = run_scenario(name, &["spec_scribble.c"], &[], DEADLINE);
    assert!(problems.is_empty(), "{problems:#?}\n{}", run.report());
}

/// SPEC §2 "Localized context control", every statement through the C ABI in a real replay
/// (see tests/c_probe_tools/spec_toggles.c): refused outside PASS ENTER wherever a tool may call
/// them, CONTEXT_NOT_STARTED for any context not started when the replay began, sticky across
/// passes, reset at the end of the dispatch, never changing global state, and the owner keeps its
/// records when it masks itself.
#[test]
fn context_toggles_behave_as_spec_says_in_every_callback_of_a_real_replay() {
    let name = "context_toggles_behave_as_spec_says_in_every_callback_of_a_real_replay";
    if in_child(name) {
        return standard_child(2, 2);
    }
    let (problems, run) = run_scenario(name, &["spec_toggles.c"], &[], DEADLINE);
    assert!(problems.is_empty(), "{problems:#?}\n{}", run.report());
}

/// SPEC §2 pass-count table: "returns 0 | NULL: invalid: a clear diagnostic" and "N >
/// KREPLAY_MAX_PASSES: invalid (`invalid_pass_count`), the diagnostic names the cap". The
/// diagnostics reach stderr (at the default log level) besides CONFIG EXIT.
#[test]
fn invalid_pass_counts_get_a_diagnostic_naming_the_cap_or_the_missing_continue() {
    let name = "invalid_pass_counts_get_a_diagnostic_naming_the_cap_or_the_missing_continue";
    if in_child(name) {
        return standard_child(1, 2);
    }
    let (problems, run) = run_scenario(
        name,
        &["contract.c"],
        &[
            ("PROBE_PLAN", "z,big"),
            ("PROBE_MAX", "7"),
            ("KREPLAY_MAX_PASSES", "7"),
        ],
        DEADLINE,
    );
    assert!(problems.is_empty(), "{problems:#?}\n{}", run.report());
    let lines: Vec<&str> = run.stderr.lines().collect();
    assert!(
        lines
            .iter()
            .any(|l| l.contains("returned 0") && l.contains("replay_continue")),
        "no diagnostic for 0 passes without a continue callback:\n{}",
        run.stderr
    );
    assert!(
        lines.iter().any(|l| l.contains("returned 8")
            && l.contains("7")
            && l.contains("KREPLAY_MAX_PASSES")),
        "no diagnostic naming the cap for 8 passes above KREPLAY_MAX_PASSES=7:\n{}",
        run.stderr
    );
}

/// SPEC §5: "A malformed value is a clear startup error naming the variable, never a silent
/// default": every variable of §5, at and past its bounds, refuses the load itself (OnLoad returns
/// false, saying which variable and value on stderr) before any tool is configured.
#[test]
fn every_malformed_spec_variable_refuses_the_load_naming_itself() {
    const BASE: &str = "every_malformed_spec_variable_refuses_the_load_naming_itself";
    if let Ok(which) = std::env::var("SPEC_BAD_VARIABLE")
        && in_child(BASE)
    {
        let mut table = kreplay_softhsa::OwnedApiTable::softhsa();
        let loaded = load_kreplay(&mut table);
        println!("SPEC-LOADED={} ({which})", loaded.loaded);
        println!("PROBE-DONE");
        return;
    }
    let cases = [
        ("KREPLAY_MAX_SNAPSHOT_BYTES", "18446744073709551616"),
        ("KREPLAY_MAX_SNAPSHOT_BYTES", "-1"),
        ("KREPLAY_DRAIN_TIMEOUT_MS", "0"),
        ("KREPLAY_DRAIN_TIMEOUT_MS", "18446744073709551616"),
        ("KREPLAY_SNAPSHOT_STORE", "gpu"),
        ("KREPLAY_RESTORE", "fast"),
        ("KREPLAY_SPILL_DIR", ""),
        ("KREPLAY_LOG", "trace"),
        ("KREPLAY_MAX_PASSES", "0"),
        ("KREPLAY_MAX_PASSES", "18446744073709551616"),
        ("KREPLAY_SNAPSHOT_SCOPE", "all"),
    ];
    let tool = build_tool("contract.c", BASE);
    for (variable, value) in cases {
        let (problems, run) = run_tools(
            BASE,
            std::slice::from_ref(&tool),
            &[(variable, value), ("SPEC_BAD_VARIABLE", variable)],
            DEADLINE,
        );
        assert!(problems.is_empty(), "{problems:#?}\n{}", run.report());
        assert!(
            run.stdout.contains("SPEC-LOADED=false"),
            "{variable}={value:?} did not refuse the load\n{}",
            run.report()
        );
        assert!(
            run.stderr.contains(variable) && run.stderr.contains(&format!("{value:?}")),
            "{variable}={value:?}: stderr does not name the variable and its value\n{}",
            run.report()
        );
    }
}

/// SPEC §2 callback flow: "CONFIG EXIT; fire the application's completion signal once". The
/// application's completion is unfired in every record of a replayed dispatch (CONFIG EXIT
/// included) and of one that runs once, and fires exactly once after; `dispatch_info` describes
/// the packet the application submitted (agent, the queue's `id`, kernel object, sizes).
#[test]
fn the_application_completion_fires_once_after_config_exit() {
    let name = "the_application_completion_fires_once_after_config_exit";
    if !in_child(name) {
        let (problems, run) = run_scenario(name, &["spec_order.c"], &[], DEADLINE);
        assert!(problems.is_empty(), "{problems:#?}\n{}", run.report());
        return;
    }
    use kreplay_softhsa::testing::{Dispatch, Hsa};
    type Load = unsafe extern "C" fn(hsa_sys::hsa_signal_t) -> hsa_sys::hsa_signal_value_t;
    type Watch = unsafe extern "C" fn(hsa_sys::hsa_signal_t, Load);
    let mut table = kreplay_softhsa::OwnedApiTable::softhsa();
    let loaded = load_kreplay(&mut table);
    let tool = std::env::var("KREPLAY_TOOL_LIBRARIES").unwrap();
    let mut problems = Vec::new();
    {
        // SAFETY: the table stays alive and valid while `hsa` is used.
        let hsa = unsafe { Hsa::from_table(table.table()) };
        let session = hsa.init().expect("hsa_init");
        // SAFETY: the tool is already loaded by kreplay; `spec_watch` has this signature.
        let lib = unsafe { libloading::Library::new(&tool) }.unwrap();
        // SAFETY: as above.
        let watch = unsafe { *lib.get::<Watch>(b"spec_watch\0").unwrap() };
        // SAFETY: the table's core table is valid while `table` lives.
        let load: Load = unsafe { (*table.table().core_).hsa_signal_load_scacquire_fn }
            .expect("hsa_signal_load_scacquire");
        let app = App::new(&hsa, 0, 1);
        type Expect = unsafe extern "C" fn(u64, u64, u64, u32, u32, u32, u32);
        // SAFETY: `spec_expect` has this signature in spec_order.c.
        let expect = unsafe { *lib.get::<Expect>(b"spec_expect\0").unwrap() };
        // SAFETY: the queue is live.
        let queue_id = unsafe { (*app.queue).id };
        // SAFETY: plain values. The packets below: ELEMENTS work-items in groups of 64, no
        // private or group segment.
        unsafe {
            expect(
                app.agent.handle,
                queue_id,
                app.kernel,
                ELEMENTS as u32,
                64,
                0,
                0,
            )
        };
        for round in 0..4u32 {
            let args = hsa
                .allocate(app.kernarg_pool, std::mem::size_of::<AddOneArgs>())
                .expect("kernargs")
                .cast::<AddOneArgs>();
            // SAFETY: the kernarg allocation holds one AddOneArgs.
            unsafe {
                args.write(AddOneArgs {
                    data: app.buffers[0].0,
                    len: ELEMENTS as u32,
                })
            };
            let done = hsa.signal_create(1).expect("signal");
            // SAFETY: `load` is the runtime's, callable with any signal it created.
            unsafe { watch(done, load) };
            // SAFETY: live queue, registered kernel, valid kernargs.
            unsafe {
                hsa.dispatch(
                    app.queue,
                    &Dispatch::linear(app.kernel, ELEMENTS as u32, 64, args.cast(), done),
                )
            };
            if !hsa.wait_zero(done, Duration::from_secs(20)) {
                problems.push(format!("round {round}: no completion within 20 s"));
            }
            std::thread::sleep(Duration::from_millis(5));
            let v = hsa.signal_load(done);
            if v != 0 {
                problems.push(format!("round {round}: completion signal is {v}, not 0"));
            }
        }
        let mut app = app;
        app.rounds_done = 4;
        problems.extend(app.check());
        drop(session);
    }
    // SAFETY: the runtime's shutdown call.
    unsafe { (loaded.on_unload)() };
    let r = tool_report(std::path::Path::new(&tool));
    if !r.is_empty() {
        problems.push(r);
    }
    for p in &problems {
        println!("TOOL-PROBLEM: {p}");
    }
    println!("PROBE-DONE");
}

/// SPEC §2: "no pass-count environment variable: the tool derives N". KREPLAY_PASSES (the built-in
/// tool's passes, for processes without a tool) must not replay a dispatch the owning tool opted
/// out of or answered 1 for: every such dispatch runs once, its records carry no pass.
#[test]
fn the_built_in_pass_count_never_overrides_a_tool_that_owns_kernel_replay() {
    let name = "the_built_in_pass_count_never_overrides_a_tool_that_owns_kernel_replay";
    if in_child(name) {
        return standard_child(2, 2);
    }
    let (problems, run) = run_scenario(
        name,
        &["once_order.c"],
        &[("KREPLAY_PASSES", "3")],
        DEADLINE,
    );
    assert!(problems.is_empty(), "{problems:#?}\n{}", run.report());
}

/// SPEC §5 at the upper bounds: the largest value every numeric variable accepts (the snapshot
/// budget, the drain timeout, the cap on passes, the replay time budget) is a working setting,
/// not an overflow: fixed, stopped-early and indefinite replays run as with the defaults.
#[test]
fn every_numeric_setting_at_its_largest_value_still_replays() {
    let name = "every_numeric_setting_at_its_largest_value_still_replays";
    if in_child(name) {
        return standard_child(2, 3);
    }
    const MAX: &str = "18446744073709551615";
    let (problems, run) = run_scenario(
        name,
        &["spec_scribble.c"],
        &[
            ("KREPLAY_MAX_SNAPSHOT_BYTES", MAX),
            ("KREPLAY_DRAIN_TIMEOUT_MS", MAX),
            ("KREPLAY_MAX_PASSES", MAX),
            ("KREPLAY_REPLAY_BUDGET_MS", MAX),
        ],
        DEADLINE,
    );
    assert!(problems.is_empty(), "{problems:#?}\n{}", run.report());
}

/// SPEC §5 `KREPLAY_LOG=off`: the invalid pass counts that print a diagnostic at the default level
/// print nothing, while the tool still learns the decline at CONFIG EXIT (the contract tool's
/// plan runs to its end without a problem).
#[test]
fn kreplay_log_off_silences_the_pass_count_diagnostics() {
    let name = "kreplay_log_off_silences_the_pass_count_diagnostics";
    if in_child(name) {
        return standard_child(1, 2);
    }
    let (problems, run) = run_scenario(
        name,
        &["contract.c"],
        &[
            ("PROBE_PLAN", "z,big"),
            ("PROBE_MAX", "7"),
            ("KREPLAY_MAX_PASSES", "7"),
            ("KREPLAY_LOG", "off"),
        ],
        DEADLINE,
    );
    assert!(problems.is_empty(), "{problems:#?}\n{}", run.report());
    assert!(
        !run.stderr.contains("kreplay:"),
        "KREPLAY_LOG=off printed:\n{}",
        run.stderr
    );
}

/// kreplay.h: the PASS ENTER toggles "only mask the current dispatch". A dispatch the tool submits
/// from PASS ENTER after masking its tracer off is another dispatch: it reaches the tracer whole
/// (ENQUEUE ENTER, EXIT and COMPLETE), while the masked replay's passes reach it not at all.
#[test]
fn a_mask_set_at_pass_enter_does_not_mask_the_tools_own_dispatch_from_that_callback() {
    let name = "a_mask_set_at_pass_enter_does_not_mask_the_tools_own_dispatch_from_that_callback";
    if in_child(name) {
        return standard_child_with_gpu(1, 2);
    }
    let (problems, run) = run_scenario(name, &["spec_reentrant_mask.c"], &[], DEADLINE);
    assert!(problems.is_empty(), "{problems:#?}\n{}", run.report());
}

/// SPEC §2 callback tracing service: the KERNEL_REPLAY owner's operation list filters its
/// records, not the replay: {CONFIG, PASS} replays as answered without SNAPSHOT or RESTORE
/// records, the PASS ENTER toggles still working (tests/c_probe_tools/spec_filter.c).
#[test]
fn a_replay_owner_listing_config_and_pass_replays_without_memory_records() {
    let name = "a_replay_owner_listing_config_and_pass_replays_without_memory_records";
    if in_child(name) {
        return standard_child(2, 2);
    }
    let (problems, run) = run_scenario(
        name,
        &["spec_filter.c"],
        &[("SPEC_FILTER", "config_pass")],
        DEADLINE,
    );
    assert!(problems.is_empty(), "{problems:#?}\n{}", run.report());
}

/// A KERNEL_REPLAY owner that lists PASS alone never sees CONFIG ENTER, so never answers: every
/// dispatch runs once, with no record to the owner.
#[test]
fn a_replay_owner_listing_pass_alone_never_replays() {
    let name = "a_replay_owner_listing_pass_alone_never_replays";
    if in_child(name) {
        return standard_child(2, 2);
    }
    let (problems, run) = run_scenario(
        name,
        &["spec_filter.c"],
        &[("SPEC_FILTER", "pass_only")],
        DEADLINE,
    );
    assert!(problems.is_empty(), "{problems:#?}\n{}", run.report());
}

/// SPEC §5 `KREPLAY_MAX_PASSES` at its lower bound, 1: every answer (an indefinite loop, which
/// then runs its one pass, more than one pass, one pass, no pass-count callback) leaves the
/// application's data as single runs would, every completion firing once.
#[test]
fn a_cap_of_one_pass_leaves_every_answer_with_single_run_results() {
    let name = "a_cap_of_one_pass_leaves_every_answer_with_single_run_results";
    if in_child(name) {
        return standard_child(1, 6);
    }
    let (problems, run) = run_scenario(
        name,
        &["contract.c"],
        &[
            ("PROBE_PLAN", "inf,n2,p1,opt,ind0,big"),
            ("PROBE_MAX", "1"),
            ("KREPLAY_MAX_PASSES", "1"),
        ],
        DEADLINE,
    );
    assert!(problems.is_empty(), "{problems:#?}\n{}", run.report());
}

/// SPEC §5 `KREPLAY_SNAPSHOT_STORE`, `KREPLAY_RESTORE` and `KREPLAY_SNAPSHOT_SCOPE` as a C tool
/// sees them (SNAPSHOT and RESTORE EXIT): the scope decides where the snapshot's regions come
/// from (the agent's memory, or only what the arguments reference), each explicit store is the tier of every snapshot and restore, each explicit
/// strategy that of every restore (`writeset-unverified` and `tracked` are WRITESET; only the
/// first says `unverified`, never before the last pass), and the application's data is as single
/// runs leave it.
#[test]
fn each_store_and_restore_setting_is_what_the_memory_records_report() {
    const BASE: &str = "each_store_and_restore_setting_is_what_the_memory_records_report";
    if in_child(BASE) {
        return standard_child(2, 2);
    }
    let tool = build_tool("spec_tiers.c", BASE);
    let mut problems = Vec::new();
    for (store, tier) in [("device", "1"), ("host", "2"), ("file", "3")] {
        // The file tier spills the scenario's few KiB to the system temporary directory.
        if store == "file" && !common::spill_room(&std::env::temp_dir(), 16 << 20) {
            continue;
        }
        for (restore, strategy, unverified) in [
            ("full", "1", "0"),
            ("hash", "2", "0"),
            ("writeset", "3", "0"),
            ("writeset-unverified", "3", "1"),
            ("tracked", "3", "0"),
        ] {
            // The two scopes alternate: every store and strategy meets each.
            let scope = if restore.len() % 2 == 0 {
                "agent"
            } else {
                "referenced"
            };
            let (found, run) = run_tools(
                BASE,
                std::slice::from_ref(&tool),
                &[
                    ("KREPLAY_SNAPSHOT_STORE", store),
                    ("KREPLAY_RESTORE", restore),
                    ("KREPLAY_SNAPSHOT_SCOPE", scope),
                    ("SPEC_SCOPE", scope),
                    ("SPEC_TIER", tier),
                    ("SPEC_STRATEGY", strategy),
                    ("SPEC_UNVERIFIED", unverified),
                ],
                DEADLINE,
            );
            if !found.is_empty() {
                problems.push(format!(
                    "{store}/{restore}/{scope}: {found:?}\n{}",
                    run.stderr
                ));
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}
