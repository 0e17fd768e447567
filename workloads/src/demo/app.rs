//! The demo application: an ordinary HSA program that only knows an `HsaApiTable`.
//!
//! It initializes the runtime, finds the first GPU agent, its coarse-grained pool and a kernarg
//! pool, allocates three device buffers, uploads deterministic input, creates a queue and runs
//! [`AppConfig::rounds`] rounds of four dependent dispatches (one packet per doorbell ring, each
//! waited for on its completion signal):
//!
//! 1. `scale_add`: `x = 3x + 1` (in place),
//! 2. `axpy`: `y += a·x` (in place),
//! 3. `histogram`: `hist[y % 256] += 1` (atomics),
//! 4. `remix`: `x = rotl(y, 7) ^ hist[(y >> 4) % 256]` (reads `y` and `hist`, writes `x`),
//!
//! then reads every buffer back with `hsa_memory_copy`, frees everything and shuts the runtime
//! down. The kernels come from a code object loaded into an executable on the GPU, which also
//! holds the module-scope counter `remixes` (read back as a fourth buffer). Each dispatch consumes the previous results, so a pass that saw memory another pass had
//! already changed shows in the final buffers.

use std::ffi::{CStr, c_void};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use hsa_sys::*;

use super::kernels::{
    AxpyArgs, HistogramArgs, KernelSet, REMIXES, RemixArgs, ScaleAddArgs, WORKGROUP_SIZE,
};

/// Number of histogram bins.
pub const BINS: u32 = 256;
/// Dispatches per round.
pub const DISPATCHES_PER_ROUND: usize = 4;
/// Bytes reserved per dispatch in the kernarg block (AQL asks for 16-byte alignment).
const KERNARG_SLOT: usize = 64;
/// Packets in the application's queue.
const QUEUE_SIZE: u32 = 64;
/// How long one dispatch may take before the application gives up.
const DISPATCH_DEADLINE: Duration = Duration::from_secs(60);

/// The size of the workload.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AppConfig {
    /// `u32` elements of `x` and `y`.
    pub elements: usize,
    /// Rounds of four dispatches.
    pub rounds: u32,
}

/// One buffer as read back at the end.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Buffer {
    /// Its name in the application (`x`, `y`, `hist`).
    pub name: &'static str,
    /// Its contents.
    pub data: Vec<u32>,
}

impl Buffer {
    /// Size in bytes.
    pub fn bytes(&self) -> u64 {
        (self.data.len() * size_of::<u32>()) as u64
    }

    /// FNV-1a (64-bit) of the contents, for a short printed fingerprint.
    pub fn checksum(&self) -> u64 {
        let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
        for value in &self.data {
            for byte in value.to_le_bytes() {
                hash ^= u64::from(byte);
                hash = hash.wrapping_mul(0x0100_0000_01b3);
            }
        }
        hash
    }
}

/// What one run of the application produced.
#[derive(Clone, Debug)]
pub struct AppRun {
    /// Name of the GPU agent it ran on.
    pub agent_name: String,
    /// Number of GPU agents the runtime reported.
    pub gpu_agents: usize,
    /// Kernel names in dispatch order.
    pub dispatches: Vec<&'static str>,
    /// The buffers read back at the end.
    pub buffers: Vec<Buffer>,
    /// Bytes of coarse-grained device memory the application allocated.
    pub device_bytes: u64,
    /// Wall time from `hsa_init` to `hsa_shut_down`.
    pub elapsed: Duration,
}

/// An HSA call that failed (or a table entry that is missing).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AppError {
    /// What went wrong, naming the call.
    pub message: String,
}

impl std::fmt::Display for AppError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for AppError {}

fn error(message: impl Into<String>) -> AppError {
    AppError {
        message: message.into(),
    }
}

/// Reads a table entry or fails naming it.
macro_rules! entry {
    ($table:expr, $field:ident) => {
        $table
            .$field
            .ok_or_else(|| error(concat!("the HSA table has no ", stringify!($field))))?
    };
}

/// The core and AMD extension tables of the runtime the application talks to.
struct Api<'t> {
    core: &'t CoreApiTable,
    amd: &'t AmdExtTable,
}

