//! The applications `kreplay profile` runs: classic kernels that report their memory traffic
//! to softhsa's counters ([`kreplay_softhsa::WorkGroup::count_load`] and friends), so every
//! counter has a value one can check by hand.
//!
//! - `saxpy`: `y[i] = a * x[i] + y[i]` (f32; 2 loads and 1 store per item);
//! - `histogram`: `bins[x[i] % BINS] += 1` with one atomic per item (1 load, 1 atomic);
//! - `stencil`: `out[i] = in[i-1] + 2 in[i] + in[i+1]` (wrapping u32, edges clamped; 3 loads
//!   and 1 store per item);
//! - `reduction`: each work-group sums its range and adds it to one total atomically (1 load per
//!   item, 1 atomic per group);
//! - `demo`: the demo program ([`crate::demo`]), whose kernels report their traffic as well.
//!
//! Every kernel is deterministic: the values of every counter but the duration are the same in
//! every run, which is what lets kernel replay be compared with application replay.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use hsa_sys::HsaApiTable;
use kreplay_softhsa::testing::{Dispatch, Hsa, PoolKind};
use kreplay_softhsa::{WorkGroup, register_kernel};

/// Work-items per work-group of every profile dispatch.
pub const WORKGROUP_SIZE: u16 = 256;
/// Bins of the histogram.
pub const BINS: u32 = 64;
/// How long one dispatch may take.
const DEADLINE: Duration = Duration::from_secs(60);

/// A workload `kreplay profile` can run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Workload {
    /// `saxpy` once.
    Saxpy,
    /// `histogram` once.
    Histogram,
    /// `stencil` once.
    Stencil,
    /// `reduction` once.
    Reduction,
    /// The demo program (one round of its four kernels).
    Demo,
    /// saxpy, histogram, stencil, reduction, then the demo program.
    All,
}

impl Workload {
    /// Every workload name, for messages.
    pub const NAMES: &'static str = "saxpy, histogram, stencil, reduction, demo, all";

    /// The workload called `name`.
    pub fn parse(name: &str) -> Option<Workload> {
        Some(match name {
            "saxpy" => Workload::Saxpy,
            "histogram" => Workload::Histogram,
            "stencil" => Workload::Stencil,
            "reduction" => Workload::Reduction,
            "demo" => Workload::Demo,
            "all" => Workload::All,
            _ => return None,
        })
    }
}

/// What a run did: kernel names in dispatch order and a fingerprint of its results.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProfileRun {
    /// Kernel names, in dispatch order.
    pub dispatches: Vec<&'static str>,
    /// FNV-1a over every result buffer.
    pub checksum: u64,
}

#[derive(Clone, Copy)]
#[repr(C)]
struct SaxpyArgs {
    x: *const f32,
    y: *mut f32,
    n: u32,
    a: f32,
}

#[derive(Clone, Copy)]
#[repr(C)]
struct HistogramArgs {
    x: *const u32,
    bins: *const AtomicU32,
    n: u32,
}

#[derive(Clone, Copy)]
#[repr(C)]
struct StencilArgs {
    input: *const u32,
    output: *mut u32,
    n: u32,
}

#[derive(Clone, Copy)]
#[repr(C)]
struct ReductionArgs {
    x: *const u32,
    total: *const AtomicU32,
    n: u32,
}

fn items(group: &WorkGroup, n: u32) -> impl Iterator<Item = usize> + use<> {
    group
        .work_items()
        .map(|[x, _, _]| x)
        .filter(move |&x| x < n)
        .map(|x| x as usize)
}

fn saxpy(group: &WorkGroup) {
    // SAFETY: dispatched only with SaxpyArgs whose buffers hold `n` elements.
    let args: SaxpyArgs = unsafe { group.kernargs() };
    let mut count = 0;
    for i in items(group, args.n) {
        // SAFETY: i < n; each work-item owns its element of y.
        unsafe { *args.y.add(i) = args.a * *args.x.add(i) + *args.y.add(i) };
        count += 1;
    }
    group.count_load(2 * count, 8 * count);
    group.count_store(count, 4 * count);
}

fn histogram(group: &WorkGroup) {
    // SAFETY: dispatched only with HistogramArgs (`n` inputs, BINS bins).
    let args: HistogramArgs = unsafe { group.kernargs() };
    let mut count = 0;
    for i in items(group, args.n) {
        // SAFETY: i < n; the bin index is below BINS; bins are only touched atomically.
        unsafe {
            (*args.bins.add((*args.x.add(i) % BINS) as usize)).fetch_add(1, Ordering::Relaxed)
        };
        count += 1;
    }
    group.count_load(count, 4 * count);
    group.count_atomics(count);
}

