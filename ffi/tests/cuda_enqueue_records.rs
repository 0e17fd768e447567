//! KERNEL_DISPATCH ENQUEUE records on the CUDA backend, without a GPU: a tool configures kernel
//! replay on one context, full dispatch tracing on a second and COMPLETE-only tracing on a third
//! through `kreplay.h`'s functions; launches go through the CUDA replay window
//! (`kreplay_cuda::Window`) over a host "device", with the C ABI's CUDA tool side announcing
//! each submission the way the injected library does.
//!
//! As on HSA, every submission gets ENQUEUE ENTER before it and ENQUEUE EXIT after it: each pass
//! of a replayed launch (with its `replay_pass`, under that pass's context mask, between its
//! PASS ENTER and its COMPLETE) and every launch that runs once (opted out, declined, no tool
//! deciding launches; `KREPLAY_REPLAY_PASS_NONE`). ENTER and EXIT share a correlation id and the
//! `user_data` the tool wrote at ENTER, and carry the dispatch info of that pass's COMPLETE.
//! The COMPLETE-only tracer gets no ENQUEUE at all.

use std::cell::Cell;
use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use kreplay::abi::{
    CallbackKind, CallbackPhase, CallbackRecord, KernelDispatchData, KernelDispatchInfo,
    KernelDispatchOperation, REPLAY_PASS_NONE, UserData,
};
use kreplay_cuda::inject::{DispatchRecord, Tools};
use kreplay_cuda::{Enqueued, LaunchOps, Window};
use kreplay_passloop::{DispatchInfo, FixedPasses, ReplayOutcome, ReplayTool};
use kreplay_snapshot::SnapshotConfig;

mod cuda_common;
use cuda_common::fake_device::{HostMemory, OneDevice};
use cuda_common::{
    LOG_CONFIG_EXIT, PASSES, TRACED, create_context, event, events, host_launch_ops, trace,
};

const WORDS: usize = 256;

/// (operation, phase, dispatch id, pass) of a record.
type RecordKey = (u32, u32, u64, u64);
/// Dispatch info of each record the full tracer received.
static INFOS: Mutex<Vec<(RecordKey, KernelDispatchInfo)>> = Mutex::new(Vec::new());
/// Correlation id of each ENQUEUE ENTER, by (dispatch id, pass).
static CORRELATION: Mutex<Option<HashMap<(u64, u64), u64>>> = Mutex::new(None);
static USER_DATA_ERRORS: AtomicU64 = AtomicU64::new(0);
static CORRELATION_ERRORS: AtomicU64 = AtomicU64::new(0);

const FULL: usize = 1;
const COMPLETE_ONLY: usize = 2;

/// Both dispatch tracers (`data` says which): one line per record.
unsafe extern "C" fn on_dispatch(record: CallbackRecord, user: *mut UserData, data: *mut c_void) {
    let tracer = if data as usize == FULL { "T" } else { "C" };
    // SAFETY: a KERNEL_DISPATCH record carries a KernelDispatchData, valid during the call.
    let d = unsafe { &*record.payload.cast::<KernelDispatchData>() };
    // SAFETY: kreplay passes a live user_data for the call.
    let user = unsafe { &mut *user };
    let id = d.dispatch_info.dispatch_id;
    let pass = if d.replay_pass == REPLAY_PASS_NONE {
        "none".to_string()
    } else {
        d.replay_pass.to_string()
    };
    let what = if record.operation == KernelDispatchOperation::ENQUEUE.0 {
        let key = (id, d.replay_pass);
        let mut ids = CORRELATION.lock().unwrap();
        let ids = ids.get_or_insert_with(HashMap::new);
        if record.phase == CallbackPhase::ENTER {
            // Written at ENTER, read back at EXIT.
            user.value = 0xe000 + id;
            ids.insert(key, record.correlation_id);
            "ENQUEUE ENTER"
        } else {
            // SAFETY: every bit pattern is a valid u64.
            if unsafe { user.value } != 0xe000 + id {
                USER_DATA_ERRORS.fetch_add(1, Ordering::Relaxed);
            }
            if ids.get(&key) != Some(&record.correlation_id) {
                CORRELATION_ERRORS.fetch_add(1, Ordering::Relaxed);
            }
            "ENQUEUE EXIT"
        }
    } else {
        "COMPLETE"
    };
    if data as usize == FULL {
        INFOS.lock().unwrap().push((
            (record.operation, record.phase.0, id, d.replay_pass),
            d.dispatch_info,
        ));
    }
    event(format!("{tracer} {what} {id} pass {pass}"));
}

