//! What the C ABI's CUDA tests share, without a GPU: kreplay-cuda's host "device", the log of
//! events each test compares, a replay owner that masks a tracing context off for pass 1, tools
//! configured through `kreplay.h`'s functions, and the parts of a fake launch that do nothing.
#![allow(dead_code)]

use std::ffi::c_void;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use kreplay::abi::{
    CallbackKind, CallbackPhase, CallbackRecord, ContextHandle, KernelDispatchInfo,
    KernelReplayData, KernelReplayOperation, Status, UserData,
};

#[path = "../../../cuda/tests/fake_device/mod.rs"]
pub mod fake_device;

/// A tool callback of the C ABI.
pub type Callback = unsafe extern "C" fn(CallbackRecord, *mut UserData, *mut c_void);

static EVENTS: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// Adds a line to the log.
pub fn event(e: impl Into<String>) {
    EVENTS.lock().unwrap().push(e.into());
}

/// The log so far.
pub fn events() -> Vec<String> {
    EVENTS.lock().unwrap().clone()
}

/// Passes [`mask_pass_1`] asks for (0: it leaves `replay_pass_count` unset, an opt-out).
pub static PASSES: AtomicU64 = AtomicU64::new(3);
/// The context [`mask_pass_1`] masks off at PASS ENTER 1 and on again at PASS ENTER 2.
pub static TRACED: Mutex<Option<ContextHandle>> = Mutex::new(None);
/// Whether [`mask_pass_1`] logs CONFIG EXIT too.
pub static LOG_CONFIG_EXIT: AtomicBool = AtomicBool::new(false);

unsafe extern "C" fn pass_count(_: KernelDispatchInfo, _: UserData) -> u64 {
    PASSES.load(Ordering::Relaxed)
}

/// The replay owner: [`PASSES`] passes; masks [`TRACED`] off at PASS ENTER 1, back on at PASS
/// ENTER 2; logs PASS ENTER and EXIT (and CONFIG EXIT with [`LOG_CONFIG_EXIT`]).
pub unsafe extern "C" fn mask_pass_1(record: CallbackRecord, _: *mut UserData, _: *mut c_void) {
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
    if config && !enter && LOG_CONFIG_EXIT.load(Ordering::Relaxed) {
        event(format!("CONFIG EXIT {}", p.dispatch_info.dispatch_id));
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

/// A new context, as a tool's initialize makes it.
pub fn create_context() -> ContextHandle {
    let mut ctx = ContextHandle::default();
    // SAFETY: a valid out-pointer.
    let status = unsafe { kreplay::api::kreplay_create_context(&mut ctx) };
    assert_eq!(status, Status::SUCCESS);
    ctx
}

/// `callback` (with `data`) configured on `ctx` for the operations `ops` of `kind` (all of
/// them when empty), and `ctx` started.
pub fn trace(ctx: ContextHandle, kind: CallbackKind, ops: &[u32], callback: Callback, data: usize) {
    // SAFETY: a valid context, operation list and callback.
    let status = unsafe {
        kreplay::api::kreplay_configure_callback_tracing_service(
            ctx,
            kind,
            if ops.is_empty() {
                std::ptr::null()
            } else {
                ops.as_ptr()
            },
            ops.len(),
            Some(callback),
            data as *mut c_void,
        )
    };
    assert_eq!(status, Status::SUCCESS);
    assert_eq!(kreplay::api::kreplay_start_context(ctx), Status::SUCCESS);
}

/// The `kreplay_cuda::LaunchOps` methods every fake launch shares: nothing to check, drain or
/// wait for, and a re-launch that logs "relaunch" and runs the launch's own `kernel()`.
macro_rules! host_launch_ops {
    () => {
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
            $crate::cuda_common::event("relaunch");
            self.kernel();
            Ok(())
        }
    };
}
pub(crate) use host_launch_ops;
