//! HSA signals: a 64-bit value with atomic operations in every memory order, blocking waits with
//! the four conditions and a timeout, and the bookkeeping the profiling API reads back.

use crate::queue::Queue;
use crate::wake::{WakeList, block_until};
use hsa_sys::{
    HSA_SIGNAL_CONDITION_EQ, HSA_SIGNAL_CONDITION_GTE, HSA_SIGNAL_CONDITION_LT,
    HSA_SIGNAL_CONDITION_NE, HSA_WAIT_STATE_ACTIVE, hsa_signal_condition_t, hsa_signal_value_t,
    hsa_wait_state_t,
};
use std::mem::ManuallyDrop;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::time::Instant;

/// The memory order an HSA entry point names in its suffix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Order {
    /// `_relaxed`
    Relaxed,
    /// `_scacquire` (also the deprecated `_acquire`)
    Acquire,
    /// `_screlease` (also the deprecated `_release`)
    Release,
    /// `_scacq_screl` (also the deprecated `_acq_rel`)
    AcqRel,
}

impl Order {
    fn load(self) -> Ordering {
        match self {
            Order::Relaxed | Order::Release => Ordering::Relaxed,
            Order::Acquire | Order::AcqRel => Ordering::Acquire,
        }
    }

    fn store(self) -> Ordering {
        match self {
            Order::Relaxed | Order::Acquire => Ordering::Relaxed,
            Order::Release | Order::AcqRel => Ordering::Release,
        }
    }

    fn rmw(self) -> Ordering {
        match self {
            Order::Relaxed => Ordering::Relaxed,
            Order::Acquire => Ordering::Acquire,
            Order::Release => Ordering::Release,
            Order::AcqRel => Ordering::AcqRel,
        }
    }
}

/// A read-modify-write signal operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Rmw {
    Add,
    Subtract,
    And,
    Or,
    Xor,
    Exchange,
}

/// Whether `current <cond> compare` holds; `None` for an unknown condition.
pub(crate) fn condition_holds(
    cond: hsa_signal_condition_t,
    current: hsa_signal_value_t,
    compare: hsa_signal_value_t,
) -> Option<bool> {
    Some(match cond {
        HSA_SIGNAL_CONDITION_EQ => current == compare,
        HSA_SIGNAL_CONDITION_NE => current != compare,
        HSA_SIGNAL_CONDITION_LT => current < compare,
        HSA_SIGNAL_CONDITION_GTE => current >= compare,
        _ => return None,
    })
}

/// The part of a signal that a signal handle points to, laid out as ROCm's `amd_signal_t`
/// (hsa/amd_hsa_signal.h): kind, value, mailbox, event id, then the start and end timestamps of
/// the last dispatch or async copy that completed the signal. As on ROCm, a handle is this block's address,
/// so a tools library can carry timestamps from one signal to another the way it would there.
#[repr(C, align(64))]
struct AbiBlock {
    kind: i64,
    value: AtomicI64,
    event_mailbox_ptr: u64,
    event_id: u32,
    reserved1: u32,
    start_ts: AtomicU64,
    end_ts: AtomicU64,
    reserved2: u64,
    reserved3: [u32; 2],
}

/// `AMD_SIGNAL_KIND_USER`.
const KIND_USER: i64 = 1;

/// ABI blocks of dropped signals, the most recently dropped last: a new signal takes one back,
/// so its handle is that of a signal destroyed before, as with ROCm's signal pool, which hands
/// the memory of destroyed signals to the next ones created.
// Boxed: a block's address is its signal's handle, so it never moves.
#[allow(clippy::vec_box)]
static FREE_BLOCKS: parking_lot::Mutex<Vec<Box<AbiBlock>>> = parking_lot::Mutex::new(Vec::new());

/// Blocks [`FREE_BLOCKS`] keeps at most (the others are freed).
const FREE_BLOCKS_MOST: usize = 4096;

/// One signal object. Handles map to these through the runtime's registry.
pub(crate) struct Signal {
    handle: u64,
    /// The value and dispatch timestamps, at the address the handle names (back to
    /// [`FREE_BLOCKS`] when the signal is dropped).
    block: ManuallyDrop<Box<AbiBlock>>,
    /// Threads blocked on this signal.
    pub(crate) wake: WakeList,
    /// Set when this signal is the doorbell of an intercept queue: every store processes it.
    doorbell_of: OnceLock<Weak<Queue>>,
    /// Set once an async copy made with copy profiling on was given this completion signal:
    /// only then does `hsa_amd_profiling_get_async_copy_time` answer for it (as on ROCm, where
    /// the copy records the agent whose clock the timestamps come from).
    profiled_copy: AtomicBool,
    /// Created for device consumers only (a consumer list without a CPU agent, or
    /// `HSA_AMD_SIGNAL_AMD_GPU_ONLY`): ROCm backs such a signal with no interrupt, so it takes
    /// no async handler.
    device_only: AtomicBool,
}

