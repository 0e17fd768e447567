//! Hardware-like performance counters.
//!
//! A dispatch whose completion signal was programmed (through the extension table in
//! [`hsa_sys::soft_counters`]) is counted: softhsa accounts the geometry (work-items,
//! work-groups, wavefronts) and the duration itself, and kernels report their memory traffic
//! through the [`WorkGroup`] they are handed ([`WorkGroup::count_load`],
//! [`WorkGroup::count_store`], [`WorkGroup::count_atomics`]). Like a real agent, each hardware
//! block counts only a few counters per dispatch: programming more is refused with a message
//! naming the block and its limit. Derived counters are computed from hardware counters counted
//! in the same pass.

use crate::kernel::WorkGroup;
use hsa_sys::soft_counters::{
    SOFT_COUNTERS_EXTENSION, SOFT_COUNTERS_MAX_INPUTS, SOFT_COUNTERS_VERSION_MAJOR,
    SoftCountersTable, soft_counter_info_t,
};
use hsa_sys::{
    HSA_STATUS_ERROR_INVALID_ARGUMENT, HSA_STATUS_ERROR_INVALID_INDEX,
    HSA_STATUS_ERROR_INVALID_SIGNAL, HSA_STATUS_ERROR_OUT_OF_RESOURCES, HSA_STATUS_SUCCESS,
    hsa_agent_t, hsa_signal_t, hsa_status_t,
};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::ffi::{CStr, c_char, c_void};
use std::sync::atomic::{AtomicU64, Ordering};

/// Work-items per wavefront on every softhsa GPU agent.
pub const WAVEFRONT_SIZE: u64 = 64;

/// An event softhsa counts for a dispatch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Event {
    WorkItems,
    WorkGroups,
    Waves,
    Loads,
    LoadBytes,
    Stores,
    StoreBytes,
    Atomics,
    DurationNs,
}

const EVENTS: usize = 9;

/// A hardware block: its name and how many of its counters one dispatch can count.
struct Block {
    name: &'static CStr,
    limit: u32,
}

const SQ: usize = 0;
const TCP: usize = 1;
const TCC: usize = 2;
const GRBM: usize = 3;

const BLOCKS: [Block; 4] = [
    Block {
        name: c"SQ",
        limit: 2,
    },
    Block {
        name: c"TCP",
        limit: 2,
    },
    Block {
        name: c"TCC",
        limit: 1,
    },
    Block {
        name: c"GRBM",
        limit: 1,
    },
];

enum Source {
    Hardware {
        block: usize,
        event: Event,
    },
    Derived {
        inputs: &'static [u32],
        f: fn(&[f64]) -> f64,
    },
}

struct Counter {
    name: &'static CStr,
    description: &'static CStr,
    source: Source,
}

const fn hw(
    name: &'static CStr,
    block: usize,
    event: Event,
    description: &'static CStr,
) -> Counter {
    Counter {
        name,
        description,
        source: Source::Hardware { block, event },
    }
}

fn ratio(n: f64, d: f64) -> f64 {
    if d == 0.0 { 0.0 } else { n / d }
}