/// A launch whose completions and submissions reach the C ABI's CUDA tool side.
struct FakeLaunch {
    memory: Arc<HostMemory>,
    /// Live memory the snapshot cannot cover: replay is declined.
    uncovered: Cell<bool>,
}

impl FakeLaunch {
    fn kernel(&self) {
        self.memory.add_one();
    }
}

impl LaunchOps for FakeLaunch {
    host_launch_ops!();
    fn covered(&self) -> Result<(), String> {
        if self.uncovered.get() {
            Err("live managed memory".into())
        } else {
            Ok(())
        }
    }
    fn enqueue(&self, info: &DispatchInfo, pass: Option<u64>) -> Option<Enqueued> {
        kreplay::cuda_tool::CudaTools.dispatch_enqueue(info, pass)
    }
    fn completed(&self, info: &DispatchInfo, pass: Option<u64>) {
        kreplay::cuda_tool::CudaTools.dispatch_completed(&DispatchRecord {
            info: *info,
            pass,
            start_ns: 1_000,
            end_ns: 2_000,
        });
    }
}

fn configure() {
    let (replay, traced, complete_only) = (create_context(), create_context(), create_context());
    *TRACED.lock().unwrap() = Some(traced);
    // The replay owner notes its CONFIG EXIT: every record of a launch comes before it.
    LOG_CONFIG_EXIT.store(true, Ordering::Relaxed);
    trace(
        replay,
        CallbackKind::KERNEL_REPLAY,
        &[],
        cuda_common::mask_pass_1,
        0,
    );
    trace(
        traced,
        CallbackKind::KERNEL_DISPATCH,
        &[],
        on_dispatch,
        FULL,
    );
    trace(
        complete_only,
        CallbackKind::KERNEL_DISPATCH,
        &[KernelDispatchOperation::COMPLETE.0],
        on_dispatch,
        COMPLETE_ONLY,
    );
}

