//! A tool that dispatches its own kernel from CONFIG ENTER (a replay callback: SPEC §3 rule 10,
//! "a dispatch a tool issues from inside a replay callback runs exactly once, promptly, on any
//! queue") and waits for it there, onto the queue whose dispatch it configures or a sibling.
//! Onto the same queue it used to wait for ever: the slot was ordinary work, handled only once
//! the handler call that was waiting for the tool returned.

#[allow(dead_code)]
#[macro_use]
mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use hsa_sys::hsa_signal_t;
use kreplay_drain::DrainConfig;
use kreplay_hsa::InstallOptions;
use kreplay_passloop::{LoopEnd, ReplayOutcome, ToolAnswer};
use kreplay_softhsa::WorkGroup;
use parking_lot::Mutex;
use support::app::{self, App, Aql, Pools, Ptr, Queue, WAIT};
use support::bounded;
use support::tool::{Script, TestHooks};

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

fn runs(tag: u32) -> u32 {
    RUNS[tag as usize].load(Ordering::SeqCst)
}

struct Env {
    app: App,
    hooks: Arc<TestHooks>,
    pools: Pools,
}

fn setup() -> Env {
    let hooks = TestHooks::new(0);
    let app = app::install(
        hooks.clone(),
        InstallOptions {
            drain: DrainConfig::new(WAIT),
            ..Default::default()
        },
    );
    hooks.configure_replay(true);
    let pools = app.pools(app.gpus[0]);
    Env { app, hooks, pools }
}

fn add(env: &Env, buf: Ptr, tag: u32, workgroup: u16, done: hsa_signal_t) -> Aql {
    let kernarg = env.app.kernargs(
        &env.pools,
        AddArgs {
            buf: buf.0,
            len: 64,
            tag,
        },
    );
    let kernel = kreplay_softhsa::register_kernel("reentry_config_add_one", add_one);
    Aql::dispatch(kernel, 64, workgroup, kernarg, done)
}

/// The tool's CONFIG ENTER dispatches `inner` onto `target` and waits for it (at most WAIT),
/// then asks for 3 passes of the application's dispatch (work-group 64).
fn config_enter_dispatch(same_queue: bool) {
    let env = setup();
    let q = env.app.queue(env.app.gpus[0]);
    let sibling = env.app.queue(env.app.gpus[0]);
    let target: Queue = if same_queue { q } else { sibling };
    let buf = env.app.buffer(env.pools.coarse, &[7; 64]);
    let inner_buf = env.app.buffer(env.pools.fine, &[40; 64]);
    let (done, inner_done) = (env.app.signal(1), env.app.signal(1));
    let inner = add(&env, inner_buf, 5, 32, inner_done);
    let outer = add(&env, buf, 4, 64, done);
    let inner_wait: Arc<Mutex<Option<i64>>> = Arc::default();
    let (app, w) = (env.app, inner_wait.clone());
    env.hooks.set_script(Script::new(move |_, info| {
        if info.workgroup_size[0] == 64 {
            app.dispatch(target, inner);
            *w.lock() = Some(app.wait_zero(inner_done));
            ToolAnswer::passes(3)
        } else {
            ToolAnswer::OPT_OUT
        }
    }));
    let finished = bounded(
        Duration::from_secs(15),
        vec![Box::new(move || {
            app.dispatch(q, outer);
            app.wait_zero(done)
        })],
    );
    assert_eq!(finished, vec![0]);
    assert_eq!(
        *inner_wait.lock(),
        Some(0),
        "the tool's dispatch completed inside its CONFIG ENTER callback"
    );
    assert_eq!(runs(5), 1, "the tool's dispatch ran once");
    assert_eq!(env.app.read(inner_buf, 64), vec![41; 64]);
    assert_eq!(runs(4), 3);
    assert_eq!(env.app.read(buf, 64), vec![8; 64]);
    let id = env
        .hooks
        .configured_dispatches()
        .iter()
        .find(|i| i.workgroup_size[0] == 64)
        .unwrap()
        .dispatch_id;
    assert_eq!(
        env.hooks.finished_record(id).outcome,
        ReplayOutcome::Replayed {
            passes: 3,
            end: LoopEnd::LastPass
        }
    );
}

scenarios! {
    /// CONFIG ENTER dispatches onto the very queue whose dispatch it configures, and waits.
    fn a_tool_dispatch_from_config_enter_onto_the_replaying_queue_runs_inside_the_callback() {
        config_enter_dispatch(true);
    }

    /// CONFIG ENTER dispatches onto a sibling queue of the same agent, and waits.
    fn a_tool_dispatch_from_config_enter_onto_a_sibling_queue_runs_inside_the_callback() {
        config_enter_dispatch(false);
    }
}
