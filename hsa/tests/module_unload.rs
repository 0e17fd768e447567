//! An executable unrelated to the replayed kernel, loaded on the replayed agent, is destroyed
//! (a module unload) by another thread while the dispatch is in its passes. Its writable
//! module variables are in the replay's snapshot: the destroy waits for the replay (a restore
//! wrote into the freed memory, which another GPU's buffer could already be using, or crashed).

#[macro_use]
#[allow(dead_code, unused_macros)]
mod support;

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use kreplay_drain::DrainConfig;
use kreplay_hsa::InstallOptions;
use kreplay_passloop::{LoopEnd, ReplayOutcome};
use kreplay_snapshot::{RestoreStrategy, SnapshotConfig};
use kreplay_softhsa::WorkGroup;
use support::app::{self, Aql, WAIT};
use support::tool::{Script, TestHooks};

#[repr(C)]
#[derive(Clone, Copy)]
struct Args {
    buf: u64,
    len: u32,
    pad: u32,
}

/// How long the fill of a whole reused buffer (up to 64 MiB) may take.
const BIG_FILL_WAIT: Duration = Duration::from_secs(120);

static PASS_RUNNING: AtomicBool = AtomicBool::new(false);
static UNLOADED: AtomicBool = AtomicBool::new(false);

/// `buf[i] += 1`; the first run waits (bounded) until the other thread unloaded the module.
fn gated_add(group: &WorkGroup) {
    // SAFETY: every dispatch of this kernel carries an `Args` block.
    let args: Args = unsafe { group.kernargs() };
    if group.group_id() == [0, 0, 0] && !PASS_RUNNING.swap(true, Ordering::SeqCst) {
        let deadline = Instant::now() + Duration::from_secs(2);
        while !UNLOADED.load(Ordering::SeqCst) && Instant::now() < deadline {
            std::thread::yield_now();
        }
    }
    for [i, _, _] in group.work_items() {
        if i < args.len {
            // SAFETY: the buffer holds `len` u32; each work-item owns index `i`.
            unsafe { *(args.buf as *mut u32).add(i as usize) += 1 };
        }
    }
}

fn unrelated_kernel(_: &WorkGroup) {}

fn unload_during_replay(variable_bytes: usize, strategy: RestoreStrategy) {
    let hooks = TestHooks::new(0);
    let app = app::install(
        hooks.clone(),
        InstallOptions {
            drain: DrainConfig::new(WAIT),
            snapshot: SnapshotConfig::default().with_strategy(strategy),
            ..Default::default()
        },
    );
    hooks.configure_replay(true);
    hooks.set_script(Script::passes(3));
    let gpu0 = app.gpus[0];
    let pools = app.pools(gpu0);
    let hsa = app.hsa();

    // An unrelated module with a large writable `__device__` array, loaded on GPU 0.
    let unrelated = kreplay_softhsa::register_kernel("unload_unrelated", unrelated_kernel);
    let code = kreplay_softhsa::CodeObject::new()
        .kernel("unload_unrelated", unrelated, 0)
        .variable("unload_big_table", &vec![0x11u8; variable_bytes]);
    let exe = hsa.load_executable(gpu0, &code).unwrap();

    let init: Vec<u32> = (0..256).map(|i| 3 * i).collect();
    let buf = app.buffer(pools.coarse, &init);
    let kernel = kreplay_softhsa::register_kernel("unload_gated_add", gated_add);
    let kernarg = app.kernargs(
        &pools,
        Args {
            buf: buf.0,
            len: 256,
            pad: 0,
        },
    );

    let unloader = std::thread::spawn(move || {
        let deadline = Instant::now() + WAIT;
        while !PASS_RUNNING.load(Ordering::SeqCst) && Instant::now() < deadline {
            std::thread::yield_now();
        }
        assert!(PASS_RUNNING.load(Ordering::SeqCst), "the first pass ran");
        // Another thread unloads its module (hipModuleUnload) while GPU 0 runs a kernel.
        app.hsa().destroy_executable(exe).unwrap();
        UNLOADED.store(true, Ordering::SeqCst);
    });
    let q = app.queue(gpu0);
    let done = app.signal(1);
    app.dispatch(q, Aql::dispatch(kernel, 256, 64, kernarg, done));
    assert_eq!(app.wait_zero(done), 0, "the dispatch completed");
    unloader.join().expect("the unloading thread ends");
    let dispatch = hooks.configured_dispatches()[0].dispatch_id;
    assert_eq!(
        hooks.finished_record(dispatch).outcome,
        ReplayOutcome::Replayed {
            passes: 3,
            end: LoopEnd::LastPass
        }
    );
    let expected: Vec<u32> = init.iter().map(|v| v + 1).collect();
    assert_eq!(app.read(buf, 256), expected, "single-run results");
}

scenarios! {
    /// 1 MiB module variable (its segment is returned to the OS on destroy), full restores.
    fn unloading_an_unrelated_module_during_a_replay_full_restore() {
        unload_during_replay(1 << 20, RestoreStrategy::Full);
    }

    /// The same under hash restores.
    fn unloading_an_unrelated_module_during_a_replay_hash_restore() {
        unload_during_replay(1 << 20, RestoreStrategy::Hash);
    }
}

