//! The queue handler: every packet an application writes to an intercepted queue comes here.
//!
//! A single kernel dispatch with a replay service configured goes through the pass loop with
//! [`HsaReplay`] as its device; everything else is forwarded unchanged (tracked for drains, and
//! under the agent's reader lock while a replay service is configured).

use std::cell::Cell;
use std::ffi::c_void;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicUsize, Ordering};

use hsa_sys::*;
use kreplay_passloop::DispatchInfo;
use smallvec::SmallVec;

use crate::backend::{Backend, backend};
use crate::queues::{QueueState, Slot, is_wake_up};
use crate::replay::replay_dispatch;
use crate::{DispatchRecord, ToolHooks};

pub(crate) type Writer = unsafe extern "C" fn(*const c_void, u64);

/// One 64-byte AQL packet.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
pub(crate) struct Packet([u8; AQL]);
const AQL: usize = hsa_sys::AQL_PACKET_SIZE;

impl Packet {
    pub(crate) fn from_bytes(bytes: [u8; AQL]) -> Packet {
        Packet(bytes)
    }

    pub(crate) fn bytes(&self) -> &[u8; AQL] {
        &self.0
    }

    pub(crate) fn packet_type(&self) -> u32 {
        u32::from(u16::from_ne_bytes([self.0[0], self.0[1]])) & 0xff
    }

    pub(crate) fn as_dispatch(&self) -> Option<hsa_kernel_dispatch_packet_t> {
        (self.packet_type() == HSA_PACKET_TYPE_KERNEL_DISPATCH).then(|| {
            // SAFETY: both are 64-byte plain-data layouts; every bit pattern is a valid packet.
            unsafe { std::mem::transmute::<[u8; AQL], hsa_kernel_dispatch_packet_t>(self.0) }
        })
    }
}

/// What is queued behind a dispatch on its queue, not yet forwarded: the rest of its handler
/// call's packets, and the application's ring from `next_index` on (`crate::waits`).
#[derive(Clone, Copy)]
pub(crate) struct Queued<'a> {
    pub(crate) behind: &'a [Packet],
    pub(crate) next_index: Option<u64>,
}

impl Queued<'_> {
    /// Nothing known to be queued behind (re-entrant work on a side queue).
    pub(crate) const NONE: Queued<'static> = Queued {
        behind: &[],
        next_index: None,
    };
}

/// Where packets go: the next level of the intercept chain of the queue being handled, or the
/// agent's side queue (re-entrant work, which must not wait behind the application's queue).
#[derive(Clone, Copy)]
pub(crate) enum Sink<'a> {
    Handler(Writer),
    Side(&'a QueueState),
}

impl Sink<'_> {
    /// Writes `packets` (one write, one doorbell, for the handler's writer).
    pub(crate) fn write(&self, b: &Backend, packets: &[Packet]) {
        match self {
            // SAFETY: the writer is valid for the handler call this sink was made in; the
            // packets are initialized memory.
            Sink::Handler(writer) => unsafe {
                writer(packets.as_ptr().cast(), packets.len() as u64)
            },
            Sink::Side(side) => crate::queues::submit_side(b, side, packets),
        }
    }
}

pub(crate) fn dispatch_bytes(p: &hsa_kernel_dispatch_packet_t) -> Packet {
    // SAFETY: as above, same size, plain data.
    Packet(unsafe { std::mem::transmute::<hsa_kernel_dispatch_packet_t, [u8; AQL]>(*p) })
}

/// Packets of one handler call copied without a heap allocation.
const INLINE_PACKETS: usize = 4;

