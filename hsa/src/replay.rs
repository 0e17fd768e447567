//! The device side of one replayed dispatch on HSA: [`HsaReplay`] implements the pass loop's
//! [`ReplayDevice`] (agent lock, drains, snapshot, passes with kreplay's own completion signal,
//! restores, the application's completion fired once).

use std::cell::Cell;
use std::sync::Arc;
use std::time::Instant;

use hsa_sys::*;
use kreplay_drain::{PassCompletion, QueueView};
use kreplay_locks::WriteGuard;
use kreplay_passloop::{
    Decline, DeclineReason, DispatchInfo, MemoryOpReport, RegionSources, ReplayDevice,
    RestoreFailure, RestoreRequest, RestoreStrategy, SnapshotRequest, SourceTally, StoreTier,
};
use kreplay_snapshot::{Delta, Filter, Snapshot, SnapshotError, SnapshotPlan};

use crate::DispatchRecord;
use crate::backend::Backend;
use crate::dispatch::{
    Packet, Progress, Queued, SERVE_SLICE, Sink, deliver_mail, dispatch_bytes, dispatch_info,
    forward,
};
use crate::fold::Window;
use crate::queues::{Mark, QueueIdle, QueueState, in_replay_window};
use crate::waits::Held;

/// Runs one dispatch through the pass loop and returns the dispatch as the tool saw it.
pub(crate) fn replay_dispatch(
    b: &Backend,
    state: &QueueState,
    dispatch: hsa_kernel_dispatch_packet_t,
    sink: Sink<'_>,
    queued: Queued<'_>,
    progress: &Cell<Progress>,
) -> DispatchInfo {
    let info = dispatch_info(b, state, &dispatch);
    let mut tool = b.hooks.replay_tool();
    let mut device = HsaReplay {
        b,
        state,
        dispatch,
        sink,
        queued,
        reentrant: matches!(sink, Sink::Side(_)),
        window: None,
        deltas: Vec::new(),
        progress,
        guard: None,
        locked: Vec::new(),
        plan: None,
        pass_signal: None,
        pass_lost: false,
    };
    let callbacks = Mark::callbacks();
    let record = kreplay_passloop::run_dispatch(&mut *tool, &mut device, b.hooks.contexts(), &info);
    drop(device);
    drop(callbacks);
    // Describing the dispatch asks the runtime for the agent's name and formats strings: only
    // when there is something to say, not on every opted-out or fully replayed dispatch.
    if record.has_diagnostic()
        && let Some(diagnostic) = record.diagnostic_for(&describe(b, state, &info))
    {
        if record.outcome.is_failure() {
            log::error!("{diagnostic}");
        } else {
            b.hooks.warn(&diagnostic);
        }
    }
    b.hooks.replay_finished(&record);
    info
}

/// Runs one packet of re-entrant work (submitted from inside a replay window onto `state`, a
/// queue of the agent or of another one) at once on the agent's side queue. A dispatch is not
/// replayed: the tool hears CONFIG ENTER and EXIT with `reentrant_dispatch`, and it runs once.
pub(crate) fn run_reentrant(b: &Backend, state: &QueueState, packet: Packet) {
    let Some(side) = b.queues.side(b, state.agent) else {
        log::error!(
            "cannot create the side queue of agent {:#x}: re-entrant work on queue {} \
             is lost",
            state.agent.handle,
            state.id
        );
        return;
    };
    side.note_side_work();
    let progress = Cell::new(Progress::Untouched);
    match packet.as_dispatch() {
        Some(dispatch) => {
            replay_dispatch(
                b,
                state,
                dispatch,
                Sink::Side(&side),
                Queued::NONE,
                &progress,
            );
        }
        None => forward(b, state, &[packet], &[], Sink::Side(&side), true, &progress),
    }
}

