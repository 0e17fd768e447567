//! The asynchronous-handler thread: `hsa_amd_signal_async_handler` callbacks and
//! `hsa_amd_async_function` calls run here, started on first use.
//!
//! A handler is called when its condition holds; returning `false` unregisters it. A handler that
//! returns `true` stays registered as if registered anew (hsa_ext_amd.h), so, as on ROCm, it is
//! called again as long as its condition holds, also for one unchanged value.

use crate::runtime::join_unless_current;
use crate::signal::{Order, Signal, condition_holds};
use hsa_sys::{HSA_STATUS_ERROR_NOT_INITIALIZED, HSA_STATUS_ERROR_OUT_OF_RESOURCES, hsa_status_t};
use parking_lot::Mutex;
use std::collections::VecDeque;
use std::ffi::c_void;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::{JoinHandle, Thread};

type HandlerFn = unsafe extern "C" fn(i64, *mut c_void) -> bool;
type AsyncFn = unsafe extern "C" fn(*mut c_void);

/// A registered signal handler.
pub(crate) struct SignalHandler {
    pub(crate) signal: Arc<Signal>,
    pub(crate) cond: u32,
    pub(crate) value: i64,
    pub(crate) handler: HandlerFn,
    pub(crate) arg: usize,
}

struct Active {
    handler: SignalHandler,
    token: u64,
}

#[derive(Default)]
struct Shared {
    pending: Mutex<Vec<SignalHandler>>,
    functions: Mutex<VecDeque<(AsyncFn, usize)>>,
    stop: AtomicBool,
}

struct Started {
    shared: Arc<Shared>,
    thread: Thread,
    handle: Option<JoinHandle<()>>,
}

/// The handler thread of one runtime instance.
#[derive(Default)]
pub(crate) struct AsyncHandlers {
    state: Mutex<Option<Started>>,
    stopped: AtomicBool,
}

impl AsyncHandlers {
    fn with_thread(&self, f: impl FnOnce(&Shared)) -> Result<(), hsa_status_t> {
        let mut state = self.state.lock();
        if self.stopped.load(Ordering::Acquire) {
            return Err(HSA_STATUS_ERROR_NOT_INITIALIZED);
        }
        if state.is_none() {
            let shared = Arc::new(Shared::default());
            let worker = shared.clone();
            let handle = std::thread::Builder::new()
                .name("softhsa-async-handlers".into())
                .spawn(move || handler_loop(&worker))
                .map_err(|_| HSA_STATUS_ERROR_OUT_OF_RESOURCES)?;
            *state = Some(Started {
                shared,
                thread: handle.thread().clone(),
                handle: Some(handle),
            });
        }
        let started = state.as_ref().expect("handler thread started above");
        f(&started.shared);
        started.thread.unpark();
        Ok(())
    }

    /// Registers a signal handler.
    pub(crate) fn register(&self, handler: SignalHandler) -> Result<(), hsa_status_t> {
        self.with_thread(|shared| shared.pending.lock().push(handler))
    }

    /// Queues `f(arg)` to run on the handler thread.
    pub(crate) fn call(&self, f: AsyncFn, arg: usize) -> Result<(), hsa_status_t> {
        self.with_thread(|shared| shared.functions.lock().push_back((f, arg)))
    }

    pub(crate) fn shutdown(&self) {
        let started = {
            let mut state = self.state.lock();
            self.stopped.store(true, Ordering::Release);
            state.take()
        };
        if let Some(mut started) = started {
            started.shared.stop.store(true, Ordering::Release);
            started.thread.unpark();
            if let Some(handle) = started.handle.take() {
                join_unless_current(handle);
            }
        }
    }
}

fn handler_loop(shared: &Shared) {
    let me = std::thread::current();
    let mut active: Vec<Active> = Vec::new();
    loop {
        if shared.stop.load(Ordering::Acquire) {
            break;
        }
        let fresh = std::mem::take(&mut *shared.pending.lock());
        for handler in fresh {
            let token = handler.signal.wake.register_thread(me.clone());
            active.push(Active { handler, token });
        }
        loop {
            let next = shared.functions.lock().pop_front();
            let Some((f, arg)) = next else { break };
            // SAFETY: the application queued this function and argument with
            // hsa_amd_async_function, whose contract is to call f(arg) once.
            unsafe { f(arg as *mut c_void) };
        }
        // A handler kept with its condition still holding is due again: look again before
        // parking.
        let mut kept_due = false;
        let mut i = 0;
        while i < active.len() {
            let h = &active[i].handler;
            let value = h.signal.load(Order::Acquire);
            if condition_holds(h.cond, value, h.value) == Some(true) {
                // SAFETY: the application registered this handler and argument with
                // hsa_amd_signal_async_handler, whose contract is handler(value, arg).
                let keep = unsafe { (h.handler)(value, h.arg as *mut c_void) };
                if !keep {
                    let gone = active.swap_remove(i);
                    gone.handler.signal.wake.unregister(gone.token);
                    continue;
                }
                kept_due = true;
            }
            i += 1;
        }
        if !kept_due {
            std::thread::park();
        }
    }
    for entry in active {
        entry.handler.signal.wake.unregister(entry.token);
    }
}
