//! The application side: softhsa's table copied the way a tools library receives it, kreplay
//! installed into the copy, and a small HSA program that talks to the runtime through the copy
//! only (agents, pools, allocations, queues, AQL packets, signals, async copies).

use std::ffi::c_void;
use std::sync::Arc;

use parking_lot::Mutex;
use std::time::{Duration, Instant};

use hsa_sys::*;
use kreplay_hsa::{InstallOptions, ToolHooks};
use kreplay_softhsa::OwnedApiTable;

/// How long any single wait of a scenario may take before it counts as a failure.
pub const WAIT: Duration = Duration::from_secs(5);

/// Calls one entry of the (wrapped) table copy.
macro_rules! hsa {
    ($app:expr, $table:ident . $entry:ident ( $($arg:expr),* $(,)? )) => {{
        let f = $app.$table().$entry.expect(concat!("table entry ", stringify!($entry)));
        // SAFETY: the entry is softhsa's (or kreplay's wrapper of it); every call site passes
        // arguments that satisfy that HSA function's contract (valid out pointers, live handles).
        unsafe { f($($arg),*) }
    }};
}

fn ok(status: hsa_status_t, what: &str) {
    assert_eq!(
        status, HSA_STATUS_SUCCESS,
        "{what} failed with status {status:#x}"
    );
}

/// The application: a handle to the table copy kreplay was installed into.
#[derive(Clone, Copy)]
pub struct App {
    table: &'static HsaApiTable,
    /// The AMD extension entries by name, whatever the order of the table's layout.
    amd: &'static AmdExtTable,
    /// The CPU agent.
    pub cpu: hsa_agent_t,
    /// GPU agents 0 and 1.
    pub gpus: [hsa_agent_t; 2],
    ticks_per_second: u64,
}

// SAFETY: the table holds function pointers and pointers to its own sub-tables, never modified
// after installation; the HSA API is callable from any thread.
unsafe impl Send for App {}
// SAFETY: see `Send`; the tables are only read.
unsafe impl Sync for App {}

/// The memory pools of one agent.
#[derive(Clone, Copy, Debug)]
pub struct Pools {
    /// Coarse-grained device memory (snapshotted by replays on this agent).
    pub coarse: hsa_amd_memory_pool_t,
    /// Fine-grained memory (never snapshotted).
    pub fine: hsa_amd_memory_pool_t,
    /// Kernel-argument memory (never snapshotted).
    pub kernarg: hsa_amd_memory_pool_t,
}

/// A queue the application created (an intercept queue while kreplay is installed).
#[derive(Clone, Copy, Debug)]
pub struct Queue(pub *mut hsa_queue_t);

// SAFETY: a queue handle is only used through the thread-safe HSA queue API.
unsafe impl Send for Queue {}
// SAFETY: see `Send`.
unsafe impl Sync for Queue {}

/// A device (or host) address the application allocated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ptr(pub u64);

impl Ptr {
    pub fn raw(self) -> *mut c_void {
        self.0 as *mut c_void
    }
}

/// One AQL packet as 64 bytes; the first 16 bits are its header, stored last on submission.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
pub struct Aql([u8; 64]);

impl Aql {
    /// A kernel dispatch packet (1-D grid, system-scope fences, no barrier bit).
    pub fn dispatch(
        kernel: u64,
        grid: u32,
        workgroup: u16,
        kernarg: Ptr,
        completion: hsa_signal_t,
    ) -> Aql {
        let header = (HSA_PACKET_TYPE_KERNEL_DISPATCH << HSA_PACKET_HEADER_TYPE)
            | (HSA_FENCE_SCOPE_SYSTEM << HSA_PACKET_HEADER_SCACQUIRE_FENCE_SCOPE)
            | (HSA_FENCE_SCOPE_SYSTEM << HSA_PACKET_HEADER_SCRELEASE_FENCE_SCOPE);
        let packet = hsa_kernel_dispatch_packet_t {
            header: header as u16,
            setup: 1 << HSA_KERNEL_DISPATCH_PACKET_SETUP_DIMENSIONS,
            workgroup_size_x: workgroup,
            workgroup_size_y: 1,
            workgroup_size_z: 1,
            reserved0: 0,
            grid_size_x: grid,
            grid_size_y: 1,
            grid_size_z: 1,
            private_segment_size: 0,
            group_segment_size: 0,
            kernel_object: kernel,
            kernarg_address: kernarg.raw(),
            reserved2: 0,
            completion_signal: completion,
        };
        // SAFETY: a dispatch packet is 64 bytes of plain data.
        Aql(unsafe { std::mem::transmute::<hsa_kernel_dispatch_packet_t, [u8; 64]>(packet) })
    }

