//! Restore cost on a CUDA GPU, beside ceilings measured in the same run (`kreplay bench
//! --backend cuda`, and the `restore_bench` example).
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
//! * for each written fraction (evenly spread 64 KiB runs of `x += 1`, as [`Runs::select`]
//!   picks them): a full restore, a hash restore (hash every chunk on the device, gather the
//!   changed ones), a verified write-set restore, and an unverified write-set restore of the
//!   learned set (or those of [`BenchConfig::strategies`]);
//!
//! each the best of the repetitions, as the snapshot crate's restore reports it (host
//! bookkeeping included), printed as CSV with the footprint's copy and read ceilings of the same
//! run beside it. After every restore memory is hashed again and compared with the snapshot's
//! bytes; a mismatch stops the run with an error.

use std::sync::Arc;
use std::time::{Duration, Instant};

use std::io::Write;

use crate::demo::Runs;
use crate::driver::{CuContext, CuDevicePtr, CuStream, Driver};
use crate::kernels::hash_entries;
use crate::memory::{CudaMemory, ShadowBudget};
use kreplay_snapshot::{
    DeviceMemory, Filter, Inventory, MemoryKind, NewAllocation, RestoreRequest, RestoreStrategy,
    SnapshotConfig, Snapshotter, StoreTier,
};

const CHUNK: u64 = 64 << 10;
const GIB: u64 = 1 << 30;

/// Where the snapshots of one set of rows are kept.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BenchTier {
    /// A device shadow.
    Device,
    /// Pinned host memory.
    Host,
    /// Tier `auto` while the bench holds all device memory but the footprint and 2 GiB.
    Squeezed,
}

impl std::str::FromStr for BenchTier {
    type Err = String;
    fn from_str(s: &str) -> Result<BenchTier, String> {
        match s.trim() {
            "device" => Ok(BenchTier::Device),
            "host" => Ok(BenchTier::Host),
            "squeezed" => Ok(BenchTier::Squeezed),
            other => Err(format!("tier {other:?}: expected device, host or squeezed")),
        }
    }
}

impl BenchTier {
    fn as_str(self) -> &'static str {
        match self {
            BenchTier::Device => "device",
            BenchTier::Host => "host",
            BenchTier::Squeezed => "squeezed",
        }
    }
}

/// What to measure.
#[derive(Clone, Debug, PartialEq)]
pub struct BenchConfig {
    /// Footprints in bytes, each a multiple of 64 KiB.
    pub footprints: Vec<u64>,
    /// Written fractions, each above 0 and at most 1.
    pub fractions: Vec<f64>,
    /// Restore strategies (`full`, `hash`, `writeset`, `writeset-unverified`).
    pub strategies: Vec<RestoreStrategy>,
    /// Snapshot tiers.
    pub tiers: Vec<BenchTier>,
    /// Timed repetitions per figure (the best is kept).
    pub reps: usize,
}

impl Default for BenchConfig {
    fn default() -> Self {
        BenchConfig {
            footprints: vec![GIB, 8 * GIB],
            fractions: vec![0.001, 0.01, 0.1, 1.0],
            strategies: vec![
                RestoreStrategy::Full,
                RestoreStrategy::Hash,
                RestoreStrategy::Writeset,
                RestoreStrategy::WritesetUnverified,
            ],
            tiers: vec![BenchTier::Device],
            reps: 5,
        }
    }
}

impl BenchConfig {
    /// Checks every value before anything runs.
    pub fn validate(&self) -> Result<(), String> {
        if self.footprints.is_empty()
            || self.fractions.is_empty()
            || self.strategies.is_empty()
            || self.tiers.is_empty()
        {
            return Err("nothing to measure: a list is empty".into());
        }
        for &f in &self.footprints {
            for &w in &self.fractions {
                Runs::select(f, w)?;
            }
        }
        if let Some(s) = self.strategies.iter().find(|s| metric_of(**s).is_none()) {
            return Err(format!(
                "strategy {s}: the CUDA bench measures full, hash, writeset and \
                 writeset-unverified"
            ));
        }
        if self.reps == 0 {
            return Err("at least 1 repetition is needed".into());
        }
        Ok(())
    }
}

/// The row name of a strategy's restores.
fn metric_of(s: RestoreStrategy) -> Option<&'static str> {
    match s {
        RestoreStrategy::Full => Some("full_restore"),
        RestoreStrategy::Hash => Some("hash_restore"),
        RestoreStrategy::Writeset => Some("writeset_verified_restore"),
        RestoreStrategy::WritesetUnverified => Some("writeset_unverified_restore"),
        _ => None,
    }
}

