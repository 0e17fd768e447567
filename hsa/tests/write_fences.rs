//! Runtime writes that bypass kernels, racing a replay on the same agent (docs/abi.md §3 rule 9).
//!
//! A dispatch on GPU 0 is replayed 3 times; while its first pass runs, another thread writes a
//! *different* coarse-grained buffer of GPU 0 through one of the runtime's write paths. Every
//! coarse buffer of the agent is in the replay's snapshot, so a write that lands mid-replay is
//! reverted by the next restore (all 4096 words lost). Fenced, the write waits for the replay to
//! end and is what memory ends with.
//!
//! The first pass's kernel waits (bounded) for the write to return before it finishes: without
//! the fence the write lands while the pass runs, every time; with it, the write cannot return
//! before the replay ends, so the pass waits out its bound, which is what the test checks.

#[macro_use]
#[allow(dead_code, unused_macros)]
mod support;

use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use hsa_sys::*;
use kreplay_drain::DrainConfig;
use kreplay_hsa::InstallOptions;
use kreplay_passloop::{LoopEnd, ReplayOutcome, ToolAnswer};
use kreplay_snapshot::{RestoreStrategy, SnapshotConfig};
use kreplay_softhsa::WorkGroup;
use support::app::{self, App, Aql, Pools, Ptr, WAIT};
use support::tool::{Script, TestHooks};

/// Words the racing write covers.
const WORDS: usize = 4096;
/// How long the first pass waits for the racing write to return.
const WRITE_WINDOW: Duration = Duration::from_millis(300);

/// Set by the first pass's kernel once it runs (the replay window is open).
static PASS_RUNNING: AtomicBool = AtomicBool::new(false);
/// Set by the writing thread once its write returned (or, for an asynchronous write, landed).
static WRITE_DONE: AtomicBool = AtomicBool::new(false);
/// Set if any pass saw the write done while the replay was still running.
static WRITE_SEEN_MID_REPLAY: AtomicBool = AtomicBool::new(false);

#[repr(C)]
#[derive(Clone, Copy)]
struct Args {
    buf: u64,
    len: u32,
    pad: u32,
    /// Another allocation the dispatch points to without touching it (0: none): its snapshot
    /// holds it all the same.
    also: u64,
}

/// Applies `f` to `buf[i]` for every work-item `i` of `group` below `len`.
fn each_word(group: &WorkGroup, buf: u64, len: u32, f: impl Fn(&mut u32)) {
    for [i, _, _] in group.work_items() {
        if i < len {
            // SAFETY: `buf` holds `len` u32 (every kernel's arguments say so); each work-item
            // owns index `i`.
            f(unsafe { &mut *(buf as *mut u32).add(i as usize) });
        }
    }
}

/// `buf[i] += 1`; the first run also opens the window for the racing write and gives it up to
/// [`WRITE_WINDOW`] to complete.
fn racing_add(group: &WorkGroup) {
    // SAFETY: every dispatch of this kernel carries an `Args` block.
    let args: Args = unsafe { group.kernargs() };
    if group.group_id() == [0, 0, 0] {
        if !PASS_RUNNING.swap(true, Ordering::SeqCst) {
            let deadline = Instant::now() + WRITE_WINDOW;
            while !WRITE_DONE.load(Ordering::SeqCst) && Instant::now() < deadline {
                std::thread::yield_now();
            }
        }
        if WRITE_DONE.load(Ordering::SeqCst) {
            WRITE_SEEN_MID_REPLAY.store(true, Ordering::SeqCst);
        }
    }
    each_word(group, args.buf, args.len, |w| *w += 1);
}

/// Checks an HSA status.
fn ok(status: hsa_status_t, what: &str) {
    assert_eq!(status, HSA_STATUS_SUCCESS, "{what} failed with {status:#x}");
}

/// One runtime write path: writes [`WORDS`] words of `value` into `target` (a coarse buffer of
/// GPU 0) and returns once they landed. `source` is a host buffer holding those words.
type Write = fn(app: &App, target: Ptr, source: Ptr, value: u32);

#[repr(C)]
#[derive(Clone, Copy)]
struct FillArgs {
    buf: u64,
    len: u32,
    value: u32,
}

