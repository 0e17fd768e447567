//! AQL queues: a ring of 64-byte packets, 64-bit read/write indices, a doorbell signal, and one
//! packet-processor thread per hardware queue.
//!
//! The processor executes packets in order, each to completion before the next starts. That is a
//! legal AQL schedule that honours every barrier bit (a packet never starts before all earlier
//! packets of its queue have completed); different queues run concurrently. A slot is handed back
//! (header INVALID, read index advanced) once its packet has completed, so on softhsa
//! `read index == write index` means the queue is idle; real hardware advances the read index
//! earlier, so portable code waits on completion signals instead.

use crate::grid::Grid;
use crate::intercept::InterceptState;
use crate::runtime::{Runtime, join_unless_current};
use crate::signal::{Signal, condition_holds};
use crate::time::now_ticks;
use crate::topology::{AgentKind, QUEUE_MAX_SIZE, QUEUE_MIN_SIZE, QUEUES_MAX};
use crate::wake::{WakeList, block_until};
use hsa_sys::{
    AQL_PACKET_SIZE, HSA_AMD_PACKET_TYPE_BARRIER_VALUE, HSA_PACKET_TYPE_BARRIER_AND,
    HSA_PACKET_TYPE_BARRIER_OR, HSA_PACKET_TYPE_INVALID, HSA_PACKET_TYPE_KERNEL_DISPATCH,
    HSA_PACKET_TYPE_VENDOR_SPECIFIC, HSA_QUEUE_FEATURE_KERNEL_DISPATCH, HSA_QUEUE_TYPE_COOPERATIVE,
    HSA_QUEUE_TYPE_MULTI, HSA_QUEUE_TYPE_SINGLE, HSA_STATUS_ERROR_EXCEPTION,
    HSA_STATUS_ERROR_INVALID_AGENT, HSA_STATUS_ERROR_INVALID_ARGUMENT,
    HSA_STATUS_ERROR_INVALID_CODE_OBJECT, HSA_STATUS_ERROR_INVALID_PACKET_FORMAT,
    HSA_STATUS_ERROR_INVALID_QUEUE_CREATION, HSA_STATUS_ERROR_OUT_OF_RESOURCES,
    hsa_amd_barrier_value_packet_t, hsa_barrier_and_packet_t, hsa_barrier_or_packet_t,
    hsa_kernel_dispatch_packet_t, hsa_queue_t, hsa_signal_t, hsa_status_t,
};
use parking_lot::Mutex;
use std::mem::MaybeUninit;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU16, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::thread::{JoinHandle, Thread};

/// A packet header whose type is INVALID and whose other fields are zero.
pub(crate) const INVALID_HEADER: u16 = HSA_PACKET_TYPE_INVALID as u16;

/// The packet type field of a header.
pub(crate) fn packet_type(header: u16) -> u32 {
    u32::from(header & 0xff)
}

/// One raw AQL packet, copied out of (or into) a ring slot. The bytes are `MaybeUninit` so a
/// pointer stored in a packet (such as `kernarg_address`) keeps its provenance through the copy.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
pub(crate) struct Packet([MaybeUninit<u8>; AQL_PACKET_SIZE]);

impl Packet {
    /// Copies a packet from `src`.
    ///
    /// # Safety
    /// `src` must be valid for reading 64 initialized bytes.
    pub(crate) unsafe fn read_from(src: *const u8) -> Self {
        let mut packet = Packet([MaybeUninit::uninit(); AQL_PACKET_SIZE]);
        // SAFETY: the caller guarantees 64 readable bytes; the destination is our own array.
        unsafe {
            std::ptr::copy_nonoverlapping(
                src.cast::<MaybeUninit<u8>>(),
                packet.0.as_mut_ptr(),
                AQL_PACKET_SIZE,
            )
        };
        packet
    }

    pub(crate) fn as_ptr(&self) -> *const u8 {
        self.0.as_ptr().cast()
    }

    /// The 16-bit header.
    pub(crate) fn header(&self) -> u16 {
        self.read_as::<u16>(0)
    }

    /// The AMD vendor format byte (meaningful for vendor-specific packets).
    fn amd_format(&self) -> u8 {
        self.read_as::<u8>(2)
    }

