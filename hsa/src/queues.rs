//! Application queues become intercept queues with kreplay's handler, and every queue kreplay
//! created is known per agent so a replay can drain its siblings (docs/abi.md §3 rule 5).

use std::cell::Cell;
use std::collections::{BTreeMap, HashMap};
use std::ffi::c_void;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU16, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::thread::LocalKey;
use std::time::Instant;

use hsa_sys::*;
use kreplay_drain::QueueView;
use parking_lot::{Condvar, Mutex};
use smallvec::SmallVec;

use crate::backend::{Backend, backend, guarded, installed};
use crate::dispatch::Packet;
use crate::original::forward;
use crate::waits::{Held, WaitLog};

/// One application queue as kreplay sees it.
///
/// Forwarded packets reach the hardware queue as the application wrote them: kreplay adds no
/// packet of its own to ordinary work, so kernels overlap as they would without it. A replay
/// finds out that a queue is idle by asking for a *drain marker*: a barrier-AND packet with the
/// barrier bit set (it completes once everything before it has completed) whose completion
/// signal is `in_flight`, which counts the markers asked for and not yet completed. On the
/// replaying queue and on side queues the replay writes the marker itself; on any other queue
/// it leaves the marker in the queue's mailbox, which whichever thread handles that queue
/// writes first (also while it waits for the agent's lock), and rings the queue with a wake-up
/// packet in case no thread is handling it (but for a queue it may not ring, see
/// [`QueueState::markers_ride_batches`], whose forwarded batches carry their markers).
pub(crate) struct QueueState {
    /// The queue the application sees (its `hsa_queue_t`).
    pub(crate) queue: *mut hsa_queue_t,
    /// The queue's id as the runtime reports it.
    pub(crate) id: u64,
    pub(crate) agent: hsa_agent_t,
    pub(crate) in_flight: hsa_signal_t,
    /// The doorbell signal of `queue` (the one the application stores to).
    pub(crate) doorbell: hsa_signal_t,
    /// A single-producer queue (`HSA_QUEUE_TYPE_SINGLE`): kreplay may not write into its ring
    /// as a second producer, so it cannot ring it for a drain marker. Such a queue instead gets
    /// its marker in the same write as every batch forwarded while a replay service is
    /// configured (its kernels then do not overlap each other).
    pub(crate) single_producer: bool,
    /// Set once a handler of someone else's (the application's, or a tools library's loaded
    /// after kreplay) was registered on the queue. ROCm calls the handler registered last
    /// first, so such handlers see every packet of the ring before kreplay's handler does: a
    /// wake-up packet would show them a packet the application never wrote, and one that holds
    /// packets back would hold the drain marker with it. Such a queue is never rung by kreplay:
    /// it gets its markers as a single-producer queue does.
    handled_above: AtomicBool,
    /// Packet slots reserved from inside a replay window on this thread or another, by index:
    /// these packets are re-entrant work and run on the agent's side queue (see
    /// [`Reentrant`]).
    reentrant: Mutex<BTreeMap<u64, Claim>>,
    /// Entries in `reentrant` (so the handler's check costs one load when there are none).
    reentrant_len: AtomicUsize,
    /// Packets kreplay needs in this queue's hardware queue (drain markers), written by the
    /// next thread that handles the queue, before anything else.
    mailbox: Mutex<Vec<Packet>>,
    /// Entries in `mailbox`.
    mailbox_len: AtomicUsize,
    /// Whether packets were forwarded since the last drain marker was asked for: a queue with
    /// none, whose last marker completed, is idle and needs no marker.
    dirty: AtomicBool,
    /// False once the application destroys the queue: no wake-up packet may be written into its
    /// ring any more (held while one is written).
    alive: Mutex<bool>,
    /// A side queue that was given re-entrant work (until then nothing of a tool's can be in
    /// flight on it, and waits for re-entrant work pass it by).
    carried_work: AtomicBool,
    /// The queue's error callback as kreplay installed it: whether the queue failed.
    errors: Arc<QueueErrors>,
    /// Barriers forwarded while their condition did not hold (see `crate::waits`).
    pub(crate) waits: WaitLog,
    /// Index of the application's ring up to which packets were forwarded: the ones from there
    /// on are not in the hardware queue yet (`crate::waits`).
    forwarded_to: AtomicU64,
    /// Where `forwarded_to` goes once the packets being forwarded are written.
    forwarding_to: AtomicU64,
    /// Handler calls of this queue made while a replay service is configured and not returned
    /// yet: such a call may last a whole replay (its own, or one it waits for), writing into
    /// the queue through the runtime's writer. `hsa_queue_destroy` waits for them.
    handlers: Mutex<usize>,
    /// Notified when `handlers` drops to 0.
    handlers_done: Condvar,
    /// What kreplay's handler was registered with for this queue (none for a side queue).
    handler_data: std::sync::OnceLock<&'static HandlerData>,
}

/// The data kreplay registers its handler with for one queue: the queue's state while the queue
/// exists. A handler call takes its own reference from here before it reads anything of the
/// queue's, so the state outlives every call that began before the destroy (one may be at its
/// very start while the destroy runs: on a doorbell thread of the runtime's, serving a drain
/// marker's wake-up); a call that finds none is of a destroyed queue. The runtime keeps the
/// pointer for as long as it may call the handler, so this is never freed: a few words per
/// queue ever created.
pub(crate) struct HandlerData(Mutex<Option<Arc<QueueState>>>);

impl HandlerData {
    /// Registers `state` as the queue's, for the rest of the process.
    fn leak(state: &Arc<QueueState>) -> &'static HandlerData {
        let data: &'static HandlerData =
            Box::leak(Box::new(HandlerData(Mutex::new(Some(state.clone())))));
        let _ = state.handler_data.set(data);
        data
    }

    /// The queue's state, unless the queue was destroyed.
    pub(crate) fn state(&self) -> Option<Arc<QueueState>> {
        self.0.lock().clone()
    }

    /// The queue is gone: handler calls that begin from now on find no state.
    fn forget(&self) {
        let state = self.0.lock().take();
        // Dropped outside the lock (the last reference destroys the queue's signals).
        drop(state);
    }
}

/// A queue's error callback as the application gave it, and the first error the runtime
/// reported for the queue. kreplay installs [`on_queue_error`] in its place, so that a replay
/// whose pass runs on a queue that failed (a kernel's memory fault) stops waiting for a
/// completion that will never come, instead of holding the agent for ever.
pub(crate) struct QueueErrors {
    callback: QueueErrorCallback,
    data: *mut c_void,
    /// The first error's status, 0 while there is none.
    status: AtomicU32,
}

// SAFETY: `data` is the application's opaque pointer, only handed back to its callback (as
// the runtime would, from any thread).
unsafe impl Send for QueueErrors {}
// SAFETY: as above; `status` is atomic.
unsafe impl Sync for QueueErrors {}

impl QueueErrors {
    pub(crate) fn new(callback: QueueErrorCallback, data: *mut c_void) -> Arc<QueueErrors> {
        Arc::new(QueueErrors {
            callback,
            data,
            status: AtomicU32::new(0),
        })
    }

    /// The data pointer to register with [`on_queue_error`] (alive as long as the `Arc`).
    fn as_data(self: &Arc<Self>) -> *mut c_void {
        Arc::as_ptr(self).cast_mut().cast()
    }

