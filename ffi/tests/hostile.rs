//! Hostile C input: seeded random calls of the C ABI with garbage (unknown handles, garbage
//! kinds and operations, NULL pointers, calls from the wrong phase, from other threads and from
//! inside callbacks) and a tool whose pass-count and continue answers are random, including
//! the invalid ones. The promises of docs/abi.md are asserted: nothing crashes or hangs, every
//! call returns a defined status (an error for input that is certainly invalid), the application's
//! results are those of one ordinary run, its completion fires exactly once per dispatch, and
//! every invalid answer is declined with its reason.
//!
//! kreplay's state is process-wide, so each test runs its body in a process of its own. The
//! seeds are fixed; `KREPLAY_HOSTILE_SEED=N` replaces them for a longer campaign.
//!
//! The unbounded answers (a pass count of `UINT64_MAX` or 2^40, 0 with a continue callback that
//! never says stop) run under `KREPLAY_MAX_PASSES=8`: each is declined as `invalid_pass_count` or
//! ends at the cap, saying so.

use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_void};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use kreplay::abi::{
    CallbackFn, CallbackKind, CallbackPhase, CallbackRecord, ClientFinalizeFn, ClientId,
    ContextHandle, ContinueFn, KernelDispatchInfo, KernelReplayData, KernelReplayOperation,
    PassCountFn, Status, ToolConfigureResult, UserData,
};
use kreplay::api::*;
use kreplay_softhsa::testing::{Dispatch, Hsa, PoolKind};
use kreplay_softhsa::{OwnedApiTable, WorkGroup, register_kernel};

/// Set in a child process to the name of the test it runs.
const CHILD_ENV: &str = "KREPLAY_HOSTILE_TEST";
/// The longest a child may run.
const CHILD_DEADLINE: Duration = Duration::from_secs(120);

/// Runs `body` in a child process running only test `name` (with `extra_env`), asserting that
/// it succeeded before the deadline; in that child, runs `body`.
fn isolated(name: &str, extra_env: &[(&str, &str)], body: fn()) {
    if std::env::var(CHILD_ENV).as_deref() == Ok(name) {
        body();
        println!("hostile-child-done:{name}");
        return;
    }
    let mut child = Command::new(std::env::current_exe().expect("the test binary"))
        .args([
            "--exact",
            name,
            "--nocapture",
            "--test-threads=1",
            "--include-ignored",
        ])
        .env(CHILD_ENV, name)
        .envs(extra_env.iter().copied())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("the child starts");
    let (tx, rx) = std::sync::mpsc::channel();
    let stdout = child.stdout.take().expect("piped");
    let stderr = child.stderr.take().expect("piped");
    for (i, mut pipe) in [
        Box::new(stdout) as Box<dyn std::io::Read + Send>,
        Box::new(stderr),
    ]
    .into_iter()
    .enumerate()
    {
        let tx = tx.clone();
        std::thread::spawn(move || {
            let mut text = String::new();
            let _ = pipe.read_to_string(&mut text);
            let _ = tx.send((i, text));
        });
    }
    drop(tx);
    let deadline = Instant::now() + CHILD_DEADLINE;
    let mut output = [String::new(), String::new()];
    let mut hung = false;
    for _ in 0..2 {
        match rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok((i, text)) => output[i] = text,
            Err(_) => {
                hung = true;
                break;
            }
        }
    }
    if hung {
        let _ = child.kill();
    }
    let status = child.wait().expect("the child is waited for");
    let report = format!(
        "--- stdout ---\n{}\n--- stderr ---\n{}",
        output[0], output[1]
    );
    assert!(
        !hung,
        "{name} hung (no end within {CHILD_DEADLINE:?})\n{report}"
    );
    assert!(status.success(), "{name} failed ({status})\n{report}");
    assert!(
        output[0].contains(&format!("hostile-child-done:{name}")),
        "{name} did not run its body\n{report}"
    );
}

/// splitmix64: the seeded stream every random choice comes from.
fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// `KREPLAY_HOSTILE_SEED` when set (for longer campaigns over many seeds), else `default`.
fn seed(default: u64) -> u64 {
    match std::env::var("KREPLAY_HOSTILE_SEED") {
        Ok(value) => value
            .parse()
            .unwrap_or_else(|_| panic!("KREPLAY_HOSTILE_SEED={value:?} is not a whole number")),
        Err(_) => default,
    }
}