/// `buf[i] = value`.
fn fill_words(group: &WorkGroup) {
    // SAFETY: every dispatch of this kernel carries a `FillArgs` block.
    let args: FillArgs = unsafe { group.kernargs() };
    each_word(group, args.buf, args.len, |w| *w = args.value);
}

/// Set by [`slow_fill`] once it runs.
static SLOW_STARTED: AtomicBool = AtomicBool::new(false);
/// Set by [`slow_fill`] if a pass of the replay ran before it wrote.
static SLOW_SAW_PASS: AtomicBool = AtomicBool::new(false);

/// One work group: waits until a pass of the replay runs (at most [`WRITE_WINDOW`]), then sets
/// `buf[..len] = value`.
fn slow_fill(group: &WorkGroup) {
    // SAFETY: every dispatch of this kernel carries a `FillArgs` block.
    let args: FillArgs = unsafe { group.kernargs() };
    SLOW_STARTED.store(true, Ordering::SeqCst);
    let deadline = Instant::now() + WRITE_WINDOW;
    while !PASS_RUNNING.load(Ordering::SeqCst) && Instant::now() < deadline {
        std::thread::yield_now();
    }
    SLOW_SAW_PASS.store(PASS_RUNNING.load(Ordering::SeqCst), Ordering::SeqCst);
    for i in 0..args.len {
        // SAFETY: `buf` holds `len` u32.
        unsafe { *(args.buf as *mut u32).add(i as usize) = args.value };
    }
}

/// `buf[i] += 1`, marking the replay's passes as running.
fn marked_add(group: &WorkGroup) {
    // SAFETY: every dispatch of this kernel carries an `Args` block.
    let args: Args = unsafe { group.kernargs() };
    PASS_RUNNING.store(true, Ordering::SeqCst);
    each_word(group, args.buf, args.len, |w| *w += 1);
}

/// How many of the [`WORDS`] words at `target` are not `value` (a write's words lost).
fn words_other_than(app: &App, target: Ptr, value: u32) -> usize {
    app.read(target, WORDS)
        .iter()
        .filter(|&&w| w != value)
        .count()
}

/// Waits for an application completion signal of an asynchronous write.
fn landed(app: &App, signal: hsa_signal_t) {
    assert_eq!(app.wait_zero(signal), 0, "the write completed");
}

fn with_memory_copy(app: &App, target: Ptr, _source: Ptr, value: u32) {
    app.write(target, &[value; WORDS]);
}

fn with_memory_fill(app: &App, target: Ptr, _source: Ptr, value: u32) {
    let fill = app
        .amd()
        .hsa_amd_memory_fill_fn
        .expect("hsa_amd_memory_fill");
    // SAFETY: `target` holds WORDS u32 of a live allocation.
    ok(unsafe { fill(target.raw(), value, WORDS) }, "memory fill");
}

/// A kernel on GPU 1, granted access to GPU 0's buffer (`hsa_amd_agents_allow_access`, as
/// peer access needs on ROCm), fills it.
fn with_dispatch_on_the_other_gpu(app: &App, target: Ptr, _source: Ptr, value: u32) {
    let allow = app
        .amd()
        .hsa_amd_agents_allow_access_fn
        .expect("hsa_amd_agents_allow_access");
    let gpu1 = app.gpus[1];
    // SAFETY: one agent handle, alive for the call; `target` is a live allocation.
    ok(
        unsafe { allow(1, &gpu1, std::ptr::null(), target.raw()) },
        "allow access",
    );
    let pools = app.pools(gpu1);
    let kernel = kreplay_softhsa::register_kernel("fill_words", fill_words);
    let kernarg = app.kernargs(
        &pools,
        FillArgs {
            buf: target.0,
            len: WORDS as u32,
            value,
        },
    );
    let q = app.queue(gpu1);
    let done = app.signal(1);
    app.dispatch(q, Aql::dispatch(kernel, WORDS as u32, 64, kernarg, done));
    landed(app, done);
}