    /// Reads a `T` at byte `offset`.
    fn read_as<T: Copy>(&self, offset: usize) -> T {
        assert!(offset + std::mem::size_of::<T>() <= AQL_PACKET_SIZE);
        // SAFETY: in bounds (asserted); every Packet is built by `read_from` from 64 initialized
        // bytes, and T is plain data (integers, pointers, or an AQL packet struct), valid for any
        // bit pattern.
        unsafe { std::ptr::read_unaligned(self.as_ptr().add(offset).cast::<T>()) }
    }
}

/// The queue error callback of `hsa_queue_create`.
pub(crate) type ErrorCallback =
    unsafe extern "C" fn(hsa_status_t, *mut hsa_queue_t, *mut std::ffi::c_void);

/// The packet ring: `size` 64-byte slots in pages of their own (so 64-byte aligned).
///
/// As a real queue's ring goes away with the queue, the ring of a queue the application
/// destroyed is made inaccessible ([`Ring::revoke`]) while its address stays reserved (no
/// later mapping takes it): a read of a destroyed queue's packets faults at once instead of
/// seeing stale or reused memory.
struct Ring {
    base: *mut u8,
    /// Bytes mapped at `base` (the slots, rounded up to whole pages).
    len: usize,
}

impl Ring {
    fn new(size: u32) -> Result<Self, hsa_status_t> {
        let bytes = (size as usize)
            .checked_mul(AQL_PACKET_SIZE)
            .ok_or(HSA_STATUS_ERROR_OUT_OF_RESOURCES)?;
        let len = bytes
            .checked_next_multiple_of(page_size())
            .ok_or(HSA_STATUS_ERROR_OUT_OF_RESOURCES)?;
        // SAFETY: a fresh private anonymous mapping (zero-filled) at an address of the
        // kernel's choosing; `len` is non-zero (size is a power of two, so at least 1).
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(HSA_STATUS_ERROR_OUT_OF_RESOURCES);
        }
        let base = base.cast::<u8>();
        for slot in 0..size as usize {
            // SAFETY: the slot lies inside the fresh mapping, which is page (so 64-byte)
            // aligned, so the u16 header write is aligned; nobody else sees the ring yet.
            unsafe {
                base.add(slot * AQL_PACKET_SIZE)
                    .cast::<u16>()
                    .write(INVALID_HEADER)
            };
        }
        Ok(Self { base, len })
    }

    /// Makes the ring inaccessible (its pages are given back, its address stays reserved):
    /// any later access faults. Only once nothing of the runtime's reads or writes it.
    fn revoke(&self) {
        // SAFETY: replaces exactly the mapping made in `Ring::new` (MAP_FIXED over our own
        // range) with an inaccessible one; no reference into the ring is held by the runtime
        // any more (the caller's contract), and the range is unmapped only in `drop`.
        unsafe {
            libc::mmap(
                self.base.cast(),
                self.len,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE | libc::MAP_FIXED,
                -1,
                0,
            )
        };
    }
}

impl Drop for Ring {
    fn drop(&mut self) {
        // SAFETY: `base..base + len` was mapped in Ring::new and is unmapped only here.
        unsafe { libc::munmap(self.base.cast(), self.len) };
    }
}

/// The size of a memory page.
fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(size).unwrap_or(4096).max(AQL_PACKET_SIZE)
}

/// What drives a queue's packets.
pub(crate) enum QueueKind {
    /// A packet-processor thread executes the packets.
    Hardware,
    /// The application-visible side of `hsa_amd_queue_intercept_create`: stores to its doorbell
    /// hand the packets to the registered handlers, which forward them to a hardware queue.
    Intercept(InterceptState),
    /// `hsa_soft_queue_create`: a ring and indices with no processor (the application is the
    /// packet processor).
    Soft,
}

