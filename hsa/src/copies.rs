//! Runtime writes serialized against replays (docs/abi.md §3 rule 9).
//!
//! While a replay service is configured, every runtime entry that writes (or reads) an agent's
//! memory outside a kernel takes the reader side of the lock of every GPU agent it touches, so
//! it waits while a replay holds that agent and a replay waits for it:
//!
//! - the asynchronous ones (`hsa_amd_memory_async_copy`, `hsa_amd_memory_async_copy_on_engine`,
//!   `hsa_amd_memory_async_copy_rect`, ROCm 7's `hsa_amd_memory_async_batch_copy`) run with a
//!   completion signal of kreplay's own; when it reaches 0 (the copy, or every operation of the
//!   batch, landed), a handler counts the copy finished and only then decrements the
//!   application's signal. A replay's drain waits for the agent's count to reach zero, i.e. for
//!   every earlier copy's completion, not merely its submission;
//! - the synchronous ones (`hsa_memory_copy`, `hsa_amd_memory_fill`, ROCm 7's
//!   `hsa_amd_ais_file_read`) hold the reader side and the count for the length of the call, so
//!   a replay starts only after they returned.
//!
//! The agents a write touches are the GPU owners of the memory at its source and destination
//! (`hsa_amd_pointer_info`), plus the agents the call names, plus every GPU when its destination
//! is tracked memory the CPU owns (a replay on any GPU may hold it). A batch copy's operations
//! are not read for their destinations: it touches every GPU. A write issued from a replay
//! callback on the agent being replayed (re-entrant) proceeds without the lock; one issued from
//! a replay callback onto *another* agent tries that agent's reader side once and, if a replay
//! holds it, proceeds at once too (waiting could deadlock two replays whose tools write into each
//! other's memory; see ARCHITECTURE.md "Concurrency"). Either way a write from inside a window is
//! made under holds of the open replays (`crate::fold`), so that what it writes is folded into
//! their snapshots instead of being undone by their restores. Plain CPU
//! stores into host-visible device memory never reach the runtime and cannot be fenced (see
//! `docs/rocm.md`).

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::Arc;

use hsa_sys::layouts::{
    HSA_AMD_MEMORY_COPY_OP_VERSION, hsa_amd_ais_file_handle_t, hsa_amd_memory_copy_op_t,
    hsa_amd_sdma_engine_id_t,
};
use hsa_sys::*;
use kreplay_drain::InFlightCounter;
use parking_lot::Mutex;

use crate::backend::{Backend, backend, guarded};
use crate::original::forward;
use crate::waits::WaitingCopies;

/// In-flight async copies per agent.
#[derive(Default)]
pub(crate) struct CopyTracker {
    by_agent: Mutex<HashMap<u64, Arc<InFlightCounter>>>,
    /// Copies in flight that wait for dependencies (see `crate::waits`).
    pub(crate) waiting: WaitingCopies,
    /// The times of the copies that ran with a signal of kreplay's, by the application's signal.
    pub(crate) times: CopyTimes,
}

/// What `hsa_amd_profiling_get_async_copy_time` answers for an application's signal whose copy
/// ran with a signal of kreplay's. ROCm answers only for the signal a copy was given (it
/// remembers the copy's agent in the signal, to convert the device's timestamps), so the
/// timestamps copied into the application's signal are not enough there: the runtime's answer
/// for kreplay's signal is taken when the copy landed, before the application's signal is
/// completed, and given back for the application's until its signal goes to a copy again.
#[derive(Default)]
pub(crate) struct CopyTimes {
    by_signal: Mutex<HashMap<u64, hsa_amd_profiling_async_copy_time_t>>,
}

