//! A tool of its own (not the shared test tool, whose script has no CONFIG EXIT or RESTORE
//! hooks) that, at one chosen callback, dispatches its own kernel onto the queue whose dispatch
//! it is being told about (or a sibling queue) and waits for it (SPEC §3 rules 1 and 10: it runs
//! exactly once, promptly, and nothing deadlocks). From CONFIG ENTER, and from the CONFIG EXIT
//! of a dispatch declined before the agent lock, onto the dispatch's own queue, it used to wait
//! for ever: only a thread holding a replay window made re-entrant work.

#[allow(dead_code)]
#[macro_use]
mod support;

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use hsa_sys::hsa_signal_t;
use kreplay_ctxmask::ContextRegistry;
use kreplay_drain::DrainConfig;
use kreplay_hsa::{DispatchRecord, InstallOptions, ToolHooks};
use kreplay_passloop::{
    ContinueChange, DispatchInfo, LoopEnd, MemoryOpReport, Phase, ReplayOutcome, ReplayRecord,
    ReplayTool, RestoreRequest, ToolAnswer,
};
use kreplay_softhsa::WorkGroup;
use parking_lot::Mutex;
use support::app::{self, App, Aql, Pools, Ptr, Queue};
use support::bounded;

static RUNS: [AtomicU32; 8] = [const { AtomicU32::new(0) }; 8];

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct AddArgs {
    buf: u64,
    len: u32,
    tag: u32,
}

fn add_one(group: &WorkGroup) {
    // SAFETY: every dispatch of this kernel carries an `AddArgs` block.
    let args: AddArgs = unsafe { group.kernargs() };
    if group.group_id() == [0, 0, 0] {
        RUNS[args.tag as usize].fetch_add(1, Ordering::SeqCst);
    }
    for [i, _, _] in group.work_items() {
        if i < args.len {
            // SAFETY: each work-item owns index `i` of a buffer of `len` u32.
            unsafe { *(args.buf as *mut u32).add(i as usize) += 1 };
        }
    }
}

#[derive(Clone, Copy, PartialEq, Debug)]
enum At {
    ConfigEnter,
    ConfigExit,
    RestoreEnter,
    RestoreExit,
    SnapshotExit,
}

/// What the tool dispatches and where.
struct Inner {
    app: App,
    queue: Queue,
    packet: Aql,
    done: hsa_signal_t,
}
// SAFETY: the packet's pointers are kernel arguments the scenario owns for the process.
unsafe impl Send for Inner {}
// SAFETY: as above.
unsafe impl Sync for Inner {}

struct Hooks {
    registry: ContextRegistry,
    at: At,
    /// 0: replay 3 passes; anything else: answer 0 without continue (invalid, declined).
    invalid: bool,
    inner: OnceLock<Inner>,
    fired: AtomicU32,
    waited: Mutex<Option<i64>>,
    outcomes: Mutex<Vec<(u32, ReplayOutcome)>>,
}

impl Hooks {
    fn maybe_dispatch(&self, at: At, workgroup: u32) {
        if at != self.at
            || workgroup != 64
            || self
                .fired
                .compare_exchange(0, 1, Ordering::SeqCst, Ordering::SeqCst)
                .is_err()
        {
            return;
        }
        let inner = self.inner.get().expect("configured");
        inner.app.dispatch(inner.queue, inner.packet);
        *self.waited.lock() = Some(inner.app.wait_zero(inner.done));
    }
}

struct Tool<'a> {
    hooks: &'a Hooks,
}

impl ReplayTool for Tool<'_> {
    fn config_enter(&mut self, info: &DispatchInfo) -> ToolAnswer {
        if info.workgroup_size[0] != 64 {
            return ToolAnswer::OPT_OUT;
        }
        self.hooks
            .maybe_dispatch(At::ConfigEnter, info.workgroup_size[0]);
        if self.hooks.invalid {
            ToolAnswer::passes(0)
        } else {
            ToolAnswer::passes(3)
        }
    }
    fn pass_enter(&mut self, _: &DispatchInfo, _: u64, _: u64) {}
    fn pass_exit(&mut self, _: &DispatchInfo, _: u64, _: u64) -> ContinueChange {
        ContinueChange::Keep
    }
    fn should_continue(&mut self, _: &DispatchInfo, _: u64, _: u64) -> bool {
        true
    }
    fn snapshot(&mut self, info: &DispatchInfo, phase: Phase, _: &MemoryOpReport) {
        if phase == Phase::Exit {
            self.hooks
                .maybe_dispatch(At::SnapshotExit, info.workgroup_size[0]);
        }
    }
    fn restore(
        &mut self,
        info: &DispatchInfo,
        phase: Phase,
        _: &RestoreRequest,
        _: &MemoryOpReport,
    ) {
        let at = if phase == Phase::Enter {
            At::RestoreEnter
        } else {
            At::RestoreExit
        };
        self.hooks.maybe_dispatch(at, info.workgroup_size[0]);
    }
    fn config_exit(&mut self, info: &DispatchInfo, outcome: &ReplayOutcome) {
        self.hooks
            .outcomes
            .lock()
            .push((info.workgroup_size[0], outcome.clone()));
        self.hooks
            .maybe_dispatch(At::ConfigExit, info.workgroup_size[0]);
    }
}