fn with_async_copy_rect(app: &App, target: Ptr, source: Ptr, _value: u32) {
    let rect = app
        .amd()
        .hsa_amd_memory_async_copy_rect_fn
        .expect("hsa_amd_memory_async_copy_rect");
    // 16 rows of 1 KiB, one slice.
    let pitched = |p: Ptr| hsa_pitched_ptr_t {
        base: p.raw(),
        pitch: 1024,
        slice: WORDS * 4,
    };
    let origin = hsa_dim3_t { x: 0, y: 0, z: 0 };
    let range = hsa_dim3_t {
        x: 1024,
        y: (WORDS * 4 / 1024) as u32,
        z: 1,
    };
    let done = app.signal(1);
    // SAFETY: both pitched regions lie inside live allocations of WORDS u32; the structs are
    // alive for the call.
    let status = unsafe {
        rect(
            &pitched(target),
            &origin,
            &pitched(source),
            &origin,
            &range,
            app.gpus[0],
            hsaHostToDevice,
            0,
            std::ptr::null(),
            done,
        )
    };
    ok(status, "rect copy");
    landed(app, done);
}

fn with_async_copy_on_engine(app: &App, target: Ptr, source: Ptr, _value: u32) {
    let amd = app.amd_v2().expect("a ROCm 5.6+ table");
    let copy = amd
        .hsa_amd_memory_async_copy_on_engine_fn
        .expect("hsa_amd_memory_async_copy_on_engine");
    let done = app.signal(1);
    // SAFETY: both ranges are WORDS u32 of live allocations; engine 0 exists on softhsa.
    let status = unsafe {
        copy(
            target.raw(),
            app.gpus[0],
            source.0 as *const c_void,
            app.cpu,
            WORDS * 4,
            0,
            std::ptr::null(),
            done,
            1,
            false,
        )
    };
    ok(status, "copy on engine");
    landed(app, done);
}

/// `hsa_amd_memory_async_batch_copy` (a ROCm 7 table): two operations sharing one completion
/// signal, the first copying the first half of `source` into `target` as one range, the second
/// the second half as a list of two ranges.
fn with_batch_copy(app: &App, target: Ptr, source: Ptr, _value: u32) {
    use hsa_sys::layouts::{
        HSA_AMD_MEMORY_COPY_OP_LINEAR, HSA_AMD_MEMORY_COPY_OP_VERSION, hsa_amd_memory_copy_op_t,
    };
    let amd = app.amd_v2().expect("a ROCm 7 table");
    let batch = amd
        .hsa_amd_memory_async_batch_copy_fn
        .expect("hsa_amd_memory_async_batch_copy");
    let (half, quarter) = ((WORDS * 2) as u64, (WORDS) as u64);
    let done = app.signal(2);
    let op = hsa_amd_memory_copy_op_t {
        version: HSA_AMD_MEMORY_COPY_OP_VERSION,
        type_: HSA_AMD_MEMORY_COPY_OP_LINEAR,
        completion_signal: done,
        src: source.0,
        src_agent: app.cpu.handle,
        dst_agent: app.gpus[0].handle,
        dst: target.0,
        size: [half, 0],
        ..Default::default()
    };
    let dsts = [target.0 + half, target.0 + half + quarter];
    let srcs = [source.0 + half, source.0 + half + quarter];
    let sizes = [quarter; 2];
    let agents = [app.gpus[0].handle; 2];
    let listed = hsa_amd_memory_copy_op_t {
        num_entries: 2,
        src: srcs.as_ptr() as u64,
        dst: dsts.as_ptr() as u64,
        dst_agent: agents.as_ptr() as u64,
        size: [sizes.as_ptr() as u64, 0],
        ..op
    };
    let ops = [op, listed];
    // SAFETY: two operations of the ROCm 7 layout; every range lies inside a live allocation of
    // WORDS u32, and the lists the second one points to outlive the copy (waited for below).
    let status = unsafe { batch(ops.as_ptr(), 2, 0, std::ptr::null()) };
    ok(status, "batch copy");
    landed(app, done);
}

