//! KERNEL_DISPATCH records on the CUDA backend, without a GPU: a tool configures dispatch
//! tracing on one context and kernel replay on another through `kreplay.h`'s functions, and
//! launches go through the CUDA replay window (`kreplay_cuda::Window`) over a host "device".
//! Every pass of a replayed launch gets a COMPLETE record with its `replay_pass`, before that
//! pass's PASS EXIT and only while the tracing context is not masked off; a launch that is not
//! replayed gets one record with `KREPLAY_REPLAY_PASS_NONE`. The fake marks stand in for the GPU
//! events the injected library records around each pass's launch.

use std::cell::Cell;
use std::ffi::c_void;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use kreplay::abi::{
    CallbackKind, CallbackPhase, CallbackRecord, ContextHandle, KernelDispatchData,
    KernelDispatchInfo, KernelDispatchOperation, KernelReplayData, KernelReplayOperation,
    REPLAY_PASS_NONE, Status, UserData,
};
use kreplay_cuda::inject::{DispatchRecord, Tools};
use kreplay_cuda::{LaunchOps, Mark, Window};
use kreplay_passloop::{DispatchInfo, ReplayOutcome};
use kreplay_snapshot::SnapshotConfig;

const WORDS: usize = 256;

#[path = "../../cuda/tests/fake_device/mod.rs"]
mod fake_device;
use fake_device::{HostMemory, OneDevice};

static EVENTS: Mutex<Vec<String>> = Mutex::new(Vec::new());
static TRACED: Mutex<Option<ContextHandle>> = Mutex::new(None);
/// Passes the replay tool asks for (0: it leaves `replay_pass_count` unset, an opt-out).
static PASSES: AtomicU64 = AtomicU64::new(3);
/// The fake GPU clock, in nanoseconds.
static CLOCK: AtomicU64 = AtomicU64::new(1_000);

fn event(e: impl Into<String>) {
    EVENTS.lock().unwrap().push(e.into());
}

unsafe extern "C" fn pass_count(_: KernelDispatchInfo, _: UserData) -> u64 {
    PASSES.load(Ordering::Relaxed)
}

/// The replay owner: masks the tracing context off at PASS ENTER 1, back on at PASS ENTER 2.
unsafe extern "C" fn on_replay(record: CallbackRecord, _: *mut UserData, _: *mut c_void) {
    let config = record.operation == KernelReplayOperation::CONFIG.0;
    let pass = record.operation == KernelReplayOperation::PASS.0;
    if !config && !pass {
        return;
    }
    // SAFETY: CONFIG and PASS records carry a KernelReplayData, valid during the call.
    let p = unsafe { &mut *record.payload.cast::<KernelReplayData>() };
    let enter = record.phase == CallbackPhase::ENTER;
    if config && enter && PASSES.load(Ordering::Relaxed) > 0 {
        p.replay_pass_count = Some(pass_count);
    }
    if pass && enter {
        let traced = TRACED.lock().unwrap().expect("tracing context");
        let toggle = match p.current_pass {
            1 => p.replay_stop_context,
            2 => p.replay_start_context,
            _ => None,
        };
        if let Some(toggle) = toggle {
            // SAFETY: the payload's own toggle, called during PASS ENTER.
            assert_eq!(unsafe { toggle(traced) }, Status::SUCCESS);
        }
        event(format!("PASS ENTER {}", p.current_pass));
    } else if pass {
        event(format!("PASS EXIT {}", p.current_pass));
    }
}

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
    fn replayable(&self) -> Result<(), String> {
        Ok(())
    }
    fn drain(&self) -> Result<(), String> {
        Ok(())
    }
    fn wait(&self) -> Result<(), String> {
        Ok(())
    }
    fn relaunch(&self) -> Result<(), String> {
        event("relaunch");
        self.kernel();
        Ok(())
    }
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
    let mut replay = ContextHandle::default();
    let mut traced = ContextHandle::default();
    // SAFETY: valid out-pointers.
    unsafe {
        assert_eq!(
            kreplay::api::kreplay_create_context(&mut replay),
            Status::SUCCESS
        );
        assert_eq!(
            kreplay::api::kreplay_create_context(&mut traced),
            Status::SUCCESS
        );
    }
    *TRACED.lock().unwrap() = Some(traced);
    for (ctx, kind, cb) in [
        (
            replay,
            CallbackKind::KERNEL_REPLAY,
            on_replay as unsafe extern "C" fn(CallbackRecord, *mut UserData, *mut c_void),
        ),
        (traced, CallbackKind::KERNEL_DISPATCH, on_dispatch),
    ] {
        // SAFETY: a valid context and callback; no operation filter.
        let status = unsafe {
            kreplay::api::kreplay_configure_callback_tracing_service(
                ctx,
                kind,
                std::ptr::null(),
                0,
                Some(cb),
                std::ptr::null_mut(),
            )
        };
        assert_eq!(status, Status::SUCCESS);
        assert_eq!(kreplay::api::kreplay_start_context(ctx), Status::SUCCESS);
    }
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

    let events = EVENTS.lock().unwrap().clone();
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
