//! The process-global runtime: reference-counted `hsa_init` / `hsa_shut_down`, the configuration
//! for the next initialization, and the registries that turn handles into objects.

use crate::SoftHsaConfig;
use crate::copy::CopyEngines;
use crate::grid::Workers;
use crate::handlers::AsyncHandlers;
use crate::handles::next_handle;
use crate::memory::Memory;
use crate::queue::Queue;
use crate::signal::Signal;
use crate::topology::{AgentKind, Topology};
use hsa_sys::{
    HSA_STATUS_ERROR_INVALID_AGENT, HSA_STATUS_ERROR_INVALID_ARGUMENT,
    HSA_STATUS_ERROR_INVALID_QUEUE, HSA_STATUS_ERROR_INVALID_SIGNAL,
    HSA_STATUS_ERROR_NOT_INITIALIZED, HSA_STATUS_ERROR_REFCOUNT_OVERFLOW, HSA_STATUS_SUCCESS,
    hsa_queue_t, hsa_signal_value_t, hsa_status_t,
};
use parking_lot::{Mutex, RwLock};
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;

/// One initialized runtime instance (from the `hsa_init` that found the count at 0 to the
/// `hsa_shut_down` that brings it back to 0).
pub(crate) struct Runtime {
    pub(crate) config: SoftHsaConfig,
    pub(crate) topology: Topology,
    pub(crate) memory: Memory,
    pub(crate) workers: Workers,
    pub(crate) copies: CopyEngines,
    pub(crate) handlers: AsyncHandlers,
    /// Code object readers and executables (`hsa_executable_*`).
    pub(crate) executables: crate::executable::Executables,
    /// Images (`hsa_ext_image_*`).
    pub(crate) images: crate::image::Images,
    /// `hsa_amd_profiling_async_copy_enable`.
    pub(crate) async_copy_profiling: AtomicBool,
    signals: RwLock<HashMap<u64, Arc<Signal>>>,
    signal_groups: RwLock<HashMap<u64, Arc<[Arc<Signal>]>>>,
    queues: RwLock<HashMap<usize, Arc<Queue>>>,
    /// The queues the application destroyed last (at most [`KEPT_DESTROYED`], oldest first):
    /// their `hsa_queue_t` stays readable (and their revoked ring's address reserved) until
    /// more were destroyed or the instance stops, so that a read of a recently destroyed queue
    /// reaches the revoked ring and faults, rather than reading memory reused meanwhile. Older
    /// ones are freed: a program creating and destroying queues all along must not run out of
    /// memory mappings (one per kept ring).
    destroyed: Mutex<std::collections::VecDeque<Arc<Queue>>>,
    next_queue_id: AtomicU64,
}

impl Runtime {
    fn start(config: SoftHsaConfig) -> Self {
        let workers = Workers::start(config.effective_worker_threads());
        Self {
            topology: Topology::new(&config),
            config,
            memory: Memory::default(),
            workers,
            copies: CopyEngines::default(),
            handlers: AsyncHandlers::default(),
            executables: Default::default(),
            images: Default::default(),
            async_copy_profiling: AtomicBool::new(false),
            signals: RwLock::new(HashMap::new()),
            signal_groups: RwLock::new(HashMap::new()),
            queues: RwLock::new(HashMap::new()),
            destroyed: Mutex::new(std::collections::VecDeque::new()),
            next_queue_id: AtomicU64::new(0),
        }
    }

    /// Stops every thread and frees every object of this instance.
    fn stop(&self) {
        let queues: Vec<Arc<Queue>> = self.queues.write().drain().map(|(_, q)| q).collect();
        for queue in &queues {
            crate::queue::stop_queue(self, queue);
        }
        self.destroyed.lock().clear();
        self.copies.shutdown();
        self.handlers.shutdown();
        self.workers.shutdown();
        self.images.clear();
        self.memory.free_all(&self.topology);
        self.signals.write().clear();
        self.signal_groups.write().clear();
    }

