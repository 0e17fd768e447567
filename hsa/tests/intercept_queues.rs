//! Queues the application creates with `hsa_amd_queue_intercept_create` (its own packet
//! handlers on top, or another tools library loaded after kreplay that makes the application's
//! queues that way): kreplay must see them like any other queue. A replay on their agent
//! drains them and holds them off, so their kernels' writes are never undone by its restores.
//!
//! kreplay registers its handler when it creates the queue, so a handler the application
//! registers later is, as ROCm orders them, called first: it sees the application's packets and
//! passes them on to kreplay, which writes the replay's passes where no later handler sees them.

#[allow(dead_code)]
#[macro_use]
mod support;

use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use hsa_sys::{
    HSA_PACKET_TYPE_KERNEL_DISPATCH, HSA_QUEUE_TYPE_MULTI, HSA_STATUS_SUCCESS,
    hsa_amd_queue_intercept_packet_writer, hsa_kernel_dispatch_packet_t, hsa_queue_t,
};
use kreplay_drain::DrainConfig;
use kreplay_hsa::InstallOptions;
use kreplay_passloop::{LoopEnd, Phase, ReplayOutcome, ToolAnswer};
use kreplay_softhsa::WorkGroup;
use parking_lot::Mutex;
use support::app::{self, App, Aql, Queue, WAIT};
use support::counted::{AddOneArgs, add_one};
use support::tool::{Script, TestHooks};

/// Opened once the application's kernel may run.
static GATE: AtomicBool = AtomicBool::new(false);
/// Set by the gated kernel when its work-group started, and when it finished.
static GATED_STARTED: AtomicBool = AtomicBool::new(false);
static GATED_DONE: AtomicBool = AtomicBool::new(false);

/// `add_one` (one work-group) that waits, bounded, until `GATE` opens.
fn gated_add(group: &WorkGroup) {
    GATED_STARTED.store(true, Ordering::SeqCst);
    let deadline = Instant::now() + WAIT;
    while !GATE.load(Ordering::SeqCst) && Instant::now() < deadline {
        std::thread::yield_now();
    }
    add_one(group);
    GATED_DONE.store(true, Ordering::SeqCst);
}

/// Creates a queue on `agent` with `hsa_amd_queue_intercept_create`, as a layer on top of the
/// runtime would, with `handler` of the application's registered on it.
fn intercept_queue_with(
    app: &App,
    agent: hsa_sys::hsa_agent_t,
    handler: &'static AppHandler,
) -> Queue {
    let create = app
        .amd()
        .hsa_amd_queue_intercept_create_fn
        .expect("hsa_amd_queue_intercept_create");
    let mut queue: *mut hsa_queue_t = std::ptr::null_mut();
    // SAFETY: valid agent and out pointer; no error callback.
    let status = unsafe {
        create(
            agent,
            64,
            HSA_QUEUE_TYPE_MULTI,
            None,
            std::ptr::null_mut::<c_void>(),
            0,
            0,
            &raw mut queue,
        )
    };
    assert_eq!(status, HSA_STATUS_SUCCESS);
    let register = app
        .amd()
        .hsa_amd_queue_intercept_register_fn
        .expect("hsa_amd_queue_intercept_register");
    // SAFETY: a live intercept queue; `handler` lives for the whole process.
    let status = unsafe {
        register(
            queue,
            Some(application_handler),
            std::ptr::from_ref(handler).cast_mut().cast(),
        )
    };
    assert_eq!(status, HSA_STATUS_SUCCESS);
    Queue(queue)
}

/// Creates a queue on `agent` with `hsa_amd_queue_intercept_create` and a pass-through
/// handler of the application's.
fn intercept_queue(app: &App, agent: hsa_sys::hsa_agent_t) -> Queue {
    intercept_queue_with(app, agent, AppHandler::leak(Mode::PassThrough))
}

/// What the application's own handler does with the packets it is given.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Passes them on unchanged.
    PassThrough,
    /// Passes each kernel dispatch on with its kernel arguments replaced by `kernarg`.
    Rewrite,
    /// Waits (bounded) until `gate` opens, then passes them on.
    Delay,
    /// Keeps the first packet it is ever given and writes it in front of the next ones.
    HoldFirst,
}