impl<'t> Api<'t> {
    fn new(table: &'t HsaApiTable) -> Result<Self, AppError> {
        // SAFETY: a runtime's table points at valid sub-tables for as long as the table lives;
        // null pointers are rejected.
        let core = unsafe { table.core_.as_ref() }
            .ok_or_else(|| error("the HSA table has no core API table"))?;
        // SAFETY: as above.
        let amd = unsafe { table.amd_ext_.as_ref() }
            .ok_or_else(|| error("the HSA table has no AMD extension table"))?;
        Ok(Api { core, amd })
    }

    /// `Ok` for success, else an error naming `call` and the runtime's description of `status`.
    fn check(&self, call: &str, status: hsa_status_t) -> Result<(), AppError> {
        if status == HSA_STATUS_SUCCESS {
            return Ok(());
        }
        let mut text: *const std::ffi::c_char = std::ptr::null();
        let described = match self.core.hsa_status_string_fn {
            Some(f) => {
                // SAFETY: `text` is a valid out-pointer; the runtime writes a static string.
                let status = unsafe { f(status, &mut text) };
                status == HSA_STATUS_SUCCESS && !text.is_null()
            }
            None => false,
        };
        let description = if described {
            // SAFETY: the runtime returned a NUL-terminated string with static storage.
            unsafe { CStr::from_ptr(text) }
                .to_string_lossy()
                .into_owned()
        } else {
            "no description".to_string()
        };
        Err(error(format!(
            "{call} failed with status {status:#x} ({description})"
        )))
    }
}

/// Runs the application through `table` (softhsa's own table, or a copy kreplay is installed
/// in) with the kernels of `kernels`.
pub fn run(
    table: &HsaApiTable,
    kernels: &KernelSet,
    config: &AppConfig,
) -> Result<AppRun, AppError> {
    let started = Instant::now();
    let api = Api::new(table)?;
    let mut session = Session::start(&api)?;
    let mut run = session.work(kernels, config)?;
    session.close()?;
    run.elapsed = started.elapsed();
    Ok(run)
}

/// Everything the application created, released on every path (explicitly and checked by
/// [`Session::close`], or best-effort on drop after an error).
struct Session<'a> {
    api: &'a Api<'a>,
    initialized: bool,
    allocations: Vec<*mut c_void>,
    queue: *mut hsa_queue_t,
    signal: hsa_signal_t,
    executable: hsa_executable_t,
}

impl<'a> Session<'a> {
    fn start(api: &'a Api<'a>) -> Result<Self, AppError> {
        let init = entry!(api.core, hsa_init_fn);
        // SAFETY: hsa_init has no preconditions.
        api.check("hsa_init", unsafe { init() })?;
        Ok(Session {
            api,
            initialized: true,
            allocations: Vec::new(),
            queue: std::ptr::null_mut(),
            signal: hsa_signal_t { handle: 0 },
            executable: hsa_executable_t { handle: 0 },
        })
    }