    /// The status of the first error the runtime reported for the queue, if any (or
    /// [`INACTIVATED`] once the application inactivated it).
    pub(crate) fn failed(&self) -> Option<hsa_status_t> {
        match self.status.load(Ordering::Acquire) {
            0 => None,
            status => Some(status),
        }
    }

    /// The application inactivated the queue: it runs nothing more, as after an error (the
    /// application's callback is not called: no error was reported).
    fn inactivated(&self) {
        let _ = self
            .status
            .compare_exchange(0, INACTIVATED, Ordering::AcqRel, Ordering::Acquire);
    }

    /// The queue was destroyed: it runs nothing more (see [`DESTROYED`]).
    fn destroyed(&self) {
        let _ = self
            .status
            .compare_exchange(0, DESTROYED, Ordering::AcqRel, Ordering::Acquire);
    }
}

/// What [`QueueErrors::failed`] says of a queue the application inactivated
/// (`hsa_queue_inactivate`), which reported no error.
pub(crate) const INACTIVATED: hsa_status_t = u32::MAX;

/// What [`QueueErrors::failed`] says of a queue destroyed while a handler call of it was in
/// progress on another thread (one kreplay could not wait for): nothing runs on it any more.
pub(crate) const DESTROYED: hsa_status_t = u32::MAX - 1;

/// The error callback kreplay registers for every queue it creates: notes the error, then
/// calls the application's callback with its own data, as the runtime would have.
///
/// # Safety
/// `data` is the pointer of a [`QueueErrors`] kept alive by its queue's [`QueueState`] (or by
/// the queue creation that registered it) while the queue exists.
unsafe extern "C" fn on_queue_error(
    status: hsa_status_t,
    source: *mut hsa_queue_t,
    data: *mut c_void,
) {
    // SAFETY: see the function's contract.
    let errors = unsafe { &*data.cast::<QueueErrors>() };
    // A success status would read as "no error": note it as a generic error instead.
    let noted = if status == HSA_STATUS_SUCCESS {
        HSA_STATUS_ERROR
    } else {
        status
    };
    let _ = errors
        .status
        .compare_exchange(0, noted, Ordering::AcqRel, Ordering::Acquire);
    if let Some(callback) = errors.callback {
        // SAFETY: the application's callback with the data it registered, as the runtime
        // would call it.
        unsafe { callback(status, source, errors.data) };
    }
}

/// What became of a packet slot reserved from inside a replay window.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Claim {
    /// Reserved; nobody has run the packet yet.
    Reserved,
    /// Run by the doorbell store that published it: the handler drops the slot when it gets it.
    Ran,
}

/// What the handler does with the packet at one index of its queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Slot {
    /// An application packet: handled as usual.
    Ordinary,
    /// Re-entrant work nobody ran yet: the handler runs it on the agent's side queue.
    Reentrant,
    /// Re-entrant work its doorbell store already ran: nothing more to do.
    AlreadyRan,
}

// SAFETY: `queue` is only used as an identity and handed back to the runtime, whose queue API is
// thread safe; the signal is a runtime handle usable from any thread.
unsafe impl Send for QueueState {}
// SAFETY: see `Send`; no interior state is mutated through `&QueueState`.
unsafe impl Sync for QueueState {}

impl Drop for QueueState {
    fn drop(&mut self) {
        // The last holder is gone (the registry forgot the queue and no drain waits on it):
        // nothing can reference the in-flight signal any more.
        if let Some(b) = crate::backend::installed() {
            b.original.signal_destroy(self.in_flight);
            if let Some(signal) = self.waits.take_signal() {
                b.original.signal_destroy(signal);
            }
        }
    }
}

impl QueueState {
    fn new(
        queue: *mut hsa_queue_t,
        agent: hsa_agent_t,
        in_flight: hsa_signal_t,
        errors: Arc<QueueErrors>,
    ) -> Self {
        // SAFETY: `queue` is a live queue the runtime just created.
        let (id, doorbell, type_) =
            unsafe { ((*queue).id, (*queue).doorbell_signal, (*queue).type_) };
        QueueState {
            queue,
            id,
            agent,
            in_flight,
            doorbell,
            single_producer: type_ == HSA_QUEUE_TYPE_SINGLE,
            handled_above: AtomicBool::new(false),
            reentrant: Mutex::new(BTreeMap::new()),
            reentrant_len: AtomicUsize::new(0),
            mailbox: Mutex::new(Vec::new()),
            mailbox_len: AtomicUsize::new(0),
            dirty: AtomicBool::new(false),
            alive: Mutex::new(true),
            carried_work: AtomicBool::new(false),
            errors,
            waits: WaitLog::default(),
            forwarded_to: AtomicU64::new(0),
            forwarding_to: AtomicU64::new(0),
            handlers: Mutex::new(0),
            handlers_done: Condvar::new(),
            handler_data: std::sync::OnceLock::new(),
        }
    }

