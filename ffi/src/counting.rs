//! Dispatch counter collection: an agent's counters, counter configurations, pass planning and
//! the dispatch counting service (the `kreplay_*counter*` functions of the header).
//!
//! At most one dispatch counting service exists in a process (one configuration can be
//! programmed per dispatch). For every dispatch, and for every pass of a replayed one, the
//! backend asks `pick` on the submitting thread: if the service's context is active there and
//! then (started, and not masked off for this pass), the tool's dispatch callback picks a
//! configuration, which the backend programs. Once the kernel has completed, `deliver` hands
//! the values to the tool's record callback: one record per counter, each with the dispatch id
//! and the pass. Nothing is summed across passes: a counter counted in two passes gives two
//! records.
//!
//! ```no_run
//! use kreplay::counting;
//! // After kreplay is installed and the runtime initialized:
//! let counters = counting::agent_counters(1).unwrap();
//! let ids: Vec<u32> = counters.iter().map(|c| c.id).collect();
//! let passes = counting::plan(1, &ids).unwrap();
//! println!("{} counters need {} passes", ids.len(), passes.len());
//! ```

use std::collections::HashMap;
use std::ffi::{CString, c_void};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use kreplay_ctxmask::{ContextId, ContextRegistry};
use kreplay_hsa::{CounterDesc, CountingError};
use kreplay_passloop::{DispatchInfo, HardwareCounter, PlanError, plan_groups};
use parking_lot::{Mutex, RwLock};

use crate::abi::{
    AgentId, ContextHandle, CounterConfigId, CounterId, CounterInfo, CounterRecord,
    CounterRecordFn, DispatchCountingFn, REPLAY_PASS_NONE, Status,
};
use crate::services;

/// Why a counter request failed, with the status the C interface returns for it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CountingFailure {
    /// The C status.
    pub status: Status,
    /// What went wrong, for a person.
    pub message: String,
}

impl std::fmt::Display for CountingFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for CountingFailure {}

fn failure(status: Status, message: impl Into<String>) -> CountingFailure {
    CountingFailure {
        status,
        message: message.into(),
    }
}

impl From<CountingError> for CountingFailure {
    fn from(e: CountingError) -> Self {
        let status = match e {
            CountingError::NotInstalled => Status::ERROR_NOT_INITIALIZED,
            CountingError::PassLimit(_) => Status::ERROR_EXCEEDS_PASS_LIMIT,
            CountingError::Unsupported
            | CountingError::InvalidAgent
            | CountingError::UnknownCounter(_) => Status::ERROR_INVALID_ARGUMENT,
        };
        failure(status, e.to_string())
    }
}

/// An agent's catalogue, with the C strings its `CounterInfo`s point into (kept for the life
/// of the process).
struct Catalogue {
    counters: Vec<CounterDesc>,
    infos: Vec<CounterInfo>,
    _strings: Vec<CString>,
}

// SAFETY: the raw pointers in `infos` point into `_strings`, owned by the same value and never
// mutated; sharing them between threads is sharing immutable C strings.
unsafe impl Send for Catalogue {}
// SAFETY: as above.
unsafe impl Sync for Catalogue {}

static CATALOGUES: Mutex<Option<HashMap<u64, Arc<Catalogue>>>> = Mutex::new(None);

fn catalogue(agent: u64) -> Result<Arc<Catalogue>, CountingFailure> {
    if let Some(c) = CATALOGUES.lock().as_ref().and_then(|m| m.get(&agent)) {
        return Ok(Arc::clone(c));
    }
    let counters = kreplay_hsa::agent_counters(agent).map_err(|e| match e {
        // Not "not loaded yet": kreplay runs under CUDA, and calling again later changes nothing.
        CountingError::NotInstalled if crate::cuda_tool::cuda_backend() => failure(
            Status::ERROR_INVALID_ARGUMENT,
            "counter collection is HSA-only: launches on the CUDA backend have no counters",
        ),
        e => e.into(),
    })?;
    let mut strings = Vec::new();
    let mut infos = Vec::new();
    for c in &counters {
        let cstr = |s: &str| CString::new(s.replace('\0', " ")).unwrap_or_default();
        let (name, description, block) = (cstr(&c.name), cstr(&c.description), cstr(&c.block));
        infos.push(CounterInfo {
            size: size_of::<CounterInfo>() as u64,
            id: CounterId {
                handle: u64::from(c.id) + 1,
            },
            name: name.as_ptr(),
            description: description.as_ptr(),
            block: block.as_ptr(),
            block_limit: c.block_limit,
            is_derived: u32::from(c.derived),
        });
        strings.extend([name, description, block]);
    }
    Ok(publish(
        agent,
        Catalogue {
            counters,
            infos,
            _strings: strings,
        },
    ))
}