/// The registered intercept handler (`hsa_amd_queue_intercept_handler`).
pub(crate) unsafe extern "C" fn intercept_handler(
    pkts: *const c_void,
    count: u64,
    user_pkt_index: u64,
    data: *mut c_void,
    writer: hsa_amd_queue_intercept_packet_writer,
) {
    let Some(writer) = writer else { return };
    if pkts.is_null() || data.is_null() || count == 0 {
        return;
    }
    // The usual doorbell carries one packet or a few: those are copied to the stack, so the
    // forwarding path allocates nothing.
    // SAFETY: the runtime hands us `count` packets at `pkts`, valid for this call; we copy them.
    let packets: SmallVec<[Packet; INLINE_PACKETS]> =
        unsafe { std::slice::from_raw_parts(pkts.cast::<[u8; AQL]>(), count as usize) }
            .iter()
            .map(|p| Packet(*p))
            .collect();
    // SAFETY: `data` is the `HandlerData` registered with this queue, never freed.
    let data = unsafe { &*data.cast::<crate::queues::HandlerData>() };
    // A reference of this call's own: the state outlives the call whatever destroy comes.
    let Some(state) = data.state() else {
        // The queue was destroyed while this call began: nothing of kreplay's is left for it.
        // Its packets go on as the runtime gave them, but for kreplay's own wake-up packets.
        let rest: SmallVec<[Packet; INLINE_PACKETS]> =
            packets.iter().filter(|p| !is_wake_up(p)).copied().collect();
        if !rest.is_empty() {
            // SAFETY: the writer is valid for this handler call; the packets are ours.
            unsafe { writer(rest.as_ptr().cast(), rest.len() as u64) };
        }
        return;
    };
    let state: &QueueState = &state;
    let progress = Cell::new(Progress::Untouched);
    let handled = Cell::new(0usize);
    let outcome = catch_unwind(AssertUnwindSafe(|| {
        let b = backend();
        // While a replay service is configured a handler call may last (a replay, or a wait
        // for the agent's lock): the queue's destroy waits for it, and a cancellation of this
        // thread waits for its end (`crate::cancel`).
        let replaying = b.replay_active();
        // After finalization a handler call may still wait for a replay that began before
        // (`handle`): the queue's destroy waits for it just the same.
        let lasting = replaying || b.finalized_with_open_replays();
        let _call = lasting.then(|| state.handler_call(writer));
        let _no_cancel = lasting.then(crate::cancel::NoCancel::now);
        deliver_mail(b, state, Sink::Handler(writer));
        if state.has_reentrant() || packets.iter().any(is_wake_up) {
            handle_with_reentrant(
                b,
                state,
                &packets,
                user_pkt_index,
                writer,
                &progress,
                &handled,
            );
        } else {
            handle(
                b,
                state,
                &packets,
                user_pkt_index,
                writer,
                &progress,
                &handled,
                0,
            );
        }
    }));
    if outcome.is_err() {
        recover(state, &packets[handled.get()..], writer, progress.get());
    }
}

/// How far the handling of one handler call got: what must still happen if it panics, so the
/// application neither loses its dispatch nor waits for ever on its completion signal.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Progress {
    /// Nothing was forwarded and no pass was submitted.
    Untouched,
    /// Replay passes were submitted with this application completion signal withheld; device
    /// memory holds what the last pass left.
    Withheld(hsa_signal_t),
    /// Passes ran, then memory was restored from the snapshot (the bytes the dispatch started
    /// from); the application's completion is still withheld.
    Restored,
    /// The withheld completion was fired, or the dispatch (the first packet) was forwarded
    /// alone.
    Done,
    /// The first this many packets not handled yet were forwarded in one write (their own
    /// completions included); the rest never reached the queue.
    Forwarded(usize),
}