/// The dispatch as a warning names it: by the kernel's name where the tool layer knows it and
/// by the agent's name from the runtime, falling back to their ids.
fn describe(b: &Backend, state: &QueueState, info: &DispatchInfo) -> String {
    let kernel = b
        .hooks
        .kernel_name(info.kernel_id)
        .unwrap_or_else(|| format!("object {:#x}", info.kernel_id));
    let agent = b
        .original
        .agent_name(state.agent)
        .map_or_else(|| format!("{}", info.agent_id), |name| format!("'{name}'"));
    format!(
        "dispatch {} (kernel {kernel}, agent {agent}, queue {})",
        info.dispatch_id, info.queue_id
    )
}

/// The device steps of one replayed dispatch on HSA.
struct HsaReplay<'a> {
    b: &'a Backend,
    state: &'a QueueState,
    dispatch: hsa_kernel_dispatch_packet_t,
    sink: Sink<'a>,
    /// What is queued behind the dispatch on its queue (its completion and theirs are held
    /// back until the replay ends: `crate::waits`).
    queued: Queued<'a>,
    /// Work issued from inside a replay window: runs once on the side queue, never replayed.
    reentrant: bool,
    /// This replay's window for re-entrant work (`crate::fold`), open from the snapshot on.
    window: Option<Arc<Window>>,
    /// What re-entrant work changed in the snapshot's memory, to fold in at the next restore.
    deltas: Vec<Delta>,
    progress: &'a Cell<Progress>,
    guard: Option<(Vec<WriteGuard>, Mark)>,
    /// The agents whose writer sides `guard` holds, ascending (`crate::peers::replay_agents`):
    /// the ones the drain waits for.
    locked: Vec<u64>,
    plan: Option<SnapshotPlan>,
    pass_signal: Option<hsa_signal_t>,
    /// A pass was submitted and never completed (its queue failed or was inactivated).
    pass_lost: bool,
}

impl Drop for HsaReplay<'_> {
    fn drop(&mut self) {
        self.close_window();
        if let Some(signal) = self.pass_signal.take() {
            // Every submitted pass was waited for, so no packet references the signal any more
            // (checked all the same: a signal still in use is left alive).
            if self.b.original.signal_load(signal) == 0 {
                self.b.original.signal_destroy(signal);
            }
        }
    }
}

/// The decline for an error of another crate whose reason is `reason` and whose message is
/// `detail` (which may start with the reason: the decline names it once).
fn decline_from(reason: &str, detail: String) -> Decline {
    let detail = match detail
        .strip_prefix(reason)
        .and_then(|d| d.strip_prefix(": "))
    {
        Some(rest) => rest.to_string(),
        None => detail,
    };
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
        _ => StoreTier::None,
    }
}

fn strategy(s: kreplay_snapshot::RestoreStrategy) -> RestoreStrategy {
    match s {
        kreplay_snapshot::RestoreStrategy::Hash => RestoreStrategy::Hash,
        kreplay_snapshot::RestoreStrategy::Writeset => RestoreStrategy::Writeset,
        kreplay_snapshot::RestoreStrategy::WritesetUnverified => {
            RestoreStrategy::WritesetUnverified
        }
        kreplay_snapshot::RestoreStrategy::Tracked => RestoreStrategy::Tracked,
        _ => RestoreStrategy::Full,
    }
}

fn snapshot_request(r: &RestoreRequest) -> kreplay_snapshot::RestoreRequest {
    kreplay_snapshot::RestoreRequest {
        next_pass: r.next_pass,
        may_be_final: r.next_may_be_final,
    }
}

impl HsaReplay<'_> {
    /// The snapshot plan of this dispatch: what its scope, its kernel arguments and the module
    /// variables on its agent reach (see `crate::reach`).
    fn plan(&self, info: &DispatchInfo) -> Result<SnapshotPlan, Decline> {
        let filter = self.filter(info)?;
        // The agents whose kernels may write what the snapshot holds must be the ones this
        // replay holds and drained: they were worked out before the locks were taken, and a
        // grant or an allocation since may have changed them.
        if self.b.gpus().len() > 1 {
            let owners = crate::peers::reached_owners(self.b, &filter);
            let needed = crate::peers::replay_agents(self.b, info.agent_id, owners);
            if let Some(agent) = needed.iter().find(|a| !self.locked.contains(a)) {
                return Err(Decline::new(
                    DeclineReason::SnapshotFailed,
                    format!(
                        "agent {agent:#x} may write memory this dispatch reaches, and became so \
                         while the replay waited for its locks; it is not held"
                    ),
                ));
            }
        }
        self.b.snapshotter.plan(&filter).map_err(snapshot_decline)
    }

    /// What the dispatch reaches (see `crate::reach`).
    fn filter(&self, info: &DispatchInfo) -> Result<Filter, Decline> {
        crate::reach::filter(
            self.b,
            hsa_agent_t {
                handle: info.agent_id,
            },
            &self.dispatch,
        )
    }
}