    /// A barrier-AND packet without dependencies.
    pub fn barrier(completion: hsa_signal_t) -> Aql {
        let header = (HSA_PACKET_TYPE_BARRIER_AND << HSA_PACKET_HEADER_TYPE)
            | (HSA_FENCE_SCOPE_SYSTEM << HSA_PACKET_HEADER_SCACQUIRE_FENCE_SCOPE)
            | (HSA_FENCE_SCOPE_SYSTEM << HSA_PACKET_HEADER_SCRELEASE_FENCE_SCOPE);
        let packet = hsa_barrier_and_packet_t {
            header: header as u16,
            completion_signal: completion,
            ..Default::default()
        };
        // SAFETY: a barrier-AND packet is 64 bytes of plain data.
        Aql(unsafe { std::mem::transmute::<hsa_barrier_and_packet_t, [u8; 64]>(packet) })
    }

    /// A barrier-AND packet that waits until every one of `deps` (at most 5) reached 0.
    #[allow(dead_code)] // not every scenario file waits on signals in a queue
    pub fn barrier_and(deps: &[hsa_signal_t], completion: hsa_signal_t) -> Aql {
        Aql::barrier_waiting(HSA_PACKET_TYPE_BARRIER_AND, deps, completion)
    }

    /// A barrier-OR packet that waits until one of `deps` (at most 5) reached 0.
    #[allow(dead_code)] // not every scenario file waits on signals in a queue
    pub fn barrier_or(deps: &[hsa_signal_t], completion: hsa_signal_t) -> Aql {
        Aql::barrier_waiting(HSA_PACKET_TYPE_BARRIER_OR, deps, completion)
    }

    fn barrier_waiting(kind: u32, deps: &[hsa_signal_t], completion: hsa_signal_t) -> Aql {
        assert!(
            deps.len() <= 5,
            "a barrier packet holds at most 5 dependencies"
        );
        let header = (kind << HSA_PACKET_HEADER_TYPE)
            | (HSA_FENCE_SCOPE_SYSTEM << HSA_PACKET_HEADER_SCACQUIRE_FENCE_SCOPE)
            | (HSA_FENCE_SCOPE_SYSTEM << HSA_PACKET_HEADER_SCRELEASE_FENCE_SCOPE);
        let mut packet = hsa_barrier_and_packet_t {
            header: header as u16,
            completion_signal: completion,
            ..Default::default()
        };
        packet.dep_signal[..deps.len()].copy_from_slice(deps);
        // SAFETY: a barrier-AND packet (and a barrier-OR one, laid out alike) is 64 bytes of
        // plain data.
        Aql(unsafe { std::mem::transmute::<hsa_barrier_and_packet_t, [u8; 64]>(packet) })
    }

    /// A packet from its 64 raw bytes (header in bytes 0..2, written last on submission).
    #[allow(dead_code)] // for scenario files that build packets of their own
    pub fn from_bytes(bytes: [u8; 64]) -> Aql {
        Aql(bytes)
    }

    /// The same packet with its barrier bit set (it starts only after every earlier packet of
    /// its queue completed).
    #[allow(dead_code)] // not every scenario file orders its packets this way
    pub fn with_barrier(mut self) -> Aql {
        self.0[1] |= 1 << (HSA_PACKET_HEADER_BARRIER - 8);
        self
    }