/// After a panic in the handler: `packets` are those not handled yet, the first of them the one
/// being handled when the panic struck (with `progress` saying how far it got). Forwards what
/// never reached the queue, fires a withheld completion once, and says what this means for the
/// application's results.
fn recover(state: &QueueState, packets: &[Packet], writer: Writer, progress: Progress) {
    if packets.is_empty() {
        return;
    }
    match progress {
        Progress::Untouched => {
            log::error!(
                "internal error on queue {}: forwarding its packets unchanged",
                state.id
            );
            // SAFETY: `writer` is valid for this handler call; the packets are ours.
            unsafe { writer(packets.as_ptr().cast(), packets.len() as u64) };
        }
        Progress::Restored => {
            log::error!(
                "internal error while replaying a dispatch on queue {}: replay stopped \
                 after a restore; the dispatch runs once more from the restored memory",
                state.id
            );
            // SAFETY: as above; the dispatch carries the application's own completion signal.
            unsafe { writer(packets.as_ptr().cast(), packets.len() as u64) };
        }
        Progress::Withheld(signal) => {
            log::error!(
                "internal error while replaying a dispatch on queue {}: replay stopped, \
                 device memory may NOT match an ordinary run; the application's completion fires now",
                state.id
            );
            if signal.handle != 0 {
                backend().original.signal_subtract(signal, 1);
            }
            if packets.len() > 1 {
                // SAFETY: as above; the packets after the interrupted dispatch never reached the
                // queue.
                unsafe { writer(packets[1..].as_ptr().cast(), packets.len() as u64 - 1) };
            }
        }
        Progress::Done => {
            log::error!(
                "internal error after a dispatch on queue {} was submitted: results of \
                 this dispatch are unreliable",
                state.id
            );
            if packets.len() > 1 {
                // SAFETY: as above.
                unsafe { writer(packets[1..].as_ptr().cast(), packets.len() as u64 - 1) };
            }
        }
        Progress::Forwarded(written) => {
            log::error!(
                "internal error after {written} packet(s) on queue {} were submitted: the \
                 dispatch records of these are unreliable",
                state.id
            );
            if let Some(rest) = packets.get(written..).filter(|rest| !rest.is_empty()) {
                // SAFETY: as above; these never reached the queue.
                unsafe { writer(rest.as_ptr().cast(), rest.len() as u64) };
            }
        }
    }
}

/// Handles `packets`, the first of them at index `first_index` of the application's ring and
/// at index `base` of the handler call's packets (what `handled` counts).
#[allow(clippy::too_many_arguments)]
fn handle(
    b: &Backend,
    state: &QueueState,
    packets: &[Packet],
    first_index: u64,
    writer: Writer,
    progress: &Cell<Progress>,
    handled: &Cell<usize>,
    base: usize,
) {
    // Where each forward ends in the application's ring (`crate::waits`).
    let end = |i: usize| first_index.wrapping_add(i as u64);
    // How far the handler call got, for its recovery after a panic (`recover`).
    let done = |i: usize| handled.set(base + i);
    if !b.replay_active() {
        // After finalization (`OnUnload`) a replay that began before it may still be running
        // on another thread: what is forwarded now waits for its window to close, as an
        // ordinary dispatch did before, or the replay's remaining restores would undo it. The
        // reader side is off where no replay service was ever configured (and in a forked
        // child), and uncontended once the last window closed.
        let _read = b
            .is_finalized()
            .then(|| {
                b.locks
                    .read_serving(state.agent.handle, SERVE_SLICE, || {
                        deliver_mail(b, state, Sink::Handler(writer))
                    })
                    .ok()
            })
            .flatten();
        state.will_forward(end(packets.len()));
        forward(
            b,
            state,
            packets,
            &[],
            Sink::Handler(writer),
            false,
            progress,
        );
        done(packets.len());
        return;
    }
    // Several packets in one call are independent packets in queue order (one doorbell for
    // several packets, or several threads sharing the queue): each kernel dispatch goes through
    // the pass loop on its own, and each run of other packets is forwarded in its place, so
    // everything before a dispatch was submitted before its replay drains the queue.
    let mut start = 0;
    for (i, packet) in packets.iter().enumerate() {
        let Some(dispatch) = packet.as_dispatch() else {
            continue;
        };
        if start < i {
            state.will_forward(end(i));
            forward(
                b,
                state,
                &packets[start..i],
                &[],
                Sink::Handler(writer),
                true,
                progress,
            );
            done(i);
            progress.set(Progress::Untouched);
        }
        let queued = Queued {
            behind: &packets[i + 1..],
            next_index: Some(end(i + 1)),
        };
        replay_dispatch(b, state, dispatch, Sink::Handler(writer), queued, progress);
        // Its last pass (or its one run) is in the hardware queue now.
        state.note_forwarded(end(i + 1));
        done(i + 1);
        progress.set(Progress::Untouched);
        start = i + 1;
    }
    if start < packets.len() {
        state.will_forward(end(packets.len()));
        forward(
            b,
            state,
            &packets[start..],
            &[],
            Sink::Handler(writer),
            true,
            progress,
        );
        done(packets.len());
    }
}

