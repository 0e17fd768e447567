//! Work that waits on signals, and the replay that holds those signals back.
//!
//! A replay withholds the completion signal of the dispatch it replays until its last pass,
//! and the packets queued behind that dispatch on its queue are not forwarded before the replay
//! ends. Work elsewhere that waits for one of those signals (another queue's barrier packet, an
//! async copy's dependency) cannot start while the replay runs: its queue or copy never becomes
//! idle, and a drain that waited for it would wait out its whole timeout.
//!
//! A queue parked at such a barrier cannot touch memory during the replay either, so the drain
//! treats it as idle, once everything queued before the barrier has completed. To know that, a
//! barrier packet forwarded while its condition does not hold (and a replay service is
//! configured) is bracketed by two markers of kreplay's own, barrier-AND packets with the
//! barrier bit set counted on one signal per queue: the first completes once everything before
//! the barrier has completed, the second once the barrier itself has. One bracket per queue at
//! a time (the markers take slots of the hardware queue the application does not know of): a
//! barrier forwarded while an earlier one is still bracketed goes unbracketed, and a drain
//! waits for it as it would without brackets. A queue whose latest
//! completed marker is the first of a bracket is parked at that barrier: nothing before it runs
//! any more and nothing after it starts until it opens. The drain counts the queue idle when
//! the barrier cannot open during the replay: a barrier-AND with a dependency the replay holds
//! and that has not fired, a barrier-OR whose every dependency is such (one with only null
//! dependencies never opens at all), a barrier-value packet
//! waiting for a held signal to reach 0 (any other value other packets counting the same
//! signal down may reach on their own). The replayed dispatch's own queue parked so is not
//! idle but stuck: the passes would queue behind the barrier and never start, so the replay
//! declines at once (`queue_drain_stuck`) and the dispatch is forwarded behind the barrier.
//!
//! An async copy waiting for a held signal is different: copy engines run their copies in
//! order, so the snapshot's restores and the tool's own copies could queue behind it and never
//! land. The replay declines at once instead (`agent_drain_stuck`, the dispatch runs once)
//! rather than after the drain timeout.
//!
//! "Held" assumes what a correct application does: a dispatch's or a packet's completion signal
//! is decremented by that packet, not by the host in the meantime. Barriers on signals the host
//! (or anything outside the replay) may release keep the replay waiting, as before.

use std::borrow::Cow;
use std::collections::{HashMap, VecDeque};

use hsa_sys::*;
use std::sync::atomic::{AtomicBool, Ordering};

use parking_lot::Mutex;
use smallvec::SmallVec;

use crate::backend::Backend;
use crate::dispatch::Packet;

/// What a barrier packet waits for, by signal handle.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Wait {
    /// Barrier-AND: every dependency at 0.
    All(SmallVec<[u64; 5]>),
    /// Barrier-OR: one dependency at 0.
    Any(SmallVec<[u64; 5]>),
    /// AMD barrier-value: `cond(load(signal) & mask, value)`.
    Value {
        signal: u64,
        cond: u32,
        value: i64,
        mask: i64,
    },
}

/// Byte offset of the AMD vendor format in a vendor-specific packet's header.
const AMD_FORMAT_BYTE: usize = 2;

impl Wait {
    /// What `packet` waits for, if it is a barrier packet with dependencies.
    pub(crate) fn of(packet: &Packet) -> Option<Wait> {
        let deps = |p: &hsa_barrier_and_packet_t| -> SmallVec<[u64; 5]> {
            p.dep_signal
                .iter()
                .map(|s| s.handle)
                .filter(|&h| h != 0)
                .collect()
        };
        match packet.packet_type() {
            HSA_PACKET_TYPE_BARRIER_AND | HSA_PACKET_TYPE_BARRIER_OR => {
                // SAFETY: barrier-AND and barrier-OR packets share one 64-byte plain-data
                // layout; every bit pattern is valid.
                let p = unsafe {
                    std::mem::transmute::<[u8; 64], hsa_barrier_and_packet_t>(*packet.bytes())
                };
                let deps = deps(&p);
                if packet.packet_type() == HSA_PACKET_TYPE_BARRIER_OR {
                    // A null dependency is never satisfied for barrier-OR: with only null
                    // ones the packet never opens (and waits on nothing kreplay holds).
                    Some(Wait::Any(deps))
                } else if deps.is_empty() {
                    None
                } else {
                    Some(Wait::All(deps))
                }
            }
            HSA_PACKET_TYPE_VENDOR_SPECIFIC
                if u32::from(packet.bytes()[AMD_FORMAT_BYTE])
                    == HSA_AMD_PACKET_TYPE_BARRIER_VALUE =>
            {
                // SAFETY: a 64-byte plain-data layout; every bit pattern is valid.
                let p = unsafe {
                    std::mem::transmute::<[u8; 64], hsa_amd_barrier_value_packet_t>(*packet.bytes())
                };
                (p.signal.handle != 0).then_some(Wait::Value {
                    signal: p.signal.handle,
                    cond: p.cond,
                    value: p.value,
                    mask: p.mask,
                })
            }
            _ => None,
        }
    }

