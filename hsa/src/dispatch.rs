//! The queue handler: every packet an application writes to an intercepted queue comes here.
//!
//! A single kernel dispatch with a replay service configured goes through the pass loop with
//! [`HsaReplay`] as its device; everything else is forwarded unchanged (tracked for drains, and
//! under the agent's reader lock while a replay service is configured).

use std::cell::Cell;
use std::ffi::c_void;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::time::Instant;

use hsa_sys::*;
use kreplay_drain::{PassCompletion, QueueView};
use kreplay_locks::WriteGuard;
use kreplay_passloop::{
    Decline, DeclineReason, DispatchInfo, MemoryOpReport, ReplayDevice, RestoreFailure,
    RestoreRequest, RestoreStrategy, StoreTier,
};
use kreplay_snapshot::{Filter, Snapshot, SnapshotError, SnapshotPlan};

use crate::backend::{Backend, backend};
use crate::queues::{QueueIdle, QueueState};
use crate::{DispatchRecord, ToolHooks};

type Writer = unsafe extern "C" fn(*const c_void, u64);

/// One 64-byte AQL packet.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Packet([u8; AQL]);
const AQL: usize = hsa_sys::AQL_PACKET_SIZE;

impl Packet {
    fn packet_type(&self) -> u32 {
        u32::from(u16::from_ne_bytes([self.0[0], self.0[1]])) & 0xff
    }

    fn as_dispatch(&self) -> Option<hsa_kernel_dispatch_packet_t> {
        (self.packet_type() == HSA_PACKET_TYPE_KERNEL_DISPATCH).then(|| {
            // SAFETY: both are 64-byte plain-data layouts; every bit pattern is a valid packet.
            unsafe { std::mem::transmute::<[u8; AQL], hsa_kernel_dispatch_packet_t>(self.0) }
        })
    }
}

fn dispatch_bytes(p: &hsa_kernel_dispatch_packet_t) -> Packet {
    // SAFETY: as above, same size, plain data.
    Packet(unsafe { std::mem::transmute::<hsa_kernel_dispatch_packet_t, [u8; AQL]>(*p) })
}

/// The registered intercept handler (`hsa_amd_queue_intercept_handler`).
pub(crate) unsafe extern "C" fn intercept_handler(
    pkts: *const c_void,
    count: u64,
    _user_pkt_index: u64,
    data: *mut c_void,
    writer: hsa_amd_queue_intercept_packet_writer,
) {
    let Some(writer) = writer else { return };
    if pkts.is_null() || data.is_null() || count == 0 {
        return;
    }
    // SAFETY: the runtime hands us `count` packets at `pkts`, valid for this call; we copy them.
    let packets: Vec<Packet> =
        unsafe { std::slice::from_raw_parts(pkts.cast::<[u8; AQL]>(), count as usize) }
            .iter()
            .map(|p| Packet(*p))
            .collect();
    // SAFETY: `data` is the `QueueState` registered with this queue; the registry keeps it alive
    // until the queue is destroyed, and the runtime calls no handler after that.
    let state = unsafe { &*data.cast::<QueueState>() };
    let progress = Cell::new(Progress::Untouched);
    let outcome = catch_unwind(AssertUnwindSafe(|| {
        handle(backend(), state, &packets, writer, &progress)
    }));
    if outcome.is_err() {
        recover(state, &packets, writer, progress.get());
    }
}

/// How far the handling of one handler call got: what must still happen if it panics, so the
/// application neither loses its dispatch nor waits for ever on its completion signal.
#[derive(Clone, Copy, Debug)]
enum Progress {
    /// Nothing was forwarded and no pass was submitted.
    Untouched,
    /// Replay passes were submitted with this application completion signal withheld; device
    /// memory holds what the last pass left.
    Withheld(hsa_signal_t),
    /// Passes ran, then memory was restored from the snapshot (the bytes the dispatch started
    /// from); the application's completion is still withheld.
    Restored,
    /// The packets were forwarded (their own completion included) or the withheld completion
    /// was fired.
    Done,
}