    /// Loads the demo's code object on `gpu` and returns the address of its `remixes` variable.
    fn load_code(&mut self, gpu: hsa_agent_t, kernels: &KernelSet) -> Result<u64, AppError> {
        let api = self.api;
        let bytes = kernels.code_object().to_bytes();
        let create = entry!(api.core, hsa_executable_create_alt_fn);
        let mut exe = hsa_executable_t { handle: 0 };
        // SAFETY: valid out-pointer; no options.
        let status = unsafe {
            create(
                HSA_PROFILE_FULL,
                HSA_DEFAULT_FLOAT_ROUNDING_MODE_DEFAULT,
                std::ptr::null(),
                &mut exe,
            )
        };
        api.check("hsa_executable_create_alt", status)?;
        self.executable = exe;
        let reader_create = entry!(api.core, hsa_code_object_reader_create_from_memory_fn);
        let mut reader = hsa_code_object_reader_t { handle: 0 };
        // SAFETY: `bytes` is live for the call; valid out-pointer.
        let status = unsafe { reader_create(bytes.as_ptr().cast(), bytes.len(), &mut reader) };
        api.check("hsa_code_object_reader_create_from_memory", status)?;
        let load = entry!(api.core, hsa_executable_load_agent_code_object_fn);
        // SAFETY: live executable, agent and reader; no options; the loaded object is not kept.
        let loaded = unsafe { load(exe, gpu, reader, std::ptr::null(), std::ptr::null_mut()) };
        let destroy_reader = entry!(api.core, hsa_code_object_reader_destroy_fn);
        // SAFETY: the reader created above, no longer needed once loaded.
        let destroyed = unsafe { destroy_reader(reader) };
        api.check("hsa_executable_load_agent_code_object", loaded)?;
        api.check("hsa_code_object_reader_destroy", destroyed)?;
        let freeze = entry!(api.core, hsa_executable_freeze_fn);
        // SAFETY: the live executable; no options.
        api.check("hsa_executable_freeze", unsafe {
            freeze(exe, std::ptr::null())
        })?;
        let by_name = entry!(api.core, hsa_executable_get_symbol_by_name_fn);
        let mut symbol = hsa_executable_symbol_t { handle: 0 };
        // SAFETY: a NUL-terminated name, the live agent and a valid out-pointer.
        let status = unsafe { by_name(exe, c"remixes".as_ptr(), &gpu, &mut symbol) };
        api.check("hsa_executable_get_symbol_by_name(remixes)", status)?;
        let info = entry!(api.core, hsa_executable_symbol_get_info_fn);
        let mut address = 0u64;
        // SAFETY: VARIABLE_ADDRESS is a u64 written to a live local.
        let status = unsafe {
            info(
                symbol,
                HSA_EXECUTABLE_SYMBOL_INFO_VARIABLE_ADDRESS,
                (&raw mut address).cast(),
            )
        };
        api.check("hsa_executable_symbol_get_info(VARIABLE_ADDRESS)", status)?;
        Ok(address)
    }

