//! `kreplay bench-dispatch`: the fixed cost kreplay adds per dispatch, on the software HSA
//! runtime, in-process.
//!
//! kreplay is installed into a copy of softhsa's table the way a runtime loads a tools library
//! (as `kreplay demo` does). Dispatches of an empty kernel (one work-item) are submitted and
//! waited for one at a time, round-robin over *lanes*: a queue of softhsa's own table (the
//! baseline), an intercept queue of softhsa's own table with a pass-through handler (softhsa's
//! interception machinery alone), and a queue of the table kreplay is installed in, used with the
//! tool answering N passes (replayed) or leaving the pass-count callback NULL (opted out).
//!
//! Once a tool configured the replay service it stays configured for the life of the process,
//! so the ordinary path with no replay service is measured in a child process that runs
//! `kreplay bench-dispatch --service none` (no tool at all) and hands its figures back as CSV.
//!
//! The opted-out and no-service costs are also measured paired: one dispatch on a queue of
//! kreplay's table and one on an intercept queue with the pass-through handler per round, each
//! queue with a probe below the measured handler that times the writes to softhsa's hardware
//! queue (softhsa's `testing::wrap_hardware_writes`: a handler registered after the measured
//! one would be called before it, as ROCm orders handlers); the submit minus that time is the handler's own work, and the targets are judged by
//! the median of the rounds' differences (the lanes' difference of medians holds the hardware
//! queue's wake-ups, which do not resolve a microsecond).
//!
//! Whether ordinary work keeps its concurrency is measured in another child process
//! (`--service overlap`), whose softhsa runs dispatches of one queue concurrently as AQL allows:
//! two long kernels written to one queue, on a queue of softhsa's own table and on a queue of
//! kreplay's table with the tool opting out.
//!
//! The per-pass hand-off is measured from kreplay's own timing of each pass (submit until the
//! completion wait returns) in replays of [`HANDOFF_PASSES`] passes, against the kernel's own
//! time, in this process and in a child process pinned to one CPU (`--service handoff --pin`).
//! Last, real inventories: coarse-grained allocations added on the replayed agent, each one in
//! the snapshot (the tool checks the region count of every SNAPSHOT EXIT record), with the
//! snapshot's and the restore's cost per region.

use std::collections::BTreeMap;
use std::ffi::c_void;
use std::io::Write;
use std::panic::AssertUnwindSafe;
use std::path::Path;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use hsa_sys::*;
use kreplay_passloop::{RanOnceReason, ReplayOutcome, ReplayRecord};
use kreplay_softhsa::testing::{Dispatch, Hsa, PoolKind, dispatch_packet};
use kreplay_softhsa::{OwnedApiTable, WorkGroup};

use super::tool;
use crate::args::{DispatchBenchOptions, DispatchService};
use crate::format::{Align, Table, format_bytes};

/// Bytes of the replayed dispatch's own coarse-grained buffer.
pub const BUFFER_BYTES: usize = 4096;
/// Bytes of each of the other tracked allocations.
pub const OTHER_ALLOCATION_BYTES: usize = 4096;
/// The replayed-dispatch target: fixed cost below this, in nanoseconds.
pub const REPLAY_TARGET_NS: f64 = 100_000.0;
/// The opt-out and no-service target: added cost below this, in nanoseconds.
pub const ORDINARY_TARGET_NS: f64 = 1_000.0;
/// Idle queues of kreplay's table on the agent besides the measured one (drained by a replay).
pub const IDLE_SIBLINGS: usize = 1;
/// How long one dispatch may take before the benchmark gives up.
const DISPATCH_DEADLINE: Duration = Duration::from_secs(30);
/// Packets per queue.
const QUEUE_SIZE: u32 = 256;

/// How long each kernel of the overlap measurement runs (it sleeps: a long GPU kernel that
/// needs no host CPU, so the measurement does not depend on free cores).
pub const OVERLAP_KERNEL: Duration = Duration::from_millis(20);
/// Rounds of the overlap measurement per queue.
const OVERLAP_ROUNDS: usize = 5;

/// Passes of the long replays of the per-pass hand-off measurement.
pub const HANDOFF_PASSES: u64 = 10;
/// The per-pass hand-off target: overhead of a pass beyond its kernel below this, in
/// nanoseconds.
pub const HANDOFF_TARGET_NS: f64 = 20_000.0;
/// Timed replays of each pass count of the hand-off measurement (at most `--dispatches`).
const HANDOFF_REPLAYS: usize = 300;
/// Untimed replays of each pass count before them.
const HANDOFF_WARM_UP: usize = 20;
/// Untimed replays before each inventory's timed ones.
const INVENTORY_WARM_UP: usize = 3;

static RAN: AtomicBool = AtomicBool::new(false);

/// A series' median and spread, in nanoseconds.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Stat {
    /// The median.
    pub median: f64,
    /// The 10th percentile.
    pub p10: f64,
    /// The 90th percentile.
    pub p90: f64,
    /// Values the statistic summarizes (0 for a figure derived from other medians).
    pub samples: usize,
}

impl Stat {
    /// The statistic of `values` (sorted in place); `None` when empty.
    pub fn of(values: &mut [f64]) -> Option<Stat> {
        if values.is_empty() {
            return None;
        }
        values.sort_by(f64::total_cmp);
        let at = |q: f64| {
            let position = q * (values.len() - 1) as f64;
            let (low, high) = (position.floor() as usize, position.ceil() as usize);
            let weight = position - low as f64;
            values[low] * (1.0 - weight) + values[high] * weight
        };
        Some(Stat {
            median: at(0.5),
            p10: at(0.1),
            p90: at(0.9),
            samples: values.len(),
        })
    }

    /// A figure computed from other medians.
    fn derived(value: f64) -> Stat {
        Stat {
            median: value,
            p10: f64::NAN,
            p90: f64::NAN,
            samples: 0,
        }
    }
}

/// Named figures in nanoseconds (`<lane>.submit`, `<lane>.round_trip`, `kernel.run`,
/// `replay_loop.*`, `derived.*`; figures of the child process are prefixed `none.`).
pub type Figures = BTreeMap<String, Stat>;

/// Where a queue comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum QueueKind {
    /// softhsa's own table, no interception.
    Softhsa,
    /// softhsa's own table, an intercept queue with a pass-through handler.
    Intercept,
    /// softhsa's own table, an intercept queue whose handler runs each dispatch N times the way
    /// a replay loop does, with nothing else.
    Runs,
    /// The table kreplay is installed in.
    Kreplay,
}

/// One way of submitting the dispatch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum LaneKind {
    Softhsa,
    Intercept,
    Runs,
    Replayed,
    OptedOut,
    NoService,
}

impl LaneKind {
    fn key(self) -> &'static str {
        match self {
            LaneKind::Softhsa => "softhsa",
            LaneKind::Intercept => "intercept",
            LaneKind::Runs => "runs",
            LaneKind::Replayed => "replayed",
            LaneKind::OptedOut => "opted_out",
            LaneKind::NoService => "no_service",
        }
    }
}

/// A queue, its completion signal and the packet dispatched on it, plus the samples.
struct Lane {
    kind: LaneKind,
    hsa: Hsa,
    queue: *mut hsa_queue_t,
    signal: hsa_signal_t,
    packet: hsa_kernel_dispatch_packet_t,
    /// What the tool answers at CONFIG ENTER before this lane's dispatch (`None`: no tool).
    tool_passes: Option<u64>,
    submit: Vec<f64>,
    round_trip: Vec<f64>,
}

impl Lane {
    /// Submits one dispatch and waits for it; returns (submit, round trip) in nanoseconds.
    fn time_one(&self) -> Result<(f64, f64), String> {
        self.time_with(self.tool_passes)
    }

    /// [`Lane::time_one`] with the tool answering `tool_passes` instead of the lane's answer.
    fn time_with(&self, tool_passes: Option<u64>) -> Result<(f64, f64), String> {
        if let Some(passes) = tool_passes {
            tool::set_passes(passes);
        }
        self.hsa.signal_store(self.signal, 1);
        let start = Instant::now();
        // SAFETY: the queue is live and was created through `self.hsa`'s runtime; the packet is
        // a 64-byte kernel dispatch packet with no kernel arguments.
        unsafe { self.hsa.submit(self.queue, &self.packet) };
        let submitted = start.elapsed();
        if !self.hsa.wait_zero(self.signal, DISPATCH_DEADLINE) {
            return Err(format!(
                "a dispatch on the {} lane did not complete within {} s",
                self.kind.key(),
                DISPATCH_DEADLINE.as_secs()
            ));
        }
        let done = start.elapsed();
        Ok((submitted.as_nanos() as f64, done.as_nanos() as f64))
    }
}

impl Lane {
    /// One dispatch on a lane whose queue has the probe ([`Rig::add_probe`]) below its
    /// handler: (the submit minus the time spent below the handler, the submit), in
    /// nanoseconds. The first is the handler's own work plus softhsa's interception machinery.
    fn time_probed(&self) -> Result<(f64, f64), String> {
        PROBE_BELOW.store(0, Ordering::Relaxed);
        PROBE_CALLS.store(0, Ordering::Relaxed);
        PROBE_LAST_OUT.store(0, Ordering::Relaxed);
        if let Some(passes) = self.tool_passes {
            tool::set_passes(passes);
        }
        self.hsa.signal_store(self.signal, 1);
        let submit_start = probe_now();
        // SAFETY: as in `time_with`.
        unsafe { self.hsa.submit(self.queue, &self.packet) };
        let submit_end = probe_now();
        let submit = (submit_end - submit_start) as f64;
        if !self.hsa.wait_zero(self.signal, DISPATCH_DEADLINE) {
            return Err(format!(
                "a dispatch on the probed {} lane did not complete within {} s",
                self.kind.key(),
                DISPATCH_DEADLINE.as_secs()
            ));
        }
        let (below, calls, last_out) = (
            PROBE_BELOW.load(Ordering::Relaxed),
            PROBE_CALLS.load(Ordering::Relaxed),
            PROBE_LAST_OUT.load(Ordering::Relaxed),
        );
        if calls == 0 {
            return Err(format!(
                "a dispatch on the probed {} lane never reached the probe below its handler",
                self.kind.key()
            ));
        }
        // The handler must have run inside the doorbell store (one dispatch at a time, on this
        // thread), or the time below it is not part of the submit.
        if last_out > submit_end || below as f64 > submit {
            return Err(format!(
                "a dispatch on the probed {} lane was written to the hardware queue outside \
                 its doorbell store ({} ns below the handler in {calls} call(s), the last \
                 returning {} ns after the submit, which took {submit} ns)",
                self.kind.key(),
                below,
                last_out as i64 - submit_end as i64
            ));
        }
        Ok((submit - below as f64, submit))
    }
}