/// `hsa_amd_ais_file_read` (a ROCm 7 table): the words, written to a file first, read from it
/// into `target`.
fn with_ais_file_read(app: &App, target: Ptr, _source: Ptr, value: u32) {
    use std::io::Write;
    use std::os::unix::io::AsRawFd;
    let amd = app.amd_v2().expect("a ROCm 7 table");
    let read = amd.hsa_amd_ais_file_read_fn.expect("hsa_amd_ais_file_read");
    let path = std::env::temp_dir().join(format!("kreplay-ais-read-{}", std::process::id()));
    let bytes: Vec<u8> = std::iter::repeat_n(value.to_ne_bytes(), WORDS)
        .flatten()
        .collect();
    let mut file = std::fs::File::create(&path).expect("a file in the temporary directory");
    file.write_all(&bytes).expect("the words written");
    let file = std::fs::File::open(&path).expect("the file opened");
    std::fs::remove_file(&path).expect("the file removed");
    let handle = hsa_sys::layouts::hsa_amd_ais_file_handle_t {
        fd: file.as_raw_fd(),
    };
    let (mut copied, mut error) = (0u64, 0i32);
    // SAFETY: an open file of WORDS words, read into a live allocation of WORDS u32; both out
    // pointers are locals alive for the call.
    let status = unsafe {
        read(
            handle,
            target.raw(),
            bytes.len() as u64,
            0,
            &mut copied,
            &mut error,
        )
    };
    ok(status, "ais file read");
    assert_eq!(
        (copied, error),
        (bytes.len() as u64, 0),
        "the whole file read"
    );
}

/// Replays a dispatch on GPU 0 three times while `write` fills another coarse buffer of GPU 0
/// during the first pass; checks that nothing of the write is lost and that the kernel's own
/// buffer holds single-run results.
fn race(strategy: RestoreStrategy, write: Write) {
    race_with(strategy, write, 3);
}

/// [`race`], where dispatches on agents other than GPU 0 ask for `other_passes` passes.
fn race_with(strategy: RestoreStrategy, write: Write, other_passes: u64) {
    race_on(
        strategy,
        write,
        other_passes,
        Target::Unreferenced,
        |app, pools| app.buffer(pools.coarse, &[1; WORDS]),
    );
}

/// Whether the replayed dispatch's arguments point to the written buffer.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Target {
    /// No: it is in the snapshot as the agent's own coarse memory.
    Unreferenced,
    /// Yes: it is in the snapshot because an argument points into it, whatever its owner.
    Referenced,
}

impl Target {
    /// The arguments of the replayed `x += 1` over the 256 words at `buf`, pointing to `target`
    /// too when referenced.
    fn args(self, buf: Ptr, target: Ptr) -> Args {
        Args {
            buf: buf.0,
            len: 256,
            pad: 0,
            also: if self == Target::Referenced {
                target.0
            } else {
                0
            },
        }
    }
}

/// A buffer of [`WORDS`] words holding 1 in system memory, which the CPU owns: in a replay's
/// snapshot only when an argument points into it, and any GPU's kernel may write it.
fn host_target(app: &App, _pools: &Pools) -> Ptr {
    app.buffer(app.host_pool(), &[1; WORDS])
}

