//! KERNEL_DISPATCH records as a tool sees them, across replays, masks, several contexts,
//! threads, finalization and a completion kreplay cannot watch. Each test runs in a child
//! process (process-wide state).

use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_void};
use std::process::Command;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use kreplay::abi::{
    CallbackKind, CallbackPhase, CallbackRecord, ClientFinalizeFn, ClientId, ContextHandle,
    KernelDispatchData, KernelDispatchInfo, KernelDispatchOperation, KernelReplayData,
    KernelReplayOperation, Status, ToolConfigureResult, UserData,
};
use kreplay::api::*;
use kreplay_softhsa::testing::{Dispatch, Hsa, PoolKind};
use kreplay_softhsa::{OwnedApiTable, WorkGroup, register_kernel};

const CHILD_ENV: &str = "KREPLAY_DISPATCH_RECORDS_TEST";

fn isolated(name: &str, body: fn()) {
    if std::env::var(CHILD_ENV).as_deref() == Ok(name) {
        body();
        println!("child-done:{name}");
        return;
    }
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", name, "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, name)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stdout.contains(&format!("child-done:{name}")),
        "{name} failed ({})\n--- stdout ---\n{stdout}\n--- stderr ---\n{stderr}",
        out.status
    );
}

#[derive(Clone, Copy, Debug)]
struct Rec {
    ctx: u64,
    op: u32,
    phase: u32,
    corr: u64,
    dispatch: u64,
    pass: u64,
    start: u64,
    end: u64,
    ud_in: u64,
    after_finalize: bool,
}

static RECS: Mutex<Vec<Rec>> = Mutex::new(Vec::new());
static FINALIZED: AtomicBool = AtomicBool::new(false);
static CTXS: Mutex<Vec<ContextHandle>> = Mutex::new(Vec::new());
/// Pass count per dispatch chosen by the test (0 = opt out).
static PASSES: AtomicU64 = AtomicU64::new(3);
/// Context index (into CTXS) to start from inside the first ENQUEUE ENTER of context 1.
static LATE: Mutex<Option<ContextHandle>> = Mutex::new(None);

unsafe extern "C" fn on_dispatch(record: CallbackRecord, ud: *mut UserData, _: *mut c_void) {
    // SAFETY: KERNEL_DISPATCH payload.
    let p = unsafe { &*record.payload.cast::<KernelDispatchData>() };
    // SAFETY: valid for the call.
    let ud = unsafe { &mut *ud };
    RECS.lock().unwrap().push(Rec {
        ctx: record.context_id.handle,
        op: record.operation,
        phase: record.phase.0,
        corr: record.correlation_id,
        dispatch: p.dispatch_info.dispatch_id,
        pass: p.replay_pass,
        start: p.start_timestamp,
        end: p.end_timestamp,
        ud_in: ud.bits(),
        after_finalize: FINALIZED.load(Ordering::SeqCst),
    });
    if record.phase == CallbackPhase::ENTER {
        ud.value = record.context_id.handle * 1_000_000 + record.correlation_id;
        if let Some(late) = LATE.lock().unwrap().take() {
            assert_eq!(kreplay_start_context(late), Status::SUCCESS);
        }
    }
}

unsafe extern "C" fn pass_count(_: KernelDispatchInfo, _: UserData) -> u64 {
    PASSES.load(Ordering::SeqCst)
}

unsafe extern "C" fn on_replay(record: CallbackRecord, _: *mut UserData, _: *mut c_void) {
    if record.payload.is_null() {
        return;
    }
    let op = KernelReplayOperation(record.operation);
    if op == KernelReplayOperation::CONFIG && record.phase == CallbackPhase::ENTER {
        // SAFETY: CONFIG payload.
        let p = unsafe { &mut *record.payload.cast::<KernelReplayData>() };
        if PASSES.load(Ordering::SeqCst) != 0 {
            p.replay_pass_count = Some(pass_count);
        }
    }
    if op == KernelReplayOperation::PASS && record.phase == CallbackPhase::ENTER {
        // SAFETY: PASS payload.
        let p = unsafe { &mut *record.payload.cast::<KernelReplayData>() };
        let b = CTXS.lock().unwrap()[2];
        // Context 2 (B) masked off on pass 1 only.
        let status = match p.current_pass {
            // SAFETY: kreplay's toggle, set for PASS ENTER, with a context of this tool.
            1 => unsafe { p.replay_stop_context.unwrap()(b) },
            // SAFETY: as above.
            2 => unsafe { p.replay_start_context.unwrap()(b) },
            _ => Status::SUCCESS,
        };
        assert_eq!(status, Status::SUCCESS);
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
        finalize: Some(finalize),
        tool_data: std::ptr::null_mut(),
    }))
}

