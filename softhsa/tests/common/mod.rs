//! Kernels and helpers shared by the integration tests. Every HSA call goes through the table
//! (`kreplay_softhsa::testing::Hsa` wraps `kreplay_softhsa::api_table()`).
#![allow(dead_code)]

use kreplay_softhsa::testing::{Hsa, Session};
use kreplay_softhsa::{WorkGroup, register_kernel};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Generous bound for anything that should happen promptly.
pub const PROMPT: Duration = Duration::from_secs(5);

/// Initializes the runtime for one test; shut down when the session drops.
pub fn open() -> (Hsa, Session) {
    let hsa = Hsa::softhsa();
    let session = hsa.init().expect("hsa_init");
    (hsa, session)
}

/// Kernel arguments of [`add_one`].
#[derive(Clone, Copy)]
#[repr(C)]
pub struct AddOneArgs {
    pub data: *mut u32,
}

/// `data[i] += 1` for every work-item `i` of a one-dimensional grid.
pub fn add_one(group: &WorkGroup) {
    // SAFETY: dispatches of this kernel pass AddOneArgs with a buffer covering the grid.
    let args: AddOneArgs = unsafe { group.kernargs() };
    for [x, _, _] in group.work_items() {
        // SAFETY: x < grid size <= buffer length; each work-item owns its element.
        unsafe { *args.data.add(x as usize) += 1 };
    }
}

pub fn add_one_kernel() -> u64 {
    register_kernel("add_one", add_one)
}

/// Kernel arguments of [`gated`]: waits until `*gate != 0` (bounded by `PROMPT`), then stores
/// `*done = 1`.
#[derive(Clone, Copy)]
#[repr(C)]
pub struct GatedArgs {
    pub gate: *const AtomicU32,
    pub done: *const AtomicU32,
}

pub fn gated(group: &WorkGroup) {
    // SAFETY: dispatches of this kernel pass GatedArgs pointing at live atomics.
    let args: GatedArgs = unsafe { group.kernargs() };
    // SAFETY: as above.
    let (gate, done) = unsafe { (&*args.gate, &*args.done) };
    let deadline = Instant::now() + PROMPT;
    while gate.load(Ordering::Acquire) == 0 && Instant::now() < deadline {
        std::thread::yield_now();
    }
    done.store(1, Ordering::Release);
}

pub fn gated_kernel() -> u64 {
    register_kernel("gated", gated)
}

/// Kernel arguments of [`record_order`]: appends `id` to `log` at the next free position.
#[derive(Clone, Copy)]
#[repr(C)]
pub struct OrderArgs {
    pub log: *const AtomicU64,
    pub next: *const AtomicU32,
    pub id: u64,
}

pub fn record_order(group: &WorkGroup) {
    // SAFETY: dispatches of this kernel pass OrderArgs pointing at a live log.
    let args: OrderArgs = unsafe { group.kernargs() };
    // SAFETY: as above; `next` stays below the log length in the tests.
    unsafe {
        let slot = (*args.next).fetch_add(1, Ordering::AcqRel);
        (*args.log.add(slot as usize)).store(args.id, Ordering::Release);
    }
}

pub fn record_order_kernel() -> u64 {
    register_kernel("record_order", record_order)
}

/// Reads `n` u32 values.
///
/// # Safety
/// `ptr` must point to `n` readable u32s.
pub unsafe fn read_u32s(ptr: *const u32, n: usize) -> Vec<u32> {
    // SAFETY: forwarded from the caller.
    unsafe { std::slice::from_raw_parts(ptr, n) }.to_vec()
}