static DRAWS: AtomicU64 = AtomicU64::new(0);
static SEED: AtomicU64 = AtomicU64::new(0);

fn draw() -> u64 {
    mix(SEED.load(Ordering::Relaxed) ^ mix(DRAWS.fetch_add(1, Ordering::Relaxed)))
}

fn pick<T: Copy>(items: &[T]) -> T {
    items[(draw() % items.len() as u64) as usize]
}

/// Counts of what the hostile calls returned.
#[derive(Default)]
struct Tally {
    calls: AtomicU64,
    problems: Mutex<Vec<String>>,
}

impl Tally {
    fn problem(&self, problem: String) {
        let mut problems = self.problems.lock().unwrap();
        if problems.len() < 50 {
            problems.push(problem);
        }
    }

    /// Checks a returned status: defined, and not SUCCESS when the input was certainly invalid.
    fn check(&self, what: &str, status: Status, must_fail: bool) {
        self.calls.fetch_add(1, Ordering::Relaxed);
        if status.label().is_none() {
            self.problem(format!("{what} returned an undefined status {status:?}"));
        } else if must_fail && status == Status::SUCCESS {
            self.problem(format!("{what} accepted invalid input"));
        }
    }
}

unsafe extern "C" fn ignore_record(_: CallbackRecord, _: *mut UserData, _: *mut c_void) {}

/// A context handle: a real one or garbage.
fn some_handle(real: &[ContextHandle]) -> (ContextHandle, bool) {
    if !real.is_empty() && draw().is_multiple_of(2) {
        (pick(real), true)
    } else {
        // Never a live context: 0, all ones, or a value with the top bit set.
        let garbage = pick(&[0, u64::MAX, 0xdead_beef | (1 << 63), draw() | (1 << 63)]);
        let known = real.iter().any(|c| c.handle == garbage);
        (ContextHandle { handle: garbage }, known)
    }
}

/// One random C ABI call with random (often invalid) arguments.
fn hostile_call(tally: &Tally, real: &[ContextHandle]) {
    match draw() % 7 {
        0 => {
            // SAFETY: NULL is allowed (it must be refused).
            let status = unsafe { kreplay_create_context(std::ptr::null_mut()) };
            tally.check("create_context(NULL)", status, true);
        }
        1 => {
            let (ctx, known) = some_handle(real);
            tally.check("start_context", kreplay_start_context(ctx), !known);
        }
        2 => {
            let (ctx, known) = some_handle(real);
            tally.check("stop_context", kreplay_stop_context(ctx), !known);
        }
        3 => {
            let (ctx, known) = some_handle(real);
            let mut active: c_int = -1;
            let null = draw().is_multiple_of(2);
            let out = if null {
                std::ptr::null_mut()
            } else {
                &raw mut active
            };
            // SAFETY: `out` is NULL or a live int.
            let status = unsafe { kreplay_context_is_active(ctx, out) };
            tally.check("context_is_active", status, null || !known);
            if status == Status::SUCCESS && active != 0 && active != 1 {
                tally.problem(format!("context_is_active wrote {active}"));
            }
        }
        4 => {
            let (ctx, known) = some_handle(real);
            let kind = CallbackKind(pick(&[0, 1, 2, 3, 4, 255, u32::MAX, draw() as u32]));
            let operations: Vec<u32> = (0..draw() % 4)
                .map(|_| pick(&[0, 1, 2, 3, 4, 5, 6, 99, u32::MAX]))
                .collect();
            let (ptr, count) = match draw() % 3 {
                0 => (std::ptr::null(), 0),
                1 => (std::ptr::null(), 1 + (draw() % 1000) as usize),
                _ => (operations.as_ptr(), operations.len()),
            };
            let callback: Option<CallbackFn> = if draw().is_multiple_of(3) {
                None
            } else {
                Some(ignore_record)
            };
            let certainly_invalid = !known
                || callback.is_none()
                || (ptr.is_null() && count > 0)
                || !(1..=2).contains(&kind.0);
            // SAFETY: `ptr` is NULL (with any count: it must then be refused or unread) or
            // points at `count` live u32s; the callback ignores everything.
            let status = unsafe {
                kreplay_configure_callback_tracing_service(
                    ctx,
                    kind,
                    ptr,
                    count,
                    callback,
                    std::ptr::null_mut(),
                )
            };
            tally.check(
                &format!(
                    "configure_callback_tracing_service(kind {}, {count} ops)",
                    kind.0
                ),
                status,
                certainly_invalid,
            );
        }
        5 => {
            let status = kreplay_force_configure(None);
            tally.check("force_configure(NULL)", status, true);
        }
        _ => {
            // SAFETY: NULL must be refused.
            let status = unsafe {
                kreplay_context_is_active(ContextHandle::default(), std::ptr::null_mut())
            };
            tally.check("context_is_active(NULL)", status, true);
        }
    }
}