/// [`race_with`] with the written buffer (of [`WORDS`] words holding 1, in GPU 0's snapshot)
/// made by `target`.
fn race_on(
    strategy: RestoreStrategy,
    write: Write,
    other_passes: u64,
    reference: Target,
    target: impl FnOnce(&App, &Pools) -> Ptr,
) {
    let snapshot = SnapshotConfig::default().with_strategy(strategy);
    let hooks = TestHooks::new(0);
    let app = app::install(
        hooks.clone(),
        InstallOptions {
            drain: DrainConfig::new(WAIT),
            snapshot,
            ..Default::default()
        },
    );
    hooks.configure_replay(true);
    let gpu0 = app.gpus[0].handle;
    hooks.set_script(Script::new(move |_, info| {
        ToolAnswer::passes(if info.agent_id == gpu0 {
            3
        } else {
            other_passes
        })
    }));
    let pools: Pools = app.pools(app.gpus[0]);
    let init: Vec<u32> = (0..256).map(|i| 7 * i).collect();
    let buf = app.buffer(pools.coarse, &init);
    let target = target(&app, &pools);
    let source = app.buffer(app.host_pool(), &[0x5eed; WORDS]);
    let kernel = kreplay_softhsa::register_kernel("racing_add", racing_add);
    let kernarg = app.kernargs(&pools, reference.args(buf, target));

    let writer = std::thread::spawn(move || {
        let deadline = Instant::now() + WAIT;
        while !PASS_RUNNING.load(Ordering::SeqCst) && Instant::now() < deadline {
            std::thread::yield_now();
        }
        assert!(PASS_RUNNING.load(Ordering::SeqCst), "the first pass ran");
        write(&app, target, source, 0x5eed);
        WRITE_DONE.store(true, Ordering::SeqCst);
    });
    let q = app.queue(app.gpus[0]);
    let done = app.signal(1);
    app.dispatch(q, Aql::dispatch(kernel, 256, 64, kernarg, done));
    assert_eq!(
        app.wait_zero(done),
        0,
        "the application's dispatch completed"
    );
    writer.join().expect("the writing thread ends");

    let dispatch = hooks.configured_dispatches()[0].dispatch_id;
    assert_eq!(
        hooks.finished_record(dispatch).outcome,
        ReplayOutcome::Replayed {
            passes: 3,
            end: LoopEnd::LastPass
        }
    );
    let lost = words_other_than(&app, target, 0x5eed);
    assert_eq!(lost, 0, "{lost} of {WORDS} written words were lost");
    assert!(
        !WRITE_SEEN_MID_REPLAY.load(Ordering::SeqCst),
        "the write completed while the replay was running"
    );
    let expected: Vec<u32> = init.iter().map(|v| v + 1).collect();
    assert_eq!(app.read(buf, 256), expected, "single-run results");
}

scenarios! {
    /// `hsa_memory_copy` into another coarse buffer of the agent, full restores.
    fn an_hsa_memory_copy_during_a_replay_is_not_undone_by_a_full_restore() {
        race(RestoreStrategy::Full, with_memory_copy);
    }

    /// The same under write-set restores.
    fn an_hsa_memory_copy_during_a_replay_is_not_undone_by_a_writeset_restore() {
        race(RestoreStrategy::Writeset, with_memory_copy);
    }

    /// `hsa_amd_memory_fill` into another coarse buffer of the agent.
    fn a_memory_fill_during_a_replay_is_not_undone_by_a_restore() {
        race(RestoreStrategy::Full, with_memory_fill);
    }

    /// A kernel on the other GPU, granted access, fills another coarse buffer of the agent.
    fn a_kernel_on_another_gpu_writing_the_agents_memory_during_a_replay_is_not_undone() {
        race(RestoreStrategy::Full, with_dispatch_on_the_other_gpu);
    }

    /// The same with the other GPU's dispatch not replayed (one pass): it goes through as an
    /// ordinary dispatch of its own agent, and the grant it follows was made while GPU 0's
    /// replay already held its agent.
    fn a_grant_and_an_ordinary_kernel_on_another_gpu_during_a_replay_are_not_undone() {
        race_with(RestoreStrategy::Full, with_dispatch_on_the_other_gpu, 1);
    }

    /// `hsa_amd_memory_async_copy_rect` into another coarse buffer of the agent.
    fn a_rect_copy_during_a_replay_is_not_undone_by_a_restore() {
        race(RestoreStrategy::Writeset, with_async_copy_rect);
    }

    /// A kernel on GPU 1, granted access to a buffer of system memory that GPU 0's replayed
    /// dispatch points to (so GPU 0's snapshot holds it), fills it; GPU 1's dispatch is replayed
    /// too. The CPU owns the buffer, so the grant links no GPUs: GPU 0's replay itself holds and
    /// drains every GPU while its snapshot holds memory any of them may write.
    fn a_kernel_on_another_gpu_writing_host_memory_a_replay_holds_is_not_undone() {
        race_on(
            RestoreStrategy::Full,
            with_dispatch_on_the_other_gpu,
            3,
            Target::Referenced,
            host_target,
        );
    }

    /// The same with GPU 1's dispatch run once: an ordinary dispatch, which waits for GPU 0's
    /// replay on GPU 1's reader side.
    fn an_ordinary_kernel_on_another_gpu_writing_host_memory_a_replay_holds_is_not_undone() {
        race_on(
            RestoreStrategy::Writeset,
            with_dispatch_on_the_other_gpu,
            1,
            Target::Referenced,
            host_target,
        );
    }

    /// `hsa_memory_copy` from memory the runtime does not know into the system-memory buffer a
    /// replay holds: no GPU owns either end, and the copy still waits for the replay.
    fn an_hsa_memory_copy_into_host_memory_a_replay_holds_is_not_undone() {
        race_on(
            RestoreStrategy::Full,
            with_memory_copy,
            3,
            Target::Referenced,
            host_target,
        );
    }

    /// `hsa_amd_memory_fill` of the system-memory buffer a replay holds.
    fn a_memory_fill_of_host_memory_a_replay_holds_is_not_undone() {
        race_on(
            RestoreStrategy::Hash,
            with_memory_fill,
            3,
            Target::Referenced,
            host_target,
        );
    }
}

