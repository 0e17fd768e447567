//! Queue interception as tools see it in ROCm: the application writes packets into an intercept
//! queue; a store to its doorbell hands the new packets to a chain of handlers, synchronously in
//! the storing thread. As in ROCm's `InterceptQueue`, the handler registered last is called
//! first; its writer passes packets to the handler registered before it, and the writer of the
//! first-registered handler copies them into the hardware queue and rings its doorbell. A tool
//! that creates the queue and registers at once is thus the one nearest the hardware: what it
//! writes is seen by no handler registered after it.
//!
//! The writer callback has no context argument, so the current chain position lives in a
//! thread-local stack of frames.
//!
//! As in ROCm, a doorbell store never waits for room in the hardware queue: what the chain
//! writes that the hardware ring has no room for is kept aside in order (the overflow) and
//! written by a thread of its own as room comes, and until then no more of the intercept ring's
//! packets are handed to the handlers, so the application's producers wait for room in their
//! own ring, as they would without interception. A handler that adds packets of its own (a
//! tool's markers) makes the hardware ring fill before the application's does: the application
//! must still be able to open a barrier that holds the hardware queue, which a doorbell store
//! waiting for that room would never let it do.

use crate::queue::{Packet, Queue, QueueKind, packet_type};
use crate::wake::block_until;
use hsa_sys::{AQL_PACKET_SIZE, HSA_PACKET_TYPE_INVALID, hsa_amd_queue_intercept_handler};
use parking_lot::{Mutex, RwLock};
use std::cell::Cell;
use std::collections::VecDeque;
use std::ffi::c_void;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

type HandlerFn = unsafe extern "C" fn(
    *const c_void,
    u64,
    u64,
    *mut c_void,
    hsa_sys::hsa_amd_queue_intercept_packet_writer,
);

/// Wraps every write of a handler chain into its hardware queue (tests): called with the
/// batch and the write, which it calls to let the packets through.
pub(crate) type Observer = dyn Fn(&[[u8; AQL_PACKET_SIZE]], &mut dyn FnMut()) + Send + Sync;

#[derive(Clone, Copy)]
struct Handler {
    f: HandlerFn,
    data: usize,
}

/// The intercept side of a queue created by `hsa_amd_queue_intercept_create`.
pub(crate) struct InterceptState {
    /// The hardware queue that finally executes the packets.
    pub(crate) hw: Arc<Queue>,
    handlers: RwLock<Arc<[Handler]>>,
    /// Serializes processing of this queue's packets between threads.
    lock: Mutex<()>,
    /// Set by every doorbell store; the thread processing the queue looks again before it
    /// leaves, so a store that found the queue busy is never lost.
    pending: AtomicBool,
    /// Set while a doorbell thread serves stores made from inside other queues' handlers.
    deferred: AtomicBool,
    /// Set once the queue is destroyed: its ring is revoked as soon as no thread processes it
    /// ([`revoke_when_idle`]).
    revoke: AtomicBool,
    /// Wraps what the chain writes into the hardware queue.
    observer: RwLock<Option<Arc<Observer>>>,
    /// What the chain wrote that the hardware ring had no room for (see the module's comment).
    overflow: Mutex<Overflow>,
}

/// Packets kept aside for the hardware ring, in the order they were written.
#[derive(Default)]
struct Overflow {
    packets: VecDeque<Packet>,
    /// A thread writes `packets` into the hardware ring as room comes ([`flush`]).
    flushing: bool,
}

impl InterceptState {
    pub(crate) fn new(hw: Arc<Queue>) -> Self {
        Self {
            hw,
            handlers: RwLock::new(Arc::from(Vec::new())),
            lock: Mutex::new(()),
            pending: AtomicBool::new(false),
            deferred: AtomicBool::new(false),
            revoke: AtomicBool::new(false),
            observer: RwLock::new(None),
            overflow: Mutex::new(Overflow::default()),
        }
    }

    /// Replaces the wrapper of what the chain writes into the hardware queue.
    pub(crate) fn observe(&self, observer: Arc<Observer>) {
        *self.observer.write() = Some(observer);
    }

    /// Appends a handler to the chain (`hsa_amd_queue_intercept_register`): it will be the
    /// first one called.
    pub(crate) fn register(&self, handler: hsa_amd_queue_intercept_handler, data: usize) -> bool {
        let Some(f) = handler else { return false };
        let mut handlers = self.handlers.write();
        let mut chain = handlers.to_vec();
        chain.push(Handler { f, data });
        *handlers = Arc::from(chain);
        true
    }
}