    /// Counts a handler call of this queue that may last (see `handlers`) until the returned
    /// guard is dropped, on this thread.
    pub(crate) fn handler_call(&self, writer: crate::dispatch::Writer) -> HandlerCall<'_> {
        *self.handlers.lock() += 1;
        let _ = HANDLING.try_with(|h| {
            h.borrow_mut().push(Handling {
                queue: self.queue as usize,
                state: self,
                writer,
            })
        });
        HandlerCall {
            state: self,
            _not_send: std::marker::PhantomData,
        }
    }

    /// Waits until no handler call of this queue is in progress.
    fn wait_for_handlers(&self) {
        let mut handlers = self.handlers.lock();
        while *handlers > 0 {
            self.handlers_done.wait(&mut handlers);
        }
    }

    /// The status of the first error the runtime reported for this queue, if any (a queue
    /// that failed runs nothing more).
    pub(crate) fn failed(&self) -> Option<hsa_status_t> {
        self.errors.failed()
    }

    /// Notes that re-entrant work is about to be submitted to this side queue.
    pub(crate) fn note_side_work(&self) {
        if !self.carried_work.load(Ordering::Relaxed) {
            self.carried_work.store(true, Ordering::Release);
        }
    }

    /// Notes that packets are being forwarded to this queue's hardware queue.
    pub(crate) fn mark_dirty(&self) {
        if !self.dirty.load(Ordering::Relaxed) {
            self.dirty.store(true, Ordering::Release);
        }
    }

    /// Whether kreplay must not ring this queue for a drain marker (a single-producer queue, or
    /// one with handlers registered after kreplay's): forwarded batches then carry their
    /// markers, and a drain leaves the rest in the mailbox.
    pub(crate) fn markers_ride_batches(&self) -> bool {
        self.single_producer || self.handled_above.load(Ordering::Acquire)
    }

    /// Whether a drain must ask this queue for a marker: it forwarded something since the last
    /// one, or that one has not completed. Clears the mark (the marker asked for next covers
    /// what was forwarded). Called under the agent's writer side, so no forward runs meanwhile.
    pub(crate) fn needs_drain_marker(&self, b: &Backend) -> bool {
        let forwarded = self.dirty.swap(false, Ordering::AcqRel);
        forwarded || b.original.signal_load(self.in_flight) != 0
    }

    /// Drain markers asked for on this queue and not completed.
    pub(crate) fn markers_in_flight(&self, b: &Backend) -> i64 {
        b.original.signal_load(self.in_flight)
    }

    /// For a queue kreplay does not ring ([`markers_ride_batches`](Self::markers_ride_batches)):
    /// whether batches were forwarded without a marker since a drain last asked (clears the
    /// mark); if so, leaves a marker in the mailbox, which the queue's own thread writes when it
    /// next handles the queue or waits for the agent's lock.
    pub(crate) fn mail_marker_if_unmarked(&self, b: &Backend) -> bool {
        if !self.dirty.swap(false, Ordering::AcqRel) {
            return false;
        }
        let alive = self.alive.lock();
        if *alive {
            self.post(self.drain_marker(b));
        }
        true
    }

    /// Whether kreplay left packets for this queue's hardware queue (one load).
    pub(crate) fn has_mail(&self) -> bool {
        self.mailbox_len.load(Ordering::Acquire) > 0
    }

    /// Takes the packets kreplay left for this queue.
    pub(crate) fn take_mail(&self) -> Vec<Packet> {
        let mut mailbox = self.mailbox.lock();
        self.mailbox_len.store(0, Ordering::Release);
        std::mem::take(&mut *mailbox)
    }

    fn post(&self, packet: Packet) {
        let mut mailbox = self.mailbox.lock();
        mailbox.push(packet);
        self.mailbox_len.store(mailbox.len(), Ordering::Release);
    }

    /// The drain marker of this queue, counted in `in_flight` (the caller writes it).
    pub(crate) fn drain_marker(&self, b: &Backend) -> Packet {
        b.original.signal_add(self.in_flight, 1);
        let marker = self.marker();
        // SAFETY: a barrier-AND packet is 64 bytes of plain data, like every AQL packet.
        Packet::from_bytes(unsafe {
            std::mem::transmute::<hsa_barrier_and_packet_t, [u8; 64]>(marker)
        })
    }

    /// Asks for a drain marker on this queue (not the one being handled on this thread, not a
    /// side queue): into the mailbox, then a wake-up packet into the application's ring (as one
    /// more producer) so that some thread handles the queue even if none does now. Without a
    /// free slot before `deadline` no wake-up is written: the thread that keeps the ring full
    /// writes the marker when it next handles the queue or waits for the agent's lock.
    pub(crate) fn request_drain_marker(&self, b: &Backend, deadline: Instant) {
        let alive = self.alive.lock();
        if !*alive {
            return;
        }
        self.post(self.drain_marker(b));
        // SAFETY: `queue` is live while registered; size and base describe its ring.
        let (base, size) = unsafe { ((*self.queue).base_address, (*self.queue).size) };
        // A slot is reserved only where the ring has room at the write index seen: another
        // producer taking the last slot in between moves the write index, and the check is made
        // again, so this never waits for room past `deadline`.
        let index = loop {
            // Adding 0 reads the write index.
            let write = b.original.queue_add_write_index(self.queue, 0);
            let full = write.saturating_sub(b.original.queue_load_read_index(self.queue))
                >= u64::from(size);
            if !self.has_mail() {
                // A thread handling the queue took the marker already.
                return;
            }
            if !full {
                match b.original.queue_cas_write_index(self.queue, write) {
                    Some(seen) if seen == write => break write,
                    // Without the entry the marker waits in the mailbox for the queue's thread.
                    None => return,
                    Some(_) => {}
                }
            }
            if Instant::now() >= deadline {
                // Out of time: the thread that keeps the ring full writes the marker.
                return;
            }
            if full {
                std::thread::yield_now();
            }
        };
        let slot = (base as usize + (index % u64::from(size)) as usize * 64) as *mut u8;
        write_slot(slot, &wake_up_packet());
        b.original
            .signal_store_screlease(self.doorbell, index as i64);
    }

    /// Whether any slot of this queue is re-entrant work (one relaxed load).
    pub(crate) fn has_reentrant(&self) -> bool {
        self.reentrant_len.load(Ordering::Acquire) > 0
    }

    /// Records slots `first..first + count` as reserved from inside a replay window.
    fn reserve_reentrant(&self, first: u64, count: u64) {
        let mut map = self.reentrant.lock();
        for index in first..first.saturating_add(count) {
            map.insert(index, Claim::Reserved);
        }
        self.reentrant_len.store(map.len(), Ordering::Release);
    }

    /// Takes the slot at `index` for the handler: says what to do with its packet.
    pub(crate) fn take_slot(&self, index: u64) -> Slot {
        let mut map = self.reentrant.lock();
        let slot = match map.remove(&index) {
            None => Slot::Ordinary,
            Some(Claim::Reserved) => Slot::Reentrant,
            Some(Claim::Ran) => Slot::AlreadyRan,
        };
        self.reentrant_len.store(map.len(), Ordering::Release);
        slot
    }

    /// Claims for the doorbell store the published, not yet handled re-entrant packets at
    /// indices up to `last`, in index order.
    fn claim_published(&self, last: u64) -> Vec<Packet> {
        let mut map = self.reentrant.lock();
        self.while_alive(|| {
            let mut claimed = Vec::new();
            for (&index, claim) in map.range_mut(..=last) {
                if *claim != Claim::Reserved {
                    continue;
                }
                let Some(packet) = self.published(index) else {
                    // Not written yet: whoever handles the slot later runs it.
                    continue;
                };
                *claim = Claim::Ran;
                claimed.push(packet);
            }
            claimed
        })
        .unwrap_or_default()
    }

    /// Runs `f`, which reads the queue's `hsa_queue_t` or ring, unless the application
    /// destroyed the queue: both went away with it (a drain may still hold the queue's state).
    /// Holds `alive`, so a destroy waits until `f` is done before the runtime frees them.
    fn while_alive<R>(&self, f: impl FnOnce() -> R) -> Option<R> {
        let alive = self.alive.lock();
        (*alive).then(f)
    }

    /// The published packets of the ring from index `first` on, with their indices (see
    /// [`published_after`](Self::published_after)); none once the queue is destroyed.
    fn published_from(&self, b: &Backend, first: u64) -> Vec<(u64, Packet)> {
        self.while_alive(|| {
            // SAFETY: `queue` is live: `alive` is held, and a destroy clears it before the
            // runtime frees the queue.
            let size = u64::from(unsafe { (*self.queue).size });
            // Adding 0 reads the write index.
            let write = b.original.queue_add_write_index(self.queue, 0);
            (first..write.min(first.saturating_add(size)))
                .map_while(|index| self.published(index).map(|p| (index, p)))
                .collect()
        })
        .unwrap_or_default()
    }

    /// Notes that the packets the handler forwards next end before ring index `next` (only the
    /// thread handling the queue calls this; [`forwarded`](Self::forwarded) commits it).
    pub(crate) fn will_forward(&self, next: u64) {
        self.forwarding_to.store(next, Ordering::Release);
    }

    /// The packets announced by [`will_forward`](Self::will_forward) reached the hardware
    /// queue: called while the agent's reader side is held, so that a replay, which holds the
    /// writer side, sees them either not forwarded and not counted, or both.
    pub(crate) fn forwarded(&self) {
        self.note_forwarded(self.forwarding_to.load(Ordering::Acquire));
    }

    /// Notes that the packets before ring index `next` are past: forwarded, or never the
    /// application's queue's to forward.
    pub(crate) fn note_forwarded(&self, next: u64) {
        self.forwarded_to.fetch_max(next, Ordering::AcqRel);
    }

    /// The application's packets published in this queue's ring and not forwarded: while a
    /// replay holds the queue's agent none of them can reach the hardware queue (forwarding
    /// waits for the agent's lock), but for re-entrant work, which is left out.
    pub(crate) fn unforwarded(&self, b: &Backend) -> Vec<Packet> {
        self.published_after(b, self.forwarded_to.load(Ordering::Acquire))
    }

    /// The application's packets published in this queue's ring from index `from` on, up to
    /// the first slot not published yet (at most one ring's worth), but for re-entrant work
    /// (which runs on the side queue whenever it is published).
    pub(crate) fn published_after(&self, b: &Backend, from: u64) -> Vec<Packet> {
        let reentrant = self.reentrant.lock();
        self.published_from(b, from)
            .into_iter()
            .filter(|(index, _)| !reentrant.contains_key(index))
            .map(|(_, packet)| packet)
            .collect()
    }

    /// The packet at `index` of the application's ring, once its header says it is valid.
    /// Called inside [`while_alive`](Self::while_alive) only.
    fn published(&self, index: u64) -> Option<Packet> {
        // SAFETY: `queue` is live (the caller holds `alive`, set); base and size describe its
        // ring.
        let (base, size) = unsafe { ((*self.queue).base_address, (*self.queue).size) };
        if base.is_null() || size == 0 {
            return None;
        }
        let slot = (base as usize + (index % u64::from(size)) as usize * 64) as *const u8;
        // SAFETY: the slot is 64-byte aligned inside the ring; the header is read atomically
        // (acquire) as the packet processor reads it, which makes the body written before it
        // visible.
        let header = unsafe { &*slot.cast::<AtomicU16>() }.load(Ordering::Acquire);
        if u32::from(header & 0xff) == HSA_PACKET_TYPE_INVALID {
            return None;
        }
        let mut bytes = [0u8; 64];
        // SAFETY: 64 readable bytes of the published slot; the producer no longer writes it.
        unsafe { std::ptr::copy_nonoverlapping(slot, bytes.as_mut_ptr(), 64) };
        Some(Packet::from_bytes(bytes))
    }

    /// A marker that completes when everything forwarded before it has completed.
    pub(crate) fn marker(&self) -> hsa_barrier_and_packet_t {
        hsa_barrier_and_packet_t {
            header: barrier_header(),
            completion_signal: self.in_flight,
            ..Default::default()
        }
    }
}

