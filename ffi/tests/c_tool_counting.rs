//! C tools: dispatch counter collection the way a profiler sets it up lazily, from
//! inside its CONFIG ENTER callback. Each scenario runs in a child process.

mod common;
#[path = "c_probe_tools/harness.rs"]
mod harness;

use std::time::Duration;

use harness::*;

const DEADLINE: Duration = Duration::from_secs(60);

fn scenario(name: &str, mode: &str) {
    let (problems, run) = run_scenario(
        name,
        &["counting_lazy.c"],
        &[("PROBE_MODE", mode)],
        DEADLINE,
    );
    assert!(
        problems.is_empty(),
        "problems: {problems:#?}\n{}",
        run.report()
    );
}

#[test]
fn iterate_agent_counters_returns_what_its_callback_returned() {
    let name = "iterate_agent_counters_returns_what_its_callback_returned";
    if in_child(name) {
        return standard_child(1, 1);
    }
    scenario(name, "iterate_status");
}

#[test]
fn counter_functions_called_in_initialize_say_kreplay_is_not_loaded_yet() {
    let name = "counter_functions_called_in_initialize_say_kreplay_is_not_loaded_yet";
    if in_child(name) {
        return standard_child(1, 1);
    }
    scenario(name, "before_load");
}

#[test]
fn a_tool_planning_counters_lazily_in_config_enter_gets_every_counter_once_per_dispatch() {
    let name =
        "a_tool_planning_counters_lazily_in_config_enter_gets_every_counter_once_per_dispatch";
    if in_child(name) {
        return standard_child(2, 2);
    }
    scenario(name, "lazy_plan");
}

/// A counting service configured on a context the tool never starts counts nothing; kreplay
/// says so at initialization, as it does for kernel replay (it said nothing, and the tool
/// received no counter record without learning why).
#[test]
fn a_counting_service_on_a_context_never_started_is_warned_about() {
    let name = "a_counting_service_on_a_context_never_started_is_warned_about";
    if in_child(name) {
        return standard_child(1, 1);
    }
    let (problems, run) = run_scenario(
        name,
        &["counting_lazy.c"],
        &[("PROBE_MODE", "unstarted")],
        DEADLINE,
    );
    assert!(
        problems.is_empty(),
        "problems: {problems:#?}\n{}",
        run.report()
    );
    assert!(
        run.stderr
            .contains("configured dispatch counting on a context it has not started"),
        "{}",
        run.report()
    );
}

use libloading::os::unix::Symbol;

/// `kreplay_agent_counters_cb_t` (a counter info read as its six words).
type AgentCountersFn =
    unsafe extern "C" fn(u64, *const [u64; 6], usize, *mut std::ffi::c_void) -> i32;
/// `kreplay_iterate_agent_counters`.
type IterateFn = unsafe extern "C" fn(u64, Option<AgentCountersFn>, *mut std::ffi::c_void) -> i32;
/// `kreplay_create_counter_config`.
type CreateFn = unsafe extern "C" fn(u64, *const u64, usize, *mut u64) -> i32;
/// `kreplay_plan_counter_passes`.
type PlanFn = unsafe extern "C" fn(u64, *const u64, usize, *mut u32, *mut u64) -> i32;

/// The three counter functions as a tool calls them, through this build's libkreplay.
struct CounterCalls {
    iterate: Symbol<IterateFn>,
    create: Symbol<CreateFn>,
    plan: Symbol<PlanFn>,
}

/// Collects the ids of the counters listed (`user_data`: a `Vec<u64>`).
unsafe extern "C" fn collect_ids(
    _agent: u64,
    infos: *const [u64; 6],
    count: usize,
    user_data: *mut std::ffi::c_void,
) -> i32 {
    // SAFETY: kreplay passes `count` infos (48 bytes each; the id is the second word); the
    // caller passes its `Vec<u64>`.
    unsafe {
        let ids = &mut *user_data.cast::<Vec<u64>>();
        ids.extend(
            std::slice::from_raw_parts(infos, count)
                .iter()
                .map(|i| i[1]),
        );
    }
    0
}

impl CounterCalls {
    /// What each function answers for `agent` and `ids` (one counter that fits a pass): the
    /// statuses of iterate, plan and create, and the counters iterate listed.
    fn answers(&self, agent: u64, ids: &[u64]) -> ([i32; 3], Vec<u64>) {
        let mut listed: Vec<u64> = Vec::new();
        let (mut passes, mut config) = (0u64, 0u64);
        let mut pass_of = vec![0u32; ids.len()];
        // SAFETY: the header's signatures; every pointer is valid for the call.
        let statuses = unsafe {
            [
                (self.iterate)(agent, Some(collect_ids), (&raw mut listed).cast()),
                (self.plan)(
                    agent,
                    ids.as_ptr(),
                    ids.len(),
                    pass_of.as_mut_ptr(),
                    &mut passes,
                ),
                (self.create)(agent, ids.as_ptr(), ids.len(), &mut config),
            ]
        };
        (statuses, listed)
    }
}