impl ToolHooks for Hooks {
    fn replay_configured(&self) -> bool {
        true
    }
    fn dispatch_tracing_configured(&self) -> bool {
        false
    }
    fn replay_tool(&self) -> Box<dyn ReplayTool + '_> {
        Box::new(Tool { hooks: self })
    }
    fn contexts(&self) -> &ContextRegistry {
        &self.registry
    }
    fn dispatch_completed(&self, _: &DispatchRecord) {}
    fn replay_finished(&self, _: &ReplayRecord) {}
    fn warn(&self, message: &str) {
        eprintln!("kreplay warning: {message}");
    }
    fn warn_once(&self, key: &'static str, message: &str) {
        eprintln!("kreplay warning ({key}): {message}");
    }
}

fn kernargs(app: &App, pools: &Pools, buf: Ptr, tag: u32) -> Ptr {
    app.kernargs(
        pools,
        AddArgs {
            buf: buf.0,
            len: 64,
            tag,
        },
    )
}

/// The tool dispatches at `at` onto the dispatch's own queue, or onto a sibling queue of the
/// same agent (`sibling`); `invalid`: the dispatch is declined before the lock.
fn run(at: At, invalid: bool, sibling: bool) {
    let hooks = Arc::new(Hooks {
        registry: ContextRegistry::new(),
        at,
        invalid,
        inner: OnceLock::new(),
        fired: AtomicU32::new(0),
        waited: Mutex::new(None),
        outcomes: Mutex::new(Vec::new()),
    });
    let app = app::install(
        hooks.clone(),
        InstallOptions {
            drain: DrainConfig::new(Duration::from_secs(2)),
            ..Default::default()
        },
    );
    let pools = app.pools(app.gpus[0]);
    let kernel = kreplay_softhsa::register_kernel("reentry_callbacks_add_one", add_one);
    let q = app.queue(app.gpus[0]);
    let other = app.queue(app.gpus[0]);
    let buf = app.buffer(pools.coarse, &[7; 64]);
    let inner_buf = app.buffer(pools.fine, &[40; 64]);
    let (done, inner_done) = (app.signal(1), app.signal(1));
    let inner = Aql::dispatch(
        kernel,
        64,
        32,
        kernargs(&app, &pools, inner_buf, 5),
        inner_done,
    );
    let outer = Aql::dispatch(kernel, 64, 64, kernargs(&app, &pools, buf, 4), done);
    let _ = hooks.inner.set(Inner {
        app,
        queue: if sibling { other } else { q },
        packet: inner,
        done: inner_done,
    });
    let finished = bounded(
        Duration::from_secs(12),
        vec![Box::new(move || {
            app.dispatch(q, outer);
            app.wait_zero(done)
        })],
    );
    assert_eq!(finished, vec![0], "the application's dispatch completed");
    assert_eq!(
        hooks.fired.load(Ordering::SeqCst),
        1,
        "the tool dispatched at {at:?}"
    );
    assert_eq!(
        *hooks.waited.lock(),
        Some(0),
        "the tool's dispatch from {at:?} completed inside the callback (outcomes: {:?})",
        hooks.outcomes.lock()
    );
    assert_eq!(
        RUNS[5].load(Ordering::SeqCst),
        1,
        "the tool's dispatch ran once"
    );
    assert_eq!(app.read(inner_buf, 64), vec![41; 64]);
    assert_eq!(
        app.read(buf, 64),
        vec![8; 64],
        "the application's dispatch added one"
    );
    if !invalid {
        let replayed = hooks.outcomes.lock().iter().any(|(wg, outcome)| {
            *wg == 64
                && *outcome
                    == ReplayOutcome::Replayed {
                        passes: 3,
                        end: LoopEnd::LastPass,
                    }
        });
        assert!(replayed, "{:?}", hooks.outcomes.lock());
    }
}

scenarios! {
    /// CONFIG ENTER, onto the queue whose dispatch it configures.
    fn a_tool_dispatch_from_config_enter_onto_its_queue() {
        run(At::ConfigEnter, false, false);
    }
    /// CONFIG ENTER, onto a sibling queue of the same agent.
    fn a_tool_dispatch_from_config_enter_onto_a_sibling_queue() {
        run(At::ConfigEnter, false, true);
    }
    /// CONFIG EXIT of a dispatch declined before the lock (0 passes, no continue callback).
    fn a_tool_dispatch_from_config_exit_of_a_declined_dispatch_onto_its_queue() {
        run(At::ConfigExit, true, false);
    }
    /// CONFIG EXIT of a replayed dispatch.
    fn a_tool_dispatch_from_config_exit_of_a_replayed_dispatch_onto_its_queue() {
        run(At::ConfigExit, false, false);
    }
    fn a_tool_dispatch_from_restore_enter_onto_the_replaying_queue() {
        run(At::RestoreEnter, false, false);
    }
    fn a_tool_dispatch_from_restore_exit_onto_the_replaying_queue() {
        run(At::RestoreExit, false, false);
    }
    fn a_tool_dispatch_from_snapshot_exit_onto_the_replaying_queue() {
        run(At::SnapshotExit, false, false);
    }
}