/// Many threads calling the C ABI with garbage while a few real contexts exist: every call
/// returns a defined status, invalid input is refused, and real contexts still work after.
#[test]
fn random_garbage_calls_from_many_threads_get_defined_statuses() {
    isolated(
        "random_garbage_calls_from_many_threads_get_defined_statuses",
        &[],
        || {
            SEED.store(seed(0x4055_71e5), Ordering::Relaxed);
            let mut real = Vec::new();
            for _ in 0..4 {
                let mut ctx = ContextHandle::default();
                // SAFETY: a valid out-pointer.
                assert_eq!(unsafe { kreplay_create_context(&mut ctx) }, Status::SUCCESS);
                real.push(ctx);
            }
            let tally = Tally::default();
            std::thread::scope(|scope| {
                for _ in 0..8 {
                    scope.spawn(|| {
                        for _ in 0..2000 {
                            hostile_call(&tally, &real);
                        }
                    });
                }
            });
            let problems = tally.problems.lock().unwrap().clone();
            assert!(problems.is_empty(), "{problems:#?}");
            assert_eq!(tally.calls.load(Ordering::Relaxed), 16_000);
            // The real contexts still behave: start, query, stop.
            for &ctx in &real {
                assert_eq!(kreplay_start_context(ctx), Status::SUCCESS);
                let mut active = 0;
                // SAFETY: a valid out-pointer.
                let status = unsafe { kreplay_context_is_active(ctx, &mut active) };
                assert_eq!(status, Status::SUCCESS);
                assert_eq!(active, 1);
                assert_eq!(kreplay_stop_context(ctx), Status::SUCCESS);
            }
            println!("garbage calls: {}", tally.calls.load(Ordering::Relaxed));
        },
    );
}

// ---------------------------------------------------------------------------------------------
// A hostile tool under a real application

/// What the tool answered for one dispatch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Answer {
    /// `replay_pass_count` left NULL.
    OptOut,
    /// N with no continue callback.
    Passes(u64),
    /// N with a continue callback that stops at a random pass (or never: `None`).
    PassesWithContinue(u64, Option<u64>),
    /// 0 with no continue callback: invalid.
    ZeroWithoutContinue,
}

impl Answer {
    /// Whether kreplay must decline it as `invalid_pass_count` (0 without continue, or more
    /// passes than the cap).
    fn invalid(self, cap: u64) -> bool {
        match self {
            Answer::ZeroWithoutContinue => true,
            Answer::Passes(n) | Answer::PassesWithContinue(n, _) => n > cap,
            Answer::OptOut => false,
        }
    }

    /// Whether only kreplay's cap can end it (0 passes and a continue callback that never
    /// says stop).
    fn endless(self) -> bool {
        matches!(self, Answer::PassesWithContinue(0, None))
    }
}

struct HostileTool {
    unbounded: bool,
    tally: Tally,
    /// The tool's replay and dispatch-tracing contexts (toggled per pass only).
    contexts: Mutex<Vec<ContextHandle>>,
    /// Contexts with no service that the garbage calls may start and stop at will.
    spares: Mutex<Vec<ContextHandle>>,
    answers: Mutex<HashMap<u64, Answer>>,
    config_enters: AtomicU64,
    config_exits: AtomicU64,
}

static TOOL: OnceLock<HostileTool> = OnceLock::new();

fn tool() -> &'static HostileTool {
    TOOL.get().expect("the hostile tool is registered")
}

