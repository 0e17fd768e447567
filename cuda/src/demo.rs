//! `x += 1` on a GPU, replayed and verified: what `kreplay demo --backend cuda` runs.
//!
//! One allocation of the requested footprint is filled with a known pattern; a launch of
//! `kreplay_add_one_runs` (an application's launch, as far as kreplay is concerned) adds 1 to
//! every 32-bit word of the written fraction, spread as evenly spaced runs of 64 KiB. The launch
//! goes through the same [`Window`] the injected library puts around every launch it replays
//! (API ENTER: lock, drain, snapshot; the launch itself is pass 0; API EXIT: restore and
//! re-launch for the later passes), with the snapshot tier and restore strategy read from
//! `KREPLAY_SNAPSHOT_STORE` and `KREPLAY_RESTORE`. The kernel is not idempotent: a restore that
//! misses a byte leaves a word incremented twice. Afterwards every word of the footprint is read
//! back and compared: written words must hold the pattern plus exactly one, the others the
//! pattern.

use std::ffi::c_void;
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

use kreplay_ctxmask::ContextRegistry;
use kreplay_locks::AgentLocks;
use kreplay_passloop::{
    ContinueChange, DispatchInfo, MemoryOpReport, Phase, ReplayOutcome, ReplayRecord, ReplayTool,
    RestoreRequest, ToolAnswer,
};
use kreplay_snapshot::{Filter, Inventory, MemoryKind, NewAllocation, SnapshotConfig, Snapshotter};

use crate::choice::hash_on_device_for;
use crate::config::Config;
use crate::driver::{CuContext, CuDevice, CuDevicePtr, CuStream, Driver};
use crate::kernels::add_one_runs_grid;
use crate::launch::{CudaLaunch, Launch, LaunchApi};
use crate::memory::{CudaMemory, ShadowBudget};
use crate::window::{Window, WindowContext};

/// Bytes of one written run (the snapshot's default chunk size).
pub const RUN_BYTES: u64 = 64 << 10;
/// Most passes the demo runs.
pub const MAX_PASSES: u64 = 64;
/// Bytes read back (and filled) per copy.
const SLICE_BYTES: u64 = 256 << 20;

/// The words `kreplay_add_one_runs` increments: `runs` runs of `run_words` words, run `r`
/// starting at word `r * stride_words`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Runs {
    /// Runs written.
    pub runs: u64,
    /// Words per run.
    pub run_words: u64,
    /// Words from one run's start to the next one's.
    pub stride_words: u64,
}

impl Runs {
    /// The runs that write `written` (a fraction in `(0, 1]`) of a footprint of `footprint`
    /// bytes, a multiple of [`RUN_BYTES`]: the footprint's runs of [`RUN_BYTES`] times the
    /// fraction, rounded, at least one, evenly spaced from the start.
    pub fn select(footprint: u64, written: f64) -> Result<Runs, String> {
        if footprint == 0 || !footprint.is_multiple_of(RUN_BYTES) {
            return Err(format!(
                "footprint of {footprint} bytes: must be a positive multiple of {} KiB",
                RUN_BYTES >> 10
            ));
        }
        if !(written > 0.0 && written <= 1.0) {
            return Err(format!(
                "written fraction {written}: must be above 0 and at most 1"
            ));
        }
        let slots = footprint / RUN_BYTES;
        let runs = ((slots as f64 * written).round() as u64).clamp(1, slots);
        let run_words = RUN_BYTES / 4;
        Ok(Runs {
            runs,
            run_words,
            stride_words: slots / runs * run_words,
        })
    }

    /// Whether word `word` is one the kernel increments.
    pub fn writes(&self, word: u64) -> bool {
        word / self.stride_words < self.runs && word % self.stride_words < self.run_words
    }

    /// Words incremented in all.
    pub fn words(&self) -> u64 {
        self.runs * self.run_words
    }
}

/// The initial value of word `word` (distinct neighbours, never constant memory).
pub fn pattern(word: u64) -> u32 {
    (word as u32).wrapping_mul(0x9e37_79b1) ^ (word >> 32) as u32
}

