//! Replay of a real `x += 1` kernel on a CUDA GPU, through the same window the injected library
//! uses (ENTER: lock, drain, snapshot; the launch itself is pass 0; EXIT: re-launch and restore).
//! Skipped, with the reason printed, where no driver or GPU is present.

use std::ffi::{CString, c_void};
use std::sync::Arc;

use kreplay_ctxmask::ContextRegistry;
use kreplay_cuda::driver::{CuContext, CuDevicePtr, CuFunction, CuModule, CuStream};
use kreplay_cuda::inject::FixedPasses;
use kreplay_cuda::{
    CudaLaunch, CudaMemory, Driver, Launch, LaunchApi, ShadowBudget, Window, WindowContext,
};
use kreplay_locks::AgentLocks;
use kreplay_passloop::{LoopEnd, ReplayOutcome, ReplayRecord};
use kreplay_snapshot::{
    Filter, Inventory, MemoryKind, NewAllocation, RestoreStrategy, SnapshotConfig, Snapshotter,
    StoreTier,
};

/// `p[i] += 1` for `i < n`, one thread per word.
const ADD_ONE_PTX: &str = r#"
.version 7.0
.target sm_75
.address_size 64
.visible .entry add_one(.param .u64 p, .param .u32 n)
{
    .reg .pred %p<2>;
    .reg .b32 %r<7>;
    .reg .b64 %rd<4>;
    ld.param.u64 %rd1, [p];
    ld.param.u32 %r1, [n];
    mov.u32 %r2, %ctaid.x;
    mov.u32 %r3, %ntid.x;
    mov.u32 %r4, %tid.x;
    mad.lo.s32 %r5, %r2, %r3, %r4;
    setp.ge.u32 %p1, %r5, %r1;
    @%p1 bra DONE;
    cvta.to.global.u64 %rd2, %rd1;
    mul.wide.u32 %rd3, %r5, 4;
    add.s64 %rd2, %rd2, %rd3;
    ld.global.u32 %r6, [%rd2];
    add.s32 %r6, %r6, 1;
    st.global.u32 [%rd2], %r6;
DONE:
    ret;
}
"#;

fn gpu() -> Option<&'static Driver> {
    if let Ok(path) = std::env::var("KREPLAY_CUDA_TEST_PTX") {
        let text = std::fs::read_to_string(&path).expect("KREPLAY_CUDA_TEST_PTX names a file");
        kreplay_cuda::kernels::override_ptx(text);
    }
    match Driver::get() {
        Ok(d) if d.device_count().unwrap_or(0) > 0 => Some(d),
        Ok(_) => {
            eprintln!("skipped: the CUDA driver reports no device");
            None
        }
        Err(e) => {
            eprintln!("skipped: no CUDA driver here ({e})");
            None
        }
    }
}

struct Gpu {
    d: &'static Driver,
    ctx: CuContext,
    function: CuFunction,
    stream: CuStream,
}

fn setup(d: &'static Driver) -> Gpu {
    let mut ctx: CuContext = std::ptr::null_mut();
    // SAFETY: retains device 0's primary context (kept for the test process).
    unsafe {
        d.check("retain", (d.primary_ctx_retain)(&mut ctx, 0))
            .unwrap();
        d.make_current(ctx).unwrap();
    }
    let ptx = CString::new(ADD_ONE_PTX).unwrap();
    let mut module: CuModule = std::ptr::null_mut();
    let mut function: CuFunction = std::ptr::null_mut();
    let mut stream: CuStream = std::ptr::null_mut();
    // SAFETY: JIT-loads a NUL-terminated PTX image and looks up its one kernel; creates a stream.
    unsafe {
        d.check(
            "load",
            (d.module_load_data)(&mut module, ptx.as_ptr().cast()),
        )
        .unwrap();
        d.check(
            "fn",
            (d.module_get_function)(&mut function, module, c"add_one".as_ptr()),
        )
        .unwrap();
        d.check("stream", (d.stream_create)(&mut stream, 1))
            .unwrap();
    }
    Gpu {
        d,
        ctx,
        function,
        stream,
    }
}

fn copy_in(g: &Gpu, dst: CuDevicePtr, src: &[u32]) {
    // SAFETY: src lives until the stream is synchronized below; dst has room (allocated so).
    unsafe {
        g.d.check(
            "htod",
            (g.d.memcpy_htod_async)(dst, src.as_ptr().cast(), src.len() * 4, g.stream),
        )
        .unwrap();
        g.d.check("sync", (g.d.stream_synchronize)(g.stream))
            .unwrap();
    }
}