/// Runs a callback body; a panic is a problem, never an unwind into C.
fn guarded<R>(fallback: R, body: impl FnOnce(&HostileTool) -> R) -> R {
    let Some(tool) = TOOL.get() else {
        return fallback;
    };
    match catch_unwind(AssertUnwindSafe(|| body(tool))) {
        Ok(r) => r,
        Err(_) => {
            tool.tally.problem("a tool callback panicked".into());
            fallback
        }
    }
}

unsafe extern "C" fn configure(
    _: u32,
    _: *const c_char,
    _: u32,
    _: *mut ClientId,
) -> *mut ToolConfigureResult {
    Box::into_raw(Box::new(ToolConfigureResult {
        size: size_of::<ToolConfigureResult>(),
        initialize: Some(initialize),
        finalize: None,
        tool_data: std::ptr::null_mut(),
    }))
}

unsafe extern "C" fn initialize(_: ClientFinalizeFn, _: *mut c_void) -> c_int {
    guarded(1, |tool| {
        let mut contexts = Vec::new();
        for kind in [CallbackKind::KERNEL_REPLAY, CallbackKind::KERNEL_DISPATCH] {
            let mut ctx = ContextHandle::default();
            // SAFETY: a valid out-pointer.
            if unsafe { kreplay_create_context(&mut ctx) } != Status::SUCCESS {
                return 1;
            }
            let callback: CallbackFn = if kind == CallbackKind::KERNEL_REPLAY {
                on_replay
            } else {
                ignore_record
            };
            // SAFETY: all operations; the callback ignores its data.
            let status = unsafe {
                kreplay_configure_callback_tracing_service(
                    ctx,
                    kind,
                    std::ptr::null(),
                    0,
                    Some(callback),
                    std::ptr::null_mut(),
                )
            };
            if status != Status::SUCCESS || kreplay_start_context(ctx) != Status::SUCCESS {
                return 1;
            }
            contexts.push(ctx);
        }
        let mut spares = Vec::new();
        for _ in 0..2 {
            let mut ctx = ContextHandle::default();
            // SAFETY: a valid out-pointer.
            if unsafe { kreplay_create_context(&mut ctx) } != Status::SUCCESS {
                return 1;
            }
            spares.push(ctx);
        }
        // Garbage during initialize, too.
        for _ in 0..50 {
            hostile_call(&tool.tally, &spares);
        }
        *tool.contexts.lock().unwrap() = contexts;
        *tool.spares.lock().unwrap() = spares;
        0
    })
}

unsafe extern "C" fn pass_count(info: KernelDispatchInfo, _: UserData) -> u64 {
    guarded(1, |tool| {
        match tool.answers.lock().unwrap().get(&info.dispatch_id) {
            Some(Answer::Passes(n) | Answer::PassesWithContinue(n, _)) => *n,
            Some(Answer::ZeroWithoutContinue) => 0,
            _ => {
                tool.tally.problem(format!(
                    "pass count asked for dispatch {} without an answer",
                    info.dispatch_id
                ));
                1
            }
        }
    })
}

unsafe extern "C" fn continue_cb(
    info: KernelDispatchInfo,
    pass: u64,
    _total: u64,
    _: UserData,
) -> c_int {
    guarded(0, |tool| {
        let stop_at = match tool.answers.lock().unwrap().get(&info.dispatch_id) {
            Some(Answer::PassesWithContinue(_, stop_at)) => *stop_at,
            _ => Some(0),
        };
        match stop_at {
            Some(stop) if pass >= stop => 0,
            // Any non-zero int means "continue".
            _ => pick(&[1, -1, 42, c_int::MAX, c_int::MIN]),
        }
    })
}

/// The answer for dispatch `id`: random (threads interleave, so which dispatch gets which
/// random answer varies), except that every tenth dispatch answers 0 without a continue
/// callback (and, when unbounded, others `UINT64_MAX` and an endless loop), so every run has
/// those answers to check.
fn choose_answer(id: u64, unbounded: bool) -> Answer {
    match id % 10 {
        3 => return Answer::ZeroWithoutContinue,
        5 if unbounded => return Answer::Passes(u64::MAX),
        7 if unbounded => return Answer::PassesWithContinue(0, None),
        _ => {}
    }
    let n = pick(&[0u64, 1, 2, 3, 5]);
    match draw() % 5 {
        0 => Answer::OptOut,
        1 if n == 0 => Answer::ZeroWithoutContinue,
        1 => Answer::Passes(n),
        2 if unbounded => pick(&[
            Answer::Passes(u64::MAX),
            Answer::Passes(1 << 40),
            Answer::PassesWithContinue(0, None),
            Answer::PassesWithContinue(u64::MAX, None),
        ]),
        _ => Answer::PassesWithContinue(n, Some(draw() % 6)),
    }
}