/// Makes `catalogue` the one of `agent` unless another thread published one first, and returns
/// the agent's catalogue. The first one stays for the process: its strings were handed out.
fn publish(agent: u64, catalogue: Catalogue) -> Arc<Catalogue> {
    Arc::clone(
        CATALOGUES
            .lock()
            .get_or_insert_with(HashMap::new)
            .entry(agent)
            .or_insert_with(|| Arc::new(catalogue)),
    )
}

/// This module's locks in the order they nest, taken before a fork (see `crate::fork`).
pub(crate) static FORK_LOCKS: [&crate::fork::Held; 3] = [&SERVICE, &CONFIGS, &CATALOGUES];

/// The counters of `agent` (for HSA: an `hsa_agent_t` handle).
pub fn agent_counters(agent: u64) -> Result<Vec<CounterDesc>, CountingFailure> {
    Ok(catalogue(agent)?.counters.clone())
}

/// Calls `f` with the C view of `agent`'s counters.
pub(crate) fn with_counter_infos<R>(
    agent: u64,
    f: impl FnOnce(&[CounterInfo]) -> R,
) -> Result<R, CountingFailure> {
    Ok(f(&catalogue(agent)?.infos))
}

/// The catalogue index of a C counter id.
pub fn counter_index(id: CounterId) -> Option<u32> {
    u32::try_from(id.handle.checked_sub(1)?).ok()
}

fn check_known(c: &Catalogue, ids: &[u32]) -> Result<(), CountingFailure> {
    match ids.iter().find(|&&id| id as usize >= c.counters.len()) {
        Some(id) => Err(CountingError::UnknownCounter(*id).into()),
        None => Ok(()),
    }
}

/// Splits `ids` (catalogue indices of `agent`) into the fewest groups that can each be counted
/// in one pass. Each group lists its ids in request order; a duplicate request is counted once.
pub fn plan(agent: u64, ids: &[u32]) -> Result<Vec<Vec<u32>>, CountingFailure> {
    let c = catalogue(agent)?;
    check_known(&c, ids)?;
    let mut unique: Vec<u32> = Vec::new();
    for &id in ids {
        if !unique.contains(&id) {
            unique.push(id);
        }
    }
    let mut blocks: Vec<(String, u32)> = Vec::new();
    let mut block_of = |name: &str, limit: u32| match blocks.iter().position(|(b, _)| b == name) {
        Some(i) => i,
        None => {
            blocks.push((name.to_owned(), limit));
            blocks.len() - 1
        }
    };
    let requests: Vec<Vec<HardwareCounter>> = unique
        .iter()
        .map(|&id| {
            c.counters[id as usize]
                .inputs
                .iter()
                .map(|&input| {
                    let hw = &c.counters[input as usize];
                    HardwareCounter {
                        block: block_of(&hw.block, hw.block_limit),
                        id: input,
                    }
                })
                .collect()
        })
        .collect();
    let limits: Vec<u32> = blocks.iter().map(|(_, l)| *l).collect();
    match plan_groups(&requests, &limits) {
        Ok(groups) => Ok(groups
            .into_iter()
            .map(|g| g.into_iter().map(|i| unique[i]).collect())
            .collect()),
        Err(PlanError::DoesNotFit {
            request,
            block,
            limit,
            needs,
        }) => Err(failure(
            Status::ERROR_EXCEEDS_PASS_LIMIT,
            format!(
                "{} alone needs {needs} counters of block {}, which counts at most {limit} per \
                 pass",
                c.counters[unique[request] as usize].name, blocks[block].0
            ),
        )),
        Err(e) => Err(failure(Status::ERROR, e.to_string())),
    }
}