/// What to run, validated before any driver is looked for.
#[derive(Clone, Debug, PartialEq)]
pub struct DemoConfig {
    /// Device ordinal.
    pub device: i32,
    /// Bytes of the one allocation.
    pub footprint: u64,
    /// Fraction of the footprint the kernel writes, in `(0, 1]`.
    pub written: f64,
    /// Passes of the replayed launch (1: no replay).
    pub passes: u64,
    /// The words written.
    pub runs: Runs,
    /// Snapshot tier, strategy and budget (`KREPLAY_SNAPSHOT_STORE`, `KREPLAY_RESTORE`,
    /// `KREPLAY_MAX_SNAPSHOT_BYTES`, `KREPLAY_SPILL_DIR`).
    pub snapshot: SnapshotConfig,
    /// What a device shadow leaves free (`KREPLAY_CUDA_SHADOW_HEADROOM_MIB`).
    pub shadow: ShadowBudget,
}

impl DemoConfig {
    /// Checks the options and reads the snapshot settings through `lookup` (the environment in
    /// production) as the injected library does; the pass count is this command's own, so
    /// `KREPLAY_PASSES` is not read.
    pub fn new(
        device: i32,
        footprint: u64,
        written: f64,
        passes: u64,
        lookup: impl Fn(&str) -> Option<String>,
    ) -> Result<DemoConfig, String> {
        if device < 0 {
            return Err(format!("device {device}: expected an ordinal from 0"));
        }
        if !(1..=MAX_PASSES).contains(&passes) {
            return Err(format!(
                "{passes} passes: expected 1 to {MAX_PASSES} (1 = no replay)"
            ));
        }
        let runs = Runs::select(footprint, written)?;
        let config = Config::from_lookup(|k| match k {
            "KREPLAY_PASSES" | "KREPLAY_CUDA_PASSES" => None,
            _ => lookup(k),
        })?;
        Ok(DemoConfig {
            device,
            footprint,
            written,
            passes,
            runs,
            snapshot: config.snapshot,
            shadow: config.shadow,
        })
    }
}

/// One restore between two passes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RestoreRow {
    /// How long it took (planning included).
    pub time: Duration,
    /// Bytes written back.
    pub bytes: u64,
    /// How it picked the bytes.
    pub strategy: &'static str,
}

/// The first word found wrong.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WrongWord {
    /// Its index in the footprint.
    pub word: u64,
    /// What it held.
    pub found: u32,
    /// What one run of the kernel leaves there.
    pub expected: u32,
}

/// What a run of the demo did and found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DemoReport {
    /// Device ordinal.
    pub device: i32,
    /// Bytes of the footprint.
    pub footprint: u64,
    /// The words written.
    pub runs: Runs,
    /// Passes asked for.
    pub passes: u64,
    /// The replay window's record of the launch.
    pub record: ReplayRecord,
    /// Where the snapshot was kept (`-` when none was taken).
    pub tier: &'static str,
    /// The snapshot's strategy (`-` when none was taken).
    pub strategy: &'static str,
    /// Every restore, in order.
    pub restores: Vec<RestoreRow>,
    /// Words that do not hold exactly one increment (or an untouched word that changed).
    pub wrong_words: u64,
    /// The first of them.
    pub first_wrong: Option<WrongWord>,
}

impl DemoReport {
    /// Whether the launch was replayed as asked (run once for one pass) and every word is
    /// right.
    pub fn passed(&self) -> bool {
        self.as_planned() && self.wrong_words == 0
    }

    fn as_planned(&self) -> bool {
        match self.record.outcome {
            ReplayOutcome::Replayed { passes, .. } => self.passes > 1 && passes == self.passes,
            ReplayOutcome::RanOnce { .. } => self.passes == 1,
            _ => false,
        }
    }