/// A fraction as the rows name it (`0.1%`, `1%`, `100%`).
pub fn fraction_label(f: f64) -> String {
    format!("{}%", (f * 100.0 * 1e6).round() / 1e6)
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

/// The CSV header [`run`] writes (the note is quoted: it may hold commas).
pub const HEADER: &str = "footprint_gib,fraction,metric,ms,tb_per_s_of_footprint,bytes_moved,\
    bytes_hashed,ceiling_copy_ms,ceiling_read_ms,note";

/// Runs the measurements of `config` on device 0, writing CSV rows to `out` as they are
/// measured. An error where there is no driver or device, a driver call fails, or a restore
/// leaves memory unlike the snapshot.
pub fn run(config: &BenchConfig, out: &mut dyn Write) -> Result<(), String> {
    config.validate()?;
    let d = crate::demo::driver()?;
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
    writeln!(out, "{HEADER}").map_err(|e| e.to_string())?;
    for &bytes in &config.footprints {
        bench_footprint(d, ctx, bytes, config, out)?;
    }
    Ok(())
}

/// Bytes per second of `cuMemcpyHtoDAsync` from a pinned 2 GiB host buffer into device memory,
/// best of `reps`.
fn host_copy_ceiling(d: &Driver, stream: CuStream, reps: usize) -> Result<f64, String> {
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
    config: &BenchConfig,
    out: &mut dyn Write,
) -> Result<(), String> {
    let reps = config.reps;
    let gib = bytes as f64 / GIB as f64;
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
    // The footprint's copy and read ceilings, printed beside every later row once measured.
    let ceilings = std::cell::Cell::new((None::<Duration>, None::<Duration>));
    let mut row = |fraction: &str,
                   metric: &str,
                   t: Duration,
                   moved: u64,
                   hashed: u64,
                   note: &str|
     -> Result<(), String> {
        let (copy, read) = ceilings.get();
        let opt = |c: Option<Duration>| c.map_or(String::from("-"), |c| format!("{:.3}", ms(c)));
        writeln!(
            out,
            "{gib},{fraction},{metric},{:.3},{:.3},{moved},{hashed},{},{},\"{}\"",
            ms(t),
            tbps(bytes, t),
            opt(copy),
            opt(read),
            note.replace('"', "\"\""),
        )
        .map_err(|e| format!("cannot write the output: {e}"))
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
    )?;
    ceilings.set((Some(copy), None));
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
    )?;
    ceilings.set((Some(copy), Some(read)));
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
    )?;
    // SAFETY: our allocations, no longer used. The copy ceiling's destination is freed only
    // now: on the H200, read kernels timed right after freeing 32 GiB took 8.53 ms for 32 GiB
    // against 7.39-7.40 ms with the free moved here.
    unsafe {
        (d.mem_free)(sink);
        (d.mem_free)(hashes);
        (d.mem_free)(list);
        (d.mem_free)(other);
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
    )?;
    let reference = host_hashes.clone();
    let touch = |fraction: f64| -> Result<(), String> {
        let r = Runs::select(bytes, fraction)?;
        // SAFETY: the runs lie inside buf (Runs::select keeps them in the footprint).
        unsafe { kernels.add_one_runs(d, stream, buf, r.runs, r.run_words, r.stride_words) }
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
    for &bench_tier in &config.tiers {
        let tier = bench_tier.as_str();
        let (store, squeeze) = match bench_tier {
            BenchTier::Device => (StoreTier::Device, false),
            BenchTier::Host => (StoreTier::Host, false),
            BenchTier::Squeezed => (StoreTier::Auto, true),
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
            )?;
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
        for &strategy in &config.strategies {
            let metric =
                metric_of(strategy).ok_or_else(|| format!("strategy {strategy}: not measured"))?;
            let snap_config = SnapshotConfig::default()
                .with_store(store)
                .with_strategy(strategy)
                .with_chunk_size(CHUNK)
                .with_verify_every(0)
                .with_keep_store(true)
                .with_max_bytes(Some(bytes * 2));
            let snapshotter = Snapshotter::new(inventory.clone(), mem.clone(), snap_config)
                .map_err(|e| e.to_string())?;
            // The host tiers' full restores take long: fewer repetitions.
            let reps = if store != StoreTier::Device && strategy == RestoreStrategy::Full {
                reps.min(2)
            } else {
                reps
            };
            for &fraction in &config.fractions {
                let label = fraction_label(fraction);
                let label = label.as_str();
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
                )?;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_matrix_is_the_issues_fractions_and_strategies_on_the_device_tier() {
        let c = BenchConfig::default();
        assert!(c.validate().is_ok());
        let labels: Vec<String> = c.fractions.iter().map(|&f| fraction_label(f)).collect();
        assert_eq!(labels, ["0.1%", "1%", "10%", "100%"]);
        assert_eq!(c.strategies.len(), 4);
    }

    #[test]
    fn a_matrix_that_cannot_run_is_refused_before_the_driver_is_looked_for() {
        for (change, expect) in [
            (
                Box::new(|c: &mut BenchConfig| c.footprints = vec![100 << 10])
                    as Box<dyn Fn(&mut BenchConfig)>,
                "multiple of 64 KiB",
            ),
            (Box::new(|c| c.fractions = vec![0.0]), "above 0"),
            (Box::new(|c| c.fractions = vec![1.5]), "at most 1"),
            (
                Box::new(|c| c.strategies = vec![RestoreStrategy::Auto]),
                "measures full, hash",
            ),
            (Box::new(|c| c.tiers.clear()), "empty"),
            (Box::new(|c| c.reps = 0), "repetition"),
        ] {
            let mut c = BenchConfig::default();
            change(&mut c);
            let e = run(&c, &mut Vec::new()).unwrap_err();
            assert!(e.contains(expect), "{e}");
        }
    }

    #[test]
    fn tiers_are_read_by_name() {
        assert_eq!("host".parse::<BenchTier>(), Ok(BenchTier::Host));
        assert_eq!("squeezed".parse::<BenchTier>(), Ok(BenchTier::Squeezed));
        assert!(
            "file"
                .parse::<BenchTier>()
                .unwrap_err()
                .contains("device, host or squeezed")
        );
    }

    #[test]
    fn without_a_driver_the_bench_says_so_and_writes_nothing() {
        if Driver::get().is_ok() {
            eprintln!("skipped: a CUDA driver is present here");
            return;
        }
        let mut out = Vec::new();
        let e = run(&BenchConfig::default(), &mut out).unwrap_err();
        assert!(e.contains("no CUDA driver could be loaded"), "{e}");
        assert!(out.is_empty());
    }
}