    fn work(&mut self, kernels: &KernelSet, config: &AppConfig) -> Result<AppRun, AppError> {
        let api = self.api;
        let n = config.elements;
        let grid = u32::try_from(n).map_err(|_| error("too many elements for one grid"))?;
        let agents = find_agents(api)?;
        let gpu = *agents
            .gpus
            .first()
            .ok_or_else(|| error("the runtime reports no GPU agent"))?;
        let agent_name = agent_name(api, gpu)?;
        let pools = find_pools(api, gpu, &agents.cpus)?;
        let remixes = self.load_code(gpu, kernels)?;
        REMIXES.store(remixes, Ordering::Release);

        // Device buffers.
        let bytes = n * size_of::<u32>();
        let hist_bytes = BINS as usize * size_of::<u32>();
        let x = self.allocate(pools.coarse, bytes)?;
        let y = self.allocate(pools.coarse, bytes)?;
        let hist = self.allocate(pools.coarse, hist_bytes)?;
        let device_bytes = (2 * bytes + hist_bytes) as u64;

        // Deterministic input.
        let x0: Vec<u32> = (0..n as u32).map(mix).collect();
        let y0: Vec<u32> = (0..n as u32)
            .map(|i| i.wrapping_mul(2_654_435_761))
            .collect();
        let zeros = vec![0u32; BINS as usize];
        self.upload(x, &x0)?;
        self.upload(y, &y0)?;
        self.upload(hist, &zeros)?;

        // Kernel arguments, one slot per dispatch.
        let dispatch_count = config.rounds as usize * DISPATCHES_PER_ROUND;
        let kernargs = self.allocate(pools.kernarg, (dispatch_count * KERNARG_SLOT).max(1))?;

        // Queue and completion signal.
        let create_queue = entry!(api.core, hsa_queue_create_fn);
        let mut queue: *mut hsa_queue_t = std::ptr::null_mut();
        // SAFETY: valid agent and out-pointer; no error callback.
        let status = unsafe {
            create_queue(
                gpu,
                QUEUE_SIZE,
                HSA_QUEUE_TYPE_SINGLE,
                None,
                std::ptr::null_mut(),
                u32::MAX,
                u32::MAX,
                &mut queue,
            )
        };
        api.check("hsa_queue_create", status)?;
        if queue.is_null() {
            return Err(error("hsa_queue_create returned no queue"));
        }
        self.queue = queue;
        let create_signal = entry!(api.core, hsa_signal_create_fn);
        let mut signal = hsa_signal_t { handle: 0 };
        // SAFETY: valid out-pointer; no consumer list.
        let status = unsafe { create_signal(0, 0, std::ptr::null(), &mut signal) };
        api.check("hsa_signal_create", status)?;
        self.signal = signal;

        let ticks_per_second = timestamp_frequency(api)?;
        let mut dispatches = Vec::with_capacity(dispatch_count);
        let n64 = n as u64;
        for round in 0..config.rounds {
            let steps: [(&'static str, u64, Kernarg); DISPATCHES_PER_ROUND] = [
                (
                    "scale_add",
                    kernels.scale_add,
                    Kernarg::ScaleAdd(ScaleAddArgs {
                        x: x as u64,
                        n: n64,
                        mul: 3,
                        add: 1,
                    }),
                ),
                (
                    "axpy",
                    kernels.axpy,
                    Kernarg::Axpy(AxpyArgs {
                        y: y as u64,
                        x: x as u64,
                        n: n64,
                        a: 2 * round + 5,
                    }),
                ),
                (
                    "histogram",
                    kernels.histogram,
                    Kernarg::Histogram(HistogramArgs {
                        src: y as u64,
                        bins: hist as u64,
                        n: n64,
                        n_bins: BINS,
                    }),
                ),
                (
                    "remix",
                    kernels.remix,
                    Kernarg::Remix(RemixArgs {
                        src: y as u64,
                        bins: hist as u64,
                        dst: x as u64,
                        n: n64,
                        n_bins: BINS,
                    }),
                ),
            ];
            for (name, kernel_object, args) in steps {
                // SAFETY: the kernarg block holds `dispatch_count` slots; this is slot
                // `dispatches.len()` < dispatch_count.
                let slot = unsafe { kernargs.cast::<u8>().add(dispatches.len() * KERNARG_SLOT) };
                args.write_to(slot);
                self.dispatch(kernel_object, slot.cast(), grid, ticks_per_second)
                    .map_err(|e| {
                        error(format!(
                            "dispatch {} ({name}): {}",
                            dispatches.len() + 1,
                            e.message
                        ))
                    })?;
                dispatches.push(name);
            }
        }

        let buffers = vec![
            Buffer {
                name: "x",
                data: self.download(x, n)?,
            },
            Buffer {
                name: "y",
                data: self.download(y, n)?,
            },
            Buffer {
                name: "hist",
                data: self.download(hist, BINS as usize)?,
            },
            Buffer {
                name: "remixes",
                data: self.download(remixes as *mut c_void, 1)?,
            },
        ];
        REMIXES.store(0, Ordering::Release);
        Ok(AppRun {
            agent_name,
            gpu_agents: agents.gpus.len(),
            dispatches,
            buffers,
            device_bytes,
            elapsed: Duration::ZERO,
        })
    }

    fn allocate(
        &mut self,
        pool: hsa_amd_memory_pool_t,
        bytes: usize,
    ) -> Result<*mut c_void, AppError> {
        let allocate = entry!(self.api.amd, hsa_amd_memory_pool_allocate_fn);
        let mut ptr: *mut c_void = std::ptr::null_mut();
        // SAFETY: valid pool handle and out-pointer.
        let status = unsafe { allocate(pool, bytes, 0, &mut ptr) };
        self.api.check("hsa_amd_memory_pool_allocate", status)?;
        if ptr.is_null() {
            return Err(error("hsa_amd_memory_pool_allocate returned NULL"));
        }
        self.allocations.push(ptr);
        Ok(ptr)
    }

    fn upload(&self, dst: *mut c_void, data: &[u32]) -> Result<(), AppError> {
        let copy = entry!(self.api.core, hsa_memory_copy_fn);
        // SAFETY: `dst` is an allocation of at least `size_of_val(data)` bytes made by this
        // session; `data` is readable host memory of that size.
        let status = unsafe { copy(dst, data.as_ptr().cast(), size_of_val(data)) };
        self.api.check("hsa_memory_copy (to device)", status)
    }

    fn download(&self, src: *mut c_void, elements: usize) -> Result<Vec<u32>, AppError> {
        let copy = entry!(self.api.core, hsa_memory_copy_fn);
        let mut data = vec![0u32; elements];
        // SAFETY: `src` is an allocation of at least `elements` u32s made by this session; `data`
        // is writable host memory of that size.
        let status = unsafe { copy(data.as_mut_ptr().cast(), src, elements * size_of::<u32>()) };
        self.api.check("hsa_memory_copy (to host)", status)?;
        Ok(data)
    }

    /// Writes one kernel dispatch packet, rings the doorbell and waits for its completion.
    fn dispatch(
        &self,
        kernel_object: u64,
        kernarg: *mut c_void,
        grid: u32,
        ticks_per_second: u64,
    ) -> Result<(), AppError> {
        let api = self.api;
        let queue = self.queue;
        let store_relaxed = entry!(api.core, hsa_signal_store_relaxed_fn);
        let store_release = entry!(api.core, hsa_signal_store_screlease_fn);
        let add_write_index = entry!(api.core, hsa_queue_add_write_index_scacq_screl_fn);
        let load_read_index = entry!(api.core, hsa_queue_load_read_index_scacquire_fn);
        let wait = entry!(api.core, hsa_signal_wait_scacquire_fn);

        // SAFETY: the signal was created by this session.
        unsafe { store_relaxed(self.signal, 1) };
        // SAFETY: `queue` is the live queue this session created.
        let (size, base, doorbell) = unsafe {
            (
                u64::from((*queue).size),
                (*queue).base_address,
                (*queue).doorbell_signal,
            )
        };
        // SAFETY: as above.
        let index = unsafe { add_write_index(queue, 1) };
        // Wait (yielding) until the packet processor has freed the slot.
        let deadline = Instant::now() + DISPATCH_DEADLINE;
        // SAFETY: as above.
        while index - unsafe { load_read_index(queue) } >= size {
            if Instant::now() >= deadline {
                return Err(error("the queue stayed full"));
            }
            std::thread::yield_now();
        }
        let packet = hsa_kernel_dispatch_packet_t {
            header: 0,
            setup: 1 << HSA_KERNEL_DISPATCH_PACKET_SETUP_DIMENSIONS,
            workgroup_size_x: WORKGROUP_SIZE,
            workgroup_size_y: 1,
            workgroup_size_z: 1,
            reserved0: 0,
            grid_size_x: grid,
            grid_size_y: 1,
            grid_size_z: 1,
            private_segment_size: 0,
            group_segment_size: 0,
            kernel_object,
            kernarg_address: kernarg,
            reserved2: 0,
            completion_signal: self.signal,
        };
        let header = ((HSA_PACKET_TYPE_KERNEL_DISPATCH << HSA_PACKET_HEADER_TYPE)
            | (1 << HSA_PACKET_HEADER_BARRIER)
            | (HSA_FENCE_SCOPE_SYSTEM << HSA_PACKET_HEADER_SCACQUIRE_FENCE_SCOPE)
            | (HSA_FENCE_SCOPE_SYSTEM << HSA_PACKET_HEADER_SCRELEASE_FENCE_SCOPE))
            as u16;
        // SAFETY: the ring holds `size` 64-byte packets at `base`; slot `index % size` is free
        // (checked above) and ours until its header becomes valid. The body is written first,
        // then header and setup together with release ordering, so the packet processor never
        // sees a valid header before the body.
        unsafe {
            let slot = base
                .cast::<hsa_kernel_dispatch_packet_t>()
                .add((index % size) as usize);
            std::ptr::copy_nonoverlapping(
                (&raw const packet).cast::<u8>().add(4),
                slot.cast::<u8>().add(4),
                size_of::<hsa_kernel_dispatch_packet_t>() - 4,
            );
            AtomicU32::from_ptr(slot.cast::<u32>()).store(
                u32::from(header) | (u32::from(packet.setup) << 16),
                Ordering::Release,
            );
            store_release(doorbell, index as hsa_signal_value_t);
        }

        let deadline = Instant::now() + DISPATCH_DEADLINE;
        loop {
            // SAFETY: the signal was created by this session; waits at most one second.
            let value = unsafe {
                wait(
                    self.signal,
                    HSA_SIGNAL_CONDITION_LT,
                    1,
                    ticks_per_second,
                    HSA_WAIT_STATE_BLOCKED,
                )
            };
            if value < 1 {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(error(format!(
                    "no completion within {} s",
                    DISPATCH_DEADLINE.as_secs()
                )));
            }
        }
    }

    /// Releases everything in reverse order of creation, checking every status.
    fn close(&mut self) -> Result<(), AppError> {
        let api = self.api;
        if !self.queue.is_null() {
            let destroy = entry!(api.core, hsa_queue_destroy_fn);
            let queue = std::mem::replace(&mut self.queue, std::ptr::null_mut());
            // SAFETY: the live queue this session created; no packet is in flight.
            api.check("hsa_queue_destroy", unsafe { destroy(queue) })?;
        }
        if self.signal.handle != 0 {
            let destroy = entry!(api.core, hsa_signal_destroy_fn);
            let signal = std::mem::replace(&mut self.signal, hsa_signal_t { handle: 0 });
            // SAFETY: the signal this session created; nothing waits on it any more.
            api.check("hsa_signal_destroy", unsafe { destroy(signal) })?;
        }
        if self.executable.handle != 0 {
            let destroy = entry!(api.core, hsa_executable_destroy_fn);
            let exe = std::mem::replace(&mut self.executable, hsa_executable_t { handle: 0 });
            // SAFETY: the executable this session created; no kernel of it runs any more.
            api.check("hsa_executable_destroy", unsafe { destroy(exe) })?;
        }
        let free = entry!(api.amd, hsa_amd_memory_pool_free_fn);
        while let Some(ptr) = self.allocations.pop() {
            // SAFETY: an allocation this session made; no kernel uses it any more.
            api.check("hsa_amd_memory_pool_free", unsafe { free(ptr) })?;
        }
        if self.initialized {
            self.initialized = false;
            let shut_down = entry!(api.core, hsa_shut_down_fn);
            // SAFETY: balances this session's hsa_init.
            api.check("hsa_shut_down", unsafe { shut_down() })?;
        }
        Ok(())
    }
}

impl Drop for Session<'_> {
    /// After an error: best-effort release, statuses ignored (the error is already reported).
    fn drop(&mut self) {
        let core = self.api.core;
        let amd = self.api.amd;
        if let (false, Some(destroy)) = (self.queue.is_null(), core.hsa_queue_destroy_fn) {
            // SAFETY: the live queue this session created.
            unsafe { destroy(self.queue) };
        }
        if let (true, Some(destroy)) = (self.signal.handle != 0, core.hsa_signal_destroy_fn) {
            // SAFETY: the signal this session created.
            unsafe { destroy(self.signal) };
        }
        if let (true, Some(destroy)) = (self.executable.handle != 0, core.hsa_executable_destroy_fn)
        {
            // SAFETY: the executable this session created.
            unsafe { destroy(self.executable) };
        }
        REMIXES.store(0, Ordering::Release);
        if let Some(free) = amd.hsa_amd_memory_pool_free_fn {
            for ptr in self.allocations.drain(..) {
                // SAFETY: an allocation this session made.
                unsafe { free(ptr) };
            }
        }
        if let (true, Some(shut_down)) = (self.initialized, core.hsa_shut_down_fn) {
            // SAFETY: balances this session's hsa_init.
            unsafe { shut_down() };
        }
    }
}