/// [`handle`] for a queue with re-entrant slots (reserved from inside a replay window) or
/// kreplay's wake-up packets: re-entrant packets run on the agent's side queue (or were already
/// run by the store that published them and are dropped), wake-ups are dropped, and the
/// application's packets around them are handled as usual, in order.
fn handle_with_reentrant(
    b: &Backend,
    state: &QueueState,
    packets: &[Packet],
    first_index: u64,
    writer: Writer,
    progress: &Cell<Progress>,
    handled: &Cell<usize>,
) {
    let mut start = 0;
    let mut i = 0;
    while i < packets.len() {
        let slot = if is_wake_up(&packets[i]) {
            Slot::AlreadyRan
        } else {
            state.take_slot(first_index.wrapping_add(i as u64))
        };
        if slot == Slot::Ordinary {
            i += 1;
            continue;
        }
        if start < i {
            let index = first_index.wrapping_add(start as u64);
            handle(
                b,
                state,
                &packets[start..i],
                index,
                writer,
                progress,
                handled,
                start,
            );
            progress.set(Progress::Untouched);
        }
        handled.set(i + 1);
        if slot == Slot::Reentrant {
            crate::replay::run_reentrant(b, state, packets[i]);
        }
        // Not the application's queue's to forward: past it, as if forwarded (`crate::waits`).
        state.note_forwarded(first_index.wrapping_add(i as u64 + 1));
        i += 1;
        start = i;
    }
    if start < packets.len() {
        let index = first_index.wrapping_add(start as u64);
        handle(
            b,
            state,
            &packets[start..],
            index,
            writer,
            progress,
            handled,
            start,
        );
    }
}

/// Writes the packets kreplay left for this queue (drain markers) before anything else.
pub(crate) fn deliver_mail(b: &Backend, state: &QueueState, sink: Sink<'_>) {
    if state.has_mail() {
        let mail = state.take_mail();
        if !mail.is_empty() {
            sink.write(b, &mail);
        }
    }
}

/// The most drain markers kreplay keeps in flight on a single-producer queue by adding one to
/// each forwarded batch.
const SINGLE_PRODUCER_MARKERS: i64 = 4;

/// How long a handler waits for the agent's lock before it looks at its mailbox again.
pub(crate) const SERVE_SLICE: std::time::Duration = std::time::Duration::from_millis(1);