/// One level of a handler chain being run by this thread.
#[derive(Clone)]
struct Frame {
    /// Identity of the intercept queue being processed.
    queue: usize,
    /// The intercept queue being processed (its hardware queue and overflow).
    owner: Arc<Queue>,
    handlers: Arc<[Handler]>,
    /// The position in `handlers` of the handler running at this level: its writer passes
    /// packets to the one before it.
    level: usize,
    observer: Option<Arc<Observer>>,
    user_pkt_index: u64,
}

/// A frame on the stack of the thread running it, linked to the one below.
struct Node {
    frame: Frame,
    below: *const Node,
}

thread_local! {
    /// The innermost frame this thread runs, null outside every handler. A plain pointer to
    /// the stack, with no destructor, so it can be used while the thread's other thread-locals
    /// are destroyed (a store from a thread-local destructor, as at thread exit), as ROCm's
    /// per-thread cursor can.
    static TOP: Cell<*const Node> = const { Cell::new(std::ptr::null()) };
}

/// Runs `f` with `frame` on top of this thread's frames, taken off again afterwards (also when
/// `f` unwinds).
fn with_frame<R>(frame: Frame, f: impl FnOnce() -> R) -> R {
    struct Pop(*const Node);
    impl Drop for Pop {
        fn drop(&mut self) {
            TOP.set(self.0);
        }
    }
    let node = Node {
        frame,
        below: TOP.get(),
    };
    let _pop = Pop(node.below);
    TOP.set(&raw const node);
    f()
}

/// This thread's frames, innermost first.
fn frames(mut visit: impl FnMut(&Frame) -> bool) -> bool {
    let mut at = TOP.get();
    while !at.is_null() {
        // SAFETY: every non-null pointer on the list is a `Node` on this thread's stack, in a
        // `with_frame` call that has not returned (it unlinks its node before it does).
        let node = unsafe { &*at };
        if visit(&node.frame) {
            return true;
        }
        at = node.below;
    }
    false
}

fn processing_on_this_thread(queue: usize) -> bool {
    frames(|frame| frame.queue == queue)
}

/// Revokes the ring of the stopped intercept queue `queue` once no thread processes it: now if
/// none does, else when the last one leaves [`serve`] (a thread that was in [`process`] leaves
/// at its next look at the stop flag; later ones return before reading the ring). Never waits:
/// a thread processing the queue may be waiting for the very thread that destroys it (a
/// handler waiting for a lock held around a destroy).
pub(crate) fn revoke_when_idle(queue: &Queue, state: &InterceptState) {
    state.revoke.store(true, Ordering::SeqCst);
    revoke_if_idle(queue, state);
}

/// Revokes the ring if a revocation is pending and no thread processes the queue.
fn revoke_if_idle(queue: &Queue, state: &InterceptState) {
    if !state.revoke.load(Ordering::SeqCst) {
        return;
    }
    if let Some(_serial) = state.lock.try_lock() {
        queue.revoke_ring_now();
    }
}

/// Called after every store to an intercept queue's doorbell, in the storing thread.
///
/// Re-entry from a handler of the same queue on this thread returns at once: the outer loop
/// re-reads the write index before it returns, so those packets are handled there. A store made
/// from inside a handler of another queue is handed to a doorbell thread, as ROCm hands it to
/// its async doorbell thread: the handlers of one queue never run nested inside another's. A
/// store while another thread processes the queue returns at once, leaving the new packets to
/// that thread (it looks again before it leaves): a store never waits for another thread's
/// handlers.
pub(crate) fn on_doorbell(queue: &Arc<Queue>) {
    let QueueKind::Intercept(state) = &queue.kind else {
        return;
    };
    let id = Arc::as_ptr(queue) as usize;
    if processing_on_this_thread(id) {
        return;
    }
    state.pending.store(true, Ordering::SeqCst);
    if inside_any_handler() {
        defer(queue, state);
        return;
    }
    serve(queue, state, id);
}