/// One dispatch's kernel arguments.
enum Kernarg {
    ScaleAdd(ScaleAddArgs),
    Axpy(AxpyArgs),
    Histogram(HistogramArgs),
    Remix(RemixArgs),
}

impl Kernarg {
    /// Writes the arguments to a kernarg slot of `KERNARG_SLOT` bytes.
    fn write_to(&self, slot: *mut u8) {
        const {
            assert!(size_of::<ScaleAddArgs>() <= KERNARG_SLOT);
            assert!(size_of::<AxpyArgs>() <= KERNARG_SLOT);
            assert!(size_of::<HistogramArgs>() <= KERNARG_SLOT);
            assert!(size_of::<RemixArgs>() <= KERNARG_SLOT);
        }
        // SAFETY: `slot` is writable host-accessible kernarg memory of KERNARG_SLOT bytes and
        // every argument struct fits (checked at compile time above).
        unsafe {
            match self {
                Kernarg::ScaleAdd(a) => slot.cast::<ScaleAddArgs>().write_unaligned(*a),
                Kernarg::Axpy(a) => slot.cast::<AxpyArgs>().write_unaligned(*a),
                Kernarg::Histogram(a) => slot.cast::<HistogramArgs>().write_unaligned(*a),
                Kernarg::Remix(a) => slot.cast::<RemixArgs>().write_unaligned(*a),
            }
        }
    }
}