    /// Replaces a dispatch packet's kernel object.
    pub fn set_kernel(&mut self, kernel: u64) {
        let offset = std::mem::offset_of!(hsa_kernel_dispatch_packet_t, kernel_object);
        self.0[offset..offset + 8].copy_from_slice(&kernel.to_ne_bytes());
    }

    fn header_and_setup(&self) -> u32 {
        u32::from_le_bytes([self.0[0], self.0[1], self.0[2], self.0[3]])
    }
}

/// Initializes softhsa, installs kreplay into a copy of its table (owned for the rest of the
/// process) and returns the application view of that copy.
pub fn install(hooks: Arc<dyn ToolHooks>, options: InstallOptions) -> App {
    let layout = kreplay_softhsa::TableLayout::from_env().expect("a known table layout");
    install_into(
        Box::leak(Box::new(OwnedApiTable::softhsa_with(layout))),
        hooks,
        options,
    )
}

/// The most a scenario on the file tier spills at once (their buffers are a few MiB at most).
const FILE_TIER_SPILL: u64 = 16 << 20;

/// [`install`] into a table copy the scenario prepared (e.g. with a runtime entry replaced).
pub fn install_into(
    table: &'static mut OwnedApiTable,
    hooks: Arc<dyn ToolHooks>,
    options: InstallOptions,
) -> App {
    // A scenario forced onto the file tier needs room for its spill files where they go: on a
    // machine with too little disk free it is skipped (kreplay would decline every snapshot).
    if options.snapshot.store == kreplay_snapshot::StoreTier::File {
        let dir = (options.snapshot.spill_dir.clone()).unwrap_or_else(std::env::temp_dir);
        super::skip_unless_spill_room(&dir, FILE_TIER_SPILL);
    }
    // The scenario runs on the table layout its process was started for (`isolated`).
    let layout = kreplay_softhsa::TableLayout::from_env().expect("a known table layout");
    // SAFETY: the copy's sub-tables are valid and as long as they declare.
    let shape = unsafe { kreplay_hsa::check_table(table.table()) }.expect("a supported table");
    let order = match layout {
        kreplay_softhsa::TableLayout::Rocm52 => kreplay_hsa::AmdOrder::Rocm52,
        _ => kreplay_hsa::AmdOrder::Rocm56,
    };
    assert_eq!(
        shape.amd_order, order,
        "the scenario runs on the {layout:?} layout"
    );
    // SAFETY: the copy's sub-tables are valid; hsa_init takes no arguments (the runtime calls
    // a tools library's OnLoad from inside it, after which kreplay is installed below).
    ok(
        unsafe { (*table.table().core_).hsa_init_fn.expect("hsa_init")() },
        "hsa_init",
    );
    // SAFETY: the root points at valid sub-tables that live for the rest of the process and
    // that only kreplay modifies (here, before any other use).
    unsafe { kreplay_hsa::install(table.as_mut_ptr(), hooks, options) }.expect("kreplay installs");
    App::new(table.table())
}

impl App {
    /// The application view of a table kreplay was already installed into.
    #[allow(dead_code)] // for tests that install into a table of their own
    pub fn from_installed(table: &'static HsaApiTable) -> App {
        App::new(table)
    }