/// Whether `ids` (known to `c`) fit one pass by the catalogue's blocks and their per-pass
/// limits (counters sharing a hardware counter share it), as [`plan`] packs them; the message
/// names the block over its limit.
fn fits_one_pass(c: &Catalogue, ids: &[u32]) -> Result<(), CountingFailure> {
    let mut hardware: Vec<u32> = ids
        .iter()
        .flat_map(|&id| c.counters[id as usize].inputs.iter().copied())
        .collect();
    hardware.sort_unstable();
    hardware.dedup();
    let mut blocks: Vec<(&str, u32, Vec<&str>)> = Vec::new();
    for input in hardware {
        let Some(hw) = c.counters.get(input as usize) else {
            continue;
        };
        match blocks.iter_mut().find(|(block, _, _)| *block == hw.block) {
            Some((_, _, used)) => used.push(&hw.name),
            None => blocks.push((&hw.block, hw.block_limit, vec![&hw.name])),
        }
    }
    match blocks
        .iter()
        .find(|(_, limit, used)| used.len() > *limit as usize)
    {
        Some((block, limit, used)) => Err(failure(
            Status::ERROR_EXCEEDS_PASS_LIMIT,
            format!(
                "block {block} can count at most {limit} counters in one pass, but this set \
                 needs {} ({})",
                used.len(),
                used.join(", ")
            ),
        )),
        None => Ok(()),
    }
}

struct Config {
    agent: u64,
    ids: Vec<u32>,
}

static CONFIGS: RwLock<Vec<Config>> = RwLock::new(Vec::new());

/// Builds a configuration counting `ids` (catalogue indices of `agent`) together in one pass.
/// More than the agent's per-pass limits allow is [`Status::ERROR_EXCEEDS_PASS_LIMIT`], with
/// the block and its limit in the message.
pub fn create_config(agent: u64, ids: &[u32]) -> Result<CounterConfigId, CountingFailure> {
    let c = catalogue(agent)?;
    if ids.is_empty() {
        return Err(failure(
            Status::ERROR_INVALID_ARGUMENT,
            "a counter configuration needs at least one counter",
        ));
    }
    check_known(&c, ids)?;
    match kreplay_hsa::check_counters(agent, ids) {
        Ok(()) => {}
        // The runtime no longer knows an agent whose counters it listed: it was shut down
        // (`hsa_shut_down`). The catalogue, kept for the process, answers as it does for
        // `plan`, rather than this one function calling the agent unknown.
        Err(CountingError::InvalidAgent) => fits_one_pass(&c, ids)?,
        Err(e) => return Err(e.into()),
    }
    // A configuration is a set: a counter listed twice is counted (and reported) once.
    let mut unique: Vec<u32> = Vec::with_capacity(ids.len());
    for &id in ids {
        if !unique.contains(&id) {
            unique.push(id);
        }
    }
    let mut configs = CONFIGS.write();
    configs.push(Config { agent, ids: unique });
    Ok(CounterConfigId {
        handle: configs.len() as u64,
    })
}

/// The agent and counters of a configuration.
pub fn config_counters(config: CounterConfigId) -> Option<(u64, Vec<u32>)> {
    let index = usize::try_from(config.handle.checked_sub(1)?).ok()?;
    CONFIGS.read().get(index).map(|c| (c.agent, c.ids.clone()))
}

#[derive(Clone, Copy)]
struct Service {
    context: ContextId,
    dispatch: DispatchCountingFn,
    record: CounterRecordFn,
    data: *mut c_void,
}

// SAFETY: the tool promises its callbacks may be called with `data` from any thread; kreplay only
// passes `data` back.
unsafe impl Send for Service {}
// SAFETY: as above; immutable plain data.
unsafe impl Sync for Service {}

