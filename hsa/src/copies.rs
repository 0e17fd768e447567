//! Async copies serialized against replays (SPEC §3 rule 9).
//!
//! While a replay service is configured, `hsa_amd_memory_async_copy` takes the reader side of
//! the lock of every GPU agent it touches, so a copy submitted during a replay waits until the
//! replay ends. Each copy runs with a completion signal of kreplay's own; when it reaches 0 (the
//! copy landed), a handler counts the copy finished and only then decrements the application's
//! signal. A replay's drain waits for the agent's count to reach zero, i.e. for every earlier
//! copy's completion, not merely its submission.

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::Arc;

use hsa_sys::*;
use kreplay_drain::InFlightCounter;
use parking_lot::Mutex;

use crate::backend::{backend, guarded};

/// In-flight async copies per agent.
#[derive(Default)]
pub(crate) struct CopyTracker {
    by_agent: Mutex<HashMap<u64, Arc<InFlightCounter>>>,
}

impl CopyTracker {
    pub(crate) fn counter(&self, agent: u64) -> Arc<InFlightCounter> {
        self.by_agent.lock().entry(agent).or_default().clone()
    }
}

/// What the completion handler of one tracked copy needs.
struct PendingCopy {
    proxy: hsa_signal_t,
    application: hsa_signal_t,
    counters: Vec<Arc<InFlightCounter>>,
}

unsafe extern "C" fn copy_landed(_value: hsa_signal_value_t, arg: *mut c_void) -> bool {
    // SAFETY: `arg` is the `Box<PendingCopy>` leaked when the handler was registered; the runtime
    // calls this handler once (it returns false), so the box is reclaimed exactly once.
    let pending = unsafe { Box::from_raw(arg.cast::<PendingCopy>()) };
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let b = backend();
        for counter in &pending.counters {
            counter.finish();
        }
        if pending.application.handle != 0 {
            b.original.signal_subtract(pending.application, 1);
        }
        b.original.signal_destroy(pending.proxy);
    }));
    if result.is_err() {
        eprintln!("kreplay: internal error while completing an async copy");
    }
    false
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
        if !b.replay_active() {
            return b.original.async_copy(
                dst, dst_agent, src, src_agent, size, num_deps, deps, completion,
            );
        }
        let mut agents: Vec<u64> = Vec::with_capacity(2);
        for agent in [src_agent, dst_agent] {
            if !agents.contains(&agent.handle)
                && b.original.agent_device_type(agent) == Some(HSA_DEVICE_TYPE_GPU)
            {
                agents.push(agent.handle);
            }
        }
        agents.sort_unstable(); // one lock order for every thread
        // Reader side of each agent: waits while a replay holds the agent. A copy issued from a
        // replay callback on the same agent (re-entrant) proceeds without it.
        let _guards: Vec<_> = agents
            .iter()
            .filter_map(|&a| b.locks.read(a).ok())
            .collect();
        let proxy = match b.original.signal_create(1) {
            Ok(s) => s,
            Err(status) => return status,
        };
        let counters: Vec<_> = agents.iter().map(|&a| b.copies.counter(a)).collect();
        for counter in &counters {
            counter.start();
        }
        let status = b
            .original
            .async_copy(dst, dst_agent, src, src_agent, size, num_deps, deps, proxy);
        if status != HSA_STATUS_SUCCESS {
            for counter in &counters {
                counter.finish();
            }
            b.original.signal_destroy(proxy);
            return status;
        }
        let pending = Box::into_raw(Box::new(PendingCopy {
            proxy,
            application: completion,
            counters,
        }));
        let status = b.original.signal_async_handler(
            proxy,
            HSA_SIGNAL_CONDITION_EQ,
            0,
            Some(copy_landed),
            pending.cast(),
        );
        if status != HSA_STATUS_SUCCESS {
            // No handler: wait here so the copy is still counted and the application still sees
            // its completion exactly once.
            b.original.signal_wait_eq(proxy, 0, u64::MAX);
            // SAFETY: the handler was not registered, so `pending` is still ours to run.
            unsafe { copy_landed(0, pending.cast()) };
        }
        HSA_STATUS_SUCCESS
    })
}