unsafe extern "C" fn finalize(_: *mut c_void) {
    FINALIZED.store(true, Ordering::SeqCst);
}

/// Contexts: 0 replay owner, 1 A, 2 B (dispatch), 3 C (dispatch, started late or never).
unsafe extern "C" fn initialize(_: ClientFinalizeFn, _: *mut c_void) -> c_int {
    let mut ctxs = Vec::new();
    for i in 0..4 {
        let mut ctx = ContextHandle::default();
        // SAFETY: a valid out-pointer.
        assert_eq!(unsafe { kreplay_create_context(&mut ctx) }, Status::SUCCESS);
        let (kind, cb): (CallbackKind, kreplay::abi::CallbackFn) = if i == 0 {
            (CallbackKind::KERNEL_REPLAY, on_replay)
        } else {
            (CallbackKind::KERNEL_DISPATCH, on_dispatch)
        };
        // SAFETY: a context of this tool; the callback and its data outlive the process's use.
        let s = unsafe {
            kreplay_configure_callback_tracing_service(
                ctx,
                kind,
                std::ptr::null(),
                0,
                Some(cb),
                std::ptr::null_mut(),
            )
        };
        assert_eq!(s, Status::SUCCESS);
        if i < 3 {
            assert_eq!(kreplay_start_context(ctx), Status::SUCCESS);
        }
        ctxs.push(ctx);
    }
    *CTXS.lock().unwrap() = ctxs;
    0
}

#[repr(C)]
#[derive(Clone, Copy)]
struct AddArgs {
    data: *mut u32,
    len: u32,
}

fn add_one(group: &WorkGroup) {
    // SAFETY: every dispatch of this kernel carries an `AddArgs` block.
    let args: AddArgs = unsafe { group.kernargs() };
    for [x, _, _] in group.work_items() {
        if x < args.len {
            // SAFETY: the buffer holds `len` u32; each work-item owns index `x`.
            unsafe { *args.data.add(x as usize) += 1 };
        }
    }
}

struct App {
    hsa: Hsa,
    kernel: u64,
}

fn start_app() -> App {
    assert_eq!(kreplay_force_configure(Some(configure)), Status::SUCCESS);
    let kernel = register_kernel("add_one", add_one);
    let mut table = OwnedApiTable::softhsa();
    let source = Hsa::softhsa();
    std::mem::forget(source.init().expect("hsa_init"));
    // SAFETY: a complete, writable copy of softhsa's table that outlives every call through it.
    unsafe { kreplay::hsa_tool::on_load(table.as_mut_ptr()) }.expect("kreplay loads");
    // SAFETY: the table kreplay is installed in, alive for the test.
    let hsa = unsafe { Hsa::from_table(table.table()) };
    std::mem::forget(hsa.init().expect("hsa_init"));
    std::mem::forget(table);
    App { hsa, kernel }
}