static SERVICE: RwLock<Option<Service>> = RwLock::new(None);
static CONFIGURED: AtomicBool = AtomicBool::new(false);

/// Configures the dispatch counting service on `context` (the Rust form of
/// `kreplay_configure_dispatch_counting_service`).
pub fn configure_dispatch_counting(
    context: ContextId,
    dispatch: DispatchCountingFn,
    record: CounterRecordFn,
    data: *mut c_void,
) -> Result<(), Status> {
    services::with_configuration_open(|| {
        if ContextRegistry::global().is_started(context).is_err() {
            return Err(Status::ERROR_CONTEXT_NOT_FOUND);
        }
        let mut service = SERVICE.write();
        if service.is_some() {
            return Err(Status::ERROR_SERVICE_ALREADY_CONFIGURED);
        }
        *service = Some(Service {
            context,
            dispatch,
            record,
            data,
        });
        CONFIGURED.store(true, Ordering::Relaxed);
        Ok(())
    })?;
    crate::lifecycle::note_service_configured(context, None);
    Ok(())
}

/// The context of the dispatch counting service, if one is configured.
pub(crate) fn service_context() -> Option<ContextId> {
    SERVICE.read().map(|s| s.context)
}

/// Is a dispatch counting service configured? One relaxed load.
#[inline]
pub fn configured() -> bool {
    CONFIGURED.load(Ordering::Relaxed)
}

/// Forgets the service (test harnesses sharing one process; configurations stay).
pub(crate) fn reset() {
    *SERVICE.write() = None;
    CONFIGURED.store(false, Ordering::Relaxed);
}

/// Removes the service of `context` (a tool whose initialize failed).
pub(crate) fn remove_context(context: ContextId) {
    let mut service = SERVICE.write();
    if service.is_some_and(|s| s.context == context) {
        *service = None;
        CONFIGURED.store(false, Ordering::Relaxed);
    }
}

/// At dispatch time: the counters `info` (pass `pass`) counts, if the service's context is
/// active now on this thread and its callback picks a configuration of this agent. A pass
/// consults the mask of this thread's replay loop; a dispatch that is no pass (`None`: run once,
/// or submitted by a tool from inside a replay callback) is masked by no replay.
pub(crate) fn pick(info: &DispatchInfo, pass: Option<u64>) -> Option<Vec<u32>> {
    let service = (*SERVICE.read())?;
    let mut config = CounterConfigId::default();
    crate::services::call_if_active(service.context, pass.is_some(), || {
        if services::is_retired(service.context, None) {
            return None;
        }
        // SAFETY: the tool's callback of type `kreplay_dispatch_counting_cb_t`, registered for
        // this use; `config` is valid for the call.
        unsafe {
            (service.dispatch)(
                crate::hsa_tool::c_dispatch_info(info),
                pass.unwrap_or(REPLAY_PASS_NONE),
                &mut config,
                service.data,
            )
        };
        Some(())
    })??;
    if config.handle == 0 {
        return None;
    }
    match config_counters(config) {
        Some((agent, ids)) if agent == info.agent_id => Some(ids),
        _ => {
            crate::logging::warn_once(
                "counting-bad-config",
                format_args!(
                    "the dispatch counting callback picked configuration {} which is unknown or \
                     of another agent; dispatch {} counts nothing",
                    config.handle, info.dispatch_id
                ),
            );
            None
        }
    }
}

