//! KERNEL_DISPATCH records on the CUDA backend, without a GPU: a tool configures dispatch
//! tracing on one context and kernel replay on another through `kreplay.h`'s functions, and
//! launches go through the CUDA replay window (`kreplay_cuda::Window`) over a host "device".
//! Every pass of a replayed launch gets a COMPLETE record with its `replay_pass`, before that
//! pass's PASS EXIT and only while the tracing context is not masked off; a launch that is not
//! replayed gets one record with `KREPLAY_REPLAY_PASS_NONE`. The fake marks stand in for the GPU
//! events the injected library records around each pass's launch.

use std::cell::Cell;
use std::ffi::c_void;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use kreplay::abi::{
    CallbackKind, CallbackRecord, KernelDispatchData, KernelDispatchOperation, REPLAY_PASS_NONE,
    UserData,
};
use kreplay_cuda::inject::{DispatchRecord, Tools};
use kreplay_cuda::{LaunchOps, Mark, Window};
use kreplay_passloop::{DispatchInfo, ReplayOutcome};
use kreplay_snapshot::SnapshotConfig;

mod cuda_common;
use cuda_common::fake_device::{HostMemory, OneDevice};
use cuda_common::{PASSES, TRACED, create_context, event, events, host_launch_ops, trace};

const WORDS: usize = 256;

/// The fake GPU clock, in nanoseconds.
static CLOCK: AtomicU64 = AtomicU64::new(1_000);

/// The dispatch tracer: one line per COMPLETE record.
unsafe extern "C" fn on_dispatch(record: CallbackRecord, _: *mut UserData, _: *mut c_void) {
    if record.operation != KernelDispatchOperation::COMPLETE.0 {
        return;
    }
    // SAFETY: a KERNEL_DISPATCH record carries a KernelDispatchData, valid during the call.
    let d = unsafe { &*record.payload.cast::<KernelDispatchData>() };
    let pass = if d.replay_pass == REPLAY_PASS_NONE {
        "none".to_string()
    } else {
        d.replay_pass.to_string()
    };
    event(format!(
        "DISPATCH {} pass {pass} {}..{}",
        d.dispatch_info.dispatch_id, d.start_timestamp, d.end_timestamp
    ));
}

/// A launch whose "GPU" stamps the clock at each mark, as the injected library's events do,
/// and reports completions through the C ABI's CUDA tool side.
struct FakeLaunch {
    memory: Arc<HostMemory>,
    start: Cell<u64>,
    end: Cell<u64>,
}

impl FakeLaunch {
    fn kernel(&self) {
        self.memory.add_one();
        CLOCK.fetch_add(500, Ordering::Relaxed);
    }
}

impl LaunchOps for FakeLaunch {
    host_launch_ops!();
    fn mark(&self, at: Mark) {
        let now = CLOCK.fetch_add(10, Ordering::Relaxed);
        match at {
            Mark::Before => self.start.set(now),
            Mark::After => self.end.set(now),
        }
    }
    fn completed(&self, info: &DispatchInfo, pass: Option<u64>) {
        kreplay::cuda_tool::CudaTools.dispatch_completed(&DispatchRecord {
            info: *info,
            pass,
            start_ns: self.start.get(),
            end_ns: self.end.get(),
        });
    }
}

fn configure() {
    let (replay, traced) = (create_context(), create_context());
    *TRACED.lock().unwrap() = Some(traced);
    trace(
        replay,
        CallbackKind::KERNEL_REPLAY,
        &[],
        cuda_common::mask_pass_1,
        0,
    );
    trace(traced, CallbackKind::KERNEL_DISPATCH, &[], on_dispatch, 0);
}

#[test]
fn every_pass_of_a_cuda_launch_and_every_launch_run_once_gets_a_dispatch_record() {
    configure();
    let tools = kreplay::cuda_tool::CudaTools;
    assert!(tools.dispatch_tracing_configured());

    let device = OneDevice::new(WORDS, 0, SnapshotConfig::default());
    let memory = device.memory.clone();
    let cx = device.context(tools.contexts());
    let ops = FakeLaunch {
        memory: memory.clone(),
        start: Cell::new(0),
        end: Cell::new(0),
    };
    let launch = |id: u64| {
        let info = DispatchInfo {
            dispatch_id: id,
            ..DispatchInfo::default()
        };
        let mut tool = tools
            .replay_tool()
            .expect("the KERNEL_REPLAY owner decides");
        let window = Window::enter(cx, &mut *tool, info, &ops);
        event("app launch");
        ops.kernel();
        let record = window.exit(&mut *tool, tools.contexts(), &ops, Ok(()));
        event("API EXIT");
        record.outcome
    };

    // Replayed in three passes; the tracing context is masked off for pass 1 only.
    assert!(matches!(
        launch(7),
        ReplayOutcome::Replayed { passes: 3, .. }
    ));
    // Opted out: runs once, one record without a pass.
    PASSES.store(0, Ordering::Relaxed);
    assert!(matches!(launch(8), ReplayOutcome::RanOnce { .. }));

    let events = events();
    let lines: Vec<&str> = events.iter().map(|e| e.as_str()).collect();
    // Timestamps: the marks around each pass's launch (10 ns apart, the kernel in between).
    assert_eq!(
        lines,
        [
            "PASS ENTER 0",
            "app launch",
            "DISPATCH 7 pass 0 1000..1510",
            "PASS EXIT 0",
            "PASS ENTER 1",
            "relaunch",
            "PASS EXIT 1",
            "PASS ENTER 2",
            "relaunch",
            "DISPATCH 7 pass 2 2040..2550",
            "PASS EXIT 2",
            "API EXIT",
            "app launch",
            "DISPATCH 8 pass none 2560..3070",
            "API EXIT",
        ]
    );
    let got = memory.0.lock().unwrap().clone();
    assert!(
        got.iter().enumerate().all(|(i, &x)| x == i as u32 + 2),
        "two launches, each as one run"
    );
}
