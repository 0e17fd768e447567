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
//! run beside it (and, for the host tiers, the footprint's time at the pinned host-to-device
//! rate). After every restore memory is hashed again and compared with the snapshot's bytes; a
//! mismatch stops the run with an error, and so does a snapshot that does not hold the whole
//! footprint.
//!
//! [`run`] returns the figures it printed; [`judge`] holds the restore targets against them
//! (the command line writes the verdicts, as it does the software runtime's).

use std::sync::Arc;
use std::time::{Duration, Instant};

use std::io::Write;

mod replays;

pub use replays::{
    DISPATCHES, ReplayMeasured, RestoreCounts, auto_against_best, render as render_replays,
};

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
    /// The tier's name, as `--tiers` takes it.
    pub fn as_str(self) -> &'static str {
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
    /// Passes of the whole replays measured after the restore rows, each 2 to
    /// [`MAX_REPLAY_PASSES`] (empty: none; see [`render_replays`] and [`ReplayMeasured`]).
    pub passes: Vec<u64>,
}

/// Most passes of a whole replay the bench measures.
pub const MAX_REPLAY_PASSES: u64 = 1000;

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
            passes: vec![2, 4, 8, 38],
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
        if let Some(n) = self
            .passes
            .iter()
            .find(|&&n| !(2..=MAX_REPLAY_PASSES).contains(&n))
        {
            return Err(format!(
                "whole replays of {n} passes: 2 to {MAX_REPLAY_PASSES} passes are measured"
            ));
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

/// One restore figure of a run: the best of its repetitions.
#[derive(Clone, Debug, PartialEq)]
pub struct Measured {
    /// Footprint, bytes.
    pub footprint: u64,
    /// Where the snapshot was kept.
    pub tier: BenchTier,
    /// The restore strategy.
    pub strategy: RestoreStrategy,
    /// The written fraction.
    pub fraction: f64,
    /// Restore time, ms.
    pub ms: f64,
}

/// What [`run`] measured, for [`judge`].
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Figures {
    /// Every restore row.
    pub restores: Vec<Measured>,
    /// Per footprint: `cuMemcpyDtoDAsync` of the footprint, ms.
    pub copy_ceilings: Vec<(u64, f64)>,
    /// Per footprint and host tier: the footprint's time at the pinned `cuMemcpyHtoDAsync`
    /// rate, ms.
    pub htod_ceilings: Vec<(u64, BenchTier, f64)>,
    /// Every whole-replay cell.
    pub replays: Vec<ReplayMeasured>,
}

/// How a restore's time divides between [`CudaMemory`]'s timed calls (copies on the device,
/// verified restores, hash launches; its waits for the stream apart) and the rest (the snapshot
/// crate's bookkeeping around them).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct HostSplit {
    calls: Duration,
    waits: Duration,
    rest: Duration,
}

impl HostSplit {
    fn of(
        before: &crate::memory::MemoryTimes,
        after: &crate::memory::MemoryTimes,
        total: Duration,
    ) -> Self {
        let ns = |a: u64, b: u64| Duration::from_nanos(b.saturating_sub(a));
        let calls = ns(before.copy_ns, after.copy_ns)
            + ns(before.verified_ns, after.verified_ns)
            + ns(before.hash_ns, after.hash_ns);
        let waits = ns(before.copy_wait_ns, after.copy_wait_ns)
            + ns(before.verified_wait_ns, after.verified_wait_ns)
            + ns(before.hash_wait_ns, after.hash_wait_ns);
        HostSplit {
            calls,
            waits,
            rest: total.saturating_sub(calls),
        }
    }
}

impl std::fmt::Display for HostSplit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let us = |d: Duration| d.as_secs_f64() * 1e6;
        if self.calls.is_zero() {
            // Writes from a host store (write_batch) are not among the timed calls.
            return write!(f, "best restore: no timed device call");
        }
        write!(
            f,
            "best restore: {:.1} us in device calls ({:.1} us of them waiting for the stream), \
             {:.1} us around them",
            us(self.calls),
            us(self.waits),
            us(self.rest)
        )
    }
}

/// A restore target of the issue, as [`judge`] holds it against a run's figures.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Target {
    /// What is promised.
    pub name: &'static str,
    /// The tier it is about.
    pub tier: BenchTier,
    /// The only footprint it is judged at (`None`: every footprint measured).
    pub footprint: Option<u64>,
    /// The written fraction it is judged at.
    pub fraction: f64,
    /// A verified restore may cost at most this fraction of a full restore of the same tier.
    pub max_of_full: f64,
}