    /// Whether the barrier's condition holds with the signals' values now.
    fn holds(&self, b: &Backend) -> bool {
        let fired = |h: u64| b.original.signal_load(hsa_signal_t { handle: h }) == 0;
        match self {
            Wait::All(deps) => deps.iter().all(|&h| fired(h)),
            Wait::Any(deps) => deps.iter().any(|&h| fired(h)),
            Wait::Value {
                signal,
                cond,
                value,
                mask,
            } => {
                let current = b.original.signal_load(hsa_signal_t { handle: *signal }) & mask;
                condition_holds(*cond, current, *value)
            }
        }
    }

    /// Whether the barrier cannot open while the signals of `held` stay as they are: its
    /// condition does not hold now and only held signals could make it hold.
    fn held_shut(&self, b: &Backend, held: &Held) -> bool {
        let held_unfired =
            |h: u64| held.contains(h) && b.original.signal_load(hsa_signal_t { handle: h }) != 0;
        match self {
            Wait::All(deps) => deps.iter().any(|&h| held_unfired(h)),
            Wait::Any(deps) => deps.iter().all(|&h| held_unfired(h)),
            Wait::Value { .. } => self.zero_of().is_some_and(held_unfired),
        }
    }

    /// For a barrier-value packet that waits for its whole signal to reach 0, that signal.
    /// Only such a wait counts as held shut: other packets may count the same signal down, and
    /// any other condition (`== 1`, `< 2`, ...) they alone may satisfy.
    fn zero_of(&self) -> Option<u64> {
        let Wait::Value {
            signal,
            cond,
            value,
            mask: -1,
        } = *self
        else {
            return None;
        };
        let zero = (cond == HSA_SIGNAL_CONDITION_EQ && value == 0)
            || (cond == HSA_SIGNAL_CONDITION_LT && value == 1);
        zero.then_some(signal)
    }
}

/// An HSA signal condition (`hsa_signal_condition_t`); an unknown one never holds.
fn condition_holds(cond: u32, current: i64, value: i64) -> bool {
    match cond {
        HSA_SIGNAL_CONDITION_EQ => current == value,
        HSA_SIGNAL_CONDITION_NE => current != value,
        HSA_SIGNAL_CONDITION_LT => current < value,
        HSA_SIGNAL_CONDITION_GTE => current >= value,
        _ => false,
    }
}

/// The signals a replay holds back: the replayed dispatch's completion signal and those of the
/// packets queued behind it on its queue, not forwarded before the replay ends.
#[derive(Clone, Debug, Default)]
pub(crate) struct Held(SmallVec<[u64; 8]>);

impl Held {
    /// Adds `signal` (0 is no signal); whether it was new.
    pub(crate) fn add(&mut self, signal: hsa_signal_t) -> bool {
        if signal.handle != 0 && !self.contains(signal.handle) {
            self.0.push(signal.handle);
            true
        } else {
            false
        }
    }