/// What one process set up: lanes and everything to release.
struct Rig {
    plain: Hsa,
    app: Hsa,
    gpu: hsa_agent_t,
    lanes: Vec<Lane>,
    queues: Vec<(Hsa, *mut hsa_queue_t)>,
    signals: Vec<(Hsa, hsa_signal_t)>,
    allocations: Vec<*mut u8>,
    /// What the N-runs handler needs; boxed so its address stays put while the queue lives.
    runs: Option<Box<RunsHandler>>,
    /// Tracked allocations by kind: (fine-grained on the agent, kernarg, on another agent).
    tracked: (usize, usize, usize),
    /// Coarse-grained allocations on the replayed agent added for the inventory measurements.
    inventory: usize,
    /// The empty kernel every lane dispatches.
    kernel: u64,
}

impl Drop for Rig {
    /// Releases everything; statuses are ignored (nothing is left to report them to).
    fn drop(&mut self) {
        for (hsa, queue) in self.queues.drain(..) {
            // SAFETY: a queue this rig created through `hsa`, destroyed once; no packet is in
            // flight (every dispatch was waited for, or the rig gave up on the process).
            let _ = unsafe { hsa.queue_destroy(queue) };
        }
        for (hsa, signal) in self.signals.drain(..) {
            let _ = hsa.signal_destroy(signal);
        }
        for ptr in self.allocations.drain(..) {
            let _ = self.app.free(ptr);
        }
    }
}

fn empty_kernel(_: &WorkGroup) {}

fn long_kernel(group: &WorkGroup) {
    if group.group_id() == [0, 0, 0] {
        std::thread::sleep(OVERLAP_KERNEL);
    }
}

/// softhsa's pass-through intercept handler: every packet goes on unchanged.
unsafe extern "C" fn pass_through(
    packets: *const c_void,
    count: u64,
    _user_packet_index: u64,
    _data: *mut c_void,
    writer: hsa_amd_queue_intercept_packet_writer,
) {
    if let Some(writer) = writer {
        // SAFETY: the runtime hands `count` packets at `packets`, valid for this call, and a
        // writer valid for this call.
        unsafe { writer(packets, count) };
    }
}

/// Nanoseconds since the first probe reading (so that 0 never is a reading).
fn probe_now() -> u64 {
    static BASE: OnceLock<Instant> = OnceLock::new();
    BASE.get_or_init(Instant::now).elapsed().as_nanos() as u64 + 1
}

/// Time spent below the measured lane's handler (in the writes to softhsa's hardware queue,
/// its doorbell and the packet processor's wake-up), summed over the probe's calls of one
/// dispatch; the probe's calls; its last return ([`probe_now`]).
static PROBE_BELOW: AtomicU64 = AtomicU64::new(0);
static PROBE_CALLS: AtomicU64 = AtomicU64::new(0);
static PROBE_LAST_OUT: AtomicU64 = AtomicU64::new(0);

/// The probe: times one write of the measured handler's chain into softhsa's hardware queue,
/// the part of a submit that is not the handler above, and that a wake-up across vCPUs makes
/// noisy.
fn probe(write: &mut dyn FnMut()) {
    let entered = probe_now();
    write();
    let left = probe_now();
    PROBE_BELOW.fetch_add(left - entered, Ordering::Relaxed);
    PROBE_CALLS.fetch_add(1, Ordering::Relaxed);
    PROBE_LAST_OUT.store(left, Ordering::Relaxed);
}

/// The N-runs handler's state: the table to call, its own pass signal and the run count.
struct RunsHandler {
    hsa: Hsa,
    signal: hsa_signal_t,
    runs: u64,
    /// Dispatches that did not complete in time (the handler then gives up on them).
    stuck: std::sync::atomic::AtomicU64,
}

/// An intercept handler that does what a replay loop must do and nothing else: a single kernel
/// dispatch is submitted `runs` times through the writer with the handler's own completion
/// signal, each run waited for (a look at the signal, then a blocking wait if needed), then the
/// application's completion signal is decremented once. Anything else is forwarded unchanged.
unsafe extern "C" fn run_n_times(
    packets: *const c_void,
    count: u64,
    _user_packet_index: u64,
    data: *mut c_void,
    writer: hsa_amd_queue_intercept_packet_writer,
) {
    let Some(writer) = writer else { return };
    // SAFETY: `data` is the rig's boxed `RunsHandler` (or null), alive until after the queue is
    // destroyed (the rig destroys its queues first).
    let handler = unsafe { data.cast::<RunsHandler>().as_ref() };
    let (Some(handler), Some(subtract)) = (
        handler,
        handler.and_then(|h| h.hsa.core().hsa_signal_subtract_screlease_fn),
    ) else {
        // SAFETY: as in `pass_through`.
        unsafe { writer(packets, count) };
        return;
    };
    // SAFETY: the runtime hands `count` >= 1 packets of 64 bytes at `packets`, valid for this
    // call.
    let mut packet = unsafe {
        packets
            .cast::<hsa_kernel_dispatch_packet_t>()
            .read_unaligned()
    };
    if count != 1 || u32::from(packet.header) & 0xff != HSA_PACKET_TYPE_KERNEL_DISPATCH {
        // SAFETY: as in `pass_through`.
        unsafe { writer(packets, count) };
        return;
    }
    let application = packet.completion_signal;
    packet.completion_signal = handler.signal;
    // The table wrappers only panic on a missing entry (softhsa's table has them all); should
    // one panic anyway, the application's completion is still fired below.
    let _ = std::panic::catch_unwind(AssertUnwindSafe(|| {
        for _ in 0..handler.runs {
            handler.hsa.signal_store(handler.signal, 1);
            // SAFETY: one packet, valid for the call; the writer is valid during this handler.
            unsafe { writer((&raw const packet).cast(), 1) };
            // As kreplay's pass loop does: look first, block only if the run is not done yet.
            if handler.hsa.signal_load(handler.signal) != 0
                && !handler.hsa.wait_zero(handler.signal, DISPATCH_DEADLINE)
            {
                handler.stuck.fetch_add(1, Ordering::Relaxed);
                break;
            }
        }
    }));
    if application.handle != 0 {
        // SAFETY: the application's completion signal, a live signal of this runtime.
        unsafe { subtract(application, 1) };
    }
}

fn hsa_error(call: &str) -> impl Fn(hsa_status_t) -> String + '_ {
    move |status| format!("{call} failed with status {status:#x}")
}

impl Rig {
    fn new(plain: Hsa, app: Hsa, options: &DispatchBenchOptions) -> Result<Rig, String> {
        let gpus = app.gpu_agents().map_err(hsa_error("hsa_iterate_agents"))?;
        let gpu = *gpus
            .first()
            .ok_or("the software HSA runtime reports no GPU agent")?;
        let mut rig = Rig {
            plain,
            app,
            gpu,
            lanes: Vec::new(),
            queues: Vec::new(),
            signals: Vec::new(),
            allocations: Vec::new(),
            runs: None,
            tracked: (0, 0, 0),
            inventory: 0,
            kernel: 0,
        };
        rig.allocate(&gpus, options.allocations)?;
        let kernel = kreplay_softhsa::register_kernel("kreplay_bench_empty", empty_kernel);
        rig.kernel = kernel;
        let replay = matches!(
            options.service,
            DispatchService::Replay | DispatchService::Handoff
        );

        let softhsa = rig.queue(QueueKind::Softhsa)?;
        rig.lane(LaneKind::Softhsa, plain, softhsa, kernel, None)?;
        let intercept = rig.queue(QueueKind::Intercept)?;
        rig.lane(LaneKind::Intercept, plain, intercept, kernel, None)?;
        if replay {
            let signal = plain
                .signal_create(0)
                .map_err(hsa_error("hsa_signal_create"))?;
            rig.signals.push((plain, signal));
            rig.runs = Some(Box::new(RunsHandler {
                hsa: plain,
                signal,
                runs: options.passes,
                stuck: std::sync::atomic::AtomicU64::new(0),
            }));
            let runs = rig.queue(QueueKind::Runs)?;
            rig.lane(LaneKind::Runs, plain, runs, kernel, None)?;
        }
        let kreplay_queue = rig.queue(QueueKind::Kreplay)?;
        for _ in 0..IDLE_SIBLINGS {
            // Idle sibling queues on the agent: a replay drains them too.
            rig.queue(QueueKind::Kreplay)?;
        }
        if replay {
            rig.lane(
                LaneKind::Replayed,
                app,
                kreplay_queue,
                kernel,
                Some(options.passes),
            )?;
            rig.lane(LaneKind::OptedOut, app, kreplay_queue, kernel, Some(0))?;
        } else {
            rig.lane(LaneKind::NoService, app, kreplay_queue, kernel, None)?;
        }
        Ok(rig)
    }

    /// The replayed dispatch's buffer, then `others` allocations that are tracked but never
    /// snapshotted for it: fine-grained on its agent, kernarg, and coarse-grained on another
    /// agent, in turn.
    fn allocate(&mut self, gpus: &[hsa_agent_t], others: usize) -> Result<(), String> {
        let app = self.app;
        let pool = |agent, kind, what: &str| {
            app.pool(agent, kind)
                .map_err(|status| format!("no {what} pool ({status:#x})"))
        };
        let coarse = pool(self.gpu, PoolKind::Coarse, "coarse-grained")?;
        let fine = pool(self.gpu, PoolKind::Fine, "fine-grained")?;
        let kernarg = match app.pool(self.gpu, PoolKind::Kernarg) {
            Ok(p) => p,
            Err(_) => {
                let cpu = app.cpu_agent().map_err(hsa_error("hsa_iterate_agents"))?;
                pool(cpu, PoolKind::Kernarg, "kernarg")?
            }
        };
        let other_agent = match gpus.get(1) {
            Some(&other) => Some(pool(other, PoolKind::Coarse, "coarse-grained")?),
            None => None,
        };
        let buffer = app
            .allocate(coarse, BUFFER_BYTES)
            .map_err(hsa_error("hsa_amd_memory_pool_allocate"))?;
        self.allocations.push(buffer);
        for i in 0..others {
            let (pool, count) = match (i % 3, other_agent) {
                (1, _) => (kernarg, &mut self.tracked.1),
                (2, Some(other)) => (other, &mut self.tracked.2),
                _ => (fine, &mut self.tracked.0),
            };
            let ptr = app
                .allocate(pool, OTHER_ALLOCATION_BYTES)
                .map_err(hsa_error("hsa_amd_memory_pool_allocate"))?;
            self.allocations.push(ptr);
            *count += 1;
        }
        Ok(())
    }