/// Header of a barrier-AND packet with the barrier bit and system-scope fences.
pub(crate) fn barrier_header() -> u16 {
    ((HSA_PACKET_TYPE_BARRIER_AND << HSA_PACKET_HEADER_TYPE)
        | (1 << HSA_PACKET_HEADER_BARRIER)
        | (HSA_FENCE_SCOPE_SYSTEM << HSA_PACKET_HEADER_SCACQUIRE_FENCE_SCOPE)
        | (HSA_FENCE_SCOPE_SYSTEM << HSA_PACKET_HEADER_SCRELEASE_FENCE_SCOPE)) as u16
}

/// [`QueueView`] over a queue's in-flight signal, waiting with a blocking signal wait.
pub(crate) struct QueueIdle<'a> {
    pub(crate) backend: &'a Backend,
    pub(crate) state: &'a QueueState,
    /// The signals the replay that drains holds back, as of now (`crate::waits`: they only
    /// grow while it holds its agents, as the application queues packets it holds back).
    pub(crate) held: &'a dyn Fn() -> Held,
    /// The queue the replayed dispatch is on: its passes go in behind whatever the queue is
    /// parked at, so a queue parked at a barrier is not idle to it; parked at one that cannot
    /// open before the replay ends ([`parked_for_good`](Self::parked_for_good)), it never will
    /// be.
    pub(crate) dispatch_queue: bool,
}

impl QueueIdle<'_> {
    /// Whether the queue is parked at a barrier that cannot open while the replay holds its
    /// signals back (`crate::waits`).
    pub(crate) fn parked_for_good(&self) -> bool {
        self.state.waits.has_open() && self.state.waits.parked(self.backend, &(self.held)())
    }
}

impl QueueView for QueueIdle<'_> {
    fn id(&self) -> u64 {
        self.state.id
    }

    /// A queue that failed runs nothing more: idle, whatever it was given. So is one parked
    /// at a barrier that cannot open before the replay ends (`crate::waits`), but for the
    /// dispatch's own queue, whose passes would wait behind that barrier.
    fn is_idle(&self) -> bool {
        self.state.failed().is_some()
            || self.backend.original.signal_load(self.state.in_flight) == 0
            || (!self.dispatch_queue && self.parked_for_good())
    }

    fn wait_idle(&self, deadline: Instant) -> bool {
        // In slices, so that a queue failing meanwhile is not waited for to the deadline.
        loop {
            if self.is_idle() {
                return true;
            }
            // The dispatch's own queue parked for good: no pass of it could ever start, so
            // waiting out the deadline gains nothing.
            if self.dispatch_queue && self.parked_for_good() {
                return false;
            }
            let now = Instant::now();
            if now >= deadline {
                return false;
            }
            // A queue with a bracketed barrier may park at it: looked at more often.
            let slice = if !self.state.waits.has_open() {
                std::time::Duration::from_millis(20)
            } else {
                std::time::Duration::from_millis(1)
            };
            let slice = (now + slice).min(deadline);
            if self.backend.wait_signal_zero(self.state.in_flight, slice) {
                return true;
            }
        }
    }
}

/// Queues kreplay created, per agent.
#[derive(Default)]
pub(crate) struct QueueRegistry {
    by_agent: Mutex<HashMap<u64, Vec<Arc<QueueState>>>>,
    /// kreplay's own side queue per agent, where re-entrant work runs (created on first use;
    /// also listed in `by_agent`, so drains wait for it).
    side: Mutex<HashMap<u64, Arc<QueueState>>>,
}

impl QueueRegistry {
    /// The registry's locks for the fork set (`crate::fork`), in its order: side queues (held
    /// while one is created and added), then queues by agent.
    pub(crate) fn fork_locks(&self) -> [crate::fork::Lock<'_>; 2] {
        [&self.side, &self.by_agent]
    }

    /// The application queue whose doorbell signal is `doorbell`.
    fn by_doorbell(&self, doorbell: hsa_signal_t) -> Option<Arc<QueueState>> {
        self.by_agent
            .lock()
            .values()
            .flatten()
            .find(|s| s.doorbell.handle == doorbell.handle)
            .cloned()
    }

    /// The application queue `queue`.
    fn by_queue(&self, queue: *const hsa_queue_t) -> Option<Arc<QueueState>> {
        self.by_agent
            .lock()
            .values()
            .flatten()
            .find(|s| std::ptr::eq(s.queue, queue))
            .cloned()
    }

    /// Whether `queue` is a side queue.
    pub(crate) fn is_side(&self, queue: &QueueState) -> bool {
        self.side
            .lock()
            .values()
            .any(|s| std::ptr::eq(Arc::as_ptr(s), queue))
    }