/// Runs `n` dispatches on a fresh queue of `gpu`; returns the app signal's (start, end) per
/// dispatch, in order.
fn run_dispatches(
    app: &App,
    gpu_index: usize,
    n: usize,
    mut before: impl FnMut(usize),
) -> Vec<(u64, u64)> {
    let hsa = &app.hsa;
    let gpu = hsa.gpu_agents().unwrap()[gpu_index];
    let coarse = hsa.coarse_pool(gpu).unwrap();
    let kernarg_pool = hsa
        .agents()
        .unwrap()
        .into_iter()
        .find_map(|a| hsa.pool(a, PoolKind::Kernarg).ok())
        .unwrap();
    let words = 256u32;
    let data = hsa
        .allocate(coarse, words as usize * 4)
        .unwrap()
        .cast::<u32>();
    let args = hsa
        .allocate(kernarg_pool, size_of::<AddArgs>())
        .unwrap()
        .cast::<AddArgs>();
    // SAFETY: a kernarg allocation large enough for `AddArgs`.
    unsafe { args.write(AddArgs { data, len: words }) };
    let queue = hsa.queue_create(gpu, 64).unwrap();
    let mut times = Vec::new();
    for i in 0..n {
        before(i);
        let done = hsa.signal_create(1).unwrap();
        let d = Dispatch::linear(app.kernel, words, 64, args.cast(), done);
        // SAFETY: a live queue; the arguments outlive the dispatch (waited for below).
        unsafe { hsa.dispatch(queue, &d) };
        assert!(
            hsa.wait_zero(done, Duration::from_secs(30)),
            "completion fired"
        );
        let mut t = hsa_sys::hsa_amd_profiling_dispatch_time_t { start: 0, end: 0 };
        let f = hsa.amd().hsa_amd_profiling_get_dispatch_time_fn.unwrap();
        // SAFETY: the runtime's entry with a valid out-pointer.
        let st = unsafe { f(gpu, done, &mut t) };
        assert_eq!(st, hsa_sys::HSA_STATUS_SUCCESS);
        times.push((t.start, t.end));
    }
    // A COMPLETE record is delivered before the application's completion fires: nothing to
    // wait for.
    // SAFETY: the buffer holds `words` u32, and its dispatches completed.
    let values = unsafe { std::slice::from_raw_parts(data, words as usize) }.to_vec();
    assert!(
        values.iter().all(|&v| v == n as u32),
        "memory: {:?}",
        &values[..4]
    );
    times
}

fn ctx(i: usize) -> u64 {
    CTXS.lock().unwrap()[i].handle
}

const ENQ: u32 = KernelDispatchOperation::ENQUEUE.0;
const CMP: u32 = KernelDispatchOperation::COMPLETE.0;

/// Every ENQUEUE EXIT has an ENTER of the same context and correlation, carrying its user data.
fn check_enqueue_pairs(recs: &[Rec], problems: &mut Vec<String>) {
    let mut enters: HashMap<(u64, u64), u64> = HashMap::new();
    for r in recs.iter().filter(|r| r.op == ENQ && r.phase == 1) {
        if enters
            .insert((r.ctx, r.corr), r.ctx * 1_000_000 + r.corr)
            .is_some()
        {
            problems.push(format!("duplicate ENQUEUE ENTER {r:?}"));
        }
    }
    for r in recs.iter().filter(|r| r.op == ENQ && r.phase == 2) {
        match enters.get(&(r.ctx, r.corr)) {
            None => problems.push(format!("ENQUEUE EXIT without ENTER {r:?}")),
            Some(&ud) if ud != r.ud_in => {
                problems.push(format!("user data not carried: want {ud}, {r:?}"))
            }
            _ => {}
        }
    }
}

fn replay_body() {
    let app = start_app();
    // dispatch i: 3 passes, opt out, 1 pass, 2 passes, 3 passes
    let plan = [3u64, 0, 1, 2, 3];
    let times = run_dispatches(&app, 0, plan.len(), |i| {
        PASSES.store(plan[i], Ordering::SeqCst)
    });
    let recs = RECS.lock().unwrap().clone();
    let mut problems = Vec::new();
    check_enqueue_pairs(&recs, &mut problems);
    let mut dispatch_ids: Vec<u64> = recs.iter().map(|r| r.dispatch).collect();
    dispatch_ids.dedup();
    dispatch_ids.sort();
    dispatch_ids.dedup();
    assert_eq!(dispatch_ids.len(), plan.len(), "{recs:#?}");
    for (i, (&id, &passes)) in dispatch_ids.iter().zip(plan.iter()).enumerate() {
        let replayed = passes > 1;
        let pass_list: Vec<u64> = if replayed {
            (0..passes).collect()
        } else {
            vec![u64::MAX]
        };
        for c in 1..=3usize {
            for &pass in &pass_list {
                let expected = match c {
                    3 => 0,
                    2 if pass == 1 => 0,
                    _ => 1,
                };
                for (op, phase) in [(ENQ, 1), (ENQ, 2), (CMP, 0)] {
                    let n = recs
                        .iter()
                        .filter(|r| {
                            r.ctx == ctx(c)
                                && r.dispatch == id
                                && r.pass == pass
                                && r.op == op
                                && r.phase == phase
                        })
                        .count();
                    if n != expected {
                        problems.push(format!(
                            "dispatch {i} (id {id}) ctx {c} pass {pass} op {op} phase {phase}: {n} records, want {expected}"
                        ));
                    }
                }
            }
            let completes: Vec<&Rec> = recs
                .iter()
                .filter(|r| r.ctx == ctx(c) && r.dispatch == id && r.op == CMP)
                .collect();
            for w in completes.windows(2) {
                if w[0].end > w[1].start {
                    problems.push(format!("pass times overlap: {:?} then {:?}", w[0], w[1]));
                }
            }
            for r in &completes {
                if r.start > r.end || r.start == 0 {
                    problems.push(format!("bad times {r:?}"));
                }
                if (r.pass == 0 || r.pass == u64::MAX) && (r.start, r.end) != times[i] {
                    problems.push(format!(
                        "first pass times {:?} != application signal times {:?} ({r:?})",
                        (r.start, r.end),
                        times[i]
                    ));
                }
            }
        }
    }
    kreplay::hsa_tool::on_unload();
    assert!(FINALIZED.load(Ordering::SeqCst));
    assert!(problems.is_empty(), "{problems:#?}");
}

