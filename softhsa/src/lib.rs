//! A software HSA runtime: agents, memory pools, signals and AQL queues implemented with host
//! threads and host memory, handed out as a fully populated [`hsa_sys::HsaApiTable`].
//!
//! kreplay uses it as its embedded default backend and as the test bed of its HSA path: the
//! backend talks to softhsa through exactly the table entries it would get from ROCm in a tools
//! library's `OnLoad`. Kernels are Rust functions registered with [`register_kernel`]; a dispatch
//! packet names one by its `kernel_object` and the packet processor runs it once per work-group,
//! so a kernel that does `x += 1` really adds one every time it runs.
//!
//! The runtime is process-global and reference counted like a real one (`hsa_init` /
//! `hsa_shut_down` through the table). Nothing is exported under an HSA symbol name, so softhsa
//! can live in a process next to a real runtime.
//!
//! ```
//! use kreplay_softhsa::testing::{Dispatch, Hsa};
//! use kreplay_softhsa::{WorkGroup, register_kernel};
//!
//! #[derive(Clone, Copy)]
//! #[repr(C)]
//! struct Args {
//!     data: *mut u32,
//! }
//!
//! fn add_one(group: &WorkGroup) {
//!     // SAFETY: the dispatch below passes an `Args` whose buffer covers the grid.
//!     let args: Args = unsafe { group.kernargs() };
//!     for [x, _, _] in group.work_items() {
//!         // SAFETY: `x` is inside the grid, which is the buffer's length.
//!         unsafe { *args.data.add(x as usize) += 1 };
//!     }
//! }
//!
//! let kernel = register_kernel("add_one", add_one);
//! let hsa = Hsa::softhsa(); // wrappers that call through kreplay_softhsa::api_table()
//! let _session = hsa.init().unwrap();
//! let gpu = hsa.gpu_agents().unwrap()[0];
//! let data = hsa.allocate(hsa.coarse_pool(gpu).unwrap(), 256 * 4).unwrap().cast::<u32>();
//! let mut args = Args { data };
//! let queue = hsa.queue_create(gpu, 64).unwrap();
//! let done = hsa.signal_create(1).unwrap();
//! let dispatch = Dispatch::linear(kernel, 256, 64, (&raw mut args).cast(), done);
//! // SAFETY: the queue is live and `args` outlives the dispatch (we wait for it below).
//! unsafe { hsa.dispatch(queue, &dispatch) };
//! assert!(hsa.wait_zero(done, std::time::Duration::from_secs(10)));
//! // SAFETY: the kernel has completed; the buffer holds 256 u32s.
//! assert!(unsafe { std::slice::from_raw_parts(data, 256) }.iter().all(|&v| v == 1));
//! // SAFETY: created above, destroyed once.
//! unsafe { hsa.queue_destroy(queue) }.unwrap();
//! ```

#![warn(missing_docs)]

mod api;
mod copy;
pub mod counters;
mod executable;
pub mod faults;
mod grid;
mod handlers;
mod handles;
mod image;
mod intercept;
mod kernel;
mod memory;
mod owned;
mod queue;
mod runtime;
mod signal;
pub mod testing;
mod time;
mod topology;
mod wake;

pub use executable::CodeObject;
pub use image::Image;
pub use kernel::{KernelFn, WorkGroup, kernel_name, register_kernel};
pub use owned::{OwnedApiTable, TABLE_LAYOUT_ENV, TableLayout};

/// How the next runtime instance is built (see [`configure`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SoftHsaConfig {
    /// Number of GPU agents (besides the one CPU agent). Default 2.
    pub gpu_agents: usize,
    /// Device memory per GPU agent, shared by its coarse- and fine-grained pools. A limit on
    /// what may be allocated, not a reservation. Default 16 GiB.
    pub vram_bytes_per_agent: u64,
    /// Host memory shared by the system and kernarg pools. A limit, not a reservation.
    /// Default 64 GiB.
    pub host_bytes: u64,
    /// Worker threads that help packet processors run work-groups; 0 picks one fewer than the
    /// available parallelism (at least 1). Each queue's own processor thread always takes part
    /// too. Default 0.
    pub worker_threads: usize,
    /// Whether a hardware queue may run kernel dispatches concurrently, as AQL allows: a
    /// dispatch without the barrier bit starts while earlier dispatches of its queue still run
    /// (each on a thread of its queue's own), and a packet with the barrier bit, or any other
    /// packet, starts only once everything before it completed. Off by default: each packet
    /// then runs to completion before the next starts (also a legal schedule).
    pub overlap_dispatches: bool,
    /// How long a thread about to block polls first: a packet processor whose queue is empty,
    /// a blocking signal wait, a barrier packet waiting for its dependencies, a producer waiting
    /// for a free slot. A change within that time (the next pass of a replay, the completion of
    /// a short kernel) is then seen without a wake-up across CPUs, which costs tens of
    /// microseconds on a virtual machine. At most as many threads poll at once as the process
    /// may use CPUs (its affinity mask); with one CPU nobody polls, since a poller there only
    /// delays the thread that would make the change. `None` (default): the environment variable
    /// [`POLL_ENV`] in microseconds if it is set, else [`DEFAULT_POLL`]. `Some(Duration::ZERO)`
    /// turns polling off: waiters park at once.
    pub poll_before_block: Option<std::time::Duration>,
    /// What `HSA_AMD_SYSTEM_INFO_SVM_SUPPORTED` and `HSA_AMD_SYSTEM_INFO_SVM_ACCESSIBLE_BY_DEFAULT`
    /// report: on a ROCm machine with XNACK on, agents reach any host memory of the process,
    /// `malloc`ed memory included. softhsa's kernels are host code and reach it either way; this
    /// only changes what the runtime says (default: false, as without XNACK).
    pub svm_accessible_by_default: bool,
    /// What `HSA_AMD_SYSTEM_INFO_SVM_SUPPORTED` reports even without
    /// [`svm_accessible_by_default`](Self::svm_accessible_by_default): on a ROCm machine with
    /// XNACK off, `hsa_amd_svm_attributes_set` still makes ranges of host memory accessible to
    /// agents (as managed memory may be). Only then (or with `svm_accessible_by_default`) does
    /// softhsa's `hsa_amd_svm_attributes_set` succeed; its kernels reach host memory either way.
    pub svm_supported: bool,
}