    /// Every side queue that was given re-entrant work so far (the others hold only kreplay's
    /// own markers, so nothing of a tool's can be in flight on them).
    pub(crate) fn sides(&self) -> Vec<Arc<QueueState>> {
        self.side
            .lock()
            .values()
            .filter(|s| s.carried_work.load(Ordering::Acquire))
            .cloned()
            .collect()
    }

    /// Creates the side queue of every agent that has queues of the application's, so that
    /// re-entrant work issued during a replay always has a queue to run on: called before a
    /// replay's snapshot, where a failure is a decline rather than lost work. Returns the agent
    /// whose side queue could not be created.
    pub(crate) fn ensure_sides(&self, b: &Backend) -> Result<(), hsa_agent_t> {
        let agents: Vec<hsa_agent_t> = self
            .by_agent
            .lock()
            .values()
            .filter_map(|list| list.first().map(|s| s.agent))
            .collect();
        for agent in agents {
            if self.side(b, agent).is_none() {
                return Err(agent);
            }
        }
        Ok(())
    }

    /// The side queue of `agent`, created on first use.
    pub(crate) fn side(&self, b: &Backend, agent: hsa_agent_t) -> Option<Arc<QueueState>> {
        let mut side = self.side.lock();
        if let Some(state) = side.get(&agent.handle) {
            return Some(state.clone());
        }
        let in_flight = b.original.signal_create(0).ok()?;
        let errors = QueueErrors::new(None, std::ptr::null_mut());
        let mut queue: *mut hsa_queue_t = std::ptr::null_mut();
        // Threads the runtime starts for kreplay's queue start as kreplay's own do, with the
        // application's asynchronous signals blocked (`kreplay_wtrack::threads`).
        let status = kreplay_wtrack::threads::with_async_signals_blocked(|| {
            b.original.queue_create(
                agent,
                SIDE_QUEUE_SIZE,
                HSA_QUEUE_TYPE_MULTI,
                Some(on_queue_error),
                errors.as_data(),
                0,
                0,
                &raw mut queue,
            )
        });
        if status != HSA_STATUS_SUCCESS || queue.is_null() {
            b.original.signal_destroy(in_flight);
            return None;
        }
        b.original.set_profiler_enabled(queue, true);
        let state = Arc::new(QueueState::new(queue, agent, in_flight, errors));
        side.insert(agent.handle, state.clone());
        self.add(state.clone());
        Some(state)
    }

    /// Every queue on `agent` (the caller's own included).
    pub(crate) fn on_agent(&self, agent: u64) -> Vec<Arc<QueueState>> {
        self.by_agent
            .lock()
            .get(&agent)
            .cloned()
            .unwrap_or_default()
    }

    fn add(&self, state: Arc<QueueState>) {
        self.by_agent
            .lock()
            .entry(state.agent.handle)
            .or_default()
            .push(state);
    }

    /// The state of the application's queue `queue`, if kreplay made it.
    fn get(&self, queue: *mut hsa_queue_t) -> Option<Arc<QueueState>> {
        self.by_agent
            .lock()
            .values()
            .flat_map(|list| list.iter())
            .find(|s| s.queue == queue)
            .cloned()
    }

    fn remove(&self, queue: *mut hsa_queue_t) -> Option<Arc<QueueState>> {
        let mut map = self.by_agent.lock();
        for list in map.values_mut() {
            if let Some(i) = list.iter().position(|s| s.queue == queue) {
                return Some(list.swap_remove(i));
            }
        }
        None
    }
}

type QueueErrorCallback = Option<unsafe extern "C" fn(hsa_status_t, *mut hsa_queue_t, *mut c_void)>;

/// The arguments `hsa_queue_create` and `hsa_amd_queue_intercept_create` both take.
#[derive(Clone, Copy)]
struct QueueRequest {
    agent: hsa_agent_t,
    size: u32,
    type_: hsa_queue_type32_t,
    callback: QueueErrorCallback,
    data: *mut c_void,
    private_segment_size: u32,
    group_segment_size: u32,
    /// Where the runtime writes the new queue.
    queue: *mut *mut hsa_queue_t,
}

/// Which of the runtime's two queue-creating entries a call is for.
#[derive(Clone, Copy)]
enum Creator {
    /// `hsa_queue_create`: a plain queue.
    Queue,
    /// `hsa_amd_queue_intercept_create`: an intercept queue.
    InterceptQueue,
}

impl Creator {
    /// Calls the runtime's own entry with `request` as it is.
    fn call_original(self, b: &Backend, request: QueueRequest) -> hsa_status_t {
        let QueueRequest {
            agent,
            size,
            type_,
            callback,
            data,
            private_segment_size,
            group_segment_size,
            queue,
        } = request;
        let create = match self {
            Creator::Queue => crate::original::Original::queue_create,
            Creator::InterceptQueue => crate::original::Original::intercept_create,
        };
        create(
            &b.original,
            agent,
            size,
            type_,
            callback,
            data,
            private_segment_size,
            group_segment_size,
            queue,
        )
    }
}

/// What both queue-creating wrappers do: once kreplay is finalized, the runtime's own entry
/// (`creator`); before, an intercept queue kreplay knows ([`create_intercepted`]), whichever
/// entry the application called.
fn create_queue(creator: Creator, request: QueueRequest) -> hsa_status_t {
    guarded(|| {
        let b = backend();
        if b.is_finalized() {
            return creator.call_original(b, request);
        }
        create_intercepted(b, request)
    })
}

/// Wrapper of `hsa_queue_create`: the application gets an intercept queue whose packets reach
/// kreplay's handler before the hardware queue.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe extern "C" fn queue_create(
    agent: hsa_agent_t,
    size: u32,
    type_: hsa_queue_type32_t,
    callback: QueueErrorCallback,
    data: *mut c_void,
    private_segment_size: u32,
    group_segment_size: u32,
    queue: *mut *mut hsa_queue_t,
) -> hsa_status_t {
    let request = QueueRequest {
        agent,
        size,
        type_,
        callback,
        data,
        private_segment_size,
        group_segment_size,
        queue,
    };
    create_queue(Creator::Queue, request)
}

/// Wrapper of `hsa_amd_queue_intercept_create`: the application (or a tools library loaded
/// after kreplay, which makes the application's queues this way) gets an intercept queue
/// kreplay knows, exactly as from `hsa_queue_create`. Handlers it registers on the queue are
/// registered after kreplay's, and ROCm (and softhsa) calls the last one registered first, so
/// kreplay's handler sees what they pass on and they never see its passes
/// ([`intercept_register`]). Without
/// this, the queue's kernels were unknown to every replay of their agent: not drained before
/// its snapshot, not held off during it, and their writes undone by its restores.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe extern "C" fn intercept_create(
    agent: hsa_agent_t,
    size: u32,
    type_: hsa_queue_type32_t,
    callback: QueueErrorCallback,
    data: *mut c_void,
    private_segment_size: u32,
    group_segment_size: u32,
    queue: *mut *mut hsa_queue_t,
) -> hsa_status_t {
    let request = QueueRequest {
        agent,
        size,
        type_,
        callback,
        data,
        private_segment_size,
        group_segment_size,
        queue,
    };
    create_queue(Creator::InterceptQueue, request)
}