/// Once the kernel completed: hands the values of a dispatch picked by [`pick`] to the tool.
pub(crate) fn deliver(info: &DispatchInfo, pass: Option<u64>, ids: &[u32], values: &[f64]) {
    let Some(service) = *SERVICE.read() else {
        return;
    };
    let records: Vec<CounterRecord> = ids
        .iter()
        .zip(values)
        .map(|(&id, &value)| CounterRecord {
            size: size_of::<CounterRecord>() as u64,
            counter_id: CounterId {
                handle: u64::from(id) + 1,
            },
            dispatch_id: info.dispatch_id,
            replay_pass: pass.unwrap_or(REPLAY_PASS_NONE),
            agent_id: AgentId {
                handle: info.agent_id,
            },
            context_id: ContextHandle::from(service.context),
            value,
        })
        .collect();
    // Only while the context is started: one stopped (or whose tool was finalized) after the
    // dispatch picked its configuration receives nothing more. The mask was consulted at `pick`.
    crate::services::call_if_active(service.context, false, || {
        if services::is_retired(service.context, None) {
            return;
        }
        // SAFETY: the tool's callback of type `kreplay_counter_record_cb_t`; the records are
        // alive for the call.
        unsafe {
            (service.record)(
                crate::hsa_tool::c_dispatch_info(info),
                records.as_ptr(),
                records.len(),
                service.data,
            )
        }
    });
}

// ------------------------------------------------------------------------------------------------
// The C functions
// ------------------------------------------------------------------------------------------------

/// Reads a C counter list (at any alignment) into catalogue indices, up to the first id that
/// cannot be one. NULL with a non-zero count, or a count larger than any array, is
/// [`Status::ERROR_INVALID_ARGUMENT`].
///
/// # Safety
/// When `count` is non-zero, `counters` is NULL or points to `count` readable ids.
unsafe fn indices(counters: *const CounterId, count: usize) -> Result<Vec<u32>, Status> {
    // SAFETY: forwarded from the caller's contract.
    let list = unsafe { crate::api::CArray::new(counters, count) }
        .ok_or(Status::ERROR_INVALID_ARGUMENT)?;
    list.iter()
        .map(|id| counter_index(id).ok_or(Status::ERROR_INVALID_ARGUMENT))
        .collect()
}

/// `kreplay_iterate_agent_counters`: calls `callback` once with every counter of `agent_id`.
///
/// # Safety
/// `callback`, if non-NULL, is a `kreplay_agent_counters_cb_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kreplay_iterate_agent_counters(
    agent_id: AgentId,
    callback: Option<crate::abi::AgentCountersFn>,
    user_data: *mut c_void,
) -> Status {
    crate::api::guard(|| {
        let Some(callback) = callback else {
            return Status::ERROR_INVALID_ARGUMENT;
        };
        match with_counter_infos(agent_id.handle, |infos| {
            // SAFETY: the tool's callback; the infos are alive for the call.
            unsafe { callback(agent_id, infos.as_ptr(), infos.len(), user_data) }
        }) {
            // What the callback returned, as kreplay.h says.
            Ok(returned) => returned,
            Err(e) => e.status,
        }
    })
}

/// `kreplay_create_counter_config`: a configuration counting `counters` together in one pass.
///
/// # Safety
/// `counters` points to `counters_count` readable ids; `config_id` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kreplay_create_counter_config(
    agent_id: AgentId,
    counters: *const CounterId,
    counters_count: usize,
    config_id: *mut CounterConfigId,
) -> Status {
    crate::api::guard(|| {
        if config_id.is_null() || counters_count == 0 {
            return Status::ERROR_INVALID_ARGUMENT;
        }
        // SAFETY: forwarded from the caller's contract.
        let ids = match unsafe { indices(counters, counters_count) } {
            Ok(ids) => ids,
            Err(status) => return status,
        };
        match create_config(agent_id.handle, &ids) {
            Ok(config) => {
                // SAFETY: non-null and, per the contract, writable.
                unsafe { crate::api::write_out(config_id, config) };
                Status::SUCCESS
            }
            Err(e) => {
                crate::kreplay_warn!("kreplay_create_counter_config: {}", e.message);
                e.status
            }
        }
    })
}

