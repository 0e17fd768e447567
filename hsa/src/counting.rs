//! Per-dispatch hardware counters on HSA: the agent's counter catalogue and the programming of a
//! dispatch (one pass, or one ordinary dispatch) through the runtime's counter extension table
//! (softhsa's, [`hsa_sys::soft_counters`]; a runtime without it has no counters).
//!
//! The tool layer decides, at dispatch time and under the pass's context mask, which counters a
//! dispatch counts ([`crate::ToolHooks::dispatch_counters`]); the backend programs them on the
//! completion signal it waits for and hands the values back
//! ([`crate::ToolHooks::counters_collected`]) once the kernel has completed.

use std::ffi::CStr;
use std::sync::OnceLock;

use hsa_sys::soft_counters::{
    SOFT_COUNTERS_EXTENSION, SOFT_COUNTERS_VERSION_MAJOR, SoftCountersTable, soft_counter_info_t,
};
use hsa_sys::{HSA_STATUS_SUCCESS, hsa_agent_t, hsa_signal_t};
use kreplay_passloop::DispatchInfo;

use crate::backend::{Backend, installed};

/// One counter of an agent's catalogue.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CounterDesc {
    /// Its id on the agent (what a configuration lists).
    pub id: u32,
    /// Its name, e.g. `SQ_WAVES`.
    pub name: String,
    /// What it counts.
    pub description: String,
    /// The hardware block it is counted in (a derived counter: its first input's).
    pub block: String,
    /// How many counters of `block` one pass can count.
    pub block_limit: u32,
    /// Computed from other counters of the same pass.
    pub derived: bool,
    /// The hardware counters it occupies in a pass (itself, for a hardware counter).
    pub inputs: Vec<u32>,
}

/// Why counters cannot be listed or used.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CountingError {
    /// kreplay is not installed into an HSA runtime.
    NotInstalled,
    /// The runtime has no counter extension (counters are softhsa's).
    Unsupported,
    /// The agent is unknown to the runtime.
    InvalidAgent,
    /// The set cannot be counted in one pass (the runtime's reason, naming block and limit).
    PassLimit(String),
    /// A counter id is not in the agent's catalogue.
    UnknownCounter(u32),
}

impl std::fmt::Display for CountingError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CountingError::NotInstalled => f.write_str("kreplay is not installed"),
            CountingError::Unsupported => f.write_str("the HSA runtime provides no counters"),
            CountingError::InvalidAgent => f.write_str("unknown agent"),
            CountingError::PassLimit(why) => f.write_str(why),
            CountingError::UnknownCounter(id) => write!(f, "no counter has id {id} on this agent"),
        }
    }
}

impl std::error::Error for CountingError {}

/// The runtime's counter table, looked up on first success (before `hsa_init` there is none).
fn table(b: &Backend) -> Option<&'static SoftCountersTable> {
    static TABLE: OnceLock<SoftCountersTable> = OnceLock::new();
    if let Some(t) = TABLE.get() {
        return Some(t);
    }
    let get = b.original.core().hsa_system_get_major_extension_table_fn?;
    let mut t = SoftCountersTable::default();
    // SAFETY: the runtime's entry with its HSA signature; `t` is writable for its size.
    let status = unsafe {
        get(
            SOFT_COUNTERS_EXTENSION,
            SOFT_COUNTERS_VERSION_MAJOR,
            size_of::<SoftCountersTable>(),
            (&raw mut t).cast(),
        )
    };
    (status == HSA_STATUS_SUCCESS).then(|| TABLE.get_or_init(|| t))
}

fn installed_table() -> Result<&'static SoftCountersTable, CountingError> {
    let b = installed().ok_or(CountingError::NotInstalled)?;
    table(b).ok_or(CountingError::Unsupported)
}

