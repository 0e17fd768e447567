//! The CUDA backend of kreplay.
//!
//! * [`driver`]: the CUDA driver API entry points, resolved from `libcuda` at run time (no
//!   toolkit needed to build; a machine without a driver gets an error, never a panic).
//! * [`memory`]: [`kreplay_snapshot::DeviceMemory`] for one CUDA context: copies on a stream of
//!   kreplay's own, device shadows within a budget that leaves the application headroom,
//!   page-locked host stores.
//! * [`window`]: one launch replayed from its API ENTER and EXIT callbacks, as a
//!   [`kreplay_passloop::ReplayDevice`] (the application's own launch is pass 0).
//! * [`kernels`]: the chunk-hash and gather kernels (CUDA C under `cuda/kernels/`, committed as
//!   PTX and JIT-loaded by the driver), and how they are launched.
//! * [`launch`]: a launch's parameters, its dispatch info, and how it is re-launched.
//! * [`cupti`] and [`inject`]: `InitializeInjection` for `CUDA_INJECTION64_PATH`, CUPTI
//!   driver-API callbacks, allocation tracking and the built-in N-pass replay.
//!
//! See docs/cuda.md for how to inject and what is snapshotted.

pub mod config;
pub mod cupti;
pub mod driver;
pub mod guard;
pub mod inject;
pub mod kernels;
pub mod launch;
pub mod memory;
pub mod window;

pub use config::{Config, LogLevel};
pub use driver::{CuError, Driver, LoadError};
pub use launch::{CudaLaunch, Launch, LaunchApi};
pub use memory::{CudaMemory, ShadowBudget};
pub use window::{EnterCost, LaunchOps, Window, WindowContext};