/// Forwards packets unchanged, with dispatch records when tracing asks. When `track` (a replay
/// service is configured) they are written under the agent's reader lock, so that none is
/// forwarded during a replay window; while it waits, the handler keeps delivering its queue's
/// mail (a replay's drain marker). `infos[i]`, when given, is the dispatch the tool already
/// knows packet `i` as (so its record carries the same dispatch id); other dispatches get a
/// fresh id.
pub(crate) fn forward(
    b: &Backend,
    state: &QueueState,
    packets: &[Packet],
    infos: &[Option<DispatchInfo>],
    sink: Sink<'_>,
    track: bool,
    progress: &Cell<Progress>,
) {
    // The COMPLETE records of traced kernels that finished before ENQUEUE EXIT returned go to
    // a completion thread of kreplay's own once it has (`EnqueueGate`).
    let mut _open: Option<OpenGate> = None;
    // A thread inside its own replay window on this agent proceeds without the reader side;
    // re-entrant work on the side queue never waits for a replay (it is issued from one).
    let _read = match sink {
        Sink::Handler(_) if track => b
            .locks
            .read_serving(state.agent.handle, SERVE_SLICE, || {
                deliver_mail(b, state, sink)
            })
            .ok(),
        _ => None,
    };
    // Re-entrant work: the open replays' memory is captured first, so that what this work
    // writes is folded into their snapshots, not erased by their restores (`crate::fold`).
    let _holds = matches!(sink, Sink::Side(_)).then(|| crate::fold::hold_open(b));
    deliver_mail(b, state, sink);
    // What the write forwards of the packets the handler was given (a marker may follow them).
    let given = packets.len();
    // A queue kreplay does not ring for a drain marker (single-producer, or with handlers of
    // others above kreplay's) gets one now, in the same write, after the packets.
    let mut packets = std::borrow::Cow::Borrowed(packets);
    match sink {
        Sink::Handler(_) if track && state.markers_ride_batches() => {
            // A few markers in flight at most: they take slots of the hardware queue that the
            // application does not know of (a queue whose work waits for the host would fill
            // up and block its submitting thread). Batches past them are covered by a marker
            // a drain leaves in the mailbox.
            if state.markers_in_flight(b) < SINGLE_PRODUCER_MARKERS {
                packets.to_mut().push(state.drain_marker(b));
            } else {
                state.mark_dirty();
            }
        }
        Sink::Handler(_) => state.mark_dirty(),
        Sink::Side(side) => side.mark_dirty(),
    }
    let packets = &packets[..];
    let tracing = (b.hooks.dispatch_tracing_configured() || b.hooks.counting_configured())
        && !b.is_finalized();
    let (patched, traced) = if tracing {
        let (patched, traced, gate) = trace_completions(b, state, packets, infos);
        _open = Some(gate);
        (std::borrow::Cow::Owned(patched), Some(traced))
    } else {
        (std::borrow::Cow::Borrowed(packets), None)
    };
    let out = bracket(b, state, sink, track, &patched);
    let mut write = || {
        sink.write(b, &out);
        if let Sink::Handler(_) = sink {
            state.forwarded();
        }
        progress.set(Progress::Forwarded(given));
    };
    match traced {
        Some(traced) => {
            // The tool's ENQUEUE callbacks run on the application's thread (`crate::cancel`).
            let _no_cancel = crate::cancel::NoCancel::now();
            b.hooks.dispatch_enqueue(&traced, None, &mut write)
        }
        None => write(),
    }
}

/// `packets` with every barrier that waits bracketed by markers, where a replay's drain looks
/// for them: on an application queue while a replay service is configured (`crate::waits`).
fn bracket<'p>(
    b: &Backend,
    state: &QueueState,
    sink: Sink<'_>,
    track: bool,
    packets: &'p [Packet],
) -> std::borrow::Cow<'p, [Packet]> {
    match sink {
        Sink::Handler(_) if track => state.waits.bracket(b, packets),
        _ => std::borrow::Cow::Borrowed(packets),
    }
}

/// What a traced dispatch's completion gives the tool layer: its counters, then its COMPLETE
/// record.
type Completion = Box<dyn FnOnce(&Backend) + Send>;

/// Holds the completions of one write's traced dispatches until the write's ENQUEUE EXIT was
/// delivered: docs/abi.md orders ENQUEUE ENTER, ENQUEUE EXIT, then COMPLETE, and a kernel may
/// finish while the submitting thread is still in the tool's ENQUEUE EXIT callbacks. Only the
/// tool's records wait: the application's signal is completed when the kernel finished (a tool
/// or a later packet of the same write may be waiting for it).
///
/// What waited is delivered on a completion thread of kreplay's own, as every other COMPLETE of
/// a dispatch run once is (kreplay.h, "Threads"), never on the submitting thread: that thread
/// may be inside the pass loop of the dispatch (where what a tool submits is re-entrant work,
/// declined `reentrant_dispatch`) or inside the queue's handler call (whose queue a replay the
/// callback starts must drain, and only that call writes its drain marker).
struct EnqueueGate(parking_lot::Mutex<Option<Vec<Completion>>>);