/// A cheap deterministic scrambler for the input data.
fn mix(i: u32) -> u32 {
    let mut v = i.wrapping_add(0x9e37_79b9);
    v = (v ^ (v >> 16)).wrapping_mul(0x85eb_ca6b);
    v = (v ^ (v >> 13)).wrapping_mul(0xc2b2_ae35);
    v ^ (v >> 16)
}

fn timestamp_frequency(api: &Api<'_>) -> Result<u64, AppError> {
    let get_info = entry!(api.core, hsa_system_get_info_fn);
    let mut frequency: u64 = 0;
    // SAFETY: TIMESTAMP_FREQUENCY is a u64 written to a valid out-pointer.
    let status = unsafe {
        get_info(
            HSA_SYSTEM_INFO_TIMESTAMP_FREQUENCY,
            (&raw mut frequency).cast(),
        )
    };
    api.check("hsa_system_get_info(TIMESTAMP_FREQUENCY)", status)?;
    Ok(frequency.max(1))
}

struct Agents {
    gpus: Vec<hsa_agent_t>,
    cpus: Vec<hsa_agent_t>,
}

struct AgentWalk<'a> {
    api: &'a Api<'a>,
    agents: Agents,
    failure: Option<AppError>,
}

/// Runs `body` inside an iteration callback: errors and panics stop the walk with
/// `HSA_STATUS_ERROR`, keeping the error for the caller.
fn walk_step(
    failure: &mut Option<AppError>,
    body: impl FnOnce() -> Result<(), AppError>,
) -> hsa_status_t {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(())) => HSA_STATUS_SUCCESS,
        Ok(Err(e)) => {
            *failure = Some(e);
            HSA_STATUS_ERROR
        }
        Err(_) => {
            *failure = Some(error("internal error while walking the runtime's objects"));
            HSA_STATUS_ERROR
        }
    }
}