fn stencil(group: &WorkGroup) {
    // SAFETY: dispatched only with StencilArgs whose buffers hold `n` elements.
    let args: StencilArgs = unsafe { group.kernargs() };
    let n = args.n as usize;
    let mut count = 0;
    for i in items(group, args.n) {
        let at = |j: usize| {
            // SAFETY: j is clamped to 0..n.
            unsafe { *args.input.add(j.min(n - 1)) }
        };
        let left = at(i.saturating_sub(1));
        let v = left
            .wrapping_add(at(i).wrapping_mul(2))
            .wrapping_add(at(i + 1));
        // SAFETY: i < n; each work-item owns its output element.
        unsafe { *args.output.add(i) = v };
        count += 1;
    }
    group.count_load(3 * count, 12 * count);
    group.count_store(count, 4 * count);
}

fn reduction(group: &WorkGroup) {
    // SAFETY: dispatched only with ReductionArgs (`n` inputs, one total).
    let args: ReductionArgs = unsafe { group.kernargs() };
    let mut sum = 0u32;
    let mut count = 0;
    for i in items(group, args.n) {
        // SAFETY: i < n.
        sum = sum.wrapping_add(unsafe { *args.x.add(i) });
        count += 1;
    }
    if count > 0 {
        // SAFETY: the total is only touched atomically.
        unsafe { &*args.total }.fetch_add(sum, Ordering::Relaxed);
        group.count_atomics(1);
    }
    group.count_load(count, 4 * count);
}

/// Kernel objects of the profile kernels.
#[derive(Clone, Copy, Debug)]
pub struct ProfileKernels {
    saxpy: u64,
    histogram: u64,
    stencil: u64,
    reduction: u64,
}

impl ProfileKernels {
    /// Registers the kernels (idempotent).
    pub fn register() -> ProfileKernels {
        ProfileKernels {
            saxpy: register_kernel("saxpy", saxpy),
            histogram: register_kernel("histogram_atomic", histogram),
            stencil: register_kernel("stencil3", stencil),
            reduction: register_kernel("reduction", reduction),
        }
    }
}