/// A virtual memory mapping of GPU 0's coarse pool, [`WORDS`] words holding 1, writable by
/// GPU 0 only.
fn vmem_target(app: &App, pools: &Pools) -> Ptr {
    let amd = app.amd_v2().expect("a ROCm 6.x table");
    let size = WORDS * 4;
    let mut va: *mut c_void = std::ptr::null_mut();
    let mut handle = hsa_sys::layouts::hsa_amd_vmem_alloc_handle_t::default();
    let access = [hsa_sys::layouts::hsa_amd_memory_access_desc_t {
        permissions: HSA_ACCESS_PERMISSION_RW,
        agent_handle: app.gpus[0],
    }];
    // SAFETY: the ROCm 6.x entries with their documented arguments: a fresh reservation of
    // `size` bytes, a handle of that size from GPU 0's pool mapped over all of it, one access
    // entry alive for the call.
    unsafe {
        let reserve = amd.hsa_amd_vmem_address_reserve_fn.expect("reserve");
        ok(reserve(&mut va, size, 0, 0), "reserve");
        let create = amd.hsa_amd_vmem_handle_create_fn.expect("create");
        ok(create(pools.coarse, size, 0, 0, &mut handle), "create");
        let map = amd.hsa_amd_vmem_map_fn.expect("map");
        ok(map(va, size, 0, handle, 0), "map");
        let set_access = amd.hsa_amd_vmem_set_access_fn.expect("set access");
        ok(set_access(va, size, access.as_ptr(), 1), "set access");
    }
    let target = Ptr(va as u64);
    app.write(target, &[1; WORDS]);
    target
}

/// GPU 1 is given write access to GPU 0's mapping (`hsa_amd_vmem_set_access`), then fills it with
/// a kernel that runs once.
fn with_vmem_grant_and_dispatch_on_the_other_gpu(app: &App, target: Ptr, _source: Ptr, value: u32) {
    let amd = app.amd_v2().expect("a ROCm 6.x table");
    let access = [hsa_sys::layouts::hsa_amd_memory_access_desc_t {
        permissions: HSA_ACCESS_PERMISSION_RW,
        agent_handle: app.gpus[1],
    }];
    let set_access = amd.hsa_amd_vmem_set_access_fn.expect("set access");
    // SAFETY: `target` is a mapping of WORDS words; one access entry alive for the call.
    ok(
        unsafe { set_access(target.raw(), WORDS * 4, access.as_ptr(), 1) },
        "set access",
    );
    let pools = app.pools(app.gpus[1]);
    let kernel = kreplay_softhsa::register_kernel("fill_words", fill_words);
    let kernarg = app.kernargs(
        &pools,
        FillArgs {
            buf: target.0,
            len: WORDS as u32,
            value,
        },
    );
    let q = app.queue(app.gpus[1]);
    let done = app.signal(1);
    app.dispatch(q, Aql::dispatch(kernel, WORDS as u32, 64, kernarg, done));
    landed(app, done);
}

/// The vmem half of the grant fence: write access to a mapping of GPU 0 given to GPU 1 while
/// GPU 0's replay runs waits for that replay (it took its group before the grant), so GPU 1's
/// ordinary kernel that follows cannot write the mapping between a pass and a restore.
#[test]
fn a_vmem_grant_and_an_ordinary_kernel_on_another_gpu_during_a_replay_are_not_undone() {
    support::isolated_on(
        "a_vmem_grant_and_an_ordinary_kernel_on_another_gpu_during_a_replay_are_not_undone",
        &["6.2"],
        || {
            race_on(
                RestoreStrategy::Full,
                with_vmem_grant_and_dispatch_on_the_other_gpu,
                1,
                Target::Unreferenced,
                vmem_target,
            )
        },
    );
}