unsafe extern "C" fn visit_agent(agent: hsa_agent_t, data: *mut c_void) -> hsa_status_t {
    // SAFETY: `data` is the `AgentWalk` that `find_agents` passes for the duration of the walk.
    let walk = unsafe { &mut *data.cast::<AgentWalk<'_>>() };
    let api = walk.api;
    let agents = &mut walk.agents;
    walk_step(&mut walk.failure, || {
        let get_info = entry!(api.core, hsa_agent_get_info_fn);
        let mut device: hsa_device_type_t = 0;
        // SAFETY: DEVICE is a hsa_device_type_t written to a valid out-pointer.
        let status = unsafe { get_info(agent, HSA_AGENT_INFO_DEVICE, (&raw mut device).cast()) };
        api.check("hsa_agent_get_info(DEVICE)", status)?;
        match device {
            HSA_DEVICE_TYPE_GPU => agents.gpus.push(agent),
            HSA_DEVICE_TYPE_CPU => agents.cpus.push(agent),
            _ => {}
        }
        Ok(())
    })
}

fn find_agents(api: &Api<'_>) -> Result<Agents, AppError> {
    let iterate = entry!(api.core, hsa_iterate_agents_fn);
    let mut walk = AgentWalk {
        api,
        agents: Agents {
            gpus: Vec::new(),
            cpus: Vec::new(),
        },
        failure: None,
    };
    // SAFETY: the callback receives `walk`, which outlives the call.
    let status = unsafe { iterate(Some(visit_agent), (&raw mut walk).cast()) };
    if let Some(failure) = walk.failure {
        return Err(failure);
    }
    api.check("hsa_iterate_agents", status)?;
    Ok(walk.agents)
}

fn agent_name(api: &Api<'_>, agent: hsa_agent_t) -> Result<String, AppError> {
    let get_info = entry!(api.core, hsa_agent_get_info_fn);
    let mut name = [0u8; 64];
    // SAFETY: NAME is a 64-byte character array written to a buffer of that size.
    let status = unsafe { get_info(agent, HSA_AGENT_INFO_NAME, name.as_mut_ptr().cast()) };
    api.check("hsa_agent_get_info(NAME)", status)?;
    let end = name.iter().position(|&b| b == 0).unwrap_or(name.len());
    Ok(String::from_utf8_lossy(&name[..end]).into_owned())
}

struct Pools {
    coarse: hsa_amd_memory_pool_t,
    kernarg: hsa_amd_memory_pool_t,
}

struct PoolWalk<'a> {
    api: &'a Api<'a>,
    /// Whether the agent walked now may provide the coarse-grained pool (only the GPU).
    want_coarse: bool,
    coarse: Option<hsa_amd_memory_pool_t>,
    kernarg: Option<hsa_amd_memory_pool_t>,
    failure: Option<AppError>,
}