fn sources(b: kreplay_snapshot::SourceBreakdown) -> RegionSources {
    let t = |t: kreplay_snapshot::SourceTally| SourceTally {
        regions: t.regions,
        bytes: t.bytes,
    };
    RegionSources {
        agent: t(b.agent),
        referenced: t(b.referenced),
        module_variables: t(b.module_variables),
        adopted: t(b.adopted),
    }
}

/// Waits for one pass's completion signal.
struct PassSignal<'a> {
    b: &'a Backend,
    signal: hsa_signal_t,
    /// The queue the pass runs on (the application's, or the agent's side queue).
    queue: &'a QueueState,
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

    fn failed(&self) -> Option<String> {
        self.queue.failed().map(|status| {
            if status == crate::queues::DESTROYED {
                format!(
                    "queue {} was destroyed (hsa_queue_destroy) while this dispatch was being \
                     handled: the pass will never complete",
                    self.queue.id
                )
            } else if status == crate::queues::INACTIVATED {
                format!(
                    "queue {} was inactivated by the application (hsa_queue_inactivate): the \
                     pass will never complete",
                    self.queue.id
                )
            } else {
                format!(
                    "queue {} went into its error state (status {status:#x}, reported to the \
                     application's queue error callback): the pass will never complete",
                    self.queue.id
                )
            }
        })
    }
}

impl HsaReplay<'_> {
    /// The signals this replay holds back until it ends (`crate::waits`): the dispatch's
    /// completion and those of the packets queued behind it on its queue (in its handler call
    /// and in the ring), of the packets of the held agents' other queues that are not
    /// forwarded yet (forwarding waits for this replay's locks), and, while any of those keeps
    /// a bracketed barrier shut, of the packets behind that barrier.
    fn held(&self, queues: &[Arc<QueueState>]) -> Held {
        let mut packets: Vec<Packet> = self.queued.behind.to_vec();
        if let Some(next) = self.queued.next_index {
            packets.extend(self.state.published_after(self.b, next));
        }
        for queue in queues {
            if !std::ptr::eq(Arc::as_ptr(queue), self.state) {
                packets.extend(queue.unforwarded(self.b));
            }
        }
        let mut held = Held::default();
        held.add(self.dispatch.completion_signal);
        for packet in &packets {
            held.add(crate::waits::completion_signal(packet));
        }
        // Shut barriers hold what is behind them, which may shut more: until nothing is new.
        loop {
            let mut grew = false;
            for queue in queues {
                for signal in queue.waits.shut_behind(self.b, &held) {
                    grew |= held.add(hsa_signal_t { handle: signal });
                }
            }
            if !grew {
                return held;
            }
        }
    }

    fn close_window(&mut self) {
        if let Some(window) = self.window.take() {
            self.b.windows.close(&window);
        }
    }

    /// The owner's side of a window step: waits for the holds in progress, marks the window
    /// busy and returns what re-entrant work issued since the last settle changed (kept in
    /// `deltas`); a problem is returned as a warning to give once the window is quiet again.
    fn settle(b: &Backend, window: &Window, deltas: &mut Vec<Delta>) -> Option<String> {
        window.busy();
        match window.settle(b)? {
            Ok(delta) => {
                if !delta.is_empty() {
                    deltas.push(delta);
                }
                None
            }
            Err(why) => Some(format!(
                "re-entrant work issued during a replay could not be kept ({why}): the next \
                 restore may overwrite what it wrote"
            )),
        }
    }
}