impl CopyTimes {
    /// The times' lock, for the fork set (`crate::fork`).
    pub(crate) fn fork_lock(&self) -> crate::fork::Lock<'_> {
        &self.by_signal
    }

    /// Entries kept at most; past it the answers are dropped all at once (those of signals the
    /// application destroys are dropped at the destroy, `crate::signals::signal_destroy`).
    const MOST: usize = 1 << 16;

    /// `application`'s copy ran with `proxy`, which the runtime now holds the times of.
    fn landed(&self, b: &Backend, proxy: hsa_signal_t, application: hsa_signal_t) {
        let mut time = hsa_amd_profiling_async_copy_time_t { start: 0, end: 0 };
        let status = forward!(
            b,
            amd.hsa_amd_profiling_get_async_copy_time_fn(proxy, &mut time)
        );
        let mut map = self.by_signal.lock();
        if status == HSA_STATUS_SUCCESS {
            if map.len() >= Self::MOST {
                map.clear();
            }
            map.insert(application.handle, time);
        } else {
            map.remove(&application.handle);
        }
    }

    /// `signal` goes to a copy, or is destroyed: whatever kreplay kept for it is of an earlier
    /// copy.
    pub(crate) fn forget(&self, signal: hsa_signal_t) {
        if signal.handle != 0 {
            let mut map = self.by_signal.lock();
            if !map.is_empty() {
                map.remove(&signal.handle);
            }
        }
    }

    fn get(&self, signal: hsa_signal_t) -> Option<hsa_amd_profiling_async_copy_time_t> {
        self.by_signal.lock().get(&signal.handle).copied()
    }
}

/// Wrapper of `hsa_amd_profiling_get_async_copy_time`: the time of the copy the application's
/// signal last completed, also where the copy ran with a signal of kreplay's (see
/// [`CopyTimes`]).
pub(crate) unsafe extern "C" fn async_copy_time(
    signal: hsa_signal_t,
    time: *mut hsa_amd_profiling_async_copy_time_t,
) -> hsa_status_t {
    guarded(|| {
        let b = backend();
        if !time.is_null()
            && let Some(kept) = b.copies.times.get(signal)
        {
            // SAFETY: the application's non-null out-pointer, valid for the call.
            unsafe { time.write(kept) };
            return HSA_STATUS_SUCCESS;
        }
        forward!(
            b,
            amd.hsa_amd_profiling_get_async_copy_time_fn(signal, time)
        )
    })
}

impl CopyTracker {
    pub(crate) fn counter(&self, agent: u64) -> Arc<InFlightCounter> {
        self.by_agent.lock().entry(agent).or_default().clone()
    }

    /// Every agent's counter.
    pub(crate) fn counters(&self) -> Vec<Arc<InFlightCounter>> {
        self.by_agent.lock().values().cloned().collect()
    }
}

/// What the completion handler of one tracked copy needs.
struct PendingCopy {
    proxy: hsa_signal_t,
    application: hsa_signal_t,
    /// How much the application's signal drops when the copy landed (a batch's operations).
    count: i64,
    counters: Vec<Arc<InFlightCounter>>,
    /// The batch operations submitted in the application's stead, alive until they landed.
    _operations: Vec<hsa_amd_memory_copy_op_t>,
}

unsafe extern "C" fn copy_landed(_value: hsa_signal_value_t, arg: *mut c_void) -> bool {
    // SAFETY: `arg` is the `Box<PendingCopy>` leaked when the handler was registered; the runtime
    // calls this handler once (it returns false), so the box is reclaimed exactly once.
    let pending = unsafe { Box::from_raw(arg.cast::<PendingCopy>()) };
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let b = backend();
        b.copies.waiting.landed(pending.proxy);
        for counter in &pending.counters {
            counter.finish();
        }
        if pending.application.handle != 0 {
            crate::dispatch::carry_timestamps(pending.proxy, pending.application);
            b.copies.times.landed(b, pending.proxy, pending.application);
            b.original
                .signal_subtract(pending.application, pending.count);
        }
        b.original.signal_destroy(pending.proxy);
    }));
    if result.is_err() {
        log::error!("internal error while completing an async copy");
    }
    false
}