/// Processes the queue unless another thread does (see [`on_doorbell`]); false when another
/// thread held it (that thread sees `pending` after it lets go, and looks again).
fn serve(queue: &Arc<Queue>, state: &InterceptState, id: usize) -> bool {
    loop {
        let Some(serial) = state.lock.try_lock() else {
            return false;
        };
        state.pending.store(false, Ordering::SeqCst);
        process(queue, state, id);
        drop(serial);
        // The queue was destroyed while this thread processed it: its ring goes now.
        revoke_if_idle(queue, state);
        if !state.pending.load(Ordering::SeqCst) {
            return true;
        }
    }
}

fn inside_any_handler() -> bool {
    !TOP.get().is_null()
}

/// Serves the queue from a doorbell thread of its own (at most one per queue at a time; one
/// that is running sees `pending` before it leaves).
fn defer(queue: &Arc<Queue>, state: &InterceptState) {
    if state.deferred.swap(true, Ordering::SeqCst) {
        return;
    }
    let queue = queue.clone();
    let spawned = std::thread::Builder::new()
        .name("softhsa-doorbell".into())
        .spawn(move || {
            let QueueKind::Intercept(state) = &queue.kind else {
                return;
            };
            let id = Arc::as_ptr(&queue) as usize;
            loop {
                let served = serve(&queue, state, id);
                state.deferred.store(false, Ordering::SeqCst);
                // Another thread holds the queue: it looks again before it leaves. Otherwise a
                // store deferred after `serve` looked for the last time found `deferred` still
                // set and relies on this thread: look once more.
                if !served
                    || !state.pending.load(Ordering::SeqCst)
                    || state.deferred.swap(true, Ordering::SeqCst)
                {
                    return;
                }
            }
        });
    if spawned.is_err() {
        state.deferred.store(false, Ordering::SeqCst);
    }
}

/// Hands every published packet of the queue to its handler chain, batch by batch.
fn process(queue: &Arc<Queue>, state: &InterceptState, id: usize) {
    loop {
        if queue.is_stopped() {
            return;
        }
        if !state.overflow.lock().packets.is_empty() {
            // Packets written before are still waiting for room in the hardware ring: the
            // thread writing them serves the queue again once they are in.
            return;
        }
        let read = queue.read_index.load(Ordering::Acquire);
        // Producers may have reserved ids past a full ring; only the ring's slots hold packets
        // (slot `read + size` is slot `read` again), so look at most one ring ahead. Those
        // producers ring the doorbell again once they have written their packets.
        let write = queue
            .write_index
            .load(Ordering::Acquire)
            .min(read.saturating_add(queue.size()));
        let mut batch: Vec<Packet> = Vec::new();
        for index in read..write {
            let header = queue.header(index).load(Ordering::Acquire);
            if packet_type(header) == HSA_PACKET_TYPE_INVALID {
                // Reserved but not yet published: its producer rings the doorbell again later.
                break;
            }
            batch.push(queue.read_packet(index));
        }
        if batch.is_empty() {
            return;
        }
        let handlers = state.handlers.read().clone();
        let below = handlers.len();
        let frame = Frame {
            queue: id,
            owner: queue.clone(),
            handlers,
            level: below,
            observer: state.observer.read().clone(),
            user_pkt_index: read,
        };
        forward(&frame, below, batch.as_ptr().cast(), batch.len() as u64);
        queue.consume(read, batch.len() as u64);
    }
}

/// Passes packets to the nearest of the `below` handlers registered first (the one at
/// `below - 1`), or into the hardware queue when there is none.
fn forward(frame: &Frame, below: usize, packets: *const c_void, count: u64) {
    let Some(level) = below.checked_sub(1) else {
        if let Some(observer) = &frame.observer {
            // SAFETY: the caller (a handler, through the writer contract) passes `count`
            // packets of 64 initialized bytes at `packets`; byte arrays need no alignment.
            let batch = unsafe {
                std::slice::from_raw_parts(packets.cast::<[u8; AQL_PACKET_SIZE]>(), count as usize)
            };
            observer(batch, &mut || {
                write_to_hardware(&frame.owner, packets, count)
            });
        } else {
            write_to_hardware(&frame.owner, packets, count);
        }
        return;
    };
    match frame.handlers.get(level) {
        Some(handler) => {
            let inner = Frame {
                level,
                ..frame.clone()
            };
            // SAFETY: the tool registered this handler for this queue; the arguments follow the
            // hsa_amd_queue_intercept_handler contract (count packets at `packets`, valid for the
            // duration of the call).
            with_frame(inner, || unsafe {
                (handler.f)(
                    packets,
                    count,
                    frame.user_pkt_index,
                    handler.data as *mut c_void,
                    Some(writer),
                )
            });
        }
        None => write_to_hardware(&frame.owner, packets, count),
    }
}