/// One queue. `hsa` comes first so a `*mut hsa_queue_t` handed out is a pointer to this struct,
/// followed by the 64-bit indices, like `amd_queue_t`.
#[repr(C)]
pub(crate) struct Queue {
    hsa: hsa_queue_t,
    pub(crate) write_index: AtomicU64,
    pub(crate) read_index: AtomicU64,
    ring: Ring,
    pub(crate) doorbell: Arc<Signal>,
    owns_doorbell: bool,
    agent: usize,
    pub(crate) kind: QueueKind,
    profiling: AtomicBool,
    stop: AtomicBool,
    inactive: AtomicBool,
    errored: AtomicBool,
    /// Producers waiting for a free slot.
    pub(crate) space: WakeList,
    callback: Option<ErrorCallback>,
    callback_data: usize,
    /// The queue pointer given to the error callback (the intercept queue for a hardware queue
    /// created by `hsa_amd_queue_intercept_create`).
    report_as: AtomicPtr<hsa_queue_t>,
    cu_mask: Mutex<Vec<u32>>,
    processor: Mutex<Option<JoinHandle<()>>>,
    processor_thread: OnceLock<Thread>,
}

// SAFETY: the raw pointers inside are the queue's own ring (freed only on drop) and opaque
// user data handed back to the user's callback; all shared mutable state is atomic or locked.
unsafe impl Send for Queue {}
// SAFETY: see the Send impl; ring slots are accessed with the AQL protocol (atomic headers with
// acquire/release, bodies owned by whoever holds the slot).
unsafe impl Sync for Queue {}

/// How a queue is created.
pub(crate) struct QueueParams {
    pub(crate) agent: usize,
    pub(crate) size: u32,
    pub(crate) queue_type: u32,
    pub(crate) callback: Option<ErrorCallback>,
    pub(crate) callback_data: usize,
}

impl Queue {
    /// The pointer applications use.
    pub(crate) fn hsa_ptr(&self) -> *mut hsa_queue_t {
        std::ptr::from_ref(&self.hsa).cast_mut()
    }

    pub(crate) fn agent(&self) -> usize {
        self.agent
    }

    /// The number of packet slots in the ring.
    pub(crate) fn size(&self) -> u64 {
        u64::from(self.hsa.size)
    }

    pub(crate) fn is_stopped(&self) -> bool {
        self.stop.load(Ordering::Acquire)
    }

    /// The hardware queue whose processor runs this queue's packets.
    fn executing_queue(&self) -> &Queue {
        match &self.kind {
            QueueKind::Intercept(state) => &state.hw,
            _ => self,
        }
    }

    /// `hsa_amd_profiling_set_profiler_enabled`; on an intercept queue it applies to the
    /// hardware queue that runs the dispatches.
    pub(crate) fn set_profiling(&self, enabled: bool) {
        self.executing_queue()
            .profiling
            .store(enabled, Ordering::Release);
    }

    pub(crate) fn set_cu_mask(&self, mask: Vec<u32>) {
        *self.cu_mask.lock() = mask;
    }

    pub(crate) fn cu_mask(&self) -> Vec<u32> {
        self.cu_mask.lock().clone()
    }

    /// `hsa_queue_inactivate`: no further packets are processed.
    pub(crate) fn inactivate(&self) {
        self.inactive.store(true, Ordering::Release);
        if let QueueKind::Intercept(state) = &self.kind {
            state.hw.inactivate();
        }
    }

    /// Makes the ring inaccessible ([`Ring::revoke`]): only once no thread of the runtime
    /// reads or writes it any more.
    pub(crate) fn revoke_ring_now(&self) {
        self.ring.revoke();
    }

    /// Whether the calling thread is this queue's packet-processor thread.
    fn on_processor_thread(&self) -> bool {
        self.processor_thread
            .get()
            .is_some_and(|t| t.id() == std::thread::current().id())
    }

    pub(crate) fn set_report_as(&self, queue: *mut hsa_queue_t) {
        self.report_as.store(queue, Ordering::Release);
    }

    fn slot(&self, index: u64) -> *mut u8 {
        let slot = (index & u64::from(self.hsa.size - 1)) as usize;
        // SAFETY: slot < size, so the offset stays inside the ring allocation.
        unsafe { self.ring.base.add(slot * AQL_PACKET_SIZE) }
    }

    /// The atomic header of the slot for packet `index`.
    pub(crate) fn header(&self, index: u64) -> &AtomicU16 {
        // SAFETY: slots are 64-byte aligned inside the live ring, so the first two bytes are a
        // valid, aligned location for an AtomicU16 for as long as `self` lives.
        unsafe { &*self.slot(index).cast::<AtomicU16>() }
    }