/// An application's intercept handler and what it saw.
struct AppHandler {
    mode: Mode,
    /// Every packet the handler was given, in order.
    seen: Mutex<Vec<[u8; 64]>>,
    kernarg: std::sync::atomic::AtomicU64,
    gate: AtomicBool,
    waiting: AtomicBool,
    held: Mutex<Option<Vec<[u8; 64]>>>,
    first_call: AtomicBool,
}

impl AppHandler {
    fn leak(mode: Mode) -> &'static AppHandler {
        Box::leak(Box::new(AppHandler {
            mode,
            seen: Mutex::new(Vec::new()),
            kernarg: std::sync::atomic::AtomicU64::new(0),
            gate: AtomicBool::new(false),
            waiting: AtomicBool::new(false),
            held: Mutex::new(None),
            first_call: AtomicBool::new(true),
        }))
    }

    /// The dispatches the handler was given (every packet it saw must be one).
    fn seen_dispatches(&self) -> Vec<hsa_kernel_dispatch_packet_t> {
        self.seen
            .lock()
            .iter()
            .map(|p| as_dispatch(p).expect("the application's handler saw only dispatches"))
            .collect()
    }
}

fn as_dispatch(bytes: &[u8; 64]) -> Option<hsa_kernel_dispatch_packet_t> {
    (u32::from(bytes[0]) == HSA_PACKET_TYPE_KERNEL_DISPATCH)
        // SAFETY: 64 bytes of plain data in the dispatch layout.
        .then(|| unsafe { std::mem::transmute::<[u8; 64], hsa_kernel_dispatch_packet_t>(*bytes) })
}

unsafe extern "C" fn application_handler(
    packets: *const c_void,
    count: u64,
    _user_pkt_index: u64,
    data: *mut c_void,
    writer: hsa_amd_queue_intercept_packet_writer,
) {
    // SAFETY: registered with a leaked `AppHandler`.
    let h = unsafe { &*data.cast::<AppHandler>() };
    // SAFETY: the runtime hands `count` packets at `packets`, valid for this call.
    let given: Vec<[u8; 64]> =
        unsafe { std::slice::from_raw_parts(packets.cast::<[u8; 64]>(), count as usize) }.to_vec();
    h.seen.lock().extend_from_slice(&given);
    let mut out = given;
    match h.mode {
        Mode::PassThrough => {}
        Mode::Rewrite => {
            for p in &mut out {
                if let Some(mut d) = as_dispatch(p) {
                    d.kernarg_address = h.kernarg.load(Ordering::SeqCst) as *mut c_void;
                    // SAFETY: a dispatch packet is 64 bytes of plain data.
                    *p =
                        unsafe { std::mem::transmute::<hsa_kernel_dispatch_packet_t, [u8; 64]>(d) };
                }
            }
        }
        Mode::Delay => {
            h.waiting.store(true, Ordering::SeqCst);
            // The scenario checks that the gate opened in time.
            let _ = support::wait_flag(&h.gate);
        }
        Mode::HoldFirst => {
            if h.first_call.swap(false, Ordering::SeqCst) {
                *h.held.lock() = Some(out);
                return;
            }
            if let Some(mut held) = h.held.lock().take() {
                held.extend_from_slice(&out);
                out = held;
            }
        }
    }
    let aligned: Vec<Aql> = out
        .iter()
        // SAFETY: 64 bytes of plain data; `Aql` is a 64-byte aligned copy of them.
        .map(|p| unsafe { std::mem::transmute::<[u8; 64], Aql>(*p) })
        .collect();
    if let Some(writer) = writer {
        // SAFETY: the writer is valid during this handler call; `aligned` holds `len` packets.
        unsafe { writer(aligned.as_ptr().cast(), aligned.len() as u64) };
    }
}

/// The outcome of a replay of `passes` passes that ran to the end.
fn replayed(passes: u64) -> ReplayOutcome {
    ReplayOutcome::Replayed {
        passes,
        end: LoopEnd::LastPass,
    }
}