/// After a panic in the handler: forward the packets unchanged if nothing happened yet, fire a
/// withheld completion once, and say what this means for the application's results.
fn recover(state: &QueueState, packets: &[Packet], writer: Writer, progress: Progress) {
    match progress {
        Progress::Untouched => {
            eprintln!(
                "kreplay: internal error on queue {}: forwarding its packets unchanged",
                state.id
            );
            // SAFETY: `writer` is valid for this handler call; the packets are ours.
            unsafe { writer(packets.as_ptr().cast(), packets.len() as u64) };
        }
        Progress::Restored => {
            eprintln!(
                "kreplay: internal error while replaying a dispatch on queue {}: replay stopped \
                 after a restore; the dispatch runs once more from the restored memory",
                state.id
            );
            // SAFETY: as above; the dispatch carries the application's own completion signal.
            unsafe { writer(packets.as_ptr().cast(), packets.len() as u64) };
        }
        Progress::Withheld(signal) => {
            eprintln!(
                "kreplay: internal error while replaying a dispatch on queue {}: replay stopped, \
                 device memory may NOT match an ordinary run; the application's completion fires now",
                state.id
            );
            if signal.handle != 0 {
                backend().original.signal_subtract(signal, 1);
            }
        }
        Progress::Done => eprintln!(
            "kreplay: internal error after a dispatch on queue {} was submitted: results of this \
             dispatch are unreliable",
            state.id
        ),
    }
}

fn handle(
    b: &Backend,
    state: &QueueState,
    packets: &[Packet],
    writer: Writer,
    progress: &Cell<Progress>,
) {
    if !b.replay_active() {
        forward(b, state, packets, &[], writer, false, progress);
        return;
    }
    if packets.len() > 1 {
        handle_batch(b, state, packets, writer, progress);
        return;
    }
    let packet = &packets[0];
    match packet.as_dispatch() {
        Some(dispatch) => {
            replay_dispatch(b, state, dispatch, writer, false, progress);
        }
        None => forward(
            b,
            state,
            std::slice::from_ref(packet),
            &[],
            writer,
            true,
            progress,
        ),
    }
}

/// A multi-packet batch (SPEC §3 rule 7): the tool hears of each dispatch in it (CONFIG ENTER,
/// then CONFIG EXIT with `batch_or_graph` unless it opted out), nothing is replayed, and the
/// batch is forwarded unchanged, in one piece, after the last of them.
fn handle_batch(
    b: &Backend,
    state: &QueueState,
    packets: &[Packet],
    writer: Writer,
    progress: &Cell<Progress>,
) {
    if packets.iter().any(|p| p.as_dispatch().is_some()) {
        b.hooks.warn_once(
            "batch_or_graph",
            "a multi-packet batch reached a queue: its dispatches run once, not replayed (batch_or_graph)",
        );
    }
    let infos: Vec<Option<DispatchInfo>> = packets
        .iter()
        .map(|packet| {
            packet
                .as_dispatch()
                .map(|dispatch| replay_dispatch(b, state, dispatch, writer, true, progress))
        })
        .collect();
    forward(b, state, packets, &infos, writer, true, progress);
}

/// Forwards packets unchanged: under the agent's reader lock and followed by an in-flight marker
/// when `track` (a replay service is configured), with dispatch records when tracing asks.
/// `infos[i]`, when given, is the dispatch the tool already knows packet `i` as (so its record
/// carries the same dispatch id); other dispatches get a fresh id.
fn forward(
    b: &Backend,
    state: &QueueState,
    packets: &[Packet],
    infos: &[Option<DispatchInfo>],
    writer: Writer,
    track: bool,
    progress: &Cell<Progress>,
) {
    // A thread inside its own replay window on this agent proceeds without the reader side.
    let _read = if track {
        b.locks.read(state.agent.handle).ok()
    } else {
        None
    };
    let tracing = b.hooks.dispatch_tracing_configured() && !b.is_finalized();
    if track {
        b.original.signal_add(state.in_flight, 1);
    }
    // The packets and, when tracked, the in-flight marker go to the hardware queue in one write
    // (one doorbell), so tracking adds a packet but no extra wake-up of the packet processor.
    if tracing {
        let (patched, traced) = trace_completions(b, state, packets, infos);
        submit_traced(b, state, patched, &traced, writer, track, progress);
        return;
    }
    let mut batch = Vec::with_capacity(packets.len() + 1);
    batch.extend_from_slice(packets);
    if track {
        batch.push(marker_packet(state));
    }
    // SAFETY: `writer` is valid during this handler call; the packets are initialized memory.
    unsafe { writer(batch.as_ptr().cast(), batch.len() as u64) };
    progress.set(Progress::Done);
}