    /// A queue on the agent: through softhsa's own table (plain, or an intercept queue with the
    /// pass-through handler) with profiling on, as kreplay turns it on for its own queues; or
    /// through the table kreplay is installed in.
    fn queue(&mut self, kind: QueueKind) -> Result<*mut hsa_queue_t, String> {
        let hsa = if kind == QueueKind::Kreplay {
            self.app
        } else {
            self.plain
        };
        let intercept = matches!(kind, QueueKind::Intercept | QueueKind::Runs);
        let queue = if intercept {
            hsa.intercept_queue_create(self.gpu, QUEUE_SIZE)
                .map_err(hsa_error("hsa_amd_queue_intercept_create"))?
        } else {
            hsa.queue_create(self.gpu, QUEUE_SIZE)
                .map_err(hsa_error("hsa_queue_create"))?
        };
        self.queues.push((hsa, queue));
        if intercept {
            let register = hsa
                .amd()
                .hsa_amd_queue_intercept_register_fn
                .ok_or("the table has no hsa_amd_queue_intercept_register")?;
            let (handler, data): (unsafe extern "C" fn(_, _, _, _, _), *mut c_void) =
                match &self.runs {
                    Some(runs) if kind == QueueKind::Runs => (
                        run_n_times,
                        std::ptr::from_ref::<RunsHandler>(runs).cast_mut().cast(),
                    ),
                    _ => (pass_through, std::ptr::null_mut()),
                };
            // SAFETY: a live intercept queue of this runtime and a handler with the HSA
            // signature; its data (if any) is boxed in the rig and outlives the queue.
            let status = unsafe { register(queue, Some(handler), data) };
            if status != HSA_STATUS_SUCCESS {
                return Err(hsa_error("hsa_amd_queue_intercept_register")(status));
            }
        }
        if kind != QueueKind::Kreplay {
            let enable = hsa
                .amd()
                .hsa_amd_profiling_set_profiler_enabled_fn
                .ok_or("the table has no hsa_amd_profiling_set_profiler_enabled")?;
            // SAFETY: a live queue of this runtime.
            let status = unsafe { enable(queue, 1) };
            if status != HSA_STATUS_SUCCESS {
                return Err(hsa_error("hsa_amd_profiling_set_profiler_enabled")(status));
            }
        }
        Ok(queue)
    }

    fn lane(
        &mut self,
        kind: LaneKind,
        hsa: Hsa,
        queue: *mut hsa_queue_t,
        kernel: u64,
        tool_passes: Option<u64>,
    ) -> Result<(), String> {
        let lane = self.new_lane(kind, hsa, queue, kernel, tool_passes)?;
        self.lanes.push(lane);
        Ok(())
    }

    /// A lane that is not one of the rig's round-robin lanes (its signal is the rig's).
    fn new_lane(
        &mut self,
        kind: LaneKind,
        hsa: Hsa,
        queue: *mut hsa_queue_t,
        kernel: u64,
        tool_passes: Option<u64>,
    ) -> Result<Lane, String> {
        let signal = hsa
            .signal_create(0)
            .map_err(hsa_error("hsa_signal_create"))?;
        self.signals.push((hsa, signal));
        let packet = dispatch_packet(&Dispatch::linear(
            kernel,
            1,
            1,
            std::ptr::null_mut(),
            signal,
        ));
        Ok(Lane {
            kind,
            hsa,
            queue,
            signal,
            packet,
            tool_passes,
            submit: Vec::new(),
            round_trip: Vec::new(),
        })
    }

    /// Puts the [`probe`] around the writes of `queue`'s handlers into its hardware queue (an
    /// intercept queue: softhsa's own, or one kreplay created). A handler registered after
    /// the measured one would not do: the runtime calls the handler registered last first.
    fn add_probe(&self, queue: *mut hsa_queue_t) -> Result<(), String> {
        kreplay_softhsa::testing::wrap_hardware_writes(queue, |_, write| probe(write))
            .map_err(hsa_error("wrapping the hardware queue's writes"))
    }

    /// kreplay's own work on the ordinary path, paired dispatch by dispatch against softhsa's
    /// pass-through handler: two fresh queues, an intercept queue with the pass-through handler
    /// and a queue of kreplay's table, each with the [`probe`] below its handler.
    /// Per dispatch the submit minus the time below the handler (softhsa's hardware queue, its
    /// doorbell and wake-up, the same for both) is the handler's own work; each round times one
    /// dispatch on each queue, in alternating order, and the figure is the median of the
    /// rounds' differences. The tool opts out (`opt_out`, the replay service configured) or no
    /// service is configured; either way every kreplay dispatch is checked to have taken that
    /// path. The two queues are destroyed afterwards, so later replays drain no more siblings.
    fn measure_own_work(&mut self, rounds: usize, opt_out: bool) -> Result<Figures, String> {
        let first_queue = self.queues.len();
        let result = self.time_own_work(rounds, opt_out);
        for (hsa, queue) in self.queues.drain(first_queue..) {
            // SAFETY: a queue this rig created through `hsa` and destroys once; every dispatch
            // on it was waited for.
            let _ = unsafe { hsa.queue_destroy(queue) };
        }
        result
    }

    fn time_own_work(&mut self, rounds: usize, opt_out: bool) -> Result<Figures, String> {
        let (plain, app, kernel) = (self.plain, self.app, self.kernel);
        let intercept = self.queue(QueueKind::Intercept)?;
        self.add_probe(intercept)?;
        let kreplay_queue = self.queue(QueueKind::Kreplay)?;
        self.add_probe(kreplay_queue)?;
        let (kind, key, passes) = if opt_out {
            (LaneKind::OptedOut, "opted_out", Some(0))
        } else {
            (LaneKind::NoService, "no_service", None)
        };
        let lanes = [
            self.new_lane(LaneKind::Intercept, plain, intercept, kernel, None)?,
            self.new_lane(kind, app, kreplay_queue, kernel, passes)?,
        ];
        kreplay::hsa_tool::set_collect_replay_records(!opt_out);
        let _ = kreplay::hsa_tool::take_replay_records();
        let before = tool::counts();
        let warm_up = warm_up_rounds(rounds);
        let (mut own_intercept, mut own_kreplay) =
            (Vec::with_capacity(rounds), Vec::with_capacity(rounds));
        let mut paired = Vec::with_capacity(rounds);
        let timed = (|| {
            for round in 0..warm_up + rounds {
                let mut work = [0.0; 2];
                for step in 0..2 {
                    let i = (round + step) % 2;
                    work[i] = lanes[i].time_probed()?.0;
                }
                if round >= warm_up {
                    own_intercept.push(work[0]);
                    own_kreplay.push(work[1]);
                    paired.push(work[1] - work[0]);
                }
            }
            Ok::<(), String>(())
        })();
        kreplay::hsa_tool::set_collect_replay_records(false);
        let records = kreplay::hsa_tool::take_replay_records();
        timed?;
        let after = tool::counts();
        let dispatched = (warm_up + rounds) as u64;
        if opt_out {
            // Each opted-out dispatch: one CONFIG ENTER, no pass.
            let enters = after.config_enters - before.config_enters;
            let passes = after.pass_enters - before.pass_enters;
            if enters != dispatched || passes != 0 {
                return Err(format!(
                    "the probed opt-out lane's {dispatched} dispatches brought {enters} CONFIG \
                     ENTERs and {passes} PASS ENTERs; {dispatched} and 0 were expected"
                ));
            }
        } else if !records.is_empty() || kreplay::services::replay_configured() {
            return Err(format!(
                "with no replay service, {} dispatches of the probed lane went through the \
                 replay loop",
                records.len()
            ));
        }
        let mut figures = Figures::new();
        for (name, values) in [
            ("own.intercept".to_string(), &mut own_intercept),
            (format!("own.{key}"), &mut own_kreplay),
            (format!("own.{key}_minus_intercept"), &mut paired),
        ] {
            if let Some(stat) = Stat::of(values) {
                figures.insert(name, stat);
            }
        }
        Ok(figures)
    }

    fn lane_of(&self, kind: LaneKind) -> Option<&Lane> {
        self.lanes.iter().find(|l| l.kind == kind)
    }

    /// The softhsa lane's last dispatch as the packet processor timed it (start to end of the
    /// kernel), in nanoseconds.
    fn kernel_time(&self) -> Option<f64> {
        self.dispatch_time(self.lane_of(LaneKind::Softhsa)?)
    }

    /// The kernel time the lane's completion signal reports (start to end, as the packet
    /// processor timed it), in nanoseconds; for a replayed dispatch that is pass 0's, which
    /// kreplay carries to the application's signal.
    fn dispatch_time(&self, lane: &Lane) -> Option<f64> {
        let get = self.plain.amd().hsa_amd_profiling_get_dispatch_time_fn?;
        let mut time = hsa_amd_profiling_dispatch_time_t { start: 0, end: 0 };
        // SAFETY: the lane's signal completed a dispatch on a profiled queue of this agent;
        // `time` is a valid out-pointer.
        let status = unsafe { get(self.gpu, lane.signal, &mut time) };
        (status == HSA_STATUS_SUCCESS && time.end > time.start)
            .then(|| (time.end - time.start) as f64 * 1e9 / ticks_per_second(&self.plain) as f64)
    }

    /// The per-pass hand-off: replays of [`HANDOFF_PASSES`] passes alternating with replays of
    /// `options.passes`, kreplay's cost records on. Figures `handoff.*`.
    fn measure_handoff(&mut self, options: &DispatchBenchOptions) -> Result<Figures, String> {
        let short = options.passes;
        let long = HANDOFF_PASSES.max(short + 1);
        let replays = options.dispatches.min(HANDOFF_REPLAYS);
        let warm_up = HANDOFF_WARM_UP;
        let lane = self.lane_of(LaneKind::Replayed).ok_or("missing lane")?;
        kreplay::hsa_tool::set_collect_replay_records(true);
        let _ = kreplay::hsa_tool::take_replay_records();
        let mut round_trips = (Vec::new(), Vec::new());
        let mut every_round_trip = Vec::new();
        let mut kernel = Vec::new();
        let timed = (|| {
            for i in 0..warm_up + replays {
                for passes in [short, long] {
                    let (_, round_trip) = lane.time_with(Some(passes))?;
                    every_round_trip.push(round_trip);
                    let kernel_ns = self.dispatch_time(lane);
                    if i < warm_up {
                        continue;
                    }
                    if passes == short {
                        round_trips.0.push(round_trip);
                    } else {
                        round_trips.1.push(round_trip);
                        kernel.extend(kernel_ns);
                    }
                }
            }
            Ok::<(), String>(())
        })();
        kreplay::hsa_tool::set_collect_replay_records(false);
        let records = kreplay::hsa_tool::take_replay_records();
        timed?;
        let expected = 2 * (warm_up + replays);
        if records.len() != expected {
            return Err(format!(
                "{} replays went through the replay loop, {expected} were expected",
                records.len()
            ));
        }
        let (mut first, mut later, mut restores) = (Vec::new(), Vec::new(), Vec::new());
        let (mut outside_loop, mut outside_passes) = (Vec::new(), Vec::new());
        for (i, (record, round_trip)) in records.iter().zip(&every_round_trip).enumerate() {
            let passes = if i % 2 == 0 { short } else { long };
            match record.outcome {
                ReplayOutcome::Replayed { passes: ran, .. } if ran == passes => {}
                ref other => {
                    return Err(format!(
                        "a dispatch meant to be replayed in {passes} passes went otherwise: \
                         {other:?}"
                    ));
                }
            }
            let ns = |d: &Duration| d.as_nanos() as f64;
            if i >= 2 * warm_up && passes == short {
                // The same replay's round trip beside kreplay's own record of it.
                let passes_ns: f64 = record.cost.pass_times.iter().map(ns).sum();
                outside_loop.push(round_trip - ns(&record.cost.total));
                outside_passes.push(round_trip - passes_ns);
            }
            if i < 2 * warm_up || passes != long {
                continue;
            }
            first.extend(record.cost.pass_times.first().map(ns));
            later.extend(record.cost.pass_times.iter().skip(1).map(ns));
            restores.extend(record.cost.restore_times.iter().map(ns));
        }
        let mut figures = Figures::new();
        for (name, values) in [
            ("handoff.round_trip_short", &mut round_trips.0),
            ("handoff.round_trip_long", &mut round_trips.1),
            ("handoff.pass_first", &mut first),
            ("handoff.pass_later", &mut later),
            ("handoff.restore", &mut restores),
            ("handoff.kernel", &mut kernel),
            ("handoff.outside_loop", &mut outside_loop),
            ("handoff.outside_passes", &mut outside_passes),
        ] {
            if let Some(stat) = Stat::of(values) {
                figures.insert(name.into(), stat);
            }
        }
        figures.insert("handoff.passes_short".into(), Stat::derived(short as f64));
        figures.insert("handoff.passes_long".into(), Stat::derived(long as f64));
        Ok(figures)
    }