    /// Copies packet `index` out of the ring. Call after an acquire load saw a valid header.
    pub(crate) fn read_packet(&self, index: u64) -> Packet {
        // SAFETY: the slot is 64 initialized bytes inside the ring (zeroed at creation, then
        // only overwritten whole); the producer finished writing it before publishing the
        // header we acquired, and does not touch it until it is consumed.
        unsafe { Packet::read_from(self.slot(index)) }
    }

    /// Writes `packet` into slot `index`: the body first, then the header with release order.
    /// The caller owns the slot (it reserved `index` and waited until it was free).
    pub(crate) fn write_packet(&self, index: u64, packet: &Packet) {
        let slot = self.slot(index);
        // SAFETY: bytes 2..64 of an owned slot; the processor does not read them until the
        // header below is published.
        unsafe {
            std::ptr::copy_nonoverlapping(packet.as_ptr().add(2), slot.add(2), AQL_PACKET_SIZE - 2)
        };
        self.header(index).store(packet.header(), Ordering::Release);
    }

    /// Marks the slots of packets `first..first + count` consumed (header INVALID) and advances
    /// the read index past them, waking producers that wait for room.
    pub(crate) fn consume(&self, first: u64, count: u64) {
        for index in first..first + count {
            self.header(index).store(INVALID_HEADER, Ordering::Release);
        }
        self.read_index.store(first + count, Ordering::Release);
        self.space.wake_all();
    }

    /// Blocks until slot `index` may be written (the ring is not full), or the queue stops.
    pub(crate) fn wait_for_slot(&self, index: u64) -> bool {
        let size = u64::from(self.hsa.size);
        block_until(&[&self.space], None, false, || {
            if self.is_stopped() {
                Some(false)
            } else if index < self.read_index.load(Ordering::Acquire) + size {
                Some(true)
            } else {
                None
            }
        })
        .unwrap_or(false)
    }

    /// Reports an error: no later packet of this queue runs, and the callback hears about it.
    fn fail(&self, status: hsa_status_t) {
        self.errored.store(true, Ordering::Release);
        if let Some(callback) = self.callback {
            let queue = self.report_as.load(Ordering::Acquire);
            // SAFETY: the application gave this callback and data to hsa_queue_create; calling it
            // with (status, queue, data) is that API's contract.
            unsafe { callback(status, queue, self.callback_data as *mut _) };
        }
    }
}

/// Validates the parameters shared by every queue-creating entry point.
fn check_params(rt: &Runtime, params: &QueueParams) -> Result<(), hsa_status_t> {
    if rt.topology.agents[params.agent].kind != AgentKind::Gpu {
        return Err(HSA_STATUS_ERROR_INVALID_AGENT);
    }
    if !matches!(
        params.queue_type,
        HSA_QUEUE_TYPE_MULTI | HSA_QUEUE_TYPE_SINGLE | HSA_QUEUE_TYPE_COOPERATIVE
    ) {
        return Err(HSA_STATUS_ERROR_INVALID_ARGUMENT);
    }
    if !params.size.is_power_of_two() {
        return Err(HSA_STATUS_ERROR_INVALID_ARGUMENT);
    }
    if params.size > QUEUE_MAX_SIZE {
        return Err(HSA_STATUS_ERROR_INVALID_QUEUE_CREATION);
    }
    Ok(())
}

/// The size of a queue `hsa_queue_create` is asked for `requested` packets: at least the
/// agent's `HSA_AGENT_INFO_QUEUE_MIN_SIZE`, as hsa.h says. A size that is not a power of two is
/// left for [`check_params`] to refuse.
pub(crate) fn hardware_queue_size(requested: u32) -> u32 {
    if requested.is_power_of_two() {
        requested.max(QUEUE_MIN_SIZE)
    } else {
        requested
    }
}