    fn new(table: &'static HsaApiTable) -> App {
        let mut app = App {
            table,
            // SAFETY: the root's AMD extension table is valid for the process (leaked copy).
            amd: Box::leak(Box::new(unsafe {
                hsa_sys::layouts::read_amd_ext_as_v1(table.amd_ext_)
            })),
            cpu: hsa_agent_t { handle: 0 },
            gpus: [hsa_agent_t { handle: 0 }; 2],
            ticks_per_second: 1,
        };
        let mut agents: Vec<hsa_agent_t> = Vec::new();
        unsafe extern "C" fn collect(agent: hsa_agent_t, data: *mut c_void) -> hsa_status_t {
            // SAFETY: `data` is the Vec passed below, alive for the walk.
            unsafe { (*data.cast::<Vec<hsa_agent_t>>()).push(agent) };
            HSA_STATUS_SUCCESS
        }
        ok(
            hsa!(
                app,
                core.hsa_iterate_agents_fn(Some(collect), (&raw mut agents).cast())
            ),
            "hsa_iterate_agents",
        );
        let gpus: Vec<_> = agents
            .iter()
            .copied()
            .filter(|&a| app.device_type(a) == HSA_DEVICE_TYPE_GPU)
            .collect();
        app.cpu = *agents
            .iter()
            .find(|&&a| app.device_type(a) == HSA_DEVICE_TYPE_CPU)
            .expect("a CPU agent");
        assert!(
            gpus.len() >= 2,
            "softhsa is configured with two GPU agents, found {}",
            gpus.len()
        );
        app.gpus = [gpus[0], gpus[1]];
        let mut hz = 0u64;
        ok(
            hsa!(
                app,
                core.hsa_system_get_info_fn(
                    HSA_SYSTEM_INFO_TIMESTAMP_FREQUENCY,
                    (&raw mut hz).cast()
                )
            ),
            "timestamp frequency",
        );
        app.ticks_per_second = hz.max(1);
        app
    }

    /// softhsa's test helpers over the (wrapped) table copy.
    #[allow(dead_code)] // not every scenario file loads executables
    pub fn hsa(&self) -> kreplay_softhsa::testing::Hsa {
        // SAFETY: the copy's sub-tables are valid for the process and hold HSA entries.
        unsafe { kreplay_softhsa::testing::Hsa::from_table(self.table) }
    }