impl EnqueueGate {
    /// Delivers `completion` now (on the completion thread calling this) if the gate is open,
    /// or keeps it for [`OpenGate`].
    fn deliver(&self, b: &Backend, completion: Completion) {
        let mut parked = self.0.lock();
        match parked.as_mut() {
            Some(parked) => parked.push(completion),
            None => {
                drop(parked);
                completion(b);
            }
        }
    }
}

/// A gate kept closed by the thread that made it, opened when dropped (however the ENQUEUE
/// callbacks ended): what waited for it is handed, in order, to a completion thread. From its
/// making until what waited was delivered it counts in [`HELD`], which `OnUnload` waits for
/// ([`deliver_held`]): the application may have seen these kernels complete already.
struct OpenGate(std::sync::Arc<EnqueueGate>);

impl OpenGate {
    fn closed() -> OpenGate {
        HELD.count.fetch_add(1, Ordering::SeqCst);
        let _ = HELD_HERE.try_with(|h| h.set(h.get() + 1));
        OpenGate(std::sync::Arc::new(EnqueueGate(parking_lot::Mutex::new(
            Some(Vec::new()),
        ))))
    }
}

impl Drop for OpenGate {
    fn drop(&mut self) {
        let _ = HELD_HERE.try_with(|h| h.set(h.get().saturating_sub(1)));
        let parked = self.0.0.lock().take().unwrap_or_default();
        if parked.is_empty() {
            HELD.release();
            return;
        }
        // Where no completion thread can be started, the job runs on this one, calling the
        // tool: with the thread's cancellation held off (`crate::cancel`).
        let _no_cancel = crate::cancel::NoCancel::now();
        let b = crate::backend::backend();
        b.watcher.run_now(Box::new(move || {
            let b = crate::backend::backend();
            let _ = HELD_HERE.try_with(|h| h.set(h.get() + 1));
            for completion in parked {
                if catch_unwind(AssertUnwindSafe(|| completion(b))).is_err() {
                    log::error!("internal error while delivering a dispatch's completion");
                }
            }
            let _ = HELD_HERE.try_with(|h| h.set(h.get().saturating_sub(1)));
            HELD.release();
        }));
    }
}

/// Gates not opened yet, or whose held completions were not delivered yet.
struct Held {
    count: AtomicUsize,
    /// Threads in [`deliver_held`]: a release wakes them only when there are some.
    waiters: AtomicUsize,
    lock: parking_lot::Mutex<()>,
    released: parking_lot::Condvar,
}

static HELD: Held = Held {
    count: AtomicUsize::new(0),
    waiters: AtomicUsize::new(0),
    lock: parking_lot::Mutex::new(()),
    released: parking_lot::Condvar::new(),
};

thread_local! {
    /// The gates this thread keeps closed or delivers the completions of now: [`deliver_held`]
    /// on this thread does not wait for them.
    static HELD_HERE: Cell<usize> = const { Cell::new(0) };
}

impl Held {
    fn release(&self) {
        // Sequentially consistent with the waiter's count of itself and its look at `count`:
        // either it sees this release, or this sees it waiting and wakes it.
        self.count.fetch_sub(1, Ordering::SeqCst);
        if self.waiters.load(Ordering::SeqCst) > 0 {
            let _lock = self.lock.lock();
            self.released.notify_all();
        }
    }
}

/// The held completions' lock, for the fork set (`crate::fork`).
pub(crate) fn fork_lock() -> crate::fork::Lock<'static> {
    &HELD.lock
}