fn copy_out(g: &Gpu, src: CuDevicePtr, n: usize) -> Vec<u32> {
    let mut v = vec![0u32; n];
    // SAFETY: as above.
    unsafe {
        g.d.check(
            "dtoh",
            (g.d.memcpy_dtoh_async)(v.as_mut_ptr().cast(), src, n * 4, g.stream),
        )
        .unwrap();
        g.d.check("sync", (g.d.stream_synchronize)(g.stream))
            .unwrap();
    }
    v
}

/// One replayed launch of `add_one` over `words` words with N passes under `config`.
fn replay_add_one(
    g: &Gpu,
    words: usize,
    passes: u64,
    config: SnapshotConfig,
) -> (Vec<u32>, ReplayRecord, u64) {
    let d = g.d;
    let mut buf: CuDevicePtr = 0;
    // SAFETY: allocates in the current (primary) context.
    unsafe {
        d.check("alloc", (d.mem_alloc)(&mut buf, words * 4))
            .unwrap()
    };
    let start: Vec<u32> = (0..words as u32).map(|i| i.wrapping_mul(7)).collect();
    copy_in(g, buf, &start);

    let inventory = Arc::new(Inventory::new());
    inventory.on_alloc(NewAllocation {
        base: buf,
        size: (words * 4) as u64,
        owner_agent: 0,
        kind: MemoryKind::CoarseDevice,
    });
    // SAFETY: the primary context retained by setup, alive for the test process.
    let memory = unsafe {
        CudaMemory::new(
            d,
            inventory.clone(),
            g.ctx,
            ShadowBudget::default(),
            config.store,
        )
    }
    .unwrap();
    let snapshotter = Snapshotter::new(inventory, memory, config).unwrap();
    let locks = AgentLocks::new();
    locks.set_enabled(true);
    let filter = Filter::for_replay(0);

    let mut arg_p = buf;
    let mut arg_n = words as u32;
    let mut args: [*mut c_void; 2] = [(&raw mut arg_p).cast(), (&raw mut arg_n).cast()];
    let launch = Launch {
        ctx: g.ctx,
        device: 0,
        api: LaunchApi::Kernel,
        per_thread: false,
        function: g.function,
        grid: [(words as u32).div_ceil(256), 1, 1],
        block: [256, 1, 1],
        shared_mem_bytes: 0,
        stream: g.stream,
        params: args.as_mut_ptr(),
        extra: std::ptr::null_mut(),
    };
    let ops = CudaLaunch {
        driver: d,
        launch,
        drainer: None,
    };
    let info = launch.dispatch_info(1, |a| ops.attribute(a));
    let registry = ContextRegistry::new();
    let cx = WindowContext {
        locks: &locks,
        snapshotter: &snapshotter,
        filter: &filter,
        registry: &registry,
        group: &[],
    };
    let mut tool = FixedPasses::new(passes);
    let window = Window::enter(cx, &mut tool, info, &ops);
    // The application's own launch.
    // SAFETY: the kernel's two parameters, alive until the window exits.
    let rc = unsafe {
        (d.launch_kernel)(
            g.function,
            launch.grid[0],
            1,
            1,
            256,
            1,
            1,
            0,
            g.stream,
            args.as_mut_ptr(),
            std::ptr::null_mut(),
        )
    };
    let record = window.exit(
        &mut tool,
        &registry,
        &ops,
        d.check("launch", rc).map_err(|e| e.to_string()),
    );
    let out = copy_out(g, buf, words);
    drop(snapshotter);
    // SAFETY: our allocation, no longer used.
    unsafe { (d.mem_free)(buf) };
    let wrong = out
        .iter()
        .zip(&start)
        .filter(|(o, s)| **o != s.wrapping_add(1))
        .count() as u64;
    (out, record, wrong)
}