    /// The snapshot and restore of an inventory: coarse-grained allocations are added on the
    /// replayed agent until it has `total` besides the dispatch's own buffer, then replays of
    /// `options.passes` passes are timed with kreplay's cost records on, and every SNAPSHOT
    /// EXIT record is checked to cover all of them. Figures `inventory.<total>.*`.
    fn measure_inventory(
        &mut self,
        total: usize,
        options: &DispatchBenchOptions,
    ) -> Result<Figures, String> {
        let coarse = self
            .app
            .pool(self.gpu, PoolKind::Coarse)
            .map_err(|status| format!("no coarse-grained pool ({status:#x})"))?;
        while self.inventory < total {
            let ptr = self
                .app
                .allocate(coarse, OTHER_ALLOCATION_BYTES)
                .map_err(hsa_error("hsa_amd_memory_pool_allocate"))?;
            self.allocations.push(ptr);
            self.inventory += 1;
        }
        let replays = inventory_replays(total, options.dispatches);
        let lane = self.lane_of(LaneKind::Replayed).ok_or("missing lane")?;
        tool::reset_memory_reports();
        kreplay::hsa_tool::set_collect_replay_records(true);
        let _ = kreplay::hsa_tool::take_replay_records();
        let mut round_trips = Vec::new();
        let timed = (|| {
            for i in 0..INVENTORY_WARM_UP + replays {
                let (_, round_trip) = lane.time_with(Some(options.passes))?;
                if i >= INVENTORY_WARM_UP {
                    round_trips.push(round_trip);
                }
            }
            Ok::<(), String>(())
        })();
        kreplay::hsa_tool::set_collect_replay_records(false);
        let records = kreplay::hsa_tool::take_replay_records();
        timed?;
        let reports = tool::memory_reports();
        let count = INVENTORY_WARM_UP + replays;
        let regions = total as u64 + 1;
        if records.len() != count
            || reports.snapshots != count as u64
            || reports.snapshot_failures != 0
            || reports.regions != Some((regions, regions))
            || reports.restore_failures != 0
        {
            return Err(format!(
                "with {total} coarse-grained allocations added, {} replays ran and the tool saw \
                 {} SNAPSHOT EXIT records ({} declined) covering {:?} regions (fewest, most) and \
                 {} failed restores; {count} snapshots of {regions} regions each were expected",
                records.len(),
                reports.snapshots,
                reports.snapshot_failures,
                reports.regions,
                reports.restore_failures
            ));
        }
        let restores_per_replay = options.passes.saturating_sub(1).max(1) as f64;
        let ns = |d: Duration| d.as_nanos() as f64;
        let mut series: [(&str, Vec<f64>); 5] = [
            ("snapshot", Vec::new()),
            ("restore", Vec::new()),
            ("outside_passes", Vec::new()),
            ("bytes", Vec::new()),
            ("round_trip", round_trips),
        ];
        for record in records.iter().skip(INVENTORY_WARM_UP) {
            let ReplayOutcome::Replayed { passes, .. } = record.outcome else {
                return Err(format!(
                    "a dispatch meant to be replayed was not: {:?}",
                    record.outcome
                ));
            };
            if passes != options.passes {
                return Err(format!(
                    "a replay ran {passes} passes, {} were expected",
                    options.passes
                ));
            }
            let cost = &record.cost;
            series[0].1.push(ns(cost.snapshot));
            series[1]
                .1
                .push(ns(cost.restore_times.iter().sum()) / restores_per_replay);
            series[2].1.push(ns(cost
                .total
                .saturating_sub(cost.pass_times.iter().sum::<Duration>())));
            series[3].1.push(cost.bytes_snapshotted as f64);
        }
        let mut figures = Figures::new();
        for (name, mut values) in series {
            if let Some(stat) = Stat::of(&mut values) {
                figures.insert(format!("inventory.{total}.{name}"), stat);
            }
        }
        for (name, value) in [
            ("regions", regions),
            ("restores_full", reports.restores_full),
            ("restores_hash", reports.restores_hash),
            ("restores_writeset", reports.restores_writeset),
        ] {
            figures.insert(
                format!("inventory.{total}.{name}"),
                Stat::derived(value as f64),
            );
        }
        Ok(figures)
    }

    /// Replayed and opted-out dispatches with kreplay's cost records on: checks that each took
    /// the path it stands for and returns the medians of the loop's own timings.
    fn check_paths(&mut self, count: usize, passes: u64) -> Result<Figures, String> {
        kreplay::hsa_tool::set_collect_replay_records(true);
        let _ = kreplay::hsa_tool::take_replay_records();
        let before = tool::counts();
        let result = (|| {
            for kind in [LaneKind::Replayed, LaneKind::OptedOut] {
                let lane = self.lane_of(kind).ok_or("missing lane")?;
                for _ in 0..count {
                    lane.time_one()?;
                }
            }
            Ok::<(), String>(())
        })();
        kreplay::hsa_tool::set_collect_replay_records(false);
        let records = kreplay::hsa_tool::take_replay_records();
        result?;
        let after = tool::counts();
        let (replayed, opted_out) = records.split_at(records.len().min(count));
        if records.len() != 2 * count {
            return Err(format!(
                "{} dispatches went through the replay loop, {} were expected",
                records.len(),
                2 * count
            ));
        }
        for record in replayed {
            let ReplayOutcome::Replayed { passes: ran, .. } = record.outcome else {
                return Err(format!(
                    "a dispatch meant to be replayed was not: {:?}",
                    record.outcome
                ));
            };
            if ran != passes || record.cost.bytes_snapshotted != BUFFER_BYTES as u64 {
                return Err(format!(
                    "a replayed dispatch ran {ran} passes over a {} byte snapshot; {passes} \
                     passes over {BUFFER_BYTES} bytes were expected",
                    record.cost.bytes_snapshotted
                ));
            }
        }
        if let Some(record) = opted_out.iter().find(|r| {
            !matches!(
                r.outcome,
                ReplayOutcome::RanOnce {
                    why: RanOnceReason::OptedOut
                }
            )
        }) {
            return Err(format!(
                "a dispatch meant to opt out went otherwise: {:?}",
                record.outcome
            ));
        }
        let enters = after.pass_enters - before.pass_enters;
        if enters != count as u64 * passes || after.errors != 0 {
            return Err(format!(
                "the tool saw {enters} PASS ENTERs ({} expected) and {} bad records",
                count as u64 * passes,
                after.errors
            ));
        }
        Ok(loop_figures(replayed, opted_out))
    }

    /// Warm-up rounds, then `rounds` timed rounds, each dispatching once on every lane in turn.
    fn time_lanes(&mut self, rounds: usize) -> Result<Figures, String> {
        let warm_up = warm_up_rounds(rounds);
        let mut kernel = Vec::with_capacity(rounds);
        for round in 0..warm_up + rounds {
            for i in 0..self.lanes.len() {
                let (submit, round_trip) = self.lanes[i].time_one()?;
                if round >= warm_up {
                    self.lanes[i].submit.push(submit);
                    self.lanes[i].round_trip.push(round_trip);
                    if self.lanes[i].kind == LaneKind::Softhsa
                        && let Some(ns) = self.kernel_time()
                    {
                        kernel.push(ns);
                    }
                }
            }
        }
        let mut figures = Figures::new();
        for lane in &mut self.lanes {
            let key = lane.kind.key();
            if let Some(s) = Stat::of(&mut lane.submit) {
                figures.insert(format!("{key}.submit"), s);
            }
            if let Some(s) = Stat::of(&mut lane.round_trip) {
                figures.insert(format!("{key}.round_trip"), s);
            }
        }
        if let Some(s) = Stat::of(&mut kernel) {
            figures.insert("kernel.run".into(), s);
        }
        if let Some(runs) = &self.runs {
            let stuck = runs.stuck.load(Ordering::Relaxed);
            if stuck > 0 {
                return Err(format!(
                    "{stuck} run(s) of the N-runs handler did not complete within {} s",
                    DISPATCH_DEADLINE.as_secs()
                ));
            }
        }
        Ok(figures)
    }
}

/// Replays timed per inventory: fewer for larger ones (each copies the whole inventory), at
/// least 10, at most `dispatches`.
fn inventory_replays(total: usize, dispatches: usize) -> usize {
    (200_000 / total.max(1)).clamp(10, 1000).min(dispatches)
}

/// Untimed rounds before `rounds` timed ones.
fn warm_up_rounds(rounds: usize) -> usize {
    (rounds / 10).clamp(20, 500)
}

fn ticks_per_second(hsa: &Hsa) -> u64 {
    let Some(get_info) = hsa.core().hsa_system_get_info_fn else {
        return 1_000_000_000;
    };
    let mut frequency: u64 = 0;
    // SAFETY: TIMESTAMP_FREQUENCY is a u64 written to a valid out-pointer.
    let status = unsafe {
        get_info(
            HSA_SYSTEM_INFO_TIMESTAMP_FREQUENCY,
            (&raw mut frequency).cast(),
        )
    };
    if status == HSA_STATUS_SUCCESS && frequency > 0 {
        frequency
    } else {
        1_000_000_000
    }
}