/// The GPU agents among `agents`, deduplicated and sorted (one lock order for every thread).
pub(crate) fn gpu_agents(b: &Backend, agents: impl IntoIterator<Item = hsa_agent_t>) -> Vec<u64> {
    gpus_among(&b.original, agents)
}

/// [`gpu_agents`] from the runtime's entries alone (before the backend exists).
pub(crate) fn gpus_among(
    original: &crate::original::Original,
    agents: impl IntoIterator<Item = hsa_agent_t>,
) -> Vec<u64> {
    let mut gpus: Vec<u64> = Vec::with_capacity(2);
    for agent in agents {
        if agent.handle != 0
            && !gpus.contains(&agent.handle)
            && original.agent_device_type(agent) == Some(HSA_DEVICE_TYPE_GPU)
        {
            gpus.push(agent.handle);
        }
    }
    gpus.sort_unstable();
    gpus
}

/// The GPU agents a runtime write into `dst` waits for: the GPUs among `touched` (the owners of
/// its memory and the agents it names) and, when `dst` lies in tracked memory the CPU owns, every
/// GPU, since a replay on any of them may hold that memory in its snapshot
/// (`crate::peers::replay_agents`).
pub(crate) fn write_agents(
    b: &Backend,
    touched: impl IntoIterator<Item = hsa_agent_t>,
    dst: *const c_void,
) -> Vec<u64> {
    let mut agents = gpu_agents(b, touched);
    let cpu_owned = b
        .inventory
        .lookup(dst as u64)
        .is_some_and(|a| !b.gpus().contains(&a.owner_agent));
    if cpu_owned {
        agents.extend_from_slice(b.gpus());
        agents.sort_unstable();
        agents.dedup();
    }
    agents
}

/// The agent owning the allocation at `ptr`, if the runtime knows one.
pub(crate) fn owner(b: &Backend, ptr: *const c_void) -> Option<hsa_agent_t> {
    if ptr.is_null() {
        return None;
    }
    b.original.pointer_info(ptr).map(|info| info.agentOwner)
}

/// A runtime write fenced against replays: the reader side of each agent it touches, and its
/// count of in-flight work, for as long as this lives (or, for an asynchronous write, until its
/// completion is seen: see [`Fence::submit_async`]).
pub(crate) struct Fence<'a> {
    _guards: Vec<kreplay_locks::ReadAccess<'a>>,
    /// The agents it counts on, and `counters` their counts.
    agents: Vec<u64>,
    counters: Vec<Arc<InFlightCounter>>,
    /// An asynchronous write's dependencies: it starts once each fired.
    deps: Vec<hsa_signal_t>,
    /// From inside a replay window: holds of the open replays (see `crate::fold`), so that
    /// the write is folded into their snapshots instead of being erased by their restores.
    /// Declared last: released after the counts finish.
    holds: Option<crate::fold::Holds<'a>>,
}

/// After finalization (`OnUnload`) a replay that began before it may still be running on
/// another thread: a write the application submits now waits for it to end, as it did before
/// finalization, or the replay's remaining restores would undo it. One check once no replay
/// window is open (and none at all where no replay service was ever configured, or in a
/// forked child).
pub(crate) fn after_finalize_wait(b: &Backend) {
    if b.finalized_with_open_replays() {
        drop(readers(b, b.gpus()));
    }
}

/// Whether a copy, fill or image call goes straight to the runtime, unfenced: no replay service
/// is active (any wait [`after_finalize_wait`] asks for done first).
pub(crate) fn unfenced(b: &Backend) -> bool {
    let unfenced = !b.replay_active();
    if unfenced {
        after_finalize_wait(b);
    }
    unfenced
}