    /// The table `kreplay demo --backend cuda` prints.
    pub fn table(&self) -> String {
        let mut s = String::new();
        let r = &self.runs;
        let _ = writeln!(
            s,
            "x += 1 on device {}: footprint {}, {} runs of {} written ({} of {} words, {:.3}%)",
            self.device,
            bytes(self.footprint),
            r.runs,
            bytes(r.run_words * 4),
            r.words(),
            self.footprint / 4,
            r.words() as f64 * 400.0 / self.footprint as f64,
        );
        let c = &self.record.cost;
        let verdict = if self.passed() { "PASS" } else { "FAIL" };
        let _ = writeln!(
            s,
            "{:<7} {:<7} {:<9} {:>10} {:>11} {:>8} {:>13} {:>11} {:<9} verification",
            "passes",
            "tier",
            "strategy",
            "snapshot",
            "snap time",
            "restore",
            "restore time",
            "restored",
            "how",
        );
        let head = format!(
            "{:<7} {:<7} {:<9} {:>10} {:>11}",
            c.passes_run,
            self.tier,
            self.strategy,
            bytes(c.bytes_snapshotted),
            millis(c.snapshot),
        );
        if self.restores.is_empty() {
            let _ = writeln!(
                s,
                "{head} {:>8} {:>13} {:>11} {:<9} {verdict}",
                "-", "-", "-", "-"
            );
        }
        for (i, row) in self.restores.iter().enumerate() {
            let first = if i == 0 {
                head.clone()
            } else {
                " ".repeat(head.len())
            };
            let _ = writeln!(
                s,
                "{first} {:>8} {:>13} {:>11} {:<9} {}",
                i + 1,
                millis(row.time),
                bytes(row.bytes),
                row.strategy,
                if i == 0 { verdict } else { "" }
            );
        }
        if !self.restores.is_empty() {
            let times: Vec<Duration> = self.restores.iter().map(|r| r.time).collect();
            let mean = times.iter().sum::<Duration>() / times.len() as u32;
            let _ = writeln!(
                s,
                "restores: {} in all, mean {}, best {}",
                times.len(),
                millis(mean),
                millis(*times.iter().min().unwrap_or(&Duration::ZERO)),
            );
        }
        if !self.as_planned() {
            let why = self
                .record
                .diagnostic()
                .unwrap_or_else(|| format!("{:?}", self.record.outcome));
            let _ = writeln!(
                s,
                "not replayed as planned ({} passes asked): {why}",
                self.passes
            );
        }
        match self.first_wrong {
            None => {
                let _ = writeln!(
                    s,
                    "verification: PASS, every written word holds exactly one increment and every \
                     other word is unchanged"
                );
            }
            Some(w) => {
                let _ = writeln!(
                    s,
                    "verification: FAIL, {} wrong words; the first, word {}, holds {} where one \
                     run leaves {} (initial {})",
                    self.wrong_words,
                    w.word,
                    w.found,
                    w.expected,
                    pattern(w.word)
                );
            }
        }
        s.lines().map(|l| format!("{}\n", l.trim_end())).collect()
    }
}

fn bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{n} B")
    } else {
        format!("{v:.2} {}", UNITS[unit])
    }
}

fn millis(t: Duration) -> String {
    format!("{:.3} ms", t.as_secs_f64() * 1e3)
}

/// The demo's tool: N passes, and it keeps what the snapshot and every restore reported.
struct Recorder {
    passes: u64,
    snapshot: Option<MemoryOpReport>,
    restores: Vec<MemoryOpReport>,
}

impl ReplayTool for Recorder {
    fn config_enter(&mut self, _: &DispatchInfo) -> ToolAnswer {
        ToolAnswer::passes(self.passes)
    }
    fn pass_enter(&mut self, _: &DispatchInfo, _: u64, _: u64) {}
    fn pass_exit(&mut self, _: &DispatchInfo, _: u64, _: u64) -> ContinueChange {
        ContinueChange::Keep
    }
    fn should_continue(&mut self, _: &DispatchInfo, _: u64, _: u64) -> bool {
        true
    }
    fn snapshot(&mut self, _: &DispatchInfo, phase: Phase, report: &MemoryOpReport) {
        if phase == Phase::Exit {
            self.snapshot = Some(*report);
        }
    }
    fn restore(&mut self, _: &DispatchInfo, phase: Phase, _: &RestoreRequest, r: &MemoryOpReport) {
        if phase == Phase::Exit {
            self.restores.push(*r);
        }
    }
    fn config_exit(&mut self, _: &DispatchInfo, _: &ReplayOutcome) {}
}

/// The driver, or why there is none to use.
pub fn driver() -> Result<&'static Driver, String> {
    let d = Driver::get().map_err(|e| {
        format!(
            "no CUDA driver could be loaded, so there is no GPU to run on ({e}); the CUDA \
             backend needs an NVIDIA driver (libcuda.so.1), or KREPLAY_CUDA_DRIVER naming it"
        )
    })?;
    match d.device_count() {
        Ok(n) if n > 0 => Ok(d),
        Ok(_) => Err("the CUDA driver reports no device".into()),
        Err(e) => Err(format!("the CUDA driver cannot count its devices: {e}")),
    }
}