scenarios! {
    /// A kernel on the application's intercept queue still runs when a replay on another
    /// queue of its agent begins, and writes memory that replay snapshots: the replay waits
    /// for it (here past the drain budget: declined `agent_drain_stuck`, the dispatch run once)
    /// instead of snapshotting under it and undoing its write at the next restore.
    fn a_kernel_on_an_application_intercept_queue_is_drained_before_a_replay() {
        let hooks = TestHooks::new(0);
        let app = app::install(
            hooks.clone(),
            InstallOptions {
                drain: DrainConfig::new(Duration::from_millis(500)),
                ..Default::default()
            },
        );
        hooks.configure_replay(true);
        let gpu = app.gpus[0];
        let pools = app.pools(gpu);
        let add = kreplay_softhsa::register_kernel("intercept_add_one", add_one);
        let gated = kreplay_softhsa::register_kernel("intercept_gated_add", gated_add);
        hooks.set_script(
            Script::new(move |_, info| {
                if info.kernel_id == gated { ToolAnswer::OPT_OUT } else { ToolAnswer::passes(3) }
            })
            // Had the snapshot been taken, the application's kernel runs now and is done before
            // the first restore.
            .on_snapshot(|_, _, phase| {
                if phase == Phase::Exit {
                    GATE.store(true, Ordering::SeqCst);
                    assert!(support::wait_flag(&GATED_DONE));
                }
            }),
        );
        let theirs = app.buffer(pools.coarse, &[10; 256]);
        let ours = app.buffer(pools.coarse, &[20; 256]);
        let iq = intercept_queue(&app, gpu);
        let q = app.queue(gpu);

        let gated_done = app.signal(1);
        let kernarg = app.kernargs(&pools, AddOneArgs { buf: theirs.0, len: 256, pad: 0 });
        app.dispatch(iq, Aql::dispatch(gated, 256, 256, kernarg, gated_done));
        assert!(support::wait_flag(&GATED_STARTED), "the application's kernel started");

        let done = app.signal(1);
        let kernarg = app.kernargs(&pools, AddOneArgs { buf: ours.0, len: 256, pad: 0 });
        app.dispatch(q, Aql::dispatch(add, 256, 64, kernarg, done));
        GATE.store(true, Ordering::SeqCst);
        assert_eq!((app.wait_zero(done), app.wait_zero(gated_done)), (0, 0));

        assert_eq!(app.read(ours, 256), vec![21; 256], "the replayed dispatch ran once");
        assert_eq!(app.read(theirs, 256), vec![11; 256], "the application's kernel's write was undone");
    }

    /// An application's handler that rewrites the dispatches it is given (their kernel
    /// arguments) is called before kreplay's, as ROCm orders handlers: it sees the
    /// application's dispatch once and never a pass; kreplay replays the rewritten dispatch,
    /// whose memory ends as one run leaves it, and the application's completion fires once.
    fn an_application_handler_sees_its_dispatch_once_and_never_a_replay_pass() {
        let hooks = TestHooks::new(0);
        let app = app::install(hooks.clone(), InstallOptions::default());
        hooks.configure_replay(true);
        hooks.set_script(Script::passes(3));
        let gpu = app.gpus[0];
        let pools = app.pools(gpu);
        let add = kreplay_softhsa::register_kernel("intercept_add_one", add_one);
        let written = app.buffer(pools.coarse, &[5; 64]);
        let untouched = app.buffer(pools.coarse, &[7; 64]);
        let theirs = app.kernargs(&pools, AddOneArgs { buf: untouched.0, len: 64, pad: 0 });
        let rewritten = app.kernargs(&pools, AddOneArgs { buf: written.0, len: 64, pad: 0 });
        let handler = AppHandler::leak(Mode::Rewrite);
        handler.kernarg.store(rewritten.0, Ordering::SeqCst);
        let iq = intercept_queue_with(&app, gpu, handler);
        let hardware = app.observe_forwarded(iq);

        let done = app.signal(1);
        app.dispatch(iq, Aql::dispatch(add, 64, 64, theirs, done));
        assert_eq!(app.wait_zero(done), 0);

        let seen = handler.seen_dispatches();
        assert_eq!(seen.len(), 1, "the application's handler saw its one dispatch, no pass");
        assert_eq!(seen[0].kernarg_address as u64, theirs.0);
        assert_eq!(seen[0].completion_signal.handle, done.handle);
        let id = hooks.configured_dispatches()[0].dispatch_id;
        let record = hooks.finished_record(id);
        assert_eq!(record.outcome, replayed(3));
        assert_eq!(record.cost.passes_run, 3);
        let passes: Vec<_> = hardware.lock().iter().flatten().filter_map(Aql::as_dispatch).collect();
        assert_eq!(passes.len(), 3, "each pass reached the hardware queue: {passes:?}");
        assert!(passes.iter().all(|p| p.kernarg_address as u64 == rewritten.0));
        assert_eq!(app.read(written, 64), vec![6; 64], "the rewritten dispatch ran as once");
        assert_eq!(app.read(untouched, 64), vec![7; 64]);
        assert_eq!(app.load(done), 0, "the completion fired once");
    }

    /// An application's handler that holds each packet until the application lets it go: the
    /// dispatch reaches kreplay only then, and a replay on another queue of the agent meanwhile
    /// neither waits for it nor is held by it; once let go it is replayed in full.
    fn a_dispatch_an_application_handler_delays_is_replayed_once_it_is_passed_on() {
        let hooks = TestHooks::new(0);
        let app = app::install(hooks.clone(), InstallOptions::default());
        hooks.configure_replay(true);
        hooks.set_script(Script::passes(3));
        let gpu = app.gpus[0];
        let pools = app.pools(gpu);
        let add = kreplay_softhsa::register_kernel("intercept_add_one", add_one);
        let delayed = app.buffer(pools.coarse, &[1; 64]);
        let other = app.buffer(pools.coarse, &[2; 64]);
        let handler = AppHandler::leak(Mode::Delay);
        let iq = intercept_queue_with(&app, gpu, handler);
        let q = app.queue(gpu);

        let delayed_done = app.signal(1);
        let kernarg = app.kernargs(&pools, AddOneArgs { buf: delayed.0, len: 64, pad: 0 });
        let packet = Aql::dispatch(add, 64, 64, kernarg, delayed_done);
        let submitter = std::thread::spawn(move || app.dispatch(iq, packet));
        assert!(support::wait_flag(&handler.waiting), "the application's handler holds the dispatch");
        assert!(hooks.configured_dispatches().is_empty(), "kreplay has not seen it yet");

        let done = app.signal(1);
        let kernarg = app.kernargs(&pools, AddOneArgs { buf: other.0, len: 64, pad: 0 });
        app.dispatch(q, Aql::dispatch(add, 64, 64, kernarg, done));
        assert_eq!(app.wait_zero(done), 0, "the replay beside the held dispatch finished");
        let first = hooks.configured_dispatches()[0].dispatch_id;
        assert_eq!(hooks.finished_record(first).outcome, replayed(3));
        assert_eq!(app.read(delayed, 64), vec![1; 64], "the held dispatch has not run");

        handler.gate.store(true, Ordering::SeqCst);
        assert_eq!(app.wait_zero(delayed_done), 0);
        submitter.join().expect("the submitting thread returned");
        let ids: Vec<u64> = hooks.configured_dispatches().iter().map(|d| d.dispatch_id).collect();
        assert_eq!(ids.len(), 2);
        assert_eq!(hooks.finished_record(ids[1]).outcome, replayed(3));
        assert_eq!(app.read(delayed, 64), vec![2; 64]);
        assert_eq!(app.read(other, 64), vec![3; 64]);
        assert_eq!(handler.seen_dispatches().len(), 1, "the handler saw only its dispatch");
    }

    /// An application's handler that keeps the first dispatch back and writes it with the
    /// next one (in a later handler call, as a handler may on ROCm): kreplay gets both in one
    /// call and replays each in queue order, each leaving one run's result.
    fn dispatches_an_application_handler_holds_back_and_writes_later_are_each_replayed() {
        let hooks = TestHooks::new(0);
        let app = app::install(hooks.clone(), InstallOptions::default());
        hooks.configure_replay(true);
        hooks.set_script(Script::passes(3));
        let gpu = app.gpus[0];
        let pools = app.pools(gpu);
        let add = kreplay_softhsa::register_kernel("intercept_add_one", add_one);
        let held = app.buffer(pools.coarse, &[10; 64]);
        let next = app.buffer(pools.coarse, &[20; 64]);
        let handler = AppHandler::leak(Mode::HoldFirst);
        let iq = intercept_queue_with(&app, gpu, handler);
        let hardware = app.observe_forwarded(iq);

        let held_done = app.signal(1);
        let kernarg = app.kernargs(&pools, AddOneArgs { buf: held.0, len: 64, pad: 0 });
        app.dispatch(iq, Aql::dispatch(add, 64, 64, kernarg, held_done));
        assert!(hooks.configured_dispatches().is_empty(), "held back by the application's handler");
        assert!(hardware.lock().is_empty());

        let next_done = app.signal(1);
        let kernarg = app.kernargs(&pools, AddOneArgs { buf: next.0, len: 64, pad: 0 });
        app.dispatch(iq, Aql::dispatch(add, 64, 64, kernarg, next_done));
        assert_eq!((app.wait_zero(held_done), app.wait_zero(next_done)), (0, 0));

        let ids: Vec<u64> = hooks.configured_dispatches().iter().map(|d| d.dispatch_id).collect();
        assert_eq!(ids.len(), 2, "both dispatches went through the pass loop");
        for id in ids {
            assert_eq!(hooks.finished_record(id).outcome, replayed(3));
        }
        assert_eq!(app.read(held, 64), vec![11; 64]);
        assert_eq!(app.read(next, 64), vec![21; 64]);
        let passes = hardware.lock().iter().flatten().filter(|p| p.as_dispatch().is_some()).count();
        assert_eq!(passes, 6, "three passes of each reached the hardware queue");
        assert_eq!(handler.seen_dispatches().len(), 2, "the handler saw the application's two dispatches");
    }

    /// A replay on one queue drains its agent's other queues, among them the application's
    /// intercept queue with a handler of its own: that handler still sees only the
    /// application's packets, and the replay runs all its passes.
    fn a_replay_beside_an_application_handler_shows_it_none_of_kreplays_packets() {
        let hooks = TestHooks::new(0);
        let app = app::install(hooks.clone(), InstallOptions::default());
        hooks.configure_replay(true);
        let gpu = app.gpus[0];
        let pools = app.pools(gpu);
        let add = kreplay_softhsa::register_kernel("intercept_add_one", add_one);
        let skipped = kreplay_softhsa::register_kernel("intercept_skipped_add_one", add_one);
        hooks.set_script(Script::new(move |_, info| {
            if info.kernel_id == skipped { ToolAnswer::OPT_OUT } else { ToolAnswer::passes(3) }
        }));
        let theirs = app.buffer(pools.coarse, &[1; 64]);
        let ours = app.buffer(pools.coarse, &[2; 64]);
        let handler = AppHandler::leak(Mode::PassThrough);
        let iq = intercept_queue_with(&app, gpu, handler);
        let q = app.queue(gpu);

        // Forwarded unreplayed: the intercept queue has work a later replay must drain.
        let theirs_done = app.signal(1);
        let kernarg = app.kernargs(&pools, AddOneArgs { buf: theirs.0, len: 64, pad: 0 });
        app.dispatch(iq, Aql::dispatch(skipped, 64, 64, kernarg, theirs_done));
        assert_eq!(app.wait_zero(theirs_done), 0);

        let done = app.signal(1);
        let kernarg = app.kernargs(&pools, AddOneArgs { buf: ours.0, len: 64, pad: 0 });
        app.dispatch(q, Aql::dispatch(add, 64, 64, kernarg, done));
        assert_eq!(app.wait_zero(done), 0);
        let id = hooks.configured_dispatches().iter().find(|d| d.kernel_id == add).unwrap().dispatch_id;
        assert_eq!(hooks.finished_record(id).outcome, replayed(3));
        assert_eq!(app.read(ours, 64), vec![3; 64]);
        assert_eq!(app.read(theirs, 64), vec![2; 64]);
        let seen = handler.seen.lock().clone();
        assert_eq!(seen.len(), 1, "the application's handler saw its one packet: {:?}",
            seen.iter().map(|p| p[0]).collect::<Vec<_>>());
    }
}