#[test]
fn add_one_replayed_four_times_leaves_one_increment_on_the_gpu() {
    let Some(d) = gpu() else { return };
    let g = setup(d);
    for (store, strategy) in [
        (StoreTier::Device, RestoreStrategy::Full),
        (StoreTier::Device, RestoreStrategy::Hash),
        (StoreTier::Device, RestoreStrategy::Writeset),
        (StoreTier::Device, RestoreStrategy::WritesetUnverified),
        (StoreTier::Host, RestoreStrategy::Full),
        (StoreTier::Host, RestoreStrategy::Hash),
        (StoreTier::Host, RestoreStrategy::Writeset),
    ] {
        let config = SnapshotConfig::default()
            .with_store(store)
            .with_strategy(strategy);
        let (_, record, wrong) = replay_add_one(&g, 16 << 20, 4, config);
        let c = &record.cost;
        eprintln!(
            "{store} {strategy}: {:?}, {wrong} wrong words, snapshot {} B in {:?}, \
             restores {} B in {:?}",
            record.outcome, c.bytes_snapshotted, c.snapshot, c.bytes_restored, c.restore_times
        );
        assert_eq!(
            record.outcome,
            ReplayOutcome::Replayed {
                passes: 4,
                end: LoopEnd::LastPass
            },
            "{store} {strategy}"
        );
        assert_eq!(wrong, 0, "{store} {strategy}");
        assert_eq!(c.bytes_snapshotted, 64 << 20, "{store} {strategy}");
    }
}

#[test]
fn without_replay_the_kernel_runs_once() {
    let Some(d) = gpu() else { return };
    let g = setup(d);
    let (_, record, wrong) = replay_add_one(&g, 1 << 20, 1, SnapshotConfig::default());
    assert!(
        matches!(record.outcome, ReplayOutcome::RanOnce { .. }),
        "{:?}",
        record.outcome
    );
    assert_eq!(wrong, 0);
}

#[test]
fn the_demo_leaves_one_increment_for_every_tier_and_strategy() {
    use kreplay_cuda::demo::{DemoConfig, run};
    let Some(_) = gpu() else { return };
    for store in ["device", "host"] {
        for strategy in ["auto", "full", "hash", "writeset"] {
            for written in [0.01, 1.0] {
                let lookup = |k: &str| match k {
                    "KREPLAY_SNAPSHOT_STORE" => Some(store.to_string()),
                    "KREPLAY_RESTORE" => Some(strategy.to_string()),
                    _ => None,
                };
                let config = DemoConfig::new(0, 64 << 20, written, 4, lookup).unwrap();
                let report = run(&config).unwrap();
                eprint!("{}", report.table());
                assert!(report.passed(), "{store} {strategy} {written}");
                assert_eq!(report.restores.len(), 3, "{store} {strategy} {written}");
            }
        }
    }
}

#[test]
fn a_pass_is_timed_on_the_gpu_within_the_host_monotonic_clock() {
    let Some(d) = gpu() else { return };
    let g = setup(d);
    let words = 16usize << 20;
    let mut buf: CuDevicePtr = 0;
    // SAFETY: allocates in the current (primary) context.
    unsafe {
        d.check("alloc", (d.mem_alloc)(&mut buf, words * 4))
            .unwrap()
    };
    let timer = kreplay_cuda::timing::PassTimer::new(d, g.stream).unwrap();
    let mut arg_p = buf;
    let mut arg_n = words as u32;
    let mut args: [*mut c_void; 2] = [(&raw mut arg_p).cast(), (&raw mut arg_n).cast()];
    let before = kreplay_cuda::timing::monotonic_ns();
    timer.mark_start().unwrap();
    // SAFETY: the kernel's two parameters, alive until the timer waited for it.
    let rc = unsafe {
        (d.launch_kernel)(
            g.function,
            (words as u32).div_ceil(256),
            1,
            1,
            256,
            1,
            1,
            0,
            g.stream,
            args.as_mut_ptr(),
            std::ptr::null_mut(),
        )
    };
    d.check("launch", rc).unwrap();
    timer.mark_end().unwrap();
    let (start, end) = timer.times().unwrap();
    let after = kreplay_cuda::timing::monotonic_ns();
    eprintln!(
        "pass of 64 MiB: {} ns on the GPU, began {} ns after the host asked",
        end - start,
        start.saturating_sub(before)
    );
    assert!(end > start, "{start}..{end}");
    assert!(start + 100_000 >= before, "began before it was launched");
    assert!(end <= after, "ended after the host saw it end");
    drop(timer);
    // SAFETY: our allocation, no longer used.
    unsafe { (d.mem_free)(buf) };
}