/// Runs the demo: loads the driver (an error, never a panic, where there is none), then
/// allocates, fills, replays and verifies as the module docs say.
pub fn run(config: &DemoConfig) -> Result<DemoReport, String> {
    let d = driver()?;
    let count = d.device_count().map_err(|e| e.to_string())?;
    if config.device >= count {
        return Err(format!(
            "device {}: the CUDA driver reports {count} device{} (0 to {})",
            config.device,
            if count == 1 { "" } else { "s" },
            count - 1
        ));
    }
    let mut dev: CuDevice = 0;
    let mut ctx: CuContext = std::ptr::null_mut();
    // SAFETY: looks the ordinal up and retains its primary context (released below), which
    // becomes current on this thread.
    unsafe {
        d.check("cuDeviceGet", (d.device_get)(&mut dev, config.device))
            .map_err(|e| e.to_string())?;
        d.check(
            "cuDevicePrimaryCtxRetain",
            (d.primary_ctx_retain)(&mut ctx, dev),
        )
        .map_err(|e| e.to_string())?;
    }
    // SAFETY: the context just retained.
    let result = unsafe { d.make_current(ctx) }
        .map_err(|e| e.to_string())
        .and_then(|()| in_context(d, ctx, config));
    // SAFETY: retained above; everything made in it was freed by in_context.
    unsafe { (d.primary_ctx_release)(dev) };
    result
}

/// Device memory and a stream of the demo's own, freed when dropped.
struct Owned {
    d: &'static Driver,
    buf: CuDevicePtr,
    stream: CuStream,
}

impl Drop for Owned {
    fn drop(&mut self) {
        // SAFETY: ours, and nothing is queued on them any more (every path synchronizes first
        // or failed before submitting).
        unsafe {
            if !self.stream.is_null() {
                (self.d.stream_synchronize)(self.stream);
                (self.d.stream_destroy)(self.stream);
            }
            if self.buf != 0 {
                (self.d.mem_free)(self.buf);
            }
        }
    }
}

fn in_context(
    d: &'static Driver,
    ctx: CuContext,
    config: &DemoConfig,
) -> Result<DemoReport, String> {
    let err = |e: crate::driver::CuError| e.to_string();
    let mut owned = Owned {
        d,
        buf: 0,
        stream: std::ptr::null_mut(),
    };
    // SAFETY: allocates in the current context and creates a non-blocking stream there.
    unsafe {
        d.check(
            "cuMemAlloc_v2",
            (d.mem_alloc)(&mut owned.buf, config.footprint as usize),
        )
        .map_err(|e| {
            format!(
                "allocating the footprint of {}: {e}",
                bytes(config.footprint)
            )
        })?;
        d.check("cuStreamCreate", (d.stream_create)(&mut owned.stream, 1))
            .map_err(err)?;
    }
    let (buf, stream) = (owned.buf, owned.stream);
    fill(d, buf, stream, config.footprint)?;

    let inventory = Arc::new(Inventory::new());
    let agent = config.device as u64;
    inventory.on_alloc(NewAllocation {
        base: buf,
        size: config.footprint,
        owner_agent: agent,
        kind: MemoryKind::CoarseDevice,
    });
    // SAFETY: the primary context retained by run(), released only after this returns and
    // after the memory (owned by the snapshotter below) is dropped.
    let memory = unsafe {
        CudaMemory::new(
            d,
            inventory.clone(),
            ctx,
            config.shadow,
            config.snapshot.store,
        )
    }
    .map_err(err)?;
    memory.set_hash_on_device(hash_on_device_for(
        config.snapshot.strategy,
        config.footprint,
    ));
    let kernels = memory.kernels()?;
    let snapshotter = Snapshotter::new(inventory, memory.clone(), config.snapshot.clone())
        .map_err(|e| format!("snapshot configuration: {e}"))?;
    let locks = AgentLocks::new();
    locks.set_enabled(true);
    let filter = Filter::for_replay(agent);
    let registry = ContextRegistry::new();

    let r = config.runs;
    let (mut p, mut runs, mut run_words, mut stride) = (buf, r.runs, r.run_words, r.stride_words);
    let mut args: [*mut c_void; 4] = [
        (&raw mut p).cast(),
        (&raw mut runs).cast(),
        (&raw mut run_words).cast(),
        (&raw mut stride).cast(),
    ];
    let launch = Launch {
        ctx,
        device: config.device,
        api: LaunchApi::Kernel,
        per_thread: false,
        function: kernels.add_one_runs_function(),
        grid: [add_one_runs_grid(r.runs, r.run_words), 1, 1],
        block: [256, 1, 1],
        shared_mem_bytes: 0,
        stream,
        params: args.as_mut_ptr(),
        extra: std::ptr::null_mut(),
    };
    let ops = CudaLaunch {
        driver: d,
        launch,
        drainer: None,
    };
    let info = launch.dispatch_info(1, |a| ops.attribute(a));
    let cx = WindowContext {
        locks: &locks,
        snapshotter: &snapshotter,
        filter: &filter,
        registry: &registry,
        group: &[],
    };
    let mut tool = Recorder {
        passes: config.passes,
        snapshot: None,
        restores: Vec::new(),
    };
    let window = Window::enter(cx, &mut tool, info, &ops);
    // The application's own launch (pass 0), exactly as the later passes re-launch it.
    let launched = crate::window::LaunchOps::relaunch(&ops);
    let record = window.exit(&mut tool, &registry, &ops, launched);
    // SAFETY: our stream; every pass was queued on it.
    d.check("cuStreamSynchronize", unsafe {
        (d.stream_synchronize)(stream)
    })
    .map_err(err)?;
    drop(snapshotter);
    drop(memory);
    let (wrong_words, first_wrong) = verify(d, buf, stream, config.footprint, &r)?;
    let snap = tool.snapshot;
    Ok(DemoReport {
        device: config.device,
        footprint: config.footprint,
        runs: r,
        passes: config.passes,
        tier: snap.map_or("-", |s| s.tier.as_str()),
        strategy: snap.map_or("-", |s| s.strategy.as_str()),
        restores: tool
            .restores
            .iter()
            .zip(&record.cost.restore_times)
            .map(|(rep, &time)| RestoreRow {
                time,
                bytes: rep.bytes_moved,
                strategy: rep.strategy.as_str(),
            })
            .collect(),
        record,
        wrong_words,
        first_wrong,
    })
}