fn build(
    rt: &Runtime,
    params: &QueueParams,
    kind: QueueKind,
    doorbell: Arc<Signal>,
    owns_doorbell: bool,
) -> Result<Arc<Queue>, hsa_status_t> {
    let ring = Ring::new(params.size)?;
    let queue = Arc::new_cyclic(|weak: &std::sync::Weak<Queue>| {
        if matches!(kind, QueueKind::Intercept(_)) {
            doorbell.set_doorbell_of(weak.clone());
        }
        Queue {
            hsa: hsa_queue_t {
                type_: params.queue_type,
                features: HSA_QUEUE_FEATURE_KERNEL_DISPATCH,
                base_address: ring.base.cast(),
                doorbell_signal: hsa_signal_t {
                    handle: doorbell.handle(),
                },
                size: params.size,
                reserved1: 0,
                id: rt.next_queue_id(),
            },
            write_index: AtomicU64::new(0),
            read_index: AtomicU64::new(0),
            ring,
            doorbell,
            owns_doorbell,
            agent: params.agent,
            kind,
            profiling: AtomicBool::new(false),
            stop: AtomicBool::new(false),
            inactive: AtomicBool::new(false),
            errored: AtomicBool::new(false),
            space: WakeList::default(),
            callback: params.callback,
            callback_data: params.callback_data,
            report_as: AtomicPtr::new(std::ptr::null_mut()),
            cu_mask: Mutex::new(Vec::new()),
            processor: Mutex::new(None),
            processor_thread: OnceLock::new(),
        }
    });
    queue.set_report_as(queue.hsa_ptr());
    Ok(queue)
}

/// `hsa_queue_create`: a hardware queue with its packet-processor thread, registered.
pub(crate) fn create_hardware_queue(
    rt: &Arc<Runtime>,
    params: &QueueParams,
) -> Result<Arc<Queue>, hsa_status_t> {
    let queue = new_hardware_queue(rt, params)?;
    rt.register_queue(queue.clone());
    Ok(queue)
}

/// A started hardware queue, not yet registered.
pub(crate) fn new_hardware_queue(
    rt: &Arc<Runtime>,
    params: &QueueParams,
) -> Result<Arc<Queue>, hsa_status_t> {
    check_params(rt, params)?;
    if rt.queues_on_agent(params.agent) >= QUEUES_MAX as usize {
        return Err(HSA_STATUS_ERROR_OUT_OF_RESOURCES);
    }
    let doorbell = rt.create_signal(0);
    let queue = match build(rt, params, QueueKind::Hardware, doorbell.clone(), true) {
        Ok(queue) => queue,
        Err(status) => {
            let _ = rt.destroy_signal(doorbell.handle());
            return Err(status);
        }
    };
    let (rt2, q2) = (rt.clone(), queue.clone());
    let spawned = std::thread::Builder::new()
        .name(format!("softhsa-queue-{}", queue.hsa.id))
        .spawn(move || processor_loop(&rt2, &q2));
    match spawned {
        Ok(handle) => {
            let _ = queue.processor_thread.set(handle.thread().clone());
            *queue.processor.lock() = Some(handle);
            Ok(queue)
        }
        Err(_) => {
            let _ = rt.destroy_signal(doorbell.handle());
            Err(HSA_STATUS_ERROR_OUT_OF_RESOURCES)
        }
    }
}

/// `hsa_amd_queue_intercept_create`: a hardware queue plus the queue the application sees.
pub(crate) fn create_intercept_queue(
    rt: &Arc<Runtime>,
    params: &QueueParams,
) -> Result<Arc<Queue>, hsa_status_t> {
    let hw = new_hardware_queue(rt, params)?;
    let doorbell = rt.create_signal(0);
    let queue = match build(
        rt,
        params,
        QueueKind::Intercept(InterceptState::new(hw.clone())),
        doorbell.clone(),
        true,
    ) {
        Ok(queue) => queue,
        Err(status) => {
            let _ = rt.destroy_signal(doorbell.handle());
            stop_queue(rt, &hw);
            return Err(status);
        }
    };
    hw.set_report_as(queue.hsa_ptr());
    rt.register_queue(queue.clone());
    Ok(queue)
}

/// `hsa_soft_queue_create`: a ring and indices around an application doorbell, no processor.
pub(crate) fn create_soft_queue(
    rt: &Runtime,
    params: &QueueParams,
    doorbell: Arc<Signal>,
) -> Result<Arc<Queue>, hsa_status_t> {
    if !params.size.is_power_of_two() {
        return Err(HSA_STATUS_ERROR_INVALID_ARGUMENT);
    }
    let queue = build(rt, params, QueueKind::Soft, doorbell, false)?;
    rt.register_queue(queue.clone());
    Ok(queue)
}