/// The reader side of each of `agents`, waited for while a replay holds it. A call issued from a
/// replay callback on the same agent (re-entrant) proceeds without it. Lock order: a thread inside
/// a replay window never waits for another agent's writer side (that replay may be waiting for
/// this one): it tries once, and if that agent is being replayed the call proceeds at once, like
/// re-entrant work.
pub(crate) fn readers<'a>(b: &'a Backend, agents: &[u64]) -> Vec<kreplay_locks::ReadAccess<'a>> {
    let window = crate::queues::in_replay_window();
    agents
        .iter()
        .filter_map(|&a| {
            if window {
                b.locks
                    .try_read_for(a, std::time::Duration::ZERO)
                    .ok()
                    .flatten()
            } else {
                // Inside a handler call (a tool's callback), keep writing the mail of the
                // queues being handled while waiting, as the handler's own waits do.
                b.locks
                    .read_serving(a, crate::dispatch::SERVE_SLICE, || {
                        crate::queues::serve_handled_mail(b)
                    })
                    .ok()
            }
        })
        .collect()
}

impl<'a> Fence<'a> {
    /// Waits while a replay holds any of `agents`, then counts one write on each.
    pub(crate) fn enter(b: &'a Backend, agents: &[u64]) -> Self {
        let window = crate::queues::in_replay_window();
        let guards = readers(b, agents);
        // Holds before counts: a replay settling waits for holds first, then for counts.
        let holds = window.then(|| crate::fold::hold_open(b));
        let counters: Vec<_> = agents.iter().map(|&a| b.copies.counter(a)).collect();
        for counter in &counters {
            counter.start();
        }
        Fence {
            _guards: guards,
            agents: agents.to_vec(),
            counters,
            deps: Vec::new(),
            holds,
        }
    }

    /// The asynchronous write it fences starts once each of the `count` signals at `deps`
    /// fired: while one of them is held back by a replay, that replay's drain need not wait
    /// for it (`crate::waits`).
    fn after(mut self, count: u32, deps: *const hsa_signal_t) -> Self {
        if count > 0 && !deps.is_null() {
            // SAFETY: the caller's `count` dependency signals at `deps` (the entry's contract;
            // the runtime reads them during the call just the same).
            self.deps = unsafe { std::slice::from_raw_parts(deps, count as usize) }.to_vec();
        }
        self
    }

    /// The write it fences put every one of `len` bytes at `dst` (a copy's destination, a
    /// fill), when it succeeded: from inside a replay window, the open replays take those bytes
    /// whole (see `crate::fold`).
    fn wrote(&self, status: hsa_status_t, dst: *const c_void, len: usize) -> hsa_status_t {
        if let Some(holds) = &self.holds
            && status == HSA_STATUS_SUCCESS
        {
            holds.wrote(dst as u64, len as u64);
        }
        status
    }

    /// Submits an asynchronous write with a completion signal of kreplay's own (`submit` gets
    /// it); the write stays counted until that signal reaches 0, then the application's
    /// `completion` is decremented. `whole`: the range it writes every byte of, if known (see
    /// [`Fence::wrote`]; settles read it once the copy landed).
    fn submit_async(
        self,
        b: &Backend,
        completion: hsa_signal_t,
        whole: Option<(*mut c_void, usize)>,
        submit: impl FnOnce(hsa_signal_t) -> hsa_status_t,
    ) -> hsa_status_t {
        self.submit_counted(b, completion, whole, 1, Vec::new(), |proxy, _| {
            submit(proxy)
        })
    }

