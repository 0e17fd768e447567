//! Restore cost on a CUDA GPU, beside ceilings measured in the same run.
//!
//! ```sh
//! cargo build --release -p kreplay-cuda --example restore_bench
//! target/release/examples/restore_bench [FOOTPRINTS_GIB] [REPS]     # default "1,8" and 5
//! ```
//!
//! For each footprint (one allocation, device-shadow snapshot, 64 KiB chunks) it measures
//! * ceilings: `cuMemcpyDtoDAsync` of the footprint, and `kreplay_read_once` over it;
//! * the hash kernel alone over the footprint (detection), and `hash_chunks` with its copy of
//!   the hashes to the host;
//! * for written fractions 0.1%, 1%, 10%, 100% (evenly spread 64 KiB runs of `x += 1`): a full
//!   restore, a hash restore (hash every chunk on the device, gather the changed ones), a
//!   verified write-set restore, and an unverified write-set restore of the learned set;
//!
//! each the best of REPS, as the snapshot crate's restore reports it (host bookkeeping
//! included). After every restore memory is hashed again and compared with the snapshot's
//! bytes; a mismatch aborts the run.
//!
//! `KREPLAY_CUDA_TEST_PTX=<file>` loads that PTX instead of the committed one.

use std::sync::Arc;
use std::time::{Duration, Instant};

use kreplay_cuda::driver::{CuContext, CuDevicePtr};
use kreplay_cuda::kernels::override_ptx;
use kreplay_cuda::{CudaMemory, Driver, ShadowBudget};
use kreplay_snapshot::{
    DeviceMemory, Filter, Inventory, MemoryKind, RestoreRequest, RestoreStrategy, SnapshotConfig,
    Snapshotter, StoreTier,
};

const CHUNK: u64 = 64 << 10;
const GIB: u64 = 1 << 30;

fn main() {
    if let Err(e) = run() {
        eprintln!("restore_bench: {e}");
        std::process::exit(1);
    }
}

fn best(reps: usize, mut f: impl FnMut() -> Result<Duration, String>) -> Result<Duration, String> {
    let mut best = Duration::MAX;
    for _ in 0..reps {
        best = best.min(f()?);
    }
    Ok(best)
}

fn tbps(bytes: u64, t: Duration) -> f64 {
    bytes as f64 / t.as_secs_f64() / 1e12
}

fn ms(t: Duration) -> f64 {
    t.as_secs_f64() * 1e3
}

fn run() -> Result<(), String> {
    let args: Vec<String> = std::env::args().collect();
    let footprints: Vec<u64> = args
        .get(1)
        .map_or("1,8", String::as_str)
        .split(',')
        .map(|s| {
            s.trim()
                .parse::<u64>()
                .map_err(|e| format!("footprint {s:?}: {e}"))
        })
        .collect::<Result<_, _>>()?;
    let reps: usize = match args.get(2) {
        Some(s) => s.parse().map_err(|e| format!("reps {s:?}: {e}"))?,
        None => 5,
    };
    if let Ok(path) = std::env::var("KREPLAY_CUDA_TEST_PTX") {
        override_ptx(std::fs::read_to_string(&path).map_err(|e| format!("{path}: {e}"))?);
    }
    let d = Driver::get().map_err(|e| e.to_string())?;
    let mut ctx: CuContext = std::ptr::null_mut();
    // SAFETY: retains device 0's primary context for the process and makes it current.
    unsafe {
        d.check(
            "cuDevicePrimaryCtxRetain",
            (d.primary_ctx_retain)(&mut ctx, 0),
        )
        .map_err(|e| e.to_string())?;
        d.make_current(ctx).map_err(|e| e.to_string())?;
    }
    println!(
        "footprint_gib,fraction,metric,ms,tb_per_s_of_footprint,bytes_moved,bytes_hashed,note"
    );
    for gib in footprints {
        bench_footprint(d, ctx, gib * GIB, reps)?;
    }
    Ok(())
}

fn alloc(d: &Driver, bytes: u64) -> Result<CuDevicePtr, String> {
    let mut p: CuDevicePtr = 0;
    // SAFETY: allocates in the current context.
    d.check("cuMemAlloc_v2", unsafe {
        (d.mem_alloc)(&mut p, bytes as usize)
    })
    .map_err(|e| e.to_string())?;
    Ok(p)
}