#[test]
fn every_submission_of_a_cuda_launch_gets_enqueue_records_like_on_hsa() {
    configure();
    let tools = kreplay::cuda_tool::CudaTools;
    assert!(tools.dispatch_tracing_configured());

    let device = OneDevice::new(WORDS, 3, SnapshotConfig::default());
    let memory = device.memory.clone();
    let cx = device.context(tools.contexts());
    let ops = FakeLaunch {
        memory: memory.clone(),
        uncovered: Cell::new(false),
    };
    let launch = |id: u64, tool: &mut dyn ReplayTool| {
        let info = DispatchInfo {
            agent_id: 3,
            queue_id: 0x77,
            kernel_id: 0x1234,
            dispatch_id: id,
            private_segment_size: 48,
            group_segment_size: 1280,
            workgroup_size: [128, 4, 1],
            grid_size: [1280, 8, 1],
        };
        let window = Window::enter(cx, tool, info, &ops);
        event("app launch");
        memory.add_one();
        let record = window.exit(tool, tools.contexts(), &ops, Ok(()));
        event("API EXIT");
        record.outcome
    };
    let owner = || {
        tools
            .replay_tool()
            .expect("the KERNEL_REPLAY owner decides")
    };

    // Replayed in three passes; the full tracer is masked off for pass 1 only.
    assert!(matches!(
        launch(7, &mut *owner()),
        ReplayOutcome::Replayed { passes: 3, .. }
    ));
    // Opted out: runs once.
    PASSES.store(0, Ordering::Relaxed);
    assert!(matches!(
        launch(8, &mut *owner()),
        ReplayOutcome::RanOnce { .. }
    ));
    // Declined (memory the snapshot cannot cover): runs once.
    PASSES.store(3, Ordering::Relaxed);
    ops.uncovered.set(true);
    let declined = launch(9, &mut *owner());
    assert!(declined.decline().is_some(), "{declined:?}");
    ops.uncovered.set(false);
    // No tool decides launches (what the injected library does without a KERNEL_REPLAY
    // service while dispatch tracing is configured): a window of one pass.
    assert!(matches!(
        launch(10, &mut FixedPasses::new(1)),
        ReplayOutcome::RanOnce { .. }
    ));

    let events = events();
    let lines: Vec<&str> = events.iter().map(|e| e.as_str()).collect();
    let once = |id: u64| {
        [
            format!("T ENQUEUE ENTER {id} pass none"),
            "app launch".to_string(),
            format!("T ENQUEUE EXIT {id} pass none"),
            format!("CONFIG EXIT {id}"),
            format!("T COMPLETE {id} pass none"),
            format!("C COMPLETE {id} pass none"),
            "API EXIT".to_string(),
        ]
    };
    let mut expected: Vec<String> = [
        "PASS ENTER 0",
        "T ENQUEUE ENTER 7 pass 0",
        "app launch",
        "T ENQUEUE EXIT 7 pass 0",
        "T COMPLETE 7 pass 0",
        "C COMPLETE 7 pass 0",
        "PASS EXIT 0",
        "PASS ENTER 1",
        "relaunch",
        "C COMPLETE 7 pass 1",
        "PASS EXIT 1",
        "PASS ENTER 2",
        "T ENQUEUE ENTER 7 pass 2",
        "relaunch",
        "T ENQUEUE EXIT 7 pass 2",
        "T COMPLETE 7 pass 2",
        "C COMPLETE 7 pass 2",
        "PASS EXIT 2",
        "CONFIG EXIT 7",
        "API EXIT",
    ]
    .map(String::from)
    .into();
    expected.extend(once(8));
    expected.extend(once(9));
    // No replay owner took part: no CONFIG EXIT.
    expected.extend(once(10).into_iter().filter(|l| l != "CONFIG EXIT 10"));
    assert_eq!(lines, expected);

    // ENTER and EXIT carry the dispatch info of the same pass's COMPLETE.
    let infos = INFOS.lock().unwrap().clone();
    let complete = KernelDispatchOperation::COMPLETE.0;
    let enqueue = KernelDispatchOperation::ENQUEUE.0;
    let mut enqueues = 0;
    for ((operation, _, id, pass), info) in &infos {
        if *operation != enqueue {
            continue;
        }
        enqueues += 1;
        let of_complete = infos
            .iter()
            .find(|((o, _, i, p), _)| *o == complete && i == id && p == pass)
            .map(|(_, info)| info)
            .expect("a COMPLETE for every ENQUEUE");
        assert_eq!(info, of_complete, "dispatch {id} pass {pass}");
        assert_eq!(info.agent_id.handle, 3);
        assert_eq!(info.queue_id.handle, 0x77);
        assert_eq!(info.kernel_id, 0x1234);
        assert_eq!(info.grid_size.x, 1280);
    }
    assert_eq!(
        enqueues,
        2 * (2 + 3),
        "ENTER and EXIT of 2 passes and 3 single runs"
    );
    assert_eq!(USER_DATA_ERRORS.load(Ordering::Relaxed), 0);
    assert_eq!(CORRELATION_ERRORS.load(Ordering::Relaxed), 0);
    let got = memory.0.lock().unwrap().clone();
    assert!(
        got.iter().enumerate().all(|(i, &x)| x == i as u32 + 4),
        "four launches, each as one run"
    );
}