/// Waits, at most `limit`, until the completions gates held back reached the tool layer (the
/// ENQUEUE callbacks of other threads in progress now ended and the COMPLETE records and
/// counters they held were delivered): `OnUnload` calls it before the tools' contexts are
/// stopped, so that a kernel the application saw complete before it unloaded kreplay is not
/// missing its COMPLETE. False when some were still held at `limit`.
pub(crate) fn deliver_held(limit: std::time::Duration) -> bool {
    let deadline = std::time::Instant::now() + limit;
    let mine = HELD_HERE.try_with(Cell::get).unwrap_or(0);
    // Nothing held: no lock taken (in a forked child the lock may be a copy held by a thread
    // of the parent's).
    if HELD.count.load(Ordering::SeqCst) <= mine {
        return true;
    }
    HELD.waiters.fetch_add(1, Ordering::SeqCst);
    let mut lock = HELD.lock.lock();
    let mut delivered = true;
    while HELD.count.load(Ordering::SeqCst) > mine {
        if HELD.released.wait_until(&mut lock, deadline).timed_out() {
            delivered = HELD.count.load(Ordering::SeqCst) <= mine;
            break;
        }
    }
    drop(lock);
    HELD.waiters.fetch_sub(1, Ordering::SeqCst);
    delivered
}

/// In the child of a `fork`: the gates of the parent's other threads have nobody left to open
/// them. The forking thread's own (a tool forking from its ENQUEUE callback, or from a COMPLETE
/// callback delivering held records) stay counted: that thread opens them in the child too,
/// and each opening takes one off the count. Only atomics and this thread's own counter are
/// touched (async-signal-safe).
pub(crate) fn forget_held_in_child() {
    let mine = HELD_HERE.try_with(Cell::get).unwrap_or(0);
    HELD.count.store(mine, Ordering::SeqCst);
    HELD.waiters.store(0, Ordering::SeqCst);
}

/// What the completion handler of a traced ordinary dispatch needs.
struct TracedDispatch {
    proxy: hsa_signal_t,
    application: hsa_signal_t,
    agent: hsa_agent_t,
    info: DispatchInfo,
    counted: Option<crate::counting::Programmed>,
    gate: std::sync::Arc<EnqueueGate>,
}

unsafe extern "C" fn traced_complete(_value: hsa_signal_value_t, arg: *mut c_void) -> bool {
    // SAFETY: `arg` is the box leaked at registration; the handler runs once (returns false).
    let mut traced = unsafe { Box::from_raw(arg.cast::<TracedDispatch>()) };
    let result = catch_unwind(AssertUnwindSafe(|| {
        let b = backend();
        // Read from the proxy now (it goes away below), delivered after ENQUEUE EXIT.
        let counters = traced
            .counted
            .take()
            .and_then(|counted| crate::counting::read(b, counted, traced.proxy));
        let (start, end) = b
            .original
            .dispatch_time(traced.agent, traced.proxy)
            .unwrap_or((0, 0));
        let record = DispatchRecord {
            info: traced.info,
            pass: None,
            start_ns: b.nanos(start),
            end_ns: b.nanos(end),
        };
        traced.gate.deliver(
            b,
            Box::new(move |b: &Backend| {
                if let Some(counters) = counters {
                    counters.deliver(b);
                }
                b.hooks.dispatch_completed(&record);
            }),
        );
        if traced.application.handle != 0 {
            carry_timestamps(traced.proxy, traced.application);
            b.original.signal_subtract(traced.application, 1);
        }
        b.original.signal_destroy(traced.proxy);
    }));
    if result.is_err() {
        log::error!("internal error while completing a traced dispatch");
    }
    false
}