/// `hsa_amd_memory_async_copy_on_engine` (ROCm 5.6+ tables only) into another coarse buffer of
/// the agent.
#[test]
fn a_copy_on_engine_during_a_replay_is_not_undone_by_a_restore() {
    support::isolated_on(
        "a_copy_on_engine_during_a_replay_is_not_undone_by_a_restore",
        &["5.6", "6.2"],
        || race(RestoreStrategy::Full, with_async_copy_on_engine),
    );
}

/// `hsa_amd_memory_async_batch_copy` (ROCm 7 tables only) into another coarse buffer of the
/// agent: kreplay does not read the operations' destinations, and the batch waits for the
/// replay on every GPU and is drained as one copy.
#[test]
fn a_batch_copy_during_a_replay_is_not_undone_by_a_restore() {
    support::isolated_on(
        "a_batch_copy_during_a_replay_is_not_undone_by_a_restore",
        &["7"],
        || race(RestoreStrategy::Writeset, with_batch_copy),
    );
}

/// `hsa_amd_ais_file_read` (ROCm 7 tables only) into another coarse buffer of the agent.
#[test]
fn an_ais_file_read_during_a_replay_is_not_undone_by_a_restore() {
    support::isolated_on(
        "an_ais_file_read_during_a_replay_is_not_undone_by_a_restore",
        &["7"],
        || race(RestoreStrategy::Hash, with_ais_file_read),
    );
}

/// A batch whose operation has a version kreplay does not know is passed to the runtime as it
/// came (which refuses it here) and the tool is warned that such a batch is fenced for its
/// submission only.
#[test]
fn a_batch_copy_of_an_unknown_operation_version_is_forwarded_with_a_warning() {
    support::isolated_on(
        "a_batch_copy_of_an_unknown_operation_version_is_forwarded_with_a_warning",
        &["7"],
        || {
            use hsa_sys::layouts::hsa_amd_memory_copy_op_t;
            let hooks = TestHooks::new(0);
            let app = app::install(hooks.clone(), InstallOptions::default());
            hooks.configure_replay(true);
            let batch = app
                .amd_v2()
                .and_then(|amd| amd.hsa_amd_memory_async_batch_copy_fn)
                .expect("hsa_amd_memory_async_batch_copy");
            let pools = app.pools(app.gpus[0]);
            let (target, source) = (app.alloc(pools.coarse, 64), app.alloc(pools.coarse, 64));
            let done = app.signal(1);
            let op = hsa_amd_memory_copy_op_t {
                version: 2,
                completion_signal: done,
                src: source.0,
                src_agent: app.gpus[0].handle,
                dst_agent: app.gpus[0].handle,
                dst: target.0,
                size: [64, 0],
                ..Default::default()
            };
            // SAFETY: one operation, alive for the call; the runtime validates it.
            let status = unsafe { batch(&op, 1, 0, std::ptr::null()) };
            assert_eq!(
                status, HSA_STATUS_ERROR_INVALID_ARGUMENT,
                "the runtime's answer"
            );
            assert!(
                hooks.warned_keys().contains(&"batch_copy_version"),
                "warned: {:?}",
                hooks.warnings()
            );
        },
    );
}

/// A kernel on GPU 1, granted access to a buffer of GPU 0, is still running when a dispatch on
/// GPU 0 is replayed: the replay's drain waits for it (GPU 1 is in GPU 0's group), so its write
/// lands before the snapshot instead of between a pass and a restore that would undo it.
#[test]
fn a_kernel_of_a_peer_gpu_running_when_a_replay_begins_is_drained_before_the_snapshot() {
    support::isolated(
        "a_kernel_of_a_peer_gpu_running_when_a_replay_begins_is_drained_before_the_snapshot",
        || {
            running_when_a_replay_begins(Target::Unreferenced, |app, pools| {
                app.buffer(pools.coarse, &[1; WORDS])
            })
        },
    );
}

