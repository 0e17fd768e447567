//! The HSA applications kreplay's command line and end-to-end tests run, in one place so that
//! `kreplay demo`, `kreplay stress` and the tests share them instead of copying them.
//!
//! Every workload is an ordinary HSA program: it only knows the [`hsa_sys::HsaApiTable`] it is
//! given (softhsa's own table for an unprofiled reference run, or a copy kreplay is installed
//! in) and runs softhsa host kernels.
//!
//! - [`demo`]: the four-kernel program of `kreplay demo`;
//! - [`profile`]: saxpy, histogram (atomics), stencil and reduction, and the demo, for
//!   `kreplay profile` (kernels report their memory traffic to softhsa's counters);
//! - [`stress`]: many threads, queues and agents running a seeded mix of dispatches, copies,
//!   fills and allocations whose final memory is deterministic however the threads interleave,
//!   so a run under kreplay can be compared byte for byte with a run without it.

pub mod demo;
pub mod profile;
pub mod stress;