    /// [`Fence::submit_async`] for `count` completions on one signal (a batch's operations, kept
    /// in `operations` until they landed and passed to `submit` to fill in the signal): the
    /// write stays counted until kreplay's signal, starting at `count`, reaches 0, then the
    /// application's `completion` drops by `count`.
    fn submit_counted(
        mut self,
        b: &Backend,
        completion: hsa_signal_t,
        whole: Option<(*mut c_void, usize)>,
        count: i64,
        mut operations: Vec<hsa_amd_memory_copy_op_t>,
        submit: impl FnOnce(hsa_signal_t, &mut [hsa_amd_memory_copy_op_t]) -> hsa_status_t,
    ) -> hsa_status_t {
        let proxy = match b.original.signal_create(count) {
            Ok(s) => s,
            Err(status) => return status,
        };
        // Noted before it is submitted, so that its landing never comes first.
        b.copies
            .waiting
            .submitted(b, proxy, &self.agents, &self.deps);
        let status = submit(proxy, &mut operations);
        if status != HSA_STATUS_SUCCESS {
            b.copies.waiting.landed(proxy);
            b.original.signal_destroy(proxy);
            return status; // dropping `self` finishes the counts
        }
        if let Some((dst, len)) = whole {
            self.wrote(status, dst, len);
        }
        let pending = Box::into_raw(Box::new(PendingCopy {
            proxy,
            application: completion,
            count,
            counters: std::mem::take(&mut self.counters),
            _operations: operations,
        }));
        // From inside a replay window the replay waits for this copy before it goes on, and
        // the runtime's one async-handler thread may be blocked by the replay (an application's
        // handler inside a fenced call on this agent): the copy's end is then never left to
        // the runtime's handler.
        let watched = if self.holds.is_some() {
            crate::watcher::when_zero_off_runtime(b, proxy, copy_landed, pending.cast())
        } else {
            crate::watcher::when_zero(b, proxy, copy_landed, pending.cast()) == HSA_STATUS_SUCCESS
        };
        if !watched {
            // Neither a handler nor a thread: wait here so the copy is still counted and the
            // application still sees its completion exactly once.
            b.original.signal_wait_eq(proxy, 0, u64::MAX);
            // SAFETY: nothing else was given `pending`, so it is still ours to run.
            unsafe { copy_landed(0, pending.cast()) };
        }
        HSA_STATUS_SUCCESS
    }
}

impl Drop for Fence<'_> {
    fn drop(&mut self) {
        for counter in &self.counters {
            counter.finish();
        }
    }
}

/// Wrapper of `hsa_amd_memory_async_copy`.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe extern "C" fn async_copy(
    dst: *mut c_void,
    dst_agent: hsa_agent_t,
    src: *const c_void,
    src_agent: hsa_agent_t,
    size: usize,
    num_deps: u32,
    deps: *const hsa_signal_t,
    completion: hsa_signal_t,
) -> hsa_status_t {
    guarded(|| {
        let b = backend();
        b.copies.times.forget(completion);
        if unfenced(b) {
            return b.original.async_copy(
                dst, dst_agent, src, src_agent, size, num_deps, deps, completion,
            );
        }
        let agents = write_agents(b, [src_agent, dst_agent], dst);
        let fence = Fence::enter(b, &agents).after(num_deps, deps);
        fence.submit_async(b, completion, Some((dst, size)), |proxy| {
            b.original
                .async_copy(dst, dst_agent, src, src_agent, size, num_deps, deps, proxy)
        })
    })
}

/// Wrapper of `hsa_amd_memory_async_copy_on_engine` (ROCm 5.6+).
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe extern "C" fn async_copy_on_engine(
    dst: *mut c_void,
    dst_agent: hsa_agent_t,
    src: *const c_void,
    src_agent: hsa_agent_t,
    size: usize,
    num_deps: u32,
    deps: *const hsa_signal_t,
    completion: hsa_signal_t,
    engine: hsa_amd_sdma_engine_id_t,
    force_sdma: bool,
) -> hsa_status_t {
    guarded(|| {
        let b = backend();
        let forward = |signal| {
            forward!(
                b,
                amd.hsa_amd_memory_async_copy_on_engine_fn(
                    dst, dst_agent, src, src_agent, size, num_deps, deps, signal, engine,
                    force_sdma
                )
            )
        };
        b.copies.times.forget(completion);
        if unfenced(b) {
            return forward(completion);
        }
        let agents = write_agents(b, [src_agent, dst_agent], dst);
        Fence::enter(b, &agents).after(num_deps, deps).submit_async(
            b,
            completion,
            Some((dst, size)),
            forward,
        )
    })
}

