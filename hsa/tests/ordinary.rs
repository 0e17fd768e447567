//! Ordinary work while a replay service is configured: opted-out dispatches and other packets
//! reach the hardware queue as the application wrote them, with nothing of kreplay's between
//! them, so they may overlap as they would without kreplay; replays still wait for them.

// Each test file uses part of the shared harness.
#[allow(dead_code)]
#[macro_use]
mod support;

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use kreplay_drain::DrainConfig;
use kreplay_hsa::InstallOptions;
use kreplay_passloop::{LoopEnd, ReplayOutcome, ToolAnswer};
use kreplay_softhsa::WorkGroup;
use support::app::{self, Aql, WAIT};
use support::tool::{Script, TestHooks};
use support::{bounded, wait_flag};

static RUNS: AtomicU32 = AtomicU32::new(0);
/// Runs of `meet` that have started.
static ARRIVED: AtomicU32 = AtomicU32::new(0);
/// Runs of `meet` that saw another run start while they were running.
static MET: AtomicU32 = AtomicU32::new(0);

/// Arguments of `late_write`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct LateArgs {
    buf: u64,
    value: u32,
    sleep_ms: u32,
}

/// Sleeps, then writes `value` into the first 64 words of `buf`: a long kernel whose only effect
/// comes at its end.
fn late_write(group: &WorkGroup) {
    // SAFETY: every dispatch of this kernel carries a `LateArgs` block.
    let args: LateArgs = unsafe { group.kernargs() };
    if group.group_id() != [0, 0, 0] {
        return;
    }
    std::thread::sleep(Duration::from_millis(u64::from(args.sleep_ms)));
    for i in 0..64 {
        // SAFETY: `buf` holds 64 u32 the scenario owns.
        unsafe { std::ptr::write_volatile((args.buf as *mut u32).add(i), args.value) };
    }
}