unsafe extern "C" fn on_replay(record: CallbackRecord, _user: *mut UserData, _: *mut c_void) {
    guarded((), |tool| {
        let spares = tool.spares.lock().unwrap().clone();
        let mut contexts = tool.contexts.lock().unwrap().clone();
        contexts.extend_from_slice(&spares);
        // Garbage from inside every replay callback, on this thread and on another one. (It
        // starts and stops spare contexts only: stopping its own replay context would, rightly,
        // end the tool's replays.)
        hostile_call(&tool.tally, &spares);
        std::thread::scope(|scope| {
            scope.spawn(|| hostile_call(&tool.tally, &spares));
        });
        let operation = KernelReplayOperation(record.operation);
        if record.payload.is_null()
            || (operation != KernelReplayOperation::CONFIG
                && operation != KernelReplayOperation::PASS)
        {
            return;
        }
        // SAFETY: CONFIG and PASS records carry a replay payload, writable where kreplay.h says so,
        // valid for the callback.
        let payload = unsafe { &mut *record.payload.cast::<KernelReplayData>() };
        let id = payload.dispatch_info.dispatch_id;
        match (operation, record.phase) {
            (KernelReplayOperation::CONFIG, CallbackPhase::ENTER) => {
                tool.config_enters.fetch_add(1, Ordering::SeqCst);
                let answer = choose_answer(id, tool.unbounded);
                tool.answers.lock().unwrap().insert(id, answer);
                let (count, cont): (PassCountFn, ContinueFn) = match answer {
                    Answer::OptOut => (None, pick(&[None, Some(continue_cb as _)])),
                    Answer::Passes(_) | Answer::ZeroWithoutContinue => (Some(pass_count), None),
                    Answer::PassesWithContinue(..) => (Some(pass_count), Some(continue_cb)),
                };
                payload.replay_pass_count = count;
                payload.replay_continue = cont;
                // Toggles at CONFIG ENTER are garbage to kreplay: whatever the tool writes
                // into fields kreplay owns must not matter.
                payload.total_passes = draw();
                payload.current_pass = draw();
            }
            (KernelReplayOperation::CONFIG, CallbackPhase::EXIT) => {
                tool.config_exits.fetch_add(1, Ordering::SeqCst);
            }
            (KernelReplayOperation::PASS, CallbackPhase::ENTER) => {
                let (Some(start), Some(stop)) =
                    (payload.replay_start_context, payload.replay_stop_context)
                else {
                    tool.tally
                        .problem(format!("dispatch {id}: PASS ENTER without toggles"));
                    return;
                };
                for _ in 0..3 {
                    let (ctx, known) = some_handle(&contexts);
                    let toggle = if draw().is_multiple_of(2) {
                        start
                    } else {
                        stop
                    };
                    // SAFETY: kreplay's toggle, during PASS ENTER.
                    let status = unsafe { toggle(ctx) };
                    tool.tally.check("a PASS ENTER toggle", status, !known);
                }
                // The same toggles from another thread while PASS ENTER runs.
                std::thread::scope(|scope| {
                    scope.spawn(|| {
                        let (ctx, _) = some_handle(&contexts);
                        // SAFETY: kreplay's toggle, called from a thread that is not in a
                        // callback: it must refuse or mask, never crash.
                        let status = unsafe { start(ctx) };
                        tool.tally
                            .check("a toggle from another thread", status, false);
                    });
                });
                // Fields kreplay owns, overwritten by the tool.
                payload.replay_start_context = None;
                payload.replay_stop_context = None;
            }
            (KernelReplayOperation::PASS, CallbackPhase::EXIT) => {
                if let Some(stop) = payload.replay_stop_context {
                    let (ctx, _) = some_handle(&contexts);
                    // SAFETY: kreplay's toggle outside PASS ENTER: it must refuse.
                    let status = unsafe { stop(ctx) };
                    tool.tally.check("a toggle at PASS EXIT", status, true);
                }
                // PASS EXIT may replace the continue callback: sometimes with NULL.
                if draw().is_multiple_of(4) {
                    payload.replay_continue = None;
                }
            }
            _ => {}
        }
    });
}