/// Writes [`pattern`] over the footprint, a slice at a time.
fn fill(d: &Driver, buf: CuDevicePtr, stream: CuStream, footprint: u64) -> Result<(), String> {
    let mut host: Vec<u32> = Vec::new();
    let mut off = 0;
    while off < footprint {
        let len = SLICE_BYTES.min(footprint - off);
        let first = off / 4;
        host.clear();
        host.extend((first..first + len / 4).map(pattern));
        // SAFETY: host holds len bytes and lives until the stream is synchronized below; the
        // range lies in buf.
        unsafe {
            d.check(
                "cuMemcpyHtoDAsync_v2",
                (d.memcpy_htod_async)(buf + off, host.as_ptr().cast(), len as usize, stream),
            )
            .and_then(|()| d.check("cuStreamSynchronize", (d.stream_synchronize)(stream)))
            .map_err(|e| e.to_string())?;
        }
        off += len;
    }
    Ok(())
}

/// Reads the footprint back and counts the words that do not hold what one run of the kernel
/// leaves.
fn verify(
    d: &Driver,
    buf: CuDevicePtr,
    stream: CuStream,
    footprint: u64,
    runs: &Runs,
) -> Result<(u64, Option<WrongWord>), String> {
    let mut host: Vec<u32> = vec![0; (SLICE_BYTES.min(footprint) / 4) as usize];
    let (mut wrong, mut first) = (0u64, None);
    let mut off = 0;
    while off < footprint {
        let len = SLICE_BYTES.min(footprint - off);
        // SAFETY: host holds at least len bytes; synchronized before it is read.
        unsafe {
            d.check(
                "cuMemcpyDtoHAsync_v2",
                (d.memcpy_dtoh_async)(host.as_mut_ptr().cast(), buf + off, len as usize, stream),
            )
            .and_then(|()| d.check("cuStreamSynchronize", (d.stream_synchronize)(stream)))
            .map_err(|e| e.to_string())?;
        }
        let (w, f) = check_words(off / 4, &host[..(len / 4) as usize], runs);
        wrong += w;
        first = first.or(f);
        off += len;
    }
    Ok((wrong, first))
}