/// Wrapper of `hsa_amd_queue_intercept_register`: a handler registered on one of kreplay's
/// queues is called, as ROCm orders handlers, before kreplay's, with every packet of the
/// application's ring. kreplay stops ringing that queue for drain markers (a wake-up packet
/// would reach the handler, which may count, rewrite or hold it back): its forwarded batches
/// carry their markers instead, as a single-producer queue's do.
pub(crate) unsafe extern "C" fn intercept_register(
    queue: *mut hsa_queue_t,
    handler: hsa_amd_queue_intercept_handler,
    data: *mut c_void,
) -> hsa_status_t {
    guarded(|| {
        let b = backend();
        let status = b.original.intercept_register(queue, handler, data);
        if status == HSA_STATUS_SUCCESS
            && let Some(state) = b.queues.by_queue(queue)
        {
            state.handled_above.store(true, Ordering::Release);
        }
        status
    })
}

/// An intercept queue with kreplay's handler and error callback, known to the registry, made
/// for `request` (whose error callback kreplay's calls).
fn create_intercepted(b: &Backend, request: QueueRequest) -> hsa_status_t {
    if request.queue.is_null() {
        return HSA_STATUS_ERROR_INVALID_ARGUMENT;
    }
    let in_flight = match b.original.signal_create(0) {
        Ok(s) => s,
        Err(status) => return status,
    };
    let errors = QueueErrors::new(request.callback, request.data);
    let ours = QueueRequest {
        callback: Some(on_queue_error),
        data: errors.as_data(),
        ..request
    };
    let status = Creator::InterceptQueue.call_original(b, ours);
    if status != HSA_STATUS_SUCCESS {
        b.original.signal_destroy(in_flight);
        return status;
    }
    // SAFETY: the runtime wrote a valid queue pointer through the caller's out pointer.
    let q = unsafe { *request.queue };
    let state = Arc::new(QueueState::new(q, request.agent, in_flight, errors));
    // Per-pass timestamps for dispatch records; harmless for the application.
    b.original.set_profiler_enabled(q, true);
    let data = HandlerData::leak(&state);
    let status = b.original.intercept_register(
        q,
        Some(crate::dispatch::intercept_handler),
        std::ptr::from_ref(data).cast_mut().cast(),
    );
    if status != HSA_STATUS_SUCCESS {
        b.original.queue_destroy(q);
        data.forget();
        // `state` owns `in_flight`: dropping it destroys the signal.
        return status;
    }
    b.queues.add(state);
    HSA_STATUS_SUCCESS
}

/// Wrapper of `hsa_queue_destroy`: forgets the queue, waits for handler calls of the queue
/// still in progress (a replay of its dispatch, or a wait for its agent's lock), then destroys
/// it and its signal.
pub(crate) unsafe extern "C" fn queue_destroy(queue: *mut hsa_queue_t) -> hsa_status_t {
    guarded(|| {
        let b = backend();
        if crate::backend::forked_child() {
            return destroy_in_forked_child(b, queue);
        }
        let state = b.queues.remove(queue);
        if let Some(state) = &state {
            // No drain may ring it from now on, and markers still in its mailbox will never be
            // written: count them as done so that no drain waits for them.
            *state.alive.lock() = false;
            for _ in state.take_mail() {
                b.original.signal_subtract(state.in_flight, 1);
            }
            // A handler call in progress still submits through the queue (the passes of the
            // dispatch it replays) and reads its state: the queue must outlive it. Without
            // kreplay the doorbell store would have returned long ago and the destroy found the
            // dispatch in flight, its results undefined; here the dispatch completes first.
            // Not from a handler of this queue or a tool callback (a replay this very thread
            // runs, which could not end while it waits): the state is kept below instead. (In
            // the child of a fork, where the calls counted were the parent's other threads',
            // `destroy_in_forked_child` waits for none.)
            if !handling(queue) && !in_tool_callbacks() {
                DESTROYS_WAITING.fetch_add(1, Ordering::SeqCst);
                state.wait_for_handlers();
                DESTROYS_WAITING.fetch_sub(1, Ordering::SeqCst);
            }
        }
        let status = b.original.queue_destroy(queue);
        if let Some(state) = state {
            if status == HSA_STATUS_SUCCESS {
                // The queue is gone, with whatever markers it still held: nothing is in flight
                // on it any more. Zero the signal so that a drain waiting on it goes on now; the
                // signal itself is destroyed with the last `Arc` (a drain may still hold one).
                b.original.signal_store_screlease(state.in_flight, 0);
                // A handler call not waited for above (this thread's own, another thread's
                // that may wait for the replay this thread is in, or one still at its start)
                // holds `state` of its own until it returns; later ones find none. Its replay
                // must not wait for passes on a queue that is gone: the queue counts as failed.
                state.errors.destroyed();
                if let Some(data) = state.handler_data.get() {
                    data.forget();
                }
            } else {
                // The runtime kept the queue: the application may go on using it, so drains
                // must go on seeing it, ringing it and mailing it markers. The markers dropped
                // above were counted as done: the queue counts as having forwarded work since
                // its last marker, so that the next drain asks it for a new one.
                *state.alive.lock() = true;
                state.mark_dirty();
                b.queues.add(state);
            }
        }
        status
    })
}

/// [`queue_destroy`] in the child of a fork. The queue's own locks (its liveness, its mailbox,
/// its handler count) are not in the fork set (`crate::fork`): a thread of the parent's, which
/// does not exist here, may have held one at the fork (a replay's drain ringing the queue holds
/// its liveness while it waits for room in the ring), so none is taken. Nothing here needs
/// them: no drain runs in the child (it is finalized), the handler calls counted were the
/// parent's, and the state of a queue of the parent's is kept for good rather than dropped
/// (the parent's handler calls reached it through a plain pointer, and the forking thread may
/// be inside one of them).
fn destroy_in_forked_child(b: &Backend, queue: *mut hsa_queue_t) -> hsa_status_t {
    let state = b.queues.remove(queue);
    let status = b.original.queue_destroy(queue);
    if let Some(state) = state {
        if status == HSA_STATUS_SUCCESS {
            state.errors.destroyed();
            std::mem::forget(state);
        } else {
            // The runtime kept the queue: it stays known, as in the parent.
            b.queues.add(state);
        }
    }
    status
}

/// Wrapper of `hsa_queue_inactivate`: the queue's packet processor stops and what is pending
/// on it is aborted, so a replay whose pass runs on it (another thread's handler call) must not
/// wait for that pass: the queue counts as failed from now on, as after an error.
pub(crate) unsafe extern "C" fn queue_inactivate(queue: *mut hsa_queue_t) -> hsa_status_t {
    guarded(|| {
        let b = backend();
        let status = forward!(b, core.hsa_queue_inactivate_fn(queue));
        if status == HSA_STATUS_SUCCESS
            && let Some(state) = b.queues.get(queue)
        {
            state.errors.inactivated();
        }
        status
    })
}

/// Wrapper of `hsa_amd_profiling_set_profiler_enabled`. kreplay turns dispatch timestamps on
/// for every queue it intercepts: each pass's record, each traced dispatch's record and the
/// application's own signal (`crate::dispatch::carry_timestamps`) take their times from them.
/// An application turning them off on such a queue would leave every one of those at 0, so
/// there they stay on (the application's signals then carry times where it asked for none,
/// which it does not read); other queues get the application's answer.
pub(crate) unsafe extern "C" fn set_profiler_enabled(
    queue: *mut hsa_queue_t,
    enable: std::ffi::c_int,
) -> hsa_status_t {
    guarded(|| {
        let b = backend();
        let enable = if enable == 0 && b.queues.get(queue).is_some() {
            1
        } else {
            enable
        };
        forward!(
            b,
            amd.hsa_amd_profiling_set_profiler_enabled_fn(queue, enable)
        )
    })
}