/// Every GPU agent's catalogue; a counter's id is its index.
static CATALOGUE: [Counter; 13] = [
    hw(c"SQ_WAVES", SQ, Event::Waves, c"Wavefronts launched (64 work-items each, partial ones counted)."),
    hw(c"SQ_WORKGROUPS", SQ, Event::WorkGroups, c"Work-groups launched."),
    hw(c"SQ_WORK_ITEMS", SQ, Event::WorkItems, c"Work-items launched."),
    hw(c"SQ_INSTS_VMEM_RD", SQ, Event::Loads, c"Global memory load instructions executed."),
    hw(c"SQ_INSTS_VMEM_WR", SQ, Event::Stores, c"Global memory store instructions executed."),
    hw(c"TCP_READ_BYTES", TCP, Event::LoadBytes, c"Bytes loaded from global memory."),
    hw(c"TCP_WRITE_BYTES", TCP, Event::StoreBytes, c"Bytes stored to global memory."),
    hw(c"TCC_ATOMIC", TCC, Event::Atomics, c"Atomic operations on global memory."),
    hw(c"GRBM_DURATION_NS", GRBM, Event::DurationNs, c"Kernel duration in nanoseconds."),
    Counter {
        name: c"MEM_BYTES",
        description: c"Bytes loaded plus bytes stored (TCP_READ_BYTES + TCP_WRITE_BYTES).",
        source: Source::Derived {
            inputs: &[5, 6],
            f: |v| v[0] + v[1],
        },
    },
    Counter {
        name: c"BYTES_PER_ITEM",
        description: c"Global memory bytes per work-item ((TCP_READ_BYTES + TCP_WRITE_BYTES) / SQ_WORK_ITEMS).",
        source: Source::Derived {
            inputs: &[5, 6, 2],
            f: |v| ratio(v[0] + v[1], v[2]),
        },
    },
    Counter {
        name: c"ATOMIC_FRACTION",
        description: c"Share of memory instructions that are atomics (TCC_ATOMIC / (SQ_INSTS_VMEM_RD + SQ_INSTS_VMEM_WR + TCC_ATOMIC)).",
        source: Source::Derived {
            inputs: &[7, 3, 4],
            f: |v| ratio(v[0], v[0] + v[1] + v[2]),
        },
    },
    Counter {
        name: c"ITEMS_PER_WAVE",
        description: c"Average work-items per wavefront (SQ_WORK_ITEMS / SQ_WAVES).",
        source: Source::Derived {
            inputs: &[2, 0],
            f: |v| ratio(v[0], v[1]),
        },
    },
];

/// The events of one dispatch in progress, added to by every work-group.
#[derive(Default)]
pub(crate) struct DispatchEvents {
    events: [AtomicU64; EVENTS],
}

impl DispatchEvents {
    fn add(&self, event: Event, n: u64) {
        self.events[event as usize].fetch_add(n, Ordering::Relaxed);
    }

    fn get(&self, event: Event) -> u64 {
        self.events[event as usize].load(Ordering::Relaxed)
    }
}

impl WorkGroup {
    fn events(&self) -> Option<&DispatchEvents> {
        // SAFETY: a non-null pointer names the DispatchEvents of the dispatch this group belongs
        // to, which outlives every work-group of it (`dispatch` waits for the whole grid).
        unsafe { self.events_ptr().as_ref() }
    }

    /// Reports `count` global memory loads of `bytes` bytes in total.
    pub fn count_load(&self, count: u64, bytes: u64) {
        if let Some(e) = self.events() {
            e.add(Event::Loads, count);
            e.add(Event::LoadBytes, bytes);
        }
    }

    /// Reports `count` global memory stores of `bytes` bytes in total.
    pub fn count_store(&self, count: u64, bytes: u64) {
        if let Some(e) = self.events() {
            e.add(Event::Stores, count);
            e.add(Event::StoreBytes, bytes);
        }
    }

    /// Reports `count` atomic operations on global memory.
    pub fn count_atomics(&self, count: u64) {
        if let Some(e) = self.events() {
            e.add(Event::Atomics, count);
        }
    }

    /// Whether this dispatch is being counted (a kernel may skip its own bookkeeping if not).
    pub fn counting(&self) -> bool {
        !self.events_ptr().is_null()
    }
}

/// Counters programmed for the next dispatch completing a signal, then its values.
enum Slot {
    /// For the next dispatch on this agent (its index) completing the signal.
    Programmed(usize, Vec<u32>),
    Counted(Vec<f64>),
}

static SLOTS: Mutex<Option<HashMap<u64, Slot>>> = Mutex::new(None);

/// A dispatch being counted: created before its grid runs, finished before its completion.
pub(crate) struct Counting {
    signal: u64,
    ids: Vec<u32>,
    events: Box<DispatchEvents>,
}