/// Stops a queue (and, for an intercept queue, its hardware queue): the processor thread is
/// woken and joined, waiting producers give up, and the doorbell it owns is destroyed.
pub(crate) fn stop_queue(rt: &Runtime, queue: &Queue) {
    queue.stop.store(true, Ordering::Release);
    queue.doorbell.wake.wake_all();
    queue.space.wake_all();
    if let Some(thread) = queue.processor_thread.get() {
        thread.unpark();
    }
    if let Some(handle) = queue.processor.lock().take() {
        join_unless_current(handle);
    }
    if queue.owns_doorbell {
        let _ = rt.destroy_signal(queue.doorbell.handle());
    }
    if let QueueKind::Intercept(state) = &queue.kind {
        stop_queue(rt, &state.hw);
    }
}

/// After [`stop_queue`] of a queue the application destroyed: its ring goes away, as a real
/// queue's does ([`Ring::revoke`]), once no thread of the runtime reads it any more (for an
/// intercept queue, once no thread processes it, see
/// [`revoke_when_idle`](crate::intercept::revoke_when_idle)). Not where the calling thread is
/// the queue's own processor thread, which reads it again on return.
pub(crate) fn revoke_ring(queue: &Queue) {
    match &queue.kind {
        QueueKind::Intercept(state) => crate::intercept::revoke_when_idle(queue, state),
        _ if queue.on_processor_thread() => {}
        _ => queue.revoke_ring_now(),
    }
}

/// Why packet execution stopped early.
enum Halt {
    /// The queue is being destroyed.
    Stopped,
    /// The packet is bad or failed; the queue goes into the error state.
    Failed(hsa_status_t),
}

fn processor_loop(rt: &Arc<Runtime>, queue: &Arc<Queue>) {
    if rt.config.overlap_dispatches {
        return overlapping_processor_loop(rt, queue);
    }
    let _doorbell = queue.doorbell.wake.register();
    loop {
        if queue.is_stopped() {
            return;
        }
        let read = queue.read_index.load(Ordering::Acquire);
        let header = queue.header(read).load(Ordering::Acquire);
        let idle = queue.inactive.load(Ordering::Acquire)
            || queue.errored.load(Ordering::Acquire)
            || packet_type(header) == HSA_PACKET_TYPE_INVALID;
        if idle {
            // A packet that comes soon (the next pass of a replay, the next dispatch of a loop)
            // is picked up without a wake-up; then park, woken by doorbell stores and by
            // stop_queue.
            // The same condition as `idle` above, negated: a packet the queue may not run
            // (inactive, errored) is no reason to stop polling, so the processor parks.
            let next_packet = || {
                let header = queue.header(read).load(Ordering::Acquire);
                let runnable = !queue.inactive.load(Ordering::Acquire)
                    && !queue.errored.load(Ordering::Acquire)
                    && packet_type(header) != HSA_PACKET_TYPE_INVALID;
                (queue.is_stopped() || runnable).then_some(())
            };
            if crate::wake::poll_briefly(None, next_packet).is_none() {
                std::thread::park();
            }
            continue;
        }
        crate::faults::delay(crate::faults::Fault::QueueStall, || queue.is_stopped());
        let packet = queue.read_packet(read);
        match execute(rt, queue, &packet) {
            Ok(()) => queue.consume(read, 1),
            Err(Halt::Stopped) => return,
            Err(Halt::Failed(status)) => queue.fail(status),
        }
    }
}

/// Whether a header has the barrier bit set.
fn has_barrier_bit(header: u16) -> bool {
    header & (1 << hsa_sys::HSA_PACKET_HEADER_BARRIER) != 0
}