/// `hsa_queue_destroy` calls waiting for handler calls of their queue now.
static DESTROYS_WAITING: AtomicUsize = AtomicUsize::new(0);

/// How many `hsa_queue_destroy` calls wait for a handler call of their queue now (tests).
pub(crate) fn destroys_waiting() -> usize {
    DESTROYS_WAITING.load(Ordering::SeqCst)
}

/// Slots of a side queue (kreplay's own queue per agent for re-entrant work).
const SIDE_QUEUE_SIZE: u32 = 256;

/// Writes `packets` into kreplay's side queue `side` (a plain runtime queue, no intercept) as
/// one more producer: reserve, wait for room, body, header last with release order, doorbell.
pub(crate) fn submit_side(b: &Backend, side: &QueueState, packets: &[Packet]) {
    // SAFETY: the side queue lives as long as the backend; size and base describe its ring.
    let (base, size) = unsafe { ((*side.queue).base_address, (*side.queue).size) };
    for packet in packets {
        let index = b.original.queue_add_write_index(side.queue, 1);
        while index.saturating_sub(b.original.queue_load_read_index(side.queue)) >= u64::from(size)
        {
            std::thread::yield_now();
        }
        let slot = (base as usize + (index % u64::from(size)) as usize * 64) as *mut u8;
        write_slot(slot, packet);
        b.original
            .signal_store_screlease(side.doorbell, index as i64);
    }
}

/// Writes `packet` into a ring slot this producer reserved and that is free: the body first,
/// then the header with release order.
fn write_slot(slot: *mut u8, packet: &Packet) {
    let bytes = packet.bytes();
    // SAFETY: the caller owns the 64-byte slot (reserved, and the read index passed it); bytes
    // 2..64 are the body, written before the header publishes them.
    unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr().add(2), slot.add(2), 62) };
    // SAFETY: the slot is 64-byte aligned, so its first two bytes are an aligned u16 that the
    // packet processor reads atomically.
    let header = unsafe { &*slot.cast::<AtomicU16>() };
    header.store(u16::from_ne_bytes([bytes[0], bytes[1]]), Ordering::Release);
}

/// Marks kreplay's wake-up packets (in `reserved2` of a barrier-AND packet).
const WAKE_UP_MARK: u64 = 0x6b72_6570_6c61_7921;

/// A packet that only makes the runtime run the queue's handlers: kreplay's handler drops it.
fn wake_up_packet() -> Packet {
    let packet = hsa_barrier_and_packet_t {
        header: (HSA_PACKET_TYPE_BARRIER_AND << HSA_PACKET_HEADER_TYPE) as u16,
        reserved2: WAKE_UP_MARK,
        ..Default::default()
    };
    // SAFETY: a barrier-AND packet is 64 bytes of plain data, like every AQL packet.
    Packet::from_bytes(unsafe { std::mem::transmute::<hsa_barrier_and_packet_t, [u8; 64]>(packet) })
}

/// Whether `packet` is one of kreplay's wake-up packets.
pub(crate) fn is_wake_up(packet: &Packet) -> bool {
    if packet.packet_type() != HSA_PACKET_TYPE_BARRIER_AND {
        return false;
    }
    // SAFETY: a barrier-AND packet is 64 bytes of plain data.
    let barrier =
        unsafe { std::mem::transmute::<[u8; 64], hsa_barrier_and_packet_t>(*packet.bytes()) };
    barrier.reserved2 == WAKE_UP_MARK && barrier.completion_signal.handle == 0
}

/// A handler call in progress (see [`QueueState::handler_call`]).
pub(crate) struct HandlerCall<'a> {
    state: &'a QueueState,
    _not_send: std::marker::PhantomData<*const ()>,
}

impl Drop for HandlerCall<'_> {
    fn drop(&mut self) {
        let queue = self.state.queue as usize;
        let _ = HANDLING.try_with(|h| {
            let mut h = h.borrow_mut();
            if let Some(at) = h.iter().rposition(|c| c.queue == queue) {
                h.remove(at);
            }
        });
        let mut handlers = self.state.handlers.lock();
        *handlers -= 1;
        if *handlers == 0 {
            self.state.handlers_done.notify_all();
        }
    }
}

/// Whether this thread is inside a handler call of `queue` ([`QueueState::handler_call`]).
fn handling(queue: *mut hsa_queue_t) -> bool {
    HANDLING
        .try_with(|h| h.borrow().iter().any(|c| c.queue == queue as usize))
        .unwrap_or(false)
}

/// Writes the mail (drain markers of replays on other threads) of every queue whose handler
/// this thread is in: for a wait inside a handler call that is not the handler's own (a runtime
/// write a tool makes from a callback, waiting for an agent's lock), which would otherwise hold
/// those replays' drains off until their timeout, since only a thread handling a queue writes
/// its mail.
pub(crate) fn serve_handled_mail(b: &Backend) {
    let calls: SmallVec<[(*const QueueState, crate::dispatch::Writer); 2]> = HANDLING
        .try_with(|h| h.borrow().iter().map(|c| (c.state, c.writer)).collect())
        .unwrap_or_default();
    for (state, writer) in calls {
        // SAFETY: a handler call in progress on this thread registered `state` and removes it
        // (`HandlerCall::drop`) before its `&QueueState` ends; we are inside that call.
        let state = unsafe { &*state };
        crate::dispatch::deliver_mail(b, state, crate::dispatch::Sink::Handler(writer));
    }
}

/// One handler call in progress on this thread.
struct Handling {
    /// The application's queue, as an identity.
    queue: usize,
    /// Its state, alive while the call is (see [`serve_handled_mail`]).
    state: *const QueueState,
    /// The call's writer, valid while the call is.
    writer: crate::dispatch::Writer,
}

thread_local! {
    /// The queues whose handler this thread is in (counted ones, see `handler_call`).
    static HANDLING: std::cell::RefCell<Vec<Handling>> = const { std::cell::RefCell::new(Vec::new()) };
    /// Replay windows (agent writer locks) this thread holds.
    static WINDOWS: Cell<u32> = const { Cell::new(0) };
    /// Pass loops of dispatches this thread handles (CONFIG ENTER to CONFIG EXIT).
    static CALLBACKS: Cell<u32> = const { Cell::new(0) };
}

fn counted(count: &'static LocalKey<Cell<u32>>) -> bool {
    count.try_with(Cell::get).unwrap_or(0) > 0
}

/// Whether this thread is inside a replay window (holds some agent's writer side): what it
/// submits is re-entrant work.
pub(crate) fn in_replay_window() -> bool {
    counted(&WINDOWS)
}

/// Whether this thread is inside the pass loop of a dispatch it handles (CONFIG ENTER to
/// CONFIG EXIT, with or without a replay window): a dispatch the tool submits from there onto
/// the handler's own queue could only be handled once this handler call returns, which waits
/// for the tool, so it is re-entrant work too and runs on the agent's side queue.
pub(crate) fn in_tool_callbacks() -> bool {
    in_replay_window() || counted(&CALLBACKS)
}