#[test]
fn replay_dispatch_records_per_context_and_pass() {
    isolated("replay_dispatch_records_per_context_and_pass", replay_body);
}

/// Context 3 started from inside context 1's ENQUEUE ENTER: it must not get an EXIT of an
/// operation whose ENTER it never saw.
fn late_start_body() {
    let app = start_app();
    PASSES.store(0, Ordering::SeqCst);
    run_dispatches(&app, 0, 1, |_| {});
    *LATE.lock().unwrap() = Some(CTXS.lock().unwrap()[3]);
    run_dispatches(&app, 0, 2, |_| {});
    PASSES.store(3, Ordering::SeqCst);
    kreplay_stop_context(CTXS.lock().unwrap()[3]);
    *LATE.lock().unwrap() = Some(CTXS.lock().unwrap()[3]);
    run_dispatches(&app, 0, 1, |_| {});
    let recs = RECS.lock().unwrap().clone();
    let mut problems = Vec::new();
    check_enqueue_pairs(&recs, &mut problems);
    kreplay::hsa_tool::on_unload();
    assert!(problems.is_empty(), "{problems:#?}");
}

#[test]
fn context_started_inside_enqueue_enter_gets_no_orphan_exit() {
    isolated(
        "context_started_inside_enqueue_enter_gets_no_orphan_exit",
        late_start_body,
    );
}

/// Many threads, both GPUs, replays and ordinary dispatches, and a thread toggling context 3:
/// every delivered record set is consistent, and nothing arrives after finalize.
fn threads_body() {
    let app = start_app();
    let gpus = app.hsa.gpu_agents().unwrap().len();
    println!("gpus: {gpus}");
    PASSES.store(2, Ordering::SeqCst);
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        s.spawn(|| {
            let c = CTXS.lock().unwrap()[3];
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                if i.is_multiple_of(2) {
                    kreplay_start_context(c);
                } else {
                    kreplay_stop_context(c);
                }
                i += 1;
                std::thread::sleep(Duration::from_micros(50));
            }
        });
        let handles: Vec<_> = (0..4)
            .map(|t| {
                let app = &app;
                s.spawn(move || run_dispatches(app, t % gpus, 10, |_| {}))
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
        stop.store(true, Ordering::Relaxed);
    });
    let recs = RECS.lock().unwrap().clone();
    let mut problems = Vec::new();
    // Contexts 1 and 2 (never stopped): exactly one ENTER/EXIT/COMPLETE per pass.
    let mut counts: HashMap<(u64, u64, u64, u32, u32), u32> = HashMap::new();
    for r in &recs {
        *counts
            .entry((r.ctx, r.dispatch, r.pass, r.op, r.phase))
            .or_default() += 1;
    }
    let ids: std::collections::BTreeSet<u64> = recs.iter().map(|r| r.dispatch).collect();
    if ids.len() != 40 {
        problems.push(format!("{} dispatch ids, want 40", ids.len()));
    }
    for &id in &ids {
        for c in [1, 2] {
            let pass_list: Vec<u64> = vec![0, 1];
            for pass in pass_list {
                for k in [(ENQ, 1), (ENQ, 2), (CMP, 0)] {
                    let n = counts
                        .get(&(ctx(c), id, pass, k.0, k.1))
                        .copied()
                        .unwrap_or(0);
                    // context 2 is masked off on pass 1
                    let want = if c == 2 && pass == 1 { 0 } else { 1 };
                    if n != want {
                        problems.push(format!(
                            "id {id} ctx {c} pass {pass} {k:?}: {n}, want {want}"
                        ));
                    }
                }
            }
        }
    }
    RECS.lock().unwrap().clear();
    kreplay::hsa_tool::on_unload();
    // After finalization: more work, no records.
    run_dispatches(&app, 0, 3, |_| {});
    let after = RECS.lock().unwrap().clone();
    if !after.is_empty() || after.iter().any(|r| r.after_finalize) {
        problems.push(format!(
            "{} records after finalize: {:?}",
            after.len(),
            after[0]
        ));
    }
    let mut orphan = Vec::new();
    check_enqueue_pairs(&recs, &mut orphan);
    println!("orphans in the toggled context: {}", orphan.len());
    for o in orphan.iter().take(3) {
        println!("  {o}");
    }
    assert!(problems.is_empty(), "{problems:#?}");
}

