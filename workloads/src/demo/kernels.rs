//! The demo's kernels: softhsa host kernels, one call per work-group, arguments read from the
//! dispatch's kernarg block.
//!
//! - `scale_add`: `x[i] = x[i] * mul + add` in place (not idempotent);
//! - `axpy`: `y[i] += a * x[i]` in place (not idempotent);
//! - `histogram`: `bins[v % n_bins] += 1` for every `v` of a buffer, with atomics on device memory
//!   (not idempotent);
//! - `remix`: `dst[i] = rotl(src[i], 7) ^ bins[(src[i] >> 4) % n_bins]`, reading two buffers and
//!   writing a third, and counting its runs in the module-scope variable `remixes` of the demo's
//!   code object (a `__device__` counter: no argument points at it).
//!
//! All arithmetic is wrapping `u32`, so every result is exact and comparable bit for bit.

use std::ops::Range;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use kreplay_softhsa::WorkGroup;

/// Work-items per work-group of every demo dispatch.
pub const WORKGROUP_SIZE: u16 = 1024;

/// Kernel arguments of `scale_add`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ScaleAddArgs {
    /// Address of the `u32` buffer updated in place.
    pub x: u64,
    /// Elements in the buffer.
    pub n: u64,
    /// Multiplier.
    pub mul: u32,
    /// Addend.
    pub add: u32,
}

/// Kernel arguments of `axpy`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct AxpyArgs {
    /// Address of the `u32` buffer updated in place.
    pub y: u64,
    /// Address of the `u32` buffer read.
    pub x: u64,
    /// Elements in each buffer.
    pub n: u64,
    /// The scale.
    pub a: u32,
}

/// Kernel arguments of `histogram`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct HistogramArgs {
    /// Address of the `u32` buffer read.
    pub src: u64,
    /// Address of the `u32` bins, incremented atomically.
    pub bins: u64,
    /// Elements in `src`.
    pub n: u64,
    /// Number of bins.
    pub n_bins: u32,
}

/// Kernel arguments of `remix`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct RemixArgs {
    /// Address of the `u32` buffer read.
    pub src: u64,
    /// Address of the `u32` bins read.
    pub bins: u64,
    /// Address of the `u32` buffer written.
    pub dst: u64,
    /// Elements in `src` and `dst`.
    pub n: u64,
    /// Number of bins.
    pub n_bins: u32,
}

/// Where the loaded `remixes` variable lives (0: no code object loaded). Compiled code refers to
/// a module variable by its relocated address; a host kernel reads it from here, set by the
/// application after it looked the symbol up.
pub static REMIXES: AtomicU64 = AtomicU64::new(0);

/// Kernel objects of the demo kernels, as registered with softhsa.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KernelSet {
    /// `scale_add`.
    pub scale_add: u64,
    /// `axpy`.
    pub axpy: u64,
    /// `histogram`.
    pub histogram: u64,
    /// `remix`.
    pub remix: u64,
}

impl KernelSet {
    /// The demo's code object: the four kernels with their argument sizes, the writable
    /// `remixes` counter and a read-only `n_bins` constant.
    pub fn code_object(&self) -> kreplay_softhsa::CodeObject {
        kreplay_softhsa::CodeObject::new()
            .kernel(
                "scale_add",
                self.scale_add,
                size_of::<ScaleAddArgs>() as u32,
            )
            .kernel("axpy", self.axpy, size_of::<AxpyArgs>() as u32)
            .kernel(
                "histogram",
                self.histogram,
                size_of::<HistogramArgs>() as u32,
            )
            .kernel("remix", self.remix, size_of::<RemixArgs>() as u32)
            .variable("remixes", &0u32.to_ne_bytes())
            .readonly_variable("n_bins", &256u32.to_ne_bytes())
    }

    /// Registers the kernels (idempotent) and returns their kernel objects.
    pub fn register() -> KernelSet {
        KernelSet {
            scale_add: kreplay_softhsa::register_kernel("scale_add", scale_add),
            axpy: kreplay_softhsa::register_kernel("axpy", axpy),
            histogram: kreplay_softhsa::register_kernel("histogram", histogram),
            remix: kreplay_softhsa::register_kernel("remix", remix),
        }
    }
}

/// The element range of this work-group in a one-dimensional grid of `n` elements.
fn group_range(wg: &WorkGroup, n: u64) -> Range<usize> {
    let size = u64::from(wg.workgroup_size()[0]);
    let start = u64::from(wg.group_id()[0]) * size;
    let end = (start + size).min(n).min(u64::from(wg.grid_size()[0]));
    let start = start.min(end);
    // Both fit in usize: they are bounded by `n`, the length of a buffer in this process.
    (start as usize)..(end as usize)
}