/// The writer given to handlers: passes packets to the handler registered before the one this
/// thread is running (the hardware queue after the first-registered one). Outside a handler it
/// has nowhere to write and does nothing.
unsafe extern "C" fn writer(packets: *const c_void, count: u64) {
    let _ = catch_unwind(AssertUnwindSafe(|| {
        let top = TOP.get();
        // SAFETY: see `frames`: a non-null top is a live `Node` of this thread.
        let top = (!top.is_null()).then(|| unsafe { (*top).frame.clone() });
        if let Some(top) = top
            && !packets.is_null()
            && count > 0
        {
            forward(&top, top.level, packets, count);
        }
    }));
}

/// Copies packets into the hardware queue of intercept queue `owner`: each claims a slot, its
/// body is written, its header stored last with release order, and the doorbell rung. A packet
/// the ring has no room for, and every one after it, is kept aside for [`flush`] instead of
/// waiting for room (see the module's comment).
fn write_to_hardware(owner: &Arc<Queue>, packets: *const c_void, count: u64) {
    let QueueKind::Intercept(state) = &owner.kind else {
        return;
    };
    let hw = &state.hw;
    let mut overflow = state.overflow.lock();
    let mut start_flushing = false;
    for i in 0..count as usize {
        // SAFETY: the caller (a handler, through the writer contract) passes `count` packets of
        // 64 initialized bytes at `packets`.
        let packet = unsafe { Packet::read_from(packets.cast::<u8>().add(i * AQL_PACKET_SIZE)) };
        if packet_type(packet.header()) == HSA_PACKET_TYPE_INVALID {
            // An INVALID packet would stall the hardware queue for ever; there is nothing to run.
            continue;
        }
        if hw.is_stopped() {
            return;
        }
        if overflow.packets.is_empty() && has_room(hw) {
            write_one(hw, &packet);
        } else {
            overflow.packets.push_back(packet);
            start_flushing |= !std::mem::replace(&mut overflow.flushing, true);
        }
    }
    drop(overflow);
    if start_flushing {
        let queue = owner.clone();
        let spawned = std::thread::Builder::new()
            .name("softhsa-overflow".into())
            .spawn(move || flush(&queue));
        if spawned.is_err() {
            // No thread to wait for room: this one waits, as a producer of a full ring does.
            flush(owner);
        }
    }
}

/// Whether the hardware ring has a free slot (only [`write_to_hardware`] and [`flush`] write
/// it, under the overflow's lock).
fn has_room(hw: &Queue) -> bool {
    hw.write_index.load(Ordering::Acquire) < hw.read_index.load(Ordering::Acquire) + hw.size()
}

/// Writes one packet into a slot of the hardware ring that is free.
fn write_one(hw: &Queue, packet: &Packet) {
    let index = hw.write_index.fetch_add(1, Ordering::AcqRel);
    if !hw.wait_for_slot(index) {
        return;
    }
    hw.write_packet(index, packet);
    hw.doorbell
        .store(index as i64, crate::signal::Order::Release);
}

/// Writes the overflow of intercept queue `queue` into its hardware ring as room comes, then
/// serves the queue (its ring's packets were held back meanwhile). Packets still kept when the
/// queue stops are dropped, as the ring's own are.
fn flush(queue: &Arc<Queue>) {
    let QueueKind::Intercept(state) = &queue.kind else {
        return;
    };
    let hw = &state.hw;
    loop {
        let mut overflow = state.overflow.lock();
        while !overflow.packets.is_empty() && !hw.is_stopped() && has_room(hw) {
            if let Some(packet) = overflow.packets.pop_front() {
                write_one(hw, &packet);
            }
        }
        if hw.is_stopped() {
            overflow.packets.clear();
        }
        if overflow.packets.is_empty() {
            overflow.flushing = false;
            drop(overflow);
            state.pending.store(true, Ordering::SeqCst);
            // Another thread processing the queue sees `pending` before it lets go.
            serve(queue, state, Arc::as_ptr(queue) as usize);
            return;
        }
        drop(overflow);
        block_until(&[&hw.space], None, false, || {
            (hw.is_stopped() || has_room(hw)).then_some(())
        });
    }
}