/// Marks the current thread, while alive, as inside a replay window ([`Mark::window`]) or a
/// dispatch's pass loop ([`Mark::callbacks`]). Not `Send`: dropped on the thread that made it.
pub(crate) struct Mark {
    count: &'static LocalKey<Cell<u32>>,
    _not_send: std::marker::PhantomData<*const ()>,
}

impl Mark {
    fn enter(count: &'static LocalKey<Cell<u32>>) -> Mark {
        let _ = count.try_with(|c| c.set(c.get() + 1));
        Mark {
            count,
            _not_send: std::marker::PhantomData,
        }
    }

    /// Inside a replay window (see [`in_replay_window`]).
    pub(crate) fn window() -> Mark {
        Mark::enter(&WINDOWS)
    }

    /// Inside a dispatch's pass loop (see [`in_tool_callbacks`]).
    pub(crate) fn callbacks() -> Mark {
        Mark::enter(&CALLBACKS)
    }
}

impl Drop for Mark {
    fn drop(&mut self) {
        let _ = self.count.try_with(|c| c.set(c.get().saturating_sub(1)));
    }
}

/// Re-entrant work is marked when its slots are reserved: called from inside a replay window or
/// a dispatch's tool callbacks (see [`in_tool_callbacks`]) on a queue of kreplay's, the slots
/// are recorded so that the packets run on the agent's side queue, promptly, whichever thread
/// ends up handling them.
fn note_reservation(queue: *const hsa_queue_t, first: u64, count: u64) {
    let Some(b) = installed() else { return };
    if count == 0 || b.is_finalized() || !in_tool_callbacks() {
        return;
    }
    if let Some(state) = b.queues.by_queue(queue) {
        state.reserve_reentrant(first, count);
    }
}

macro_rules! add_write_index_wrapper {
    ($($name:ident => $entry:ident),* $(,)?) => {$(
        /// Wrapper of the same-named `hsa_queue_add_write_index_*`: see [`note_reservation`].
        pub(crate) unsafe extern "C" fn $name(queue: *const hsa_queue_t, value: u64) -> u64 {
            let Some(b) = installed() else { return 0 };
            let first = b.original.$entry(queue, value);
            let _ = std::panic::catch_unwind(|| note_reservation(queue, first, value));
            first
        }
    )*};
}

add_write_index_wrapper!(
    queue_add_write_index_scacq_screl => queue_add_write_index,
    queue_add_write_index_scacquire => queue_add_write_index,
    queue_add_write_index_relaxed => queue_add_write_index,
    queue_add_write_index_screlease => queue_add_write_index,
);

macro_rules! cas_write_index_wrapper {
    ($($name:ident => $entry:ident),* $(,)?) => {$(
        /// Wrapper of the same-named `hsa_queue_cas_write_index_*`: a producer that reserves
        /// packet slots by compare-and-swap (`expected` to `value`) is tracked as one that adds
        /// to the write index ([`note_reservation`]), once the exchange succeeded.
        pub(crate) unsafe extern "C" fn $name(
            queue: *const hsa_queue_t,
            expected: u64,
            value: u64,
        ) -> u64 {
            // The wrappers are installed after the backend: unreachable without it. The write
            // index seen is then said to differ from `expected`, so nothing counts as reserved.
            let Some(b) = installed() else { return expected.wrapping_add(1) };
            let Some(cas) = b.original.core().$entry else { return expected.wrapping_add(1) };
            // SAFETY: the runtime's own entry (the one this wrapper replaced), called with the
            // application's arguments unchanged.
            let seen = unsafe { cas(queue, expected, value) };
            if seen == expected && value > expected {
                let _ = std::panic::catch_unwind(|| {
                    note_reservation(queue, expected, value - expected)
                });
            }
            seen
        }
    )*};
}

cas_write_index_wrapper!(
    queue_cas_write_index_scacq_screl => hsa_queue_cas_write_index_scacq_screl_fn,
    queue_cas_write_index_scacquire => hsa_queue_cas_write_index_scacquire_fn,
    queue_cas_write_index_relaxed => hsa_queue_cas_write_index_relaxed_fn,
    queue_cas_write_index_screlease => hsa_queue_cas_write_index_screlease_fn,
);

macro_rules! store_write_index_wrapper {
    ($($name:ident => $entry:ident),* $(,)?) => {$(
        /// Wrapper of the same-named `hsa_queue_store_write_index_*`: the sole producer of a
        /// queue (a single-producer queue needs no atomic reservation) reserves the slots from
        /// the write index it loaded up to `value` by storing `value`; it is tracked as one that
        /// adds to the write index ([`note_reservation`]).
        pub(crate) unsafe extern "C" fn $name(queue: *const hsa_queue_t, value: u64) {
            let Some(b) = installed() else { return };
            let Some(store) = b.original.core().$entry else { return };
            let before = if in_tool_callbacks() {
                b.original.core().hsa_queue_load_write_index_scacquire_fn.map(|load| {
                    // SAFETY: the runtime's own entry, on the application's queue.
                    unsafe { load(queue) }
                })
            } else {
                None
            };
            // SAFETY: the runtime's own entry (the one this wrapper replaced), called with the
            // application's arguments unchanged.
            unsafe { store(queue, value) };
            if let Some(before) = before.filter(|&before| value > before) {
                let _ = std::panic::catch_unwind(|| {
                    note_reservation(queue, before, value - before)
                });
            }
        }
    )*};
}

store_write_index_wrapper!(
    queue_store_write_index_relaxed => hsa_queue_store_write_index_relaxed_fn,
    queue_store_write_index_screlease => hsa_queue_store_write_index_screlease_fn,
);

/// A doorbell store from inside a replay window or a dispatch's tool callbacks: the re-entrant
/// packets it publishes run now,
/// on the agent's side queue, before the store reaches the runtime (which may hand the slots to
/// a thread that waits for this very replay). Their slots are then dropped by the handler.
fn run_published_reentrant(signal: hsa_signal_t, value: i64) {
    let Some(b) = installed() else { return };
    if b.is_finalized() || !in_tool_callbacks() || value < 0 {
        return;
    }
    let Some(state) = b.queues.by_doorbell(signal) else {
        return;
    };
    for packet in state.claim_published(value as u64) {
        crate::replay::run_reentrant(b, &state, packet);
    }
}

/// Wrapper of `hsa_signal_store_relaxed`: see [`run_published_reentrant`].
pub(crate) unsafe extern "C" fn signal_store_relaxed(signal: hsa_signal_t, value: i64) {
    let Some(b) = installed() else { return };
    if in_tool_callbacks() {
        let _ = std::panic::catch_unwind(|| run_published_reentrant(signal, value));
    }
    b.original.signal_store_relaxed(signal, value);
}

/// Wrapper of `hsa_signal_store_screlease`: see [`run_published_reentrant`].
pub(crate) unsafe extern "C" fn signal_store_screlease(signal: hsa_signal_t, value: i64) {
    let Some(b) = installed() else { return };
    if in_tool_callbacks() {
        let _ = std::panic::catch_unwind(|| run_published_reentrant(signal, value));
    }
    b.original.signal_store_screlease(signal, value);
}