impl ReplayDevice for HsaReplay<'_> {
    type Snapshot = Snapshot;

    fn check_replayable(&mut self, _info: &DispatchInfo) -> Result<(), Decline> {
        if self.reentrant {
            return Err(Decline::new(
                DeclineReason::ReentrantDispatch,
                "issued from inside a replay window: runs once, at once, on the agent's side queue",
            ));
        }
        // A kernel whose code object says it may print, call the host or use the device heap
        // would do so once per pass (`crate::devruntime`).
        if let Some(decline) = crate::devruntime::decline(self.dispatch.kernel_object) {
            return Err(decline);
        }
        // A dispatch that reached the handler with other packets is replayed like a lone one:
        // the packets before it were forwarded first, so the drain covers them.
        Ok(())
    }

    fn lock_agent(&mut self, info: &DispatchInfo) -> Result<(), Decline> {
        // The writer side of the agent and of every agent whose kernels may write its memory
        // (`crate::peers`), taken in handle order by every replay, so two replays of one group
        // never wait for each other crosswise. Lock order: a thread inside a replay window never
        // waits for another agent's writer side (that replay may be waiting for this one): it
        // tries once and declines.
        //
        // With more than one GPU, memory the dispatch's arguments point into may be written by
        // another GPU's kernels (host memory any of them reaches, another GPU's memory): those
        // GPUs are locked and drained too (`crate::peers::replay_agents`). What the arguments
        // reach is read here, before the locks, and checked again under them by `plan`.
        let agents = if self.b.gpus().len() > 1 {
            let agent = hsa_agent_t {
                handle: info.agent_id,
            };
            let owners = crate::reach::argument_owners(self.b, agent, &self.dispatch);
            crate::peers::replay_agents(self.b, info.agent_id, owners)
        } else {
            self.b.peers.group(info.agent_id)
        };
        let nested = in_replay_window();
        let (b, state, sink) = (self.b, self.state, self.sink);
        let guards = if nested {
            let mut guards = Vec::new();
            for &agent in &agents {
                match b.locks.try_write_for(agent, std::time::Duration::ZERO) {
                    Ok(guard) => guards.push(guard),
                    // The sides taken so far are given back as `guards` drops.
                    Err(e) => {
                        return Err(Decline::new(
                            DeclineReason::ReentrantDispatch,
                            e.to_string(),
                        ));
                    }
                }
            }
            guards
        } else {
            // Never waiting while holding one (see `write_all_serving`); while it waits, this
            // handler keeps delivering its queue's mail (the drain marker of the replay it
            // waits for).
            b.locks
                .write_all_serving(&agents, SERVE_SLICE, || deliver_mail(b, state, sink))
                .map_err(|e| Decline::new(DeclineReason::ReentrantDispatch, e.to_string()))?
        };
        self.guard = Some((guards, Mark::window()));
        self.locked = agents;
        Ok(())
    }

    fn unlock_agent(&mut self, _info: &DispatchInfo) {
        self.guard = None;
        self.locked.clear();
    }

    fn drain(&mut self, _info: &DispatchInfo) -> Result<(), Decline> {
        // The queues and copies of every agent this replay holds (`crate::peers`): a kernel of
        // one of them already running may be writing memory the snapshot will hold.
        let group = &self.locked;
        let queues: Vec<_> = group
            .iter()
            .flat_map(|&a| self.b.queues.on_agent(a))
            .collect();
        // Ask every queue of the agents for a drain marker: this one and side queues get it
        // from here, the others through their mailbox (their handler may be waiting for this
        // very replay, and writes mail while it waits).
        let deadline = Backend::deadline_after(self.b.drain.timeout);
        for queue in &queues {
            let own = std::ptr::eq(Arc::as_ptr(queue), self.state);
            if !own && queue.failed().is_some() {
                // A queue that failed (or was inactivated) runs nothing more: idle to the drain
                // (`QueueIdle::is_idle`). A marker would never complete, and a wake-up packet
                // would take a slot of a ring nobody empties any more: once it is full, every
                // later drain of the agent would wait out its deadline for one.
                continue;
            }
            if queue.markers_ride_batches() && !own {
                // Its forwarded batches carry their markers, but for those forwarded while
                // several were in flight: for them a marker waits in its mailbox.
                queue.mail_marker_if_unmarked(self.b);
                continue;
            }
            if !queue.needs_drain_marker(self.b) {
                // Nothing forwarded since its last marker, which completed: idle.
                continue;
            }
            if own {
                let marker = queue.drain_marker(self.b);
                self.sink.write(self.b, &[marker]);
            } else if self.b.queues.is_side(queue) {
                let marker = queue.drain_marker(self.b);
                crate::queues::submit_side(self.b, queue, &[marker]);
            } else {
                queue.request_drain_marker(self.b, deadline);
            }
        }
        // Held signals matter only to a queue with a bracketed barrier or to a copy waiting for
        // signals; neither can appear while this replay holds its agents.
        let waiting = queues.iter().any(|q| q.waits.has_open()) || self.b.copies.waiting.any();
        let held_now = || {
            if waiting {
                self.held(&queues)
            } else {
                Held::default()
            }
        };
        let held = held_now();
        let views: Vec<QueueIdle<'_>> = queues
            .iter()
            .map(|s| QueueIdle {
                backend: self.b,
                state: s,
                held: &held_now,
                dispatch_queue: std::ptr::eq(Arc::as_ptr(s), self.state),
            })
            .collect();
        let siblings: Vec<&dyn QueueView> = views.iter().map(|v| v as &dyn QueueView).collect();
        let own = QueueIdle {
            backend: self.b,
            state: self.state,
            held: &held_now,
            dispatch_queue: true,
        };
        // A copy waiting for what this replay holds back lands only after the dispatch has
        // run, and copy engines run their copies in order, so the snapshot's and the tool's
        // copies could queue behind it: the dispatch runs once, now rather than after the
        // drain timeout.
        if let Some(&agent) = group
            .iter()
            .find(|&&agent| self.b.copies.waiting.held_on(self.b, agent, &held) > 0)
        {
            return Err(Decline::new(
                DeclineReason::AgentDrainStuck,
                format!(
                    "an async copy on agent {agent:#x} waits for this dispatch's completion (or \
                     for a packet queued behind it): it cannot land before the dispatch runs, \
                     and copies run in order behind it"
                ),
            ));
        }
        let copies: Vec<_> = group.iter().map(|&a| self.b.copies.counter(a)).collect();
        let copies: Vec<&dyn kreplay_drain::AsyncCopyTracker> = copies
            .iter()
            .map(|c| &**c as &dyn kreplay_drain::AsyncCopyTracker)
            .collect();
        kreplay_drain::drain_agent(&own, &siblings, &copies, &self.b.drain)
            .map(|_| ())
            .map_err(|stuck| {
                // The dispatch's queue stopped at a barrier that waits for work this replay
                // holds back: its passes would queue behind it and never start, while that
                // work waits for this replay's locks. The dispatch runs once, behind it.
                if matches!(stuck, kreplay_drain::DrainStuck::Queue(_)) && own.parked_for_good() {
                    return Decline::new(
                        DeclineReason::QueueDrainStuck,
                        format!(
                            "queue {:#x} is stopped at a barrier packet that waits for work this \
                             replay holds back (a packet another queue has not forwarded yet, or \
                             one queued behind this dispatch): no pass could start before the \
                             replay ends",
                            self.state.id
                        ),
                    );
                }
                decline_from(stuck.reason(), stuck.to_string())
            })
    }

    fn prepare(&mut self, _info: &DispatchInfo) -> Result<(), Decline> {
        // The passes' completion signal, before the snapshot: a failure here is a decline.
        if self.pass_signal.is_none() {
            let signal = self.b.original.signal_create(0).map_err(|status| {
                Decline::new(
                    DeclineReason::SnapshotFailed,
                    format!("cannot create the pass completion signal (status {status:#x})"),
                )
            })?;
            self.pass_signal = Some(signal);
        }
        // Every agent's side queue too: re-entrant work a tool issues from this replay's
        // callbacks runs there, and has nowhere to run if one cannot be created later.
        self.b.queues.ensure_sides(self.b).map_err(|agent| {
            Decline::new(
                DeclineReason::SnapshotFailed,
                format!(
                    "cannot create the queue for re-entrant work on agent {:#x}",
                    agent.handle
                ),
            )
        })?;
        Ok(())
    }

    fn plan_snapshot(&mut self, info: &DispatchInfo) -> Result<MemoryOpReport, Decline> {
        let plan = self.plan(info)?;
        let report = MemoryOpReport {
            bytes_planned: plan.bytes(),
            regions: plan.regions().len() as u64,
            chunks: plan.chunks(),
            sources: sources(plan.breakdown()),
            ..Default::default()
        };
        self.plan = Some(plan);
        Ok(report)
    }

    fn take_snapshot(
        &mut self,
        info: &DispatchInfo,
        request: &SnapshotRequest,
    ) -> Result<(Snapshot, MemoryOpReport), Decline> {
        let plan = match self.plan.take() {
            Some(plan) => plan,
            None => self.plan(info)?,
        }
        .with_planned_restores(request.planned_restores);
        // From here on, re-entrant work (from the snapshot callbacks on, on any thread inside a
        // window) is captured before it runs and folded into this snapshot.
        let window = self.b.windows.open(plan.footprint());
        // Re-entrant work issued before the window opened (SNAPSHOT ENTER, another replay's
        // callbacks, on any agent's side queue) lands before the copy, which then holds it.
        self.window = Some(window.clone());
        let in_flight = crate::fold::InFlight::mark(self.b, window.footprint());
        if !in_flight.wait(self.b, Backend::deadline_after(self.b.drain.timeout)) {
            // A snapshot taken now could hold half of that work: decline instead (nothing is
            // restored, so the work lands whole whenever it does).
            self.close_window();
            return Err(Decline::new(
                DeclineReason::AgentDrainStuck,
                "re-entrant work issued before the snapshot did not complete within the drain \
                 timeout",
            ));
        }
        let taken = self.b.snapshotter.take_for_kernel(plan, info.kernel_id);
        window.quiet();
        let snapshot = match taken {
            Ok(snapshot) => snapshot,
            Err(e) => {
                self.close_window();
                return Err(snapshot_decline(e));
            }
        };
        let r = snapshot.report();
        let report = MemoryOpReport {
            bytes_planned: r.bytes_planned,
            bytes_moved: r.bytes_moved,
            regions: r.regions,
            chunks: r.chunks,
            tier: tier(r.tier),
            strategy: strategy(r.strategy),
            sources: sources(r.sources),
            ..Default::default()
        };
        Ok((snapshot, report))
    }

    fn run_pass(&mut self, info: &DispatchInfo, pass: u64) -> Result<(), Decline> {
        // Acquired by `prepare` before the snapshot; without it no pass is ever submitted.
        let Some(signal) = self.pass_signal else {
            return Err(Decline::new(
                DeclineReason::PassDrainStuck,
                "no pass completion signal was acquired",
            ));
        };
        self.b.original.signal_add(signal, 1);
        let mut packet = self.dispatch;
        packet.completion_signal = signal;
        let bytes = dispatch_bytes(&packet);
        self.progress
            .set(Progress::Withheld(self.dispatch.completion_signal));
        let counted = crate::counting::program(self.b, info, Some(pass), signal);
        let (b, sink, window, deltas) = (self.b, self.sink, self.window.clone(), &mut self.deltas);
        let mut trouble = None;
        let mut submit = || {
            if let Some(window) = &window {
                // Re-entrant work issued before this kernel (PASS ENTER and earlier) is listed
                // now, before the kernel's own writes mix with it.
                trouble = Self::settle(b, window, deltas);
                window.kernel(signal);
            }
            sink.write(b, std::slice::from_ref(&bytes))
        };
        if self.b.hooks.dispatch_tracing_configured() {
            self.b
                .hooks
                .dispatch_enqueue(std::slice::from_ref(info), Some(pass), &mut submit);
        } else {
            submit();
        }
        // A running pass is never abandoned: its kernel may still write, and the application
        // must not see its completion before that. A long pass is warned about and waited for.
        // Only a pass whose queue failed (it runs nothing more) is given up on.
        let queue = match self.sink {
            Sink::Side(side) => side,
            Sink::Handler(_) => self.state,
        };
        let waited = kreplay_drain::wait_pass_patiently(
            &PassSignal {
                b: self.b,
                signal,
                queue,
            },
            &self.b.drain,
            &mut |waited| {
                self.b.hooks.warn(&format!(
                    "pass {pass} of dispatch {} (kernel {}) still running after {:.1} s; \
                     waiting for it (a running pass is never abandoned)",
                    info.dispatch_id,
                    info.kernel_id,
                    waited.as_secs_f64()
                ))
            },
        );
        if let Some(window) = &self.window {
            window.quiet();
        }
        if let Some(warning) = trouble {
            self.b.hooks.warn(&warning);
        }
        if let Err(never) = waited {
            self.pass_lost = true;
            // Nothing of the pass can be read back (counters, times): it did not complete.
            return Err(Decline::new(
                DeclineReason::PassDrainStuck,
                format!(
                    "pass {pass} never completed: {} (after {:.3} s)",
                    never.why,
                    never.waited.as_secs_f64()
                ),
            ));
        }
        if let Some(counted) = counted {
            crate::counting::collect(self.b, counted, signal);
        }
        if pass == 0 {
            // The application's signal reports one run: the first pass's.
            crate::dispatch::carry_timestamps(signal, self.dispatch.completion_signal);
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
            strategy: strategy(r.strategy).as_run(r.unverified),
            repaired_chunks: r.repaired_chunks,
            unverified: r.unverified,
            ..Default::default()
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
        // Re-entrant work issued since the last settle (PASS EXIT, the continue callback,
        // RESTORE ENTER, another replay's callbacks) is listed, and everything listed since the
        // last restore goes into the store: this restore and later ones bring it back.
        let mut trouble = None;
        if let Some(window) = self.window.clone() {
            trouble = Self::settle(self.b, &window, &mut self.deltas);
            for delta in self.deltas.drain(..) {
                if let Err(e) = snapshot.fold(&delta) {
                    trouble = Some(format!(
                        "re-entrant work issued during a replay could not be kept ({e}): \
                         restores may overwrite what it wrote"
                    ));
                }
            }
        }
        let restored = snapshot.restore(&snapshot_request(request));
        if let Some(window) = &self.window {
            window.quiet();
        }
        if let Some(warning) = trouble {
            self.b.hooks.warn(&warning);
        }
        match restored {
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
        self.close_window();
        drop(snapshot);
    }

    fn run_once(&mut self, info: &DispatchInfo) {
        if let Some(next) = self.queued.next_index {
            self.state.will_forward(next);
        }
        forward(
            self.b,
            self.state,
            &[dispatch_bytes(&self.dispatch)],
            &[Some(*info)],
            self.sink,
            true,
            self.progress,
        );
    }

    fn fire_completion(&mut self, _info: &DispatchInfo) {
        // On a queue that failed the dispatch never completes, with kreplay or without: the
        // application heard of it through its queue error callback. On one the application
        // inactivated it completes where every pass did (it ran before the inactivation, as
        // it had without kreplay), and not where one was aborted.
        let completes = match self.state.failed() {
            None => true,
            Some(crate::queues::INACTIVATED | crate::queues::DESTROYED) => !self.pass_lost,
            Some(_) => false,
        };
        if self.dispatch.completion_signal.handle != 0 && completes {
            self.b
                .original
                .signal_subtract(self.dispatch.completion_signal, 1);
        }
        self.progress.set(Progress::Done);
    }
}