/// Starts, then waits (at most [`WAIT`]) until a second run has started too: two runs meet only
/// if they run at the same time.
fn meet(group: &WorkGroup) {
    if group.group_id() != [0, 0, 0] {
        return;
    }
    ARRIVED.fetch_add(1, Ordering::SeqCst);
    let deadline = Instant::now() + WAIT;
    while Instant::now() < deadline {
        if ARRIVED.load(Ordering::SeqCst) >= 2 {
            MET.fetch_add(1, Ordering::SeqCst);
            return;
        }
        std::thread::yield_now();
    }
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct AddArgs {
    buf: u64,
    len: u32,
    pad: u32,
}

fn add_one(group: &WorkGroup) {
    // SAFETY: every dispatch of this kernel carries an `AddArgs` block.
    let args: AddArgs = unsafe { group.kernargs() };
    if group.group_id() == [0, 0, 0] {
        RUNS.fetch_add(1, Ordering::SeqCst);
    }
    for [i, _, _] in group.work_items() {
        if i < args.len {
            // SAFETY: each work-item owns index `i` of a buffer of `len` u32.
            unsafe { *(args.buf as *mut u32).add(i as usize) += 1 };
        }
    }
}

scenarios! {
    /// Opted-out dispatches (one per doorbell, and two with one doorbell) and a barrier: the
    /// hardware queue receives exactly these packets, unchanged and in order, and one later
    /// replay on the agent still starts from their results.
    fn opted_out_work_reaches_the_hardware_queue_with_no_packet_of_kreplay_between() {
        let hooks = TestHooks::new(0);
        let app = app::install(hooks.clone(), InstallOptions { drain: DrainConfig::new(WAIT), ..Default::default() });
        hooks.configure_replay(true);
        hooks.set_script(Script::new(|_, info| {
            if info.workgroup_size[0] == 64 { ToolAnswer::passes(2) } else { ToolAnswer::OPT_OUT }
        }));
        let pools = app.pools(app.gpus[0]);
        let q = app.queue(app.gpus[0]);
        let forwarded = app.observe_forwarded(q);
        let buf = app.buffer(pools.coarse, &[0; 64]);
        let kernel = kreplay_softhsa::register_kernel("ordinary_add_one", add_one);
        let args = app.kernargs(&pools, AddArgs { buf: buf.0, len: 64, pad: 0 });
        let signals: Vec<_> = (0..5).map(|_| app.signal(1)).collect();
        let packets: Vec<Aql> = (0..4).map(|i| Aql::dispatch(kernel, 64, 32, args, signals[i])).collect();
        let barrier = Aql::barrier(signals[4]);

        app.dispatch(q, packets[0]);
        app.dispatch(q, packets[1]);
        app.submit(q, &[packets[2], barrier, packets[3]]);
        for s in &signals {
            assert_eq!(app.wait_zero(*s), 0);
        }

        let stream: Vec<Aql> = forwarded.lock().iter().flatten().copied().collect();
        assert_eq!(stream, vec![packets[0], packets[1], packets[2], barrier, packets[3]], "nothing but the application's packets, in order");
        assert_eq!(RUNS.load(Ordering::SeqCst), 4);
        assert_eq!(app.read(buf, 64), vec![4; 64]);

        let done = app.signal(1);
        app.dispatch(q, Aql::dispatch(kernel, 64, 64, args, done));
        assert_eq!(app.wait_zero(done), 0);
        assert_eq!(app.read(buf, 64), vec![5; 64], "the replay started from the ordinary work's results");
        let last = hooks.configured_dispatches().last().expect("dispatches").dispatch_id;
        assert_eq!(hooks.finished_record(last).outcome, ReplayOutcome::Replayed { passes: 2, end: LoopEnd::LastPass });
    }

    /// A replay waits for the agent while another thread sits inside a sibling queue's
    /// submission, waiting for the agent too (a replay window is open): when the replay gets
    /// the agent, that thread still writes the drain marker it asks for, so the replay neither
    /// hangs nor declines, and every dispatch runs as it should.
    fn a_drain_marker_reaches_a_queue_whose_thread_waits_for_the_agent() {
        static OTHER_WAITING: AtomicBool = AtomicBool::new(false);
        static SECOND_STARTED: AtomicBool = AtomicBool::new(false);
        let hooks = TestHooks::new(0);
        let app = app::install(hooks.clone(), InstallOptions { drain: DrainConfig::new(WAIT), ..Default::default() });
        hooks.configure_replay(true);
        let pools = app.pools(app.gpus[0]);
        let (q1, q2, q3) = (app.queue(app.gpus[0]), app.queue(app.gpus[0]), app.queue(app.gpus[0]));
        // SAFETY: the queues are live for the scenario.
        let (first_q, other_q) = unsafe { ((*q1.0).id, (*q2.0).id) };
        let kernel = kreplay_softhsa::register_kernel("ordinary_add_one", add_one);
        let bufs: Vec<_> = (0..3).map(|_| app.buffer(pools.coarse, &[0; 64])).collect();
        let done = [app.signal(1), app.signal(1), app.signal(1)];
        let packet = |k: usize, workgroup: u16| {
            Aql::dispatch(kernel, 64, workgroup, app.kernargs(&pools, AddArgs { buf: bufs[k].0, len: 64, pad: 0 }), done[k])
        };
        let (first, other, second) = (packet(0, 64), packet(1, 32), packet(2, 64));
        let (go_other, other_go) = mpsc::channel::<()>();
        let (go_second, second_go) = mpsc::channel::<()>();
        let gos = parking_lot::Mutex::new(Some((go_other, go_second)));
        hooks.set_script(
            Script::new(move |_, info| {
                if info.queue_id == other_q {
                    OTHER_WAITING.store(true, Ordering::SeqCst);
                    return ToolAnswer::OPT_OUT;
                }
                if info.queue_id != first_q {
                    SECOND_STARTED.store(true, Ordering::SeqCst);
                }
                ToolAnswer::passes(2)
            })
            .on_pass_enter(move |_, info, pass, _| {
                if info.queue_id != first_q || pass != 0 {
                    return;
                }
                if let Some((go_other, go_second)) = gos.lock().take() {
                    let _ = go_other.send(());
                    assert!(wait_flag(&OTHER_WAITING), "the other thread is inside its submission");
                    let _ = go_second.send(());
                    assert!(wait_flag(&SECOND_STARTED), "the second replay asked for the agent");
                }
            }),
        );
        let jobs: Vec<Box<dyn FnOnce() -> i64 + Send>> = vec![
            Box::new(move || {
                app.dispatch(q1, first);
                app.wait_zero(done[0])
            }),
            Box::new(move || {
                other_go.recv_timeout(WAIT).expect("released");
                app.dispatch(q2, other);
                app.wait_zero(done[1])
            }),
            Box::new(move || {
                second_go.recv_timeout(WAIT).expect("released");
                app.dispatch(q3, second);
                app.wait_zero(done[2])
            }),
        ];

        let finished = bounded(Duration::from_secs(12), jobs);

        assert_eq!(finished, vec![0, 0, 0]);
        for buf in &bufs {
            assert_eq!(app.read(*buf, 64), vec![1; 64]);
        }
        assert_eq!(RUNS.load(Ordering::SeqCst), 5, "two passes each for the replays, one run for the other");
        for info in hooks.configured_dispatches().iter().filter(|i| i.workgroup_size[0] == 64) {
            assert_eq!(hooks.finished_record(info.dispatch_id).outcome, ReplayOutcome::Replayed { passes: 2, end: LoopEnd::LastPass });
        }
    }

    /// On a runtime that runs dispatches of one queue concurrently when their barrier bits
    /// allow it, two opted-out dispatches written to one queue while a replay service is
    /// configured run at the same time, as they would without kreplay.
    fn two_opted_out_kernels_on_one_queue_overlap() {
        kreplay_softhsa::configure(kreplay_softhsa::SoftHsaConfig {
            overlap_dispatches: true,
            ..Default::default()
        })
        .expect("softhsa configuration");
        let hooks = TestHooks::new(0);
        let app = app::install(hooks.clone(), InstallOptions { drain: DrainConfig::new(WAIT), ..Default::default() });
        hooks.configure_replay(true);
        hooks.set_script(Script::new(|_, _| ToolAnswer::OPT_OUT));
        let pools = app.pools(app.gpus[0]);
        let q = app.queue(app.gpus[0]);
        let kernel = kreplay_softhsa::register_kernel("ordinary_meet", meet);
        let args = app.kernargs(&pools, AddArgs::default());
        let done = [app.signal(1), app.signal(1)];

        app.dispatch(q, Aql::dispatch(kernel, 1, 1, args, done[0]));
        app.dispatch(q, Aql::dispatch(kernel, 1, 1, args, done[1]));

        assert_eq!([app.wait_zero(done[0]), app.wait_zero(done[1])], [0, 0]);
        assert_eq!(ARRIVED.load(Ordering::SeqCst), 2);
        assert_eq!(MET.load(Ordering::SeqCst), 2, "both runs saw each other: they overlapped");
    }

    /// A single-producer queue (kreplay may not write into its ring) still drains: a long
    /// opted-out kernel forwarded to it finishes before a replay on a sibling queue takes its
    /// snapshot, so the replay's single-run result builds on the kernel's write.
    fn a_single_producer_sibling_is_drained_before_the_snapshot() {
        let hooks = TestHooks::new(0);
        let app = app::install(hooks.clone(), InstallOptions { drain: DrainConfig::new(WAIT), ..Default::default() });
        hooks.configure_replay(true);
        hooks.set_script(Script::new(|_, info| {
            if info.workgroup_size[0] == 64 { ToolAnswer::passes(3) } else { ToolAnswer::OPT_OUT }
        }));
        let pools = app.pools(app.gpus[0]);
        let single = app.queue_of_type(app.gpus[0], hsa_sys::HSA_QUEUE_TYPE_SINGLE);
        let q = app.queue(app.gpus[0]);
        let buf = app.buffer(pools.coarse, &[0; 64]);
        let late = kreplay_softhsa::register_kernel("ordinary_late_write", late_write);
        let add = kreplay_softhsa::register_kernel("ordinary_add_one", add_one);
        let (late_done, done) = (app.signal(1), app.signal(1));
        let late_args = app.kernargs(&pools, LateArgs { buf: buf.0, value: 100, sleep_ms: 100 });
        let add_args = app.kernargs(&pools, AddArgs { buf: buf.0, len: 64, pad: 0 });

        app.dispatch(single, Aql::dispatch(late, 1, 1, late_args, late_done));
        app.dispatch(q, Aql::dispatch(add, 64, 64, add_args, done));

        assert_eq!([app.wait_zero(late_done), app.wait_zero(done)], [0, 0]);
        assert_eq!(app.read(buf, 64), vec![101; 64], "the replay started after the long kernel's write");
        let replayed = hooks.configured_dispatches().into_iter().find(|i| i.workgroup_size[0] == 64).expect("the replayed dispatch");
        assert_eq!(hooks.finished_record(replayed.dispatch_id).outcome, ReplayOutcome::Replayed { passes: 3, end: LoopEnd::LastPass });
    }
}