    pub fn core(&self) -> &'static CoreApiTable {
        // SAFETY: the root's core table is valid for the process (leaked `OwnedApiTable`).
        unsafe { &*self.table.core_ }
    }

    pub fn amd(&self) -> &'static AmdExtTable {
        self.amd
    }

    /// The AMD extension table when it is in the ROCm 5.6+ order (the entries of those
    /// releases, through kreplay's wrappers), `None` in the ROCm 5.2 layout.
    #[allow(dead_code)] // not every test binary calls ROCm 5.6+ entries
    pub fn amd_v2(&self) -> Option<&'static hsa_sys::layouts::AmdExtTableV2> {
        // SAFETY: as for `core`; the version says which order the table has.
        unsafe {
            let amd = self.table.amd_ext_;
            hsa_sys::layouts::amd_ext_is_v2(&(*amd).version).then(|| &*amd.cast())
        }
    }

    fn device_type(&self, agent: hsa_agent_t) -> hsa_device_type_t {
        let mut device: hsa_device_type_t = 0;
        ok(
            hsa!(
                self,
                core.hsa_agent_get_info_fn(agent, HSA_AGENT_INFO_DEVICE, (&raw mut device).cast())
            ),
            "agent info",
        );
        device
    }

    fn pool_u32(&self, pool: hsa_amd_memory_pool_t, attribute: hsa_amd_memory_pool_info_t) -> u32 {
        let mut value = 0u64;
        ok(
            hsa!(
                self,
                amd.hsa_amd_memory_pool_get_info_fn(pool, attribute, (&raw mut value).cast())
            ),
            "pool info",
        );
        value as u32
    }

    /// Every global pool of `agent` that allows runtime allocation, with its global flags.
    fn global_pools(&self, agent: hsa_agent_t) -> Vec<(hsa_amd_memory_pool_t, u32)> {
        let mut pools: Vec<hsa_amd_memory_pool_t> = Vec::new();
        unsafe extern "C" fn collect(
            pool: hsa_amd_memory_pool_t,
            data: *mut c_void,
        ) -> hsa_status_t {
            // SAFETY: `data` is the Vec passed below, alive for the walk.
            unsafe { (*data.cast::<Vec<hsa_amd_memory_pool_t>>()).push(pool) };
            HSA_STATUS_SUCCESS
        }
        ok(
            hsa!(
                self,
                amd.hsa_amd_agent_iterate_memory_pools_fn(
                    agent,
                    Some(collect),
                    (&raw mut pools).cast()
                )
            ),
            "iterate pools",
        );
        pools
            .into_iter()
            .filter(|&p| {
                self.pool_u32(p, HSA_AMD_MEMORY_POOL_INFO_SEGMENT) == HSA_AMD_SEGMENT_GLOBAL
                    && self.pool_u32(p, HSA_AMD_MEMORY_POOL_INFO_RUNTIME_ALLOC_ALLOWED) & 0xff != 0
            })
            .map(|p| (p, self.pool_u32(p, HSA_AMD_MEMORY_POOL_INFO_GLOBAL_FLAGS)))
            .collect()
    }

    /// The coarse-grained, fine-grained and kernarg pools of a GPU agent.
    pub fn pools(&self, agent: hsa_agent_t) -> Pools {
        let pools = self.global_pools(agent);
        let find = |want: u32, not: u32| {
            pools
                .iter()
                .find(|(_, f)| f & want != 0 && f & not == 0)
                .map(|(p, _)| *p)
                .unwrap_or_else(|| {
                    panic!(
                        "agent {} has no pool with flags {want:#x} (pools: {pools:?})",
                        agent.handle
                    )
                })
        };
        Pools {
            coarse: find(HSA_AMD_MEMORY_POOL_GLOBAL_FLAG_COARSE_GRAINED, 0),
            fine: find(
                HSA_AMD_MEMORY_POOL_GLOBAL_FLAG_FINE_GRAINED,
                HSA_AMD_MEMORY_POOL_GLOBAL_FLAG_KERNARG_INIT,
            ),
            kernarg: find(HSA_AMD_MEMORY_POOL_GLOBAL_FLAG_KERNARG_INIT, 0),
        }
    }

    /// A pool of the CPU agent that is neither kernarg-only (host memory).
    pub fn host_pool(&self) -> hsa_amd_memory_pool_t {
        self.global_pools(self.cpu)
            .into_iter()
            .find(|(_, f)| f & HSA_AMD_MEMORY_POOL_GLOBAL_FLAG_KERNARG_INIT == 0)
            .map(|(p, _)| p)
            .expect("the CPU agent has a system pool")
    }

    /// Allocates `bytes` from `pool` through the (wrapped) table.
    pub fn alloc(&self, pool: hsa_amd_memory_pool_t, bytes: usize) -> Ptr {
        let mut ptr: *mut c_void = std::ptr::null_mut();
        ok(
            hsa!(
                self,
                amd.hsa_amd_memory_pool_allocate_fn(pool, bytes, 0, &raw mut ptr)
            ),
            "pool allocate",
        );
        assert!(!ptr.is_null());
        Ptr(ptr as u64)
    }

    /// Allocates `bytes` from `pool` with allocation `flags` through the (wrapped) table.
    #[allow(dead_code)] // not every scenario file allocates with flags
    pub fn alloc_flags(&self, pool: hsa_amd_memory_pool_t, bytes: usize, flags: u32) -> Ptr {
        let mut ptr: *mut c_void = std::ptr::null_mut();
        ok(
            hsa!(
                self,
                amd.hsa_amd_memory_pool_allocate_fn(pool, bytes, flags, &raw mut ptr)
            ),
            "pool allocate with flags",
        );
        assert!(!ptr.is_null());
        Ptr(ptr as u64)
    }

    /// Frees an allocation through the (wrapped) table.
    pub fn free(&self, ptr: Ptr) {
        ok(
            hsa!(self, amd.hsa_amd_memory_pool_free_fn(ptr.raw())),
            "pool free",
        );
    }

    /// Allocates a buffer of `values` in `pool` and writes them.
    pub fn buffer(&self, pool: hsa_amd_memory_pool_t, values: &[u32]) -> Ptr {
        let ptr = self.alloc(pool, std::mem::size_of_val(values));
        self.write(ptr, values);
        ptr
    }

    /// Writes `values` at `ptr` with `hsa_memory_copy`.
    pub fn write(&self, ptr: Ptr, values: &[u32]) {
        ok(
            hsa!(
                self,
                core.hsa_memory_copy_fn(
                    ptr.raw(),
                    values.as_ptr().cast(),
                    std::mem::size_of_val(values)
                )
            ),
            "memory copy to device",
        );
    }

    /// Sets `count` words at `ptr` to `value` with `hsa_amd_memory_fill`.
    pub fn fill(&self, ptr: Ptr, value: u32, count: usize) {
        ok(
            hsa!(self, amd.hsa_amd_memory_fill_fn(ptr.raw(), value, count)),
            "memory fill",
        );
    }

    /// Reads `len` values at `ptr` with `hsa_memory_copy`.
    pub fn read(&self, ptr: Ptr, len: usize) -> Vec<u32> {
        let mut out = vec![0u32; len];
        ok(
            hsa!(
                self,
                core.hsa_memory_copy_fn(out.as_mut_ptr().cast(), ptr.0 as *const c_void, len * 4)
            ),
            "memory copy from device",
        );
        out
    }

    /// Kernel arguments in `agent`'s kernarg pool.
    pub fn kernargs<T: Copy>(&self, pools: &Pools, args: T) -> Ptr {
        let ptr = self.alloc(pools.kernarg, std::mem::size_of::<T>());
        // SAFETY: kernarg memory is host-accessible (fine-grained), freshly allocated with room
        // for a T; the write is unaligned-safe.
        unsafe { std::ptr::write_unaligned(ptr.0 as *mut T, args) };
        ptr
    }

    /// The size and owner of the allocation containing `ptr`, as the runtime reports it.
    pub fn allocation_size(&self, ptr: Ptr) -> u64 {
        let mut info = hsa_amd_pointer_info_t {
            size: std::mem::size_of::<hsa_amd_pointer_info_t>() as u32,
            ..Default::default()
        };
        ok(
            hsa!(
                self,
                amd.hsa_amd_pointer_info_fn(
                    ptr.raw(),
                    &raw mut info,
                    None,
                    std::ptr::null_mut(),
                    std::ptr::null_mut()
                )
            ),
            "pointer info",
        );
        info.sizeInBytes as u64
    }

    /// Creates a queue on `agent`.
    pub fn queue(&self, agent: hsa_agent_t) -> Queue {
        self.queue_of_type(agent, HSA_QUEUE_TYPE_MULTI)
    }

    /// Creates a queue of `type_` (`HSA_QUEUE_TYPE_MULTI` or `_SINGLE`) on `agent`.
    pub fn queue_of_type(&self, agent: hsa_agent_t, type_: hsa_queue_type32_t) -> Queue {
        let mut queue: *mut hsa_queue_t = std::ptr::null_mut();
        ok(
            hsa!(
                self,
                core.hsa_queue_create_fn(
                    agent,
                    64,
                    type_,
                    None,
                    std::ptr::null_mut(),
                    0,
                    0,
                    &raw mut queue
                )
            ),
            "queue create",
        );
        Queue(queue)
    }

    /// Destroys a queue.
    pub fn destroy_queue(&self, queue: Queue) {
        ok(
            hsa!(self, core.hsa_queue_destroy_fn(queue.0)),
            "queue destroy",
        );
    }

    /// Writes `packets` into `queue` (body first, header last with release order) and rings
    /// the doorbell once for all of them. While kreplay is installed, this call runs its
    /// intercept handler (and so a whole replay) before it returns.
    pub fn submit(&self, queue: Queue, packets: &[Aql]) {
        // SAFETY: `queue.0` is a live queue this application created.
        let q = unsafe { &*queue.0 };
        let first = hsa!(
            self,
            core.hsa_queue_add_write_index_scacq_screl_fn(queue.0, packets.len() as u64)
        );
        for (i, packet) in packets.iter().enumerate() {
            let index = first + i as u64;
            let deadline = Instant::now() + WAIT;
            while index - hsa!(self, core.hsa_queue_load_read_index_scacquire_fn(queue.0))
                >= u64::from(q.size)
            {
                assert!(Instant::now() < deadline, "queue {} stayed full", q.id);
                std::thread::yield_now();
            }
            let slot =
                (q.base_address as usize + (index % u64::from(q.size)) as usize * 64) as *mut u8;
            // SAFETY: `slot` is the 64-byte ring slot this application claimed; bytes 4..64 are
            // the packet body, written before the header publishes it.
            unsafe { std::ptr::copy_nonoverlapping(packet.0.as_ptr().add(4), slot.add(4), 60) };
            // SAFETY: the slot is 64-byte aligned, so its first 4 bytes are an aligned u32 that
            // the packet processor reads atomically; release order publishes the body.
            let header = unsafe { &*slot.cast::<std::sync::atomic::AtomicU32>() };
            header.store(
                packet.header_and_setup(),
                std::sync::atomic::Ordering::Release,
            );
        }
        let last = first + packets.len() as u64 - 1;
        hsa!(
            self,
            core.hsa_signal_store_screlease_fn(q.doorbell_signal, last as i64)
        );
    }

    /// Dispatches one kernel on `queue`.
    pub fn dispatch(&self, queue: Queue, packet: Aql) {
        self.submit(queue, &[packet]);
    }

    /// A signal with `initial` value.
    pub fn signal(&self, initial: i64) -> hsa_signal_t {
        let mut signal = hsa_signal_t { handle: 0 };
        ok(
            hsa!(
                self,
                core.hsa_signal_create_fn(initial, 0, std::ptr::null(), &raw mut signal)
            ),
            "signal create",
        );
        signal
    }

    /// The signal's current value.
    pub fn load(&self, signal: hsa_signal_t) -> i64 {
        hsa!(self, core.hsa_signal_load_scacquire_fn(signal))
    }

    /// Stores `value` into `signal` from the host.
    pub fn store(&self, signal: hsa_signal_t, value: i64) {
        hsa!(self, core.hsa_signal_store_screlease_fn(signal, value));
    }

    /// Waits until `signal` is 0, at most [`WAIT`]; returns the value it ended at.
    pub fn wait_zero(&self, signal: hsa_signal_t) -> i64 {
        self.wait_zero_within(signal, WAIT)
    }

    /// Waits until `signal` is 0, at most `limit`; returns the value it ended at.
    pub fn wait_zero_within(&self, signal: hsa_signal_t, limit: Duration) -> i64 {
        let deadline = Instant::now() + limit;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let ticks =
                (left.as_nanos() * u128::from(self.ticks_per_second) / 1_000_000_000) as u64;
            let value = hsa!(
                self,
                core.hsa_signal_wait_scacquire_fn(
                    signal,
                    HSA_SIGNAL_CONDITION_EQ,
                    0,
                    ticks,
                    HSA_WAIT_STATE_BLOCKED
                )
            );
            if value == 0 || Instant::now() >= deadline {
                return value;
            }
        }
    }

    /// `hsa_amd_profiling_get_dispatch_time` of `signal`: (start, end) in timestamp ticks.
    #[allow(dead_code)] // not every test binary reads timestamps
    pub fn dispatch_time(&self, agent: hsa_agent_t, signal: hsa_signal_t) -> (u64, u64) {
        let mut time = hsa_amd_profiling_dispatch_time_t::default();
        ok(
            hsa!(
                self,
                amd.hsa_amd_profiling_get_dispatch_time_fn(agent, signal, &raw mut time)
            ),
            "dispatch time",
        );
        (time.start, time.end)
    }

    /// Turns the runtime's async-copy timestamps on (`hsa_amd_profiling_async_copy_enable`).
    #[allow(dead_code)] // not every test binary reads timestamps
    pub fn enable_copy_timestamps(&self) {
        ok(
            hsa!(self, amd.hsa_amd_profiling_async_copy_enable_fn(true)),
            "async copy profiling",
        );
    }

    /// `hsa_amd_profiling_get_async_copy_time` of `signal`: (start, end) in timestamp ticks.
    #[allow(dead_code)] // not every test binary reads timestamps
    pub fn copy_time(&self, signal: hsa_signal_t) -> (u64, u64) {
        let mut time = hsa_amd_profiling_async_copy_time_t::default();
        ok(
            hsa!(
                self,
                amd.hsa_amd_profiling_get_async_copy_time_fn(signal, &raw mut time)
            ),
            "async copy time",
        );
        (time.start, time.end)
    }

    /// Asynchronously copies `bytes` from `src` (owned by `src_agent`) to `dst` (owned by
    /// `dst_agent`), decrementing `completion` when it landed.
    pub fn async_copy(
        &self,
        dst: Ptr,
        dst_agent: hsa_agent_t,
        src: Ptr,
        src_agent: hsa_agent_t,
        bytes: usize,
        completion: hsa_signal_t,
    ) {
        ok(
            hsa!(
                self,
                amd.hsa_amd_memory_async_copy_fn(
                    dst.raw(),
                    dst_agent,
                    src.0 as *const c_void,
                    src_agent,
                    bytes,
                    0,
                    std::ptr::null(),
                    completion
                )
            ),
            "async copy",
        );
    }

    /// Like [`async_copy`](Self::async_copy), starting only once `dependency` reached 0.
    #[allow(clippy::too_many_arguments)]
    pub fn async_copy_after(
        &self,
        dst: Ptr,
        dst_agent: hsa_agent_t,
        src: Ptr,
        src_agent: hsa_agent_t,
        bytes: usize,
        dependency: hsa_signal_t,
        completion: hsa_signal_t,
    ) {
        ok(
            hsa!(
                self,
                amd.hsa_amd_memory_async_copy_fn(
                    dst.raw(),
                    dst_agent,
                    src.0 as *const c_void,
                    src_agent,
                    bytes,
                    1,
                    &dependency,
                    completion
                )
            ),
            "async copy",
        );
    }
}

