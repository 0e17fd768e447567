//! The C ABI's tools on the CUDA backend, without a GPU: a KERNEL_REPLAY service configured
//! through `kreplay.h`'s functions decides launches that go through the CUDA replay window
//! (`kreplay_cuda::Window`), whose "device" is a host buffer and whose "kernel" adds 1 to every
//! word. The records reach the tool in the documented order, PASS ENTER of pass 0 before the
//! application's launch is submitted, with the CUDA dispatch-info mapping.

use std::ffi::c_void;
use std::sync::{Arc, Mutex};

use kreplay::abi::{
    CallbackKind, CallbackPhase, CallbackRecord, ContextHandle, KernelDispatchInfo,
    KernelReplayData, KernelReplayOperation, Status, UserData,
};
use kreplay_ctxmask::ContextRegistry;
use kreplay_cuda::inject::Tools;
use kreplay_cuda::{LaunchOps, Window};
use kreplay_passloop::{LoopEnd, ReplayOutcome};
use kreplay_snapshot::SnapshotConfig;

mod cuda_common;
use cuda_common::fake_device::{HostMemory, OneDevice};
use cuda_common::{create_context, event, events, host_launch_ops, trace};

const WORDS: usize = 1024;

static CONTEXT: Mutex<Option<ContextHandle>> = Mutex::new(None);
static INFOS: Mutex<Vec<KernelDispatchInfo>> = Mutex::new(Vec::new());

unsafe extern "C" fn three(_: KernelDispatchInfo, _: UserData) -> u64 {
    3
}

/// The tool: 3 passes; at PASS ENTER it masks its own context off (legal only while armed)
/// and notes the status.
unsafe extern "C" fn on_record(record: CallbackRecord, _: *mut UserData, _: *mut c_void) {
    let op = if record.operation == KernelReplayOperation::CONFIG.0 {
        "CONFIG"
    } else if record.operation == KernelReplayOperation::PASS.0 {
        "PASS"
    } else if record.operation == KernelReplayOperation::SNAPSHOT.0 {
        "SNAPSHOT"
    } else {
        "RESTORE"
    };
    let phase = if record.phase == CallbackPhase::ENTER {
        "ENTER"
    } else {
        "EXIT"
    };
    if op == "CONFIG" || op == "PASS" {
        // SAFETY: CONFIG and PASS records carry a KernelReplayData, valid during the call.
        let p = unsafe { &mut *record.payload.cast::<KernelReplayData>() };
        INFOS.lock().unwrap().push(p.dispatch_info);
        if op == "CONFIG" && phase == "ENTER" {
            p.replay_pass_count = Some(three);
        }
        if op == "PASS" && phase == "ENTER" {
            let ctx = CONTEXT.lock().unwrap().expect("context");
            let stop = p.replay_stop_context.expect("toggles armed at PASS ENTER");
            // SAFETY: the payload's own toggle, called during PASS ENTER.
            let status = unsafe { stop(ctx) };
            event(format!(
                "PASS ENTER {} toggle {}",
                p.current_pass,
                if status == Status::SUCCESS {
                    "ok"
                } else {
                    "refused"
                }
            ));
            return;
        }
        if op == "PASS" {
            event(format!("PASS EXIT {}", p.current_pass));
            return;
        }
    }
    event(format!("{op} {phase}"));
}

struct FakeLaunch(Arc<HostMemory>);

impl FakeLaunch {
    fn kernel(&self) {
        self.0.add_one();
    }
}

impl LaunchOps for FakeLaunch {
    host_launch_ops!();
}

#[test]
fn a_c_abi_tool_sees_cuda_launches_with_pass_0_entered_before_the_application_launch() {
    // The tool, configured through the C functions as a tool's initialize would.
    let ctx = create_context();
    *CONTEXT.lock().unwrap() = Some(ctx);
    trace(ctx, CallbackKind::KERNEL_REPLAY, &[], on_record, 0);

    let tools = kreplay::cuda_tool::CudaTools;
    assert!(
        tools.replay_wanted(),
        "ordinary launches take the reader side"
    );
    let mut tool = tools
        .replay_tool()
        .expect("the KERNEL_REPLAY owner decides");

    let device = OneDevice::new(WORDS, 0, SnapshotConfig::default());
    let memory = device.memory.clone();
    let cx = device.context(tools.contexts());
    // A launch as CUPTI describes it: 4 blocks of 64 threads on stream 0x77 of device 0.
    let launch = kreplay_cuda::Launch {
        ctx: std::ptr::null_mut(),
        device: 0,
        api: kreplay_cuda::LaunchApi::Kernel,
        per_thread: false,
        function: 0x1234 as *mut c_void,
        grid: [4, 1, 1],
        block: [64, 1, 1],
        shared_mem_bytes: 128,
        stream: 0x77 as *mut c_void,
        params: std::ptr::null_mut(),
        extra: std::ptr::null_mut(),
    };
    let info = launch.dispatch_info(7, |_| None);
    let ops = FakeLaunch(memory.clone());

    let window = Window::enter(cx, &mut *tool, info, &ops);
    // What the driver does between API ENTER and EXIT: submits the application's launch.
    event("app launch");
    ops.kernel();
    let record = window.exit(&mut *tool, tools.contexts(), &ops, Ok(()));
    tools.replay_finished(&record, "add_one");

    assert_eq!(
        record.outcome,
        ReplayOutcome::Replayed {
            passes: 3,
            end: LoopEnd::LastPass
        }
    );
    let got = memory.0.lock().unwrap().clone();
    assert!(
        got.iter().enumerate().all(|(i, &x)| x == i as u32 + 1),
        "three passes leave memory as one launch"
    );
    assert_eq!(
        events(),
        [
            "CONFIG ENTER",
            "SNAPSHOT ENTER",
            "SNAPSHOT EXIT",
            "PASS ENTER 0 toggle ok",
            "app launch",
            "PASS EXIT 0",
            "RESTORE ENTER",
            "RESTORE EXIT",
            "PASS ENTER 1 toggle ok",
            "relaunch",
            "PASS EXIT 1",
            "RESTORE ENTER",
            "RESTORE EXIT",
            "PASS ENTER 2 toggle ok",
            "relaunch",
            "PASS EXIT 2",
            "CONFIG EXIT",
        ]
    );
    // The dispatch-info mapping of docs/cuda.md, as the C payload carries it.
    let infos = INFOS.lock().unwrap();
    assert!(!infos.is_empty());
    for i in infos.iter() {
        assert_eq!(i.agent_id.handle, 0, "device ordinal");
        assert_eq!(i.queue_id.handle, 0x77, "the stream");
        assert_eq!(i.kernel_id, 0x1234, "the CUfunction");
        assert_eq!(i.dispatch_id, 7);
        assert_eq!((i.grid_size.x, i.grid_size.y), (256, 1), "threads");
        assert_eq!(i.workgroup_size.x, 64);
        assert_eq!(i.group_segment_size, 128, "dynamic shared memory");
    }
    assert!(
        !device.locks.agent_lock(0).is_locked(),
        "released at API EXIT"
    );
    let _ = ContextRegistry::global();
}

#[test]
fn without_cuda_the_injection_entry_point_refuses_and_leaves_the_process_alone() {
    // No libcuda on this machine (or a path that is not one): 0, with the reason on stderr.
    // SAFETY: setting a variable of this test process before the call reads it.
    unsafe { std::env::set_var("KREPLAY_CUDA_DRIVER", "/nonexistent/libcuda.so.1") };
    assert_eq!(kreplay::cuda_tool::InitializeInjection(), 0);
}