    fn contains(&self, handle: u64) -> bool {
        self.0.contains(&handle)
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// The completion signal of any AQL packet (the last 8 bytes of every packet format).
pub(crate) fn completion_signal(packet: &Packet) -> hsa_signal_t {
    let bytes = packet.bytes();
    let mut handle = [0u8; 8];
    handle.copy_from_slice(&bytes[56..64]);
    hsa_signal_t {
        handle: u64::from_ne_bytes(handle),
    }
}

/// One bracketed barrier: its first marker is the `first`-th marker counted on the queue's
/// signal, its second the next one.
#[derive(Debug)]
struct Bracketed {
    first: u64,
    wait: Wait,
    /// Completion signals of the packets forwarded after the barrier (the first
    /// [`BEHIND_KEPT`]): while it stays shut, they cannot fire.
    behind: SmallVec<[u64; 8]>,
}

/// How many completion signals behind a bracketed barrier are kept.
const BEHIND_KEPT: usize = 256;

impl Bracketed {
    fn note_behind(&mut self, packet: &Packet) {
        let signal = completion_signal(packet).handle;
        if signal != 0 && self.behind.len() < BEHIND_KEPT && !self.behind.contains(&signal) {
            self.behind.push(signal);
        }
    }
}

/// The bracketed barriers of one queue (see the module documentation).
#[derive(Default)]
pub(crate) struct WaitLog {
    inner: Mutex<WaitLogInner>,
    /// Whether a barrier is bracketed and not known to have opened (one load on every forward).
    open: AtomicBool,
}

#[derive(Default)]
struct WaitLogInner {
    /// Counts the markers written and not completed (created on first use).
    signal: Option<hsa_signal_t>,
    /// Markers written so far.
    written: u64,
    /// Barriers whose second marker had not completed when last looked at, oldest first.
    open: VecDeque<Bracketed>,
}

impl WaitLogInner {
    /// Markers completed so far (they complete in queue order).
    fn completed(&self, b: &Backend) -> u64 {
        let outstanding = self
            .signal
            .map_or(0, |s| b.original.signal_load(s).max(0) as u64);
        self.written.saturating_sub(outstanding)
    }

    /// Forgets the barriers whose second marker completed.
    fn prune(&mut self, completed: u64) {
        while self.open.front().is_some_and(|w| w.first < completed) {
            self.open.pop_front();
        }
    }
}

impl WaitLog {
    /// `packets` as they go to the hardware queue: every barrier whose condition does not hold
    /// now comes between two markers of the queue's own, and is remembered. Unchanged (and
    /// borrowed) when no packet is such a barrier, or when kreplay cannot create the markers'
    /// signal (a drain then waits for the barrier, as it would without brackets).
    pub(crate) fn bracket<'p>(&self, b: &Backend, packets: &'p [Packet]) -> Cow<'p, [Packet]> {
        let waits: SmallVec<[Option<Wait>; 4]> = packets
            .iter()
            .map(|p| Wait::of(p).filter(|w| !w.holds(b)))
            .collect();
        let waiting = waits.iter().any(Option::is_some);
        if !waiting && !self.open.load(Ordering::Acquire) {
            return Cow::Borrowed(packets);
        }
        let mut log = self.inner.lock();
        let completed = log.completed(b);
        self.prune(&mut log, completed);
        if let Some(open) = log.open.front_mut() {
            // One bracket at a time: the markers take slots of the hardware queue that the
            // application does not know of, so they must stay few (a queue filled with
            // barriers would otherwise block its submitting thread). What goes behind the
            // open one is noted.
            for packet in packets {
                open.note_behind(packet);
            }
            return Cow::Borrowed(packets);
        }
        if !waiting {
            return Cow::Borrowed(packets);
        }
        let signal = match log.signal {
            Some(s) => s,
            None => match b.original.signal_create(0) {
                Ok(s) => *log.signal.insert(s),
                Err(_) => return Cow::Borrowed(packets),
            },
        };
        let mut out = Vec::with_capacity(packets.len() + 2);
        for (packet, wait) in packets.iter().zip(waits) {
            if let Some(open) = log.open.front_mut() {
                open.note_behind(packet);
                out.push(*packet);
                continue;
            }
            let Some(wait) = wait else {
                out.push(*packet);
                continue;
            };
            b.original.signal_add(signal, 2);
            let first = log.written + 1;
            log.written += 2;
            // The barrier's own completion cannot fire while it is shut either.
            let mut bracketed = Bracketed {
                first,
                wait,
                behind: SmallVec::new(),
            };
            bracketed.note_behind(packet);
            log.open.push_back(bracketed);
            let marker = marker(signal);
            out.extend([marker, *packet, marker]);
        }
        self.open.store(true, Ordering::Release);
        Cow::Owned(out)
    }

    /// Whether the queue is parked at a barrier that cannot open while `held` stays held:
    /// everything before that barrier has completed and nothing after it can start.
    pub(crate) fn parked(&self, b: &Backend, held: &Held) -> bool {
        if held.is_empty() {
            return false;
        }
        let mut log = self.inner.lock();
        if log.open.is_empty() {
            return false;
        }
        let completed = log.completed(b);
        self.prune(&mut log, completed);
        log.open
            .front()
            .is_some_and(|w| w.first == completed && w.wait.held_shut(b, held))
    }

    /// Whether any barrier of the queue is bracketed and not known to have opened.
    pub(crate) fn has_open(&self) -> bool {
        self.open.load(Ordering::Acquire)
    }