/// The in-flight marker of `state` as one AQL packet.
fn marker_packet(state: &QueueState) -> Packet {
    let marker = state.marker();
    // SAFETY: a barrier-AND packet is 64 bytes of plain data, like every AQL packet.
    Packet(unsafe { std::mem::transmute::<hsa_barrier_and_packet_t, [u8; AQL]>(marker) })
}

/// Writes traced packets (and the marker) inside the tool layer's ENQUEUE announcement.
fn submit_traced(
    b: &Backend,
    state: &QueueState,
    mut patched: Vec<Packet>,
    traced: &[DispatchInfo],
    writer: Writer,
    track: bool,
    progress: &Cell<Progress>,
) {
    if track {
        patched.push(marker_packet(state));
    }
    b.hooks.dispatch_enqueue(traced, None, &mut || {
        // SAFETY: `writer` is valid during this handler call; the packets are initialized.
        unsafe { writer(patched.as_ptr().cast(), patched.len() as u64) };
        progress.set(Progress::Done);
    });
}

/// What the completion handler of a traced ordinary dispatch needs.
struct TracedDispatch {
    proxy: hsa_signal_t,
    application: hsa_signal_t,
    agent: hsa_agent_t,
    info: DispatchInfo,
}

unsafe extern "C" fn traced_complete(_value: hsa_signal_value_t, arg: *mut c_void) -> bool {
    // SAFETY: `arg` is the box leaked at registration; the handler runs once (returns false).
    let traced = unsafe { Box::from_raw(arg.cast::<TracedDispatch>()) };
    let result = catch_unwind(AssertUnwindSafe(|| {
        let b = backend();
        let (start, end) = b
            .original
            .dispatch_time(traced.agent, traced.proxy)
            .unwrap_or((0, 0));
        b.hooks.dispatch_completed(&DispatchRecord {
            info: traced.info,
            pass: None,
            start_ns: b.nanos(start),
            end_ns: b.nanos(end),
        });
        if traced.application.handle != 0 {
            b.original.signal_subtract(traced.application, 1);
        }
        b.original.signal_destroy(traced.proxy);
    }));
    if result.is_err() {
        eprintln!("kreplay: internal error while completing a traced dispatch");
    }
    false
}

/// Gives each dispatch a completion signal of kreplay's own whose handler delivers the
/// dispatch record and then completes the application's signal. Returns the packets to write
/// and the dispatches among them.
fn trace_completions(
    b: &Backend,
    state: &QueueState,
    packets: &[Packet],
    infos: &[Option<DispatchInfo>],
) -> (Vec<Packet>, Vec<DispatchInfo>) {
    let mut traced_infos = Vec::new();
    let patched = packets
        .iter()
        .enumerate()
        .map(|(i, packet)| {
            let Some(mut dispatch) = packet.as_dispatch() else {
                return *packet;
            };
            let info = infos
                .get(i)
                .copied()
                .flatten()
                .unwrap_or_else(|| dispatch_info(b, state, &dispatch));
            traced_infos.push(info);
            let Ok(proxy) = b.original.signal_create(1) else {
                return *packet;
            };
            let traced = Box::into_raw(Box::new(TracedDispatch {
                proxy,
                application: dispatch.completion_signal,
                agent: state.agent,
                info,
            }));
            let status = b.original.signal_async_handler(
                proxy,
                HSA_SIGNAL_CONDITION_EQ,
                0,
                Some(traced_complete),
                traced.cast(),
            );
            if status != HSA_STATUS_SUCCESS {
                // SAFETY: not registered, so the box is still ours.
                drop(unsafe { Box::from_raw(traced) });
                b.original.signal_destroy(proxy);
                return *packet;
            }
            dispatch.completion_signal = proxy;
            dispatch_bytes(&dispatch)
        })
        .collect();
    (patched, traced_infos)
}