impl Drop for Signal {
    fn drop(&mut self) {
        // SAFETY: `block` is taken once, here, and never used again.
        let block = unsafe { ManuallyDrop::take(&mut self.block) };
        let mut free = FREE_BLOCKS.lock();
        if free.len() < FREE_BLOCKS_MOST {
            free.push(block);
        }
    }
}

impl Signal {
    /// A signal whose handle is the address of its ABI block.
    pub(crate) fn new(initial: hsa_signal_value_t) -> Self {
        let fresh = AbiBlock {
            kind: KIND_USER,
            value: AtomicI64::new(initial),
            event_mailbox_ptr: 0,
            event_id: 0,
            reserved1: 0,
            start_ts: AtomicU64::new(0),
            end_ts: AtomicU64::new(0),
            reserved2: 0,
            reserved3: [0; 2],
        };
        let block = match FREE_BLOCKS.lock().pop() {
            Some(mut block) => {
                *block = fresh;
                block
            }
            None => Box::new(fresh),
        };
        Self {
            handle: std::ptr::from_ref::<AbiBlock>(&block) as u64,
            block: ManuallyDrop::new(block),
            wake: WakeList::default(),
            doorbell_of: OnceLock::new(),
            profiled_copy: AtomicBool::new(false),
            device_only: AtomicBool::new(false),
        }
    }

    /// The handle applications use for this signal.
    pub(crate) fn handle(&self) -> u64 {
        self.handle
    }

    /// Marks this signal as the doorbell of an intercept queue.
    pub(crate) fn set_doorbell_of(&self, queue: Weak<Queue>) {
        let _ = self.doorbell_of.set(queue);
    }

    /// The address of the value, for `hsa_amd_signal_value_pointer`.
    pub(crate) fn value_ptr(&self) -> *mut hsa_signal_value_t {
        self.block.value.as_ptr()
    }

    pub(crate) fn load(&self, order: Order) -> hsa_signal_value_t {
        self.block.value.load(order.load())
    }

    pub(crate) fn store(&self, value: hsa_signal_value_t, order: Order) {
        self.block.value.store(value, order.store());
        self.changed();
    }

    /// A store that wakes nobody (`hsa_signal_silent_store_*`).
    pub(crate) fn silent_store(&self, value: hsa_signal_value_t, order: Order) {
        self.block.value.store(value, order.store());
    }

    /// Applies `op` and returns the previous value.
    pub(crate) fn rmw(&self, op: Rmw, operand: hsa_signal_value_t, order: Order) -> i64 {
        let o = order.rmw();
        let previous = match op {
            Rmw::Add => self.block.value.fetch_add(operand, o),
            Rmw::Subtract => self.block.value.fetch_sub(operand, o),
            Rmw::And => self.block.value.fetch_and(operand, o),
            Rmw::Or => self.block.value.fetch_or(operand, o),
            Rmw::Xor => self.block.value.fetch_xor(operand, o),
            Rmw::Exchange => self.block.value.swap(operand, o),
        };
        self.changed();
        previous
    }

    /// Compare-and-swap; returns the value observed before the operation.
    pub(crate) fn cas(&self, expected: i64, new: i64, order: Order) -> i64 {
        match self
            .block
            .value
            .compare_exchange(expected, new, order.rmw(), order.load())
        {
            Ok(previous) => {
                self.changed();
                previous
            }
            Err(observed) => observed,
        }
    }

    /// Decrements by one with release order (how completions are reported).
    pub(crate) fn complete_one(&self) {
        self.rmw(Rmw::Subtract, 1, Order::Release);
    }

    fn changed(&self) {
        self.wake.wake_all();
        if let Some(queue) = self.doorbell_of.get().and_then(Weak::upgrade) {
            crate::intercept::on_doorbell(&queue);
        }
    }

    /// Blocks until `value <cond> compare` holds or `deadline` passes; returns the value last read.
    pub(crate) fn wait(
        &self,
        cond: hsa_signal_condition_t,
        compare: hsa_signal_value_t,
        deadline: Option<Instant>,
        state: hsa_wait_state_t,
        order: Order,
    ) -> hsa_signal_value_t {
        let spin = state == HSA_WAIT_STATE_ACTIVE;
        let done = block_until(&[&self.wake], deadline, spin, || {
            let current = self.load(order);
            match condition_holds(cond, current, compare) {
                Some(false) => None,
                // An unknown condition can never be waited for: return the value at once.
                Some(true) | None => Some(current),
            }
        });
        done.unwrap_or_else(|| self.load(order))
    }

    /// Records the start and end of the last dispatch that completed with this signal.
    pub(crate) fn record_dispatch_time(&self, start: u64, end: u64) {
        self.block.start_ts.store(start, Ordering::Relaxed);
        self.block.end_ts.store(end, Ordering::Release);
    }