unsafe extern "C" fn visit_pool(pool: hsa_amd_memory_pool_t, data: *mut c_void) -> hsa_status_t {
    // SAFETY: `data` is the `PoolWalk` that `walk_pools` passes for the duration of the walk.
    let walk = unsafe { &mut *data.cast::<PoolWalk<'_>>() };
    let api = walk.api;
    let want_coarse = walk.want_coarse;
    let (coarse, kernarg) = (&mut walk.coarse, &mut walk.kernarg);
    walk_step(&mut walk.failure, || {
        let get_info = entry!(api.amd, hsa_amd_memory_pool_get_info_fn);
        let mut segment: hsa_amd_segment_t = 0;
        let mut flags: u32 = 0;
        let mut alloc_allowed = false;
        // SAFETY: each attribute is written to an out-pointer of its documented type (u32 enum,
        // u32 flags, bool).
        unsafe {
            let s = get_info(
                pool,
                HSA_AMD_MEMORY_POOL_INFO_SEGMENT,
                (&raw mut segment).cast(),
            );
            api.check("hsa_amd_memory_pool_get_info(SEGMENT)", s)?;
            let s = get_info(
                pool,
                HSA_AMD_MEMORY_POOL_INFO_GLOBAL_FLAGS,
                (&raw mut flags).cast(),
            );
            api.check("hsa_amd_memory_pool_get_info(GLOBAL_FLAGS)", s)?;
            let s = get_info(
                pool,
                HSA_AMD_MEMORY_POOL_INFO_RUNTIME_ALLOC_ALLOWED,
                (&raw mut alloc_allowed).cast(),
            );
            api.check("hsa_amd_memory_pool_get_info(RUNTIME_ALLOC_ALLOWED)", s)?;
        }
        if segment != HSA_AMD_SEGMENT_GLOBAL || !alloc_allowed {
            return Ok(());
        }
        if flags & HSA_AMD_MEMORY_POOL_GLOBAL_FLAG_KERNARG_INIT != 0 {
            kernarg.get_or_insert(pool);
        } else if want_coarse && flags & HSA_AMD_MEMORY_POOL_GLOBAL_FLAG_COARSE_GRAINED != 0 {
            coarse.get_or_insert(pool);
        }
        Ok(())
    })
}

fn walk_pools<'a>(
    api: &'a Api<'a>,
    agent: hsa_agent_t,
    walk: &mut PoolWalk<'a>,
) -> Result<(), AppError> {
    let iterate = entry!(api.amd, hsa_amd_agent_iterate_memory_pools_fn);
    // SAFETY: the callback receives `walk`, which outlives the call.
    let status = unsafe { iterate(agent, Some(visit_pool), (walk as *mut PoolWalk<'a>).cast()) };
    if let Some(failure) = walk.failure.take() {
        return Err(failure);
    }
    api.check("hsa_amd_agent_iterate_memory_pools", status)
}

/// The GPU's coarse-grained pool, and a kernarg pool (the GPU's own, else a CPU agent's, where a
/// real ROCm runtime puts it).
fn find_pools<'a>(
    api: &'a Api<'a>,
    gpu: hsa_agent_t,
    cpus: &[hsa_agent_t],
) -> Result<Pools, AppError> {
    let mut walk = PoolWalk {
        api,
        want_coarse: true,
        coarse: None,
        kernarg: None,
        failure: None,
    };
    walk_pools(api, gpu, &mut walk)?;
    walk.want_coarse = false;
    for &cpu in cpus {
        if walk.kernarg.is_some() {
            break;
        }
        walk_pools(api, cpu, &mut walk)?;
    }
    Ok(Pools {
        coarse: walk
            .coarse
            .ok_or_else(|| error("the GPU agent has no coarse-grained pool"))?,
        kernarg: walk
            .kernarg
            .ok_or_else(|| error("no kernarg pool was found"))?,
    })
}
