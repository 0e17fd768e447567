//! The performance-counter extension table of softhsa (kreplay's software runtime).
//!
//! Real agents count events in hardware blocks programmed through AQL profile packets; softhsa
//! counts the same kind of events (work-items, wavefronts, bytes loaded and stored, atomics,
//! duration) for a dispatch whose completion signal was programmed beforehand. A tool reaches the
//! table with `hsa_system_get_major_extension_table(SOFT_COUNTERS_EXTENSION, 1, size, &table)`;
//! a runtime without it (ROCm) answers that the extension is unsupported.
//!
//! Counter ids are indices in an agent's catalogue, `0..counter_count`. Each hardware counter
//! belongs to a block that can count at most `block_limit` counters per dispatch; a derived
//! counter is computed from hardware counters (`inputs`) that must be counted in the same pass.

use crate::{hsa_agent_t, hsa_signal_t, hsa_status_t};
use std::os::raw::c_char;

/// The extension id (outside the ranges HSA and AMD assign).
pub const SOFT_COUNTERS_EXTENSION: u16 = 0x4b52;
/// The only major version of the table.
pub const SOFT_COUNTERS_VERSION_MAJOR: u16 = 1;
/// The most hardware counters a derived counter is computed from.
pub const SOFT_COUNTERS_MAX_INPUTS: usize = 4;

/// One counter of an agent's catalogue. Strings are static, NUL-terminated.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct soft_counter_info_t {
    pub name: *const c_char,
    pub description: *const c_char,
    /// The hardware block (for a derived counter: the block of its first input).
    pub block: *const c_char,
    /// How many counters of `block` one dispatch can count.
    pub block_limit: u32,
    /// 1 for a derived counter, 0 for a hardware one.
    pub is_derived: u32,
    /// The hardware counters this counter occupies in a pass (itself, for a hardware counter).
    pub input_count: u32,
    pub inputs: [u32; SOFT_COUNTERS_MAX_INPUTS],
}

impl Default for soft_counter_info_t {
    fn default() -> Self {
        Self {
            name: std::ptr::null(),
            description: std::ptr::null(),
            block: std::ptr::null(),
            block_limit: 0,
            is_derived: 0,
            input_count: 0,
            inputs: [0; SOFT_COUNTERS_MAX_INPUTS],
        }
    }
}

/// The extension's function table (major version 1).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct SoftCountersTable {
    /// Number of counters of `agent` (0 for a CPU agent).
    pub counter_count:
        Option<unsafe extern "C" fn(agent: hsa_agent_t, count: *mut u32) -> hsa_status_t>,
    /// Describes counter `index` of `agent`.
    pub counter_info: Option<
        unsafe extern "C" fn(
            agent: hsa_agent_t,
            index: u32,
            info: *mut soft_counter_info_t,
        ) -> hsa_status_t,
    >,
    /// Checks that `ids` can be counted in one pass; on failure writes a NUL-terminated reason
    /// (naming the block and its limit) into `message` (`message_len` bytes, may be 0).
    pub check: Option<
        unsafe extern "C" fn(
            agent: hsa_agent_t,
            ids: *const u32,
            count: u32,
            message: *mut c_char,
            message_len: usize,
        ) -> hsa_status_t,
    >,
    /// Programs `ids` for the next dispatch on `agent` whose completion signal is `signal`.
    pub program: Option<
        unsafe extern "C" fn(
            agent: hsa_agent_t,
            signal: hsa_signal_t,
            ids: *const u32,
            count: u32,
        ) -> hsa_status_t,
    >,
    /// Takes the values counted by the dispatch that completed `signal`, in the programmed
    /// order (`count` must be the programmed count). `HSA_STATUS_ERROR_INVALID_SIGNAL` if no
    /// counted dispatch completed it; the programming is forgotten either way.
    pub read: Option<
        unsafe extern "C" fn(signal: hsa_signal_t, values: *mut f64, count: u32) -> hsa_status_t,
    >,
}