fn scale_add(wg: &WorkGroup) {
    // SAFETY: the demo application dispatches `scale_add` only with a `ScaleAddArgs` block.
    let args: ScaleAddArgs = unsafe { wg.kernargs() };
    let range = group_range(wg, args.n);
    // SAFETY: `x` is a live allocation of `n` u32s (the application keeps it until every
    // dispatch completed); work-groups cover disjoint ranges, so this group's slice is not
    // aliased while it runs.
    let x = unsafe {
        std::slice::from_raw_parts_mut((args.x as *mut u32).add(range.start), range.len())
    };
    let count = x.len() as u64;
    for v in x {
        *v = v.wrapping_mul(args.mul).wrapping_add(args.add);
    }
    wg.count_load(count, 4 * count);
    wg.count_store(count, 4 * count);
}

fn axpy(wg: &WorkGroup) {
    // SAFETY: the demo application dispatches `axpy` only with an `AxpyArgs` block.
    let args: AxpyArgs = unsafe { wg.kernargs() };
    let range = group_range(wg, args.n);
    // SAFETY: `y` and `x` are distinct live allocations of `n` u32s; this group writes only its
    // own disjoint range of `y` and nothing writes `x` during the dispatch.
    let (y, x) = unsafe {
        (
            std::slice::from_raw_parts_mut((args.y as *mut u32).add(range.start), range.len()),
            std::slice::from_raw_parts((args.x as *const u32).add(range.start), range.len()),
        )
    };
    let count = y.len() as u64;
    for (y, x) in y.iter_mut().zip(x) {
        *y = y.wrapping_add(args.a.wrapping_mul(*x));
    }
    wg.count_load(2 * count, 8 * count);
    wg.count_store(count, 4 * count);
}

fn histogram(wg: &WorkGroup) {
    // SAFETY: the demo application dispatches `histogram` only with a `HistogramArgs` block.
    let args: HistogramArgs = unsafe { wg.kernargs() };
    if args.n_bins == 0 {
        return;
    }
    let range = group_range(wg, args.n);
    // SAFETY: `src` is a live allocation of `n` u32s that nothing writes during the dispatch.
    let src = unsafe {
        std::slice::from_raw_parts((args.src as *const u32).add(range.start), range.len())
    };
    // Count locally, then one atomic add per touched bin.
    wg.count_load(src.len() as u64, 4 * src.len() as u64);
    let mut local = vec![0u32; args.n_bins as usize];
    for v in src {
        local[(*v % args.n_bins) as usize] += 1;
    }
    for (bin, count) in local.into_iter().enumerate() {
        if count == 0 {
            continue;
        }
        // SAFETY: `bins` is a live, 4-byte aligned allocation of `n_bins` u32s that every
        // work-group of the dispatch accesses only atomically.
        let cell = unsafe { AtomicU32::from_ptr((args.bins as *mut u32).add(bin)) };
        cell.fetch_add(count, Ordering::Relaxed);
        wg.count_atomics(1);
    }
}

fn remix(wg: &WorkGroup) {
    // SAFETY: the demo application dispatches `remix` only with a `RemixArgs` block.
    let args: RemixArgs = unsafe { wg.kernargs() };
    if args.n_bins == 0 {
        return;
    }
    if wg.group_id() == [0, 0, 0] {
        let counter = REMIXES.load(Ordering::Acquire);
        if counter != 0 {
            // SAFETY: the address of the loaded `remixes` variable (a live, aligned u32) while
            // the application's executable is loaded.
            unsafe { &*(counter as *const AtomicU32) }.fetch_add(1, Ordering::Relaxed);
        }
    }
    let range = group_range(wg, args.n);
    // SAFETY: `src` (n u32s) and `bins` (n_bins u32s) are live allocations only read during the
    // dispatch; `dst` is a third allocation of n u32s of which this group writes only its own
    // disjoint range.
    let (src, bins, dst) = unsafe {
        (
            std::slice::from_raw_parts((args.src as *const u32).add(range.start), range.len()),
            std::slice::from_raw_parts(args.bins as *const u32, args.n_bins as usize),
            std::slice::from_raw_parts_mut((args.dst as *mut u32).add(range.start), range.len()),
        )
    };
    let count = dst.len() as u64;
    for (d, s) in dst.iter_mut().zip(src) {
        *d = s.rotate_left(7) ^ bins[((*s >> 4) % args.n_bins) as usize];
    }
    wg.count_load(2 * count, 8 * count);
    wg.count_store(count, 4 * count);
}