/// Counts the words of `found` (words `base..` of the footprint) that do not hold what one run
/// of the kernel over `runs` leaves, and returns the first of them.
pub fn check_words(base: u64, found: &[u32], runs: &Runs) -> (u64, Option<WrongWord>) {
    let (mut wrong, mut first) = (0u64, None);
    for (i, &found) in found.iter().enumerate() {
        let word = base + i as u64;
        let expected = pattern(word).wrapping_add(u32::from(runs.writes(word)));
        if found != expected {
            wrong += 1;
            first.get_or_insert(WrongWord {
                word,
                found,
                expected,
            });
        }
    }
    (wrong, first)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The words the kernel's loop touches (`p[r * stride + (i - r * run_words)]`), in order.
    fn kernel_words(r: &Runs) -> Vec<u64> {
        (0..r.runs * r.run_words)
            .map(|i| {
                let run = i / r.run_words;
                run * r.stride_words + (i - run * r.run_words)
            })
            .collect()
    }

    #[test]
    fn selected_runs_are_exactly_the_words_the_kernel_touches_and_stay_in_the_footprint() {
        for (footprint, written) in [
            (RUN_BYTES, 1.0),
            (RUN_BYTES, 0.001),
            (16 * RUN_BYTES, 0.5),
            (100 * RUN_BYTES, 0.01),
            (100 * RUN_BYTES, 0.37),
            (7 * RUN_BYTES, 1.0),
        ] {
            let r = Runs::select(footprint, written).unwrap();
            let touched = kernel_words(&r);
            let words = footprint / 4;
            assert!(touched.iter().all(|&w| w < words), "{footprint} {written}");
            let mut marked = vec![false; words as usize];
            for &w in &touched {
                assert!(!marked[w as usize], "word {w} touched twice");
                marked[w as usize] = true;
            }
            for w in 0..words {
                assert_eq!(r.writes(w), marked[w as usize], "word {w} of {r:?}");
            }
            assert_eq!(r.words(), touched.len() as u64);
        }
    }

    #[test]
    fn the_written_fraction_is_met_to_the_nearest_run_and_never_zero() {
        let gib = 1u64 << 30;
        let r = Runs::select(4 * gib, 0.01).unwrap();
        // 65536 runs of 64 KiB in 4 GiB; 1% of them is 655.36.
        assert_eq!(r.runs, 655);
        assert_eq!(r.run_words, 16384);
        assert_eq!(r.stride_words, 100 * 16384);
        assert_eq!(Runs::select(4 * gib, 1.0).unwrap().words(), gib);
        assert_eq!(Runs::select(RUN_BYTES * 10, 1e-9).unwrap().runs, 1);
    }

    #[test]
    fn bad_footprints_and_fractions_are_refused_with_the_reason() {
        for (footprint, written, expect) in [
            (0, 0.5, "multiple of 64 KiB"),
            (RUN_BYTES + 4, 0.5, "multiple of 64 KiB"),
            (RUN_BYTES, 0.0, "above 0"),
            (RUN_BYTES, 1.5, "at most 1"),
            (RUN_BYTES, f64::NAN, "above 0"),
        ] {
            let e = Runs::select(footprint, written).unwrap_err();
            assert!(e.contains(expect), "{footprint} {written}: {e}");
        }
    }

    #[test]
    fn verification_flags_a_word_incremented_twice_or_not_at_all_or_touched_outside_the_runs() {
        let r = Runs::select(4 * RUN_BYTES, 0.5).unwrap();
        let base = 1000;
        let once: Vec<u32> = (base..base + 4 * r.stride_words)
            .map(|w| pattern(w).wrapping_add(u32::from(r.writes(w))))
            .collect();
        assert_eq!(check_words(base, &once, &r), (0, None));
        // The words as they are after two passes with no restore between them.
        let twice: Vec<u32> = (base..base + 4 * r.stride_words)
            .map(|w| pattern(w).wrapping_add(2 * u32::from(r.writes(w))))
            .collect();
        let (wrong, first) = check_words(base, &twice, &r);
        assert_eq!(wrong, r.words() - base.min(r.run_words));
        assert_eq!(first.unwrap().found, pattern(base) + 2);
        let mut untouched_changed = once.clone();
        let outside = (0..once.len() as u64)
            .find(|&i| !r.writes(base + i))
            .unwrap();
        untouched_changed[outside as usize] ^= 1;
        let (wrong, first) = check_words(base, &untouched_changed, &r);
        assert_eq!(wrong, 1);
        assert_eq!(first.unwrap().word, base + outside);
        let mut missed = once;
        missed[0] = pattern(base);
        assert_eq!(check_words(base, &missed, &r).0, 1);
    }

    fn report(passes: u64, outcome: ReplayOutcome, wrong: u64) -> DemoReport {
        let runs = Runs::select(4 * RUN_BYTES, 0.25).unwrap();
        DemoReport {
            device: 0,
            footprint: 4 * RUN_BYTES,
            runs,
            passes,
            record: ReplayRecord::new(DispatchInfo::default(), outcome, passes, {
                let mut cost = kreplay_passloop::ReplayCost::default();
                cost.passes_run = passes;
                cost
            }),
            tier: "device",
            strategy: "hash",
            restores: (1..passes)
                .map(|_| RestoreRow {
                    time: Duration::from_micros(250),
                    bytes: RUN_BYTES,
                    strategy: "hash",
                })
                .collect(),
            wrong_words: wrong,
            first_wrong: (wrong > 0).then_some(WrongWord {
                word: 3,
                found: pattern(3) + 2,
                expected: pattern(3) + 1,
            }),
        }
    }

    #[test]
    fn the_verdict_needs_every_word_right_and_the_replay_as_planned() {
        let replayed = ReplayOutcome::Replayed {
            passes: 4,
            end: kreplay_passloop::LoopEnd::LastPass,
        };
        let ok = report(4, replayed.clone(), 0);
        assert!(ok.passed());
        let table = ok.table();
        assert!(table.contains("PASS") && !table.contains("FAIL"), "{table}");
        assert_eq!(table.matches("0.250 ms").count(), 3 + 2, "{table}");
        let wrong = report(4, replayed, 5);
        assert!(!wrong.passed());
        assert!(
            wrong.table().contains("FAIL, 5 wrong words"),
            "{}",
            wrong.table()
        );
        let once = ReplayOutcome::RanOnce {
            why: kreplay_passloop::RanOnceReason::Declined(kreplay_passloop::Decline::new(
                kreplay_passloop::DeclineReason::FootprintBudget,
                "too large",
            )),
        };
        let declined = report(4, once.clone(), 0);
        assert!(!declined.passed());
        assert!(declined.table().contains("not replayed as planned"));
        assert!(report(1, once, 0).passed());
    }

    fn env(pairs: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
        move |k| {
            pairs
                .iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        }
    }

    #[test]
    fn the_snapshot_settings_are_read_and_checked_before_anything_runs() {
        let c = DemoConfig::new(
            0,
            RUN_BYTES,
            1.0,
            4,
            env(&[
                ("KREPLAY_SNAPSHOT_STORE", "host"),
                ("KREPLAY_RESTORE", "writeset"),
            ]),
        )
        .unwrap();
        assert_eq!(c.snapshot.store, kreplay_snapshot::StoreTier::Host);
        assert_eq!(
            c.snapshot.strategy,
            kreplay_snapshot::RestoreStrategy::Writeset
        );
        for (var, value) in [
            ("KREPLAY_SNAPSHOT_STORE", "gpu"),
            ("KREPLAY_RESTORE", "fast"),
            ("KREPLAY_MAX_SNAPSHOT_BYTES", "1X"),
        ] {
            let pairs: &'static [(&str, &str)] = Box::leak(Box::new([(var, value)]));
            let e = DemoConfig::new(0, RUN_BYTES, 1.0, 4, env(pairs)).unwrap_err();
            assert!(e.contains(var), "{e}");
        }
    }

    #[test]
    fn the_pass_count_is_the_commands_own_and_bounded() {
        // KREPLAY_PASSES belongs to the injected library; the demo's --passes decides.
        let c = DemoConfig::new(0, RUN_BYTES, 1.0, 3, env(&[("KREPLAY_PASSES", "zero")])).unwrap();
        assert_eq!(c.passes, 3);
        assert!(DemoConfig::new(0, RUN_BYTES, 1.0, 0, env(&[])).is_err());
        assert!(DemoConfig::new(0, RUN_BYTES, 1.0, MAX_PASSES + 1, env(&[])).is_err());
        assert!(DemoConfig::new(-1, RUN_BYTES, 1.0, 2, env(&[])).is_err());
    }

    #[test]
    fn without_a_driver_the_demo_says_so_and_runs_nothing() {
        if Driver::get().is_ok() {
            eprintln!("skipped: a CUDA driver is present here");
            return;
        }
        let c = DemoConfig::new(0, RUN_BYTES, 1.0, 2, env(&[])).unwrap();
        let e = run(&c).unwrap_err();
        assert!(e.contains("no CUDA driver could be loaded"), "{e}");
        assert!(e.contains("libcuda.so.1"), "{e}");
    }
}