/// The processor of `SoftHsaConfig::overlap_dispatches`: kernel dispatches start in queue order,
/// each on a thread of its own, without waiting for earlier dispatches unless their barrier
/// bit says so; any other packet waits until everything before it completed, then runs here.
/// Slots are handed back once every packet launched before them completed (so `read index ==
/// write index` still means idle).
fn overlapping_processor_loop(rt: &Arc<Runtime>, queue: &Arc<Queue>) {
    let _doorbell = queue.doorbell.wake.register();
    let running = Arc::new(AtomicU64::new(0));
    let mut launch = queue.read_index.load(Ordering::Acquire);
    loop {
        if queue.is_stopped() {
            return;
        }
        let read = queue.read_index.load(Ordering::Acquire);
        if running.load(Ordering::Acquire) == 0 && launch > read {
            queue.consume(read, launch - read);
        }
        // Slots are handed back only once everything launched completed: with a whole ring
        // launched, the next slot is that of the oldest launched packet, not a new one.
        let ring_launched = launch - queue.read_index.load(Ordering::Acquire) >= queue.size();
        let header = queue.header(launch).load(Ordering::Acquire);
        let idle = queue.inactive.load(Ordering::Acquire)
            || queue.errored.load(Ordering::Acquire)
            || ring_launched
            || packet_type(header) == HSA_PACKET_TYPE_INVALID;
        let must_wait =
            packet_type(header) != HSA_PACKET_TYPE_KERNEL_DISPATCH || has_barrier_bit(header);
        if idle || (must_wait && running.load(Ordering::Acquire) > 0) {
            // Woken by doorbell stores, by stop_queue and by finishing dispatches (the timeout
            // covers a dispatch that finished before this thread's handle was published).
            std::thread::park_timeout(std::time::Duration::from_millis(1));
            continue;
        }
        let packet = queue.read_packet(launch);
        if packet_type(header) != HSA_PACKET_TYPE_KERNEL_DISPATCH {
            match execute(rt, queue, &packet) {
                Ok(()) => launch += 1,
                Err(Halt::Stopped) => return,
                Err(Halt::Failed(status)) => queue.fail(status),
            }
            continue;
        }
        running.fetch_add(1, Ordering::AcqRel);
        launch += 1;
        let (rt2, q2, running2) = (rt.clone(), queue.clone(), running.clone());
        let spawned = std::thread::Builder::new()
            .name(format!("softhsa-dispatch-{}", queue.hsa.id))
            .spawn(move || {
                let p: hsa_kernel_dispatch_packet_t = packet.read_as(0);
                if let Err(Halt::Failed(status)) = dispatch(&rt2, &q2, &p) {
                    q2.fail(status);
                }
                running2.fetch_sub(1, Ordering::AcqRel);
                if let Some(processor) = q2.processor_thread.get() {
                    processor.unpark();
                }
            });
        if spawned.is_err() {
            running.fetch_sub(1, Ordering::AcqRel);
            queue.fail(HSA_STATUS_ERROR_OUT_OF_RESOURCES);
        }
    }
}

fn execute(rt: &Runtime, queue: &Queue, packet: &Packet) -> Result<(), Halt> {
    match packet_type(packet.header()) {
        HSA_PACKET_TYPE_KERNEL_DISPATCH => dispatch(rt, queue, &packet.read_as(0)),
        HSA_PACKET_TYPE_BARRIER_AND => {
            let p: hsa_barrier_and_packet_t = packet.read_as(0);
            barrier(rt, queue, &p.dep_signal, true, p.completion_signal)
        }
        HSA_PACKET_TYPE_BARRIER_OR => {
            let p: hsa_barrier_or_packet_t = packet.read_as(0);
            barrier(rt, queue, &p.dep_signal, false, p.completion_signal)
        }
        HSA_PACKET_TYPE_VENDOR_SPECIFIC
            if u32::from(packet.amd_format()) == HSA_AMD_PACKET_TYPE_BARRIER_VALUE =>
        {
            barrier_value(rt, queue, &packet.read_as(0))
        }
        _ => Err(Halt::Failed(HSA_STATUS_ERROR_INVALID_PACKET_FORMAT)),
    }
}

fn completion(rt: &Runtime, signal: hsa_signal_t) -> Result<Option<Arc<Signal>>, Halt> {
    if signal.handle == 0 {
        return Ok(None);
    }
    rt.signal(signal.handle).map(Some).map_err(Halt::Failed)
}