fn text(p: *const std::ffi::c_char) -> String {
    if p.is_null() {
        return String::new();
    }
    // SAFETY: the runtime hands out NUL-terminated static strings.
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

/// The counters of `agent` (empty for an agent without counters, e.g. a CPU).
pub fn agent_counters(agent: u64) -> Result<Vec<CounterDesc>, CountingError> {
    let t = installed_table()?;
    let (Some(count), Some(info)) = (t.counter_count, t.counter_info) else {
        return Err(CountingError::Unsupported);
    };
    let agent = hsa_agent_t { handle: agent };
    let mut n = 0u32;
    // SAFETY: the extension's entry; `n` is writable.
    if unsafe { count(agent, &mut n) } != HSA_STATUS_SUCCESS {
        return Err(CountingError::InvalidAgent);
    }
    (0..n)
        .map(|id| {
            let mut out = soft_counter_info_t::default();
            // SAFETY: the extension's entry; `out` is writable.
            if unsafe { info(agent, id, &mut out) } != HSA_STATUS_SUCCESS {
                return Err(CountingError::InvalidAgent);
            }
            let inputs = out.inputs[..(out.input_count as usize).min(out.inputs.len())].to_vec();
            Ok(CounterDesc {
                id,
                name: text(out.name),
                description: text(out.description),
                block: text(out.block),
                block_limit: out.block_limit,
                derived: out.is_derived != 0,
                inputs,
            })
        })
        .collect()
}

/// Checks that `ids` can be counted together in one pass on `agent`.
pub fn check_counters(agent: u64, ids: &[u32]) -> Result<(), CountingError> {
    let t = installed_table()?;
    let check = t.check.ok_or(CountingError::Unsupported)?;
    let mut message = [0 as std::ffi::c_char; 512];
    // SAFETY: the extension's entry; `ids` holds its length, `message` its length.
    let status = unsafe {
        check(
            hsa_agent_t { handle: agent },
            ids.as_ptr(),
            ids.len() as u32,
            message.as_mut_ptr(),
            message.len(),
        )
    };
    if status == HSA_STATUS_SUCCESS {
        return Ok(());
    }
    let why = text(message.as_ptr());
    Err(if why.is_empty() {
        CountingError::InvalidAgent
    } else {
        CountingError::PassLimit(why)
    })
}

/// Counters programmed for one dispatch or pass.
#[derive(Debug)]
pub(crate) struct Programmed {
    info: DispatchInfo,
    pass: Option<u64>,
    ids: Vec<u32>,
}

/// Asks the tool layer what `info` (pass `pass`) counts and programs it on `signal`, the
/// completion signal kreplay waits for. `None` when nothing is counted.
pub(crate) fn program(
    b: &Backend,
    info: &DispatchInfo,
    pass: Option<u64>,
    signal: hsa_signal_t,
) -> Option<Programmed> {
    if !b.hooks.counting_configured() {
        return None;
    }
    let ids = b.hooks.dispatch_counters(info, pass)?;
    let program = table(b)?.program?;
    let agent = hsa_agent_t {
        handle: info.agent_id,
    };
    // SAFETY: the extension's entry; `ids` holds its length.
    let status = unsafe { program(agent, signal, ids.as_ptr(), ids.len() as u32) };
    if status != HSA_STATUS_SUCCESS {
        b.hooks.warn(&format!(
            "dispatch {}: the runtime refused to program {} counters (status {status:#x})",
            info.dispatch_id,
            ids.len()
        ));
        return None;
    }
    Some(Programmed {
        info: *info,
        pass,
        ids,
    })
}

/// Reads what the completed dispatch counted on `signal` and hands it to the tool layer.
pub(crate) fn collect(b: &Backend, programmed: Programmed, signal: hsa_signal_t) {
    if let Some(collected) = read(b, programmed, signal) {
        collected.deliver(b);
    }
}

/// What one dispatch counted, read from its signal and not yet given to the tool layer.
pub(crate) struct Collected {
    programmed: Programmed,
    values: Vec<f64>,
}

impl Collected {
    /// Gives the values to the tool layer.
    pub(crate) fn deliver(self, b: &Backend) {
        let p = &self.programmed;
        b.hooks
            .counters_collected(&p.info, p.pass, &p.ids, &self.values);
    }
}

/// Reads what `programmed` counted on `signal` (before the signal goes away), to be delivered
/// later; `None` when nothing could be read (said so).
pub(crate) fn read(b: &Backend, programmed: Programmed, signal: hsa_signal_t) -> Option<Collected> {
    let read = table(b).and_then(|t| t.read)?;
    let mut values = vec![0.0; programmed.ids.len()];
    // SAFETY: the extension's entry; `values` has room for every programmed counter.
    let status = unsafe { read(signal, values.as_mut_ptr(), values.len() as u32) };
    if status != HSA_STATUS_SUCCESS {
        b.hooks.warn(&format!(
            "dispatch {}: its counters could not be read (status {status:#x})",
            programmed.info.dispatch_id
        ));
        return None;
    }
    Some(Collected { programmed, values })
}