/// The packets kreplay's handler wrote into a queue's hardware queue, one entry per writer call.
pub type Forwarded = Mutex<Vec<Vec<Aql>>>;

impl App {
    /// Records what kreplay's handler writes into `queue`'s hardware queue from now on. kreplay
    /// registers its handler when the queue is created, so it is the first-registered one,
    /// which ROCm calls last: its writer reaches the hardware queue and no handler sees what it
    /// writes. softhsa shows it through a testing hook.
    pub fn observe_forwarded(&self, queue: Queue) -> &'static Forwarded {
        let forwarded: &'static Forwarded = Box::leak(Box::new(Mutex::new(Vec::new())));
        kreplay_softhsa::testing::wrap_hardware_writes(queue.0, move |batch, write| {
            forwarded
                .lock()
                .push(batch.iter().map(|b| Aql(*b)).collect());
            write();
        })
        .expect("an intercept queue of softhsa's");
        forwarded
    }
}

impl Aql {
    /// The packet type in the header.
    pub fn packet_type(&self) -> u32 {
        self.header_and_setup() & 0xff
    }

    /// The packet as a kernel dispatch, if it is one.
    pub fn as_dispatch(&self) -> Option<hsa_kernel_dispatch_packet_t> {
        (self.packet_type() == HSA_PACKET_TYPE_KERNEL_DISPATCH)
            // SAFETY: 64 bytes of plain data in the dispatch layout.
            .then(|| unsafe {
                std::mem::transmute::<[u8; 64], hsa_kernel_dispatch_packet_t>(self.0)
            })
    }
}

impl PartialEq for Aql {
    fn eq(&self, other: &Aql) -> bool {
        self.0 == other.0
    }
}

impl std::fmt::Debug for Aql {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Aql(type {}, {:02x?})", self.packet_type(), &self.0[..8])
    }
}