    /// The index of a valid agent, or `HSA_STATUS_ERROR_INVALID_AGENT`.
    pub(crate) fn agent(&self, handle: u64) -> Result<usize, hsa_status_t> {
        self.topology
            .agent_index(handle)
            .ok_or(HSA_STATUS_ERROR_INVALID_AGENT)
    }

    /// The index of a valid GPU agent, or `HSA_STATUS_ERROR_INVALID_AGENT`.
    pub(crate) fn gpu_agent(&self, handle: u64) -> Result<usize, hsa_status_t> {
        let index = self.agent(handle)?;
        if self.topology.agents[index].kind == AgentKind::Gpu {
            Ok(index)
        } else {
            Err(HSA_STATUS_ERROR_INVALID_AGENT)
        }
    }

    /// Creates and registers a signal.
    pub(crate) fn create_signal(&self, initial: hsa_signal_value_t) -> Arc<Signal> {
        let signal = Arc::new(Signal::new(initial));
        self.signals.write().insert(signal.handle(), signal.clone());
        signal
    }

    /// The signal behind a handle, or `HSA_STATUS_ERROR_INVALID_SIGNAL`.
    pub(crate) fn signal(&self, handle: u64) -> Result<Arc<Signal>, hsa_status_t> {
        self.signals
            .read()
            .get(&handle)
            .cloned()
            .ok_or(HSA_STATUS_ERROR_INVALID_SIGNAL)
    }

    /// Unregisters a signal; `HSA_STATUS_ERROR_INVALID_SIGNAL` if the handle names none.
    pub(crate) fn destroy_signal(&self, handle: u64) -> Result<(), hsa_status_t> {
        self.signals
            .write()
            .remove(&handle)
            .map(|_| ())
            .ok_or(HSA_STATUS_ERROR_INVALID_SIGNAL)
    }

    pub(crate) fn add_signal_group(&self, signals: Arc<[Arc<Signal>]>) -> u64 {
        let handle = next_handle();
        self.signal_groups.write().insert(handle, signals);
        handle
    }

    pub(crate) fn signal_group(&self, handle: u64) -> Option<Arc<[Arc<Signal>]>> {
        self.signal_groups.read().get(&handle).cloned()
    }

    pub(crate) fn remove_signal_group(&self, handle: u64) -> bool {
        self.signal_groups.write().remove(&handle).is_some()
    }

    pub(crate) fn next_queue_id(&self) -> u64 {
        self.next_queue_id.fetch_add(1, Ordering::Relaxed)
    }

    /// Registers a queue under the address of its `hsa_queue_t`.
    pub(crate) fn register_queue(&self, queue: Arc<Queue>) {
        self.queues.write().insert(queue.hsa_ptr() as usize, queue);
    }

    /// The queue behind an `hsa_queue_t` pointer, or `HSA_STATUS_ERROR_INVALID_QUEUE`.
    pub(crate) fn queue(&self, ptr: *const hsa_queue_t) -> Result<Arc<Queue>, hsa_status_t> {
        self.queues
            .read()
            .get(&(ptr as usize))
            .cloned()
            .ok_or(HSA_STATUS_ERROR_INVALID_QUEUE)
    }

    /// [`queue`](Self::queue), or the destroyed queue kept at `ptr` (see `destroyed`).
    pub(crate) fn queue_or_destroyed(
        &self,
        ptr: *const hsa_queue_t,
    ) -> Result<Arc<Queue>, hsa_status_t> {
        self.queue(ptr).or_else(|status| {
            self.destroyed
                .lock()
                .iter()
                .rev()
                .find(|q| std::ptr::eq(q.hsa_ptr(), ptr))
                .cloned()
                .ok_or(status)
        })
    }

    /// Unregisters a queue; returns it if it was registered.
    pub(crate) fn unregister_queue(&self, ptr: *const hsa_queue_t) -> Option<Arc<Queue>> {
        self.queues.write().remove(&(ptr as usize))
    }