#[repr(C)]
#[derive(Clone, Copy)]
struct AddArgs {
    data: *mut u32,
    len: u32,
}

fn add_one(group: &WorkGroup) {
    // SAFETY: every dispatch of this kernel carries `AddArgs`.
    let args: AddArgs = unsafe { group.kernargs() };
    for [x, _, _] in group.work_items() {
        if x < args.len {
            // SAFETY: `data` holds `len` u32s; each work-item owns one.
            unsafe { *args.data.add(x as usize) += 1 };
        }
    }
}

const THREADS: usize = 3;
/// kreplay's cap on passes when `KREPLAY_MAX_PASSES` is unset (README's configuration table).
const DEFAULT_MAX_PASSES: u64 = 1024;
const DISPATCHES_PER_THREAD: u32 = 40;
const WORDS: u32 = 1024;

/// The application: threads each adding one to their own buffer, one dispatch at a time,
/// waiting for each completion (bounded) and checking it fired exactly once.
fn hostile_tool_run(unbounded: bool) {
    SEED.store(
        seed(if unbounded { 0x0b0 } else { 0x7001 }),
        Ordering::Relaxed,
    );
    let registered = TOOL.set(HostileTool {
        unbounded,
        tally: Tally::default(),
        contexts: Mutex::default(),
        spares: Mutex::default(),
        answers: Mutex::default(),
        config_enters: AtomicU64::new(0),
        config_exits: AtomicU64::new(0),
    });
    assert!(registered.is_ok());
    assert_eq!(kreplay_force_configure(Some(configure)), Status::SUCCESS);
    kreplay::hsa_tool::set_collect_replay_records(true);
    let kernel = register_kernel("hostile_add_one", add_one);
    let mut table = OwnedApiTable::softhsa();
    let source = Hsa::softhsa();
    let _hold = source.init().expect("hsa_init");
    // SAFETY: a complete, writable copy of softhsa's table that outlives every call below.
    unsafe { kreplay::hsa_tool::on_load(table.as_mut_ptr()) }.expect("kreplay loads");
    // SAFETY: the table kreplay was installed in.
    let hsa = unsafe { Hsa::from_table(table.table()) };
    let _session = hsa.init().expect("hsa_init");
    let gpu = hsa.gpu_agents().unwrap()[0];
    let coarse = hsa.coarse_pool(gpu).unwrap();
    let kernarg_pool = hsa
        .agents()
        .unwrap()
        .into_iter()
        .find_map(|a| hsa.pool(a, PoolKind::Kernarg).ok())
        .expect("a kernarg pool");

    let results: Vec<(Vec<u32>, u32)> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..THREADS)
            .map(|t| {
                let hsa = &hsa;
                scope.spawn(move || {
                    let data = hsa
                        .allocate(coarse, WORDS as usize * 4)
                        .unwrap()
                        .cast::<u32>();
                    let args = hsa
                        .allocate(kernarg_pool, size_of::<AddArgs>())
                        .unwrap()
                        .cast::<AddArgs>();
                    // SAFETY: a fresh kernarg allocation with room for AddArgs.
                    unsafe { args.write(AddArgs { data, len: WORDS }) };
                    let queue = hsa.queue_create(gpu, 64).unwrap();
                    let done = hsa.signal_create(0).unwrap();
                    let mut bad_completions = 0;
                    for _ in 0..DISPATCHES_PER_THREAD {
                        hsa.signal_store(done, 1);
                        let dispatch = Dispatch::linear(kernel, WORDS, 64, args.cast(), done);
                        // SAFETY: a live queue; kernargs and buffer outlive the dispatch (waited
                        // for below).
                        unsafe { hsa.dispatch(queue, &dispatch) };
                        let fired = hsa.wait_zero(done, Duration::from_secs(30));
                        assert!(fired, "thread {t}: a completion never fired");
                        if hsa.signal_load(done) != 0 {
                            bad_completions += 1;
                        }
                    }
                    // SAFETY: every dispatch completed; the buffer holds WORDS u32s.
                    let values =
                        unsafe { std::slice::from_raw_parts(data, WORDS as usize) }.to_vec();
                    // SAFETY: idle, created above, destroyed once.
                    unsafe { hsa.queue_destroy(queue) }.unwrap();
                    (values, bad_completions)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("an application thread"))
            .collect()
    });
    kreplay::hsa_tool::on_unload();

    for (t, (values, bad)) in results.iter().enumerate() {
        assert_eq!(*bad, 0, "thread {t}: completions fired more than once");
        assert!(
            values.iter().all(|&v| v == DISPATCHES_PER_THREAD),
            "thread {t}: every dispatch added exactly one (found {:?}...)",
            &values[..4]
        );
    }
    let tool = tool();
    let problems = tool.tally.problems.lock().unwrap().clone();
    assert!(problems.is_empty(), "{problems:#?}");
    let dispatches = u64::from(DISPATCHES_PER_THREAD) * THREADS as u64;
    assert_eq!(tool.config_enters.load(Ordering::SeqCst), dispatches);
    assert_eq!(tool.config_exits.load(Ordering::SeqCst), dispatches);
    // Every invalid answer was declined with its reason; no valid one was.
    let answers = tool.answers.lock().unwrap().clone();
    let records = kreplay::hsa_tool::take_replay_records();
    assert_eq!(
        records.len() as u64,
        dispatches,
        "one loop record per dispatch"
    );
    let cap: u64 = std::env::var("KREPLAY_MAX_PASSES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(DEFAULT_MAX_PASSES);
    let mut invalid = 0;
    let mut endless = 0;
    for record in &records {
        let answer = answers[&record.info.dispatch_id];
        let reason = record.outcome.decline().map(|d| d.reason.as_str());
        if answer.invalid(cap) {
            invalid += 1;
            assert_eq!(
                reason,
                Some("invalid_pass_count"),
                "dispatch {} answered {answer:?}: {:?}",
                record.info.dispatch_id,
                record.outcome
            );
        } else {
            assert!(
                !record.outcome.is_failure() && reason.is_none(),
                "dispatch {} answered {answer:?}: {:?}",
                record.info.dispatch_id,
                record.outcome
            );
            assert!(
                record.cost.passes_run <= cap,
                "dispatch {} ran {} passes, over the cap of {cap}",
                record.info.dispatch_id,
                record.cost.passes_run
            );
            if answer.endless() {
                endless += 1;
                // Ended by the cap, or by the tool clearing its continue callback at PASS EXIT;
                // either way the outcome says why.
                let outcome = format!("{:?}", record.outcome);
                assert!(
                    outcome.contains("MaxPasses") || outcome.contains("ContinueCleared"),
                    "dispatch {} answered {answer:?}: {outcome}",
                    record.info.dispatch_id
                );
            }
        }
    }
    if unbounded {
        assert!(endless > 0, "the seed exercised endless answers");
    }
    assert!(invalid > 0, "the seed exercised invalid answers");
    let mut declines: HashMap<&str, u64> = HashMap::new();
    for record in &records {
        if let Some(decline) = record.outcome.decline() {
            *declines.entry(decline.reason.as_str()).or_default() += 1;
        }
    }
    println!("declines: {declines:?}");
    println!(
        "hostile tool: {dispatches} dispatches, {invalid} invalid answers, {} garbage calls",
        tool.tally.calls.load(Ordering::Relaxed)
    );
}

/// A tool answering with random valid and invalid pass counts and continue answers, toggling
/// garbage from every phase and thread, under a three-thread application: results and
/// completions are those of ordinary runs, invalid answers are declined with their reason.
#[test]
fn a_hostile_tool_neither_crashes_hangs_nor_changes_application_results() {
    isolated(
        "a_hostile_tool_neither_crashes_hangs_nor_changes_application_results",
        &[],
        || hostile_tool_run(false),
    );
}

/// The unbounded answers too (`UINT64_MAX`, 2^40, 0 with a continue callback that never stops):
/// each must end at the pass cap with its reason, the application unchanged.
#[test]
fn an_unbounded_pass_count_ends_at_the_cap_with_results_intact() {
    isolated(
        "an_unbounded_pass_count_ends_at_the_cap_with_results_intact",
        &[("KREPLAY_MAX_PASSES", "8")],
        || hostile_tool_run(true),
    );
}