/// Wrapper of `hsa_amd_memory_async_batch_copy` (ROCm 7). Its operations' destinations are not
/// read (lists, broadcasts, swaps and indirect addresses): while a replay service is configured
/// a batch waits for a replay on any GPU and counts on every GPU until its last operation
/// landed, so every replay's drain waits for it. kreplay puts one completion signal of its own,
/// starting at the number of operations, in every operation (the runtime takes one signal per
/// batch) and decrements the application's by as much once all landed. A batch with an
/// operation of a version kreplay does not know is fenced for its submission only, with a
/// warning: its copies may land inside a later replay.
pub(crate) unsafe extern "C" fn async_batch_copy(
    ops: *const hsa_amd_memory_copy_op_t,
    num_ops: u32,
    num_deps: u32,
    deps: *const hsa_signal_t,
) -> hsa_status_t {
    guarded(|| {
        let b = backend();
        let forward = |ops: *const hsa_amd_memory_copy_op_t| {
            forward!(
                b,
                amd.hsa_amd_memory_async_batch_copy_fn(ops, num_ops, num_deps, deps)
            )
        };
        // The first operation's version decides whether the others are read as the known layout.
        let known_layout = !ops.is_null()
            && num_ops > 0
            // SAFETY: the caller passes at least one operation at a non-null `ops`, which
            // starts with its version.
            && unsafe { ops.cast::<u16>().read_unaligned() } == HSA_AMD_MEMORY_COPY_OP_VERSION;
        if known_layout {
            // SAFETY: `num_ops` operations of the known layout at `ops` (the entry's contract).
            for op in unsafe { std::slice::from_raw_parts(ops, num_ops as usize) } {
                b.copies.times.forget(op.completion_signal);
            }
        }
        if unfenced(b) || ops.is_null() || num_ops == 0 {
            return forward(ops);
        }
        let fence = Fence::enter(b, b.gpus()).after(num_deps, deps);
        // The version leads every operation (a later version may be laid out otherwise): the
        // first one's is read before the operations are read as the known layout.
        // SAFETY: the caller passes at least one operation at `ops`, which starts with it.
        let first = unsafe { ops.cast::<u16>().read_unaligned() };
        let operations = if first == HSA_AMD_MEMORY_COPY_OP_VERSION {
            // SAFETY: `num_ops` operations of the known layout at `ops` (the entry's contract;
            // the runtime reads them during the call just the same).
            unsafe { std::slice::from_raw_parts(ops, num_ops as usize) }.to_vec()
        } else {
            Vec::new()
        };
        let known = !operations.is_empty()
            && operations
                .iter()
                .all(|op| op.version == HSA_AMD_MEMORY_COPY_OP_VERSION);
        let completion = operations
            .first()
            .map_or(hsa_signal_t { handle: 0 }, |op| op.completion_signal);
        if !known || completion.handle == 0 {
            if !known {
                b.hooks.warn_once(
                    "batch_copy_version",
                    "hsa_amd_memory_async_batch_copy with an operation version kreplay does not \
                     know: the batch waited for running replays, but its copies may land inside \
                     a later one, whose restores would undo them",
                );
            }
            // Fenced for the submission; the runtime rejects a batch without a signal itself.
            return forward(ops);
        }
        fence.submit_counted(
            b,
            completion,
            None,
            i64::from(num_ops),
            operations,
            |proxy, operations| {
                for op in operations.iter_mut() {
                    op.completion_signal = proxy;
                }
                forward(operations.as_ptr())
            },
        )
    })
}