/// How long a thread about to block polls first, unless configured otherwise (see
/// [`SoftHsaConfig::poll_before_block`]).
pub const DEFAULT_POLL: std::time::Duration = std::time::Duration::from_micros(50);

/// The environment variable that sets [`SoftHsaConfig::poll_before_block`] in microseconds when
/// the configuration leaves it `None` (read by the `hsa_init` that starts the runtime).
pub const POLL_ENV: &str = "KREPLAY_SOFTHSA_POLL_US";

/// Most microseconds [`POLL_ENV`] accepts.
const MAX_POLL_US: u64 = 1_000_000;

/// Checks the runtime's own settings in the environment, [`TABLE_LAYOUT_ENV`], [`POLL_ENV`] and
/// [`faults::ENV_VAR`], as the runtime will read them: an error names the first bad one. For a
/// program to refuse them before it starts anything (the runtime reads the poll time and the
/// faults only at the `hsa_init` that starts it, and falls back to the default table layout).
pub fn check_env() -> Result<(), String> {
    TableLayout::from_env()?;
    SoftHsaConfig::default().effective_poll()?;
    faults::FaultPlan::from_env()?;
    Ok(())
}

impl Default for SoftHsaConfig {
    fn default() -> Self {
        Self {
            gpu_agents: 2,
            vram_bytes_per_agent: 16 << 30,
            host_bytes: 64 << 30,
            worker_threads: 0,
            overlap_dispatches: false,
            poll_before_block: None,
            svm_accessible_by_default: false,
            svm_supported: false,
        }
    }
}

/// Most GPU agents one instance may have.
const MAX_GPU_AGENTS: usize = 64;

impl SoftHsaConfig {
    fn validate(&self) -> Result<(), String> {
        if self.gpu_agents > MAX_GPU_AGENTS {
            return Err(format!(
                "gpu_agents is {}, at most {MAX_GPU_AGENTS} are supported",
                self.gpu_agents
            ));
        }
        if self.worker_threads > 1024 {
            return Err(format!(
                "worker_threads is {}, at most 1024 are supported",
                self.worker_threads
            ));
        }
        Ok(())
    }

    /// How long a thread about to block polls first: the configured time, else [`POLL_ENV`],
    /// else [`DEFAULT_POLL`]; an error names a bad [`POLL_ENV`] value.
    pub(crate) fn effective_poll(&self) -> Result<std::time::Duration, String> {
        if let Some(poll) = self.poll_before_block {
            return Ok(poll);
        }
        match std::env::var(POLL_ENV) {
            Err(std::env::VarError::NotPresent) => Ok(DEFAULT_POLL),
            Err(std::env::VarError::NotUnicode(_)) => Err(format!("{POLL_ENV} is not valid UTF-8")),
            Ok(text) => match text.parse::<u64>() {
                Ok(us) if us <= MAX_POLL_US && text.bytes().all(|b| b.is_ascii_digit()) => {
                    Ok(std::time::Duration::from_micros(us))
                }
                _ => Err(format!(
                    "{POLL_ENV}={text:?}: expected microseconds, 0 to {MAX_POLL_US} (digits only)"
                )),
            },
        }
    }

    /// The worker pool size this configuration yields.
    pub(crate) fn effective_worker_threads(&self) -> usize {
        if self.worker_threads > 0 {
            return self.worker_threads;
        }
        std::thread::available_parallelism()
            .map_or(1, |n| n.get().saturating_sub(1))
            .max(1)
    }
}

/// Sets the configuration used by the next `hsa_init` that actually initializes (reference
/// count 0 -> 1). Fails if the configuration is invalid, or if the runtime is currently
/// initialized with a different configuration.
///
/// ```
/// use kreplay_softhsa::{SoftHsaConfig, configure};
/// assert!(configure(SoftHsaConfig { gpu_agents: 1000, ..SoftHsaConfig::default() }).is_err());
/// ```
pub fn configure(config: SoftHsaConfig) -> Result<(), String> {
    runtime::configure(config)
}

/// The API table. Entries are valid for the life of the process; calling them before `hsa_init`
/// returns `HSA_STATUS_ERROR_NOT_INITIALIZED` like a real runtime. The table is static: copy it
/// and replace entries in the copy (as tools do with `hsa_api_trace`); softhsa never reads entries
/// back from a caller's copy.
pub fn api_table() -> &'static hsa_sys::HsaApiTable {
    api::api_table()
}