/// The restore targets `kreplay bench --backend cuda` judges: verified restores (hash and
/// verified write set) of 1% written against a full restore of the same tier.
pub const TARGETS: [Target; 3] = [
    Target {
        name: "verified restore of 1% of 32 GiB at most 1/2 of a full restore (device shadow)",
        tier: BenchTier::Device,
        footprint: Some(32 * GIB),
        fraction: 0.01,
        max_of_full: 0.5,
    },
    Target {
        name: "verified restore of 1% of 32 GiB at most 1/20 of a full restore from pinned host",
        tier: BenchTier::Host,
        footprint: Some(32 * GIB),
        fraction: 0.01,
        max_of_full: 1.0 / 20.0,
    },
    Target {
        name: "no room for a shadow (squeezed): verified restore of 1% at most 1/20 of a full \
               restore from pinned host, every snapshot whole",
        tier: BenchTier::Squeezed,
        footprint: None,
        fraction: 0.01,
        max_of_full: 1.0 / 20.0,
    },
];

/// One target at one footprint and strategy, judged.
#[derive(Clone, Debug, PartialEq)]
pub struct TargetCheck {
    /// The target.
    pub target: &'static str,
    /// Its tier.
    pub tier: BenchTier,
    /// The footprint (`None` when the tier was not measured at the target's footprint).
    pub footprint: Option<u64>,
    /// The verified strategy judged (`None` with the footprint missing).
    pub strategy: Option<RestoreStrategy>,
    /// `Some(true)` met, `Some(false)` not met, `None` not evaluated.
    pub met: Option<bool>,
    /// The figures, or why it was not evaluated.
    pub detail: String,
}

impl TargetCheck {
    /// "met", "NOT MET" or "not evaluated".
    pub fn verdict(&self) -> &'static str {
        match self.met {
            Some(true) => "met",
            Some(false) => "NOT MET",
            None => "not evaluated",
        }
    }
}

fn same_fraction(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9
}

