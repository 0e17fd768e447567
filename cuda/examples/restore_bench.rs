//! Restore cost on a CUDA GPU, beside ceilings measured in the same run.
//!
//! ```sh
//! cargo build --release -p kreplay-cuda --example restore_bench
//! target/release/examples/restore_bench [FOOTPRINTS_GIB] [REPS] [TIERS]
//! # defaults "1,8", 5 and "device"; TIERS from device, host, squeezed
//! ```
//!
//! For each footprint (one allocation, 64 KiB chunks) it measures
//! * ceilings: `cuMemcpyDtoDAsync` of the footprint, and `kreplay_read_once` over it; for the
//!   host tiers also `cuMemcpyHtoDAsync` from a pinned 2 GiB buffer (rate, and the footprint's
//!   time at that rate);
//! * the hash kernel alone over the footprint (detection), and `hash_chunks` with its copy of
//!   the hashes to the host;
//! * per tier: `device` (device shadow), `host` (pinned host store, live memory hashed on the
//!   device and compared with the host's hashes of the store), `squeezed` (tier `auto` while
//!   an allocation of the bench holds the device's memory but for the footprint and 2 GiB, so
//!   no shadow fits: the snapshot must land in pinned host memory, whole);
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
use kreplay_cuda::kernels::{hash_entries, override_ptx};
use kreplay_cuda::{CudaMemory, Driver, ShadowBudget};
use kreplay_snapshot::{
    DeviceMemory, Filter, Inventory, MemoryKind, NewAllocation, RestoreRequest, RestoreStrategy,
    SnapshotConfig, Snapshotter, StoreTier,
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
    let tiers: Vec<String> = args
        .get(3)
        .map_or("device", String::as_str)
        .split(',')
        .map(str::to_string)
        .collect();
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
        bench_footprint(d, ctx, gib * GIB, reps, &tiers)?;
    }
    Ok(())
}