fn fnv(hash: &mut u64, bytes: &[u8]) {
    for &b in bytes {
        *hash ^= u64::from(b);
        *hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
}

/// Runs `workload` over `elements` items through `table` (a table kreplay may be installed in).
///
/// # Safety
/// `table` must be a complete HSA table that stays valid for the call.
pub unsafe fn run(
    table: &HsaApiTable,
    workload: Workload,
    elements: u32,
) -> Result<ProfileRun, String> {
    let kernels = ProfileKernels::register();
    let mut run = ProfileRun {
        dispatches: Vec::new(),
        checksum: 0xcbf2_9ce4_8422_2325,
    };
    let classic: &[(&'static str, u64)] = &[
        ("saxpy", kernels.saxpy),
        ("histogram_atomic", kernels.histogram),
        ("stencil3", kernels.stencil),
        ("reduction", kernels.reduction),
    ];
    let chosen: Vec<(&'static str, u64)> = match workload {
        Workload::Saxpy => vec![classic[0]],
        Workload::Histogram => vec![classic[1]],
        Workload::Stencil => vec![classic[2]],
        Workload::Reduction => vec![classic[3]],
        Workload::Demo => Vec::new(),
        Workload::All => classic.to_vec(),
    };
    if !chosen.is_empty() {
        // SAFETY: forwarded from the caller.
        unsafe { run_classic(table, &chosen, elements, &mut run) }?;
    }
    if matches!(workload, Workload::Demo | Workload::All) {
        let demo = crate::demo::kernels::KernelSet::register();
        let config = crate::demo::app::AppConfig {
            elements: elements as usize,
            rounds: 1,
        };
        let out = crate::demo::app::run(table, &demo, &config).map_err(|e| e.to_string())?;
        run.dispatches.extend(out.dispatches);
        for buffer in &out.buffers {
            fnv(&mut run.checksum, &buffer.checksum().to_le_bytes());
        }
    }
    Ok(run)
}

/// # Safety
/// As for [`run`].
unsafe fn run_classic(
    table: &HsaApiTable,
    chosen: &[(&'static str, u64)],
    elements: u32,
    run: &mut ProfileRun,
) -> Result<(), String> {
    let n = elements.max(1);
    // SAFETY: the caller guarantees the table.
    let hsa = unsafe { Hsa::from_table(table) };
    let _session = hsa
        .init()
        .map_err(|s| format!("hsa_init failed ({s:#x})"))?;
    let gpu = *hsa
        .gpu_agents()
        .map_err(|s| format!("listing agents failed ({s:#x})"))?
        .first()
        .ok_or("the runtime has no GPU agent")?;
    let pool = hsa
        .coarse_pool(gpu)
        .map_err(|s| format!("no pool ({s:#x})"))?;
    let kernarg_pool = hsa
        .pool(gpu, PoolKind::Kernarg)
        .map_err(|s| format!("no kernarg pool ({s:#x})"))?;
    let words = n as usize;
    let alloc = |bytes: usize| {
        hsa.allocate(pool, bytes)
            .map_err(|s| format!("allocating {bytes} bytes failed ({s:#x})"))
    };
    let a = alloc(words * 4)?;
    let b = alloc(words * 4)?;
    let small = alloc(BINS as usize * 4)?;
    let args = hsa
        .allocate(kernarg_pool, 64)
        .map_err(|s| format!("kernarg allocation failed ({s:#x})"))?;
    let queue = hsa
        .queue_create(gpu, 64)
        .map_err(|s| format!("queue creation failed ({s:#x})"))?;
    let done = hsa
        .signal_create(1)
        .map_err(|s| format!("signal creation failed ({s:#x})"))?;
    let result = (|| {
        for &(name, kernel) in chosen {
            // Fresh, deterministic inputs for every kernel.
            for i in 0..words {
                let v = (i as u32).wrapping_mul(2_654_435_761) >> 8;
                // SAFETY: both buffers hold `words` u32 (or f32) values; no kernel runs now.
                unsafe {
                    if name == "saxpy" {
                        *a.cast::<f32>().add(i) = (v % 1000) as f32;
                        *b.cast::<f32>().add(i) = (i % 7) as f32;
                    } else {
                        *a.cast::<u32>().add(i) = v;
                        *b.cast::<u32>().add(i) = 0;
                    }
                }
            }
            // SAFETY: BINS u32s; no kernel runs now.
            unsafe { std::ptr::write_bytes(small, 0, BINS as usize * 4) };
            // SAFETY: the kernarg allocation holds 64 bytes, enough for every argument block.
            unsafe {
                match name {
                    "saxpy" => args.cast::<SaxpyArgs>().write_unaligned(SaxpyArgs {
                        x: a.cast(),
                        y: b.cast(),
                        n,
                        a: 2.5,
                    }),
                    "histogram_atomic" => {
                        args.cast::<HistogramArgs>().write_unaligned(HistogramArgs {
                            x: a.cast(),
                            bins: small.cast(),
                            n,
                        })
                    }
                    "stencil3" => args.cast::<StencilArgs>().write_unaligned(StencilArgs {
                        input: a.cast(),
                        output: b.cast(),
                        n,
                    }),
                    _ => args.cast::<ReductionArgs>().write_unaligned(ReductionArgs {
                        x: a.cast(),
                        total: small.cast(),
                        n,
                    }),
                }
            }
            hsa.signal_store(done, 1);
            let dispatch = Dispatch::linear(kernel, n, WORKGROUP_SIZE, args.cast(), done);
            // SAFETY: live queue; the arguments and buffers outlive the dispatch (waited for).
            unsafe { hsa.dispatch(queue, &dispatch) };
            if !hsa.wait_zero(done, DEADLINE) {
                return Err(format!("{name} did not complete within {DEADLINE:?}"));
            }
            run.dispatches.push(name);
            // SAFETY: the kernel completed; the buffers hold what it wrote.
            let (out, bins) = unsafe {
                (
                    std::slice::from_raw_parts(b, words * 4),
                    std::slice::from_raw_parts(small, BINS as usize * 4),
                )
            };
            fnv(&mut run.checksum, out);
            fnv(&mut run.checksum, bins);
        }
        Ok(())
    })();
    let _ = hsa.signal_destroy(done);
    // SAFETY: created above; every dispatch on it completed.
    let _ = unsafe { hsa.queue_destroy(queue) };
    for p in [a, b, small, args] {
        let _ = hsa.free(p);
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_workload_runs_and_is_deterministic() {
        for name in ["saxpy", "histogram", "stencil", "reduction", "demo", "all"] {
            let workload = Workload::parse(name).unwrap();
            let table = kreplay_softhsa::api_table();
            // SAFETY: softhsa's own table is complete and static.
            let first = unsafe { run(table, workload, 3000) }.unwrap();
            // SAFETY: as above.
            let second = unsafe { run(table, workload, 3000) }.unwrap();
            assert_eq!(first, second, "{name}");
            assert!(!first.dispatches.is_empty(), "{name}");
        }
        assert_eq!(Workload::parse("nope"), None);
    }
}
