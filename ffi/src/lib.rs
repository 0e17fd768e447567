//! kreplay's C interface (`libkreplay`, header `include/kreplay.h`) and the Rust pieces a backend
//! plugs into it.
//!
//! - [`abi`]: `#[repr(C)]` mirrors of every header type, layouts checked at compile time;
//! - [`api`]: the exported `kreplay_*` functions (contexts, callback tracing services, strings);
//! - [`services`]: the registry of configured services the backend delivers records through;
//! - [`counting`]: agents' counters, counter configurations, pass planning and the dispatch
//!   counting service;
//! - [`replay`]: the PASS ENTER context toggles;
//! - [`lifecycle`]: tool discovery (`kreplay_configure`), initialization and finalization;
//! - [`config`]: settings from `KREPLAY_*` environment variables;
//! - [`logging`]: the `kreplay:`-prefixed stderr logger;
//! - [`hsa_tool`]: the HSA tools-library entry points (`OnLoad`, `OnUnload`);
//! - [`cuda_tool`]: the CUDA injection entry point (`InitializeInjection`), the same tools over
//!   the `kreplay-cuda` backend;
//! - [`run_record`]: the per-kernel record `kreplay run` reads back (`KREPLAY_RECORD_DIR`).
//!
//! A tool normally uses the C functions; the same calls work from Rust:
//!
//! ```
//! use kreplay::abi::{CallbackKind, CallbackRecord, ContextHandle, Status, UserData};
//! use std::ffi::c_void;
//!
//! unsafe extern "C" fn on_record(_: CallbackRecord, _: *mut UserData, _: *mut c_void) {}
//!
//! let mut ctx = ContextHandle::default();
//! // SAFETY: `ctx` is a valid out-pointer.
//! assert_eq!(unsafe { kreplay::api::kreplay_create_context(&mut ctx) }, Status::SUCCESS);
//! let status = unsafe {
//!     kreplay::api::kreplay_configure_callback_tracing_service(
//!         ctx, CallbackKind::KERNEL_REPLAY, std::ptr::null(), 0, Some(on_record),
//!         std::ptr::null_mut())
//! };
//! assert_eq!(status, Status::SUCCESS);
//! assert_eq!(kreplay::api::kreplay_start_context(ctx), Status::SUCCESS);
//! assert!(kreplay::services::replay_configured());
//! ```

pub mod abi;
pub mod api;
pub mod config;
pub mod counters;
pub mod counting;
pub mod cuda_tool;
mod fork;
pub mod hsa_tool;
pub mod lifecycle;
pub mod logging;
pub mod replay;
pub mod run_record;
pub mod services;

/// Path of the C header, for build scripts and tests of dependent crates.
pub const HEADER_PATH: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/include/kreplay.h");

/// Forgets every tool, forced configure function and service and reopens configuration, so that
/// tests sharing one process can run lifecycle scenarios one after another. Contexts stay as they
/// are (they cannot be destroyed); tools are not finalized. Never call this in production.
#[doc(hidden)]
pub fn reset_for_tests() {
    lifecycle::reset();
}