#[test]
fn many_threads_two_agents_records_consistent() {
    isolated("many_threads_two_agents_records_consistent", threads_body);
}

/// A traced ordinary dispatch whose completion kreplay cannot watch (softhsa `signal_create`
/// fault while the packet is forwarded): it got ENQUEUE ENTER/EXIT and never its COMPLETE
/// (docs/abi.md: "COMPLETE (2): phase NONE once the kernel finished"). Every ENQUEUE a tool
/// gets has its COMPLETE; such a dispatch is forwarded untraced, with a warning.
fn proxy_fault_body() {
    use kreplay_softhsa::faults::{Fault, FaultPlan, install};
    let app = start_app();
    PASSES.store(0, Ordering::SeqCst); // opt out: the ordinary path
    let hsa = &app.hsa;
    let gpu = hsa.gpu_agents().unwrap()[0];
    let coarse = hsa.coarse_pool(gpu).unwrap();
    let kernarg_pool = hsa
        .agents()
        .unwrap()
        .into_iter()
        .find_map(|a| hsa.pool(a, PoolKind::Kernarg).ok())
        .unwrap();
    let data = hsa.allocate(coarse, 64 * 4).unwrap().cast::<u32>();
    let args = hsa
        .allocate(kernarg_pool, size_of::<AddArgs>())
        .unwrap()
        .cast::<AddArgs>();
    // SAFETY: a kernarg allocation large enough for `AddArgs`.
    unsafe { args.write(AddArgs { data, len: 64 }) };
    let queue = hsa.queue_create(gpu, 64).unwrap();
    let done = hsa.signal_create(1).unwrap();
    install(Some(FaultPlan::new(7).with(Fault::SignalCreate, 1.0)));
    let d = Dispatch::linear(app.kernel, 64, 64, args.cast(), done);
    // SAFETY: a live queue; the arguments outlive the dispatch (waited for below).
    unsafe { hsa.dispatch(queue, &d) };
    assert!(
        hsa.wait_zero(done, Duration::from_secs(30)),
        "completion fired"
    );
    install(None);
    let recs = RECS.lock().unwrap().clone();
    kreplay::hsa_tool::on_unload();
    for c in [1usize, 2] {
        let enq = recs
            .iter()
            .filter(|r| r.ctx == ctx(c) && r.op == ENQ)
            .count();
        let cmp = recs
            .iter()
            .filter(|r| r.ctx == ctx(c) && r.op == CMP)
            .count();
        assert_eq!(
            enq,
            2 * cmp,
            "ctx {c}: an ENQUEUE without its COMPLETE: {recs:#?}"
        );
    }
}

#[test]
fn complete_not_lost_when_proxy_signal_cannot_be_created() {
    isolated(
        "complete_not_lost_when_proxy_signal_cannot_be_created",
        proxy_fault_body,
    );
}