fn dispatch_info(
    b: &Backend,
    state: &QueueState,
    p: &hsa_kernel_dispatch_packet_t,
) -> DispatchInfo {
    DispatchInfo {
        agent_id: state.agent.handle,
        queue_id: state.id,
        kernel_id: p.kernel_object,
        dispatch_id: b.next_dispatch_id(),
        private_segment_size: p.private_segment_size,
        group_segment_size: p.group_segment_size,
        workgroup_size: [
            u32::from(p.workgroup_size_x),
            u32::from(p.workgroup_size_y),
            u32::from(p.workgroup_size_z),
        ],
        grid_size: [p.grid_size_x, p.grid_size_y, p.grid_size_z],
    }
}

/// Runs one dispatch through the pass loop and returns the dispatch as the tool saw it. A
/// member of a batch is not submitted here: the caller forwards the whole batch afterwards.
fn replay_dispatch(
    b: &Backend,
    state: &QueueState,
    dispatch: hsa_kernel_dispatch_packet_t,
    writer: Writer,
    in_batch: bool,
    progress: &Cell<Progress>,
) -> DispatchInfo {
    let info = dispatch_info(b, state, &dispatch);
    let mut tool = b.hooks.replay_tool();
    let mut device = HsaReplay {
        b,
        state,
        dispatch,
        writer,
        in_batch,
        progress,
        guard: None,
        plan: None,
        pass_signal: None,
    };
    let record = kreplay_passloop::run_dispatch(&mut *tool, &mut device, b.hooks.contexts(), &info);
    drop(device);
    if let Some(diagnostic) = record.diagnostic() {
        if record.outcome.is_failure() {
            eprintln!("kreplay: {diagnostic}");
        } else {
            b.hooks.warn(&diagnostic);
        }
    }
    b.hooks.replay_finished(&record);
    info
}

/// The device steps of one replayed dispatch on HSA.
struct HsaReplay<'a> {
    b: &'a Backend,
    state: &'a QueueState,
    dispatch: hsa_kernel_dispatch_packet_t,
    writer: Writer,
    in_batch: bool,
    progress: &'a Cell<Progress>,
    guard: Option<WriteGuard>,
    plan: Option<SnapshotPlan>,
    pass_signal: Option<hsa_signal_t>,
}

impl Drop for HsaReplay<'_> {
    fn drop(&mut self) {
        if let Some(signal) = self.pass_signal.take() {
            // A pass that got stuck may still reference the signal: leave it alive then.
            if self.b.original.signal_load(signal) == 0 {
                self.b.original.signal_destroy(signal);
            }
        }
    }
}

fn decline_from(reason: &str, detail: String) -> Decline {
    let reason = DeclineReason::ALL
        .into_iter()
        .find(|r| r.as_str() == reason)
        .unwrap_or(DeclineReason::SnapshotFailed);
    Decline::new(reason, detail)
}

fn snapshot_decline(e: SnapshotError) -> Decline {
    decline_from(e.reason(), e.to_string())
}

fn tier(t: kreplay_snapshot::StoreTier) -> StoreTier {
    match t {
        kreplay_snapshot::StoreTier::Device => StoreTier::Device,
        kreplay_snapshot::StoreTier::Host => StoreTier::Host,
        kreplay_snapshot::StoreTier::File => StoreTier::File,
        kreplay_snapshot::StoreTier::Auto => StoreTier::None,
    }
}

fn strategy(s: kreplay_snapshot::RestoreStrategy) -> RestoreStrategy {
    match s {
        kreplay_snapshot::RestoreStrategy::Hash => RestoreStrategy::Hash,
        kreplay_snapshot::RestoreStrategy::Writeset => RestoreStrategy::Writeset,
        kreplay_snapshot::RestoreStrategy::Full | kreplay_snapshot::RestoreStrategy::Auto => {
            RestoreStrategy::Full
        }
    }
}

fn snapshot_request(r: &RestoreRequest) -> kreplay_snapshot::RestoreRequest {
    kreplay_snapshot::RestoreRequest {
        next_pass: r.next_pass,
        may_be_final: r.next_may_be_final,
    }
}