impl Counting {
    /// Takes the programming of `signal` for a dispatch on `agent` (its index), if any: a
    /// dispatch on another agent completing the same signal leaves it for the next one on
    /// `agent`.
    pub(crate) fn begin(signal: u64, agent: usize) -> Option<Self> {
        if signal == 0 {
            return None;
        }
        let mut slots = SLOTS.lock();
        let map = slots.as_mut()?;
        if !matches!(map.get(&signal), Some(Slot::Programmed(a, _)) if *a == agent) {
            return None;
        }
        let Some(Slot::Programmed(_, ids)) = map.remove(&signal) else {
            return None;
        };
        Some(Self {
            signal,
            ids,
            events: Box::default(),
        })
    }

    /// The address work-groups report to (as an integer, so the grid can move between threads).
    pub(crate) fn events_addr(&self) -> usize {
        (&raw const *self.events) as usize
    }

    /// Adds softhsa's own accounting and publishes the values for `read`.
    pub(crate) fn finish(self, grid_size: [u32; 3], workgroup_size: [u32; 3], duration_ns: u64) {
        let (items, groups, waves) = geometry(grid_size, workgroup_size);
        self.events.add(Event::WorkItems, items);
        self.events.add(Event::WorkGroups, groups);
        self.events.add(Event::Waves, waves);
        self.events.add(Event::DurationNs, duration_ns);
        let values = self.ids.iter().map(|&id| value(id, &self.events)).collect();
        SLOTS
            .lock()
            .get_or_insert_with(HashMap::new)
            .insert(self.signal, Slot::Counted(values));
    }
}

fn value(id: u32, events: &DispatchEvents) -> f64 {
    match &CATALOGUE[id as usize].source {
        Source::Hardware { event, .. } => events.get(*event) as f64,
        Source::Derived { inputs, f } => {
            let v: Vec<f64> = inputs.iter().map(|&i| value(i, events)).collect();
            f(&v)
        }
    }
}

/// Work-items, work-groups and wavefronts of a grid (partial groups at the edges included).
fn geometry(grid: [u32; 3], wg: [u32; 3]) -> (u64, u64, u64) {
    // Per dimension: (group size, how many groups have it).
    let dims: [[(u64, u64); 2]; 3] = std::array::from_fn(|d| {
        let (g, w) = (u64::from(grid[d]), u64::from(wg[d].max(1)));
        [(w, g / w), (g % w, u64::from(g % w != 0))]
    });
    let (mut items, mut groups, mut waves) = (0u64, 0u64, 0u64);
    for &(x, nx) in &dims[0] {
        for &(y, ny) in &dims[1] {
            for &(z, nz) in &dims[2] {
                let n = nx * ny * nz;
                let size = x * y * z;
                if n == 0 || size == 0 {
                    continue;
                }
                groups += n;
                items += n * size;
                waves += n * size.div_ceil(WAVEFRONT_SIZE);
            }
        }
    }
    (items, groups, waves)
}

/// The hardware counters `ids` occupy, or why they cannot be counted in one pass.
fn check_ids(ids: &[u32]) -> Result<(), String> {
    let mut hardware: Vec<u32> = Vec::new();
    for &id in ids {
        let counter = CATALOGUE
            .get(id as usize)
            .ok_or_else(|| format!("no counter has id {id}"))?;
        match &counter.source {
            Source::Hardware { .. } => hardware.push(id),
            Source::Derived { inputs, .. } => hardware.extend_from_slice(inputs),
        }
    }
    hardware.sort_unstable();
    hardware.dedup();
    for (b, block) in BLOCKS.iter().enumerate() {
        let used: Vec<&str> = hardware
            .iter()
            .filter(|&&h| matches!(CATALOGUE[h as usize].source, Source::Hardware { block, .. } if block == b))
            .map(|&h| CATALOGUE[h as usize].name.to_str().unwrap_or("?"))
            .collect();
        if used.len() > block.limit as usize {
            return Err(format!(
                "block {} can count at most {} counters in one pass, but this set needs {} ({})",
                block.name.to_str().unwrap_or("?"),
                block.limit,
                used.len(),
                used.join(", ")
            ));
        }
    }
    Ok(())
}