    pub(crate) fn dispatch_time(&self) -> (u64, u64) {
        let end = self.block.end_ts.load(Ordering::Acquire);
        (self.block.start_ts.load(Ordering::Relaxed), end)
    }

    /// Records the start and end of the last async copy that completed with this signal.
    /// (As on ROCm, where one signal's `start_ts`/`end_ts` serve dispatches and copies alike.)
    pub(crate) fn record_copy_time(&self, start: u64, end: u64) {
        self.record_dispatch_time(start, end);
    }

    /// The start and end of the last async copy that completed with this signal; `None` if
    /// no copy made with copy profiling on was given this signal.
    pub(crate) fn copy_time(&self) -> Option<(u64, u64)> {
        self.profiled_copy
            .load(Ordering::Acquire)
            .then(|| self.dispatch_time())
    }

    /// Marks a signal created for device consumers only.
    pub(crate) fn set_device_only(&self) {
        self.device_only.store(true, Ordering::Release);
    }

    pub(crate) fn is_device_only(&self) -> bool {
        self.device_only.load(Ordering::Acquire)
    }

    /// Notes that an async copy made with copy profiling on completes with this signal.
    pub(crate) fn mark_profiled_copy(&self) {
        self.profiled_copy.store(true, Ordering::Release);
    }
}

/// One condition of a multi-signal wait.
pub(crate) struct WaitCondition {
    pub(crate) signal: Arc<Signal>,
    pub(crate) cond: hsa_signal_condition_t,
    pub(crate) compare: hsa_signal_value_t,
}

/// Blocks until one of `conditions` holds; returns its index and the value that satisfied it,
/// or `None` once `deadline` passes. An unknown condition never holds.
pub(crate) fn wait_any(
    conditions: &[WaitCondition],
    deadline: Option<Instant>,
    state: hsa_wait_state_t,
    order: Order,
) -> Option<(usize, hsa_signal_value_t)> {
    let lists: Vec<&WakeList> = conditions.iter().map(|c| &c.signal.wake).collect();
    block_until(&lists, deadline, state == HSA_WAIT_STATE_ACTIVE, || {
        conditions.iter().enumerate().find_map(|(i, c)| {
            let current = c.signal.load(order);
            condition_holds(c.cond, current, c.compare)
                .unwrap_or(false)
                .then_some((i, current))
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use hsa_sys::HSA_WAIT_STATE_BLOCKED;
    use std::time::Duration;

    #[test]
    fn rmw_operations_return_the_previous_value() {
        let s = Signal::new(6);
        assert_eq!(s.rmw(Rmw::Add, 4, Order::Relaxed), 6);
        assert_eq!(s.rmw(Rmw::Subtract, 3, Order::AcqRel), 10);
        assert_eq!(s.rmw(Rmw::And, 0b110, Order::Acquire), 7);
        assert_eq!(s.rmw(Rmw::Or, 0b1000, Order::Release), 0b110);
        assert_eq!(s.rmw(Rmw::Xor, 0b1111, Order::Relaxed), 0b1110);
        assert_eq!(s.rmw(Rmw::Exchange, 42, Order::AcqRel), 0b0001);
        assert_eq!(
            s.cas(41, 0, Order::AcqRel),
            42,
            "failed cas leaves the value"
        );
        assert_eq!(s.cas(42, 0, Order::AcqRel), 42);
        assert_eq!(s.load(Order::Acquire), 0);
    }

    #[test]
    fn a_handle_points_at_the_amd_signal_layout() {
        let s = Signal::new(9);
        s.record_dispatch_time(100, 250);
        let at = |offset: usize| {
            // SAFETY: the handle is the address of the signal's live 64-byte ABI block; the
            // offsets are those of amd_signal_t's kind, value, start_ts and end_ts.
            unsafe { std::ptr::read((s.handle() as usize + offset) as *const i64) }
        };
        assert_eq!((at(0), at(8), at(32), at(40)), (KIND_USER, 9, 100, 250));
    }

    #[test]
    fn conditions_compare_as_the_spec_says() {
        assert_eq!(condition_holds(HSA_SIGNAL_CONDITION_EQ, 1, 1), Some(true));
        assert_eq!(condition_holds(HSA_SIGNAL_CONDITION_NE, 1, 1), Some(false));
        assert_eq!(condition_holds(HSA_SIGNAL_CONDITION_LT, -1, 0), Some(true));
        assert_eq!(condition_holds(HSA_SIGNAL_CONDITION_GTE, 0, 0), Some(true));
        assert_eq!(condition_holds(99, 0, 0), None);
    }

    #[test]
    fn a_timed_out_wait_returns_the_current_value() {
        let s = Signal::new(5);
        let deadline = Some(Instant::now() + Duration::from_millis(5));
        let v = s.wait(
            HSA_SIGNAL_CONDITION_EQ,
            0,
            deadline,
            HSA_WAIT_STATE_BLOCKED,
            Order::Acquire,
        );
        assert_eq!(v, 5);
    }
}