/// `kreplay_plan_counter_passes`: the fewest passes that count every requested counter, and
/// (when `pass_of_counter` is non-NULL) the pass of each.
///
/// # Safety
/// `counters` points to `counters_count` readable ids; `pass_of_counter` is NULL or has room for
/// `counters_count` u32s; `pass_count` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kreplay_plan_counter_passes(
    agent_id: AgentId,
    counters: *const CounterId,
    counters_count: usize,
    pass_of_counter: *mut u32,
    pass_count: *mut u64,
) -> Status {
    crate::api::guard(|| {
        if pass_count.is_null() {
            return Status::ERROR_INVALID_ARGUMENT;
        }
        // SAFETY: forwarded from the caller's contract.
        let ids = match unsafe { indices(counters, counters_count) } {
            Ok(ids) => ids,
            Err(status) => return status,
        };
        let groups = match plan(agent_id.handle, &ids) {
            Ok(groups) => groups,
            Err(e) => {
                crate::kreplay_warn!("kreplay_plan_counter_passes: {}", e.message);
                return e.status;
            }
        };
        if !pass_of_counter.is_null() {
            for (i, id) in ids.iter().enumerate() {
                let pass = groups.iter().position(|g| g.contains(id)).unwrap_or(0);
                // SAFETY: per the contract, room for `counters_count` u32s.
                unsafe { crate::api::write_out(pass_of_counter.add(i), pass as u32) };
            }
        }
        // SAFETY: non-null and, per the contract, writable.
        unsafe { crate::api::write_out(pass_count, groups.len() as u64) };
        Status::SUCCESS
    })
}

/// `kreplay_configure_dispatch_counting_service`: see [`configure_dispatch_counting`].
///
/// # Safety
/// The callbacks, if non-NULL, have the header's types and may be called with `callback_data`
/// from any thread.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kreplay_configure_dispatch_counting_service(
    context_id: ContextHandle,
    dispatch_callback: Option<DispatchCountingFn>,
    record_callback: Option<CounterRecordFn>,
    callback_data: *mut c_void,
) -> Status {
    crate::api::guard(|| {
        // Also on stderr: a tool that ignores the status would never learn why it counts nothing.
        let refused = |status: Status, why: &str| {
            crate::kreplay_warn!(
                "kreplay_configure_dispatch_counting_service refused ({}): {why}",
                status.name().to_string_lossy()
            );
            status
        };
        if services::configuration_locked() {
            return refused(
                Status::ERROR_CONFIGURATION_LOCKED,
                "tool initialization has ended; configure services in kreplay_configure or \
                 initialize",
            );
        }
        let (Some(dispatch), Some(record)) = (dispatch_callback, record_callback) else {
            return refused(Status::ERROR_INVALID_ARGUMENT, "a callback is NULL");
        };
        match configure_dispatch_counting(context_id.into(), dispatch, record, callback_data) {
            Ok(()) => Status::SUCCESS,
            Err(status) => refused(status, &status.description().to_string_lossy()),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one_counter(name: &str) -> Catalogue {
        let name = CString::new(name).unwrap();
        let info = CounterInfo {
            size: size_of::<CounterInfo>() as u64,
            id: CounterId { handle: 1 },
            name: name.as_ptr(),
            description: name.as_ptr(),
            block: name.as_ptr(),
            block_limit: 1,
            is_derived: 0,
        };
        Catalogue {
            counters: Vec::new(),
            infos: vec![info],
            _strings: vec![name],
        }
    }

    /// Two threads building an agent's catalogue at the same time (both found none) must end up
    /// with the same one: the strings handed out from the first stay alive (kreplay.h: "Strings
    /// have static storage"), which they would not if the second replaced it.
    #[test]
    fn a_catalogue_built_twice_for_one_agent_keeps_the_first_one_published() {
        let agent = 0xcafe_0001;
        let first = publish(agent, one_counter("FIRST"));
        let name = first.infos[0].name;
        drop(first);
        let second = publish(agent, one_counter("SECOND"));
        assert_eq!(
            second.infos[0].name, name,
            "the agent's catalogue was replaced: the strings handed out from the first are freed"
        );
        // SAFETY: `name` points into the catalogue kept in CATALOGUES, alive for the process.
        let kept = unsafe { std::ffi::CStr::from_ptr(name) };
        assert_eq!(kept.to_str(), Ok("FIRST"));
    }
}