/// Waits for one pass's completion signal.
struct PassSignal<'a> {
    b: &'a Backend,
    signal: hsa_signal_t,
}

impl PassCompletion for PassSignal<'_> {
    fn is_complete(&self) -> bool {
        self.b.original.signal_load(self.signal) == 0
    }

    fn pending_handlers(&self) -> usize {
        // Pass records are delivered synchronously after the wait, on the loop's thread.
        0
    }

    fn wait_complete(&self, deadline: Instant) -> bool {
        self.b.wait_signal_zero(self.signal, deadline)
    }
}

impl ReplayDevice for HsaReplay<'_> {
    type Snapshot = Snapshot;

    fn check_replayable(&mut self, _info: &DispatchInfo) -> Result<(), Decline> {
        if self.in_batch {
            return Err(Decline::new(
                DeclineReason::BatchOrGraph,
                "the dispatch arrived in a multi-packet batch",
            ));
        }
        Ok(())
    }

    fn lock_agent(&mut self, info: &DispatchInfo) -> Result<(), Decline> {
        match self.b.locks.write(info.agent_id) {
            Ok(guard) => {
                self.guard = Some(guard);
                Ok(())
            }
            Err(e) => Err(Decline::new(
                DeclineReason::ReentrantDispatch,
                e.to_string(),
            )),
        }
    }

    fn unlock_agent(&mut self, _info: &DispatchInfo) {
        self.guard = None;
    }

    fn drain(&mut self, info: &DispatchInfo) -> Result<(), Decline> {
        let queues = self.b.queues.on_agent(info.agent_id);
        let views: Vec<QueueIdle<'_>> = queues
            .iter()
            .map(|s| QueueIdle {
                backend: self.b,
                state: s,
            })
            .collect();
        let siblings: Vec<&dyn QueueView> = views.iter().map(|v| v as &dyn QueueView).collect();
        let own = QueueIdle {
            backend: self.b,
            state: self.state,
        };
        let copies = self.b.copies.counter(info.agent_id);
        kreplay_drain::drain_agent(&own, &siblings, &[&*copies], &self.b.drain)
            .map(|_| ())
            .map_err(|stuck| decline_from(stuck.reason(), stuck.to_string()))
    }

    fn plan_snapshot(&mut self, info: &DispatchInfo) -> Result<MemoryOpReport, Decline> {
        let plan = self
            .b
            .snapshotter
            .plan(&Filter::for_replay(info.agent_id))
            .map_err(snapshot_decline)?;
        let report = MemoryOpReport {
            bytes_planned: plan.bytes(),
            regions: plan.regions().len() as u64,
            chunks: plan.chunks(),
            ..Default::default()
        };
        self.plan = Some(plan);
        Ok(report)
    }

    fn take_snapshot(
        &mut self,
        info: &DispatchInfo,
    ) -> Result<(Snapshot, MemoryOpReport), Decline> {
        let plan = match self.plan.take() {
            Some(plan) => plan,
            None => self
                .b
                .snapshotter
                .plan(&Filter::for_replay(info.agent_id))
                .map_err(snapshot_decline)?,
        };
        let snapshot = self.b.snapshotter.take(plan).map_err(snapshot_decline)?;
        let r = snapshot.report();
        let report = MemoryOpReport {
            bytes_planned: r.bytes_planned,
            bytes_moved: r.bytes_moved,
            regions: r.regions,
            chunks: r.chunks,
            tier: tier(r.tier),
            strategy: strategy(r.strategy),
        };
        Ok((snapshot, report))
    }

    fn run_pass(&mut self, info: &DispatchInfo, pass: u64) -> Result<(), Decline> {
        let signal = match self.pass_signal {
            Some(s) => s,
            None => {
                let s = self.b.original.signal_create(0).map_err(|st| {
                    Decline::new(
                        DeclineReason::PassDrainStuck,
                        format!("cannot create a pass signal: {st:#x}"),
                    )
                })?;
                self.pass_signal = Some(s);
                s
            }
        };
        self.b.original.signal_add(signal, 1);
        let mut packet = self.dispatch;
        packet.completion_signal = signal;
        let bytes = dispatch_bytes(&packet);
        self.progress
            .set(Progress::Withheld(self.dispatch.completion_signal));
        let writer = self.writer;
        let mut submit = || {
            // SAFETY: the writer is valid for the handler call this loop runs in.
            unsafe { writer((&bytes as *const Packet).cast(), 1) };
        };
        if self.b.hooks.dispatch_tracing_configured() {
            self.b
                .hooks
                .dispatch_enqueue(std::slice::from_ref(info), Some(pass), &mut submit);
        } else {
            submit();
        }
        let waited = kreplay_drain::wait_pass(&PassSignal { b: self.b, signal }, &self.b.drain);
        if let Err(stuck) = waited {
            return Err(decline_from(stuck.reason(), stuck.to_string()));
        }
        if self.b.hooks.dispatch_tracing_configured() {
            let (start, end) = self
                .b
                .original
                .dispatch_time(self.state.agent, signal)
                .unwrap_or((0, 0));
            self.b.hooks.dispatch_completed(&DispatchRecord {
                info: *info,
                pass: Some(pass),
                start_ns: self.b.nanos(start),
                end_ns: self.b.nanos(end),
            });
        }
        Ok(())
    }

    fn plan_restore(
        &mut self,
        _info: &DispatchInfo,
        snapshot: &Snapshot,
        request: &RestoreRequest,
    ) -> MemoryOpReport {
        let plan = snapshot.plan_restore(&snapshot_request(request));
        MemoryOpReport {
            bytes_planned: plan.bytes_planned,
            regions: snapshot.regions().len() as u64,
            tier: tier(snapshot.tier()),
            strategy: strategy(plan.strategy),
            ..Default::default()
        }
    }

    fn restore(
        &mut self,
        _info: &DispatchInfo,
        snapshot: &mut Snapshot,
        request: &RestoreRequest,
    ) -> Result<MemoryOpReport, RestoreFailure> {
        let to_report = |r: &kreplay_snapshot::RestoreReport| MemoryOpReport {
            bytes_planned: r.bytes_planned,
            bytes_moved: r.bytes_moved,
            regions: r.regions,
            chunks: r.chunks_restored,
            tier: tier(r.tier),
            strategy: strategy(r.strategy),
        };
        if self.b.skip_restore {
            let plan = snapshot.plan_restore(&snapshot_request(request));
            return Ok(MemoryOpReport {
                bytes_planned: plan.bytes_planned,
                regions: snapshot.regions().len() as u64,
                tier: tier(snapshot.tier()),
                strategy: strategy(plan.strategy),
                ..Default::default()
            });
        }
        match snapshot.restore(&snapshot_request(request)) {
            Ok(report) => {
                self.progress.set(Progress::Restored);
                if report.repaired_chunks > 0 {
                    self.b.hooks.warn(&format!(
                        "restore before pass {} repaired {} chunk(s) written outside the learned write set",
                        request.next_pass, report.repaired_chunks
                    ));
                }
                Ok(to_report(&report))
            }
            Err(e) => Err(RestoreFailure {
                report: to_report(&e.report),
                bytes_unrestored: e.bytes_lost,
                detail: format!("{} ({} chunk(s) lost)", e.error, e.chunks_lost),
            }),
        }
    }

    fn discard_snapshot(&mut self, _info: &DispatchInfo, snapshot: Snapshot) {
        drop(snapshot);
    }

    fn run_once(&mut self, info: &DispatchInfo) {
        if self.in_batch {
            // Forwarded with the rest of its batch, unchanged, once the loop saw every member.
            return;
        }
        forward(
            self.b,
            self.state,
            &[dispatch_bytes(&self.dispatch)],
            &[Some(*info)],
            self.writer,
            true,
            self.progress,
        );
    }

    fn fire_completion(&mut self, _info: &DispatchInfo) {
        if self.dispatch.completion_signal.handle != 0 {
            self.b
                .original
                .signal_subtract(self.dispatch.completion_signal, 1);
        }
        self.progress.set(Progress::Done);
    }
}

impl std::fmt::Debug for dyn ToolHooks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ToolHooks")
    }
}
