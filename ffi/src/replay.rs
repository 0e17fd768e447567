//! What the backend puts into KERNEL_REPLAY payloads on kreplay's side: the context toggles of
//! PASS ENTER and the mapping of their outcomes onto status codes.
//!
//! The toggles route through `kreplay_ctxmask::replay_start_context` /
//! `replay_stop_context`, i.e. through the innermost replay loop of the calling thread, which must
//! be armed (PASS ENTER) for them to succeed.
//!
//! ```
//! use kreplay::abi::{KernelDispatchInfo, KernelReplayData, Status};
//! use kreplay::replay;
//! use kreplay_ctxmask::ContextRegistry;
//!
//! let registry = ContextRegistry::global();
//! let ctx = registry.create();
//! registry.start(ctx).unwrap();
//!
//! let mut payload = KernelReplayData::new(KernelDispatchInfo::default());
//! replay::arm_toggles(&mut payload);
//! let stop = payload.replay_stop_context.unwrap();
//!
//! let mask = registry.begin_replay();
//! {
//!     let _pass_enter = mask.arm();
//!     assert_eq!(unsafe { stop(ctx.into()) }, Status::SUCCESS);
//! }
//! assert!(!mask.is_enabled(ctx));
//! // Outside PASS ENTER the toggles change nothing.
//! assert_eq!(unsafe { stop(ctx.into()) }, Status::ERROR_CONTEXT_ERROR);
//! ```

use kreplay_ctxmask::ToggleError;

use crate::abi::{ContextHandle, KernelReplayData, Status};

/// The status a toggle outcome is reported as: `NotArmed` → CONTEXT_ERROR, `NotStarted` →
/// CONTEXT_NOT_STARTED.
pub fn toggle_status(result: Result<(), ToggleError>) -> Status {
    match result {
        Ok(()) => Status::SUCCESS,
        Err(ToggleError::NotArmed) => Status::ERROR_CONTEXT_ERROR,
        Err(ToggleError::NotStarted) => Status::ERROR_CONTEXT_NOT_STARTED,
        Err(_) => Status::ERROR,
    }
}

/// `replay_start_context` of PASS ENTER payloads: masks `context` on for this and later passes.
pub extern "C" fn pass_start_context(context: ContextHandle) -> Status {
    crate::api::guard(|| toggle_status(kreplay_ctxmask::replay_start_context(context.into())))
}

/// `replay_stop_context` of PASS ENTER payloads: masks `context` off for this and later passes.
pub extern "C" fn pass_stop_context(context: ContextHandle) -> Status {
    crate::api::guard(|| toggle_status(kreplay_ctxmask::replay_stop_context(context.into())))
}

/// Fills `replay_start_context` / `replay_stop_context` of a PASS ENTER payload.
pub fn arm_toggles(payload: &mut KernelReplayData) {
    payload.replay_start_context = Some(pass_start_context);
    payload.replay_stop_context = Some(pass_stop_context);
}

/// Clears the toggles again (PASS EXIT and later records carry none).
pub fn disarm_toggles(payload: &mut KernelReplayData) {
    payload.replay_start_context = None;
    payload.replay_stop_context = None;
}