/// Wrapper of `hsa_amd_ais_file_read` (ROCm 7, experimental; synchronous): a file read into
/// memory at `device_ptr`, fenced like `hsa_memory_copy` for the length of the call.
pub(crate) unsafe extern "C" fn ais_file_read(
    handle: hsa_amd_ais_file_handle_t,
    device_ptr: *mut c_void,
    size: u64,
    file_offset: i64,
    size_copied: *mut u64,
    status: *mut i32,
) -> hsa_status_t {
    guarded(|| {
        let b = backend();
        let forward = || {
            forward!(
                b,
                amd.hsa_amd_ais_file_read_fn(
                    handle,
                    device_ptr,
                    size,
                    file_offset,
                    size_copied,
                    status
                )
            )
        };
        if unfenced(b) {
            return forward();
        }
        let agents = write_agents(b, owner(b, device_ptr), device_ptr);
        let fence = Fence::enter(b, &agents);
        // What it wrote is `size_copied`, at most `size`: the whole range is taken.
        fence.wrote(
            forward(),
            device_ptr,
            usize::try_from(size).unwrap_or(usize::MAX),
        )
    })
}

/// Wrapper of `hsa_amd_memory_async_copy_rect`.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe extern "C" fn async_copy_rect(
    dst: *const hsa_pitched_ptr_t,
    dst_offset: *const hsa_dim3_t,
    src: *const hsa_pitched_ptr_t,
    src_offset: *const hsa_dim3_t,
    range: *const hsa_dim3_t,
    copy_agent: hsa_agent_t,
    dir: hsa_amd_copy_direction_t,
    num_deps: u32,
    deps: *const hsa_signal_t,
    completion: hsa_signal_t,
) -> hsa_status_t {
    guarded(|| {
        let b = backend();
        let forward = |signal| {
            forward!(
                b,
                amd.hsa_amd_memory_async_copy_rect_fn(
                    dst, dst_offset, src, src_offset, range, copy_agent, dir, num_deps, deps,
                    signal
                )
            )
        };
        b.copies.times.forget(completion);
        if unfenced(b) {
            return forward(completion);
        }
        let base = |p: *const hsa_pitched_ptr_t| -> *const c_void {
            if p.is_null() {
                std::ptr::null()
            } else {
                // SAFETY: a non-null pitched pointer of the caller (the runtime validates the
                // rest and reports bad arguments itself).
                unsafe { p.read_unaligned() }.base.cast_const()
            }
        };
        let touched = [owner(b, base(dst)), owner(b, base(src)), Some(copy_agent)];
        let agents = write_agents(b, touched.into_iter().flatten(), base(dst));
        // A rectangle does not write every byte between its first and last: compared only.
        Fence::enter(b, &agents)
            .after(num_deps, deps)
            .submit_async(b, completion, None, forward)
    })
}

/// Wrapper of `hsa_memory_copy` (synchronous).
pub(crate) unsafe extern "C" fn memory_copy(
    dst: *mut c_void,
    src: *const c_void,
    size: usize,
) -> hsa_status_t {
    guarded(|| {
        let b = backend();
        if unfenced(b) {
            return b.original.memory_copy(dst, src, size);
        }
        let touched = [owner(b, dst), owner(b, src)];
        let agents = write_agents(b, touched.into_iter().flatten(), dst);
        let fence = Fence::enter(b, &agents);
        fence.wrote(b.original.memory_copy(dst, src, size), dst, size)
    })
}

/// Wrapper of `hsa_amd_memory_fill` (synchronous).
pub(crate) unsafe extern "C" fn memory_fill(
    ptr: *mut c_void,
    value: u32,
    count: usize,
) -> hsa_status_t {
    guarded(|| {
        let b = backend();
        let forward = || forward!(b, amd.hsa_amd_memory_fill_fn(ptr, value, count));
        if unfenced(b) {
            return forward();
        }
        let agents = write_agents(b, owner(b, ptr), ptr);
        let fence = Fence::enter(b, &agents);
        fence.wrote(forward(), ptr, count.saturating_mul(4))
    })
}