/// The variable's memory, freed by the unload, is allocated again by the other thread as a
/// buffer of GPU 1 (no link to GPU 0), which a kernel of GPU 1 fills while GPU 0's replay is
/// still in its passes. Nothing of GPU 0's replay may end up in that buffer.
fn unload_and_reuse(strategy: RestoreStrategy, BYTES: usize) {
    #![allow(non_snake_case)]
    let hooks = TestHooks::new(0);
    let app = app::install(
        hooks.clone(),
        InstallOptions {
            drain: DrainConfig::new(WAIT),
            snapshot: SnapshotConfig::default().with_strategy(strategy),
            ..Default::default()
        },
    );
    hooks.configure_replay(true);
    let gpu0h = app.gpus[0].handle;
    hooks.set_script(Script::new(move |_, info| {
        kreplay_passloop::ToolAnswer::passes(if info.agent_id == gpu0h { 3 } else { 1 })
    }));
    let (gpu0, gpu1) = (app.gpus[0], app.gpus[1]);
    let pools = app.pools(gpu0);
    let pools1 = app.pools(gpu1);
    let hsa = app.hsa();

    let unrelated = kreplay_softhsa::register_kernel("unload_unrelated", unrelated_kernel);
    let code = kreplay_softhsa::CodeObject::new()
        .kernel("unload_unrelated", unrelated, 0)
        .variable("unload_small_table", &vec![0x11u8; BYTES]);
    let exe = hsa.load_executable(gpu0, &code).unwrap();
    let sym = hsa.symbol(exe, gpu0, "unload_small_table").unwrap();
    let var = hsa
        .symbol_u64(sym, hsa_sys::HSA_EXECUTABLE_SYMBOL_INFO_VARIABLE_ADDRESS)
        .unwrap();

    let init: Vec<u32> = (0..256).map(|i| 3 * i).collect();
    let buf = app.buffer(pools.coarse, &init);
    let kernel = kreplay_softhsa::register_kernel("unload_gated_add", gated_add);
    let kernarg = app.kernargs(
        &pools,
        Args {
            buf: buf.0,
            len: 256,
            pad: 0,
        },
    );

    let unloader = std::thread::spawn(move || {
        let deadline = Instant::now() + WAIT;
        while !PASS_RUNNING.load(Ordering::SeqCst) && Instant::now() < deadline {
            std::thread::yield_now();
        }
        assert!(PASS_RUNNING.load(Ordering::SeqCst), "the first pass ran");
        app.hsa().destroy_executable(exe).unwrap();
        // A new buffer of GPU 1, which may land where the variable was.
        let mut mine = Vec::new();
        let mut reused = None;
        for _ in 0..8 {
            let p = app.alloc(pools1.coarse, BYTES);
            eprintln!("var {var:#x} new {:#x}", p.0);
            if p.0 <= var && var < p.0 + BYTES as u64 {
                reused = Some(p);
                break;
            }
            mine.push(p);
        }
        let target = reused.expect("the allocator reused the variable's address");
        // GPU 1 fills it with 0x5eed (an ordinary, unreplayed dispatch of an unlinked GPU).
        let fill = kreplay_softhsa::register_kernel("unload_fill", fill_words);
        let kernarg = app.kernargs(
            &pools1,
            FillArgs {
                buf: target.0,
                len: (BYTES / 4) as u32,
                value: 0x5eed,
            },
        );
        let q1 = app.queue(gpu1);
        let done = app.signal(1);
        app.dispatch(
            q1,
            Aql::dispatch(fill, (BYTES / 4) as u32, 64, kernarg, done),
        );
        // Filling 64 MiB one work-item at a time takes softhsa a few seconds of CPU in a debug
        // build, more than `WAIT` on a loaded machine: only a fill that never ends fails here.
        assert_eq!(
            app.wait_zero_within(done, BIG_FILL_WAIT),
            0,
            "GPU 1's fill completed"
        );
        UNLOADED.store(true, Ordering::SeqCst);
        target
    });
    let q = app.queue(gpu0);
    let done = app.signal(1);
    app.dispatch(q, Aql::dispatch(kernel, 256, 64, kernarg, done));
    assert_eq!(app.wait_zero(done), 0, "the dispatch completed");
    let target = unloader.join().expect("the unloading thread ends");
    let words = app.read(target, BYTES / 4);
    let lost = words.iter().filter(|&&w| w != 0x5eed).count();
    let dispatch = hooks.configured_dispatches()[0].dispatch_id;
    let outcome = hooks.finished_record(dispatch).outcome;
    assert_eq!(
        lost,
        0,
        "{lost} of {} words GPU 1 wrote into its own buffer were overwritten (first {:#x}); outcome {outcome:?}",
        BYTES / 4,
        words[0]
    );
    assert_eq!(
        outcome,
        ReplayOutcome::Replayed {
            passes: 3,
            end: LoopEnd::LastPass
        }
    );
    let expected: Vec<u32> = init.iter().map(|v| v + 1).collect();
    assert_eq!(app.read(buf, 256), expected, "single-run results");
}

#[repr(C)]
#[derive(Clone, Copy)]
struct FillArgs {
    buf: u64,
    len: u32,
    value: u32,
}

fn fill_words(group: &WorkGroup) {
    // SAFETY: every dispatch of this kernel carries a `FillArgs` block.
    let args: FillArgs = unsafe { group.kernargs() };
    for [i, _, _] in group.work_items() {
        if i < args.len {
            // SAFETY: `buf` holds `len` u32.
            unsafe { *(args.buf as *mut u32).add(i as usize) = args.value };
        }
    }
}

scenarios! {
    /// The freed variable's address reused by a buffer of another GPU: full restores.
    fn a_reused_unloaded_module_variable_is_not_restored_into_another_gpus_buffer() {
        unload_and_reuse(RestoreStrategy::Full, 64 << 20);
    }
}