/// The counter functions called by a tool after the application shut the runtime down (from
/// its finalize, a thread of its own, or an exit handler writing its report), then again after
/// OnUnload.
fn counters_after_shut_down_child() {
    let mut table = kreplay_softhsa::OwnedApiTable::softhsa();
    let loaded = load_kreplay(&mut table);
    // SAFETY: the header's signatures.
    let calls = unsafe {
        CounterCalls {
            iterate: loaded
                .library
                .get(b"kreplay_iterate_agent_counters\0")
                .unwrap(),
            create: loaded
                .library
                .get(b"kreplay_create_counter_config\0")
                .unwrap(),
            plan: loaded
                .library
                .get(b"kreplay_plan_counter_passes\0")
                .unwrap(),
        }
    };
    let mut problems = Vec::new();
    let agent;
    let first;
    let all;
    let never_asked;
    {
        // SAFETY: the table stays alive and valid while `hsa` is used.
        let hsa = unsafe { kreplay_softhsa::testing::Hsa::from_table(table.table()) };
        let session = hsa.init().expect("hsa_init");
        let mut app = App::new(&hsa, 0, 1);
        agent = app.agent.handle;
        never_asked = hsa.gpu_agents().expect("agents")[1].handle;
        problems.extend(app.round());
        let (statuses, listed) = calls.answers(agent, &[]);
        assert_eq!(statuses[0], 0, "iterate with the runtime up");
        first = *listed.first().expect("the agent has counters");
        all = listed;
        let (statuses, _) = calls.answers(agent, &[first]);
        assert_eq!(statuses, [0, 0, 0], "with the runtime up");
        // Every counter at once is more than a pass counts: plan splits them, create refuses them.
        let (over, _) = calls.answers(agent, &all);
        assert_eq!(
            over,
            [0, 0, 12],
            "every counter at once, with the runtime up"
        );
        drop(session);
    }
    let check = |when: &str| {
        let mut found = Vec::new();
        // The agent's counters were listed: the three answer from them as before.
        let (one, listed) = calls.answers(agent, &[first]);
        if one != [0, 0, 0] || listed != all {
            found.push(format!(
                "{when}: iterate, plan and create answered {one:?} for one counter of agent \
                 {agent} (iterate listed {} of its {} counters), not success from all three",
                listed.len(),
                all.len()
            ));
        }
        let (over, _) = calls.answers(agent, &all);
        if over != [0, 0, 12] {
            found.push(format!(
                "{when}: iterate, plan and create answered {over:?} for every counter of agent \
                 {agent} at once, not what they answered with the runtime up (0, 0, \
                 EXCEEDS_PASS_LIMIT)"
            ));
        }
        found
    };
    problems.extend(check("after hsa_shut_down"));
    // An agent no function asked about before the shutdown is unknown to all three.
    let (unknown, _) = calls.answers(never_asked, &[first]);
    if unknown != [6, 6, 6] {
        problems.push(format!(
            "after hsa_shut_down, iterate, plan and create answered {unknown:?} for agent \
             {never_asked}, first asked about then, not INVALID_ARGUMENT from all three"
        ));
    }
    // SAFETY: the runtime's shutdown call.
    unsafe { (loaded.on_unload)() };
    problems.extend(check("after OnUnload"));
    for p in &problems {
        println!("TOOL-PROBLEM: {p}");
    }
    println!("PROBE-DONE");
}

/// A tool that lists an agent's counters and plans passes over them after `hsa_shut_down`
/// gets the same answer when it then makes a configuration of them (docs/abi.md, "Dispatch
/// counter collection": an agent's counters are kept for the process): it got success from two
/// functions and "unknown agent" from the third.
#[test]
fn counter_functions_after_hsa_shut_down_agree_with_each_other() {
    let name = "counter_functions_after_hsa_shut_down_agree_with_each_other";
    if in_child(name) {
        return counters_after_shut_down_child();
    }
    let (problems, run) = run_tools(name, &[], &[], DEADLINE);
    assert!(
        problems.is_empty(),
        "problems: {problems:#?}\n{}",
        run.report()
    );
}