/// Counters of a GPU agent; a CPU agent (or a stale handle) has none.
fn agent_counters(agent: hsa_agent_t) -> Result<usize, hsa_status_t> {
    let rt = crate::runtime::current()?;
    match rt.gpu_agent(agent.handle) {
        Ok(_) => Ok(CATALOGUE.len()),
        Err(_) => rt.agent(agent.handle).map(|_| 0),
    }
}

unsafe extern "C" fn counter_count(agent: hsa_agent_t, count: *mut u32) -> hsa_status_t {
    crate::api::guard(|| {
        let n = agent_counters(agent)?;
        // SAFETY: the caller passes a writable u32 (null is refused by `put`).
        unsafe { crate::api::put(count, n as u32) }
    })
}

unsafe extern "C" fn counter_info(
    agent: hsa_agent_t,
    index: u32,
    info: *mut soft_counter_info_t,
) -> hsa_status_t {
    crate::api::guard(|| {
        if index as usize >= agent_counters(agent)? {
            return Err(HSA_STATUS_ERROR_INVALID_INDEX);
        }
        let counter = &CATALOGUE[index as usize];
        let mut out = soft_counter_info_t {
            name: counter.name.as_ptr(),
            description: counter.description.as_ptr(),
            ..Default::default()
        };
        let inputs: &[u32] = match &counter.source {
            Source::Hardware { .. } => std::slice::from_ref(&index),
            Source::Derived { inputs, .. } => inputs,
        };
        let first = match CATALOGUE[inputs[0] as usize].source {
            Source::Hardware { block, .. } => block,
            Source::Derived { .. } => unreachable!("derived counters have hardware inputs"),
        };
        out.block = BLOCKS[first].name.as_ptr();
        out.block_limit = BLOCKS[first].limit;
        out.is_derived = u32::from(matches!(counter.source, Source::Derived { .. }));
        out.input_count = inputs.len() as u32;
        out.inputs[..inputs.len()].copy_from_slice(inputs);
        debug_assert!(inputs.len() <= SOFT_COUNTERS_MAX_INPUTS);
        // SAFETY: the caller passes a writable soft_counter_info_t (null is refused by `put`).
        unsafe { crate::api::put(info, out) }
    })
}

/// Reads a caller's id array.
///
/// # Safety
/// A non-null `ids` must point to `count` readable u32s.
unsafe fn ids_from(ids: *const u32, count: u32) -> Result<Vec<u32>, hsa_status_t> {
    if count == 0 {
        return Ok(Vec::new());
    }
    if ids.is_null() {
        return Err(HSA_STATUS_ERROR_INVALID_ARGUMENT);
    }
    // SAFETY: non-null, and the caller guarantees `count` readable u32s.
    Ok(unsafe { std::slice::from_raw_parts(ids, count as usize) }.to_vec())
}

unsafe extern "C" fn check(
    agent: hsa_agent_t,
    ids: *const u32,
    count: u32,
    message: *mut c_char,
    message_len: usize,
) -> hsa_status_t {
    crate::api::guard(|| {
        let n = agent_counters(agent)?;
        // SAFETY: forwarded from the caller's contract.
        let ids = unsafe { ids_from(ids, count) }?;
        let result = if n == 0 && !ids.is_empty() {
            Err("this agent has no counters".to_owned())
        } else {
            check_ids(&ids)
        };
        let Err(reason) = result else { return Ok(()) };
        if !message.is_null() && message_len > 0 {
            let bytes = reason.as_bytes();
            let len = bytes.len().min(message_len - 1);
            // SAFETY: the caller guarantees `message_len` writable bytes at `message`.
            unsafe {
                std::ptr::copy_nonoverlapping(bytes.as_ptr(), message.cast::<u8>(), len);
                message.add(len).write(0);
            }
        }
        Err(HSA_STATUS_ERROR_OUT_OF_RESOURCES)
    })
}