/// Bytes per second of `cuMemcpyHtoDAsync` from a pinned 2 GiB host buffer into device memory,
/// best of `reps`.
fn host_copy_ceiling(
    d: &Driver,
    stream: kreplay_cuda::driver::CuStream,
    reps: usize,
) -> Result<f64, String> {
    let len = 2usize << 30;
    let dst = alloc(d, len as u64)?;
    let host = vec![7u8; len];
    // SAFETY: host lives until it is unregistered below.
    d.check("cuMemHostRegister_v2", unsafe {
        (d.mem_host_register)(host.as_ptr() as *mut _, len, 0)
    })
    .map_err(|e| e.to_string())?;
    let t = best(reps, || {
        let t = Instant::now();
        // SAFETY: host is pinned and live; dst holds len bytes; waited for below.
        d.check("cuMemcpyHtoDAsync_v2", unsafe {
            (d.memcpy_htod_async)(dst, host.as_ptr().cast(), len, stream)
        })
        .and_then(|()| {
            // SAFETY: our stream.
            d.check("cuStreamSynchronize", unsafe {
                (d.stream_synchronize)(stream)
            })
        })
        .map_err(|e| e.to_string())?;
        Ok(t.elapsed())
    });
    // SAFETY: registered above; dst is ours and no longer used.
    unsafe {
        (d.mem_host_unregister)(host.as_ptr() as *mut _);
        (d.mem_free)(dst);
    }
    Ok(len as f64 / t?.as_secs_f64())
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
    tiers: &[String],
) -> Result<(), String> {
    let gib = bytes / GIB;
    let buf = alloc(d, bytes)?;
    let inventory = Arc::new(Inventory::new());
    inventory.on_alloc(NewAllocation {
        base: buf,
        size: bytes,
        owner_agent: 0,
        kind: MemoryKind::CoarseDevice,
    });
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
    // Fill the footprint with pseudo-random bytes (never time reads of constant memory): 256 MiB
    // of noise, each copy of it made different by an increment of its first word per slice.
    let slice = (256u64 << 20).min(bytes);
    let mut noise: Vec<u64> = Vec::with_capacity((slice / 8) as usize);
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    for _ in 0..slice / 8 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        noise.push(x);
    }
    for (i, off) in (0..bytes).step_by(slice as usize).enumerate() {
        noise[0] = i as u64;
        let len = slice.min(bytes - off) as usize;
        // SAFETY: noise holds at least len bytes and lives until the wait below; buf + off
        // holds len bytes.
        d.check("cuMemcpyHtoDAsync_v2", unsafe {
            (d.memcpy_htod_async)(buf + off, noise.as_ptr().cast(), len, stream)
        })
        .map_err(|e| e.to_string())?;
        sync()?;
    }
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
    let (entries, work) = hash_entries(&[(buf, bytes, 0)], CHUNK);
    let list = alloc(d, 4096)?;
    // SAFETY: list holds 4096 bytes, more than one entry; entries lives until the wait.
    d.check("cuMemcpyHtoDAsync_v2", unsafe {
        (d.memcpy_htod_async)(
            list,
            entries.as_ptr().cast(),
            std::mem::size_of_val(entries.as_slice()),
            stream,
        )
    })
    .map_err(|e| e.to_string())?;
    sync()?;
    let hash_kernel = best(reps, || {
        let t = Instant::now();
        // SAFETY: buf, list and hashes are live and sized; waited for below.
        unsafe { kernels.hash(d, stream, list, 1, work, CHUNK, hashes) }
            .map_err(|e| e.to_string())?;
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
        (d.mem_free)(list);
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
    let fractions = [("0.1%", 0.001), ("1%", 0.01), ("10%", 0.1), ("100%", 1.0)];
    let touch = |fraction: f64| -> Result<(), String> {
        let dirty = ((chunks as f64 * fraction).round() as u64).clamp(1, chunks);
        let stride = chunks / dirty;
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
                "{gib} GiB {what}: {wrong} chunks differ from the snapshot"
            ))
        }
    };
    for tier in tiers {
        let (store, squeeze) = match tier.as_str() {
            "device" => (StoreTier::Device, false),
            "host" => (StoreTier::Host, false),
            "squeezed" => (StoreTier::Auto, true),
            other => return Err(format!("unknown tier {other:?}")),
        };
        let mem = if store == StoreTier::Device {
            mem.clone()
        } else {
            // SAFETY: the primary context retained in run(), alive for the process.
            unsafe { CudaMemory::new(d, inventory.clone(), ctx, ShadowBudget::default(), store) }
                .map_err(|e| e.to_string())?
        };
        if store != StoreTier::Device {
            let pinned = host_copy_ceiling(d, stream, reps)?;
            let at_rate = Duration::from_secs_f64(bytes as f64 / pinned);
            row(
                "-",
                &format!("{tier}:ceiling_htod_pinned"),
                at_rate,
                bytes,
                0,
                &format!(
                    "cuMemcpyHtoDAsync from a pinned 2 GiB buffer: {:.1} GB/s",
                    pinned / 1e9
                ),
            );
        }
        // Squeezed: hold all device memory but the footprint's worth and 2 GiB, so no shadow
        // fits (a shadow must leave max(2 GiB, 10%) free).
        let filler = if squeeze {
            let (free, _) = d.mem_info().map_err(|e| e.to_string())?;
            let take = free.saturating_sub(bytes.min(free / 2) + (2 << 30));
            Some((alloc(d, take)?, take))
        } else {
            None
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
            let config = SnapshotConfig::default()
                .with_store(store)
                .with_strategy(strategy)
                .with_chunk_size(CHUNK)
                .with_verify_every(0)
                .with_keep_store(true)
                .with_max_bytes(Some(bytes * 2));
            let snapshotter = Snapshotter::new(inventory.clone(), mem.clone(), config)
                .map_err(|e| e.to_string())?;
            // The host tiers' full restores take long: fewer repetitions.
            let reps = if store != StoreTier::Device && strategy == RestoreStrategy::Full {
                reps.min(2)
            } else {
                reps
            };
            for (label, fraction) in fractions {
                let t0 = Instant::now();
                let mut snap = snapshotter
                    .snapshot(&Filter::for_replay(0))
                    .map_err(|e| e.to_string())?;
                let taken = t0.elapsed();
                let report = snap.report().clone();
                if report.bytes_moved != bytes {
                    return Err(format!(
                        "{tier} snapshot holds {} of {bytes} bytes",
                        report.bytes_moved
                    ));
                }
                let (mut moved, mut hashed) = (0, 0);
                let mut first = true;
                let t = best(reps + 1, || {
                    touch(fraction)?;
                    let r = snap
                        .restore(&RestoreRequest {
                            next_pass: 1,
                            may_be_final: false,
                        })
                        .map_err(|e| e.to_string())?;
                    check(&format!("{tier} {label} {metric}"))?;
                    moved = r.bytes_moved;
                    hashed = r.bytes_hashed;
                    // The write sets learn on their first restore: time only the later ones.
                    if first
                        && strategy != RestoreStrategy::Full
                        && strategy != RestoreStrategy::Hash
                    {
                        first = false;
                        return Ok(Duration::MAX);
                    }
                    Ok(r.elapsed)
                })?;
                row(
                    label,
                    &format!("{tier}:{metric}"),
                    t,
                    moved,
                    hashed,
                    &format!(
                        "snapshot in {:?} ({}{}) {:.1} ms",
                        report.tier,
                        if report.pinned {
                            "pinned"
                        } else {
                            "not pinned"
                        },
                        if report.hashed { ", hashed" } else { "" },
                        ms(taken)
                    ),
                );
                drop(snap);
            }
        }
        if let Some((p, _)) = filler {
            // SAFETY: our allocation, no longer used.
            unsafe { (d.mem_free)(p) };
        }
    }
    drop(mem);
    // SAFETY: our allocation, no longer used.
    unsafe { (d.mem_free)(buf) };
    Ok(())
}