    /// Forgets the barriers whose second marker completed (`completed` markers did).
    fn prune(&self, log: &mut WaitLogInner, completed: u64) {
        log.prune(completed);
        if log.open.is_empty() {
            self.open.store(false, Ordering::Release);
        }
    }

    /// The completion signals of the packets behind this queue's bracketed barrier, when that
    /// barrier cannot open while `held` stays held: they cannot fire either.
    pub(crate) fn shut_behind(&self, b: &Backend, held: &Held) -> SmallVec<[u64; 8]> {
        if held.is_empty() || !self.has_open() {
            return SmallVec::new();
        }
        let mut log = self.inner.lock();
        let completed = log.completed(b);
        self.prune(&mut log, completed);
        match log.open.front() {
            Some(open) if open.wait.held_shut(b, held) => open.behind.clone(),
            _ => SmallVec::new(),
        }
    }

    /// The markers' signal, for the queue's teardown.
    pub(crate) fn take_signal(&self) -> Option<hsa_signal_t> {
        self.inner.lock().signal.take()
    }
}

/// A bracket marker: a barrier-AND packet with the barrier bit, counted on `signal`.
fn marker(signal: hsa_signal_t) -> Packet {
    let packet = hsa_barrier_and_packet_t {
        header: crate::queues::barrier_header(),
        completion_signal: signal,
        ..Default::default()
    };
    // SAFETY: a barrier-AND packet is 64 bytes of plain data, like every AQL packet.
    Packet::from_bytes(unsafe { std::mem::transmute::<hsa_barrier_and_packet_t, [u8; 64]>(packet) })
}

/// Async copies submitted with dependencies that had not all fired, by kreplay's completion
/// signal of the copy: the agents whose count they are in, and their dependencies (a replay
/// holding one of those back declines at once).
#[derive(Default)]
pub(crate) struct WaitingCopies {
    by_proxy: Mutex<HashMap<u64, WaitingCopy>>,
}

/// A copy's agents (those whose count it is in) and what it waits for.
type WaitingCopy = (SmallVec<[u64; 2]>, Wait);

impl WaitingCopies {
    /// Notes a copy counted on `agents` that starts once every one of `deps` fired, unless
    /// they all have.
    pub(crate) fn submitted(
        &self,
        b: &Backend,
        proxy: hsa_signal_t,
        agents: &[u64],
        deps: &[hsa_signal_t],
    ) {
        let wait = Wait::All(deps.iter().map(|s| s.handle).filter(|&h| h != 0).collect());
        if matches!(&wait, Wait::All(d) if d.is_empty()) || wait.holds(b) {
            return;
        }
        self.by_proxy
            .lock()
            .insert(proxy.handle, (agents.iter().copied().collect(), wait));
    }

    /// Whether any copy waits for dependencies.
    pub(crate) fn any(&self) -> bool {
        !self.by_proxy.lock().is_empty()
    }

    /// Forgets the copy whose completion signal is `proxy` (it landed).
    pub(crate) fn landed(&self, proxy: hsa_signal_t) {
        let mut map = self.by_proxy.lock();
        if !map.is_empty() {
            map.remove(&proxy.handle);
        }
    }

    /// Copies counted on `agent` that cannot start while `held` stays held.
    pub(crate) fn held_on(&self, b: &Backend, agent: u64, held: &Held) -> usize {
        if held.is_empty() {
            return 0;
        }
        self.by_proxy
            .lock()
            .values()
            .filter(|(agents, wait)| agents.contains(&agent) && wait.held_shut(b, held))
            .count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conditions_follow_the_hsa_definitions() {
        assert!(condition_holds(HSA_SIGNAL_CONDITION_EQ, 3, 3));
        assert!(!condition_holds(HSA_SIGNAL_CONDITION_NE, 3, 3));
        assert!(condition_holds(HSA_SIGNAL_CONDITION_LT, 2, 3));
        assert!(condition_holds(HSA_SIGNAL_CONDITION_GTE, 3, 3));
        assert!(
            !condition_holds(99, 3, 3),
            "an unknown condition never holds"
        );
    }

    #[test]
    fn a_packet_s_completion_signal_is_its_last_eight_bytes() {
        let mut bytes = [0u8; 64];
        bytes[56..].copy_from_slice(&0x1234_5678u64.to_ne_bytes());
        assert_eq!(
            completion_signal(&Packet::from_bytes(bytes)).handle,
            0x1234_5678
        );
    }
}