/// The same with the buffer in system memory, which GPU 0's replayed dispatch points to: GPU 1
/// is in no group with GPU 0, and the replay drains it because its snapshot holds memory any GPU
/// may write.
#[test]
fn a_kernel_of_another_gpu_writing_host_memory_when_a_replay_begins_is_drained_before_the_snapshot()
{
    support::isolated(
        "a_kernel_of_another_gpu_writing_host_memory_when_a_replay_begins_is_drained_before_the_snapshot",
        || running_when_a_replay_begins(Target::Referenced, host_target),
    );
}

/// A kernel on GPU 1, granted access to the buffer `target` makes, fills it while a dispatch on
/// GPU 0 (pointing to it or not, as `reference` says) is replayed; checks the fill was waited for
/// before the snapshot and none of it was lost.
fn running_when_a_replay_begins(reference: Target, target: impl FnOnce(&App, &Pools) -> Ptr) {
    let hooks = TestHooks::new(0);
    let app = app::install(
        hooks.clone(),
        InstallOptions {
            drain: DrainConfig::new(WAIT),
            ..Default::default()
        },
    );
    hooks.configure_replay(true);
    hooks.set_script(Script::passes(3));
    let (gpu0, gpu1) = (app.gpus[0], app.gpus[1]);
    let pools0 = app.pools(gpu0);
    let pools1 = app.pools(gpu1);
    let init: Vec<u32> = (0..256).map(|i| 3 * i).collect();
    let buf = app.buffer(pools0.coarse, &init);
    let target = target(&app, &pools0);
    let allow = app
        .amd()
        .hsa_amd_agents_allow_access_fn
        .expect("hsa_amd_agents_allow_access");
    // SAFETY: one agent handle, alive for the call; `target` is a live allocation.
    ok(
        unsafe { allow(1, &gpu1, std::ptr::null(), target.raw()) },
        "allow access",
    );

    let slow = kreplay_softhsa::register_kernel("slow_fill", slow_fill);
    let slow_args = app.kernargs(
        &pools1,
        FillArgs {
            buf: target.0,
            len: WORDS as u32,
            value: 0x5eed,
        },
    );
    let q1 = app.queue(gpu1);
    let slow_done = app.signal(1);
    // One pass: this dispatch is not the one replayed.
    hooks.set_script(Script::passes(1));
    app.dispatch(q1, Aql::dispatch(slow, 64, 64, slow_args, slow_done));
    let deadline = Instant::now() + WAIT;
    while !SLOW_STARTED.load(Ordering::SeqCst) && Instant::now() < deadline {
        std::thread::yield_now();
    }
    assert!(
        SLOW_STARTED.load(Ordering::SeqCst),
        "GPU 1's kernel started"
    );

    hooks.set_script(Script::passes(3));
    let add = kreplay_softhsa::register_kernel("marked_add", marked_add);
    let add_args = app.kernargs(&pools0, reference.args(buf, target));
    let q0 = app.queue(gpu0);
    let done = app.signal(1);
    app.dispatch(q0, Aql::dispatch(add, 256, 64, add_args, done));
    assert_eq!(app.wait_zero(done), 0, "GPU 0's dispatch completed");
    assert_eq!(app.wait_zero(slow_done), 0, "GPU 1's dispatch completed");
    let replayed = hooks
        .configured_dispatches()
        .iter()
        .map(|d| hooks.finished_record(d.dispatch_id).outcome)
        .filter(|o| matches!(o, ReplayOutcome::Replayed { passes: 3, .. }))
        .count();
    assert_eq!(replayed, 1, "GPU 0's dispatch was replayed");
    let lost = words_other_than(&app, target, 0x5eed);
    assert_eq!(lost, 0, "{lost} of {WORDS} words GPU 1 wrote were lost");
    assert!(
        !SLOW_SAW_PASS.load(Ordering::SeqCst),
        "GPU 1's kernel was still running when a pass on GPU 0 began"
    );
    let expected: Vec<u32> = init.iter().map(|v| v + 1).collect();
    assert_eq!(app.read(buf, 256), expected, "single-run results");
}