unsafe extern "C" fn program(
    agent: hsa_agent_t,
    signal: hsa_signal_t,
    ids: *const u32,
    count: u32,
) -> hsa_status_t {
    crate::api::guard(|| {
        let rt = crate::runtime::current()?;
        let agent = rt.gpu_agent(agent.handle)?;
        rt.signal(signal.handle)?;
        // SAFETY: forwarded from the caller's contract.
        let ids = unsafe { ids_from(ids, count) }?;
        check_ids(&ids).map_err(|_| HSA_STATUS_ERROR_OUT_OF_RESOURCES)?;
        SLOTS
            .lock()
            .get_or_insert_with(HashMap::new)
            .insert(signal.handle, Slot::Programmed(agent, ids));
        Ok(())
    })
}

unsafe extern "C" fn read(signal: hsa_signal_t, values: *mut f64, count: u32) -> hsa_status_t {
    crate::api::guard(|| {
        let slot = SLOTS
            .lock()
            .as_mut()
            .and_then(|map| map.remove(&signal.handle));
        let Some(Slot::Counted(counted)) = slot else {
            return Err(HSA_STATUS_ERROR_INVALID_SIGNAL);
        };
        if counted.len() != count as usize || (count > 0 && values.is_null()) {
            return Err(HSA_STATUS_ERROR_INVALID_ARGUMENT);
        }
        if count > 0 {
            // SAFETY: the caller guarantees `count` writable f64s at `values`.
            unsafe { std::ptr::copy_nonoverlapping(counted.as_ptr(), values, counted.len()) };
        }
        Ok(())
    })
}

static TABLE: SoftCountersTable = SoftCountersTable {
    counter_count: Some(counter_count),
    counter_info: Some(counter_info),
    check: Some(check),
    program: Some(program),
    read: Some(read),
};

/// `hsa_system_get_major_extension_table` for the counter extension: copies the table (at most
/// `length` bytes of it) to `out`.
pub(crate) fn major_extension_table(
    extension: u16,
    version_major: u16,
    length: usize,
    out: *mut c_void,
) -> hsa_status_t {
    crate::api::guard(|| {
        crate::runtime::current()?;
        if extension != SOFT_COUNTERS_EXTENSION || version_major != SOFT_COUNTERS_VERSION_MAJOR {
            return Err(hsa_sys::HSA_STATUS_ERROR);
        }
        if out.is_null() {
            return Err(HSA_STATUS_ERROR_INVALID_ARGUMENT);
        }
        let len = length.min(std::mem::size_of::<SoftCountersTable>());
        // SAFETY: the caller guarantees `length` writable bytes at `out`; we copy at most that.
        unsafe {
            std::ptr::copy_nonoverlapping((&raw const TABLE).cast::<u8>(), out.cast::<u8>(), len)
        };
        Ok(())
    })
}

const _: () = assert!(HSA_STATUS_SUCCESS == 0);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn geometry_counts_partial_groups_and_waves() {
        // 100 items in groups of 64: groups of 64 and 36, one wave each.
        assert_eq!(geometry([100, 1, 1], [64, 1, 1]), (100, 2, 2));
        // 10x10 in 4x4 groups: 3x3 groups; sizes 16,16,8 / 16,16,8 / 8,8,4.
        assert_eq!(geometry([10, 10, 1], [4, 4, 1]), (100, 9, 9));
        // A group of 256 items is 4 waves.
        assert_eq!(geometry([512, 1, 1], [256, 1, 1]), (512, 2, 8));
    }

    #[test]
    fn a_set_over_a_block_limit_is_refused_naming_the_block_and_limit() {
        let err = check_ids(&[0, 1, 2, 3, 4]).unwrap_err();
        assert!(err.contains("block SQ can count at most 2"), "{err}");
        assert!(err.contains("SQ_INSTS_VMEM_WR"), "{err}");
        // Derived counters occupy their inputs: MEM_BYTES + TCP_READ_BYTES fit TCP's 2.
        assert!(check_ids(&[9, 5]).is_ok());
        // ATOMIC_FRACTION needs RD and WR (SQ's 2); BYTES_PER_ITEM would add SQ_WORK_ITEMS.
        assert!(check_ids(&[11, 9]).is_ok());
        assert!(check_ids(&[11, 10]).unwrap_err().contains("needs 3"));
        assert!(
            check_ids(&[99])
                .unwrap_err()
                .contains("no counter has id 99")
        );
    }
}