/// Medians of the replay loop's own timings (`replay_loop.*`) and of the opted-out dispatches'
/// time in the loop (`opt_out_loop.total`).
fn loop_figures(replayed: &[ReplayRecord], opted_out: &[ReplayRecord]) -> Figures {
    let ns = |d: Duration| d.as_nanos() as f64;
    type Series = (&'static str, fn(&ReplayRecord) -> Duration);
    let series: [Series; 7] = [
        ("replay_loop.total", |r| r.cost.total),
        ("replay_loop.passes", |r| r.cost.pass_times.iter().sum()),
        ("replay_loop.outside_passes", |r| {
            r.cost
                .total
                .saturating_sub(r.cost.pass_times.iter().sum::<Duration>())
        }),
        ("replay_loop.lock_wait", |r| r.cost.lock_wait),
        ("replay_loop.drain", |r| r.cost.drain),
        ("replay_loop.snapshot", |r| r.cost.snapshot),
        ("replay_loop.restores", |r| {
            r.cost.restore_times.iter().sum()
        }),
    ];
    let mut figures = Figures::new();
    for (name, f) in series {
        let mut values: Vec<f64> = replayed.iter().map(|r| ns(f(r))).collect();
        if let Some(s) = Stat::of(&mut values) {
            figures.insert(name.into(), s);
        }
    }
    let mut values: Vec<f64> = opted_out.iter().map(|r| ns(r.cost.total)).collect();
    if let Some(s) = Stat::of(&mut values) {
        figures.insert("opt_out_loop.total".into(), s);
    }
    figures
}

/// Installs kreplay on softhsa in this process and measures what `options.service` asks for.
fn measure(options: &DispatchBenchOptions) -> Result<(Figures, (usize, usize, usize)), String> {
    let handoff_only = options.service == DispatchService::Handoff;
    let replay = options.service == DispatchService::Replay || handoff_only;
    if replay {
        tool::register()?;
    }
    let plain = Hsa::softhsa();
    // A runtime loads tools inside hsa_init, with the runtime up: hold one reference around
    // kreplay's OnLoad .. OnUnload, as the demo does.
    let hold = plain.init().map_err(hsa_error("hsa_init"))?;
    let mut table = OwnedApiTable::softhsa();
    // SAFETY: `table` is a complete, writable copy of softhsa's table that outlives every call
    // made through it (it is dropped after on_unload).
    unsafe { crate::hosted::load_kreplay(table.as_mut_ptr()) }?;
    let result = (|| {
        if let Some(why) = tool::setup_error() {
            return Err(format!("the benchmark tool could not set up: {why}"));
        }
        if replay != kreplay::services::replay_configured() {
            return Err("the replay service is not configured as this measurement needs".into());
        }
        // SAFETY: the copy's sub-tables are valid for as long as `table` lives.
        let app = unsafe { Hsa::from_table(table.table()) };
        let _session = app.init().map_err(hsa_error("hsa_init"))?;
        let mut rig = Rig::new(plain, app, options)?;
        let mut figures = Figures::new();
        if handoff_only {
            figures.extend(rig.measure_handoff(options)?);
            return Ok((figures, rig.tracked));
        }
        let before = tool::counts();
        figures.extend(rig.time_lanes(options.dispatches)?);
        if replay {
            let after = tool::counts();
            let rounds = (options.dispatches + warm_up_rounds(options.dispatches)) as u64;
            let passes = (
                after.config_enters - before.config_enters,
                after.pass_enters - before.pass_enters,
            );
            if passes != (2 * rounds, rounds * options.passes) {
                return Err(format!(
                    "during the timed rounds the tool saw {} CONFIG ENTERs and {} PASS ENTERs; \
                     {} and {} were expected",
                    passes.0,
                    passes.1,
                    2 * rounds,
                    rounds * options.passes
                ));
            }
            figures.extend(rig.measure_own_work(options.dispatches, true)?);
            // After the timed rounds, so that every lane's threads start from the same history.
            let count = options.dispatches.min(1000);
            figures.extend(rig.check_paths(count, options.passes)?);
            figures.extend(rig.measure_handoff(options)?);
            // Last: every replay from here on snapshots the inventory.
            let mut inventories = options.inventories.clone();
            inventories.sort_unstable();
            for total in inventories {
                figures.extend(rig.measure_inventory(total, options)?);
            }
        }
        if !replay {
            figures.extend(rig.measure_own_work(options.dispatches, false)?);
        }
        let tracked = rig.tracked;
        drop(rig);
        Ok((figures, tracked))
    })();
    kreplay::hsa_tool::on_unload();
    drop(table);
    drop(hold);
    result
}

/// Two [`OVERLAP_KERNEL`] kernels written to one queue, and one alone, on a softhsa that
/// overlaps dispatches of a queue: on a queue of softhsa's own table and on a queue of the
/// table kreplay is installed in, with the replay service configured and the tool opting out.
/// Figures `overlap.<queue>.single` and `overlap.<queue>.pair`: wall time until completion.
fn measure_overlap() -> Result<Figures, String> {
    kreplay_softhsa::configure(kreplay_softhsa::SoftHsaConfig {
        overlap_dispatches: true,
        ..Default::default()
    })?;
    tool::register()?;
    tool::set_passes(0);
    let plain = Hsa::softhsa();
    let hold = plain.init().map_err(hsa_error("hsa_init"))?;
    let mut table = OwnedApiTable::softhsa();
    // SAFETY: as in `measure`.
    unsafe { crate::hosted::load_kreplay(table.as_mut_ptr()) }?;
    let result = (|| {
        if let Some(why) = tool::setup_error() {
            return Err(format!("the benchmark tool could not set up: {why}"));
        }
        if !kreplay::services::replay_configured() {
            return Err("the replay service is not configured as this measurement needs".into());
        }
        // SAFETY: the copy's sub-tables are valid for as long as `table` lives.
        let app = unsafe { Hsa::from_table(table.table()) };
        let _session = app.init().map_err(hsa_error("hsa_init"))?;
        let gpu = *app
            .gpu_agents()
            .map_err(hsa_error("hsa_iterate_agents"))?
            .first()
            .ok_or("the software HSA runtime reports no GPU agent")?;
        let kernel = kreplay_softhsa::register_kernel("kreplay_bench_long", long_kernel);
        let mut figures = Figures::new();
        for (hsa, name) in [(plain, "softhsa"), (app, "opted_out")] {
            let (single, pair) = time_overlap(hsa, gpu, kernel)?;
            for (what, mut values) in [("single", single), ("pair", pair)] {
                if let Some(stat) = Stat::of(&mut values) {
                    figures.insert(format!("overlap.{name}.{what}"), stat);
                }
            }
        }
        Ok(figures)
    })();
    kreplay::hsa_tool::on_unload();
    drop(table);
    drop(hold);
    result
}

/// Wall times (ns) of one long kernel alone and of two written at once, on a fresh queue.
fn time_overlap(hsa: Hsa, gpu: hsa_agent_t, kernel: u64) -> Result<(Vec<f64>, Vec<f64>), String> {
    let queue = hsa
        .queue_create(gpu, QUEUE_SIZE)
        .map_err(hsa_error("hsa_queue_create"))?;
    let signals: Vec<hsa_signal_t> = (0..2).filter_map(|_| hsa.signal_create(0).ok()).collect();
    let outcome = (|| {
        let [first, second] = signals[..] else {
            return Err("cannot create the overlap measurement's signals".to_string());
        };
        let packets = [first, second].map(|signal| {
            dispatch_packet(&Dispatch {
                barrier: false,
                ..Dispatch::linear(kernel, 1, 1, std::ptr::null_mut(), signal)
            })
        });
        let wait = |signal| {
            hsa.wait_zero(signal, DISPATCH_DEADLINE)
                .then_some(())
                .ok_or("a long kernel did not complete in time")
        };
        let (mut single, mut pair) = (Vec::new(), Vec::new());
        for _ in 0..OVERLAP_ROUNDS {
            hsa.signal_store(first, 1);
            let start = Instant::now();
            // SAFETY: a live queue of this runtime; a 64-byte dispatch packet without arguments.
            unsafe { hsa.submit(queue, &packets[0]) };
            wait(first)?;
            single.push(start.elapsed().as_nanos() as f64);
            hsa.signal_store(first, 1);
            hsa.signal_store(second, 1);
            let start = Instant::now();
            // SAFETY: as above; two packets, written one after the other, no barrier bit.
            unsafe {
                hsa.submit(queue, &packets[0]);
                hsa.submit(queue, &packets[1]);
            }
            wait(first)?;
            wait(second)?;
            pair.push(start.elapsed().as_nanos() as f64);
        }
        Ok((single, pair))
    })();
    // SAFETY: the queue was created above; every dispatch on it was waited for.
    let _ = unsafe { hsa.queue_destroy(queue) };
    for signal in signals {
        let _ = hsa.signal_destroy(signal);
    }
    outcome
}

/// The overlap section of the report.
fn render_overlap(figures: &Figures, child: bool) -> String {
    let median = |name: &str| figures.get(name).map(|s| s.median);
    let mut text = format!(
        "\ntwo {} ms kernels written to one queue (no barrier bit){}, on a softhsa that overlaps \
         dispatches of a queue as AQL allows (wall time until both completed; one kernel alone \
         for comparison):\n",
        OVERLAP_KERNEL.as_millis(),
        if child { " in a child process" } else { "" }
    );
    for (key, label) in [
        ("softhsa", "softhsa queue (no kreplay)"),
        (
            "opted_out",
            "kreplay queue, replay service configured, tool opts out",
        ),
    ] {
        if let (Some(single), Some(pair)) = (
            median(&format!("overlap.{key}.single")),
            median(&format!("overlap.{key}.pair")),
        ) {
            text += &format!(
                "  {label}: one alone {}, two {} ({:.2}x the time of one: 1 overlaps fully, \
                 2 runs them one after the other)\n",
                ms(single),
                ms(pair),
                pair / single
            );
        }
    }
    text
}

/// The per-pass hand-off section: one block per (figure prefix, where it was measured).
fn render_handoff(
    figures: &Figures,
    targets: &[(&'static str, bool)],
    runs: &[(&str, &str)],
) -> String {
    let mut text = String::new();
    for &(prefix, label) in runs {
        let get = |name: &str| figures.get(&format!("{prefix}handoff.{name}")).copied();
        let median = |name: &str| get(name).map_or(f64::NAN, |s| s.median);
        let Some(later) = get("pass_later") else {
            continue;
        };
        if text.is_empty() {
            text += &format!(
                "\nper-pass hand-off: replays of {long} passes alternating with replays of \
                 {short}, kreplay's cost records on ({} of each timed, after {HANDOFF_WARM_UP} \
                 untimed); a pass as kreplay's loop times it runs from submitting the pass's \
                 packet (the writer: softhsa's hardware queue and its doorbell) until the wait on \
                 the pass's completion signal returns, so it holds the packet processor's \
                 pick-up, the kernel, the completion and the waiting thread's wake-up:\n",
                get("round_trip_long").map_or(0, |s| s.samples),
                long = median("passes_long"),
                short = median("passes_short"),
            );
        }
        let target = if prefix.is_empty() {
            "handoff_overhead"
        } else {
            "handoff_overhead_pinned"
        };
        let verdict_text = targets
            .iter()
            .find(|(n, _)| *n == target)
            .map_or(String::new(), |(_, met)| {
                format!("   target <= {}: {}", us(HANDOFF_TARGET_NS), verdict(*met))
            });
        text += &format!(
            "  {label}:\n    passes after the first: median {} (p10 {}, p90 {}, {} passes); \
             the first pass {}\n    kernel (softhsa's timestamps of pass 0, carried to the \
             application's signal): {}\n    overhead per pass beyond the kernel: {}{verdict_text}\n\
             \x20   cross-check, per pass from round trips ((round trip of {} passes {} - of \
             {} passes {}) / {}): {} (adds the restore between passes, {} each, and the PASS \
             and RESTORE callbacks)\n    fixed cost of a replayed dispatch outside its passes \
             (each {}-pass replay's round trip minus its passes as kreplay timed them, median): \
             {}, of which outside kreplay's loop (round trip minus the loop's own total: \
             submit, the handler around the loop, completion wait) {}\n",
            us(later.median),
            us(later.p10),
            us(later.p90),
            later.samples,
            us(median("pass_first")),
            us(median("kernel")),
            us(median("overhead")),
            median("passes_long"),
            us(median("round_trip_long")),
            median("passes_short"),
            us(median("round_trip_short")),
            median("passes_long") - median("passes_short"),
            us(median("slope")),
            us(median("restore")),
            median("passes_short"),
            us(median("outside_passes")),
            us(median("outside_loop")),
        );
    }
    text
}

/// The inventory section: what a snapshot and a restore cost per region.
fn render_inventories(options: &DispatchBenchOptions, figures: &Figures) -> String {
    let median = |name: &str| figures.get(name).map_or(f64::NAN, |s| s.median);
    let mut totals: Vec<usize> = options.inventories.clone();
    totals.sort_unstable();
    totals.retain(|t| figures.contains_key(&format!("inventory.{t}.regions")));
    if totals.is_empty() {
        return String::new();
    }
    let mut text = format!(
        "\nsnapshot and restore of a real inventory: coarse-grained {} allocations added on the \
         replayed agent, each in the snapshot (every SNAPSHOT EXIT record's region count was \
         checked: the allocations plus the dispatch's buffer); replays of {} passes, kreplay's \
         cost records (snapshot: planning over the inventory and copying into the store; \
         restore: planning and writing back, per restore; outside the passes: the whole \
         dispatch in the loop minus its passes), medians:\n",
        format_bytes(OTHER_ALLOCATION_BYTES as u64),
        options.passes
    );
    let mut table = Table::new(&[
        ("regions", Align::Right),
        ("snapshotted", Align::Right),
        ("replays", Align::Right),
        ("snapshot", Align::Right),
        ("per region", Align::Right),
        ("restore", Align::Right),
        ("per region", Align::Right),
        ("restores (full/hash/writeset)", Align::Right),
        ("outside the passes", Align::Right),
        ("round trip", Align::Right),
    ]);
    for total in totals {
        let key = |name: &str| format!("inventory.{total}.{name}");
        let count = |name: &str| median(&key(name)) as u64;
        table.row(vec![
            format!("{}", count("regions")),
            format_bytes(median(&key("bytes")) as u64),
            format!("{}", figures.get(&key("snapshot")).map_or(0, |s| s.samples)),
            us(median(&key("snapshot"))),
            us(median(&key("snapshot_per_region"))),
            us(median(&key("restore"))),
            us(median(&key("restore_per_region"))),
            format!(
                "{}/{}/{}",
                count("restores_full"),
                count("restores_hash"),
                count("restores_writeset")
            ),
            us(median(&key("outside_passes"))),
            us(median(&key("round_trip"))),
        ]);
    }
    text += &table.render();
    text += &format!(
        "  (the lanes above: 1 region, the dispatch's {} buffer, with the other tracked \
         allocations outside the snapshot: outside the passes {})\n",
        format_bytes(BUFFER_BYTES as u64),
        us(median("replay_loop.outside_passes"))
    );
    text
}

fn ms(ns: f64) -> String {
    format!("{:.2} ms", ns / 1e6)
}

/// Runs `kreplay bench-dispatch --service <service>` (`none`, `overlap` or `handoff`) in a
/// child process, on one CPU with `pin`, and reads its figures.
fn measure_in_child(
    options: &DispatchBenchOptions,
    service: &str,
    pin: bool,
) -> Result<Figures, String> {
    let exe = std::env::current_exe()
        .map_err(|e| format!("cannot find the kreplay executable to start a child: {e}"))?;
    let csv =
        std::env::temp_dir().join(format!("kreplay-bench-dispatch-{}.csv", std::process::id()));
    let output = std::process::Command::new(&exe)
        .arg("bench-dispatch")
        .args(["--service", service])
        .args(["--allocations", &options.allocations.to_string()])
        .args(["--dispatches", &options.dispatches.to_string()])
        .args(["--passes", &options.passes.to_string()])
        .args(["--inventory", "none"])
        .args(pin.then_some("--pin"))
        .arg("--csv")
        .arg(&csv)
        .output()
        .map_err(|e| format!("cannot start {}: {e}", exe.display()))?;
    let text = std::fs::read_to_string(&csv);
    let _ = std::fs::remove_file(&csv);
    if !output.status.success() {
        return Err(format!(
            "the child process measuring '--service {service}' failed ({}): {}",
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        ));
    }
    let text = text.map_err(|e| format!("cannot read the child's figures: {e}"))?;
    parse_csv(&text)
}

/// One line of the CSV `--csv` writes (and the child process hands back): one figure. Its
/// field names are the header; an empty number is a statistic that does not apply (`NaN`).
#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct FigureRecord {
    measurement: String,
    median_ns: Option<f64>,
    p10_ns: Option<f64>,
    p90_ns: Option<f64>,
    samples: usize,
}

/// The CSV [`write_csv`] writes, read back.
fn parse_csv(text: &str) -> Result<Figures, String> {
    let mut reader = csv::Reader::from_reader(text.as_bytes());
    let header = reader
        .headers()
        .map_err(|e| format!("cannot read the child's figures: {e}"))?;
    if !header.iter().eq(CSV_HEADER_FIELDS) {
        return Err("the child's figures lack the CSV header".into());
    }
    let mut figures = Figures::new();
    for record in reader.deserialize::<FigureRecord>() {
        let record = record.map_err(|e| format!("bad line in the child's figures: {e}"))?;
        let number = |v: Option<f64>| v.unwrap_or(f64::NAN);
        figures.insert(
            record.measurement,
            Stat {
                median: number(record.median_ns),
                p10: number(record.p10_ns),
                p90: number(record.p90_ns),
                samples: record.samples,
            },
        );
    }
    Ok(figures)
}

/// The fields of [`FigureRecord`], the header of the CSV `--csv` writes.
const CSV_HEADER_FIELDS: [&str; 5] = ["measurement", "median_ns", "p10_ns", "p90_ns", "samples"];

fn write_csv(figures: &Figures, path: &Path) -> Result<(), String> {
    // Nanoseconds to a tenth; NaN (a statistic that does not apply) is an empty field.
    let cell = |v: f64| (!v.is_nan()).then(|| (v * 10.0).round() / 10.0);
    let mut writer = csv::Writer::from_writer(Vec::new());
    if figures.is_empty() {
        writer
            .write_record(CSV_HEADER_FIELDS)
            .map_err(|e| e.to_string())?;
    }
    for (name, s) in figures {
        writer
            .serialize(FigureRecord {
                measurement: name.clone(),
                median_ns: cell(s.median),
                p10_ns: cell(s.p10),
                p90_ns: cell(s.p90),
                samples: s.samples,
            })
            .map_err(|e| format!("cannot write the figures as CSV: {e}"))?;
    }
    let text = writer.into_inner().map_err(|e| e.to_string())?;
    crate::output::write_whole(path, &text)
}

/// What [`run`] measured.
#[derive(Clone, Debug, PartialEq)]
pub struct DispatchBenchOutcome {
    /// Every figure, in nanoseconds (those of the child process prefixed `none.`).
    pub figures: Figures,
    /// Target verdicts: (name, met).
    pub targets: Vec<(&'static str, bool)>,
}

/// Runs `kreplay bench-dispatch`, printing the report to `out`. kreplay installs into one HSA
/// table per process, so this runs once per process (and not after `kreplay demo`).
pub fn run(
    options: &DispatchBenchOptions,
    out: &mut dyn Write,
) -> Result<DispatchBenchOutcome, String> {
    if RAN.swap(true, Ordering::SeqCst) {
        return Err(
            "kreplay bench-dispatch already ran in this process (kreplay installs into \
                    one HSA table per process)"
                .into(),
        );
    }
    super::checked_settings()?;
    if matches!(
        options.service,
        DispatchService::Replay | DispatchService::Handoff
    ) {
        // The hand-off alternates replays of --passes and of HANDOFF_PASSES (or one more than
        // --passes) passes.
        let most = HANDOFF_PASSES.max(options.passes + 1);
        crate::hosted::check_pass_cap(
            most,
            &format!(
                "the replays measured (--passes {}, and the hand-off's {most}) need",
                options.passes
            ),
            &format!("raise the cap to {most} or more"),
        )?;
    }
    if options.pin {
        pin_to_one_cpu()?;
    }
    let mut figures = Figures::new();
    if options.service == DispatchService::Overlap {
        figures = measure_overlap()?;
        let report = render_overlap(&figures, false);
        out.write_all(report.as_bytes())
            .and_then(|()| out.flush())
            .map_err(|e| format!("cannot write the report: {e}"))?;
        if let Some(path) = &options.csv {
            write_csv(&figures, path)?;
            say_wrote(out, path, &figures)?;
        }
        return Ok(DispatchBenchOutcome {
            figures,
            targets: Vec::new(),
        });
    }
    if options.service == DispatchService::Replay {
        // The children report as `--service none` and `--service overlap` runs: their figures
        // are already `none.*` and `overlap.*`.
        for (service, prefix) in [("none", "none."), ("overlap", "overlap.")] {
            for (name, stat) in measure_in_child(options, service, false)? {
                if name.starts_with(prefix) {
                    figures.insert(name, stat);
                }
            }
        }
        // The hand-off again with every thread on one CPU, where a wake-up is a context switch.
        for (name, stat) in measure_in_child(options, "handoff", true)? {
            if name.starts_with("pinned.handoff.") {
                figures.insert(name, stat);
            }
        }
    }
    let (measured, tracked) = measure(options)?;
    let prefix = match options.service {
        DispatchService::None => "none.",
        DispatchService::Handoff if options.pin => "pinned.",
        _ => "",
    };
    for (name, stat) in measured {
        figures.insert(format!("{prefix}{name}"), stat);
    }
    let targets = derive(options, &mut figures);
    let report = render(options, &figures, tracked, &targets);
    out.write_all(report.as_bytes())
        .and_then(|()| out.flush())
        .map_err(|e| format!("cannot write the report: {e}"))?;
    if let Some(path) = &options.csv {
        write_csv(&figures, path)?;
        say_wrote(out, path, &figures)?;
    }
    Ok(DispatchBenchOutcome { figures, targets })
}

fn say_wrote(out: &mut dyn Write, path: &Path, figures: &Figures) -> Result<(), String> {
    writeln!(out, "wrote {} ({} figures)", path.display(), figures.len())
        .and_then(|()| out.flush())
        .map_err(|e| format!("cannot write the report: {e}"))
}

/// Adds the `derived.*` figures and returns the target verdicts.
fn derive(options: &DispatchBenchOptions, figures: &mut Figures) -> Vec<(&'static str, bool)> {
    let median = |figures: &Figures, name: &str| figures.get(name).map(|s| s.median);
    let mut derived: Vec<(&'static str, f64)> = Vec::new();
    let mut targets = Vec::new();
    let n = options.passes as f64;
    if let (Some(replayed), Some(base)) = (
        median(figures, "replayed.round_trip"),
        median(figures, "softhsa.round_trip"),
    ) {
        let fixed = replayed - n * base;
        derived.push(("derived.a_replay_fixed_cost", fixed));
        targets.push(("a_replay_fixed_cost", fixed < REPLAY_TARGET_NS));
    }
    if let (Some(replayed), Some(runs)) = (
        median(figures, "replayed.round_trip"),
        median(figures, "runs.round_trip"),
    ) {
        let fixed = replayed - runs;
        derived.push(("derived.a_replay_fixed_cost_vs_runs", fixed));
        targets.push(("a_replay_fixed_cost_vs_runs", fixed < REPLAY_TARGET_NS));
    }
    for (prefix, lane, name, total) in [
        (
            "",
            "opted_out",
            "derived.b_opt_out_handler",
            "derived.b_opt_out_total",
        ),
        (
            "none.",
            "no_service",
            "derived.c_no_service_handler",
            "derived.c_no_service_total",
        ),
    ] {
        if let (Some(submit), Some(intercept)) = (
            median(figures, &format!("{prefix}{lane}.submit")),
            median(figures, &format!("{prefix}intercept.submit")),
        ) {
            // Shown beside the paired figure, not judged: see `OWN_WORK_WHY`.
            derived.push((name, submit - intercept));
        }
        if let (Some(rt), Some(base)) = (
            median(figures, &format!("{prefix}{lane}.round_trip")),
            median(figures, &format!("{prefix}softhsa.round_trip")),
        ) {
            derived.push((total, rt - base));
        }
    }
    for (own, target) in [
        ("own.opted_out_minus_intercept", "b_opt_out_own"),
        ("none.own.no_service_minus_intercept", "c_no_service_own"),
    ] {
        if let Some(own) = median(figures, own) {
            targets.push((target, own < ORDINARY_TARGET_NS));
        }
    }
    for prefix in ["", "none."] {
        if let (Some(intercept), Some(base)) = (
            median(figures, &format!("{prefix}intercept.submit")),
            median(figures, &format!("{prefix}softhsa.submit")),
        ) {
            let name = if prefix.is_empty() {
                "derived.interception"
            } else {
                "derived.none_interception"
            };
            derived.push((name, intercept - base));
        }
    }
    let mut more: Vec<(String, f64)> = Vec::new();
    for (prefix, target) in [
        ("", "handoff_overhead"),
        ("pinned.", "handoff_overhead_pinned"),
    ] {
        let get = |name: &str| median(figures, &format!("{prefix}handoff.{name}"));
        if let (Some(later), Some(kernel)) = (get("pass_later"), get("kernel")) {
            let overhead = later - kernel;
            more.push((format!("{prefix}handoff.overhead"), overhead));
            targets.push((target, overhead <= HANDOFF_TARGET_NS));
        }
        if let (Some(short), Some(long), Some(n_short), Some(n_long)) = (
            get("round_trip_short"),
            get("round_trip_long"),
            get("passes_short"),
            get("passes_long"),
        ) && n_long > n_short
        {
            more.push((
                format!("{prefix}handoff.slope"),
                (long - short) / (n_long - n_short),
            ));
        }
    }
    let inventories: Vec<String> = figures
        .keys()
        .filter_map(|k| k.strip_prefix("inventory.")?.strip_suffix(".regions"))
        .map(str::to_string)
        .collect();
    for total in inventories {
        let get = |name: &str| median(figures, &format!("inventory.{total}.{name}"));
        let Some(regions) = get("regions") else {
            continue;
        };
        for what in ["snapshot", "restore"] {
            if let Some(time) = get(what) {
                more.push((
                    format!("inventory.{total}.{what}_per_region"),
                    time / regions,
                ));
            }
        }
    }
    for (name, value) in more {
        figures.insert(name, Stat::derived(value));
    }
    for (name, value) in derived {
        figures.insert(name.to_string(), Stat::derived(value));
    }
    targets
}

fn us(ns: f64) -> String {
    if ns.is_nan() {
        "-".into()
    } else {
        format!("{:.2} µs", ns / 1e3)
    }
}

fn verdict(met: bool) -> &'static str {
    if met { "met" } else { "NOT MET" }
}

fn render(
    options: &DispatchBenchOptions,
    figures: &Figures,
    tracked: (usize, usize, usize),
    targets: &[(&'static str, bool)],
) -> String {
    let get = |name: &str| figures.get(name).copied();
    let median = |name: &str| get(name).map_or(f64::NAN, |s| s.median);
    let met = |name: &str| targets.iter().find(|(n, _)| *n == name).map(|t| t.1);
    let cpus = super::cpus();
    let replay = options.service == DispatchService::Replay;
    let passes = options.passes;
    if options.service == DispatchService::Handoff {
        let prefix = if options.pin { "pinned." } else { "" };
        let mut text = format!(
            "kreplay bench-dispatch --service handoff: the per-pass hand-off on the software HSA \
             runtime ({cpus}{})\n",
            if options.pin { ", pinned" } else { "" }
        );
        text += &render_handoff(figures, targets, &[(prefix, "this process")]);
        return text;
    }
    let mut text = format!(
        "kreplay bench-dispatch: fixed cost per dispatch on the software HSA runtime ({cpus})\n\
         empty kernel (1 work-item), one dispatch at a time, {} timed dispatches per lane \
         (round-robin, after a warm-up)\n\
         tracked allocations: the dispatch's {} coarse-grained buffer + {} others ({} fine-grained \
         on its agent, {} kernarg, {} on another agent)\n\n",
        options.dispatches,
        format_bytes(BUFFER_BYTES as u64),
        tracked.0 + tracked.1 + tracked.2,
        tracked.0,
        tracked.1,
        tracked.2,
    );
    let mut table = Table::new(&[
        ("lane", Align::Left),
        ("process", Align::Left),
        ("submit median", Align::Right),
        ("p10", Align::Right),
        ("p90", Align::Right),
        ("round trip median", Align::Right),
        ("p10", Align::Right),
        ("p90", Align::Right),
    ]);
    let runs_label = format!("intercept queue, runs it {passes}x");
    let lanes: [(&str, &str); 8] = [
        ("softhsa", "softhsa queue (baseline)"),
        ("intercept", "intercept queue, pass-through"),
        ("runs", &runs_label),
        ("replayed", "kreplay queue, replayed"),
        ("opted_out", "kreplay queue, tool opts out"),
        ("none.softhsa", "softhsa queue (baseline)"),
        ("none.intercept", "intercept queue, pass-through"),
        ("none.no_service", "kreplay queue, no service"),
    ];
    for (key, label) in lanes {
        let (Some(submit), Some(rt)) = (
            get(&format!("{key}.submit")),
            get(&format!("{key}.round_trip")),
        ) else {
            continue;
        };
        let label = if key == "replayed" {
            format!("{label} ({passes} passes)")
        } else {
            label.to_string()
        };
        let process = if replay && key.starts_with("none.") {
            "child, no replay service".to_string()
        } else if key.starts_with("none.") {
            "this, no replay service".to_string()
        } else {
            "this, replay service".to_string()
        };
        table.row(vec![
            label,
            process,
            us(submit.median),
            us(submit.p10),
            us(submit.p90),
            us(rt.median),
            us(rt.p10),
            us(rt.p90),
        ]);
    }
    text += &table.render();
    text += "\nsubmit: writing the packet and ringing the doorbell, until the doorbell store \
             returns; on an intercept queue the handlers run inside that store, so for a \
             replayed dispatch it holds the whole replay.\n\
             round trip: from the start of submit until a blocking wait sees the completion \
             signal at 0. It includes waking softhsa's packet processor thread and the waiting \
             thread: on a virtual machine a wake-up across vCPUs can cost tens of µs, and which \
             lanes pay it depends on where the scheduler placed their threads ('taskset -c 0 \
             kreplay bench-dispatch' keeps every thread on one CPU and takes that out).\n";
    for key in ["kernel.run", "none.kernel.run"] {
        if let Some(s) = get(key) {
            text += &format!(
                "kernel run time (packet processor timestamps, softhsa queue{}): median {}, \
                 p10 {}, p90 {}\n",
                if key.starts_with("none.") && replay {
                    ", child"
                } else {
                    ""
                },
                us(s.median),
                us(s.p10),
                us(s.p90)
            );
        }
    }

    if replay {
        text += &render_overlap(figures, true);
    }

    if replay {
        text += &render_handoff(
            figures,
            targets,
            &[
                ("", &format!("this process, {cpus}, not pinned")),
                (
                    "pinned.",
                    "child process pinned to one CPU (sched_setaffinity)",
                ),
            ],
        );
        text += &render_inventories(options, figures);
    }

    if replay {
        let loop_total = get("replay_loop.total");
        text += &format!(
            "\nkreplay's own cost records ({} replayed and {} opted-out dispatches, medians):\n",
            loop_total.map_or(0, |s| s.samples),
            get("opt_out_loop.total").map_or(0, |s| s.samples)
        );
        text += &format!(
            "  replayed: in the loop {}, of which passes {} and outside the passes {} (lock wait \
             {}, drain {}, snapshot {}, restores {}, callbacks and the rest {})\n",
            us(median("replay_loop.total")),
            us(median("replay_loop.passes")),
            us(median("replay_loop.outside_passes")),
            us(median("replay_loop.lock_wait")),
            us(median("replay_loop.drain")),
            us(median("replay_loop.snapshot")),
            us(median("replay_loop.restores")),
            us(median("replay_loop.outside_passes")
                - median("replay_loop.lock_wait")
                - median("replay_loop.drain")
                - median("replay_loop.snapshot")
                - median("replay_loop.restores")),
        );
        text += &format!(
            "  opted out: in the loop {} (CONFIG ENTER/EXIT callbacks, then the dispatch is \
             forwarded)\n",
            us(median("opt_out_loop.total"))
        );
    }

    text += "\nfixed cost per dispatch ((a) differences of medians; (b) and (c) paired differences of the handler's own work, the lanes' difference of medians beside them):\n";
    let line = |text: &mut String, label: &str, value: f64, target: Option<(f64, bool)>| {
        *text += &format!("  {label} = {}", us(value));
        if let Some((limit, met)) = target {
            *text += &format!("   target < {}: {}", us(limit), verdict(met));
        }
        text.push('\n');
    };
    if replay {
        let fixed = median("derived.a_replay_fixed_cost");
        line(
            &mut text,
            &format!(
                "(a) replayed, {passes} passes: round trip {} - {passes}-runs handler round trip {}",
                us(median("replayed.round_trip")),
                us(median("runs.round_trip"))
            ),
            median("derived.a_replay_fixed_cost_vs_runs"),
            met("a_replay_fixed_cost_vs_runs").map(|m| (REPLAY_TARGET_NS, m)),
        );
        text += &format!(
            "      includes: kreplay's handler and pass loop, the tool's CONFIG, PASS, SNAPSHOT \
             and RESTORE callbacks, the agent's writer lock, the drain of the dispatch's queue \
             and {} idle sibling queue(s) on the agent, the inventory walk over {} tracked \
             allocations, the {} snapshot and {} restore(s); not the {passes} runs of the \
             kernel, which the {passes}-runs handler (an intercept handler that submits the \
             dispatch {passes} times and waits for each, then completes the application's \
             signal) pays as well\n",
            IDLE_SIBLINGS,
            tracked.0 + tracked.1 + tracked.2 + 1,
            format_bytes(BUFFER_BYTES as u64),
            passes - 1
        );
        line(
            &mut text,
            &format!(
                "    the same against {passes} x baseline round trip {}",
                us(median("softhsa.round_trip"))
            ),
            fixed,
            met("a_replay_fixed_cost").map(|m| (REPLAY_TARGET_NS, m)),
        );
        text += &format!(
            "      also includes the difference between a run waited for inside a handler and \
             an ordinary dispatch waited for by the application ({passes}-runs handler - \
             {passes} x baseline = {})\n",
            us(median("runs.round_trip") - passes as f64 * median("softhsa.round_trip"))
        );
        own_work_lines(
            &mut text,
            figures,
            "(b) opted out, kreplay's handler",
            "own.opted_out",
            "opt-out",
            met("b_opt_out_own"),
        );
        line(
            &mut text,
            "    for comparison, not judged: opt-out submit - intercept submit (medians of the lanes above)",
            median("derived.b_opt_out_handler"),
            None,
        );
        line(
            &mut text,
            "    with softhsa's interception: opt-out round trip - baseline round trip",
            median("derived.b_opt_out_total"),
            None,
        );
        text += "      includes: the replay-service check, the dispatch's info, the tool's \
                 CONFIG ENTER (pass-count callback left NULL) and CONFIG EXIT callbacks, the \
                 agent's reader lock and marking the queue as having work a later replay \
                 drains; the dispatch is forwarded alone\n";
    }
    own_work_lines(
        &mut text,
        figures,
        if replay {
            "(c) no replay service, kreplay's handler (child process)"
        } else {
            "(c) no replay service, kreplay's handler"
        },
        "none.own.no_service",
        "no-service",
        met("c_no_service_own"),
    );
    line(
        &mut text,
        "    for comparison, not judged: submit - intercept submit (medians of the lanes above)",
        median("derived.c_no_service_handler"),
        None,
    );
    line(
        &mut text,
        "    with softhsa's interception: round trip - baseline round trip",
        median("derived.c_no_service_total"),
        None,
    );
    text += "      includes: one relaxed load of the replay-service flag (and of the dispatch \
             tracing flag), then the packets are forwarded unchanged\n";
    let interception = if replay {
        median("derived.interception")
    } else {
        median("derived.none_interception")
    };
    text += &format!(
        "softhsa's interception machinery alone (intercept submit - baseline submit): {} — paid \
         by any tool that intercepts queues, not kreplay's code\n",
        us(interception)
    );
    text
}

/// Why (b) and (c) are judged by the paired figure of the handler's own work.
const OWN_WORK_WHY: &str = "judged by the median of paired differences of the handler's own \
    work (submit minus the time spent below the handler in softhsa's hardware queue, measured \
    by a probe around softhsa's writes into the hardware queue), one kreplay and one \
    pass-through dispatch per round, in alternating order: the difference of the lanes' submit medians also holds the \
    hardware queue's doorbell and the wake-up of its packet processor, which both lanes pay \
    alike but which vary by microseconds from one dispatch to the next, so it does not \
    resolve a microsecond";

/// The lines of (b) or (c): the paired figure of `own` (`<own>_minus_intercept`), the target
/// it is judged by, and what each side measured.
fn own_work_lines(
    text: &mut String,
    figures: &Figures,
    label: &str,
    own: &str,
    lane: &str,
    met: Option<bool>,
) {
    let Some(paired) = figures.get(&format!("{own}_minus_intercept")) else {
        *text += &format!("  {label}: no paired measurement\n");
        return;
    };
    let intercept = own
        .replace(".no_service", ".intercept")
        .replace(".opted_out", ".intercept");
    let side = |name: &str| figures.get(name).map_or(f64::NAN, |s| s.median);
    *text += &format!(
        "  {label}: own work, {lane} - pass-through, paired per round = {} (p10 {}, p90 {}, {} \
         rounds)",
        us(paired.median),
        us(paired.p10),
        us(paired.p90),
        paired.samples
    );
    if let Some(met) = met {
        *text += &format!("   target < {}: {}", us(ORDINARY_TARGET_NS), verdict(met));
    }
    *text += &format!(
        "\n      own work medians: {lane} handler {}, pass-through handler {} (each with \
         softhsa's interception machinery); {OWN_WORK_WHY}\n",
        us(side(own)),
        us(side(&intercept)),
    );
}

/// Restricts this process (every thread it starts from now on) to the first CPU its affinity
/// mask allows, as `taskset -c` does.
fn pin_to_one_cpu() -> Result<(), String> {
    // SAFETY: a cpu_set_t is plain data; all zeros is an empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    let size = std::mem::size_of::<libc::cpu_set_t>();
    // SAFETY: pid 0 is this thread; `set` is a valid cpu_set_t of `size` bytes.
    if unsafe { libc::sched_getaffinity(0, size, &mut set) } != 0 {
        return Err(format!(
            "cannot read this process's CPU affinity: {}",
            std::io::Error::last_os_error()
        ));
    }
    let cpus = (0..libc::CPU_SETSIZE as usize)
        // SAFETY: `set` is initialized and the index is below CPU_SETSIZE.
        .find(|&cpu| unsafe { libc::CPU_ISSET(cpu, &set) })
        .ok_or("this process may run on no CPU")?;
    // SAFETY: as above.
    let mut one: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: the index is below CPU_SETSIZE.
    unsafe { libc::CPU_SET(cpus, &mut one) };
    // SAFETY: pid 0 is this thread (the main thread, before any other is started); `one` is a
    // valid cpu_set_t of `size` bytes.
    if unsafe { libc::sched_setaffinity(0, size, &one) } != 0 {
        return Err(format!(
            "cannot pin this process to CPU {cpus}: {}",
            std::io::Error::last_os_error()
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medians_and_percentiles_interpolate_between_samples() {
        let mut values: Vec<f64> = (1..=11).rev().map(f64::from).collect();
        let s = Stat::of(&mut values).unwrap();
        assert_eq!((s.median, s.p10, s.p90, s.samples), (6.0, 2.0, 10.0, 11));
        let mut two = vec![4.0, 2.0];
        assert_eq!(Stat::of(&mut two).unwrap().median, 3.0);
        assert!(Stat::of(&mut []).is_none());
    }

    #[test]
    fn figures_survive_the_csv_round_trip() {
        let mut figures = Figures::new();
        figures.insert(
            "softhsa.submit".into(),
            Stat {
                median: 1500.0,
                p10: 1000.0,
                p90: 2500.5,
                samples: 10,
            },
        );
        figures.insert("derived.x".into(), Stat::derived(-12.5));
        let path = std::env::temp_dir().join(format!("kreplay-cli-csv-{}", std::process::id()));
        write_csv(&figures, &path).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        let _ = std::fs::remove_file(&path);
        assert!(text.starts_with("measurement,median_ns,p10_ns,p90_ns,samples\n"));
        let back = parse_csv(&text).unwrap();
        assert_eq!(back["softhsa.submit"], figures["softhsa.submit"]);
        assert_eq!(back["derived.x"].median, -12.5);
        assert!(back["derived.x"].p10.is_nan());
        assert!(parse_csv("nonsense").is_err());
    }

    #[test]
    fn derived_figures_subtract_the_baselines_and_judge_the_targets() {
        let stat = |median| Stat {
            median,
            p10: median,
            p90: median,
            samples: 1,
        };
        let mut figures = Figures::new();
        for (name, v) in [
            ("softhsa.submit", 2_000.0),
            ("softhsa.round_trip", 30_000.0),
            ("intercept.submit", 3_000.0),
            ("replayed.round_trip", 150_000.0),
            ("opted_out.submit", 5_500.0),
            ("opted_out.round_trip", 36_000.0),
            ("none.softhsa.round_trip", 29_000.0),
            ("none.softhsa.submit", 2_000.0),
            ("none.intercept.submit", 3_100.0),
            ("none.no_service.submit", 3_400.0),
            ("none.no_service.round_trip", 31_000.0),
            ("own.opted_out_minus_intercept", 1_200.0),
            ("none.own.no_service_minus_intercept", 150.0),
        ] {
            figures.insert(name.into(), stat(v));
        }
        let targets = derive(&DispatchBenchOptions::default(), &mut figures);
        assert_eq!(figures["derived.a_replay_fixed_cost"].median, 90_000.0);
        assert_eq!(figures["derived.b_opt_out_handler"].median, 2_500.0);
        assert_eq!(figures["derived.b_opt_out_total"].median, 6_000.0);
        assert_eq!(figures["derived.c_no_service_handler"].median, 300.0);
        assert_eq!(figures["derived.c_no_service_total"].median, 2_000.0);
        assert_eq!(figures["derived.interception"].median, 1_000.0);
        assert_eq!(
            targets,
            vec![
                ("a_replay_fixed_cost", true),
                ("b_opt_out_own", false),
                ("c_no_service_own", true),
            ]
        );
    }
}