/// Gives each dispatch a completion signal of kreplay's own whose handler delivers the
/// dispatch record (through the returned gate, once it is open) and then completes the
/// application's signal. Returns the packets to write, the dispatches among them and their
/// gate, closed until dropped.
fn trace_completions(
    b: &Backend,
    state: &QueueState,
    packets: &[Packet],
    infos: &[Option<DispatchInfo>],
) -> (Vec<Packet>, Vec<DispatchInfo>, OpenGate) {
    let mut traced_infos = Vec::new();
    let gate = OpenGate::closed();
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
            // Its ENQUEUE records are delivered only where its COMPLETE can be: a dispatch
            // whose completion cannot be watched is forwarded untraced (it was ENQUEUEd and
            // never COMPLETEd), and said so.
            let untraced = |why: String| {
                b.hooks.warn_once(
                    "untraced_dispatch",
                    &format!(
                        "dispatch {} forwarded without KERNEL_DISPATCH records or counters: {why}",
                        info.dispatch_id
                    ),
                );
            };
            let Ok(proxy) = b.original.signal_create(1) else {
                untraced("kreplay could not create its completion signal".to_owned());
                return *packet;
            };
            let traced = Box::into_raw(Box::new(TracedDispatch {
                proxy,
                application: dispatch.completion_signal,
                agent: state.agent,
                info,
                counted: crate::counting::program(b, &info, None, proxy),
                gate: gate.0.clone(),
            }));
            let status = crate::watcher::when_zero(b, proxy, traced_complete, traced.cast());
            if status != HSA_STATUS_SUCCESS {
                // SAFETY: not registered, so the box is still ours.
                drop(unsafe { Box::from_raw(traced) });
                b.original.signal_destroy(proxy);
                untraced(format!("its completion handler was refused ({status:#x})"));
                return *packet;
            }
            traced_infos.push(info);
            dispatch.completion_signal = proxy;
            dispatch_bytes(&dispatch)
        })
        .collect();
    (patched, traced_infos, gate)
}

/// The head of ROCm's `amd_signal_t` (hsa/amd_hsa_signal.h), which a signal handle points to
/// (on ROCm, and on softhsa, which keeps the same layout): kreplay only moves the timestamps of
/// the last dispatch or async copy that completed a signal.
#[repr(C)]
struct AmdSignalHead {
    kind: i64,
    value: i64,
    event_mailbox_ptr: u64,
    event_id: u32,
    reserved1: u32,
    start_ts: u64,
    end_ts: u64,
}

/// `AMD_SIGNAL_KIND_USER`: every signal created with `hsa_signal_create`.
const AMD_SIGNAL_KIND_USER: i64 = 1;

/// Gives the application's completion signal `to` the timestamps that kreplay's own signal
/// `from` received (a pass's, a traced dispatch's or an async copy's proxy), so that
/// `hsa_amd_profiling_get_dispatch_time` (or `_get_async_copy_time`) on it reports one ordinary
/// run, as without kreplay.
/// Call before completing `to`: the completion's release publishes them. The raw timestamps
/// are copied, in the device's own time base, which the runtime converts when asked.
pub(crate) fn carry_timestamps(from: hsa_signal_t, to: hsa_signal_t) {
    if from.handle == 0 || to.handle == 0 {
        return;
    }
    let (from, to) = (
        from.handle as *const AmdSignalHead,
        to.handle as *mut AmdSignalHead,
    );
    // SAFETY: a signal handle is the address of the signal's `amd_signal_t`, live while the
    // signal is (both are: `from` was just waited for, `to` is still withheld from the
    // application); only user signals, whose kind says so, are touched. The timestamps are
    // 8-byte aligned words, accessed atomically as the runtime and the device do.
    unsafe {
        if std::ptr::read_volatile(&raw const (*from).kind) != AMD_SIGNAL_KIND_USER
            || std::ptr::read_volatile(&raw const (*to).kind) != AMD_SIGNAL_KIND_USER
        {
            return;
        }
        let word = |p: *const u64| &*p.cast::<std::sync::atomic::AtomicU64>();
        let start = word(&raw const (*from).start_ts).load(std::sync::atomic::Ordering::Acquire);
        let end = word(&raw const (*from).end_ts).load(std::sync::atomic::Ordering::Acquire);
        word(&raw const (*to).start_ts).store(start, std::sync::atomic::Ordering::Relaxed);
        word(&raw const (*to).end_ts).store(end, std::sync::atomic::Ordering::Release);
    }
}

pub(crate) fn dispatch_info(
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

impl std::fmt::Debug for dyn ToolHooks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ToolHooks")
    }
}