fn dispatch(rt: &Runtime, queue: &Queue, p: &hsa_kernel_dispatch_packet_t) -> Result<(), Halt> {
    let dims = usize::from(p.setup & 0x3);
    if dims == 0 {
        return Err(Halt::Failed(HSA_STATUS_ERROR_INVALID_PACKET_FORMAT));
    }
    let wg = [p.workgroup_size_x, p.workgroup_size_y, p.workgroup_size_z].map(u32::from);
    let grid_size = [p.grid_size_x, p.grid_size_y, p.grid_size_z];
    let used = |d: usize, v: [u32; 3]| if d < dims { v[d] } else { 1 };
    let workgroup_size: [u32; 3] = std::array::from_fn(|d| used(d, wg));
    let grid_size: [u32; 3] = std::array::from_fn(|d| used(d, grid_size));
    if workgroup_size.contains(&0) {
        return Err(Halt::Failed(HSA_STATUS_ERROR_INVALID_PACKET_FORMAT));
    }
    let kernel = crate::kernel::lookup_kernel(p.kernel_object)
        .ok_or(Halt::Failed(HSA_STATUS_ERROR_INVALID_CODE_OBJECT))?;
    let done = completion(rt, p.completion_signal)?;
    let counting = crate::counters::Counting::begin(p.completion_signal.handle, queue.agent());
    let grid = Grid {
        kernel,
        grid_size,
        workgroup_size,
        kernarg: p.kernarg_address as usize,
        events: counting.as_ref().map_or(0, |c| c.events_addr()),
    };
    if grid.group_count().is_none() {
        return Err(Halt::Failed(HSA_STATUS_ERROR_INVALID_PACKET_FORMAT));
    }
    crate::faults::delay(crate::faults::Fault::SlowKernel, || queue.is_stopped());
    let start = now_ticks();
    rt.workers
        .run(grid)
        .map_err(|_| Halt::Failed(HSA_STATUS_ERROR_EXCEPTION))?;
    let end = now_ticks();
    if let Some(counting) = counting {
        counting.finish(grid_size, workgroup_size, end.saturating_sub(start));
    }
    if let Some(done) = done {
        if queue.profiling.load(Ordering::Acquire) {
            done.record_dispatch_time(start, end);
        }
        done.complete_one();
    }
    Ok(())
}

fn barrier(
    rt: &Runtime,
    queue: &Queue,
    deps: &[hsa_signal_t],
    all: bool,
    completion_signal: hsa_signal_t,
) -> Result<(), Halt> {
    // A null handle is a satisfied dependency of a barrier-AND packet and an unsatisfied one
    // of a barrier-OR packet (hsa.h), so both drop out here; a barrier-OR packet with only null
    // dependencies then never completes.
    let deps: Vec<Arc<Signal>> = deps
        .iter()
        .filter(|s| s.handle != 0)
        .map(|s| rt.signal(s.handle).map_err(Halt::Failed))
        .collect::<Result<_, _>>()?;
    let done = completion(rt, completion_signal)?;
    let lists: Vec<&WakeList> = deps.iter().map(|s| &s.wake).collect();
    let zero = |s: &Arc<Signal>| s.load(crate::signal::Order::Acquire) == 0;
    block_until(&lists, None, false, || {
        if queue.is_stopped() {
            Some(Err(Halt::Stopped))
        } else if (all && deps.iter().all(zero)) || (!all && deps.iter().any(zero)) {
            Some(Ok(()))
        } else {
            None
        }
    })
    .unwrap_or(Err(Halt::Stopped))?;
    if let Some(done) = done {
        done.complete_one();
    }
    Ok(())
}

fn barrier_value(
    rt: &Runtime,
    queue: &Queue,
    p: &hsa_amd_barrier_value_packet_t,
) -> Result<(), Halt> {
    let signal = rt.signal(p.signal.handle).map_err(Halt::Failed)?;
    if condition_holds(p.cond, 0, 0).is_none() {
        return Err(Halt::Failed(HSA_STATUS_ERROR_INVALID_PACKET_FORMAT));
    }
    let done = completion(rt, p.completion_signal)?;
    block_until(&[&signal.wake], None, false, || {
        let current = signal.load(crate::signal::Order::Acquire) & p.mask;
        if queue.is_stopped() {
            Some(Err(Halt::Stopped))
        } else if condition_holds(p.cond, current, p.value) == Some(true) {
            Some(Ok(()))
        } else {
            None
        }
    })
    .unwrap_or(Err(Halt::Stopped))?;
    if let Some(done) = done {
        done.complete_one();
    }
    Ok(())
}