    /// Keeps a queue the application destroyed (stopped, its ring revoked) until the instance
    /// stops (see `destroyed`).
    pub(crate) fn keep_destroyed(&self, queue: Arc<Queue>) {
        let oldest = {
            let mut destroyed = self.destroyed.lock();
            destroyed.push_back(queue);
            (destroyed.len() > KEPT_DESTROYED)
                .then(|| destroyed.pop_front())
                .flatten()
        };
        // Freed (its ring unmapped, unless a thread still holds it) outside the lock.
        drop(oldest);
    }

    /// How many queues the application created on `agent` (an intercept queue counts once).
    pub(crate) fn queues_on_agent(&self, agent: usize) -> usize {
        self.queues
            .read()
            .values()
            .filter(|q| q.agent() == agent)
            .count()
    }
}

/// How many destroyed queues a runtime instance keeps (see `Runtime::destroyed`).
const KEPT_DESTROYED: usize = 256;

struct Global {
    refcount: u32,
    /// Configuration for the next initialization.
    next: SoftHsaConfig,
    /// Configuration of the live instance.
    active: Option<SoftHsaConfig>,
}

static GLOBAL: Mutex<Option<Global>> = Mutex::new(None);
static CURRENT: RwLock<Option<Arc<Runtime>>> = RwLock::new(None);

fn with_global<R>(f: impl FnOnce(&mut Global) -> R) -> R {
    let mut guard = GLOBAL.lock();
    let global = guard.get_or_insert_with(|| Global {
        refcount: 0,
        next: SoftHsaConfig::default(),
        active: None,
    });
    f(global)
}

/// The live runtime instance, or `HSA_STATUS_ERROR_NOT_INITIALIZED`.
pub(crate) fn current() -> Result<Arc<Runtime>, hsa_status_t> {
    CURRENT
        .read()
        .clone()
        .ok_or(HSA_STATUS_ERROR_NOT_INITIALIZED)
}

/// `hsa_init`: the first call starts a fresh instance, later ones count references.
pub(crate) fn init() -> hsa_status_t {
    with_global(|g| {
        if g.refcount == u32::MAX {
            return HSA_STATUS_ERROR_REFCOUNT_OVERFLOW;
        }
        if g.refcount == 0 {
            if let Err(status) = crate::faults::init_from_env() {
                return status;
            }
            let config = g.next.clone();
            match config.effective_poll() {
                Ok(poll) => {
                    // Polling needs a second CPU: on one, the change can only come once the
                    // poller gives the CPU up.
                    let cpus = crate::wake::usable_cpus();
                    crate::wake::set_polling(poll, if cpus > 1 { cpus } else { 0 });
                }
                Err(error) => {
                    eprintln!("softhsa: error: {error}");
                    return HSA_STATUS_ERROR_INVALID_ARGUMENT;
                }
            }
            *CURRENT.write() = Some(Arc::new(Runtime::start(config.clone())));
            g.active = Some(config);
        }
        g.refcount += 1;
        HSA_STATUS_SUCCESS
    })
}

/// `hsa_shut_down`: the call that brings the count to 0 stops and frees the instance.
pub(crate) fn shut_down() -> hsa_status_t {
    with_global(|g| {
        if g.refcount == 0 {
            return HSA_STATUS_ERROR_NOT_INITIALIZED;
        }
        g.refcount -= 1;
        if g.refcount == 0 {
            let runtime = CURRENT.write().take();
            g.active = None;
            if let Some(runtime) = runtime {
                runtime.stop();
            }
        }
        HSA_STATUS_SUCCESS
    })
}

/// See [`crate::configure`].
pub(crate) fn configure(config: SoftHsaConfig) -> Result<(), String> {
    config.validate()?;
    with_global(|g| {
        if let Some(active) = &g.active
            && *active != config
        {
            return Err(format!(
                "softhsa is initialized with {active:?}; it cannot change to {config:?} \
                 until every hsa_init has been matched by hsa_shut_down"
            ));
        }
        g.next = config;
        Ok(())
    })
}

/// Joins a thread unless it is the calling thread (a runtime object destroyed from one of its
/// own threads, e.g. a queue destroyed from its error callback).
pub(crate) fn join_unless_current(handle: JoinHandle<()>) {
    if handle.thread().id() != std::thread::current().id() {
        let _ = handle.join();
    }
}
