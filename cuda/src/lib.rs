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
//! * [`cupti`] and [`inject`]: CUPTI driver-API callbacks, allocation tracking and replay of
//!   every launch through a tool; libkreplay's `InitializeInjection` (the library named by
//!   `CUDA_INJECTION64_PATH`) installs them with the C ABI's tools or the built-in N-pass tool.
//! * [`bench`](mod@bench): restore cost per tier, strategy and written fraction beside the copy and read
//!   ceilings of the same run (`kreplay bench --backend cuda`).
//! * [`demo`]: `x += 1` over a footprint, replayed through [`Window`] and verified word by word
//!   (`kreplay demo --backend cuda`).
//! * [`fence`]: copies and memsets wait for replay windows on their device.
//! * [`globals`] and [`scope`]: what a launch's snapshot covers besides tracked allocations
//!   (its module's writable variables, what its arguments point into) and
//!   `KREPLAY_SNAPSHOT_SCOPE=referenced`.
//! * [`capture`]: stream captures in progress (a replay does not drain a device while one is).
//! * [`choice`]: `auto`'s measured choice between full copies and detection on the device.
//! * [`tracking`]: managed memory and virtual-memory mappings (what the snapshot covers).
//! * [`graphmem`]: memory CUDA graphs allocate, unbacked until a graph holding it runs.
//! * [`timing`]: GPU begin/end timestamps of passes for KERNEL_DISPATCH records.
//! * [`toolwork`]: work a tool issues from its callbacks inside a replay window, folded into
//!   the snapshot so the restores that follow keep it.
//!
//! See docs/cuda.md for how to inject and what is snapshotted.

pub mod bench;
pub mod capture;
pub mod choice;
pub mod config;
pub mod contexts;
pub mod cupti;
pub mod demo;
pub mod devruntime;
pub mod drainer;
pub mod driver;
pub mod fence;
pub mod globals;
pub mod graphmem;
pub mod guard;
pub mod inject;
pub mod kernels;
pub mod launch;
pub mod memory;
pub mod scope;
pub mod timing;
pub mod toolwork;
pub mod tracking;
pub mod watchdog;
pub mod window;

pub use config::{Config, LogLevel};
pub use driver::{CuError, Driver, LoadError};
pub use launch::{CudaLaunch, Launch, LaunchApi};
pub use memory::{CudaMemory, ShadowBudget};
pub use window::{Enqueued, EnterCost, LaunchOps, Mark, Window, WindowContext};