fn bench_footprint(
    d: &'static Driver,
    ctx: CuContext,
    bytes: u64,
    reps: usize,
) -> Result<(), String> {
    let gib = bytes / GIB;
    let buf = alloc(d, bytes)?;
    let inventory = Arc::new(Inventory::new());
    inventory.on_alloc(buf, bytes, 0, MemoryKind::CoarseDevice);
    // SAFETY: the primary context retained in run(), alive for the process.
    let mem = unsafe {
        CudaMemory::new(
            d,
            inventory.clone(),
            ctx,
            ShadowBudget::default(),
            StoreTier::Device,
        )
    }
    .map_err(|e| e.to_string())?;
    let kernels = mem.kernels()?;
    let stream = mem.stream();
    let sync = || -> Result<(), String> {
        // SAFETY: our stream.
        d.check("cuStreamSynchronize", unsafe {
            (d.stream_synchronize)(stream)
        })
        .map_err(|e| e.to_string())
    };
    let chunks = bytes / CHUNK;
    let run_words = CHUNK / 4;
    // Give every word a value (the allocation starts undefined).
    // SAFETY: one run over the whole buffer.
    unsafe { kernels.add_one_runs(d, stream, buf, 1, bytes / 4, bytes / 4) }
        .map_err(|e| e.to_string())?;
    sync()?;
    let row = |fraction: &str, metric: &str, t: Duration, moved: u64, hashed: u64, note: &str| {
        println!(
            "{gib},{fraction},{metric},{:.3},{:.3},{moved},{hashed},{note}",
            ms(t),
            tbps(bytes, t)
        );
    };

    // Ceilings.
    let other = alloc(d, bytes)?;
    let copy = best(reps, || {
        let t = Instant::now();
        // SAFETY: two live allocations of `bytes`; waited for below.
        d.check("cuMemcpyDtoDAsync_v2", unsafe {
            (d.memcpy_dtod_async)(other, buf, bytes as usize, stream)
        })
        .map_err(|e| e.to_string())?;
        sync()?;
        Ok(t.elapsed())
    })?;
    row(
        "-",
        "ceiling_memcpy_dtod",
        copy,
        bytes,
        0,
        "cuMemcpyDtoDAsync of the footprint",
    );
    // SAFETY: our allocation, no longer used.
    unsafe { (d.mem_free)(other) };
    let sink = alloc(d, 4096)?;
    let read = best(reps, || {
        let t = Instant::now();
        // SAFETY: reads buf, may write one word of sink; waited for below.
        unsafe { kernels.read_once(d, stream, buf, bytes, sink, 132 * 16) }
            .map_err(|e| e.to_string())?;
        sync()?;
        Ok(t.elapsed())
    })?;
    row(
        "-",
        "ceiling_read_once",
        read,
        0,
        bytes,
        "kreplay_read_once kernel",
    );
    let hashes = alloc(d, chunks * 8)?;
    let hash_kernel = best(reps, || {
        let t = Instant::now();
        // SAFETY: buf and hashes are live and sized; waited for below.
        unsafe { kernels.hash(d, stream, buf, bytes, CHUNK, hashes) }.map_err(|e| e.to_string())?;
        sync()?;
        Ok(t.elapsed())
    })?;
    row(
        "-",
        "hash_kernel",
        hash_kernel,
        0,
        bytes,
        "detection: kreplay_hash_chunks alone",
    );
    // SAFETY: our allocations, no longer used.
    unsafe {
        (d.mem_free)(sink);
        (d.mem_free)(hashes);
    }
    let mut host_hashes = vec![0u64; chunks as usize];
    let hash_call = best(reps, || {
        let t = Instant::now();
        mem.hash_chunks(buf, bytes, CHUNK, &mut host_hashes)
            .map_err(|e| e.to_string())?;
        Ok(t.elapsed())
    })?;
    row(
        "-",
        "hash_chunks",
        hash_call,
        0,
        bytes,
        "kernel + hashes copied to the host",
    );
    let reference = host_hashes.clone();

    for (label, fraction) in [("0.1%", 0.001), ("1%", 0.01), ("10%", 0.1), ("100%", 1.0)] {
        let dirty = ((chunks as f64 * fraction).round() as u64).clamp(1, chunks);
        let stride = chunks / dirty;
        let touch = || -> Result<(), String> {
            // SAFETY: dirty runs of one chunk, stride chunks apart, all inside buf.
            unsafe { kernels.add_one_runs(d, stream, buf, dirty, run_words, stride * run_words) }
                .map_err(|e| e.to_string())?;
            sync()
        };
        let check = |what: &str| -> Result<(), String> {
            let mut now = vec![0u64; chunks as usize];
            mem.hash_chunks(buf, bytes, CHUNK, &mut now)
                .map_err(|e| e.to_string())?;
            let wrong = now.iter().zip(&reference).filter(|(a, b)| a != b).count();
            if wrong == 0 {
                Ok(())
            } else {
                Err(format!(
                    "{gib} GiB {label} {what}: {wrong} chunks differ from the snapshot"
                ))
            }
        };
        for (metric, strategy) in [
            ("full_restore", RestoreStrategy::Full),
            ("hash_restore", RestoreStrategy::Hash),
            ("writeset_verified_restore", RestoreStrategy::Writeset),
            (
                "writeset_unverified_restore",
                RestoreStrategy::WritesetUnverified,
            ),
        ] {
            let config = SnapshotConfig {
                store: StoreTier::Device,
                strategy,
                chunk_size: CHUNK,
                verify_every: 0,
                ..Default::default()
            };
            let snapshotter = Snapshotter::new(inventory.clone(), mem.clone(), config)
                .map_err(|e| e.to_string())?;
            let mut snap = snapshotter
                .snapshot(&Filter::for_replay(0))
                .map_err(|e| e.to_string())?;
            let (mut moved, mut hashed) = (0, 0);
            let mut first = true;
            let t = best(reps + 1, || {
                touch()?;
                let r = snap
                    .restore(&RestoreRequest {
                        next_pass: 1,
                        may_be_final: false,
                    })
                    .map_err(|e| e.to_string())?;
                check(metric)?;
                moved = r.bytes_moved;
                hashed = r.bytes_hashed;
                // The unverified write set learns on its first restore: time only the learned ones.
                if first && strategy == RestoreStrategy::WritesetUnverified {
                    first = false;
                    return Ok(Duration::MAX);
                }
                Ok(r.elapsed)
            })?;
            row(label, metric, t, moved, hashed, "");
            drop(snap);
        }
    }
    drop(mem);
    // SAFETY: our allocation, no longer used.
    unsafe { (d.mem_free)(buf) };
    Ok(())
}