/// Holds every [`TARGETS`] entry whose tier `config` measured against `figures`: per footprint
/// and verified strategy (hash, verified write set) of the run, the restore at the target's
/// written fraction over the fastest full restore of the same tier and footprint (a full
/// restore costs the same at every fraction; without one, over the footprint's time at the
/// copy ceiling of the tier: pinned host-to-device for the host tiers, device-to-device for the
/// shadow). Not evaluated where a figure is missing.
pub fn judge(config: &BenchConfig, figures: &Figures) -> Vec<TargetCheck> {
    let verified: Vec<RestoreStrategy> = config
        .strategies
        .iter()
        .copied()
        .filter(|s| matches!(s, RestoreStrategy::Hash | RestoreStrategy::Writeset))
        .collect();
    let mut checks = Vec::new();
    for target in TARGETS.iter().filter(|t| config.tiers.contains(&t.tier)) {
        let footprints: Vec<u64> = config
            .footprints
            .iter()
            .copied()
            .filter(|&f| target.footprint.is_none_or(|t| t == f))
            .collect();
        let mut check = |footprint, strategy, met, detail: String| {
            checks.push(TargetCheck {
                target: target.name,
                tier: target.tier,
                footprint,
                strategy,
                met,
                detail,
            })
        };
        if footprints.is_empty() {
            let want = target.footprint.map_or(0, |f| f / GIB);
            check(None, None, None, format!("{want} GiB not measured"));
            continue;
        }
        if verified.is_empty() {
            check(
                None,
                None,
                None,
                "no verified strategy (hash, writeset) measured".into(),
            );
            continue;
        }
        for &footprint in &footprints {
            let rows = || {
                figures
                    .restores
                    .iter()
                    .filter(|m| m.footprint == footprint && m.tier == target.tier)
            };
            let full = rows()
                .filter(|m| m.strategy == RestoreStrategy::Full)
                .map(|m| m.ms)
                .min_by(f64::total_cmp);
            let ceiling = if target.tier == BenchTier::Device {
                figures
                    .copy_ceilings
                    .iter()
                    .find(|c| c.0 == footprint)
                    .map(|c| (c.1, "device copy ceiling"))
            } else {
                figures
                    .htod_ceilings
                    .iter()
                    .find(|c| c.0 == footprint && c.1 == target.tier)
                    .map(|c| (c.2, "pinned host-to-device ceiling"))
            };
            let reference = match (full, ceiling) {
                (Some(full), Some((c, what))) => Some((
                    full,
                    format!("full restore {full:.3} ms ({what} {c:.3} ms)"),
                )),
                (Some(full), None) => Some((full, format!("full restore {full:.3} ms"))),
                (None, Some((c, what))) => {
                    Some((c, format!("{what} {c:.3} ms (no full restore measured)")))
                }
                (None, None) => None,
            };
            let label = fraction_label(target.fraction);
            for &strategy in &verified {
                let at = rows()
                    .find(|m| m.strategy == strategy && same_fraction(m.fraction, target.fraction))
                    .map(|m| m.ms);
                match (at, &reference) {
                    (None, _) => check(
                        Some(footprint),
                        Some(strategy),
                        None,
                        format!("{strategy} at {label} written not measured"),
                    ),
                    (Some(_), None) => check(
                        Some(footprint),
                        Some(strategy),
                        None,
                        "no full restore or ceiling measured".into(),
                    ),
                    (Some(ms), Some((full, against))) => {
                        let ratio = ms / full;
                        check(
                            Some(footprint),
                            Some(strategy),
                            Some(ratio <= target.max_of_full),
                            format!(
                                "{strategy} at {label}: {ms:.3} ms = {ratio:.3} (1/{:.0}) of \
                                 {against}; at most {:.3}",
                                1.0 / ratio,
                                target.max_of_full
                            ),
                        )
                    }
                }
            }
        }
    }
    checks
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
    bytes_hashed,ceiling_copy_ms,ceiling_read_ms,ceiling_htod_pinned_ms,note";

/// Runs the measurements of `config` on device 0, writing CSV rows to `out` as they are
/// measured, and returns the restore figures and ceilings for [`judge`]. An error where there
/// is no driver or device, a driver call fails, a snapshot does not hold the whole footprint,
/// or a restore leaves memory unlike the snapshot.
pub fn run(config: &BenchConfig, out: &mut dyn Write) -> Result<Figures, String> {
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
    let mut figures = Figures::default();
    for &bytes in &config.footprints {
        bench_footprint(d, ctx, bytes, config, out, &mut figures)?;
    }
    Ok(figures)
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

/// Whether a snapshot of a `bytes` footprint is one the tier's rows may be measured on: it
/// holds the whole footprint, and a squeezed one (tier `auto` with no room for a shadow) fell
/// back to pinned host memory (a shadow there would time the device tier under another name).
fn snapshot_as_asked(
    tier: BenchTier,
    bytes: u64,
    moved: u64,
    landed: StoreTier,
    pinned: bool,
) -> Result<(), String> {
    let name = tier.as_str();
    if moved != bytes {
        return Err(format!("{name} snapshot holds {moved} of {bytes} bytes"));
    }
    if tier == BenchTier::Squeezed && (landed != StoreTier::Host || !pinned) {
        return Err(format!(
            "squeezed snapshot landed in {landed:?} ({}), not pinned host memory",
            if pinned { "pinned" } else { "not pinned" }
        ));
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
    config: &BenchConfig,
    out: &mut dyn Write,
    figures: &mut Figures,
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
    // The pinned host-to-device ceiling too, beside the host tiers' rows.
    let ceilings = std::cell::Cell::new((None::<Duration>, None::<Duration>));
    let htod_ceiling = std::cell::Cell::new(None::<Duration>);
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
            "{gib},{fraction},{metric},{:.3},{:.3},{moved},{hashed},{},{},{},\"{}\"",
            ms(t),
            tbps(bytes, t),
            opt(copy),
            opt(read),
            opt(htod_ceiling.get()),
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
    figures.copy_ceilings.push((bytes, ms(copy)));
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
    // What every restore of the restore rows must leave: the footprint's hashes before them
    // (taken again after a tier's whole replays, whose last passes each leave an increment).
    let reference = std::cell::RefCell::new(host_hashes.clone());
    // The whole replays' checks hash through memory of their own: `auto` turns the tier's
    // device kernels off for the dispatches it restores with full copies.
    // SAFETY: the primary context retained in run(), alive for the process.
    let checker = unsafe {
        CudaMemory::new(
            d,
            inventory.clone(),
            ctx,
            ShadowBudget::default(),
            StoreTier::Host,
        )
    }
    .map_err(|e| e.to_string())?;
    let hashes_now = || -> Result<Vec<u64>, String> {
        let mut now = vec![0u64; chunks as usize];
        checker
            .hash_chunks(buf, bytes, CHUNK, &mut now)
            .map_err(|e| e.to_string())?;
        Ok(now)
    };
    let mut kernel = 0u64;
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
        let wrong = now
            .iter()
            .zip(reference.borrow().iter())
            .filter(|(a, b)| a != b)
            .count();
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
        htod_ceiling.set(None);
        if store != StoreTier::Device {
            let pinned = host_copy_ceiling(d, stream, reps)?;
            let at_rate = Duration::from_secs_f64(bytes as f64 / pinned);
            figures.htod_ceilings.push((bytes, bench_tier, ms(at_rate)));
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
            htod_ceiling.set(Some(at_rate));
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
                snapshot_as_asked(
                    bench_tier,
                    bytes,
                    report.bytes_moved,
                    report.tier,
                    report.pinned,
                )?;
                let (mut moved, mut hashed) = (0, 0);
                let mut first = true;
                // Where the best restore's time went: in CudaMemory's calls (waits apart).
                let mut split = (Duration::MAX, HostSplit::default());
                let t = best(reps + 1, || {
                    touch(fraction)?;
                    let before = mem.times();
                    let r = snap
                        .restore(&RestoreRequest {
                            next_pass: 1,
                            may_be_final: false,
                        })
                        .map_err(|e| e.to_string())?;
                    let after = mem.times();
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
                    if r.elapsed < split.0 {
                        split = (r.elapsed, HostSplit::of(&before, &after, r.elapsed));
                    }
                    Ok(r.elapsed)
                })?;
                figures.restores.push(Measured {
                    footprint: bytes,
                    tier: bench_tier,
                    strategy,
                    fraction,
                    ms: ms(t),
                });
                row(
                    label,
                    &format!("{tier}:{metric}"),
                    t,
                    moved,
                    hashed,
                    &format!(
                        "snapshot in {:?} ({}{}) {:.1} ms; {}",
                        report.tier,
                        if report.pinned {
                            "pinned"
                        } else {
                            "not pinned"
                        },
                        if report.hashed { ", hashed" } else { "" },
                        ms(taken),
                        split.1
                    ),
                )?;
                drop(snap);
            }
        }
        // Whole replays of this tier (see `replays`): N full restores are the best full
        // restore just measured times N, else N times the tier's copy ceiling.
        let full_ms = figures
            .restores
            .iter()
            .filter(|m| m.footprint == bytes && m.tier == bench_tier)
            .filter(|m| m.strategy == RestoreStrategy::Full)
            .map(|m| m.ms)
            .min_by(f64::total_cmp)
            .or_else(|| match htod_ceiling.get() {
                Some(at_rate) => Some(ms(at_rate)),
                None => ceilings.get().0.map(ms),
            })
            .unwrap_or(f64::NAN);
        if !config.passes.is_empty() {
            let snapshotter = replays::snapshotter(&inventory, &mem, store, bytes)?;
            let rig = replays::Rig {
                mem: &mem,
                snapshotter: &snapshotter,
                tier: bench_tier,
                bytes,
                touch: &touch,
                hashes: &hashes_now,
            };
            let measured = replays::measure(&rig, config, full_ms, &mut kernel, &mut |m| {
                let label = fraction_label(m.fraction);
                let (strategy, passes) = (m.strategy, m.passes);
                for (when, t) in [("first", m.first_ms()), ("later", m.later_ms())] {
                    row(
                        &label,
                        &format!("{tier}:replay_{strategy}_n{passes}_{when}"),
                        Duration::from_secs_f64(t / 1e3),
                        0,
                        0,
                        &format!(
                            "{when} dispatch{} of {DISPATCHES}: {:.3} of {passes} full restores \
                             ({:.3} ms); restores full/hash/set/unverified {} over all \
                             dispatches, {} of {DISPATCHES} detecting on the device",
                            if when == "later" { "es (median)" } else { "" },
                            t / m.n_full_ms,
                            m.n_full_ms,
                            m.restores,
                            m.on_device,
                        ),
                    )?;
                }
                Ok(())
            })?;
            figures.replays.extend(measured);
            *reference.borrow_mut() = hashes_now()?;
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
            (Box::new(|c| c.passes = vec![38, 1]), "2 to 1000 passes"),
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

    fn m(
        footprint: u64,
        tier: BenchTier,
        strategy: RestoreStrategy,
        fraction: f64,
        ms: f64,
    ) -> Measured {
        Measured {
            footprint,
            tier,
            strategy,
            fraction,
            ms,
        }
    }

    /// Run E4's 32 GiB figures (device shadow and squeezed), with a verified write set made
    /// too slow for the squeezed target.
    fn e4() -> (BenchConfig, Figures) {
        use BenchTier::{Device, Squeezed};
        use RestoreStrategy::{Full, Hash, Writeset, WritesetUnverified};
        let f = 32 * GIB;
        let config = BenchConfig {
            footprints: vec![f],
            fractions: vec![0.001, 0.01],
            tiers: vec![Device, Squeezed],
            ..BenchConfig::default()
        };
        let figures = Figures {
            restores: vec![
                m(f, Device, Full, 0.001, 15.941),
                m(f, Device, Full, 0.01, 15.935),
                m(f, Device, Hash, 0.01, 7.956),
                m(f, Device, Writeset, 0.01, 8.233),
                m(f, Device, WritesetUnverified, 0.01, 0.445),
                m(f, Squeezed, Full, 0.001, 626.2),
                m(f, Squeezed, Full, 0.01, 624.9),
                m(f, Squeezed, Hash, 0.001, 8.298),
                m(f, Squeezed, Hash, 0.01, 14.72),
                m(f, Squeezed, Writeset, 0.01, 35.0),
                m(f, Squeezed, WritesetUnverified, 0.01, 7.523),
            ],
            copy_ceilings: vec![(f, 16.079)],
            htod_ceilings: vec![(f, Squeezed, 665.6)],
            replays: Vec::new(),
        };
        (config, figures)
    }

    #[test]
    fn verified_restores_of_one_percent_are_held_against_the_fastest_full_restore_of_their_tier() {
        let (config, figures) = e4();
        let checks = judge(&config, &figures);
        let line = |tier, strategy| {
            checks
                .iter()
                .find(|c| c.tier == tier && c.strategy == Some(strategy))
                .unwrap_or_else(|| panic!("no {tier:?} {strategy} line in {checks:?}"))
        };
        assert_eq!(checks.len(), 4, "{checks:?}");
        let hash = line(BenchTier::Squeezed, RestoreStrategy::Hash);
        assert_eq!(hash.met, Some(true));
        assert_eq!(hash.footprint, Some(32 * GIB));
        assert!(
            hash.detail.contains("14.720 ms = 0.024 (1/42)"),
            "{}",
            hash.detail
        );
        assert!(
            hash.detail.contains("full restore 624.900 ms"),
            "{}",
            hash.detail
        );
        assert!(
            hash.detail.contains("665.600"),
            "the ceiling beside it: {}",
            hash.detail
        );
        // 35.0 / 624.9 = 0.056: above 1/20.
        let writeset = line(BenchTier::Squeezed, RestoreStrategy::Writeset);
        assert_eq!(writeset.met, Some(false), "{}", writeset.detail);
        // 7.956 / 15.935 = 0.4993 is under half, 8.233 / 15.935 = 0.517 is not.
        assert_eq!(
            line(BenchTier::Device, RestoreStrategy::Hash).met,
            Some(true)
        );
        assert_eq!(
            line(BenchTier::Device, RestoreStrategy::Writeset).met,
            Some(false)
        );
        assert!(
            checks
                .iter()
                .all(|c| c.strategy != Some(RestoreStrategy::WritesetUnverified)),
            "an unverified restore is not what the targets promise"
        );
        let count = |met| checks.iter().filter(|c| c.met == met).count();
        assert_eq!(
            (count(Some(true)), count(Some(false)), count(None)),
            (2, 2, 0)
        );
    }

    #[test]
    fn a_target_at_exactly_its_limit_is_met_and_just_above_it_is_not() {
        let (config, mut figures) = e4();
        for (hash_ms, met) in [(624.9 / 20.0, true), (624.9 / 20.0 + 0.001, false)] {
            figures
                .restores
                .iter_mut()
                .filter(|r| r.tier == BenchTier::Squeezed && r.strategy == RestoreStrategy::Hash)
                .for_each(|r| r.ms = hash_ms);
            let checks = judge(&config, &figures);
            let hash = checks
                .iter()
                .find(|c| {
                    c.tier == BenchTier::Squeezed && c.strategy == Some(RestoreStrategy::Hash)
                })
                .unwrap();
            assert_eq!(hash.met, Some(met), "{hash_ms}: {}", hash.detail);
        }
    }

    #[test]
    fn without_a_full_restore_the_squeezed_target_is_held_against_the_pinned_host_ceiling() {
        let (mut config, mut figures) = e4();
        config.strategies = vec![RestoreStrategy::Hash];
        config.tiers = vec![BenchTier::Squeezed];
        figures
            .restores
            .retain(|r| r.strategy == RestoreStrategy::Hash);
        let checks = judge(&config, &figures);
        assert_eq!(checks.len(), 1, "{checks:?}");
        assert_eq!(checks[0].met, Some(true));
        assert!(
            checks[0]
                .detail
                .contains("pinned host-to-device ceiling 665.600 ms (no full restore measured)"),
            "{}",
            checks[0].detail
        );
        assert!(checks[0].detail.contains("(1/45)"), "{}", checks[0].detail);
    }

    #[test]
    fn a_target_whose_figures_are_missing_is_not_evaluated_and_says_what_is_missing() {
        // No 1% row.
        let (mut config, mut figures) = e4();
        figures.restores.retain(|r| r.fraction != 0.01);
        config.fractions = vec![0.001];
        let checks = judge(&config, &figures);
        assert!(checks.iter().all(|c| c.met.is_none()), "{checks:?}");
        assert!(
            checks[0].detail.contains("1% written not measured"),
            "{checks:?}"
        );
        // The device target is a 32 GiB one: at 1 GiB it is not judged.
        let config = BenchConfig {
            footprints: vec![GIB],
            ..BenchConfig::default()
        };
        let checks = judge(&config, &Figures::default());
        assert_eq!(checks.len(), 1, "{checks:?}");
        assert_eq!(checks[0].met, None);
        assert!(
            checks[0].detail.contains("32 GiB not measured"),
            "{checks:?}"
        );
        // A tier not measured has no line; one without a verified strategy says so.
        let config = BenchConfig {
            footprints: vec![32 * GIB],
            strategies: vec![RestoreStrategy::Full],
            tiers: vec![BenchTier::Squeezed],
            ..BenchConfig::default()
        };
        let checks = judge(&config, &Figures::default());
        assert_eq!(checks.len(), 1, "{checks:?}");
        assert!(
            checks[0].detail.contains("no verified strategy"),
            "{checks:?}"
        );
        assert_eq!(checks[0].verdict(), "not evaluated");
    }

    #[test]
    fn a_squeezed_snapshot_counts_only_whole_and_in_pinned_host_memory() {
        use BenchTier::{Device, Squeezed};
        let g = 32 * GIB;
        assert_eq!(
            snapshot_as_asked(Squeezed, g, g, StoreTier::Host, true),
            Ok(())
        );
        assert_eq!(
            snapshot_as_asked(Device, g, g, StoreTier::Device, false),
            Ok(())
        );
        let short = snapshot_as_asked(Squeezed, g, g - CHUNK, StoreTier::Host, true).unwrap_err();
        assert!(
            short.contains("holds 34359672832 of 34359738368 bytes"),
            "{short}"
        );
        let shadow = snapshot_as_asked(Squeezed, g, g, StoreTier::Device, false).unwrap_err();
        assert!(shadow.contains("landed in Device"), "{shadow}");
        let unpinned = snapshot_as_asked(Squeezed, g, g, StoreTier::Host, false).unwrap_err();
        assert!(unpinned.contains("not pinned"), "{unpinned}");
    }

    #[test]
    fn every_row_has_the_pinned_host_ceiling_column_before_the_note() {
        let columns: Vec<&str> = HEADER.split(',').collect();
        assert_eq!(columns.len(), 11);
        assert_eq!(
            &columns[7..],
            [
                "ceiling_copy_ms",
                "ceiling_read_ms",
                "ceiling_htod_pinned_ms",
                "note"
            ]
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
